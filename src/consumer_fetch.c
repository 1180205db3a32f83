/*
 * consumer_fetch — the fetch step: a fetcher thread pulls the next batch from
 * the durable while the consumer's thread applies the one in hand (it holds
 * at most that one batch, kept alive with +WPI while it waits), and
 * jsd__fetch_batch turns a fetched batch into the deliveries in hand. The
 * fetcher only moves a natsMsgList into the slot under fmu; every delivery
 * is decided on the consumer's thread.
 */
#include <inttypes.h>
#include <string.h>

#include "conn_int.h"
#include "consumer_int.h"
#include "natsmsg.h"
#include "store/store.h"

/* ---- the fetcher thread ------------------------------------------------------------ */

/* Give back messages that were fetched but never handed out (drain, destroy):
 * a NAK without delay, so the durable offers them again at once. */
static void give_back(natsMsgList *l)
{
    for (int i = 0; i < l->Count; i++)
        if (l->Msgs[i])
            natsMsg_Nak(l->Msgs[i], NULL);
    natsMsgList_Destroy(l);
}

/* nats.c 3.4.1 overflows the heap in _fetch (src/js.c), fixed upstream by
 * nats.c PR #749 "Fix heap buffer overflow in _fetch" (released in 3.9).
 * _fetch allocates Batch slots, first takes the messages already pending in
 * the subscription (leftovers of an earlier pull request: one whose fetch
 * timed out, or one the server served again after a reconnect), k of them,
 * then sends a request for Batch - k and loops `while (count != Batch - k)`.
 * With k > Batch/2 the count is already past that and the loop ends only at
 * the timeout (or a 404/408 status): once the new request's Batch - k have
 * filled the slots, every further message (a stale request's) is written
 * past their end. k == Batch (no second loop) and k <= Batch/2 are safe.
 *
 * So while messages are pending, fetch_pending takes them with Fetch(1):
 * with one slot, k is 0 or 1, both safe for any queue contents. A larger
 * batch sized from natsSubscription_GetPending would not do: the count
 * includes status messages (a 408 of an expired request sits there after
 * nearly every idle fetch), which _fetch drops without counting, so k can
 * fall short of the pending count and land in (Batch/2, Batch). nats.c
 * 3.4.1 offers no other way to read a pull subscription (NextMsg refuses
 * one). Each Fetch(1) that finds a user message in the queue returns it
 * without a request; messages only arrive meanwhile, never leave (only this
 * thread reads the subscription). The pending messages are gathered into
 * one list of at most c->batch, so a batch is what it was. When the queue
 * holds only status messages, Fetch(1) sends a request for one: with the
 * normal wait when nothing was gathered yet (as an idle fetch would wait),
 * with 1 ms otherwise (its answer is then pending for the next round).
 * The cost: an idle fetch's 408 usually lands just after it returned, so
 * the first batch after an idle spell holds one message (the next ones are
 * full again).
 * What remains: messages that arrive between the GetPending that reads 0
 * and the plain Fetch(batch) (microseconds) are again leftovers taken by
 * its first loop; an overflow needs more than batch/2 of them in that
 * window and then still more before the timeout. */
static natsStatus fetch_pending(jsd_consumer *c, natsMsgList *out, int pending)
{
    /* jsd__calloc is plain calloc underneath: natsMsgList_Destroy frees it. */
    natsMsg **msgs = jsd__calloc((size_t)c->batch, sizeof(*msgs));
    int n = 0;
    natsStatus s = NATS_OK;
    if (!msgs)
        return NATS_NO_MEMORY;
    while (n < c->batch && pending > 0) {
        natsMsgList one = {0};
        s = natsSubscription_Fetch(&one, c->sub, 1, n ? 1 : c->fetch_wait_ms, NULL);
        for (int i = 0; i < one.Count && n < c->batch; i++) {
            msgs[n++] = one.Msgs[i];
            one.Msgs[i] = NULL;
        }
        natsMsgList_Destroy(&one);
        if (s != NATS_OK || natsSubscription_GetPending(c->sub, &pending, NULL) != NATS_OK)
            break;
    }
    if (n == 0) { /* the first Fetch(1) returned no message, hence an error */
        jsd__free(msgs);
        return s;
    }
    out->Msgs = msgs;
    out->Count = n;
    return NATS_OK;
}

