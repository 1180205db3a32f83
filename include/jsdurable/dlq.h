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

#ifdef __cplusplus
extern "C" {
#endif

/* ---- death envelopes (DLQ-1..3) ------------------------------------------------
 * Header names a death envelope carries; the body is the original payload,
 * verbatim. Its Nats-Msg-Id is derived from (stream, stream sequence), so a
 * repeated park or poison of one delivery is one message in the DLQ stream. */
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

/* The death envelope's Nats-Msg-Id for (stream, seq); out holds 65 bytes.
 * JSD_OK, or JSD_ERR_NOMEM / JSD_ERR_INTERNAL (the digest failed; out is ""). */
JSD_EXTERN jsd_status jsd_dlq_msg_id(const char *stream, uint64_t seq, char out[65]);

/*
 * Replay one dead letter: fetch message dlq_seq of dlq_stream, republish its
 * verbatim body to its original subject (from its headers) with a new
 * Nats-Msg-Id and Jsd-Replay-Of: "<dlq_stream>:<dlq_seq>", wait for the
 * PubAck. *new_seq (may be NULL) receives the stream sequence it got.
 */
JSD_EXTERN jsd_status jsd_dlq_replay(jsd_conn *conn, const char *dlq_stream, uint64_t dlq_seq,
                                     uint64_t *new_seq, jsd_error *err);

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
