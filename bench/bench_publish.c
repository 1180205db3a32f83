/*
 * bench_publish — publication throughput: raw nats.c js_PublishAsync with a
 * MsgId per message (the ceiling) against the bounded publisher's
 * asynchronous API on the same server, same payloads, same number in flight.
 *
 *   bench_publish NATS_URL [MESSAGES] [SUFFIX]
 *
 * Prints `raw.publish<SUFFIX> V msg/s`, `raw.publish.coalesced<SUFFIX>` (the
 * same with SendAsap off: nats.c's flusher gathers the writes, as on a
 * relay's connection), `raw.publish.best<SUFFIX>` (the faster of the two:
 * the relay ratios' ceiling), `publisher<SUFFIX> V msg/s`,
 * `publisher.ratio<SUFFIX> V x` (medians of 5 pairs of runs, in alternating order; the ratio is
 * the median of the per-pair ratios) and the client CPU per message of each
 * (`*.cpu<SUFFIX> V us/msg`, all threads, user + system). Every run
 * checks that the stream holds exactly MESSAGES messages, so a fast but lossy
 * run cannot report a figure. Uses streams of its own, deleted at the end.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <nats/nats.h>

#include "jsdurable.h"
#include "lib/bench_js.h"

#define PAYLOAD   256
#define IN_FLIGHT 1024
#define RUNS      5

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* CPU seconds (user + system, all threads) used by this process so far. */
static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static double last_cpu_us; /* client CPU per message of the last run */
static double last_srv_us; /* the server's (JSD_BENCH_NATS_PID), -1 when not known */

static int die(const char *what, natsStatus s)
{
    fprintf(stderr, "bench_publish: %s: %s\n", what, natsStatus_GetText(s));
    exit(1);
}

static void make_stream(jsCtx *js, const char *name, const char *subject)
{
    jsStreamConfig cfg;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    const char *subjects[1] = {subject};
    jsStreamConfig_Init(&cfg);
    cfg.Name = name;
    cfg.Subjects = subjects;
    cfg.SubjectsLen = 1;
    cfg.Storage = js_FileStorage;
    js_DeleteStream(js, name, NULL, &jerr);
    natsStatus s = js_AddStream(&si, js, &cfg, NULL, &jerr);
    if (s != NATS_OK)
        die("create stream", s);
    jsStreamInfo_Destroy(si);
}

static uint64_t stream_msgs(jsCtx *js, const char *name)
{
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    uint64_t n = 0;
    if (js_GetStreamInfo(&si, js, name, NULL, &jerr) == NATS_OK) {
        n = si->State.Msgs;
        jsStreamInfo_Destroy(si);
    }
    return n;
}

static int raw_errors;

static void raw_err(jsCtx *js, jsPubAckErr *pae, void *closure)
{
    (void)js;
    (void)pae;
    (void)closure;
    raw_errors++;
}

/* One raw run; coalesce: SendAsap off, so nats.c's flusher gathers the
 * writes (what a relay's connection does, jsd_conn_opts.coalesce_writes). */
