/*
 * The fixtures themselves (FIX-1): each server variant answers as promised,
 * kill/restart keeps the port and the store, pause stalls clients and resume
 * frees them, stop leaves nothing behind, and a PostgreSQL database can be
 * created, written and read. Raw nats.c and libpq, so that the fixtures are
 * checked independently of the library.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <nats/nats.h>

#include "fixture.h"
#include "test.h"

typedef struct conn_args {
    const char *url;
    int64_t timeout_ms;
    const char *ca_file, *expected_host, *token, *user, *password;
    natsErrHandler on_error;
    void *closure;
} conn_args;

/* Deadlines grow under slow runners (valgrind sets JSD_TEST_TIMEOUT_SCALE):
 * a TLS handshake under valgrind takes seconds. */
static int timeout_scale(void)
{
    const char *e = getenv("JSD_TEST_TIMEOUT_SCALE");
    int v = e ? (int)strtol(e, NULL, 10) : 1;
    return v >= 1 && v <= 100 ? v : 1;
}

/* Connect with a short timeout and no reconnects; NULL and *st on failure. */
static natsConnection *connect_with(const conn_args *a, natsStatus *st)
{
    natsOptions *o = NULL;
    natsConnection *nc = NULL;
    char list[800];
    const char *servers[8];
    int n = 0;
    natsStatus s = natsOptions_Create(&o);
    /* nats.c 3.4.1's SetURL takes one URL; a comma-separated list goes to
     * SetServers */
    snprintf(list, sizeof(list), "%s", a->url);
    for (char *p = list; p && *p && n < 8;) {
        servers[n++] = p;
        p = strchr(p, ',');
        if (p)
            *p++ = '\0';
    }
    if (s == NATS_OK)
        s = natsOptions_SetServers(o, servers, n);
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(o, (a->timeout_ms ? a->timeout_ms : 2000) * timeout_scale());
    if (s == NATS_OK)
        s = natsOptions_SetAllowReconnect(o, false);
    if (s == NATS_OK && a->ca_file)
        s = natsOptions_LoadCATrustedCertificates(o, a->ca_file);
    if (s == NATS_OK && a->expected_host)
        s = natsOptions_SetExpectedHostname(o, a->expected_host);
    if (s == NATS_OK && a->token)
        s = natsOptions_SetToken(o, a->token);
    if (s == NATS_OK && a->user)
        s = natsOptions_SetUserInfo(o, a->user, a->password);
    if (s == NATS_OK && a->on_error)
        s = natsOptions_SetErrorHandler(o, a->on_error, a->closure);
    if (s == NATS_OK)
        s = natsConnection_Connect(&nc, o);
    natsOptions_Destroy(o);
    if (st)
        *st = s;
    return s == NATS_OK ? nc : NULL;
}

static natsConnection *connect_url(const char *url, int64_t timeout_ms, natsStatus *st)
{
    conn_args a = {.url = url, .timeout_ms = timeout_ms};
    return connect_with(&a, st);
}

static natsStatus account_info(natsConnection *nc, jsErrCode *jerr)
{
    jsCtx *js = NULL;
    jsAccountInfo *ai = NULL;
    natsStatus s = natsConnection_JetStream(&js, nc, NULL);
    if (s == NATS_OK)
        s = js_GetAccountInfo(&ai, js, NULL, jerr);
    jsAccountInfo_Destroy(ai);
    jsCtx_Destroy(js);
    return s;
}

/* true if something accepts TCP connections on 127.0.0.1:port */
static bool port_open(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return true;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rc = connect(fd, (struct sockaddr *)&a, sizeof(a));
    close(fd);
    return rc == 0;
}

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* 1 if fd has bytes to read within ms, 0 if not */
static int wait_readable(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int rc;
    while ((rc = poll(&p, 1, ms)) < 0 && errno == EINTR)
        ;
    return rc > 0 ? 1 : 0;
}

static bool pid_gone(pid_t pid)
{
    char path[64], st = '?';
    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true;
    if (fscanf(f, "%*d (%*[^)]) %c", &st) != 1)
        st = '?';
    fclose(f);
    return st == 'Z' || st == 'X';
}

