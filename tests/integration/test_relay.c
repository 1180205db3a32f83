/*
 * The outbox relay against a real nats-server and both store back ends
 * (RELAY-1..4): every effect published once with its stable Nats-Msg-Id and
 * its receipt recorded; durable timers; ordering keys; the dead-letter budget;
 * wake-ups; a graceful stop; the bound on effects waiting for a stalled
 * receipt writer; a broker outage; a dropped PubAck; bad options.
 * Receipts are read back with the native driver, the stream with a separate
 * nats.c connection.
 */
#include <time.h>

#include "jsd_int.h"
#include "proxy.h"
#include "relay_env.h"

/* A stream and subject root unique to this test process. */
typedef struct rt_env {
    rt_store st;
    rt_nats nt;
    const char *nats_url;
    char stream[64];
    char root[64];     /* subjects are <root>.<...> */
    char filter[80];   /* <root>.> */
    char subject[100]; /* <root>.a */
} rt_env;

static void env_up(rt_env *e, rt_backend kind, const char *nats_url)
{
    memset(e, 0, sizeof(*e));
    rt_store_new(&e->st, kind);
    e->nats_url = nats_url ? nats_url : jsd_fx_shared_nats_url();
    snprintf(e->stream, sizeof(e->stream), "%s", jsd_test_unique("RELAY"));
    snprintf(e->root, sizeof(e->root), "%s", jsd_test_unique("relay"));
    snprintf(e->filter, sizeof(e->filter), "%s.>", e->root);
    snprintf(e->subject, sizeof(e->subject), "%s.a", e->root);
    rt_nats_open(&e->nt, e->nats_url);
    rt_stream_add(&e->nt, e->stream, e->filter);
}

static void env_down(rt_env *e)
{
    rt_nats_close(&e->nt);
    rt_store_close(&e->st);
}

static jsd_relay_opts fast_opts(void)
{
    jsd_relay_opts o;
    jsd_relay_opts_init(&o);
    o.poll_interval_ms = 200;
    /* The shared server syncs every message to disk (sync_interval: always)
     * and the machine may be loaded: with 1024 publications in flight, acks
     * can take seconds. A deadline that short would turn them into UNKNOWN
     * (correctly, but these cases assert none). */
    o.publish_deadline_ms = 30000;
    o.lease_ms = 35000;
    o.backoff_base_ms = 50;
    o.backoff_cap_ms = 200;
    return o;
}

/* ---- every effect once, with its receipt ------------------------------------------------ */

/* coalesce_writes: the relay's connection gathers its writes (as `jsdurable
 * relay` opens it) or writes each publication at once. */
static void publishes_every_effect_once(rt_backend kind, int coalesce_writes)
{
    rt_env e;
    env_up(&e, kind, NULL);
    jsd_store *app = rt_open(&e.st);
    char subj[128];
    snprintf(subj, sizeof(subj), "%s.s%%d", e.root);
    rt_enqueue_opts q = {
        .owner = "order", .id_prefix = "e", .n = 1000, .subject = subj, .n_subjects = 3};
    rt_enqueue(app, &q);

    rt_relay t;
    jsd_relay_opts o = fast_opts();
    jsd_metrics *mx = NULL;
    ASSERT_OK(jsd_metrics_create(&mx, NULL));
    o.metrics = mx;
    rt_relay_make_with(&t, &e.st, e.nats_url, &o, coalesce_writes);
    ASSERT_OK(jsd_relay_run_until_idle(t.relay));
    jsd_relay_stats rs;
    jsd_relay_stats_get(t.relay, &rs);
    ASSERT_EQ(rs.published, 1000);
    double v = -1;
    ASSERT_OK(jsd_metrics_get(mx, "jsd_relay_published_total", NULL, &v));
    ASSERT_EQ(v, 1000);
    ASSERT_OK(jsd_metrics_get(mx, "jsd_relay_errors_total", NULL, &v));
    ASSERT_EQ(v, 0);
    ASSERT_OK(jsd_metrics_get(mx, "jsd_outbox_backlog", NULL, &v));
    ASSERT_EQ(v, 0);
    ASSERT_OK(jsd_metrics_get(mx, "jsd_relay_in_flight", NULL, &v));
    ASSERT_EQ(v, 0);
    ASSERT_EQ(rs.duplicates, 0);
    ASSERT_EQ(rs.errors, 0);
    ASSERT_EQ(rs.in_flight, 0);

    ASSERT_EQ(rt_q(&e.st, RT_SQL_TOTAL), 1000);
    ASSERT_EQ(rt_published(&e.st), 1000);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DUPLICATES), 0);
    char sql[256], got[128];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM jsd_outbox_state WHERE stream <> '%s' OR stream_seq < 1 "
             "OR published_at IS NULL",
             e.stream);
    ASSERT_EQ(rt_q(&e.st, sql), 0);
    /* the receipt names the sequence the broker stored the effect under */
    rt_qs(&e.st, "SELECT stream_seq FROM jsd_outbox_state WHERE effect_id = 'e7'", got,
          sizeof(got));
    jsErrCode jerr = 0;
    natsMsg *m = NULL;
    ASSERT_EQ(js_GetMsg(&m, e.nt.js, e.stream, strtoull(got, NULL, 10), NULL, &jerr), NATS_OK);
    ASSERT_TRUE(natsMsg_GetDataLength(m) == 32 && !memcmp(natsMsg_GetData(m), "e7x", 3));
    natsMsg_Destroy(m);

    rt_assert_exactly_once(&e.st, &e.nt, e.stream, "order", "e", 0, 1000);
    /* a second run finds nothing to do */
    ASSERT_OK(jsd_relay_run_until_idle(t.relay));
    jsd_relay_stats_get(t.relay, &rs);
    ASSERT_EQ(rs.published, 1000);
    rt_relay_finish(&t);
    jsd_metrics_destroy(mx);
    jsd_store_close(app);
    env_down(&e);
}

