/*
 * Integration tests for topology provisioning against the run's shared
 * JetStream server (real nats-server): create creates, create keeps an
 * operator's hand-tuned limit, reconcile updates it, a dry run reports the
 * difference and changes nothing, a subject overlapping a stream that exists
 * only on the server is refused before anything is created, fields JetStream
 * cannot change are refused by name, and the CLI end to end.
 *
 * Every stream and subject root is unique to the test process
 * (jsd_test_unique), so tests never touch each other's objects.
 */
#include <stdlib.h>

#include "conn_int.h"
#include "fixture.h"
#include "streams.h"
#include "test.h"

typedef struct names {
    char stream[64], dlq[64], root[64], dlq_root[64];
} names;

static void make_names(names *n)
{
    const char *u = jsd_test_unique("topo");
    jsd__snprintf(n->stream, sizeof(n->stream), "S_%s", u);
    jsd__snprintf(n->dlq, sizeof(n->dlq), "D_%s", u);
    jsd__snprintf(n->root, sizeof(n->root), "r%s", u);
    jsd__snprintf(n->dlq_root, sizeof(n->dlq_root), "dlq%s", u);
}

/* A topology with one hot stream, a dead-letter stream and one consumer.
 * stream_extra / consumer_extra are JSON members appended to each object. */
static jsd_topology *topo_of(const names *n, const char *stream_extra, const char *consumer_extra)
{
    char json[2048];
    jsd__snprintf(json, sizeof(json),
                  "{\"streams\":[{\"name\":\"%s\",\"subjects\":[\"%s.>\"],\"max_age\":\"1h\","
                  "\"duplicate_window\":\"2m\"%s}],"
                  "\"dead_letter\":{\"name\":\"%s\",\"subjects\":[\"%s.>\"],\"max_msgs\":1000},"
                  "\"consumers\":[{\"stream\":\"%s\",\"durable\":\"ship\",\"filter_subject\":"
                  "\"%s.created\",\"max_deliver\":5,\"backoff\":[\"1s\","
                  "\"2s\",\"5s\"],\"max_ack_pending\":64%s}]}",
                  n->stream, n->root, stream_extra ? stream_extra : "", n->dlq, n->dlq_root,
                  n->stream, n->root, consumer_extra ? consumer_extra : "");
    jsd_topology *t = NULL;
    jsd_error e;
    jsd_error_clear(&e);
    ASSERT_OK_E(jsd_topology_parse(&t, json, strlen(json), &e), e.msg);
    return t;
}

static jsd_conn *open_conn(void)
{
    jsd_conn_opts o;
    jsd_conn_opts_init(&o);
    o.servers = jsd_fx_shared_nats_url();
    jsd_conn *c = NULL;
    jsd_error e;
    jsd_error_clear(&e);
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    return c;
}

/* Reports collected from one apply. */
typedef struct rec {
    int n;
    struct {
        char kind[16], name[160];
        jsd_topology_action action;
        bool dry_run;
        char changes[512];
    } r[16];
} rec;

static void on_report(const jsd_topology_report *r, void *user)
{
    rec *x = user;
    if (x->n >= 16)
        return;
    jsd__strlcpy(x->r[x->n].kind, r->kind, sizeof(x->r[0].kind));
    jsd__strlcpy(x->r[x->n].name, r->name, sizeof(x->r[0].name));
    x->r[x->n].action = r->action;
    x->r[x->n].dry_run = r->dry_run;
    x->r[x->n].changes[0] = '\0';
    for (size_t i = 0; i < r->n_changes; i++) {
        size_t len = strlen(x->r[x->n].changes);
        jsd__snprintf(x->r[x->n].changes + len, sizeof(x->r[0].changes) - len, "%s=%s->%s;",
                      r->changes[i].field, r->changes[i].server, r->changes[i].file);
    }
    x->n++;
}

static jsd_status apply(jsd_conn *c, jsd_topology *t, jsd_topology_policy p, bool dry, rec *r,
                        jsd_error *e)
{
    jsd_topology_apply_opts o;
    jsd_topology_apply_opts_init(&o);
    o.policy = p;
    o.dry_run = dry;
    o.timeout_ms = 5000;
    o.report = on_report;
    o.user = r;
    memset(r, 0, sizeof(*r));
    jsd_error_clear(e);
    return jsd_topology_apply(c, t, &o, e);
}

static int find_report(const rec *r, const char *name)
{
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->r[i].name, name))
            return i;
    fail_msg("no report for \"%s\"", name);
    return -1;
}

