/*
 * Private interface of the outbox relay, shared by its files only:
 * relay.c (create/destroy, the run loop and its DESIGN block, counters,
 * the last error), relay_claim.c (claiming a batch, the stream and
 * duplicate-window checks, submitting it and mapping each publication's
 * result onto its slot), relay_batch.c (a claim's atomic batches),
 * relay_writer.c (the receipt-writer thread that settles a finished batch
 * in the store), relay_horizon.c and relay_gauge.c. It holds the batches in flight,
 * struct jsd_relay and the small API each file offers the others.
 */
#ifndef JSD_RELAY_INT_H
#define JSD_RELAY_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "jsd_int.h"
#include "pubengine.h"
#include "store/store.h"
#include "streams.h"
#include "subject.h"

#define COMP "relay"

/* ---- batches in flight ------------------------------------------------------------ */

enum slot_state { SLOT_UNSENT = 0, SLOT_PENDING, SLOT_DONE };

typedef enum slot_fate {
    FATE_RECEIPT = 1, /* ACCEPTED */
    FATE_FAILURE,     /* an attempt is counted */
    FATE_DEAD,        /* dead-letter now */
    FATE_RELEASE      /* nothing sent: release without an attempt */
} slot_fate;

typedef struct rbatch rbatch;

/* What a publication's user pointer names: one slot, or an atomic batch of
 * slots (relay_batch.c); the first byte of both says which. */
enum { REF_SLOT = 1, REF_GROUP = 2 };

typedef struct slot {
    uint8_t ref;    /* REF_SLOT */
    uint8_t sgroup; /* while claiming: 1 + its stream's index when it goes in a batch */
    rbatch *b;
    uint32_t idx;
    uint8_t state;
    uint8_t fate;
    bool duplicate;
    bool first_dup;    /* dead-lettered: the PubAck said duplicate on a first attempt */
    bool at_risk;      /* sent past half its stream's duplicate window (relay_horizon.c) */
    bool past_window;  /* sent past the whole window: a possible duplicate */
    int64_t window_ms; /* its stream's duplicate window, 0 unknown */
    bool maybe_stored; /* failed UNKNOWN: the broker may hold it */
    uint64_t seq;
    int64_t acked_us;
    int64_t acked_ms;
    char stream[JSD_STREAM_NAME_MAX + 1];
    char reason[256];
} slot;

/* An atomic batch of one claim (relay_batch.c): slots gidx[first..first+n)
 * of its rbatch, all to one stream, published all or nothing. */
typedef struct bgroup {
    uint8_t ref; /* REF_GROUP */
    rbatch *b;
    uint32_t first, n;
    int tries;               /* attempts sent (each with a fresh batch id) */
    int64_t first_sent_mono; /* the first attempt */
    int64_t resend_at_mono;  /* while in the resend queue */
    struct bgroup *next_resend;
    char stream[JSD_STREAM_NAME_MAX + 1];
} bgroup;

#define JSD__RELAY_GROUPS_MAX 16 /* atomic batches per claim; the rest goes one by one */

struct rbatch {
    rbatch *next;
    bgroup groups[JSD__RELAY_GROUPS_MAX];
    size_t n_groups;
    uint32_t *gidx; /* slots_cap: the slots of its groups, group by group */
    char token[JSD__LEASE_TOKEN_MAX];
    jsd__effect_batch eb;
    slot *slots;
    size_t slots_cap;
    size_t pending; /* submitted, not completed */
    int64_t claimed_mono_ms;
    int64_t claimed_ms; /* unix ms: when its attempts may first reach the broker */
    bool held_warned;   /* its unwritten receipts were reported at risk */
};

