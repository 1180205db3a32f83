/*
 * verify — the receipts audited against the stream (include/jsdurable/
 * verify.h, `jsdurable verify`). Pages of receipted effects are read from
 * the store (jsd_outbox_list, keyset by row id, at most 1000 a page); for
 * each one the message at its (stream, sequence) is fetched with a
 * stored-message get (STREAM.MSG.GET: js_GetMsg, which needs no allow_direct)
 * and its Nats-Msg-Id compared with the effect's. A sequence that is gone is
 * judged against the stream's state, read once per stream and read again
 * before anything is called missing (the stream's limits may have moved
 * since): below the first sequence, or older than max age, it expired;
 * otherwise it was acknowledged and then lost. --repair hands the missing
 * and overwritten ones of each page to jsd__store_unpublish, the only write, which takes the
 * receipt back under a guard on the receipt itself, so the relay publishes
 * them again with their stored id.
 *
 * DESIGN (republications past the duplicate window). A relay whose store
 * lost receipts (restored from an older backup, a receipt lost in a crash)
 * publishes those effects again with their stored ids. Inside the stream's
 * duplicate window the broker answers duplicate with the first copy's
 * sequence, the relay reads that message, finds it is the effect's own and
 * takes it as the receipt (relay_claim.c): one copy, and verify checks it
 * like any. Past the window the broker stores a second copy and the new
 * receipt names it: each receipt alone is ok, so the audit of receipts
 * cannot see it. So after the audit each stream's last SCAN_MAX messages
 * up to the highest sequence its ok receipts name are read once (the first
 * copies precede the receipts that replaced them, so the range reaches
 * below the lowest receipt) and every message whose Nats-Msg-Id is an
 * audited effect's at another sequence than its receipt is reported:
 * JSD_VERIFY_REPUBLISHED, a warning, jsd_verify_republished_total. Older
 * sequences are not read, and the warning says so.
 */
#include <inttypes.h>
#include <string.h>

#include "conn_int.h"
#include "store/store.h"

#define STREAMS_MAX   64
#define BATCH_DEFAULT 500
#define SCAN_MAX      20000

const char *jsd_verify_verdict_name(jsd_verify_verdict v)
{
    switch (v) {
    case JSD_VERIFY_OK:
        return "ok";
    case JSD_VERIFY_MISSING:
        return "missing";
    case JSD_VERIFY_OVERWRITTEN:
        return "overwritten";
    case JSD_VERIFY_EXPIRED:
        return "expired";
    case JSD_VERIFY_STREAM_GONE:
        return "stream_gone";
    case JSD_VERIFY_REPUBLISHED:
        return "republished";
    }
    return "?";
}

void jsd_verify_opts_init(jsd_verify_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->batch = BATCH_DEFAULT;
}

/* A stream's state as last read. */
typedef struct vstream {
    char name[JSD_IDENT_MAX + 1];
    bool exists;
    uint64_t first_seq;
    int64_t max_age_ms; /* 0: none */
    int64_t dup_window_ms;
} vstream;

/* An ok receipt, kept for the scan for republished copies. */
typedef struct vrec {
    char *msg_id, *owner, *effect_id;
    int64_t row_id, published_at_ms;
    uint64_t seq;
} vrec;

/* The ok receipts of one stream. */
typedef struct vset {
    char *stream;
    vrec *r;
    size_t n, cap;
    uint64_t lo, hi;
} vset;

typedef struct vrun {
    jsd_store *s;
    jsCtx *js;
    const jsd_verify_opts *o;
    jsd_verify_report *rep;
    jsd_error *err;
    vstream streams[STREAMS_MAX];
    size_t n_streams, next_evict;
    jsd_metric *m[8]; /* checked, ok, missing, overwritten, expired, stream_gone, repaired,
                         republished */
    vset *sets;
    size_t n_sets;
} vrun;

enum { M_CHECKED, M_OK, M_MISSING, M_OVERWRITTEN, M_EXPIRED, M_GONE, M_REPAIRED, M_REPUBLISHED };

