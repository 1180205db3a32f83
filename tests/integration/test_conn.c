/*
 * The connection profile against real nats-servers (CONN-1..5): TLS with token
 * authentication, client certificates required by the server, NKey login and
 * a credentials file in operator mode (each with a refused variant), an
 * unrelated CA, a host-name mismatch, TLS required against a plaintext server,
 * a server without JetStream, an unreachable server, a server that sends INFO
 * and then goes silent, a round trip through the shared JetStream server,
 * reconnection after a kill, the asynchronous error fan-out, and one test that
 * drives every failure with distinctive secrets and searches all captured
 * output for them.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conn_int.h"
#include "fixture.h"
#include "test.h"

#define BAD_TOKEN    "S3cr3t-T0ken-9c41e7-never-print"
#define BAD_PASSWORD "S3cr3t-Pa55w0rd-52ad0f-never-print"

/* Generous bound on how long a refused start-up may take beyond its budget:
 * a deadline check, not a timing benchmark. */
#define MARGIN_MS 8000

static void opts_for(jsd_conn_opts *o, const char *servers)
{
    jsd_conn_opts_init(o);
    o->servers = servers;
    o->connect_timeout_ms = 2000;
    o->startup_budget_ms = 2000;
    o->reconnect_wait_ms = 50;
    o->reconnect_jitter_ms = 10;
}

/* Open, expecting failure with want; returns the elapsed ms. */
static int64_t expect_open_fails(const jsd_conn_opts *o, jsd_status want, jsd_error *e)
{
    jsd_conn *c = (jsd_conn *)0x1;
    int64_t t0 = jsd_test_mono_ms();
    jsd_error_clear(e);
    jsd_status s = jsd_conn_open(&c, o, e);
    int64_t dt = jsd_test_mono_ms() - t0;
    if (s != want)
        fail_msg("jsd_conn_open returned %s (%s), expected %s", jsd_status_name(s), e->msg,
                 jsd_status_name(want));
    ASSERT_TRUE(c == NULL);
    ASSERT_EQ(e->status, want);
    print_message("%s after %lld ms: %s\n", jsd_status_name(s), (long long)dt, e->msg);
    return dt;
}

/* A loopback port nothing listens on: bound, read and released. */
static int closed_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port;
    ASSERT_TRUE(fd >= 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    ASSERT_EQ(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* ---- TLS + token -------------------------------------------------------------- */

/* The TLS server with its token, and options that log in to it. */
static void tls_token_setup(jsd_fx_nats *fx, jsd_conn_opts *o)
{
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_TLS, fx), 0);
    opts_for(o, fx->url);
    o->token = fx->token;
    o->tls_ca_file = fx->ca_file;
    o->tls_required = 1;
}

static void tls_with_token_connects(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_conn_opts o;
    jsd_conn *c = NULL;
    jsd_error e;
    tls_token_setup(&fx, &o);
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    ASSERT_TRUE(jsd_conn_is_connected(c));
    ASSERT_EQ(jsd_conn_reconnects(c), 0);
    ASSERT_STREQ(jsd_conn_server_version(c), fx.version);
    ASSERT_STREQ(jsd_conn_servers_redacted(c), fx.url);
    ASSERT_STREQ(jsd_conn_errmsg(c), "");
    ASSERT_TRUE(jsd__conn_js(c) != NULL);
    jsd_conn_close(c);

    /* a client certificate the server does not ask for is harmless (a server
     * that requires one: client_certificate_is_required_and_checked) */
    o.tls_cert_file = fx.client_cert_file;
    o.tls_key_file = fx.client_key_file;
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    jsd_conn_close(c);
}

/* jsd_conn_shutdown, the workaround for nats.c 3.4.1's exit race (seen after
 * this very TLS connection, src/conn.c): after the last close it waits for
 * the client's threads and says so; a bad timeout is refused and a second
 * call is harmless. The case's own exit then runs with no nats.c thread
 * left. */
static void shutdown_after_a_tls_connection_waits_for_the_client(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_conn_opts o;
    jsd_conn *c = NULL;
    jsd_error e;
    tls_token_setup(&fx, &o);
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    jsd_conn_close(c);
    ASSERT_EQ(jsd_conn_shutdown(0), JSD_ERR_INVALID);
    ASSERT_EQ(jsd_conn_shutdown(5000), JSD_OK);
    ASSERT_EQ(jsd_conn_shutdown(5000), JSD_OK);
}

/* ---- TLS client certificates (server with verify: true) ------------------------ */

static void client_certificate_is_required_and_checked(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_conn_opts o;
    jsd_conn *c = NULL;
    jsd_error e;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_MTLS, &fx), 0);
    opts_for(&o, fx.url);
    o.tls_ca_file = fx.ca_file;
    o.startup_budget_ms = 30000;

    /* signed by the CA the server trusts: admitted */
    o.tls_cert_file = fx.client_cert_file;
    o.tls_key_file = fx.client_key_file;
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    ASSERT_TRUE(jsd_conn_is_connected(c));
    jsd_conn_close(c);

    /* none: refused at once with a TLS error (not retried for the budget) */
    o.tls_cert_file = NULL;
    o.tls_key_file = NULL;
    int64_t dt = expect_open_fails(&o, JSD_ERR_TLS, &e);
    ASSERT_CONTAINS(e.msg, "certificate");
    ASSERT_LE(dt, 30000 / 2);

    /* signed by an unrelated CA: refused the same way */
    o.tls_cert_file = fx.other_client_cert_file;
    o.tls_key_file = fx.other_client_key_file;
    dt = expect_open_fails(&o, JSD_ERR_TLS, &e);
    ASSERT_CONTAINS(e.msg, "certificate");
    ASSERT_LE(dt, 30000 / 2);
}

/* ---- NKey and credentials-file login ---------------------------------------------- */

/* The first line of a key file, for checking that it never shows. */
static void file_text(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
}

/* No part of a seed (the 58-character "S..." text) or a JWT in text. */
static void assert_no_key_material(const char *text, const char *path)
{
    char buf[4096];
    file_text(path, buf, sizeof(buf));
    for (char *p = buf; *p; p++) {
        size_t n =
            strspn(p, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567abcdefghijklmnopqrstuvwxyz0123456789-_.");
        if (n >= 40) {
            char tok[2048];
            snprintf(tok, sizeof(tok), "%.*s", (int)JSD_MIN(n, sizeof(tok) - 1), p);
            /* any 24 bytes of it are enough to leak it */
            for (size_t i = 0; i + 24 <= strlen(tok); i += 12) {
                char piece[25];
                memcpy(piece, tok + i, 24);
                piece[24] = '\0';
                if (strstr(text, piece))
                    fail_msg("a piece of the key material in %s shows in an error text", path);
            }
        }
        p += n ? n - 1 : 0;
    }
}

static void nkey_seed_logs_in_and_an_unknown_seed_is_refused(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_conn_opts o;
    jsd_conn *c = NULL;
    jsd_error e;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_NKEY, &fx), 0);
    opts_for(&o, fx.url);
    o.startup_budget_ms = 30000;
    o.nkey_seed_file = fx.nkey_seed_file;
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    ASSERT_TRUE(jsd_conn_is_connected(c));
    jsd_conn_close(c);

    /* a valid user seed the server does not know */
    o.nkey_seed_file = fx.wrong_nkey_seed_file;
    int64_t dt = expect_open_fails(&o, JSD_ERR_AUTH, &e);
    ASSERT_CONTAINS(e.msg, "authorization failed");
    ASSERT_LE(dt, 30000 / 2);
    assert_no_key_material(e.msg, fx.wrong_nkey_seed_file);
    assert_no_key_material(e.msg, fx.nkey_seed_file);

    /* no credentials at all */
    o.nkey_seed_file = NULL;
    expect_open_fails(&o, JSD_ERR_AUTH, &e);
}

