/*
 * A durable ahead of its stream, and a store restored from an older backup
 * (issue 42), against real nats-servers and both store back ends.
 *
 * How the broker loses its tail (lose_tail): a server of the test's own
 * with file storage; 5 messages published and applied; the server stopped
 * and the stream's message blocks (streams/<S>/msgs) copied aside; 5 more
 * published and applied (the durable's ack floor is 10); the server stopped
 * again, the message blocks replaced by the copy while the durable's state
 * (streams/<S>/obs) is kept, and the server started: the stream ends at 5.
 * On nats-server 2.9.10 (Debian's, the compatibility lane's) the durable
 * keeps ack floor 10 and delivered 10: what is published next takes
 * sequences 6.. and is never delivered. nats-server 2.15.1 mends the
 * durable itself at start ("delivered sequence 10 past last stream
 * sequence of 5") and the durable is not ahead; the inbox identity then
 * tells the messages at reused sequences from the lost ones.
 *
 *   ahead_at_start (2.9.10; skipped with its reason when that server is
 *       not installed): the position reads ahead (floor 10, last 5);
 *       `status` and `doctor` (durable.ahead_of_stream) say so; 3 messages
 *       published after the loss (sequences 6..8, new ids); `consume`
 *       without --topology exits 78 naming --topology and applies nothing;
 *       with it the durable is re-created at 6 (not at the stream's last
 *       + 1 = 9, which would lose all three) and each new message is
 *       applied once. Before the fix consume exited 0 having applied none
 *       of them.
 *   ahead_while_running (2.9.10): the same loss under a running consume
 *       --topology: logged at error, the durable re-created, the messages
 *       published after it applied once, /readyz ready again. Before the
 *       fix the consumer idled for ever and applied none.
 *   ahead_while_running_unready (2.9.10): the same without --topology: one
 *       error line, /readyz 503 ("durable: ahead of its stream"), nothing
 *       re-created; `consume --topology` then recovers it.
 *   tail_lost_mended_by_server (2.15.1): the server mends the durable; no
 *       false alarm from status or doctor; the messages published after the
 *       loss at reused sequences 6..8 are each applied once.
 *   lost_with_the_tail (2.15.1): the tail lost and the durable deleted:
 *       `consume --topology` re-creates it at 6, the first sequence
 *       published after the loss, not after the inbox's high-water mark 10
 *       (where the 3 new messages at 6..8 were never delivered: 0
 *       committed before the fix).
 *   inbox_behind: 5 applied, the store copied (SQLite: the online backup
 *       API; PostgreSQL: the inbox and sink rows above sequence 5 deleted in
 *       one transaction and the recorded ack floor put back to 5, which is
 *       what restoring that backup leaves), 5 more
 *       applied, the copy restored: `status` and `doctor`
 *       (consumer.inbox_behind) report sequences 6.. lost, consume refuses
 *       to start (exit 78) naming --redeliver-from-inbox, and consume
 *       --redeliver-from-inbox applies exactly the 5 lost ones again.
 *       Before the fix nothing was reported and consume exited 0 with 0
 *       fetched.
 *   inbox_behind_not_claimed: a durable with a filter, and one bound at an
 *       explicit start after the stream's messages, with empty inboxes and
 *       ack floors past 0: no report.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "consumer_env.h"

#define SINK_SQL "INSERT INTO sink(id, seq) VALUES (:msg_id, :stream_seq)"

static char out[65536];

typedef struct aenv {
    cenv e;
    jsd_fx_nats fx;
    bool own;
    char topo[1024];
} aenv;

/* The old server of the compatibility lane ($JSD_COMPAT_NATS, else the
 * system's), or NULL. */
static const char *old_server(void)
{
    const char *c = getenv("JSD_COMPAT_NATS");
    if (c && *c && access(c, X_OK) == 0)
        return c;
    static const char *const cand[] = {"/usr/sbin/nats-server", "/usr/bin/nats-server",
                                       "/usr/local/bin/nats-server"};
    for (size_t i = 0; i < sizeof(cand) / sizeof(cand[0]); i++)
        if (access(cand[i], X_OK) == 0)
            return cand[i];
    return NULL;
}

