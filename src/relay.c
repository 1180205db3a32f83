/*
 * relay — the outbox relay (RELAY-1..4): claims due effects from the store
 * under a lease, publishes them through the publication engine with their
 * stable Nats-Msg-Id and expected stream, and records the PubAck receipts.
 * It owns its store handle, borrows the NATS connection, and keeps many
 * publications in flight: while the acks of one batch are outstanding, the
 * next batch is already claimed and submitted. The receipts of a batch are
 * written in one transaction (failures in a second one) by a receipt-writer
 * thread, so the publishing thread goes on claiming and submitting while the
 * store commits; on SQLite the two take turns on the store under one mutex.
 * max_in_flight bounds the publications awaiting a PubAck, and the effects
 * waiting for their receipt have a bound of their own (DESIGN 12). This file
 * holds create/destroy, the run loop and its waits, the counters and the
 * last error; claiming and submitting a batch (with the stream and
 * duplicate-window checks) is in relay_claim.c, its atomic batches in
 * relay_batch.c, the receipt writer in relay_writer.c, and what they share
 * in relay_int.h.
 *
 * DESIGN (crash ordering; see also src/store/store.h and docs/RELAY.md)
 *
 *   claim(token T, lease L)            -- crash point relay.after_claim
 *   submit each effect (msg id M)      -- crash point relay.after_publish
 *   PubAck for every effect of batch   -- crash point relay.before_receipt_commit
 *   record_receipts(T) one transaction -- crash point relay.before_receipt_sync
 *   their sync (one per writer group)  -- crash point relay.after_receipt_commit
 *   record_failures(T) / release(T)
 *
 * 1. M is derived by the store from (owner, effect id) and never changes: a
 *    retry, by this relay or by another after a crash, carries the same M.
 * 2. Publish first, receipt second. A crash after the claim leaves effects
 *    leased and unpublished: the lease expires and they are claimed again. A
 *    crash after submission or after the PubAck, before the receipt commit,
 *    leaves the message maybe or surely stored with no receipt: after the
 *    lease expires the next claim republishes M, JetStream's duplicate window
 *    collapses it and answers duplicate=true with the original sequence, and
 *    that receipt retires the effect. A crash after the receipt commit loses
 *    nothing: the effect is retired. So every effect gets exactly one receipt
 *    and the stream exactly one message per M, as long as a retry comes
 *    within the stream's duplicate window (lease << window; documented).
 * 3. The lease must outlive the publication: lease_ms > publish deadline +
 *    1 s is enforced at create. A relay that stalls past its lease anyway (a
 *    zombie) cannot overwrite the new holder's result: receipts and failures
 *    are written only WHERE lease_token = T; the refused ones are counted
 *    (lease_lost) and the new holder's duplicate receipt stands.
 * 4. A publication that fails stores no receipt. FAILED, DENIED and UNKNOWN
 *    count an attempt (with the reason) and back off; at the budget the effect
 *    is dead-lettered. REJECTED, a FAILED with a permanent JetStream error
 *    (jsd__js_err_permanent) and a row that cannot be published (a defect the
 *    claim reports, an invalid subject) are dead-lettered at once, so one bad
 *    row never holds up the others. UNAVAILABLE and RETRYABLE prove nothing
 *    was sent, and a FAILED with no responders proves nothing was stored
 *    (the relay publishes only to a subject a stream was found to capture,
 *    so the stream is between leaders: a broker outage; it is looked up
 *    again before the next try): the lease is released without counting an
 *    attempt and claims pause as for UNAVAILABLE, so an outage never spends
 *    budgets. UNKNOWN may have been stored: the retry
 *    uses the same M.
 * 4a. A duplicate PubAck is the expected answer to a retry (attempts > 0, or
 *    an earlier lease that ended unsettled, which the claim marks
 *    maybe_published). On an effect with neither, the store has no record
 *    of an earlier attempt, so the relay reads the stream's message at the
 *    sequence the PubAck names (relay_claim.c, stored_copy). If it carries
 *    M, the effect's subject, payload and headers, it is this effect's own
 *    message, stored by an attempt whose claim did not survive (point 8; an
 *    SQLite host's crash): the PubAck is its receipt (a duplicate, logged at
 *    warn). If it differs, or cannot be read, the stream holds another
 *    producer's message under M and ours was not stored, so the effect is
 *    dead-lettered (JSD__FIRST_DUP_REASON, with what differed), logged and
 *    counted rather than retired by a receipt.
 * 4b. Point 2 needs every retry inside the stream's duplicate window: the
 *    first time a stream is targeted (and every minute) its window is read
 *    and must exceed deadline + backoff cap + lease + poll, or the relay releases
 *    its claim and stops with JSD_ERR_CONFIG (window_fits).
 * 5. Order: the store claims an effect with an ordering key only when no
 *    earlier effect of its key is unpublished (and not dead-lettered), so at
 *    most one per key is in flight, and a failed one holds its key back until
 *    it is published or dead-lettered.
 * 6. Wake-ups (NOTIFY / in-process signal) only prompt a claim; the relay also
 *    claims at least every poll interval and when the store's next due time
 *    (durable timers, backoff) arrives.
 * 7. Handing a batch to the writer thread changes nothing above: the receipt
 *    is still written after the PubAck and under the same lease token, and
 *    the crash points sit on the writer's path. The next effect of an
 *    ordering key becomes claimable only once the writer has committed the
 *    previous one's receipt (the store checks), and the publishing thread
 *    claims again whenever the writer reports a written batch. On SQLite the
 *    receipt commit's WAL sync comes right after the commit, outside the
 *    store's write lock and store_mu, and before the receipts count as
 *    written or the crash point relay.after_receipt_commit (the argument is
 *    at sq_receipts in src/store/sqlite.c). Batches the writer finds
 *    queued together commit their receipts one transaction each and share
 *    that sync (crash point relay.before_receipt_sync); none counts as
 *    written before it, and a failed sync has them written again, durable
 *    at once (relay_writer.c, finish_batches). While the
 *    writer commits and nothing is in flight, a wake-up (a new commit) is
 *    claimed at once; the receipt commit is not on its path.
 * 8. PostgreSQL (measured, issue 12): the lease stays a column, not a row lock
 *    held by a transaction open across the publication. A row lock vanishes
 *    with a crashed relay's session and leaves no trace, so the next claim
 *    could not tell a retry from a first attempt (point 4a needs
 *    maybe_published), and it would pin one connection per batch in flight.
 *    Instead the lease write is cheap: the lease columns are in no index and
 *    the table keeps room on each page (fillfactor 50, schema migration 6), so
 *    a claim is a HOT update that adds no index entries; only the receipt
 *    makes a new indexed row version. The receipt writer has its own
 *    connection (jsd__store_open_writer), so receipts overlap the next claims
 *    instead of taking turns with them. Failures, releases and dead letters
 *    commit synchronously (a lost dead letter would be published), and
 *    receipts are durable before they count as written: a receipt lost in a
 *    server crash would be republished after a restart that may come later
 *    than the duplicate window. As on SQLite (point 7), the batches the writer
 *    finds queued together commit their receipts one transaction each without
 *    waiting for the flush, then one synchronous commit of a transaction of
 *    its own (it writes an empty logical message) flushes the WAL up to its
 *    record, theirs included (and waits for synchronous standbys), then one
 *    walk of the floor: at 1k effects/s each batch is a few effects, and a
 *    flush per batch let the writer fall behind by the whole receipt bound
 *    (DESIGN 12) whenever fsyncs slowed (commit -> PubAck stalls of 0.3-0.7 s,
 *    docs/PERFORMANCE.md). Until that flush a receipt is visible but may be
 *    lost in a server crash, together with everything after it in the WAL (a
 *    claim that saw it included): the case of a relay that died before its
 *    receipt commit. If the relay lives, the flush fails (or the session it
 *    ran on was reset before it: pg_sync_receipts) and the group's receipts
 *    are written again, durable at once, held through the outage like any
 *    receipt (point 10); if it died, its effects are republished with the same
 *    ids after a restart (test_relay_crash.c,
 *    receipt_lost_before_its_flush_pg). The claim alone commits without
 *    waiting for its WAL flush (synchronous_commit off for its own
 *    transaction, set inside the statement): that wait was on every commit ->
 *    PubAck path (p50 about 2 ms against 0.8 ms in bench_relay's latency run).
 *    A relay that dies loses nothing by it (the server holds the commit); a
 *    server crash or failover may lose the last claims. Such an effect is then
 *    unleased and unmarked, possibly published under a lease nobody remembers:
 *    its receipt under that lease is refused (point 3, lease_lost), it is
 *    claimed again like a new one, its republication is collapsed by the
 *    stream, and the first-attempt duplicate is settled by reading the stream
 *    (point 4a): still one message and one receipt (test_relay_horizon.c,
 *    claim_lost_in_a_server_crash). (A server that stays down past the
 *    duplicate window makes that republication a second copy, as for held
 *    receipts in point 10; the inbox applies it once.) The receipts' flush
 *    flushes every claim committed before it too. Receipts of first attempts
 *    (schema 9): a run of them whose rows are all ready and still leased under
 *    T is one row of jsd_outbox_runs, committed with nothing else, and the
 *    rows keep lease T (a second version of each, with entries in every index,
 *    cost the receipt most of its time). Points 1-4 hold as they are: the run
 *    is written after the PubAcks, only for rows whose lease is T when the
 *    receipt's snapshot is taken, and a takeover that could change that (a
 *    claim taking expired leases) holds an advisory lock that the receipt
 *    holds shared, so the two never overlap: the takeover sees the run and
 *    skips its rows, or the receipt sees the new lease and writes nothing
 *    (lease_lost). Below the settled floor (store/postgres.c, "the settled
 *    floor") every first attempt is covered by a run and no id can still be
 *    filled; whatever makes one claimable again (a requeue, an unpublish)
 *    lowers the floor in its own transaction, so no claimable effect is left
 *    below it. A full batch moves a claim floor above its largest id, so the
 *    next claim does not step over the index entries published rows leave
 *    until vacuum; a claim from the start runs whenever one comes back short
 *    and at least once a second, so an expired lease or an ended backoff below
 *    the floor waits at most that. Neither session plans a sequential scan,
 *    and each plans its statements once (relay_plans in src/store/postgres.c):
 *    a generic plan made while the outbox was small scanned the whole table
 *    for each claim.
 * 9. SQLite (one host, one writer at a time): an unordered claim writes no
 *    lease into its rows. It takes the first run of due rows, in id order,
 *    that lies between the ranges other claims hold, and records one row
 *    (token T, lo..hi, claimed_at, expires, open count) in jsd_outbox_lease,
 *    in the same BEGIN IMMEDIATE transaction, so no two live ranges overlap
 *    and no effect is held twice. Its rows (unkeyed, no lease_token, due at
 *    claimed_at) are held while that row is there; receipts, failures and
 *    releases under T look it up once per transaction and write only such
 *    rows in lo..hi (the zombie test of point 3: a range taken over is gone,
 *    so T's late results are refused), and the last settled row deletes it.
 *    A claim that finds a range expired takes it over: its still unsettled
 *    rows are marked maybe published (4a) and become claimable. A released
 *    row is marked (lease_expires 0) so that a takeover does not mark it.
 *    Keyed heads keep the per-row lease of points 3 and 5, and so do
 *    retries and durable timers (schema 8). A run of receipts of first
 *    attempts is recorded as one row of jsd_outbox_runs, in the receipt's
 *    transaction with the range's settlement and the settled floor's rise
 *    (store/sqlite.c, "the settled floor"): a crash leaves all three or
 *    none, and the order of points 1-4 is unchanged. Below the floor every
 *    first attempt is covered by a run or held by a range; whatever makes
 *    one claimable again (a takeover, a release, a requeue, an unpublish)
 *    lowers the floor in its own transaction, so no claimable effect is
 *    ever left below it.
 * 10. The duplicate-window horizon (src/relay_horizon.c). Point 2 holds only
 *    while a retry reaches the broker inside the window of the attempt that
 *    may have stored M. The store keeps first_attempt_at: the claim time of
 *    the first attempt whose outcome stayed open (a failure recorded after
 *    UNKNOWN, or a lease that ended unsettled, taken as that lease's length
 *    before its expiry), kept across relays. An attempt that starts more than
 *    half the window after it is logged and counted (at risk) and its failure
 *    retried after the first backoff step; one that starts past the window is
 *    a possible duplicate, logged and counted, never silent. Receipts whose
 *    store commit meets an outage are held and retried until the store
 *    answers or the relay stops (the PubAcks are the only record that M is
 *    in), and no claim runs meanwhile: otherwise this relay would take over
 *    its own expired leases and publish M again before its receipt is in.
 * 11. Socket writes (issue 12). On a connection that coalesces writes
 *    (jsd_conn_opts.coalesce_writes, the CLI's default) nats.c's flusher
 *    writes the buffer about 1 ms after the first publication, so batches
 *    submitted meanwhile share one write. When a claim comes back short or
 *    only a few publications are in flight, nothing is coming to share it:
 *    the relay writes at once (jsd__conn_write_now), and the millisecond
 *    stays off the commit -> PubAck path. Likewise, while only a few fresh
 *    publications of a short claim are in flight, the next claim waits for
 *    their PubAcks (at most JSD__ACKS_DUE_US): a claim holds the loop for
 *    milliseconds on PostgreSQL, and the PubAcks would be settled only
 *    after it. After a full claim (a backlog) claims go on while
 *    publishing, whatever the batch size. Only the timing of writes and
 *    claims changes.
 * 12. Two bounds (issue 12; jsd__relay_claim_room). max_in_flight bounds
 *    the publications awaiting their PubAck, the window raw publishing
 *    would keep. The effects whose PubAck is in and whose receipt the writer
 *    has yet to write are bounded apart, by the same number: no claim runs
 *    while that many wait, so a slow store still holds claims back (their
 *    leases keep running) and at most 2 x max_in_flight effects are claimed
 *    and unrecorded. Counting both against one bound (as before) let every
 *    receipt commit take publication slots: on SQLite, where claims and
 *    receipts take turns on the store, the window shrank by the batches
 *    waiting for it (medians of 3, same-minute pairs: 36.3k -> 43.3k,
 *    46.2k -> 48.5k, 40.1k -> 54.3k msg/s). Nothing in points 1-11 changes:
 *    the receipt still follows the PubAck under the same lease token.
 * 13. Atomic batches (issue 43; relay_batch.c). A claim's effects for a
 *    stream that allows them (allow_atomic in its config, read with its
 *    duplicate window; not answered 10174/10177 in the last 10 minutes) go
 *    out as atomic batches of up to 1000, each with a fresh Nats-Batch-Id:
 *
 *      claim(T)                      -- relay.after_claim
 *      batch: publications + commit  -- relay.batch_after_commit_publish
 *      (relay.after_publish)
 *      one PubAck for the batch      -- relay.batch_before_receipts
 *      receipts(T), as in point 7    -- relay.before_receipt_commit ...
 *
 *    The batch is stored whole or not at all, in order, at consecutive
 *    sequences ending with the PubAck's (effect i of n: seq - n + 1 + i),
 *    and each message still carries its own M (1), so points 2-4 hold per
 *    effect: the receipt follows the PubAck under T, a crash before it
 *    leaves the batch maybe or surely stored with no receipt, and the next
 *    claim republishes the same ids. That republication, as a batch, is
 *    refused whole (10201: an id the stream holds; nothing stored), and the
 *    relay then publishes that batch's effects one by one: the duplicate
 *    window answers each stored one duplicate=true with its sequence
 *    (test_relay_crash.c, crash_batch_*). So a batch adds no outcome of
 *    its own: ACCEPTED gives every effect a receipt; no PubAck (deadline,
 *    connection lost, 5xx) is UNKNOWN for every effect (maybe_stored, the
 *    same-id retry); 10210 (the stream's 50 batches in flight are taken,
 *    nothing stored) is waited out and the whole batch sent again (then
 *    released, no attempt spent); 10176 (incomplete, nothing stored) is
 *    sent again once, then one by one. Every attempt of a batch ends within
 *    one publish deadline of the first (a resend's deadline is what is
 *    left of it), so the lease still outlives the publication (point 3).
 *    Any other refusal (or DENIED) proves nothing was stored and sends the
 *    batch one by one, where a row that can never be published fails alone
 *    and is dead-lettered as in point 4.
 *    Order (point 5): a claim holds at most one effect per ordering key, so
 *    splitting it per stream and at 1000 puts no two effects of a key in
 *    flight. Several effects of one key in one batch (issue 43, item 2) is
 *    not done: it would be safe only if (a) the claim took a key's next
 *    effects together, consecutive and all due, (b) they went in one batch
 *    of their stream, in id order (stored in order, all or nothing), and
 *    (c) every path that is not one batch (a stream without batches, a
 *    key whose effects go to several streams, a fallback to one by one, a
 *    split at 1000) sent only the key's head and
 *    released the rest, because publications sent one by one can be stored
 *    out of order when an earlier one fails. (a) changes both stores'
 *    keyed claims and their leases; it is left for a change of its own.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "conn_int.h"
#include "jsd_int.h"
#include "pubengine.h"
#include "relay_int.h"
#include "streams.h"
#include "store/store.h"
#include "subject.h"

/* The relay's words when nats.c has closed its connection for good. */
#define GONE_TEXT                                                                                  \
    "the NATS connection is closed for good (reconnection attempts exhausted, or the server "      \
    "refused the credentials twice in a row); the backlog waits in the store for a relay on a "    \
    "new connection"

