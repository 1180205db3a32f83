/*
 * `jsdurable verify` and jsd_verify_run against a real nats-server and both
 * store back ends: effects published through the real relay, then two
 * stream messages deleted behind its back and an old range purged below the
 * first sequence. verify reports exactly the two as missing and the rest as
 * ok or expired, writes nothing; --repair and a relay pass make the stream
 * whole again with the same msg ids, and a second verify is clean. Then
 * the same with keyed and unkeyed effects and thirteen scattered losses:
 * every repaired effect is published again by one relay pass, including
 * those below the relay's settled floor (issue 42). Also:
 * a repair inside the duplicate window is reported (and its republish is a
 * duplicate, so the message stays missing), a deleted or recreated stream
 * (stream gone, overwritten), the jsd_verify_* metrics, bad arguments.
 *
 * A store that lost receipts (restored from a copy taken before the relay
 * published: SQLite's backup API, PostgreSQL's pg_dump and pg_restore):
 * republished inside the window, the broker answers duplicate, the relay
 * finds the stream holds the effect's own message and takes it as the
 * receipt: one copy each, verify clean. Past the window each effect is
 * stored twice; verify reports each as republished with both sequences and
 * exits 1. Before the scan verify said "checked 4: ok 4" and exited 0.
 */
#include <time.h>

#include "jsd_int.h"
#include "relay_env.h"

#define WINDOW_MS 4000 /* the short duplicate window of the repair case */

typedef struct env {
    rt_store st;
    rt_nats nt;
    const char *nats_url;
    char stream[64];
    char filter[80];
    char subject[100];
} env;

static void env_up(env *e, rt_backend kind, int64_t window_ms)
{
    memset(e, 0, sizeof(*e));
    rt_store_new(&e->st, kind);
    e->nats_url = jsd_fx_shared_nats_url();
    snprintf(e->stream, sizeof(e->stream), "%s", jsd_test_unique("VFY"));
    const char *root = jsd_test_unique("vfy");
    snprintf(e->filter, sizeof(e->filter), "%s.>", root);
    snprintf(e->subject, sizeof(e->subject), "%s.a", root);
    rt_nats_open(&e->nt, e->nats_url);
    rt_stream_add_with(&e->nt, e->stream, e->filter, window_ms, 0);
}

static void env_down(env *e)
{
    rt_nats_close(&e->nt);
    rt_store_close(&e->st);
}

/* A relay pass: run until idle. Its retry horizon (deadline + backoff cap +
 * lease = 3200 ms) fits the short window. */
static void relay_pass(env *e)
{
    jsd_relay_opts o;
    jsd_relay_opts_init(&o);
    o.poll_interval_ms = 100;
    o.publish_deadline_ms = 1000;
    o.lease_ms = 2100;
    o.backoff_base_ms = 20;
    o.backoff_cap_ms = 100;
    rt_relay t;
    rt_relay_make(&t, &e->st, e->nats_url, &o);
    rt_relay_start(&t, true);
    ASSERT_WAIT(rt_relay_done(&t), 60000);
    rt_relay_finish(&t);
}

static long long seq_of(env *e, const char *effect_id)
{
    char q[200];
    snprintf(q, sizeof(q), "SELECT stream_seq FROM jsd_outbox_state WHERE effect_id = '%s'",
             effect_id);
    return rt_q(&e->st, q);
}

static void msg_id_of(env *e, const char *effect_id, char *out, size_t cap)
{
    char q[200];
    snprintf(q, sizeof(q), "SELECT msg_id FROM jsd_outbox_state WHERE effect_id = '%s'", effect_id);
    rt_qs(&e->st, q, out, cap);
}

static void delete_msg(env *e, uint64_t seq)
{
    jsErrCode jerr = 0;
    natsStatus s = js_DeleteMsg(e->nt.js, e->stream, seq, NULL, &jerr);
    if (s != NATS_OK)
        fail_msg("js_DeleteMsg %s:%llu: %s (%d)", e->stream, (unsigned long long)seq,
                 natsStatus_GetText(s), (int)jerr);
}

static int verify_cli(env *e, const char *extra, char *out, size_t cap)
{
    char cmd[1600];
    snprintf(cmd, sizeof(cmd), "%s verify --store '%s' --nats %s %s", jsd_fx_bin("jsdurable"),
             e->st.url, e->nats_url, extra);
    return jsd_test_run(cmd, out, cap);
}