static void publish(natsConnection *nc, const char *subject, const char *data)
{
    jsCtx *js = NULL;
    jsPubAck *pa = NULL;
    jsErrCode jerr = 0;
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    natsStatus s = js_Publish(&pa, js, subject, data, (int)strlen(data), NULL, &jerr);
    if (s != NATS_OK)
        fail_msg("js_Publish %s: %s (jsErrCode %d)", subject, natsStatus_GetText(s), (int)jerr);
    jsPubAck_Destroy(pa);
    jsCtx_Destroy(js);
}

static void plain_kill_restart_keeps_port_and_store(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    natsStatus s;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    ASSERT_TRUE(jsd_fx_nats_alive(&fx));
    ASSERT_TRUE(fx.port > 0);
    ASSERT_TRUE(fx.version[0] != '\0');
    if (!strncmp(fx.version, "2.10", 4))
        ASSERT_TRUE(fx.fsync_always);

    natsConnection *nc = connect_url(fx.url, 2000, &s);
    if (!nc)
        fail_msg("connect %s: %s", fx.url, natsStatus_GetText(s));
    jsErrCode jerr = 0;
    ASSERT_EQ(account_info(nc, &jerr), NATS_OK);
    jsd_fx_add_stream(nc, "FXKEEP", "fxkeep.>");
    publish(nc, "fxkeep.a", "one");
    natsConnection_Destroy(nc);

    int port = fx.port;
    pid_t old = fx.pid;
    ASSERT_EQ(jsd_fx_nats_kill(&fx), 0);
    ASSERT_TRUE(pid_gone(old));
    ASSERT_TRUE(!jsd_fx_nats_alive(&fx));
    ASSERT_TRUE(!port_open(port));

    ASSERT_EQ(jsd_fx_nats_restart(&fx), 0);
    ASSERT_EQ(fx.port, port);
    ASSERT_NE(fx.pid, old);
    ASSERT_TRUE(jsd_fx_nats_alive(&fx));
    nc = connect_url(fx.url, 2000, &s);
    if (!nc)
        fail_msg("connect after restart %s: %s", fx.url, natsStatus_GetText(s));
    ASSERT_EQ(jsd_fx_stream_msgs(nc, "FXKEEP"), 1);
    natsConnection_Destroy(nc);

    pid_t last = fx.pid;
    ASSERT_EQ(jsd_fx_nats_stop(&fx), 0);
    ASSERT_TRUE(pid_gone(last));
    ASSERT_TRUE(!port_open(port));
    ASSERT_TRUE(!jsd_fx_nats_alive(&fx));
}

static void plain_pause_stalls_resume_frees(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    natsStatus s;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    natsConnection *live = connect_url(fx.url, 2000, &s);
    ASSERT_TRUE(live != NULL);

    ASSERT_EQ(jsd_fx_nats_pause(&fx), 0);
    ASSERT_TRUE(jsd_fx_nats_alive(&fx)); /* stopped, not dead */
    /* The kernel still completes the TCP handshake, but the server never
     * sends its INFO: a client's connect times out. (A raw socket here: with
     * a short timeout under load, nats.c 3.4.1's connect can block for ever
     * on a server that accepted and stays silent.) */
    int fd = raw_connect(fx.port);
    ASSERT_TRUE(fd >= 0);
    ASSERT_EQ(wait_readable(fd, 500), 0);
    ASSERT_NE(natsConnection_FlushTimeout(live, 300), NATS_OK);

    ASSERT_EQ(jsd_fx_nats_resume(&fx), 0);
    /* the waiting client now gets its INFO */
    ASSERT_EQ(wait_readable(fd, 5000), 1);
    char info[8];
    ASSERT_EQ(read(fd, info, 5), 5);
    ASSERT_TRUE(!memcmp(info, "INFO ", 5));
    close(fd);
    natsConnection *nc = connect_url(fx.url, 5000, &s);
    if (!nc)
        fail_msg("connect after resume: %s", natsStatus_GetText(s));
    ASSERT_EQ(natsConnection_FlushTimeout(nc, 5000), NATS_OK);
    ASSERT_EQ(natsConnection_FlushTimeout(live, 5000), NATS_OK);
    natsConnection_Destroy(nc);
    natsConnection_Destroy(live);
}

