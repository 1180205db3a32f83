/*
 * publisher — the public bounded publisher: binding to an existing stream and
 * one exact subject (PUB-1, PUB-7), attributes under the reserved prefix and
 * their limits (PUB-5, PUB-6), and synchronous and asynchronous publication on
 * top of the publication engine (pubengine.c), which decides the outcomes
 * (PUB-2..4).
 *
 * Binding reads the stream's configuration once, within the deadline, and
 * never creates or changes a stream. A later change to the stream is not
 * noticed by the binding; the Nats-Expected-Stream header still pins every
 * publication to the bound stream (a mismatch is FAILED with 10060).
 */
#include <string.h>
#include <strings.h>

#include "conn_int.h"
#include "consumer_int.h" /* jsd__json_valid */
#include "pubengine.h"
#include "subject.h"

struct jsd_publisher {
    jsd_conn *conn;
    jsd__pubengine *eng;
    char stream[JSD_STREAM_NAME_MAX + 1];
    char subject[JSD_SUBJECT_MAX + 1];
    int deadline_ms;
    int64_t dup_window_ms;
    bool json_payloads;
    jsd_error last;
    /* completions of asynchronous publications collected while jsd_publish
     * waited for its own; handed out first by jsd_publisher_poll */
    jsd_publish_done *parked;
    size_t n_parked, parked_head;
    size_t cap;
};

void jsd_publisher_opts_init(jsd_publisher_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->admission = 256;
    o->deadline_ms = 5000;
}

/* ---- binding ------------------------------------------------------------------ */

static jsd_status check_opts(const jsd_publisher_opts *o, jsd_error *err)
{
    if (!jsd__stream_name_valid(o->stream, err))
        return JSD_ERR_INVALID;
    if (!jsd__subject_valid_publish(o->subject, err))
        return JSD_ERR_INVALID;
    jsd_status admitted = jsd__admission_check(o->admission, o->deadline_ms, err);
    if (admitted != JSD_OK)
        return admitted;
    if (o->expected_duplicate_window_ms < 0)
        return jsd__err(err, JSD_ERR_INVALID, "expected duplicate window %lld ms is negative",
                        (long long)o->expected_duplicate_window_ms);
    return JSD_OK;
}

/* The stream's subjects, for an error message. */
static void list_subjects(const jsStreamConfig *cfg, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; i < cfg->SubjectsLen && n + 8 < cap; i++) {
        char shown[64];
        const char *s = cfg->Subjects[i] ? cfg->Subjects[i] : "";
        jsd__printable(s, strlen(s), shown, sizeof(shown));
        jsd__snprintf(out + n, cap - n, "%s\"%s\"", i ? ", " : "", shown);
        n = strlen(out);
    }
    if (cfg->SubjectsLen == 0)
        jsd__strlcpy(out, "none", cap);
}