/* The server's stream config, or NULL when the stream does not exist. */
static jsStreamInfo *server_stream(jsd_conn *c, const char *name)
{
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetStreamInfo(&si, jsd__conn_js(c), name, NULL, &jerr);
    if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr)
        return NULL;
    if (s != NATS_OK)
        fail_msg("js_GetStreamInfo(%s): %s (%d)", name, natsStatus_GetText(s), (int)jerr);
    return si;
}

static void hand_tune_max_msgs(jsd_conn *c, const char *name, int64_t max_msgs)
{
    jsStreamInfo *si = server_stream(c, name);
    ASSERT_TRUE(si != NULL);
    jsStreamConfig cfg = *si->Config;
    cfg.MaxMsgs = max_msgs;
    jsStreamInfo *res = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_UpdateStream(&res, jsd__conn_js(c), &cfg, NULL, &jerr);
    if (s != NATS_OK)
        fail_msg("js_UpdateStream: %s (%d)", natsStatus_GetText(s), (int)jerr);
    jsStreamInfo_Destroy(res);
    jsStreamInfo_Destroy(si);
}

static void create_creates_everything(void **state)
{
    (void)state;
    names n;
    make_names(&n);
    jsd_conn *c = open_conn();
    jsd_topology *t = topo_of(&n, NULL, NULL);
    rec r;
    jsd_error e;
    ASSERT_OK_E(apply(c, t, JSD_TOPOLOGY_CREATE, false, &r, &e), e.msg);
    ASSERT_EQ(r.n, 3);
    ASSERT_EQ(r.r[find_report(&r, n.stream)].action, JSD_TOPOLOGY_CREATED);
    ASSERT_EQ(r.r[find_report(&r, n.dlq)].action, JSD_TOPOLOGY_CREATED);
    char cname[160];
    jsd__snprintf(cname, sizeof(cname), "%s/ship", n.stream);
    ASSERT_EQ(r.r[find_report(&r, cname)].action, JSD_TOPOLOGY_CREATED);
    ASSERT_STREQ(r.r[find_report(&r, cname)].kind, "consumer");

    /* the server holds what the file says */
    jsStreamInfo *si = server_stream(c, n.stream);
    ASSERT_TRUE(si != NULL);
    ASSERT_EQ(si->Config->Storage, js_FileStorage);
    ASSERT_EQ(si->Config->Retention, js_LimitsPolicy);
    ASSERT_EQ(si->Config->MaxAge, 3600LL * 1000000000LL);
    ASSERT_EQ(si->Config->Duplicates, 120LL * 1000000000LL);
    jsStreamInfo_Destroy(si);
    si = server_stream(c, n.dlq);
    ASSERT_TRUE(si != NULL);
    ASSERT_EQ(si->Config->MaxMsgs, 1000);
    jsStreamInfo_Destroy(si);

    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    ASSERT_EQ(js_GetConsumerInfo(&ci, jsd__conn_js(c), n.stream, "ship", NULL, &jerr), NATS_OK);
    ASSERT_EQ(ci->Config->AckPolicy, js_AckExplicit);
    ASSERT_EQ(ci->Config->DeliverPolicy, js_DeliverAll);
    ASSERT_EQ(ci->Config->MaxDeliver, 5);
    ASSERT_EQ(ci->Config->MaxAckPending, 64);
    ASSERT_EQ(ci->Config->BackOffLen, 3);
    ASSERT_EQ(ci->Config->BackOff[2], 5LL * 1000000000LL);
    ASSERT_TRUE(ci->Config->DeliverSubject == NULL || !ci->Config->DeliverSubject[0]);
    jsConsumerInfo_Destroy(ci);

    /* applying the same file again changes nothing */
    ASSERT_OK_E(apply(c, t, JSD_TOPOLOGY_RECONCILE, false, &r, &e), e.msg);
    for (int i = 0; i < r.n; i++)
        if (r.r[i].action != JSD_TOPOLOGY_UNCHANGED)
            fail_msg("%s %s: %s (%s), expected unchanged", r.r[i].kind, r.r[i].name,
                     jsd_topology_action_str(r.r[i].action), r.r[i].changes);
    jsd_topology_destroy(t);
    jsd_conn_close(c);
}

