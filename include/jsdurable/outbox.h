/*
 * The outbox's operator tools (what `jsdurable outbox` and `jsdurable
 * verify` run): list the effects of a store by state in bounded pages, show
 * one effect with its receipt and lease, requeue dead-lettered effects with
 * their message id unchanged, and count the dead-letter reasons. The
 * functions are jsd_outbox_*; one effect read back is a jsd_outbox_entry,
 * plain data in caller-owned memory (no free function), so a page of them is
 * one flat array whatever the size of the table.
 */
#ifndef JSDURABLE_OUTBOX_H
#define JSDURABLE_OUTBOX_H

#include <stdbool.h>

#include "status.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where an effect is in its life. */
typedef enum jsd_outbox_state {
    JSD_OUTBOX_UNPUBLISHED = 0, /* a query: pending or dead-lettered */
    JSD_OUTBOX_PENDING = 1,     /* waiting for the relay (perhaps failing, perhaps leased) */
    JSD_OUTBOX_DEAD = 2,        /* dead-lettered: never claimed until requeued */
    JSD_OUTBOX_PUBLISHED = 3    /* has a receipt (stream, sequence) */
} jsd_outbox_state;

/* "pending", "dead", "published" ("unpublished" for the query value). */
JSD_EXTERN const char *jsd_outbox_state_name(jsd_outbox_state s);

#define JSD_OUTBOX_TEXT_MAX 1024 /* bytes of a last error or dead reason kept */
#define JSD_OUTBOX_PAGE_MAX 1000 /* rows per jsd_outbox_list call */

/* One effect as the store holds it. Texts are NUL-terminated; a column that
 * is NULL reads as "" (numbers as 0). */
typedef struct jsd_outbox_entry {
    int64_t row_id; /* commit order; the keyset for paging */
    jsd_outbox_state state;
    char owner[JSD_IDENT_MAX + 1];
    char effect_id[JSD_IDENT_MAX + 1];
    char msg_id[JSD_IDENT_MAX + 1]; /* the Nats-Msg-Id it is (or was) published with */
    char subject[JSD_SUBJECT_MAX + 1];
    char order_key[JSD_IDENT_MAX + 1];
    size_t payload_len;
    int attempts; /* failed attempts since emit or the last requeue */
    int64_t created_at_ms;
    int64_t not_before_ms;
    int64_t next_attempt_at_ms;
    char last_error[JSD_OUTBOX_TEXT_MAX + 1];
    int64_t dead_lettered_at_ms; /* 0 unless dead */
    char dead_reason[JSD_OUTBOX_TEXT_MAX + 1];
    /* the receipt (published only) */
    char stream[JSD_IDENT_MAX + 1];
    uint64_t stream_seq;
    bool
        duplicate; /* the PubAck said duplicate (pending: an earlier lease may have published it) */
    int64_t published_at_ms;
    /* the lease, as of the read: held by a relay until lease_expires_ms */
    bool leased;
    int64_t lease_expires_ms;
} jsd_outbox_entry;

/* Which effects a page holds: those in state (JSD_OUTBOX_UNPUBLISHED: pending
 * and dead), on subject when given (exact), published at or after
 * published_since_ms (published only; 0: any), with a row id above
 * after_row_id, in row-id order, at most limit (1..JSD_OUTBOX_PAGE_MAX). */
typedef struct jsd_outbox_query {
    jsd_outbox_state state;
    const char *subject;
    int64_t published_since_ms;
    int64_t after_row_id;
    size_t limit;
} jsd_outbox_query;

/*
 * One page of effects into out (room for q->limit entries); *n receives how
 * many. The next page is the query again with after_row_id set to the last
 * entry's row_id; a page shorter than limit is the last. Reads only. The
 * store must have no transaction open. JSD_ERR_INVALID for a bad query.
 */
JSD_EXTERN jsd_status jsd_outbox_list(jsd_store *s, const jsd_outbox_query *q,
                                      jsd_outbox_entry *out, size_t *n);

/* One effect by its identity (owner "" when the application gave none).
 * JSD_ERR_NOT_FOUND when the store has no such effect. */
JSD_EXTERN jsd_status jsd_outbox_get(jsd_store *s, const char *owner, const char *effect_id,
                                     jsd_outbox_entry *out);

/*
 * Give a dead-lettered effect a fresh attempt budget: due now, attempts 0,
 * dead reason cleared, the message id unchanged (a copy already in the
 * stream inside its duplicate window collapses with the retry). Idempotent:
 * an effect already pending is left as it is, *requeued (may be NULL) says
 * whether this call requeued it. A published effect is refused
 * (JSD_ERR_INVALID, the message names its receipt): publishing it again is
 * what `jsdurable verify --repair` decides, for a message the stream lost.
 * JSD_ERR_NOT_FOUND when there is no such effect.
 */
JSD_EXTERN jsd_status jsd_outbox_requeue(jsd_store *s, const char *owner, const char *effect_id,
                                         bool *requeued);

/* Requeue every dead-lettered effect (on subject when given), in batches
 * of 500 rows per transaction; *requeued (may be NULL) counts them. */
JSD_EXTERN jsd_status jsd_outbox_requeue_dead(jsd_store *s, const char *subject, int64_t *requeued);

/* Dead letters grouped by reason (the first 200 bytes of it). */
typedef struct jsd_outbox_reason {
    char reason[201];
    int64_t count;
} jsd_outbox_reason;

/* The cap most frequent reasons, most frequent first, into out; *n receives
 * how many. Scans the dead-lettered effects: for a report, not a loop. */
JSD_EXTERN jsd_status jsd_outbox_dead_reasons(jsd_store *s, jsd_outbox_reason *out, size_t cap,
                                              size_t *n);

#ifdef __cplusplus
}
#endif
#endif