/* ---- lost messages found and repaired --------------------------------------------------- */

static void finds_and_repairs(rt_backend kind)
{
    env e;
    env_up(&e, kind, WINDOW_MS);
    jsd_store *app = rt_open(&e.st);
    rt_enqueue_opts q = {.n = 20, .subject = e.subject};
    rt_enqueue(app, &q);
    relay_pass(&e);
    ASSERT_EQ(rt_published(&e.st), 20);
    char id10[128], id15[128];
    msg_id_of(&e, "e10", id10, sizeof(id10));
    msg_id_of(&e, "e15", id15, sizeof(id15));

    /* behind the relay's back: two messages deleted, e0..e4 purged */
    delete_msg(&e, (uint64_t)seq_of(&e, "e10"));
    delete_msg(&e, (uint64_t)seq_of(&e, "e15"));
    jsOptions po;
    jsOptions_Init(&po);
    po.Stream.Purge.Sequence = (uint64_t)seq_of(&e, "e5");
    jsErrCode jerr = 0;
    ASSERT_EQ(js_PurgeStream(e.nt.js, e.stream, &po, &jerr), NATS_OK);
    ASSERT_U64_EQ(rt_stream_count(&e.nt, e.stream), 13);

    /* the library: the report and the jsd_verify_* counters */
    jsd_conn *conn = rt_conn(e.nats_url);
    jsd_metrics *mx = NULL;
    ASSERT_OK(jsd_metrics_create(&mx, NULL));
    jsd_verify_opts vo;
    jsd_verify_opts_init(&vo);
    vo.metrics = mx;
    vo.batch = 7; /* several pages */
    jsd_verify_report rep;
    jsd_error err;
    ASSERT_OK_E(jsd_verify_run(app, conn, &vo, &rep, &err), err.msg);
    ASSERT_U64_EQ(rep.checked, 20);
    ASSERT_U64_EQ(rep.ok, 13);
    ASSERT_U64_EQ(rep.missing, 2);
    ASSERT_U64_EQ(rep.expired, 5);
    ASSERT_U64_EQ(rep.overwritten + rep.stream_gone + rep.repaired, 0);
    double v = -1;
    ASSERT_OK(jsd_metrics_get(mx, "jsd_verify_missing_total", NULL, &v));
    ASSERT_EQ(v, 2);
    ASSERT_OK(jsd_metrics_get(mx, "jsd_verify_checked_total", NULL, &v));
    ASSERT_EQ(v, 20);
    ASSERT_OK(jsd_metrics_get(mx, "jsd_verify_expired_total", NULL, &v));
    ASSERT_EQ(v, 5);
    jsd_metrics_destroy(mx);
    jsd_conn_close(conn);

    /* the command: the two listed, exit 1, nothing written */
    static char out[65536];
    ASSERT_EQ(verify_cli(&e, "--json", out, sizeof(out)), 1);
    ASSERT_EQ(jsd_test_count(out, "\"verdict\":\"missing\""), 2);
    ASSERT_EQ(jsd_test_count(out, "\"verdict\":"), 2);
    ASSERT_CONTAINS(out, id10);
    ASSERT_CONTAINS(out, id15);
    ASSERT_CONTAINS(out, "\"checked\":20,\"ok\":13,\"missing\":2,\"overwritten\":0,\"expired\":5,"
                         "\"stream_gone\":0,\"repaired\":0");
    ASSERT_CONTAINS(out, "jsdurable verify: 20 checked");
    ASSERT_EQ(rt_published(&e.st), 20);

    /* --repair after the duplicate window: nothing left inside it */
    long long last = rt_q(&e.st, "SELECT max(published_at) FROM jsd_outbox_state");
    /* the server forgets ids on a timer of its own: leave it a second */
    ASSERT_WAIT(jsd__now_ms() > last + WINDOW_MS + 1000, 10000);
    ASSERT_EQ(verify_cli(&e, "--repair", out, sizeof(out)), 1);
    ASSERT_CONTAINS(out, "repaired 2 ");
    ASSERT_CONTAINS(out, "-> requeued\n");
    ASSERT_NOT_CONTAINS(out, "inside their stream's duplicate window");
    ASSERT_EQ(rt_published(&e.st), 18);
    char q2[600];
    snprintf(
        q2, sizeof(q2),
        "SELECT count(*) FROM jsd_outbox_state WHERE stream_seq IS NULL AND msg_id IN ('%s', '%s')",
        id10, id15);
    ASSERT_EQ(rt_q(&e.st, q2), 2);

    /* the relay publishes them again, same ids: the stream is whole */
    relay_pass(&e);
    ASSERT_EQ(rt_published(&e.st), 20);
    size_t n = 0;
    rt_msg *m = rt_stream_read(&e.nt, e.stream, &n);
    ASSERT_SIZE_EQ(n, 15);
    int seen10 = 0, seen15 = 0;
    for (size_t i = 0; i < n; i++) {
        seen10 += !strcmp(m[i].msg_id, id10);
        seen15 += !strcmp(m[i].msg_id, id15);
        for (size_t k = 0; k < i; k++)
            ASSERT_TRUE(strcmp(m[i].msg_id, m[k].msg_id) != 0);
    }
    free(m);
    ASSERT_EQ(seen10, 1);
    ASSERT_EQ(seen15, 1);
    ASSERT_EQ(verify_cli(&e, "", out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "checked 20: ok 15, missing 0, overwritten 0, expired 5, stream gone 0");
    jsd_store_close(app);
    env_down(&e);
}

static void finds_and_repairs_sqlite(void **state)
{
    (void)state;
    finds_and_repairs(RT_SQLITE);
}

static void finds_and_repairs_pg(void **state)
{
    (void)state;
    finds_and_repairs(RT_PG);
}

/* ---- every repaired effect is published again (issue 42) -------------------------------- */

/* The layout: first MIX_CHUNKS chunks of MIX_CHUNK unkeyed effects ("u")
 * then as many keyed ones ("k", a key each), relayed by one pass, so that
 * the keyed heads share the claim of the unkeyed range and interleave with
 * it (on SQLite their receipts go into the rows, not into runs); then
 * TAIL_N unkeyed effects alone, relayed by a second pass (receipts as runs
 * on SQLite). */
#define MIX_CHUNKS 20
#define MIX_CHUNK  5
#define MIX_N      (MIX_CHUNKS * MIX_CHUNK) /* of each kind */
#define TAIL_N     200
#define ALL_N      (2 * MIX_N + TAIL_N)

#define LOST_MAX 16

/* The msg ids verify reported repaired (on_finding). */
typedef struct repaired_ids {
    char msg_id[LOST_MAX][JSD_MSG_ID_MAX];
    size_t n;
} repaired_ids;

static void note_repaired(void *user, const jsd_verify_finding *f)
{
    repaired_ids *r = user;
    if (f->verdict == JSD_VERIFY_MISSING && f->repaired && r->n < LOST_MAX)
        snprintf(r->msg_id[r->n++], JSD_MSG_ID_MAX, "%s", f->msg_id);
}

static bool has_id(const repaired_ids *r, const char *msg_id)
{
    for (size_t i = 0; i < r->n; i++)
        if (!strcmp(r->msg_id[i], msg_id))
            return true;
    return false;
}

typedef struct id_list {
    char text[1024];
} id_list;

/* rt_rows: append the first column to the id_list */
static void add_id(int ncols, const char *const *cols, void *user)
{
    (void)ncols;
    id_list *l = user;
    size_t len = strlen(l->text);
    snprintf(l->text + len, sizeof(l->text) - len, "%s%s", len ? " " : "", cols[0]);
}

static jsd_verify_report verify_lib(env *e, jsd_store *app, bool repair, repaired_ids *seen)
{
    jsd_conn *conn = rt_conn(e->nats_url);
    jsd_verify_opts vo;
    jsd_verify_opts_init(&vo);
    vo.repair = repair;
    vo.on_finding = note_repaired;
    vo.user = seen;
    jsd_verify_report rep;
    jsd_error err;
    ASSERT_OK_E(jsd_verify_run(app, conn, &vo, &rep, &err), err.msg);
    jsd_conn_close(conn);
    return rep;
}

static void repair_republishes_all(rt_backend kind)
{
    env e;
    env_up(&e, kind, WINDOW_MS);
    jsd_store *app = rt_open(&e.st);
    for (int c = 0; c < MIX_CHUNKS; c++) {
        rt_enqueue_opts u = {
            .n = MIX_CHUNK, .first = c * MIX_CHUNK, .id_prefix = "u", .subject = e.subject};
        rt_enqueue(app, &u);
        rt_enqueue_opts k = {.n = MIX_CHUNK,
                             .first = c * MIX_CHUNK,
                             .id_prefix = "k",
                             .subject = e.subject,
                             .order_key = "key%d",
                             .n_keys = 1000};
        rt_enqueue(app, &k);
    }
    relay_pass(&e);
    ASSERT_EQ(rt_published(&e.st), 2 * MIX_N);
    rt_enqueue_opts t = {.n = TAIL_N, .first = MIX_N, .id_prefix = "u", .subject = e.subject};
    rt_enqueue(app, &t);
    relay_pass(&e);
    ASSERT_EQ(rt_published(&e.st), ALL_N);

    /* scattered, keyed ones among them, the lowest among the first
     * effects: on SQLite those have their receipts in the rows, far below
     * the settled floor, and before the fix only the tail's losses (in
     * runs) lowered it, to u120: u1..u99 were taken back, never published
     * again and no longer counted anywhere */
    static const char *const lost[] = {"u1",  "u7",   "k3",  "u23",  "u48",  "k50", "u66",
                                       "u99", "u120", "k97", "u175", "u250", "u299"};
    const size_t n_lost = sizeof(lost) / sizeof(lost[0]);
    ASSERT_SIZE_LE(n_lost, LOST_MAX);
    char ids[sizeof(lost) / sizeof(lost[0])][128];
    for (size_t i = 0; i < n_lost; i++) {
        msg_id_of(&e, lost[i], ids[i], sizeof(ids[i]));
        delete_msg(&e, (uint64_t)seq_of(&e, lost[i]));
    }
    ASSERT_U64_EQ(rt_stream_count(&e.nt, e.stream), ALL_N - n_lost);

    /* repaired after the duplicate window, so that each republish stores a
     * message */
    long long last = rt_q(&e.st, "SELECT max(published_at) FROM jsd_outbox_state");
    ASSERT_WAIT(jsd__now_ms() > last + WINDOW_MS + 1000, 10000);
    repaired_ids seen = {.n = 0};
    jsd_verify_report rep = verify_lib(&e, app, true, &seen);
    ASSERT_U64_EQ(rep.checked, ALL_N);
    ASSERT_U64_EQ(rep.missing, n_lost);
    ASSERT_U64_EQ(rep.repaired, n_lost);
    ASSERT_U64_EQ(rep.repaired_in_window, 0);
    ASSERT_SIZE_EQ(seen.n, n_lost);
    for (size_t i = 0; i < n_lost; i++)
        if (!has_id(&seen, ids[i]))
            fail_msg("verify --repair did not repair %s (%s)", lost[i], ids[i]);
    ASSERT_EQ(rt_published(&e.st), ALL_N - (long long)n_lost);
    jsd_store_stats ss;
    ASSERT_OK_E(jsd_store_stats_get(app, &ss), jsd_store_errmsg(app));
    ASSERT_I64_EQ(ss.backlog, (int64_t)n_lost); /* what `jsdurable status` shows */

    /* one relay pass publishes every repaired effect again: none is left
     * without a receipt, and the stream holds each id exactly once */
    relay_pass(&e);
    id_list stranded = {.text = ""};
    rt_rows(&e.st, "SELECT effect_id FROM jsd_outbox_state WHERE stream_seq IS NULL ORDER BY id",
            add_id, &stranded);
    ASSERT_STREQ(stranded.text, "");
    ASSERT_EQ(rt_published(&e.st), ALL_N);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DEAD), 0);
    size_t n = 0;
    rt_msg *m = rt_stream_read(&e.nt, e.stream, &n);
    ASSERT_SIZE_EQ(n, ALL_N);
    for (size_t j = 0; j < n_lost; j++) {
        int seen_j = 0;
        for (size_t i = 0; i < n; i++)
            seen_j += !strcmp(m[i].msg_id, ids[j]);
        if (seen_j != 1)
            fail_msg("repaired effect %s (%s) is in the stream %d times, expected once", lost[j],
                     ids[j], seen_j);
    }
    free(m);
    rt_assert_receipts_match(&e.st, &e.nt, e.stream);

    /* and a second verify finds nothing lost */
    repaired_ids again = {.n = 0};
    rep = verify_lib(&e, app, false, &again);
    ASSERT_U64_EQ(rep.checked, ALL_N);
    ASSERT_U64_EQ(rep.ok, ALL_N);
    ASSERT_U64_EQ(rep.missing + rep.overwritten + rep.expired + rep.stream_gone, 0);
    ASSERT_SIZE_EQ(again.n, 0);
    jsd_store_close(app);
    env_down(&e);
}

