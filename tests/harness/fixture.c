/*
 * The test side of the real-service fixtures (tests/harness/fixture.h): each
 * call runs scripts/fixture.sh on a fresh folder under jsd_test_dir(), reads
 * back the folder's fixture.env, and remembers what it started so that an
 * atexit handler can resume, stop and drop all of it. Only the process that
 * started a fixture cleans it up (a forked child's exit leaves it alone), and
 * every control call first checks that the recorded pid is alive and is the
 * program of that very folder.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <nats/nats.h>

#include "fixture.h"
#include "test.h"

#define FX_MAX 64

typedef enum { FX_NATS, FX_PG } fx_kind;

static struct {
    char dir[PATH_MAX];
    fx_kind kind;
} started[FX_MAX];
static int n_started;
static struct {
    char server[256];
    char name[64];
} databases[FX_MAX];
static int n_databases;
static pid_t owner;
static int fx_seq;

static void fx_cleanup(void);

static void fx_register_exit(void)
{
    if (owner == getpid())
        return;
    owner = getpid();
    n_started = 0;
    n_databases = 0;
    atexit(fx_cleanup);
}

static const char *fx_script(void)
{
    static char path[PATH_MAX];
    const char *top = getenv("JSD_TOP");
    if (top && *top)
        snprintf(path, sizeof(path), "%s/scripts/fixture.sh", top);
    else
        snprintf(path, sizeof(path), "scripts/fixture.sh");
    return path;
}

/* Run `fixture.sh VERB DIR [EXTRA]`; output in out. Returns the exit status. */
static int fx_run(const char *verb, const char *dir, const char *extra, char *out, size_t cap)
{
    char cmd[3 * PATH_MAX];
    int n = snprintf(cmd, sizeof(cmd), "bash '%s' %s '%s' %s", fx_script(), verb, dir,
                     extra ? extra : "");
    if (n < 0 || (size_t)n >= sizeof(cmd))
        return -1;
    return jsd_test_run(cmd, out, cap);
}

int jsd_fx_env(const char *dir, const char *key, char *buf, size_t cap)
{
    char path[PATH_MAX + 16], line[1024];
    size_t klen = strlen(key);
    snprintf(path, sizeof(path), "%s/fixture.env", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int rc = -1;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, key, klen) != 0 || line[klen] != '=')
            continue;
        char *v = line + klen + 1;
        v[strcspn(v, "\r\n")] = '\0';
        if (buf && cap)
            snprintf(buf, cap, "%s", v);
        rc = 0;
        break;
    }
    fclose(f);
    return rc;
}

static long fx_env_long(const char *dir, const char *key)
{
    char v[64];
    if (jsd_fx_env(dir, key, v, sizeof(v)) != 0)
        return -1;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end)
        return -1;
    return x;
}

static void fx_new_dir(const char *what, char *dir, size_t cap)
{
    snprintf(dir, cap, "%s/%s-%d", jsd_test_dir(), what, ++fx_seq);
}

static void fx_remember(const char *dir, fx_kind kind)
{
    fx_register_exit();
    for (int i = 0; i < n_started; i++)
        if (!strcmp(started[i].dir, dir))
            return;
    if (n_started < FX_MAX) {
        snprintf(started[n_started].dir, sizeof(started[0].dir), "%s", dir);
        started[n_started].kind = kind;
        n_started++;
    }
}

/* true if pid is alive (not a zombie), its program is `exe` and its command
 * line contains `needle`. */
static bool fx_pid_is(pid_t pid, const char *exe, const char *needle)
{
    char path[64], buf[PATH_MAX];
    if (pid <= 0)
        return false;
    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    char state = '?';
    if (fscanf(f, "%*d (%*[^)]) %c", &state) != 1)
        state = '?';
    fclose(f);
    if (state == 'Z' || state == 'X' || state == '?')
        return false;
    snprintf(path, sizeof(path), "/proc/%ld/exe", (long)pid);
    ssize_t n = readlink(path, buf, sizeof(buf) - 1);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    char *del = strstr(buf, " (deleted)");
    if (del)
        *del = '\0';
    const char *base = strrchr(buf, '/');
    base = base ? base + 1 : buf;
    if (strcmp(base, exe) != 0)
        return false;
    snprintf(path, sizeof(path), "/proc/%ld/cmdline", (long)pid);
    f = fopen(path, "r");
    if (!f)
        return false;
    size_t got = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    for (size_t i = 0; i < got; i++)
        if (buf[i] == '\0')
            buf[i] = ' ';
    buf[got] = '\0';
    return strstr(buf, needle) != NULL;
}