jsd_status jsd_publisher_bind(jsd_publisher **out, jsd_conn *conn, const jsd_publisher_opts *o,
                              jsd_error *err)
{
    jsd_publisher *p = NULL;
    jsStreamInfo *si = NULL;
    jsd_status st;
    if (!out)
        return jsd__err(err, JSD_ERR_INVALID, "bind: no output handle");
    *out = NULL;
    if (!conn || !o)
        return jsd__err(err, JSD_ERR_INVALID, "bind: a connection and options are required");
    if ((st = check_opts(o, err)) != JSD_OK)
        return st;
    jsCtx *js = jsd__conn_js(conn);
    if (!js)
        return jsd__err(err, JSD_ERR_NO_JETSTREAM,
                        "bind: the connection has no JetStream context (require_jetstream off?)");

    jsOptions jo;
    jsErrCode jerr = 0;
    jsOptions_Init(&jo);
    jo.Wait = o->deadline_ms;
    natsStatus s = js_GetStreamInfo(&si, js, o->stream, &jo, &jerr);
    if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr) {
        st = jsd__err(err, JSD_ERR_NOT_FOUND,
                      "stream \"%s\" does not exist; the publisher binds to an existing stream "
                      "and never creates one",
                      o->stream);
        if (err)
            err->js_err_code = (int)jerr;
        goto fail;
    }
    if (s == NATS_TIMEOUT) {
        st = jsd__err(err, JSD_ERR_TIMEOUT,
                      "bind: no answer about stream \"%s\" within the %d ms deadline", o->stream,
                      o->deadline_ms);
        if (err)
            err->nats_status = (int)s;
        goto fail;
    }
    if (s != NATS_OK) {
        char what[200];
        jsd__snprintf(what, sizeof(what), "bind: reading stream \"%s\"", o->stream);
        st = jsd__err_nats(err, s, jerr, what);
        goto fail;
    }
    const jsStreamConfig *cfg = si->Config;
    if (cfg->Storage != js_FileStorage) {
        st = jsd__err(err, JSD_ERR_BIND,
                      "stream \"%s\" uses memory storage; bind needs file storage", o->stream);
        goto fail;
    }
    if (cfg->NoAck) {
        st = jsd__err(err, JSD_ERR_BIND,
                      "stream \"%s\" has no_ack set (publication acknowledgements off); bind "
                      "needs acknowledgements",
                      o->stream);
        goto fail;
    }
    bool covered = false;
    for (int i = 0; i < cfg->SubjectsLen && !covered; i++)
        covered = cfg->Subjects[i] && jsd__subject_matches(cfg->Subjects[i], o->subject);
    if (!covered) {
        char subjects[300];
        list_subjects(cfg, subjects, sizeof(subjects));
        st = jsd__err(err, JSD_ERR_BIND,
                      "stream \"%s\" does not capture subject \"%s\" (its subjects: %s)", o->stream,
                      o->subject, subjects);
        goto fail;
    }
    int64_t window_ms = cfg->Duplicates / 1000000;
    if (o->expected_duplicate_window_ms && window_ms != o->expected_duplicate_window_ms) {
        st = jsd__err(err, JSD_ERR_BIND,
                      "stream \"%s\" has a duplicate window of %lld ms; the binding expects %lld "
                      "ms",
                      o->stream, (long long)window_ms, (long long)o->expected_duplicate_window_ms);
        goto fail;
    }

    p = jsd__calloc(1, sizeof(*p));
    if (!p) {
        st = jsd__err(err, JSD_ERR_NOMEM, "bind: out of memory");
        goto fail;
    }
    p->conn = conn;
    p->deadline_ms = o->deadline_ms;
    p->dup_window_ms = window_ms;
    p->json_payloads = o->json_payloads;
    p->cap = (size_t)o->admission;
    jsd__strlcpy(p->stream, o->stream, sizeof(p->stream));
    jsd__strlcpy(p->subject, o->subject, sizeof(p->subject));
    p->parked = jsd__calloc(p->cap, sizeof(*p->parked));
    if (!p->parked) {
        st = jsd__err(err, JSD_ERR_NOMEM, "bind: out of memory");
        goto fail;
    }
    jsd__pubengine_opts eo = {
        .admission = o->admission, .deadline_ms = o->deadline_ms, .max_payload = o->max_payload};
    if ((st = jsd__pubengine_create(&p->eng, conn, &eo, err)) != JSD_OK)
        goto fail;
    jsStreamInfo_Destroy(si);
    JSD_DEBUG("publisher", "bound to stream %s subject %s (duplicate window %lld ms)", p->stream,
              p->subject, (long long)window_ms);
    *out = p;
    return JSD_OK;
fail:
    jsStreamInfo_Destroy(si);
    jsd_publisher_destroy(p);
    return st;
}

void jsd_publisher_destroy(jsd_publisher *p)
{
    if (!p)
        return;
    jsd__pubengine_destroy(p->eng);
    jsd__free(p->parked);
    jsd__free(p);
}

const char *jsd_publisher_errmsg(const jsd_publisher *p)
{
    return p ? p->last.msg : "";
}

const char *jsd_publisher_stream(const jsd_publisher *p)
{
    return p ? p->stream : "";
}

const char *jsd_publisher_subject(const jsd_publisher *p)
{
    return p ? p->subject : "";
}

int64_t jsd_publisher_duplicate_window_ms(const jsd_publisher *p)
{
    return p ? p->dup_window_ms : 0;
}

size_t jsd_publisher_max_payload(const jsd_publisher *p)
{
    return p ? jsd__pubengine_max_payload(p->eng) : 0;
}

/* ---- publishing ------------------------------------------------------------------ */

typedef struct attr_headers {
    char names[JSD_ATTRS_MAX][sizeof(JSD_ATTR_PREFIX) + JSD_ATTR_NAME_MAX];
    jsd_header h[JSD_ATTRS_MAX];
} attr_headers;

static bool prepare_attrs(const jsd_header *attrs, size_t n, attr_headers *ah,
                          jsd_publish_result *res)
{
    jsd_error ve;
    if (n > JSD_ATTRS_MAX) {
        snprintf(res->reason, sizeof(res->reason), "%zu attributes; the limit is %d", n,
                 JSD_ATTRS_MAX);
        return false;
    }
    if (n && !attrs) {
        snprintf(res->reason, sizeof(res->reason), "%zu attributes given as NULL", n);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (!jsd__header_name_valid(attrs[i].name, JSD_ATTR_NAME_MAX, "attribute", &ve)) {
            jsd__strlcpy(res->reason, ve.msg, sizeof(res->reason));
            return false;
        }
        const char *v = attrs[i].value ? attrs[i].value : "";
        if (!jsd__header_value_valid(v, strlen(v), JSD_ATTR_VALUE_MAX, "attribute", &ve)) {
            jsd__strlcpy(res->reason, ve.msg, sizeof(res->reason));
            return false;
        }
        for (size_t j = 0; j < i; j++) {
            if (strcasecmp(attrs[i].name, attrs[j].name) == 0) {
                snprintf(res->reason, sizeof(res->reason), "attribute \"%s\" is given twice",
                         attrs[i].name);
                return false;
            }
        }
        jsd__snprintf(ah->names[i], sizeof(ah->names[i]), "%s%s", JSD_ATTR_PREFIX, attrs[i].name);
        ah->h[i].name = ah->names[i];
        ah->h[i].value = v;
    }
    return true;
}

