/*
 * `jsdurable dlq replay` reaches only the durable that parked the message
 * (issue 42, item 6), against a real nats-server and both store back ends.
 * One stream, three consumers: jsdurable durables A and B (`consume --sql`,
 * each with its own inbox and sink) and a plain JetStream durable. A message
 * is poison for A only; replayed with --store of A, A applies it exactly
 * once, neither B nor the plain durable receives anything, the stream keeps
 * its message count, and a second replay applies nothing. A replay whose
 * handler fails again is marked failed with its reason (status shows it) and
 * queued again on request. A crash on either side of the replay's COMMIT
 * leaves it applied once. In the library, a running consumer picks a
 * request up within its sweep period and the handler sees the replay.
 */
#include "consumer_env.h"

static char out[65536];

/* A's sink needs a key per message id: the statement fails (NOT NULL) for a
 * message whose key is missing, which makes it poison for A only. */
static int consume_a_env(cenv *e, const char *env)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "%s %s consume --store '%s' --nats %s --stream %s --durable %s --ack-wait 2s "
             "--max-deliver 1 --until-idle --sql 'INSERT INTO sinka(id, k, seq, dlv) VALUES "
             "(:msg_id, (SELECT k FROM keys WHERE id = :msg_id), :stream_seq, :deliveries)'",
             env ? env : "", jsd_fx_bin("jsdurable"), e->store_url, jsd_fx_shared_nats_url(),
             e->stream, e->durable);
    return jsd_test_run(cmd, out, sizeof(out));
}

static int consume_a(cenv *e)
{
    return consume_a_env(e, NULL);
}

static int consume_b(cenv *e, const char *durable_b)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "%s consume --store '%s' --nats %s --stream %s --durable %s --ack-wait 2s "
             "--until-idle --sql 'INSERT INTO sinkb(id, seq) VALUES (:msg_id, :stream_seq)'",
             jsd_fx_bin("jsdurable"), e->store_url, jsd_fx_shared_nats_url(), e->stream, durable_b);
    return jsd_test_run(cmd, out, sizeof(out));
}

static int dlq(cenv *e, const char *args)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "%s dlq %s --nats %s --stream %s", jsd_fx_bin("jsdurable"), args,
             jsd_fx_shared_nats_url(), e->dlq_stream);
    return jsd_test_run(cmd, out, sizeof(out));
}

static int status(cenv *e)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "%s status --store '%s'", jsd_fx_bin("jsdurable"), e->store_url);
    return jsd_test_run(cmd, out, sizeof(out));
}

/* The plain JetStream durable: never fetched from, so its pending count is
 * every message of the stream it has not been given. */
static void plain_durable(cenv *e, const char *name)
{
    jsConsumerConfig cc;
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    jsConsumerConfig_Init(&cc);
    cc.Durable = name;
    cc.AckPolicy = js_AckExplicit;
    ASSERT_EQ(js_AddConsumer(&ci, e->js, e->stream, &cc, NULL, &jerr), NATS_OK);
    jsConsumerInfo_Destroy(ci);
}

static long long plain_pending(cenv *e, const char *name)
{
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    if (js_GetConsumerInfo(&ci, e->js, e->stream, name, NULL, &jerr) != NATS_OK || !ci)
        return -1;
    long long n = (long long)ci->NumPending + (long long)ci->Delivered.Stream;
    jsConsumerInfo_Destroy(ci);
    return n;
}

static long long scalar(cenv *e, const char *sql)
{
    return cenv_store_scalar(e->store, sql);
}

