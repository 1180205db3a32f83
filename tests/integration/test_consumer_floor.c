/*
 * A lost durable resumes after its recorded acknowledged floor, not after
 * its inbox's high-water mark (issue 42), against the run's real
 * nats-server and both store back ends.
 *
 *   retry_pending_when_lost: one running `consume --topology --sql` whose
 *       statement fails for message 2 while a switch is on (its key is
 *       missing: the NOT NULL column refuses the row), so 2 is NAKed and
 *       retried while 3..5 are applied. Once the running consumer has
 *       recorded the ack floor 1, the durable is deleted with the
 *       JetStream API and the switch turned off: the consumer re-creates
 *       it at 2 (the log says after which floor, recorded when), 2 is
 *       applied once, 3..5 are answered from the inbox (3 duplicates, the
 *       sink holds each once) and the stream is unchanged. Before the fix
 *       it was re-created at 6, after the high-water mark, and message 2
 *       was never applied.
 *   gc_floor_not_applied_again: 10 applied; the floor recorded in the store
 *       lags the server's (5, as a consumer killed before its next record
 *       leaves it); gc removes the inbox rows at or below the server's
 *       floor 10 (all but the highest) and records 10 first; the durable
 *       deleted, 2 more published, `consume --topology` re-creates it at
 *       11: none of the rows gc removed is applied again. Recorded by gc
 *       after it removed rows, or not at all, the durable came back at 6
 *       and applied 6..9 twice.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include "consumer_env.h"

#define SINK_SQL                                                                                   \
    "INSERT INTO sink(seq, k) VALUES (:stream_seq, (SELECT k FROM keys WHERE id = :msg_id))"

static char out[65536];

static void tables(cenv *e)
{
    cenv_store_exec(e->store, "CREATE TABLE keys(id TEXT PRIMARY KEY, k BIGINT NOT NULL)");
    cenv_store_exec(e->store, "CREATE TABLE sink(seq BIGINT, k BIGINT NOT NULL)");
}

static void key(cenv *e, int i)
{
    char sql[128];
    snprintf(sql, sizeof(sql), "INSERT INTO keys(id, k) VALUES ('id-%d', %d)", i, i);
    cenv_store_exec(e->store, sql);
}

static long long sink_rows(cenv *e)
{
    return cenv_store_scalar(e->store, "SELECT COUNT(*) FROM sink");
}

/* The floor recorded in the store for e's durable (0: none). */
static long long recorded_floor(cenv *e)
{
    char sql[300];
    snprintf(sql, sizeof(sql),
             "SELECT COALESCE(MAX(ack_floor), 0) FROM jsd_durable_floor WHERE stream = '%s' AND "
             "consumer = '%s'",
             e->stream, e->durable);
    return cenv_store_scalar(e->store, sql);
}

static uint64_t server_floor(cenv *e)
{
    jsConsumerInfo *ci = cenv_info(e);
    uint64_t f = ci ? ci->AckFloor.Stream : 0;
    jsConsumerInfo_Destroy(ci);
    return f;
}

/* A topology declaring e's stream and durable: max_deliver 100, so a
 * retried message is not parked while the test runs. */
static const char *topology_file(cenv *e)
{
    static char path[1024];
    snprintf(path, sizeof(path), "%s/topology-%s.json", jsd_test_dir(), e->durable);
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fprintf(f,
            "{\"streams\": [{\"name\": \"%s\", \"subjects\": [\"%s.>\"]}],\n"
            " \"consumers\": [{\"stream\": \"%s\", \"durable\": \"%s\", \"ack_wait\": \"5s\", "
            "\"max_deliver\": 100, \"max_ack_pending\": 64}]}\n",
            e->stream, e->prefix, e->stream, e->durable);
    fclose(f);
    return path;
}

static void delete_durable(cenv *e)
{
    jsErrCode jerr = 0;
    ASSERT_EQ(js_DeleteConsumer(e->js, e->stream, e->durable, NULL, &jerr), NATS_OK);
}

static void check_start(cenv *e, uint64_t at)
{
    jsConsumerInfo *ci = cenv_info(e);
    ASSERT_TRUE(ci != NULL && ci->Config != NULL);
    ASSERT_EQ(ci->Config->DeliverPolicy, js_DeliverByStartSequence);
    ASSERT_U64_EQ(ci->Config->OptStartSeq, at);
    jsConsumerInfo_Destroy(ci);
}

static pid_t spawn_consume(const cenv *e, const char *topology, const char *log)
{
    const char *argv[] = {jsd_fx_bin("jsdurable"),
                          "consume",
                          "--store",
                          e->store_url,
                          "--nats",
                          jsd_fx_shared_nats_url(),
                          "--stream",
                          e->stream,
                          "--durable",
                          e->durable,
                          "--log-level",
                          "info",
                          "--topology",
                          topology,
                          "--sql",
                          SINK_SQL,
                          NULL};
    return jsd_test_spawn(argv, log, true, NULL);
}