static void repair_republishes_all_sqlite(void **state)
{
    (void)state;
    repair_republishes_all(RT_SQLITE);
}

static void repair_republishes_all_pg(void **state)
{
    (void)state;
    repair_republishes_all(RT_PG);
}

/* ---- a repair inside the duplicate window is reported ------------------------------------- */

static void repair_inside_window(void **state)
{
    (void)state;
    env e;
    env_up(&e, RT_SQLITE, 600000);
    jsd_store *app = rt_open(&e.st);
    rt_enqueue_opts q = {.n = 3, .subject = e.subject};
    rt_enqueue(app, &q);
    /* the default relay horizon fits a 10-minute window */
    rt_relay t;
    rt_relay_make(&t, &e.st, e.nats_url, NULL);
    rt_relay_start(&t, true);
    ASSERT_WAIT(rt_relay_done(&t), 60000);
    rt_relay_finish(&t);
    ASSERT_EQ(rt_published(&e.st), 3);
    char id1[128];
    msg_id_of(&e, "e1", id1, sizeof(id1));
    delete_msg(&e, (uint64_t)seq_of(&e, "e1"));

    static char out[65536];
    ASSERT_EQ(verify_cli(&e, "--repair --json", out, sizeof(out)), 1);
    ASSERT_CONTAINS(out, "\"repaired\":1,\"repaired_in_dup_window\":1");
    char want[200];
    snprintf(want, sizeof(want), "\"in_dup_window_msg_ids\":[\"%s\"]", id1);
    ASSERT_CONTAINS(out, want);
    ASSERT_EQ(verify_cli(&e, "", out, sizeof(out)), 0); /* nothing receipted is lost now */
    ASSERT_EQ(verify_cli(&e, "--repair", out, sizeof(out)), 0);
    /* the republish is answered duplicate: a receipt, not a dead letter, and
     * the message stays missing, which the next verify says again */
    rt_relay_make(&t, &e.st, e.nats_url, NULL);
    rt_relay_start(&t, true);
    ASSERT_WAIT(rt_relay_done(&t), 60000);
    rt_relay_finish(&t);
    ASSERT_EQ(rt_published(&e.st), 3);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DEAD), 0);
    ASSERT_EQ(
        rt_q(&e.st, "SELECT count(*) FROM jsd_outbox_state WHERE effect_id = 'e1' AND duplicate"),
        1);
    ASSERT_U64_EQ(rt_stream_count(&e.nt, e.stream), 2);
    ASSERT_EQ(verify_cli(&e, "", out, sizeof(out)), 1);
    ASSERT_CONTAINS(out, "checked 3: ok 2, missing 1");
    jsd_store_close(app);
    env_down(&e);
}

