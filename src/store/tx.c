/*
 * The store's front for the application's transaction: validating and
 * encoding effects, begin/commit/rollback and savepoints, emitting effects
 * (one or a batch, duplicates named), and the inbox and poison records a
 * consumer writes inside its transaction or on its own. Every argument is
 * checked here, so both back ends reject bad input with the same status and
 * the same message; the back end only runs the SQL (backend.h).
 */
#include <string.h>
#include <strings.h>

#include "store/front.h"
#include "subject.h"

static jsd_status front_err(jsd_store *st, jsd_status s, const jsd_error *e)
{
    jsd__err_copy(&st->err, e);
    st->err.status = s;
    return s;
}

/* ---- validation -------------------------------------------------------------------- */

/* Exact subjects: the shared validator of src/subject.c (PUB-1), with the
 * length reported as JSD_ERR_LIMIT like every other limit of an effect. */
jsd_status jsd__store_check_subject(const char *subject, jsd_error *err)
{
    size_t n = subject ? strlen(subject) : 0;
    if (n > JSD_SUBJECT_MAX)
        return jsd__err(err, JSD_ERR_LIMIT, "subject is %zu bytes; the limit is %d", n,
                        JSD_SUBJECT_MAX);
    if (!jsd__subject_valid_publish(subject, err))
        return err ? err->status : JSD_ERR_INVALID;
    return JSD_OK;
}

/* ---- transactions ------------------------------------------------------------------- */

static jsd_status need_tx(jsd_tx *tx, const char *what)
{
    if (!tx || !tx->active)
        return tx ? jsd__store_err(tx->store, JSD_ERR_INVALID, "%s: no transaction is open", what)
                  : JSD_ERR_INVALID;
    return JSD_OK;
}

jsd_status jsd_tx_begin(jsd_tx **out, jsd_store *s)
{
    if (!s || !out)
        return JSD_ERR_INVALID;
    *out = NULL;
    jsd_status rc = jsd__store_need_idle(s, "jsd_tx_begin");
    if (rc != JSD_OK)
        return rc;
    rc = s->ops->tx(s, JSD__TX_BEGIN);
    if (rc != JSD_OK)
        return rc;
    s->tx.active = true;
    s->tx.emitted = false;
    s->tx.savepoint = false;
    s->tx.app_sqlstate[0] = '\0';
    *out = &s->tx;
    return JSD_OK;
}

struct sqlite3 *jsd_tx_sqlite(jsd_tx *tx)
{
    if (!tx || !tx->active || tx->store->backend != JSD_STORE_SQLITE)
        return NULL;
    return jsd__sqlite_handle(tx->store);
}

struct pg_conn *jsd_tx_pg(jsd_tx *tx)
{
    if (!tx || !tx->active || tx->store->backend != JSD_STORE_POSTGRES)
        return NULL;
    return jsd__pg_handle(tx->store);
}

jsd_store *jsd__tx_store(jsd_tx *tx)
{
    return tx ? tx->store : NULL;
}

void jsd_tx_note_sqlstate(jsd_tx *tx, const char *sqlstate)
{
    if (!tx || !tx->active || !sqlstate || !*sqlstate)
        return;
    jsd__strlcpy(tx->app_sqlstate, sqlstate, sizeof(tx->app_sqlstate));
}

const char *jsd__tx_app_sqlstate(const jsd_tx *tx)
{
    return tx ? tx->app_sqlstate : "";
}

void jsd__tx_app_sqlstate_clear(jsd_tx *tx)
{
    if (tx)
        tx->app_sqlstate[0] = '\0';
}

/* Validate one effect and fill row (pointing into e, and into enc for the
 * headers, allocated into *enc). */
