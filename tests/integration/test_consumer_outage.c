/*
 * Durable ingress when a dependency is out, against a real nats-server,
 * a private PostgreSQL and SQLite on a small tmpfs: a store that cannot be
 * reached (PostgreSQL stopped) or cannot write (a full disk) for longer than
 * the durable's whole redelivery schedule loses nothing and spends no
 * delivery attempt (every message applied exactly once afterwards, no
 * redelivery, nothing parked); a drain during such an outage is not
 * reported as success; a dead-letter stream that refuses (full, discard new)
 * is not the message's failure, and every poison record reaches it once it
 * has room. Also: the ack wait asked for is the one in force, and the
 * deliveries{result="commit"} counter moves only when the ACK is confirmed.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "consumer_env.h"
#include "proxy.h"

/* ack wait 1.5 s x max_deliver 3 (+ NAK delays of 200 ms): the whole
 * redelivery schedule is over in under 5 s; the outages below last longer. */
#define ACK_WAIT_MS 1500
#define MAX_DELIVER 3
#define OUTAGE_MS   9000

typedef struct runner {
    jsd_consumer *c;
    bool until_idle;
    jsd_status rc;
    atomic_int done;
    atomic_int calls;
    bool delete_durable; /* delete the durable from inside the handler */
    cenv *e;
} runner;

static jsd_disposition apply(jsd_tx *tx, const jsd_delivery *d, void *user)
{
    runner *r = user;
    char sql[2300];
    size_t len = 0;
    const char *p = jsd_delivery_payload(d, &len);
    atomic_fetch_add(&r->calls, 1);
    if (r->delete_durable) {
        r->delete_durable = false;
        js_DeleteConsumer(r->e->js, r->e->stream, r->e->durable, NULL, NULL);
    }
    snprintf(sql, sizeof(sql), "INSERT INTO effects(seq, body) VALUES (%llu, '%.*s')",
             (unsigned long long)jsd_delivery_stream_seq(d), (int)(len < 2000 ? len : 2000),
             p ? p : "");
    /* Like any handler that checks its SQL: a failure is a retry. */
    if (!cenv_tx_exec(tx, sql))
        return jsd_disposition_retry(0, "insert failed");
    return jsd_disposition_commit();
}

static void *run_main(void *arg)
{
    runner *r = arg;
    r->rc = jsd_consumer_run(r->c, apply, r, r->until_idle);
    atomic_store(&r->done, 1);
    return NULL;
}

static void effects_table(cenv *e)
{
    cenv_store_exec(e->store, "CREATE TABLE effects(seq BIGINT, body TEXT)");
}

/* A second handle on the store for the test's own reads: the consumer's is
 * used by its thread only. */
static jsd_store *observer(cenv *e)
{
    jsd_store *s = NULL;
    jsd_error err;
    jsd_error_clear(&err);
    ASSERT_OK_E(jsd_store_open(&s, e->store_url, &err), err.msg);
    return s;
}

static jsd_consumer_stats stats_of(jsd_consumer *c)
{
    jsd_consumer_stats s;
    jsd_consumer_stats_get(c, &s);
    return s;
}

static long long redelivered(cenv *e)
{
    jsConsumerInfo *ci = cenv_info(e);
    long long n = ci ? (long long)ci->NumRedelivered : -1;
    jsConsumerInfo_Destroy(ci);
    return n;
}

static double metric(const char *name, const char *label)
{
    double v = 0;
    jsd_metrics_get(jsd_metrics_default(), name, label, &v);
    return v;
}

/* After the outage: every message applied exactly once, an inbox row for
 * each, nothing parked, no attempt spent, nothing counted as a retry. */
