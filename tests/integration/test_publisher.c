/*
 * The bounded publisher against a real nats-server (PUB-1..7): binding rules,
 * receipts and duplicates, limits rejected before any I/O, overload, known
 * failures (no stream, wrong expected stream) and many publications in flight.
 * Streams are made with raw nats.c; what was stored is read back over a
 * second, direct connection.
 */
#include <stdlib.h>

#include "conn_int.h"
#include "publisher_env.h"

typedef struct env {
    jsd_conn *conn;
    natsConnection *direct;
    jsCtx *js;
    char stream[96];
    char subject[128];
} env;

static void env_open(env *e, bool make_stream)
{
    memset(e, 0, sizeof(*e));
    const char *url = jsd_fx_shared_nats_url();
    e->conn = ph_open(url);
    e->direct = ph_direct(url, NULL, NULL);
    e->js = ph_js(e->direct);
    snprintf(e->stream, sizeof(e->stream), "%s", jsd_test_unique("PUB"));
    snprintf(e->subject, sizeof(e->subject), "%s.created", e->stream);
    if (make_stream) {
        char filter[140];
        snprintf(filter, sizeof(filter), "%s.>", e->stream);
        ph_add_stream(e->js, &(ph_stream){.name = e->stream, .subject = filter});
    }
}

static void env_close(env *e)
{
    jsCtx_Destroy(e->js);
    natsConnection_Destroy(e->direct);
    jsd_conn_close(e->conn);
}

static void accepted_then_duplicate(void **state)
{
    (void)state;
    env e;
    jsd_publish_result r;
    env_open(&e, true);
    jsd_publisher *p = ph_bind(e.conn, e.stream, e.subject, 16, 5000);
    ASSERT_EQ(jsd_publisher_duplicate_window_ms(p), 120000); /* the server's default, read */

    jsd_header attrs[] = {{"trace", "t-1"}, {"Nats-Msg-Id", "attempt-to-override"}};
    int64_t before = jsd_test_mono_ms();
    (void)before;
    ASSERT_OUTCOME(jsd_publish(p, "order-1", "hello", 5, attrs, 2, &r), JSD_OUTCOME_ACCEPTED, r);
    ASSERT_STREQ(r.receipt.stream, e.stream);
    ASSERT_EQ(r.receipt.seq, 1);
    ASSERT_EQ(r.receipt.duplicate, false);
    ASSERT_TRUE(r.receipt.accepted_at_ms > 0);

    /* the same id again: a duplicate naming the first sequence */
    ASSERT_OUTCOME(jsd_publish(p, "order-1", "hello", 5, NULL, 0, &r), JSD_OUTCOME_ACCEPTED, r);
    ASSERT_EQ(r.receipt.seq, 1);
    ASSERT_EQ(r.receipt.duplicate, true);

    ASSERT_OUTCOME(jsd_publish(p, "order-2", "", 0, NULL, 0, &r), JSD_OUTCOME_ACCEPTED, r);
    ASSERT_EQ(r.receipt.seq, 2);
    ASSERT_EQ(ph_stream_msgs(e.js, e.stream), 2);

    /* what was stored: the id unchanged, the attribute under the prefix, the
     * reserved header not overridden */
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    const char *v = NULL;
    ASSERT_EQ(js_GetMsg(&m, e.js, e.stream, 1, NULL, &jerr), NATS_OK);
    ASSERT_EQ(natsMsg_GetDataLength(m), 5);
    ASSERT_EQ(natsMsgHeader_Get(m, "Nats-Msg-Id", &v), NATS_OK);
    ASSERT_STREQ(v, "order-1");
    ASSERT_EQ(natsMsgHeader_Get(m, "Jsd-Attr-trace", &v), NATS_OK);
    ASSERT_STREQ(v, "t-1");
    ASSERT_EQ(natsMsgHeader_Get(m, "Jsd-Attr-Nats-Msg-Id", &v), NATS_OK);
    ASSERT_STREQ(v, "attempt-to-override");
    const char **vals = NULL;
    int nvals = 0;
    ASSERT_EQ(natsMsgHeader_Values(m, "Nats-Msg-Id", &vals, &nvals), NATS_OK);
    ASSERT_EQ(nvals, 1);
    free((void *)vals);
    natsMsg_Destroy(m);
    jsd_publisher_destroy(p);
    env_close(&e);
}

