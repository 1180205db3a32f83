/*
 * The store's conformance suite (STORE-1..4, the store side of RELAY-1,2,
 * IN-1,2, DLQ-1): every case named sqlite_X and pg_X runs the same code
 * against a fresh SQLite file and a fresh PostgreSQL database of the run's
 * shared server. Cases without a prefix pair test one back end's own failure
 * modes (read-only file, full disk, schema option, URL errors).
 *
 * Time-dependent operations (claim, failures) take now_ms from the test, so
 * nothing here waits for a clock.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <sqlite3.h>

#include "doctor_int.h" /* jsd__doctor_outbox_subjects */
#include "fixture.h"
#include "store/backend.h" /* JSD__SCHEMA_VERSION */
#include "store/store.h"
#include "test.h"
#include "relay_env.h"

enum { BE_SQLITE = 1, BE_PG = 2 };
static int be_sqlite = BE_SQLITE, be_pg = BE_PG;

#define BE(state) (*(int *)*(state))
#define BOTH(f)                                                                                    \
    {"sqlite_" #f, f, NULL, NULL, &be_sqlite},                                                     \
    {                                                                                              \
        "pg_" #f, f, NULL, NULL, &be_pg                                                            \
    }

/* ---- helpers ------------------------------------------------------------------------ */

static void make_url(int be, char *url, size_t cap)
{
    if (be == BE_SQLITE)
        jsd_fx_sqlite_url(url, cap);
    else
        assert_int_equal(jsd_fx_pg_database(url, cap), 0);
}

static jsd_store *open_url(const char *url)
{
    jsd_store *s = NULL;
    jsd_error e;
    jsd_status rc = jsd_store_open(&s, url, &e);
    if (rc != JSD_OK)
        fail_msg("jsd_store_open(%s): %s: %s", url, jsd_status_name(rc), e.msg);
    return s;
}

static jsd_store *open_new(void **state, char *url, size_t cap)
{
    make_url(BE(state), url, cap);
    return open_url(url);
}

/* Run the application's own SQL on the transaction's native handle. */
static bool tx_sql_try(jsd_tx *tx, const char *sql)
{
    sqlite3 *db = jsd_tx_sqlite(tx);
    if (db)
        return sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK;
    PGconn *c = jsd_tx_pg(tx);
    assert_non_null(c);
    PGresult *r = PQexec(c, sql);
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    PQclear(r);
    return ok;
}

static void tx_sql(jsd_tx *tx, const char *sql)
{
    if (!tx_sql_try(tx, sql))
        fail_msg("application SQL failed: %s", sql);
}

static int64_t tx_i64(jsd_tx *tx, const char *sql)
{
    sqlite3 *db = jsd_tx_sqlite(tx);
    int64_t v = -1;
    if (db) {
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
            fail_msg("prepare %s: %s", sql, sqlite3_errmsg(db));
        if (sqlite3_step(st) == SQLITE_ROW)
            v = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        return v;
    }
    PGconn *c = jsd_tx_pg(tx);
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        fail_msg("%s: %s", sql, PQerrorMessage(c));
    if (PQntuples(r) > 0 && !PQgetisnull(r, 0, 0))
        v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

static void app_sql(jsd_store *s, const char *sql)
{
    jsd_tx *tx;
    ASSERT_OK_E(jsd_tx_begin(&tx, s), jsd_store_errmsg(s));
    tx_sql(tx, sql);
    ASSERT_OK_E(jsd_tx_commit(tx), jsd_store_errmsg(s));
}

static int64_t q_i64(jsd_store *s, const char *sql)
{
    jsd_tx *tx;
    ASSERT_OK_E(jsd_tx_begin(&tx, s), jsd_store_errmsg(s));
    int64_t v = tx_i64(tx, sql);
    jsd_tx_rollback(tx);
    return v;
}

/* A text value of the first row (SQL that returns one text column). */
static void q_text(jsd_store *s, const char *sql, char *out, size_t cap)
{
    jsd_tx *tx;
    out[0] = '\0';
    ASSERT_OK(jsd_tx_begin(&tx, s));
    sqlite3 *db = jsd_tx_sqlite(tx);
    if (db) {
        sqlite3_stmt *st = NULL;
        assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
        if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
            snprintf(out, cap, "%s", (const char *)sqlite3_column_text(st, 0));
        sqlite3_finalize(st);
    } else {
        PGresult *r = PQexec(jsd_tx_pg(tx), sql);
        assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
        if (PQntuples(r) > 0)
            snprintf(out, cap, "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
    }
    jsd_tx_rollback(tx);
}

static jsd_store_stats stats(jsd_store *s)
{
    jsd_store_stats st;
    ASSERT_OK_E(jsd_store_stats_get(s, &st), jsd_store_errmsg(s));
    return st;
}

static void emit1(jsd_store *s, const char *owner, const char *id, const char *subject)
{
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    jsd_effect e = {.owner = owner, .id = id, .subject = subject, .payload = "p", .len = 1};
    ASSERT_OK_E(jsd_tx_emit(tx, &e), jsd_store_errmsg(s));
    ASSERT_OK_E(jsd_tx_commit(tx), jsd_store_errmsg(s));
}

static void emit_key(jsd_store *s, const char *id, const char *key, int64_t not_before)
{
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    jsd_effect e = {.id = id, .subject = "orders.k", .order_key = key, .not_before_ms = not_before};
    ASSERT_OK_E(jsd_tx_emit(tx, &e), jsd_store_errmsg(s));
    ASSERT_OK_E(jsd_tx_commit(tx), jsd_store_errmsg(s));
}

static void receipt1(jsd_store *s, const char *token, int64_t row, size_t want_applied)
{
    jsd__receipt r = {
        .row_id = row, .stream = "ORDERS", .seq = (uint64_t)row, .published_at_ms = 1};
    r.published_at_ms = jsd__now_ms();
    size_t applied = 99;
    ASSERT_OK_E(jsd__store_record_receipts(s, token, &r, 1, &applied), jsd_store_errmsg(s));
    ASSERT_EQ(applied, want_applied);
}

static bool has_id(const jsd__effect_batch *b, const char *id)
{
    for (size_t i = 0; i < b->n; i++)
        if (!strcmp(b->items[i].effect_id, id))
            return true;
    return false;
}

/* ---- STORE-2: the application's rows and its effects commit together ----------------- */

static void atomic_commit_and_rollback(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    app_sql(s, "CREATE TABLE app_orders (id TEXT PRIMARY KEY, amount INTEGER)");
    jsd_tx *tx;

    /* Commit: both. */
    ASSERT_OK(jsd_tx_begin(&tx, s));
    tx_sql(tx, "INSERT INTO app_orders VALUES ('o1', 10)");
    jsd_effect e = {.owner = "o1", .id = "created", .subject = "orders.created"};
    ASSERT_OK(jsd_tx_emit(tx, &e));
    ASSERT_OK(jsd_tx_commit(tx));
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM app_orders"), 1);
    ASSERT_EQ(stats(s).backlog, 1);

    /* Rollback: neither. */
    ASSERT_OK(jsd_tx_begin(&tx, s));
    tx_sql(tx, "INSERT INTO app_orders VALUES ('o2', 20)");
    e.owner = "o2";
    ASSERT_OK(jsd_tx_emit(tx, &e));
    jsd_tx_rollback(tx);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM app_orders"), 1);
    ASSERT_EQ(stats(s).backlog, 1);

    /* The effect fails after the application's row: the application rolls back. */
    ASSERT_OK(jsd_tx_begin(&tx, s));
    tx_sql(tx, "INSERT INTO app_orders VALUES ('o3', 30)");
    jsd_effect bad = {.owner = "o3", .id = "created", .subject = "orders.*"};
    ASSERT_STATUS(jsd_tx_emit(tx, &bad), JSD_ERR_INVALID);
    jsd_tx_rollback(tx);

    /* The application's SQL fails after the effect: it rolls back. */
    ASSERT_OK(jsd_tx_begin(&tx, s));
    e.owner = "o4";
    ASSERT_OK(jsd_tx_emit(tx, &e));
    assert_false(tx_sql_try(tx, "INSERT INTO app_orders VALUES ('o1', 99)")); /* duplicate key */
    jsd_tx_rollback(tx);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM app_orders"), 1);
    ASSERT_EQ(stats(s).backlog, 1);

    /* On PostgreSQL a failed statement aborts the transaction: a commit after it
     * commits nothing and says so. */
    if (BE(state) == BE_PG) {
        ASSERT_OK(jsd_tx_begin(&tx, s));
        tx_sql(tx, "INSERT INTO app_orders VALUES ('o5', 50)");
        e.owner = "o5";
        ASSERT_OK(jsd_tx_emit(tx, &e));
        assert_false(tx_sql_try(tx, "INSERT INTO app_orders VALUES ('o1', 99)"));
        jsd_status rc = jsd_tx_commit(tx);
        ASSERT_NE(rc, JSD_OK);
        ASSERT_CONTAINS(jsd_store_errmsg(s), "nothing was committed");
        ASSERT_EQ(q_i64(s, "SELECT count(*) FROM app_orders"), 1);
        ASSERT_EQ(stats(s).backlog, 1);
    }
    jsd_store_close(s);
}

/* A process killed between the application's row + effect and COMMIT leaves
 * neither (the crash point sits in jsd_tx_commit, before the COMMIT). */
static void crash_before_commit_leaves_nothing(void **state)
{
    char url[512];
    make_url(BE(state), url, sizeof(url));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* The 2nd commit of this process dies: the 1st creates the table. */
        setenv("JSD_CRASH_AT", "store.before_commit:2", 1);
        jsd_store *s = NULL;
        if (jsd_store_open(&s, url, NULL) != JSD_OK)
            _exit(3);
        jsd_tx *tx;
        if (jsd_tx_begin(&tx, s) != JSD_OK ||
            !tx_sql_try(tx, "CREATE TABLE app_orders (id TEXT)") || jsd_tx_commit(tx) != JSD_OK)
            _exit(4);
        jsd_effect e = {.owner = "o1", .id = "created", .subject = "orders.created"};
        if (jsd_tx_begin(&tx, s) != JSD_OK ||
            !tx_sql_try(tx, "INSERT INTO app_orders VALUES ('o1')") ||
            jsd_tx_emit(tx, &e) != JSD_OK)
            _exit(5);
        jsd_tx_commit(tx);
        _exit(6); /* not reached */
    }
    int st = jsd_test_child_wait(pid);
    if (!WIFSIGNALED(st))
        fail_msg("child exited with %d instead of dying at the crash point", WEXITSTATUS(st));
    ASSERT_EQ(WTERMSIG(st), SIGKILL);
    jsd_store *s = open_url(url);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM app_orders"), 0);
    jsd_store_stats x = stats(s);
    ASSERT_EQ(x.backlog, 0);
    ASSERT_EQ(x.published, 0);
    jsd_store_close(s);
}

/* ---- identity and limits ------------------------------------------------------------ */

static void duplicate_effect_identity(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    jsd_effect e = {.owner = "order-42", .id = "created", .subject = "orders.created"};
    ASSERT_OK(jsd_tx_emit(tx, &e));
    ASSERT_STATUS(jsd_tx_emit(tx, &e), JSD_ERR_EXISTS);
    ASSERT_CONTAINS(jsd_store_errmsg(s), "already exists");
    ASSERT_CONTAINS(jsd_store_errmsg(s), "order-42");
    /* The transaction stays usable after the refusal. */
    jsd_effect other = {.owner = "order-42", .id = "paid", .subject = "orders.paid"};
    ASSERT_OK(jsd_tx_emit(tx, &other));
    ASSERT_OK(jsd_tx_commit(tx));
    ASSERT_EQ(stats(s).backlog, 2);

    /* Across transactions too. */
    ASSERT_OK(jsd_tx_begin(&tx, s));
    ASSERT_STATUS(jsd_tx_emit(tx, &e), JSD_ERR_EXISTS);
    ASSERT_OK(jsd_tx_commit(tx));
    ASSERT_EQ(stats(s).backlog, 2);

    /* A batch is all or nothing: the duplicate at index 2 leaves none of it. */
    jsd_effect batch[4] = {
        {.owner = "order-43", .id = "a", .subject = "orders.x"},
        {.owner = "order-43", .id = "b", .subject = "orders.x"},
        {.owner = "order-42", .id = "created", .subject = "orders.x"},
        {.owner = "order-43", .id = "c", .subject = "orders.x"},
    };
    size_t bad = 99;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    ASSERT_STATUS(jsd_tx_emit_batch(tx, batch, 4, &bad), JSD_ERR_EXISTS);
    ASSERT_EQ(bad, 2);
    ASSERT_CONTAINS(jsd_store_errmsg(s), "no effect of this batch was added");
    ASSERT_OK(jsd_tx_commit(tx));
    ASSERT_EQ(stats(s).backlog, 2);
    /* A repeat inside one batch is refused the same way. */
    batch[2].owner = "order-43";
    batch[2].id = "a";
    ASSERT_OK(jsd_tx_begin(&tx, s));
    ASSERT_STATUS(jsd_tx_emit_batch(tx, batch, 4, &bad), JSD_ERR_EXISTS);
    ASSERT_EQ(bad, 2);
    ASSERT_OK(jsd_tx_commit(tx));
    ASSERT_EQ(stats(s).backlog, 2);
    /* And a clean batch goes in whole. */
    batch[2].id = "c2";
    ASSERT_OK(jsd_tx_begin(&tx, s));
    ASSERT_OK_E(jsd_tx_emit_batch(tx, batch, 4, &bad), jsd_store_errmsg(s));
    ASSERT_OK(jsd_tx_commit(tx));
    ASSERT_EQ(stats(s).backlog, 6);
    jsd_store_close(s);
}

static jsd_status emit_status(jsd_store *s, const jsd_effect *e)
{
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    jsd_status rc = jsd_tx_emit(tx, e);
    ASSERT_OK(jsd_tx_commit(tx));
    return rc;
}

static void limits_are_enforced(void **state)
{
    char url[512], subj[300], big[300], name[80];
    jsd_store *s = open_new(state, url, sizeof(url));
    int ok = 0;

    /* subject: 256 bytes pass, 257 do not */
    memset(subj, 'a', sizeof(subj));
    for (int i = 1; i < 255; i += 2)
        subj[i] = '.';
    subj[256] = '\0';
    jsd_effect e = {.id = "s256", .subject = subj};
    ASSERT_OK_E(emit_status(s, &e), jsd_store_errmsg(s));
    ok++;
    subj[256] = 'b';
    subj[257] = '\0';
    e.id = "s257";
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_LIMIT);
    ASSERT_CONTAINS(jsd_store_errmsg(s), "257");
    static const char *const bad_subjects[] = {"orders.*", "orders.>",       "orders..x", ".orders",
                                               "orders.",  "orders created", "ord\ners",  ""};
    for (size_t i = 0; i < JSD_ARRAY_LEN(bad_subjects); i++) {
        e.subject = bad_subjects[i];
        ASSERT_STATUS(emit_status(s, &e), JSD_ERR_INVALID);
    }
    e.subject = NULL;
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_INVALID);
    /* reserved prefixes, refused as the publisher refuses them ("$" is outside
     * the character set); a longer first token is not reserved */
    e.subject = "_INBOX.x";
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_INVALID);
    ASSERT_CONTAINS(jsd_store_errmsg(s), "reserved \"_INBOX\" prefix");
    e.subject = "_INBOX";
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_INVALID);
    e.subject = "$JS.API.x";
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_INVALID);
    e.subject = "_INBOXES.x";
    e.id = "inboxes";
    ASSERT_OK_E(emit_status(s, &e), jsd_store_errmsg(s));
    ok++;
    e.subject = "orders.ok";

    /* owner / id: 256 pass, 257 do not; an id is required */
    memset(big, 'x', sizeof(big));
    big[256] = '\0';
    e.id = big;
    ASSERT_OK(emit_status(s, &e));
    ok++;
    big[256] = 'x';
    big[257] = '\0';
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_LIMIT);
    e.id = "owner257";
    e.owner = big;
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_LIMIT);
    e.owner = NULL;
    e.id = NULL;
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_INVALID);
    e.id = "";
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_INVALID);
    e.id = "bad\x01id";
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_INVALID);
    e.id = "bad\xff utf8";
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_INVALID);

    /* headers: 16 pass, 17 do not */
    jsd_header h[17];
    char names[17][16];
    for (int i = 0; i < 17; i++) {
        snprintf(names[i], sizeof(names[i]), "h%d", i);
        h[i].name = names[i];
        h[i].value = "v";
    }
    e.id = "h16";
    e.headers = h;
    e.n_headers = 16;
    ASSERT_OK(emit_status(s, &e));
    ok++;
    e.id = "h17";
    e.n_headers = 17;
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_LIMIT);
    ASSERT_CONTAINS(jsd_store_errmsg(s), "17 headers");
    /* name 64 pass, 65 not; value 256 pass, 257 not */
    memset(name, 'n', sizeof(name));
    name[64] = '\0';
    jsd_header one = {.name = name, .value = "v"};
    e.headers = &one;
    e.n_headers = 1;
    e.id = "n64";
    ASSERT_OK(emit_status(s, &e));
    ok++;
    name[64] = 'n';
    name[65] = '\0';
    e.id = "n65";
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_LIMIT);
    one.name = "X-Big";
    big[256] = '\0';
    one.value = big;
    e.id = "v256";
    ASSERT_OK(emit_status(s, &e));
    ok++;
    big[256] = 'x';
    e.id = "v257";
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_LIMIT);
    static const char *const bad_names[] = {"a:b", "a b", "", "Nats-Msg-Id", "nats-expected-stream",
                                            "x\ny"};
    one.value = "v";
    for (size_t i = 0; i < JSD_ARRAY_LEN(bad_names); i++) {
        one.name = bad_names[i];
        e.id = "badname";
        ASSERT_STATUS(emit_status(s, &e), JSD_ERR_INVALID);
    }
    one.name = "X-Ok";
    one.value = "line\r\nInjected: 1";
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_INVALID);
    /* headers on the wire: 3840 bytes pass (with the relay's 256 under
     * JSD_HEADERS_MAX_BYTES), 3841 do not. 14 headers "hNN: <256 v>\r\n" take
     * 3 + 2 + 256 + 2 = 263 bytes each (3682); a 15th "hzz: <v>\r\n" of 151
     * bytes of value takes 158 more: 3840. */
    static char vals[15][300];
    static char hn[15][16];
    jsd_header wh[15];
    for (int i = 0; i < 15; i++) {
        if (i < 14)
            snprintf(hn[i], sizeof(hn[i]), "h%02d", i);
        else
            snprintf(hn[i], sizeof(hn[i]), "hzz");
        memset(vals[i], 'v', 256);
        vals[i][i < 14 ? 256 : 151] = '\0';
        wh[i].name = hn[i];
        wh[i].value = vals[i];
    }
    e.headers = wh;
    e.n_headers = 15;
    e.id = "w3840";
    ASSERT_OK_E(emit_status(s, &e), jsd_store_errmsg(s));
    ok++;
    vals[14][151] = 'v';
    vals[14][152] = '\0';
    e.id = "w3841";
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_LIMIT);
    ASSERT_CONTAINS(jsd_store_errmsg(s),
                    "headers are 3841 bytes as encoded on the wire; the limit is 3840");
    /* 16 headers of the largest name and value (the old limits) do not fit */
    e.headers = NULL;
    e.n_headers = 0;

    /* payload: 256 KiB (what the relay publishes) passes, one more byte does not */
    size_t cap = JSD_PAYLOAD_DEFAULT_CAP;
    ASSERT_EQ(cap, 262144);
    char *payload = calloc(1, cap + 1);
    assert_non_null(payload);
    e.payload = payload;
    e.len = cap;
    e.id = "p256k";
    ASSERT_OK(emit_status(s, &e));
    ok++;
    e.len = cap + 1;
    e.id = "p256k1";
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_LIMIT);
    ASSERT_CONTAINS(jsd_store_errmsg(s),
                    "payload is 262145 bytes; the limit is 262144 (payload_max)");
    free(payload);
    e.payload = NULL;
    e.len = 5;
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_INVALID);

    /* trace context: fields or headers of those names, one rule, counted as headers */
    static const char tp[] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    char state512[JSD_TRACESTATE_MAX + 2];
    memset(state512, 'k', sizeof(state512));
    state512[JSD_TRACESTATE_MAX] = '\0';
    e = (jsd_effect){.id = "tp", .subject = "a.b", .traceparent = tp, .tracestate = state512};
    ASSERT_OK_E(emit_status(s, &e), jsd_store_errmsg(s));
    ok++;
    state512[JSD_TRACESTATE_MAX] = 'k';
    state512[JSD_TRACESTATE_MAX + 1] = '\0';
    e.id = "ts513";
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_LIMIT);
    ASSERT_CONTAINS(jsd_store_errmsg(s), "tracestate is 513 bytes; the limit is 512");
    jsd_header th = {.name = "TraceParent", .value = "00-bad"};
    e = (jsd_effect){.id = "tph", .subject = "a.b", .headers = &th, .n_headers = 1};
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_INVALID);
    ASSERT_CONTAINS(jsd_store_errmsg(s), "is not W3C trace context");
    th.value = tp;
    e.traceparent = tp;
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_INVALID);
    ASSERT_CONTAINS(jsd_store_errmsg(s), "both as a field and as a header");
    jsd_header sixteen[JSD_HEADERS_MAX];
    for (int i = 0; i < JSD_HEADERS_MAX; i++)
        sixteen[i] = (jsd_header){.name = "X-N", .value = "v"};
    e = (jsd_effect){.id = "tp17",
                     .subject = "a.b",
                     .headers = sixteen,
                     .n_headers = JSD_HEADERS_MAX,
                     .traceparent = tp};
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_LIMIT);
    ASSERT_CONTAINS(jsd_store_errmsg(s), "17 headers with its trace context; the limit is 16");

    /* a value a receiver would not read back as sent (jsd__header_value_edges) */
    jsd_header hv = {.name = "X-Empty", .value = ""};
    e = (jsd_effect){.id = "hv-empty", .subject = "a.b", .headers = &hv, .n_headers = 1};
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_INVALID);
    ASSERT_CONTAINS(jsd_store_errmsg(s), "header \"X-Empty\" value is empty");
    hv.value = "padded ";
    e.id = "hv-padded";
    ASSERT_STATUS(emit_status(s, &e), JSD_ERR_INVALID);
    ASSERT_CONTAINS(jsd_store_errmsg(s), "white space");
    /* an empty tracestate is none (tx.c sends no header for it): accepted */
    e = (jsd_effect){.id = "ts-empty", .subject = "a.b", .traceparent = tp, .tracestate = ""};
    ASSERT_OK_E(emit_status(s, &e), jsd_store_errmsg(s));
    ok++;

    /* Nothing refused reached the store. */
    ASSERT_EQ(stats(s).backlog, ok);
    jsd_store_close(s);
}

