/*
 * conn — the connection profile: explicit settings (jsd_conn_opts) become one
 * natsConnection and one jsCtx (CONN-1..5).
 *
 * Open validates the whole profile first (URLs, one auth method, ranges), then
 * connects with nats.c's own retry-on-failed-connect off: the start-up budget
 * is ours, so a definitive refusal (authorization, TLS) ends the attempt at
 * once while an unreachable server is retried with backoff until the budget
 * is spent. Before each attempt a raw probe checks that the servers answer
 * PING (the nats.c 3.4.1 workaround in probe.c: its connect never returns
 * from a server that sends INFO and then nothing). With
 * require_jetstream the JetStream API must answer; there is no
 * fallback to core NATS. A JetStream domain or API prefix becomes the jsCtx's
 * (so every js_* call uses it) and jsd__conn_js_api_prefix() for the raw API
 * requests of other modules. At run time nats.c reconnects for ever by default;
 * callbacks keep an atomic "connected" flag and a reconnect counter, and one
 * asynchronous error handler installed at open fans server errors out to the
 * listeners of conn_int.h.
 *
 * Credentials. The profile's token, user, password and credential file paths
 * are copied at open and wiped at close; no error, log line or status text
 * ever contains the token, the password or a file's contents (a path is
 * named when the file cannot be read), and URLs are shown with their user-info replaced by "***"
 * (nats.c's own error texts pass through the same redaction). The token is handed to nats.c through
 * a token callback so the library keeps no copy of it in its options. Limits we cannot fix from
 * outside (checked in the nats.c 3.4.1 sources): natsOptions_SetUserInfo copies user and password,
 * and URLs that carry user-info are copied into the options and the server pool; the CONNECT line
 * holding the token or password is built in a heap buffer and passes through the socket write
 * buffer. nats.c frees all of these with plain free(), without overwriting, so those bytes may
 * linger in freed heap memory until reused. Creds and NKey seed files are read by nats.c at each
 * connect; it does overwrite those file buffers and the decoded seed after use. Our own copy of a
 * seed file (read to derive the public key) is wiped too.
 *
 * Server version. Read by probe.c from the INFO line of one short extra
 * connection, at open and after a reconnection.
 *
 * The file's neighbours: url.c (server URLs, redaction), nkeys.c (the public
 * key of a seed file), natserr.c (nats.c failures as jsd_error), probe.c (raw
 * INFO/PING probe); conn_priv.h is what they share. What is left is one idea,
 * profile -> connection (validation, options, connect and its diagnostics,
 * close), so it stays one file a little over 800 lines.
 *
 * Callbacks and lifetime. nats.c runs connection callbacks on its own thread
 * and may deliver the closed callback after natsConnection_Destroy returned,
 * so callbacks get a separate state block (struct conn_shared) that close
 * frees only once the closed callback has run.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn_priv.h"
#include "subject.h"

#define CONN_CLOSE_WAIT_MS 5000

/* ---- library init ------------------------------------------------------------ */

static pthread_once_t nats_once = PTHREAD_ONCE_INIT;
static natsStatus nats_open_status = NATS_OK;

static void nats_open_once(void)
{
    /* Never paired with nats_Close(): other connections (and other users of
     * nats.c in the process) may exist at any time. */
    nats_open_status = nats_Open(-1);
}

/* The one place that works around nats.c 3.4.1's exit race: natsConnection_
 * Destroy returns while the library's threads may still release the
 * connection (its TLS state among it), so exit handlers, OpenSSL's cleanup
 * among them, could run under them. Seen as `malloc_consolidate(): unaligned
 * fastbin chunk detected` at exit after a TLS connection, about 1 in 30 runs
 * (tests/integration/test_conn). */
jsd_status jsd_conn_shutdown(int timeout_ms)
{
    if (timeout_ms < 1)
        return JSD_ERR_INVALID;
    natsStatus s = nats_CloseAndWait((int64_t)timeout_ms);
    if (s == NATS_TIMEOUT)
        return JSD_ERR_TIMEOUT;
    return JSD_OK; /* NATS_ILLEGAL_STATE: nats.c was never opened, or is closed */
}

/* ---- defaults ---------------------------------------------------------------- */

void jsd_conn_opts_init(jsd_conn_opts *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof(*o));
    o->name = "jsdurable";
    o->connect_timeout_ms = 2000;
    o->request_timeout_ms = 5000;
    o->startup_budget_ms = 10000;
    o->reconnect_attempts = -1;
    o->reconnect_wait_ms = 250;
    o->reconnect_jitter_ms = 100;
    o->reconnect_buffer_bytes = 8 * 1024 * 1024;
    o->max_pending_msgs = 65536;
    o->max_pending_bytes = 64 * 1024 * 1024;
    o->require_jetstream = 1;
    o->ping_interval_ms = 5000;
    o->coalesce_writes = 0;
}

static bool set(const char *s)
{
    return s && *s;
}

static jsd_status check_readable(const char *path, const char *what, jsd_error *err)
{
    FILE *f;
    if (!set(path))
        return JSD_OK;
    f = fopen(path, "re");
    if (!f)
        return jsd__err(err, JSD_ERR_CONFIG, "cannot read the %s \"%s\": %s", what, path,
                        strerror(errno));
    fclose(f);
    return JSD_OK;
}

/* ---- validation -------------------------------------------------------------- */

/* At most one of js_domain and js_api_prefix, each valid (subject.c). */
static jsd_status validate_js_api(const jsd_conn_opts *o, jsd_error *err)
{
    if (set(o->js_domain) && set(o->js_api_prefix))
        return jsd__err(err, JSD_ERR_CONFIG,
                        "both a JetStream domain and an API prefix are set; use only one (the "
                        "domain \"D\" is the prefix \"$JS.D.API\")");
    if ((set(o->js_domain) && !jsd__js_domain_valid(o->js_domain, err)) ||
        (set(o->js_api_prefix) && !jsd__js_api_prefix_valid(o->js_api_prefix, err))) {
        if (err)
            err->status = JSD_ERR_CONFIG;
        return JSD_ERR_CONFIG;
    }
    return JSD_OK;
}

