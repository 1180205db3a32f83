/*
 * deadletter — death envelopes and the dead-letter stream (DLQ-1..3).
 *
 * A death envelope is the original payload, verbatim, published to the
 * consumer's dead-letter subject with headers that say where it came from
 * (subject, stream, stream sequence, consumer), how many deliveries it had,
 * why it died ("poison" or "max_deliver"), the last error and when. Its
 * Nats-Msg-Id is derived from (stream, consumer, stream sequence), so every
 * attempt of one durable to bury one delivery — a retry after a failed
 * PubAck, a redelivery after a crash before TERM/ACK — is collapsed by the
 * dead-letter stream's duplicate window into one stored message, while
 * another durable that parks the same message has a dead letter of its own
 * (with the stream sequence alone, the second was taken for a duplicate of
 * the first and never stored). The caller settles the original delivery
 * (TERM for poison, ACK for a parked message) only after jsd__death_publish
 * returned JSD_OK.
 *
 * Replay (tools) records a request in the store of the durable that parked
 * the dead letter (jsd_dlq_replay_request): that durable's consumer applies
 * it from its poison record (src/consumer_replay.c), and nothing is
 * published, so no other consumer of the stream sees it again. The older
 * republication (jsd_dlq_replay, `--republish`) takes a dead letter back to
 * its original subject with a new message id derived from its place in the
 * dead-letter stream (so running the same replay twice stores it once) and a
 * Jsd-Replay-Of header: every consumer of that subject receives it.
 */
#include <inttypes.h>
#include <string.h>
#include <time.h>

#include "conn_int.h"
#include "consumer_int.h"
#include "puback.h"
#include "subject.h"

jsd_status jsd_dlq_msg_id(const char *stream, const char *consumer, uint64_t seq, char out[65])
{
    char num[24];
    jsd__snprintf(num, sizeof(num), "%" PRIu64, seq);
    /* "jsd.death2": the parts changed (the consumer joined them) */
    const char *parts[] = {"jsd.death2", stream ? stream : "", consumer ? consumer : "", num};
    size_t lens[] = {10, strlen(parts[1]), strlen(parts[2]), strlen(num)};
    return jsd__ld_sha256_hex(parts, lens, 4, out);
}

static void rfc3339(int64_t ms, char *out, size_t cap)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    jsd__snprintf(out, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                  tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ms % 1000));
}

/* Header values must not carry CR/LF; cut and sanitise free text. */
static void header_text(const char *in, char *out, size_t cap)
{
    size_t j = 0;
    for (size_t i = 0; in && in[i] && j + 1 < cap; i++) {
        unsigned char ch = (unsigned char)in[i];
        if (j == 0 && (ch <= 0x20 || ch == 0x7f))
            continue; /* no white space first */
        out[j++] = (ch < 0x20 || ch == 0x7f) ? ' ' : (char)ch;
    }
    while (j > 0 && out[j - 1] == ' ')
        j--; /* nor last */
    out[j] = '\0';
}

/* A header of the envelope; an empty text is left out, since nats.c 3.4.1
 * cannot read a message with an empty header value (jsd__header_value_edges
 * in subject.h). */
static natsStatus set_text(natsMsg *m, const char *name, const char *in)
{
    char v[257];
    header_text(in, v, sizeof(v));
    return v[0] ? natsMsgHeader_Set(m, name, v) : NATS_OK;
}

