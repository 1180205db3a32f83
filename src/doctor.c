/*
 * doctor — the deployment checks of include/jsdurable/doctor.h: the choice
 * of what to check (named streams and durables, a topology, the
 * streams of the outbox's pending subjects) and the JetStream checks of each
 * stream, durable and dead-letter stream. The server's fsync policy is
 * judged in doctor_server.c, the store in store/doctor.c; the report and the
 * override lists are doctor_report.c's.
 *
 * The figures are never computed twice: the relay's retry horizon is
 * jsd__relay_retry_horizon_ms (relay_claim.c), a durable's effective ack wait
 * and redelivery horizon are consumer_durable.c's, so the doctor reports
 * exactly what the relay and the consumer enforce.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>

#include "atomic.h"
#include "conn_int.h"
#include "consumer_int.h"
#include "doctor_int.h"
#include "relay_int.h"
#include "streams.h"
#include "subject.h"

#define DOC_OUTBOX_SUBJECTS_MAX 64
#define DOC_STREAMS_MAX         256

/* ---- the set of things to check ---------------------------------------------------- */

typedef struct doc_run {
    jsd_doctor_report *rep;
    jsd_store *store;
    jsd_conn *conn;
    jsCtx *js;
    const jsd_doctor_opts *o;
    jsd_relay_opts relay;
    const char *streams[DOC_STREAMS_MAX]; /* hot streams, deduplicated (borrowed or owned) */
    bool owned[DOC_STREAMS_MAX];
    size_t n_streams;
    jsd__doctor_fsync fsync;    /* what the server's /varz said (server.fsync) */
    bool atomic_probed;         /* the atomic batch probe ran (once per run) */
    jsd__atomic_support atomic; /* and what it found */
    char atomic_why[JSD_ERRMSG_MAX];
} doc_run;

static void add(doc_run *d, const char *check, jsd_doctor_kind kind, const char *subject,
                jsd_doctor_level level, const char *fix, const char *fmt, ...) JSD_PRINTF(7, 8);
static void add(doc_run *d, const char *check, jsd_doctor_kind kind, const char *subject,
                jsd_doctor_level level, const char *fix, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    jsd__doctor_add(d->rep, check, kind, subject, level, msg, fix);
}

static void want_stream(doc_run *d, const char *name, bool copy)
{
    for (size_t i = 0; i < d->n_streams; i++)
        if (!strcmp(d->streams[i], name))
            return;
    if (d->n_streams == DOC_STREAMS_MAX)
        return;
    const char *s = copy ? jsd__strdup(name) : name;
    if (!s) {
        d->rep->nomem = true;
        return;
    }
    d->owned[d->n_streams] = copy;
    d->streams[d->n_streams++] = s;
}

/* The streams that capture the store's pending subjects. */
static void want_outbox_streams(doc_run *d)
{
    char **subjects = NULL;
    size_t n = 0;
    jsd_error err;
    jsd_error_clear(&err);
    jsd_status s =
        jsd__doctor_outbox_subjects(d->store, DOC_OUTBOX_SUBJECTS_MAX, &subjects, &n, &err);
    if (s != JSD_OK) {
        add(d, "stream.exists", JSD_DOCTOR_STREAM, jsd_store_url(d->store), JSD_DOCTOR_UNKNOWN,
            "check the store is reachable and run the doctor again",
            "the pending effects' subjects could not be read: %s", err.msg);
        return;
    }
    bool gave_up = false;
    for (size_t i = 0; i < n; i++) {
        char name[JSD_STREAM_NAME_MAX + 1];
        jsd_error_clear(&err);
        s = gave_up ? JSD_ERR_TIMEOUT
                    : jsd__stream_for_subject(d->conn, subjects[i], name, sizeof(name), &err);
        if (s == JSD_OK) {
            want_stream(d, name, true);
        } else if (s == JSD_ERR_NOT_FOUND) {
            char fix[400];
            jsd__snprintf(fix, sizeof(fix),
                          "create a stream capturing \"%s\" (`jsdurable provision`) or correct "
                          "the effects' subject",
                          subjects[i]);
            add(d, "stream.exists", JSD_DOCTOR_STREAM, subjects[i], JSD_DOCTOR_WARN, fix,
                "no stream captures subject \"%s\" of pending effects: the relay counts each "
                "attempt as failed and dead-letters them when the budget is spent",
                subjects[i]);
        } else if (!gave_up) {
            /* NATS did not answer: one result, and no request per remaining
             * subject (each would wait the whole request timeout). */
            gave_up = true;
            add(d, "stream.exists", JSD_DOCTOR_STREAM, subjects[i], JSD_DOCTOR_UNKNOWN,
                "check that NATS and JetStream answer",
                "the stream for \"%s\" could not be looked up: %s; the streams of the "
                "pending effects were not checked",
                subjects[i], err.msg);
        }
        jsd__free(subjects[i]);
    }
    jsd__free(subjects);
}

/* ---- stream checks ----------------------------------------------------------------- */

static bool has_count_limits(const jsStreamConfig *c)
{
    return c->MaxMsgs > 0 || c->MaxBytes > 0 || c->MaxMsgsPerSubject > 0;
}

/* Storage and replicas, for a hot stream (prefix "stream") or the
 * dead-letter stream (prefix "dlq"). */
