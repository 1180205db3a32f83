/*
 * The durable owner: a SQLite (default) or PostgreSQL store holding the outbox,
 * the inbox, poison records and their receipts (STORE-1..4).
 *
 * An application commits its own rows and the effects it wants published in
 * one transaction: jsd_tx_begin, its own SQL on jsd_tx_sqlite()/jsd_tx_pg(),
 * jsd_tx_emit(), jsd_tx_commit(). The relay publishes committed effects.
 */
#ifndef JSDURABLE_STORE_H
#define JSDURABLE_STORE_H

#include <stdio.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct jsd_store jsd_store;
typedef struct jsd_tx jsd_tx;

/* Native handles, without pulling in their headers. */
struct sqlite3;
struct pg_conn; /* libpq's PGconn */

typedef enum jsd_store_backend { JSD_STORE_SQLITE = 1, JSD_STORE_POSTGRES = 2 } jsd_store_backend;

/* ---- limits ------------------------------------------------------------------
 * One set of limits for every path to the broker: jsd_tx_emit checks them when
 * an effect is committed, the relay and jsd_publish check the same constants
 * before they publish, and the CLI reads its input up to them. An effect the
 * store accepts is one the relay can publish (a server configured with a
 * max_payload under JSD_PAYLOAD_DEFAULT_CAP + JSD_HEADERS_MAX_BYTES is the one
 * exception: the relay refuses such a message as permanent). */
/* JSD_IDENT_MAX: bytes of an effect's owner, id and order key, of a message
 * id or idempotency key, and of a delivery's stream and consumer name. */
#define JSD_SUBJECT_MAX      256 /* bytes of an exact subject */
#define JSD_IDENT_MAX        256
#define JSD_HEADERS_MAX      16  /* application headers (attributes) per message */
#define JSD_HEADER_NAME_MAX  64  /* bytes of an application header name */
#define JSD_HEADER_VALUE_MAX 256 /* bytes of an application header value */
/* W3C trace context (jsd_effect.traceparent / tracestate, or headers of those
 * names): a traceparent is "vv-<32 hex trace id>-<16 hex parent id>-<2 hex
 * flags>" in lowercase hex (version 00: exactly 55 bytes; a later version may
 * append "-..." up to JSD_HEADER_VALUE_MAX), ids not all zero, version not
 * "ff"; a tracestate is at most JSD_TRACESTATE_MAX bytes of printable ASCII
 * (the length W3C asks a propagator to keep), passed on as it is. */
#define JSD_TRACESTATE_MAX 512
/* All headers as encoded on the wire: "NATS/1.0\r\n", "Name: value\r\n" for
 * each, "\r\n". */
#define JSD_HEADERS_MAX_BYTES 4096
/* Of those, what the relay adds to every effect: the status line and final
 * CRLF, Nats-Msg-Id (64 hex) and Nats-Expected-Stream (a stream name of up to
 * 128 bytes): 243 bytes, rounded up. An effect's own headers may take
 * JSD_HEADERS_MAX_BYTES - JSD_HEADERS_RESERVED_BYTES (3840) bytes. */
#define JSD_HEADERS_RESERVED_BYTES 256
/* The payload cap: the publisher's default (PUB-6) and the largest payload the
 * relay publishes, so the store's payload_max may be lower, never higher.
 * With the headers it stays under nats-server's default max_payload (1 MiB,
 * which counts headers and payload together). */
#define JSD_PAYLOAD_DEFAULT_CAP (256 * 1024)

/* JSON payloads (publisher json_payloads, consumer JSON envelopes): arrays
 * and objects nested at most this deep. */
#define JSD_JSON_DEPTH_MAX 8

/* Message-id namespace: 1..64 bytes of [A-Za-z0-9._-]. */
#define JSD_NAMESPACE_MAX 64

typedef struct jsd_store_opts {
    /* "sqlite:PATH", a plain file path, or "postgres://..." / "postgresql://...". */
    const char *url;
    /* PostgreSQL schema for the jsd_ tables, created when missing. Default: the
     * URL's "schema=NAME" query parameter (removed before libpq sees the URL),
     * else "public". 1..63 of [A-Za-z0-9_], not starting with a digit. */
    const char *pg_schema;
    int busy_timeout_ms; /* SQLite busy timeout; default 5000 */
    /* Largest effect payload accepted; default and ceiling
     * JSD_PAYLOAD_DEFAULT_CAP (256 KiB), 0: default. */
    size_t payload_max;
    /* The namespace of the Nats-Msg-Ids of the effects this handle emits
     * (see jsd_effect_msg_id). NULL: the URL's "namespace=NAME" query
     * parameter (removed before the back end sees the URL), else the store
     * id, a random 128-bit id (32 hex digits) created with the schema and kept
     * in its jsd_meta table. 1..JSD_NAMESPACE_MAX bytes of [A-Za-z0-9._-].
     * Every producer writing into one stream needs its own namespace: two
     * producers sharing one would have their equal (owner, id) effects taken
     * for duplicates. Rows already in the outbox keep the id they were
     * committed with. */
    const char *id_namespace;
} jsd_store_opts;

