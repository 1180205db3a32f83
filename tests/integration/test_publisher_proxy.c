/*
 * The publisher behind the fault proxy (FIX-2, PUB-4): a PubAck dropped after
 * the broker stored the message gives UNKNOWN — while a second, direct
 * connection already sees the message stored — and the caller's same-id retry
 * is ACCEPTED as a duplicate with exactly one stored message; withheld acks
 * and a cut connection settle every publication in flight as UNKNOWN, never
 * stalling, and never lose the ability to publish again.
 */
#include <stdlib.h>

#include "proxy.h"
#include "publisher_env.h"

typedef struct env {
    jsd_fx_proxy px;
    jsd_conn *conn; /* through the proxy */
    natsConnection *direct;
    jsCtx *js;
    char stream[96];
    char subject[128];
} env;

static void env_open(env *e, const char *mode)
{
    char filter[128];
    memset(e, 0, sizeof(*e));
    const char *url = jsd_fx_shared_nats_url();
    ASSERT_EQ(jsd_fx_proxy_start(jsd_fx_url_port(url), mode, &e->px), 0);
    e->conn = ph_open(e->px.url);
    e->direct = ph_direct(url, NULL, NULL);
    e->js = ph_js(e->direct);
    snprintf(e->stream, sizeof(e->stream), "%s", jsd_test_unique("PROXY"));
    snprintf(filter, sizeof(filter), "%s.>", e->stream);
    snprintf(e->subject, sizeof(e->subject), "%s.x", e->stream);
    ph_add_stream(e->js, &(ph_stream){.name = e->stream, .subject = filter});
}

static void env_close(env *e)
{
    jsd_conn_close(e->conn);
    jsd_fx_proxy_stop(&e->px);
    jsCtx_Destroy(e->js);
    natsConnection_Destroy(e->direct);
}

static void dropped_puback_is_unknown_then_duplicate(void **state)
{
    (void)state;
    env e;
    jsd_publish_result r;
    jsd_publish_done d[4];
    int tok = 1;
    enum { DEADLINE = 4000 };
    env_open(&e, "drop-first-puback");
    jsd_publisher *p = ph_bind(e.conn, e.stream, e.subject, 8, DEADLINE);

    int64_t t0 = jsd_test_mono_ms();
    ASSERT_TRUE(jsd_publish_submit(p, "order-7", "payload", 7, NULL, 0, &tok, &r));
    /* the broker stored it: a direct connection sees it before the deadline,
     * while the publisher is still waiting for an ack that will not come */
    ASSERT_WAIT(ph_stream_msgs(e.js, e.stream) == 1, DEADLINE - 500);
    ASSERT_WAIT(jsd_fx_proxy_dropped_acks(&e.px) == 1, 2000);
    ASSERT_TRUE(jsd_test_mono_ms() - t0 < DEADLINE);
    ASSERT_EQ(jsd_publisher_poll(p, d, 4, 0), 0);
    ASSERT_EQ(jsd_publisher_inflight(p), 1);

    size_t n = 0;
    while (n == 0 && jsd_test_mono_ms() - t0 < DEADLINE + 3000)
        n = jsd_publisher_poll(p, d, 4, 500);
    ASSERT_EQ(n, 1);
    ASSERT_TRUE(d[0].user == &tok);
    ASSERT_EQ(d[0].result.outcome, JSD_OUTCOME_UNKNOWN);
    ASSERT_CONTAINS(d[0].result.reason, "may be stored");
    ASSERT_TRUE(jsd_test_mono_ms() - t0 >= DEADLINE - 50);

    /* the caller retries with the same id: a duplicate of the stored one */
    ASSERT_OUTCOME(jsd_publish(p, "order-7", "payload", 7, NULL, 0, &r), JSD_OUTCOME_ACCEPTED, r);
    ASSERT_EQ(r.receipt.duplicate, true);
    ASSERT_EQ(r.receipt.seq, 1);
    ASSERT_STREQ(r.receipt.stream, e.stream);
    ASSERT_EQ(ph_stream_msgs(e.js, e.stream), 1);
    ASSERT_EQ(jsd_fx_proxy_dropped_acks(&e.px), 1);
    jsd_publisher_destroy(p);
    env_close(&e);
}

