/*
 * The relay against rows and streams it cannot serve as asked, on a real
 * nats-server and both store back ends: a headers column the decoder refuses
 * and an unpublishable subject are dead-lettered with their reason while the
 * other rows flow; a permanent broker error (10054, message over the stream's
 * max_msg_size) dead-letters at once; a PubAck that says duplicate on a first
 * attempt is dead-lettered and counted, while the duplicate of a retry after
 * an expired lease is a receipt; a stream whose duplicate window is shorter
 * than the retry horizon stops the relay with an error; `gc` takes its floor
 * from the server's windows; `relay --until-idle` says in its exit status
 * what it left unpublished. Bad rows are made with raw SQL through the native
 * drivers.
 */
#include "relay_env.h"

typedef struct fx_env {
    rt_store st;
    rt_nats nt;
    const char *nats_url;
    char stream[64];
    char root[64];
    char filter[80];
    char subject[100];
} fx_env;

static void env_up(fx_env *e, rt_backend kind, int64_t window_ms, int32_t max_msg_size)
{
    memset(e, 0, sizeof(*e));
    rt_store_new(&e->st, kind);
    e->nats_url = jsd_fx_shared_nats_url();
    snprintf(e->stream, sizeof(e->stream), "%s", jsd_test_unique("RFAULT"));
    snprintf(e->root, sizeof(e->root), "%s", jsd_test_unique("rfault"));
    snprintf(e->filter, sizeof(e->filter), "%s.>", e->root);
    snprintf(e->subject, sizeof(e->subject), "%s.a", e->root);
    rt_nats_open(&e->nt, e->nats_url);
    rt_stream_add_with(&e->nt, e->stream, e->filter, window_ms, max_msg_size);
}

static void env_down(fx_env *e)
{
    rt_nats_close(&e->nt);
    rt_store_close(&e->st);
}

/* Raw SQL on the store (a writer connection of its own for SQLite). */
static void sql_exec(rt_store *st, const char *sql)
{
    if (st->kind == RT_SQLITE) {
        sqlite3 *db = NULL;
        const char *path = st->url + strlen("sqlite:");
        ASSERT_EQ(sqlite3_open(path, &db), SQLITE_OK);
        sqlite3_busy_timeout(db, 5000);
        char *msg = NULL;
        if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK)
            fail_msg("%s: %s", sql, msg ? msg : "?");
        sqlite3_close(db);
    } else {
        rt_reader(st);
        PGresult *res = PQexec(st->pg, sql);
        if (PQresultStatus(res) != PGRES_COMMAND_OK)
            fail_msg("%s: %s", sql, PQerrorMessage(st->pg));
        PQclear(res);
    }
}

/* One effect with the header Trace-Id: trace. */
static void emit1_traced(jsd_store *s, const char *owner, const char *id, const char *subject,
                         const char *order_key, const void *payload, size_t len, const char *trace)
{
    jsd_tx *tx = NULL;
    ASSERT_OK_E(jsd_tx_begin(&tx, s), jsd_store_errmsg(s));
    jsd_header h[] = {{"Trace-Id", trace}};
    jsd_effect ef = {.owner = owner,
                     .id = id,
                     .subject = subject,
                     .headers = h,
                     .n_headers = 1,
                     .payload = payload,
                     .len = len,
                     .order_key = order_key};
    ASSERT_OK_E(jsd_tx_emit(tx, &ef), jsd_store_errmsg(s));
    ASSERT_OK_E(jsd_tx_commit(tx), jsd_store_errmsg(s));
}

static void emit1(jsd_store *s, const char *owner, const char *id, const char *subject,
                  const char *order_key, const void *payload, size_t len)
{
    emit1_traced(s, owner, id, subject, order_key, payload, len, "t-1");
}

static jsd_relay_opts quick_opts(void)
{
    jsd_relay_opts o;
    jsd_relay_opts_init(&o);
    o.poll_interval_ms = 200;
    o.publish_deadline_ms = 20000;
    o.lease_ms = 25000;
    o.backoff_base_ms = 50;
    o.backoff_cap_ms = 200;
    return o;
}

