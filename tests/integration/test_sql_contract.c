/*
 * The outbox as a SQL contract (docs/SQL-CONTRACT.md), on both store back
 * ends, written the way an application in another language writes it: raw
 * SQL through the native drivers, never jsd_tx_emit. Each limit crossed by a
 * foreign INSERT is refused by the database with the rule's name; the
 * minimal INSERT (and jsd_emit on PostgreSQL) is published by the real relay
 * to a real nats-server under exactly the msg id jsd_tx_emit would have
 * given, with its payload bytes and headers; a row that slipped past the
 * constraints is dead-lettered with its reason while the others flow; a
 * schema-3 store keeps every row through migration 4; `jsdurable migrate`
 * and `jsdurable schema --print` make stores jsdurable opens as they are.
 */
#include "relay_env.h"
#include "store/backend.h"
#include "store/store.h"

typedef struct ct_env {
    rt_store st;
    rt_nats nt;
    const char *nats_url;
    char stream[64];
    char subject[100];
    sqlite3 *rw; /* the foreign writer on SQLite */
} ct_env;

static void env_up(ct_env *e, rt_backend kind)
{
    memset(e, 0, sizeof(*e));
    rt_store_new(&e->st, kind);
    e->nats_url = jsd_fx_shared_nats_url();
    char root[64], filter[80];
    snprintf(e->stream, sizeof(e->stream), "%s", jsd_test_unique("CONTRACT"));
    snprintf(root, sizeof(root), "%s", jsd_test_unique("contract"));
    snprintf(filter, sizeof(filter), "%s.>", root);
    snprintf(e->subject, sizeof(e->subject), "%s.orders", root);
    rt_nats_open(&e->nt, e->nats_url);
    rt_stream_add(&e->nt, e->stream, filter);
    jsd_store_close(rt_open(&e->st)); /* the schema */
    rt_reader(&e->st);
    if (kind == RT_SQLITE) {
        ASSERT_EQ(sqlite3_open(e->st.url + strlen("sqlite:"), &e->rw), SQLITE_OK);
        sqlite3_busy_timeout(e->rw, 5000);
    }
}

static void env_down(ct_env *e)
{
    sqlite3_close(e->rw);
    rt_nats_close(&e->nt);
    rt_store_close(&e->st);
}

/* Run sql as the foreign writer: 0, or -1 with the database's error in why. */
static int foreign(ct_env *e, const char *sql, char *why, size_t cap)
{
    why[0] = '\0';
    if (e->st.kind == RT_SQLITE) {
        char *msg = NULL;
        int rc = sqlite3_exec(e->rw, sql, NULL, NULL, &msg);
        if (rc != SQLITE_OK)
            snprintf(why, cap, "%s", msg ? msg : sqlite3_errstr(rc));
        sqlite3_free(msg);
        return rc == SQLITE_OK ? 0 : -1;
    }
    PGresult *r = PQexec(e->st.pg, sql);
    ExecStatusType t = PQresultStatus(r);
    int ok = t == PGRES_COMMAND_OK || t == PGRES_TUPLES_OK;
    if (!ok)
        snprintf(why, cap, "%s", PQresultErrorMessage(r));
    PQclear(r);
    return ok ? 0 : -1;
}

static void foreign_ok(ct_env *e, const char *sql)
{
    char why[2048];
    if (foreign(e, sql, why, sizeof(why)) != 0)
        fail_msg("`%.300s` failed: %s", sql, why);
}