static void fx_load_nats(jsd_fx_nats *fx)
{
    const char *d = fx->dir;
    char v[64];
    jsd_fx_env(d, "NATS_URL", fx->url, sizeof(fx->url));
    fx->port = (int)fx_env_long(d, "NATS_PORT");
    fx->monitor_port = (int)fx_env_long(d, "NATS_MONITOR_PORT");
    fx->pid = (pid_t)fx_env_long(d, "NATS_PID");
    jsd_fx_env(d, "NATS_VERSION", fx->version, sizeof(fx->version));
    fx->fsync_always = jsd_fx_env(d, "NATS_FSYNC_ALWAYS", v, sizeof(v)) == 0 && !strcmp(v, "true");
    jsd_fx_env(d, "TOKEN", fx->token, sizeof(fx->token));
    jsd_fx_env(d, "CA_FILE", fx->ca_file, sizeof(fx->ca_file));
    jsd_fx_env(d, "OTHER_CA_FILE", fx->other_ca_file, sizeof(fx->other_ca_file));
    jsd_fx_env(d, "WRONG_HOST_URL", fx->wrong_host_url, sizeof(fx->wrong_host_url));
    jsd_fx_env(d, "WRONG_HOST", fx->wrong_host, sizeof(fx->wrong_host));
    jsd_fx_env(d, "CLIENT_CERT_FILE", fx->client_cert_file, sizeof(fx->client_cert_file));
    jsd_fx_env(d, "CLIENT_KEY_FILE", fx->client_key_file, sizeof(fx->client_key_file));
    jsd_fx_env(d, "USER", fx->user, sizeof(fx->user));
    jsd_fx_env(d, "PASSWORD", fx->password, sizeof(fx->password));
    jsd_fx_env(d, "LIMITED_USER", fx->limited_user, sizeof(fx->limited_user));
    jsd_fx_env(d, "LIMITED_PASSWORD", fx->limited_password, sizeof(fx->limited_password));
    jsd_fx_env(d, "OTHER_CLIENT_CERT_FILE", fx->other_client_cert_file,
               sizeof(fx->other_client_cert_file));
    jsd_fx_env(d, "OTHER_CLIENT_KEY_FILE", fx->other_client_key_file,
               sizeof(fx->other_client_key_file));
    jsd_fx_env(d, "NKEY_SEED_FILE", fx->nkey_seed_file, sizeof(fx->nkey_seed_file));
    jsd_fx_env(d, "NKEY_PUBLIC", fx->nkey_public, sizeof(fx->nkey_public));
    jsd_fx_env(d, "WRONG_NKEY_SEED_FILE", fx->wrong_nkey_seed_file,
               sizeof(fx->wrong_nkey_seed_file));
    jsd_fx_env(d, "CREDS_FILE", fx->creds_file, sizeof(fx->creds_file));
    jsd_fx_env(d, "FOREIGN_CREDS_FILE", fx->foreign_creds_file, sizeof(fx->foreign_creds_file));
    jsd_fx_env(d, "MISMATCHED_CREDS_FILE", fx->mismatched_creds_file,
               sizeof(fx->mismatched_creds_file));
}

int jsd_fx_nats_start(jsd_fx_variant v, jsd_fx_nats *out)
{
    static const char *names[] = {"plain", "tls", "userpass", "nojs", "mtls", "nkey", "operator"};
    char log[8192];
    if ((int)v < 0 || (int)v > JSD_FX_OPERATOR)
        fail_msg("jsd_fx_nats_start: unknown variant %d", (int)v);
    memset(out, 0, sizeof(*out));
    fx_new_dir("nats", out->dir, sizeof(out->dir));
    fx_remember(out->dir, FX_NATS);
    int rc = fx_run("nats-start", out->dir, names[v], log, sizeof(log));
    if (rc != 0) {
        fail_msg("fixture.sh nats-start %s %s failed (exit %d):\n%s", out->dir, names[v], rc, log);
        return -1;
    }
    fx_load_nats(out);
    if (!jsd_fx_nats_alive(out))
        fail_msg("nats fixture in %s started but pid %ld is not its server", out->dir,
                 (long)out->pid);
    return 0;
}

