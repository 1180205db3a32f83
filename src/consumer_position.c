/*
 * consumer_position — a durable's position against its stream and its
 * inbox (issue 42): a durable ahead of its stream (the server lost the
 * stream's tail but kept the durable's state) and a store restored from an
 * older backup (the inbox's high-water mark below the durable's ack floor).
 * jsd_durable_position_get reads both for jsd_consumer_ensure_inbox, a
 * running consumer (jsd__durable_ahead, when idle), `jsdurable status` and
 * `jsdurable doctor`; jsd__durable_rewind and
 * jsd_consumer_redeliver_from_inbox re-create a durable with its own
 * settings at a chosen start.
 *
 * DESIGN (where a durable ahead of its stream resumes). The server lost the
 * stream's tail: sequences after its last one L are handed out again to new
 * messages, and the durable, whose ack floor F is past L, would never
 * deliver them. It is re-created (deleted, then added with the config the
 * server holds, deliver policy by_start_sequence) at
 *     min(L + 1, M + 1)
 * where M is the highest sequence at or below min(L, inbox high-water mark)
 * whose stream message is still the message the inbox recorded there (same
 * Nats-Msg-Id, or the same "@seq.time" key for a message without one). L + 1
 * alone is right when the loss is seen before anything new is published;
 * but messages published after the loss and before it is seen take
 * sequences at or below the durable's old floor and are new too, and M
 * finds where the old stream ends: above M, a sequence either holds another
 * message than the inbox recorded (new) or one the inbox never saw. Starting
 * too early is safe, starting too late loses messages: a delivery the inbox
 * already holds by its message id is answered as a duplicate, never applied
 * twice (consumer_apply.c), so every uncertainty (a sequence the inbox
 * holds no row for, a message that cannot be read, the walk's bound) moves
 * the start down, never up. The walk looks at PROBE_MAX sequences at most
 * and then starts where it stopped.
 *
 * But starting early is safe only where the inbox still holds the rows:
 * `jsdurable gc` removes a durable's rows at or below its ack floor, and a
 * message there delivered again would be applied twice. gc records the
 * floor it uses (jsd_durable_floor) before it removes a row, so a sequence
 * at or below the recorded floor R without an inbox row may be one gc
 * removed. The walk takes such a sequence as the old stream's when its
 * stream message was stored no later than R was recorded (time T): a
 * message published after the loss, which happened after T, is stored
 * after T. So the walk stops there (start seq + 1), and never goes down
 * into what gc emptied. The limits: the comparison is of the server's
 * store time against the recording host's clock, so a skew between them
 * shifts it by as much; and a floor recorded while the durable was already
 * ahead (before a running consumer saw it; it records none once it has)
 * makes messages of the new stream stored before T read as old, skipped.
 * A rewind puts the recorded floor to the new start - 1, so that a later
 * loss resumes in the new stream. One race is left: another consumer of
 * the durable that read the old floor just before the rewind may write it
 * back once, and a loss after that resumes after the old floor.
 *
 * DESIGN (where a lost durable resumes). A durable deleted (or missing at
 * start) and re-created with its settings (consume --topology) resumes at
 * R + 1, R its acknowledged floor recorded in the store
 * (jsd_store_durable_floor_record: by the running consumer every
 * FLOOR_NOTE_EVERY ms and at a clean stop, by gc before it removes rows).
 * The server acknowledged every delivery at or below R (applied, answered
 * from the inbox, or parked), so nothing there is lost; above it, what was
 * applied is answered from the inbox as a duplicate (gc keeps every row
 * above the floor it used, and that floor is at or below R), and what was
 * not (a delivery NAKed for a retry, one another consumer of the durable
 * held uncommitted) is delivered again and applied. The inbox's high-water
 * mark H + 1 is no such point: a delivery below H may be unapplied (a
 * handler's failure NAKed while later ones committed). Without a recorded
 * floor (a store that never ran this version's consumer or gc) the durable
 * resumes after H as before, with a warning that deliveries in flight when
 * it was lost may have been skipped. What is left: acknowledgements after
 * the last recording move the floor on the server only, so a few
 * seconds' worth of applied deliveries come again, all answered from the
 * inbox.
 */
