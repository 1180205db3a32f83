/*
 * Unit tests for the metrics registry: counter, gauge and histogram math
 * (bucket boundaries, cumulative buckets, sum and count), concurrent updates
 * from many threads, the exposition format line by line, the snapshot, and
 * the limits and name rules of registration.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "test.h"
#include "jsd_int.h"

static jsd_metrics *new_reg(void)
{
    jsd_metrics *m = NULL;
    jsd_error e;
    jsd_error_clear(&e);
    ASSERT_OK_E(jsd_metrics_create(&m, &e), e.msg);
    /* as in a process with a relay and a consumer: every family rendered */
    jsd__metrics_feeds(m, JSD__FEED_RELAY | JSD__FEED_CONSUMER);
    return m;
}

static char *render(jsd_metrics *m)
{
    size_t len = 0;
    ASSERT_STATUS(jsd_metrics_render(m, NULL, 0, &len), JSD_ERR_LIMIT);
    char *buf = malloc(len + 1);
    ASSERT_TRUE(buf != NULL);
    size_t len2 = 0;
    ASSERT_OK(jsd_metrics_render(m, buf, len + 1, &len2));
    ASSERT_EQ(len2, len);
    ASSERT_EQ(strlen(buf), len);
    return buf;
}

/* The text holds this exact line. */
static void assert_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; (p = strstr(p, line)) != NULL; p++)
        if ((p == text || p[-1] == '\n') && p[n] == '\n')
            return;
    fail_msg("exposition lacks the line \"%s\":\n%s", line, text);
}

static void counters_and_gauges(void **state)
{
    (void)state;
    jsd_metrics *m = new_reg();
    const jsd_metrics_std *s = jsd_metrics_std_of(m);
    jsd_counter_inc(s->relay_published);
    jsd_counter_add(s->relay_published, 41);
    jsd_counter_inc(s->deliveries[JSD_RESULT_COMMIT]);
    jsd_counter_add(s->deliveries[JSD_RESULT_POISON], 2);
    jsd_gauge_set(s->outbox_backlog, 17);
    jsd_gauge_add(s->outbox_backlog, -5);
    jsd_gauge_set(s->outbox_oldest_age, 2.5);
    jsd_counter_raise_to(s->nats_reconnects, 3);
    jsd_counter_raise_to(s->nats_reconnects, 2); /* never lowers */

    /* wrong-kind and NULL updates are no-ops */
    jsd_gauge_set(s->relay_published, 1000);
    jsd_counter_inc(s->outbox_backlog);
    jsd_counter_inc(NULL);
    jsd_gauge_set(NULL, 1);
    jsd_histogram_observe(NULL, 1);

    double v = -1;
    ASSERT_OK(jsd_metrics_get(m, "jsd_relay_published_total", NULL, &v));
    ASSERT_TRUE(v == 42);
    ASSERT_OK(jsd_metrics_get(m, "jsd_deliveries_total", "commit", &v));
    ASSERT_TRUE(v == 1);
    ASSERT_OK(jsd_metrics_get(m, "jsd_deliveries_total", "poison", &v));
    ASSERT_TRUE(v == 2);
    ASSERT_OK(jsd_metrics_get(m, "jsd_deliveries_total", "retry", &v));
    ASSERT_TRUE(v == 0);
    ASSERT_OK(jsd_metrics_get(m, "jsd_outbox_backlog", NULL, &v));
    ASSERT_TRUE(v == 12);
    ASSERT_OK(jsd_metrics_get(m, "jsd_nats_reconnects_total", NULL, &v));
    ASSERT_TRUE(v == 3);
    ASSERT_STATUS(jsd_metrics_get(m, "jsd_nope", NULL, &v), JSD_ERR_NOT_FOUND);
    ASSERT_STATUS(jsd_metrics_get(m, "jsd_deliveries_total", "maybe", &v), JSD_ERR_NOT_FOUND);
    jsd_metrics_destroy(m);
    jsd_metrics_destroy(NULL);
}

