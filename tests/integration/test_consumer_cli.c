/*
 * `jsdurable consume` and `jsdurable dlq` as processes, against a real
 * nats-server and both store back ends: the SQL sink binds its named
 * parameters (hostile payloads stay data), a crash right after COMMIT
 * (JSD_CRASH_AT=ingress.after_commit) is answered by the inbox on redelivery
 * with one effect per message, a crash at each poison step still leaves
 * exactly one death envelope, the dead-letter stream is required, and dead
 * letters can be listed, shown, republished (--republish; the replay to the
 * parking durable is test_dlq_replay.c) and purged (FIX-3, IN-2, DLQ-1..3).
 */
#include "consumer_env.h"

static char out[65536];

/* killed by SIGKILL (directly, or as seen through the shell) */
#define KILLED(rc) ((rc) == -1 || (rc) == 137)

static int consume(cenv *e, const char *env_prefix, const char *extra)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "%s %s consume --store '%s' --nats %s --stream %s --durable %s --ack-wait 1s "
             "--until-idle --sql 'INSERT INTO sink(subject, body, msg_id, seq, dlv) VALUES "
             "(:subject, :payload, :msg_id, :stream_seq, :deliveries)' %s",
             env_prefix ? env_prefix : "", jsd_fx_bin("jsdurable"), e->store_url,
             jsd_fx_shared_nats_url(), e->stream, e->durable, extra ? extra : "");
    return jsd_test_run(cmd, out, sizeof(out));
}

static int dlq(cenv *e, const char *args)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "%s dlq %s --nats %s --stream %s", jsd_fx_bin("jsdurable"), args,
             jsd_fx_shared_nats_url(), e->dlq_stream);
    return jsd_test_run(cmd, out, sizeof(out));
}

static void sink_table(cenv *e)
{
    cenv_store_exec(e->store, "CREATE TABLE sink(subject TEXT, body TEXT, msg_id TEXT, seq BIGINT, "
                              "dlv BIGINT)");
}

static long long rows(cenv *e)
{
    return cenv_store_scalar(e->store, "SELECT COUNT(*) FROM sink");
}

/* ---- parameters are bound, never spliced ------------------------------------------------ */
static void binds_parameters(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    sink_table(&e);
    static const char evil[] = "it's'); DROP TABLE sink; -- :subject $1 ?";
    cenv_publish_raw(&e, "x", evil, (int)sizeof(evil) - 1, NULL, "evil-1");
    cenv_publish(&e, 1, 20, NULL);
    int rc = consume(&e, NULL, NULL);
    if (rc != 0)
        fail_msg("consume exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "created durable");
    ASSERT_CONTAINS(out, "21 committed");
    ASSERT_EQ(rows(&e), 21);
    char sql[512];
    snprintf(sql, sizeof(sql),
             "SELECT COUNT(*) FROM sink WHERE CAST(body AS TEXT) = 'it''s''); DROP TABLE sink; -- "
             ":subject $1 ?' "
             "AND msg_id = 'evil-1' AND seq = 1 AND dlv = 1 AND subject = '%s.x'",
             e.prefix);
    ASSERT_EQ(cenv_store_scalar(e.store, sql), 1);
    ASSERT_TRUE(cenv_settled(&e));
    /* Running again finds nothing to do. */
    rc = consume(&e, NULL, NULL);
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(rows(&e), 21);
    /* --write-each (each ACK written at once): the same outcome */
    cenv_publish(&e, 100, 5, NULL);
    rc = consume(&e, NULL, "--write-each");
    if (rc != 0)
        fail_msg("consume --write-each exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "5 committed");
    ASSERT_EQ(rows(&e), 26);
    ASSERT_TRUE(cenv_settled(&e));
    cenv_down(&e);
}

/* ---- W3C trace context: enqueue -> relay -> stream -> consume --sql, byte for byte ------ */
static void trace_context(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    cenv_store_exec(e.store, "CREATE TABLE tsink(tp TEXT, ts TEXT, seq BIGINT)");
    static const char tp[] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    static const char ts[] = "congo=t61rcWkgMzE, rojo=00f067aa0ba902b7,vendor@x=a b";
    const char *J = jsd_fx_bin("jsdurable");
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "echo '{}' | %s enqueue --store '%s' --subject %s.traced --id t1 --traceparent %s "
             "--tracestate '%s' && echo '{}' | %s enqueue --store '%s' --subject %s.plain --id p1",
             J, e.store_url, e.prefix, tp, ts, J, e.store_url, e.prefix);
    int rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 0)
        fail_msg("enqueue exited %d: %s", rc, out);
    /* a malformed one is refused with the rule and commits nothing */
    snprintf(cmd, sizeof(cmd),
             "echo '{}' | %s enqueue --store '%s' --subject %s.bad --id b1 --traceparent "
             "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
             J, e.store_url, e.prefix);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 65);
    ASSERT_CONTAINS(out, "is not W3C trace context");
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM jsd_outbox_state"), 2);
    snprintf(cmd, sizeof(cmd), "%s relay --store '%s' --nats %s --until-idle", J, e.store_url,
             jsd_fx_shared_nats_url());
    if ((rc = jsd_test_run(cmd, out, sizeof(out))) != 0)
        fail_msg("relay exited %d: %s", rc, out);
    snprintf(cmd, sizeof(cmd),
             "%s consume --store '%s' --nats %s --stream %s --durable %s --until-idle --sql "
             "'INSERT INTO tsink(tp, ts, seq) VALUES (:traceparent, :tracestate, :stream_seq)'",
             J, e.store_url, jsd_fx_shared_nats_url(), e.stream, e.durable);
    if ((rc = jsd_test_run(cmd, out, sizeof(out))) != 0)
        fail_msg("consume exited %d: %s", rc, out);
    char sql[512];
    snprintf(sql, sizeof(sql), "SELECT COUNT(*) FROM tsink WHERE tp = '%s' AND ts = '%s'", tp, ts);
    ASSERT_EQ(cenv_store_scalar(e.store, sql), 1);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM tsink WHERE tp IS NULL AND ts IS "
                                         "NULL"),
              1);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM tsink"), 2);
    /* and the inbox row keeps it */
    snprintf(sql, sizeof(sql),
             "SELECT COUNT(*) FROM jsd_inbox WHERE traceparent = '%s' AND tracestate = '%s'", tp,
             ts);
    ASSERT_EQ(cenv_store_scalar(e.store, sql), 1);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM jsd_inbox WHERE traceparent IS "
                                         "NULL"),
              1);
    cenv_down(&e);
}

