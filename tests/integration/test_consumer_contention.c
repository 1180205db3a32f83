/*
 * Handler contention is not the message's failure (issue 42, item 4), against
 * a real nats-server and PostgreSQL: the handler's own statements failing on
 * a lock or a race spend no delivery attempt.
 *
 *   lock_timeout_held:   `consume --sql` into a sink table another session
 *                        holds ACCESS EXCLUSIVE, with lock_timeout 200 ms on
 *                        the consumer's store and --max-deliver 2: the batch
 *                        is held (warn line, jsd_consumer_handler_contention_total
 *                        {kind="lock_timeout"}, /readyz still 200 below the
 *                        hold alert) past the ack wait; once the lock goes,
 *                        every message is applied once on its first delivery,
 *                        nothing parked or redelivered. Before the fix the
 *                        deliveries were spent on "canceling statement due to
 *                        lock timeout" and parked.
 *   serialization_retried_at_once: a --sql statement raising 40001 twice:
 *                        the batch is applied again at once, no NAK, nothing
 *                        parked under --max-deliver 1 (before: parked).
 *   deadlock_retried_at_once: a library handler whose statement raises 40P01
 *                        once and records it with jsd_tx_note_sqlstate:
 *                        stats.retried 0, contention_retries 1, applied once.
 *   hold_alert_readyz:   --hold-alert 1s: /readyz 503 while held past it, an
 *                        error line, jsd_consumer_hold_overdue 1; 200 and 0
 *                        again once the lock goes, and every message applied.
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include "consumer_env.h"

#define SINK_SQL                                                                                   \
    "INSERT INTO sink(body, seq, deliveries) VALUES (CAST(:payload AS TEXT), "                     \
    "CAST(:stream_seq AS BIGINT), CAST(:deliveries AS BIGINT))"

static char out[65536];

/* ---- the consume process, its log, /metrics and /readyz ------------------------------ */

/* The store URL with lock_timeout set for every session the consumer opens. */
static void lock_timeout_url(const cenv *e, int ms, char *url, size_t cap)
{
    snprintf(url, cap, "%s%soptions=-c%%20lock_timeout%%3D%d", e->store_url,
             strchr(e->store_url, '?') ? "&" : "?", ms);
}

/* `jsdurable consume --sql SINK_SQL` in the background, --max-deliver 2
 * (spending deliveries would park quickly), ack wait 2 s, metrics on a free
 * port; hold_alert may be NULL (the default). */
static pid_t spawn_consume(const cenv *e, const char *store_url, const char *hold_alert,
                           const char *log)
{
    const char *argv[32];
    int n = 0;
    argv[n++] = jsd_fx_bin("jsdurable");
    argv[n++] = "consume";
    argv[n++] = "--store";
    argv[n++] = store_url;
    argv[n++] = "--nats";
    argv[n++] = jsd_fx_shared_nats_url();
    argv[n++] = "--stream";
    argv[n++] = e->stream;
    argv[n++] = "--durable";
    argv[n++] = e->durable;
    argv[n++] = "--ack-wait";
    argv[n++] = "2s";
    argv[n++] = "--max-deliver";
    argv[n++] = "2";
    argv[n++] = "--metrics";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--log-level";
    argv[n++] = "info";
    if (hold_alert) {
        argv[n++] = "--hold-alert";
        argv[n++] = hold_alert;
    }
    argv[n++] = "--sql";
    argv[n++] = SINK_SQL;
    argv[n] = NULL;
    return jsd_test_spawn(argv, log, true, NULL);
}

/* A series of GET /metrics ("name" or "name{kind=\"x\"}"), or -1. */
static double metric(int port, const char *series)
{
    const char *body = jsd_test_http_get(port, "/metrics");
    if (!body)
        return -1;
    char key[160];
    snprintf(key, sizeof(key), "\n%s ", series);
    const char *p = strstr(body, key);
    return p ? strtod(p + strlen(key), NULL) : -1;
}

static long long scalar(cenv *e, const char *sql)
{
    return cenv_store_scalar(e->store, sql);
}

/* Another session on the store holding the sink table locked in an open
 * transaction (ACCESS EXCLUSIVE: no statement of the consumer's gets in). */
