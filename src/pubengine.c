/*
 * pubengine — many JetStream publications in flight on one connection, each
 * settled into exactly one typed outcome (see pubengine.h for the rules).
 *
 * DESIGN
 * - Every publication gets a slot in a fixed table (the admission bound) and
 *   an id = (generation << 11) | slot, sent as the last token of its reply
 *   subject. A reply that does not name a live slot with the same id is late
 *   or foreign and is dropped (counted), never attributed to another entry.
 * - The entry is registered (state WRITING) before natsConnection_PublishMsg,
 *   so a reply that arrives before PublishMsg returns still finds it. If the
 *   write is refused before anything was buffered, the slot is released and
 *   the outcome is decided at once.
 * - nats.c's threads (subscription callback, async-error listener) read the
 *   reply without touching shared state (jsd__reply_parse in src/puback.c:
 *   the usual acknowledgement without allocating), then only store the result
 *   or a "denied" mark in the entry under the lock and queue the slot; the
 *   owner thread decides the outcome against what the entry expected
 *   (jsd__puback_judge), in poll.
 * - An atomic batch is one entry: its commit's reply subject is the entry's,
 *   its first publication's is the same with an "f" before the id (reply
 *   "<prefix>f<id>"). That answer is empty (the server's flow control) and
 *   dropped, or an error, kept in the entry: it decides the batch (the
 *   commit is then answered 10176, incomplete), but the entry is still
 *   settled by the commit's reply or its deadline, so one batch is one
 *   outcome, always.
 * - Nothing waits without a bound: each entry has a deadline, and poll settles
 *   as UNKNOWN any entry whose deadline passed or whose connection was lost or
 *   replaced while it was in flight (its acknowledgement cannot come any more).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "atomic.h"
#include "conn_int.h"
#include "natsmsg.h"
#include "puback.h"
#include "pubengine.h"
#include "subject.h"

#define SLOT_BITS      11
#define SLOT_MASK      ((1u << SLOT_BITS) - 1)
#define CONN_CHECK_MS  50 /* how often a waiting poll looks at the connection */
#define BATCH_WAIT_MS  2  /* a completion waits this long for its batch-mates, */
#define BATCH_WAIT_MAX 16 /* growing to this while completions trickle in */

enum { E_FREE = 0, E_WRITING, E_INFLIGHT, E_QUEUED, E_TAKEN };

typedef struct entry {
    uint64_t id;
    uint64_t gen;
    int state;
    bool denied;
    bool lost; /* connection lost/replaced while in flight */
    bool expired;
    int64_t deadline_mono;
    int deadline_ms;
    uint64_t epoch; /* reconnect count when written */
    int64_t seen_ms;
    bool has_reply;
    jsd__reply rp;
    void *user;
    char stream[JSD_STREAM_NAME_MAX + 1];
    char subject[JSD_SUBJECT_MAX + 1];
    /* an atomic batch (submit_batch): its size (0: one publication), its id,
     * and an error answered to its first publication, which decides it */
    uint32_t batch_n;
    bool has_first;
    jsd__reply first;
    char batch_id[33];
} entry;

struct jsd__pubengine {
    jsd_conn *conn;
    natsConnection *nc;
    natsSubscription *sub;
    int listener;
    size_t cap;
    int deadline_ms;
    size_t max_payload;
    int64_t server_max;
    char prefix[48]; /* "_INBOX.<hex>." */
    size_t prefix_len;
    jsd__msg_scratch scratch; /* submit's (the owner thread's) message buffer */

    pthread_mutex_t lk;
    pthread_cond_t cv;
    bool sub_done; /* the subscription's completion callback ran */
    entry *entries;
    uint32_t *free_stack;
    size_t n_free;
    uint32_t *ring; /* queued slots, completion order */
    size_t ring_head, ring_len;
    int64_t next_expiry;  /* earliest deadline of INFLIGHT entries (may be early) */
    uint64_t swept_epoch; /* reconnect count at the last full sweep */
    /* poll is waiting; wake it when wake_at completions are queued (a batch
     * when many are in flight, so one wake-up serves many; it also wakes
     * itself every BATCH_WAIT_MS) */
    bool waiting;
    size_t wake_at;
    int batch_wait_ms; /* BATCH_WAIT_MS..BATCH_WAIT_MAX, doubled after a wait
                          that ended with a small batch, reset after a full one */
    atomic_size_t used;
    atomic_uint_least64_t late;
};

/* ---- small helpers --------------------------------------------------------------- */

static void set_reason(jsd_publish_result *res, const char *fmt, ...) JSD_PRINTF(2, 3);
static void set_reason(jsd_publish_result *res, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    /* the analyzer misses the va_start above */
    // NOLINTNEXTLINE(clang-analyzer-valist.Uninitialized)
    vsnprintf(res->reason, sizeof(res->reason), fmt, ap);
    va_end(ap);
}

static void result_init(jsd_publish_result *res, jsd_outcome o)
{
    memset(res, 0, sizeof(*res));
    res->outcome = o;
}

