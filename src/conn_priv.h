/*
 * The pieces of the connection module: the jsd_conn handle as conn.c builds
 * it, and what conn.c borrows from its neighbours (url.c parses and redacts
 * server URLs, nkeys.c derives an NKey's public key, natserr.c maps nats.c's
 * failures, probe.c speaks to a server over a raw TCP connection). Shared by
 * those five files only; the rest of the library uses conn_int.h.
 */
#ifndef JSD_CONN_PRIV_H
#define JSD_CONN_PRIV_H

#include <stdatomic.h>

#include "conn_int.h"

#define CONN_MAX_URLS      32
#define CONN_MAX_LISTENERS 16

typedef struct conn_listener {
    jsd__conn_error_fn fn;
    void *user;
} conn_listener;

/* State shared with nats.c's callback thread. */
typedef struct conn_shared {
    pthread_mutex_t lk;
    pthread_cond_t cv;
    atomic_int connected;
    atomic_uint_least64_t reconnects;
    atomic_int version_stale;
    atomic_int closing;                    /* jsd_conn_close started: a disconnect is expected */
    atomic_uint_least64_t unsendable_sigs; /* nonce signatures nats.c 3.4.1 cannot send */
    bool closed;                           /* the closed callback ran */
    bool have_nc;                          /* a connection exists, so a closed callback will come */
    conn_listener listeners[CONN_MAX_LISTENERS];
} conn_shared;

typedef struct conn_url {
    char *raw;      /* as given (may hold credentials) */
    char *redacted; /* user-info replaced by *** */
    char scheme[8];
    char host[256];
    int port;
} conn_url;

struct jsd_conn {
    natsConnection *nc;
    jsCtx *js;
    conn_shared *sh;

    conn_url urls[CONN_MAX_URLS];
    int nurls;
    char *servers_redacted;

    /* secrets and profile copies (wiped at close) */
    char *token;
    char *user;
    char *password;
    char *creds_file;
    char *nkey_seed_file;
    char *name;
    char *js_domain;     /* NULL: none */
    char *js_api_prefix; /* always set: "$JS.API" unless a domain or prefix says */

    int connect_timeout_ms;
    int request_timeout_ms;
    int require_jetstream;
    int tls_handshake_first; /* the server sends no plain-text INFO */
    int max_pending_msgs;
    int64_t max_pending_bytes;
    int coalesce_writes; /* nats.c's flusher writes the buffer (no SendAsap) */
    /* The public user key an NKey seed file gave at open, which nats.c 3.4.1
     * announces at every (re)connection ("" without a seed file). Public,
     * so kept; the signer refuses a seed that no longer matches it. */
    char nkey_public[64];
    atomic_int nkey_mismatch_warned; /* the signer logged the mismatch (reset on a match) */

    char server_version[64];
    jsd_error last;
};

/* ---- url.c -------------------------------------------------------------------- */

/* Copy src into dst replacing the user-info of every "scheme://user-info@"
 * with "***" (free text: a URL ends at a space, comma, quote or parenthesis). */
void jsd__redact_urls(char *dst, size_t cap, const char *src);
/* Parse one server URL into u (raw and redacted copies allocated); errors
 * name the URL redacted. */
jsd_status jsd__url_parse(const char *raw, conn_url *u, jsd_error *err);
/* Parse the comma-separated server list into c->urls and c->servers_redacted. */
jsd_status jsd__conn_parse_servers(jsd_conn *c, const char *servers, jsd_error *err);
bool jsd__url_has_userinfo(const conn_url *u);
/* Last line of defence on a text about to be shown: replace the profile's
 * secrets (as given, or as copied into c) with "***", in place. */
void jsd__conn_scrub_profile(char *buf, const jsd_conn_opts *o);
void jsd__conn_scrub(const jsd_conn *c, char *buf);

/* ---- natserr.c ------------------------------------------------------------------ */

/* Drop nats.c's source locations, "(conn.c:1905): ", from a text in place. */
void jsd__nats_strip_locations(char *t);

/* ---- nkeys.c -------------------------------------------------------------------- */

/* Read a seed file (only the seed, or a creds-style block holding it) and
 * derive its public user key into out. */
jsd_status jsd__nkey_public_from_file(const char *path, char *out, size_t cap, jsd_error *err);

/* ---- probe.c -------------------------------------------------------------------- */

/* The nats.c 3.4.1 silent-server guard (its whole story is in probe.c): probe
 * every URL, refuse an attempt where none answered and one was silent, or
 * hand nats.c the answering URLs first. *reordered tracks whether the server
 * order in no was changed. */
jsd_status jsd__conn_guard_silent_servers(jsd_conn *c, natsOptions *no, int64_t deadline,
                                          bool *reordered, jsd_error *err);
/* Re-read the connected server's version into c->server_version (left ""
 * when it cannot be read). */
void jsd__conn_refresh_version(jsd_conn *c);

#endif
