/*
 * The publisher's shared test helpers (publisher_env.h says what each does):
 * a jsd_conn on a fixture, streams made with raw nats.c, and reads of what the
 * broker stored over a second, direct connection.
 */
#include "publisher_env.h"

jsd_conn *ph_open_user(const char *url, const char *user, const char *password)
{
    jsd_conn_opts o;
    jsd_conn *c = NULL;
    jsd_error err;
    jsd_conn_opts_init(&o);
    o.servers = url;
    o.user = user;
    o.password = password;
    o.startup_budget_ms = 5000;
    o.reconnect_wait_ms = 100;
    o.reconnect_jitter_ms = 10;
    o.request_timeout_ms = 3000;
    jsd_error_clear(&err);
    ASSERT_OK(jsd_conn_open(&c, &o, &err), err.msg);
    return c;
}

jsd_conn *ph_open(const char *url)
{
    return ph_open_user(url, NULL, NULL);
}

/* A direct nats.c connection, independent of the library, without reconnects
 * (user may be NULL). */
natsConnection *ph_direct(const char *url, const char *user, const char *password)
{
    natsOptions *o = NULL;
    natsConnection *nc = NULL;
    natsStatus s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = natsOptions_SetURL(o, url);
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(o, 3000);
    if (s == NATS_OK && user)
        s = natsOptions_SetUserInfo(o, user, password);
    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(o, 200);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(o, 100);
    if (s == NATS_OK)
        s = natsConnection_Connect(&nc, o);
    natsOptions_Destroy(o);
    if (s != NATS_OK)
        fail_msg("direct connection to %s: %s", url, natsStatus_GetText(s));
    return nc;
}

jsCtx *ph_js(natsConnection *nc)
{
    jsCtx *js = NULL;
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = 5000;
    if (natsConnection_JetStream(&js, nc, &jo) != NATS_OK)
        fail_msg("no JetStream context");
    return js;
}

void ph_add_stream(jsCtx *js, const ph_stream *p)
{
    jsStreamConfig cfg;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    const char *subjects[1] = {p->subject};
    jsStreamConfig_Init(&cfg);
    cfg.Name = p->name;
    cfg.Subjects = subjects;
    cfg.SubjectsLen = 1;
    cfg.Storage = p->memory ? js_MemoryStorage : js_FileStorage;
    cfg.NoAck = p->no_ack;
    cfg.Duplicates = p->dup_window_ms * 1000000;
    natsStatus s = js_AddStream(&si, js, &cfg, NULL, &jerr);
    if (s != NATS_OK)
        fail_msg("creating stream %s: %s (%d)", p->name, natsStatus_GetText(s), (int)jerr);
    jsStreamInfo_Destroy(si);
}

void ph_delete_stream(jsCtx *js, const char *name)
{
    jsErrCode jerr = 0;
    natsStatus s = js_DeleteStream(js, name, NULL, &jerr);
    if (s != NATS_OK)
        fail_msg("deleting stream %s: %s (%d)", name, natsStatus_GetText(s), (int)jerr);
}

/* Messages stored in the stream, or -1 if it cannot be read. */
int64_t ph_stream_msgs(jsCtx *js, const char *name)
{
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    if (js_GetStreamInfo(&si, js, name, NULL, &jerr) != NATS_OK || !si)
        return -1;
    int64_t n = (int64_t)si->State.Msgs;
    jsStreamInfo_Destroy(si);
    return n;
}

/* Messages the client has written so far (its outgoing message counter). */
uint64_t ph_out_msgs(natsConnection *nc)
{
    natsStatistics *st = NULL;
    uint64_t out = 0;
    if (natsStatistics_Create(&st) == NATS_OK && natsConnection_GetStats(nc, st) == NATS_OK)
        natsStatistics_GetCounts(st, NULL, NULL, &out, NULL, NULL);
    natsStatistics_Destroy(st);
    return out;
}

jsd_publisher *ph_bind(jsd_conn *c, const char *stream, const char *subject, int admission,
                       int deadline_ms)
{
    jsd_publisher_opts o;
    jsd_publisher *p = NULL;
    jsd_error err;
    jsd_publisher_opts_init(&o);
    o.stream = stream;
    o.subject = subject;
    o.admission = admission;
    o.deadline_ms = deadline_ms;
    jsd_error_clear(&err);
    ASSERT_OK(jsd_publisher_bind(&p, c, &o, &err), err.msg);
    return p;
}
