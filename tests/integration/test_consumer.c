/*
 * Durable ingress against a real nats-server and both store back ends
 * (IN-1..5, DLQ-1,2): commit-then-ACK with a confirmed ACK, a failed commit
 * that never ACKs, handler retry with its delay, progress past ack_wait, the
 * max_ack_pending bound, drain, poison on first delivery, parking at
 * max_deliver, the inbox answering redeliveries, and the configuration guard.
 * Effects tables have no unique key: only the inbox keeps them once-only.
 */
#include <pthread.h>

#include "consumer_int.h"
#include "store/store.h"
#include "consumer_env.h"

typedef struct hctx {
    cenv *e;
    jsd_consumer *c;
    int calls;
    int fail_commit_left; /* make the batch's COMMIT fail this many times */
    int retry_left;       /* return retry this many times */
    int64_t retry_delay_ms;
    int always_retry;
    int sleep_ms;       /* slow handler, with progress every 200 ms */
    int sleep_quiet_ms; /* slow handler that never calls progress */
    bool drain_on_first;
    int64_t first_at_ms[64], second_at_ms[64];
    uint64_t seen_deliveries[64];
    int64_t max_ack_pending_seen;
    bool check_pending;
    const char *poison_reason;
} hctx;

static void effects_table(cenv *e)
{
    cenv_store_exec(e->store, "CREATE TABLE effects(seq BIGINT, body TEXT)");
    cenv_store_exec(e->store, "CREATE TABLE parent(id BIGINT PRIMARY KEY)");
    cenv_store_exec(e->store, "CREATE TABLE child(pid BIGINT REFERENCES parent(id) DEFERRABLE "
                              "INITIALLY DEFERRED)");
}

/* The suite's set-up: the fixtures, the effects tables and a durable with
 * the given ack wait and delivery limit (max_ack_pending 1024, no backoff). */
static void suite_up(cenv *e, bool pg, int64_t ack_wait_ms, int max_deliver)
{
    cenv_up(e, pg);
    effects_table(e);
    cenv_durable(e, ack_wait_ms, max_deliver, 1024, NULL, 0);
}

static jsd_disposition sink(jsd_tx *tx, const jsd_delivery *d, void *user)
{
    hctx *h = user;
    char sql[256];
    size_t len = 0;
    const char *p = jsd_delivery_payload(d, &len);
    uint64_t seq = jsd_delivery_stream_seq(d);
    h->calls++;
    if (seq < 64) {
        if (h->first_at_ms[seq] == 0)
            h->first_at_ms[seq] = jsd_test_mono_ms();
        else if (h->second_at_ms[seq] == 0)
            h->second_at_ms[seq] = jsd_test_mono_ms();
        h->seen_deliveries[seq] = jsd_delivery_deliveries(d);
    }
    if (h->drain_on_first && h->calls == 1)
        jsd_consumer_begin_drain(h->c);
    if (h->check_pending) {
        jsConsumerInfo *ci = cenv_info(h->e);
        if (ci && ci->NumAckPending > h->max_ack_pending_seen)
            h->max_ack_pending_seen = ci->NumAckPending;
        jsConsumerInfo_Destroy(ci);
    }
    if (h->sleep_quiet_ms)
        jsd_test_sleep_ms(h->sleep_quiet_ms);
    for (int slept = 0; slept < h->sleep_ms; slept += 200) {
        jsd_test_sleep_ms(200);
        if (jsd_delivery_progress(d) != JSD_OK)
            return jsd_disposition_retry(0, "progress failed");
    }
    snprintf(sql, sizeof(sql), "INSERT INTO effects(seq, body) VALUES (%llu, '%.*s')",
             (unsigned long long)seq, (int)(len < 60 ? len : 60), p ? p : "");
    if (!cenv_tx_exec(tx, sql))
        return jsd_disposition_retry(0, "insert failed");
    if (h->poison_reason)
        return jsd_disposition_poison(h->poison_reason);
    if (h->always_retry)
        return jsd_disposition_retry(h->retry_delay_ms, "always failing");
    if (h->retry_left > 0) {
        h->retry_left--;
        return jsd_disposition_retry(h->retry_delay_ms, "try again later");
    }
    if (h->fail_commit_left > 0) {
        h->fail_commit_left--;
        /* A deferred foreign key: the statement succeeds, the COMMIT fails. */
        if (!cenv_tx_exec(tx, "INSERT INTO child(pid) VALUES (424242)"))
            return jsd_disposition_retry(0, "could not arm the failing commit");
    }
    return jsd_disposition_commit();
}

static long long effects(cenv *e)
{
    return cenv_store_scalar(e->store, "SELECT COUNT(*) FROM effects");
}