/* Keep an ok receipt for the scan. */
static jsd_status remember(vrun *v, const jsd_outbox_entry *e)
{
    vset *set = NULL;
    for (size_t i = 0; i < v->n_sets && !set; i++)
        if (!strcmp(v->sets[i].stream, e->stream))
            set = &v->sets[i];
    if (!set) {
        vset *ns = jsd__realloc(v->sets, (v->n_sets + 1) * sizeof(*ns));
        if (!ns)
            return jsd__err(v->err, JSD_ERR_NOMEM, "verify: out of memory");
        v->sets = ns;
        set = &v->sets[v->n_sets];
        memset(set, 0, sizeof(*set));
        if (!(set->stream = jsd__strdup(e->stream)))
            return jsd__err(v->err, JSD_ERR_NOMEM, "verify: out of memory");
        v->n_sets++;
        set->lo = e->stream_seq;
    }
    if (set->n == set->cap) {
        size_t cap = set->cap ? 2 * set->cap : 256;
        vrec *nr = jsd__realloc(set->r, cap * sizeof(*nr));
        if (!nr)
            return jsd__err(v->err, JSD_ERR_NOMEM, "verify: out of memory");
        set->r = nr;
        set->cap = cap;
    }
    vrec *r = &set->r[set->n];
    *r = (vrec){.msg_id = jsd__strdup(e->msg_id),
                .owner = jsd__strdup(e->owner),
                .effect_id = jsd__strdup(e->effect_id),
                .row_id = e->row_id,
                .published_at_ms = e->published_at_ms,
                .seq = e->stream_seq};
    if (!r->msg_id || !r->owner || !r->effect_id) {
        jsd__free(r->msg_id);
        jsd__free(r->owner);
        jsd__free(r->effect_id);
        return jsd__err(v->err, JSD_ERR_NOMEM, "verify: out of memory");
    }
    set->n++;
    set->lo = JSD_MIN(set->lo, e->stream_seq);
    set->hi = JSD_MAX(set->hi, e->stream_seq);
    return JSD_OK;
}

static void sets_free(vrun *v)
{
    for (size_t i = 0; i < v->n_sets; i++) {
        for (size_t k = 0; k < v->sets[i].n; k++) {
            jsd__free(v->sets[i].r[k].msg_id);
            jsd__free(v->sets[i].r[k].owner);
            jsd__free(v->sets[i].r[k].effect_id);
        }
        jsd__free(v->sets[i].r);
        jsd__free(v->sets[i].stream);
    }
    jsd__free(v->sets);
    v->sets = NULL;
    v->n_sets = 0;
}

static int rec_cmp(const void *a, const void *b)
{
    return strcmp(((const vrec *)a)->msg_id, ((const vrec *)b)->msg_id);
}

/* Read set's stream from lo to hi and report every copy of an audited
 * effect at another sequence than its receipt (DESIGN above). */