jsd_status jsd__death_publish(jsCtx *js, const char *dlq_subject, const char *dlq_stream,
                              const jsd__death *d, int timeout_ms, uint64_t *dlq_seq,
                              jsd_error *err)
{
    natsMsg *m = NULL;
    jsPubAck *pa = NULL;
    jsErrCode jerr = 0;
    natsStatus s;
    jsd_status st = JSD_OK;
    char id[65], seq[24], dlv[24], when[40];

    if ((st = jsd_dlq_msg_id(d->stream, d->consumer, d->stream_seq, id)) != JSD_OK)
        return jsd__err(err, st, "cannot derive the death envelope's message id (%s)",
                        jsd_status_str(st));
    jsd__snprintf(seq, sizeof(seq), "%" PRIu64, d->stream_seq);
    jsd__snprintf(dlv, sizeof(dlv), "%" PRIu64, d->deliveries);
    rfc3339(d->time_ms ? d->time_ms : jsd__now_ms(), when, sizeof(when));

    s = natsMsg_Create(&m, dlq_subject, NULL, d->payload, (int)d->len);
    if (s == NATS_OK)
        s = set_text(m, JSD_HDR_DLQ_SUBJECT, d->subject);
    if (s == NATS_OK)
        s = set_text(m, JSD_HDR_DLQ_STREAM, d->stream);
    if (s == NATS_OK)
        s = set_text(m, JSD_HDR_DLQ_CONSUMER, d->consumer);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, JSD_HDR_DLQ_SEQ, seq);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, JSD_HDR_DLQ_DELIVERIES, dlv);
    if (s == NATS_OK)
        s = set_text(m, JSD_HDR_DLQ_REASON, d->reason && *d->reason ? d->reason : "poison");
    if (s == NATS_OK)
        s = set_text(m, JSD_HDR_DLQ_ERROR, d->error);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, JSD_HDR_DLQ_TIME, when);
    if (s == NATS_OK)
        s = set_text(m, JSD_HDR_DLQ_MSG_ID, d->msg_id);
    if (s == NATS_OK)
        s = set_text(m, JSD_HDR_DLQ_TYPE, d->type);
    if (s != NATS_OK) {
        st = jsd__err_nats(err, s, 0, "death envelope: build message");
        goto done;
    }

    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MsgId = id;
    po.ExpectStream = dlq_stream;
    po.MaxWait = timeout_ms > 0 ? timeout_ms : 5000;
    s = js_PublishMsg(&pa, js, m, &po, &jerr);
    if (s != NATS_OK) {
        char what[400];
        jsd__snprintf(what, sizeof(what), "publish death envelope of %s:%" PRIu64 " to \"%s\"",
                      d->stream ? d->stream : "", d->stream_seq, dlq_subject);
        st = jsd__err_nats(err, s, jerr, what);
        goto done;
    }
    int64_t ack_seq = pa ? (int64_t)JSD_MIN(pa->Sequence, (uint64_t)INT64_MAX) : 0;
    if (jsd__puback_judge(pa ? pa->Stream : NULL, ack_seq, dlq_stream) != JSD__PUBACK_OK) {
        st = jsd__err(err, JSD_ERR_NATS, "death envelope: unexpected PubAck from stream \"%s\"",
                      pa && pa->Stream ? pa->Stream : "");
        goto done;
    }
    if (dlq_seq)
        *dlq_seq = pa->Sequence;
done:
    jsPubAck_Destroy(pa);
    natsMsg_Destroy(m);
    return st;
}

