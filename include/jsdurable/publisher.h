/*
 * Stream binding and the bounded publisher with typed outcomes (PUB-1..7),
 * idempotency ids, and the tenant mapping table (SEC-1,2).
 *
 * A publisher is bound to one existing stream and one exact subject. Binding
 * checks, within the deadline, that the stream exists, uses file storage, has
 * publication acknowledgements on, and captures the subject; it records the
 * stream's duplicate window. The publisher never creates or changes a stream,
 * and never retries by itself: every publication ends in exactly one outcome,
 * and the caller decides what to do with UNKNOWN (retry with the same id
 * within the stream's duplicate window). docs/GUARANTEES.md says what each
 * outcome proves.
 */
#ifndef JSDURABLE_PUBLISHER_H
#define JSDURABLE_PUBLISHER_H

#include <stdbool.h>

#include "conn.h"
#include "store.h" /* jsd_header */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct jsd_publisher jsd_publisher;

/* Outcomes, in the order they are decided. */
#define JSD_OUTCOME_MAP(X)                                                                         \
    X(ACCEPTED, "accepted")       /* stored (or a duplicate of a stored one): receipt */           \
    X(RETRYABLE, "retryable")     /* admission full, before any I/O */                             \
    X(REJECTED, "rejected")       /* invalid input or a limit crossed, before any I/O */           \
    X(UNAVAILABLE, "unavailable") /* no connection before a possible write */                      \
    X(DENIED, "denied")           /* publish permission refused (broker or tenancy grant) */       \
    X(FAILED, "failed")           /* a broker answer that proves nothing was stored */             \
    X(UNKNOWN, "unknown")         /* after a possible write, not settled */

typedef enum jsd_outcome {
#define JSD__OUTCOME_ENUM(name, text) JSD_OUTCOME_##name,
    JSD_OUTCOME_MAP(JSD__OUTCOME_ENUM)
#undef JSD__OUTCOME_ENUM
        JSD__OUTCOME_COUNT
} jsd_outcome;

/* "accepted", "unknown", ...; "?" for an unknown value. */
JSD_EXTERN const char *jsd_outcome_str(jsd_outcome o);

/* ---- limits (PUB-2, PUB-6) ------------------------------------------------ */
#define JSD_ADMISSION_MAX   1024
#define JSD_DEADLINE_MAX_MS 300000
/* JSD_PAYLOAD_DEFAULT_CAP and JSD_HEADERS_MAX_BYTES come from store.h: one
 * set of limits for the store, the relay and the publisher. */
#define JSD_KEY_MAX        JSD_IDENT_MAX   /* message id, idempotency key */
#define JSD_ATTRS_MAX      JSD_HEADERS_MAX /* attributes per publication */
#define JSD_ATTR_NAME_MAX  JSD_HEADER_NAME_MAX
#define JSD_ATTR_VALUE_MAX JSD_HEADER_VALUE_MAX
/* Attributes travel as headers named JSD_ATTR_PREFIX + name. */
#define JSD_ATTR_PREFIX "Jsd-Attr-"
/* 64 hex characters and a NUL. */
#define JSD_IDEMPOTENCY_ID_SIZE 65

/*
 * Derive an idempotency id for callers without their own: the lower-case hex
 * SHA-256 over the length-delimited parts (namespace, tenant, topic, key).
 * Payload and attributes are not part of it, so one key must not be reused
 * for a different intended operation. NULL parts count as "". The key is
 * required; each part is at most JSD_KEY_MAX bytes (JSD_ERR_LIMIT).
 */
JSD_EXTERN jsd_status jsd_idempotency_id(const char *ns, const char *tenant, const char *topic,
                                         const char *key, char out[JSD_IDEMPOTENCY_ID_SIZE],
                                         jsd_error *err);