/* ---- claims -------------------------------------------------------------------------- */

static void claim_returns_effects_in_order(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    jsd_tx *tx;
    const unsigned char bin[6] = {'a', 0, 'b', 0xff, 0, 'z'};
    jsd_header h[2] = {{"X-Trace", "t-1"}, {"Content-Type", "application/json"}};
    ASSERT_OK(jsd_tx_begin(&tx, s));
    jsd_effect e1 = {.owner = "order-1",
                     .id = "created",
                     .subject = "orders.created",
                     .headers = h,
                     .n_headers = 2,
                     .payload = bin,
                     .len = sizeof(bin)};
    jsd_effect e2 = {.owner = NULL, .id = "solo", .subject = "orders.solo"};
    jsd_effect e3 = {.owner = "order-2",
                     .id = "created",
                     .subject = "orders.created",
                     .order_key = "order-2",
                     .payload = "x",
                     .len = 1};
    ASSERT_OK(jsd_tx_emit(tx, &e1));
    ASSERT_OK(jsd_tx_emit(tx, &e2));
    ASSERT_OK(jsd_tx_emit(tx, &e3));
    ASSERT_OK(jsd_tx_commit(tx));

    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    int64_t now = jsd__now_ms();
    ASSERT_OK_E(jsd__store_claim(s, 10, 30000, "relay-a", now, &b), jsd_store_errmsg(s));
    ASSERT_EQ(b.n, 3);
    ASSERT_TRUE(b.items[0].row_id < b.items[1].row_id && b.items[1].row_id < b.items[2].row_id);
    const jsd__claimed *c = &b.items[0];
    ASSERT_STREQ(c->owner, "order-1");
    ASSERT_STREQ(c->effect_id, "created");
    ASSERT_STREQ(c->subject, "orders.created");
    char want[JSD_MSG_ID_MAX];
    ASSERT_OK(jsd_effect_msg_id(jsd_store_namespace(s), "order-1", "created", want));
    ASSERT_STREQ(c->msg_id, want);
    ASSERT_EQ(strlen(c->msg_id), 64);
    ASSERT_EQ(c->len, sizeof(bin));
    assert_memory_equal(c->payload, bin, sizeof(bin));
    ASSERT_EQ(c->n_headers, 2);
    ASSERT_STREQ(c->headers[0].name, "X-Trace");
    ASSERT_STREQ(c->headers[0].value, "t-1");
    ASSERT_STREQ(c->headers[1].name, "Content-Type");
    ASSERT_STREQ(c->headers[1].value, "application/json");
    ASSERT_EQ(c->attempts, 0);
    assert_null(c->order_key);
    ASSERT_TRUE(c->created_at_ms > 0 && c->created_at_ms <= now);
    ASSERT_EQ(c->not_before_ms, c->created_at_ms);
    ASSERT_STREQ(b.items[1].owner, "");
    ASSERT_EQ(b.items[1].len, 0);
    ASSERT_EQ(b.items[1].n_headers, 0);
    ASSERT_STREQ(b.items[2].order_key, "order-2");
    /* The msg id differs between (owner, id) pairs that concatenate alike. */
    char a1[JSD_MSG_ID_MAX], a2[JSD_MSG_ID_MAX];
    ASSERT_OK(jsd_effect_msg_id(jsd_store_namespace(s), "ab", "c", a1));
    ASSERT_OK(jsd_effect_msg_id(jsd_store_namespace(s), "a", "bc", a2));
    assert_string_not_equal(a1, a2);

    /* Leased: a second relay gets nothing. */
    jsd__effect_batch b2;
    jsd__effect_batch_init(&b2);
    ASSERT_OK(jsd__store_claim(s, 10, 30000, "relay-b", now, &b2));
    ASSERT_EQ(b2.n, 0);

    jsd__receipt r[3];
    for (int i = 0; i < 3; i++)
        r[i] = (jsd__receipt){.row_id = b.items[i].row_id,
                              .stream = "ORDERS",
                              .seq = 100 + i,
                              .duplicate = i == 1,
                              .published_at_ms = now};
    size_t applied = 0;
    ASSERT_OK_E(jsd__store_record_receipts(s, "relay-a", r, 3, &applied), jsd_store_errmsg(s));
    ASSERT_EQ(applied, 3);
    /* Recording them again changes nothing. */
    ASSERT_OK(jsd__store_record_receipts(s, "relay-a", r, 3, &applied));
    ASSERT_EQ(applied, 0);
    char q[200];
    snprintf(q, sizeof(q),
             "SELECT stream_seq FROM jsd_outbox_state WHERE id = %lld AND stream = 'ORDERS' AND "
             "lease_token IS NULL AND published_at = %lld",
             (long long)b.items[1].row_id, (long long)now);
    ASSERT_EQ(q_i64(s, q), 101);
    snprintf(q, sizeof(q), "SELECT count(*) FROM jsd_outbox_state WHERE duplicate = %s",
             BE(state) == BE_PG ? "true" : "1");
    ASSERT_EQ(q_i64(s, q), 1);
    jsd_store_stats st = stats(s);
    ASSERT_EQ(st.published, 3);
    ASSERT_EQ(st.backlog, 0);
    ASSERT_OK(jsd__store_claim(s, 10, 30000, "relay-b", now + 100000, &b2));
    ASSERT_EQ(b2.n, 0);
    jsd__effect_batch_free(&b);
    jsd__effect_batch_free(&b2);
    jsd_store_close(s);
}

/* The receipt writer's two steps (store.h): receipts committed unsynced are
 * visible at once to every connection, the sync then succeeds, the
 * connection's own commits keep synchronous=FULL, and a WAL another
 * connection truncated in between is still the one synced. */
static void unsynced_receipts_are_committed_then_synced(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    jsd_store *other = open_url(url);
    for (int i = 0; i < 3; i++) {
        char id[16];
        snprintf(id, sizeof(id), "u%d", i);
        emit1(s, "own", id, "orders.u");
    }
    int64_t now = jsd__now_ms();
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 30000, "relay-u", now, &b));
    ASSERT_EQ(b.n, 3);
    ASSERT_OK(jsd__store_sync_receipts(s)); /* nothing pending yet */
    jsd__receipt r[3];
    for (int i = 0; i < 3; i++)
        r[i] = (jsd__receipt){
            .row_id = b.items[i].row_id, .stream = "ORDERS", .seq = 10 + i, .published_at_ms = now};
    size_t applied = 0;
    ASSERT_OK_E(jsd__store_record_receipts_unsynced(s, "relay-u", r, 2, &applied),
                jsd_store_errmsg(s));
    ASSERT_EQ(applied, 2);
    ASSERT_EQ(stats(other).published, 2);
    ASSERT_OK(jsd__store_sync_receipts(s));
    if (BE(state) == BE_SQLITE) {
        ASSERT_EQ(q_i64(s, "PRAGMA synchronous"), 2); /* FULL */
        sqlite3 *odb = jsd__sqlite_handle(other);
        ASSERT_EQ(sqlite3_exec(odb, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL),
                  SQLITE_OK);
        struct stat wst;
        ASSERT_EQ(stat(sqlite3_filename_wal(sqlite3_db_filename(odb, "main")), &wst), 0);
        ASSERT_EQ(wst.st_size, 0); /* truncated: the next receipts rewrite it */
    }
    ASSERT_OK(jsd__store_record_receipts_unsynced(s, "relay-u", r + 2, 1, &applied));
    ASSERT_EQ(applied, 1);
    ASSERT_OK(jsd__store_sync_receipts(s));
    ASSERT_OK(jsd__store_sync_receipts(s));
    ASSERT_EQ(stats(other).published, 3);
    /* a zombie's unsynced receipts are refused as the synced ones are */
    ASSERT_OK(jsd__store_record_receipts_unsynced(s, "relay-x", r, 3, &applied));
    ASSERT_EQ(applied, 0);
    jsd__effect_batch_free(&b);
    jsd_store_close(other);
    jsd_store_close(s);
}

static void not_before_delays_claims(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    int64_t now = jsd__now_ms(), later = now + 3600 * 1000;
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    jsd_effect e = {.id = "timer", .subject = "timers.fire", .not_before_ms = later};
    ASSERT_OK(jsd_tx_emit(tx, &e));
    ASSERT_OK(jsd_tx_commit(tx));
    jsd_store_stats st = stats(s);
    ASSERT_EQ(st.backlog, 1);
    ASSERT_EQ(st.due, 0);
    bool found = false;
    int64_t next = 0;
    ASSERT_OK(jsd__store_next_due(s, &found, &next));
    ASSERT_TRUE(found);
    ASSERT_EQ(next, later);
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 1000, "r", later - 1, &b));
    ASSERT_EQ(b.n, 0);
    ASSERT_OK(jsd__store_claim(s, 10, 1000, "r", later, &b));
    ASSERT_EQ(b.n, 1);
    ASSERT_EQ(b.items[0].not_before_ms, later);
    /* While leased, the next due time is the lease's end. */
    ASSERT_OK(jsd__store_next_due(s, &found, &next));
    ASSERT_EQ(next, later + 1000);
    jsd__effect_batch_free(&b);
    jsd_store_close(s);
}

static void order_key_holds_back_later_effects(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    emit_key(s, "k1", "k", 0);
    emit_key(s, "k2", "k", 0);
    emit_key(s, "j1", "j", 0);
    emit_key(s, "u1", NULL, 0);
    emit_key(s, "k3", "k", 0);
    int64_t now = jsd__now_ms();
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "r1", now, &b));
    ASSERT_EQ(b.n, 3);
    ASSERT_TRUE(has_id(&b, "k1") && has_id(&b, "j1") && has_id(&b, "u1"));
    int64_t k1 = b.items[0].row_id;
    /* Nothing is claimable until the leases end: k2 waits behind k1, so its own
     * due time does not count. */
    bool found = false;
    int64_t next = 0;
    ASSERT_OK(jsd__store_next_due(s, &found, &next));
    ASSERT_TRUE(found);
    ASSERT_EQ(next, now + 60000);
    /* Even with the lease expired, k2 waits for k1's receipt. */
    jsd__effect_batch b2;
    jsd__effect_batch_init(&b2);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "r2", now + 1, &b2));
    ASSERT_EQ(b2.n, 0);
    /* A failure keeps k1 first: it is rescheduled and k2 still waits. */
    jsd__failure f = {.row_id = k1, .error = "broker down"};
    jsd__backoff bo = {.base_ms = 1000, .cap_ms = 1000, .jitter_pct = 0};
    size_t applied = 0, dead = 0;
    ASSERT_OK(jsd__store_record_failures(s, "r1", &f, 1, &bo, 50, now, &applied, &dead));
    ASSERT_EQ(applied, 1);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "r2", now + 1, &b2));
    ASSERT_EQ(b2.n, 0);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "r2", now + 1000, &b2));
    ASSERT_EQ(b2.n, 1);
    ASSERT_STREQ(b2.items[0].effect_id, "k1");
    receipt1(s, "r2", k1, 1);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "r3", now + 1000, &b2));
    ASSERT_EQ(b2.n, 1);
    ASSERT_STREQ(b2.items[0].effect_id, "k2");
    /* A dead-lettered effect no longer holds its key. */
    f.row_id = b2.items[0].row_id;
    f.dead_letter_now = true;
    ASSERT_OK(jsd__store_record_failures(s, "r3", &f, 1, &bo, 50, now + 1000, &applied, &dead));
    ASSERT_EQ(dead, 1);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "r4", now + 1000, &b2));
    ASSERT_EQ(b2.n, 1);
    ASSERT_STREQ(b2.items[0].effect_id, "k3");
    jsd__effect_batch_free(&b);
    jsd__effect_batch_free(&b2);
    jsd_store_close(s);
}

/* One receipt call for a batch whose unordered rows a range holds and whose
 * keyed head lies inside that range, leased in its own row: every receipt
 * is written once (each by the lease that holds its row), the range ends
 * with its last row, and the same receipts again change nothing. */
static void receipts_for_a_range_and_a_keyed_row_inside_it(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    emit_key(s, "u1", NULL, 0);
    emit_key(s, "k1", "k", 0);
    emit_key(s, "u2", NULL, 0);
    int64_t now = jsd__now_ms();
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "r1", now, &b));
    ASSERT_EQ(b.n, 3);
    ASSERT_STREQ(b.items[1].effect_id, "k1"); /* sorted by id: inside u1..u2 */
    jsd__receipt r[3];
    for (size_t i = 0; i < 3; i++)
        r[i] = (jsd__receipt){.row_id = b.items[i].row_id,
                              .stream = "ORDERS",
                              .seq = 100 + i,
                              .published_at_ms = now};
    size_t applied = 0;
    ASSERT_OK_E(jsd__store_record_receipts(s, "r1", r, 3, &applied), jsd_store_errmsg(s));
    ASSERT_EQ(applied, 3);
    ASSERT_EQ(stats(s).published, 3);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_outbox_state WHERE stream_seq BETWEEN 100 AND 102 "
                       "AND lease_token IS NULL"),
              3);
    char sql[256];
    for (size_t i = 0; i < 3; i++) { /* each row its own seq, the keyed one too */
        snprintf(sql, sizeof(sql),
                 "SELECT count(*) FROM jsd_outbox_state WHERE id = %lld AND "
                 "stream_seq = %llu",
                 (long long)r[i].row_id, (unsigned long long)r[i].seq);
        ASSERT_EQ(q_i64(s, sql), 1);
    }
    if (BE(state) == BE_SQLITE)
        ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_outbox_lease"), 0);
    ASSERT_OK(jsd__store_record_receipts(s, "r1", r, 3, &applied));
    ASSERT_EQ(applied, 0);
    jsd__effect_batch_free(&b);
    jsd_store_close(s);
}

/* The receipts of one call are written in runs where ids and stream seqs
 * step together (jsd__receipt_continues, src/store/rows.c): whatever splits
 * a run (a seq that skips, another duplicate flag or publication time,
 * another stream), every row gets exactly its own receipt's values, once. */
static void receipt_runs_keep_each_rows_values(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    char id[16];
    for (int i = 0; i < 8; i++) {
        snprintf(id, sizeof(id), "u%d", i);
        emit_key(s, id, NULL, 0);
    }
    int64_t now = jsd__now_ms();
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "r1", now, &b));
    ASSERT_EQ(b.n, 8);
    /* each reason to split a run on its own: 12 a duplicate, 13 -> 20 a seq
     * that skips, 21 published later, 23 on another stream */
    static const uint64_t seq[8] = {10, 11, 12, 13, 20, 21, 22, 23};
    jsd__receipt r[8];
    for (size_t i = 0; i < 8; i++)
        r[i] = (jsd__receipt){.row_id = b.items[i].row_id,
                              .stream = i == 7 ? "OTHER" : "ORDERS",
                              .seq = seq[i],
                              .duplicate = i == 2,
                              .published_at_ms = i == 5 ? now + 5 : now};
    size_t applied = 0;
    ASSERT_OK_E(jsd__store_record_receipts(s, "r1", r, 8, &applied), jsd_store_errmsg(s));
    ASSERT_EQ(applied, 8);
    char sql[512];
    for (size_t i = 0; i < 8; i++) {
        snprintf(sql, sizeof(sql),
                 "SELECT count(*) FROM jsd_outbox_state WHERE id = %lld AND stream = '%s' AND "
                 "stream_seq = %llu AND duplicate %s AND published_at = %lld",
                 (long long)r[i].row_id, r[i].stream, (unsigned long long)r[i].seq,
                 BE(state) == BE_SQLITE ? (i == 2 ? "= 1" : "= 0") : (i == 2 ? "" : "IS NOT TRUE"),
                 (long long)r[i].published_at_ms);
        ASSERT_EQ(q_i64(s, sql), 1);
    }
    if (BE(state) == BE_SQLITE)
        ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_outbox_lease"), 0);
    ASSERT_OK(jsd__store_record_receipts(s, "r1", r, 8, &applied));
    ASSERT_EQ(applied, 0);
    jsd__effect_batch_free(&b);
    jsd_store_close(s);
}

/* A row of the same lease between two receipts, its PubAck not in yet, is
 * no part of their run even when their stream seqs follow on: it stays
 * pending and leased, and takes its own receipt later. */
static void receipts_leave_the_row_between_them(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    emit_key(s, "g0", NULL, 0);
    emit_key(s, "g1", NULL, 0);
    emit_key(s, "g2", NULL, 0);
    int64_t now = jsd__now_ms();
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "r1", now, &b));
    ASSERT_EQ(b.n, 3);
    ASSERT_EQ(b.items[1].row_id, b.items[0].row_id + 1);
    ASSERT_EQ(b.items[2].row_id, b.items[1].row_id + 1);
    jsd__receipt r[2] = {
        {.row_id = b.items[0].row_id, .stream = "ORDERS", .seq = 5, .published_at_ms = now},
        {.row_id = b.items[2].row_id, .stream = "ORDERS", .seq = 6, .published_at_ms = now}};
    size_t applied = 0;
    ASSERT_OK_E(jsd__store_record_receipts(s, "r1", r, 2, &applied), jsd_store_errmsg(s));
    ASSERT_EQ(applied, 2);
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM jsd_outbox_state WHERE id = %lld AND published_at IS NULL "
             "AND stream_seq IS NULL",
             (long long)b.items[1].row_id);
    ASSERT_EQ(q_i64(s, sql), 1);
    snprintf(sql, sizeof(sql), "SELECT stream_seq FROM jsd_outbox_state WHERE id = %lld",
             (long long)b.items[2].row_id);
    ASSERT_EQ(q_i64(s, sql), 6);
    jsd__receipt late = {
        .row_id = b.items[1].row_id, .stream = "ORDERS", .seq = 7, .published_at_ms = now};
    ASSERT_OK(jsd__store_record_receipts(s, "r1", &late, 1, &applied));
    ASSERT_EQ(applied, 1);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_outbox_state WHERE published_at IS NULL"), 0);
    jsd__effect_batch_free(&b);
    jsd_store_close(s);
}

/* RELAY-1,2: an expired lease is taken over; the old holder's late receipt or
 * failure is refused and the new holder's result stands. */
static void expired_lease_takeover(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    emit1(s, "o", "e", "orders.created");
    int64_t t = jsd__now_ms();
    jsd__effect_batch a, b;
    jsd__effect_batch_init(&a);
    jsd__effect_batch_init(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 1000, "old-relay", t, &a));
    ASSERT_EQ(a.n, 1);
    ASSERT_OK(jsd__store_claim(s, 10, 1000, "new-relay", t + 999, &b));
    ASSERT_EQ(b.n, 0);
    ASSERT_OK(jsd__store_claim(s, 10, 1000, "new-relay", t + 1000, &b));
    ASSERT_EQ(b.n, 1);
    ASSERT_EQ(b.items[0].row_id, a.items[0].row_id);
    int64_t row = a.items[0].row_id;

    /* The old holder's failure and release are refused too. */
    jsd__failure f = {.row_id = row, .error = "late failure"};
    size_t applied = 9, dead = 9;
    ASSERT_OK(
        jsd__store_record_failures(s, "old-relay", &f, 1, NULL, 0, t + 1001, &applied, &dead));
    ASSERT_EQ(applied, 0);
    ASSERT_OK(jsd__store_release(s, "old-relay", &row, 1, &applied));
    ASSERT_EQ(applied, 0);

    jsd__receipt r_new = {.row_id = row,
                          .stream = "ORDERS",
                          .seq = 7,
                          .duplicate = true,
                          .published_at_ms = t + 1100};
    jsd__receipt r_old = {.row_id = row, .stream = "ORDERS", .seq = 6, .published_at_ms = t + 1200};
    ASSERT_OK(jsd__store_record_receipts(s, "new-relay", &r_new, 1, &applied));
    ASSERT_EQ(applied, 1);
    ASSERT_OK(jsd__store_record_receipts(s, "old-relay", &r_old, 1, &applied));
    ASSERT_EQ(applied, 0);
    char q[160];
    snprintf(q, sizeof(q), "SELECT stream_seq FROM jsd_outbox_state WHERE id = %lld",
             (long long)row);
    ASSERT_EQ(q_i64(s, q), 7);
    snprintf(q, sizeof(q), "SELECT attempts FROM jsd_outbox_state WHERE id = %lld", (long long)row);
    ASSERT_EQ(q_i64(s, q), 0);
    jsd__effect_batch_free(&a);
    jsd__effect_batch_free(&b);
    jsd_store_close(s);
}

