/*
 * bench_batch — the atomic batch ceiling: raw nats.c publications in atomic
 * batches (nats-server 2.12+, a stream with allow_atomic), each message with
 * its own Nats-Msg-Id, batches of the relay's claim size with the relay's
 * pipelining depth (its in-flight bound over its batch size), on the same
 * server as the figures it is the ceiling of.
 *
 *   bench_batch NATS_URL [MESSAGES] [SUFFIX]
 *
 * Prints `raw.batch<SUFFIX> V msg/s` (median of 3 runs) and
 * `raw.batch.cpu<SUFFIX> V us/msg` (this process's CPU per message). With
 * `sync_interval: always` a server fsyncs once per batch instead of once per
 * message, so on a durable server this is the figure a relay publishing in
 * atomic batches is measured against (docs/PERFORMANCE.md). Every run checks
 * that every commit was acknowledged with the batch's count and that the
 * stream holds exactly MESSAGES messages. Uses streams of its own, deleted
 * at the end.
 *
 * The protocol is headers on ordinary publications (Nats-Batch-Id,
 * Nats-Batch-Sequence 1..n, Nats-Batch-Commit: 1 on the last); the first
 * message carries a reply subject and is answered with an empty message, the
 * commit's reply is the PubAck with "batch" and "count".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nats/nats.h>

#include "lib/bench_js.h"

#define PAYLOAD 256
/* The relay's claim size (jsd_relay_opts.batch_size) and its in-flight bound
 * (1024) over it; BENCH_BATCH_SIZE and BENCH_BATCH_DEPTH override them. */
static int BATCH = 256, DEPTH = 4;
#define RUNS 3

static double last_cpu_us;

static void header(natsMsg *m, const char *k, const char *v)
{
    if (natsMsgHeader_Set(m, k, v) != NATS_OK)
        bench_die("header %s", k);
}

/* Take one reply; a commit's (".c.") ends a batch: returns 1, else 0. */
static int take_reply(natsSubscription *sub)
{
    natsMsg *r = NULL;
    natsStatus s = natsSubscription_NextMsg(&r, sub, 60000);
    if (s != NATS_OK)
        bench_die("no reply from the server: %s", natsStatus_GetText(s));
    const char *d = natsMsg_GetData(r);
    int len = natsMsg_GetDataLength(r);
    char text[400];
    snprintf(text, sizeof(text), "%.*s", len > 399 ? 399 : len, d ? d : "");
    if (strstr(text, "\"error\""))
        bench_die("batch refused: %s", text);
    int commit = strstr(natsMsg_GetSubject(r), ".c.") != NULL;
    if (commit && !strstr(text, "\"count\":"))
        bench_die("a commit without a count: %s", text);
    natsMsg_Destroy(r);
    return commit;
}

static double run(const char *url, int n, int r, const char *payload)
{
    natsOptions *o = NULL;
    natsConnection *nc = NULL;
    natsSubscription *sub = NULL;
    char stream[64], subject[64], prefix[64], reply[96], bid[48], num[16], id[48];
    natsStatus s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = natsOptions_SetURL(o, url);
    if (s == NATS_OK)
        s = natsOptions_SetSendAsap(o, getenv("BENCH_BATCH_ASAP") != NULL);
    if (s == NATS_OK)
        s = natsConnection_Connect(&nc, o);
    if (s != NATS_OK)
        bench_die("connect: %s", natsStatus_GetText(s));
    snprintf(prefix, sizeof(prefix), "_INBOX.bb%d.%d", (int)getpid(), r);
    snprintf(reply, sizeof(reply), "%s.>", prefix);
    if (natsConnection_SubscribeSync(&sub, nc, reply) != NATS_OK ||
        natsSubscription_SetPendingLimits(sub, -1, -1) != NATS_OK)
        bench_die("%s", "reply subscription");
    snprintf(stream, sizeof(stream), "BENCH_BATCH_%d_%d", (int)getpid(), r);
    snprintf(subject, sizeof(subject), "benchbatch.%d.%d", (int)getpid(), r);
    bench_stream_make_atomic(stream, subject);

    int batches = n / BATCH, inflight = 0;
    int64_t t0 = bench_mono_us(), c0 = bench_cpu_us();
    for (int k = 0; k < batches; k++) {
        snprintf(bid, sizeof(bid), "bb-%d-%d-%d", (int)getpid(), r, k);
        for (int i = 1; i <= BATCH; i++) {
            natsMsg *m = NULL;
            const char *rp = NULL;
            if (i == 1 || i == BATCH) {
                snprintf(reply, sizeof(reply), "%s.%c.%d", prefix, i == 1 ? 'f' : 'c', k);
                rp = reply;
            }
            if (natsMsg_Create(&m, subject, rp, payload, PAYLOAD) != NATS_OK)
                bench_die("%s", "message");
            snprintf(num, sizeof(num), "%d", i);
            snprintf(id, sizeof(id), "bb-%d-%d", r, k * BATCH + i);
            header(m, "Nats-Batch-Id", bid);
            header(m, "Nats-Batch-Sequence", num);
            header(m, "Nats-Msg-Id", id);
            if (i == BATCH)
                header(m, "Nats-Batch-Commit", "1");
            if ((s = natsConnection_PublishMsg(nc, m)) != NATS_OK)
                bench_die("publish: %s", natsStatus_GetText(s));
            natsMsg_Destroy(m);
        }
        inflight++;
        while (inflight >= DEPTH)
            inflight -= take_reply(sub);
    }
    while (inflight > 0)
        inflight -= take_reply(sub);
    double secs = (double)(bench_mono_us() - t0) / 1e6;
    int total = batches * BATCH;
    last_cpu_us = (double)(bench_cpu_us() - c0) / total;
    uint64_t stored = bench_stream_msgs(stream);
    if (stored != (uint64_t)total) {
        fprintf(stderr, "bench_batch: run %d: %llu of %d stored\n", r, (unsigned long long)stored,
                total);
        exit(1);
    }
    bench_stream_drop(stream);
    natsSubscription_Destroy(sub);
    natsConnection_Destroy(nc);
    natsOptions_Destroy(o);
    return total / secs;
}

int main(int argc, char **argv)
{
    bench_prog = "bench_batch";
    if (argc < 2) {
        fprintf(stderr, "usage: bench_batch NATS_URL [MESSAGES] [SUFFIX]\n");
        return 64;
    }
    int n = argc > 2 ? (int)strtol(argv[2], NULL, 10) : 100000;
    const char *suffix = argc > 3 ? argv[3] : "";
    if (n < BATCH)
        n = 100000;
    char payload[PAYLOAD];
    for (int i = 0; i < PAYLOAD; i++)
        payload[i] = (char)('a' + i % 26);
    const char *e = getenv("BENCH_BATCH_SIZE");
    if (e && atoi(e) >= 2 && atoi(e) <= 1000)
        BATCH = atoi(e);
    if ((e = getenv("BENCH_BATCH_DEPTH")) && atoi(e) >= 1 && atoi(e) <= 50)
        DEPTH = atoi(e);
    bench_nats_up(argv[1]);
    double v[RUNS], c[RUNS];
    for (int r = 0; r < RUNS; r++) {
        v[r] = run(argv[1], n, r, payload);
        c[r] = last_cpu_us;
    }
    printf("raw.batch%s %.0f msg/s\n", suffix, bench_median(v, RUNS));
    printf("raw.batch.cpu%s %.2f us/msg\n", suffix, bench_median(c, RUNS));
    return 0;
}
