/*
 * How the publication engine reads replies it cannot trust (PUB-4): a test
 * responder on a subject no stream captures answers each publication with a
 * crafted reply — foreign stream, malformed JSON, zero or non-numeric
 * sequence, 4xx and 5xx JetStream errors, a bare status — and the engine must
 * settle each as the rules say, never as ACCEPTED unless the reply names the
 * expected stream with a positive sequence. JetStream itself never sends
 * most of these; the point is what the engine does when something does. The
 * responder also checks the headers every publication carries.
 */
#include <pthread.h>
#include <stdlib.h>

#include "pubengine.h"
#include "publisher_env.h"
#include "streams.h"

typedef struct responder {
    natsConnection *nc;
    pthread_mutex_t lk;
    int seen;
    int bad_headers;
    char last_lss[32];
} responder;

static const struct {
    const char *id;
    const char *reply; /* NULL: answer with a bare status 408 */
} cases[] = {
    {"ok", "{\"stream\":\"EXPECTED\",\"seq\":7,\"duplicate\":true}"},
    {"spaced", "{\"stream\":\"EXPECTED\", \"seq\":8,\"duplicate\": false}"},
    {"domain", "{\"stream\":\"EXPECTED\", \"domain\":\"hub\", \"seq\":9}"},
    {"trailing", "{\"stream\":\"EXPECTED\",\"seq\":7} x"},
    {"foreign", "{\"stream\":\"OTHER\",\"seq\":5}"},
    {"malformed", "this is not json"},
    {"zero-seq", "{\"stream\":\"EXPECTED\",\"seq\":0}"},
    {"string-seq", "{\"stream\":\"EXPECTED\",\"seq\":\"7\"}"},
    {"dup-not-bool", "{\"stream\":\"EXPECTED\",\"seq\":7,\"duplicate\":\"yes\"}"},
    {"err-400",
     "{\"error\":{\"code\":400,\"err_code\":10071,\"description\":\"wrong last sequence: 3\"}}"},
    {"err-503", "{\"error\":{\"code\":503,\"err_code\":10077,\"description\":\"store failed\"}}"},
    {"array", "[1,2,3]"},
    {"status", NULL},
    {"silent", ""}, /* never answered */
};

static void on_request(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    responder *r = closure;
    const char *id = NULL, *es = NULL, *lss = NULL;
    (void)sub;
    natsMsgHeader_Get(msg, "Nats-Msg-Id", &id);
    natsMsgHeader_Get(msg, "Nats-Expected-Stream", &es);
    pthread_mutex_lock(&r->lk);
    r->seen++;
    if (!id || !es || strcmp(es, "EXPECTED") != 0)
        r->bad_headers++;
    if (natsMsgHeader_Get(msg, "Nats-Expected-Last-Subject-Sequence", &lss) == NATS_OK)
        snprintf(r->last_lss, sizeof(r->last_lss), "%s", lss);
    pthread_mutex_unlock(&r->lk);
    for (size_t i = 0; id && i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (strcmp(cases[i].id, id) != 0)
            continue;
        if (!cases[i].reply) {
            natsMsg *st = NULL;
            natsMsg_Create(&st, natsMsg_GetReply(msg), NULL, NULL, 0);
            natsMsgHeader_Set(st, "Status", "408");
            natsConnection_PublishMsg(nc, st);
            natsMsg_Destroy(st);
        } else if (*cases[i].reply) {
            natsConnection_PublishString(nc, natsMsg_GetReply(msg), cases[i].reply);
        }
        /* a stray reply on the same inbox with an id that is not in flight */
        char stray[256];
        snprintf(stray, sizeof(stray), "%s", natsMsg_GetReply(msg));
        char *dot = strrchr(stray, '.');
        if (dot) {
            snprintf(dot + 1, sizeof(stray) - (size_t)(dot + 1 - stray), "999999999");
            natsConnection_PublishString(nc, stray, "{\"stream\":\"EXPECTED\",\"seq\":1}");
        }
    }
    natsMsg_Destroy(msg);
}

