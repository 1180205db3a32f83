/*
 * bench_ingress — durable ingress throughput against the raw client ceiling
 * (issue 6's figures).
 *
 *   bench_ingress [NATS_URL]      (default $JSD_BENCH_NATS_URL; PostgreSQL
 *                                  figures when $JSD_BENCH_PG_URL is set)
 *
 * Prints one `NAME VALUE UNIT` line per figure on stdout:
 *   raw.fetch_ack V msg/s          nats.c alone: fetch(256) + natsMsg_Ack per
 *                                  message on a SendAsap connection, 100k
 *                                  messages of 256 bytes, until the server
 *                                  reports none pending and none unacked
 *   ingress.sqlite V msg/s         the jsdurable consumer (default batch: 512 for
 *                                  max_ack_pending 1024; BENCH_INGRESS_BATCH): a handler
 *                                  INSERTs each payload into a fresh SQLite
 *                                  store, inbox row in the same transaction,
 *                                  commit, pipelined confirmed ACKs; same 100k
 *   ingress.postgres V msg/s       the same on a fresh PostgreSQL database
 *   ingress.sqlite.ratio V x       ingress.sqlite / raw.fetch_ack (same run)
 *   ingress.postgres.ratio V x
 * Each figure is the median of 3 runs. Each ingress run checks that the table
 * holds exactly one row per message and the durable has nothing pending or
 * unacknowledged, so a fast but lossy run cannot report a figure.
 * BENCH_INGRESS_MESSAGES overrides 100000. Notes go to stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <nats/nats.h>
#include <sqlite3.h>

#include "jsdurable.h"

#define PAYLOAD 256
#define RUNS    3

static const char *nats_url;
static natsConnection *nc;
static jsCtx *js;
static int n_msgs = 100000;
static char tmpdir[512];

static int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "bench_ingress: %s: %s\n", what, detail ? detail : "");
    exit(1);
}

static void check(natsStatus s, const char *what)
{
    if (s != NATS_OK)
        die(what, natsStatus_GetText(s));
}

/* A fresh stream with n messages of PAYLOAD bytes and a durable on it. */
static void fill(const char *stream, const char *durable)
{
    jsStreamConfig sc;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    char subj[96];
    const char *subjects[1] = {subj};
    snprintf(subj, sizeof(subj), "bi.%s.>", stream);
    jsStreamConfig_Init(&sc);
    sc.Name = stream;
    sc.Subjects = subjects;
    sc.SubjectsLen = 1;
    sc.Storage = js_FileStorage;
    check(js_AddStream(&si, js, &sc, NULL, &jerr), "add stream");
    jsStreamInfo_Destroy(si);

    char payload[PAYLOAD];
    memset(payload, 'p', sizeof(payload));
    jsPubOptions po;
    jsPubOptions_Init(&po);
    snprintf(subj, sizeof(subj), "bi.%s.x", stream);
    for (int k = 0; k < n_msgs; k++) {
        char id[32];
        snprintf(id, sizeof(id), "%d", k);
        po.MsgId = id;
        check(js_PublishAsync(js, subj, payload, PAYLOAD, &po), "publish");
    }
    jsPubOptions_Init(&po);
    po.MaxWait = 120000;
    check(js_PublishAsyncComplete(js, &po), "publish complete");

    jsConsumerConfig cc;
    jsConsumerInfo *ci = NULL;
    jsConsumerConfig_Init(&cc);
    cc.Durable = durable;
    cc.AckPolicy = js_AckExplicit;
    cc.AckWait = 30LL * 1000000000;
    cc.MaxDeliver = 6;
    cc.MaxAckPending = 1024;
    check(js_AddConsumer(&ci, js, stream, &cc, NULL, &jerr), "add consumer");
    jsConsumerInfo_Destroy(ci);
}

static bool settled(const char *stream, const char *durable)
{
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    if (js_GetConsumerInfo(&ci, js, stream, durable, NULL, &jerr) != NATS_OK)
        return false;
    bool ok = ci->NumPending == 0 && ci->NumAckPending == 0;
    jsConsumerInfo_Destroy(ci);
    return ok;
}

static double raw_fetch_ack(int run)
{
    char stream[64], durable[32] = "raw";
    snprintf(stream, sizeof(stream), "BIRAW_%d_%d", (int)getpid(), run);
    fill(stream, durable);
    natsSubscription *sub = NULL;
    jsSubOptions so;
    jsErrCode jerr = 0;
    jsSubOptions_Init(&so);
    so.Stream = stream;
    so.Consumer = durable;
    check(js_PullSubscribe(&sub, js, NULL, durable, NULL, &so, &jerr), "pull subscribe");
    int got = 0;
    int64_t t0 = mono_us();
    while (got < n_msgs) {
        natsMsgList list = {0};
        natsStatus s = natsSubscription_Fetch(&list, sub, 256, 500, &jerr);
        if (s == NATS_TIMEOUT)
            continue;
        check(s, "fetch");
        for (int i = 0; i < list.Count; i++)
            check(natsMsg_Ack(list.Msgs[i], NULL), "ack");
        got += list.Count;
        natsMsgList_Destroy(&list);
    }
    check(natsConnection_Flush(nc), "flush");
    while (!settled(stream, durable))
        usleep(1000);
    double rate = n_msgs / ((mono_us() - t0) / 1e6);
    natsSubscription_Destroy(sub);
    js_DeleteStream(js, stream, NULL, NULL);
    return rate;
}