/* A paused server is found and killed by the runner's sweep of its folder. */
static void sweep_kills_paused_fixture(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    char out[4096], cmd[PATH_MAX * 2];
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    ASSERT_EQ(jsd_fx_nats_pause(&fx), 0);
    const char *top = getenv("JSD_TOP");
    snprintf(cmd, sizeof(cmd), "bash '%s/scripts/fixture.sh' sweep '%s'", top ? top : ".",
             jsd_test_dir());
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    ASSERT_TRUE(pid_gone(fx.pid));
    ASSERT_TRUE(!port_open(fx.port));
}

/* One fixture per folder: pg-start and cluster-start refuse a folder that
 * holds a nats fixture, with a message that names it, and leave that fixture
 * as it was (its kind, its fixture.env, its server running), so that `stop`
 * still stops it. */
static void start_refuses_a_folder_of_another_fixture(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    char out[4096], cmd[PATH_MAX * 2], url[256];
    const char *top = getenv("JSD_TOP");
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    static const char *const starts[] = {"pg-start", "cluster-start"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(cmd, sizeof(cmd), "bash '%s/scripts/fixture.sh' %s '%s'", top ? top : ".",
                 starts[i], fx.dir);
        ASSERT_TRUE(jsd_test_run(cmd, out, sizeof(out)) != 0);
        if (!strstr(out, "already holds a nats fixture"))
            fail_msg("%s into a nats fixture's folder said: %s", starts[i], out);
    }
    ASSERT_EQ(jsd_fx_env(fx.dir, "NATS_URL", url, sizeof(url)), 0);
    ASSERT_STREQ(url, fx.url);
    ASSERT_TRUE(jsd_fx_nats_alive(&fx));
    ASSERT_EQ(jsd_fx_nats_stop(&fx), 0);
    ASSERT_TRUE(pid_gone(fx.pid));
}

/* A program a case spawned (jsd_test_spawn) dies with the case's process,
 * so a case that fails while its relay or consumer runs leaves nothing
 * running: here a "case" is a forked child that spawns a sleep and exits. */
static void spawned_program_dies_with_its_case(void **state)
{
    (void)state;
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t kase = fork();
    ASSERT_TRUE(kase >= 0);
    if (kase == 0) {
        close(fds[0]);
        char log[PATH_MAX];
        snprintf(log, sizeof(log), "%s/spawned-sleep.log", jsd_test_dir());
        const char *argv[] = {"/bin/sleep", "120", NULL};
        pid_t child = jsd_test_spawn(argv, log, true, NULL);
        _exit(write(fds[1], &child, sizeof(child)) == (ssize_t)sizeof(child) ? 0 : 1);
    }
    close(fds[1]);
    pid_t child = 0;
    ASSERT_EQ(read(fds[0], &child, sizeof(child)), (ssize_t)sizeof(child));
    close(fds[0]);
    int st = 0;
    ASSERT_EQ(waitpid(kase, &st, 0), kase);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ASSERT_TRUE(child > 0);
    int64_t end = jsd_test_mono_ms() + 10000;
    while (!pid_gone(child) && jsd_test_mono_ms() < end)
        usleep(10000);
    bool gone = pid_gone(child);
    if (!gone)
        kill(child, SIGKILL);
    ASSERT_TRUE(gone);
}

