/*
 * `jsdurable outbox` against both store back ends, with dead letters made the
 * way the relay makes them (a real relay with a small attempt budget on a
 * subject no stream captures, against a real nats-server): list (pending,
 * --dead, --subject, --limit, --json), show (dead reason, receipt, msg id),
 * requeue (one, --all-dead, idempotent, msg id kept, a published effect
 * refused), the top dead-letter reasons in `status`, and bad arguments
 * refused with usage errors. Rows are checked with the native driver.
 */
#include "relay_env.h"

typedef struct env {
    rt_store st;
    rt_nats nt;
    const char *nats_url;
    char stream[64];
    char filter[80];
    char subject[100];
    char nowhere[100];  /* two dead letters */
    char nowhere2[100]; /* one dead letter */
} env;

static void env_up(env *e, rt_backend kind)
{
    memset(e, 0, sizeof(*e));
    rt_store_new(&e->st, kind);
    e->nats_url = jsd_fx_shared_nats_url();
    snprintf(e->stream, sizeof(e->stream), "%s", jsd_test_unique("OBX"));
    const char *root = jsd_test_unique("obx");
    snprintf(e->filter, sizeof(e->filter), "%s.>", root);
    snprintf(e->subject, sizeof(e->subject), "%s.a", root);
    snprintf(e->nowhere, sizeof(e->nowhere), "%s.x", jsd_test_unique("nostream"));
    snprintf(e->nowhere2, sizeof(e->nowhere2), "%s.y", jsd_test_unique("nostream"));
    rt_nats_open(&e->nt, e->nats_url);
    rt_stream_add(&e->nt, e->stream, e->filter);
}

static void env_down(env *e)
{
    rt_nats_close(&e->nt);
    rt_store_close(&e->st);
}

/* good0..2 published; bad0, bad1 (on nowhere) and lone0 (on nowhere2)
 * dead-lettered by the relay after an attempt budget of 2. */
static void make_rows(env *e)
{
    jsd_store *app = rt_open(&e->st);
    rt_enqueue_opts good = {.id_prefix = "good", .n = 3, .subject = e->subject};
    rt_enqueue(app, &good);
    rt_enqueue_opts bad = {.id_prefix = "bad", .n = 2, .subject = e->nowhere};
    rt_enqueue(app, &bad);
    rt_enqueue_opts lone = {.id_prefix = "lone", .n = 1, .subject = e->nowhere2};
    rt_enqueue(app, &lone);
    jsd_store_close(app);

    jsd_relay_opts o;
    jsd_relay_opts_init(&o);
    o.poll_interval_ms = 100;
    o.publish_deadline_ms = 30000;
    o.lease_ms = 35000;
    o.backoff_base_ms = 20;
    o.backoff_cap_ms = 50;
    o.attempt_budget = 2;
    rt_relay t;
    rt_relay_make(&t, &e->st, e->nats_url, &o);
    rt_relay_start(&t, false);
    ASSERT_WAIT(rt_q(&e->st, RT_SQL_DEAD) == 3 && rt_published(&e->st) == 3, 20000);
    rt_relay_finish(&t);
}

static int run(const env *e, char *out, size_t cap, const char *fmt, const char *a, const char *b)
{
    char args[600], cmd[1400];
    snprintf(args, sizeof(args), fmt, a ? a : "", b ? b : "");
    snprintf(cmd, sizeof(cmd), "%s outbox %s --store '%s'", jsd_fx_bin("jsdurable"), args,
             e->st.url);
    return jsd_test_run(cmd, out, cap);
}

