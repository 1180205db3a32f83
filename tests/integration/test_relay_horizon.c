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
 * second message nor a lost receipt; nor does a receipt flush whose answer
 * is lost.
 */
#include <signal.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "proxy.h"
#include "relay_env.h"

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
    ASSERT_EQ(jsd_fx_proxy_start(jsd_fx_url_port(url), "withhold-acks", &px), 0);
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
    ASSERT_TRUE(rt_q(&st,
                     "SELECT count(*) FROM jsd_outbox_state WHERE first_attempt_at IS NOT NULL "
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

/* A PostgreSQL server of the test's own (with the given ALTER SYSTEM
 * settings, NULL-terminated, in force from its start), a stream with a
 * 2-minute window, the fault proxy in front of the shared nats-server, and
 * a relay publishing through it (lease = deadline + 1 s) whose first effect
 * is published. */
typedef struct pg_outage {
    jsd_fx_pg pg;
    rt_store st;
    rt_nats nt;
    char stream[64], subject[100];
    jsd_fx_proxy px;
    jsd_store *app; /* the application's store; NULL once closed */
    jsd_relay_opts o;
    rt_relay t;
} pg_outage;

static void pg_outage_up(pg_outage *e, const char *tag, const char *const *settings,
                         int64_t deadline_ms)
{
    memset(e, 0, sizeof(*e));
    ASSERT_EQ(jsd_fx_pg_start_with(&e->pg, settings), 0);
    rt_store_new_on(&e->st, e->pg.url);
    const char *url = jsd_fx_shared_nats_url();
    rt_nats_open(&e->nt, url);
    char root[64], filter[80];
    snprintf(e->stream, sizeof(e->stream), "%s", jsd_test_unique(tag));
    snprintf(root, sizeof(root), "%s", jsd_test_unique("hzo"));
    snprintf(filter, sizeof(filter), "%s.>", root);
    snprintf(e->subject, sizeof(e->subject), "%s.a", root);
    rt_stream_add_with(&e->nt, e->stream, filter, 120000, 0);
    ASSERT_EQ(jsd_fx_proxy_start(jsd_fx_url_port(url), NULL, &e->px), 0);

    e->app = rt_open(&e->st);
    jsd_relay_opts_init(&e->o);
    e->o.publish_deadline_ms = deadline_ms;
    e->o.lease_ms = deadline_ms + 1000;
    e->o.backoff_base_ms = 100;
    e->o.backoff_cap_ms = 1000;
    e->o.poll_interval_ms = 100;
    rt_relay_make(&e->t, &e->st, e->px.url, &e->o);
    rt_relay_start(&e->t, false);
    rt_enqueue(e->app, &(rt_enqueue_opts){
                           .owner = "o", .id_prefix = "first", .subject = e->subject, .n = 1});
    ASSERT_WAIT(rt_published(&e->st) == 1, 10000);
}

/* Hold the next publications in the proxy and enqueue n effects ("<prefix>0"
 * ...); returns once the relay has claimed and sent them. */
static void pg_outage_hold(pg_outage *e, const char *prefix, int n)
{
    ASSERT_EQ(jsd_fx_proxy_mode(&e->px, "pause"), 0);
    rt_enqueue(e->app, &(rt_enqueue_opts){
                           .owner = "o", .id_prefix = prefix, .subject = e->subject, .n = n});
    jsd_relay_stats rs;
    ASSERT_WAIT((jsd_relay_stats_get(e->t.relay, &rs), rs.in_flight == (uint64_t)n), 10000);
}

/* The store's clients let go of the server (before it goes). */
static void pg_outage_let_go(pg_outage *e)
{
    jsd_store_close(e->app);
    e->app = NULL;
    rt_store_close(&e->st); /* the test's reader goes with the server */
}

/* The proxy passes what it held; the broker stores it and answers. */
static void pg_outage_release(pg_outage *e, uint64_t stored)
{
    ASSERT_EQ(jsd_fx_proxy_mode(&e->px, "pass"), 0);
    ASSERT_WAIT(rt_stream_count(&e->nt, e->stream) == stored, 10000);
    jsd_relay_stats rs;
    ASSERT_WAIT((jsd_relay_stats_get(e->t.relay, &rs), rs.in_flight == 0), 10000);
}

static void pg_outage_down(pg_outage *e)
{
    if (e->t.relay)
        rt_relay_finish(&e->t);
    if (e->app)
        jsd_store_close(e->app);
    jsd_fx_proxy_stop(&e->px);
    rt_nats_close(&e->nt);
    rt_store_close(&e->st);
    ASSERT_EQ(jsd_fx_pg_stop(&e->pg), 0);
}

/* PubAcks that arrive while PostgreSQL is stopped: the receipts are held
 * (past the lease) and written when it is back, so nothing is republished. */
static void receipts_held_through_store_outage(void **state)
{
    (void)state;
    pg_outage e;
    pg_outage_up(&e, "HZH", NULL, 4000);
    pg_outage_hold(&e, "held", 3);
    pg_outage_let_go(&e);
    ASSERT_EQ(jsd_fx_pg_stop(&e.pg), 0);
    int64_t stopped = jsd_test_mono_ms();
    pg_outage_release(&e, 4);
    /* The outage outlasts the lease and the old five receipt retries (~3 s). */
    ASSERT_WAIT(jsd_test_mono_ms() - stopped > e.o.lease_ms + 2000, 2 * e.o.lease_ms + 2000);
    ASSERT_EQ(jsd_fx_pg_restart(&e.pg), 0);

    ASSERT_WAIT(rt_published(&e.st) == 4, 20000);
    rt_relay_finish(&e.t);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DUPLICATES), 0);
    ASSERT_EQ(rt_stream_count(&e.nt, e.stream), 4);
    pg_outage_down(&e);
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
    static const char *const quiet[] = {"ALTER SYSTEM SET autovacuum = off",
                                        "ALTER SYSTEM SET checkpoint_timeout = '1h'",
                                        "ALTER SYSTEM SET bgwriter_lru_maxpages = 0", NULL};
    pg_outage e;
    pg_outage_up(&e, "HZC", quiet, 10000);

    /* Hold the WAL writer, then the publication; the effect's own insert
     * commits synchronously, flushed by its session. */
    long long walwriter =
        rt_q(&e.st, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'");
    ASSERT_TRUE(walwriter > 0);
    ASSERT_EQ(kill((pid_t)walwriter, SIGSTOP), 0);
    pg_outage_hold(&e, "lost", 1);
    ASSERT_EQ(rt_q(&e.st, "SELECT count(*) FROM jsd_outbox_state WHERE effect_id = 'lost0' "
                          "AND lease_token IS NOT NULL"),
              1);
    pg_outage_let_go(&e);
    ASSERT_EQ(jsd_fx_pg_kill(&e.pg), 0);
    pg_outage_release(&e, 2); /* the receipt waits for the store */
    ASSERT_EQ(jsd_fx_pg_restart(&e.pg), 0);

    ASSERT_WAIT(rt_published(&e.st) == 2, 20000);
    jsd_relay_stats rs;
    jsd_relay_stats_get(e.t.relay, &rs);
    rt_relay_finish(&e.t);
    /* the held receipt named the lost claim's lease */
    if (rs.lease_lost != 1)
        fail_msg("%llu receipts refused, want 1: the held receipt was taken under a lease "
                 "the crash should have lost (or the claim reached the disk, and this test "
                 "did not make the fault it is about)",
                 (unsigned long long)rs.lease_lost);
    ASSERT_EQ(rs.first_attempt_duplicates, 0);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DEAD), 0);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DUPLICATES), 1);
    ASSERT_EQ(rt_q(&e.st, "SELECT stream_seq FROM jsd_outbox_state WHERE effect_id = 'lost0' AND "
                          "duplicate"),
              2);
    ASSERT_EQ(rt_stream_count(&e.nt, e.stream), 2);
    pg_outage_down(&e);
}

