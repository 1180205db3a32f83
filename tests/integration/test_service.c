/*
 * The daemons as a service manager sees them (cli/service.c): `jsdurable
 * relay` and `jsdurable consume` as child processes, driven by signals.
 *
 *   notify:   with NOTIFY_SOCKET naming a datagram socket the test binds and
 *             WATCHDOG_USEC set, the relay sends READY=1, WATCHDOG=1 pings and,
 *             at SIGTERM, STOPPING=1, then exits 0.
 *   sighup:   SIGHUP leaves the relay running and publishing; with its log
 *             file renamed away (logrotate), the log is reopened at the path.
 *   sigterm with the broker down (stopped) or hung (paused): the relay, and
 *             the consumer, exit within the stop bound (JSD_STOP_TIMEOUT_MS,
 *             5000 ms by default, plus a margin), and nothing is lost: once
 *             the broker is back, a relay --until-idle publishes the rest and
 *             the stream holds every effect exactly once.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nats/nats.h>

#include "fixture.h"
#include "test.h"

#define STOP_BOUND_MS 5000
#define MARGIN_MS     2500

static char out[16384];

static void run_ok(const char *cmd)
{
    int rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 0)
        fail_msg("`%s` exited %d:\n%s", cmd, rc, out);
}

static long long sqlite_count(const char *db, const char *sql)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "sqlite3 -cmd '.timeout 5000' '%s' \"%s\"", db, sql);
    run_ok(cmd);
    return strtoll(out, NULL, 10);
}

static uint64_t stream_msgs(const char *url, const char *stream)
{
    natsConnection *nc = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, url), NATS_OK);
    uint64_t n = jsd_fx_stream_msgs(nc, stream);
    natsConnection_Destroy(nc);
    return n;
}

static void provision(const char *url)
{
    char topo[1200], cmd[4096];
    snprintf(topo, sizeof(topo), "%s/topology.json", jsd_test_dir());
    FILE *f = fopen(topo, "w");
    assert_non_null(f);
    fputs("{\"streams\":[{\"name\":\"ORDERS\",\"subjects\":[\"orders.>\"]}],"
          "\"dead_letter\":{\"name\":\"JSD_DLQ\",\"subjects\":[\"jsd.dlq.>\"]}}\n",
          f);
    assert_int_equal(fclose(f), 0);
    snprintf(cmd, sizeof(cmd), "%s provision --nats %s --file '%s'", jsd_fx_bin("jsdurable"), url,
             topo);
    run_ok(cmd);
}

/* n effects, owners PREFIX-0 .. PREFIX-(n-1), in one enqueue call. */
static void enqueue(const char *store, const char *prefix, int n)
{
    char cmd[4096];
    snprintf(
        cmd, sizeof(cmd),
        "for i in $(seq 0 %d); do printf '{\"subject\":\"orders.created\",\"owner\":\"%s-%%d\","
        "\"id\":\"c\",\"payload\":\"n%%d\"}\\n' $i $i; done | %s enqueue --store '%s' "
        "--jsonl",
        n - 1, prefix, jsd_fx_bin("jsdurable"), store);
    run_ok(cmd);
}

/* Wait for the child to exit within ms; its wait status, or -1 (then it is
 * killed) when it did not. */
static int wait_exit(pid_t pid, int64_t ms, int64_t *took_ms)
{
    int64_t start = jsd_test_mono_ms(), end = start + ms;
    int st = 0;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            *took_ms = jsd_test_mono_ms() - start;
            return st;
        }
        if (r < 0 && errno != EINTR)
            fail_msg("waitpid: %s", strerror(errno));
        if (jsd_test_mono_ms() >= end)
            break;
        jsd_test_sleep_ms(10);
    }
    *took_ms = jsd_test_mono_ms() - start;
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

static bool alive(pid_t pid)
{
    int st;
    return waitpid(pid, &st, WNOHANG) == 0;
}

static pid_t start_relay(const char *store, const char *url, const char *log)
{
    const char *argv[] = {jsd_fx_bin("jsdurable"),
                          "relay",
                          "--store",
                          store,
                          "--nats",
                          url,
                          "--poll-ms",
                          "100",
                          "--lease-ms",
                          "7000",
                          "--log-level",
                          "info",
                          "--metrics",
                          "127.0.0.1:0",
                          NULL};
    return jsd_test_spawn(argv, log, true, NULL);
}

