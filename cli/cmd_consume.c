/*
 * jsdurable consume — an exactly-once JetStream -> SQL sink. Each delivery of
 * a durable pull consumer runs the operator's SQL statement in the same store
 * transaction as its inbox row, and is ACKed only after that commit
 * (IN-1..5). Values reach the statement as bound parameters, never as text
 * spliced into SQL: :subject, :payload, :msg_id, :stream_seq, :deliveries,
 * :traceparent, :tracestate (the W3C trace context headers, NULL when none).
 * SQLite binds them by name; for PostgreSQL the names are rewritten to $1..$n
 * outside string literals, quoted identifiers, comments and :: casts. On
 * PostgreSQL a batch's statements go in one libpq pipeline (a round trip per
 * chunk, not per message); on SQLite they run one after the other.
 */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>
#include <sqlite3.h>

#include "cli.h"
#include "service.h"

#define N_PARAMS 7
static const char *const param_names[N_PARAMS] = {
    "subject", "payload", "msg_id", "stream_seq", "deliveries", "traceparent", "tracestate"};
#define KNOWN_PARAMS ":subject :payload :msg_id :stream_seq :deliveries :traceparent :tracestate"
#define PG_STMT_NAME "jsd_consume_sql"

typedef struct sink {
    const char *sql;
    bool json; /* payload format json: bind the payload as text */
    /* SQLite */
    sqlite3 *db;
    sqlite3_stmt *stmt;
    int sq_index[N_PARAMS]; /* bind index per name, 0 if unused */
    /* PostgreSQL */
    char *pg_sql;
    int pg_order[N_PARAMS]; /* $k -> param name index; k-1 */
    int pg_n;
    PGconn *pg_prepared_on;
    char last_error[512];
} sink;

static void stop_consumer(void *c)
{
    jsd_consumer_begin_drain(c);
}

static int name_index(const char *s, size_t len)
{
    for (int i = 0; i < N_PARAMS; i++)
        if (strlen(param_names[i]) == len && strncmp(param_names[i], s, len) == 0)
            return i;
    return -1;
}

static bool ident_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_';
}

/* Rewrite :name to $k for PostgreSQL. Skips '...', "...", $tag$...$tag$,
 * -- and block comments, and :: casts. */
static bool pg_translate(sink *k, char *why, size_t cap)
{
    const char *s = k->sql;
    size_t n = strlen(s);
    char *out = malloc(n * 2 + 16), *o = out;
    int slot[N_PARAMS];
    for (int i = 0; i < N_PARAMS; i++)
        slot[i] = 0;
    if (!out)
        return false;
    k->pg_n = 0;
    for (size_t i = 0; i < n;) {
        char ch = s[i];
        if (ch == '\'' || ch == '"') {
            char q = ch;
            *o++ = s[i++];
            while (i < n) {
                if (s[i] == q && i + 1 < n && s[i + 1] == q) {
                    *o++ = s[i++];
                    *o++ = s[i++];
                    continue;
                }
                if (s[i] == q) {
                    *o++ = s[i++];
                    break;
                }
                *o++ = s[i++];
            }
        } else if (ch == '-' && i + 1 < n && s[i + 1] == '-') {
            while (i < n && s[i] != '\n')
                *o++ = s[i++];
        } else if (ch == '/' && i + 1 < n && s[i + 1] == '*') {
            const char *end = strstr(s + i + 2, "*/");
            size_t stop = end ? (size_t)(end - s) + 2 : n;
            while (i < stop)
                *o++ = s[i++];
        } else if (ch == '$' && i + 1 < n && (s[i + 1] == '$' || ident_char(s[i + 1])) &&
                   !(s[i + 1] >= '0' && s[i + 1] <= '9')) {
            /* dollar quote $tag$ ... $tag$ */
            size_t j = i + 1;
            while (j < n && ident_char(s[j]))
                j++;
            if (j < n && s[j] == '$') {
                size_t taglen = j - i + 1;
                const char *end = NULL;
                for (size_t p = j + 1; p + taglen <= n; p++)
                    if (strncmp(s + p, s + i, taglen) == 0) {
                        end = s + p;
                        break;
                    }
                size_t stop = end ? (size_t)(end - s) + taglen : n;
                while (i < stop)
                    *o++ = s[i++];
            } else {
                *o++ = s[i++];
            }
        } else if (ch == ':' && i + 1 < n && s[i + 1] == ':') {
            *o++ = s[i++];
            *o++ = s[i++];
        } else if (ch == ':' && i + 1 < n && ident_char(s[i + 1])) {
            size_t j = i + 1;
            while (j < n && ident_char(s[j]))
                j++;
            int idx = name_index(s + i + 1, j - i - 1);
            if (idx < 0) {
                snprintf(why, cap, "unknown parameter :%.*s (known: " KNOWN_PARAMS ")",
                         (int)(j - i - 1 > 64 ? 64 : j - i - 1), s + i + 1);
                free(out);
                return false;
            }
            if (!slot[idx]) {
                slot[idx] = ++k->pg_n;
                k->pg_order[k->pg_n - 1] = idx;
            }
            o += snprintf(o, 8, "$%d", slot[idx]);
            i = j;
        } else {
            *o++ = s[i++];
        }
    }
    *o = '\0';
    k->pg_sql = out;
    return true;
}