static void check_storage(doc_run *d, const char *prefix, const jsStreamConfig *c)
{
    char check[40];
    jsd__snprintf(check, sizeof(check), "%s.storage", prefix);
    if (c->Storage == js_MemoryStorage)
        add(d, check, JSD_DOCTOR_STREAM, c->Name, JSD_DOCTOR_ERROR,
            "recreate the stream with file storage (storage cannot be changed in place: "
            "create a file stream, move the traffic, delete the old one)",
            "stream \"%s\" uses memory storage: a server restart loses every message it "
            "acknowledged, receipts and all",
            c->Name);
    else
        add(d, check, JSD_DOCTOR_STREAM, c->Name, JSD_DOCTOR_OK, "",
            "stream \"%s\" uses file storage", c->Name);
    jsd__snprintf(check, sizeof(check), "%s.replicas", prefix);
    if (c->Replicas <= 1)
        add(d, check, JSD_DOCTOR_STREAM, c->Name, JSD_DOCTOR_WARN,
            "run a 3-node cluster and set replicas 3 (`jsdurable provision` with \"replicas\": 3)",
            "stream \"%s\" has one replica: the loss of one server's disk loses acknowledged "
            "messages (a receipt then names a message that is gone)",
            c->Name);
    else
        add(d, check, JSD_DOCTOR_STREAM, c->Name, JSD_DOCTOR_OK, "",
            "stream \"%s\" has %lld replicas", c->Name, (long long)c->Replicas);
}

static void check_discard(doc_run *d, const jsStreamConfig *c)
{
    if (!has_count_limits(c)) {
        add(d, "stream.discard", JSD_DOCTOR_STREAM, c->Name, JSD_DOCTOR_OK, "",
            "stream \"%s\" has no message, byte or per-subject limit: nothing is discarded "
            "before max_age",
            c->Name);
    } else if (c->Discard == js_DiscardNew) {
        add(d, "stream.discard", JSD_DOCTOR_STREAM, c->Name, JSD_DOCTOR_OK, "",
            "stream \"%s\" discards new messages at its limits: a full stream refuses the "
            "relay's publications, which are retried with backoff and dead-lettered when the "
            "attempt budget is spent (none is lost; watch jsd_outbox_backlog)",
            c->Name);
    } else {
        add(d, "stream.discard", JSD_DOCTOR_STREAM, c->Name, JSD_DOCTOR_WARN,
            "raise the limits above the largest backlog a consumer can build, or use "
            "\"discard\": \"new\" so a full stream refuses publications (the relay retries them)",
            "stream \"%s\" discards old messages at its limits (max_msgs %lld, max_bytes %lld, "
            "max_msgs_per_subject %lld): when one is reached the oldest messages are removed "
            "whether or not consumers have read them, though the relay holds receipts for them",
            c->Name, (long long)c->MaxMsgs, (long long)c->MaxBytes,
            (long long)c->MaxMsgsPerSubject);
    }
}

static void check_window(doc_run *d, const jsStreamConfig *c)
{
    int64_t window = c->Duplicates / 1000000LL;
    int64_t horizon = jsd__relay_retry_horizon_ms(&d->relay);
    const jsd_relay_opts *r = &d->relay;
    if (window <= 0) {
        add(d, "stream.duplicate_window", JSD_DOCTOR_STREAM, c->Name, JSD_DOCTOR_UNKNOWN,
            "set a duplicate window on the stream", "stream \"%s\" reports no duplicate window",
            c->Name);
    } else if (horizon >= window) {
        char fix[400];
        jsd__snprintf(fix, sizeof(fix),
                      "raise the stream's duplicate_window above %lld ms (e.g. 2x), or lower "
                      "the relay's --deadline-ms, --backoff-ms cap, --lease-ms or --poll-ms",
                      (long long)horizon);
        add(d, "stream.duplicate_window", JSD_DOCTOR_STREAM, c->Name, JSD_DOCTOR_ERROR, fix,
            "stream \"%s\" keeps message ids for %lld ms (its duplicate window), but the relay "
            "may retry an effect up to %lld ms after it was stored (publish deadline %d + backoff "
            "cap %d + lease %d + "
            "poll %d ms): such a retry would be stored twice",
            c->Name, (long long)window, (long long)horizon, r->publish_deadline_ms,
            r->backoff_cap_ms, r->lease_ms, r->poll_interval_ms);
    } else {
        add(d, "stream.duplicate_window", JSD_DOCTOR_STREAM, c->Name, JSD_DOCTOR_OK, "",
            "stream \"%s\" keeps message ids for %lld ms, longer than the relay's retry "
            "horizon of %lld ms",
            c->Name, (long long)window, (long long)horizon);
    }
}

