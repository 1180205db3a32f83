/*
 * Test-side control of the fault proxy (tests/tools/faultproxy.c): start it
 * between a test's clients and a nats-server the test started, switch its
 * fault mode while traffic flows, read its counters, stop it. A started proxy
 * dies with the thread that started it (parent-death signal: start proxies
 * from the test's main thread) and is stopped at exit;
 * its folder under jsd_test_dir() lets the runner's sweep find it too.
 *
 * Modes: "pass", "drop-first-puback", "withhold-acks", "cut-after N",
 * "pause", "cut" (see faultproxy.c for what each does).
 *
 * Caution with "pause" and nats.c 3.4.1: a client whose connect is between
 * the server's INFO and its PONG when the pause starts spins in
 * natsConnection_Connect for ever (its PONG read ignores the connect timeout).
 * Pause connections that are established, not ones being made.
 */
#ifndef JSD_PROXY_H
#define JSD_PROXY_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct jsd_fx_proxy {
    pid_t pid;
    int port;                /* clients connect to 127.0.0.1:port */
    int control_port;        /* the proxy's line-protocol control port */
    char url[64];            /* nats://127.0.0.1:port */
    char dir[PATH_MAX - 64]; /* folder: faultproxy.pid, proxy.log, control */
    int ctl_fd;              /* open control connection */
} jsd_fx_proxy;

typedef struct jsd_fx_proxy_stats {
    char mode[32];
    int conns;             /* open client connections */
    uint64_t accepted;     /* client connections accepted so far */
    uint64_t dropped_acks; /* PubAcks dropped so far */
    uint64_t c2s, s2c;     /* bytes forwarded each way */
} jsd_fx_proxy_stats;

/* Start a proxy to 127.0.0.1:upstream_port in the given mode (NULL: pass).
 * 0 on success; on failure the test fails with the proxy's output. */
int jsd_fx_proxy_start(int upstream_port, const char *mode, jsd_fx_proxy *out);
/* Switch mode; returns once the proxy has applied it. */
int jsd_fx_proxy_mode(jsd_fx_proxy *p, const char *mode);
/* Close every proxied connection now (mode becomes pass). */
int jsd_fx_proxy_cut(jsd_fx_proxy *p);
int jsd_fx_proxy_stats_get(jsd_fx_proxy *p, jsd_fx_proxy_stats *st);
/* PubAcks dropped so far (fails the test if the proxy does not answer). */
uint64_t jsd_fx_proxy_dropped_acks(jsd_fx_proxy *p);
/* true if the proxy process is alive */
bool jsd_fx_proxy_alive(const jsd_fx_proxy *p);
/* SIGTERM, wait; SIGKILL if it lingers. */
int jsd_fx_proxy_stop(jsd_fx_proxy *p);

#endif
