/*
 * The duplicate-window horizon (src/relay_horizon.c), against a real
 * nats-server behind the fault proxy and both stores. A broker that stores
 * the relay's messages but withholds every PubAck leaves an effect
 * unresolved: before its stream's (short) duplicate window ends, the relay
 * logs it at warn and counts it in jsd_relay_dedup_horizon_at_risk_total,
 * and the effect's first attempt is kept in the store; once the acks flow,
 * the retry is a duplicate inside the window and the stream holds one
 * message. Receipts whose PubAcks came while PostgreSQL was stopped are
 * held through the outage (longer than the lease) and written when the store
 * is back: nothing is published a second time. A claim whose asynchronous
 * commit is lost in a PostgreSQL crash (relay.c DESIGN 8) costs neither a
 * second message nor a lost receipt.
 */
#include <signal.h>
#include <pthread.h>
#include <stdlib.h>

#include "proxy.h"
#include "relay_env.h"

static int url_port(const char *url)
{
    const char *colon = strrchr(url, ':');
    return colon ? (int)strtol(colon + 1, NULL, 10) : 0;
}

/* The warn lines of the relay, kept for the test to look at. */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[1 << 16];

static void log_sink(jsd_log_level level, const char *component, const char *line, void *user)
{
    (void)component;
    (void)user;
    if (level < JSD_LOG_WARN)
        return;
    pthread_mutex_lock(&log_mu);
    size_t n = strlen(log_text);
    snprintf(log_text + n, sizeof(log_text) - n, "%s\n", line);
    pthread_mutex_unlock(&log_mu);
}

static bool logged(const char *needle)
{
    pthread_mutex_lock(&log_mu);
    bool yes = strstr(log_text, needle) != NULL;
    pthread_mutex_unlock(&log_mu);
    return yes;
}

static double metric(jsd_metrics *mx, const char *name)
{
    double v = -1;
    ASSERT_OK(jsd_metrics_get(mx, name, NULL, &v));
    return v;
}

#define WINDOW_MS 6000

static void withheld_acks(rt_backend kind)
{
    rt_store st;
    rt_store_new(&st, kind);
    rt_nats nt;
    const char *url = jsd_fx_shared_nats_url();
    rt_nats_open(&nt, url);
    char stream[64], root[64], filter[80], subject[100];
    snprintf(stream, sizeof(stream), "%s", jsd_test_unique("HZN"));
    snprintf(root, sizeof(root), "%s", jsd_test_unique("hzn"));
    snprintf(filter, sizeof(filter), "%s.>", root);
    snprintf(subject, sizeof(subject), "%s.a", root);
    rt_stream_add_with(&nt, stream, filter, WINDOW_MS, 0);
    jsd_fx_proxy px;
    ASSERT_EQ(jsd_fx_proxy_start(url_port(url), "withhold-acks", &px), 0);
    jsd_log_configure(JSD_LOG_WARN, JSD_LOG_TEXT, log_sink, NULL);

    jsd_store *s = rt_open(&st);
    rt_enqueue(s, &(rt_enqueue_opts){.owner = "o", .id_prefix = "h", .subject = subject, .n = 1});
    jsd_metrics *mx = NULL;
    ASSERT_OK(jsd_metrics_create(&mx, NULL));
    /* retry horizon 1000 + 1000 + 2000 + 100 ms: inside the 6 s window */
    jsd_relay_opts o;
    jsd_relay_opts_init(&o);
    o.publish_deadline_ms = 1000;
    o.backoff_base_ms = 100;
    o.backoff_cap_ms = 1000;
    o.lease_ms = 2000;
    o.poll_interval_ms = 100;
    o.metrics = mx;
    rt_relay t;
    rt_relay_make(&t, &st, px.url, &o);
    int64_t t0 = jsd_test_mono_ms();
    rt_relay_start(&t, false);

    /* The broker stores the first attempt; its PubAck never comes. */
    ASSERT_WAIT(rt_stream_count(&nt, stream) == 1, 3000);
    ASSERT_WAIT(metric(mx, "jsd_relay_dedup_horizon_at_risk_total") >= 1, WINDOW_MS);
    int64_t seen = jsd_test_mono_ms() - t0;
    if (seen >= WINDOW_MS)
        fail_msg("the horizon was reported %lld ms after the first attempt, not before the "
                 "%d ms window ended",
                 (long long)seen, WINDOW_MS);
    /* the relay counts, then logs: the line follows the count */
    ASSERT_WAIT(logged("past half its stream's duplicate window"), 2000);
    ASSERT_EQ(metric(mx, "jsd_relay_dedup_horizon_passed_total"), 0);
    /* the first attempt's time is in the store, for any relay that retries */
    ASSERT_TRUE(rt_q(&st, "SELECT count(*) FROM jsd_outbox WHERE first_attempt_at IS NOT NULL "
                          "AND published_at IS NULL") == 1);

    /* Acks flow again: the retry is a duplicate inside the window. */
    ASSERT_EQ(jsd_fx_proxy_mode(&px, "pass"), 0);
    ASSERT_WAIT(rt_published(&st) == 1, 10000);
    rt_relay_finish(&t);
    ASSERT_EQ(rt_q(&st, RT_SQL_DUPLICATES), 1);
    ASSERT_EQ(rt_stream_count(&nt, stream), 1);
    ASSERT_EQ(metric(mx, "jsd_relay_dedup_horizon_passed_total"), 0);

    jsd_log_configure(JSD_LOG_WARN, JSD_LOG_TEXT, NULL, NULL);
    jsd_metrics_destroy(mx);
    jsd_store_close(s);
    jsd_fx_proxy_stop(&px);
    rt_nats_close(&nt);
    rt_store_close(&st);
}