/* GET /metrics: the response (headers and body), or NULL. */
static const char *scrape(int port)
{
    return jsd_test_http_get(port, "/metrics");
}

/* The value of an unlabelled series in GET /metrics, or -1. */
static double metric(int port, const char *name)
{
    const char *body = scrape(port);
    if (!body)
        return -1;
    char key[128];
    snprintf(key, sizeof(key), "\n%s ", name);
    const char *p = strstr(body, key);
    return p ? strtod(p + strlen(key), NULL) : -1;
}

/* ---- sd_notify ------------------------------------------------------------------ */

static int notify_socket(char *path, size_t cap)
{
    snprintf(path, cap, "%s/notify.sock", jsd_test_dir());
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    ASSERT_TRUE(strlen(path) < sizeof(sa.sun_path));
    memcpy(sa.sun_path, path, strlen(path) + 1);
    unlink(path);
    ASSERT_EQ(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

/* Datagrams received so far, appended to got (newline-separated). */
static void read_notify(int fd, char *got, size_t cap)
{
    char buf[512];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT)) > 0) {
        buf[n] = '\0';
        size_t used = strlen(got);
        snprintf(got + used, cap - used, "%s\n", buf);
    }
}

static bool notified(int fd, char *got, size_t cap, const char *what)
{
    read_notify(fd, got, cap);
    return strstr(got, what) != NULL;
}