static jsd_outcome one(jsd__pubengine *e, const char *subject, const char *id,
                       jsd_publish_result *res, int deadline_ms)
{
    jsd_publish_done d;
    jsd__pub_req req = {.subject = subject,
                        .expected_stream = "EXPECTED",
                        .msg_id = id,
                        .payload = "x",
                        .len = 1,
                        .deadline_ms = deadline_ms};
    if (!jsd__pubengine_submit(e, &req, res))
        return res->outcome;
    size_t n = 0;
    int64_t t0 = jsd_test_mono_ms();
    while (n == 0 && jsd_test_mono_ms() - t0 < deadline_ms + 5000)
        n = jsd__pubengine_poll(e, &d, 1, 500);
    if (n != 1)
        fail_msg("no outcome for %s", id);
    *res = d.result;
    return res->outcome;
}

static void crafted_replies(void **state)
{
    (void)state;
    const char *url = jsd_fx_shared_nats_url();
    responder r = {0};
    natsSubscription *sub = NULL;
    char subject[128];
    pthread_mutex_init(&r.lk, NULL);
    r.nc = ph_direct(url, NULL, NULL);
    snprintf(subject, sizeof(subject), "%s.x", jsd_test_unique("fake"));
    ASSERT_EQ(natsConnection_Subscribe(&sub, r.nc, subject, on_request, &r), NATS_OK);
    ASSERT_EQ(natsConnection_FlushTimeout(r.nc, 3000), NATS_OK);

    jsd_conn *c = ph_open(url);
    jsd__pubengine *e = NULL;
    jsd_error err;
    jsd__pubengine_opts eo = {.admission = 4, .deadline_ms = 3000};
    ASSERT_OK_E(jsd__pubengine_create(&e, c, &eo, &err), err.msg);
    jsd_publish_result res;

    ASSERT_OUTCOME(one(e, subject, "ok", &res, 3000), JSD_OUTCOME_ACCEPTED, res);
    ASSERT_EQ(res.receipt.seq, 7);
    ASSERT_EQ(res.receipt.duplicate, true);
    ASSERT_STREQ(res.receipt.stream, "EXPECTED");

    ASSERT_OUTCOME(one(e, subject, "spaced", &res, 3000), JSD_OUTCOME_ACCEPTED, res);
    ASSERT_EQ(res.receipt.seq, 8);
    ASSERT_EQ(res.receipt.duplicate, false);
    ASSERT_OUTCOME(one(e, subject, "domain", &res, 3000), JSD_OUTCOME_ACCEPTED, res);
    ASSERT_EQ(res.receipt.seq, 9);
    ASSERT_OUTCOME(one(e, subject, "trailing", &res, 3000), JSD_OUTCOME_UNKNOWN, res);
    ASSERT_OUTCOME(one(e, subject, "foreign", &res, 3000), JSD_OUTCOME_UNKNOWN, res);
    ASSERT_CONTAINS(res.reason, "foreign acknowledgement naming stream \"OTHER\"");
    ASSERT_OUTCOME(one(e, subject, "malformed", &res, 3000), JSD_OUTCOME_UNKNOWN, res);
    ASSERT_CONTAINS(res.reason, "malformed");
    ASSERT_OUTCOME(one(e, subject, "zero-seq", &res, 3000), JSD_OUTCOME_UNKNOWN, res);
    ASSERT_OUTCOME(one(e, subject, "string-seq", &res, 3000), JSD_OUTCOME_UNKNOWN, res);
    ASSERT_OUTCOME(one(e, subject, "dup-not-bool", &res, 3000), JSD_OUTCOME_UNKNOWN, res);
    ASSERT_OUTCOME(one(e, subject, "array", &res, 3000), JSD_OUTCOME_UNKNOWN, res);

    ASSERT_OUTCOME(one(e, subject, "err-400", &res, 3000), JSD_OUTCOME_FAILED, res);
    ASSERT_EQ(res.status_code, 400);
    ASSERT_EQ(res.js_err_code, 10071);
    ASSERT_CONTAINS(res.reason, "wrong last sequence: 3");
    ASSERT_OUTCOME(one(e, subject, "err-503", &res, 3000), JSD_OUTCOME_UNKNOWN, res);
    ASSERT_EQ(res.status_code, 503);
    ASSERT_EQ(res.js_err_code, 10077);

    ASSERT_OUTCOME(one(e, subject, "status", &res, 3000), JSD_OUTCOME_UNKNOWN, res);
    ASSERT_EQ(res.status_code, 408);

    int64_t t0 = jsd_test_mono_ms();
    ASSERT_OUTCOME(one(e, subject, "silent", &res, 800), JSD_OUTCOME_UNKNOWN, res);
    ASSERT_TRUE(jsd_test_mono_ms() - t0 >= 790);
    ASSERT_CONTAINS(res.reason, "no acknowledgement within 800 ms");

    /* strays on the inbox were dropped, never attributed */
    ASSERT_WAIT(jsd__pubengine_late_replies(e) >= 10, 3000);

    /* the optional ordering header */
    jsd_publish_done d;
    jsd__pub_req req = {.subject = subject,
                        .expected_stream = "EXPECTED",
                        .msg_id = "ok",
                        .has_expected_last_subject_seq = true,
                        .expected_last_subject_seq = 41};
    ASSERT_TRUE(jsd__pubengine_submit(e, &req, &res));
    ASSERT_EQ(jsd__pubengine_poll(e, &d, 1, 5000), 1);
    pthread_mutex_lock(&r.lk);
    ASSERT_STREQ(r.last_lss, "41");
    ASSERT_EQ(r.bad_headers, 0);
    pthread_mutex_unlock(&r.lk);

    /* reserved headers cannot be passed as extra headers */
    jsd_header h = {"nats-msg-id", "x"};
    req.headers = &h;
    req.n_headers = 1;
    ASSERT_TRUE(!jsd__pubengine_submit(e, &req, &res));
    ASSERT_EQ(res.outcome, JSD_OUTCOME_REJECTED);
    ASSERT_CONTAINS(res.reason, "reserved");

    jsd__pubengine_destroy(e);
    jsd_conn_close(c);
    natsSubscription_Destroy(sub);
    natsConnection_Destroy(r.nc);
    pthread_mutex_destroy(&r.lk);
}