static void creds_file_logs_in_in_operator_mode(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_conn_opts o;
    jsd_conn *c = NULL;
    jsd_error e;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_OPERATOR, &fx), 0);
    opts_for(&o, fx.url);
    o.startup_budget_ms = 30000;
    o.creds_file = fx.creds_file;
    /* require_jetstream (the default): the account's JetStream answers */
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    ASSERT_TRUE(jsd_conn_is_connected(c));
    ASSERT_STREQ(jsd_conn_server_version(c), fx.version);
    jsd_conn_close(c);

    /* a user of an account the server does not know */
    o.creds_file = fx.foreign_creds_file;
    int64_t dt = expect_open_fails(&o, JSD_ERR_AUTH, &e);
    ASSERT_CONTAINS(e.msg, "authorization failed");
    ASSERT_LE(dt, 30000 / 2);
    assert_no_key_material(e.msg, fx.foreign_creds_file);

    /* the right JWT with another user's seed: the nonce signature fails */
    o.creds_file = fx.mismatched_creds_file;
    dt = expect_open_fails(&o, JSD_ERR_AUTH, &e);
    ASSERT_LE(dt, 30000 / 2);
    assert_no_key_material(e.msg, fx.mismatched_creds_file);
    assert_no_key_material(e.msg, fx.creds_file);
}

static void wrong_token_is_an_authorization_error(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_conn_opts o;
    jsd_error e;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_TLS, &fx), 0);
    opts_for(&o, fx.url);
    o.token = BAD_TOKEN;
    o.tls_ca_file = fx.ca_file;
    o.startup_budget_ms = 30000;
    int64_t dt = expect_open_fails(&o, JSD_ERR_AUTH, &e);
    ASSERT_CONTAINS(e.msg, "authorization failed");
    ASSERT_CONTAINS(e.msg, fx.url);
    /* definitive: not retried for the whole budget */
    ASSERT_LE(dt, 30000 / 2);
}

static void wrong_password_is_an_authorization_error(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_conn_opts o;
    jsd_error e;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_USERPASS, &fx), 0);
    opts_for(&o, fx.url);
    o.user = fx.user;
    o.password = BAD_PASSWORD;
    o.startup_budget_ms = 30000;
    int64_t dt = expect_open_fails(&o, JSD_ERR_AUTH, &e);
    ASSERT_LE(dt, 30000 / 2);

    /* the right password works, also when given inside the URL, which is then
     * shown redacted */
    jsd_conn *c = NULL;
    o.password = fx.password;
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    jsd_conn_close(c);
    char url[512], want[300];
    snprintf(url, sizeof(url), "nats://%s:%s@127.0.0.1:%d", fx.user, fx.password, fx.port);
    snprintf(want, sizeof(want), "nats://***@127.0.0.1:%d", fx.port);
    opts_for(&o, url);
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    ASSERT_STREQ(jsd_conn_servers_redacted(c), want);
    jsd_conn_close(c);
}

static void unrelated_ca_is_rejected(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_conn_opts o;
    jsd_error e;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_TLS, &fx), 0);
    opts_for(&o, fx.url);
    o.token = fx.token;
    o.tls_ca_file = fx.other_ca_file;
    o.startup_budget_ms = 30000;
    int64_t dt = expect_open_fails(&o, JSD_ERR_TLS, &e);
    ASSERT_CONTAINS(e.msg, "not trusted");
    ASSERT_CONTAINS(e.msg, "tls_ca_file");
    ASSERT_EQ(e.nats_status, NATS_SSL_ERROR);
    ASSERT_LE(dt, 30000 / 2);
}

static void host_name_mismatch_is_named(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_conn_opts o;
    jsd_error e;
    char want[128];
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_TLS, &fx), 0);
    opts_for(&o, fx.wrong_host_url);
    o.token = fx.token;
    o.tls_ca_file = fx.ca_file;
    o.tls_hostname = fx.wrong_host;
    expect_open_fails(&o, JSD_ERR_TLS, &e);
    snprintf(want, sizeof(want), "does not match expected host name \"%s\"", fx.wrong_host);
    ASSERT_CONTAINS(e.msg, want);

    /* the same server under its right name is fine: the chain was trusted */
    jsd_conn *c = NULL;
    o.tls_hostname = "localhost";
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    jsd_conn_close(c);
}

static void tls_required_refuses_a_plaintext_server(void **state)
{
    (void)state;
    jsd_conn_opts o;
    jsd_error e;
    opts_for(&o, jsd_fx_shared_nats_url());
    o.tls_required = 1;
    expect_open_fails(&o, JSD_ERR_TLS, &e);
    ASSERT_CONTAINS(e.msg, "does not offer TLS but TLS is required");
    ASSERT_CONTAINS(e.msg, jsd_fx_shared_nats_url());

    /* a tls:// URL means the same */
    char url[300];
    const char *p = strstr(jsd_fx_shared_nats_url(), "://");
    ASSERT_TRUE(p != NULL);
    snprintf(url, sizeof(url), "tls%s", p);
    opts_for(&o, url);
    expect_open_fails(&o, JSD_ERR_TLS, &e);
    ASSERT_CONTAINS(e.msg, "does not offer TLS");
}

/* ---- JetStream presence --------------------------------------------------------- */

static void no_jetstream_fails_loudly_without_fallback(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_conn_opts o;
    jsd_error e;
    jsd_conn *c = NULL;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_NOJS, &fx), 0);
    opts_for(&o, fx.url);
    expect_open_fails(&o, JSD_ERR_NO_JETSTREAM, &e);
    ASSERT_CONTAINS(e.msg, fx.url);
    ASSERT_CONTAINS(e.msg, "-js");
    ASSERT_CONTAINS(e.msg, "does not fall back to core NATS");

    /* Asked for core NATS only: the connection opens and lossy core publish
     * works (a plain subscriber sees it). */
    o.require_jetstream = 0;
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    natsSubscription *sub = NULL;
    natsMsg *m = NULL;
    ASSERT_EQ(natsConnection_SubscribeSync(&sub, jsd__conn_nats(c), "lossy.metrics"), NATS_OK);
    ASSERT_EQ(natsConnection_Flush(jsd__conn_nats(c)), NATS_OK);
    ASSERT_OK_E(jsd_conn_publish_core(c, "lossy.metrics", "42", 2), jsd_conn_errmsg(c));
    ASSERT_EQ(natsSubscription_NextMsg(&m, sub, 5000), NATS_OK);
    ASSERT_EQ(natsMsg_GetDataLength(m), 2);
    ASSERT_TRUE(memcmp(natsMsg_GetData(m), "42", 2) == 0);
    natsMsg_Destroy(m);
    natsSubscription_Destroy(sub);
    ASSERT_STATUS(jsd_conn_publish_core(c, "", "x", 1), JSD_ERR_INVALID);
    ASSERT_CONTAINS(jsd_conn_errmsg(c), "empty subject");
    ASSERT_EQ(jsd_conn_error(c)->status, JSD_ERR_INVALID);
    jsd_conn_close(c);
}

/* ---- start-up budget ------------------------------------------------------------ */

