/*
 * Deliveries from a foreign publisher (plain nats.c publications, not the
 * relay's) that break the project's limits, against a real nats-server and
 * both store back ends (DLQ-1, issue 42 item 3): a batch of six in which one
 * message has a Nats-Msg-Id of 300 bytes (the server takes ids far longer than
 * JSD_IDENT_MAX), or a control byte in its Nats-Msg-Id, or a tracestate header
 * over JSD_TRACESTATE_MAX. That one delivery is poison on its own — a poison
 * record with a safe rendering of its id and its original header bytes, one
 * death envelope, TERM — and the five others are applied once and ACKed;
 * nothing is left pending or unacknowledged. Through the library
 * (jsd_consumer_poll) and through `jsdurable consume --sql --until-idle`.
 */
#include "consumer_int.h"
#include "store/store.h"
#include "consumer_env.h"

#define BAD_AT 3 /* the stream sequence of the foreign message that breaks a limit */

typedef struct fctx {
    int calls;
    bool saw_bad; /* the handler was handed the bad delivery */
} fctx;

static jsd_disposition sink(jsd_tx *tx, const jsd_delivery *d, void *user)
{
    fctx *h = user;
    char sql[256];
    size_t len = 0;
    const char *p = jsd_delivery_payload(d, &len);
    uint64_t seq = jsd_delivery_stream_seq(d);
    h->calls++;
    h->saw_bad |= seq == BAD_AT;
    snprintf(sql, sizeof(sql), "INSERT INTO effects(seq, body) VALUES (%llu, '%.*s')",
             (unsigned long long)seq, (int)(len < 60 ? len : 60), p ? p : "");
    if (!cenv_tx_exec(tx, sql))
        return jsd_disposition_retry(0, "insert failed");
    return jsd_disposition_commit();
}

#define POLL_UNTIL(c, h, cond, ms) CENV_POLL_UNTIL(jsd_consumer_poll, c, sink, h, cond, ms)

/* What the foreign message carries: its Nats-Msg-Id (NULL: "id-3", like the
 * others) and one more header (NULL: none). */
typedef struct foreign {
    const char *msg_id;
    const char *hname, *hval;
    const char *why;   /* in the poison record's diagnostic and Jsd-Dlq-Error */
    const char *shown; /* the id as the poison record and death envelope keep it */
} foreign;

/* Six messages "<prefix>.k" (k = 1..6, stream sequences 1..6), body "msg-k",
 * Nats-Msg-Id "id-k", published with raw nats.c; message BAD_AT as f says. */
static void publish_six(cenv *e, const foreign *f)
{
    for (int k = 1; k <= 6; k++) {
        char subj[128], body[64], id[64];
        natsMsg *m = NULL;
        jsPubAck *pa = NULL;
        jsPubOptions po;
        jsErrCode jerr = 0;
        snprintf(subj, sizeof(subj), "%s.%d", e->prefix, k);
        snprintf(body, sizeof(body), "msg-%d", k);
        snprintf(id, sizeof(id), "id-%d", k);
        ASSERT_EQ(natsMsg_Create(&m, subj, NULL, body, (int)strlen(body)), NATS_OK);
        jsPubOptions_Init(&po);
        po.MsgId = id;
        if (k == BAD_AT) {
            if (f->msg_id)
                po.MsgId = f->msg_id;
            if (f->hname)
                ASSERT_EQ(natsMsgHeader_Set(m, f->hname, f->hval), NATS_OK);
        }
        natsStatus s = js_PublishMsg(&pa, e->js, m, &po, &jerr);
        if (s != NATS_OK)
            fail_msg("publish %d: %s (jerr %d)", k, natsStatus_GetText(s), (int)jerr);
        ASSERT_U64_EQ(pa->Sequence, (uint64_t)k);
        jsPubAck_Destroy(pa);
        natsMsg_Destroy(m);
    }
}

/* The evidence of the one poison delivery, in the store and in the
 * dead-letter stream, and nothing left on the durable. */