bool jsd_fx_nats_alive(const jsd_fx_nats *fx)
{
    char needle[PATH_MAX + 16];
    snprintf(needle, sizeof(needle), " %s/nats.conf", fx->dir);
    return fx_pid_is(fx->pid, "nats-server", needle);
}

/* verb on a running server: checks the pid first, then runs the script. */
static int fx_nats_control(jsd_fx_nats *fx, const char *verb)
{
    char log[4096];
    if (!jsd_fx_nats_alive(fx)) {
        fail_msg("fixture %s: pid %ld is not this fixture's running nats-server; refusing to %s",
                 fx->dir, (long)fx->pid, verb);
        return -1;
    }
    int rc = fx_run(verb, fx->dir, NULL, log, sizeof(log));
    if (rc != 0) {
        fail_msg("fixture.sh %s %s failed (exit %d):\n%s", verb, fx->dir, rc, log);
        return -1;
    }
    return 0;
}

int jsd_fx_nats_stop(jsd_fx_nats *fx)
{
    return fx_nats_control(fx, "stop");
}

int jsd_fx_nats_kill(jsd_fx_nats *fx)
{
    return fx_nats_control(fx, "kill");
}

int jsd_fx_nats_pause(jsd_fx_nats *fx)
{
    return fx_nats_control(fx, "pause");
}

int jsd_fx_nats_resume(jsd_fx_nats *fx)
{
    return fx_nats_control(fx, "resume");
}

int jsd_fx_nats_restart(jsd_fx_nats *fx)
{
    char log[8192];
    if (jsd_fx_nats_alive(fx)) {
        fail_msg("fixture %s is still running (pid %ld); stop or kill it before restart", fx->dir,
                 (long)fx->pid);
        return -1;
    }
    int rc = fx_run("restart", fx->dir, NULL, log, sizeof(log));
    if (rc != 0) {
        fail_msg("fixture.sh restart %s failed (exit %d):\n%s", fx->dir, rc, log);
        return -1;
    }
    /* a cluster node started more than once says so (fixture.sh restart_node) */
    if (strstr(log, "not healthy after"))
        print_message("fixture.sh restart %s:\n%s", fx->dir, log);
    fx_load_nats(fx);
    return 0;
}

/* The meta leader can be elected and its peers current while it still lacks
 * the peers' server info, and then placing a replicated stream fails with "no
 * suitable peers" (10005). Create and delete an R3 probe stream until that
 * works, so that a started cluster is usable at once. */
static int fx_cluster_probe(const jsd_fx_cluster *c, char *why, size_t cap)
{
    const char *servers[3] = {c->node[0].url, c->node[1].url, c->node[2].url};
    natsOptions *o = NULL;
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    natsStatus s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = natsOptions_SetServers(o, servers, 3);
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(o, 2000);
    if (s == NATS_OK)
        s = natsConnection_Connect(&nc, o);
    if (s == NATS_OK)
        s = natsConnection_JetStream(&js, nc, NULL);
    jsErrCode jerr = 0;
    /* Placement waits for the meta leader to see all three peers, which took
     * over 30 s on a loaded 2-core runner. */
    int64_t end = jsd_test_mono_ms() + 60000;
    while (s == NATS_OK) {
        jsStreamConfig cfg;
        jsStreamInfo *si = NULL;
        jsStreamConfig_Init(&cfg);
        cfg.Name = "JSD_FX_PROBE";
        cfg.Storage = js_MemoryStorage;
        cfg.Replicas = 3;
        jerr = 0;
        s = js_AddStream(&si, js, &cfg, NULL, &jerr);
        jsStreamInfo_Destroy(si);
        if (s == NATS_OK) {
            s = js_DeleteStream(js, "JSD_FX_PROBE", NULL, &jerr);
            break;
        }
        if (jsd_test_mono_ms() > end)
            break;
        s = NATS_OK;
        jsd_test_sleep_ms(100);
    }
    if (s != NATS_OK)
        snprintf(why, cap, "%s (jsErrCode %d)", natsStatus_GetText(s), (int)jerr);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    natsOptions_Destroy(o);
    return s == NATS_OK ? 0 : -1;
}