static long long distinct_effects(cenv *e)
{
    return cenv_store_scalar(e->store, "SELECT COUNT(DISTINCT seq) FROM effects");
}

/* Poll until cond or the deadline. */
#define POLL_UNTIL(c, h, cond, ms) CENV_POLL_UNTIL(jsd_consumer_poll, c, sink, h, cond, ms)

/* ---- commit, then a confirmed ACK ------------------------------------------------------ */
static void commit_then_confirmed_ack(bool pg)
{
    cenv e;
    hctx h = {0};
    suite_up(&e, pg, 30000, 6);
    cenv_publish(&e, 1, 300, NULL);
    h.e = &e;
    jsd_consumer *c = cenv_consumer(&e, NULL);
    jsd_consumer_stats s;
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.committed >= 300), 20000);
    ASSERT_EQ(effects(&e), 300);
    ASSERT_EQ(distinct_effects(&e), 300);
    /* the last batch's confirmations are collected by the next poll */
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.acked >= 300), 5000);
    ASSERT_EQ(s.acked, 300);
    ASSERT_EQ(s.ack_unconfirmed, 0);
    ASSERT_EQ(s.duplicates, 0);
    ASSERT_TRUE(s.max_batch > 1); /* batched, not one at a time */
    /* The server agrees: nothing pending, nothing awaiting an ACK, no redelivery. */
    jsConsumerInfo *ci = cenv_info(&e);
    ASSERT_TRUE(ci != NULL);
    ASSERT_EQ(ci->NumAckPending, 0);
    ASSERT_EQ(ci->NumPending, 0);
    ASSERT_EQ(ci->NumRedelivered, 0);
    ASSERT_EQ(ci->AckFloor.Stream, 300);
    jsConsumerInfo_Destroy(ci);
    /* The inbox holds every delivery identity. */
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM jsd_inbox"), 300);
    /* Counted in the process-wide metrics registry. */
    double v = 0;
    ASSERT_OK(jsd_metrics_get(jsd_metrics_default(), "jsd_deliveries_total", "commit", &v));
    ASSERT_EQ((long long)v, 300);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* ---- a failed commit never ACKs; the redelivery is applied once ------------------------- */
static void failed_commit_no_ack(bool pg)
{
    cenv e;
    hctx h = {0};
    suite_up(&e, pg, 30000, 6);
    cenv_publish(&e, 1, 10, NULL);
    h.e = &e;
    h.fail_commit_left = 1;
    jsd_consumer_opts o;
    jsd_consumer_opts_init(&o);
    o.retry_delay_ms = 1500;
    jsd_consumer *c = cenv_consumer(&e, &o);
    jsd_consumer_stats s;
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.commit_failures >= 1), 10000);
    jsd_consumer_stats_get(c, &s);
    ASSERT_EQ(s.acked, 0);
    ASSERT_EQ(s.committed, 0);
    ASSERT_EQ(effects(&e), 0);
    /* Not ACKed: the server still holds them (NAKed with a delay). */
    jsConsumerInfo *ci = cenv_info(&e);
    ASSERT_EQ(ci->AckFloor.Stream, 0);
    jsConsumerInfo_Destroy(ci);
    int64_t t0 = jsd_test_mono_ms();
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.committed >= 10), 15000);
    /* The NAK's delay held them back (a plain NAK would redeliver at once). */
    ASSERT_TRUE(jsd_test_mono_ms() - t0 >= 1000);
    ASSERT_EQ(effects(&e), 10);
    ASSERT_EQ(distinct_effects(&e), 10);
    ASSERT_EQ(h.seen_deliveries[1], 2);
    ASSERT_WAIT(cenv_settled(&e), 5000);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* ---- the inbox answers a redelivery of a committed delivery ------------------------------ */
