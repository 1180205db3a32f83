/*
 * Declarative topology: the streams, durable pull consumers and the
 * dead-letter stream an application needs, read from a JSON file and applied
 * to JetStream (TOPO-1,2, DLQ-3). docs/TOPOLOGY.md describes the file.
 *
 * jsd_topology_parse() validates the whole file before anything touches a
 * server: unknown keys, bad durations, out-of-range limits and overlapping
 * subjects are refused with a message that starts with the key path in the
 * file, e.g. `streams[1].subjects[0]: wildcard ">" must be the last token`.
 *
 * jsd_topology_apply() plans every change first (reading the server's streams
 * and consumers) and only then acts, so a refused plan changes nothing. Two
 * policies:
 *   JSD_TOPOLOGY_CREATE     create what is missing; an existing object is kept as
 *                       the operator tuned it (its differences are reported
 *                       as "kept").
 *   JSD_TOPOLOGY_RECONCILE  create what is missing and update what differs;
 *                       a field JetStream cannot change in place (storage,
 *                       retention; a consumer's deliver or ack policy) is a
 *                       JSD_ERR_CONFIG naming the field, never a silent
 *                       delete and re-create.
 * A dry run reports the same plan and changes nothing.
 */
#ifndef JSDURABLE_TOPOLOGY_H
#define JSDURABLE_TOPOLOGY_H

#include <stdbool.h>

#include "conn.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct jsd_topology jsd_topology;

/* Limits of the file format (each refused with a clear error past it). */
#define JSD_TOPOLOGY_FILE_MAX      (1024 * 1024) /* bytes of JSON */
#define JSD_TOPOLOGY_STREAMS_MAX   64
#define JSD_TOPOLOGY_CONSUMERS_MAX 256
#define JSD_TOPOLOGY_SUBJECTS_MAX  64 /* per stream */
#define JSD_TOPOLOGY_BACKOFF_MAX   32 /* steps per consumer */
#define JSD_TOPOLOGY_REPLICAS_MAX  5

typedef enum jsd_topology_storage {
    JSD_TOPOLOGY_FILE = 0,
    JSD_TOPOLOGY_MEMORY
} jsd_topology_storage;
typedef enum jsd_topology_retention {
    JSD_TOPOLOGY_LIMITS = 0,
    JSD_TOPOLOGY_INTEREST,
    JSD_TOPOLOGY_WORKQUEUE
} jsd_topology_retention;
typedef enum jsd_topology_discard {
    JSD_TOPOLOGY_DISCARD_OLD = 0,
    JSD_TOPOLOGY_DISCARD_NEW
} jsd_topology_discard;

/* A stream as the file declares it, defaults filled in. -1 means unlimited
 * for max_msgs, max_bytes, max_msgs_per_subject; 0 means unlimited for
 * max_age_ms. */
typedef struct jsd_topology_stream {
    const char *name;
    const char *description; /* NULL when absent */
    const char *const *subjects;
    size_t n_subjects;
    jsd_topology_storage storage;
    jsd_topology_retention retention;
    int64_t max_age_ms;
    int64_t max_bytes;
    int64_t max_msgs;
    int64_t max_msgs_per_subject;
    jsd_topology_discard discard;
    int64_t duplicate_window_ms; /* default: 2 min, or max_age when shorter */
    int replicas;                /* 1..5, default 1 */
    bool dead_letter;            /* declared as the file's "dead_letter" */
    /* "allow_atomic": 1 or 0 as the file says, -1 when it does not say (the
     * server's setting stands). Atomic batch publish, nats-server 2.12+. */
    int allow_atomic;
    /* "persist_mode": "default" when the file says so, NULL when it does not
     * ("async", which acknowledges before storing, is refused). 2.12+. */
    const char *persist_mode;
} jsd_topology_stream;

/* A durable pull consumer with explicit acks, delivering all of its stream. */
typedef struct jsd_topology_consumer {
    const char *stream;
    const char *durable;
    const char *description;    /* NULL when absent */
    const char *filter_subject; /* NULL: the whole stream */
    int64_t ack_wait_ms;        /* default 30 s */
    int64_t max_deliver;        /* -1 unlimited (default) */
    const int64_t *backoff_ms;  /* redelivery delays; n_backoff 0 = none */
    size_t n_backoff;
    int64_t max_ack_pending;       /* default 1000 */
    int64_t inactive_threshold_ms; /* 0 = never removed (default) */
} jsd_topology_consumer;