static void check_applied_once(cenv *e, jsd_store *obs, runner *r, long long n)
{
    ASSERT_WAIT(cenv_store_scalar(obs, "SELECT COUNT(*) FROM effects") == n, 30000);
    ASSERT_EQ(cenv_store_scalar(obs, "SELECT COUNT(DISTINCT seq) FROM effects"), n);
    ASSERT_EQ(cenv_store_scalar(obs, "SELECT COUNT(*) FROM jsd_inbox"), n);
    ASSERT_EQ(cenv_store_scalar(obs, "SELECT COUNT(*) FROM jsd_poison"), 0);
    ASSERT_WAIT(cenv_settled(e), 10000);
    ASSERT_EQ(redelivered(e), 0);
    ASSERT_EQ(cenv_stream_msgs(e, e->dlq_stream), 0);
    jsd_consumer_stats s = stats_of(r->c);
    ASSERT_TRUE(s.store_outages >= 1);
    ASSERT_EQ(s.held, 0);
    ASSERT_EQ(s.retried, 0);
    ASSERT_EQ(s.parked, 0);
    ASSERT_EQ(s.poisoned, 0);
    ASSERT_TRUE(metric("jsd_consumer_store_outages_total", NULL) >= 1);
    ASSERT_EQ(metric("jsd_consumer_held_deliveries", NULL), 0);
    ASSERT_EQ(metric("jsd_deliveries_total", "retry"), 0);
}

static void stop_runner(runner *r, pthread_t th)
{
    jsd_consumer_begin_drain(r->c);
    pthread_join(th, NULL);
    ASSERT_OK_E(r->rc, jsd_consumer_errmsg(r->c));
}

/* ---- PostgreSQL stopped for longer than the redelivery schedule ---------------------- */
static void pg_outage_loses_nothing(void **state)
{
    (void)state;
    jsd_fx_pg pg;
    char url[512];
    ASSERT_EQ(jsd_fx_pg_start(&pg), 0);
    ASSERT_EQ(jsd_fx_pg_database_on(pg.url, url, sizeof(url)), 0);
    cenv e;
    cenv_up_at(&e, true, url);
    effects_table(&e);
    cenv_durable(&e, ACK_WAIT_MS, MAX_DELIVER, 1024, NULL, 0);
    jsd_store *obs = observer(&e);
    jsd_consumer_opts o;
    jsd_consumer_opts_init(&o);
    o.retry_delay_ms = 200;
    runner r = {.e = &e};
    r.c = cenv_consumer(&e, &o);
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, run_main, &r), 0);

    cenv_publish(&e, 1, 20, NULL);
    ASSERT_WAIT(cenv_store_scalar(obs, "SELECT COUNT(*) FROM effects") == 20, 20000);
    ASSERT_EQ(jsd_fx_pg_stop(&pg), 0);
    cenv_publish(&e, 21, 300, NULL);
    ASSERT_WAIT(stats_of(r.c).held > 0, 10000);
    ASSERT_TRUE(metric("jsd_consumer_held_deliveries", NULL) > 0);
    /* The outage itself: longer than ack wait x max_deliver. */
    jsd_test_sleep_ms(OUTAGE_MS);
    ASSERT_EQ(redelivered(&e), 0); /* kept alive, never NAKed */
    ASSERT_EQ(stats_of(r.c).retried, 0);
    ASSERT_EQ(jsd_fx_pg_restart(&pg), 0);

    check_applied_once(&e, obs, &r, 320);
    stop_runner(&r, th);
    jsd_consumer_destroy(r.c);
    jsd_store_close(obs);
    cenv_down(&e);
}