jsd_status jsd_dlq_replay(jsd_conn *conn, const char *dlq_stream, uint64_t dlq_seq,
                          uint64_t *new_seq, jsd_error *err)
{
    jsCtx *js = conn ? jsd__conn_js(conn) : NULL;
    natsMsg *dead = NULL, *m = NULL;
    jsPubAck *pa = NULL;
    jsErrCode jerr = 0;
    jsd_status st = JSD_OK;
    const char *subject = NULL, *type = NULL;
    char origin[200], id[65];

    if (!js || !dlq_stream || !jsd__stream_name_valid(dlq_stream, err))
        return js ? JSD_ERR_INVALID : jsd__err(err, JSD_ERR_INVALID, "replay: no connection");
    natsStatus s = js_GetMsg(&dead, js, dlq_stream, dlq_seq, NULL, &jerr);
    if (s != NATS_OK) {
        char what[200];
        jsd__snprintf(what, sizeof(what), "dead letter %s:%" PRIu64, dlq_stream, dlq_seq);
        st = jsd__err_nats(err, s, jerr, what);
        if (s == NATS_NOT_FOUND || jerr == JSNoMessageFoundErr)
            st =
                jsd__err(err, JSD_ERR_NOT_FOUND, "no dead letter %s:%" PRIu64, dlq_stream, dlq_seq);
        goto done;
    }
    if (natsMsgHeader_Get(dead, JSD_HDR_DLQ_SUBJECT, &subject) != NATS_OK || !subject ||
        !jsd__subject_valid_exact(subject, NULL)) {
        st = jsd__err(err, JSD_ERR_INVALID,
                      "%s:%" PRIu64 " is not a death envelope (no valid " JSD_HDR_DLQ_SUBJECT
                      " header)",
                      dlq_stream, dlq_seq);
        goto done;
    }
    if (natsMsgHeader_Get(dead, JSD_HDR_DLQ_TYPE, &type) != NATS_OK)
        type = NULL;
    jsd__snprintf(origin, sizeof(origin), "%s:%" PRIu64, dlq_stream, dlq_seq);
    {
        const char *parts[] = {"jsd.replay", origin};
        size_t lens[] = {10, strlen(origin)};
        if ((st = jsd__ld_sha256_hex(parts, lens, 2, id)) != JSD_OK) {
            st =
                jsd__err(err, st, "cannot derive the replay's message id (%s)", jsd_status_str(st));
            goto done;
        }
    }
    s = natsMsg_Create(&m, subject, NULL, natsMsg_GetData(dead), natsMsg_GetDataLength(dead));
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, JSD_HDR_REPLAY_OF, origin);
    if (s == NATS_OK && type && *type)
        s = natsMsgHeader_Set(m, JSD_HDR_TYPE, type);
    if (s == NATS_OK) {
        jsPubOptions po;
        jsPubOptions_Init(&po);
        po.MsgId = id;
        s = js_PublishMsg(&pa, js, m, &po, &jerr);
    }
    if (s != NATS_OK) {
        char what[400];
        jsd__snprintf(what, sizeof(what), "replay %s to \"%s\"", origin, subject);
        st = jsd__err_nats(err, s, jerr, what);
        goto done;
    }
    if (new_seq)
        *new_seq = pa ? pa->Sequence : 0;
done:
    jsPubAck_Destroy(pa);
    natsMsg_Destroy(m);
    natsMsg_Destroy(dead);
    return st;
}

/* ---- replay to the durable that parked it -------------------------------------------- */

const char *jsd_replay_state_name(jsd_replay_state s)
{
    switch (s) {
    case JSD_REPLAY_PENDING:
        return "pending";
    case JSD_REPLAY_APPLIED:
        return "applied";
    case JSD_REPLAY_FAILED:
        return "failed";
    }
    return "unknown";
}

jsd_status jsd_dlq_replay_request(jsd_conn *conn, const char *dlq_stream, uint64_t dlq_seq,
                                  jsd_store *store, jsd_replay_request *out, bool *queued,
                                  jsd_error *err)
{
    jsd_dead_letter d;
    jsd_replay_request req, got;
    bool q = false;
    if (queued)
        *queued = false;
    if (!store)
        return jsd__err(err, JSD_ERR_INVALID, "replay: no store");
    jsd_status st = jsd_dlq_get(conn, dlq_stream, dlq_seq, &d, err);
    if (st != JSD_OK)
        return st;
    if (!*d.stream || !*d.consumer || d.stream_seq == 0) {
        st = jsd__err(err, JSD_ERR_INVALID,
                      "%s:%" PRIu64 " is not a death envelope (no " JSD_HDR_DLQ_STREAM
                      ", " JSD_HDR_DLQ_CONSUMER " or " JSD_HDR_DLQ_SEQ
                      " header): it names no durable to replay it to",
                      dlq_stream, dlq_seq);
        goto done;
    }
    jsd__poison_record rec;
    memset(&rec, 0, sizeof(rec));
    st = jsd__store_poison_get(store, d.stream, d.consumer, d.stream_seq, &rec);
    jsd__poison_record_clear(&rec);
    if (st == JSD_ERR_NOT_FOUND) {
        st =
            jsd__err(err, JSD_ERR_CONFIG,
                     "%s:%" PRIu64 " was parked by durable \"%.64s\" (stream \"%.64s\", sequence "
                     "%" PRIu64 "), but store %s holds no poison record of it: give --store the "
                     "store of that durable",
                     dlq_stream, dlq_seq, d.consumer, d.stream, d.stream_seq, jsd_store_url(store));
        goto done;
    }
    if (st != JSD_OK) {
        jsd__err_copy(err, jsd_store_error(store));
        goto done;
    }
    memset(&req, 0, sizeof(req));
    jsd__strlcpy(req.stream, d.stream, sizeof(req.stream));
    jsd__strlcpy(req.consumer, d.consumer, sizeof(req.consumer));
    req.stream_seq = d.stream_seq;
    jsd__strlcpy(req.dlq_stream, dlq_stream, sizeof(req.dlq_stream));
    req.dlq_seq = dlq_seq;
    st = jsd__store_replay_request(store, &req, &got, &q);
    if (st != JSD_OK) {
        jsd__err_copy(err, jsd_store_error(store));
        goto done;
    }
    if (out)
        *out = got;
    if (queued)
        *queued = q;
done:
    jsd_dead_letter_clear(&d);
    return st;
}