static void publishes_every_effect_once_sqlite(void **state)
{
    (void)state;
    publishes_every_effect_once(RT_SQLITE, 1);
}
static void publishes_every_effect_once_pg(void **state)
{
    (void)state;
    publishes_every_effect_once(RT_PG, 1);
}
static void publishes_every_effect_once_write_each(void **state)
{
    (void)state;
    publishes_every_effect_once(RT_SQLITE, 0);
}

/* ---- headers travel, reserved ones cannot be forged -------------------------------------- */

static void headers_and_expected_stream(void **state)
{
    (void)state;
    rt_env e;
    env_up(&e, RT_SQLITE, NULL);
    jsd_store *app = rt_open(&e.st);
    jsd_tx *tx = NULL;
    ASSERT_OK(jsd_tx_begin(&tx, app));
    jsd_header h[] = {{"Trace-Id", "abc-123"}};
    jsd_effect ef = {.owner = "o",
                     .id = "h1",
                     .subject = e.subject,
                     .headers = h,
                     .n_headers = 1,
                     .payload = "hello",
                     .len = 5};
    ASSERT_OK(jsd_tx_emit(tx, &ef));
    ASSERT_OK(jsd_tx_commit(tx));

    /* The server strips Nats-Expected-Stream before storing; a core
     * subscriber on the subject sees the headers as the relay sent them. */
    natsSubscription *wire = NULL;
    ASSERT_EQ(natsConnection_SubscribeSync(&wire, e.nt.nc, e.subject), NATS_OK);
    ASSERT_EQ(natsConnection_Flush(e.nt.nc), NATS_OK);

    rt_relay t;
    jsd_relay_opts o = fast_opts();
    rt_relay_make(&t, &e.st, e.nats_url, &o);
    ASSERT_OK(jsd_relay_run_until_idle(t.relay));
    natsMsg *m = NULL;
    const char *sent = NULL;
    ASSERT_EQ(natsSubscription_NextMsg(&m, wire, 5000), NATS_OK);
    ASSERT_EQ(natsMsgHeader_Get(m, "Nats-Expected-Stream", &sent), NATS_OK);
    ASSERT_STREQ(sent, e.stream);
    natsMsg_Destroy(m);
    m = NULL;
    natsSubscription_Destroy(wire);
    jsErrCode jerr = 0;
    ASSERT_EQ(js_GetMsg(&m, e.nt.js, e.stream, 1, NULL, &jerr), NATS_OK);
    const char *v = NULL;
    char want[JSD_MSG_ID_MAX], ns[JSD_NAMESPACE_MAX + 1];
    rt_ns(&e.st, ns);
    ASSERT_OK(jsd_effect_msg_id(ns, "o", "h1", want));
    ASSERT_EQ(natsMsgHeader_Get(m, "Nats-Msg-Id", &v), NATS_OK);
    ASSERT_STREQ(v, want);
    ASSERT_EQ(natsMsgHeader_Get(m, "Trace-Id", &v), NATS_OK);
    ASSERT_STREQ(v, "abc-123");
    ASSERT_EQ(natsMsg_GetDataLength(m), 5);
    natsMsg_Destroy(m);
    /* without a registry of its own the relay counts into the process-wide one */
    double count = -1;
    ASSERT_OK(jsd_metrics_get(jsd_metrics_default(), "jsd_relay_published_total", NULL, &count));
    ASSERT_EQ(count, 1);
    rt_relay_finish(&t);
    jsd_store_close(app);
    env_down(&e);
}

/* ---- durable timers ---------------------------------------------------------------------- */

static void not_before(rt_backend kind)
{
    rt_env e;
    env_up(&e, kind, NULL);
    jsd_store *app = rt_open(&e.st);
    rt_relay t;
    jsd_relay_opts o = fast_opts();
    o.poll_interval_ms = 5000; /* the relay must wake for the timer by itself */
    rt_relay_make(&t, &e.st, e.nats_url, &o);
    rt_relay_start(&t, false);

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t nb = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + 1500;
    rt_enqueue_opts late = {.id_prefix = "late", .n = 5, .subject = e.subject, .not_before_ms = nb};
    rt_enqueue(app, &late);
    rt_enqueue_opts now = {.id_prefix = "now", .n = 5, .subject = e.subject};
    rt_enqueue(app, &now);
    /* the ones due now go at once; the others wait for their time (checked
     * below by their receipts' times, not by racing the clock here) */
    ASSERT_WAIT(rt_q(&e.st, "SELECT count(*) FROM jsd_outbox_state WHERE effect_id LIKE 'now%' AND "
                            "stream_seq IS NOT NULL") == 5,
                10000);
    ASSERT_WAIT(rt_published(&e.st) == 10, 10000);
    char sql[200];
    snprintf(
        sql, sizeof(sql),
        "SELECT count(*) FROM jsd_outbox_state WHERE effect_id LIKE 'late%%' AND published_at < "
        "%lld",
        (long long)nb);
    ASSERT_EQ(rt_q(&e.st, sql), 0);
    rt_relay_finish(&t);
    ASSERT_EQ(rt_stream_count(&e.nt, e.stream), 10);
    jsd_store_close(app);
    env_down(&e);
}

static void not_before_sqlite(void **state)
{
    (void)state;
    not_before(RT_SQLITE);
}
static void not_before_pg(void **state)
{
    (void)state;
    not_before(RT_PG);
}

/* ---- the backlog gauges ------------------------------------------------------------------- */

static double gauge(jsd_metrics *mx, const char *name)
{
    double v = -1;
    return jsd_metrics_get(mx, name, NULL, &v) == JSD_OK ? v : -1;
}