static void redelivery_hits_inbox(bool pg)
{
    cenv e;
    hctx h = {0};
    suite_up(&e, pg, 1000, 6);
    cenv_publish(&e, 1, 5, NULL);
    /* The state a crash right after COMMIT leaves: deliveries taken, their
     * effects and inbox rows committed, no ACK sent. */
    natsSubscription *sub = NULL;
    jsSubOptions so;
    jsErrCode jerr = 0;
    natsMsgList list = {0};
    jsSubOptions_Init(&so);
    so.Stream = e.stream;
    so.Consumer = e.durable;
    ASSERT_EQ(js_PullSubscribe(&sub, e.js, NULL, e.durable, NULL, &so, &jerr), NATS_OK);
    ASSERT_EQ(natsSubscription_Fetch(&list, sub, 5, 2000, &jerr), NATS_OK);
    ASSERT_EQ(list.Count, 5);
    jsd_tx *tx = NULL;
    ASSERT_OK(jsd_tx_begin(&tx, e.store));
    for (int i = 0; i < list.Count; i++) {
        jsMsgMetaData *md = NULL;
        char sql[128];
        ASSERT_EQ(natsMsg_GetMetaData(&md, list.Msgs[i]), NATS_OK);
        snprintf(sql, sizeof(sql), "INSERT INTO effects(seq, body) VALUES (%llu, 'x')",
                 (unsigned long long)md->Sequence.Stream);
        ASSERT_TRUE(cenv_tx_exec(tx, sql));
        ASSERT_OK(jsd__tx_inbox_insert(tx, e.stream, e.durable, md->Sequence.Stream, NULL, 1, NULL,
                                       NULL));
        jsMsgMetaData_Destroy(md);
    }
    ASSERT_OK(jsd_tx_commit(tx));
    natsMsgList_Destroy(&list);
    natsSubscription_Destroy(sub);

    h.e = &e;
    jsd_consumer *c = cenv_consumer(&e, NULL);
    jsd_consumer_stats s;
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.duplicates >= 5), 15000);
    ASSERT_EQ(h.calls, 0); /* the handler never ran again */
    jsd_consumer_stats_get(c, &s);
    ASSERT_EQ(s.committed, 0);
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.acked >= 5), 5000);
    ASSERT_EQ(s.acked, 5); /* only the ACK was repeated */
    ASSERT_EQ(effects(&e), 5);
    ASSERT_WAIT(cenv_settled(&e), 5000);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* ---- retry honours its delay; its work is undone ------------------------------------- */
static void retry_honours_delay(bool pg)
{
    cenv e;
    hctx h = {0};
    suite_up(&e, pg, 30000, 6);
    cenv_publish(&e, 1, 1, NULL);
    h.e = &e;
    h.retry_left = 1;
    h.retry_delay_ms = 1500;
    jsd_consumer *c = cenv_consumer(&e, NULL);
    jsd_consumer_stats s;
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.retried >= 1), 10000);
    ASSERT_EQ(effects(&e), 0); /* the retried handler's insert was rolled back */
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.committed >= 1), 10000);
    int64_t gap = h.second_at_ms[1] - h.first_at_ms[1];
    if (gap < 1400)
        fail_msg("redelivered after %lld ms, asked for 1500", (long long)gap);
    ASSERT_EQ(h.seen_deliveries[1], 2);
    ASSERT_EQ(effects(&e), 1);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* ---- progress keeps a slow delivery past ack_wait ------------------------------------- */
static void progress_extends_ack_wait(bool pg)
{
    cenv e;
    hctx h = {0};
    suite_up(&e, pg, 1000, 6);
    cenv_publish(&e, 1, 1, NULL);
    h.e = &e;
    h.sleep_ms = 3000; /* three ack waits */
    jsd_consumer *c = cenv_consumer(&e, NULL);
    jsd_consumer_stats s;
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.committed >= 1), 15000);
    /* the last batch's confirmations are collected by the next poll */
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.acked >= 1), 5000);
    ASSERT_EQ(s.acked, 1);
    ASSERT_EQ(h.seen_deliveries[1], 1);
    jsConsumerInfo *ci = cenv_info(&e);
    ASSERT_EQ(ci->NumRedelivered, 0);
    ASSERT_EQ(ci->Delivered.Consumer, 1); /* delivered once, never again */
    jsConsumerInfo_Destroy(ci);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* ---- a batch slower than ack_wait is kept alive, not redelivered ------------------------- */
static void slow_batch_kept_alive(bool pg)
{
    cenv e;
    hctx h = {0};
    suite_up(&e, pg, 1000, 6);
    cenv_publish(&e, 1, 6, NULL);
    h.e = &e;
    h.sleep_quiet_ms = 500; /* 6 x 500 ms: three ack waits for the last one */
    jsd_consumer_opts o;
    jsd_consumer_opts_init(&o);
    o.batch = 6;
    jsd_consumer *c = cenv_consumer(&e, &o);
    jsd_consumer_stats s;
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.committed >= 6), 15000);
    /* Whatever was redelivered meanwhile would show up now as duplicates. */
    for (int64_t end = jsd_test_mono_ms() + 1500; jsd_test_mono_ms() < end;)
        ASSERT_OK(jsd_consumer_poll(c, sink, &h, NULL));
    jsd_consumer_stats_get(c, &s);
    ASSERT_EQ(s.duplicates, 0);
    ASSERT_EQ(s.fetched, 6);
    for (int k = 1; k <= 6; k++)
        ASSERT_EQ(h.seen_deliveries[k], 1);
    ASSERT_EQ(h.calls, 6);
    ASSERT_WAIT(cenv_settled(&e), 5000);
    jsConsumerInfo *ci = cenv_info(&e);
    ASSERT_EQ(ci->Delivered.Consumer, 6); /* nothing was delivered twice */
    jsConsumerInfo_Destroy(ci);
    ASSERT_EQ(effects(&e), 6);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* ---- in flight: the consumer's own bound, below the durable's ---------------------------
 * The durable allows 64 deliveries in flight; the consumer promises at most
 * its batch in hand plus one batch pulled ahead, and an automatic batch of
 * half the durable's max_ack_pending. Both bounds are the library's: the
 * server would hand out more. */
