/*
 * atomic — nats-server's atomic batch publish (2.12 and later): what a
 * server can do, asked of the server itself.
 *
 * An atomic batch is ordinary publications with three headers:
 * Nats-Batch-Id (one per attempt), Nats-Batch-Sequence (1, 2, ...) and
 * Nats-Batch-Commit: 1 on the last, whose reply is one PubAck with "batch"
 * and "count" for the whole batch: stored all or nothing, one fsync for all.
 * The stream must allow it (`allow_atomic`; err_code 10174 otherwise). A
 * batch that carries a Nats-Msg-Id was refused by 2.12.0 (err_code 10177,
 * "unsupported header"); later servers accept it and refuse a batch holding
 * an id the stream already has (10201). So the capability is probed, never
 * inferred from the version.
 */
#ifndef JSD_ATOMIC_H
#define JSD_ATOMIC_H

#include <stddef.h>

#include "jsd_int.h"

#define JSD__HDR_BATCH_ID     "Nats-Batch-Id"
#define JSD__HDR_BATCH_SEQ    "Nats-Batch-Sequence"
#define JSD__HDR_BATCH_COMMIT "Nats-Batch-Commit"

#define JSD__JS_ATOMIC_DISABLED 10174 /* the stream does not allow atomic batches */
#define JSD__JS_ATOMIC_UNSUPP_HDR                                                                  \
    10177 /* a header the batch may not carry (Nats-Msg-Id on 2.12.0) */
#define JSD__JS_ATOMIC_DUPLICATE 10201 /* the batch holds an id the stream already has */

typedef enum jsd__atomic_support {
    JSD__ATOMIC_UNKNOWN,  /* the probe could not be made (why says so) */
    JSD__ATOMIC_NONE,     /* the server has no atomic batches (before 2.12) */
    JSD__ATOMIC_NO_IDS,   /* atomic batches, but not with Nats-Msg-Id (2.12.0) */
    JSD__ATOMIC_WITH_IDS, /* atomic batches that carry Nats-Msg-Id */
} jsd__atomic_support;

/*
 * Ask the server: create a memory stream JSD_PROBE_<random> with
 * allow_atomic on a subject of its own (_jsd.probe.<random>), publish one
 * atomic batch of one message with a Nats-Msg-Id, read the answer, delete
 * the stream. Takes a few requests, each within the connection's request
 * timeout; a user without the right to create streams gets UNKNOWN. why
 * (cap bytes) says what was seen.
 */
jsd__atomic_support jsd__atomic_probe(jsd_conn *conn, char *why, size_t cap);

#endif
