/*
 * consumer — durable ingress (IN-1..5): a bound JetStream pull consumer whose
 * deliveries are applied in one store transaction per batch and settled with
 * the broker only after that transaction is durable.
 *
 * DESIGN (crash ordering). One batch:
 *   fetch up to N (N <= the durable's max_ack_pending)
 *   BEGIN
 *     per delivery:
 *       inbox lookup (stream, durable, stream seq), then by Nats-Msg-Id
 *         found        -> no handler; settle as its recorded outcome
 *       deliveries past the park threshold -> poison record + inbox(PARK)
 *       envelope check fails            -> poison record + inbox(POISON)
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
 * a dlq_seq, is republished from the store by dlq_sweep: on every poll once
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
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>
#include <sqlite3.h>

#include "conn_int.h"
#include "ingress_int.h"
#include "store/store.h"
#include "subject.h"

enum {
    OUT_COMMIT = 1, /* inbox outcome codes, as stored */
    OUT_POISON = 2,
    OUT_PARK = 3,
    OUT_DUP = 4 /* a re-published duplicate caught by its message id */
};

typedef enum dstate {
    D_NONE = 0,
    D_ACK,    /* committed (now or earlier): ACK */
    D_NAK,    /* retry: NAK with delay */
    D_POISON, /* death envelope, then TERM */
    D_PARK    /* death envelope, then ACK */
} dstate;

struct jsd_delivery {
    jsd_consumer *c;
    natsMsg *msg;
    jsMsgMetaData *meta;
    const char *subject;
    const char *msg_id;
    const char *type;
    uint64_t seq;
    uint64_t deliveries;
    dstate state;
    bool fresh; /* its outcome was decided in this batch (not an inbox hit) */
    bool dup;   /* answered from the inbox */
    int64_t delay_ms;
    char reason[JSD__ERROR_TEXT_MAX + 1];
};

#define LASTERR_SLOTS 64
#define ACK_GENS      4

struct jsd_consumer {
    jsd_store *store;
    jsd_conn *conn;
    natsConnection *nc;
    jsCtx *js;
    char *stream, *durable, *dlq_subject;
    char dlq_stream[JSD_STREAM_NAME_MAX + 1];
    char **types;
    size_t n_types;
    jsd_payload_format fmt;
    int batch, fetch_wait_ms, ack_timeout_ms;
    int64_t retry_delay_ms;
    int park_at;          /* P: handler attempts before parking */
    int64_t ack_wait_ms;  /* the durable's shortest effective ack wait, read from the server */
    int64_t keepalive_ms; /* +WPI period for waiting deliveries: a third of ack_wait_ms */
    int max_deliver;      /* M from the server, -1 unlimited */

    /* Store outage: the batch in hand is held (kept alive, retried). */
    bool holding;
    int64_t hold_since_ms;
    size_t held_at_stop; /* deliveries left unacked by a drain during an outage */
    jsd_metric *m_outages, *m_held;

    /* Poison records whose death envelope is not yet in the dead-letter
     * stream are republished from the store (dlq_sweep). */
    int64_t sweep_at_ms, sweep_backoff_ms;
    jsd_metric *m_dlq_unpublished, *m_dlq_deferred;

    natsSubscription *sub;
    natsSubscription *ack_sub;
    char ack_prefix[96];
    uint64_t ack_gen;
    /* ACK generations (one per batch) whose confirmations are awaited. The
     * confirmation subscription's callback (nats.c's thread) only counts
     * replies here under amu; the consumer's thread settles the books. */
    pthread_mutex_t amu;
    pthread_cond_t acv;
    struct ackgen {
        uint64_t gen; /* 0: free */
        size_t sent, confirmed;
        size_t n_fresh, confirmed_fresh; /* ACKs [0, n_fresh) settle fresh commits */
        bool open;                       /* still sending */
        int64_t deadline;
    } gens[ACK_GENS];

    const jsd_metrics_std *m; /* counters: never NULL, its handles may be */

    /* The fetcher thread pulls the next batch while this one is applied.
     * It only moves a natsMsgList into `slot` under fmu; deliveries are
     * decided on the consumer's thread. */
    pthread_t fetcher;
    bool fetcher_started;
    pthread_mutex_t fmu;
    pthread_cond_t fcv;
    bool fstop, slot_full;
    natsMsgList slot;
    natsStatus slot_status;
    int64_t slot_wpi_ms; /* when the waiting batch was last kept alive */
    atomic_bool draining;
    atomic_size_t in_hand; /* deliveries of the batch in hand, for max_in_flight */
    pthread_mutex_t mu;
    jsd_consumer_stats stats;
    jsd_error err;

    struct {
        uint64_t seq;
        char text[256];
    } lasterr[LASTERR_SLOTS];

    jsd_delivery *d; /* the batch in hand */
    size_t nd, cap;
};

static void ack_collect(jsd_consumer *c, bool wait);
static bool store_outage(jsd_status st);
static void on_ack_reply(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *closure);

/* ---- dispositions --------------------------------------------------------------- */

jsd_disposition jsd_disposition_commit(void)
{
    jsd_disposition d = {JSD_DISPOSITION_COMMIT, 0, NULL};
    return d;
}

jsd_disposition jsd_disposition_retry(int64_t delay_ms, const char *reason)
{
    jsd_disposition d = {JSD_DISPOSITION_RETRY, delay_ms < 0 ? 0 : delay_ms, reason};
    return d;
}

jsd_disposition jsd_disposition_poison(const char *reason)
{
    jsd_disposition d = {JSD_DISPOSITION_POISON, 0, reason};
    return d;
}

/* ---- delivery accessors ------------------------------------------------------------ */

const char *jsd_delivery_subject(const jsd_delivery *d)
{
    return d ? d->subject : "";
}

const void *jsd_delivery_payload(const jsd_delivery *d, size_t *len)
{
    if (len)
        *len = d ? (size_t)natsMsg_GetDataLength(d->msg) : 0;
    return d ? natsMsg_GetData(d->msg) : NULL;
}

const char *jsd_delivery_header(const jsd_delivery *d, const char *name)
{
    const char *v = NULL;
    if (!d || !name || natsMsgHeader_Get(d->msg, name, &v) != NATS_OK)
        return NULL;
    return v;
}

const char *jsd_delivery_stream(const jsd_delivery *d)
{
    return d ? d->c->stream : "";
}

const char *jsd_delivery_consumer(const jsd_delivery *d)
{
    return d ? d->c->durable : "";
}

uint64_t jsd_delivery_stream_seq(const jsd_delivery *d)
{
    return d ? d->seq : 0;
}

uint64_t jsd_delivery_deliveries(const jsd_delivery *d)
{
    return d ? d->deliveries : 0;
}

const char *jsd_delivery_msg_id(const jsd_delivery *d)
{
    return d && d->msg_id ? d->msg_id : "";
}

const char *jsd_delivery_type(const jsd_delivery *d)
{
    return d && d->type ? d->type : "";
}