/* Run the relay until idle in a thread; fail if it is not idle within ms. */
static jsd_status run_idle_within(rt_relay *t, int64_t ms)
{
    rt_relay_start(t, true);
    int64_t end = jsd_test_mono_ms() + ms;
    while (!rt_relay_done(t) && jsd_test_mono_ms() < end)
        jsd_test_sleep_ms(20);
    bool done = rt_relay_done(t);
    if (!done)
        jsd_relay_stop(t->relay);
    pthread_join(t->th, NULL);
    t->th = 0;
    if (!done)
        fail_msg("the relay was not idle after %lld ms (last error: %s)", (long long)ms,
                 jsd_relay_errmsg(t->relay));
    return t->rc;
}

/* ---- defect 3: one bad row never stops the others ------------------------------------- */

static void bad_rows_are_dead_lettered(rt_backend kind)
{
    fx_env e;
    env_up(&e, kind, 600000, 0);
    jsd_store *app = rt_open(&e.st);
    char id[32];
    for (int i = 0; i < 5; i++) {
        snprintf(id, sizeof(id), "g%d", i);
        emit1(app, "o", id, e.subject, NULL, id, strlen(id));
    }
    emit1(app, "o", "bad-h", e.subject, NULL, "x", 1);
    emit1(app, "o", "bad-s", e.subject, NULL, "x", 1);
    /* the head of an ordering key is bad: the rest of its key must still flow */
    emit1(app, "o", "k0", e.subject, "key", "k0", 2);
    emit1(app, "o", "k1", e.subject, "key", "k1", 2);
    emit1(app, "o", "k2", e.subject, "key", "k2", 2);
    if (kind == RT_SQLITE)
        sql_exec(&e.st, "UPDATE jsd_outbox SET headers = X'FFFF01' WHERE effect_id = 'bad-h'");
    else
        sql_exec(&e.st, "UPDATE jsd_outbox SET headers = '\\xffff01'::bytea "
                        "WHERE effect_id = 'bad-h'");
    /* a writer past the schema's checks (docs/SQL-CONTRACT.md): SQLite's
     * turned off; PostgreSQL checks inserts only */
    if (kind == RT_SQLITE)
        sql_exec(&e.st, "PRAGMA ignore_check_constraints = ON; UPDATE jsd_outbox SET subject = "
                        "'orders py' WHERE effect_id IN ('bad-s', 'k0')");
    else
        sql_exec(&e.st, "UPDATE jsd_outbox SET subject = 'orders py' "
                        "WHERE effect_id IN ('bad-s', 'k0')");

    jsd_metrics *mx = NULL;
    ASSERT_OK(jsd_metrics_create(&mx, NULL));
    jsd_relay_opts o = quick_opts();
    o.metrics = mx;
    rt_relay t;
    rt_relay_make(&t, &e.st, e.nats_url, &o);
    ASSERT_OK(run_idle_within(&t, 30000));

    ASSERT_EQ(rt_published(&e.st), 7);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DEAD), 3);
    ASSERT_EQ(rt_stream_count(&e.nt, e.stream), 7);
    ASSERT_EQ(rt_q(&e.st,
                   "SELECT max(attempts) FROM jsd_outbox_state WHERE dead_lettered_at IS NOT "
                   "NULL"),
              1);
    char reason[1200];
    rt_qs(&e.st, "SELECT dead_reason FROM jsd_outbox_state WHERE effect_id = 'bad-h'", reason,
          sizeof(reason));
    ASSERT_CONTAINS(reason, "headers column");
    rt_qs(&e.st, "SELECT dead_reason FROM jsd_outbox_state WHERE effect_id = 'bad-s'", reason,
          sizeof(reason));
    ASSERT_CONTAINS(reason, "orders py");
    rt_qs(&e.st, "SELECT dead_reason FROM jsd_outbox_state WHERE effect_id = 'k0'", reason,
          sizeof(reason));
    ASSERT_CONTAINS(reason, "orders py");
    /* the key's other effects were published in their order */
    ASSERT_TRUE(rt_q(&e.st, "SELECT stream_seq FROM jsd_outbox_state WHERE effect_id = 'k1'") <
                rt_q(&e.st, "SELECT stream_seq FROM jsd_outbox_state WHERE effect_id = 'k2'"));
    double v = -1;
    ASSERT_OK(jsd_metrics_get(mx, "jsd_relay_dead_lettered_total", NULL, &v));
    ASSERT_EQ(v, 3);
    jsd_relay_stats rs;
    jsd_relay_stats_get(t.relay, &rs);
    ASSERT_EQ(rs.dead_lettered, 3);
    ASSERT_EQ(rs.left_dead_lettered, 3);
    ASSERT_EQ(rs.left_failing, 0);
    rt_relay_finish(&t);

    char cmd[1200], out[8192];
    snprintf(cmd, sizeof(cmd), "%s status --store '%s'", jsd_fx_bin("jsdurable"), e.st.url);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "dead-lettered    3");
    jsd_metrics_destroy(mx);
    jsd_store_close(app);
    env_down(&e);
}