static void check_msg_size(doc_run *d, const jsStreamConfig *c)
{
    size_t payload = d->store ? jsd__doctor_store_payload_max(d->store) : JSD_PAYLOAD_DEFAULT_CAP;
    int64_t need = (int64_t)payload + JSD_HEADERS_MAX_BYTES;
    natsConnection *nc = jsd__conn_nats(d->conn);
    int64_t server_max = nc ? natsConnection_GetMaxPayload(nc) : 0;
    char fix[400];
    if (c->MaxMsgSize > 0 && c->MaxMsgSize < need) {
        jsd__snprintf(fix, sizeof(fix),
                      "raise the stream's max_msg_size to at least %lld (or -1), or open the "
                      "store with a payload_max of at most %lld",
                      (long long)need, (long long)c->MaxMsgSize - JSD_HEADERS_MAX_BYTES);
        add(d, "stream.max_msg_size", JSD_DOCTOR_STREAM, c->Name, JSD_DOCTOR_ERROR, fix,
            "stream \"%s\" takes messages up to %lld bytes, but the store accepts payloads of "
            "%zu bytes plus up to %d bytes of headers: such effects are committed and then "
            "can never be published",
            c->Name, (long long)c->MaxMsgSize, payload, JSD_HEADERS_MAX_BYTES);
    } else if (server_max > 0 && server_max < need) {
        jsd__snprintf(fix, sizeof(fix),
                      "raise the server's max_payload to at least %lld, or lower the store's "
                      "payload_max",
                      (long long)need);
        add(d, "stream.max_msg_size", JSD_DOCTOR_STREAM, c->Name, JSD_DOCTOR_ERROR, fix,
            "the server's max_payload is %lld bytes, under the store's payload limit %zu plus "
            "%d bytes of headers: larger effects can never be published",
            (long long)server_max, payload, JSD_HEADERS_MAX_BYTES);
    } else {
        add(d, "stream.max_msg_size", JSD_DOCTOR_STREAM, c->Name, JSD_DOCTOR_OK, "",
            "stream \"%s\" takes the largest effect the store accepts (%zu bytes + %d of "
            "headers)",
            c->Name, payload, JSD_HEADERS_MAX_BYTES);
    }
}

/* Stream info of name into *si; false (with a result added) when it cannot be read. */
static bool stream_info(doc_run *d, const char *check, const char *name, jsStreamInfo **si)
{
    jsErrCode jerr = 0;
    *si = NULL;
    if (!d->js) {
        add(d, check, JSD_DOCTOR_STREAM, name, JSD_DOCTOR_UNKNOWN, "give --nats URL",
            "stream \"%s\" was not checked: no NATS connection", name);
        return false;
    }
    natsStatus s = js_GetStreamInfo(si, d->js, name, NULL, &jerr);
    if (s == NATS_OK && *si && (*si)->Config)
        return true;
    jsStreamInfo_Destroy(*si);
    *si = NULL;
    if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr) {
        add(d, check, JSD_DOCTOR_STREAM, name, JSD_DOCTOR_ERROR,
            "create it (`jsdurable provision --topology FILE`)", "stream \"%s\" does not exist",
            name);
    } else {
        jsd_error err;
        jsd_error_clear(&err);
        jsd__err_nats(&err, s, jerr, "stream info");
        add(d, check, JSD_DOCTOR_STREAM, name, JSD_DOCTOR_UNKNOWN,
            "check that NATS and JetStream answer", "stream \"%s\" could not be read: %s", name,
            err.msg);
    }
    return false;
}

/* persist_mode (nats-server 2.12+): "async" acknowledges a message before
 * it is stored. raw: the stream's configuration as the server sent it. */
static void check_persist_mode(doc_run *d, const char *name, const json_t *raw)
{
    const char *pm = json_string_value(json_object_get(raw, "persist_mode"));
    if (pm && !strcmp(pm, "async"))
        add(d, "stream.persist_mode", JSD_DOCTOR_STREAM, name, JSD_DOCTOR_ERROR,
            "recreate the stream with the default persist mode (it cannot be changed in place: "
            "create a new stream, move the traffic, delete the old one)",
            "stream \"%s\" has persist_mode \"async\": the server acknowledges a message before "
            "it is stored, so a receipt or an ACK can name a message a crash loses",
            name);
    else
        add(d, "stream.persist_mode", JSD_DOCTOR_STREAM, name, JSD_DOCTOR_OK, "",
            "stream \"%s\" stores each message before it acknowledges it", name);
}

/* allow_atomic: without it the relay waits for one PubAck, and on a server
 * with `sync_interval: always` one fsync, per message. Warned only when this
 * server's atomic batches take message ids, which the probe finds out. */
static void check_atomic(doc_run *d, const char *name, const json_t *raw)
{
    if (json_is_true(json_object_get(raw, "allow_atomic"))) {
        add(d, "stream.allow_atomic", JSD_DOCTOR_STREAM, name, JSD_DOCTOR_OK, "",
            "stream \"%s\" allows atomic batch publication", name);
        return;
    }
    if (!(d->o->checks & JSD_DOCTOR_CHECK_PROBES))
        return; /* whether the server could do better is the probe's to say */
    if (!d->atomic_probed) {
        d->atomic = jsd__atomic_probe(d->conn, d->atomic_why, sizeof(d->atomic_why));
        d->atomic_probed = true;
    }
    const char *v = jsd_conn_server_version(d->conn);
    switch (d->atomic) {
    case JSD__ATOMIC_WITH_IDS:
        add(d, "stream.allow_atomic", JSD_DOCTOR_STREAM, name, JSD_DOCTOR_WARN,
            "set \"allow_atomic\": true on the stream in the topology file and run `jsdurable "
            "provision --policy reconcile` (it can be changed in place)",
            "stream \"%s\" does not allow atomic batches, though nats-server %s stores them "
            "with message ids: every publication waits for its own acknowledgement (on a "
            "server with sync_interval: always, its own fsync; with the lazy default, one by "
            "one is the faster way and this warning can be ignored)",
            name, v ? v : "");
        break;
    case JSD__ATOMIC_NO_IDS:
        add(d, "stream.allow_atomic", JSD_DOCTOR_STREAM, name, JSD_DOCTOR_OK, "",
            "stream \"%s\" does not allow atomic batches, and nats-server %s could not use them "
            "for the relay: %s",
            name, v ? v : "", d->atomic_why);
        break;
    case JSD__ATOMIC_NONE:
        add(d, "stream.allow_atomic", JSD_DOCTOR_STREAM, name, JSD_DOCTOR_OK, "",
            "nats-server %s has no atomic batch publish (2.12 and later have it): %s", v ? v : "",
            d->atomic_why);
        break;
    case JSD__ATOMIC_UNKNOWN:
        add(d, "stream.allow_atomic", JSD_DOCTOR_STREAM, name, JSD_DOCTOR_UNKNOWN,
            "allow this user to create and delete streams named JSD_PROBE_*, or set "
            "\"allow_atomic\": true where the server has it",
            "stream \"%s\" does not allow atomic batches, and whether nats-server %s could "
            "store them with message ids is unknown: %s",
            name, v ? v : "", d->atomic_why);
        break;
    }
}

