/*
 * The two example programs, run for real: orders commits orders with their
 * outbox effects, `jsdurable relay` publishes them, shipping consumes them
 * through its inbox and emits follow-up effects, a second relay publishes
 * those. Checks the databases and the streams afterwards (SQLite and
 * PostgreSQL for the orders side). And the SQL contract's examples, written
 * without jsdurable's library (examples/python, examples/sql): each run
 * against a store made by `jsdurable migrate`, then the real `jsdurable
 * relay`; the stream must hold each committed effect once, with the msg id
 * jsd_tx_emit would have given, its payload bytes and its headers, and
 * nothing of a rolled-back transaction.
 */
#include <stdlib.h>
#include <unistd.h>

#include <nats/nats.h>

#include "relay_env.h"

static void run_ok(const char *cmd)
{
    static char out[16384];
    int rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 0)
        fail_msg("`%s` exited %d:\n%s", cmd, rc, out);
}

static long long sqlite_count(const char *db, const char *sql)
{
    char cmd[1024], out[256];
    snprintf(cmd, sizeof(cmd), "sqlite3 '%s' '%s'", db, sql);
    if (jsd_test_run(cmd, out, sizeof(out)) != 0)
        fail_msg("`%s` failed: %s", cmd, out);
    return strtoll(out, NULL, 10);
}

static uint64_t stream_msgs(const char *url, const char *stream)
{
    natsConnection *nc = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, url), NATS_OK);
    uint64_t n = jsd_fx_stream_msgs(nc, stream);
    natsConnection_Destroy(nc);
    return n;
}

static const char *example_bin(const char *name)
{
    static char bufs[2][1024];
    static unsigned next;
    char *b = bufs[next++ % 2];
    const char *build = getenv("JSD_BUILD");
    snprintf(b, 1024, "%s/examples/%s", build && *build ? build : "build", name);
    return b;
}

