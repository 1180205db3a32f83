/*
 * Unit tests for the doctor's pure parts (src/doctor_report.c): the
 * --allow-unsafe lists (names, "all", empty items, a name that is only a
 * prefix of a check, unknown names reported by name), the report's worst
 * level, and jsd_doctor_run's refusal of bad options before it asks
 * anything of a server.
 */
#include <string.h>

#include "doctor_int.h"
#include "test.h"

static void allow_lists(void **state)
{
    (void)state;
    ASSERT_TRUE(jsd_doctor_allowed("stream.storage", "stream.storage"));
    ASSERT_TRUE(jsd_doctor_allowed("server.fsync,stream.storage", "stream.storage"));
    ASSERT_TRUE(jsd_doctor_allowed(",,stream.storage,", "stream.storage"));
    ASSERT_TRUE(jsd_doctor_allowed("all", "durable.inbox_retention"));
    ASSERT_TRUE(!jsd_doctor_allowed("stream", "stream.storage")); /* no prefixes */
    ASSERT_TRUE(!jsd_doctor_allowed("stream.storage2", "stream.storage"));
    ASSERT_TRUE(!jsd_doctor_allowed("", "stream.storage"));
    ASSERT_TRUE(!jsd_doctor_allowed(NULL, "stream.storage"));

    char bad[64] = "";
    ASSERT_TRUE(jsd_doctor_allow_valid("stream.storage,dlq.limits,all", bad, sizeof(bad)));
    ASSERT_TRUE(jsd_doctor_allow_valid(NULL, bad, sizeof(bad)));
    ASSERT_TRUE(!jsd_doctor_allow_valid("stream.storage,stream.nonsense", bad, sizeof(bad)));
    ASSERT_STREQ(bad, "stream.nonsense");
}

static void worst_level(void **state)
{
    (void)state;
    jsd_doctor_report *r = jsd__calloc(1, sizeof(*r));
    ASSERT_TRUE(r != NULL);
    ASSERT_EQ(jsd_doctor_report_worst(r), JSD_DOCTOR_OK);
    jsd__doctor_add(r, "stream.replicas", JSD_DOCTOR_STREAM, "S", JSD_DOCTOR_WARN, "m", "f");
    jsd__doctor_add(r, "server.fsync", JSD_DOCTOR_SERVER, "", JSD_DOCTOR_UNKNOWN, "m", "");
    ASSERT_EQ(jsd_doctor_report_worst(r), JSD_DOCTOR_WARN);
    jsd__doctor_add(r, "stream.storage", JSD_DOCTOR_STREAM, "S", JSD_DOCTOR_ERROR, "m", "f");
    ASSERT_EQ(jsd_doctor_report_worst(r), JSD_DOCTOR_ERROR);
    ASSERT_SIZE_EQ(jsd_doctor_report_count(r), 3);
    const jsd_doctor_result *x = jsd_doctor_report_at(r, 2);
    ASSERT_STREQ(x->check, "stream.storage");
    ASSERT_STREQ(jsd_doctor_level_str(x->level), "error");
    ASSERT_STREQ(jsd_doctor_kind_str(x->kind), "stream");
    ASSERT_PTR_EQ(jsd_doctor_report_at(r, 3), NULL);
    jsd_doctor_report_destroy(r);
}

static void bad_options(void **state)
{
    (void)state;
    jsd_doctor_opts o;
    jsd_doctor_opts_init(&o);
    jsd_doctor_report *r = NULL;
    jsd_error err;
    jsd_error_clear(&err);
    const char *streams[1] = {"bad name"};
    o.streams = streams;
    o.n_streams = 1;
    ASSERT_EQ(jsd_doctor_run(&r, NULL, NULL, &o, &err), JSD_ERR_INVALID);
    ASSERT_PTR_EQ(r, NULL);
    o.n_streams = 0;
    o.monitor_url = "ftp://x";
    ASSERT_EQ(jsd_doctor_run(&r, NULL, NULL, &o, &err), JSD_ERR_INVALID);
    ASSERT_CONTAINS(err.msg, "http://");
    /* nothing to reach: only the fsync check, unknown without a monitoring URL */
    o.monitor_url = NULL;
    ASSERT_EQ(jsd_doctor_run(&r, NULL, NULL, &o, &err), JSD_OK);
    ASSERT_SIZE_EQ(jsd_doctor_report_count(r), 1);
    ASSERT_EQ(jsd_doctor_report_at(r, 0)->level, JSD_DOCTOR_UNKNOWN);
    ASSERT_STREQ(jsd_doctor_report_at(r, 0)->check, "server.fsync");
    jsd_doctor_report_destroy(r);
}

JSD_TEST_MAIN(cmocka_unit_test(allow_lists), cmocka_unit_test(worst_level),
              cmocka_unit_test(bad_options))