static void withheld_acks_sqlite(void **state)
{
    (void)state;
    withheld_acks(RT_SQLITE);
}

static void withheld_acks_pg(void **state)
{
    (void)state;
    withheld_acks(RT_PG);
}

/* PubAcks that arrive while PostgreSQL is stopped: the receipts are held
 * (past the lease) and written when it is back, so nothing is republished. */
static void receipts_held_through_store_outage(void **state)
{
    (void)state;
    jsd_fx_pg pg;
    ASSERT_EQ(jsd_fx_pg_start(&pg), 0);
    rt_store st = {.kind = RT_PG};
    ASSERT_EQ(jsd_fx_pg_database_on(pg.url, st.url, sizeof(st.url)), 0);
    rt_nats nt;
    const char *url = jsd_fx_shared_nats_url();
    rt_nats_open(&nt, url);
    char stream[64], root[64], filter[80], subject[100];
    snprintf(stream, sizeof(stream), "%s", jsd_test_unique("HZH"));
    snprintf(root, sizeof(root), "%s", jsd_test_unique("hzh"));
    snprintf(filter, sizeof(filter), "%s.>", root);
    snprintf(subject, sizeof(subject), "%s.a", root);
    rt_stream_add_with(&nt, stream, filter, 120000, 0);
    jsd_fx_proxy px;
    ASSERT_EQ(jsd_fx_proxy_start(url_port(url), NULL, &px), 0);

    jsd_store *s = rt_open(&st);
    jsd_relay_opts o;
    jsd_relay_opts_init(&o);
    o.publish_deadline_ms = 4000;
    o.lease_ms = 5000;
    o.backoff_base_ms = 100;
    o.backoff_cap_ms = 1000;
    o.poll_interval_ms = 100;
    rt_relay t;
    rt_relay_make(&t, &st, px.url, &o);
    rt_relay_start(&t, false);
    rt_enqueue(s,
               &(rt_enqueue_opts){.owner = "o", .id_prefix = "first", .subject = subject, .n = 1});
    ASSERT_WAIT(rt_published(&st) == 1, 10000);

    /* Hold the next publications in the proxy, stop the store, then let the
     * broker store them and answer. */
    ASSERT_EQ(jsd_fx_proxy_mode(&px, "pause"), 0);
    rt_enqueue(s,
               &(rt_enqueue_opts){.owner = "o", .id_prefix = "held", .subject = subject, .n = 3});
    jsd_relay_stats rs;
    ASSERT_WAIT((jsd_relay_stats_get(t.relay, &rs), rs.in_flight == 3), 10000);
    jsd_store_close(s);
    rt_store_close(&st); /* the test's reader goes with the server */
    ASSERT_EQ(jsd_fx_pg_stop(&pg), 0);
    int64_t stopped = jsd_test_mono_ms();
    ASSERT_EQ(jsd_fx_proxy_mode(&px, "pass"), 0);
    ASSERT_WAIT(rt_stream_count(&nt, stream) == 4, 10000);
    ASSERT_WAIT((jsd_relay_stats_get(t.relay, &rs), rs.in_flight == 0), 10000);
    /* The outage outlasts the lease and the old five receipt retries (~3 s). */
    ASSERT_WAIT(jsd_test_mono_ms() - stopped > o.lease_ms + 2000, 2 * o.lease_ms + 2000);
    ASSERT_EQ(jsd_fx_pg_restart(&pg), 0);

    ASSERT_WAIT(rt_published(&st) == 4, 20000);
    rt_relay_finish(&t);
    ASSERT_EQ(rt_q(&st, RT_SQL_DUPLICATES), 0);
    ASSERT_EQ(rt_stream_count(&nt, stream), 4);
    jsd_fx_proxy_stop(&px);
    rt_nats_close(&nt);
    rt_store_close(&st);
    ASSERT_EQ(jsd_fx_pg_stop(&pg), 0);
}

