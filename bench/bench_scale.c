/*
 * bench_scale — the data path as the tables grow, and the memory of the real
 * processes (issue 12's scale figures); `make bench-scale` runs it through
 * bench/scale.sh, `make bench` does not (it runs for minutes).
 *
 *   bench_scale                   services from $JSD_BENCH_NATS_URL and
 *                                 $JSD_BENCH_PG_URL (PostgreSQL figures only
 *                                 when it is set); $JSD_BENCH_CLI is the
 *                                 jsdurable binary (default build/jsdurable)
 *
 * For X = sqlite and postgres, each on a fresh store, 256-byte effects
 * enqueued through jsd_tx_emit_batch (1,000 a call) in transactions of
 * 10,000:
 *   relay.X.scale_base V msg/s       SCALE_BASE (100,000) pending effects, the
 *                                    relay until idle (the same-run reference;
 *                                    median of 3 runs, each on a fresh store)
 *   relay.X.scale_pending V msg/s    SCALE_PENDING (1,000,000) pending effects
 *                                    (median of 3 runs, each on a fresh store:
 *                                    single runs on PostgreSQL spanned 21.6k to
 *                                    44.4k msg/s in one hour)
 *   relay.X.scale_published V msg/s  SCALE_BASE pending effects behind
 *                                    SCALE_PUBLISHED (5,000,000) published rows
 *                                    (median of 3 runs, one after the other:
 *                                    each run's rows stay published behind the
 *                                    next). A single run of 100,000 lasts about
 *                                    1.5 s on SQLite, and one alone moved the
 *                                    ratio by 0.2 x between runs of one clone.
 *   gc.X V rows/s                    jsd_store_gc (horizon 0, 1000 rows per
 *                                    transaction) over those published rows
 *   rss.relay.max_mib V MiB          peak resident memory (VmHWM, sampled every
 *   rss.consume.max_mib V MiB        20 ms) of `jsdurable relay --until-idle`
 *                                    and `jsdurable consume --sql --until-idle`
 *                                    through SCALE_RSS_MESSAGES (1,000,000)
 *                                    messages, SQLite (rss.X.postgres.max_mib:
 *                                    the same on PostgreSQL)
 * The published rows are enqueued through the API, then given the receipt
 * the relay writes, by SQL (runs of 256 and the settled floor: SQLite's
 * schema 8, PostgreSQL's 9, where the rows also get a lease first, as the
 * relay's claim leaves them), since publishing 5M messages through JetStream
 * would only measure JetStream; on PostgreSQL the table is then vacuumed,
 * as autovacuum would have done while they were published one batch at a
 * time.
 * Every relay run checks that the stream holds exactly one message per
 * effect and the store a receipt for each and no backlog; gc checks that it
 * removed every published row; the consumer that the sink table holds one
 * row per message. SCALE_STORES ("sqlite postgres") picks the stores,
 * SCALE_PARTS ("relay gc rss") the parts. Notes go to stderr.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <nats/nats.h>
#include <sqlite3.h>

#include "jsdurable.h"
#include "lib/bench_js.h"

#define PAYLOAD  256
#define PER_TX   10000 /* effects per transaction */
#define PER_EMIT 1000  /* effects per jsd_tx_emit_batch */
#define RUNS     3     /* runs behind each 100,000 figure */

static const char *nats_url;
static const char *pg_base;
static char tmpdir[512];

static long env_count(const char *name, long dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end = NULL;
    long x = strtol(v, &end, 10);
    if (*end || x < 1 || x > 100000000)
        bench_die("%s is not a count (1..100000000)", name);
    return x;
}

static bool env_has(const char *name, const char *dflt, const char *word)
{
    const char *v = getenv(name);
    if (!v || !*v)
        v = dflt;
    size_t n = strlen(word);
    for (const char *p = strstr(v, word); p; p = strstr(p + 1, word))
        if ((p == v || p[-1] == ' ' || p[-1] == ',') && (p[n] == 0 || p[n] == ' ' || p[n] == ','))
            return true;
    return false;
}

/* ---- stores: a fresh SQLite file or PostgreSQL database per run --------------------- */

typedef struct target {
    bool pg;
    const char *kind; /* "sqlite" | "postgres" */
    char url[700];
    char db[80]; /* PostgreSQL database name, or the SQLite file */
} target;

