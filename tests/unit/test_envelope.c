/*
 * Unit tests for the typed envelope checks (envelope.c): the bounded JSON
 * validator and its nesting limit, accepted types, the death envelope's
 * stable message id, and how a foreign Nats-Msg-Id outside the limits is kept
 * in a poison record (consumer_apply.c, "limits").
 */
#include "test.h"
#include "consumer_int.h"

static bool json_ok(const char *s)
{
    char why[200];
    return jsd__json_valid(s, strlen(s), JSD_JSON_DEPTH_MAX, why, sizeof(why));
}

static void json_accepts_valid_values(void **state)
{
    (void)state;
    const char *good[] = {"{}",
                          "[]",
                          "0",
                          "-0.5e+10",
                          "\"a\\u00e9\\n\"",
                          "true",
                          "false",
                          "null",
                          " {\"a\": [1, 2, {\"b\": null}], \"c\": \"d\"} ",
                          "[[[[[[[[1]]]]]]]]" /* depth 8: the limit */};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        if (!json_ok(good[i]))
            fail_msg("valid JSON refused: %s", good[i]);
}

static void json_refuses_malformed(void **state)
{
    (void)state;
    const char *bad[] = {"",      "{",        "[1,]", "{\"a\"}", "{\"a\":1,}", "01",
                         "1.",    "1e",       "tru",  "\"abc",   "\"\\x\"",    "[1] [2]",
                         "{a:1}", "\"\x01\"", "nul",  "-",       "[1 2]",      "\"\\u12G4\""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (json_ok(bad[i]))
            fail_msg("malformed JSON accepted: \"%s\"", bad[i]);
}

static void json_nesting_limit_is_crossed_at_nine(void **state)
{
    (void)state;
    char why[200];
    const char *nine = "[[[[[[[[[1]]]]]]]]]";
    ASSERT_TRUE(!jsd__json_valid(nine, strlen(nine), JSD_JSON_DEPTH_MAX, why, sizeof(why)));
    ASSERT_CONTAINS(why, "nesting");
    const char *objs = "{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":1}}}}}}}}}";
    ASSERT_TRUE(!jsd__json_valid(objs, strlen(objs), JSD_JSON_DEPTH_MAX, why, sizeof(why)));
    /* A deep hostile payload is refused quickly, without recursion trouble. */
    static char deep[100001];
    memset(deep, '[', sizeof(deep) - 1);
    ASSERT_TRUE(!jsd__json_valid(deep, sizeof(deep) - 1, JSD_JSON_DEPTH_MAX, why, sizeof(why)));
}

static void json_embedded_nul_is_malformed(void **state)
{
    (void)state;
    char why[200];
    const char s[] = "\"a\0b\"";
    ASSERT_TRUE(!jsd__json_valid(s, sizeof(s) - 1, 8, why, sizeof(why)));
}

static void envelope_types(void **state)
{
    (void)state;
    char why[200];
    const char *types[] = {"order.created", "order.paid"};
    ASSERT_TRUE(
        jsd__envelope_check("order.paid", "x", 1, types, 2, JSD_PAYLOAD_RAW, why, sizeof(why)));
    ASSERT_TRUE(
        !jsd__envelope_check("order.lost", "x", 1, types, 2, JSD_PAYLOAD_RAW, why, sizeof(why)));
    ASSERT_CONTAINS(why, "unsupported Jsd-Type \"order.lost\"");
    ASSERT_TRUE(!jsd__envelope_check(NULL, "x", 1, types, 2, JSD_PAYLOAD_RAW, why, sizeof(why)));
    ASSERT_CONTAINS(why, "missing Jsd-Type");
    /* No list: any type or none. */
    ASSERT_TRUE(jsd__envelope_check(NULL, "x", 1, NULL, 0, JSD_PAYLOAD_RAW, why, sizeof(why)));
    /* JSON format applies to the payload. */
    ASSERT_TRUE(
        !jsd__envelope_check("order.paid", "{", 1, types, 2, JSD_PAYLOAD_JSON, why, sizeof(why)));
    ASSERT_CONTAINS(why, "malformed JSON");
    ASSERT_TRUE(
        jsd__envelope_check("order.paid", "{}", 2, types, 2, JSD_PAYLOAD_JSON, why, sizeof(why)));
    /* A control character in the type is not echoed raw. */
    ASSERT_TRUE(
        !jsd__envelope_check("a\x1b[31m", "x", 1, types, 2, JSD_PAYLOAD_RAW, why, sizeof(why)));
    ASSERT_NOT_CONTAINS(why, "\x1b");
}