static void unreachable_server_fails_within_the_budget(void **state)
{
    (void)state;
    jsd_conn_opts o;
    jsd_error e;
    char url[64], want[64];
    int port = closed_port();
    snprintf(url, sizeof(url), "nats://127.0.0.1:%d", port);
    opts_for(&o, url);
    o.startup_budget_ms = 1500;
    o.connect_timeout_ms = 500;
    int64_t dt = expect_open_fails(&o, JSD_ERR_CONNECT, &e);
    ASSERT_CONTAINS(e.msg, url);
    ASSERT_CONTAINS(e.msg, "start-up budget of 1500 ms");
    ASSERT_CONTAINS(e.msg, "last cause");
    ASSERT_LE(dt, 1500 + 500 + MARGIN_MS);
    /* it did retry: more than one attempt was made */
    ASSERT_TRUE(strstr(e.msg, "(1 attempts)") == NULL);

    /* budget 0: a single attempt */
    o.startup_budget_ms = 0;
    expect_open_fails(&o, JSD_ERR_CONNECT, &e);
    ASSERT_CONTAINS(e.msg, "(1 attempts)");
    snprintf(want, sizeof(want), "127.0.0.1:%d", port);
    ASSERT_CONTAINS(e.msg, want);
}

/* "INFO then silence": a listener that, for each client, fetches the INFO
 * line of a real nats-server over its own connection, hands that line to the
 * client and then says nothing more (it reads and discards what the client
 * sends and keeps the socket open). This is what a client sees from a server
 * that hangs (or is paused) right after greeting it; nats.c 3.4.1's connect
 * would wait for the PONG for ever. */
typedef struct mute_server {
    int lfd;
    int upstream_port;
    atomic_int stop;
    atomic_int greeted; /* clients that got the INFO line */
    pthread_t th;
} mute_server;

static void mute_greet(mute_server *m, int cfd)
{
    struct sockaddr_in a;
    char line[4096];
    size_t len = 0;
    int ufd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)m->upstream_port);
    if (ufd < 0 || connect(ufd, (struct sockaddr *)&a, sizeof(a)) != 0)
        goto done;
    while (len + 1 < sizeof(line)) {
        ssize_t n = recv(ufd, line + len, 1, 0);
        if (n <= 0)
            goto done;
        if (line[len++] == '\n')
            break;
    }
    if (send(cfd, line, len, MSG_NOSIGNAL) == (ssize_t)len)
        atomic_fetch_add(&m->greeted, 1);
done:
    if (ufd >= 0)
        close(ufd);
}

static void *mute_main(void *arg)
{
    mute_server *m = arg;
    struct pollfd pf[65];
    int n = 1;
    pf[0].fd = m->lfd;
    pf[0].events = POLLIN;
    while (!atomic_load(&m->stop)) {
        /* the timeout only bounds how late a stop request is seen */
        if (poll(pf, (nfds_t)n, 50) <= 0)
            continue;
        if ((pf[0].revents & POLLIN) && n < 65) {
            int cfd = accept(m->lfd, NULL, NULL);
            if (cfd >= 0) {
                mute_greet(m, cfd);
                pf[n].fd = cfd;
                pf[n].events = POLLIN;
                n++;
            }
        }
        for (int i = 1; i < n; i++) {
            char sink[512];
            if ((pf[i].revents & (POLLIN | POLLHUP | POLLERR)) &&
                recv(pf[i].fd, sink, sizeof(sink), MSG_DONTWAIT) == 0) {
                close(pf[i].fd);
                pf[i--] = pf[--n];
            }
        }
    }
    for (int i = 1; i < n; i++)
        close(pf[i].fd);
    return NULL;
}