static jsd_status validate(jsd_conn *c, const jsd_conn_opts *o, jsd_error *err)
{
    int methods = 0;
    jsd_status st;

    if ((st = jsd__conn_parse_servers(c, o->servers, err)) != JSD_OK)
        return st;
    methods += set(o->token);
    methods += set(o->user) || set(o->password);
    methods += set(o->creds_file);
    methods += set(o->nkey_seed_file);
    if (methods > 1)
        return jsd__err(err, JSD_ERR_CONFIG,
                        "more than one authentication method set; use only one of token, "
                        "user+password, creds_file, nkey_seed_file");
    if (set(o->user) != set(o->password))
        return jsd__err(err, JSD_ERR_CONFIG, "%s",
                        set(o->user) ? "user given without password"
                                     : "password given without user");
    for (int i = 0; i < c->nurls; i++)
        if (methods > 0 && jsd__url_has_userinfo(&c->urls[i]))
            return jsd__err(err, JSD_ERR_CONFIG,
                            "server URL \"%s\" carries credentials and an authentication method "
                            "is also set; use only one",
                            c->urls[i].redacted);
    if (set(o->tls_cert_file) != set(o->tls_key_file))
        return jsd__err(err, JSD_ERR_CONFIG,
                        "a TLS client certificate needs both tls_cert_file and tls_key_file");
    if ((st = check_readable(o->creds_file, "credentials file", err)) != JSD_OK ||
        (st = check_readable(o->nkey_seed_file, "NKey seed file", err)) != JSD_OK ||
        (st = check_readable(o->tls_ca_file, "TLS CA file", err)) != JSD_OK ||
        (st = check_readable(o->tls_cert_file, "TLS certificate file", err)) != JSD_OK ||
        (st = check_readable(o->tls_key_file, "TLS key file", err)) != JSD_OK)
        return st;
    if (o->tls_handshake_first) {
#if JSD_HAVE_NATS_TLS_HANDSHAKE_FIRST
        /* Set in build_options(); the server must be configured for it too. */
#else
        return jsd__err(err, JSD_ERR_NOT_SUPPORTED,
                        "TLS handshake-first is not supported by nats.c %s (needs a newer client "
                        "and nats-server >= 2.10.4)",
                        nats_GetVersion());
#endif
    }
#define RANGE(field, lo, hi, what)                                                                 \
    do {                                                                                           \
        if ((int64_t)o->field < (int64_t)(lo) || (int64_t)o->field > (int64_t)(hi))                \
            return jsd__err(err, JSD_ERR_CONFIG, "%s is %lld; it must be in %lld..%lld", what,     \
                            (long long)o->field, (long long)(lo), (long long)(hi));                \
    } while (0)
    RANGE(connect_timeout_ms, 1, 600000, "connect_timeout_ms");
    RANGE(request_timeout_ms, 1, 600000, "request_timeout_ms");
    RANGE(startup_budget_ms, 0, 86400000, "startup_budget_ms");
    RANGE(reconnect_attempts, -1, 1000000000, "reconnect_attempts (-1 = for ever)");
    RANGE(reconnect_wait_ms, 0, 3600000, "reconnect_wait_ms");
    RANGE(reconnect_jitter_ms, 0, 3600000, "reconnect_jitter_ms");
    RANGE(reconnect_buffer_bytes, 1, 1024 * 1024 * 1024, "reconnect_buffer_bytes");
    RANGE(ping_interval_ms, 100, 3600000, "ping_interval_ms");
    RANGE(coalesce_writes, 0, 1, "coalesce_writes");
    RANGE(max_pending_msgs, 1, 100000000, "max_pending_msgs");
    RANGE(max_pending_bytes, 1, INT32_MAX, "max_pending_bytes");
#undef RANGE
    if (o->name && strlen(o->name) > 256)
        return jsd__err(err, JSD_ERR_CONFIG, "connection name is longer than 256 bytes");
    return validate_js_api(o, err);
}

/* ---- callbacks --------------------------------------------------------------- */

static void on_disconnected(natsConnection *nc, void *closure)
{
    conn_shared *sh = closure;
    (void)nc;
    atomic_store(&sh->connected, 0);
    if (!atomic_load(&sh->closing))
        JSD_WARN("conn", "disconnected from NATS; reconnecting");
}

static void on_reconnected(natsConnection *nc, void *closure)
{
    conn_shared *sh = closure;
    (void)nc;
    atomic_fetch_add(&sh->reconnects, 1);
    atomic_store(&sh->version_stale, 1);
    atomic_store(&sh->connected, 1);
    JSD_INFO("conn", "reconnected to NATS");
}

static void on_closed(natsConnection *nc, void *closure)
{
    conn_shared *sh = closure;
    (void)nc;
    atomic_store(&sh->connected, 0);
    if (!atomic_load(&sh->closing))
        JSD_ERROR("conn", "NATS connection closed: reconnection attempts exhausted; this "
                          "connection will not recover (raise reconnect_attempts, -1 = for ever)");
    pthread_mutex_lock(&sh->lk);
    sh->closed = true;
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->lk);
}

