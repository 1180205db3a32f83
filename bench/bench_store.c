/*
 * Store throughput: rows committed per second by enqueue-style transactions
 * (jsd_tx_emit, one effect per transaction and 256 per transaction) next to
 * the plain single-row INSERT of the same database in the same run, so the
 * library's cost is visible against the database's own ceiling.
 *
 * Prints `NAME VALUE UNIT` lines:
 *   store.sqlite.insert_1       plain INSERT, 1 row per transaction (WAL, synchronous=FULL)
 *   store.sqlite.insert_256     plain INSERT, 256 rows per transaction
 *   store.sqlite.enqueue_1      jsd_tx_emit, 1 effect per transaction
 *   store.sqlite.enqueue_256    jsd_tx_emit_batch, 256 effects per transaction
 *   store.postgres.*            the same on PostgreSQL when JSD_BENCH_PG_URL is set, plus
 *                               insert_1_tx (BEGIN; INSERT; COMMIT: the round trips an
 *                               application transaction has anyway) and
 *                               enqueue_256_each (256 jsd_tx_emit calls, one round trip each)
 * Each figure runs for about BENCH_STORE_SECONDS (default 5) seconds in all,
 * in 5 slices interleaved with the other figures, with 256-byte payloads. SQLite files live in a
 * temporary folder removed at the end; PostgreSQL work happens in a schema of its own, dropped at
 * the end.
 */
#include <libpq-fe.h>
#include <stdbool.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "jsdurable.h"

static double seconds = 5.0;
static char payload[256];

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Figures are measured in ROUNDS interleaved slices (each figure runs one
 * slice per round), so a load change on a shared machine hits them alike. */
#define ROUNDS 5
typedef struct figure {
    char name[64];
    double rows, secs;
} figure;
static figure figures[16];
static int n_figures;

static void report(const char *backend, const char *name, double rows, double secs)
{
    char full[64];
    snprintf(full, sizeof(full), "store.%s.%s", backend, name);
    for (int i = 0; i < n_figures; i++)
        if (!strcmp(figures[i].name, full)) {
            figures[i].rows += rows;
            figures[i].secs += secs;
            return;
        }
    if (n_figures < 16) {
        snprintf(figures[n_figures].name, sizeof(figures[0].name), "%s", full);
        figures[n_figures].rows = rows;
        figures[n_figures].secs = secs;
        n_figures++;
    }
}

static void print_figures(void)
{
    for (int i = 0; i < n_figures; i++)
        printf("%s %.0f rows/s\n", figures[i].name, figures[i].rows / figures[i].secs);
    fflush(stdout);
    n_figures = 0;
}

static int fail(const char *what, const char *why)
{
    fprintf(stderr, "bench_store: %s: %s\n", what, why);
    return 1;
}

/* ---- plain inserts ------------------------------------------------------------------- */

static int sqlite_plain(const char *path, int per_tx)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    if (sqlite3_open(path, &db) != SQLITE_OK)
        return fail("sqlite open", sqlite3_errmsg(db));
    sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;", NULL, NULL, NULL);
    sqlite3_exec(db,
                 "CREATE TABLE IF NOT EXISTS plain (id INTEGER PRIMARY KEY, k TEXT NOT NULL, "
                 "v BLOB NOT NULL)",
                 NULL, NULL, NULL);
    if (sqlite3_prepare_v2(db, "INSERT INTO plain (k, v) VALUES (?1, ?2)", -1, &st, NULL) !=
        SQLITE_OK)
        return fail("sqlite prepare", sqlite3_errmsg(db));
    long rows = 0;
    double t0 = now_s(), t;
    char k[32];
    do {
        sqlite3_exec(db, "BEGIN", NULL, NULL, NULL);
        for (int i = 0; i < per_tx; i++) {
            snprintf(k, sizeof(k), "k%ld", rows + i);
            sqlite3_bind_text(st, 1, k, -1, SQLITE_TRANSIENT);
            sqlite3_bind_blob(st, 2, payload, sizeof(payload), SQLITE_STATIC);
            if (sqlite3_step(st) != SQLITE_DONE)
                return fail("sqlite insert", sqlite3_errmsg(db));
            sqlite3_reset(st);
        }
        if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
            return fail("sqlite commit", sqlite3_errmsg(db));
        rows += per_tx;
    } while ((t = now_s() - t0) < seconds);
    report("sqlite", per_tx == 1 ? "insert_1" : "insert_256", (double)rows, t);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return 0;
}

