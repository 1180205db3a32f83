/*
 * The relay's crash ordering (FIX-3, RELAY-2, RELAY-4), with real processes:
 * `jsdurable relay` is killed by SIGKILL at each named crash point
 * (JSD_CRASH_AT=<point>:<n>), restarted without it, and then every effect has
 * exactly one receipt naming the message stored under its own Nats-Msg-Id,
 * the stream holds exactly one message per effect (read by a separate nats.c
 * connection), and every message that was stored before the restart without
 * a receipt is recorded as a broker duplicate. Also: receipts committed but
 * not flushed when the relay and then PostgreSQL die; three relays on one
 * PostgreSQL database (each publishing a share, per-key order kept), per-key
 * order across a crash.
 */
#include <signal.h>
#include <sys/wait.h>

#include <jansson.h>

#include "relay_env.h"

#define N_EFFECTS 3000

typedef struct crash_env {
    rt_store st;
    rt_nats nt;
    const char *nats_url;
    char stream[64];
    char subject[100];
    char filter[100];
    char log[PATH_MAX];
} crash_env;

/* The store on the run's shared server, or on pg_server when given. */
static void cenv_up_on(crash_env *e, rt_backend kind, const char *pg_server)
{
    memset(e, 0, sizeof(*e));
    if (pg_server)
        rt_store_new_on(&e->st, pg_server);
    else
        rt_store_new(&e->st, kind);
    e->nats_url = jsd_fx_shared_nats_url();
    const char *root = jsd_test_unique("crash");
    snprintf(e->stream, sizeof(e->stream), "%s", jsd_test_unique("CRASH"));
    snprintf(e->subject, sizeof(e->subject), "%s.a", root);
    snprintf(e->filter, sizeof(e->filter), "%s.>", root);
    snprintf(e->log, sizeof(e->log), "%s/%s.log", jsd_test_dir(), jsd_test_unique("relay"));
    rt_nats_open(&e->nt, e->nats_url);
    rt_stream_add(&e->nt, e->stream, e->filter);
}

static void cenv_up(crash_env *e, rt_backend kind)
{
    cenv_up_on(e, kind, NULL);
}

/* The deadline is generous so that a loaded machine does not turn slow acks
 * into UNKNOWN outcomes; the lease is as short as it may be. */
static const char *const relay_args[] = {"--batch",       "256",   "--lease-ms", "6500",
                                         "--deadline-ms", "5000",  "--poll-ms",  "100",
                                         "--backoff-ms",  "10:50", "--stats",    NULL};

/* Stream count, read until two reads a moment apart agree (the server may
 * still be storing what the dead process wrote just before it died). */
static uint64_t settled_count(crash_env *e)
{
    uint64_t a = rt_stream_count(&e->nt, e->stream), b;
    for (;;) {
        jsd_test_sleep_ms(200);
        b = rt_stream_count(&e->nt, e->stream);
        if (a == b)
            return b;
        a = b;
    }
}

/* Run one relay with the crash point armed; it must die by SIGKILL. */
static void run_to_crash(crash_env *e, const char *crash_at)
{
    pid_t pid = rt_spawn_relay(e->st.url, e->nats_url, crash_at, e->log, relay_args);
    int st = rt_wait_pid(pid, 60000);
    if (st == -1) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        rt_dump(e->log);
        fail_msg("the relay did not reach crash point %s within 60 s", crash_at);
    }
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
        rt_dump(e->log);
        fail_msg("the relay ended with status %d, expected death by SIGKILL at %s", st, crash_at);
    }
}

/* Run a relay until every effect has a receipt, then SIGTERM: exit 0. */
static void run_to_completion(crash_env *e, long long want)
{
    pid_t pid = rt_spawn_relay(e->st.url, e->nats_url, NULL, e->log, relay_args);
    if (!WAIT_UNTIL(rt_published(&e->st) == want, 120000)) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        rt_dump(e->log);
        fail_msg("after the restart only %lld of %lld effects have receipts", rt_published(&e->st),
                 want);
    }
    kill(pid, SIGTERM);
    int st = rt_wait_pid(pid, 30000);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        if (st == -1) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
        }
        rt_dump(e->log);
        fail_msg("the relay did not exit 0 on SIGTERM (status %d)", st);
    }
}