static void on_async_error(natsConnection *nc, natsSubscription *sub, natsStatus s, void *closure)
{
    conn_shared *sh = closure;
    const char *t = NULL;
    char text[384];
    (void)sub;
    /* the connection's last error text belongs to this event only if its
     * status matches (a slow-consumer event leaves it unchanged) */
    if (natsConnection_GetLastError(nc, &t) != s || !t)
        t = "";
    jsd__redact_urls(text, sizeof(text), t && *t ? t : natsStatus_GetText(s));
    jsd__nats_strip_locations(text);
    pthread_mutex_lock(&sh->lk);
    for (int i = 0; i < CONN_MAX_LISTENERS; i++)
        if (sh->listeners[i].fn)
            sh->listeners[i].fn(s, text, sh->listeners[i].user);
    pthread_mutex_unlock(&sh->lk);
    if (s != NATS_SLOW_CONSUMER)
        JSD_DEBUG("conn", "asynchronous NATS error: %s (%s)", natsStatus_GetText(s), text);
}

/* nats.c asks for the token at each (re)connect and does not keep it. */
static const char *token_cb(void *closure)
{
    const jsd_conn *c = closure;
    return c->token ? c->token : "";
}

/* The nonce is signed here, not by nats.c 3.4.1 (nkeys.c, "Signing the
 * server's nonce"): a signature it cannot send fails this attempt before its
 * CONNECT, counted in unsendable_sigs, and the next attempt gets a new nonce. */
static natsStatus sign_cb(char **err_txt, unsigned char **sig, int *len, const char *nonce,
                          void *closure)
{
    jsd_conn *c = closure;
    const char *path = c->nkey_seed_file ? c->nkey_seed_file : c->creds_file;
    unsigned char *out = malloc(64); /* nats.c frees it */
    bool unsendable = false;
    if (!out)
        return NATS_NO_MEMORY;
    /* a bare seed's public key was announced once, at open (nkeys.c); a
     * creds file's JWT names its own */
    const char *announced = c->nkey_public[0] ? c->nkey_public : NULL;
    jsd_status st = jsd__nkey_sign_nonce(path, announced, nonce ? nonce : "", out, &unsendable);
    if (st != JSD_OK || unsendable) {
        const char *why;
        jsd__wipe(out, 64);
        free(out);
        if (unsendable) {
            atomic_fetch_add(&c->sh->unsendable_sigs, 1);
            why = "the nonce's signature begins with a zero byte, which nats.c 3.4.1 cannot "
                  "send; trying again with a new nonce";
        } else if (st == JSD_ERR_AUTH) {
            if (!atomic_exchange(&c->nkey_mismatch_warned, 1))
                JSD_WARN("conn",
                         "the NKey seed file \"%s\" now holds another user key than the one "
                         "this connection announced when it opened (nats.c 3.4.1 takes a seed's "
                         "public key once): connection attempts fail until the process is "
                         "restarted or the seed it opened with is back",
                         path);
            why = "the NKey seed file holds another user key than the one this connection "
                  "announces; restart the process to use it";
        } else {
            JSD_WARN("conn",
                     "cannot sign the NATS server's nonce: the key file \"%s\" cannot be "
                     "read or holds no user seed; this connection attempt fails",
                     path);
            why = "cannot sign the server's nonce: the key file cannot be read or holds no "
                  "user seed";
        }
        *err_txt = strdup(why);
        return NATS_ERR;
    }
    atomic_store(&c->nkey_mismatch_warned, 0);
    *sig = out;
    *len = 64;
    return NATS_OK;
}

static natsStatus creds_jwt_cb(char **jwt, char **err_txt, void *closure)
{
    const jsd_conn *c = closure;
    if (jsd__creds_jwt(c->creds_file, jwt) == JSD_OK)
        return NATS_OK;
    *err_txt = strdup("the credentials file cannot be read or holds no user JWT");
    return NATS_ERR;
}

/* ---- options ----------------------------------------------------------------- */

