/*
 * The store's internal API: what the relay, the ingress, the dead-letter
 * module and the tools use beyond the public include/jsdurable/store.h.
 *
 * Threads: a jsd_store (one SQLite connection or one PGconn) is used by one
 * thread at a time. The relay and the ingress each open their own jsd_store;
 * several relays or consumers scale out as processes (or as more jsd_store
 * handles). Nothing here is thread-safe unless its comment says so.
 *
 * Time: every timestamp in the store is BIGINT unix milliseconds on both back
 * ends. Functions that decide by time take now_ms from the caller (the relay
 * passes jsd__now_ms()), so tests drive the clock and several relay hosts
 * must keep their clocks within a small fraction of the lease length.
 *
 * Errors: every function returns jsd_status and records the detail (message,
 * SQLite extended code or PostgreSQL SQLSTATE) in the store's last error,
 * readable with jsd_store_error() / jsd_store_errmsg(). Functions named
 * jsd__tx_* record into the owning store of the transaction.
 *
 * DESIGN (crash ordering of the relay, RELAY-1,2):
 *   claim (lease_token, lease_expires) -> publish with msg_id -> PubAck
 *   -> jsd__store_record_receipts(token).
 * A receipt is written only where lease_token still equals the caller's token,
 * so a relay whose lease expired and was taken over cannot overwrite the new
 * holder's result (its receipt is counted as not applied). A crash between
 * publish and receipt leaves the lease to expire; the next claim republishes
 * the same msg_id and JetStream reports a duplicate, whose receipt retires the
 * effect. A wake-up is only a hint: the relay must also poll.
 */
#ifndef JSD_STORE_INT_H
#define JSD_STORE_INT_H

#include "jsd_int.h"

/* ---- limits: jsd_tx_emit enforces the public ones of jsdurable/store.h ------- */

/* A message-id namespace: 1..JSD_NAMESPACE_MAX of [A-Za-z0-9._-]; otherwise
 * false with err (may be NULL) set to JSD_ERR_CONFIG naming the rule. */
bool jsd__namespace_valid(const char *ns, jsd_error *err);
#define JSD__ERROR_TEXT_MAX  1024 /* last_error / dead_reason are cut to this */
#define JSD__LEASE_TOKEN_MAX 65   /* 64 characters + NUL */
#define JSD__DEFAULT_BUDGET  50   /* attempts before an effect is dead-lettered */

/* The channel the PostgreSQL back end NOTIFYs once per committing transaction
 * that emitted at least one effect. */
#define JSD__PG_CHANNEL "jsd_outbox"

/* ---- claim ------------------------------------------------------------------ */

/* One effect claimed under a lease. All strings and buffers are owned by the
 * batch and valid until jsd__effect_batch_clear/_free. */
typedef struct jsd__claimed {
    int64_t row_id;    /* jsd_outbox.id: commit (insert) order */
    const char *owner; /* "" when the application gave none */
    const char *effect_id;
    char msg_id[JSD_MSG_ID_MAX]; /* as stored at emit (jsd_effect_msg_id) */
    const char *subject;
    const jsd_header *headers; /* decoded application headers */
    size_t n_headers;
    const unsigned char *payload; /* may be NULL when len == 0 */
    size_t len;
    int attempts;          /* failed attempts so far (0 on first try) */
    const char *order_key; /* NULL when unordered */
    int64_t created_at_ms;
    int64_t not_before_ms;
    /* An earlier lease on this effect ended without a receipt, a failure or
     * a release (a relay crashed or stalled past it): that holder may have
     * published it, so a duplicate PubAck is an expected outcome of a retry.
     * Sticky until the receipt. */
    bool maybe_published;
    /* When its first attempt may have reached the broker (unix ms): the claim
     * of the first attempt whose outcome stayed open (a failure, or a lease
     * that ended unsettled); 0 when no attempt of it can have stored it. The
     * relay watches it against the stream's duplicate window. */
    int64_t first_attempt_ms;
    /* Why the stored row cannot be published as it is ("" when it can): the
     * claim hands such a row over instead of failing the whole claim, and the
     * relay dead-letters it with this reason. */
    char defect[160];
} jsd__claimed;