static void crash_at(rt_backend kind, const char *point)
{
    crash_env e;
    cenv_up(&e, kind);
    jsd_store *app = rt_open(&e.st);
    rt_enqueue_opts q = {.owner = "crash", .n = N_EFFECTS, .subject = e.subject, .per_tx = 500};
    rt_enqueue(app, &q);

    run_to_crash(&e, point);
    uint64_t stored_before = settled_count(&e);
    long long receipts_before = rt_published(&e.st);
    fprintf(stderr, "%s: %llu stored, %lld receipts at the crash\n", point,
            (unsigned long long)stored_before, receipts_before);
    if (!strncmp(point, "relay.after_claim", 17)) {
        ASSERT_EQ(stored_before, 0);
        ASSERT_EQ(receipts_before, 0);
    } else if (!strncmp(point, "relay.before_receipt_commit", 27)) {
        /* the whole first batch was acknowledged, none of it recorded */
        ASSERT_TRUE(stored_before >= 256);
        ASSERT_EQ(receipts_before, 0);
    } else if (!strncmp(point, "relay.before_receipt_sync", 25)) {
        /* committed, not yet flushed: the store keeps what the relay's
         * death did not take with it */
        ASSERT_TRUE(receipts_before >= 256);
    } else if (!strncmp(point, "relay.after_receipt_commit", 26)) {
        ASSERT_TRUE(receipts_before >= 256);
    } else if (!strncmp(point, "relay.batch_before_receipts", 27)) {
        /* the first atomic batch's PubAck came (the whole batch stored,
         * one sequence each), none of it recorded */
        ASSERT_TRUE(stored_before >= 256);
        ASSERT_EQ(stored_before % 256, 0);
        ASSERT_EQ(receipts_before, 0);
    }
    if (!strncmp(point, "relay.batch_", 12)) {
        /* atomic: every batch is in the stream whole or not at all */
        ASSERT_EQ(stored_before % 256, 0);
    }
    ASSERT_LE(receipts_before, (long long)stored_before);

    run_to_completion(&e, N_EFFECTS);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_TOTAL), N_EFFECTS);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DEAD), 0);
    rt_assert_exactly_once(&e.st, &e.nt, e.stream, "crash", "e", 0, N_EFFECTS);
    rt_assert_receipts_match(&e.st, &e.nt, e.stream);
    /* Every message stored before the restart without a receipt was published
     * again with the same id and absorbed by the broker: duplicate=true. (An
     * UNKNOWN outcome on a loaded machine adds its own duplicates; they are
     * counted as failed attempts.) */
    long long dups = rt_q(&e.st, RT_SQL_DUPLICATES);
    if (rt_q(&e.st, "SELECT coalesce(sum(attempts), 0) FROM jsd_outbox_state") == 0)
        ASSERT_EQ(dups, (long long)stored_before - receipts_before);
    else
        ASSERT_TRUE(dups >= (long long)stored_before - receipts_before);
    if (!strncmp(point, "relay.batch_", 12) && stored_before > (uint64_t)receipts_before) {
        /* the restart's batch met ids the stream holds (10201) and went one
         * by one, collecting the duplicate acknowledgements */
        char text[1 << 16];
        FILE *f = fopen(e.log, "r");
        ASSERT_TRUE(f != NULL);
        size_t n = fread(text, 1, sizeof(text) - 1, f);
        fclose(f);
        text[n] = '\0';
        ASSERT_CONTAINS(text, "instead of in an atomic batch (duplicate)");
    }
    jsd_store_close(app);
    rt_nats_close(&e.nt);
    rt_store_close(&e.st);
}

