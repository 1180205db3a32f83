/*
 * Unit tests for src/natsmsg.c: the publication engine and the consumer make
 * and free their messages past two per-message costs of nats.c 3.4.1 (the
 * header hash table, the collector thread's wake-up). No server is needed:
 * the messages are compared with ones made through nats.c's public API.
 */
#include <malloc.h>
#include <stdlib.h>

#include "test.h"
#include "natsmsg.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

#define BIG (4 << 20) /* above glibc's mmap threshold: its own mapping */

/* The libnats this was built against exports natsMsg_create and
 * natsMsg_free; without them the library falls back to the public API and
 * pays its costs again. */
static void this_libnats_allows_the_shortcuts(void **state)
{
    (void)state;
    if (!jsd__msg_direct())
        fail_msg("libnats lacks natsMsg_create or natsMsg_free: messages are made and freed "
                 "through its public API");
}

/* Every value of every header name of m, in order, as "name=v1|v2;..." for
 * the names given. */
static void header_text(natsMsg *m, const char *const *names, size_t n, char *out, size_t cap)
{
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        const char **vals = NULL;
        int nv = 0;
        natsStatus s = natsMsgHeader_Values(m, names[i], &vals, &nv);
        size_t at = strlen(out);
        snprintf(out + at, cap - at, "%s=", names[i]);
        for (int k = 0; s == NATS_OK && k < nv; k++) {
            at = strlen(out);
            snprintf(out + at, cap - at, "%s%s", k ? "|" : "", vals[k]);
        }
        at = strlen(out);
        snprintf(out + at, cap - at, "%s;", s == NATS_OK ? "" : "(none)");
        free((void *)vals);
    }
}

/* The same subject, reply, headers (a repeated name among them) and data as natsMsg_Create with
 * natsMsgHeader_Add; a payload larger than the scratch buffer so far grows it. */
static void a_made_message_equals_the_public_apis(void **state)
{
    (void)state;
    const jsd_header fixed[] = {{"Nats-Msg-Id", "store-1:e-42"},
                                {"Nats-Expected-Stream", "ORDERS"}};
    const jsd_header extra[] = {{"Jsd-Attr-tenant", "acme"},
                                {"Jsd-Attr-tenant", "beta"},
                                {"Jsd-Spaced", "a b"},
                                {"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b71-01"}};
    const char *names[] = {"Nats-Msg-Id", "Nats-Expected-Stream", "Jsd-Attr-tenant",
                           "Jsd-Spaced",  "traceparent",          "Absent"};
    jsd__msg_scratch sc = {0};
    for (size_t len = 0; len <= 70000; len = len ? len * 10 : 7) {
        char *data = malloc(len + 1);
        ASSERT_TRUE(data != NULL);
        for (size_t i = 0; i < len; i++)
            data[i] = (char)('a' + i % 26);
        natsMsg *mine = NULL, *theirs = NULL;
        ASSERT_EQ(jsd__msg_make(&mine, "orders.created", "_INBOX.x.17", fixed, 2, extra, 4, data,
                                len, &sc),
                  NATS_OK);
        ASSERT_EQ(natsMsg_Create(&theirs, "orders.created", "_INBOX.x.17", data, (int)len),
                  NATS_OK);
        for (size_t i = 0; i < 2; i++)
            ASSERT_EQ(natsMsgHeader_Add(theirs, fixed[i].name, fixed[i].value), NATS_OK);
        for (size_t i = 0; i < 4; i++)
            ASSERT_EQ(
                natsMsgHeader_Add(theirs, extra[i].name, extra[i].value ? extra[i].value : ""),
                NATS_OK);
        ASSERT_STREQ(natsMsg_GetSubject(mine), natsMsg_GetSubject(theirs));
        ASSERT_STREQ(natsMsg_GetReply(mine), natsMsg_GetReply(theirs));
        ASSERT_EQ(natsMsg_GetDataLength(mine), (int)len);
        ASSERT_TRUE(memcmp(natsMsg_GetData(mine), data, len) == 0);
        char a[512], b[512];
        header_text(mine, names, 6, a, sizeof(a));
        header_text(theirs, names, 6, b, sizeof(b));
        ASSERT_STREQ(a, b);
        ASSERT_CONTAINS(a, "Jsd-Attr-tenant=acme|beta;");
        ASSERT_CONTAINS(a, "Jsd-Spaced=a b;");
        jsd__msg_free(mine);
        jsd__msg_free(theirs);
        free(data);
    }
    jsd__msg_scratch_free(&sc);
    ASSERT_TRUE(sc.p == NULL);
}