static void remember(jsd_publisher *p, const jsd_publish_result *res)
{
    if (res->outcome == JSD_OUTCOME_ACCEPTED) {
        jsd_error_clear(&p->last);
        return;
    }
    jsd__err(&p->last, JSD_ERR_NATS, "publish %s: %s", jsd_outcome_str(res->outcome), res->reason);
    p->last.nats_status = res->nats_status;
    p->last.js_err_code = res->js_err_code;
}

bool jsd_publish_submit(jsd_publisher *p, const char *msg_id, const void *payload, size_t len,
                        const jsd_header *attrs, size_t n_attrs, void *user,
                        jsd_publish_result *res)
{
    jsd_publish_result local;
    attr_headers ah;
    if (!res)
        res = &local;
    memset(res, 0, sizeof(*res));
    if (!p) {
        res->outcome = JSD_OUTCOME_REJECTED;
        jsd__strlcpy(res->reason, "no publisher", sizeof(res->reason));
        return false;
    }
    /* Admission first: an overloaded publisher answers RETRYABLE whatever
     * the input. */
    if (jsd__pubengine_inflight(p->eng) + p->n_parked >= p->cap) {
        jsd__admission_full(res, p->cap);
        remember(p, res);
        return false;
    }
    if (!prepare_attrs(attrs, n_attrs, &ah, res)) {
        res->outcome = JSD_OUTCOME_REJECTED;
        remember(p, res);
        return false;
    }
    if (p->json_payloads && len <= jsd__pubengine_max_payload(p->eng)) {
        char why[160];
        if (!payload || !jsd__json_valid(payload, len, JSD_JSON_DEPTH_MAX, why, sizeof(why))) {
            res->outcome = JSD_OUTCOME_REJECTED;
            snprintf(res->reason, sizeof(res->reason), "payload is not acceptable JSON: %s",
                     payload ? why : "no payload");
            remember(p, res);
            return false;
        }
    }
    jsd__pub_req req = {.subject = p->subject,
                        .expected_stream = p->stream,
                        .msg_id = msg_id,
                        .headers = ah.h,
                        .n_headers = n_attrs,
                        .payload = payload,
                        .len = len,
                        .user = user};
    if (jsd__pubengine_submit(p->eng, &req, res))
        return true;
    remember(p, res);
    return false;
}

size_t jsd_publisher_poll(jsd_publisher *p, jsd_publish_done *done, size_t max, int timeout_ms)
{
    size_t n = 0;
    if (!p || !done || !max)
        return 0;
    while (n < max && p->n_parked) {
        done[n++] = p->parked[p->parked_head];
        p->parked_head = (p->parked_head + 1) % p->cap;
        p->n_parked--;
    }
    if (n < max)
        n += jsd__pubengine_poll(p->eng, done + n, max - n, n ? 0 : timeout_ms);
    for (size_t i = 0; i < n; i++)
        if (done[i].result.outcome != JSD_OUTCOME_ACCEPTED)
            remember(p, &done[i].result);
    return n;
}

size_t jsd_publisher_inflight(const jsd_publisher *p)
{
    return p ? jsd__pubengine_inflight(p->eng) + p->n_parked : 0;
}

jsd_outcome jsd_publish(jsd_publisher *p, const char *msg_id, const void *payload, size_t len,
                        const jsd_header *attrs, size_t n_attrs, jsd_publish_result *res)
{
    jsd_publish_result local;
    char token; /* its address marks this call's publication */
    if (!res)
        res = &local;
    if (!jsd_publish_submit(p, msg_id, payload, len, attrs, n_attrs, &token, res))
        return res->outcome;
    for (;;) {
        jsd_publish_done d;
        /* Every entry finishes by its deadline, so this wait is bounded. */
        if (jsd__pubengine_poll(p->eng, &d, 1, -1) == 0) {
            if (jsd__pubengine_inflight(p->eng) == 0) { /* cannot happen; never spin */
                memset(res, 0, sizeof(*res));
                res->outcome = JSD_OUTCOME_UNKNOWN;
                jsd__strlcpy(res->reason,
                             "internal: the publication vanished; retry with the same id",
                             sizeof(res->reason));
                remember(p, res);
                return res->outcome;
            }
            continue;
        }
        if (d.user == &token) {
            *res = d.result;
            remember(p, res);
            return res->outcome;
        }
        /* someone's asynchronous publication: keep it for jsd_publisher_poll */
        p->parked[(p->parked_head + p->n_parked) % p->cap] = d;
        p->n_parked++;
    }
}