struct jsd_relay {
    jsd_store *store;
    /* The writer's own handle (PostgreSQL, jsd__store_open_writer), owned;
     * NULL: the writer uses store, taking turns under store_mu. */
    jsd_store *wstore;
    /* The backlog gauges' own handle (jsd__store_open_reader), owned, and
     * their thread (relay_gauge.c); NULL: counted on the publishing thread. */
    jsd_store *gstore;
    pthread_t gauge_thread;
    bool gauge_running;
    bool gauge_quit; /* under gauge_mu */
    pthread_mutex_t gauge_mu;
    pthread_cond_t gauge_cv;
    jsd_conn *conn;
    jsd_relay_opts o;
    jsd__backoff backoff;
    jsd__pubengine *eng;
    /* atomic batches (relay_batch.c), the publishing thread's: requests
     * built for one (JSD__BATCH_MAX), batches waiting to be sent again, and
     * the streams found not to take them, until when (monotonic) */
    jsd__pub_req *breqs;
    bgroup *resend_head;
    struct {
        char stream[JSD_STREAM_NAME_MAX + 1];
        int64_t until_mono;
        uint8_t why; /* fallback_reason */
    } atomic_off[16];
    size_t n_atomic_off;
    jsd__streams *streams; /* subject -> stream, and each stream's duplicate window */
    jsd_status fatal;      /* JSD_OK, or why the run stopped itself (a window too short) */

    rbatch *head, *tail; /* batches in flight, oldest first */
    rbatch *spare;       /* recycled batches, linked by next (under wq_mu) */
    int n_spare;
    size_t in_flight; /* slots PENDING */
    /* monotonic µs: when the last claim, if it came back short, was
     * submitted; 0 after a full one (DESIGN 11) */
    int64_t short_submitted_us;
    /* a publication or a stream lookup found the broker out (NATS down, or
     * a stream without responders): the loop pauses claims
     * (UNAVAILABLE_PAUSE_MS); the publishing thread's */
    bool broker_out;

    /* The receipt writer: settled batches are handed to a second thread that
     * writes their receipts and failures while this one keeps publishing.
     * store_mu makes the two threads take turns on the store. */
    pthread_mutex_t store_mu;
    pthread_mutex_t wq_mu;
    pthread_cond_t wq_cv;      /* to the writer: work, or quit */
    pthread_cond_t wq_idle_cv; /* from the writer: a batch was written */
    rbatch *wq_head, *wq_tail;
    atomic_size_t wq_effects; /* effects handed over and not yet written */
    bool wq_busy;             /* the writer holds a batch */
    bool wq_quit;
    bool writer_running;
    pthread_t writer;
    atomic_uint_fast64_t written; /* batches written */
    /* The writer holds receipts through a store outage: no claims meanwhile,
     * or this relay would take its own expired leases over and publish those
     * effects again before their receipts are in. */
    atomic_bool receipts_held;
    atomic_int store_down; /* the store's last answer was an error */
    bool sync_init;

    atomic_int stop;
    atomic_int running;

    /* counters (read from any thread) */
    atomic_uint_fast64_t n_published, n_duplicates, n_errors, n_dead, n_inflight, n_batches,
        n_lease_lost, n_store_errors, n_first_dup, n_horizon_at_risk, n_horizon_passed,
        n_atomic_batches, n_atomic_effects;
    /* what the last run_until_idle left behind (from the store), -1 unknown */
    atomic_int_fast64_t left_failing, left_dead;

    /* metrics (all NULL without a registry: updates are then no-ops) */
    const jsd_metrics_std *mstd;
    jsd_metric *m_dead, *m_inflight, *m_first_dup, *m_horizon_at_risk, *m_horizon_passed;
    jsd_metric *m_commit_to_puback; /* jsd_relay_commit_to_puback_seconds */
    jsd_metric *m_atomic_batches;   /* jsd_relay_atomic_batches_total */
    jsd_metric *m_resends;          /* jsd_relay_batch_resends_total */
    jsd_metric *m_fallback[6]; /* jsd_relay_batch_fallbacks_total{reason}, by fallback_reason */
    int64_t gauges_due_ms;     /* the publishing thread's next backlog count (mono) */

    int64_t last_store_warn_ms; /* under err_mu */
    int64_t last_nats_warn_ms;  /* under err_mu */

    /* The last error: written by the publishing thread and the receipt
     * writer, read by jsd_relay_errmsg, always under err_mu. err_shown is
     * the copy jsd_relay_errmsg hands out. */
    pthread_mutex_t err_mu;
    jsd_error err;
    char err_shown[JSD_ERRMSG_MAX];
    uint64_t logged_published, logged_errors; /* for the progress line */
};

