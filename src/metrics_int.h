/*
 * The standard metric families' handles: what the relay and the consumer
 * count into, registered by jsd_metrics_create. Internal: an application
 * registers its own series with jsd_metrics_register (metrics.h) and reads
 * the standard ones by name (jsd_metrics_get, jsd_metrics_snapshot).
 */
#ifndef JSD_METRICS_INT_H
#define JSD_METRICS_INT_H

#include "jsdurable/metrics.h"

/* Outcome of one delivery, the label of jsd_deliveries_total{result}. */
typedef enum jsd_delivery_result {
    JSD_RESULT_COMMIT = 0, /* handler ran, transaction committed, ACK confirmed */
    JSD_RESULT_DUPLICATE,  /* the inbox already held it: original outcome, re-ACK */
    JSD_RESULT_RETRY,      /* NAK (with delay): will be redelivered */
    JSD_RESULT_POISON,     /* malformed or unsupported: parked on first delivery */
    JSD_RESULT_DEADLETTER, /* max_deliver reached: parked as a death envelope */
    JSD__RESULT_COUNT
} jsd_delivery_result;

/* "commit", "duplicate", "retry", "poison", "deadletter" */
const char *jsd_delivery_result_str(jsd_delivery_result r);

/* Handles of the standard families, valid for the registry's lifetime. */
typedef struct jsd_metrics_std {
    jsd_metric *relay_published;   /* jsd_relay_published_total */
    jsd_metric *relay_duplicates;  /* jsd_relay_duplicates_total (PubAck duplicate=true) */
    jsd_metric *relay_errors;      /* jsd_relay_errors_total (failed publish attempts) */
    jsd_metric *outbox_backlog;    /* jsd_outbox_backlog (gauge: unpublished effects) */
    jsd_metric *outbox_oldest_age; /* jsd_outbox_oldest_unpublished_age_seconds (gauge) */
    jsd_metric *outbox_failing;    /* jsd_outbox_failing (gauge: failed at least once) */
    jsd_metric *deliveries[JSD__RESULT_COUNT]; /* jsd_deliveries_total{result} */
    jsd_metric *handler_duration;              /* jsd_handler_duration_seconds (histogram) */
    jsd_metric *dead_letters;                  /* jsd_dead_letters_total */
    jsd_metric *nats_connected;                /* jsd_nats_connected (gauge 0/1) */
    jsd_metric *nats_reconnects;               /* jsd_nats_reconnects_total */
} jsd_metrics_std;

/* The standard handles (never NULL for a valid registry). */
const jsd_metrics_std *jsd_metrics_std_of(const jsd_metrics *m);

/* The process-wide registry's handles. Never NULL: when it could not be made the
 * handles are NULL, and updates through them are no-ops. */
const jsd_metrics_std *jsd_metrics_default_std(void);

/* Components that feed standard families: the relay's (jsd_relay_*,
 * jsd_outbox_*) and the consumer's (jsd_deliveries_total,
 * jsd_handler_duration_seconds, jsd_dead_letters_total) are rendered only on
 * a registry where such a component was created; jsd_nats_* always. */
#define JSD__FEED_RELAY    1u
#define JSD__FEED_CONSUMER 2u
void jsd__metrics_feeds(jsd_metrics *m, unsigned feed);

/* The exposition of m in a buffer of its own (jsd__free it); for the HTTP
 * server (metrics_http.c). */
jsd_status jsd__metrics_render_alloc(jsd_metrics *m, char **out, size_t *len);

#endif