typedef struct jsd__effect_batch {
    jsd__claimed *items;
    size_t n;
    /* private: storage owned by the batch */
    size_t cap;
    struct jsd__batch_chunk *arena;     /* chunks the items' storage is carved from */
    struct jsd__batch_chunk *arena_cur; /* the chunk being filled */
} jsd__effect_batch;

void jsd__effect_batch_init(jsd__effect_batch *b);
/* Drop the items (n = 0); the batch stays usable and keeps up to 512 KiB of
 * their storage for the next claim (rows.c). */
void jsd__effect_batch_clear(jsd__effect_batch *b);
/* Free everything. Accepts NULL. */
void jsd__effect_batch_free(jsd__effect_batch *b);
/* The storage the batch holds for its rows (used or kept), for tests. */
size_t jsd__effect_batch_held_bytes(const jsd__effect_batch *b);

/*
 * A second handle on the same store for writing the relay's outcomes
 * (receipts, failures, releases) beside the claims of the first, so the two
 * overlap (DESIGN 8 in relay.c), opened with the options s was opened
 * with. PostgreSQL only: *out is NULL on SQLite, whose one writer gains
 * nothing from a second connection. Its commits are synchronous like every
 * other: a receipt lost in a server crash would have its effect published
 * again, and a server that comes back after the stream's duplicate window
 * would store it twice.
 */
jsd_status jsd__store_open_writer(const jsd_store *s, jsd_store **out, jsd_error *err);

/*
 * A second handle on the same store, on both back ends, for reads that must
 * not hold up the first one's writes (the relay's backlog gauge). On SQLite
 * in WAL mode a reader blocks no writer. JSD_ERR_CONFIG when the second
 * connection would open another database (an SQLite ":memory:" store).
 */
jsd_status jsd__store_open_reader(const jsd_store *s, jsd_store **out, jsd_error *err);

/*
 * Claim up to max effects that are due (next_attempt_at <= now_ms; an emitted
 * effect's first next_attempt_at is its not_before, or its creation time),
 * unpublished, not dead-lettered and whose lease is free or expired
 * (lease_expires <= now_ms). They are leased to lease_token until
 * now_ms + lease_ms. out is cleared first and receives them in row_id order.
 *
 * Ordering keys: an effect with an order_key is claimable only when no earlier
 * (smaller row_id) effect with the same key is still unpublished and not
 * dead-lettered — whatever its lease or due time. So at most one effect per
 * key is in flight and effects of one key are published in row_id order. A
 * dead-lettered effect no longer holds its key back (documented in
 * docs/ARCHITECTURE.md, "The store").
 *
 * PostgreSQL: one statement, UPDATE ... WHERE id IN (SELECT ... FOR UPDATE
 * SKIP LOCKED LIMIT max) RETURNING ..., so concurrent relays never hold the
 * same effect. SQLite: BEGIN IMMEDIATE (the database write lock) around the
 * same UPDATE ... RETURNING.
 *
 * lease_token: 1..64 characters (use jsd__random_hex). JSD_OK with out->n == 0
 * when nothing is due.
 *
 * A row the claim cannot decode (a headers column the decoder refuses) is
 * still claimed, with its defect named in jsd__claimed.defect, so that one
 * bad row never fails the claims of the others. The claim also marks, in the
 * pending row's duplicate column, an effect whose earlier lease expired
 * unsettled (jsd__claimed.maybe_published); the receipt overwrites it.
 */
jsd_status jsd__store_claim(jsd_store *s, int max, int64_t lease_ms, const char *lease_token,
                            int64_t now_ms, jsd__effect_batch *out);

/* ---- receipts, failures, releases --------------------------------------------- */

typedef struct jsd__receipt {
    int64_t row_id;
    const char *stream; /* the stream named in the PubAck */
    uint64_t seq;       /* stream sequence from the PubAck (> 0) */
    bool duplicate;     /* the PubAck's duplicate flag */
    int64_t published_at_ms;
} jsd__receipt;

