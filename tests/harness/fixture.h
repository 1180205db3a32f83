/*
 * Real-service fixtures for tests (FIX-1): nats-server variants, a 3-node
 * cluster and PostgreSQL databases, all on loopback, in folders under
 * JSD_TEST_TMP, driven through scripts/fixture.sh.
 *
 * Shared servers: scripts/run-tests.sh starts one plain JetStream server and
 * one PostgreSQL for the whole run (or uses JSD_TEST_NATS_URL /
 * JSD_TEST_PG_URL when the user set them) and exports their URLs. Tests that
 * only publish/consume use them with unique stream names. A test that needs a
 * variant, or that restarts, pauses or kills a server, starts its own with
 * jsd_fx_nats_start(): acting on a server it did not start is never allowed,
 * and every control call checks the recorded pid and port first.
 *
 * Everything a test starts is stopped at exit (atexit) and, should the test
 * be SIGKILLed, by the runner's sweep of JSD_TEST_TMP.
 */
#ifndef JSD_FIXTURE_H
#define JSD_FIXTURE_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include <nats/nats.h>

typedef enum jsd_fx_variant {
    JSD_FX_PLAIN = 0, /* JetStream, file storage */
    JSD_FX_TLS,       /* JetStream, TLS required, token auth */
    JSD_FX_USERPASS,  /* JetStream, users with per-user publish permissions */
    JSD_FX_NOJS,      /* core NATS only */
    JSD_FX_MTLS,      /* JetStream, TLS with client certificates required */
    JSD_FX_NKEY,      /* JetStream, one NKey user */
    JSD_FX_OPERATOR   /* JetStream, operator mode: JWT users through .creds files */
} jsd_fx_variant;

typedef struct jsd_fx_nats {
    char dir[PATH_MAX]; /* fixture folder: config, store, logs, certs */
    char url[256];      /* nats://127.0.0.1:PORT (tls://... for TLS) */
    int port;
    pid_t pid;
    char version[32];  /* server version, e.g. "2.10.27" */
    bool fsync_always; /* sync_interval: always is on */

    /* JSD_FX_TLS */
    char token[80];               /* the server's auth token */
    char ca_file[PATH_MAX];       /* CA that signed the server certificate */
    char other_ca_file[PATH_MAX]; /* an unrelated CA */
    char wrong_host_url[256];     /* same server, reached under a name its cert lacks */
    /* The certificate's SAN is IP:127.0.0.1 and DNS:localhost. A client that
     * connects to wrong_host_url with wrong_host ("wronghost.invalid") as its
     * expected host name (natsOptions_SetExpectedHostname) must fail the
     * name check although the chain is trusted. */
    char wrong_host[64];
    char client_cert_file[PATH_MAX]; /* a client pair signed by ca_file (mTLS) */
    char client_key_file[PATH_MAX];

    /* JSD_FX_MTLS (also ca_file, client_cert_file, client_key_file): the
     * server requires a client certificate signed by ca_file; this pair is
     * signed by an unrelated CA. */
    char other_client_cert_file[PATH_MAX];
    char other_client_key_file[PATH_MAX];

    /* JSD_FX_NKEY: the user's seed file and public key; a valid user seed the
     * server does not know. */
    char nkey_seed_file[PATH_MAX];
    char nkey_public[64];
    char wrong_nkey_seed_file[PATH_MAX];

    /* JSD_FX_OPERATOR: a user of the server's one application account; a user
     * of an account the server does not know; the good user's JWT with
     * another user's seed. */
    char creds_file[PATH_MAX];
    char foreign_creds_file[PATH_MAX];
    char mismatched_creds_file[PATH_MAX];

    /* JSD_FX_USERPASS: "pub" may publish to everything; "limited" may not
     * publish to subjects under "denied.>"; both may use JetStream. */
    char user[32], password[80];
    char limited_user[32], limited_password[80];

    int monitor_port; /* HTTP monitoring port (/varz, /jsz, /healthz) */
} jsd_fx_nats;

/* Start a server of the given variant on a free loopback port. 0 on success;
 * on failure the test fails with the script's output. */