/* Must hold lk. */
static void queue_slot(jsd__pubengine *e, uint32_t slot)
{
    e->entries[slot].state = E_QUEUED;
    e->ring[(e->ring_head + e->ring_len) % e->cap] = slot;
    e->ring_len++;
    if (e->waiting && e->ring_len >= e->wake_at)
        pthread_cond_signal(&e->cv);
}

/* Must hold lk. */
static void release_slot(jsd__pubengine *e, uint32_t slot)
{
    entry *en = &e->entries[slot];
    en->has_reply = false;
    en->state = E_FREE;
    en->user = NULL;
    e->free_stack[e->n_free++] = slot;
    atomic_fetch_sub(&e->used, 1);
}

/* ---- nats.c callbacks: only hand data over ------------------------------------------ */

static void on_reply(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    jsd__pubengine *e = closure;
    const char *subj = natsMsg_GetSubject(msg);
    (void)nc;
    (void)sub;
    uint64_t id = 0;
    bool ok = subj && strncmp(subj, e->prefix, e->prefix_len) == 0;
    bool first = false; /* the answer to a batch's first publication */
    if (ok) {
        const char *p = subj + e->prefix_len;
        if (*p == 'f') {
            first = true;
            p++;
        }
        ok = *p != '\0';
        for (; ok && *p; p++) {
            if (*p < '0' || *p > '9' || id > (UINT64_MAX - 9) / 10) {
                ok = false;
                break;
            }
            id = id * 10 + (uint64_t)(*p - '0');
        }
    }
    int64_t seen = jsd__now_ms();
    jsd__reply rp;
    if (ok)
        jsd__reply_parse(msg, &rp);
    bool matched = false;
    pthread_mutex_lock(&e->lk);
    uint32_t slot = (uint32_t)(id & SLOT_MASK);
    if (ok && first) {
        /* flow control (empty) or the batch's refusal; never settles it */
        entry *en = slot < e->cap ? &e->entries[slot] : NULL;
        matched = true;
        if (en && en->id == id && en->batch_n > 0 && !en->has_first &&
            (en->state == E_WRITING || en->state == E_INFLIGHT) &&
            (rp.kind == JSD__REPLY_ERROR || rp.kind == JSD__REPLY_NORESP)) {
            en->first = rp;
            en->has_first = true;
        }
    } else if (ok && slot < e->cap && e->entries[slot].id == id &&
               (e->entries[slot].state == E_WRITING || e->entries[slot].state == E_INFLIGHT)) {
        entry *en = &e->entries[slot];
        en->rp = rp;
        en->has_reply = true;
        en->seen_ms = seen;
        matched = true;
        queue_slot(e, slot);
    }
    pthread_mutex_unlock(&e->lk);
    jsd__msg_free(msg);
    if (!matched)
        atomic_fetch_add(&e->late, 1);
}

static void on_sub_complete(void *closure)
{
    jsd__pubengine *e = closure;
    pthread_mutex_lock(&e->lk);
    e->sub_done = true;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->lk);
}

/* "Permissions Violation for Publish to "denied.x"" (quotes as the server and
 * nats.c leave them) -> the subject. */
static bool denied_subject(const char *text, char *out, size_t cap)
{
    static const char key[] = "publish to ";
    const char *p = strcasestr(text, "permissions violation");
    if (!p || !(p = strcasestr(p, key)))
        return false;
    p += sizeof(key) - 1;
    while (*p == '"' || *p == '\'' || *p == ' ')
        p++;
    size_t n = 0;
    while (p[n] && p[n] != '"' && p[n] != '\'' && p[n] != ' ' && n + 1 < cap)
        n++;
    memcpy(out, p, n);
    out[n] = '\0';
    return n > 0;
}

static void on_async_error(natsStatus s, const char *text, void *user)
{
    jsd__pubengine *e = user;
    char subj[JSD_SUBJECT_MAX + 1];
    if (s != NATS_NOT_PERMITTED || !text || !denied_subject(text, subj, sizeof(subj)))
        return;
    pthread_mutex_lock(&e->lk);
    for (uint32_t i = 0; i < e->cap; i++) {
        entry *en = &e->entries[i];
        if ((en->state == E_WRITING || en->state == E_INFLIGHT) && !en->denied &&
            strcmp(en->subject, subj) == 0) {
            en->denied = true;
            if (en->state == E_INFLIGHT)
                queue_slot(e, i);
        }
    }
    pthread_mutex_unlock(&e->lk);
}

/* ---- create / destroy ------------------------------------------------------------- */

