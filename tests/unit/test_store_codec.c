/*
 * Pure parts of the store: the headers column codec (round trip, and no
 * malformed input is ever accepted or read past its end), effect message ids,
 * the backoff schedule, subject checks and URL redaction; claimed batches
 * (each row's copy intact whatever the sizes, sorted by id, and a cleared
 * batch keeping a bounded part of its storage).
 */
#include <stdlib.h>

#include "store/backend.h"
#include "test.h"

static void headers_round_trip(void **state)
{
    (void)state;
    char big[257];
    memset(big, 'v', 256);
    big[256] = '\0';
    jsd_header h[3] = {{"X-A", "1"}, {"Content-Type", "application/json"}, {"X-Big", big}};
    size_t sz = jsd__headers_encoded_size(h, 3);
    unsigned char *enc = malloc(sz);
    assert_non_null(enc);
    jsd__headers_encode(h, 3, enc);
    size_t n = 0;
    size_t dsz = jsd__headers_decoded_size(enc, sz, &n);
    ASSERT_EQ(n, 3);
    assert_true(dsz != SIZE_MAX);
    char *mem = malloc(dsz);
    jsd_header *out = (jsd_header *)(void *)mem;
    assert_true(jsd__headers_decode(enc, sz, out, mem + n * sizeof(jsd_header)));
    for (int i = 0; i < 3; i++) {
        ASSERT_STREQ(out[i].name, h[i].name);
        ASSERT_STREQ(out[i].value, h[i].value);
    }
    /* Every truncation, and every trailing byte, is refused. */
    for (size_t cut = 1; cut < sz; cut++)
        ASSERT_EQ(jsd__headers_decoded_size(enc, cut, &n), SIZE_MAX);
    unsigned char *longer = malloc(sz + 1);
    memcpy(longer, enc, sz);
    longer[sz] = 0;
    ASSERT_EQ(jsd__headers_decoded_size(longer, sz + 1, &n), SIZE_MAX);
    enc[0] = 2; /* unknown version */
    ASSERT_EQ(jsd__headers_decoded_size(enc, sz, &n), SIZE_MAX);
    /* Random bytes never decode past their end (run under ASan). */
    srand(7);
    for (int k = 0; k < 20000; k++) {
        size_t len = (size_t)(rand() % 64);
        unsigned char *r = malloc(len ? len : 1);
        for (size_t i = 0; i < len; i++)
            r[i] = (unsigned char)(k % 3 == 0 && i == 0 ? 1 : rand() & 0xff);
        size_t m;
        size_t need = jsd__headers_decoded_size(r, len, &m);
        if (need != SIZE_MAX && need > 0) {
            char *mm = malloc(need);
            assert_true(
                jsd__headers_decode(r, len, (jsd_header *)(void *)mm, mm + m * sizeof(jsd_header)));
            free(mm);
        }
        free(r);
    }
    ASSERT_EQ(jsd__headers_decoded_size(NULL, 0, &n), 0);
    ASSERT_EQ(n, 0);
    free(longer);
    free(mem);
    free(enc);
}

static void msg_ids_are_stable_and_delimited(void **state)
{
    (void)state;
    char a[JSD_MSG_ID_MAX], b[JSD_MSG_ID_MAX];
    ASSERT_OK(jsd_effect_msg_id("ns", "order-42", "created", a));
    ASSERT_OK(jsd_effect_msg_id("ns", "order-42", "created", b));
    ASSERT_STREQ(a, b);
    ASSERT_EQ(strlen(a), 64);
    ASSERT_OK(jsd_effect_msg_id("ns", "order-4", "2created", b));
    assert_string_not_equal(a, b);
    ASSERT_OK(jsd_effect_msg_id("nso", "rder-42", "created", b)); /* namespace delimited too */
    assert_string_not_equal(a, b);
    ASSERT_OK(jsd_effect_msg_id("ns", NULL, "x", a));
    ASSERT_OK(jsd_effect_msg_id("ns", "", "x", b));
    ASSERT_STREQ(a, b);
    ASSERT_STATUS(jsd_effect_msg_id("ns", "o", NULL, a), JSD_ERR_INVALID);
}

static void backoff_schedule(void **state)
{
    (void)state;
    jsd__backoff b;
    jsd__backoff_init(&b);
    ASSERT_EQ(b.base_ms, 1000);
    ASSERT_EQ(b.cap_ms, 300000);
    b.jitter_pct = 0;
    ASSERT_EQ(jsd__backoff_delay_ms(&b, 1, 5), 1000);
    ASSERT_EQ(jsd__backoff_delay_ms(&b, 2, 5), 2000);
    ASSERT_EQ(jsd__backoff_delay_ms(&b, 9, 5), 256000);
    ASSERT_EQ(jsd__backoff_delay_ms(&b, 10, 5), 300000);
    ASSERT_EQ(jsd__backoff_delay_ms(&b, 1000000, 5), 300000); /* no overflow */
    b.jitter_pct = 100;
    for (int n = 1; n < 60; n++) {
        int64_t d = jsd__backoff_delay_ms(&b, n, n * 7);
        ASSERT_TRUE(d >= 0 && d <= 300000);
    }
    b = (jsd__backoff){.base_ms = 0, .cap_ms = -5, .jitter_pct = 500};
    ASSERT_TRUE(jsd__backoff_delay_ms(&b, 3, 1) >= 0);
}

