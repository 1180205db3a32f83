/*
 * consumer_replay — the replay step: a dead letter that `jsdurable dlq
 * replay --store` asked this durable to apply again (a replay request in its
 * store, src/store/replay.c) is applied from its poison record through the
 * consumer's handler, as a delivery would be, without publishing anything:
 * no other consumer of the stream, jsdurable's or anyone's, sees it again
 * (issue 42, item 6).
 *
 * DESIGN (one request). In one store transaction:
 *   inbox lookup (stream, durable, stream seq)
 *     COMMIT/DUP   -> already applied: the request completes as applied,
 *                     no handler runs (a second replay, a redelivery first)
 *   complete the request (applied)      [not pending any more: another
 *                                        process of the durable did it; stop]
 *   inbox row -> COMMIT ("replayed from DLQ:seq"), inserted if gc took it
 *   handler (the delivery: the record's subject, payload, headers and
 *            Jsd-Replay-Of: DLQ:seq; deliveries 0; progress a no-op)
 *                                       [crash: replay.before_commit]
 *   COMMIT                              [crash: replay.after_commit]
 * Why it is safe: the handler's writes, the inbox's "applied" and the
 * request's completion commit together or not at all. A crash before the
 * COMMIT leaves the request pending and the inbox row POISON/PARK, and the
 * next sweep applies it again from the start. After it, a redelivery of the
 * original sequence finds COMMIT and is only ACKed, and a second request of
 * the same dead letter finds the request applied (the store keeps one per
 * delivery). A handler that fails again (RETRY or POISON) rolls back; the
 * request is marked failed with its reason (logged at warn, counted, shown
 * by `jsdurable status`) and not tried again until asked again. A failure
 * that is the store's (an outage, contention met by the handler's
 * statements) is not the message's: the request stays pending and the
 * sweep comes back after 5 s.
 */
#include <inttypes.h>
#include <string.h>

#include "conn_int.h"
#include "consumer_int.h"
#include "store/store.h"

#define REPLAY_BATCH    16
#define REPLAY_ROUNDS   4 /* at most 64 requests a sweep */
#define REPLAY_EVERY_MS 1000
#define REPLAY_BACKOFF  5000

enum { R_APPLIED, R_FAILED, R_DUPLICATE };

/* The message as it came, rebuilt from the poison record: its subject,
 * payload and header block ("NATS/1.0\r\nName: value\r\n..."), with
 * Jsd-Replay-Of added. NULL when out of memory. */
static natsMsg *rebuild(const jsd__poison_record *r, const jsd_replay_request *q)
{
    natsMsg *m = NULL;
    if (natsMsg_Create(&m, r->subject, NULL, (const char *)r->payload, (int)r->len) != NATS_OK)
        return NULL;
    const char *p = (const char *)r->headers, *end = p ? p + r->headers_len : NULL;
    bool first = true;
    while (p && p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        const char *stop = eol ? eol : end;
        size_t n = (size_t)(stop - p);
        if (n && p[n - 1] == '\r')
            n--;
        if (!first && n) {
            const char *colon = memchr(p, ':', n);
            if (colon && colon > p) {
                char name[256], value[4096];
                size_t nl = JSD_MIN((size_t)(colon - p), sizeof(name) - 1);
                const char *v = colon + 1;
                while (v < p + n && *v == ' ')
                    v++;
                size_t vl = JSD_MIN((size_t)(p + n - v), sizeof(value) - 1);
                memcpy(name, p, nl);
                name[nl] = '\0';
                memcpy(value, v, vl);
                value[vl] = '\0';
                if (strcmp(name, JSD_HDR_REPLAY_OF) != 0 && vl)
                    natsMsgHeader_Add(m, name, value);
            }
        }
        first = false;
        p = eol ? eol + 1 : end;
    }
    char origin[300];
    jsd__snprintf(origin, sizeof(origin), "%s:%" PRIu64, q->dlq_stream, q->dlq_seq);
    if (natsMsgHeader_Set(m, JSD_HDR_REPLAY_OF, origin) != NATS_OK) {
        natsMsg_Destroy(m);
        return NULL;
    }
    return m;
}

static void counted(jsd_consumer *c, int result)
{
    jsd_counter_inc(c->m_replays[result]);
    if (result == R_APPLIED)
        STAT_ADD(c, replays_applied, 1);
    else if (result == R_FAILED)
        STAT_ADD(c, replays_failed, 1);
    else
        STAT_ADD(c, replays_duplicate, 1);
}

