/*
 * The publisher under broker faults, each test on a private nats-server it
 * started itself (FIX-4, PUB-4, PUB-7): a paused broker gives UNKNOWN within
 * the deadline and, once resumed, the same id is a duplicate with one stored
 * message; deduplication and an unacknowledged durable consumer survive a
 * kill -9 and restart on the same store; inside the duplicate window an id
 * is a duplicate and a 1-second window expires (the documented limit); a lost
 * connection before the write is UNAVAILABLE; a user without publish
 * permission is DENIED.
 */
#include <stdlib.h>

#include "conn_int.h"
#include "publisher_env.h"

static void stream_on(jsCtx *js, const char *name, const char *filter, int64_t window_ms)
{
    ph_add_stream(js, &(ph_stream){.name = name, .subject = filter, .dup_window_ms = window_ms});
}

static void paused_broker_is_unknown_then_duplicate(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_publish_result r;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    jsd_conn *c = ph_open(fx.url);
    natsConnection *direct = ph_direct(fx.url, NULL, NULL);
    jsCtx *js = ph_js(direct);
    stream_on(js, "PAUSE", "pause.>", 0);
    jsd_publisher *p = ph_bind(c, "PAUSE", "pause.x", 8, 1500);

    ASSERT_EQ(jsd_fx_nats_pause(&fx), 0);
    int64_t t0 = jsd_test_mono_ms();
    ASSERT_OUTCOME(jsd_publish(p, "paused-1", "payload", 7, NULL, 0, &r), JSD_OUTCOME_UNKNOWN, r);
    int64_t took = jsd_test_mono_ms() - t0;
    ASSERT_LE(took, 1500 + 1000); /* the deadline bounds the wait */
    ASSERT_TRUE(took >= 1400);
    ASSERT_CONTAINS(r.reason, "no acknowledgement within 1500 ms");
    ASSERT_EQ(jsd_fx_nats_resume(&fx), 0);

    /* the buffered publication reaches the broker after the resume */
    ASSERT_WAIT(ph_stream_msgs(js, "PAUSE") == 1, 10000);
    /* the caller's retry with the same id is a duplicate of it */
    ASSERT_WAIT(jsd_conn_is_connected(c), 10000);
    ASSERT_OUTCOME(jsd_publish(p, "paused-1", "payload", 7, NULL, 0, &r), JSD_OUTCOME_ACCEPTED, r);
    ASSERT_EQ(r.receipt.duplicate, true);
    ASSERT_EQ(r.receipt.seq, 1);
    ASSERT_EQ(ph_stream_msgs(js, "PAUSE"), 1);

    jsd_publisher_destroy(p);
    jsCtx_Destroy(js);
    natsConnection_Destroy(direct);
    jsd_conn_close(c);
    jsd_fx_nats_stop(&fx);
}

