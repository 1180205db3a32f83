/*
 * relay_batch — the relay's atomic batches (nats-server 2.12+, a stream with
 * allow_atomic; src/atomic.h): the effects of one claim that go to one stream
 * are published as one batch, stored all or nothing with one PubAck (one
 * fsync on a server that syncs every write), instead of one publication and
 * one PubAck each. Each answer has its handling (DESIGN 13 in relay.c):
 * the PubAck gives every effect its receipt (the batch's sequences are
 * consecutive and in order); a refusal that names a cause in the batch (an
 * id the stream already holds, a row the stream refuses) sends the batch's
 * effects one by one, so duplicates collect their acknowledgements and a bad
 * row fails alone; a stream that does not take batches is remembered and
 * published one by one; "too many batches in flight" and "incomplete" send
 * the whole batch again with a fresh batch id; anything that may have stored
 * it (no PubAck) leaves every effect UNKNOWN, resolved by the same-id retry.
 */
#include <string.h>

#include "atomic.h"
#include "conn_int.h"
#include "jsd_int.h"
#include "pubengine.h"
#include "relay_int.h"

#define ATOMIC_OFF_MS 600000 /* a stream that refused batches is tried again after this */
/* Attempts answered 10176 before the batch goes one by one: a publication
 * lost on the way (a leader change) is worth one more; a row the stream
 * refuses (too large, ...) is dropped by the server on arrival and makes
 * every attempt incomplete, so after that it must fail alone. */
#define INCOMPLETE_TRIES 2
#define INFLIGHT_BASE_MS 10  /* 10210: first back-off, doubled per try ... */
#define INFLIGHT_CAP_MS  250 /* ... up to this */

#define JS_ATOMIC_INCOMPLETE 10176 /* a publication of the batch is missing */
#define JS_ATOMIC_INFLIGHT   10210 /* too many batches in flight on the stream (50) */

const char *const jsd__relay_fallback_names[FB_N] = {
    [FB_NOT_ALLOWED] = "not_allowed",
    [FB_DISABLED] = "disabled",
    [FB_UNSUPPORTED_HEADER] = "unsupported_header",
    [FB_DUPLICATE] = "duplicate",
    [FB_INCOMPLETE] = "incomplete",
    [FB_REFUSED] = "refused",
};

/* ---- which streams take batches ---------------------------------------------------- */

static size_t off_find(jsd_relay *r, const char *stream)
{
    for (size_t i = 0; i < r->n_atomic_off; i++)
        if (!strcmp(r->atomic_off[i].stream, stream))
            return i;
    return SIZE_MAX;
}

/* Remember that stream does not take batches (why) for ATOMIC_OFF_MS. */
static void atomic_off(jsd_relay *r, const char *stream, fallback_reason why)
{
    size_t i = off_find(r, stream);
    if (i == SIZE_MAX) {
        if (r->n_atomic_off == JSD_ARRAY_LEN(r->atomic_off))
            r->n_atomic_off = 0; /* forget them all: each costs a look or a refused batch */
        i = r->n_atomic_off++;
        jsd__strlcpy(r->atomic_off[i].stream, stream, sizeof(r->atomic_off[i].stream));
    }
    r->atomic_off[i].until_mono = jsd__mono_ms() + ATOMIC_OFF_MS;
    r->atomic_off[i].why = (uint8_t)why;
}

bool jsd__relay_atomic_ok(jsd_relay *r, const char *stream, bool allow_atomic, fallback_reason *why)
{
    *why = FB_N;
    if (!r->breqs)
        return false;
    size_t i = off_find(r, stream);
    if (i != SIZE_MAX) {
        if (jsd__mono_ms() < r->atomic_off[i].until_mono) {
            *why = (fallback_reason)r->atomic_off[i].why;
            return false;
        }
        r->atomic_off[i] = r->atomic_off[--r->n_atomic_off]; /* look again */
    }
    if (!allow_atomic) {
        atomic_off(r, stream, FB_NOT_ALLOWED);
        JSD_INFO(COMP,
                 "stream %s does not allow atomic batches (no allow_atomic in its config, or a "
                 "server before 2.12): its effects are published one by one",
                 stream);
        *why = FB_NOT_ALLOWED;
        return false;
    }
    return true;
}

