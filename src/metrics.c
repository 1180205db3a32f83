/*
 * metrics — the registry of counters, gauges and fixed-bucket histograms,
 * its snapshot and the Prometheus text exposition (OBS-1,2); the HTTP server
 * that serves it is src/metrics_http.c.
 *
 * Series are allocated one by one and never move or die before the registry,
 * so a handle is a plain pointer that the relay and ingress threads update
 * with one atomic operation and no lock. Gauges and histogram sums hold a
 * double's bits in a 64-bit atomic (compare-and-swap for additions).
 * Registration, snapshot and exposition hold the registry's mutex; they read
 * each value atomically, so a scrape sees every value as of some instant
 * during the scrape (a histogram's buckets, sum and count may be a few
 * observations apart, as in every Prometheus client).
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsd_int.h"

typedef struct family {
    char name[JSD_METRICS_NAME_MAX + 1];
    char help[JSD_METRICS_HELP_MAX + 1];
    char label_name[JSD_METRICS_NAME_MAX + 1]; /* "" when unlabeled */
    jsd_metric_kind kind;
    double bounds[JSD_METRICS_BUCKETS_MAX];
    size_t n_bounds;
    unsigned feed; /* JSD__FEED_*: rendered only once that component feeds it; 0: always */
} family;

struct jsd_metric {
    jsd_metric_kind kind;
    const family *fam;
    char label_value[JSD_METRICS_LABEL_VALUE_MAX + 1];
    _Atomic uint64_t u; /* counter value, or a gauge's double bits */
    /* histogram: per-bucket counts (non-cumulative; the last is +Inf) */
    _Atomic uint64_t buckets[JSD_METRICS_BUCKETS_MAX + 1];
    _Atomic uint64_t count;
    _Atomic uint64_t sum_bits;
};

struct jsd_metrics {
    pthread_mutex_t mu;
    family *fams[JSD_METRICS_SERIES_MAX];
    size_t n_fams;
    jsd_metric *series[JSD_METRICS_SERIES_MAX];
    size_t n_series;
    char const_name[JSD_METRICS_NAME_MAX + 1];
    char const_value[JSD_METRICS_LABEL_VALUE_MAX + 1];
    jsd_metrics_std std;
    _Atomic unsigned fed; /* JSD__FEED_* of the components created on this registry */
};

static const char *const result_names[JSD__RESULT_COUNT] = {"commit", "duplicate", "retry",
                                                            "poison", "deadletter"};

const char *jsd_delivery_result_str(jsd_delivery_result r)
{
    return (unsigned)r < JSD__RESULT_COUNT ? result_names[r] : "?";
}

/* ---- atomics on doubles -------------------------------------------------------- */

static uint64_t d2u(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof(u));
    return u;
}

static double u2d(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof(d));
    return d;
}

static void atomic_add_double(_Atomic uint64_t *p, double d)
{
    uint64_t old = atomic_load_explicit(p, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(p, &old, d2u(u2d(old) + d), memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

void jsd_counter_add(jsd_metric *c, uint64_t n)
{
    if (c && c->kind == JSD_METRIC_COUNTER)
        atomic_fetch_add_explicit(&c->u, n, memory_order_relaxed);
}

void jsd_counter_inc(jsd_metric *c)
{
    jsd_counter_add(c, 1);
}

void jsd_counter_raise_to(jsd_metric *c, uint64_t v)
{
    if (!c || c->kind != JSD_METRIC_COUNTER)
        return;
    uint64_t old = atomic_load_explicit(&c->u, memory_order_relaxed);
    while (old < v && !atomic_compare_exchange_weak_explicit(&c->u, &old, v, memory_order_relaxed,
                                                             memory_order_relaxed))
        ;
}

void jsd_gauge_set(jsd_metric *g, double v)
{
    if (g && g->kind == JSD_METRIC_GAUGE)
        atomic_store_explicit(&g->u, d2u(v), memory_order_relaxed);
}

void jsd_gauge_add(jsd_metric *g, double d)
{
    if (g && g->kind == JSD_METRIC_GAUGE)
        atomic_add_double(&g->u, d);
}

void jsd_histogram_observe(jsd_metric *h, double v)
{
    if (!h || h->kind != JSD_METRIC_HISTOGRAM || isnan(v))
        return;
    size_t i = 0;
    while (i < h->fam->n_bounds && v > h->fam->bounds[i])
        i++;
    atomic_fetch_add_explicit(&h->buckets[i], 1, memory_order_relaxed);
    atomic_add_double(&h->sum_bits, v);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
}

/* ---- registration ------------------------------------------------------------- */

static bool name_ok(const char *s, bool colon_ok)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > JSD_METRICS_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool alpha =
            (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon_ok && c == ':');
        if (!alpha && !(i > 0 && c >= '0' && c <= '9'))
            return false;
    }
    return true;
}

static bool label_value_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > JSD_METRICS_LABEL_VALUE_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
            return false;
    return true;
}

