/*
 * pubengine — the asynchronous publication engine under the bounded publisher
 * and the relay: many JetStream publications in flight on one connection, each
 * settled into exactly one typed outcome (jsd_outcome), none retried.
 *
 * It does not use js_PublishAsync (nats.c 3.4.1 stalls for ever when the
 * connection dies with publishes in flight, shows sequences and duplicates
 * only inside a handler, and reports success from PublishAsyncComplete when
 * some failed). Instead each engine subscribes once to a private reply
 * prefix "_INBOX.<random>.*" and publishes every message with its own reply
 * subject "_INBOX.<random>.<id>" and the headers Nats-Msg-Id and
 * Nats-Expected-Stream (and, when asked, Nats-Expected-Last-Subject-Sequence).
 * A table of in-flight entries (at most the admission bound) is keyed by id.
 *
 * How an outcome is decided (docs/GUARANTEES.md is the user-facing version):
 *   RETRYABLE    admission full: nothing was done.
 *   REJECTED     invalid subject/stream/id/headers, or a limit crossed
 *                (payload cap, headers > 4 KiB, server max_payload): nothing
 *                was done.
 *   UNAVAILABLE  not connected when the publication would have been written,
 *                or nats.c refused the write before buffering it.
 *   DENIED       the server reported "Permissions Violation for Publish to
 *                <subject>" while a publication to that subject was in flight.
 *   FAILED       a reply proving nothing was stored: no responders (status
 *                503: no stream captures the subject) or a JetStream error with
 *                a 4xx code (e.g. 10060 wrong expected stream); the codes are
 *                kept in the result.
 *   ACCEPTED     a reply {"stream":S,"seq":N[,"duplicate":true]} with S the
 *                expected stream and N > 0: the receipt.
 *   UNKNOWN      after a possible write and not settled: the deadline passed,
 *                the connection was lost or replaced while it was in flight, a
 *                5xx/unknown JetStream error, or a malformed or foreign reply.
 *                The message may be stored; retry with the same id within the
 *                stream's duplicate window.
 *
 * Threads: submit, poll and destroy belong to one owner thread. nats.c's
 * subscription and error callbacks read a reply without touching shared
 * state and only hand the result over under the engine's lock; the outcome is
 * decided on the owner thread, in poll. inflight() may be called from any
 * thread.
 */
#ifndef JSD_PUBENGINE_H
#define JSD_PUBENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jsd_int.h"

typedef struct jsd__pubengine jsd__pubengine;

typedef struct jsd__pubengine_opts {
    int admission;      /* 1..1024 entries in flight (including finished, not yet polled) */
    int deadline_ms;    /* (0, 300000]: default per-publication wait for the reply */
    size_t max_payload; /* payload cap; 0 = min(256 KiB, server max_payload) */
} jsd__pubengine_opts;

/* One publication. Strings are copied by submit (the caller may free them
 * when submit returns). */
typedef struct jsd__pub_req {
    const char *subject;         /* exact subject (jsd__subject_valid_exact) */
    const char *expected_stream; /* becomes Nats-Expected-Stream; required */
    const char *msg_id;          /* becomes Nats-Msg-Id unchanged; 1..256 bytes */
    /* Extra headers, sent verbatim after the reserved ones. Names starting
     * with "Nats-" (any case) are REJECTED; the caller owns its own prefixes
     * (the public publisher sends attributes as "Jsd-Attr-<name>"). */
    const jsd_header *headers;
    size_t n_headers;
    const void *payload;
    size_t len;
    int deadline_ms; /* 0 = the engine's default; else (0, 300000] */
    /* When has_expected_last_subject_seq, Nats-Expected-Last-Subject-Sequence
     * is sent (0 = "no message on this subject yet"); a mismatch is FAILED
     * with js_err_code 10071. */
    bool has_expected_last_subject_seq;
    uint64_t expected_last_subject_seq;
    void *user; /* handed back with the outcome */
} jsd__pub_req;

/*
 * Create an engine on conn: validates the options, subscribes to its private
 * reply prefix and registers for the connection's asynchronous errors.
 * JSD_ERR_INVALID (options), JSD_ERR_CONNECT / JSD_ERR_NATS (subscribe).
 * The connection must outlive the engine.
 */
jsd_status jsd__pubengine_create(jsd__pubengine **out, jsd_conn *conn, const jsd__pubengine_opts *o,
                                 jsd_error *err);

/* Unsubscribe and free. Entries still in flight are dropped without an
 * outcome (the caller abandoned them). Accepts NULL. */
void jsd__pubengine_destroy(jsd__pubengine *e);

/*
 * Submit one publication. Returns true when it was written (or buffered by
 * nats.c) and its outcome will come out of jsd__pubengine_poll with req->user.
 * Returns false when the outcome was decided at once and is in *res:
 * RETRYABLE (admission full), REJECTED (input or limits), UNAVAILABLE (not
 * connected, or the write refused before buffering) or UNKNOWN (nats.c failed
 * mid-write). res may not be NULL.
 */