jsd_status jsd_dlq_replay_list(jsd_store *store, int64_t after_id, jsd_replay_request *out,
                               size_t cap, size_t *n, jsd_error *err)
{
    if (n)
        *n = 0;
    if (!store || !out || !n || cap == 0)
        return jsd__err(err, JSD_ERR_INVALID, "replay list: invalid argument");
    jsd_status st = jsd__store_replay_open(store, after_id, out, JSD_MIN(cap, 10000), n);
    if (st != JSD_OK)
        jsd__err_copy(err, jsd_store_error(store));
    return st;
}

/* ---- tools ---------------------------------------------------------------------------- */

void jsd_dead_letter_clear(jsd_dead_letter *d)
{
    if (!d)
        return;
    jsd__free(d->subject);
    jsd__free(d->stream);
    jsd__free(d->consumer);
    jsd__free(d->reason);
    jsd__free(d->error);
    jsd__free(d->time);
    jsd__free(d->msg_id);
    jsd__free(d->type);
    jsd__free(d->payload);
    memset(d, 0, sizeof(*d));
}

static char *hdr_dup(natsMsg *m, const char *name)
{
    const char *v = NULL;
    if (natsMsgHeader_Get(m, name, &v) != NATS_OK || !v)
        v = "";
    return jsd__strdup(v);
}

static uint64_t hdr_u64(natsMsg *m, const char *name)
{
    const char *v = NULL;
    int64_t n = 0;
    if (natsMsgHeader_Get(m, name, &v) != NATS_OK || !v || !jsd__parse_i64(v, 0, INT64_MAX, &n))
        return 0;
    return (uint64_t)n;
}