/* Replicas do not stand in for fsync: Jepsen's analysis of NATS 2.12.1
 * lost acknowledged writes of R3 streams on nodes with the default lazy
 * fsync when the nodes failed together (a power failure). */
static void check_replicas_fsync(doc_run *d, const jsStreamConfig *c)
{
    if (c->Replicas <= 1 || c->Storage == js_MemoryStorage)
        return; /* R1 and memory: stream.replicas and stream.storage say it */
    if (d->fsync == JSD__FSYNC_LAZY)
        add(d, "stream.replicas_fsync", JSD_DOCTOR_STREAM, c->Name, JSD_DOCTOR_WARN,
            "set jetstream { sync_interval: always } on every node of the cluster",
            "stream \"%s\" has %lld replicas on servers that sync to disk lazily: replication "
            "does not stand in for fsync (Jepsen's analysis of NATS 2.12.1 lost acknowledged "
            "writes of R3 streams when the nodes failed together, as in a power failure)",
            c->Name, (long long)c->Replicas);
    else if (d->fsync == JSD__FSYNC_ALWAYS)
        add(d, "stream.replicas_fsync", JSD_DOCTOR_STREAM, c->Name, JSD_DOCTOR_OK, "",
            "stream \"%s\" has %lld replicas on a server that syncs every write "
            "(sync_interval: always; every node should)",
            c->Name, (long long)c->Replicas);
}

static void check_stream(doc_run *d, const char *name)
{
    jsStreamInfo *si = NULL;
    if (!stream_info(d, "stream.exists", name, &si))
        return;
    const jsStreamConfig *c = si->Config;
    /* the fields nats.c 3.4.1 does not read: from the server's own JSON */
    json_t *raw = NULL;
    jsd_error err;
    jsd_error_clear(&err);
    if (jsd__stream_config_json(d->conn, name, &raw, &err) != JSD_OK)
        add(d, "stream.exists", JSD_DOCTOR_STREAM, name, JSD_DOCTOR_UNKNOWN,
            "check that NATS and JetStream answer", "stream \"%s\" could not be read: %s", name,
            err.msg);
    if (d->o->checks & JSD_DOCTOR_CHECK_STREAMS) {
        check_storage(d, "stream", c);
        check_discard(d, c);
        check_replicas_fsync(d, c);
        if (raw)
            check_persist_mode(d, name, raw);
    }
    if (d->o->checks & JSD_DOCTOR_CHECK_RELAY) {
        check_window(d, c);
        check_msg_size(d, c);
        if (raw)
            check_atomic(d, name, raw);
    }
    json_decref(raw);
    jsStreamInfo_Destroy(si);
}

/* ---- durable checks ---------------------------------------------------------------- */

static void check_retention(doc_run *d, const char *who, const jsConsumerConfig *cc, int64_t dupw)
{
    int64_t ret = d->o->inbox_retention_ms;
    if (ret <= 0) {
        add(d, "durable.inbox_retention", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_OK, "",
            "inbox rows are kept for ever (retention 0): every redelivery finds its row");
        return;
    }
    if (cc->MaxDeliver <= 0) {
        add(d, "durable.inbox_retention", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_ERROR,
            "bound the durable's max_deliver, or keep inbox rows (--inbox-retention 0)",
            "durable \"%s\" redelivers without limit, so no inbox retention (%lld ms) is long "
            "enough: a delivery redelivered after its inbox row was removed applies twice",
            who, (long long)ret);
        return;
    }
    int64_t h = jsd__durable_redelivery_horizon_ms(cc);
    int64_t need = JSD_MAX(h, dupw);
    if (ret < need) {
        char fix[300];
        jsd__snprintf(fix, sizeof(fix),
                      "raise the inbox retention (--inbox-retention) to at "
                      "least %lld ms",
                      (long long)need);
        add(d, "durable.inbox_retention", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_ERROR, fix,
            "inbox retention %lld ms is shorter than %s %lld ms: a delivery that comes back "
            "after its inbox row was removed applies twice",
            (long long)ret,
            ret < h ? "the redelivery horizon (ack_wait x max_deliver + backoff)"
                    : "the stream's duplicate window",
            (long long)(ret < h ? h : dupw));
        return;
    }
    add(d, "durable.inbox_retention", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_OK, "",
        "inbox retention %lld ms covers the redelivery horizon %lld ms and the duplicate "
        "window %lld ms while a consumer pulls; when none runs longer than that, a delivery "
        "committed but not acknowledged is safe only because jsdurable gc (with --nats) keeps "
        "inbox rows above the durable's ack floor, and rows of a deleted durable until gc "
        "--durable drops them (jsd_store_gc, by age alone, does not)",
        (long long)ret, (long long)h, (long long)dupw);
}