#define STOP_SLICE_MS        100 /* the longest a wait ignores jsd_relay_stop */
#define UNAVAILABLE_PAUSE_MS 250 /* claims pause after a publication found NATS down */
#define DRAIN_MAX            512
#define IDLE_FLOOR_MS        100 /* shortest idle wait when something due was not claimable */
#define PROGRESS_EVERY_MS    10000
#define ACK_GATHER_MIN       32 /* acks per wake-up worth waiting for under load */
#define ACK_GATHER_US        200

size_t jsd__relay_claim_room(size_t max_in_flight, size_t in_flight, size_t unrecorded)
{
    if (unrecorded >= max_in_flight || in_flight >= max_in_flight)
        return 0;
    return max_in_flight - in_flight;
}

bool jsd__relay_acks_due(size_t in_flight, int64_t short_submitted_us, int64_t now_us)
{
    int64_t since = now_us - short_submitted_us;
    return short_submitted_us > 0 && in_flight > 0 && in_flight < JSD__ACKS_DUE_MAX && since >= 0 &&
           since < JSD__ACKS_DUE_US;
}

/* ---- metrics: the one place relay counters reach the metrics module ----------- */

void jsd__relay_count(jsd_relay *r, relay_counter c, uint64_t n)
{
    if (n == 0)
        return;
    switch (c) {
    case RC_PUBLISHED:
        atomic_fetch_add(&r->n_published, n);
        break;
    case RC_DUPLICATES:
        atomic_fetch_add(&r->n_duplicates, n);
        break;
    case RC_ERRORS:
        atomic_fetch_add(&r->n_errors, n);
        break;
    case RC_DEAD:
        atomic_fetch_add(&r->n_dead, n);
        break;
    case RC_LEASE_LOST:
        atomic_fetch_add(&r->n_lease_lost, n);
        break;
    case RC_STORE_ERRORS:
        atomic_fetch_add(&r->n_store_errors, n);
        break;
    case RC_BATCHES:
        atomic_fetch_add(&r->n_batches, n);
        break;
    case RC_FIRST_DUP:
        atomic_fetch_add(&r->n_first_dup, n);
        break;
    case RC_HORIZON_AT_RISK:
        atomic_fetch_add(&r->n_horizon_at_risk, n);
        break;
    case RC_HORIZON_PASSED:
        atomic_fetch_add(&r->n_horizon_passed, n);
        break;
    }
    /* The one place relay events reach the metrics registry. */
    if (!r->mstd)
        return;
    switch (c) {
    case RC_PUBLISHED:
        jsd_counter_add(r->mstd->relay_published, n);
        break;
    case RC_DUPLICATES:
        jsd_counter_add(r->mstd->relay_duplicates, n);
        break;
    case RC_ERRORS:
        jsd_counter_add(r->mstd->relay_errors, n);
        break;
    case RC_DEAD:
        jsd_counter_add(r->m_dead, n);
        break;
    case RC_FIRST_DUP:
        jsd_counter_add(r->m_first_dup, n);
        break;
    case RC_HORIZON_AT_RISK:
        jsd_counter_add(r->m_horizon_at_risk, n);
        break;
    case RC_HORIZON_PASSED:
        jsd_counter_add(r->m_horizon_passed, n);
        break;
    default:
        break;
    }
}

