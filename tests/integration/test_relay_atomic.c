/*
 * The relay's atomic batches (issue 43) against the fixtures' nats-server
 * (2.15: streams with allow_atomic) and both store back ends: a claim goes
 * out as atomic batches with one PubAck each and every effect gets the
 * sequence the broker stored it under; a stream without allow_atomic is
 * published one by one and the fallback counted; a batch holding an id the
 * stream already has (10201) falls back to one by one, collecting the
 * duplicate acknowledgements; a row the stream refuses does not sink its
 * batch (the batch comes back incomplete, is sent again once, then one by
 * one, where that row alone is dead-lettered); a stream whose 50 batches
 * in flight are taken (10210) is waited for and the whole batch sent again;
 * a batch whose PubAck is lost is UNKNOWN for every effect, and the retry
 * collects the duplicates.
 * On a server without atomic batches (the compat lane) the cases that need
 * them are skipped.
 */
#include "jsd_int.h"
#include "proxy.h"
#include "publisher_env.h"
#include "relay_env.h"

typedef struct at_env {
    rt_store st;
    rt_nats nt;
    const char *nats_url;
    char stream[64];
    char root[64];
    char filter[80];
    char subject[100];
    bool atomic; /* the stream has allow_atomic */
} at_env;

static void env_up(at_env *e, rt_backend kind, int32_t max_msg_size, bool atomic)
{
    memset(e, 0, sizeof(*e));
    rt_store_new(&e->st, kind);
    e->nats_url = jsd_fx_shared_nats_url();
    snprintf(e->stream, sizeof(e->stream), "%s", jsd_test_unique("RATOM"));
    snprintf(e->root, sizeof(e->root), "%s", jsd_test_unique("ratom"));
    snprintf(e->filter, sizeof(e->filter), "%s.>", e->root);
    snprintf(e->subject, sizeof(e->subject), "%s.a", e->root);
    rt_nats_open(&e->nt, e->nats_url);
    rt_stream_add_with(&e->nt, e->stream, e->filter, 600000, max_msg_size);
    e->atomic = rt_stream_set_atomic(&e->nt, e->stream, atomic) && atomic;
}

static void env_down(at_env *e)
{
    rt_nats_close(&e->nt);
    rt_store_close(&e->st);
}

static jsd_relay_opts quick_opts(jsd_metrics *mx)
{
    jsd_relay_opts o;
    jsd_relay_opts_init(&o);
    o.poll_interval_ms = 200;
    o.publish_deadline_ms = 20000;
    o.lease_ms = 25000;
    o.backoff_base_ms = 50;
    o.backoff_cap_ms = 200;
    o.metrics = mx;
    o.atomic_min = 1; /* every claim a batch, however small */
    return o;
}

static double metric(jsd_metrics *mx, const char *name, const char *label)
{
    double v = -1;
    ASSERT_OK(jsd_metrics_get(mx, name, label, &v));
    return v;
}

static double fallbacks(jsd_metrics *mx, const char *reason)
{
    return metric(mx, "jsd_relay_batch_fallbacks_total", reason);
}

/* One relay over st until idle (within 60 s): its counts. */
static jsd_relay_stats relay_once(const at_env *e, const rt_store *st, const jsd_relay_opts *o)
{
    rt_relay t;
    rt_relay_make(&t, st, e->nats_url, o);
    rt_relay_start(&t, true);
    int64_t end = jsd_test_mono_ms() + 60000;
    while (!rt_relay_done(&t) && jsd_test_mono_ms() < end)
        jsd_test_sleep_ms(20);
    if (!rt_relay_done(&t))
        fail_msg("the relay was not idle within 60 s (last error: %s)", jsd_relay_errmsg(t.relay));
    pthread_join(t.th, NULL);
    t.th = 0;
    ASSERT_OK_E(t.rc, jsd_relay_errmsg(t.relay));
    jsd_relay_stats rs;
    jsd_relay_stats_get(t.relay, &rs);
    rt_relay_finish(&t);
    return rs;
}

