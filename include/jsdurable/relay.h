/*
 * The outbox relay (RELAY-1..4): publishes committed outbox effects to
 * JetStream and records the broker's receipt.
 *
 * A relay claims due effects in batches under a lease, publishes each one
 * asynchronously with its stable Nats-Msg-Id (derived from owner and effect
 * id, the same on every retry) and the stream that captures its subject as
 * Nats-Expected-Stream, waits for the PubAcks, and then writes the receipts of
 * the whole batch (stream, sequence, duplicate flag) in one transaction that
 * still holds the lease. Publish first, receipt second: a crash in between
 * leaves the lease to expire, and the retry with the same id is collapsed by
 * JetStream's duplicate window (the receipt then says duplicate=true).
 *
 * A failed publication stores no receipt: the attempt count and last error
 * grow, the next attempt waits by capped exponential backoff, and when the
 * attempt budget is spent the effect is dead-lettered (it stays in the store,
 * visible to `jsdurable status`). Effects that share an ordering key are
 * published one at a time in commit order; a failing one holds back the rest
 * of its key until it is published or dead-lettered. While NATS is down the
 * relay keeps running and claims nothing; the backlog drains on recovery.
 *
 * Several relays (processes) may share one PostgreSQL database without a
 * leader; on SQLite run one relay per database file.
 */
#ifndef JSDURABLE_RELAY_H
#define JSDURABLE_RELAY_H

#include "conn.h"
#include "metrics.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct jsd_relay jsd_relay;

/* What on_published receives for each effect whose receipt was committed.
 * Pointers are valid only during the call. */
typedef struct jsd_relay_published {
    const char *owner;
    const char *id;
    const char *msg_id; /* the Nats-Msg-Id it carried */
    const char *subject;
    const char *stream;
    uint64_t seq;          /* stream sequence from the PubAck */
    int duplicate;         /* the broker had it already (a retry was collapsed) */
    int64_t acked_mono_us; /* monotonic clock (CLOCK_MONOTONIC, µs) when the PubAck arrived */
} jsd_relay_published;

typedef void (*jsd_relay_published_fn)(const jsd_relay_published *p, void *user);

typedef struct jsd_relay_opts {
    int batch_size;          /* effects per claim, 1..4096; default 256 */
    int max_in_flight;       /* publications awaiting a PubAck, 1..1024; default 1024 */
    int lease_ms;            /* claim lease; default 30000; must exceed publish_deadline_ms
                                by at least 1000 (the lease covers publish + receipt) */
    int poll_interval_ms;    /* query at least this often when idle; default 1000 */
    int publish_deadline_ms; /* per publication, PubAck included; (0, 300000]; default 5000 */
    int backoff_base_ms;     /* first retry delay after a failure; default 500 */
    /* Longest retry delay; default 60000. An UNKNOWN publication may have
     * been stored: its retry must reach the broker inside the stream's
     * duplicate window, so publish_deadline_ms + backoff_cap_ms + lease_ms
     * + poll_interval_ms must stay below that window (JetStream's default is 2 minutes); the
     * relay reads each target stream's window and refuses to go on when it
     * does not fit (see jsd_relay_run_until_idle). */
    int backoff_cap_ms;
    int attempt_budget; /* failed attempts before dead-lettering, 1..100000; default 50 */
    /* Optional observer, called after a batch's receipts are committed, once
     * per effect retired, on the relay's receipt-writer thread (not the thread
     * that called jsd_relay_run). It must be quick and must not call back into
     * the relay (except jsd_relay_stop and jsd_relay_stats_get). */
    jsd_relay_published_fn on_published;
    void *on_published_user;
    /* Registry (borrowed; must outlive the relay); NULL: the process-wide
     * jsd_metrics_default(). The relay feeds
     * jsd_relay_published_total, jsd_relay_duplicates_total,
     * jsd_relay_errors_total, jsd_relay_dead_lettered_total,
     * jsd_relay_first_attempt_duplicates_total,
     * jsd_relay_in_flight, and every 5 s jsd_outbox_backlog and
     * jsd_outbox_oldest_unpublished_age_seconds from its store. */
    jsd_metrics *metrics;
    /* The fewest effects of one claim for one stream that go as one atomic
     * batch where the stream allows them (docs/RELAY.md, "Atomic batches");
     * fewer go one by one. 1..1000; default 16: on nats-server 2.15 with
     * sync_interval: always an atomic batch costs the server about 5 ms
     * whatever its size, so a batch of a few effects is slower than
     * publishing them one by one, and a trickle of effects would wait. */
    int atomic_min;
} jsd_relay_opts;

/* Fill defaults. */
JSD_EXTERN void jsd_relay_opts_init(jsd_relay_opts *o);

/*
 * Make a relay. store and conn are borrowed and must outlive the relay. The
 * relay uses store from its own threads (the run loop and its receipt
 * writer, taking turns) for its whole life: pass a store handle opened for
 * the relay alone (jsd_store_open again on the same URL), not one the
 * application also uses. The options are copied and validated
 * (JSD_ERR_CONFIG names the bad one). On failure *out is NULL and err says why.
 */
JSD_EXTERN jsd_status jsd_relay_create(jsd_relay **out, jsd_store *store, jsd_conn *conn,
                                       const jsd_relay_opts *opts, jsd_error *err);