#include <inttypes.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "conn_int.h"
#include "consumer_int.h"
#include "store/store.h"
#include "streams.h"

#define PROBE_MAX        1000
#define AHEAD_LOOK_EVERY 5000  /* ms between a running consumer's looks */
#define FLOOR_NOTE_EVERY 10000 /* ms between a running consumer's floor records */

/* The first stream message at or after `from` the durable takes (its
 * filter; NULL: any), by STREAM.MSG.GET with next_by_subj: *seq, or 0 when
 * there is none. */
static jsd_status next_taken(jsd_conn *conn, const char *stream, const char *filter, uint64_t from,
                             uint64_t *seq, jsd_error *err)
{
    char api[64 + JSD_STREAM_NAME_MAX];
    json_t *body = json_object(), *ans = NULL;
    *seq = 0;
    if (!body)
        return jsd__err(err, JSD_ERR_NOMEM, "out of memory");
    json_object_set_new(body, "seq", json_integer((json_int_t)from));
    json_object_set_new(body, "next_by_subj", json_string(filter && *filter ? filter : ">"));
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!text)
        return jsd__err(err, JSD_ERR_NOMEM, "out of memory");
    jsd__snprintf(api, sizeof(api), "STREAM.MSG.GET.%s", stream);
    jsd_error e;
    jsd_error_clear(&e);
    jsd_status st = jsd__js_api(conn, api, text, &ans, "reading the stream's next message", &e);
    free(text);
    if (st == JSD_OK) {
        json_t *m = json_object_get(ans, "message");
        json_t *sq = m ? json_object_get(m, "seq") : NULL;
        if (json_is_integer(sq) && json_integer_value(sq) > 0)
            *seq = (uint64_t)json_integer_value(sq);
        json_decref(ans);
        return JSD_OK;
    }
    if (e.js_err_code == 10037) /* no message found */
        return JSD_OK;
    jsd__err_copy(err, &e);
    return st;
}

jsd_status jsd_durable_position_get(jsd_conn *conn, jsd_store *store, const char *stream,
                                    const char *durable, jsd_durable_position *out, jsd_error *err)
{
    jsCtx *js = conn ? jsd__conn_js(conn) : NULL;
    jsStreamInfo *si = NULL;
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    jsd_status st = JSD_OK;

    if (!out)
        return jsd__err(err, JSD_ERR_INVALID, "durable position: no output");
    memset(out, 0, sizeof(*out));
    if (!js)
        return jsd__err(err, JSD_ERR_INVALID, "durable position: no connection");
    if (!jsd__stream_name_valid(stream, err) || !jsd__stream_name_valid(durable, err))
        return JSD_ERR_INVALID;
    /* The durable first: a floor read before the stream's last sequence can
     * only be lower than the one at that moment, never wrongly ahead. */
    natsStatus s = js_GetConsumerInfo(&ci, js, stream, durable, NULL, &jerr);
    if (s != NATS_OK) {
        if (s == NATS_NOT_FOUND || jerr == JSConsumerNotFoundErr || jerr == JSStreamNotFoundErr)
            return jsd__err(err, JSD_ERR_NOT_FOUND,
                            "durable \"%s\" does not exist on stream \"%s\"", durable, stream);
        return jsd__err_nats(err, s, jerr, "consumer info");
    }
    s = js_GetStreamInfo(&si, js, stream, NULL, &jerr);
    if (s != NATS_OK) {
        jsConsumerInfo_Destroy(ci);
        if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr)
            return jsd__err(err, JSD_ERR_NOT_FOUND, "stream \"%s\" does not exist", stream);
        return jsd__err_nats(err, s, jerr, "stream info");
    }
    out->stream_first = si->State.FirstSeq;
    out->stream_last = si->State.LastSeq;
    out->ack_floor = ci->AckFloor.Stream;
    out->delivered = ci->Delivered.Stream;
    out->ahead = out->ack_floor > out->stream_last || out->delivered > out->stream_last;
    if (!store || out->ahead || out->ack_floor == 0)
        goto done;
    if ((st = jsd_store_inbox_high_water(store, stream, durable, &out->inbox_high)) != JSD_OK) {
        st = jsd__err(err, st, "reading the inbox high-water mark of %s/%s: %s", stream, durable,
                      jsd_store_errmsg(store));
        goto done;
    }
    if (out->inbox_high >= out->ack_floor)
        goto done;
    /* Where the durable began: a start it was given (an inbox that is
     * empty because the durable was bound after the messages before it) is
     * not a loss; nor is an empty inbox of a durable that starts at "new",
     * "last" or a time, whose start is not known. */
    const jsConsumerConfig *cc = ci->Config;
    uint64_t lo = out->inbox_high;
    if (cc && cc->DeliverPolicy == js_DeliverByStartSequence && cc->OptStartSeq > 0)
        lo = JSD_MAX(lo, cc->OptStartSeq - 1);
    else if (cc && cc->DeliverPolicy != js_DeliverAll && out->inbox_high == 0)
        goto done;
    const char *filter = cc && cc->FilterSubject && *cc->FilterSubject ? cc->FilterSubject : NULL;
    uint64_t next = 0;
    if (lo < out->ack_floor &&
        (st = next_taken(conn, stream, filter, lo + 1, &next, err)) != JSD_OK)
        goto done;
    if (next > 0 && next <= out->ack_floor)
        out->behind_from = next;
