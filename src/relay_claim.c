/*
 * relay_claim — the relay's publishing side (see the DESIGN block in
 * relay.c): it claims a batch of due effects under a fresh lease token,
 * checks each one (a defect the claim reports, an invalid subject, which
 * stream captures the subject, whether that stream's duplicate window
 * covers the relay's retry horizon), submits the publishable ones to the
 * publication engine with their stable Nats-Msg-Id and expected stream, and
 * maps every publication's result onto its slot (receipt, counted failure,
 * dead letter now, or release without an attempt). Settled batches go to
 * the receipt writer (relay_writer.c).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "conn_int.h"
#include "jsd_int.h"
#include "pubengine.h"
#include "relay_int.h"
#include "store/store.h"
#include "streams.h"
#include "subject.h"

/* ---- stream lookup ---------------------------------------------------------------- */

/*
 * The stream that captures subject, into stream (cap JSD_STREAM_NAME_MAX + 1):
 * JSD_OK with a name, JSD_ERR_NOT_FOUND when no stream captures it, another
 * status when the lookup could not be made (NATS down, timeout). Answers come
 * from the shared stream cache (src/streams.c).
 */
static jsd_status stream_for(jsd_relay *r, const char *subject, char *stream, char *why,
                             size_t why_cap)
{
    jsd_error err;
    jsd_error_clear(&err);
    jsd_status s = jsd__streams_lookup(r->streams, subject, stream, JSD_STREAM_NAME_MAX + 1, &err);
    if (s == JSD_ERR_NOT_FOUND)
        jsd__snprintf(why, why_cap, "no stream captures subject %s", subject);
    else if (s == JSD_ERR_NOMEM)
        jsd__snprintf(why, why_cap, "%s", err.msg);
    else if (s != JSD_OK)
        jsd__snprintf(why, why_cap, "stream lookup for %s: %s", subject, err.msg);
    return s;
}

/*
 * The retry horizon, the one computation of it (the doctor reports the same
 * figure, src/doctor.c): a message stored by an attempt whose PubAck never
 * came is retried at most publish deadline + backoff cap later, and one
 * stored just before its relay died is retried when the lease has expired;
 * either way the due effect may wait one more poll interval before a relay
 * claims it, so deadline + cap + lease + poll bounds the time between a
 * possible store and the retry that JetStream must recognise.
 */
int64_t jsd__relay_retry_horizon_ms(const jsd_relay_opts *o)
{
    return (int64_t)o->publish_deadline_ms + (int64_t)o->backoff_cap_ms + (int64_t)o->lease_ms +
           (int64_t)o->poll_interval_ms;
}

/*
 * The retry horizon must fit the stream's duplicate window (DESIGN 2).
 * JSD_OK when it fits; JSD_ERR_CONFIG when it does not (the error is
 * recorded, logged and the relay stops: it would otherwise store such effects
 * twice); another status when the stream could not be read (why says so; the
 * effect is released and tried again).
 */
static jsd_status window_fits(jsd_relay *r, const char *stream, int64_t *window_out, bool *atomic,
                              char *why, size_t why_cap)
{
    int64_t window_ms = 0;
    jsd_error err;
    jsd_error_clear(&err);
    jsd_status s = jsd__streams_info(r->streams, stream, &window_ms, atomic, &err);
    *window_out = window_ms;
    if (s != JSD_OK) {
        jsd__snprintf(why, why_cap, "%s", err.msg);
        return s;
    }
    int64_t horizon = jsd__relay_retry_horizon_ms(&r->o);
    if (window_ms <= 0 || horizon < window_ms)
        return JSD_OK;
    jsd__snprintf(why, why_cap,
                  "stream %s keeps message ids for %lld ms (its duplicate window), but this relay "
                  "may retry an effect up to %lld ms after it was stored (publish deadline %d + "
                  "backoff cap %d + lease %d + poll %d ms): such a retry would be stored twice. "
                  "Lower the deadline, backoff cap, lease or poll interval, or raise the stream's "
                  "duplicate window",
                  stream, (long long)window_ms, (long long)horizon, r->o.publish_deadline_ms,
                  r->o.backoff_cap_ms, r->o.lease_ms, r->o.poll_interval_ms);
    if (r->fatal == JSD_OK) {
        r->fatal = jsd__relay_err(r, JSD_ERR_CONFIG, "%s", why);
        JSD_ERROR(COMP, "%s; the relay stops", why);
    }
    atomic_store(&r->stop, 1);
    return JSD_ERR_CONFIG;
}

