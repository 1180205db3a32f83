/*
 * consumer_durable — the durable a consumer binds to: the option defaults,
 * jsd_consumer_ensure (create the durable, or check an existing one) and the
 * checks at create (jsd_consumer_check, the options, the durable's config as
 * the server reports it, from which the batch size, the park threshold P =
 * max_deliver - 1, the ack wait and the +WPI period are derived, and the
 * dead-letter stream that must capture the dead-letter subject).
 */
#include <inttypes.h>
#include <string.h>

#include "conn_int.h"
#include "consumer_int.h"
#include "topology_int.h"
#include "subject.h"

/* ---- options ---------------------------------------------------------------------- */

void jsd_durable_config_init(jsd_durable_config *c)
{
    /* No backoff: with one, JetStream takes backoff[0] as the ack wait. */
    memset(c, 0, sizeof(*c));
    c->ack_wait_ms = 30000;
    c->max_deliver = 6;
    c->max_ack_pending = 1024;
}

void jsd_consumer_opts_init(jsd_consumer_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->batch = 0; /* auto */
    o->fetch_wait_ms = 500;
    o->ack_timeout_ms = 5000;
    o->retry_delay_ms = 1000;
    o->inbox_retention_ms = 7LL * 24 * 3600 * 1000;
    o->hold_alert_ms = JSD__HOLD_ALERT_MS;
}

jsd_status jsd_consumer_ensure(jsd_conn *conn, const char *stream, const char *durable,
                               const jsd_durable_config *cfg, bool *created, jsd_error *err)
{
    jsCtx *js = conn ? jsd__conn_js(conn) : NULL;
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    jsd_durable_config def;
    int64_t backoff_ns[JSD_BACKOFF_MAX];

    if (created)
        *created = false;
    if (!js)
        return jsd__err(err, JSD_ERR_INVALID, "consumer ensure: no connection");
    if (!jsd__stream_name_valid(stream, err) || !jsd__stream_name_valid(durable, err))
        return JSD_ERR_INVALID;
    if (!cfg) {
        jsd_durable_config_init(&def);
        cfg = &def;
    }
    natsStatus s = js_GetConsumerInfo(&ci, js, stream, durable, NULL, &jerr);
    if (s == NATS_OK) {
        /* Left exactly as it is; but a filter asked for and not in force is
         * refused rather than silently ignored. */
        const char *have = ci->Config && ci->Config->FilterSubject ? ci->Config->FilterSubject : "";
        jsd_status st = JSD_OK;
        if (cfg && cfg->filter_subject && strcmp(cfg->filter_subject, have) != 0)
            st = jsd__err(err, JSD_ERR_CONFIG,
                          "durable \"%s\" exists with filter \"%s\", not \"%s\"; use another "
                          "durable name or change it with `jsdurable provision`",
                          durable, have, cfg->filter_subject);
        jsConsumerInfo_Destroy(ci);
        return st;
    }
    if (s != NATS_NOT_FOUND && jerr != JSConsumerNotFoundErr)
        return jsd__err_nats(err, s, jerr, "consumer info");
    if (cfg->max_deliver == 0 || cfg->max_deliver == 1 || cfg->max_deliver < -1)
        return jsd__err(err, JSD_ERR_CONFIG,
                        "max_deliver %d: use -1 (unlimited) or >= 2 (one delivery is kept "
                        "to retry a failed park)",
                        cfg->max_deliver);
    if (cfg->n_backoff < 0 || cfg->n_backoff > JSD_BACKOFF_MAX || cfg->ack_wait_ms <= 0 ||
        cfg->max_ack_pending <= 0)
        return jsd__err(err, JSD_ERR_CONFIG,
                        "consumer ensure: invalid ack wait, backoff or "
                        "max_ack_pending");
    if (cfg->filter_subject && !jsd__subject_valid_filter(cfg->filter_subject, err))
        return JSD_ERR_INVALID;
    for (int i = 0; i < cfg->n_backoff; i++)
        if (cfg->backoff_ms[i] <= 0)
            return jsd__err(err, JSD_ERR_CONFIG, "backoff step %d is %" PRId64 " ms: use > 0", i,
                            cfg->backoff_ms[i]);
    if (cfg->n_backoff > 0 && cfg->backoff_ms[0] < cfg->ack_wait_ms)
        return jsd__err(err, JSD_ERR_CONFIG,
                        "backoff starts at %" PRId64 " ms, below the ack wait %" PRId64
                        " ms: JetStream would wait only backoff[0] for the first ACK; start the "
                        "backoff at the ack wait or drop it",
                        cfg->backoff_ms[0], cfg->ack_wait_ms);
    if (cfg->n_backoff > 0 && cfg->backoff_ms[0] > cfg->ack_wait_ms)
        JSD_WARN("consumer",
                 "durable \"%s\": backoff starts at %" PRId64 " ms, so JetStream waits that long "
                 "for the first ACK, not the ack wait %" PRId64 " ms",
                 durable, cfg->backoff_ms[0], cfg->ack_wait_ms);

    /* One translation of a durable's settings into a jsConsumerConfig, the
     * one `jsdurable provision` uses. The server wants max_deliver >
     * len(backoff). */
    size_t n_bo = (size_t)cfg->n_backoff;
    if (cfg->max_deliver > 0 && n_bo >= (size_t)cfg->max_deliver)
        n_bo = (size_t)cfg->max_deliver - 1;
    jsd_topology_consumer tc = {.stream = stream,
                                .durable = durable,
                                .filter_subject = cfg->filter_subject,
                                .ack_wait_ms = cfg->ack_wait_ms,
                                .max_deliver = cfg->max_deliver,
                                .backoff_ms = cfg->backoff_ms,
                                .n_backoff = n_bo,
                                .max_ack_pending = cfg->max_ack_pending,
                                .inactive_threshold_ms = cfg->inactive_threshold_ms};
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    jsd__topo_consumer_config(&cc, &tc, backoff_ns);
    if (cfg->start_seq > 0) {
        cc.DeliverPolicy = js_DeliverByStartSequence;
        cc.OptStartSeq = cfg->start_seq;
    }
    s = js_AddConsumer(&ci, js, stream, &cc, NULL, &jerr);
    if (s != NATS_OK) {
        char what[300];
        jsd__snprintf(what, sizeof(what), "create durable \"%s\" on stream \"%s\"", durable,
                      stream);
        return jsd__err_nats(err, s, jerr, what);
    }
    jsConsumerInfo_Destroy(ci);
    if (created)
        *created = true;
    return JSD_OK;
}