#define SKIP_WITHOUT_ATOMIC(e)                                                                     \
    do {                                                                                           \
        if (!(e)->atomic) {                                                                        \
            env_down(e);                                                                           \
            jsd_test_skip_because("the server has no atomic batches (before 2.12)");               \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* ---- a claim as atomic batches --------------------------------------------------------- */

static void batches(rt_backend kind)
{
    at_env e;
    env_up(&e, kind, 0, true);
    SKIP_WITHOUT_ATOMIC(&e);
    jsd_store *app = rt_open(&e.st);
    char subj[128];
    snprintf(subj, sizeof(subj), "%s.s%%d", e.root);
    /* 3 subjects of one stream, 2000 effects: batches of the claim's size */
    rt_enqueue_opts q = {
        .owner = "o", .id_prefix = "e", .n = 2000, .subject = subj, .n_subjects = 3};
    rt_enqueue(app, &q);
    jsd_metrics *mx = NULL;
    ASSERT_OK(jsd_metrics_create(&mx, NULL));
    jsd_relay_opts o = quick_opts(mx);
    jsd_relay_stats rs = relay_once(&e, &e.st, &o);
    ASSERT_EQ(rs.published, 2000);
    ASSERT_EQ(rs.duplicates, 0);
    ASSERT_EQ(rs.errors, 0);
    ASSERT_EQ(rt_published(&e.st), 2000);
    double nb = metric(mx, "jsd_relay_atomic_batches_total", NULL);
    ASSERT_TRUE(nb >= 2000.0 / o.batch_size && nb < 2000);
    /* the stats say the same: every effect went in an atomic batch */
    ASSERT_EQ(rs.atomic_batches, (uint64_t)nb);
    ASSERT_EQ(rs.atomic_effects, 2000);
    for (int k = 0; k < 6; k++)
        ASSERT_EQ(metric(mx, "jsd_relay_batch_fallbacks_total",
                         (const char *[]){"not_allowed", "disabled", "unsupported_header",
                                          "duplicate", "incomplete", "refused"}[k]),
                  0);
    /* every receipt names the message stored under its own id */
    rt_assert_exactly_once(&e.st, &e.nt, e.stream, "o", "e", 0, 2000);
    rt_assert_receipts_match(&e.st, &e.nt, e.stream);
    jsd_metrics_destroy(mx);
    jsd_store_close(app);
    env_down(&e);
}

static void batches_sqlite(void **state)
{
    (void)state;
    batches(RT_SQLITE);
}
static void batches_pg(void **state)
{
    (void)state;
    batches(RT_PG);
}

/* ---- a handful goes one by one ----------------------------------------------------------- */

/* An atomic batch costs the durable server ~5 ms whatever its size, so a
 * claim of a few effects goes one by one (jsd_relay_opts.atomic_min, 16 by
 * default): a trickle at 1k effects/s went in batches of one or two and
 * waited 0.8 s at the median (bench relay.latency.durable). Not a fallback:
 * nothing is counted as one. */
static void a_handful_goes_one_by_one(void **state)
{
    (void)state;
    at_env e;
    env_up(&e, RT_SQLITE, 0, true);
    SKIP_WITHOUT_ATOMIC(&e);
    jsd_store *app = rt_open(&e.st);
    rt_enqueue(app,
               &(rt_enqueue_opts){.owner = "o", .id_prefix = "e", .n = 5, .subject = e.subject});
    jsd_metrics *mx = NULL;
    ASSERT_OK(jsd_metrics_create(&mx, NULL));
    jsd_relay_opts o = quick_opts(mx);
    o.atomic_min = 16;
    jsd_relay_stats rs = relay_once(&e, &e.st, &o);
    ASSERT_EQ(rs.published, 5);
    ASSERT_EQ(rs.atomic_batches, 0);
    ASSERT_EQ(fallbacks(mx, "not_allowed") + fallbacks(mx, "refused"), 0);
    /* enough for a batch: one */
    rt_enqueue(app, &(rt_enqueue_opts){
                        .owner = "o", .id_prefix = "e", .first = 5, .n = 40, .subject = e.subject});
    rs = relay_once(&e, &e.st, &o);
    ASSERT_EQ(rs.published, 40);
    ASSERT_EQ(rs.atomic_batches, 1);
    ASSERT_EQ(rs.atomic_effects, 40);
    rt_assert_exactly_once(&e.st, &e.nt, e.stream, "o", "e", 0, 45);
    jsd_metrics_destroy(mx);
    jsd_store_close(app);
    env_down(&e);
}

/* ---- a stream without allow_atomic ------------------------------------------------------ */

static void not_allowed(void **state)
{
    (void)state;
    at_env e;
    env_up(&e, RT_SQLITE, 0, false);
    jsd_store *app = rt_open(&e.st);
    rt_enqueue_opts q = {.owner = "o", .id_prefix = "e", .n = 300, .subject = e.subject};
    rt_enqueue(app, &q);
    jsd_metrics *mx = NULL;
    ASSERT_OK(jsd_metrics_create(&mx, NULL));
    jsd_relay_opts o = quick_opts(mx);
    jsd_relay_stats rs = relay_once(&e, &e.st, &o);
    ASSERT_EQ(rs.published, 300);
    ASSERT_EQ(metric(mx, "jsd_relay_atomic_batches_total", NULL), 0);
    ASSERT_EQ(rs.atomic_batches + rs.atomic_effects, 0);
    /* one count per claim that went one by one (300 effects: two claims) */
    ASSERT_TRUE(fallbacks(mx, "not_allowed") >= 2);
    ASSERT_EQ(fallbacks(mx, "duplicate"), 0);
    rt_assert_exactly_once(&e.st, &e.nt, e.stream, "o", "e", 0, 300);
    rt_assert_receipts_match(&e.st, &e.nt, e.stream);
    jsd_metrics_destroy(mx);
    jsd_store_close(app);
    env_down(&e);
}

/* ---- 10201: an id the stream already holds ---------------------------------------------- */

/* The store at in->url under the namespace "shared-ns" (no native reader). */
static void shared_namespace(const rt_store *in, rt_store *out)
{
    memset(out, 0, sizeof(*out));
    out->kind = in->kind;
    int n = snprintf(out->url, sizeof(out->url), "%s%snamespace=shared-ns", in->url,
                     strchr(in->url, '?') ? "&" : "?");
    if (n < 0 || (size_t)n >= sizeof(out->url))
        fail_msg("store URL too long for a namespace parameter");
}

static void duplicate_in_batch(rt_backend kind)
{
    at_env e;
    env_up(&e, kind, 0, true);
    SKIP_WITHOUT_ATOMIC(&e);
    /* Store A publishes e0..e9 first; store B (the case's back end, one
     * namespace with A: the same ids) holds e0..e99 with the same content,
     * as if its claim of e0..e9 had been lost after they were published. */
    rt_store a, a_ns, b_ns;
    rt_store_new(&a, RT_SQLITE);
    shared_namespace(&a, &a_ns);
    shared_namespace(&e.st, &b_ns);
    jsd_store *sa = rt_open(&a_ns);
    rt_enqueue_opts qa = {.owner = "o", .id_prefix = "e", .n = 10, .subject = e.subject};
    rt_enqueue(sa, &qa);
    jsd_metrics *mx = NULL;
    ASSERT_OK(jsd_metrics_create(&mx, NULL));
    jsd_relay_opts o = quick_opts(mx);
    jsd_relay_stats rs = relay_once(&e, &a_ns, &o);
    ASSERT_EQ(rs.published, 10);
    ASSERT_EQ(metric(mx, "jsd_relay_atomic_batches_total", NULL), 1);
    jsd_metrics_destroy(mx);

    jsd_store *sb = rt_open(&b_ns);
    rt_enqueue_opts qb = {.owner = "o", .id_prefix = "e", .n = 100, .subject = e.subject};
    rt_enqueue(sb, &qb);
    ASSERT_OK(jsd_metrics_create(&mx, NULL));
    o = quick_opts(mx);
    rs = relay_once(&e, &b_ns, &o);
    /* the batch was refused whole (10201) and sent one by one: the ten
     * stored ones answered duplicate with their sequences, the rest new */
    ASSERT_EQ(fallbacks(mx, "duplicate"), 1);
    ASSERT_EQ(metric(mx, "jsd_relay_atomic_batches_total", NULL), 0);
    ASSERT_EQ(rs.published, 100);
    ASSERT_EQ(rs.duplicates, 10);
    ASSERT_EQ(rs.dead_lettered, 0);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DUPLICATES), 10);
    ASSERT_EQ(rt_stream_count(&e.nt, e.stream), 100);
    /* (rt_assert_receipts_match derives ids under the store's own
     * namespace, not the shared one: the counts above say it) */
    jsd_metrics_destroy(mx);
    jsd_store_close(sb);
    jsd_store_close(sa);
    rt_store_close(&a);
    env_down(&e);
}