static void pg_database_create_write_read(void **state)
{
    (void)state;
    char url[512];
    ASSERT_EQ(jsd_fx_pg_database(url, sizeof(url)), 0);
    ASSERT_CONTAINS(url, "/jsd_t_");
    PGconn *c = PQconnectdb(url);
    if (PQstatus(c) != CONNECTION_OK)
        fail_msg("connect %s: %s", url, PQerrorMessage(c));
    PGresult *r = PQexec(c, "CREATE TABLE t (k int primary key, v text);"
                            "INSERT INTO t VALUES (1, 'one'), (2, 'two')");
    ASSERT_EQ(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
    r = PQexec(c, "SELECT v FROM t WHERE k = 2");
    ASSERT_EQ(PQresultStatus(r), PGRES_TUPLES_OK);
    ASSERT_EQ(PQntuples(r), 1);
    ASSERT_STREQ(PQgetvalue(r, 0, 0), "two");
    PQclear(r);
    r = PQexec(c, "SHOW fsync");
    ASSERT_STREQ(PQgetvalue(r, 0, 0), "on");
    PQclear(r);
    PQfinish(c);

    /* a second database is a different, empty one */
    char url2[512];
    ASSERT_EQ(jsd_fx_pg_database(url2, sizeof(url2)), 0);
    ASSERT_TRUE(strcmp(url, url2) != 0);
    c = PQconnectdb(url2);
    ASSERT_EQ(PQstatus(c), CONNECTION_OK);
    r = PQexec(c, "SELECT count(*) FROM pg_tables WHERE tablename = 't'");
    ASSERT_STREQ(PQgetvalue(r, 0, 0), "0");
    PQclear(r);
    PQfinish(c);
}

static void pg_private_kill_restart(void **state)
{
    (void)state;
    jsd_fx_pg pg;
    char url[512];
    ASSERT_EQ(jsd_fx_pg_start(&pg), 0);
    ASSERT_EQ(jsd_fx_pg_database_on(pg.url, url, sizeof(url)), 0);
    PGconn *c = PQconnectdb(url);
    ASSERT_EQ(PQstatus(c), CONNECTION_OK);
    PQclear(PQexec(c, "CREATE TABLE t (k int); INSERT INTO t VALUES (7)"));
    PQfinish(c);
    int port = pg.port;
    ASSERT_EQ(jsd_fx_pg_kill(&pg), 0);
    ASSERT_TRUE(!port_open(port));
    ASSERT_EQ(jsd_fx_pg_restart(&pg), 0);
    ASSERT_EQ(pg.port, port);
    c = PQconnectdb(url);
    ASSERT_EQ(PQstatus(c), CONNECTION_OK);
    PGresult *r = PQexec(c, "SELECT k FROM t");
    ASSERT_STREQ(PQgetvalue(r, 0, 0), "7"); /* committed before the kill */
    PQclear(r);
    PQfinish(c);
}

static void tls_trusts_its_ca_only(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    natsStatus s;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_TLS, &fx), 0);
    ASSERT_CONTAINS(fx.url, "tls://127.0.0.1:");
    ASSERT_TRUE(fx.token[0] && fx.ca_file[0] && fx.other_ca_file[0] && fx.wrong_host[0]);

    conn_args good = {.url = fx.url, .ca_file = fx.ca_file, .token = fx.token};
    natsConnection *nc = connect_with(&good, &s);
    if (!nc)
        fail_msg("TLS connect with the right CA: %s", natsStatus_GetText(s));
    ASSERT_EQ(account_info(nc, NULL), NATS_OK);
    natsConnection_Destroy(nc);

    /* the right CA and the name the certificate carries */
    conn_args named = good;
    named.expected_host = "localhost";
    nc = connect_with(&named, &s);
    if (!nc)
        fail_msg("TLS connect expecting localhost: %s", natsStatus_GetText(s));
    natsConnection_Destroy(nc);

    conn_args other = good;
    other.ca_file = fx.other_ca_file;
    ASSERT_TRUE(connect_with(&other, &s) == NULL);
    ASSERT_NE(s, NATS_OK);

    conn_args wrong = good;
    wrong.url = fx.wrong_host_url;
    wrong.expected_host = fx.wrong_host;
    ASSERT_TRUE(connect_with(&wrong, &s) == NULL);
    ASSERT_NE(s, NATS_OK);

    conn_args notoken = good;
    notoken.token = NULL;
    ASSERT_TRUE(connect_with(&notoken, &s) == NULL);
    ASSERT_NE(s, NATS_OK);

    char plain[300];
    snprintf(plain, sizeof(plain), "nats://127.0.0.1:%d", fx.port);
    conn_args cleartext = {.url = plain, .token = fx.token};
    ASSERT_TRUE(connect_with(&cleartext, &s) == NULL);
}

static volatile int async_err;
static void record_err(natsConnection *nc, natsSubscription *sub, natsStatus err, void *closure)
{
    (void)nc, (void)sub, (void)closure;
    async_err = (int)err;
}