#define CRASH_CASE(name, point)                                                                    \
    static void name##_sqlite(void **state)                                                        \
    {                                                                                              \
        (void)state;                                                                               \
        crash_at(RT_SQLITE, point);                                                                \
    }                                                                                              \
    static void name##_pg(void **state)                                                            \
    {                                                                                              \
        (void)state;                                                                               \
        crash_at(RT_PG, point);                                                                    \
    }

CRASH_CASE(crash_after_claim, "relay.after_claim:1")
CRASH_CASE(crash_after_publish, "relay.after_publish:3")
CRASH_CASE(crash_before_receipt_commit, "relay.before_receipt_commit:1")
CRASH_CASE(crash_before_receipt_sync, "relay.before_receipt_sync:1")
CRASH_CASE(crash_after_receipt_commit, "relay.after_receipt_commit:2")
/* the atomic path (the stream has allow_atomic on 2.12+): between the
 * commit's publication and its PubAck, between the PubAck and the receipts */
CRASH_CASE(crash_batch_after_commit_publish, "relay.batch_after_commit_publish:2")
CRASH_CASE(crash_batch_before_receipts, "relay.batch_before_receipts:1")

/* ---- a receipt lost before its flush ---------------------------------------------------- */

/* PostgreSQL's receipts commit without waiting for the disk and are flushed
 * by group (relay.c DESIGN 8). Here the relay dies between the two
 * (relay.before_receipt_sync) and the server crashes before anything else
 * flushes its WAL: its WAL writer is stopped (SIGSTOP) before the relay
 * starts, with autovacuum, timed checkpoints and the background writer
 * off, and WAL buffers large enough that no backend has to write them out.
 * The receipts the relay committed are seen in the store before the
 * server's crash and are gone after it; the restarted relay publishes
 * those effects again with the same ids, the stream collapses every
 * republication, and each effect ends with one message and one receipt. */
static void receipt_lost_before_its_flush_pg(void **state)
{
    (void)state;
    static const char *const quiet[] = {"ALTER SYSTEM SET autovacuum = off",
                                        "ALTER SYSTEM SET checkpoint_timeout = '1h'",
                                        "ALTER SYSTEM SET bgwriter_lru_maxpages = 0",
                                        "ALTER SYSTEM SET wal_buffers = '16MB'", NULL};
    crash_env e;
    jsd_fx_pg pg;
    ASSERT_EQ(jsd_fx_pg_start_with(&pg, quiet), 0);
    cenv_up_on(&e, RT_PG, pg.url);
    jsd_store *app = rt_open(&e.st);
    rt_enqueue_opts q = {.owner = "lost", .n = N_EFFECTS, .subject = e.subject, .per_tx = 500};
    rt_enqueue(app, &q);
    jsd_store_close(app);

    long long walwriter =
        rt_q(&e.st, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'");
    ASSERT_TRUE(walwriter > 0);
    ASSERT_EQ(kill((pid_t)walwriter, SIGSTOP), 0);
    run_to_crash(&e, "relay.before_receipt_sync:1");
    long long committed = rt_published(&e.st);
    rt_store_close(&e.st);
    ASSERT_EQ(jsd_fx_pg_kill(&pg), 0);
    ASSERT_EQ(jsd_fx_pg_restart(&pg), 0);
    uint64_t stored_before = settled_count(&e);
    long long receipts_after = rt_published(&e.st);
    fprintf(stderr, "%llu stored, %lld receipts committed, %lld after the server's crash\n",
            (unsigned long long)stored_before, committed, receipts_after);
    if (committed < 256 || receipts_after != 0)
        fail_msg("%lld receipts committed before the crash and %lld after it: want a whole "
                 "batch committed and none surviving (or this test did not make the fault it "
                 "is about)",
                 committed, receipts_after);

    run_to_completion(&e, N_EFFECTS);
    rt_assert_exactly_once(&e.st, &e.nt, e.stream, "lost", "e", 0, N_EFFECTS);
    rt_assert_receipts_match(&e.st, &e.nt, e.stream);
    if (rt_q(&e.st, "SELECT coalesce(sum(attempts), 0) FROM jsd_outbox_state") == 0)
        ASSERT_EQ(rt_q(&e.st, RT_SQL_DUPLICATES), (long long)stored_before);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DEAD), 0);
    rt_nats_close(&e.nt);
    rt_store_close(&e.st);
    ASSERT_EQ(jsd_fx_pg_stop(&pg), 0);
}

