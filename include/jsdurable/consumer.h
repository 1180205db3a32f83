/*
 * Durable ingress (IN-1..5, DLQ-1..3): a JetStream durable pull consumer whose
 * deliveries are applied inside a store transaction and acknowledged only
 * after that transaction committed.
 *
 * For every delivery the application's handler runs inside a jsd_tx (its own
 * SQL through jsd_tx_sqlite()/jsd_tx_pg(), new outbox effects through
 * jsd_tx_emit()). In the same transaction the library records the delivery's
 * inbox row: (stream, consumer, stream sequence) with the envelope's message
 * id and the outcome. Only after COMMIT is the delivery ACKed, and the
 * server's confirmation awaited. A redelivery whose inbox row exists is not
 * handed to the handler again: it gets the recorded outcome and the ACK.
 *
 * There is no public ACK. A handler returns a disposition:
 *   jsd_disposition_commit()          keep its work; ACK after the commit;
 *   jsd_disposition_retry(delay_ms)   undo its work; NAK with that delay;
 *   jsd_disposition_poison(reason)    undo its work; persist a poison record,
 *                                     publish a death envelope, then TERM.
 * Envelopes that fail to decode (unknown Jsd-Type, malformed JSON) are poison
 * on their first delivery without reaching the handler. A delivery that
 * reaches the park threshold (see max_deliver below) is parked as a death
 * envelope and ACKed once the dead-letter stream confirmed it.
 *
 * Threads: a consumer is driven by one thread (jsd_consumer_run/poll); handlers
 * and all store work run on that thread. An internal fetcher thread pulls the
 * next batch meanwhile (it never touches the store). jsd_consumer_begin_drain and
 * jsd_consumer_stats_get are thread-safe. Many processes may bind the same durable: the server
 * balances deliveries between them, and the inbox keeps their effects once-only.
 */
#ifndef JSDURABLE_CONSUMER_H
#define JSDURABLE_CONSUMER_H

#include <stdbool.h>

#include "conn.h"
#include "metrics.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct jsd_consumer jsd_consumer;
typedef struct jsd_delivery jsd_delivery;

/* ---- dispositions ------------------------------------------------------------ */
typedef enum jsd_disposition_kind {
    JSD_DISPOSITION_COMMIT = 0,
    JSD_DISPOSITION_RETRY,
    JSD_DISPOSITION_POISON
} jsd_disposition_kind;

typedef struct jsd_disposition {
    jsd_disposition_kind kind;
    int64_t delay_ms; /* RETRY: redelivery delay (0: the consumer's retry_delay_ms) */
    /* RETRY/POISON: why. Must outlive the handler call (a literal, or storage
     * reached through `user`), never the handler's own stack; copied at once. */
    const char *reason;
} jsd_disposition;

JSD_EXTERN jsd_disposition jsd_disposition_commit(void);
JSD_EXTERN jsd_disposition jsd_disposition_retry(int64_t delay_ms, const char *reason);
JSD_EXTERN jsd_disposition jsd_disposition_poison(const char *reason);

/* The handler. Runs inside tx, the batch transaction: any SQL it runs on the
 * native handle and any jsd_tx_emit are kept only when it returns COMMIT. It
 * must not commit or roll back tx itself. A batch is first applied without
 * savepoints; when a handler does not commit, the batch is rolled back and
 * applied again with a savepoint per delivery, so the handlers before it run
 * a second time (their first work was undone) while the failing one is not
 * called again. Like any JetStream consumer, a handler must tolerate being
 * called again for a delivery whose transaction did not commit. */
typedef jsd_disposition (*jsd_handler)(jsd_tx *tx, const jsd_delivery *d, void *user);

