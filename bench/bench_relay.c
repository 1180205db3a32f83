/*
 * bench_relay — outbox relay throughput and latency (issue 5's figures).
 *
 *   bench_relay [NATS_URL]        (default $JSD_BENCH_NATS_URL; PostgreSQL
 *                                  figures when $JSD_BENCH_PG_URL is set)
 *
 * Prints one `NAME VALUE UNIT` line per figure on stdout (plus
 * relay.sqlite.cpu / relay.postgres.cpu: this process's CPU per effect, µs,
 * a steadier figure than wall time on a shared machine):
 *   relay.sqlite V msg/s       100k effects of 256 bytes pre-enqueued in a
 *                              fresh SQLite store; time from the relay's start
 *                              until every one is published AND retired
 *                              (receipt committed); median of 3 runs
 *   relay.postgres V msg/s     the same on a fresh PostgreSQL database
 *   relay.latency.p50_ms V ms  commit -> PubAck for effects committed one per
 *   relay.latency.p99_ms V ms  transaction at a steady 1k/s (SQLite, 10 s)
 *   relay.latency.xproc.p50_ms, relay.latency.xproc.p99_ms
 *                              the same with the commits made by another
 *                              process (the relay notices them through
 *                              PRAGMA data_version, not the in-process signal)
 *   relay.latency.postgres.p50_ms, relay.latency.postgres.p99_ms
 *                              the same on a fresh PostgreSQL database, the
 *                              commits made by another process: the relay
 *                              wakes through LISTEN/NOTIFY
 *   relay.naive V msg/s        the same relay with batch 1 and 1 in flight:
 *                              claim, one publish waited for, one receipt
 *                              commit per effect (SQLite, 5k effects)
 *   relay.sqlite.keyed V msg/s relay.sqlite with every effect keyed (one of
 *                              BENCH_RELAY_KEYS=1024 keys, round robin); only
 *                              when BENCH_RELAY_ONLY names "keyed"
 * BENCH_RELAY_SUFFIX ends every name (bench/run.sh: ".durable" on the server
 * with `sync_interval: always`, whose streams BENCH_RELAY_ATOMIC=1 makes with
 * allow_atomic); BENCH_RELAY_ONLY chooses figures (a comma-separated list).
 * Each run checks that the stream holds exactly one message per effect and
 * the store a receipt for each, so a fast but lossy run cannot report a
 * figure. BENCH_RELAY_MESSAGES overrides 100000. Notes go to stderr.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <nats/nats.h>

#include "jsdurable.h"
#include "lib/bench_js.h"

#define PAYLOAD 256
#define RUNS    3

static const char *nats_url;
static char tmpdir[512];
/* BENCH_RELAY_SUFFIX (".durable" from bench/run.sh on the server with
 * `sync_interval: always`) ends every figure's name; BENCH_RELAY_ATOMIC=1
 * makes the streams with allow_atomic (so a relay may publish in atomic
 * batches); BENCH_RELAY_KEYS=K (with BENCH_RELAY_ONLY=keyed) gives every
 * effect one of K ordering keys, round robin. */
static const char *suffix = "";
static int atomic_streams, n_keys;

static void stream_make(const char *name, const char *subject)
{
    if (atomic_streams)
        bench_stream_make_atomic(name, subject);
    else
        bench_stream_make(name, subject);
}

/* ---- stores ------------------------------------------------------------------------ */

static void enqueue(jsd_store *s, const char *prefix, const char *subject, int n, int per_tx)
{
    char payload[PAYLOAD];
    memset(payload, 'p', sizeof(payload));
    for (int i = 0; i < n;) {
        jsd_tx *tx = NULL;
        if (jsd_tx_begin(&tx, s) != JSD_OK)
            bench_die("begin: %s", jsd_store_errmsg(s));
        for (int k = 0; k < per_tx && i < n; k++, i++) {
            char id[32], key[32];
            snprintf(id, sizeof(id), "%s%d", prefix, i);
            snprintf(key, sizeof(key), "k%d", n_keys > 0 ? i % n_keys : 0);
            jsd_effect e = {.owner = "bench",
                            .id = id,
                            .subject = subject,
                            .payload = payload,
                            .len = sizeof(payload),
                            .order_key = n_keys > 0 ? key : NULL};
            if (jsd_tx_emit(tx, &e) != JSD_OK)
                bench_die("emit: %s", jsd_store_errmsg(s));
        }
        if (jsd_tx_commit(tx) != JSD_OK)
            bench_die("commit: %s", jsd_store_errmsg(s));
    }
}