typedef enum relay_counter {
    RC_PUBLISHED,
    RC_DUPLICATES,
    RC_ERRORS,
    RC_DEAD,
    RC_LEASE_LOST,
    RC_STORE_ERRORS,
    RC_BATCHES,
    RC_FIRST_DUP,
    RC_HORIZON_AT_RISK,
    RC_HORIZON_PASSED
} relay_counter;

/* ---- relay.c -------------------------------------------------------------------- */

/* How many effects a claim may take now (DESIGN 12): up to max_in_flight
 * publications awaiting a PubAck (in_flight of them are), and none while
 * max_in_flight effects or more wait for the writer to record them
 * (unrecorded). */
size_t jsd__relay_claim_room(size_t max_in_flight, size_t in_flight, size_t unrecorded);

/* Whether the next claim waits for the PubAcks of what is in flight
 * (DESIGN 11). short_submitted_us: when the last claim was submitted if it
 * came back short (the outbox drained), 0 if it came back full (a backlog:
 * claims go on while publishing, whatever the batch size). True while fewer
 * than JSD__ACKS_DUE_MAX publications of a short claim are in flight and
 * it went out less than JSD__ACKS_DUE_US before now_us (monotonic µs):
 * their PubAcks are due (on loopback about 0.1 ms after the write), and a
 * claim holds the loop for 1.5-3 ms on PostgreSQL, so PubAcks arriving
 * meanwhile would be settled only after it. Late PubAcks hold a claim back
 * at most JSD__ACKS_DUE_US. */
#define JSD__ACKS_DUE_MAX 32
#define JSD__ACKS_DUE_US  1000
bool jsd__relay_acks_due(size_t in_flight, int64_t short_submitted_us, int64_t now_us);

/* Count n relay events (any thread): the handle's counter and, with a
 * registry, its metric. */
void jsd__relay_count(jsd_relay *r, relay_counter c, uint64_t n);

/* Record the handle's last error (any thread). Returns s. */
jsd_status jsd__relay_err(jsd_relay *r, jsd_status s, const char *fmt, ...) JSD_PRINTF(3, 4);

/* A store operation (what) failed: counted, recorded, logged at warn at most
 * every 5 s. */
void jsd__relay_store_trouble(jsd_relay *r, const char *what);
/* The same for an operation on st (the writer's handle). */
void jsd__relay_store_trouble_on(jsd_relay *r, jsd_store *st, const char *what);
/* NATS could not answer what a publication needs (a stream lookup: no
 * responders, a timeout) while connected: recorded, logged at warn at most
 * every 5 s. Not the effects' failure: they wait, spending no attempt. */
void jsd__relay_nats_trouble(jsd_relay *r, const char *why);

/* ---- relay_claim.c -------------------------------------------------------------- */

/* The retry horizon, publish deadline + backoff cap + lease +
 * poll interval, in ms: the stream's duplicate window must exceed it (the
 * relay checks it per stream; the doctor, src/doctor.c, reports it). */
int64_t jsd__relay_retry_horizon_ms(const jsd_relay_opts *o);

void jsd__relay_batch_free(rbatch *b);
/* Keep b for a later claim (a few are kept; the rest are freed). Either
 * thread; takes wq_mu. */
void jsd__relay_batch_recycle(jsd_relay *r, rbatch *b);
/* Map a publication result onto the slot. */
void jsd__relay_settle(jsd_relay *r, slot *sl, const jsd_publish_result *res,
                       const jsd__claimed *e);
/* Claim and submit one batch. Returns the number claimed (0 when nothing was
 * due), -1 on a store error. A publication or stream lookup that finds the
 * broker out sets r->broker_out. */
int jsd__relay_claim_and_submit(jsd_relay *r, int want);

/* ---- relay_batch.c -------------------------------------------------------------- */

/* Why a claim's effects went one by one instead of in an atomic batch: the
 * label values of jsd_relay_batch_fallbacks_total. */
typedef enum fallback_reason {
    FB_NOT_ALLOWED,        /* the stream's config has no allow_atomic */
    FB_DISABLED,           /* answered 10174: atomic publish is disabled */
    FB_UNSUPPORTED_HEADER, /* answered 10177: no Nats-Msg-Id in a batch (2.12.0) */
    FB_DUPLICATE,          /* answered 10201: an id the stream already holds */
    FB_INCOMPLETE,         /* answered 10176 again and again */
    FB_REFUSED,            /* another refusal, or a publication the engine rejects:
                              one by one, the bad one fails alone */
    FB_N
} fallback_reason;
extern const char *const jsd__relay_fallback_names[FB_N];