static void target_fresh(target *t, bool pg)
{
    static int seq;
    t->pg = pg;
    t->kind = pg ? "postgres" : "sqlite";
    if (!pg) {
        snprintf(t->db, sizeof(t->db), "scale-%d.db", seq++);
        snprintf(t->url, sizeof(t->url), "sqlite:%s/%s", tmpdir, t->db);
        return;
    }
    snprintf(t->db, sizeof(t->db), "jsd_bench_scale_%ld_%d", (long)getpid(), seq++);
    bench_pg_create(pg_base, t->db, t->url, sizeof(t->url));
}

static void target_drop(const target *t)
{
    char path[700];
    if (!t->pg) {
        const char *ext[] = {"", "-wal", "-shm", "-jsdturn"};
        for (int i = 0; i < 4; i++) {
            snprintf(path, sizeof(path), "%s/%s%s", tmpdir, t->db, ext[i]);
            unlink(path);
        }
        return;
    }
    bench_pg_drop(pg_base, t->db);
}

/* Run one SQL statement on the target outside the library; returns the first
 * column of the first row as a number (0 when there is none). */
static int64_t sql_run(const target *t, const char *sql)
{
    int64_t v = 0;
    if (t->pg) {
        PGconn *c = PQconnectdb(t->url);
        if (PQstatus(c) != CONNECTION_OK)
            bench_die("PostgreSQL: %s", PQerrorMessage(c));
        PGresult *r = PQexec(c, sql);
        ExecStatusType st = PQresultStatus(r);
        if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
            bench_die("SQL failed: %s", PQerrorMessage(c));
        if (st == PGRES_TUPLES_OK && PQntuples(r) > 0)
            v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        PQclear(r);
        PQfinish(c);
        return v;
    }
    char path[700];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, t->db);
    sqlite3 *db = NULL;
    if (sqlite3_open(path, &db) != SQLITE_OK)
        bench_die("cannot open %s", path);
    sqlite3_busy_timeout(db, 30000);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        bench_die("SQL failed: %s", sqlite3_errmsg(db));
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    else if (rc != SQLITE_DONE)
        bench_die("SQL failed: %s", sqlite3_errmsg(db));
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

static void enqueue(const target *t, const char *owner, const char *subject, long n)
{
    char payload[PAYLOAD];
    memset(payload, 'p', sizeof(payload));
    static char ids[PER_EMIT][32];
    static jsd_effect e[PER_EMIT];
    jsd_store *s = bench_store_open(t->url);
    int64_t t0 = bench_mono_us();
    for (long i = 0; i < n;) {
        jsd_tx *tx = NULL;
        if (jsd_tx_begin(&tx, s) != JSD_OK)
            bench_die("begin: %s", jsd_store_errmsg(s));
        for (int k = 0; k < PER_TX && i < n;) {
            size_t m = 0;
            for (; m < PER_EMIT && k < PER_TX && i < n; m++, k++, i++) {
                snprintf(ids[m], sizeof(ids[m]), "%s%ld", owner, i);
                e[m] = (jsd_effect){.owner = owner,
                                    .id = ids[m],
                                    .subject = subject,
                                    .payload = payload,
                                    .len = PAYLOAD};
            }
            size_t bad = 0;
            if (jsd_tx_emit_batch(tx, e, m, &bad) != JSD_OK)
                bench_die("emit: %s", jsd_store_errmsg(s));
        }
        if (jsd_tx_commit(tx) != JSD_OK)
            bench_die("commit: %s", jsd_store_errmsg(s));
    }
    fprintf(stderr, "bench_scale: %s: enqueued %ld effects in %.1f s\n", t->kind, n,
            (double)(bench_mono_us() - t0) / 1e6);
    jsd_store_close(s);
}

/* ---- relay throughput ------------------------------------------------------------- */

/* The relay until idle over the store's `due` pending effects, published to
 * stream. Checks the stream and the store; returns msg/s. */
