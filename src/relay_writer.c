/*
 * relay_writer — the relay's receipt writer (DESIGN 2, 3, 7 in relay.c): a
 * second thread takes each batch whose publications are all settled and
 * writes its outcome to the store under the batch's lease token, the
 * receipts in one transaction (retried), the failures in a second, and
 * releases what was never sent; the publishing thread meanwhile goes on
 * claiming and submitting. The batches the writer finds queued together
 * have their receipts committed one after the other and made durable with
 * one sync (finish_batches). On PostgreSQL the writer has a connection of its
 * own (DESIGN 8); otherwise the two take turns on the store under store_mu.
 * Without the thread (it could not start) batches are written inline. The
 * crash points relay.before_receipt_commit and relay.after_receipt_commit
 * sit on this path.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "jsd_int.h"
#include "relay_int.h"
#include "store/store.h"

#define RECEIPT_RETRIES      5    /* store retries of a batch's receipt commit (not an outage) */
#define RECEIPT_HOLD_POLL_MS 1000 /* the retry interval of receipts held through an outage */
#define WRITE_GROUP_MAX      16   /* batches the writer takes at once (one sync for all) */

/* The receipts just committed become durable (jsd__store_sync_receipts).
 * On a store the two threads share, the sync runs with store_mu let go, so
 * that the publishing thread claims meanwhile instead of waiting for the
 * disk; the receipts count as written only after it. False: the sync
 * failed, and the receipts may be lost (a server that crashed meanwhile). */
static bool receipts_durable(jsd_relay *r, jsd_store *ws, bool holds_store_mu)
{
    JSD_CRASH_POINT("relay.before_receipt_sync");
    if (holds_store_mu)
        pthread_mutex_unlock(&r->store_mu);
    jsd_status s = jsd__store_sync_receipts(ws);
    if (holds_store_mu)
        pthread_mutex_lock(&r->store_mu);
    if (s != JSD_OK)
        jsd__relay_count(r, RC_STORE_ERRORS, 1); /* logged by the store */
    return s == JSD_OK;
}

/* A settled batch sorted by fate, and what became of its receipts. */
typedef struct outcome {
    jsd__receipt *rc;
    jsd__failure *fl;
    int64_t *rel;
    size_t nr, nf, nrel;
    size_t applied;      /* receipts the store took */
    jsd_status receipts; /* their commit */
    bool ok;             /* the arrays were allocated */
} outcome;

static void outcome_sort(rbatch *b, outcome *o)
{
    size_t n = b->eb.n;
    memset(o, 0, sizeof(*o));
    o->receipts = JSD_ERR_STORE;
    o->rc = jsd__calloc(n, sizeof(*o->rc));
    o->fl = jsd__calloc(n, sizeof(*o->fl));
    o->rel = jsd__calloc(n, sizeof(*o->rel));
    if (!o->rc || !o->fl || !o->rel) {
        /* Nothing is written: the leases expire and the effects are published
         * again with the same ids (duplicates), which is safe. */
        JSD_ERROR(COMP, "out of memory writing %zu receipts; they will be retried", n);
        return;
    }
    o->ok = true;
    for (size_t i = 0; i < n; i++) {
        const slot *sl = &b->slots[i];
        const jsd__claimed *e = &b->eb.items[i];
        switch (sl->fate) {
        case FATE_RECEIPT:
            o->rc[o->nr].row_id = e->row_id;
            o->rc[o->nr].stream = sl->stream;
            o->rc[o->nr].seq = sl->seq;
            o->rc[o->nr].duplicate = sl->duplicate;
            o->rc[o->nr].published_at_ms = sl->acked_ms;
            o->nr++;
            break;
        case FATE_DEAD:
            JSD_WARN(COMP, "dead-lettering effect %s/%s (row %lld): %s", e->owner, e->effect_id,
                     (long long)e->row_id, sl->reason);
            /* fall through */
        case FATE_FAILURE:
            o->fl[o->nf].row_id = e->row_id;
            o->fl[o->nf].error = sl->reason;
            o->fl[o->nf].dead_letter_now = sl->fate == FATE_DEAD;
            /* an attempt that may be in the stream keeps its claim as the
             * effect's first attempt (unless an earlier one is recorded) */
            o->fl[o->nf].attempted_ms = sl->maybe_stored ? b->claimed_ms : 0;
            o->fl[o->nf].retry_soon = sl->at_risk;
            o->nf++;
            break;
        default:
            o->rel[o->nrel++] = e->row_id;
            break;
        }
    }
}

