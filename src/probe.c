/*
 * probe — a raw TCP connection to a NATS server, beside nats.c's own: read the
 * plain-text INFO line a server sends to any new client and, when asked, send
 * PING and wait for the answer. conn.c uses it twice. Before each connect
 * attempt, as the guard against nats.c 3.4.1's endless connect to a silent
 * server (the workaround's whole story is above
 * jsd__conn_guard_silent_servers). And for the server version: nats.c 3.4.1
 * does not expose the server's INFO, so the version is read from that INFO
 * line over one short extra connection, at open and after a reconnection (not
 * possible with TLS handshake-first, where it stays unknown).
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "conn_priv.h"

/* ---- the raw probe: INFO, and PING answered --------------------------------------- */

typedef enum probe_result {
    PROBE_NO_INFO,  /* unreachable, refused, closed, or no INFO line in time */
    PROBE_SILENT,   /* sent INFO, then did not answer PING in time */
    PROBE_ANSWERED, /* sent INFO and answered PING (or was not asked, see below) */
} probe_result;

/* Append bytes from fd to buf until a line past `from` ends in "\r\n" or the
 * deadline passes. */
static bool probe_line(int fd, char *buf, size_t cap, size_t *len, size_t from, int64_t deadline)
{
    while (*len + 1 < cap) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int64_t left = deadline - jsd__mono_ms();
        if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
            return false;
        ssize_t n = recv(fd, buf + *len, cap - 1 - *len, 0);
        if (n <= 0) {
            if (n < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            return false;
        }
        *len += (size_t)n;
        buf[*len] = '\0';
        if (strstr(buf + from, "\r\n"))
            return true;
    }
    return false;
}

/* One short extra TCP connection to host:port: read the plain-text INFO line a
 * NATS server sends to any new client (also TLS servers that do not require
 * the handshake first) and copy its "version" to out (when out is given).
 * With ping, also send PING and wait for the next line. Only servers that
 * require neither TLS nor authentication are asked: a TLS server takes no
 * plain text after INFO, and one that requires authentication answers a PING
 * before CONNECT with -ERR 'Authorization Violation' and logs an
 * authentication error for each probe; for those the INFO line is all that is
 * checked. */
static probe_result probe_server(const char *host, int port, int timeout_ms, bool ping, char *out,
                                 size_t cap)
{
    struct addrinfo hints, *res = NULL;
    char portstr[16], buf[4096];
    size_t len = 0, info_len;
    int fd = -1;
    probe_result r = PROBE_NO_INFO;
    int64_t deadline = jsd__mono_ms() + timeout_ms;

    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    jsd__snprintf(portstr, sizeof(portstr), "%d", port);
    if (getaddrinfo(host, portstr, &hints, &res) != 0 || !res)
        return PROBE_NO_INFO;
    fd = socket(res->ai_family, res->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, res->ai_protocol);
    if (fd < 0)
        goto done;
    if (connect(fd, res->ai_addr, res->ai_addrlen) != 0 && errno != EINPROGRESS)
        goto done;
    if (!probe_line(fd, buf, sizeof(buf), &len, 0, deadline) || strncmp(buf, "INFO ", 5) != 0)
        goto done;
    info_len = (size_t)(strstr(buf, "\r\n") + 2 - buf);
    buf[info_len - 2] = '\0';
    if (out) {
        const char *v = strstr(buf, "\"version\":\"");
        if (v) {
            v += 11;
            size_t n = strcspn(v, "\"");
            if (n > 0 && n < cap) {
                memcpy(out, v, n);
                out[n] = '\0';
            }
        }
    }
    r = PROBE_ANSWERED;
    if (!ping || strstr(buf, "\"tls_required\":true") || strstr(buf, "\"auth_required\":true"))
        goto done;
    /* bytes past the INFO line are the start of the answer */
    memmove(buf, buf + info_len, len - info_len + 1);
    len -= info_len;
    if (send(fd, "PING\r\n", 6, MSG_NOSIGNAL) != 6 ||
        !(strstr(buf, "\r\n") || probe_line(fd, buf, sizeof(buf), &len, 0, deadline)))
        r = PROBE_SILENT;
done:
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return r;
}