/*
 * Run until jsd_relay_stop(): claim, publish, record receipts and failures,
 * wait for wake-ups when idle. A NATS outage never ends it (reconnect_attempts
 * -1, the default); a store failure
 * is logged, counted and retried after the poll interval. On stop it claims
 * nothing new, settles the publications in flight (each within its deadline)
 * and writes their receipts, then returns JSD_OK. Returns an error for a
 * misuse (JSD_ERR_INVALID, JSD_ERR_BUSY when already running), a target
 * stream whose duplicate window the retries do not fit (JSD_ERR_CONFIG, see
 * backoff_cap_ms), and a connection that nats.c closed for good
 * (JSD_ERR_CONNECT: reconnect_attempts exhausted, or the server refused the
 * credentials twice in a row), after settling what was in flight as on stop.
 */
JSD_EXTERN jsd_status jsd_relay_run(jsd_relay *r);

/*
 * Run until nothing is due and nothing is in flight, then return JSD_OK
 * (also after jsd_relay_stop()). Effects whose not-before time or backoff lies
 * in the future are not waited for. While NATS is down it keeps waiting (a
 * backlog is due work). Useful for batch jobs and tests. What it could not
 * publish is counted in jsd_relay_stats (left_failing, dead_lettered,
 * left_dead_lettered) and logged at warn: check them before calling the job
 * done.
 *
 * Both runs return JSD_ERR_CONFIG (jsd_relay_errmsg names the stream and the
 * figures) when a target stream's duplicate window is shorter than the
 * relay's retry horizon, publish_deadline_ms + backoff_cap_ms + lease_ms +
 * poll_interval_ms (a due retry may wait one poll before it is claimed): the
 * relay checks each stream the first time an effect is bound for it (and
 * again every minute), releases what it claimed, and stops rather than store
 * retries twice.
 */
JSD_EXTERN jsd_status jsd_relay_run_until_idle(jsd_relay *r);

/*
 * Ask a running relay to stop. Thread-safe and async-signal-safe: it only
 * stores to a lock-free atomic flag, so a signal handler may call it. The
 * relay notices within 100 ms.
 */
JSD_EXTERN void jsd_relay_stop(jsd_relay *r);

/* Destroy a relay that is not running. Accepts NULL. Publications still in
 * flight (a run that returned early on an error) keep their leases, which
 * expire. */
JSD_EXTERN void jsd_relay_destroy(jsd_relay *r);

typedef struct jsd_relay_stats {
    uint64_t published;     /* receipts committed (duplicates included) */
    uint64_t duplicates;    /* of those, duplicate=true */
    uint64_t errors;        /* failed attempts recorded (failed, denied, unknown, no stream) */
    uint64_t dead_lettered; /* effects whose budget this relay spent */
    uint64_t in_flight;     /* publications awaiting a PubAck right now */
    uint64_t batches;       /* claims that returned at least one effect */
    uint64_t lease_lost;    /* receipts refused because the lease had been taken over */
    uint64_t store_errors;  /* store calls that failed and were retried */
    /* PubAcks that said duplicate on an effect's first attempt (no failed
     * attempt, no earlier lease that could have published it): another
     * producer's message holds the id. Each such effect is dead-lettered. */
    uint64_t first_attempt_duplicates;
    /* The duplicate-window horizon (docs/RELAY.md): attempts that started
     * with the effect's first attempt (which may have reached the broker)
     * more than half its stream's duplicate window ago, and batches whose
     * receipts stayed unwritten that long (a store outage); and attempts that
     * started past the whole window, each a possible duplicate. Each is
     * logged at warn. */
    uint64_t horizon_at_risk;
    uint64_t horizon_passed;
    /* 1 while the store's last answer to this relay was an error (an outage:
     * claims paused, receipts held), 0 once it answers again: what /readyz
     * reports. */
    int store_down;
    /* Set when a jsd_relay_run_until_idle returns (-1 before, or when the
     * store could not be read): effects left unpublished that failed at least
     * once and wait for a retry, and every dead-lettered effect of the store. */
    int64_t left_failing;
    int64_t left_dead_lettered;
    /* Atomic batches whose commit the stream acknowledged (docs/RELAY.md,
     * "Atomic batches"), and the effects they carried: the rest went one by
     * one (a stream without allow_atomic, an older server, a fallback). */
    uint64_t atomic_batches;
    uint64_t atomic_effects;
} jsd_relay_stats;

/* A snapshot of the counters. Thread-safe. */
JSD_EXTERN void jsd_relay_stats_get(jsd_relay *r, jsd_relay_stats *out);

/* The outbox's unpublished trouble, read from the store (for `status`). */
typedef struct jsd_outbox_trouble {
    int64_t failing;                  /* unpublished, not dead-lettered, failed at least once */
    int64_t dead_lettered;            /* dead-lettered effects */
    int64_t first_attempt_duplicates; /* of those, a duplicate PubAck on the first attempt */
} jsd_outbox_trouble;

/* Count them: scans the outbox, so call it for a report, not in a loop. The
 * store must have no transaction open. */
JSD_EXTERN jsd_status jsd_outbox_trouble_get(jsd_store *s, jsd_outbox_trouble *out);

/* Last error text of this handle ("" if none). */
JSD_EXTERN const char *jsd_relay_errmsg(const jsd_relay *r);

#ifdef __cplusplus
}
#endif
#endif