static void bind_errors_name_the_rule(void **state)
{
    (void)state;
    env e;
    jsd_publisher *p = NULL;
    jsd_publisher_opts o;
    jsd_error err;
    char mem[96], noack[96], big[300], subj[140];
    env_open(&e, true);
    snprintf(mem, sizeof(mem), "%s", jsd_test_unique("MEM"));
    snprintf(noack, sizeof(noack), "%s", jsd_test_unique("NOACK"));
    snprintf(subj, sizeof(subj), "%s.>", mem);
    ph_add_stream(e.js, &(ph_stream){.name = mem, .subject = subj, .memory = true});
    snprintf(subj, sizeof(subj), "%s.>", noack);
    ph_add_stream(e.js, &(ph_stream){.name = noack, .subject = subj, .no_ack = true});

    jsd_publisher_opts_init(&o);
    o.stream = mem;
    snprintf(subj, sizeof(subj), "%s.x", mem);
    o.subject = subj;
    ASSERT_STATUS(jsd_publisher_bind(&p, e.conn, &o, &err), JSD_ERR_BIND);
    ASSERT_CONTAINS(err.msg, "uses memory storage; bind needs file storage");
    ASSERT_TRUE(p == NULL);

    o.stream = noack;
    snprintf(subj, sizeof(subj), "%s.x", noack);
    ASSERT_STATUS(jsd_publisher_bind(&p, e.conn, &o, &err), JSD_ERR_BIND);
    ASSERT_CONTAINS(err.msg, "no_ack");

    o.stream = e.stream;
    snprintf(subj, sizeof(subj), "%s.*", e.stream);
    ASSERT_STATUS(jsd_publisher_bind(&p, e.conn, &o, &err), JSD_ERR_INVALID);
    ASSERT_CONTAINS(err.msg, "wildcard '*'");
    snprintf(subj, sizeof(subj), "%s.>", e.stream);
    ASSERT_STATUS(jsd_publisher_bind(&p, e.conn, &o, &err), JSD_ERR_INVALID);
    ASSERT_CONTAINS(err.msg, "wildcard '>'");

    snprintf(subj, sizeof(subj), "%s.bad subject", e.stream);
    ASSERT_STATUS(jsd_publisher_bind(&p, e.conn, &o, &err), JSD_ERR_INVALID);
    ASSERT_CONTAINS(err.msg, "[A-Za-z0-9_-]");
    o.stream = "bad.stream";
    snprintf(subj, sizeof(subj), "%s.x", e.stream);
    ASSERT_STATUS(jsd_publisher_bind(&p, e.conn, &o, &err), JSD_ERR_INVALID);
    ASSERT_CONTAINS(err.msg, "stream name \"bad.stream\"");

    memset(big, 'S', 129);
    big[129] = '\0';
    o.stream = big;
    ASSERT_STATUS(jsd_publisher_bind(&p, e.conn, &o, &err), JSD_ERR_INVALID);
    ASSERT_CONTAINS(err.msg, "129 bytes; the limit is 128");
    o.stream = e.stream;
    memset(big, 'a', 257);
    memcpy(big, e.stream, strlen(e.stream));
    big[strlen(e.stream)] = '.';
    big[257] = '\0';
    o.subject = big;
    ASSERT_STATUS(jsd_publisher_bind(&p, e.conn, &o, &err), JSD_ERR_INVALID);
    ASSERT_CONTAINS(err.msg, "257 bytes; the limit is 256");

    /* a subject the stream does not capture */
    o.subject = "elsewhere.x";
    ASSERT_STATUS(jsd_publisher_bind(&p, e.conn, &o, &err), JSD_ERR_BIND);
    ASSERT_CONTAINS(err.msg, "does not capture subject \"elsewhere.x\"");

    /* a missing stream is not created */
    o.stream = jsd_test_unique("MISSING");
    o.subject = "missing.x";
    ASSERT_STATUS(jsd_publisher_bind(&p, e.conn, &o, &err), JSD_ERR_NOT_FOUND);
    ASSERT_CONTAINS(err.msg, "never creates");
    ASSERT_EQ(ph_stream_msgs(e.js, o.stream), -1);

    /* the duplicate window is checked when the caller states one */
    o.stream = e.stream;
    snprintf(subj, sizeof(subj), "%s.x", e.stream);
    o.subject = subj;
    o.expected_duplicate_window_ms = 1000;
    ASSERT_STATUS(jsd_publisher_bind(&p, e.conn, &o, &err), JSD_ERR_BIND);
    ASSERT_CONTAINS(err.msg, "duplicate window of 120000 ms; the binding expects 1000 ms");
    o.expected_duplicate_window_ms = 120000;
    ASSERT_OK_E(jsd_publisher_bind(&p, e.conn, &o, &err), err.msg);
    jsd_publisher_destroy(p);
    p = NULL;
    o.expected_duplicate_window_ms = 0;

    /* admission and deadline ranges */
    o.admission = 0;
    ASSERT_STATUS(jsd_publisher_bind(&p, e.conn, &o, &err), JSD_ERR_INVALID);
    o.admission = 1025;
    ASSERT_STATUS(jsd_publisher_bind(&p, e.conn, &o, &err), JSD_ERR_INVALID);
    ASSERT_CONTAINS(err.msg, "outside 1..1024");
    o.admission = 1024;
    o.deadline_ms = 0;
    ASSERT_STATUS(jsd_publisher_bind(&p, e.conn, &o, &err), JSD_ERR_INVALID);
    o.deadline_ms = 300001;
    ASSERT_STATUS(jsd_publisher_bind(&p, e.conn, &o, &err), JSD_ERR_INVALID);
    o.deadline_ms = 300000;
    ASSERT_OK_E(jsd_publisher_bind(&p, e.conn, &o, &err), err.msg);
    jsd_publisher_destroy(p);
    jsd_publisher_destroy(NULL);
    env_close(&e);
}

