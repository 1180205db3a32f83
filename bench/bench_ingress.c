/*
 * bench_ingress — durable ingress throughput against the raw client ceilings
 * (issue 6's and issue 12's figures).
 *
 *   bench_ingress [NATS_URL]      (default $JSD_BENCH_NATS_URL; PostgreSQL
 *                                  figures when $JSD_BENCH_PG_URL is set)
 *
 * Prints one `NAME VALUE UNIT` line per figure on stdout:
 *   raw.fetch_ack V msg/s          nats.c alone: fetch(256) + natsMsg_Ack per
 *                                  message (fire and forget) on a SendAsap
 *                                  connection, 100k messages of 256 bytes,
 *                                  until the server reports none pending and
 *                                  none unacked
 *   raw.fetch_ackack V msg/s       the confirmed-ACK ceiling: the same fetch,
 *                                  each ACK a request with a reply subject
 *                                  under one inbox, every confirmation
 *                                  awaited (a batch's replies are collected
 *                                  after the next fetch went out, as the
 *                                  library's consumer overlaps them)
 *   ingress.sqlite V msg/s         the jsdurable consumer (default batch: 512 for
 *                                  max_ack_pending 1024; BENCH_INGRESS_BATCH): a
 *                                  per-message handler INSERTs each payload into
 *                                  a fresh SQLite store, inbox rows in the same
 *                                  transaction, commit, pipelined confirmed
 *                                  ACKs; same 100k
 *   ingress.postgres V msg/s       the same on a fresh PostgreSQL database with
 *                                  a batch handler (jsd_consumer_poll_batch)
 *                                  running one INSERT ... SELECT FROM
 *                                  unnest($1::int8[], $2::bytea[]) per batch,
 *                                  as an application would write it
 *   ingress.postgres.sql V msg/s   a per-message INSERT of every delivery sent
 *                                  in one libpq pipeline per batch (what
 *                                  `jsdurable consume --sql` does)
 *   raw.fetch_ack.coalesced, raw.fetch_ackack.coalesced
 *                                  the same on a connection without SendAsap
 *                                  (nats.c's flusher gathers the writes, as
 *                                  on `jsdurable consume`'s connection, which
 *                                  the consumer runs here use too)
 *   raw.fetch_ack.best, raw.fetch_ackack.best   the faster form of each
 *   ingress.X.ratio V x            ingress.X / raw.fetch_ackack.best (same
 *                                  run): the ceiling with the confirmations
 *                                  the consumer waits for
 *   ingress.X.ratio_plain V x      ingress.X / raw.fetch_ack.best (same run)
 * Each figure is the median of 3 runs. Each ingress run checks that the table
 * holds exactly one row per message and the durable has nothing pending or
 * unacknowledged, so a fast but lossy run cannot report a figure (the
 * raw.fetch_ackack run checks every confirmation came). BENCH_INGRESS_MESSAGES
 * overrides 100000. Notes go to stderr.
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
#include "lib/bench_js.h"

#define PAYLOAD 256
#define RUNS    3

static const char *nats_url;
static natsConnection *nc; /* SendAsap: set-up, and the ceilings' first form */
static jsCtx *js;
static natsConnection *cnc; /* SendAsap off: the ceilings' coalesced form */
static jsCtx *cjs;
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

/* coalesce: fetch and ACK on the connection whose writes nats.c's flusher
 * gathers (what `jsdurable consume` does), else on the SendAsap one. */
static double raw_fetch_ack(int run, bool coalesce)
{
    natsConnection *nc_ = coalesce ? cnc : nc;
    jsCtx *js_ = coalesce ? cjs : js;
    char stream[64], durable[32] = "raw";
    snprintf(stream, sizeof(stream), "BIRAW_%d_%d_%d", (int)getpid(), run, coalesce);
    fill(stream, durable);
    natsSubscription *sub = NULL;
    jsSubOptions so;
    jsErrCode jerr = 0;
    jsSubOptions_Init(&so);
    so.Stream = stream;
    so.Consumer = durable;
    check(js_PullSubscribe(&sub, js_, NULL, durable, NULL, &so, &jerr), "pull subscribe");
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
    check(natsConnection_Flush(nc_), "flush");
    while (!settled(stream, durable))
        usleep(1000);
    double rate = n_msgs / ((mono_us() - t0) / 1e6);
    natsSubscription_Destroy(sub);
    js_DeleteStream(js, stream, NULL, NULL);
    return rate;
}

