/*
 * streams — the one answer to "which stream captures this subject" and its
 * cache (see streams.h). Lookups are one <API prefix>.STREAM.NAMES request
 * ($JS.API unless the connection names a JetStream domain or prefix) with a
 * subject filter; answers, found or not, are kept in a hash table of at most
 * max subjects, each until its TTL runs out; the duplicate windows of found
 * streams sit in a small table beside it. One mutex guards both tables and is
 * never held across a request.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "conn_int.h"
#include "puback.h"
#include "streams.h"
#include "subject.h"

#define BUCKETS     256
#define WINDOWS_MAX 64

/* ---- raw JetStream API requests ----------------------------------------------------- */

jsd_status jsd__js_api(jsd_conn *conn, const char *api, const char *body, json_t **out,
                       const char *what, jsd_error *err)
{
    natsConnection *nc = conn ? jsd__conn_nats(conn) : NULL;
    natsMsg *reply = NULL;
    json_t *root = NULL;
    jsd_status st = JSD_OK;
    *out = NULL;
    if (!nc)
        return jsd__err(err, JSD_ERR_INVALID, "%s: no NATS connection", what);
    char subj[512];
    jsd__snprintf(subj, sizeof(subj), "%s.%s", jsd__conn_js_api_prefix(conn), api);
    natsStatus s = natsConnection_RequestString(&reply, nc, subj, body ? body : "",
                                                jsd__conn_request_timeout_ms(conn));
    if (s == NATS_NO_RESPONDERS) {
        st = jsd__err(err, JSD_ERR_NO_JETSTREAM,
                      "%s: JetStream did not answer (no responders); is JetStream enabled?", what);
        if (err)
            err->nats_status = (int)s;
        goto done;
    }
    if (s != NATS_OK) {
        st = jsd__err_nats(err, s, 0, what);
        goto done;
    }
    json_error_t jerr;
    root = json_loadb(natsMsg_GetData(reply), (size_t)natsMsg_GetDataLength(reply), 0, &jerr);
    if (!root || !json_is_object(root)) {
        st = jsd__err(err, JSD_ERR_NATS, "%s: malformed answer", what);
        goto done;
    }
    json_t *je = json_object_get(root, "error");
    if (je) {
        json_t *ec = json_object_get(je, "err_code");
        json_t *d = json_object_get(je, "description");
        int code = json_is_integer(ec) ? (int)json_integer_value(ec) : 0;
        char desc[200];
        jsd__copy_printable(desc, sizeof(desc), json_is_string(d) ? json_string_value(d) : "");
        st = jsd__err(err, code == JSD__JS_STREAM_NOT_FOUND ? JSD_ERR_NOT_FOUND : JSD_ERR_NATS,
                      "%s: %s (err_code %d)", what, desc, code);
        if (err)
            err->js_err_code = code;
        goto done;
    }
    *out = root;
    root = NULL;
done:
    json_decref(root);
    natsMsg_Destroy(reply);
    return st;
}

jsd_status jsd__stream_config_json(jsd_conn *conn, const char *stream, json_t **cfg, jsd_error *err)
{
    char api[64 + JSD_STREAM_NAME_MAX], what[64 + JSD_STREAM_NAME_MAX];
    json_t *root = NULL;
    *cfg = NULL;
    jsd__snprintf(api, sizeof(api), "STREAM.INFO.%s", stream);
    jsd__snprintf(what, sizeof(what), "reading stream \"%s\"", stream);
    jsd_status st = jsd__js_api(conn, api, NULL, &root, what, err);
    if (st != JSD_OK)
        return st;
    json_t *c = json_object_get(root, "config");
    if (!json_is_object(c)) {
        json_decref(root);
        return jsd__err(err, JSD_ERR_NATS, "%s: the answer has no configuration", what);
    }
    *cfg = json_incref(c);
    json_decref(root);
    return JSD_OK;
}

/* ---- one lookup --------------------------------------------------------------------- */

jsd_status jsd__stream_for_subject(jsd_conn *conn, const char *subject, char *name_out, size_t cap,
                                   jsd_error *err)
{
    json_t *req = NULL, *root = NULL;
    char *body = NULL;
    jsd_status st = JSD_OK;
    if (name_out && cap)
        name_out[0] = '\0';
    if (!conn || !jsd__conn_nats(conn) || !name_out || !cap)
        return jsd__err(err, JSD_ERR_INVALID, "stream lookup: connection and output needed");
    if (!jsd__subject_valid_exact(subject, err))
        return JSD_ERR_INVALID;
    req = json_pack("{s:s}", "subject", subject);
    body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    if (!body) {
        st = jsd__err(err, JSD_ERR_NOMEM, "stream lookup: out of memory");
        goto done;
    }
    char what[320];
    jsd__snprintf(what, sizeof(what), "looking up the stream for \"%s\"", subject);
    if ((st = jsd__js_api(conn, "STREAM.NAMES", body, &root, what, err)) != JSD_OK)
        goto done;
    json_t *arr = json_object_get(root, "streams");
    json_t *first = json_is_array(arr) ? json_array_get(arr, 0) : NULL;
    if (!json_is_string(first)) {
        st = jsd__err(err, JSD_ERR_NOT_FOUND, "no stream captures subject \"%s\"", subject);
        goto done;
    }
    if (!jsd__strlcpy(name_out, json_string_value(first), cap)) {
        name_out[0] = '\0';
        st = jsd__err(err, JSD_ERR_LIMIT, "stream name for \"%s\" does not fit %zu bytes", subject,
                      cap);
    }
done:
    json_decref(root);
    json_decref(req);
    free(body);
    return st;
}

