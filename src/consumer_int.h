/*
 * Private interface of the durable consumer module: the consumer's own
 * files (consumer.c runs the loop; consumer_durable.c, consumer_fetch.c,
 * consumer_apply.c, consumer_ack.c, consumer_bury.c, consumer_replay.c and
 * delivery.c hold its steps), envelope.c (typed envelope checks) and deadletter.c (death
 * envelopes, dead-letter stream, replay). The first two sections are what
 * envelope.c and deadletter.c offer; the rest is the consumer's state and
 * the small API of each step, for the consumer's files only.
 */
#ifndef JSD_CONSUMER_INT_H
#define JSD_CONSUMER_INT_H

#include <nats/nats.h>
#include <pthread.h>
#include <stdatomic.h>

#include "jsd_int.h"
#include "store/store.h"
#include "streams.h"
#include "subject.h"

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
 * stable Nats-Msg-Id jsd_dlq_msg_id(stream, consumer, seq), and wait up to timeout_ms
 * for the PubAck. A duplicate PubAck is success (an earlier attempt stored
 * it). *dlq_seq (may be NULL) receives the DLQ stream sequence. */
jsd_status jsd__death_publish(jsCtx *js, const char *dlq_subject, const char *dlq_stream,
                              const jsd__death *d, int timeout_ms, uint64_t *dlq_seq,
                              jsd_error *err);

/* ---- the consumer (consumer*.c, delivery.c) ------------------------------------ */

enum {
    OUT_COMMIT = 1, /* inbox outcome codes, as stored */
    OUT_POISON = 2,
    OUT_PARK = 3,
    OUT_DUP = 4 /* a re-published duplicate caught by its message id */
};

typedef enum dstate {
    D_NONE = 0,
    D_ACK,    /* committed (now or earlier): ACK */
    D_NAK,    /* retry: NAK with delay */
    D_POISON, /* death envelope, then TERM */
    D_PARK    /* death envelope, then ACK */
} dstate;

struct jsd_delivery {
    jsd_consumer *c;
    natsMsg *msg;
    jsMsgMetaData *meta;
    const char *subject;
    const char *msg_id;
    const char *type;
    uint64_t seq;
    uint64_t deliveries;
    /* The inbox's identity of the delivery (jsd__inbox_id): its
     * Nats-Msg-Id when that is within the limits (`id`, else NULL), or
     * `key`, "@<stream seq>.<stored at, ns>", so a sequence that a
     * re-created stream hands out again is told from the message that had
     * it before. Set when the delivery is fetched. */
    const char *id;
    char key[48];
    dstate state;
    bool fresh;  /* its outcome was decided in this batch (not an inbox hit) */
    bool replay; /* applied from its poison record (consumer_replay.c), not delivered */
    bool dup;    /* answered from the inbox */
    int64_t delay_ms;
    /* The fast pass's answer, kept for the careful pass (which then does
     * not call the handler for it again); its reason is in `reason`. */
    bool given;
    jsd_disposition_kind given_kind;
    int64_t given_delay_ms;
    char reason[JSD__ERROR_TEXT_MAX + 1];
};

/* The delivery's identity in the inbox: its Nats-Msg-Id, or for a message
 * without one (or with one outside the limits, poison on its own) its key
 * ("@<seq>.<time>"; a Nats-Msg-Id of that very form from another publisher
 * would be taken for it). Always within the store's limits. */
static inline const char *jsd__inbox_id(const jsd_delivery *d)
{
    return d->id ? d->id : d->key;
}

/* The application's handler: a per-delivery one or a batch one. */
typedef struct jsd__handler {
    jsd_handler one;
    jsd_batch_handler batch;
    void *user;
} jsd__handler;

#define LASTERR_SLOTS 64

/* The default of jsd_consumer_opts.hold_alert_ms: 5 minutes. */
#define JSD__HOLD_ALERT_MS (5LL * 60 * 1000)

/* Handler contention (consumer_apply.c): why a handler's own statements
 * failed when the cause is the store's, not the message's. The first two
 * apply the batch again at once; the others hold it. Their names are the
 * `kind` label of jsd_consumer_handler_contention_total. */