static void limits_rejected_before_io(void **state)
{
    (void)state;
    env e;
    jsd_publish_result r;
    env_open(&e, true);
    jsd_publisher *p = ph_bind(e.conn, e.stream, e.subject, 16, 5000);
    natsConnection *nc = jsd__conn_nats(e.conn);
    size_t cap = jsd_publisher_max_payload(p);
    ASSERT_EQ(cap, 256 * 1024);
    char *payload = calloc(1, cap + 1);
    char id[300], name[80], value[300];
    jsd_header attrs[17];
    uint64_t out0 = ph_out_msgs(nc);

    ASSERT_OUTCOME(jsd_publish(p, "big", payload, cap + 1, NULL, 0, &r), JSD_OUTCOME_REJECTED, r);
    ASSERT_CONTAINS(r.reason, "payload is 262145 bytes; the limit is 262144");
    memset(id, 'i', 257);
    id[257] = '\0';
    ASSERT_OUTCOME(jsd_publish(p, id, "x", 1, NULL, 0, &r), JSD_OUTCOME_REJECTED, r);
    ASSERT_CONTAINS(r.reason, "message id is 257 bytes; the limit is 256");
    ASSERT_OUTCOME(jsd_publish(p, "", "x", 1, NULL, 0, &r), JSD_OUTCOME_REJECTED, r);
    ASSERT_OUTCOME(jsd_publish(p, "a\r\nb", "x", 1, NULL, 0, &r), JSD_OUTCOME_REJECTED, r);
    ASSERT_OUTCOME(jsd_publish(p, " padded", "x", 1, NULL, 0, &r), JSD_OUTCOME_REJECTED, r);

    char names[17][16];
    for (int i = 0; i < 17; i++) {
        snprintf(names[i], sizeof(names[i]), "a%d", i);
        attrs[i].name = names[i];
        attrs[i].value = "v";
    }
    ASSERT_OUTCOME(jsd_publish(p, "attrs", "x", 1, attrs, 17, &r), JSD_OUTCOME_REJECTED, r);
    ASSERT_CONTAINS(r.reason, "17 attributes; the limit is 16");
    memset(name, 'n', 65);
    name[65] = '\0';
    attrs[0].name = name;
    ASSERT_OUTCOME(jsd_publish(p, "attrs", "x", 1, attrs, 1, &r), JSD_OUTCOME_REJECTED, r);
    ASSERT_CONTAINS(r.reason, "65 bytes; the limit is 64");
    attrs[0].name = "a:b";
    ASSERT_OUTCOME(jsd_publish(p, "attrs", "x", 1, attrs, 1, &r), JSD_OUTCOME_REJECTED, r);
    attrs[0].name = "a";
    memset(value, 'v', 257);
    value[257] = '\0';
    attrs[0].value = value;
    ASSERT_OUTCOME(jsd_publish(p, "attrs", "x", 1, attrs, 1, &r), JSD_OUTCOME_REJECTED, r);
    ASSERT_CONTAINS(r.reason, "257 bytes; the limit is 256");
    attrs[0].value = "line\nbreak";
    ASSERT_OUTCOME(jsd_publish(p, "attrs", "x", 1, attrs, 1, &r), JSD_OUTCOME_REJECTED, r);
    ASSERT_CONTAINS(r.reason, "LF");
    attrs[0].value = "carriage\rreturn";
    ASSERT_OUTCOME(jsd_publish(p, "attrs", "x", 1, attrs, 1, &r), JSD_OUTCOME_REJECTED, r);
    ASSERT_CONTAINS(r.reason, "CR");
    attrs[0].value = "x";
    attrs[1].name = "A";
    attrs[1].value = "y";
    ASSERT_OUTCOME(jsd_publish(p, "attrs", "x", 1, attrs, 2, &r), JSD_OUTCOME_REJECTED, r);
    ASSERT_CONTAINS(r.reason, "given twice");

    /* encoded headers over 4 KiB: 16 attributes of 64 + 256 bytes each */
    char longnames[16][70];
    memset(value, 'v', 256);
    value[256] = '\0';
    for (int i = 0; i < 16; i++) {
        memset(longnames[i], 'n', 64);
        longnames[i][62] = (char)('0' + i / 10); /* distinct names */
        longnames[i][63] = (char)('0' + i % 10);
        longnames[i][64] = '\0';
        attrs[i].name = longnames[i];
        attrs[i].value = value;
    }
    ASSERT_OUTCOME(jsd_publish(p, "hdrs", "x", 1, attrs, 16, &r), JSD_OUTCOME_REJECTED, r);
    ASSERT_CONTAINS(r.reason, "encoded headers are");
    ASSERT_CONTAINS(r.reason, "the limit is 4096");
    /* just under: 11 such attributes fit */
    ASSERT_OUTCOME(jsd_publish(p, "hdrs", "x", 1, attrs, 11, &r), JSD_OUTCOME_ACCEPTED, r);

    /* nothing before the last publication was written, and only it is stored */
    ASSERT_EQ(ph_out_msgs(nc), out0 + 1);
    ASSERT_EQ(ph_stream_msgs(e.js, e.stream), 1);

    /* the cap is configurable up to the server's max_payload, not beyond */
    jsd_publisher_opts o;
    jsd_publisher *p2 = NULL;
    jsd_error err;
    jsd_publisher_opts_init(&o);
    o.stream = e.stream;
    o.subject = e.subject;
    o.max_payload = (size_t)natsConnection_GetMaxPayload(nc) + 1;
    ASSERT_STATUS(jsd_publisher_bind(&p2, e.conn, &o, &err), JSD_ERR_INVALID);
    ASSERT_CONTAINS(err.msg, "exceeds the server's max_payload");
    o.max_payload = 16;
    ASSERT_OK_E(jsd_publisher_bind(&p2, e.conn, &o, &err), err.msg);
    ASSERT_OUTCOME(jsd_publish(p2, "small", payload, 17, NULL, 0, &r), JSD_OUTCOME_REJECTED, r);
    ASSERT_OUTCOME(jsd_publish(p2, "small", payload, 16, NULL, 0, &r), JSD_OUTCOME_ACCEPTED, r);
    jsd_publisher_destroy(p2);
    free(payload);
    jsd_publisher_destroy(p);
    env_close(&e);
}

