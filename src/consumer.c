/*
 * consumer — the durable consumer (IN-1..5): a bound JetStream pull consumer
 * whose deliveries are applied in one store transaction per batch and settled
 * with the broker only after that transaction is durable. This file creates,
 * binds and destroys it and runs the loop (jsd_consumer_poll: sweeps of
 * unpublished dead letters and of replay requests, fetch, apply, settle);
 * the steps live in consumer_fetch.c, consumer_apply.c, consumer_ack.c,
 * consumer_bury.c and consumer_replay.c, the durable's checks in
 * consumer_durable.c, the handler's view of a delivery in delivery.c, all
 * sharing consumer_int.h.
 *
 * DESIGN (crash ordering). One batch:
 *   fetch up to N (N <= the durable's max_ack_pending)
 *   BEGIN
 *     (the fast pass of consumer_apply.c takes the common batch — all fresh,
 *      every handler COMMIT — with one inbox statement for the batch and no
 *      savepoint; anything else is rolled back and decided as below)
 *     per delivery:
 *       inbox lookup (stream, durable, stream seq), then by Nats-Msg-Id
 *         found        -> no handler; settle as its recorded outcome
 *       deliveries past the park threshold -> poison record + inbox(PARK)
 *       envelope check fails, or the delivery breaks the limits
 *         (consumer_apply.c)            -> poison record + inbox(POISON)
 *       SAVEPOINT; handler
 *         COMMIT -> inbox(COMMIT, msg id); RELEASE
 *         RETRY  -> ROLLBACK TO; NAK(delay) after the commit
 *                   (on the park threshold: poison record + inbox(PARK))
 *         POISON -> ROLLBACK TO; poison record + inbox(POISON)
 *   COMMIT                                 [crash: ingress.after_commit]
 *   dead letters: publish death envelope (id = f(stream, seq)), wait PubAck,
 *     mark the poison record published     [crash: poison.after_dlq_publish]
 *     then TERM (poison) or ACK (parked), whether the publish worked or not
 *   ACK every committed delivery: +ACK requests on the reply subjects, all
 *   sent first, then every confirmation awaited with one deadline
 *                                          [crash: ingress.after_ack]
 *   NAK(delay) the rest.
 * Why it is safe: nothing is ACKed or TERMed before the commit that records
 * it. A crash or failed commit before COMMIT leaves every delivery to be
 * redelivered (a failed commit NAKs with a delay: a plain NAK ignores
 * BackOff). A crash after COMMIT redelivers deliveries whose inbox rows exist:
 * the lookup finds them, the handler does not run again, and only the
 * settlement is repeated: the ACK, or the death envelope (its stable id makes
 * the dead-letter stream collapse the repeat) then TERM/ACK. The inbox, not
 * the broker, decides "applied once": AckSync answers OK to a repeated ACK.
 *
 * Store outages (IN-1). A failure that says the store cannot take the batch
 * at all — JSD_ERR_CONNECT (unreachable, or a COMMIT whose outcome is
 * unknown), _FULL, _READONLY, _BUSY, _IO, _TIMEOUT, _NOMEM, whether seen by
 * our statements or by a handler's own SQL (the native handle's state after a
 * handler that did not commit) — is not a handler failure and costs no
 * delivery attempt: the batch is not NAKed but held. Every held delivery is
 * kept alive with +WPI every third of the effective ack wait (progress does
 * not count a delivery), no further batch is fetched (the fetcher holds at
 * most the one batch it pulled ahead, kept alive the same way), and the whole
 * batch is applied again from its start in a fresh transaction, with a
 * backoff of 100 ms doubling to 5 s, until a COMMIT succeeds. Re-running the
 * handlers is safe: the earlier transaction never committed (or, with an
 * unknown outcome, did: the inbox lookups then find its rows and no handler
 * runs). So no delivery count grows during an outage, and no message can
 * reach the park threshold, let alone max_deliver, because of one. A drain
 * while holding leaves the held deliveries unacked (each costs one delivery
 * when the server redelivers it after the ack wait) and jsd_consumer_run
 * reports the outage, never success. What remains: a process that crashes
 * (or is restarted) again and again during an outage spends one delivery per
 * fetch that it never settles; a handler that fails for its own reason while
 * the store is out is retried as an outage until the store answers.
 *
 * Dead letters that cannot be published (DLQ-1). The poison record is
 * committed with the batch, before any settlement, so once the COMMIT
 * returned the store holds everything needed to publish the death envelope
 * again. A failed publish (dead-letter stream full, missing, unreachable) is
 * therefore not the message's failure: the delivery is settled as if the
 * publish had worked (TERM, or ACK for a park), and the record, still without
 * a dlq_seq, is republished from the store by jsd__bury_sweep: on every poll once
 * due (250 ms after a failure, then a backoff doubling to 30 s, and every
 * minute otherwise, which also picks up records other processes left), and at
 * once after a batch whose dead letter was published (the stream answers
 * again). The envelope's Nats-Msg-Id is f(stream, seq) from the record, so a
 * repeat inside the duplicate window is collapsed, and a record whose
 * dlq_seq is set is never published again. Unpublished records are counted
 * (consumer stats, jsd_poison_unpublished, `jsdurable status`) and warned
 * about on every failed sweep. The retry needs a consumer bound to that
 * durable to run; until one does, `status` shows them.
 *
 * Park threshold P (DLQ-2): the durable's max_deliver M leaves one spare
 * delivery, P = M - 1. The handler runs on deliveries 1..P; when it fails on
 * delivery P the message is parked with that error; delivery M (after a crash
 * or a failed park) is parked without running the handler. Deliveries are
 * counted by the server (message metadata), never from advisories.
 *
 * nats.c 3.4.1 notes: the durable is bound (jsSubOptions.Stream/Consumer),
 * never created by the subscription, and the subscription is Destroyed, not
 * Unsubscribed/Drained (those delete a durable the library created); consumer
 * info comes from js_GetConsumerInfo(stream, durable).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "conn_int.h"
#include "consumer_int.h"
#include "natsmsg.h"
#include "store/store.h"
#include "subject.h"

/* ---- create / destroy ------------------------------------------------------------- */