/*
 * The batch handler: every delivery of a batch that needs applying in one
 * call, so the application can apply them with one statement (say one
 * INSERT ... SELECT FROM unnest on PostgreSQL) instead of one per delivery.
 *
 * n is the number of deliveries in d[0..n): the deliveries of the batch in
 * hand that are fresh (not answered from the inbox, not parked, not poison
 * on their envelope), in stream order, 1 <= n <= the consumer's batch. out
 * has n entries, each preset to jsd_disposition_commit(); the handler sets
 * out[i] for d[i] (reasons follow the rules of jsd_disposition: they must
 * outlive the call). It runs inside tx, the batch transaction, like
 * jsd_handler: its SQL and jsd_tx_emit calls are kept only when every
 * delivery it was given commits, and it must not commit or roll back tx.
 *
 * When every out[i] is COMMIT the batch commits as one. When any is not
 * (or when anything else in the batch is unusual: a duplicate, a park, a
 * poison envelope), the whole transaction is rolled back and the batch is
 * applied again delivery by delivery: the handler is then called once per
 * delivery with n = 1 inside a savepoint of its own, and each answer
 * decides its delivery alone (so one row that fails a constraint costs only
 * its own delivery a retry). A delivery may therefore be handed over twice
 * in one attempt, first in the batch and then alone; only the second answer
 * counts (a batch of one is not called again: its answer is kept). A store
 * outage seen by the handler's own SQL holds the batch as for jsd_handler.
 */
typedef void (*jsd_batch_handler)(jsd_tx *tx, const jsd_delivery *const *d, size_t n,
                                  jsd_disposition *out, void *user);

/* ---- the delivery object ----------------------------------------------------
 * Valid only during the handler call. Strings are NUL-terminated; the payload
 * is not (use its length). */
JSD_EXTERN const char *jsd_delivery_subject(const jsd_delivery *d);
JSD_EXTERN const void *jsd_delivery_payload(const jsd_delivery *d, size_t *len);
/* First value of a header, NULL when absent. */
JSD_EXTERN const char *jsd_delivery_header(const jsd_delivery *d, const char *name);
JSD_EXTERN const char *jsd_delivery_stream(const jsd_delivery *d);
JSD_EXTERN const char *jsd_delivery_consumer(const jsd_delivery *d);
JSD_EXTERN uint64_t jsd_delivery_stream_seq(const jsd_delivery *d);
/* How many times the server delivered it (1 on the first delivery); 0 for a
 * replay applied from the store (`dlq replay --store`, dlq.h), which also
 * carries the header Jsd-Replay-Of: "<dlq stream>:<seq>". */
JSD_EXTERN uint64_t jsd_delivery_deliveries(const jsd_delivery *d);
/* Nats-Msg-Id, "" when the publisher gave none. */
JSD_EXTERN const char *jsd_delivery_msg_id(const jsd_delivery *d);
/* Jsd-Type, "" when absent (accepted only when no type list is configured). */
JSD_EXTERN const char *jsd_delivery_type(const jsd_delivery *d);
/* Tell the server the delivery is still being worked on (+WPI): extends its
 * ack wait without changing any durable state. JSD_OK and nothing sent for a
 * replay (no delivery to keep alive). */
JSD_EXTERN jsd_status jsd_delivery_progress(const jsd_delivery *d);

/* ---- consumer settings ------------------------------------------------------- */
typedef enum jsd_payload_format {
    JSD_PAYLOAD_RAW = 0, /* any bytes */
    JSD_PAYLOAD_JSON     /* one JSON value, nesting <= JSD_JSON_DEPTH_MAX */
} jsd_payload_format;

#define JSD_BACKOFF_MAX 16

/*
 * The durable's server-side settings (IN-5), used by jsd_consumer_ensure to
 * create it when missing. Defaults (jsd_durable_config_init): explicit ack,
 * deliver all, ack_wait 30 s, max_deliver 6 (so the handler gets 5 attempts
 * before parking and one spare delivery absorbs a failed park), no backoff
 * (a delivery not settled within the ack wait comes again after the ack
 * wait; retries the consumer NAKs carry their own delay), max_ack_pending
 * 1024, inactive threshold 0 (never reaped), no filter.
 *
 * With a backoff list JetStream uses backoff_ms[0] as the ack wait of the
 * first delivery and backoff_ms[n] after delivery n+1, whatever ack_wait_ms
 * says: ensure refuses a backoff_ms[0] shorter than ack_wait_ms (it would
 * silently shorten the ack wait) and warns when it is longer.
 */