static void overload_is_retryable_without_io(void **state)
{
    (void)state;
    env e;
    jsd_publish_result r;
    jsd_publish_done d[4];
    int mine = 1;
    env_open(&e, true);
    jsd_publisher *p = ph_bind(e.conn, e.stream, e.subject, 1, 5000);
    natsConnection *nc = jsd__conn_nats(e.conn);

    ASSERT_TRUE(jsd_publish_submit(p, "first", "1", 1, NULL, 0, &mine, &r));
    ASSERT_EQ(jsd_publisher_inflight(p), 1);
    uint64_t out0 = ph_out_msgs(nc);
    ASSERT_TRUE(!jsd_publish_submit(p, "second", "2", 1, NULL, 0, NULL, &r));
    ASSERT_EQ(r.outcome, JSD_OUTCOME_RETRYABLE);
    ASSERT_CONTAINS(r.reason, "admission full");
    /* even invalid input is RETRYABLE when admission is full: overload first */
    ASSERT_OUTCOME(jsd_publish(p, "", "x", 1, NULL, 0, &r), JSD_OUTCOME_RETRYABLE, r);
    ASSERT_EQ(ph_out_msgs(nc), out0);

    ASSERT_EQ(jsd_publisher_poll(p, d, 4, 5000), 1);
    ASSERT_TRUE(d[0].user == &mine);
    ASSERT_EQ(d[0].result.outcome, JSD_OUTCOME_ACCEPTED);
    ASSERT_EQ(jsd_publisher_inflight(p), 0);
    ASSERT_OUTCOME(jsd_publish(p, "second", "2", 1, NULL, 0, &r), JSD_OUTCOME_ACCEPTED, r);
    ASSERT_EQ(ph_stream_msgs(e.js, e.stream), 2);
    jsd_publisher_destroy(p);
    env_close(&e);
}

