/*
 * The store's front for the outbox's operator tools (include/jsdurable/
 * outbox.h): bounded pages of effects by state, one effect with its receipt
 * and lease, requeueing dead letters with their message id unchanged, the
 * dead-letter reasons, and taking back the receipts of effects whose stream
 * message was lost (`jsdurable verify --repair`, jsd__store_unpublish). The
 * policy is here (what may be requeued, batch sizes, what a query may ask);
 * the back ends only run the SQL (the "outbox tools" section of sqlite.c and
 * postgres.c).
 */
#include <inttypes.h>
#include <string.h>

#include "store/front.h"

#define REQUEUE_BATCH 500

const char *jsd_outbox_state_name(jsd_outbox_state s)
{
    switch (s) {
    case JSD_OUTBOX_UNPUBLISHED:
        return "unpublished";
    case JSD_OUTBOX_PENDING:
        return "pending";
    case JSD_OUTBOX_DEAD:
        return "dead";
    case JSD_OUTBOX_PUBLISHED:
        return "published";
    }
    return "?";
}

static jsd_status check_identity(jsd_store *s, const char *owner, const char *effect_id)
{
    if (!owner || !effect_id || !*effect_id || strlen(owner) > JSD_IDENT_MAX ||
        strlen(effect_id) > JSD_IDENT_MAX)
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "an effect is named by its owner (0..%d bytes) and its effect id "
                              "(1..%d bytes)",
                              JSD_IDENT_MAX, JSD_IDENT_MAX);
    return JSD_OK;
}

jsd_status jsd_outbox_list(jsd_store *s, const jsd_outbox_query *q, jsd_outbox_entry *out,
                           size_t *n)
{
    if (n)
        *n = 0;
    if (!s || !q || !out || !n)
        return JSD_ERR_INVALID;
    jsd_status rc = jsd__store_need_idle(s, "outbox list");
    if (rc != JSD_OK)
        return rc;
    if (q->limit == 0 || q->limit > JSD_OUTBOX_PAGE_MAX)
        return jsd__store_err(s, JSD_ERR_INVALID, "outbox list: limit %zu is outside 1..%d",
                              q->limit, JSD_OUTBOX_PAGE_MAX);
    if (q->state < JSD_OUTBOX_UNPUBLISHED || q->state > JSD_OUTBOX_PUBLISHED)
        return jsd__store_err(s, JSD_ERR_INVALID, "outbox list: unknown state %d", (int)q->state);
    if (q->subject && (!*q->subject || strlen(q->subject) > JSD_SUBJECT_MAX))
        return jsd__store_err(s, JSD_ERR_INVALID, "outbox list: a subject is 1..%d bytes",
                              JSD_SUBJECT_MAX);
    if (q->after_row_id < 0 || q->published_since_ms < 0)
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "outbox list: after_row_id and published_since_ms are >= 0");
    rc = s->ops->tool_list(s, q, jsd__now_ms(), out, n);
    if (rc != JSD_OK)
        *n = 0;
    return rc;
}

jsd_status jsd_outbox_get(jsd_store *s, const char *owner, const char *effect_id,
                          jsd_outbox_entry *out)
{
    if (!s || !out)
        return JSD_ERR_INVALID;
    memset(out, 0, sizeof(*out));
    jsd_status rc;
    if ((rc = jsd__store_need_idle(s, "outbox get")) != JSD_OK ||
        (rc = check_identity(s, owner, effect_id)) != JSD_OK)
        return rc;
    bool found = false;
    if ((rc = s->ops->tool_get(s, owner, effect_id, jsd__now_ms(), out, &found)) != JSD_OK)
        return rc;
    if (!found)
        return jsd__store_err(s, JSD_ERR_NOT_FOUND,
                              "store \"%s\" has no effect with owner \"%s\" and id \"%s\"",
                              s->url_safe, owner, effect_id);
    return JSD_OK;
}