jsd_status jsd_metrics_register(jsd_metrics *m, jsd_metric_kind kind, const char *name,
                                const char *help, const char *label_name, const char *label_value,
                                const double *bounds, size_t n_bounds, jsd_metric **out,
                                jsd_error *err)
{
    jsd_status st = JSD_OK;
    if (out)
        *out = NULL;
    if (!m || !out)
        return jsd__err(err, JSD_ERR_INVALID, "jsd_metrics_register: registry and out required");
    if (kind != JSD_METRIC_COUNTER && kind != JSD_METRIC_GAUGE && kind != JSD_METRIC_HISTOGRAM)
        return jsd__err(err, JSD_ERR_INVALID, "metric kind %d is unknown", (int)kind);
    if (!name_ok(name, true))
        return jsd__err(err, JSD_ERR_INVALID,
                        "metric name \"%.96s\" is invalid: 1..%d of [a-zA-Z_:][a-zA-Z0-9_:]*",
                        name ? name : "(null)", JSD_METRICS_NAME_MAX);
    if (help && strlen(help) > JSD_METRICS_HELP_MAX)
        return jsd__err(err, JSD_ERR_INVALID, "help of metric %s is longer than %d bytes", name,
                        JSD_METRICS_HELP_MAX);
    if ((label_name == NULL) != (label_value == NULL))
        return jsd__err(err, JSD_ERR_INVALID,
                        "metric %s: label name and value go together (both or neither)", name);
    if (label_name &&
        (!name_ok(label_name, false) || !strncmp(label_name, "__", 2) || !strcmp(label_name, "le")))
        return jsd__err(err, JSD_ERR_INVALID,
                        "metric %s: label name \"%.96s\" is invalid or reserved", name, label_name);
    if (label_value && !label_value_ok(label_value))
        return jsd__err(err, JSD_ERR_INVALID,
                        "metric %s: label value must be 1..%d printable ASCII bytes", name,
                        JSD_METRICS_LABEL_VALUE_MAX);
    if (kind == JSD_METRIC_HISTOGRAM) {
        if (!bounds || n_bounds == 0 || n_bounds > JSD_METRICS_BUCKETS_MAX)
            return jsd__err(err, JSD_ERR_INVALID, "histogram %s needs 1..%d bucket bounds", name,
                            JSD_METRICS_BUCKETS_MAX);
        for (size_t i = 0; i < n_bounds; i++)
            if (!isfinite(bounds[i]) || (i && bounds[i] <= bounds[i - 1]))
                return jsd__err(err, JSD_ERR_INVALID,
                                "histogram %s: bucket bounds must be finite and ascending", name);
    } else if (bounds || n_bounds) {
        return jsd__err(err, JSD_ERR_INVALID, "metric %s: only histograms take bucket bounds",
                        name);
    }

    pthread_mutex_lock(&m->mu);
    family *f = NULL;
    for (size_t i = 0; i < m->n_fams; i++)
        if (!strcmp(m->fams[i]->name, name))
            f = m->fams[i];
    if (f) {
        bool same = f->kind == kind && !strcmp(f->help, help ? help : "") &&
                    !strcmp(f->label_name, label_name ? label_name : "");
        if (same && kind == JSD_METRIC_HISTOGRAM)
            same = f->n_bounds == n_bounds && !memcmp(f->bounds, bounds, n_bounds * sizeof(double));
        if (!same) {
            st = jsd__err(err, JSD_ERR_EXISTS,
                          "metric %s is already registered with another kind, help, label "
                          "name or buckets",
                          name);
            goto done;
        }
        for (size_t i = 0; i < m->n_series; i++)
            if (m->series[i]->fam == f &&
                !strcmp(m->series[i]->label_value, label_value ? label_value : "")) {
                *out = m->series[i];
                goto done;
            }
    }
    if (m->n_series >= JSD_METRICS_SERIES_MAX) {
        st = jsd__err(err, JSD_ERR_LIMIT, "metric %s: the registry holds %d series at most", name,
                      JSD_METRICS_SERIES_MAX);
        goto done;
    }
    if (!f) {
        f = jsd__calloc(1, sizeof(*f));
        if (!f) {
            st = jsd__err(err, JSD_ERR_NOMEM, "out of memory registering metric %s", name);
            goto done;
        }
        jsd__strlcpy(f->name, name, sizeof(f->name));
        jsd__strlcpy(f->help, help ? help : "", sizeof(f->help));
        jsd__strlcpy(f->label_name, label_name ? label_name : "", sizeof(f->label_name));
        f->kind = kind;
        if (kind == JSD_METRIC_HISTOGRAM)
            memcpy(f->bounds, bounds, n_bounds * sizeof(double));
        f->n_bounds = n_bounds;
        m->fams[m->n_fams++] = f;
    }
    jsd_metric *s = jsd__calloc(1, sizeof(*s));
    if (!s) {
        st = jsd__err(err, JSD_ERR_NOMEM, "out of memory registering metric %s", name);
        goto done;
    }
    s->kind = kind;
    s->fam = f;
    jsd__strlcpy(s->label_value, label_value ? label_value : "", sizeof(s->label_value));
    atomic_init(&s->u, kind == JSD_METRIC_GAUGE ? d2u(0.0) : 0);
    atomic_init(&s->sum_bits, d2u(0.0));
    m->series[m->n_series++] = s;
    *out = s;
done:
    pthread_mutex_unlock(&m->mu);
    return st;
}

