/*
 * Tenancy (SEC-1, SEC-2): the mapping rules are refused before any I/O, a
 * missing or revoked grant is DENIED without writing anything, a granted
 * tenant publishes under the derived idempotency id to its own subject, and
 * the same key is a duplicate while another tenant's same key is not.
 */
#include "conn_int.h"
#include "publisher_env.h"

static jsd_tenancy *table(jsd_conn *c)
{
    jsd_tenancy_opts o;
    jsd_tenancy *t = NULL;
    jsd_error err;
    jsd_tenancy_opts_init(&o);
    o.ns = "shop";
    o.deadline_ms = 3000;
    ASSERT_OK_E(jsd_tenancy_create(&t, c, &o, &err), err.msg);
    return t;
}

static void mapping_rules(void **state)
{
    (void)state;
    jsd_tenancy *t = table(NULL); /* rules only: no connection, so no I/O at all */
    ASSERT_OK_E(jsd_tenancy_map(t, "acme", "orders", "tenants.acme.orders", "TEN"),
                jsd_tenancy_errmsg(t));
    /* wildcards, system and inbox prefixes, bad characters */
    ASSERT_STATUS(jsd_tenancy_map(t, "acme", "orders.*", "tenants.acme.o2", "TEN"),
                  JSD_ERR_INVALID);
    ASSERT_CONTAINS(jsd_tenancy_errmsg(t), "topic refused");
    ASSERT_CONTAINS(jsd_tenancy_errmsg(t), "wildcard");
    ASSERT_STATUS(jsd_tenancy_map(t, "acme", "orders.>", "tenants.acme.o2", "TEN"),
                  JSD_ERR_INVALID);
    ASSERT_STATUS(jsd_tenancy_map(t, "acme", "$SYS.x", "tenants.acme.o2", "TEN"), JSD_ERR_INVALID);
    ASSERT_CONTAINS(jsd_tenancy_errmsg(t), "\"$\" system prefix");
    ASSERT_STATUS(jsd_tenancy_map(t, "acme", "_INBOX.x", "tenants.acme.o2", "TEN"),
                  JSD_ERR_INVALID);
    ASSERT_CONTAINS(jsd_tenancy_errmsg(t), "_INBOX");
    ASSERT_STATUS(jsd_tenancy_map(t, "acme", "o2", "_INBOX.acme", "TEN"), JSD_ERR_INVALID);
    ASSERT_CONTAINS(jsd_tenancy_errmsg(t), "mapped subject refused");
    ASSERT_STATUS(jsd_tenancy_map(t, "acme", "o2", "$JS.API.STREAM.CREATE.X", "TEN"),
                  JSD_ERR_INVALID);
    ASSERT_STATUS(jsd_tenancy_map(t, "acme", "o2", "tenants.acme.*", "TEN"), JSD_ERR_INVALID);
    ASSERT_STATUS(jsd_tenancy_map(t, "ac.me", "o2", "tenants.acme.o2", "TEN"), JSD_ERR_INVALID);
    ASSERT_CONTAINS(jsd_tenancy_errmsg(t), "one token");
    ASSERT_STATUS(jsd_tenancy_map(t, "acme", "o2", "tenants.acme.o2", "T.EN"), JSD_ERR_INVALID);
    /* one mapping per (tenant, topic); two tenants cannot share a subject */
    ASSERT_STATUS(jsd_tenancy_map(t, "acme", "orders", "tenants.acme.other", "TEN"),
                  JSD_ERR_EXISTS);
    ASSERT_STATUS(jsd_tenancy_map(t, "globex", "orders", "tenants.acme.orders", "TEN"),
                  JSD_ERR_EXISTS);
    ASSERT_CONTAINS(jsd_tenancy_errmsg(t), "two tenants cannot share a subject");
    ASSERT_OK(jsd_tenancy_map(t, "globex", "orders", "tenants.globex.orders", "TEN"));
    /* at most 16 mappings */
    char topic[32], subj[64];
    for (int i = 2; i < JSD_TENANCY_MAX; i++) {
        snprintf(topic, sizeof(topic), "t%d", i);
        snprintf(subj, sizeof(subj), "tenants.acme.t%d", i);
        ASSERT_OK_E(jsd_tenancy_map(t, "acme", topic, subj, "TEN"), jsd_tenancy_errmsg(t));
    }
    ASSERT_STATUS(jsd_tenancy_map(t, "acme", "t99", "tenants.acme.t99", "TEN"), JSD_ERR_LIMIT);
    ASSERT_CONTAINS(jsd_tenancy_errmsg(t), "at most 16");

    /* without a grant nothing is published; the key is checked once granted */
    jsd_publish_result r;
    ASSERT_OUTCOME(jsd_tenancy_publish(t, "acme", "orders", "k", "x", 1, NULL, 0, &r),
                   JSD_OUTCOME_DENIED, r);
    ASSERT_CONTAINS(r.reason, "no grant");
    ASSERT_OUTCOME(jsd_tenancy_publish(t, "acme", "unmapped", "k", "x", 1, NULL, 0, &r),
                   JSD_OUTCOME_DENIED, r);
    ASSERT_CONTAINS(r.reason, "no mapping");
    ASSERT_STATUS(jsd_tenancy_grant(t, "acme", "unmapped"), JSD_ERR_NOT_FOUND);
    ASSERT_OK(jsd_tenancy_grant(t, "acme", "orders"));
    ASSERT_OUTCOME(jsd_tenancy_publish(t, "acme", "orders", "", "x", 1, NULL, 0, &r),
                   JSD_OUTCOME_REJECTED, r);
    ASSERT_OUTCOME(jsd_tenancy_publish(t, "acme", "orders", "k", "x", 1, NULL, 0, &r),
                   JSD_OUTCOME_UNAVAILABLE, r);
    jsd_tenancy_destroy(t);
    jsd_tenancy_destroy(NULL);
}