/* A listening socket on a free loopback port: its fd, the port to *port. */
static int loopback_listener(int *port)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_TRUE(fd >= 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    ASSERT_EQ(listen(fd, 64), 0);
    ASSERT_EQ(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

/* Start a mute server in front of upstream_port; returns its port. */
static int mute_start(mute_server *m, int upstream_port)
{
    int port;
    memset(m, 0, sizeof(*m));
    m->upstream_port = upstream_port;
    m->lfd = loopback_listener(&port);
    ASSERT_EQ(pthread_create(&m->th, NULL, mute_main, m), 0);
    return port;
}

/* Stop a fake server's thread (it sees stop within its 50 ms poll), then
 * close its listening socket. */
static void fake_stop(atomic_int *stop, pthread_t th, int lfd)
{
    atomic_store(stop, 1);
    pthread_join(th, NULL);
    close(lfd);
}

static void mute_stop(mute_server *m)
{
    fake_stop(&m->stop, m->th, m->lfd);
}

/* jsd_conn_open run on a thread of its own, so that a test can act while
 * it retries. */
typedef struct opener {
    jsd_conn_opts o;
    jsd_conn *c;
    jsd_error e;
    jsd_status st;
    atomic_int done;
} opener;

static void *open_thread(void *arg)
{
    opener *op = arg;
    op->st = jsd_conn_open(&op->c, &op->o, &op->e);
    atomic_store(&op->done, 1);
    return NULL;
}

/* nats.c 3.4.1 and a nonce whose signature begins with a zero byte. A fake
 * server (it claims nothing about nats-server; the real one's answer to a
 * CONNECT without "sig" is "Signature missing", an Authorization Violation,
 * seen in its debug log) greets each client, while zero_mode is set, with a
 * nonce chosen so that the NKey's signature of it begins with 0x00, and
 * otherwise with one whose signature does not. It checks each CONNECT's
 * signature against the key, answers a good one's PING with PONG, refuses
 * the rest with the server's words, and drops every client when kicked. */
typedef struct nonce_server {
    int lfd;
    EVP_PKEY *key;
    char zero_nonce[32], plain_nonce[32];
    atomic_int stop;
    atomic_int zero_mode;
    atomic_int kick;
    atomic_int greetings;         /* clients greeted */
    atomic_int zero_greetings;    /* clients greeted with the zero nonce */
    atomic_int unsigned_connects; /* CONNECTs without a signature */
    atomic_int signed_connects;   /* CONNECTs whose signature verified */
    atomic_int refused;           /* Authorization Violations sent */
    pthread_t th;
} nonce_server;

static bool sig_begins_with_zero(EVP_PKEY *k, const char *nonce)
{
    unsigned char sig[64];
    size_t len = sizeof(sig);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    assert_non_null(ctx);
    assert_int_equal(EVP_DigestSignInit(ctx, NULL, NULL, NULL, k), 1);
    assert_int_equal(EVP_DigestSign(ctx, sig, &len, (const unsigned char *)nonce, strlen(nonce)),
                     1);
    EVP_MD_CTX_free(ctx);
    return sig[0] == 0;
}

static int b64url_value(char ch)
{
    const char *a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    const char *p = ch ? strchr(a, ch) : NULL;
    return p ? (int)(p - a) : -1;
}

/* Does the CONNECT line carry a "sig" that verifies over nonce? */
static bool connect_signature_ok(EVP_PKEY *k, const char *line, const char *nonce)
{
    unsigned char sig[66];
    size_t n = 0;
    uint32_t acc = 0;
    int bits = 0;
    const char *p = strstr(line, "\"sig\":\"");
    if (!p)
        return false;
    for (p += 7; *p && *p != '"'; p++) {
        int v = b64url_value(*p);
        if (v < 0 || n >= sizeof(sig))
            return false;
        acc = (acc << 6) | (uint32_t)v;
        if ((bits += 6) >= 8) {
            bits -= 8;
            sig[n++] = (unsigned char)(acc >> bits);
        }
    }
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = ctx && n == 64 && EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, k) == 1 &&
              EVP_DigestVerify(ctx, sig, n, (const unsigned char *)nonce, strlen(nonce)) == 1;
    EVP_MD_CTX_free(ctx);
    return ok;
}

typedef struct nonce_client {
    int fd;
    char nonce[32];
    char buf[8192];
    size_t len;
    bool authed;
} nonce_client;

/* Handle the complete lines a client sent; false when it is to be closed. */
static bool nonce_serve_lines(nonce_server *m, nonce_client *cl)
{
    char *eol;
    while ((eol = strstr(cl->buf, "\r\n"))) {
        *eol = '\0';
        const char *reply = NULL;
        bool keep = true;
        if (!strncmp(cl->buf, "CONNECT ", 8)) {
            if (connect_signature_ok(m->key, cl->buf, cl->nonce)) {
                atomic_fetch_add(&m->signed_connects, 1);
                cl->authed = true;
            } else {
                if (!strstr(cl->buf, "\"sig\":"))
                    atomic_fetch_add(&m->unsigned_connects, 1);
                atomic_fetch_add(&m->refused, 1);
                reply = "-ERR 'Authorization Violation'\r\n";
                keep = false;
            }
        } else if (!strcmp(cl->buf, "PING")) {
            reply = cl->authed ? "PONG\r\n" : "-ERR 'Authorization Violation'\r\n";
            keep = cl->authed;
        }
        if (reply)
            (void)send(cl->fd, reply, strlen(reply), MSG_NOSIGNAL);
        size_t used = (size_t)(eol + 2 - cl->buf);
        memmove(cl->buf, cl->buf + used, cl->len - used + 1);
        cl->len -= used;
        if (!keep)
            return false;
    }
    return cl->len + 1 < sizeof(cl->buf);
}

static void nonce_greet(nonce_server *m, nonce_client *cl)
{
    char info[512];
    bool zero = atomic_load(&m->zero_mode) != 0;
    jsd__strlcpy(cl->nonce, zero ? m->zero_nonce : m->plain_nonce, sizeof(cl->nonce));
    atomic_fetch_add(&m->greetings, 1);
    if (zero)
        atomic_fetch_add(&m->zero_greetings, 1);
    int n = snprintf(info, sizeof(info),
                     "INFO {\"server_id\":\"FAKE\",\"server_name\":\"fake\",\"version\":\"2.9.10\","
                     "\"proto\":1,\"host\":\"127.0.0.1\",\"port\":0,\"headers\":true,"
                     "\"auth_required\":true,\"max_payload\":1048576,\"nonce\":\"%s\"}\r\n",
                     cl->nonce);
    (void)send(cl->fd, info, (size_t)n, MSG_NOSIGNAL);
}

static void *nonce_main(void *arg)
{
    nonce_server *m = arg;
    static nonce_client cl[16];
    struct pollfd pf[17];
    int n = 0;
    while (!atomic_load(&m->stop)) {
        if (atomic_exchange(&m->kick, 0))
            while (n > 0)
                close(cl[--n].fd);
        pf[0].fd = m->lfd;
        pf[0].events = POLLIN;
        for (int i = 0; i < n; i++) {
            pf[i + 1].fd = cl[i].fd;
            pf[i + 1].events = POLLIN;
        }
        /* the timeout only bounds how late a stop request is seen */
        if (poll(pf, (nfds_t)n + 1, 50) <= 0)
            continue;
        for (int i = n - 1; i >= 0; i--) {
            if (!(pf[i + 1].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t got = recv(cl[i].fd, cl[i].buf + cl[i].len, sizeof(cl[i].buf) - 1 - cl[i].len,
                               MSG_DONTWAIT);
            if (got > 0) {
                cl[i].len += (size_t)got;
                cl[i].buf[cl[i].len] = '\0';
            }
            if (got == 0 || (got > 0 && !nonce_serve_lines(m, &cl[i]))) {
                close(cl[i].fd);
                cl[i] = cl[--n];
            }
        }
        if ((pf[0].revents & POLLIN) && n < 16) {
            int cfd = accept(m->lfd, NULL, NULL);
            if (cfd >= 0) {
                memset(&cl[n], 0, sizeof(cl[n]));
                cl[n].fd = cfd;
                nonce_greet(m, &cl[n++]);
            }
        }
    }
    for (int i = 0; i < n; i++)
        close(cl[i].fd);
    return NULL;
}

/* A new user NKey: its private key in raw, and its seed file's text (the
 * seed and a newline) in line. */
static void new_user_seed(unsigned char raw[32], char *line, size_t cap)
{
    ASSERT_EQ(RAND_bytes(raw, 32), 1);
    ASSERT_OK(jsd__nkey_encode(20 << 3, true, raw, line, cap - 1));
    size_t n = strlen(line); /* room is left for the newline */
    line[n] = '\n';
    line[n + 1] = '\0';
}

/* path's content replaced by text. */
static void put_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "we");
    ASSERT_TRUE(f != NULL);
    fputs(text, f);
    ASSERT_EQ(fclose(f), 0);
}

/* Start the fake server for a new user NKey, whose seed goes to seed_path;
 * returns its port. */
static int nonce_start(nonce_server *m, const char *seed_path)
{
    unsigned char raw[32];
    char seed[64];
    int port;
    memset(m, 0, sizeof(*m));
    new_user_seed(raw, seed, sizeof(seed));
    m->key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, raw, sizeof(raw));
    ASSERT_TRUE(m->key != NULL);
    put_text(seed_path, seed);
    ASSERT_EQ(chmod(seed_path, 0600), 0);
    /* a nonce of each kind; about one in 256 signatures begins with 0x00 */
    for (int i = 0; !m->zero_nonce[0] || !m->plain_nonce[0]; i++) {
        char nonce[32];
        ASSERT_TRUE(i < 100000);
        snprintf(nonce, sizeof(nonce), "fakeNonce%d", i);
        char *slot = sig_begins_with_zero(m->key, nonce) ? m->zero_nonce : m->plain_nonce;
        if (!slot[0])
            jsd__strlcpy(slot, nonce, 32);
    }
    m->lfd = loopback_listener(&port);
    ASSERT_EQ(pthread_create(&m->th, NULL, nonce_main, m), 0);
    return port;
}

static void nonce_stop(nonce_server *m)
{
    fake_stop(&m->stop, m->th, m->lfd);
    EVP_PKEY_free(m->key);
}

/* No CONNECT goes out without its signature, at start-up or when
 * reconnecting, however many nonces in a row sign to a signature that nats.c
 * 3.4.1 would drop: such an attempt fails before its CONNECT and the next
 * one gets a new nonce. With nats.c's own signer the first such CONNECT goes
 * out unsigned and is refused; two refusals in a row while reconnecting
 * close the connection for good, so it would not come back below. */