/* ---- options ------------------------------------------------------------------- */

void jsd_relay_opts_init(jsd_relay_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->batch_size = 256;
    o->max_in_flight = 1024;
    o->lease_ms = 30000;
    o->poll_interval_ms = 1000;
    o->publish_deadline_ms = 5000;
    o->backoff_base_ms = 500;
    o->backoff_cap_ms = 60000;
    o->attempt_budget = JSD__DEFAULT_BUDGET;
    o->atomic_min = 16;
}

static jsd_status check_opts(const jsd_relay_opts *o, jsd_error *err)
{
    if (o->batch_size < 1 || o->batch_size > 4096)
        return jsd__err(err, JSD_ERR_CONFIG, "relay batch_size %d is outside 1..4096",
                        o->batch_size);
    if (o->max_in_flight < 1 || o->max_in_flight > JSD_ADMISSION_MAX)
        return jsd__err(err, JSD_ERR_CONFIG, "relay max_in_flight %d is outside 1..%d",
                        o->max_in_flight, JSD_ADMISSION_MAX);
    if (o->publish_deadline_ms < 1 || o->publish_deadline_ms > JSD_DEADLINE_MAX_MS)
        return jsd__err(err, JSD_ERR_CONFIG, "relay publish_deadline_ms %d is outside 1..%d",
                        o->publish_deadline_ms, JSD_DEADLINE_MAX_MS);
    if ((int64_t)o->lease_ms < (int64_t)o->publish_deadline_ms + 1000)
        return jsd__err(err, JSD_ERR_CONFIG,
                        "relay lease_ms %d must exceed publish_deadline_ms %d by at least 1000 "
                        "(the lease covers the publication and the receipt)",
                        o->lease_ms, o->publish_deadline_ms);
    if (o->poll_interval_ms < 1 || o->poll_interval_ms > 3600000)
        return jsd__err(err, JSD_ERR_CONFIG, "relay poll_interval_ms %d is outside 1..3600000",
                        o->poll_interval_ms);
    if (o->backoff_base_ms < 1 || o->backoff_cap_ms < o->backoff_base_ms)
        return jsd__err(err, JSD_ERR_CONFIG,
                        "relay backoff base %d ms / cap %d ms: need 1 <= base <= cap",
                        o->backoff_base_ms, o->backoff_cap_ms);
    if (o->atomic_min < 1 || o->atomic_min > 1000)
        return jsd__err(err, JSD_ERR_CONFIG, "relay atomic_min %d is outside 1..1000",
                        o->atomic_min);
    if (o->attempt_budget < 1 || o->attempt_budget > 100000)
        return jsd__err(err, JSD_ERR_CONFIG, "relay attempt_budget %d is outside 1..100000",
                        o->attempt_budget);
    return JSD_OK;
}

