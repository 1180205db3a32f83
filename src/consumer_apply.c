/*
 * consumer_apply — the apply step: the batch in hand is applied in one store
 * transaction (a fast pass with one inbox statement for the whole batch, and
 * when anything in it is unusual a careful pass with a savepoint per
 * handler), each delivery decided as the DESIGN block in consumer.c says:
 * answered from the inbox, parked past the threshold, poison on a bad
 * envelope, or the handler's disposition; the poison records are written in
 * the same transaction. A store outage holds the batch (kept alive, retried
 * with a backoff) instead of failing it, and so does contention met by the
 * handler's own statements (a serialization failure or deadlock applies it
 * again at once first; DESIGN "handler contention" below); a commit that
 * fails otherwise NAKs it.
 *
 * DESIGN (the fast pass). Most batches are all fresh deliveries whose
 * handlers commit; for them the fast pass costs one inbox statement per
 * batch and the handlers' own work, with no savepoint:
 *   1. in C, no store call: every delivery below the park threshold, its
 *      envelope accepted, within the limits (below); no two deliveries of
 *      the batch with one stream seq or one Nats-Msg-Id (the statement below
 *      does not see its own rows, so such a pair must be decided one after
 *      the other);
 *   2. one INSERT of the batch's inbox rows (outcome COMMIT): on PostgreSQL
 *      INSERT ... SELECT FROM unnest(seqs, msg ids) WHERE NOT EXISTS (a row
 *      of this stream/durable with that msg id) ON CONFLICT (stream,
 *      durable, seq) DO NOTHING RETURNING stream_seq, one round trip; on
 *      SQLite the same test per row, one prepared statement execution each;
 *   3. the handler: a batch handler once with every delivery, a per-delivery
 *      handler for each in turn.
 * Any check of 1 failing, any row of 2 not inserted (seen by seq: a
 * redelivery; by msg id: a re-published duplicate), any disposition of 3
 * not COMMIT, sends the batch to the careful pass: the transaction is rolled
 * back whole (its inbox rows and handler work with it) and apply_one decides
 * each delivery with today's lookups and a savepoint per handler. The answer
 * of a per-delivery handler that failed in the fast pass, or of a batch
 * handler given a batch of one, is reused there (the handler is not called
 * again for it); a batch handler's answers for a larger batch are not (one
 * failing row may have failed the whole statement), so the careful pass asks
 * it again, one delivery at a time. A handler's store outage or contention
 * (its native handle broken, a new SQLite error code, a SQLSTATE it
 * recorded) returns at once, as before. Why it is safe: the fast pass decides nothing the careful
 * pass would decide differently (it commits only deliveries with no inbox row by seq or msg id,
 * within the threshold, with good envelopes, whose handlers committed), and it decides it inside
 * the same transaction, so nothing is ACKed before the COMMIT and a crash anywhere before it leaves
 * no trace.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>
#include <sqlite3.h>

#include "conn_int.h"
#include "consumer_int.h"
#include "store/store.h"

/* ---- the last error of a delivery, for its death envelope ------------------------- */

static void lasterr_put(jsd_consumer *c, uint64_t seq, const char *text)
{
    size_t k = (size_t)(seq % LASTERR_SLOTS);
    c->lasterr[k].seq = seq;
    jsd__strlcpy(c->lasterr[k].text, text ? text : "", sizeof(c->lasterr[k].text));
}

static const char *lasterr_get(jsd_consumer *c, uint64_t seq)
{
    size_t k = (size_t)(seq % LASTERR_SLOTS);
    return c->lasterr[k].seq == seq && c->lasterr[k].text[0] ? c->lasterr[k].text : NULL;
}

/* ---- limits ----------------------------------------------------------------------- */

/*
 * What the store keeps of a delivery must meet the project's limits
 * (include/jsdurable/store.h), whoever published it. The relay's messages
 * always do; a foreign publisher's may not: nats-server takes a Nats-Msg-Id
 * of 2000 bytes, or one with a control byte. Such a delivery is poison on
 * its own, on first sight, like a bad envelope, decided in C before any store
 * call:
 *   - its Nats-Msg-Id (the inbox's identity): at most JSD_IDENT_MAX bytes of
 *     valid UTF-8 without control characters (jsd__store_text_ok);
 *   - its traceparent / tracestate (kept in the inbox row): at most
 *     JSD_HEADER_VALUE_MAX / JSD_TRACESTATE_MAX bytes, the same text rule.
 * Its inbox row (POISON) then carries the delivery's key ("@<seq>.<time>",
 * jsd__inbox_id), not the id: an id outside the rules is no identity a
 * later message could be a duplicate of. Its poison record and
 * death envelope carry the id's safe rendering (jsd__msg_id_kept), and the
 * record keeps its header bytes verbatim. Before this rule the store refused
 * the delivery's inbox row or poison record, which failed the transaction of
 * its batch: a control byte in an id or an over-long trace header NAKed the
 * whole batch at every delivery until max_deliver, a 300-byte id failed its
 * park; nothing applied or no evidence kept (issue 42).
 */
