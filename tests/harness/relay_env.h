/*
 * Helpers shared by the relay's and the store's tests (test_relay*.c,
 * test_store.c, slow/test_relay_crash.c): enqueueing effects through the
 * public API, reading the outbox rows back with the native driver (sqlite3 /
 * libpq) so that the receipts are checked independently of the relay, reading
 * a stream with a separate nats.c connection, running a relay in a thread or
 * as a `jsdurable relay` process. Compiled once (relay_env.c) and linked into
 * every test; it brings in test.h and fixture.h, which all its users need.
 */
#ifndef JSD_RELAY_ENV_H
#define JSD_RELAY_ENV_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <libpq-fe.h>
#include <nats/nats.h>
#include <sqlite3.h>

#include "fixture.h"
#include "test.h"

typedef enum rt_backend { RT_SQLITE = 1, RT_PG = 2 } rt_backend;

/* ---- the store and its rows ---------------------------------------------------- */

typedef struct rt_store {
    rt_backend kind;
    char url[512];
    sqlite3 *lite; /* native reader */
    PGconn *pg;
} rt_store;

/* A fresh, empty store of the given kind; its native reader is opened after
 * the first jsd_store_open (which creates the schema). */
void rt_store_new(rt_store *st, rt_backend kind);
/* The same on a PostgreSQL server of the test's own (jsd_fx_pg.url). */
void rt_store_new_on(rt_store *st, const char *pg_server);
/* jsd_store_open on the store's URL; fails the test with the open's error. */
jsd_store *rt_open(const rt_store *st);
/* Open the native reader (once). */
void rt_reader(rt_store *st);
/* Close the native reader. */
void rt_store_close(rt_store *st);

/* One integer from a query (no parameters); -1 on NULL. */
long long rt_q(rt_store *st, const char *sql);
/* One text value from a query into out ("" when no row or NULL). */
void rt_qs(rt_store *st, const char *sql, char *out, size_t cap);
/* The store's message-id namespace: its store id (no test here overrides it). */
void rt_ns(rt_store *st, char out[JSD_NAMESPACE_MAX + 1]);

/* Call fn for every row of a query, with its columns as text (NULL for SQL
 * NULL). */
typedef void (*rt_row_fn)(int ncols, const char *const *cols, void *user);
void rt_rows(rt_store *st, const char *sql, rt_row_fn fn, void *user);

/* Rows of the outbox: "published" = with a receipt. */
#define RT_SQL_TOTAL     "SELECT count(*) FROM jsd_outbox_state"
#define RT_SQL_PUBLISHED "SELECT count(*) FROM jsd_outbox_state WHERE stream_seq IS NOT NULL"
#define RT_SQL_DUPLICATES                                                                          \
    "SELECT count(*) FROM jsd_outbox_state WHERE stream_seq IS NOT NULL AND duplicate"
#define RT_SQL_DEAD "SELECT count(*) FROM jsd_outbox_state WHERE dead_lettered_at IS NOT NULL"

long long rt_published(rt_store *st);

/* ---- enqueueing ---------------------------------------------------------------------- */

typedef struct rt_enqueue_opts {
    const char *owner;     /* default "o" */
    const char *id_prefix; /* effect ids are <prefix><i>; default "e" */
    int first;             /* first i */
    int n;                 /* how many */
    const char *subject;   /* exact subject, or a format with one %d (i % n_subjects) */
    int n_subjects;        /* default 1 */
    const char *order_key; /* NULL: unordered; a format with one %d (i % n_keys) */
    int n_keys;            /* default 1 */
    int64_t not_before_ms; /* 0: now */
    size_t payload_len;    /* default 32; the payload starts with the effect id */
    int per_tx;            /* effects per transaction; default 256 */
} rt_enqueue_opts;

void rt_enqueue(jsd_store *s, const rt_enqueue_opts *o);

/* ---- NATS, read with a separate nats.c connection ------------------------------------ */

typedef struct rt_nats {
    natsConnection *nc;
    jsCtx *js;
} rt_nats;