/*
 * Record n receipts in one transaction: stream, stream_seq, duplicate,
 * published_at are set and the lease cleared ONLY for rows whose lease_token
 * still equals lease_token (and that have no receipt yet). *applied (may be
 * NULL) counts the rows written; a row not written lost its lease, and its
 * new holder's result stands. PostgreSQL: one set-based UPDATE over unnest()ed
 * arrays, one element per run of consecutive rows. JSD_OK even when
 * applied < n.
 */
jsd_status jsd__store_record_receipts(jsd_store *s, const char *lease_token, const jsd__receipt *r,
                                      size_t n, size_t *applied);
/*
 * The same in two steps, for the relay's receipt writer: _unsynced commits
 * the receipts (visible at once), and they are durable once
 * jsd__store_sync_receipts returns JSD_OK. On SQLite the commit does not
 * sync the WAL under the write lock, where it held back every other writer
 * of the file (the relay's own next claim, the application's commits) for
 * one fsync; the sync writes the WAL file's frames to disk afterwards, outside
 * it. On PostgreSQL the commit does not wait for its WAL flush, and the
 * sync is one synchronous commit of its own, whose flush covers every
 * commit before it; it fails when the session those commits ran on was
 * reset meanwhile (a server that crashed may have lost them), and it walks
 * the settled floor once for all of them. On SQLite jsd__store_sync_receipts
 * may run while another thread uses s under its own lock: it touches only
 * state the writer's calls share. Both report a failure in the log and
 * its status; a failed sync leaves the receipts possibly lost, to be
 * recorded again (the statement is idempotent).
 */
jsd_status jsd__store_record_receipts_unsynced(jsd_store *s, const char *lease_token,
                                               const jsd__receipt *r, size_t n, size_t *applied);
jsd_status jsd__store_sync_receipts(jsd_store *s);

typedef struct jsd__failure {
    int64_t row_id;
    const char *error;    /* why the publication failed; cut to JSD__ERROR_TEXT_MAX */
    bool dead_letter_now; /* a permanent failure: dead-letter at once */
    /* The attempt may have reached the broker: when (unix ms, its claim), kept
     * as the effect's first_attempt_ms unless an earlier one is recorded; 0
     * when nothing was sent. */
    int64_t attempted_ms;
    /* Retry after the first backoff step, not the capped exponential one:
     * the effect is past half its duplicate window (relay_horizon.c). */
    bool retry_soon;
} jsd__failure;

/*
 * Capped exponential backoff with deterministic jitter. After the n-th failed
 * attempt (n >= 1) the next attempt is due after
 *     d = min(cap_ms, base_ms * 2^(n-1))
 * reduced by up to jitter_pct percent of d, the fraction taken from a hash of
 * (row_id, n), so a test can compute it with jsd__backoff_delay_ms().
 */
typedef struct jsd__backoff {
    int64_t base_ms; /* default 1000 */
    int64_t cap_ms;  /* default 300000 */
    int jitter_pct;  /* 0..100; default 20 */
} jsd__backoff;

void jsd__backoff_init(jsd__backoff *b);
/* The delay after failed attempt n (>= 1) of row_id. Pure. */
int64_t jsd__backoff_delay_ms(const jsd__backoff *b, int n, int64_t row_id);

/*
 * Record n failed publications in one transaction, only for rows whose
 * lease_token still matches: attempts += 1, last_error, next_attempt_at =
 * now_ms + jsd__backoff_delay_ms(b, attempts, row_id), lease released. When
 * attempts reaches budget (<= 0 means JSD__DEFAULT_BUDGET), or the failure
 * says dead_letter_now, the effect is dead-lettered instead: dead_lettered_at
 * = now_ms and dead_reason says why; it is never claimed again (until
 * jsd__store_requeue_dead). *applied / *dead_lettered (either may be NULL)
 * count the rows written and of those the rows dead-lettered.
 */
jsd_status jsd__store_record_failures(jsd_store *s, const char *lease_token, const jsd__failure *f,
                                      size_t n, const jsd__backoff *b, int budget, int64_t now_ms,
                                      size_t *applied, size_t *dead_lettered);