static void wait_connected(aenv *a)
{
    ASSERT_WAIT(natsConnection_Status(a->e.nc) == NATS_CONN_STATUS_CONNECTED, 15000);
    ASSERT_WAIT(cenv_stream_msgs(&a->e, a->e.stream) >= 0, 15000);
}

/* A server of the test's own (server: its binary; NULL: the newest), and
 * e's streams on it. */
static void up(aenv *a, bool pg, const char *server)
{
    memset(a, 0, sizeof(*a));
    if (server)
        setenv("JSD_NATS_SERVER", server, 1);
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &a->fx), 0);
    unsetenv("JSD_NATS_SERVER");
    a->own = true;
    setenv("JSD_TEST_NATS_URL", a->fx.url, 1);
    cenv_up(&a->e, pg);
    cenv_store_exec(a->e.store, "CREATE TABLE sink(id TEXT, seq BIGINT)");
    snprintf(a->topo, sizeof(a->topo), "%s/topology-%s.json", jsd_test_dir(), a->e.durable);
    FILE *f = fopen(a->topo, "w");
    ASSERT_TRUE(f != NULL);
    fprintf(f,
            "{\"streams\": [{\"name\": \"%s\", \"subjects\": [\"%s.>\"]}],\n"
            " \"consumers\": [{\"stream\": \"%s\", \"durable\": \"%s\", \"ack_wait\": \"5s\", "
            "\"max_deliver\": 4, \"max_ack_pending\": 64}]}\n",
            a->e.stream, a->e.prefix, a->e.stream, a->e.durable);
    fclose(f);
}

static void down(aenv *a)
{
    cenv_down(&a->e);
    if (a->own)
        jsd_fx_nats_stop(&a->fx);
}

static int consume_idle(aenv *a, const char *extra)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "%s consume --store '%s' --nats %s --stream %s --durable %s --until-idle "
             "--sql '" SINK_SQL "' %s",
             jsd_fx_bin("jsdurable"), a->e.store_url, jsd_fx_shared_nats_url(), a->e.stream,
             a->e.durable, extra ? extra : "");
    return jsd_test_run(cmd, out, sizeof(out));
}

static int consume_topo(aenv *a)
{
    char extra[1200];
    snprintf(extra, sizeof(extra), "--topology %s", a->topo);
    return consume_idle(a, extra);
}

static int status_of(aenv *a, const char *extra)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "%s status --store '%s' --nats %s --stream %s %s",
             jsd_fx_bin("jsdurable"), a->e.store_url, jsd_fx_shared_nats_url(), a->e.stream,
             extra ? extra : "");
    return jsd_test_run(cmd, out, sizeof(out));
}

static int doctor_of(aenv *a)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "%s doctor --store '%s' --nats %s --durable %s:%s",
             jsd_fx_bin("jsdurable"), a->e.store_url, jsd_fx_shared_nats_url(), a->e.stream,
             a->e.durable);
    return jsd_test_run(cmd, out, sizeof(out));
}

static long long sink_rows(aenv *a)
{
    return cenv_store_scalar(a->e.store, "SELECT COUNT(*) FROM sink");
}

/* n rows in the sink, n distinct message ids: nothing applied twice. */
static void applied_once(aenv *a, int n)
{
    ASSERT_EQ(sink_rows(a), n);
    ASSERT_EQ(cenv_store_scalar(a->e.store, "SELECT COUNT(DISTINCT id) FROM sink"), n);
}

static void publish_new(aenv *a, int first, int n)
{
    for (int k = first; k < first + n; k++) {
        char id[32], body[32];
        snprintf(id, sizeof(id), "new-%d", k);
        snprintf(body, sizeof(body), "new-%d", k);
        cenv_publish_raw(&a->e, "n", body, (int)strlen(body), NULL, id);
    }
}