/* Whether the durable exists: JSD_OK with *exists, or the error of the
 * lookup. */
static jsd_status durable_exists(jsCtx *js, const char *stream, const char *durable, int wait_ms,
                                 bool *exists, jsd_error *err)
{
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    jsOptions o;
    jsOptions_Init(&o);
    o.Wait = wait_ms; /* 0: the context's own */
    natsStatus s = js_GetConsumerInfo(&ci, js, stream, durable, &o, &jerr);
    jsConsumerInfo_Destroy(ci);
    *exists = s == NATS_OK;
    if (s == NATS_OK || s == NATS_NOT_FOUND || jerr == JSConsumerNotFoundErr)
        return JSD_OK;
    return jsd__err_nats(err, s, jerr, "consumer info");
}

/* An existing durable at start (consumer_position.c): ahead of its stream,
 * it is re-created with restore at the first sequence that may be new (see
 * the DESIGN there), or refused without; above its inbox's high-water mark
 * (a store restored from an older backup), it is reported with the
 * recovery and consumed as it is. */
static jsd_status check_position(jsd_conn *conn, jsd_store *store, const char *stream,
                                 const char *durable, const jsd_durable_config *restore,
                                 uint64_t *start_seq, jsd_error *err)
{
    jsd_durable_position p;
    jsd_status st = jsd_durable_position_get(conn, store, stream, durable, &p, err);
    if (st != JSD_OK)
        return st;
    if (p.ahead) {
        JSD_ERROR("consumer",
                  "%s/%s: durable \"%s\" is ahead of its stream: ack floor %" PRIu64
                  ", delivered %" PRIu64 ", but the stream ends at %" PRIu64
                  " (the server lost the stream's tail); the sequences it hands out again would "
                  "never be delivered; %s",
                  stream, durable, durable, p.ack_floor, p.delivered, p.stream_last,
                  restore ? "re-creating it at the first sequence that may be new"
                          : "give its settings (consume --topology FILE) to re-create it");
        if (!restore)
            return jsd__err(err, JSD_ERR_CONFIG,
                            "durable \"%s\" on stream \"%s\" is ahead of its stream (ack floor "
                            "%" PRIu64 ", the stream ends at %" PRIu64
                            "): the server lost the stream's tail and would never deliver what "
                            "is published at those sequences again; start with its settings "
                            "(consume --topology FILE) to re-create it at the first sequence "
                            "that may be new",
                            durable, stream, p.ack_floor, p.stream_last);
        uint64_t at = jsd__durable_resume_seq(conn, store, stream, durable, &p);
        if ((st = jsd__durable_rewind(conn, store, stream, durable, at, err)) != JSD_OK)
            return st;
        JSD_WARN("consumer",
                 "%s/%s: durable \"%s\" re-created at stream sequence %" PRIu64
                 " (the stream ends at %" PRIu64 ", its old ack floor was %" PRIu64 ")",
                 stream, durable, durable, at, p.stream_last, p.ack_floor);
        if (start_seq)
            *start_seq = at;
        return JSD_OK;
    }
    if (p.behind_from)
        JSD_ERROR("consumer",
                  "%s/%s: the inbox holds deliveries up to stream sequence %" PRIu64
                  " but durable \"%s\" acknowledged up to %" PRIu64
                  ", and the stream still holds sequence %" PRIu64
                  " in between: the store lost applications (restored from an older backup?); "
                  "they are not applied again unless the durable is re-created after the "
                  "inbox's high-water mark: consume --redeliver-from-inbox",
                  stream, durable, p.inbox_high, durable, p.ack_floor, p.behind_from);
    return JSD_OK;
}