static double relay_run(const target *t, const char *stream, long due, int64_t published_before,
                        const char *label)
{
    jsd_store *rs = bench_store_open(t->url);
    jsd_conn *c = bench_conn_open(nats_url, "BENCH_RELAY_WRITE_EACH");
    jsd_relay_opts o;
    jsd_relay_opts_init(&o);
    o.publish_deadline_ms = 30000;
    o.lease_ms = 60000;
    o.backoff_cap_ms = 20000; /* deadline + cap + lease within the 2-minute window */
    jsd_relay *r = NULL;
    jsd_error err;
    jsd_error_clear(&err);
    if (jsd_relay_create(&r, rs, c, &o, &err) != JSD_OK)
        bench_die("relay: %s", err.msg);
    int64_t t0 = bench_mono_us();
    if (jsd_relay_run_until_idle(r) != JSD_OK)
        bench_die("relay run: %s", jsd_relay_errmsg(r));
    int64_t t1 = bench_mono_us();
    jsd_relay_stats st;
    jsd_relay_stats_get(r, &st);
    jsd_store_stats ss;
    if (jsd_store_stats_get(rs, &ss) != JSD_OK)
        bench_die("store stats: %s", jsd_store_errmsg(rs));
    uint64_t stored = bench_stream_msgs(stream);
    if (st.published != (uint64_t)due || stored != (uint64_t)due || st.duplicates != 0 ||
        ss.published != published_before + due || ss.backlog != 0) {
        fprintf(stderr,
                "bench_scale: %s run is wrong: relay published %llu (dups %llu), store "
                "published %lld backlog %lld, stream %llu, want %ld (+%lld published before)\n",
                label, (unsigned long long)st.published, (unsigned long long)st.duplicates,
                (long long)ss.published, (long long)ss.backlog, (unsigned long long)stored, due,
                (long long)published_before);
        exit(1);
    }
    jsd_relay_destroy(r);
    jsd_conn_close(c);
    jsd_store_close(rs);
    double rate = (double)due / ((double)(t1 - t0) / 1e6);
    fprintf(stderr, "bench_scale: %s run: %ld effects in %.2f s = %.0f msg/s (%llu batches)\n",
            label, due, (double)(t1 - t0) / 1e6, rate, (unsigned long long)st.batches);
    return rate;
}

static void names(char *stream, size_t scap, char *subject, size_t ucap)
{
    static int seq;
    snprintf(stream, scap, "BENCH_SCALE_%ld_%d", (long)getpid(), seq);
    snprintf(subject, ucap, "bench.scale.%ld.%d", (long)getpid(), seq++);
}

/* n pending effects on a fresh store, the relay until idle. */
static double relay_pending(bool pg, long n, const char *label)
{
    target t;
    char stream[64], subject[64];
    target_fresh(&t, pg);
    names(stream, sizeof(stream), subject, sizeof(subject));
    bench_stream_make(stream, subject);
    enqueue(&t, "e", subject, n);
    double v = relay_run(&t, stream, n, 0, label);
    bench_stream_drop(stream);
    target_drop(&t);
    return v;
}

/* `published` rows with a receipt, then n pending effects, the relay until
 * idle; then jsd_store_gc over every published row. */
static void relay_published(bool pg, long published, long n, bool do_relay, bool do_gc)
{
    target t;
    char stream[64], subject[64], label[64];
    target_fresh(&t, pg);
    names(stream, sizeof(stream), subject, sizeof(subject));
    bench_stream_make(stream, subject);
    enqueue(&t, "old", subject, published);
    int64_t t0 = bench_mono_us();
    /* the relay's receipts as runs of 256 behind the settled floor, the
     * rows left as they are (sqlite.c and postgres.c, "the settled
     * floor"; on PostgreSQL each row keeps the lease it was published
     * under) */
    if (pg)
        sql_run(&t, "UPDATE jsd_outbox SET lease_token = 'fill', lease_expires = created_at");
    sql_run(&t, "INSERT INTO jsd_outbox_runs (lo, hi, stream, seq, duplicate, published_at) "
                "SELECT id, CASE WHEN id + 255 < m.top THEN id + 255 ELSE m.top END, "
                "'BENCH_SCALE_FILL', id, false, created_at FROM jsd_outbox, "
                "(SELECT max(id) AS top FROM jsd_outbox) m WHERE (id - 1) % 256 = 0");
    sql_run(&t, "UPDATE jsd_outbox_floor SET floor = (SELECT max(id) + 1 FROM jsd_outbox)");
    int64_t done = sql_run(&t, "SELECT coalesce(sum(hi - lo + 1), 0) FROM jsd_outbox_runs");
    if (pg)
        sql_run(&t, "VACUUM (ANALYZE) jsd_outbox");
    if (done != published) {
        fprintf(stderr, "bench_scale: %s: %lld rows marked published, want %ld\n", t.kind,
                (long long)done, published);
        exit(1);
    }
    fprintf(stderr, "bench_scale: %s: %ld rows given a receipt%s in %.1f s\n", t.kind, published,
            pg ? " and vacuumed" : "", (double)(bench_mono_us() - t0) / 1e6);
    long total = published;
    if (do_relay) {
        snprintf(label, sizeof(label), "relay.%s.scale_published", t.kind);
        double v[RUNS];
        for (int i = 0; i < RUNS; i++) {
            char owner[16], run_stream[64], run_subject[64];
            snprintf(owner, sizeof(owner), "e%d", i);
            names(run_stream, sizeof(run_stream), run_subject, sizeof(run_subject));
            bench_stream_make(run_stream, run_subject);
            enqueue(&t, owner, run_subject, n);
            v[i] = relay_run(&t, run_stream, n, total, label);
            bench_stream_drop(run_stream);
            total += n;
        }
        printf("%s %.0f msg/s\n", label, bench_median(v, RUNS));
        fflush(stdout);
    }
    if (do_gc) {
        jsd_store *s = bench_store_open(t.url);
        int64_t removed = 0;
        int64_t g0 = bench_mono_us();
        if (jsd_store_gc(s, 0, 1000, &removed) != JSD_OK)
            bench_die("gc: %s", jsd_store_errmsg(s));
        int64_t g1 = bench_mono_us();
        jsd_store_stats ss;
        if (jsd_store_stats_get(s, &ss) != JSD_OK)
            bench_die("store stats: %s", jsd_store_errmsg(s));
        if (removed != total || ss.published != 0) {
            fprintf(stderr,
                    "bench_scale: gc.%s run is wrong: removed %lld, %lld published left, "
                    "want %ld removed\n",
                    t.kind, (long long)removed, (long long)ss.published, total);
            exit(1);
        }
        double rate = (double)removed / ((double)(g1 - g0) / 1e6);
        fprintf(stderr, "bench_scale: gc.%s run: %lld rows in %.2f s\n", t.kind, (long long)removed,
                (double)(g1 - g0) / 1e6);
        printf("gc.%s %.0f rows/s\n", t.kind, rate);
        fflush(stdout);
        jsd_store_close(s);
    }
    bench_stream_drop(stream);
    target_drop(&t);
}