typedef struct locker {
    jsd_store *s;
    jsd_tx *tx;
} locker;

static void lock_sink(cenv *e, locker *l)
{
    jsd_error err;
    jsd_error_clear(&err);
    ASSERT_OK_E(jsd_store_open(&l->s, e->store_url, &err), err.msg);
    ASSERT_OK_E(jsd_tx_begin(&l->tx, l->s), jsd_store_errmsg(l->s));
    ASSERT_TRUE(cenv_tx_exec(l->tx, "LOCK TABLE sink IN ACCESS EXCLUSIVE MODE"));
}

static void unlock_sink(locker *l)
{
    jsd_tx_rollback(l->tx);
    jsd_store_close(l->s);
}

/* Once the contention is gone: all n applied once, each on its first
 * delivery, nothing parked, poisoned or redelivered. */
static void check_applied_once(cenv *e, long long n)
{
    ASSERT_WAIT(scalar(e, "SELECT COUNT(*) FROM sink") == n, 30000);
    ASSERT_EQ(scalar(e, "SELECT COUNT(DISTINCT seq) FROM sink"), n);
    ASSERT_EQ(scalar(e, "SELECT MAX(deliveries) FROM sink"), 1);
    ASSERT_EQ(scalar(e, "SELECT COUNT(*) FROM jsd_inbox WHERE outcome = 1"), n);
    ASSERT_EQ(scalar(e, "SELECT COUNT(*) FROM jsd_poison"), 0);
    ASSERT_EQ(cenv_stream_msgs(e, e->dlq_stream), 0);
    ASSERT_WAIT(cenv_settled(e), 10000);
    jsConsumerInfo *ci = cenv_info(e);
    ASSERT_TRUE(ci != NULL);
    ASSERT_EQ(ci->NumRedelivered, 0);
    jsConsumerInfo_Destroy(ci);
}

/* ---- a lock timeout in consume --sql holds the batch ----------------------------------- */
static void lock_timeout_held(void **state)
{
    (void)state;
    cenv e;
    locker l;
    char url[700], log[1200];
    cenv_up(&e, true);
    cenv_store_exec(e.store, "CREATE TABLE sink(body TEXT, seq BIGINT, deliveries BIGINT)");
    lock_timeout_url(&e, 200, url, sizeof(url));
    snprintf(log, sizeof(log), "%s/consume-lock.log", jsd_test_dir());
    pid_t pid = spawn_consume(&e, url, NULL, log);
    ASSERT_WAIT(jsd_test_metrics_port(log) > 0, 20000);
    int port = jsd_test_metrics_port(log);
    /* Past the statement's prepare: the consumer is bound and ready. */
    ASSERT_WAIT(jsd_test_file_contains(log, "bound to durable"), 20000);
    ASSERT_WAIT(cenv_readyz_says(port, " 200 ", NULL), 10000);

    lock_sink(&e, &l);
    cenv_publish(&e, 1, 20, NULL);
    /* Six failed attempts (backoff 100 ms doubling): held longer than the
     * 2 s ack wait. Spent deliveries would have parked by now (2 attempts). */
    ASSERT_WAIT(metric(port, "jsd_consumer_handler_contention_total{kind=\"lock_timeout\"}") >= 6 ||
                    cenv_stream_msgs(&e, e.dlq_stream) > 0,
                30000);
    ASSERT_EQ(cenv_stream_msgs(&e, e.dlq_stream), 0);
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM jsd_poison"), 0);
    ASSERT_TRUE(metric(port, "jsd_consumer_held_deliveries") > 0);
    ASSERT_TRUE(metric(port, "jsd_deliveries_total{result=\"retry\"}") <= 0);
    ASSERT_TRUE(jsd_test_file_contains(
        log, "store contention (handler contention, lock_timeout (SQLSTATE 55P03)"));
    ASSERT_TRUE(jsd_test_file_contains(log, "no delivery attempt is spent"));
    /* Contention below the hold alert (5 minutes by default) is not unreadiness. */
    ASSERT_TRUE(cenv_readyz_says(port, " 200 ", NULL));

    unlock_sink(&l);
    check_applied_once(&e, 20);
    ASSERT_WAIT(metric(port, "jsd_consumer_held_deliveries") == 0, 5000);
    ASSERT_EQ(metric(port, "jsd_consumer_hold_overdue"), 0);
    cenv_stop_consume(pid, log, out, sizeof(out));
    ASSERT_CONTAINS(out, "the store answers again after");
    ASSERT_CONTAINS(out, "20 committed, 0 duplicates, 0 retried, 0 poisoned, 0 parked");
    ASSERT_NOT_CONTAINS(out, "parked, dead-lettered");
    cenv_down(&e);
}