/* A payload literal of the backend: hex digits. */
static const char *blob(const ct_env *e, const char *hex, char *buf, size_t cap)
{
    if (e->st.kind == RT_SQLITE)
        snprintf(buf, cap, "x'%s'", hex);
    else
        snprintf(buf, cap, "'\\x%s'::bytea", hex);
    return buf;
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

static void relay_until_idle(ct_env *e)
{
    rt_relay t;
    jsd_relay_opts o = quick_opts();
    rt_relay_make(&t, &e->st, e->nats_url, &o);
    jsd_status rc = jsd_relay_run_until_idle(t.relay);
    if (rc != JSD_OK && rc != JSD_ERR_LIMIT && rc != JSD_ERR_EXISTS)
        print_message("relay: %s\n", jsd_relay_errmsg(t.relay));
    rt_relay_finish(&t);
}

/* ---- every limit crossed by a foreign INSERT is refused with its rule's name ------------ */

typedef struct refusal {
    const char *rule;
    const char *owner, *id, *subject, *headers, *order_key, *msg_id;
    const char *payload_sqlite, *payload_pg; /* NULL: one byte */
    const char *not_before;                  /* NULL: default */
} refusal;

static void refused(rt_backend kind)
{
    ct_env e;
    env_up(&e, kind);
    char long_ident[300], long_subject[300], long_name[80], long_value[300], many[1200], big[6000],
        name_long[200], value_long[400];
    memset(long_ident, 'x', 257);
    long_ident[257] = '\0';
    memset(long_subject, 'a', 257);
    long_subject[257] = '\0';
    memset(long_name, 'N', 65);
    long_name[65] = '\0';
    memset(long_value, 'v', 257);
    long_value[257] = '\0';
    snprintf(name_long, sizeof(name_long), "{\"%s\": \"x\"}", long_name);
    snprintf(value_long, sizeof(value_long), "{\"a\": \"%s\"}", long_value);
    size_t o = 0;
    o += (size_t)snprintf(many + o, sizeof(many) - o, "{");
    for (int i = 0; i < 17; i++)
        o += (size_t)snprintf(many + o, sizeof(many) - o, "%s\"H%d\": \"v\"", i ? ", " : "", i);
    snprintf(many + o, sizeof(many) - o, "}");
    o = 0;
    o += (size_t)snprintf(big + o, sizeof(big) - o, "{");
    for (int i = 0; i < 16; i++) {
        char v[251];
        memset(v, 'v', 250);
        v[250] = '\0';
        o += (size_t)snprintf(big + o, sizeof(big) - o, "%s\"H%02d%s\": \"%s\"", i ? ", " : "", i,
                              "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn", v);
    }
    snprintf(big + o, sizeof(big) - o, "}");
    const refusal cases[] = {
        {.rule = "jsd_outbox_subject_length", .subject = ""},
        {.rule = "jsd_outbox_subject_length", .subject = long_subject},
        {.rule = "jsd_outbox_subject_exact", .subject = "orders.*"},
        {.rule = "jsd_outbox_subject_exact", .subject = "orders.>"},
        {.rule = "jsd_outbox_subject_exact", .subject = "orders created"},
        {.rule = "jsd_outbox_subject_exact", .subject = "orders\tcreated"},
        {.rule = "jsd_outbox_subject_exact", .subject = "orders..created"},
        {.rule = "jsd_outbox_subject_exact", .subject = ".orders"},
        {.rule = "jsd_outbox_subject_exact", .subject = "orders."},
        {.rule = "jsd_outbox_subject_exact", .subject = "$SYS.x"},
        {.rule = "jsd_outbox_subject_reserved", .subject = "_INBOX.abc"},
        {.rule = "jsd_outbox_subject_reserved", .subject = "_INBOX"},
        {.rule = "jsd_outbox_owner", .owner = long_ident},
        {.rule = "jsd_outbox_owner", .owner = "a\x01z"},
        {.rule = "jsd_outbox_effect_id", .id = ""},
        {.rule = "jsd_outbox_effect_id", .id = long_ident},
        {.rule = "jsd_outbox_effect_id", .id = "a\nb"},
        {.rule = "jsd_outbox_order_key", .order_key = ""},
        {.rule = "jsd_outbox_order_key", .order_key = long_ident},
        {.rule = "jsd_outbox_msg_id", .msg_id = long_ident},
        {.rule = "jsd_outbox_payload",
         .payload_sqlite = "zeroblob(262145)",
         .payload_pg = "decode(repeat('00', 262145), 'hex')"},
        {.rule = "jsd_outbox_times", .not_before = "-1"},
        {.rule = "jsd_outbox_headers_json", .headers = "[1]"},
        {.rule = "jsd_outbox_headers_json", .headers = "\"X-Trace\""},
        {.rule = "jsd_outbox_headers_count", .headers = many},
        {.rule = "jsd_outbox_header_name", .headers = "{\"Nats-Msg-Id\": \"forged\"}"},
        {.rule = "jsd_outbox_header_name", .headers = "{\"nats-expected-stream\": \"X\"}"},
        {.rule = "jsd_outbox_header_name", .headers = "{\"a:b\": \"x\"}"},
        {.rule = "jsd_outbox_header_name", .headers = "{\"a b\": \"x\"}"},
        {.rule = "jsd_outbox_header_name", .headers = "{\"\": \"x\"}"},
        {.rule = "jsd_outbox_header_name", .headers = name_long},
        {.rule = "jsd_outbox_header_value", .headers = "{\"a\": 1}"},
        {.rule = "jsd_outbox_header_value", .headers = "{\"a\": \"x\\ny\"}"},
        {.rule = "jsd_outbox_header_value", .headers = "{\"a\": \"x\\ry\"}"},
        {.rule = "jsd_outbox_header_value", .headers = value_long},
        {.rule = "jsd_outbox_header_value", .headers = "{\"a\": \"\"}"},
        {.rule = "jsd_outbox_header_value", .headers = "{\"a\": \" x\"}"},
        {.rule = "jsd_outbox_header_value", .headers = "{\"a\": \"x\\t\"}"},
        {.rule = "jsd_outbox_headers_size", .headers = big},
    };
    char sql[300000], why[4096], pay[64];
    /* the minimal write is accepted, so each refusal below is the rule's */
    snprintf(sql, sizeof(sql),
             "INSERT INTO jsd_outbox(owner, effect_id, subject, payload) VALUES ('o', 'ok', "
             "'%s', %s)",
             e.subject, blob(&e, "00", pay, sizeof(pay)));
    foreign_ok(&e, sql);
    for (size_t i = 0; i < JSD_ARRAY_LEN(cases); i++) {
        const refusal *c = &cases[i];
        /* SQLite's CHECK cannot read the members of the JSON (json_each), and
         * an INSERT trigger would slow every insert: these are the relay's
         * there (slipped_past) */
        if (kind == RT_SQLITE && (strstr(c->rule, "_header_") || strstr(c->rule, "headers_count") ||
                                  strstr(c->rule, "headers_size")))
            continue;
        char id[300], nb[64] = "";
        snprintf(id, sizeof(id), "%s", c->id ? c->id : "");
        if (!c->id)
            snprintf(id, sizeof(id), "case-%zu", i);
        if (c->not_before)
            snprintf(nb, sizeof(nb), ", %s", c->not_before);
        const char *payload = kind == RT_SQLITE ? c->payload_sqlite : c->payload_pg;
        char hdr[6100] = "NULL", ok_[300] = "NULL", mid[300] = "NULL";
        if (c->headers)
            snprintf(hdr, sizeof(hdr), "'%s'", c->headers);
        if (c->order_key)
            snprintf(ok_, sizeof(ok_), "'%s'", c->order_key);
        if (c->msg_id)
            snprintf(mid, sizeof(mid), "'%s'", c->msg_id);
        snprintf(sql, sizeof(sql),
                 "INSERT INTO jsd_outbox(owner, effect_id, subject, payload, headers_json, "
                 "order_key, msg_id%s) VALUES ('%s', '%s', '%s', %s, %s, %s, %s%s)",
                 nb[0] ? ", not_before" : "", c->owner ? c->owner : "o", id,
                 c->subject ? c->subject : e.subject,
                 payload ? payload : blob(&e, "01", pay, sizeof(pay)), hdr, ok_, mid, nb);
        if (foreign(&e, sql, why, sizeof(why)) == 0)
            fail_msg("case %zu (%s) was accepted: %.400s", i, c->rule, sql);
        if (!strstr(why, c->rule))
            fail_msg("case %zu: refused as \"%s\", not by %s", i, why, c->rule);
    }
    if (kind == RT_PG) {
        /* SQLite checks a given msg id's length only (rows with a msg id are
         * the library's: FOREIGN_ONLY in sqlite.c); the relay the rest */
        snprintf(sql, sizeof(sql),
                 "INSERT INTO jsd_outbox(owner, effect_id, subject, payload, msg_id) VALUES "
                 "('o', 'spaced', '%s', %s, 'has space')",
                 e.subject, blob(&e, "00", pay, sizeof(pay)));
        ASSERT_EQ(foreign(&e, sql, why, sizeof(why)), -1);
        ASSERT_CONTAINS(why, "jsd_outbox_msg_id");
    }
    /* both forms of headers in one row are refused */
    snprintf(sql, sizeof(sql),
             "INSERT INTO jsd_outbox(owner, effect_id, subject, payload, headers, headers_json) "
             "VALUES ('o', 'two', '%s', %s, %s, '{}')",
             e.subject, blob(&e, "00", pay, sizeof(pay)), blob(&e, "0100", why, 64));
    ASSERT_EQ(foreign(&e, sql, why, sizeof(why)), -1);
    ASSERT_CONTAINS(why, "jsd_outbox_headers_one_form");
    ASSERT_EQ(rt_q(&e.st, RT_SQL_TOTAL), 1);
    env_down(&e);
}

static void refused_sqlite(void **state)
{
    (void)state;
    refused(RT_SQLITE);
}
static void refused_pg(void **state)
{
    (void)state;
    refused(RT_PG);
}

/* ---- foreign rows are published as jsd_tx_emit's would be ------------------------------- */

/* The stream's message at the row's receipt. */
static natsMsg *stored(ct_env *e, const char *effect_id)
{
    char sql[200];
    snprintf(sql, sizeof(sql), "SELECT stream_seq FROM jsd_outbox_state WHERE effect_id = '%s'",
             effect_id);
    long long seq = rt_q(&e->st, sql);
    if (seq < 1)
        fail_msg("effect %s has no receipt", effect_id);
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    ASSERT_EQ(js_GetMsg(&m, e->nt.js, e->stream, (uint64_t)seq, NULL, &jerr), NATS_OK);
    return m;
}

static void assert_msg(ct_env *e, const char *ns, const char *effect_id, const void *payload,
                       int len, const char *trace)
{
    natsMsg *m = stored(e, effect_id);
    char want[JSD_MSG_ID_MAX];
    ASSERT_OK(jsd_effect_msg_id(ns, "o", effect_id, want));
    const char *v = NULL;
    ASSERT_EQ(natsMsgHeader_Get(m, "Nats-Msg-Id", &v), NATS_OK);
    ASSERT_STREQ(v, want);
    ASSERT_EQ(natsMsg_GetDataLength(m), len);
    ASSERT_TRUE(memcmp(natsMsg_GetData(m), payload, (size_t)len) == 0);
    v = NULL;
    if (trace) {
        ASSERT_EQ(natsMsgHeader_Get(m, "X-Trace", &v), NATS_OK);
        ASSERT_STREQ(v, trace);
    } else {
        ASSERT_EQ(natsMsgHeader_Get(m, "X-Trace", &v), NATS_NOT_FOUND);
    }
    natsMsg_Destroy(m);
}

static void foreign_rows_publish(rt_backend kind)
{
    ct_env e;
    env_up(&e, kind);
    char ns[JSD_NAMESPACE_MAX + 1], sql[1024], pay[64];
    rt_ns(&e.st, ns);
    /* the library's own effect, with the header the foreign rows carry too */
    jsd_store *app = rt_open(&e.st);
    jsd_tx *tx = NULL;
    ASSERT_OK(jsd_tx_begin(&tx, app));
    jsd_header h[] = {{"X-Trace", "abc"}};
    jsd_effect ef = {.owner = "o",
                     .id = "lib",
                     .subject = e.subject,
                     .headers = h,
                     .n_headers = 1,
                     .payload = "\x00\xff\x10",
                     .len = 3};
    ASSERT_OK(jsd_tx_emit(tx, &ef));
    ASSERT_OK(jsd_tx_commit(tx));
    jsd_store_close(app);
    /* the minimal write */
    snprintf(sql, sizeof(sql),
             "INSERT INTO jsd_outbox(owner, effect_id, subject, payload) VALUES ('o', 'min', "
             "'%s', %s)",
             e.subject, blob(&e, "00ff10", pay, sizeof(pay)));
    foreign_ok(&e, sql);
    /* headers as JSON, in one transaction with the application's own row */
    snprintf(sql, sizeof(sql),
             "BEGIN; CREATE TABLE orders (id TEXT PRIMARY KEY); INSERT INTO orders VALUES ('42'); "
             "INSERT INTO jsd_outbox(owner, effect_id, subject, payload, headers_json) "
             "VALUES ('o', 'hdr', '%s', %s, '{\"X-Trace\": \"abc\"}'); COMMIT",
             e.subject, blob(&e, "00ff10", pay, sizeof(pay)));
    foreign_ok(&e, sql);
    /* a durable timer an hour away: not published by this run */
    snprintf(sql, sizeof(sql),
             "INSERT INTO jsd_outbox(owner, effect_id, subject, payload, not_before) VALUES ('o', "
             "'later', '%s', %s, %lld)",
             e.subject, blob(&e, "00", pay, sizeof(pay)), (long long)jsd__now_ms() + 3600000);
    foreign_ok(&e, sql);
    /* rolled back: never published */
    snprintf(sql, sizeof(sql),
             "BEGIN; INSERT INTO jsd_outbox(owner, effect_id, subject, payload) VALUES ('o', "
             "'rolled-back', '%s', %s); ROLLBACK",
             e.subject, blob(&e, "00", pay, sizeof(pay)));
    foreign_ok(&e, sql);
    int n = 3;
    if (kind == RT_PG) {
        char got[128], want[JSD_MSG_ID_MAX];
        rt_qs(&e.st,
              "SELECT jsd_emit('o', 'fn', (SELECT subject FROM jsd_outbox_state WHERE effect_id = "
              "'min'), '\\x00ff10'::bytea, '{\"X-Trace\": \"abc\"}')",
              got, sizeof(got));
        ASSERT_OK(jsd_effect_msg_id(ns, "o", "fn", want));
        ASSERT_STREQ(got, want); /* the id jsd_emit answers is the one published */
        n = 4;
    }
    relay_until_idle(&e);
    ASSERT_EQ(rt_stream_count(&e.nt, e.stream), n);
    ASSERT_EQ(rt_published(&e.st), n);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DEAD), 0);
    ASSERT_EQ(rt_q(&e.st, "SELECT count(*) FROM jsd_outbox_state WHERE effect_id = 'later' AND "
                          "published_at IS NULL AND attempts = 0"),
              1);
    assert_msg(&e, ns, "lib", "\x00\xff\x10", 3, "abc");
    assert_msg(&e, ns, "min", "\x00\xff\x10", 3, NULL);
    assert_msg(&e, ns, "hdr", "\x00\xff\x10", 3, "abc");
    if (kind == RT_PG)
        assert_msg(&e, ns, "fn", "\x00\xff\x10", 3, "abc");
    /* the derived id is stored with the row, for every later retry */
    char want[JSD_MSG_ID_MAX], got[128];
    ASSERT_OK(jsd_effect_msg_id(ns, "o", "min", want));
    rt_qs(&e.st, "SELECT msg_id FROM jsd_outbox_state WHERE effect_id = 'min'", got, sizeof(got));
    ASSERT_STREQ(got, want);
    /* exactly once: a second relay run publishes nothing more */
    relay_until_idle(&e);
    ASSERT_EQ(rt_stream_count(&e.nt, e.stream), n);
    env_down(&e);
}