static void dedup_and_consumer_survive_kill_restart(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_publish_result r;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    jsd_conn *c = ph_open(fx.url);
    natsConnection *direct = ph_direct(fx.url, NULL, NULL);
    jsCtx *js = ph_js(direct);
    stream_on(js, "RESTART", "restart.>", 0);
    jsd_publisher *p = ph_bind(c, "RESTART", "restart.x", 8, 3000);

    /* a durable pull consumer with explicit ack */
    jsConsumerConfig cc;
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    jsConsumerConfig_Init(&cc);
    cc.Durable = "keeper";
    cc.AckPolicy = js_AckExplicit;
    cc.AckWait = (int64_t)2000 * 1000000;
    cc.MaxAckPending = 1; /* nothing else is delivered while seq 1 is unacknowledged */
    ASSERT_EQ(js_AddConsumer(&ci, js, "RESTART", &cc, NULL, &jerr), NATS_OK);
    jsConsumerInfo_Destroy(ci);

    ASSERT_OUTCOME(jsd_publish(p, "r-1", "one", 3, NULL, 0, &r), JSD_OUTCOME_ACCEPTED, r);
    ASSERT_EQ(r.receipt.seq, 1);
    ASSERT_OUTCOME(jsd_publish(p, "r-2", "two", 3, NULL, 0, &r), JSD_OUTCOME_ACCEPTED, r);
    ASSERT_OUTCOME(jsd_publish(p, "r-1", "one", 3, NULL, 0, &r), JSD_OUTCOME_ACCEPTED, r);
    ASSERT_EQ(r.receipt.duplicate, true);

    /* fetch the first message and do not acknowledge it */
    natsSubscription *sub = NULL;
    natsMsgList list = {0};
    jsMsgMetaData *meta = NULL;
    ASSERT_EQ(js_PullSubscribe(&sub, js, "restart.x", "keeper", NULL, NULL, &jerr), NATS_OK);
    ASSERT_EQ(natsSubscription_Fetch(&list, sub, 1, 5000, &jerr), NATS_OK);
    ASSERT_EQ(list.Count, 1);
    ASSERT_EQ(natsMsg_GetMetaData(&meta, list.Msgs[0]), NATS_OK);
    uint64_t seq_before = meta->Sequence.Stream;
    jsMsgMetaData_Destroy(meta);
    natsMsgList_Destroy(&list);
    natsSubscription_Destroy(sub); /* Destroy keeps the durable */
    jsCtx_Destroy(js);
    natsConnection_Destroy(direct);

    ASSERT_EQ(jsd_fx_nats_kill(&fx), 0);
    ASSERT_EQ(jsd_fx_nats_restart(&fx), 0);

    direct = ph_direct(fx.url, NULL, NULL);
    js = ph_js(direct);
    ASSERT_EQ(ph_stream_msgs(js, "RESTART"), 2); /* retained */
    ASSERT_WAIT(jsd_conn_is_connected(c), 15000);
    /* dedup across the restart: the same ids are duplicates */
    jsd_outcome o = JSD_OUTCOME_UNKNOWN;
    /* the first publish after a reconnect may race the server's JetStream
     * recovery; the caller's rule is to retry UNKNOWN with the same id */
    for (int i = 0;
         i < 20 && (o = jsd_publish(p, "r-2", "two", 3, NULL, 0, &r)) != JSD_OUTCOME_ACCEPTED; i++)
        jsd_test_sleep_ms(250);
    ASSERT_OUTCOME(o, JSD_OUTCOME_ACCEPTED, r);
    ASSERT_EQ(r.receipt.duplicate, true);
    ASSERT_EQ(r.receipt.seq, 2);
    ASSERT_OUTCOME(jsd_publish(p, "r-1", "one", 3, NULL, 0, &r), JSD_OUTCOME_ACCEPTED, r);
    ASSERT_EQ(r.receipt.duplicate, true);
    ASSERT_EQ(r.receipt.seq, 1);
    ASSERT_EQ(ph_stream_msgs(js, "RESTART"), 2);

    /* the unacknowledged delivery comes again with the same stream sequence */
    ASSERT_EQ(js_PullSubscribe(&sub, js, "restart.x", "keeper", NULL, NULL, &jerr), NATS_OK);
    ASSERT_EQ(natsSubscription_Fetch(&list, sub, 1, 10000, &jerr), NATS_OK);
    ASSERT_EQ(list.Count, 1);
    ASSERT_EQ(natsMsg_GetMetaData(&meta, list.Msgs[0]), NATS_OK);
    ASSERT_EQ(meta->Sequence.Stream, seq_before);
    ASSERT_TRUE(meta->NumDelivered >= 2);
    jsMsgMetaData_Destroy(meta);
    ASSERT_EQ(natsMsg_AckSync(list.Msgs[0], NULL, &jerr), NATS_OK);
    natsMsgList_Destroy(&list);
    ASSERT_EQ(js_GetConsumerInfo(&ci, js, "RESTART", "keeper", NULL, &jerr), NATS_OK);
    ASSERT_EQ(ci->AckFloor.Stream, seq_before);
    jsConsumerInfo_Destroy(ci);
    natsSubscription_Destroy(sub);

    jsd_publisher_destroy(p);
    jsCtx_Destroy(js);
    natsConnection_Destroy(direct);
    jsd_conn_close(c);
    jsd_fx_nats_stop(&fx);
}

/* Bind a publisher to a fresh stream "<prefix>..." with the given duplicate
 * window; the stream's name goes to name. */