/* A running relay refreshes jsd_outbox_backlog (counted on a connection of
 * its own, relay_gauge.c) while it claims: effects committed after it
 * started, due in an hour, are counted within two refreshes, and the due
 * ones are published meanwhile. */
static void backlog_gauge_while_running(rt_backend kind)
{
    rt_env e;
    env_up(&e, kind, NULL);
    jsd_store *app = rt_open(&e.st);
    jsd_metrics *mx = NULL;
    ASSERT_OK(jsd_metrics_create(&mx, NULL));
    rt_relay t;
    jsd_relay_opts o = fast_opts();
    o.metrics = mx;
    rt_relay_make(&t, &e.st, e.nats_url, &o);
    rt_relay_start(&t, false);
    ASSERT_WAIT(gauge(mx, "jsd_outbox_backlog") == 0, 10000);

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t hour = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + 3600 * 1000;
    rt_enqueue_opts later = {
        .id_prefix = "later", .n = 7, .subject = e.subject, .not_before_ms = hour};
    rt_enqueue(app, &later);
    rt_enqueue_opts now = {.id_prefix = "now", .n = 3, .subject = e.subject};
    rt_enqueue(app, &now);
    ASSERT_WAIT(rt_published(&e.st) == 3, 10000);
    ASSERT_WAIT(gauge(mx, "jsd_outbox_backlog") == 7, 15000);
    rt_relay_finish(&t);
    ASSERT_EQ(gauge(mx, "jsd_outbox_backlog"), 7);
    ASSERT_EQ(rt_stream_count(&e.nt, e.stream), 3);
    jsd_metrics_destroy(mx);
    jsd_store_close(app);
    env_down(&e);
}

/* An effect that keeps failing while others are published (a subject no
 * stream captures) shows in jsd_outbox_failing and ages in
 * jsd_outbox_oldest_unpublished_age_seconds while it waits out its retry
 * delay: before, such a row was not "due", the age stayed 0 and no alert
 * could see it. */
static void failing_effect_gauges(rt_backend kind)
{
    rt_env e;
    env_up(&e, kind, NULL);
    jsd_store *app = rt_open(&e.st);
    jsd_metrics *mx = NULL;
    ASSERT_OK(jsd_metrics_create(&mx, NULL));
    rt_relay t;
    jsd_relay_opts o = fast_opts();
    o.metrics = mx;
    o.backoff_base_ms = 60000; /* the failed row waits a minute for its retry */
    o.backoff_cap_ms = 60000;
    o.publish_deadline_ms = 20000;
    rt_relay_make(&t, &e.st, e.nats_url, &o);
    rt_relay_start(&t, false);
    char lost[80];
    snprintf(lost, sizeof(lost), "%s", jsd_test_unique("nostream.failing."));
    rt_enqueue_opts bad = {.id_prefix = "bad", .n = 1, .subject = lost};
    rt_enqueue(app, &bad);
    rt_enqueue_opts good = {.id_prefix = "good", .n = 5, .subject = e.subject};
    rt_enqueue(app, &good);
    ASSERT_WAIT(rt_published(&e.st) == 5, 15000);
    ASSERT_WAIT(gauge(mx, "jsd_outbox_failing") == 1, 15000);
    ASSERT_WAIT(gauge(mx, "jsd_outbox_oldest_unpublished_age_seconds") >= 1, 15000);
    rt_relay_finish(&t);
    ASSERT_EQ(gauge(mx, "jsd_outbox_backlog"), 1);
    jsd_metrics_destroy(mx);
    jsd_store_close(app);
    env_down(&e);
}

static void failing_effect_gauges_sqlite(void **state)
{
    (void)state;
    failing_effect_gauges(RT_SQLITE);
}

static void failing_effect_gauges_pg(void **state)
{
    (void)state;
    failing_effect_gauges(RT_PG);
}

static void backlog_gauge_while_running_sqlite(void **state)
{
    (void)state;
    backlog_gauge_while_running(RT_SQLITE);
}
static void backlog_gauge_while_running_pg(void **state)
{
    (void)state;
    backlog_gauge_while_running(RT_PG);
}

/* ---- dead-letter budget ------------------------------------------------------------------- */

static void dead_letter_budget(rt_backend kind)
{
    rt_env e;
    env_up(&e, kind, NULL);
    jsd_store *app = rt_open(&e.st);
    char nowhere[128];
    snprintf(nowhere, sizeof(nowhere), "%s.nowhere", jsd_test_unique("nostream"));
    rt_enqueue_opts bad = {.id_prefix = "bad", .n = 2, .subject = nowhere};
    rt_enqueue(app, &bad);
    rt_enqueue_opts good = {.id_prefix = "good", .n = 3, .subject = e.subject};
    rt_enqueue(app, &good);

    rt_relay t;
    jsd_relay_opts o = fast_opts();
    o.attempt_budget = 3;
    jsd_metrics *mx = NULL;
    ASSERT_OK(jsd_metrics_create(&mx, NULL));
    o.metrics = mx;
    rt_relay_make(&t, &e.st, e.nats_url, &o);
    rt_relay_start(&t, false);
    ASSERT_WAIT(rt_q(&e.st, RT_SQL_DEAD) == 2, 20000);
    ASSERT_EQ(rt_published(&e.st), 3);
    ASSERT_EQ(rt_q(&e.st, "SELECT min(attempts) FROM jsd_outbox_state WHERE effect_id LIKE 'bad%'"),
              3);
    ASSERT_EQ(rt_q(&e.st, "SELECT max(attempts) FROM jsd_outbox_state WHERE effect_id LIKE 'bad%'"),
              3);
    char reason[1100];
    rt_qs(&e.st, "SELECT last_error FROM jsd_outbox_state WHERE effect_id = 'bad0'", reason,
          sizeof(reason));
    ASSERT_CONTAINS(reason, "no stream captures subject");
    jsd_relay_stats rs;
    jsd_relay_stats_get(t.relay, &rs);
    ASSERT_EQ(rs.dead_lettered, 2);
    ASSERT_EQ(rs.errors, 6);
    double v = -1;
    ASSERT_OK(jsd_metrics_get(mx, "jsd_relay_dead_lettered_total", NULL, &v));
    ASSERT_EQ(v, 2);
    ASSERT_OK(jsd_metrics_get(mx, "jsd_relay_errors_total", NULL, &v));
    ASSERT_EQ(v, 6);
    /* a dead-lettered effect is never claimed again */
    jsd_test_sleep_ms(500);
    ASSERT_EQ(rt_q(&e.st, "SELECT max(attempts) FROM jsd_outbox_state WHERE effect_id LIKE 'bad%'"),
              3);
    jsd_store_stats ss;
    ASSERT_OK(jsd_store_stats_get(app, &ss));
    ASSERT_EQ(ss.dead_lettered, 2);
    rt_relay_finish(&t);
    jsd_metrics_destroy(mx);
    jsd_store_close(app);
    env_down(&e);
}