/* ---- --filter: a created durable sees only its subjects -------------------------------- */
static void filter_subject(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    sink_table(&e);
    cenv_publish_raw(&e, "a", "one", 3, NULL, "fa-1");
    cenv_publish_raw(&e, "b", "two", 3, NULL, "fb-1");
    cenv_publish_raw(&e, "a", "three", 5, NULL, "fa-2");
    char extra[200];
    snprintf(extra, sizeof(extra), "--filter %s.a", e.prefix);
    int rc = consume(&e, NULL, extra);
    if (rc != 0)
        fail_msg("consume exited %d: %s", rc, out);
    ASSERT_EQ(rows(&e), 2);
    char sql[256];
    snprintf(sql, sizeof(sql), "SELECT COUNT(*) FROM sink WHERE subject = '%s.a'", e.prefix);
    ASSERT_EQ(cenv_store_scalar(e.store, sql), 2);
    jsConsumerInfo *ci = cenv_info(&e);
    ASSERT_TRUE(ci && ci->Config->FilterSubject);
    ASSERT_STREQ(ci->Config->FilterSubject, extra + 9);
    jsConsumerInfo_Destroy(ci);
    /* The same durable asked for with another filter: refused, not ignored. */
    snprintf(extra, sizeof(extra), "--filter %s.b", e.prefix);
    ASSERT_EQ(consume(&e, NULL, extra), 78);
    ASSERT_CONTAINS(out, "exists with filter");
    cenv_down(&e);
}