/* ---- 40001 from a --sql statement: applied again at once ------------------------------ */
static void serialization_retried_at_once(void **state)
{
    (void)state;
    cenv e;
    cenv_up(&e, true);
    cenv_store_exec(e.store, "CREATE TABLE sink(body TEXT, seq BIGINT, deliveries BIGINT)");
    /* Message 5's statement fails with a serialization failure twice (a
     * sequence is not rolled back): in the batch's pipeline, and again where
     * the careful pass would run it alone, so that the failure is not
     * simply absorbed by the careful pass. */
    cenv_store_exec(e.store, "CREATE SEQUENCE ser_once");
    cenv_store_exec(e.store,
                    "CREATE FUNCTION fail_once(seq bigint) RETURNS boolean LANGUAGE plpgsql AS $$ "
                    "BEGIN IF seq = 5 THEN IF nextval('ser_once') <= 2 THEN RAISE EXCEPTION "
                    "'simulated serialization failure' USING ERRCODE = 'serialization_failure'; "
                    "END IF; END IF; RETURN true; END $$");
    cenv_publish(&e, 1, 20, NULL);
    /* --max-deliver 1: a spent delivery parks at once. */
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "%s consume --store '%s' --nats %s --stream %s --durable %s --ack-wait 5s "
             "--until-idle --max-deliver 1 --sql 'INSERT INTO sink(body, seq, deliveries) SELECT "
             "CAST(:payload AS TEXT), CAST(:stream_seq AS BIGINT), CAST(:deliveries AS BIGINT) "
             "WHERE fail_once(CAST(:stream_seq AS BIGINT))'",
             jsd_fx_bin("jsdurable"), e.store_url, jsd_fx_shared_nats_url(), e.stream, e.durable);
    int rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 0)
        fail_msg("consume exited %d, expected 0: %s", rc, out);
    ASSERT_CONTAINS(out, "handler contention, serialization (SQLSTATE 40001)");
    ASSERT_CONTAINS(out, "is applied again at once (1 of 3)");
    ASSERT_CONTAINS(out, "is applied again at once (2 of 3)");
    ASSERT_NOT_CONTAINS(out, "(3 of 3)");
    ASSERT_CONTAINS(out, "20 committed, 0 duplicates, 0 retried, 0 poisoned, 0 parked");
    ASSERT_CONTAINS(out, "2 contention failures of --sql (2 retried at once)");
    ASSERT_EQ(scalar(&e, "SELECT last_value FROM ser_once"), 3);
    check_applied_once(&e, 20);
    cenv_down(&e);
}

/* ---- 40P01 from a library handler that records its SQLSTATE ----------------------------- */
typedef struct dctx {
    int calls;
} dctx;

static jsd_disposition deadlock_once(jsd_tx *tx, const jsd_delivery *d, void *user)
{
    dctx *h = user;
    h->calls++;
    char sql[200];
    snprintf(sql, sizeof(sql),
             "INSERT INTO sink(body, seq, deliveries) SELECT 'x', %llu, %llu WHERE "
             "deadlock_once(%llu)",
             (unsigned long long)jsd_delivery_stream_seq(d),
             (unsigned long long)jsd_delivery_deliveries(d),
             (unsigned long long)jsd_delivery_stream_seq(d));
    PGresult *r = PQexec(jsd_tx_pg(tx), sql);
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok)
        jsd_tx_note_sqlstate(tx, PQresultErrorField(r, PG_DIAG_SQLSTATE));
    PQclear(r);
    return ok ? jsd_disposition_commit() : jsd_disposition_retry(0, "insert failed");
}