static void outbox_tools(rt_backend kind)
{
    env e;
    env_up(&e, kind);
    make_rows(&e);
    static char out[65536];
    char q[300], msg_id[128], want[200];

    /* list --dead: the three dead letters with their reason, nothing else */
    ASSERT_EQ(run(&e, out, sizeof(out), "list --dead", NULL, NULL), 0);
    ASSERT_CONTAINS(out, "\tbad0\t");
    ASSERT_CONTAINS(out, "\tbad1\t");
    ASSERT_CONTAINS(out, "\tlone0\t");
    ASSERT_NOT_CONTAINS(out, "good");
    ASSERT_CONTAINS(out, "attempt budget of 2 spent");
    ASSERT_CONTAINS(out, "no stream captures subject");
    ASSERT_CONTAINS(out, "3 dead-lettered effect(s)");
    /* --subject, --json: one object per line */
    ASSERT_EQ(run(&e, out, sizeof(out), "list --dead --json --subject %s", e.nowhere, NULL), 0);
    ASSERT_EQ(jsd_test_count(out, "\"state\":\"dead\""), 2);
    ASSERT_NOT_CONTAINS(out, "lone0");
    /* --limit stops after N rows */
    ASSERT_EQ(run(&e, out, sizeof(out), "list --dead --json --limit 1", NULL, NULL), 0);
    ASSERT_EQ(jsd_test_count(out, "\"state\":\"dead\""), 1);
    ASSERT_CONTAINS(out, "(the --limit; there may be more)");
    /* nothing is pending */
    ASSERT_EQ(run(&e, out, sizeof(out), "list --json", NULL, NULL), 0);
    ASSERT_EQ(jsd_test_count(out, "\"state\""), 0);

    /* status: the top reasons, most frequent first */
    char cmd[1400];
    snprintf(cmd, sizeof(cmd), "%s status --store '%s' --json", jsd_fx_bin("jsdurable"), e.st.url);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "\"dead_reasons\":[{\"reason\":\"attempt budget of 2 spent");
    ASSERT_CONTAINS(out, "\"count\":2}");
    ASSERT_CONTAINS(out, "\"count\":1}]");
    snprintf(cmd, sizeof(cmd), "%s status --store '%s'", jsd_fx_bin("jsdurable"), e.st.url);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "     2 x attempt budget of 2 spent");
    ASSERT_CONTAINS(out, "     1 x attempt budget of 2 spent");

    /* show: a dead letter */
    rt_qs(&e.st, "SELECT msg_id FROM jsd_outbox_state WHERE effect_id = 'bad0'", msg_id,
          sizeof(msg_id));
    ASSERT_EQ(run(&e, out, sizeof(out), "show o bad0", NULL, NULL), 0);
    ASSERT_CONTAINS(out, "state:        dead");
    ASSERT_CONTAINS(out, msg_id);
    ASSERT_CONTAINS(out, "attempts:     2");
    ASSERT_CONTAINS(out, "dead reason:  attempt budget of 2 spent");
    ASSERT_CONTAINS(out, "receipt:      none");
    ASSERT_CONTAINS(out, "lease:        free");
    /* show --json: a published effect and its receipt */
    long long seq =
        rt_q(&e.st, "SELECT stream_seq FROM jsd_outbox_state WHERE effect_id = 'good1'");
    ASSERT_EQ(run(&e, out, sizeof(out), "show o good1 --json", NULL, NULL), 0);
    snprintf(want, sizeof(want), "\"receipt\":{\"stream\":\"%s\",\"stream_seq\":%lld,", e.stream,
             seq);
    ASSERT_CONTAINS(out, want);
    ASSERT_CONTAINS(out, "\"state\":\"published\"");
    ASSERT_EQ(run(&e, out, sizeof(out), "show o nosuch", NULL, NULL), 1);
    ASSERT_CONTAINS(out, "no effect with owner \"o\" and id \"nosuch\"");

    /* requeue: a published effect is refused and left alone */
    ASSERT_EQ(run(&e, out, sizeof(out), "requeue o good1", NULL, NULL), 65);
    snprintf(want, sizeof(want), "is published (stream %s, sequence %lld)", e.stream, seq);
    ASSERT_CONTAINS(out, want);
    ASSERT_EQ(rt_published(&e.st), 3);
    /* one dead letter: requeued with its msg id, then idempotent */
    ASSERT_EQ(run(&e, out, sizeof(out), "requeue o bad0", NULL, NULL), 0);
    ASSERT_CONTAINS(out, "requeued \"o\"/\"bad0\" (msg id unchanged)");
    ASSERT_EQ(rt_q(&e.st, "SELECT count(*) FROM jsd_outbox_state WHERE effect_id = 'bad0' AND "
                          "dead_lettered_at IS NULL AND dead_reason IS NULL AND attempts = 0"),
              1);
    snprintf(q, sizeof(q),
             "SELECT count(*) FROM jsd_outbox_state WHERE effect_id = 'bad0' AND msg_id = '%s'",
             msg_id);
    ASSERT_EQ(rt_q(&e.st, q), 1);
    ASSERT_EQ(run(&e, out, sizeof(out), "requeue o bad0 --json", NULL, NULL), 0);
    ASSERT_CONTAINS(out, "{\"requeued\":0}");
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DEAD), 2);
    /* it is pending now */
    ASSERT_EQ(run(&e, out, sizeof(out), "list", NULL, NULL), 0);
    ASSERT_CONTAINS(out, "\tbad0\t");
    ASSERT_CONTAINS(out, "1 pending effect(s)");
    /* --all-dead --subject takes only that subject's; --all-dead the rest; again: none */
    ASSERT_EQ(run(&e, out, sizeof(out), "requeue --all-dead --subject %s --json", e.nowhere, NULL),
              0);
    ASSERT_CONTAINS(out, "{\"requeued\":1}");
    ASSERT_EQ(rt_q(&e.st, "SELECT count(*) FROM jsd_outbox_state WHERE effect_id = 'lone0' "
                          "AND dead_lettered_at IS NOT NULL"),
              1);
    ASSERT_EQ(run(&e, out, sizeof(out), "requeue --all-dead", NULL, NULL), 0);
    ASSERT_CONTAINS(out, "requeued 1 dead-lettered effect(s)");
    ASSERT_EQ(run(&e, out, sizeof(out), "requeue --all-dead --json", NULL, NULL), 0);
    ASSERT_CONTAINS(out, "{\"requeued\":0}");
    ASSERT_EQ(rt_q(&e.st, RT_SQL_DEAD), 0);
    ASSERT_EQ(rt_q(&e.st, "SELECT count(DISTINCT msg_id) FROM jsd_outbox_state"), 6);
    ASSERT_EQ(rt_published(&e.st), 3);
    env_down(&e);
}

