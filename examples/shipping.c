/*
 * shipping — consume with a handler.
 *
 * The shipping service of the demo: a durable pull consumer on the ORDERS
 * stream. For each order.created delivery the handler, inside the store
 * transaction that also records the delivery in the inbox, inserts a
 * shipment row and emits a follow-up outbox effect (shipping.scheduled).
 * jsdurable acknowledges the delivery only after that transaction commits,
 * and a redelivery finds the inbox row instead of shipping twice. The
 * shipments table deliberately has no unique key: once-only comes from the
 * inbox, not from the application's schema.
 *
 *   shipping --store URL --nats URL [--stream ORDERS] [--durable shipping]
 *            [--until-idle]
 *
 * SIGTERM or SIGINT drains: no new fetches, deliveries in hand are settled.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <libpq-fe.h>
#include <sqlite3.h>

#include "jsdurable.h"

static const char *const CREATE_SQL =
    "CREATE TABLE IF NOT EXISTS shipments (order_id BIGINT NOT NULL, stream_seq BIGINT NOT NULL)";

static int app_exec(jsd_tx *tx, const char *sql, long long a, long long b, int nparams)
{
    sqlite3 *db = jsd_tx_sqlite(tx);
    if (db) {
        sqlite3_stmt *st = NULL;
        int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
        if (rc == SQLITE_OK && nparams == 2) {
            sqlite3_bind_int64(st, 1, a);
            sqlite3_bind_int64(st, 2, b);
        }
        if (rc == SQLITE_OK)
            rc = sqlite3_step(st);
        sqlite3_finalize(st);
        return rc == SQLITE_DONE ? 0 : -1;
    }
    char as[32], bs[32];
    snprintf(as, sizeof(as), "%lld", a);
    snprintf(bs, sizeof(bs), "%lld", b);
    const char *params[2] = {as, bs};
    PGresult *r =
        PQexecParams(jsd_tx_pg(tx), sql, nparams, NULL, nparams ? params : NULL, NULL, NULL, 0);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    return ok ? 0 : -1;
}

/* The handler: runs inside the delivery's savepoint of the batch transaction. */
static jsd_disposition ship(jsd_tx *tx, const jsd_delivery *d, void *user)
{
    (void)user;
    size_t len = 0;
    const char *body = jsd_delivery_payload(d, &len);
    json_error_t jerr;
    json_t *order = json_loadb(body, len, 0, &jerr);
    json_t *idv = order ? json_object_get(order, "order_id") : NULL;
    if (!json_is_integer(idv)) {
        json_decref(order);
        return jsd_disposition_poison("order.created without an integer order_id");
    }
    long long order_id = (long long)json_integer_value(idv);
    json_decref(order);

    if (app_exec(tx,
                 jsd_tx_sqlite(tx) ? "INSERT INTO shipments VALUES (?1, ?2)"
                                   : "INSERT INTO shipments VALUES ($1, $2)",
                 order_id, (long long)jsd_delivery_stream_seq(d), 2) != 0)
        return jsd_disposition_retry(1000, "cannot insert the shipment");

    char owner[48], payload[96];
    snprintf(owner, sizeof(owner), "shipment-%lld", order_id);
    int n = snprintf(payload, sizeof(payload), "{\"order_id\":%lld,\"carrier\":\"demo-post\"}",
                     order_id);
    jsd_header type = {"Jsd-Type", "shipment.scheduled"};
    jsd_effect e = {.owner = owner,
                    .id = "scheduled",
                    .subject = "shipping.scheduled",
                    .headers = &type,
                    .n_headers = 1,
                    .payload = payload,
                    .len = (size_t)n};
    if (jsd_tx_emit(tx, &e) != JSD_OK)
        return jsd_disposition_retry(1000, "cannot emit the follow-up effect");
    return jsd_disposition_commit();
}

static jsd_consumer *the_consumer;

static void *signal_thread(void *arg)
{
    sigset_t *set = arg;
    int sig = 0;
    if (sigwait(set, &sig) == 0 && the_consumer)
        jsd_consumer_begin_drain(the_consumer);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *store_url = NULL, *nats_url = NULL, *stream = "ORDERS", *durable = "shipping";
    bool until_idle = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--until-idle"))
            until_idle = true;
        else if (i + 1 < argc && !strcmp(argv[i], "--store"))
            store_url = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--nats"))
            nats_url = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--stream"))
            stream = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--durable"))
            durable = argv[++i];
    }
    if (!store_url || !nats_url) {
        fprintf(stderr, "usage: shipping --store URL --nats URL [--stream S] [--durable D] "
                        "[--until-idle]\n");
        return 64;
    }

    /* Block SIGTERM/SIGINT in every thread; one thread waits for them. */
    static sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    pthread_t sig_tid;
    pthread_create(&sig_tid, NULL, signal_thread, &set);
    pthread_detach(sig_tid);

    jsd_error err;
    jsd_store *store = NULL;
    jsd_conn *conn = NULL;
    int rc = 1;
    if (jsd_store_open(&store, store_url, &err) != JSD_OK) {
        fprintf(stderr, "shipping: %s\n", err.msg);
        return 73;
    }
    jsd_tx *tx = NULL;
    if (jsd_tx_begin(&tx, store) != JSD_OK || app_exec(tx, CREATE_SQL, 0, 0, 0) != 0 ||
        jsd_tx_commit(tx) != JSD_OK) {
        fprintf(stderr, "shipping: cannot create the shipments table\n");
        goto out;
    }

    jsd_conn_opts co;
    jsd_conn_opts_init(&co);
    co.servers = nats_url;
    co.name = "shipping";
    if (jsd_conn_open(&conn, &co, &err) != JSD_OK) {
        fprintf(stderr, "shipping: %s\n", err.msg);
        rc = 69;
        goto out;
    }

    static const char *const types[] = {"order.created"};
    jsd_consumer_opts o;
    jsd_consumer_opts_init(&o);
    o.stream = stream;
    o.durable = durable;
    o.accept_types = types;
    o.n_accept_types = 1;
    o.payload_format = JSD_PAYLOAD_JSON;
    if (jsd_consumer_create(&the_consumer, store, conn, &o, &err) != JSD_OK) {
        fprintf(stderr, "shipping: %s\n", err.msg);
        rc = 78;
        goto out;
    }
    jsd_status s = jsd_consumer_run(the_consumer, ship, NULL, until_idle);
    jsd_consumer_stats st;
    jsd_consumer_stats_get(the_consumer, &st);
    printf("shipping: %llu committed, %llu duplicates skipped by the inbox, %llu poisoned\n",
           (unsigned long long)st.committed, (unsigned long long)st.duplicates,
           (unsigned long long)st.poisoned);
    if (s != JSD_OK)
        fprintf(stderr, "shipping: %s\n", jsd_consumer_errmsg(the_consumer));
    rc = s == JSD_OK ? 0 : 1;
out:
    jsd_consumer_destroy(the_consumer);
    the_consumer = NULL;
    jsd_conn_close(conn);
    jsd_store_close(store);
    jsd_conn_shutdown(2000); /* nats.c's threads end before the process does */
    return rc;
}