static void death_msg_id_is_stable_and_distinct(void **state)
{
    (void)state;
    char a[65], b[65], c[65], d[65];
    jsd_dlq_msg_id("ORDERS", "billing", 12, a);
    jsd_dlq_msg_id("ORDERS", "billing", 12, b);
    jsd_dlq_msg_id("ORDERS", "billing", 13, c);
    ASSERT_STREQ(a, b);
    ASSERT_EQ(strlen(a), 64);
    ASSERT_TRUE(strcmp(a, c) != 0);
    jsd_dlq_msg_id("ORDERS1", "billing", 2, b);
    jsd_dlq_msg_id("ORDERS", "billing1", 2, c);
    ASSERT_TRUE(strcmp(b, c) != 0); /* the parts are length-delimited */
    /* another durable parking the same message has its own dead letter */
    jsd_dlq_msg_id("ORDERS", "audit", 12, d);
    ASSERT_TRUE(strcmp(a, d) != 0);
}

/* An id the store takes is kept as it is; any other as printable ASCII,
 * at most JSD_IDENT_MAX bytes, "..." when cut, never splitting an escape. */
static void msg_id_kept_is_safe(void **state)
{
    (void)state;
    char out[JSD_IDENT_MAX + 1], id[2001];
    const char *ok = "order-7 é"; /* a space and UTF-8 are allowed */
    ASSERT_PTR_EQ(jsd__msg_id_kept(ok, out), ok);
    ASSERT_PTR_EQ(jsd__msg_id_kept(NULL, out), NULL);
    ASSERT_PTR_EQ(jsd__msg_id_kept("", out), NULL);
    ASSERT_STREQ(jsd__msg_id_kept("bad\001id", out), "bad\\x01id");
    ASSERT_STREQ(jsd__msg_id_kept("a\\b\x7f\xff", out), "a\\x5cb\\x7f\\xff"); /* not UTF-8 */
    /* 256 letters fit; 257 are cut to 253 and "..." */
    memset(id, 'x', 257);
    id[256] = '\0';
    ASSERT_PTR_EQ(jsd__msg_id_kept(id, out), id);
    id[256] = 'y';
    id[257] = '\0';
    ASSERT_SIZE_EQ(strlen(jsd__msg_id_kept(id, out)), JSD_IDENT_MAX);
    ASSERT_TRUE(strncmp(out, id, 253) == 0 && strcmp(out + 253, "...") == 0);
    /* A rendering of exactly JSD_IDENT_MAX bytes is not cut: 252 + one \xNN. */
    memset(id, 'x', 252);
    id[252] = '\001';
    id[253] = '\0';
    ASSERT_SIZE_EQ(strlen(jsd__msg_id_kept(id, out)), JSD_IDENT_MAX);
    ASSERT_STREQ(out + 252, "\\x01");
    /* One byte more (257 rendered), and the escape that no longer fits
     * before "..." goes whole. */
    id[253] = 'z';
    id[254] = '\0';
    ASSERT_SIZE_EQ(strlen(jsd__msg_id_kept(id, out)), 255);
    ASSERT_STREQ(out + 252, "...");
    /* 2000 control bytes (nats-server takes such an id) */
    memset(id, '\001', 2000);
    id[2000] = '\0';
    ASSERT_SIZE_EQ(strlen(jsd__msg_id_kept(id, out)), 63 * 4 + 3);
    for (size_t i = 0; out[i]; i++)
        ASSERT_TRUE(out[i] > 0x20 && out[i] < 0x7f);
}

JSD_TEST_MAIN(cmocka_unit_test(json_accepts_valid_values), cmocka_unit_test(json_refuses_malformed),
              cmocka_unit_test(json_nesting_limit_is_crossed_at_nine),
              cmocka_unit_test(json_embedded_nul_is_malformed), cmocka_unit_test(envelope_types),
              cmocka_unit_test(death_msg_id_is_stable_and_distinct),
              cmocka_unit_test(msg_id_kept_is_safe))