static void foreign_rows_publish_sqlite(void **state)
{
    (void)state;
    foreign_rows_publish(RT_SQLITE);
}
static void foreign_rows_publish_pg(void **state)
{
    (void)state;
    foreign_rows_publish(RT_PG);
}

/* ---- the namespace of rows without a msg_id --------------------------------------------- */

/* The first open with an operator namespace records it; rows written without
 * a msg_id then get exactly the id jsd_tx_emit gives under that namespace. */
static void operator_namespace(rt_backend kind)
{
    rt_store st;
    rt_store_new(&st, kind);
    char url[700], sql[400], want[JSD_MSG_ID_MAX], got[128];
    snprintf(url, sizeof(url), "%s%snamespace=tenant-a", st.url,
             kind == RT_PG ? (strchr(st.url, '?') ? "&" : "?") : "?");
    jsd_store *s = NULL;
    jsd_error err;
    ASSERT_OK(jsd_store_open(&s, url, &err), err.msg);
    rt_reader(&st);
    rt_qs(&st, "SELECT value FROM jsd_meta WHERE key = 'namespace'", got, sizeof(got));
    ASSERT_STREQ(got, "tenant-a");
    /* a later open with another namespace does not change it */
    jsd_store *other = NULL;
    char url2[700];
    snprintf(url2, sizeof(url2), "%s%snamespace=tenant-b", st.url,
             kind == RT_PG ? (strchr(st.url, '?') ? "&" : "?") : "?");
    ASSERT_OK(jsd_store_open(&other, url2, &err), err.msg);
    jsd_store_close(other);
    rt_qs(&st, "SELECT value FROM jsd_meta WHERE key = 'namespace'", got, sizeof(got));
    ASSERT_STREQ(got, "tenant-a");
    /* jsd_tx_emit on the tenant-a handle, and a foreign row */
    jsd_tx *tx = NULL;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    jsd_effect ef = {.owner = "o", .id = "lib", .subject = "a.b", .payload = "x", .len = 1};
    ASSERT_OK(jsd_tx_emit(tx, &ef));
    ASSERT_OK(jsd_tx_commit(tx));
    snprintf(sql, sizeof(sql),
             "INSERT INTO jsd_outbox(owner, effect_id, subject, payload) VALUES ('o', 'fx', "
             "'a.b', %s)",
             kind == RT_SQLITE ? "x'78'" : "'\\x78'::bytea");
    if (kind == RT_SQLITE) {
        sqlite3 *db = NULL;
        ASSERT_EQ(sqlite3_open(st.url + strlen("sqlite:"), &db), SQLITE_OK);
        ASSERT_EQ(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
        sqlite3_close(db);
    } else {
        PQclear(PQexec(st.pg, sql));
    }
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "t", jsd__now_ms(), &b));
    ASSERT_EQ(b.n, 2);
    ASSERT_STREQ(b.items[0].effect_id, "lib");
    ASSERT_STREQ(b.items[1].effect_id, "fx");
    ASSERT_OK(jsd_effect_msg_id("tenant-a", "o", "fx", want));
    ASSERT_STREQ(b.items[1].msg_id, want);
    ASSERT_OK(jsd_effect_msg_id("tenant-a", "o", "lib", want));
    ASSERT_STREQ(b.items[0].msg_id, want);
    jsd__effect_batch_free(&b);
    jsd_store_close(s);
    rt_store_close(&st);
}