static void in_flight_bounded(bool pg)
{
    cenv e;
    hctx h = {0};
    cenv_up(&e, pg);
    effects_table(&e);
    cenv_durable(&e, 30000, 6, 64, NULL, 0);
    cenv_publish(&e, 1, 60, NULL);
    h.e = &e;
    h.sleep_quiet_ms = 5; /* slow enough that the fetcher pulls ahead */
    jsd_consumer_opts o;
    jsd_consumer_opts_init(&o);
    o.batch = 5;
    jsd_consumer *c = cenv_consumer(&e, &o);
    jsd_consumer_stats s;
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.committed >= 60), 30000);
    jsd_consumer_stats_get(c, &s);
    ASSERT_LE(s.max_batch, 5);
    ASSERT_TRUE(s.max_in_flight >= s.max_batch);
    ASSERT_LE(s.max_in_flight, 10);
    ASSERT_EQ(effects(&e), 60);
    ASSERT_EQ(distinct_effects(&e), 60);
    jsd_consumer_destroy(c);
    cenv_down(&e);

    /* Automatic batch: half of the durable's 16, although a fetch may take 16. */
    hctx h2 = {0};
    cenv_up(&e, pg);
    effects_table(&e);
    cenv_durable(&e, 30000, 6, 16, NULL, 0);
    cenv_publish(&e, 1, 40, NULL);
    h2.e = &e;
    c = cenv_consumer(&e, NULL);
    POLL_UNTIL(c, &h2, (jsd_consumer_stats_get(c, &s), s.committed >= 40), 30000);
    jsd_consumer_stats_get(c, &s);
    ASSERT_LE(s.max_batch, 8);
    ASSERT_LE(s.max_in_flight, 16);
    ASSERT_EQ(effects(&e), 40);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* ---- the connection's max_pending_bytes bounds the durable's subscription ---------------
 * A consumer on a connection whose max_pending_bytes is 3000. Its fetcher is
 * stopped and one pull request for 10 messages of 1000 bytes is answered into
 * its subscription by hand, with nobody taking from it: the client keeps what
 * fits the 3000 bytes and drops the rest (with the 64 MiB default it would
 * keep all 10). The fetcher is started again: the kept ones are applied, the
 * dropped ones come back after the ack wait, and every message of the 20 is
 * applied once. (Taking the drops from live fetches raced the client's reader
 * thread against the fetch, which often took the messages fast enough for
 * none to be dropped.) */
static void pending_bytes_applied(bool pg)
{
    cenv e;
    hctx h = {0};
    suite_up(&e, pg, 1000, 20);
    jsd_conn_opts co;
    jsd_conn *small = NULL;
    jsd_error err;
    jsd_conn_opts_init(&co);
    co.servers = jsd_fx_shared_nats_url();
    co.max_pending_bytes = 3000;
    jsd_error_clear(&err);
    ASSERT_OK_E(jsd_conn_open(&small, &co, &err), err.msg);
    jsd_consumer_opts o;
    jsd_consumer_opts_init(&o);
    o.stream = e.stream;
    o.durable = e.durable;
    o.batch = 10;
    o.fetch_wait_ms = 200;
    o.inbox_retention_ms = 0;
    jsd_consumer *c = NULL;
    ASSERT_OK_E(jsd_consumer_create(&c, e.store, small, &o, &err), err.msg);
    jsd__fetch_stop(c);
    ASSERT_WAIT(cenv_waiting(&e) == 0, 10000);

    static char body[1000];
    memset(body, 'p', sizeof(body));
    for (int k = 0; k < 20; k++) {
        char id[32];
        snprintf(id, sizeof(id), "pb-%d", k);
        cenv_publish_raw(&e, "pb", body, (int)sizeof(body), NULL, id);
    }
    cenv_raw_pull(&e, natsSubscription_GetSubject(c->sub), "{\"batch\":10,\"no_wait\":true}");
    int kept = 0;
    int64_t dropped = 0;
    ASSERT_WAIT(
        cenv_ack_pending(&e) == 10 && natsSubscription_GetPending(c->sub, &kept, NULL) == NATS_OK &&
            natsSubscription_GetDropped(c->sub, &dropped) == NATS_OK && kept + dropped == 10,
        10000);
    ASSERT_TRUE(kept >= 1 && kept <= 3);
    ASSERT_TRUE(dropped >= 7);

    ASSERT_EQ(jsd__fetch_start(c), 0);
    h.e = &e;
    int64_t end = jsd_test_mono_ms() + 30000;
    while (distinct_effects(&e) < 20 && jsd_test_mono_ms() < end)
        jsd_consumer_poll(c, sink, &h, NULL);
    ASSERT_EQ(effects(&e), 20);
    ASSERT_EQ(distinct_effects(&e), 20);
    int redelivered = 0;
    for (int k = 1; k <= 20; k++)
        redelivered += h.seen_deliveries[k] >= 2;
    ASSERT_TRUE(redelivered >= (int)dropped);
    jsd_consumer_destroy(c);
    jsd_conn_close(small);
    cenv_down(&e);
}

