/*
 * Metrics (OBS-1,2): a small registry of counters, gauges and fixed-bucket
 * histograms, a snapshot API, Prometheus text exposition and an HTTP server
 * (libmicrohttpd) for GET /metrics. docs/METRICS.md lists every metric and the
 * alerts worth setting.
 *
 * A registry comes with the standard jsdurable families already registered:
 * the relay, the outbox, ingress deliveries by result, the handler-duration
 * histogram, dead letters and the NATS connection (the library's own handles
 * to them are internal). An application registers its own series with
 * jsd_metrics_register and updates a handle: one atomic operation, no lock,
 * from any thread. Registration, snapshot and exposition take the registry's
 * lock.
 *
 * Labels are a fixed small set: a series has at most one label (e.g.
 * result="commit"), fixed when it is registered, plus an optional constant
 * label for the whole registry (e.g. consumer="shipping"). Label values come
 * from code, never from message data, and nothing secret is a label or a
 * value.
 */
#ifndef JSDURABLE_METRICS_H
#define JSDURABLE_METRICS_H

#include "conn.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct jsd_metrics jsd_metrics;
/* One series: a counter, a gauge or a histogram. Owned by its registry. */
typedef struct jsd_metric jsd_metric;

typedef enum jsd_metric_kind {
    JSD_METRIC_COUNTER = 0,
    JSD_METRIC_GAUGE,
    JSD_METRIC_HISTOGRAM
} jsd_metric_kind;

#define JSD_METRICS_SERIES_MAX      256 /* series per registry */
#define JSD_METRICS_BUCKETS_MAX     16  /* bounds per histogram (+Inf is implicit) */
#define JSD_METRICS_NAME_MAX        96  /* metric and label names */
#define JSD_METRICS_LABEL_VALUE_MAX 64
#define JSD_METRICS_HELP_MAX        256

/* A registry with the standard families registered. */
JSD_EXTERN jsd_status jsd_metrics_create(jsd_metrics **out, jsd_error *err);
/* Accepts NULL. Stop any server first; handles die with the registry. */
JSD_EXTERN void jsd_metrics_destroy(jsd_metrics *m);
/* The process-wide registry, created on first use (thread-safe) and kept
 * until the process exits. The relay and the consumer count into it, so a
 * program serves it with jsd_metrics_serve(&srv, jsd_metrics_default(), ...).
 * NULL only when it could not be allocated. */
JSD_EXTERN jsd_metrics *jsd_metrics_default(void);

/* A constant label added to every series, e.g. ("consumer", "shipping").
 * Call before the first exposition; a second call replaces the first. */
JSD_EXTERN jsd_status jsd_metrics_set_const_label(jsd_metrics *m, const char *name,
                                                  const char *value, jsd_error *err);

/*
 * Register a series. name: [a-zA-Z_:][a-zA-Z0-9_:]*; label_name NULL for an
 * unlabeled series, else [a-zA-Z_][a-zA-Z0-9_]* with a printable label_value.
 * Series of one name share kind, help and bounds. Registering the same
 * (name, label value) again returns the existing handle. Histogram bounds are
 * ascending upper bounds (at most JSD_METRICS_BUCKETS_MAX); NULL for others.
 * JSD_ERR_INVALID for a bad name, JSD_ERR_EXISTS for a kind/help clash,
 * JSD_ERR_LIMIT past JSD_METRICS_SERIES_MAX.
 */
JSD_EXTERN jsd_status jsd_metrics_register(jsd_metrics *m, jsd_metric_kind kind, const char *name,
                                           const char *help, const char *label_name,
                                           const char *label_value, const double *bounds,
                                           size_t n_bounds, jsd_metric **out, jsd_error *err);

/* Updates: thread-safe, lock-free, and no-ops on NULL handles (so a module
 * without metrics passes NULL) or on a handle of another kind. */
