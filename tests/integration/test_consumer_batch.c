/*
 * The consumer's batch paths against a real nats-server and both store back
 * ends: a batch handler whose batch commits as one (one inbox row per
 * delivery, one effect each, nothing redelivered), a re-published duplicate
 * inside the same batch applied once (the set-based inbox insert cannot see
 * its own rows, so the fast pass must send such a batch to the careful
 * pass), a batch handler that retries one delivery (the others commit, that
 * one is NAKed and comes again), and `jsdurable consume --sql` with one
 * statement that fails in the batch (a unique violation): on PostgreSQL the
 * batch runs in one libpq pipeline, and still only that message is parked;
 * and a connection lost inside that pipeline is held as a store outage.
 */
#include "consumer_env.h"

typedef struct bctx {
    cenv *e;
    int calls;          /* handler calls */
    size_t handed;      /* deliveries handed over, all calls */
    size_t max_n;       /* largest n seen */
    size_t ones;        /* calls with n == 1 */
    uint64_t retry_seq; /* answer RETRY for this seq on its first delivery */
} bctx;

static void effects_table(cenv *e)
{
    cenv_store_exec(e->store, "CREATE TABLE effects(seq BIGINT, body TEXT)");
}

static void batch_sink(jsd_tx *tx, const jsd_delivery *const *d, size_t n, jsd_disposition *out,
                       void *user)
{
    bctx *h = user;
    h->calls++;
    h->handed += n;
    h->max_n = n > h->max_n ? n : h->max_n;
    h->ones += n == 1;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(out[i].kind, JSD_DISPOSITION_COMMIT); /* preset */
        uint64_t seq = jsd_delivery_stream_seq(d[i]);
        size_t len = 0;
        const char *p = jsd_delivery_payload(d[i], &len);
        char sql[256];
        snprintf(sql, sizeof(sql), "INSERT INTO effects(seq, body) VALUES (%llu, '%.*s')",
                 (unsigned long long)seq, (int)(len < 60 ? len : 60), p ? p : "");
        if (!cenv_tx_exec(tx, sql))
            out[i] = jsd_disposition_retry(0, "insert failed");
        else if (seq == h->retry_seq && jsd_delivery_deliveries(d[i]) == 1)
            out[i] = jsd_disposition_retry(50, "asked to retry");
    }
}

static long long scalar(cenv *e, const char *sql)
{
    return cenv_store_scalar(e->store, sql);
}

#define POLL_UNTIL(c, h, cond, ms)                                                                 \
    CENV_POLL_UNTIL(jsd_consumer_poll_batch, c, batch_sink, h, cond, ms)

/* ---- a batch commits as one -------------------------------------------------------------- */
static void batch_commit(bool pg)
{
    cenv e;
    bctx h = {0};
    cenv_up(&e, pg);
    effects_table(&e);
    cenv_durable(&e, 30000, 6, 1024, NULL, 0);
    cenv_publish(&e, 1, 300, NULL);
    h.e = &e;
    jsd_consumer *c = cenv_consumer(&e, NULL);
    jsd_consumer_stats s;
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.committed >= 300), 20000);
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.acked >= 300), 5000);
    ASSERT_EQ(s.committed, 300);
    ASSERT_EQ(s.duplicates, 0);
    ASSERT_EQ(s.retried, 0);
    ASSERT_EQ(s.ack_unconfirmed, 0);
    /* Handed over in batches, each delivery once: no careful pass ran. */
    ASSERT_TRUE(h.max_n > 1);
    ASSERT_EQ(h.handed, 300);
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM effects"), 300);
    ASSERT_EQ(scalar(&e, "SELECT COUNT(DISTINCT seq) FROM effects"), 300);
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM jsd_inbox"), 300);
    ASSERT_EQ(scalar(&e, "SELECT COUNT(DISTINCT stream_seq) FROM jsd_inbox WHERE outcome = 1 "
                         "AND msg_id IS NOT NULL"),
              300);
    jsConsumerInfo *ci = cenv_info(&e);
    ASSERT_TRUE(ci != NULL);
    ASSERT_EQ(ci->NumAckPending, 0);
    ASSERT_EQ(ci->NumPending, 0);
    ASSERT_EQ(ci->NumRedelivered, 0);
    jsConsumerInfo_Destroy(ci);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* ---- a re-published duplicate in the same batch is applied once -------------------------- */
