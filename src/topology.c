/*
 * topology — the declarative topology file (JSON, via jansson) parsed and
 * validated into plain structs (include/jsdurable/topology.h) before any
 * server is contacted (TOPO-1, DLQ-3); every refusal starts with the key path
 * in the file. Subject patterns are checked with subject.c's rules; applying
 * the result to JetStream is topology_apply.c's part. One idea (the file's
 * grammar, key by key), so it stays one file a little over 800 lines.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "subject.h"
#include "topology_int.h"

/* ---- parsing helpers -------------------------------------------------------------- */

static jsd_status perr(jsd_error *err, const char *path, const char *fmt, ...) JSD_PRINTF(3, 4);
static jsd_status perr(jsd_error *err, const char *path, const char *fmt, ...)
{
    char msg[JSD_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* Always a failure, visibly so: callers rely on it (and the analyzer sees it). */
    (void)jsd__err(err, JSD_ERR_CONFIG, "%s: %s", path, msg);
    return JSD_ERR_CONFIG;
}

static void subpath(char *out, const char *base, const char *key)
{
    if (base && *base)
        jsd__snprintf(out, PATH_CAP, "%s.%s", base, key);
    else
        jsd__snprintf(out, PATH_CAP, "%s", key);
}

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number with a fraction";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

static jsd_status check_keys(const json_t *obj, const char *path, const char *const *known,
                             jsd_error *err)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v)
    {
        bool ok = false;
        for (size_t i = 0; known[i]; i++)
            if (!strcmp(key, known[i]))
                ok = true;
        if (!ok) {
            char shown[64], list[256] = "", p[PATH_CAP];
            jsd__printable(key, strlen(key), shown, sizeof(shown));
            for (size_t i = 0; known[i]; i++) {
                size_t n = strlen(list);
                jsd__snprintf(list + n, sizeof(list) - n, "%s%s", i ? ", " : "", known[i]);
            }
            subpath(p, path, shown);
            return perr(err, p, "unknown key (known keys: %s)", list);
        }
    }
    return JSD_OK;
}

/* A string member; *out NULL when absent and not required. */
static jsd_status get_str(const json_t *obj, const char *path, const char *key, bool required,
                          size_t max_len, const char **out, jsd_error *err)
{
    char p[PATH_CAP];
    json_t *v = json_object_get(obj, key);
    subpath(p, path, key);
    *out = NULL;
    if (!v) {
        if (required)
            return perr(err, p, "missing (required)");
        return JSD_OK;
    }
    const char *sv = json_string_value(v); /* NULL unless v is a string */
    if (!sv)
        return perr(err, p, "must be a string, not %s", json_kind(v));
    size_t n = json_string_length(v);
    if (strlen(sv) != n)
        return perr(err, p, "contains a NUL byte");
    if (n > max_len)
        return perr(err, p, "is %zu bytes; the limit is %zu", n, max_len);
    *out = sv;
    return JSD_OK;
}

/* An integer in [min, max], or -1 for unlimited when allow_unlimited. */
static jsd_status get_int(const json_t *obj, const char *path, const char *key, int64_t min,
                          int64_t max, bool allow_unlimited, int64_t def, int64_t *out,
                          jsd_error *err)
{
    char p[PATH_CAP];
    json_t *v = json_object_get(obj, key);
    subpath(p, path, key);
    *out = def;
    if (!v)
        return JSD_OK;
    if (!json_is_integer(v))
        return perr(err, p, "must be an integer, not %s", json_kind(v));
    json_int_t x = json_integer_value(v);
    if (allow_unlimited && x == -1) {
        *out = -1;
        return JSD_OK;
    }
    if (x < min || x > max)
        return perr(err, p, "%lld is out of range: allowed %lld..%lld%s", (long long)x,
                    (long long)min, (long long)max, allow_unlimited ? ", or -1 for unlimited" : "");
    *out = (int64_t)x;
    return JSD_OK;
}