static void bad_rows_sqlite(void **state)
{
    (void)state;
    bad_rows_are_dead_lettered(RT_SQLITE);
}
static void bad_rows_pg(void **state)
{
    (void)state;
    bad_rows_are_dead_lettered(RT_PG);
}

/* ---- defect 7: a permanent broker error dead-letters at once --------------------------- */

static void permanent_error(rt_backend kind)
{
    fx_env e;
    env_up(&e, kind, 600000, 256);
    jsd_store *app = rt_open(&e.st);
    static char big[1000];
    memset(big, 'b', sizeof(big));
    emit1(app, "o", "big", e.subject, "key", big, sizeof(big));
    emit1(app, "o", "small", e.subject, "key", "s", 1);
    jsd_relay_opts o = quick_opts();
    rt_relay t;
    rt_relay_make(&t, &e.st, e.nats_url, &o);
    ASSERT_OK(run_idle_within(&t, 30000));
    ASSERT_EQ(rt_q(&e.st, "SELECT attempts FROM jsd_outbox_state WHERE effect_id = 'big'"), 1);
    ASSERT_EQ(rt_q(&e.st, "SELECT count(*) FROM jsd_outbox_state WHERE effect_id = 'big' AND "
                          "dead_lettered_at IS NOT NULL"),
              1);
    char reason[1200];
    rt_qs(&e.st, "SELECT dead_reason FROM jsd_outbox_state WHERE effect_id = 'big'", reason,
          sizeof(reason));
    ASSERT_CONTAINS(reason, "10054");
    ASSERT_EQ(rt_q(&e.st, "SELECT count(*) FROM jsd_outbox_state WHERE effect_id = 'small' AND "
                          "stream_seq IS NOT NULL"),
              1);
    ASSERT_EQ(rt_stream_count(&e.nt, e.stream), 1);
    rt_relay_finish(&t);
    jsd_store_close(app);
    env_down(&e);
}

static void permanent_error_sqlite(void **state)
{
    (void)state;
    permanent_error(RT_SQLITE);
}
static void permanent_error_pg(void **state)
{
    (void)state;
    permanent_error(RT_PG);
}

/* ---- defect 2: a duplicate on the first attempt is its own outcome --------------------- */

/* The store at in->url, opened under the operator's namespace "shared-ns"
 * (out has no native reader: read through in). Two stores given one
 * namespace is the operator's mistake that still makes ids collide. */
static void shared_namespace(const rt_store *in, rt_store *out)
{
    memset(out, 0, sizeof(*out));
    out->kind = in->kind;
    int n = snprintf(out->url, sizeof(out->url), "%s%snamespace=shared-ns", in->url,
                     strchr(in->url, '?') ? "&" : "?");
    if (n < 0 || (size_t)n >= sizeof(out->url))
        fail_msg("store URL too long for a namespace parameter");
}