done:
    jsConsumerInfo_Destroy(ci);
    jsStreamInfo_Destroy(si);
    return st;
}

/* Delete the durable and add it again with the config the server holds,
 * starting at `at`. */
static jsd_status rewind_to(jsCtx *js, const char *stream, const char *durable, uint64_t at,
                            jsd_error *err)
{
    jsConsumerInfo *ci = NULL, *made = NULL;
    jsErrCode jerr = 0;
    char what[300];
    natsStatus s = js_GetConsumerInfo(&ci, js, stream, durable, NULL, &jerr);
    if (s != NATS_OK)
        return jsd__err_nats(err, s, jerr, "consumer info");
    jsConsumerConfig cc = *ci->Config;
    cc.DeliverPolicy = js_DeliverByStartSequence;
    cc.OptStartSeq = at;
    cc.OptStartTime = 0;
    s = js_DeleteConsumer(js, stream, durable, NULL, &jerr);
    if (s != NATS_OK) {
        jsConsumerInfo_Destroy(ci);
        jsd__snprintf(what, sizeof(what), "delete durable \"%s\" to re-create it at %" PRIu64,
                      durable, at);
        return jsd__err_nats(err, s, jerr, what);
    }
    s = js_AddConsumer(&made, js, stream, &cc, NULL, &jerr);
    jsConsumerInfo_Destroy(made);
    jsConsumerInfo_Destroy(ci);
    if (s != NATS_OK) {
        jsd__snprintf(what, sizeof(what),
                      "re-create durable \"%s\" on stream \"%s\" at stream sequence %" PRIu64
                      " (it was deleted: restore it with `jsdurable provision`)",
                      durable, stream, at);
        return jsd__err_nats(err, s, jerr, what);
    }
    return JSD_OK;
}

/* Whether the stream's message at seq is the one the inbox recorded there
 * (see DESIGN): 1 yes, 0 no or not known (no row, unreadable). Without a
 * row, a message at or below the recorded floor `floor` stored by floor_at
 * (unix ms) counts as the one gc removed the row of. */
static int same_message(jsCtx *js, jsd_tx *tx, const char *stream, const char *durable,
                        uint64_t seq, uint64_t floor, int64_t floor_at)
{
    bool found = false;
    jsd__inbox_outcome o;
    if (jsd__tx_inbox_lookup(tx, stream, durable, seq, &found, &o) != JSD_OK)
        return 0;
    if (!found && (seq > floor || floor_at <= 0))
        return 0;
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    if (js_GetMsg(&m, js, stream, seq, NULL, &jerr) != NATS_OK)
        return 0;
    if (!found) {
        int64_t stored_ms = natsMsg_GetTime(m) / 1000000;
        natsMsg_Destroy(m);
        return stored_ms <= floor_at;
    }
    const char *id = NULL;
    char key[48];
    if (natsMsgHeader_Get(m, "Nats-Msg-Id", &id) != NATS_OK || !id || !*id) {
        jsd__snprintf(key, sizeof(key), "@%" PRIu64 ".%" PRId64, seq, natsMsg_GetTime(m));
        id = key;
    }
    int same = strcmp(id, o.msg_id) == 0;
    natsMsg_Destroy(m);
    return same;
}