/* The stream's message blocks in the fixture's store. */
static void msgs_dir(aenv *a, char *path, size_t cap)
{
    snprintf(path, cap, "%s/js/jetstream/$G/streams/%s/msgs", a->fx.dir, a->e.stream);
}

/* The recipe in the head comment; with running, the two consumes are the
 * caller's (a consume process already running): only waits for the sink. */
static void lose_tail(aenv *a, bool running)
{
    char msgs[PATH_MAX + 256], keep[PATH_MAX + 256];
    msgs_dir(a, msgs, sizeof(msgs));
    snprintf(keep, sizeof(keep), "%s/msgs-kept-%s", jsd_test_dir(), a->e.stream);

    cenv_publish(&a->e, 1, 5, NULL);
    if (running) {
        ASSERT_WAIT(sink_rows(a) == 5, 20000);
        ASSERT_WAIT(cenv_settled(&a->e), 10000);
    } else {
        int rc = consume_topo(a);
        if (rc != 0)
            fail_msg("first consume exited %d: %s", rc, out);
        ASSERT_CONTAINS(out, "5 committed, 0 duplicates");
    }
    ASSERT_EQ(jsd_fx_nats_stop(&a->fx), 0);
    {
        char cmd[4 * PATH_MAX];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -a '%s' '%s'", keep, msgs, keep);
        ASSERT_EQ(system(cmd), 0);
    }
    ASSERT_EQ(jsd_fx_nats_restart(&a->fx), 0);
    wait_connected(a);
    cenv_publish(&a->e, 6, 5, NULL);
    if (running) {
        ASSERT_WAIT(sink_rows(a) == 10, 20000);
        ASSERT_WAIT(cenv_settled(&a->e), 10000);
    } else {
        int rc = consume_topo(a);
        if (rc != 0)
            fail_msg("second consume exited %d: %s", rc, out);
        ASSERT_CONTAINS(out, "5 committed, 0 duplicates");
    }
    applied_once(a, 10);
    ASSERT_EQ(jsd_fx_nats_stop(&a->fx), 0);
    {
        char cmd[4 * PATH_MAX];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -a '%s' '%s'", msgs, keep, msgs);
        ASSERT_EQ(system(cmd), 0);
    }
    ASSERT_EQ(jsd_fx_nats_restart(&a->fx), 0);
    wait_connected(a);
    ASSERT_EQ(cenv_stream_msgs(&a->e, a->e.stream), 5);
}

static jsd_durable_position position(aenv *a)
{
    jsd_durable_position p;
    jsd_error err;
    jsd_error_clear(&err);
    ASSERT_OK(jsd_durable_position_get(a->e.conn, a->e.store, a->e.stream, a->e.durable, &p, &err),
              err.msg);
    return p;
}

/* ---- ahead at start (2.9.10) ------------------------------------------------------- */