/* Whether effects for stream go in atomic batches now: allow_atomic (read
 * with its duplicate window) and not refused lately. A stream found without
 * allow_atomic or refusing batches is remembered for a while (said once at
 * info); when false, *why is the reason to count (FB_N: batches are off). */
bool jsd__relay_atomic_ok(jsd_relay *r, const char *stream, bool allow_atomic,
                          fallback_reason *why);
/* Count (and log at info) a fallback of n effects for stream. */
void jsd__relay_fallback(jsd_relay *r, fallback_reason why, const char *stream, size_t n,
                         const char *detail);
/* Publish the slots a claim marked for atomic batches (sl->sgroup, with
 * streams[sgroup - 1]), in claim order, split per stream and at
 * JSD__BATCH_MAX. */
void jsd__relay_submit_groups(jsd_relay *r, rbatch *b, char (*streams)[JSD_STREAM_NAME_MAX + 1],
                              size_t n_streams);
/* The outcome of an atomic batch's publication (from the engine). */
void jsd__relay_group_done(jsd_relay *r, bgroup *g, const jsd_publish_result *res);
/* Send again the batches whose back-off has passed (all of them released
 * when the relay stops); sleeps a little when only they are left. */
void jsd__relay_resend_due(jsd_relay *r);
/* Publish one slot alone (the per-message path); its outcome comes from the
 * engine, or at once. */
void jsd__relay_submit_one(jsd_relay *r, slot *sl, const char *stream);

/* ---- relay_horizon.c ------------------------------------------------------------ */

/* An effect about to be sent to stream (duplicate window window_ms, 0 when
 * unknown or none): marks the slot at risk or past the window when its first
 * attempt may have reached the broker long enough ago, logging and counting
 * it. */
void jsd__relay_horizon_on_send(jsd_relay *r, slot *sl, const jsd__claimed *e, int64_t window_ms,
                                int64_t now_ms);
/* A receipt of a slot sent past the window that the broker did not call a
 * duplicate: the message may now be in the stream twice (logged). */
void jsd__relay_horizon_on_receipt(jsd_relay *r, const slot *sl, const jsd__claimed *e);
/* The writer still holds b's receipts (the store does not answer): once the
 * oldest PubAck is half a duplicate window old, they are reported at risk
 * (once per batch). */
void jsd__relay_horizon_held(jsd_relay *r, rbatch *b, int64_t now_ms);

/* ---- relay_writer.c ------------------------------------------------------------- */

/* Hand a settled batch to the writer (or write it here when there is no
 * writer thread). */
void jsd__relay_hand_over(jsd_relay *r, rbatch *b);
/* Wait until the writer has written everything handed to it, at most ms
 * (< 0: for as long as that takes); true when it has. */
bool jsd__relay_writer_wait(jsd_relay *r, int ms);
void jsd__relay_writer_start(jsd_relay *r);
void jsd__relay_writer_stop(jsd_relay *r);

/* ---- relay_gauge.c -------------------------------------------------------------- */

#define JSD__GAUGES_EVERY_MS 5000 /* the backlog gauges' refresh, at the most often */
#define JSD__GAUGES_COST_X   20   /* ... and at least this many counts' time apart */

/* Count the backlog on st (under mu unless NULL) and set the gauges; a
 * failure is store trouble. Needs r->mstd. Returns when the next count is
 * due (jsd__mono_ms): the count's start + jsd__relay_gauge_interval_ms. */
int64_t jsd__relay_backlog_refresh(jsd_relay *r, jsd_store *st, pthread_mutex_t *mu);
/* The wait before the next count after one that took count_ms (relay_gauge.c). */
int64_t jsd__relay_gauge_interval_ms(int64_t count_ms);
/* The gauge thread, for a run with metrics and a gstore; no-ops otherwise. */
void jsd__relay_gauge_start(jsd_relay *r);
void jsd__relay_gauge_stop(jsd_relay *r);

#endif