static jsd_status build_options(jsd_conn *c, const jsd_conn_opts *o, natsOptions **out,
                                jsd_error *err)
{
    natsOptions *no = NULL;
    natsStatus s;
    const char *urls[CONN_MAX_URLS];
    bool secure = o->tls_required != 0;
    const char *step = "creating NATS options";

    *out = NULL;
    for (int i = 0; i < c->nurls; i++) {
        urls[i] = c->urls[i].raw;
        if (strcmp(c->urls[i].scheme, "tls") == 0)
            secure = true;
    }
    if ((s = natsOptions_Create(&no)) != NATS_OK)
        goto fail;
    step = "setting the server URLs";
    if ((s = natsOptions_SetServers(no, urls, c->nurls)) != NATS_OK)
        goto fail;
    step = "setting options";
    if ((s = natsOptions_SetNoRandomize(no, c->nurls <= 1)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetName(no, c->name)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetTimeout(no, o->connect_timeout_ms)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetPingInterval(no, o->ping_interval_ms)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetMaxPingsOut(no, 2)) != NATS_OK)
        goto fail;
    /* coalesce_writes: without SendAsap nats.c's flusher thread writes the
     * buffer about 1 ms after the first unwritten message (nats.c 3.4.1,
     * conn.c _flusher), and a publish that overflows the buffer writes it at
     * once. */
    if ((s = natsOptions_SetSendAsap(no, !o->coalesce_writes)) != NATS_OK)
        goto fail;
    /* Every publish writes to the socket under the connection's lock (at once
     * with SendAsap, or when the buffer fills; the flusher under the same
     * lock). Without a write deadline a server that stops reading (paused,
     * hung) blocks that write for ever, and the pinger, which needs the same
     * lock, can never notice. With it the write fails after this long and the
     * connection is dropped and re-established (publishers report UNKNOWN);
     * nats.c 3.4.1 sets it before every publish and flusher write. */
    if ((s = natsOptions_SetWriteDeadline(no, o->request_timeout_ms)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetAllowReconnect(no, true)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetMaxReconnect(
             no, o->reconnect_attempts < 0 ? -1 : o->reconnect_attempts)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetReconnectWait(no, o->reconnect_wait_ms)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetReconnectJitter(no, o->reconnect_jitter_ms, o->reconnect_jitter_ms)) !=
        NATS_OK)
        goto fail;
    if ((s = natsOptions_SetReconnectBufSize(no, o->reconnect_buffer_bytes)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetMaxPendingMsgs(no, o->max_pending_msgs)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetRetryOnFailedConnect(no, false, NULL, NULL)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetDisconnectedCB(no, on_disconnected, c->sh)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetReconnectedCB(no, on_reconnected, c->sh)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetClosedCB(no, on_closed, c->sh)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetErrorHandler(no, on_async_error, c->sh)) != NATS_OK)
        goto fail;
    step = "setting credentials";
    if (c->token && (s = natsOptions_SetTokenHandler(no, token_cb, c)) != NATS_OK)
        goto fail;
    if (c->user && (s = natsOptions_SetUserInfo(no, c->user, c->password)) != NATS_OK)
        goto fail;
    if (c->creds_file || c->nkey_seed_file) {
        /* the key files are read here once for a clear error, and again by
         * the callbacks at each (re)connection */
        const char *path = c->creds_file ? c->creds_file : c->nkey_seed_file;
        char pub[64], *jwt = NULL;
        jsd_status kst = jsd__nkey_public_from_file(path, pub, sizeof(pub), err);
        if (kst == JSD_OK && c->creds_file && jsd__creds_jwt(path, &jwt) != JSD_OK)
            kst = jsd__err(err, JSD_ERR_CONFIG,
                           "the credentials file \"%s\" holds no user JWT (a line between "
                           "\"-----BEGIN NATS USER JWT-----\" and its END line)",
                           path);
        if (jwt) {
            jsd__wipe(jwt, strlen(jwt));
            free(jwt);
        }
        if (kst != JSD_OK) {
            natsOptions_Destroy(no);
            return kst;
        }
        step = c->creds_file ? "loading the credentials file" : "loading the NKey seed file";
        if (!c->creds_file)
            jsd__strlcpy(c->nkey_public, pub, sizeof(c->nkey_public));
        s = c->creds_file ? natsOptions_SetUserCredentialsCallbacks(no, creds_jwt_cb, c, sign_cb, c)
                          : natsOptions_SetNKey(no, pub, sign_cb, c);
        if (s != NATS_OK)
            goto fail;
    }
    if (secure) {
        step = "enabling TLS";
        if ((s = natsOptions_SetSecure(no, true)) != NATS_OK)
            goto fail;
    }
#if JSD_HAVE_NATS_TLS_HANDSHAKE_FIRST
    if (o->tls_handshake_first) {
        step = "enabling TLS handshake-first";
        if ((s = natsOptions_SetSecure(no, true)) != NATS_OK ||
            (s = natsOptions_TLSHandshakeFirst(no)) != NATS_OK)
            goto fail;
    }
#endif
    if (set(o->tls_ca_file)) {
        step = "loading the TLS CA file";
        if ((s = natsOptions_LoadCATrustedCertificates(no, o->tls_ca_file)) != NATS_OK)
            goto fail;
    }
    if (set(o->tls_cert_file)) {
        step = "loading the TLS client certificate and key";
        if ((s = natsOptions_LoadCertificatesChain(no, o->tls_cert_file, o->tls_key_file)) !=
            NATS_OK)
            goto fail;
    }
    if (set(o->tls_hostname)) {
        step = "setting the expected TLS host name";
        if ((s = natsOptions_SetExpectedHostname(no, o->tls_hostname)) != NATS_OK)
            goto fail;
    }
    *out = no;
    return JSD_OK;
fail:
    natsOptions_Destroy(no);
    {
        jsd_status st = jsd__err_nats(err, s, 0, step);
        if (st == JSD_ERR_TLS || st == JSD_ERR_INVALID || st == JSD_ERR_NATS ||
            s == NATS_SSL_ERROR || s == NATS_ERR || s == NATS_NOT_FOUND || s == NATS_IO_ERROR ||
            s == NATS_SYS_ERROR)
            st = (err ? (err->status = JSD_ERR_CONFIG) : JSD_ERR_CONFIG);
        if (err)
            jsd__conn_scrub(c, err->msg);
        return st;
    }
}

/* ---- connect ------------------------------------------------------------------- */

/* Only an unreachable or unresponsive server is worth another attempt; an
 * authorization or TLS refusal, a bad credentials file and the like are
 * definitive and end the start-up at once. */
static bool retryable(jsd_status st)
{
    return st == JSD_ERR_CONNECT || st == JSD_ERR_TIMEOUT;
}

/* The host name nats.c checks the certificate against: the profile's
 * tls_hostname, else the URL's host (nats.c 3.4.1 is built with forced host
 * verification). With several URLs of different hosts it cannot be known
 * which one was tried last. */
static void expected_host(const jsd_conn *c, const jsd_conn_opts *o, char *out, size_t cap)
{
    if (set(o->tls_hostname)) {
        jsd__strlcpy(out, o->tls_hostname, cap);
        return;
    }
    for (int i = 1; i < c->nurls; i++)
        if (strcmp(c->urls[i].host, c->urls[0].host) != 0) {
            jsd__strlcpy(out, "(the host of the server URL)", cap);
            return;
        }
    jsd__snprintf(out, cap, "%s", c->nurls > 0 ? c->urls[0].host : "");
}

/* Turn nats.c's "SSL handshake error: <code>:<reason>:..." into a diagnostic
 * that says what to fix. */