static double run_raw(const char *url, jsCtx *admin, int n, int run, const char *payload,
                      bool coalesce)
{
    natsOptions *o = NULL;
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    jsOptions jo;
    char stream[64], subject[64], id[48];
    natsStatus s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = natsOptions_SetURL(o, url);
    if (s == NATS_OK)
        s = natsOptions_SetSendAsap(o, !coalesce);
    if (s == NATS_OK)
        s = natsConnection_Connect(&nc, o);
    if (s != NATS_OK)
        die("raw connect", s);
    jsOptions_Init(&jo);
    jo.PublishAsync.MaxPending = IN_FLIGHT;
    jo.PublishAsync.ErrHandler = raw_err;
    jo.PublishAsync.StallWait = 60000; /* wait for room rather than fail */
    if ((s = natsConnection_JetStream(&js, nc, &jo)) != NATS_OK)
        die("raw JetStream", s);
    snprintf(stream, sizeof(stream), "BENCH_RAW_%d_%d", (int)getpid(), run);
    snprintf(subject, sizeof(subject), "benchraw.%d.%d", (int)getpid(), run);
    make_stream(admin, stream, subject);
    raw_errors = 0;

    int64_t s0 = bench_server_cpu_us("JSD_BENCH_NATS_PID", 0);
    double t0 = now_s(), c0 = cpu_s();
    for (int i = 0; i < n; i++) {
        jsPubOptions po;
        jsPubOptions_Init(&po);
        snprintf(id, sizeof(id), "raw-%d-%d", run, i);
        po.MsgId = id;
        if ((s = js_PublishAsync(js, subject, payload, PAYLOAD, &po)) != NATS_OK)
            die("js_PublishAsync", s);
    }
    jsPubOptions cpo;
    jsPubOptions_Init(&cpo);
    cpo.MaxWait = 120000;
    if ((s = js_PublishAsyncComplete(js, &cpo)) != NATS_OK)
        die("js_PublishAsyncComplete", s);
    double secs = now_s() - t0;
    last_cpu_us = (cpu_s() - c0) * 1e6 / n;
    int64_t s1 = bench_server_cpu_us("JSD_BENCH_NATS_PID", 0);
    last_srv_us = bench_per_msg(s0, s1, n);
    uint64_t stored = stream_msgs(admin, stream);
    if (raw_errors || stored != (uint64_t)n) {
        fprintf(stderr, "bench_publish: raw run %d: %d errors, %llu of %d stored\n", run,
                raw_errors, (unsigned long long)stored, n);
        exit(1);
    }
    jsErrCode jerr = 0;
    js_DeleteStream(admin, stream, NULL, &jerr);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    natsOptions_Destroy(o);
    return n / secs;
}

