/*
 * A durable lost under `jsdurable consume` (issue 42, item 7): deleted while
 * it runs, or missing at start after it was used. Against the run's real
 * nats-server, on both store back ends:
 *
 *   recreated_at_high_water: 10 messages applied, the durable deleted, 5
 *       more published; `consume --until-idle --topology FILE` re-creates it
 *       with the file's filter subject, max_deliver and max_ack_pending at
 *       stream sequence 11 (deliver policy by_start_sequence, opt_start_seq
 *       11, after the ack floor the first run recorded at its stop): "5
 *       committed, 0 duplicates", each sequence in the sink once.
 *       `provision --policy reconcile` then leaves it as it is. Before the
 *       fix --topology did not exist and the durable came back from
 *       defaults at the stream's start.
 *   missing_refused_without_topology: the same without --topology exits 78
 *       naming `jsdurable provision` and --topology, and creates nothing; a
 *       topology that does not declare the durable is refused too (78).
 *       Before the fix it was re-created from defaults and exited 0.
 *   deleted_while_running: a running `consume --metrics` without --topology
 *       whose durable is deleted logs an error at once and /readyz says 503
 *       until the durable is back; before the fix it warned every 2 s and
 *       /readyz stayed 200.
 *   restored_while_running: the same with --topology: the error line, then
 *       the durable re-created at 6 (after the recorded ack floor 5, or
 *       without one yet after the inbox's high-water mark 5), and the
 *       messages published meanwhile applied once.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include "consumer_env.h"

#define SINK_SQL "INSERT INTO sink(seq) VALUES (:stream_seq)"

static char out[65536];

static void sink_table(cenv *e)
{
    cenv_store_exec(e->store, "CREATE TABLE sink(seq BIGINT)");
}

static long long sink_rows(cenv *e)
{
    return cenv_store_scalar(e->store, "SELECT COUNT(*) FROM sink");
}

/* A topology file declaring e's stream and the durable `durable` with a
 * filter, max_deliver 4 and max_ack_pending 64; its path. */
static const char *topology_file(cenv *e, const char *durable)
{
    static char path[1024];
    snprintf(path, sizeof(path), "%s/topology-%s.json", jsd_test_dir(), e->durable);
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fprintf(f,
            "{\"streams\": [{\"name\": \"%s\", \"subjects\": [\"%s.>\"]}],\n"
            " \"consumers\": [{\"stream\": \"%s\", \"durable\": \"%s\", \"filter_subject\": "
            "\"%s.*\", \"ack_wait\": \"2s\", \"max_deliver\": 4, \"max_ack_pending\": 64}]}\n",
            e->stream, e->prefix, e->stream, durable, e->prefix);
    fclose(f);
    return path;
}

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

static void delete_durable(cenv *e)
{
    jsErrCode jerr = 0;
    ASSERT_EQ(js_DeleteConsumer(e->js, e->stream, e->durable, NULL, &jerr), NATS_OK);
}

static bool durable_exists(cenv *e)
{
    jsConsumerInfo *ci = cenv_info(e);
    jsConsumerInfo_Destroy(ci);
    return ci != NULL;
}

/* The durable as the server holds it: deliver by start sequence at `at`,
 * with the topology file's settings. */
static void check_restored(cenv *e, uint64_t at)
{
    char filter[96];
    snprintf(filter, sizeof(filter), "%s.*", e->prefix);
    jsConsumerInfo *ci = cenv_info(e);
    ASSERT_TRUE(ci != NULL && ci->Config != NULL);
    ASSERT_EQ(ci->Config->DeliverPolicy, js_DeliverByStartSequence);
    ASSERT_U64_EQ(ci->Config->OptStartSeq, at);
    ASSERT_STREQ(ci->Config->FilterSubject, filter);
    ASSERT_EQ(ci->Config->MaxDeliver, 4);
    ASSERT_EQ(ci->Config->MaxAckPending, 64);
    ASSERT_I64_EQ(ci->Config->AckWait, 2000LL * 1000000LL);
    jsConsumerInfo_Destroy(ci);
}

/* 10 messages applied by a first run (durable created from the defaults),
 * then the durable deleted and 5 more published. */