enum {
    CONT_NONE = -1,
    CONT_SERIALIZATION, /* 40001 */
    CONT_DEADLOCK,      /* 40P01 */
    CONT_LOCK_TIMEOUT,  /* 55P03 */
    CONT_STMT_TIMEOUT,  /* 57014 */
    CONT_CONNECTION,    /* 08xxx, 57P01..03, or the connection gone */
    CONT_BUSY,          /* SQLITE_BUSY */
    CONT_LOCKED,        /* SQLITE_LOCKED */
    CONT__COUNT
};
extern const char *const jsd__contention_kinds[CONT__COUNT];

typedef struct jsd__ack jsd__ack;

struct jsd_consumer {
    jsd_store *store;
    jsd_conn *conn;
    natsConnection *nc;
    jsCtx *js;
    char *stream, *durable, *dlq_subject;
    char dlq_stream[JSD_STREAM_NAME_MAX + 1];
    char **types;
    size_t n_types;
    jsd_payload_format fmt;
    int batch, fetch_wait_ms, ack_timeout_ms;
    int64_t retry_delay_ms;
    int park_at;          /* P: handler attempts before parking */
    int64_t ack_wait_ms;  /* the durable's shortest effective ack wait, read from the server */
    int64_t keepalive_ms; /* +WPI period for waiting deliveries: a third of ack_wait_ms */
    int max_deliver;      /* M from the server, -1 unlimited */

    /* Store outage: the batch in hand is held (kept alive, retried). */
    bool holding;
    int64_t hold_since_ms;
    size_t held_at_stop; /* deliveries left unacked by a drain during an outage */
    jsd_metric *m_outages, *m_held;
    /* Handler contention: what the last failed attempt met (CONT_NONE when
     * it was no contention), with its cause for the log and the error; a
     * hold past hold_alert_ms is alerted once (hold_alerted). */
    int cont_kind;
    char cont_why[JSD__ERROR_TEXT_MAX + 1];
    int64_t hold_alert_ms; /* <= 0: never */
    bool hold_alerted;
    jsd_metric *m_contention[CONT__COUNT], *m_overdue;

    /* Poison records whose death envelope is not yet in the dead-letter
     * stream are republished from the store (jsd__bury_sweep). */
    int64_t sweep_at_ms, sweep_backoff_ms;
    jsd_metric *m_dlq_unpublished, *m_dlq_deferred;
    jsd_metric *m_reused; /* deliveries whose stream sequence named another message */

    /* Replay requests of this durable (consumer_replay.c): looked for at
     * start and every second; result counters applied / failed / duplicate. */
    int64_t replay_at_ms;
    jsd_metric *m_replays[3];

    /* The durable found missing (jsd__durable_lost), and the settings to
     * re-create it with (opts.restore; its filter is restore_filter). */
    bool missing, has_restore;
    int64_t missing_since_ms, missing_said_ms;
    jsd_durable_config restore;
    char *restore_filter;
    /* The durable found ahead of its stream (jsd__durable_ahead, looked at
     * when idle, at most every few seconds). */
    bool ahead, ahead_failed;
    int64_t ahead_look_ms, ahead_said_ms;
    jsd_metric *m_ahead;
    /* The durable's ack floor last recorded in the store
     * (jsd__durable_floor_note) and when it was last read. */
    uint64_t floor_noted;
    int64_t floor_note_ms;
    bool floor_failed;

    natsSubscription *sub;
    jsd__ack *ack; /* the ACK pipeline (consumer_ack.c) */

    const jsd_metrics_std *m; /* counters: never NULL, its handles may be */

    /* The fetcher thread pulls the next batch while this one is applied.
     * It only moves a natsMsgList into `slot` under fmu; deliveries are
     * decided on the consumer's thread. */
    pthread_t fetcher;
    bool fetcher_started;
    pthread_mutex_t fmu;
    pthread_cond_t fcv;
    bool fstop, slot_full;
    natsMsgList slot;
    natsStatus slot_status;
    int64_t slot_wpi_ms; /* when the waiting batch was last kept alive */
    atomic_bool draining;
    atomic_size_t in_hand; /* deliveries of the batch in hand, for max_in_flight */
    pthread_mutex_t mu;
    jsd_consumer_stats stats;
    jsd_error err;

