/*
 * Unit tests for name/subject/header validation and idempotency ids
 * (PUB-1, PUB-5, PUB-6, SEC-1): each rule is crossed by one input.
 */
#include <stdlib.h>
#include <unistd.h>

#include "test.h"
#include "subject.h"

static void stream_names(void **state)
{
    (void)state;
    jsd_error e;
    char name[200];
    ASSERT_TRUE(jsd__stream_name_valid("ORDERS", NULL));
    ASSERT_TRUE(jsd__stream_name_valid("a-b_C9", NULL));
    ASSERT_TRUE(!jsd__stream_name_valid("", &e));
    ASSERT_CONTAINS(e.msg, "empty");
    ASSERT_TRUE(!jsd__stream_name_valid("ORD.ERS", &e));
    ASSERT_CONTAINS(e.msg, "'.' at byte 3");
    ASSERT_TRUE(!jsd__stream_name_valid("ORD ERS", &e));
    ASSERT_TRUE(!jsd__stream_name_valid("ORD*", &e));
    memset(name, 'S', 128);
    name[128] = '\0';
    ASSERT_TRUE(jsd__stream_name_valid(name, NULL));
    name[128] = 'S';
    name[129] = '\0';
    ASSERT_TRUE(!jsd__stream_name_valid(name, &e));
    ASSERT_EQ(e.status, JSD_ERR_INVALID);
    ASSERT_CONTAINS(e.msg, "is 129 bytes; the limit is 128");
}

static void exact_subjects(void **state)
{
    (void)state;
    jsd_error e;
    char s[300];
    ASSERT_TRUE(jsd__subject_valid_exact("orders.created", NULL));
    ASSERT_TRUE(jsd__subject_valid_exact("a", NULL));
    ASSERT_TRUE(jsd__subject_valid_exact("_INBOX.x", NULL)); /* exact, but not for tenants */
    ASSERT_TRUE(!jsd__subject_valid_exact("orders.*", &e));
    ASSERT_CONTAINS(e.msg, "wildcard '*'");
    ASSERT_TRUE(!jsd__subject_valid_exact("orders.>", &e));
    ASSERT_CONTAINS(e.msg, "wildcard '>'");
    ASSERT_TRUE(!jsd__subject_valid_exact("orders..x", &e));
    ASSERT_CONTAINS(e.msg, "empty token");
    ASSERT_TRUE(!jsd__subject_valid_exact(".orders", &e));
    ASSERT_TRUE(!jsd__subject_valid_exact("orders.", &e));
    ASSERT_TRUE(!jsd__subject_valid_exact("orders created", &e));
    ASSERT_CONTAINS(e.msg, "byte 0x20");
    ASSERT_TRUE(!jsd__subject_valid_exact("orders\r\nPUB x", &e));
    ASSERT_NOT_CONTAINS(e.msg, "\r");
    ASSERT_NOT_CONTAINS(e.msg, "\n");
    ASSERT_TRUE(!jsd__subject_valid_exact("$JS.API.x", &e));
    ASSERT_TRUE(!jsd__subject_valid_exact("ordérs", &e));
    ASSERT_TRUE(!jsd__subject_valid_exact(NULL, &e));
    memset(s, 'a', 256);
    s[256] = '\0';
    ASSERT_TRUE(jsd__subject_valid_exact(s, NULL));
    s[256] = 'a';
    s[257] = '\0';
    ASSERT_TRUE(!jsd__subject_valid_exact(s, &e));
    ASSERT_CONTAINS(e.msg, "is 257 bytes; the limit is 256");
    ASSERT_CONTAINS(e.msg, "...");
}

static void tenant_subjects(void **state)
{
    (void)state;
    jsd_error e;
    ASSERT_TRUE(jsd__subject_valid_tenant("orders.created", NULL));
    ASSERT_TRUE(jsd__subject_valid_tenant("_INBOXES.x", NULL));
    ASSERT_TRUE(!jsd__subject_valid_tenant("_INBOX.abc", &e));
    ASSERT_CONTAINS(e.msg, "_INBOX");
    ASSERT_TRUE(!jsd__subject_valid_tenant("_INBOX", &e));
    ASSERT_TRUE(!jsd__subject_valid_tenant("$SYS.x", &e));
    ASSERT_CONTAINS(e.msg, "\"$\"");
    ASSERT_TRUE(!jsd__subject_valid_tenant("orders.*", &e));
}