static const double handler_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                         0.25,  0.5,    1,     2.5,  5,     10,   30};

static jsd_status register_std(jsd_metrics *m, jsd_error *err)
{
    jsd_metrics_std *s = &m->std;
    jsd_status st;
#define REG(kind, name, help, handle)                                                              \
    if ((st = jsd_metrics_register(m, kind, name, help, NULL, NULL, NULL, 0, &s->handle, err)) !=  \
        JSD_OK)                                                                                    \
        return st;
    REG(JSD_METRIC_COUNTER, "jsd_relay_published_total",
        "Outbox effects the relay published and JetStream acknowledged (duplicates included).",
        relay_published)
    REG(JSD_METRIC_COUNTER, "jsd_relay_duplicates_total",
        "Relay publications JetStream acknowledged as duplicates (already stored).",
        relay_duplicates)
    REG(JSD_METRIC_COUNTER, "jsd_relay_errors_total",
        "Relay publish attempts that failed or could not be settled.", relay_errors)
    REG(JSD_METRIC_GAUGE, "jsd_outbox_backlog",
        "Outbox effects committed but not yet published (dead-lettered ones excluded).",
        outbox_backlog)
    REG(JSD_METRIC_GAUGE, "jsd_outbox_oldest_unpublished_age_seconds",
        "Age of the oldest unpublished outbox effect whose not_before has passed (one waiting "
        "for a retry included); 0 when none.",
        outbox_oldest_age)
    REG(JSD_METRIC_GAUGE, "jsd_outbox_failing",
        "Unpublished outbox effects that failed at least once and wait for a retry (not "
        "dead-lettered).",
        outbox_failing)
    for (int r = 0; r < JSD__RESULT_COUNT; r++)
        if ((st = jsd_metrics_register(m, JSD_METRIC_COUNTER, "jsd_deliveries_total",
                                       "Deliveries the consumer settled, by result.", "result",
                                       result_names[r], NULL, 0, &s->deliveries[r], err)) != JSD_OK)
            return st;
    if ((st = jsd_metrics_register(m, JSD_METRIC_HISTOGRAM, "jsd_handler_duration_seconds",
                                   "Time the application handler took per delivery.", NULL, NULL,
                                   handler_buckets, JSD_ARRAY_LEN(handler_buckets),
                                   &s->handler_duration, err)) != JSD_OK)
        return st;
    REG(JSD_METRIC_COUNTER, "jsd_dead_letters_total",
        "Messages parked on the dead-letter stream (poison and max_deliver reached).", dead_letters)
    REG(JSD_METRIC_GAUGE, "jsd_nats_connected",
        "1 while the NATS connection is up, 0 while it is down or reconnecting.", nats_connected)
    REG(JSD_METRIC_COUNTER, "jsd_nats_reconnects_total",
        "Times the NATS connection was re-established after a loss.", nats_reconnects)
#undef REG
    /* A relay's scrape shows no consumer families and the other way round:
     * a family is rendered once a component that feeds it was created on
     * the registry (jsd__metrics_feeds). */
    static const struct {
        const char *name;
        unsigned feed;
    } feeds[] = {{"jsd_relay_published_total", JSD__FEED_RELAY},
                 {"jsd_relay_duplicates_total", JSD__FEED_RELAY},
                 {"jsd_relay_errors_total", JSD__FEED_RELAY},
                 {"jsd_outbox_backlog", JSD__FEED_RELAY},
                 {"jsd_outbox_oldest_unpublished_age_seconds", JSD__FEED_RELAY},
                 {"jsd_outbox_failing", JSD__FEED_RELAY},
                 {"jsd_deliveries_total", JSD__FEED_CONSUMER},
                 {"jsd_handler_duration_seconds", JSD__FEED_CONSUMER},
                 {"jsd_dead_letters_total", JSD__FEED_CONSUMER}};
    for (size_t i = 0; i < JSD_ARRAY_LEN(feeds); i++)
        for (size_t fi = 0; fi < m->n_fams; fi++)
            if (strcmp(m->fams[fi]->name, feeds[i].name) == 0)
                m->fams[fi]->feed = feeds[i].feed;
    return JSD_OK;
}