/* ---- a store that lost its receipts ------------------------------------------------------ */

/* Copy the store aside (after=false) or restore the copy (after=true). */
static void store_copy(env *e, bool restore)
{
    char cmd[2400], copy[1100];
    snprintf(copy, sizeof(copy), "%s/store-copy-%s", jsd_test_dir(), e->stream);
    if (e->st.kind == RT_SQLITE) {
        const char *db = e->st.url + strlen("sqlite:");
        sqlite3 *src = NULL, *dst = NULL;
        ASSERT_EQ(sqlite3_open(restore ? copy : db, &src), SQLITE_OK);
        ASSERT_EQ(sqlite3_open(restore ? db : copy, &dst), SQLITE_OK);
        sqlite3_busy_timeout(dst, 5000);
        sqlite3_backup *b = sqlite3_backup_init(dst, "main", src, "main");
        ASSERT_TRUE(b != NULL);
        ASSERT_EQ(sqlite3_backup_step(b, -1), SQLITE_DONE);
        ASSERT_EQ(sqlite3_backup_finish(b), SQLITE_OK);
        sqlite3_close(src);
        sqlite3_close(dst);
        return;
    }
    if (restore)
        snprintf(cmd, sizeof(cmd), "pg_restore --clean --if-exists --no-owner -d '%s' '%s' 2>&1",
                 e->st.url, copy);
    else
        snprintf(cmd, sizeof(cmd), "pg_dump -Fc -d '%s' -f '%s' 2>&1", e->st.url, copy);
    static char out[8192];
    int rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 0)
        fail_msg("`%s` exited %d: %s", cmd, rc, out);
}

