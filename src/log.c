/*
 * The process-wide structured logger: text lines
 * ("2026-11-29T09:00:00.123Z WARN relay: message") or JSON lines
 * ({"ts":...,"level":"warn","component":"relay","msg":"..."}, via jansson),
 * to stderr or to an application sink. Callers never pass secrets here; the
 * modules that hold credentials redact before they log.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "jsd_int.h"

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int log_min = JSD_LOG_WARN;
static jsd_log_format log_format = JSD_LOG_TEXT;
static jsd_log_fn log_fn;
static void *log_user;

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

void jsd_log_configure(jsd_log_level min_level, jsd_log_format format, jsd_log_fn fn, void *user)
{
    pthread_mutex_lock(&log_mu);
    atomic_store(&log_min, (int)min_level);
    log_format = format;
    log_fn = fn;
    log_user = user;
    pthread_mutex_unlock(&log_mu);
}

jsd_status jsd_log_level_parse(const char *s, jsd_log_level *out)
{
    for (int i = 0; s && i <= JSD_LOG_OFF; i++) {
        if (!strcmp(s, level_names[i])) {
            *out = (jsd_log_level)i;
            return JSD_OK;
        }
    }
    return JSD_ERR_INVALID;
}

bool jsd__log_enabled(jsd_log_level level)
{
    return (int)level >= atomic_load_explicit(&log_min, memory_order_relaxed) &&
           level < JSD_LOG_OFF;
}

static void timestamp(char *buf, size_t cap)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(buf, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, cap - n, ".%03ldZ", ts.tv_nsec / 1000000);
}

/* Replace every byte that does not start a valid UTF-8 sequence with '?', so
 * jansson accepts the text (it refuses invalid UTF-8, and the line would be
 * lost). Overlong forms and surrogates count as invalid. */
static void utf8_sanitize(char *s)
{
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        size_t n = 0;
        unsigned cp = 0;
        if (*p < 0x80) {
            p++;
            continue;
        } else if ((*p & 0xe0) == 0xc0) {
            n = 1;
            cp = *p & 0x1fu;
        } else if ((*p & 0xf0) == 0xe0) {
            n = 2;
            cp = *p & 0x0fu;
        } else if ((*p & 0xf8) == 0xf0) {
            n = 3;
            cp = *p & 0x07u;
        }
        size_t i = 1;
        for (; n && i <= n && (p[i] & 0xc0) == 0x80; i++)
            cp = (cp << 6) | (p[i] & 0x3fu);
        bool ok = n && i == n + 1 && !(n == 1 && cp < 0x80) && !(n == 2 && cp < 0x800) &&
                  !(n == 3 && (cp < 0x10000 || cp > 0x10ffff)) && !(cp >= 0xd800 && cp <= 0xdfff);
        if (!ok) {
            *p++ = '?';
            continue;
        }
        p += n + 1;
    }
}

static void vlog(jsd_log_level level, const char *component, const char *fmt, va_list ap)
    JSD_PRINTF(3, 0);

void jsd__log(jsd_log_level level, const char *component, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(level, component, fmt, ap);
    va_end(ap);
}

void jsd_log(jsd_log_level level, const char *component, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (level >= JSD_LOG_DEBUG && level < JSD_LOG_OFF)
        vlog(level, component, fmt, ap);
    va_end(ap);
}

static void vlog(jsd_log_level level, const char *component, const char *fmt, va_list ap)
{
    if (!jsd__log_enabled(level))
        return;
    char msg[1024], ts[40], line[1400];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    timestamp(ts, sizeof(ts));

    pthread_mutex_lock(&log_mu);
    char *js = NULL; /* a JSON line may escape to twice msg's size: never cut it */
    if (log_format == JSD_LOG_JSON) {
        char comp[64];
        jsd__strlcpy(comp, component ? component : "", sizeof(comp));
        utf8_sanitize(msg);
        utf8_sanitize(comp);
        json_t *o = json_pack("{s:s, s:s, s:s, s:s}", "ts", ts, "level", level_names[level],
                              "component", comp, "msg", msg);
        js = o ? json_dumps(o, JSON_COMPACT) : NULL;
        jsd__strlcpy(line, "{\"msg\":\"(log line lost: out of memory)\"}", sizeof(line));
        json_decref(o);
    } else {
        char up[8];
        size_t i;
        for (i = 0; level_names[level][i] && i < sizeof(up) - 1; i++)
            up[i] = (char)(level_names[level][i] - 'a' + 'A');
        up[i] = '\0';
        snprintf(line, sizeof(line), "%s %s %s: %s", ts, up, component ? component : "-", msg);
    }
    const char *out = js ? js : line;
    if (log_fn) {
        log_fn(level, component, out, log_user);
    } else {
        fputs(out, stderr);
        fputc('\n', stderr);
        fflush(stderr);
    }
    pthread_mutex_unlock(&log_mu);
    free(js);
}