typedef struct jsd_durable_config {
    const char *filter_subject; /* NULL: the whole stream */
    int64_t ack_wait_ms;
    int max_deliver; /* >= 2, or -1 for unlimited */
    int64_t backoff_ms[JSD_BACKOFF_MAX];
    int n_backoff;
    int max_ack_pending;
    int64_t inactive_threshold_ms; /* 0: never */
    /* 0 (the default): deliver the stream from its first message. N: from
     * stream sequence N (deliver policy by_start_sequence), as a durable
     * re-created after its inbox's high-water mark N - 1 is. */
    uint64_t start_seq;
} jsd_durable_config;

JSD_EXTERN void jsd_durable_config_init(jsd_durable_config *c);

/* Create the durable pull consumer `durable` on `stream` with cfg when it
 * does not exist (an existing one is left exactly as it is; *created says
 * which). */
JSD_EXTERN jsd_status jsd_consumer_ensure(jsd_conn *conn, const char *stream, const char *durable,
                                          const jsd_durable_config *cfg, bool *created,
                                          jsd_error *err);

/*
 * jsd_consumer_ensure, knowing what the durable's inbox in store holds. An
 * existing durable is left as it is (checked against cfg as ensure does). A
 * missing one whose inbox holds nothing (a first start) is created with cfg
 * (NULL: the defaults) from the stream's start. A missing one whose inbox
 * holds rows existed before and was lost (deleted, or its stream or server
 * re-created): it is re-created only with `restore`, the settings it was
 * provisioned with (the topology's), at its inbox's high-water mark + 1
 * (start_seq), so that what the inbox holds is not delivered again, and a
 * warning is logged; with restore NULL it is JSD_ERR_CONFIG, naming the fix
 * (`jsdurable provision`). *created (may be NULL) says whether it was
 * created, *start_seq (may be NULL) the sequence it starts at (0: the
 * stream's start, or not created). Uses the store outside any transaction.
 */
JSD_EXTERN jsd_status jsd_consumer_ensure_inbox(jsd_conn *conn, jsd_store *store,
                                                const char *stream, const char *durable,
                                                const jsd_durable_config *cfg,
                                                const jsd_durable_config *restore, bool *created,
                                                uint64_t *start_seq, jsd_error *err);

/*
 * A durable's position against its stream and its inbox (docs/CONSUMER.md,
 * "a durable ahead of its stream", "a store restored from an older backup").
 *
 * ahead: the durable's ack floor or delivered stream sequence is past the
 * stream's last sequence: the server lost the stream's tail but kept the
 * durable's state, so the sequences it hands out again would never be
 * delivered. jsd_consumer_ensure_inbox re-creates it (with restore) or
 * refuses to start; a running consumer looks for it when idle.
 *
 * behind_from: non-zero when the inbox's high-water mark is below the
 * durable's ack floor while the stream still holds a message the durable
 * takes (its filter, its start) in between: the durable acknowledged it, so
 * it was applied, but the store no longer holds it (restored from an older
 * backup). It is the first such stream sequence; redeliver from there with
 * jsd_consumer_redeliver_from_inbox.
 */
typedef struct jsd_durable_position {
    uint64_t stream_first, stream_last; /* the stream's first and last sequence */
    uint64_t ack_floor, delivered;      /* the durable's, as stream sequences */
    uint64_t inbox_high;                /* the inbox's high-water mark (0: none, or no store) */
    bool ahead;
    uint64_t behind_from;
} jsd_durable_position;

/* Read the position of `durable` on `stream`; store may be NULL (then
 * inbox_high and behind_from stay 0). JSD_ERR_NOT_FOUND when the stream or
 * the durable does not exist. */
JSD_EXTERN jsd_status jsd_durable_position_get(jsd_conn *conn, jsd_store *store, const char *stream,
                                               const char *durable, jsd_durable_position *out,
                                               jsd_error *err);