jsd_status jsd_consumer_ensure_inbox(jsd_conn *conn, jsd_store *store, const char *stream,
                                     const char *durable, const jsd_durable_config *cfg,
                                     const jsd_durable_config *restore, bool *created,
                                     uint64_t *start_seq, jsd_error *err)
{
    jsCtx *js = conn ? jsd__conn_js(conn) : NULL;
    bool exists = false;
    uint64_t high = 0, floor = 0;

    if (created)
        *created = false;
    if (start_seq)
        *start_seq = 0;
    if (!js || !store)
        return jsd__err(err, JSD_ERR_INVALID, "consumer ensure: no connection or store");
    if (!jsd__stream_name_valid(stream, err) || !jsd__stream_name_valid(durable, err))
        return JSD_ERR_INVALID;
    jsd_status st = durable_exists(js, stream, durable, 0, &exists, err);
    if (st != JSD_OK)
        return st;
    if (exists) {
        if ((st = jsd_consumer_ensure(conn, stream, durable, cfg, created, err)) != JSD_OK)
            return st;
        return check_position(conn, store, stream, durable, restore, start_seq, err);
    }
    if ((st = jsd_store_inbox_high_water(store, stream, durable, &high)) != JSD_OK)
        return jsd__err(err, st, "durable \"%s\" is missing; reading its inbox: %s", durable,
                        jsd_store_errmsg(store));
    if ((st = jsd_store_durable_floor_get(store, stream, durable, &floor, NULL)) != JSD_OK)
        return jsd__err(err, st, "durable \"%s\" is missing; reading its recorded ack floor: %s",
                        durable, jsd_store_errmsg(store));
    if (high == 0 && floor == 0) /* a first start: nothing was applied from it */
        return jsd_consumer_ensure(conn, stream, durable, cfg, created, err);
    if (!restore)
        return jsd__err(err, JSD_ERR_CONFIG,
                        "durable \"%s\" on stream \"%s\" is missing, but the store holds its "
                        "deliveries (inbox high-water mark %" PRIu64 ", recorded ack floor %" PRIu64
                        "): it existed and was lost; created again from defaults it would not be "
                        "the durable that was provisioned and would start from the stream's "
                        "start; restore it with `jsdurable provision`, or give its settings "
                        "(consume --topology FILE) to re-create it after sequence %" PRIu64,
                        durable, stream, high, floor, floor ? floor : high);
    jsd_durable_config at = *restore;
    char why[400];
    if ((st = jsd__durable_lost_start(store, stream, durable, high, &at.start_seq, why, sizeof(why),
                                      err)) != JSD_OK)
        return st;
    /* The stream lost its tail too (it ends below the floor, or without
     * one below the mark): its sequences after its end are handed out
     * again, so it resumes where a durable ahead of its stream would
     * (consumer_position.c), not after them. */
    uint64_t mark = floor ? floor : high;
    bool tail_lost = false;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    if (js_GetStreamInfo(&si, js, stream, NULL, &jerr) == NATS_OK && si->State.LastSeq < mark) {
        jsd_durable_position p = {.stream_first = si->State.FirstSeq,
                                  .stream_last = si->State.LastSeq};
        at.start_seq = jsd__durable_resume_seq(conn, store, stream, durable, &p);
        tail_lost = true;
        jsd__snprintf(why, sizeof(why),
                      "where the old stream ends: the store holds deliveries up to stream "
                      "sequence %" PRIu64 " but the stream ends at %" PRIu64
                      " (the server lost the stream's tail)",
                      mark, si->State.LastSeq);
        JSD_ERROR("consumer",
                  "%s/%s: the store holds deliveries up to stream sequence %" PRIu64
                  " but the stream ends at %" PRIu64 " (the server lost the stream's tail)",
                  stream, durable, mark, si->State.LastSeq);
    }
    jsStreamInfo_Destroy(si);
    bool made = false;
    if ((st = jsd_consumer_ensure(conn, stream, durable, &at, &made, err)) != JSD_OK)
        return st;
    if (made && tail_lost)
        jsd__durable_floor_reset(store, stream, durable, at.start_seq);
    if (made)
        JSD_WARN("consumer",
                 "%s/%s: durable \"%s\" was missing; re-created from the topology at stream "
                 "sequence %" PRIu64 ", %s",
                 stream, durable, durable, at.start_seq, why);
    if (created)
        *created = made;
    if (start_seq && made)
        *start_seq = at.start_seq;
    return JSD_OK;
}