/* A fresh PostgreSQL database next to the one in base_url; url receives its
 * URL, name its name. */
static void pg_fresh(const char *base_url, char *url, size_t cap, char *name, size_t ncap)
{
    static int seq;
    snprintf(name, ncap, "jsd_bench_relay_%ld_%d", (long)getpid(), seq++);
    bench_pg_create(base_url, name, url, cap);
}

/* ---- throughput ---------------------------------------------------------------------- */

/* One run: n effects pre-enqueued, then the relay until idle. Returns msg/s;
 * the CPU per effect of this process, of nats-server and of PostgreSQL (its
 * postmaster and every process under it; -1 when not known) go to last_*. */
static double last_cpu_us_per_effect, last_server_us_per_effect, last_pg_us_per_effect;
static double last_busy_pct; /* the machine's cores busy during the run, % (-1: not known) */

static double throughput_run(const char *store_url, int n, int batch, int in_flight,
                             const char *label)
{
    static int run_no;
    char stream[64], subject[64];
    snprintf(stream, sizeof(stream), "BENCH_RELAY_%ld_%d", (long)getpid(), run_no);
    snprintf(subject, sizeof(subject), "bench.relay.%ld.%d", (long)getpid(), run_no++);
    stream_make(stream, subject);

    jsd_store *app = bench_store_open(store_url);
    enqueue(app, "e", subject, n, 1000);

    jsd_store *rs = bench_store_open(store_url);
    jsd_conn *c = bench_conn_open(nats_url, "BENCH_RELAY_WRITE_EACH");
    jsd_relay_opts o;
    jsd_relay_opts_init(&o);
    o.batch_size = batch;
    o.max_in_flight = in_flight;
    o.publish_deadline_ms = 30000;
    o.lease_ms = 60000;
    /* deadline + backoff cap + lease must fit the stream's 2-minute window */
    o.backoff_cap_ms = 20000;
    jsd_relay *r = NULL;
    jsd_error err;
    jsd_error_clear(&err);
    if (jsd_relay_create(&r, rs, c, &o, &err) != JSD_OK)
        bench_die("relay: %s", err.msg);

    int64_t s0 = bench_server_cpu_us("JSD_BENCH_NATS_PID", 0);
    int64_t p0 = bench_server_cpu_us("JSD_BENCH_PG_PID", 1);
    long long b0 = 0, a0 = 0, b1 = 0, a1 = 0;
    int machine = bench_machine_ticks(&b0, &a0);
    int64_t t0 = bench_mono_us(), c0 = bench_cpu_us();
    if (jsd_relay_run_until_idle(r) != JSD_OK)
        bench_die("relay run: %s", jsd_relay_errmsg(r));
    int64_t t1 = bench_mono_us(), c1 = bench_cpu_us();
    machine = machine && bench_machine_ticks(&b1, &a1) && a1 > a0;
    last_busy_pct = machine ? 100.0 * (double)(b1 - b0) / (double)(a1 - a0) : -1;
    int64_t s1 = bench_server_cpu_us("JSD_BENCH_NATS_PID", 0);
    int64_t p1 = bench_server_cpu_us("JSD_BENCH_PG_PID", 1);
    last_server_us_per_effect = bench_per_msg(s0, s1, n);
    last_pg_us_per_effect = bench_per_msg(p0, p1, n);

    jsd_relay_stats st;
    jsd_relay_stats_get(r, &st);
    jsd_store_stats ss;
    if (jsd_store_stats_get(app, &ss) != JSD_OK)
        bench_die("store stats: %s", jsd_store_errmsg(app));
    uint64_t stored = bench_stream_msgs(stream);
    if (st.published != (uint64_t)n || ss.published != n || stored != (uint64_t)n ||
        st.duplicates != 0) {
        fprintf(stderr,
                "bench_relay: %s run is wrong: relay published %llu (dups %llu), store %lld, "
                "stream %llu, want %d\n",
                label, (unsigned long long)st.published, (unsigned long long)st.duplicates,
                (long long)ss.published, (unsigned long long)stored, n);
        exit(1);
    }
    jsd_relay_destroy(r);
    jsd_conn_close(c);
    jsd_store_close(rs);
    jsd_store_close(app);
    bench_stream_drop(stream);
    double rate = (double)n / ((double)(t1 - t0) / 1e6);
    last_cpu_us_per_effect = (double)(c1 - c0) / n;
    fprintf(stderr,
            "bench_relay: %s run: %d effects in %.3f s = %.0f msg/s (%llu batches, %.1f us CPU "
            "per effect in this process)\n",
            label, n, (double)(t1 - t0) / 1e6, rate, (unsigned long long)st.batches,
            (double)(c1 - c0) / n);
    return rate;
}