/* One statement on a server, outside any transaction (ALTER SYSTEM). */
static void pg_do(const char *url, const char *sql)
{
    PGconn *c = PQconnectdb(url);
    ASSERT_TRUE(PQstatus(c) == CONNECTION_OK);
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
        fail_msg("%s: %s", sql, PQerrorMessage(c));
    PQclear(r);
    PQfinish(c);
}

/* The relay's claim commits without waiting for its WAL flush (relay.c
 * DESIGN 8). Here the server dies before that flush: the effect's
 * publication is in the broker, its claim is not in the store. The receipt
 * held through the outage is refused (the lease it names is gone), the
 * effect is claimed again like a new one, the stream collapses the
 * republication, and reading the stream's message settles the duplicate as
 * this effect's own: one message, one receipt, nothing dead-lettered.
 *
 * The flush is held back by stopping the server's WAL writer (SIGSTOP)
 * before the claim, with autovacuum, timed checkpoints and the background
 * writer off (nothing else writes WAL out meanwhile); the crash is a
 * SIGKILL of the whole server. Unheld, the WAL writer flushes within
 * wal_writer_delay (200 ms) and the window would be a matter of luck. */
static void claim_lost_in_a_server_crash(void **state)
{
    (void)state;
    jsd_fx_pg pg;
    ASSERT_EQ(jsd_fx_pg_start(&pg), 0);
    pg_do(pg.url, "ALTER SYSTEM SET autovacuum = off");
    pg_do(pg.url, "ALTER SYSTEM SET checkpoint_timeout = '1h'");
    pg_do(pg.url, "ALTER SYSTEM SET bgwriter_lru_maxpages = 0");
    ASSERT_EQ(jsd_fx_pg_stop(&pg), 0);
    ASSERT_EQ(jsd_fx_pg_restart(&pg), 0);
    rt_store st = {.kind = RT_PG};
    ASSERT_EQ(jsd_fx_pg_database_on(pg.url, st.url, sizeof(st.url)), 0);
    rt_nats nt;
    const char *url = jsd_fx_shared_nats_url();
    rt_nats_open(&nt, url);
    char stream[64], root[64], filter[80], subject[100];
    snprintf(stream, sizeof(stream), "%s", jsd_test_unique("HZC"));
    snprintf(root, sizeof(root), "%s", jsd_test_unique("hzc"));
    snprintf(filter, sizeof(filter), "%s.>", root);
    snprintf(subject, sizeof(subject), "%s.a", root);
    rt_stream_add_with(&nt, stream, filter, 120000, 0);
    jsd_fx_proxy px;
    ASSERT_EQ(jsd_fx_proxy_start(url_port(url), NULL, &px), 0);

    jsd_store *s = rt_open(&st);
    jsd_relay_opts o;
    jsd_relay_opts_init(&o);
    o.publish_deadline_ms = 10000;
    o.lease_ms = 11000;
    o.backoff_base_ms = 100;
    o.backoff_cap_ms = 1000;
    o.poll_interval_ms = 100;
    rt_relay t;
    rt_relay_make(&t, &st, px.url, &o);
    rt_relay_start(&t, false);
    rt_enqueue(s,
               &(rt_enqueue_opts){.owner = "o", .id_prefix = "first", .subject = subject, .n = 1});
    ASSERT_WAIT(rt_published(&st) == 1, 10000);

    /* Hold the WAL writer and the publication; the effect's own insert
     * commits synchronously, flushed by its session. */
    long long walwriter =
        rt_q(&st, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'");
    ASSERT_TRUE(walwriter > 0);
    ASSERT_EQ(kill((pid_t)walwriter, SIGSTOP), 0);
    ASSERT_EQ(jsd_fx_proxy_mode(&px, "pause"), 0);
    rt_enqueue(s,
               &(rt_enqueue_opts){.owner = "o", .id_prefix = "lost", .subject = subject, .n = 1});
    jsd_relay_stats rs;
    ASSERT_WAIT((jsd_relay_stats_get(t.relay, &rs), rs.in_flight == 1), 10000);
    ASSERT_EQ(rt_q(&st, "SELECT count(*) FROM jsd_outbox WHERE effect_id = 'lost0' "
                        "AND lease_token IS NOT NULL"),
              1);
    jsd_store_close(s);
    rt_store_close(&st);
    ASSERT_EQ(jsd_fx_pg_kill(&pg), 0);

    /* The broker stores the publication and answers; the receipt waits. */
    ASSERT_EQ(jsd_fx_proxy_mode(&px, "pass"), 0);
    ASSERT_WAIT(rt_stream_count(&nt, stream) == 2, 10000);
    ASSERT_WAIT((jsd_relay_stats_get(t.relay, &rs), rs.in_flight == 0), 10000);
    ASSERT_EQ(jsd_fx_pg_restart(&pg), 0);

    ASSERT_WAIT(rt_published(&st) == 2, 20000);
    jsd_relay_stats_get(t.relay, &rs);
    rt_relay_finish(&t);
    /* the held receipt named the lost claim's lease */
    if (rs.lease_lost != 1)
        fail_msg("%llu receipts refused, want 1: the held receipt was taken under a lease "
                 "the crash should have lost (or the claim reached the disk, and this test "
                 "did not make the fault it is about)",
                 (unsigned long long)rs.lease_lost);
    ASSERT_EQ(rs.first_attempt_duplicates, 0);
    ASSERT_EQ(rt_q(&st, RT_SQL_DEAD), 0);
    ASSERT_EQ(rt_q(&st, RT_SQL_DUPLICATES), 1);
    ASSERT_EQ(rt_q(&st, "SELECT stream_seq FROM jsd_outbox WHERE effect_id = 'lost0' AND "
                        "duplicate"),
              2);
    ASSERT_EQ(rt_stream_count(&nt, stream), 2);
    jsd_fx_proxy_stop(&px);
    rt_nats_close(&nt);
    rt_store_close(&st);
    ASSERT_EQ(jsd_fx_pg_stop(&pg), 0);
}

JSD_TEST_MAIN(cmocka_unit_test(withheld_acks_sqlite), cmocka_unit_test(withheld_acks_pg),
              cmocka_unit_test(receipts_held_through_store_outage),
              cmocka_unit_test(claim_lost_in_a_server_crash))