/* Release the lease of n claimed effects without counting an attempt (for
 * effects claimed but not published, e.g. at shutdown): they are claimable
 * again at once. Only rows still holding lease_token are touched. */
jsd_status jsd__store_release(jsd_store *s, const char *lease_token, const int64_t *row_ids,
                              size_t n, size_t *released);

/* The dead-letter reason of an effect whose first attempt the broker answered
 * "duplicate" (its id was already in the stream, from another producer): the
 * relay writes it, the counts below look for it. */
#define JSD__FIRST_DUP_REASON "duplicate on first attempt"

/* The outbox's unhappy counts, for `relay --until-idle` and `status`. */
typedef struct jsd__outbox_trouble {
    int64_t failing;                  /* unpublished, not dead-lettered, attempts > 0 */
    int64_t dead_lettered;            /* every dead-lettered effect */
    int64_t first_attempt_duplicates; /* of those, JSD__FIRST_DUP_REASON */
} jsd__outbox_trouble;

/* Count them (scans the outbox: for an exit summary or a status, not a loop). */
jsd_status jsd__store_outbox_trouble(jsd_store *s, jsd__outbox_trouble *out);

/* Give n dead-lettered effects a fresh attempt budget (tools: replay).
 * Clears dead_lettered_at, dead_reason, attempts; due at now_ms. */
jsd_status jsd__store_requeue_dead(jsd_store *s, const int64_t *row_ids, size_t n, int64_t now_ms,
                                   size_t *requeued);

/* When the next claim could find work: the earliest time at which an effect
 * a claim could take (an unordered effect, or the head of an order key) is
 * due and its lease free, i.e. max(next_attempt_at, lease_expires); effects
 * waiting behind a key's head do not count. *found is false when nothing is
 * pending. Lets the relay sleep until a durable timer or a lease ends instead
 * of polling blindly. */
jsd_status jsd__store_next_due(jsd_store *s, bool *found, int64_t *next_due_ms);

/* The cheap part of jsd_store_stats_get for gauges polled often: fills
 * backlog, due and oldest_due_age_ms from the pending-effects indexes only
 * (the other counts scan published effects and the inbox); the rest is 0. */
jsd_status jsd__store_backlog(jsd_store *s, int64_t now_ms, jsd_store_stats *out);

/* ---- wake-ups (RELAY-3) ----------------------------------------------------------- */

/*
 * Block up to timeout_ms for a hint that effects were committed; *woken
 * (may be NULL) says whether a hint arrived. A hint is never evidence that
 * work exists, and a missed one costs the caller one poll interval.
 *
 * PostgreSQL: the store LISTENs on JSD__PG_CHANNEL on its OWN connection (the
 * relay's store connection), lazily on the first call; committing
 * transactions that emitted effects run pg_notify once per transaction.
 * Notifications that arrive while the connection runs other statements are
 * queued by libpq and returned by the next wait.
 *
 * SQLite: a process-wide signal per database file (mutex + condition variable
 * + counter) raised by every commit that emitted effects in this process,
 * plus a check of PRAGMA data_version every 50 ms that catches commits from
 * other processes (and, harmlessly, any other commit).
 */
jsd_status jsd__store_wait_wakeup(jsd_store *s, int timeout_ms, bool *woken);

/* ---- transactions: access and savepoints ----------------------------------------- */

/* The store a transaction belongs to (for its last error). */
jsd_store *jsd__tx_store(jsd_tx *tx);
/* The SQLSTATE the application recorded with jsd_tx_note_sqlstate ("" when
 * none), and forgetting it (the consumer does before each handler call). */
const char *jsd__tx_app_sqlstate(const jsd_tx *tx);
void jsd__tx_app_sqlstate_clear(jsd_tx *tx);

/*
 * One savepoint level inside a transaction, used by the ingress to commit a
 * batch of deliveries with one savepoint each: jsd__tx_savepoint before a
 * delivery, then jsd__tx_release to keep its work or jsd__tx_rollback_to to
 * undo it (which also releases the savepoint). Calling jsd__tx_savepoint
 * while one is open is JSD_ERR_INVALID.
 */