static int pg_exec(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    if (!ok)
        fprintf(stderr, "bench_store: %s: %s", sql, PQerrorMessage(c));
    PQclear(r);
    return ok ? 0 : 1;
}

static int pg_plain(const char *url, const char *schema, int per_tx, bool explicit_tx)
{
    PGconn *c = PQconnectdb(url);
    if (PQstatus(c) != CONNECTION_OK)
        return fail("postgres connect", PQerrorMessage(c));
    char sql[4096];
    pg_exec(c, "SET client_min_messages = warning");
    snprintf(sql, sizeof(sql),
             "CREATE TABLE IF NOT EXISTS %s.plain (id BIGINT GENERATED ALWAYS AS IDENTITY "
             "PRIMARY KEY, k TEXT NOT NULL, v BYTEA NOT NULL)",
             schema);
    if (pg_exec(c, sql))
        return 1;
    /* One statement per transaction: a multi-row INSERT for 256. */
    size_t o = (size_t)snprintf(sql, sizeof(sql), "INSERT INTO %s.plain (k, v) VALUES ", schema);
    for (int i = 0; i < per_tx; i++)
        o += (size_t)snprintf(sql + o, sizeof(sql) - o, "%s($%d, $%d)", i ? ", " : "", 2 * i + 1,
                              2 * i + 2);
    PGresult *pr = PQprepare(c, "plain", sql, 0, NULL);
    if (PQresultStatus(pr) != PGRES_COMMAND_OK)
        return fail("postgres prepare", PQerrorMessage(c));
    PQclear(pr);
    const char *vals[512];
    int lens[512], fmts[512];
    char keys[256][32];
    long rows = 0;
    double t0 = now_s(), t;
    do {
        for (int i = 0; i < per_tx; i++) {
            snprintf(keys[i], sizeof(keys[i]), "k%ld", rows + i);
            vals[2 * i] = keys[i];
            lens[2 * i] = 0;
            fmts[2 * i] = 0;
            vals[2 * i + 1] = payload;
            lens[2 * i + 1] = sizeof(payload);
            fmts[2 * i + 1] = 1;
        }
        if (explicit_tx && pg_exec(c, "BEGIN"))
            return 1;
        PGresult *r = PQexecPrepared(c, "plain", 2 * per_tx, vals, lens, fmts, 0);
        if (PQresultStatus(r) != PGRES_COMMAND_OK)
            return fail("postgres insert", PQerrorMessage(c));
        PQclear(r);
        if (explicit_tx && pg_exec(c, "COMMIT"))
            return 1;
        rows += per_tx;
    } while ((t = now_s() - t0) < seconds);
    report("postgres", per_tx == 1 ? (explicit_tx ? "insert_1_tx" : "insert_1") : "insert_256",
           (double)rows, t);
    PQfinish(c);
    return 0;
}

/* ---- enqueue ------------------------------------------------------------------------- */

