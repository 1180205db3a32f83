/*
 * The fault proxy (FIX-2) against a real nats-server, with raw nats.c: in
 * pass mode JetStream works through it; drop-first-puback loses exactly the
 * first PubAck while the server stores the message (and a retry with the same
 * MsgId is a duplicate); withhold-acks loses them all; cut and cut-after close
 * connections; pause stalls and pass releases; large frames split across reads
 * and many connections pass unaltered.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nats/nats.h>

#include "fixture.h"
#include "proxy.h"
#include "test.h"

static volatile int disconnected;
static void on_disconnect(natsConnection *nc, void *closure)
{
    (void)nc, (void)closure;
    disconnected = 1;
}

static natsConnection *connect_to(const char *url, bool watch)
{
    natsOptions *o = NULL;
    natsConnection *nc = NULL;
    natsStatus s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = natsOptions_SetURL(o, url);
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(o, 2000);
    if (s == NATS_OK)
        s = natsOptions_SetSendAsap(o, true);
    if (s == NATS_OK)
        s = natsOptions_SetAllowReconnect(o, false);
    if (s == NATS_OK && watch)
        s = natsOptions_SetDisconnectedCB(o, on_disconnect, NULL);
    if (s == NATS_OK)
        s = natsConnection_Connect(&nc, o);
    natsOptions_Destroy(o);
    if (s != NATS_OK)
        fail_msg("connect %s: %s", url, natsStatus_GetText(s));
    return nc;
}

/* js_Publish with a MsgId and a MaxWait; *dup receives the ack's duplicate. */
static natsStatus publish_id(natsConnection *nc, const char *subj, const char *data,
                             const char *msg_id, int64_t wait_ms, bool *dup, uint64_t *seq)
{
    jsCtx *js = NULL;
    jsPubAck *pa = NULL;
    jsPubOptions po;
    jsErrCode jerr = 0;
    ASSERT_EQ(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    jsPubOptions_Init(&po);
    po.MsgId = msg_id;
    po.MaxWait = wait_ms;
    natsStatus s = js_Publish(&pa, js, subj, data, (int)strlen(data), &po, &jerr);
    if (s == NATS_OK) {
        if (dup)
            *dup = pa->Duplicate;
        if (seq)
            *seq = pa->Sequence;
    }
    jsPubAck_Destroy(pa);
    jsCtx_Destroy(js);
    return s;
}

typedef struct env {
    jsd_fx_nats fx;
    jsd_fx_proxy px;
    natsConnection *direct; /* straight to the server */
    natsConnection *via;    /* through the proxy */
} env;

static void env_up(env *e, const char *stream, const char *subject)
{
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &e->fx), 0);
    ASSERT_EQ(jsd_fx_proxy_start(e->fx.port, "pass", &e->px), 0);
    e->direct = connect_to(e->fx.url, false);
    jsd_fx_add_stream(e->direct, stream, subject);
    disconnected = 0;
    e->via = connect_to(e->px.url, true);
}

static void env_down(env *e)
{
    natsConnection_Destroy(e->via);
    natsConnection_Destroy(e->direct);
    jsd_fx_proxy_stop(&e->px);
}

static void pass_mode_publishes(void **state)
{
    (void)state;
    env e;
    bool dup = true;
    uint64_t seq = 0;
    env_up(&e, "FP1", "fp1.>");
    ASSERT_EQ(publish_id(e.via, "fp1.a", "hello", "id-1", 2000, &dup, &seq), NATS_OK);
    ASSERT_TRUE(!dup);
    ASSERT_EQ(seq, 1);
    ASSERT_EQ(jsd_fx_stream_msgs(e.direct, "FP1"), 1);
    jsd_fx_proxy_stats st;
    ASSERT_EQ(jsd_fx_proxy_stats_get(&e.px, &st), 0);
    ASSERT_STREQ(st.mode, "pass");
    ASSERT_EQ(st.conns, 1);
    ASSERT_EQ(st.dropped_acks, 0);
    ASSERT_TRUE(st.c2s > 0 && st.s2c > 0);
    env_down(&e);
}