static void operator_namespace_sqlite(void **state)
{
    (void)state;
    operator_namespace(RT_SQLITE);
}
static void operator_namespace_pg(void **state)
{
    (void)state;
    operator_namespace(RT_PG);
}

/* ---- a row that slipped past is dead-lettered, the others flow ---------------------------- */

static void slipped_past(rt_backend kind)
{
    ct_env e;
    env_up(&e, kind);
    char sql[4096], pay[64];
    /* a writer that turned the checks off */
    if (kind == RT_SQLITE)
        foreign_ok(&e, "PRAGMA ignore_check_constraints = ON");
    for (int i = 0; i < 5; i++) {
        snprintf(sql, sizeof(sql),
                 "INSERT INTO jsd_outbox(owner, effect_id, subject, payload) VALUES ('o', 'g%d', "
                 "'%s', %s)",
                 i, e.subject, blob(&e, "676f6f64", pay, sizeof(pay)));
        foreign_ok(&e, sql);
    }
    static const struct {
        const char *id, *owner, *headers, *subject, *reason;
        bool big;
    } bad[] = {
        {"not-object", "o", "[1]", NULL, "headers_json is not a JSON object", false},
        {"forged", "o", "{\"Nats-Msg-Id\": \"forged\"}", NULL, "reserved", false},
        {"not-string", "o", "{\"X-Trace\": 7}", NULL, "is not a string", false},
        {"control", "a\x01z", NULL, NULL, "owner is not valid UTF-8 text", false},
        {"inbox", "o", NULL, "_INBOX.steal", "_INBOX", false},
        {"big", "o", NULL, NULL, "payload is 262145 bytes", true},
        {"colon", "o", "{\"a:b\": \"x\"}", NULL, "names are printable ASCII", false},
        {"crlf", "o", "{\"a\": \"x\\ny\"}", NULL, "holds CR or LF", false},
        {"empty", "o", "{\"a\": \"\"}", NULL, "value is empty", false},
    };
    for (size_t i = 0; i < JSD_ARRAY_LEN(bad); i++) {
        char hdr[200] = "NULL", subj[200];
        if (bad[i].headers)
            snprintf(hdr, sizeof(hdr), "'%s'", bad[i].headers);
        snprintf(subj, sizeof(subj), "%s", bad[i].subject ? bad[i].subject : e.subject);
        const char *payload = !bad[i].big         ? blob(&e, "78", pay, sizeof(pay))
                              : kind == RT_SQLITE ? "zeroblob(262145)"
                                                  : "decode(repeat('00', 262145), 'hex')";
        /* PostgreSQL: its header rules are in the trigger that derives msg
         * ids, so such a writer gives its own id */
        if (kind == RT_PG)
            foreign_ok(&e, "ALTER TABLE jsd_outbox DISABLE TRIGGER jsd_outbox_fill");
        snprintf(sql, sizeof(sql),
                 "INSERT INTO jsd_outbox(owner, effect_id, subject, payload, headers_json, "
                 "msg_id, next_attempt_at, not_before) VALUES ('%s', '%s', '%s', %s, %s, 'm-%s', "
                 "0, 0)",
                 bad[i].owner, bad[i].id, subj, payload, hdr, bad[i].id);
        foreign_ok(&e, sql);
        if (kind == RT_PG)
            foreign_ok(&e, "ALTER TABLE jsd_outbox ENABLE TRIGGER jsd_outbox_fill");
    }
    snprintf(sql, sizeof(sql),
             "INSERT INTO jsd_outbox(owner, effect_id, subject, payload, msg_id, not_before, "
             "next_attempt_at) VALUES ('o', 'spaced', '%s', %s, 'has space', 0, 0)",
             e.subject, blob(&e, "78", pay, sizeof(pay)));
    if (kind == RT_PG)
        foreign_ok(&e, "ALTER TABLE jsd_outbox DISABLE TRIGGER jsd_outbox_fill");
    foreign_ok(&e, sql);
    if (kind == RT_PG)
        foreign_ok(&e, "ALTER TABLE jsd_outbox ENABLE TRIGGER jsd_outbox_fill");
    for (int i = 5; i < 8; i++) {
        snprintf(sql, sizeof(sql),
                 "INSERT INTO jsd_outbox(owner, effect_id, subject, payload) VALUES ('o', 'g%d', "
                 "'%s', %s)",
                 i, e.subject, blob(&e, "676f6f64", pay, sizeof(pay)));
        foreign_ok(&e, sql);
    }
    relay_until_idle(&e);
    ASSERT_EQ(rt_published(&e.st), 8);
    ASSERT_EQ(rt_stream_count(&e.nt, e.stream), 8);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DEAD), (long long)JSD_ARRAY_LEN(bad) + 1);
    char spaced[1200];
    rt_qs(&e.st, "SELECT dead_reason FROM jsd_outbox_state WHERE effect_id = 'spaced'", spaced,
          sizeof(spaced));
    ASSERT_CONTAINS(spaced, "msg_id holds a byte outside printable ASCII");
    for (size_t i = 0; i < JSD_ARRAY_LEN(bad); i++) {
        char reason[1200];
        snprintf(sql, sizeof(sql),
                 "SELECT dead_reason FROM jsd_outbox_state WHERE effect_id = '%s'", bad[i].id);
        rt_qs(&e.st, sql, reason, sizeof(reason));
        if (!strstr(reason, bad[i].reason))
            fail_msg("%s: dead reason \"%s\" does not say \"%s\"", bad[i].id, reason,
                     bad[i].reason);
    }
    env_down(&e);
}