/* ---- the last error ----------------------------------------------------------------- */

/* Record the handle's last error (any thread). Returns s. */
jsd_status jsd__relay_err(jsd_relay *r, jsd_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&r->err_mu);
    jsd__verr(&r->err, s, fmt, ap);
    pthread_mutex_unlock(&r->err_mu);
    va_end(ap);
    return s;
}

/* ---- create / destroy -------------------------------------------------------------- */

jsd_status jsd_relay_create(jsd_relay **out, jsd_store *store, jsd_conn *conn,
                            const jsd_relay_opts *opts, jsd_error *err)
{
    jsd_relay *r = NULL;
    jsd_relay_opts defaults;
    jsd_status s;

    if (!out)
        return jsd__err(err, JSD_ERR_INVALID, "jsd_relay_create: out is NULL");
    *out = NULL;
    if (!store || !conn)
        return jsd__err(err, JSD_ERR_INVALID, "jsd_relay_create needs a store and a connection");
    if (!opts) {
        jsd_relay_opts_init(&defaults);
        opts = &defaults;
    }
    if ((s = check_opts(opts, err)) != JSD_OK)
        return s;
    r = jsd__calloc(1, sizeof(*r));
    if (!r)
        return jsd__err(err, JSD_ERR_NOMEM, "out of memory creating the relay");
    r->store = store;
    r->conn = conn;
    r->o = *opts;
    atomic_store(&r->left_failing, -1);
    atomic_store(&r->left_dead, -1);
    if (pthread_mutex_init(&r->store_mu, NULL) != 0 || pthread_mutex_init(&r->wq_mu, NULL) != 0 ||
        pthread_mutex_init(&r->err_mu, NULL) != 0 || pthread_cond_init(&r->wq_cv, NULL) != 0 ||
        jsd__cond_init_mono(&r->wq_idle_cv) != 0 || pthread_mutex_init(&r->gauge_mu, NULL) != 0 ||
        jsd__cond_init_mono(&r->gauge_cv) != 0) {
        jsd__free(r);
        return jsd__err(err, JSD_ERR_INTERNAL, "cannot initialise the relay's locks");
    }
    r->sync_init = true;
    jsd__backoff_init(&r->backoff);
    r->backoff.base_ms = opts->backoff_base_ms;
    r->backoff.cap_ms = opts->backoff_cap_ms;
    jsd_metrics *reg = opts->metrics ? opts->metrics : jsd_metrics_default();
    if (reg) {
        static const double c2p_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                             1,     2.5,  5,     10,   30,  60,   300};
        r->mstd = jsd_metrics_std_of(reg);
        jsd__metrics_feeds(reg, JSD__FEED_RELAY);
        s = jsd_metrics_register(reg, JSD_METRIC_HISTOGRAM, "jsd_relay_commit_to_puback_seconds",
                                 "From an effect's commit (or its not-before time, when later) "
                                 "to the PubAck the relay received for it.",
                                 NULL, NULL, c2p_buckets, JSD_ARRAY_LEN(c2p_buckets),
                                 &r->m_commit_to_puback, err);
        if (s != JSD_OK)
            goto fail;
        s = jsd_metrics_register(reg, JSD_METRIC_COUNTER, "jsd_relay_dead_lettered_total",
                                 "Outbox effects the relay dead-lettered (attempt budget spent or "
                                 "never publishable).",
                                 NULL, NULL, NULL, 0, &r->m_dead, err);
        if (s == JSD_OK)
            s = jsd_metrics_register(reg, JSD_METRIC_COUNTER,
                                     "jsd_relay_first_attempt_duplicates_total",
                                     "PubAcks that said duplicate on an effect's first attempt "
                                     "(another producer's message holds its id); each such "
                                     "effect is dead-lettered.",
                                     NULL, NULL, NULL, 0, &r->m_first_dup, err);
        if (s == JSD_OK)
            s = jsd_metrics_register(reg, JSD_METRIC_COUNTER,
                                     "jsd_relay_dedup_horizon_at_risk_total",
                                     "Attempts started, or receipts held unwritten, more than "
                                     "half the stream's duplicate window after the effect's "
                                     "first attempt may have reached the broker.",
                                     NULL, NULL, NULL, 0, &r->m_horizon_at_risk, err);
        if (s == JSD_OK)
            s = jsd_metrics_register(reg, JSD_METRIC_COUNTER,
                                     "jsd_relay_dedup_horizon_passed_total",
                                     "Attempts started past the whole duplicate window of the "
                                     "effect's first attempt: each a possible duplicate.",
                                     NULL, NULL, NULL, 0, &r->m_horizon_passed, err);
        if (s == JSD_OK)
            s = jsd_metrics_register(reg, JSD_METRIC_COUNTER, "jsd_relay_atomic_batches_total",
                                     "Atomic batches the relay published and JetStream "
                                     "acknowledged with one PubAck.",
                                     NULL, NULL, NULL, 0, &r->m_atomic_batches, err);
        if (s == JSD_OK)
            s = jsd_metrics_register(reg, JSD_METRIC_COUNTER, "jsd_relay_batch_resends_total",
                                     "Atomic batches the relay sent again whole, with a fresh "
                                     "batch id: the stream's batches in flight were taken "
                                     "(10210) or one went incomplete (10176).",
                                     NULL, NULL, NULL, 0, &r->m_resends, err);
        for (int k = 0; s == JSD_OK && k < FB_N; k++)
            s = jsd_metrics_register(reg, JSD_METRIC_COUNTER, "jsd_relay_batch_fallbacks_total",
                                     "Claims (per stream) or atomic batches whose effects the "
                                     "relay published one by one instead, by reason.",
                                     "reason", jsd__relay_fallback_names[k], NULL, 0,
                                     &r->m_fallback[k], err);
        if (s == JSD_OK)
            s = jsd_metrics_register(reg, JSD_METRIC_GAUGE, "jsd_relay_in_flight",
                                     "Relay publications awaiting their PubAck.", NULL, NULL, NULL,
                                     0, &r->m_inflight, err);
        if (s != JSD_OK)
            goto fail;
    }
    r->breqs = jsd__calloc(JSD__BATCH_MAX, sizeof(*r->breqs));
    if (!r->breqs) {
        s = jsd__err(err, JSD_ERR_NOMEM, "out of memory creating the relay");
        goto fail;
    }
    jsd__pubengine_opts eo = {.admission = opts->max_in_flight,
                              .deadline_ms = opts->publish_deadline_ms};
    s = jsd__pubengine_create(&r->eng, conn, &eo, err);
    if (s != JSD_OK)
        goto fail;
    s = jsd__streams_create(&r->streams, conn, JSD__STREAMS_POS_TTL_MS, JSD__STREAMS_NEG_TTL_MS,
                            JSD__STREAMS_MAX);
    if (s != JSD_OK) {
        jsd__err(err, s, "out of memory creating the relay's stream cache");
        goto fail;
    }
    {
        jsd_error werr;
        jsd_error_clear(&werr);
        if (jsd__store_open_writer(store, &r->wstore, &werr) != JSD_OK)
            JSD_WARN(COMP,
                     "cannot open a second store connection for the receipt writer (%s); "
                     "claims and receipts take turns on one connection",
                     werr.msg);
        jsd_error_clear(&werr);
        if (r->mstd && jsd__store_open_reader(store, &r->gstore, &werr) != JSD_OK)
            JSD_INFO(COMP,
                     "no second store connection for the backlog gauges (%s); they are "
                     "counted on the publishing thread",
                     werr.msg);
    }
    *out = r; /* r->err is clear: calloc */
    return JSD_OK;