static int enqueue(const char *backend, const char *url, int per_tx, bool batch_call,
                   const char *name)
{
    jsd_store *s = NULL;
    jsd_error e;
    if (jsd_store_open(&s, url, &e) != JSD_OK)
        return fail("open", e.msg);
    jsd_effect eff[256];
    char ids[256][32];
    long rows = 0;
    static int run_no;
    run_no++;
    double t0 = now_s(), t;
    do {
        jsd_tx *tx;
        if (jsd_tx_begin(&tx, s) != JSD_OK)
            return fail("begin", jsd_store_errmsg(s));
        for (int i = 0; i < per_tx; i++) {
            snprintf(ids[i], sizeof(ids[i]), "r%d-%ld", run_no, rows + i);
            eff[i] = (jsd_effect){.owner = "bench",
                                  .id = ids[i],
                                  .subject = "bench.store",
                                  .payload = payload,
                                  .len = sizeof(payload)};
            if (!batch_call && jsd_tx_emit(tx, &eff[i]) != JSD_OK)
                return fail("emit", jsd_store_errmsg(s));
        }
        if (batch_call && jsd_tx_emit_batch(tx, eff, (size_t)per_tx, NULL) != JSD_OK)
            return fail("emit", jsd_store_errmsg(s));
        if (jsd_tx_commit(tx) != JSD_OK)
            return fail("commit", jsd_store_errmsg(s));
        rows += per_tx;
    } while ((t = now_s() - t0) < seconds);
    report(backend, name, (double)rows, t);
    jsd_store_close(s);
    return 0;
}

int main(void)
{
    const char *secs = getenv("BENCH_STORE_SECONDS");
    if (secs && atof(secs) > 0)
        seconds = atof(secs);
    for (size_t i = 0; i < sizeof(payload); i++)
        payload[i] = (char)('a' + i % 26);
    int rc = 0;

    char dir[] = "/tmp/jsd-bench-store.XXXXXX";
    if (!mkdtemp(dir))
        return fail("mkdtemp", "cannot create a temporary folder");
    char plain[256], url[300];
    snprintf(plain, sizeof(plain), "%s/plain.db", dir);
    snprintf(url, sizeof(url), "sqlite:%s/store.db", dir);
    fprintf(stderr, "bench_store: SQLite %s in %s (WAL, synchronous=FULL), %.1f s per figure\n",
            sqlite3_libversion(), dir, seconds);
    double total = seconds;
    seconds = total / ROUNDS;
    for (int r = 0; r < ROUNDS && rc == 0; r++) {
        rc |= sqlite_plain(plain, 1);
        rc |= enqueue("sqlite", url, 1, false, "enqueue_1");
        rc |= sqlite_plain(plain, 256);
        rc |= enqueue("sqlite", url, 256, true, "enqueue_256");
    }
    print_figures();
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_store: could not remove %s\n", dir);

    const char *pg = getenv("JSD_BENCH_PG_URL");
    if (!pg || !*pg) {
        fprintf(stderr, "bench_store: JSD_BENCH_PG_URL is not set; no PostgreSQL figures\n");
        return rc;
    }
    char schema[64], pgurl[1024], sql[200];
    snprintf(schema, sizeof(schema), "jsd_bench_%ld", (long)getpid());
    snprintf(pgurl, sizeof(pgurl), "%s%sschema=%s", pg, strchr(pg, '?') ? "&" : "?", schema);
    PGconn *c = PQconnectdb(pg);
    if (PQstatus(c) != CONNECTION_OK)
        return fail("postgres connect", PQerrorMessage(c));
    pg_exec(c, "SET client_min_messages = warning");
    snprintf(sql, sizeof(sql), "CREATE SCHEMA %s", schema);
    if (pg_exec(c, sql))
        return 1;
    fprintf(stderr, "bench_store: PostgreSQL %d, schema %s\n", PQserverVersion(c), schema);
    for (int r = 0; r < ROUNDS && rc == 0; r++) {
        rc |= pg_plain(pg, schema, 1, false);
        rc |= pg_plain(pg, schema, 1, true);
        rc |= enqueue("postgres", pgurl, 1, false, "enqueue_1");
        rc |= pg_plain(pg, schema, 256, false);
        rc |= enqueue("postgres", pgurl, 256, true, "enqueue_256");
        rc |= enqueue("postgres", pgurl, 256, false, "enqueue_256_each");
    }
    print_figures();
    snprintf(sql, sizeof(sql), "DROP SCHEMA %s CASCADE", schema);
    rc |= pg_exec(c, sql);
    PQfinish(c);
    return rc;
}