static void histogram_math(void **state)
{
    (void)state;
    jsd_metrics *m = new_reg();
    jsd_metric *h = NULL;
    jsd_error e;
    const double b[] = {0.1, 1, 10};
    ASSERT_OK_E(jsd_metrics_register(m, JSD_METRIC_HISTOGRAM, "t_seconds", "test", NULL, NULL, b, 3,
                                     &h, &e),
                e.msg);
    /* a value equal to a bound falls in that bucket (le = less or equal) */
    double obs[] = {0.05, 0.1, 0.5, 1, 5, 10, 50, 100};
    for (size_t i = 0; i < sizeof(obs) / sizeof(obs[0]); i++)
        jsd_histogram_observe(h, obs[i]);
    jsd_histogram_observe(h, NAN); /* ignored */
    char *t = render(m);
    assert_line(t, "# HELP t_seconds test");
    assert_line(t, "# TYPE t_seconds histogram");
    assert_line(t, "t_seconds_bucket{le=\"0.1\"} 2");
    assert_line(t, "t_seconds_bucket{le=\"1\"} 4");
    assert_line(t, "t_seconds_bucket{le=\"10\"} 6");
    assert_line(t, "t_seconds_bucket{le=\"+Inf\"} 8");
    assert_line(t, "t_seconds_sum 166.65");
    assert_line(t, "t_seconds_count 8");
    free(t);

    size_t n = 0;
    jsd_metric_value vals[64];
    ASSERT_OK(jsd_metrics_snapshot(m, vals, 64, &n));
    bool seen = false;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(vals[i].name, "t_seconds")) {
            seen = true;
            ASSERT_EQ(vals[i].kind, JSD_METRIC_HISTOGRAM);
            ASSERT_EQ(vals[i].count, 8);
            ASSERT_TRUE(fabs(vals[i].value - 166.65) < 1e-9);
        }
    ASSERT_TRUE(seen);
    jsd_metrics_destroy(m);
}

/* A family is rendered once a component that feeds it exists: a relay's
 * scrape has no consumer families. jsd_build_info and jsd_nats_* always. */
static void families_follow_their_feeders(void **state)
{
    (void)state;
    jsd_metrics *m = NULL;
    jsd_error e;
    jsd_error_clear(&e);
    ASSERT_OK_E(jsd_metrics_create(&m, &e), e.msg);
    char *t = render(m);
    char want[160];
    snprintf(want, sizeof(want), "\njsd_build_info{version=\"%s\",nats_c=\"%s\"} 1\n",
             jsd_version(), jsd_nats_client_version());
    ASSERT_CONTAINS(t, want);
    ASSERT_CONTAINS(t, "\njsd_nats_connected 0\n");
    ASSERT_NOT_CONTAINS(t, "jsd_relay_published_total");
    ASSERT_NOT_CONTAINS(t, "jsd_outbox_backlog");
    ASSERT_NOT_CONTAINS(t, "jsd_deliveries_total");
    ASSERT_NOT_CONTAINS(t, "jsd_handler_duration_seconds");
    free(t);
    jsd__metrics_feeds(m, JSD__FEED_RELAY);
    t = render(m);
    ASSERT_CONTAINS(t, "\njsd_relay_published_total 0\n");
    ASSERT_CONTAINS(t, "\njsd_outbox_backlog 0\n");
    ASSERT_NOT_CONTAINS(t, "jsd_deliveries_total");
    ASSERT_NOT_CONTAINS(t, "jsd_dead_letters_total");
    free(t);
    jsd__metrics_feeds(m, JSD__FEED_CONSUMER);
    t = render(m);
    ASSERT_CONTAINS(t, "\njsd_deliveries_total{result=\"commit\"} 0\n");
    ASSERT_CONTAINS(t, "\njsd_relay_published_total 0\n");
    free(t);
    ASSERT_OK(jsd_metrics_set_const_label(m, "instance", "a", &e), e.msg);
    t = render(m);
    ASSERT_CONTAINS(t, "\njsd_build_info{instance=\"a\",version=\"");
    free(t);
    jsd_metrics_destroy(m);
}