static void ahead_at_start(bool pg)
{
    const char *old = old_server();
    if (!old)
        jsd_test_skip_because("no nats-server 2.9 (Debian's, or $JSD_COMPAT_NATS) to keep a "
                              "durable ahead of its stream; 2.15 mends it at start");
    aenv a;
    up(&a, pg, old);
    lose_tail(&a, false);

    jsd_durable_position p = position(&a);
    ASSERT_TRUE(p.ahead);
    ASSERT_U64_EQ(p.ack_floor, 10);
    ASSERT_U64_EQ(p.stream_last, 5);

    ASSERT_EQ(status_of(&a, NULL), 0);
    ASSERT_CONTAINS(out, "AHEAD OF ITS STREAM: ack floor 10");
    ASSERT_EQ(status_of(&a, "--json"), 0);
    ASSERT_CONTAINS(out, "\"ahead_of_stream\":true");
    ASSERT_EQ(doctor_of(&a), 78);
    ASSERT_CONTAINS(out, "durable.ahead_of_stream");
    ASSERT_CONTAINS(out, "is ahead of its stream");

    /* Published after the loss: sequences 6..8, under the old floor. */
    publish_new(&a, 6, 3);
    int rc = consume_idle(&a, NULL);
    ASSERT_EQ(rc, 78);
    ASSERT_CONTAINS(out, "is ahead of its stream");
    ASSERT_CONTAINS(out, "--topology");
    applied_once(&a, 10);

    rc = consume_topo(&a);
    if (rc != 0)
        fail_msg("consume --topology exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "re-created at stream sequence 6");
    ASSERT_CONTAINS(out, "3 fetched, 3 committed, 0 duplicates");
    applied_once(&a, 13);
    ASSERT_EQ(cenv_store_scalar(a.e.store, "SELECT COUNT(*) FROM sink WHERE id LIKE 'new-%'"), 3);
    jsConsumerInfo *ci = cenv_info(&a.e);
    ASSERT_TRUE(ci != NULL && ci->Config != NULL);
    ASSERT_EQ(ci->Config->DeliverPolicy, js_DeliverByStartSequence);
    ASSERT_U64_EQ(ci->Config->OptStartSeq, 6);
    ASSERT_EQ(ci->Config->MaxDeliver, 4); /* its own settings kept */
    jsConsumerInfo_Destroy(ci);
    ASSERT_TRUE(!position(&a).ahead);

    /* And from then on as usual. */
    publish_new(&a, 9, 2);
    rc = consume_topo(&a);
    if (rc != 0)
        fail_msg("last consume exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "2 committed, 0 duplicates");
    ASSERT_NOT_CONTAINS(out, "ahead of its stream");
    applied_once(&a, 15);
    down(&a);
}
BOTH(ahead_at_start)

/* ---- ahead under a running consumer (2.9.10) ----------------------------------------- */

static void ahead_running(bool pg, bool topo)
{
    const char *old = old_server();
    if (!old)
        jsd_test_skip_because("no nats-server 2.9 (Debian's, or $JSD_COMPAT_NATS) to keep a "
                              "durable ahead of its stream; 2.15 mends it at start");
    aenv a;
    char log[1200];
    up(&a, pg, old);
    snprintf(log, sizeof(log), "%s/consume-ahead-%s-%d.log", jsd_test_dir(), pg ? "pg" : "sq",
             topo);
    const char *argv[] = {jsd_fx_bin("jsdurable"),
                          "consume",
                          "--store",
                          a.e.store_url,
                          "--nats",
                          a.fx.url,
                          "--stream",
                          a.e.stream,
                          "--durable",
                          a.e.durable,
                          "--metrics",
                          "127.0.0.1:0",
                          "--log-level",
                          "info",
                          "--sql",
                          SINK_SQL,
                          topo ? "--topology" : NULL,
                          a.topo,
                          NULL};
    pid_t pid = jsd_test_spawn(argv, log, true, NULL);
    ASSERT_WAIT(jsd_test_metrics_port(log) > 0, 20000);
    int port = jsd_test_metrics_port(log);
    ASSERT_WAIT(jsd_test_file_contains(log, "bound to durable"), 20000);

    lose_tail(&a, true);
    publish_new(&a, 6, 3);
    ASSERT_WAIT(jsd_test_file_contains(log, "is ahead of its stream"), 20000);
    if (!topo) {
        /* Said once, unready, and nothing re-created without the settings;
         * then the operator's fix: consume --topology. */
        ASSERT_WAIT(cenv_readyz_says(port, " 503 ", "durable: ahead of its stream"), 10000);
        ASSERT_EQ(jsd_test_file_lines(log, "is ahead of its stream"), 1);
        ASSERT_TRUE(jsd_test_file_contains(log, "restart with consume --topology FILE"));
        const char *metrics = jsd_test_http_get(port, "/metrics");
        ASSERT_TRUE(metrics != NULL);
        ASSERT_CONTAINS(metrics, "jsd_consumer_durable_ahead_total 1");
        ASSERT_TRUE(position(&a).ahead);
        cenv_stop_consume(pid, log, out, sizeof(out));
        applied_once(&a, 10);
        int rc = consume_topo(&a);
        if (rc != 0)
            fail_msg("consume --topology exited %d: %s", rc, out);
        ASSERT_CONTAINS(out, "re-created at stream sequence 6");
        applied_once(&a, 13);
        down(&a);
        return;
    }
    ASSERT_WAIT(jsd_test_file_contains(log, "re-created at stream sequence 6"), 20000);
    ASSERT_WAIT(sink_rows(&a) == 13, 20000);
    ASSERT_WAIT(cenv_readyz_says(port, " 200 ", NULL), 10000);
    publish_new(&a, 9, 2);
    ASSERT_WAIT(sink_rows(&a) == 15, 20000);
    ASSERT_WAIT(cenv_settled(&a.e), 10000);
    ASSERT_EQ(jsd_test_file_lines(log, "is ahead of its stream"), 1);
    cenv_stop_consume(pid, log, out, sizeof(out));
    applied_once(&a, 15);
    down(&a);
}
static void ahead_while_running(bool pg)
{
    ahead_running(pg, true);
}
BOTH(ahead_while_running)

static void ahead_while_running_unready(bool pg)
{
    ahead_running(pg, false);
}
BOTH(ahead_while_running_unready)

/* ---- the tail lost on 2.15.1 ---------------------------------------------------------- */

static void tail_lost_mended_by_server(bool pg)
{
    aenv a;
    up(&a, pg, NULL);
    lose_tail(&a, false);
    char log[PATH_MAX + 16];
    snprintf(log, sizeof(log), "%s/nats.log", a.fx.dir);
    ASSERT_TRUE(jsd_test_file_contains(log, "past last stream sequence of 5"));
    ASSERT_TRUE(!position(&a).ahead);
    ASSERT_EQ(status_of(&a, NULL), 0);
    ASSERT_NOT_CONTAINS(out, "AHEAD");
    ASSERT_NOT_CONTAINS(out, "INBOX BEHIND");

    publish_new(&a, 6, 3);
    int rc = consume_topo(&a);
    if (rc != 0)
        fail_msg("consume exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "3 fetched, 3 committed, 0 duplicates");
    applied_once(&a, 13);
    down(&a);
}
BOTH(tail_lost_mended_by_server)

static void lost_with_the_tail(bool pg)
{
    aenv a;
    up(&a, pg, NULL);
    lose_tail(&a, false);
    jsErrCode jerr = 0;
    ASSERT_EQ(js_DeleteConsumer(a.e.js, a.e.stream, a.e.durable, NULL, &jerr), NATS_OK);
    publish_new(&a, 6, 3);
    int rc = consume_topo(&a);
    if (rc != 0)
        fail_msg("consume exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "the stream ends at 8 (the server lost the stream's tail)");
    ASSERT_CONTAINS(out, "re-created from the topology at stream sequence 6");
    ASSERT_CONTAINS(out, "3 fetched, 3 committed, 0 duplicates");
    applied_once(&a, 13);
    down(&a);
}
BOTH(lost_with_the_tail)

/* ---- a store restored from an older backup ------------------------------------------- */

static void sqlite_copy(const char *from, const char *to)
{
    sqlite3 *src = NULL, *dst = NULL;
    ASSERT_EQ(sqlite3_open(from, &src), SQLITE_OK);
    ASSERT_EQ(sqlite3_open(to, &dst), SQLITE_OK);
    sqlite3_busy_timeout(dst, 5000);
    sqlite3_backup *b = sqlite3_backup_init(dst, "main", src, "main");
    ASSERT_TRUE(b != NULL);
    ASSERT_EQ(sqlite3_backup_step(b, -1), SQLITE_DONE);
    ASSERT_EQ(sqlite3_backup_finish(b), SQLITE_OK);
    sqlite3_close(src);
    sqlite3_close(dst);
}

static void inbox_behind(bool pg)
{
    aenv a;
    char db[600], copy[620];
    memset(&a, 0, sizeof(a));
    cenv_up(&a.e, pg);
    cenv_store_exec(a.e.store, "CREATE TABLE sink(id TEXT, seq BIGINT)");
    cenv_publish(&a.e, 1, 5, NULL);
    int rc = consume_idle(&a, NULL);
    if (rc != 0)
        fail_msg("first consume exited %d: %s", rc, out);
    if (!pg) {
        const char *path = a.e.store_url + strlen("sqlite:");
        ASSERT_TRUE(strlen(path) < sizeof(db));
        memcpy(db, path, strlen(path) + 1);
        snprintf(copy, sizeof(copy), "%s.backup", db);
        sqlite_copy(db, copy);
    }
    cenv_publish(&a.e, 6, 5, NULL);
    rc = consume_idle(&a, NULL);
    if (rc != 0)
        fail_msg("second consume exited %d: %s", rc, out);
    applied_once(&a, 10);
    if (pg) /* what restoring the backup taken after sequence 5 leaves */
        cenv_store_exec(a.e.store, "DELETE FROM jsd_inbox WHERE stream_seq > 5; "
                                   "DELETE FROM sink WHERE seq > 5; "
                                   "UPDATE jsd_durable_floor SET ack_floor = 5");
    else
        sqlite_copy(copy, db);
    applied_once(&a, 5);

    jsd_durable_position p = position(&a);
    ASSERT_U64_EQ(p.inbox_high, 5);
    ASSERT_U64_EQ(p.ack_floor, 10);
    ASSERT_U64_EQ(p.behind_from, 6);
    ASSERT_EQ(status_of(&a, NULL), 0);
    ASSERT_CONTAINS(out, "INBOX BEHIND: the inbox holds up to 5, the durable acknowledged up to "
                         "10, sequence 6");
    ASSERT_EQ(status_of(&a, "--json"), 0);
    ASSERT_CONTAINS(out, "\"inbox_behind_from\":6");
    ASSERT_EQ(doctor_of(&a), 78);
    ASSERT_CONTAINS(out, "consumer.inbox_behind");
    ASSERT_CONTAINS(out, "--redeliver-from-inbox");

    /* consume reports it and stops, applying nothing on a guess. */
    rc = consume_idle(&a, NULL);
    ASSERT_EQ(rc, 78);
    ASSERT_CONTAINS(out, "the store lost applications");
    ASSERT_CONTAINS(out, "--redeliver-from-inbox");
    applied_once(&a, 5);

    rc = consume_idle(&a, "--redeliver-from-inbox");
    if (rc != 0)
        fail_msg("consume --redeliver-from-inbox exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "re-created at stream sequence 6");
    ASSERT_CONTAINS(out, "5 fetched, 5 committed, 0 duplicates");
    applied_once(&a, 10);
    ASSERT_EQ(cenv_store_scalar(a.e.store, "SELECT COUNT(DISTINCT seq) FROM sink"), 10);
    ASSERT_U64_EQ(position(&a).behind_from, 0);
    ASSERT_EQ(doctor_of(&a), 0);
    cenv_down(&a.e);
}
BOTH(inbox_behind)

/* A filtered durable, and one bound after the stream's messages, whose
 * inboxes are empty while their ack floors are past 0: nothing lost. */
static void inbox_behind_not_claimed(bool pg)
{
    aenv a;
    memset(&a, 0, sizeof(a));
    cenv_up(&a.e, pg);
    cenv_store_exec(a.e.store, "CREATE TABLE sink(id TEXT, seq BIGINT)");
    cenv_publish(&a.e, 1, 5, NULL);

    /* Bound at an explicit start after them: acknowledged nothing of
     * theirs. */
    jsConsumerConfig cc;
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    jsConsumerConfig_Init(&cc);
    cc.Durable = a.e.durable;
    cc.AckPolicy = js_AckExplicit;
    cc.MaxDeliver = 6;
    cc.DeliverPolicy = js_DeliverByStartSequence;
    cc.OptStartSeq = 6;
    ASSERT_EQ(js_AddConsumer(&ci, a.e.js, a.e.stream, &cc, NULL, &jerr), NATS_OK);
    jsConsumerInfo_Destroy(ci);
    ASSERT_U64_EQ(position(&a).behind_from, 0);
    cenv_publish(&a.e, 6, 2, NULL);
    int rc = consume_idle(&a, NULL);
    if (rc != 0)
        fail_msg("consume exited %d: %s", rc, out);
    ASSERT_NOT_CONTAINS(out, "lost applications");
    applied_once(&a, 2);
    ASSERT_U64_EQ(position(&a).behind_from, 0);

    /* A filter: the stream's other subject acknowledged past, never taken. */
    char filt_durable[64], filter[96], other[96];
    snprintf(filt_durable, sizeof(filt_durable), "%s", jsd_test_unique("fd"));
    snprintf(filter, sizeof(filter), "%s.f", a.e.prefix);
    snprintf(other, sizeof(other), "o");
    jsConsumerConfig_Init(&cc);
    cc.Durable = filt_durable;
    cc.AckPolicy = js_AckExplicit;
    cc.MaxDeliver = 6;
    cc.FilterSubject = filter;
    ASSERT_EQ(js_AddConsumer(&ci, a.e.js, a.e.stream, &cc, NULL, &jerr), NATS_OK);
    jsConsumerInfo_Destroy(ci);
    cenv_publish_raw(&a.e, "f", "f1", 2, NULL, "f-1");
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "%s consume --store '%s' --nats %s --stream %s --durable %s --until-idle "
             "--sql '" SINK_SQL "'",
             jsd_fx_bin("jsdurable"), a.e.store_url, jsd_fx_shared_nats_url(), a.e.stream,
             filt_durable);
    rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 0)
        fail_msg("filtered consume exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "1 committed");
    /* A message on the other subject after it: the durable's floor may move
     * past it (the server skips what the filter does not take) while its
     * inbox ends at f-1. */
    cenv_publish_raw(&a.e, other, "o1", 2, NULL, "o-1");
    rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 0)
        fail_msg("filtered consume exited %d: %s", rc, out);
    ASSERT_NOT_CONTAINS(out, "lost applications");
    jsd_durable_position p;
    jsd_error err;
    jsd_error_clear(&err);
    ASSERT_OK(jsd_durable_position_get(a.e.conn, a.e.store, a.e.stream, filt_durable, &p, &err),
              err.msg);
    ASSERT_U64_EQ(p.behind_from, 0);
    print_message("filtered durable: ack floor %" PRIu64 ", inbox high-water %" PRIu64 "\n",
                  p.ack_floor, p.inbox_high);
    cenv_down(&a.e);
}
BOTH(inbox_behind_not_claimed)

JSD_TEST_MAIN(cmocka_unit_test(ahead_at_start_sqlite), cmocka_unit_test(ahead_at_start_pg),
              cmocka_unit_test(ahead_while_running_sqlite),
              cmocka_unit_test(ahead_while_running_pg),
              cmocka_unit_test(ahead_while_running_unready_sqlite),
              cmocka_unit_test(ahead_while_running_unready_pg),
              cmocka_unit_test(tail_lost_mended_by_server_sqlite),
              cmocka_unit_test(tail_lost_mended_by_server_pg),
              cmocka_unit_test(lost_with_the_tail_sqlite), cmocka_unit_test(lost_with_the_tail_pg),
              cmocka_unit_test(inbox_behind_sqlite), cmocka_unit_test(inbox_behind_pg),
              cmocka_unit_test(inbox_behind_not_claimed_sqlite),
              cmocka_unit_test(inbox_behind_not_claimed_pg))