    struct {
        uint64_t seq;
        char text[256];
    } lasterr[LASTERR_SLOTS];

    jsd_delivery *d; /* the batch in hand */
    size_t nd, cap;
    /* The fast pass's scratch, grown to the batch in hand. */
    struct jsd__fast *fast;
    size_t fast_cap;
};
#define STAT_SET(c, field, v)                                                                      \
    do {                                                                                           \
        pthread_mutex_lock(&(c)->mu);                                                              \
        (c)->stats.field = (v);                                                                    \
        pthread_mutex_unlock(&(c)->mu);                                                            \
    } while (0)

#define STAT_ADD(c, field, n)                                                                      \
    do {                                                                                           \
        pthread_mutex_lock(&(c)->mu);                                                              \
        (c)->stats.field += (n);                                                                   \
        pthread_mutex_unlock(&(c)->mu);                                                            \
    } while (0)

/* consumer.c: the consumer's error (its handle's jsd_error), and giving up
 * the batch in hand (neither ACK nor NAK). */
jsd_status jsd__cerr(jsd_consumer *c, jsd_status st, const char *fmt, ...) JSD_PRINTF(3, 4);
void jsd__batch_release(jsd_consumer *c);

/* consumer_durable.c: the options and the durable's config checked at
 * create (also sets batch, park_at, ack_wait_ms, keepalive_ms, max_deliver
 * and dlq_stream from the server). */
jsd_status jsd__consumer_check_opts(const jsd_consumer_opts *o, jsd_error *err);
void jsd__consumer_default_dlq_subject(const jsd_consumer_opts *o, char *out, size_t cap);
/* A durable's longest redelivery (ack_wait x max_deliver + backoff) and the
 * ack wait in force (the first backoff step replaces ack_wait), in ms; the
 * consumer's create check and the doctor (src/doctor.c) both use them. */
int64_t jsd__durable_redelivery_horizon_ms(const jsConsumerConfig *cc);
int64_t jsd__durable_effective_ack_wait_ms(const jsConsumerConfig *cc);
jsd_status jsd__consumer_check_config(jsd_consumer *c, const jsd_consumer_opts *o);
/* After a failed fetch: true when the durable does not exist on the server
 * (logged at error, durable_missing set; re-created with c->restore when
 * there is one), false when it does or the lookup failed. */
bool jsd__durable_lost(jsd_consumer *c);

/* consumer_position.c: after an idle fetch, at most every few seconds,
 * whether the durable is ahead of its stream (logged at error once,
 * durable_ahead set; re-created with c->restore when there is one). The
 * sequence a durable ahead of its stream resumes at (see the DESIGN there),
 * and re-creating a durable with its own config at a start. */
void jsd__durable_ahead(jsd_consumer *c);
uint64_t jsd__durable_resume_seq(jsd_conn *conn, jsd_store *store, const char *stream,
                                 const char *durable, const jsd_durable_position *p);
jsd_status jsd__durable_rewind(jsd_conn *conn, jsd_store *store, const char *stream,
                               const char *durable, uint64_t at, jsd_error *err);
/* The recorded floor of a durable re-created at `at` put to at - 1. */
void jsd__durable_floor_reset(jsd_store *store, const char *stream, const char *durable,
                              uint64_t at);
/* Where a lost durable is re-created (DESIGN "where a lost durable
 * resumes"): after its recorded ack floor, else after high (its inbox's
 * high-water mark); why: the phrase the log says it with. */
jsd_status jsd__durable_lost_start(jsd_store *store, const char *stream, const char *durable,
                                   uint64_t high, uint64_t *at, char *why, size_t cap,
                                   jsd_error *err);
/* Between batches, at most every few seconds (at_stop: now), the durable's
 * ack floor read from the server and recorded in the store. */
void jsd__durable_floor_note(jsd_consumer *c, bool at_stop);