static bool sqlite_prepare(sink *k, sqlite3 *db, char *why, size_t cap)
{
    if (k->stmt && k->db == db)
        return true;
    sqlite3_finalize(k->stmt);
    k->stmt = NULL;
    const char *tail = NULL;
    if (sqlite3_prepare_v3(db, k->sql, -1, SQLITE_PREPARE_PERSISTENT, &k->stmt, &tail) !=
        SQLITE_OK) {
        snprintf(why, cap, "--sql does not prepare: %s", sqlite3_errmsg(db));
        return false;
    }
    if (!k->stmt) {
        snprintf(why, cap, "--sql is empty");
        return false;
    }
    while (tail && (*tail == ' ' || *tail == '\n' || *tail == '\t' || *tail == ';'))
        tail++;
    if (tail && *tail) {
        snprintf(why, cap, "--sql must be one statement");
        return false;
    }
    int np = sqlite3_bind_parameter_count(k->stmt);
    for (int i = 0; i < N_PARAMS; i++)
        k->sq_index[i] = 0;
    for (int p = 1; p <= np; p++) {
        const char *nm = sqlite3_bind_parameter_name(k->stmt, p);
        int idx = nm && nm[0] == ':' ? name_index(nm + 1, strlen(nm + 1)) : -1;
        if (idx < 0) {
            snprintf(why, cap, "unknown parameter %s (known: " KNOWN_PARAMS ")", nm ? nm : "?");
            return false;
        }
        k->sq_index[idx] = p;
    }
    k->db = db;
    return true;
}

static bool pg_prepare(sink *k, jsd_tx *tx, PGconn *pg, char *why, size_t cap)
{
    if (k->pg_prepared_on == pg)
        return true;
    PGresult *r = PQprepare(pg, PG_STMT_NAME, k->pg_sql, 0, NULL);
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok) {
        const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        if (state && strcmp(state, "42P05") == 0) { /* already prepared on this session */
            ok = true;
        } else {
            jsd_tx_note_sqlstate(tx, state); /* a lock timeout while preparing, too */
            snprintf(why, cap, "--sql does not prepare: %s", PQresultErrorMessage(r));
            char *nl = strchr(why, '\n');
            if (nl)
                *nl = '\0';
        }
    }
    PQclear(r);
    if (ok)
        k->pg_prepared_on = pg;
    return ok;
}

static jsd_disposition run_sqlite(sink *k, sqlite3 *db, const jsd_delivery *d)
{
    size_t len = 0;
    const void *payload = jsd_delivery_payload(d, &len);
    if (!sqlite_prepare(k, db, k->last_error, sizeof(k->last_error)))
        return jsd_disposition_retry(0, k->last_error);
    sqlite3_stmt *st = k->stmt;
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    if (k->sq_index[0])
        sqlite3_bind_text(st, k->sq_index[0], jsd_delivery_subject(d), -1, SQLITE_STATIC);
    if (k->sq_index[1]) {
        if (k->json)
            sqlite3_bind_text(st, k->sq_index[1], payload ? payload : "", (int)len, SQLITE_STATIC);
        else
            sqlite3_bind_blob(st, k->sq_index[1], payload ? payload : "", (int)len, SQLITE_STATIC);
    }
    if (k->sq_index[2]) {
        const char *id = jsd_delivery_msg_id(d);
        if (*id)
            sqlite3_bind_text(st, k->sq_index[2], id, -1, SQLITE_STATIC);
        else
            sqlite3_bind_null(st, k->sq_index[2]);
    }
    if (k->sq_index[3])
        sqlite3_bind_int64(st, k->sq_index[3], (sqlite3_int64)jsd_delivery_stream_seq(d));
    if (k->sq_index[4])
        sqlite3_bind_int64(st, k->sq_index[4], (sqlite3_int64)jsd_delivery_deliveries(d));
    for (int i = 5; i < N_PARAMS; i++) { /* trace context: the header as sent, or NULL */
        const char *v = k->sq_index[i] ? jsd_delivery_header(d, param_names[i]) : NULL;
        if (v)
            sqlite3_bind_text(st, k->sq_index[i], v, -1, SQLITE_STATIC);
    }
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        ;
    if (rc != SQLITE_DONE) {
        snprintf(k->last_error, sizeof(k->last_error), "--sql failed: %s", sqlite3_errmsg(db));
        sqlite3_reset(st);
        return jsd_disposition_retry(0, k->last_error);
    }
    sqlite3_reset(st);
    return jsd_disposition_commit();
}

/* One delivery's parameters, in $k order; seq and dlv are its buffers. */
static void pg_params(const sink *k, const jsd_delivery *d, const char **values, int *lengths,
                      int *formats, char *seq, char *dlv)
{
    size_t len = 0;
    const void *payload = jsd_delivery_payload(d, &len);
    snprintf(seq, 24, "%llu", (unsigned long long)jsd_delivery_stream_seq(d));
    snprintf(dlv, 24, "%llu", (unsigned long long)jsd_delivery_deliveries(d));
    for (int i = 0; i < k->pg_n; i++) {
        int idx = k->pg_order[i];
        formats[i] = 0;
        lengths[i] = 0;
        switch (idx) {
        case 0:
            values[i] = jsd_delivery_subject(d);
            break;
        case 1:
            values[i] = payload ? payload : "";
            lengths[i] = (int)len;
            formats[i] = 1; /* raw bytes: bytea, or text as-is */
            break;
        case 2:
            values[i] = *jsd_delivery_msg_id(d) ? jsd_delivery_msg_id(d) : NULL;
            break;
        case 3:
            values[i] = seq;
            break;
        case 4:
            values[i] = dlv;
            break;
        default: /* trace context: the header as sent, or NULL */
            values[i] = jsd_delivery_header(d, param_names[idx]);
            break;
        }
    }
}