/* ---- the consumer with an INSERT handler ------------------------------------------- */

typedef struct sink {
    sqlite3 *db;
    sqlite3_stmt *st;
    bool pg_prepared;
} sink;

static jsd_disposition insert(jsd_tx *tx, const jsd_delivery *d, void *user)
{
    sink *k = user;
    size_t len = 0;
    const void *p = jsd_delivery_payload(d, &len);
    sqlite3 *db = jsd_tx_sqlite(tx);
    if (db) {
        if (!k->st || k->db != db) {
            sqlite3_finalize(k->st);
            k->st = NULL;
            if (sqlite3_prepare_v3(db, "INSERT INTO effects(seq, body) VALUES (?1, ?2)", -1,
                                   SQLITE_PREPARE_PERSISTENT, &k->st, NULL) != SQLITE_OK)
                return jsd_disposition_retry(0, sqlite3_errmsg(db));
            k->db = db;
        }
        sqlite3_bind_int64(k->st, 1, (sqlite3_int64)jsd_delivery_stream_seq(d));
        sqlite3_bind_blob(k->st, 2, p, (int)len, SQLITE_STATIC);
        int rc = sqlite3_step(k->st);
        sqlite3_reset(k->st);
        return rc == SQLITE_DONE ? jsd_disposition_commit()
                                 : jsd_disposition_retry(0, sqlite3_errmsg(db));
    }
    PGconn *pg = jsd_tx_pg(tx);
    if (!k->pg_prepared) {
        PGresult *r = PQprepare(pg, "bench_insert",
                                "INSERT INTO effects(seq, body) VALUES ($1, $2)", 0, NULL);
        k->pg_prepared = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
    }
    char seq[24];
    snprintf(seq, sizeof(seq), "%llu", (unsigned long long)jsd_delivery_stream_seq(d));
    const char *vals[2] = {seq, p};
    int lens[2] = {0, (int)len}, fmts[2] = {0, 1};
    PGresult *r = PQexecPrepared(pg, "bench_insert", 2, vals, lens, fmts, 0);
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    return ok ? jsd_disposition_commit() : jsd_disposition_retry(0, "insert failed");
}

static long long count_rows(jsd_store *s)
{
    jsd_tx *tx = NULL;
    long long v = -1;
    if (jsd_tx_begin(&tx, s) != JSD_OK)
        return -1;
    if (jsd_tx_sqlite(tx)) {
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(jsd_tx_sqlite(tx), "SELECT COUNT(*) FROM effects", -1, &st, NULL) ==
                SQLITE_OK &&
            sqlite3_step(st) == SQLITE_ROW)
            v = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
    } else {
        PGresult *r = PQexec(jsd_tx_pg(tx), "SELECT COUNT(*) FROM effects");
        if (PQresultStatus(r) == PGRES_TUPLES_OK)
            v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        PQclear(r);
    }
    jsd_tx_rollback(tx);
    return v;
}