/* A size: an integer number of bytes or a string "512MiB", "1GB", "64KiB". */
static bool parse_size(const char *s, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    if (!s || *s < '0' || *s > '9')
        return false;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v < 0)
        return false;
    static const struct {
        const char *suffix;
        int64_t mul;
    } units[] = {{"", 1},
                 {"B", 1},
                 {"KB", 1000LL},
                 {"MB", 1000LL * 1000},
                 {"GB", 1000LL * 1000 * 1000},
                 {"TB", 1000LL * 1000 * 1000 * 1000},
                 {"KiB", 1024LL},
                 {"MiB", 1024LL * 1024},
                 {"GiB", 1024LL * 1024 * 1024},
                 {"TiB", 1024LL * 1024 * 1024 * 1024}};
    for (size_t i = 0; i < JSD_ARRAY_LEN(units); i++) {
        if (!strcmp(end, units[i].suffix)) {
            if (v > INT64_MAX / units[i].mul)
                return false;
            *out = (int64_t)v * units[i].mul;
            return true;
        }
    }
    return false;
}

static jsd_status get_size(const json_t *obj, const char *path, const char *key, int64_t min,
                           int64_t max, int64_t *out, jsd_error *err)
{
    char p[PATH_CAP];
    json_t *v = json_object_get(obj, key);
    subpath(p, path, key);
    *out = -1;
    if (!v)
        return JSD_OK;
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
        if (x == -1) {
            *out = -1;
            return JSD_OK;
        }
    } else if (json_is_string(v)) {
        char shown[64];
        const char *s = json_string_value(v);
        if (!parse_size(s, &x)) {
            jsd__printable(s, json_string_length(v), shown, sizeof(shown));
            return perr(err, p,
                        "\"%s\" is not a size: use bytes or a number with KB, MB, GB, TB, KiB, "
                        "MiB, GiB or TiB (e.g. \"512MiB\")",
                        shown);
        }
    } else {
        return perr(err, p, "must be a size (bytes or a string such as \"1GiB\"), not %s",
                    json_kind(v));
    }
    if (x < min || x > max)
        return perr(err, p, "%lld bytes is out of range: allowed %lld..%lld, or -1 for unlimited",
                    (long long)x, (long long)min, (long long)max);
    *out = x;
    return JSD_OK;
}

/* A duration string ("30s", "72h", "250ms", "7d"); "0" allowed when zero_ok. */
static jsd_status dur_value(const json_t *v, const char *p, int64_t min, int64_t max, bool zero_ok,
                            int64_t *out, jsd_error *err)
{
    char shown[64];
    if (!json_is_string(v))
        return perr(err, p, "must be a duration string such as \"30s\", not %s", json_kind(v));
    const char *s = json_string_value(v);
    jsd__printable(s, json_string_length(v), shown, sizeof(shown));
    int64_t ms;
    if (!jsd__parse_duration_ms(s, &ms))
        return perr(err, p,
                    "\"%s\" is not a duration: use a whole number with ms, s, m, h or d "
                    "(e.g. \"30s\", \"72h\")",
                    shown);
    if (ms == 0 && zero_ok) {
        *out = 0;
        return JSD_OK;
    }
    if (ms < min || ms > max) {
        return perr(err, p, "\"%s\" is out of range: allowed %lld ms..%lld ms%s", shown,
                    (long long)min, (long long)max, zero_ok ? ", or \"0\" for none" : "");
    }
    *out = ms;
    return JSD_OK;
}

static jsd_status get_dur(const json_t *obj, const char *path, const char *key, int64_t min,
                          int64_t max, bool zero_ok, int64_t def, int64_t *out, jsd_error *err)
{
    char p[PATH_CAP];
    json_t *v = json_object_get(obj, key);
    subpath(p, path, key);
    *out = def;
    if (!v)
        return JSD_OK;
    return dur_value(v, p, min, max, zero_ok, out, err);
}

/* One of the words in choices (NULL-terminated); *out its index. */
static jsd_status get_enum(const json_t *obj, const char *path, const char *key,
                           const char *const *choices, int def, int *out, jsd_error *err)
{
    const char *s;
    char p[PATH_CAP];
    jsd_status st = get_str(obj, path, key, false, 64, &s, err);
    *out = def;
    if (st != JSD_OK || !s)
        return st;
    for (int i = 0; choices[i]; i++) {
        if (!strcmp(s, choices[i])) {
            *out = i;
            return JSD_OK;
        }
    }
    char shown[64], list[128] = "";
    jsd__printable(s, strlen(s), shown, sizeof(shown));
    for (int i = 0; choices[i]; i++) {
        size_t n = strlen(list);
        jsd__snprintf(list + n, sizeof(list) - n, "%s\"%s\"", i ? ", " : "", choices[i]);
    }
    subpath(p, path, key);
    return perr(err, p, "\"%s\" is not allowed; use one of %s", shown, list);
}