static void exposition_format(void **state)
{
    (void)state;
    jsd_metrics *m = new_reg();
    const jsd_metrics_std *s = jsd_metrics_std_of(m);
    jsd_counter_add(s->relay_published, 7);
    jsd_counter_add(s->deliveries[JSD_RESULT_DEADLETTER], 1);
    jsd_gauge_set(s->outbox_oldest_age, 1.25);
    jsd_gauge_set(s->nats_connected, 1);
    jsd_histogram_observe(s->handler_duration, 0.003);
    jsd_histogram_observe(s->handler_duration, 0.2);
    char *t = render(m);
    assert_line(t, "# TYPE jsd_relay_published_total counter");
    assert_line(t, "jsd_relay_published_total 7");
    assert_line(t, "jsd_relay_duplicates_total 0");
    assert_line(t, "jsd_relay_errors_total 0");
    assert_line(t, "# TYPE jsd_outbox_backlog gauge");
    assert_line(t, "jsd_outbox_backlog 0");
    assert_line(t, "jsd_outbox_oldest_unpublished_age_seconds 1.25");
    assert_line(t, "# TYPE jsd_deliveries_total counter");
    assert_line(t, "jsd_deliveries_total{result=\"commit\"} 0");
    assert_line(t, "jsd_deliveries_total{result=\"duplicate\"} 0");
    assert_line(t, "jsd_deliveries_total{result=\"retry\"} 0");
    assert_line(t, "jsd_deliveries_total{result=\"poison\"} 0");
    assert_line(t, "jsd_deliveries_total{result=\"deadletter\"} 1");
    assert_line(t, "# TYPE jsd_handler_duration_seconds histogram");
    assert_line(t, "jsd_handler_duration_seconds_bucket{le=\"0.001\"} 0");
    assert_line(t, "jsd_handler_duration_seconds_bucket{le=\"0.005\"} 1");
    assert_line(t, "jsd_handler_duration_seconds_bucket{le=\"0.25\"} 2");
    assert_line(t, "jsd_handler_duration_seconds_bucket{le=\"+Inf\"} 2");
    assert_line(t, "jsd_handler_duration_seconds_count 2");
    assert_line(t, "jsd_handler_duration_seconds_sum 0.203");
    assert_line(t, "jsd_dead_letters_total 0");
    assert_line(t, "jsd_nats_connected 1");
    assert_line(t, "jsd_nats_reconnects_total 0");
    /* TYPE appears once per family, and before its samples */
    const char *ty = strstr(t, "# TYPE jsd_deliveries_total counter");
    ASSERT_TRUE(ty != NULL);
    ASSERT_TRUE(strstr(ty + 1, "# TYPE jsd_deliveries_total") == NULL);
    ASSERT_TRUE(strstr(t, "jsd_deliveries_total{") > ty);
    /* every line is a comment or "name[{labels}] value" */
    for (const char *p = t; *p;) {
        const char *nl = strchr(p, '\n');
        ASSERT_TRUE(nl != NULL); /* ends with a newline */
        if (*p != '#') {
            const char *sp = memchr(p, ' ', (size_t)(nl - p));
            ASSERT_TRUE(sp != NULL);
            char *end = NULL;
            (void)strtod(sp + 1, &end);
            ASSERT_TRUE(end == nl || !strncmp(sp + 1, "+Inf", 4));
        }
        p = nl + 1;
    }
    free(t);

    /* a constant label goes on every sample, before the family's own */
    jsd_error e;
    ASSERT_OK_E(jsd_metrics_set_const_label(m, "consumer", "ship\"ping", &e), e.msg);
    t = render(m);
    assert_line(t, "jsd_relay_published_total{consumer=\"ship\\\"ping\"} 7");
    assert_line(t, "jsd_deliveries_total{consumer=\"ship\\\"ping\",result=\"deadletter\"} 1");
    assert_line(t, "jsd_handler_duration_seconds_bucket{consumer=\"ship\\\"ping\",le=\"+Inf\"} 2");
    free(t);
    ASSERT_STATUS(jsd_metrics_set_const_label(m, "result", "x", &e), JSD_ERR_EXISTS);
    ASSERT_STATUS(jsd_metrics_set_const_label(m, "bad-name", "x", &e), JSD_ERR_INVALID);
    ASSERT_STATUS(jsd_metrics_set_const_label(m, "c", "line\nbreak", &e), JSD_ERR_INVALID);
    jsd_metrics_destroy(m);
}