static void tls_diagnostic(const jsd_conn *c, const jsd_conn_opts *o, const char *text,
                           jsd_error *err)
{
    const char *p = strstr(text, "SSL handshake error: ");
    const char *cert = strstr(text, "cert=");
    const char *issuer = strstr(text, "issuer=");
    char subject[160] = "", iss[160] = "", host[300];
    long code = 0;

    if (p) {
        p += strlen("SSL handshake error: ");
        char *endp;
        code = strtol(p, &endp, 10);
        if (endp == p || *endp != ':')
            code = 0;
    }
    if (cert) {
        cert += 5;
        size_t n = JSD_MIN(strcspn(cert, ":)"), sizeof(subject) - 1);
        memcpy(subject, cert, n);
        subject[n] = '\0';
    }
    if (issuer) {
        issuer += 7;
        size_t n = JSD_MIN(strcspn(issuer, ":)"), sizeof(iss) - 1);
        memcpy(iss, issuer, n);
        iss[n] = '\0';
    }
    expected_host(c, o, host, sizeof(host));
    if (code == 62 /* X509_V_ERR_HOSTNAME_MISMATCH */ || code == 64 /* IP_ADDRESS_MISMATCH */ ||
        code == 63 /* EMAIL */) {
        jsd__err(err, JSD_ERR_TLS,
                 "TLS: server certificate does not match expected host name \"%s\" (server %s, "
                 "certificate %s); connect with a name the certificate lists, or set "
                 "tls_hostname",
                 host, c->servers_redacted, subject[0] ? subject : "?");
    } else if (code == 20 || code == 21 || code == 2 || code == 19 || code == 18) {
        jsd__err(err, JSD_ERR_TLS,
                 "TLS: the server certificate of %s is not trusted: %s (certificate %s issued by "
                 "%s); set tls_ca_file to the CA that signed it",
                 c->servers_redacted,
                 code == 18 || code == 19 ? "self-signed certificate"
                                          : "unable to get local issuer certificate",
                 subject[0] ? subject : "?", iss[0] ? iss : "?");
    } else if (code == 10 || code == 9) {
        jsd__err(err, JSD_ERR_TLS, "TLS: the server certificate of %s is %s (certificate %s)",
                 c->servers_redacted, code == 10 ? "expired" : "not yet valid",
                 subject[0] ? subject : "?");
    } else {
        jsd__err(err, JSD_ERR_TLS, "TLS handshake with %s failed: %s", c->servers_redacted, text);
    }
}

static bool uses_tls(const jsd_conn *c, const jsd_conn_opts *o)
{
    if (o->tls_required || o->tls_handshake_first)
        return true;
    for (int i = 0; i < c->nurls; i++)
        if (strcmp(c->urls[i].scheme, "tls") == 0)
            return true;
    return false;
}

static jsd_status classify_connect(jsd_conn *c, const jsd_conn_opts *o, natsStatus s,
                                   jsd_error *err)
{
    jsd_error e;
    jsd_status st;

    jsd_error_clear(&e);
    st = jsd__err_nats(&e, s, 0, "connect");
    jsd__conn_scrub(c, e.msg);
    if (s == NATS_SECURE_CONNECTION_WANTED) {
        jsd__err(err, JSD_ERR_TLS,
                 "TLS: server %s does not offer TLS but TLS is required; refusing a plaintext "
                 "connection",
                 c->servers_redacted);
    } else if (s == NATS_SECURE_CONNECTION_REQUIRED) {
        jsd__err(err, JSD_ERR_TLS,
                 "TLS: server %s requires TLS; use a tls:// URL or set tls_required (with "
                 "tls_ca_file)",
                 c->servers_redacted);
    } else if (s == NATS_PROTOCOL_ERROR && uses_tls(c, o) && strstr(e.msg, "got ''")) {
        /* With TLS 1.3 a server that refuses the client's certificate (or its
         * absence) does so after the handshake: nats.c then reads the end of
         * the stream where it expected the PONG. */
        if (set(o->tls_cert_file))
            jsd__err(err, JSD_ERR_TLS,
                     "TLS: server %s closed the connection after the TLS handshake: it did not "
                     "accept the client certificate \"%s\" (is it signed by a CA the server "
                     "trusts?)",
                     c->servers_redacted, o->tls_cert_file);
        else
            jsd__err(err, JSD_ERR_TLS,
                     "TLS: server %s closed the connection after the TLS handshake: it requires a "
                     "client certificate; set tls_cert_file and tls_key_file",
                     c->servers_redacted);
    } else if (st == JSD_ERR_AUTH) {
        jsd__err(err, JSD_ERR_AUTH,
                 "authorization failed at %s: the server rejected the credentials (%s); check "
                 "the token, user/password or credentials file",
                 c->servers_redacted, e.msg);
    } else if (st == JSD_ERR_TLS) {
        tls_diagnostic(c, o, e.msg, err);
    } else {
        jsd__err_copy(err, &e);
    }
    (void)o;
    if (err) {
        err->nats_status = (int)s;
        jsd__conn_scrub(c, err->msg);
    }
    return err ? err->status : st;
}

/* A connect attempt whose nonce signed to a signature nats.c 3.4.1 cannot
 * send (sign_cb) is tried again at once with a new nonce, up to
 * NONCE_SIGN_TRIES in a row (odds 256^-4), then like an unreachable server. */
enum { NONCE_SIGN_TRIES = 4 };