void jsd__relay_fallback(jsd_relay *r, fallback_reason why, const char *stream, size_t n,
                         const char *detail)
{
    if (r->mstd)
        jsd_counter_add(r->m_fallback[why], 1);
    /* a stream that does not take batches is counted for every claim and
     * said once (jsd__relay_atomic_ok) */
    if (detail)
        JSD_INFO(COMP,
                 "%zu effect(s) for stream %s go one by one instead of in an atomic batch (%s): %s",
                 n, stream, jsd__relay_fallback_names[why], detail ? detail : "");
}

/* ---- sending ----------------------------------------------------------------------- */

void jsd__relay_submit_one(jsd_relay *r, slot *sl, const char *stream)
{
    rbatch *b = sl->b;
    const jsd__claimed *e = &b->eb.items[sl->idx];
    jsd__pub_req req = {
        .subject = e->subject,
        .msg_id = e->msg_id,
        .expected_stream = stream,
        .headers = e->headers,
        .n_headers = e->n_headers,
        .payload = e->payload,
        .len = e->len,
        .user = sl,
    };
    jsd_publish_result res;
    if (jsd__pubengine_submit(r->eng, &req, &res)) {
        sl->state = SLOT_PENDING;
        b->pending++;
        r->in_flight++;
        return;
    }
    jsd__relay_settle(r, sl, &res, e);
    if (res.outcome == JSD_OUTCOME_UNAVAILABLE)
        r->broker_out = true;
}

/* Every slot of g takes the same result (not ACCEPTED). */
static void settle_all(jsd_relay *r, bgroup *g, const jsd_publish_result *res)
{
    rbatch *b = g->b;
    for (uint32_t k = 0; k < g->n; k++) {
        slot *sl = &b->slots[b->gidx[g->first + k]];
        jsd__relay_settle(r, sl, res, &b->eb.items[sl->idx]);
    }
    if (res->outcome == JSD_OUTCOME_UNAVAILABLE)
        r->broker_out = true;
}

/* g's slots one by one (they are pending no more as a batch). */
static void one_by_one(jsd_relay *r, bgroup *g)
{
    rbatch *b = g->b;
    for (uint32_t k = 0; k < g->n; k++) {
        slot *sl = &b->slots[b->gidx[g->first + k]];
        sl->state = SLOT_UNSENT;
        jsd__relay_submit_one(r, sl, g->stream);
    }
}

/* Send g (again): its slots count as in flight once, from the first try to
 * the outcome. */
static void send_group(jsd_relay *r, bgroup *g)
{
    rbatch *b = g->b;
    for (uint32_t k = 0; k < g->n; k++) {
        const jsd__claimed *e = &b->eb.items[b->gidx[g->first + k]];
        r->breqs[k] = (jsd__pub_req){
            .subject = e->subject,
            .msg_id = e->msg_id,
            .expected_stream = g->stream,
            .headers = e->headers,
            .n_headers = e->n_headers,
            .payload = e->payload,
            .len = e->len,
        };
    }
    /* every attempt of a batch ends within one publish deadline of its
     * first, so the lease still outlives the publication (DESIGN 3) */
    int64_t left = (int64_t)r->o.publish_deadline_ms - (jsd__mono_ms() - g->first_sent_mono);
    r->breqs[0].deadline_ms = (int)JSD_MAX(left, (int64_t)1);
    jsd_publish_result res;
    size_t bad = SIZE_MAX;
    g->tries++;
    if (jsd__pubengine_submit_batch(r->eng, r->breqs, g->n, g, &res, &bad)) {
        /* the crash test wants the commit on the wire, not in nats.c's
         * coalescing buffer */
        if (jsd__crash_armed("relay.batch_after_commit_publish"))
            jsd__conn_write_now(r->conn);
        JSD_CRASH_POINT("relay.batch_after_commit_publish");
        return;
    }
    /* not sent: the slots are pending no more */
    b->pending -= g->n;
    r->in_flight -= g->n;
    if (res.outcome == JSD_OUTCOME_REJECTED) {
        /* one publication the engine refuses (e.g. too large with the batch's
         * headers): alone, it fails alone, and the others go out */
        char why[300];
        jsd__snprintf(why, sizeof(why), "publication %zu: %s", bad + 1, res.reason);
        jsd__relay_fallback(r, FB_REFUSED, g->stream, g->n, why);
        one_by_one(r, g);
        return;
    }
    settle_all(r, g, &res);
}