/* The answer for one statement's result: COMMIT, or RETRY with its error in
 * err (cap bytes; it must outlive the handler call), its SQLSTATE recorded
 * in tx (jsd_tx_note_sqlstate). */
static jsd_disposition pg_answer(sink *k, jsd_tx *tx, PGresult *r, char *err, size_t cap)
{
    ExecStatusType es = PQresultStatus(r);
    if (es == PGRES_COMMAND_OK || es == PGRES_TUPLES_OK)
        return jsd_disposition_commit();
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    /* Only this result says why the statement failed: tell the consumer,
     * which holds or retries the batch on contention (a lock timeout, a
     * serialization failure) instead of spending a delivery. */
    jsd_tx_note_sqlstate(tx, state);
    if (state && strcmp(state, "26000") == 0)
        k->pg_prepared_on = NULL; /* the session lost it: prepare again next time */
    snprintf(err, cap, "--sql failed: %s", r ? PQresultErrorMessage(r) : "no result");
    char *nl = strchr(err, '\n');
    if (nl)
        *nl = '\0';
    return jsd_disposition_retry(0, err);
}

static jsd_disposition run_pg(sink *k, jsd_tx *tx, PGconn *pg, const jsd_delivery *d)
{
    const char *values[N_PARAMS];
    int lengths[N_PARAMS], formats[N_PARAMS];
    char seq[24], dlv[24];

    if (!pg_prepare(k, tx, pg, k->last_error, sizeof(k->last_error)))
        return jsd_disposition_retry(0, k->last_error);
    pg_params(k, d, values, lengths, formats, seq, dlv);
    PGresult *r = PQexecPrepared(pg, PG_STMT_NAME, k->pg_n, values, lengths, formats, 0);
    jsd_disposition disp = pg_answer(k, tx, r, k->last_error, sizeof(k->last_error));
    PQclear(r);
    return disp;
}

/* Statements sent before their results are read: bounded, so that neither
 * side's socket buffer can fill while the other waits (libpq's pipeline
 * warning for blocking connections). */
#define PG_PIPE_CHUNK 256

/* The batch's statements in libpq pipelines: every statement of a chunk
 * sent, one Sync, every result read, so a chunk costs one round trip. A
 * failed statement answers RETRY with its error, as run_pg does; the
 * transaction is then aborted, so the statements after it (PIPELINE_ABORTED)
 * and the chunks after its own are answered RETRY unrun: the consumer then
 * applies the batch again one delivery at a time (n = 1: run_pg). A lost
 * connection shows in PQstatus, where the consumer looks for an outage. */
static void run_pg_batch(sink *k, jsd_tx *tx, PGconn *pg, const jsd_delivery *const *d, size_t n,
                         jsd_disposition *out)
{
    static const char unrun[] = "not run: an earlier statement of the batch failed";
    if (!pg_prepare(k, tx, pg, k->last_error, sizeof(k->last_error))) {
        for (size_t i = 0; i < n; i++)
            out[i] = jsd_disposition_retry(0, k->last_error);
        return;
    }
    bool failed = false;
    for (size_t from = 0; from < n; from += PG_PIPE_CHUNK) {
        size_t to = from + PG_PIPE_CHUNK < n ? from + PG_PIPE_CHUNK : n, sent = from;
        if (failed || !PQenterPipelineMode(pg)) {
            for (size_t i = from; i < to; i++)
                out[i] = jsd_disposition_retry(0, failed ? unrun : "cannot enter pipeline mode");
            failed = true;
            continue;
        }
        for (; sent < to; sent++) {
            const char *values[N_PARAMS];
            int lengths[N_PARAMS], formats[N_PARAMS];
            char seq[24], dlv[24];
            pg_params(k, d[sent], values, lengths, formats, seq, dlv);
            if (!PQsendQueryPrepared(pg, PG_STMT_NAME, k->pg_n, values, lengths, formats, 0))
                break;
        }
        bool synced = PQpipelineSync(pg) == 1;
        for (size_t i = from; i < to; i++) {
            PGresult *r = i < sent && synced ? PQgetResult(pg) : NULL;
            if (!r) {
                snprintf(k->last_error, sizeof(k->last_error), "--sql failed: %s",
                         PQerrorMessage(pg));
                char *nl = strchr(k->last_error, '\n');
                if (nl)
                    *nl = '\0';
                out[i] = jsd_disposition_retry(0, failed ? unrun : k->last_error);
                failed = true;
                continue;
            }
            if (PQresultStatus(r) == PGRES_PIPELINE_ABORTED)
                out[i] = jsd_disposition_retry(0, unrun);
            else if ((out[i] = pg_answer(k, tx, r, k->last_error, sizeof(k->last_error))).kind !=
                     JSD_DISPOSITION_COMMIT)
                failed = true;
            PQclear(r);
            while ((r = PQgetResult(pg)) != NULL) /* the NULL that ends each statement */
                PQclear(r);
        }
        /* Up to and including the Sync's own result. */
        for (PGresult *r; synced && (r = PQgetResult(pg)) != NULL;) {
            bool sync = PQresultStatus(r) == PGRES_PIPELINE_SYNC;
            PQclear(r);
            if (sync)
                break;
        }
        /* Never leave the session in pipeline mode: the consumer's own
         * statements follow on it. Whatever is still queued is read off
         * first (a lost connection ends this at once). */
        for (int left = 2 * PG_PIPE_CHUNK + 2; !PQexitPipelineMode(pg) && left > 0; left--) {
            failed = true;
            if (PQstatus(pg) != CONNECTION_OK)
                break;
            PGresult *r = PQgetResult(pg);
            if (!r && !(r = PQgetResult(pg)))
                break;
            PQclear(r);
        }
    }
}

