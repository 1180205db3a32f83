/*
 * orders — publish in a transaction.
 *
 * The orders service of the demo: each order row and the outbox effect that
 * announces it commit in ONE store transaction, so either both exist or
 * neither does. The relay (`jsdurable relay`) later publishes the effect to
 * JetStream with a Nats-Msg-Id derived from (owner, effect id).
 *
 *   orders --store URL [--count N] [--first K] [--per-tx B] [--rate R]
 *
 * Commits orders K..K+N-1, B orders per transaction, at most R orders per
 * second (0: as fast as the store allows). Prints one line when done.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>
#include <sqlite3.h>

#include "jsdurable.h"

static const char *const CREATE_SQL =
    "CREATE TABLE IF NOT EXISTS orders (id BIGINT PRIMARY KEY, customer TEXT NOT NULL, "
    "amount_cents BIGINT NOT NULL)";

/* The application's own SQL, on the transaction's native handle. */
static int app_exec(jsd_tx *tx, const char *sql, long long id, const char *customer,
                    long long amount)
{
    sqlite3 *db = jsd_tx_sqlite(tx);
    if (db) {
        sqlite3_stmt *st = NULL;
        int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
        if (rc == SQLITE_OK && id >= 0) {
            sqlite3_bind_int64(st, 1, id);
            sqlite3_bind_text(st, 2, customer, -1, SQLITE_STATIC);
            sqlite3_bind_int64(st, 3, amount);
        }
        if (rc == SQLITE_OK)
            rc = sqlite3_step(st);
        sqlite3_finalize(st);
        if (rc != SQLITE_DONE) {
            fprintf(stderr, "orders: %s\n", sqlite3_errmsg(db));
            return -1;
        }
        return 0;
    }
    PGconn *pg = jsd_tx_pg(tx);
    char ids[32], amounts[32];
    snprintf(ids, sizeof(ids), "%lld", id);
    snprintf(amounts, sizeof(amounts), "%lld", amount);
    const char *params[3] = {ids, customer, amounts};
    PGresult *r =
        PQexecParams(pg, sql, id >= 0 ? 3 : 0, NULL, id >= 0 ? params : NULL, NULL, NULL, 0);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok)
        fprintf(stderr, "orders: %s", PQresultErrorMessage(r));
    PQclear(r);
    return ok ? 0 : -1;
}

static long long arg_num(const char *flag, const char *v)
{
    char *end = NULL;
    long long n = strtoll(v, &end, 10);
    if (!*v || *end || n < 0) {
        fprintf(stderr, "orders: %s needs a non-negative number\n", flag);
        exit(64);
    }
    return n;
}

int main(int argc, char **argv)
{
    const char *url = NULL;
    long long count = 100, first = 1, per_tx = 10, rate = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--store"))
            url = argv[i + 1];
        else if (!strcmp(argv[i], "--count"))
            count = arg_num(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--first"))
            first = arg_num(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--per-tx"))
            per_tx = arg_num(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--rate"))
            rate = arg_num(argv[i], argv[i + 1]);
    }
    if (!url || per_tx < 1) {
        fprintf(stderr,
                "usage: orders --store URL [--count N] [--first K] [--per-tx B] [--rate R]\n");
        return 64;
    }

    jsd_error err;
    jsd_store *store = NULL;
    if (jsd_store_open(&store, url, &err) != JSD_OK) {
        fprintf(stderr, "orders: %s\n", err.msg);
        return 73;
    }
    jsd_tx *tx = NULL;
    if (jsd_tx_begin(&tx, store) != JSD_OK || app_exec(tx, CREATE_SQL, -1, NULL, 0) != 0 ||
        jsd_tx_commit(tx) != JSD_OK) {
        fprintf(stderr, "orders: cannot create the orders table: %s\n", jsd_store_errmsg(store));
        jsd_store_close(store);
        return 73;
    }

    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long long done = 0;
    while (done < count) {
        if (jsd_tx_begin(&tx, store) != JSD_OK)
            break;
        long long n = count - done < per_tx ? count - done : per_tx;
        int failed = 0;
        for (long long k = 0; k < n && !failed; k++) {
            long long id = first + done + k;
            char customer[32], owner[48], payload[160];
            snprintf(customer, sizeof(customer), "customer-%lld", id % 97);
            snprintf(owner, sizeof(owner), "order-%lld", id);
            int len = snprintf(payload, sizeof(payload),
                               "{\"order_id\":%lld,\"customer\":\"%s\",\"amount_cents\":%lld}", id,
                               customer, 100 + id % 9000);
            jsd_header type = {"Jsd-Type", "order.created"};
            jsd_effect e = {.owner = owner,
                            .id = "created",
                            .subject = "orders.created",
                            .headers = &type,
                            .n_headers = 1,
                            .payload = payload,
                            .len = (size_t)len};
            failed = app_exec(tx,
                              jsd_tx_sqlite(tx) ? "INSERT INTO orders VALUES (?1, ?2, ?3)"
                                                : "INSERT INTO orders VALUES ($1, $2, $3)",
                              id, customer, 100 + id % 9000) != 0 ||
                     jsd_tx_emit(tx, &e) != JSD_OK;
        }
        if (failed) {
            fprintf(stderr, "orders: %s\n", jsd_store_errmsg(store));
            jsd_tx_rollback(tx);
            break;
        }
        if (jsd_tx_commit(tx) != JSD_OK) {
            fprintf(stderr, "orders: commit failed: %s\n", jsd_store_errmsg(store));
            break;
        }
        done += n;
        if (rate > 0) { /* pace: done orders should take done/rate seconds */
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            double elapsed = (double)(now.tv_sec - t0.tv_sec) + (now.tv_nsec - t0.tv_nsec) / 1e9;
            double ahead = (double)done / (double)rate - elapsed;
            if (ahead > 0) {
                struct timespec d = {(time_t)ahead, (long)((ahead - (time_t)ahead) * 1e9)};
                nanosleep(&d, NULL);
            }
        }
    }
    jsd_store_close(store);
    printf("orders: committed %lld orders with their outbox effects\n", done);
    return done == count ? 0 : 1;
}
