/*
 * The two example programs, run for real: orders commits orders with their
 * outbox effects, `jsdurable relay` publishes them, shipping consumes them
 * through its inbox and emits follow-up effects, a second relay publishes
 * those. Checks the databases and the streams afterwards (SQLite and
 * PostgreSQL for the orders side).
 */
#include <stdlib.h>

#include <nats/nats.h>

#include "fixture.h"
#include "test.h"

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

JSD_TEST_MAIN(cmocka_unit_test(examples_sqlite), cmocka_unit_test(examples_postgres))
