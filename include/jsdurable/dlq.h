/*
 * Dead letters (DLQ-1..3): the death envelope a consumer publishes for a
 * delivery it parks or poisons, and the operator's tools over the
 * dead-letter stream (read, range, replay, delete, purge; what `jsdurable dlq`
 * runs). The functions are jsd_dlq_*; one dead letter read back is a
 * jsd_dead_letter. The consumer that buries dead letters is in consumer.h
 * (its dlq_subject option and jsd_consumer_dlq_subject/_stream).
 */
#ifndef JSDURABLE_DLQ_H
#define JSDURABLE_DLQ_H

#include "conn.h"
#include "status.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- death envelopes (DLQ-1..3) ------------------------------------------------
 * Header names a death envelope carries; the body is the original payload,
 * verbatim. Its Nats-Msg-Id is derived from (stream, consumer, stream
 * sequence), so a repeated park or poison of one delivery by one durable is
 * one message in the DLQ stream, and each durable that parks a message has
 * its own. */
#define JSD_HDR_DLQ_SUBJECT    "Jsd-Dlq-Subject"
#define JSD_HDR_DLQ_STREAM     "Jsd-Dlq-Stream"
#define JSD_HDR_DLQ_CONSUMER   "Jsd-Dlq-Consumer"
#define JSD_HDR_DLQ_SEQ        "Jsd-Dlq-Stream-Seq"
#define JSD_HDR_DLQ_DELIVERIES "Jsd-Dlq-Deliveries"
#define JSD_HDR_DLQ_REASON     "Jsd-Dlq-Reason" /* "poison" or "max_deliver" */
#define JSD_HDR_DLQ_ERROR      "Jsd-Dlq-Error"
#define JSD_HDR_DLQ_TIME       "Jsd-Dlq-Time" /* RFC 3339 UTC */
#define JSD_HDR_DLQ_MSG_ID     "Jsd-Dlq-Msg-Id"
#define JSD_HDR_DLQ_TYPE       "Jsd-Dlq-Type"
#define JSD_HDR_REPLAY_OF      "Jsd-Replay-Of"

/* The death envelope's Nats-Msg-Id for message seq of stream parked by the
 * durable consumer; out holds 65 bytes. JSD_OK, or JSD_ERR_NOMEM /
 * JSD_ERR_INTERNAL (the digest failed; out is ""). (Before 0.2 the id left
 * the consumer out: two durables parking one message got one dead letter.) */
JSD_EXTERN jsd_status jsd_dlq_msg_id(const char *stream, const char *consumer, uint64_t seq,
                                     char out[65]);

/*
 * Republish one dead letter (`jsdurable dlq replay --republish`): fetch
 * message dlq_seq of dlq_stream, republish its verbatim body to its original
 * subject (from its headers) with a new Nats-Msg-Id and Jsd-Replay-Of:
 * "<dlq_stream>:<dlq_seq>", wait for the PubAck. *new_seq (may be NULL)
 * receives the stream sequence it got. The new message reaches EVERY
 * consumer of the stream that captures the subject, not only the durable
 * that parked it: each that had applied the original applies it again. To
 * reach only that durable, use jsd_dlq_replay_request.
 */
JSD_EXTERN jsd_status jsd_dlq_replay(jsd_conn *conn, const char *dlq_stream, uint64_t dlq_seq,
                                     uint64_t *new_seq, jsd_error *err);

/* ---- replay to the durable that parked it ----------------------------------------
 * A replay request is a row in the store of the durable that parked the
 * message (its inbox and poison record live there): that durable's consumer
 * (jsd_consumer_run / _poll, at start and then every second) applies the
 * poison record's payload through its handler, in one transaction with the
 * inbox row turned to "applied" and the request completed; no message is
 * published, so no other consumer of the stream sees it again. A request of
 * a message already applied completes without calling the handler. A
 * handler that fails again marks the request failed with its reason (shown
 * by `jsdurable status`); asking again makes it pending again. */