static void outcome_free(outcome *o)
{
    jsd__free(o->rc);
    jsd__free(o->fl);
    jsd__free(o->rel);
}

/* Commit the batch's receipts: not yet durable (receipts_durable), or, when
 * sync says so, durable at once. */
static void commit_receipts(jsd_relay *r, jsd_store *ws, rbatch *b, outcome *o, bool sync)
{
    jsd_status s = JSD_ERR_STORE;
    /* A store outage keeps the receipts (the PubAcks are the only record
     * that the messages are in), retried until the store answers or the
     * relay stops; any other error is retried RECEIPT_RETRIES times. */
    for (int tryno = 0;; tryno++) {
        s = sync ? jsd__store_record_receipts(ws, b->token, o->rc, o->nr, &o->applied)
                 : jsd__store_record_receipts_unsynced(ws, b->token, o->rc, o->nr, &o->applied);
        if (s == JSD_OK)
            break;
        jsd__relay_store_trouble_on(r, ws, "record receipts");
        if (atomic_load(&r->stop) || (!jsd__store_outage(s) && tryno + 1 >= RECEIPT_RETRIES))
            break;
        atomic_store(&r->receipts_held, true);
        jsd__relay_horizon_held(r, b, jsd__now_ms());
        jsd__sleep_ms(tryno < 4 ? 100 << tryno : RECEIPT_HOLD_POLL_MS);
    }
    atomic_store(&r->receipts_held, false);
    if (s == JSD_OK)
        atomic_store(&r->store_down, 0);
    o->receipts = s;
}

/* The batch's receipts are durable: count them, time them and tell the
 * application; or report that they could not be written. */
static void receipts_done(jsd_relay *r, jsd_store *ws, rbatch *b, const outcome *o)
{
    size_t n = b->eb.n, nr = o->nr, applied = o->applied;
    if (o->receipts != JSD_OK) {
        JSD_ERROR(COMP,
                  "cannot record %zu receipts (%s); the effects will be published again "
                  "with the same ids after their lease expires",
                  nr, jsd_store_errmsg(ws));
        return;
    }
    JSD_CRASH_POINT("relay.after_receipt_commit");
    size_t dups = 0;
    for (size_t i = 0; i < nr; i++)
        dups += o->rc[i].duplicate;
    /* Commit -> PubAck: the PubAck's wall time from its monotonic
     * stamp, so a slow receipt commit does not count. */
    int64_t wall_ms = jsd__now_ms(), mono_us = jsd__mono_us();
    for (size_t i = 0; i < n && r->m_commit_to_puback; i++) {
        const slot *sl = &b->slots[i];
        const jsd__claimed *e = &b->eb.items[i];
        if (sl->fate != FATE_RECEIPT)
            continue;
        int64_t acked_ms = wall_ms - (mono_us - sl->acked_us) / 1000;
        int64_t from = JSD_MAX(e->created_at_ms, e->not_before_ms);
        jsd_histogram_observe(r->m_commit_to_puback, (double)JSD_MAX(acked_ms - from, 0) / 1000.0);
    }
    jsd__relay_count(r, RC_DUPLICATES, applied == nr ? dups : 0);
    /* last of the batch's figures: whoever sees it counted sees the
     * others too */
    jsd__relay_count(r, RC_PUBLISHED, applied);
    if (applied < nr) {
        jsd__relay_count(r, RC_LEASE_LOST, nr - applied);
        JSD_WARN(COMP,
                 "%zu of %zu receipts refused: their lease is gone (taken over by another "
                 "relay, whose receipt stands, or a claim lost in a store crash: they are "
                 "claimed again and the stream's duplicate settles them)",
                 nr - applied, nr);
    }
    for (size_t i = 0; i < n; i++)
        if (b->slots[i].fate == FATE_RECEIPT && b->slots[i].past_window)
            jsd__relay_horizon_on_receipt(r, &b->slots[i], &b->eb.items[i]);
    if (!r->o.on_published)
        return;
    for (size_t i = 0; i < n; i++) {
        const slot *sl = &b->slots[i];
        const jsd__claimed *e = &b->eb.items[i];
        if (sl->fate != FATE_RECEIPT)
            continue;
        jsd_relay_published p = {.owner = e->owner,
                                 .id = e->effect_id,
                                 .msg_id = e->msg_id,
                                 .subject = e->subject,
                                 .stream = sl->stream,
                                 .seq = sl->seq,
                                 .duplicate = sl->duplicate,
                                 .acked_mono_us = sl->acked_us};
        r->o.on_published(&p, r->o.on_published_user);
    }
}

