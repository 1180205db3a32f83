/*
 * doctor_report — the doctor's report (the list of results jsd_doctor_run
 * returns, its strings owned), the names of levels, kinds and checks, and
 * the override lists (--allow-unsafe) that relay and consume judge errors
 * against. The checks themselves are in doctor.c, doctor_server.c and
 * store/doctor.c.
 */
#include <string.h>

#include "doctor_int.h"

/* Every check name, for jsd_doctor_allow_valid. */
static const char *const CHECK_NAMES[] = {"stream.exists",
                                          "stream.storage",
                                          "stream.replicas",
                                          "stream.discard",
                                          "stream.duplicate_window",
                                          "stream.max_msg_size",
                                          "stream.replicas_fsync",
                                          "stream.persist_mode",
                                          "stream.allow_atomic",
                                          "durable.exists",
                                          "durable.ack_policy",
                                          "durable.ack_wait",
                                          "durable.max_deliver",
                                          "durable.inbox_retention",
                                          "dlq.stream",
                                          "dlq.subjects",
                                          "dlq.storage",
                                          "dlq.replicas",
                                          "dlq.limits",
                                          "server.fsync",
                                          "server.version",
                                          "store.open",
                                          "store.schema",
                                          "store.fsync",
                                          "store.synchronous_commit",
                                          "store.full_page_writes",
                                          "store.journal_mode",
                                          "store.synchronous",
                                          "store.filesystem",
                                          "store.turn_file"};

const char *jsd_doctor_level_str(jsd_doctor_level l)
{
    switch (l) {
    case JSD_DOCTOR_OK:
        return "ok";
    case JSD_DOCTOR_UNKNOWN:
        return "unknown";
    case JSD_DOCTOR_WARN:
        return "warn";
    case JSD_DOCTOR_ERROR:
        return "error";
    }
    return "?";
}

const char *jsd_doctor_kind_str(jsd_doctor_kind k)
{
    switch (k) {
    case JSD_DOCTOR_STREAM:
        return "stream";
    case JSD_DOCTOR_DURABLE:
        return "durable";
    case JSD_DOCTOR_SERVER:
        return "server";
    case JSD_DOCTOR_STORE:
        return "store";
    }
    return "?";
}

void jsd_doctor_opts_init(jsd_doctor_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->checks = JSD_DOCTOR_CHECK_ALL;
    o->inbox_retention_ms = 7LL * 24 * 3600 * 1000;
    o->monitor_timeout_ms = 5000;
}

/* ---- the report ------------------------------------------------------------------- */

void jsd__doctor_add(jsd_doctor_report *rep, const char *check, jsd_doctor_kind kind,
                     const char *subject, jsd_doctor_level level, const char *message,
                     const char *fix)
{
    if (rep->n == rep->cap) {
        size_t cap = rep->cap ? rep->cap * 2 : 32;
        jsd_doctor_result *nr = jsd__realloc(rep->r, cap * sizeof(*nr));
        if (!nr) {
            rep->nomem = true;
            return;
        }
        rep->r = nr;
        rep->cap = cap;
    }
    jsd_doctor_result *x = &rep->r[rep->n];
    x->check = jsd__strdup(check);
    x->kind = kind;
    x->subject = jsd__strdup(subject ? subject : "");
    x->level = level;
    x->message = jsd__strdup(message ? message : "");
    x->fix = jsd__strdup(fix ? fix : "");
    if (!x->check || !x->subject || !x->message || !x->fix) {
        jsd__free((void *)x->check);
        jsd__free((void *)x->subject);
        jsd__free((void *)x->message);
        jsd__free((void *)x->fix);
        rep->nomem = true;
        return;
    }
    rep->n++;
}

void jsd_doctor_report_destroy(jsd_doctor_report *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++) {
        jsd__free((void *)r->r[i].check);
        jsd__free((void *)r->r[i].subject);
        jsd__free((void *)r->r[i].message);
        jsd__free((void *)r->r[i].fix);
    }
    jsd__free(r->r);
    jsd__free(r);
}

size_t jsd_doctor_report_count(const jsd_doctor_report *r)
{
    return r ? r->n : 0;
}

const jsd_doctor_result *jsd_doctor_report_at(const jsd_doctor_report *r, size_t i)
{
    return r && i < r->n ? &r->r[i] : NULL;
}

jsd_doctor_level jsd_doctor_report_worst(const jsd_doctor_report *r)
{
    jsd_doctor_level w = JSD_DOCTOR_OK;
    for (size_t i = 0; r && i < r->n; i++)
        if (r->r[i].level > w)
            w = r->r[i].level;
    return w;
}

/* ---- override lists --------------------------------------------------------------- */

/* Call fn on each name of a comma-separated list; stops when fn returns true. */
static bool each_name(const char *list, bool (*fn)(const char *name, size_t len, void *u), void *u)
{
    const char *p = list;
    while (p && *p) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len > 0 && fn(p, len, u))
            return true;
        p = c ? c + 1 : NULL;
    }
    return false;
}

static bool name_is(const char *name, size_t len, void *u)
{
    const char *check = u;
    return (len == 3 && !strncmp(name, "all", 3)) ||
           (strlen(check) == len && !strncmp(name, check, len));
}

bool jsd_doctor_allowed(const char *allow, const char *check)
{
    return check && each_name(allow, name_is, (void *)check);
}

typedef struct bad_name {
    char *out;
    size_t cap;
} bad_name;

static bool name_unknown(const char *name, size_t len, void *u)
{
    bad_name *b = u;
    if (len == 3 && !strncmp(name, "all", 3))
        return false;
    for (size_t i = 0; i < JSD_ARRAY_LEN(CHECK_NAMES); i++)
        if (strlen(CHECK_NAMES[i]) == len && !strncmp(name, CHECK_NAMES[i], len))
            return false;
    if (b->out && b->cap)
        jsd__snprintf(b->out, b->cap, "%.*s", (int)JSD_MIN(len, 200), name);
    return true;
}

bool jsd_doctor_allow_valid(const char *allow, char *bad, size_t cap)
{
    bad_name b = {bad, cap};
    return !each_name(allow, name_unknown, &b);
}