static void unsendable_signatures_are_never_sent(void **state)
{
    (void)state;
    nonce_server m;
    opener op;
    pthread_t th;
    char url[64], seed_path[512];
    snprintf(seed_path, sizeof(seed_path), "%s/fake-user.nk", jsd_test_dir());
    int port = nonce_start(&m, seed_path);
    snprintf(url, sizeof(url), "nats://127.0.0.1:%d", port);
    memset(&op, 0, sizeof(op));
    opts_for(&op.o, url);
    op.o.startup_budget_ms = 20000;
    op.o.nkey_seed_file = seed_path;
    op.o.require_jetstream = 0; /* the fake has no JetStream */

    /* start-up: every nonce signs to a leading zero byte for a while */
    atomic_store(&m.zero_mode, 1);
    ASSERT_EQ(pthread_create(&th, NULL, open_thread, &op), 0);
    ASSERT_WAIT(atomic_load(&m.zero_greetings) >= 8 || atomic_load(&op.done), 10000);
    if (atomic_load(&op.done))
        fail_msg("the open ended while every nonce signed to a leading zero byte: %s (%d "
                 "CONNECTs sent unsigned)",
                 op.e.msg, atomic_load(&m.unsigned_connects));
    ASSERT_EQ(atomic_load(&m.unsigned_connects), 0);
    atomic_store(&m.zero_mode, 0);
    ASSERT_WAIT(atomic_load(&op.done), 20000 + MARGIN_MS);
    ASSERT_EQ(pthread_join(th, NULL), 0);
    ASSERT_OK_E(op.st, op.e.msg);
    ASSERT_TRUE(jsd_conn_is_connected(op.c));
    ASSERT_EQ(atomic_load(&m.unsigned_connects), 0);
    ASSERT_EQ(atomic_load(&m.refused), 0);
    ASSERT_EQ(atomic_load(&m.signed_connects), 1);

    /* reconnection: more such nonces in a row than nats.c forgives */
    int before = atomic_load(&m.zero_greetings);
    atomic_store(&m.zero_mode, 1);
    atomic_store(&m.kick, 1);
    ASSERT_WAIT(!jsd_conn_is_connected(op.c), 5000);
    ASSERT_WAIT(atomic_load(&m.zero_greetings) >= before + 4, 10000);
    ASSERT_EQ(atomic_load(&m.unsigned_connects), 0);
    ASSERT_EQ(atomic_load(&m.refused), 0);
    atomic_store(&m.zero_mode, 0);
    ASSERT_WAIT(jsd_conn_is_connected(op.c), 10000);
    ASSERT_EQ(atomic_load(&m.signed_connects), 2);
    print_message("nats.c %s: %d greetings with a zero-signing nonce, none sent unsigned\n",
                  nats_GetVersion(), atomic_load(&m.zero_greetings));
    jsd_conn_close(op.c);
    nonce_stop(&m);
}

/* Log lines that hold both needles (needle2 may be NULL) at level or above:
 * counted, the last one kept. The log callback's user pointer. */
typedef struct line_catch {
    pthread_mutex_t lk;
    jsd_log_level level;
    const char *needle, *needle2;
    int n;
    char last[1024];
} line_catch;

static void catch_lines(jsd_log_level level, const char *component, const char *line, void *user)
{
    line_catch *lc = user;
    (void)component;
    if (level < lc->level || !strstr(line, lc->needle) ||
        (lc->needle2 && !strstr(line, lc->needle2)))
        return;
    pthread_mutex_lock(&lc->lk);
    lc->n++;
    jsd__strlcpy(lc->last, line, sizeof(lc->last));
    pthread_mutex_unlock(&lc->lk);
}

static int lines_caught(line_catch *lc)
{
    pthread_mutex_lock(&lc->lk);
    int n = lc->n;
    pthread_mutex_unlock(&lc->lk);
    return n;
}

/* A bare NKey seed file replaced under a running connection by another
 * user's seed: nats.c 3.4.1 announces the public key it was given at open at
 * every reconnection, so a CONNECT signed with the new seed could only be
 * refused, and two refusals in a row would close the connection for good.
 * Instead each attempt fails before its CONNECT (the fake server refuses
 * nothing), the warning says why once, and the connection comes back when
 * the seed it opened with is back. */
static void a_seed_rotated_under_the_connection_sends_no_connect_it_cannot_win(void **state)
{
    (void)state;
    nonce_server m;
    char url[64], seed_path[512], seed_a[128], seed_b[64];
    unsigned char raw[32];
    snprintf(seed_path, sizeof(seed_path), "%s/rotated-user.nk", jsd_test_dir());
    int port = nonce_start(&m, seed_path);
    snprintf(url, sizeof(url), "nats://127.0.0.1:%d", port);
    file_text(seed_path, seed_a, sizeof(seed_a));
    jsd_conn_opts o;
    opts_for(&o, url);
    o.nkey_seed_file = seed_path;
    o.require_jetstream = 0; /* the fake has no JetStream */
    jsd_conn *c = NULL;
    jsd_error e;
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    ASSERT_EQ(atomic_load(&m.signed_connects), 1);

    /* another user's seed in the file's place, then a reconnection */
    new_user_seed(raw, seed_b, sizeof(seed_b));
    put_text(seed_path, seed_b);
    static line_catch rotated = {.lk = PTHREAD_MUTEX_INITIALIZER,
                                 .level = JSD_LOG_WARN,
                                 .needle = "now holds another user key"};
    jsd_log_configure(JSD_LOG_WARN, JSD_LOG_TEXT, catch_lines, &rotated);
    int greeted = atomic_load(&m.greetings);
    atomic_store(&m.kick, 1);
    ASSERT_WAIT(!jsd_conn_is_connected(c), 5000);
    ASSERT_WAIT(lines_caught(&rotated) >= 1 && atomic_load(&m.greetings) >= greeted + 3, 10000);
    ASSERT_EQ(atomic_load(&m.refused), 0);
    ASSERT_EQ(atomic_load(&m.signed_connects), 1);
    ASSERT_EQ(lines_caught(&rotated), 1); /* once, however many attempts */
    pthread_mutex_lock(&rotated.lk);
    ASSERT_CONTAINS(rotated.last, seed_path);
    ASSERT_CONTAINS(rotated.last, "restarted");
    assert_no_key_material(rotated.last, seed_path);
    pthread_mutex_unlock(&rotated.lk);

    /* the seed it opened with is back: the next attempt connects */
    put_text(seed_path, seed_a);
    ASSERT_WAIT(jsd_conn_is_connected(c), 10000);
    ASSERT_EQ(atomic_load(&m.signed_connects), 2);
    ASSERT_EQ(atomic_load(&m.refused), 0);
    jsd_log_configure(JSD_LOG_WARN, JSD_LOG_TEXT, NULL, NULL);
    jsd_conn_close(c);
    nonce_stop(&m);
}

/* A server that comes up while the start-up budget lasts is connected to:
 * the open keeps retrying (seen in its DEBUG log) until the restart. */
static void startup_waits_for_a_server_that_comes_up(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    opener op;
    pthread_t th;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    ASSERT_EQ(jsd_fx_nats_stop(&fx), 0);
    static line_catch retries = {.lk = PTHREAD_MUTEX_INITIALIZER,
                                 .level = JSD_LOG_DEBUG,
                                 .needle = "connect attempt",
                                 .needle2 = "retrying"};
    jsd_log_configure(JSD_LOG_DEBUG, JSD_LOG_TEXT, catch_lines, &retries);
    memset(&op, 0, sizeof(op));
    opts_for(&op.o, fx.url);
    op.o.startup_budget_ms = 60000;
    ASSERT_EQ(pthread_create(&th, NULL, open_thread, &op), 0);
    ASSERT_WAIT(lines_caught(&retries) >= 2, 30000);
    ASSERT_EQ(jsd_fx_nats_restart(&fx), 0);
    ASSERT_EQ(pthread_join(th, NULL), 0);
    jsd_log_configure(JSD_LOG_WARN, JSD_LOG_TEXT, NULL, NULL);
    ASSERT_OK_E(op.st, op.e.msg);
    ASSERT_TRUE(jsd_conn_is_connected(op.c));
    ASSERT_EQ(jsd_conn_reconnects(op.c), 0);
    jsd_conn_close(op.c);
}

/* A server that greets with INFO and then never answers (hung or paused
 * right after the greeting) must not hold the start-up past its budget: the
 * open runs on a thread and is waited for with a deadline, so a connect that
 * spins fails this test instead of hanging it. */