static bool within_limits(const jsd_delivery *d, char *why, size_t cap)
{
    char shown[64];
    if (d->msg_id && !jsd__store_text_ok(d->msg_id, JSD_IDENT_MAX)) {
        size_t n = strlen(d->msg_id);
        jsd__printable(d->msg_id, n, shown, sizeof(shown));
        if (n > JSD_IDENT_MAX)
            jsd__snprintf(why, cap, "Nats-Msg-Id is %zu bytes; the limit is %d: \"%s\"", n,
                          JSD_IDENT_MAX, shown);
        else
            jsd__snprintf(why, cap,
                          "Nats-Msg-Id has a byte outside printable UTF-8 (a control byte or "
                          "invalid UTF-8): \"%s\"",
                          shown);
        return false;
    }
    static const struct {
        const char *name;
        size_t max;
    } kept[] = {{"traceparent", JSD_HEADER_VALUE_MAX}, {"tracestate", JSD_TRACESTATE_MAX}};
    for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++) {
        const char *v = jsd_delivery_header(d, kept[i].name);
        if (!v || jsd__store_text_ok(v, kept[i].max))
            continue;
        size_t n = strlen(v);
        if (n > kept[i].max)
            jsd__snprintf(why, cap, "%s is %zu bytes; the limit is %zu", kept[i].name, n,
                          kept[i].max);
        else
            jsd__snprintf(why, cap, "%s has a byte outside printable UTF-8", kept[i].name);
        return false;
    }
    return true;
}

/* The safe rendering of an id that breaks the rule (documented in
 * docs/CONSUMER.md): every byte outside 0x21..0x7e, and the backslash,
 * written as \xNN (lower-case hex), so it is printable ASCII without spaces
 * and tells the bytes apart; when that is longer than JSD_IDENT_MAX bytes,
 * the rendering of the first bytes that fit with "..." after them. So the 6
 * bytes "bad", 0x01, "id" are kept as the 9 characters bad\x01id, and a
 * 300-byte id of letters as its first 253 bytes and "...". The verbatim
 * bytes stay in the poison record's headers. */
static bool id_byte_plain(unsigned char b)
{
    return b >= 0x21 && b <= 0x7e && b != '\\';
}

const char *jsd__msg_id_kept(const char *id, char out[JSD_IDENT_MAX + 1])
{
    if (!id || !*id)
        return NULL;
    if (jsd__store_text_ok(id, JSD_IDENT_MAX))
        return id;
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)id;
    size_t whole = 0, room = JSD_IDENT_MAX, j = 0;
    for (size_t i = 0; p[i]; i++)
        whole += id_byte_plain(p[i]) ? 1 : 4;
    if (whole > room)
        room -= 3; /* for "..." */
    for (; *p && j + (id_byte_plain(*p) ? 1 : 4) <= room; p++) {
        if (id_byte_plain(*p)) {
            out[j++] = (char)*p;
            continue;
        }
        out[j++] = '\\';
        out[j++] = 'x';
        out[j++] = hex[*p >> 4];
        out[j++] = hex[*p & 0xf];
    }
    if (*p) {
        memcpy(out + j, "...", 3);
        j += 3;
    }
    out[j] = '\0';
    return out;
}

/* ---- one batch -------------------------------------------------------------------- */

/* Reconstruct the header block ("NATS/1.0\r\nName: value\r\n...\r\n") for the
 * poison record; nats.c does not expose the raw bytes. */
static char *header_block(natsMsg *m, size_t *len)
{
    const char **keys = NULL;
    int nk = 0;
    *len = 0;
    if (natsMsgHeader_Keys(m, &keys, &nk) != NATS_OK || nk == 0) {
        free((void *)keys);
        return NULL;
    }
    size_t cap = 12, used = 0;
    char *buf = NULL;
    for (int i = 0; i < nk; i++) {
        const char **vals = NULL;
        int nv = 0;
        if (natsMsgHeader_Values(m, keys[i], &vals, &nv) != NATS_OK)
            continue;
        for (int k = 0; k < nv; k++)
            cap += strlen(keys[i]) + strlen(vals[k]) + 4;
        free((void *)vals);
    }
    cap += 3;
    if (!(buf = jsd__malloc(cap)))
        goto out;
    used = (size_t)snprintf(buf, cap, "NATS/1.0\r\n");
    for (int i = 0; i < nk; i++) {
        const char **vals = NULL;
        int nv = 0;
        if (natsMsgHeader_Values(m, keys[i], &vals, &nv) != NATS_OK)
            continue;
        for (int k = 0; k < nv && used < cap; k++)
            used += (size_t)snprintf(buf + used, cap - used, "%s: %s\r\n", keys[i], vals[k]);
        free((void *)vals);
    }
    if (used < cap)
        used += (size_t)snprintf(buf + used, cap - used, "\r\n");
    *len = JSD_MIN(used, cap - 1);
out:
    free((void *)keys);
    return buf;
}

/* The delivery's W3C trace context, for its inbox row. */
static jsd__trace trace_of(const jsd_delivery *d)
{
    return (jsd__trace){.parent = jsd_delivery_header(d, "traceparent"),
                        .state = jsd_delivery_header(d, "tracestate")};
}