/* One relay over the store at st until idle: its counts. */
static jsd_relay_stats relay_once(const fx_env *e, const rt_store *st, const jsd_relay_opts *o)
{
    rt_relay t;
    rt_relay_make(&t, st, e->nats_url, o);
    ASSERT_OK(run_idle_within(&t, 30000));
    jsd_relay_stats rs;
    jsd_relay_stats_get(t.relay, &rs);
    rt_relay_finish(&t);
    return rs;
}

/* The one effect in e's store met its own earlier publication: a receipt
 * counted as a duplicate, nothing dead-lettered, nothing flagged. */
static void own_duplicate_is_the_receipt(fx_env *e, const rt_store *st, const jsd_relay_opts *o)
{
    jsd_relay_stats rs = relay_once(e, st, o);
    ASSERT_EQ(rs.first_attempt_duplicates, 0);
    ASSERT_EQ(rs.published, 1);
    ASSERT_EQ(rs.duplicates, 1);
    ASSERT_EQ(rt_q(&e->st, RT_SQL_DEAD), 0);
    ASSERT_EQ(rt_q(&e->st, RT_SQL_DUPLICATES), 1);
    ASSERT_EQ(rt_q(&e->st, "SELECT stream_seq FROM jsd_outbox_state"), 1);
}

static void first_attempt_duplicate(rt_backend kind)
{
    fx_env e;
    env_up(&e, kind, 600000, 0);
    /* Store A publishes order-1/created first; both stores are given the
     * same namespace, so their ids for it are equal. */
    rt_store a, a_ns, b_ns;
    rt_store_new(&a, RT_SQLITE);
    shared_namespace(&a, &a_ns);
    shared_namespace(&e.st, &b_ns);
    jsd_store *sa = rt_open(&a_ns);
    emit1(sa, "order-1", "created", e.subject, NULL, "from-a", 6);
    jsd_relay_opts o = quick_opts();
    (void)relay_once(&e, &a_ns, &o);
    ASSERT_EQ(rt_published(&a), 1);

    /* Store B (the case's back end) holds the same (owner, id): its message is
     * not in the stream, and the relay says so. */
    jsd_store *sb = rt_open(&b_ns);
    emit1(sb, "order-1", "created", e.subject, NULL, "from-b", 6);
    jsd_metrics *mx = NULL;
    ASSERT_OK(jsd_metrics_create(&mx, NULL));
    o.metrics = mx;
    jsd_relay_stats rs = relay_once(&e, &b_ns, &o);
    ASSERT_EQ(rs.first_attempt_duplicates, 1);
    ASSERT_EQ(rs.published, 0);
    double v = -1;
    ASSERT_OK(jsd_metrics_get(mx, "jsd_relay_first_attempt_duplicates_total", NULL, &v));
    ASSERT_EQ(v, 1);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DEAD), 1);
    char reason[1200], cmd[1200], out[8192];
    rt_qs(&e.st, "SELECT dead_reason FROM jsd_outbox_state", reason, sizeof(reason));
    ASSERT_CONTAINS(reason, "duplicate on first attempt");
    ASSERT_CONTAINS(reason, e.stream);
    ASSERT_CONTAINS(reason, "sequence 1");
    ASSERT_CONTAINS(reason, "its payload differs");
    snprintf(cmd, sizeof(cmd), "%s status --store '%s'", jsd_fx_bin("jsdurable"), e.st.url);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "first-attempt duplicates 1");
    ASSERT_EQ(rt_stream_count(&e.nt, e.stream), 1);

    /* A retry after a relay died holding the lease (lease_token left behind,
     * lease expired) is a legitimate duplicate: a receipt, not flagged. */
    sql_exec(&e.st, "DELETE FROM jsd_outbox");
    emit1(sb, "order-1", "created", e.subject, NULL, "from-b", 6);
    sql_exec(&e.st, "UPDATE jsd_outbox SET lease_token = 'crashed-relay', lease_expires = 1");
    jsd_metrics_destroy(mx);
    mx = NULL;
    ASSERT_OK(jsd_metrics_create(&mx, NULL));
    o.metrics = mx;
    own_duplicate_is_the_receipt(&e, &b_ns, &o);

    /* A claim that did not survive (an asynchronous PostgreSQL commit lost
     * in a server crash, an SQLite host's crash) leaves no mark on an effect
     * a relay did publish: its retry looks like a first attempt. The stream's
     * message at that sequence is this effect's own (same id, subject,
     * payload, headers), so the duplicate is its receipt. */
    sql_exec(&e.st, "DELETE FROM jsd_outbox");
    emit1(sb, "order-1", "created", e.subject, NULL, "from-a", 6);
    own_duplicate_is_the_receipt(&e, &b_ns, &o);

    /* The same payload under another header value is not its message. */
    sql_exec(&e.st, "DELETE FROM jsd_outbox");
    emit1_traced(sb, "order-1", "created", e.subject, NULL, "from-a", 6, "t-2");
    rs = relay_once(&e, &b_ns, &o);
    ASSERT_EQ(rs.first_attempt_duplicates, 1);
    ASSERT_EQ(rs.published, 0);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DEAD), 1);
    rt_qs(&e.st, "SELECT dead_reason FROM jsd_outbox_state", reason, sizeof(reason));
    ASSERT_CONTAINS(reason, "its headers differ");
    ASSERT_EQ(rt_stream_count(&e.nt, e.stream), 1);

    jsd_metrics_destroy(mx);
    jsd_store_close(sb);
    jsd_store_close(sa);
    rt_store_close(&a);
    env_down(&e);
}