/* RELAY-4: two processes claiming at once never hold the same effect. */
#define NPROC_EFFECTS 400
static void two_processes_never_share_an_effect(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    jsd_effect e[100];
    char ids[100][16];
    jsd_tx *tx;
    for (int k = 0; k < NPROC_EFFECTS / 100; k++) {
        for (int i = 0; i < 100; i++) {
            snprintf(ids[i], sizeof(ids[i]), "e%d", k * 100 + i);
            e[i] = (jsd_effect){.owner = "bulk", .id = ids[i], .subject = "bulk.x"};
        }
        ASSERT_OK(jsd_tx_begin(&tx, s));
        ASSERT_OK_E(jsd_tx_emit_batch(tx, e, 100, NULL), jsd_store_errmsg(s));
        ASSERT_OK(jsd_tx_commit(tx));
    }
    int gate[2];
    assert_int_equal(pipe(gate), 0);
    pid_t pids[2];
    char files[2][512];
    for (int c = 0; c < 2; c++) {
        snprintf(files[c], sizeof(files[c]), "%s/claims.%d", jsd_test_dir(), c);
        pids[c] = fork();
        assert_true(pids[c] >= 0);
        if (pids[c] == 0) {
            close(gate[1]);
            char tok[16];
            snprintf(tok, sizeof(tok), "proc%d", c);
            jsd_store *cs = NULL;
            if (jsd_store_open(&cs, url, NULL) != JSD_OK)
                _exit(3);
            FILE *out = fopen(files[c], "w");
            char buf;
            if (!out || read(gate[0], &buf, 1) < 0) /* EOF when the parent opens the gate */
                _exit(4);
            jsd__effect_batch b;
            jsd__effect_batch_init(&b);
            for (;;) {
                if (jsd__store_claim(cs, 7, 600000, tok, jsd__now_ms(), &b) != JSD_OK)
                    _exit(5);
                if (b.n == 0)
                    break;
                jsd__receipt r[7];
                for (size_t i = 0; i < b.n; i++) {
                    fprintf(out, "%lld\n", (long long)b.items[i].row_id);
                    r[i] = (jsd__receipt){.row_id = b.items[i].row_id,
                                          .stream = tok,
                                          .seq = (uint64_t)b.items[i].row_id,
                                          .published_at_ms = jsd__now_ms()};
                }
                size_t applied = 0;
                if (jsd__store_record_receipts(cs, tok, r, b.n, &applied) != JSD_OK ||
                    applied != b.n)
                    _exit(6);
            }
            fclose(out);
            _exit(0);
        }
    }
    close(gate[0]);
    close(gate[1]); /* both start now */
    for (int c = 0; c < 2; c++)
        jsd_test_child_ok(pids[c], c ? "claiming process 1" : "claiming process 0");
    static unsigned char seen[100000];
    memset(seen, 0, sizeof(seen));
    long total = 0, per[2] = {0, 0};
    for (int c = 0; c < 2; c++) {
        FILE *in = fopen(files[c], "r");
        assert_non_null(in);
        char line[64];
        while (fgets(line, sizeof(line), in)) {
            char *end = NULL;
            long long id = strtoll(line, &end, 10);
            if (end == line)
                continue;
            assert_true(id > 0 && id < (long long)sizeof(seen));
            if (seen[id])
                fail_msg("effect row %lld was claimed by both processes", id);
            seen[id] = (unsigned char)(c + 1);
            total++;
            per[c]++;
        }
        fclose(in);
    }
    ASSERT_EQ(total, NPROC_EFFECTS);
    ASSERT_EQ(stats(s).published, NPROC_EFFECTS);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_outbox_state WHERE stream = 'proc0'"), per[0]);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_outbox_state WHERE stream = 'proc1'"), per[1]);
    print_message("claims: process 0 took %ld, process 1 took %ld\n", per[0], per[1]);
    jsd_store_close(s);
}

/* ---- RELAY-2: backoff and the dead-letter budget -------------------------------------- */

static void backoff_schedule_and_budget(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    emit1(s, "o", "flaky", "orders.flaky");
    jsd__backoff bo = {.base_ms = 100, .cap_ms = 1000, .jitter_pct = 0};
    static const int64_t want[] = {100, 200, 400, 800, 1000, 1000};
    for (int n = 1; n <= 6; n++)
        ASSERT_EQ(jsd__backoff_delay_ms(&bo, n, 1), want[n - 1]);
    int64_t t = jsd__now_ms();
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    const int budget = 7;
    for (int n = 1; n <= budget; n++) {
        ASSERT_OK(jsd__store_claim(s, 10, 60000, "r", t, &b));
        ASSERT_EQ(b.n, 1);
        ASSERT_EQ(b.items[0].attempts, n - 1);
        char err[64];
        snprintf(err, sizeof(err), "publish failed (%d)", n);
        jsd__failure f = {.row_id = b.items[0].row_id, .error = err};
        size_t applied = 0, dead = 0;
        ASSERT_OK_E(jsd__store_record_failures(s, "r", &f, 1, &bo, budget, t, &applied, &dead),
                    jsd_store_errmsg(s));
        ASSERT_EQ(applied, 1);
        if (n < budget) {
            ASSERT_EQ(dead, 0);
            int64_t next = t + want[JSD_MIN(n, 6) - 1];
            ASSERT_OK(jsd__store_claim(s, 10, 60000, "r", next - 1, &b));
            ASSERT_EQ(b.n, 0);
            t = next;
        } else {
            ASSERT_EQ(dead, 1);
        }
    }
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "r", t + 86400000, &b));
    ASSERT_EQ(b.n, 0);
    jsd_store_stats st = stats(s);
    ASSERT_EQ(st.dead_lettered, 1);
    ASSERT_EQ(st.backlog, 0);
    char text[600];
    q_text(s, "SELECT dead_reason FROM jsd_outbox_state", text, sizeof(text));
    ASSERT_CONTAINS(text, "attempt budget of 7 spent");
    ASSERT_CONTAINS(text, "publish failed (7)");
    q_text(s, "SELECT last_error FROM jsd_outbox_state", text, sizeof(text));
    ASSERT_STREQ(text, "publish failed (7)");
    ASSERT_EQ(q_i64(s, "SELECT attempts FROM jsd_outbox_state"), 7);

    /* The default budget is 50. */
    emit1(s, "o", "default-budget", "orders.flaky");
    bo = (jsd__backoff){.base_ms = 1, .cap_ms = 1, .jitter_pct = 0};
    for (int n = 1; n <= 50; n++) {
        t += 1;
        ASSERT_OK(jsd__store_claim(s, 10, 60000, "r", t, &b));
        ASSERT_EQ(b.n, 1);
        jsd__failure f = {.row_id = b.items[0].row_id, .error = "x"};
        size_t applied = 0, dead = 0;
        ASSERT_OK(jsd__store_record_failures(s, "r", &f, 1, &bo, 0, t, &applied, &dead));
        ASSERT_EQ(dead, n == 50 ? 1 : 0);
    }
    ASSERT_EQ(stats(s).dead_lettered, 2);

    /* Jitter is deterministic and stays within its band. */
    bo = (jsd__backoff){.base_ms = 1000, .cap_ms = 60000, .jitter_pct = 20};
    bool differs = false;
    for (int64_t row = 1; row <= 50; row++) {
        int64_t d = jsd__backoff_delay_ms(&bo, 3, row);
        ASSERT_EQ(d, jsd__backoff_delay_ms(&bo, 3, row));
        ASSERT_TRUE(d > 3200 && d <= 4000);
        differs |= d != jsd__backoff_delay_ms(&bo, 3, 1);
    }
    ASSERT_TRUE(differs);
    jsd__effect_batch_free(&b);
    jsd_store_close(s);
}

static void release_and_requeue(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    emit1(s, "o", "a", "orders.a");
    int64_t t = jsd__now_ms();
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "r", t, &b));
    ASSERT_EQ(b.n, 1);
    int64_t row = b.items[0].row_id;
    size_t k = 0;
    ASSERT_OK(jsd__store_release(s, "r", &row, 1, &k));
    ASSERT_EQ(k, 1);
    /* Claimable again at once, with no attempt counted. */
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "r2", t, &b));
    ASSERT_EQ(b.n, 1);
    ASSERT_EQ(b.items[0].attempts, 0);
    jsd__failure f = {.row_id = row, .error = "no stream", .dead_letter_now = true};
    size_t applied = 0, dead = 0;
    ASSERT_OK(jsd__store_record_failures(s, "r2", &f, 1, NULL, 0, t, &applied, &dead));
    ASSERT_EQ(dead, 1);
    char text[600];
    q_text(s, "SELECT dead_reason FROM jsd_outbox_state", text, sizeof(text));
    ASSERT_CONTAINS(text, "permanent failure");
    ASSERT_CONTAINS(text, "no stream");
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "r3", t, &b));
    ASSERT_EQ(b.n, 0);
    ASSERT_OK(jsd__store_requeue_dead(s, &row, 1, t, &k));
    ASSERT_EQ(k, 1);
    ASSERT_EQ(stats(s).dead_lettered, 0);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "r3", t, &b));
    ASSERT_EQ(b.n, 1);
    ASSERT_EQ(b.items[0].attempts, 0);
    jsd__effect_batch_free(&b);
    jsd_store_close(s);
}

/* ---- IN-1,2: the inbox --------------------------------------------------------------- */

static void inbox_identity_and_outcome(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    jsd_tx *tx;
    bool found = true;
    jsd__inbox_outcome o;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    ASSERT_OK(jsd__tx_inbox_lookup(tx, "ORDERS", "shipping", 1, &found, &o));
    assert_false(found);
    ASSERT_OK_E(jsd__tx_inbox_insert(tx, "ORDERS", "shipping", 1, "msg-1", 3, "shipped", NULL),
                jsd_store_errmsg(s));
    ASSERT_OK(jsd__tx_inbox_lookup(tx, "ORDERS", "shipping", 1, &found, &o));
    assert_true(found);
    ASSERT_EQ(o.code, 3);
    ASSERT_STREQ(o.detail, "shipped");
    ASSERT_STREQ(o.msg_id, "msg-1");
    ASSERT_STATUS(jsd__tx_inbox_insert(tx, "ORDERS", "shipping", 1, "msg-1", 4, NULL, NULL),
                  JSD_ERR_EXISTS);
    ASSERT_CONTAINS(jsd_store_errmsg(s), "already in the inbox");
    /* The transaction is still usable: a different delivery goes in. */
    ASSERT_OK(jsd__tx_inbox_insert(tx, "ORDERS", "billing", 1, "msg-1", 5, NULL, NULL));
    ASSERT_OK(jsd_tx_commit(tx));

    /* After commit, a redelivery finds the recorded outcome. */
    ASSERT_OK(jsd_tx_begin(&tx, s));
    ASSERT_STATUS(jsd__tx_inbox_insert(tx, "ORDERS", "shipping", 1, NULL, 9, NULL, NULL),
                  JSD_ERR_EXISTS);
    ASSERT_OK(jsd__tx_inbox_lookup(tx, "ORDERS", "shipping", 1, &found, &o));
    assert_true(found);
    ASSERT_EQ(o.code, 3);
    ASSERT_STREQ(o.detail, "shipped");
    ASSERT_EQ(o.stream_seq, 1);
    ASSERT_TRUE(o.created_at_ms > 0);
    /* A re-published duplicate under a new sequence is found by its msg id. */
    ASSERT_OK(jsd__tx_inbox_lookup_msg_id(tx, "ORDERS", "shipping", "msg-1", &found, &o));
    assert_true(found);
    ASSERT_EQ(o.stream_seq, 1);
    ASSERT_EQ(o.code, 3);
    ASSERT_OK(jsd__tx_inbox_lookup_msg_id(tx, "ORDERS", "shipping", "msg-2", &found, &o));
    assert_false(found);
    ASSERT_OK(jsd__tx_inbox_lookup(tx, "ORDERS", "shipping", 2, &found, NULL));
    assert_false(found);
    /* Bad identities are refused. */
    ASSERT_STATUS(jsd__tx_inbox_insert(tx, "", "shipping", 2, NULL, 0, NULL, NULL),
                  JSD_ERR_INVALID);
    ASSERT_STATUS(jsd__tx_inbox_insert(tx, "ORDERS", "shipping", 0, NULL, 0, NULL, NULL),
                  JSD_ERR_INVALID);
    jsd_tx_rollback(tx);
    ASSERT_EQ(stats(s).inbox_rows, 2);
    jsd_store_close(s);
}

/* The ingress commits a batch with a savepoint per delivery. */
static void savepoint_per_delivery(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    app_sql(s, "CREATE TABLE shipments (id TEXT PRIMARY KEY)");
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    /* delivery 1: kept */
    ASSERT_OK(jsd__tx_savepoint(tx));
    ASSERT_STATUS(jsd__tx_savepoint(tx), JSD_ERR_INVALID);
    ASSERT_OK(jsd__tx_inbox_insert(tx, "ORDERS", "ship", 1, "m1", 1, NULL, NULL));
    tx_sql(tx, "INSERT INTO shipments VALUES ('s1')");
    jsd_effect e = {.owner = "s1", .id = "shipped", .subject = "shipments.created"};
    ASSERT_OK(jsd_tx_emit(tx, &e));
    ASSERT_OK(jsd__tx_release(tx));
    /* delivery 2: its handler fails after writing; undone */
    ASSERT_OK(jsd__tx_savepoint(tx));
    ASSERT_OK(jsd__tx_inbox_insert(tx, "ORDERS", "ship", 2, "m2", 1, NULL, NULL));
    tx_sql(tx, "INSERT INTO shipments VALUES ('s2')");
    e.owner = "s2";
    ASSERT_OK(jsd_tx_emit(tx, &e));
    assert_false(tx_sql_try(tx, "INSERT INTO shipments VALUES ('s1')"));
    ASSERT_OK_E(jsd__tx_rollback_to(tx), jsd_store_errmsg(s));
    ASSERT_STATUS(jsd__tx_release(tx), JSD_ERR_INVALID);
    /* delivery 3: kept, after the failed one */
    ASSERT_OK(jsd__tx_savepoint(tx));
    ASSERT_OK(jsd__tx_inbox_insert(tx, "ORDERS", "ship", 3, "m3", 1, NULL, NULL));
    tx_sql(tx, "INSERT INTO shipments VALUES ('s3')");
    ASSERT_OK(jsd__tx_release(tx));
    ASSERT_OK_E(jsd_tx_commit(tx), jsd_store_errmsg(s));
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM shipments"), 2);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM shipments WHERE id = 's2'"), 0);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_inbox WHERE stream_seq = 2"), 0);
    jsd_store_stats st = stats(s);
    ASSERT_EQ(st.inbox_rows, 2);
    ASSERT_EQ(st.backlog, 1);
    jsd_store_close(s);
}

/* ---- DLQ-1: poison records ------------------------------------------------------------ */

static void poison_records_keep_the_evidence(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    const unsigned char raw[5] = {'{', 0, 0xfe, '"', '}'};
    const char hdrs[] = "NATS/1.0\r\nNats-Msg-Id: abc\r\n\r\n";
    jsd__poison p = {.stream = "ORDERS",
                     .consumer = "shipping",
                     .stream_seq = 17,
                     .msg_id = "abc",
                     .subject = "orders.created",
                     .diagnostic = "envelope: payload is not JSON",
                     .headers = hdrs,
                     .headers_len = sizeof(hdrs) - 1,
                     .payload = raw,
                     .len = sizeof(raw),
                     .created_at_ms = 12345};
    bool inserted = false;
    ASSERT_OK_E(jsd__store_poison_insert(s, &p, &inserted), jsd_store_errmsg(s));
    assert_true(inserted);
    /* Idempotent on the delivery identity: the first record stands. */
    jsd__poison again = p;
    again.diagnostic = "something else";
    ASSERT_OK(jsd__store_poison_insert(s, &again, &inserted));
    assert_false(inserted);
    jsd__poison_record r;
    ASSERT_OK(jsd__store_poison_get(s, "ORDERS", "shipping", 17, &r));
    ASSERT_STREQ(r.stream, "ORDERS");
    ASSERT_STREQ(r.consumer, "shipping");
    ASSERT_EQ(r.stream_seq, 17);
    ASSERT_STREQ(r.msg_id, "abc");
    ASSERT_STREQ(r.subject, "orders.created");
    ASSERT_STREQ(r.diagnostic, "envelope: payload is not JSON");
    ASSERT_EQ(r.len, sizeof(raw));
    assert_memory_equal(r.payload, raw, sizeof(raw));
    ASSERT_EQ(r.headers_len, sizeof(hdrs) - 1);
    assert_memory_equal(r.headers, hdrs, sizeof(hdrs) - 1);
    ASSERT_EQ(r.created_at_ms, 12345);
    assert_null(r.dlq_stream);
    jsd__poison_record_clear(&r);

    ASSERT_OK(jsd__store_poison_mark_published(s, "ORDERS", "shipping", 17, "DLQ", 4));
    ASSERT_OK(jsd__store_poison_get(s, "ORDERS", "shipping", 17, &r));
    ASSERT_STREQ(r.dlq_stream, "DLQ");
    ASSERT_EQ(r.dlq_seq, 4);
    jsd__poison_record_clear(&r);
    ASSERT_STATUS(jsd__store_poison_get(s, "ORDERS", "shipping", 18, &r), JSD_ERR_NOT_FOUND);

    /* Inside a transaction, and listing in id order; no payload is fine. */
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    jsd__poison p2 = {.stream = "ORDERS",
                      .consumer = "shipping",
                      .stream_seq = 18,
                      .subject = "orders.created",
                      .diagnostic = "unsupported version"};
    ASSERT_OK(jsd__tx_poison_insert(tx, &p2, &inserted));
    assert_true(inserted);
    ASSERT_OK(jsd_tx_commit(tx));
    jsd__poison_record *list = NULL;
    size_t n = 0;
    ASSERT_OK(jsd__store_poison_list(s, 0, 10, &list, &n));
    ASSERT_EQ(n, 2);
    ASSERT_EQ(list[0].stream_seq, 17);
    ASSERT_EQ(list[1].stream_seq, 18);
    ASSERT_STREQ(list[1].msg_id, "");
    ASSERT_EQ(list[1].len, 0);
    int64_t after = list[0].id;
    jsd__poison_records_free(list, n);
    ASSERT_OK(jsd__store_poison_list(s, after, 10, &list, &n));
    ASSERT_EQ(n, 1);
    jsd__poison_records_free(list, n);
    ASSERT_EQ(stats(s).poison_records, 2);
    jsd_store_close(s);
}

/* ---- STORE-4: retention ------------------------------------------------------------- */