static void userpass_limited_user_cannot_publish_denied(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    natsStatus s;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_USERPASS, &fx), 0);
    ASSERT_STREQ(fx.user, "pub");
    ASSERT_STREQ(fx.limited_user, "limited");
    ASSERT_TRUE(strlen(fx.password) >= 16 && strlen(fx.limited_password) >= 16);

    conn_args bad = {.url = fx.url, .user = fx.user, .password = "wrong"};
    ASSERT_TRUE(connect_with(&bad, &s) == NULL);

    conn_args pa = {.url = fx.url, .user = fx.user, .password = fx.password};
    natsConnection *pub = connect_with(&pa, &s);
    if (!pub)
        fail_msg("connect as pub: %s", natsStatus_GetText(s));
    natsSubscription *sub = NULL;
    ASSERT_EQ(natsConnection_SubscribeSync(&sub, pub, "denied.>"), NATS_OK);
    ASSERT_EQ(natsConnection_FlushTimeout(pub, 2000), NATS_OK);

    async_err = 0;
    conn_args la = {.url = fx.url,
                    .user = fx.limited_user,
                    .password = fx.limited_password,
                    .on_error = record_err};
    natsConnection *lim = connect_with(&la, &s);
    if (!lim)
        fail_msg("connect as limited: %s", natsStatus_GetText(s));
    ASSERT_EQ(account_info(lim, NULL), NATS_OK); /* JetStream is allowed */
    ASSERT_EQ(natsConnection_PublishString(lim, "denied.x", "no"), NATS_OK);
    ASSERT_EQ(natsConnection_FlushTimeout(lim, 2000), NATS_OK);
    ASSERT_WAIT(async_err == NATS_NOT_PERMITTED, 5000);
    const char *last = NULL;
    natsConnection_GetLastError(lim, &last);
    ASSERT_CONTAINS(last, "Permissions Violation");

    /* pub may publish there; the subscriber sees pub's message, not limited's */
    ASSERT_EQ(natsConnection_PublishString(pub, "denied.y", "yes"), NATS_OK);
    natsMsg *m = NULL;
    ASSERT_EQ(natsSubscription_NextMsg(&m, sub, 2000), NATS_OK);
    ASSERT_STREQ(natsMsg_GetSubject(m), "denied.y");
    natsMsg_Destroy(m);
    natsSubscription_Destroy(sub);
    natsConnection_Destroy(lim);
    natsConnection_Destroy(pub);
}

static void nojs_has_no_jetstream(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    natsStatus s;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_NOJS, &fx), 0);
    natsConnection *nc = connect_url(fx.url, 2000, &s);
    ASSERT_TRUE(nc != NULL);
    jsErrCode jerr = 0;
    ASSERT_NE(account_info(nc, &jerr), NATS_OK);
    ASSERT_EQ(natsConnection_FlushTimeout(nc, 2000), NATS_OK); /* core NATS works */
    natsConnection_Destroy(nc);
}