/* ---- per-key order across a crash ----------------------------------------------------------- */

static void order_across_crash(rt_backend kind)
{
    crash_env e;
    cenv_up(&e, kind);
    jsd_store *app = rt_open(&e.st);
    rt_enqueue_opts q = {.owner = "ord",
                         .n = 2000,
                         .subject = e.subject,
                         .order_key = "k%d",
                         .n_keys = 7,
                         .per_tx = 13};
    rt_enqueue(app, &q);
    run_to_crash(&e, "relay.before_receipt_commit:3");
    run_to_completion(&e, 2000);
    rt_assert_exactly_once(&e.st, &e.nt, e.stream, "ord", "e", 0, 2000);
    rt_assert_receipts_match(&e.st, &e.nt, e.stream);
    size_t n = 0;
    rt_msg *m = rt_stream_read(&e.nt, e.stream, &n);
    int last[7] = {-1, -1, -1, -1, -1, -1, -1};
    for (size_t i = 0; i < n; i++) {
        int idx = (int)strtol(m[i].head + 1, NULL, 10);
        int k = idx % 7;
        if (idx <= last[k])
            fail_msg("key k%d: e%d stored after e%d", k, idx, last[k]);
        last[k] = idx;
    }
    free(m);
    jsd_store_close(app);
    rt_nats_close(&e.nt);
    rt_store_close(&e.st);
}

static void order_across_crash_sqlite(void **state)
{
    (void)state;
    order_across_crash(RT_SQLITE);
}
static void order_across_crash_pg(void **state)
{
    (void)state;
    order_across_crash(RT_PG);
}

/* ---- three relays on one PostgreSQL database ------------------------------------------------- */

static void parse_stats(const char *log, unsigned long long *published,
                        unsigned long long *duplicates, unsigned long long *lease_lost)
{
    FILE *f = fopen(log, "r");
    ASSERT_TRUE(f != NULL);
    char line[1024];
    bool found = false;
    while (fgets(line, sizeof(line), f)) {
        /* the relay's --stats line: one JSON object with these counters */
        json_t *o = line[0] == '{' ? json_loads(line, 0, NULL) : NULL;
        json_t *p = json_object_get(o, "published"), *d = json_object_get(o, "duplicates"),
               *ll = json_object_get(o, "lease_lost");
        if (json_is_integer(p) && json_is_integer(d) && json_is_integer(ll)) {
            *published = (unsigned long long)json_integer_value(p);
            *duplicates = (unsigned long long)json_integer_value(d);
            *lease_lost = (unsigned long long)json_integer_value(ll);
            found = true;
        }
        json_decref(o);
    }
    fclose(f);
    if (!found) {
        rt_dump(log);
        fail_msg("no stats line in %s", log);
    }
}