/* One fetch of up to c->batch messages (see fetch_pending for why pending
 * messages are taken apart). */
static natsStatus fetch(jsd_consumer *c, natsMsgList *out)
{
    int pending = 0;
    if (natsSubscription_GetPending(c->sub, &pending, NULL) == NATS_OK && pending > 0)
        return fetch_pending(c, out, pending);
    return natsSubscription_Fetch(out, c->sub, c->batch, c->fetch_wait_ms, NULL);
}

static void *fetcher_main(void *arg)
{
    jsd_consumer *c = arg;
    pthread_mutex_lock(&c->fmu);
    while (!c->fstop) {
        if (c->slot_full || atomic_load(&c->draining)) {
            /* A batch pulled ahead may wait behind slow handlers: keep it from
             * being redelivered (and its delivery count from growing). */
            if (c->slot_full && jsd__mono_ms() - c->slot_wpi_ms >= c->keepalive_ms) {
                for (int i = 0; i < c->slot.Count; i++)
                    natsMsg_InProgress(c->slot.Msgs[i], NULL);
                c->slot_wpi_ms = jsd__mono_ms();
            }
            jsd__cond_wait_ms(&c->fcv, &c->fmu, 100);
            continue;
        }
        pthread_mutex_unlock(&c->fmu);
        natsMsgList l = {0};
        natsStatus s = fetch(c, &l);
        if (s != NATS_OK && s != NATS_TIMEOUT)
            jsd__sleep_ms(50); /* a broken connection: do not spin */
        pthread_mutex_lock(&c->fmu);
        if (c->fstop || atomic_load(&c->draining)) {
            give_back(&l);
            continue;
        }
        c->slot = l;
        c->slot_status = s;
        c->slot_full = true;
        pthread_mutex_lock(&c->mu);
        c->stats.max_in_flight =
            JSD_MAX(c->stats.max_in_flight, (uint64_t)atomic_load(&c->in_hand) + (uint64_t)l.Count);
        pthread_mutex_unlock(&c->mu);
        c->slot_wpi_ms = jsd__mono_ms();
        pthread_cond_broadcast(&c->fcv);
    }
    pthread_mutex_unlock(&c->fmu);
    return NULL;
}

/* Take the next fetched batch, waiting for the fetcher; false when none came
 * in time. */
static bool take_batch(jsd_consumer *c, natsMsgList *out, natsStatus *st)
{
    bool got = false;
    int64_t deadline = jsd__mono_ms() + c->fetch_wait_ms + 5000;
    pthread_mutex_lock(&c->fmu);
    /* A drain (SIGTERM) stops the wait too: with the server paused the fetch
     * would otherwise hold the stop for fetch_wait_ms + 5 s. */
    while (!c->slot_full && !c->fstop && !atomic_load(&c->draining) && jsd__mono_ms() < deadline) {
        jsd__cond_wait_ms(&c->fcv, &c->fmu, 50);
    }
    if (c->slot_full) {
        *out = c->slot;
        *st = c->slot_status;
        memset(&c->slot, 0, sizeof(c->slot));
        c->slot_full = false;
        got = true;
        pthread_cond_broadcast(&c->fcv); /* the fetcher pulls the next one now */
    }
    pthread_mutex_unlock(&c->fmu);
    return got;
}

/* Stop fetching and give back a batch fetched but not handed out. */
void jsd__fetch_drain(jsd_consumer *c)
{
    pthread_mutex_lock(&c->fmu);
    if (c->slot_full) {
        give_back(&c->slot);
        c->slot_full = false;
    }
    pthread_cond_broadcast(&c->fcv);
    pthread_mutex_unlock(&c->fmu);
}