static void no_stream_is_failed_not_unknown(void **state)
{
    (void)state;
    env e;
    jsd_publish_result r;
    env_open(&e, true);
    jsd_publisher *p = ph_bind(e.conn, e.stream, e.subject, 4, 5000);
    /* the stream goes away after binding: nothing captures the subject */
    ph_delete_stream(e.js, e.stream);
    int64_t t0 = jsd_test_mono_ms();
    ASSERT_OUTCOME(jsd_publish(p, "lost-1", "x", 1, NULL, 0, &r), JSD_OUTCOME_FAILED, r);
    ASSERT_LE(jsd_test_mono_ms() - t0, 4000); /* answered, not timed out */
    ASSERT_EQ(r.status_code, 503);
    ASSERT_EQ(r.nats_status, NATS_NO_RESPONDERS);
    ASSERT_CONTAINS(r.reason, "no stream captures");
    ASSERT_CONTAINS(jsd_publisher_errmsg(p), "failed");
    jsd_publisher_destroy(p);
    env_close(&e);
}

static void wrong_expected_stream_is_failed_10060(void **state)
{
    (void)state;
    env e;
    jsd_publish_result r;
    char other[96], filter[140];
    env_open(&e, true);
    jsd_publisher *p = ph_bind(e.conn, e.stream, e.subject, 4, 5000);
    /* another stream now captures the subject */
    ph_delete_stream(e.js, e.stream);
    snprintf(other, sizeof(other), "%s", jsd_test_unique("OTHER"));
    snprintf(filter, sizeof(filter), "%s.>", e.stream);
    ph_add_stream(e.js, &(ph_stream){.name = other, .subject = filter});
    ASSERT_OUTCOME(jsd_publish(p, "w-1", "x", 1, NULL, 0, &r), JSD_OUTCOME_FAILED, r);
    ASSERT_EQ(r.js_err_code, 10060);
    ASSERT_EQ(r.status_code, 400);
    ASSERT_CONTAINS(r.reason, "nothing was stored");
    ASSERT_EQ(ph_stream_msgs(e.js, other), 0);
    jsd_publisher_destroy(p);
    ph_delete_stream(e.js, other);
    env_close(&e);
}

static void many_in_flight(void **state)
{
    (void)state;
    env e;
    enum { N = 2000 };
    jsd_publish_result r;
    jsd_publish_done d[64];
    char id[32];
    int accepted = 0, retryable = 0, submitted = 0;
    env_open(&e, true);
    jsd_publisher *p = ph_bind(e.conn, e.stream, e.subject, 128, 10000);
    for (int i = 0; i < N;) {
        snprintf(id, sizeof(id), "m-%d", i);
        if (jsd_publish_submit(p, id, id, strlen(id), NULL, 0, (void *)(intptr_t)(i + 1), &r)) {
            submitted++;
            i++;
            continue;
        }
        ASSERT_EQ(r.outcome, JSD_OUTCOME_RETRYABLE);
        retryable++;
        size_t n = jsd_publisher_poll(p, d, 64, 5000);
        for (size_t k = 0; k < n; k++) {
            ASSERT_EQ(d[k].result.outcome, JSD_OUTCOME_ACCEPTED);
            accepted++;
        }
    }
    while (jsd_publisher_inflight(p) > 0) {
        size_t n = jsd_publisher_poll(p, d, 64, 5000);
        ASSERT_TRUE(n > 0);
        for (size_t k = 0; k < n; k++) {
            ASSERT_EQ(d[k].result.outcome, JSD_OUTCOME_ACCEPTED);
            ASSERT_EQ(d[k].result.receipt.duplicate, false);
            accepted++;
        }
    }
    ASSERT_EQ(submitted, N);
    ASSERT_EQ(accepted, N);
    ASSERT_TRUE(retryable > 0); /* admission was reached and held */
    ASSERT_EQ(ph_stream_msgs(e.js, e.stream), N);
    jsd_publisher_destroy(p);
    env_close(&e);
}