jsd_status jsd__cerr(jsd_consumer *c, jsd_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    jsd__verr(&c->err, st, fmt, ap);
    va_end(ap);
    return st;
}

static jsd_status bind(jsd_consumer *c)
{
    jsSubOptions so;
    jsErrCode jerr = 0;

    jsSubOptions_Init(&so);
    so.Stream = c->stream;
    so.Consumer = c->durable;
    natsStatus s = js_PullSubscribe(&c->sub, c->js, NULL, c->durable, NULL, &so, &jerr);
    if (s != NATS_OK)
        return jsd__err_nats(&c->err, s, jerr, "bind to the durable");
    /* The connection's per-subscription pending limits (max_pending_msgs,
     * max_pending_bytes) bound what fetched deliveries may buffer here. */
    int lim_msgs = 0;
    int64_t lim_bytes = 0;
    jsd__conn_pending_limits(c->conn, &lim_msgs, &lim_bytes);
    s = natsSubscription_SetPendingLimits(c->sub, lim_msgs,
                                          (int)JSD_MIN(lim_bytes, (int64_t)INT32_MAX));
    if (s != NATS_OK)
        return jsd__err_nats(&c->err, s, 0, "pending limits of the durable's subscription");
    return jsd__ack_create(&c->ack, c->nc, c->stream, c->durable, c->ack_timeout_ms,
                           c->m->deliveries[JSD_RESULT_COMMIT], &c->mu, &c->stats, &c->err);
}

