/*
 * `jsdurable gc` keeps what a redelivery can still need (issue 42, item 5),
 * against a real nats-server and both store back ends. A delivery committed
 * and never acknowledged (consume killed between COMMIT and ACK), its inbox
 * row older than the horizon and no consumer running: gc keeps the rows
 * above the durable's ack floor, so the next consumer answers the
 * redeliveries from the inbox and the sink holds every message once; rows at
 * or below the floor still go by age, all but each durable's highest (its
 * high-water mark). Rows of a durable the server no longer
 * has are kept and reported until `gc --durable NAME` drops them (that
 * durable's only, by age); without a server every inbox row is kept and
 * reported; a horizon under the stream's duplicate window is refused.
 */
#include <jansson.h>

#include "consumer_env.h"

static char out[65536];

/* killed by SIGKILL (directly, or as seen through the shell) */
#define KILLED(rc) ((rc) == -1 || (rc) == 137)

/* Older than any horizon below: the rows' created_at moved 30 days back. */
#define BACKDATE_MS "2592000000"
/* Longer than the streams' duplicate windows (2 minutes by default). */
#define HORIZON "1h"

static int consume(cenv *e, const char *env_prefix, const char *extra)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "%s %s consume --store '%s' --nats %s --stream %s --durable %s --ack-wait 1s "
             "--until-idle --sql 'INSERT INTO sink(body, seq) VALUES (:payload, :stream_seq)' %s",
             env_prefix ? env_prefix : "", jsd_fx_bin("jsdurable"), e->store_url,
             jsd_fx_shared_nats_url(), e->stream, e->durable, extra ? extra : "");
    return jsd_test_run(cmd, out, sizeof(out));
}

/* jsdurable gc on e's store; nats: with the run's server, else without. */
static int gc(cenv *e, bool nats, const char *args)
{
    char cmd[4096];
    if (nats)
        snprintf(cmd, sizeof(cmd), "%s gc --store '%s' --nats %s %s", jsd_fx_bin("jsdurable"),
                 e->store_url, jsd_fx_shared_nats_url(), args);
    else
        snprintf(cmd, sizeof(cmd), "JSD_NATS_URL= %s gc --store '%s' %s", jsd_fx_bin("jsdurable"),
                 e->store_url, args);
    return jsd_test_run(cmd, out, sizeof(out));
}

static long long sql1(cenv *e, const char *sql)
{
    return cenv_store_scalar(e->store, sql);
}

static void backdate_inbox(cenv *e, const char *where)
{
    char sql[256];
    snprintf(sql, sizeof(sql), "UPDATE jsd_inbox SET created_at = created_at - " BACKDATE_MS "%s%s",
             where ? " WHERE " : "", where ? where : "");
    cenv_store_exec(e->store, sql);
}

/* The integer at key (inside obj when given) of the JSON document that is
 * the last line of out; -1 when absent. */
static long long json_at(const char *obj, const char *key)
{
    const char *line = out, *nl;
    while ((nl = strchr(line, '\n')) && nl[1])
        line = nl + 1;
    json_t *doc = json_loads(line, 0, NULL);
    if (!doc)
        fail_msg("no JSON document ends the output: %s", out);
    json_t *o = obj ? json_object_get(doc, obj) : doc;
    json_t *v = o ? json_object_get(o, key) : NULL;
    long long n = json_is_integer(v) ? (long long)json_integer_value(v) : -1;
    json_decref(doc);
    return n;
}

