/*
 * Private interface shared by the ingress files: consumer.c (fetch, batch
 * transaction, settlement), envelope.c (typed envelope checks) and
 * deadletter.c (death envelopes, dead-letter stream, replay).
 */
#ifndef JSD_INGRESS_INT_H
#define JSD_INGRESS_INT_H

#include <nats/nats.h>

#include "jsd_int.h"

/* ---- envelope.c ------------------------------------------------------------- */

/* True when [p, p+len) is exactly one JSON value (RFC 8259, UTF-8 not
 * re-validated) whose arrays/objects nest at most max_depth deep. On false,
 * why (cap bytes) says what is wrong and at which byte offset. No allocation. */
bool jsd__json_valid(const void *p, size_t len, int max_depth, char *why, size_t cap);

/* Decide whether a delivery's envelope is acceptable: its type (NULL or ""
 * when the Jsd-Type header is absent) must be in types (any type when
 * n_types == 0; with a list an absent type is refused), and its payload must
 * parse as the format requires. false = poison, with the diagnostic in why. */
bool jsd__envelope_check(const char *type, const void *payload, size_t len,
                         const char *const *types, size_t n_types, jsd_payload_format fmt,
                         char *why, size_t cap);

/* ---- deadletter.c --------------------------------------------------------------- */

typedef struct jsd__death {
    const char *subject;  /* original subject */
    const char *stream;   /* original stream */
    const char *consumer; /* durable that gave up */
    uint64_t stream_seq;
    uint64_t deliveries;
    const char *reason; /* "poison" or "max_deliver" */
    const char *error;  /* last error / diagnostic (may be NULL) */
    const char *msg_id; /* original Nats-Msg-Id (may be NULL) */
    const char *type;   /* original Jsd-Type (may be NULL) */
    const void *payload;
    size_t len;
    int64_t time_ms; /* when it was declared dead (unix ms) */
} jsd__death;

/* Publish one death envelope to dlq_subject, expecting dlq_stream, with the
 * stable Nats-Msg-Id jsd_death_msg_id(stream, seq), and wait up to timeout_ms
 * for the PubAck. A duplicate PubAck is success (an earlier attempt stored
 * it). *dlq_seq (may be NULL) receives the DLQ stream sequence. */
jsd_status jsd__death_publish(jsCtx *js, const char *dlq_subject, const char *dlq_stream,
                              const jsd__death *d, int timeout_ms, uint64_t *dlq_seq,
                              jsd_error *err);

/* Find the stream capturing subject; JSD_ERR_NOT_FOUND when none does. */
jsd_status jsd__stream_for_subject_js(jsCtx *js, const char *subject, char *out, size_t cap,
                                      jsd_error *err);

#endif
