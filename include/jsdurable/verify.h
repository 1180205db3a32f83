/*
 * Verify (what `jsdurable verify` runs): audit the store's receipts against
 * the stream. Every receipted effect in range names the stream message that
 * acknowledged it (stream, sequence); verify reads that message back with a
 * stored-message get and checks it carries the effect's Nats-Msg-Id. A
 * receipt whose message is gone while the stream still keeps that sequence
 * range is an acknowledged write the broker lost, and one whose sequence
 * holds another message was lost with a re-created stream or a broker that
 * came back on an older store and reused the sequence; --repair takes both
 * kinds of receipt back so the relay publishes the effects again with their
 * unchanged id. The functions are jsd_verify_*.
 */
#ifndef JSDURABLE_VERIFY_H
#define JSDURABLE_VERIFY_H

#include <stdbool.h>

#include "conn.h"
#include "metrics.h"
#include "status.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a receipt's stream message says. */
typedef enum jsd_verify_verdict {
    JSD_VERIFY_OK = 0,      /* the sequence holds the effect's msg id */
    JSD_VERIFY_MISSING,     /* acknowledged, then lost: the sequence is gone though the
                               stream still keeps its range (>= first sequence, not past
                               max age) */
    JSD_VERIFY_OVERWRITTEN, /* the sequence holds another msg id (the stream was recreated) */
    JSD_VERIFY_EXPIRED,     /* below the stream's first sequence, or older than its max
                               age: removed by its limits or a purge; expected, not an error */
    JSD_VERIFY_STREAM_GONE, /* the stream named in the receipt does not exist */
    /* Not a receipt's verdict but what the scan after the audit finds: the
     * receipt's message is there, and the stream holds the effect's msg id
     * at another sequence too (other_seq): it was published again after
     * its stream's duplicate window, e.g. by a relay whose store lost the
     * first receipt (restored from an older backup). Two copies in the
     * stream; a consumer's inbox applies the second as a duplicate while it
     * keeps the first's row. */
    JSD_VERIFY_REPUBLISHED
} jsd_verify_verdict;

/* "ok", "missing", "overwritten", "expired", "stream_gone". */
JSD_EXTERN const char *jsd_verify_verdict_name(jsd_verify_verdict v);

/* One receipt that is not ok, as reported to on_finding. The strings live
 * until the callback returns. */
typedef struct jsd_verify_finding {
    jsd_verify_verdict verdict;
    int64_t row_id;
    const char *owner;
    const char *effect_id;
    const char *msg_id; /* the effect's */
    const char *stream;
    uint64_t stream_seq;
    int64_t published_at_ms;
    const char *found_msg_id; /* overwritten: the id the sequence holds ("" when none) */
    uint64_t other_seq;       /* republished: the other sequence holding msg_id */
    /* --repair, missing and overwritten: the receipt was taken back (the relay publishes
     * the effect again with msg_id); false when the row changed meanwhile. */
    bool repaired;
    /* Repaired, but the stream may still remember msg_id in its duplicate
     * window until dup_window_ends_ms: a republish before then is answered
     * "duplicate" and stores nothing; verify again after that time (and
     * repair again). */
    bool in_dup_window;
    int64_t dup_window_ends_ms;
} jsd_verify_finding;

typedef struct jsd_verify_report {
    uint64_t checked;
    uint64_t ok;
    uint64_t missing;
    uint64_t overwritten;
    uint64_t expired;
    uint64_t stream_gone;
    /* Copies of audited effects at another sequence of their stream
     * (JSD_VERIFY_REPUBLISHED); not counted in checked. */
    uint64_t republished;
    uint64_t repaired;           /* receipts taken back (--repair) */
    uint64_t repaired_in_window; /* of those, still inside the stream's duplicate window */
} jsd_verify_report;

typedef struct jsd_verify_opts {
    /* Receipts published at or after now - since_ms; 0: every receipt. */
    int64_t since_ms;
    /* Take back the receipts of missing effects (the only store writes). */
    bool repair;
    /* Receipts per store read, 1..1000; default 500. */
    size_t batch;
    /* When given, the jsd_verify_* counters are registered there and
     * counted (docs/METRICS.md). */
    jsd_metrics *metrics;
    /* Called for each receipt that is not ok (expired ones too), after its
     * batch was repaired, and for each republished copy the scan after the
     * audit finds, on the calling thread. */
    void (*on_finding)(void *user, const jsd_verify_finding *f);
    /* Called after each batch with the totals so far. */
    void (*on_progress)(void *user, const jsd_verify_report *so_far);
    void *user;
} jsd_verify_opts;

JSD_EXTERN void jsd_verify_opts_init(jsd_verify_opts *o);

/*
 * Check every receipted effect of s in range against the streams of conn,
 * in row-id order, in batches; *out receives the totals (also on an error:
 * what was checked so far). Read-only unless o->repair. JSD_OK when the run
 * finished, whatever it found (the report says what: missing, overwritten
 * and stream_gone are the problems); an error when the store or the server
 * could not be read (err says which; a run can be repeated). Not
 * thread-safe on s or conn.
 */
JSD_EXTERN jsd_status jsd_verify_run(jsd_store *s, jsd_conn *conn, const jsd_verify_opts *o,
                                     jsd_verify_report *out, jsd_error *err);

#ifdef __cplusplus
}
#endif
#endif