static void slipped_past_sqlite(void **state)
{
    (void)state;
    slipped_past(RT_SQLITE);
}
static void slipped_past_pg(void **state)
{
    (void)state;
    slipped_past(RT_PG);
}

/* ---- a schema-3 store keeps every row through migration 4 --------------------------------- */

static void exec_ok(sqlite3 *db, const char *sql)
{
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK)
        fail_msg("`%.200s`: %s", sql, msg ? msg : "?");
}

static void sqlite_upgrade_keeps_rows(void **state)
{
    (void)state;
    char url[512];
    jsd_fx_sqlite_url(url, sizeof(url));
    const char *path = url + strlen("sqlite:");
    sqlite3 *db = NULL;
    ASSERT_EQ(sqlite3_open(path, &db), SQLITE_OK);
    exec_ok(db, "CREATE TABLE jsd_schema_version (version INTEGER PRIMARY KEY, applied_at "
                "INTEGER NOT NULL)");
    for (int v = 1; v <= 3; v++) {
        for (const char *const *q = jsd__sqlite_migration(v); *q; q++)
            exec_ok(db, *q);
        char ins[100];
        snprintf(ins, sizeof(ins), "INSERT INTO jsd_schema_version VALUES (%d, 0)", v);
        exec_ok(db, ins);
    }
    exec_ok(db, "INSERT INTO jsd_meta VALUES ('store_id', '0123456789abcdef0123456789abcdef')");
    /* a published row, a pending one with the library's binary headers, and
     * one no constraint of schema 4 would admit */
    jsd_header h[] = {{"X-Trace", "abc"}};
    unsigned char enc[64];
    size_t n = jsd__headers_encoded_size(h, 1);
    jsd__headers_encode(h, 1, enc);
    char hex[200] = "";
    for (size_t i = 0; i < n; i++)
        snprintf(hex + 2 * i, 3, "%02x", enc[i]);
    char sql[1024];
    exec_ok(db, "INSERT INTO jsd_outbox (id, owner, effect_id, msg_id, subject, payload, "
                "created_at, not_before, next_attempt_at, stream, stream_seq, published_at) "
                "VALUES (5, 'o', 'done', 'mid-5', 'a.b', x'00', 1, 1, 1, 'S', 1, 2)");
    snprintf(sql, sizeof(sql),
             "INSERT INTO jsd_outbox (id, owner, effect_id, msg_id, subject, headers, payload, "
             "created_at, not_before, next_attempt_at) VALUES (7, 'o', 'hdr', 'mid-7', 'a.b', "
             "x'%s', x'01', 1, 1, 1)",
             hex);
    exec_ok(db, sql);
    exec_ok(db, "INSERT INTO jsd_outbox (id, owner, effect_id, msg_id, subject, payload, "
                "created_at, not_before, next_attempt_at) VALUES (9, 'o', 'bad', 'mid-9', "
                "'a b', x'02', 1, 1, 1)");
    sqlite3_close(db);

    jsd_store *s = NULL;
    jsd_error err;
    ASSERT_OK(jsd_store_open(&s, url, &err), err.msg);
    ASSERT_STREQ(jsd_store_id(s), "0123456789abcdef0123456789abcdef");
    rt_store st = {.kind = RT_SQLITE};
    snprintf(st.url, sizeof(st.url), "%s", url);
    ASSERT_EQ(rt_q(&st, "SELECT max(version) FROM jsd_schema_version"), JSD_STORE_SCHEMA_VERSION);
    ASSERT_EQ(rt_q(&st, "SELECT count(*) FROM jsd_outbox_state"), 3);
    ASSERT_EQ(rt_q(&st, "SELECT count(*) FROM jsd_outbox_state WHERE (id, msg_id) IN "
                        "(VALUES (5, 'mid-5'), (7, 'mid-7'), (9, 'mid-9'))"),
              3);
    ASSERT_EQ(rt_q(&st, "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name IN "
                        "('jsd_outbox_ready', 'jsd_outbox_keyed', 'jsd_outbox_published', "
                        "'jsd_outbox_dead')"),
              4);
    ASSERT_EQ(rt_q(&st, "SELECT count(*) FROM sqlite_master WHERE name = 'jsd_outbox_v4'"), 0);
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "t", jsd__now_ms(), &b));
    ASSERT_EQ(b.n, 2);
    ASSERT_EQ(b.items[0].row_id, 7);
    ASSERT_STREQ(b.items[0].msg_id, "mid-7");
    ASSERT_EQ(b.items[0].n_headers, 1);
    ASSERT_STREQ(b.items[0].headers[0].value, "abc");
    ASSERT_EQ(b.items[1].row_id, 9); /* the relay dead-letters its subject */
    jsd__effect_batch_free(&b);
    /* the next id continues after the copied ones */
    db = NULL;
    ASSERT_EQ(sqlite3_open(path, &db), SQLITE_OK);
    exec_ok(db, "INSERT INTO jsd_outbox(owner, effect_id, subject, payload) VALUES ('o', 'new', "
                "'a.b', x'00')");
    sqlite3_close(db);
    ASSERT_EQ(rt_q(&st, "SELECT id FROM jsd_outbox_state WHERE effect_id = 'new'"), 10);
    rt_store_close(&st);
    jsd_store_close(s);
}