/* One cluster start in a fresh folder; 0 when it places an R3 stream. */
static int fx_cluster_try(jsd_fx_cluster *out, char *why, size_t cap)
{
    char dir[PATH_MAX - 16], log[8192], key[32];
    memset(out, 0, sizeof(*out));
    fx_new_dir("cluster", dir, sizeof(dir));
    for (int i = 0; i < 3; i++) {
        snprintf(out->node[i].dir, sizeof(out->node[i].dir), "%s/n%d", dir, i + 1);
        fx_remember(out->node[i].dir, FX_NATS);
    }
    int rc = fx_run("cluster-start", dir, NULL, log, sizeof(log));
    if (rc != 0) {
        fail_msg("fixture.sh cluster-start %s failed (exit %d):\n%s", dir, rc, log);
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        snprintf(key, sizeof(key), "NODE%d_DIR", i + 1);
        jsd_fx_env(dir, key, out->node[i].dir, sizeof(out->node[i].dir));
        fx_load_nats(&out->node[i]);
    }
    jsd_fx_env(dir, "CLUSTER_URLS", out->urls, sizeof(out->urls));
    if (fx_cluster_probe(out, why, cap) != 0) {
        fprintf(stderr, "fixture: cluster in %s cannot place an R3 stream\n", dir);
        return 1;
    }
    return 0;
}

int jsd_fx_cluster_start(jsd_fx_cluster *out)
{
    char why[512];
    /* A cluster that formed but cannot place an R3 stream is started once
     * more in a new folder (new ports), then the test fails. */
    for (int attempt = 0; attempt < 2; attempt++) {
        int rc = fx_cluster_try(out, why, sizeof(why));
        if (rc <= 0)
            return rc;
        fprintf(stderr, "fixture: %s; starting a new cluster\n", why);
        jsd_fx_cluster_stop(out);
    }
    fail_msg("%s, twice: cannot place an R3 stream", why);
    return -1;
}

int jsd_fx_cluster_stop(jsd_fx_cluster *c)
{
    int rc = 0;
    for (int i = 0; i < 3; i++)
        if (jsd_fx_nats_alive(&c->node[i]) && jsd_fx_nats_stop(&c->node[i]) != 0)
            rc = -1;
    return rc;
}

struct jsd_conn *jsd_fx_conn_giving_up(const char *url)
{
    jsd_conn_opts co;
    jsd_conn *c = NULL;
    jsd_error err;
    jsd_conn_opts_init(&co);
    co.servers = url;
    co.reconnect_attempts = 2;
    co.reconnect_wait_ms = 50;
    co.reconnect_jitter_ms = 10;
    jsd_error_clear(&err);
    if (jsd_conn_open(&c, &co, &err) != JSD_OK)
        fail_msg("jsd_conn_open %s: %s", url, err.msg);
    return c;
}

int jsd_fx_url_port(const char *url)
{
    const char *colon = url ? strrchr(url, ':') : NULL;
    int port = colon ? atoi(colon + 1) : 0;
    if (port <= 0)
        fail_msg("no port at the end of the URL \"%s\"", url ? url : "(null)");
    return port;
}

const char *jsd_fx_shared_nats_url(void)
{
    const char *u = getenv("JSD_TEST_NATS_URL");
    if (!u || !*u)
        fail_msg("JSD_TEST_NATS_URL is not set: run the tests through scripts/run-tests.sh");
    return u;
}

/* ---- PostgreSQL ---------------------------------------------------------- */

static void fx_load_pg(jsd_fx_pg *pg)
{
    jsd_fx_env(pg->dir, "PG_URL", pg->url, sizeof(pg->url));
    pg->port = (int)fx_env_long(pg->dir, "PG_PORT");
    pg->pid = (pid_t)fx_env_long(pg->dir, "PG_PID");
}