static void filters_and_matching(void **state)
{
    (void)state;
    ASSERT_TRUE(jsd__subject_valid_filter("orders.>", NULL));
    ASSERT_TRUE(jsd__subject_valid_filter("orders.*.x", NULL));
    ASSERT_TRUE(jsd__subject_valid_filter("$KV.b.>", NULL));
    ASSERT_TRUE(!jsd__subject_valid_filter("orders.>.x", NULL));
    ASSERT_TRUE(!jsd__subject_valid_filter("orders.a*", NULL));
    ASSERT_TRUE(!jsd__subject_valid_filter("a..b", NULL));
    ASSERT_TRUE(jsd__subject_matches("orders.>", "orders.created"));
    ASSERT_TRUE(jsd__subject_matches("orders.>", "orders.a.b.c"));
    ASSERT_TRUE(!jsd__subject_matches("orders.>", "orders"));
    ASSERT_TRUE(jsd__subject_matches("orders.*", "orders.created"));
    ASSERT_TRUE(!jsd__subject_matches("orders.*", "orders.created.x"));
    ASSERT_TRUE(jsd__subject_matches("*.created", "orders.created"));
    ASSERT_TRUE(jsd__subject_matches("orders.created", "orders.created"));
    ASSERT_TRUE(!jsd__subject_matches("orders.create", "orders.created"));
    ASSERT_TRUE(!jsd__subject_matches("orders.created", "orders.create"));
    ASSERT_TRUE(!jsd__subject_matches("orders.created.x", "orders.created"));
    ASSERT_TRUE(jsd__subject_matches(">", "a.b"));
}

/* One pattern captured by another: the topology file's consumer filter
 * inside its stream's subjects, and the dead-letter subject's root. */
static void pattern_capture(void **state)
{
    (void)state;
    ASSERT_TRUE(jsd__subject_within("orders.created", "orders.*"));
    ASSERT_TRUE(jsd__subject_within("orders.*", "orders.>"));
    ASSERT_TRUE(jsd__subject_within("orders.*.x", "orders.*.*"));
    ASSERT_TRUE(!jsd__subject_within("orders.>", "orders.*"));
    ASSERT_TRUE(!jsd__subject_within("orders.*", "orders.created"));
    ASSERT_TRUE(!jsd__subject_within("orders", "orders.>"));
    ASSERT_TRUE(jsd__subject_within("a.b", ">"));
    ASSERT_TRUE(jsd__subject_root_len("jsd.dlq.>") == 7);
    ASSERT_TRUE(jsd__subject_root_len("*.x") == 0);
    ASSERT_TRUE(jsd__subject_root_len("a.b") == 3);
    ASSERT_TRUE(jsd__subject_roots_nested("jsd", 3, "jsd.dlq", 7));
    ASSERT_TRUE(!jsd__subject_roots_nested("jsd", 3, "jsdx", 4));
    ASSERT_TRUE(jsd__subject_roots_nested("", 0, "a", 1));
    char why[128];
    ASSERT_TRUE(jsd__subject_pattern_check("a.*.>", why, sizeof(why)));
    ASSERT_TRUE(!jsd__subject_pattern_check("a.>.b", why, sizeof(why)));
    ASSERT_TRUE(strstr(why, "must be the last token") != NULL);
}