void jsd__relay_submit_groups(jsd_relay *r, rbatch *b, char (*streams)[JSD_STREAM_NAME_MAX + 1],
                              size_t n_streams)
{
    size_t at = 0;
    b->n_groups = 0;
    for (size_t s = 0; s < n_streams; s++) {
        bgroup *g = NULL;
        /* Too few for a batch (jsd_relay_opts.atomic_min): one by one, the
         * faster and sooner way for a handful (a choice, not a fallback). */
        size_t members = 0;
        for (size_t i = 0; i < b->eb.n; i++)
            members += b->slots[i].sgroup == s + 1;
        if (members < (size_t)r->o.atomic_min) {
            for (size_t i = 0; i < b->eb.n; i++) {
                slot *sl = &b->slots[i];
                if (sl->sgroup != s + 1)
                    continue;
                sl->sgroup = 0;
                jsd__relay_submit_one(r, sl, streams[s]);
            }
            continue;
        }
        for (size_t i = 0; i < b->eb.n; i++) {
            slot *sl = &b->slots[i];
            if (sl->sgroup != s + 1)
                continue;
            sl->sgroup = 0;
            if (!g || g->n == JSD__BATCH_MAX) {
                if (b->n_groups == JSD__RELAY_GROUPS_MAX) {
                    /* more streams than groups: this one alone (the claim
                     * holds one effect per ordering key, so no order
                     * between the groups and it is at stake) */
                    jsd__relay_submit_one(r, sl, streams[s]);
                    continue;
                }
                g = &b->groups[b->n_groups++];
                memset(g, 0, sizeof(*g));
                g->ref = REF_GROUP;
                g->b = b;
                g->first = (uint32_t)at;
                jsd__strlcpy(g->stream, streams[s], sizeof(g->stream));
            }
            b->gidx[at++] = sl->idx;
            g->n++;
            sl->state = SLOT_PENDING;
        }
    }
    int64_t now = jsd__mono_ms();
    for (size_t k = 0; k < b->n_groups; k++) {
        bgroup *g = &b->groups[k];
        g->first_sent_mono = now;
        b->pending += g->n;
        r->in_flight += g->n;
        send_group(r, g);
    }
}

/* ---- answers ----------------------------------------------------------------------- */

static void queue_resend(jsd_relay *r, bgroup *g, int64_t delay_ms)
{
    if (r->mstd)
        jsd_counter_add(r->m_resends, 1);
    g->resend_at_mono = jsd__mono_ms() + delay_ms;
    g->next_resend = NULL;
    bgroup **pp = &r->resend_head;
    while (*pp)
        pp = &(*pp)->next_resend;
    *pp = g;
}

