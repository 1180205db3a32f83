/*
 * The doctor: checks of a deployment's settings that decide whether
 * effectively-once holds, made against the live servers and the store
 * (`jsdurable doctor`, and the start-up checks of `relay` and `consume`).
 *
 * Effectively-once rests on settings that live outside the code: the stream's
 * storage and replicas, its duplicate window against the relay's retry
 * horizon, the inbox retention against the longest redelivery, the
 * dead-letter stream, the server's fsync policy and the store's durability.
 * jsd_doctor_run() reads them and returns a list of results, one per check
 * and subject, each ok / unknown / warn / error with a message and a fix.
 * An error is a setting that can lose or double an acknowledged message; a
 * warning is a risk the operator should know of; unknown means the doctor
 * could not tell (it never guesses). docs/OPERATIONS.md ("doctor") lists
 * every check.
 */
#ifndef JSDURABLE_DOCTOR_H
#define JSDURABLE_DOCTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conn.h"
#include "relay.h"
#include "status.h"
#include "store.h"
#include "topology.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum jsd_doctor_level {
    JSD_DOCTOR_OK = 0,
    JSD_DOCTOR_UNKNOWN, /* could not be told (never guessed) */
    JSD_DOCTOR_WARN,
    JSD_DOCTOR_ERROR /* can lose or double acknowledged messages */
} jsd_doctor_level;

/* What a result is about. */
typedef enum jsd_doctor_kind {
    JSD_DOCTOR_STREAM = 0,
    JSD_DOCTOR_DURABLE,
    JSD_DOCTOR_SERVER,
    JSD_DOCTOR_STORE
} jsd_doctor_kind;

/* "ok", "unknown", "warn", "error"; "stream", "durable", "server", "store". */
JSD_EXTERN const char *jsd_doctor_level_str(jsd_doctor_level l);
JSD_EXTERN const char *jsd_doctor_kind_str(jsd_doctor_kind k);

/* One result. Strings are owned by the report. */
typedef struct jsd_doctor_result {
    /* The check's stable name, e.g. "stream.storage", "durable.inbox_retention",
     * "dlq.stream", "server.fsync", "store.synchronous" (the names an
     * --allow-unsafe list takes). */
    const char *check;
    jsd_doctor_kind kind;
    /* The thing checked: a stream name, "STREAM/DURABLE", the monitoring URL,
     * the store URL (password redacted). */
    const char *subject;
    jsd_doctor_level level;
    const char *message; /* what was found and what it means */
    const char *fix;     /* what to change; "" when nothing needs to */
} jsd_doctor_result;

typedef struct jsd_doctor_report jsd_doctor_report;

/* A durable to check, with the dead-letter subject its consumer uses. */
typedef struct jsd_doctor_durable {
    const char *stream;
    const char *durable;
    const char *dlq_subject; /* NULL: jsd.dlq.<stream>.<durable> */
    /* The ack wait the operator asked for (0: not known). The server keeps
     * only the one in force (a backoff list replaces it with its first
     * step), so this is what "durable.ack_wait" compares against. */
    int64_t ack_wait_ms;
} jsd_doctor_durable;

/* Groups of checks (jsd_doctor_opts.checks). */
/* storage, replicas (and, with the server's fsync policy known, replicas
 * on lazily syncing servers), discard policy, persist mode */
#define JSD_DOCTOR_CHECK_STREAMS 0x01u
/* What the relay's publishing needs of a stream: duplicate window >= its
 * retry horizon, max_msg_size >= the store's payload limit + headers;
 * allow_atomic where the server's atomic batches take message ids (with
 * JSD_DOCTOR_CHECK_PROBES; else only a stream that has it is reported). */
#define JSD_DOCTOR_CHECK_RELAY    0x02u
#define JSD_DOCTOR_CHECK_DURABLES 0x04u /* ack policy, ack wait, max_deliver, retention */
#define JSD_DOCTOR_CHECK_DLQ      0x08u /* the dead-letter stream */
/* the server's version (known data-loss releases) and its fsync policy
 * through the monitoring port */