static jsd_status connect_with_budget(jsd_conn *c, const jsd_conn_opts *o, natsOptions *no,
                                      jsd_error *err)
{
    int64_t start = jsd__mono_ms(), deadline = start + o->startup_budget_ms;
    int64_t backoff = 50;
    int attempts = 0, unsendable_in_a_row = 0;
    bool reordered = false;
    jsd_error last;
    jsd_status st;

    jsd_error_clear(&last);
    for (;;) {
        natsStatus s;
        attempts++;
        jsd_error_clear(&last);
        st = jsd__conn_guard_silent_servers(c, no, deadline, &reordered, &last);
        if (st == JSD_OK) {
            uint64_t unsendable = atomic_load(&c->sh->unsendable_sigs);
            s = natsConnection_Connect(&c->nc, no);
            if (s == NATS_OK)
                return JSD_OK;
            c->nc = NULL;
            st = classify_connect(c, o, s, &last);
            if (atomic_load(&c->sh->unsendable_sigs) != unsendable) {
                JSD_DEBUG("conn",
                          "attempt %d: a signature nats.c 3.4.1 cannot send; trying "
                          "again with a new nonce",
                          attempts);
                if (++unsendable_in_a_row < NONCE_SIGN_TRIES)
                    continue;
                st = JSD_ERR_CONNECT;
            }
        }
        unsendable_in_a_row = 0;
        if (!retryable(st)) {
            jsd__err_copy(err, &last);
            return st;
        }
        int64_t now = jsd__mono_ms();
        if (now >= deadline)
            break;
        int64_t nap = JSD_MIN(backoff, deadline - now);
        JSD_DEBUG("conn", "connect attempt %d to %s failed (%s); retrying in %lld ms", attempts,
                  c->servers_redacted, last.msg, (long long)nap);
        jsd__sleep_ms(nap);
        backoff = JSD_MIN(backoff * 2, 1000);
        if (jsd__mono_ms() >= deadline)
            break;
    }
    jsd__err(err, JSD_ERR_CONNECT,
             "cannot connect to NATS at %s within the start-up budget of %d ms (%d attempts); "
             "last cause: %s",
             c->servers_redacted, o->startup_budget_ms, attempts, last.msg);
    if (err) {
        err->nats_status = last.nats_status;
        jsd__conn_scrub(c, err->msg);
    }
    return JSD_ERR_CONNECT;
}

static void connected_url(jsd_conn *c, char *out, size_t cap)
{
    char buf[512];
    if (c->nc && natsConnection_GetConnectedUrl(c->nc, buf, sizeof(buf)) == NATS_OK && buf[0]) {
        jsd__redact_urls(out, cap, buf);
        jsd__wipe(buf, sizeof(buf));
    } else {
        jsd__strlcpy(out, c->servers_redacted ? c->servers_redacted : "", cap);
    }
}

static jsd_status check_jetstream(jsd_conn *c, const jsd_conn_opts *o, jsd_error *err)
{
    jsOptions jo;
    jsAccountInfo *ai = NULL;
    jsErrCode jerr = 0;
    natsStatus s;
    char where[512];
    int64_t deadline = jsd__mono_ms() + JSD_MAX(o->startup_budget_ms, o->request_timeout_ms);

    jsOptions_Init(&jo);
    jo.Wait = o->request_timeout_ms;
    for (;;) {
        jerr = 0;
        s = js_GetAccountInfo(&ai, c->js, &jo, &jerr);
        if (s == NATS_OK) {
            jsAccountInfo_Destroy(ai);
            return JSD_OK;
        }
        /* JetStream starting up (cluster without a leader yet): retry. */
        if (!(jerr == JSClusterNotAvailErr || jerr == JSClusterNoPeersErr) ||
            jsd__mono_ms() >= deadline)
            break;
        jsd__sleep_ms(100);
    }
    connected_url(c, where, sizeof(where));
    if (s == NATS_NO_RESPONDERS && strcmp(c->js_api_prefix, "$JS.API") != 0) {
        jsd__err(err, JSD_ERR_NO_JETSTREAM,
                 "no JetStream answers at API prefix \"%s\" on NATS server %s: check the "
                 "JetStream %s (the server's jetstream { domain } or the account's import)",
                 c->js_api_prefix, where, c->js_domain ? "domain" : "API prefix");
        if (err)
            err->nats_status = (int)s;
        return JSD_ERR_NO_JETSTREAM;
    }
    if (s == NATS_NO_RESPONDERS || jerr == JSNotEnabledErr || jerr == JSNotEnabledForAccountErr) {
        jsd__err(err, JSD_ERR_NO_JETSTREAM,
                 "JetStream is not enabled on NATS server %s%s; jsdurable needs it and does not "
                 "fall back to core NATS: start nats-server with -js (or a jetstream {} block in "
                 "its configuration)%s",
                 where, jerr == JSNotEnabledForAccountErr ? " for this account" : "",
                 jerr == JSNotEnabledForAccountErr ? " and enable JetStream for the account" : "");
        if (err) {
            err->nats_status = (int)s;
            err->js_err_code = (int)jerr;
        }
        return JSD_ERR_NO_JETSTREAM;
    }
    if (s == NATS_TIMEOUT) {
        jsd__err(err, JSD_ERR_TIMEOUT,
                 "JetStream on NATS server %s did not answer within request_timeout_ms=%d", where,
                 o->request_timeout_ms);
        if (err)
            err->nats_status = (int)s;
        return JSD_ERR_TIMEOUT;
    }
    jsd_status st = jsd__err_nats(err, s, jerr, "checking JetStream");
    if (err)
        jsd__conn_scrub(c, err->msg);
    return st;
}

/* ---- open / close ---------------------------------------------------------------- */

/* The domain and the API prefix it stands for (nats.c builds the same one);
 * true when out of memory. */
static bool copy_js_api(jsd_conn *c, const jsd_conn_opts *o)
{
    char buf[300];
    if (set(o->js_domain)) {
        jsd__snprintf(buf, sizeof(buf), "$JS.%s.API", o->js_domain);
        c->js_domain = jsd__strdup(o->js_domain);
    } else {
        jsd__snprintf(buf, sizeof(buf), "%s", set(o->js_api_prefix) ? o->js_api_prefix : "$JS.API");
        size_t n = strlen(buf);
        if (n && buf[n - 1] == '.')
            buf[n - 1] = '\0';
    }
    c->js_api_prefix = jsd__strdup(buf);
    return !c->js_api_prefix || (set(o->js_domain) && !c->js_domain);
}