static void duplicate_in_batch_sqlite(void **state)
{
    (void)state;
    duplicate_in_batch(RT_SQLITE);
}
static void duplicate_in_batch_pg(void **state)
{
    (void)state;
    duplicate_in_batch(RT_PG);
}

/* ---- one row the stream refuses --------------------------------------------------------- */

static void bad_row_isolated(rt_backend kind)
{
    at_env e;
    /* max_msg_size 512: one effect of 2000 bytes among 59 of 32 */
    env_up(&e, kind, 512, true);
    SKIP_WITHOUT_ATOMIC(&e);
    jsd_store *app = rt_open(&e.st);
    rt_enqueue_opts q1 = {.owner = "o", .id_prefix = "e", .n = 30, .subject = e.subject};
    rt_enqueue(app, &q1);
    rt_enqueue_opts big = {
        .owner = "o", .id_prefix = "big", .n = 1, .subject = e.subject, .payload_len = 2000};
    rt_enqueue(app, &big);
    rt_enqueue_opts q2 = {
        .owner = "o", .id_prefix = "e", .first = 30, .n = 29, .subject = e.subject};
    rt_enqueue(app, &q2);
    jsd_metrics *mx = NULL;
    ASSERT_OK(jsd_metrics_create(&mx, NULL));
    jsd_relay_opts o = quick_opts(mx);
    jsd_relay_stats rs = relay_once(&e, &e.st, &o);
    /* the server drops the big one on arrival (a publication between the
     * first and the commit has no reply subject to say so) and answers the
     * commit 10176 incomplete: sent again once, then one by one */
    ASSERT_EQ(metric(mx, "jsd_relay_batch_resends_total", NULL), 1);
    ASSERT_EQ(fallbacks(mx, "incomplete"), 1);
    ASSERT_EQ(fallbacks(mx, "refused"), 0);
    ASSERT_EQ(rs.published, 59);
    ASSERT_EQ(rs.dead_lettered, 1);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DEAD), 1);
    char reason[1200];
    rt_qs(&e.st, "SELECT dead_reason FROM jsd_outbox_state WHERE dead_lettered_at IS NOT NULL",
          reason, sizeof(reason));
    ASSERT_CONTAINS(reason, "10054");
    rt_assert_exactly_once(&e.st, &e.nt, e.stream, "o", "e", 0, 59);
    jsd_metrics_destroy(mx);
    jsd_store_close(app);
    env_down(&e);
}