static jsd_disposition handle(jsd_tx *tx, const jsd_delivery *d, void *user)
{
    sink *k = user;
    sqlite3 *db = jsd_tx_sqlite(tx);
    if (db)
        return run_sqlite(k, db, d);
    PGconn *pg = jsd_tx_pg(tx);
    if (pg)
        return run_pg(k, tx, pg, d);
    return jsd_disposition_retry(0, "transaction has no native handle");
}

/* The batch handler: a pipeline on PostgreSQL, a loop on SQLite (no round
 * trips to save there). */
static void handle_batch(jsd_tx *tx, const jsd_delivery *const *d, size_t n, jsd_disposition *out,
                         void *user)
{
    PGconn *pg = jsd_tx_pg(tx);
    if (pg && n > 1) {
        run_pg_batch(user, tx, pg, d, n, out);
        return;
    }
    for (size_t i = 0; i < n; i++)
        out[i] = handle(tx, d[i], user);
}

/* Prepare (and so check) the statement once before consuming anything. */
static int check_statement(jsd_store *store, sink *k)
{
    jsd_tx *tx = NULL;
    char why[512] = "";
    bool ok;
    if (jsd_tx_begin(&tx, store) != JSD_OK) {
        cli_err("consume", "cannot begin a transaction: %s", jsd_store_errmsg(store));
        return CLI_UNAVAILABLE;
    }
    if (jsd_tx_sqlite(tx)) {
        ok = sqlite_prepare(k, jsd_tx_sqlite(tx), why, sizeof(why));
    } else {
        ok =
            pg_translate(k, why, sizeof(why)) && pg_prepare(k, tx, jsd_tx_pg(tx), why, sizeof(why));
    }
    jsd_tx_rollback(tx);
    if (!ok) {
        cli_err("consume", "%s", why);
        return CLI_USAGE;
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: jsdurable consume --store URL --nats URL --stream NAME --durable NAME\n"
            "         --sql 'STATEMENT' [options]\n\n"
            "Apply every message of a durable pull consumer exactly once: STATEMENT runs in the\n"
            "same store transaction as the message's inbox row, then the message is ACKed.\n"
            "Named parameters: :subject :payload :msg_id :stream_seq :deliveries, and\n"
            ":traceparent :tracestate (W3C trace context headers, NULL when absent); bound,\n"
            "never spliced into the SQL.\n\n"
            "Options:\n"
            "  --store URL              sqlite:PATH or postgres://... (default $JSD_STORE)\n"
            "  --stream NAME            stream to read (must exist)\n"
            "  --durable NAME           durable pull consumer; created when missing with\n"
            "                           explicit ack, deliver all, the --ack-wait, no backoff,\n"
            "                           max_ack_pending 1024, and max_deliver\n"
            "                           = --max-deliver + 1 (the whole configuration,\n"
            "                           dead-letter stream included, is checked first)\n"
            "  --filter SUBJ            filter subject for a created durable\n"
            "  --topology FILE          the topology file `jsdurable provision` reads: a\n"
            "                           missing durable is created with its entry's settings\n"
            "                           (filter, ack wait, max_deliver, backoff,\n"
            "                           max_ack_pending, inactive threshold; a durable the\n"
            "                           file does not declare is an error). A durable lost\n"
            "                           after it was used (its inbox holds rows) is re-created\n"
            "                           only with it, at its inbox's high-water mark + 1, at\n"
            "                           start or when deleted while consume runs; without it\n"
            "                           consume stops at start (exit 78), and while running\n"
            "                           logs an error (once a minute) and /readyz says 503\n"
            "                           until the durable is restored. A durable ahead of\n"
            "                           its stream (the server lost the stream's tail) is\n"
            "                           re-created only with it, at the first sequence that\n"
            "                           may be new (without it consume stops at start, exit\n"
            "                           78, and while running /readyz says 503)\n"
            "  --redeliver-from-inbox   a store restored from an older backup (doctor check\n"
            "                           consumer.inbox_behind): re-create the durable with\n"
            "                           its own settings after the inbox's high-water mark\n"
            "                           before consuming, so what the store lost is applied\n"
            "                           again and what it holds is answered as duplicates\n"
            "  --sql STATEMENT          one SQL statement run per message (PostgreSQL: the\n"
            "                           batch's statements in one libpq pipeline)\n"
            "  --accept-type TYPE       accepted Jsd-Type header (repeatable; default: any)\n"
            "  --payload raw|json       json: a payload must be JSON nested <= 8 (default raw)\n"
            "  --dlq-subject SUBJ       death envelopes (default jsd.dlq.<stream>.<durable>);\n"
            "                           an existing stream must capture it\n"
            "  --max-deliver N          attempts before a message is parked (default: the\n"
            "                           durable's max_deliver - 1; 5 for a created durable)\n"
            "  --ack-wait DURATION      ack wait of a created durable (default 30s)\n"
            "  --inbox-retention DUR    horizon `jsdurable gc` uses for inbox rows (default 7d;\n"
            "                           0 = kept forever); checked against redelivery\n"
            "  --batch N                messages per transaction (default: half the\n"
            "                           durable's max_ack_pending, at most 512)\n"
            "  --until-idle             exit 0 once nothing is pending or in flight; never\n"
            "                           while a message is unapplied (a store outage is\n"
            "                           waited out; stopped during one, it exits non-zero),\n"
            "                           nor while a dead letter could not be published;\n"
            "                           exit 1 when this run poisoned or parked messages\n"
            "                           or a replay (dlq replay --store) failed again\n"
            "  --metrics ADDR           serve Prometheus metrics on ADDR (host:port):\n"
            "                           deliveries by result, handler duration, dead\n"
            "                           letters, connection state\n"
            "  --hold-alert DURATION    a batch held longer than this (store out, or the\n"
            "                           --sql statement meeting a lock or statement timeout,\n"
            "                           SQLite busy) is logged at error and /readyz says\n"
            "                           503 until it is applied; it is held on, never\n"
            "                           parked (default 5m; contention alone is ready\n"
            "                           until then)\n"
            "  --monitor URL            the server's HTTP monitoring port: its fsync policy is\n"
            "                           checked at start (lazy fsync is a warning)\n"
            "  --allow-unsafe CHECK[,CHECK]  run although these start-up checks fail (\"all\":\n"
            "                           any); printed as a warning on every start\n"
            "  --write-each             write each ACK and fetch request to the socket at\n"
            "                           once, instead of gathering them for about 1 ms into\n"
            "                           large writes (the default: less CPU per message)\n\n"
            "At start consume runs the checks of `jsdurable doctor` that concern it (the\n"
            "stream, the durable, the dead-letter stream, the store; the server's fsync with\n"
            "--monitor) and refuses to run (exit 78) on an error, naming the check and its fix.\n"
            "\n" CLI_CONN_HELP "\nExample:\n"
            "  jsdurable consume --store sqlite:app.db --nats nats://127.0.0.1:4222 \\\n"
            "    --stream ORDERS --durable sink --until-idle \\\n"
            "    --sql 'INSERT INTO orders(subject, body, seq) VALUES (:subject, :payload, "
            ":stream_seq)'\n");
}