/* ---- drain: no new fetch, the batch in hand is still applied and settled -------------- */
static void drain_settles_batch_in_hand(bool pg)
{
    cenv e;
    hctx h = {0};
    suite_up(&e, pg, 30000, 6);
    cenv_publish(&e, 1, 30, NULL);
    h.e = &e;
    h.drain_on_first = true;
    jsd_consumer_opts o;
    jsd_consumer_opts_init(&o);
    o.batch = 10;
    jsd_consumer *c = cenv_consumer(&e, &o);
    h.c = c;
    ASSERT_OK(jsd_consumer_run(c, sink, &h, false)); /* returns once drained */
    jsd_consumer_stats s;
    jsd_consumer_stats_get(c, &s);
    ASSERT_EQ(s.batches, 1);
    ASSERT_EQ(s.committed, 10);
    ASSERT_EQ(s.acked, 10);
    ASSERT_EQ(effects(&e), 10);
    ASSERT_STATUS(jsd_consumer_poll(c, sink, &h, NULL), JSD_ERR_STOPPED);
    ASSERT_EQ(h.calls, 10);
    /* Only the batch in hand was ACKed... */
    jsConsumerInfo *ci = cenv_info(&e);
    ASSERT_EQ(ci->AckFloor.Stream, 10);
    jsConsumerInfo_Destroy(ci);
    /* ...and what the fetcher had pulled ahead was given back: a new consumer
     * gets the other 20. */
    jsd_consumer_destroy(c);
    hctx h2 = {0};
    h2.e = &e;
    c = cenv_consumer(&e, NULL);
    POLL_UNTIL(c, &h2, (jsd_consumer_stats_get(c, &s), s.committed >= 20), 10000);
    ASSERT_EQ(effects(&e), 30);
    ASSERT_EQ(distinct_effects(&e), 30);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* ---- poison on first delivery ------------------------------------------------------------ */
static void check_one_death(cenv *e, const char *reason, uint64_t stream_seq)
{
    ASSERT_EQ(cenv_stream_msgs(e, e->dlq_stream), 1);
    jsd_dead_letter d;
    jsd_error err;
    jsd_error_clear(&err);
    ASSERT_OK_E(jsd_dlq_get(e->conn, e->dlq_stream, 1, &d, &err), err.msg);
    ASSERT_STREQ(d.reason, reason);
    ASSERT_STREQ(d.stream, e->stream);
    ASSERT_STREQ(d.consumer, e->durable);
    ASSERT_EQ(d.stream_seq, stream_seq);
    ASSERT_TRUE(d.deliveries >= 1);
    ASSERT_TRUE(strlen(d.time) >= 20);
    char subj[128];
    snprintf(subj, sizeof(subj), "%s.bad", e->prefix);
    ASSERT_STREQ(d.subject, subj);
    jsd_dead_letter_clear(&d);
}

static void poison_on_first_delivery(bool pg)
{
    cenv e;
    hctx h = {0};
    suite_up(&e, pg, 1000, 6);
    static const char body[] = "{\"a\": [1, 2,"; /* malformed */
    cenv_publish_raw(&e, "bad", body, (int)sizeof(body) - 1, "order.created", "bad-1");
    cenv_publish_raw(&e, "good", "{\"a\":1}", 7, "order.created", "good-1");
    cenv_publish_raw(&e, "bad", "{}", 2, "order.unknown", "bad-2");
    h.e = &e;
    const char *types[] = {"order.created"};
    jsd_consumer_opts o;
    jsd_consumer_opts_init(&o);
    o.accept_types = types;
    o.n_accept_types = 1;
    o.payload_format = JSD_PAYLOAD_JSON;
    jsd_consumer *c = cenv_consumer(&e, &o);
    jsd_consumer_stats s;
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.poisoned >= 2 && s.committed >= 1), 10000);
    ASSERT_EQ(h.calls, 1); /* the handler never saw the poison */
    ASSERT_EQ(effects(&e), 1);
    ASSERT_EQ(cenv_stream_msgs(&e, e.dlq_stream), 2);
    /* Poison records with diagnostics and the original bytes. */
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM jsd_poison"), 2);
    jsd_dead_letter d;
    jsd_error err;
    ASSERT_OK_E(jsd_dlq_get(e.conn, e.dlq_stream, 1, &d, &err), err.msg);
    ASSERT_STREQ(d.reason, "poison");
    ASSERT_EQ(d.stream_seq, 1);
    ASSERT_EQ(d.deliveries, 1);
    ASSERT_CONTAINS(d.error, "malformed JSON");
    ASSERT_EQ(d.len, sizeof(body) - 1);
    ASSERT_TRUE(memcmp(d.payload, body, d.len) == 0); /* verbatim */
    ASSERT_STREQ(d.msg_id, "bad-1");
    jsd_dead_letter_clear(&d);
    ASSERT_OK_E(jsd_dlq_get(e.conn, e.dlq_stream, 2, &d, &err), err.msg);
    ASSERT_CONTAINS(d.error, "unsupported Jsd-Type \"order.unknown\"");
    jsd_dead_letter_clear(&d);
    /* TERMed: never redelivered, even after several ack waits. */
    jsd_test_sleep_ms(2500);
    int n = 0;
    ASSERT_OK(jsd_consumer_poll(c, sink, &h, &n));
    ASSERT_EQ(n, 0);
    jsConsumerInfo *ci = cenv_info(&e);
    ASSERT_EQ(ci->NumAckPending, 0);
    ASSERT_EQ(ci->NumRedelivered, 0);
    jsConsumerInfo_Destroy(ci);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* ---- a handler may declare poison too; its work is undone ------------------------------- */