jsd_status jsd_delivery_progress(const jsd_delivery *d)
{
    if (!d || !d->msg)
        return JSD_ERR_INVALID;
    natsStatus s = natsMsg_InProgress(d->msg, NULL);
    return s == NATS_OK ? JSD_OK : jsd__err_nats(NULL, s, 0, "progress");
}

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
        JSD_WARN("ingress",
                 "durable \"%s\": backoff starts at %" PRId64 " ms, so JetStream waits that long "
                 "for the first ACK, not the ack wait %" PRId64 " ms",
                 durable, cfg->backoff_ms[0], cfg->ack_wait_ms);

    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = durable;
    cc.AckPolicy = js_AckExplicit;
    cc.DeliverPolicy = js_DeliverAll;
    cc.AckWait = cfg->ack_wait_ms * 1000000LL;
    cc.MaxDeliver = cfg->max_deliver;
    cc.MaxAckPending = cfg->max_ack_pending;
    cc.FilterSubject = cfg->filter_subject;
    cc.InactiveThreshold = cfg->inactive_threshold_ms * 1000000LL;
    if (cfg->n_backoff > 0) {
        /* The server wants max_deliver > len(backoff). */
        int n = cfg->n_backoff;
        if (cfg->max_deliver > 0 && n >= cfg->max_deliver)
            n = cfg->max_deliver - 1;
        for (int i = 0; i < n; i++)
            backoff_ns[i] = cfg->backoff_ms[i] * 1000000LL;
        cc.BackOff = backoff_ns;
        cc.BackOffLen = n;
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

/* ---- the fetcher thread ------------------------------------------------------------ */

/* Give back messages that were fetched but never handed out (drain, destroy):
 * a NAK without delay, so the durable offers them again at once. */
static void give_back(natsMsgList *l)
{
    for (int i = 0; i < l->Count; i++)
        if (l->Msgs[i])
            natsMsg_Nak(l->Msgs[i], NULL);
    natsMsgList_Destroy(l);
}

static void *fetcher_main(void *arg)
{
    jsd_consumer *c = arg;
    pthread_mutex_lock(&c->fmu);
    while (!c->fstop) {
        if (c->slot_full || atomic_load(&c->draining)) {
            /* A batch pulled ahead may wait behind slow handlers: keep it from
             * being redelivered (and its delivery count from growing). */
            if (c->slot_full && jsd__mono_ms() - c->slot_wpi_ms >= c->keepalive_ms) {
                for (int i = 0; i < c->slot.Count; i++)
                    natsMsg_InProgress(c->slot.Msgs[i], NULL);
                c->slot_wpi_ms = jsd__mono_ms();
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&c->fcv, &c->fmu, &ts);
            continue;
        }
        pthread_mutex_unlock(&c->fmu);
        natsMsgList l = {0};
        natsStatus s = natsSubscription_Fetch(&l, c->sub, c->batch, c->fetch_wait_ms, NULL);
        if (s != NATS_OK && s != NATS_TIMEOUT)
            jsd__sleep_ms(50); /* a broken connection: do not spin */
        pthread_mutex_lock(&c->fmu);
        if (c->fstop || atomic_load(&c->draining)) {
            give_back(&l);
            continue;
        }
        c->slot = l;
        c->slot_status = s;
        c->slot_full = true;
        pthread_mutex_lock(&c->mu);
        c->stats.max_in_flight =
            JSD_MAX(c->stats.max_in_flight, (uint64_t)atomic_load(&c->in_hand) + (uint64_t)l.Count);
        pthread_mutex_unlock(&c->mu);
        c->slot_wpi_ms = jsd__mono_ms();
        pthread_cond_broadcast(&c->fcv);
    }
    pthread_mutex_unlock(&c->fmu);
    return NULL;
}

/* Take the next fetched batch, waiting for the fetcher; false when none came
 * in time. */
static bool take_batch(jsd_consumer *c, natsMsgList *out, natsStatus *st)
{
    bool got = false;
    int64_t deadline = jsd__mono_ms() + c->fetch_wait_ms + 5000;
    pthread_mutex_lock(&c->fmu);
    while (!c->slot_full && !c->fstop && jsd__mono_ms() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&c->fcv, &c->fmu, &ts);
    }
    if (c->slot_full) {
        *out = c->slot;
        *st = c->slot_status;
        memset(&c->slot, 0, sizeof(c->slot));
        c->slot_full = false;
        got = true;
        pthread_cond_broadcast(&c->fcv); /* the fetcher pulls the next one now */
    }
    pthread_mutex_unlock(&c->fmu);
    return got;
}

/* Stop fetching and give back a batch fetched but not handed out. */
static void fetcher_drain(jsd_consumer *c)
{
    pthread_mutex_lock(&c->fmu);
    if (c->slot_full) {
        give_back(&c->slot);
        c->slot_full = false;
    }
    pthread_cond_broadcast(&c->fcv);
    pthread_mutex_unlock(&c->fmu);
}

/* ---- create / destroy ------------------------------------------------------------- */

static jsd_status cerr(jsd_consumer *c, jsd_status st, const char *fmt, ...) JSD_PRINTF(3, 4);
static jsd_status cerr(jsd_consumer *c, jsd_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    jsd__verr(&c->err, st, fmt, ap);
    va_end(ap);
    return st;
}

/* The longest time a delivery can take to come back for the last time. */
static int64_t redelivery_horizon_ms(const jsConsumerConfig *cc)
{
    int64_t ack_wait = cc->AckWait / 1000000LL;
    int64_t md = cc->MaxDeliver;
    int64_t h = ack_wait * md;
    for (int64_t i = 0; i + 1 < md && cc->BackOffLen > 0; i++)
        h += cc->BackOff[JSD_MIN(i, (int64_t)cc->BackOffLen - 1)] / 1000000LL;
    return h;
}

/* The dead-letter stream: it must exist, and not be the stream we read. */
static jsd_status check_dlq(jsCtx *js, const char *stream, const char *dlq_subject,
                            char *dlq_stream, size_t cap, jsd_error *err)
{
    jsd_status st = jsd__stream_for_subject_js(js, dlq_subject, dlq_stream, cap, err);
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
static jsd_status check_opts(const jsd_consumer_opts *o, jsd_error *err)
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

static void default_dlq_subject(const jsd_consumer_opts *o, char *out, size_t cap)
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
    jsd_status st = check_opts(o, err);
    if (st != JSD_OK)
        return st;
    natsStatus s = js_GetStreamInfo(&si, js, o->stream, NULL, &jerr);
    if (s != NATS_OK) {
        if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr)
            return jsd__err(err, JSD_ERR_NOT_FOUND, "stream \"%s\" does not exist", o->stream);
        return jsd__err_nats(err, s, jerr, "stream info");
    }
    jsStreamInfo_Destroy(si);
    default_dlq_subject(o, dlq, sizeof(dlq));
    if (!jsd__subject_valid_exact(dlq, err))
        return JSD_ERR_CONFIG;
    return check_dlq(js, o->stream, dlq, dlq_stream, sizeof(dlq_stream), err);
}

static jsd_status check_config(jsd_consumer *c, const jsd_consumer_opts *o)
{
    jsConsumerInfo *ci = NULL;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    jsd_status st = JSD_OK;

    natsStatus s = js_GetStreamInfo(&si, c->js, c->stream, NULL, &jerr);
    if (s != NATS_OK) {
        if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr)
            return cerr(c, JSD_ERR_NOT_FOUND, "stream \"%s\" does not exist", c->stream);
        return jsd__err_nats(&c->err, s, jerr, "stream info");
    }
    s = js_GetConsumerInfo(&ci, c->js, c->stream, c->durable, NULL, &jerr);
    if (s != NATS_OK) {
        jsStreamInfo_Destroy(si);
        if (s == NATS_NOT_FOUND || jerr == JSConsumerNotFoundErr)
            return cerr(c, JSD_ERR_NOT_FOUND,
                        "durable \"%s\" does not exist on stream \"%s\" (create it first, "
                        "e.g. with jsd_consumer_ensure or `jsdurable provision`)",
                        c->durable, c->stream);
        return jsd__err_nats(&c->err, s, jerr, "consumer info");
    }
    const jsConsumerConfig *cc = ci->Config;
    if (!cc || cc->AckPolicy != js_AckExplicit) {
        st = cerr(c, JSD_ERR_CONFIG, "durable \"%s\" must use explicit acks", c->durable);
        goto done;
    }
    if (cc->DeliverSubject && *cc->DeliverSubject) {
        st = cerr(c, JSD_ERR_CONFIG, "durable \"%s\" is a push consumer; a pull consumer is needed",
                  c->durable);
        goto done;
    }
    c->max_deliver = cc->MaxDeliver > 0 ? (int)cc->MaxDeliver : -1;
    /* The ack wait in force is the server's, not the one asked for: with a
     * backoff list JetStream waits backoff[0] for the first ACK and
     * backoff[n] after delivery n+1. Keep-alives follow the shortest. */
    c->ack_wait_ms = cc->AckWait > 0 ? cc->AckWait / 1000000LL : 30000;
    for (int i = 0; i < cc->BackOffLen; i++)
        if (cc->BackOff[i] > 0)
            c->ack_wait_ms = JSD_MIN(c->ack_wait_ms, cc->BackOff[i] / 1000000LL);
    c->ack_wait_ms = JSD_MAX(1, c->ack_wait_ms);
    c->keepalive_ms = JSD_MAX(1, c->ack_wait_ms / 3);
    if (c->max_deliver == 1) {
        st = cerr(c, JSD_ERR_CONFIG,
                  "durable \"%s\" has max_deliver 1: no delivery is left to retry a failed park "
                  "(use >= 2)",
                  c->durable);
        goto done;
    }
    if (o->max_deliver > 0) {
        if (c->max_deliver > 0 && o->max_deliver >= c->max_deliver) {
            st = cerr(c, JSD_ERR_CONFIG,
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
            st = cerr(c, JSD_ERR_CONFIG,
                      "durable \"%s\" redelivers without limit, so no inbox retention (%" PRId64
                      " ms) is long enough; bound max_deliver or keep inbox rows (retention 0)",
                      c->durable, o->inbox_retention_ms);
            goto done;
        }
        int64_t h = redelivery_horizon_ms(cc);
        if (o->inbox_retention_ms < h) {
            st = cerr(c, JSD_ERR_CONFIG,
                      "inbox retention %" PRId64
                      " ms is shorter than the redelivery horizon %" PRId64
                      " ms of durable \"%s\" (ack_wait x max_deliver + backoff); raise it",
                      o->inbox_retention_ms, h, c->durable);
            goto done;
        }
        if (o->inbox_retention_ms < dupw) {
            st = cerr(c, JSD_ERR_CONFIG,
                      "inbox retention %" PRId64 " ms is shorter than stream \"%s\"'s duplicate "
                      "window %" PRId64 " ms; raise it",
                      o->inbox_retention_ms, c->stream, dupw);
            goto done;
        }
    }

    st = check_dlq(c->js, c->stream, c->dlq_subject, c->dlq_stream, sizeof(c->dlq_stream), &c->err);
done:
    jsConsumerInfo_Destroy(ci);
    jsStreamInfo_Destroy(si);
    return st;
}

