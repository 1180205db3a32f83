/*
 * Integration tests for the metrics HTTP server: a real listening socket on
 * loopback (port 0, so the kernel picks a free one), real HTTP requests over
 * TCP, the exposition parsed back into values; 404 and 405; a port already in
 * use and a bad address give clear errors; the NATS connection state of a
 * real connection to the shared nats-server shows in jsd_nats_connected.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "fixture.h"
#include "jsd_int.h"
#include "test.h"

/* One HTTP/1.0 request; returns the status code, the headers and body in
 * out (NUL-terminated), or -1. */
static int http(int port, const char *method, const char *path, char *out, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    char req[256];
    jsd__snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", method, path);
    if (write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
        close(fd);
        return -1;
    }
    size_t n = 0;
    for (;;) {
        ssize_t got = read(fd, out + n, cap - 1 - n);
        if (got <= 0)
            break;
        n += (size_t)got;
        if (n == cap - 1)
            break;
    }
    out[n] = '\0';
    close(fd);
    /* "HTTP/1.x NNN ..." */
    if (strncmp(out, "HTTP/1.", 7) != 0 || !out[7] || out[8] != ' ')
        return -1;
    char *end = NULL;
    long code = strtol(out + 9, &end, 10);
    if (end == out + 9 || code < 100 || code > 999)
        return -1;
    return (int)code;
}

static const char *body_of(const char *resp)
{
    const char *b = strstr(resp, "\r\n\r\n");
    return b ? b + 4 : "";
}

/* The value of the sample line "name value" (labels included in name). */
static bool sample(const char *text, const char *name, double *v)
{
    size_t n = strlen(name);
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        if (!nl)
            break;
        if (*p != '#' && !strncmp(p, name, n) && p[n] == ' ') {
            char *end = NULL;
            *v = strtod(p + n + 1, &end);
            return end == nl;
        }
        p = nl + 1;
    }
    return false;
}

static char resp[1 << 16];

static void serves_metrics_over_http(void **state)
{
    (void)state;
    jsd_metrics *m = NULL;
    jsd_metrics_server *srv = NULL;
    jsd_error e;
    jsd_error_clear(&e);
    ASSERT_OK_E(jsd_metrics_create(&m, &e), e.msg);
    jsd__metrics_feeds(m,
                       JSD__FEED_RELAY | JSD__FEED_CONSUMER); /* as a relay and a consumer would */
    ASSERT_OK_E(jsd_metrics_serve(&srv, m, NULL, "127.0.0.1:0", &e), e.msg);
    int port = jsd_metrics_server_port(srv);
    ASSERT_TRUE(port > 0 && port < 65536);

    ASSERT_EQ(http(port, "GET", "/metrics", resp, sizeof(resp)), 200);
    ASSERT_CONTAINS(resp, "Content-Type: text/plain; version=0.0.4");
    double v = -1;
    ASSERT_TRUE(sample(body_of(resp), "jsd_relay_published_total", &v));
    ASSERT_TRUE(v == 0);

    const jsd_metrics_std *s = jsd_metrics_std_of(m);
    for (int i = 0; i < 5; i++)
        jsd_counter_inc(s->relay_published);
    jsd_counter_add(s->deliveries[JSD_RESULT_COMMIT], 12);
    jsd_gauge_set(s->outbox_backlog, 3);
    jsd_histogram_observe(s->handler_duration, 0.02);

    ASSERT_EQ(http(port, "GET", "/metrics", resp, sizeof(resp)), 200);
    const char *b = body_of(resp);
    ASSERT_TRUE(sample(b, "jsd_relay_published_total", &v));
    ASSERT_TRUE(v == 5);
    ASSERT_TRUE(sample(b, "jsd_deliveries_total{result=\"commit\"}", &v));
    ASSERT_TRUE(v == 12);
    ASSERT_TRUE(sample(b, "jsd_outbox_backlog", &v));
    ASSERT_TRUE(v == 3);
    ASSERT_TRUE(sample(b, "jsd_handler_duration_seconds_bucket{le=\"0.025\"}", &v));
    ASSERT_TRUE(v == 1);
    ASSERT_TRUE(sample(b, "jsd_handler_duration_seconds_bucket{le=\"0.01\"}", &v));
    ASSERT_TRUE(v == 0);
    ASSERT_TRUE(sample(b, "jsd_handler_duration_seconds_count", &v));
    ASSERT_TRUE(v == 1);
    ASSERT_CONTAINS(b, "# TYPE jsd_handler_duration_seconds histogram\n");

    /* HEAD: headers, no body */
    ASSERT_EQ(http(port, "HEAD", "/metrics", resp, sizeof(resp)), 200);
    ASSERT_STREQ(body_of(resp), "");

    jsd_metrics_server_destroy(srv);
    /* stopped: nobody listens any more */
    ASSERT_EQ(http(port, "GET", "/metrics", resp, sizeof(resp)), -1);
    jsd_metrics_server_destroy(NULL);
    jsd_metrics_destroy(m);
}

