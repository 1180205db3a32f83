/*
 * The store's back-end interface, between the front (store.c, tx.c,
 * outbox.c: URL parsing, validation, encoding, the failure policy, the public
 * and internal entry points) and the two back ends, sqlite.c and postgres.c.
 * Not used outside src/store/.
 *
 * The front validates every argument, encodes effects and decides every
 * policy (attempt budget, backoff, dead-letter reason) before a back end sees
 * them; a back end only runs SQL and maps its errors, and uses nothing of the
 * front: the rows and helpers both sides share are in rows.h.
 */
#ifndef JSD_STORE_BACKEND_H
#define JSD_STORE_BACKEND_H

#include "store/rows.h"
#include "store/store.h"

/* Current schema version (see the migration lists in sqlite.c / postgres.c). */
#define JSD__SCHEMA_VERSION JSD_STORE_SCHEMA_VERSION

/* The jsd_meta key of the store id (migration 2). */
#define JSD__META_STORE_ID "store_id"
/* Unix milliseconds now, as SQL (timestamp defaults, version rows). SQLite
 * 3.40 has no 'subsec' modifier: julianday carries the milliseconds. */
#define JSD__SQLITE_NOW_MS "(CAST(round((julianday('now') - 2440587.5) * 86400000) AS INTEGER))"
#define JSD__PG_NOW_MS     "(floor(extract(epoch FROM clock_timestamp()) * 1000))::bigint"

/* The jsd_meta key of the namespace of rows written without a msg_id
 * (docs/SQL-CONTRACT.md): recorded by the first open with an operator
 * namespace; absent, the store id is theirs. */
#define JSD__META_NAMESPACE "namespace"

/* Limits spelled out for the schema's constraints (SQL text), kept equal to
 * the constants of include/jsdurable/store.h. */
#define JSD__STR(x)          #x
#define JSD__XSTR(x)         JSD__STR(x)
#define JSD__MSG_ID_CHARS    64   /* JSD_MSG_ID_MAX without its NUL */
#define JSD__HEADERS_OWN_MAX 3840 /* JSD_HEADERS_MAX_BYTES - JSD_HEADERS_RESERVED_BYTES */
#define JSD__PAYLOAD_CAP_SQL 262144
_Static_assert(JSD__MSG_ID_CHARS == JSD_MSG_ID_MAX - 1, "msg id length");
_Static_assert(JSD__HEADERS_OWN_MAX == JSD_HEADERS_MAX_BYTES - JSD_HEADERS_RESERVED_BYTES,
               "headers an effect may take");
_Static_assert(JSD__PAYLOAD_CAP_SQL == JSD_PAYLOAD_DEFAULT_CAP, "payload cap");

/* The DDL of every migration in order, for jsd_store_schema_write
 * (schema.c): NULL-terminated statements of version v (1-based), each with
 * "@" where the PostgreSQL schema goes; NULL past the last version. v 0: the
 * jsd_schema_version table every migration records itself in. */
const char *const *jsd__sqlite_migration(int v);
const char *const *jsd__pg_migration(int v);

typedef enum jsd__txop {
    JSD__TX_BEGIN,
    JSD__TX_COMMIT,        /* no effect emitted */
    JSD__TX_COMMIT_NOTIFY, /* effects emitted: wake relays */
    JSD__TX_ROLLBACK,
    JSD__TX_SAVEPOINT,
    JSD__TX_RELEASE,
    JSD__TX_ROLLBACK_TO
} jsd__txop;

