/* bench_js — see bench_js.h. */
#include "bench_js.h"

#include <dirent.h>
#include <stdbool.h>
#include <unistd.h>

#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#include <libpq-fe.h>

const char *bench_prog = "bench";
natsConnection *bench_nc;
jsCtx *bench_js;

int64_t bench_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t bench_cpu_us(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (int64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000 + ru.ru_utime.tv_usec +
           ru.ru_stime.tv_usec;
}

/* Up to max numbers from p, separated by blanks, into v; how many were read. */
static int numbers(const char *p, long long *v, int max)
{
    int n = 0;
    while (n < max) {
        char *end = NULL;
        long long x = strtoll(p, &end, 10);
        if (end == p)
            break;
        v[n++] = x;
        p = end;
    }
    return n;
}

/* Fields 4 (ppid) and 14-17 (utime, stime, cutime, cstime, in clock ticks)
 * of /proc/<pid>/stat; the command name (field 2) may hold spaces and
 * parentheses, so fields are counted from its closing parenthesis, after
 * the one-letter state (field 3). */
static int proc_stat(long pid, long *ppid, long long t[4])
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    if (!p || !p[1] || !p[2] || !p[3])
        return -1;
    long long v[14]; /* fields 4..17 */
    if (numbers(p + 4, v, 14) != 14)
        return -1;
    *ppid = (long)v[0];
    for (int i = 0; i < 4; i++)
        t[i] = v[10 + i];
    return 0;
}

int64_t bench_server_cpu_us(const char *pid_env, int tree)
{
    const char *v = getenv(pid_env);
    long pid = v ? strtol(v, NULL, 10) : 0;
    long ppid;
    long long t[4];
    if (pid <= 0 || proc_stat(pid, &ppid, t) != 0)
        return -1;
    long long ticks = t[0] + t[1];
    if (tree) {
        ticks += t[2] + t[3];
        DIR *d = opendir("/proc");
        struct dirent *de;
        while (d && (de = readdir(d)) != NULL) {
            char *end = NULL;
            long child = strtol(de->d_name, &end, 10);
            long long ct[4];
            if (child > 0 && !*end && proc_stat(child, &ppid, ct) == 0 && ppid == pid)
                ticks += ct[0] + ct[1];
        }
        if (d)
            closedir(d);
    }
    long hz = sysconf(_SC_CLK_TCK);
    return hz > 0 ? (int64_t)(ticks * 1000000 / hz) : -1;
}

double bench_per_msg(int64_t before, int64_t after, int n)
{
    return before >= 0 && after >= before && n > 0 ? (double)(after - before) / n : -1;
}

int bench_machine_ticks(long long *busy, long long *all)
{
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return 0;
    char line[256];
    long long v[8];
    bool ok = fgets(line, sizeof(line), f) && strncmp(line, "cpu ", 4) == 0 &&
              numbers(line + 4, v, 8) == 8;
    fclose(f);
    if (!ok)
        return 0;
    /* user nice system idle iowait irq softirq steal (guest time is in user) */
    *all = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
    *busy = *all - v[3] - v[4];
    return 1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, size_t n)
{
    qsort(v, n, sizeof(double), cmp_double);
    return v[n / 2];
}

void bench_die(const char *fmt, const char *detail)
{
    fprintf(stderr, "%s: ", bench_prog);
    fprintf(stderr, fmt, detail);
    fputc('\n', stderr);
    exit(1);
}

void bench_nats_up(const char *url)
{
    natsOptions *o = NULL;
    if (natsOptions_Create(&o) != NATS_OK || natsOptions_SetURL(o, url) != NATS_OK)
        bench_die("bad NATS URL %s", url);
    natsStatus s = natsConnection_Connect(&bench_nc, o);
    natsOptions_Destroy(o);
    if (s != NATS_OK)
        bench_die("cannot connect: %s", natsStatus_GetText(s));
    if (natsConnection_JetStream(&bench_js, bench_nc, NULL) != NATS_OK)
        bench_die("%s", "no JetStream context");
}

