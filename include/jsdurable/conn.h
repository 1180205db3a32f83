/*
 * Connection profile: explicit settings -> one NATS connection and JetStream
 * context (CONN-1..5).
 *
 * Every setting is explicit; nothing is read from the environment here (the
 * CLI maps its flags and JSD_* variables onto this struct). Credentials are
 * copied when the connection is opened, wiped from memory when it is closed,
 * and never appear in logs, errors or status output.
 */
#ifndef JSDURABLE_CONN_H
#define JSDURABLE_CONN_H

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct jsd_conn jsd_conn;

typedef struct jsd_conn_opts {
    /* One or more server URLs, comma-separated: "nats://a:4222,nats://b:4222".
     * Required; at most 32. Schemes nats:// and tls:// (tls:// implies
     * TLS); the port defaults to 4222. A URL may carry user:password@ or
     * token@; those are treated as credentials (never echoed, shown as
     * "***@") and exclude the other authentication fields. */
    const char *servers;
    const char *name; /* client name shown by the server; default "jsdurable" */

    /* Authentication: at most one of token, user+password, creds_file,
     * nkey_seed_file. */
    const char *token;
    const char *user;
    const char *password;
    const char *creds_file;     /* JWT + NKey seed (.creds) */
    const char *nkey_seed_file; /* file holding an NKey user seed ("SU..."); the
                                 * public key is derived from it */

    /* TLS. tls_required refuses a plaintext server. */
    int tls_required;
    const char *tls_ca_file;   /* CA roots (PEM) */
    const char *tls_cert_file; /* client certificate (PEM), with tls_key_file */
    const char *tls_key_file;
    /* Name the server certificate must carry; default: the host of the URL
     * being connected to. */
    const char *tls_hostname;
    /* TLS handshake before the server's INFO. Needs nats-server >= 2.10.4 and a
     * client library that offers it; with nats.c 3.4.1 asking for it fails
     * with JSD_ERR_NOT_SUPPORTED. */
    int tls_handshake_first;

    int connect_timeout_ms; /* one TCP/TLS connect attempt; default 2000 */
    int request_timeout_ms; /* JetStream API requests; default 5000 */

    /* Start-up: keep retrying the first connection for this long, then fail
     * with a clear error (JSD_ERR_CONNECT). Default 10000; 0 means a single
     * attempt. An attempt under way when the budget ends is finished, so the
     * failure can come up to one connect_timeout_ms per server URL late.
     * Authorization and TLS refusals are definitive and end it at once. */
    int startup_budget_ms;

    /* Run time: reconnect attempts after a loss (-1 = for ever, the default:
     * an outage never ends the process), wait between attempts and random
     * jitter added to it. */
    int reconnect_attempts;
    int reconnect_wait_ms;   /* default 250 */
    int reconnect_jitter_ms; /* default 100 */
    /* Bytes buffered while reconnecting (1 .. 1 GiB); default 8 MiB. */
    int reconnect_buffer_bytes;
    /* Per-subscription pending limits (messages, bytes up to 2 GiB - 1);
     * defaults 65536 and 64 MiB. */
    int max_pending_msgs;
    int64_t max_pending_bytes;

    /* JetStream domain (a leaf node's or hub's "jetstream { domain: ... }"):
     * the API is reached at "$JS.<domain>.API". One token of [A-Za-z0-9_-].
     * Or, for an account that imports another's JetStream, the API prefix
     * itself ("$JS.hub.API", "js.acc"): a subject without wildcards; a
     * trailing dot is ignored. At most one of the two; default neither
     * ("$JS.API"). Every JetStream request of the library uses it. */
    const char *js_domain;
    const char *js_api_prefix;

    /* Fail when the server does not offer JetStream (default 1). With 0 the
     * connection is for core NATS only (jsd_conn_publish_core). */
    int require_jetstream;

    /* Liveness: a PING every ping_interval_ms; after 2 unanswered the
     * connection counts as lost and reconnection starts, so a hung server is
     * noticed within about three intervals. Default 5000 (nats.c's own
     * default is 2 minutes). */
    int ping_interval_ms;

    /* Socket writes. 0 (the default): every publication and ACK is written
     * to the socket at once, one write each (lowest latency). 1: they are
     * gathered in the connection's write buffer and nats.c's flusher thread
     * writes them about 1 ms later, in large writes (a full buffer is
     * written at once). Much less CPU per message for a process that
     * publishes many at a time: `jsdurable relay` uses 1 (docs/RELAY.md,
     * docs/PERFORMANCE.md), for up to ~1 ms more commit-to-PubAck latency.
     * Nothing else changes: a publication still counts only when its PubAck
     * arrives, and a write to a server that stops reading still fails after
     * request_timeout_ms. */
    int coalesce_writes;
} jsd_conn_opts;

/* Fill defaults. */
JSD_EXTERN void jsd_conn_opts_init(jsd_conn_opts *o);

/*
 * Open a connection: validate the profile, connect within the start-up budget,
 * check JetStream when required. On failure *out is NULL and err (optional)
 * says why: JSD_ERR_CONFIG, JSD_ERR_CONNECT (names the servers, never their
 * credentials), JSD_ERR_AUTH, JSD_ERR_TLS, JSD_ERR_NO_JETSTREAM,
 * JSD_ERR_NOT_SUPPORTED. The options are copied.
 */
JSD_EXTERN jsd_status jsd_conn_open(jsd_conn **out, const jsd_conn_opts *o, jsd_error *err);

/* Close, free and wipe credentials. Accepts NULL. */
JSD_EXTERN void jsd_conn_close(jsd_conn *c);

/* Once, as the process ends, after every jsd_conn is closed (and when
 * nothing else in the process uses nats.c): wait up to timeout_ms for the
 * NATS client library's own threads to finish and release its global state.
 * Without it a process can exit while those threads still free a closed
 * connection's TLS state, and die in the heap check at exit (nats.c 3.4.1).
 * No jsd_conn may be opened afterwards. JSD_OK, or JSD_ERR_TIMEOUT if the
 * threads were still running at the deadline; JSD_ERR_INVALID for a
 * timeout_ms below 1. */
JSD_EXTERN jsd_status jsd_conn_shutdown(int timeout_ms);

/* Last error text of this handle ("" if none). */
JSD_EXTERN const char *jsd_conn_errmsg(const jsd_conn *c);
JSD_EXTERN const jsd_error *jsd_conn_error(const jsd_conn *c);

/* Connected right now (thread-safe). */
JSD_EXTERN int jsd_conn_is_connected(jsd_conn *c);
/* Number of reconnections since open (thread-safe). */
JSD_EXTERN uint64_t jsd_conn_reconnects(jsd_conn *c);
/* Version string of the server currently connected to ("" if unknown; read
 * from the server's greeting at open and again after a reconnection). Not
 * thread-safe: call it from the thread that owns the handle. */
JSD_EXTERN const char *jsd_conn_server_version(jsd_conn *c);
/* Server URLs with any credentials removed, for status output. */
JSD_EXTERN const char *jsd_conn_servers_redacted(const jsd_conn *c);

/* Core NATS publish for explicitly lossy subjects (CONN-3): no JetStream, no
 * acknowledgement. */
JSD_EXTERN jsd_status jsd_conn_publish_core(jsd_conn *c, const char *subject, const void *data,
                                            size_t len);

#ifdef __cplusplus
}
#endif
#endif