static void notify_ready_watchdog_stopping(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    assert_int_equal(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    provision(fx.url);
    char store[1200], log[1200], sock[1200], got[8192] = "";
    snprintf(store, sizeof(store), "sqlite:%s/a.db", jsd_test_dir());
    snprintf(log, sizeof(log), "%s/relay.log", jsd_test_dir());
    enqueue(store, "n", 3);
    int fd = notify_socket(sock, sizeof(sock));
    setenv("NOTIFY_SOCKET", sock, 1);
    setenv("WATCHDOG_USEC", "200000", 1); /* a ping every 100 ms */
    pid_t pid = start_relay(store, fx.url, log);
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");

    ASSERT_WAIT(notified(fd, got, sizeof(got), "READY=1"), 15000);
    ASSERT_NOT_CONTAINS(got, "STOPPING=1");
    /* READY comes once the relay runs: it publishes what is due. */
    ASSERT_WAIT(stream_msgs(fx.url, "ORDERS") == 3, 10000);
    /* Several pings, at the pace WATCHDOG_USEC asks for. */
    int64_t t0 = jsd_test_mono_ms();
    got[0] = '\0';
    ASSERT_WAIT(notified(fd, got, sizeof(got), "WATCHDOG=1\nWATCHDOG=1\nWATCHDOG=1\n"), 3000);
    ASSERT_I64_LE(jsd_test_mono_ms() - t0, 2000);

    kill(pid, SIGTERM);
    int64_t took;
    int st = wait_exit(pid, STOP_BOUND_MS + MARGIN_MS, &took);
    read_notify(fd, got, sizeof(got));
    ASSERT_CONTAINS(got, "STOPPING=1");
    ASSERT_TRUE(st != -1 && WIFEXITED(st));
    ASSERT_EQ(WEXITSTATUS(st), 0);
    ASSERT_TRUE(jsd_test_file_contains(log, "SIGTERM received: stopping gracefully"));
    close(fd);
    jsd_fx_nats_stop(&fx);
}

/* ---- the relay's metrics ---------------------------------------------------------- */

/* A relay's scrape: the commit -> PubAck histogram counts every published
 * effect, jsd_build_info names the versions, and no consumer family shows. */
static void relay_metrics_commit_to_puback(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    assert_int_equal(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    provision(fx.url);
    char store[1200], log[1200], want[200];
    snprintf(store, sizeof(store), "sqlite:%s/a.db", jsd_test_dir());
    snprintf(log, sizeof(log), "%s/relay.log", jsd_test_dir());
    pid_t pid = start_relay(store, fx.url, log);
    ASSERT_WAIT(jsd_test_metrics_port(log) > 0, 15000);
    int port = jsd_test_metrics_port(log);
    enqueue(store, "m", 12);
    ASSERT_WAIT(metric(port, "jsd_relay_published_total") == 12, 10000);
    ASSERT_TRUE(metric(port, "jsd_relay_commit_to_puback_seconds_count") == 12);
    /* committed and published within the test: well under 60 s each */
    ASSERT_TRUE(strstr(scrape(port), "jsd_relay_commit_to_puback_seconds_bucket{le=\"60\"} 12\n"));
    const char *body = scrape(port);
    snprintf(want, sizeof(want), "jsd_build_info{version=\"%s\",nats_c=\"%s\"} 1\n", jsd_version(),
             jsd_nats_client_version());
    ASSERT_CONTAINS(body, want);
    ASSERT_CONTAINS(body, "jsd_outbox_backlog 0\n");
    ASSERT_NOT_CONTAINS(body, "jsd_deliveries_total");
    ASSERT_NOT_CONTAINS(body, "jsd_handler_duration_seconds");
    ASSERT_NOT_CONTAINS(body, "jsd_dead_letters_total");
    ASSERT_NOT_CONTAINS(body, "jsd_consumer_");
    kill(pid, SIGTERM);
    int64_t took;
    int st = wait_exit(pid, STOP_BOUND_MS + MARGIN_MS, &took);
    ASSERT_TRUE(st != -1 && WIFEXITED(st));
    ASSERT_EQ(WEXITSTATUS(st), 0);
    jsd_fx_nats_stop(&fx);
}

/* ---- SIGHUP --------------------------------------------------------------------- */

static void sighup_keeps_running_and_reopens_log(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    assert_int_equal(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    provision(fx.url);
    char store[1200], log[1200], rotated[1300];
    snprintf(store, sizeof(store), "sqlite:%s/a.db", jsd_test_dir());
    snprintf(log, sizeof(log), "%s/relay.log", jsd_test_dir());
    snprintf(rotated, sizeof(rotated), "%s.1", log);
    pid_t pid = start_relay(store, fx.url, log);
    ASSERT_WAIT(jsd_test_file_contains(log, "relay started"), 15000);

    kill(pid, SIGHUP);
    ASSERT_WAIT(jsd_test_file_contains(log, "SIGHUP received: log file"), 5000);
    ASSERT_TRUE(jsd_test_file_contains(log, "not rotated: kept"));
    ASSERT_TRUE(alive(pid));
    enqueue(store, "h", 5);
    ASSERT_WAIT(stream_msgs(fx.url, "ORDERS") == 5, 10000);

    /* logrotate: the file is renamed away, then SIGHUP. */
    ASSERT_EQ(rename(log, rotated), 0);
    kill(pid, SIGHUP);
    ASSERT_WAIT(jsd_test_file_contains(log, "reopened; still running"), 5000);
    ASSERT_TRUE(jsd_test_file_contains(rotated, "relay started"));
    ASSERT_TRUE(!jsd_test_file_contains(log, "relay started"));
    ASSERT_TRUE(alive(pid));
    enqueue(store, "i", 5);
    ASSERT_WAIT(stream_msgs(fx.url, "ORDERS") == 10, 10000);

    kill(pid, SIGTERM);
    int64_t took;
    int st = wait_exit(pid, STOP_BOUND_MS + MARGIN_MS, &took);
    ASSERT_TRUE(st != -1 && WIFEXITED(st));
    ASSERT_EQ(WEXITSTATUS(st), 0);
    ASSERT_TRUE(jsd_test_file_contains(log, "relay stopped"));
    jsd_fx_nats_stop(&fx);
}

/* ---- SIGTERM with the broker down ---------------------------------------------------- */

static void relay_stops_in_bound(bool pause)
{
    jsd_fx_nats fx;
    assert_int_equal(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    provision(fx.url);
    char store[1300], db[1200], log[1200], cmd[4096];
    snprintf(db, sizeof(db), "%s/a.db", jsd_test_dir());
    snprintf(store, sizeof(store), "sqlite:%s", db);
    snprintf(log, sizeof(log), "%s/relay.log", jsd_test_dir());
    enqueue(store, "a", 20);
    pid_t pid = start_relay(store, fx.url, log);
    ASSERT_WAIT(stream_msgs(fx.url, "ORDERS") == 20, 15000);

    if (pause)
        assert_int_equal(jsd_fx_nats_pause(&fx), 0); /* hung: publications wait for PubAcks */
    else
        assert_int_equal(jsd_fx_nats_stop(&fx), 0);
    enqueue(store, "b", 30);
    /* The relay has claimed the new effects (paused broker: published, in
     * flight) or knows the broker is gone. */
    if (pause) {
        int port = jsd_test_metrics_port(log);
        ASSERT_TRUE(port > 0);
        ASSERT_WAIT(metric(port, "jsd_relay_in_flight") > 0, 10000);
    } else
        ASSERT_WAIT(jsd_test_file_contains(log, "NATS is down"), 10000);

    kill(pid, SIGTERM);
    int64_t took;
    int st = wait_exit(pid, STOP_BOUND_MS + MARGIN_MS, &took);
    if (st == -1)
        fail_msg("relay still running %lld ms after SIGTERM (bound %d ms)", (long long)took,
                 STOP_BOUND_MS);
    ASSERT_TRUE(WIFEXITED(st));
    /* 0: stopped gracefully; 75: the bound cut a stop that waited on the
     * broker (said in the log). Both leave only what a crash leaves. */
    if (WEXITSTATUS(st) == 75)
        ASSERT_TRUE(jsd_test_file_contains(log, "graceful stop unfinished"));
    else
        ASSERT_EQ(WEXITSTATUS(st), 0);
    if (!pause)
        ASSERT_EQ(WEXITSTATUS(st), 0);
    ASSERT_I64_LE(took, STOP_BOUND_MS + MARGIN_MS);
    fprintf(stderr, "relay exited %d, %lld ms after SIGTERM\n", WEXITSTATUS(st), (long long)took);

    /* The store is consistent: first batch published, the rest not. */
    snprintf(cmd, sizeof(cmd), "sqlite3 '%s' 'PRAGMA integrity_check'", db);
    run_ok(cmd);
    ASSERT_STREQ(out, "ok\n");
    ASSERT_EQ(sqlite_count(db, "SELECT count(*) FROM jsd_outbox_state"), 50);
    ASSERT_LE(20,
              sqlite_count(db, "SELECT count(*) FROM jsd_outbox_state WHERE published_at IS NOT "
                               "NULL"));

    /* Broker back: relay runs publish the rest with the same ids (a lease
     * the stopped relay left expires after --lease-ms, 7 s), and the stream
     * holds exactly 50 messages. */
    if (pause)
        assert_int_equal(jsd_fx_nats_resume(&fx), 0);
    else
        assert_int_equal(jsd_fx_nats_restart(&fx), 0);
    snprintf(cmd, sizeof(cmd), "%s relay --store '%s' --nats %s --until-idle",
             jsd_fx_bin("jsdurable"), store, fx.url);
    ASSERT_WAIT(
        (jsd_test_run(cmd, out, sizeof(out)), sqlite_count(db, "SELECT count(*) FROM "
                                                               "jsd_outbox_state WHERE "
                                                               "published_at IS NULL") == 0),
        30000);
    ASSERT_EQ(stream_msgs(fx.url, "ORDERS"), 50);
    jsd_fx_nats_stop(&fx);
}

static void relay_sigterm_broker_stopped(void **state)
{
    (void)state;
    relay_stops_in_bound(false);
}

static void relay_sigterm_broker_paused(void **state)
{
    (void)state;
    relay_stops_in_bound(true);
}

static void consume_sigterm_broker_stopped(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    assert_int_equal(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    provision(fx.url);
    char src[1200], db[1200], store[1300], log[1200], cmd[8192];
    snprintf(src, sizeof(src), "sqlite:%s/src.db", jsd_test_dir());
    snprintf(db, sizeof(db), "%s/sink.db", jsd_test_dir());
    snprintf(store, sizeof(store), "sqlite:%s", db);
    snprintf(log, sizeof(log), "%s/consume.log", jsd_test_dir());
    snprintf(cmd, sizeof(cmd), "sqlite3 '%s' 'CREATE TABLE t(s TEXT, p BLOB)'", db);
    run_ok(cmd);
    enqueue(src, "c", 10);
    snprintf(cmd, sizeof(cmd), "%s relay --store '%s' --nats %s --until-idle",
             jsd_fx_bin("jsdurable"), src, fx.url);
    run_ok(cmd);
    const char *argv[] = {jsd_fx_bin("jsdurable"),
                          "consume",
                          "--store",
                          store,
                          "--nats",
                          fx.url,
                          "--stream",
                          "ORDERS",
                          "--durable",
                          "sink",
                          "--sql",
                          "INSERT INTO t VALUES (:subject, :payload)",
                          "--log-level",
                          "info",
                          NULL};
    pid_t pid = jsd_test_spawn(argv, log, true, NULL);
    ASSERT_WAIT(sqlite_count(db, "SELECT count(*) FROM t") == 10, 15000);
    assert_int_equal(jsd_fx_nats_stop(&fx), 0);
    ASSERT_WAIT(jsd_test_file_contains(log, "disconnected from NATS"), 10000);

    kill(pid, SIGTERM);
    int64_t took;
    int st = wait_exit(pid, STOP_BOUND_MS + MARGIN_MS, &took);
    if (st == -1)
        fail_msg("consume still running %lld ms after SIGTERM (bound %d ms)", (long long)took,
                 STOP_BOUND_MS);
    ASSERT_TRUE(WIFEXITED(st));
    ASSERT_EQ(WEXITSTATUS(st), 0);
    fprintf(stderr, "consume exited 0, %lld ms after SIGTERM\n", (long long)took);
    ASSERT_EQ(sqlite_count(db, "SELECT count(*) FROM t"), 10);
    ASSERT_EQ(sqlite_count(db, "SELECT count(*) FROM jsd_inbox"), 10);
}

/* ---- /readyz follows the store -------------------------------------------------- */

static bool readyz_says(int port, const char *status, const char *text)
{
    const char *r = jsd_test_http_get(port, "/readyz");
    return r && strstr(r, status) && (!text || strstr(r, text));
}

/* The relay's /readyz says 503 with "store: not answering" while its
 * PostgreSQL is stopped, and 200 again once it is back. */
static void relay_readyz_follows_the_store(void **state)
{
    (void)state;
    jsd_fx_pg pg;
    ASSERT_EQ(jsd_fx_pg_start(&pg), 0);
    char store[600], log[PATH_MAX];
    ASSERT_EQ(jsd_fx_pg_database_on(pg.url, store, sizeof(store)), 0);
    snprintf(log, sizeof(log), "%s/readyz-relay.log", jsd_test_dir());
    pid_t pid = start_relay(store, jsd_fx_shared_nats_url(), log);
    ASSERT_WAIT(jsd_test_metrics_port(log) > 0, 15000);
    int port = jsd_test_metrics_port(log);
    ASSERT_WAIT(readyz_says(port, " 200 ", "ready"), 10000);
    ASSERT_EQ(jsd_fx_pg_stop(&pg), 0);
    ASSERT_WAIT(readyz_says(port, " 503 ", "store: not answering"), 15000);
    ASSERT_TRUE(alive(pid));
    ASSERT_EQ(jsd_fx_pg_restart(&pg), 0);
    ASSERT_WAIT(readyz_says(port, " 200 ", "ready"), 20000);
    kill(pid, SIGTERM);
    int64_t took = 0;
    int st = wait_exit(pid, 10000, &took);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ASSERT_EQ(jsd_fx_pg_stop(&pg), 0);
}

JSD_TEST_MAIN(cmocka_unit_test(notify_ready_watchdog_stopping),
              cmocka_unit_test(relay_readyz_follows_the_store),
              cmocka_unit_test(sighup_keeps_running_and_reopens_log),
              cmocka_unit_test(relay_metrics_commit_to_puback),
              cmocka_unit_test(relay_sigterm_broker_stopped),
              cmocka_unit_test(relay_sigterm_broker_paused),
              cmocka_unit_test(consume_sigterm_broker_stopped))