void bench_stream_make(const char *name, const char *subject)
{
    jsStreamConfig c;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    const char *subjects[1] = {subject};
    jsStreamConfig_Init(&c);
    c.Name = name;
    c.Subjects = subjects;
    c.SubjectsLen = 1;
    c.Storage = js_FileStorage;
    c.Duplicates = (int64_t)120 * 1000 * 1000 * 1000;
    js_DeleteStream(bench_js, name, NULL, &jerr);
    natsStatus s = js_AddStream(&si, bench_js, &c, NULL, &jerr);
    if (s != NATS_OK)
        bench_die("create stream: %s", natsStatus_GetText(s));
    jsStreamInfo_Destroy(si);
}

void bench_stream_make_atomic(const char *name, const char *subject)
{
    /* nats.c 3.4.1 knows no allow_atomic: the stream is created over the
     * server's own API, as the library's topology does (src/streams.c) */
    char api[200], body[400];
    natsMsg *reply = NULL;
    jsErrCode jerr = 0;
    js_DeleteStream(bench_js, name, NULL, &jerr);
    snprintf(api, sizeof(api), "$JS.API.STREAM.CREATE.%s", name);
    const char *r = getenv("BENCH_REPLICAS");
    int replicas = r && atoi(r) >= 1 && atoi(r) <= 5 ? atoi(r) : 1;
    int n = snprintf(body, sizeof(body),
                     "{\"name\":\"%s\",\"subjects\":[\"%s\"],\"storage\":\"file\","
                     "\"num_replicas\":%d,\"duplicate_window\":120000000000,"
                     "\"allow_atomic\":true}",
                     name, subject, replicas);
    natsStatus s = natsConnection_Request(&reply, bench_nc, api, body, n, 10000);
    if (s != NATS_OK)
        bench_die("create atomic stream: %s", natsStatus_GetText(s));
    const char *d = natsMsg_GetData(reply);
    if (!d || strstr(d, "\"error\"") || !strstr(d, "\"allow_atomic\":true"))
        bench_die("create atomic stream: the server said %s", d ? d : "nothing");
    natsMsg_Destroy(reply);
}

uint64_t bench_stream_msgs(const char *name)
{
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    if (js_GetStreamInfo(&si, bench_js, name, NULL, &jerr) != NATS_OK)
        bench_die("stream info %s", name);
    uint64_t n = si->State.Msgs;
    jsStreamInfo_Destroy(si);
    return n;
}

void bench_stream_drop(const char *name)
{
    jsErrCode jerr = 0;
    js_DeleteStream(bench_js, name, NULL, &jerr);
}

void bench_pg_create(const char *base_url, const char *name, char *url, size_t cap)
{
    PGconn *pg = PQconnectdb(base_url);
    if (PQstatus(pg) != CONNECTION_OK)
        bench_die("PostgreSQL: %s", PQerrorMessage(pg));
    char sql[200];
    snprintf(sql, sizeof(sql), "CREATE DATABASE %s", name);
    PGresult *r = PQexec(pg, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        bench_die("create database: %s", PQerrorMessage(pg));
    PQclear(r);
    PQfinish(pg);
    /* postgresql://user@host:port/db?params -> .../name?params */
    const char *scheme = strstr(base_url, "://");
    const char *slash = scheme ? strchr(scheme + 3, '/') : NULL;
    const char *q = strchr(base_url, '?');
    if (!slash)
        bench_die("cannot place a database name in %s", "the PostgreSQL URL");
    snprintf(url, cap, "%.*s/%s%s", (int)(slash - base_url), base_url, name, q ? q : "");
}

void bench_pg_drop(const char *base_url, const char *name)
{
    PGconn *pg = PQconnectdb(base_url);
    char sql[200];
    snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s", name);
    PQclear(PQexec(pg, sql));
    PQfinish(pg);
}

jsd_store *bench_store_open(const char *url)
{
    jsd_store *s = NULL;
    jsd_error err;
    jsd_error_clear(&err);
    if (jsd_store_open(&s, url, &err) != JSD_OK)
        bench_die("cannot open the store: %s", err.msg);
    return s;
}

jsd_conn *bench_conn_open(const char *nats_url, const char *write_each_env)
{
    jsd_conn_opts o;
    jsd_conn_opts_init(&o);
    o.servers = nats_url;
    const char *each = getenv(write_each_env);
    o.coalesce_writes = each && !strcmp(each, "1") ? 0 : 1;
    jsd_conn *c = NULL;
    jsd_error err;
    jsd_error_clear(&err);
    if (jsd_conn_open(&c, &o, &err) != JSD_OK)
        bench_die("cannot connect: %s", err.msg);
    return c;
}