static jsd_status bind(jsd_consumer *c)
{
    jsSubOptions so;
    jsErrCode jerr = 0;
    natsInbox *inbox = NULL;
    char subj[128];

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
    if ((s = natsInbox_Create(&inbox)) != NATS_OK)
        return jsd__err_nats(&c->err, s, 0, "ack inbox");
    jsd__strlcpy(c->ack_prefix, inbox, sizeof(c->ack_prefix));
    natsInbox_Destroy(inbox);
    jsd__snprintf(subj, sizeof(subj), "%s.>", c->ack_prefix);
    s = natsConnection_Subscribe(&c->ack_sub, c->nc, subj, on_ack_reply, c);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(c->ack_sub, -1, -1);
    if (s != NATS_OK)
        return jsd__err_nats(&c->err, s, 0, "ack confirmation subscription");
    return JSD_OK;
}

jsd_status jsd_consumer_create(jsd_consumer **out, jsd_store *store, jsd_conn *conn,
                               const jsd_consumer_opts *o, jsd_error *err)
{
    jsd_consumer *c = NULL;
    jsd_status st;

    if (!out || !store || !conn || !o)
        return jsd__err(err, JSD_ERR_INVALID, "consumer create: missing argument");
    *out = NULL;
    if ((st = check_opts(o, err)) != JSD_OK)
        return st;

    if (!(c = jsd__calloc(1, sizeof(*c))))
        return jsd__err(err, JSD_ERR_NOMEM, "consumer create: out of memory");
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->fmu, NULL);
    pthread_cond_init(&c->fcv, NULL);
    pthread_mutex_init(&c->amu, NULL);
    pthread_cond_init(&c->acv, NULL);
    atomic_init(&c->draining, false);
    atomic_init(&c->in_hand, 0);
    c->store = store;
    c->conn = conn;
    c->nc = jsd__conn_nats(conn);
    c->js = jsd__conn_js(conn);
    c->fmt = o->payload_format;
    c->m = o->metrics ? jsd_metrics_std_of(o->metrics) : jsd_metrics_default_std();
    {
        /* Series of the ingress's own; a registry that refuses them (full)
         * leaves the handles NULL and the updates no-ops. */
        jsd_metrics *reg = o->metrics ? o->metrics : jsd_metrics_default();
        if (reg) {
            jsd_metrics_register(reg, JSD_METRIC_COUNTER, "jsd_consumer_store_outages_total",
                                 "store outages the consumer held its batch through", NULL, NULL,
                                 NULL, 0, &c->m_outages, NULL);
            jsd_metrics_register(reg, JSD_METRIC_GAUGE, "jsd_consumer_held_deliveries",
                                 "deliveries held (kept alive, unapplied) while the store is out",
                                 NULL, NULL, NULL, 0, &c->m_held, NULL);
            jsd_metrics_register(reg, JSD_METRIC_GAUGE, "jsd_poison_unpublished",
                                 "poison records stored but not yet in the dead-letter stream",
                                 NULL, NULL, NULL, 0, &c->m_dlq_unpublished, NULL);
            jsd_metrics_register(reg, JSD_METRIC_COUNTER, "jsd_dead_letters_deferred_total",
                                 "death envelopes that could not be published at settlement and "
                                 "were left to the retry from the store",
                                 NULL, NULL, NULL, 0, &c->m_dlq_deferred, NULL);
        }
    }
    c->batch = o->batch > 0 ? o->batch : 0; /* 0: decided from the durable */
    c->fetch_wait_ms = o->fetch_wait_ms > 0 ? o->fetch_wait_ms : 500;
    c->ack_timeout_ms = o->ack_timeout_ms > 0 ? o->ack_timeout_ms : 5000;
    c->retry_delay_ms = o->retry_delay_ms > 0 ? o->retry_delay_ms : 1000;
    c->stream = jsd__strdup(o->stream);
    c->durable = jsd__strdup(o->durable);
    {
        char def[JSD_SUBJECT_MAX + 64];
        default_dlq_subject(o, def, sizeof(def));
        c->dlq_subject = jsd__strdup(def);
    }
    if (!c->stream || !c->durable || !c->dlq_subject) {
        st = jsd__err(err, JSD_ERR_NOMEM, "consumer create: out of memory");
        goto fail;
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
    if ((st = check_config(c, o)) != JSD_OK || (st = bind(c)) != JSD_OK) {
        jsd__err_copy(err, &c->err);
        goto fail;
    }
    if (pthread_create(&c->fetcher, NULL, fetcher_main, c) != 0) {
        st = jsd__err(err, JSD_ERR_NOMEM, "consumer create: cannot start the fetcher thread");
        goto fail;
    }
    c->fetcher_started = true;
    JSD_INFO("ingress",
             "bound to durable %s on stream %s (batch %d, park after %d deliveries, dead "
             "letters to %s in %s)",
             c->durable, c->stream, c->batch, c->park_at, c->dlq_subject, c->dlq_stream);
    *out = c;
    return JSD_OK;
fail:
    jsd_consumer_destroy(c);
    return st;
}

static void batch_release(jsd_consumer *c)
{
    for (size_t i = 0; i < c->nd; i++) {
        jsMsgMetaData_Destroy(c->d[i].meta);
        natsMsg_Destroy(c->d[i].msg);
    }
    c->nd = 0;
    atomic_store(&c->in_hand, 0);
}

void jsd_consumer_destroy(jsd_consumer *c)
{
    if (!c)
        return;
    if (c->fetcher_started) {
        pthread_mutex_lock(&c->fmu);
        c->fstop = true;
        pthread_cond_broadcast(&c->fcv);
        pthread_mutex_unlock(&c->fmu);
        pthread_join(c->fetcher, NULL);
    }
    if (c->slot_full)
        give_back(&c->slot);
    if (c->ack_sub)
        ack_collect(c, true);
    batch_release(c);
    jsd__free(c->d);
    /* Destroy, never Unsubscribe/Drain: those would delete the durable. */
    natsSubscription_Destroy(c->sub);
    if (c->ack_sub) {
        /* Drain, then wait: no confirmation callback may run after c is freed. */
        if (natsSubscription_Drain(c->ack_sub) == NATS_OK)
            natsSubscription_WaitForDrainCompletion(c->ack_sub, 5000);
        else
            natsSubscription_Unsubscribe(c->ack_sub);
        natsSubscription_Destroy(c->ack_sub);
    }
    for (size_t i = 0; i < c->n_types; i++)
        jsd__free(c->types[i]);
    jsd__free(c->types);
    jsd__free(c->stream);
    jsd__free(c->durable);
    jsd__free(c->dlq_subject);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->fmu);
    pthread_cond_destroy(&c->fcv);
    pthread_mutex_destroy(&c->amu);
    pthread_cond_destroy(&c->acv);
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

#define STAT_SET(c, field, v)                                                                      \
    do {                                                                                           \
        pthread_mutex_lock(&(c)->mu);                                                              \
        (c)->stats.field = (v);                                                                    \
        pthread_mutex_unlock(&(c)->mu);                                                            \
    } while (0)

#define STAT_ADD(c, field, n)                                                                      \
    do {                                                                                           \
        pthread_mutex_lock(&(c)->mu);                                                              \
        (c)->stats.field += (n);                                                                   \
        pthread_mutex_unlock(&(c)->mu);                                                            \
    } while (0)

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

/* ---- the last error of a delivery, for its death envelope ------------------------- */

static void lasterr_put(jsd_consumer *c, uint64_t seq, const char *text)
{
    size_t k = (size_t)(seq % LASTERR_SLOTS);
    c->lasterr[k].seq = seq;
    jsd__strlcpy(c->lasterr[k].text, text ? text : "", sizeof(c->lasterr[k].text));
}

static const char *lasterr_get(jsd_consumer *c, uint64_t seq)
{
    size_t k = (size_t)(seq % LASTERR_SLOTS);
    return c->lasterr[k].seq == seq && c->lasterr[k].text[0] ? c->lasterr[k].text : NULL;
}

/* ---- one batch -------------------------------------------------------------------- */

/* Reconstruct the header block ("NATS/1.0\r\nName: value\r\n...\r\n") for the
 * poison record; nats.c does not expose the raw bytes. */