static void retention_in_bounded_batches(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    int64_t now, old;
    char id[32];
    jsd_tx *tx;
    /* 10 old published, 5 recent published, 3 unpublished, 1 old dead-lettered. */
    ASSERT_OK(jsd_tx_begin(&tx, s));
    for (int i = 0; i < 19; i++) {
        snprintf(id, sizeof(id), "e%02d", i);
        jsd_effect e = {.id = id, .subject = "r.x"};
        ASSERT_OK(jsd_tx_emit(tx, &e));
    }
    for (int i = 0; i < 9; i++)
        ASSERT_OK(jsd__tx_inbox_insert(tx, "S", "c", (uint64_t)i + 1, NULL, 0, NULL, NULL));
    ASSERT_OK(jsd_tx_commit(tx));
    now = jsd__now_ms(); /* after the inserts: "old" is relative to the claim time */
    old = now - 3600 * 1000;
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    ASSERT_OK(jsd__store_claim(s, 19, 60000, "r", now, &b));
    ASSERT_EQ(b.n, 19);
    jsd__receipt r[15];
    for (int i = 0; i < 15; i++)
        r[i] = (jsd__receipt){.row_id = b.items[i].row_id,
                              .stream = "S",
                              .seq = (uint64_t)i + 1,
                              .published_at_ms = i < 10 ? old : now};
    size_t applied = 0, dead = 0;
    ASSERT_OK(jsd__store_record_receipts(s, "r", r, 15, &applied));
    ASSERT_EQ(applied, 15);
    jsd__failure f = {.row_id = b.items[18].row_id, .error = "x", .dead_letter_now = true};
    ASSERT_OK(jsd__store_record_failures(s, "r", &f, 1, NULL, 0, old, &applied, &dead));
    ASSERT_EQ(dead, 1);
    /* 7 old inbox rows, 2 recent. */
    app_sql(s, "UPDATE jsd_inbox SET created_at = 1000 WHERE stream_seq <= 7");
    jsd__poison p = {.stream = "S",
                     .consumer = "c",
                     .stream_seq = 1,
                     .subject = "r.x",
                     .diagnostic = "bad",
                     .created_at_ms = 1};
    ASSERT_OK(jsd__store_poison_insert(s, &p, NULL));

    int64_t cutoff = now - 60000, removed = 0, total = 0;
    int steps = 0;
    for (;;) {
        ASSERT_OK_E(jsd__store_gc_step(s, cutoff, 4, &removed), jsd_store_errmsg(s));
        ASSERT_LE(removed, 8); /* at most 4 effects + 4 inbox rows per transaction */
        total += removed;
        steps++;
        if (removed == 0)
            break;
        ASSERT_LE(steps, 10);
    }
    ASSERT_EQ(total, 17);
    ASSERT_EQ(steps, 4); /* 8 + 6 + 3 + 0 */
    jsd_store_stats st = stats(s);
    ASSERT_EQ(st.published, 5);
    ASSERT_EQ(st.backlog, 3);
    ASSERT_EQ(st.dead_lettered, 1);
    ASSERT_EQ(st.inbox_rows, 2);
    ASSERT_EQ(st.poison_records, 1);
    /* The public form: age-based, loops to the end. */
    int64_t k = -1;
    ASSERT_OK(jsd_store_gc(s, 60000, 100, &k));
    ASSERT_EQ(k, 0);
    ASSERT_OK(jsd_store_gc(s, 0, 2, &k));
    /* the 5 recent published + 1 of the 2 recent inbox rows: gc keeps each
     * durable's highest inbox row, its high-water mark */
    ASSERT_TRUE(k >= 6);
    ASSERT_EQ(stats(s).published, 0);
    ASSERT_EQ(stats(s).inbox_rows, 1);
    ASSERT_STATUS(jsd_store_gc(s, 0, 0, &k), JSD_ERR_INVALID);
    jsd__effect_batch_free(&b);
    jsd_store_close(s);
}

/* ---- STORE-1: schema versions ---------------------------------------------------------- */

static void schema_from_the_future_is_refused(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    emit1(s, "o", "keep-me", "orders.x");
    app_sql(s, "INSERT INTO jsd_schema_version (version, applied_at) VALUES (99, 0)");
    jsd_store_close(s);
    jsd_store *s2 = NULL;
    jsd_error e;
    ASSERT_STATUS(jsd_store_open(&s2, url, &e), JSD_ERR_SCHEMA);
    assert_null(s2);
    ASSERT_CONTAINS(e.msg, "schema version 99");
    ASSERT_CONTAINS(e.msg, "upgrade jsdurable");
    /* Nothing was lost or changed: remove the marker and the effect is there. */
    if (BE(state) == BE_SQLITE) {
        sqlite3 *db;
        assert_int_equal(sqlite3_open(url + 7, &db), SQLITE_OK);
        assert_int_equal(
            sqlite3_exec(db, "DELETE FROM jsd_schema_version WHERE version = 99", NULL, NULL, NULL),
            SQLITE_OK);
        sqlite3_close(db);
    } else {
        PGconn *c = PQconnectdb(url);
        PQclear(PQexec(c, "DELETE FROM jsd_schema_version WHERE version = 99"));
        PQfinish(c);
    }
    s2 = open_url(url);
    ASSERT_EQ(stats(s2).backlog, 1);
    ASSERT_EQ(q_i64(s2, "SELECT count(*) FROM jsd_schema_version"), JSD__SCHEMA_VERSION);
    jsd_store_close(s2);
}

/* ---- identity: the message-id namespace ------------------------------------------------- */

/* A store id is created with the schema (32 hex digits, kept across opens,
 * different per store) and is the default namespace of the ids it emits; the
 * operator's namespace (option, URL parameter) replaces it; bad ones are
 * refused naming the rule. */
static void namespace_identity(void **state)
{
    char url[512], url2[512], nsurl[600], sid[40], mid[JSD_MSG_ID_MAX];
    jsd_store *s = open_new(state, url, sizeof(url));
    snprintf(sid, sizeof(sid), "%s", jsd_store_id(s));
    ASSERT_EQ(strlen(sid), 32);
    ASSERT_EQ(strspn(sid, "0123456789abcdef"), 32);
    ASSERT_STREQ(jsd_store_namespace(s), sid);
    char stored[64];
    q_text(s, "SELECT value FROM jsd_meta WHERE key = 'store_id'", stored, sizeof(stored));
    ASSERT_STREQ(stored, sid);
    jsd_store_close(s);
    s = open_url(url); /* kept */
    ASSERT_STREQ(jsd_store_id(s), sid);
    jsd_store *other = open_new(state, url2, sizeof(url2));
    ASSERT_TRUE(strcmp(jsd_store_id(other), sid) != 0);
    jsd_store_close(other);
    emit1(s, "order-1", "created", "orders.created");
    jsd_store_close(s);

    /* the option */
    jsd_store_opts o;
    jsd_store_opts_init(&o);
    o.url = url;
    o.id_namespace = "shop.eu-1";
    jsd_error e;
    ASSERT_OK_E(jsd_store_open_opts(&s, &o, &e), e.msg);
    ASSERT_STREQ(jsd_store_namespace(s), "shop.eu-1");
    ASSERT_STREQ(jsd_store_id(s), sid);
    emit1(s, "order-1", "updated", "orders.updated");
    jsd_store_close(s);
    /* the URL parameter (the option wins over it) */
    snprintf(nsurl, sizeof(nsurl), "%s%snamespace=from-url", url, strchr(url, '?') ? "&" : "?");
    s = open_url(nsurl);
    ASSERT_STREQ(jsd_store_namespace(s), "from-url");
    emit1(s, "order-1", "shipped", "orders.shipped");
    jsd_store_close(s);
    o.url = nsurl;
    ASSERT_OK_E(jsd_store_open_opts(&s, &o, &e), e.msg);
    ASSERT_STREQ(jsd_store_namespace(s), "shop.eu-1");

    /* each row carries the id of the namespace it was emitted under */
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 1000, "t", jsd__now_ms(), &b));
    ASSERT_EQ(b.n, 3);
    ASSERT_OK(jsd_effect_msg_id(sid, "order-1", "created", mid));
    ASSERT_STREQ(b.items[0].msg_id, mid);
    ASSERT_OK(jsd_effect_msg_id("shop.eu-1", "order-1", "updated", mid));
    ASSERT_STREQ(b.items[1].msg_id, mid);
    ASSERT_OK(jsd_effect_msg_id("from-url", "order-1", "shipped", mid));
    ASSERT_STREQ(b.items[2].msg_id, mid);
    jsd__effect_batch_free(&b);
    jsd_store_close(s);

    /* refused, naming the rule */
    static const char *const bad[] = {"", "a b", "a/b", "ns\n"};
    for (size_t i = 0; i < JSD_ARRAY_LEN(bad); i++) {
        o.url = url;
        o.id_namespace = bad[i];
        s = NULL;
        ASSERT_STATUS(jsd_store_open_opts(&s, &o, &e), JSD_ERR_CONFIG);
        assert_null(s);
        ASSERT_CONTAINS(e.msg, "message-id namespace");
        ASSERT_CONTAINS(e.msg, "[A-Za-z0-9._-]");
    }
    char longns[80];
    memset(longns, 'n', 65);
    longns[65] = '\0';
    o.id_namespace = longns;
    ASSERT_STATUS(jsd_store_open_opts(&s, &o, &e), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(e.msg, "is 65 bytes; it takes 1..64 bytes");
    longns[64] = '\0';
    ASSERT_OK_E(jsd_store_open_opts(&s, &o, &e), e.msg);
    jsd_store_close(s);
    snprintf(nsurl, sizeof(nsurl), "%s%snamespace=a%%20b", url, strchr(url, '?') ? "&" : "?");
    ASSERT_STATUS(jsd_store_open(&s, nsurl, &e), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(e.msg, "message-id namespace \"a%20b\"");
}

/* A store made before namespaces (schema 1): migrating it records a store id,
 * the effect already in the outbox keeps its v1 id (so a retry after a crash
 * still collapses with its first publication in the duplicate window), and
 * only new effects get the namespaced v2 id. */
static void migration_keeps_stored_msg_ids(void **state)
{
    /* v1 of ("order-1", "created"): the id jsdurable derived before. */
    static const char v1[] = "a019263d54a81f54eef0f5393f628fb5c142c467f469dd0a1790c4122ac79cc6";
    char url[512], mid[JSD_MSG_ID_MAX], sql[300];
    jsd_store *s = open_new(state, url, sizeof(url));
    emit1(s, "order-1", "created", "orders.created");
    /* Turn it back into a schema-1 store holding a schema-1 row. */
    snprintf(sql, sizeof(sql), "UPDATE jsd_outbox SET msg_id = '%s'", v1);
    app_sql(s, sql);
    app_sql(s, "DROP TABLE jsd_meta");
    app_sql(s, "DELETE FROM jsd_schema_version WHERE version >= 2");
    app_sql(s, "DROP VIEW jsd_outbox_state");
    if (BE(state) == BE_SQLITE)
        app_sql(s, "DROP TABLE jsd_outbox_lease");
    else {
        app_sql(s, "DROP FUNCTION jsd_outbox_floor_raise");
        app_sql(s, "DROP INDEX jsd_outbox_rest");
    }
    app_sql(s, "DROP TABLE jsd_outbox_runs");
    app_sql(s, "DROP TABLE jsd_outbox_floor");
    app_sql(s, "DROP TABLE jsd_replay");        /* schema 10 */
    app_sql(s, "DROP TABLE jsd_durable_floor"); /* schema 11 */
    app_sql(s, "ALTER TABLE jsd_outbox DROP COLUMN first_attempt_at");
    app_sql(s, "ALTER TABLE jsd_inbox DROP COLUMN traceparent");
    app_sql(s, "ALTER TABLE jsd_inbox DROP COLUMN tracestate");
    jsd_store_close(s);

    s = open_url(url);
    ASSERT_EQ(q_i64(s, "SELECT max(version) FROM jsd_schema_version"), JSD__SCHEMA_VERSION);
    ASSERT_EQ(strlen(jsd_store_id(s)), 32);
    emit1(s, "order-1", "updated", "orders.updated");
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 1000, "t", jsd__now_ms(), &b));
    ASSERT_EQ(b.n, 2);
    ASSERT_STREQ(b.items[0].effect_id, "created");
    ASSERT_STREQ(b.items[0].msg_id, v1);
    ASSERT_OK(jsd_effect_msg_id(jsd_store_namespace(s), "order-1", "updated", mid));
    ASSERT_STREQ(b.items[1].msg_id, mid);
    jsd__effect_batch_free(&b);
    /* a store id deleted by hand is refused rather than silently replaced
     * (that would change the id of every later effect) */
    app_sql(s, "DELETE FROM jsd_meta");
    jsd_store_close(s);
    jsd_error e;
    s = NULL;
    ASSERT_STATUS(jsd_store_open(&s, url, &e), JSD_ERR_SCHEMA);
    ASSERT_CONTAINS(e.msg, "no store_id in jsd_meta");
    ASSERT_CONTAINS(e.msg, "namespace=NAME");
    jsd_store_opts o;
    jsd_store_opts_init(&o);
    o.url = url;
    o.id_namespace = "restored";
    ASSERT_OK_E(jsd_store_open_opts(&s, &o, &e), e.msg);
    jsd_store_close(s);
}

/* Issue 42: a schema-10 store (before durables' recorded floors) migrates
 * to 11 with nothing recorded, keeping its inbox; the recorded floor then
 * only rises, stamped with the time it rose, and the rewind's reset is the
 * one way down. */
static void migration_from_10_records_durable_floors(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    ASSERT_OK_E(jsd__tx_inbox_insert(tx, "ORDERS", "app", 7, "m-7", 1, NULL, NULL),
                jsd_store_errmsg(s));
    ASSERT_OK(jsd_tx_commit(tx));
    ASSERT_OK_E(jsd_store_durable_floor_record(s, "ORDERS", "app", 5), jsd_store_errmsg(s));
    /* back to schema 10 */
    app_sql(s, "DROP TABLE jsd_durable_floor");
    app_sql(s, "DELETE FROM jsd_schema_version WHERE version = 11");
    jsd_store_close(s);

    s = open_url(url);
    ASSERT_EQ(jsd_store_schema_found(s), 10);
    ASSERT_EQ(q_i64(s, "SELECT max(version) FROM jsd_schema_version"), 11);
    ASSERT_EQ(JSD_STORE_SCHEMA_VERSION, 11);
    uint64_t floor = 99, high = 0;
    int64_t at = -1;
    ASSERT_OK_E(jsd_store_durable_floor_get(s, "ORDERS", "app", &floor, &at), jsd_store_errmsg(s));
    ASSERT_U64_EQ(floor, 0);
    ASSERT_I64_EQ(at, 0);
    ASSERT_OK(jsd_store_inbox_high_water(s, "ORDERS", "app", &high));
    ASSERT_U64_EQ(high, 7);

    int64_t before = jsd__now_ms();
    ASSERT_OK_E(jsd_store_durable_floor_record(s, "ORDERS", "app", 5), jsd_store_errmsg(s));
    ASSERT_OK(jsd_store_durable_floor_get(s, "ORDERS", "app", &floor, &at));
    ASSERT_U64_EQ(floor, 5);
    ASSERT_I64_LE(before, at);
    int64_t first_at = at;
    /* lower or equal: left as it is, its time too */
    ASSERT_OK(jsd_store_durable_floor_record(s, "ORDERS", "app", 3));
    ASSERT_OK(jsd_store_durable_floor_record(s, "ORDERS", "app", 5));
    ASSERT_OK(jsd_store_durable_floor_get(s, "ORDERS", "app", &floor, &at));
    ASSERT_U64_EQ(floor, 5);
    ASSERT_I64_EQ(at, first_at);
    ASSERT_OK(jsd_store_durable_floor_record(s, "ORDERS", "app", 9));
    ASSERT_OK(jsd_store_durable_floor_get(s, "ORDERS", "app", &floor, &at));
    ASSERT_U64_EQ(floor, 9);
    /* another durable of the stream has its own */
    ASSERT_OK(jsd_store_durable_floor_get(s, "ORDERS", "other", &floor, &at));
    ASSERT_U64_EQ(floor, 0);
    /* a durable re-created lower (consumer_position.c's rewinds) */
    ASSERT_OK(jsd__store_durable_floor_set(s, "ORDERS", "app", 2));
    ASSERT_OK(jsd_store_durable_floor_get(s, "ORDERS", "app", &floor, &at));
    ASSERT_U64_EQ(floor, 2);
    /* bad input: a clear error */
    ASSERT_STATUS(jsd_store_durable_floor_record(s, "ORDERS", "", 1), JSD_ERR_INVALID);
    ASSERT_CONTAINS(jsd_store_errmsg(s), "a stream and a durable are needed");
    ASSERT_STATUS(jsd_store_durable_floor_record(s, "ORDERS", "app", UINT64_MAX), JSD_ERR_INVALID);
    jsd_store_close(s);
}

/* Defect 2: two producers with the same (owner, id) into one stream. Each
 * SQLite store has its own store id, so its effect's Nats-Msg-Id differs and
 * JetStream keeps both messages; one relay per store. */
static void two_stores_one_stream_keep_both(void **state)
{
    (void)state;
    rt_store a, b;
    rt_nats nt;
    rt_store_new(&a, RT_SQLITE);
    rt_store_new(&b, RT_SQLITE);
    const char *url = jsd_fx_shared_nats_url();
    char stream[64], filter[80];
    snprintf(stream, sizeof(stream), "%s", jsd_test_unique("TWO"));
    const char *root = jsd_test_unique("two");
    snprintf(filter, sizeof(filter), "%s.>", root);
    char subject[100];
    snprintf(subject, sizeof(subject), "%s.created", root);
    rt_nats_open(&nt, url);
    rt_stream_add(&nt, stream, filter);
    rt_store *stores[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        jsd_store *s = rt_open(stores[i]);
        emit1(s, "order-1", "created", subject);
        jsd_store_close(s);
    }
    for (int i = 0; i < 2; i++) {
        rt_relay t;
        jsd_relay_opts o;
        jsd_relay_opts_init(&o);
        o.publish_deadline_ms = 30000;
        o.lease_ms = 35000;
        rt_relay_make(&t, stores[i], url, &o);
        ASSERT_OK(jsd_relay_run_until_idle(t.relay));
        jsd_relay_stats rs;
        jsd_relay_stats_get(t.relay, &rs);
        ASSERT_EQ(rs.published, 1);
        ASSERT_EQ(rs.duplicates, 0);
        rt_relay_finish(&t);
    }
    size_t n = 0;
    rt_msg *msgs = rt_stream_read(&nt, stream, &n);
    ASSERT_EQ(n, 2);
    ASSERT_TRUE(strcmp(msgs[0].msg_id, msgs[1].msg_id) != 0);
    char ns[2][JSD_NAMESPACE_MAX + 1], want[JSD_MSG_ID_MAX];
    for (int i = 0; i < 2; i++) {
        rt_ns(stores[i], ns[i]);
        ASSERT_OK(jsd_effect_msg_id(ns[i], "order-1", "created", want));
        ASSERT_STREQ(msgs[i].msg_id, want);
    }
    free(msgs);
    rt_nats_close(&nt);
    rt_store_close(&a);
    rt_store_close(&b);
}

/* Run by emit_allocation_failures with JSD_FAIL_ALLOC_AFTER=k: open a fresh
 * SQLite store, emit one effect and commit. Every allocation that fails —
 * the message-id digest's among them — ends in JSD_ERR_NOMEM with nothing
 * committed; success stores the effect's real id, never a placeholder. */
static void emit_oom_child(void **state)
{
    (void)state;
    const char *path = getenv("JSD_TEST_OOM_DB");
    char url[600];
    if (path) {
        unlink(path);
        snprintf(url, sizeof(url), "sqlite:%s", path);
    } else {
        jsd_fx_sqlite_url(url, sizeof(url));
    }
    jsd_store *st = NULL;
    jsd_error e;
    jsd_status rc = jsd_store_open(&st, url, &e);
    if (rc == JSD_OK) {
        jsd_tx *tx = NULL;
        rc = jsd_tx_begin(&tx, st);
        jsd_effect ef = {.owner = "order-1", .id = "created", .subject = "orders.created"};
        if (rc == JSD_OK && (rc = jsd_tx_emit(tx, &ef)) != JSD_OK)
            jsd_tx_rollback(tx);
        else if (rc == JSD_OK)
            rc = jsd_tx_commit(tx);
        printf("error=%s\n", rc == JSD_OK ? "" : jsd_store_errmsg(st));
        char stored[100] = "", want[JSD_MSG_ID_MAX];
        q_text(st, "SELECT coalesce(max(msg_id), '') FROM jsd_outbox_state", stored,
               sizeof(stored));
        if (rc == JSD_OK) {
            /* the one injected failure may land on this check's own digest */
            jsd_status w = jsd_effect_msg_id(jsd_store_namespace(st), "order-1", "created", want);
            if (w == JSD_ERR_NOMEM)
                w = jsd_effect_msg_id(jsd_store_namespace(st), "order-1", "created", want);
            ASSERT_OK(w);
            ASSERT_STREQ(stored, want);
        } else {
            ASSERT_STREQ(stored, "");
        }
        jsd_store_close(st);
    }
    printf("status=%s\n", jsd_status_name(rc));
    if (rc != JSD_OK)
        ASSERT_EQ(rc, JSD_ERR_NOMEM);
}