JSD_EXTERN void jsd_store_opts_init(jsd_store_opts *o);

/* Open a store and apply migrations (inside a transaction; on PostgreSQL under
 * an advisory lock, so processes opening at once do not race). A schema newer
 * than this library is refused with JSD_ERR_SCHEMA. Errors: JSD_ERR_CONFIG
 * (malformed URL), JSD_ERR_CONNECT (PostgreSQL unreachable), JSD_ERR_READONLY,
 * JSD_ERR_FULL, JSD_ERR_STORE. Messages never hold the URL's password.
 * A store handle is used by one thread at a time. A process that forks opens
 * its stores after the fork, in the process that uses them: SQLite keeps its
 * locks per process, and a child that inherits an open handle, or opens the
 * same file while an inherited handle holds a lock, meets locks that no
 * thread of its own can release. */
JSD_EXTERN jsd_status jsd_store_open(jsd_store **out, const char *url, jsd_error *err);
JSD_EXTERN jsd_status jsd_store_open_opts(jsd_store **out, const jsd_store_opts *o, jsd_error *err);
/* Accepts NULL. */
JSD_EXTERN void jsd_store_close(jsd_store *s);
JSD_EXTERN const char *jsd_store_errmsg(const jsd_store *s);
JSD_EXTERN const jsd_error *jsd_store_error(const jsd_store *s);
JSD_EXTERN jsd_store_backend jsd_store_backend_of(const jsd_store *s);
/* The store's URL with any password replaced by "***", for output and logs. */
JSD_EXTERN const char *jsd_store_url(const jsd_store *s);
/* The message-id namespace in force for this handle (the operator's, or the
 * store id), and the store id created with the schema (32 hex digits). Valid
 * while the store is open; "" for NULL. */
JSD_EXTERN const char *jsd_store_namespace(const jsd_store *s);
JSD_EXTERN const char *jsd_store_id(const jsd_store *s);

/* ---- the schema (docs/SQL-CONTRACT.md) --------------------------------------- */
/* The schema version this library makes: opening a store migrates it to this
 * version. */
#define JSD_STORE_SCHEMA_VERSION 11
/* The version the store had before this handle's open migrated it: 0 when the
 * open created the tables, JSD_STORE_SCHEMA_VERSION when nothing was to do;
 * -1 for NULL. */
JSD_EXTERN int jsd_store_schema_found(const jsd_store *s);
/* Write to f the whole DDL of JSD_STORE_SCHEMA_VERSION for backend (tables,
 * indexes, constraints, triggers, functions, the version rows and a store id
 * drawn by the database): the statements the library's own migrations run,
 * as one script a DBA can review or apply with sqlite3 / psql to an empty
 * database. pg_schema (PostgreSQL; NULL: "public") is the schema the tables
 * go into, validated as jsd_store_opts.pg_schema is. JSD_ERR_INVALID for a bad
 * backend or schema name, JSD_ERR_IO when f fails. */
JSD_EXTERN jsd_status jsd_store_schema_write(FILE *f, jsd_store_backend backend,
                                             const char *pg_schema, jsd_error *err);

/* ---- application transactions ------------------------------------------------ */
typedef struct jsd_header {
    const char *name;
    const char *value;
} jsd_header;

typedef struct jsd_effect {
    const char *owner;   /* owner id, e.g. "order-42" (default "" when NULL) */
    const char *id;      /* effect id, unique per owner; required */
    const char *subject; /* exact subject; required */
    const jsd_header *headers;
    size_t n_headers;
    const void *payload;
    size_t len;
    int64_t not_before_ms; /* unix ms; 0 = publish as soon as possible */
    const char *order_key; /* NULL: unordered; else published in commit order per key */
    /* W3C trace context, NULL when none: published as the "traceparent" and
     * "tracestate" headers (they count towards the header limits), handed to
     * the consumer's handler (jsd_delivery_header) and kept in its inbox row.
     * The same names given in headers instead are checked by the same rule;
     * both ways at once is JSD_ERR_INVALID. */
    const char *traceparent;
    const char *tracestate;
} jsd_effect;

/* Open a transaction. On PostgreSQL this sends nothing: BEGIN goes in one
 * pipeline with the transaction's first statement (so an emit-only
 * transaction costs two round trips), and a connection lost meanwhile shows
 * in that statement's status. */