static void snapshot_lists_every_series(void **state)
{
    (void)state;
    jsd_metrics *m = new_reg();
    const jsd_metrics_std *s = jsd_metrics_std_of(m);
    jsd_counter_add(s->relay_errors, 3);
    jsd_counter_add(s->deliveries[JSD_RESULT_RETRY], 4);
    size_t n = 0;
    ASSERT_STATUS(jsd_metrics_snapshot(m, NULL, 0, &n), JSD_ERR_LIMIT);
    /* 6 relay/outbox + 5 results + histogram + dead letters + 2 connection */
    ASSERT_EQ(n, 15);
    jsd_metric_value v[15];
    size_t n2 = 0;
    ASSERT_STATUS(jsd_metrics_snapshot(m, v, 3, &n2), JSD_ERR_LIMIT);
    ASSERT_EQ(n2, 15);
    ASSERT_STREQ(v[0].name, "jsd_relay_published_total");
    ASSERT_OK(jsd_metrics_snapshot(m, v, 15, &n2));
    int found = 0;
    for (size_t i = 0; i < n2; i++) {
        if (!strcmp(v[i].name, "jsd_relay_errors_total")) {
            ASSERT_TRUE(v[i].label_name == NULL);
            ASSERT_EQ(v[i].kind, JSD_METRIC_COUNTER);
            ASSERT_TRUE(v[i].value == 3);
            ASSERT_EQ(v[i].count, 3);
            found++;
        }
        if (!strcmp(v[i].name, "jsd_deliveries_total") && !strcmp(v[i].label_value, "retry")) {
            ASSERT_STREQ(v[i].label_name, "result");
            ASSERT_TRUE(v[i].value == 4);
            found++;
        }
    }
    ASSERT_EQ(found, 2);
    jsd_metrics_destroy(m);
}

static void registration_rules_and_limits(void **state)
{
    (void)state;
    jsd_metrics *m = new_reg();
    jsd_metric *h = NULL, *h2 = NULL;
    jsd_error e;
    ASSERT_STATUS(jsd_metrics_register(m, JSD_METRIC_COUNTER, "9starts_with_digit", "", NULL, NULL,
                                       NULL, 0, &h, &e),
                  JSD_ERR_INVALID);
    ASSERT_STATUS(
        jsd_metrics_register(m, JSD_METRIC_COUNTER, "has-dash", "", NULL, NULL, NULL, 0, &h, &e),
        JSD_ERR_INVALID);
    ASSERT_STATUS(
        jsd_metrics_register(m, JSD_METRIC_COUNTER, "x_total", "", "le", "1", NULL, 0, &h, &e),
        JSD_ERR_INVALID);
    ASSERT_STATUS(
        jsd_metrics_register(m, JSD_METRIC_COUNTER, "x_total", "", "k", NULL, NULL, 0, &h, &e),
        JSD_ERR_INVALID);
    /* same name, other kind */
    ASSERT_STATUS(jsd_metrics_register(m, JSD_METRIC_GAUGE, "jsd_relay_published_total", "other",
                                       NULL, NULL, NULL, 0, &h, &e),
                  JSD_ERR_EXISTS);
    /* same series again: the same handle */
    ASSERT_OK(
        jsd_metrics_register(m, JSD_METRIC_COUNTER, "x_total", "x", "k", "a", NULL, 0, &h, &e));
    ASSERT_OK(
        jsd_metrics_register(m, JSD_METRIC_COUNTER, "x_total", "x", "k", "a", NULL, 0, &h2, &e));
    ASSERT_TRUE(h == h2);
    /* histogram bounds: ascending, 1..16 */
    const double bad[] = {1, 1};
    ASSERT_STATUS(
        jsd_metrics_register(m, JSD_METRIC_HISTOGRAM, "h1", "", NULL, NULL, bad, 2, &h, &e),
        JSD_ERR_INVALID);
    double many[17];
    for (int i = 0; i < 17; i++)
        many[i] = i + 1;
    ASSERT_OK(
        jsd_metrics_register(m, JSD_METRIC_HISTOGRAM, "h16", "", NULL, NULL, many, 16, &h, &e));
    ASSERT_STATUS(
        jsd_metrics_register(m, JSD_METRIC_HISTOGRAM, "h17", "", NULL, NULL, many, 17, &h, &e),
        JSD_ERR_INVALID);
    ASSERT_STATUS(
        jsd_metrics_register(m, JSD_METRIC_COUNTER, "c_b", "", NULL, NULL, many, 1, &h, &e),
        JSD_ERR_INVALID);
    /* series limit: fill up to JSD_METRICS_SERIES_MAX, then one more fails */
    size_t n = 0;
    ASSERT_STATUS(jsd_metrics_snapshot(m, NULL, 0, &n), JSD_ERR_LIMIT);
    for (size_t i = n; i < JSD_METRICS_SERIES_MAX; i++) {
        char v[16];
        jsd__snprintf(v, sizeof(v), "v%zu", i);
        ASSERT_OK_E(
            jsd_metrics_register(m, JSD_METRIC_COUNTER, "fill_total", "", "i", v, NULL, 0, &h, &e),
            e.msg);
    }
    ASSERT_STATUS(
        jsd_metrics_register(m, JSD_METRIC_COUNTER, "fill_total", "", "i", "last", NULL, 0, &h, &e),
        JSD_ERR_LIMIT);
    ASSERT_CONTAINS(e.msg, "256");
    jsd_metrics_destroy(m);
}