static void duplicate_in_batch(bool pg)
{
    cenv e;
    bctx h = {0};
    cenv_up(&e, pg);
    effects_table(&e);
    /* A 200 ms duplicate window, so the broker stores the second copy. */
    jsStreamInfo *si = NULL, *si2 = NULL;
    jsErrCode jerr = 0;
    ASSERT_EQ(js_GetStreamInfo(&si, e.js, e.stream, NULL, &jerr), NATS_OK);
    si->Config->Duplicates = 200LL * 1000000;
    ASSERT_EQ(js_UpdateStream(&si2, e.js, si->Config, NULL, &jerr), NATS_OK);
    jsStreamInfo_Destroy(si2);
    jsStreamInfo_Destroy(si);
    cenv_durable(&e, 30000, 6, 1024, NULL, 0);
    cenv_publish_raw(&e, "a", "one", 3, NULL, "same-id");
    cenv_publish_raw(&e, "b", "two", 3, NULL, "other-1");
    jsd_test_sleep_ms(400); /* past the window: the next publish is stored anew */
    cenv_publish_raw(&e, "a", "one", 3, NULL, "same-id");
    cenv_publish_raw(&e, "b", "three", 5, NULL, "other-2");
    ASSERT_EQ(cenv_stream_msgs(&e, e.stream), 4);
    h.e = &e;
    jsd_consumer *c = cenv_consumer(&e, NULL);
    jsd_consumer_stats s;
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.committed + s.duplicates >= 4), 10000);
    /* All four came in one batch: the duplicate is within it. */
    ASSERT_EQ(s.max_batch, 4);
    ASSERT_EQ(s.committed, 3);
    ASSERT_EQ(s.duplicates, 1);
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM effects"), 3);
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM effects WHERE seq = 3"), 0);
    /* Both identities recorded: the copy as a duplicate (outcome 4) of seq 1. */
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM jsd_inbox"), 4);
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM jsd_inbox WHERE stream_seq = 3 AND outcome = 4"), 1);
    POLL_UNTIL(c, &h, cenv_settled(&e), 5000);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* ---- one RETRY in a batch: the others commit, that one is NAKed ------------------------- */
static void batch_retry_one(bool pg)
{
    cenv e;
    bctx h = {0};
    cenv_up(&e, pg);
    effects_table(&e);
    cenv_durable(&e, 30000, 6, 1024, NULL, 0);
    cenv_publish(&e, 1, 10, NULL);
    h.e = &e;
    h.retry_seq = 4;
    jsd_consumer *c = cenv_consumer(&e, NULL);
    jsd_consumer_stats s;
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.committed >= 9), 10000);
    ASSERT_EQ(s.committed, 9);
    ASSERT_EQ(s.retried, 1);
    ASSERT_EQ(s.max_batch, 10);
    /* One call with the batch, then the careful pass: one call per delivery. */
    ASSERT_EQ(h.calls, 11);
    ASSERT_EQ(h.ones, 10);
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM effects"), 9);
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM effects WHERE seq = 4"), 0);
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM jsd_inbox"), 9);
    /* The NAK brings it again, and its second delivery commits. */
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.committed >= 10), 10000);
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM effects"), 10);
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM effects WHERE seq = 4"), 1);
    ASSERT_EQ(scalar(&e, "SELECT COUNT(*) FROM jsd_inbox WHERE outcome = 1"), 10);
    POLL_UNTIL(c, &h, cenv_settled(&e), 5000);
    jsConsumerInfo *ci = cenv_info(&e);
    ASSERT_TRUE(ci != NULL);
    ASSERT_EQ(ci->NumRedelivered, 0); /* settled: nothing is waiting for redelivery */
    jsConsumerInfo_Destroy(ci);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* ---- consume --sql: one failing statement in the batch (a pipeline on PostgreSQL) ------- */
static char out[65536];