static void orders_to_shipping(const char *orders_store)
{
    jsd_fx_nats fx;
    assert_int_equal(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    const char *J = jsd_fx_bin("jsdurable");
    char top[1024], ship_db[1200], cmd[4096];
    snprintf(top, sizeof(top), "%s", getenv("JSD_TOP") ? getenv("JSD_TOP") : ".");
    snprintf(ship_db, sizeof(ship_db), "%s/shipping.db", jsd_test_dir());
    const int n = 300;

    snprintf(cmd, sizeof(cmd), "%s provision --nats %s --file %s/examples/demo/topology.json", J,
             fx.url, top);
    run_ok(cmd);
    snprintf(cmd, sizeof(cmd), "%s --store '%s' --count %d --per-tx 7", example_bin("orders"),
             orders_store, n);
    run_ok(cmd);
    snprintf(cmd, sizeof(cmd), "%s relay --store '%s' --nats %s --until-idle", J, orders_store,
             fx.url);
    run_ok(cmd);
    ASSERT_EQ(stream_msgs(fx.url, "ORDERS"), n);

    snprintf(cmd, sizeof(cmd), "%s --store 'sqlite:%s' --nats %s --until-idle",
             example_bin("shipping"), ship_db, fx.url);
    run_ok(cmd);
    ASSERT_EQ(sqlite_count(ship_db, "SELECT count(*) FROM shipments"), n);
    ASSERT_EQ(sqlite_count(ship_db, "SELECT count(DISTINCT order_id) FROM shipments"), n);

    snprintf(cmd, sizeof(cmd), "%s relay --store 'sqlite:%s' --nats %s --until-idle", J, ship_db,
             fx.url);
    run_ok(cmd);
    ASSERT_EQ(stream_msgs(fx.url, "SHIPPING"), n);

    /* A second pass of both is a no-op: nothing new is published or shipped. */
    snprintf(cmd, sizeof(cmd), "%s relay --store '%s' --nats %s --until-idle", J, orders_store,
             fx.url);
    run_ok(cmd);
    snprintf(cmd, sizeof(cmd), "%s --store 'sqlite:%s' --nats %s --until-idle",
             example_bin("shipping"), ship_db, fx.url);
    run_ok(cmd);
    ASSERT_EQ(stream_msgs(fx.url, "ORDERS"), n);
    ASSERT_EQ(sqlite_count(ship_db, "SELECT count(*) FROM shipments"), n);
    jsd_fx_nats_stop(&fx);
}

static void examples_sqlite(void **state)
{
    (void)state;
    char url[1200];
    snprintf(url, sizeof(url), "sqlite:%s/orders.db", jsd_test_dir());
    orders_to_shipping(url);
}

static void examples_postgres(void **state)
{
    (void)state;
    char url[1024];
    assert_int_equal(jsd_fx_pg_database(url, sizeof(url)), 0);
    orders_to_shipping(url);
}

/* ---- the SQL contract's examples ------------------------------------------------------ */

typedef struct want_msg {
    char owner[64], id[32], payload[128], trace[32];
    int seen;
} want_msg;

static const char *python3(void)
{
    /* Debian's interpreter, the one python3-psycopg2 (scripts/deps.sh) is for */
    return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

static const char *top_dir(void)
{
    const char *t = getenv("JSD_TOP");
    return t && *t ? t : ".";
}

/* The stream holds exactly the n wanted messages: each once, under the msg id
 * jsd_effect_msg_id gives under ns, with its payload and X-Trace header. */
static void assert_stream(rt_nats *nt, const char *stream, const char *ns, want_msg *w, int n)
{
    ASSERT_EQ(rt_stream_count(nt, stream), (uint64_t)n);
    for (uint64_t seq = 1; seq <= (uint64_t)n; seq++) {
        natsMsg *m = NULL;
        jsErrCode jerr = 0;
        ASSERT_EQ(js_GetMsg(&m, nt->js, stream, seq, NULL, &jerr), NATS_OK);
        const char *mid = NULL, *trace = NULL;
        ASSERT_EQ(natsMsgHeader_Get(m, "Nats-Msg-Id", &mid), NATS_OK);
        want_msg *hit = NULL;
        for (int i = 0; i < n && !hit; i++) {
            char id[JSD_MSG_ID_MAX];
            ASSERT_OK(jsd_effect_msg_id(ns, w[i].owner, w[i].id, id));
            if (!strcmp(id, mid))
                hit = &w[i];
        }
        if (!hit)
            fail_msg("stream %s seq %llu has msg id %s, which no committed effect has", stream,
                     (unsigned long long)seq, mid);
        hit->seen++;
        ASSERT_EQ(natsMsg_GetDataLength(m), (int)strlen(hit->payload));
        ASSERT_TRUE(memcmp(natsMsg_GetData(m), hit->payload, strlen(hit->payload)) == 0);
        ASSERT_EQ(natsMsgHeader_Get(m, "X-Trace", &trace), NATS_OK);
        ASSERT_STREQ(trace, hit->trace);
        natsMsg_Destroy(m);
    }
    for (int i = 0; i < n; i++)
        if (w[i].seen != 1)
            fail_msg("effect %s/%s is in the stream %d times", w[i].owner, w[i].id, w[i].seen);
}

static void store_ns(const char *url, char ns[JSD_NAMESPACE_MAX + 1])
{
    jsd_store *s = NULL;
    jsd_error err;
    ASSERT_OK(jsd_store_open(&s, url, &err), err.msg);
    snprintf(ns, JSD_NAMESPACE_MAX + 1, "%s", jsd_store_namespace(s));
    jsd_store_close(s);
}

typedef struct contract_run {
    rt_nats nt;
    char stream[64], subject[96], url[1024];
    const char *J, *nats;
} contract_run;

static void contract_up(contract_run *r, const char *url)
{
    memset(r, 0, sizeof(*r));
    r->J = jsd_fx_bin("jsdurable");
    r->nats = jsd_fx_shared_nats_url();
    char root[64], filter[80], cmd[2400];
    snprintf(r->stream, sizeof(r->stream), "%s", jsd_test_unique("EXAMPLE"));
    snprintf(root, sizeof(root), "%s", jsd_test_unique("example"));
    snprintf(filter, sizeof(filter), "%s.>", root);
    snprintf(r->subject, sizeof(r->subject), "%s.orders.created", root);
    snprintf(r->url, sizeof(r->url), "%s", url);
    rt_nats_open(&r->nt, r->nats);
    rt_stream_add(&r->nt, r->stream, filter);
    snprintf(cmd, sizeof(cmd), "%s migrate --store '%s'", r->J, url);
    run_ok(cmd);
}

static void relay_idle(contract_run *r)
{
    char cmd[2400];
    snprintf(cmd, sizeof(cmd), "%s relay --store '%s' --nats %s --until-idle", r->J, r->url,
             r->nats);
    run_ok(cmd);
}

static void orders_want(want_msg *w, int n)
{
    for (int i = 0; i < n; i++) {
        memset(&w[i], 0, sizeof(w[i]));
        snprintf(w[i].owner, sizeof(w[i].owner), "order-%d", i + 1);
        snprintf(w[i].id, sizeof(w[i].id), "created");
        snprintf(w[i].payload, sizeof(w[i].payload), "{\"order_id\":%d}", i + 1);
        snprintf(w[i].trace, sizeof(w[i].trace), "trace-%d", i + 1);
    }
}

static void python_sqlite(void **state)
{
    (void)state;
    contract_run r;
    char url[1200], cmd[4096], ns[JSD_NAMESPACE_MAX + 1];
    static char out[16384];
    snprintf(url, sizeof(url), "sqlite:%s/py-orders.db", jsd_test_dir());
    contract_up(&r, url);
    snprintf(cmd, sizeof(cmd), "%s %s/examples/python/orders_sqlite.py '%s' %s 5", python3(),
             top_dir(), url + strlen("sqlite:"), r.subject);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "committed order 5");
    ASSERT_CONTAINS(out, "rolled back order rejected");
    ASSERT_CONTAINS(out, "refused: CHECK constraint failed: jsd_outbox_subject_exact");
    relay_idle(&r);
    store_ns(url, ns);
    want_msg w[5];
    orders_want(w, 5);
    assert_stream(&r.nt, r.stream, ns, w, 5);
    /* the orders committed with their effects */
    snprintf(cmd, sizeof(cmd), "sqlite3 '%s' 'SELECT count(*) FROM orders'",
             url + strlen("sqlite:"));
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    ASSERT_EQ(strtol(out, NULL, 10), 5);
    relay_idle(&r); /* once: a second relay finds nothing */
    ASSERT_EQ(rt_stream_count(&r.nt, r.stream), 5);
    rt_nats_close(&r.nt);
}

static void python_pg(void **state)
{
    (void)state;
    contract_run r;
    char url[1024], cmd[4096], ns[JSD_NAMESPACE_MAX + 1];
    static char out[16384];
    assert_int_equal(jsd_fx_pg_database(url, sizeof(url)), 0);
    contract_up(&r, url);
    snprintf(cmd, sizeof(cmd), "%s %s/examples/python/orders_pg.py '%s' public %s 5", python3(),
             top_dir(), url, r.subject);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "rolled back order rejected");
    ASSERT_CONTAINS(out, "refused: ERROR:  jsd_emit: effect (owner 'order-1', id 'created') "
                         "already exists");
    store_ns(url, ns);
    /* jsd_emit answered each order's msg id */
    for (int i = 1; i <= 5; i++) {
        char owner[32], id[JSD_MSG_ID_MAX], line[128];
        snprintf(owner, sizeof(owner), "order-%d", i);
        ASSERT_OK(jsd_effect_msg_id(ns, owner, "created", id));
        snprintf(line, sizeof(line), "%d %s\n", i, id);
        ASSERT_CONTAINS(out, line);
    }
    relay_idle(&r);
    want_msg w[5];
    orders_want(w, 5);
    assert_stream(&r.nt, r.stream, ns, w, 5);
    relay_idle(&r);
    ASSERT_EQ(rt_stream_count(&r.nt, r.stream), 5);
    rt_nats_close(&r.nt);
}