/* nats.c 3.4.1 workaround: the one place that holds it.
 *
 * natsConnection_Connect of nats.c 3.4.1 can spin for ever against a server
 * that sends INFO but never answers the PING that follows CONNECT (a server
 * hung or paused right after greeting): its PONG read (_readProto in src/conn.c
 * of v3.4.1) loops until a byte or the end of the stream arrives and ignores
 * the NATS_TIMEOUT that natsSock_Read returns, at once and again and again,
 * once the connect deadline has passed. Neither the connect timeout nor our
 * start-up budget can interrupt it, and no option bounds it.
 *
 * So before each attempt every server URL is probed with a raw connection
 * (probe_server: INFO, then PING answered, within connect_timeout_ms and the
 * budget left). If none answered and one of them was silent after its INFO,
 * nats.c is not called: the attempt fails as a timeout, retried until the
 * budget is spent. If some answered while others were silent, nats.c gets the
 * answering URLs first and the silent ones last (in a rotated order, not
 * nats.c's shuffle), so it reaches a silent one only if every answering one
 * fails in between; the silent ones stay in the pool for later reconnection.
 * When none is silent the options are left as the profile made them.
 *
 * What this cannot cover: a server that goes silent between its answer to the
 * probe and nats.c's own PONG read, and servers the probe cannot PING (TLS,
 * authentication required: their INFO alone is checked, so one that hangs after
 * greeting still spins). Remove this guard with a nats.c whose _readProto
 * honours the deadline. */
jsd_status jsd__conn_guard_silent_servers(jsd_conn *c, natsOptions *no, int64_t deadline,
                                          bool *reordered, jsd_error *err)
{
    const char *order[CONN_MAX_URLS];
    probe_result r[CONN_MAX_URLS];
    int answered = 0, silent = 0, n = 0, first_silent = -1;
    int64_t left = deadline - jsd__mono_ms();
    int t = (int)(left > 0 ? JSD_MIN(left, (int64_t)c->connect_timeout_ms) : c->connect_timeout_ms);
    natsStatus s = NATS_OK;

    if (c->tls_handshake_first)
        return JSD_OK; /* no plain-text INFO to read: nothing to probe */
    for (int i = 0; i < c->nurls; i++) {
        r[i] = probe_server(c->urls[i].host, c->urls[i].port, t, true, NULL, 0);
        answered += r[i] == PROBE_ANSWERED;
        if (r[i] == PROBE_SILENT && silent++ == 0)
            first_silent = i;
    }
    if (silent == 0) {
        if (*reordered) {
            for (int i = 0; i < c->nurls; i++)
                order[i] = c->urls[i].raw;
            if ((s = natsOptions_SetServers(no, order, c->nurls)) == NATS_OK &&
                (s = natsOptions_SetNoRandomize(no, c->nurls <= 1)) == NATS_OK)
                *reordered = false;
        }
    } else if (answered == 0) {
        return jsd__err(err, JSD_ERR_TIMEOUT,
                        "NATS server %s sent INFO but did not answer PING within %d ms (hung or "
                        "paused?); not handing it to nats.c %s, whose connect would wait for "
                        "ever",
                        c->urls[first_silent].redacted, t, nats_GetVersion());
    } else {
        unsigned char rot = 0;
        char hex[3];
        if (jsd__random_hex(hex, 1))
            rot = (unsigned char)strtoul(hex, NULL, 16);
        for (probe_result want = PROBE_ANSWERED;;
             want = want == PROBE_ANSWERED ? PROBE_NO_INFO : PROBE_SILENT) {
            for (int k = 0; k < c->nurls; k++) {
                int i = (k + rot) % c->nurls;
                if (r[i] == want)
                    order[n++] = c->urls[i].raw;
            }
            if (want == PROBE_SILENT)
                break;
        }
        if ((s = natsOptions_SetServers(no, order, n)) == NATS_OK &&
            (s = natsOptions_SetNoRandomize(no, true)) == NATS_OK)
            *reordered = true;
    }
    if (s != NATS_OK) {
        jsd_status st = jsd__err_nats(err, s, 0, "ordering the server URLs");
        if (err)
            jsd__conn_scrub(c, err->msg);
        return st;
    }
    return JSD_OK;
}

void jsd__conn_refresh_version(jsd_conn *c)
{
    char url[512];
    conn_url u;
    jsd_error e;

    c->server_version[0] = '\0';
    if (c->tls_handshake_first)
        return; /* no plain-text INFO to read; the version stays unknown */
    if (!c->nc || natsConnection_GetConnectedUrl(c->nc, url, sizeof(url)) != NATS_OK || !url[0])
        return;
    memset(&u, 0, sizeof(u));
    if (jsd__url_parse(url, &u, &e) == JSD_OK)
        probe_server(u.host, u.port, c->connect_timeout_ms, false, c->server_version,
                     sizeof(c->server_version));
    jsd__free_secret(u.raw);
    jsd__free(u.redacted);
    jsd__wipe(url, sizeof(url));
}
