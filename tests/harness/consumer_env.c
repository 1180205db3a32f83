/*
 * The ingress tests' shared set-up (consumer_env.h says what each helper
 * does): unique streams on the run's shared nats-server, a store on either
 * back end, raw nats.c publishing and observation, and SQL helpers that work
 * on SQLite and PostgreSQL alike.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "consumer_env.h"

void cenv_connect(cenv *e)
{
    jsd_conn_opts o;
    jsd_error err;
    jsd_conn_opts_init(&o);
    o.servers = jsd_fx_shared_nats_url();
    jsd_error_clear(&err);
    ASSERT_OK(jsd_conn_open(&e->conn, &o, &err), err.msg);
    natsOptions *no = NULL;
    ASSERT_EQ(natsOptions_Create(&no), NATS_OK);
    ASSERT_EQ(natsOptions_SetURL(no, jsd_fx_shared_nats_url()), NATS_OK);
    ASSERT_EQ(natsOptions_SetSendAsap(no, true), NATS_OK);
    ASSERT_EQ(natsConnection_Connect(&e->nc, no), NATS_OK);
    natsOptions_Destroy(no);
    ASSERT_EQ(natsConnection_JetStream(&e->js, e->nc, NULL), NATS_OK);
}

/* The same with a store URL of the test's own (a private PostgreSQL, a
 * SQLite file on a small tmpfs); NULL: a fresh one on the run's shared
 * services. */
void cenv_up_at(cenv *e, bool pg, const char *store_url)
{
    memset(e, 0, sizeof(*e));
    e->pg = pg;
    snprintf(e->stream, sizeof(e->stream), "%s", jsd_test_unique("CS"));
    snprintf(e->prefix, sizeof(e->prefix), "%s", jsd_test_unique("cs"));
    snprintf(e->dlq_stream, sizeof(e->dlq_stream), "%s", jsd_test_unique("DLQ"));
    snprintf(e->durable, sizeof(e->durable), "%s", jsd_test_unique("dur"));
    snprintf(e->dlq_subject, sizeof(e->dlq_subject), "jsd.dlq.%s.%s", e->stream, e->durable);
    if (store_url)
        snprintf(e->store_url, sizeof(e->store_url), "%s", store_url);
    else if (pg)
        ASSERT_EQ(jsd_fx_pg_database(e->store_url, sizeof(e->store_url)), 0);
    else
        jsd_fx_sqlite_url(e->store_url, sizeof(e->store_url));
    jsd_error err;
    jsd_error_clear(&err);
    ASSERT_OK(jsd_store_open(&e->store, e->store_url, &err), err.msg);
    cenv_connect(e);

    jsStreamConfig sc;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    char subj[96], dsubj[160];
    const char *subjects[1] = {subj}, *dsubjects[1] = {dsubj};
    snprintf(subj, sizeof(subj), "%s.>", e->prefix);
    jsStreamConfig_Init(&sc);
    sc.Name = e->stream;
    sc.Subjects = subjects;
    sc.SubjectsLen = 1;
    sc.Storage = js_FileStorage;
    ASSERT_EQ(js_AddStream(&si, e->js, &sc, NULL, &jerr), NATS_OK);
    jsStreamInfo_Destroy(si);
    snprintf(dsubj, sizeof(dsubj), "jsd.dlq.%s.>", e->stream);
    jsStreamConfig_Init(&sc);
    sc.Name = e->dlq_stream;
    sc.Subjects = dsubjects;
    sc.SubjectsLen = 1;
    sc.Storage = js_FileStorage;
    si = NULL;
    ASSERT_EQ(js_AddStream(&si, e->js, &sc, NULL, &jerr), NATS_OK);
    jsStreamInfo_Destroy(si);
}

void cenv_up(cenv *e, bool pg)
{
    cenv_up_at(e, pg, NULL);
}

void cenv_down(cenv *e)
{
    if (e->js) {
        js_DeleteStream(e->js, e->stream, NULL, NULL);
        js_DeleteStream(e->js, e->dlq_stream, NULL, NULL);
    }
    jsCtx_Destroy(e->js);
    natsConnection_Destroy(e->nc);
    jsd_conn_close(e->conn);
    jsd_store_close(e->store);
}

