/*
 * relay_gauge — the relay's backlog gauges (jsd_outbox_backlog,
 * jsd_outbox_oldest_unpublished_age_seconds, jsd_outbox_failing), refreshed every
 * JSD__GAUGES_EVERY_MS (longer when counting is slow, below) on a thread
 * and a store connection of their own.
 *
 * Counting the pending effects reads every one of them (O(backlog): about
 * 30 ms per 100k on SQLite and 100 ms on PostgreSQL, issue 12). On the
 * publishing thread's connection, under store_mu, that count stopped
 * claims each time: 4-5 % of a bench_relay run of 100k effects, and a
 * pause of a second every five with a million pending. The gauge thread
 * counts on a second handle (jsd__store_open_reader; on SQLite in WAL mode
 * a reader holds up no writer), so claims and receipts go on meanwhile.
 * Without that handle (it could not be opened, or an SQLite ":memory:"
 * store, where a second connection is another database) the count stays
 * on the publishing thread, as before. The last refresh, when the run
 * stops, is made after this thread has ended (relay.c, gauges).
 *
 * The count comes every JSD__GAUGES_EVERY_MS, or JSD__GAUGES_COST_X times
 * as long as the last one took when that is longer, so that counting
 * takes at most 1/20 of the store's time whatever the backlog. The count
 * grows with it: 200k pending effects took ~60 ms of CPU on SQLite (4.7 %
 * of the samples of a 1.5 s bench_relay run, perf, issue 12), so a backlog
 * of millions, as after an outage, would be counted for about a second of
 * every five (PostgreSQL more) just when the relay needs the store most.
 */
#include "relay_int.h"
#include "store/store.h"

int64_t jsd__relay_gauge_interval_ms(int64_t count_ms)
{
    if (count_ms >= JSD__GAUGES_EVERY_MS / JSD__GAUGES_COST_X)
        return count_ms * JSD__GAUGES_COST_X;
    return JSD__GAUGES_EVERY_MS;
}

int64_t jsd__relay_backlog_refresh(jsd_relay *r, jsd_store *st, pthread_mutex_t *mu)
{
    jsd_store_stats stats;
    if (mu)
        pthread_mutex_lock(mu);
    int64_t t0 = jsd__mono_ms();
    jsd_status s = jsd__store_backlog(st, jsd__now_ms(), &stats);
    jsd__outbox_trouble trouble = {0};
    /* the failing count reads the attempted rows' partial indexes only */
    if (s == JSD_OK)
        s = jsd__store_outbox_trouble(st, &trouble);
    int64_t took = jsd__mono_ms() - t0;
    if (s != JSD_OK)
        jsd__relay_store_trouble_on(r, st, "backlog for metrics");
    if (mu)
        pthread_mutex_unlock(mu);
    if (s == JSD_OK) {
        jsd_gauge_set(r->mstd->outbox_backlog, (double)stats.backlog);
        jsd_gauge_set(r->mstd->outbox_oldest_age, (double)stats.oldest_due_age_ms / 1000.0);
        jsd_gauge_set(r->mstd->outbox_failing, (double)trouble.failing);
    }
    return t0 + jsd__relay_gauge_interval_ms(took);
}

static void *gauge_main(void *arg)
{
    jsd_relay *r = arg;
    pthread_mutex_lock(&r->gauge_mu);
    while (!r->gauge_quit) {
        pthread_mutex_unlock(&r->gauge_mu);
        int64_t until = jsd__relay_backlog_refresh(r, r->gstore, NULL);
        pthread_mutex_lock(&r->gauge_mu);
        while (!r->gauge_quit && jsd__mono_ms() < until)
            jsd__cond_wait_ms(&r->gauge_cv, &r->gauge_mu, (int)(until - jsd__mono_ms()));
    }
    pthread_mutex_unlock(&r->gauge_mu);
    return NULL;
}

void jsd__relay_gauge_start(jsd_relay *r)
{
    if (!r->mstd || !r->gstore || r->gauge_running)
        return;
    r->gauge_quit = false;
    r->gauge_running = pthread_create(&r->gauge_thread, NULL, gauge_main, r) == 0;
    if (!r->gauge_running)
        JSD_WARN(COMP, "cannot start the backlog gauge thread; counting on the publishing thread");
}

void jsd__relay_gauge_stop(jsd_relay *r)
{
    if (!r->gauge_running)
        return;
    pthread_mutex_lock(&r->gauge_mu);
    r->gauge_quit = true;
    pthread_cond_signal(&r->gauge_cv);
    pthread_mutex_unlock(&r->gauge_mu);
    pthread_join(r->gauge_thread, NULL);
    r->gauge_running = false;
}