static char *header_block(natsMsg *m, size_t *len)
{
    const char **keys = NULL;
    int nk = 0;
    *len = 0;
    if (natsMsgHeader_Keys(m, &keys, &nk) != NATS_OK || nk == 0) {
        free((void *)keys);
        return NULL;
    }
    size_t cap = 12, used = 0;
    char *buf = NULL;
    for (int i = 0; i < nk; i++) {
        const char **vals = NULL;
        int nv = 0;
        if (natsMsgHeader_Values(m, keys[i], &vals, &nv) != NATS_OK)
            continue;
        for (int k = 0; k < nv; k++)
            cap += strlen(keys[i]) + strlen(vals[k]) + 4;
        free((void *)vals);
    }
    cap += 3;
    if (!(buf = jsd__malloc(cap)))
        goto out;
    used = (size_t)snprintf(buf, cap, "NATS/1.0\r\n");
    for (int i = 0; i < nk; i++) {
        const char **vals = NULL;
        int nv = 0;
        if (natsMsgHeader_Values(m, keys[i], &vals, &nv) != NATS_OK)
            continue;
        for (int k = 0; k < nv && used < cap; k++)
            used += (size_t)snprintf(buf + used, cap - used, "%s: %s\r\n", keys[i], vals[k]);
        free((void *)vals);
    }
    if (used < cap)
        used += (size_t)snprintf(buf + used, cap - used, "\r\n");
    *len = JSD_MIN(used, cap - 1);
out:
    free((void *)keys);
    return buf;
}

static jsd_status record_dead(jsd_consumer *c, jsd_tx *tx, jsd_delivery *d, int code)
{
    size_t hlen = 0;
    char *hdr = header_block(d->msg, &hlen);
    jsd__poison p = {
        .stream = c->stream,
        .consumer = c->durable,
        .stream_seq = d->seq,
        .msg_id = d->msg_id && *d->msg_id ? d->msg_id : NULL,
        .subject = d->subject,
        .diagnostic = d->reason,
        .headers = hdr,
        .headers_len = hlen,
        .payload = natsMsg_GetData(d->msg),
        .len = (size_t)natsMsg_GetDataLength(d->msg),
    };
    jsd_status st = jsd__tx_poison_insert(tx, &p, NULL);
    jsd__free(hdr);
    if (st == JSD_OK)
        st = jsd__tx_inbox_insert(tx, c->stream, c->durable, d->seq, p.msg_id, code, d->reason);
    if (st == JSD_OK) {
        d->state = code == OUT_POISON ? D_POISON : D_PARK;
        d->fresh = true;
    } else if (st == JSD_ERR_EXISTS) {
        /* Another process recorded this delivery meanwhile: its outcome stands. */
        jsd__inbox_outcome prev;
        bool found = false;
        st = jsd__tx_inbox_lookup(tx, c->stream, c->durable, d->seq, &found, &prev);
        if (st == JSD_OK && found) {
            d->dup = true;
            jsd__strlcpy(d->reason, prev.detail, sizeof(d->reason));
            d->state = prev.code == OUT_POISON ? D_POISON : prev.code == OUT_PARK ? D_PARK : D_ACK;
        } else if (st == JSD_OK) {
            st = JSD_ERR_INTERNAL;
        }
    }
    return st;
}

static bool parse_meta(jsd_delivery *d)
{
    if (natsMsg_GetMetaData(&d->meta, d->msg) != NATS_OK || !d->meta)
        return false;
    d->seq = d->meta->Sequence.Stream;
    d->deliveries = d->meta->NumDelivered;
    d->subject = natsMsg_GetSubject(d->msg);
    if (natsMsgHeader_Get(d->msg, "Nats-Msg-Id", &d->msg_id) != NATS_OK)
        d->msg_id = NULL;
    if (natsMsgHeader_Get(d->msg, JSD_HDR_TYPE, &d->type) != NATS_OK)
        d->type = NULL;
    return true;
}

/* A store outage seen through the handler's own SQL: the native handle's
 * state after a handler that did not commit. sqlite_before is the SQLite
 * connection's error code before the call, so an old code is not taken for
 * a new failure. JSD_OK when the failure is the handler's own. */
static int sqlite_code(jsd_tx *tx)
{
    sqlite3 *db = jsd_tx_sqlite(tx);
    return db ? sqlite3_errcode(db) : SQLITE_OK;
}

static jsd_status handler_saw_outage(jsd_tx *tx, int sqlite_before)
{
    PGconn *pg = jsd_tx_pg(tx);
    if (pg)
        return PQstatus(pg) == CONNECTION_BAD ? JSD_ERR_CONNECT : JSD_OK;
    int now = sqlite_code(tx);
    if (now == sqlite_before)
        return JSD_OK;
    switch (now & 0xff) {
    case SQLITE_FULL:
        return JSD_ERR_FULL;
    case SQLITE_IOERR:
        return JSD_ERR_IO;
    case SQLITE_READONLY:
        return JSD_ERR_READONLY;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return JSD_ERR_BUSY;
    default:
        return JSD_OK;
    }
}

/* Decide one delivery inside the open transaction. A non-OK return means the
 * transaction can no longer be trusted (the batch is abandoned). */
static jsd_status apply_one(jsd_consumer *c, jsd_tx *tx, jsd_delivery *d, jsd_handler h, void *user,
                            const jsd_disposition *given)
{
    jsd__inbox_outcome prev;
    bool found = false;
    jsd_status st;

    st = jsd__tx_inbox_lookup(tx, c->stream, c->durable, d->seq, &found, &prev);
    if (st != JSD_OK)
        return st;
    if (!found && d->msg_id && *d->msg_id && strlen(d->msg_id) <= 256) {
        st = jsd__tx_inbox_lookup_msg_id(tx, c->stream, c->durable, d->msg_id, &found, &prev);
        if (st != JSD_OK)
            return st;
        if (found && prev.stream_seq != d->seq) {
            /* A re-published duplicate past the broker's window: record its
             * identity too, apply nothing. */
            char why[64];
            jsd__snprintf(why, sizeof(why), "duplicate of stream seq %" PRIu64, prev.stream_seq);
            st = jsd__tx_inbox_insert(tx, c->stream, c->durable, d->seq, d->msg_id, OUT_DUP, why);
            if (st != JSD_OK && st != JSD_ERR_EXISTS)
                return st;
            d->state = D_ACK;
            d->dup = true;
            return JSD_OK;
        }
    }
    if (found) {
        d->dup = true;
        jsd__strlcpy(d->reason, prev.detail, sizeof(d->reason));
        d->state = prev.code == OUT_POISON ? D_POISON : prev.code == OUT_PARK ? D_PARK : D_ACK;
        return JSD_OK;
    }

    /* Past the park threshold: bury it without running the handler. */
    if (c->park_at > 0 && d->deliveries > (uint64_t)c->park_at) {
        const char *le = lasterr_get(c, d->seq);
        jsd__snprintf(d->reason, sizeof(d->reason), "max deliveries reached (%" PRIu64 "): %s",
                      d->deliveries, le ? le : "last error not known to this process");
        return record_dead(c, tx, d, OUT_PARK);
    }
    /* Envelope: poison on first sight. */
    if (!jsd__envelope_check(d->type, natsMsg_GetData(d->msg),
                             (size_t)natsMsg_GetDataLength(d->msg), (const char *const *)c->types,
                             c->n_types, c->fmt, d->reason, sizeof(d->reason)))
        return record_dead(c, tx, d, OUT_POISON);

    jsd_disposition disp;
    char given_reason[sizeof(d->reason)];
    given_reason[0] = '\0';
    if (given) {
        jsd__strlcpy(given_reason, d->reason, sizeof(given_reason));
        /* The fast pass already ran this handler, and it did not commit:
         * reuse its answer rather than call it twice. */
        disp = *given;
        if ((st = jsd__tx_savepoint(tx)) != JSD_OK)
            return st;
    } else {
        if ((st = jsd__tx_savepoint(tx)) != JSD_OK)
            return st;
        int before = sqlite_code(tx);
        int64_t t0 = jsd__mono_us();
        disp = h(tx, d, user);
        int64_t took = jsd__mono_us() - t0;
        STAT_ADD(c, handler_us, (uint64_t)took);
        jsd_histogram_observe(c->m->handler_duration, (double)took / 1e6);
        /* A handler that failed because the store is out did not fail:
         * the batch is held instead (no attempt spent, never parked). */
        if (disp.kind != JSD_DISPOSITION_COMMIT && (st = handler_saw_outage(tx, before)) != JSD_OK)
            return st;
    }

    if (disp.kind == JSD_DISPOSITION_COMMIT) {
        st = jsd__tx_inbox_insert(tx, c->stream, c->durable, d->seq, d->msg_id, OUT_COMMIT, NULL);
        if (st == JSD_OK) {
            if ((st = jsd__tx_release(tx)) != JSD_OK)
                return st;
            d->state = D_ACK;
            d->fresh = true;
            return JSD_OK;
        }
        if (st == JSD_ERR_EXISTS) {
            /* Another process committed it meanwhile: its effects stand. */
            if ((st = jsd__tx_rollback_to(tx)) != JSD_OK)
                return st;
            d->dup = true;
            d->state = D_ACK;
            return JSD_OK;
        }
        /* The store is out: the whole batch is held and retried. */
        if (store_outage(st))
            return st;
        /* The inbox row could not be written: undo, and come again. */
        jsd__snprintf(d->reason, sizeof(d->reason), "inbox insert failed: %s",
                      jsd_store_errmsg(c->store));
        if ((st = jsd__tx_rollback_to(tx)) != JSD_OK)
            return st;
        disp = jsd_disposition_retry(0, d->reason);
    } else if ((st = jsd__tx_rollback_to(tx)) != JSD_OK) {
        return st;
    }

    if (given)
        disp.reason = given_reason;
    if (disp.kind == JSD_DISPOSITION_POISON) {
        char why[sizeof(d->reason)];
        jsd__strlcpy(why, disp.reason && *disp.reason ? disp.reason : "poison", sizeof(why));
        jsd__snprintf(d->reason, sizeof(d->reason), "handler: %s", why);
        return record_dead(c, tx, d, OUT_POISON);
    }
    /* RETRY */
    if (d->reason != disp.reason)
        jsd__strlcpy(d->reason,
                     disp.reason && *disp.reason ? disp.reason : "handler asked to retry",
                     sizeof(d->reason));
    lasterr_put(c, d->seq, d->reason);
    if (c->park_at > 0 && d->deliveries >= (uint64_t)c->park_at) {
        char last[sizeof(d->reason)];
        jsd__strlcpy(last, d->reason, sizeof(last));
        jsd__snprintf(d->reason, sizeof(d->reason), "max deliveries reached (%" PRIu64 "): %s",
                      d->deliveries, last);
        return record_dead(c, tx, d, OUT_PARK);
    }
    d->state = D_NAK;
    d->delay_ms = disp.delay_ms > 0 ? disp.delay_ms : c->retry_delay_ms;
    return JSD_OK;
}