static void header_names_and_values(void **state)
{
    (void)state;
    jsd_error e;
    char big[300];
    ASSERT_TRUE(jsd__header_name_valid("Trace-Id", 64, "attribute", NULL));
    ASSERT_TRUE(!jsd__header_name_valid("", 64, "attribute", &e));
    ASSERT_TRUE(!jsd__header_name_valid("a:b", 64, "attribute", &e));
    ASSERT_CONTAINS(e.msg, "':'");
    ASSERT_TRUE(!jsd__header_name_valid("a b", 64, "attribute", &e));
    ASSERT_TRUE(!jsd__header_name_valid("a\nb", 64, "attribute", &e));
    ASSERT_CONTAINS(e.msg, "0x0a");
    memset(big, 'n', 65);
    big[65] = '\0';
    ASSERT_TRUE(!jsd__header_name_valid(big, 64, "attribute", &e));
    ASSERT_CONTAINS(e.msg, "65 bytes; the limit is 64");
    ASSERT_TRUE(jsd__header_value_valid("x y: z", 6, 256, "attribute", NULL));
    ASSERT_TRUE(jsd__header_value_valid("x", 1, 256, "attribute", NULL));
    /* refused: CR, LF, NUL, and what a receiver would not read back as sent
     * (jsd__header_value_edges; test_natsmsg shows nats.c's reading) */
    static const struct {
        const char *v;
        size_t len;
        const char *says;
    } refused[] = {
        {"a\rb", 3, "CR at byte 1"}, {"a\nb", 3, "LF"},
        {"a\0b", 3, "NUL"},          {"", 0, "attribute value is empty"},
        {" x", 2, "white space"},    {"x\t", 2, "white space"},
        {" ", 1, "white space"},
    };
    for (size_t i = 0; i < JSD_ARRAY_LEN(refused); i++) {
        jsd_error_clear(&e);
        if (jsd__header_value_valid(refused[i].v, refused[i].len, 256, "attribute", &e))
            fail_msg("value %zu was taken", i);
        ASSERT_CONTAINS(e.msg, refused[i].says);
    }
    memset(big, 'v', 257);
    ASSERT_TRUE(jsd__header_value_valid(big, 256, 256, "attribute", NULL));
    ASSERT_TRUE(!jsd__header_value_valid(big, 257, 256, "attribute", &e));
    ASSERT_CONTAINS(e.msg, "257 bytes; the limit is 256");
}

/* W3C trace context values, at and across every rule (JSD_TRACESTATE_MAX). */
static void trace_context_values(void **state)
{
    (void)state;
    jsd_error e;
    char big[700];
    ASSERT_TRUE(jsd__trace_header("traceparent") && jsd__trace_header("TraceState"));
    ASSERT_TRUE(!jsd__trace_header("trace") && !jsd__trace_header(NULL));
    const char *good[] = {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                          "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
                          /* a later version may carry more, after a '-' */
                          "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz"};
    for (size_t i = 0; i < JSD_ARRAY_LEN(good); i++)
        if (!jsd__trace_value_valid("traceparent", good[i], &e))
            fail_msg("refused %s: %s", good[i], e.msg);
    const char *bad[] = {
        "",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",   /* uppercase */
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",   /* zero trace id */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",   /* zero parent id */
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   /* version ff */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", /* 00 is 55 bytes */
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",  /* no '-' after 55 */
        "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",   /* misplaced dash */
        "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
    };
    for (size_t i = 0; i < JSD_ARRAY_LEN(bad); i++) {
        if (jsd__trace_value_valid("traceparent", bad[i], &e))
            fail_msg("accepted %s", bad[i]);
        ASSERT_EQ(e.status, JSD_ERR_INVALID);
        ASSERT_CONTAINS(e.msg, "is not W3C trace context");
    }
    memset(big, 'a', sizeof(big));
    big[JSD_TRACESTATE_MAX] = '\0';
    ASSERT_TRUE(jsd__trace_value_valid("tracestate", big, NULL));
    big[JSD_TRACESTATE_MAX] = 'a';
    big[JSD_TRACESTATE_MAX + 1] = '\0';
    ASSERT_TRUE(!jsd__trace_value_valid("tracestate", big, &e));
    ASSERT_EQ(e.status, JSD_ERR_LIMIT);
    ASSERT_CONTAINS(e.msg, "513 bytes; the limit is 512");
    ASSERT_TRUE(!jsd__trace_value_valid("tracestate", "a=b\tc", &e));
    ASSERT_CONTAINS(e.msg, "0x09 at 3");
}