void jsd__metrics_feeds(jsd_metrics *m, unsigned feed)
{
    if (m)
        atomic_fetch_or(&m->fed, feed);
}

jsd_status jsd_metrics_create(jsd_metrics **out, jsd_error *err)
{
    jsd_status st;
    if (!out)
        return jsd__err(err, JSD_ERR_INVALID, "jsd_metrics_create: out is NULL");
    *out = NULL;
    jsd_metrics *m = jsd__calloc(1, sizeof(*m));
    if (!m)
        return jsd__err(err, JSD_ERR_NOMEM, "out of memory creating a metrics registry");
    if (pthread_mutex_init(&m->mu, NULL) != 0) {
        jsd__free(m);
        return jsd__err(err, JSD_ERR_INTERNAL, "cannot initialise the metrics registry's mutex");
    }
    if ((st = register_std(m, err)) != JSD_OK)
        goto fail;
    *out = m;
    return JSD_OK;
fail:
    jsd_metrics_destroy(m);
    return st;
}

void jsd_metrics_destroy(jsd_metrics *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_series; i++)
        jsd__free(m->series[i]);
    for (size_t i = 0; i < m->n_fams; i++)
        jsd__free(m->fams[i]);
    pthread_mutex_destroy(&m->mu);
    jsd__free(m);
}

static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static jsd_metrics *default_reg;
static const jsd_metrics_std no_std; /* all NULL: updates are no-ops */

static void default_init(void)
{
    jsd_error e;
    if (jsd_metrics_create(&default_reg, &e) != JSD_OK) {
        default_reg = NULL;
        JSD_ERROR("metrics", "cannot create the process-wide metrics registry: %s", e.msg);
    }
}

jsd_metrics *jsd_metrics_default(void)
{
    pthread_once(&default_once, default_init);
    return default_reg;
}

const jsd_metrics_std *jsd_metrics_default_std(void)
{
    jsd_metrics *m = jsd_metrics_default();
    return m ? &m->std : &no_std;
}

const jsd_metrics_std *jsd_metrics_std_of(const jsd_metrics *m)
{
    return m ? &m->std : NULL;
}

jsd_status jsd_metrics_set_const_label(jsd_metrics *m, const char *name, const char *value,
                                       jsd_error *err)
{
    if (!m)
        return jsd__err(err, JSD_ERR_INVALID, "jsd_metrics_set_const_label: registry is NULL");
    if (!name_ok(name, false) || !strncmp(name, "__", 2) || !strcmp(name, "le"))
        return jsd__err(err, JSD_ERR_INVALID, "constant label name \"%.96s\" is invalid",
                        name ? name : "(null)");
    if (!label_value_ok(value))
        return jsd__err(err, JSD_ERR_INVALID,
                        "constant label %s: value must be 1..%d printable ASCII bytes", name,
                        JSD_METRICS_LABEL_VALUE_MAX);
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->n_fams; i++)
        if (!strcmp(m->fams[i]->label_name, name)) {
            pthread_mutex_unlock(&m->mu);
            return jsd__err(err, JSD_ERR_EXISTS,
                            "constant label %s clashes with the label of metric %s", name,
                            m->fams[i]->name);
        }
    jsd__strlcpy(m->const_name, name, sizeof(m->const_name));
    jsd__strlcpy(m->const_value, value, sizeof(m->const_value));
    pthread_mutex_unlock(&m->mu);
    return JSD_OK;
}