/* consumer_fetch.c: the fetcher thread pulls one batch ahead. start/stop
 * run it (start again after a stop restarts it); drain gives back the
 * batch pulled ahead and fetches no more;
 * jsd__fetch_batch takes the next batch into c->d / c->nd. *idle is set
 * when nothing came (a timeout, an empty batch: JSD_OK; a failed fetch: its
 * status); a batch that cannot be held is NAKed with JSD_ERR_NOMEM. */
int jsd__fetch_start(jsd_consumer *c);
void jsd__fetch_stop(jsd_consumer *c);
void jsd__fetch_drain(jsd_consumer *c);
jsd_status jsd__fetch_batch(jsd_consumer *c, bool *idle);

/* consumer_apply.c: apply the batch in hand in one transaction, holding it
 * through a store outage. JSD_OK with *committed when its COMMIT returned;
 * JSD_OK without when it was not committed (every delivery NAKed and the
 * batch released); JSD_ERR_STOPPED on a drain while held. */
jsd_status jsd__apply(jsd_consumer *c, const jsd__handler *h, bool *committed);
void jsd__apply_free(jsd_consumer *c);
/* A delivery's Nats-Msg-Id as its poison record and death envelope keep it:
 * the id itself when the store takes it (jsd__store_text_ok), else its safe
 * rendering in out (see "limits" in consumer_apply.c); NULL when it has none. */
const char *jsd__msg_id_kept(const char *id, char out[JSD_IDENT_MAX + 1]);

/* consumer_apply.c, for the replay step too: the handler's call is about to
 * be made (forget an earlier failure's code; the value to give
 * jsd__handler_saw_outage), and whether a handler's failure was the store's
 * (its outage status, counted as contention where it is) or its own
 * (JSD_OK). */
int jsd__handler_before(jsd_tx *tx);
jsd_status jsd__handler_saw_outage(jsd_consumer *c, jsd_tx *tx, int sqlite_before,
                                   const char *reason);
/* A handler called for one delivery: a batch handler gets a batch of one. */
jsd_disposition jsd__handler_call_one(const jsd__handler *h, jsd_tx *tx, const jsd_delivery *d);

/* consumer_replay.c: apply this durable's pending replay requests (at most
 * 64 a call) through the handler h, each in a transaction of its own: when
 * due (at start, then every second), or at once with force. */
void jsd__replay_sweep(jsd_consumer *c, const jsd__handler *h, bool force);

/* consumer_ack.c: the ACK pipeline, an object of its own: its lock, its
 * generations (one per batch, at most a few in flight) and the subscription
 * for the confirmations. stream and durable (kept, not copied) name it in
 * logs; it counts into stats (under stats_mu) and commits. */
jsd_status jsd__ack_create(jsd__ack **out, natsConnection *nc, const char *stream,
                           const char *durable, int timeout_ms, jsd_metric *commits,
                           pthread_mutex_t *stats_mu, jsd_consumer_stats *stats, jsd_error *err);
/* Send +ACK for acks[0..n) (the first n_fresh settle this batch's commits). */
void jsd__ack_send(jsd__ack *a, jsd_delivery **acks, size_t n, size_t n_fresh);
/* Settle confirmations: with wait, until every generation is done. */
void jsd__ack_collect(jsd__ack *a, bool wait);
void jsd__ack_destroy(jsd__ack *a);
/* NAK one delivery with a delay (c->retry_delay_ms when <= 0). */
void jsd__nak(jsd_consumer *c, jsd_delivery *d, int64_t delay_ms);

/* consumer_bury.c: dead letters. jsd__bury settles one poison or parked
 * delivery after the COMMIT (death envelope unless already published, then
 * TERM or the count of a park: the caller ACKs a park); *ok / *failed say
 * whether a publish worked or failed. jsd__bury_after schedules the sweep
 * from a batch's results; jsd__bury_sweep republishes stored records
 * without a dead-letter sequence (when due, or at once with force). */
void jsd__bury(jsd_consumer *c, jsd_delivery *d, bool *ok, bool *failed);
void jsd__bury_after(jsd_consumer *c, bool ok, bool failed);
void jsd__bury_sweep(jsd_consumer *c, bool force);

#endif