static void deadlock_retried_at_once(void **state)
{
    (void)state;
    cenv e;
    dctx h = {0};
    cenv_up(&e, true);
    cenv_store_exec(e.store, "CREATE TABLE sink(body TEXT, seq BIGINT, deliveries BIGINT)");
    cenv_store_exec(e.store, "CREATE SEQUENCE dl_once");
    cenv_store_exec(e.store,
                    "CREATE FUNCTION deadlock_once(seq bigint) RETURNS boolean LANGUAGE plpgsql "
                    "AS $$ BEGIN IF seq = 3 THEN IF nextval('dl_once') = 1 THEN RAISE EXCEPTION "
                    "'simulated deadlock' USING ERRCODE = 'deadlock_detected'; END IF; END IF; "
                    "RETURN true; END $$");
    cenv_durable(&e, 30000, 2, 1024, NULL, 0); /* parked on the first failure */
    cenv_publish(&e, 1, 10, NULL);
    jsd_consumer *c = cenv_consumer(&e, NULL);
    jsd_consumer_stats s;
    CENV_POLL_UNTIL(jsd_consumer_poll, c, deadlock_once, &h,
                    (jsd_consumer_stats_get(c, &s), s.committed + s.parked + s.retried >= 10),
                    20000);
    CENV_POLL_UNTIL(jsd_consumer_poll, c, deadlock_once, &h, cenv_settled(&e), 10000);
    jsd_consumer_stats_get(c, &s);
    ASSERT_EQ(s.committed, 10);
    ASSERT_EQ(s.retried, 0);
    ASSERT_EQ(s.parked, 0);
    ASSERT_EQ(s.commit_failures, 0);
    ASSERT_EQ(s.store_outages, 0); /* retried at once, never held */
    ASSERT_EQ(s.contention, 1);
    ASSERT_EQ(s.contention_retries, 1);
    double v = -1;
    ASSERT_OK(jsd_metrics_get(jsd_metrics_default(), "jsd_consumer_handler_contention_total",
                              "deadlock", &v),
              "metric");
    ASSERT_EQ(v, 1);
    ASSERT_EQ(scalar(&e, "SELECT last_value FROM dl_once"), 2);
    check_applied_once(&e, 10);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* ---- past --hold-alert: /readyz 503, an error line; 200 once it clears ------------------- */
static void hold_alert_readyz(void **state)
{
    (void)state;
    cenv e;
    locker l;
    char url[700], log[1200];
    cenv_up(&e, true);
    cenv_store_exec(e.store, "CREATE TABLE sink(body TEXT, seq BIGINT, deliveries BIGINT)");
    lock_timeout_url(&e, 200, url, sizeof(url));
    snprintf(log, sizeof(log), "%s/consume-alert.log", jsd_test_dir());
    pid_t pid = spawn_consume(&e, url, "1s", log);
    ASSERT_WAIT(jsd_test_metrics_port(log) > 0, 20000);
    int port = jsd_test_metrics_port(log);
    ASSERT_WAIT(jsd_test_file_contains(log, "bound to durable"), 20000);
    ASSERT_WAIT(cenv_readyz_says(port, " 200 ", NULL), 10000);

    lock_sink(&e, &l);
    cenv_publish(&e, 1, 20, NULL);
    ASSERT_WAIT(cenv_readyz_says(port, " 503 ", "held past the hold alert (contention)"), 15000);
    ASSERT_EQ(metric(port, "jsd_consumer_hold_overdue"), 1);
    ASSERT_TRUE(jsd_test_file_contains(log, "past the hold alert (1000 ms)"));
    ASSERT_TRUE(jsd_test_file_contains(log, "nothing is lost"));
    ASSERT_EQ(cenv_stream_msgs(&e, e.dlq_stream), 0);

    unlock_sink(&l);
    ASSERT_WAIT(cenv_readyz_says(port, " 200 ", NULL), 30000);
    check_applied_once(&e, 20);
    ASSERT_EQ(metric(port, "jsd_consumer_hold_overdue"), 0);
    cenv_stop_consume(pid, log, out, sizeof(out));
    ASSERT_CONTAINS(out, "0 retried, 0 poisoned, 0 parked");
    cenv_down(&e);
}

JSD_TEST_MAIN(cmocka_unit_test(lock_timeout_held), cmocka_unit_test(serialization_retried_at_once),
              cmocka_unit_test(deadlock_retried_at_once), cmocka_unit_test(hold_alert_readyz))