uint64_t jsd__durable_resume_seq(jsd_conn *conn, jsd_store *store, const char *stream,
                                 const char *durable, const jsd_durable_position *p)
{
    jsCtx *js = jsd__conn_js(conn);
    uint64_t first = JSD_MAX(p->stream_first, 1);
    uint64_t top = p->stream_last;
    jsd_tx *tx = NULL;
    uint64_t high = 0, floor = 0;
    int64_t floor_at = 0;
    if (store && jsd_store_durable_floor_get(store, stream, durable, &floor, &floor_at) != JSD_OK)
        floor = 0; /* unknown: every sequence without a row is taken as new */
    if (!store || jsd_tx_begin(&tx, store) != JSD_OK)
        return first; /* the inbox unreadable: from the stream's start, as a fresh durable would */
    /* from the highest sequence the old stream may have had acknowledged */
    if (jsd_store_inbox_high_water(store, stream, durable, &high) == JSD_OK &&
        JSD_MAX(high, floor) < top)
        top = JSD_MAX(high, floor);
    uint64_t at = first, seq = top;
    for (int n = 0; seq >= first && n < PROBE_MAX; seq--, n++) {
        if (same_message(js, tx, stream, durable, seq, floor, floor_at)) {
            at = seq + 1;
            break;
        }
        at = seq; /* nothing older is known to be the old stream's yet */
        if (seq == 0)
            break;
    }
    jsd_tx_rollback(tx);
    return JSD_MIN(at, p->stream_last + 1);
}

/* The recorded floor of a durable re-created at `at` is at - 1 (see the
 * DESIGN): a failure is said, the re-creation stands. */
void jsd__durable_floor_reset(jsd_store *store, const char *stream, const char *durable,
                              uint64_t at)
{
    if (!store || at == 0)
        return;
    if (jsd__store_durable_floor_set(store, stream, durable, at - 1) != JSD_OK)
        JSD_WARN("consumer",
                 "%s/%s: the durable was re-created at stream sequence %" PRIu64
                 " but its recorded ack floor could not be put back to %" PRIu64
                 ": %s; if it is lost again before its consumer records a floor, it resumes "
                 "after the old one",
                 stream, durable, at, at - 1, jsd_store_errmsg(store));
}

jsd_status jsd__durable_rewind(jsd_conn *conn, jsd_store *store, const char *stream,
                               const char *durable, uint64_t at, jsd_error *err)
{
    jsd_status st = rewind_to(jsd__conn_js(conn), stream, durable, at, err);
    if (st == JSD_OK)
        jsd__durable_floor_reset(store, stream, durable, at);
    return st;
}

jsd_status jsd__durable_lost_start(jsd_store *store, const char *stream, const char *durable,
                                   uint64_t high, uint64_t *at, char *why, size_t cap,
                                   jsd_error *err)
{
    uint64_t floor = 0;
    int64_t floor_at = 0;
    jsd_status st = jsd_store_durable_floor_get(store, stream, durable, &floor, &floor_at);
    if (st != JSD_OK)
        return jsd__err(err, st, "reading the recorded ack floor of %s/%s: %s", stream, durable,
                        jsd_store_errmsg(store));
    if (floor == 0) {
        *at = high + 1;
        jsd__snprintf(why, cap,
                      "after its inbox's high-water mark %" PRIu64
                      ": no acknowledged floor is recorded in the store, so deliveries in flight "
                      "when it was lost (a retry, or one another consumer held uncommitted) "
                      "below the mark may have been skipped",
                      high);
        return JSD_OK;
    }
    char when[40] = "?";
    time_t secs = (time_t)(floor_at / 1000);
    struct tm tm;
    if (gmtime_r(&secs, &tm))
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
    *at = floor + 1;
    jsd__snprintf(why, cap,
                  "after its acknowledged floor %" PRIu64 " recorded at %s (inbox high-water "
                  "mark %" PRIu64 "): what was applied above it is answered from the inbox",
                  floor, when, high);
    return JSD_OK;
}