enum {
    O_STORE = 1,
    O_STREAM,
    O_DURABLE,
    O_FILTER,
    O_SQL,
    O_ACCEPT,
    O_PAYLOAD,
    O_DLQ,
    O_MAXDELIVER,
    O_UNTIL_IDLE,
    O_BATCH,
    O_METRICS,
    O_ACKWAIT,
    O_RETENTION,
    O_MONITOR,
    O_ALLOW,
    O_WRITE_EACH,
    O_HOLD_ALERT,
    O_TOPOLOGY,
    O_REDELIVER,
    O_HELP
};

/* The durable's settings from the topology file's entry for (stream,
 * durable), into dc (whose filter then points into *topo). */
static int topology_durable(const char *path, const char *stream, const char *durable,
                            jsd_topology **topo, jsd_durable_config *dc)
{
    jsd_error err;
    jsd_error_clear(&err);
    jsd_status st = jsd_topology_load(topo, path, &err);
    if (st != JSD_OK) {
        cli_err("consume", "--topology: %s", err.msg);
        return st == JSD_ERR_IO ? CLI_IOERR : CLI_CONFIG;
    }
    for (size_t i = 0; i < jsd_topology_consumer_count(*topo); i++) {
        const jsd_topology_consumer *tc = jsd_topology_consumer_at(*topo, i);
        if (strcmp(tc->stream, stream) != 0 || strcmp(tc->durable, durable) != 0)
            continue;
        if (tc->n_backoff > JSD_BACKOFF_MAX || tc->max_deliver > INT32_MAX ||
            tc->max_ack_pending > INT32_MAX) {
            cli_err("consume",
                    "--topology %s: durable \"%s\" has %zu backoff steps (consume takes at most "
                    "%d) or a max_deliver or max_ack_pending out of range",
                    path, durable, tc->n_backoff, JSD_BACKOFF_MAX);
            return CLI_CONFIG;
        }
        jsd_durable_config_init(dc);
        dc->filter_subject = tc->filter_subject;
        dc->ack_wait_ms = tc->ack_wait_ms;
        dc->max_deliver = (int)tc->max_deliver;
        dc->n_backoff = (int)tc->n_backoff;
        for (size_t b = 0; b < tc->n_backoff; b++)
            dc->backoff_ms[b] = tc->backoff_ms[b];
        dc->max_ack_pending = (int)tc->max_ack_pending;
        dc->inactive_threshold_ms = tc->inactive_threshold_ms;
        return CLI_OK;
    }
    cli_err("consume",
            "--topology %s declares no durable \"%s\" on stream \"%s\"; add it to the file (and "
            "run `jsdurable provision`) or drop --topology",
            path, durable, stream);
    return CLI_CONFIG;
}