/* The confirmed-ACK ceiling: the same fetch, each ACK sent as a request
 * with a reply subject under one inbox for the whole batch, and the batch's
 * confirmations awaited after the next fetch went out (one batch of ACKs in
 * flight while the next is pulled), as the library's consumer does. */
static double raw_fetch_ackack(int run, bool coalesce)
{
    natsConnection *nc_ = coalesce ? cnc : nc;
    jsCtx *js_ = coalesce ? cjs : js;
    char stream[64], durable[32] = "raw";
    snprintf(stream, sizeof(stream), "BIRAWC_%d_%d_%d", (int)getpid(), run, coalesce);
    fill(stream, durable);
    natsSubscription *sub = NULL, *replies = NULL;
    natsInbox *inbox = NULL;
    jsSubOptions so;
    jsErrCode jerr = 0;
    jsSubOptions_Init(&so);
    so.Stream = stream;
    so.Consumer = durable;
    check(js_PullSubscribe(&sub, js_, NULL, durable, NULL, &so, &jerr), "pull subscribe");
    check(natsInbox_Create(&inbox), "inbox");
    char wild[128], reply[160];
    snprintf(wild, sizeof(wild), "%s.>", inbox);
    check(natsConnection_SubscribeSync(&replies, nc_, wild), "reply subscription");
    check(natsSubscription_SetPendingLimits(replies, -1, -1), "pending limits");
    int got = 0, owed = 0, confirmed = 0;
    int64_t t0 = mono_us();
    while (got < n_msgs || owed > 0) {
        natsMsgList list = {0};
        natsStatus s =
            got < n_msgs ? natsSubscription_Fetch(&list, sub, 256, 500, &jerr) : NATS_TIMEOUT;
        if (s != NATS_OK && s != NATS_TIMEOUT)
            check(s, "fetch");
        /* the previous batch's confirmations, each one awaited */
        for (; owed > 0; owed--) {
            natsMsg *m = NULL;
            check(natsSubscription_NextMsg(&m, replies, 5000), "ack confirmation");
            confirmed++;
            natsMsg_Destroy(m);
        }
        for (int i = 0; i < list.Count; i++) {
            snprintf(reply, sizeof(reply), "%s.%d", inbox, got + i);
            check(natsConnection_PublishRequest(nc_, natsMsg_GetReply(list.Msgs[i]), reply, "+ACK",
                                                4),
                  "ack request");
        }
        owed = list.Count;
        got += list.Count;
        natsMsgList_Destroy(&list);
    }
    double rate = n_msgs / ((mono_us() - t0) / 1e6);
    if (confirmed != n_msgs || !settled(stream, durable))
        die("check", "raw confirmed acks do not match the messages");
    natsSubscription_Destroy(replies);
    natsInbox_Destroy(inbox);
    natsSubscription_Destroy(sub);
    js_DeleteStream(js, stream, NULL, NULL);
    return rate;
}

/* ---- the consumer with an INSERT handler ------------------------------------------- */