int jsd_fx_nats_start(jsd_fx_variant v, jsd_fx_nats *out);
/* SIGTERM and wait (graceful). */
int jsd_fx_nats_stop(jsd_fx_nats *fx);
/* SIGKILL and wait; the store stays for a restart. */
int jsd_fx_nats_kill(jsd_fx_nats *fx);
/* Start again on the same folder, store and port (after stop or kill). */
int jsd_fx_nats_restart(jsd_fx_nats *fx);
/* SIGSTOP / SIGCONT. A paused server is resumed at exit whatever happens. */
int jsd_fx_nats_pause(jsd_fx_nats *fx);
int jsd_fx_nats_resume(jsd_fx_nats *fx);
/* true if the recorded pid is alive and is the nats-server of this fixture. */
bool jsd_fx_nats_alive(const jsd_fx_nats *fx);

/* A 3-node JetStream cluster on loopback. */
typedef struct jsd_fx_cluster {
    jsd_fx_nats node[3];
    char urls[800]; /* the three client URLs, comma-separated */
} jsd_fx_cluster;
int jsd_fx_cluster_start(jsd_fx_cluster *out);
int jsd_fx_cluster_stop(jsd_fx_cluster *c);

/* URL of the run's shared JetStream server (JSD_TEST_NATS_URL). */
const char *jsd_fx_shared_nats_url(void);
/* The port of a URL that ends ":PORT" (a fixture's or the shared server's),
 * e.g. for jsd_fx_proxy_start; fails the test if it has none. */
int jsd_fx_url_port(const char *url);

/* A library connection to url that gives up after two reconnect attempts
 * 50 ms apart, so that nats.c closes it for good soon after its server goes
 * away; fails the test if it cannot open. */
struct jsd_conn *jsd_fx_conn_giving_up(const char *url);
/* A fresh, empty PostgreSQL database on the run's shared server
 * (JSD_TEST_PG_URL); dropped at exit. url receives its libpq URL. */
int jsd_fx_pg_database(char *url, size_t cap);
/* A fresh SQLite store URL ("sqlite:<test dir>/<name>.db"). */
void jsd_fx_sqlite_url(char *url, size_t cap);

/* A private PostgreSQL server (for tests that stop, kill or pause it); the
 * superuser "jsd" connects without a password over 127.0.0.1. */
typedef struct jsd_fx_pg {
    char dir[PATH_MAX];
    char url[256]; /* postgresql://jsd@127.0.0.1:PORT/postgres */
    int port;
    pid_t pid;
} jsd_fx_pg;
int jsd_fx_pg_start(jsd_fx_pg *out);
/* The same, with the given ALTER SYSTEM statements (NULL-terminated) in
 * force from its start (it is restarted after them). */
int jsd_fx_pg_start_with(jsd_fx_pg *out, const char *const *settings);
/* One statement on a server, outside any transaction; fails the test on an
 * error. */
int jsd_fx_pg_do(const char *url, const char *sql);
int jsd_fx_pg_stop(jsd_fx_pg *pg);
int jsd_fx_pg_kill(jsd_fx_pg *pg);
int jsd_fx_pg_restart(jsd_fx_pg *pg);
int jsd_fx_pg_pause(jsd_fx_pg *pg);
int jsd_fx_pg_resume(jsd_fx_pg *pg);
/* A fresh database on the given server (url as in jsd_fx_pg.url); dropped
 * at exit. */
int jsd_fx_pg_database_on(const char *server_url, char *url, size_t cap);

/* Read KEY from a fixture folder's fixture.env into buf; 0 if found. */
int jsd_fx_env(const char *dir, const char *key, char *buf, size_t cap);

/* Path to a built program: "jsdurable" -> $BUILD/jsdurable,
 * "faultproxy" -> $BUILD/tests/tools/faultproxy. */
const char *jsd_fx_bin(const char *name);

/* Create a file-storage stream capturing one subject on nc; fails the test
 * (with the JetStream error code) when the server refuses. */
void jsd_fx_add_stream(natsConnection *nc, const char *name, const char *subject);
/* Messages stored in a stream, read with a fresh stream info request;
 * UINT64_MAX when it cannot be read (JSD_FX_DEBUG=1 prints why). */
uint64_t jsd_fx_stream_msgs(natsConnection *nc, const char *name);

#endif