jsd_status jsd_consumer_redeliver_from_inbox(jsd_conn *conn, jsd_store *store, const char *stream,
                                             const char *durable, uint64_t *at, jsd_error *err)
{
    jsCtx *js = conn ? jsd__conn_js(conn) : NULL;
    uint64_t high = 0;
    if (at)
        *at = 0;
    if (!js || !store)
        return jsd__err(err, JSD_ERR_INVALID, "redeliver from the inbox: no connection or store");
    if (!jsd__stream_name_valid(stream, err) || !jsd__stream_name_valid(durable, err))
        return JSD_ERR_INVALID;
    jsd_status st = jsd_store_inbox_high_water(store, stream, durable, &high);
    if (st != JSD_OK)
        return jsd__err(err, st, "reading the inbox high-water mark of %s/%s: %s", stream, durable,
                        jsd_store_errmsg(store));
    /* The store's recorded floor is as old as the store: every delivery at
     * or below it was committed before it was recorded, so is in the
     * restored store (see the DESIGN "where a lost durable resumes"). */
    char why[400];
    uint64_t start = 0;
    if ((st = jsd__durable_lost_start(store, stream, durable, high, &start, why, sizeof(why),
                                      err)) != JSD_OK)
        return st;
    if ((st = rewind_to(js, stream, durable, start, err)) != JSD_OK)
        return st;
    JSD_WARN("consumer",
             "%s/%s: durable re-created at stream sequence %" PRIu64
             ", %s; what the inbox holds is answered as duplicates, the rest applied",
             stream, durable, start, why);
    if (at)
        *at = start;
    return JSD_OK;
}

/* DESIGN (a durable ahead of a running consumer). The server may lose the
 * stream's tail under a running consumer (a restart on a store that lost
 * its last writes): its fetches then only time out. So an idle poll looks,
 * at most every AHEAD_LOOK_EVERY ms and never while deliveries flow (two
 * requests: consumer info, stream info), whether the durable is ahead of
 * its stream. Ahead: logged at error once, counted
 * (jsd_consumer_durable_ahead_total), durable_ahead set for /readyz, and
 * with the provisioned settings (opts.restore) re-created at once at the
 * sequence the DESIGN above chooses; without them the consumer keeps
 * looking and repeats the error once a minute. */