static void dead_letter_budget_sqlite(void **state)
{
    (void)state;
    dead_letter_budget(RT_SQLITE);
}
static void dead_letter_budget_pg(void **state)
{
    (void)state;
    dead_letter_budget(RT_PG);
}

/* ---- ordering keys ------------------------------------------------------------------------ */

/* Per-key commit order in the stream: for each key, the effect numbers of its
 * messages increase with the stream sequence. */
static void assert_key_order(rt_nats *nt, const char *stream, int n_keys, int n)
{
    size_t count = 0;
    rt_msg *msgs = rt_stream_read(nt, stream, &count);
    ASSERT_EQ(count, n);
    int last[64];
    for (int k = 0; k < n_keys; k++)
        last[k] = -1;
    for (size_t i = 0; i < count; i++) {
        int idx = (int)strtol(msgs[i].head + 1, NULL, 10); /* "e<idx>" */
        int k = idx % n_keys;
        if (idx <= last[k])
            fail_msg("key %d: effect e%d stored after e%d (seq %llu)", k, idx, last[k],
                     (unsigned long long)msgs[i].seq);
        last[k] = idx;
    }
    free(msgs);
}

static void ordering_keys(rt_backend kind)
{
    rt_env e;
    env_up(&e, kind, NULL);
    jsd_store *app = rt_open(&e.st);
    char key[64];
    snprintf(key, sizeof(key), "k%%d");
    rt_enqueue_opts q = {
        .n = 600, .subject = e.subject, .order_key = key, .n_keys = 3, .per_tx = 7};
    rt_enqueue(app, &q);
    rt_relay t;
    jsd_relay_opts o = fast_opts();
    rt_relay_make(&t, &e.st, e.nats_url, &o);
    ASSERT_OK(jsd_relay_run_until_idle(t.relay));
    ASSERT_EQ(rt_published(&e.st), 600);
    assert_key_order(&e.nt, e.stream, 3, 600);
    rt_relay_finish(&t);
    jsd_store_close(app);
    env_down(&e);
}

static void ordering_keys_sqlite(void **state)
{
    (void)state;
    ordering_keys(RT_SQLITE);
}
static void ordering_keys_pg(void **state)
{
    (void)state;
    ordering_keys(RT_PG);
}

/* A failing effect holds back the later effects of its key until it is
 * dead-lettered; other keys are not held back. */
static void failed_head_blocks_its_key(rt_backend kind)
{
    rt_env e;
    env_up(&e, kind, NULL);
    jsd_store *app = rt_open(&e.st);
    char nowhere[128];
    snprintf(nowhere, sizeof(nowhere), "%s.nowhere", jsd_test_unique("nostream"));
    jsd_tx *tx = NULL;
    ASSERT_OK(jsd_tx_begin(&tx, app));
    jsd_effect a = {
        .owner = "o", .id = "head", .subject = nowhere, .payload = "1", .len = 1, .order_key = "K"};
    jsd_effect b = {.owner = "o",
                    .id = "next",
                    .subject = e.subject,
                    .payload = "2",
                    .len = 1,
                    .order_key = "K"};
    jsd_effect c = {.owner = "o",
                    .id = "other",
                    .subject = e.subject,
                    .payload = "3",
                    .len = 1,
                    .order_key = "L"};
    ASSERT_OK(jsd_tx_emit(tx, &a));
    ASSERT_OK(jsd_tx_emit(tx, &b));
    ASSERT_OK(jsd_tx_emit(tx, &c));
    ASSERT_OK(jsd_tx_commit(tx));

    rt_relay t;
    jsd_relay_opts o = fast_opts();
    o.attempt_budget = 3;
    o.backoff_base_ms = 300;
    o.backoff_cap_ms = 300;
    rt_relay_make(&t, &e.st, e.nats_url, &o);
    rt_relay_start(&t, false);
    ASSERT_WAIT(rt_q(&e.st, "SELECT count(*) FROM jsd_outbox_state WHERE effect_id = 'other' AND "
                            "stream_seq IS NOT NULL") == 1,
                10000);
    /* while the head has attempts left, "next" is not published */
    ASSERT_WAIT(rt_q(&e.st, "SELECT attempts FROM jsd_outbox_state WHERE effect_id = 'head'") >= 1,
                10000);
    ASSERT_EQ(rt_q(&e.st, "SELECT count(*) FROM jsd_outbox_state WHERE effect_id = 'next' AND "
                          "stream_seq IS NOT NULL"),
              0);
    ASSERT_WAIT(rt_q(&e.st, "SELECT count(*) FROM jsd_outbox_state WHERE effect_id = 'next' AND "
                            "stream_seq IS NOT NULL") == 1,
                20000);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DEAD), 1);
    ASSERT_TRUE(
        rt_q(&e.st, "SELECT published_at FROM jsd_outbox_state WHERE effect_id = 'next'") >=
        rt_q(&e.st, "SELECT dead_lettered_at FROM jsd_outbox_state WHERE effect_id = 'head'"));
    rt_relay_finish(&t);
    jsd_store_close(app);
    env_down(&e);
}