static jsd_publisher *bind_windowed(jsd_conn *c, jsCtx *js, const char *prefix, int64_t window_ms,
                                    char *name, size_t cap)
{
    char filter[128], subject[128];
    jsd_publisher_opts o;
    jsd_publisher *p = NULL;
    jsd_error err;
    snprintf(name, cap, "%s", jsd_test_unique(prefix));
    snprintf(filter, sizeof(filter), "%s.>", name);
    snprintf(subject, sizeof(subject), "%s.x", name);
    stream_on(js, name, filter, window_ms);
    jsd_publisher_opts_init(&o);
    o.stream = name;
    o.subject = subject;
    o.expected_duplicate_window_ms = window_ms;
    ASSERT_OK_E(jsd_publisher_bind(&p, c, &o, &err), err.msg);
    ASSERT_EQ(jsd_publisher_duplicate_window_ms(p), window_ms);
    return p;
}

/* Inside the window the same id is a duplicate; past it, it is stored again
 * (the documented limit). Each half on its own stream so that both hold on
 * every run: the in-window half uses a one-hour window, longer than the runner
 * lets any case live, so its second publish is always inside it; the expiry
 * half uses a one-second window and waits for the expiry with a deadline. */
static void duplicate_window_is_finite(void **state)
{
    (void)state;
    jsd_publish_result r;
    const char *url = jsd_fx_shared_nats_url();
    jsd_conn *c = ph_open(url);
    natsConnection *direct = ph_direct(url, NULL, NULL);
    jsCtx *js = ph_js(direct);
    char longs[96], shorts[96];

    jsd_publisher *pl = bind_windowed(c, js, "WINL", 3600 * 1000, longs, sizeof(longs));
    ASSERT_OUTCOME(jsd_publish(pl, "w-1", "x", 1, NULL, 0, &r), JSD_OUTCOME_ACCEPTED, r);
    ASSERT_EQ(r.receipt.duplicate, false);
    ASSERT_OUTCOME(jsd_publish(pl, "w-1", "x", 1, NULL, 0, &r), JSD_OUTCOME_ACCEPTED, r);
    ASSERT_EQ(r.receipt.duplicate, true);
    ASSERT_EQ(ph_stream_msgs(js, longs), 1);

    jsd_publisher *ps = bind_windowed(c, js, "WINS", 1000, shorts, sizeof(shorts));
    int64_t first_at = jsd_test_mono_ms(); /* the broker stored it after this */
    ASSERT_OUTCOME(jsd_publish(ps, "w-1", "x", 1, NULL, 0, &r), JSD_OUTCOME_ACCEPTED, r);
    ASSERT_EQ(r.receipt.duplicate, false);
    /* past the window the same id is stored again: the documented limit */
    bool stored_again = WAIT_UNTIL(
        jsd_publish(ps, "w-1", "x", 1, NULL, 0, &r) == JSD_OUTCOME_ACCEPTED && !r.receipt.duplicate,
        10000);
    ASSERT_TRUE(stored_again);
    /* not before the window: the store that took it again ended at least a
     * window (less a margin for the broker's expiry timer) after first_at */
    ASSERT_TRUE(jsd_test_mono_ms() - first_at >= 900);
    ASSERT_EQ(ph_stream_msgs(js, shorts), 2);

    jsd_publisher_destroy(ps);
    jsd_publisher_destroy(pl);
    jsCtx_Destroy(js);
    natsConnection_Destroy(direct);
    jsd_conn_close(c);
}