/* ---- binding ------------------------------------------------------------- */
typedef struct jsd_publisher_opts {
    const char *stream;  /* existing stream, one token of [A-Za-z0-9_-], <= 128 bytes */
    const char *subject; /* exact subject the stream captures, <= 256 bytes */
    int admission;       /* publications in flight, 1..1024; default 256 */
    int deadline_ms;     /* (0, 300000]: bounds the bind lookup and each
                            publish + acknowledgement; default 5000 */
    /* The duplicate window the caller relies on; when non-zero, binding fails
     * unless the stream's window is exactly this. 0: not checked (the window
     * is still read and recorded). */
    int64_t expected_duplicate_window_ms;
    /* Payload cap in bytes; 0 = min(256 KiB, the server's max_payload). At
     * most the server's max_payload. */
    size_t max_payload;
    /* When set, every payload must be one JSON value nested at most
     * JSD_JSON_DEPTH_MAX (8) deep; anything else is REJECTED before I/O. */
    bool json_payloads;
} jsd_publisher_opts;

JSD_EXTERN void jsd_publisher_opts_init(jsd_publisher_opts *o);

/*
 * Bind a publisher. Fails with JSD_ERR_INVALID (bad options or names),
 * JSD_ERR_NOT_FOUND (no such stream), JSD_ERR_BIND (the stream breaks a rule:
 * memory storage, no_ack, subject not captured, duplicate window differs),
 * JSD_ERR_TIMEOUT / JSD_ERR_CONNECT / JSD_ERR_NATS; err names the rule, e.g.
 * `stream "ORDERS" uses memory storage; bind needs file storage`. The options
 * are copied. The connection must outlive the publisher.
 */
JSD_EXTERN jsd_status jsd_publisher_bind(jsd_publisher **out, jsd_conn *conn,
                                         const jsd_publisher_opts *o, jsd_error *err);

/* Destroy. Publications still in flight are abandoned (their outcome is
 * unknown to the caller). Accepts NULL. */
JSD_EXTERN void jsd_publisher_destroy(jsd_publisher *p);

JSD_EXTERN const char *jsd_publisher_errmsg(const jsd_publisher *p);
JSD_EXTERN const char *jsd_publisher_stream(const jsd_publisher *p);
JSD_EXTERN const char *jsd_publisher_subject(const jsd_publisher *p);
/* The stream's duplicate window as read at binding, ms. */
JSD_EXTERN int64_t jsd_publisher_duplicate_window_ms(const jsd_publisher *p);
/* The payload cap in force, bytes. */
JSD_EXTERN size_t jsd_publisher_max_payload(const jsd_publisher *p);

/* ---- publishing ------------------------------------------------------------ */
typedef struct jsd_receipt {
    char stream[129];       /* the stream named by the acknowledgement (= the bound one) */
    uint64_t seq;           /* stream sequence, > 0 */
    bool duplicate;         /* the broker already held this message id */
    int64_t accepted_at_ms; /* local wall-clock time the ack was seen, unix ms */
} jsd_receipt;

typedef struct jsd_publish_result {
    jsd_outcome outcome;
    jsd_receipt receipt; /* ACCEPTED only */
    int nats_status;     /* natsStatus behind a failure, 0 if none */
    int js_err_code;     /* JetStream error code (10060 wrong expected stream), 0 if none */
    int status_code;     /* broker's answer code (503 no responders, 400, ...), 0 if none */
    char reason[256];    /* why, for anything but ACCEPTED; never holds payload or secrets */
} jsd_publish_result;

/*
 * Publish one message and wait for its outcome (at most the deadline, plus
 * scheduling). msg_id becomes Nats-Msg-Id unchanged: 1..256 bytes, no control
 * characters, no leading or trailing space. attrs (n_attrs <= 16) travel as
 * JSD_ATTR_PREFIX + name headers. Returns the outcome, also in res->outcome.
 * Not thread-safe: one thread per publisher.
 */
JSD_EXTERN jsd_outcome jsd_publish(jsd_publisher *p, const char *msg_id, const void *payload,
                                   size_t len, const jsd_header *attrs, size_t n_attrs,
                                   jsd_publish_result *res);