typedef struct sink {
    sqlite3 *db;
    sqlite3_stmt *st;
    bool pg_prepared, pg_batch_prepared;
    struct pgarr {
        unsigned char *b;
        size_t len, cap;
        uint32_t count;
    } seqs, bodies;
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

/* A one-dimensional PostgreSQL array in binary format (int8 or bytea). */
typedef struct pgarr pgarr;

static void put32(unsigned char *b, uint32_t v)
{
    b[0] = (unsigned char)(v >> 24);
    b[1] = (unsigned char)(v >> 16);
    b[2] = (unsigned char)(v >> 8);
    b[3] = (unsigned char)v;
}

static void arr_put(pgarr *a, const void *v, uint32_t n)
{
    if (a->len + 4 + n > a->cap) {
        a->cap = (a->len + 4 + n) * 2;
        a->b = realloc(a->b, a->cap);
        if (!a->b)
            die("array", "out of memory");
    }
    put32(a->b + a->len, n);
    memcpy(a->b + a->len + 4, v, n);
    a->len += 4 + n;
    a->count++;
}

static void arr_start(pgarr *a)
{
    a->len = 20;
    a->count = 0;
    if (a->cap < 20) {
        a->cap = 4096;
        a->b = realloc(a->b, a->cap);
        if (!a->b)
            die("array", "out of memory");
    }
}

static void arr_end(pgarr *a, uint32_t oid)
{
    put32(a->b, 1);
    put32(a->b + 4, 0);
    put32(a->b + 8, oid);
    put32(a->b + 12, a->count);
    put32(a->b + 16, 1);
}

/* What an application writes on PostgreSQL: the whole batch in one
 * INSERT ... SELECT FROM unnest. */
static void insert_batch(jsd_tx *tx, const jsd_delivery *const *d, size_t n, jsd_disposition *out,
                         void *user)
{
    sink *k = user;
    PGconn *pg = jsd_tx_pg(tx);
    if (!k->pg_batch_prepared) {
        PGresult *r = PQprepare(pg, "bench_insert_batch",
                                "INSERT INTO effects(seq, body) SELECT * FROM "
                                "unnest($1::int8[], $2::bytea[])",
                                0, NULL);
        k->pg_batch_prepared = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
    }
    arr_start(&k->seqs);
    arr_start(&k->bodies);
    for (size_t i = 0; i < n; i++) {
        unsigned char b[8];
        uint64_t v = jsd_delivery_stream_seq(d[i]);
        for (int j = 0; j < 8; j++)
            b[j] = (unsigned char)(v >> (56 - 8 * j));
        arr_put(&k->seqs, b, 8);
        size_t len = 0;
        const void *p = jsd_delivery_payload(d[i], &len);
        arr_put(&k->bodies, p, (uint32_t)len);
    }
    arr_end(&k->seqs, 20);
    arr_end(&k->bodies, 17);
    const char *vals[2] = {(const char *)k->seqs.b, (const char *)k->bodies.b};
    int lens[2] = {(int)k->seqs.len, (int)k->bodies.len}, fmts[2] = {1, 1};
    PGresult *r = PQexecPrepared(pg, "bench_insert_batch", 2, vals, lens, fmts, 0);
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    for (size_t i = 0; !ok && i < n; i++)
        out[i] = jsd_disposition_retry(0, "insert failed");
}

/* The per-message statement of `consume --sql`, pipelined: every INSERT
 * of the batch sent, one Sync, every result read. */
static void insert_pipelined(jsd_tx *tx, const jsd_delivery *const *d, size_t n,
                             jsd_disposition *out, void *user)
{
    sink *k = user;
    PGconn *pg = jsd_tx_pg(tx);
    if (!k->pg_prepared) {
        PGresult *r = PQprepare(pg, "bench_insert",
                                "INSERT INTO effects(seq, body) VALUES ($1, $2)", 0, NULL);
        k->pg_prepared = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
    }
    if (!PQenterPipelineMode(pg))
        die("pipeline", PQerrorMessage(pg));
    for (size_t i = 0; i < n; i++) {
        char seq[24];
        size_t len = 0;
        const void *p = jsd_delivery_payload(d[i], &len);
        snprintf(seq, sizeof(seq), "%llu", (unsigned long long)jsd_delivery_stream_seq(d[i]));
        const char *vals[2] = {seq, p};
        int lens[2] = {0, (int)len}, fmts[2] = {0, 1};
        if (!PQsendQueryPrepared(pg, "bench_insert", 2, vals, lens, fmts, 0))
            die("pipeline send", PQerrorMessage(pg));
    }
    PQpipelineSync(pg);
    for (size_t i = 0; i < n; i++) {
        PGresult *r = PQgetResult(pg);
        if (PQresultStatus(r) != PGRES_COMMAND_OK)
            out[i] = jsd_disposition_retry(0, "insert failed");
        PQclear(r);
        while ((r = PQgetResult(pg)) != NULL)
            PQclear(r);
    }
    PGresult *r = PQgetResult(pg); /* the Sync */
    PQclear(r);
    PQexitPipelineMode(pg);
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

enum mode { PER_MESSAGE, PG_UNNEST, PG_PIPELINE };

/* One poll of the consumer with the mode's handler. */
static jsd_status poll_once(jsd_consumer *c, enum mode mode, sink *k)
{
    return mode == PG_UNNEST     ? jsd_consumer_poll_batch(c, insert_batch, k, NULL)
           : mode == PG_PIPELINE ? jsd_consumer_poll_batch(c, insert_pipelined, k, NULL)
                                 : jsd_consumer_poll(c, insert, k, NULL);
}

static double ingress(const char *store_url, int run, bool pg, enum mode mode)
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

    conn = bench_conn_open(nats_url, "BENCH_INGRESS_WRITE_EACH");
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
        if (poll_once(c, mode, &k) != JSD_OK)
            die("poll", jsd_consumer_errmsg(c));
        jsd_consumer_stats_get(c, &s);
    }
    while (!settled(stream, durable))
        usleep(1000);
    double rate = n_msgs / ((mono_us() - t0) / 1e6);
    /* Untimed: one poll that finds nothing settles the confirmations still
     * in flight, so that acked below counts every one. */
    if (poll_once(c, mode, &k) != JSD_OK)
        die("poll", jsd_consumer_errmsg(c));
    jsd_consumer_stats_get(c, &s);
    long long rows = count_rows(store);
    if (rows != n_msgs || s.acked != (uint64_t)n_msgs || s.ack_unconfirmed || s.duplicates)
        die("check", "rows, confirmations or duplicates do not match the messages");
    fprintf(stderr, "bench_ingress: %s run %d: %.0f msg/s, %llu batches, %llu acked\n",
            !pg                   ? "sqlite"
            : mode == PG_PIPELINE ? "postgres.sql"
                                  : "postgres",
            run, rate, (unsigned long long)s.batches, (unsigned long long)s.acked);
    jsd_consumer_destroy(c);
    sqlite3_finalize(k.st);
    free(k.seqs.b);
    free(k.bodies.b);
    jsd_conn_close(conn);
    jsd_store_close(store);
    js_DeleteStream(js, stream, NULL, NULL);
    js_DeleteStream(js, dlq, NULL, NULL);
    return rate;
}