static void withheld_acks_settle_unknown_by_deadline(void **state)
{
    (void)state;
    env e;
    jsd_publish_result r;
    jsd_publish_done d[16];
    char id[32];
    env_open(&e, "withhold-acks");
    jsd_publisher *p = ph_bind(e.conn, e.stream, e.subject, 16, 1500);
    for (int i = 0; i < 10; i++) {
        snprintf(id, sizeof(id), "h-%d", i);
        ASSERT_TRUE(jsd_publish_submit(p, id, "x", 1, NULL, 0, NULL, &r));
    }
    int64_t t0 = jsd_test_mono_ms();
    size_t got = 0;
    while (got < 10 && jsd_test_mono_ms() - t0 < 5000) {
        size_t n = jsd_publisher_poll(p, d, 16, 500);
        for (size_t i = 0; i < n; i++)
            ASSERT_EQ(d[i].result.outcome, JSD_OUTCOME_UNKNOWN);
        got += n;
    }
    ASSERT_EQ(got, 10);
    ASSERT_LE(jsd_test_mono_ms() - t0, 1500 + 1500);
    ASSERT_EQ(jsd_publisher_inflight(p), 0);
    ASSERT_WAIT(ph_stream_msgs(e.js, e.stream) == 10, 5000);

    /* acks flow again: every retry is a duplicate, nothing stored twice */
    ASSERT_EQ(jsd_fx_proxy_mode(&e.px, "pass"), 0);
    for (int i = 0; i < 10; i++) {
        snprintf(id, sizeof(id), "h-%d", i);
        ASSERT_OUTCOME(jsd_publish(p, id, "x", 1, NULL, 0, &r), JSD_OUTCOME_ACCEPTED, r);
        ASSERT_EQ(r.receipt.duplicate, true);
    }
    ASSERT_EQ(ph_stream_msgs(e.js, e.stream), 10);
    jsd_publisher_destroy(p);
    env_close(&e);
}

static void cut_connection_settles_in_flight_as_unknown(void **state)
{
    (void)state;
    env e;
    jsd_publish_result r;
    jsd_publish_done d[16];
    char id[32];
    env_open(&e, "withhold-acks");
    /* a long deadline: only the connection loss can settle these early */
    jsd_publisher *p = ph_bind(e.conn, e.stream, e.subject, 16, 60000);
    for (int i = 0; i < 5; i++) {
        snprintf(id, sizeof(id), "k-%d", i);
        ASSERT_TRUE(jsd_publish_submit(p, id, "x", 1, NULL, 0, NULL, &r));
    }
    ASSERT_WAIT(ph_stream_msgs(e.js, e.stream) == 5, 5000);
    int64_t t0 = jsd_test_mono_ms();
    ASSERT_EQ(jsd_fx_proxy_cut(&e.px), 0);
    size_t got = 0;
    while (got < 5 && jsd_test_mono_ms() - t0 < 20000) {
        size_t n = jsd_publisher_poll(p, d, 16, 500);
        for (size_t i = 0; i < n; i++) {
            ASSERT_EQ(d[i].result.outcome, JSD_OUTCOME_UNKNOWN);
            ASSERT_CONTAINS(d[i].result.reason, "connection was lost");
        }
        got += n;
    }
    ASSERT_EQ(got, 5);
    ASSERT_EQ(jsd_publisher_inflight(p), 0);

    /* the client reconnects through the proxy (now passing) and the retries
     * are duplicates */
    ASSERT_WAIT(jsd_conn_is_connected(e.conn), 15000);
    for (int i = 0; i < 5; i++) {
        snprintf(id, sizeof(id), "k-%d", i);
        ASSERT_OUTCOME(jsd_publish(p, id, "x", 1, NULL, 0, &r), JSD_OUTCOME_ACCEPTED, r);
        ASSERT_EQ(r.receipt.duplicate, true);
    }
    ASSERT_EQ(ph_stream_msgs(e.js, e.stream), 5);
    jsd_publisher_destroy(p);
    env_close(&e);
}

JSD_TEST_MAIN(cmocka_unit_test(dropped_puback_is_unknown_then_duplicate),
              cmocka_unit_test(withheld_acks_settle_unknown_by_deadline),
              cmocka_unit_test(cut_connection_settles_in_flight_as_unknown))