/* ---- crash after COMMIT, before ACK ------------------------------------------------------- */
static void crash_after_commit(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    sink_table(&e);
    cenv_publish(&e, 1, 500, NULL);
    int rc = consume(&e, "JSD_CRASH_AT=ingress.after_commit:2", "--batch 100");
    if (!KILLED(rc))
        fail_msg("consume should have been killed at the crash point, exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "crash point ingress.after_commit");
    /* Two batches committed; the second was never ACKed. */
    ASSERT_EQ(rows(&e), 200);
    rc = consume(&e, NULL, "--batch 100");
    if (rc != 0)
        fail_msg("consume exited %d: %s", rc, out);
    /* Answered by the inbox: the second batch, and those of the first
     * whose ACKs had not left the connection's write buffer when the kill
     * came (consume coalesces its writes for about 1 ms, and nats.c's
     * flusher may send part of a batch's ACKs while the rest are still
     * being queued): 100 to 200. */
    const char *d = strstr(out, " committed, ");
    long dups = d ? strtol(d + strlen(" committed, "), NULL, 10) : -1;
    if (dups < 100 || dups > 200)
        fail_msg("want 100 to 200 duplicates (the unacknowledged ACKs): %s", out);
    ASSERT_EQ(rows(&e), 500);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(DISTINCT seq) FROM sink"), 500);
    ASSERT_TRUE(cenv_settled(&e));
    cenv_down(&e);
}

/* ---- crash after ACK: nothing is redone ---------------------------------------------------- */
static void crash_after_ack(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    sink_table(&e);
    cenv_publish(&e, 1, 50, NULL);
    int rc = consume(&e, "JSD_CRASH_AT=ingress.after_ack:1", "--batch 20");
    ASSERT_TRUE(KILLED(rc));
    ASSERT_EQ(rows(&e), 20);
    rc = consume(&e, NULL, "--batch 20");
    if (rc != 0)
        fail_msg("consume exited %d: %s", rc, out);
    /* The ACKs were sent, not necessarily confirmed, when the process died: a
     * few may be redelivered, and the inbox answers them. Nothing is applied
     * twice. */
    ASSERT_CONTAINS(out, "30 committed");
    ASSERT_EQ(rows(&e), 50);
    cenv_down(&e);
}

/* ---- a crash at each poison step leaves exactly one death envelope ------------------------ */
static void poison_crash_points(bool pg)
{
    static const char *points[] = {"poison.after_store_commit", "poison.after_dlq_publish"};
    for (size_t i = 0; i < 2; i++) {
        cenv e;
        char env[128];
        cenv_up(&e, pg);
        sink_table(&e);
        cenv_publish(&e, 1, 3, "t.ok");
        cenv_publish_raw(&e, "bad", "not-for-us", 10, "t.unknown", "bad-1");
        snprintf(env, sizeof(env), "JSD_CRASH_AT=%s:1", points[i]);
        int rc = consume(&e, env, "--accept-type t.ok");
        if (!KILLED(rc))
            fail_msg("%s: consume should have been killed, exited %d: %s", points[i], rc, out);
        ASSERT_CONTAINS(out, points[i]);
        ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM jsd_poison"), 1);
        rc = consume(&e, NULL, "--accept-type t.ok");
        if (rc != 1) /* it dead-lettered */
            fail_msg("%s: consume exited %d: %s", points[i], rc, out);
        ASSERT_CONTAINS(out, "1 poisoned");
        ASSERT_EQ(cenv_stream_msgs(&e, e.dlq_stream), 1); /* one death envelope */
        ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM jsd_poison"), 1);
        ASSERT_EQ(rows(&e), 3);
        ASSERT_TRUE(cenv_settled(&e)); /* TERMed */
        cenv_down(&e);
    }
}

/* ---- refusals --------------------------------------------------------------------------- */
static void refusals(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    sink_table(&e);
    /* No stream captures the dead-letter subject. */
    int rc = consume(&e, NULL, "--dlq-subject nowhere.at.all");
    ASSERT_EQ(rc, 78);
    ASSERT_CONTAINS(out, "no stream captures the dead-letter subject \"nowhere.at.all\"");
    /* ...and refused before the durable is created. */
    jsConsumerInfo *ci = cenv_info(&e);
    if (ci)
        fail_msg("durable %s was created although the configuration was refused", e.durable);
    /* An unknown named parameter. */
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "%s consume --store '%s' --nats %s --stream %s --durable %s --until-idle "
             "--sql 'INSERT INTO sink(body) VALUES (:nope)'",
             jsd_fx_bin("jsdurable"), e.store_url, jsd_fx_shared_nats_url(), e.stream, e.durable);
    rc = jsd_test_run(cmd, out, sizeof(out));
    ASSERT_EQ(rc, 64);
    ASSERT_CONTAINS(out, "unknown parameter :nope");
    /* A statement that does not prepare is refused before anything is consumed. */
    snprintf(cmd, sizeof(cmd),
             "%s consume --store '%s' --nats %s --stream %s --durable %s --until-idle "
             "--sql 'INSERT INTO missing_table(body) VALUES (:payload)'",
             jsd_fx_bin("jsdurable"), e.store_url, jsd_fx_shared_nats_url(), e.stream, e.durable);
    rc = jsd_test_run(cmd, out, sizeof(out));
    ASSERT_EQ(rc, 64);
    ASSERT_CONTAINS(out, "missing_table");
    /* Limits of the flags, crossed. */
    ASSERT_EQ(consume(&e, NULL, "--batch 4097"), 64);
    ASSERT_CONTAINS(out, "--batch takes 1..4096");
    ASSERT_EQ(consume(&e, NULL, "--max-deliver 0"), 64);
    ASSERT_EQ(consume(&e, NULL, "--payload xml"), 64);
    /* A too-short inbox retention. */
    rc = consume(&e, NULL, "--inbox-retention 1s");
    ASSERT_EQ(rc, 78);
    ASSERT_CONTAINS(out, "inbox retention 1000 ms is shorter");
    cenv_down(&e);
}