jsd_status jsd_consumer_create(jsd_consumer **out, jsd_store *store, jsd_conn *conn,
                               const jsd_consumer_opts *o, jsd_error *err)
{
    jsd_consumer *c = NULL;
    jsd_status st;

    if (!out || !store || !conn || !o)
        return jsd__err(err, JSD_ERR_INVALID, "consumer create: missing argument");
    *out = NULL;
    if ((st = jsd__consumer_check_opts(o, err)) != JSD_OK)
        return st;

    if (!(c = jsd__calloc(1, sizeof(*c))))
        return jsd__err(err, JSD_ERR_NOMEM, "consumer create: out of memory");
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->fmu, NULL);
    jsd__cond_init_mono(&c->fcv);
    atomic_init(&c->draining, false);
    atomic_init(&c->in_hand, 0);
    c->store = store;
    c->conn = conn;
    c->nc = jsd__conn_nats(conn);
    c->js = jsd__conn_js(conn);
    c->fmt = o->payload_format;
    c->m = o->metrics ? jsd_metrics_std_of(o->metrics) : jsd_metrics_default_std();
    {
        /* Series of the consumer's own; a registry that refuses them (full)
         * leaves the handles NULL and the updates no-ops. */
        jsd_metrics *reg = o->metrics ? o->metrics : jsd_metrics_default();
        if (reg) {
            jsd__metrics_feeds(reg, JSD__FEED_CONSUMER);
            jsd_metrics_register(reg, JSD_METRIC_COUNTER, "jsd_consumer_store_outages_total",
                                 "store outages the consumer held its batch through", NULL, NULL,
                                 NULL, 0, &c->m_outages, NULL);
            jsd_metrics_register(reg, JSD_METRIC_GAUGE, "jsd_consumer_held_deliveries",
                                 "deliveries held (kept alive, unapplied) while the store is out",
                                 NULL, NULL, NULL, 0, &c->m_held, NULL);
            for (int k = 0; k < CONT__COUNT; k++)
                jsd_metrics_register(
                    reg, JSD_METRIC_COUNTER, "jsd_consumer_handler_contention_total",
                    "handler statements that failed on contention (serialization, "
                    "deadlock, lock or statement timeout, busy, connection): "
                    "retried or held, no delivery attempt spent",
                    "kind", jsd__contention_kinds[k], NULL, 0, &c->m_contention[k], NULL);
            jsd_metrics_register(reg, JSD_METRIC_GAUGE, "jsd_consumer_hold_overdue",
                                 "1 while the consumer's batch has been held longer than its "
                                 "hold alert",
                                 NULL, NULL, NULL, 0, &c->m_overdue, NULL);
            jsd_metrics_register(reg, JSD_METRIC_GAUGE, "jsd_poison_unpublished",
                                 "poison records stored but not yet in the dead-letter stream",
                                 NULL, NULL, NULL, 0, &c->m_dlq_unpublished, NULL);
            jsd_metrics_register(reg, JSD_METRIC_COUNTER, "jsd_dead_letters_deferred_total",
                                 "death envelopes that could not be published at settlement and "
                                 "were left to the retry from the store",
                                 NULL, NULL, NULL, 0, &c->m_dlq_deferred, NULL);
            jsd_metrics_register(reg, JSD_METRIC_COUNTER, "jsd_consumer_reused_sequences_total",
                                 "deliveries whose stream sequence the inbox had recorded for "
                                 "another message (a re-created stream, or lost broker writes): "
                                 "applied as new messages",
                                 NULL, NULL, NULL, 0, &c->m_reused, NULL);
            jsd_metrics_register(reg, JSD_METRIC_COUNTER, "jsd_consumer_durable_ahead_total",
                                 "times the durable was found ahead of its stream (ack floor "
                                 "past the stream's last sequence: the server lost its tail)",
                                 NULL, NULL, NULL, 0, &c->m_ahead, NULL);
        }
    }
    c->batch = o->batch > 0 ? o->batch : 0; /* 0: decided from the durable */
    c->fetch_wait_ms = o->fetch_wait_ms > 0 ? o->fetch_wait_ms : 500;
    c->ack_timeout_ms = o->ack_timeout_ms > 0 ? o->ack_timeout_ms : 5000;
    c->retry_delay_ms = o->retry_delay_ms > 0 ? o->retry_delay_ms : 1000;
    c->hold_alert_ms = o->hold_alert_ms != 0 ? o->hold_alert_ms : JSD__HOLD_ALERT_MS;
    c->cont_kind = CONT_NONE;
    c->stream = jsd__strdup(o->stream);
    c->durable = jsd__strdup(o->durable);
    {
        char def[JSD_SUBJECT_MAX + 64];
        jsd__consumer_default_dlq_subject(o, def, sizeof(def));
        c->dlq_subject = jsd__strdup(def);
    }
    if (!c->stream || !c->durable || !c->dlq_subject) {
        st = jsd__err(err, JSD_ERR_NOMEM, "consumer create: out of memory");
        goto fail;
    }
    if (o->restore) {
        c->has_restore = true;
        c->restore = *o->restore;
        c->restore.start_seq = 0;
        if (o->restore->filter_subject &&
            !(c->restore_filter = jsd__strdup(o->restore->filter_subject))) {
            st = jsd__err(err, JSD_ERR_NOMEM, "consumer create: out of memory");
            goto fail;
        }
        c->restore.filter_subject = c->restore_filter;
    }
    if (!jsd__subject_valid_exact(c->dlq_subject, err)) {
        st = JSD_ERR_CONFIG;
        if (err)
            err->status = st;
        goto fail;
    }
    if (o->n_accept_types) {
        if (!(c->types = jsd__calloc(o->n_accept_types, sizeof(char *)))) {
            st = jsd__err(err, JSD_ERR_NOMEM, "consumer create: out of memory");
            goto fail;
        }
        for (size_t i = 0; i < o->n_accept_types; i++, c->n_types++)
            if (!(c->types[i] = jsd__strdup(o->accept_types[i]))) {
                st = jsd__err(err, JSD_ERR_NOMEM, "consumer create: out of memory");
                goto fail;
            }
    }
    if (!c->nc || !c->js) {
        st = jsd__err(err, JSD_ERR_INVALID, "consumer create: connection without JetStream");
        goto fail;
    }
    if ((st = jsd__consumer_check_config(c, o)) != JSD_OK || (st = bind(c)) != JSD_OK) {
        jsd__err_copy(err, &c->err);
        goto fail;
    }
    if (jsd__fetch_start(c) != 0) {
        st = jsd__err(err, JSD_ERR_NOMEM, "consumer create: cannot start the fetcher thread");
        goto fail;
    }
    JSD_INFO("consumer",
             "bound to durable %s on stream %s (batch %d, park after %d deliveries, dead "
             "letters to %s in %s)",
             c->durable, c->stream, c->batch, c->park_at, c->dlq_subject, c->dlq_stream);
    *out = c;
    return JSD_OK;