/* The server reads a reload in each process in its own time: the setting
 * is in force once a synchronous commit of the test's own waits for the
 * standby (then cancelled: it has committed locally). */
static void sync_standby_in_force(pg_outage *e, const char *waiter)
{
    PGconn *c = PQconnectdb(e->st.url);
    ASSERT_TRUE(PQstatus(c) == CONNECTION_OK);
    int64_t end = jsd_test_mono_ms() + 10000;
    for (bool waits = false; !waits;) {
        if (jsd_test_mono_ms() > end)
            fail_msg("a synchronous commit never waited for the standby named");
        ASSERT_EQ(PQsendQuery(c, "SELECT pg_logical_emit_message(true, 'probe', '')"), 1);
        waits =
            WAIT_UNTIL(rt_q(&e->st, waiter) == PQbackendPID(c) || (PQconsumeInput(c), !PQisBusy(c)),
                       5000) &&
            PQisBusy(c);
        if (waits) {
            char sql[80];
            snprintf(sql, sizeof(sql), "SELECT pg_cancel_backend(%d)", PQbackendPID(c));
            ASSERT_EQ(jsd_fx_pg_do(e->pg.url, sql), 0);
        }
        PGresult *r;
        while ((r = PQgetResult(c)) != NULL)
            PQclear(r);
    }
    PQfinish(c);
}