/*
 * Re-create `durable` with its own settings as the server holds them, but
 * starting at its inbox's high-water mark + 1 (deliver policy
 * by_start_sequence): the recovery of a store restored from an older
 * backup (`jsdurable consume --redeliver-from-inbox`). Every delivery the
 * inbox holds is answered from it as a duplicate; the ones it lost are
 * applied again. *at (may be NULL) receives the start sequence. Uses the
 * store outside any transaction. Not while a consumer is bound to it.
 */
JSD_EXTERN jsd_status jsd_consumer_redeliver_from_inbox(jsd_conn *conn, jsd_store *store,
                                                        const char *stream, const char *durable,
                                                        uint64_t *at, jsd_error *err);

typedef struct jsd_consumer_opts {
    const char *stream;  /* required */
    const char *durable; /* required: an existing durable pull consumer, explicit ack */
    /* Deliveries fetched and committed per transaction, 1..4096, capped by
     * the durable's max_ack_pending. 0 (the default): half of max_ack_pending,
     * at most 512, so the batch in hand and the next one pulled ahead both
     * fit in the in-flight window. */
    int batch;
    int fetch_wait_ms;      /* how long one fetch waits for the first message; default 500 */
    int ack_timeout_ms;     /* deadline for the batch's ACK confirmations; default 5000 */
    int64_t retry_delay_ms; /* NAK delay after a failed commit or handler; default 1000 */

    /* Envelope: accepted Jsd-Type values (NULL/0: any, including none). */
    const char *const *accept_types;
    size_t n_accept_types;
    jsd_payload_format payload_format;

    /* Dead letters: subject of death envelopes (default jsd.dlq.<stream>.<durable>).
     * A stream other than `stream` must capture it, or create fails. */
    const char *dlq_subject;
    /* Park threshold: a delivery whose handler failed on its max_deliver-th
     * delivery, or that arrives for a later time, is parked. 0: the
     * durable's max_deliver - 1 (the spare delivery retries a failed park).
     * Must be below the durable's max_deliver when that is bounded. */
    int max_deliver;

    /* The inbox retention the operator runs jsd_store_gc with (0: inbox rows
     * are never removed). Create refuses a retention shorter than
     * ack_wait x max_deliver + the backoff schedule, or than the stream's
     * duplicate window. Default 7 days. */
    int64_t inbox_retention_ms;

    /* Where deliveries by result, handler durations and dead letters are
     * counted (borrowed; NULL: jsd_metrics_default()). */
    jsd_metrics *metrics;

    /* A batch held (a store outage, or the handler's statements meeting
     * contention: a lock or statement timeout, SQLite BUSY) for longer than
     * this is an alert: logged at error once, hold_overdue set in the stats
     * and the jsd_consumer_hold_overdue gauge, until the batch is applied
     * (the hold goes on: nothing is lost). 0: the default, 5 minutes;
     * negative: never. */
    int64_t hold_alert_ms;

    /* The durable's provisioned settings (the topology's), copied. When the
     * durable is found missing while the consumer runs (deleted under it),
     * an error is logged and durable_missing set in the stats at once; with
     * restore the durable is re-created with these settings at its inbox's
     * high-water mark + 1 (jsd_consumer_ensure_inbox), without it the
     * consumer keeps retrying and repeats the error once a minute. NULL:
     * none. */
    const jsd_durable_config *restore;
} jsd_consumer_opts;

JSD_EXTERN void jsd_consumer_opts_init(jsd_consumer_opts *o);

/*
 * Bind to the durable (it must exist: see jsd_consumer_ensure) and check the
 * configuration: explicit ack, a pull consumer, the dead-letter stream, the
 * retention guard. The store and connection are borrowed (they must outlive
 * the consumer; the store is used only by the consumer's thread). Options are
 * copied. Errors: JSD_ERR_CONFIG (with the reason), JSD_ERR_NOT_FOUND
 * (stream or durable missing), JSD_ERR_NATS.
 */
JSD_EXTERN jsd_status jsd_consumer_create(jsd_consumer **out, jsd_store *store, jsd_conn *conn,
                                          const jsd_consumer_opts *o, jsd_error *err);