void jsd__relay_group_done(jsd_relay *r, bgroup *g, const jsd_publish_result *res)
{
    rbatch *b = g->b;
    if (res->outcome == JSD_OUTCOME_ACCEPTED) {
        /* the batch's messages are stored in order at consecutive sequences
         * ending with the commit's */
        jsd_publish_result one = *res;
        one.receipt.duplicate = false;
        uint64_t first = res->receipt.seq - g->n + 1;
        for (uint32_t k = 0; k < g->n; k++) {
            slot *sl = &b->slots[b->gidx[g->first + k]];
            one.receipt.seq = first + k;
            jsd__relay_settle(r, sl, &one, &b->eb.items[sl->idx]);
        }
        if (r->mstd)
            jsd_counter_add(r->m_atomic_batches, 1);
        atomic_fetch_add(&r->n_atomic_batches, 1);
        atomic_fetch_add(&r->n_atomic_effects, g->n);
        b->pending -= g->n;
        r->in_flight -= g->n;
        JSD_CRASH_POINT("relay.batch_before_receipts");
        return;
    }
    int code = res->outcome == JSD_OUTCOME_FAILED ? res->js_err_code : 0;
    if (code == JS_ATOMIC_INFLIGHT &&
        r->o.publish_deadline_ms > jsd__mono_ms() - g->first_sent_mono) {
        /* the server's 50 batches per stream are taken (by every relay):
         * nothing was stored; the same batch again, after a pause */
        int64_t delay = INFLIGHT_BASE_MS << JSD_MIN(g->tries - 1, 5);
        queue_resend(r, g, JSD_MIN(delay, (int64_t)INFLIGHT_CAP_MS));
        return;
    }
    if (code == JS_ATOMIC_INCOMPLETE && g->tries < INCOMPLETE_TRIES &&
        r->o.publish_deadline_ms > jsd__mono_ms() - g->first_sent_mono) {
        /* a publication went missing (a dropped write, a leader change):
         * nothing was stored; the whole batch again with a fresh id */
        queue_resend(r, g, 0);
        return;
    }
    b->pending -= g->n;
    r->in_flight -= g->n;
    if (code == JS_ATOMIC_INFLIGHT) {
        /* the pauses took a publish deadline: nothing was stored, so the
         * effects wait (no attempt spent) like any broker overload */
        jsd_publish_result rel = *res;
        rel.outcome = JSD_OUTCOME_RETRYABLE;
        JSD_INFO(COMP,
                 "an atomic batch of %u effect(s) for stream %s found the server's batches "
                 "in flight taken for %d ms; released, to be claimed again",
                 g->n, g->stream, r->o.publish_deadline_ms);
        settle_all(r, g, &rel);
        return;
    }
    fallback_reason why = FB_N;
    if (code == JSD__JS_ATOMIC_DUPLICATE)
        why = FB_DUPLICATE;
    else if (code == JSD__JS_ATOMIC_DISABLED)
        why = FB_DISABLED;
    else if (code == JSD__JS_ATOMIC_UNSUPP_HDR)
        why = FB_UNSUPPORTED_HEADER;
    else if (code == JS_ATOMIC_INCOMPLETE)
        why = FB_INCOMPLETE;
    else if ((res->outcome == JSD_OUTCOME_FAILED && res->status_code != 503) ||
             res->outcome == JSD_OUTCOME_DENIED)
        why = FB_REFUSED; /* something in the batch (a row, a subject the
                             user may not publish to): one by one, it fails
                             alone */
    if (why == FB_N) {
        /* no responders, or UNKNOWN (no PubAck: the batch may be
         * stored, whole): each effect takes the outcome, and an UNKNOWN one
         * is retried with its own id, collapsed by the duplicate window
         * (one by one, or a new batch answered 10201) */
        settle_all(r, g, res);
        return;
    }
    if (why == FB_DISABLED || why == FB_UNSUPPORTED_HEADER)
        atomic_off(r, g->stream, why);
    jsd__relay_fallback(r, why, g->stream, g->n, res->reason);
    one_by_one(r, g);
}

void jsd__relay_resend_due(jsd_relay *r)
{
    if (!r->resend_head)
        return;
    bool stopping = atomic_load(&r->stop) != 0;
    int64_t now = jsd__mono_ms();
    bgroup **pp = &r->resend_head;
    while (*pp) {
        bgroup *g = *pp;
        if (!stopping && g->resend_at_mono > now) {
            pp = &g->next_resend;
            continue;
        }
        *pp = g->next_resend;
        if (stopping) {
            jsd_publish_result rel;
            memset(&rel, 0, sizeof(rel));
            rel.outcome = JSD_OUTCOME_RETRYABLE;
            jsd__snprintf(rel.reason, sizeof(rel.reason),
                          "relay stopping before the batch was sent again; nothing was stored");
            g->b->pending -= g->n;
            r->in_flight -= g->n;
            settle_all(r, g, &rel);
        } else {
            send_group(r, g);
        }
    }
    /* only batches waiting for their pause: do not spin */
    if (r->resend_head && jsd__pubengine_inflight(r->eng) == 0) {
        int64_t wait = r->resend_head->resend_at_mono - jsd__mono_ms();
        for (bgroup *g = r->resend_head; g; g = g->next_resend)
            wait = JSD_MIN(wait, g->resend_at_mono - jsd__mono_ms());
        if (wait > 0)
            jsd__sleep_ms((int)JSD_MIN(wait, 5));
    }
}