static void idempotency_ids(void **state)
{
    (void)state;
    char a[JSD_IDEMPOTENCY_ID_SIZE], b[JSD_IDEMPOTENCY_ID_SIZE];
    char key[300];
    jsd_error e;
    ASSERT_OK(jsd_idempotency_id("ns", "tenant", "orders", "k1", a, NULL));
    ASSERT_EQ(strlen(a), 64);
    ASSERT_OK(jsd_idempotency_id("ns", "tenant", "orders", "k1", b, NULL));
    ASSERT_STREQ(a, b); /* stable */
    /* every part counts, and the parts are length-delimited */
    ASSERT_OK(jsd_idempotency_id("ns", "tenant", "orders", "k2", b, NULL));
    ASSERT_TRUE(strcmp(a, b) != 0);
    ASSERT_OK(jsd_idempotency_id("ns", "tenant2", "orders", "k1", b, NULL));
    ASSERT_TRUE(strcmp(a, b) != 0);
    ASSERT_OK(jsd_idempotency_id("ns2", "tenant", "orders", "k1", b, NULL));
    ASSERT_TRUE(strcmp(a, b) != 0);
    ASSERT_OK(jsd_idempotency_id("ns", "tenant", "orders2", "k1", b, NULL));
    ASSERT_TRUE(strcmp(a, b) != 0);
    ASSERT_OK(jsd_idempotency_id("ns", "tenan", "torders", "k1", b, NULL));
    ASSERT_TRUE(strcmp(a, b) != 0);
    /* A known vector: sha256(be64(2)"ns" be64(1)"t" be64(1)"o" be64(1)"k"),
     * computed outside this code base with
     *   python3 -c 'import hashlib,struct; print(hashlib.sha256(b"".join(
     *     struct.pack(">Q",len(x))+x for x in [b"ns",b"t",b"o",b"k"])).hexdigest())' */
    ASSERT_OK(jsd_idempotency_id("ns", "t", "o", "k", a, NULL));
    ASSERT_STREQ(a, "b8e161be37c9f7237eacb9e2e5888972951369a37c9f933dc9b6d8310c598797");
    /* limits */
    ASSERT_STATUS(jsd_idempotency_id("ns", "t", "o", "", a, &e), JSD_ERR_INVALID);
    ASSERT_STATUS(jsd_idempotency_id("ns", "t", "o", NULL, a, &e), JSD_ERR_INVALID);
    memset(key, 'k', 256);
    key[256] = '\0';
    ASSERT_OK(jsd_idempotency_id("ns", "t", "o", key, a, NULL));
    key[256] = 'k';
    key[257] = '\0';
    ASSERT_STATUS(jsd_idempotency_id("ns", "t", "o", key, a, &e), JSD_ERR_LIMIT);
    ASSERT_CONTAINS(e.msg, "key is 257 bytes");
}

/* The one rule for what this project publishes (effects at emit, the relay,
 * jsd_publish): reserved prefixes refused, and the wire size of a header. */
static void publish_subjects_and_header_sizes(void **state)
{
    (void)state;
    jsd_error e;
    ASSERT_TRUE(jsd__subject_valid_publish("orders.created", NULL));
    ASSERT_TRUE(jsd__subject_valid_publish("_INBOXES.x", NULL));
    ASSERT_TRUE(!jsd__subject_valid_publish("_INBOX.x", &e));
    ASSERT_CONTAINS(e.msg, "reserved \"_INBOX\" prefix");
    ASSERT_TRUE(!jsd__subject_valid_publish("_INBOX", &e));
    ASSERT_TRUE(!jsd__subject_valid_publish("$JS.API.INFO", &e));
    ASSERT_CONTAINS(e.msg, "reserved \"$\" system prefix");
    /* "X-A: 1\r\n" */
    ASSERT_EQ(jsd__header_wire_size(3, 1), 8);
    ASSERT_EQ(JSD__HEADERS_FRAME_BYTES, strlen("NATS/1.0\r\n\r\n"));
    /* what the relay adds fits the reservation: frame, Nats-Msg-Id (64 hex),
     * Nats-Expected-Stream (<= 128) */
    ASSERT_LE(JSD__HEADERS_FRAME_BYTES + jsd__header_wire_size(strlen("Nats-Msg-Id"), 64) +
                  jsd__header_wire_size(strlen("Nats-Expected-Stream"), JSD_STREAM_NAME_MAX),
              JSD_HEADERS_RESERVED_BYTES);
}

/* Effect message ids, pinned to vectors computed outside this code base (the
 * python3 one-liner above, with the parts listed):
 *   v2 ("jsdurable.effect.v2", "ns-1", "order-1", "created")
 *   v1 ("jsdurable.effect.v1", "order-1", "created"), the id effects emitted
 *      before namespaces carry; they keep it in the outbox, so the digest
 *      primitive must keep producing it. */