typedef enum jsd_replay_state {
    JSD_REPLAY_PENDING = 0,
    JSD_REPLAY_APPLIED = 1,
    JSD_REPLAY_FAILED = 2
} jsd_replay_state;

typedef struct jsd_replay_request {
    int64_t id;
    char stream[257];   /* the original stream */
    char consumer[257]; /* the durable that parked it, and the only one it reaches */
    uint64_t stream_seq;
    char dlq_stream[257]; /* the dead letter it came from */
    uint64_t dlq_seq;
    jsd_replay_state state;
    char detail[1025]; /* why it failed, or how it was applied */
    int64_t requested_at_ms;
    int64_t done_at_ms; /* 0 while pending */
} jsd_replay_request;

/* "pending", "applied", "failed". */
JSD_EXTERN const char *jsd_replay_state_name(jsd_replay_state s);

/*
 * Ask the durable that parked dead letter dlq_seq of dlq_stream to apply it
 * again. Reads the death envelope (its stream, stream sequence and durable),
 * checks that store holds that durable's poison record of it (JSD_ERR_CONFIG
 * naming the durable otherwise: the store given is not that durable's), and
 * records the request. Idempotent: a request already pending or applied is
 * left as it is (*queued false); a failed one is made pending again (*queued
 * true). out (may be NULL) receives the request as it stands. JSD_ERR_INVALID
 * when the message is not a death envelope, JSD_ERR_NOT_FOUND when there is
 * no message dlq_seq.
 */
JSD_EXTERN jsd_status jsd_dlq_replay_request(jsd_conn *conn, const char *dlq_stream,
                                             uint64_t dlq_seq, jsd_store *store,
                                             jsd_replay_request *out, bool *queued, jsd_error *err);

/* The replay requests of store not applied (pending and failed) with id >
 * after_id, at most cap of them, in id order; *n says how many. */
JSD_EXTERN jsd_status jsd_dlq_replay_list(jsd_store *store, int64_t after_id,
                                          jsd_replay_request *out, size_t cap, size_t *n,
                                          jsd_error *err);

/* ---- dead-letter tools (DLQ-3) ------------------------------------------------ */
typedef struct jsd_dead_letter {
    uint64_t dlq_seq; /* its sequence in the dead-letter stream */
    char *subject;    /* original subject ("" when not a death envelope) */
    char *stream;     /* original stream */
    char *consumer;   /* durable that buried it */
    uint64_t stream_seq;
    uint64_t deliveries;
    char *reason; /* "poison" or "max_deliver" */
    char *error;
    char *time; /* RFC 3339 */
    char *msg_id;
    char *type;
    void *payload; /* verbatim original bytes */
    size_t len;
} jsd_dead_letter;

/* Free the strings of a dead letter (the struct itself is the caller's). */
JSD_EXTERN void jsd_dead_letter_clear(jsd_dead_letter *d);
/* Read message seq of the dead-letter stream. JSD_ERR_NOT_FOUND when it is
 * absent (deleted, purged, out of range). */
JSD_EXTERN jsd_status jsd_dlq_get(jsd_conn *conn, const char *dlq_stream, uint64_t seq,
                                  jsd_dead_letter *out, jsd_error *err);
/* First and last sequence and message count of the dead-letter stream. */
JSD_EXTERN jsd_status jsd_dlq_range(jsd_conn *conn, const char *dlq_stream, uint64_t *first,
                                    uint64_t *last, uint64_t *count, jsd_error *err);
/* Remove one dead letter, or all of them. */
JSD_EXTERN jsd_status jsd_dlq_delete(jsd_conn *conn, const char *dlq_stream, uint64_t seq,
                                     jsd_error *err);
JSD_EXTERN jsd_status jsd_dlq_purge(jsd_conn *conn, const char *dlq_stream, jsd_error *err);

#ifdef __cplusplus
}
#endif
#endif