static double ingress(const char *store_url, int run, bool pg)
{
    char stream[64], durable[32] = "sink", dlq[80], dsubj[128];
    jsd_error err;
    jsd_store *store = NULL;
    jsd_conn *conn = NULL;
    jsd_consumer *c = NULL;
    sink k = {0};

    snprintf(stream, sizeof(stream), "BI%s_%d_%d", pg ? "PG" : "SQ", (int)getpid(), run);
    snprintf(dlq, sizeof(dlq), "%s_DLQ", stream);
    fill(stream, durable);
    /* its dead-letter stream */
    jsStreamConfig sc;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    const char *subjects[1] = {dsubj};
    snprintf(dsubj, sizeof(dsubj), "jsd.dlq.%s.>", stream);
    jsStreamConfig_Init(&sc);
    sc.Name = dlq;
    sc.Subjects = subjects;
    sc.SubjectsLen = 1;
    sc.Storage = js_FileStorage;
    check(js_AddStream(&si, js, &sc, NULL, &jerr), "add dlq stream");
    jsStreamInfo_Destroy(si);

    jsd_error_clear(&err);
    if (jsd_store_open(&store, store_url, &err) != JSD_OK)
        die("store open", err.msg);
    jsd_tx *tx = NULL;
    if (jsd_tx_begin(&tx, store) != JSD_OK)
        die("begin", jsd_store_errmsg(store));
    if (jsd_tx_sqlite(tx)) {
        sqlite3_exec(jsd_tx_sqlite(tx), "DROP TABLE IF EXISTS effects", NULL, NULL, NULL);
        sqlite3_exec(jsd_tx_sqlite(tx), "CREATE TABLE effects(seq BIGINT, body BLOB)", NULL, NULL,
                     NULL);
    } else {
        PQclear(PQexec(jsd_tx_pg(tx), "DROP TABLE IF EXISTS effects"));
        PQclear(PQexec(jsd_tx_pg(tx), "CREATE TABLE effects(seq BIGINT, body BYTEA)"));
    }
    if (jsd_tx_commit(tx) != JSD_OK)
        die("create table", jsd_store_errmsg(store));
    if (pg) {
        /* a fresh inbox per run */
        if (jsd_tx_begin(&tx, store) == JSD_OK) {
            PQclear(PQexec(jsd_tx_pg(tx), "DELETE FROM jsd_inbox"));
            jsd_tx_commit(tx);
        }
    }

    jsd_conn_opts co;
    jsd_conn_opts_init(&co);
    co.servers = nats_url;
    if (jsd_conn_open(&conn, &co, &err) != JSD_OK)
        die("conn open", err.msg);
    jsd_consumer_opts o;
    jsd_consumer_opts_init(&o);
    o.stream = stream;
    o.durable = durable;
    o.batch =
        getenv("BENCH_INGRESS_BATCH") ? (int)strtol(getenv("BENCH_INGRESS_BATCH"), NULL, 10) : 0;
    o.inbox_retention_ms = 0;
    if (jsd_consumer_create(&c, store, conn, &o, &err) != JSD_OK)
        die("consumer create", err.msg);

    int64_t t0 = mono_us();
    jsd_consumer_stats s = {0};
    while (s.committed < (uint64_t)n_msgs) {
        if (jsd_consumer_poll(c, insert, &k, NULL) != JSD_OK)
            die("poll", jsd_consumer_errmsg(c));
        jsd_consumer_stats_get(c, &s);
    }
    while (!settled(stream, durable))
        usleep(1000);
    double rate = n_msgs / ((mono_us() - t0) / 1e6);
    jsd_consumer_stats_get(c, &s);
    long long rows = count_rows(store);
    if (rows != n_msgs || s.ack_unconfirmed || s.duplicates)
        die("check", "rows, confirmations or duplicates do not match the messages");
    fprintf(stderr, "bench_ingress: %s run %d: %.0f msg/s, %llu batches, %llu acked\n",
            pg ? "postgres" : "sqlite", run, rate, (unsigned long long)s.batches,
            (unsigned long long)s.acked);
    jsd_consumer_destroy(c);
    sqlite3_finalize(k.st);
    jsd_conn_close(conn);
    jsd_store_close(store);
    js_DeleteStream(js, stream, NULL, NULL);
    js_DeleteStream(js, dlq, NULL, NULL);
    return rate;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median3(double v[RUNS])
{
    qsort(v, RUNS, sizeof(double), cmp);
    return v[RUNS / 2];
}

int main(int argc, char **argv)
{
    nats_url = argc > 1 ? argv[1] : getenv("JSD_BENCH_NATS_URL");
    if (!nats_url || !*nats_url)
        die("usage", "bench_ingress NATS_URL (or $JSD_BENCH_NATS_URL)");
    const char *n = getenv("BENCH_INGRESS_MESSAGES");
    if (n && strtol(n, NULL, 10) > 0)
        n_msgs = (int)strtol(n, NULL, 10);
    const char *pg_url = getenv("JSD_BENCH_PG_URL");

    natsOptions *no = NULL;
    check(natsOptions_Create(&no), "options");
    check(natsOptions_SetURL(no, nats_url), "url");
    check(natsOptions_SetSendAsap(no, true), "send asap");
    check(natsConnection_Connect(&nc, no), "connect");
    natsOptions_Destroy(no);
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.PublishAsync.MaxPending = 4096;
    jo.PublishAsync.StallWait = 30000;
    check(natsConnection_JetStream(&js, nc, &jo), "jetstream");
    snprintf(tmpdir, sizeof(tmpdir), "%s/jsd-bench-ingress.XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmpdir))
        die("mkdtemp", tmpdir);

    double raw[RUNS], sq[RUNS], pgv[RUNS];
    for (int r = 0; r < RUNS; r++)
        raw[r] = raw_fetch_ack(r);
    double raw_m = median3(raw);
    printf("raw.fetch_ack %.0f msg/s\n", raw_m);
    fflush(stdout);
    for (int r = 0; r < RUNS; r++) {
        char url[700];
        snprintf(url, sizeof(url), "sqlite:%s/ingress-%d.db", tmpdir, r);
        sq[r] = ingress(url, r, false);
    }
    double sq_m = median3(sq);
    printf("ingress.sqlite %.0f msg/s\n", sq_m);
    printf("ingress.sqlite.ratio %.2f x\n", sq_m / raw_m);
    fflush(stdout);
    if (pg_url && *pg_url) {
        for (int r = 0; r < RUNS; r++)
            pgv[r] = ingress(pg_url, r, true);
        double pg_m = median3(pgv);
        printf("ingress.postgres %.0f msg/s\n", pg_m);
        printf("ingress.postgres.ratio %.2f x\n", pg_m / raw_m);
    } else {
        fprintf(stderr, "bench_ingress: no $JSD_BENCH_PG_URL: PostgreSQL figures skipped\n");
    }
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_ingress: could not remove %s\n", tmpdir);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    return 0;
}