static void handler_poison(bool pg)
{
    cenv e;
    hctx h = {0};
    suite_up(&e, pg, 1000, 6);
    cenv_publish_raw(&e, "bad", "x", 1, NULL, NULL);
    h.e = &e;
    h.poison_reason = "customer 7 does not exist";
    jsd_consumer *c = cenv_consumer(&e, NULL);
    jsd_consumer_stats s;
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.poisoned >= 1), 10000);
    ASSERT_EQ(effects(&e), 0);
    check_one_death(&e, "poison", 1);
    ASSERT_WAIT(cenv_settled(&e), 5000);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* ---- max_deliver: parked, ACKed after the dead-letter PubAck ------------------------------ */
static void max_deliver_parks(bool pg)
{
    cenv e;
    hctx h = {0};
    cenv_up(&e, pg);
    effects_table(&e);
    cenv_durable(&e, 1000, 3, 1024, NULL, 0); /* park after 2 failed attempts */
    cenv_publish_raw(&e, "bad", "payload-x", 9, NULL, "px");
    h.e = &e;
    h.always_retry = 1;
    h.retry_delay_ms = 200;
    jsd_consumer *c = cenv_consumer(&e, NULL);
    jsd_consumer_stats s;
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.parked >= 1), 15000);
    ASSERT_EQ(h.calls, 2);
    ASSERT_EQ(effects(&e), 0);
    check_one_death(&e, "max_deliver", 1);
    double v = 0;
    ASSERT_OK(jsd_metrics_get(jsd_metrics_default(), "jsd_deliveries_total", "deadletter", &v));
    ASSERT_EQ((long long)v, 1);
    ASSERT_OK(jsd_metrics_get(jsd_metrics_default(), "jsd_deliveries_total", "retry", &v));
    ASSERT_EQ((long long)v, 1);
    ASSERT_OK(jsd_metrics_get(jsd_metrics_default(), "jsd_dead_letters_total", NULL, &v));
    ASSERT_EQ((long long)v, 1);
    jsd_dead_letter d;
    jsd_error err;
    ASSERT_OK_E(jsd_dlq_get(e.conn, e.dlq_stream, 1, &d, &err), err.msg);
    ASSERT_EQ(d.deliveries, 2);
    ASSERT_CONTAINS(d.error, "always failing");
    ASSERT_EQ(d.len, 9);
    jsd_dead_letter_clear(&d);
    ASSERT_WAIT(cenv_settled(&e), 5000);
    jsConsumerInfo *ci = cenv_info(&e);
    ASSERT_EQ(ci->AckFloor.Stream, 1); /* ACKed, not TERMed */
    jsConsumerInfo_Destroy(ci);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* ---- configuration guard and dead-letter stream check ------------------------------------ */