static void silent_server_after_info_fails_within_the_budget(void **state)
{
    (void)state;
    mute_server m;
    opener op;
    pthread_t th;
    char url[64];
    int port = mute_start(&m, jsd_fx_url_port(jsd_fx_shared_nats_url()));
    snprintf(url, sizeof(url), "nats://127.0.0.1:%d", port);
    memset(&op, 0, sizeof(op));
    opts_for(&op.o, url);
    op.o.startup_budget_ms = 1500;
    op.o.connect_timeout_ms = 500;
    int64_t t0 = jsd_test_mono_ms();
    ASSERT_EQ(pthread_create(&th, NULL, open_thread, &op), 0);
    if (!WAIT_UNTIL(atomic_load(&op.done), 1500 + 500 + MARGIN_MS))
        fail_msg("jsd_conn_open against a server that sent INFO and went silent has not "
                 "returned after %d ms (start-up budget 1500 ms)",
                 1500 + 500 + MARGIN_MS);
    int64_t dt = jsd_test_mono_ms() - t0;
    ASSERT_EQ(pthread_join(th, NULL), 0);
    print_message("%s after %lld ms: %s\n", jsd_status_name(op.st), (long long)dt, op.e.msg);
    ASSERT_STATUS(op.st, JSD_ERR_CONNECT);
    ASSERT_TRUE(op.c == NULL);
    ASSERT_CONTAINS(op.e.msg, "start-up budget of 1500 ms");
    ASSERT_CONTAINS(op.e.msg, "did not answer");
    /* the client really was greeted (the scenario happened), more than once:
     * the silence is retried like an unreachable server */
    ASSERT_TRUE(atomic_load(&m.greeted) >= 2);
    mute_stop(&m);
}

/* With a silent server listed first and a healthy one after it, the open
 * connects to the healthy one (nats.c is handed the answering URL first) and
 * does not spin on the silent one. */
static void silent_server_is_passed_over_for_one_that_answers(void **state)
{
    (void)state;
    mute_server m;
    opener op;
    pthread_t th;
    char urls[160], got[256];
    const char *shared = jsd_fx_shared_nats_url();
    int port = mute_start(&m, jsd_fx_url_port(shared));
    snprintf(urls, sizeof(urls), "nats://127.0.0.1:%d,%s", port, shared);
    memset(&op, 0, sizeof(op));
    opts_for(&op.o, urls);
    op.o.startup_budget_ms = 1500;
    op.o.connect_timeout_ms = 500;
    ASSERT_EQ(pthread_create(&th, NULL, open_thread, &op), 0);
    if (!WAIT_UNTIL(atomic_load(&op.done), 1500 + 500 + MARGIN_MS))
        fail_msg("jsd_conn_open with a silent server listed first has not returned");
    ASSERT_EQ(pthread_join(th, NULL), 0);
    ASSERT_OK_E(op.st, op.e.msg);
    ASSERT_TRUE(atomic_load(&m.greeted) >= 1);
    ASSERT_EQ(natsConnection_GetConnectedUrl(jsd__conn_nats(op.c), got, sizeof(got)), NATS_OK);
    ASSERT_STREQ(got, shared);
    jsd_conn_close(op.c);
    mute_stop(&m);
}

/* With bounded reconnection the connection gives up after the attempts and
 * stays usable as a handle (reports disconnected, closes cleanly). */
static void bounded_reconnect_gives_up_cleanly(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_conn_opts o;
    jsd_conn *c = NULL;
    jsd_error e;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    opts_for(&o, fx.url);
    o.reconnect_attempts = 2;
    o.reconnect_wait_ms = 20;
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    ASSERT_EQ(jsd_fx_nats_kill(&fx), 0);
    ASSERT_WAIT(natsConnection_IsClosed(jsd__conn_nats(c)), 20000);
    ASSERT_EQ(jsd_conn_is_connected(c), 0);
    ASSERT_EQ(jsd_conn_reconnects(c), 0);
    ASSERT_TRUE(jsd_conn_publish_core(c, "after.close", "x", 1) != JSD_OK);
    ASSERT_CONTAINS(jsd_conn_errmsg(c), "core publish to \"after.close\"");
    jsd_conn_close(c);
}

/* ---- round trip ----------------------------------------------------------------- */

static void round_trip_through_the_shared_server(void **state)
{
    (void)state;
    jsd_conn_opts o;
    jsd_conn *c = NULL;
    jsd_error e;
    jsStreamConfig cfg;
    jsErrCode jerr = 0;
    jsPubAck *ack = NULL;
    natsMsg *m = NULL;
    char stream[64], subject[96];

    opts_for(&o, jsd_fx_shared_nats_url());
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    ASSERT_EQ(jsd__conn_request_timeout_ms(c), 5000);
    snprintf(stream, sizeof(stream), "%s", jsd_test_unique("CONNRT"));
    snprintf(subject, sizeof(subject), "connrt.%s", stream);
    const char *subjects[] = {subject};
    jsStreamConfig_Init(&cfg);
    cfg.Name = stream;
    cfg.Subjects = subjects;
    cfg.SubjectsLen = 1;
    cfg.Storage = js_FileStorage;
    ASSERT_EQ(js_AddStream(NULL, jsd__conn_js(c), &cfg, NULL, &jerr), NATS_OK);
    ASSERT_EQ(js_Publish(&ack, jsd__conn_js(c), subject, "hello", 5, NULL, &jerr), NATS_OK);
    ASSERT_EQ(ack->Sequence, 1);
    ASSERT_STREQ(ack->Stream, stream);
    jsPubAck_Destroy(ack);
    ASSERT_EQ(js_GetLastMsg(&m, jsd__conn_js(c), stream, subject, NULL, &jerr), NATS_OK);
    ASSERT_EQ(natsMsg_GetDataLength(m), 5);
    ASSERT_TRUE(memcmp(natsMsg_GetData(m), "hello", 5) == 0);
    natsMsg_Destroy(m);

    /* a JetStream failure maps to a status with the API error code */
    natsStatus s =
        js_GetLastMsg(&m, jsd__conn_js(c), "NO_SUCH_STREAM_CONNRT", subject, NULL, &jerr);
    ASSERT_NE(s, NATS_OK);
    ASSERT_EQ(jsd__err_nats(&e, s, jerr, "get last message"), JSD_ERR_NOT_FOUND);
    ASSERT_EQ(e.js_err_code, JSStreamNotFoundErr);
    ASSERT_CONTAINS(e.msg, "get last message");

    ASSERT_EQ(js_DeleteStream(jsd__conn_js(c), stream, NULL, &jerr), NATS_OK);
    jsd_conn_close(c);
}

/* ---- reconnect --------------------------------------------------------------------- */

static void reconnects_after_the_server_comes_back(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_conn_opts o;
    jsd_conn *c = NULL;
    jsd_error e;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    opts_for(&o, fx.url);
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    ASSERT_TRUE(jsd_conn_is_connected(c));
    ASSERT_EQ(jsd_conn_reconnects(c), 0);

    ASSERT_EQ(jsd_fx_nats_kill(&fx), 0);
    ASSERT_WAIT(!jsd_conn_is_connected(c), 10000);
    /* an outage is not an error for the process: the handle stays usable */
    ASSERT_EQ(jsd_conn_reconnects(c), 0);
    ASSERT_EQ(jsd_fx_nats_restart(&fx), 0);
    ASSERT_WAIT(jsd_conn_is_connected(c), 20000);
    ASSERT_EQ(jsd_conn_reconnects(c), 1);
    ASSERT_STREQ(jsd_conn_server_version(c), fx.version);

    /* and JetStream answers again */
    jsAccountInfo *ai = NULL;
    jsErrCode jerr = 0;
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = 5000;
    ASSERT_WAIT(js_GetAccountInfo(&ai, jsd__conn_js(c), &jo, &jerr) == NATS_OK, 20000);
    jsAccountInfo_Destroy(ai);
    jsd_conn_close(c);
}

