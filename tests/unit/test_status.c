/*
 * Unit tests for status names/texts, error filling and small shared helpers.
 */
#include "test.h"
#include "jsd_int.h"

static void status_names_match_enum(void **state)
{
    (void)state;
    ASSERT_STREQ(jsd_status_name(JSD_OK), "JSD_OK");
    ASSERT_STREQ(jsd_status_name(JSD_ERR_TIMEOUT), "JSD_ERR_TIMEOUT");
    ASSERT_STREQ(jsd_status_str(JSD_ERR_TIMEOUT), "timed out");
    ASSERT_STREQ(jsd_status_name((jsd_status)9999), "JSD_?");
    for (int s = 0; s < JSD__STATUS_COUNT; s++) {
        ASSERT_TRUE(strncmp(jsd_status_name((jsd_status)s), "JSD_", 4) == 0);
        ASSERT_TRUE(strlen(jsd_status_str((jsd_status)s)) > 0);
    }
}

static void error_fill_and_clear(void **state)
{
    (void)state;
    jsd_error e;
    jsd_error_clear(&e);
    ASSERT_EQ(e.status, JSD_OK);
    ASSERT_EQ(jsd__err(&e, JSD_ERR_CONFIG, "stream \"%s\" bad", "ORDERS"), JSD_ERR_CONFIG);
    ASSERT_EQ(e.status, JSD_ERR_CONFIG);
    ASSERT_STREQ(e.msg, "stream \"ORDERS\" bad");
    ASSERT_EQ(jsd__err(NULL, JSD_ERR_IO, "x"), JSD_ERR_IO);
}

static void ld_sha256_is_length_delimited(void **state)
{
    (void)state;
    char a[65], b[65], c[65];
    const char *p1[] = {"ab", "c"}, *p2[] = {"a", "bc"};
    jsd__ld_sha256_hex(p1, NULL, 2, a);
    jsd__ld_sha256_hex(p2, NULL, 2, b);
    jsd__ld_sha256_hex(p1, NULL, 2, c);
    ASSERT_EQ(strlen(a), 64);
    ASSERT_TRUE(strcmp(a, b) != 0);
    ASSERT_STREQ(a, c);
}

static void parse_duration(void **state)
{
    (void)state;
    int64_t v = 0;
    ASSERT_TRUE(jsd__parse_duration_ms("250ms", &v));
    ASSERT_EQ(v, 250);
    ASSERT_TRUE(jsd__parse_duration_ms("2m", &v));
    ASSERT_EQ(v, 120000);
    ASSERT_TRUE(jsd__parse_duration_ms("7d", &v));
    ASSERT_EQ(v, 7LL * 24 * 3600 * 1000);
    ASSERT_TRUE(!jsd__parse_duration_ms("5 weeks", &v));
    ASSERT_TRUE(!jsd__parse_duration_ms("-1s", &v));
}

JSD_TEST_MAIN(cmocka_unit_test(status_names_match_enum), cmocka_unit_test(error_fill_and_clear),
              cmocka_unit_test(ld_sha256_is_length_delimited), cmocka_unit_test(parse_duration))