jsd_status jsd__pubengine_create(jsd__pubengine **out, jsd_conn *conn, const jsd__pubengine_opts *o,
                                 jsd_error *err)
{
    jsd__pubengine *e = NULL;
    jsd_status st;
    natsStatus s;
    char hex[25], filter[64];

    if (!out)
        return jsd__err(err, JSD_ERR_INVALID, "publication engine: no output handle");
    *out = NULL;
    if (!conn || !o)
        return jsd__err(err, JSD_ERR_INVALID, "publication engine: connection and options needed");
    jsd_status admitted = jsd__admission_check(o->admission, o->deadline_ms, err);
    if (admitted != JSD_OK)
        return admitted;
    natsConnection *nc = jsd__conn_nats(conn);
    if (!nc)
        return jsd__err(err, JSD_ERR_INVALID, "publication engine: the connection is not open");
    int64_t server_max = natsConnection_GetMaxPayload(nc);
    if (server_max <= 0)
        server_max = (int64_t)1024 * 1024;
    if (o->max_payload > (size_t)server_max)
        return jsd__err(err, JSD_ERR_INVALID,
                        "max_payload %zu bytes exceeds the server's max_payload %lld bytes",
                        o->max_payload, (long long)server_max);

    e = jsd__calloc(1, sizeof(*e));
    if (!e)
        return jsd__err(err, JSD_ERR_NOMEM, "publication engine: out of memory");
    e->listener = -1;
    e->conn = conn;
    e->nc = nc;
    e->cap = (size_t)o->admission;
    e->deadline_ms = o->deadline_ms;
    e->server_max = server_max;
    e->max_payload = o->max_payload ? o->max_payload
                                    : (size_t)JSD_MIN((int64_t)JSD_PAYLOAD_DEFAULT_CAP, server_max);
    e->next_expiry = INT64_MAX;
    e->wake_at = 1;
    e->batch_wait_ms = BATCH_WAIT_MS;
    e->swept_epoch = jsd_conn_reconnects(conn);
    pthread_mutex_init(&e->lk, NULL);
    jsd__cond_init_mono(&e->cv);
    e->entries = jsd__calloc(e->cap, sizeof(entry));
    e->free_stack = jsd__calloc(e->cap, sizeof(uint32_t));
    e->ring = jsd__calloc(e->cap, sizeof(uint32_t));
    if (!e->entries || !e->free_stack || !e->ring) {
        st = jsd__err(err, JSD_ERR_NOMEM, "publication engine: out of memory");
        goto fail;
    }
    for (size_t i = 0; i < e->cap; i++)
        e->free_stack[i] = (uint32_t)(e->cap - 1 - i);
    e->n_free = e->cap;
    if (!jsd__random_hex(hex, 12)) {
        st = jsd__err(err, JSD_ERR_INTERNAL, "publication engine: no random bytes for the inbox");
        goto fail;
    }
    jsd__snprintf(e->prefix, sizeof(e->prefix), "_INBOX.%s.", hex);
    e->prefix_len = strlen(e->prefix);
    jsd__snprintf(filter, sizeof(filter), "_INBOX.%s.*", hex);
    s = natsConnection_Subscribe(&e->sub, nc, filter, on_reply, e);
    if (s == NATS_OK)
        s = natsSubscription_SetOnCompleteCB(e->sub, on_sub_complete, e);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(e->sub, 65536, 256 * 1024 * 1024);
    if (s != NATS_OK) {
        st = jsd__err_nats(err, s, 0, "subscribing to the publication reply inbox");
        goto fail;
    }
    e->listener = jsd__conn_add_error_listener(conn, on_async_error, e);
    if (e->listener < 0) {
        st = jsd__err(err, JSD_ERR_INTERNAL,
                      "publication engine: too many listeners on one connection");
        goto fail;
    }
    *out = e;
    return JSD_OK;
fail:
    jsd__pubengine_destroy(e);
    return st;
}

void jsd__pubengine_destroy(jsd__pubengine *e)
{
    if (!e)
        return;
    if (e->listener >= 0)
        jsd__conn_remove_error_listener(e->conn, e->listener);
    bool leak = false;
    if (e->sub) {
        natsSubscription_Unsubscribe(e->sub);
        /* Wait for the message handler to return for good before freeing
         * what it touches. The completion callback runs when the
         * subscription closes (also when the connection closed first). */
        int64_t end = jsd__mono_ms() + 10000;
        pthread_mutex_lock(&e->lk);
        while (!e->sub_done && jsd__mono_ms() < end) {
            jsd__cond_wait_ms(&e->cv, &e->lk, 50);
        }
        leak = !e->sub_done;
        pthread_mutex_unlock(&e->lk);
        natsSubscription_Destroy(e->sub);
        if (leak) {
            /* Freeing could let a late callback write freed memory. */
            JSD_ERROR("pubengine", "reply subscription did not close within 10 s; "
                                   "leaking the engine rather than risk a late callback");
            return;
        }
    }
    jsd__free(e->entries);
    jsd__free(e->free_stack);
    jsd__free(e->ring);
    jsd__msg_scratch_free(&e->scratch);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->lk);
    jsd__free(e);
}

/* ---- submit ------------------------------------------------------------------------ */