static jsd_status prepare_row(jsd_store *s, const jsd_effect *e, int64_t now, jsd__row *row,
                              unsigned char **enc)
{
    jsd_error err;
    jsd_error_clear(&err);
    jsd_status rc;
    *enc = NULL;
    if (!e)
        return jsd__store_err(s, JSD_ERR_INVALID, "effect is NULL");
    if ((rc = jsd__effect_check_ident("id", e->id, true, &err)) != JSD_OK ||
        (rc = jsd__effect_check_ident("owner", e->owner, false, &err)) != JSD_OK ||
        (rc = jsd__effect_check_ident("order_key", e->order_key, false, &err)) != JSD_OK ||
        (rc = jsd__store_check_subject(e->subject, &err)) != JSD_OK)
        return front_err(s, rc, &err);
    if (e->order_key && !*e->order_key)
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "effect order_key is empty: use NULL for an unordered effect");
    if (e->n_headers && !e->headers)
        return jsd__store_err(s, JSD_ERR_INVALID, "effect n_headers is %zu but headers is NULL",
                              e->n_headers);
    /* The application's headers, then the trace context fields as headers of
     * their names (counted like any other). */
    jsd_header all[JSD_HEADERS_MAX];
    /* An empty tracestate is no tracestate (W3C trace context), and is not
     * sent: nats.c receivers cannot read an empty header value. */
    const char *tracestate = e->tracestate && *e->tracestate ? e->tracestate : NULL;
    size_t nh = e->n_headers + (e->traceparent != NULL) + (tracestate != NULL);
    if (nh > JSD_HEADERS_MAX)
        return jsd__store_err(s, JSD_ERR_LIMIT, "effect has %zu headers%s; the limit is %d", nh,
                              nh > e->n_headers ? " with its trace context" : "", JSD_HEADERS_MAX);
    const jsd_header *hdrs = e->headers;
    if (nh > e->n_headers) {
        if (e->n_headers)
            memcpy(all, e->headers, e->n_headers * sizeof(*all));
        size_t k = e->n_headers;
        if (e->traceparent)
            all[k++] = (jsd_header){.name = "traceparent", .value = e->traceparent};
        if (tracestate)
            all[k++] = (jsd_header){.name = "tracestate", .value = tracestate};
        hdrs = all;
    }
    size_t wire = JSD_HEADERS_RESERVED_BYTES;
    for (size_t i = 0; i < nh; i++) {
        if ((rc = jsd__effect_check_header(hdrs[i].name, hdrs[i].value, i, &err)) != JSD_OK)
            return front_err(s, rc, &err);
        for (size_t j = 0; j < i && i >= e->n_headers; j++)
            if (strcasecmp(hdrs[j].name, hdrs[i].name) == 0)
                return jsd__store_err(s, JSD_ERR_INVALID,
                                      "effect gives %s both as a field and as a header",
                                      hdrs[i].name);
        wire += jsd__header_wire_size(strlen(hdrs[i].name), strlen(hdrs[i].value));
    }
    if (wire > JSD_HEADERS_MAX_BYTES)
        return jsd__store_err(s, JSD_ERR_LIMIT,
                              "effect headers are %zu bytes as encoded on the wire; the limit is "
                              "%d (%d of the %d-byte header limit are kept for the relay's own)",
                              wire - JSD_HEADERS_RESERVED_BYTES,
                              JSD_HEADERS_MAX_BYTES - JSD_HEADERS_RESERVED_BYTES,
                              JSD_HEADERS_RESERVED_BYTES, JSD_HEADERS_MAX_BYTES);
    if (e->len && !e->payload)
        return jsd__store_err(s, JSD_ERR_INVALID, "effect len is %zu but payload is NULL", e->len);
    if (e->len > s->payload_max)
        return jsd__store_err(s, JSD_ERR_LIMIT,
                              "effect payload is %zu bytes; the limit is %zu (payload_max)", e->len,
                              s->payload_max);
    if (e->not_before_ms < 0)
        return jsd__store_err(s, JSD_ERR_INVALID, "effect not_before_ms %lld is negative",
                              (long long)e->not_before_ms);
    memset(row, 0, sizeof(*row));
    row->owner = e->owner ? e->owner : "";
    row->effect_id = e->id;
    row->subject = e->subject;
    row->payload = e->len ? e->payload : "";
    row->len = e->len;
    row->order_key = e->order_key;
    row->created_at = now;
    row->not_before = e->not_before_ms ? e->not_before_ms : now;
    if ((rc = jsd_effect_msg_id(s->ns, row->owner, row->effect_id, row->msg_id)) != JSD_OK)
        return jsd__store_err(s, rc, "cannot derive the effect's message id (%s)",
                              jsd_status_str(rc));
    if (nh) {
        row->headers_len = jsd__headers_encoded_size(hdrs, nh);
        *enc = jsd__malloc(row->headers_len);
        if (!*enc)
            return jsd__store_err(s, JSD_ERR_NOMEM, "out of memory encoding headers");
        jsd__headers_encode(hdrs, nh, *enc);
        row->headers = *enc;
    }
    return JSD_OK;
}