static void outbox_tools_sqlite(void **state)
{
    (void)state;
    outbox_tools(RT_SQLITE);
}

static void outbox_tools_pg(void **state)
{
    (void)state;
    outbox_tools(RT_PG);
}

/* Paging: more rows than one page (500), listed once each in row order. */
static void list_pages(void **state)
{
    (void)state;
    rt_store st;
    rt_store_new(&st, RT_SQLITE);
    jsd_store *app = rt_open(&st);
    rt_enqueue_opts q = {.owner = "p", .n = 1203, .subject = "pages.a"};
    rt_enqueue(app, &q);
    jsd_outbox_entry *page = calloc(JSD_OUTBOX_PAGE_MAX, sizeof(*page));
    ASSERT_TRUE(page != NULL);
    jsd_outbox_query oq = {.state = JSD_OUTBOX_PENDING, .limit = 500};
    size_t n = 0, total = 0;
    int64_t last = 0;
    do {
        ASSERT_OK(jsd_outbox_list(app, &oq, page, &n));
        for (size_t i = 0; i < n; i++) {
            ASSERT_TRUE(page[i].row_id > last);
            last = page[i].row_id;
            ASSERT_EQ(page[i].state, JSD_OUTBOX_PENDING);
        }
        total += n;
        if (n)
            oq.after_row_id = page[n - 1].row_id;
    } while (n == oq.limit);
    ASSERT_SIZE_EQ(total, 1203);
    /* a bad query is refused with a message */
    oq.limit = JSD_OUTBOX_PAGE_MAX + 1;
    ASSERT_STATUS(jsd_outbox_list(app, &oq, page, &n), JSD_ERR_INVALID);
    ASSERT_CONTAINS(jsd_store_errmsg(app), "limit 1001 is outside 1..1000");
    free(page);
    char out[8192], cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s outbox list --store '%s' --json", jsd_fx_bin("jsdurable"),
             st.url);
    static char big[1 << 20];
    ASSERT_EQ(jsd_test_run(cmd, big, sizeof(big)), 0);
    ASSERT_EQ(jsd_test_count(big, "\"state\":\"pending\""), 1000); /* the default --limit */
    (void)out;
    jsd_store_close(app);
    rt_store_close(&st);
}

static void bad_arguments(void **state)
{
    (void)state;
    rt_store st;
    rt_store_new(&st, RT_SQLITE);
    char out[8192], cmd[1400];
    const char *bin = jsd_fx_bin("jsdurable");
    snprintf(cmd, sizeof(cmd), "%s outbox --help", bin);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "Example:");
    const struct {
        const char *args, *says;
    } bad[] = {
        {"", "give an action"},
        {"frobnicate", "unknown action"},
        {"list o e1", "list takes no OWNER ID"},
        {"list --all-dead", "--all-dead belongs to requeue"},
        {"list --limit 0", "--limit takes a number"},
        {"list --limit x", "--limit takes a number"},
        {"show o", "show takes exactly OWNER ID"},
        {"show o e1 e2", "show takes exactly OWNER ID"},
        {"show o e1 --dead", "show takes no"},
        {"requeue", "requeue takes OWNER ID or --all-dead"},
        {"requeue o", "requeue takes OWNER ID or --all-dead"},
        {"requeue o e1 --all-dead", "requeue takes OWNER ID or --all-dead"},
        {"requeue o e1 --subject a.b", "--subject goes with --all-dead"},
        {"list --bogus", "unknown option --bogus (see --help)"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(cmd, sizeof(cmd), "%s outbox %s --store '%s'", bin, bad[i].args, st.url);
        ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 64);
        ASSERT_CONTAINS(out, bad[i].says);
    }
    snprintf(cmd, sizeof(cmd), "JSD_STORE= %s outbox list", bin);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 64);
    ASSERT_CONTAINS(out, "no store");
    rt_store_close(&st);
}

JSD_TEST_MAIN(cmocka_unit_test(outbox_tools_sqlite), cmocka_unit_test(outbox_tools_pg),
              cmocka_unit_test(list_pages), cmocka_unit_test(bad_arguments))