/* ---- committed, never acknowledged, no consumer past the horizon -------------------------- */
static void unacked_rows_survive_gc(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    cenv_store_exec(e.store, "CREATE TABLE sink(body TEXT, seq BIGINT)");
    cenv_publish(&e, 1, 500, NULL);
    int rc = consume(&e, "JSD_CRASH_AT=ingress.after_commit:2", "--batch 100");
    if (!KILLED(rc))
        fail_msg("consume should have been killed at the crash point, exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "crash point ingress.after_commit");
    ASSERT_EQ(sql1(&e, "SELECT COUNT(*) FROM sink"), 200);
    /* The second batch was committed and never acknowledged: the floor is
     * below it (the first batch's ACKs may not all have left either). */
    jsConsumerInfo *ci = cenv_info(&e);
    ASSERT_TRUE(ci != NULL);
    uint64_t floor = ci->AckFloor.Stream;
    jsConsumerInfo_Destroy(ci);
    ASSERT_TRUE(floor <= 100);
    char sql[256];
    snprintf(sql, sizeof(sql), "SELECT COUNT(*) FROM jsd_inbox WHERE stream_seq > %llu",
             (unsigned long long)floor);
    long long above = sql1(&e, sql);
    ASSERT_EQ(above, 200 - (long long)floor);
    /* No consumer runs for longer than the retention. */
    backdate_inbox(&e, NULL);
    rc = gc(&e, true, "--older-than " HORIZON " -j");
    char gc_out[sizeof(out)];
    snprintf(gc_out, sizeof(gc_out), "%s", out);
    long long inbox_after_gc = sql1(&e, "SELECT COUNT(*) FROM jsd_inbox");

    /* The next consumer: every message applied exactly once. */
    int rc2 = consume(&e, NULL, "--batch 100");
    if (rc2 != 0)
        fail_msg("consume exited %d: %s", rc2, out);
    long long sink = sql1(&e, "SELECT COUNT(*) FROM sink");
    if (sink != 500)
        fail_msg("the sink holds %lld rows for 500 messages (%lld distinct), ack floor %llu: gc "
                 "(exit %d) left %lld of 200 inbox rows: %s; then consume: %s",
                 sink, sql1(&e, "SELECT COUNT(DISTINCT seq) FROM sink"), (unsigned long long)floor,
                 rc, inbox_after_gc, gc_out, out);
    ASSERT_EQ(sql1(&e, "SELECT COUNT(DISTINCT seq) FROM sink"), 500);
    ASSERT_TRUE(cenv_settled(&e));
    const char *d = strstr(out, " committed, ");
    long dups = d ? strtol(d + strlen(" committed, "), NULL, 10) : -1;
    /* the kept rows answered the redeliveries: the second batch at least */
    if (dups < 100 || dups > above)
        fail_msg("want 100 to %lld duplicates answered by the inbox: %s", above, out);

    /* What gc did and said: the rows above the floor kept, the rest gone. */
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(inbox_after_gc, above);
    ASSERT_CONTAINS(gc_out, "above its ack floor");
    snprintf(out, sizeof(out), "%s", gc_out);
    ASSERT_EQ(json_at("kept_inbox", "above_ack_floor"), above);
    ASSERT_EQ(json_at("kept_inbox", "durable_missing"), 0);
    ASSERT_EQ(json_at(NULL, "removed_inbox"), (long long)floor);

    /* Once acknowledged, the rows go by age as before (the floor's went),
     * all but the durable's highest: its high-water mark, which tells a
     * store restored from an older backup (consumer.inbox_behind) and
     * where a lost durable resumes. Before the high-water mark was kept, gc
     * removed all 500 and the mark fell to 0. */
    ASSERT_EQ(sql1(&e, "SELECT COUNT(*) FROM jsd_inbox"), 500 - (long long)floor);
    backdate_inbox(&e, NULL);
    rc = gc(&e, true, "--older-than " HORIZON " -j");
    if (rc != 0)
        fail_msg("gc exited %d: %s", rc, out);
    ASSERT_EQ(json_at(NULL, "removed_inbox"), 499 - (long long)floor);
    ASSERT_NOT_CONTAINS(out, "above its ack floor");
    ASSERT_EQ(json_at("kept_inbox", "above_ack_floor"), 0);
    ASSERT_EQ(sql1(&e, "SELECT COUNT(*) FROM jsd_inbox"), 1);
    uint64_t high = 0;
    ASSERT_OK(jsd_store_inbox_high_water(e.store, e.stream, e.durable, &high),
              jsd_store_errmsg(e.store));
    ASSERT_U64_EQ(high, 500);
    cenv_down(&e);
}

/* ---- a durable the server no longer has; no server at all; the window ---------------------- */
static void missing_durable_rows_kept(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    cenv_store_exec(e.store, "CREATE TABLE sink(body TEXT, seq BIGINT)");
    cenv_publish(&e, 1, 20, NULL);
    int rc = consume(&e, NULL, NULL);
    if (rc != 0)
        fail_msg("consume exited %d: %s", rc, out);
    ASSERT_EQ(sql1(&e, "SELECT COUNT(*) FROM jsd_inbox"), 20);
    ASSERT_TRUE(cenv_settled(&e));

    /* A horizon under the stream's duplicate window is refused, for the
     * inbox as for the outbox: nothing removed. */
    ASSERT_EQ(gc(&e, true, "--older-than 1s"), 78);
    ASSERT_CONTAINS(out, "duplicate window");
    ASSERT_EQ(sql1(&e, "SELECT COUNT(*) FROM jsd_inbox"), 20);

    /* The first 10 rows old, the other 10 young; the durable deleted. */
    backdate_inbox(&e, "stream_seq <= 10");
    jsErrCode jerr = 0;
    ASSERT_EQ(js_DeleteConsumer(e.js, e.stream, e.durable, NULL, &jerr), NATS_OK);

    /* Without a server gc cannot read the floor: it keeps every inbox row
     * and says so. */
    rc = gc(&e, false, "--older-than " HORIZON " --dedup-window 2m -j");
    if (rc != 0)
        fail_msg("gc exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "nothing is removed from the inbox on a guess");
    ASSERT_EQ(json_at("kept_inbox", "server_unreachable"), 10);
    ASSERT_EQ(sql1(&e, "SELECT COUNT(*) FROM jsd_inbox"), 20);
    /* ...nor when the server given cannot be reached (a stated window lets
     * the effects go on) */
    char args[1200];
    snprintf(args, sizeof(args),
             "JSD_NATS_URL= %s gc --store '%s' --nats nats://127.0.0.1:1 --older-than " HORIZON
             " --dedup-window 2m",
             jsd_fx_bin("jsdurable"), e.store_url);
    rc = jsd_test_run(args, out, sizeof(out));
    if (rc != 0)
        fail_msg("gc exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "every inbox row is kept");
    ASSERT_CONTAINS(out, "10 unchecked (no server)");
    ASSERT_EQ(sql1(&e, "SELECT COUNT(*) FROM jsd_inbox"), 20);

    /* With the server: the durable is missing, its rows kept and reported. */
    rc = gc(&e, true, "--older-than " HORIZON " -j");
    if (rc != 0)
        fail_msg("gc exited %d: %s", rc, out);
    ASSERT_CONTAINS(out, "does not exist on the server");
    ASSERT_CONTAINS(out, "jsdurable gc --durable");
    ASSERT_EQ(json_at("kept_inbox", "durable_missing"), 10);
    ASSERT_EQ(json_at(NULL, "removed_inbox"), 0);
    ASSERT_EQ(sql1(&e, "SELECT COUNT(*) FROM jsd_inbox"), 20);

    /* --durable of another name touches none of them. */
    ASSERT_EQ(gc(&e, true, "--older-than " HORIZON " --durable nobody-else"), 0);
    ASSERT_CONTAINS(out, "removed 0 rows");
    ASSERT_EQ(sql1(&e, "SELECT COUNT(*) FROM jsd_inbox"), 20);

    /* --durable NAME drops that durable's rows, still by --older-than. */
    snprintf(args, sizeof(args), "--older-than " HORIZON " --durable %s -j", e.durable);
    rc = gc(&e, true, args);
    if (rc != 0)
        fail_msg("gc exited %d: %s", rc, out);
    ASSERT_EQ(json_at(NULL, "removed_inbox"), 10);
    ASSERT_EQ(json_at(NULL, "removed_effects"), 0);
    ASSERT_EQ(sql1(&e, "SELECT COUNT(*) FROM jsd_inbox"), 10);
    ASSERT_EQ(sql1(&e, "SELECT COUNT(*) FROM jsd_inbox WHERE stream_seq <= 10"), 0);
    cenv_down(&e);
}

BOTH(unacked_rows_survive_gc)
BOTH(missing_durable_rows_kept)

#define T(fn) cmocka_unit_test(fn##_sqlite), cmocka_unit_test(fn##_pg)

JSD_TEST_MAIN(T(unacked_rows_survive_gc), T(missing_durable_rows_kept))
