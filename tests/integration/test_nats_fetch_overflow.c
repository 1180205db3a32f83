/*
 * The consumer's fetch path against the heap overflow of nats.c 3.4.1's
 * _fetch (fixed upstream by nats.c PR #749, released in 3.9; the workaround
 * and the reasoning are in src/consumer_fetch.c): when more than half a batch
 * already sits in the pull subscription, _fetch's second loop never ends by
 * count and writes every further message past the end of its Batch slots.
 * The state is built on purpose against the real nats-server: the fetcher
 * thread is stopped, a raw pull request (reply = the subscription's inbox)
 * puts 9 messages into the subscription unfetched, a second raw request waits
 * on the server as a stale one would, the fetcher starts again with batch 10,
 * and 21 more messages are published once its fetch is under way: the fetch
 * must hand out batches of at most 10 and every message is applied once.
 * A second case adds the 408 of the first request's expiry to the 9 pending
 * messages: it is what rules out sizing the fetch from the pending count.
 * Without the workaround _fetch writes 30 messages into its 10 slots and
 * returns Count 30. Under the sanitizer build (`make check-asan`) ASan
 * reports a heap-buffer-overflow on the 80-byte array "allocated by ...
 * in _fetch": libnats itself is not instrumented, so its own writes go
 * unseen and the report comes at the first read past the end, in
 * jsd__fetch_batch. In the normal build the process aborts with glibc's
 * "malloc(): corrupted top size", as in the chaos run that found it (or, if
 * the heap survives, the max_batch check fails). SQLite only: the store
 * plays no part in the fetch.
 */
#include "consumer_int.h"
#include "consumer_env.h"

static jsd_disposition sink(jsd_tx *tx, const jsd_delivery *d, void *user)
{
    char sql[128];
    (void)user;
    snprintf(sql, sizeof(sql), "INSERT INTO effects(seq) VALUES (%llu)",
             (unsigned long long)jsd_delivery_stream_seq(d));
    if (!cenv_tx_exec(tx, sql))
        return jsd_disposition_retry(0, "insert failed");
    return jsd_disposition_commit();
}

static int pending_msgs(jsd_consumer *c)
{
    int n = -1;
    if (natsSubscription_GetPending(c->sub, &n, NULL) != NATS_OK)
        return -1;
    return n;
}

static bool slot_full(jsd_consumer *c)
{
    pthread_mutex_lock(&c->fmu);
    bool full = c->slot_full;
    pthread_mutex_unlock(&c->fmu);
    return full;
}

/* first_pull puts the 9 messages into the subscription; want_pending is
 * what the subscription then holds (9, or 10 with a status message). */
static void overflow_case(const char *first_pull, int want_pending)
{
    cenv e;
    cenv_up(&e, false);
    cenv_store_exec(e.store, "CREATE TABLE effects(seq BIGINT)");
    cenv_durable(&e, 60000, 6, 1024, NULL, 0);
    jsd_consumer_opts o;
    jsd_consumer_opts_init(&o);
    o.batch = 10;
    o.fetch_wait_ms = 2000; /* a long fetch: the broken loop collects until it ends */
    jsd_consumer *c = cenv_consumer(&e, &o);
    ASSERT_EQ(c->batch, 10);

    /* Stop the fetcher and let its last pull request expire on the server
     * (its 408 may stay in the subscription: a status message, as in life). */
    jsd__fetch_stop(c);
    ASSERT_WAIT(cenv_waiting(&e) == 0, 10000);

    /* 9 messages (> batch/2) pending in the subscription, never fetched. */
    cenv_publish(&e, 1, 9, NULL);
    cenv_raw_pull(&e, natsSubscription_GetSubject(c->sub), first_pull);
    ASSERT_WAIT(cenv_ack_pending(&e) == 9 && pending_msgs(c) >= want_pending, 10000);
    ASSERT_WAIT(cenv_waiting(&e) == 0, 10000);

    /* A stale request that will deliver into the same inbox later. */
    cenv_raw_pull(&e, natsSubscription_GetSubject(c->sub),
                  "{\"batch\":40,\"expires\":20000000000}");
    ASSERT_WAIT(cenv_waiting(&e) == 1, 10000);

    /* The fetch starts with the 9 pending. Without the workaround it takes
     * them and asks the server for 1 more (a second waiting request); with
     * it, it hands the 9 out without asking. Either way the fetch is past
     * its first loop before anything more is published. */
    ASSERT_EQ(jsd__fetch_start(c), 0);
    ASSERT_WAIT(cenv_waiting(&e) == 2 || slot_full(c), 10000);

    /* 21 more: one for the fetch's own request (if it sent one), the rest
     * through the stale request into the inbox the fetch is reading. */
    cenv_publish(&e, 10, 21, NULL);

    jsd_consumer_stats s;
    int64_t end = jsd_test_mono_ms() + 20000;
    do {
        jsd_status st = jsd_consumer_poll(c, sink, NULL, NULL);
        if (st != JSD_OK)
            fail_msg("poll: %s: %s", jsd_status_name(st), jsd_consumer_errmsg(c));
        jsd_consumer_stats_get(c, &s);
    } while (s.committed < 30 && jsd_test_mono_ms() < end);

    ASSERT_U64_LE(s.max_batch, 10); /* never more than the batch's slots */
    ASSERT_U64_EQ(s.committed, 30);
    ASSERT_U64_EQ(s.duplicates, 0);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM effects"), 30);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(DISTINCT seq) FROM effects"), 30);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT MAX(seq) FROM effects"), 30);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* 9 of a batch of 10 pending. */
static void pending_over_half_batch(void **state)
{
    (void)state;
    overflow_case("{\"batch\":9,\"no_wait\":true}", 9);
}

/* 9 messages and the 408 of their request's expiry pending: _fetch drops the
 * status message without counting it, so sizing the fetch from the pending
 * count (10) would still leave 9 of 10 taken and overflow. */
static void pending_with_status_message(void **state)
{
    (void)state;
    overflow_case("{\"batch\":10,\"expires\":300000000}", 10);
}

JSD_TEST_MAIN(cmocka_unit_test(pending_over_half_batch),
              cmocka_unit_test(pending_with_status_message))