/*
 * Check everything jsd_consumer_create checks that does not need the durable
 * itself: the options, that the stream exists, and that a stream other than
 * it captures the dead-letter subject. Call it before jsd_consumer_ensure so
 * that a configuration that cannot run creates nothing. Errors as for create.
 */
JSD_EXTERN jsd_status jsd_consumer_check(jsd_conn *conn, const jsd_consumer_opts *o,
                                         jsd_error *err);
/* Unbinds without deleting the durable. Accepts NULL. */
JSD_EXTERN void jsd_consumer_destroy(jsd_consumer *c);
JSD_EXTERN const char *jsd_consumer_errmsg(const jsd_consumer *c);
JSD_EXTERN const jsd_error *jsd_consumer_error(const jsd_consumer *c);

/*
 * One batch: fetch up to `batch` deliveries (waiting at most fetch_wait_ms),
 * apply them in one transaction, then settle them (ACK with confirmation,
 * NAK with delay, dead letters, TERM). *n (may be NULL) counts deliveries.
 * Returns JSD_OK also when a commit failed (those deliveries were NAKed and
 * will come again); an error only for what stops the consumer (store
 * unusable, connection closed). JSD_ERR_STOPPED after begin_drain.
 * A store outage (JSD_ERR_CONNECT, _FULL, _READONLY, _BUSY, _IO, _TIMEOUT,
 * _NOMEM from the store, or a COMMIT whose outcome is unknown) is not the
 * handler's failure: poll holds the batch, keeps every delivery in it alive
 * with +WPI (which spends no delivery attempt) and retries the whole batch in
 * a fresh transaction with a capped backoff until the store answers; it
 * returns only then, or with JSD_ERR_STOPPED on begin_drain (the held
 * deliveries are left unacked: the server redelivers them after the ack
 * wait, one delivery each). Nor is contention met by the handler's own
 * statements (see jsd_tx_note_sqlstate): a serialization failure or deadlock
 * applies the batch again at once, a lock or statement timeout, a lost
 * connection or SQLite BUSY/LOCKED holds it as above; a hold longer than
 * hold_alert_ms is logged at error and flagged (stats.hold_overdue).
 */
JSD_EXTERN jsd_status jsd_consumer_poll(jsd_consumer *c, jsd_handler h, void *user, int *n);

/* Loop jsd_consumer_poll until begin_drain (JSD_OK once the batch in hand is
 * settled), or with until_idle until the durable has nothing pending and
 * nothing in flight. Transient failures (connection loss, busy store) are
 * logged and retried; a connection that nats.c closed for good
 * (reconnect_attempts exhausted, or the credentials refused twice in a row)
 * ends it with JSD_ERR_CONNECT. Never JSD_OK while a delivery is left unapplied: a
 * drain during a store outage returns the store's status, with the number
 * of deliveries left unacked in jsd_consumer_errmsg. With until_idle, an
 * idle durable whose poison records are not all in the dead-letter stream
 * (after one more attempt to publish them) is JSD_ERR_NATS, not JSD_OK. */
JSD_EXTERN jsd_status jsd_consumer_run(jsd_consumer *c, jsd_handler h, void *user, bool until_idle);

/* jsd_consumer_poll and jsd_consumer_run with a batch handler (see
 * jsd_batch_handler): the same fetch, transaction, settlement, outage
 * handling and results; only the way the handler is called differs. */
JSD_EXTERN jsd_status jsd_consumer_poll_batch(jsd_consumer *c, jsd_batch_handler h, void *user,
                                              int *n);
JSD_EXTERN jsd_status jsd_consumer_run_batch(jsd_consumer *c, jsd_batch_handler h, void *user,
                                             bool until_idle);

/* Stop fetching; deliveries already handed out are still applied and settled.
 * Thread-safe; may be called from a signal-handling thread or a handler. */
JSD_EXTERN void jsd_consumer_begin_drain(jsd_consumer *c);

/* Ask the server: *pending = undelivered messages, *in_flight = delivered
 * and not yet acknowledged (all processes on the durable). */