static void effect_msg_id_vectors(void **state)
{
    (void)state;
    char a[JSD_MSG_ID_MAX], b[JSD_MSG_ID_MAX];
    ASSERT_OK(jsd_effect_msg_id("ns-1", "order-1", "created", a));
    ASSERT_STREQ(a, "9b249320bc437c6f5cc478fcec377c25b9b14ee26fe466380f12c44eb1e94d6c");
    ASSERT_OK(jsd_effect_msg_id("ns-1", NULL, "x", a));
    ASSERT_STREQ(a, "7817522a0944c0723b12f601b586faeee029cafcc863b4229c69dd8460253be0");
    const char *v1[] = {"jsdurable.effect.v1", "order-1", "created"};
    ASSERT_OK(jsd__ld_sha256_hex(v1, NULL, 3, a));
    ASSERT_STREQ(a, "a019263d54a81f54eef0f5393f628fb5c142c467f469dd0a1790c4122ac79cc6");
    /* the namespace separates producers: same (owner, id), other namespace */
    ASSERT_OK(jsd_effect_msg_id("ns-1", "order-1", "created", a));
    ASSERT_OK(jsd_effect_msg_id("ns-2", "order-1", "created", b));
    assert_string_not_equal(a, b);
    /* and is required and validated */
    ASSERT_STATUS(jsd_effect_msg_id(NULL, "order-1", "created", a), JSD_ERR_INVALID);
    ASSERT_STREQ(a, "");
    ASSERT_STATUS(jsd_effect_msg_id("", "order-1", "created", a), JSD_ERR_INVALID);
    ASSERT_STATUS(jsd_effect_msg_id("a b", "order-1", "created", a), JSD_ERR_INVALID);
    char ns[70];
    memset(ns, 'n', 64);
    ns[64] = '\0';
    ASSERT_OK(jsd_effect_msg_id(ns, "o", "k", a));
    ns[64] = 'n';
    ns[65] = '\0';
    ASSERT_STATUS(jsd_effect_msg_id(ns, "o", "k", a), JSD_ERR_INVALID);
}

/* Run by digest_failure_is_an_error with JSD_FAIL_ALLOC_AFTER=0, so the first
 * allocation — the digest's context — fails; alone every call succeeds. */
static void digest_oom_child(void **state)
{
    (void)state;
    char a[JSD_IDEMPOTENCY_ID_SIZE];
    const char *which = getenv("JSD_TEST_DIGEST");
    jsd_error e;
    jsd_error_clear(&e);
    jsd_status st = which && !strcmp(which, "effect")
                        ? jsd_effect_msg_id("ns-1", "order-1", "created", a)
                        : jsd_idempotency_id("ns", "t", "o", "k", a, &e);
    printf("status=%s id=\"%s\" msg=%s\n", jsd_status_name(st), a, e.msg);
    if (st == JSD_OK)
        ASSERT_EQ(strlen(a), 64);
    else
        ASSERT_STREQ(a, "");
    ASSERT_TRUE(strspn(a, "0") < 64 || !*a);
}

/* A digest that cannot be computed is an error, never an all-zero id that
 * every effect would share. */
static void digest_failure_is_an_error(void **state)
{
    (void)state;
    char self[512], cmd[700], out[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    ASSERT_TRUE(n > 0);
    self[n] = '\0';
    snprintf(cmd, sizeof(cmd), "JSD_FAIL_ALLOC_AFTER=0 %s digest_oom_child", self);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "status=JSD_ERR_NOMEM id=\"\"");
    ASSERT_CONTAINS(out, "SHA-256 digest failed");
    snprintf(cmd, sizeof(cmd), "JSD_TEST_DIGEST=effect JSD_FAIL_ALLOC_AFTER=0 %s digest_oom_child",
             self);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "status=JSD_ERR_NOMEM id=\"\"");
    /* and the primitive itself */
    snprintf(cmd, sizeof(cmd), "%s digest_oom_child", self);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "status=JSD_OK id=\"b8e161be");
}

JSD_TEST_MAIN(cmocka_unit_test(stream_names), cmocka_unit_test(exact_subjects),
              cmocka_unit_test(tenant_subjects), cmocka_unit_test(filters_and_matching),
              cmocka_unit_test(pattern_capture), cmocka_unit_test(header_names_and_values),
              cmocka_unit_test(trace_context_values), cmocka_unit_test(idempotency_ids),
              cmocka_unit_test(effect_msg_id_vectors),
              cmocka_unit_test(publish_subjects_and_header_sizes),
              cmocka_unit_test(digest_oom_child), cmocka_unit_test(digest_failure_is_an_error))