static void bad_row_isolated_sqlite(void **state)
{
    (void)state;
    bad_row_isolated(RT_SQLITE);
}
static void bad_row_isolated_pg(void **state)
{
    (void)state;
    bad_row_isolated(RT_PG);
}

/* ---- 10210: the stream's batches in flight are taken ------------------------------------- */

/* Open (first publication, no commit) batch id on subject. */
static void open_batch(rt_nats *n, const char *subject, const char *id, const char *inbox)
{
    natsMsg *m = NULL;
    ASSERT_EQ(natsMsg_Create(&m, subject, inbox, "x", 1), NATS_OK);
    ASSERT_EQ(natsMsgHeader_Set(m, "Nats-Batch-Id", id), NATS_OK);
    ASSERT_EQ(natsMsgHeader_Set(m, "Nats-Batch-Sequence", "1"), NATS_OK);
    ASSERT_EQ(natsConnection_PublishMsg(n->nc, m), NATS_OK);
    natsMsg_Destroy(m);
}

static void commit_batch(rt_nats *n, const char *subject, const char *id)
{
    natsMsg *m = NULL, *reply = NULL;
    ASSERT_EQ(natsMsg_Create(&m, subject, NULL, "y", 1), NATS_OK);
    ASSERT_EQ(natsMsgHeader_Set(m, "Nats-Batch-Id", id), NATS_OK);
    ASSERT_EQ(natsMsgHeader_Set(m, "Nats-Batch-Sequence", "2"), NATS_OK);
    ASSERT_EQ(natsMsgHeader_Set(m, "Nats-Batch-Commit", "1"), NATS_OK);
    ASSERT_EQ(natsConnection_RequestMsg(&reply, n->nc, m, 5000), NATS_OK);
    ASSERT_CONTAINS(natsMsg_GetData(reply), "\"count\":2");
    natsMsg_Destroy(reply);
    natsMsg_Destroy(m);
}