/* ---- the ack wait asked for is the ack wait in force ------------------------------------- */
static void ack_wait_in_force(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    sink_table(&e);
    cenv_publish(&e, 1, 3, NULL);
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "%s consume --store '%s' --nats %s --stream %s --durable %s --ack-wait 5s "
             "--until-idle --sql 'INSERT INTO sink(body) VALUES (:payload)'",
             jsd_fx_bin("jsdurable"), e.store_url, jsd_fx_shared_nats_url(), e.stream, e.durable);
    int rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 0)
        fail_msg("consume exited %d: %s", rc, out);
    ASSERT_EQ(rows(&e), 3);
    /* The server waits what was asked for: no backoff list replaced it. */
    jsConsumerInfo *ci = cenv_info(&e);
    ASSERT_TRUE(ci != NULL);
    ASSERT_EQ(ci->Config->AckWait / 1000000, 5000);
    ASSERT_EQ(ci->Config->BackOffLen, 0);
    jsConsumerInfo_Destroy(ci);
    cenv_down(&e);
}

/* ---- dlq list / show / replay / purge ------------------------------------------------------ */
static void dlq_tools(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    sink_table(&e);
    cenv_publish_raw(&e, "bad", "{\"x\":", 5, "t.ok", "bad-1");
    int rc = consume(&e, NULL, "--accept-type t.ok --payload json");
    if (rc != 1) /* --until-idle after a dead letter */
        fail_msg("consume exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "(msg id \"bad-1\", delivery 1) is poison, dead-lettered: ");
    ASSERT_CONTAINS(out, "this run dead-lettered 1 messages (1 poisoned, 0 parked)");
    ASSERT_EQ(cenv_stream_msgs(&e, e.dlq_stream), 1);
    ASSERT_EQ(dlq(&e, "list"), 0);
    ASSERT_CONTAINS(out, "poison");
    ASSERT_CONTAINS(out, "malformed JSON");
    ASSERT_EQ(dlq(&e, "show 1"), 0);
    ASSERT_CONTAINS(out, "msg_id: bad-1");
    ASSERT_CONTAINS(out, "\n\n{\"x\":"); /* the verbatim payload */
    ASSERT_EQ(dlq(&e, "show 99"), 65);
    /* Replay needs --store (test_dlq_replay.c) or an explicit --republish. */
    ASSERT_EQ(dlq(&e, "replay 1"), 64);
    ASSERT_CONTAINS(out, "--republish");
    ASSERT_EQ(cenv_stream_msgs(&e, e.stream), 1);
    /* --republish: back to its subject, new id, Jsd-Replay-Of; twice is
     * stored once. */
    ASSERT_EQ(dlq(&e, "replay --republish 1"), 0);
    ASSERT_CONTAINS(out, "every consumer of the subject receives it");
    ASSERT_EQ(dlq(&e, "replay --republish 1"), 0);
    ASSERT_EQ(cenv_stream_msgs(&e, e.stream), 2);
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    ASSERT_EQ(js_GetMsg(&m, e.js, e.stream, 2, NULL, &jerr), NATS_OK);
    const char *v = NULL;
    ASSERT_EQ(natsMsgHeader_Get(m, "Jsd-Replay-Of", &v), NATS_OK);
    char want[128];
    snprintf(want, sizeof(want), "%s:1", e.dlq_stream);
    ASSERT_STREQ(v, want);
    ASSERT_EQ(natsMsgHeader_Get(m, "Jsd-Type", &v), NATS_OK);
    ASSERT_STREQ(v, "t.ok");
    ASSERT_EQ(natsMsg_GetDataLength(m), 5);
    char subj[128];
    snprintf(subj, sizeof(subj), "%s.bad", e.prefix);
    ASSERT_STREQ(natsMsg_GetSubject(m), subj);
    ASSERT_EQ(natsMsgHeader_Get(m, "Nats-Msg-Id", &v), NATS_OK);
    ASSERT_TRUE(strcmp(v, "bad-1") != 0);
    natsMsg_Destroy(m);
    ASSERT_EQ(dlq(&e, "purge --all"), 0);
    ASSERT_EQ(cenv_stream_msgs(&e, e.dlq_stream), 0);
    ASSERT_EQ(dlq(&e, "replay"), 64); /* needs SEQ or --all */
    cenv_down(&e);
}

BOTH(binds_parameters)
BOTH(filter_subject)
BOTH(crash_after_commit)
BOTH(crash_after_ack)
BOTH(poison_crash_points)
BOTH(refusals)
BOTH(ack_wait_in_force)
BOTH(dlq_tools)
BOTH(trace_context)

#define T(fn) cmocka_unit_test(fn##_sqlite), cmocka_unit_test(fn##_pg)

JSD_TEST_MAIN(T(binds_parameters), T(filter_subject), T(crash_after_commit), T(crash_after_ack),
              T(poison_crash_points), T(refusals), T(ack_wait_in_force), T(dlq_tools),
              T(trace_context))