static void failed_head_blocks_its_key_sqlite(void **state)
{
    (void)state;
    failed_head_blocks_its_key(RT_SQLITE);
}
static void failed_head_blocks_its_key_pg(void **state)
{
    (void)state;
    failed_head_blocks_its_key(RT_PG);
}

/* ---- wake-ups ------------------------------------------------------------------------------ */

/* With a 60-second poll interval, a commit is still published at once: the
 * wake-up (NOTIFY, or the in-process signal) prompted the claim. */
static void wakeup_prompts_claim(rt_backend kind)
{
    rt_env e;
    env_up(&e, kind, NULL);
    jsd_store *app = rt_open(&e.st);
    rt_relay t;
    jsd_relay_opts o = fast_opts();
    o.poll_interval_ms = 60000;
    rt_relay_make(&t, &e.st, e.nats_url, &o);
    rt_relay_start(&t, false);
    jsd_test_sleep_ms(300); /* let it go idle */
    for (int round = 0; round < 3; round++) {
        rt_enqueue_opts q = {.id_prefix = "w", .first = round, .n = 1, .subject = e.subject};
        int64_t t0 = jsd_test_mono_ms();
        rt_enqueue(app, &q);
        ASSERT_WAIT(rt_published(&e.st) == round + 1, 5000);
        ASSERT_LE(jsd_test_mono_ms() - t0, 5000);
    }
    rt_relay_finish(&t);
    jsd_store_close(app);
    env_down(&e);
}

static void wakeup_prompts_claim_sqlite(void **state)
{
    (void)state;
    wakeup_prompts_claim(RT_SQLITE);
}
static void wakeup_prompts_claim_pg(void **state)
{
    (void)state;
    wakeup_prompts_claim(RT_PG);
}

/* ---- stop ----------------------------------------------------------------------------------- */

static void stop_settles_in_flight(void **state)
{
    (void)state;
    rt_env e;
    env_up(&e, RT_SQLITE, NULL);
    jsd_store *app = rt_open(&e.st);
    rt_enqueue_opts q = {.n = 20000, .subject = e.subject, .per_tx = 1000};
    rt_enqueue(app, &q);
    rt_relay t;
    jsd_relay_opts o = fast_opts();
    o.publish_deadline_ms = 20000; /* a loaded machine must not turn acks into UNKNOWN */
    o.lease_ms = 25000;
    rt_relay_make(&t, &e.st, e.nats_url, &o);
    rt_relay_start(&t, false);
    ASSERT_WAIT(rt_published(&e.st) > 0, 20000);
    jsd_relay_stop(t.relay);
    ASSERT_WAIT(rt_relay_done(&t), 30000);
    jsd_relay_stats rs;
    jsd_relay_stats_get(t.relay, &rs);
    ASSERT_EQ(rs.in_flight, 0);
    /* no lease is left behind: each claimed effect got its receipt, its
     * failure, or its lease back */
    ASSERT_EQ(rt_q(&e.st, "SELECT count(*) FROM jsd_outbox_state WHERE lease_token IS NOT NULL"),
              0);
    ASSERT_EQ(rt_q(&e.st, "SELECT count(*) FROM jsd_outbox_lease"), 0); /* SQLite's range leases */
    long long pub = rt_published(&e.st);
    ASSERT_EQ(pub, (long long)rs.published);
    /* every stored message has its receipt, unless its outcome was UNKNOWN
     * (then it is recorded as a failed attempt, to be retried with its id) */
    long long unknown =
        rt_q(&e.st, "SELECT count(*) FROM jsd_outbox_state WHERE stream_seq IS NULL "
                    "AND last_error LIKE 'unknown%'");
    ASSERT_LE((long long)rt_stream_count(&e.nt, e.stream) - pub, unknown);
    ASSERT_TRUE(pub < 20000); /* it did stop early */
    rt_relay_finish(&t);
    /* a new relay finishes the rest at once (no lease to wait for) */
    rt_relay t2;
    o.backoff_base_ms = 1;
    o.backoff_cap_ms = 1;
    rt_relay_make(&t2, &e.st, e.nats_url, &o);
    ASSERT_OK(jsd_relay_run_until_idle(t2.relay));
    ASSERT_EQ(rt_published(&e.st), 20000);
    ASSERT_LE(rt_q(&e.st, RT_SQL_DUPLICATES), unknown);
    rt_assert_exactly_once(&e.st, &e.nt, e.stream, "o", "e", 0, 20000);
    rt_relay_finish(&t2);
    jsd_store_close(app);
    env_down(&e);
}

/* ---- the two bounds (relay.c DESIGN 12) ------------------------------------------------------ */

/* An on_published callback that holds the receipt writer (PostgreSQL: the
 * writer has its own connection, so claims go on) until released. */
typedef struct stall {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stalled, released;
} stall;

static void stall_writer(const jsd_relay_published *p, void *user)
{
    (void)p;
    stall *w = user;
    pthread_mutex_lock(&w->mu);
    w->stalled = true;
    int64_t end = jsd__mono_ms() + 60000; /* a failed case must not hang the suite */
    while (!w->released && jsd__mono_ms() < end)
        jsd__cond_wait_until_ms(&w->cv, &w->mu, end);
    pthread_mutex_unlock(&w->mu);
}