/* Copy a handler's reason at once: it must outlive the call (a literal or
 * the handler's own storage), never the handler's stack. */
static void keep_reason(jsd_delivery *d, const jsd_disposition *disp, const char *fallback)
{
    jsd__strlcpy(d->reason, disp->reason && *disp->reason ? disp->reason : fallback,
                 sizeof(d->reason));
}

/* The fast pass: the same decisions as apply_one for the common case, without
 * a savepoint per delivery and with one inbox statement per delivery (the
 * INSERT comes first and answers "seen before?" by conflicting). Anything
 * unusual — a handler that does not commit, poison, a park — sets *abort: the
 * caller rolls the whole batch back and redoes it with apply_one, passing on
 * the disposition of the handler that failed (in *failed) so it is not called
 * twice. */
static jsd_status apply_fast(jsd_consumer *c, jsd_tx *tx, jsd_delivery *d, jsd_handler h,
                             void *user, bool *abort, jsd_disposition *failed)
{
    jsd__inbox_outcome prev;
    bool found = false;
    jsd_status st;

    if (d->msg_id && *d->msg_id && strlen(d->msg_id) <= 256) {
        st = jsd__tx_inbox_lookup_msg_id(tx, c->stream, c->durable, d->msg_id, &found, &prev);
        if (st != JSD_OK)
            return st;
        if (found) {
            *abort = true; /* a duplicate: the careful pass records and answers it */
            return JSD_OK;
        }
    }
    if ((c->park_at > 0 && d->deliveries > (uint64_t)c->park_at) ||
        !jsd__envelope_check(d->type, natsMsg_GetData(d->msg),
                             (size_t)natsMsg_GetDataLength(d->msg), (const char *const *)c->types,
                             c->n_types, c->fmt, d->reason, sizeof(d->reason))) {
        *abort = true;
        return JSD_OK;
    }
    st = jsd__tx_inbox_insert(tx, c->stream, c->durable, d->seq, d->msg_id, OUT_COMMIT, NULL);
    if (st == JSD_ERR_EXISTS) {
        *abort = true;
        return JSD_OK;
    }
    if (st != JSD_OK)
        return st;
    int before = sqlite_code(tx);
    int64_t t0 = jsd__mono_us();
    jsd_disposition disp = h(tx, d, user);
    int64_t took = jsd__mono_us() - t0;
    STAT_ADD(c, handler_us, (uint64_t)took);
    jsd_histogram_observe(c->m->handler_duration, (double)took / 1e6);
    if (disp.kind != JSD_DISPOSITION_COMMIT && (st = handler_saw_outage(tx, before)) != JSD_OK)
        return st;
    if (disp.kind == JSD_DISPOSITION_COMMIT) {
        d->state = D_ACK;
        d->fresh = true;
        return JSD_OK;
    }
    keep_reason(d, &disp,
                disp.kind == JSD_DISPOSITION_POISON ? "poison" : "handler asked to retry");
    *failed = disp;
    failed->reason = NULL; /* the copy in d->reason is used */
    *abort = true;
    return JSD_OK;
}

/* The batch in hand is settled only after its COMMIT: when applying it takes
 * a third of ack_wait, tell the server every delivery in it is still being
 * worked on (+WPI), so none is redelivered meanwhile. */
static void keep_alive(jsd_consumer *c, int64_t *last_ms)
{
    if (jsd__mono_ms() - *last_ms < c->keepalive_ms)
        return;
    for (size_t i = 0; i < c->nd; i++)
        natsMsg_InProgress(c->d[i].msg, NULL);
    *last_ms = jsd__mono_ms();
}

static void nak(jsd_consumer *c, jsd_delivery *d, int64_t delay_ms)
{
    /* nats.c takes the delay in milliseconds */
    natsStatus s = natsMsg_NakWithDelay(d->msg, delay_ms > 0 ? delay_ms : c->retry_delay_ms, NULL);
    if (s != NATS_OK)
        JSD_WARN("ingress", "NAK of %s:%" PRIu64 " failed (%s); it comes back after ack_wait",
                 c->stream, d->seq, natsStatus_GetText(s));
    STAT_ADD(c, retried, 1);
    jsd_counter_inc(c->m->deliveries[JSD_RESULT_RETRY]);
}

/* nats.c's thread: count one confirmation, nothing else. */
static void on_ack_reply(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *closure)
{
    (void)nc;
    (void)sub;
    jsd_consumer *c = closure;
    const char *subj = natsMsg_GetSubject(m);
    size_t plen = strlen(c->ack_prefix);
    /* A "no responders" status (the durable is gone) confirms nothing. */
    if (!natsMsg_IsNoResponders(m) && strncmp(subj, c->ack_prefix, plen) == 0 &&
        subj[plen] == '.') {
        char *end = NULL;
        unsigned long long g = strtoull(subj + plen + 1, &end, 10);
        if (end && *end == '.' && g) {
            unsigned long long idx = strtoull(end + 1, NULL, 10);
            pthread_mutex_lock(&c->amu);
            for (int i = 0; i < ACK_GENS; i++)
                if (c->gens[i].gen == g) {
                    c->gens[i].confirmed++;
                    if (idx < c->gens[i].n_fresh)
                        c->gens[i].confirmed_fresh++;
                    if (!c->gens[i].open && c->gens[i].confirmed >= c->gens[i].sent)
                        pthread_cond_broadcast(&c->acv);
                    break;
                }
            pthread_mutex_unlock(&c->amu);
        }
    }
    natsMsg_Destroy(m);
}

/* Under amu: close the books of generations that are complete or past their
 * deadline. */
static void ack_reap(jsd_consumer *c)
{
    int64_t now = jsd__mono_ms();
    for (int i = 0; i < ACK_GENS; i++) {
        struct ackgen *g = &c->gens[i];
        if (!g->gen || g->open)
            continue;
        if (g->confirmed < g->sent && now < g->deadline)
            continue;
        size_t ok = JSD_MIN(g->confirmed, g->sent);
        STAT_ADD(c, acked, ok);
        /* deliveries{result="commit"}: committed AND the ACK confirmed. */
        jsd_counter_add(c->m->deliveries[JSD_RESULT_COMMIT],
                        JSD_MIN(g->confirmed_fresh, g->n_fresh));
        if (ok < g->sent) {
            STAT_ADD(c, ack_unconfirmed, g->sent - ok);
            JSD_WARN("ingress",
                     "%zu of %zu ACKs on %s/%s unconfirmed after %d ms; those deliveries will be "
                     "redelivered and answered from the inbox",
                     g->sent - ok, g->sent, c->stream, c->durable, c->ack_timeout_ms);
        }
        memset(g, 0, sizeof(*g));
    }
}