/* BENCH_INGRESS_SUFFIX ends every figure's name (bench/run.sh: ".durable" on
 * the server with `sync_interval: always`, where the PostgreSQL .sql form is
 * left out). */
static const char *suffix = "";

/* A ceiling's median of RUNS in each form, printed as NAME, NAME.coalesced
 * and NAME.best; returns the best. */
static double ceiling(const char *name, double (*run)(int, bool))
{
    double v[RUNS], m[2];
    for (int form = 0; form < 2; form++) {
        for (int r = 0; r < RUNS; r++)
            v[r] = run(r, form == 1);
        m[form] = bench_median(v, RUNS);
    }
    double best = m[0] > m[1] ? m[0] : m[1];
    printf("%s%s %.0f msg/s\n%s.coalesced%s %.0f msg/s\n%s.best%s %.0f msg/s\n", name, suffix, m[0],
           name, suffix, m[1], name, suffix, best);
    fflush(stdout);
    return best;
}

int main(int argc, char **argv)
{
    bench_prog = "bench_ingress";
    nats_url = argc > 1 ? argv[1] : getenv("JSD_BENCH_NATS_URL");
    if (!nats_url || !*nats_url)
        die("usage", "bench_ingress NATS_URL (or $JSD_BENCH_NATS_URL)");
    const char *n = getenv("BENCH_INGRESS_MESSAGES");
    if (n && strtol(n, NULL, 10) > 0)
        n_msgs = (int)strtol(n, NULL, 10);
    const char *pg_url = getenv("JSD_BENCH_PG_URL");
    if (getenv("BENCH_INGRESS_SUFFIX"))
        suffix = getenv("BENCH_INGRESS_SUFFIX");

    natsOptions *no = NULL;
    check(natsOptions_Create(&no), "options");
    check(natsOptions_SetURL(no, nats_url), "url");
    check(natsOptions_SetSendAsap(no, true), "send asap");
    check(natsConnection_Connect(&nc, no), "connect");
    check(natsOptions_SetSendAsap(no, false), "coalesced writes");
    check(natsConnection_Connect(&cnc, no), "connect");
    natsOptions_Destroy(no);
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.PublishAsync.MaxPending = 4096;
    jo.PublishAsync.StallWait = 30000;
    check(natsConnection_JetStream(&js, nc, &jo), "jetstream");
    check(natsConnection_JetStream(&cjs, cnc, &jo), "jetstream");
    snprintf(tmpdir, sizeof(tmpdir), "%s/jsd-bench-ingress.XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmpdir))
        die("mkdtemp", tmpdir);

    /* Each ceiling in both forms; the ratios divide by the faster one, so no
     * ratio rises because the ceiling was held back. */
    double sq[RUNS], pgv[RUNS];
    double raw_m = ceiling("raw.fetch_ack", raw_fetch_ack);
    double rawc_m = ceiling("raw.fetch_ackack", raw_fetch_ackack);
    for (int r = 0; r < RUNS; r++) {
        char url[700];
        snprintf(url, sizeof(url), "sqlite:%s/ingress-%d.db", tmpdir, r);
        sq[r] = ingress(url, r, false, PER_MESSAGE);
    }
    double sq_m = bench_median(sq, RUNS);
    printf("ingress.sqlite%s %.0f msg/s\n", suffix, sq_m);
    printf("ingress.sqlite.ratio%s %.2f x\n", suffix, sq_m / rawc_m);
    printf("ingress.sqlite.ratio_plain%s %.2f x\n", suffix, sq_m / raw_m);
    fflush(stdout);
    if (pg_url && *pg_url) {
        for (int r = 0; r < RUNS; r++)
            pgv[r] = ingress(pg_url, r, true, PG_UNNEST);
        double pg_m = bench_median(pgv, RUNS);
        printf("ingress.postgres%s %.0f msg/s\n", suffix, pg_m);
        printf("ingress.postgres.ratio%s %.2f x\n", suffix, pg_m / rawc_m);
        printf("ingress.postgres.ratio_plain%s %.2f x\n", suffix, pg_m / raw_m);
        fflush(stdout);
    }
    if (pg_url && *pg_url && !*suffix) {
        for (int r = 0; r < RUNS; r++)
            pgv[r] = ingress(pg_url, r, true, PG_PIPELINE);
        double pg_m = bench_median(pgv, RUNS);
        printf("ingress.postgres.sql %.0f msg/s\n", pg_m);
        printf("ingress.postgres.sql.ratio %.2f x\n", pg_m / rawc_m);
        printf("ingress.postgres.sql.ratio_plain %.2f x\n", pg_m / raw_m);
    } else if (!pg_url || !*pg_url) {
        fprintf(stderr, "bench_ingress: no $JSD_BENCH_PG_URL: PostgreSQL figures skipped\n");
    }
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_ingress: could not remove %s\n", tmpdir);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    jsCtx_Destroy(cjs);
    natsConnection_Destroy(cnc);
    return 0;
}
