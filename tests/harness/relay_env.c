/*
 * The relay's and the store's shared test helpers (relay_env.h says what each
 * does): native-driver readers of the outbox, enqueueing through the public
 * API, reading a stream back over a separate nats.c connection, and a relay in
 * a thread or as a `jsdurable relay` process.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "relay_env.h"

/* ---- the store and its rows ---------------------------------------------------- */

/* A fresh, empty store of the given kind; its native reader is opened after
 * the first jsd_store_open (which creates the schema). */
void rt_store_new(rt_store *st, rt_backend kind)
{
    memset(st, 0, sizeof(*st));
    st->kind = kind;
    if (kind == RT_SQLITE)
        jsd_fx_sqlite_url(st->url, sizeof(st->url));
    else if (jsd_fx_pg_database(st->url, sizeof(st->url)) != 0)
        fail_msg("cannot create a PostgreSQL database");
}

void rt_store_new_on(rt_store *st, const char *pg_server)
{
    memset(st, 0, sizeof(*st));
    st->kind = RT_PG;
    if (jsd_fx_pg_database_on(pg_server, st->url, sizeof(st->url)) != 0)
        fail_msg("cannot create a PostgreSQL database on %s", pg_server);
}

jsd_store *rt_open(const rt_store *st)
{
    jsd_store *s = NULL;
    jsd_error err;
    jsd_error_clear(&err);
    ASSERT_OK(jsd_store_open(&s, st->url, &err), err.msg);
    return s;
}