static bool fx_pg_alive(const jsd_fx_pg *pg)
{
    char needle[PATH_MAX + 16];
    snprintf(needle, sizeof(needle), "%s/data", pg->dir);
    return fx_pid_is(pg->pid, "postgres", needle);
}

int jsd_fx_pg_start(jsd_fx_pg *out)
{
    char log[8192];
    memset(out, 0, sizeof(*out));
    fx_new_dir("pg", out->dir, sizeof(out->dir));
    fx_remember(out->dir, FX_PG);
    int rc = fx_run("pg-start", out->dir, NULL, log, sizeof(log));
    if (rc != 0) {
        fail_msg("fixture.sh pg-start %s failed (exit %d):\n%s", out->dir, rc, log);
        return -1;
    }
    fx_load_pg(out);
    return 0;
}

static int fx_pg_control(jsd_fx_pg *pg, const char *verb, bool want_alive)
{
    char log[8192];
    if (fx_pg_alive(pg) != want_alive) {
        fail_msg("fixture %s: postgres pid %ld is %s; refusing to %s", pg->dir, (long)pg->pid,
                 want_alive ? "not running" : "still running", verb);
        return -1;
    }
    int rc = fx_run(verb, pg->dir, NULL, log, sizeof(log));
    if (rc != 0) {
        fail_msg("fixture.sh %s %s failed (exit %d):\n%s", verb, pg->dir, rc, log);
        return -1;
    }
    fx_load_pg(pg);
    return 0;
}

int jsd_fx_pg_stop(jsd_fx_pg *pg)
{
    return fx_pg_control(pg, "stop", true);
}

int jsd_fx_pg_kill(jsd_fx_pg *pg)
{
    return fx_pg_control(pg, "kill", true);
}

int jsd_fx_pg_restart(jsd_fx_pg *pg)
{
    return fx_pg_control(pg, "restart", false);
}

int jsd_fx_pg_pause(jsd_fx_pg *pg)
{
    return fx_pg_control(pg, "pause", true);
}

int jsd_fx_pg_resume(jsd_fx_pg *pg)
{
    return fx_pg_control(pg, "resume", true);
}

int jsd_fx_pg_do(const char *url, const char *sql)
{
    PGconn *c = PQconnectdb(url);
    if (PQstatus(c) != CONNECTION_OK) {
        fail_msg("cannot connect to the test PostgreSQL: %s", PQerrorMessage(c));
        PQfinish(c);
        return -1;
    }
    PGresult *r = PQexec(c, sql);
    int rc = 0;
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
        fail_msg("%s: %s", sql, PQerrorMessage(c));
        rc = -1;
    }
    PQclear(r);
    PQfinish(c);
    return rc;
}

int jsd_fx_pg_start_with(jsd_fx_pg *out, const char *const *settings)
{
    if (jsd_fx_pg_start(out) != 0)
        return -1;
    if (!settings || !settings[0])
        return 0;
    for (const char *const *q = settings; *q; q++)
        if (jsd_fx_pg_do(out->url, *q) != 0)
            return -1;
    return jsd_fx_pg_stop(out) == 0 && jsd_fx_pg_restart(out) == 0 ? 0 : -1;
}

/* url with its database path replaced by db: scheme://auth@host:port/db?q */
static int fx_pg_url_with_db(const char *server, const char *db, char *url, size_t cap)
{
    const char *hp = strstr(server, "://");
    if (!hp)
        return -1;
    hp += 3;
    size_t base = strcspn(hp, "/?") + (size_t)(hp - server);
    const char *q = strchr(server + base, '?');
    int n = snprintf(url, cap, "%.*s/%s%s", (int)base, server, db, q ? q : "");
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int jsd_fx_pg_database_on(const char *server_url, char *url, size_t cap)
{
    char name[64], sql[160];
    snprintf(name, sizeof(name), "jsd_t_%ld_%d", (long)getpid(), ++fx_seq);
    PGconn *c = PQconnectdb(server_url);
    if (PQstatus(c) != CONNECTION_OK) {
        fail_msg("cannot connect to the test PostgreSQL: %s", PQerrorMessage(c));
        PQfinish(c);
        return -1;
    }
    snprintf(sql, sizeof(sql), "CREATE DATABASE %s", name);
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        fail_msg("%s: %s", sql, PQerrorMessage(c));
        PQclear(r);
        PQfinish(c);
        return -1;
    }
    PQclear(r);
    PQfinish(c);
    fx_register_exit();
    if (n_databases < FX_MAX) {
        snprintf(databases[n_databases].server, sizeof(databases[0].server), "%s", server_url);
        snprintf(databases[n_databases].name, sizeof(databases[0].name), "%s", name);
        n_databases++;
    }
    if (fx_pg_url_with_db(server_url, name, url, cap) != 0) {
        fail_msg("PostgreSQL URL too long for the buffer (%zu bytes)", cap);
        return -1;
    }
    return 0;
}