static jsd_status scan_set(vrun *v, vset *set)
{
    if (set->n == 0)
        return JSD_OK;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus ns = js_GetStreamInfo(&si, v->js, set->stream, NULL, &jerr);
    if (ns != NATS_OK) {
        char what[400];
        jsd__snprintf(what, sizeof(what), "verify: reading stream %s", set->stream);
        return jsd__err_nats(v->err, ns, jerr, what);
    }
    uint64_t first = JSD_MAX(si->State.FirstSeq, 1);
    jsStreamInfo_Destroy(si);
    uint64_t from = set->hi >= SCAN_MAX ? set->hi - SCAN_MAX + 1 : 1;
    if (from > first)
        JSD_WARN("verify",
                 "stream %s: sequences %" PRIu64 "..%" PRIu64 " not read for republished "
                 "copies (the scan reads the last %d up to the last receipt, %" PRIu64 ")",
                 set->stream, first, from - 1, SCAN_MAX, set->hi);
    from = JSD_MAX(from, first);
    qsort(set->r, set->n, sizeof(*set->r), rec_cmp);
    for (uint64_t seq = from; seq <= set->hi; seq++) {
        natsMsg *m = NULL;
        jerr = 0;
        ns = js_GetMsg(&m, v->js, set->stream, seq, NULL, &jerr);
        if (ns == NATS_NOT_FOUND || jerr == JSNoMessageFoundErr)
            continue;
        if (ns != NATS_OK) {
            char what[400];
            jsd__snprintf(what, sizeof(what), "verify: scanning %s:%" PRIu64, set->stream, seq);
            return jsd__err_nats(v->err, ns, jerr, what);
        }
        const char *id = NULL;
        vrec key = {0};
        if (natsMsgHeader_Get(m, "Nats-Msg-Id", &id) == NATS_OK && id && *id) {
            key.msg_id = (char *)id;
            const vrec *r = bsearch(&key, set->r, set->n, sizeof(*set->r), rec_cmp);
            /* equal ids are adjacent; a receipt's own copy is no finding */
            for (; r && r > set->r && !strcmp(r[-1].msg_id, id); r--)
                ;
            bool own = false;
            for (const vrec *q = r; q && q < set->r + set->n && !strcmp(q->msg_id, id); q++)
                own |= q->seq == seq;
            if (r && !own) {
                v->rep->republished++;
                jsd_counter_inc(v->m[M_REPUBLISHED]);
                JSD_WARN("verify",
                         "effect %s/%s (msg id %s) is in stream %s twice: at %" PRIu64
                         " (its receipt) and at %" PRIu64
                         ": published again past the duplicate window (a receipt the store "
                         "lost?)",
                         r->owner, r->effect_id, r->msg_id, set->stream, r->seq, seq);
                jsd_verify_finding x = {.verdict = JSD_VERIFY_REPUBLISHED,
                                        .row_id = r->row_id,
                                        .owner = r->owner,
                                        .effect_id = r->effect_id,
                                        .msg_id = r->msg_id,
                                        .stream = set->stream,
                                        .stream_seq = r->seq,
                                        .published_at_ms = r->published_at_ms,
                                        .found_msg_id = "",
                                        .other_seq = seq};
                if (v->o->on_finding)
                    v->o->on_finding(v->o->user, &x);
            }
        }
        natsMsg_Destroy(m);
    }
    return JSD_OK;
}

static jsd_status register_metrics(vrun *v)
{
    static const struct {
        const char *name, *help;
    } defs[] = {
        {"jsd_verify_checked_total", "receipts verify checked against their stream message"},
        {"jsd_verify_ok_total", "receipts whose stream message carries the effect's msg id"},
        {"jsd_verify_missing_total",
         "receipts whose stream message is gone while the stream keeps its range (lost)"},
        {"jsd_verify_overwritten_total", "receipts whose stream sequence holds another message id"},
        {"jsd_verify_expired_total",
         "receipts below the stream's first sequence or past its max age (expected)"},
        {"jsd_verify_stream_gone_total", "receipts naming a stream that does not exist"},
        {"jsd_verify_repaired_total", "receipts verify --repair took back for republishing"},
        {"jsd_verify_republished_total",
         "copies of audited effects at another sequence of their stream (published again past "
         "the duplicate window)"},
    };
    if (!v->o->metrics)
        return JSD_OK;
    for (size_t i = 0; i < sizeof(defs) / sizeof(defs[0]); i++) {
        jsd_status s = jsd_metrics_register(v->o->metrics, JSD_METRIC_COUNTER, defs[i].name,
                                            defs[i].help, NULL, NULL, NULL, 0, &v->m[i], v->err);
        if (s != JSD_OK)
            return s;
    }
    return JSD_OK;
}

/* Read (or read again) a stream's state into *st. */
static jsd_status stream_read(vrun *v, vstream *st)
{
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus ns = js_GetStreamInfo(&si, v->js, st->name, NULL, &jerr);
    if (ns == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr) {
        st->exists = false;
        return JSD_OK;
    }
    if (ns != NATS_OK) {
        char what[300];
        jsd__snprintf(what, sizeof(what), "verify: reading stream %s", st->name);
        return jsd__err_nats(v->err, ns, jerr, what);
    }
    st->exists = true;
    st->first_seq = si->State.FirstSeq;
    st->max_age_ms = si->Config ? si->Config->MaxAge / 1000000 : 0;
    st->dup_window_ms = si->Config ? si->Config->Duplicates / 1000000 : 0;
    jsStreamInfo_Destroy(si);
    return JSD_OK;
}