static jsd_status record_dead(jsd_consumer *c, jsd_tx *tx, jsd_delivery *d, int code)
{
    size_t hlen = 0;
    char *hdr = header_block(d->msg, &hlen);
    char shown[JSD_IDENT_MAX + 1];
    const char *kept = jsd__msg_id_kept(d->msg_id, shown);
    jsd__poison p = {
        .stream = c->stream,
        .consumer = c->durable,
        .stream_seq = d->seq,
        .msg_id = kept,
        .subject = d->subject,
        .diagnostic = d->reason,
        .headers = hdr,
        .headers_len = hlen,
        .payload = natsMsg_GetData(d->msg),
        .len = (size_t)natsMsg_GetDataLength(d->msg),
    };
    jsd_status st = jsd__tx_poison_insert(tx, &p, NULL);
    jsd__free(hdr);
    /* An id outside the limits is kept as its rendering, never as an
     * identity: its inbox row has the delivery's key (jsd__inbox_id). */
    if (st == JSD_OK)
        st = jsd__tx_inbox_insert(tx, c->stream, c->durable, d->seq, jsd__inbox_id(d), code,
                                  d->reason, &(jsd__trace){0});
    if (st == JSD_OK) {
        d->state = code == OUT_POISON ? D_POISON : D_PARK;
        d->fresh = true;
    } else if (st == JSD_ERR_EXISTS) {
        /* Another process recorded this delivery meanwhile: its outcome stands. */
        jsd__inbox_outcome prev;
        bool found = false;
        st = jsd__tx_inbox_lookup(tx, c->stream, c->durable, d->seq, &found, &prev);
        if (st == JSD_OK && found) {
            d->dup = true;
            jsd__strlcpy(d->reason, prev.detail, sizeof(d->reason));
            d->state = prev.code == OUT_POISON ? D_POISON : prev.code == OUT_PARK ? D_PARK : D_ACK;
        } else if (st == JSD_OK) {
            st = JSD_ERR_INTERNAL;
        }
    }
    return st;
}

/* DESIGN (handler contention). A handler that does not commit may have
 * failed because of the store, not because of its message: the store is
 * gone, or its statements lost a race with another session (issue 42, item
 * 4: a `consume --sql` whose sink table another session held locked spent
 * every delivery on "lock timeout" and parked 20 messages). Such a failure
 * spends no delivery attempt, as the library's own statements' do not:
 *   - 40001 (serialization failure), 40P01 (deadlock): the transaction lost
 *     a race that running it again wins; the batch is rolled back and
 *     applied again at once (RETRY_AT_ONCE times, then held as below);
 *   - 55P03 (lock not available, lock_timeout), 57014 (statement timeout,
 *     query canceled), SQLite BUSY/LOCKED, and a lost connection (08xxx,
 *     57P01..03, PQstatus bad): the batch is held, as through a store
 *     outage (kept alive with +WPI, applied again with a backoff), and past
 *     hold_alert_ms the consumer says so (error log, stats, gauge, /readyz).
 * Each is logged at warn and counted by kind
 * (jsd_consumer_handler_contention_total).
 * How the consumer learns the cause: the native handle's state after the
 * call. On SQLite the connection's error code (sqlite3_errcode), compared
 * with the one before the call so that an old code is not taken for a new
 * failure. On PostgreSQL a lost connection shows in PQstatus, but the
 * SQLSTATE of a failed statement is only in its PGresult, which only
 * whoever ran the statement holds (an aborted transaction, PQTRANS_INERROR,
 * says that a statement failed, not why). So the handler records it in the
 * transaction with jsd_tx_note_sqlstate (`consume --sql` does for each of
 * its statements), cleared before each handler call; a handler that does
 * not record it keeps its failures its own, as before. Rejected: reading
 * the SQLSTATE out of the disposition's reason (free text, any wording), and
 * PQsetErrorVerbosity on the handler's connection (it changes the
 * application's own messages). */
const char *const jsd__contention_kinds[CONT__COUNT] = {
    "serialization", "deadlock", "lock_timeout", "statement_timeout",
    "connection",    "busy",     "locked"};

#define RETRY_AT_ONCE 3

static int sqlite_code(jsd_tx *tx)
{
    sqlite3 *db = jsd_tx_sqlite(tx);
    return db ? sqlite3_errcode(db) : SQLITE_OK;
}

/* The handler's call is about to be made: forget an earlier failure's code. */
int jsd__handler_before(jsd_tx *tx)
{
    jsd__tx_app_sqlstate_clear(tx);
    return sqlite_code(tx);
}

/* Record one contention failure: its kind and cause, counted. */
static jsd_status contention(jsd_consumer *c, int kind, jsd_status st, const char *code,
                             const char *reason)
{
    c->cont_kind = kind;
    jsd__snprintf(c->cont_why, sizeof(c->cont_why), "handler contention, %s (%s): %s",
                  jsd__contention_kinds[kind], code,
                  reason && *reason ? reason : "no reason given");
    STAT_ADD(c, contention, 1);
    jsd_counter_inc(c->m_contention[kind]);
    return st;
}

/* A failure of the handler's own SQL that is the store's (see DESIGN):
 * its status (an outage status: the batch is retried or held), or JSD_OK
 * when the failure is the handler's own. reason is the handler's. */