static void too_many_inflight(void **state)
{
    (void)state;
    at_env e;
    env_up(&e, RT_SQLITE, 0, true);
    SKIP_WITHOUT_ATOMIC(&e);
    /* another producer holds the stream's 50 batches open */
    char other[120], id[64], inbox[64];
    snprintf(other, sizeof(other), "%s.other", e.root);
    snprintf(inbox, sizeof(inbox), "_INBOX.%s", jsd_test_unique("atb"));
    for (int i = 0; i < 50; i++) {
        snprintf(id, sizeof(id), "held-%d", i);
        open_batch(&e.nt, other, id, inbox);
    }
    ASSERT_EQ(natsConnection_Flush(e.nt.nc), NATS_OK);
    jsd_store *app = rt_open(&e.st);
    rt_enqueue_opts q = {.owner = "o", .id_prefix = "e", .n = 40, .subject = e.subject};
    rt_enqueue(app, &q);
    jsd_metrics *mx = NULL;
    ASSERT_OK(jsd_metrics_create(&mx, NULL));
    jsd_relay_opts o = quick_opts(mx);
    rt_relay t;
    rt_relay_make(&t, &e.st, e.nats_url, &o);
    rt_relay_start(&t, true);
    /* the relay meets 10210 and waits, sending the batch again */
    int64_t end = jsd_test_mono_ms() + 10000;
    while (metric(mx, "jsd_relay_batch_resends_total", NULL) < 2 && jsd_test_mono_ms() < end)
        jsd_test_sleep_ms(5);
    ASSERT_TRUE(metric(mx, "jsd_relay_batch_resends_total", NULL) >= 2);
    ASSERT_EQ(rt_stream_count(&e.nt, e.stream), 0);
    /* one of them commits: room for the relay's batch */
    commit_batch(&e.nt, other, "held-0");
    end = jsd_test_mono_ms() + 30000;
    while (!rt_relay_done(&t) && jsd_test_mono_ms() < end)
        jsd_test_sleep_ms(20);
    ASSERT_TRUE(rt_relay_done(&t));
    pthread_join(t.th, NULL);
    t.th = 0;
    jsd_relay_stats rs;
    jsd_relay_stats_get(t.relay, &rs);
    rt_relay_finish(&t);
    ASSERT_EQ(rs.published, 40);
    ASSERT_EQ(rs.errors, 0);
    ASSERT_EQ(metric(mx, "jsd_relay_atomic_batches_total", NULL), 1);
    for (int k = 0; k < 6; k++)
        ASSERT_EQ(metric(mx, "jsd_relay_batch_fallbacks_total",
                         (const char *[]){"not_allowed", "disabled", "unsupported_header",
                                          "duplicate", "incomplete", "refused"}[k]),
                  0);
    /* the stream: the other producer's 2, then the relay's 40 */
    ASSERT_EQ(rt_stream_count(&e.nt, e.stream), 42);
    rt_assert_receipts_match(&e.st, &e.nt, e.stream);
    jsd_metrics_destroy(mx);
    jsd_store_close(app);
    env_down(&e);
}