/* Create the durable with explicit settings. */
void cenv_durable(cenv *e, int64_t ack_wait_ms, int max_deliver, int max_ack_pending,
                  const int64_t *backoff_ms, int n_backoff)
{
    jsd_durable_config dc;
    jsd_error err;
    bool created = false;
    jsd_durable_config_init(&dc);
    dc.ack_wait_ms = ack_wait_ms;
    dc.max_deliver = max_deliver;
    dc.max_ack_pending = max_ack_pending;
    dc.n_backoff = n_backoff;
    for (int i = 0; i < n_backoff; i++)
        dc.backoff_ms[i] = backoff_ms[i];
    jsd_error_clear(&err);
    ASSERT_OK(jsd_consumer_ensure(e->conn, e->stream, e->durable, &dc, &created, &err), err.msg);
    ASSERT_TRUE(created);
}

/* Publish n messages "<prefix>.k" with body "msg-k" (k = first..first+n-1),
 * Nats-Msg-Id "id-k" and the given Jsd-Type (NULL: none). */
void cenv_publish(cenv *e, int first, int n, const char *type)
{
    for (int k = first; k < first + n; k++) {
        char subj[128], body[64], id[64];
        natsMsg *m = NULL;
        jsPubAck *pa = NULL;
        jsPubOptions po;
        jsErrCode jerr = 0;
        snprintf(subj, sizeof(subj), "%s.%d", e->prefix, k);
        snprintf(body, sizeof(body), "msg-%d", k);
        snprintf(id, sizeof(id), "id-%d", k);
        ASSERT_EQ(natsMsg_Create(&m, subj, NULL, body, (int)strlen(body)), NATS_OK);
        if (type)
            ASSERT_EQ(natsMsgHeader_Set(m, "Jsd-Type", type), NATS_OK);
        jsPubOptions_Init(&po);
        po.MsgId = id;
        ASSERT_EQ(js_PublishMsg(&pa, e->js, m, &po, &jerr), NATS_OK);
        jsPubAck_Destroy(pa);
        natsMsg_Destroy(m);
    }
}

/* Publish one message with an arbitrary body. */
void cenv_publish_raw(cenv *e, const char *subj_tail, const void *body, int len, const char *type,
                      const char *msg_id)
{
    char subj[128];
    natsMsg *m = NULL;
    jsPubAck *pa = NULL;
    jsPubOptions po;
    jsErrCode jerr = 0;
    snprintf(subj, sizeof(subj), "%s.%s", e->prefix, subj_tail);
    ASSERT_EQ(natsMsg_Create(&m, subj, NULL, body, len), NATS_OK);
    if (type)
        ASSERT_EQ(natsMsgHeader_Set(m, "Jsd-Type", type), NATS_OK);
    jsPubOptions_Init(&po);
    po.MsgId = msg_id;
    ASSERT_EQ(js_PublishMsg(&pa, e->js, m, &po, &jerr), NATS_OK);
    jsPubAck_Destroy(pa);
    natsMsg_Destroy(m);
}

bool cenv_tx_exec(jsd_tx *tx, const char *sql)
{
    sqlite3 *db = jsd_tx_sqlite(tx);
    if (db)
        return sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK;
    PGresult *r = PQexec(jsd_tx_pg(tx), sql);
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    PQclear(r);
    return ok;
}

void cenv_store_exec(jsd_store *s, const char *sql)
{
    jsd_tx *tx = NULL;
    ASSERT_OK(jsd_tx_begin(&tx, s), jsd_store_errmsg(s));
    if (!cenv_tx_exec(tx, sql)) {
        /* the driver's own words, so a rare failure says what it was */
        char why[512];
        sqlite3 *db = jsd_tx_sqlite(tx);
        snprintf(why, sizeof(why), "%s", db ? sqlite3_errmsg(db) : PQerrorMessage(jsd_tx_pg(tx)));
        jsd_tx_rollback(tx);
        fail_msg("SQL failed: %s: %s", sql, why);
    }
    ASSERT_OK(jsd_tx_commit(tx), jsd_store_errmsg(s));
}