static bool msg_id_valid(const char *id, jsd_publish_result *res)
{
    if (!id || !*id) {
        set_reason(res, "message id is empty; a stable id is required");
        return false;
    }
    size_t n = strlen(id);
    if (n > JSD_KEY_MAX) {
        set_reason(res, "message id is %zu bytes; the limit is %d", n, JSD_KEY_MAX);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)id[i];
        if (c < 0x20 || c == 0x7f) {
            set_reason(res, "message id has control byte 0x%02x at byte %zu", c, i);
            return false;
        }
    }
    if (id[0] == ' ' || id[n - 1] == ' ') {
        set_reason(res, "message id has a leading or trailing space (the broker would trim it)");
        return false;
    }
    return true;
}

static size_t hdr_bytes(const char *name, size_t vlen)
{
    return jsd__header_wire_size(strlen(name), vlen);
}

/* Validate everything that can be checked without I/O; fill res (REJECTED)
 * and return false on the first problem. *hdr_total receives the encoded
 * header size. */
static bool validate(const jsd__pubengine *e, const jsd__pub_req *r, size_t extra_hdr,
                     char *lss_buf, size_t lss_cap, jsd_publish_result *res)
{
    jsd_error ve;
    if (!jsd__subject_valid_publish(r->subject, &ve)) {
        set_reason(res, "%s", ve.msg);
        return false;
    }
    if (!jsd__stream_name_valid(r->expected_stream, &ve)) {
        set_reason(res, "expected %s", ve.msg);
        return false;
    }
    if (!msg_id_valid(r->msg_id, res))
        return false;
    if (r->len && !r->payload) {
        set_reason(res, "payload of %zu bytes is NULL", r->len);
        return false;
    }
    if (r->len > e->max_payload) {
        set_reason(res, "payload is %zu bytes; the limit is %zu", r->len, e->max_payload);
        return false;
    }
    if (r->deadline_ms < 0 || r->deadline_ms > JSD_DEADLINE_MAX_MS) {
        set_reason(res, "deadline %d ms is outside (0, %d] ms", r->deadline_ms,
                   JSD_DEADLINE_MAX_MS);
        return false;
    }
    if (r->n_headers && !r->headers) {
        set_reason(res, "%zu headers given as NULL", r->n_headers);
        return false;
    }
    size_t total = JSD__HEADERS_FRAME_BYTES + extra_hdr;
    total += hdr_bytes("Nats-Msg-Id", strlen(r->msg_id));
    total += hdr_bytes("Nats-Expected-Stream", strlen(r->expected_stream));
    if (r->has_expected_last_subject_seq) {
        jsd__snprintf(lss_buf, lss_cap, "%llu", (unsigned long long)r->expected_last_subject_seq);
        total += hdr_bytes("Nats-Expected-Last-Subject-Sequence", strlen(lss_buf));
    }
    for (size_t i = 0; i < r->n_headers; i++) {
        const jsd_header *h = &r->headers[i];
        if (!jsd__header_name_valid(h->name, JSD_HEADERS_MAX_BYTES, "header", &ve)) {
            set_reason(res, "%s", ve.msg);
            return false;
        }
        if (strncasecmp(h->name, "Nats-", 5) == 0) {
            char shown[64];
            jsd__printable(h->name, strlen(h->name), shown, sizeof(shown));
            set_reason(res, "header \"%s\" is reserved: Nats-* headers are set by the publisher",
                       shown);
            return false;
        }
        size_t vlen = h->value ? strlen(h->value) : 0;
        if (!jsd__header_value_valid(h->value, vlen, JSD_HEADERS_MAX_BYTES, "header", &ve)) {
            set_reason(res, "%s", ve.msg);
            return false;
        }
        total += hdr_bytes(h->name, vlen);
    }
    if (total > JSD_HEADERS_MAX_BYTES) {
        set_reason(res, "encoded headers are %zu bytes; the limit is %d", total,
                   JSD_HEADERS_MAX_BYTES);
        return false;
    }
    if ((int64_t)(total + r->len) > e->server_max) {
        set_reason(res, "message is %zu bytes with headers; the server's max_payload is %lld",
                   total + r->len, (long long)e->server_max);
        return false;
    }
    return true;
}

static void refused_write(jsd_publish_result *res, natsStatus s, bool built);
static void reply_subject(const jsd__pubengine *e, char *reply, const char *mark, uint64_t id);
static bool after_write(jsd__pubengine *e, entry *en, uint32_t slot, natsStatus s, bool built,
                        jsd_publish_result *res);

/* Take a free entry (the caller checked there is one) for a publication,
 * or an atomic batch of batch_n (with its id bid), described by r (the
 * batch's first request): E_WRITING, its deadline from now. */
static entry *take_entry(jsd__pubengine *e, const jsd__pub_req *r, void *user, uint64_t epoch,
                         uint32_t batch_n, const char *bid, uint32_t *slot_out)
{
    pthread_mutex_lock(&e->lk);
    uint32_t slot = e->free_stack[--e->n_free];
    atomic_fetch_add(&e->used, 1);
    entry *en = &e->entries[slot];
    en->gen++;
    en->id = (en->gen << SLOT_BITS) | slot;
    en->state = E_WRITING;
    en->denied = en->lost = en->expired = false;
    en->has_reply = false;
    en->has_first = false;
    en->batch_n = batch_n;
    if (bid)
        memcpy(en->batch_id, bid, sizeof(en->batch_id));
    en->user = user;
    en->epoch = epoch;
    en->deadline_ms = r->deadline_ms ? r->deadline_ms : e->deadline_ms;
    en->deadline_mono = jsd__mono_ms() + en->deadline_ms;
    jsd__strlcpy(en->stream, r->expected_stream, sizeof(en->stream));
    jsd__strlcpy(en->subject, r->subject, sizeof(en->subject));
    pthread_mutex_unlock(&e->lk);
    *slot_out = slot;
    return en;
}