static void three_relays_pg(void **state)
{
    (void)state;
    /* More keys than one claim takes (at most one effect per key is in
     * flight), and the effects committed only once every relay is up, so
     * each relay finds heads to claim. */
    enum { N = 20000, R = 3, KEYS = 1024 };
    crash_env e;
    cenv_up(&e, RT_PG);
    jsd_store *app = rt_open(&e.st);
    char subj[128];
    snprintf(subj, sizeof(subj), "%.*s.s%%d", (int)(strlen(e.subject) - 2), e.subject);

    pid_t pid[R];
    char logs[R][PATH_MAX];
    const char *const args[] = {"--batch",    "64",    "--deadline-ms", "30000",
                                "--lease-ms", "35000", "--stats",       NULL};
    for (int i = 0; i < R; i++) {
        snprintf(logs[i], sizeof(logs[i]), "%s/%s.log", jsd_test_dir(), jsd_test_unique("r"));
        pid[i] = rt_spawn_relay(e.st.url, e.nats_url, NULL, logs[i], args);
    }
    for (int i = 0; i < R; i++)
        ASSERT_WAIT(jsd_test_file_contains(logs[i], "relay started"), 30000);
    rt_enqueue_opts q = {.owner = "many",
                         .n = N,
                         .subject = subj,
                         .n_subjects = 4,
                         .order_key = "k%d",
                         .n_keys = KEYS,
                         .per_tx = 500};
    rt_enqueue(app, &q);
    bool ok = WAIT_UNTIL(rt_published(&e.st) == N, 180000);
    for (int i = 0; i < R; i++)
        kill(pid[i], SIGTERM);
    unsigned long long sum = 0, dups = 0, lost = 0;
    for (int i = 0; i < R; i++) {
        int st = rt_wait_pid(pid[i], 30000);
        if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            rt_dump(logs[i]);
            fail_msg("relay %d did not exit 0 on SIGTERM (status %d)", i, st);
        }
        unsigned long long p = 0, d = 0, l = 0;
        parse_stats(logs[i], &p, &d, &l);
        fprintf(stderr, "relay %d published %llu\n", i, p);
        /* a share each: one relay doing all the work proves nothing about
         * relays sharing a database */
        if (p == 0) {
            rt_dump(logs[i]);
            fail_msg("relay %d published nothing: the others did all the work", i);
        }
        sum += p;
        dups += d;
        lost += l;
    }
    ASSERT_TRUE(ok);
    /* each effect published by exactly one relay, once: no relay's receipt
     * was refused, none needed the broker's deduplication */
    ASSERT_EQ(sum, N);
    ASSERT_EQ(dups, 0);
    ASSERT_EQ(lost, 0);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DUPLICATES), 0);
    ASSERT_EQ(rt_stream_count(&e.nt, e.stream), N);
    rt_assert_exactly_once(&e.st, &e.nt, e.stream, "many", "e", 0, N);
    rt_assert_receipts_match(&e.st, &e.nt, e.stream);
    /* per-key order across the relays: within a key, stream sequences grow
     * with the effect ids (commit order) */
    size_t n = 0;
    rt_msg *m = rt_stream_read(&e.nt, e.stream, &n);
    int last[KEYS];
    for (int k = 0; k < KEYS; k++)
        last[k] = -1;
    for (size_t i = 0; i < n; i++) {
        int idx = (int)strtol(m[i].head + 1, NULL, 10);
        int k = idx % KEYS;
        if (idx <= last[k])
            fail_msg("key k%d: e%d stored after e%d", k, idx, last[k]);
        last[k] = idx;
    }
    free(m);
    jsd_store_close(app);
    rt_nats_close(&e.nt);
    rt_store_close(&e.st);
}

JSD_TEST_MAIN(cmocka_unit_test(crash_after_claim_sqlite), cmocka_unit_test(crash_after_claim_pg),
              cmocka_unit_test(crash_after_publish_sqlite),
              cmocka_unit_test(crash_after_publish_pg),
              cmocka_unit_test(crash_before_receipt_commit_sqlite),
              cmocka_unit_test(crash_before_receipt_commit_pg),
              cmocka_unit_test(crash_before_receipt_sync_sqlite),
              cmocka_unit_test(crash_before_receipt_sync_pg),
              cmocka_unit_test(receipt_lost_before_its_flush_pg),
              cmocka_unit_test(crash_after_receipt_commit_sqlite),
              cmocka_unit_test(crash_after_receipt_commit_pg),
              cmocka_unit_test(crash_batch_after_commit_publish_sqlite),
              cmocka_unit_test(crash_batch_after_commit_publish_pg),
              cmocka_unit_test(crash_batch_before_receipts_sqlite),
              cmocka_unit_test(crash_batch_before_receipts_pg),
              cmocka_unit_test(order_across_crash_sqlite), cmocka_unit_test(order_across_crash_pg),
              cmocka_unit_test(three_relays_pg))