bool jsd__pubengine_submit(jsd__pubengine *e, const jsd__pub_req *req, jsd_publish_result *res);

/*
 * Submit n publications (1..JSD__BATCH_MAX, all with the same
 * expected_stream) as one atomic batch (src/atomic.h): a fresh Nats-Batch-Id
 * for this attempt, Nats-Batch-Sequence 1..n, Nats-Batch-Commit on the
 * last; each keeps its Nats-Msg-Id and Nats-Expected-Stream (nats-server
 * 2.15.1 checks the latter inside a batch: a wrong stream refuses the batch
 * with 10060). The first publication carries a reply subject of its own,
 * whose empty answer (the server's flow control) is dropped and whose error
 * (10210 too many batches in flight comes there, and the commit is then
 * answered 10176 incomplete) decides the batch; the commit's reply is the
 * batch's one PubAck. The batch takes one admission slot and settles as one
 * outcome with user: ACCEPTED with receipt.seq the last publication's
 * sequence (publication i, from 0, is seq - n + 1 + i) once the PubAck
 * names this batch id and count n; else FAILED/UNKNOWN/DENIED as for one
 * publication, for the batch as a whole (nothing of a FAILED batch was
 * stored). Returns false with the outcome in *res (as submit), and for a
 * REJECTED batch *bad_idx is the publication that was refused (the others
 * may be fine: publish them alone). A write that fails after the first
 * publication and before the commit is UNAVAILABLE: without its commit the
 * server stores nothing of the batch.
 */
#define JSD__BATCH_MAX 1000 /* the server's limit (err_code 10199 beyond) */
bool jsd__pubengine_submit_batch(jsd__pubengine *e, const jsd__pub_req *reqs, size_t n, void *user,
                                 jsd_publish_result *res, size_t *bad_idx);

/*
 * Move up to max finished publications into done[] (user pointer + result),
 * oldest completion first. Settles entries whose deadline passed and, when
 * the connection was lost or replaced since they were written, entries in
 * flight, as UNKNOWN. Waits up to timeout_ms (0: do not wait; < 0: until at
 * least one finishes; in flight entries always finish by their deadline) for
 * the first one. Returns how many were moved; each frees one admission slot.
 */
size_t jsd__pubengine_poll(jsd__pubengine *e, jsd_publish_done *done, size_t max, int timeout_ms);

/* Entries submitted and not yet returned by poll. Thread-safe. */
size_t jsd__pubengine_inflight(const jsd__pubengine *e);
/* The admission bound and the payload cap in force. */
size_t jsd__pubengine_capacity(const jsd__pubengine *e);
size_t jsd__pubengine_max_payload(const jsd__pubengine *e);

/* Counters since creation (thread-safe): replies that matched no in-flight
 * entry (late, after their deadline, or foreign). */
uint64_t jsd__pubengine_late_replies(const jsd__pubengine *e);

/* How a reply body (and its Status header value, or NULL) would settle a
 * publication that expects expected_stream: the same reading and rules as
 * the engine, without a connection. For fuzzing and tests. */
jsd_outcome jsd__pubengine_judge_reply(const void *data, size_t len, const char *status,
                                       const char *expected_stream, jsd_publish_result *res);

/*
 * Whether a FAILED outcome's JetStream error is permanent: no retry of the
 * same message can succeed, so the relay dead-letters it at once instead of
 * spending its attempt budget (and holding its ordering key) on it:
 *   10054 message size exceeds the stream's max_msg_size
 *   10097 headers exceed the server's 64 KiB limit
 * Everything else is retried: 503 / no responders (no stream yet, or a leader
 * election), 10060 wrong expected stream (the relay's stream cache may be
 * stale: it looks again), 10077 store failed (e.g. a full stream with discard
 * new: room may come), 10047 storage resources, 10109 sealed stream (it may be
 * deleted and re-created), and any code not listed here.
 */
bool jsd__js_err_permanent(int js_err_code);

/* ---- admission: one check, one set of codes ------------------------------------- */

/*
 * The admission bound and default deadline every publishing handle takes
 * (jsd_publisher_opts, jsd_tenancy_opts, the engine itself): JSD_ERR_INVALID
 * with "admission N is outside 1..1024" or "deadline N ms is outside (0,
 * 300000] ms" as include/jsdurable/publisher.h documents, JSD_OK otherwise.
 */
jsd_status jsd__admission_check(int admission, int deadline_ms, jsd_error *err);

/* Fill res as RETRYABLE "admission full" for a handle holding cap
 * publications in flight: the one answer of an overloaded publisher. */
void jsd__admission_full(jsd_publish_result *res, size_t cap);

#endif
