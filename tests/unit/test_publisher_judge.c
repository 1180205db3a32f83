/*
 * Unit tests for the reply rules (PUB-4) through jsd__pubengine_judge_reply:
 * what nats-server really sends, and what nothing should send.
 */
#include "test.h"
#include "puback.h"
#include "pubengine.h"

static jsd_outcome judge(const char *body, const char *status, jsd_publish_result *r)
{
    return jsd__pubengine_judge_reply(body, strlen(body), status, "ORDERS", r);
}

static void server_acks(void **state)
{
    (void)state;
    jsd_publish_result r;
    /* nats-server 2.9/2.10 spacing */
    ASSERT_EQ(judge("{\"stream\":\"ORDERS\", \"seq\":12}", NULL, &r), JSD_OUTCOME_ACCEPTED);
    ASSERT_EQ(r.receipt.seq, 12);
    ASSERT_EQ(r.receipt.duplicate, false);
    ASSERT_STREQ(r.receipt.stream, "ORDERS");
    ASSERT_EQ(judge("{\"stream\":\"ORDERS\", \"seq\":12,\"duplicate\": true}", NULL, &r),
              JSD_OUTCOME_ACCEPTED);
    ASSERT_EQ(r.receipt.duplicate, true);
    ASSERT_EQ(judge("{\"stream\":\"ORDERS\", \"domain\":\"hub\", \"seq\":3}", NULL, &r),
              JSD_OUTCOME_ACCEPTED);
    ASSERT_EQ(r.receipt.seq, 3);
    ASSERT_EQ(judge("{\"stream\":\"ORDERS\",\"seq\":18446744073709551615}", NULL, &r),
              JSD_OUTCOME_UNKNOWN); /* beyond what jansson holds: not trusted */
}

static void known_failures(void **state)
{
    (void)state;
    jsd_publish_result r;
    ASSERT_EQ(judge("{\"error\":{\"code\":400,\"err_code\":10060,\"description\":\"expected stream "
                    "does not match\"}}",
                    NULL, &r),
              JSD_OUTCOME_FAILED);
    ASSERT_EQ(r.js_err_code, 10060);
    ASSERT_EQ(r.status_code, 400);
    ASSERT_CONTAINS(r.reason, "expected stream does not match");
    ASSERT_EQ(judge("{\"error\":{\"code\":503,\"err_code\":10039,\"description\":\"jetstream not "
                    "enabled\"}}",
                    NULL, &r),
              JSD_OUTCOME_UNKNOWN);
    ASSERT_EQ(judge("{\"error\":{\"code\":500}}", NULL, &r), JSD_OUTCOME_UNKNOWN);
}

static void untrusted_replies(void **state)
{
    (void)state;
    jsd_publish_result r;
    const char *unknown[] = {
        "",
        "null",
        "{}",
        "{\"stream\":\"OTHER\",\"seq\":5}",
        "{\"stream\":\"ORDERS\",\"seq\":0}",
        "{\"stream\":\"ORDERS\",\"seq\":-4}",
        "{\"stream\":\"ORDERS\",\"seq\":01}",
        "{\"stream\":\"ORDERS\",\"seq\":1.5}",
        "{\"stream\":\"ORDERS\",\"seq\":\"7\"}",
        "{\"stream\":\"ORDERS\",\"seq\":7,\"duplicate\":1}",
        "{\"stream\":\"ORDERS\",\"seq\":7}}",
        "{\"stream\":\"ORD\\u0045RS\",\"seq\":7,", /* truncated */
        "{\"stream\":\"ORDERSX\",\"seq\":7}",
        "[{\"stream\":\"ORDERS\",\"seq\":7}]",
    };
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        jsd_outcome o = judge(unknown[i], NULL, &r);
        if (o != JSD_OUTCOME_UNKNOWN)
            fail_msg("reply %s judged %s, expected unknown", unknown[i], jsd_outcome_str(o));
        ASSERT_CONTAINS(r.reason, "retry with the same id");
    }
    /* an escaped name equal to the expected one is the same stream */
    ASSERT_EQ(judge("{\"stream\":\"ORD\\u0045RS\",\"seq\":7}", NULL, &r), JSD_OUTCOME_ACCEPTED);
    /* a bare status is never an acknowledgement, even with a good body */
    ASSERT_EQ(judge("{\"stream\":\"ORDERS\",\"seq\":7}", "408", &r), JSD_OUTCOME_UNKNOWN);
    ASSERT_EQ(r.status_code, 408);
}

/* An atomic batch's commit, as nats-server 2.15.1 answers it: the batch id
 * and count are read (the engine checks them against the batch it sent);
 * the refusals the relay tells apart keep their codes. */
static void atomic_batch_replies(void **state)
{
    (void)state;
    jsd__reply p;
    const char *ack = "{\"stream\":\"A\",\"seq\":9,\"batch\":\"c6e6fe3b\",\"count\":3}";
    jsd__reply_parse_body(ack, (int)strlen(ack), NULL, &p);
    ASSERT_EQ(p.kind, JSD__REPLY_ACK);
    ASSERT_EQ(p.seq, 9);
    ASSERT_EQ(p.count, 3);
    ASSERT_STREQ(p.batch, "c6e6fe3b");
    const char *plain = "{\"stream\":\"A\",\"seq\":9}";
    jsd__reply_parse_body(plain, (int)strlen(plain), NULL, &p);
    ASSERT_EQ(p.count, 0);
    ASSERT_STREQ(p.batch, "");
    jsd_publish_result r;
    ASSERT_EQ(judge("{\"error\":{\"code\":429,\"err_code\":10210,\"description\":\"atomic "
                    "publish too many inflight\"},\"stream\":\"ORDERS\",\"seq\":0}",
                    NULL, &r),
              JSD_OUTCOME_FAILED);
    ASSERT_EQ(r.js_err_code, 10210);
    ASSERT_EQ(judge("{\"error\":{\"code\":400,\"err_code\":10201,\"description\":\"atomic "
                    "publish batch contains duplicate message id\"},\"stream\":\"ORDERS\","
                    "\"seq\":0}",
                    NULL, &r),
              JSD_OUTCOME_FAILED);
    ASSERT_EQ(r.js_err_code, 10201);
}

JSD_TEST_MAIN(cmocka_unit_test(server_acks), cmocka_unit_test(atomic_batch_replies),
              cmocka_unit_test(known_failures), cmocka_unit_test(untrusted_replies))