static void conn_free(jsd_conn *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->nurls; i++) {
        jsd__free_secret(c->urls[i].raw);
        jsd__free(c->urls[i].redacted);
    }
    jsd__free(c->servers_redacted);
    jsd__free_secret(c->token);
    jsd__free_secret(c->user);
    jsd__free_secret(c->password);
    jsd__free_secret(c->creds_file);
    jsd__free_secret(c->nkey_seed_file);
    jsd__free(c->name);
    jsd__free(c->js_domain);
    jsd__free(c->js_api_prefix);
    if (c->sh) {
        pthread_mutex_destroy(&c->sh->lk);
        pthread_cond_destroy(&c->sh->cv);
        jsd__free(c->sh);
    }
    jsd__wipe(c, sizeof(*c));
    jsd__free(c);
}

static jsd_status copy_secret(char **dst, const char *src)
{
    if (!set(src))
        return JSD_OK;
    *dst = jsd__strdup(src);
    return *dst ? JSD_OK : JSD_ERR_NOMEM;
}

/* A handle with its callback state, not connected: jsd_conn_close frees it. */
static jsd_conn *conn_alloc(void)
{
    jsd_conn *c = jsd__calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->sh = jsd__calloc(1, sizeof(*c->sh));
    if (!c->sh) {
        jsd__free(c);
        return NULL;
    }
    pthread_mutex_init(&c->sh->lk, NULL);
    if (jsd__cond_init_mono(&c->sh->cv) != 0) {
        pthread_mutex_destroy(&c->sh->lk);
        jsd__free(c->sh);
        jsd__free(c);
        return NULL;
    }
    return c;
}

jsd_status jsd__conn_opts_check(const jsd_conn_opts *o, jsd_error *err)
{
    if (!o)
        return jsd__err(err, JSD_ERR_INVALID, "jsd__conn_opts_check: options are NULL");
    jsd_conn *c = conn_alloc();
    if (!c)
        return jsd__err(err, JSD_ERR_NOMEM, "out of memory checking a connection profile");
    jsd_status st = validate(c, o, err);
    jsd_conn_close(c);
    if (st != JSD_OK && err)
        jsd__conn_scrub_profile(err->msg, o);
    return st;
}

jsd_status jsd_conn_open(jsd_conn **out, const jsd_conn_opts *o, jsd_error *err)
{
    jsd_conn *c = NULL;
    natsOptions *no = NULL;
    jsd_status st;

    if (!out)
        return jsd__err(err, JSD_ERR_INVALID, "jsd_conn_open: out is NULL");
    *out = NULL;
    if (!o)
        return jsd__err(err, JSD_ERR_INVALID, "jsd_conn_open: options are NULL");
    pthread_once(&nats_once, nats_open_once);
    if (nats_open_status != NATS_OK)
        return jsd__err(err, JSD_ERR_INTERNAL, "cannot initialise the nats.c library: %s",
                        natsStatus_GetText(nats_open_status));

    if (!(c = conn_alloc()))
        return jsd__err(err, JSD_ERR_NOMEM, "out of memory opening a connection");
    if ((st = validate(c, o, err)) != JSD_OK)
        goto fail;
    if (copy_secret(&c->token, o->token) || copy_secret(&c->user, o->user) ||
        copy_secret(&c->password, o->password) || copy_secret(&c->creds_file, o->creds_file) ||
        copy_secret(&c->nkey_seed_file, o->nkey_seed_file) ||
        !(c->name = jsd__strdup(set(o->name) ? o->name : "jsdurable")) || copy_js_api(c, o)) {
        st = jsd__err(err, JSD_ERR_NOMEM, "out of memory copying the connection profile");
        goto fail;
    }
    c->connect_timeout_ms = o->connect_timeout_ms;
    c->request_timeout_ms = o->request_timeout_ms;
    c->require_jetstream = o->require_jetstream;
    c->tls_handshake_first = o->tls_handshake_first;
    c->max_pending_msgs = o->max_pending_msgs;
    c->max_pending_bytes = o->max_pending_bytes;
    c->coalesce_writes = o->coalesce_writes;

    if ((st = build_options(c, o, &no, err)) != JSD_OK)
        goto fail;
    if ((st = connect_with_budget(c, o, no, err)) != JSD_OK)
        goto fail;
    c->sh->have_nc = true;
    atomic_store(&c->sh->connected, 1);
    natsOptions_Destroy(no);
    no = NULL;

    {
        jsOptions jo;
        natsStatus s;
        jsOptions_Init(&jo);
        jo.Wait = c->request_timeout_ms;
        if (c->js_domain)
            jo.Domain = c->js_domain;
        else
            jo.Prefix = c->js_api_prefix;
        if ((s = natsConnection_JetStream(&c->js, c->nc, &jo)) != NATS_OK) {
            st = jsd__err_nats(err, s, 0, "creating the JetStream context");
            goto fail;
        }
    }
    if (c->require_jetstream && (st = check_jetstream(c, o, err)) != JSD_OK)
        goto fail;
    jsd__conn_refresh_version(c);
    JSD_INFO("conn", "connected to NATS %s (server %s)", c->servers_redacted,
             c->server_version[0] ? c->server_version : "?");
    *out = c;
    return JSD_OK;
fail:
    natsOptions_Destroy(no);
    jsd_conn_close(c);
    if (err)
        jsd__conn_scrub_profile(err->msg, o);
    return st;
}