static void timed_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ms = JSD_MAX(1, JSD_MIN(ms, 100));
    ts.tv_nsec += (long)(ms * 1000000L);
    while (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(cv, mu, &ts);
}

/* Settle the confirmations of the ACKs in flight: with wait, until every
 * generation is confirmed or past its deadline; without, only what is done. */
static void ack_collect(jsd_consumer *c, bool wait)
{
    pthread_mutex_lock(&c->amu);
    for (;;) {
        ack_reap(c);
        int64_t first = INT64_MAX;
        for (int i = 0; i < ACK_GENS; i++)
            if (c->gens[i].gen)
                first = JSD_MIN(first, c->gens[i].deadline);
        if (!wait || first == INT64_MAX)
            break;
        timed_wait_ms(&c->acv, &c->amu, first - jsd__mono_ms());
    }
    pthread_mutex_unlock(&c->amu);
}

/* Send +ACK for every delivery in acks (the first n_fresh of them settle
 * commits of this batch), each a request with a reply subject of
 * our own, all at once. Their confirmations are counted as they arrive (by the
 * subscription's callback) and settled later: the wait for the server
 * overlaps the next batches (at most ACK_GENS batches in flight) instead of
 * costing one round trip per batch. */
static void ack_send(jsd_consumer *c, jsd_delivery **acks, size_t n, size_t n_fresh)
{
    if (n == 0) {
        ack_collect(c, false);
        return;
    }
    struct ackgen *g = NULL;
    pthread_mutex_lock(&c->amu);
    for (;;) {
        ack_reap(c);
        for (int i = 0; i < ACK_GENS && !g; i++)
            if (!c->gens[i].gen)
                g = &c->gens[i];
        if (g)
            break;
        int64_t first = INT64_MAX;
        for (int i = 0; i < ACK_GENS; i++)
            first = JSD_MIN(first, c->gens[i].deadline);
        timed_wait_ms(&c->acv, &c->amu, first - jsd__mono_ms());
    }
    uint64_t gen = ++c->ack_gen;
    g->gen = gen;
    g->open = true;
    g->sent = g->confirmed = g->confirmed_fresh = 0;
    g->n_fresh = n_fresh;
    pthread_mutex_unlock(&c->amu);

    char reply[160];
    size_t sent = 0;
    for (size_t i = 0; i < n; i++) {
        const char *to = natsMsg_GetReply(acks[i]->msg);
        if (!to || !*to)
            continue;
        jsd__snprintf(reply, sizeof(reply), "%s.%" PRIu64 ".%zu", c->ack_prefix, gen, i);
        natsStatus s = natsConnection_PublishRequest(c->nc, to, reply, "+ACK", 4);
        if (s != NATS_OK) {
            JSD_WARN("ingress",
                     "ACK of %s:%" PRIu64 " not sent (%s); it will be redelivered "
                     "and found in the inbox",
                     c->stream, acks[i]->seq, natsStatus_GetText(s));
            continue;
        }
        sent++;
    }
    pthread_mutex_lock(&c->amu);
    g->sent = sent;
    g->open = false;
    g->deadline = jsd__mono_ms() + c->ack_timeout_ms;
    ack_reap(c);
    pthread_mutex_unlock(&c->amu);
}

static bool reserve(jsd_consumer *c, size_t n)
{
    if (n <= c->cap)
        return true;
    jsd_delivery *d = jsd__realloc(c->d, n * sizeof(*d));
    if (!d)
        return false;
    c->d = d;
    c->cap = n;
    return true;
}

/* A store error that says nothing about the deliveries: the store cannot
 * be reached, is full, read-only or busy, or a COMMIT's outcome is unknown
 * (a lost connection maps to JSD_ERR_CONNECT). Such a batch is held and
 * retried, never NAKed. */
static bool store_outage(jsd_status st)
{
    switch (st) {
    case JSD_ERR_CONNECT:
    case JSD_ERR_FULL:
    case JSD_ERR_READONLY:
    case JSD_ERR_BUSY:
    case JSD_ERR_IO:
    case JSD_ERR_TIMEOUT:
    case JSD_ERR_NOMEM:
        return true;
    default:
        return false;
    }
}

/* Apply the batch in hand in one transaction and COMMIT it: first the fast
 * pass, and when anything in it is unusual, the careful pass with a
 * savepoint per handler. JSD_OK when committed; otherwise the status of the
 * store call that failed, and nothing of the batch was committed (or, after
 * a lost connection at COMMIT, it is unknown: the next attempt's inbox
 * lookups answer that). */
static jsd_status apply_batch(jsd_consumer *c, jsd_handler h, void *user, int64_t *wpi_at)
{
    jsd_tx *tx = NULL;
    bool abort = false;
    size_t fail_at = SIZE_MAX;
    jsd_disposition failed = jsd_disposition_commit();

    for (size_t i = 0; i < c->nd; i++) {
        c->d[i].state = D_NONE;
        c->d[i].fresh = c->d[i].dup = false;
        c->d[i].reason[0] = '\0';
    }
    jsd_status st = jsd_tx_begin(c->store, &tx);
    for (size_t i = 0; st == JSD_OK && !abort && i < c->nd; i++) {
        keep_alive(c, wpi_at);
        st = apply_fast(c, tx, &c->d[i], h, user, &abort, &failed);
        if (abort && failed.kind != JSD_DISPOSITION_COMMIT)
            fail_at = i;
    }
    if (st == JSD_OK && abort) {
        char keep[JSD__ERROR_TEXT_MAX + 1] = "";
        if (fail_at != SIZE_MAX)
            jsd__strlcpy(keep, c->d[fail_at].reason, sizeof(keep));
        jsd_tx_rollback(tx);
        tx = NULL;
        for (size_t i = 0; i < c->nd; i++) {
            c->d[i].state = D_NONE;
            c->d[i].fresh = c->d[i].dup = false;
            c->d[i].reason[0] = '\0';
        }
        if (fail_at != SIZE_MAX)
            jsd__strlcpy(c->d[fail_at].reason, keep, sizeof(c->d[fail_at].reason));
        st = jsd_tx_begin(c->store, &tx);
        for (size_t i = 0; st == JSD_OK && i < c->nd; i++) {
            keep_alive(c, wpi_at);
            st = apply_one(c, tx, &c->d[i], h, user, i == fail_at ? &failed : NULL);
        }
    }
    if (st == JSD_OK) {
        st = jsd_tx_commit(tx);
        tx = NULL;
        if (st == JSD_OK)
            return JSD_OK;
    }
    jsd_tx_rollback(tx);
    return st != JSD_OK ? st : JSD_ERR_STORE;
}

/* A drain during a store outage: leave the held deliveries unacked. */
static jsd_status hold_stop(jsd_consumer *c, jsd_status why)
{
    size_t n = c->nd;
    char cause[JSD__ERROR_TEXT_MAX + 1];
    jsd__strlcpy(cause, jsd_store_errmsg(c->store), sizeof(cause));
    JSD_WARN("ingress",
             "%s/%s: stopped during a store outage: %zu held deliveries left unacked; the "
             "server redelivers them after the ack wait (%" PRId64 " ms), one delivery each",
             c->stream, c->durable, n, c->ack_wait_ms);
    batch_release(c); /* neither ACK nor NAK */
    c->held_at_stop += n;
    c->holding = false;
    STAT_SET(c, held, 0);
    jsd_gauge_set(c->m_held, 0);
    cerr(c, why,
         "stopped while %zu deliveries were held by a store outage (%s); they were left unacked "
         "and come again after the ack wait",
         n, cause);
    fetcher_drain(c);
    ack_collect(c, true);
    return JSD_ERR_STOPPED;
}

/* Hold the batch in hand through a store outage: keep every delivery alive
 * (+WPI, which does not count a delivery), wait with a capped backoff, and
 * apply it again from the start in a fresh transaction until the store takes
 * it. JSD_OK once committed; JSD_ERR_STOPPED on drain. */