jsd_status jsd__handler_saw_outage(jsd_consumer *c, jsd_tx *tx, int sqlite_before,
                                   const char *reason)
{
    PGconn *pg = jsd_tx_pg(tx);
    if (pg) {
        const char *ss = jsd__tx_app_sqlstate(tx);
        char code[24];
        jsd__snprintf(code, sizeof(code), "SQLSTATE %s", *ss ? ss : "none");
        if (PQstatus(pg) == CONNECTION_BAD || !strncmp(ss, "08", 2) || !strcmp(ss, "57P01") ||
            !strcmp(ss, "57P02") || !strcmp(ss, "57P03"))
            return contention(c, CONT_CONNECTION, JSD_ERR_CONNECT, *ss ? code : "connection lost",
                              reason);
        if (!strcmp(ss, "40001"))
            return contention(c, CONT_SERIALIZATION, JSD_ERR_BUSY, code, reason);
        if (!strcmp(ss, "40P01"))
            return contention(c, CONT_DEADLOCK, JSD_ERR_BUSY, code, reason);
        if (!strcmp(ss, "55P03"))
            return contention(c, CONT_LOCK_TIMEOUT, JSD_ERR_BUSY, code, reason);
        if (!strcmp(ss, "57014"))
            return contention(c, CONT_STMT_TIMEOUT, JSD_ERR_TIMEOUT, code, reason);
        return JSD_OK;
    }
    if (jsd_store_backend_of(jsd__tx_store(tx)) == JSD_STORE_POSTGRES)
        return JSD_ERR_CONNECT; /* the transaction's BEGIN, sent now, failed */
    int now = sqlite_code(tx);
    if (now == sqlite_before)
        return JSD_OK;
    switch (now & 0xff) {
    case SQLITE_FULL:
        return JSD_ERR_FULL;
    case SQLITE_IOERR:
        return JSD_ERR_IO;
    case SQLITE_READONLY:
        return JSD_ERR_READONLY;
    case SQLITE_BUSY:
        return contention(c, CONT_BUSY, JSD_ERR_BUSY, "SQLITE_BUSY", reason);
    case SQLITE_LOCKED:
        return contention(c, CONT_LOCKED, JSD_ERR_BUSY, "SQLITE_LOCKED", reason);
    default:
        return JSD_OK;
    }
}

/* The batch in hand is settled only after its COMMIT: when applying it takes
 * a third of ack_wait, tell the server every delivery in it is still being
 * worked on (+WPI), so none is redelivered meanwhile. */
static void keep_alive(jsd_consumer *c, int64_t *last_ms)
{
    if (jsd__mono_ms() - *last_ms < c->keepalive_ms)
        return;
    for (size_t i = 0; i < c->nd; i++)
        natsMsg_InProgress(c->d[i].msg, NULL);
    *last_ms = jsd__mono_ms();
}

jsd_disposition jsd__handler_call_one(const jsd__handler *h, jsd_tx *tx, const jsd_delivery *d)
{
    if (!h->batch)
        return h->one(tx, d, h->user);
    jsd_disposition out = jsd_disposition_commit();
    h->batch(tx, &d, 1, &out, h->user);
    return out;
}

/* The inbox holds a row for d's sequence (prev). When it names another
 * message, the sequence was handed out again: the stream was deleted and
 * re-created, or its server lost its last acknowledged writes. d is then a
 * new message, not a duplicate: the old row is retired (it keeps its
 * message id for the duplicate check under a sequence of its own) and
 * *found turns false. A row without an identity (written before the inbox
 * kept one for messages without a Nats-Msg-Id) is taken for d, as before. */
static jsd_status sequence_reused(jsd_consumer *c, jsd_tx *tx, const jsd_delivery *d,
                                  const jsd__inbox_outcome *prev, bool *found)
{
    const char *id = jsd__inbox_id(d);
    if (!prev->msg_id[0] || !strcmp(prev->msg_id, id))
        return JSD_OK;
    char was[96], now[96];
    jsd__printable(prev->msg_id, strlen(prev->msg_id), was, sizeof(was));
    jsd__printable(id, strlen(id), now, sizeof(now));
    JSD_WARN("consumer",
             "%s/%s: stream sequence %" PRIu64 " was message %s when it was applied and is "
             "message %s now: the stream was re-created or its server lost acknowledged "
             "writes; applying it as a new message",
             c->stream, c->durable, d->seq, was, now);
    jsd_status st = jsd__tx_inbox_retire(tx, c->stream, c->durable, d->seq);
    if (st != JSD_OK)
        return st;
    jsd_counter_inc(c->m_reused);
    *found = false;
    return JSD_OK;
}

/* Decide one delivery inside the open transaction. A non-OK return means the
 * transaction can no longer be trusted (the batch is abandoned). */