/* ---- the cache ---------------------------------------------------------------------- */

typedef struct entry {
    struct entry *next;
    char *subject;
    char stream[JSD_STREAM_NAME_MAX + 1]; /* "" = no stream captures it */
    int64_t expires_ms;                   /* monotonic */
} entry;

/* A stream's duplicate window and allow_atomic, re-read after expires_ms
 * (they may change). */
typedef struct window {
    char stream[JSD_STREAM_NAME_MAX + 1];
    int64_t window_ms;
    bool atomic;
    int64_t expires_ms;
} window;

struct jsd__streams {
    jsd_conn *conn;
    int64_t pos_ttl_ms, neg_ttl_ms;
    size_t max;
    pthread_mutex_t mu;
    entry *b[BUCKETS];
    size_t n;
    window windows[WINDOWS_MAX];
    size_t n_windows;
};

static uint32_t hash_str(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* Must hold mu. */
static void clear_locked(jsd__streams *c)
{
    for (size_t i = 0; i < BUCKETS; i++) {
        entry *e = c->b[i];
        while (e) {
            entry *n = e->next;
            jsd__free(e->subject);
            jsd__free(e);
            e = n;
        }
        c->b[i] = NULL;
    }
    c->n = 0;
    c->n_windows = 0;
}

/* Must hold mu. */
static entry *find_locked(jsd__streams *c, const char *subject)
{
    for (entry *e = c->b[hash_str(subject) % BUCKETS]; e; e = e->next)
        if (!strcmp(e->subject, subject))
            return e;
    return NULL;
}

jsd_status jsd__streams_create(jsd__streams **out, jsd_conn *conn, int64_t pos_ttl_ms,
                               int64_t neg_ttl_ms, size_t max)
{
    if (!out)
        return JSD_ERR_INVALID;
    *out = NULL;
    jsd__streams *c = jsd__calloc(1, sizeof(*c));
    if (!c)
        return JSD_ERR_NOMEM;
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        jsd__free(c);
        return JSD_ERR_INTERNAL;
    }
    c->conn = conn;
    c->pos_ttl_ms = pos_ttl_ms > 0 ? pos_ttl_ms : JSD__STREAMS_POS_TTL_MS;
    c->neg_ttl_ms = neg_ttl_ms > 0 ? neg_ttl_ms : JSD__STREAMS_NEG_TTL_MS;
    c->max = max ? max : JSD__STREAMS_MAX;
    *out = c;
    return JSD_OK;
}

void jsd__streams_destroy(jsd__streams *c)
{
    if (!c)
        return;
    clear_locked(c);
    pthread_mutex_destroy(&c->mu);
    jsd__free(c);
}

void jsd__streams_clear(jsd__streams *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    clear_locked(c);
    pthread_mutex_unlock(&c->mu);
}

