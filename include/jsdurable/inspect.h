/*
 * Read-only views of the NATS side for operators: a stream's depth and its
 * durable consumers' lag (what `jsdurable status --nats` prints). Nothing here
 * changes the server.
 */
#ifndef JSDURABLE_INSPECT_H
#define JSDURABLE_INSPECT_H

#include <stdbool.h>

#include "conn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct jsd_durable_state {
    char name[256];
    uint64_t pending;       /* messages not yet delivered to the durable (its lag) */
    int64_t ack_pending;    /* delivered, not yet acknowledged */
    int64_t redelivered;    /* delivered more than once and still unacknowledged */
    int64_t waiting;        /* pull requests waiting */
    uint64_t delivered_seq; /* last stream sequence delivered */
    uint64_t ack_floor_seq; /* stream sequence below which everything is acknowledged */
    /* delivered_seq or ack_floor_seq past the stream's last sequence: the
     * server lost the stream's tail (jsd_durable_position). */
    bool ahead;
    /* Filled only by a caller that has the store (`jsdurable status --store
     * --nats`, with jsd_durable_position_get): the inbox's high-water mark,
     * and the first stream sequence the durable acknowledged that the inbox
     * lost (0: none). */
    uint64_t inbox_high, inbox_behind_from;
} jsd_durable_state;

typedef struct jsd_stream_state {
    char name[129];
    char subjects[512]; /* comma-separated */
    /* Under the default dead-letter root "jsd.dlq." (then `messages` is the
     * dead-letter depth). */
    bool dead_letter;
    uint64_t messages, bytes, first_seq, last_seq;
    int64_t duplicate_window_ms;
    int replicas;
    bool file_storage;
    char leader[64]; /* cluster leader's server name, "" on a single server */
    jsd_durable_state *durables;
    size_t n_durables;
} jsd_stream_state;

/* One stream and its durable consumers. *out is filled; release it with
 * jsd_stream_state_clear. JSD_ERR_NOT_FOUND when the stream is missing. */
JSD_EXTERN jsd_status jsd_stream_state_get(jsd_conn *c, const char *stream, jsd_stream_state *out,
                                           jsd_error *err);
/* Every stream of the account, with their consumers. *out is an array of *n;
 * release with jsd_stream_states_free. */
JSD_EXTERN jsd_status jsd_stream_states_list(jsd_conn *c, jsd_stream_state **out, size_t *n,
                                             jsd_error *err);
JSD_EXTERN void jsd_stream_state_clear(jsd_stream_state *s);
JSD_EXTERN void jsd_stream_states_free(jsd_stream_state *arr, size_t n);

#ifdef __cplusplus
}
#endif
#endif