#define JSD_DOCTOR_CHECK_SERVER 0x10u
#define JSD_DOCTOR_CHECK_STORE  0x20u /* store durability and schema version */
/* Checks that make something on the server to learn what it can do: the
 * atomic batch probe creates and deletes a memory stream JSD_PROBE_<random>.
 * `jsdurable doctor` runs them; the start-up checks of relay and consume
 * do not. */
#define JSD_DOCTOR_CHECK_PROBES 0x40u
#define JSD_DOCTOR_CHECK_ALL    0x7fu

typedef struct jsd_doctor_opts {
    unsigned checks; /* JSD_DOCTOR_CHECK_* bits; default ALL */
    /* The relay's timings, for its retry horizon (publish deadline + backoff
     * cap + lease + poll interval). NULL: jsd_relay_opts_init's defaults.
     * Borrowed for the call. */
    const jsd_relay_opts *relay;
    /* Streams to check, by name. */
    const char *const *streams;
    size_t n_streams;
    /* Durables to check (their streams are checked too). */
    const jsd_doctor_durable *durables;
    size_t n_durables;
    /* A parsed topology: its streams, consumers and dead-letter stream are
     * checked as if named above (borrowed). */
    const jsd_topology *topology;
    /* Also check the streams that capture the subjects of the store's
     * unpublished effects (up to 64 distinct subjects): the streams a relay
     * is about to publish to. Needs a store. */
    bool outbox_streams;
    /* The inbox retention `jsdurable gc` is run with (0: rows are kept for
     * ever); default 7 days, as jsd_consumer_opts. */
    int64_t inbox_retention_ms;
    /* The server's HTTP monitoring address ("http://host:8222"), read for
     * its fsync policy (GET /varz). NULL: the fsync policy is "unknown". */
    const char *monitor_url;
    int monitor_timeout_ms; /* default 5000 */
} jsd_doctor_opts;

JSD_EXTERN void jsd_doctor_opts_init(jsd_doctor_opts *o);

/*
 * Run the checks o selects. store and conn may be NULL: the checks that need
 * them are then left out (no result), except that a stream or durable check
 * without a connection is an "unknown" result. A check that cannot be made
 * (a server that does not answer, a stream that cannot be read) is an
 * "unknown" or, when the thing is missing, an "error" result, never a failed
 * run. Returns JSD_OK with *out set (free with jsd_doctor_report_destroy),
 * JSD_ERR_INVALID for bad options (err says which), JSD_ERR_NOMEM.
 * Makes requests on conn and, on the store, read-only queries; the store
 * must have no transaction open.
 */
JSD_EXTERN jsd_status jsd_doctor_run(jsd_doctor_report **out, jsd_store *store, jsd_conn *conn,
                                     const jsd_doctor_opts *o, jsd_error *err);

/* Accepts NULL. */
JSD_EXTERN void jsd_doctor_report_destroy(jsd_doctor_report *r);
JSD_EXTERN size_t jsd_doctor_report_count(const jsd_doctor_report *r);
/* The i-th result (in the order the checks ran), NULL past the end. */
JSD_EXTERN const jsd_doctor_result *jsd_doctor_report_at(const jsd_doctor_report *r, size_t i);
/* The worst level of all results (JSD_DOCTOR_OK for an empty report). */
JSD_EXTERN jsd_doctor_level jsd_doctor_report_worst(const jsd_doctor_report *r);

/*
 * Whether a check name is on an override list: allow is a comma-separated
 * list of check names ("stream.storage,server.fsync") or "all"; NULL or ""
 * allows nothing. Used by relay and consume to run despite an error that
 * the operator accepted by name.
 */
JSD_EXTERN bool jsd_doctor_allowed(const char *allow, const char *check);
/* Whether every name on an override list is a known check name; false with
 * the first unknown one in bad (cap bytes) when not. */
JSD_EXTERN bool jsd_doctor_allow_valid(const char *allow, char *bad, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