static void emit_allocation_failures(void **state)
{
    (void)state;
    char path[600];
    snprintf(path, sizeof(path), "%s/oom.db", jsd_test_dir());
    setenv("JSD_TEST_OOM_DB", path, 1);
    /* Not jsd_test_alloc_failures: open tolerates some failed allocations (the
     * wake-up registry falls back to polling), so an early run succeeds before
     * the emit's own allocations are reached. Fail each of the first 60. */
    char self[512], cmd[700], out[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    ASSERT_TRUE(n > 0);
    self[n] = '\0';
    int digest_failures = 0;
    for (int k = 0; k < 60; k++) {
        snprintf(cmd, sizeof(cmd), "JSD_FAIL_ALLOC_AFTER=%d %s emit_oom_child", k, self);
        int rc = jsd_test_run(cmd, out, sizeof(out));
        if (rc != 0)
            fail_msg("with JSD_FAIL_ALLOC_AFTER=%d the emit failed (exit %d):\n%s", k, rc, out);
        if (!strstr(out, "status=JSD_OK"))
            ASSERT_CONTAINS(out, "status=JSD_ERR_NOMEM");
        if (strstr(out, "cannot derive the effect's message id"))
            digest_failures++;
    }
    ASSERT_EQ(digest_failures, 1);
}

/* ---- PostgreSQL notices ------------------------------------------------------------------ */

typedef struct notice_log {
    char lines[8][1024];
    jsd_log_level level[8];
    int n;
} notice_log;

static void notice_sink(jsd_log_level level, const char *component, const char *line, void *user)
{
    notice_log *l = user;
    if (strcmp(component, "store") != 0 || l->n == 8)
        return;
    snprintf(l->lines[l->n], sizeof(l->lines[0]), "%s", line);
    l->level[l->n++] = level;
}

static void read_file(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    fclose(f);
}

/* libpq's notices reach the project's logger at their severity (WARNING at
 * warn, NOTICE at info), with the URL password scrubbed, and never go raw to
 * stderr: with the default sink and JSON format, stderr holds only JSON. */
static void pg_notices_go_through_the_logger(void **state)
{
    (void)state;
    char base[512], url[600], errpath[600], text[8192];
    assert_int_equal(jsd_fx_pg_database(base, sizeof(base)), 0);
    /* the fixture trusts loopback: the password is carried, not checked */
    snprintf(url, sizeof(url), "%s%spassword=s3cr3t-pw", base, strchr(base, '?') ? "&" : "?");
    jsd_store *s = open_url(url);
    notice_log l = {0};
    jsd_log_configure(JSD_LOG_INFO, JSD_LOG_TEXT, notice_sink, &l);
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    tx_sql(tx, "DO $$ BEGIN RAISE WARNING 'leaky s3cr3t-pw here'; END $$");
    tx_sql(tx, "SET LOCAL client_min_messages = notice");
    tx_sql(tx, "DO $$ BEGIN RAISE NOTICE 'just a notice'; END $$");
    jsd_tx_rollback(tx);
    ASSERT_EQ(l.n, 2);
    ASSERT_EQ(l.level[0], JSD_LOG_WARN);
    ASSERT_CONTAINS(l.lines[0], "PostgreSQL WARNING");
    ASSERT_CONTAINS(l.lines[0], "leaky *** here");
    ASSERT_CONTAINS(l.lines[0], "SQLSTATE 01000");
    ASSERT_NOT_CONTAINS(l.lines[0], "s3cr3t-pw");
    ASSERT_EQ(l.level[1], JSD_LOG_INFO);
    ASSERT_CONTAINS(l.lines[1], "PostgreSQL NOTICE");
    ASSERT_CONTAINS(l.lines[1], "just a notice");

    /* the default sink, JSON: stderr has the JSON line and no raw notice */
    snprintf(errpath, sizeof(errpath), "%s/stderr.txt", jsd_test_dir());
    fflush(stderr);
    int saved = dup(2);
    int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    jsd_log_configure(JSD_LOG_WARN, JSD_LOG_JSON, NULL, NULL);
    ASSERT_OK(jsd_tx_begin(&tx, s));
    tx_sql(tx, "DO $$ BEGIN RAISE WARNING 'to stderr s3cr3t-pw'; END $$");
    jsd_tx_rollback(tx);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    jsd_log_configure(JSD_LOG_WARN, JSD_LOG_TEXT, NULL, NULL);
    read_file(errpath, text, sizeof(text));
    ASSERT_CONTAINS(text, "\"level\":\"warn\"");
    ASSERT_CONTAINS(text, "\"component\":\"store\"");
    ASSERT_CONTAINS(text, "to stderr ***");
    ASSERT_NOT_CONTAINS(text, "WARNING:  ");
    ASSERT_NOT_CONTAINS(text, "s3cr3t-pw");
    jsd_store_close(s);
}

/* ---- RELAY-3: wake-ups ------------------------------------------------------------------ */

static void wakeups_follow_commits(void **state)
{
    char url[512];
    jsd_store *relay = open_new(state, url, sizeof(url));
    jsd_store *app = open_url(url);
    bool woken = true;
    ASSERT_OK(jsd__store_wait_wakeup(relay, 0, &woken)); /* PostgreSQL: LISTEN now */
    ASSERT_OK(jsd__store_wait_wakeup(relay, 50, &woken));
    assert_false(woken);

    emit1(app, "o", "w1", "orders.w");
    ASSERT_OK(jsd__store_wait_wakeup(relay, 30000, &woken));
    assert_true(woken);
    ASSERT_OK(jsd__store_wait_wakeup(relay, 50, &woken));
    assert_false(woken);
    if (BE(state) == BE_PG) {
        /* A transaction without effects wakes nobody (on SQLite the
         * cross-process check cannot tell, and wakes spuriously). */
        app_sql(app, "CREATE TABLE unrelated (x INTEGER)");
        ASSERT_OK(jsd__store_wait_wakeup(relay, 50, &woken));
        assert_false(woken);
    }

    /* A commit in another process. */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        jsd_store *c = NULL;
        if (jsd_store_open(&c, url, NULL) != JSD_OK)
            _exit(3);
        jsd_tx *tx;
        jsd_effect e = {.id = "from-child", .subject = "orders.w"};
        if (jsd_tx_begin(&tx, c) != JSD_OK || jsd_tx_emit(tx, &e) != JSD_OK ||
            jsd_tx_commit(tx) != JSD_OK)
            _exit(4);
        jsd_store_close(c);
        _exit(0);
    }
    jsd_test_child_ok(pid, "the committing process");
    ASSERT_OK(jsd__store_wait_wakeup(relay, 30000, &woken));
    assert_true(woken);
    jsd_store_close(app);
    jsd_store_close(relay);
}

/* ---- status counts ---------------------------------------------------------------------- */

static void stats_count_what_they_name(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    jsd_store_stats st = stats(s);
    ASSERT_EQ(st.backlog + st.due + st.published + st.dead_lettered + st.inbox_rows +
                  st.poison_records + st.oldest_due_age_ms,
              0);
    int64_t now = jsd__now_ms();
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    jsd_effect e1 = {.id = "past", .subject = "a.b", .not_before_ms = now - 5000};
    jsd_effect e2 = {.id = "future", .subject = "a.b", .not_before_ms = now + 3600000};
    ASSERT_OK(jsd_tx_emit(tx, &e1));
    ASSERT_OK(jsd_tx_emit(tx, &e2));
    ASSERT_OK(jsd_tx_commit(tx));
    st = stats(s);
    ASSERT_EQ(st.backlog, 2);
    ASSERT_EQ(st.due, 1);
    ASSERT_TRUE(st.oldest_due_age_ms >= 5000 && st.oldest_due_age_ms < 3600000);
    jsd_store_stats cheap;
    ASSERT_OK(jsd__store_backlog(s, now, &cheap));
    ASSERT_EQ(cheap.backlog, 2);
    ASSERT_EQ(cheap.due, 1);
    ASSERT_EQ(cheap.oldest_due_age_ms, 5000);
    ASSERT_EQ(cheap.published + cheap.inbox_rows, 0);
    jsd_store_close(s);
}

/* ---- one back end's own failure modes ---------------------------------------------------- */

static void url_errors_are_clear_and_secret_free(void **state)
{
    (void)state;
    jsd_store *s = NULL;
    jsd_error e;
    ASSERT_STATUS(jsd_store_open(&s, "", &e), JSD_ERR_CONFIG);
    ASSERT_STATUS(jsd_store_open(&s, NULL, &e), JSD_ERR_CONFIG);
    ASSERT_STATUS(jsd_store_open(&s, "sqlite:", &e), JSD_ERR_CONFIG);
    ASSERT_STATUS(jsd_store_open(&s, "mysql://u:hunter2@db/x", &e), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(e.msg, "unknown scheme");
    ASSERT_NOT_CONTAINS(e.msg, "hunter2");
    ASSERT_STATUS(jsd_store_open(&s, "postgres://u:hunter2@127.0.0.1:notaport/db", &e),
                  JSD_ERR_CONFIG);
    ASSERT_CONTAINS(e.msg, "malformed");
    ASSERT_NOT_CONTAINS(e.msg, "hunter2");
    ASSERT_STATUS(jsd_store_open(&s, "postgresql://u:hunter2@127.0.0.1/db?bogus=1", &e),
                  JSD_ERR_CONFIG);
    ASSERT_NOT_CONTAINS(e.msg, "hunter2");
    ASSERT_STATUS(jsd_store_open(&s, "postgres://u:hunter2@127.0.0.1/db?schema=1bad", &e),
                  JSD_ERR_CONFIG);
    ASSERT_CONTAINS(e.msg, "schema name");
    /* Port 1 on loopback: nothing listens there. */
    ASSERT_STATUS(jsd_store_open(&s, "postgresql://u:hunter2@127.0.0.1:1/db", &e), JSD_ERR_CONNECT);
    ASSERT_CONTAINS(e.msg, "cannot connect");
    ASSERT_CONTAINS(e.msg, "u:***@127.0.0.1:1");
    ASSERT_NOT_CONTAINS(e.msg, "hunter2");
    ASSERT_STATUS(jsd_store_open(&s, "postgresql://127.0.0.1:1/db?password=hunter2", &e),
                  JSD_ERR_CONNECT);
    ASSERT_NOT_CONTAINS(e.msg, "hunter2");
    ASSERT_NE(jsd_store_open(&s, "postgresql://u:hun/ter@2@127.0.0.1:1/db", &e), JSD_OK);
    ASSERT_NOT_CONTAINS(e.msg, "hun/ter");
    ASSERT_NOT_CONTAINS(e.msg, "ter@2");
    /* A folder that does not exist. */
    ASSERT_NE(jsd_store_open(&s, "sqlite:/nonexistent/dir/x.db", &e), JSD_OK);
    ASSERT_CONTAINS(e.msg, "/nonexistent/dir/x.db");
    assert_null(s);
    char red[128];
    jsd__store_redact_url("postgres://me:pw@h:5/db?sslmode=require&password=pw2", red, sizeof(red));
    ASSERT_STREQ(red, "postgres://me:***@h:5/db?sslmode=require&password=***");
}

/* The tmpfs of the disk cases (jsd_test_mount_tmpfs). */
static const char *mnt_dir;

static bool mount_tmpfs(const char *name, const char *size)
{
    mnt_dir = jsd_test_mount_tmpfs(name, size);
    return mnt_dir != NULL;
}

static void sqlite_read_only_file(void **state)
{
    (void)state;
    if (!mount_tmpfs("ro", "4m")) {
        skip();
        return;
    }
    char url[700];
    snprintf(url, sizeof(url), "sqlite:%s/ro.db", mnt_dir);
    jsd_store *s = open_url(url);
    emit1(s, "o", "before", "orders.x");
    jsd_store_close(s);
    if (mount("tmpfs", mnt_dir, "tmpfs", MS_REMOUNT | MS_RDONLY, NULL) != 0)
        fail_msg("remount read-only: %s", strerror(errno));
    jsd_error e;
    s = NULL;
    ASSERT_STATUS(jsd_store_open(&s, url, &e), JSD_ERR_READONLY);
    ASSERT_CONTAINS(e.msg, "read-only");
    ASSERT_CONTAINS(e.msg, "ro.db");
    assert_null(s);
    /* The data is intact once writable again. */
    if (mount("tmpfs", mnt_dir, "tmpfs", MS_REMOUNT, NULL) != 0)
        fail_msg("remount read-write: %s", strerror(errno));
    s = open_url(url);
    ASSERT_EQ(stats(s).backlog, 1);
    jsd_store_close(s);
}

static void sqlite_disk_full(void **state)
{
    (void)state;
    if (!mount_tmpfs("full", "1m")) {
        skip();
        return;
    }
    char url[700];
    snprintf(url, sizeof(url), "sqlite:%s/full.db", mnt_dir);
    jsd_store *s = open_url(url);
    static char payload[16384];
    memset(payload, 'x', sizeof(payload));
    int committed = 0;
    jsd_status rc = JSD_OK;
    for (int i = 0; i < 1000 && rc == JSD_OK; i++) {
        char id[32];
        snprintf(id, sizeof(id), "e%d", i);
        jsd_tx *tx;
        rc = jsd_tx_begin(&tx, s);
        if (rc != JSD_OK)
            break;
        jsd_effect e = {.id = id, .subject = "fill.up", .payload = payload, .len = sizeof(payload)};
        rc = jsd_tx_emit(tx, &e);
        if (rc != JSD_OK) {
            jsd_tx_rollback(tx);
            break;
        }
        rc = jsd_tx_commit(tx);
        if (rc == JSD_OK)
            committed++;
    }
    ASSERT_STATUS(rc, JSD_ERR_FULL);
    ASSERT_CONTAINS(jsd_store_errmsg(s), "full");
    ASSERT_TRUE(committed > 0);
    print_message("disk full after %d committed effects: %s\n", committed, jsd_store_errmsg(s));
    /* Every committed effect is still there, none of the refused one. */
    jsd_store_stats st;
    ASSERT_OK_E(jsd_store_stats_get(s, &st), jsd_store_errmsg(s));
    ASSERT_EQ(st.backlog, committed);
    jsd_store_close(s);
    s = open_url(url);
    ASSERT_EQ(stats(s).backlog, committed);
    jsd_store_close(s);
}

/* PostgreSQL's disk full (SQLSTATE 53100): the store's tables are created in a
 * tablespace on a small tmpfs of the test's own. */
static char ts_name[64], ts_server[512];
static void drop_tablespace(void)
{
    if (!ts_name[0])
        return;
    PGconn *c = PQconnectdb(ts_server);
    char sql[128];
    /* Empty it first, whatever state the test left it in. */
    PQclear(
        PQexec(c, "DROP TABLE IF EXISTS jsd_outbox, jsd_inbox, jsd_poison, jsd_schema_version"));
    snprintf(sql, sizeof(sql), "DROP TABLESPACE IF EXISTS %s", ts_name);
    PQclear(PQexec(c, sql));
    PQfinish(c);
}

static void pg_disk_full(void **state)
{
    (void)state;
    char url[512];
    assert_int_equal(jsd_fx_pg_database(url, sizeof(url)), 0);
    if (!mount_tmpfs("pgts", "2m")) {
        skip();
        return;
    }
    struct passwd *pw = getpwnam("postgres");
    if (!pw || chown(mnt_dir, pw->pw_uid, pw->pw_gid) != 0 || chmod(mnt_dir, 0700) != 0) {
        print_message("cannot hand the tmpfs to the postgres user\n");
        skip();
        return;
    }
    /* Cluster-wide object: named for this process and dropped at exit. */
    snprintf(ts_name, sizeof(ts_name), "jsd_full_%ld", (long)getpid());
    snprintf(ts_server, sizeof(ts_server), "%s", url);
    PGconn *c = PQconnectdb(url);
    char sql[800];
    snprintf(sql, sizeof(sql), "CREATE TABLESPACE %s LOCATION '%s'", ts_name, mnt_dir);
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        print_message("cannot create a tablespace: %s\n", PQerrorMessage(c));
        PQclear(r);
        PQfinish(c);
        ts_name[0] = '\0';
        skip();
        return;
    }
    PQclear(r);
    atexit(drop_tablespace);
    snprintf(sql, sizeof(sql), "ALTER DATABASE \"%s\" SET default_tablespace = %s", PQdb(c),
             ts_name);
    r = PQexec(c, sql);
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
    PQfinish(c);

    jsd_store *s = open_url(url);
    static char payload[8192];
    /* Incompressible so TOAST cannot shrink it. */
    for (size_t i = 0; i < sizeof(payload); i++)
        payload[i] = (char)(rand() & 0xff);
    int committed = 0;
    jsd_status rc = JSD_OK;
    for (int i = 0; i < 2000 && rc == JSD_OK; i++) {
        char id[32];
        snprintf(id, sizeof(id), "e%d", i);
        jsd_tx *tx;
        if ((rc = jsd_tx_begin(&tx, s)) != JSD_OK)
            break;
        jsd_effect e = {.id = id, .subject = "fill.up", .payload = payload, .len = sizeof(payload)};
        rc = jsd_tx_emit(tx, &e);
        if (rc != JSD_OK) {
            jsd_tx_rollback(tx);
            break;
        }
        if ((rc = jsd_tx_commit(tx)) == JSD_OK)
            committed++;
    }
    ASSERT_STATUS(rc, JSD_ERR_FULL);
    ASSERT_STREQ(jsd_store_error(s)->sqlstate, "53100");
    ASSERT_CONTAINS(jsd_store_errmsg(s), "full");
    print_message("disk full after %d committed effects: %s\n", committed, jsd_store_errmsg(s));
    ASSERT_TRUE(committed > 0);
    ASSERT_EQ(stats(s).backlog, committed);
    /* Drop the data so the tablespace can go. */
    jsd_store_close(s);
    c = PQconnectdb(url);
    PQclear(PQexec(c, "DROP TABLE jsd_outbox, jsd_inbox, jsd_poison, jsd_schema_version"));
    PQfinish(c);
}

static void pg_schema_option(void **state)
{
    (void)state;
    char url[512], u2[700];
    assert_int_equal(jsd_fx_pg_database(url, sizeof(url)), 0);
    snprintf(u2, sizeof(u2), "%s%sschema=tenant_a", url, strchr(url, '?') ? "&" : "?");
    jsd_store *a = open_url(u2);
    jsd_store_opts o;
    jsd_store_opts_init(&o);
    o.url = url;
    o.pg_schema = "tenant_b";
    jsd_store *b = NULL;
    jsd_error e;
    ASSERT_OK_E(jsd_store_open_opts(&b, &o, &e), e.msg);
    emit1(a, "o", "a1", "a.x");
    emit1(a, "o", "a2", "a.x");
    emit1(b, "o", "a1", "b.x"); /* same identity, other schema: independent */
    ASSERT_EQ(stats(a).backlog, 2);
    ASSERT_EQ(stats(b).backlog, 1);
    ASSERT_EQ(q_i64(a, "SELECT count(*) FROM tenant_a.jsd_outbox"), 2);
    ASSERT_EQ(q_i64(a, "SELECT count(*) FROM information_schema.tables WHERE table_schema = "
                       "'public' AND table_name LIKE 'jsd_%'"),
              0);
    o.pg_schema = "bad-name";
    jsd_store *c = NULL;
    ASSERT_STATUS(jsd_store_open_opts(&c, &o, &e), JSD_ERR_CONFIG);
    assert_null(c);
    jsd_store_close(a);
    jsd_store_close(b);
}

/* Schema 6 (issue 12): a claim's lease update stays on its row's page (a
 * heap-only tuple, no index entries) for nearly every row. Rows shaped as
 * the bench's (256-byte payloads) and the relay's 32-digit lease tokens: 44
 * of 512 lease versions left their page at fillfactor 50, 308 at migration
 * 3's 70. */
static void pg_claims_stay_on_their_page(void **state)
{
    (void)state;
    char url[512];
    assert_int_equal(jsd_fx_pg_database(url, sizeof(url)), 0);
    jsd_store *s = open_url(url);
    char opts[128];
    q_text(s, "SELECT array_to_string(reloptions, ',') FROM pg_class WHERE relname = 'jsd_outbox'",
           opts, sizeof(opts));
    ASSERT_TRUE(strstr(opts, "fillfactor=50") != NULL);
    char payload[256];
    memset(payload, 'p', sizeof(payload));
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    for (int i = 0; i < 512; i++) {
        char id[32];
        snprintf(id, sizeof(id), "e%d", i);
        jsd_effect e = {.owner = "bench",
                        .id = id,
                        .subject = "bench.relay.page",
                        .payload = payload,
                        .len = sizeof(payload)};
        ASSERT_OK_E(jsd_tx_emit(tx, &e), jsd_store_errmsg(s));
    }
    ASSERT_OK(jsd_tx_commit(tx));
    app_sql(s, "CREATE TABLE page_before AS SELECT id, (ctid::text::point)[0] AS page "
               "FROM jsd_outbox");
    ASSERT_TRUE(q_i64(s, "SELECT count(DISTINCT page) FROM page_before") > 1);
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    int64_t now = jsd__now_ms();
    ASSERT_OK(jsd__store_claim(s, 256, 60000, "0123456789abcdef0123456789abcdef", now, &b));
    ASSERT_EQ(b.n, 256);
    ASSERT_OK(jsd__store_claim(s, 256, 60000, "fedcba9876543210fedcba9876543210", now, &b));
    ASSERT_EQ(b.n, 256);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_outbox WHERE lease_token IS NOT NULL"), 512);
    int64_t moved = q_i64(s, "SELECT count(*) FROM jsd_outbox o JOIN page_before p USING (id) "
                             "WHERE (o.ctid::text::point)[0] <> p.page");
    printf("lease versions off their row's page: %lld of 512\n", (long long)moved);
    ASSERT_TRUE(moved < 512 / 8);
    jsd__effect_batch_free(&b);
    jsd_store_close(s);
}

/* A second handle for reads (the relay's backlog gauges) opens the same
 * database: what one commits the other counts. */