bool jsd__pubengine_submit(jsd__pubengine *e, const jsd__pub_req *r, jsd_publish_result *res)
{
    char lss[24], reply[80];
    natsMsg *m = NULL;
    natsStatus s;

    result_init(res, JSD_OUTCOME_REJECTED);
    if (!e || !r) {
        set_reason(res, "no engine or request");
        return false;
    }
    /* 1. admission, before anything else */
    /* only the owner thread takes or frees slots, so this count is exact */
    if (atomic_load(&e->used) >= e->cap) {
        jsd__admission_full(res, e->cap);
        return false;
    }
    /* 2. input and limits */
    if (!validate(e, r, 0, lss, sizeof(lss), res))
        return false;
    /* 3. a connection to write on */
    uint64_t epoch = jsd_conn_reconnects(e->conn);
    if (!jsd_conn_is_connected(e->conn)) {
        res->outcome = JSD_OUTCOME_UNAVAILABLE;
        set_reason(res, "not connected to NATS; nothing was sent");
        return false;
    }

    uint32_t slot = 0;
    entry *en = take_entry(e, r, r->user, epoch, 0, NULL, &slot);
    reply_subject(e, reply, "", en->id); /* en->id is the writer's until the write */
    const jsd_header fixed[] = {{"Nats-Msg-Id", r->msg_id},
                                {"Nats-Expected-Stream", r->expected_stream},
                                {"Nats-Expected-Last-Subject-Sequence", lss}};
    s = jsd__msg_make(&m, r->subject, reply, fixed, r->has_expected_last_subject_seq ? 3 : 2,
                      r->headers, r->n_headers, r->payload, r->len, &e->scratch);
    bool built = s == NATS_OK;
    if (built)
        s = natsConnection_PublishMsg(e->nc, m);
    jsd__msg_free(m); /* written (or not) by now: nats.c keeps no reference */

    return after_write(e, en, slot, s, built, res);
}

/* An entry's write is over (s: nats.c's answer; built: the message was
 * made): in flight, or queued for settlement when a denial came meanwhile;
 * or, refused, its slot released and res filled. true when it counts as
 * written (a reply that arrived proves it was). */
static bool after_write(jsd__pubengine *e, entry *en, uint32_t slot, natsStatus s, bool built,
                        jsd_publish_result *res)
{
    pthread_mutex_lock(&e->lk);
    if (s == NATS_OK) {
        if (en->state == E_WRITING) {
            if (en->denied) {
                queue_slot(e, slot);
            } else {
                en->state = E_INFLIGHT;
                if (en->deadline_mono < e->next_expiry)
                    e->next_expiry = en->deadline_mono;
            }
        }
        pthread_mutex_unlock(&e->lk);
        return true;
    }
    if (en->state != E_WRITING) {
        /* A reply arrived, so it was written after all: poll reports it. */
        pthread_mutex_unlock(&e->lk);
        return true;
    }
    release_slot(e, slot);
    pthread_mutex_unlock(&e->lk);
    refused_write(res, s, built);
    return false;
}

/* The reply subject of entry id: prefix, an optional marker, the decimal id,
 * without printf on the hot path. */
static void reply_subject(const jsd__pubengine *e, char *reply, const char *mark, uint64_t id)
{
    char digits[24];
    size_t nd = 0, k = e->prefix_len, ml = strlen(mark);
    for (uint64_t v = id; nd == 0 || v; v /= 10)
        digits[nd++] = (char)('0' + v % 10);
    memcpy(reply, e->prefix, k);
    memcpy(reply + k, mark, ml);
    k += ml;
    for (size_t i = 0; i < nd; i++)
        reply[k + i] = digits[nd - 1 - i];
    reply[k + nd] = '\0';
}

/* The outcome of a write nats.c refused: nothing was buffered (UNAVAILABLE,
 * REJECTED, RETRYABLE), or something may have been (UNKNOWN). */