static void create_keeps_hand_tuned_limit_and_reconcile_updates_it(void **state)
{
    (void)state;
    names n;
    make_names(&n);
    jsd_conn *c = open_conn();
    jsd_topology *t = topo_of(&n, NULL, NULL);
    rec r;
    jsd_error e;
    ASSERT_OK_E(apply(c, t, JSD_TOPOLOGY_CREATE, false, &r, &e), e.msg);
    hand_tune_max_msgs(c, n.stream, 5000);

    /* create-if-missing keeps the operator's limit and says so */
    ASSERT_OK_E(apply(c, t, JSD_TOPOLOGY_CREATE, false, &r, &e), e.msg);
    int i = find_report(&r, n.stream);
    ASSERT_EQ(r.r[i].action, JSD_TOPOLOGY_KEPT);
    ASSERT_STREQ(r.r[i].changes, "max_msgs=5000->unlimited;");
    jsStreamInfo *si = server_stream(c, n.stream);
    ASSERT_EQ(si->Config->MaxMsgs, 5000);
    jsStreamInfo_Destroy(si);

    /* reconcile brings it back to the file */
    ASSERT_OK_E(apply(c, t, JSD_TOPOLOGY_RECONCILE, false, &r, &e), e.msg);
    i = find_report(&r, n.stream);
    ASSERT_EQ(r.r[i].action, JSD_TOPOLOGY_UPDATED);
    ASSERT_TRUE(!r.r[i].dry_run);
    ASSERT_STREQ(r.r[i].changes, "max_msgs=5000->unlimited;");
    si = server_stream(c, n.stream);
    ASSERT_EQ(si->Config->MaxMsgs, -1);
    jsStreamInfo_Destroy(si);

    /* a file that raises limits and changes the consumer: reconcile updates both */
    jsd_topology *t2 = topo_of(&n, ",\"max_msgs\":9000,\"max_msgs_per_subject\":10",
                               ",\"inactive_threshold\":\"7d\"");
    ASSERT_OK_E(apply(c, t2, JSD_TOPOLOGY_RECONCILE, false, &r, &e), e.msg);
    i = find_report(&r, n.stream);
    ASSERT_EQ(r.r[i].action, JSD_TOPOLOGY_UPDATED);
    ASSERT_CONTAINS(r.r[i].changes, "max_msgs=unlimited->9000;");
    ASSERT_CONTAINS(r.r[i].changes, "max_msgs_per_subject=unlimited->10;");
    char cname[160];
    jsd__snprintf(cname, sizeof(cname), "%s/ship", n.stream);
    i = find_report(&r, cname);
    ASSERT_EQ(r.r[i].action, JSD_TOPOLOGY_UPDATED);
    ASSERT_STREQ(r.r[i].changes, "inactive_threshold=none->7d;");
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    ASSERT_EQ(js_GetConsumerInfo(&ci, jsd__conn_js(c), n.stream, "ship", NULL, &jerr), NATS_OK);
    ASSERT_EQ(ci->Config->InactiveThreshold, 7LL * 24 * 3600 * 1000000000LL);
    jsConsumerInfo_Destroy(ci);
    si = server_stream(c, n.stream);
    ASSERT_EQ(si->Config->MaxMsgs, 9000);
    ASSERT_EQ(si->Config->MaxMsgsPerSubject, 10);
    jsStreamInfo_Destroy(si);
    jsd_topology_destroy(t2);
    jsd_topology_destroy(t);
    jsd_conn_close(c);
}

static void dry_run_reports_and_changes_nothing(void **state)
{
    (void)state;
    names n;
    make_names(&n);
    jsd_conn *c = open_conn();
    jsd_topology *t = topo_of(&n, NULL, NULL);
    rec r;
    jsd_error e;

    ASSERT_OK_E(apply(c, t, JSD_TOPOLOGY_CREATE, true, &r, &e), e.msg);
    ASSERT_EQ(r.n, 3);
    for (int i = 0; i < r.n; i++) {
        ASSERT_EQ(r.r[i].action, JSD_TOPOLOGY_CREATED);
        ASSERT_TRUE(r.r[i].dry_run);
    }
    ASSERT_TRUE(server_stream(c, n.stream) == NULL);
    ASSERT_TRUE(server_stream(c, n.dlq) == NULL);

    ASSERT_OK_E(apply(c, t, JSD_TOPOLOGY_CREATE, false, &r, &e), e.msg);
    hand_tune_max_msgs(c, n.stream, 5000);
    ASSERT_OK_E(apply(c, t, JSD_TOPOLOGY_RECONCILE, true, &r, &e), e.msg);
    int i = find_report(&r, n.stream);
    ASSERT_EQ(r.r[i].action, JSD_TOPOLOGY_UPDATED);
    ASSERT_TRUE(r.r[i].dry_run);
    ASSERT_STREQ(r.r[i].changes, "max_msgs=5000->unlimited;");
    jsStreamInfo *si = server_stream(c, n.stream);
    ASSERT_EQ(si->Config->MaxMsgs, 5000);
    jsStreamInfo_Destroy(si);
    jsd_topology_destroy(t);
    jsd_conn_close(c);
}