static double run_publisher(const char *url, jsCtx *admin, int n, int run, const char *payload)
{
    jsd_conn_opts co;
    jsd_conn *conn = NULL;
    jsd_publisher_opts po;
    jsd_publisher *p = NULL;
    jsd_error err;
    jsd_publish_result r;
    jsd_publish_done done[256];
    char stream[64], subject[64], id[48];
    jsd_conn_opts_init(&co);
    co.servers = url;
    if (jsd_conn_open(&conn, &co, &err) != JSD_OK) {
        fprintf(stderr, "bench_publish: connect: %s\n", err.msg);
        exit(1);
    }
    snprintf(stream, sizeof(stream), "BENCH_PUB_%d_%d", (int)getpid(), run);
    snprintf(subject, sizeof(subject), "benchpub.%d.%d", (int)getpid(), run);
    make_stream(admin, stream, subject);
    jsd_publisher_opts_init(&po);
    po.stream = stream;
    po.subject = subject;
    po.admission = IN_FLIGHT;
    po.deadline_ms = 60000;
    if (jsd_publisher_bind(&p, conn, &po, &err) != JSD_OK) {
        fprintf(stderr, "bench_publish: bind: %s\n", err.msg);
        exit(1);
    }

    int accepted = 0, other = 0;
    int64_t s0 = bench_server_cpu_us("JSD_BENCH_NATS_PID", 0);
    double t0 = now_s(), c0 = cpu_s();
    for (int i = 0; i < n;) {
        snprintf(id, sizeof(id), "pub-%d-%d", run, i);
        if (jsd_publish_submit(p, id, payload, PAYLOAD, NULL, 0, NULL, &r)) {
            i++;
            continue;
        }
        if (r.outcome != JSD_OUTCOME_RETRYABLE) {
            fprintf(stderr, "bench_publish: submit: %s: %s\n", jsd_outcome_str(r.outcome),
                    r.reason);
            exit(1);
        }
        size_t got = jsd_publisher_poll(p, done, 256, -1);
        for (size_t k = 0; k < got; k++)
            done[k].result.outcome == JSD_OUTCOME_ACCEPTED ? accepted++ : other++;
    }
    while (jsd_publisher_inflight(p) > 0) {
        size_t got = jsd_publisher_poll(p, done, 256, -1);
        for (size_t k = 0; k < got; k++)
            done[k].result.outcome == JSD_OUTCOME_ACCEPTED ? accepted++ : other++;
    }
    double secs = now_s() - t0;
    last_cpu_us = (cpu_s() - c0) * 1e6 / n;
    int64_t s1 = bench_server_cpu_us("JSD_BENCH_NATS_PID", 0);
    last_srv_us = bench_per_msg(s0, s1, n);
    uint64_t stored = stream_msgs(admin, stream);
    if (other || accepted != n || stored != (uint64_t)n) {
        fprintf(stderr, "bench_publish: publisher run %d: %d accepted, %d other, %llu stored\n",
                run, accepted, other, (unsigned long long)stored);
        exit(1);
    }
    jsd_publisher_destroy(p);
    jsd_conn_close(conn);
    jsErrCode jerr = 0;
    js_DeleteStream(admin, stream, NULL, &jerr);
    return n / secs;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_publish NATS_URL [MESSAGES] [SUFFIX]\n");
        return 64;
    }
    const char *url = argv[1];
    int n = argc > 2 ? (int)strtol(argv[2], NULL, 10) : 100000;
    const char *suffix = argc > 3 ? argv[3] : "";
    if (n <= 0)
        n = 100000;
    char payload[PAYLOAD];
    for (int i = 0; i < PAYLOAD; i++)
        payload[i] = (char)('a' + i % 26);

    natsConnection *nc = NULL;
    jsCtx *admin = NULL;
    natsStatus s = natsConnection_ConnectTo(&nc, url);
    if (s == NATS_OK)
        s = natsConnection_JetStream(&admin, nc, NULL);
    if (s != NATS_OK)
        die("admin connection", s);

    double raw[RUNS], pub[RUNS], ratio[RUNS], raw_cpu[RUNS], pub_cpu[RUNS];
    double rawc[RUNS], rawc_cpu[RUNS], raw_srv[RUNS], pub_srv[RUNS], rawc_srv[RUNS];
    /* triples in rotating order, so no kind always follows another's stream
     * deletion */
    for (int r = 0; r < RUNS; r++) {
        for (int k = 0; k < 3; k++) {
            switch ((r + k) % 3) {
            case 0:
                raw[r] = run_raw(url, admin, n, r, payload, false);
                raw_cpu[r] = last_cpu_us;
                raw_srv[r] = last_srv_us;
                break;
            case 1:
                pub[r] = run_publisher(url, admin, n, r, payload);
                pub_cpu[r] = last_cpu_us;
                pub_srv[r] = last_srv_us;
                break;
            default:
                rawc[r] = run_raw(url, admin, n, RUNS + r, payload, true);
                rawc_cpu[r] = last_cpu_us;
                rawc_srv[r] = last_srv_us;
                break;
            }
        }
        ratio[r] = pub[r] / raw[r];
    }
    double raw_m = bench_median(raw, RUNS), rawc_m = bench_median(rawc, RUNS);
    printf("raw.publish%s %.0f msg/s\n", suffix, raw_m);
    printf("raw.publish.coalesced%s %.0f msg/s\n", suffix, rawc_m);
    /* the relay's ceiling: the faster of the two ways to write */
    printf("raw.publish.best%s %.0f msg/s\n", suffix, raw_m > rawc_m ? raw_m : rawc_m);
    printf("publisher%s %.0f msg/s\n", suffix, bench_median(pub, RUNS));
    printf("publisher.ratio%s %.2f x\n", suffix, bench_median(ratio, RUNS));
    /* client CPU (all threads) per message: steadier than msg/s on a busy
     * machine, and it shows what the publisher adds */
    printf("raw.publish.cpu%s %.2f us/msg\n", suffix, bench_median(raw_cpu, RUNS));
    printf("raw.publish.coalesced.cpu%s %.2f us/msg\n", suffix, bench_median(rawc_cpu, RUNS));
    printf("publisher.cpu%s %.2f us/msg\n", suffix, bench_median(pub_cpu, RUNS));
    /* the server's CPU per message, when its process id was given: where
     * the machine's cores go (docs/PERFORMANCE.md, the CPU budget) */
    if (raw_srv[0] >= 0) {
        printf("raw.publish.server.cpu%s %.2f us/msg\n", suffix, bench_median(raw_srv, RUNS));
        printf("raw.publish.coalesced.server.cpu%s %.2f us/msg\n", suffix,
               bench_median(rawc_srv, RUNS));
        printf("publisher.server.cpu%s %.2f us/msg\n", suffix, bench_median(pub_srv, RUNS));
    }
    jsCtx_Destroy(admin);
    natsConnection_Destroy(nc);
    nats_Close();
    return 0;
}
