/*
 * consumer_bury — the bury step: settling the dead letters of a committed
 * batch (the death envelope of each poison or parked delivery, published
 * unless an earlier attempt did, then TERM, or the ACK of a park by the
 * caller) and the sweep that republishes, from the store, poison records
 * whose death envelope is not yet in the dead-letter stream (DLQ-1 in the
 * DESIGN block of consumer.c).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "conn_int.h"
#include "consumer_int.h"
#include "store/store.h"

/* Publish the death envelope of a stored poison record (one the batch that
 * recorded it could not publish, or one left by another process). */
static jsd_status republish_record(jsd_consumer *c, const jsd__poison_record *r, jsd_error *e)
{
    char type[257] = "";
    uint64_t dlv = 0;
    const char *diag = r->diagnostic ? r->diagnostic : "";
    static const char park_prefix[] = "max deliveries reached (";
    bool parked = strncmp(diag, park_prefix, sizeof(park_prefix) - 1) == 0;
    if (parked)
        dlv = strtoull(diag + sizeof(park_prefix) - 1, NULL, 10);
    /* Jsd-Type from the stored header block ("Name: value\r\n" lines). */
    if (r->headers) {
        const char *hb = (const char *)r->headers;
        size_t hl = r->headers_len, tl = strlen(JSD_HDR_TYPE);
        for (size_t i = 0; i + tl + 2 <= hl; i++) {
            if ((i == 0 || hb[i - 1] == '\n') && strncmp(hb + i, JSD_HDR_TYPE, tl) == 0 &&
                hb[i + tl] == ':') {
                size_t a = i + tl + 1, z;
                while (a < hl && hb[a] == ' ')
                    a++;
                for (z = a; z < hl && hb[z] != '\r' && hb[z] != '\n'; z++)
                    ;
                size_t n = JSD_MIN(z - a, sizeof(type) - 1);
                memcpy(type, hb + a, n);
                type[n] = '\0';
                break;
            }
        }
    }
    jsd__death death = {.subject = r->subject,
                        .stream = r->stream,
                        .consumer = r->consumer,
                        .stream_seq = r->stream_seq,
                        .deliveries = dlv,
                        .reason = parked ? "max_deliver" : "poison",
                        .error = diag,
                        .msg_id = r->msg_id && *r->msg_id ? r->msg_id : NULL,
                        .type = *type ? type : NULL,
                        .payload = r->payload,
                        .len = r->len,
                        .time_ms = r->created_at_ms};
    uint64_t dseq = 0;
    jsd_status st = jsd__death_publish(c->js, c->dlq_subject, c->dlq_stream, &death,
                                       c->ack_timeout_ms, &dseq, e);
    if (st != JSD_OK)
        return st;
    jsd_counter_inc(c->m->dead_letters);
    st = jsd__store_poison_mark_published(c->store, r->stream, r->consumer, r->stream_seq,
                                          c->dlq_stream, dseq);
    if (st != JSD_OK)
        JSD_WARN("consumer",
                 "poison record %s:%" PRIu64 " published as %s:%" PRIu64
                 " but not marked (%s); it is published again (the same id) later",
                 r->stream, r->stream_seq, c->dlq_stream, dseq, jsd_store_errmsg(c->store));
    return st;
}

/* Republish this durable's poison records that have no dead-letter sequence
 * (DLQ-1): due after a failed publish (with a backoff up to 30 s), and every
 * minute otherwise, for records another process left. */
void jsd__bury_sweep(jsd_consumer *c, bool force)
{
    int64_t now = jsd__mono_ms();
    if (!force && now < c->sweep_at_ms)
        return;
    int64_t after = 0;
    size_t left = 0, published = 0;
    bool failed = false;
    jsd_error e;
    jsd_error_clear(&e);
    for (;;) {
        jsd__poison_record *recs = NULL;
        size_t n = 0;
        jsd_status st =
            jsd__store_poison_unpublished(c->store, c->stream, c->durable, after, 64, &recs, &n);
        if (st != JSD_OK) {
            /* The store is down: its outage is reported by the batch path. */
            c->sweep_at_ms = now + 5000;
            return;
        }
        for (size_t i = 0; i < n; i++) {
            after = recs[i].id;
            if (!failed) {
                jsd_status ps = republish_record(c, &recs[i], &e);
                if (ps == JSD_OK) {
                    published++;
                    continue;
                }
                failed = e.status != JSD_OK; /* the publish failed, not only its mark */
            }
            left++;
        }
        jsd__poison_records_free(recs, n);
        if (n < 64)
            break;
    }
    if (published) {
        STAT_ADD(c, dlq_republished, published);
        JSD_INFO("consumer", "%s/%s: %zu stored dead letters published to %s", c->stream,
                 c->durable, published, c->dlq_stream);
    }
    STAT_SET(c, poison_unpublished, left);
    jsd_gauge_set(c->m_dlq_unpublished, (double)left);
    if (left) {
        c->sweep_backoff_ms = JSD_MIN(JSD_MAX(c->sweep_backoff_ms * 2, 500), 30000);
        JSD_WARN("consumer",
                 "%s/%s: %zu poison records are stored but not in the dead-letter stream %s "
                 "(%s); retrying in %" PRId64 " ms",
                 c->stream, c->durable, left, c->dlq_stream, e.msg[0] ? e.msg : "not published",
                 c->sweep_backoff_ms);
        c->sweep_at_ms = jsd__mono_ms() + c->sweep_backoff_ms;
    } else {
        c->sweep_backoff_ms = 0;
        c->sweep_at_ms = jsd__mono_ms() + 60000;
    }
}