/* DESIGN (a durable lost under a running consumer). A fetch that fails is
 * followed by a look at the durable: when the server no longer has it, the
 * consumer says so at once (an error in the log, durable_missing in the
 * stats for /readyz) and, with the provisioned settings (opts.restore),
 * re-creates it after its acknowledged floor as last recorded in the store
 * (consumer_position.c, DESIGN "where a lost durable resumes"): every
 * delivery at or below it was acknowledged; above it, what the inbox holds
 * is answered as a duplicate and the rest (a retry pending, another
 * consumer's uncommitted batch) is applied. Not after the inbox's
 * high-water mark: a delivery below it may never have been applied. The
 * subscription stays bound: a pull request names the durable, not its
 * incarnation. Without restore the error is repeated once a minute. */
#define MISSING_REPEAT_MS 60000

bool jsd__durable_lost(jsd_consumer *c)
{
    /* A broker that is away is an outage, not a lost durable. A fetch fails
     * as a connection drops, before nats.c reports it disconnected, and a
     * look then waits out its request timeout: it is short (1 s), so a
     * graceful stop keeps its bound (test_service's
     * consume_sigterm_broker_stopped: 5 s with the context's timeout). */
    if (!c->nc || natsConnection_Status(c->nc) != NATS_CONN_STATUS_CONNECTED ||
        atomic_load(&c->draining))
        return false;
    bool exists = true;
    jsd_error e;
    jsd_error_clear(&e);
    if (durable_exists(c->js, c->stream, c->durable, 1000, &exists, &e) != JSD_OK || exists) {
        if (exists && c->missing) {
            c->missing = false;
            STAT_SET(c, durable_missing, 0);
            JSD_INFO("consumer", "%s/%s: the durable exists again", c->stream, c->durable);
        }
        return false;
    }
    int64_t now = jsd__mono_ms();
    if (!c->missing) {
        c->missing = true;
        c->missing_since_ms = now;
        c->missing_said_ms = now;
        STAT_SET(c, durable_missing, 1);
        JSD_ERROR("consumer",
                  "%s/%s: durable \"%s\" does not exist on stream \"%s\" (deleted? %s); %s",
                  c->stream, c->durable, c->durable, c->stream, c->err.msg,
                  c->has_restore ? "re-creating it from the topology after its recorded "
                                   "ack floor"
                                 : "nothing is consumed and /readyz fails until it is restored "
                                   "(`jsdurable provision`, or consume --topology FILE)");
    } else if (!c->has_restore && now - c->missing_said_ms >= MISSING_REPEAT_MS) {
        c->missing_said_ms = now;
        JSD_ERROR("consumer",
                  "%s/%s: durable \"%s\" still does not exist on stream \"%s\" (for %" PRId64
                  " s); restore it with `jsdurable provision`",
                  c->stream, c->durable, c->durable, c->stream, (now - c->missing_since_ms) / 1000);
    }
    if (!c->has_restore)
        return true;
    bool made = false;
    uint64_t at = 0;
    jsd_status st = jsd_consumer_ensure_inbox(c->conn, c->store, c->stream, c->durable, &c->restore,
                                              &c->restore, &made, &at, &e);
    if (st == JSD_OK) {
        c->missing = false;
        pthread_mutex_lock(&c->mu);
        c->stats.durable_missing = 0;
        c->stats.durables_restored++;
        pthread_mutex_unlock(&c->mu);
        if (!made || at == 0)
            JSD_WARN("consumer", "%s/%s: durable \"%s\" exists again%s", c->stream, c->durable,
                     c->durable,
                     made ? " (created from the stream's start: its inbox is empty)" : "");
    } else if (now - c->missing_said_ms >= MISSING_REPEAT_MS || c->missing_since_ms == now) {
        c->missing_said_ms = now;
        JSD_ERROR("consumer", "%s/%s: re-creating the durable failed: %s", c->stream, c->durable,
                  e.msg);
    }
    return true;
}