static void refused_write(jsd_publish_result *res, natsStatus s, bool built)
{
    res->nats_status = (int)s;
    if (!built) {
        res->outcome = s == NATS_NO_MEMORY ? JSD_OUTCOME_RETRYABLE : JSD_OUTCOME_REJECTED;
        set_reason(res, "cannot build the message: %s; nothing was sent", natsStatus_GetText(s));
    } else if (s == NATS_CONNECTION_CLOSED || s == NATS_INSUFFICIENT_BUFFER ||
               s == NATS_CONNECTION_DISCONNECTED || s == NATS_STALE_CONNECTION) {
        res->outcome = JSD_OUTCOME_UNAVAILABLE;
        set_reason(res, "the connection refused the write (%s); nothing was sent",
                   natsStatus_GetText(s));
    } else if (s == NATS_MAX_PAYLOAD || s == NATS_INVALID_ARG || s == NATS_INVALID_SUBJECT) {
        res->outcome = JSD_OUTCOME_REJECTED;
        set_reason(res, "the client refused the message (%s); nothing was sent",
                   natsStatus_GetText(s));
    } else {
        res->outcome = JSD_OUTCOME_UNKNOWN;
        set_reason(res,
                   "the write failed part-way (%s); the message may be stored: "
                   "retry with the same id",
                   natsStatus_GetText(s));
    }
}

bool jsd__pubengine_submit_batch(jsd__pubengine *e, const jsd__pub_req *reqs, size_t n, void *user,
                                 jsd_publish_result *res, size_t *bad_idx)
{
    char lss[24], reply[96], first_reply[96], seqbuf[16], bid[33];
    result_init(res, JSD_OUTCOME_REJECTED);
    if (bad_idx)
        *bad_idx = SIZE_MAX;
    if (!e || !reqs || n == 0 || n > JSD__BATCH_MAX) {
        set_reason(res, "an atomic batch holds 1..%d publications, not %zu", JSD__BATCH_MAX, n);
        return false;
    }
    if (atomic_load(&e->used) >= e->cap) {
        jsd__admission_full(res, e->cap);
        return false;
    }
    /* Nats-Batch-Id (32 hex), Nats-Batch-Sequence (up to 4 digits) and
     * Nats-Batch-Commit: 1 on top of each publication's own headers */
    size_t extra = hdr_bytes(JSD__HDR_BATCH_ID, 32) + hdr_bytes(JSD__HDR_BATCH_SEQ, 4) +
                   hdr_bytes(JSD__HDR_BATCH_COMMIT, 1);
    for (size_t i = 0; i < n; i++) {
        const jsd__pub_req *r = &reqs[i];
        bool ok = validate(e, r, extra, lss, sizeof(lss), res);
        if (ok && (r->has_expected_last_subject_seq ||
                   strcmp(r->expected_stream, reqs[0].expected_stream) != 0)) {
            set_reason(res, "an atomic batch is for one stream and no expected sequences");
            ok = false;
        }
        if (!ok) {
            if (bad_idx)
                *bad_idx = i;
            return false;
        }
    }
    if (!jsd__random_hex(bid, 16)) {
        res->outcome = JSD_OUTCOME_RETRYABLE;
        set_reason(res, "no random bytes for the batch id; nothing was sent");
        return false;
    }
    uint64_t epoch = jsd_conn_reconnects(e->conn);
    if (!jsd_conn_is_connected(e->conn)) {
        res->outcome = JSD_OUTCOME_UNAVAILABLE;
        set_reason(res, "not connected to NATS; nothing was sent");
        return false;
    }

    uint32_t slot = 0;
    entry *en = take_entry(e, &reqs[0], user, epoch, (uint32_t)n, bid, &slot);
    uint64_t id = en->id;

    reply_subject(e, reply, "", id);
    reply_subject(e, first_reply, "f", id);
    natsStatus s = NATS_OK;
    bool built = true;
    size_t i = 0;
    for (; i < n && s == NATS_OK; i++) {
        const jsd__pub_req *r = &reqs[i];
        natsMsg *m = NULL;
        jsd__snprintf(seqbuf, sizeof(seqbuf), "%zu", i + 1);
        const jsd_header fixed[] = {{"Nats-Msg-Id", r->msg_id},
                                    {"Nats-Expected-Stream", r->expected_stream},
                                    {JSD__HDR_BATCH_ID, bid},
                                    {JSD__HDR_BATCH_SEQ, seqbuf},
                                    {JSD__HDR_BATCH_COMMIT, "1"}};
        bool commit = i + 1 == n;
        /* the first must have a reply subject; those between need none */
        const char *rs = commit ? reply : i == 0 ? first_reply : NULL;
        s = jsd__msg_make(&m, r->subject, rs, fixed, commit ? 5 : 4, r->headers, r->n_headers,
                          r->payload, r->len, &e->scratch);
        built = s == NATS_OK;
        if (built)
            s = natsConnection_PublishMsg(e->nc, m);
        jsd__msg_free(m);
    }

    if (after_write(e, en, slot, s, built, res))
        return true;
    if (i < n && res->outcome == JSD_OUTCOME_UNKNOWN) {
        /* the commit was not written: the server stores nothing of the batch
         * (it drops an uncommitted one after its timeout) */
        res->outcome = JSD_OUTCOME_UNAVAILABLE;
        set_reason(res,
                   "the write of publication %zu of an atomic batch of %zu failed (%s); the "
                   "commit was not sent, so nothing is stored",
                   i, n, natsStatus_GetText(s));
    }
    return false;
}

/* ---- settling ---------------------------------------------------------------------- */