/* A hung server (SIGSTOP) is noticed through unanswered PINGs, and the
 * connection comes back once it resumes. */
static void hung_server_is_noticed_and_recovered(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_conn_opts o;
    jsd_conn *c = NULL;
    jsd_error e;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    opts_for(&o, fx.url);
    o.ping_interval_ms = 200;
    o.connect_timeout_ms = 500;
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    ASSERT_EQ(jsd_fx_nats_pause(&fx), 0);
    ASSERT_WAIT(!jsd_conn_is_connected(c), 20000);
    ASSERT_EQ(jsd_fx_nats_resume(&fx), 0);
    ASSERT_WAIT(jsd_conn_is_connected(c), 30000);
    ASSERT_EQ(jsd_conn_reconnects(c), 1);
    jsd_conn_close(c);
}

/* Several URLs: connected to a 3-node cluster, the loss of the node in use
 * moves the connection to another node, and JetStream keeps answering. */
static void cluster_failover_to_another_url(void **state)
{
    (void)state;
    jsd_fx_cluster cl;
    jsd_conn_opts o;
    jsd_conn *c = NULL;
    jsd_error e;
    char url[256], after[256];
    int victim = -1;
    ASSERT_EQ(jsd_fx_cluster_start(&cl), 0);
    opts_for(&o, cl.urls);
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    ASSERT_STREQ(jsd_conn_servers_redacted(c), cl.urls);
    ASSERT_EQ(natsConnection_GetConnectedUrl(jsd__conn_nats(c), url, sizeof(url)), NATS_OK);
    for (int i = 0; i < 3; i++) {
        char port[16];
        snprintf(port, sizeof(port), ":%d", cl.node[i].port);
        if (strstr(url, port))
            victim = i;
    }
    ASSERT_TRUE(victim >= 0);
    ASSERT_EQ(jsd_fx_nats_kill(&cl.node[victim]), 0);
    /* >= 1: under load a fresh connection may itself bounce once more */
    ASSERT_WAIT(jsd_conn_reconnects(c) >= 1 && jsd_conn_is_connected(c), 60000);
    ASSERT_EQ(natsConnection_GetConnectedUrl(jsd__conn_nats(c), after, sizeof(after)), NATS_OK);
    ASSERT_TRUE(strcmp(url, after) != 0);

    jsAccountInfo *ai = NULL;
    jsErrCode jerr = 0;
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = 5000;
    /* the cluster may need a new meta leader first */
    ASSERT_WAIT(js_GetAccountInfo(&ai, jsd__conn_js(c), &jo, &jerr) == NATS_OK, 90000);
    jsAccountInfo_Destroy(ai);
    jsd_conn_close(c);
    ASSERT_EQ(jsd_fx_cluster_stop(&cl), 0);
}

/* ---- asynchronous errors --------------------------------------------------------------- */

typedef struct seen {
    pthread_mutex_t lk;
    int count;
    natsStatus last;
    char text[256];
} seen;

static void record_error(natsStatus s, const char *text, void *user)
{
    seen *w = user;
    pthread_mutex_lock(&w->lk);
    w->count++;
    w->last = s;
    snprintf(w->text, sizeof(w->text), "%s", text);
    pthread_mutex_unlock(&w->lk);
}

static int seen_count(seen *w)
{
    pthread_mutex_lock(&w->lk);
    int n = w->count;
    pthread_mutex_unlock(&w->lk);
    return n;
}

static void async_errors_reach_every_listener(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_conn_opts o;
    jsd_conn *c = NULL;
    jsd_error e;
    seen a = {.lk = PTHREAD_MUTEX_INITIALIZER}, b = {.lk = PTHREAD_MUTEX_INITIALIZER},
         gone = {.lk = PTHREAD_MUTEX_INITIALIZER};
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_USERPASS, &fx), 0);
    opts_for(&o, fx.url);
    o.user = fx.limited_user;
    o.password = fx.limited_password;
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    int ha = jsd__conn_add_error_listener(c, record_error, &a);
    int hb = jsd__conn_add_error_listener(c, record_error, &b);
    int hg = jsd__conn_add_error_listener(c, record_error, &gone);
    ASSERT_TRUE(ha >= 0 && hb >= 0 && hg >= 0 && ha != hb && hb != hg);
    jsd__conn_remove_error_listener(c, hg);

    ASSERT_OK(jsd_conn_publish_core(c, "denied.x", "x", 1));
    natsConnection_Flush(jsd__conn_nats(c));
    ASSERT_WAIT(seen_count(&a) >= 1 && seen_count(&b) >= 1, 10000);
    pthread_mutex_lock(&a.lk);
    ASSERT_CONTAINS(a.text, "Permissions Violation");
    ASSERT_CONTAINS(a.text, "denied.x");
    pthread_mutex_unlock(&a.lk);
    ASSERT_EQ(seen_count(&gone), 0);
    jsd__conn_remove_error_listener(c, ha);
    jsd__conn_remove_error_listener(c, hb);
    jsd__conn_remove_error_listener(c, -1);
    jsd__conn_remove_error_listener(c, 9999);
    ASSERT_EQ(jsd__conn_add_error_listener(c, NULL, NULL), -1);
    jsd_conn_close(c);
}

/* ---- secrets never leak ---------------------------------------------------------------- */

typedef struct capture {
    pthread_mutex_t lk;
    char buf[256 * 1024];
    size_t len;
} capture;

static capture logs = {.lk = PTHREAD_MUTEX_INITIALIZER};

static void capture_line(const char *s)
{
    pthread_mutex_lock(&logs.lk);
    size_t n = strlen(s);
    if (logs.len + n + 2 < sizeof(logs.buf)) {
        memcpy(logs.buf + logs.len, s, n);
        logs.len += n;
        logs.buf[logs.len++] = '\n';
        logs.buf[logs.len] = '\0';
    }
    pthread_mutex_unlock(&logs.lk);
}

static void log_sink(jsd_log_level level, const char *component, const char *line, void *user)
{
    (void)level;
    (void)component;
    (void)user;
    capture_line(line);
}

static void assert_no_secret(const char *where, const char *text, const char *const *secrets,
                             size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (secrets[i] && secrets[i][0] && strstr(text, secrets[i]))
            fail_msg("secret #%zu appears in %s", i, where);
}

/* Every failure of CONN-5 and CONN-2, with credentials in options and URLs;
 * each error text goes into the capture. */