/* ---- peak memory of the real processes ---------------------------------------------- */

static long vm_hwm_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
    FILE *f = fopen(path, "r");
    long v = -1;
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, "VmHWM:", 6)) {
            v = strtol(line + 6, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

/* Run argv to its end; returns its peak VmHWM in KiB (sampled every 20 ms;
 * the process's memory peaks while it works, not in its last milliseconds). */
static long run_measured(const char *const argv[], const char *label)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        bench_die("fork: %s", strerror(errno));
    if (pid == 0) {
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "bench_scale: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    long peak = -1;
    int status = 0;
    int64_t t0 = bench_mono_us();
    for (;;) {
        long v = vm_hwm_kib(pid);
        if (v > peak)
            peak = v;
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            break;
        if (w < 0)
            bench_die("waitpid: %s", strerror(errno));
        usleep(20000);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "bench_scale: %s exited with status %d\n", label,
                WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
        exit(1);
    }
    fprintf(stderr, "bench_scale: %s: %.1f s, VmHWM %.1f MiB\n", label,
            (double)(bench_mono_us() - t0) / 1e6, (double)peak / 1024.0);
    return peak;
}

static void rss(bool pg, long n)
{
    const char *cli = getenv("JSD_BENCH_CLI");
    if (!cli || !*cli)
        cli = "build/jsdurable";
    target t, sink;
    char stream[64], subject[64], name[64];
    target_fresh(&t, pg);
    target_fresh(&sink, pg);
    names(stream, sizeof(stream), subject, sizeof(subject));
    bench_stream_make(stream, subject);
    enqueue(&t, "e", subject, n);

    const char *relay_argv[] = {cli,      "relay",        "--store",     t.url,   "--nats",
                                nats_url, "--until-idle", "--log-level", "error", NULL};
    snprintf(name, sizeof(name), "jsdurable relay (%s, %ld)", t.kind, n);
    long relay_kib = run_measured(relay_argv, name);
    jsd_store *s = bench_store_open(t.url);
    jsd_store_stats ss;
    if (jsd_store_stats_get(s, &ss) != JSD_OK)
        bench_die("store stats: %s", jsd_store_errmsg(s));
    jsd_store_close(s);
    if (bench_stream_msgs(stream) != (uint64_t)n || ss.published != n || ss.backlog != 0) {
        fprintf(stderr, "bench_scale: %s is wrong: stream %llu, store published %lld, want %ld\n",
                name, (unsigned long long)bench_stream_msgs(stream), (long long)ss.published, n);
        exit(1);
    }

    /* the consumer's store exists with its sink table, and a stream captures
     * its dead letters, before it starts */
    bench_stream_make("BENCH_SCALE_DLQ", "jsd.dlq.>");
    jsd_store_close(bench_store_open(sink.url));
    sql_run(&sink, pg ? "CREATE TABLE bench_sink (seq BIGINT PRIMARY KEY, subject TEXT NOT "
                        "NULL, body BYTEA NOT NULL)"
                      : "CREATE TABLE bench_sink (seq INTEGER PRIMARY KEY, subject TEXT NOT "
                        "NULL, body BLOB NOT NULL)");
    const char *consume_argv[] = {
        cli,
        "consume",
        "--store",
        sink.url,
        "--nats",
        nats_url,
        "--stream",
        stream,
        "--durable",
        "bench_sink",
        "--sql",
        "INSERT INTO bench_sink (seq, subject, body) VALUES (:stream_seq, :subject, :payload)",
        "--until-idle",
        "--log-level",
        "error",
        NULL};
    snprintf(name, sizeof(name), "jsdurable consume --sql (%s, %ld)", t.kind, n);
    long consume_kib = run_measured(consume_argv, name);
    int64_t rows = sql_run(&sink, "SELECT count(*) FROM bench_sink");
    int64_t distinct = sql_run(&sink, "SELECT count(DISTINCT seq) FROM bench_sink");
    if (rows != n || distinct != n) {
        fprintf(stderr, "bench_scale: %s is wrong: %lld rows (%lld distinct), want %ld\n", name,
                (long long)rows, (long long)distinct, n);
        exit(1);
    }
    const char *infix = pg ? ".postgres" : "";
    printf("rss.relay%s.max_mib %.1f MiB\n", infix, (double)relay_kib / 1024.0);
    printf("rss.consume%s.max_mib %.1f MiB\n", infix, (double)consume_kib / 1024.0);
    fflush(stdout);
    bench_stream_drop(stream);
    bench_stream_drop("BENCH_SCALE_DLQ");
    target_drop(&t);
    target_drop(&sink);
}

int main(int argc, char **argv)
{
    bench_prog = "bench_scale";
    nats_url = argc > 1 ? argv[1] : getenv("JSD_BENCH_NATS_URL");
    if (!nats_url || !*nats_url)
        bench_die("%s", "usage: bench_scale NATS_URL (or set JSD_BENCH_NATS_URL)");
    pg_base = getenv("JSD_BENCH_PG_URL");
    long base = env_count("SCALE_BASE", 100000);
    long pending = env_count("SCALE_PENDING", 1000000);
    long published = env_count("SCALE_PUBLISHED", 5000000);
    long rss_n = env_count("SCALE_RSS_MESSAGES", 1000000);
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof(tmpdir), "%s/jsd-bench-scale.XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(tmpdir))
        bench_die("cannot make a temporary folder: %s", strerror(errno));
    jsd_log_configure(JSD_LOG_ERROR, JSD_LOG_TEXT, NULL, NULL);
    bench_nats_up(nats_url);

    for (int k = 0; k < 2; k++) {
        bool pg = k == 1;
        const char *kind = pg ? "postgres" : "sqlite";
        if (!env_has("SCALE_STORES", "sqlite postgres", kind))
            continue;
        if (pg && (!pg_base || !*pg_base)) {
            fprintf(stderr, "bench_scale: PostgreSQL figures skipped: JSD_BENCH_PG_URL is not "
                            "set\n");
            continue;
        }
        char label[64];
        bool do_relay = env_has("SCALE_PARTS", "relay gc rss", "relay");
        bool do_gc = env_has("SCALE_PARTS", "relay gc rss", "gc");
        if (do_relay) {
            snprintf(label, sizeof(label), "relay.%s.scale_base", kind);
            double v[RUNS];
            for (int i = 0; i < RUNS; i++)
                v[i] = relay_pending(pg, base, label);
            printf("%s %.0f msg/s\n", label, bench_median(v, RUNS));
            fflush(stdout);
            snprintf(label, sizeof(label), "relay.%s.scale_pending", kind);
            for (int i = 0; i < RUNS; i++)
                v[i] = relay_pending(pg, pending, label);
            printf("%s %.0f msg/s\n", label, bench_median(v, RUNS));
            fflush(stdout);
        }
        if (do_relay || do_gc)
            relay_published(pg, published, base, do_relay, do_gc);
        if (env_has("SCALE_PARTS", "relay gc rss", "rss"))
            rss(pg, rss_n);
    }

    /* every store file went with its run (target_drop) */
    if (rmdir(tmpdir) != 0)
        fprintf(stderr, "bench_scale: could not remove %s: %s\n", tmpdir, strerror(errno));
    jsCtx_Destroy(bench_js);
    natsConnection_Destroy(bench_nc);
    return 0;
}