jsd_status jsd__tx_savepoint(jsd_tx *tx);
jsd_status jsd__tx_release(jsd_tx *tx);
jsd_status jsd__tx_rollback_to(jsd_tx *tx);

/* ---- inbox (IN-1,2), inside an application transaction ----------------------------- */

/* Outcome codes are the ingress's to define (it stores its disposition);
 * detail is an optional short text (<= JSD__ERROR_TEXT_MAX bytes). */
typedef struct jsd__inbox_outcome {
    int code;
    char detail[JSD__ERROR_TEXT_MAX + 1];
    char msg_id[JSD_MSG_ID_MAX + 192]; /* the msg id recorded with it ("" if none) */
    uint64_t stream_seq;               /* the delivery's stream sequence */
    int64_t created_at_ms;
} jsd__inbox_outcome;

/* The rule a delivery's message id meets in the inbox and in a poison record
 * (the inserts below refuse anything else, JSD_ERR_INVALID): s is at most max
 * bytes (JSD_IDENT_MAX for a message id) of valid UTF-8 without control
 * characters. The consumer asks it before any store call, so that a delivery
 * that breaks it is poison on its own (src/consumer_apply.c, "limits"). */
bool jsd__store_text_ok(const char *s, size_t max);

/*
 * Look the delivery identity (stream, consumer, stream_seq) up. *found says
 * whether it is there; when it is and out is not NULL, out receives the
 * recorded outcome.
 */
jsd_status jsd__tx_inbox_lookup(jsd_tx *tx, const char *stream, const char *consumer,
                                uint64_t stream_seq, bool *found, jsd__inbox_outcome *out);

/*
 * The same by the envelope's message id, for a re-published duplicate that
 * arrives under a new stream sequence after the broker's duplicate window.
 * msg_id is indexed (not unique) per (stream, consumer); the first recorded
 * row wins.
 */
jsd_status jsd__tx_inbox_lookup_msg_id(jsd_tx *tx, const char *stream, const char *consumer,
                                       const char *msg_id, bool *found, jsd__inbox_outcome *out);

/*
 * Record the delivery identity with its outcome. (stream, consumer,
 * stream_seq) is unique: a second insert is JSD_ERR_EXISTS and leaves the
 * transaction usable (INSERT ... ON CONFLICT DO NOTHING). msg_id may be NULL.
 * Lengths: stream, consumer <= 256 bytes, msg_id <= 256 bytes.
 */
/* A delivery's W3C trace context as it came (headers traceparent and
 * tracestate), kept in its inbox row; either may be NULL. The store keeps
 * what it gets, cut to the header limits (JSD_HEADER_VALUE_MAX,
 * JSD_TRACESTATE_MAX). */
typedef struct jsd__trace {
    const char *parent;
    const char *state;
} jsd__trace;

jsd_status jsd__tx_inbox_insert(jsd_tx *tx, const char *stream, const char *consumer,
                                uint64_t stream_seq, const char *msg_id, int outcome_code,
                                const char *detail, const jsd__trace *trace);

/*
 * The fast path of a batch: record n fresh deliveries (seqs[i], msg_ids[i],
 * NULL or "" for none) with one outcome code and no detail, in one statement
 * on PostgreSQL (INSERT ... SELECT FROM unnest ... ON CONFLICT DO NOTHING
 * RETURNING), one prepared statement execution each on SQLite. Delivery i is
 * inserted (inserted[i] true) unless its (stream, consumer, seq) is already
 * in the inbox or a row with its message id was recorded before this call.
 * Seqs and message ids must be distinct within the batch: the caller's to
 * ensure (not checked), since one statement does not see its own rows.
 * traces (NULL: none) gives each delivery's trace context.
 */
jsd_status jsd__tx_inbox_insert_many(jsd_tx *tx, const char *stream, const char *consumer,
                                     const uint64_t *seqs, const char *const *msg_ids,
                                     const jsd__trace *traces, size_t n, int outcome_code,
                                     bool *inserted);