/* The index of the first row whose identity repeats an earlier row of the
 * batch, or n. A small open-addressing set of (owner, id) hashes. */
static uint64_t ident_hash(const jsd__row *r)
{
    uint64_t h = 1469598103934665603ULL;
    for (const char *p = r->owner; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    h = (h ^ 0xff) * 1099511628211ULL; /* separator: ("ab","c") != ("a","bc") */
    for (const char *p = r->effect_id; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    return h;
}

static size_t first_repeat(const jsd__row *rows, size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    size_t *slot = jsd__calloc(cap, sizeof(size_t)); /* row index + 1; 0 = empty */
    if (!slot) {
        for (size_t i = 1; i < n; i++) /* no memory: the slow way */
            for (size_t j = 0; j < i; j++)
                if (!strcmp(rows[i].owner, rows[j].owner) &&
                    !strcmp(rows[i].effect_id, rows[j].effect_id))
                    return i;
        return n;
    }
    size_t found = n;
    for (size_t i = 0; i < n && found == n; i++) {
        size_t k = (size_t)ident_hash(&rows[i]) & (cap - 1);
        while (slot[k]) {
            const jsd__row *o = &rows[slot[k] - 1];
            if (!strcmp(o->owner, rows[i].owner) && !strcmp(o->effect_id, rows[i].effect_id)) {
                found = i;
                break;
            }
            k = (k + 1) & (cap - 1);
        }
        if (found == n)
            slot[k] = i + 1;
    }
    jsd__free(slot);
    return found;
}

jsd_status jsd_tx_emit_batch(jsd_tx *tx, const jsd_effect *e, size_t n, size_t *bad_index)
{
    jsd_status rc = need_tx(tx, "jsd_tx_emit");
    if (bad_index)
        *bad_index = 0;
    if (rc != JSD_OK)
        return rc;
    jsd_store *s = tx->store;
    if (n == 0)
        return JSD_OK;
    if (!e)
        return jsd__store_err(s, JSD_ERR_INVALID, "effects array is NULL");
    jsd__row one = {0};
    unsigned char *one_enc = NULL;
    jsd__row *rows = n == 1 ? &one : jsd__calloc(n, sizeof(*rows));
    unsigned char **encs = n == 1 ? &one_enc : jsd__calloc(n, sizeof(*encs));
    if (!rows || !encs) {
        rc = jsd__store_err(s, JSD_ERR_NOMEM, "out of memory emitting %zu effects", n);
        goto done;
    }
    int64_t now = jsd__now_ms();
    for (size_t i = 0; i < n; i++) {
        rc = prepare_row(s, &e[i], now, &rows[i], &encs[i]);
        if (rc != JSD_OK) {
            if (bad_index)
                *bad_index = i;
            if (n > 1) {
                char m[JSD_ERRMSG_MAX];
                jsd__strlcpy(m, s->err.msg, sizeof(m));
                jsd__snprintf(s->err.msg, sizeof(s->err.msg), "effect %zu: %s", i, m);
            }
            goto done;
        }
    }
    size_t dup = 0;
    if (n > 1 && (dup = first_repeat(rows, n)) < n) {
        rc = JSD_ERR_EXISTS;
        if (bad_index)
            *bad_index = dup;
        jsd__store_err(s, rc,
                       "effect (owner \"%.128s\", id \"%.128s\") appears twice in the batch: an "
                       "effect identity is emitted once; no effect of this batch was added",
                       rows[dup].owner, rows[dup].effect_id);
        goto done;
    }
    rc = s->ops->emit(s, rows, n, &dup);
    if (rc == JSD_ERR_EXISTS && dup >= n) {
        char cause[JSD_ERRMSG_MAX];
        char state[sizeof(s->err.sqlstate)];
        jsd__strlcpy(cause, s->err.msg, sizeof(cause));
        memcpy(state, s->err.sqlstate, sizeof(state));
        jsd__store_err(s, JSD_ERR_EXISTS,
                       "an effect of this batch was emitted at the same time by another "
                       "transaction; this transaction is aborted: roll it back (%.300s)",
                       cause);
        memcpy(s->err.sqlstate, state, sizeof(state));
    } else if (rc == JSD_ERR_EXISTS) {
        if (bad_index)
            *bad_index = dup;
        jsd__store_err(s, JSD_ERR_EXISTS,
                       "effect (owner \"%.128s\", id \"%.128s\") already exists: an effect "
                       "identity is emitted once%s",
                       rows[dup].owner, rows[dup].effect_id,
                       n > 1 ? "; no effect of this batch was added" : "");
    } else if (rc == JSD_OK) {
        tx->emitted = true;
    }
done:
    if (encs)
        for (size_t i = 0; i < n; i++)
            jsd__free(encs[i]);
    if (n > 1) {
        jsd__free(rows);
        jsd__free(encs);
    }
    return rc;
}

jsd_status jsd_tx_emit(jsd_tx *tx, const jsd_effect *e)
{
    return jsd_tx_emit_batch(tx, e, 1, NULL);
}

jsd_status jsd_tx_commit(jsd_tx *tx)
{
    jsd_status rc = need_tx(tx, "jsd_tx_commit");
    if (rc != JSD_OK)
        return rc;
    jsd_store *s = tx->store;
    JSD_CRASH_POINT("store.before_commit");
    rc = s->ops->tx(s, tx->emitted ? JSD__TX_COMMIT_NOTIFY : JSD__TX_COMMIT);
    if (rc != JSD_OK) {
        jsd_error keep = s->err;
        s->ops->tx(s, JSD__TX_ROLLBACK);
        s->err = keep;
    }
    tx->active = false;
    return rc;
}

void jsd_tx_rollback(jsd_tx *tx)
{
    if (!tx || !tx->active)
        return;
    jsd_error keep = tx->store->err;
    tx->store->ops->tx(tx->store, JSD__TX_ROLLBACK);
    tx->store->err = keep;
    tx->active = false;
}

/* One savepoint operation: SAVEPOINT needs none open, RELEASE and ROLLBACK TO
 * need one; on success the transaction notes whether one is open now. */
static jsd_status savepoint_step(jsd_tx *tx, const char *fn, jsd__txop op, bool needs_open)
{
    jsd_status rc = need_tx(tx, fn);
    if (rc != JSD_OK)
        return rc;
    if (tx->savepoint != needs_open)
        return jsd__store_err(tx->store, JSD_ERR_INVALID,
                              needs_open ? "no savepoint is open" : "a savepoint is already open");
    rc = tx->store->ops->tx(tx->store, op);
    if (rc == JSD_OK)
        tx->savepoint = !needs_open;
    return rc;
}

jsd_status jsd__tx_savepoint(jsd_tx *tx)
{
    return savepoint_step(tx, "jsd__tx_savepoint", JSD__TX_SAVEPOINT, false);
}

jsd_status jsd__tx_release(jsd_tx *tx)
{
    return savepoint_step(tx, "jsd__tx_release", JSD__TX_RELEASE, true);
}

jsd_status jsd__tx_rollback_to(jsd_tx *tx)
{
    return savepoint_step(tx, "jsd__tx_rollback_to", JSD__TX_ROLLBACK_TO, true);
}

/* ---- inbox ---------------------------------------------------------------------------- */

static jsd_status check_delivery(jsd_store *s, const char *stream, const char *consumer,
                                 uint64_t seq)
{
    if (!stream || !*stream || strlen(stream) > JSD_IDENT_MAX || !consumer || !*consumer ||
        strlen(consumer) > JSD_IDENT_MAX)
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "delivery identity needs a stream and a consumer of 1..256 bytes");
    if (seq == 0 || seq > (uint64_t)INT64_MAX)
        return jsd__store_err(s, JSD_ERR_INVALID, "delivery stream sequence %llu is out of range",
                              (unsigned long long)seq);
    if (!jsd__effect_text_ok(stream, strlen(stream)) ||
        !jsd__effect_text_ok(consumer, strlen(consumer)))
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "delivery stream or consumer is not printable UTF-8");
    return JSD_OK;
}

