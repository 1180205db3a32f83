/*
 * consumer_fetch — the fetch step: a fetcher thread pulls the next batch from
 * the durable while the consumer's thread applies the one in hand (it holds
 * at most that one batch, kept alive with +WPI while it waits), and
 * jsd__fetch_batch turns a fetched batch into the deliveries in hand. The
 * fetcher only moves a natsMsgList into the slot under fmu; every delivery
 * is decided on the consumer's thread.
 */
#include <string.h>

#include "conn_int.h"
#include "consumer_int.h"

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
        natsStatus s = natsSubscription_Fetch(&l, c->sub, c->batch, c->fetch_wait_ms, NULL);
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
    while (!c->slot_full && !c->fstop && jsd__mono_ms() < deadline) {
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

int jsd__fetch_start(jsd_consumer *c)
{
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
            natsMsg_Destroy(d->msg);
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