JSD_EXTERN jsd_status jsd_tx_begin(jsd_tx **out, jsd_store *s);
/* The native handle for the application's own SQL inside the transaction:
 * NULL when the store is of the other kind. On PostgreSQL the first call
 * sends the transaction's BEGIN, if nothing did yet, and gives NULL when
 * that fails (the connection is lost; jsd_store_errmsg says so). */
JSD_EXTERN struct sqlite3 *jsd_tx_sqlite(jsd_tx *tx);
JSD_EXTERN struct pg_conn *jsd_tx_pg(jsd_tx *tx);
/* Record why a statement the application ran on jsd_tx_pg()'s connection
 * failed: its SQLSTATE (PQresultErrorField(res, PG_DIAG_SQLSTATE); NULL or
 * "" records nothing). Only whoever ran a statement holds its result, so
 * the library cannot read it otherwise; the durable consumer reads it after
 * a handler that did not commit, and a failure that is the store's, not the
 * message's, spends no delivery: 40001 (serialization) and 40P01 (deadlock)
 * apply the batch again at once; 55P03 (lock not available), 57014
 * (statement timeout, canceled) and 08xxx (connection) hold it like a store
 * outage (docs/CONSUMER.md, "Handler contention"). The last one recorded
 * counts; jsd_tx_begin clears it. On SQLite nothing is needed (the
 * consumer reads sqlite3_errcode) and this does nothing. */
JSD_EXTERN void jsd_tx_note_sqlstate(jsd_tx *tx, const char *sqlstate);
/* Add an outbox effect to the transaction. Emitting the same (owner, id)
 * twice is JSD_ERR_EXISTS, and the transaction stays usable. Limits (the
 * constants above; JSD_ERR_LIMIT when crossed, JSD_ERR_INVALID for malformed
 * input): subject <= 256 bytes, an exact subject of [A-Za-z0-9_-] tokens
 * separated by dots, not starting with the reserved "_INBOX" token ("$" is
 * outside the character set); owner, id and order_key <= 256 bytes of UTF-8
 * text; headers <= 16 with names <= 64 bytes of printable ASCII without ':'
 * (names starting "Nats-" are reserved), values 1..256 bytes without CR/LF
 * and without white space first or last (an empty tracestate is none),
 * and <= 3840 bytes together as encoded on the wire; payload <= payload_max
 * (256 KiB). Errors name the field and the limit and are read with
 * jsd_store_errmsg() on the transaction's store. */
JSD_EXTERN jsd_status jsd_tx_emit(jsd_tx *tx, const jsd_effect *e);
/* Emit n effects at once (one multi-row INSERT on PostgreSQL). All or none:
 * on failure no effect of the batch remains in the transaction and *bad_index
 * (may be NULL) names the offending effect; the transaction stays usable,
 * except on PostgreSQL when another transaction commits one of the batch's
 * identities while this one waits on it: then the transaction is aborted and
 * must be rolled back (JSD_ERR_EXISTS, the message says so). */
JSD_EXTERN jsd_status jsd_tx_emit_batch(jsd_tx *tx, const jsd_effect *e, size_t n,
                                        size_t *bad_index);
/* Commit and free tx. On failure nothing was committed and tx is freed. */
JSD_EXTERN jsd_status jsd_tx_commit(jsd_tx *tx);
/* Roll back and free tx. Accepts NULL. */
JSD_EXTERN void jsd_tx_rollback(jsd_tx *tx);

/* The Nats-Msg-Id of an effect emitted under namespace ns (jsd_store_namespace
 * of the emitting store): the lower-case hex SHA-256 of the length-delimited
 * parts ("jsdurable.effect.v2", ns, owner, id), each part hashed as its 8-byte
 * big-endian length then its bytes. NULL owner counts as "". out must hold
 * JSD_MSG_ID_MAX bytes. JSD_ERR_INVALID (no id, or ns not a valid
 * namespace), JSD_ERR_NOMEM / JSD_ERR_INTERNAL (the digest failed; out is "").
 * Effects committed before the store had a namespace keep the id stored with
 * them (docs/ARCHITECTURE.md, "Identity"). */
#define JSD_MSG_ID_MAX 65
JSD_EXTERN jsd_status jsd_effect_msg_id(const char *ns, const char *owner, const char *id,
                                        char out[JSD_MSG_ID_MAX]);

/* ---- status and retention -------------------------------------------------- */
typedef struct jsd_store_stats {
    int64_t backlog; /* unpublished, not dead-lettered effects */
    int64_t due;     /* of those, due now */
    /* age of the oldest unpublished effect whose not_before has passed (one
     * waiting out a retry delay included), 0 if none */
    int64_t oldest_due_age_ms;
    int64_t published;     /* effects with a receipt */
    int64_t dead_lettered; /* effects whose attempt budget was spent */
    int64_t inbox_rows;
    int64_t poison_records;
    int64_t poison_unpublished; /* of those, not (yet) in the dead-letter stream */
    int64_t replay_pending;     /* replay requests waiting for their durable (dlq.h) */
    int64_t replay_failed;      /* replay requests whose handler failed again */
} jsd_store_stats;

