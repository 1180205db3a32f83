/*
 * The store's front for replay requests (`jsdurable dlq replay --store`): a
 * dead letter that the durable which parked it is to apply again, recorded
 * in that durable's store, read and completed by its consumer
 * (src/consumer_replay.c), and the inbox outcome the consumer turns to
 * "applied" in the same transaction. Arguments are checked here, so both
 * back ends see only valid ones (backend.h).
 */
#include <string.h>

#include "store/front.h"

static bool name_ok(const char *v)
{
    return v && *v && strlen(v) <= 256;
}

static jsd_status check_ids(jsd_store *s, const char *stream, const char *consumer, uint64_t seq,
                            const char *what)
{
    if (!name_ok(stream) || !name_ok(consumer) || seq == 0 || seq > (uint64_t)INT64_MAX)
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "%s: stream and durable must be 1..256 bytes and the stream "
                              "sequence 1..2^63-1",
                              what);
    return JSD_OK;
}

static jsd_status check_open(jsd_tx *tx, const char *what)
{
    if (!tx || !tx->active)
        return tx ? jsd__store_err(tx->store, JSD_ERR_INVALID, "%s: no transaction is open", what)
                  : JSD_ERR_INVALID;
    return JSD_OK;
}

jsd_status jsd__store_replay_request(jsd_store *s, const jsd_replay_request *r,
                                     jsd_replay_request *out, bool *queued)
{
    if (!s || !r || !out || !queued)
        return JSD_ERR_INVALID;
    *queued = false;
    jsd_status rc = jsd__store_need_idle(s, "replay request");
    if (rc != JSD_OK ||
        (rc = check_ids(s, r->stream, r->consumer, r->stream_seq, "replay request")) != JSD_OK)
        return rc;
    if (!name_ok(r->dlq_stream) || r->dlq_seq == 0 || r->dlq_seq > (uint64_t)INT64_MAX)
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "replay request: the dead letter's stream or sequence is not valid");
    return s->ops->replay_request(s, r, jsd__now_ms(), out, queued);
}

static jsd_status list(jsd_store *s, const char *stream, const char *consumer, int64_t after_id,
                       jsd_replay_request *out, size_t max, size_t *n)
{
    if (!s || !out || !n)
        return JSD_ERR_INVALID;
    *n = 0;
    jsd_status rc = jsd__store_need_idle(s, "replay requests");
    if (rc != JSD_OK)
        return rc;
    if (max == 0 || max > 10000)
        return jsd__store_err(s, JSD_ERR_INVALID, "replay requests: max %zu is outside 1..10000",
                              max);
    return s->ops->replay_list(s, stream, consumer, after_id, max, out, n);
}

jsd_status jsd__store_replay_pending(jsd_store *s, const char *stream, const char *consumer,
                                     int64_t after_id, jsd_replay_request *out, size_t max,
                                     size_t *n)
{
    if (s && (!name_ok(stream) || !name_ok(consumer)))
        return jsd__store_err(s, JSD_ERR_INVALID, "replay requests: stream or durable not valid");
    return list(s, stream, consumer, after_id, out, max, n);
}

jsd_status jsd__store_replay_open(jsd_store *s, int64_t after_id, jsd_replay_request *out,
                                  size_t max, size_t *n)
{
    return list(s, NULL, NULL, after_id, out, max, n);
}

static jsd_status finish(jsd_store *s, int64_t id, jsd_replay_state state, const char *detail,
                         bool *done)
{
    if (state != JSD_REPLAY_APPLIED && state != JSD_REPLAY_FAILED)
        return jsd__store_err(s, JSD_ERR_INVALID, "replay finish: state must be applied or failed");
    char cut[JSD__ERROR_TEXT_MAX + 1];
    jsd__strlcpy(cut, detail ? detail : "", sizeof(cut));
    bool d = false;
    jsd_status rc = s->ops->replay_finish(s, id, (int)state, cut, jsd__now_ms(), &d);
    if (done)
        *done = d;
    return rc;
}

jsd_status jsd__tx_replay_finish(jsd_tx *tx, int64_t id, jsd_replay_state state, const char *detail,
                                 bool *done)
{
    jsd_status rc = check_open(tx, "replay finish");
    return rc != JSD_OK ? rc : finish(tx->store, id, state, detail, done);
}

jsd_status jsd__store_replay_finish(jsd_store *s, int64_t id, jsd_replay_state state,
                                    const char *detail, bool *done)
{
    if (!s)
        return JSD_ERR_INVALID;
    jsd_status rc = jsd__store_need_idle(s, "replay finish");
    return rc != JSD_OK ? rc : finish(s, id, state, detail, done);
}

jsd_status jsd__tx_inbox_set_outcome(jsd_tx *tx, const char *stream, const char *consumer,
                                     uint64_t stream_seq, int code, const char *detail,
                                     bool *changed)
{
    jsd_status rc = check_open(tx, "inbox outcome");
    if (rc != JSD_OK ||
        (rc = check_ids(tx->store, stream, consumer, stream_seq, "inbox outcome")) != JSD_OK)
        return rc;
    char cut[JSD__ERROR_TEXT_MAX + 1];
    jsd__strlcpy(cut, detail ? detail : "", sizeof(cut));
    bool c = false;
    rc = tx->store->ops->inbox_set(tx->store, stream, consumer, stream_seq, code, cut, &c);
    if (changed)
        *changed = c;
    return rc;
}