static bool stalled(stall *w)
{
    pthread_mutex_lock(&w->mu);
    bool s = w->stalled;
    pthread_mutex_unlock(&w->mu);
    return s;
}

/* max_in_flight bounds the publications awaiting a PubAck; effects waiting
 * for their receipt have a bound of their own. A writer that records nothing
 * stops the claims once max_in_flight effects wait for it: the relay never
 * holds more than 2 x max_in_flight claimed and unrecorded, and nothing is
 * lost or doubled once the writer goes on. */
static void stalled_writer_holds_claims_back(void **state)
{
    (void)state;
    enum { BATCH = 8, WINDOW = 16, N = 200 };
    rt_env e;
    env_up(&e, RT_PG, NULL);
    jsd_store *app = rt_open(&e.st);
    rt_enqueue_opts q = {.n = N, .subject = e.subject};
    rt_enqueue(app, &q);
    stall w = {.stalled = false, .released = false};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    rt_relay t;
    jsd_relay_opts o = fast_opts();
    o.batch_size = BATCH;
    o.max_in_flight = WINDOW;
    o.on_published = stall_writer;
    o.on_published_user = &w;
    rt_relay_make(&t, &e.st, e.nats_url, &o);
    rt_relay_start(&t, false);
    ASSERT_WAIT(stalled(&w), 20000);
    /* Everything claimed is published and settled, and at least the window
     * waits for the writer: from here on no claim may run. */
    jsd_relay_stats rs;
    ASSERT_WAIT((jsd_relay_stats_get(t.relay, &rs), rs.in_flight == 0) &&
                    rt_stream_count(&e.nt, e.stream) >= WINDOW,
                20000);
    uint64_t sent = rt_stream_count(&e.nt, e.stream);
    ASSERT_LE(sent, 2 * WINDOW);
    /* only the batches the writer holds (it takes all queued at once) have
     * their receipts; every other effect sent is still leased */
    long long recorded = rt_published(&e.st);
    ASSERT_TRUE(recorded >= BATCH && recorded % BATCH == 0 && recorded <= (long long)sent);
    ASSERT_EQ(rt_q(&e.st, "SELECT count(*) FROM jsd_outbox_state WHERE lease_token IS NOT NULL "
                          "AND stream_seq IS NULL"),
              (long long)sent - recorded);

    pthread_mutex_lock(&w.mu);
    w.released = true;
    pthread_cond_broadcast(&w.cv);
    pthread_mutex_unlock(&w.mu);
    ASSERT_WAIT(rt_published(&e.st) == N, 30000);
    rt_relay_finish(&t);
    rt_assert_exactly_once(&e.st, &e.nt, e.stream, "o", "e", 0, N);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DUPLICATES), 0);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    jsd_store_close(app);
    env_down(&e);
}

/* ---- options ----------------------------------------------------------------------------------
 */

static void options_are_validated(void **state)
{
    (void)state;
    rt_env e;
    env_up(&e, RT_SQLITE, NULL);
    jsd_store *s = rt_open(&e.st);
    jsd_conn *c = rt_conn(e.nats_url);
    jsd_relay *r = NULL;
    jsd_error err;
    jsd_relay_opts o;

#define BAD(field, value, needle)                                                                  \
    do {                                                                                           \
        jsd_relay_opts_init(&o);                                                                   \
        o.field = (value);                                                                         \
        jsd_error_clear(&err);                                                                     \
        ASSERT_STATUS(jsd_relay_create(&r, s, c, &o, &err), JSD_ERR_CONFIG);                       \
        ASSERT_TRUE(r == NULL);                                                                    \
        ASSERT_CONTAINS(err.msg, needle);                                                          \
    } while (0)
#define GOOD(field, value)                                                                         \
    do {                                                                                           \
        jsd_relay_opts_init(&o);                                                                   \
        o.field = (value);                                                                         \
        ASSERT_OK(jsd_relay_create(&r, s, c, &o, &err));                                           \
        jsd_relay_destroy(r);                                                                      \
        r = NULL;                                                                                  \
    } while (0)

    BAD(batch_size, 0, "batch_size");
    BAD(batch_size, 4097, "batch_size");
    GOOD(batch_size, 4096);
    BAD(max_in_flight, 0, "max_in_flight");
    BAD(max_in_flight, 1025, "max_in_flight");
    GOOD(max_in_flight, 1024);
    BAD(publish_deadline_ms, 0, "publish_deadline_ms");
    BAD(publish_deadline_ms, 300001, "publish_deadline_ms");
    BAD(lease_ms, 5999, "lease_ms"); /* default deadline 5000 + 1000 */
    GOOD(lease_ms, 6000);
    BAD(poll_interval_ms, 0, "poll_interval_ms");
    BAD(attempt_budget, 0, "attempt_budget");
    BAD(backoff_base_ms, 0, "backoff");
    BAD(backoff_cap_ms, 10, "backoff");
#undef BAD
#undef GOOD
    ASSERT_STATUS(jsd_relay_create(&r, NULL, c, NULL, &err), JSD_ERR_INVALID);
    ASSERT_STATUS(jsd_relay_create(&r, s, NULL, NULL, &err), JSD_ERR_INVALID);
    ASSERT_OK(jsd_relay_create(&r, s, c, NULL, &err)); /* NULL opts: defaults */
    jsd_relay_destroy(r);
    jsd_relay_destroy(NULL);
    jsd_conn_close(c);
    jsd_store_close(s);
    env_down(&e);
}

/* ---- broker down -------------------------------------------------------------------------------
 */