static bool parse_meta(jsd_delivery *d)
{
    if (natsMsg_GetMetaData(&d->meta, d->msg) != NATS_OK || !d->meta)
        return false;
    d->seq = d->meta->Sequence.Stream;
    d->deliveries = d->meta->NumDelivered;
    d->subject = natsMsg_GetSubject(d->msg);
    if (natsMsgHeader_Get(d->msg, "Nats-Msg-Id", &d->msg_id) != NATS_OK)
        d->msg_id = NULL;
    jsd__snprintf(d->key, sizeof(d->key), "@%" PRIu64 ".%" PRId64, d->seq, d->meta->Timestamp);
    d->id =
        d->msg_id && *d->msg_id && jsd__store_text_ok(d->msg_id, JSD_IDENT_MAX) ? d->msg_id : NULL;
    if (natsMsgHeader_Get(d->msg, JSD_HDR_TYPE, &d->type) != NATS_OK)
        d->type = NULL;
    return true;
}

static bool reserve(jsd_consumer *c, size_t n)
{
    if (n <= c->cap)
        return true;
    jsd_delivery *d = jsd__realloc(c->d, n * sizeof(*d));
    if (!d)
        return false;
    c->d = d;
    c->cap = n;
    return true;
}

/* Start (or, after jsd__fetch_stop, restart) the fetcher thread. */
int jsd__fetch_start(jsd_consumer *c)
{
    pthread_mutex_lock(&c->fmu);
    c->fstop = false;
    pthread_mutex_unlock(&c->fmu);
    int rc = pthread_create(&c->fetcher, NULL, fetcher_main, c);
    if (rc == 0)
        c->fetcher_started = true;
    return rc;
}

/* Stop the fetcher thread and give back a batch it fetched ahead. */
void jsd__fetch_stop(jsd_consumer *c)
{
    if (c->fetcher_started) {
        pthread_mutex_lock(&c->fmu);
        c->fstop = true;
        pthread_cond_broadcast(&c->fcv);
        pthread_mutex_unlock(&c->fmu);
        pthread_join(c->fetcher, NULL);
        c->fetcher_started = false;
    }
    if (c->slot_full) {
        give_back(&c->slot);
        c->slot_full = false;
    }
}

jsd_status jsd__fetch_batch(jsd_consumer *c, bool *idle)
{
    natsMsgList list = {0};
    *idle = false;
    c->nd = 0;
    natsStatus s = NATS_TIMEOUT;
    if (!take_batch(c, &list, &s))
        s = NATS_TIMEOUT;
    if (s == NATS_TIMEOUT || (s == NATS_OK && list.Count == 0)) {
        natsMsgList_Destroy(&list);
        *idle = true;
        return JSD_OK;
    }
    if (s != NATS_OK) {
        natsMsgList_Destroy(&list);
        *idle = true;
        return jsd__err_nats(&c->err, s, 0, "fetch");
    }
    if (!reserve(c, (size_t)list.Count)) {
        for (int i = 0; i < list.Count; i++)
            natsMsg_NakWithDelay(list.Msgs[i], c->retry_delay_ms, NULL);
        natsMsgList_Destroy(&list);
        return jsd__cerr(c, JSD_ERR_NOMEM, "out of memory for a batch of %d", list.Count);
    }
    for (int i = 0; i < list.Count; i++) {
        jsd_delivery *d = &c->d[c->nd];
        memset(d, 0, sizeof(*d));
        d->c = c;
        d->msg = list.Msgs[i];
        list.Msgs[i] = NULL;
        if (!parse_meta(d)) {
            /* Not a JetStream delivery (a status message): nothing to settle. */
            jsd__msg_free(d->msg);
            continue;
        }
        c->nd++;
    }
    natsMsgList_Destroy(&list);
    pthread_mutex_lock(&c->mu);
    c->stats.fetched += c->nd;
    c->stats.batches++;
    if (c->nd > c->stats.max_batch)
        c->stats.max_batch = c->nd;
    c->stats.max_in_flight = JSD_MAX(c->stats.max_in_flight, (uint64_t)c->nd);
    pthread_mutex_unlock(&c->mu);
    atomic_store(&c->in_hand, c->nd);
    return JSD_OK;
}