/* The request failed for the message's own reason: marked, warned, counted. */
static void failed(jsd_consumer *c, const jsd_replay_request *q, const char *why)
{
    bool done = false;
    if (jsd__store_replay_finish(c->store, q->id, JSD_REPLAY_FAILED, why, &done) != JSD_OK) {
        JSD_WARN("consumer",
                 "%s/%s: replay of %s:%" PRIu64 " (sequence %" PRIu64 ") failed (%s) and could "
                 "not be marked failed (%s); it is tried again",
                 c->stream, c->durable, q->dlq_stream, q->dlq_seq, q->stream_seq, why,
                 jsd_store_errmsg(c->store));
        return;
    }
    if (!done)
        return; /* another process of the durable completed it */
    counted(c, R_FAILED);
    JSD_WARN("consumer",
             "%s/%s: replay of %s:%" PRIu64 " (sequence %" PRIu64 ") failed: %s; the request is "
             "marked failed (`jsdurable status` shows it) and is tried again only when asked "
             "again (`jsdurable dlq replay --store`)",
             c->stream, c->durable, q->dlq_stream, q->dlq_seq, q->stream_seq, why);
}

/* Apply one request (DESIGN above). JSD_OK when it is settled or left for a
 * reason of its own; the store's status when the store failed (it stays
 * pending). */
static jsd_status replay_one(jsd_consumer *c, const jsd__handler *h, const jsd_replay_request *q)
{
    jsd__poison_record rec;
    memset(&rec, 0, sizeof(rec));
    c->cont_kind = CONT_NONE; /* what the handler meets, if it is called */
    jsd_status st = jsd__store_poison_get(c->store, q->stream, q->consumer, q->stream_seq, &rec);
    if (st == JSD_ERR_NOT_FOUND) {
        failed(c, q, "the store holds no poison record of this delivery");
        return JSD_OK;
    }
    if (st != JSD_OK)
        return st;
    natsMsg *m = rebuild(&rec, q);
    if (!m) {
        jsd__poison_record_clear(&rec);
        return JSD_ERR_NOMEM;
    }
    jsd_delivery d;
    memset(&d, 0, sizeof(d));
    d.c = c;
    d.msg = m;
    d.subject = rec.subject;
    d.msg_id = rec.msg_id && *rec.msg_id ? rec.msg_id : NULL;
    d.type = jsd_delivery_header(&d, JSD_HDR_TYPE);
    d.seq = rec.stream_seq;
    d.replay = true;
    d.id = d.msg_id && jsd__store_text_ok(d.msg_id, JSD_IDENT_MAX) ? d.msg_id : NULL;
    jsd__snprintf(d.key, sizeof(d.key), "@%" PRIu64 ".replay", d.seq);

    char why[JSD__ERROR_TEXT_MAX + 1], detail[400];
    jsd__snprintf(detail, sizeof(detail), "replayed from %s:%" PRIu64, q->dlq_stream, q->dlq_seq);
    jsd_tx *tx = NULL;
    bool done = false, found = false;
    jsd__inbox_outcome prev;
    if (!jsd__envelope_check(d.type, natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m),
                             (const char *const *)c->types, c->n_types, c->fmt, why, sizeof(why))) {
        char text[sizeof(why) + 32];
        jsd__snprintf(text, sizeof(text), "its envelope is still refused: %s", why);
        failed(c, q, text);
        goto out;
    }
    if ((st = jsd_tx_begin(&tx, c->store)) != JSD_OK ||
        (st = jsd__tx_inbox_lookup(tx, c->stream, c->durable, d.seq, &found, &prev)) != JSD_OK)
        goto out;
    if (found && (prev.code == OUT_COMMIT || prev.code == OUT_DUP)) {
        /* Applied already: by an earlier replay, or by a delivery. */
        if ((st = jsd__tx_replay_finish(tx, q->id, JSD_REPLAY_APPLIED,
                                        "already applied: nothing done", &done)) != JSD_OK ||
            (st = jsd_tx_commit(tx)) != JSD_OK)
            goto out;
        tx = NULL;
        if (done) {
            counted(c, R_DUPLICATE);
            JSD_INFO("consumer",
                     "%s/%s: replay of %s:%" PRIu64 ": sequence %" PRIu64
                     " is applied already; nothing done",
                     c->stream, c->durable, q->dlq_stream, q->dlq_seq, d.seq);
        }
        goto out;
    }
    if (found && prev.msg_id[0] && d.id && strcmp(prev.msg_id, d.id) != 0) {
        /* The sequence names another message now (a re-created stream,
         * consumer_apply.c's sequence_reused): not this dead letter's. */
        jsd_tx_rollback(tx);
        tx = NULL;
        failed(c, q,
               "its stream sequence names another message in the inbox now (the stream was "
               "re-created): not replayed");
        goto out;
    }
    if ((st = jsd__tx_replay_finish(tx, q->id, JSD_REPLAY_APPLIED, detail, &done)) != JSD_OK)
        goto out;
    if (!done)
        goto out; /* another process of the durable took it: rolled back below */
    if (found) {
        bool changed = false;
        st = jsd__tx_inbox_set_outcome(tx, c->stream, c->durable, d.seq, OUT_COMMIT, detail,
                                       &changed);
    } else {
        st = jsd__tx_inbox_insert(tx, c->stream, c->durable, d.seq, d.id, OUT_COMMIT, detail,
                                  &(jsd__trace){0});
    }
    if (st != JSD_OK)
        goto out;

    int before = jsd__handler_before(tx);
    int64_t t0 = jsd__mono_us();
    jsd_disposition disp = jsd__handler_call_one(h, tx, &d);
    int64_t took = jsd__mono_us() - t0;
    STAT_ADD(c, handler_us, (uint64_t)took);
    jsd_histogram_observe(c->m->handler_duration, (double)took / 1e6);
    if (disp.kind == JSD_DISPOSITION_COMMIT) {
        JSD_CRASH_POINT("replay.before_commit");
        st = jsd_tx_commit(tx);
        tx = NULL;
        if (st == JSD_OK) {
            JSD_CRASH_POINT("replay.after_commit");
            counted(c, R_APPLIED);
            JSD_INFO("consumer",
                     "%s/%s: replay of %s:%" PRIu64 " applied (sequence %" PRIu64
                     "); no message was published",
                     c->stream, c->durable, q->dlq_stream, q->dlq_seq, d.seq);
        } else if (!jsd__store_outage(st)) {
            /* The store refused what the handler wrote (a deferred
             * constraint): the message's failure, not retried on its own. */
            jsd__snprintf(why, sizeof(why), "commit refused: %s", jsd_store_errmsg(c->store));
            failed(c, q, why);
            st = JSD_OK;
        }
        goto out;
    }
    jsd__strlcpy(why,
                 disp.reason && *disp.reason
                     ? disp.reason
                     : (disp.kind == JSD_DISPOSITION_POISON ? "poison" : "handler asked to retry"),
                 sizeof(why));
    st = jsd__handler_saw_outage(c, tx, before, why);
    jsd_tx_rollback(tx);
    tx = NULL;
    if (st == JSD_OK) {
        char text[sizeof(why) + 16];
        jsd__snprintf(text, sizeof(text), "handler: %s", why);
        failed(c, q, text);
    }