static void check_evidence(cenv *e, const foreign *f)
{
    char sql[256];
    /* Its inbox row says POISON; with an id outside the rules its identity
     * is the delivery's key ("@<seq>.<time>"), not the id: no identity a
     * later message could duplicate. */
    snprintf(sql, sizeof(sql),
             "SELECT COUNT(*) FROM jsd_inbox WHERE stream_seq = %d AND outcome = 2 AND %s", BAD_AT,
             f->msg_id ? "msg_id LIKE '@3.%'" : "msg_id = 'id-3'");
    ASSERT_EQ(cenv_store_scalar(e->store, sql), 1);
    ASSERT_EQ(cenv_store_scalar(e->store, "SELECT COUNT(*) FROM jsd_inbox"), 6);
    ASSERT_EQ(cenv_store_scalar(e->store, "SELECT COUNT(*) FROM jsd_poison"), 1);

    jsd__poison_record r;
    memset(&r, 0, sizeof(r));
    ASSERT_OK(jsd__store_poison_get(e->store, e->stream, e->durable, BAD_AT, &r),
              jsd_store_errmsg(e->store));
    ASSERT_STREQ(r.msg_id, f->shown);
    ASSERT_CONTAINS(r.diagnostic, f->why);
    ASSERT_SIZE_EQ(r.len, 5);
    ASSERT_TRUE(memcmp(r.payload, "msg-3", 5) == 0);
    ASSERT_U64_NE(r.dlq_seq, 0); /* its death envelope is in */
    /* The original header bytes are kept verbatim, the offending one too. */
    char line[4096];
    if (f->hname)
        snprintf(line, sizeof(line), "%s: %s\r\n", f->hname, f->hval);
    else
        snprintf(line, sizeof(line), "Nats-Msg-Id: %s\r\n", f->msg_id);
    ASSERT_TRUE(r.headers && memmem(r.headers, r.headers_len, line, strlen(line)) != NULL);
    jsd__poison_record_clear(&r);

    ASSERT_EQ(cenv_stream_msgs(e, e->dlq_stream), 1);
    jsd_dead_letter d;
    jsd_error err;
    jsd_error_clear(&err);
    ASSERT_OK_E(jsd_dlq_get(e->conn, e->dlq_stream, 1, &d, &err), err.msg);
    ASSERT_STREQ(d.reason, "poison");
    ASSERT_U64_EQ(d.stream_seq, BAD_AT);
    ASSERT_U64_EQ(d.deliveries, 1);
    ASSERT_STREQ(d.msg_id, f->shown);
    ASSERT_CONTAINS(d.error, f->why);
    ASSERT_SIZE_EQ(d.len, 5);
    ASSERT_TRUE(memcmp(d.payload, "msg-3", 5) == 0);
    jsd_dead_letter_clear(&d);

    /* TERMed and ACKed, on first delivery: nothing can come again. */
    jsConsumerInfo *ci = cenv_info(e);
    ASSERT_TRUE(ci != NULL);
    ASSERT_U64_EQ(ci->NumPending, 0);
    ASSERT_EQ(ci->NumAckPending, 0);
    ASSERT_EQ(ci->NumRedelivered, 0);
    ASSERT_U64_EQ(ci->Delivered.Stream, 6);
    jsConsumerInfo_Destroy(ci);
}

/* The five valid messages applied once each; the foreign one never handed
 * to the handler. */
static void check_applied(cenv *e)
{
    ASSERT_EQ(cenv_store_scalar(e->store, "SELECT COUNT(*) FROM effects"), 5);
    ASSERT_EQ(cenv_store_scalar(e->store, "SELECT COUNT(DISTINCT seq) FROM effects"), 5);
    ASSERT_EQ(cenv_store_scalar(e->store, "SELECT COUNT(*) FROM effects WHERE seq = 3"), 0);
    ASSERT_EQ(cenv_store_scalar(e->store, "SELECT COUNT(*) FROM jsd_inbox WHERE outcome = 1 AND "
                                          "msg_id LIKE 'id-%'"),
              5);
}

static void one_bad_in_six(bool pg, const foreign *f)
{
    cenv e;
    fctx h = {0};
    cenv_up(&e, pg);
    cenv_store_exec(e.store, "CREATE TABLE effects(seq BIGINT, body TEXT)");
    /* A short schedule, so that a batch NAKed as a whole would run out of
     * deliveries within the test's deadline: 3 deliveries, 1 s apart. */
    cenv_durable(&e, 1000, 3, 1024, NULL, 0);
    publish_six(&e, f);
    jsd_consumer *c = cenv_consumer(&e, NULL);
    jsd_consumer_stats s;
    POLL_UNTIL(c, &h, (jsd_consumer_stats_get(c, &s), s.committed >= 5 && s.poisoned >= 1), 10000);
    POLL_UNTIL(c, &h, cenv_settled(&e), 5000);
    jsd_consumer_stats_get(c, &s);
    ASSERT_U64_EQ(s.max_batch, 6); /* the six came as one batch */
    ASSERT_U64_EQ(s.fetched, 6);
    ASSERT_U64_EQ(s.committed, 5);
    ASSERT_U64_EQ(s.poisoned, 1);
    ASSERT_U64_EQ(s.parked, 0);
    ASSERT_U64_EQ(s.retried, 0);
    ASSERT_U64_EQ(s.commit_failures, 0);
    ASSERT_U64_EQ(s.dlq_deferred, 0);
    ASSERT_EQ(h.calls, 5);
    ASSERT_TRUE(!h.saw_bad);
    double v = 0;
    ASSERT_OK(jsd_metrics_get(jsd_metrics_default(), "jsd_deliveries_total", "poison", &v));
    ASSERT_EQ((long long)v, 1);
    check_applied(&e);
    check_evidence(&e, f);
    jsd_consumer_destroy(c);
    cenv_down(&e);
}