typedef struct jsd__store_ops {
    void (*close)(jsd_store *s);
    jsd_status (*tx)(jsd_store *s, jsd__txop op);
    /* Inside a transaction. On JSD_ERR_EXISTS, *dup_index names the first
     * duplicate and nothing of the batch remains. */
    jsd_status (*emit)(jsd_store *s, const jsd__row *rows, size_t n, size_t *dup_index);
    jsd_status (*claim)(jsd_store *s, int max, int64_t lease_ms, const char *token, int64_t now,
                        jsd__effect_batch *out);
    /* sync false: the commit may leave its durability to sync_receipts. */
    jsd_status (*receipts)(jsd_store *s, const char *token, const jsd__receipt *r, size_t n,
                           size_t *applied, bool sync);
    /* Make the receipts committed with sync false durable. NULL: they were
     * at commit. Touches only what receipts(sync false) and it share. */
    jsd_status (*sync_receipts)(jsd_store *s);
    /* Recording failures is two steps in one transaction, the policy decided
     * by the front between them. failures_read begins it and gives, for each
     * id, the attempts of its row if it still holds token and is pending,
     * else -1; on an error nothing remains open. failures_write writes the
     * n updates (n may be 0) and ends the transaction: committed on JSD_OK,
     * rolled back otherwise. */
    jsd_status (*failures_read)(jsd_store *s, const char *token, const int64_t *ids, size_t n,
                                int *attempts);
    jsd_status (*failures_write)(jsd_store *s, const char *token, const jsd__failure_update *u,
                                 size_t n);
    jsd_status (*release)(jsd_store *s, const char *token, const int64_t *ids, size_t n,
                          size_t *released);
    jsd_status (*trouble)(jsd_store *s, jsd__outbox_trouble *out);
    jsd_status (*requeue)(jsd_store *s, const int64_t *ids, size_t n, int64_t now,
                          size_t *requeued);
    jsd_status (*next_due)(jsd_store *s, bool *found, int64_t *next);
    jsd_status (*wait)(jsd_store *s, int timeout_ms, bool *woken);
    /* Inside a transaction. */
    jsd_status (*inbox_lookup)(jsd_store *s, const char *stream, const char *consumer, uint64_t seq,
                               const char *msg_id, bool *found, jsd__inbox_outcome *out);
    jsd_status (*inbox_insert)(jsd_store *s, const char *stream, const char *consumer, uint64_t seq,
                               const char *msg_id, int code, const char *detail,
                               const jsd__trace *trace, int64_t now);
    /* The inbox rows (code, no detail) of a whole batch in one statement
     * where the engine allows it: row i is inserted unless a row of
     * (stream, consumer) has seqs[i], or has msg_ids[i] (NULL or "": none) and was
     * there before the call; inserted[i] says which. The caller keeps seqs
     * and msg ids distinct within the batch. */
    jsd_status (*inbox_insert_many)(jsd_store *s, const char *stream, const char *consumer,
                                    const uint64_t *seqs, const char *const *msg_ids,
                                    const jsd__trace *traces, size_t n, int code, int64_t now,
                                    bool *inserted);
    /* jsd__tx_inbox_retire: *moved false when there was no such row. */
    jsd_status (*inbox_retire)(jsd_store *s, const char *stream, const char *consumer, uint64_t seq,
                               bool *moved);
    jsd_status (*poison_insert)(jsd_store *s, const jsd__poison *p, int64_t now, bool *inserted);
    jsd_status (*poison_mark)(jsd_store *s, const char *stream, const char *consumer, uint64_t seq,
                              const char *dlq_stream, uint64_t dlq_seq);
    /* stream NULL: list after_id/max; seq 0: the unpublished records of
     * (stream, consumer) after_id/max; else get one (max 1). */
    jsd_status (*poison_read)(jsd_store *s, const char *stream, const char *consumer, uint64_t seq,
                              int64_t after_id, size_t max, jsd__poison_record **out, size_t *n);
    /* Replay requests (store.h). replay_request: upsert, *out the row after,
     * *queued whether this call made it pending. replay_list: stream NULL,
     * the requests not applied; else the pending ones of (stream, consumer);
     * id > after_id, at most max. replay_finish: pending request id to
     * state, *done whether it was pending; in or out of a transaction. */
    jsd_status (*replay_request)(jsd_store *s, const jsd_replay_request *r, int64_t now,
                                 jsd_replay_request *out, bool *queued);
    jsd_status (*replay_list)(jsd_store *s, const char *stream, const char *consumer,
                              int64_t after_id, size_t max, jsd_replay_request *out, size_t *n);
    jsd_status (*replay_finish)(jsd_store *s, int64_t id, int state, const char *detail,
                                int64_t now, bool *done);
    /* Inside a transaction: the inbox row's outcome set to code unless it
     * has it; *changed whether a row was written. */
    /* The durable's recorded ack floor: floor_put raises it (set: puts it
     * as it is, for a durable re-created lower), now the time it is
     * recorded; floor_get leaves *floor and *at alone when none is. In or
     * out of a transaction. */
    jsd_status (*floor_put)(jsd_store *s, const char *stream, const char *consumer, uint64_t floor,
                            int64_t now, bool set);
    jsd_status (*floor_get)(jsd_store *s, const char *stream, const char *consumer, uint64_t *floor,
                            int64_t *at);
    jsd_status (*inbox_set)(jsd_store *s, const char *stream, const char *consumer, uint64_t seq,
                            int code, const char *detail, bool *changed);
    /* inbox false: published effects only. */
    jsd_status (*gc_step)(jsd_store *s, int64_t cutoff, int batch, bool inbox, int64_t *removed);
    /* (stream, consumer) groups of inbox rows with created_at < cutoff. */
    jsd_status (*inbox_aged)(jsd_store *s, int64_t cutoff, jsd_inbox_aged **out, size_t *n);
    /* The highest stream sequence of (stream, consumer)'s inbox rows, retired
     * (negative) ones left out; 0 when there is none. */
    jsd_status (*inbox_high)(jsd_store *s, const char *stream, const char *consumer, uint64_t *seq);
    /* At most batch inbox rows of (stream, consumer) with created_at <
     * cutoff and stream_seq <= max_seq, in one transaction. */
    jsd_status (*gc_inbox)(jsd_store *s, const char *stream, const char *consumer, int64_t cutoff,
                           int64_t max_seq, int batch, int64_t *removed);
    /* backlog_only: backlog, due and oldest_due_age_ms only (cheap). */
    jsd_status (*stats)(jsd_store *s, int64_t now, bool backlog_only, jsd_store_stats *out);

    /* ---- the outbox tools (front: outbox_tools.c) ----
     * tool_list: the page q asks for (validated by the front) into out;
     * tool_get: one effect by identity, *found; now judges the lease.
     * tool_reasons: dead letters grouped by reason, most frequent first.
     * tool_unpublish: clear the receipt of each u[i] still holding it, in
     * one transaction (store.h, jsd__store_unpublish). */
    jsd_status (*tool_list)(jsd_store *s, const jsd_outbox_query *q, int64_t now,
                            jsd_outbox_entry *out, size_t *n);
    jsd_status (*tool_get)(jsd_store *s, const char *owner, const char *effect_id, int64_t now,
                           jsd_outbox_entry *out, bool *found);
    jsd_status (*tool_reasons)(jsd_store *s, jsd_outbox_reason *out, size_t cap, size_t *n);
    jsd_status (*tool_unpublish)(jsd_store *s, const jsd__unpublish *u, size_t n, int64_t now,
                                 size_t *done);
} jsd__store_ops;