static void overlap_with_existing_server_stream_is_refused(void **state)
{
    (void)state;
    names n;
    make_names(&n);
    jsd_conn *c = open_conn();
    /* a stream the file does not know, on a subject inside the file's root */
    char legacy[80], subj[128];
    jsd__snprintf(legacy, sizeof(legacy), "LEGACY_%s", n.stream);
    jsd__snprintf(subj, sizeof(subj), "%s.legacy.*", n.root);
    const char *subjects[] = {subj};
    jsStreamConfig cfg;
    jsStreamConfig_Init(&cfg);
    cfg.Name = legacy;
    cfg.Subjects = subjects;
    cfg.SubjectsLen = 1;
    jsStreamInfo *res = NULL;
    jsErrCode jerr = 0;
    ASSERT_EQ(js_AddStream(&res, jsd__conn_js(c), &cfg, NULL, &jerr), NATS_OK);
    jsStreamInfo_Destroy(res);

    jsd_topology *t = topo_of(&n, NULL, NULL);
    rec r;
    jsd_error e;
    for (int p = 0; p < 2; p++) {
        ASSERT_STATUS(apply(c, t, p ? JSD_TOPOLOGY_RECONCILE : JSD_TOPOLOGY_CREATE, false, &r, &e),
                      JSD_ERR_CONFIG);
        ASSERT_CONTAINS(e.msg, "streams[0].subjects[0]");
        ASSERT_CONTAINS(e.msg, n.stream);
        ASSERT_CONTAINS(e.msg, legacy);
        ASSERT_CONTAINS(e.msg, subj);
        ASSERT_EQ(r.n, 0);
        /* refused as a whole: not even the dead-letter stream was created */
        ASSERT_TRUE(server_stream(c, n.dlq) == NULL);
        ASSERT_TRUE(server_stream(c, n.stream) == NULL);
    }
    jsd_topology_destroy(t);
    jsd_conn_close(c);
}