static void run_failure_cases(const jsd_fx_nats *tlsp, const jsd_fx_nats *upp,
                              const jsd_fx_nats *nojsp, int port)
{
    const jsd_fx_nats tls = *tlsp, up = *upp, nojs = *nojsp;
    jsd_conn_opts o;
    jsd_error e;
    jsd_conn *c = NULL;
    char url[600];

    /* 1 wrong token, as an option and inside the URL */
    opts_for(&o, tls.url);
    o.token = BAD_TOKEN;
    o.tls_ca_file = tls.ca_file;
    expect_open_fails(&o, JSD_ERR_AUTH, &e);
    capture_line(e.msg);
    snprintf(url, sizeof(url), "tls://%s@127.0.0.1:%d", BAD_TOKEN, tls.port);
    opts_for(&o, url);
    o.tls_ca_file = tls.ca_file;
    expect_open_fails(&o, JSD_ERR_AUTH, &e);
    capture_line(e.msg);
    /* 2 wrong password, as options and inside the URL */
    opts_for(&o, up.url);
    o.user = up.user;
    o.password = BAD_PASSWORD;
    expect_open_fails(&o, JSD_ERR_AUTH, &e);
    capture_line(e.msg);
    snprintf(url, sizeof(url), "nats://%s:%s@127.0.0.1:%d", up.user, BAD_PASSWORD, up.port);
    opts_for(&o, url);
    expect_open_fails(&o, JSD_ERR_AUTH, &e);
    capture_line(e.msg);
    /* 3 unrelated CA, with the right token */
    opts_for(&o, tls.url);
    o.token = tls.token;
    o.tls_ca_file = tls.other_ca_file;
    expect_open_fails(&o, JSD_ERR_TLS, &e);
    capture_line(e.msg);
    /* 4 host-name mismatch, token in the URL */
    snprintf(url, sizeof(url), "tls://%s@127.0.0.1:%d", tls.token, tls.port);
    opts_for(&o, url);
    o.tls_ca_file = tls.ca_file;
    o.tls_hostname = tls.wrong_host;
    expect_open_fails(&o, JSD_ERR_TLS, &e);
    capture_line(e.msg);
    /* 5 TLS required against plaintext, with a password */
    opts_for(&o, up.url);
    o.user = up.user;
    o.password = up.password;
    o.tls_required = 1;
    expect_open_fails(&o, JSD_ERR_TLS, &e);
    capture_line(e.msg);
    /* 6 no JetStream, credentials in the URL */
    snprintf(url, sizeof(url), "nats://someone:%s@127.0.0.1:%d", BAD_PASSWORD, nojs.port);
    opts_for(&o, url);
    expect_open_fails(&o, JSD_ERR_NO_JETSTREAM, &e);
    capture_line(e.msg);
    ASSERT_CONTAINS(e.msg, "nats://***@127.0.0.1:");
    /* 7 unreachable, token in the URL and a bad one next to it */
    snprintf(url, sizeof(url), "nats://%s@127.0.0.1:%d,nats://u:%s@127.0.0.1:%d", BAD_TOKEN, port,
             BAD_PASSWORD, port);
    opts_for(&o, url);
    o.startup_budget_ms = 600;
    o.connect_timeout_ms = 200;
    expect_open_fails(&o, JSD_ERR_CONNECT, &e);
    capture_line(e.msg);
    /* 8 configuration refusals */
    opts_for(&o, url);
    o.token = BAD_TOKEN;
    expect_open_fails(&o, JSD_ERR_CONFIG, &e);
    capture_line(e.msg);
    snprintf(url, sizeof(url), "nats://u:%s@127.0.0.1:notaport", BAD_PASSWORD);
    opts_for(&o, url);
    expect_open_fails(&o, JSD_ERR_CONFIG, &e);
    capture_line(e.msg);
    /* 9 a working connection's texts: status output, errmsg */
    snprintf(url, sizeof(url), "nats://%s:%s@127.0.0.1:%d", up.user, up.password, up.port);
    opts_for(&o, url);
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    capture_line(jsd_conn_servers_redacted(c));
    capture_line(jsd_conn_server_version(c));
    jsd_conn_publish_core(c, "", "x", 1);
    capture_line(jsd_conn_errmsg(c));
    jsd_conn_close(c);
}

static void failures_never_reveal_secrets(void **state)
{
    (void)state;
    jsd_fx_nats tls, up, nojs;
    char errpath[600];
    int port = closed_port();

    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_TLS, &tls), 0);
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_USERPASS, &up), 0);
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_NOJS, &nojs), 0);
    const char *secrets[] = {BAD_TOKEN, BAD_PASSWORD, tls.token, up.password, up.limited_password};

    /* capture: every log line at DEBUG, and fd 2 into a file */
    jsd_log_configure(JSD_LOG_DEBUG, JSD_LOG_TEXT, log_sink, NULL);
    snprintf(errpath, sizeof(errpath), "%s/stderr.txt", jsd_test_dir());
    fflush(stderr);
    int saved = dup(2);
    int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_TRUE(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);

    /* once with the capturing sink, once with the default sink (stderr) */
    run_failure_cases(&tls, &up, &nojs, port);
    jsd_log_configure(JSD_LOG_DEBUG, JSD_LOG_TEXT, NULL, NULL);
    run_failure_cases(&tls, &up, &nojs, port);

    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    jsd_log_configure(JSD_LOG_WARN, JSD_LOG_TEXT, NULL, NULL);

    /* read back what went to stderr */
    static char errbuf[256 * 1024];
    FILE *f = fopen(errpath, "r");
    ASSERT_TRUE(f != NULL);
    size_t n = fread(errbuf, 1, sizeof(errbuf) - 1, f);
    errbuf[n] = '\0';
    fclose(f);

    pthread_mutex_lock(&logs.lk);
    print_message("captured %zu bytes of errors and logs, %zu bytes of stderr\n", logs.len, n);
    /* the capture works: the errors are in it */
    ASSERT_CONTAINS(logs.buf, "authorization failed");
    ASSERT_CONTAINS(logs.buf, "does not match expected host name");
    ASSERT_CONTAINS(logs.buf, "nats://***@127.0.0.1:");
    assert_no_secret("error texts and logs", logs.buf, secrets, JSD_ARRAY_LEN(secrets));
    pthread_mutex_unlock(&logs.lk);
    /* the default sink wrote the DEBUG lines of the second round there */
    ASSERT_CONTAINS(errbuf, "conn:");
    assert_no_secret("stderr", errbuf, secrets, JSD_ARRAY_LEN(secrets));
}

JSD_TEST_MAIN(cmocka_unit_test(tls_with_token_connects),
              cmocka_unit_test(shutdown_after_a_tls_connection_waits_for_the_client),
              cmocka_unit_test(client_certificate_is_required_and_checked),
              cmocka_unit_test(nkey_seed_logs_in_and_an_unknown_seed_is_refused),
              cmocka_unit_test(a_seed_rotated_under_the_connection_sends_no_connect_it_cannot_win),
              cmocka_unit_test(creds_file_logs_in_in_operator_mode),
              cmocka_unit_test(wrong_token_is_an_authorization_error),
              cmocka_unit_test(wrong_password_is_an_authorization_error),
              cmocka_unit_test(unrelated_ca_is_rejected),
              cmocka_unit_test(host_name_mismatch_is_named),
              cmocka_unit_test(tls_required_refuses_a_plaintext_server),
              cmocka_unit_test(no_jetstream_fails_loudly_without_fallback),
              cmocka_unit_test(unreachable_server_fails_within_the_budget),
              cmocka_unit_test(startup_waits_for_a_server_that_comes_up),
              cmocka_unit_test(silent_server_after_info_fails_within_the_budget),
              cmocka_unit_test(unsendable_signatures_are_never_sent),
              cmocka_unit_test(silent_server_is_passed_over_for_one_that_answers),
              cmocka_unit_test(bounded_reconnect_gives_up_cleanly),
              cmocka_unit_test(round_trip_through_the_shared_server),
              cmocka_unit_test(reconnects_after_the_server_comes_back),
              cmocka_unit_test(hung_server_is_noticed_and_recovered),
              cmocka_unit_test(cluster_failover_to_another_url),
              cmocka_unit_test(async_errors_reach_every_listener),
              cmocka_unit_test(failures_never_reveal_secrets))