/* `jsdurable consume --until-idle --max-deliver 1 --sql SQL` on e's store and
 * durable (SQL is put inside single quotes for the shell); its output in
 * out, failing the test unless it exits want (1: the run dead-lettered). */
static void consume_sql(cenv *e, const char *ack_wait, const char *sql, int want)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "%s consume --store '%s' --nats %s --stream %s --durable %s --ack-wait %s "
             "--until-idle --max-deliver 1 --sql '%s'",
             jsd_fx_bin("jsdurable"), e->store_url, jsd_fx_shared_nats_url(), e->stream, e->durable,
             ack_wait, sql);
    int rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != want)
        fail_msg("consume exited %d, expected %d: %s", rc, want, out);
}

static void cli_one_statement_fails(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    cenv_store_exec(e.store, "CREATE TABLE sink(body TEXT UNIQUE, seq BIGINT)");
    /* msg-7 is there already: its INSERT violates the unique key on every try. */
    cenv_store_exec(e.store, "INSERT INTO sink(body, seq) VALUES ('msg-7', 0)");
    cenv_publish(&e, 1, 20, NULL);
    consume_sql(&e, "1s",
                "INSERT INTO sink(body, seq) VALUES (CAST(:payload AS TEXT), :stream_seq)", 1);
    ASSERT_CONTAINS(out, "19 committed");
    ASSERT_CONTAINS(out, "1 parked");
    ASSERT_CONTAINS(out, "this run dead-lettered 1 messages (0 poisoned, 1 parked)");
    ASSERT_CONTAINS(out, "sequence 7 (msg id \"id-7\", delivery 1) parked, dead-lettered");
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM sink"), 20);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM sink WHERE seq = 7"), 0);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM jsd_inbox WHERE outcome = 1"), 19);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM jsd_poison WHERE stream_seq = 7"),
              1);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM jsd_poison"), 1);
    ASSERT_EQ(cenv_stream_msgs(&e, e.dlq_stream), 1);
    ASSERT_TRUE(cenv_settled(&e));
    cenv_down(&e);
}

/* ---- consume --sql: the connection lost inside the pipeline is an outage ------------------ */
static void cli_outage_in_pipeline(void **state)
{
    (void)state;
    cenv e;
    cenv_up(&e, true);
    cenv_store_exec(e.store, "CREATE TABLE sink(body TEXT, seq BIGINT)");
    cenv_store_exec(e.store, "CREATE SEQUENCE kill_once");
    cenv_publish(&e, 1, 20, NULL);
    /* Message 5's statement ends its own session, once (a sequence is not
     * rolled back): the connection is lost in the middle of the batch's
     * pipeline. As a handler failure it would park message 5 (attempts 1);
     * as the outage it is, the batch is held and applied whole once the
     * store answers again. */
    consume_sql(&e, "5s",
                "INSERT INTO sink(body, seq) SELECT CAST(:payload AS TEXT), CAST(:stream_seq AS "
                "BIGINT) WHERE CASE WHEN CAST(:stream_seq AS BIGINT) = 5 THEN NOT "
                "(nextval('\\''kill_once'\\'') = 1 AND pg_terminate_backend(pg_backend_pid())) "
                "ELSE true END",
                0);
    ASSERT_CONTAINS(out, "store outage");
    ASSERT_CONTAINS(out, "20 committed");
    ASSERT_CONTAINS(out, "0 retried");
    ASSERT_CONTAINS(out, "0 parked");
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM sink"), 20);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(DISTINCT seq) FROM sink"), 20);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM jsd_poison"), 0);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT last_value FROM kill_once"), 2);
    ASSERT_TRUE(cenv_settled(&e));
    cenv_down(&e);
}

BOTH(batch_commit)
BOTH(duplicate_in_batch)
BOTH(batch_retry_one)
BOTH(cli_one_statement_fails)

#define T(fn) cmocka_unit_test(fn##_sqlite), cmocka_unit_test(fn##_pg)

JSD_TEST_MAIN(T(batch_commit), T(duplicate_in_batch), T(batch_retry_one),
              T(cli_one_statement_fails), cmocka_unit_test(cli_outage_in_pipeline))