/* ---- a drain during an outage is not success ------------------------------------------ */
static void drain_while_held_fails(void **state)
{
    (void)state;
    jsd_fx_pg pg;
    char url[512];
    ASSERT_EQ(jsd_fx_pg_start(&pg), 0);
    ASSERT_EQ(jsd_fx_pg_database_on(pg.url, url, sizeof(url)), 0);
    cenv e;
    cenv_up_at(&e, true, url);
    effects_table(&e);
    cenv_durable(&e, ACK_WAIT_MS, MAX_DELIVER, 1024, NULL, 0);
    runner r = {.e = &e, .until_idle = true};
    r.c = cenv_consumer(&e, NULL);
    ASSERT_EQ(jsd_fx_pg_stop(&pg), 0);
    cenv_publish(&e, 1, 5, NULL);
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, run_main, &r), 0);
    ASSERT_WAIT(stats_of(r.c).held > 0, 10000);
    char want[96];
    snprintf(want, sizeof(want), "stopped while %llu deliveries were held by a store outage",
             (unsigned long long)stats_of(r.c).held);
    jsd_consumer_begin_drain(r.c);
    pthread_join(th, NULL);
    ASSERT_STATUS(r.rc, JSD_ERR_CONNECT);
    ASSERT_CONTAINS(jsd_consumer_errmsg(r.c), want);
    ASSERT_CONTAINS(jsd_consumer_errmsg(r.c), "left unacked");
    jsd_consumer_destroy(r.c);

    /* Once the store is back, --until-idle applies them and only then succeeds. */
    ASSERT_EQ(jsd_fx_pg_restart(&pg), 0);
    runner r2 = {.e = &e, .until_idle = true};
    r2.c = cenv_consumer(&e, NULL);
    r2.rc = jsd_consumer_run(r2.c, apply, &r2, true);
    ASSERT_OK_E(r2.rc, jsd_consumer_errmsg(r2.c));
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM effects"), 5);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM jsd_inbox"), 5);
    jsd_consumer_destroy(r2.c);
    cenv_down(&e);
}

/* The tmpfs of the disk cases (jsd_test_mount_tmpfs). */
static const char *mnt_dir;

static bool mount_tmpfs(const char *name, const char *size)
{
    mnt_dir = jsd_test_mount_tmpfs(name, size);
    return mnt_dir != NULL;
}

/* Fill the file system at path until a write fails with ENOSPC. */
static void fill_disk(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_TRUE(fd >= 0);
    static char chunk[4096];
    memset(chunk, 'f', sizeof(chunk));
    for (;;) {
        ssize_t w = write(fd, chunk, sizeof(chunk));
        if (w < 0) {
            ASSERT_EQ(errno, ENOSPC);
            break;
        }
        if (w < (ssize_t)sizeof(chunk))
            continue;
    }
    /* the last partial block */
    while (write(fd, chunk, 1) == 1)
        ;
    close(fd);
}

static void sqlite_full_disk_loses_nothing(void **state)
{
    (void)state;
    if (!mount_tmpfs("full", "4m")) {
        skip();
        return;
    }
    char url[700], filler[700];
    snprintf(url, sizeof(url), "sqlite:%s/in.db", mnt_dir);
    snprintf(filler, sizeof(filler), "%s/filler", mnt_dir);
    cenv e;
    cenv_up_at(&e, false, url);
    effects_table(&e);
    cenv_durable(&e, ACK_WAIT_MS, MAX_DELIVER, 1024, NULL, 0);
    jsd_store *obs = observer(&e);
    jsd_consumer_opts o;
    jsd_consumer_opts_init(&o);
    o.retry_delay_ms = 200;
    runner r = {.e = &e};
    r.c = cenv_consumer(&e, &o);
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, run_main, &r), 0);

    cenv_publish(&e, 1, 10, NULL);
    ASSERT_WAIT(cenv_store_scalar(obs, "SELECT COUNT(*) FROM effects") == 10, 20000);
    fill_disk(filler);
    /* 1 KiB bodies: far more than any page the database or its WAL holds free. */
    static char body[1024];
    memset(body, 'b', sizeof(body));
    for (int k = 0; k < 300; k++) {
        char id[32];
        snprintf(id, sizeof(id), "big-%d", k);
        cenv_publish_raw(&e, "big", body, (int)sizeof(body), NULL, id);
    }
    ASSERT_WAIT(stats_of(r.c).held > 0, 10000);
    jsd_test_sleep_ms(OUTAGE_MS); /* the disk stays full past the redelivery schedule */
    ASSERT_EQ(redelivered(&e), 0);
    ASSERT_EQ(stats_of(r.c).retried, 0);
    ASSERT_EQ(unlink(filler), 0);

    check_applied_once(&e, obs, &r, 310);
    stop_runner(&r, th);
    jsd_consumer_destroy(r.c);
    jsd_store_close(obs);
    cenv_down(&e);
}

