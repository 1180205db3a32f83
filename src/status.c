/*
 * Status names and texts (from the one X-macro list in jsdurable/status.h),
 * the publication outcome names (jsdurable/publisher.h's JSD_OUTCOME_MAP) and
 * the helpers that fill a jsd_error.
 */
#include <stdio.h>
#include <string.h>

#include "jsd_int.h"

static const char *const status_names[] = {
#define X(name, text) "JSD_" #name,
    JSD_STATUS_MAP(X)
#undef X
};

static const char *const status_texts[] = {
#define X(name, text) text,
    JSD_STATUS_MAP(X)
#undef X
};

const char *jsd_status_name(jsd_status s)
{
    if ((unsigned)s >= JSD__STATUS_COUNT)
        return "JSD_?";
    return status_names[s];
}

const char *jsd_status_str(jsd_status s)
{
    if ((unsigned)s >= JSD__STATUS_COUNT)
        return "unknown status";
    return status_texts[s];
}

void jsd_error_clear(jsd_error *err)
{
    if (err)
        memset(err, 0, sizeof(*err));
}

jsd_status jsd__verr(jsd_error *err, jsd_status s, const char *fmt, va_list ap)
{
    if (!err)
        return s;
    err->status = s;
    if (fmt)
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    else
        jsd__strlcpy(err->msg, jsd_status_str(s), sizeof(err->msg));
    return s;
}

jsd_status jsd__err(jsd_error *err, jsd_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    jsd__verr(err, s, fmt, ap);
    va_end(ap);
    return s;
}

void jsd__err_copy(jsd_error *dst, const jsd_error *src)
{
    if (dst && src && dst != src)
        memcpy(dst, src, sizeof(*dst));
}

const char *jsd_outcome_str(jsd_outcome o)
{
    switch (o) {
#define JSD__OUTCOME_STR(name, text)                                                               \
    case JSD_OUTCOME_##name:                                                                       \
        return text;
        JSD_OUTCOME_MAP(JSD__OUTCOME_STR)
#undef JSD__OUTCOME_STR
    default:
        return "?";
    }
}

const char *jsd_version(void)
{
    return JSD_VERSION;
}

#include <nats/nats.h>

const char *jsd_nats_client_version(void)
{
    return nats_GetVersion();
}