fail:
    jsd_relay_destroy(r);
    return s;
}

/* Free a list of batches linked by next. */
static void free_chain(rbatch *b)
{
    while (b) {
        rbatch *n = b->next;
        jsd__relay_batch_free(b);
        b = n;
    }
}

void jsd_relay_destroy(jsd_relay *r)
{
    if (!r)
        return;
    jsd__pubengine_destroy(r->eng);
    jsd__free(r->breqs);
    free_chain(r->head);
    free_chain(r->wq_head);
    free_chain(r->spare);
    jsd__streams_destroy(r->streams);
    jsd_store_close(r->wstore);
    jsd_store_close(r->gstore);
    if (r->sync_init) {
        pthread_mutex_destroy(&r->store_mu);
        pthread_mutex_destroy(&r->wq_mu);
        pthread_mutex_destroy(&r->err_mu);
        pthread_cond_destroy(&r->wq_cv);
        pthread_cond_destroy(&r->wq_idle_cv);
        pthread_mutex_destroy(&r->gauge_mu);
        pthread_cond_destroy(&r->gauge_cv);
    }
    jsd__free(r);
}

const char *jsd_relay_errmsg(const jsd_relay *r)
{
    if (!r)
        return "";
    /* The copy is the caller's thread's, as for every handle's errmsg: the
     * text under err_mu may change while the relay runs. */
    jsd_relay *w = (jsd_relay *)r;
    pthread_mutex_lock(&w->err_mu);
    jsd__strlcpy(w->err_shown, w->err.msg, sizeof(w->err_shown));
    pthread_mutex_unlock(&w->err_mu);
    return w->err_shown;
}