#define THREADS    4
#define PER_THREAD 100000

static void *hammer(void *arg)
{
    const jsd_metrics_std *s = arg;
    for (int i = 0; i < PER_THREAD; i++) {
        jsd_counter_inc(s->relay_published);
        jsd_gauge_add(s->outbox_backlog, 1);
        jsd_histogram_observe(s->handler_duration, 0.5);
    }
    return NULL;
}

static void concurrent_updates_are_not_lost(void **state)
{
    (void)state;
    jsd_metrics *m = new_reg();
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        ASSERT_EQ(pthread_create(&th[i], NULL, hammer, (void *)jsd_metrics_std_of(m)), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    double v;
    ASSERT_OK(jsd_metrics_get(m, "jsd_relay_published_total", NULL, &v));
    ASSERT_EQ((long long)v, THREADS * PER_THREAD);
    ASSERT_OK(jsd_metrics_get(m, "jsd_outbox_backlog", NULL, &v));
    ASSERT_EQ((long long)v, THREADS * PER_THREAD);
    ASSERT_OK(jsd_metrics_get(m, "jsd_handler_duration_seconds", NULL, &v));
    ASSERT_EQ((long long)v, THREADS * PER_THREAD / 2);
    char *t = render(m);
    char line[128];
    jsd__snprintf(line, sizeof(line), "jsd_handler_duration_seconds_count %d",
                  THREADS * PER_THREAD);
    assert_line(t, line);
    free(t);
    jsd_metrics_destroy(m);
}

static void result_names(void **state)
{
    (void)state;
    ASSERT_STREQ(jsd_delivery_result_str(JSD_RESULT_COMMIT), "commit");
    ASSERT_STREQ(jsd_delivery_result_str(JSD_RESULT_DEADLETTER), "deadletter");
    ASSERT_STREQ(jsd_delivery_result_str((jsd_delivery_result)99), "?");
}

/* Run by allocation_failures_are_clean in a child with JSD_FAIL_ALLOC_AFTER. */
static void oom_child(void **state)
{
    (void)state;
    jsd_metrics *m = NULL;
    jsd_error e;
    jsd_error_clear(&e);
    jsd_status s = jsd_metrics_create(&m, &e);
    if (s == JSD_OK) {
        size_t len = 0;
        char buf[16];
        s = jsd_metrics_render(m, buf, sizeof(buf), &len);
        if (s == JSD_ERR_LIMIT)
            s = JSD_OK; /* rendered fully, just too big for buf */
        jsd_metrics_destroy(m);
    } else {
        ASSERT_TRUE(m == NULL);
    }
    printf("status=%s\n", jsd_status_name(s));
    if (s != JSD_OK)
        ASSERT_EQ(s, JSD_ERR_NOMEM);
}

static void allocation_failures_are_clean(void **state)
{
    (void)state;
    jsd_test_alloc_failures("oom_child", 100, "metrics");
}

static void *count_default(void *arg)
{
    (void)arg;
    for (int i = 0; i < 1000; i++)
        jsd_counter_inc(jsd_metrics_default_std()->relay_published);
    return NULL;
}

static void process_wide_registry(void **state)
{
    (void)state;
    /* first use from several threads at once: one registry */
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        ASSERT_EQ(pthread_create(&th[i], NULL, count_default, NULL), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    jsd_metrics *m = jsd_metrics_default();
    ASSERT_TRUE(m != NULL);
    ASSERT_TRUE(m == jsd_metrics_default());
    ASSERT_TRUE(jsd_metrics_default_std() == jsd_metrics_std_of(m));
    double v = 0;
    ASSERT_OK(jsd_metrics_get(m, "jsd_relay_published_total", NULL, &v));
    ASSERT_EQ((long long)v, THREADS * 1000);
}

JSD_TEST_MAIN(cmocka_unit_test(counters_and_gauges), cmocka_unit_test(histogram_math),
              cmocka_unit_test(families_follow_their_feeders), cmocka_unit_test(exposition_format),
              cmocka_unit_test(snapshot_lists_every_series),
              cmocka_unit_test(registration_rules_and_limits),
              cmocka_unit_test(concurrent_updates_are_not_lost), cmocka_unit_test(result_names),
              cmocka_unit_test(process_wide_registry), cmocka_unit_test(oom_child),
              cmocka_unit_test(allocation_failures_are_clean))