void rt_nats_open(rt_nats *n, const char *url);
void rt_nats_close(rt_nats *n);

/* A file-storage, limits-retention stream on subjects with a 10-minute
 * duplicate window, and allow_atomic where the server knows it (2.12+), so
 * the relay publishes atomic batches to it; JSD_TEST_ATOMIC=0 in the
 * environment makes it without (the relay's per-message path). */
void rt_stream_add(rt_nats *n, const char *name, const char *subject);
/* The same with the given duplicate window and max_msg_size (0: unlimited). */
void rt_stream_add_with(rt_nats *n, const char *name, const char *subject, int64_t window_ms,
                        int32_t max_msg_size);
uint64_t rt_stream_count(rt_nats *n, const char *name);
/* Set or clear a stream's allow_atomic (a stream update). True when the
 * stream now has it as asked; false on a server that does not know it. */
bool rt_stream_set_atomic(rt_nats *n, const char *name, bool on);

/* One stored message, as read back. */
typedef struct rt_msg {
    uint64_t seq;
    char msg_id[96];
    char subject[128];
    char head[64]; /* first bytes of the payload (the effect id) */
} rt_msg;

/* Read every message of a stream, in sequence order. *count receives the
 * count; free the array. */
rt_msg *rt_stream_read(rt_nats *n, const char *name, size_t *count);

/*
 * The stream holds exactly one message for each effect (owner, <prefix><i>),
 * i in [first, first+n), and nothing else: count, distinct Nats-Msg-Ids and
 * the ids equal to jsd_effect_msg_id of each effect under the store's namespace.
 */
void rt_assert_exactly_once(rt_store *st, rt_nats *nt, const char *stream, const char *owner,
                            const char *prefix, int first, int n);

/* Every receipt names the message stored under the effect's own Nats-Msg-Id:
 * for each row with a receipt, the stream's message at stream_seq carries
 * jsd_effect_msg_id(namespace, owner, effect_id). Also: no two rows share a sequence. */
void rt_assert_receipts_match(rt_store *st, rt_nats *nt, const char *stream);

/* ---- a relay in a thread ------------------------------------------------------------- */

typedef struct rt_relay {
    jsd_store *store; /* the relay's own */
    jsd_conn *conn;
    jsd_relay *relay;
    pthread_t th;
    bool until_idle;
    jsd_status rc;
    volatile int done;
} rt_relay;

/* jsd_conn_open on url with default options but coalesce_writes = 1, as
 * `jsdurable relay` opens its connection; fails the test with its error. */
jsd_conn *rt_conn(const char *url);
/* The same with coalesce_writes given (0: each publication written at once). */
jsd_conn *rt_conn_with(const char *url, int coalesce_writes);
/* Make a relay with its own store handle and connection (opts may be NULL);
 * the connection as rt_conn's, or with coalesce_writes given. */
void rt_relay_make(rt_relay *t, const rt_store *st, const char *nats_url,
                   const jsd_relay_opts *opts);
void rt_relay_make_with(rt_relay *t, const rt_store *st, const char *nats_url,
                        const jsd_relay_opts *opts, int coalesce_writes);
/* Run it in a thread: jsd_relay_run_until_idle or jsd_relay_run. */
void rt_relay_start(rt_relay *t, bool until_idle);
/* The thread's run has returned. */
bool rt_relay_done(rt_relay *t);
/* Stop (if running), join, free. */
void rt_relay_finish(rt_relay *t);

/* ---- `jsdurable relay` as a process --------------------------------------------------- */

/* Spawn `jsdurable relay --store URL --nats URL <extra...>` with JSD_CRASH_AT
 * set to crash_at when given; stderr and stdout go to log. */
pid_t rt_spawn_relay(const char *store_url, const char *nats_url, const char *crash_at,
                     const char *log, const char *const *extra);
/* Wait up to ms for pid; returns the raw wait status, or -1 on timeout. */
int rt_wait_pid(pid_t pid, int64_t ms);
/* Print a log file (for a failing case). */
void rt_dump(const char *path);

#endif