static jsd_status apply_one(jsd_consumer *c, jsd_tx *tx, jsd_delivery *d, const jsd__handler *h)
{
    bool given = d->given;
    jsd__inbox_outcome prev;
    bool found = false;
    jsd_status st;

    st = jsd__tx_inbox_lookup(tx, c->stream, c->durable, d->seq, &found, &prev);
    if (st != JSD_OK)
        return st;
    if (found && (st = sequence_reused(c, tx, d, &prev, &found)) != JSD_OK)
        return st;
    const char *id = jsd__inbox_id(d); /* within the limits, always */
    if (!found) {
        st = jsd__tx_inbox_lookup_msg_id(tx, c->stream, c->durable, id, &found, &prev);
        if (st != JSD_OK)
            return st;
        if (found && prev.stream_seq != d->seq) {
            /* A re-published duplicate past the broker's window: record its
             * identity too, apply nothing. */
            char why[64];
            jsd__snprintf(why, sizeof(why), "duplicate of stream seq %" PRIu64, prev.stream_seq);
            jsd__trace t = trace_of(d);
            st = jsd__tx_inbox_insert(tx, c->stream, c->durable, d->seq, id, OUT_DUP, why, &t);
            if (st != JSD_OK && st != JSD_ERR_EXISTS)
                return st;
            d->state = D_ACK;
            d->dup = true;
            return JSD_OK;
        }
    }
    if (found) {
        d->dup = true;
        jsd__strlcpy(d->reason, prev.detail, sizeof(d->reason));
        d->state = prev.code == OUT_POISON ? D_POISON : prev.code == OUT_PARK ? D_PARK : D_ACK;
        return JSD_OK;
    }

    /* Past the park threshold: bury it without running the handler. */
    if (c->park_at > 0 && d->deliveries > (uint64_t)c->park_at) {
        const char *le = lasterr_get(c, d->seq);
        jsd__snprintf(d->reason, sizeof(d->reason), "max deliveries reached (%" PRIu64 "): %s",
                      d->deliveries, le ? le : "last error not known to this process");
        return record_dead(c, tx, d, OUT_PARK);
    }
    /* Limits and envelope: poison on first sight. */
    if (!within_limits(d, d->reason, sizeof(d->reason)) ||
        !jsd__envelope_check(d->type, natsMsg_GetData(d->msg),
                             (size_t)natsMsg_GetDataLength(d->msg), (const char *const *)c->types,
                             c->n_types, c->fmt, d->reason, sizeof(d->reason)))
        return record_dead(c, tx, d, OUT_POISON);

    jsd_disposition disp;
    char given_reason[sizeof(d->reason)];
    given_reason[0] = '\0';
    if (given) {
        jsd__strlcpy(given_reason, d->reason, sizeof(given_reason));
        /* The fast pass already ran this handler, and it did not commit:
         * reuse its answer rather than call it twice. */
        disp = (jsd_disposition){.kind = d->given_kind, .delay_ms = d->given_delay_ms};
        if ((st = jsd__tx_savepoint(tx)) != JSD_OK)
            return st;
    } else {
        if ((st = jsd__tx_savepoint(tx)) != JSD_OK)
            return st;
        int before = jsd__handler_before(tx);
        int64_t t0 = jsd__mono_us();
        disp = jsd__handler_call_one(h, tx, d);
        int64_t took = jsd__mono_us() - t0;
        STAT_ADD(c, handler_us, (uint64_t)took);
        jsd_histogram_observe(c->m->handler_duration, (double)took / 1e6);
        /* A handler that failed because of the store (out, or contention)
         * did not fail: the batch is retried or held instead (no attempt
         * spent, never parked). */
        if (disp.kind != JSD_DISPOSITION_COMMIT &&
            (st = jsd__handler_saw_outage(c, tx, before, disp.reason)) != JSD_OK)
            return st;
    }

    if (disp.kind == JSD_DISPOSITION_COMMIT) {
        jsd__trace t = trace_of(d);
        st = jsd__tx_inbox_insert(tx, c->stream, c->durable, d->seq, jsd__inbox_id(d), OUT_COMMIT,
                                  NULL, &t);
        if (st == JSD_OK) {
            if ((st = jsd__tx_release(tx)) != JSD_OK)
                return st;
            d->state = D_ACK;
            d->fresh = true;
            return JSD_OK;
        }
        if (st == JSD_ERR_EXISTS) {
            /* Another process committed it meanwhile: its effects stand. */
            if ((st = jsd__tx_rollback_to(tx)) != JSD_OK)
                return st;
            d->dup = true;
            d->state = D_ACK;
            return JSD_OK;
        }
        /* The store is out: the whole batch is held and retried. */
        if (jsd__store_outage(st))
            return st;
        /* The inbox row could not be written: undo, and come again. */
        jsd__snprintf(d->reason, sizeof(d->reason), "inbox insert failed: %s",
                      jsd_store_errmsg(c->store));
        if ((st = jsd__tx_rollback_to(tx)) != JSD_OK)
            return st;
        disp = jsd_disposition_retry(0, d->reason);
    } else if ((st = jsd__tx_rollback_to(tx)) != JSD_OK) {
        return st;
    }

    if (given)
        disp.reason = given_reason;
    if (disp.kind == JSD_DISPOSITION_POISON) {
        char why[sizeof(d->reason)];
        jsd__strlcpy(why, disp.reason && *disp.reason ? disp.reason : "poison", sizeof(why));
        jsd__snprintf(d->reason, sizeof(d->reason), "handler: %s", why);
        return record_dead(c, tx, d, OUT_POISON);
    }
    /* RETRY */
    if (d->reason != disp.reason)
        jsd__strlcpy(d->reason,
                     disp.reason && *disp.reason ? disp.reason : "handler asked to retry",
                     sizeof(d->reason));
    lasterr_put(c, d->seq, d->reason);
    if (c->park_at > 0 && d->deliveries >= (uint64_t)c->park_at) {
        char last[sizeof(d->reason)];
        jsd__strlcpy(last, d->reason, sizeof(last));
        jsd__snprintf(d->reason, sizeof(d->reason), "max deliveries reached (%" PRIu64 "): %s",
                      d->deliveries, last);
        return record_dead(c, tx, d, OUT_PARK);
    }
    d->state = D_NAK;
    d->delay_ms = disp.delay_ms > 0 ? disp.delay_ms : c->retry_delay_ms;
    return JSD_OK;
}

/* Copy a handler's reason at once: it must outlive the call (a literal or
 * the handler's own storage), never the handler's stack. */
static void keep_reason(jsd_delivery *d, const jsd_disposition *disp, const char *fallback)
{
    jsd__strlcpy(d->reason, disp->reason && *disp->reason ? disp->reason : fallback,
                 sizeof(d->reason));
}

/* Keep the fast pass's answer for d, so the careful pass does not ask again. */
static void keep_given(jsd_delivery *d, const jsd_disposition *disp)
{
    keep_reason(d, disp,
                disp->kind == JSD_DISPOSITION_POISON ? "poison" : "handler asked to retry");
    d->given = true;
    d->given_kind = disp->kind;
    d->given_delay_ms = disp->delay_ms;
}