/* The failures (each an attempt, or a dead letter) and the releases of what
 * was never sent. */
static void record_rest(jsd_relay *r, jsd_store *ws, rbatch *b, const outcome *o)
{
    if (o->nf) {
        size_t applied = 0, dead = 0;
        jsd_status s =
            jsd__store_record_failures(ws, b->token, o->fl, o->nf, &r->backoff, r->o.attempt_budget,
                                       jsd__now_ms(), &applied, &dead);
        if (s != JSD_OK) {
            jsd__relay_store_trouble_on(r, ws, "record failures");
        } else {
            jsd__relay_count(r, RC_ERRORS, applied);
            jsd__relay_count(r, RC_DEAD, dead);
            if (applied < o->nf)
                jsd__relay_count(r, RC_LEASE_LOST, o->nf - applied);
            JSD_WARN(COMP, "%zu publication(s) failed (first: %s)%s", o->nf, o->fl[0].error,
                     dead ? "; some reached their attempt budget and were dead-lettered" : "");
            if (dead)
                JSD_WARN(COMP, "%zu effect(s) dead-lettered", dead);
        }
    }
    if (o->nrel) {
        size_t released = 0;
        if (jsd__store_release(ws, b->token, o->rel, o->nrel, &released) != JSD_OK)
            jsd__relay_store_trouble_on(r, ws, "release leases");
    }
}

/* Write the outcome of n batches whose publications are all settled (the
 * caller holds store_mu when holds_store_mu says so). The receipts of all n
 * are committed first, one transaction per batch, then made durable with
 * one sync (DESIGN 7, 8): the writer found them queued together, and each
 * sync is a disk flush. Only then does any of them count as written. When
 * the sync fails, each batch's receipts are written again, durable at
 * once. The statement is idempotent: a receipt that did survive is refused
 * as one already recorded, so the first answer's count stands (the larger
 * of the two; a receipt lost with its claim in a server crash is then
 * counted here and again when its effect is claimed and republished). */