static void lost_connection_before_write_is_unavailable(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_publish_result r;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    jsd_conn *c = ph_open(fx.url);
    natsConnection *direct = ph_direct(fx.url, NULL, NULL);
    jsCtx *js = ph_js(direct);
    stream_on(js, "GONE", "gone.>", 0);
    jsCtx_Destroy(js);
    natsConnection_Destroy(direct);
    jsd_publisher *p = ph_bind(c, "GONE", "gone.x", 8, 2000);
    ASSERT_OUTCOME(jsd_publish(p, "g-1", "x", 1, NULL, 0, &r), JSD_OUTCOME_ACCEPTED, r);

    ASSERT_EQ(jsd_fx_nats_kill(&fx), 0);
    ASSERT_WAIT(!jsd_conn_is_connected(c), 10000);
    natsConnection *nc = jsd__conn_nats(c);
    uint64_t out0 = ph_out_msgs(nc);
    int64_t t0 = jsd_test_mono_ms();
    ASSERT_OUTCOME(jsd_publish(p, "g-2", "x", 1, NULL, 0, &r), JSD_OUTCOME_UNAVAILABLE, r);
    ASSERT_LE(jsd_test_mono_ms() - t0, 500); /* decided at once */
    ASSERT_EQ(ph_out_msgs(nc), out0);
    ASSERT_CONTAINS(r.reason, "not connected");

    /* after the restart the same publisher works again */
    ASSERT_EQ(jsd_fx_nats_restart(&fx), 0);
    ASSERT_WAIT(jsd_conn_is_connected(c), 15000);
    jsd_outcome o = JSD_OUTCOME_UNKNOWN;
    for (int i = 0;
         i < 20 && (o = jsd_publish(p, "g-2", "x", 1, NULL, 0, &r)) != JSD_OUTCOME_ACCEPTED; i++)
        jsd_test_sleep_ms(250);
    ASSERT_OUTCOME(o, JSD_OUTCOME_ACCEPTED, r);
    jsd_publisher_destroy(p);
    jsd_conn_close(c);
    jsd_fx_nats_stop(&fx);
}

static void in_flight_at_connection_loss_is_unknown(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_publish_result r;
    jsd_publish_done d[8];
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    jsd_conn *c = ph_open(fx.url);
    natsConnection *direct = ph_direct(fx.url, NULL, NULL);
    jsCtx *js = ph_js(direct);
    stream_on(js, "CUT", "cut.>", 0);
    jsCtx_Destroy(js);
    natsConnection_Destroy(direct);
    /* a long deadline: only the connection loss can settle it early */
    jsd_publisher *p = ph_bind(c, "CUT", "cut.x", 8, 60000);

    /* pause so the publication is written but cannot be acknowledged, then
     * kill: the connection is lost with it in flight */
    ASSERT_EQ(jsd_fx_nats_pause(&fx), 0);
    int tok = 1;
    ASSERT_TRUE(jsd_publish_submit(p, "c-1", "x", 1, NULL, 0, &tok, &r));
    ASSERT_EQ(jsd_fx_nats_kill(&fx), 0);
    int64_t t0 = jsd_test_mono_ms();
    size_t n = 0;
    while (n == 0 && jsd_test_mono_ms() - t0 < 20000)
        n = jsd_publisher_poll(p, d, 8, 1000);
    ASSERT_EQ(n, 1);
    ASSERT_TRUE(d[0].user == &tok);
    ASSERT_EQ(d[0].result.outcome, JSD_OUTCOME_UNKNOWN);
    ASSERT_CONTAINS(d[0].result.reason, "connection was lost");
    ASSERT_LE(jsd_test_mono_ms() - t0, 20000); /* long before the 60 s deadline */
    jsd_publisher_destroy(p);
    jsd_conn_close(c);
}

/* A paused broker stops reading: once the socket buffers are full a write
 * blocks. The connection's write deadline (its request timeout, 3 s here)
 * bounds it; nothing stalls for ever, every publication ends UNKNOWN or
 * ACCEPTED, and after the resume the same ids store each message once. */