JSD_EXTERN jsd_status jsd_store_stats_get(jsd_store *s, jsd_store_stats *out);

/* Remove published effects (by published_at) and inbox rows (by created_at)
 * older than older_than_ms before now, at most batch rows of each per
 * transaction, until none is left. *removed counts rows. Dead-lettered effects
 * and poison records are evidence and are kept. Callers must keep
 * older_than_ms above the stream's duplicate window and the longest
 * redelivery time (the CLI refuses shorter horizons). Age is all it knows:
 * an inbox row of a delivery committed but never acknowledged goes too, and
 * the broker redelivers it to a consumer that then applies it again. Where
 * a consumer may be down longer than the horizon, remove inbox rows with
 * jsd_store_gc_inbox_step below each durable's ack floor instead (what
 * `jsdurable gc` does), and effects with jsd_store_gc_outbox_step. */
JSD_EXTERN jsd_status jsd_store_gc(jsd_store *s, int64_t older_than_ms, int batch,
                                   int64_t *removed);
/* One bounded transaction of jsd_store_gc: *removed == 0 means done. */
JSD_EXTERN jsd_status jsd_store_gc_step(jsd_store *s, int64_t older_than_ms, int batch,
                                        int64_t *removed);
/* One bounded transaction removing published effects only (at most batch),
 * as jsd_store_gc_step does: *removed == 0 means done. */
JSD_EXTERN jsd_status jsd_store_gc_outbox_step(jsd_store *s, int64_t older_than_ms, int batch,
                                               int64_t *removed);

/* The inbox rows older than a horizon, by (stream, durable). */
typedef struct jsd_inbox_aged {
    char *stream;
    char *durable; /* the consumer column: the durable's name */
    int64_t rows;  /* rows with created_at older than the horizon */
} jsd_inbox_aged;

/* Every (stream, durable) with inbox rows older than older_than_ms before
 * now, ordered by stream and durable. *out is an array of *n (NULL when
 * none); release it with jsd_inbox_aged_free. */
JSD_EXTERN jsd_status jsd_store_inbox_aged(jsd_store *s, int64_t older_than_ms,
                                           jsd_inbox_aged **out, size_t *n);
JSD_EXTERN void jsd_inbox_aged_free(jsd_inbox_aged *a, size_t n);

/* The inbox's high-water mark of (stream, durable): the highest stream
 * sequence its rows hold (rows retired to a negative sequence left out), 0
 * when it holds none. A durable re-created after it was lost resumes after
 * it (jsd_consumer_ensure_inbox). Outside any transaction. */
JSD_EXTERN jsd_status jsd_store_inbox_high_water(jsd_store *s, const char *stream,
                                                 const char *durable, uint64_t *seq);

/* The acknowledged floor of (stream, durable) recorded in the store
 * (schema 11, table jsd_durable_floor): the durable's ack_floor.stream_seq
 * as the server reported it, so every delivery at or below it was
 * acknowledged (applied, answered from the inbox, or parked). A running
 * consumer records it every few seconds and at a clean stop; `jsdurable gc`
 * records the floor it uses before it removes inbox rows under it. A durable
 * re-created after it was lost resumes after it (jsd_consumer_ensure_inbox,
 * jsd_consumer_redeliver_from_inbox).
 *
 * _record raises it (a lower floor leaves it as it is) and, when it rises,
 * stamps it with the time it was recorded. _get: *floor 0 and *recorded_at_ms
 * 0 when none is recorded (recorded_at_ms may be NULL). Both outside any
 * transaction. */
JSD_EXTERN jsd_status jsd_store_durable_floor_record(jsd_store *s, const char *stream,
                                                     const char *durable, uint64_t floor);
JSD_EXTERN jsd_status jsd_store_durable_floor_get(jsd_store *s, const char *stream,
                                                  const char *durable, uint64_t *floor,
                                                  int64_t *recorded_at_ms);

/* One bounded transaction removing at most batch inbox rows of (stream,
 * durable) older than older_than_ms whose stream sequence is at or below
 * max_seq: give the durable's ack floor (JetStream consumer info,
 * ack_floor.stream_seq), so that a delivery committed but not acknowledged
 * keeps the row its redelivery needs; INT64_MAX removes by age alone (a
 * durable the server no longer has, dropped by the operator). Rows retired
 * to a negative sequence (a stream's sequences reused) are below every
 * floor. *removed == 0 means done. */
JSD_EXTERN jsd_status jsd_store_gc_inbox_step(jsd_store *s, const char *stream, const char *durable,
                                              int64_t older_than_ms, int64_t max_seq, int batch,
                                              int64_t *removed);

#ifdef __cplusplus
}
#endif
#endif