static void subjects_and_redaction(void **state)
{
    (void)state;
    jsd_error e;
    ASSERT_OK(jsd__store_check_subject("orders.created", &e));
    ASSERT_OK(jsd__store_check_subject("a-b_c.D9", &e));
    ASSERT_STATUS(jsd__store_check_subject("orders.>", &e), JSD_ERR_INVALID);
    ASSERT_STATUS(jsd__store_check_subject("", &e), JSD_ERR_INVALID);
    ASSERT_STATUS(jsd__store_check_subject(NULL, NULL), JSD_ERR_INVALID);
    char s[300];
    memset(s, 'a', 257);
    s[257] = '\0';
    ASSERT_STATUS(jsd__store_check_subject(s, &e), JSD_ERR_LIMIT);
    s[256] = '\0';
    ASSERT_OK(jsd__store_check_subject(s, &e));

    char out[200];
    jsd__store_redact_url("postgresql://app:s3cret@db.example:5432/app?sslmode=verify-full", out,
                          sizeof(out));
    ASSERT_STREQ(out, "postgresql://app:***@db.example:5432/app?sslmode=verify-full");
    jsd__store_redact_url("postgres://app@h/db?password=s3cret&x=1", out, sizeof(out));
    ASSERT_STREQ(out, "postgres://app@h/db?password=***&x=1");
    jsd__store_redact_url("postgres://a:b:c@h/db", out, sizeof(out));
    ASSERT_NOT_CONTAINS(out, "b:c");
    jsd__store_redact_url("postgres://u:pa/ss?w@rd#x@h/db", out, sizeof(out));
    ASSERT_STREQ(out, "postgres://u:***@h/db");
    jsd__store_redact_url("postgres:u:s3cret@h/db", out, sizeof(out)); /* "//" forgotten */
    ASSERT_STREQ(out, "postgres:***@h/db");
    jsd_store *st = NULL;
    jsd_error e2;
    jsd_error_clear(&e2);
    ASSERT_STATUS(jsd_store_open(&st, "postgres:u:s3cret@h/db", &e2), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(e2.msg, "unknown scheme");
    ASSERT_NOT_CONTAINS(e2.msg, "s3cret");
    jsd__store_redact_url("sqlite:/var/lib/app.db", out, sizeof(out));
    ASSERT_STREQ(out, "sqlite:/var/lib/app.db");
    jsd__store_redact_url("postgres://u:longpassword@h/db", out, 12);
    ASSERT_NOT_CONTAINS(out, "longpass");
    ASSERT_EQ(strlen(out), 11);
}

static void add_row(jsd__effect_batch *b, int64_t id, size_t len)
{
    char eid[32], subject[64];
    snprintf(eid, sizeof(eid), "e%lld", (long long)id);
    snprintf(subject, sizeof(subject), "orders.%lld", (long long)id);
    unsigned char *payload = malloc(len ? len : 1);
    assert_non_null(payload);
    memset(payload, (int)(id & 0xff), len);
    char msg_id[80];
    snprintf(msg_id, sizeof(msg_id), "own:e%lld", (long long)id);
    jsd__claimed_row r = {.row_id = id,
                          .owner = "own",
                          .owner_len = 3,
                          .effect_id = eid,
                          .id_len = strlen(eid),
                          .msg_id = msg_id,
                          .msg_id_len = strlen(msg_id),
                          .subject = subject,
                          .subject_len = strlen(subject),
                          .payload = payload,
                          .len = len};
    ASSERT_EQ(jsd__batch_add(b, &r), JSD_OK);
    free(payload);
}

static void check_rows(const jsd__effect_batch *b, size_t big_every)
{
    for (size_t i = 0; i < b->n; i++) {
        const jsd__claimed *c = &b->items[i];
        int64_t id = c->row_id;
        char want[64];
        snprintf(want, sizeof(want), "e%lld", (long long)id);
        ASSERT_STREQ(c->effect_id, want);
        snprintf(want, sizeof(want), "orders.%lld", (long long)id);
        ASSERT_STREQ(c->subject, want);
        ASSERT_STREQ(c->owner, "own");
        ASSERT_EQ(c->len, (size_t)(id % big_every == 0 ? 100000 : 200 + id));
        for (size_t k = 0; k < c->len; k++)
            if (c->payload[k] != (unsigned char)(id & 0xff))
                fail_msg("row %lld: payload byte %zu overwritten", (long long)id, k);
        ASSERT_EQ(c->defect[0], '\0');
    }
}

static void claimed_batches_keep_rows_apart(void **state)
{
    (void)state;
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    for (int round = 0; round < 3; round++) {
        /* out of id order, small rows between payloads larger than a chunk */
        for (int64_t id = 300; id >= 1; id--)
            add_row(&b, id, id % 50 == 0 ? 100000 : (size_t)(200 + id));
        ASSERT_EQ(b.n, 300);
        jsd__batch_sort(&b);
        for (size_t i = 0; i < b.n; i++)
            ASSERT_EQ(b.items[i].row_id, (int64_t)i + 1);
        check_rows(&b, 50);
        assert_true(jsd__effect_batch_held_bytes(&b) >= 6 * 100000);
        /* cleared: reusable, and the large payloads' storage is let go */
        jsd__effect_batch_clear(&b);
        ASSERT_EQ(b.n, 0);
        assert_true(jsd__effect_batch_held_bytes(&b) <= 512 * 1024);
    }
    jsd__effect_batch_free(&b);
    ASSERT_EQ(jsd__effect_batch_held_bytes(&b), 0);
}

JSD_TEST_MAIN(cmocka_unit_test(headers_round_trip),
              cmocka_unit_test(msg_ids_are_stable_and_delimited),
              cmocka_unit_test(backoff_schedule), cmocka_unit_test(subjects_and_redaction),
              cmocka_unit_test(claimed_batches_keep_rows_apart))