static void only_the_parking_durable(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    char durable_b[64], plain[64];
    snprintf(durable_b, sizeof(durable_b), "%s", jsd_test_unique("durb"));
    snprintf(plain, sizeof(plain), "%s", jsd_test_unique("plain"));
    cenv_store_exec(e.store, "CREATE TABLE keys(id TEXT PRIMARY KEY, k BIGINT NOT NULL)");
    cenv_store_exec(e.store, "CREATE TABLE sinka(id TEXT, k BIGINT NOT NULL, seq BIGINT, "
                             "dlv BIGINT)");
    cenv_store_exec(e.store, "CREATE TABLE sinkb(id TEXT, seq BIGINT)");
    cenv_store_exec(e.store, "INSERT INTO keys(id, k) VALUES ('id-1', 1)");
    cenv_store_exec(e.store, "INSERT INTO keys(id, k) VALUES ('id-3', 3)");
    plain_durable(&e, plain);
    cenv_publish(&e, 1, 3, NULL);

    /* A parks id-2 (its key is missing) and applies the others. */
    int rc = consume_a(&e);
    if (rc != 1) /* --until-idle after a dead letter */
        fail_msg("consume A exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "1 parked");
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM sinka"), 2);
    ASSERT_EQ(cenv_stream_msgs(&e, e.dlq_stream), 1);
    /* B applies all three. */
    rc = consume_b(&e, durable_b);
    if (rc != 0)
        fail_msg("consume B exited %d: %s", rc, out);
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM sinkb"), 3);
    ASSERT_EQ(plain_pending(&e, plain), 3);
    ASSERT_EQ(cenv_stream_msgs(&e, e.stream), 3);

    /* Without --store, no silent republication: refused, naming --store. */
    ASSERT_EQ(dlq(&e, "replay 1"), 64);
    ASSERT_CONTAINS(out, "give --store URL");
    ASSERT_EQ(cenv_stream_msgs(&e, e.stream), 3);

    /* The handler fails again (the key is still missing): marked failed,
     * with its reason, shown by status; nothing applied. */
    char args[1024];
    snprintf(args, sizeof(args), "replay --store '%s' 1", e.store_url);
    rc = dlq(&e, args);
    if (rc != 0)
        fail_msg("dlq replay exited %d: %s", rc, out);
    char want[256];
    snprintf(want, sizeof(want), "queued %s:1 for durable %s (%s:2)", e.dlq_stream, e.durable,
             e.stream);
    ASSERT_CONTAINS(out, want);
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM jsd_replay WHERE state = 0"), 1);
    ASSERT_EQ(status(&e), 0);
    ASSERT_CONTAINS(out, "replays pending  1");
    rc = consume_a(&e);
    if (rc != 1) /* --until-idle after a replay that failed again */
        fail_msg("consume A exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "replays (dlq replay --store): 0 applied, 1 failed again");
    ASSERT_CONTAINS(out, "1 replays failed again (`jsdurable status` shows why): exit 1");
    ASSERT_CONTAINS(out, "failed: handler: --sql failed");
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM sinka"), 2);
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM jsd_replay WHERE state = 2 AND detail LIKE "
                         "'handler: --sql failed%'"),
              1);
    ASSERT_EQ(status(&e), 0);
    ASSERT_CONTAINS(out, "replays failed   1");
    ASSERT_CONTAINS(out, "failed  ");
    /* A second consume does not loop on it. */
    rc = consume_a(&e);
    if (rc != 0)
        fail_msg("consume A exited %d: %s", rc, out);
    ASSERT_NOT_CONTAINS(out, "replays (dlq replay --store)");

    /* The cause fixed, asked again: queued again, applied once by A. */
    cenv_store_exec(e.store, "INSERT INTO keys(id, k) VALUES ('id-2', 2)");
    rc = dlq(&e, args);
    if (rc != 0)
        fail_msg("dlq replay exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, want);
    rc = consume_a(&e);
    if (rc != 0)
        fail_msg("consume A exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "0 fetched");
    ASSERT_CONTAINS(out, "replays (dlq replay --store): 1 applied, 0 failed again");
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM sinka"), 3);
    /* the replay is no delivery: :deliveries is 0 */
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM sinka WHERE id = 'id-2' AND k = 2 AND seq = 2 "
                         "AND dlv = 0"),
              1);
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM jsd_replay WHERE state = 1"), 1);
    char sql[512];
    snprintf(sql, sizeof(sql),
             "SELECT outcome FROM jsd_inbox WHERE consumer = '%s' AND stream_seq = 2", e.durable);
    ASSERT_EQ(scalar(&e, sql), 1); /* COMMIT: a redelivery is a duplicate */

    /* Nobody else received it: B finds nothing, the plain durable has
     * nothing new, the stream holds what it held. */
    rc = consume_b(&e, durable_b);
    if (rc != 0)
        fail_msg("consume B exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "0 fetched");
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM sinkb"), 3);
    ASSERT_EQ(plain_pending(&e, plain), 3);
    ASSERT_EQ(cenv_stream_msgs(&e, e.stream), 3);

    /* A second replay of the same dead letter applies nothing. */
    rc = dlq(&e, args);
    if (rc != 0)
        fail_msg("dlq replay exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "was applied already by durable");
    rc = consume_a(&e);
    if (rc != 0)
        fail_msg("consume A exited %d: %s", rc, out);
    ASSERT_NOT_CONTAINS(out, "replays (dlq replay --store)");
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM sinka"), 3);
    ASSERT_EQ(status(&e), 0);
    ASSERT_CONTAINS(out, "replays pending  0");
    ASSERT_CONTAINS(out, "replays failed   0");

    /* The store of another durable is refused with the durable's name. */
    cenv other;
    cenv_up(&other, pg);
    snprintf(args, sizeof(args), "replay --store '%s' 1", other.store_url);
    ASSERT_EQ(dlq(&e, args), 78);
    snprintf(want, sizeof(want), "was parked by durable \"%s\"", e.durable);
    ASSERT_CONTAINS(out, want);
    cenv_down(&other);
    ASSERT_EQ(cenv_stream_msgs(&e, e.stream), 3);
    cenv_down(&e);
}

/* ---- a crash on either side of the replay's COMMIT ------------------------------------- */

/* killed by SIGKILL (directly, or as seen through the shell) */
#define KILLED(rc) ((rc) == -1 || (rc) == 137)

static void replay_crash_points(bool pg)
{
    static const char *points[] = {"replay.before_commit", "replay.after_commit"};
    for (size_t i = 0; i < 2; i++) {
        cenv e;
        cenv_up(&e, pg);
        cenv_store_exec(e.store, "CREATE TABLE keys(id TEXT PRIMARY KEY, k BIGINT NOT NULL)");
        cenv_store_exec(e.store, "CREATE TABLE sinka(id TEXT, k BIGINT NOT NULL, seq BIGINT, "
                                 "dlv BIGINT)");
        cenv_publish(&e, 1, 1, NULL);
        int rc = consume_a(&e);
        if (rc != 1)
            fail_msg("consume A exited %d: %s", rc, out);
        cenv_store_exec(e.store, "INSERT INTO keys(id, k) VALUES ('id-1', 1)");
        char args[1024], env[128];
        snprintf(args, sizeof(args), "replay --store '%s' 1", e.store_url);
        ASSERT_EQ(dlq(&e, args), 0);
        snprintf(env, sizeof(env), "JSD_CRASH_AT=%s:1", points[i]);
        rc = consume_a_env(&e, env);
        if (!KILLED(rc))
            fail_msg("%s: consume should have been killed, exited %d: %s", points[i], rc, out);
        ASSERT_CONTAINS(out, points[i]);
        bool committed = i == 1;
        ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM sinka"), committed ? 1 : 0);
        ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM jsd_replay WHERE state = 0"), committed ? 0 : 1);
        /* The next consume applies it (before the COMMIT) or finds nothing
         * to do (after it); a replay asked again applies nothing. */
        rc = consume_a(&e);
        if (rc != 0)
            fail_msg("%s: consume A exited %d: %s", points[i], rc, out);
        ASSERT_EQ(dlq(&e, args), 0);
        rc = consume_a(&e);
        if (rc != 0)
            fail_msg("%s: consume A exited %d: %s", points[i], rc, out);
        ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM sinka"), 1);
        ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM jsd_replay WHERE state = 1"), 1);
        ASSERT_EQ(cenv_stream_msgs(&e, e.stream), 1);
        cenv_down(&e);
    }
}

/* ---- the library: a running consumer picks the request up ---------------------------- */

typedef struct seen {
    int calls, replays;
    bool fail_id2;
    char replay_of[128];
    uint64_t deliveries;
} seen;

static jsd_disposition handler(jsd_tx *tx, const jsd_delivery *d, void *user)
{
    seen *s = user;
    s->calls++;
    const char *r = jsd_delivery_header(d, JSD_HDR_REPLAY_OF);
    if (r) {
        s->replays++;
        snprintf(s->replay_of, sizeof(s->replay_of), "%s", r);
        s->deliveries = jsd_delivery_deliveries(d);
        if (jsd_delivery_progress(d) != JSD_OK)
            return jsd_disposition_retry(0, "progress failed on a replay");
    }
    if (s->fail_id2 && !strcmp(jsd_delivery_msg_id(d), "id-2"))
        return jsd_disposition_retry(0, "refused id-2");
    char sql[256];
    snprintf(sql, sizeof(sql), "INSERT INTO applied(id) VALUES ('%s')", jsd_delivery_msg_id(d));
    return cenv_tx_exec(tx, sql) ? jsd_disposition_commit()
                                 : jsd_disposition_retry(0, "insert failed");
}

static void running_consumer(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    cenv_store_exec(e.store, "CREATE TABLE applied(id TEXT)");
    cenv_durable(&e, 2000, 2, 64, NULL, 0); /* parked after one failed attempt */
    seen s = {.fail_id2 = true};
    jsd_consumer *c = cenv_consumer(&e, NULL);
    cenv_publish(&e, 1, 3, NULL);
    jsd_consumer_stats st;
    CENV_POLL_UNTIL(jsd_consumer_poll, c, handler, &s,
                    (jsd_consumer_stats_get(c, &st), st.parked == 1 && st.committed == 2), 10000);
    ASSERT_EQ(cenv_stream_msgs(&e, e.dlq_stream), 1);

    jsd_replay_request req;
    bool queued = false;
    jsd_error err;
    jsd_error_clear(&err);
    s.fail_id2 = false;
    ASSERT_OK(jsd_dlq_replay_request(e.conn, e.dlq_stream, 1, e.store, &req, &queued, &err),
              err.msg);
    ASSERT_TRUE(queued);
    ASSERT_STREQ(req.consumer, e.durable);
    ASSERT_U64_EQ(req.stream_seq, 2);
    ASSERT_EQ(req.state, JSD_REPLAY_PENDING);
    /* Asked twice: one request. */
    ASSERT_OK(jsd_dlq_replay_request(e.conn, e.dlq_stream, 1, e.store, &req, &queued, &err),
              err.msg);
    ASSERT_TRUE(!queued);
    CENV_POLL_UNTIL(jsd_consumer_poll, c, handler, &s,
                    (jsd_consumer_stats_get(c, &st), st.replays_applied == 1), 5000);
    ASSERT_EQ(s.replays, 1);
    char want[128];
    snprintf(want, sizeof(want), "%s:1", e.dlq_stream);
    ASSERT_STREQ(s.replay_of, want);
    ASSERT_U64_EQ(s.deliveries, 0);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM applied WHERE id = 'id-2'"), 1);
    /* applied: asked again, nothing is queued and nothing runs */
    ASSERT_OK(jsd_dlq_replay_request(e.conn, e.dlq_stream, 1, e.store, &req, &queued, &err),
              err.msg);
    ASSERT_TRUE(!queued);
    ASSERT_EQ(req.state, JSD_REPLAY_APPLIED);
    jsd_replay_request open[4];
    size_t n = 9;
    ASSERT_OK(jsd_dlq_replay_list(e.store, 0, open, 4, &n, &err), err.msg);
    ASSERT_SIZE_EQ(n, 0);
    int calls = s.calls;
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(jsd_consumer_poll(c, handler, &s, NULL), JSD_OK);
    ASSERT_EQ(s.calls, calls);
    ASSERT_EQ(cenv_stream_msgs(&e, e.stream), 3);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* A replay meets the durable's envelope rules as a delivery does: a poison
 * message whose type is still refused fails the request with that reason
 * (listed by jsd_dlq_replay_list), and the handler never sees it. */
static void envelope_still_refused(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    cenv_store_exec(e.store, "CREATE TABLE applied(id TEXT)");
    static const char *const types[] = {"t.ok"};
    jsd_consumer_opts o;
    jsd_consumer_opts_init(&o);
    o.accept_types = types;
    o.n_accept_types = 1;
    cenv_durable(&e, 2000, 2, 64, NULL, 0);
    jsd_consumer *c = cenv_consumer(&e, &o);
    seen s = {0};
    cenv_publish_raw(&e, "x", "{}", 2, "t.bad", "bad-1");
    jsd_consumer_stats st;
    CENV_POLL_UNTIL(jsd_consumer_poll, c, handler, &s,
                    (jsd_consumer_stats_get(c, &st), st.poisoned == 1), 10000);
    ASSERT_EQ(cenv_stream_msgs(&e, e.dlq_stream), 1);
    jsd_replay_request req;
    bool queued = false;
    jsd_error err;
    jsd_error_clear(&err);
    ASSERT_OK(jsd_dlq_replay_request(e.conn, e.dlq_stream, 1, e.store, &req, &queued, &err),
              err.msg);
    ASSERT_TRUE(queued);
    CENV_POLL_UNTIL(jsd_consumer_poll, c, handler, &s,
                    (jsd_consumer_stats_get(c, &st), st.replays_failed == 1), 5000);
    ASSERT_EQ(s.calls, 0);
    jsd_replay_request open[4];
    size_t n = 0;
    ASSERT_OK(jsd_dlq_replay_list(e.store, 0, open, 4, &n, &err), err.msg);
    ASSERT_SIZE_EQ(n, 1);
    ASSERT_EQ(open[0].state, JSD_REPLAY_FAILED);
    ASSERT_STREQ(open[0].consumer, e.durable);
    ASSERT_CONTAINS(open[0].detail, "its envelope is still refused");
    ASSERT_CONTAINS(open[0].detail, "t.bad");
    jsd_store_stats x;
    ASSERT_OK(jsd_store_stats_get(e.store, &x));
    ASSERT_I64_EQ(x.replay_failed, 1);
    ASSERT_I64_EQ(x.replay_pending, 0);
    /* Not tried again on its own. */
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(jsd_consumer_poll(c, handler, &s, NULL), JSD_OK);
    jsd_consumer_stats_get(c, &st);
    ASSERT_U64_EQ(st.replays_failed, 1);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM applied"), 0);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* PostgreSQL: a replay whose writes the store refuses at COMMIT (a
 * deferred constraint) fails once with that reason, not retried for ever. */
static jsd_disposition deferred_handler(jsd_tx *tx, const jsd_delivery *d, void *user)
{
    seen *s = user;
    s->calls++;
    if (!jsd_delivery_header(d, JSD_HDR_REPLAY_OF))
        return jsd_disposition_retry(0, "refused until replayed");
    /* x = 1 is taken: the deferred UNIQUE refuses it at COMMIT only. */
    return cenv_tx_exec(tx, "INSERT INTO uniq(x) VALUES (1)") ? jsd_disposition_commit()
                                                              : jsd_disposition_retry(0, "insert");
}

static void commit_refused_pg(void **state)
{
    (void)state;
    cenv e;
    cenv_up(&e, true);
    cenv_store_exec(e.store, "CREATE TABLE uniq(x INT UNIQUE DEFERRABLE INITIALLY DEFERRED)");
    cenv_store_exec(e.store, "INSERT INTO uniq(x) VALUES (1)");
    cenv_durable(&e, 2000, 2, 64, NULL, 0);
    jsd_consumer *c = cenv_consumer(&e, NULL);
    seen s = {0};
    cenv_publish(&e, 1, 1, NULL);
    jsd_consumer_stats st;
    CENV_POLL_UNTIL(jsd_consumer_poll, c, deferred_handler, &s,
                    (jsd_consumer_stats_get(c, &st), st.parked == 1), 10000);
    jsd_replay_request req;
    bool queued = false;
    jsd_error err;
    jsd_error_clear(&err);
    ASSERT_OK(jsd_dlq_replay_request(e.conn, e.dlq_stream, 1, e.store, &req, &queued, &err),
              err.msg);
    CENV_POLL_UNTIL(jsd_consumer_poll, c, deferred_handler, &s,
                    (jsd_consumer_stats_get(c, &st), st.replays_failed == 1), 5000);
    jsd_replay_request open[2];
    size_t n = 0;
    ASSERT_OK(jsd_dlq_replay_list(e.store, 0, open, 2, &n, &err), err.msg);
    ASSERT_SIZE_EQ(n, 1);
    ASSERT_EQ(open[0].state, JSD_REPLAY_FAILED);
    ASSERT_CONTAINS(open[0].detail, "commit refused");
    int calls = s.calls;
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(jsd_consumer_poll(c, deferred_handler, &s, NULL), JSD_OK);
    ASSERT_EQ(s.calls, calls);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM uniq"), 1);
    char sql[256];
    snprintf(sql, sizeof(sql), "SELECT outcome FROM jsd_inbox WHERE consumer = '%s'", e.durable);
    ASSERT_EQ(cenv_store_scalar(e.store, sql), 3); /* still parked */
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

BOTH(only_the_parking_durable)
BOTH(running_consumer)
BOTH(replay_crash_points)
BOTH(envelope_still_refused)

#define T(fn) cmocka_unit_test(fn##_sqlite), cmocka_unit_test(fn##_pg)

JSD_TEST_MAIN(T(only_the_parking_durable), T(running_consumer), T(replay_crash_points),
              T(envelope_still_refused), cmocka_unit_test(commit_refused_pg))