static jsd_status hold_and_apply(jsd_consumer *c, jsd_handler h, void *user, int64_t *wpi_at,
                                 jsd_status why)
{
    int64_t backoff = 100;
    if (!c->holding) {
        c->holding = true;
        c->hold_since_ms = jsd__mono_ms();
        STAT_ADD(c, store_outages, 1);
        jsd_counter_inc(c->m_outages);
        JSD_WARN("ingress",
                 "%s/%s: store outage (%s): holding %zu deliveries, kept alive every %" PRId64
                 " ms and retried until the store answers; no delivery attempt is spent",
                 c->stream, c->durable, jsd_store_errmsg(c->store), c->nd, c->keepalive_ms);
    }
    STAT_SET(c, held, c->nd);
    jsd_gauge_set(c->m_held, (double)c->nd);
    for (;;) {
        int64_t until = jsd__mono_ms() + backoff;
        while (jsd__mono_ms() < until) {
            if (atomic_load(&c->draining))
                return hold_stop(c, why);
            keep_alive(c, wpi_at);
            ack_collect(c, false);
            jsd__sleep_ms(JSD_MIN(50, JSD_MAX(1, until - jsd__mono_ms())));
        }
        backoff = JSD_MIN(backoff * 2, 5000);
        keep_alive(c, wpi_at);
        jsd_status st = apply_batch(c, h, user, wpi_at);
        if (st == JSD_OK)
            break;
        if (!store_outage(st)) {
            /* The store answers again, and refuses something in the batch:
             * the ordinary failed-commit path takes it from here. */
            c->holding = false;
            STAT_SET(c, held, 0);
            jsd_gauge_set(c->m_held, 0);
            return st;
        }
        why = st;
        jsd__err_copy(&c->err, jsd_store_error(c->store));
    }
    JSD_WARN("ingress",
             "%s/%s: the store answers again after %" PRId64 " ms; %zu held deliveries "
             "applied",
             c->stream, c->durable, jsd__mono_ms() - c->hold_since_ms, c->nd);
    c->holding = false;
    STAT_SET(c, held, 0);
    jsd_gauge_set(c->m_held, 0);
    return JSD_OK;
}

/* Publish the death envelope of a stored poison record (one the batch that
 * recorded it could not publish, or one left by another process). */
static jsd_status republish_record(jsd_consumer *c, const jsd__poison_record *r, jsd_error *e)
{
    char type[257] = "";
    uint64_t dlv = 0;
    const char *diag = r->diagnostic ? r->diagnostic : "";
    static const char park_prefix[] = "max deliveries reached (";
    bool parked = strncmp(diag, park_prefix, sizeof(park_prefix) - 1) == 0;
    if (parked)
        dlv = strtoull(diag + sizeof(park_prefix) - 1, NULL, 10);
    /* Jsd-Type from the stored header block ("Name: value\r\n" lines). */
    if (r->headers) {
        const char *hb = (const char *)r->headers;
        size_t hl = r->headers_len, tl = strlen(JSD_HDR_TYPE);
        for (size_t i = 0; i + tl + 2 <= hl; i++) {
            if ((i == 0 || hb[i - 1] == '\n') && strncmp(hb + i, JSD_HDR_TYPE, tl) == 0 &&
                hb[i + tl] == ':') {
                size_t a = i + tl + 1, z;
                while (a < hl && hb[a] == ' ')
                    a++;
                for (z = a; z < hl && hb[z] != '\r' && hb[z] != '\n'; z++)
                    ;
                size_t n = JSD_MIN(z - a, sizeof(type) - 1);
                memcpy(type, hb + a, n);
                type[n] = '\0';
                break;
            }
        }
    }
    jsd__death death = {.subject = r->subject,
                        .stream = r->stream,
                        .consumer = r->consumer,
                        .stream_seq = r->stream_seq,
                        .deliveries = dlv,
                        .reason = parked ? "max_deliver" : "poison",
                        .error = diag,
                        .msg_id = r->msg_id && *r->msg_id ? r->msg_id : NULL,
                        .type = *type ? type : NULL,
                        .payload = r->payload,
                        .len = r->len,
                        .time_ms = r->created_at_ms};
    uint64_t dseq = 0;
    jsd_status st = jsd__death_publish(c->js, c->dlq_subject, c->dlq_stream, &death,
                                       c->ack_timeout_ms, &dseq, e);
    if (st != JSD_OK)
        return st;
    jsd_counter_inc(c->m->dead_letters);
    st = jsd__store_poison_mark_published(c->store, r->stream, r->consumer, r->stream_seq,
                                          c->dlq_stream, dseq);
    if (st != JSD_OK)
        JSD_WARN("ingress",
                 "poison record %s:%" PRIu64 " published as %s:%" PRIu64
                 " but not marked (%s); it is published again (the same id) later",
                 r->stream, r->stream_seq, c->dlq_stream, dseq, jsd_store_errmsg(c->store));
    return st;
}

/* Republish this durable's poison records that have no dead-letter sequence
 * (DLQ-1): due after a failed publish (with a backoff up to 30 s), and every
 * minute otherwise, for records another process left. */
static void dlq_sweep(jsd_consumer *c, bool force)
{
    int64_t now = jsd__mono_ms();
    if (!force && now < c->sweep_at_ms)
        return;
    int64_t after = 0;
    size_t left = 0, published = 0;
    bool failed = false;
    jsd_error e;
    jsd_error_clear(&e);
    for (;;) {
        jsd__poison_record *recs = NULL;
        size_t n = 0;
        jsd_status st =
            jsd__store_poison_unpublished(c->store, c->stream, c->durable, after, 64, &recs, &n);
        if (st != JSD_OK) {
            /* The store is down: its outage is reported by the batch path. */
            c->sweep_at_ms = now + 5000;
            return;
        }
        for (size_t i = 0; i < n; i++) {
            after = recs[i].id;
            if (!failed) {
                jsd_status ps = republish_record(c, &recs[i], &e);
                if (ps == JSD_OK) {
                    published++;
                    continue;
                }
                failed = e.status != JSD_OK; /* the publish failed, not only its mark */
            }
            left++;
        }
        jsd__poison_records_free(recs, n);
        if (n < 64)
            break;
    }
    if (published) {
        STAT_ADD(c, dlq_republished, published);
        JSD_INFO("ingress", "%s/%s: %zu stored dead letters published to %s", c->stream, c->durable,
                 published, c->dlq_stream);
    }
    STAT_SET(c, poison_unpublished, left);
    jsd_gauge_set(c->m_dlq_unpublished, (double)left);
    if (left) {
        c->sweep_backoff_ms = JSD_MIN(JSD_MAX(c->sweep_backoff_ms * 2, 500), 30000);
        JSD_WARN("ingress",
                 "%s/%s: %zu poison records are stored but not in the dead-letter stream %s "
                 "(%s); retrying in %" PRId64 " ms",
                 c->stream, c->durable, left, c->dlq_stream, e.msg[0] ? e.msg : "not published",
                 c->sweep_backoff_ms);
        c->sweep_at_ms = jsd__mono_ms() + c->sweep_backoff_ms;
    } else {
        c->sweep_backoff_ms = 0;
        c->sweep_at_ms = jsd__mono_ms() + 60000;
    }
}