static void sql_psql(void **state)
{
    (void)state;
    contract_run r;
    char url[1024], cmd[4096], ns[JSD_NAMESPACE_MAX + 1];
    static char out[16384];
    assert_int_equal(jsd_fx_pg_database(url, sizeof(url)), 0);
    contract_up(&r, url);
    snprintf(cmd, sizeof(cmd),
             "psql -X -q '%s' -v ON_ERROR_STOP=1 -v subject=%s -f %s/examples/sql/emit.sql", url,
             r.subject, top_dir());
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    store_ns(url, ns);
    char want_id[JSD_MSG_ID_MAX];
    ASSERT_OK(jsd_effect_msg_id(ns, "invoice-inv-1", "issued", want_id));
    ASSERT_CONTAINS(out, want_id); /* psql printed what jsd_emit returned */
    relay_idle(&r);
    want_msg w[2] = {{.owner = "invoice-inv-1",
                      .id = "issued",
                      .payload = "{\"invoice\":\"inv-1\",\"amount_cents\":4200}",
                      .trace = "psql-1"},
                     {.owner = "invoice-inv-3",
                      .id = "issued",
                      .payload = "{\"invoice\":\"inv-3\",\"amount_cents\":990}",
                      .trace = "psql-3"}};
    assert_stream(&r.nt, r.stream, ns, w, 2);
    rt_nats_close(&r.nt);
}

JSD_TEST_MAIN(cmocka_unit_test(examples_sqlite), cmocka_unit_test(examples_postgres),
              cmocka_unit_test(python_sqlite), cmocka_unit_test(python_pg),
              cmocka_unit_test(sql_psql))