/* The durable against its stream and its inbox (consumer_position.c): ahead
 * of its stream (the server lost the stream's tail), and a store restored
 * from an older backup (the inbox's high-water mark below the ack floor). */
static void check_position(doc_run *d, const jsd_doctor_durable *du, const char *who)
{
    jsd_durable_position p;
    jsd_error err;
    jsd_error_clear(&err);
    if (jsd_durable_position_get(d->conn, d->store, du->stream, du->durable, &p, &err) != JSD_OK) {
        add(d, "durable.ahead_of_stream", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_UNKNOWN,
            "check that NATS and JetStream answer",
            "the position of durable \"%s\" could not be read: %s", who, err.msg);
        return;
    }
    if (p.ahead)
        add(d, "durable.ahead_of_stream", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_ERROR,
            "run `jsdurable consume` with --topology FILE: it re-creates the durable at the "
            "first sequence that may be new",
            "durable \"%s\" is ahead of its stream: ack floor %" PRIu64 ", delivered %" PRIu64
            ", but the stream ends at %" PRIu64 " (the server lost the stream's tail); what is "
            "published at the sequences handed out again is never delivered",
            who, p.ack_floor, p.delivered, p.stream_last);
    else
        add(d, "durable.ahead_of_stream", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_OK, "",
            "durable \"%s\" is at or behind its stream's last sequence %" PRIu64
            " (ack floor %" PRIu64 ")",
            who, p.stream_last, p.ack_floor);
    if (!d->store) {
        add(d, "consumer.inbox_behind", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_UNKNOWN,
            "give --store URL", "the inbox of durable \"%s\" was not compared: no store", who);
    } else if (p.behind_from) {
        add(d, "consumer.inbox_behind", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_ERROR,
            "run `jsdurable consume --redeliver-from-inbox` once: it re-creates the durable "
            "after the inbox's high-water mark, so the lost applications are made again and "
            "what the inbox holds is answered as duplicates",
            "the inbox of durable \"%s\" holds deliveries up to stream sequence %" PRIu64
            " but the durable acknowledged up to %" PRIu64 " and the stream still holds "
            "sequence %" PRIu64 " in between: the store lost applications (restored from an "
            "older backup?)",
            who, p.inbox_high, p.ack_floor, p.behind_from);
    } else if (!p.ahead) {
        add(d, "consumer.inbox_behind", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_OK, "",
            "the inbox of durable \"%s\" holds what the durable acknowledged", who);
    }
}

