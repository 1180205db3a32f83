/*
 * The NATS side of `jsdurable status` and the inspect API behind it, against
 * the run's shared JetStream server: stream depth, a durable's lag and ack
 * pending, the dead-letter marking, and a clear error for a missing stream.
 */
#include <stdlib.h>
#include <unistd.h>

#include <jansson.h>
#include <nats/nats.h>

#include "fixture.h"
#include "test.h"

static jsCtx *js;
static natsConnection *nc;

static void make_stream(const char *name, const char *subject, int msgs)
{
    jsStreamConfig cfg;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    const char *subjects[] = {subject};
    jsStreamConfig_Init(&cfg);
    cfg.Name = name;
    cfg.Subjects = subjects;
    cfg.SubjectsLen = 1;
    cfg.Storage = js_FileStorage;
    assert_int_equal(js_AddStream(&si, js, &cfg, NULL, &jerr), NATS_OK);
    jsStreamInfo_Destroy(si);
    for (int i = 0; i < msgs; i++) {
        jsPubAck *pa = NULL;
        assert_int_equal(js_Publish(&pa, js, subject, "x", 1, NULL, &jerr), NATS_OK);
        jsPubAck_Destroy(pa);
    }
}

static void setup_nats(void)
{
    assert_int_equal(natsConnection_ConnectTo(&nc, jsd_fx_shared_nats_url()), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
}

static void status_json_shows_depth_and_lag(void **state)
{
    (void)state;
    setup_nats();
    char stream[96], subject[128], cmd[2048], out[16384];
    snprintf(stream, sizeof(stream), "%s", jsd_test_unique("ST"));
    snprintf(subject, sizeof(subject), "%s.events", stream);
    make_stream(stream, subject, 5);

    /* A durable with two of the five delivered and not yet acknowledged. */
    jsConsumerConfig cc;
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    jsConsumerConfig_Init(&cc);
    cc.Durable = "lagger";
    cc.AckPolicy = js_AckExplicit;
    assert_int_equal(js_AddConsumer(&ci, js, stream, &cc, NULL, &jerr), NATS_OK);
    jsConsumerInfo_Destroy(ci);
    natsSubscription *sub = NULL;
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = stream;
    so.Consumer = "lagger";
    assert_int_equal(js_PullSubscribe(&sub, js, subject, "lagger", NULL, &so, &jerr), NATS_OK);
    natsMsgList list = {0};
    assert_int_equal(natsSubscription_Fetch(&list, sub, 2, 5000, &jerr), NATS_OK);
    ASSERT_EQ(list.Count, 2);
    natsMsgList_Destroy(&list);

    snprintf(cmd, sizeof(cmd), "%s status --nats %s --stream %s --json", jsd_fx_bin("jsdurable"),
             jsd_fx_shared_nats_url(), stream);
    int rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 0)
        fail_msg("status exited %d: %s", rc, out);
    json_error_t je;
    json_t *root = json_loads(out, 0, &je);
    if (!root)
        fail_msg("status did not print JSON: %s", out);
    json_t *s0 = json_array_get(json_object_get(json_object_get(root, "nats"), "streams"), 0);
    ASSERT_STREQ(json_string_value(json_object_get(s0, "name")), stream);
    ASSERT_EQ(json_integer_value(json_object_get(s0, "messages")), 5);
    ASSERT_TRUE(json_is_false(json_object_get(s0, "dead_letter")));
    json_t *d0 = json_array_get(json_object_get(s0, "durables"), 0);
    ASSERT_STREQ(json_string_value(json_object_get(d0, "name")), "lagger");
    ASSERT_EQ(json_integer_value(json_object_get(d0, "pending")), 3);
    ASSERT_EQ(json_integer_value(json_object_get(d0, "ack_pending")), 2);
    ASSERT_TRUE(json_object_get(root, "store") == NULL);
    json_decref(root);
    natsSubscription_Destroy(sub);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
}

static void dead_letter_stream_is_marked(void **state)
{
    (void)state;
    setup_nats();
    char stream[96], subject[160];
    snprintf(stream, sizeof(stream), "%s", jsd_test_unique("DLQ"));
    snprintf(subject, sizeof(subject), "jsd.dlq.%s.x", stream);
    make_stream(stream, subject, 2);

    jsd_conn *c = NULL;
    jsd_conn_opts o;
    jsd_error err;
    jsd_conn_opts_init(&o);
    o.servers = jsd_fx_shared_nats_url();
    ASSERT_OK_E(jsd_conn_open(&c, &o, &err), err.msg);
    jsd_stream_state st;
    ASSERT_OK_E(jsd_stream_state_get(c, stream, &st, &err), err.msg);
    ASSERT_TRUE(st.dead_letter);
    ASSERT_EQ(st.messages, 2);
    ASSERT_EQ(st.n_durables, 0);
    jsd_stream_state_clear(&st);

    /* The listing holds it too. */
    jsd_stream_state *all = NULL;
    size_t n = 0;
    ASSERT_OK_E(jsd_stream_states_list(c, &all, &n, &err), err.msg);
    bool found = false;
    for (size_t i = 0; i < n; i++)
        found = found || !strcmp(all[i].name, stream);
    ASSERT_TRUE(found);
    jsd_stream_states_free(all, n);

    ASSERT_STATUS(jsd_stream_state_get(c, "NO_SUCH_STREAM_X", &st, &err), JSD_ERR_NOT_FOUND);
    ASSERT_CONTAINS(err.msg, "NO_SUCH_STREAM_X");
    jsd_conn_close(c);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
}

static void missing_stream_is_a_clear_error(void **state)
{
    (void)state;
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof(cmd), "%s status --nats %s --stream NOPE_%d", jsd_fx_bin("jsdurable"),
             jsd_fx_shared_nats_url(), (int)getpid());
    int rc = jsd_test_run(cmd, out, sizeof(out));
    ASSERT_EQ(rc, 1);
    ASSERT_CONTAINS(out, "does not exist");
    snprintf(cmd, sizeof(cmd), "env -u JSD_NATS_URL -u JSD_STORE %s status",
             jsd_fx_bin("jsdurable"));
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 64);
}

JSD_TEST_MAIN(cmocka_unit_test(status_json_shows_depth_and_lag),
              cmocka_unit_test(dead_letter_stream_is_marked),
              cmocka_unit_test(missing_stream_is_a_clear_error))