/* ---- a dead-letter stream that refuses ------------------------------------------------- */
static void dlq_limit(cenv *e, int64_t max_msgs)
{
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    ASSERT_EQ(js_GetStreamInfo(&si, e->js, e->dlq_stream, NULL, &jerr), NATS_OK);
    jsStreamConfig sc = *si->Config;
    sc.MaxMsgs = max_msgs;
    sc.Discard = js_DiscardNew;
    jsStreamInfo *up = NULL;
    ASSERT_EQ(js_UpdateStream(&up, e->js, &sc, NULL, &jerr), NATS_OK);
    jsStreamInfo_Destroy(up);
    jsStreamInfo_Destroy(si);
}

static long long unpublished_in_status(cenv *e)
{
    char cmd[2048], out[8192];
    snprintf(cmd, sizeof(cmd), "%s status --store '%s' --json", jsd_fx_bin("jsdurable"),
             e->store_url);
    if (jsd_test_run(cmd, out, sizeof(out)) != 0)
        fail_msg("status failed: %s", out);
    const char *p = strstr(out, "\"poison_unpublished\":");
    if (!p)
        fail_msg("status --json has no poison_unpublished: %s", out);
    return strtoll(p + strlen("\"poison_unpublished\":"), NULL, 10);
}

static void dlq_full_then_room(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    effects_table(&e);
    cenv_durable(&e, 30000, 6, 1024, NULL, 0);
    /* The dead-letter stream holds one message and refuses new ones. */
    dlq_limit(&e, 1);
    char filler_subj[200];
    snprintf(filler_subj, sizeof(filler_subj), "jsd.dlq.%s.filler", e.stream);
    ASSERT_EQ(js_Publish(NULL, e.js, filler_subj, "x", 1, NULL, NULL), NATS_OK);
    ASSERT_EQ(cenv_stream_msgs(&e, e.dlq_stream), 1);

    static const char *const types[] = {"t.ok"};
    jsd_consumer_opts o;
    jsd_consumer_opts_init(&o);
    o.accept_types = types;
    o.n_accept_types = 1;
    runner r = {.e = &e};
    r.c = cenv_consumer(&e, &o);
    cenv_publish(&e, 1, 5, "t.bad"); /* poison on first delivery */
    cenv_publish(&e, 6, 5, "t.ok");
    int64_t end = jsd_test_mono_ms() + 15000;
    while (stats_of(r.c).poisoned + stats_of(r.c).committed < 10 && jsd_test_mono_ms() < end)
        ASSERT_OK_E(jsd_consumer_poll(r.c, apply, &r, NULL), jsd_consumer_errmsg(r.c));
    jsd_consumer_stats s = stats_of(r.c);
    ASSERT_EQ(s.poisoned, 5);
    ASSERT_EQ(s.committed, 5);
    ASSERT_EQ(s.dlq_deferred, 5);
    ASSERT_EQ(s.retried, 0);
    /* Settled with the server at once: no delivery spent on the refusal. */
    ASSERT_WAIT(cenv_settled(&e), 5000);
    ASSERT_EQ(redelivered(&e), 0);
    ASSERT_EQ(cenv_stream_msgs(&e, e.dlq_stream), 1);
    /* Stored, flagged as unpublished (store stats, `status`, the metric). */
    jsd_store_stats st;
    ASSERT_OK(jsd_store_stats_get(e.store, &st));
    ASSERT_EQ(st.poison_records, 5);
    ASSERT_EQ(st.poison_unpublished, 5);
    ASSERT_EQ(unpublished_in_status(&e), 5);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM jsd_poison WHERE dlq_seq IS NULL"),
              5);
    /* An --until-idle run does not call that done. */
    ASSERT_STATUS(jsd_consumer_run(r.c, apply, &r, true), JSD_ERR_NATS);
    ASSERT_CONTAINS(jsd_consumer_errmsg(r.c), "5 poison records");
    ASSERT_CONTAINS(jsd_consumer_errmsg(r.c), "not in the dead-letter stream");

    /* Room again: every stored dead letter is published, once. */
    dlq_limit(&e, -1);
    end = jsd_test_mono_ms() + 45000;
    while (stats_of(r.c).poison_unpublished + (uint64_t)st.poison_unpublished > 0 &&
           jsd_test_mono_ms() < end) {
        ASSERT_OK_E(jsd_consumer_poll(r.c, apply, &r, NULL), jsd_consumer_errmsg(r.c));
        ASSERT_OK(jsd_store_stats_get(e.store, &st));
    }
    ASSERT_EQ(st.poison_unpublished, 0);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM jsd_poison WHERE dlq_seq IS NULL"),
              0);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(DISTINCT dlq_seq) FROM jsd_poison"), 5);
    ASSERT_EQ(cenv_stream_msgs(&e, e.dlq_stream), 6); /* the filler + one per poison message */
    ASSERT_EQ(unpublished_in_status(&e), 0);
    ASSERT_EQ(stats_of(r.c).dlq_republished, 5);
    ASSERT_EQ(metric("jsd_poison_unpublished", NULL), 0);
    /* A further sweep publishes nothing again. */
    for (int i = 0; i < 3; i++)
        ASSERT_OK(jsd_consumer_poll(r.c, apply, &r, NULL));
    ASSERT_EQ(cenv_stream_msgs(&e, e.dlq_stream), 6);
    ASSERT_OK_E(jsd_consumer_run(r.c, apply, &r, true), jsd_consumer_errmsg(r.c));
    jsd_consumer_destroy(r.c);
    cenv_down(&e);
}