fail:
    jsd_consumer_destroy(c);
    return st;
}

void jsd__batch_release(jsd_consumer *c)
{
    for (size_t i = 0; i < c->nd; i++) {
        jsMsgMetaData_Destroy(c->d[i].meta);
        jsd__msg_free(c->d[i].msg);
    }
    c->nd = 0;
    atomic_store(&c->in_hand, 0);
}

void jsd_consumer_destroy(jsd_consumer *c)
{
    if (!c)
        return;
    jsd__fetch_stop(c);
    if (c->ack)
        jsd__ack_collect(c->ack, true);
    jsd__batch_release(c);
    jsd__free(c->d);
    jsd__apply_free(c);
    /* Destroy, never Unsubscribe/Drain: those would delete the durable. */
    natsSubscription_Destroy(c->sub);
    jsd__ack_destroy(c->ack); /* drained first: no confirmation callback runs after */
    for (size_t i = 0; i < c->n_types; i++)
        jsd__free(c->types[i]);
    jsd__free(c->types);
    jsd__free(c->stream);
    jsd__free(c->durable);
    jsd__free(c->dlq_subject);
    jsd__free(c->restore_filter);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->fmu);
    pthread_cond_destroy(&c->fcv);
    jsd__free(c);
}

const char *jsd_consumer_errmsg(const jsd_consumer *c)
{
    return c ? c->err.msg : "";
}

const jsd_error *jsd_consumer_error(const jsd_consumer *c)
{
    return c ? &c->err : NULL;
}

const char *jsd_consumer_dlq_subject(const jsd_consumer *c)
{
    return c && c->dlq_subject ? c->dlq_subject : "";
}

const char *jsd_consumer_dlq_stream(const jsd_consumer *c)
{
    return c ? c->dlq_stream : "";
}

void jsd_consumer_begin_drain(jsd_consumer *c)
{
    if (c)
        atomic_store(&c->draining, true);
}

void jsd_consumer_stats_get(jsd_consumer *c, jsd_consumer_stats *out)
{
    if (!c || !out)
        return;
    pthread_mutex_lock(&c->mu);
    *out = c->stats;
    pthread_mutex_unlock(&c->mu);
}