static void check_durable(doc_run *d, const jsd_doctor_durable *du)
{
    char who[2 * JSD_STREAM_NAME_MAX + 2];
    jsd__snprintf(who, sizeof(who), "%s/%s", du->stream, du->durable);
    if (!d->js) {
        add(d, "durable.exists", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_UNKNOWN, "give --nats URL",
            "durable \"%s\" was not checked: no NATS connection", who);
        return;
    }
    jsConsumerInfo *ci = NULL;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetConsumerInfo(&ci, d->js, du->stream, du->durable, NULL, &jerr);
    if (s != NATS_OK || !ci || !ci->Config) {
        if (s == NATS_NOT_FOUND || jerr == JSConsumerNotFoundErr || jerr == JSStreamNotFoundErr)
            add(d, "durable.exists", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_ERROR,
                "create it (`jsdurable provision`, or `jsdurable consume` creates a missing one)",
                "durable \"%s\" does not exist", who);
        else {
            jsd_error err;
            jsd_error_clear(&err);
            jsd__err_nats(&err, s, jerr, "consumer info");
            add(d, "durable.exists", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_UNKNOWN,
                "check that NATS and JetStream answer", "durable \"%s\" could not be read: %s", who,
                err.msg);
        }
        jsConsumerInfo_Destroy(ci);
        return;
    }
    const jsConsumerConfig *cc = ci->Config;
    if (cc->AckPolicy != js_AckExplicit)
        add(d, "durable.ack_policy", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_ERROR,
            "recreate the durable with ack_policy explicit (it cannot be changed in place)",
            "durable \"%s\" does not use explicit acks: the server counts a delivery as done "
            "before the inbox commit, so a crash loses it",
            who);
    else if (cc->DeliverSubject && *cc->DeliverSubject)
        add(d, "durable.ack_policy", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_ERROR,
            "recreate it as a pull consumer (no deliver_subject)",
            "durable \"%s\" is a push consumer; the consumer needs a pull consumer", who);
    else
        add(d, "durable.ack_policy", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_OK, "",
            "durable \"%s\" is a pull consumer with explicit acks", who);

    int64_t eff = jsd__durable_effective_ack_wait_ms(cc);
    if (cc->BackOffLen > 0 && (du->ack_wait_ms <= 0 || eff < du->ack_wait_ms)) {
        char fix[300], asked[96] = "";
        if (du->ack_wait_ms > 0)
            jsd__snprintf(asked, sizeof(asked), " (ack_wait %lld ms was asked for)",
                          (long long)du->ack_wait_ms);
        jsd__snprintf(fix, sizeof(fix),
                      "start the backoff at the ack wait a handler needs (backoff[0] >= %lld ms) "
                      "or drop the backoff; or keep every handler under %lld ms",
                      (long long)JSD_MAX(du->ack_wait_ms, eff), (long long)eff);
        add(d, "durable.ack_wait", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_WARN, fix,
            "durable \"%s\" has a backoff, so JetStream replaces its ack wait with the first "
            "step: the ack wait in force is %lld ms%s, and a handler slower than that is "
            "redelivered while it still runs (the inbox catches the duplicate; a delivery is "
            "spent)",
            who, (long long)eff, asked);
    } else {
        add(d, "durable.ack_wait", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_OK, "",
            "durable \"%s\" waits %lld ms for an ACK", who, (long long)eff);
    }

    if (cc->MaxDeliver == 1)
        add(d, "durable.max_deliver", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_ERROR,
            "set max_deliver >= 2 (the consumer parks at max_deliver - 1)",
            "durable \"%s\" has max_deliver 1: no delivery is left to retry a failed park, and "
            "the consumer refuses it",
            who);
    else if (cc->MaxDeliver <= 0)
        add(d, "durable.max_deliver", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_WARN,
            "bound max_deliver (e.g. 6) so poison messages are parked in the dead-letter stream",
            "durable \"%s\" redelivers without limit: a message that always fails is never "
            "parked and holds a slot of max_ack_pending for ever",
            who);
    else
        add(d, "durable.max_deliver", JSD_DOCTOR_DURABLE, who, JSD_DOCTOR_OK, "",
            "durable \"%s\" delivers at most %lld times (parked after %lld)", who,
            (long long)cc->MaxDeliver, (long long)cc->MaxDeliver - 1);

    int64_t dupw = 0;
    if (js_GetStreamInfo(&si, d->js, du->stream, NULL, &jerr) == NATS_OK && si && si->Config)
        dupw = si->Config->Duplicates / 1000000LL;
    jsStreamInfo_Destroy(si);
    check_retention(d, who, cc, dupw);
    jsConsumerInfo_Destroy(ci);
    check_position(d, du, who);
}

/* ---- the dead-letter stream ---------------------------------------------------------- */

/* Subjects of the hot stream and the dead-letter stream on nested roots. */
static void check_dlq_roots(doc_run *d, const jsStreamConfig *dlq, const char *hot_name)
{
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    if (js_GetStreamInfo(&si, d->js, hot_name, NULL, &jerr) != NATS_OK || !si || !si->Config) {
        jsStreamInfo_Destroy(si);
        return; /* the hot stream's own check reports it */
    }
    const jsStreamConfig *hot = si->Config;
    for (int i = 0; i < dlq->SubjectsLen; i++)
        for (int j = 0; j < hot->SubjectsLen; j++) {
            const char *a = dlq->Subjects[i], *b = hot->Subjects[j];
            if (!jsd__subject_roots_nested(a, jsd__subject_root_len(a), b,
                                           jsd__subject_root_len(b)))
                continue;
            char fix[400];
            jsd__snprintf(fix, sizeof(fix),
                          "give the dead-letter stream a root of its own (e.g. \"jsd.dlq.>\")");
            add(d, "dlq.subjects", JSD_DOCTOR_STREAM, dlq->Name, JSD_DOCTOR_WARN, fix,
                "dead-letter stream \"%s\" subject \"%s\" shares its root with \"%s\" of hot "
                "stream \"%s\": widening the hot stream's subjects would capture (or be refused "
                "over) the dead letters",
                dlq->Name, a, b, hot_name);
            jsStreamInfo_Destroy(si);
            return;
        }
    add(d, "dlq.subjects", JSD_DOCTOR_STREAM, dlq->Name, JSD_DOCTOR_OK, "",
        "dead-letter stream \"%s\" is on a subject root apart from stream \"%s\"", dlq->Name,
        hot_name);
    jsStreamInfo_Destroy(si);
}

static void check_dlq_limits(doc_run *d, const jsStreamConfig *c)
{
    if (c->Retention != js_LimitsPolicy) {
        add(d, "dlq.limits", JSD_DOCTOR_STREAM, c->Name, JSD_DOCTOR_WARN,
            "use retention \"limits\" for the dead-letter stream",
            "dead-letter stream \"%s\" uses %s retention: dead letters disappear once read or "
            "without interest, and the evidence with them",
            c->Name, c->Retention == js_WorkQueuePolicy ? "work-queue" : "interest");
    } else if ((has_count_limits(c) || c->MaxAge > 0) && c->Discard == js_DiscardOld) {
        add(d, "dlq.limits", JSD_DOCTOR_STREAM, c->Name, JSD_DOCTOR_WARN,
            "lift the limits (max_msgs/max_bytes/max_age -1) or use \"discard\": \"new\" (a full "
            "dead-letter stream then refuses, and the consumer keeps the poison records in the "
            "store and republishes them)",
            "dead-letter stream \"%s\" discards old messages at its limits (max_msgs %lld, "
            "max_bytes %lld, max_age %lld ms): a burst of poison from the hot path evicts "
            "earlier dead letters",
            c->Name, (long long)c->MaxMsgs, (long long)c->MaxBytes,
            (long long)(c->MaxAge / 1000000LL));
    } else if (has_count_limits(c) || c->MaxAge > 0) {
        add(d, "dlq.limits", JSD_DOCTOR_STREAM, c->Name, JSD_DOCTOR_OK, "",
            "dead-letter stream \"%s\" refuses new messages when full: the consumer keeps the "
            "poison records in the store and republishes them (`jsdurable status` counts them)",
            c->Name);
    } else {
        add(d, "dlq.limits", JSD_DOCTOR_STREAM, c->Name, JSD_DOCTOR_OK, "",
            "dead-letter stream \"%s\" has no limits: nothing evicts dead letters", c->Name);
    }
}