/* ---- the commit's PubAck lost ------------------------------------------------------------ */

/* The fault proxy drops the batch's one PubAck: every effect of the batch is
 * UNKNOWN (an attempt each), the batch was stored whole; the retry, a new
 * batch with the same ids, is refused 10201 and goes one by one: 50
 * duplicates with the original sequences, 50 messages in the stream. */
static void lost_commit_puback(rt_backend kind)
{
    at_env e;
    env_up(&e, kind, 0, true);
    SKIP_WITHOUT_ATOMIC(&e);
    jsd_fx_proxy px;
    ASSERT_EQ(jsd_fx_proxy_start(jsd_fx_url_port(e.nats_url), "drop-first-puback", &px), 0);
    jsd_store *app = rt_open(&e.st);
    rt_enqueue_opts q = {.owner = "o", .id_prefix = "e", .n = 50, .subject = e.subject};
    rt_enqueue(app, &q);
    jsd_metrics *mx = NULL;
    ASSERT_OK(jsd_metrics_create(&mx, NULL));
    jsd_relay_opts o = quick_opts(mx);
    o.publish_deadline_ms = 1000;
    o.lease_ms = 2500;
    rt_relay t;
    rt_relay_make(&t, &e.st, px.url, &o);
    rt_relay_start(&t, false);
    ASSERT_WAIT(rt_published(&e.st) == 50, 20000);
    ASSERT_EQ(jsd_fx_proxy_dropped_acks(&px), 1);
    rt_relay_finish(&t);
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DUPLICATES), 50);
    ASSERT_EQ(rt_q(&e.st, "SELECT count(*) FROM jsd_outbox_state WHERE attempts = 1"), 50);
    char err[1100];
    rt_qs(&e.st, "SELECT last_error FROM jsd_outbox_state WHERE effect_id = 'e7'", err,
          sizeof(err));
    ASSERT_CONTAINS(err, "unknown");
    ASSERT_EQ(fallbacks(mx, "duplicate"), 1);
    ASSERT_EQ(metric(mx, "jsd_relay_atomic_batches_total", NULL), 0);
    rt_assert_exactly_once(&e.st, &e.nt, e.stream, "o", "e", 0, 50);
    rt_assert_receipts_match(&e.st, &e.nt, e.stream);
    jsd_fx_proxy_stop(&px);
    jsd_metrics_destroy(mx);
    jsd_store_close(app);
    env_down(&e);
}

static void lost_commit_puback_sqlite(void **state)
{
    (void)state;
    lost_commit_puback(RT_SQLITE);
}
static void lost_commit_puback_pg(void **state)
{
    (void)state;
    lost_commit_puback(RT_PG);
}

/* ---- a subject the user may not publish to ------------------------------------------------ */

/* On a server of its own where the relay's user may not publish to
 * "denied.>", one stream captures "denied.<root>.>" and "fine.<root>.>".
 * A batch whose first publication is denied settles DENIED, one whose later
 * publication is denied comes back incomplete: both go one by one, where
 * only the denied effects fail (and are dead-lettered at the budget). */