static void open_reader_same_database(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    jsd_store *g = NULL;
    jsd_error err;
    ASSERT_OK_E(jsd__store_open_reader(s, &g, &err), err.msg);
    assert_non_null(g);
    ASSERT_STREQ(jsd_store_id(g), jsd_store_id(s));
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    jsd_effect e = {.owner = "o", .id = "e1", .subject = "gauge.x", .payload = "p", .len = 1};
    ASSERT_OK_E(jsd_tx_emit(tx, &e), jsd_store_errmsg(s));
    ASSERT_OK(jsd_tx_commit(tx));
    jsd_store_stats st;
    ASSERT_OK_E(jsd__store_backlog(g, jsd__now_ms(), &st), jsd_store_errmsg(g));
    ASSERT_EQ(st.backlog, 1);
    jsd_store_close(g);
    jsd_store_close(s);
}

/* An SQLite ":memory:" store is one database per connection: no second
 * handle is handed out for it (the relay then counts on its own). */
static void sqlite_memory_store_has_no_reader(void **state)
{
    (void)state;
    jsd_store *s = open_url("sqlite::memory:");
    jsd_store *g = (jsd_store *)&g; /* must be reset */
    jsd_error err;
    ASSERT_STATUS(jsd__store_open_reader(s, &g, &err), JSD_ERR_CONFIG);
    assert_null(g);
    ASSERT_CONTAINS(err.msg, "another database");
    jsd_store_close(s);
}

/* A database that exists keeps its page size: the application's own file,
 * made with SQLite's default 4 KiB pages, becomes a store that works. */
static void sqlite_existing_file_keeps_its_pages(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/app.db", jsd_test_dir());
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db,
                                  "PRAGMA page_size=4096; CREATE TABLE app (x); "
                                  "INSERT INTO app VALUES (1)",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(db);
    jsd_store *s = open_url(path);
    ASSERT_EQ(q_i64(s, "PRAGMA page_size"), 4096);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM app"), 1);
    emit1(s, "o", "e1", "pages.x");
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    ASSERT_OK(jsd__store_claim(s, 8, 60000, "0123456789abcdef0123456789abcdef", jsd__now_ms(), &b));
    ASSERT_EQ(b.n, 1);
    jsd__effect_batch_free(&b);
    jsd_store_close(s);
}

/* The claim's transaction alone commits asynchronously (relay.c DESIGN 8):
 * the session's synchronous_commit is unchanged after it, so the failures,
 * releases and dead letters written on the same connection stay synchronous. */
static void pg_claim_async_commit_stays_in_the_claim(void **state)
{
    (void)state;
    char url[512], v[32];
    assert_int_equal(jsd_fx_pg_database(url, sizeof(url)), 0);
    jsd_store *s = open_url(url);
    q_text(s, "SHOW synchronous_commit", v, sizeof(v));
    ASSERT_STREQ(v, "on");
    emit1(s, "o", "e1", "claim.async");
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    ASSERT_OK(jsd__store_claim(s, 8, 60000, "0123456789abcdef0123456789abcdef", jsd__now_ms(), &b));
    ASSERT_EQ(b.n, 1);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_outbox_state WHERE lease_token IS NOT NULL"), 1);
    q_text(s, "SHOW synchronous_commit", v, sizeof(v));
    ASSERT_STREQ(v, "on");
    jsd__effect_batch_free(&b);
    jsd_store_close(s);
}

/* Several processes opening a fresh database at once all succeed: the
 * migration runs once, under an advisory lock. */
static void pg_concurrent_open(void **state)
{
    (void)state;
    char url[512];
    assert_int_equal(jsd_fx_pg_database(url, sizeof(url)), 0);
    int gate[2];
    assert_int_equal(pipe(gate), 0);
    pid_t pids[4];
    for (int i = 0; i < 4; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            close(gate[1]);
            char b;
            if (read(gate[0], &b, 1) < 0)
                _exit(2);
            jsd_store *s = NULL;
            jsd_error e;
            if (jsd_store_open(&s, url, &e) != JSD_OK) {
                fprintf(stderr, "open: %s\n", e.msg);
                _exit(3);
            }
            jsd_store_close(s);
            _exit(0);
        }
    }
    close(gate[0]);
    close(gate[1]);
    for (int i = 0; i < 4; i++)
        jsd_test_child_ok(pids[i], "a migrating process");
    jsd_store *s = open_url(url);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_schema_version"), JSD__SCHEMA_VERSION);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_meta"), 1); /* one store id */
    jsd_store_close(s);
}

static bool pg_someone_waits_on_a_lock(PGconn *admin)
{
    PGresult *r = PQexec(admin, "SELECT count(*) FROM pg_locks WHERE NOT granted");
    bool yes = PQresultStatus(r) == PGRES_TUPLES_OK && strtol(PQgetvalue(r, 0, 0), NULL, 10) > 0;
    PQclear(r);
    return yes;
}

/* Two transactions emitting the same identity at once: the second waits for
 * the first and, when it commits, is refused with JSD_ERR_EXISTS; only one
 * effect exists. */
static void pg_concurrent_duplicate_identity(void **state)
{
    (void)state;
    char url[512];
    assert_int_equal(jsd_fx_pg_database(url, sizeof(url)), 0);
    jsd_store *a = open_url(url);
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, a));
    jsd_effect mine[2] = {{.owner = "o", .id = "x", .subject = "a.b"},
                          {.owner = "o", .id = "y", .subject = "a.b"}};
    ASSERT_OK(jsd_tx_emit_batch(tx, mine, 2, NULL));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        jsd_store *b = NULL;
        if (jsd_store_open(&b, url, NULL) != JSD_OK)
            _exit(3);
        jsd_tx *tb;
        jsd_effect theirs[2] = {{.owner = "o", .id = "z", .subject = "a.b"},
                                {.owner = "o", .id = "x", .subject = "a.b"}};
        if (jsd_tx_begin(&tb, b) != JSD_OK)
            _exit(4);
        jsd_status rc = jsd_tx_emit_batch(tb, theirs, 2, NULL);
        fprintf(stderr, "child: %s: %s\n", jsd_status_name(rc), jsd_store_errmsg(b));
        jsd_tx_rollback(tb);
        _exit(rc == JSD_ERR_EXISTS && strstr(jsd_store_errmsg(b), "same time") ? 0 : 5);
    }
    PGconn *admin = PQconnectdb(url);
    ASSERT_WAIT(pg_someone_waits_on_a_lock(admin), 30000);
    ASSERT_OK(jsd_tx_commit(tx));
    jsd_test_child_ok(pid, "the second writer");
    ASSERT_EQ(stats(a).backlog, 2);
    PQfinish(admin);
    jsd_store_close(a);
}

/* Two consumers sharing a durable retire inbox rows of reused sequences (the
 * stream re-created, or its server rolled back) at the same time: each
 * takes a fresh negative sequence, and the second waits for the first
 * instead of drawing the same one. Before, both read the same min(stream_seq)
 * - 1 and the second failed with 23505 (jsd_inbox_pkey), its batch NAKed at
 * every delivery until max_deliver parked it (the chaos suite's ci_cluster,
 * seed 3, stream-recreate). */
static void pg_concurrent_inbox_retire(void **state)
{
    (void)state;
    char url[512];
    assert_int_equal(jsd_fx_pg_database(url, sizeof(url)), 0);
    jsd_store *a = open_url(url);
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, a));
    for (uint64_t seq = 1; seq <= 2; seq++)
        ASSERT_OK(jsd__tx_inbox_insert(tx, "S", "c", seq, seq == 1 ? "m1" : "m2", 1, NULL, NULL));
    ASSERT_OK(jsd_tx_commit(tx));
    ASSERT_OK(jsd_tx_begin(&tx, a));
    ASSERT_OK_E(jsd__tx_inbox_retire(tx, "S", "c", 1), jsd_store_errmsg(a));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        jsd_store *b = NULL;
        jsd_tx *tb;
        if (jsd_store_open(&b, url, NULL) != JSD_OK || jsd_tx_begin(&tb, b) != JSD_OK)
            _exit(3);
        jsd_status rc = jsd__tx_inbox_retire(tb, "S", "c", 2);
        fprintf(stderr, "child: retire: %s: %s\n", jsd_status_name(rc), jsd_store_errmsg(b));
        if (rc != JSD_OK)
            _exit(4);
        rc = jsd_tx_commit(tb);
        fprintf(stderr, "child: commit: %s: %s\n", jsd_status_name(rc), jsd_store_errmsg(b));
        _exit(rc == JSD_OK ? 0 : 5);
    }
    PGconn *admin = PQconnectdb(url);
    ASSERT_WAIT(pg_someone_waits_on_a_lock(admin), 30000);
    ASSERT_OK(jsd_tx_commit(tx));
    jsd_test_child_ok(pid, "the second consumer's retire");
    /* both rows kept, each under a sequence of its own below 0 */
    PGresult *r = PQexec(admin, "SELECT count(DISTINCT stream_seq), max(stream_seq) FROM jsd_inbox "
                                "WHERE msg_id IN ('m1', 'm2')");
    ASSERT_EQ(PQresultStatus(r), PGRES_TUPLES_OK);
    ASSERT_STREQ(PQgetvalue(r, 0, 0), "2");
    assert_true(strtoll(PQgetvalue(r, 0, 1), NULL, 10) < 0);
    PQclear(r);
    PQfinish(admin);
    jsd_store_close(a);
}

/* A PostgreSQL connection lost between operations is re-established by the
 * next operation; the one that met the loss reports JSD_ERR_CONNECT. Nothing
 * committed is lost. */
/* One text value from a raw libpq connection. */
static void pg_text(PGconn *c, const char *sql, char *out, size_t cap)
{
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) < 1)
        fail_msg("%s: %s", sql, PQerrorMessage(c));
    snprintf(out, cap, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
}

/* The relay's receipt writer handle (jsd__store_open_writer, DESIGN 8 in
 * relay.c): a second session on the same store (same schema, same message-id
 * namespace) that commits synchronously and reconnects; none on SQLite. */
static void pg_writer_handle_is_a_second_session(void **state)
{
    (void)state;
    char url[512], v[32];
    assert_int_equal(jsd_fx_pg_database(url, sizeof(url)), 0);
    char nsurl[600];
    snprintf(nsurl, sizeof(nsurl), "%s?schema=jsd_w&namespace=writer-ns", url);
    jsd_store *s = open_url(nsurl), *w = NULL;
    jsd_error e;
    ASSERT_OK_E(jsd__store_open_writer(s, &w, &e), e.msg);
    assert_non_null(w);
    ASSERT_STREQ(jsd_store_namespace(w), "writer-ns");
    PGconn *wc = jsd__pg_handle(w), *sc = jsd__pg_handle(s);
    assert_true(PQbackendPID(wc) != PQbackendPID(sc));
    pg_text(wc, "SHOW synchronous_commit", v, sizeof(v));
    ASSERT_STREQ(v, "on");
    /* The same tables: an effect claimed through s is retired through w. */
    emit1(s, "o", "w1", "orders.x");
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    ASSERT_OK_E(jsd__store_claim(s, 10, 30000, "tw", jsd__now_ms(), &b), jsd_store_errmsg(s));
    ASSERT_EQ(b.n, 1);
    jsd__receipt rc = {
        .row_id = b.items[0].row_id, .stream = "S", .seq = 7, .published_at_ms = jsd__now_ms()};
    size_t applied = 0;
    ASSERT_OK_E(jsd__store_record_receipts(w, "tw", &rc, 1, &applied), jsd_store_errmsg(w));
    ASSERT_EQ(applied, 1);
    ASSERT_EQ(stats(s).backlog, 0);
    jsd__effect_batch_free(&b);
    /* After the server drops the writer's session, it reconnects. */
    char sql[96];
    snprintf(sql, sizeof(sql), "SELECT pg_terminate_backend(%d)", PQbackendPID(wc));
    pg_text(sc, sql, v, sizeof(v));
    bool found = false;
    int64_t next = 0;
    if (jsd__store_next_due(w, &found, &next) != JSD_OK) /* may meet the dead session */
        ASSERT_OK_E(jsd__store_next_due(w, &found, &next), jsd_store_errmsg(w));
    assert_int_equal(PQstatus(jsd__pg_handle(w)), CONNECTION_OK);
    jsd_store_close(w);
    jsd_store_close(s);

    char surl[512];
    jsd_fx_sqlite_url(surl, sizeof(surl));
    s = open_url(surl);
    w = s; /* must be overwritten */
    ASSERT_OK_E(jsd__store_open_writer(s, &w, &e), e.msg);
    assert_null(w);
    jsd_store_close(s);
}

/* The PostgreSQL claim floor: after full batches the claim starts above the
 * largest id it took, yet an effect below it whose lease expires is claimed
 * again (marked maybe published) within about a second; and keyed heads
 * and unordered effects share a batch. */
static void pg_claim_floor_keeps_expired_leases_reachable(void **state)
{
    (void)state;
    char url[512], id[32];
    assert_int_equal(jsd_fx_pg_database(url, sizeof(url)), 0);
    jsd_store *s = open_url(url);
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    for (int i = 0; i < 30; i++) {
        snprintf(id, sizeof(id), "e%02d", i);
        jsd_effect ef = {.owner = "o", .id = id, .subject = "orders.x"};
        ASSERT_OK(jsd_tx_emit(tx, &ef));
    }
    ASSERT_OK(jsd_tx_commit(tx));
    jsd__effect_batch a, b, c;
    jsd__effect_batch_init(&a);
    jsd__effect_batch_init(&b);
    jsd__effect_batch_init(&c);
    int64_t t0 = jsd__now_ms();
    ASSERT_OK_E(jsd__store_claim(s, 10, 300, "short", t0, &a), jsd_store_errmsg(s));
    ASSERT_EQ(a.n, 10);
    ASSERT_OK_E(jsd__store_claim(s, 10, 60000, "long", t0, &b), jsd_store_errmsg(s));
    ASSERT_EQ(b.n, 10);
    ASSERT_TRUE(b.items[0].row_id > a.items[9].row_id);
    /* Once the short lease is over, its ten come back (and no others). */
    int again = 0;
    int64_t deadline = jsd__mono_ms() + 10000;
    while (again < 10 && jsd__mono_ms() < deadline) {
        ASSERT_OK_E(jsd__store_claim(s, 10, 60000, "later", jsd__now_ms(), &c),
                    jsd_store_errmsg(s));
        for (size_t i = 0; i < c.n; i++) {
            if (c.items[i].row_id <= a.items[9].row_id) {
                ASSERT_TRUE(c.items[i].maybe_published);
                again++;
            }
            ASSERT_TRUE(c.items[i].row_id < b.items[0].row_id ||
                        c.items[i].row_id > b.items[9].row_id);
        }
        if (again < 10)
            jsd__sleep_ms(20);
    }
    ASSERT_EQ(again, 10);
    jsd__effect_batch_free(&a);
    jsd__effect_batch_free(&b);
    jsd__effect_batch_free(&c);

    /* Keyed heads take at most half of a full batch, unordered the rest. */
    ASSERT_OK(jsd_tx_begin(&tx, s));
    for (int i = 0; i < 6; i++) {
        char key[16];
        snprintf(id, sizeof(id), "k%d", i);
        snprintf(key, sizeof(key), "key-%d", i);
        jsd_effect ef = {.owner = "o", .id = id, .subject = "orders.k", .order_key = key};
        ASSERT_OK(jsd_tx_emit(tx, &ef));
        snprintf(id, sizeof(id), "u%d", i);
        jsd_effect eu = {.owner = "o", .id = id, .subject = "orders.u"};
        ASSERT_OK(jsd_tx_emit(tx, &eu));
    }
    ASSERT_OK(jsd_tx_commit(tx));
    jsd__effect_batch_init(&a);
    ASSERT_OK_E(jsd__store_claim(s, 4, 60000, "mixed", jsd__now_ms(), &a), jsd_store_errmsg(s));
    ASSERT_EQ(a.n, 4);
    int keyed = 0;
    for (size_t i = 0; i < a.n; i++) {
        keyed += a.items[i].order_key != NULL;
        if (i > 0)
            ASSERT_TRUE(a.items[i - 1].row_id < a.items[i].row_id);
    }
    ASSERT_EQ(keyed, 2);
    jsd__effect_batch_free(&a);
    jsd_store_close(s);
}

/* Receipts (stream seqs 40..) for the six of b into r, the first three
 * recorded: on either store they are one run, no outbox row holds them, and
 * the view shows them (b's ids start at the outbox's first). */
static void first_three_as_a_run(jsd_store *s, const jsd__effect_batch *b, jsd__receipt r[6],
                                 int64_t now)
{
    for (size_t i = 0; i < 6; i++)
        r[i] = (jsd__receipt){.row_id = b->items[i].row_id,
                              .stream = "ORDERS",
                              .seq = 40 + i,
                              .published_at_ms = now - 1000};
    size_t applied = 0;
    ASSERT_OK_E(jsd__store_record_receipts(s, "r1", r, 3, &applied), jsd_store_errmsg(s));
    ASSERT_EQ(applied, 3);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_outbox_runs"), 1);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_outbox WHERE published_at IS NOT NULL"), 0);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_outbox_state WHERE stream = 'ORDERS' AND "
                       "stream_seq = 40 + id - (SELECT min(id) FROM jsd_outbox) AND "
                       "published_at IS NOT NULL AND lease_token IS NULL"),
              3);
}

/* An id of effect_id in s's outbox. */
static int64_t id_of(jsd_store *s, const char *effect_id)
{
    char sql[160];
    snprintf(sql, sizeof(sql), "SELECT id FROM jsd_outbox WHERE effect_id = '%s'", effect_id);
    return q_i64(s, sql);
}

/* Claim everything due through s under token; receipts for all of it. */
static size_t claim_and_receipt(jsd_store *s, const char *token, uint64_t seq)
{
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    ASSERT_OK_E(jsd__store_claim(s, 100, 60000, token, jsd__now_ms(), &b), jsd_store_errmsg(s));
    jsd__receipt r[100];
    for (size_t i = 0; i < b.n; i++)
        r[i] = (jsd__receipt){.row_id = b.items[i].row_id,
                              .stream = "ORDERS",
                              .seq = seq + i,
                              .published_at_ms = jsd__now_ms()};
    size_t applied = 0, n = b.n;
    if (n)
        ASSERT_OK_E(jsd__store_record_receipts(s, token, r, n, &applied), jsd_store_errmsg(s));
    ASSERT_EQ(applied, n);
    jsd__effect_batch_free(&b);
    return n;
}

/* PostgreSQL (schema 9): the receipts of a relay's first attempts are one
 * row of jsd_outbox_runs and leave their outbox rows alone; the view and
 * the counts show them. The settled floor rises past runs and rows that are
 * not ready (a timer), stops at a ready row in flight and at an id whose
 * transaction is still open (its row, committed late, is claimed), passes
 * an id rolled back once the transactions open when it was seen have ended,
 * and comes down to a requeued or unpublished effect. Retention takes runs
 * with their rows. */