static void immutable_fields_are_refused_by_name(void **state)
{
    (void)state;
    names n;
    make_names(&n);
    jsd_conn *c = open_conn();
    jsd_topology *t = topo_of(&n, NULL, NULL);
    rec r;
    jsd_error e;
    ASSERT_OK_E(apply(c, t, JSD_TOPOLOGY_CREATE, false, &r, &e), e.msg);

    jsd_topology *mem = topo_of(&n, ",\"storage\":\"memory\",\"max_msgs\":7", NULL);
    ASSERT_STATUS(apply(c, mem, JSD_TOPOLOGY_RECONCILE, false, &r, &e), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(e.msg, "storage (server file, file memory)");
    ASSERT_CONTAINS(e.msg, n.stream);
    ASSERT_CONTAINS(e.msg, "never deletes");
    jsStreamInfo *si = server_stream(c, n.stream);
    ASSERT_EQ(si->Config->Storage, js_FileStorage);
    ASSERT_EQ(si->Config->MaxMsgs, -1); /* the plan was refused: nothing applied */
    jsStreamInfo_Destroy(si);

    /* the create policy keeps it and reports the difference */
    ASSERT_OK_E(apply(c, mem, JSD_TOPOLOGY_CREATE, false, &r, &e), e.msg);
    int i = find_report(&r, n.stream);
    ASSERT_EQ(r.r[i].action, JSD_TOPOLOGY_KEPT);
    ASSERT_CONTAINS(r.r[i].changes, "storage=file->memory;");

    jsd_topology *wq = topo_of(&n, ",\"retention\":\"workqueue\"", NULL);
    ASSERT_STATUS(apply(c, wq, JSD_TOPOLOGY_RECONCILE, false, &r, &e), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(e.msg, "retention (server limits, file workqueue)");
    jsd_topology_destroy(wq);
    jsd_topology_destroy(mem);
    jsd_topology_destroy(t);
    jsd_conn_close(c);
}

static void consumer_changes_the_server_cannot_make_are_refused(void **state)
{
    (void)state;
    names n;
    make_names(&n);
    jsd_conn *c = open_conn();
    jsd_topology *t = topo_of(&n, NULL, NULL);
    rec r;
    jsd_error e;
    ASSERT_OK_E(apply(c, t, JSD_TOPOLOGY_CREATE, false, &r, &e), e.msg);

    /* a new filter subject: 2.10 updates it in place, 2.9 cannot */
    char json[2048];
    jsd__snprintf(json, sizeof(json),
                  "{\"streams\":[{\"name\":\"%s\",\"subjects\":[\"%s.>\"],\"max_age\":\"1h\","
                  "\"duplicate_window\":\"2m\"}],"
                  "\"dead_letter\":{\"name\":\"%s\",\"subjects\":[\"%s.>\"],\"max_msgs\":1000},"
                  "\"consumers\":[{\"stream\":\"%s\",\"durable\":\"ship\",\"filter_subject\":"
                  "\"%s.shipped\",\"max_deliver\":5,\"backoff\":[\"1s\",\"2s\",\"5s\"],"
                  "\"max_ack_pending\":64}]}",
                  n.stream, n.root, n.dlq, n.dlq_root, n.stream, n.root);
    jsd_topology *t2 = NULL;
    ASSERT_OK_E(jsd_topology_parse(&t2, json, strlen(json), &e), e.msg);
    const char *ver = jsd_conn_server_version(c);
    ASSERT_TRUE(ver != NULL);
    char *dot = NULL;
    long major = strtol(ver, &dot, 10), minor = *dot == '.' ? strtol(dot + 1, NULL, 10) : 0;
    bool v210 = major > 2 || (major == 2 && minor >= 10);
    char want[160];
    jsd__snprintf(want, sizeof(want), "filter_subject=%s.created->%s.shipped;", n.root, n.root);
    if (v210) {
        ASSERT_OK_E(apply(c, t2, JSD_TOPOLOGY_RECONCILE, false, &r, &e), e.msg);
        char cname[160];
        jsd__snprintf(cname, sizeof(cname), "%s/ship", n.stream);
        int i = find_report(&r, cname);
        ASSERT_EQ(r.r[i].action, JSD_TOPOLOGY_UPDATED);
        ASSERT_STREQ(r.r[i].changes, want);
    } else {
        ASSERT_STATUS(apply(c, t2, JSD_TOPOLOGY_RECONCILE, false, &r, &e), JSD_ERR_CONFIG);
        ASSERT_CONTAINS(e.msg, "filter_subject");
        ASSERT_CONTAINS(e.msg, "2.10 can");
        /* the create policy keeps it and reports the difference */
        ASSERT_OK_E(apply(c, t2, JSD_TOPOLOGY_CREATE, false, &r, &e), e.msg);
    }

    /* a push consumer of the same name: refused under both policies */
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = "pushy";
    cc.DeliverSubject = "push.deliver.here";
    cc.AckPolicy = js_AckExplicit;
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    ASSERT_EQ(js_AddConsumer(&ci, jsd__conn_js(c), n.stream, &cc, NULL, &jerr), NATS_OK);
    jsConsumerInfo_Destroy(ci);
    jsd__snprintf(json, sizeof(json),
                  "{\"streams\":[{\"name\":\"%s\",\"subjects\":[\"%s.>\"],\"max_age\":\"1h\","
                  "\"duplicate_window\":\"2m\"}],"
                  "\"consumers\":[{\"stream\":\"%s\",\"durable\":\"pushy\"}]}",
                  n.stream, n.root, n.stream);
    jsd_topology *t3 = NULL;
    ASSERT_OK_E(jsd_topology_parse(&t3, json, strlen(json), &e), e.msg);
    for (int p = 0; p < 2; p++) {
        ASSERT_STATUS(apply(c, t3, p ? JSD_TOPOLOGY_RECONCILE : JSD_TOPOLOGY_CREATE, false, &r, &e),
                      JSD_ERR_CONFIG);
        ASSERT_CONTAINS(e.msg, "push consumer");
        ASSERT_CONTAINS(e.msg, "/pushy");
    }
    jsd_topology_destroy(t3);
    jsd_topology_destroy(t2);
    jsd_topology_destroy(t);
    jsd_conn_close(c);
}

static void each_request_has_a_deadline(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    jsd_conn_opts o;
    jsd_conn_opts_init(&o);
    o.servers = fx.url;
    jsd_conn *c = NULL;
    jsd_error e;
    ASSERT_OK_E(jsd_conn_open(&c, &o, &e), e.msg);
    names n;
    make_names(&n);
    jsd_topology *t = topo_of(&n, NULL, NULL);

    /* a server that stops answering: the apply gives up after its deadline */
    ASSERT_EQ(jsd_fx_nats_pause(&fx), 0);
    jsd_topology_apply_opts ao;
    jsd_topology_apply_opts_init(&ao);
    ao.timeout_ms = 700;
    int64_t t0 = jsd_test_mono_ms();
    ASSERT_STATUS(jsd_topology_apply(c, t, &ao, &e), JSD_ERR_TIMEOUT);
    int64_t took = jsd_test_mono_ms() - t0;
    ASSERT_LE(took, 700 + 1000);
    ASSERT_TRUE(took >= 600);
    ASSERT_CONTAINS(e.msg, "listing the server's streams");
    ASSERT_EQ(jsd_fx_nats_resume(&fx), 0);

    /* after the resume the same apply works */
    ASSERT_WAIT(jsd_conn_is_connected(c), 10000);
    rec r;
    ASSERT_OK_E(apply(c, t, JSD_TOPOLOGY_CREATE, false, &r, &e), e.msg);
    ASSERT_EQ(r.n, 3);
    jsd_topology_destroy(t);
    jsd_conn_close(c);
    jsd_fx_nats_stop(&fx);
}

static int run_cli(const char *args, char *out, size_t cap)
{
    char cmd[2048];
    jsd__snprintf(cmd, sizeof(cmd), "%s provision --nats %s %s", jsd_fx_bin("jsdurable"),
                  jsd_fx_shared_nats_url(), args);
    return jsd_test_run(cmd, out, cap);
}

static void cli_end_to_end(void **state)
{
    (void)state;
    names n;
    make_names(&n);
    char path[512], args[1024], out[8192], json[2048];
    jsd__snprintf(path, sizeof(path), "%s/topo.json", jsd_test_dir());
    jsd__snprintf(json, sizeof(json),
                  "{\"streams\":[{\"name\":\"%s\",\"subjects\":[\"%s.>\"],\"max_msgs\":%s}],"
                  "\"dead_letter\":{\"name\":\"%s\",\"subjects\":[\"%s.>\"]},"
                  "\"consumers\":[{\"stream\":\"%s\",\"durable\":\"ship\"}]}",
                  n.stream, n.root, "100", n.dlq, n.dlq_root, n.stream);
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fputs(json, f);
    fclose(f);

    jsd__snprintf(args, sizeof(args), "--file %s", path);
    int rc = run_cli(args, out, sizeof(out));
    if (rc != 0)
        fail_msg("provision exited %d: %s", rc, out);
    char line[256];
    jsd__snprintf(line, sizeof(line), "stream %s: created\n", n.stream);
    ASSERT_CONTAINS(out, line);
    jsd__snprintf(line, sizeof(line), "stream %s: created\n", n.dlq);
    ASSERT_CONTAINS(out, line);
    jsd__snprintf(line, sizeof(line), "consumer %s/ship: created\n", n.stream);
    ASSERT_CONTAINS(out, line);
    ASSERT_CONTAINS(out, "done: 3 objects, 3 changed (create policy)");

    /* the file changes: create keeps, dry-run reconcile shows, reconcile updates */
    jsd__snprintf(json, sizeof(json),
                  "{\"streams\":[{\"name\":\"%s\",\"subjects\":[\"%s.>\"],\"max_msgs\":%s}],"
                  "\"dead_letter\":{\"name\":\"%s\",\"subjects\":[\"%s.>\"]},"
                  "\"consumers\":[{\"stream\":\"%s\",\"durable\":\"ship\"}]}",
                  n.stream, n.root, "200", n.dlq, n.dlq_root, n.stream);
    f = fopen(path, "w");
    fputs(json, f);
    fclose(f);
    rc = run_cli(args, out, sizeof(out));
    ASSERT_EQ(rc, 0);
    jsd__snprintf(line, sizeof(line), "stream %s: kept (max_msgs: server 100, file 200)\n",
                  n.stream);
    ASSERT_CONTAINS(out, line);
    jsd__snprintf(line, sizeof(line), "stream %s: unchanged\n", n.dlq);
    ASSERT_CONTAINS(out, line);

    jsd__snprintf(args, sizeof(args), "--file %s --policy reconcile --dry-run", path);
    rc = run_cli(args, out, sizeof(out));
    ASSERT_EQ(rc, 0);
    jsd__snprintf(line, sizeof(line), "stream %s: would update (max_msgs: server 100, file 200)\n",
                  n.stream);
    ASSERT_CONTAINS(out, line);
    ASSERT_CONTAINS(out, "dry run: 3 objects, 1 would change (reconcile policy)");

    jsd__snprintf(args, sizeof(args), "--file %s --policy reconcile", path);
    rc = run_cli(args, out, sizeof(out));
    ASSERT_EQ(rc, 0);
    jsd__snprintf(line, sizeof(line), "stream %s: updated (max_msgs: server 100, file 200)\n",
                  n.stream);
    ASSERT_CONTAINS(out, line);
    jsd_conn *c = open_conn();
    jsStreamInfo *si = server_stream(c, n.stream);
    ASSERT_EQ(si->Config->MaxMsgs, 200);
    jsStreamInfo_Destroy(si);
    jsd_conn_close(c);

    /* a refused file: exit 78, the key path, nothing contacted */
    f = fopen(path, "w");
    fputs("{\"streams\":[{\"name\":\"X\",\"subjects\":[\"a.>.b\"]}]}", f);
    fclose(f);
    jsd__snprintf(args, sizeof(args), "--file %s", path);
    rc = run_cli(args, out, sizeof(out));
    ASSERT_EQ(rc, 78);
    ASSERT_CONTAINS(out, "streams[0].subjects[0]: wildcard \">\" must be the last token");

    /* usage errors and help */
    ASSERT_EQ(run_cli("--policy sometimes --file x", out, sizeof(out)), 64);
    ASSERT_CONTAINS(out, "--policy takes create or reconcile");
    ASSERT_EQ(run_cli("", out, sizeof(out)), 64);
    ASSERT_CONTAINS(out, "--file FILE is required");
    ASSERT_EQ(run_cli("--help", out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "Example:");
}

/* The stream's configuration as the server holds it (every field), or NULL. */
static json_t *raw_config(jsd_conn *c, const char *name)
{
    json_t *cfg = NULL;
    jsd_error e;
    jsd_error_clear(&e);
    ASSERT_OK_E(jsd__stream_config_json(c, name, &cfg, &e), e.msg);
    return cfg;
}

/* Skip the case, its connection closed first, unless the server's version
 * is at least major.minor (older: unless it is before it). */
static void need_server(jsd_conn *c, int major, int minor, bool older, const char *why)
{
    char ver[32];
    const char *v = jsd_conn_server_version(c);
    jsd__strlcpy(ver, v ? v : "?", sizeof(ver));
    if (jsd_test_version_at_least(ver, major, minor) == !older)
        return;
    jsd_conn_close(c);
    jsd_test_skip_because("nats-server %s: %s", ver, why);
}

static bool raw_bool(jsd_conn *c, const char *stream, const char *field)
{
    json_t *cfg = raw_config(c, stream);
    bool v = json_is_true(json_object_get(cfg, field));
    json_decref(cfg);
    return v;
}

/* allow_atomic is created, survives an update that does not name it (nats.c
 * 3.4.1's update left it out and the server turned it off), and is changed
 * by reconcile when the file says otherwise. */
static void allow_atomic_is_set_and_survives_updates(void **state)
{
    (void)state;
    jsd_conn *c = open_conn();
    need_server(c, 2, 12, false, "no atomic batch publish (allow_atomic: 2.12+)");
    names n;
    make_names(&n);
    rec r;
    jsd_error e;
    jsd_topology *t = topo_of(&n, ",\"allow_atomic\":true,\"persist_mode\":\"default\"", NULL);
    ASSERT_OK_E(apply(c, t, JSD_TOPOLOGY_CREATE, false, &r, &e), e.msg);
    ASSERT_TRUE(raw_bool(c, n.stream, "allow_atomic"));

    /* an operator's change through a file that does not know allow_atomic */
    jsd_topology *other = topo_of(&n, ",\"max_msgs\":7", NULL);
    ASSERT_OK_E(apply(c, other, JSD_TOPOLOGY_RECONCILE, false, &r, &e), e.msg);
    ASSERT_EQ(r.r[find_report(&r, n.stream)].action, JSD_TOPOLOGY_UPDATED);
    ASSERT_TRUE(raw_bool(c, n.stream, "allow_atomic"));

    /* the same file again: unchanged, not "updated" for a field it did not name */
    ASSERT_OK_E(apply(c, other, JSD_TOPOLOGY_RECONCILE, false, &r, &e), e.msg);
    ASSERT_EQ(r.r[find_report(&r, n.stream)].action, JSD_TOPOLOGY_UNCHANGED);

    jsd_topology *off = topo_of(&n, ",\"max_msgs\":7,\"allow_atomic\":false", NULL);
    ASSERT_OK_E(apply(c, off, JSD_TOPOLOGY_CREATE, false, &r, &e), e.msg);
    int i = find_report(&r, n.stream);
    ASSERT_EQ(r.r[i].action, JSD_TOPOLOGY_KEPT);
    ASSERT_STREQ(r.r[i].changes, "allow_atomic=true->false;");
    ASSERT_TRUE(raw_bool(c, n.stream, "allow_atomic"));
    ASSERT_OK_E(apply(c, off, JSD_TOPOLOGY_RECONCILE, false, &r, &e), e.msg);
    ASSERT_TRUE(!raw_bool(c, n.stream, "allow_atomic"));

    jsd_topology_destroy(off);
    jsd_topology_destroy(other);
    jsd_topology_destroy(t);
    jsd_conn_close(c);
}

/* A stream that acknowledges before storing (persist_mode async, made by
 * hand) cannot be brought to a file that says "default": JetStream cannot
 * change the mode in place, and the refusal names the field. */
static void persist_mode_is_refused_by_name(void **state)
{
    (void)state;
    jsd_conn *c = open_conn();
    need_server(c, 2, 12, false, "no persist_mode (2.12+)");
    names n;
    make_names(&n);
    char api[160], body[512];
    jsd__snprintf(api, sizeof(api), "STREAM.CREATE.%s", n.stream);
    jsd__snprintf(body, sizeof(body),
                  "{\"name\":\"%s\",\"subjects\":[\"%s.>\"],\"storage\":\"file\","
                  "\"persist_mode\":\"async\"}",
                  n.stream, n.root);
    json_t *ans = NULL;
    jsd_error e;
    jsd_error_clear(&e);
    ASSERT_OK_E(jsd__js_api(c, api, body, &ans, "creating an async stream", &e), e.msg);
    json_decref(ans);

    rec r;
    jsd_topology *t = topo_of(&n, ",\"persist_mode\":\"default\"", NULL);
    ASSERT_STATUS(apply(c, t, JSD_TOPOLOGY_RECONCILE, false, &r, &e), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(e.msg, "persist_mode (server async, file default)");
    ASSERT_CONTAINS(e.msg, "cannot be changed in place");
    json_t *cfg = raw_config(c, n.stream);
    ASSERT_STREQ(json_string_value(json_object_get(cfg, "persist_mode")), "async");
    json_decref(cfg);
    jsd_topology_destroy(t);
    jsd_conn_close(c);
}

/* A server that does not know allow_atomic ignores it: provision says so
 * instead of reporting a stream it did not make. */
static void allow_atomic_on_an_older_server_is_an_error(void **state)
{
    (void)state;
    jsd_conn *c = open_conn();
    need_server(c, 2, 12, true,
                "it knows allow_atomic; the compatibility lane (before 2.12) runs this case");
    names n;
    make_names(&n);
    rec r;
    jsd_error e;
    jsd_topology *t = topo_of(&n, ",\"allow_atomic\":true", NULL);
    ASSERT_STATUS(apply(c, t, JSD_TOPOLOGY_CREATE, false, &r, &e), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(e.msg, "did not take \"allow_atomic\": true");
    ASSERT_CONTAINS(e.msg, "2.12 or later");
    jsd_topology_destroy(t);
    jsd_conn_close(c);
}

JSD_TEST_MAIN(cmocka_unit_test(create_creates_everything),
              cmocka_unit_test(create_keeps_hand_tuned_limit_and_reconcile_updates_it),
              cmocka_unit_test(dry_run_reports_and_changes_nothing),
              cmocka_unit_test(overlap_with_existing_server_stream_is_refused),
              cmocka_unit_test(immutable_fields_are_refused_by_name),
              cmocka_unit_test(consumer_changes_the_server_cannot_make_are_refused),
              cmocka_unit_test(each_request_has_a_deadline), cmocka_unit_test(cli_end_to_end),
              cmocka_unit_test(allow_atomic_is_set_and_survives_updates),
              cmocka_unit_test(persist_mode_is_refused_by_name),
              cmocka_unit_test(allow_atomic_on_an_older_server_is_an_error))