static void used_then_lost(cenv *e)
{
    sink_table(e);
    cenv_publish(e, 1, 10, NULL);
    int rc = consume_idle(e, NULL);
    if (rc != 0)
        fail_msg("first consume exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "10 committed, 0 duplicates");
    cenv_sink_seqs_once(e, 10);
    ASSERT_TRUE(cenv_settled(e));
    delete_durable(e);
    cenv_publish(e, 11, 5, NULL);
}

/* ---- missing at start, with the topology -------------------------------------------- */
static void recreated_at_high_water(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    used_then_lost(&e);
    /* the store's front answers the high-water mark, retired rows left out */
    uint64_t high = 0;
    ASSERT_OK(jsd_store_inbox_high_water(e.store, e.stream, e.durable, &high),
              jsd_store_errmsg(e.store));
    ASSERT_U64_EQ(high, 10);

    char extra[1200];
    snprintf(extra, sizeof(extra), "--topology %s", topology_file(&e, e.durable));
    int rc = consume_idle(&e, extra);
    if (rc != 0)
        fail_msg("consume --topology exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "was missing; re-created from the topology at stream sequence 11, after "
                         "its acknowledged floor 10 recorded at ");
    ASSERT_CONTAINS(out, "5 fetched, 5 committed, 0 duplicates");
    check_restored(&e, 11);
    cenv_sink_seqs_once(&e, 15);
    ASSERT_TRUE(cenv_settled(&e));

    /* `provision --policy reconcile` takes it as the file's durable. */
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "%s provision --nats %s --policy reconcile --file %s",
             jsd_fx_bin("jsdurable"), jsd_fx_shared_nats_url(), topology_file(&e, e.durable));
    rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 0)
        fail_msg("provision --policy reconcile exited %d: %s", rc, out);
    check_restored(&e, 11);

    /* A second run finds it and leaves it as it is. */
    rc = consume_idle(&e, extra);
    if (rc != 0)
        fail_msg("third consume exited %d: %s", rc, out);
    ASSERT_NOT_CONTAINS(out, "re-created");
    ASSERT_CONTAINS(out, "0 fetched");
    check_restored(&e, 11);
    cenv_sink_seqs_once(&e, 15);
    cenv_down(&e);
}
BOTH(recreated_at_high_water)

/* ---- missing at start, without the topology ----------------------------------------- */
static void missing_refused_without_topology(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    used_then_lost(&e);
    int rc = consume_idle(&e, NULL);
    ASSERT_EQ(rc, 78);
    ASSERT_CONTAINS(out, "is missing, but the store holds its deliveries (inbox high-water mark "
                         "10, recorded ack floor 10)");
    ASSERT_CONTAINS(out, "jsdurable provision");
    ASSERT_CONTAINS(out, "--topology");
    ASSERT_TRUE(!durable_exists(&e));
    cenv_sink_seqs_once(&e, 10);

    /* A topology without this durable is no way round it. */
    char extra[1200];
    snprintf(extra, sizeof(extra), "--topology %s", topology_file(&e, "someone_else"));
    rc = consume_idle(&e, extra);
    ASSERT_EQ(rc, 78);
    ASSERT_CONTAINS(out, "declares no durable");
    ASSERT_TRUE(!durable_exists(&e));
    cenv_sink_seqs_once(&e, 10);
    cenv_down(&e);
}
BOTH(missing_refused_without_topology)

/* ---- deleted while consume runs ----------------------------------------------------- */

static pid_t spawn_consume(const cenv *e, const char *topology, const char *log)
{
    const char *argv[32];
    int n = 0;
    argv[n++] = jsd_fx_bin("jsdurable");
    argv[n++] = "consume";
    argv[n++] = "--store";
    argv[n++] = e->store_url;
    argv[n++] = "--nats";
    argv[n++] = jsd_fx_shared_nats_url();
    argv[n++] = "--stream";
    argv[n++] = e->stream;
    argv[n++] = "--durable";
    argv[n++] = e->durable;
    argv[n++] = "--metrics";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--log-level";
    argv[n++] = "info";
    if (topology) {
        argv[n++] = "--topology";
        argv[n++] = topology;
    }
    argv[n++] = "--sql";
    argv[n++] = SINK_SQL;
    argv[n] = NULL;
    return jsd_test_spawn(argv, log, true, NULL);
}

