/*
 * metrics_http — the libmicrohttpd server in front of a metrics registry:
 * GET /metrics (the Prometheus text exposition of src/metrics.c), /healthz
 * (alive) and /readyz (NATS connected and the daemon's readiness hook), on
 * a thread of its own (OBS-1; docs/OPERATIONS.md, "Health endpoints").
 */
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "jsd_int.h"

/* ---- HTTP server ------------------------------------------------------------------ */

struct jsd_metrics_server {
    struct MHD_Daemon *d;
    jsd_metrics *m;
    jsd_conn *conn;
    int port;
    pthread_mutex_t ready_mu; /* guards the readiness hook */
    jsd_ready_fn ready_fn;
    void *ready_user;
};

static enum MHD_Result respond(struct MHD_Connection *c, unsigned code, const char *ctype,
                               const char *body, size_t len)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, "Allow", "GET, HEAD");
    enum MHD_Result ok = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ok;
}

void jsd_metrics_server_set_ready(jsd_metrics_server *s, jsd_ready_fn fn, void *user)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->ready_mu);
    s->ready_fn = fn;
    s->ready_user = user;
    pthread_mutex_unlock(&s->ready_mu);
}

/* /readyz: 200 "ready", or 503 and one line per missing dependency. */
static enum MHD_Result respond_ready(jsd_metrics_server *s, struct MHD_Connection *c,
                                     const char *ctype)
{
    char body[512] = "";
    if (s->conn && !jsd_conn_is_connected(s->conn))
        jsd__strlcpy(body, "nats: not connected\n", sizeof(body));
    pthread_mutex_lock(&s->ready_mu);
    if (s->ready_fn) {
        char why[256] = "";
        if (!s->ready_fn(s->ready_user, why, sizeof(why))) {
            size_t used = strlen(body);
            jsd__snprintf(body + used, sizeof(body) - used, "%s\n", why[0] ? why : "not ready");
        }
    }
    pthread_mutex_unlock(&s->ready_mu);
    size_t len = strlen(body);
    if (len == 0)
        return respond(c, MHD_HTTP_OK, ctype, "ready\n", 6);
    return respond(c, MHD_HTTP_SERVICE_UNAVAILABLE, ctype, body, strlen(body));
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    jsd_metrics_server *s = cls;
    (void)version;
    (void)upload_data;
    /* A request with a body comes back with its chunks: swallow them, answer
     * at the end. */
    if (*con_cls == NULL) {
        *con_cls = (void *)1;
        if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
            return MHD_YES;
    }
    if (*upload_data_size) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    static const char text[] = "text/plain; charset=utf-8";
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return respond(c, MHD_HTTP_METHOD_NOT_ALLOWED, text, "method not allowed\n", 19);
    if (strcmp(url, "/healthz") == 0)
        return respond(c, MHD_HTTP_OK, text, "ok\n", 3);
    if (strcmp(url, "/readyz") == 0)
        return respond_ready(s, c, text);
    if (strcmp(url, "/metrics") != 0) {
        static const char nf[] =
            "not found: metrics are at /metrics, health at /healthz and /readyz\n";
        return respond(c, MHD_HTTP_NOT_FOUND, text, nf, sizeof(nf) - 1);
    }
    jsd_metrics_observe_conn(s->m, s->conn);
    char *body = NULL;
    size_t len = 0;
    if (jsd__metrics_render_alloc(s->m, &body, &len) != JSD_OK)
        return respond(c, MHD_HTTP_INTERNAL_SERVER_ERROR, text, "out of memory\n", 14);
    enum MHD_Result ok =
        respond(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", body, len);
    jsd__free(body);
    return ok;
}

jsd_status jsd_metrics_serve(jsd_metrics_server **out, jsd_metrics *m, jsd_conn *conn,
                             const char *addr, jsd_error *err)
{
    char host[256];
    const char *port_s;
    if (out)
        *out = NULL;
    if (!m || !addr || !out)
        return jsd__err(err, JSD_ERR_INVALID,
                        "jsd_metrics_serve: registry, address and out "
                        "are required");
    if (addr[0] == '[') {
        const char *close = strchr(addr, ']');
        if (!close || close[1] != ':' || (size_t)(close - addr - 1) >= sizeof(host))
            return jsd__err(err, JSD_ERR_CONFIG, "metrics address \"%.200s\" is not [IPv6]:PORT",
                            addr);
        memcpy(host, addr + 1, (size_t)(close - addr - 1));
        host[close - addr - 1] = '\0';
        port_s = close + 2;
    } else {
        const char *colon = strrchr(addr, ':');
        if (!colon || (size_t)(colon - addr) >= sizeof(host))
            return jsd__err(err, JSD_ERR_CONFIG,
                            "metrics address \"%.200s\" is not HOST:PORT (e.g. 127.0.0.1:9464)",
                            addr);
        memcpy(host, addr, (size_t)(colon - addr));
        host[colon - addr] = '\0';
        if (!host[0]) /* ":9464": every interface, as Prometheus exporters bind */
            jsd__strlcpy(host, "0.0.0.0", sizeof(host));
        port_s = colon + 1;
    }
    int64_t port;
    if (!jsd__parse_i64(port_s, 0, 65535, &port))
        return jsd__err(err, JSD_ERR_CONFIG, "metrics address \"%.200s\": port must be 0..65535",
                        addr);

    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(host, port_s, &hints, &res);
    if (gai != 0 || !res)
        return jsd__err(err, JSD_ERR_CONFIG, "metrics address \"%.200s\": cannot resolve %s: %s",
                        addr, host, gai_strerror(gai));

    jsd_metrics_server *s = jsd__calloc(1, sizeof(*s));
    if (!s) {
        freeaddrinfo(res);
        return jsd__err(err, JSD_ERR_NOMEM, "out of memory starting the metrics server");
    }
    s->m = m;
    s->conn = conn;
    pthread_mutex_init(&s->ready_mu, NULL);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD;
    if (res->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    errno = 0;
    s->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
                            res->ai_addr, MHD_OPTION_CONNECTION_LIMIT, (unsigned)32,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
    int e = errno;
    freeaddrinfo(res);
    if (!s->d) {
        pthread_mutex_destroy(&s->ready_mu);
        jsd__free(s);
        return jsd__err(err, JSD_ERR_IO, "cannot serve metrics on %.200s: %s", addr,
                        e ? strerror(e) : "the HTTP server did not start");
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? (int)info->port : (int)port;
    JSD_INFO("metrics",
             "serving Prometheus metrics on %s port %d at /metrics (health: /healthz, /readyz)",
             host, s->port);
    *out = s;
    return JSD_OK;
}

int jsd_metrics_server_port(const jsd_metrics_server *s)
{
    return s ? s->port : 0;
}

void jsd_metrics_server_destroy(jsd_metrics_server *s)
{
    if (!s)
        return;
    MHD_stop_daemon(s->d);
    pthread_mutex_destroy(&s->ready_mu);
    jsd__free(s);
}