bool jsd__store_text_ok(const char *s, size_t max)
{
    size_t n = s ? strlen(s) : 0;
    return n <= max && jsd__effect_text_ok(s ? s : "", n);
}

static jsd_status check_msg_id(jsd_store *s, const char *msg_id)
{
    if (msg_id && !jsd__store_text_ok(msg_id, JSD_IDENT_MAX))
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "message id is over 256 bytes or not printable UTF-8");
    return JSD_OK;
}

jsd_status jsd__tx_inbox_lookup(jsd_tx *tx, const char *stream, const char *consumer,
                                uint64_t stream_seq, bool *found, jsd__inbox_outcome *out)
{
    jsd_status rc = need_tx(tx, "inbox lookup");
    if (found)
        *found = false;
    if (rc != JSD_OK || !found)
        return rc != JSD_OK ? rc : JSD_ERR_INVALID;
    if ((rc = check_delivery(tx->store, stream, consumer, stream_seq)) != JSD_OK)
        return rc;
    return tx->store->ops->inbox_lookup(tx->store, stream, consumer, stream_seq, NULL, found, out);
}

jsd_status jsd__tx_inbox_lookup_msg_id(jsd_tx *tx, const char *stream, const char *consumer,
                                       const char *msg_id, bool *found, jsd__inbox_outcome *out)
{
    jsd_status rc = need_tx(tx, "inbox lookup");
    if (found)
        *found = false;
    if (rc != JSD_OK || !found)
        return rc != JSD_OK ? rc : JSD_ERR_INVALID;
    if ((rc = check_delivery(tx->store, stream, consumer, 1)) != JSD_OK ||
        (rc = check_msg_id(tx->store, msg_id)) != JSD_OK)
        return rc;
    if (!msg_id || !*msg_id)
        return jsd__store_err(tx->store, JSD_ERR_INVALID, "inbox lookup: message id is empty");
    return tx->store->ops->inbox_lookup(tx->store, stream, consumer, 0, msg_id, found, out);
}