/* One integer from a query (-1 on error). */
long long cenv_store_scalar(jsd_store *s, const char *sql)
{
    jsd_tx *tx = NULL;
    long long v = -1;
    if (jsd_tx_begin(&tx, s) != JSD_OK)
        return -1;
    sqlite3 *db = jsd_tx_sqlite(tx);
    if (db) {
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK &&
            sqlite3_step(st) == SQLITE_ROW)
            v = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
    } else {
        PGresult *r = PQexec(jsd_tx_pg(tx), sql);
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
            v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        PQclear(r);
    }
    jsd_tx_rollback(tx);
    return v;
}

jsConsumerInfo *cenv_info(cenv *e)
{
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    if (js_GetConsumerInfo(&ci, e->js, e->stream, e->durable, NULL, &jerr) != NATS_OK)
        return NULL;
    return ci;
}

/* Messages in a stream (-1 on error). */
long long cenv_stream_msgs(cenv *e, const char *stream)
{
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    if (js_GetStreamInfo(&si, e->js, stream, NULL, &jerr) != NATS_OK)
        return -1;
    long long n = (long long)si->State.Msgs;
    jsStreamInfo_Destroy(si);
    return n;
}

/* Nothing pending and nothing awaiting an ACK on the durable. */
bool cenv_settled(cenv *e)
{
    jsConsumerInfo *ci = cenv_info(e);
    bool ok = ci && ci->NumPending == 0 && ci->NumAckPending == 0;
    jsConsumerInfo_Destroy(ci);
    return ok;
}

long long cenv_waiting(cenv *e)
{
    jsConsumerInfo *ci = cenv_info(e);
    long long n = ci ? (long long)ci->NumWaiting : -1;
    jsConsumerInfo_Destroy(ci);
    return n;
}

long long cenv_ack_pending(cenv *e)
{
    jsConsumerInfo *ci = cenv_info(e);
    long long n = ci ? (long long)ci->NumAckPending : -1;
    jsConsumerInfo_Destroy(ci);
    return n;
}

void cenv_raw_pull(cenv *e, const char *inbox, const char *body)
{
    char subj[256];
    snprintf(subj, sizeof(subj), "$JS.API.CONSUMER.MSG.NEXT.%s.%s", e->stream, e->durable);
    ASSERT_EQ(natsConnection_PublishRequestString(e->nc, subj, inbox, body), NATS_OK);
    ASSERT_EQ(natsConnection_FlushTimeout(e->nc, 5000), NATS_OK);
}

jsd_consumer *cenv_consumer(cenv *e, jsd_consumer_opts *o)
{
    jsd_consumer_opts def;
    jsd_consumer *c = NULL;
    jsd_error err;
    if (!o) {
        jsd_consumer_opts_init(&def);
        o = &def;
    }
    o->stream = e->stream;
    o->durable = e->durable;
    o->fetch_wait_ms = o->fetch_wait_ms ? o->fetch_wait_ms : 200;
    o->inbox_retention_ms = 0;
    jsd_error_clear(&err);
    jsd_status st = jsd_consumer_create(&c, e->store, e->conn, o, &err);
    if (st != JSD_OK)
        fail_msg("jsd_consumer_create: %s: %s", jsd_status_name(st), err.msg);
    return c;
}

bool cenv_readyz_says(int port, const char *status, const char *text)
{
    const char *r = jsd_test_http_get(port, "/readyz");
    return r && strstr(r, status) && (!text || strstr(r, text));
}

void cenv_stop_consume(pid_t pid, const char *log, char *out, size_t cap)
{
    kill(pid, SIGTERM);
    int st = jsd_test_child_wait(pid);
    FILE *f = fopen(log, "r");
    size_t n = f ? fread(out, 1, cap - 1, f) : 0;
    out[n] = '\0';
    if (f)
        fclose(f);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("consume ended with status 0x%x:\n%s", st, out);
}

void cenv_sink_seqs_once(cenv *e, int n)
{
    ASSERT_EQ(cenv_store_scalar(e->store, "SELECT COUNT(*) FROM sink"), n);
    ASSERT_EQ(cenv_store_scalar(e->store, "SELECT COUNT(DISTINCT seq) FROM sink"), n);
    ASSERT_EQ(cenv_store_scalar(e->store, "SELECT MIN(seq) FROM sink"), 1);
    ASSERT_EQ(cenv_store_scalar(e->store, "SELECT MAX(seq) FROM sink"), n);
}