void jsd_metrics_observe_conn(jsd_metrics *m, jsd_conn *c)
{
    if (!m || !c)
        return;
    jsd_gauge_set(m->std.nats_connected, jsd_conn_is_connected(c) ? 1.0 : 0.0);
    jsd_counter_raise_to(m->std.nats_reconnects, jsd_conn_reconnects(c));
}

/* ---- reading ---------------------------------------------------------------------- */

static double series_value(const jsd_metric *s)
{
    switch (s->kind) {
    case JSD_METRIC_COUNTER:
        return (double)atomic_load_explicit(&((jsd_metric *)s)->u, memory_order_relaxed);
    case JSD_METRIC_GAUGE:
        return u2d(atomic_load_explicit(&((jsd_metric *)s)->u, memory_order_relaxed));
    default:
        return u2d(atomic_load_explicit(&((jsd_metric *)s)->sum_bits, memory_order_relaxed));
    }
}

jsd_status jsd_metrics_snapshot(jsd_metrics *m, jsd_metric_value *out, size_t cap, size_t *n)
{
    if (!m || (!out && cap) || !n)
        return JSD_ERR_INVALID;
    pthread_mutex_lock(&m->mu);
    *n = m->n_series;
    for (size_t i = 0; i < m->n_series && i < cap; i++) {
        jsd_metric *s = m->series[i];
        jsd_metric_value *v = &out[i];
        v->name = s->fam->name;
        v->label_name = s->fam->label_name[0] ? s->fam->label_name : NULL;
        v->label_value = s->fam->label_name[0] ? s->label_value : NULL;
        v->kind = s->kind;
        v->value = series_value(s);
        if (s->kind == JSD_METRIC_HISTOGRAM)
            v->count = atomic_load_explicit(&s->count, memory_order_relaxed);
        else if (s->kind == JSD_METRIC_COUNTER)
            v->count = atomic_load_explicit(&s->u, memory_order_relaxed);
        else
            v->count = 0;
    }
    jsd_status st = m->n_series > cap ? JSD_ERR_LIMIT : JSD_OK;
    pthread_mutex_unlock(&m->mu);
    return st;
}