static void sqlite_url(char *url, size_t cap)
{
    static int seq;
    snprintf(url, cap, "sqlite:%s/relay-%d.db", tmpdir, seq++);
}

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end = NULL;
    long x = strtol(v, &end, 10);
    return *end || x < 1 || x > 4096 ? dflt : (int)x;
}

/* "<label>.machine_busy" (the share of all cores busy during the runs),
 * "<label>.server.cpu" (nats-server) and, for PostgreSQL, "<label>.pg.cpu":
 * medians of the runs, the last two per effect and only when the servers'
 * process ids were given (bench/run.sh does). Beside "<label>.cpu" they show
 * where the machine's cores went (docs/PERFORMANCE.md, the CPU budget). */
static void print_servers(const char *label, double *srv, double *pg, double *busy)
{
    if (busy[0] >= 0)
        printf("%s.machine_busy%s %.0f %%\n", label, suffix, bench_median(busy, RUNS));
    if (srv[0] >= 0)
        printf("%s.server.cpu%s %.2f us/msg\n", label, suffix, bench_median(srv, RUNS));
    if (pg && pg[0] >= 0)
        printf("%s.pg.cpu%s %.2f us/msg\n", label, suffix, bench_median(pg, RUNS));
}

/* tail ends the figure's name after the suffix: "relay.sqlite.durable.keyed" */
static void bench_throughput_sqlite(int n, const char *tail)
{
    char label[64];
    snprintf(label, sizeof(label), "relay.sqlite%s", tail);
    double v[RUNS], c[RUNS], srv[RUNS], busy[RUNS];
    for (int i = 0; i < RUNS; i++) {
        char url[700];
        sqlite_url(url, sizeof(url));
        v[i] = throughput_run(url, n, env_int("BENCH_RELAY_BATCH", 256), 1024, label);
        c[i] = last_cpu_us_per_effect;
        srv[i] = last_server_us_per_effect;
        busy[i] = last_busy_pct;
    }
    printf("relay.sqlite%s%s %.0f msg/s\n", suffix, tail, bench_median(v, RUNS));
    printf("relay.sqlite.cpu%s%s %.2f us/msg\n", suffix, tail, bench_median(c, RUNS));
    if (!*tail)
        print_servers(label, srv, NULL, busy);
    fflush(stdout);
}