void rt_reader(rt_store *st)
{
    if (st->kind == RT_SQLITE && !st->lite) {
        const char *path = st->url + strlen("sqlite:");
        if (sqlite3_open_v2(path, &st->lite, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK)
            fail_msg("cannot open %s: %s", path, sqlite3_errmsg(st->lite));
        sqlite3_busy_timeout(st->lite, 5000);
    } else if (st->kind == RT_PG && !st->pg) {
        st->pg = PQconnectdb(st->url);
        if (PQstatus(st->pg) != CONNECTION_OK)
            fail_msg("cannot connect to PostgreSQL: %s", PQerrorMessage(st->pg));
    }
}

void rt_store_close(rt_store *st)
{
    if (st->lite)
        sqlite3_close(st->lite);
    if (st->pg)
        PQfinish(st->pg);
    st->lite = NULL;
    st->pg = NULL;
}

/* One integer from a query (no parameters); -1 on NULL. */
long long rt_q(rt_store *st, const char *sql)
{
    rt_reader(st);
    long long v = -1;
    if (st->kind == RT_SQLITE) {
        sqlite3_stmt *stmt = NULL;
        if (sqlite3_prepare_v2(st->lite, sql, -1, &stmt, NULL) != SQLITE_OK)
            fail_msg("%s: %s", sql, sqlite3_errmsg(st->lite));
        int rc = sqlite3_step(stmt);
        if (rc == SQLITE_ROW && sqlite3_column_type(stmt, 0) != SQLITE_NULL)
            v = sqlite3_column_int64(stmt, 0);
        else if (rc != SQLITE_ROW)
            fail_msg("%s: %s", sql, sqlite3_errmsg(st->lite));
        sqlite3_finalize(stmt);
    } else {
        PGresult *res = PQexec(st->pg, sql);
        if (PQresultStatus(res) != PGRES_TUPLES_OK)
            fail_msg("%s: %s", sql, PQerrorMessage(st->pg));
        if (PQntuples(res) > 0 && !PQgetisnull(res, 0, 0))
            v = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        PQclear(res);
    }
    return v;
}

/* One text value from a query into out ("" when no row or NULL). */
void rt_qs(rt_store *st, const char *sql, char *out, size_t cap)
{
    rt_reader(st);
    out[0] = '\0';
    if (st->kind == RT_SQLITE) {
        sqlite3_stmt *stmt = NULL;
        if (sqlite3_prepare_v2(st->lite, sql, -1, &stmt, NULL) != SQLITE_OK)
            fail_msg("%s: %s", sql, sqlite3_errmsg(st->lite));
        if (sqlite3_step(stmt) == SQLITE_ROW && sqlite3_column_text(stmt, 0))
            snprintf(out, cap, "%s", (const char *)sqlite3_column_text(stmt, 0));
        sqlite3_finalize(stmt);
    } else {
        PGresult *res = PQexec(st->pg, sql);
        if (PQresultStatus(res) != PGRES_TUPLES_OK)
            fail_msg("%s: %s", sql, PQerrorMessage(st->pg));
        if (PQntuples(res) > 0 && !PQgetisnull(res, 0, 0))
            snprintf(out, cap, "%s", PQgetvalue(res, 0, 0));
        PQclear(res);
    }
}

/* The store's message-id namespace: its store id (no test here overrides it). */
void rt_ns(rt_store *st, char out[JSD_NAMESPACE_MAX + 1])
{
    rt_qs(st, "SELECT value FROM jsd_meta WHERE key = 'store_id'", out, JSD_NAMESPACE_MAX + 1);
    ASSERT_SIZE_EQ(strlen(out), 32);
}

/* Call fn for every row of a query, with its columns as text (NULL for SQL
 * NULL). */
void rt_rows(rt_store *st, const char *sql, rt_row_fn fn, void *user)
{
    rt_reader(st);
    const char *cols[16];
    if (st->kind == RT_SQLITE) {
        sqlite3_stmt *stmt = NULL;
        if (sqlite3_prepare_v2(st->lite, sql, -1, &stmt, NULL) != SQLITE_OK)
            fail_msg("%s: %s", sql, sqlite3_errmsg(st->lite));
        int nc = sqlite3_column_count(stmt);
        if (nc > 16)
            nc = 16;
        while (sqlite3_step(stmt) == SQLITE_ROW) {
            for (int i = 0; i < nc; i++)
                cols[i] = (const char *)sqlite3_column_text(stmt, i);
            fn(nc, cols, user);
        }
        sqlite3_finalize(stmt);
    } else {
        PGresult *res = PQexec(st->pg, sql);
        if (PQresultStatus(res) != PGRES_TUPLES_OK)
            fail_msg("%s: %s", sql, PQerrorMessage(st->pg));
        int nc = PQnfields(res);
        if (nc > 16)
            nc = 16;
        for (int r = 0; r < PQntuples(res); r++) {
            for (int i = 0; i < nc; i++)
                cols[i] = PQgetisnull(res, r, i) ? NULL : PQgetvalue(res, r, i);
            fn(nc, cols, user);
        }
        PQclear(res);
    }
}

long long rt_published(rt_store *st)
{
    return rt_q(st, RT_SQL_PUBLISHED);
}

/* ---- enqueueing ---------------------------------------------------------------------- */

void rt_enqueue(jsd_store *s, const rt_enqueue_opts *o)
{
    const char *owner = o->owner ? o->owner : "o";
    const char *prefix = o->id_prefix ? o->id_prefix : "e";
    int per_tx = o->per_tx > 0 ? o->per_tx : 256;
    size_t plen = o->payload_len ? o->payload_len : 32;
    char *payload = calloc(1, plen + 1);
    ASSERT_TRUE(payload != NULL);
    memset(payload, 'x', plen);
    int i = 0;
    while (i < o->n) {
        jsd_tx *tx = NULL;
        ASSERT_OK(jsd_tx_begin(&tx, s), jsd_store_errmsg(s));
        for (int k = 0; k < per_tx && i < o->n; k++, i++) {
            int idx = o->first + i;
            char id[64], subject[300], key[128];
            snprintf(id, sizeof(id), "%s%d", prefix, idx);
            snprintf(subject, sizeof(subject), o->subject,
                     o->n_subjects > 1 ? idx % o->n_subjects : 0);
            if (o->order_key)
                snprintf(key, sizeof(key), o->order_key, o->n_keys > 1 ? idx % o->n_keys : 0);
            size_t idl = strlen(id);
            memcpy(payload, id, idl < plen ? idl : plen);
            jsd_effect e = {.owner = owner,
                            .id = id,
                            .subject = subject,
                            .payload = payload,
                            .len = plen,
                            .not_before_ms = o->not_before_ms,
                            .order_key = o->order_key ? key : NULL};
            ASSERT_OK(jsd_tx_emit(tx, &e), jsd_store_errmsg(s));
        }
        ASSERT_OK(jsd_tx_commit(tx), jsd_store_errmsg(s));
    }
    free(payload);
}

/* ---- NATS, read with a separate nats.c connection ------------------------------------ */

void rt_nats_open(rt_nats *n, const char *url)
{
    natsOptions *o = NULL;
    memset(n, 0, sizeof(*n));
    ASSERT_EQ(natsOptions_Create(&o), NATS_OK);
    natsOptions_SetURL(o, url);
    natsOptions_SetTimeout(o, 5000);
    natsOptions_SetMaxReconnect(o, -1);
    natsOptions_SetReconnectWait(o, 100);
    natsStatus s = natsConnection_Connect(&n->nc, o);
    natsOptions_Destroy(o);
    if (s != NATS_OK)
        fail_msg("cannot connect to %s: %s", url, natsStatus_GetText(s));
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = 10000;
    ASSERT_EQ(natsConnection_JetStream(&n->js, n->nc, &jo), NATS_OK);
}

void rt_nats_close(rt_nats *n)
{
    jsCtx_Destroy(n->js);
    natsConnection_Destroy(n->nc);
    n->js = NULL;
    n->nc = NULL;
}

/* A file-storage, limits-retention stream on subjects with a 10-minute
 * duplicate window. */
void rt_stream_add(rt_nats *n, const char *name, const char *subject)
{
    rt_stream_add_with(n, name, subject, 600000, 0);
}

void rt_stream_add_with(rt_nats *n, const char *name, const char *subject, int64_t window_ms,
                        int32_t max_msg_size)
{
    jsStreamConfig c;
    jsStreamConfig_Init(&c);
    const char *subjects[1] = {subject};
    c.Name = name;
    c.Subjects = subjects;
    c.SubjectsLen = 1;
    c.Storage = js_FileStorage;
    c.Retention = js_LimitsPolicy;
    c.Duplicates = window_ms * 1000000;
    if (max_msg_size > 0)
        c.MaxMsgSize = max_msg_size;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_AddStream(&si, n->js, &c, NULL, &jerr);
    if (s != NATS_OK)
        fail_msg("js_AddStream %s: %s (%d)", name, natsStatus_GetText(s), (int)jerr);
    jsStreamInfo_Destroy(si);
    const char *env = getenv("JSD_TEST_ATOMIC");
    if (!env || strcmp(env, "0") != 0)
        (void)rt_stream_set_atomic(n, name, true);
}

/* One JetStream API request, raw; the answer's root (the caller's). */
static json_t *js_api(rt_nats *n, const char *api, const char *body)
{
    natsMsg *reply = NULL;
    char subj[256];
    snprintf(subj, sizeof(subj), "$JS.API.%s", api);
    natsStatus s = natsConnection_RequestString(&reply, n->nc, subj, body ? body : "", 5000);
    if (s != NATS_OK)
        fail_msg("%s: %s", subj, natsStatus_GetText(s));
    json_error_t jerr;
    json_t *root =
        json_loadb(natsMsg_GetData(reply), (size_t)natsMsg_GetDataLength(reply), 0, &jerr);
    natsMsg_Destroy(reply);
    if (!root)
        fail_msg("%s: the answer is not JSON", subj);
    return root;
}

bool rt_stream_set_atomic(rt_nats *n, const char *name, bool on)
{
    char api[160];
    snprintf(api, sizeof(api), "STREAM.INFO.%s", name);
    json_t *info = js_api(n, api, NULL);
    json_t *cfg = json_object_get(info, "config");
    if (!json_is_object(cfg))
        fail_msg("stream info %s: no config", name);
    /* a server before 2.12 does not know the field (it shows no
     * allow_atomic, and its stream stays without) */
    bool known = json_object_get(cfg, "metadata") != NULL &&
                 json_object_get(json_object_get(cfg, "metadata"), "_nats.ver") != NULL;
    json_object_set_new(cfg, "allow_atomic", json_boolean(on));
    char *body = json_dumps(cfg, JSON_COMPACT);
    json_decref(info);
    snprintf(api, sizeof(api), "STREAM.UPDATE.%s", name);
    json_t *ans = js_api(n, api, body);
    free(body);
    bool set = json_is_boolean(json_object_get(json_object_get(ans, "config"), "allow_atomic")) &&
               json_is_true(json_object_get(json_object_get(ans, "config"), "allow_atomic")) == on;
    json_t *e = json_object_get(ans, "error");
    if (e && known)
        fail_msg("stream update %s (allow_atomic %d): %s", name, (int)on,
                 json_string_value(json_object_get(e, "description")));
    json_decref(ans);
    return set || (!on && !known);
}

uint64_t rt_stream_count(rt_nats *n, const char *name)
{
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetStreamInfo(&si, n->js, name, NULL, &jerr);
    if (s != NATS_OK)
        fail_msg("js_GetStreamInfo %s: %s (%d)", name, natsStatus_GetText(s), (int)jerr);
    uint64_t v = si->State.Msgs;
    jsStreamInfo_Destroy(si);
    return v;
}

/* One stored message, as read back. */

/* Read every message of a stream, in sequence order. *n receives the count;
 * free the array. */
rt_msg *rt_stream_read(rt_nats *n, const char *name, size_t *count)
{
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    ASSERT_EQ(js_GetStreamInfo(&si, n->js, name, NULL, &jerr), NATS_OK);
    uint64_t first = si->State.FirstSeq, last = si->State.LastSeq, msgs = si->State.Msgs;
    jsStreamInfo_Destroy(si);
    rt_msg *out = calloc(msgs ? msgs : 1, sizeof(*out));
    ASSERT_TRUE(out != NULL);
    size_t k = 0;
    for (uint64_t seq = first; msgs && seq <= last && k < msgs; seq++) {
        natsMsg *m = NULL;
        natsStatus s = js_GetMsg(&m, n->js, name, seq, NULL, &jerr);
        if (s == NATS_NOT_FOUND)
            continue;
        if (s != NATS_OK)
            fail_msg("js_GetMsg %s %llu: %s (%d)", name, (unsigned long long)seq,
                     natsStatus_GetText(s), (int)jerr);
        const char *id = NULL;
        rt_msg *r = &out[k++];
        r->seq = seq;
        if (natsMsgHeader_Get(m, "Nats-Msg-Id", &id) == NATS_OK && id)
            snprintf(r->msg_id, sizeof(r->msg_id), "%s", id);
        snprintf(r->subject, sizeof(r->subject), "%s", natsMsg_GetSubject(m));
        int dl = natsMsg_GetDataLength(m);
        const char *d = natsMsg_GetData(m);
        size_t hl = 0;
        while (hl < sizeof(r->head) - 1 && (int)hl < dl && d[hl] != 'x')
            hl++;
        memcpy(r->head, d, hl);
        natsMsg_Destroy(m);
    }
    *count = k;
    return out;
}

static int rt_cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/*
 * The stream holds exactly one message for each effect (owner, <prefix><i>),
 * i in [first, first+n), and nothing else: count, distinct Nats-Msg-Ids and
 * the ids equal to jsd_effect_msg_id of each effect under the store's namespace.
 */
void rt_assert_exactly_once(rt_store *st, rt_nats *nt, const char *stream, const char *owner,
                            const char *prefix, int first, int n)
{
    char ns[JSD_NAMESPACE_MAX + 1];
    rt_ns(st, ns);
    size_t count = 0;
    rt_msg *msgs = rt_stream_read(nt, stream, &count);
    ASSERT_SIZE_EQ(count, n);
    const char **got = calloc((size_t)n + 1, sizeof(char *));
    char(*want)[JSD_MSG_ID_MAX] = calloc((size_t)n + 1, JSD_MSG_ID_MAX);
    const char **wantp = calloc((size_t)n + 1, sizeof(char *));
    ASSERT_TRUE(got && want && wantp);
    for (size_t i = 0; i < count; i++)
        got[i] = msgs[i].msg_id;
    for (int i = 0; i < n; i++) {
        char id[64];
        snprintf(id, sizeof(id), "%s%d", prefix, first + i);
        ASSERT_OK(jsd_effect_msg_id(ns, owner, id, want[i]));
        wantp[i] = want[i];
    }
    qsort(got, count, sizeof(char *), rt_cmp_str);
    qsort(wantp, (size_t)n, sizeof(char *), rt_cmp_str);
    for (size_t i = 1; i < count; i++)
        if (!strcmp(got[i - 1], got[i]))
            fail_msg("Nats-Msg-Id %s is stored twice in %s", got[i], stream);
    for (int i = 0; i < n; i++)
        ASSERT_STREQ(got[i], wantp[i]);
    free(got);
    free(want);
    free(wantp);
    free(msgs);
}

/* Every receipt names the message stored under the effect's own Nats-Msg-Id:
 * for each row with a receipt, the stream's message at stream_seq carries
 * jsd_effect_msg_id(namespace, owner, effect_id). Also: no two rows share a sequence. */
typedef struct rt_receipt_check {
    rt_msg *msgs;
    size_t n;
    const char *stream;
    size_t checked;
    char ns[JSD_NAMESPACE_MAX + 1];
} rt_receipt_check;

static void rt_receipt_row(int nc, const char *const *c, void *user)
{
    rt_receipt_check *k = user;
    ASSERT_EQ(nc, 4);
    ASSERT_TRUE(c[2] != NULL && c[3] != NULL);
    ASSERT_STREQ(c[3], k->stream);
    uint64_t seq = strtoull(c[2], NULL, 10);
    char want[JSD_MSG_ID_MAX];
    ASSERT_OK(jsd_effect_msg_id(k->ns, c[0] ? c[0] : "", c[1], want));
    size_t lo = 0, hi = k->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (k->msgs[mid].seq < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == k->n || k->msgs[lo].seq != seq)
        fail_msg("effect %s: receipt names sequence %llu, which the stream does not hold", c[1],
                 (unsigned long long)seq);
    if (strcmp(k->msgs[lo].msg_id, want) != 0)
        fail_msg("effect %s: receipt names sequence %llu, which holds another message", c[1],
                 (unsigned long long)seq);
    k->checked++;
}

void rt_assert_receipts_match(rt_store *st, rt_nats *nt, const char *stream)
{
    rt_receipt_check k = {.stream = stream};
    rt_ns(st, k.ns);
    k.msgs = rt_stream_read(nt, stream, &k.n);
    rt_rows(st,
            "SELECT owner, effect_id, stream_seq, stream FROM jsd_outbox_state "
            "WHERE stream_seq IS NOT NULL",
            rt_receipt_row, &k);
    ASSERT_I64_EQ(k.checked, rt_q(st, RT_SQL_PUBLISHED));
    ASSERT_EQ(rt_q(st, "SELECT count(DISTINCT stream_seq) FROM jsd_outbox_state"),
              rt_q(st, RT_SQL_PUBLISHED));
    free(k.msgs);
}

/* ---- a relay in a thread ------------------------------------------------------------- */

static void *rt_relay_main(void *arg)
{
    rt_relay *t = arg;
    t->rc = t->until_idle ? jsd_relay_run_until_idle(t->relay) : jsd_relay_run(t->relay);
    __atomic_store_n(&t->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

jsd_conn *rt_conn_with(const char *url, int coalesce_writes)
{
    jsd_conn_opts o;
    jsd_conn_opts_init(&o);
    o.servers = url;
    o.coalesce_writes = coalesce_writes;
    jsd_conn *c = NULL;
    jsd_error err;
    jsd_error_clear(&err);
    ASSERT_OK(jsd_conn_open(&c, &o, &err), err.msg);
    return c;
}

jsd_conn *rt_conn(const char *url)
{
    return rt_conn_with(url, 1);
}

/* Make a relay with its own store handle and connection (opts may be NULL). */
void rt_relay_make(rt_relay *t, const rt_store *st, const char *nats_url,
                   const jsd_relay_opts *opts)
{
    rt_relay_make_with(t, st, nats_url, opts, 1);
}

void rt_relay_make_with(rt_relay *t, const rt_store *st, const char *nats_url,
                        const jsd_relay_opts *opts, int coalesce_writes)
{
    memset(t, 0, sizeof(*t));
    t->store = rt_open(st);
    t->conn = rt_conn_with(nats_url, coalesce_writes);
    jsd_error err;
    jsd_error_clear(&err);
    ASSERT_OK(jsd_relay_create(&t->relay, t->store, t->conn, opts, &err), err.msg);
}

void rt_relay_start(rt_relay *t, bool until_idle)
{
    t->until_idle = until_idle;
    t->done = 0;
    ASSERT_EQ(pthread_create(&t->th, NULL, rt_relay_main, t), 0);
}

bool rt_relay_done(rt_relay *t)
{
    return __atomic_load_n(&t->done, __ATOMIC_SEQ_CST) != 0;
}

/* Stop (if running), join, free. */
void rt_relay_finish(rt_relay *t)
{
    if (t->th) {
        jsd_relay_stop(t->relay);
        pthread_join(t->th, NULL);
        t->th = 0;
        ASSERT_OK(t->rc, jsd_relay_errmsg(t->relay));
    }
    jsd_relay_destroy(t->relay);
    jsd_conn_close(t->conn);
    jsd_store_close(t->store);
    t->relay = NULL;
    t->conn = NULL;
    t->store = NULL;
}

/* ---- `jsdurable relay` as a process --------------------------------------------------- */

/* Spawn `jsdurable relay --store URL --nats URL <extra...>` with JSD_CRASH_AT
 * set to crash_at when given; stderr and stdout go to log. */
pid_t rt_spawn_relay(const char *store_url, const char *nats_url, const char *crash_at,
                     const char *log, const char *const *extra)
{
    const char *argv[48];
    int a = 0;
    argv[a++] = jsd_fx_bin("jsdurable");
    argv[a++] = "relay";
    argv[a++] = "--store";
    argv[a++] = store_url;
    argv[a++] = "--nats";
    argv[a++] = nats_url;
    argv[a++] = "--log-level";
    argv[a++] = "info";
    for (int i = 0; extra && extra[i] && a < 46; i++)
        argv[a++] = extra[i];
    argv[a] = NULL;

    return jsd_test_spawn(argv, log, false, crash_at);
}

/* Wait up to ms for pid; returns the raw wait status, or -1 on timeout. */
int rt_wait_pid(pid_t pid, int64_t ms)
{
    int64_t end = jsd_test_mono_ms() + ms;
    for (;;) {
        int st = 0;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return st;
        if (jsd_test_mono_ms() >= end)
            return -1;
        jsd_test_sleep_ms(10);
    }
}

/* Print a log file (for a failing case). */
void rt_dump(const char *path)
{
    char cmd[1200], out[16384];
    snprintf(cmd, sizeof(cmd), "tail -n 60 '%s'", path);
    jsd_test_run(cmd, out, sizeof(out));
    fprintf(stderr, "---- %s ----\n%s\n", path, out);
}