static void drop_first_puback_loses_ack_not_message(void **state)
{
    (void)state;
    env e;
    bool dup = false;
    uint64_t seq = 0;
    env_up(&e, "FP2", "fp2.>");
    ASSERT_EQ(jsd_fx_proxy_mode(&e.px, "drop-first-puback"), 0);

    ASSERT_EQ(publish_id(e.via, "fp2.a", "payload-1", "order-1", 500, NULL, NULL), NATS_TIMEOUT);
    ASSERT_WAIT(jsd_fx_proxy_dropped_acks(&e.px) == 1, 5000);
    /* the server stored it all the same */
    ASSERT_EQ(jsd_fx_stream_msgs(e.direct, "FP2"), 1);
    jsCtx *js = NULL;
    natsMsg *m = NULL;
    ASSERT_EQ(natsConnection_JetStream(&js, e.direct, NULL), NATS_OK);
    ASSERT_EQ(js_GetMsg(&m, js, "FP2", 1, NULL, NULL), NATS_OK);
    ASSERT_EQ(natsMsg_GetDataLength(m), 9);
    ASSERT_TRUE(!memcmp(natsMsg_GetData(m), "payload-1", 9));
    natsMsg_Destroy(m);
    jsCtx_Destroy(js);

    /* the proxy is back to pass: the retry is acknowledged as a duplicate */
    jsd_fx_proxy_stats st;
    ASSERT_EQ(jsd_fx_proxy_stats_get(&e.px, &st), 0);
    ASSERT_STREQ(st.mode, "pass");
    ASSERT_EQ(publish_id(e.via, "fp2.a", "payload-1", "order-1", 2000, &dup, &seq), NATS_OK);
    ASSERT_TRUE(dup);
    ASSERT_EQ(seq, 1);
    ASSERT_EQ(jsd_fx_stream_msgs(e.direct, "FP2"), 1);
    ASSERT_EQ(jsd_fx_proxy_dropped_acks(&e.px), 1);
    env_down(&e);
}

static void withhold_acks_times_out_every_publish(void **state)
{
    (void)state;
    env e;
    char id[32];
    env_up(&e, "FP3", "fp3.>");
    ASSERT_EQ(jsd_fx_proxy_mode(&e.px, "withhold-acks"), 0);
    for (int i = 0; i < 3; i++) {
        snprintf(id, sizeof(id), "w-%d", i);
        ASSERT_EQ(publish_id(e.via, "fp3.a", "x", id, 300, NULL, NULL), NATS_TIMEOUT);
    }
    /* a late ack (a slow fsync) is dropped too, whenever it comes */
    ASSERT_WAIT(jsd_fx_proxy_dropped_acks(&e.px) == 3, 5000);
    ASSERT_EQ(jsd_fx_stream_msgs(e.direct, "FP3"), 3);
    /* core traffic still flows: PING/PONG are not acks */
    ASSERT_EQ(natsConnection_FlushTimeout(e.via, 2000), NATS_OK);
    ASSERT_EQ(jsd_fx_proxy_mode(&e.px, "pass"), 0);
    ASSERT_EQ(publish_id(e.via, "fp3.a", "x", "w-9", 2000, NULL, NULL), NATS_OK);
    env_down(&e);
}

static void cut_disconnects_client(void **state)
{
    (void)state;
    env e;
    env_up(&e, "FP4", "fp4.>");
    ASSERT_EQ(natsConnection_FlushTimeout(e.via, 2000), NATS_OK);
    ASSERT_EQ(jsd_fx_proxy_cut(&e.px), 0);
    ASSERT_WAIT(disconnected, 5000);
    ASSERT_WAIT(natsConnection_IsClosed(e.via), 5000);
    /* new connections pass again */
    natsConnection *again = connect_to(e.px.url, false);
    ASSERT_EQ(publish_id(again, "fp4.a", "x", "c-1", 2000, NULL, NULL), NATS_OK);
    natsConnection_Destroy(again);
    env_down(&e);
}

static void pause_stalls_then_pass_releases(void **state)
{
    (void)state;
    env e;
    env_up(&e, "FP5", "fp5.>");
    ASSERT_EQ(jsd_fx_proxy_mode(&e.px, "pause"), 0);
    ASSERT_EQ(publish_id(e.via, "fp5.a", "x", "p-1", 300, NULL, NULL), NATS_TIMEOUT);
    ASSERT_EQ(jsd_fx_stream_msgs(e.direct, "FP5"), 0); /* the publish is held in the proxy */
    ASSERT_EQ(jsd_fx_proxy_mode(&e.px, "pass"), 0);
    ASSERT_WAIT(jsd_fx_stream_msgs(e.direct, "FP5") == 1, 5000);
    ASSERT_EQ(publish_id(e.via, "fp5.a", "y", "p-2", 2000, NULL, NULL), NATS_OK);
    ASSERT_EQ(jsd_fx_stream_msgs(e.direct, "FP5"), 2);
    ASSERT_TRUE(!disconnected);
    env_down(&e);
}