/* /readyz: NATS is checked by the server itself; this adds the store. A
 * store that does not answer is unready at once; the --sql statement held
 * by a lock or a timeout (contention: the store answers) only past
 * --hold-alert, as is any hold. */
static bool consume_ready(void *user, char *why, size_t cap)
{
    jsd_consumer_stats st;
    jsd_consumer_stats_get(user, &st);
    if (st.durable_missing) {
        snprintf(why, cap,
                 "durable: missing on the server (restore it with `jsdurable provision`)");
        return false;
    }
    if (st.durable_ahead) {
        snprintf(why, cap,
                 "durable: ahead of its stream (the server lost the stream's tail; restart "
                 "with --topology FILE to re-create it)");
        return false;
    }
    if (st.held == 0)
        return true;
    if (st.hold_overdue) {
        snprintf(why, cap, "store: %llu deliveries held past the hold alert (%s)",
                 (unsigned long long)st.held, st.held_contention ? "contention" : "not answering");
        return false;
    }
    if (st.held_contention)
        return true;
    snprintf(why, cap, "store: not answering (%llu deliveries held)", (unsigned long long)st.held);
    return false;
}

int cmd_consume(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"store", required_argument, NULL, O_STORE},
        {"stream", required_argument, NULL, O_STREAM},
        {"durable", required_argument, NULL, O_DURABLE},
        {"filter", required_argument, NULL, O_FILTER},
        {"sql", required_argument, NULL, O_SQL},
        {"accept-type", required_argument, NULL, O_ACCEPT},
        {"payload", required_argument, NULL, O_PAYLOAD},
        {"dlq-subject", required_argument, NULL, O_DLQ},
        {"max-deliver", required_argument, NULL, O_MAXDELIVER},
        {"until-idle", no_argument, NULL, O_UNTIL_IDLE},
        {"batch", required_argument, NULL, O_BATCH},
        {"metrics", required_argument, NULL, O_METRICS},
        {"ack-wait", required_argument, NULL, O_ACKWAIT},
        {"inbox-retention", required_argument, NULL, O_RETENTION},
        {"monitor", required_argument, NULL, O_MONITOR},
        {"allow-unsafe", required_argument, NULL, O_ALLOW},
        {"write-each", no_argument, NULL, O_WRITE_EACH},
        {"hold-alert", required_argument, NULL, O_HOLD_ALERT},
        {"topology", required_argument, NULL, O_TOPOLOGY},
        {"redeliver-from-inbox", no_argument, NULL, O_REDELIVER},
        {"help", no_argument, NULL, O_HELP},
        CLI_CONN_LONGOPTS,
        {NULL, 0, NULL, 0}};
    cli_conn cc;
    const char *store_flag = NULL, *stream = NULL, *durable = NULL, *filter = NULL, *sql = NULL;
    const char *dlq = NULL, *metrics = NULL, *monitor = NULL, *allow = NULL, *topo_path = NULL;
    bool redeliver = false;
    const char **types = NULL;
    size_t n_types = 0;
    bool json = false, until_idle = false, write_each = false;
    long max_deliver = 0, batch = 0;
    long long ack_wait_ms = 30000, retention_ms = 7LL * 24 * 3600 * 1000, hold_alert_ms = 0;
    int rc = CLI_OK, opt;
    jsd_store *store = NULL;
    jsd_conn *conn = NULL;
    jsd_consumer *cons = NULL;
    jsd_metrics_server *msrv = NULL;
    jsd_topology *topo = NULL;
    bool ack_wait_set = false;
    sink k;
    memset(&k, 0, sizeof(k));

    cli_conn_init(&cc);
    optind = 1;
    while ((opt = cli_getopt(argc, argv, "h", longopts)) != -1) {
        if (opt >= CLI_CONN_OPT_BASE) {
            if ((rc = cli_conn_flag(&cc, opt, optarg)) != 0)
                goto out;
            continue;
        }
        switch (opt) {
        case O_STORE:
            store_flag = optarg;
            break;
        case O_STREAM:
            stream = optarg;
            break;
        case O_DURABLE:
            durable = optarg;
            break;
        case O_FILTER:
            filter = optarg;
            break;
        case O_SQL:
            sql = optarg;
            break;
        case O_ACCEPT: {
            const char **nt = realloc(types, (n_types + 1) * sizeof(*types));
            if (!nt) {
                rc = CLI_SOFTWARE;
                goto out;
            }
            types = nt;
            types[n_types++] = optarg;
            break;
        }
        case O_PAYLOAD:
            if (!strcmp(optarg, "json")) {
                json = true;
            } else if (strcmp(optarg, "raw") != 0) {
                cli_err("consume", "--payload takes raw or json");
                rc = CLI_USAGE;
                goto out;
            }
            break;
        case O_DLQ:
            dlq = optarg;
            break;
        case O_MAXDELIVER:
            if (!cli_parse_long(optarg, 1, 10000, &max_deliver)) {
                cli_err("consume", "--max-deliver takes 1..10000");
                rc = CLI_USAGE;
                goto out;
            }
            break;
        case O_UNTIL_IDLE:
            until_idle = true;
            break;
        case O_BATCH:
            if (!cli_parse_long(optarg, 1, 4096, &batch)) {
                cli_err("consume", "--batch takes 1..4096");
                rc = CLI_USAGE;
                goto out;
            }
            break;
        case O_METRICS:
            metrics = optarg;
            break;
        case O_ACKWAIT:
        case O_RETENTION: {
            int64_t v = 0;
            if (!cli_parse_duration_ms(optarg, &v) || (opt == O_ACKWAIT && v == 0)) {
                cli_err("consume", "%s takes a duration such as 30s, 5m, 7d",
                        opt == O_ACKWAIT ? "--ack-wait" : "--inbox-retention");
                rc = CLI_USAGE;
                goto out;
            }
            if (opt == O_ACKWAIT) {
                ack_wait_ms = v;
                ack_wait_set = true;
            } else
                retention_ms = v;
            break;
        }
        case O_MONITOR:
            monitor = optarg;
            break;
        case O_ALLOW:
            allow = optarg;
            break;
        case O_WRITE_EACH:
            write_each = true;
            break;
        case O_HOLD_ALERT: {
            int64_t v = 0;
            if (!cli_parse_duration_ms(optarg, &v) || v == 0) {
                cli_err("consume", "--hold-alert takes a duration such as 30s, 5m");
                rc = CLI_USAGE;
                goto out;
            }
            hold_alert_ms = v;
            break;
        }
        case O_TOPOLOGY:
            topo_path = optarg;
            break;
        case O_REDELIVER:
            redeliver = true;
            break;
        case O_HELP:
        case 'h':
            usage(stdout);
            rc = CLI_OK;
            goto out;
        default:
            usage(stderr);
            rc = CLI_USAGE;
            goto out;
        }
    }
    if (optind < argc) {
        cli_err("consume", "unexpected argument '%s'", argv[optind]);
        rc = CLI_USAGE;
        goto out;
    }
    const char *store_url = cli_store_url(store_flag);
    if (!store_url || !stream || !durable || !sql) {
        cli_err("consume", "--store (or $JSD_STORE), --stream, --durable and --sql are required");
        rc = CLI_USAGE;
        goto out;
    }
    if ((rc = cli_doctor_allow_check("consume", allow)) != 0)
        goto out;
    if (topo_path && (filter || ack_wait_set)) {
        cli_err("consume", "--topology gives the durable's settings: drop --filter and --ack-wait");
        rc = CLI_USAGE;
        goto out;
    }
    jsd_durable_config dc;
    jsd_durable_config_init(&dc);
    dc.filter_subject = filter;
    dc.ack_wait_ms = ack_wait_ms;
    if (max_deliver > 0)
        dc.max_deliver = (int)max_deliver + 1;
    if (topo_path && (rc = topology_durable(topo_path, stream, durable, &topo, &dc)) != 0)
        goto out;
    if ((rc = cli_conn_finish(&cc, "consume")) != 0)
        goto out;
    /* Signals and sd_notify (cli/service.h): before any thread exists. */
    if ((rc = cli_service_start("consume", &cc)) != 0)
        goto out;
    k.sql = sql;
    k.json = json;

    jsd_error err;
    jsd_error_clear(&err);
    if (jsd_store_open(&store, store_url, &err) != JSD_OK) {
        cli_err("consume", "%s", err.msg);
        rc = err.status == JSD_ERR_SCHEMA ? CLI_CONFIG : CLI_CANTCREAT;
        goto out;
    }
    if ((rc = check_statement(store, &k)) != 0)
        goto out;
    /* A consumer ACKs a batch at a time: gathering the ACK requests into
     * large socket writes takes CPU off each message (docs/PERFORMANCE.md). */
    cc.opts.coalesce_writes = write_each ? 0 : 1;
    if ((rc = cli_conn_open(&cc, &conn)) != 0)
        goto out;

    jsd_consumer_opts co;
    jsd_consumer_opts_init(&co);
    co.stream = stream;
    co.durable = durable;
    co.batch = (int)batch;
    co.accept_types = types;
    co.n_accept_types = n_types;
    co.payload_format = json ? JSD_PAYLOAD_JSON : JSD_PAYLOAD_RAW;
    co.dlq_subject = dlq;
    co.max_deliver = (int)max_deliver;
    co.inbox_retention_ms = retention_ms;
    co.hold_alert_ms = hold_alert_ms; /* 0: the default */
    co.restore = topo ? &dc : NULL;
    /* Everything that can be checked before the durable exists is, so that a
     * configuration that cannot run creates nothing. */
    jsd_status st = jsd_consumer_check(conn, &co, &err);
    if (st != JSD_OK) {
        cli_err("consume", "%s", err.msg);
        rc = st == JSD_ERR_NOT_FOUND ? CLI_CONFIG : cli_exit_for(st);
        goto out;
    }

    /* The start-up checks (`jsdurable doctor`) of what would make this
     * consumer lose or double: first all but the durable's own, before it is
     * created, then the durable as the server holds it. */
    jsd_doctor_opts dop;
    jsd_doctor_opts_init(&dop);
    jsd_doctor_durable ddu = {stream, durable, dlq, 0};
    dop.checks = JSD_DOCTOR_CHECK_STREAMS | JSD_DOCTOR_CHECK_DLQ | JSD_DOCTOR_CHECK_STORE |
                 (monitor ? JSD_DOCTOR_CHECK_SERVER : 0u);
    dop.durables = &ddu;
    dop.n_durables = 1;
    dop.inbox_retention_ms = retention_ms;
    dop.monitor_url = monitor;
    if ((rc = cli_doctor_gate("consume", store, conn, &dop, allow)) != 0)
        goto out;

    /* A store restored from an older backup: the durable asked to start
     * again after the inbox's high-water mark. */
    if (redeliver) {
        uint64_t at = 0;
        st = jsd_consumer_redeliver_from_inbox(conn, store, stream, durable, &at, &err);
        if (st != JSD_OK) {
            cli_err("consume", "--redeliver-from-inbox: %s", err.msg);
            rc = cli_exit_for(st);
            goto out;
        }
        cli_say("consume", "warn",
                "durable %s re-created at stream sequence %llu, after its inbox's high-water "
                "mark (--redeliver-from-inbox)",
                durable, (unsigned long long)at);
    }

    /* A durable lost after use (its inbox holds rows) is re-created only
     * from the topology, after the inbox's high-water mark; one ahead of its
     * stream likewise, at the first sequence that may be new. */
    bool created = false;
    uint64_t start_seq = 0;
    st = jsd_consumer_ensure_inbox(conn, store, stream, durable, &dc, topo ? &dc : NULL, &created,
                                   &start_seq, &err);
    if (st != JSD_OK) {
        cli_err("consume", "%s", err.msg);
        rc = cli_exit_for(st);
        goto out;
    }
    if (created)
        cli_say("consume", "info", "created durable %s on stream %s%s", durable, stream,
                topo ? " from the topology" : "");
    ddu.ack_wait_ms = created ? dc.ack_wait_ms : 0; /* what was asked for, when known */
    dop.checks = JSD_DOCTOR_CHECK_DURABLES;
    if ((rc = cli_doctor_gate("consume", store, conn, &dop, allow)) != 0)
        goto out;

    if (metrics) {
        jsd_metrics *reg = jsd_metrics_default();
        if ((rc = cli_metrics_start("consume", metrics, conn, &reg, &msrv)) != 0)
            goto out;
    }

    st = jsd_consumer_create(&cons, store, conn, &co, &err);
    if (st != JSD_OK) {
        cli_err("consume", "%s", err.msg);
        rc = st == JSD_ERR_NOT_FOUND ? CLI_CONFIG : cli_exit_for(st);
        goto out;
    }
    if (msrv)
        jsd_metrics_server_set_ready(msrv, consume_ready, cons);

    cli_service_ready(stop_consumer, cons);
    st = jsd_consumer_run_batch(cons, handle_batch, &k, until_idle);
    cli_service_stopping();
    jsd_consumer_stats s;
    jsd_consumer_stats_get(cons, &s);
    cli_say("consume", "info",
            "%llu fetched, %llu committed, %llu duplicates, %llu retried, "
            "%llu poisoned, %llu parked",
            (unsigned long long)s.fetched, (unsigned long long)s.committed,
            (unsigned long long)s.duplicates, (unsigned long long)s.retried,
            (unsigned long long)s.poisoned, (unsigned long long)s.parked);
    if (s.replays_applied || s.replays_failed || s.replays_duplicate)
        cli_say("consume", s.replays_failed ? "warn" : "info",
                "replays (dlq replay --store): %llu applied, %llu failed again, %llu applied "
                "already",
                (unsigned long long)s.replays_applied, (unsigned long long)s.replays_failed,
                (unsigned long long)s.replays_duplicate);
    if (s.store_outages || s.contention || s.dlq_deferred || s.poison_unpublished)
        cli_say("consume", "warn",
                "%llu store outages waited out, %llu contention failures of --sql "
                "(%llu retried at once), %llu dead letters deferred, "
                "%llu poison records not yet in the dead-letter stream",
                (unsigned long long)s.store_outages, (unsigned long long)s.contention,
                (unsigned long long)s.contention_retries, (unsigned long long)s.dlq_deferred,
                (unsigned long long)s.poison_unpublished);
    if (st != JSD_OK) {
        cli_err("consume", "%s", jsd_consumer_errmsg(cons));
        rc = cli_exit_for(st);
    } else if (until_idle && s.replays_failed > 0 && s.poisoned + s.parked == 0) {
        /* a replay asked for and failed again is as unclean as a park */
        cli_say("consume", "warn",
                "%llu replays failed again (`jsdurable status` shows why): exit 1",
                (unsigned long long)s.replays_failed);
        rc = 1;
    } else if (until_idle && s.poisoned + s.parked > 0) {
        /* like the relay: a run that dead-lettered is not a clean run */
        cli_say("consume", "warn",
                "this run dead-lettered %llu messages (%llu poisoned, %llu parked): "
                "`jsdurable dlq list` shows them; exit 1",
                (unsigned long long)(s.poisoned + s.parked), (unsigned long long)s.poisoned,
                (unsigned long long)s.parked);
        rc = 1;
    }
out:
    jsd_metrics_server_destroy(msrv);
    jsd_consumer_destroy(cons);
    jsd_topology_destroy(topo);
    sqlite3_finalize(k.stmt);
    free(k.pg_sql);
    free(types);
    jsd_conn_close(conn);
    jsd_store_close(store);
    cli_conn_free(&cc);
    return rc;
}