static bool seen(const char **list, size_t *n, size_t cap, const char *name)
{
    for (size_t i = 0; i < *n; i++)
        if (!strcmp(list[i], name))
            return true;
    if (*n < cap)
        list[(*n)++] = name;
    return false;
}

/* One dead-letter stream, by name (storage, replicas, limits; roots against
 * hot, NULL: every hot stream of the run). */
static void check_dlq_stream(doc_run *d, const char *name, const char *hot)
{
    jsStreamInfo *si = NULL;
    if (!stream_info(d, "dlq.stream", name, &si))
        return;
    const jsStreamConfig *c = si->Config;
    check_storage(d, "dlq", c);
    check_dlq_limits(d, c);
    if (hot)
        check_dlq_roots(d, c, hot);
    else
        for (size_t i = 0; i < d->n_streams; i++)
            if (strcmp(d->streams[i], name) != 0)
                check_dlq_roots(d, c, d->streams[i]);
    jsStreamInfo_Destroy(si);
}

/* The dead-letter stream of one durable. dlq_name (cap bytes) receives it. */
static bool dlq_of(doc_run *d, const jsd_doctor_durable *du, char *dlq_name, size_t cap)
{
    char subject[JSD_SUBJECT_MAX + 64], who[2 * JSD_STREAM_NAME_MAX + 2];
    jsd__snprintf(who, sizeof(who), "%s/%s", du->stream, du->durable);
    if (du->dlq_subject)
        jsd__strlcpy(subject, du->dlq_subject, sizeof(subject));
    else
        jsd__snprintf(subject, sizeof(subject), "jsd.dlq.%s.%s", du->stream, du->durable);
    jsd_error err;
    jsd_error_clear(&err);
    jsd_status s = jsd__stream_for_subject(d->conn, subject, dlq_name, cap, &err);
    if (s == JSD_ERR_NOT_FOUND) {
        add(d, "dlq.stream", JSD_DOCTOR_STREAM, who, JSD_DOCTOR_ERROR,
            "create a dead-letter stream on its own subject root, e.g. \"jsd.dlq.>\" (the "
            "topology file's \"dead_letter\")",
            "no stream captures the dead-letter subject \"%s\" of durable \"%s\": the consumer "
            "refuses to start",
            subject, who);
        return false;
    }
    if (s != JSD_OK) {
        add(d, "dlq.stream", JSD_DOCTOR_STREAM, who, JSD_DOCTOR_UNKNOWN,
            "check that NATS and JetStream answer",
            "the stream for dead-letter subject \"%s\" could not be looked up: %s", subject,
            err.msg);
        return false;
    }
    if (!strcmp(dlq_name, du->stream)) {
        add(d, "dlq.stream", JSD_DOCTOR_STREAM, who, JSD_DOCTOR_ERROR,
            "use a separate dead-letter stream on its own subject root (e.g. \"jsd.dlq.>\")",
            "the dead-letter subject \"%s\" is captured by the consumed stream \"%s\" itself: "
            "dead letters would be delivered again and share its limits",
            subject, du->stream);
        return false;
    }
    add(d, "dlq.stream", JSD_DOCTOR_STREAM, who, JSD_DOCTOR_OK, "",
        "dead letters of \"%s\" (\"%s\") go to stream \"%s\"", who, subject, dlq_name);
    return true;
}

/* ---- the run ------------------------------------------------------------------------ */