void jsd__relay_batch_free(rbatch *b)
{
    if (!b)
        return;
    jsd__effect_batch_free(&b->eb);
    jsd__free(b->slots);
    jsd__free(b->gidx);
    jsd__free(b);
}

/* Batches go round: claimed here, settled, written and recycled by the
 * receipt writer, claimed again, keeping their slots and their rows'
 * storage (rows.c), so a busy relay does not allocate per claim. */
#define SPARE_MAX 8

static rbatch *batch_new(jsd_relay *r, size_t cap)
{
    pthread_mutex_lock(&r->wq_mu);
    rbatch *b = r->spare;
    if (b) {
        r->spare = b->next;
        r->n_spare--;
    }
    pthread_mutex_unlock(&r->wq_mu);
    if (!b) {
        b = jsd__calloc(1, sizeof(*b));
        if (!b)
            return NULL;
        jsd__effect_batch_init(&b->eb);
    }
    if (!cap)
        cap = 1;
    if (b->slots_cap < cap) {
        jsd__free(b->slots);
        jsd__free(b->gidx);
        b->gidx = NULL;
        if (!(b->slots = jsd__calloc(cap, sizeof(slot))) ||
            !(b->gidx = jsd__calloc(cap, sizeof(uint32_t)))) {
            jsd__relay_batch_free(b);
            return NULL;
        }
        b->slots_cap = cap;
    } else {
        memset(b->slots, 0, cap * sizeof(slot));
    }
    b->next = NULL;
    b->pending = 0;
    b->n_groups = 0;
    return b;
}

void jsd__relay_batch_recycle(jsd_relay *r, rbatch *b)
{
    jsd__effect_batch_clear(&b->eb);
    pthread_mutex_lock(&r->wq_mu);
    bool keep = r->n_spare < SPARE_MAX;
    if (keep) {
        b->next = r->spare;
        r->spare = b;
        r->n_spare++;
    }
    pthread_mutex_unlock(&r->wq_mu);
    if (!keep)
        jsd__relay_batch_free(b);
}

static void slot_fail(slot *sl, slot_fate fate, const char *fmt, ...) JSD_PRINTF(3, 4);
static void slot_fail(slot *sl, slot_fate fate, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sl->reason, sizeof(sl->reason), fmt, ap);
    va_end(ap);
    sl->fate = (uint8_t)fate;
    sl->state = SLOT_DONE;
}

/* ---- a duplicate on the first attempt ----------------------------------------------- */

typedef enum { COPY_OURS, COPY_FOREIGN, COPY_UNREAD } copy_verdict;

/* Whether the stored message m is e's own: the same Nats-Msg-Id, subject and
 * payload, and exactly e's headers besides the Nats-* ones the publisher
 * adds. On a difference, what differs goes to why. */
static copy_verdict copy_compare(natsMsg *m, const jsd__claimed *e, char *why, size_t cap)
{
    const char *v = NULL;
    if (natsMsgHeader_Get(m, "Nats-Msg-Id", &v) != NATS_OK || !v || strcmp(v, e->msg_id) != 0) {
        jsd__snprintf(why, cap, "its msg id differs");
        return COPY_FOREIGN;
    }
    const char *subj = natsMsg_GetSubject(m);
    if (!subj || strcmp(subj, e->subject) != 0) {
        jsd__snprintf(why, cap, "its subject differs");
        return COPY_FOREIGN;
    }
    int len = natsMsg_GetDataLength(m);
    if (len < 0 || (size_t)len != e->len ||
        (len > 0 && memcmp(natsMsg_GetData(m), e->payload, e->len) != 0)) {
        jsd__snprintf(why, cap, "its payload differs");
        return COPY_FOREIGN;
    }
    const char **keys = NULL;
    int nkeys = 0;
    size_t theirs = 0;
    natsStatus s = natsMsgHeader_Keys(m, &keys, &nkeys);
    if (s != NATS_OK && s != NATS_NOT_FOUND) {
        jsd__snprintf(why, cap, "its headers could not be read (%s)", natsStatus_GetText(s));
        return COPY_UNREAD;
    }
    for (int i = 0; i < nkeys; i++) {
        const char **vals = NULL;
        int nv = 0;
        if (strncasecmp(keys[i], "Nats-", 5) != 0 &&
            natsMsgHeader_Values(m, keys[i], &vals, &nv) == NATS_OK) {
            theirs += (size_t)nv;
            free((void *)vals);
        }
    }
    free((void *)keys);
    bool same = theirs == e->n_headers;
    for (size_t i = 0; same && i < e->n_headers; i++) {
        const char **vals = NULL;
        int nv = 0;
        same = false;
        if (natsMsgHeader_Values(m, e->headers[i].name, &vals, &nv) == NATS_OK) {
            for (int k = 0; k < nv && !same; k++)
                same = strcmp(vals[k], e->headers[i].value) == 0;
            free((void *)vals);
        }
    }
    if (!same) {
        jsd__snprintf(why, cap, "its headers differ");
        return COPY_FOREIGN;
    }
    return COPY_OURS;
}