/* A trace context value as the inbox keeps it: cut to cap bytes (the
 * consumer hands over what came; the emit side checked what it sent). */
static const char *trace_cut(const char *v, size_t cap, char *buf)
{
    if (!v || strlen(v) <= cap)
        return v;
    memcpy(buf, v, cap);
    buf[cap] = '\0';
    return buf;
}

jsd_status jsd__tx_inbox_insert(jsd_tx *tx, const char *stream, const char *consumer,
                                uint64_t stream_seq, const char *msg_id, int outcome_code,
                                const char *detail, const jsd__trace *trace)
{
    jsd_status rc = need_tx(tx, "inbox insert");
    if (rc != JSD_OK)
        return rc;
    jsd_store *s = tx->store;
    if ((rc = check_delivery(s, stream, consumer, stream_seq)) != JSD_OK ||
        (rc = check_msg_id(s, msg_id)) != JSD_OK)
        return rc;
    char cut[JSD__ERROR_TEXT_MAX + 1];
    if (detail) {
        jsd__strlcpy(cut, detail, sizeof(cut));
        detail = cut;
    }
    char tp[JSD_HEADER_VALUE_MAX + 1], ts[JSD_TRACESTATE_MAX + 1];
    jsd__trace t = {0};
    if (trace) {
        t.parent = trace_cut(trace->parent, JSD_HEADER_VALUE_MAX, tp);
        t.state = trace_cut(trace->state, JSD_TRACESTATE_MAX, ts);
    }
    rc = s->ops->inbox_insert(s, stream, consumer, stream_seq, msg_id && *msg_id ? msg_id : NULL,
                              outcome_code, detail, &t, jsd__now_ms());
    if (rc == JSD_ERR_EXISTS)
        jsd__store_err(s, JSD_ERR_EXISTS,
                       "delivery (stream \"%.64s\", consumer \"%.64s\", sequence %llu) is already "
                       "in the inbox",
                       stream, consumer, (unsigned long long)stream_seq);
    return rc;
}