static void bench_throughput_pg(const char *base, int n)
{
    double v[RUNS], c[RUNS], srv[RUNS], pg[RUNS], busy[RUNS];
    for (int i = 0; i < RUNS; i++) {
        char url[700], name[80];
        pg_fresh(base, url, sizeof(url), name, sizeof(name));
        v[i] = throughput_run(url, n, 256, 1024, "relay.postgres");
        c[i] = last_cpu_us_per_effect;
        srv[i] = last_server_us_per_effect;
        pg[i] = last_pg_us_per_effect;
        busy[i] = last_busy_pct;
        bench_pg_drop(base, name);
    }
    printf("relay.postgres%s %.0f msg/s\n", suffix, bench_median(v, RUNS));
    printf("relay.postgres.cpu%s %.2f us/msg\n", suffix, bench_median(c, RUNS));
    print_servers("relay.postgres", srv, pg, busy);
    fflush(stdout);
}

static void bench_naive(int n)
{
    char url[700];
    sqlite_url(url, sizeof(url));
    double v = throughput_run(url, n, 1, 1, "relay.naive");
    printf("relay.naive%s %.0f msg/s\n", suffix, v);
    fflush(stdout);
}

/* ---- latency --------------------------------------------------------------------------- */

#define LAT_RATE    1000 /* effects per second */
#define LAT_SECONDS 10

typedef struct lat {
    int64_t *committed_us; /* by effect number */
    int64_t *acked_us;
    int n;
} lat;

static void on_published(const jsd_relay_published *p, void *user)
{
    lat *l = user;
    int i = (int)strtol(p->id + 1, NULL, 10); /* "l<i>" */
    if (i >= 0 && i < l->n)
        l->acked_us[i] = p->acked_mono_us;
}

typedef struct relay_thread {
    jsd_relay *r;
    jsd_status rc;
} relay_thread;