/*
 * A PubAck said duplicate on an attempt that, by the store's record, no
 * relay made before (DESIGN 4a). Read the message the stream holds at that
 * sequence (STREAM.MSG.GET, which needs no allow_direct): if it is this
 * effect's own message, an earlier attempt stored it and its claim did not
 * survive (PostgreSQL commits claims asynchronously, DESIGN 8; an SQLite
 * host's crash can lose its last claim), so it is this effect's receipt. If
 * it differs, another producer uses the id. A message that cannot be read
 * is not called ours.
 */
static copy_verdict stored_copy(jsd_relay *r, const jsd__claimed *e, const char *stream,
                                uint64_t seq, char *why, size_t cap)
{
    jsCtx *js = jsd__conn_js(r->conn);
    if (!js) {
        jsd__snprintf(why, cap, "no JetStream context to read it with");
        return COPY_UNREAD;
    }
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetMsg(&m, js, stream, seq, NULL, &jerr);
    if (s != NATS_OK) {
        jsd__snprintf(why, cap, "it could not be read to compare (%s, jetstream error %d)",
                      natsStatus_GetText(s), (int)jerr);
        return COPY_UNREAD;
    }
    copy_verdict v = copy_compare(m, e, why, cap);
    natsMsg_Destroy(m);
    return v;
}

/* Settle a first-attempt duplicate (DESIGN 4a): false when the stream's
 * message is this effect's own and the PubAck is its receipt; true when the
 * slot was dead-lettered. */
static bool first_dup_dead(jsd_relay *r, slot *sl, const jsd_publish_result *res,
                           const jsd__claimed *e)
{
    char why[200];
    copy_verdict v = stored_copy(r, e, res->receipt.stream, res->receipt.seq, why, sizeof(why));
    if (v == COPY_OURS) {
        JSD_WARN(COMP,
                 "effect %s/%s: the broker answered duplicate on its first attempt, and stream "
                 "%s holds this effect's own message at sequence %llu (an earlier claim was "
                 "lost, e.g. in a store crash): recorded as its receipt",
                 e->owner, e->effect_id, res->receipt.stream, (unsigned long long)res->receipt.seq);
        return false;
    }
    slot_fail(sl, FATE_DEAD,
              JSD__FIRST_DUP_REASON ": stream %s holds msg id %s at sequence %llu and %s, "
                                    "so this effect's message was not stored (another producer "
                                    "uses the id)",
              res->receipt.stream, e->msg_id, (unsigned long long)res->receipt.seq, why);
    sl->first_dup = true;
    jsd__relay_count(r, RC_FIRST_DUP, 1);
    JSD_WARN(COMP,
             "effect %s/%s: the broker answered duplicate on its first attempt (stream "
             "%s, sequence %llu holds msg id %s and %s; a second store with the same owner "
             "and effect id?); dead-lettering it",
             e->owner, e->effect_id, res->receipt.stream, (unsigned long long)res->receipt.seq,
             e->msg_id, why);
    return true;
}