/* The longest time a delivery can take to come back for the last time:
 * ack_wait x max_deliver plus the backoff steps between the deliveries. Also
 * what `jsdurable doctor` reports (src/doctor.c). */
int64_t jsd__durable_redelivery_horizon_ms(const jsConsumerConfig *cc)
{
    int64_t ack_wait = cc->AckWait / 1000000LL;
    int64_t md = cc->MaxDeliver;
    int64_t h = ack_wait * md;
    for (int64_t i = 0; i + 1 < md && cc->BackOffLen > 0; i++)
        h += cc->BackOff[JSD_MIN(i, (int64_t)cc->BackOffLen - 1)] / 1000000LL;
    return h;
}

/* The ack wait in force is the server's, not the one asked for: with a
 * backoff list JetStream waits backoff[0] for the first ACK and backoff[n]
 * after delivery n+1, so the shortest of them is what a handler gets. */
int64_t jsd__durable_effective_ack_wait_ms(const jsConsumerConfig *cc)
{
    int64_t w = cc->AckWait > 0 ? cc->AckWait / 1000000LL : 30000;
    for (int i = 0; i < cc->BackOffLen; i++)
        if (cc->BackOff[i] > 0)
            w = JSD_MIN(w, cc->BackOff[i] / 1000000LL);
    return JSD_MAX(1, w);
}

/* The dead-letter stream: it must exist, and not be the stream we read. */
static jsd_status check_dlq(jsd_conn *conn, const char *stream, const char *dlq_subject,
                            char *dlq_stream, size_t cap, jsd_error *err)
{
    jsd_status st = jsd__stream_for_subject(conn, dlq_subject, dlq_stream, cap, err);
    if (st == JSD_ERR_NOT_FOUND)
        return jsd__err(err, JSD_ERR_CONFIG,
                        "no stream captures the dead-letter subject \"%s\"; create a dead-letter "
                        "stream on its own subject root (e.g. \"jsd.dlq.>\")",
                        dlq_subject);
    if (st != JSD_OK)
        return st;
    if (strcmp(dlq_stream, stream) == 0)
        return jsd__err(err, JSD_ERR_CONFIG,
                        "dead-letter subject \"%s\" is captured by the consumed stream \"%s\" "
                        "itself; use a separate dead-letter stream",
                        dlq_subject, stream);
    return JSD_OK;
}