void jsd_relay_stop(jsd_relay *r)
{
    if (r)
        atomic_store(&r->stop, 1);
}

void jsd_relay_stats_get(jsd_relay *r, jsd_relay_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (!r)
        return;
    out->published = atomic_load(&r->n_published);
    out->duplicates = atomic_load(&r->n_duplicates);
    out->errors = atomic_load(&r->n_errors);
    out->dead_lettered = atomic_load(&r->n_dead);
    out->in_flight = atomic_load(&r->n_inflight);
    out->batches = atomic_load(&r->n_batches);
    out->lease_lost = atomic_load(&r->n_lease_lost);
    out->store_errors = atomic_load(&r->n_store_errors);
    out->first_attempt_duplicates = atomic_load(&r->n_first_dup);
    out->atomic_batches = atomic_load(&r->n_atomic_batches);
    out->atomic_effects = atomic_load(&r->n_atomic_effects);
    out->horizon_at_risk = atomic_load(&r->n_horizon_at_risk);
    out->horizon_passed = atomic_load(&r->n_horizon_passed);
    out->store_down = atomic_load(&r->store_down);
    out->left_failing = atomic_load(&r->left_failing);
    out->left_dead_lettered = atomic_load(&r->left_dead);
}

jsd_status jsd_outbox_trouble_get(jsd_store *s, jsd_outbox_trouble *out)
{
    if (!s || !out)
        return JSD_ERR_INVALID;
    memset(out, 0, sizeof(*out));
    jsd__outbox_trouble t;
    jsd_status rc = jsd__store_outbox_trouble(s, &t);
    if (rc != JSD_OK)
        return rc;
    out->failing = t.failing;
    out->dead_lettered = t.dead_lettered;
    out->first_attempt_duplicates = t.first_attempt_duplicates;
    return JSD_OK;
}

/* ---- the loop ---------------------------------------------------------------------------- */

void jsd__relay_store_trouble_on(jsd_relay *r, jsd_store *st, const char *what)
{
    jsd__relay_count(r, RC_STORE_ERRORS, 1);
    atomic_store(&r->store_down, 1);
    int64_t now = jsd__mono_ms();
    pthread_mutex_lock(&r->err_mu);
    jsd__err(&r->err, JSD_ERR_STORE, "%s: %s", what, jsd_store_errmsg(st));
    bool warn = now - r->last_store_warn_ms >= 5000;
    if (warn)
        r->last_store_warn_ms = now;
    pthread_mutex_unlock(&r->err_mu);
    if (warn)
        JSD_WARN(COMP, "%s failed, will retry: %s", what, jsd_store_errmsg(st));
}

void jsd__relay_store_trouble(jsd_relay *r, const char *what)
{
    jsd__relay_store_trouble_on(r, r->store, what);
}

void jsd__relay_nats_trouble(jsd_relay *r, const char *why)
{
    int64_t now = jsd__mono_ms();
    pthread_mutex_lock(&r->err_mu);
    jsd__err(&r->err, JSD_ERR_NATS, "%s", why);
    bool warn = now - r->last_nats_warn_ms >= 5000;
    if (warn)
        r->last_nats_warn_ms = now;
    pthread_mutex_unlock(&r->err_mu);
    if (warn)
        JSD_WARN(COMP, "%s; the effects wait (no attempt is spent) and are tried again", why);
}
static void sleep_us(long us)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = us * 1000};
    nanosleep(&ts, NULL);
}

/* Collect finished publications (waiting up to timeout_ms for the first) and
 * hand every batch that is complete to the writer. Returns the number of
 * batches handed over. */
static int drain(jsd_relay *r, int timeout_ms, size_t *collected)
{
    jsd_publish_done done[64];
    size_t got, total = 0;
    int wait = timeout_ms;
    jsd__relay_resend_due(r);
    while ((got = jsd__pubengine_poll(r->eng, done, JSD_ARRAY_LEN(done), wait)) > 0) {
        for (size_t i = 0; i < got; i++) {
            if (*(const uint8_t *)done[i].user == REF_GROUP) {
                jsd__relay_group_done(r, done[i].user, &done[i].result);
                continue;
            }
            slot *sl = done[i].user;
            rbatch *b = sl->b;
            jsd__relay_settle(r, sl, &done[i].result, &b->eb.items[sl->idx]);
            b->pending--;
            r->in_flight--;
        }
        total += got;
        wait = 0;
        if (got < JSD_ARRAY_LEN(done) || total >= DRAIN_MAX)
            break;
    }
    if (collected)
        *collected = total;
    atomic_store(&r->n_inflight, r->in_flight);

    /* Batches finish in any order (acks arrive out of order); write each one
     * as soon as all its publications are settled. */
    int finished = 0;
    rbatch **pp = &r->head, *prev = NULL;
    while (*pp) {
        rbatch *b = *pp;
        if (b->pending == 0) {
            *pp = b->next;
            if (r->tail == b)
                r->tail = prev;
            jsd__relay_hand_over(r, b);
            finished++;
            continue;
        }
        prev = b;
        pp = &b->next;
    }
    return finished;
}

/* How long until the store's next due time (a durable timer, a backoff, or a
 * lease that expires): *found false when nothing is pending. Due times in the
 * past give 0. */
static void next_due_in(jsd_relay *r, bool *found, int64_t *in_ms)
{
    int64_t next_due = 0;
    *found = false;
    *in_ms = 0;
    pthread_mutex_lock(&r->store_mu);
    jsd_status s = jsd__store_next_due(r->store, found, &next_due);
    if (s != JSD_OK)
        jsd__relay_store_trouble(r, "next due time");
    pthread_mutex_unlock(&r->store_mu);
    if (s != JSD_OK) {
        *found = true; /* unknown: behave as if something were pending */
        *in_ms = r->o.poll_interval_ms;
        return;
    }
    if (*found)
        *in_ms = JSD_MAX(next_due - jsd__now_ms(), 0);
}