/* Map a publication result onto the slot. */
void jsd__relay_settle(jsd_relay *r, slot *sl, const jsd_publish_result *res, const jsd__claimed *e)
{
    const char *subject = e->subject;
    switch (res->outcome) {
    case JSD_OUTCOME_ACCEPTED:
        /* Nothing of ours is on record as having stored it (no failed
         * attempt, no earlier lease that ended unsettled): whose message
         * the stream holds under this id decides. */
        if (res->receipt.duplicate && e->attempts == 0 && !e->maybe_published &&
            first_dup_dead(r, sl, res, e))
            return;
        sl->fate = FATE_RECEIPT;
        sl->state = SLOT_DONE;
        sl->seq = res->receipt.seq;
        sl->duplicate = res->receipt.duplicate;
        sl->acked_ms = res->receipt.accepted_at_ms ? res->receipt.accepted_at_ms : jsd__now_ms();
        sl->acked_us = jsd__mono_us();
        jsd__strlcpy(sl->stream, res->receipt.stream, sizeof(sl->stream));
        return;
    case JSD_OUTCOME_RETRYABLE:
    case JSD_OUTCOME_UNAVAILABLE:
        slot_fail(sl, FATE_RELEASE, "%s: %s", jsd_outcome_str(res->outcome), res->reason);
        return;
    case JSD_OUTCOME_REJECTED:
        slot_fail(sl, FATE_DEAD, "rejected: %s", res->reason);
        return;
    case JSD_OUTCOME_FAILED:
        if (res->status_code == 503) {
            /* No responders. The relay publishes only to a subject it found a
             * stream to capture (stream_for), so the stream has nobody to take
             * the message now (its leader is being elected or restarting): a
             * broker outage, which proves nothing was stored. The effect
             * waits and spends no attempt (DESIGN 4); the stream is looked up
             * again, so one that is really gone fails at the next claim. */
            jsd__streams_forget(r->streams, subject);
            slot_fail(sl, FATE_RELEASE, "unavailable: %s", res->reason);
            jsd__relay_nats_trouble(r, res->reason);
            r->broker_out = true;
            return;
        }
        if (jsd__js_err_permanent(res->js_err_code)) {
            slot_fail(sl, FATE_DEAD, "failed permanently: %s (jetstream error %d)", res->reason,
                      res->js_err_code);
            return;
        }
        /* A stream that no longer captures the subject, or another stream now
         * does (10060 wrong expected stream): look it up again next time. */
        jsd__streams_forget(r->streams, subject);
        /* fall through */
    default:
        sl->maybe_stored = res->outcome == JSD_OUTCOME_UNKNOWN;
        if (res->js_err_code)
            slot_fail(sl, FATE_FAILURE, "%s: %s (jetstream error %d)",
                      jsd_outcome_str(res->outcome), res->reason, res->js_err_code);
        else
            slot_fail(sl, FATE_FAILURE, "%s: %s", jsd_outcome_str(res->outcome), res->reason);
        return;
    }
}

/* Whether e's subject may be published now: valid, captured by a stream
 * (into stream, cap JSD_STREAM_NAME_MAX + 1) whose duplicate window
 * (*window_ms) fits the retry horizon; *atomic: the stream allows atomic
 * batches. When not, sl gets its fate (DESIGN 4, 4b) and false comes back. */
static bool publishable(jsd_relay *r, slot *sl, const jsd__claimed *e, char *stream,
                        int64_t *window_ms, bool *atomic)
{
    jsd_error verr;
    jsd_error_clear(&verr);
    if (!jsd__subject_valid_publish(e->subject, &verr)) {
        slot_fail(sl, FATE_DEAD, "cannot be published: %s", verr.msg);
        return false;
    }
    char why[256];
    jsd_status s = stream_for(r, e->subject, stream, why, sizeof(why));
    if (s == JSD_ERR_NOT_FOUND) {
        slot_fail(sl, FATE_FAILURE, "failed: %s", why);
        return false;
    }
    if (s == JSD_ERR_INVALID || s == JSD_ERR_LIMIT) {
        slot_fail(sl, FATE_DEAD, "cannot be published: %s", why);
        return false;
    }
    *window_ms = 0;
    *atomic = false;
    if (s == JSD_OK)
        s = window_fits(r, stream, window_ms, atomic, why, sizeof(why));
    if (s == JSD_ERR_CONFIG) {
        slot_fail(sl, FATE_RELEASE, "%s", why);
        return false;
    }
    if (s != JSD_OK) {
        slot_fail(sl, FATE_RELEASE, "unavailable: %s", why);
        jsd__relay_nats_trouble(r, why);
        r->broker_out = true;
        return false;
    }
    return true;
}

/* Claim and submit one batch. Returns the number claimed (0 when nothing was
 * due), -1 on a store error. A publication or stream lookup that finds the
 * broker out sets r->broker_out. */