static void denied_subject(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_USERPASS, &fx), 0);
    rt_nats nt;
    nt.nc = ph_direct(fx.url, fx.user, fx.password);
    nt.js = ph_js(nt.nc);
    char stream[64], root[64], denied[120], fine[120];
    snprintf(stream, sizeof(stream), "%s", jsd_test_unique("RDENY"));
    snprintf(root, sizeof(root), "%s", jsd_test_unique("rdeny"));
    snprintf(denied, sizeof(denied), "denied.%s.a", root);
    snprintf(fine, sizeof(fine), "fine.%s.a", root);
    /* two subjects: nats.c's config is enough, a raw create is shorter */
    char api[160], body[512];
    snprintf(api, sizeof(api), "$JS.API.STREAM.CREATE.%s", stream);
    snprintf(body, sizeof(body),
             "{\"name\":\"%s\",\"subjects\":[\"denied.%s.>\",\"fine.%s.>\"],"
             "\"storage\":\"file\",\"duplicate_window\":600000000000}",
             stream, root, root);
    natsMsg *reply = NULL;
    ASSERT_EQ(natsConnection_RequestString(&reply, nt.nc, api, body, 5000), NATS_OK);
    if (strstr(natsMsg_GetData(reply), "\"error\""))
        fail_msg("creating %s: %s", stream, natsMsg_GetData(reply));
    natsMsg_Destroy(reply);
    if (!rt_stream_set_atomic(&nt, stream, true)) {
        rt_nats_close(&nt);
        jsd_fx_nats_stop(&fx);
        jsd_test_skip_because("the server has no atomic batches (before 2.12)");
    }
    rt_store st;
    rt_store_new(&st, RT_SQLITE);
    jsd_store *app = rt_open(&st);
    /* claim 1: denied first; claim 2: denied in the middle */
    rt_enqueue_opts d1 = {.owner = "o", .id_prefix = "d", .n = 1, .subject = denied};
    rt_enqueue_opts f1 = {.owner = "o", .id_prefix = "f", .n = 20, .subject = fine};
    rt_enqueue(app, &d1);
    rt_enqueue(app, &f1);
    rt_enqueue_opts f2 = {.owner = "o", .id_prefix = "f", .first = 20, .n = 10, .subject = fine};
    rt_enqueue_opts d2 = {.owner = "o", .id_prefix = "d", .first = 1, .n = 1, .subject = denied};
    rt_enqueue_opts f3 = {.owner = "o", .id_prefix = "f", .first = 30, .n = 10, .subject = fine};
    jsd_metrics *mx = NULL;
    ASSERT_OK(jsd_metrics_create(&mx, NULL));
    jsd_relay_opts o = quick_opts(mx);
    o.batch_size = 21;
    o.attempt_budget = 2;
    jsd_conn *c = ph_open_user(fx.url, fx.limited_user, fx.limited_password);
    jsd_store *rs_store = rt_open(&st);
    jsd_relay *relay = NULL;
    jsd_error err;
    ASSERT_OK_E(jsd_relay_create(&relay, rs_store, c, &o, &err), err.msg);
    ASSERT_OK_E(jsd_relay_run_until_idle(relay), jsd_relay_errmsg(relay));
    rt_enqueue(app, &f2);
    rt_enqueue(app, &d2);
    rt_enqueue(app, &f3);
    ASSERT_OK_E(jsd_relay_run_until_idle(relay), jsd_relay_errmsg(relay));
    jsd_relay_stats rs;
    jsd_relay_stats_get(relay, &rs);
    ASSERT_EQ(rs.published, 40);
    ASSERT_EQ(rs.dead_lettered, 2);
    ASSERT_EQ(rt_q(&st, RT_SQL_DEAD), 2);
    ASSERT_EQ(rt_q(&st, "SELECT count(*) FROM jsd_outbox_state WHERE dead_lettered_at IS NOT "
                        "NULL AND effect_id LIKE 'd%'"),
              2);
    ASSERT_TRUE(fallbacks(mx, "refused") + fallbacks(mx, "incomplete") >= 2);
    ASSERT_EQ(rt_stream_count(&nt, stream), 40);
    jsd_relay_destroy(relay);
    jsd_store_close(rs_store);
    jsd_conn_close(c);
    jsd_metrics_destroy(mx);
    jsd_store_close(app);
    rt_store_close(&st);
    rt_nats_close(&nt);
    jsd_fx_nats_stop(&fx);
}

JSD_TEST_MAIN(cmocka_unit_test(batches_sqlite), cmocka_unit_test(batches_pg),
              cmocka_unit_test(not_allowed), cmocka_unit_test(a_handful_goes_one_by_one),
              cmocka_unit_test(duplicate_in_batch_sqlite), cmocka_unit_test(duplicate_in_batch_pg),
              cmocka_unit_test(bad_row_isolated_sqlite), cmocka_unit_test(bad_row_isolated_pg),
              cmocka_unit_test(too_many_inflight), cmocka_unit_test(lost_commit_puback_sqlite),
              cmocka_unit_test(lost_commit_puback_pg), cmocka_unit_test(denied_subject))