/* No headers: a plain message, as natsMsg_Create makes it. */
static void a_message_without_headers(void **state)
{
    (void)state;
    jsd__msg_scratch sc = {0};
    natsMsg *m = NULL;
    ASSERT_EQ(jsd__msg_make(&m, "a.b", NULL, NULL, 0, NULL, 0, "xyz", 3, &sc), NATS_OK);
    ASSERT_STREQ(natsMsg_GetSubject(m), "a.b");
    ASSERT_TRUE(natsMsg_GetReply(m) == NULL);
    ASSERT_EQ(natsMsg_GetDataLength(m), 3);
    const char *v = NULL;
    ASSERT_EQ(natsMsgHeader_Get(m, "Nats-Msg-Id", &v), NATS_NOT_FOUND);
    jsd__msg_free(m);
    jsd__msg_scratch_free(&sc);
}

/* Why header values are never empty and never start or end with white space
 * (jsd__header_value_edges in src/subject.h): nats.c 3.4.1 reads a message's
 * headers (as received: the made message is one) by skipping all white space
 * after a ':', line ends included. An empty value last makes every header of
 * the message unreadable, Nats-Msg-Id among them; one before another header
 * takes that header's line as its value; white space around a value is
 * dropped. If this test fails, nats.c reads them right and the rule could go. */
static void nats_c_misreads_empty_and_padded_header_values(void **state)
{
    (void)state;
    jsd__msg_scratch sc = {0};
    const jsd_header last[] = {{"Nats-Msg-Id", "m-1"}, {"X", ""}};
    const jsd_header first[] = {{"X", ""}, {"Nats-Msg-Id", "m-1"}};
    const jsd_header padded[] = {{"Nats-Msg-Id", "m-1"}, {"X", " v "}};
    natsMsg *m = NULL;
    const char *v = NULL;

    ASSERT_EQ(jsd__msg_make(&m, "a.b", NULL, last, 2, NULL, 0, "d", 1, &sc), NATS_OK);
    ASSERT_TRUE(natsMsgHeader_Get(m, "Nats-Msg-Id", &v) != NATS_OK);
    jsd__msg_free(m);

    ASSERT_EQ(jsd__msg_make(&m, "a.b", NULL, first, 2, NULL, 0, "d", 1, &sc), NATS_OK);
    ASSERT_EQ(natsMsgHeader_Get(m, "X", &v), NATS_OK);
    ASSERT_STREQ(v, "Nats-Msg-Id: m-1");
    jsd__msg_free(m);

    ASSERT_EQ(jsd__msg_make(&m, "a.b", NULL, padded, 2, NULL, 0, "d", 1, &sc), NATS_OK);
    ASSERT_EQ(natsMsgHeader_Get(m, "X", &v), NATS_OK);
    ASSERT_STREQ(v, "v");
    jsd__msg_free(m);
    jsd__msg_scratch_free(&sc);
}

/* A message is gone when jsd__msg_free returns: the memory glibc mapped for
 * it is unmapped by then, not later by nats.c's collector thread. */
static void a_message_is_freed_before_the_call_returns(void **state)
{
    (void)state;
    const char *p = getenv("LD_PRELOAD");
    if (SANITIZED || (p && strstr(p, "vgpreload"))) {
        skip(); /* their allocators keep their own books */
        return;
    }
    char *data = calloc(1, BIG);
    ASSERT_TRUE(data != NULL);
    size_t before = mallinfo2().hblkhd;
    natsMsg *m = NULL;
    ASSERT_EQ(natsMsg_Create(&m, "a.b", NULL, data, BIG), NATS_OK);
    ASSERT_EQ(natsMsgHeader_Set(m, "Nats-Msg-Id", "one"), NATS_OK);
    ASSERT_TRUE(mallinfo2().hblkhd >= before + BIG);
    jsd__msg_free(m);
    ASSERT_EQ(mallinfo2().hblkhd, before);
    free(data);
}

static void null_is_ignored(void **state)
{
    (void)state;
    jsd__msg_free(NULL);
    jsd__msg_scratch_free(NULL);
}

JSD_TEST_MAIN(cmocka_unit_test(this_libnats_allows_the_shortcuts),
              cmocka_unit_test(a_made_message_equals_the_public_apis),
              cmocka_unit_test(a_message_without_headers),
              cmocka_unit_test(nats_c_misreads_empty_and_padded_header_values),
              cmocka_unit_test(a_message_is_freed_before_the_call_returns),
              cmocka_unit_test(null_is_ignored))