/* ---- the ack wait in force is the one asked for ---------------------------------------- */
static void ack_wait_not_replaced(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    jsd_durable_config dc;
    jsd_error err;
    bool created = false;
    /* A backoff that starts below the ack wait is refused, and nothing is created. */
    jsd_durable_config_init(&dc);
    dc.ack_wait_ms = 5000;
    dc.n_backoff = 2;
    dc.backoff_ms[0] = 1000;
    dc.backoff_ms[1] = 10000;
    jsd_error_clear(&err);
    ASSERT_STATUS(jsd_consumer_ensure(e.conn, e.stream, e.durable, &dc, &created, &err),
                  JSD_ERR_CONFIG);
    ASSERT_CONTAINS(err.msg, "backoff starts at 1000 ms, below the ack wait 5000 ms");
    ASSERT_TRUE(!created);
    ASSERT_TRUE(cenv_info(&e) == NULL);
    /* The defaults keep the ack wait asked for. */
    jsd_durable_config_init(&dc);
    dc.ack_wait_ms = 5000;
    ASSERT_OK_E(jsd_consumer_ensure(e.conn, e.stream, e.durable, &dc, &created, &err), err.msg);
    ASSERT_TRUE(created);
    jsConsumerInfo *ci = cenv_info(&e);
    ASSERT_TRUE(ci != NULL);
    ASSERT_EQ(ci->Config->AckWait / 1000000, 5000);
    jsConsumerInfo_Destroy(ci);
    cenv_down(&e);
}