static void flooded_paused_broker_never_stalls(void **state)
{
    (void)state;
    enum { SIZE = 256 * 1024, MAX = 400 };
    jsd_fx_nats fx;
    jsd_publish_result r;
    jsd_publish_done d[64];
    char id[32];
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    jsd_conn *c = ph_open(fx.url); /* request timeout 3000 ms */
    natsConnection *direct = ph_direct(fx.url, NULL, NULL);
    jsCtx *js = ph_js(direct);
    stream_on(js, "FLOOD", "flood.>", 0);
    jsd_publisher *p = ph_bind(c, "FLOOD", "flood.x", 1024, 2000);
    char *big = calloc(1, SIZE);
    ASSERT_EQ(jsd_fx_nats_pause(&fx), 0);

    int n = 0, unknown = 0;
    int64_t worst = 0;
    for (; n < MAX; n++) {
        snprintf(id, sizeof(id), "f-%d", n);
        int64_t t0 = jsd_test_mono_ms();
        bool in_flight = jsd_publish_submit(p, id, big, SIZE, NULL, 0, NULL, &r);
        int64_t took = jsd_test_mono_ms() - t0;
        worst = took > worst ? took : worst;
        if (!in_flight) {
            ASSERT_OUTCOME(r.outcome, JSD_OUTCOME_UNKNOWN, r);
            unknown++;
            n++;
            break;
        }
    }
    ASSERT_TRUE(unknown == 1); /* the buffers filled and a write gave up */
    ASSERT_LE(worst, 3000 + 3000);
    /* everything still in flight settles promptly: the connection was dropped */
    int64_t t0 = jsd_test_mono_ms();
    while (jsd_publisher_inflight(p) > 0 && jsd_test_mono_ms() - t0 < 10000) {
        size_t got = jsd_publisher_poll(p, d, 64, 500);
        for (size_t i = 0; i < got; i++)
            ASSERT_EQ(d[i].result.outcome, JSD_OUTCOME_UNKNOWN);
    }
    ASSERT_EQ(jsd_publisher_inflight(p), 0);

    ASSERT_EQ(jsd_fx_nats_resume(&fx), 0);
    ASSERT_WAIT(jsd_conn_is_connected(c), 15000);
    /* the caller retries every id: each is stored exactly once */
    for (int i = 0; i < n; i++) {
        snprintf(id, sizeof(id), "f-%d", i);
        jsd_outcome o = JSD_OUTCOME_UNKNOWN;
        for (int k = 0;
             k < 20 && (o = jsd_publish(p, id, big, SIZE, NULL, 0, &r)) != JSD_OUTCOME_ACCEPTED;
             k++)
            jsd_test_sleep_ms(100);
        ASSERT_OUTCOME(o, JSD_OUTCOME_ACCEPTED, r);
    }
    ASSERT_EQ(ph_stream_msgs(js, "FLOOD"), n);
    free(big);
    jsd_publisher_destroy(p);
    jsCtx_Destroy(js);
    natsConnection_Destroy(direct);
    jsd_conn_close(c);
    jsd_fx_nats_stop(&fx);
}

static void no_publish_permission_is_denied(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_publish_result r;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_USERPASS, &fx), 0);
    natsConnection *direct = ph_direct(fx.url, fx.user, fx.password);
    jsCtx *js = ph_js(direct);
    stream_on(js, "DENY", "denied.>", 0);
    stream_on(js, "FINE", "fine.>", 0);

    jsd_conn *c = ph_open_user(fx.url, fx.limited_user, fx.limited_password);
    jsd_publisher *p = ph_bind(c, "DENY", "denied.x", 8, 3000);
    int64_t t0 = jsd_test_mono_ms();
    ASSERT_OUTCOME(jsd_publish(p, "d-1", "x", 1, NULL, 0, &r), JSD_OUTCOME_DENIED, r);
    ASSERT_LE(jsd_test_mono_ms() - t0, 2500); /* told, not timed out */
    ASSERT_CONTAINS(r.reason, "denied.x");
    ASSERT_EQ(ph_stream_msgs(js, "DENY"), 0);

    /* the same user may publish elsewhere, on the same connection */
    jsd_publisher *ok = ph_bind(c, "FINE", "fine.x", 8, 3000);
    ASSERT_OUTCOME(jsd_publish(ok, "f-1", "x", 1, NULL, 0, &r), JSD_OUTCOME_ACCEPTED, r);
    jsd_publisher_destroy(ok);
    jsd_publisher_destroy(p);
    jsd_conn_close(c);
    jsCtx_Destroy(js);
    natsConnection_Destroy(direct);
    jsd_fx_nats_stop(&fx);
}

JSD_TEST_MAIN(cmocka_unit_test(paused_broker_is_unknown_then_duplicate),
              cmocka_unit_test(dedup_and_consumer_survive_kill_restart),
              cmocka_unit_test(duplicate_window_is_finite),
              cmocka_unit_test(lost_connection_before_write_is_unavailable),
              cmocka_unit_test(in_flight_at_connection_loss_is_unknown),
              cmocka_unit_test(flooded_paused_broker_never_stalls),
              cmocka_unit_test(no_publish_permission_is_denied))