static void other_paths_and_methods(void **state)
{
    (void)state;
    jsd_metrics *m = NULL;
    jsd_metrics_server *srv = NULL;
    jsd_error e;
    ASSERT_OK_E(jsd_metrics_create(&m, &e), e.msg);
    ASSERT_OK_E(jsd_metrics_serve(&srv, m, NULL, "127.0.0.1:0", &e), e.msg);
    int port = jsd_metrics_server_port(srv);
    ASSERT_EQ(http(port, "GET", "/", resp, sizeof(resp)), 404);
    ASSERT_NOT_CONTAINS(body_of(resp), "jsd_");
    ASSERT_EQ(http(port, "GET", "/metrics/extra", resp, sizeof(resp)), 404);
    ASSERT_EQ(http(port, "GET", "/metricsx", resp, sizeof(resp)), 404);
    ASSERT_EQ(http(port, "POST", "/metrics", resp, sizeof(resp)), 405);
    ASSERT_CONTAINS(resp, "Allow: GET, HEAD");
    ASSERT_EQ(http(port, "DELETE", "/metrics", resp, sizeof(resp)), 405);
    /* still serving after the refusals */
    ASSERT_EQ(http(port, "GET", "/metrics", resp, sizeof(resp)), 200);
    jsd_metrics_server_destroy(srv);
    jsd_metrics_destroy(m);
}

static void address_errors_are_clear(void **state)
{
    (void)state;
    jsd_metrics *m = NULL;
    jsd_metrics_server *a = NULL, *b = NULL;
    jsd_error e;
    ASSERT_OK_E(jsd_metrics_create(&m, &e), e.msg);
    ASSERT_OK_E(jsd_metrics_serve(&a, m, NULL, "127.0.0.1:0", &e), e.msg);
    char addr[64];
    jsd__snprintf(addr, sizeof(addr), "127.0.0.1:%d", jsd_metrics_server_port(a));
    ASSERT_STATUS(jsd_metrics_serve(&b, m, NULL, addr, &e), JSD_ERR_IO);
    ASSERT_TRUE(b == NULL);
    ASSERT_CONTAINS(e.msg, addr);
    ASSERT_CONTAINS(e.msg, "in use");

    ASSERT_STATUS(jsd_metrics_serve(&b, m, NULL, "9464", &e), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(e.msg, "HOST:PORT");
    ASSERT_STATUS(jsd_metrics_serve(&b, m, NULL, "127.0.0.1:65536", &e), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(e.msg, "0..65535");
    ASSERT_STATUS(jsd_metrics_serve(&b, m, NULL, "127.0.0.1:http", &e), JSD_ERR_CONFIG);
    ASSERT_STATUS(jsd_metrics_serve(&b, m, NULL, "[::1:9464", &e), JSD_ERR_CONFIG);
    ASSERT_STATUS(jsd_metrics_serve(&b, m, NULL, "no-such-host.invalid:9464", &e), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(e.msg, "cannot resolve");
    jsd_metrics_server_destroy(a);
    jsd_metrics_destroy(m);
}

typedef struct scraper {
    int port;
    atomic_int ok;
    atomic_bool stop;
} scraper;

static void *scrape_loop(void *arg)
{
    scraper *s = arg;
    static char buf[1 << 16];
    while (!atomic_load(&s->stop)) {
        if (http(s->port, "GET", "/metrics", buf, sizeof(buf)) == 200 &&
            strstr(buf, "jsd_nats_reconnects_total"))
            atomic_fetch_add(&s->ok, 1);
    }
    return NULL;
}

static void scrapes_while_counting_and_shows_connection(void **state)
{
    (void)state;
    jsd_conn_opts o;
    jsd_conn_opts_init(&o);
    o.servers = jsd_fx_shared_nats_url();
    jsd_conn *c = NULL;
    jsd_error e;
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);

    jsd_metrics *m = NULL;
    jsd_metrics_server *srv = NULL;
    ASSERT_OK_E(jsd_metrics_create(&m, &e), e.msg);
    jsd__metrics_feeds(m, JSD__FEED_CONSUMER); /* as a consumer on the registry would */
    ASSERT_OK_E(jsd_metrics_set_const_label(m, "consumer", "shipping", &e), e.msg);
    ASSERT_OK_E(jsd_metrics_serve(&srv, m, c, "127.0.0.1:0", &e), e.msg);

    scraper sc = {.port = jsd_metrics_server_port(srv)};
    atomic_init(&sc.ok, 0);
    atomic_init(&sc.stop, false);
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, scrape_loop, &sc), 0);
    const jsd_metrics_std *s = jsd_metrics_std_of(m);
    /* count while scrapes run, until at least 3 whole scrapes came back */
    long long incs = 0;
    int64_t end = jsd_test_mono_ms() + 10000;
    while ((atomic_load(&sc.ok) < 3 || incs < 1000) && jsd_test_mono_ms() < end) {
        jsd_counter_inc(s->dead_letters);
        incs++;
    }
    atomic_store(&sc.stop, true);
    pthread_join(th, NULL);
    ASSERT_TRUE(atomic_load(&sc.ok) >= 3);

    ASSERT_EQ(http(sc.port, "GET", "/metrics", resp, sizeof(resp)), 200);
    const char *b = body_of(resp);
    double v = -1;
    ASSERT_TRUE(sample(b, "jsd_dead_letters_total{consumer=\"shipping\"}", &v));
    ASSERT_EQ((long long)v, incs);
    ASSERT_TRUE(sample(b, "jsd_nats_connected{consumer=\"shipping\"}", &v));
    ASSERT_TRUE(v == 1);
    ASSERT_TRUE(sample(b, "jsd_nats_reconnects_total{consumer=\"shipping\"}", &v));
    ASSERT_TRUE(v == 0);
    /* no credentials or server addresses leak into the exposition */
    ASSERT_NOT_CONTAINS(b, "nats://");
    ASSERT_NOT_CONTAINS(b, "127.0.0.1");

    jsd_metrics_server_destroy(srv);
    jsd_metrics_destroy(m);
    jsd_conn_close(c);
}