bool jsd__js_err_permanent(int js_err_code)
{
    switch (js_err_code) {
    case 10054: /* JSStreamMessageExceedsMaximumErr */
    case 10097: /* JSStreamHeaderExceedsMaximumErr */
        return true;
    default:
        return false;
    }
}

/* Turn a read reply into an outcome (owner thread). */
static void settle_reply(const entry *en, const jsd__reply *p, jsd_publish_result *res)
{
    result_init(res, JSD_OUTCOME_UNKNOWN);
    switch (p->kind) {
    case JSD__REPLY_NORESP:
        res->outcome = JSD_OUTCOME_FAILED;
        res->nats_status = NATS_NO_RESPONDERS;
        res->status_code = 503;
        set_reason(res, "no stream captures subject \"%s\" (no responders); nothing was stored",
                   en->subject);
        return;
    case JSD__REPLY_STATUS:
        res->status_code = p->code;
        set_reason(res,
                   "the reply carried status %s and no acknowledgement; the message may "
                   "be stored: retry with the same id",
                   p->text);
        return;
    case JSD__REPLY_ERROR:
        res->status_code = p->code;
        res->js_err_code = p->err_code;
        if (p->code >= 400 && p->code < 500) {
            res->outcome = JSD_OUTCOME_FAILED;
            set_reason(res,
                       "the stream refused the message: %s (code %d, err_code %d); nothing "
                       "was stored",
                       p->text, p->code, p->err_code);
        } else {
            set_reason(res,
                       "the stream answered an error: %s (code %d, err_code %d); the "
                       "message may be stored: retry with the same id",
                       p->text, p->code, p->err_code);
        }
        return;
    case JSD__REPLY_ACK: {
        jsd__puback_verdict v = jsd__puback_judge(p->text, p->seq, en->stream);
        if (v == JSD__PUBACK_NO_STREAM || v == JSD__PUBACK_FOREIGN) {
            char shown[64];
            jsd__copy_printable(shown, sizeof(shown), p->text);
            set_reason(res,
                       "foreign acknowledgement naming stream \"%s\", expected \"%s\"; the "
                       "message may be stored: retry with the same id",
                       shown, en->stream);
        } else if (v == JSD__PUBACK_NO_SEQ) {
            set_reason(res,
                       "acknowledgement with sequence %lld; the message may be stored: retry "
                       "with the same id",
                       (long long)p->seq);
        } else if (en->batch_n > 0 &&
                   (p->count != (int64_t)en->batch_n || strcmp(p->batch, en->batch_id) != 0 ||
                    p->seq < (int64_t)en->batch_n)) {
            char shown[64];
            jsd__copy_printable(shown, sizeof(shown), p->batch);
            set_reason(res,
                       "the acknowledgement of atomic batch %s of %u names batch \"%s\" of "
                       "%lld (sequence %lld); the messages may be stored: retry with the same "
                       "ids",
                       en->batch_id, en->batch_n, shown, (long long)p->count, (long long)p->seq);
        } else {
            res->outcome = JSD_OUTCOME_ACCEPTED;
            jsd__strlcpy(res->receipt.stream, p->text, sizeof(res->receipt.stream));
            res->receipt.seq = (uint64_t)p->seq;
            res->receipt.duplicate = p->dup;
            res->receipt.accepted_at_ms = en->seen_ms;
        }
        return;
    }
    default:
        set_reason(res,
                   "malformed acknowledgement (%d bytes, %s); the message may be stored: "
                   "retry with the same id",
                   p->dlen, p->text);
        return;
    }
}

static void settle(const entry *en, jsd_publish_result *res)
{
    if (en->has_first) {
        settle_reply(en, &en->first, res);
        return;
    }
    if (en->has_reply) {
        settle_reply(en, &en->rp, res);
        return;
    }
    result_init(res, JSD_OUTCOME_UNKNOWN);
    if (en->denied) {
        res->outcome = JSD_OUTCOME_DENIED;
        res->nats_status = NATS_NOT_PERMITTED;
        set_reason(res, "the server refused permission to publish to \"%s\"", en->subject);
    } else if (en->lost) {
        res->nats_status = NATS_CONNECTION_DISCONNECTED;
        set_reason(res, "the connection was lost while the publication was in flight; the "
                        "message may be stored: retry with the same id");
    } else {
        res->nats_status = NATS_TIMEOUT;
        set_reason(res,
                   "no acknowledgement within %d ms; the message may be stored: retry with "
                   "the same id",
                   en->deadline_ms);
    }
}

jsd_outcome jsd__pubengine_judge_reply(const void *data, size_t len, const char *status,
                                       const char *expected_stream, jsd_publish_result *res)
{
    entry en; /* only stream, subject and seen_ms are read */
    jsd__reply p;
    memset(&en, 0, sizeof(en));
    jsd__strlcpy(en.stream, expected_stream ? expected_stream : "", sizeof(en.stream));
    jsd__strlcpy(en.subject, "(judged)", sizeof(en.subject));
    jsd__reply_parse_body(data, len > INT32_MAX ? INT32_MAX : (int)len, status, &p);
    settle_reply(&en, &p, res);
    return res->outcome;
}