static void grants_and_revocation(void **state)
{
    (void)state;
    jsd_publish_result r;
    const char *url = jsd_fx_shared_nats_url();
    jsd_conn *c = ph_open(url);
    natsConnection *direct = ph_direct(url, NULL, NULL);
    jsCtx *js = ph_js(direct);
    char stream[96], filter[128], acme[128], globex[128];
    snprintf(stream, sizeof(stream), "%s", jsd_test_unique("TEN"));
    snprintf(filter, sizeof(filter), "%s.>", stream);
    snprintf(acme, sizeof(acme), "%s.acme.orders", stream);
    snprintf(globex, sizeof(globex), "%s.globex.orders", stream);
    ph_add_stream(js, &(ph_stream){.name = stream, .subject = filter});

    jsd_tenancy *t = table(c);
    ASSERT_OK_E(jsd_tenancy_map(t, "acme", "orders", acme, stream), jsd_tenancy_errmsg(t));
    ASSERT_OK_E(jsd_tenancy_map(t, "globex", "orders", globex, stream), jsd_tenancy_errmsg(t));
    /* binding rules apply to the mapped stream */
    ASSERT_STATUS(jsd_tenancy_map(t, "acme", "other", "nowhere.x", stream), JSD_ERR_BIND);

    natsConnection *nc = jsd__conn_nats(c);
    uint64_t out0 = ph_out_msgs(nc);
    ASSERT_OUTCOME(jsd_tenancy_publish(t, "acme", "orders", "o-1", "x", 1, NULL, 0, &r),
                   JSD_OUTCOME_DENIED, r);
    ASSERT_EQ(ph_out_msgs(nc), out0); /* refused before any I/O */

    ASSERT_OK(jsd_tenancy_grant(t, "acme", "orders"));
    ASSERT_OK(jsd_tenancy_grant(t, "globex", "orders"));
    ASSERT_OUTCOME(jsd_tenancy_publish(t, "acme", "orders", "o-1", "x", 1, NULL, 0, &r),
                   JSD_OUTCOME_ACCEPTED, r);
    ASSERT_EQ(r.receipt.duplicate, false);
    uint64_t seq = r.receipt.seq;
    /* the stored message carries the derived id, on acme's subject */
    char want[JSD_IDEMPOTENCY_ID_SIZE];
    ASSERT_OK(jsd_idempotency_id("shop", "acme", "orders", "o-1", want, NULL));
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    const char *v = NULL;
    ASSERT_EQ(js_GetMsg(&m, js, stream, seq, NULL, &jerr), NATS_OK);
    ASSERT_STREQ(natsMsg_GetSubject(m), acme);
    ASSERT_EQ(natsMsgHeader_Get(m, "Nats-Msg-Id", &v), NATS_OK);
    ASSERT_STREQ(v, want);
    natsMsg_Destroy(m);

    /* same key again: duplicate; the other tenant's same key: its own message */
    ASSERT_OUTCOME(jsd_tenancy_publish(t, "acme", "orders", "o-1", "x", 1, NULL, 0, &r),
                   JSD_OUTCOME_ACCEPTED, r);
    ASSERT_EQ(r.receipt.duplicate, true);
    ASSERT_OUTCOME(jsd_tenancy_publish(t, "globex", "orders", "o-1", "x", 1, NULL, 0, &r),
                   JSD_OUTCOME_ACCEPTED, r);
    ASSERT_EQ(r.receipt.duplicate, false);
    ASSERT_EQ(ph_stream_msgs(js, stream), 2);

    /* revocation takes effect at once, before any I/O */
    ASSERT_OK(jsd_tenancy_revoke(t, "acme", "orders"));
    out0 = ph_out_msgs(nc);
    ASSERT_OUTCOME(jsd_tenancy_publish(t, "acme", "orders", "o-2", "x", 1, NULL, 0, &r),
                   JSD_OUTCOME_DENIED, r);
    ASSERT_CONTAINS(r.reason, "revoked");
    ASSERT_EQ(ph_out_msgs(nc), out0);
    ASSERT_EQ(ph_stream_msgs(js, stream), 2);
    /* globex is unaffected */
    ASSERT_OUTCOME(jsd_tenancy_publish(t, "globex", "orders", "o-2", "x", 1, NULL, 0, &r),
                   JSD_OUTCOME_ACCEPTED, r);

    jsd_tenancy_destroy(t);
    jsCtx_Destroy(js);
    natsConnection_Destroy(direct);
    jsd_conn_close(c);
}

JSD_TEST_MAIN(cmocka_unit_test(mapping_rules), cmocka_unit_test(grants_and_revocation))