/* Wait for a wake-up, the next due time or the poll interval, whichever comes
 * first, in slices so that jsd_relay_stop is noticed. An effect that is due
 * but was not claimable (its ordering key is held by an earlier one) does not
 * make the relay spin: the wait is then at least IDLE_FLOOR_MS. */
static void idle_wait(jsd_relay *r, bool found, int64_t due_in_ms)
{
    int64_t wait = r->o.poll_interval_ms;
    if (found)
        wait = JSD_MIN(wait, JSD_MAX(due_in_ms, IDLE_FLOOR_MS));
    int64_t end = jsd__mono_ms() + wait;
    for (;;) {
        if (atomic_load(&r->stop))
            return;
        int64_t left = end - jsd__mono_ms();
        if (left <= 0)
            return;
        bool woken = false;
        pthread_mutex_lock(&r->store_mu);
        jsd_status s = jsd__store_wait_wakeup(r->store, (int)JSD_MIN(left, STOP_SLICE_MS), &woken);
        if (s != JSD_OK)
            jsd__relay_store_trouble(r, "wait for wake-up");
        pthread_mutex_unlock(&r->store_mu);
        if (s != JSD_OK)
            jsd__sleep_ms(JSD_MIN(left, STOP_SLICE_MS));
        if (woken)
            return;
    }
}

/* A wake-up has come (a commit since the last look), seen without waiting
 * and without taking the store from the receipt writer (on SQLite the two
 * share it): false when the writer holds it. */
static bool woken_now(jsd_relay *r)
{
    if (pthread_mutex_trylock(&r->store_mu) != 0)
        return false;
    bool woken = false;
    jsd_status s = jsd__store_wait_wakeup(r->store, 0, &woken);
    pthread_mutex_unlock(&r->store_mu);
    return s == JSD_OK && woken;
}

/* Wait until the writer has written what it holds (false) or a wake-up
 * arrives (true), looking for the wake-up every millisecond. */
static bool writer_or_wakeup(jsd_relay *r)
{
    while (!jsd__relay_writer_wait(r, 1) && !atomic_load(&r->stop))
        if (woken_now(r))
            return true;
    return false;
}

/* Refresh the gauges. The backlog and the oldest age come from the store:
 * counted by the gauge thread while it runs (relay_gauge.c), else here as
 * often as it would (jsd__relay_gauge_interval_ms); force (the run's end,
 * the gauge thread stopped) counts now, on the gauges' own handle when
 * there is one. */
static void gauges(jsd_relay *r, bool force)
{
    if (!r->mstd)
        return;
    jsd_gauge_set(r->m_inflight, (double)r->in_flight);
    if (!force && (r->gauge_running || jsd__mono_ms() < r->gauges_due_ms))
        return;
    if (r->gstore)
        r->gauges_due_ms = jsd__relay_backlog_refresh(r, r->gstore, NULL);
    else
        r->gauges_due_ms = jsd__relay_backlog_refresh(r, r->store, &r->store_mu);
}

/* Progress to the log every PROGRESS_EVERY_MS while there is activity. */
static void progress(jsd_relay *r, int64_t *last)
{
    gauges(r, false);
    int64_t now = jsd__mono_ms();
    if (now - *last < PROGRESS_EVERY_MS)
        return;
    *last = now;
    uint64_t pub = atomic_load(&r->n_published), err = atomic_load(&r->n_errors);
    if (pub == r->logged_published && err == r->logged_errors)
        return;
    JSD_INFO(COMP,
             "published %llu (+%llu), duplicates %llu, failed attempts %llu, "
             "dead-lettered %llu, in flight %zu",
             (unsigned long long)pub, (unsigned long long)(pub - r->logged_published),
             (unsigned long long)atomic_load(&r->n_duplicates), (unsigned long long)err,
             (unsigned long long)atomic_load(&r->n_dead), r->in_flight);
    r->logged_published = pub;
    r->logged_errors = err;
}

/* After --until-idle: what could not be published is left, counted from the
 * store, logged at warn and kept for jsd_relay_stats_get. */
static void idle_report(jsd_relay *r)
{
    jsd__outbox_trouble t;
    if (jsd__store_outbox_trouble(r->store, &t) != JSD_OK) {
        jsd__relay_store_trouble(r, "counting what is left unpublished");
        atomic_store(&r->left_failing, -1);
        atomic_store(&r->left_dead, -1);
        return;
    }
    atomic_store(&r->left_failing, t.failing);
    atomic_store(&r->left_dead, t.dead_lettered);
    uint64_t dead_now = atomic_load(&r->n_dead);
    if (t.failing > 0 || dead_now > 0)
        JSD_WARN(COMP,
                 "idle, but not everything was published: %lld effect(s) failed and wait for "
                 "a retry, %llu dead-lettered by this run (%lld dead-lettered in the store)",
                 (long long)t.failing, (unsigned long long)dead_now, (long long)t.dead_lettered);
}

/* Claims pause for a moment after the broker was found out (DESIGN 4). */
static void pause_if_broker_out(jsd_relay *r, int64_t *pause_until)
{
    if (r->broker_out) {
        r->broker_out = false;
        *pause_until = jsd__mono_ms() + UNAVAILABLE_PAUSE_MS;
    }
}