/*
 * The asynchronous pair, for many publications in flight. jsd_publish_submit
 * returns true when the publication was written (or buffered) and its result
 * will come from jsd_publisher_poll with the same user pointer; false when the
 * outcome was decided at once (RETRYABLE, REJECTED, UNAVAILABLE, or FAILED)
 * and is in *res.
 */
JSD_EXTERN bool jsd_publish_submit(jsd_publisher *p, const char *msg_id, const void *payload,
                                   size_t len, const jsd_header *attrs, size_t n_attrs, void *user,
                                   jsd_publish_result *res);

typedef struct jsd_publish_done {
    void *user;
    jsd_publish_result result;
} jsd_publish_done;

/* Collect up to max finished publications, waiting up to timeout_ms for the
 * first (0: do not wait; < 0: until one finishes, which every publication
 * does by its deadline). Returns 0 at once when nothing is in flight. Settles
 * expired publications and those whose connection was lost as UNKNOWN. With
 * many in flight it may wait up to 2 ms more to return a batch. Returns the
 * count. */
JSD_EXTERN size_t jsd_publisher_poll(jsd_publisher *p, jsd_publish_done *done, size_t max,
                                     int timeout_ms);
/* Publications submitted and not yet collected. */
JSD_EXTERN size_t jsd_publisher_inflight(const jsd_publisher *p);

/* ---- tenancy (SEC-1,2) --------------------------------------------------------
 * A table of at most 16 mappings (tenant, logical topic) -> (exact subject,
 * expected stream), and grants. A tenant publishes by topic and key; the
 * message id is jsd_idempotency_id(namespace, tenant, topic, key). The topic
 * never becomes a subject by itself.
 */
#define JSD_TENANCY_MAX 16

typedef struct jsd_tenancy jsd_tenancy;

typedef struct jsd_tenancy_opts {
    const char *ns;                       /* idempotency namespace; required */
    int admission;                        /* per mapping's publisher; default 256 */
    int deadline_ms;                      /* default 5000 */
    int64_t expected_duplicate_window_ms; /* 0: not checked */
} jsd_tenancy_opts;

JSD_EXTERN void jsd_tenancy_opts_init(jsd_tenancy_opts *o);

/* conn may be NULL: the table then validates mappings and grants only, and
 * publication is UNAVAILABLE. The options are copied. */
JSD_EXTERN jsd_status jsd_tenancy_create(jsd_tenancy **out, jsd_conn *conn,
                                         const jsd_tenancy_opts *o, jsd_error *err);
JSD_EXTERN void jsd_tenancy_destroy(jsd_tenancy *t);
JSD_EXTERN const char *jsd_tenancy_errmsg(const jsd_tenancy *t);

/*
 * Add a mapping. Refused (JSD_ERR_INVALID / JSD_ERR_EXISTS / JSD_ERR_LIMIT),
 * before any I/O, when: the tenant is not one token; the topic or subject has
 * wildcards, a "$" or "_INBOX" prefix or bad characters; (tenant, topic) is
 * already mapped; another tenant already maps the subject; the table is full.
 * With a connection, the mapping is then bound (jsd_publisher_bind rules). A
 * new mapping has no grant.
 */
JSD_EXTERN jsd_status jsd_tenancy_map(jsd_tenancy *t, const char *tenant, const char *topic,
                                      const char *subject, const char *stream);
/* Grant or revoke publication for a mapped (tenant, topic). */
JSD_EXTERN jsd_status jsd_tenancy_grant(jsd_tenancy *t, const char *tenant, const char *topic);
JSD_EXTERN jsd_status jsd_tenancy_revoke(jsd_tenancy *t, const char *tenant, const char *topic);

/*
 * Publish for a tenant. A missing mapping, or a missing or revoked grant, is
 * DENIED before any I/O; a bad key is REJECTED; otherwise as jsd_publish with
 * the derived message id.
 */
JSD_EXTERN jsd_outcome jsd_tenancy_publish(jsd_tenancy *t, const char *tenant, const char *topic,
                                           const char *key, const void *payload, size_t len,
                                           const jsd_header *attrs, size_t n_attrs,
                                           jsd_publish_result *res);

#ifdef __cplusplus
}
#endif
#endif