/* The ordering header against a real stream: the broker refuses a wrong
 * expected last sequence with 10071, and that is a known failure. */
static void expected_last_subject_sequence(void **state)
{
    (void)state;
    const char *url = jsd_fx_shared_nats_url();
    jsd_conn *c = ph_open(url);
    natsConnection *direct = ph_direct(url, NULL, NULL);
    jsCtx *js = ph_js(direct);
    char stream[96], filter[128], subject[128];
    snprintf(stream, sizeof(stream), "%s", jsd_test_unique("ORD"));
    snprintf(filter, sizeof(filter), "%s.>", stream);
    snprintf(subject, sizeof(subject), "%s.k1", stream);
    ph_add_stream(js, &(ph_stream){.name = stream, .subject = filter});
    jsd__pubengine *e = NULL;
    jsd_error err;
    jsd__pubengine_opts eo = {.admission = 4, .deadline_ms = 3000};
    ASSERT_OK_E(jsd__pubengine_create(&e, c, &eo, &err), err.msg);
    jsd_publish_result res;
    jsd_publish_done d;
    jsd__pub_req req = {.subject = subject,
                        .expected_stream = stream,
                        .msg_id = "o-1",
                        .payload = "x",
                        .len = 1,
                        .has_expected_last_subject_seq = true,
                        .expected_last_subject_seq = 5};
    ASSERT_TRUE(jsd__pubengine_submit(e, &req, &res));
    ASSERT_EQ(jsd__pubengine_poll(e, &d, 1, 5000), 1);
    ASSERT_OUTCOME(d.result.outcome, JSD_OUTCOME_FAILED, d.result);
    ASSERT_EQ(d.result.js_err_code, 10071);
    req.expected_last_subject_seq = 0; /* "nothing on this subject yet" */
    ASSERT_TRUE(jsd__pubengine_submit(e, &req, &res));
    ASSERT_EQ(jsd__pubengine_poll(e, &d, 1, 5000), 1);
    ASSERT_OUTCOME(d.result.outcome, JSD_OUTCOME_ACCEPTED, d.result);
    ASSERT_EQ(d.result.receipt.seq, 1);
    req.msg_id = "o-2";
    req.expected_last_subject_seq = 1;
    ASSERT_TRUE(jsd__pubengine_submit(e, &req, &res));
    ASSERT_EQ(jsd__pubengine_poll(e, &d, 1, 5000), 1);
    ASSERT_OUTCOME(d.result.outcome, JSD_OUTCOME_ACCEPTED, d.result);
    ASSERT_EQ(d.result.receipt.seq, 2);
    ASSERT_EQ(ph_stream_msgs(js, stream), 2);
    jsd__pubengine_destroy(e);
    jsCtx_Destroy(js);
    natsConnection_Destroy(direct);
    jsd_conn_close(c);
}