static jsd_status run(jsd_relay *r, bool until_idle)
{
    if (!r)
        return JSD_ERR_INVALID;
    int expected = 0;
    if (!atomic_compare_exchange_strong(&r->running, &expected, 1))
        return jsd__relay_err(r, JSD_ERR_BUSY, "the relay is already running");

    bool want_claim = true;  /* a claim may find work */
    int64_t pause_until = 0; /* monotonic: no claims before this */
    bool warned_down = false;
    int64_t idle_since = 0; /* monotonic: since when claims find nothing */
    int64_t last_progress = jsd__mono_ms();
    uint_fast64_t seen_written = atomic_load(&r->written);
    jsd__relay_writer_start(r);
    jsd__relay_gauge_start(r);
    JSD_INFO(COMP, "relay started: batch %d, in flight %d, lease %d ms, poll %d ms",
             r->o.batch_size, r->o.max_in_flight, r->o.lease_ms, r->o.poll_interval_ms);

    while (!atomic_load_explicit(&r->stop, memory_order_relaxed)) {
        int64_t now = jsd__mono_ms();
        bool connected = jsd_conn_is_connected(r->conn);
        if (!connected && jsd__conn_gone(r->conn)) {
            if (r->fatal == JSD_OK) {
                r->fatal = jsd__relay_err(r, JSD_ERR_CONNECT, "%s", GONE_TEXT);
                JSD_ERROR(COMP, "%s; the relay stops", GONE_TEXT);
            }
            atomic_store(&r->stop, 1);
            break;
        }
        if (!connected && !warned_down) {
            JSD_WARN(COMP, "NATS is down: claims pause, the backlog waits in the store");
            warned_down = true;
        } else if (connected && warned_down) {
            JSD_INFO(COMP, "NATS is back: draining the backlog");
            warned_down = false;
            want_claim = true;
        }

        /* Written receipts may unblock the next effect of an ordering key. */
        uint_fast64_t w = atomic_load(&r->written);
        if (w != seen_written) {
            seen_written = w;
            want_claim = true;
        }
        size_t room = jsd__relay_claim_room((size_t)r->o.max_in_flight, r->in_flight,
                                            atomic_load(&r->wq_effects));
        /* Claim full batches only: with room for less, let acks free more
         * first (fewer, larger transactions). */
        size_t full = JSD_MIN((size_t)r->o.batch_size, (size_t)r->o.max_in_flight);
        bool claimed_full = false;
        if (want_claim && connected && now >= pause_until && room >= full &&
            !jsd__relay_acks_due(r->in_flight, r->short_submitted_us, jsd__mono_us()) &&
            !atomic_load(&r->receipts_held)) {
            int ask = (int)JSD_MIN(room, (size_t)r->o.batch_size);
            int got = jsd__relay_claim_and_submit(r, ask);
            if (got < 0) {
                pause_until = now + r->o.poll_interval_ms;
            } else {
                if (got > 0)
                    idle_since = 0;
                want_claim = got == ask;
                claimed_full = want_claim;
                /* A short claim (the outbox is drained) or a few publications
                 * in flight: nothing will share the write, so the coalescing
                 * flusher's millisecond would only be latency (DESIGN 11). */
                if (got > 0 && (got < ask || r->in_flight < ACK_GATHER_MIN))
                    jsd__conn_write_now(r->conn);
                /* Only a short claim's PubAcks are waited for: a full one
                 * means a backlog, where claims go on while publishing. */
                if (got == ask)
                    r->short_submitted_us = 0;
                else if (got > 0)
                    r->short_submitted_us = jsd__mono_us();
            }
            pause_if_broker_out(r, &pause_until);
        }

        bool busy = r->head != NULL;
        if (busy) {
            /* Keep the pipeline full: do not wait for acks while there is room
             * and a claim may find more work. */
            int t = (claimed_full && room - JSD_MIN(room, full) >= full) ? 0 : 2;
            progress(r, &last_progress);
            size_t collected = 0;
            if (drain(r, t, &collected) > 0)
                want_claim = true; /* room again; and ordered keys may be unblocked */
            pause_if_broker_out(r, &pause_until);
            /* Many acks outstanding and only a few arrived: let them gather
             * for a moment rather than waking up once per ack. */
            if (collected > 0 && collected < ACK_GATHER_MIN && r->in_flight >= ACK_GATHER_MIN * 2)
                sleep_us(ACK_GATHER_US);
            if (!want_claim && r->in_flight > 0 && woken_now(r))
                want_claim = true;
            continue;
        }
        if (atomic_load(&r->wq_effects) > 0 && (!want_claim || room < full)) {
            /* Nothing in flight; receipts still being written: once they are,
             * there is room again and a claim may find the next effects of
             * their keys. */
            if (room < full || atomic_load(&r->receipts_held)) {
                (void)jsd__relay_writer_wait(r, -1);
                continue;
            }
            /* There is room: an effect committed meanwhile is claimed on its
             * wake-up, not after the receipt commit (which would otherwise
             * sit on its commit -> PubAck path, issue 12). */
            if (writer_or_wakeup(r))
                want_claim = true;
            continue;
        }
        if (want_claim && connected && jsd__mono_ms() >= pause_until)
            continue;
        /* Nothing in flight, and the last claim found nothing (or we cannot
         * claim right now). */
        bool found = false;
        int64_t due_in = 0;
        next_due_in(r, &found, &due_in);
        if (!want_claim && connected) {
            if (idle_since == 0)
                idle_since = jsd__mono_ms();
            /* --until-idle: done when nothing is pending, or the next due time
             * is more than a lease away (a timer or a backoff, not waited
             * for), or nothing was claimable for longer than a lease (what is
             * left is held back by its ordering key). A lease of a crashed
             * relay expires within lease_ms, so its effects are waited for. */
            if (until_idle &&
                (!found || due_in > r->o.lease_ms ||
                 jsd__mono_ms() - idle_since > (int64_t)r->o.lease_ms + IDLE_FLOOR_MS))
                break;
        }
        progress(r, &last_progress);
        idle_wait(r, found, due_in);
        want_claim = true;
    }

    /* Stopping (or idle): settle what is in flight and write its receipts. */
    while (r->head) {
        if (r->in_flight == 0) {
            drain(r, 0, NULL);
            continue;
        }
        drain(r, STOP_SLICE_MS, NULL);
    }
    (void)jsd__relay_writer_wait(r, -1);
    jsd__relay_writer_stop(r);
    jsd__relay_gauge_stop(r);
    gauges(r, true);
    jsd_relay_stats st;
    jsd_relay_stats_get(r, &st);
    JSD_INFO(COMP,
             "relay stopped: published %llu (duplicates %llu), failed attempts %llu, "
             "dead-lettered %llu (first-attempt duplicates %llu)",
             (unsigned long long)st.published, (unsigned long long)st.duplicates,
             (unsigned long long)st.errors, (unsigned long long)st.dead_lettered,
             (unsigned long long)st.first_attempt_duplicates);
    if (until_idle)
        idle_report(r);
    jsd_status rc = r->fatal;
    if (rc != JSD_OK) {
        r->fatal = JSD_OK; /* the stop was ours, not the caller's */
        atomic_store(&r->stop, 0);
    }
    atomic_store(&r->running, 0);
    return rc;
}

jsd_status jsd_relay_run(jsd_relay *r)
{
    return run(r, false);
}

jsd_status jsd_relay_run_until_idle(jsd_relay *r)
{
    return run(r, true);
}