static void config_guard(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    cenv_durable(&e, 30000, 6, 1024, NULL, 0);
    jsd_consumer_opts o;
    jsd_consumer *c = NULL;
    jsd_error err;
    jsd_consumer_opts_init(&o);
    o.stream = e.stream;
    o.durable = e.durable;
    /* 30 s x 6 = 180 s of possible redelivery */
    o.inbox_retention_ms = 179999;
    jsd_error_clear(&err);
    ASSERT_STATUS(jsd_consumer_create(&c, e.store, e.conn, &o, &err), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(err.msg, "shorter than the redelivery horizon 180000 ms");
    o.inbox_retention_ms = 180000;
    ASSERT_OK_E(jsd_consumer_create(&c, e.store, e.conn, &o, &err), err.msg);
    jsd_consumer_destroy(c);
    c = NULL;
    /* The stream's duplicate window (2 min by default) is a floor too. */
    snprintf(e.durable, sizeof(e.durable), "%s", jsd_test_unique("short"));
    cenv_durable(&e, 1000, 2, 1024, NULL, 0);
    o.durable = e.durable;
    o.dlq_subject = e.dlq_subject; /* keep the first durable's dead-letter subject */
    o.inbox_retention_ms = 60000;
    ASSERT_STATUS(jsd_consumer_create(&c, e.store, e.conn, &o, &err), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(err.msg, "duplicate window 120000 ms");
    /* A park threshold at or above the durable's max_deliver is refused. */
    o.inbox_retention_ms = 0;
    o.max_deliver = 2;
    ASSERT_STATUS(jsd_consumer_create(&c, e.store, e.conn, &o, &err), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(err.msg, "below the durable's max_deliver 2");
    o.max_deliver = 0;
    /* No stream captures the dead-letter subject: refused. */
    o.dlq_subject = "nowhere.dlq.x";
    ASSERT_STATUS(jsd_consumer_create(&c, e.store, e.conn, &o, &err), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(err.msg, "no stream captures the dead-letter subject \"nowhere.dlq.x\"");
    /* The consumed stream itself may not hold the dead letters. */
    char own[128];
    snprintf(own, sizeof(own), "%s.dlq", e.prefix);
    o.dlq_subject = own;
    ASSERT_STATUS(jsd_consumer_create(&c, e.store, e.conn, &o, &err), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(err.msg, "captured by the consumed stream");
    /* Limits, crossed. */
    o.durable = e.durable;
    o.dlq_subject = NULL;
    o.inbox_retention_ms = 0;
    o.batch = 4097;
    ASSERT_STATUS(jsd_consumer_create(&c, e.store, e.conn, &o, &err), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(err.msg, "batch 4097 outside 1..4096");
    o.batch = 4096;
    char long_type[258];
    memset(long_type, 't', 257);
    long_type[257] = '\0';
    const char *types[] = {"ok.type", long_type};
    o.accept_types = types;
    o.n_accept_types = 2;
    ASSERT_STATUS(jsd_consumer_create(&c, e.store, e.conn, &o, &err), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(err.msg, "accepted type 1 is empty or over 256 bytes");
    long_type[256] = '\0'; /* 256 bytes: accepted */
    ASSERT_OK_E(jsd_consumer_create(&c, e.store, e.conn, &o, &err), err.msg);
    jsd_consumer_destroy(c);
    c = NULL;
    o.accept_types = NULL;
    o.n_accept_types = 0;
    /* A missing durable is named. */
    o.dlq_subject = NULL;
    o.durable = "nosuchdurable";
    ASSERT_STATUS(jsd_consumer_create(&c, e.store, e.conn, &o, &err), JSD_ERR_NOT_FOUND);
    ASSERT_CONTAINS(err.msg, "durable \"nosuchdurable\" does not exist");
    ASSERT_TRUE(c == NULL);
    cenv_down(&e);
}

/* ---- a re-published duplicate past the broker's window is caught by msg id ------------- */
static void msg_id_duplicate_caught(bool pg)
{
    cenv e;
    hctx h = {0};
    cenv_up(&e, pg);
    effects_table(&e);
    /* A 200 ms duplicate window, so the broker forgets the id quickly. */
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    ASSERT_EQ(js_GetStreamInfo(&si, e.js, e.stream, NULL, &jerr), NATS_OK);
    si->Config->Duplicates = 200LL * 1000000;
    jsStreamInfo *si2 = NULL;
    ASSERT_EQ(js_UpdateStream(&si2, e.js, si->Config, NULL, &jerr), NATS_OK);
    jsStreamInfo_Destroy(si2);
    jsStreamInfo_Destroy(si);
    cenv_durable(&e, 30000, 6, 1024, NULL, 0);
    cenv_publish_raw(&e, "a", "one", 3, NULL, "same-id");
    h.e = &e;
    jsd_consumer *c = cenv_consumer(&e, NULL);
    jsd_consumer_stats s;
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.committed >= 1), 10000);
    jsd_test_sleep_ms(400); /* past the window: the next publish is stored anew */
    cenv_publish_raw(&e, "a", "one", 3, NULL, "same-id");
    ASSERT_EQ(cenv_stream_msgs(&e, e.stream), 2);
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.duplicates >= 1), 10000);
    ASSERT_EQ(h.calls, 1);
    ASSERT_EQ(effects(&e), 1);
    ASSERT_WAIT(cenv_settled(&e), 5000);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* ---- a re-created stream hands its sequences out again -------------------------------- */

/* The stream is deleted and created again (its durable too): its new
 * messages reuse the sequences of the ones already applied. They are new
 * messages, with a Nats-Msg-Id or without one, and are applied; the old
 * rows keep their ids, so a re-publication of an old message is still a
 * duplicate. Before the inbox compared identities, the second consumer
 * answered all 25 from the inbox: 0 committed, 25 duplicates. */
static void stream_recreated_reuses_sequences(bool pg)
{
    cenv e;
    hctx h = {0};
    suite_up(&e, pg, 30000, 6);
    h.e = &e;
    cenv_publish(&e, 1, 20, NULL); /* ids id-1 .. id-20 */
    for (int i = 0; i < 5; i++)
        cenv_publish_raw(&e, "bare", "no id", 5, NULL, NULL);
    jsd_consumer *c = cenv_consumer(&e, NULL);
    jsd_consumer_stats s;
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.committed >= 25), 15000);
    ASSERT_WAIT(cenv_settled(&e), 5000);
    jsd_consumer_destroy(c);

    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    ASSERT_EQ(js_GetStreamInfo(&si, e.js, e.stream, NULL, &jerr), NATS_OK);
    ASSERT_EQ(js_DeleteStream(e.js, e.stream, NULL, &jerr), NATS_OK);
    jsStreamInfo *again = NULL;
    ASSERT_EQ(js_AddStream(&again, e.js, si->Config, NULL, &jerr), NATS_OK);
    jsStreamInfo_Destroy(again);
    jsStreamInfo_Destroy(si);
    cenv_durable(&e, 30000, 6, 1024, NULL, 0);
    cenv_publish(&e, 101, 20, NULL); /* ids id-101 .. id-120, at sequences 1 .. 20 */
    for (int i = 0; i < 5; i++)
        cenv_publish_raw(&e, "bare", "no id", 5, NULL, NULL);

    c = cenv_consumer(&e, NULL);
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.committed + s.duplicates >= 25), 15000);
    jsd_consumer_stats_get(c, &s);
    ASSERT_EQ(s.duplicates, 0);
    ASSERT_EQ(s.committed, 25);
    ASSERT_EQ(effects(&e), 50);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM jsd_inbox WHERE stream_seq < 0"),
              25);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(DISTINCT stream_seq) FROM jsd_inbox"), 50);
    ASSERT_WAIT(cenv_settled(&e), 5000);

    /* an old message published again: its retired row still knows its id */
    cenv_publish_raw(&e, "again", "id-5 again", 10, NULL, "id-5");
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.duplicates >= 1), 10000);
    ASSERT_EQ(effects(&e), 50);
    ASSERT_WAIT(cenv_settled(&e), 5000);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

BOTH(commit_then_confirmed_ack)
BOTH(failed_commit_no_ack)
BOTH(redelivery_hits_inbox)
BOTH(retry_honours_delay)
BOTH(progress_extends_ack_wait)
BOTH(in_flight_bounded)
BOTH(slow_batch_kept_alive)
BOTH(drain_settles_batch_in_hand)
BOTH(pending_bytes_applied)
BOTH(poison_on_first_delivery)
BOTH(handler_poison)
BOTH(max_deliver_parks)
BOTH(config_guard)
BOTH(msg_id_duplicate_caught)
BOTH(stream_recreated_reuses_sequences)

#define T(fn) cmocka_unit_test(fn##_sqlite), cmocka_unit_test(fn##_pg)

JSD_TEST_MAIN(T(commit_then_confirmed_ack), T(failed_commit_no_ack), T(redelivery_hits_inbox),
              T(retry_honours_delay), T(progress_extends_ack_wait), T(in_flight_bounded),
              T(slow_batch_kept_alive), T(drain_settles_batch_in_hand), T(pending_bytes_applied),
              T(poison_on_first_delivery), T(handler_poison), T(max_deliver_parks), T(config_guard),
              T(msg_id_duplicate_caught), T(stream_recreated_reuses_sequences))