static void run_checks(doc_run *d, const jsd_doctor_durable *dus, size_t n_dus)
{
    const jsd_doctor_opts *o = d->o;
    /* the server first: the stream checks read what its fsync policy is */
    if ((o->checks & JSD_DOCTOR_CHECK_SERVER)) {
        if (d->conn)
            jsd__doctor_check_version(d->rep, jsd_conn_server_version(d->conn));
        if (o->monitor_url)
            d->fsync = jsd__doctor_check_server(d->rep, o->monitor_url, o->monitor_timeout_ms);
        else
            jsd__doctor_add(d->rep, "server.fsync", JSD_DOCTOR_SERVER, "", JSD_DOCTOR_UNKNOWN,
                            "the server's fsync policy was not read: no monitoring URL",
                            "give --monitor http://HOST:8222 (the server's http port) to check "
                            "that it runs with jetstream { sync_interval: always }");
    }
    if ((o->checks & (JSD_DOCTOR_CHECK_STREAMS | JSD_DOCTOR_CHECK_RELAY)) && d->conn)
        for (size_t i = 0; i < d->n_streams; i++)
            check_stream(d, d->streams[i]);
    if (o->checks & JSD_DOCTOR_CHECK_DURABLES)
        for (size_t i = 0; i < n_dus; i++)
            check_durable(d, &dus[i]);
    if ((o->checks & JSD_DOCTOR_CHECK_DLQ) && d->conn) {
        const char *done[DOC_STREAMS_MAX];
        size_t n_done = 0;
        char names[64][JSD_STREAM_NAME_MAX + 1];
        for (size_t i = 0; i < n_dus && i < 64; i++) {
            if (!dlq_of(d, &dus[i], names[i], sizeof(names[i])))
                continue;
            if (!seen(done, &n_done, DOC_STREAMS_MAX, names[i]))
                check_dlq_stream(d, names[i], dus[i].stream);
        }
        const jsd_topology_stream *ts = o->topology ? jsd_topology_dead_letter(o->topology) : NULL;
        if (ts && !seen(done, &n_done, DOC_STREAMS_MAX, ts->name))
            check_dlq_stream(d, ts->name, NULL);
    }
    if ((o->checks & JSD_DOCTOR_CHECK_STORE) && d->store)
        jsd__doctor_check_store(d->rep, d->store);
}

jsd_status jsd_doctor_run(jsd_doctor_report **out, jsd_store *store, jsd_conn *conn,
                          const jsd_doctor_opts *o, jsd_error *err)
{
    if (out)
        *out = NULL;
    if (!out || !o)
        return jsd__err(err, JSD_ERR_INVALID, "doctor: output and options are required");
    if (o->n_streams > DOC_STREAMS_MAX || o->n_durables > 64 || (o->n_streams && !o->streams) ||
        (o->n_durables && !o->durables))
        return jsd__err(err, JSD_ERR_INVALID, "doctor: at most %d streams and 64 durables",
                        DOC_STREAMS_MAX);
    for (size_t i = 0; i < o->n_streams; i++)
        if (!o->streams[i] || !jsd__stream_name_valid(o->streams[i], err))
            return o->streams[i] ? JSD_ERR_INVALID
                                 : jsd__err(err, JSD_ERR_INVALID, "doctor: stream %zu is NULL", i);
    for (size_t i = 0; i < o->n_durables; i++) {
        const jsd_doctor_durable *du = &o->durables[i];
        if (!du->stream || !du->durable)
            return jsd__err(err, JSD_ERR_INVALID, "doctor: durable %zu needs a stream and a name",
                            i);
        if (!jsd__stream_name_valid(du->stream, err) || !jsd__stream_name_valid(du->durable, err))
            return JSD_ERR_INVALID;
        if (du->dlq_subject && !jsd__subject_valid_exact(du->dlq_subject, err))
            return JSD_ERR_INVALID;
    }
    if (o->monitor_url && strncmp(o->monitor_url, "http://", 7) != 0 &&
        strncmp(o->monitor_url, "https://", 8) != 0)
        return jsd__err(err, JSD_ERR_INVALID,
                        "doctor: the monitoring URL must start with http:// or https://");

    doc_run d;
    memset(&d, 0, sizeof(d));
    d.rep = jsd__calloc(1, sizeof(*d.rep));
    if (!d.rep)
        return jsd__err(err, JSD_ERR_NOMEM, "doctor: out of memory");
    d.store = store;
    d.conn = conn;
    d.js = conn ? jsd__conn_js(conn) : NULL;
    d.o = o;
    if (o->relay)
        d.relay = *o->relay;
    else
        jsd_relay_opts_init(&d.relay);

    /* The durables: the named ones, then the topology's consumers. */
    size_t n_topo = o->topology ? jsd_topology_consumer_count(o->topology) : 0;
    size_t n_dus = JSD_MIN(o->n_durables + n_topo, 64);
    jsd_doctor_durable dus[64];
    for (size_t i = 0; i < n_dus; i++) {
        if (i < o->n_durables) {
            dus[i] = o->durables[i];
        } else {
            const jsd_topology_consumer *tc =
                jsd_topology_consumer_at(o->topology, i - o->n_durables);
            dus[i] = (jsd_doctor_durable){tc->stream, tc->durable, NULL, tc->ack_wait_ms};
        }
    }
    for (size_t i = 0; i < o->n_streams; i++)
        want_stream(&d, o->streams[i], false);
    for (size_t i = 0; o->topology && i < jsd_topology_stream_count(o->topology); i++) {
        const jsd_topology_stream *ts = jsd_topology_stream_at(o->topology, i);
        if (!ts->dead_letter)
            want_stream(&d, ts->name, false);
    }
    for (size_t i = 0; i < n_dus; i++)
        want_stream(&d, dus[i].stream, false);
    if (o->outbox_streams && store && conn)
        want_outbox_streams(&d);

    run_checks(&d, dus, n_dus);

    for (size_t i = 0; i < d.n_streams; i++)
        if (d.owned[i])
            jsd__free((void *)d.streams[i]);
    if (d.rep->nomem) {
        jsd_doctor_report_destroy(d.rep);
        return jsd__err(err, JSD_ERR_NOMEM, "doctor: out of memory");
    }
    *out = d.rep;
    return JSD_OK;
}