/*
 * Retire the inbox row of (stream, consumer, stream_seq): its sequence now
 * names another message (the stream was re-created, or its server lost the
 * last writes and handed the sequence out again), so the row moves to a
 * fresh negative sequence of its own, below every other of (stream,
 * consumer). Lookups by sequence no longer find it; its message id still
 * answers the duplicate check (a re-publication of that message stays a
 * duplicate); gc removes it by age like any row. JSD_ERR_NOT_FOUND when
 * there is no such row.
 */
jsd_status jsd__tx_inbox_retire(jsd_tx *tx, const char *stream, const char *consumer,
                                uint64_t stream_seq);

/* ---- poison records (DLQ-1) ----------------------------------------------------------- */

typedef struct jsd__poison {
    const char *stream;
    const char *consumer;
    uint64_t stream_seq;
    const char *msg_id; /* may be NULL */
    const char *subject;
    const char *diagnostic; /* why it is poison; cut to JSD__ERROR_TEXT_MAX */
    const void *headers;    /* the original header bytes, verbatim (may be NULL) */
    size_t headers_len;
    const void *payload; /* the original payload bytes, verbatim (may be NULL) */
    size_t len;
    int64_t created_at_ms; /* 0: now */
} jsd__poison;

typedef struct jsd__poison_record {
    int64_t id;
    char *stream, *consumer;
    uint64_t stream_seq;
    char *msg_id; /* "" when none */
    char *subject, *diagnostic;
    unsigned char *headers;
    size_t headers_len;
    unsigned char *payload;
    size_t len;
    int64_t created_at_ms;
    char *dlq_stream; /* set by jsd__store_poison_mark_published, else NULL */
    uint64_t dlq_seq;
} jsd__poison_record;

/* Persist a poison record in its own transaction. Idempotent on the delivery
 * identity: a record that already exists is kept as is and *inserted (may be
 * NULL) is false. */
jsd_status jsd__store_poison_insert(jsd_store *s, const jsd__poison *p, bool *inserted);
/* The same inside a transaction (e.g. the ingress's batch transaction). */
jsd_status jsd__tx_poison_insert(jsd_tx *tx, const jsd__poison *p, bool *inserted);
/* Note that the dead-letter record for this delivery was published
 * (DLQ stream and sequence). Idempotent. */
jsd_status jsd__store_poison_mark_published(jsd_store *s, const char *stream, const char *consumer,
                                            uint64_t stream_seq, const char *dlq_stream,
                                            uint64_t dlq_seq);
/* One record by delivery identity: JSD_ERR_NOT_FOUND when absent. Free with
 * jsd__poison_record_clear. */
jsd_status jsd__store_poison_get(jsd_store *s, const char *stream, const char *consumer,
                                 uint64_t stream_seq, jsd__poison_record *out);
/* Up to max records with id > after_id, in id order. *out is an array of *n
 * records; free with jsd__poison_records_free. */
jsd_status jsd__store_poison_list(jsd_store *s, int64_t after_id, size_t max,
                                  jsd__poison_record **out, size_t *n);
/* Up to max records of (stream, consumer) with no dead-letter sequence yet
 * (their death envelope is still to be published) and id > after_id, in id
 * order. Free with jsd__poison_records_free. */
jsd_status jsd__store_poison_unpublished(jsd_store *s, const char *stream, const char *consumer,
                                         int64_t after_id, size_t max, jsd__poison_record **out,
                                         size_t *n);
void jsd__poison_record_clear(jsd__poison_record *r);
void jsd__poison_records_free(jsd__poison_record *r, size_t n);

/* ---- replay requests (dlq replay; jsd_replay_request in dlq.h) ------------------------- */

/* Record a request for (r->stream, r->consumer, r->stream_seq) from dead
 * letter (r->dlq_stream, r->dlq_seq): a new one, or a failed one made
 * pending again (*queued true); a pending or applied one is kept as it is
 * (*queued false). *out receives the row as it stands. Outside a
 * transaction. */
jsd_status jsd__store_replay_request(jsd_store *s, const jsd_replay_request *r,
                                     jsd_replay_request *out, bool *queued);
/* Up to max pending requests of (stream, consumer) with id > after_id, in
 * id order, into out (max entries); *n says how many. */