/* PostgreSQL's receipts are flushed by group (relay.c DESIGN 8): committed
 * without waiting for the disk, then one synchronous commit flushes them.
 * Here that commit's answer is lost: with a synchronous standby named that
 * never comes, the flush's commit waits for it (after its local flush),
 * and the test ends that session. Until the flush answers, the receipts
 * are in the store but not counted as written; once it fails they are
 * written again (the statement is idempotent): every one counted once, no
 * lease reported lost, nothing published twice. */
static void receipt_flush_answer_lost(void **state)
{
    (void)state;
    pg_outage e;
    pg_outage_up(&e, "HZF", NULL, 4000);
    jsd_log_configure(JSD_LOG_WARN, JSD_LOG_TEXT, log_sink, NULL);
    pg_outage_hold(&e, "flush", 3);
    ASSERT_EQ(jsd_fx_pg_do(e.pg.url, "ALTER SYSTEM SET synchronous_standby_names = 'nobody'"), 0);
    ASSERT_EQ(jsd_fx_pg_do(e.pg.url, "SELECT pg_reload_conf()"), 0);
    const char *waiter = "SELECT coalesce(max(pid), 0) FROM pg_stat_activity "
                         "WHERE wait_event = 'SyncRep'";
    sync_standby_in_force(&e, waiter);
    pg_outage_release(&e, 4);

    ASSERT_WAIT(rt_q(&e.st, waiter) > 0, 10000);
    ASSERT_EQ(rt_published(&e.st), 4); /* committed, visible */
    jsd_relay_stats rs;
    jsd_relay_stats_get(e.t.relay, &rs);
    ASSERT_EQ(rs.published, 1); /* not written until flushed */

    char sql[160];
    snprintf(sql, sizeof(sql), "SELECT pg_terminate_backend(%lld)", rt_q(&e.st, waiter));
    ASSERT_EQ(jsd_fx_pg_do(e.pg.url, sql), 0);
    ASSERT_WAIT((jsd_relay_stats_get(e.t.relay, &rs), rs.published == 4), 10000);
    ASSERT_TRUE(logged("they are recorded again"));
    ASSERT_EQ(jsd_fx_pg_do(e.pg.url, "ALTER SYSTEM RESET synchronous_standby_names"), 0);
    ASSERT_EQ(jsd_fx_pg_do(e.pg.url, "SELECT pg_reload_conf()"), 0);
    jsd_log_configure(JSD_LOG_WARN, JSD_LOG_TEXT, NULL, NULL);

    rt_relay_finish(&e.t);
    ASSERT_EQ(rs.lease_lost, 0);
    ASSERT_EQ(rs.duplicates, 0);
    ASSERT_EQ(rt_published(&e.st), 4);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DUPLICATES), 0);
    ASSERT_EQ(rt_stream_count(&e.nt, e.stream), 4);
    pg_outage_down(&e);
}

JSD_TEST_MAIN(cmocka_unit_test(withheld_acks_sqlite), cmocka_unit_test(withheld_acks_pg),
              cmocka_unit_test(receipts_held_through_store_outage),
              cmocka_unit_test(claim_lost_in_a_server_crash),
              cmocka_unit_test(receipt_flush_answer_lost))