struct jsd_tx {
    jsd_store *store;
    bool active;
    bool emitted;
    bool savepoint;
    char app_sqlstate[6]; /* jsd_tx_note_sqlstate: the application's last failure */
};

struct jsd_store {
    const jsd__store_ops *ops;
    jsd_store_backend backend;
    jsd_error err;
    char url_safe[512]; /* the URL with its password redacted, for messages */
    size_t payload_max;
    int busy_timeout_ms;
    char store_id[33]; /* jsd_meta store_id, read at open */
    int schema_found;  /* the version before the open's migration */
    /* The jsd_meta store_id row as the back end read it while migrating, for
     * the front to judge after the open (a longer value is cut to 64 bytes,
     * which still reads as not 32 hex digits). */
    bool meta_id_found;
    char meta_id[65];
    char ns[JSD_NAMESPACE_MAX + 1]; /* the operator's namespace, or store_id */
    /* What it was opened with, for jsd__store_open_writer (the URL may hold
     * a password: never printed, wiped at close). */
    char *open_url;
    char *open_schema;
    char *open_ns;
    struct jsd_tx tx; /* one transaction at a time per store */
    void *be;         /* the back end's state */
};

/* Back ends. */
jsd_status jsd__sqlite_open(jsd_store *s, const char *path, jsd_error *err);
jsd_status jsd__pg_open(jsd_store *s, const char *conninfo, const char *schema, jsd_error *err);
struct sqlite3 *jsd__sqlite_handle(jsd_store *s);
/* Write transactions of this process waiting for the writer turn on s's
 * file (src/store/sqlite.c; for tests), -1 if s is not a SQLite store. */
int jsd__sqlite_turn_waiting(jsd_store *s);
/* Write transactions of s that, before they began, let another
 * connection's wait for the lock go first, and until when (monotonic µs;
 * 0 or past: it looks) s does not look for such waiters (src/store/xturn.c;
 * for tests); -1 if s is not a SQLite store. */
int64_t jsd__sqlite_xturn_yields(jsd_store *s, int64_t *deaf_until_us);
/* Whether s takes part in the writer turn across processes (its turn file
 * is open; the doctor reports it). false with *why the errno of the failed
 * open, 0 for a database without a file or a store that is not SQLite. */
bool jsd__sqlite_xturn_part(jsd_store *s, int *why);
struct pg_conn *jsd__pg_handle(jsd_store *s);
/* The settled floor of a PostgreSQL store of schema 9 or later, for the
 * doctor (src/store/postgres.c, jsd__pg_floor_check): its id, the ready
 * rows below it that no run of receipts covers (no relay claims them) and
 * the first of them, and the outbox identity's sequence cache (-1: not
 * found). */
typedef struct {
    int64_t floor, stranded, first_stranded, id_cache;
} jsd__pg_floor_state;
jsd_status jsd__pg_floor_check(jsd_store *s, jsd__pg_floor_state *st);

#endif
