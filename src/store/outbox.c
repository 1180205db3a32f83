/*
 * The store's front for the relay's side of the outbox: claiming effects
 * under a lease, recording receipts, releasing and requeueing, the wake-up
 * wait, and the failure policy, decided here once for both back ends: the
 * capped exponential backoff with deterministic jitter, the attempt budget
 * and the dead-letter reason. A back end reads the attempts of the failed
 * rows and writes the updates decided here (backend.h), nothing more.
 */
#include <string.h>

#include "store/front.h"

/* ---- backoff ------------------------------------------------------------------------ */

void jsd__backoff_init(jsd__backoff *b)
{
    b->base_ms = 1000;
    b->cap_ms = 300000;
    b->jitter_pct = 20;
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

int64_t jsd__backoff_delay_ms(const jsd__backoff *b, int n, int64_t row_id)
{
    jsd__backoff def;
    if (!b) {
        jsd__backoff_init(&def);
        b = &def;
    }
    int64_t base = b->base_ms > 0 ? b->base_ms : 1;
    int64_t cap = b->cap_ms >= base ? b->cap_ms : base;
    int64_t d = base;
    for (int i = 1; i < n && d < cap; i++)
        d = d > cap / 2 ? cap : d * 2;
    if (d > cap)
        d = cap;
    int pct = b->jitter_pct < 0 ? 0 : b->jitter_pct > 100 ? 100 : b->jitter_pct;
    if (pct) {
        uint64_t h = splitmix64((uint64_t)row_id * 1000003u + (uint64_t)n);
        double frac = (double)(h >> 11) / 9007199254740992.0; /* [0, 1) */
        d -= (int64_t)((double)d * pct / 100.0 * frac);
    }
    return d;
}

static void dead_reason(char *out, size_t cap, const jsd__failure *f, int attempts, int budget)
{
    const char *e = f->error ? f->error : "unknown error";
    if (f->dead_letter_now)
        jsd__snprintf(out, cap, "permanent failure after %d attempt%s: %.900s", attempts,
                      attempts == 1 ? "" : "s", e);
    else
        jsd__snprintf(out, cap, "attempt budget of %d spent: %.900s", budget, e);
}

/* The failure policy, decided here for both back ends: a failed effect that
 * reached its attempt budget, or failed permanently, is dead-lettered now;
 * any other is due again after its backoff. */
static void decide_failure(const jsd__failure *f, int attempts, const jsd__backoff *b, int budget,
                           int64_t now, jsd__failure_update *u)
{
    int next = attempts + 1;
    u->row_id = f->row_id;
    u->attempts = next;
    jsd__strlcpy(u->error, f->error ? f->error : "unknown error", sizeof(u->error));
    u->first_attempt_at = f->attempted_ms;
    u->dead = f->dead_letter_now || next >= budget;
    if (u->dead) {
        dead_reason(u->reason, sizeof(u->reason), f, next, budget);
        u->next_attempt_at = now;
        u->dead_at = now;
    } else {
        u->next_attempt_at = now + jsd__backoff_delay_ms(b, f->retry_soon ? 1 : next, f->row_id);
        u->dead_at = 0;
        u->reason[0] = '\0';
    }
}

/* ---- relay operations -------------------------------------------------------------- */

static jsd_status check_token(jsd_store *s, const char *token)
{
    size_t n = token ? strlen(token) : 0;
    if (n == 0 || n >= JSD__LEASE_TOKEN_MAX)
        return jsd__store_err(s, JSD_ERR_INVALID, "lease token must be 1..%d characters",
                              JSD__LEASE_TOKEN_MAX - 1);
    return JSD_OK;
}

jsd_status jsd__store_claim(jsd_store *s, int max, int64_t lease_ms, const char *lease_token,
                            int64_t now_ms, jsd__effect_batch *out)
{
    if (!s || !out)
        return JSD_ERR_INVALID;
    jsd__effect_batch_clear(out);
    jsd_status rc;
    if ((rc = jsd__store_need_idle(s, "claim")) != JSD_OK ||
        (rc = check_token(s, lease_token)) != JSD_OK)
        return rc;
    if (max <= 0 || max > 100000)
        return jsd__store_err(s, JSD_ERR_INVALID, "claim: max %d is outside 1..100000", max);
    if (lease_ms <= 0)
        return jsd__store_err(s, JSD_ERR_INVALID, "claim: lease_ms %lld must be positive",
                              (long long)lease_ms);
    rc = s->ops->claim(s, max, lease_ms, lease_token, now_ms, out);
    if (rc != JSD_OK)
        jsd__effect_batch_clear(out);
    else
        jsd__batch_sort(out);
    return rc;
}

static jsd_status record_receipts(jsd_store *s, const char *lease_token, const jsd__receipt *r,
                                  size_t n, size_t *applied, bool sync)
{
    if (applied)
        *applied = 0;
    if (!s || (n && !r))
        return JSD_ERR_INVALID;
    jsd_status rc;
    if ((rc = jsd__store_need_idle(s, "receipts")) != JSD_OK ||
        (rc = check_token(s, lease_token)) != JSD_OK)
        return rc;
    for (size_t i = 0; i < n; i++) {
        if (!r[i].stream || !*r[i].stream || strlen(r[i].stream) > JSD_IDENT_MAX || r[i].seq == 0 ||
            r[i].seq > (uint64_t)INT64_MAX)
            return jsd__store_err(s, JSD_ERR_INVALID,
                                  "receipt %zu (row %lld) has no stream or a sequence of 0", i,
                                  (long long)r[i].row_id);
    }
    if (n == 0)
        return JSD_OK;
    size_t a = 0;
    rc = s->ops->receipts(s, lease_token, r, n, &a, sync);
    if (applied)
        *applied = a;
    return rc;
}

jsd_status jsd__store_record_receipts(jsd_store *s, const char *lease_token, const jsd__receipt *r,
                                      size_t n, size_t *applied)
{
    return record_receipts(s, lease_token, r, n, applied, true);
}

jsd_status jsd__store_record_receipts_unsynced(jsd_store *s, const char *lease_token,
                                               const jsd__receipt *r, size_t n, size_t *applied)
{
    return record_receipts(s, lease_token, r, n, applied, false);
}

jsd_status jsd__store_sync_receipts(jsd_store *s)
{
    if (!s)
        return JSD_ERR_INVALID;
    return s->ops->sync_receipts ? s->ops->sync_receipts(s) : JSD_OK;
}

jsd_status jsd__store_record_failures(jsd_store *s, const char *lease_token, const jsd__failure *f,
                                      size_t n, const jsd__backoff *b, int budget, int64_t now_ms,
                                      size_t *applied, size_t *dead_lettered)
{
    if (applied)
        *applied = 0;
    if (dead_lettered)
        *dead_lettered = 0;
    if (!s || (n && !f))
        return JSD_ERR_INVALID;
    jsd_status rc;
    if ((rc = jsd__store_need_idle(s, "failures")) != JSD_OK ||
        (rc = check_token(s, lease_token)) != JSD_OK)
        return rc;
    if (n == 0)
        return JSD_OK;
    jsd__backoff def;
    if (!b) {
        jsd__backoff_init(&def);
        b = &def;
    }
    if (budget <= 0)
        budget = JSD__DEFAULT_BUDGET;
    int64_t *ids = jsd__malloc(n * sizeof(*ids));
    int *attempts = jsd__malloc(n * sizeof(*attempts));
    jsd__failure_update *u = jsd__malloc(n * sizeof(*u));
    size_t a = 0, d = 0;
    if (!ids || !attempts || !u) {
        rc = jsd__store_err(s, JSD_ERR_NOMEM, "out of memory recording failures");
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        ids[i] = f[i].row_id;
    if ((rc = s->ops->failures_read(s, lease_token, ids, n, attempts)) != JSD_OK)
        goto out;
    for (size_t i = 0; i < n; i++) {
        bool first = attempts[i] >= 0; /* the first failure given for a row counts */
        for (size_t j = 0; j < i && first; j++)
            first = f[j].row_id != f[i].row_id;
        if (!first)
            continue;
        decide_failure(&f[i], attempts[i], b, budget, now_ms, &u[a]);
        d += u[a].dead;
        a++;
    }
    rc = s->ops->failures_write(s, lease_token, u, a);
out:
    jsd__free(ids);
    jsd__free(attempts);
    jsd__free(u);
    if (rc != JSD_OK)
        a = d = 0;
    if (applied)
        *applied = a;
    if (dead_lettered)
        *dead_lettered = d;
    return rc;
}

jsd_status jsd__store_outbox_trouble(jsd_store *s, jsd__outbox_trouble *out)
{
    if (!s || !out)
        return JSD_ERR_INVALID;
    memset(out, 0, sizeof(*out));
    jsd_status rc = jsd__store_need_idle(s, "outbox trouble");
    if (rc != JSD_OK)
        return rc;
    return s->ops->trouble(s, out);
}

jsd_status jsd__store_release(jsd_store *s, const char *lease_token, const int64_t *row_ids,
                              size_t n, size_t *released)
{
    if (released)
        *released = 0;
    if (!s || (n && !row_ids))
        return JSD_ERR_INVALID;
    jsd_status rc;
    if ((rc = jsd__store_need_idle(s, "release")) != JSD_OK ||
        (rc = check_token(s, lease_token)) != JSD_OK)
        return rc;
    if (n == 0)
        return JSD_OK;
    size_t k = 0;
    rc = s->ops->release(s, lease_token, row_ids, n, &k);
    if (released)
        *released = k;
    return rc;
}

jsd_status jsd__store_requeue_dead(jsd_store *s, const int64_t *row_ids, size_t n, int64_t now_ms,
                                   size_t *requeued)
{
    if (requeued)
        *requeued = 0;
    if (!s || (n && !row_ids))
        return JSD_ERR_INVALID;
    jsd_status rc = jsd__store_need_idle(s, "requeue");
    if (rc != JSD_OK || n == 0)
        return rc;
    size_t k = 0;
    rc = s->ops->requeue(s, row_ids, n, now_ms, &k);
    if (requeued)
        *requeued = k;
    return rc;
}

jsd_status jsd__store_next_due(jsd_store *s, bool *found, int64_t *next_due_ms)
{
    if (!s || !found || !next_due_ms)
        return JSD_ERR_INVALID;
    *found = false;
    *next_due_ms = 0;
    jsd_status rc = jsd__store_need_idle(s, "next_due");
    if (rc != JSD_OK)
        return rc;
    return s->ops->next_due(s, found, next_due_ms);
}

jsd_status jsd__store_wait_wakeup(jsd_store *s, int timeout_ms, bool *woken)
{
    if (woken)
        *woken = false;
    if (!s)
        return JSD_ERR_INVALID;
    jsd_status rc = jsd__store_need_idle(s, "wait_wakeup");
    if (rc != JSD_OK)
        return rc;
    bool w = false;
    rc = s->ops->wait(s, timeout_ms < 0 ? 0 : timeout_ms, &w);
    if (woken)
        *woken = w;
    return rc;
}