static void receipts_lost(rt_backend kind, bool past_window)
{
    env e;
    env_up(&e, kind, past_window ? WINDOW_MS : 600000);
    jsd_store *app = rt_open(&e.st);
    rt_enqueue_opts q = {.n = 4, .subject = e.subject};
    rt_enqueue(app, &q);
    store_copy(&e, false);
    relay_pass(&e);
    int64_t published = jsd_test_mono_ms();
    ASSERT_EQ(rt_published(&e.st), 4);
    ASSERT_U64_EQ(rt_stream_count(&e.nt, e.stream), 4);
    long long seq0 = seq_of(&e, "e0");
    if (past_window) /* the broker forgets the ids */
        ASSERT_WAIT(jsd_test_mono_ms() > published + WINDOW_MS + 500, WINDOW_MS + 5000);

    store_copy(&e, true); /* the receipts are lost: 4 effects pending again */
    ASSERT_EQ(rt_published(&e.st), 0);
    relay_pass(&e);
    ASSERT_EQ(rt_published(&e.st), 4);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DEAD), 0);
    static char out[65536];
    if (!past_window) {
        /* the receipt is the first copy's: the stream holds each once */
        ASSERT_U64_EQ(rt_stream_count(&e.nt, e.stream), 4);
        ASSERT_EQ(seq_of(&e, "e0"), seq0);
        ASSERT_EQ(verify_cli(&e, "", out, sizeof(out)), 0);
        ASSERT_CONTAINS(out, "checked 4: ok 4");
        ASSERT_NOT_CONTAINS(out, "republished");
    } else {
        ASSERT_U64_EQ(rt_stream_count(&e.nt, e.stream), 8);
        ASSERT_EQ(verify_cli(&e, "--json", out, sizeof(out)), 1);
        ASSERT_CONTAINS(out, "\"ok\":4");
        ASSERT_CONTAINS(out, "\"republished\":4");
        char want[200];
        snprintf(want, sizeof(want), "\"other_seq\":%lld", seq0);
        ASSERT_CONTAINS(out, want);
        ASSERT_EQ(verify_cli(&e, "", out, sizeof(out)), 1);
        ASSERT_CONTAINS(out, "republished 4");
        ASSERT_CONTAINS(out, "published again past the duplicate window");
    }
    jsd_store_close(app);
    env_down(&e);
}