jsd_status jsd_dlq_get(jsd_conn *conn, const char *dlq_stream, uint64_t seq, jsd_dead_letter *out,
                       jsd_error *err)
{
    jsCtx *js = conn ? jsd__conn_js(conn) : NULL;
    natsMsg *m = NULL;
    jsErrCode jerr = 0;

    if (!js || !out || !dlq_stream || !jsd__stream_name_valid(dlq_stream, err))
        return jsd__err(err, JSD_ERR_INVALID, "dlq get: invalid argument");
    memset(out, 0, sizeof(*out));
    natsStatus s = js_GetMsg(&m, js, dlq_stream, seq, NULL, &jerr);
    if (s != NATS_OK) {
        if (s == NATS_NOT_FOUND || jerr == JSNoMessageFoundErr)
            return jsd__err(err, JSD_ERR_NOT_FOUND, "no message %" PRIu64 " in stream \"%s\"", seq,
                            dlq_stream);
        char what[200];
        jsd__snprintf(what, sizeof(what), "read %s:%" PRIu64, dlq_stream, seq);
        return jsd__err_nats(err, s, jerr, what);
    }
    out->dlq_seq = seq;
    out->subject = hdr_dup(m, JSD_HDR_DLQ_SUBJECT);
    out->stream = hdr_dup(m, JSD_HDR_DLQ_STREAM);
    out->consumer = hdr_dup(m, JSD_HDR_DLQ_CONSUMER);
    out->reason = hdr_dup(m, JSD_HDR_DLQ_REASON);
    out->error = hdr_dup(m, JSD_HDR_DLQ_ERROR);
    out->time = hdr_dup(m, JSD_HDR_DLQ_TIME);
    out->msg_id = hdr_dup(m, JSD_HDR_DLQ_MSG_ID);
    out->type = hdr_dup(m, JSD_HDR_DLQ_TYPE);
    out->stream_seq = hdr_u64(m, JSD_HDR_DLQ_SEQ);
    out->deliveries = hdr_u64(m, JSD_HDR_DLQ_DELIVERIES);
    out->len = (size_t)natsMsg_GetDataLength(m);
    out->payload = jsd__malloc(out->len + 1);
    if (out->payload) {
        if (out->len)
            memcpy(out->payload, natsMsg_GetData(m), out->len);
        ((char *)out->payload)[out->len] = '\0';
    }
    natsMsg_Destroy(m);
    if (!out->subject || !out->stream || !out->consumer || !out->reason || !out->error ||
        !out->time || !out->msg_id || !out->type || !out->payload) {
        jsd_dead_letter_clear(out);
        return jsd__err(err, JSD_ERR_NOMEM, "dlq get: out of memory");
    }
    return JSD_OK;
}

jsd_status jsd_dlq_range(jsd_conn *conn, const char *dlq_stream, uint64_t *first, uint64_t *last,
                         uint64_t *count, jsd_error *err)
{
    jsCtx *js = conn ? jsd__conn_js(conn) : NULL;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    if (!js || !dlq_stream || !jsd__stream_name_valid(dlq_stream, err))
        return jsd__err(err, JSD_ERR_INVALID, "dlq range: invalid argument");
    natsStatus s = js_GetStreamInfo(&si, js, dlq_stream, NULL, &jerr);
    if (s != NATS_OK) {
        if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr)
            return jsd__err(err, JSD_ERR_NOT_FOUND, "stream \"%s\" does not exist", dlq_stream);
        return jsd__err_nats(err, s, jerr, "stream info");
    }
    if (first)
        *first = si->State.FirstSeq;
    if (last)
        *last = si->State.LastSeq;
    if (count)
        *count = si->State.Msgs;
    jsStreamInfo_Destroy(si);
    return JSD_OK;
}

jsd_status jsd_dlq_delete(jsd_conn *conn, const char *dlq_stream, uint64_t seq, jsd_error *err)
{
    jsCtx *js = conn ? jsd__conn_js(conn) : NULL;
    jsErrCode jerr = 0;
    if (!js || !dlq_stream || !jsd__stream_name_valid(dlq_stream, err))
        return jsd__err(err, JSD_ERR_INVALID, "dlq delete: invalid argument");
    natsStatus s = js_DeleteMsg(js, dlq_stream, seq, NULL, &jerr);
    if (s != NATS_OK) {
        if (s == NATS_NOT_FOUND || jerr == JSSequenceNotFoundErr || jerr == JSNoMessageFoundErr)
            return jsd__err(err, JSD_ERR_NOT_FOUND, "no message %" PRIu64 " in stream \"%s\"", seq,
                            dlq_stream);
        return jsd__err_nats(err, s, jerr, "delete dead letter");
    }
    return JSD_OK;
}

jsd_status jsd_dlq_purge(jsd_conn *conn, const char *dlq_stream, jsd_error *err)
{
    jsCtx *js = conn ? jsd__conn_js(conn) : NULL;
    jsErrCode jerr = 0;
    if (!js || !dlq_stream || !jsd__stream_name_valid(dlq_stream, err))
        return jsd__err(err, JSD_ERR_INVALID, "dlq purge: invalid argument");
    natsStatus s = js_PurgeStream(js, dlq_stream, NULL, &jerr);
    if (s != NATS_OK)
        return jsd__err_nats(err, s, jerr, "purge dead-letter stream");
    return JSD_OK;
}