jsd_status jsd_consumer_backlog(jsd_consumer *c, uint64_t *pending, uint64_t *in_flight)
{
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetConsumerInfo(&ci, c->js, c->stream, c->durable, NULL, &jerr);
    if (s != NATS_OK)
        return jsd__err_nats(&c->err, s, jerr, "consumer info");
    if (pending)
        *pending = ci->NumPending;
    if (in_flight)
        *in_flight = ci->NumAckPending > 0 ? (uint64_t)ci->NumAckPending : 0;
    jsConsumerInfo_Destroy(ci);
    return JSD_OK;
}

/* Settle a committed batch with the broker: the dead letters first (death
 * envelope, then TERM), then every ACK in one go (this batch's fresh commits
 * first, their confirmations move deliveries{result="commit"}; then the
 * answers from the inbox and the parked), and NAK the retries. */
static void settle(jsd_consumer *c)
{
    size_t n_commit = 0, n_dup = 0;
    bool any_dead = false;
    for (size_t i = 0; i < c->nd; i++) {
        if (c->d[i].state == D_ACK && c->d[i].fresh)
            n_commit++;
        if (c->d[i].state == D_POISON || c->d[i].state == D_PARK)
            any_dead = true;
        n_dup += c->d[i].dup;
    }
    STAT_ADD(c, committed, n_commit);
    STAT_ADD(c, duplicates, n_dup);
    jsd_counter_add(c->m->deliveries[JSD_RESULT_DUPLICATE], n_dup);
    if (any_dead)
        JSD_CRASH_POINT("poison.after_store_commit");

    jsd_delivery **acks = jsd__calloc(
        2 * c->nd, sizeof(*acks)); /* NOLINT(bugprone-sizeof-expression): an array of pointers */
    jsd_delivery **later = acks ? acks + c->nd : NULL;
    size_t na = 0, nl = 0;
    bool dlq_ok = false, dlq_failed = false;
    if (!acks)
        JSD_WARN("consumer",
                 "out of memory: the ACKs of %zu deliveries are not sent; they will be "
                 "redelivered and answered from the inbox",
                 c->nd);
    for (size_t i = 0; i < c->nd; i++) {
        jsd_delivery *d = &c->d[i];
        if (d->state == D_POISON || d->state == D_PARK) {
            jsd__bury(c, d, &dlq_ok, &dlq_failed);
            if (d->state == D_PARK && later)
                later[nl++] = d;
        } else if (d->state == D_ACK) {
            if (acks && d->fresh)
                acks[na++] = d;
            else if (later)
                later[nl++] = d;
        } else if (d->state == D_NAK) {
            char id[96];
            jsd__printable(d->msg_id ? d->msg_id : "", d->msg_id ? strlen(d->msg_id) : 0, id,
                           sizeof(id));
            JSD_WARN("consumer",
                     "%s/%s: sequence %" PRIu64 " (msg id \"%s\", delivery %" PRIu64
                     ") retried in %" PRId64 " ms: %s",
                     c->stream, c->durable, d->seq, id, d->deliveries,
                     d->delay_ms > 0 ? d->delay_ms : c->retry_delay_ms, d->reason);
            jsd__nak(c, d, d->delay_ms);
        }
    }
    size_t n_fresh = na;
    for (size_t i = 0; acks && i < nl; i++)
        acks[na++] = later[i];
    jsd__ack_send(c->ack, acks, na, n_fresh);
    jsd__free(acks);
    JSD_CRASH_POINT("ingress.after_ack");
    jsd__batch_release(c);
    jsd__bury_after(c, dlq_ok, dlq_failed);
}

static jsd_status poll_with(jsd_consumer *c, const jsd__handler *h, int *n)
{
    if (n)
        *n = 0;
    if (atomic_load(&c->draining)) {
        jsd__fetch_drain(c);
        jsd__ack_collect(c->ack, true);
        return JSD_ERR_STOPPED;
    }
    jsd__bury_sweep(c, false);
    jsd__replay_sweep(c, h, false);
    jsd__durable_floor_note(c, false);

    bool idle = false, committed = false;
    jsd_status st = jsd__fetch_batch(c, &idle);
    if (idle) { /* nothing came, or the fetch failed: settle the ACKs in flight */
        jsd__ack_collect(c->ack, true);
        if (st == JSD_OK)
            jsd__durable_ahead(c);
        return st;
    }
    if (st != JSD_OK)
        return st;
    if (n)
        *n = (int)c->nd;
    if (c->nd == 0)
        return JSD_OK;

    if ((st = jsd__apply(c, h, &committed)) != JSD_OK || !committed)
        return st;
    JSD_CRASH_POINT("ingress.after_commit");
    settle(c);
    return JSD_OK;
}