/* PostgreSQL: the rules hold new rows only (jsd_outbox_fill), so an old row
 * that breaks one stays and the migration succeeds. */
static void pg_upgrade_keeps_rows(void **state)
{
    (void)state;
    rt_store st;
    rt_store_new(&st, RT_PG);
    PGconn *c = PQconnectdb(st.url);
    ASSERT_EQ(PQstatus(c), CONNECTION_OK);
    PQclear(PQexec(c, "CREATE TABLE jsd_schema_version (version INTEGER PRIMARY KEY, "
                      "applied_at BIGINT NOT NULL)"));
    for (int v = 1; v <= 3; v++) {
        for (const char *const *q = jsd__pg_migration(v); *q; q++) {
            char sql[4096];
            size_t o = 0;
            for (const char *p = *q; *p && o + 10 < sizeof(sql); p++) {
                if (*p == '@') {
                    memcpy(sql + o, "public.", 7);
                    o += 7;
                } else {
                    sql[o++] = *p;
                }
            }
            sql[o] = '\0';
            PGresult *r = PQexec(c, sql);
            if (PQresultStatus(r) != PGRES_COMMAND_OK)
                fail_msg("%s: %s", sql, PQresultErrorMessage(r));
            PQclear(r);
        }
        char ins[100];
        snprintf(ins, sizeof(ins), "INSERT INTO jsd_schema_version VALUES (%d, 0)", v);
        PQclear(PQexec(c, ins));
    }
    PQclear(PQexec(c, "INSERT INTO jsd_meta VALUES ('store_id', "
                      "'0123456789abcdef0123456789abcdef')"));
    PQclear(PQexec(c, "INSERT INTO jsd_outbox (owner, effect_id, msg_id, subject, payload, "
                      "created_at, not_before, next_attempt_at) VALUES ('o', 'bad', 'mid-1', "
                      "'a b', '\\x00', 1, 1, 1)"));
    PQfinish(c);
    jsd_store *s = NULL;
    jsd_error err;
    ASSERT_OK(jsd_store_open(&s, st.url, &err), err.msg);
    ASSERT_EQ(rt_q(&st, "SELECT max(version) FROM jsd_schema_version"), JSD_STORE_SCHEMA_VERSION);
    ASSERT_EQ(rt_q(&st, "SELECT count(*) FROM jsd_outbox_state WHERE msg_id = 'mid-1'"), 1);
    ASSERT_EQ(rt_q(&st, "SELECT count(*) FROM pg_trigger WHERE tgname = 'jsd_outbox_fill'"), 1);
    jsd_store_close(s);
    rt_store_close(&st);
}