static bool name_token_ok(const char *s, char *why, size_t cap)
{
    size_t n = strlen(s);
    if (n == 0) {
        jsd__snprintf(why, cap, "is empty");
        return false;
    }
    if (n > JSD_STREAM_NAME_MAX) {
        jsd__snprintf(why, cap, "is %zu bytes; the limit is %d", n, JSD_STREAM_NAME_MAX);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '-')) {
            if (ch > 0x20 && ch < 0x7f)
                jsd__snprintf(why, cap, "has '%c' at byte %zu; names use A-Z a-z 0-9 _ -", ch, i);
            else
                jsd__snprintf(why, cap, "has byte 0x%02x at byte %zu; names use A-Z a-z 0-9 _ -",
                              ch, i);
            return false;
        }
    }
    return true;
}

static jsd_status get_name(const json_t *obj, const char *path, const char *key, const char **out,
                           jsd_error *err)
{
    char p[PATH_CAP], why[128];
    jsd_status st = get_str(obj, path, key, true, 1024, out, err);
    if (st != JSD_OK)
        return st;
    if (!*out) /* required=true: get_str never leaves it NULL on success */
        return perr(err, path, "%s: missing (required)", key);
    if (!name_token_ok(*out, why, sizeof(why))) {
        subpath(p, path, key);
        return perr(err, p, "%s", why);
    }
    return JSD_OK;
}

/* ---- parsing the file ------------------------------------------------------------- */

static const char *const stream_keys[] = {"name",        "description",      "subjects",
                                          "storage",     "retention",        "max_age",
                                          "max_bytes",   "max_msgs",         "max_msgs_per_subject",
                                          "discard",     "duplicate_window", "replicas",
                                          "dead_letter", "allow_atomic",     "persist_mode",
                                          NULL};
static const char *const consumer_keys[] = {
    "stream",  "durable",         "description",        "filter_subject", "ack_wait", "max_deliver",
    "backoff", "max_ack_pending", "inactive_threshold", "deliver",        NULL};
static const char *const top_keys[] = {"version", "streams", "consumers", "dead_letter", NULL};

#define MAX_LIMIT_MSGS  1000000000000000LL /* 10^15 */
#define MAX_LIMIT_BYTES (1LL << 60)        /* 1 EiB */