void jsd__durable_ahead(jsd_consumer *c)
{
    int64_t now = jsd__mono_ms();
    if (now - c->ahead_look_ms < AHEAD_LOOK_EVERY && c->ahead_look_ms != 0)
        return;
    c->ahead_look_ms = now;
    if (!c->nc || natsConnection_Status(c->nc) != NATS_CONN_STATUS_CONNECTED ||
        atomic_load(&c->draining))
        return;
    jsd_durable_position p;
    jsd_error e;
    jsd_error_clear(&e);
    if (jsd_durable_position_get(c->conn, NULL, c->stream, c->durable, &p, &e) != JSD_OK)
        return; /* a missing durable is jsd__durable_lost's */
    if (!p.ahead) {
        if (c->ahead) {
            c->ahead = false;
            STAT_SET(c, durable_ahead, 0);
            JSD_INFO("consumer", "%s/%s: the durable is no longer ahead of its stream", c->stream,
                     c->durable);
        }
        return;
    }
    if (!c->ahead) {
        c->ahead = true;
        c->ahead_said_ms = now;
        STAT_SET(c, durable_ahead, 1);
        jsd_counter_add(c->m_ahead, 1);
        JSD_ERROR("consumer",
                  "%s/%s: durable \"%s\" is ahead of its stream: ack floor %" PRIu64
                  ", delivered %" PRIu64 ", but the stream ends at %" PRIu64
                  " (the server lost the stream's tail); the sequences it hands out again would "
                  "never be delivered; %s",
                  c->stream, c->durable, c->durable, p.ack_floor, p.delivered, p.stream_last,
                  c->has_restore ? "re-creating it at the first sequence that may be new"
                                 : "nothing new is consumed and /readyz fails until it is "
                                   "re-created: restart with consume --topology FILE");
    } else if (!c->has_restore && now - c->ahead_said_ms >= 60000) {
        c->ahead_said_ms = now;
        JSD_ERROR("consumer",
                  "%s/%s: durable \"%s\" is still ahead of its stream (ack floor %" PRIu64
                  ", stream ends at %" PRIu64 "); restart with consume --topology FILE",
                  c->stream, c->durable, c->durable, p.ack_floor, p.stream_last);
    }
    if (!c->has_restore)
        return;
    uint64_t at = jsd__durable_resume_seq(c->conn, c->store, c->stream, c->durable, &p);
    if (jsd__durable_rewind(c->conn, c->store, c->stream, c->durable, at, &e) != JSD_OK) {
        /* refused (permissions, limits): said at once, then once a minute */
        if (!c->ahead_failed || now - c->ahead_said_ms >= 60000) {
            c->ahead_said_ms = now;
            JSD_ERROR("consumer",
                      "%s/%s: re-creating the durable ahead of its stream failed: %s; nothing "
                      "new is consumed and /readyz fails until it is re-created",
                      c->stream, c->durable, e.msg);
        }
        c->ahead_failed = true;
        return;
    }
    c->ahead_failed = false;
    c->ahead = false;
    c->floor_noted = at > 0 ? at - 1 : 0; /* the reset's: what the new durable raises */
    pthread_mutex_lock(&c->mu);
    c->stats.durable_ahead = 0;
    c->stats.durables_rewound++;
    pthread_mutex_unlock(&c->mu);
    JSD_WARN("consumer",
             "%s/%s: durable \"%s\" re-created at stream sequence %" PRIu64
             " (the stream ends at %" PRIu64 ", its old ack floor was %" PRIu64 ")",
             c->stream, c->durable, c->durable, at, p.stream_last, p.ack_floor);
}

/* DESIGN (a running consumer records its durable's floor). Every
 * FLOOR_NOTE_EVERY ms between batches, and once at a clean stop, one
 * consumer-info request reads the durable's ack floor, and the store
 * records it when it rose since the last record (one small upsert; never
 * per message). Not while the durable is known to be ahead of its stream:
 * that floor counts sequences the stream lost. A failure (the server or the
 * store away) is said at warn once until a record succeeds again and costs
 * nothing else: a lost durable then resumes after an older floor, lower,
 * which only answers more deliveries from the inbox. */
void jsd__durable_floor_note(jsd_consumer *c, bool at_stop)
{
    int64_t now = jsd__mono_ms();
    if (!c->store || c->ahead || c->missing)
        return;
    if (!at_stop && c->floor_note_ms != 0 && now - c->floor_note_ms < FLOOR_NOTE_EVERY)
        return;
    c->floor_note_ms = now;
    if (!c->nc || natsConnection_Status(c->nc) != NATS_CONN_STATUS_CONNECTED)
        return;
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    jsOptions o;
    jsOptions_Init(&o);
    o.Wait = 1000;
    natsStatus s = js_GetConsumerInfo(&ci, c->js, c->stream, c->durable, &o, &jerr);
    if (s != NATS_OK)
        return; /* a missing durable or an outage is the fetch's to see */
    uint64_t floor = ci->AckFloor.Stream;
    jsConsumerInfo_Destroy(ci);
    if (floor <= c->floor_noted)
        return;
    if (jsd_store_durable_floor_record(c->store, c->stream, c->durable, floor) != JSD_OK) {
        if (!c->floor_failed)
            JSD_WARN("consumer",
                     "%s/%s: recording the durable's ack floor %" PRIu64
                     " in the store failed: %s; retried every %d s (if the durable is lost "
                     "meanwhile it resumes after the floor recorded before)",
                     c->stream, c->durable, floor, jsd_store_errmsg(c->store),
                     FLOOR_NOTE_EVERY / 1000);
        c->floor_failed = true;
        return;
    }
    if (c->floor_failed)
        JSD_INFO("consumer", "%s/%s: the durable's ack floor is recorded again (%" PRIu64 ")",
                 c->stream, c->durable, floor);
    c->floor_failed = false;
    c->floor_noted = floor;
}