/* Must hold lk. Queue INFLIGHT entries that expired or lost their
 * connection. */
static void sweep(jsd__pubengine *e, bool conn_bad, uint64_t epoch)
{
    int64_t now = jsd__mono_ms();
    /* A reconnect since the last sweep: entries written before it are lost. */
    if (!conn_bad && now < e->next_expiry && epoch == e->swept_epoch)
        return;
    e->swept_epoch = epoch;
    int64_t next = INT64_MAX;
    for (uint32_t i = 0; i < e->cap; i++) {
        entry *en = &e->entries[i];
        if (en->state != E_INFLIGHT)
            continue;
        if (conn_bad || en->epoch != epoch) {
            en->lost = true;
            queue_slot(e, i);
        } else if (en->deadline_mono <= now) {
            en->expired = true;
            queue_slot(e, i);
        } else if (en->deadline_mono < next) {
            next = en->deadline_mono;
        }
    }
    e->next_expiry = next;
}

size_t jsd__pubengine_poll(jsd__pubengine *e, jsd_publish_done *done, size_t max, int timeout_ms)
{
    enum { BATCH = 64 };
    uint32_t slots[BATCH];
    size_t n = 0;
    if (!e || !done || !max)
        return 0;
    int64_t end = timeout_ms < 0 ? INT64_MAX : jsd__mono_ms() + timeout_ms;
    pthread_mutex_lock(&e->lk);
    for (;;) {
        bool conn_bad = !jsd_conn_is_connected(e->conn);
        sweep(e, conn_bad, jsd_conn_reconnects(e->conn));
        while (n < max && e->ring_len) {
            size_t k = 0;
            while (k < BATCH && n + k < max && e->ring_len) {
                uint32_t slot = e->ring[e->ring_head];
                e->ring_head = (e->ring_head + 1) % e->cap;
                e->ring_len--;
                entry *en = &e->entries[slot];
                en->state = E_TAKEN;
                slots[k++] = slot;
            }
            pthread_mutex_unlock(&e->lk);
            for (size_t i = 0; i < k; i++) {
                entry *en = &e->entries[slots[i]];
                done[n + i].user = en->user;
                settle(en, &done[n + i].result);
            }
            pthread_mutex_lock(&e->lk);
            for (size_t i = 0; i < k; i++)
                release_slot(e, slots[i]);
            n += k;
        }
        if (n > 0)
            break;
        int64_t now = jsd__mono_ms();
        if (now >= end || atomic_load(&e->used) == 0)
            break;
        size_t used = atomic_load(&e->used);
        size_t want = used >= 64 ? JSD_MIN(max, used / 8) : 1;
        int64_t wake = JSD_MIN(
            end, JSD_MIN(e->next_expiry, now + (want > 1 ? e->batch_wait_ms : CONN_CHECK_MS)));
        e->wake_at = want;
        e->waiting = true;
        jsd__cond_wait_until_ms(&e->cv, &e->lk, wake);
        e->waiting = false;
        e->wake_at = 1;
        /* Completions trickling in (a slow, e.g. fsync-bound, broker): wait
         * longer for the next batch, so each wake-up serves more of them. */
        if (want > 1 && e->ring_len < want / 4)
            e->batch_wait_ms = JSD_MIN(e->batch_wait_ms * 2, BATCH_WAIT_MAX);
        else if (e->ring_len >= want)
            e->batch_wait_ms = BATCH_WAIT_MS;
    }
    pthread_mutex_unlock(&e->lk);
    return n;
}

size_t jsd__pubengine_inflight(const jsd__pubengine *e)
{
    return e ? atomic_load(&((jsd__pubengine *)e)->used) : 0;
}

size_t jsd__pubengine_capacity(const jsd__pubengine *e)
{
    return e ? e->cap : 0;
}

size_t jsd__pubengine_max_payload(const jsd__pubengine *e)
{
    return e ? e->max_payload : 0;
}

uint64_t jsd__pubengine_late_replies(const jsd__pubengine *e)
{
    return e ? atomic_load(&((jsd__pubengine *)e)->late) : 0;
}

/* ---- admission ----------------------------------------------------------------------- */

jsd_status jsd__admission_check(int admission, int deadline_ms, jsd_error *err)
{
    if (admission < 1 || admission > JSD_ADMISSION_MAX)
        return jsd__err(err, JSD_ERR_INVALID, "admission %d is outside 1..%d", admission,
                        JSD_ADMISSION_MAX);
    if (deadline_ms <= 0 || deadline_ms > JSD_DEADLINE_MAX_MS)
        return jsd__err(err, JSD_ERR_INVALID, "deadline %d ms is outside (0, %d] ms", deadline_ms,
                        JSD_DEADLINE_MAX_MS);
    return JSD_OK;
}

void jsd__admission_full(jsd_publish_result *res, size_t cap)
{
    res->outcome = JSD_OUTCOME_RETRYABLE;
    set_reason(res, "admission full: %zu publications in flight; try again later", cap);
}