static jsd_status parse_stream(const json_t *o, topo_stream *s, jsd_error *err)
{
    jsd_status st;
    const char *path = s->path;
    int64_t v;
    int e;
    if (!json_is_object(o))
        return perr(err, path, "must be an object, not %s", json_kind(o));
    if ((st = check_keys(o, path, stream_keys, err)) != JSD_OK)
        return st;
    if ((st = get_name(o, path, "name", &s->pub.name, err)) != JSD_OK)
        return st;
    if ((st = get_str(o, path, "description", false, 4096, &s->pub.description, err)) != JSD_OK)
        return st;

    char p[PATH_CAP];
    subpath(p, path, "subjects");
    json_t *subs = json_object_get(o, "subjects");
    if (!subs)
        return perr(err, p, "missing (required): a stream captures at least one subject");
    if (!json_is_array(subs))
        return perr(err, p, "must be an array of subjects, not %s", json_kind(subs));
    size_t n = json_array_size(subs);
    if (n == 0)
        return perr(err, p, "is empty: a stream captures at least one subject");
    if (n > JSD_TOPOLOGY_SUBJECTS_MAX)
        return perr(err, p, "has %zu subjects; the limit is %d", n, JSD_TOPOLOGY_SUBJECTS_MAX);
    s->subjects = jsd__calloc(n, sizeof(char *));
    if (!s->subjects)
        return jsd__err(err, JSD_ERR_NOMEM, "out of memory parsing %s", p);
    for (size_t i = 0; i < n; i++) {
        char pi[PATH_CAP], why[160];
        json_t *x = json_array_get(subs, i);
        jsd__snprintf(pi, sizeof(pi), "%s[%zu]", p, i);
        if (!json_is_string(x))
            return perr(err, pi, "must be a string, not %s", json_kind(x));
        const char *sj = json_string_value(x);
        if (strlen(sj) != json_string_length(x))
            return perr(err, pi, "contains a NUL byte");
        if (!jsd__subject_pattern_check(sj, why, sizeof(why)))
            return perr(err, pi, "%s", why);
        for (size_t k = 0; k < i; k++)
            if (jsd_subjects_overlap(s->subjects[k], sj))
                return perr(err, pi, "\"%s\" overlaps %s[%zu] \"%s\" of the same stream", sj, p, k,
                            s->subjects[k]);
        s->subjects[i] = sj;
    }
    s->pub.subjects = s->subjects;
    s->pub.n_subjects = n;

    static const char *const storages[] = {"file", "memory", NULL};
    static const char *const retentions[] = {"limits", "interest", "workqueue", NULL};
    static const char *const discards[] = {"old", "new", NULL};
    if ((st = get_enum(o, path, "storage", storages, 0, &e, err)) != JSD_OK)
        return st;
    s->pub.storage = (jsd_topology_storage)e;
    if ((st = get_enum(o, path, "retention", retentions, 0, &e, err)) != JSD_OK)
        return st;
    s->pub.retention = (jsd_topology_retention)e;
    if ((st = get_enum(o, path, "discard", discards, 0, &e, err)) != JSD_OK)
        return st;
    s->pub.discard = (jsd_topology_discard)e;
    if ((st = get_dur(o, path, "max_age", 1000, 3650 * DAY_MS, true, 0, &s->pub.max_age_ms, err)) !=
        JSD_OK)
        return st;
    if ((st = get_size(o, path, "max_bytes", 1, MAX_LIMIT_BYTES, &s->pub.max_bytes, err)) != JSD_OK)
        return st;
    if ((st = get_int(o, path, "max_msgs", 1, MAX_LIMIT_MSGS, true, -1, &s->pub.max_msgs, err)) !=
        JSD_OK)
        return st;
    if ((st = get_int(o, path, "max_msgs_per_subject", 1, MAX_LIMIT_MSGS, true, -1,
                      &s->pub.max_msgs_per_subject, err)) != JSD_OK)
        return st;
    if ((st = get_int(o, path, "replicas", 1, JSD_TOPOLOGY_REPLICAS_MAX, false, 1, &v, err)) !=
        JSD_OK)
        return st;
    s->pub.replicas = (int)v;

    int64_t def_dup = 2 * 60 * 1000;
    if (s->pub.max_age_ms > 0 && s->pub.max_age_ms < def_dup)
        def_dup = s->pub.max_age_ms;
    if ((st = get_dur(o, path, "duplicate_window", 1000, 7 * DAY_MS, false, def_dup,
                      &s->pub.duplicate_window_ms, err)) != JSD_OK)
        return st;
    if (s->pub.max_age_ms > 0 && s->pub.duplicate_window_ms > s->pub.max_age_ms) {
        subpath(p, path, "duplicate_window");
        return perr(err, p,
                    "%lld ms is longer than max_age (%lld ms): the server keeps ids only while "
                    "it keeps messages",
                    (long long)s->pub.duplicate_window_ms, (long long)s->pub.max_age_ms);
    }

    /* allow_atomic: the relay's atomic batches (nats-server 2.12+); left as
     * the server has it when the file does not say. */
    s->pub.allow_atomic = -1;
    json_t *aa = json_object_get(o, "allow_atomic");
    if (aa) {
        subpath(p, path, "allow_atomic");
        if (!json_is_boolean(aa))
            return perr(err, p, "must be true or false, not %s", json_kind(aa));
        s->pub.allow_atomic = json_is_true(aa);
    }
    if ((st = get_str(o, path, "persist_mode", false, 64, &s->pub.persist_mode, err)) != JSD_OK)
        return st;
    if (s->pub.persist_mode && strcmp(s->pub.persist_mode, "default") != 0) {
        char shown[80];
        subpath(p, path, "persist_mode");
        jsd__printable(s->pub.persist_mode, strlen(s->pub.persist_mode), shown, sizeof(shown));
        if (!strcmp(s->pub.persist_mode, "async"))
            return perr(err, p,
                        "\"async\" acknowledges a message before it is stored: a receipt would "
                        "name a message that a crash can lose. Use \"default\" (or leave it "
                        "out)");
        return perr(err, p, "\"%s\" is not a persist mode jsdurable accepts; use \"default\"",
                    shown);
    }

    json_t *dl = json_object_get(o, "dead_letter");
    if (dl) {
        subpath(p, path, "dead_letter");
        if (!json_is_boolean(dl))
            return perr(err, p, "must be true or false, not %s", json_kind(dl));
        s->pub.dead_letter = json_is_true(dl);
    }
    return JSD_OK;
}