static void *relay_main(void *arg)
{
    relay_thread *t = arg;
    t->rc = jsd_relay_run(t->r);
    return NULL;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Commit effects k, k + every, k + 2 every, ... < n one per transaction, effect
 * i due at start + i ms (LAT_RATE/s over all producers); committed_us[i] is
 * when effect i's commit returned. */
static void produce(jsd_store *app, int64_t *committed_us, int n, const char *subject, int k,
                    int every)
{
    char payload[PAYLOAD];
    memset(payload, 'p', sizeof(payload));
    int64_t start = bench_mono_us(), period = 1000000 / LAT_RATE;
    for (int i = k; i < n; i += every) {
        int64_t due = start + (int64_t)i * period, now = bench_mono_us();
        if (due > now)
            usleep((useconds_t)(due - now));
        char id[32];
        snprintf(id, sizeof(id), "l%d", i);
        jsd_tx *tx = NULL;
        jsd_effect e = {.owner = "lat",
                        .id = id,
                        .subject = subject,
                        .payload = payload,
                        .len = sizeof(payload)};
        if (jsd_tx_begin(&tx, app) != JSD_OK || jsd_tx_emit(tx, &e) != JSD_OK ||
            jsd_tx_commit(tx) != JSD_OK)
            bench_die("enqueue: %s", jsd_store_errmsg(app));
        committed_us[i] = bench_mono_us();
    }
}

/* name: the figures' prefix; url: a fresh store; producers: 0 = the commits
 * come from this process, else from that many forked processes (effect i from
 * process i % producers), so the relay learns of them only as another process
 * would (SQLite: PRAGMA data_version; PostgreSQL: LISTEN/NOTIFY). On
 * PostgreSQL one connection's synchronous commits (a WAL flush each) cannot
 * keep 1k/s on a loaded machine, so several application processes share the
 * rate, as they would in a deployment. */
static void bench_latency(const char *name, const char *url, int producers)
{
    bool xproc = producers > 0;
    int n = LAT_RATE * LAT_SECONDS;
    /* shared with the producing child when xproc (CLOCK_MONOTONIC is one
     * clock for every process) */
    int64_t *shared = mmap(NULL, (size_t)(n + 1) * sizeof(int64_t), PROT_READ | PROT_WRITE,
                           MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    lat l = {.committed_us = shared == MAP_FAILED ? NULL : shared,
             .acked_us = calloc((size_t)n, sizeof(int64_t)),
             .n = n};
    if (!l.committed_us || !l.acked_us)
        bench_die("%s", "out of memory");
    char stream[64], subject[64];
    snprintf(stream, sizeof(stream), "BENCH_RELAY_LAT_%ld", (long)getpid());
    snprintf(subject, sizeof(subject), "bench.relay.lat.%ld", (long)getpid());
    stream_make(stream, subject);

    /* The store file exists (schema made) before the child opens it; the
     * child is forked before the relay's threads start and commits only once
     * the parent says go. */
    jsd_store *app = bench_store_open(url);
    pid_t child[8];
    int go[2] = {-1, -1};
    if (producers > 8)
        producers = 8;
    if (xproc) {
        jsd_store_close(app);
        app = NULL;
        if (pipe(go) != 0)
            bench_die("pipe: %s", strerror(errno));
        fflush(NULL);
        for (int k = 0; k < producers; k++) {
            child[k] = fork();
            if (child[k] < 0)
                bench_die("fork: %s", strerror(errno));
            if (child[k] == 0) {
                char ch;
                close(go[1]);
                if (read(go[0], &ch, 1) != 1)
                    _exit(1);
                jsd_store *cs = bench_store_open(url);
                produce(cs, l.committed_us, n, subject, k, producers);
                jsd_store_close(cs);
                _exit(0);
            }
        }
        close(go[0]);
    }
    jsd_store *rs = bench_store_open(url);
    jsd_conn *c = bench_conn_open(nats_url, "BENCH_RELAY_WRITE_EACH");
    jsd_relay_opts o;
    jsd_relay_opts_init(&o);
    o.on_published = on_published;
    o.on_published_user = &l;
    jsd_relay *r = NULL;
    jsd_error err;
    jsd_error_clear(&err);
    if (jsd_relay_create(&r, rs, c, &o, &err) != JSD_OK)
        bench_die("relay: %s", err.msg);
    relay_thread t = {.r = r};
    pthread_t th;
    pthread_create(&th, NULL, relay_main, &t);
    usleep(200000);

    int64_t t_go = bench_mono_us();
    if (xproc) {
        for (int k = 0; k < producers; k++)
            if (write(go[1], "g", 1) != 1)
                bench_die("pipe: %s", strerror(errno));
        close(go[1]);
        for (int k = 0; k < producers; k++) {
            int status = 0;
            if (waitpid(child[k], &status, 0) != child[k] || !WIFEXITED(status) ||
                WEXITSTATUS(status) != 0)
                bench_die("%s", "a producing process failed");
        }
    } else {
        produce(app, l.committed_us, n, subject, 0, 1);
    }
    int64_t achieved = 1;
    for (int i = 0; i < n; i++)
        if (l.committed_us[i] - t_go > achieved)
            achieved = l.committed_us[i] - t_go;
    /* wait for the last receipts */
    for (int w = 0; w < 300; w++) {
        jsd_relay_stats st;
        jsd_relay_stats_get(r, &st);
        if (st.published >= (uint64_t)n)
            break;
        usleep(100000);
    }
    jsd_relay_stop(r);
    pthread_join(th, NULL);

    int64_t *d = calloc((size_t)n, sizeof(int64_t));
    int got = 0;
    for (int i = 0; i < n; i++)
        if (l.acked_us[i])
            d[got++] = l.acked_us[i] - l.committed_us[i];
    if (got != n || bench_stream_msgs(stream) != (uint64_t)n) {
        fprintf(stderr, "bench_relay: latency run is wrong: %d of %d acked, stream %llu\n", got, n,
                (unsigned long long)bench_stream_msgs(stream));
        exit(1);
    }
    qsort(d, (size_t)n, sizeof(int64_t), cmp_i64);
    fprintf(stderr,
            "bench_relay: %s run: %d effects at %.0f/s, commit->PubAck min %.3f max %.3f ms\n",
            name, n, (double)n / ((double)achieved / 1e6), (double)d[0] / 1000.0,
            (double)d[n - 1] / 1000.0);
    printf("%s.p50_ms%s %.3f ms\n", name, suffix, (double)d[n / 2] / 1000.0);
    printf("%s.p99_ms%s %.3f ms\n", name, suffix, (double)d[(size_t)n * 99 / 100] / 1000.0);
    fflush(stdout);
    free(d);
    jsd_relay_destroy(r);
    jsd_conn_close(c);
    jsd_store_close(rs);
    jsd_store_close(app);
    bench_stream_drop(stream);
    munmap(shared, (size_t)(n + 1) * sizeof(int64_t));
    free(l.acked_us);
}

/* Is what in the comma-separated list (NULL: everything)? */
static int wanted(const char *list, const char *what)
{
    if (!list)
        return 1;
    size_t n = strlen(what);
    for (const char *p = list; (p = strstr(p, what)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    bench_prog = "bench_relay";
    nats_url = argc > 1 ? argv[1] : getenv("JSD_BENCH_NATS_URL");
    if (!nats_url || !*nats_url)
        bench_die("%s", "usage: bench_relay NATS_URL (or set JSD_BENCH_NATS_URL)");
    const char *pg = getenv("JSD_BENCH_PG_URL");
    /* a comma-separated list of sqlite,postgres,keyed,latency,xproc,pg-latency,naive;
     * unset: all but keyed */
    const char *only = getenv("BENCH_RELAY_ONLY");
    const char *sfx = getenv("BENCH_RELAY_SUFFIX");
    if (sfx)
        suffix = sfx;
    atomic_streams = getenv("BENCH_RELAY_ATOMIC") && !strcmp(getenv("BENCH_RELAY_ATOMIC"), "1");
    int n = 100000;
    const char *ns = getenv("BENCH_RELAY_MESSAGES");
    if (ns && *ns) {
        char *end = NULL;
        long v = strtol(ns, &end, 10);
        if (*end || v < 1 || v > 10000000)
            bench_die("BENCH_RELAY_MESSAGES=%s is not a count", ns);
        n = (int)v;
    }
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof(tmpdir), "%s/jsd-bench-relay.XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(tmpdir))
        bench_die("cannot make a temporary folder: %s", strerror(errno));
    jsd_log_configure(JSD_LOG_ERROR, JSD_LOG_TEXT, NULL, NULL);
    bench_nats_up(nats_url);

    if (wanted(only, "sqlite"))
        bench_throughput_sqlite(n, "");
    if (only && wanted(only, "keyed")) {
        n_keys = env_int("BENCH_RELAY_KEYS", 1024);
        bench_throughput_sqlite(n, ".keyed");
        n_keys = 0;
    }
    if (wanted(only, "postgres")) {
        if (pg && *pg)
            bench_throughput_pg(pg, n);
        else
            fprintf(stderr, "bench_relay: relay.postgres skipped: JSD_BENCH_PG_URL is not set "
                            "(bench/run.sh sets it with JSD_BENCH_PG=1)\n");
    }
    char url[700];
    if (wanted(only, "latency")) {
        sqlite_url(url, sizeof(url));
        bench_latency("relay.latency", url, 0);
    }
    if (wanted(only, "xproc")) {
        sqlite_url(url, sizeof(url));
        bench_latency("relay.latency.xproc", url, 1);
    }
    if (wanted(only, "pg-latency")) {
        if (pg && *pg) {
            char name[80];
            pg_fresh(pg, url, sizeof(url), name, sizeof(name));
            bench_latency("relay.latency.postgres", url, 4);
            bench_pg_drop(pg, name);
        } else {
            fprintf(stderr, "bench_relay: relay.latency.postgres skipped: JSD_BENCH_PG_URL is "
                            "not set\n");
        }
    }
    if (wanted(only, "naive"))
        bench_naive(n < 5000 ? n : 5000);

    char cmd[700];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_relay: could not remove %s\n", tmpdir);
    jsCtx_Destroy(bench_js);
    natsConnection_Destroy(bench_nc);
    return 0;
}