void jsd__streams_forget(jsd__streams *c, const char *subject)
{
    if (!c || !subject)
        return;
    pthread_mutex_lock(&c->mu);
    entry **pp = &c->b[hash_str(subject) % BUCKETS];
    for (; *pp; pp = &(*pp)->next) {
        if (!strcmp((*pp)->subject, subject)) {
            entry *e = *pp;
            *pp = e->next;
            jsd__free(e->subject);
            jsd__free(e);
            c->n--;
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
}

static jsd_status not_found(const char *subject, jsd_error *err)
{
    return jsd__err(err, JSD_ERR_NOT_FOUND, "no stream captures subject \"%s\"", subject);
}

jsd_status jsd__streams_lookup(jsd__streams *c, const char *subject, char *name_out, size_t cap,
                               jsd_error *err)
{
    if (name_out && cap)
        name_out[0] = '\0';
    if (!c || !subject || !name_out || !cap)
        return jsd__err(err, JSD_ERR_INVALID, "stream lookup: cache, subject and output needed");
    int64_t now = jsd__mono_ms();
    pthread_mutex_lock(&c->mu);
    entry *e = find_locked(c, subject);
    if (e && e->expires_ms > now) {
        bool found = e->stream[0] != '\0';
        bool fits = jsd__strlcpy(name_out, e->stream, cap);
        pthread_mutex_unlock(&c->mu);
        if (!found)
            return not_found(subject, err);
        if (!fits) {
            name_out[0] = '\0';
            return jsd__err(err, JSD_ERR_LIMIT, "stream name for \"%s\" does not fit %zu bytes",
                            subject, cap);
        }
        return JSD_OK;
    }
    pthread_mutex_unlock(&c->mu);

    char stream[JSD_STREAM_NAME_MAX + 1];
    jsd_status st = jsd__stream_for_subject(c->conn, subject, stream, sizeof(stream), err);
    if (st != JSD_OK && st != JSD_ERR_NOT_FOUND)
        return st;

    pthread_mutex_lock(&c->mu);
    now = jsd__mono_ms();
    e = find_locked(c, subject);
    if (!e) {
        if (c->n >= c->max)
            clear_locked(c);
        e = jsd__calloc(1, sizeof(*e));
        char *dup = jsd__strdup(subject);
        if (!e || !dup) {
            pthread_mutex_unlock(&c->mu);
            jsd__free(e);
            jsd__free(dup);
            return jsd__err(err, JSD_ERR_NOMEM, "out of memory caching the stream of %s", subject);
        }
        e->subject = dup;
        uint32_t h = hash_str(subject) % BUCKETS;
        e->next = c->b[h];
        c->b[h] = e;
        c->n++;
    }
    if (st == JSD_ERR_NOT_FOUND) {
        e->stream[0] = '\0';
        e->expires_ms = now + c->neg_ttl_ms;
    } else {
        jsd__strlcpy(e->stream, stream, sizeof(e->stream));
        e->expires_ms = now + c->pos_ttl_ms;
    }
    pthread_mutex_unlock(&c->mu);
    if (st == JSD_ERR_NOT_FOUND)
        return st; /* err already says so */
    if (!jsd__strlcpy(name_out, stream, cap)) {
        name_out[0] = '\0';
        return jsd__err(err, JSD_ERR_LIMIT, "stream name for \"%s\" does not fit %zu bytes",
                        subject, cap);
    }
    return JSD_OK;
}

jsd_status jsd__streams_info(jsd__streams *c, const char *stream, int64_t *window_ms,
                             bool *allow_atomic, jsd_error *err)
{
    if (!c || !stream || !window_ms || !allow_atomic)
        return jsd__err(err, JSD_ERR_INVALID, "stream info: cache, stream and outputs needed");
    int64_t now = jsd__mono_ms();
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n_windows; i++) {
        window *w = &c->windows[i];
        if (!strcmp(w->stream, stream) && w->expires_ms > now) {
            *window_ms = w->window_ms;
            *allow_atomic = w->atomic;
            pthread_mutex_unlock(&c->mu);
            return JSD_OK;
        }
    }
    pthread_mutex_unlock(&c->mu);

    /* raw, for allow_atomic, which nats.c 3.4.1 does not read */
    json_t *cfg = NULL;
    jsd_error ierr;
    jsd_error_clear(&ierr);
    jsd_status st = jsd__stream_config_json(c->conn, stream, &cfg, &ierr);
    if (st != JSD_OK) {
        jsd_status out =
            jsd__err(err, st == JSD_ERR_NOT_FOUND ? JSD_ERR_NOT_FOUND : JSD_ERR_NATS,
                     "reading the duplicate window of stream %s: %s", stream, ierr.msg);
        if (err) {
            err->nats_status = ierr.nats_status;
            err->js_err_code = ierr.js_err_code;
        }
        return out;
    }
    json_t *jd = json_object_get(cfg, "duplicate_window");
    int64_t win = json_is_integer(jd) ? (int64_t)json_integer_value(jd) / 1000000 : 0;
    bool atomic = json_is_true(json_object_get(cfg, "allow_atomic"));
    json_decref(cfg);

    pthread_mutex_lock(&c->mu);
    now = jsd__mono_ms();
    window *w = NULL;
    for (size_t i = 0; i < c->n_windows && !w; i++)
        if (!strcmp(c->windows[i].stream, stream))
            w = &c->windows[i];
    if (!w) {
        if (c->n_windows == WINDOWS_MAX)
            c->n_windows = 0; /* forget them all: they are read again */
        w = &c->windows[c->n_windows++];
        jsd__strlcpy(w->stream, stream, sizeof(w->stream));
    }
    w->window_ms = win;
    w->atomic = atomic;
    w->expires_ms = now + c->pos_ttl_ms;
    pthread_mutex_unlock(&c->mu);
    *window_ms = win;
    *allow_atomic = atomic;
    return JSD_OK;
}

jsd_status jsd__streams_dup_window(jsd__streams *c, const char *stream, int64_t *window_ms,
                                   jsd_error *err)
{
    bool atomic = false;
    return jsd__streams_info(c, stream, window_ms, &atomic, err);
}