static void cluster_r3_stream_survives_node_kill(void **state)
{
    (void)state;
    jsd_fx_cluster c;
    natsStatus s;
    ASSERT_EQ(jsd_fx_cluster_start(&c), 0);
    for (int i = 0; i < 3; i++)
        ASSERT_TRUE(jsd_fx_nats_alive(&c.node[i]));
    natsConnection *nc = connect_url(c.urls, 2000, &s);
    if (!nc)
        fail_msg("connect %s: %s", c.urls, natsStatus_GetText(s));

    jsCtx *js = NULL;
    jsStreamInfo *si = NULL;
    jsStreamConfig cfg;
    jsErrCode jerr = 0;
    const char *subjects[] = {"r3.>"};
    ASSERT_EQ(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    jsStreamConfig_Init(&cfg);
    cfg.Name = "R3";
    cfg.Subjects = subjects;
    cfg.SubjectsLen = 1;
    cfg.Replicas = 3;
    s = js_AddStream(&si, js, &cfg, NULL, &jerr);
    if (s != NATS_OK)
        fail_msg("R3 stream: %s (jsErrCode %d)", natsStatus_GetText(s), (int)jerr);
    ASSERT_EQ(si->Config->Replicas, 3);
    jsStreamInfo_Destroy(si);
    jsCtx_Destroy(js);
    publish(nc, "r3.a", "one");
    natsConnection_Destroy(nc);

    /* kill the second node; the others still serve the stream */
    int port = c.node[1].port;
    ASSERT_EQ(jsd_fx_nats_kill(&c.node[1]), 0);
    ASSERT_TRUE(!jsd_fx_nats_alive(&c.node[1]));
    nc = connect_url(c.node[0].url, 2000, &s);
    ASSERT_TRUE(nc != NULL);
    ASSERT_WAIT(jsd_fx_stream_msgs(nc, "R3") == 1, 30000); /* raft elections take 4-9 s */
    publish(nc, "r3.b", "two");
    natsConnection_Destroy(nc);

    ASSERT_EQ(jsd_fx_nats_restart(&c.node[1]), 0);
    ASSERT_EQ(c.node[1].port, port);
    nc = connect_url(c.node[1].url, 2000, &s);
    ASSERT_TRUE(nc != NULL);
    ASSERT_WAIT(jsd_fx_stream_msgs(nc, "R3") == 2, 30000);
    natsConnection_Destroy(nc);
    ASSERT_EQ(jsd_fx_cluster_stop(&c), 0);
    for (int i = 0; i < 3; i++)
        ASSERT_TRUE(!jsd_fx_nats_alive(&c.node[i]));
}

typedef struct resume_later {
    jsd_fx_nats *node[2];
    int after_ms;
} resume_later;

static void *resume_after(void *arg)
{
    resume_later *r = arg;
    jsd_test_sleep_ms(r->after_ms);
    for (int i = 0; i < 2; i++)
        jsd_fx_nats_resume(r->node[i]);
    return NULL;
}

/* A restarted cluster node that does not get current with the meta group in
 * its deadline (JSD_FX_NODE_DEADLINE, per start) is killed and started again,
 * up to three starts: nats-server 2.10 leaves such a node "not current with
 * the meta leader" for good now and then. Here its two peers are paused for
 * 4 s, longer than the first start's 3 s: that start fails, a later one
 * finds the meta group and the restart succeeds. */
static void cluster_node_not_current_is_started_again(void **state)
{
    (void)state;
    jsd_fx_cluster c;
    char log[PATH_MAX + 16];
    ASSERT_EQ(jsd_fx_cluster_start(&c), 0);
    snprintf(log, sizeof(log), "%s/nats.log", c.node[0].dir);
    ASSERT_EQ(jsd_test_file_lines(log, "Starting nats-server"), 1);
    ASSERT_EQ(jsd_fx_nats_kill(&c.node[0]), 0);
    ASSERT_EQ(jsd_fx_nats_pause(&c.node[1]), 0);
    ASSERT_EQ(jsd_fx_nats_pause(&c.node[2]), 0);

    resume_later r = {{&c.node[1], &c.node[2]}, 4000};
    pthread_t t;
    ASSERT_EQ(setenv("JSD_FX_NODE_DEADLINE", "3", 1), 0);
    ASSERT_EQ(pthread_create(&t, NULL, resume_after, &r), 0);
    int rc = jsd_fx_nats_restart(&c.node[0]);
    pthread_join(t, NULL);
    unsetenv("JSD_FX_NODE_DEADLINE");
    ASSERT_EQ(rc, 0);
    ASSERT_TRUE(jsd_fx_nats_alive(&c.node[0]));
    int starts = jsd_test_file_lines(log, "Starting nats-server");
    if (starts < 3)
        fail_msg("node n1 started %d time(s) in all; expected its first start and at least "
                 "two restarts",
                 starts);
    ASSERT_EQ(jsd_fx_cluster_stop(&c), 0);
}

JSD_TEST_MAIN(cmocka_unit_test(plain_kill_restart_keeps_port_and_store),
              cmocka_unit_test(plain_pause_stalls_resume_frees),
              cmocka_unit_test(sweep_kills_paused_fixture),
              cmocka_unit_test(start_refuses_a_folder_of_another_fixture),
              cmocka_unit_test(spawned_program_dies_with_its_case),
              cmocka_unit_test(pg_database_create_write_read),
              cmocka_unit_test(pg_private_kill_restart), cmocka_unit_test(tls_trusts_its_ca_only),
              cmocka_unit_test(userpass_limited_user_cannot_publish_denied),
              cmocka_unit_test(nojs_has_no_jetstream),
              cmocka_unit_test(cluster_r3_stream_survives_node_kill),
              cmocka_unit_test(cluster_node_not_current_is_started_again))