/* cut-after N: exactly N more server bytes reach the client, then EOF. */
static void cut_after_n_bytes(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    jsd_fx_proxy px;
    char buf[8192];
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    ASSERT_EQ(jsd_fx_proxy_start(fx.port, NULL, &px), 0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)px.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    /* read the INFO line (pass) */
    size_t got = 0;
    while (!memmem(buf, got, "\r\n", 2)) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        ASSERT_TRUE(poll(&p, 1, 5000) == 1);
        ssize_t n = read(fd, buf + got, sizeof(buf) - got);
        ASSERT_TRUE(n > 0);
        got += (size_t)n;
    }
    ASSERT_TRUE(!memcmp(buf, "INFO ", 5));
    ASSERT_EQ(jsd_fx_proxy_mode(&px, "cut-after 7"), 0);
    static const char hello[] = "CONNECT {\"verbose\":false}\r\nPING\r\nPING\r\n";
    ASSERT_EQ(write(fd, hello, sizeof(hello) - 1), (ssize_t)(sizeof(hello) - 1));
    /* two PONG\r\n (12 bytes) are due; only 7 arrive, then EOF */
    got = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        ASSERT_TRUE(poll(&p, 1, 5000) == 1);
        ssize_t n = read(fd, buf + got, sizeof(buf) - got);
        ASSERT_TRUE(n >= 0);
        if (n == 0)
            break;
        got += (size_t)n;
    }
    ASSERT_EQ(got, 7);
    ASSERT_TRUE(!memcmp(buf, "PONG\r\nP", 7));
    close(fd);
    jsd_fx_proxy_stats st;
    ASSERT_EQ(jsd_fx_proxy_stats_get(&px, &st), 0);
    ASSERT_STREQ(st.mode, "pass");
    ASSERT_EQ(st.conns, 0);
    jsd_fx_proxy_stop(&px);
}

/* A 900 kB message is split over many reads; the parser must still forward
 * it byte for byte while it looks for PubAcks, on many connections at once. */
static void large_frames_and_many_connections(void **state)
{
    (void)state;
    env e;
    enum { N = 16 };
    env_up(&e, "FP7", "fp7.>");
    ASSERT_EQ(jsd_fx_proxy_mode(&e.px, "withhold-acks"), 0);

    size_t big = 900 * 1024;
    char *payload = malloc(big);
    ASSERT_TRUE(payload != NULL);
    for (size_t i = 0; i < big; i++)
        payload[i] = (char)("\r\nMSG {\"stream\":\"seq\":"[i % 23]);
    natsConnection *subs[N];
    natsSubscription *sub[N];
    for (int i = 0; i < N; i++) {
        subs[i] = connect_to(e.px.url, false);
        ASSERT_EQ(natsConnection_SubscribeSync(&sub[i], subs[i], "core.big"), NATS_OK);
        ASSERT_EQ(natsConnection_FlushTimeout(subs[i], 2000), NATS_OK);
    }
    ASSERT_EQ(natsConnection_Publish(e.direct, "core.big", payload, (int)big), NATS_OK);
    ASSERT_EQ(natsConnection_FlushTimeout(e.direct, 5000), NATS_OK);
    for (int i = 0; i < N; i++) {
        natsMsg *m = NULL;
        ASSERT_EQ(natsSubscription_NextMsg(&m, sub[i], 10000), NATS_OK);
        ASSERT_EQ(natsMsg_GetDataLength(m), big);
        ASSERT_TRUE(!memcmp(natsMsg_GetData(m), payload, big));
        natsMsg_Destroy(m);
        natsSubscription_Destroy(sub[i]);
    }
    /* and JetStream acks on those connections are still withheld */
    ASSERT_EQ(publish_id(subs[0], "fp7.a", "x", "big-1", 300, NULL, NULL), NATS_TIMEOUT);
    ASSERT_WAIT(jsd_fx_proxy_dropped_acks(&e.px) == 1, 5000);
    for (int i = 0; i < N; i++)
        natsConnection_Destroy(subs[i]);
    free(payload);
    env_down(&e);
}

JSD_TEST_MAIN(cmocka_unit_test(pass_mode_publishes),
              cmocka_unit_test(drop_first_puback_loses_ack_not_message),
              cmocka_unit_test(withhold_acks_times_out_every_publish),
              cmocka_unit_test(cut_disconnects_client),
              cmocka_unit_test(pause_stalls_then_pass_releases),
              cmocka_unit_test(cut_after_n_bytes),
              cmocka_unit_test(large_frames_and_many_connections))