JSD_EXTERN jsd_status jsd_consumer_backlog(jsd_consumer *c, uint64_t *pending, uint64_t *in_flight);

typedef struct jsd_consumer_stats {
    uint64_t fetched;         /* deliveries received */
    uint64_t committed;       /* handler COMMIT, inbox row written */
    uint64_t duplicates;      /* inbox already had the delivery: ACK only */
    uint64_t retried;         /* NAKed (handler retry, failed commit, failed park) */
    uint64_t poisoned;        /* TERMed after the death envelope was confirmed */
    uint64_t parked;          /* ACKed after the death envelope was confirmed */
    uint64_t acked;           /* ACKs the server confirmed */
    uint64_t ack_unconfirmed; /* ACKs without a confirmation before the deadline */
    uint64_t commit_failures;
    uint64_t batches;
    uint64_t max_batch; /* largest batch handed to handlers */
    /* Most deliveries this consumer held at once: the batch in hand plus the
     * one pulled ahead (at most 2 x batch, whatever the durable allows). */
    uint64_t max_in_flight;
    uint64_t handler_us; /* total handler time */
    /* Store outages: batches the store could not take (unreachable, full,
     * read-only, busy). Their deliveries are held, kept alive with +WPI and
     * applied once the store answers; never NAKed, never counted as retries. */
    uint64_t store_outages; /* outages begun */
    uint64_t held;          /* deliveries held right now (0 when the store answers) */
    /* Dead letters whose death envelope could not be published when they
     * were settled (dead-letter stream full, missing, unreachable): their
     * poison record is in the store and is republished from there. */
    uint64_t dlq_deferred;
    uint64_t dlq_republished;    /* published later from the store */
    uint64_t poison_unpublished; /* this durable's poison records not yet published (last sweep) */
    /* Handler contention: the handler's own statements failed for a reason
     * that is the store's, not the message's (a serialization failure or
     * deadlock, a lock or statement timeout, SQLite BUSY/LOCKED, a lost
     * connection; see jsd_tx_note_sqlstate). No delivery attempt is spent
     * on it: a serialization failure or deadlock applies the batch again at
     * once, the others hold it like a store outage. */
    uint64_t contention;         /* such failures */
    uint64_t contention_retries; /* batches applied again at once (40001, 40P01) */
    /* 1 while the batch is held because of contention (the store answers,
     * a lock does not), 0 otherwise. */
    uint64_t held_contention;
    /* 1 while the hold in progress has lasted longer than hold_alert_ms. */
    uint64_t hold_overdue;
    /* 1 while the durable is missing on the server (deleted under the
     * consumer; see jsd_consumer_opts.restore), 0 otherwise. */
    uint64_t durable_missing;
    uint64_t durables_restored; /* times it was re-created by this consumer */
    /* Replay requests (`jsdurable dlq replay --store`, dlq.h) this consumer
     * applied, found failing again (marked failed), and found applied
     * already (nothing done). */
    uint64_t replays_applied;
    uint64_t replays_failed;
    uint64_t replays_duplicate;
    /* 1 while the durable is ahead of its stream (jsd_durable_position;
     * the server lost the stream's tail) and not yet re-created, 0
     * otherwise; durables_rewound counts the times this consumer re-created
     * it at the first sequence that may be new. */
    uint64_t durable_ahead;
    uint64_t durables_rewound;
} jsd_consumer_stats;

/* Thread-safe snapshot. */
JSD_EXTERN void jsd_consumer_stats_get(jsd_consumer *c, jsd_consumer_stats *out);

/* The dead-letter subject and stream in use ("" before create). */
JSD_EXTERN const char *jsd_consumer_dlq_subject(const jsd_consumer *c);
JSD_EXTERN const char *jsd_consumer_dlq_stream(const jsd_consumer *c);

/* Header naming the envelope type (accept_types); the dead-letter headers
 * are in dlq.h. */
#define JSD_HDR_TYPE "Jsd-Type"

#ifdef __cplusplus
}
#endif
#endif