static jsd_status parse_consumer(const json_t *o, jsd_topology *t, topo_consumer *c, jsd_error *err)
{
    jsd_status st;
    const char *path = c->path;
    char p[PATH_CAP];
    if (!json_is_object(o))
        return perr(err, path, "must be an object, not %s", json_kind(o));
    if ((st = check_keys(o, path, consumer_keys, err)) != JSD_OK)
        return st;
    if ((st = get_name(o, path, "stream", &c->pub.stream, err)) != JSD_OK)
        return st;
    if ((st = get_name(o, path, "durable", &c->pub.durable, err)) != JSD_OK)
        return st;
    if ((st = get_str(o, path, "description", false, 4096, &c->pub.description, err)) != JSD_OK)
        return st;

    size_t si = t->n_streams;
    for (size_t i = 0; i < t->n_streams; i++)
        if (!strcmp(t->streams[i].pub.name, c->pub.stream))
            si = i;
    if (si == t->n_streams) {
        subpath(p, path, "stream");
        return perr(err, p, "\"%s\" is not a stream declared in this file", c->pub.stream);
    }
    c->stream_index = si;
    const topo_stream *s = &t->streams[si];

    static const char *const delivers[] = {"all", NULL};
    int e;
    if ((st = get_enum(o, path, "deliver", delivers, 0, &e, err)) != JSD_OK)
        return st;

    if ((st = get_str(o, path, "filter_subject", false, JSD_SUBJECT_MAX + 1, &c->pub.filter_subject,
                      err)) != JSD_OK)
        return st;
    if (c->pub.filter_subject) {
        char why[160];
        subpath(p, path, "filter_subject");
        if (!jsd__subject_pattern_check(c->pub.filter_subject, why, sizeof(why)))
            return perr(err, p, "%s", why);
        bool inside = false;
        for (size_t k = 0; k < s->pub.n_subjects; k++)
            if (jsd__subject_within(c->pub.filter_subject, s->subjects[k]))
                inside = true;
        if (!inside)
            return perr(err, p, "\"%s\" is not within the subjects of stream \"%s\"",
                        c->pub.filter_subject, s->pub.name);
    }
    if ((st = get_dur(o, path, "ack_wait", 1000, 12 * 3600 * 1000LL, false, -1, &c->pub.ack_wait_ms,
                      err)) != JSD_OK)
        return st;
    if ((st = get_int(o, path, "max_deliver", 1, 1000000, true, -1, &c->pub.max_deliver, err)) !=
        JSD_OK)
        return st;
    if ((st = get_int(o, path, "max_ack_pending", 1, 1000000, false, 1000, &c->pub.max_ack_pending,
                      err)) != JSD_OK)
        return st;
    if ((st = get_dur(o, path, "inactive_threshold", 1000, 3650 * DAY_MS, true, 0,
                      &c->pub.inactive_threshold_ms, err)) != JSD_OK)
        return st;

    json_t *bo = json_object_get(o, "backoff");
    if (bo) {
        subpath(p, path, "backoff");
        if (!json_is_array(bo))
            return perr(err, p, "must be an array of durations such as [\"1s\", \"5s\"], not %s",
                        json_kind(bo));
        size_t n = json_array_size(bo);
        if (n > JSD_TOPOLOGY_BACKOFF_MAX)
            return perr(err, p, "has %zu steps; the limit is %d", n, JSD_TOPOLOGY_BACKOFF_MAX);
        if (n) {
            c->backoff = jsd__calloc(n, sizeof(int64_t));
            if (!c->backoff)
                return jsd__err(err, JSD_ERR_NOMEM, "out of memory parsing %s", p);
        }
        for (size_t i = 0; i < n; i++) {
            char pi[PATH_CAP];
            jsd__snprintf(pi, sizeof(pi), "%s[%zu]", p, i);
            if ((st = dur_value(json_array_get(bo, i), pi, 100, DAY_MS, false, &c->backoff[i],
                                err)) != JSD_OK)
                return st;
        }
        c->pub.backoff_ms = c->backoff;
        c->pub.n_backoff = n;
        /* JetStream waits backoff[0] for the first ack and overwrites
         * ack_wait with it; a different ack_wait in the file would be a lie. */
        if (n && c->pub.ack_wait_ms != -1 && c->pub.ack_wait_ms != c->backoff[0]) {
            subpath(p, path, "ack_wait");
            return perr(err, p,
                        "%lld ms differs from backoff[0] (%lld ms): with a backoff list "
                        "JetStream waits backoff[0] for the first ack and backoff[n] after "
                        "delivery n+1; drop ack_wait or set it to backoff[0]",
                        (long long)c->pub.ack_wait_ms, (long long)c->backoff[0]);
        }
        if (n)
            c->pub.ack_wait_ms = c->backoff[0];
        if (n && c->pub.max_deliver != -1 && (size_t)c->pub.max_deliver <= n) {
            subpath(p, path, "max_deliver");
            return perr(err, p,
                        "%lld must be greater than the %zu backoff steps (JetStream refuses "
                        "otherwise)",
                        (long long)c->pub.max_deliver, n);
        }
    }
    if (c->pub.ack_wait_ms == -1)
        c->pub.ack_wait_ms = 30000;
    return JSD_OK;
}