static jsd_status stream_get(vrun *v, const char *name, vstream **out)
{
    for (size_t i = 0; i < v->n_streams; i++)
        if (!strcmp(v->streams[i].name, name)) {
            *out = &v->streams[i];
            return JSD_OK;
        }
    size_t slot = v->n_streams < STREAMS_MAX ? v->n_streams++ : v->next_evict++ % STREAMS_MAX;
    vstream *st = &v->streams[slot];
    memset(st, 0, sizeof(*st));
    jsd__strlcpy(st->name, name, sizeof(st->name));
    *out = st;
    jsd_status s = stream_read(v, st);
    if (s != JSD_OK)
        st->name[0] = '\0'; /* never matches: read again next time */
    return s;
}

/* A gone sequence: expired by the stream's limits, or lost. */
static jsd_verify_verdict judge_gone(const vstream *st, const jsd_outbox_entry *e, int64_t now)
{
    if (!st->exists)
        return JSD_VERIFY_STREAM_GONE;
    if (e->stream_seq < st->first_seq)
        return JSD_VERIFY_EXPIRED;
    if (st->max_age_ms > 0 && e->published_at_ms < now - st->max_age_ms)
        return JSD_VERIFY_EXPIRED;
    return JSD_VERIFY_MISSING;
}

/* Judge one receipt; found (cap bytes) receives the id an overwritten
 * sequence holds. */
static jsd_status check_one(vrun *v, const jsd_outbox_entry *e, jsd_verify_verdict *verdict,
                            char *found, size_t cap, vstream **stp)
{
    found[0] = '\0';
    vstream *st = NULL;
    jsd_status s = stream_get(v, e->stream, &st);
    if (s != JSD_OK)
        return s;
    *stp = st;
    if (!st->exists) {
        /* read again before calling it gone: it may have been made since */
        if ((s = stream_read(v, st)) != JSD_OK)
            return s;
        if (!st->exists) {
            *verdict = JSD_VERIFY_STREAM_GONE;
            return JSD_OK;
        }
    }
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    natsStatus ns = js_GetMsg(&m, v->js, e->stream, e->stream_seq, NULL, &jerr);
    if (ns == NATS_OK) {
        const char *id = NULL;
        if (natsMsgHeader_Get(m, "Nats-Msg-Id", &id) != NATS_OK || !id)
            id = "";
        *verdict = !strcmp(id, e->msg_id) ? JSD_VERIFY_OK : JSD_VERIFY_OVERWRITTEN;
        if (*verdict == JSD_VERIFY_OVERWRITTEN)
            jsd__strlcpy(found, id, cap);
        natsMsg_Destroy(m);
        return JSD_OK;
    }
    if (jerr == JSStreamNotFoundErr) {
        st->exists = false;
        *verdict = JSD_VERIFY_STREAM_GONE;
        return JSD_OK;
    }
    if (ns != NATS_NOT_FOUND && jerr != JSNoMessageFoundErr) {
        char what[400];
        jsd__snprintf(what, sizeof(what), "verify: reading %s:%" PRIu64, e->stream, e->stream_seq);
        return jsd__err_nats(v->err, ns, jerr, what);
    }
    int64_t now = jsd__now_ms();
    *verdict = judge_gone(st, e, now);
    if (*verdict == JSD_VERIFY_MISSING) {
        /* The state read earlier may be stale (limits move): read it again. */
        if ((s = stream_read(v, st)) != JSD_OK)
            return s;
        *verdict = judge_gone(st, e, now);
    }
    return JSD_OK;
}