static void broker_down(rt_backend kind)
{
    jsd_fx_nats fx;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    rt_env e;
    env_up(&e, kind, fx.url);
    jsd_store *app = rt_open(&e.st);
    rt_relay t;
    jsd_relay_opts o = fast_opts();
    o.publish_deadline_ms = 1000;
    o.lease_ms = 2500;
    rt_relay_make(&t, &e.st, e.nats_url, &o);
    rt_relay_start(&t, false);

    rt_enqueue_opts q1 = {.n = 500, .subject = e.subject};
    rt_enqueue(app, &q1);
    ASSERT_WAIT(rt_published(&e.st) == 500, 20000);

    ASSERT_EQ(jsd_fx_nats_kill(&fx), 0);
    rt_enqueue_opts q2 = {.first = 500, .n = 1000, .subject = e.subject, .per_tx = 50};
    rt_enqueue(app, &q2);
    jsd_test_sleep_ms(1500); /* the outage lasts; the relay must ride it out */
    ASSERT_TRUE(!rt_relay_done(&t));
    ASSERT_EQ(rt_published(&e.st), 500);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DEAD), 0);

    ASSERT_EQ(jsd_fx_nats_restart(&fx), 0);
    rt_enqueue_opts q3 = {.first = 1500, .n = 500, .subject = e.subject};
    rt_enqueue(app, &q3);
    ASSERT_WAIT(rt_published(&e.st) == 2000, 60000);
    ASSERT_TRUE(!rt_relay_done(&t));
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DEAD), 0);
    rt_relay_finish(&t);
    rt_nats_close(&e.nt);
    rt_nats_open(&e.nt, fx.url);
    rt_assert_exactly_once(&e.st, &e.nt, e.stream, "o", "e", 0, 2000);
    jsd_store_close(app);
    env_down(&e);
}

static void broker_down_sqlite(void **state)
{
    (void)state;
    broker_down(RT_SQLITE);
}
static void broker_down_pg(void **state)
{
    (void)state;
    broker_down(RT_PG);
}

/* A connection that nats.c closes for good (here: reconnect_attempts
 * exhausted while the server is down) ends the run with JSD_ERR_CONNECT and
 * a text that says so, instead of a relay that waits for ever on a
 * connection that will not come back. What it had not published stays
 * in the store, none of it dead-lettered. */
static void gone_connection_ends_the_run(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    rt_env e;
    env_up(&e, RT_SQLITE, fx.url);
    jsd_store *app = rt_open(&e.st);
    rt_enqueue_opts q1 = {.n = 100, .subject = e.subject};
    rt_enqueue(app, &q1);

    rt_relay t;
    memset(&t, 0, sizeof(t));
    t.store = rt_open(&e.st);
    t.conn = jsd_fx_conn_giving_up(fx.url);
    jsd_error err;
    jsd_relay_opts o = fast_opts();
    o.publish_deadline_ms = 1000;
    o.lease_ms = 2500;
    ASSERT_OK(jsd_relay_create(&t.relay, t.store, t.conn, &o, &err), err.msg);
    rt_relay_start(&t, false);
    ASSERT_WAIT(rt_published(&e.st) == 100, 20000);

    ASSERT_EQ(jsd_fx_nats_kill(&fx), 0);
    ASSERT_WAIT(!jsd_conn_is_connected(t.conn), 5000);
    rt_enqueue_opts q2 = {.first = 100, .n = 50, .subject = e.subject};
    rt_enqueue(app, &q2);
    if (!WAIT_UNTIL(rt_relay_done(&t), 15000))
        fail_msg("the relay still runs on a connection nats.c closed for good");
    pthread_join(t.th, NULL);
    t.th = 0;
    ASSERT_STATUS(t.rc, JSD_ERR_CONNECT);
    ASSERT_CONTAINS(jsd_relay_errmsg(t.relay), "closed for good");
    ASSERT_EQ(rt_published(&e.st), 100);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_TOTAL), 150);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DEAD), 0);
    jsd_relay_destroy(t.relay);
    jsd_conn_close(t.conn);
    jsd_store_close(t.store);
    jsd_store_close(app);
    env_down(&e);
}

/* ---- a dropped PubAck ---------------------------------------------------------------------------
 */

/* The fault proxy drops the first PubAck: the publication is UNKNOWN (the
 * message was stored), the effect is retried with the same Nats-Msg-Id, the
 * broker absorbs it, and the receipt says duplicate=true with the original
 * sequence. One message in the stream. */
static void dropped_puback(rt_backend kind)
{
    rt_env e;
    env_up(&e, kind, NULL);
    jsd_fx_proxy px;
    ASSERT_EQ(jsd_fx_proxy_start(jsd_fx_url_port(e.nats_url), "drop-first-puback", &px), 0);

    jsd_store *app = rt_open(&e.st);
    rt_enqueue_opts q = {.owner = "px", .n = 1, .subject = e.subject};
    rt_enqueue(app, &q);
    rt_relay t;
    jsd_relay_opts o = fast_opts();
    o.publish_deadline_ms = 1000;
    o.lease_ms = 2000;
    rt_relay_make(&t, &e.st, px.url, &o);
    rt_relay_start(&t, false);
    ASSERT_WAIT(rt_published(&e.st) == 1, 20000);
    ASSERT_EQ(jsd_fx_proxy_dropped_acks(&px), 1);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DUPLICATES), 1);
    ASSERT_EQ(rt_q(&e.st, "SELECT attempts FROM jsd_outbox_state"), 1);
    char err[1100];
    rt_qs(&e.st, "SELECT last_error FROM jsd_outbox_state", err, sizeof(err));
    ASSERT_CONTAINS(err, "unknown");
    ASSERT_EQ(rt_q(&e.st, "SELECT stream_seq FROM jsd_outbox_state"), 1);
    /* the relay counts a receipt once it is durable, which can be a moment
     * after the store shows it (the WAL sync, relay.c DESIGN 7) */
    jsd_relay_stats rs;
    ASSERT_WAIT((jsd_relay_stats_get(t.relay, &rs), rs.published == 1 && rs.duplicates == 1), 5000);
    ASSERT_EQ(rs.errors, 1);
    rt_relay_finish(&t);
    rt_assert_exactly_once(&e.st, &e.nt, e.stream, "px", "e", 0, 1);
    rt_assert_receipts_match(&e.st, &e.nt, e.stream);
    jsd_fx_proxy_stop(&px);
    jsd_store_close(app);
    env_down(&e);
}