/* ---- jsd_emit: the msg id back, a repeated identity refused, the relay woken --------------- */

static void pg_jsd_emit(void **state)
{
    (void)state;
    ct_env e;
    env_up(&e, RT_PG);
    char ns[JSD_NAMESPACE_MAX + 1], sql[1024], why[2048], want[JSD_MSG_ID_MAX];
    rt_ns(&e.st, ns);
    /* a relay that polls once an hour: only the NOTIFY of the commit wakes it */
    rt_relay t;
    jsd_relay_opts o = quick_opts();
    o.poll_interval_ms = 500000; /* inside the window (the retry horizon counts it) */
    rt_relay_make(&t, &e.st, e.nats_url, &o);
    rt_relay_start(&t, false);
    /* e0 may be found by the relay's first claim; once it is published the
     * relay waits, and only a wake-up can bring it e1 */
    snprintf(sql, sizeof(sql), "SELECT jsd_emit('o', 'e0', '%s', '\\x00'::bytea)", e.subject);
    foreign_ok(&e, sql);
    int64_t end = jsd_test_mono_ms() + 10000;
    while (rt_published(&e.st) < 1 && jsd_test_mono_ms() < end)
        jsd_test_sleep_ms(20);
    ASSERT_EQ(rt_published(&e.st), 1);
    snprintf(sql, sizeof(sql),
             "BEGIN; SELECT jsd_emit('o', 'rb', '%s', '\\x01'::bytea); ROLLBACK; "
             "BEGIN; SELECT jsd_emit('o', 'e1', '%s', '\\x68656c6c6f'::bytea, "
             "'{\"X-Trace\": \"t1\"}', now() - interval '1 second', 'key-1'); COMMIT",
             e.subject, e.subject);
    foreign_ok(&e, sql);
    end = jsd_test_mono_ms() + 10000;
    while (rt_published(&e.st) < 2 && jsd_test_mono_ms() < end)
        jsd_test_sleep_ms(20);
    ASSERT_EQ(rt_published(&e.st), 2);
    /* the same identity again: unique_violation, named */
    snprintf(sql, sizeof(sql), "SELECT jsd_emit('o', 'e1', '%s', '\\x00'::bytea)", e.subject);
    ASSERT_EQ(foreign(&e, sql, why, sizeof(why)), -1);
    ASSERT_CONTAINS(why, "jsd_emit: effect (owner 'o', id 'e1') already exists");
    PGresult *r = PQexec(e.st.pg, sql);
    ASSERT_STREQ(PQresultErrorField(r, PG_DIAG_SQLSTATE), "23505");
    PQclear(r);
    rt_relay_finish(&t);
    ASSERT_EQ(rt_stream_count(&e.nt, e.stream), 2);
    ASSERT_OK(jsd_effect_msg_id(ns, "o", "e1", want));
    natsMsg *m = stored(&e, "e1");
    const char *v = NULL;
    ASSERT_EQ(natsMsgHeader_Get(m, "Nats-Msg-Id", &v), NATS_OK);
    ASSERT_STREQ(v, want);
    ASSERT_EQ(natsMsgHeader_Get(m, "X-Trace", &v), NATS_OK);
    ASSERT_STREQ(v, "t1");
    ASSERT_EQ(natsMsg_GetDataLength(m), 5);
    ASSERT_TRUE(memcmp(natsMsg_GetData(m), "hello", 5) == 0);
    natsMsg_Destroy(m);
    char got[128];
    rt_qs(&e.st, "SELECT order_key FROM jsd_outbox_state WHERE effect_id = 'e1'", got, sizeof(got));
    ASSERT_STREQ(got, "key-1");
    env_down(&e);
}

/* ---- `jsdurable migrate` and `jsdurable schema --print` ------------------------------------ */

static void run_expect(const char *cmd, int want, char *out, size_t cap)
{
    int rc = jsd_test_run(cmd, out, cap);
    if (rc != want)
        fail_msg("`%s` exited %d, not %d:\n%s", cmd, rc, want, out);
}

/* The printed DDL applied by sqlite3 to an empty file is a store jsdurable
 * opens without migrating; migrate creates and reports. */
