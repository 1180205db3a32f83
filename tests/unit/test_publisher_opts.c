/*
 * Unit tests for the publisher's pure parts: option defaults and the checks
 * that happen before any connection is touched, outcome names, and the
 * tenancy table's own argument checks.
 */
#include "test.h"
#include "pubengine.h"

static void defaults_and_names(void **state)
{
    (void)state;
    jsd_publisher_opts o;
    jsd_publisher_opts_init(&o);
    ASSERT_EQ(o.admission, 256);
    ASSERT_EQ(o.deadline_ms, 5000);
    ASSERT_EQ(o.expected_duplicate_window_ms, 0);
    ASSERT_EQ(o.max_payload, 0);
    const char *names[] = {"accepted", "retryable", "rejected", "unavailable",
                           "denied",   "failed",    "unknown"};
    for (int i = 0; i < JSD__OUTCOME_COUNT; i++)
        ASSERT_STREQ(jsd_outcome_str((jsd_outcome)i), names[i]);
    ASSERT_STREQ(jsd_outcome_str(JSD__OUTCOME_COUNT), "?");
}

static void bind_refuses_bad_arguments_without_io(void **state)
{
    (void)state;
    jsd_publisher *p = (jsd_publisher *)1;
    jsd_publisher_opts o;
    jsd_error err;
    jsd_publisher_opts_init(&o);
    ASSERT_STATUS(jsd_publisher_bind(NULL, NULL, &o, &err), JSD_ERR_INVALID);
    ASSERT_STATUS(jsd_publisher_bind(&p, NULL, &o, &err), JSD_ERR_INVALID);
    ASSERT_TRUE(p == NULL);
    ASSERT_CONTAINS(err.msg, "connection");

    jsd__pubengine *e = (jsd__pubengine *)1;
    jsd__pubengine_opts eo = {.admission = 0, .deadline_ms = 1000};
    ASSERT_STATUS(jsd__pubengine_create(&e, NULL, &eo, &err), JSD_ERR_INVALID);
    ASSERT_TRUE(e == NULL);
    jsd__pubengine_destroy(NULL);
    ASSERT_EQ(jsd__pubengine_inflight(NULL), 0);
    ASSERT_EQ(jsd__pubengine_poll(NULL, NULL, 0, 0), 0);
}

static void publish_without_publisher(void **state)
{
    (void)state;
    jsd_publish_result r;
    ASSERT_EQ(jsd_publish(NULL, "id", "x", 1, NULL, 0, &r), JSD_OUTCOME_REJECTED);
    ASSERT_CONTAINS(r.reason, "no publisher");
    ASSERT_EQ(jsd_publish(NULL, "id", "x", 1, NULL, 0, NULL), JSD_OUTCOME_REJECTED);
    ASSERT_EQ(jsd_publisher_inflight(NULL), 0);
    ASSERT_STREQ(jsd_publisher_errmsg(NULL), "");
    jsd_publisher_destroy(NULL);
}

static void tenancy_arguments(void **state)
{
    (void)state;
    jsd_tenancy_opts o;
    jsd_tenancy *t = NULL;
    jsd_error err;
    jsd_tenancy_opts_init(&o);
    ASSERT_STATUS(jsd_tenancy_create(&t, NULL, &o, &err), JSD_ERR_INVALID);
    ASSERT_CONTAINS(err.msg, "namespace");
    o.ns = "shop";
    o.admission = 2000;
    ASSERT_STATUS(jsd_tenancy_create(&t, NULL, &o, &err), JSD_ERR_INVALID);
    o.admission = 1;
    o.deadline_ms = 0;
    ASSERT_STATUS(jsd_tenancy_create(&t, NULL, &o, &err), JSD_ERR_INVALID);
    o.deadline_ms = 1;
    ASSERT_OK(jsd_tenancy_create(&t, NULL, &o, &err));
    char tenant[80];
    memset(tenant, 't', 65);
    tenant[65] = '\0';
    ASSERT_STATUS(jsd_tenancy_map(t, tenant, "a", "b.c", "S"), JSD_ERR_INVALID);
    ASSERT_CONTAINS(jsd_tenancy_errmsg(t), "65 bytes; the limit is 64");
    ASSERT_STATUS(jsd_tenancy_map(t, "", "a", "b.c", "S"), JSD_ERR_INVALID);
    ASSERT_STATUS(jsd_tenancy_revoke(t, "x", "y"), JSD_ERR_NOT_FOUND);
    jsd_tenancy_destroy(t);
}

JSD_TEST_MAIN(cmocka_unit_test(defaults_and_names),
              cmocka_unit_test(bind_refuses_bad_arguments_without_io),
              cmocka_unit_test(publish_without_publisher), cmocka_unit_test(tenancy_arguments))
