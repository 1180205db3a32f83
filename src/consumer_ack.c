/*
 * consumer_ack — the ACK step, an object of its own (jsd__ack): it owns the
 * subscription on which the server confirms ACKs (a private inbox prefix),
 * the generations of ACKs in flight (one per batch, at most ACK_GENS) and
 * the lock and condition variable that guard them. jsd__ack_send sends a
 * batch's +ACK requests all at once; the confirmations are counted by the
 * subscription's callback (nats.c's thread, under the object's lock only)
 * and settled later by jsd__ack_collect / the reap inside send, on the
 * consumer's thread, so the wait for the server overlaps the next batches
 * instead of costing one round trip per batch. Also the NAK of a delivery.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "conn_int.h"
#include "consumer_int.h"
#include "natsmsg.h"

#define ACK_GENS 4

struct jsd__ack {
    natsConnection *nc;
    natsSubscription *sub;
    char prefix[96];
    const char *stream, *durable; /* the consumer's, for logs */
    int timeout_ms;
    jsd_metric *commits;       /* deliveries{result="commit"} */
    pthread_mutex_t *stats_mu; /* the consumer's stats lock */
    jsd_consumer_stats *stats; /* acked, ack_unconfirmed */
    uint64_t gen;
    /* ACK generations (one per batch) whose confirmations are awaited. The
     * confirmation subscription's callback (nats.c's thread) only counts
     * replies here under mu; the consumer's thread settles the books. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct ackgen {
        uint64_t gen; /* 0: free */
        size_t sent, confirmed;
        size_t n_fresh, confirmed_fresh; /* ACKs [0, n_fresh) settle fresh commits */
        bool open;                       /* still sending */
        int64_t deadline;
    } gens[ACK_GENS];
};

static void books_add(jsd__ack *a, uint64_t *field, size_t n)
{
    pthread_mutex_lock(a->stats_mu);
    *field += n;
    pthread_mutex_unlock(a->stats_mu);
}

/* nats.c's thread: count one confirmation, nothing else. */
static void on_ack_reply(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *closure)
{
    (void)nc;
    (void)sub;
    jsd__ack *a = closure;
    const char *subj = natsMsg_GetSubject(m);
    size_t plen = strlen(a->prefix);
    /* A "no responders" status (the durable is gone) confirms nothing. */
    if (!natsMsg_IsNoResponders(m) && strncmp(subj, a->prefix, plen) == 0 && subj[plen] == '.') {
        char *end = NULL;
        unsigned long long g = strtoull(subj + plen + 1, &end, 10);
        if (end && *end == '.' && g) {
            unsigned long long idx = strtoull(end + 1, NULL, 10);
            pthread_mutex_lock(&a->mu);
            for (int i = 0; i < ACK_GENS; i++)
                if (a->gens[i].gen == g) {
                    a->gens[i].confirmed++;
                    if (idx < a->gens[i].n_fresh)
                        a->gens[i].confirmed_fresh++;
                    if (!a->gens[i].open && a->gens[i].confirmed >= a->gens[i].sent)
                        pthread_cond_broadcast(&a->cv);
                    break;
                }
            pthread_mutex_unlock(&a->mu);
        }
    }
    jsd__msg_free(m);
}

/* Under mu: close the books of generations that are complete or past their
 * deadline. */
static void ack_reap(jsd__ack *a)
{
    int64_t now = jsd__mono_ms();
    for (int i = 0; i < ACK_GENS; i++) {
        struct ackgen *g = &a->gens[i];
        if (!g->gen || g->open)
            continue;
        if (g->confirmed < g->sent && now < g->deadline)
            continue;
        size_t ok = JSD_MIN(g->confirmed, g->sent);
        books_add(a, &a->stats->acked, ok);
        /* deliveries{result="commit"}: committed AND the ACK confirmed. */
        jsd_counter_add(a->commits, JSD_MIN(g->confirmed_fresh, g->n_fresh));
        if (ok < g->sent) {
            books_add(a, &a->stats->ack_unconfirmed, g->sent - ok);
            JSD_WARN("consumer",
                     "%zu of %zu ACKs on %s/%s unconfirmed after %d ms; those deliveries will be "
                     "redelivered and answered from the inbox",
                     g->sent - ok, g->sent, a->stream, a->durable, a->timeout_ms);
        }
        memset(g, 0, sizeof(*g));
    }
}

/* Wait for a confirmation at most ms (clamped to [1, 100]): the loops
 * around it re-check their deadlines. */
static void timed_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t ms)
{
    jsd__cond_wait_ms(cv, mu, JSD_MAX(1, JSD_MIN(ms, 100)));
}

/* Settle the confirmations of the ACKs in flight: with wait, until every
 * generation is confirmed or past its deadline; without, only what is done. */
void jsd__ack_collect(jsd__ack *a, bool wait)
{
    pthread_mutex_lock(&a->mu);
    for (;;) {
        ack_reap(a);
        int64_t first = INT64_MAX;
        for (int i = 0; i < ACK_GENS; i++)
            if (a->gens[i].gen)
                first = JSD_MIN(first, a->gens[i].deadline);
        if (!wait || first == INT64_MAX)
            break;
        timed_wait_ms(&a->cv, &a->mu, first - jsd__mono_ms());
    }
    pthread_mutex_unlock(&a->mu);
}