jsd_status jsd__tx_inbox_retire(jsd_tx *tx, const char *stream, const char *consumer,
                                uint64_t stream_seq)
{
    jsd_status rc = need_tx(tx, "inbox retire");
    if (rc != JSD_OK)
        return rc;
    if ((rc = check_delivery(tx->store, stream, consumer, stream_seq)) != JSD_OK)
        return rc;
    bool moved = false;
    rc = tx->store->ops->inbox_retire(tx->store, stream, consumer, stream_seq, &moved);
    if (rc == JSD_OK && !moved)
        return jsd__store_err(tx->store, JSD_ERR_NOT_FOUND,
                              "inbox retire: no row for %s/%s sequence %llu", stream, consumer,
                              (unsigned long long)stream_seq);
    return rc;
}

jsd_status jsd__tx_inbox_insert_many(jsd_tx *tx, const char *stream, const char *consumer,
                                     const uint64_t *seqs, const char *const *msg_ids,
                                     const jsd__trace *traces, size_t n, int outcome_code,
                                     bool *inserted)
{
    jsd_status rc = need_tx(tx, "inbox insert");
    if (rc != JSD_OK)
        return rc;
    jsd_store *s = tx->store;
    if (n == 0)
        return JSD_OK;
    if (!seqs || !msg_ids || !inserted)
        return jsd__store_err(s, JSD_ERR_INVALID, "inbox insert: a batch array is NULL");
    for (size_t i = 0; i < n; i++) {
        inserted[i] = false;
        if ((rc = check_delivery(s, stream, consumer, seqs[i])) != JSD_OK ||
            (rc = check_msg_id(s, msg_ids[i])) != JSD_OK)
            return rc;
        if (traces && ((traces[i].parent && strlen(traces[i].parent) > JSD_HEADER_VALUE_MAX) ||
                       (traces[i].state && strlen(traces[i].state) > JSD_TRACESTATE_MAX)))
            return jsd__store_err(s, JSD_ERR_LIMIT,
                                  "inbox insert: a trace context over its header limit");
    }
    return s->ops->inbox_insert_many(s, stream, consumer, seqs, msg_ids, traces, n, outcome_code,
                                     jsd__now_ms(), inserted);
}

/* ---- poison ---------------------------------------------------------------------------- */

static jsd_status check_poison(jsd_store *s, const jsd__poison *p)
{
    if (!p)
        return jsd__store_err(s, JSD_ERR_INVALID, "poison record is NULL");
    jsd_status rc = check_delivery(s, p->stream, p->consumer, p->stream_seq);
    if (rc != JSD_OK || (rc = check_msg_id(s, p->msg_id)) != JSD_OK)
        return rc;
    if (!p->subject || strlen(p->subject) > 1024 ||
        !jsd__effect_text_ok(p->subject, strlen(p->subject)))
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "poison record subject is missing, over 1024 bytes or unprintable");
    if ((p->len && !p->payload) || (p->headers_len && !p->headers))
        return jsd__store_err(s, JSD_ERR_INVALID, "poison record bytes are NULL with a length");
    return JSD_OK;
}

static jsd_status poison_insert(jsd_store *s, const jsd__poison *p, bool *inserted)
{
    jsd__poison c = *p;
    char diag[JSD__ERROR_TEXT_MAX + 1];
    jsd__strlcpy(diag, p->diagnostic ? p->diagnostic : "", sizeof(diag));
    c.diagnostic = diag;
    bool ins = false;
    jsd_status rc =
        s->ops->poison_insert(s, &c, p->created_at_ms ? p->created_at_ms : jsd__now_ms(), &ins);
    if (inserted)
        *inserted = ins;
    return rc;
}