static void count(vrun *v, jsd_verify_verdict verdict)
{
    jsd_verify_report *r = v->rep;
    r->checked++;
    jsd_counter_inc(v->m[M_CHECKED]);
    uint64_t *slot[] = {&r->ok, &r->missing, &r->overwritten, &r->expired, &r->stream_gone};
    (*slot[verdict])++;
    jsd_counter_inc(v->m[M_OK + (int)verdict]);
}

/* What one page found that is not ok, kept until the page is repaired. */
typedef struct vfind {
    size_t idx; /* into the page */
    jsd_verify_verdict verdict;
    char found[JSD_IDENT_MAX + 1];
    int64_t dup_window_ms;
    bool repaired;
} vfind;

/* What --repair takes back: a receipt whose message is lost, whether its
 * sequence is gone (missing) or holds another message (overwritten: the
 * stream was re-created, or its server came back on an older copy of its
 * store and the sequence was reused). Either way the effect's message is not
 * where its receipt says, and only a republication brings it back; a copy
 * the stream still holds elsewhere answers it as a duplicate inside the
 * window, and the consumers' inbox knows the id beyond it. */
static bool repairable(jsd_verify_verdict v)
{
    return v == JSD_VERIFY_MISSING || v == JSD_VERIFY_OVERWRITTEN;
}

static jsd_status repair(vrun *v, const jsd_outbox_entry *page, vfind *f, size_t nf)
{
    jsd__unpublish u[JSD_OUTBOX_PAGE_MAX];
    size_t n = 0;
    for (size_t i = 0; i < nf; i++) {
        if (!repairable(f[i].verdict))
            continue;
        const jsd_outbox_entry *e = &page[f[i].idx];
        u[n].row_id = e->row_id;
        u[n].stream = e->stream;
        u[n].seq = e->stream_seq;
        u[n].why = "republished by verify --repair: the stream lost the message its receipt named";
        n++;
    }
    if (n == 0)
        return JSD_OK;
    size_t done = 0;
    jsd_status s = jsd__store_unpublish(v->s, u, n, jsd__now_ms(), &done);
    if (s != JSD_OK)
        return jsd__err(v->err, s, "verify --repair: %s", jsd_store_errmsg(v->s));
    if (done == n) {
        for (size_t i = 0; i < nf; i++)
            f[i].repaired = repairable(f[i].verdict);
        return JSD_OK;
    }
    /* A row changed meanwhile (a relay, gc): tell which ones were taken back. */
    for (size_t i = 0; i < nf; i++) {
        if (!repairable(f[i].verdict))
            continue;
        jsd_outbox_entry *now = jsd__malloc(sizeof(*now));
        if (!now)
            return jsd__err(v->err, JSD_ERR_NOMEM, "verify --repair: out of memory");
        const jsd_outbox_entry *e = &page[f[i].idx];
        s = jsd_outbox_get(v->s, e->owner, e->effect_id, now);
        f[i].repaired = s == JSD_OK && now->state == JSD_OUTBOX_PENDING &&
                        !strcmp(now->msg_id, e->msg_id) && !strcmp(now->last_error, u[0].why);
        jsd__free(now);
    }
    return JSD_OK;
}

static void report_page(vrun *v, const jsd_outbox_entry *page, const vfind *f, size_t nf)
{
    int64_t now = jsd__now_ms();
    for (size_t i = 0; i < nf; i++) {
        const jsd_outbox_entry *e = &page[f[i].idx];
        jsd_verify_finding x = {
            .verdict = f[i].verdict,
            .row_id = e->row_id,
            .owner = e->owner,
            .effect_id = e->effect_id,
            .msg_id = e->msg_id,
            .stream = e->stream,
            .stream_seq = e->stream_seq,
            .published_at_ms = e->published_at_ms,
            .found_msg_id = f[i].found,
            .repaired = f[i].repaired,
        };
        if (x.repaired) {
            v->rep->repaired++;
            jsd_counter_inc(v->m[M_REPAIRED]);
            x.dup_window_ends_ms = e->published_at_ms + f[i].dup_window_ms;
            x.in_dup_window = f[i].dup_window_ms > 0 && x.dup_window_ends_ms > now;
            v->rep->repaired_in_window += x.in_dup_window;
        }
        if (x.verdict == JSD_VERIFY_MISSING || x.verdict == JSD_VERIFY_OVERWRITTEN ||
            x.verdict == JSD_VERIFY_STREAM_GONE)
            JSD_WARN("verify", "receipt of %s/%s (msg id %s) names %s:%" PRIu64 ": %s%s", e->owner,
                     e->effect_id, e->msg_id, e->stream, e->stream_seq,
                     jsd_verify_verdict_name(x.verdict),
                     x.repaired ? "; taken back for the relay to publish again" : "");
        if (v->o->on_finding)
            v->o->on_finding(v->o->user, &x);
    }
}