static void dropped_puback_sqlite(void **state)
{
    (void)state;
    dropped_puback(RT_SQLITE);
}
static void dropped_puback_pg(void **state)
{
    (void)state;
    dropped_puback(RT_PG);
}

/* ---- the command line
 * ----------------------------------------------------------------------------- */

/* Enqueue n effects "<prefix><i>" of owner "cli", then `jsdurable relay
 * --until-idle --stats <flags>` exits 0 and counts n published, none a
 * duplicate or failed. */
static void relay_cli_until_idle(rt_env *e, jsd_store *app, const char *prefix, int n,
                                 const char *flags)
{
    char cmd[2048], out[8192], want[96];
    rt_enqueue_opts q = {.owner = "cli", .id_prefix = prefix, .n = n, .subject = e->subject};
    rt_enqueue(app, &q);
    snprintf(cmd, sizeof(cmd), "%s relay --store '%s' --nats %s --until-idle --stats %s",
             jsd_fx_bin("jsdurable"), e->st.url, e->nats_url, flags);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    snprintf(want, sizeof(want), "{\"published\":%d,\"duplicates\":0,\"errors\":0", n);
    ASSERT_CONTAINS(out, want);
}

static void cli_flags_and_until_idle(void **state)
{
    (void)state;
    rt_env e;
    env_up(&e, RT_SQLITE, NULL);
    char cmd[2048], out[8192];
    const char *bin = jsd_fx_bin("jsdurable");

    snprintf(cmd, sizeof(cmd), "%s relay --help", bin);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "Example:");
    ASSERT_CONTAINS(out, "--until-idle");
    ASSERT_CONTAINS(out, "--write-each");

    /* every bound crossed is refused with a usage error naming the flag */
    const char *bad[] = {"--batch 0",
                         "--batch 4097",
                         "--max-in-flight 1025",
                         "--poll-ms 0",
                         "--deadline-ms 300001",
                         "--budget 0",
                         "--backoff-ms 5",
                         "--batch x"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(cmd, sizeof(cmd), "%s relay --store '%s' --nats %s %s", bin, e.st.url, e.nats_url,
                 bad[i]);
        ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 64);
        ASSERT_CONTAINS(out, "bad value");
    }
    snprintf(cmd, sizeof(cmd), "JSD_STORE= %s relay --nats %s", bin, e.nats_url);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 64);
    ASSERT_CONTAINS(out, "no store");
    /* a lease that does not cover the deadline: configuration refused */
    snprintf(cmd, sizeof(cmd), "%s relay --store '%s' --nats %s --lease-ms 5000 --deadline-ms 5000",
             bin, e.st.url, e.nats_url);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 78);
    ASSERT_CONTAINS(out, "lease_ms 5000 must exceed publish_deadline_ms 5000");

    /* --until-idle publishes everything, prints its counters, exits 0 */
    jsd_store *app = rt_open(&e.st);
    relay_cli_until_idle(&e, app, "e", 300, "--batch 64");
    ASSERT_EQ(rt_published(&e.st), 300);
    rt_assert_exactly_once(&e.st, &e.nt, e.stream, "cli", "e", 0, 300);
    /* --write-each: the same, with each publication written at once */
    relay_cli_until_idle(&e, app, "w", 100, "--write-each");
    ASSERT_EQ(rt_published(&e.st), 400);
    size_t stored = 0;
    free(rt_stream_read(&e.nt, e.stream, &stored));
    ASSERT_SIZE_EQ(stored, 400);
    jsd_store_close(app);
    env_down(&e);
}

JSD_TEST_MAIN(
    cmocka_unit_test(publishes_every_effect_once_sqlite),
    cmocka_unit_test(publishes_every_effect_once_pg),
    cmocka_unit_test(publishes_every_effect_once_write_each),
    cmocka_unit_test(headers_and_expected_stream), cmocka_unit_test(not_before_sqlite),
    cmocka_unit_test(not_before_pg), cmocka_unit_test(backlog_gauge_while_running_sqlite),
    cmocka_unit_test(failing_effect_gauges_sqlite), cmocka_unit_test(failing_effect_gauges_pg),
    cmocka_unit_test(backlog_gauge_while_running_pg), cmocka_unit_test(dead_letter_budget_sqlite),
    cmocka_unit_test(dead_letter_budget_pg), cmocka_unit_test(ordering_keys_sqlite),
    cmocka_unit_test(ordering_keys_pg), cmocka_unit_test(failed_head_blocks_its_key_sqlite),
    cmocka_unit_test(failed_head_blocks_its_key_pg), cmocka_unit_test(wakeup_prompts_claim_sqlite),
    cmocka_unit_test(wakeup_prompts_claim_pg), cmocka_unit_test(stop_settles_in_flight),
    cmocka_unit_test(stalled_writer_holds_claims_back), cmocka_unit_test(options_are_validated),
    cmocka_unit_test(broker_down_sqlite), cmocka_unit_test(broker_down_pg),
    cmocka_unit_test(gone_connection_ends_the_run), cmocka_unit_test(dropped_puback_sqlite),
    cmocka_unit_test(dropped_puback_pg), cmocka_unit_test(cli_flags_and_until_idle))