static jsd_status check_dead_letter(const jsd_topology *t, jsd_error *err)
{
    const topo_stream *d = &t->streams[t->dead_letter];
    char p[PATH_CAP];
    if (d->pub.storage != JSD_TOPOLOGY_FILE) {
        subpath(p, d->path, "storage");
        return perr(err, p,
                    "the dead-letter stream must use \"file\" storage: its records are the only "
                    "evidence of a poison message");
    }
    if (d->pub.retention != JSD_TOPOLOGY_LIMITS) {
        subpath(p, d->path, "retention");
        return perr(err, p,
                    "the dead-letter stream must use \"limits\" retention: interest or workqueue "
                    "retention deletes evidence once it is read");
    }
    for (size_t i = 0; i < d->pub.n_subjects; i++) {
        const char *ds = d->subjects[i];
        size_t dl = jsd__subject_root_len(ds);
        for (size_t k = 0; k < t->n_streams; k++) {
            const topo_stream *s = &t->streams[k];
            if ((int)k == t->dead_letter)
                continue;
            for (size_t j = 0; j < s->pub.n_subjects; j++) {
                size_t sl = jsd__subject_root_len(s->subjects[j]);
                if (jsd__subject_roots_nested(ds, dl, s->subjects[j], sl)) {
                    jsd__snprintf(p, sizeof(p), "%s.subjects[%zu]", d->path, i);
                    return perr(err, p,
                                "dead-letter subject \"%s\" shares its subject root with %s "
                                "\"%s\" of stream \"%s\"; put dead letters under their own root "
                                "(e.g. \"jsd.dlq.>\") so no hot-path subject can ever capture "
                                "them",
                                ds, s->path, s->subjects[j], s->pub.name);
                }
            }
        }
    }
    return JSD_OK;
}

static jsd_status topo_validate(jsd_topology *t, jsd_error *err)
{
    char p[PATH_CAP];
    for (size_t a = 0; a < t->n_streams; a++) {
        const topo_stream *sa = &t->streams[a];
        for (size_t b = 0; b < a; b++) {
            const topo_stream *sb = &t->streams[b];
            if (!strcmp(sa->pub.name, sb->pub.name)) {
                subpath(p, sa->path, "name");
                return perr(err, p, "stream \"%s\" is declared twice (also %s)", sa->pub.name,
                            sb->path);
            }
            for (size_t i = 0; i < sa->pub.n_subjects; i++)
                for (size_t j = 0; j < sb->pub.n_subjects; j++)
                    if (jsd_subjects_overlap(sa->subjects[i], sb->subjects[j])) {
                        jsd__snprintf(p, sizeof(p), "%s.subjects[%zu]", sa->path, i);
                        return perr(err, p,
                                    "\"%s\" of stream \"%s\" overlaps %s.subjects[%zu] \"%s\" of "
                                    "stream \"%s\": JetStream refuses overlapping stream subjects",
                                    sa->subjects[i], sa->pub.name, sb->path, j, sb->subjects[j],
                                    sb->pub.name);
                    }
        }
    }
    for (size_t a = 0; a < t->n_consumers; a++)
        for (size_t b = 0; b < a; b++)
            if (!strcmp(t->consumers[a].pub.stream, t->consumers[b].pub.stream) &&
                !strcmp(t->consumers[a].pub.durable, t->consumers[b].pub.durable)) {
                subpath(p, t->consumers[a].path, "durable");
                return perr(err, p, "consumer \"%s\" of stream \"%s\" is declared twice (also %s)",
                            t->consumers[a].pub.durable, t->consumers[a].pub.stream,
                            t->consumers[b].path);
            }
    if (t->dead_letter >= 0)
        return check_dead_letter(t, err);
    return JSD_OK;
}