/* Send +ACK for every delivery in acks (the first n_fresh of them settle
 * commits of this batch), each a request with a reply subject of
 * our own, all at once. Their confirmations are counted as they arrive (by the
 * subscription's callback) and settled later: the wait for the server
 * overlaps the next batches (at most ACK_GENS batches in flight) instead of
 * costing one round trip per batch. */
void jsd__ack_send(jsd__ack *a, jsd_delivery **acks, size_t n, size_t n_fresh)
{
    if (n == 0) {
        jsd__ack_collect(a, false);
        return;
    }
    struct ackgen *g = NULL;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        ack_reap(a);
        for (int i = 0; i < ACK_GENS && !g; i++)
            if (!a->gens[i].gen)
                g = &a->gens[i];
        if (g)
            break;
        int64_t first = INT64_MAX;
        for (int i = 0; i < ACK_GENS; i++)
            first = JSD_MIN(first, a->gens[i].deadline);
        timed_wait_ms(&a->cv, &a->mu, first - jsd__mono_ms());
    }
    uint64_t gen = ++a->gen;
    g->gen = gen;
    g->open = true;
    g->sent = g->confirmed = g->confirmed_fresh = 0;
    g->n_fresh = n_fresh;
    pthread_mutex_unlock(&a->mu);

    char reply[160];
    size_t sent = 0;
    for (size_t i = 0; i < n; i++) {
        const char *to = natsMsg_GetReply(acks[i]->msg);
        if (!to || !*to)
            continue;
        jsd__snprintf(reply, sizeof(reply), "%s.%" PRIu64 ".%zu", a->prefix, gen, i);
        natsStatus s = natsConnection_PublishRequest(a->nc, to, reply, "+ACK", 4);
        if (s != NATS_OK) {
            JSD_WARN("consumer",
                     "ACK of %s:%" PRIu64 " not sent (%s); it will be redelivered "
                     "and found in the inbox",
                     a->stream, acks[i]->seq, natsStatus_GetText(s));
            continue;
        }
        sent++;
    }
    pthread_mutex_lock(&a->mu);
    g->sent = sent;
    g->open = false;
    g->deadline = jsd__mono_ms() + a->timeout_ms;
    ack_reap(a);
    pthread_mutex_unlock(&a->mu);
}

void jsd__nak(jsd_consumer *c, jsd_delivery *d, int64_t delay_ms)
{
    /* nats.c takes the delay in milliseconds */
    natsStatus s = natsMsg_NakWithDelay(d->msg, delay_ms > 0 ? delay_ms : c->retry_delay_ms, NULL);
    if (s != NATS_OK)
        JSD_WARN("consumer", "NAK of %s:%" PRIu64 " failed (%s); it comes back after ack_wait",
                 c->stream, d->seq, natsStatus_GetText(s));
    STAT_ADD(c, retried, 1);
    jsd_counter_inc(c->m->deliveries[JSD_RESULT_RETRY]);
}

jsd_status jsd__ack_create(jsd__ack **out, natsConnection *nc, const char *stream,
                           const char *durable, int timeout_ms, jsd_metric *commits,
                           pthread_mutex_t *stats_mu, jsd_consumer_stats *stats, jsd_error *err)
{
    natsInbox *inbox = NULL;
    char subj[128];
    jsd__ack *a = jsd__calloc(1, sizeof(*a));
    *out = NULL;
    if (!a)
        return jsd__err(err, JSD_ERR_NOMEM, "consumer create: out of memory");
    pthread_mutex_init(&a->mu, NULL);
    jsd__cond_init_mono(&a->cv);
    a->nc = nc;
    a->stream = stream;
    a->durable = durable;
    a->timeout_ms = timeout_ms;
    a->commits = commits;
    a->stats_mu = stats_mu;
    a->stats = stats;
    natsStatus s = natsInbox_Create(&inbox);
    if (s != NATS_OK) {
        jsd__ack_destroy(a);
        return jsd__err_nats(err, s, 0, "ack inbox");
    }
    jsd__strlcpy(a->prefix, inbox, sizeof(a->prefix));
    natsInbox_Destroy(inbox);
    jsd__snprintf(subj, sizeof(subj), "%s.>", a->prefix);
    s = natsConnection_Subscribe(&a->sub, nc, subj, on_ack_reply, a);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(a->sub, -1, -1);
    if (s != NATS_OK) {
        jsd__ack_destroy(a);
        return jsd__err_nats(err, s, 0, "ack confirmation subscription");
    }
    *out = a;
    return JSD_OK;
}

void jsd__ack_destroy(jsd__ack *a)
{
    if (!a)
        return;
    if (a->sub) {
        jsd__ack_collect(a, true);
        /* Drain, then wait: no confirmation callback may run after a is freed.
         * Without a connection the drain cannot complete (the server never
         * sees the UNSUB); what is queued here is delivered within
         * milliseconds, so a stop with NATS down waits briefly, not 5 s. */
        int wait_ms = natsConnection_Status(a->nc) == NATS_CONN_STATUS_CONNECTED ? 5000 : 500;
        if (natsSubscription_Drain(a->sub) == NATS_OK)
            natsSubscription_WaitForDrainCompletion(a->sub, wait_ms);
        else
            natsSubscription_Unsubscribe(a->sub);
        natsSubscription_Destroy(a->sub);
    }
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    jsd__free(a);
}