/* ---- a Nats-Msg-Id of 300 bytes ----------------------------------------------------------- */
static char long_id[301], long_shown[JSD_IDENT_MAX + 1];

static void msg_id_over_limit(bool pg)
{
    /* "long-" then 295 letters; kept as its first 253 bytes and "..." */
    memcpy(long_id, "long-", 5);
    for (size_t i = 5; i < 300; i++)
        long_id[i] = (char)('a' + i % 26);
    long_id[300] = '\0';
    snprintf(long_shown, sizeof(long_shown), "%.253s...", long_id);
    foreign f = {.msg_id = long_id, .why = "Nats-Msg-Id is 300 bytes", .shown = long_shown};
    one_bad_in_six(pg, &f);
}

/* ---- a control byte in the Nats-Msg-Id ---------------------------------------------------- */
static void msg_id_control_byte(bool pg)
{
    foreign f = {.msg_id = "bad\001id",
                 .why = "Nats-Msg-Id has a byte outside printable UTF-8",
                 .shown = "bad\\x01id"};
    one_bad_in_six(pg, &f);
}

/* ---- a tracestate header over JSD_TRACESTATE_MAX ------------------------------------------ */
static char long_ts[601];

static void tracestate_over_limit(bool pg)
{
    memcpy(long_ts, "vendor=", 7);
    memset(long_ts + 7, 'v', 593);
    long_ts[600] = '\0';
    foreign f = {
        .hname = "tracestate", .hval = long_ts, .why = "tracestate is 600 bytes", .shown = "id-3"};
    one_bad_in_six(pg, &f);
}

/* ---- the same through `jsdurable consume --sql --until-idle` ------------------------------ */
static void cli_msg_id_control_byte(bool pg)
{
    static char out[65536];
    cenv e;
    cenv_up(&e, pg);
    cenv_store_exec(e.store, "CREATE TABLE sink(subject TEXT, body TEXT, msg_id TEXT, seq BIGINT)");
    foreign f = {.msg_id = "bad\001id",
                 .why = "Nats-Msg-Id has a byte outside printable UTF-8",
                 .shown = "bad\\x01id"};
    publish_six(&e, &f);
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "%s consume --store '%s' --nats %s --stream %s --durable %s --ack-wait 1s "
             "--max-deliver 2 --until-idle --sql 'INSERT INTO sink(subject, body, msg_id, seq) "
             "VALUES (:subject, :payload, :msg_id, :stream_seq)'",
             jsd_fx_bin("jsdurable"), e.store_url, jsd_fx_shared_nats_url(), e.stream, e.durable);
    int rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 1) /* --until-idle after a dead letter */
        fail_msg("consume exited %d: %s", rc, out);
    /* its summary line (the whole output is too long for a failure message) */
    char summary[512] = "";
    const char *at = strstr(out, " fetched, ");
    if (at) {
        while (at > out && at[-1] != '\n')
            at--;
        snprintf(summary, sizeof(summary), "%.*s", (int)strcspn(at, "\n"), at);
    }
    ASSERT_CONTAINS(summary,
                    "6 fetched, 5 committed, 0 duplicates, 0 retried, 1 poisoned, 0 parked");
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM sink"), 5);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(DISTINCT seq) FROM sink"), 5);
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM sink WHERE seq = 3"), 0);
    check_evidence(&e, &f);
    cenv_down(&e);
}

BOTH(msg_id_over_limit)
BOTH(msg_id_control_byte)
BOTH(tracestate_over_limit)
BOTH(cli_msg_id_control_byte)

#define T(fn) cmocka_unit_test(fn##_sqlite), cmocka_unit_test(fn##_pg)

JSD_TEST_MAIN(T(msg_id_over_limit), T(msg_id_control_byte), T(tracestate_over_limit),
              T(cli_msg_id_control_byte))