static void pg_receipts_as_runs_and_the_floor(void **state)
{
    (void)state;
    char url[512], v[64], id[16];
    assert_int_equal(jsd_fx_pg_database(url, sizeof(url)), 0);
    jsd_store *s = open_url(url);
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    for (int i = 0; i < 6; i++) {
        snprintf(id, sizeof(id), "e%d", i);
        jsd_effect ef = {.owner = "o", .id = id, .subject = "orders.x"};
        ASSERT_OK(jsd_tx_emit(tx, &ef));
    }
    jsd_effect timer = {.owner = "o",
                        .id = "timer",
                        .subject = "orders.x",
                        .not_before_ms = jsd__now_ms() + 3600000};
    ASSERT_OK(jsd_tx_emit(tx, &timer));
    ASSERT_OK(jsd_tx_commit(tx));
    int64_t e0 = id_of(s, "e0"), e3 = id_of(s, "e3"), tm = id_of(s, "timer");
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    int64_t now = jsd__now_ms();
    ASSERT_OK_E(jsd__store_claim(s, 10, 60000, "r1", now, &b), jsd_store_errmsg(s));
    ASSERT_EQ(b.n, 6);
    jsd__receipt r[6];
    size_t applied = 0;
    first_three_as_a_run(s, &b, r, now);
    ASSERT_EQ(b.items[0].row_id, e0);
    char sql[300];
    /* past the run, to the first ready row in flight */
    ASSERT_EQ(q_i64(s, "SELECT floor FROM jsd_outbox_floor"), e3);
    /* the same receipts again take nothing, nor does a release of them */
    ASSERT_OK(jsd__store_record_receipts(s, "r1", r, 3, &applied));
    ASSERT_EQ(applied, 0);
    size_t released = 9;
    ASSERT_OK(jsd__store_release(s, "r1", &r[0].row_id, 1, &released));
    ASSERT_EQ(released, 0);
    /* a takeover long after the lease leaves the published rows alone */
    jsd__effect_batch b2;
    jsd__effect_batch_init(&b2);
    ASSERT_OK_E(jsd__store_claim(s, 10, 60000, "late", now + 120000, &b2), jsd_store_errmsg(s));
    ASSERT_EQ(b2.n, 3);
    ASSERT_EQ(b2.items[0].row_id, e3);
    ASSERT_TRUE(b2.items[0].maybe_published);
    for (size_t i = 0; i < 3; i++)
        r[3 + i].seq = 50 + i;
    ASSERT_OK(jsd__store_record_receipts(s, "r1", &r[3], 3, &applied));
    ASSERT_EQ(applied, 0); /* the old holder's are refused */
    ASSERT_OK_E(jsd__store_record_receipts(s, "late", &r[3], 3, &applied), jsd_store_errmsg(s));
    ASSERT_EQ(applied, 3);
    jsd__effect_batch_free(&b2);
    /* past both runs and the timer, to the top */
    ASSERT_EQ(q_i64(s, "SELECT floor FROM jsd_outbox_floor"), tm + 1);
    jsd_store_stats st = stats(s);
    ASSERT_EQ(st.published, 6);
    ASSERT_EQ(st.backlog, 1); /* the timer */
    snprintf(sql, sizeof(sql), "SELECT stream_seq FROM jsd_outbox_state WHERE id = %lld",
             (long long)e3);
    ASSERT_EQ(q_i64(s, sql), 50);

    /* An id drawn by a transaction still open holds the floor; its row,
     * committed after a later one was published, is claimed. */
    PGconn *w = PQconnectdb(url);
    assert_int_equal(PQstatus(w), CONNECTION_OK);
    pg_text(w, "BEGIN; SELECT jsd_emit('o', 'slow', 'orders.x', 'p'::bytea)", v, sizeof(v));
    emit1(s, "o", "quick", "orders.x");
    int64_t quick = id_of(s, "quick");
    ASSERT_EQ(claim_and_receipt(s, "r2", 100), 1);
    ASSERT_EQ(q_i64(s, "SELECT floor FROM jsd_outbox_floor"), quick - 1);
    emit1(s, "o", "quick2", "orders.x"); /* a second walk while it is open */
    ASSERT_EQ(claim_and_receipt(s, "r2", 150), 1);
    ASSERT_EQ(q_i64(s, "SELECT floor FROM jsd_outbox_floor"), quick - 1);
    PQclear(PQexec(w, "COMMIT"));
    ASSERT_EQ(claim_and_receipt(s, "r3", 200), 1);
    ASSERT_EQ(id_of(s, "slow"), quick - 1);
    ASSERT_EQ(q_i64(s, "SELECT floor FROM jsd_outbox_floor"), quick + 2);
    /* One rolled back: passed once the transactions that wrote the outbox
     * when the walk met it have ended (the floor's next walk after that);
     * a long transaction that only reads does not hold it. */
    PGconn *reader = PQconnectdb(url);
    assert_int_equal(PQstatus(reader), CONNECTION_OK);
    pg_text(reader, "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM jsd_outbox", v,
            sizeof(v));
    pg_text(w, "BEGIN; SELECT jsd_emit('o', 'undone', 'orders.x', 'p'::bytea)", v, sizeof(v));
    emit1(s, "o", "after", "orders.x");
    int64_t after = id_of(s, "after");
    ASSERT_EQ(claim_and_receipt(s, "r4", 300), 1);
    ASSERT_EQ(q_i64(s, "SELECT floor FROM jsd_outbox_floor"), after - 1);
    PQclear(PQexec(w, "ROLLBACK"));
    emit1(s, "o", "next", "orders.x");
    ASSERT_EQ(claim_and_receipt(s, "r5", 400), 1);
    ASSERT_EQ(q_i64(s, "SELECT floor FROM jsd_outbox_floor"), id_of(s, "next") + 1);
    PQfinish(reader);
    PQfinish(w);

    /* A dead letter requeued and an effect unpublished come back below the
     * floor, and are claimed again. */
    emit1(s, "o", "dead", "orders.x");
    jsd__effect_batch_clear(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "r6", jsd__now_ms(), &b));
    ASSERT_EQ(b.n, 1);
    jsd__failure f = {.row_id = b.items[0].row_id, .error = "x", .dead_letter_now = true};
    size_t dead = 0;
    ASSERT_OK(jsd__store_record_failures(s, "r6", &f, 1, NULL, 0, jsd__now_ms(), &applied, &dead));
    ASSERT_EQ(dead, 1);
    emit1(s, "o", "more", "orders.x");
    ASSERT_EQ(claim_and_receipt(s, "r7", 500), 1); /* the floor passes the dead letter */
    int64_t top = q_i64(s, "SELECT floor FROM jsd_outbox_floor");
    ASSERT_TRUE(top > b.items[0].row_id);
    size_t requeued = 0;
    ASSERT_OK(jsd__store_requeue_dead(s, &f.row_id, 1, jsd__now_ms(), &requeued));
    ASSERT_EQ(requeued, 1);
    ASSERT_EQ(q_i64(s, "SELECT floor FROM jsd_outbox_floor"), f.row_id);
    jsd__effect_batch_clear(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "r8", jsd__now_ms(), &b));
    ASSERT_EQ(b.n, 1);
    ASSERT_EQ(b.items[0].row_id, f.row_id);
    ASSERT_OK(jsd__store_release(s, "r8", &f.row_id, 1, &released));
    jsd__unpublish un = {.row_id = e0 + 1, .stream = "ORDERS", .seq = 41, .why = "lost"};
    size_t done = 0;
    ASSERT_OK_E(jsd__store_unpublish(s, &un, 1, jsd__now_ms(), &done), jsd_store_errmsg(s));
    ASSERT_EQ(done, 1);
    ASSERT_EQ(q_i64(s, "SELECT floor FROM jsd_outbox_floor"), e0 + 1);
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM jsd_outbox_runs WHERE lo <= %lld AND hi >= %lld",
             (long long)e0 + 1, (long long)e0 + 1);
    ASSERT_EQ(q_i64(s, sql), 0);
    snprintf(sql, sizeof(sql), "SELECT stream_seq FROM jsd_outbox_state WHERE id = %lld",
             (long long)e0 + 2);
    ASSERT_EQ(q_i64(s, sql), 42); /* the run's rest keeps its numbers */
    jsd__effect_batch_clear(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "r9", jsd__now_ms(), &b));
    ASSERT_EQ(b.n, 2);
    ASSERT_EQ(b.items[0].row_id, e0 + 1);
    ASSERT_TRUE(b.items[0].maybe_published);
    ASSERT_EQ(b.items[1].row_id, f.row_id);
    jsd__effect_batch_free(&b);

    /* retention: runs go with their rows (whole and cut short) */
    int64_t k = 0, before = stats(s).published;
    ASSERT_OK(jsd__store_gc_step(s, jsd__now_ms() + 1, 2, &k));
    ASSERT_EQ(k, 2);
    ASSERT_EQ(stats(s).published, before - 2);
    ASSERT_OK(jsd_store_gc(s, 0, 100, &k));
    ASSERT_EQ(stats(s).published, 0);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_outbox_runs"), 0);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_outbox WHERE effect_id IN ('e0', 'e2', 'e5')"), 0);
    jsd_store_close(s);
}

/* The library's session settings (postgres.c, session_setup) hold on s's
 * connection: JIT off (a generic plan's cost estimate on a large outbox
 * made PostgreSQL compile each receipt statement for over 100 ms) and
 * notices below warning unsent. */
static void session_settings_hold(jsd_store *s)
{
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    PGconn *c = jsd_tx_pg(tx);
    ASSERT_TRUE(c != NULL);
    char v[64];
    pg_text(c, "SHOW jit", v, sizeof(v));
    assert_string_equal(v, "off");
    pg_text(c, "SHOW client_min_messages", v, sizeof(v));
    assert_string_equal(v, "warning");
    jsd_tx_rollback(tx);
}

static void pg_reconnects_after_connection_loss(void **state)
{
    (void)state;
    char url[512];
    assert_int_equal(jsd_fx_pg_database(url, sizeof(url)), 0);
    jsd_store *s = open_url(url);
    session_settings_hold(s);
    emit1(s, "o", "before", "orders.x");
    bool woken = false;
    ASSERT_OK(jsd__store_wait_wakeup(s, 0, &woken)); /* LISTEN on this connection */
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    int pid = PQbackendPID(jsd_tx_pg(tx));
    jsd_tx_rollback(tx);
    PGconn *admin = PQconnectdb(url);
    char sql[96];
    snprintf(sql, sizeof(sql), "SELECT pg_terminate_backend(%d)", pid);
    PGresult *r = PQexec(admin, sql);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    PQclear(r);
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    /* The first operation may meet the dead connection: a clear error, never a crash. */
    jsd_status rc = jsd__store_claim(s, 10, 1000, "t", jsd__now_ms(), &b);
    if (rc != JSD_OK) {
        ASSERT_STATUS(rc, JSD_ERR_CONNECT);
        ASSERT_CONTAINS(jsd_store_errmsg(s), "SQLSTATE");
        ASSERT_OK_E(jsd__store_claim(s, 10, 1000, "t", jsd__now_ms(), &b), jsd_store_errmsg(s));
    }
    ASSERT_EQ(b.n, 1);
    /* The new session has the library's settings again. */
    session_settings_hold(s);
    /* Wake-ups work again: LISTEN is renewed on the new connection. */
    jsd_store *app = open_url(url);
    ASSERT_OK(jsd__store_wait_wakeup(s, 0, &woken));
    emit1(app, "o", "after", "orders.x");
    ASSERT_OK(jsd__store_wait_wakeup(s, 30000, &woken));
    assert_true(woken);
    jsd__effect_batch_free(&b);
    PQfinish(admin);
    jsd_store_close(app);
    jsd_store_close(s);
}

/* The state of session pid as another session sees it. */
static void session_state(PGconn *admin, int pid, char *out, size_t cap)
{
    char sql[128];
    snprintf(sql, sizeof(sql), "SELECT state FROM pg_stat_activity WHERE pid = %d", pid);
    pg_text(admin, sql, out, cap);
}

/* jsd_tx_begin sends nothing on PostgreSQL: BEGIN goes in one pipeline with
 * the transaction's first statement (postgres.c, "deferred BEGIN"). What the
 * transaction does is unchanged: the first statement already runs inside
 * it, a rollback takes everything back, the application's own SQL on
 * jsd_tx_pg runs inside it, and a transaction in which nothing ran commits
 * without a word to the server. A connection lost before the first
 * statement shows in that statement's status, and the next one reconnects. */
static void pg_begin_goes_with_the_first_statement(void **state)
{
    (void)state;
    char url[512], st[64];
    assert_int_equal(jsd_fx_pg_database(url, sizeof(url)), 0);
    jsd_store *s = open_url(url);
    app_sql(s, "CREATE TABLE app_orders (id TEXT PRIMARY KEY)");
    PGconn *admin = PQconnectdb(url);
    assert_int_equal(PQstatus(admin), CONNECTION_OK);
    int pid = PQbackendPID(jsd__pg_handle(s)); /* no transaction open: sends nothing */

    /* begin: nothing sent; the first statement opens the transaction */
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    session_state(admin, pid, st, sizeof(st));
    ASSERT_STREQ(st, "idle");
    jsd_effect e = {.owner = "o", .id = "d1", .subject = "orders.x", .payload = "p", .len = 1};
    ASSERT_OK_E(jsd_tx_emit(tx, &e), jsd_store_errmsg(s));
    session_state(admin, pid, st, sizeof(st));
    ASSERT_STREQ(st, "idle in transaction");
    tx_sql(tx, "INSERT INTO app_orders VALUES ('a1')");
    jsd_tx_rollback(tx);
    ASSERT_EQ(stats(s).backlog, 0);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM app_orders"), 0);

    /* the same, committed: both rows, and a duplicate emit as the first
     * statement leaves the transaction usable */
    emit1(s, "o", "d2", "orders.x");
    ASSERT_OK(jsd_tx_begin(&tx, s));
    jsd_effect dup = {.owner = "o", .id = "d2", .subject = "orders.x", .payload = "p", .len = 1};
    ASSERT_STATUS(jsd_tx_emit(tx, &dup), JSD_ERR_EXISTS);
    ASSERT_OK_E(jsd_tx_emit(tx, &e), jsd_store_errmsg(s));
    tx_sql(tx, "INSERT INTO app_orders VALUES ('a1')");
    ASSERT_OK_E(jsd_tx_commit(tx), jsd_store_errmsg(s));
    ASSERT_EQ(stats(s).backlog, 2);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM app_orders"), 1);

    /* the application's SQL first: jsd_tx_pg sends the BEGIN */
    ASSERT_OK(jsd_tx_begin(&tx, s));
    tx_sql(tx, "INSERT INTO app_orders VALUES ('a2')");
    session_state(admin, pid, st, sizeof(st));
    ASSERT_STREQ(st, "idle in transaction");
    jsd_tx_rollback(tx);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM app_orders"), 1);

    /* nothing ran: commit and rollback without a round trip, session idle */
    ASSERT_OK(jsd_tx_begin(&tx, s));
    ASSERT_OK_E(jsd_tx_commit(tx), jsd_store_errmsg(s));
    ASSERT_OK(jsd_tx_begin(&tx, s));
    jsd_tx_rollback(tx);
    session_state(admin, pid, st, sizeof(st));
    ASSERT_STREQ(st, "idle");

    /* the session is gone before the first statement: the emit says so,
     * nothing is committed, and the next transaction reconnects */
    ASSERT_OK(jsd_tx_begin(&tx, s));
    char sql[96];
    snprintf(sql, sizeof(sql), "SELECT pg_terminate_backend(%d)::text", pid);
    pg_text(admin, sql, st, sizeof(st));
    ASSERT_STREQ(st, "true");
    jsd_effect lost = {.owner = "o", .id = "d3", .subject = "orders.x", .payload = "p", .len = 1};
    ASSERT_STATUS(jsd_tx_emit(tx, &lost), JSD_ERR_CONNECT);
    ASSERT_CONTAINS(jsd_store_errmsg(s), "connection to PostgreSQL is lost");
    jsd_tx_rollback(tx);
    emit1(s, "o", "d4", "orders.x");
    ASSERT_EQ(stats(s).backlog, 3);
    /* and then jsd_tx_pg gives no handle whose statements would run
     * outside the transaction */
    pid = PQbackendPID(jsd__pg_handle(s));
    ASSERT_OK(jsd_tx_begin(&tx, s));
    snprintf(sql, sizeof(sql), "SELECT pg_terminate_backend(%d)::text", pid);
    pg_text(admin, sql, st, sizeof(st));
    ASSERT_STREQ(st, "true");
    assert_null(jsd_tx_pg(tx));
    ASSERT_CONTAINS(jsd_store_errmsg(s), "BEGIN failed");
    jsd_tx_rollback(tx);
    emit1(s, "o", "d5", "orders.x");
    ASSERT_EQ(stats(s).backlog, 4);
    PQfinish(admin);
    jsd_store_close(s);
}

/* Options: a smaller payload cap, and the SQLite busy timeout: a writer that
 * waits past it gets JSD_ERR_BUSY, and loses nothing. */