int jsd_fx_pg_database(char *url, size_t cap)
{
    const char *server = getenv("JSD_TEST_PG_URL");
    if (!server || !*server) {
        fail_msg("JSD_TEST_PG_URL is not set: run the tests through scripts/run-tests.sh");
        return -1;
    }
    return jsd_fx_pg_database_on(server, url, cap);
}

void jsd_fx_sqlite_url(char *url, size_t cap)
{
    snprintf(url, cap, "sqlite:%s/%s.db", jsd_test_dir(), jsd_test_unique("store"));
}

const char *jsd_fx_bin(const char *name)
{
    static char bufs[4][PATH_MAX];
    static unsigned next;
    char *b = bufs[next++ % 4];
    const char *build = getenv("JSD_BUILD");
    if (!build || !*build)
        build = "build";
    if (!strcmp(name, "jsdurable")) {
        snprintf(b, PATH_MAX, "%s/jsdurable", build);
        return b;
    }
    snprintf(b, PATH_MAX, "%s/tests/tools/%s", build, name);
    if (access(b, X_OK) != 0) {
        char alt[PATH_MAX];
        snprintf(alt, sizeof(alt), "%s/%s", build, name);
        if (access(alt, X_OK) == 0)
            snprintf(b, PATH_MAX, "%s", alt);
    }
    return b;
}

/* ---- exit ---------------------------------------------------------------- */

static void fx_cleanup(void)
{
    char log[4096], sql[160];
    if (owner != getpid())
        return;
    for (int i = 0; i < n_databases; i++) {
        PGconn *c = PQconnectdb(databases[i].server);
        if (PQstatus(c) == CONNECTION_OK) {
            snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s WITH (FORCE)",
                     databases[i].name);
            PQclear(PQexec(c, sql));
        }
        PQfinish(c);
    }
    n_databases = 0;
    /* the script resumes a paused server and checks its identity itself */
    for (int i = n_started - 1; i >= 0; i--)
        (void)fx_run("stop", started[i].dir, NULL, log, sizeof(log));
    n_started = 0;
}

/* ---- streams ------------------------------------------------------------- */

void jsd_fx_add_stream(natsConnection *nc, const char *name, const char *subject)
{
    jsCtx *js = NULL;
    jsStreamInfo *si = NULL;
    jsStreamConfig cfg;
    jsErrCode jerr = 0;
    const char *subjects[] = {subject};
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    jsStreamConfig_Init(&cfg);
    cfg.Name = name;
    cfg.Subjects = subjects;
    cfg.SubjectsLen = 1;
    cfg.Storage = js_FileStorage;
    natsStatus s = js_AddStream(&si, js, &cfg, NULL, &jerr);
    if (s != NATS_OK)
        fail_msg("js_AddStream %s: %s (jsErrCode %d)", name, natsStatus_GetText(s), (int)jerr);
    jsStreamInfo_Destroy(si);
    jsCtx_Destroy(js);
}

uint64_t jsd_fx_stream_msgs(natsConnection *nc, const char *name)
{
    jsCtx *js = NULL;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    uint64_t n = UINT64_MAX;
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    natsStatus s = js_GetStreamInfo(&si, js, name, NULL, &jerr);
    if (s == NATS_OK)
        n = si->State.Msgs;
    else if (getenv("JSD_FX_DEBUG"))
        fprintf(stderr, "stream info %s: %s (jsErrCode %d)\n", name, natsStatus_GetText(s),
                (int)jerr);
    jsStreamInfo_Destroy(si);
    jsCtx_Destroy(js);
    return n;
}