jsd_status jsd_consumer_poll(jsd_consumer *c, jsd_handler h, void *user, int *n)
{
    natsMsgList list = {0};
    jsd_status st = JSD_OK;

    if (n)
        *n = 0;
    if (!c || !h)
        return JSD_ERR_INVALID;
    if (atomic_load(&c->draining)) {
        fetcher_drain(c);
        ack_collect(c, true);
        return JSD_ERR_STOPPED;
    }
    dlq_sweep(c, false);

    natsStatus s = NATS_TIMEOUT;
    if (!take_batch(c, &list, &s))
        s = NATS_TIMEOUT;
    if (s == NATS_TIMEOUT || (s == NATS_OK && list.Count == 0)) {
        natsMsgList_Destroy(&list);
        ack_collect(c, true);
        return JSD_OK;
    }
    if (s != NATS_OK) {
        natsMsgList_Destroy(&list);
        ack_collect(c, true);
        return jsd__err_nats(&c->err, s, 0, "fetch");
    }
    if (!reserve(c, (size_t)list.Count)) {
        for (int i = 0; i < list.Count; i++)
            natsMsg_NakWithDelay(list.Msgs[i], c->retry_delay_ms, NULL);
        natsMsgList_Destroy(&list);
        return cerr(c, JSD_ERR_NOMEM, "out of memory for a batch of %d", list.Count);
    }
    c->nd = 0;
    for (int i = 0; i < list.Count; i++) {
        jsd_delivery *d = &c->d[c->nd];
        memset(d, 0, sizeof(*d));
        d->c = c;
        d->msg = list.Msgs[i];
        list.Msgs[i] = NULL;
        if (!parse_meta(d)) {
            /* Not a JetStream delivery (a status message): nothing to settle. */
            natsMsg_Destroy(d->msg);
            continue;
        }
        c->nd++;
    }
    natsMsgList_Destroy(&list);
    if (n)
        *n = (int)c->nd;
    pthread_mutex_lock(&c->mu);
    c->stats.fetched += c->nd;
    c->stats.batches++;
    if (c->nd > c->stats.max_batch)
        c->stats.max_batch = c->nd;
    c->stats.max_in_flight = JSD_MAX(c->stats.max_in_flight, (uint64_t)c->nd);
    pthread_mutex_unlock(&c->mu);
    atomic_store(&c->in_hand, c->nd);
    if (c->nd == 0)
        return JSD_OK;

    /* ---- apply ---- */
    int64_t wpi_at = jsd__mono_ms();
    st = apply_batch(c, h, user, &wpi_at);
    if (st != JSD_OK && store_outage(st)) {
        jsd__err_copy(&c->err, jsd_store_error(c->store));
        st = hold_and_apply(c, h, user, &wpi_at, st);
        if (st == JSD_ERR_STOPPED)
            return st;
    }
    if (st != JSD_OK) {
        jsd__err_copy(&c->err, jsd_store_error(c->store));
        JSD_WARN("ingress", "batch of %zu on %s/%s not committed (%s); NAK, they come again", c->nd,
                 c->stream, c->durable, jsd_store_errmsg(c->store));
        STAT_ADD(c, commit_failures, 1);
        for (size_t i = 0; i < c->nd; i++)
            nak(c, &c->d[i], c->retry_delay_ms);
        batch_release(c);
        return JSD_OK;
    }
    JSD_CRASH_POINT("ingress.after_commit");

    /* ---- settle ---- */
    size_t n_commit = 0;
    bool any_dead = false;
    for (size_t i = 0; i < c->nd; i++) {
        if (c->d[i].state == D_ACK && c->d[i].fresh)
            n_commit++;
        if (c->d[i].state == D_POISON || c->d[i].state == D_PARK)
            any_dead = true;
    }
    size_t n_dup = 0;
    for (size_t i = 0; i < c->nd; i++)
        n_dup += c->d[i].dup;
    STAT_ADD(c, committed, n_commit);
    STAT_ADD(c, duplicates, n_dup);
    jsd_counter_add(c->m->deliveries[JSD_RESULT_DUPLICATE], n_dup);
    if (any_dead)
        JSD_CRASH_POINT("poison.after_store_commit");

    /* ACKs of this batch's fresh commits first (their confirmations move
     * deliveries{result="commit"}), then the others, in a second array. */
    jsd_delivery **acks = jsd__calloc(
        2 * c->nd, sizeof(*acks)); /* NOLINT(bugprone-sizeof-expression): an array of pointers */
    jsd_delivery **later = acks ? acks + c->nd : NULL;
    size_t na = 0, nl = 0;
    bool dlq_ok = false, dlq_failed = false;
    if (!acks)
        JSD_WARN("ingress",
                 "out of memory: the ACKs of %zu deliveries are not sent; they will be "
                 "redelivered and answered from the inbox",
                 c->nd);
    for (size_t i = 0; i < c->nd; i++) {
        jsd_delivery *d = &c->d[i];
        if (d->state == D_POISON || d->state == D_PARK) {
            /* The poison record was committed with the batch (or by an
             * earlier one, for a redelivery): publish its death envelope
             * unless an earlier attempt already did. */
            bool published = false;
            if (d->dup) {
                jsd__poison_record r;
                memset(&r, 0, sizeof(r));
                if (jsd__store_poison_get(c->store, c->stream, c->durable, d->seq, &r) == JSD_OK) {
                    published = r.dlq_seq != 0;
                    jsd__poison_record_clear(&r);
                }
            }
            if (!published) {
                const char *reason = d->state == D_POISON ? "poison" : "max_deliver";
                jsd__death death = {.subject = d->subject,
                                    .stream = c->stream,
                                    .consumer = c->durable,
                                    .stream_seq = d->seq,
                                    .deliveries = d->deliveries,
                                    .reason = reason,
                                    .error = d->reason,
                                    .msg_id = d->msg_id,
                                    .type = d->type,
                                    .payload = natsMsg_GetData(d->msg),
                                    .len = (size_t)natsMsg_GetDataLength(d->msg),
                                    .time_ms = jsd__now_ms()};
                uint64_t dseq = 0;
                jsd_error e;
                jsd_error_clear(&e);
                jsd_status ds = jsd__death_publish(c->js, c->dlq_subject, c->dlq_stream, &death,
                                                   c->ack_timeout_ms, &dseq, &e);
                if (ds != JSD_OK) {
                    /* Not the message's failure, and no delivery is spent on
                     * it: the poison record is durable, and dlq_sweep
                     * republishes it from the store. */
                    JSD_WARN("ingress",
                             "dead letter for %s:%" PRIu64 " not published (%s); its poison "
                             "record stays in the store and is republished from there",
                             c->stream, d->seq, e.msg);
                    jsd__err_copy(&c->err, &e);
                    STAT_ADD(c, dlq_deferred, 1);
                    jsd_counter_inc(c->m_dlq_deferred);
                    dlq_failed = true;
                } else {
                    dlq_ok = true;
                    if (jsd__store_poison_mark_published(c->store, c->stream, c->durable, d->seq,
                                                         c->dlq_stream, dseq) != JSD_OK)
                        JSD_WARN("ingress", "poison record %s:%" PRIu64 " not marked published: %s",
                                 c->stream, d->seq, jsd_store_errmsg(c->store));
                    jsd_counter_inc(c->m->dead_letters);
                    JSD_CRASH_POINT("poison.after_dlq_publish");
                }
            }
            if (d->state == D_POISON) {
                natsStatus ts = natsMsg_Term(d->msg, NULL);
                if (ts != NATS_OK)
                    JSD_WARN("ingress", "TERM of %s:%" PRIu64 " failed (%s); it will come again",
                             c->stream, d->seq, natsStatus_GetText(ts));
                STAT_ADD(c, poisoned, 1);
                jsd_counter_inc(c->m->deliveries[JSD_RESULT_POISON]);
            } else {
                STAT_ADD(c, parked, 1);
                jsd_counter_inc(c->m->deliveries[JSD_RESULT_DEADLETTER]);
                if (later)
                    later[nl++] = d;
            }
        } else if (d->state == D_ACK) {
            if (acks && d->fresh)
                acks[na++] = d;
            else if (later)
                later[nl++] = d;
        } else if (d->state == D_NAK) {
            nak(c, d, d->delay_ms);
        }
    }
    size_t n_fresh = na;
    for (size_t i = 0; acks && i < nl; i++)
        acks[na++] = later[i];
    ack_send(c, acks, na, n_fresh);
    jsd__free(acks);
    JSD_CRASH_POINT("ingress.after_ack");
    batch_release(c);
    if (dlq_failed) {
        c->sweep_backoff_ms = JSD_MAX(c->sweep_backoff_ms, 250);
        c->sweep_at_ms = JSD_MIN(c->sweep_at_ms, jsd__mono_ms() + c->sweep_backoff_ms);
    } else if (dlq_ok) {
        /* The dead-letter stream answers again: retry the stored ones now. */
        jsd_consumer_stats snap;
        jsd_consumer_stats_get(c, &snap);
        if (snap.poison_unpublished)
            dlq_sweep(c, true);
    }
    return JSD_OK;
}

jsd_status jsd_consumer_run(jsd_consumer *c, jsd_handler h, void *user, bool until_idle)
{
    if (!c || !h)
        return JSD_ERR_INVALID;
    int64_t backoff = 50;
    while (!atomic_load(&c->draining)) {
        int got = 0;
        jsd_status st = jsd_consumer_poll(c, h, user, &got);
        if (st == JSD_ERR_STOPPED)
            break;
        if (st != JSD_OK) {
            if (st == JSD_ERR_INVALID || st == JSD_ERR_NOMEM)
                return st;
            JSD_WARN("ingress", "%s/%s: %s; retrying", c->stream, c->durable, c->err.msg);
            jsd__sleep_ms(backoff);
            backoff = JSD_MIN(backoff * 2, 2000);
            continue;
        }
        backoff = 50;
        if (got == 0 && until_idle) {
            uint64_t pending = 1, in_flight = 1;
            if (jsd_consumer_backlog(c, &pending, &in_flight) == JSD_OK && pending == 0 &&
                in_flight == 0) {
                /* Idle, but not done while dead letters wait in the store. */
                dlq_sweep(c, true);
                jsd_consumer_stats s;
                jsd_consumer_stats_get(c, &s);
                if (s.poison_unpublished == 0)
                    return JSD_OK;
                return cerr(c, JSD_ERR_NATS,
                            "nothing is pending, but %" PRIu64 " poison records of %s/%s are "
                            "not in the dead-letter stream %s; they are kept in the store and "
                            "published by the next run once the stream takes them",
                            s.poison_unpublished, c->stream, c->durable, c->dlq_stream);
            }
        }
    }
    fetcher_drain(c);
    ack_collect(c, true);
    if (c->held_at_stop)
        return c->err.status != JSD_OK ? c->err.status : JSD_ERR_STORE;
    return JSD_OK;
}