void jsd_topology_destroy(jsd_topology *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n_streams; i++)
        jsd__free(t->streams[i].subjects);
    for (size_t i = 0; i < t->n_consumers; i++)
        jsd__free(t->consumers[i].backoff);
    jsd__free(t->streams);
    jsd__free(t->consumers);
    json_decref(t->root);
    jsd__free(t);
}

jsd_status jsd_topology_parse(jsd_topology **out, const char *json, size_t len, jsd_error *err)
{
    jsd_status st;
    jsd_topology *t = NULL;
    json_error_t je;
    if (!out)
        return jsd__err(err, JSD_ERR_INVALID, "jsd_topology_parse: out is NULL");
    *out = NULL;
    if (!json && len)
        return jsd__err(err, JSD_ERR_INVALID, "jsd_topology_parse: json is NULL");
    if (len > JSD_TOPOLOGY_FILE_MAX)
        return jsd__err(err, JSD_ERR_LIMIT,
                        "topology is %zu bytes; the limit is %d bytes (JSD_TOPOLOGY_FILE_MAX)", len,
                        JSD_TOPOLOGY_FILE_MAX);
    t = jsd__calloc(1, sizeof(*t));
    if (!t)
        return jsd__err(err, JSD_ERR_NOMEM, "out of memory parsing the topology");
    t->dead_letter = -1;
    t->root = json_loadb(json ? json : "", len, JSON_REJECT_DUPLICATES, &je);
    if (!t->root) {
        st = jsd__err(err, JSD_ERR_CONFIG, "line %d, column %d: %s", je.line, je.column, je.text);
        goto fail;
    }
    if (!json_is_object(t->root)) {
        st = perr(err, "(top level)", "must be an object with \"streams\", not %s",
                  json_kind(t->root));
        goto fail;
    }
    if ((st = check_keys(t->root, "", top_keys, err)) != JSD_OK)
        goto fail;
    int64_t version;
    if ((st = get_int(t->root, "", "version", 1, 1, false, 1, &version, err)) != JSD_OK)
        goto fail;

    json_t *streams = json_object_get(t->root, "streams");
    json_t *dl = json_object_get(t->root, "dead_letter");
    json_t *consumers = json_object_get(t->root, "consumers");
    if (streams && !json_is_array(streams)) {
        st = perr(err, "streams", "must be an array of streams, not %s", json_kind(streams));
        goto fail;
    }
    if (consumers && !json_is_array(consumers)) {
        st = perr(err, "consumers", "must be an array of consumers, not %s", json_kind(consumers));
        goto fail;
    }
    size_t ns = streams ? json_array_size(streams) : 0;
    size_t nc = consumers ? json_array_size(consumers) : 0;
    if (ns + (dl ? 1 : 0) == 0) {
        st = perr(err, "streams", "missing or empty: declare at least one stream");
        goto fail;
    }
    if (ns + (dl ? 1 : 0) > JSD_TOPOLOGY_STREAMS_MAX) {
        st = perr(err, "streams", "declares %zu streams; the limit is %d", ns + (dl ? 1 : 0),
                  JSD_TOPOLOGY_STREAMS_MAX);
        goto fail;
    }
    if (nc > JSD_TOPOLOGY_CONSUMERS_MAX) {
        st = perr(err, "consumers", "declares %zu consumers; the limit is %d", nc,
                  JSD_TOPOLOGY_CONSUMERS_MAX);
        goto fail;
    }
    t->streams = jsd__calloc(ns + 1, sizeof(topo_stream));
    t->consumers = jsd__calloc(nc + 1, sizeof(topo_consumer));
    if (!t->streams || !t->consumers) {
        st = jsd__err(err, JSD_ERR_NOMEM, "out of memory parsing the topology");
        goto fail;
    }
    for (size_t i = 0; i < ns; i++) {
        topo_stream *s = &t->streams[t->n_streams++];
        jsd__snprintf(s->path, sizeof(s->path), "streams[%zu]", i);
        if ((st = parse_stream(json_array_get(streams, i), s, err)) != JSD_OK)
            goto fail;
        if (s->pub.dead_letter) {
            if (t->dead_letter >= 0) {
                char p[PATH_CAP];
                subpath(p, s->path, "dead_letter");
                st = perr(err, p, "a second dead-letter stream (the first is %s); declare one",
                          t->streams[t->dead_letter].path);
                goto fail;
            }
            t->dead_letter = (int)i;
        }
    }
    if (dl) {
        topo_stream *s = &t->streams[t->n_streams++];
        jsd__snprintf(s->path, sizeof(s->path), "dead_letter");
        if ((st = parse_stream(dl, s, err)) != JSD_OK)
            goto fail;
        if (t->dead_letter >= 0) {
            st = perr(err, "dead_letter",
                      "a second dead-letter stream (the first is %s); declare one",
                      t->streams[t->dead_letter].path);
            goto fail;
        }
        if (json_object_get(dl, "dead_letter") && !s->pub.dead_letter) {
            st = perr(err, "dead_letter.dead_letter", "cannot be false in the dead_letter object");
            goto fail;
        }
        s->pub.dead_letter = true;
        t->dead_letter = (int)(t->n_streams - 1);
    }
    /* Streams first (consumers name them), then the checks across objects. */
    for (size_t a = 0; a < t->n_streams; a++)
        for (size_t b = 0; b < a; b++)
            if (!strcmp(t->streams[a].pub.name, t->streams[b].pub.name)) {
                char p[PATH_CAP];
                subpath(p, t->streams[a].path, "name");
                st = perr(err, p, "stream \"%s\" is declared twice (also %s)",
                          t->streams[a].pub.name, t->streams[b].path);
                goto fail;
            }
    for (size_t i = 0; i < nc; i++) {
        topo_consumer *c = &t->consumers[t->n_consumers++];
        jsd__snprintf(c->path, sizeof(c->path), "consumers[%zu]", i);
        if ((st = parse_consumer(json_array_get(consumers, i), t, c, err)) != JSD_OK)
            goto fail;
    }
    if ((st = topo_validate(t, err)) != JSD_OK)
        goto fail;
    *out = t;
    return JSD_OK;
fail:
    jsd_topology_destroy(t);
    return st;
}