static atomic_bool store_up;

static bool store_ready(void *user, char *why, size_t cap)
{
    (void)user;
    if (atomic_load(&store_up))
        return true;
    jsd__snprintf(why, cap, "store: not answering");
    return false;
}

/* /healthz answers while the process serves; /readyz follows the NATS
 * connection (a private server, killed and restarted) and the hook. */
static void health_and_readiness(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    jsd_conn_opts o;
    jsd_conn_opts_init(&o);
    o.servers = fx.url;
    jsd_conn *c = NULL;
    jsd_error e;
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    jsd_metrics *m = NULL;
    jsd_metrics_server *srv = NULL;
    ASSERT_OK_E(jsd_metrics_create(&m, &e), e.msg);
    ASSERT_OK_E(jsd_metrics_serve(&srv, m, c, "127.0.0.1:0", &e), e.msg);
    int port = jsd_metrics_server_port(srv);

    ASSERT_EQ(http(port, "GET", "/healthz", resp, sizeof(resp)), 200);
    ASSERT_STREQ(body_of(resp), "ok\n");
    ASSERT_EQ(http(port, "GET", "/readyz", resp, sizeof(resp)), 200);
    ASSERT_STREQ(body_of(resp), "ready\n");

    atomic_store(&store_up, false);
    jsd_metrics_server_set_ready(srv, store_ready, NULL);
    ASSERT_EQ(http(port, "GET", "/readyz", resp, sizeof(resp)), 503);
    ASSERT_STREQ(body_of(resp), "store: not answering\n");
    atomic_store(&store_up, true);
    ASSERT_EQ(http(port, "GET", "/readyz", resp, sizeof(resp)), 200);

    ASSERT_EQ(jsd_fx_nats_kill(&fx), 0);
    ASSERT_WAIT(http(port, "GET", "/readyz", resp, sizeof(resp)) == 503, 15000);
    ASSERT_STREQ(body_of(resp), "nats: not connected\n");
    ASSERT_EQ(http(port, "GET", "/healthz", resp, sizeof(resp)), 200);
    atomic_store(&store_up, false);
    ASSERT_EQ(http(port, "GET", "/readyz", resp, sizeof(resp)), 503);
    ASSERT_STREQ(body_of(resp), "nats: not connected\nstore: not answering\n");
    atomic_store(&store_up, true);
    ASSERT_EQ(jsd_fx_nats_restart(&fx), 0);
    ASSERT_WAIT(http(port, "GET", "/readyz", resp, sizeof(resp)) == 200, 30000);

    jsd_metrics_server_destroy(srv);
    jsd_metrics_destroy(m);
    jsd_conn_close(c);
    jsd_fx_nats_stop(&fx);
}

/* ":PORT" binds every interface, as Prometheus exporters do. */
static void empty_host_binds_every_interface(void **state)
{
    (void)state;
    jsd_metrics *m = NULL;
    jsd_metrics_server *srv = NULL;
    jsd_error e;
    ASSERT_OK_E(jsd_metrics_create(&m, &e), e.msg);
    ASSERT_OK_E(jsd_metrics_serve(&srv, m, NULL, ":0", &e), e.msg);
    char cmd[128], out[4096];
    snprintf(cmd, sizeof(cmd), "ss -ltnH 'sport = :%d'", jsd_metrics_server_port(srv));
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "0.0.0.0:");
    ASSERT_EQ(http(jsd_metrics_server_port(srv), "GET", "/healthz", resp, sizeof(resp)), 200);
    jsd_metrics_server_destroy(srv);
    jsd_metrics_destroy(m);
}

JSD_TEST_MAIN(cmocka_unit_test(serves_metrics_over_http), cmocka_unit_test(other_paths_and_methods),
              cmocka_unit_test(address_errors_are_clear),
              cmocka_unit_test(scrapes_while_counting_and_shows_connection),
              cmocka_unit_test(health_and_readiness),
              cmocka_unit_test(empty_host_binds_every_interface))