static void cli_schema_sqlite(void **state)
{
    (void)state;
    const char *J = jsd_fx_bin("jsdurable");
    char url[512], sqlf[700], cmd[2400], out[8192];
    jsd_fx_sqlite_url(url, sizeof(url));
    const char *path = url + strlen("sqlite:");
    snprintf(sqlf, sizeof(sqlf), "%s/schema.sql", jsd_test_dir());
    snprintf(cmd, sizeof(cmd), "%s schema --print > '%s' && sqlite3 -bail '%s' < '%s'", J, sqlf,
             path, sqlf);
    run_expect(cmd, 0, out, sizeof(out));
    jsd_store *s = NULL;
    jsd_error err;
    ASSERT_OK(jsd_store_open(&s, url, &err), err.msg);
    ASSERT_EQ(jsd_store_schema_found(s), JSD_STORE_SCHEMA_VERSION);
    ASSERT_EQ(strlen(jsd_store_id(s)), 32);
    jsd_store_close(s);
    snprintf(cmd, sizeof(cmd), "%s migrate --store '%s' --json", J, url);
    run_expect(cmd, 0, out, sizeof(out));
    char want[96];
    snprintf(want, sizeof(want), "\"from\":%d,\"version\":%d", JSD_STORE_SCHEMA_VERSION,
             JSD_STORE_SCHEMA_VERSION);
    ASSERT_CONTAINS(out, want);
    /* the contract holds in the printed schema too */
    snprintf(cmd, sizeof(cmd),
             "sqlite3 '%s' \"INSERT INTO jsd_outbox(owner, effect_id, subject, payload) VALUES "
             "('o', 'e', 'a.*', x'00')\" 2>&1",
             path);
    ASSERT_TRUE(jsd_test_run(cmd, out, sizeof(out)) != 0);
    ASSERT_CONTAINS(out, "jsd_outbox_subject_exact");
    /* a new file: created */
    char url2[512];
    jsd_fx_sqlite_url(url2, sizeof(url2));
    snprintf(cmd, sizeof(cmd), "%s migrate --store '%s'", J, url2);
    run_expect(cmd, 0, out, sizeof(out));
    snprintf(want, sizeof(want), "created schema version %d", JSD_STORE_SCHEMA_VERSION);
    ASSERT_CONTAINS(out, want);
    run_expect(cmd, 0, out, sizeof(out));
    snprintf(want, sizeof(want), "at schema version %d; nothing to do", JSD_STORE_SCHEMA_VERSION);
    ASSERT_CONTAINS(out, want);
    /* bad input */
    snprintf(cmd, sizeof(cmd), "%s schema --print --backend oracle", J);
    run_expect(cmd, 64, out, sizeof(out));
    ASSERT_CONTAINS(out, "--backend takes sqlite or postgres");
    snprintf(cmd, sizeof(cmd), "%s schema --print --backend postgres --schema 'a-b'", J);
    run_expect(cmd, 64, out, sizeof(out));
    ASSERT_CONTAINS(out, "is not valid");
    snprintf(cmd, sizeof(cmd), "%s migrate", J);
    run_expect(cmd, 64, out, sizeof(out));
    ASSERT_CONTAINS(out, "--store URL");
}

static void cli_schema_pg(void **state)
{
    (void)state;
    const char *J = jsd_fx_bin("jsdurable");
    rt_store st;
    rt_store_new(&st, RT_PG);
    char sqlf[700], cmd[3000], out[8192], url[700];
    snprintf(sqlf, sizeof(sqlf), "%s/schema-pg.sql", jsd_test_dir());
    snprintf(cmd, sizeof(cmd),
             "%s schema --print --backend postgres --schema dba_made > '%s' && "
             "psql -X -q -v ON_ERROR_STOP=1 '%s' -f '%s' 2>&1",
             J, sqlf, st.url, sqlf);
    run_expect(cmd, 0, out, sizeof(out));
    snprintf(url, sizeof(url), "%s%sschema=dba_made", st.url, strchr(st.url, '?') ? "&" : "?");
    jsd_store *s = NULL;
    jsd_error err;
    ASSERT_OK(jsd_store_open(&s, url, &err), err.msg);
    ASSERT_EQ(jsd_store_schema_found(s), JSD_STORE_SCHEMA_VERSION);
    char want[JSD_MSG_ID_MAX];
    ASSERT_OK(jsd_effect_msg_id(jsd_store_namespace(s), "o", "e", want));
    jsd_store_close(s);
    /* jsd_emit of the printed schema derives the library's id */
    snprintf(cmd, sizeof(cmd),
             "psql -X -qtA '%s' -c \"SELECT dba_made.jsd_emit('o', 'e', 'a.b', '\\x00')\"", st.url);
    run_expect(cmd, 0, out, sizeof(out));
    ASSERT_CONTAINS(out, want);
    snprintf(cmd, sizeof(cmd), "%s migrate --store '%s' --json", J, url);
    run_expect(cmd, 0, out, sizeof(out));
    snprintf(want, sizeof(want), "\"backend\":\"postgres\",\"from\":%d,\"version\":%d",
             JSD_STORE_SCHEMA_VERSION, JSD_STORE_SCHEMA_VERSION);
    ASSERT_CONTAINS(out, want);
    /* migrate on an empty schema creates it */
    snprintf(url, sizeof(url), "%s%sschema=fresh_one", st.url, strchr(st.url, '?') ? "&" : "?");
    snprintf(cmd, sizeof(cmd), "%s migrate --store '%s' --json", J, url);
    run_expect(cmd, 0, out, sizeof(out));
    snprintf(want, sizeof(want), "\"from\":0,\"version\":%d", JSD_STORE_SCHEMA_VERSION);
    ASSERT_CONTAINS(out, want);
    rt_store_close(&st);
}

JSD_TEST_MAIN(cmocka_unit_test(refused_sqlite), cmocka_unit_test(refused_pg),
              cmocka_unit_test(foreign_rows_publish_sqlite),
              cmocka_unit_test(foreign_rows_publish_pg),
              cmocka_unit_test(operator_namespace_sqlite), cmocka_unit_test(operator_namespace_pg),
              cmocka_unit_test(slipped_past_sqlite), cmocka_unit_test(slipped_past_pg),
              cmocka_unit_test(sqlite_upgrade_keeps_rows), cmocka_unit_test(pg_upgrade_keeps_rows),
              cmocka_unit_test(pg_jsd_emit), cmocka_unit_test(cli_schema_sqlite),
              cmocka_unit_test(cli_schema_pg))