/* ---- a retry pending when the durable is lost ---------------------------------------- */

static void retry_pending_when_lost(bool pg)
{
    cenv e;
    char log[1200];
    cenv_up(&e, pg);
    tables(&e);
    for (int i = 1; i <= 5; i++)
        if (i != 2) /* the switch: message 2's key is missing, its statement fails */
            key(&e, i);
    snprintf(log, sizeof(log), "%s/consume-floor-%s.log", jsd_test_dir(), pg ? "pg" : "sq");
    pid_t pid = spawn_consume(&e, topology_file(&e), log);
    ASSERT_WAIT(jsd_test_file_contains(log, "bound to durable"), 20000);
    cenv_publish(&e, 1, 5, NULL);
    ASSERT_WAIT(sink_rows(&e) == 4, 20000);
    ASSERT_WAIT(jsd_test_file_contains(log, "sequence 2 (msg id \"id-2\""), 20000);
    ASSERT_TRUE(jsd_test_file_contains(log, "retried in"));
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM sink WHERE seq = 2"), 0);
    ASSERT_U64_EQ(server_floor(&e), 1);
    /* the running consumer records the floor (every 10 s) */
    ASSERT_WAIT(recorded_floor(&e) == 1, 25000);

    delete_durable(&e);
    key(&e, 2); /* the switch off */
    ASSERT_WAIT(jsd_test_file_contains(log, "does not exist on stream"), 15000);
    ASSERT_WAIT(jsd_test_file_contains(log, "re-created from the topology at stream sequence 2, "
                                            "after its acknowledged floor 1 recorded at "),
                15000);
    check_start(&e, 2);
    ASSERT_WAIT(sink_rows(&e) == 5, 20000);
    ASSERT_WAIT(cenv_settled(&e), 15000);
    cenv_stop_consume(pid, log, out, sizeof(out));
    ASSERT_CONTAINS(out, "5 committed, 3 duplicates");
    cenv_sink_seqs_once(&e, 5);
    ASSERT_EQ(cenv_stream_msgs(&e, e.stream), 5);
    /* the clean stop recorded the new durable's floor */
    ASSERT_EQ(recorded_floor(&e), 5);
    cenv_down(&e);
}
BOTH(retry_pending_when_lost)

/* ---- gc, then the durable lost -------------------------------------------------------- */

static int consume_idle(cenv *e, const char *extra)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "%s consume --store '%s' --nats %s --stream %s --durable %s --until-idle "
             "--sql '" SINK_SQL "' %s",
             jsd_fx_bin("jsdurable"), e->store_url, jsd_fx_shared_nats_url(), e->stream, e->durable,
             extra ? extra : "");
    return jsd_test_run(cmd, out, sizeof(out));
}

static void gc_floor_not_applied_again(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    tables(&e);
    for (int i = 1; i <= 12; i++)
        key(&e, i);
    cenv_publish(&e, 1, 10, NULL);
    char extra[1200];
    snprintf(extra, sizeof(extra), "--topology %s", topology_file(&e));
    int rc = consume_idle(&e, extra);
    if (rc != 0)
        fail_msg("first consume exited %d: %s", rc, out);
    cenv_sink_seqs_once(&e, 10);
    ASSERT_TRUE(cenv_settled(&e));
    ASSERT_U64_EQ(server_floor(&e), 10);
    ASSERT_EQ(recorded_floor(&e), 10);
    /* the record lags the server (a consumer killed before its next
     * record), and every inbox row is past the horizon */
    cenv_store_exec(e.store, "UPDATE jsd_durable_floor SET ack_floor = 5");
    cenv_store_exec(e.store, "UPDATE jsd_inbox SET created_at = created_at - 2592000000");

    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "%s gc --store '%s' --nats %s --older-than 1h",
             jsd_fx_bin("jsdurable"), e.store_url, jsd_fx_shared_nats_url());
    rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 0)
        fail_msg("gc exited %d: %s", rc, out);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM jsd_inbox"), 1);
    ASSERT_EQ(recorded_floor(&e), 10);

    delete_durable(&e);
    cenv_publish(&e, 11, 2, NULL);
    rc = consume_idle(&e, extra);
    if (rc != 0)
        fail_msg("consume --topology exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "re-created from the topology at stream sequence 11, after its "
                         "acknowledged floor 10 recorded at ");
    ASSERT_CONTAINS(out, "2 fetched, 2 committed, 0 duplicates");
    check_start(&e, 11);
    cenv_sink_seqs_once(&e, 12);
    cenv_down(&e);
}
BOTH(gc_floor_not_applied_again)

JSD_TEST_MAIN(cmocka_unit_test(retry_pending_when_lost_sqlite),
              cmocka_unit_test(retry_pending_when_lost_pg),
              cmocka_unit_test(gc_floor_not_applied_again_sqlite),
              cmocka_unit_test(gc_floor_not_applied_again_pg))