static void first_attempt_duplicate_sqlite(void **state)
{
    (void)state;
    first_attempt_duplicate(RT_SQLITE);
}
static void first_attempt_duplicate_pg(void **state)
{
    (void)state;
    first_attempt_duplicate(RT_PG);
}

/* ---- defect 6: the retry horizon must fit the duplicate window ------------------------- */

static void window_too_short(void **state)
{
    (void)state;
    fx_env e;
    env_up(&e, RT_SQLITE, 2000, 0);
    jsd_store *app = rt_open(&e.st);
    emit1(app, "o", "w1", e.subject, NULL, "w", 1);
    jsd_relay_opts o = quick_opts();
    o.publish_deadline_ms = 5000;
    o.lease_ms = 6000;
    rt_relay t;
    rt_relay_make(&t, &e.st, e.nats_url, &o);
    ASSERT_EQ(run_idle_within(&t, 30000), JSD_ERR_CONFIG);
    const char *msg = jsd_relay_errmsg(t.relay);
    ASSERT_CONTAINS(msg, e.stream);
    ASSERT_CONTAINS(msg, "2000 ms");
    ASSERT_CONTAINS(msg, "11400 ms"); /* 5000 + 200 + 6000 + poll 200 */
    rt_relay_finish(&t);
    /* nothing was sent, nothing spent, nothing dead-lettered */
    ASSERT_EQ(rt_stream_count(&e.nt, e.stream), 0);
    ASSERT_EQ(rt_q(&e.st, "SELECT count(*) FROM jsd_outbox_state WHERE published_at IS NULL AND "
                          "dead_lettered_at IS NULL AND attempts = 0 AND lease_token IS NULL"),
              1);

    char cmd[1400], out[8192];
    snprintf(cmd, sizeof(cmd),
             "%s relay --store '%s' --nats %s --until-idle --deadline-ms 5000 --lease-ms 6000",
             jsd_fx_bin("jsdurable"), e.st.url, e.nats_url);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 78);
    ASSERT_CONTAINS(out, "duplicate window");
    ASSERT_CONTAINS(out, e.stream);
    /* timings that fit publish it */
    snprintf(cmd, sizeof(cmd),
             "%s relay --store '%s' --nats %s --until-idle --deadline-ms 300 --lease-ms 1300 "
             "--poll-ms 100 --backoff-ms 50:200", /* horizon 1900 ms, under the 2 s window */
             jsd_fx_bin("jsdurable"), e.st.url, e.nats_url);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    ASSERT_EQ(rt_published(&e.st), 1);
    jsd_store_close(app);
    env_down(&e);
}