void jsd_conn_close(jsd_conn *c)
{
    if (!c)
        return;
    if (c->js) {
        jsCtx_Destroy(c->js);
        c->js = NULL;
    }
    if (c->nc) {
        atomic_store(&c->sh->closing, 1);
        natsConnection_Destroy(c->nc);
        c->nc = NULL;
        if (c->sh->have_nc) {
            /* wait for nats.c's closed callback, the last one that touches sh */
            int64_t until = jsd__mono_ms() + CONN_CLOSE_WAIT_MS;
            bool done;
            pthread_mutex_lock(&c->sh->lk);
            while (!(done = c->sh->closed))
                if (!jsd__cond_wait_until_ms(&c->sh->cv, &c->sh->lk, until)) {
                    done = c->sh->closed;
                    break;
                }
            pthread_mutex_unlock(&c->sh->lk);
            if (!done) {
                JSD_WARN("conn",
                         "nats.c did not report the connection closed within %d ms; "
                         "keeping its callback state allocated",
                         CONN_CLOSE_WAIT_MS);
                c->sh = NULL; /* leaked on purpose: a late callback may still use it */
            }
        }
    }
    conn_free(c);
}

/* ---- accessors ------------------------------------------------------------------- */

const char *jsd_conn_errmsg(const jsd_conn *c)
{
    return c ? c->last.msg : "";
}

const jsd_error *jsd_conn_error(const jsd_conn *c)
{
    return c ? &c->last : NULL;
}

int jsd_conn_is_connected(jsd_conn *c)
{
    return c && c->sh ? atomic_load(&c->sh->connected) : 0;
}

bool jsd__conn_gone(jsd_conn *c)
{
    if (!c || !c->sh || atomic_load(&c->sh->connected))
        return false;
    pthread_mutex_lock(&c->sh->lk);
    bool gone = c->sh->closed && !atomic_load(&c->sh->closing);
    pthread_mutex_unlock(&c->sh->lk);
    return gone;
}

uint64_t jsd_conn_reconnects(jsd_conn *c)
{
    return c && c->sh ? (uint64_t)atomic_load(&c->sh->reconnects) : 0;
}

const char *jsd_conn_server_version(jsd_conn *c)
{
    if (!c)
        return "";
    if (atomic_exchange(&c->sh->version_stale, 0) && atomic_load(&c->sh->connected))
        jsd__conn_refresh_version(c);
    return c->server_version;
}

const char *jsd_conn_servers_redacted(const jsd_conn *c)
{
    return c && c->servers_redacted ? c->servers_redacted : "";
}

jsd_status jsd_conn_publish_core(jsd_conn *c, const char *subject, const void *data, size_t len)
{
    natsStatus s;
    if (!c)
        return JSD_ERR_INVALID;
    jsd_error_clear(&c->last);
    if (!subject || !*subject)
        return jsd__err(&c->last, JSD_ERR_INVALID, "core publish: empty subject");
    if (len > (size_t)INT32_MAX)
        return jsd__err(&c->last, JSD_ERR_LIMIT, "core publish to \"%s\": %zu bytes is too large",
                        subject, len);
    s = natsConnection_Publish(c->nc, subject, data, (int)len);
    if (s != NATS_OK) {
        char what[300];
        jsd__snprintf(what, sizeof(what), "core publish to \"%s\"", subject);
        return jsd__err_nats(&c->last, s, 0, what);
    }
    return JSD_OK;
}

/* ---- internal API (conn_int.h) ------------------------------------------------- */

natsConnection *jsd__conn_nats(jsd_conn *c)
{
    return c ? c->nc : NULL;
}

jsCtx *jsd__conn_js(jsd_conn *c)
{
    return c ? c->js : NULL;
}

#define WRITE_NOW_WAIT_MS 5

void jsd__conn_write_now(jsd_conn *c)
{
    if (!c || !c->coalesce_writes || !c->nc ||
        natsConnection_Status(c->nc) != NATS_CONN_STATUS_CONNECTED)
        return;
    /* nats.c 3.4.1 has no public "write the buffer": a flush writes it in
     * place with its PING (conn.c _sendPing), then waits for the PONG. The
     * write is what is wanted; a PONG later than the short wait is no error
     * (a broken connection shows in the publications' own outcomes). */
    (void)natsConnection_FlushTimeout(c->nc, WRITE_NOW_WAIT_MS);
}

int jsd__conn_request_timeout_ms(const jsd_conn *c)
{
    return c ? c->request_timeout_ms : 5000;
}

const char *jsd__conn_js_api_prefix(const jsd_conn *c)
{
    return c && c->js_api_prefix ? c->js_api_prefix : "$JS.API";
}

int jsd__conn_add_error_listener(jsd_conn *c, jsd__conn_error_fn fn, void *user)
{
    int h = -1;
    if (!c || !c->sh || !fn)
        return -1;
    pthread_mutex_lock(&c->sh->lk);
    for (int i = 0; i < CONN_MAX_LISTENERS; i++) {
        if (!c->sh->listeners[i].fn) {
            c->sh->listeners[i].fn = fn;
            c->sh->listeners[i].user = user;
            h = i;
            break;
        }
    }
    pthread_mutex_unlock(&c->sh->lk);
    if (h < 0)
        JSD_ERROR("conn", "more than %d error listeners on one connection", CONN_MAX_LISTENERS);
    return h;
}

void jsd__conn_remove_error_listener(jsd_conn *c, int handle)
{
    if (!c || !c->sh || handle < 0 || handle >= CONN_MAX_LISTENERS)
        return;
    pthread_mutex_lock(&c->sh->lk);
    c->sh->listeners[handle].fn = NULL;
    c->sh->listeners[handle].user = NULL;
    pthread_mutex_unlock(&c->sh->lk);
}

void jsd__conn_pending_limits(const jsd_conn *c, int *msgs, int64_t *bytes)
{
    if (msgs)
        *msgs = c ? c->max_pending_msgs : 65536;
    if (bytes)
        *bytes = c ? c->max_pending_bytes : 64 * 1024 * 1024;
}