/* The fast pass's scratch: one slot per delivery of the batch in hand. */
struct jsd__fast {
    const jsd_delivery **dp; /* the handler's view, in stream order; also sorted */
    jsd_disposition *out;
    uint64_t *seqs;
    const char **ids;
    jsd__trace *traces;
    bool *inserted;
};

void jsd__apply_free(jsd_consumer *c)
{
    if (!c->fast)
        return;
    jsd__free(c->fast->dp);
    jsd__free(c->fast->out);
    jsd__free(c->fast->seqs);
    jsd__free(c->fast->ids);
    jsd__free(c->fast->traces);
    jsd__free(c->fast->inserted);
    jsd__free(c->fast);
    c->fast = NULL;
    c->fast_cap = 0;
}

static jsd_status fast_scratch(jsd_consumer *c, size_t n)
{
    if (c->fast && c->fast_cap >= n)
        return JSD_OK;
    jsd__apply_free(c);
    struct jsd__fast *f = jsd__calloc(1, sizeof(*f));
    if (!f)
        return JSD_ERR_NOMEM;
    c->fast = f;
    f->dp = jsd__calloc(n, sizeof(*f->dp)); /* NOLINT(bugprone-sizeof-expression) */
    f->out = jsd__calloc(n, sizeof(*f->out));
    f->seqs = jsd__calloc(n, sizeof(*f->seqs));
    f->ids = jsd__calloc(n, sizeof(*f->ids)); /* NOLINT(bugprone-sizeof-expression) */
    f->traces = jsd__calloc(n, sizeof(*f->traces));
    f->inserted = jsd__calloc(n, sizeof(*f->inserted));
    if (!f->dp || !f->out || !f->seqs || !f->ids || !f->traces || !f->inserted) {
        jsd__apply_free(c);
        return JSD_ERR_NOMEM;
    }
    c->fast_cap = n;
    return JSD_OK;
}

static int by_seq(const void *a, const void *b)
{
    uint64_t x = (*(const jsd_delivery *const *)a)->seq, y = (*(const jsd_delivery *const *)b)->seq;
    return x < y ? -1 : x > y;
}

static int by_msg_id(const void *a, const void *b)
{
    const char *x = (*(const jsd_delivery *const *)a)->msg_id;
    const char *y = (*(const jsd_delivery *const *)b)->msg_id;
    return strcmp(x ? x : "", y ? y : "");
}

/* Two deliveries of the batch with one stream seq or one message id: one
 * statement would not see the first one's row when deciding the second. */
static bool batch_repeats(const jsd_delivery **dp, size_t n)
{
    qsort(dp, n, sizeof(*dp), by_seq); /* NOLINT(bugprone-sizeof-expression) */
    for (size_t i = 1; i < n; i++)
        if (dp[i]->seq == dp[i - 1]->seq)
            return true;
    qsort(dp, n, sizeof(*dp), by_msg_id); /* NOLINT(bugprone-sizeof-expression) */
    for (size_t i = 1; i < n; i++)
        if (dp[i]->msg_id && *dp[i]->msg_id && by_msg_id(&dp[i], &dp[i - 1]) == 0)
            return true;
    return false;
}

static void handler_time(jsd_consumer *c, int64_t t0)
{
    int64_t took = jsd__mono_us() - t0;
    STAT_ADD(c, handler_us, (uint64_t)took);
    jsd_histogram_observe(c->m->handler_duration, (double)took / 1e6);
}

/* The fast pass: the same decisions as apply_one for the common case, with
 * no savepoint and one inbox statement for the whole batch (see DESIGN).
 * Anything unusual — a park, a bad envelope or a delivery past the limits
 * (checked in C first), two deliveries of the batch with one seq or msg id,
 * a delivery the inbox already holds (by seq, or by msg id), a handler that
 * does not commit — sets *abort: the caller rolls the whole batch back and
 * redoes it with apply_one, which reuses the answers kept with keep_given. */
static jsd_status apply_fast(jsd_consumer *c, jsd_tx *tx, const jsd__handler *h, bool *abort,
                             int64_t *wpi_at)
{
    size_t n = c->nd;
    jsd_status st = fast_scratch(c, n);
    if (st != JSD_OK)
        return st;
    struct jsd__fast *f = c->fast;
    for (size_t i = 0; i < n; i++) {
        jsd_delivery *d = &c->d[i];
        if ((c->park_at > 0 && d->deliveries > (uint64_t)c->park_at) ||
            !within_limits(d, d->reason, sizeof(d->reason)) ||
            !jsd__envelope_check(
                d->type, natsMsg_GetData(d->msg), (size_t)natsMsg_GetDataLength(d->msg),
                (const char *const *)c->types, c->n_types, c->fmt, d->reason, sizeof(d->reason))) {
            *abort = true;
            return JSD_OK;
        }
        f->dp[i] = d;
        f->seqs[i] = d->seq;
        f->ids[i] = jsd__inbox_id(d);
        f->traces[i] = trace_of(d);
    }
    if (batch_repeats(f->dp, n)) {
        *abort = true;
        return JSD_OK;
    }
    st = jsd__tx_inbox_insert_many(tx, c->stream, c->durable, f->seqs, (const char *const *)f->ids,
                                   f->traces, n, OUT_COMMIT, f->inserted);
    if (st != JSD_OK)
        return st;
    for (size_t i = 0; i < n; i++) {
        if (!f->inserted[i]) {
            *abort = true; /* a duplicate: the careful pass records and answers it */
            return JSD_OK;
        }
    }
    keep_alive(c, wpi_at);

    if (h->batch) {
        for (size_t i = 0; i < n; i++) {
            f->dp[i] = &c->d[i];
            f->out[i] = jsd_disposition_commit();
        }
        int before = jsd__handler_before(tx);
        int64_t t0 = jsd__mono_us();
        h->batch(tx, f->dp, n, f->out, h->user);
        handler_time(c, t0);
        for (size_t i = 0; i < n; i++) {
            if (f->out[i].kind == JSD_DISPOSITION_COMMIT)
                continue;
            if ((st = jsd__handler_saw_outage(c, tx, before, f->out[i].reason)) != JSD_OK)
                return st;
            /* A batch of one is not asked again; in a larger batch the
             * answer may be its neighbours' doing: each is asked alone. */
            if (n == 1)
                keep_given(&c->d[0], &f->out[0]);
            *abort = true;
            return JSD_OK;
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            keep_alive(c, wpi_at);
            int before = jsd__handler_before(tx);
            int64_t t0 = jsd__mono_us();
            jsd_disposition disp = h->one(tx, &c->d[i], h->user);
            handler_time(c, t0);
            if (disp.kind == JSD_DISPOSITION_COMMIT)
                continue;
            if ((st = jsd__handler_saw_outage(c, tx, before, disp.reason)) != JSD_OK)
                return st;
            keep_given(&c->d[i], &disp);
            *abort = true;
            return JSD_OK;
        }
    }
    for (size_t i = 0; i < n; i++) {
        c->d[i].state = D_ACK;
        c->d[i].fresh = true;
    }
    return JSD_OK;
}