static void sqlite_options_payload_cap_and_busy(void **state)
{
    (void)state;
    char url[512];
    jsd_fx_sqlite_url(url, sizeof(url));
    jsd_store_opts o;
    jsd_store_opts_init(&o);
    o.url = url;
    o.payload_max = 10;
    o.busy_timeout_ms = 100;
    jsd_store *a = NULL, *b = NULL;
    jsd_error e;
    ASSERT_OK_E(jsd_store_open_opts(&a, &o, &e), e.msg);
    ASSERT_OK_E(jsd_store_open_opts(&b, &o, &e), e.msg);
    jsd_tx *ta, *tb;
    ASSERT_OK(jsd_tx_begin(&ta, a));
    jsd_effect big = {.id = "big", .subject = "a.b", .payload = "01234567890", .len = 11};
    ASSERT_STATUS(jsd_tx_emit(ta, &big), JSD_ERR_LIMIT);
    ASSERT_CONTAINS(jsd_store_errmsg(a), "limit is 10");
    big.len = 10;
    ASSERT_OK(jsd_tx_emit(ta, &big));
    /* a holds the write lock: b waits 100 ms, then is told so. */
    ASSERT_STATUS(jsd_tx_begin(&tb, b), JSD_ERR_BUSY);
    ASSERT_CONTAINS(jsd_store_errmsg(b), "busy timeout");
    ASSERT_EQ(jsd_store_error(b)->sqlite_code, SQLITE_BUSY);
    ASSERT_OK(jsd_tx_commit(ta));
    ASSERT_OK(jsd_tx_begin(&tb, b));
    jsd_effect small = {.id = "small", .subject = "a.b"};
    ASSERT_OK(jsd_tx_emit(tb, &small));
    ASSERT_OK(jsd_tx_commit(tb));
    ASSERT_EQ(stats(a).backlog, 2);
    o.busy_timeout_ms = -1;
    jsd_store *c = NULL;
    ASSERT_STATUS(jsd_store_open_opts(&c, &o, &e), JSD_ERR_CONFIG);
    /* payload_max: the relay's cap at most */
    o.busy_timeout_ms = 100;
    o.payload_max = JSD_PAYLOAD_DEFAULT_CAP + 1;
    ASSERT_STATUS(jsd_store_open_opts(&c, &o, &e), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(e.msg, "payload_max 262145 bytes is over 262144");
    o.payload_max = JSD_PAYLOAD_DEFAULT_CAP;
    ASSERT_OK_E(jsd_store_open_opts(&c, &o, &e), e.msg);
    jsd_store_close(c);
    jsd_store_close(a);
    jsd_store_close(b);
}

/* Write transactions of one process on one SQLite file take turns in the
 * order they asked (the writer turn, src/store/sqlite.c). With a's
 * transaction open, b and then c ask; a, beginning again right after its
 * commit, comes after both. Without the turn SQLite's lock goes to whoever
 * asks first after a release: b and c poll for it, so a, which asks at once,
 * took it back. */
typedef struct turn_arg {
    jsd_store *s;
    const char *name;
    jsd_status rc;
} turn_arg;

static pthread_mutex_t turn_order_mu = PTHREAD_MUTEX_INITIALIZER;
static char turn_order[8];

static void turn_record(const char *name)
{
    pthread_mutex_lock(&turn_order_mu);
    strncat(turn_order, name, sizeof(turn_order) - strlen(turn_order) - 1);
    pthread_mutex_unlock(&turn_order_mu);
}

static void *turn_writer(void *p)
{
    turn_arg *a = p;
    jsd_tx *tx = NULL;
    if ((a->rc = jsd_tx_begin(&tx, a->s)) != JSD_OK)
        return NULL;
    turn_record(a->name);
    a->rc = jsd_tx_commit(tx);
    return NULL;
}

static void sqlite_writers_take_turns(void **state)
{
    (void)state;
    char url[512];
    jsd_fx_sqlite_url(url, sizeof(url));
    jsd_store *a = open_url(url), *b = open_url(url), *c = open_url(url);
    turn_order[0] = '\0';
    jsd_tx *ta = NULL;
    ASSERT_OK(jsd_tx_begin(&ta, a));
    ASSERT_EQ(jsd__sqlite_turn_waiting(a), 0);
    turn_arg tb = {.s = b, .name = "b"}, tc = {.s = c, .name = "c"};
    pthread_t thb, thc;
    ASSERT_EQ(pthread_create(&thb, NULL, turn_writer, &tb), 0);
    ASSERT_WAIT(jsd__sqlite_turn_waiting(a) == 1, 5000);
    ASSERT_EQ(pthread_create(&thc, NULL, turn_writer, &tc), 0);
    ASSERT_WAIT(jsd__sqlite_turn_waiting(a) == 2, 5000);
    ASSERT_OK(jsd_tx_commit(ta));
    ASSERT_OK(jsd_tx_begin(&ta, a));
    turn_record("a");
    ASSERT_OK(jsd_tx_commit(ta));
    pthread_join(thb, NULL);
    pthread_join(thc, NULL);
    ASSERT_OK(tb.rc);
    ASSERT_OK(tc.rc);
    ASSERT_STREQ(turn_order, "bca");
    ASSERT_EQ(jsd__sqlite_turn_waiting(a), 0);
    /* a transaction ended by closing its store passes the turn on too */
    ASSERT_OK(jsd_tx_begin(&ta, a));
    turn_arg tb2 = {.s = b, .name = "b"};
    ASSERT_EQ(pthread_create(&thb, NULL, turn_writer, &tb2), 0);
    ASSERT_WAIT(jsd__sqlite_turn_waiting(b) == 1, 5000);
    jsd_store_close(a);
    pthread_join(thb, NULL);
    ASSERT_OK(tb2.rc);
    jsd_store_close(b);
    jsd_store_close(c);
}

/* Write transactions of two processes on one SQLite file (the turn across
 * processes, src/store/xturn.c): a connection that waits for the write lock
 * says so on the turn file beside the database, drops it once its BEGIN
 * returns, and a connection about to begin lets such a waiter go first, for
 * a bounded time. The other process is stood in for twice, and what is
 * claimed is the protocol only: a raw SQLite connection holds the write
 * lock, as another process's transaction would (the library's turn within
 * this process does not know it), and this test's own OFD lock on the turn
 * file says a connection waits, as another process's waiter would. The
 * effect on commit -> PubAck latency is bench_relay's relay.latency.xproc. */
static short turn_file_lock(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    short t = fcntl(fd, F_OFD_GETLK, &fl) == 0 ? fl.l_type : -1;
    close(fd);
    return t;
}

static void sqlite_writers_of_two_processes_take_turns(void **state)
{
    (void)state;
    char url[512], turn[600];
    jsd_fx_sqlite_url(url, sizeof(url));
    jsd_store *a = open_url(url);
    snprintf(turn, sizeof(turn), "%s-jsdturn", url + 7);
    ASSERT_EQ(turn_file_lock(turn), F_UNLCK); /* made at open, nobody waits */
    sqlite3 *raw = NULL;
    ASSERT_EQ(sqlite3_open(url + 7, &raw), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(raw, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    turn_arg ta = {.s = a, .name = "a"};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, turn_writer, &ta), 0);
    /* a's BEGIN finds the lock held: it says it waits */
    ASSERT_WAIT(turn_file_lock(turn) == F_RDLCK, 5000);
    ASSERT_EQ(sqlite3_exec(raw, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    pthread_join(th, NULL);
    ASSERT_OK(ta.rc);
    ASSERT_EQ(turn_file_lock(turn), F_UNLCK); /* and no longer once it began */
    int64_t deaf = -1;
    ASSERT_EQ(jsd__sqlite_xturn_yields(a, &deaf), 0);
    ASSERT_EQ(deaf, 0);
    /* a waiter of another process: a's next begin lets it go first; one
     * that never goes costs a bounded wait, not a hang, after which a does
     * not look for a second */
    int fd = open(turn, O_RDONLY | O_CLOEXEC);
    ASSERT_TRUE(fd >= 0);
    struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    ASSERT_EQ(fcntl(fd, F_OFD_SETLK, &fl), 0);
    jsd_tx *tx = NULL;
    ASSERT_OK(jsd_tx_begin(&tx, a));
    ASSERT_OK(jsd_tx_commit(tx));
    ASSERT_EQ(jsd__sqlite_xturn_yields(a, &deaf), 1);
    ASSERT_TRUE(deaf > 0);
    if (jsd__mono_us() + 500000 < deaf) { /* else the machine stalled past it */
        ASSERT_OK(jsd_tx_begin(&tx, a));
        ASSERT_OK(jsd_tx_commit(tx));
        ASSERT_EQ(jsd__sqlite_xturn_yields(a, NULL), 1);
    }
    close(fd); /* it went */
    sqlite3_close(raw);
    jsd_store_close(a);
}

/* A store whose turn file cannot be opened (here a folder has its name)
 * works as before the turn across processes, and says so once per file and
 * process at warn, not once per connection. */
static int turn_warnings;

static void turn_log_sink(jsd_log_level level, const char *component, const char *line, void *user)
{
    (void)user;
    if (level == JSD_LOG_WARN && strcmp(component, "store") == 0 && strstr(line, "-jsdturn") &&
        strstr(line, "cannot be opened (Is a directory)"))
        turn_warnings++;
}

static void sqlite_turn_file_unusable_is_said_once(void **state)
{
    (void)state;
    char url[512], turn[600];
    jsd_fx_sqlite_url(url, sizeof(url));
    snprintf(turn, sizeof(turn), "%s-jsdturn", url + 7);
    ASSERT_EQ(mkdir(turn, 0700), 0);
    turn_warnings = 0;
    jsd_log_configure(JSD_LOG_WARN, JSD_LOG_TEXT, turn_log_sink, NULL);
    jsd_store *a = open_url(url), *b = open_url(url);
    jsd_log_configure(JSD_LOG_WARN, JSD_LOG_TEXT, NULL, NULL);
    ASSERT_EQ(turn_warnings, 1);
    jsd_tx *tx = NULL;
    ASSERT_OK(jsd_tx_begin(&tx, a));
    ASSERT_OK(jsd_tx_commit(tx));
    ASSERT_OK(jsd_tx_begin(&tx, b));
    ASSERT_OK(jsd_tx_commit(tx));
    ASSERT_EQ(jsd__sqlite_xturn_yields(a, NULL), 0);
    jsd_store_close(a);
    jsd_store_close(b);
}

/* The store's settings on SQLite: WAL, synchronous=FULL, foreign keys, and
 * 8 KiB pages for a database it creates. */
/* A fresh SQLite store with six unordered effects prefix0..prefix5, all
 * claimed under token into b at *now (after the inserts), and, when
 * timer_ms > 0, a durable timer "timer" due that long after them. */
static jsd_store *sqlite_six_claimed(const char *prefix, const char *token, int64_t timer_ms,
                                     int64_t *now, jsd__effect_batch *b)
{
    char url[512], id[16];
    jsd_fx_sqlite_url(url, sizeof(url));
    jsd_store *s = open_url(url);
    for (int i = 0; i < 6; i++) {
        snprintf(id, sizeof(id), "%s%d", prefix, i);
        emit_key(s, id, NULL, 0);
    }
    if (timer_ms > 0)
        emit_key(s, "timer", NULL, jsd__now_ms() + timer_ms);
    *now = jsd__now_ms();
    jsd__effect_batch_init(b);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, token, *now, b));
    ASSERT_EQ(b->n, 6);
    return s;
}

/* SQLite (schema 8): the receipts of a range's first attempts are one row
 * of jsd_outbox_runs and leave their outbox rows alone; the view shows them.
 * The settled floor rises past runs and live ranges, comes down to a row
 * released from a range (which is claimed again), never counts a timer,
 * and retention takes runs with their rows but keeps the newest row. */
static void sqlite_receipts_as_runs_and_the_floor(void **state)
{
    (void)state;
    int64_t now = 0;
    jsd__effect_batch b;
    jsd_store *s = sqlite_six_claimed("u", "r1", 3600 * 1000, &now, &b);
    int64_t u5 = b.items[5].row_id;
    jsd__receipt r[6];
    size_t applied = 0;
    first_three_as_a_run(s, &b, r, now);
    /* past the run, then past the live range holding u3..u5 */
    ASSERT_EQ(q_i64(s, "SELECT floor FROM jsd_outbox_floor"), u5 + 1);
    /* the same receipts again take nothing */
    ASSERT_OK(jsd__store_record_receipts(s, "r1", r, 3, &applied));
    ASSERT_EQ(applied, 0);
    size_t released = 0;
    ASSERT_OK(jsd__store_release(s, "r1", &r[3].row_id, 1, &released));
    ASSERT_EQ(released, 1);
    ASSERT_EQ(q_i64(s, "SELECT floor FROM jsd_outbox_floor"), r[3].row_id);
    /* while its range lasts, a claim neither takes the released row nor
     * lets the floor pass it */
    jsd__effect_batch b2;
    jsd__effect_batch_init(&b2);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "rx", now, &b2));
    ASSERT_EQ(b2.n, 0);
    jsd__effect_batch_free(&b2);
    ASSERT_EQ(q_i64(s, "SELECT floor FROM jsd_outbox_floor"), r[3].row_id);
    ASSERT_OK(jsd__store_record_receipts(s, "r1", &r[4], 2, &applied));
    ASSERT_EQ(applied, 2);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_outbox_lease"), 0);
    ASSERT_EQ(q_i64(s, "SELECT floor FROM jsd_outbox_floor"), r[3].row_id);
    jsd_store_stats st = stats(s);
    ASSERT_EQ(st.published, 5);
    ASSERT_EQ(st.backlog, 2); /* u3 and the timer */
    /* the released row is claimed again; the timer is not due */
    jsd__effect_batch_clear(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "r2", now, &b));
    ASSERT_EQ(b.n, 1);
    ASSERT_EQ(b.items[0].row_id, r[3].row_id);
    r[3].seq = 60;
    ASSERT_OK(jsd__store_record_receipts(s, "r2", &r[3], 1, &applied));
    ASSERT_EQ(applied, 1);
    ASSERT_EQ(q_i64(s, "SELECT floor FROM jsd_outbox_floor"), u5 + 1);
    st = stats(s);
    ASSERT_EQ(st.published, 6);
    ASSERT_EQ(st.backlog, 1);
    char sql[160];
    snprintf(sql, sizeof(sql), "SELECT stream_seq FROM jsd_outbox_state WHERE id = %lld",
             (long long)r[3].row_id);
    ASSERT_EQ(q_i64(s, sql), 60);
    /* retention: every published row and its runs go; the newest row (the
     * timer) stays, and so do ids */
    int64_t k = 0;
    ASSERT_OK(jsd_store_gc(s, 0, 100, &k));
    ASSERT_EQ(k, 6);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_outbox_runs"), 0);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_outbox"), 1);
    emit_key(s, "late", NULL, 0);
    snprintf(sql, sizeof(sql), "SELECT id > %lld FROM jsd_outbox WHERE effect_id = 'late'",
             (long long)u5);
    ASSERT_EQ(q_i64(s, sql), 1);
    jsd__effect_batch_clear(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "r3", jsd__now_ms(), &b));
    ASSERT_EQ(b.n, 1);
    ASSERT_STREQ(b.items[0].effect_id, "late");
    jsd__effect_batch_free(&b);
    jsd_store_close(s);
}

/* SQLite (schema 8): a range taken over after some of its receipts went
 * into a run gives back only the rest, marked maybe published; the floor
 * comes down to the range and rises past the run again. */
static void sqlite_takeover_of_a_range_partly_in_runs(void **state)
{
    (void)state;
    int64_t now = 0;
    jsd__effect_batch b;
    jsd_store *s = sqlite_six_claimed("t", "dead", 0, &now, &b);
    jsd__receipt r[3];
    for (size_t i = 0; i < 3; i++)
        r[i] = (jsd__receipt){
            .row_id = b.items[i].row_id, .stream = "ORDERS", .seq = 1 + i, .published_at_ms = now};
    size_t applied = 0;
    ASSERT_OK(jsd__store_record_receipts(s, "dead", r, 3, &applied));
    ASSERT_EQ(applied, 3);
    int64_t first_left = b.items[3].row_id;
    /* its relay died: a minute later another claim takes the range over */
    jsd__effect_batch_clear(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 60000, "next", now + 61000, &b));
    ASSERT_EQ(b.n, 3);
    for (size_t i = 0; i < 3; i++) {
        ASSERT_EQ(b.items[i].row_id, first_left + (int64_t)i);
        ASSERT_TRUE(b.items[i].maybe_published);
    }
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_outbox_state WHERE published_at IS NOT NULL "
                       "AND duplicate = 0"),
              3);
    /* down to the range taken over, up past its run again: at the rows it
     * gave back */
    ASSERT_EQ(q_i64(s, "SELECT floor FROM jsd_outbox_floor"), first_left);
    /* the dead relay's late receipts are refused */
    jsd__receipt late = {
        .row_id = first_left, .stream = "ORDERS", .seq = 9, .published_at_ms = now};
    ASSERT_OK(jsd__store_record_receipts(s, "dead", &late, 1, &applied));
    ASSERT_EQ(applied, 0);
    jsd__effect_batch_free(&b);
    jsd_store_close(s);
}

static void sqlite_settings(void **state)
{
    (void)state;
    char url[512];
    jsd_fx_sqlite_url(url, sizeof(url));
    jsd_store *s = open_url(url);
    char mode[32];
    q_text(s, "PRAGMA journal_mode", mode, sizeof(mode));
    ASSERT_STREQ(mode, "wal");
    ASSERT_EQ(q_i64(s, "PRAGMA page_size"), 8192);
    ASSERT_EQ(q_i64(s, "PRAGMA synchronous"), 2); /* FULL */
    ASSERT_EQ(q_i64(s, "PRAGMA foreign_keys"), 1);
    ASSERT_EQ(jsd_store_backend_of(s), JSD_STORE_SQLITE);
    jsd_store_close(s);
    /* A plain path works too, and reopening applies no migration twice. */
    s = open_url(url + 7);
    ASSERT_EQ(q_i64(s, "SELECT count(*) FROM jsd_schema_version"), JSD__SCHEMA_VERSION);
    /* One transaction at a time per store. */
    jsd_tx *tx, *tx2;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    ASSERT_STATUS(jsd_tx_begin(&tx2, s), JSD_ERR_INVALID);
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    ASSERT_STATUS(jsd__store_claim(s, 1, 1000, "t", 0, &b), JSD_ERR_INVALID);
    assert_null(jsd_tx_pg(tx));
    jsd_tx_rollback(tx);
    jsd_store_close(s);
    jsd_store_close(NULL);
}

/* The ids jsd_outbox_list gives for q, every page (limit 2) in turn, into ids. */
static size_t list_ids(jsd_store *s, jsd_outbox_state st, const char *subject, int64_t *ids,
                       size_t cap)
{
    jsd_outbox_entry page[2];
    jsd_outbox_query q = {.state = st, .subject = subject, .limit = 2};
    size_t n = 0, total = 0;
    do {
        ASSERT_OK_E(jsd_outbox_list(s, &q, page, &n), jsd_store_errmsg(s));
        for (size_t i = 0; i < n && total < cap; i++) {
            ASSERT_TRUE(total == 0 || page[i].row_id > ids[total - 1]);
            ids[total++] = page[i].row_id;
        }
        if (n)
            q.after_row_id = page[n - 1].row_id;
    } while (n == q.limit);
    return total;
}

/* Pending and unpublished effects are listed whatever kind of row they are
 * (first attempts in flight or released, a durable timer, a keyed effect,
 * a retry; with a dead letter for unpublished), in id order and page by
 * page, and published ones are not, their receipts in a run (each kind is
 * read through its own index, not the view). The doctor's pending subjects
 * read the same. */
static void pending_lists_every_kind(void **state)
{
    char url[512];
    jsd_store *s = open_new(state, url, sizeof(url));
    const char *names[] = {"e0", "e1", "e2", "e3"};
    for (int i = 0; i < 4; i++)
        emit1(s, "o", names[i], "orders.x");
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    jsd_effect timer = {.owner = "o",
                        .id = "timer",
                        .subject = "timers.x",
                        .not_before_ms = jsd__now_ms() + 3600000};
    ASSERT_OK(jsd_tx_emit(tx, &timer));
    jsd_effect keyed = {.owner = "o", .id = "k1", .subject = "orders.x", .order_key = "K"};
    ASSERT_OK(jsd_tx_emit(tx, &keyed));
    ASSERT_OK(jsd_tx_commit(tx));
    emit1(s, "o", "retry", "orders.x");
    emit1(s, "o", "dead", "orders.x");
    int64_t e0 = id_of(s, "e0"), e2 = id_of(s, "e2"), e3 = id_of(s, "e3"), tm = id_of(s, "timer"),
            k1 = id_of(s, "k1"), re = id_of(s, "retry"), dd = id_of(s, "dead");

    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    int64_t now = jsd__now_ms();
    ASSERT_OK_E(jsd__store_claim(s, 10, 60000, "t", now, &b), jsd_store_errmsg(s));
    ASSERT_EQ(b.n, 7); /* all but the timer */
    jsd__receipt r[2];
    for (int i = 0; i < 2; i++)
        r[i] = (jsd__receipt){
            .row_id = e0 + i, .stream = "ORDERS", .seq = 1 + (uint64_t)i, .published_at_ms = now};
    size_t applied = 0, dead = 0, released = 0;
    ASSERT_OK_E(jsd__store_record_receipts(s, "t", r, 2, &applied), jsd_store_errmsg(s));
    ASSERT_EQ(applied, 2);
    jsd__failure f[2] = {{.row_id = re, .error = "try again"},
                         {.row_id = dd, .error = "refused", .dead_letter_now = true}};
    ASSERT_OK_E(jsd__store_record_failures(s, "t", f, 2, NULL, 0, now, &applied, &dead),
                jsd_store_errmsg(s));
    ASSERT_EQ(dead, 1);
    ASSERT_OK(jsd__store_release(s, "t", &e3, 1, &released));
    ASSERT_EQ(released, 1);
    jsd__effect_batch_free(&b);

    /* SQLite's floor passes rows that a live range lease holds: e2 is
     * listed through its lease */
    if (BE(state) == BE_SQLITE)
        ASSERT_TRUE(q_i64(s, "SELECT floor FROM jsd_outbox_floor") > e2);
    int64_t ids[16];
    ASSERT_SIZE_EQ(list_ids(s, JSD_OUTBOX_PENDING, NULL, ids, 16), 5);
    int64_t want[6] = {e2, e3, tm, k1, re, dd};
    for (int i = 0; i < 5; i++)
        ASSERT_EQ(ids[i], want[i]);
    ASSERT_SIZE_EQ(list_ids(s, JSD_OUTBOX_UNPUBLISHED, NULL, ids, 16), 6);
    for (int i = 0; i < 6; i++)
        ASSERT_EQ(ids[i], want[i]);
    ASSERT_SIZE_EQ(list_ids(s, JSD_OUTBOX_DEAD, NULL, ids, 16), 1);
    ASSERT_EQ(ids[0], dd);
    ASSERT_SIZE_EQ(list_ids(s, JSD_OUTBOX_PENDING, "timers.x", ids, 16), 1);
    ASSERT_EQ(ids[0], tm);
    ASSERT_SIZE_EQ(list_ids(s, JSD_OUTBOX_PUBLISHED, NULL, ids, 16), 2);
    ASSERT_EQ(ids[0], e0);
    ASSERT_EQ(ids[1], e0 + 1);

    char **subjects = NULL;
    size_t n = 0;
    jsd_error err;
    ASSERT_OK(jsd__doctor_outbox_subjects(s, 8, &subjects, &n, &err));
    ASSERT_SIZE_EQ(n, 2);
    bool orders = false, timers = false;
    for (size_t i = 0; i < n; i++) {
        orders |= !strcmp(subjects[i], "orders.x");
        timers |= !strcmp(subjects[i], "timers.x");
        jsd__free(subjects[i]);
    }
    jsd__free(subjects);
    ASSERT_TRUE(orders && timers);
    jsd_store_close(s);
}

JSD_TEST_MAIN(BOTH(atomic_commit_and_rollback), BOTH(crash_before_commit_leaves_nothing),
              BOTH(duplicate_effect_identity), BOTH(limits_are_enforced),
              BOTH(claim_returns_effects_in_order), BOTH(not_before_delays_claims),
              BOTH(unsynced_receipts_are_committed_then_synced),
              BOTH(order_key_holds_back_later_effects),
              BOTH(receipts_for_a_range_and_a_keyed_row_inside_it),
              BOTH(receipt_runs_keep_each_rows_values), BOTH(receipts_leave_the_row_between_them),
              BOTH(expired_lease_takeover), BOTH(two_processes_never_share_an_effect),
              BOTH(backoff_schedule_and_budget), BOTH(release_and_requeue),
              BOTH(inbox_identity_and_outcome), BOTH(savepoint_per_delivery),
              BOTH(poison_records_keep_the_evidence), BOTH(retention_in_bounded_batches),
              BOTH(schema_from_the_future_is_refused), BOTH(wakeups_follow_commits),
              BOTH(stats_count_what_they_name), BOTH(namespace_identity),
              BOTH(migration_keeps_stored_msg_ids), BOTH(migration_from_10_records_durable_floors),
              cmocka_unit_test(two_stores_one_stream_keep_both),
              cmocka_unit_test(pg_notices_go_through_the_logger), cmocka_unit_test(emit_oom_child),
              cmocka_unit_test(emit_allocation_failures),
              cmocka_unit_test(url_errors_are_clear_and_secret_free),
              cmocka_unit_test(sqlite_read_only_file), cmocka_unit_test(sqlite_disk_full),
              cmocka_unit_test(sqlite_settings),
              cmocka_unit_test(sqlite_receipts_as_runs_and_the_floor),
              cmocka_unit_test(sqlite_takeover_of_a_range_partly_in_runs),
              cmocka_unit_test(sqlite_writers_take_turns),
              cmocka_unit_test(sqlite_writers_of_two_processes_take_turns),
              cmocka_unit_test(sqlite_turn_file_unusable_is_said_once),
              cmocka_unit_test(sqlite_options_payload_cap_and_busy), cmocka_unit_test(pg_disk_full),
              cmocka_unit_test(pg_schema_option), cmocka_unit_test(pg_concurrent_open),
              cmocka_unit_test(pg_claims_stay_on_their_page),
              cmocka_unit_test(pg_claim_async_commit_stays_in_the_claim),
              BOTH(open_reader_same_database), cmocka_unit_test(sqlite_memory_store_has_no_reader),
              cmocka_unit_test(sqlite_existing_file_keeps_its_pages),
              cmocka_unit_test(pg_reconnects_after_connection_loss),
              cmocka_unit_test(pg_begin_goes_with_the_first_statement),
              cmocka_unit_test(pg_concurrent_duplicate_identity),
              cmocka_unit_test(pg_concurrent_inbox_retire),
              cmocka_unit_test(pg_writer_handle_is_a_second_session),
              cmocka_unit_test(pg_claim_floor_keeps_expired_leases_reachable),
              cmocka_unit_test(pg_receipts_as_runs_and_the_floor), BOTH(pending_lists_every_kind))