void jsd__bury(jsd_consumer *c, jsd_delivery *d, bool *dlq_ok, bool *dlq_failed)
{
    /* The poison record was committed with the batch (or by an
     * earlier one, for a redelivery): publish its death envelope
     * unless an earlier attempt already did. */
    bool published = false;
    if (d->dup) {
        jsd__poison_record r;
        memset(&r, 0, sizeof(r));
        if (jsd__store_poison_get(c->store, c->stream, c->durable, d->seq, &r) == JSD_OK) {
            published = r.dlq_seq != 0;
            jsd__poison_record_clear(&r);
        }
    }
    if (!published) {
        const char *reason = d->state == D_POISON ? "poison" : "max_deliver";
        char shown[JSD_IDENT_MAX + 1]; /* the id as its poison record keeps it */
        jsd__death death = {.subject = d->subject,
                            .stream = c->stream,
                            .consumer = c->durable,
                            .stream_seq = d->seq,
                            .deliveries = d->deliveries,
                            .reason = reason,
                            .error = d->reason,
                            .msg_id = jsd__msg_id_kept(d->msg_id, shown),
                            .type = d->type,
                            .payload = natsMsg_GetData(d->msg),
                            .len = (size_t)natsMsg_GetDataLength(d->msg),
                            .time_ms = jsd__now_ms()};
        uint64_t dseq = 0;
        jsd_error e;
        jsd_error_clear(&e);
        jsd_status ds = jsd__death_publish(c->js, c->dlq_subject, c->dlq_stream, &death,
                                           c->ack_timeout_ms, &dseq, &e);
        if (ds != JSD_OK) {
            /* Not the message's failure, and no delivery is spent on
             * it: the poison record is durable, and jsd__bury_sweep
             * republishes it from the store. */
            JSD_WARN("consumer",
                     "dead letter for %s:%" PRIu64 " not published (%s); its poison "
                     "record stays in the store and is republished from there",
                     c->stream, d->seq, e.msg);
            jsd__err_copy(&c->err, &e);
            STAT_ADD(c, dlq_deferred, 1);
            jsd_counter_inc(c->m_dlq_deferred);
            *dlq_failed = true;
        } else {
            *dlq_ok = true;
            if (jsd__store_poison_mark_published(c->store, c->stream, c->durable, d->seq,
                                                 c->dlq_stream, dseq) != JSD_OK)
                JSD_WARN("consumer", "poison record %s:%" PRIu64 " not marked published: %s",
                         c->stream, d->seq, jsd_store_errmsg(c->store));
            jsd_counter_inc(c->m->dead_letters);
            JSD_CRASH_POINT("poison.after_dlq_publish");
        }
    }
    char id[96];
    jsd__printable(d->msg_id ? d->msg_id : "", d->msg_id ? strlen(d->msg_id) : 0, id, sizeof(id));
    JSD_WARN("consumer",
             "%s/%s: sequence %" PRIu64 " (msg id \"%s\", delivery %" PRIu64 ") %s%s: %s",
             c->stream, c->durable, d->seq, id, d->deliveries,
             d->state == D_POISON ? "is poison, dead-lettered" : "parked, dead-lettered",
             d->dup ? " (recorded before)" : "", d->reason[0] ? d->reason : "no reason given");
    if (d->state == D_POISON) {
        natsStatus ts = natsMsg_Term(d->msg, NULL);
        if (ts != NATS_OK)
            JSD_WARN("consumer", "TERM of %s:%" PRIu64 " failed (%s); it will come again",
                     c->stream, d->seq, natsStatus_GetText(ts));
        STAT_ADD(c, poisoned, 1);
        jsd_counter_inc(c->m->deliveries[JSD_RESULT_POISON]);
    } else {
        STAT_ADD(c, parked, 1);
        jsd_counter_inc(c->m->deliveries[JSD_RESULT_DEADLETTER]);
    }
}

void jsd__bury_after(jsd_consumer *c, bool dlq_ok, bool dlq_failed)
{
    if (dlq_failed) {
        c->sweep_backoff_ms = JSD_MAX(c->sweep_backoff_ms, 250);
        c->sweep_at_ms = JSD_MIN(c->sweep_at_ms, jsd__mono_ms() + c->sweep_backoff_ms);
    } else if (dlq_ok) {
        /* The dead-letter stream answers again: retry the stored ones now. */
        jsd_consumer_stats snap;
        jsd_consumer_stats_get(c, &snap);
        if (snap.poison_unpublished)
            jsd__bury_sweep(c, true);
    }
}