/* Apply the batch in hand in one transaction and COMMIT it: first the fast
 * pass, and when anything in it is unusual, the careful pass with a
 * savepoint per handler. JSD_OK when committed; otherwise the status of the
 * store call that failed, and nothing of the batch was committed (or, after
 * a lost connection at COMMIT, it is unknown: the next attempt's inbox
 * lookups answer that). */
static jsd_status apply_batch(jsd_consumer *c, const jsd__handler *h, int64_t *wpi_at)
{
    jsd_tx *tx = NULL;
    bool abort = false;

    c->cont_kind = CONT_NONE;
    for (size_t i = 0; i < c->nd; i++) {
        c->d[i].state = D_NONE;
        c->d[i].fresh = c->d[i].dup = c->d[i].given = false;
        c->d[i].reason[0] = '\0';
    }
    keep_alive(c, wpi_at);
    jsd_status st = jsd_tx_begin(&tx, c->store);
    if (st == JSD_OK)
        st = apply_fast(c, tx, h, &abort, wpi_at);
    if (st == JSD_OK && abort) {
        jsd_tx_rollback(tx);
        tx = NULL;
        for (size_t i = 0; i < c->nd; i++) {
            c->d[i].state = D_NONE;
            c->d[i].fresh = c->d[i].dup = false;
            if (!c->d[i].given)
                c->d[i].reason[0] = '\0';
        }
        st = jsd_tx_begin(&tx, c->store);
        for (size_t i = 0; st == JSD_OK && i < c->nd; i++) {
            keep_alive(c, wpi_at);
            st = apply_one(c, tx, &c->d[i], h);
        }
    }
    if (st == JSD_OK) {
        st = jsd_tx_commit(tx);
        tx = NULL;
        if (st == JSD_OK)
            return JSD_OK;
    }
    jsd_tx_rollback(tx);
    return st != JSD_OK ? st : JSD_ERR_STORE;
}

/* Why the batch is held: the handler's contention, or the store's error. */
static const char *hold_cause(jsd_consumer *c)
{
    return c->cont_kind != CONT_NONE ? c->cont_why : jsd_store_errmsg(c->store);
}

/* The consumer's error for a batch not applied: the hold's cause. */
static void hold_err(jsd_consumer *c, jsd_status st)
{
    if (c->cont_kind != CONT_NONE)
        jsd__cerr(c, st, "%s", c->cont_why);
    else
        jsd__err_copy(&c->err, jsd_store_error(c->store));
}

/* A contention hold: the store answers, a lock (or a timeout) does not. */
static bool contended(const jsd_consumer *c)
{
    return c->cont_kind != CONT_NONE && c->cont_kind != CONT_CONNECTION;
}

/* The hold is over (applied, stopped, or handed to the failed-commit path). */
static void hold_end(jsd_consumer *c)
{
    c->holding = false;
    c->hold_alerted = false;
    pthread_mutex_lock(&c->mu);
    c->stats.held = 0;
    c->stats.held_contention = 0;
    c->stats.hold_overdue = 0;
    pthread_mutex_unlock(&c->mu);
    jsd_gauge_set(c->m_held, 0);
    jsd_gauge_set(c->m_overdue, 0);
}

/* Past hold_alert_ms the hold is an alert, said once: an error line, the
 * stats' hold_overdue and its gauge (cmd_consume's /readyz says 503). */
static void hold_alert(jsd_consumer *c)
{
    int64_t held_ms = jsd__mono_ms() - c->hold_since_ms;
    if (c->hold_alerted || c->hold_alert_ms <= 0 || held_ms < c->hold_alert_ms)
        return;
    c->hold_alerted = true;
    STAT_SET(c, hold_overdue, 1);
    jsd_gauge_set(c->m_overdue, 1);
    JSD_ERROR("consumer",
              "%s/%s: %zu deliveries held for %" PRId64 " ms, past the hold alert (%" PRId64
              " ms): %s; nothing is lost (they are kept alive and retried), but nothing is "
              "applied until it clears",
              c->stream, c->durable, c->nd, held_ms, c->hold_alert_ms, hold_cause(c));
}