jsd_status jsd_topology_load(jsd_topology **out, const char *path, jsd_error *err)
{
    if (!out || !path)
        return jsd__err(err, JSD_ERR_INVALID, "jsd_topology_load: out and path are required");
    *out = NULL;
    size_t n = 0;
    char *buf = jsd__read_file(path, JSD_TOPOLOGY_FILE_MAX, &n);
    if (!buf) {
        if (errno == EFBIG)
            return jsd__err(err, JSD_ERR_LIMIT,
                            "topology file %s is larger than %d bytes (JSD_TOPOLOGY_FILE_MAX)",
                            path, JSD_TOPOLOGY_FILE_MAX);
        if (errno == ENOMEM)
            return jsd__err(err, JSD_ERR_NOMEM, "out of memory reading %s", path);
        if (errno == EIO)
            return jsd__err(err, JSD_ERR_IO, "cannot read topology file %s", path);
        return jsd__err(err, JSD_ERR_IO, "cannot open topology file %s: %s", path, strerror(errno));
    }
    jsd_status st = jsd_topology_parse(out, buf, n, err);
    if (st != JSD_OK && err && st != JSD_ERR_NOMEM) {
        char msg[JSD_ERRMSG_MAX];
        jsd__snprintf(msg, sizeof(msg), "%s: %s", path, err->msg);
        jsd__strlcpy(err->msg, msg, sizeof(err->msg));
    }
    jsd__free(buf);
    return st;
}

size_t jsd_topology_stream_count(const jsd_topology *t)
{
    return t ? t->n_streams : 0;
}

const jsd_topology_stream *jsd_topology_stream_at(const jsd_topology *t, size_t i)
{
    return t && i < t->n_streams ? &t->streams[i].pub : NULL;
}

size_t jsd_topology_consumer_count(const jsd_topology *t)
{
    return t ? t->n_consumers : 0;
}

const jsd_topology_consumer *jsd_topology_consumer_at(const jsd_topology *t, size_t i)
{
    return t && i < t->n_consumers ? &t->consumers[i].pub : NULL;
}

const jsd_topology_stream *jsd_topology_dead_letter(const jsd_topology *t)
{
    return t && t->dead_letter >= 0 ? &t->streams[t->dead_letter].pub : NULL;
}