/* A consume process with 5 messages applied; its metrics port. */
static int running_with_five(cenv *e, const char *topology, const char *log, pid_t *pid)
{
    sink_table(e);
    *pid = spawn_consume(e, topology, log);
    ASSERT_WAIT(jsd_test_metrics_port(log) > 0, 20000);
    int port = jsd_test_metrics_port(log);
    ASSERT_WAIT(jsd_test_file_contains(log, "bound to durable"), 20000);
    ASSERT_WAIT(cenv_readyz_says(port, " 200 ", NULL), 10000);
    cenv_publish(e, 1, 5, NULL);
    ASSERT_WAIT(sink_rows(e) == 5, 20000);
    ASSERT_WAIT(cenv_settled(e), 10000);
    return port;
}

static void deleted_while_running(bool pg)
{
    cenv e;
    char log[1200];
    pid_t pid;
    cenv_up(&e, pg);
    snprintf(log, sizeof(log), "%s/consume-deleted-%s.log", jsd_test_dir(), pg ? "pg" : "sq");
    int port = running_with_five(&e, NULL, log, &pid);

    delete_durable(&e);
    ASSERT_WAIT(jsd_test_file_contains(log, "does not exist on stream"), 15000);
    ASSERT_TRUE(jsd_test_file_contains(log, "ERROR"));
    ASSERT_WAIT(cenv_readyz_says(port, " 503 ", "durable: missing"), 10000);
    /* Said once, not once per retry (the repeat is a minute away). */
    ASSERT_EQ(jsd_test_file_lines(log, "does not exist on stream"), 1);
    ASSERT_TRUE(!durable_exists(&e));

    /* Restored by the operator (as `jsdurable provision` would: from the
     * stream's start): ready again, and nothing applied twice. */
    cenv_durable(&e, 30000, 6, 1024, NULL, 0);
    cenv_publish(&e, 6, 3, NULL);
    ASSERT_WAIT(cenv_readyz_says(port, " 200 ", NULL), 15000);
    ASSERT_WAIT(sink_rows(&e) == 8, 20000);
    ASSERT_TRUE(jsd_test_file_contains(log, "the durable exists again"));
    cenv_stop_consume(pid, log, out, sizeof(out));
    ASSERT_CONTAINS(out, "8 committed, 5 duplicates");
    cenv_sink_seqs_once(&e, 8);
    cenv_down(&e);
}
BOTH(deleted_while_running)

static void restored_while_running(bool pg)
{
    cenv e;
    char log[1200];
    pid_t pid;
    cenv_up(&e, pg);
    snprintf(log, sizeof(log), "%s/consume-restored-%s.log", jsd_test_dir(), pg ? "pg" : "sq");
    int port = running_with_five(&e, topology_file(&e, e.durable), log, &pid);

    delete_durable(&e);
    cenv_publish(&e, 6, 5, NULL);
    ASSERT_WAIT(jsd_test_file_contains(log, "does not exist on stream"), 15000);
    ASSERT_WAIT(jsd_test_file_contains(log, "re-created from the topology at stream sequence 6"),
                15000);
    check_restored(&e, 6);
    ASSERT_WAIT(sink_rows(&e) == 10, 20000);
    ASSERT_WAIT(cenv_settled(&e), 10000);
    ASSERT_TRUE(cenv_readyz_says(port, " 200 ", NULL));
    cenv_publish(&e, 11, 2, NULL);
    ASSERT_WAIT(sink_rows(&e) == 12, 20000);
    cenv_stop_consume(pid, log, out, sizeof(out));
    ASSERT_CONTAINS(out, "12 committed, 0 duplicates");
    cenv_sink_seqs_once(&e, 12);
    cenv_down(&e);
}
BOTH(restored_while_running)

JSD_TEST_MAIN(cmocka_unit_test(recreated_at_high_water_sqlite),
              cmocka_unit_test(recreated_at_high_water_pg),
              cmocka_unit_test(missing_refused_without_topology_sqlite),
              cmocka_unit_test(missing_refused_without_topology_pg),
              cmocka_unit_test(deleted_while_running_sqlite),
              cmocka_unit_test(deleted_while_running_pg),
              cmocka_unit_test(restored_while_running_sqlite),
              cmocka_unit_test(restored_while_running_pg))