static void stream_lookup(void **state)
{
    (void)state;
    const char *url = jsd_fx_shared_nats_url();
    jsd_conn *c = ph_open(url);
    natsConnection *direct = ph_direct(url, NULL, NULL);
    jsCtx *js = ph_js(direct);
    char stream[96], filter[128], subject[128], got[130];
    jsd_error err;
    snprintf(stream, sizeof(stream), "%s", jsd_test_unique("LOOK"));
    snprintf(filter, sizeof(filter), "%s.*.x", stream);
    snprintf(subject, sizeof(subject), "%s.a.x", stream);
    ph_add_stream(js, &(ph_stream){.name = stream, .subject = filter});
    ASSERT_OK_E(jsd__stream_for_subject(c, subject, got, sizeof(got), &err), err.msg);
    ASSERT_STREQ(got, stream);
    snprintf(subject, sizeof(subject), "%s.a.y", stream);
    ASSERT_STATUS(jsd__stream_for_subject(c, subject, got, sizeof(got), &err), JSD_ERR_NOT_FOUND);
    ASSERT_CONTAINS(err.msg, "no stream captures");
    ASSERT_STATUS(jsd__stream_for_subject(c, "a.*", got, sizeof(got), &err), JSD_ERR_INVALID);

    jsd__streams *cache = NULL;
    ASSERT_OK(jsd__streams_create(&cache, c, 60000, 0, 0));
    snprintf(subject, sizeof(subject), "%s.b.x", stream);
    ASSERT_OK(jsd__streams_lookup(cache, subject, got, sizeof(got), &err));
    ASSERT_STREQ(got, stream);
    /* served from the cache even after the stream is gone ... */
    ph_delete_stream(js, stream);
    ASSERT_OK(jsd__streams_lookup(cache, subject, got, sizeof(got), &err));
    /* ... until forgotten */
    jsd__streams_forget(cache, subject);
    ASSERT_STATUS(jsd__streams_lookup(cache, subject, got, sizeof(got), &err), JSD_ERR_NOT_FOUND);
    jsd__streams_destroy(cache);
    jsCtx_Destroy(js);
    natsConnection_Destroy(direct);
    jsd_conn_close(c);
}

JSD_TEST_MAIN(cmocka_unit_test(crafted_replies), cmocka_unit_test(expected_last_subject_sequence),
              cmocka_unit_test(stream_lookup))