/* The options alone, before anything is asked of the server. */
jsd_status jsd__consumer_check_opts(const jsd_consumer_opts *o, jsd_error *err)
{
    if (!o->stream || !jsd__stream_name_valid(o->stream, err))
        return o->stream ? JSD_ERR_INVALID
                         : jsd__err(err, JSD_ERR_INVALID, "consumer create: stream is required");
    if (!o->durable || !jsd__stream_name_valid(o->durable, err))
        return o->durable ? JSD_ERR_INVALID
                          : jsd__err(err, JSD_ERR_INVALID, "consumer create: durable is required");
    if (o->batch < 0 || o->batch > 4096)
        return jsd__err(err, JSD_ERR_CONFIG, "batch %d outside 1..4096", o->batch);
    if (o->payload_format != JSD_PAYLOAD_RAW && o->payload_format != JSD_PAYLOAD_JSON)
        return jsd__err(err, JSD_ERR_CONFIG, "unknown payload format %d", (int)o->payload_format);
    if (o->n_accept_types > 256)
        return jsd__err(err, JSD_ERR_CONFIG, "at most 256 accepted types");
    for (size_t i = 0; i < o->n_accept_types; i++)
        if (!o->accept_types || !o->accept_types[i] || !*o->accept_types[i] ||
            strlen(o->accept_types[i]) > 256)
            return jsd__err(err, JSD_ERR_CONFIG, "accepted type %zu is empty or over 256 bytes", i);
    if (o->dlq_subject && !jsd__subject_valid_exact(o->dlq_subject, err)) {
        if (err)
            err->status = JSD_ERR_CONFIG;
        return JSD_ERR_CONFIG;
    }
    return JSD_OK;
}

void jsd__consumer_default_dlq_subject(const jsd_consumer_opts *o, char *out, size_t cap)
{
    if (o->dlq_subject)
        jsd__strlcpy(out, o->dlq_subject, cap);
    else
        jsd__snprintf(out, cap, "jsd.dlq.%s.%s", o->stream, o->durable);
}

jsd_status jsd_consumer_check(jsd_conn *conn, const jsd_consumer_opts *o, jsd_error *err)
{
    jsCtx *js = conn ? jsd__conn_js(conn) : NULL;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    char dlq[JSD_SUBJECT_MAX + 64], dlq_stream[JSD_STREAM_NAME_MAX + 1];

    if (!o)
        return jsd__err(err, JSD_ERR_INVALID, "consumer check: missing options");
    if (!js)
        return jsd__err(err, JSD_ERR_INVALID, "consumer check: connection without JetStream");
    jsd_status st = jsd__consumer_check_opts(o, err);
    if (st != JSD_OK)
        return st;
    natsStatus s = js_GetStreamInfo(&si, js, o->stream, NULL, &jerr);
    if (s != NATS_OK) {
        if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr)
            return jsd__err(err, JSD_ERR_NOT_FOUND, "stream \"%s\" does not exist", o->stream);
        return jsd__err_nats(err, s, jerr, "stream info");
    }
    jsStreamInfo_Destroy(si);
    jsd__consumer_default_dlq_subject(o, dlq, sizeof(dlq));
    if (!jsd__subject_valid_exact(dlq, err))
        return JSD_ERR_CONFIG;
    return check_dlq(conn, o->stream, dlq, dlq_stream, sizeof(dlq_stream), err);
}