/* ---- deliveries{result="commit"} counts confirmed ACKs ---------------------------------- */
static void commit_counted_at_confirmed_ack(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    effects_table(&e);
    cenv_durable(&e, 30000, 6, 1024, NULL, 0);
    cenv_publish(&e, 1, 1, NULL);
    jsd_consumer_opts o;
    jsd_consumer_opts_init(&o);
    o.ack_timeout_ms = 500;
    runner r = {.e = &e, .delete_durable = true};
    r.c = cenv_consumer(&e, &o);
    double before = metric("jsd_deliveries_total", "commit");
    /* The handler deletes the durable: the commit succeeds, the ACK that
     * follows is never confirmed. */
    int64_t end = jsd_test_mono_ms() + 10000;
    while (stats_of(r.c).committed + stats_of(r.c).ack_unconfirmed < 2 && jsd_test_mono_ms() < end)
        jsd_consumer_poll(r.c, apply, &r, NULL);
    jsd_consumer_stats s = stats_of(r.c);
    ASSERT_EQ(s.committed, 1);
    ASSERT_EQ(s.ack_unconfirmed, 1);
    ASSERT_EQ(s.acked, 0);
    ASSERT_EQ(metric("jsd_deliveries_total", "commit") - before, 0);
    jsd_consumer_destroy(r.c);
    cenv_down(&e);
}

/* ---- NATS connection closed for good ------------------------------------------------ */
/* The consumer's connection goes through a proxy that is then stopped:
 * after its reconnect_attempts nats.c closes the connection for good, and
 * the run ends with JSD_ERR_CONNECT and a text that says so instead of
 * retrying for ever. What was applied stays applied, once. */
static void gone_connection_ends_the_run(void **state)
{
    (void)state;
    cenv e;
    cenv_up(&e, false);
    effects_table(&e);
    cenv_durable(&e, ACK_WAIT_MS, MAX_DELIVER, 1024, NULL, 0);
    jsd_fx_proxy px;
    ASSERT_EQ(jsd_fx_proxy_start(jsd_fx_url_port(jsd_fx_shared_nats_url()), NULL, &px), 0);
    jsd_conn_close(e.conn); /* the library's connection goes through the proxy */
    e.conn = jsd_fx_conn_giving_up(px.url);
    jsd_store *obs = observer(&e);
    runner r = {.e = &e};
    r.c = cenv_consumer(&e, NULL);
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, run_main, &r), 0);
    cenv_publish(&e, 1, 20, NULL);
    ASSERT_WAIT(cenv_store_scalar(obs, "SELECT COUNT(*) FROM effects") == 20, 20000);

    ASSERT_EQ(jsd_fx_proxy_stop(&px), 0);
    if (!WAIT_UNTIL(atomic_load(&r.done), 15000))
        fail_msg("the consumer still runs on a connection nats.c closed for good");
    pthread_join(th, NULL);
    ASSERT_STATUS(r.rc, JSD_ERR_CONNECT);
    ASSERT_CONTAINS(jsd_consumer_errmsg(r.c), "closed for good");
    ASSERT_EQ(cenv_store_scalar(obs, "SELECT COUNT(DISTINCT seq) FROM effects"), 20);
    ASSERT_EQ(cenv_store_scalar(obs, "SELECT COUNT(*) FROM effects"), 20);
    jsd_consumer_destroy(r.c);
    jsd_store_close(obs);
    cenv_down(&e);
}

BOTH(dlq_full_then_room)
BOTH(ack_wait_not_replaced)
BOTH(commit_counted_at_confirmed_ack)

#define T(fn) cmocka_unit_test(fn##_sqlite), cmocka_unit_test(fn##_pg)

JSD_TEST_MAIN(cmocka_unit_test(pg_outage_loses_nothing), cmocka_unit_test(drain_while_held_fails),
              cmocka_unit_test(sqlite_full_disk_loses_nothing), T(dlq_full_then_room),
              cmocka_unit_test(gone_connection_ends_the_run), T(ack_wait_not_replaced),
              T(commit_counted_at_confirmed_ack))