/* Parse and validate a topology held in memory (len bytes, need not be
 * NUL-terminated). On failure *out is NULL and err says why, starting with
 * the key path. JSD_ERR_CONFIG for a refused file, JSD_ERR_LIMIT when it is
 * larger than JSD_TOPOLOGY_FILE_MAX, JSD_ERR_NOMEM. */
JSD_EXTERN jsd_status jsd_topology_parse(jsd_topology **out, const char *json, size_t len,
                                         jsd_error *err);
/* Read and parse a file. JSD_ERR_IO when it cannot be read; the error names
 * the path. */
JSD_EXTERN jsd_status jsd_topology_load(jsd_topology **out, const char *path, jsd_error *err);
/* Accepts NULL. */
JSD_EXTERN void jsd_topology_destroy(jsd_topology *t);

/* The parsed objects, in file order; the dead-letter stream (if any) comes
 * after the file's "streams". Valid until jsd_topology_destroy. */
JSD_EXTERN size_t jsd_topology_stream_count(const jsd_topology *t);
JSD_EXTERN const jsd_topology_stream *jsd_topology_stream_at(const jsd_topology *t, size_t i);
JSD_EXTERN size_t jsd_topology_consumer_count(const jsd_topology *t);
JSD_EXTERN const jsd_topology_consumer *jsd_topology_consumer_at(const jsd_topology *t, size_t i);
/* The dead-letter stream, or NULL when the file declares none. */
JSD_EXTERN const jsd_topology_stream *jsd_topology_dead_letter(const jsd_topology *t);

/* True when some subject matches both patterns ("*" one token, ">" one or
 * more trailing tokens). Both must be well-formed. */
JSD_EXTERN bool jsd_subjects_overlap(const char *a, const char *b);

/* ---- applying ------------------------------------------------------------ */
typedef enum jsd_topology_policy {
    JSD_TOPOLOGY_CREATE = 0,
    JSD_TOPOLOGY_RECONCILE
} jsd_topology_policy;

typedef enum jsd_topology_action {
    JSD_TOPOLOGY_CREATED = 0, /* did not exist; created (or would be, on a dry run) */
    JSD_TOPOLOGY_UNCHANGED,   /* exists and matches the file */
    JSD_TOPOLOGY_KEPT,        /* exists, differs, left as it is (create policy) */
    JSD_TOPOLOGY_UPDATED      /* exists, differed, updated (or would be) */
} jsd_topology_action;

/* "created", "unchanged", "kept", "updated" */
JSD_EXTERN const char *jsd_topology_action_str(jsd_topology_action a);

/* One field that differs between the server and the file. */
typedef struct jsd_topology_change {
    const char *field; /* the file's key, e.g. "max_msgs" */
    char server[96];   /* the server's value as text */
    char file[96];     /* the file's value as text */
} jsd_topology_change;

typedef struct jsd_topology_report {
    const char *kind; /* "stream" or "consumer" */
    const char *name; /* "ORDERS", or "ORDERS/shipping" for a consumer */
    jsd_topology_action action;
    bool dry_run; /* nothing was changed */
    const jsd_topology_change *changes;
    size_t n_changes;
} jsd_topology_report;

/* Called once per object, in the order of the file (streams, then
 * consumers), on the caller's thread. The report is valid during the call. */
typedef void (*jsd_topology_report_fn)(const jsd_topology_report *r, void *user);

typedef struct jsd_topology_apply_opts {
    jsd_topology_policy policy;
    bool dry_run;
    int timeout_ms;                /* deadline of each JetStream request; 0 = the connection's */
    jsd_topology_report_fn report; /* optional */
    void *user;
} jsd_topology_apply_opts;

JSD_EXTERN void jsd_topology_apply_opts_init(jsd_topology_apply_opts *o);

/*
 * Apply a topology over an open connection. Plans first, acts second: a plan
 * that is refused (a field that cannot change, a subject that overlaps an
 * existing stream outside the file, a consumer that is a push consumer) returns
 * JSD_ERR_CONFIG and changes nothing. Server refusals while acting return
 * JSD_ERR_NATS (or JSD_ERR_TIMEOUT) with the server's text; objects already
 * handled stay as they are and were reported. Not thread-safe for one conn
 * while another thread applies another topology.
 */
JSD_EXTERN jsd_status jsd_topology_apply(jsd_conn *c, const jsd_topology *t,
                                         const jsd_topology_apply_opts *o, jsd_error *err);

#ifdef __cplusplus
}
#endif
#endif