/* A drain during a store outage: leave the held deliveries unacked. */
static jsd_status hold_stop(jsd_consumer *c, jsd_status why)
{
    size_t n = c->nd;
    char cause[JSD__ERROR_TEXT_MAX + 1];
    jsd__strlcpy(cause, hold_cause(c), sizeof(cause));
    JSD_WARN("consumer",
             "%s/%s: stopped during a store outage: %zu held deliveries left unacked; the "
             "server redelivers them after the ack wait (%" PRId64 " ms), one delivery each",
             c->stream, c->durable, n, c->ack_wait_ms);
    jsd__batch_release(c); /* neither ACK nor NAK */
    c->held_at_stop += n;
    hold_end(c);
    jsd__cerr(
        c, why,
        "stopped while %zu deliveries were held by a store outage (%s); they were left unacked "
        "and come again after the ack wait",
        n, cause);
    jsd__fetch_drain(c);
    jsd__ack_collect(c->ack, true);
    return JSD_ERR_STOPPED;
}

/* Hold the batch in hand through a store outage or the handler's contention:
 * keep every delivery alive (+WPI, which does not count a delivery), wait
 * with a capped backoff, and apply it again from the start in a fresh
 * transaction until the store takes it. JSD_OK once committed;
 * JSD_ERR_STOPPED on drain. */
static jsd_status hold_and_apply(jsd_consumer *c, const jsd__handler *h, int64_t *wpi_at,
                                 jsd_status why)
{
    int64_t backoff = 100;
    if (!c->holding) {
        c->holding = true;
        c->hold_alerted = false;
        c->hold_since_ms = jsd__mono_ms();
        STAT_ADD(c, store_outages, 1);
        jsd_counter_inc(c->m_outages);
        JSD_WARN("consumer",
                 "%s/%s: store %s (%s): holding %zu deliveries, kept alive every %" PRId64
                 " ms and retried until %s; no delivery attempt is spent",
                 c->stream, c->durable, contended(c) ? "contention" : "outage", hold_cause(c),
                 c->nd, c->keepalive_ms,
                 contended(c) ? "the statements go through" : "the store answers");
    }
    STAT_SET(c, held, c->nd);
    STAT_SET(c, held_contention, contended(c) ? 1 : 0);
    jsd_gauge_set(c->m_held, (double)c->nd);
    for (;;) {
        int64_t until = jsd__mono_ms() + backoff;
        while (jsd__mono_ms() < until) {
            if (atomic_load(&c->draining))
                return hold_stop(c, why);
            keep_alive(c, wpi_at);
            hold_alert(c);
            jsd__ack_collect(c->ack, false);
            jsd__sleep_ms(JSD_MIN(50, JSD_MAX(1, until - jsd__mono_ms())));
        }
        backoff = JSD_MIN(backoff * 2, 5000);
        keep_alive(c, wpi_at);
        jsd_status st = apply_batch(c, h, wpi_at);
        if (st == JSD_OK)
            break;
        if (!jsd__store_outage(st)) {
            /* The store answers again, and refuses something in the batch:
             * the ordinary failed-commit path takes it from here. */
            hold_end(c);
            return st;
        }
        why = st;
        hold_err(c, st);
        STAT_SET(c, held_contention, contended(c) ? 1 : 0);
        hold_alert(c);
    }
    JSD_WARN("consumer",
             "%s/%s: the store answers again after %" PRId64 " ms; %zu held deliveries "
             "applied",
             c->stream, c->durable, jsd__mono_ms() - c->hold_since_ms, c->nd);
    hold_end(c);
    return JSD_OK;
}

jsd_status jsd__apply(jsd_consumer *c, const jsd__handler *h, bool *committed)
{
    *committed = false;
    int64_t wpi_at = jsd__mono_ms();
    jsd_status st = apply_batch(c, h, &wpi_at);
    /* A serialization failure or deadlock in the handler's statements: the
     * transaction lost a race, its messages did not fail. Applied again at
     * once, a few times; then held like any other contention. */
    for (int k = 1;
         st != JSD_OK && (c->cont_kind == CONT_SERIALIZATION || c->cont_kind == CONT_DEADLOCK) &&
         k <= RETRY_AT_ONCE;
         k++) {
        STAT_ADD(c, contention_retries, 1);
        JSD_WARN("consumer",
                 "%s/%s: %s; the batch of %zu is applied again at once (%d of %d); no delivery "
                 "attempt is spent",
                 c->stream, c->durable, c->cont_why, c->nd, k, RETRY_AT_ONCE);
        keep_alive(c, &wpi_at);
        st = apply_batch(c, h, &wpi_at);
    }
    if (st != JSD_OK && jsd__store_outage(st)) {
        hold_err(c, st);
        st = hold_and_apply(c, h, &wpi_at, st);
        if (st == JSD_ERR_STOPPED)
            return st;
    }
    if (st != JSD_OK) {
        jsd__err_copy(&c->err, jsd_store_error(c->store));
        JSD_WARN("consumer", "batch of %zu on %s/%s not committed (%s); NAK, they come again",
                 c->nd, c->stream, c->durable, jsd_store_errmsg(c->store));
        STAT_ADD(c, commit_failures, 1);
        for (size_t i = 0; i < c->nd; i++)
            jsd__nak(c, &c->d[i], c->retry_delay_ms);
        jsd__batch_release(c);
        return JSD_OK;
    }
    *committed = true;
    return JSD_OK;
}