jsd_status jsd_consumer_poll(jsd_consumer *c, jsd_handler h, void *user, int *n)
{
    if (n)
        *n = 0;
    if (!c || !h)
        return JSD_ERR_INVALID;
    jsd__handler hh = {.one = h, .user = user};
    return poll_with(c, &hh, n);
}

jsd_status jsd_consumer_poll_batch(jsd_consumer *c, jsd_batch_handler h, void *user, int *n)
{
    if (n)
        *n = 0;
    if (!c || !h)
        return JSD_ERR_INVALID;
    jsd__handler hh = {.batch = h, .user = user};
    return poll_with(c, &hh, n);
}

static jsd_status run_with(jsd_consumer *c, const jsd__handler *h, bool until_idle)
{
    int64_t backoff = 50;
    while (!atomic_load(&c->draining)) {
        int got = 0;
        jsd_status st = poll_with(c, h, &got);
        if (st == JSD_ERR_STOPPED)
            break;
        if (st != JSD_OK) {
            if (st == JSD_ERR_INVALID || st == JSD_ERR_NOMEM)
                return st;
            if (jsd__conn_gone(c->conn)) {
                /* deliveries not acknowledged come again to the next run */
                jsd__fetch_drain(c);
                JSD_ERROR("consumer",
                          "%s/%s: the NATS connection is closed for good; the consumer stops",
                          c->stream, c->durable);
                return jsd__cerr(c, JSD_ERR_CONNECT,
                                 "the NATS connection of %s/%s is closed for good (reconnection "
                                 "attempts exhausted, or the server refused the credentials twice "
                                 "in a row); unacknowledged deliveries come again to a consumer "
                                 "on a new connection",
                                 c->stream, c->durable);
            }
            /* A durable deleted under us is said at once, not as a retry. */
            if (!jsd__durable_lost(c))
                JSD_WARN("consumer", "%s/%s: %s; retrying", c->stream, c->durable, c->err.msg);
            jsd__sleep_ms(backoff);
            backoff = JSD_MIN(backoff * 2, 2000);
            continue;
        }
        backoff = 50;
        if (got == 0 && until_idle) {
            uint64_t pending = 1, in_flight = 1;
            if (jsd_consumer_backlog(c, &pending, &in_flight) != JSD_OK) {
                jsd__durable_lost(c);
            } else if (pending == 0 && in_flight == 0) {
                /* Idle, but not done while dead letters wait in the store,
                 * nor before the replays asked for meanwhile are applied. */
                jsd__replay_sweep(c, h, true);
                jsd__bury_sweep(c, true);
                jsd_consumer_stats s;
                jsd_consumer_stats_get(c, &s);
                jsd__durable_floor_note(c, true);
                if (s.poison_unpublished == 0)
                    return JSD_OK;
                return jsd__cerr(c, JSD_ERR_NATS,
                                 "nothing is pending, but %" PRIu64 " poison records of %s/%s are "
                                 "not in the dead-letter stream %s; they are kept in the store and "
                                 "published by the next run once the stream takes them",
                                 s.poison_unpublished, c->stream, c->durable, c->dlq_stream);
            }
        }
    }
    jsd__fetch_drain(c);
    jsd__ack_collect(c->ack, true);
    jsd__durable_floor_note(c, true);
    if (c->held_at_stop)
        return c->err.status != JSD_OK ? c->err.status : JSD_ERR_STORE;
    return JSD_OK;
}

jsd_status jsd_consumer_run(jsd_consumer *c, jsd_handler h, void *user, bool until_idle)
{
    if (!c || !h)
        return JSD_ERR_INVALID;
    jsd__handler hh = {.one = h, .user = user};
    return run_with(c, &hh, until_idle);
}

jsd_status jsd_consumer_run_batch(jsd_consumer *c, jsd_batch_handler h, void *user, bool until_idle)
{
    if (!c || !h)
        return JSD_ERR_INVALID;
    jsd__handler hh = {.batch = h, .user = user};
    return run_with(c, &hh, until_idle);
}