static void finish_batches(jsd_relay *r, rbatch *const *bs, size_t n, bool holds_store_mu)
{
    jsd_store *ws = r->wstore ? r->wstore : r->store;
    outcome o[WRITE_GROUP_MAX];
    bool committed = false;
    for (size_t i = 0; i < n; i++) {
        outcome_sort(bs[i], &o[i]);
        if (o[i].ok && o[i].nr) {
            JSD_CRASH_POINT("relay.before_receipt_commit");
            commit_receipts(r, ws, bs[i], &o[i], false);
            committed |= o[i].receipts == JSD_OK;
        }
    }
    if (committed && !receipts_durable(r, ws, holds_store_mu)) {
        for (size_t i = 0; i < n; i++) {
            if (o[i].receipts != JSD_OK) /* none, or not committed */
                continue;
            size_t first = o[i].applied;
            commit_receipts(r, ws, bs[i], &o[i], true);
            o[i].applied = JSD_MAX(first, o[i].applied);
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (o[i].ok) {
            if (o[i].nr)
                receipts_done(r, ws, bs[i], &o[i]);
            record_rest(r, ws, bs[i], &o[i]);
        }
        outcome_free(&o[i]);
    }
}

/* ---- the receipt writer thread ------------------------------------------------------ */

static void *writer_main(void *arg)
{
    jsd_relay *r = arg;
    pthread_mutex_lock(&r->wq_mu);
    for (;;) {
        while (!r->wq_head && !r->wq_quit)
            pthread_cond_wait(&r->wq_cv, &r->wq_mu);
        if (!r->wq_head)
            break; /* quit, and nothing left */
        /* every batch queued by now, up to WRITE_GROUP_MAX */
        rbatch *bs[WRITE_GROUP_MAX];
        size_t k = 0, effects = 0;
        while (r->wq_head && k < WRITE_GROUP_MAX) {
            rbatch *b = r->wq_head;
            r->wq_head = b->next;
            bs[k++] = b;
            effects += b->eb.n;
        }
        if (!r->wq_head)
            r->wq_tail = NULL;
        r->wq_busy = true;
        pthread_mutex_unlock(&r->wq_mu);

        if (!r->wstore)
            pthread_mutex_lock(&r->store_mu);
        finish_batches(r, bs, k, !r->wstore);
        if (!r->wstore)
            pthread_mutex_unlock(&r->store_mu);
        for (size_t i = 0; i < k; i++)
            jsd__relay_batch_recycle(r, bs[i]);

        pthread_mutex_lock(&r->wq_mu);
        atomic_fetch_sub(&r->wq_effects, effects);
        atomic_fetch_add(&r->written, k);
        r->wq_busy = false;
        pthread_cond_broadcast(&r->wq_idle_cv);
    }
    pthread_mutex_unlock(&r->wq_mu);
    return NULL;
}

/* Hand a settled batch to the writer (or write it here when there is no
 * writer thread). */
void jsd__relay_hand_over(jsd_relay *r, rbatch *b)
{
    b->next = NULL;
    if (!r->writer_running) {
        pthread_mutex_lock(&r->store_mu);
        finish_batches(r, &b, 1, true);
        pthread_mutex_unlock(&r->store_mu);
        jsd__relay_batch_recycle(r, b);
        atomic_fetch_add(&r->written, 1);
        return;
    }
    pthread_mutex_lock(&r->wq_mu);
    atomic_fetch_add(&r->wq_effects, b->eb.n);
    if (r->wq_tail)
        r->wq_tail->next = b;
    else
        r->wq_head = b;
    r->wq_tail = b;
    pthread_cond_signal(&r->wq_cv);
    pthread_mutex_unlock(&r->wq_mu);
}

bool jsd__relay_writer_wait(jsd_relay *r, int ms)
{
    if (!r->writer_running)
        return true;
    int64_t end = jsd__mono_ms() + ms;
    pthread_mutex_lock(&r->wq_mu);
    while (r->wq_head || r->wq_busy) {
        if (ms < 0)
            pthread_cond_wait(&r->wq_idle_cv, &r->wq_mu);
        else if (!jsd__cond_wait_until_ms(&r->wq_idle_cv, &r->wq_mu, end))
            break;
    }
    bool idle = !r->wq_head && !r->wq_busy;
    pthread_mutex_unlock(&r->wq_mu);
    return idle;
}

void jsd__relay_writer_start(jsd_relay *r)
{
    r->wq_quit = false;
    r->writer_running = pthread_create(&r->writer, NULL, writer_main, r) == 0;
    if (!r->writer_running)
        JSD_WARN(COMP, "cannot start the receipt writer thread; writing receipts inline");
}

void jsd__relay_writer_stop(jsd_relay *r)
{
    if (!r->writer_running)
        return;
    pthread_mutex_lock(&r->wq_mu);
    r->wq_quit = true;
    pthread_cond_signal(&r->wq_cv);
    pthread_mutex_unlock(&r->wq_mu);
    pthread_join(r->writer, NULL);
    r->writer_running = false;
}