jsd_status jsd__store_replay_pending(jsd_store *s, const char *stream, const char *consumer,
                                     int64_t after_id, jsd_replay_request *out, size_t max,
                                     size_t *n);
/* The requests not applied (pending, failed), for status. */
jsd_status jsd__store_replay_open(jsd_store *s, int64_t after_id, jsd_replay_request *out,
                                  size_t max, size_t *n);
/* Complete pending request id as state (applied or failed) with detail:
 * inside the consumer's transaction (jsd__tx_) or in one of its own
 * (jsd__store_). *done false when it was no longer pending (another process
 * of the durable completed it). */
jsd_status jsd__tx_replay_finish(jsd_tx *tx, int64_t id, jsd_replay_state state, const char *detail,
                                 bool *done);
jsd_status jsd__store_replay_finish(jsd_store *s, int64_t id, jsd_replay_state state,
                                    const char *detail, bool *done);
/* Inside a transaction: set the outcome of the inbox row of (stream,
 * consumer, stream_seq) to code with detail; *changed false when there is no
 * such row or it has that outcome already. */
jsd_status jsd__tx_inbox_set_outcome(jsd_tx *tx, const char *stream, const char *consumer,
                                     uint64_t stream_seq, int code, const char *detail,
                                     bool *changed);

/* ---- retention (STORE-4) ------------------------------------------------------------- */

/* One bounded retention step: in one transaction, delete at most batch
 * published effects with published_at < cutoff_ms, then at most batch inbox
 * rows with created_at < cutoff_ms. Dead-lettered effects and poison records
 * are evidence and are never removed. *removed (may be NULL) counts rows. The
 * public jsd_store_gc loops this until a step removes nothing. */
jsd_status jsd__store_gc_step(jsd_store *s, int64_t cutoff_ms, int batch, int64_t *removed);

/* ---- helpers shared with other modules ------------------------------------------------ */

/* Validate an exact publication subject: 1..256 bytes, tokens of
 * [A-Za-z0-9_-] separated by single dots, no wildcards. JSD_ERR_LIMIT when too
 * long, JSD_ERR_INVALID otherwise; err (may be NULL) names the problem. */
jsd_status jsd__store_check_subject(const char *subject, jsd_error *err);

/* Redact the password of a store URL for messages and logs
 * ("postgres://u:***@h/db"). out holds cap bytes. */
/* A store error that says nothing about the rows or deliveries at hand: the
 * store cannot be reached, is full, read-only or busy, or a COMMIT's outcome
 * is unknown (a lost connection maps to JSD_ERR_CONNECT). The consumer holds
 * its batch through one, the relay its receipts. */
bool jsd__store_outage(jsd_status st);

void jsd__store_redact_url(const char *url, char *out, size_t cap);

/* ---- the outbox tools: verify's repair (front: outbox_tools.c) ----------------------- */

/* A receipt to take back: the stream message it names was lost. */
typedef struct jsd__unpublish {
    int64_t row_id;
    const char *stream; /* the receipt as read: a row whose receipt changed meanwhile is skipped */
    uint64_t seq;
    const char *why; /* becomes the row's last_error */
} jsd__unpublish;

/*
 * Make n published effects pending again with their message id unchanged, in
 * one transaction: receipt cleared (stream, stream_seq, published_at),
 * attempts 0, due at now_ms, and the row marked maybe published (the
 * duplicate column), so that a broker which still remembers the id in its
 * duplicate window answers with a receipt instead of a first-attempt
 * duplicate dead letter. Only rows still holding the given receipt are
 * touched; *done (may be NULL) counts them.
 */
jsd_status jsd__store_unpublish(jsd_store *s, const jsd__unpublish *u, size_t n, int64_t now_ms,
                                size_t *done);

/* The durable's recorded ack floor put to floor as it is, lower or not (a
 * durable re-created at floor + 1 acknowledges nothing above it yet): the
 * one way a recorded floor goes down (consumer_position.c's rewinds). */
jsd_status jsd__store_durable_floor_set(jsd_store *s, const char *stream, const char *durable,
                                        uint64_t floor);

#endif