out:
    jsd_tx_rollback(tx);
    natsMsg_Destroy(m);
    jsd__poison_record_clear(&rec);
    return st;
}

void jsd__replay_sweep(jsd_consumer *c, const jsd__handler *h, bool force)
{
    int64_t now = jsd__mono_ms();
    if (atomic_load(&c->draining) || (!force && now < c->replay_at_ms))
        return;
    c->replay_at_ms = now + REPLAY_EVERY_MS;
    jsd_replay_request *reqs = jsd__calloc(REPLAY_BATCH, sizeof(*reqs));
    if (!reqs)
        return;
    int64_t after = 0;
    for (int round = 0; round < REPLAY_ROUNDS; round++) {
        size_t n = 0;
        jsd_status st = jsd__store_replay_pending(c->store, c->stream, c->durable, after, reqs,
                                                  REPLAY_BATCH, &n);
        if (st != JSD_OK) {
            /* The store is down: its outage is reported by the batch path. */
            c->replay_at_ms = now + REPLAY_BACKOFF;
            break;
        }
        for (size_t i = 0; i < n; i++) {
            after = reqs[i].id;
            if (atomic_load(&c->draining))
                goto out;
            st = replay_one(c, h, &reqs[i]);
            if (st != JSD_OK) {
                JSD_WARN("consumer",
                         "%s/%s: replay of %s:%" PRIu64 " not applied now (%s); it stays "
                         "pending and is tried again in %d ms",
                         c->stream, c->durable, reqs[i].dlq_stream, reqs[i].dlq_seq,
                         c->cont_kind != CONT_NONE ? c->cont_why : jsd_store_errmsg(c->store),
                         REPLAY_BACKOFF);
                c->replay_at_ms = jsd__mono_ms() + REPLAY_BACKOFF;
                goto out;
            }
        }
        if (n < REPLAY_BATCH)
            break;
    }
out:
    jsd__free(reqs);
}