jsd_status jsd__tx_poison_insert(jsd_tx *tx, const jsd__poison *p, bool *inserted)
{
    if (inserted)
        *inserted = false;
    jsd_status rc = need_tx(tx, "poison insert");
    if (rc != JSD_OK || (rc = check_poison(tx->store, p)) != JSD_OK)
        return rc;
    return poison_insert(tx->store, p, inserted);
}

jsd_status jsd__store_poison_insert(jsd_store *s, const jsd__poison *p, bool *inserted)
{
    if (inserted)
        *inserted = false;
    if (!s)
        return JSD_ERR_INVALID;
    jsd_tx *tx;
    jsd_status rc = check_poison(s, p);
    if (rc != JSD_OK || (rc = jsd_tx_begin(&tx, s)) != JSD_OK)
        return rc;
    rc = poison_insert(s, p, inserted);
    if (rc != JSD_OK) {
        jsd_tx_rollback(tx);
        return rc;
    }
    return jsd_tx_commit(tx);
}

jsd_status jsd__store_poison_mark_published(jsd_store *s, const char *stream, const char *consumer,
                                            uint64_t stream_seq, const char *dlq_stream,
                                            uint64_t dlq_seq)
{
    if (!s)
        return JSD_ERR_INVALID;
    jsd_status rc = jsd__store_need_idle(s, "poison mark");
    if (rc != JSD_OK || (rc = check_delivery(s, stream, consumer, stream_seq)) != JSD_OK)
        return rc;
    if (!dlq_stream || !*dlq_stream || strlen(dlq_stream) > 256 || dlq_seq > (uint64_t)INT64_MAX)
        return jsd__store_err(s, JSD_ERR_INVALID, "dead-letter stream or sequence is not valid");
    return s->ops->poison_mark(s, stream, consumer, stream_seq, dlq_stream, dlq_seq);
}

jsd_status jsd__store_poison_get(jsd_store *s, const char *stream, const char *consumer,
                                 uint64_t stream_seq, jsd__poison_record *out)
{
    if (!s || !out)
        return JSD_ERR_INVALID;
    memset(out, 0, sizeof(*out));
    jsd_status rc = jsd__store_need_idle(s, "poison get");
    if (rc != JSD_OK || (rc = check_delivery(s, stream, consumer, stream_seq)) != JSD_OK)
        return rc;
    jsd__poison_record *recs = NULL;
    size_t n = 0;
    rc = s->ops->poison_read(s, stream, consumer, stream_seq, 0, 1, &recs, &n);
    if (rc != JSD_OK)
        return rc;
    if (n == 0) {
        jsd__free(recs);
        return jsd__store_err(s, JSD_ERR_NOT_FOUND,
                              "no poison record for stream \"%.64s\" consumer \"%.64s\" "
                              "sequence %llu",
                              stream, consumer, (unsigned long long)stream_seq);
    }
    *out = recs[0];
    jsd__free(recs);
    return JSD_OK;
}

jsd_status jsd__store_poison_list(jsd_store *s, int64_t after_id, size_t max,
                                  jsd__poison_record **out, size_t *n)
{
    if (!s || !out || !n)
        return JSD_ERR_INVALID;
    *out = NULL;
    *n = 0;
    jsd_status rc = jsd__store_need_idle(s, "poison list");
    if (rc != JSD_OK)
        return rc;
    if (max == 0 || max > 100000)
        return jsd__store_err(s, JSD_ERR_INVALID, "poison list: max %zu is outside 1..100000", max);
    return s->ops->poison_read(s, NULL, NULL, 0, after_id, max, out, n);
}

jsd_status jsd__store_poison_unpublished(jsd_store *s, const char *stream, const char *consumer,
                                         int64_t after_id, size_t max, jsd__poison_record **out,
                                         size_t *n)
{
    if (!s || !stream || !consumer || !out || !n)
        return JSD_ERR_INVALID;
    *out = NULL;
    *n = 0;
    jsd_status rc = jsd__store_need_idle(s, "unpublished poison records");
    if (rc != JSD_OK)
        return rc;
    if (max == 0 || max > 100000)
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "unpublished poison records: max %zu is outside 1..100000", max);
    return s->ops->poison_read(s, stream, consumer, 0, after_id, max, out, n);
}