jsd_status jsd__consumer_check_config(jsd_consumer *c, const jsd_consumer_opts *o)
{
    jsConsumerInfo *ci = NULL;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    jsd_status st = JSD_OK;

    natsStatus s = js_GetStreamInfo(&si, c->js, c->stream, NULL, &jerr);
    if (s != NATS_OK) {
        if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr)
            return jsd__cerr(c, JSD_ERR_NOT_FOUND, "stream \"%s\" does not exist", c->stream);
        return jsd__err_nats(&c->err, s, jerr, "stream info");
    }
    s = js_GetConsumerInfo(&ci, c->js, c->stream, c->durable, NULL, &jerr);
    if (s != NATS_OK) {
        jsStreamInfo_Destroy(si);
        if (s == NATS_NOT_FOUND || jerr == JSConsumerNotFoundErr)
            return jsd__cerr(c, JSD_ERR_NOT_FOUND,
                             "durable \"%s\" does not exist on stream \"%s\" (create it first, "
                             "e.g. with jsd_consumer_ensure or `jsdurable provision`)",
                             c->durable, c->stream);
        return jsd__err_nats(&c->err, s, jerr, "consumer info");
    }
    const jsConsumerConfig *cc = ci->Config;
    if (!cc || cc->AckPolicy != js_AckExplicit) {
        st = jsd__cerr(c, JSD_ERR_CONFIG, "durable \"%s\" must use explicit acks", c->durable);
        goto done;
    }
    if (cc->DeliverSubject && *cc->DeliverSubject) {
        st = jsd__cerr(c, JSD_ERR_CONFIG,
                       "durable \"%s\" is a push consumer; a pull consumer is needed", c->durable);
        goto done;
    }
    c->max_deliver = cc->MaxDeliver > 0 ? (int)cc->MaxDeliver : -1;
    /* Keep-alives follow the ack wait in force (the shortest backoff step). */
    c->ack_wait_ms = jsd__durable_effective_ack_wait_ms(cc);
    c->keepalive_ms = JSD_MAX(1, c->ack_wait_ms / 3);
    if (c->max_deliver == 1) {
        st = jsd__cerr(
            c, JSD_ERR_CONFIG,
            "durable \"%s\" has max_deliver 1: no delivery is left to retry a failed park "
            "(use >= 2)",
            c->durable);
        goto done;
    }
    if (o->max_deliver > 0) {
        if (c->max_deliver > 0 && o->max_deliver >= c->max_deliver) {
            st = jsd__cerr(c, JSD_ERR_CONFIG,
                           "park threshold %d must be below the durable's max_deliver %d (one "
                           "spare delivery retries a failed park)",
                           o->max_deliver, c->max_deliver);
            goto done;
        }
        c->park_at = o->max_deliver;
    } else {
        c->park_at = c->max_deliver > 0 ? c->max_deliver - 1 : 0; /* 0: never park */
    }
    if (c->batch == 0) {
        /* Half the durable's in-flight window (at most 512): the batch in
         * hand and the one the fetcher pulls ahead both fit in it. */
        int64_t half = cc->MaxAckPending > 0 ? cc->MaxAckPending / 2 : 256;
        c->batch = (int)JSD_MAX(1, JSD_MIN(512, half));
    }
    if (cc->MaxAckPending > 0 && c->batch > cc->MaxAckPending)
        c->batch = (int)cc->MaxAckPending;

    /* The retention guard (IN-2, DESIGN "deduplication windows are finite"). */
    if (o->inbox_retention_ms > 0) {
        int64_t dupw = si->Config ? si->Config->Duplicates / 1000000LL : 0;
        if (c->max_deliver < 0) {
            st =
                jsd__cerr(c, JSD_ERR_CONFIG,
                          "durable \"%s\" redelivers without limit, so no inbox retention (%" PRId64
                          " ms) is long enough; bound max_deliver or keep inbox rows (retention 0)",
                          c->durable, o->inbox_retention_ms);
            goto done;
        }
        int64_t h = jsd__durable_redelivery_horizon_ms(cc);
        if (o->inbox_retention_ms < h) {
            st = jsd__cerr(c, JSD_ERR_CONFIG,
                           "inbox retention %" PRId64
                           " ms is shorter than the redelivery horizon %" PRId64
                           " ms of durable \"%s\" (ack_wait x max_deliver + backoff); raise it",
                           o->inbox_retention_ms, h, c->durable);
            goto done;
        }
        if (o->inbox_retention_ms < dupw) {
            st = jsd__cerr(c, JSD_ERR_CONFIG,
                           "inbox retention %" PRId64
                           " ms is shorter than stream \"%s\"'s duplicate "
                           "window %" PRId64 " ms; raise it",
                           o->inbox_retention_ms, c->stream, dupw);
            goto done;
        }
    }

    st = check_dlq(c->conn, c->stream, c->dlq_subject, c->dlq_stream, sizeof(c->dlq_stream),
                   &c->err);
done:
    jsConsumerInfo_Destroy(ci);
    jsStreamInfo_Destroy(si);
    return st;
}