jsd_status jsd_verify_run(jsd_store *s, jsd_conn *conn, const jsd_verify_opts *o,
                          jsd_verify_report *out, jsd_error *err)
{
    if (out)
        memset(out, 0, sizeof(*out));
    jsCtx *js = conn ? jsd__conn_js(conn) : NULL;
    if (!s || !js || !o || !out)
        return jsd__err(err, JSD_ERR_INVALID,
                        "verify: store, connection, options and report "
                        "are required");
    if (o->batch == 0 || o->batch > JSD_OUTBOX_PAGE_MAX)
        return jsd__err(err, JSD_ERR_INVALID, "verify: batch %zu is outside 1..%d", o->batch,
                        JSD_OUTBOX_PAGE_MAX);
    if (o->since_ms < 0)
        return jsd__err(err, JSD_ERR_INVALID, "verify: since_ms must be >= 0");
    vrun *v = jsd__calloc(1, sizeof(*v));
    jsd_outbox_entry *page = jsd__malloc(o->batch * sizeof(*page));
    vfind *f = jsd__malloc(o->batch * sizeof(*f));
    jsd_status rc = JSD_OK;
    if (!v || !page || !f) {
        rc = jsd__err(err, JSD_ERR_NOMEM, "verify: out of memory");
        goto out;
    }
    *v = (vrun){.s = s, .js = js, .o = o, .rep = out, .err = err};
    if ((rc = register_metrics(v)) != JSD_OK)
        goto out;
    jsd_outbox_query q = {.state = JSD_OUTBOX_PUBLISHED, .limit = o->batch};
    if (o->since_ms > 0) {
        int64_t from = jsd__now_ms() - o->since_ms;
        q.published_since_ms = from > 0 ? from : 0;
    }
    size_t n = 0;
    do {
        if ((rc = jsd_outbox_list(s, &q, page, &n)) != JSD_OK) {
            rc = jsd__err(err, rc, "verify: reading receipts: %s", jsd_store_errmsg(s));
            break;
        }
        size_t nf = 0;
        for (size_t i = 0; i < n && rc == JSD_OK; i++) {
            jsd_verify_verdict verdict = JSD_VERIFY_OK;
            vstream *st = NULL;
            rc = check_one(v, &page[i], &verdict, f[nf].found, sizeof(f[nf].found), &st);
            if (rc != JSD_OK)
                break;
            count(v, verdict);
            if (verdict == JSD_VERIFY_OK && (rc = remember(v, &page[i])) != JSD_OK)
                break;
            if (verdict != JSD_VERIFY_OK) {
                f[nf].idx = i;
                f[nf].verdict = verdict;
                f[nf].dup_window_ms = st ? st->dup_window_ms : 0;
                f[nf].repaired = false;
                nf++;
            }
        }
        if (rc == JSD_OK && o->repair)
            rc = repair(v, page, f, nf);
        report_page(v, page, f, nf);
        if (o->on_progress)
            o->on_progress(o->user, out);
        if (n)
            q.after_row_id = page[n - 1].row_id;
    } while (rc == JSD_OK && n == q.limit);
    for (size_t i = 0; v && rc == JSD_OK && i < v->n_sets; i++)
        rc = scan_set(v, &v->sets[i]);
out:
    if (v)
        sets_free(v);
    jsd__free(v);
    jsd__free(page);
    jsd__free(f);
    return rc;
}