jsd_status jsd_metrics_get(jsd_metrics *m, const char *name, const char *label_value, double *value)
{
    if (!m || !name || !value)
        return JSD_ERR_INVALID;
    jsd_status st = JSD_ERR_NOT_FOUND;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->n_series; i++) {
        jsd_metric *s = m->series[i];
        if (!strcmp(s->fam->name, name) &&
            !strcmp(s->label_value, label_value ? label_value : "")) {
            *value = series_value(s);
            st = JSD_OK;
            break;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return st;
}

/* ---- exposition ------------------------------------------------------------------- */

typedef struct dbuf {
    char *p;
    size_t len, cap;
    bool oom;
} dbuf;

static void db_put(dbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        while (nc < b->len + n + 1)
            nc *= 2;
        char *np = jsd__realloc(b->p, nc);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void db_str(dbuf *b, const char *s)
{
    db_put(b, s, strlen(s));
}

static void db_printf(dbuf *b, const char *fmt, ...) JSD_PRINTF(2, 3);
static void db_printf(dbuf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n > 0)
        db_put(b, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

/* HELP text: backslash and newline escaped. Label values: also the quote. */
static void db_escaped(dbuf *b, const char *s, bool quote)
{
    for (; *s; s++) {
        if (*s == '\\')
            db_str(b, "\\\\");
        else if (*s == '\n')
            db_str(b, "\\n");
        else if (quote && *s == '"')
            db_str(b, "\\\"");
        else
            db_put(b, s, 1);
    }
}

static void db_double(dbuf *b, double v)
{
    if (isnan(v))
        db_str(b, "NaN");
    else if (isinf(v))
        db_str(b, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 1e15)
        db_printf(b, "%.0f", v);
    else
        db_printf(b, "%.15g", v);
}

/* {const="x",label="y",le="0.5"} or nothing when there is no label at all. */
static void db_labels(dbuf *b, const jsd_metrics *m, const jsd_metric *s, const char *le)
{
    bool any = false;
    const char *names[3] = {m->const_name[0] ? m->const_name : NULL,
                            s->fam->label_name[0] ? s->fam->label_name : NULL, le ? "le" : NULL};
    const char *values[3] = {m->const_value, s->label_value, le};
    for (int i = 0; i < 3; i++) {
        if (!names[i])
            continue;
        db_str(b, any ? "," : "{");
        any = true;
        db_str(b, names[i]);
        db_str(b, "=\"");
        db_escaped(b, values[i], true);
        db_str(b, "\"");
    }
    if (any)
        db_str(b, "}");
}

static void render_locked(jsd_metrics *m, dbuf *b)
{
    static const char *const type_names[] = {"counter", "gauge", "histogram"};
    /* Two labels, fixed for the process: written here rather than as a
     * registered family (which has at most one label of its own). */
    db_str(b, "# HELP jsd_build_info The jsdurable version and the nats.c it runs on; always 1.\n"
              "# TYPE jsd_build_info gauge\njsd_build_info{");
    if (m->const_name[0]) {
        db_printf(b, "%s=\"", m->const_name);
        db_escaped(b, m->const_value, true);
        db_str(b, "\",");
    }
    db_str(b, "version=\"");
    db_escaped(b, jsd_version(), true);
    db_str(b, "\",nats_c=\"");
    db_escaped(b, jsd_nats_client_version(), true);
    db_str(b, "\"} 1\n");
    unsigned fed = atomic_load(&m->fed);
    for (size_t fi = 0; fi < m->n_fams; fi++) {
        const family *f = m->fams[fi];
        if (f->feed && !(f->feed & fed))
            continue;
        if (f->help[0]) {
            db_printf(b, "# HELP %s ", f->name);
            db_escaped(b, f->help, false);
            db_str(b, "\n");
        }
        db_printf(b, "# TYPE %s %s\n", f->name, type_names[f->kind]);
        for (size_t si = 0; si < m->n_series; si++) {
            jsd_metric *s = m->series[si];
            if (s->fam != f)
                continue;
            if (f->kind == JSD_METRIC_COUNTER) {
                db_str(b, f->name);
                db_labels(b, m, s, NULL);
                db_printf(b, " %llu\n",
                          (unsigned long long)atomic_load_explicit(&s->u, memory_order_relaxed));
            } else if (f->kind == JSD_METRIC_GAUGE) {
                db_str(b, f->name);
                db_labels(b, m, s, NULL);
                db_str(b, " ");
                db_double(b, series_value(s));
                db_str(b, "\n");
            } else {
                uint64_t cum = 0;
                for (size_t k = 0; k <= f->n_bounds; k++) {
                    char le[40];
                    cum += atomic_load_explicit(&s->buckets[k], memory_order_relaxed);
                    if (k < f->n_bounds)
                        jsd__snprintf(le, sizeof(le), "%.15g", f->bounds[k]);
                    else
                        jsd__strlcpy(le, "+Inf", sizeof(le));
                    db_printf(b, "%s_bucket", f->name);
                    db_labels(b, m, s, le);
                    db_printf(b, " %llu\n", (unsigned long long)cum);
                }
                db_printf(b, "%s_sum", f->name);
                db_labels(b, m, s, NULL);
                db_str(b, " ");
                db_double(b, series_value(s));
                db_str(b, "\n");
                db_printf(b, "%s_count", f->name);
                db_labels(b, m, s, NULL);
                /* the count is the +Inf bucket, so the two always agree */
                db_printf(b, " %llu\n", (unsigned long long)cum);
            }
        }
    }
}

jsd_status jsd__metrics_render_alloc(jsd_metrics *m, char **out, size_t *len)
{
    dbuf b = {0};
    pthread_mutex_lock(&m->mu);
    render_locked(m, &b);
    pthread_mutex_unlock(&m->mu);
    if (b.oom || !b.p) {
        jsd__free(b.p);
        return JSD_ERR_NOMEM;
    }
    *out = b.p;
    *len = b.len;
    return JSD_OK;
}

jsd_status jsd_metrics_render(jsd_metrics *m, char *buf, size_t cap, size_t *len)
{
    char *p = NULL;
    size_t n = 0;
    if (!m || !len || (!buf && cap))
        return JSD_ERR_INVALID;
    jsd_status st = jsd__metrics_render_alloc(m, &p, &n);
    if (st != JSD_OK)
        return st;
    *len = n;
    if (n >= cap) { /* room for n bytes and the NUL; n + 1 could wrap */
        if (cap)
            buf[0] = '\0';
        jsd__free(p);
        return JSD_ERR_LIMIT;
    }
    memcpy(buf, p, n + 1);
    jsd__free(p);
    return JSD_OK;
}