static void sync_publish_keeps_async_results(void **state)
{
    (void)state;
    env e;
    jsd_publish_result r;
    jsd_publish_done d[8];
    int a = 1, b = 2;
    env_open(&e, true);
    jsd_publisher *p = ph_bind(e.conn, e.stream, e.subject, 8, 5000);
    ASSERT_TRUE(jsd_publish_submit(p, "async-a", "a", 1, NULL, 0, &a, &r));
    ASSERT_TRUE(jsd_publish_submit(p, "async-b", "b", 1, NULL, 0, &b, &r));
    ASSERT_OUTCOME(jsd_publish(p, "sync-c", "c", 1, NULL, 0, &r), JSD_OUTCOME_ACCEPTED, r);
    size_t got = 0;
    bool seen_a = false, seen_b = false;
    while (got < 2) {
        size_t n = jsd_publisher_poll(p, d, 8, 5000);
        ASSERT_TRUE(n > 0);
        for (size_t i = 0; i < n; i++) {
            ASSERT_EQ(d[i].result.outcome, JSD_OUTCOME_ACCEPTED);
            seen_a |= d[i].user == &a;
            seen_b |= d[i].user == &b;
        }
        got += n;
    }
    ASSERT_TRUE(seen_a && seen_b);
    ASSERT_EQ(jsd_publisher_inflight(p), 0);
    jsd_publisher_destroy(p);
    env_close(&e);
}

static void json_payloads_nested_at_most_8(void **state)
{
    (void)state;
    env e;
    jsd_publish_result r;
    jsd_publisher_opts o;
    jsd_publisher *p = NULL;
    jsd_error err;
    env_open(&e, true);
    jsd_publisher_opts_init(&o);
    o.stream = e.stream;
    o.subject = e.subject;
    o.json_payloads = true;
    ASSERT_OK_E(jsd_publisher_bind(&p, e.conn, &o, &err), err.msg);
    uint64_t out0 = ph_out_msgs(jsd__conn_nats(e.conn));
    const char *deep8 = "[[[[[[[[1]]]]]]]]", *deep9 = "[[[[[[[[[1]]]]]]]]]";
    ASSERT_OUTCOME(jsd_publish(p, "j-9", deep9, strlen(deep9), NULL, 0, &r), JSD_OUTCOME_REJECTED,
                   r);
    ASSERT_CONTAINS(r.reason, "not acceptable JSON");
    ASSERT_OUTCOME(jsd_publish(p, "j-bad", "{\"a\":", 5, NULL, 0, &r), JSD_OUTCOME_REJECTED, r);
    ASSERT_OUTCOME(jsd_publish(p, "j-none", NULL, 0, NULL, 0, &r), JSD_OUTCOME_REJECTED, r);
    ASSERT_EQ(ph_out_msgs(jsd__conn_nats(e.conn)), out0);
    ASSERT_OUTCOME(jsd_publish(p, "j-8", deep8, strlen(deep8), NULL, 0, &r), JSD_OUTCOME_ACCEPTED,
                   r);
    ASSERT_OUTCOME(jsd_publish(p, "j-obj", "{\"id\":42}", 9, NULL, 0, &r), JSD_OUTCOME_ACCEPTED, r);
    ASSERT_EQ(ph_stream_msgs(e.js, e.stream), 2);
    jsd_publisher_destroy(p);
    env_close(&e);
}

static void outcome_names(void **state)
{
    (void)state;
    ASSERT_STREQ(jsd_outcome_str(JSD_OUTCOME_ACCEPTED), "accepted");
    ASSERT_STREQ(jsd_outcome_str(JSD_OUTCOME_UNKNOWN), "unknown");
    ASSERT_STREQ(jsd_outcome_str((jsd_outcome)99), "?");
}

JSD_TEST_MAIN(cmocka_unit_test(accepted_then_duplicate),
              cmocka_unit_test(bind_errors_name_the_rule),
              cmocka_unit_test(limits_rejected_before_io),
              cmocka_unit_test(overload_is_retryable_without_io),
              cmocka_unit_test(no_stream_is_failed_not_unknown),
              cmocka_unit_test(wrong_expected_stream_is_failed_10060),
              cmocka_unit_test(many_in_flight), cmocka_unit_test(sync_publish_keeps_async_results),
              cmocka_unit_test(json_payloads_nested_at_most_8), cmocka_unit_test(outcome_names))