JSD_EXTERN void jsd_counter_add(jsd_metric *c, uint64_t n);
JSD_EXTERN void jsd_counter_inc(jsd_metric *c);
/* Raise a counter to v when it is below (mirrors a monotonic source). */
JSD_EXTERN void jsd_counter_raise_to(jsd_metric *c, uint64_t v);
JSD_EXTERN void jsd_gauge_set(jsd_metric *g, double v);
JSD_EXTERN void jsd_gauge_add(jsd_metric *g, double d);
JSD_EXTERN void jsd_histogram_observe(jsd_metric *h, double v);

/* Copy the connection's state into jsd_nats_connected and
 * jsd_nats_reconnects_total. Call it periodically or before exposition;
 * the server does so on every scrape when given a connection. */
JSD_EXTERN void jsd_metrics_observe_conn(jsd_metrics *m, jsd_conn *c);

/* ---- reading ----------------------------------------------------------- */
typedef struct jsd_metric_value {
    const char *name;        /* family name */
    const char *label_name;  /* NULL when unlabeled */
    const char *label_value; /* NULL when unlabeled */
    jsd_metric_kind kind;
    double value;   /* counter or gauge value; a histogram's sum */
    uint64_t count; /* a histogram's number of observations; a counter's value */
} jsd_metric_value;

/* Fill out with up to cap series in registration order; *n receives the
 * number of series. JSD_ERR_LIMIT when cap was too small (out holds the
 * first cap). The strings live as long as the registry. */
JSD_EXTERN jsd_status jsd_metrics_snapshot(jsd_metrics *m, jsd_metric_value *out, size_t cap,
                                           size_t *n);

/* One series' value by name and label value (NULL for unlabeled):
 * JSD_ERR_NOT_FOUND when no such series. */
JSD_EXTERN jsd_status jsd_metrics_get(jsd_metrics *m, const char *name, const char *label_value,
                                      double *value);

/* Prometheus text exposition format 0.0.4 into buf (NUL-terminated). *len
 * receives the length it needs without the NUL; JSD_ERR_LIMIT when cap is
 * smaller than that plus one (buf then holds nothing useful). */
JSD_EXTERN jsd_status jsd_metrics_render(jsd_metrics *m, char *buf, size_t cap, size_t *len);

/* ---- HTTP ----------------------------------------------------------------- */
typedef struct jsd_metrics_server jsd_metrics_server;

/*
 * Serve GET (and HEAD) on addr "HOST:PORT" ("127.0.0.1:9464", "[::1]:9464",
 * "0.0.0.0:9464"; ":9464" binds every interface as Prometheus exporters do;
 * port 0 picks a free one) from a thread of its own:
 *   /metrics  the Prometheus text exposition;
 *   /healthz  200 "ok" while the process serves at all (liveness);
 *   /readyz   200 "ready" only while conn (when given) is connected to NATS
 *             and the readiness hook (when set) says ready; otherwise 503
 *             with one line per missing dependency ("nats: not connected",
 *             the hook's text).
 * Any other path is 404, any other method 405. conn (optional) is observed on
 * every scrape. The registry and conn must outlive the server.
 */
JSD_EXTERN jsd_status jsd_metrics_serve(jsd_metrics_server **out, jsd_metrics *m, jsd_conn *conn,
                                        const char *addr, jsd_error *err);
/*
 * Readiness hook for /readyz, called on the server's thread: return true when
 * ready, or false after writing what is missing (one short line, no secrets)
 * into why[0..cap). It must not use a handle that is not thread-safe (read a
 * flag the daemon's own loop keeps instead). fn NULL removes it. Thread-safe.
 */
typedef bool (*jsd_ready_fn)(void *user, char *why, size_t cap);
JSD_EXTERN void jsd_metrics_server_set_ready(jsd_metrics_server *s, jsd_ready_fn fn, void *user);
/* The bound port (useful after port 0). */
JSD_EXTERN int jsd_metrics_server_port(const jsd_metrics_server *s);
/* Stop and free. Accepts NULL. */
JSD_EXTERN void jsd_metrics_server_destroy(jsd_metrics_server *s);

#ifdef __cplusplus
}
#endif
#endif