int jsd__relay_claim_and_submit(jsd_relay *r, int want)
{
    rbatch *b = batch_new(r, (size_t)want);
    if (!b) {
        jsd__relay_err(r, JSD_ERR_NOMEM, "out of memory claiming a batch");
        return -1;
    }
    if (!jsd__random_hex(b->token, 16)) {
        jsd__relay_batch_recycle(r, b);
        jsd__relay_err(r, JSD_ERR_INTERNAL, "cannot draw a lease token");
        return -1;
    }
    pthread_mutex_lock(&r->store_mu);
    jsd_status s = jsd__store_claim(r->store, want, r->o.lease_ms, b->token, jsd__now_ms(), &b->eb);
    if (s != JSD_OK)
        jsd__relay_store_trouble(r, "claim");
    pthread_mutex_unlock(&r->store_mu);
    if (s != JSD_OK) {
        jsd__relay_batch_recycle(r, b);
        return -1;
    }
    atomic_store(&r->store_down, 0);
    if (b->eb.n == 0) {
        jsd__relay_batch_recycle(r, b);
        return 0;
    }
    JSD_CRASH_POINT("relay.after_claim");
    jsd__relay_count(r, RC_BATCHES, 1);
    b->claimed_mono_ms = jsd__mono_ms();
    b->claimed_ms = jsd__now_ms();
    b->held_warned = false;
    if (r->tail)
        r->tail->next = b;
    else
        r->head = b;
    r->tail = b;

    /* The subject last found publishable in this batch, with its stream and
     * duplicate window. A batch's effects mostly share a subject, and each
     * check costs a validation, two locks of the stream cache and three
     * error records (~0.2 us per effect, issue 12). Kept only after every
     * check passed, and only while the engine takes every submission: one
     * it refuses may have made the cache forget the stream (settle). */
    const char *memo = NULL;
    char memo_stream[JSD_STREAM_NAME_MAX + 1];
    int64_t memo_window_ms = 0;
    bool memo_atomic = false;
    uint8_t memo_group = 0; /* 1 + memo_stream's index in gstreams: in a batch */
    /* The streams whose effects go in atomic batches (DESIGN 13), sent
     * after the loop; the fallback reasons counted for this claim. */
    char gstreams[JSD__RELAY_GROUPS_MAX][JSD_STREAM_NAME_MAX + 1];
    size_t n_gstreams = 0;
    unsigned counted = 0;
    for (size_t i = 0; i < b->eb.n; i++) {
        const jsd__claimed *e = &b->eb.items[i];
        slot *sl = &b->slots[i];
        sl->ref = REF_SLOT;
        sl->b = b;
        sl->idx = (uint32_t)i;
        if (atomic_load_explicit(&r->stop, memory_order_relaxed)) {
            slot_fail(sl, FATE_RELEASE, "relay stopping");
            continue;
        }
        if (e->defect[0]) {
            slot_fail(sl, FATE_DEAD, "cannot be published: %s", e->defect);
            continue;
        }
        if (!e->msg_id[0]) {
            /* SQLite fills a NULL msg_id in the claim's transaction and
             * PostgreSQL's jsd_outbox_fill trigger at insert: only a row
             * that bypassed both comes here */
            slot_fail(sl, FATE_DEAD, "cannot be published: its msg_id is empty");
            continue;
        }
        if (!memo || strcmp(memo, e->subject) != 0) {
            memo = NULL;
            if (!publishable(r, sl, e, memo_stream, &memo_window_ms, &memo_atomic))
                continue;
            memo = e->subject;
            memo_group = 0;
            fallback_reason why = FB_N;
            if (jsd__relay_atomic_ok(r, memo_stream, memo_atomic, &why)) {
                size_t k = 0;
                while (k < n_gstreams && strcmp(gstreams[k], memo_stream) != 0)
                    k++;
                if (k == n_gstreams && n_gstreams < JSD__RELAY_GROUPS_MAX)
                    jsd__strlcpy(gstreams[n_gstreams++], memo_stream, sizeof(gstreams[0]));
                if (k < n_gstreams)
                    memo_group = (uint8_t)(k + 1);
            } else if (why != FB_N && !(counted & (1u << why))) {
                counted |= 1u << why;
                jsd__relay_fallback(r, why, memo_stream, 0, NULL);
            }
        }
        jsd__relay_horizon_on_send(r, sl, e, memo_window_ms, b->claimed_ms);
        if (memo_group) {
            sl->sgroup = memo_group;
            continue;
        }
        jsd__relay_submit_one(r, sl, memo_stream);
        if (sl->state != SLOT_PENDING)
            memo = NULL; /* refused: the stream may have been forgotten (settle) */
    }
    if (n_gstreams > 0)
        jsd__relay_submit_groups(r, b, gstreams, n_gstreams);
    atomic_store(&r->n_inflight, r->in_flight);
    JSD_CRASH_POINT("relay.after_publish");
    return (int)b->eb.n;
}