static void gc_floor_from_server(void **state)
{
    (void)state;
    fx_env e;
    env_up(&e, RT_SQLITE, 15 * 60000, 0); /* a 15-minute window */
    jsd_store *app = rt_open(&e.st);
    char cmd[1400], out[8192];
    const char *bin = jsd_fx_bin("jsdurable");
    /* without a server and without a stated window gc does not guess */
    snprintf(cmd, sizeof(cmd), "JSD_NATS_URL= %s gc --store '%s' --older-than 10m", bin, e.st.url);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 78);
    ASSERT_CONTAINS(out, "duplicate window is unknown");
    /* the server's windows: 10 minutes is under this stream's 15 */
    snprintf(cmd, sizeof(cmd), "%s gc --store '%s' --nats %s --older-than 10m", bin, e.st.url,
             e.nats_url);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 78);
    ASSERT_CONTAINS(out, "duplicate window");
    ASSERT_CONTAINS(out, "stream ");
    /* JetStream's longest window is 7 days: 8 days passes */
    snprintf(cmd, sizeof(cmd), "%s gc --store '%s' --nats %s --older-than 8d", bin, e.st.url,
             e.nats_url);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "removed 0 rows");
    jsd_store_close(app);
    env_down(&e);
}

/* ---- item 8: --until-idle says what it left ------------------------------------------- */

static void until_idle_exit_status(void **state)
{
    (void)state;
    fx_env e;
    env_up(&e, RT_SQLITE, 600000, 0);
    jsd_store *app = rt_open(&e.st);
    char nostream[128];
    snprintf(nostream, sizeof(nostream), "%s.a", jsd_test_unique("nostream"));
    emit1(app, "o", "lost", nostream, NULL, "x", 1);
    emit1(app, "o", "fine", e.subject, NULL, "x", 1);
    const char *bin = jsd_fx_bin("jsdurable");
    char cmd[1400], out[8192];
    /* no stream captures "lost": it fails and waits a minute for its retry */
    snprintf(cmd, sizeof(cmd),
             "%s relay --store '%s' --nats %s --until-idle --backoff-ms 60000:60000 "
             "--budget 1000 --stats",
             bin, e.st.url, e.nats_url);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 75);
    ASSERT_CONTAINS(out, "not everything was published");
    ASSERT_CONTAINS(out, "left unpublished after failures: 1");
    ASSERT_CONTAINS(out, "\"left_failing\":1");
    ASSERT_EQ(rt_published(&e.st), 1);
    /* an unpublishable row is dead-lettered: exit 1 */
    emit1(app, "o", "bad", e.subject, NULL, "x", 1);
    sql_exec(&e.st, "PRAGMA ignore_check_constraints = ON; "
                    "UPDATE jsd_outbox SET subject = 'orders py' WHERE effect_id = 'bad'");
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 1);
    ASSERT_CONTAINS(out, "dead-lettered 1 by this run");
    jsd_store_close(app);
    env_down(&e);
}

JSD_TEST_MAIN(cmocka_unit_test(bad_rows_sqlite), cmocka_unit_test(bad_rows_pg),
              cmocka_unit_test(permanent_error_sqlite), cmocka_unit_test(permanent_error_pg),
              cmocka_unit_test(first_attempt_duplicate_sqlite),
              cmocka_unit_test(first_attempt_duplicate_pg), cmocka_unit_test(window_too_short),
              cmocka_unit_test(gc_floor_from_server), cmocka_unit_test(until_idle_exit_status))