static void receipts_lost_inside_window(void **state)
{
    (void)state;
    receipts_lost(RT_SQLITE, false);
}

static void receipts_lost_past_window_sqlite(void **state)
{
    (void)state;
    receipts_lost(RT_SQLITE, true);
}

static void receipts_lost_past_window_pg(void **state)
{
    (void)state;
    receipts_lost(RT_PG, true);
}

/* ---- a stream deleted, then recreated --------------------------------------------------- */

static void stream_gone_and_overwritten(void **state)
{
    (void)state;
    env e;
    env_up(&e, RT_PG, 600000);
    jsd_store *app = rt_open(&e.st);
    rt_enqueue_opts q = {.n = 3, .subject = e.subject};
    rt_enqueue(app, &q);
    rt_relay t;
    rt_relay_make(&t, &e.st, e.nats_url, NULL);
    rt_relay_start(&t, true);
    ASSERT_WAIT(rt_relay_done(&t), 60000);
    rt_relay_finish(&t);
    ASSERT_EQ(rt_published(&e.st), 3);

    jsErrCode jerr = 0;
    ASSERT_EQ(js_DeleteStream(e.nt.js, e.stream, NULL, &jerr), NATS_OK);
    static char out[65536];
    ASSERT_EQ(verify_cli(&e, "--repair", out, sizeof(out)), 1);
    ASSERT_CONTAINS(out, "checked 3: ok 0, missing 0, overwritten 0, expired 0, stream gone 3");
    ASSERT_CONTAINS(out, "repaired 0 ");
    ASSERT_EQ(rt_published(&e.st), 3); /* only missing effects are repaired */

    /* recreated: sequences 1 and 2 now hold other messages, 3 is gone */
    rt_stream_add_with(&e.nt, e.stream, e.filter, 600000, 0);
    for (int i = 0; i < 2; i++) {
        natsMsg *m = NULL;
        ASSERT_EQ(natsMsg_Create(&m, e.subject, NULL, "x", 1), NATS_OK);
        natsMsgHeader_Set(m, "Nats-Msg-Id", i ? "other-2" : "other-1");
        jsPubAck *pa = NULL;
        ASSERT_EQ(js_PublishMsg(&pa, e.nt.js, m, NULL, &jerr), NATS_OK);
        jsPubAck_Destroy(pa);
        natsMsg_Destroy(m);
    }
    ASSERT_EQ(verify_cli(&e, "", out, sizeof(out)), 1);
    ASSERT_CONTAINS(out, "checked 3: ok 0, missing 1, overwritten 2, expired 0, stream gone 0");
    ASSERT_CONTAINS(out, "(holds other-1)");

    /* --repair takes back the overwritten receipts too (it took back only
     * the missing one, leaving two effects out of the stream for good) */
    ASSERT_EQ(verify_cli(&e, "--repair", out, sizeof(out)), 1);
    ASSERT_CONTAINS(out, "repaired 3 ");
    ASSERT_EQ(rt_published(&e.st), 0);
    relay_pass(&e);
    ASSERT_EQ(rt_published(&e.st), 3);
    ASSERT_U64_EQ(rt_stream_count(&e.nt, e.stream), 5);
    ASSERT_EQ(verify_cli(&e, "", out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "checked 3: ok 3, missing 0, overwritten 0, expired 0, stream gone 0");
    jsd_store_close(app);
    env_down(&e);
}

/* ---- bad arguments -------------------------------------------------------------------------- */

static void bad_arguments(void **state)
{
    (void)state;
    env e;
    env_up(&e, RT_SQLITE, 600000);
    jsd_store *app = rt_open(&e.st); /* creates the schema */
    char out[16384];
    ASSERT_EQ(verify_cli(&e, "--help", out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "Example:");
    const struct {
        const char *args, *says;
    } bad[] = {
        {"--batch 0", "--batch takes a number in 1..1000"},
        {"--batch 1001", "--batch takes a number in 1..1000"},
        {"--since soon", "--since takes a duration"},
        {"--since 0", "--since takes a duration"},
        {"extra", "unexpected argument \"extra\""},
        {"--bogus", "unknown option --bogus (see --help)"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ASSERT_EQ(verify_cli(&e, bad[i].args, out, sizeof(out)), 64);
        ASSERT_CONTAINS(out, bad[i].says);
    }
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "JSD_STORE= %s verify --nats %s", jsd_fx_bin("jsdurable"),
             e.nats_url);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 64);
    ASSERT_CONTAINS(out, "no store");
    /* an empty store is clean; --metrics serves while it runs */
    ASSERT_EQ(verify_cli(&e, "--since 1h --metrics 127.0.0.1:0", out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "jsdurable verify: metrics on http://127.0.0.1:0/metrics");
    ASSERT_CONTAINS(out, "checked 0: ok 0");
    jsd_store_close(app);
    env_down(&e);
}

JSD_TEST_MAIN(cmocka_unit_test(finds_and_repairs_sqlite), cmocka_unit_test(finds_and_repairs_pg),
              cmocka_unit_test(repair_republishes_all_sqlite),
              cmocka_unit_test(repair_republishes_all_pg), cmocka_unit_test(repair_inside_window),
              cmocka_unit_test(stream_gone_and_overwritten), cmocka_unit_test(bad_arguments),
              cmocka_unit_test(receipts_lost_inside_window),
              cmocka_unit_test(receipts_lost_past_window_sqlite),
              cmocka_unit_test(receipts_lost_past_window_pg))