jsd_status jsd_outbox_requeue(jsd_store *s, const char *owner, const char *effect_id,
                              bool *requeued)
{
    if (requeued)
        *requeued = false;
    if (!s)
        return JSD_ERR_INVALID;
    jsd_outbox_entry *e = jsd__malloc(sizeof(*e));
    if (!e)
        return jsd__store_err(s, JSD_ERR_NOMEM, "out of memory reading an effect");
    jsd_status rc = jsd_outbox_get(s, owner, effect_id, e);
    if (rc == JSD_OK && e->state == JSD_OUTBOX_PUBLISHED) {
        rc = jsd__store_err(s, JSD_ERR_INVALID,
                            "effect \"%s\"/\"%s\" is published (stream %s, sequence %" PRIu64
                            "): requeueing it would publish it again. If the stream lost that "
                            "message, `jsdurable verify --repair` republishes it",
                            owner, effect_id, e->stream, e->stream_seq);
    } else if (rc == JSD_OK && e->state == JSD_OUTBOX_DEAD) {
        size_t k = 0;
        rc = s->ops->requeue(s, &e->row_id, 1, jsd__now_ms(), &k);
        if (rc == JSD_OK && requeued)
            *requeued = k == 1;
    }
    jsd__free(e);
    return rc;
}

jsd_status jsd_outbox_requeue_dead(jsd_store *s, const char *subject, int64_t *requeued)
{
    if (requeued)
        *requeued = 0;
    if (!s)
        return JSD_ERR_INVALID;
    jsd_outbox_query q = {.state = JSD_OUTBOX_DEAD, .subject = subject, .limit = REQUEUE_BATCH};
    jsd_outbox_entry *page = jsd__malloc(REQUEUE_BATCH * sizeof(*page));
    int64_t ids[REQUEUE_BATCH];
    if (!page)
        return jsd__store_err(s, JSD_ERR_NOMEM, "out of memory requeueing dead letters");
    jsd_status rc;
    size_t n;
    do {
        if ((rc = jsd_outbox_list(s, &q, page, &n)) != JSD_OK || n == 0)
            break;
        for (size_t i = 0; i < n; i++)
            ids[i] = page[i].row_id;
        size_t k = 0;
        rc = s->ops->requeue(s, ids, n, jsd__now_ms(), &k);
        if (requeued)
            *requeued += (int64_t)k;
        q.after_row_id = page[n - 1].row_id;
    } while (rc == JSD_OK && n == REQUEUE_BATCH);
    jsd__free(page);
    return rc;
}

jsd_status jsd_outbox_dead_reasons(jsd_store *s, jsd_outbox_reason *out, size_t cap, size_t *n)
{
    if (n)
        *n = 0;
    if (!s || !n || (cap && !out))
        return JSD_ERR_INVALID;
    jsd_status rc = jsd__store_need_idle(s, "dead-letter reasons");
    if (rc != JSD_OK || cap == 0)
        return rc;
    rc = s->ops->tool_reasons(s, out, cap, n);
    if (rc != JSD_OK)
        *n = 0;
    return rc;
}

jsd_status jsd__store_unpublish(jsd_store *s, const jsd__unpublish *u, size_t n, int64_t now_ms,
                                size_t *done)
{
    if (done)
        *done = 0;
    if (!s || (n && !u))
        return JSD_ERR_INVALID;
    jsd_status rc = jsd__store_need_idle(s, "republish");
    if (rc != JSD_OK || n == 0)
        return rc;
    for (size_t i = 0; i < n; i++)
        if (!u[i].stream || !*u[i].stream || u[i].seq == 0 || u[i].seq > (uint64_t)INT64_MAX)
            return jsd__store_err(s, JSD_ERR_INVALID, "republish %zu (row %lld) names no receipt",
                                  i, (long long)u[i].row_id);
    size_t k = 0;
    rc = s->ops->tool_unpublish(s, u, n, now_ms, &k);
    if (done)
        *done = k;
    return rc;
}
