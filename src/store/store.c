/*
 * The store's common front: opening from a URL, argument validation and
 * limits, effect message ids, backoff and the failure policy, and the public
 * and internal entry points that dispatch to the SQLite (sqlite.c) or
 * PostgreSQL (postgres.c) back end. The rows both sides share (the headers
 * codec, claimed-effect batches) are in rows.c.
 *
 * Everything a back end receives has been validated here, so both back ends
 * reject bad input with the same status and the same message.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "store/backend.h"
#include "subject.h"

/* ---- errors ------------------------------------------------------------------------ */

static jsd_status front_err(jsd_store *st, jsd_status s, const jsd_error *e)
{
    jsd__err_copy(&st->err, e);
    st->err.status = s;
    return s;
}

const char *jsd_store_errmsg(const jsd_store *s)
{
    if (!s)
        return "no store";
    return s->err.msg[0] ? s->err.msg : jsd_status_str(s->err.status);
}

const jsd_error *jsd_store_error(const jsd_store *s)
{
    return s ? &s->err : NULL;
}

const char *jsd_store_url(const jsd_store *s)
{
    return s ? s->url_safe : "";
}

jsd_store_backend jsd_store_backend_of(const jsd_store *s)
{
    return s ? s->backend : (jsd_store_backend)0;
}

/* ---- URLs -------------------------------------------------------------------------- */

void jsd__store_redact_url(const char *url, char *out, size_t cap)
{
    if (!cap)
        return;
    out[0] = '\0';
    if (!url)
        return;
    size_t o = 0;
#define PUT(c)                                                                                     \
    do {                                                                                           \
        if (o + 1 < cap)                                                                           \
            out[o++] = (c);                                                                        \
    } while (0)
    const char *p = url;
    const char *sch = strstr(url, "://");
    if (sch) {
        const char *auth = sch + 3;
        size_t alen = strlen(auth); /* the last @: passwords may hold / ? # or @ */
        const char *at = NULL;
        for (size_t i = 0; i < alen; i++)
            if (auth[i] == '@')
                at = auth + i;
        for (; p < auth; p++)
            PUT(*p);
        if (at) {
            const char *colon = memchr(auth, ':', (size_t)(at - auth));
            const char *uend = colon ? colon : at;
            for (; p < uend; p++)
                PUT(*p);
            if (colon) {
                PUT(':');
                PUT('*');
                PUT('*');
                PUT('*');
            }
            p = at;
        }
    } else if (strncmp(url, "postgres:", 9) == 0 || strncmp(url, "postgresql:", 11) == 0) {
        /* A mistyped "postgres:user:pw@host" (no "//") is refused as an unknown
         * scheme, quoting this text: hide all between the scheme and the last '@'. */
        const char *at = strrchr(url, '@');
        if (at) {
            const char *colon = strchr(url, ':');
            for (; p <= colon; p++)
                PUT(*p);
            PUT('*');
            PUT('*');
            PUT('*');
            p = at;
        }
    }
    /* The rest, with password=VALUE parameters hidden. */
    while (*p) {
        if ((p == url || p[-1] == '?' || p[-1] == '&' || p[-1] == ' ') &&
            strncasecmp(p, "password=", 9) == 0) {
            for (int i = 0; i < 9; i++)
                PUT(p[i]);
            PUT('*');
            PUT('*');
            PUT('*');
            p += 9;
            while (*p && *p != '&' && *p != ' ')
                p++;
            continue;
        }
        PUT(*p);
        p++;
    }
    out[o] = '\0';
#undef PUT
}

static bool schema_name_valid(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 63)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                  (i > 0 && c >= '0' && c <= '9');
        if (!ok)
            return false;
    }
    return true;
}

/* Remove the parameters named in keys (e.g. "schema") from a URL's query into
 * vals[i] (owned, NULL when absent; the last one given wins), and the rest of
 * the URL into *rest (owned). */
static jsd_status split_params(const char *url, const char *const *keys, char **vals, size_t nkeys,
                               char **rest)
{
    *rest = NULL;
    for (size_t k = 0; k < nkeys; k++)
        vals[k] = NULL;
    const char *q = strchr(url, '?');
    size_t ulen = strlen(url);
    char *ci = jsd__malloc(ulen + 1);
    if (!ci)
        return JSD_ERR_NOMEM;
    if (!q) {
        memcpy(ci, url, ulen + 1);
        *rest = ci;
        return JSD_OK;
    }
    size_t o = (size_t)(q - url);
    memcpy(ci, url, o);
    bool first = true;
    const char *p = q + 1;
    while (*p) {
        size_t len = strcspn(p, "&");
        size_t k = 0;
        for (; k < nkeys; k++) {
            size_t kl = strlen(keys[k]);
            if (len > kl && strncmp(p, keys[k], kl) == 0 && p[kl] == '=')
                break;
        }
        if (k < nkeys) {
            size_t kl = strlen(keys[k]) + 1;
            jsd__free(vals[k]);
            vals[k] = jsd__strndup(p + kl, len - kl);
            if (!vals[k]) {
                for (size_t j = 0; j < nkeys; j++) {
                    jsd__free(vals[j]);
                    vals[j] = NULL;
                }
                jsd__free(ci);
                return JSD_ERR_NOMEM;
            }
        } else if (len > 0) {
            ci[o++] = first ? '?' : '&';
            first = false;
            memcpy(ci + o, p, len);
            o += len;
        }
        p += len;
        if (*p == '&')
            p++;
    }
    ci[o] = '\0';
    *rest = ci;
    return JSD_OK;
}

bool jsd__namespace_valid(const char *ns, jsd_error *err)
{
    size_t n = ns ? strlen(ns) : 0;
    char shown[64];
    jsd__printable(ns, n, shown, sizeof(shown));
    if (n == 0 || n > JSD_NAMESPACE_MAX) {
        jsd__err(err, JSD_ERR_CONFIG,
                 "message-id namespace \"%s\" is %zu bytes; it takes 1..%d bytes of "
                 "[A-Za-z0-9._-] (unset, the store id is used)",
                 shown, n, JSD_NAMESPACE_MAX);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        char c = ns[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-')) {
            jsd__err(err, JSD_ERR_CONFIG,
                     "message-id namespace \"%s\" has byte 0x%02x at %zu; it takes 1..%d bytes "
                     "of [A-Za-z0-9._-]",
                     shown, (unsigned char)c, i, JSD_NAMESPACE_MAX);
            return false;
        }
    }
    return true;
}

/* With the store id the back end read from jsd_meta at open (NULL when the
 * row is missing): set the namespace in force. */
static jsd_status set_identity(jsd_store *s, const char *store_id)
{
    bool hex = store_id && strlen(store_id) == 32;
    for (size_t i = 0; hex && i < 32; i++)
        hex = (store_id[i] >= '0' && store_id[i] <= '9') ||
              (store_id[i] >= 'a' && store_id[i] <= 'f');
    if (store_id && !hex)
        return jsd__store_err(s, JSD_ERR_SCHEMA,
                              "store \"%s\" has a jsd_meta store_id that is not 32 hex digits "
                              "(changed by hand?): restore it from a backup",
                              s->url_safe);
    s->store_id[0] = '\0';
    if (store_id)
        jsd__strlcpy(s->store_id, store_id, sizeof(s->store_id));
    if (s->ns[0])
        return JSD_OK; /* the operator's namespace */
    if (!store_id)
        return jsd__store_err(s, JSD_ERR_SCHEMA,
                              "store \"%s\" has no store_id in jsd_meta (deleted by hand?): "
                              "restore it from a backup, or give the namespace its effects were "
                              "emitted under (namespace=NAME)",
                              s->url_safe);
    jsd__strlcpy(s->ns, store_id, sizeof(s->ns));
    return JSD_OK;
}

const char *jsd_store_namespace(const jsd_store *s)
{
    return s ? s->ns : "";
}

const char *jsd_store_id(const jsd_store *s)
{
    return s ? s->store_id : "";
}

void jsd_store_opts_init(jsd_store_opts *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof(*o));
    o->busy_timeout_ms = 5000;
    o->payload_max = JSD_PAYLOAD_DEFAULT_CAP;
}

jsd_status jsd_store_open(jsd_store **out, const char *url, jsd_error *err)
{
    jsd_store_opts o;
    jsd_store_opts_init(&o);
    o.url = url;
    return jsd_store_open_opts(out, &o, err);
}

jsd_status jsd_store_open_opts(jsd_store **out, const jsd_store_opts *o, jsd_error *err)
{
    jsd_status rc;
    char *conninfo = NULL, *schema = NULL;
    jsd_store *s = NULL;
    jsd_error_clear(err);
    if (!out || !o)
        return jsd__err(err, JSD_ERR_INVALID, "jsd_store_open: out and options are required");
    *out = NULL;
    const char *url = o->url;
    if (!url || !*url)
        return jsd__err(err, JSD_ERR_CONFIG,
                        "store URL is empty: give \"sqlite:PATH\", a file path or "
                        "\"postgres://...\"");
    if (o->busy_timeout_ms < 0)
        return jsd__err(err, JSD_ERR_CONFIG, "busy_timeout_ms %d is negative", o->busy_timeout_ms);
    if (o->payload_max > JSD_PAYLOAD_DEFAULT_CAP)
        return jsd__err(err, JSD_ERR_CONFIG,
                        "payload_max %zu bytes is over %d, the largest payload the relay "
                        "publishes (JSD_PAYLOAD_DEFAULT_CAP): lower it",
                        o->payload_max, JSD_PAYLOAD_DEFAULT_CAP);
    if (o->id_namespace && !jsd__namespace_valid(o->id_namespace, err))
        return JSD_ERR_CONFIG;
    s = jsd__calloc(1, sizeof(*s));
    if (!s)
        return jsd__err(err, JSD_ERR_NOMEM, "out of memory opening the store");
    s->payload_max = o->payload_max ? o->payload_max : JSD_PAYLOAD_DEFAULT_CAP;
    s->busy_timeout_ms = o->busy_timeout_ms;
    s->tx.store = s;
    jsd__store_redact_url(url, s->url_safe, sizeof(s->url_safe));

    bool is_pg = strncmp(url, "postgres://", 11) == 0 || strncmp(url, "postgresql://", 13) == 0;
    /* PostgreSQL URLs lend their query to libpq: take ours out of it. A
     * SQLite path is the rest of the text, so there only a trailing
     * "?namespace=NAME" is a parameter. */
    static const char *const keys[] = {"namespace", "schema"};
    char *vals[2] = {NULL, NULL};
    const char *q = strrchr(url, '?');
    if (is_pg || (q && strncmp(q, "?namespace=", 11) == 0 && !strchr(q, '&')))
        rc = split_params(url, keys, vals, is_pg ? 2 : 1, &conninfo);
    else
        rc = (conninfo = jsd__strdup(url)) ? JSD_OK : JSD_ERR_NOMEM;
    if (rc != JSD_OK) {
        jsd__err(err, rc, "out of memory opening the store");
        goto fail;
    }
    schema = vals[1];
    {
        const char *ns = o->id_namespace ? o->id_namespace : vals[0];
        bool ok = !ns || jsd__namespace_valid(ns, err);
        if (ok && ns)
            jsd__strlcpy(s->ns, ns, sizeof(s->ns));
        jsd__free(vals[0]);
        if (!ok) {
            rc = JSD_ERR_CONFIG;
            goto fail;
        }
    }
    url = conninfo;

    if (is_pg) {
        const char *sch = o->pg_schema && *o->pg_schema ? o->pg_schema : schema;
        if (!sch || !*sch)
            sch = "public";
        if (!schema_name_valid(sch)) {
            rc = jsd__err(err, JSD_ERR_CONFIG,
                          "PostgreSQL schema name \"%.64s\" is not valid: use 1..63 of "
                          "[A-Za-z0-9_], not starting with a digit",
                          sch);
            goto fail;
        }
        rc = jsd__pg_open(s, conninfo, sch, err);
        if (rc != JSD_OK)
            goto fail;
    } else {
        const char *path = url;
        if (strncmp(url, "sqlite:", 7) == 0) {
            path = url + 7;
            if (strncmp(path, "//", 2) == 0)
                path += 2;
        } else if (strstr(url, "://") || strncmp(url, "postgres:", 9) == 0) {
            rc = jsd__err(err, JSD_ERR_CONFIG,
                          "store URL \"%s\" has an unknown scheme: use \"sqlite:PATH\", a "
                          "file path, or \"postgres://...\"",
                          s->url_safe);
            goto fail;
        }
        if (!*path) {
            rc = jsd__err(err, JSD_ERR_CONFIG,
                          "store URL \"%s\" names no file: use \"sqlite:PATH\"", s->url_safe);
            goto fail;
        }
        rc = jsd__sqlite_open(s, path, err);
        if (rc != JSD_OK)
            goto fail;
    }
    rc = set_identity(s, s->meta_id_found ? s->meta_id : NULL);
    if (rc != JSD_OK) {
        jsd__err_copy(err, &s->err);
        s->ops->close(s);
        goto fail;
    }
    jsd__free(conninfo);
    jsd__free(schema);
    *out = s;
    return JSD_OK;
fail:
    jsd__free(conninfo);
    jsd__free(schema);
    jsd__free(s);
    return rc;
}

void jsd_store_close(jsd_store *s)
{
    if (!s)
        return;
    if (s->tx.active) {
        s->ops->tx(s, JSD__TX_ROLLBACK);
        s->tx.active = false;
    }
    if (s->ops)
        s->ops->close(s);
    jsd__free(s);
}

/* ---- validation -------------------------------------------------------------------- */

/* Exact subjects: the shared validator of src/subject.c (PUB-1), with the
 * length reported as JSD_ERR_LIMIT like every other limit of an effect. */
jsd_status jsd__store_check_subject(const char *subject, jsd_error *err)
{
    size_t n = subject ? strlen(subject) : 0;
    if (n > JSD_SUBJECT_MAX)
        return jsd__err(err, JSD_ERR_LIMIT, "subject is %zu bytes; the limit is %d", n,
                        JSD_SUBJECT_MAX);
    if (!jsd__subject_valid_publish(subject, err))
        return err ? err->status : JSD_ERR_INVALID;
    return JSD_OK;
}

/* Valid UTF-8 without control characters. */
static bool text_ok(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c < 0x20 || c == 0x7f)
            return false;
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned int cp;
        if ((c & 0xe0) == 0xc0) {
            len = 2;
            cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3;
            cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (i + len > n)
            return false;
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (p[i + k] & 0x3f);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += len;
    }
    return true;
}

static jsd_status check_ident(const char *what, const char *v, bool required, jsd_error *err)
{
    if (!v) {
        if (required)
            return jsd__err(err, JSD_ERR_INVALID, "effect %s is required", what);
        return JSD_OK;
    }
    size_t n = strlen(v);
    if (n == 0 && required)
        return jsd__err(err, JSD_ERR_INVALID, "effect %s is empty", what);
    if (n > JSD_IDENT_MAX)
        return jsd__err(err, JSD_ERR_LIMIT, "effect %s is %zu bytes; the limit is %d", what, n,
                        JSD_IDENT_MAX);
    if (!text_ok(v, n))
        return jsd__err(err, JSD_ERR_INVALID,
                        "effect %s is not valid UTF-8 text (control characters are refused)", what);
    return JSD_OK;
}

static jsd_status check_header(const jsd_header *h, size_t i, jsd_error *err)
{
    if (!h->name || !h->value)
        return jsd__err(err, JSD_ERR_INVALID, "header %zu has no name or no value", i);
    size_t nl = strlen(h->name), vl = strlen(h->value);
    if (nl == 0)
        return jsd__err(err, JSD_ERR_INVALID, "header %zu has an empty name", i);
    if (nl > JSD_HEADER_NAME_MAX)
        return jsd__err(err, JSD_ERR_LIMIT,
                        "header name \"%.32s...\" is %zu bytes; the limit is %d", h->name, nl,
                        JSD_HEADER_NAME_MAX);
    for (size_t k = 0; k < nl; k++) {
        unsigned char c = (unsigned char)h->name[k];
        if (c <= 0x20 || c >= 0x7f || c == ':')
            return jsd__err(err, JSD_ERR_INVALID,
                            "header %zu name has a byte 0x%02x at %zu: names are printable ASCII "
                            "without spaces or ':'",
                            i, c, k);
    }
    if (strncasecmp(h->name, "Nats-", 5) == 0)
        return jsd__err(err, JSD_ERR_INVALID,
                        "header name \"%s\" is reserved: names starting with \"Nats-\" are set by "
                        "jsdurable and the server",
                        h->name);
    if (vl > JSD_HEADER_VALUE_MAX)
        return jsd__err(err, JSD_ERR_LIMIT, "header \"%s\" value is %zu bytes; the limit is %d",
                        h->name, vl, JSD_HEADER_VALUE_MAX);
    for (size_t k = 0; k < vl; k++) {
        char c = h->value[k];
        if (c == '\r' || c == '\n')
            return jsd__err(err, JSD_ERR_INVALID, "header \"%s\" value holds CR or LF at byte %zu",
                            h->name, k);
    }
    return JSD_OK;
}

/* ---- message ids -------------------------------------------------------------------- */

/* v1 ("jsdurable.effect.v1", owner, id) had no namespace: two stores
 * committing the same (owner, id) into one stream collided in its duplicate
 * window. Rows emitted under v1 keep their stored id; nothing derives v1
 * any more. */
jsd_status jsd_effect_msg_id(const char *ns, const char *owner, const char *id,
                             char out[JSD_MSG_ID_MAX])
{
    if (out)
        out[0] = '\0';
    if (!id || !out || !jsd__namespace_valid(ns, NULL))
        return JSD_ERR_INVALID;
    const char *parts[4] = {"jsdurable.effect.v2", ns, owner ? owner : "", id};
    return jsd__ld_sha256_hex(parts, NULL, 4, out);
}

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
    u->dead = f->dead_letter_now || next >= budget;
    if (u->dead) {
        dead_reason(u->reason, sizeof(u->reason), f, next, budget);
        u->next_attempt_at = now;
        u->dead_at = now;
    } else {
        u->next_attempt_at = now + jsd__backoff_delay_ms(b, next, f->row_id);
        u->dead_at = 0;
        u->reason[0] = '\0';
    }
}

/* ---- transactions ------------------------------------------------------------------- */

static jsd_status need_idle(jsd_store *s, const char *what)
{
    if (s->tx.active)
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "%s: a transaction is open on this store; commit or roll it back "
                              "first (or use another jsd_store)",
                              what);
    return JSD_OK;
}

static jsd_status need_tx(jsd_tx *tx, const char *what)
{
    if (!tx || !tx->active)
        return tx ? jsd__store_err(tx->store, JSD_ERR_INVALID, "%s: no transaction is open", what)
                  : JSD_ERR_INVALID;
    return JSD_OK;
}

jsd_status jsd_tx_begin(jsd_store *s, jsd_tx **out)
{
    if (!s || !out)
        return JSD_ERR_INVALID;
    *out = NULL;
    jsd_status rc = need_idle(s, "jsd_tx_begin");
    if (rc != JSD_OK)
        return rc;
    rc = s->ops->tx(s, JSD__TX_BEGIN);
    if (rc != JSD_OK)
        return rc;
    s->tx.active = true;
    s->tx.emitted = false;
    s->tx.savepoint = false;
    *out = &s->tx;
    return JSD_OK;
}

struct sqlite3 *jsd_tx_sqlite(jsd_tx *tx)
{
    if (!tx || !tx->active || tx->store->backend != JSD_STORE_SQLITE)
        return NULL;
    return jsd__sqlite_handle(tx->store);
}

struct pg_conn *jsd_tx_pg(jsd_tx *tx)
{
    if (!tx || !tx->active || tx->store->backend != JSD_STORE_POSTGRES)
        return NULL;
    return jsd__pg_handle(tx->store);
}

jsd_store *jsd__tx_store(jsd_tx *tx)
{
    return tx ? tx->store : NULL;
}

/* Validate one effect and fill row (pointing into e, and into enc for the
 * headers, allocated into *enc). */
static jsd_status prepare_row(jsd_store *s, const jsd_effect *e, int64_t now, jsd__row *row,
                              unsigned char **enc)
{
    jsd_error err;
    jsd_error_clear(&err);
    jsd_status rc;
    *enc = NULL;
    if (!e)
        return jsd__store_err(s, JSD_ERR_INVALID, "effect is NULL");
    if ((rc = check_ident("id", e->id, true, &err)) != JSD_OK ||
        (rc = check_ident("owner", e->owner, false, &err)) != JSD_OK ||
        (rc = check_ident("order_key", e->order_key, false, &err)) != JSD_OK ||
        (rc = jsd__store_check_subject(e->subject, &err)) != JSD_OK)
        return front_err(s, rc, &err);
    if (e->order_key && !*e->order_key)
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "effect order_key is empty: use NULL for an unordered effect");
    if (e->n_headers > JSD_HEADERS_MAX)
        return jsd__store_err(s, JSD_ERR_LIMIT, "effect has %zu headers; the limit is %d",
                              e->n_headers, JSD_HEADERS_MAX);
    if (e->n_headers && !e->headers)
        return jsd__store_err(s, JSD_ERR_INVALID, "effect n_headers is %zu but headers is NULL",
                              e->n_headers);
    size_t wire = JSD_HEADERS_RESERVED_BYTES;
    for (size_t i = 0; i < e->n_headers; i++) {
        if ((rc = check_header(&e->headers[i], i, &err)) != JSD_OK)
            return front_err(s, rc, &err);
        wire += jsd__header_wire_size(strlen(e->headers[i].name), strlen(e->headers[i].value));
    }
    if (wire > JSD_HEADERS_MAX_BYTES)
        return jsd__store_err(s, JSD_ERR_LIMIT,
                              "effect headers are %zu bytes as encoded on the wire; the limit is "
                              "%d (%d of the %d-byte header limit are kept for the relay's own)",
                              wire - JSD_HEADERS_RESERVED_BYTES,
                              JSD_HEADERS_MAX_BYTES - JSD_HEADERS_RESERVED_BYTES,
                              JSD_HEADERS_RESERVED_BYTES, JSD_HEADERS_MAX_BYTES);
    if (e->len && !e->payload)
        return jsd__store_err(s, JSD_ERR_INVALID, "effect len is %zu but payload is NULL", e->len);
    if (e->len > s->payload_max)
        return jsd__store_err(s, JSD_ERR_LIMIT,
                              "effect payload is %zu bytes; the limit is %zu (payload_max)", e->len,
                              s->payload_max);
    if (e->not_before_ms < 0)
        return jsd__store_err(s, JSD_ERR_INVALID, "effect not_before_ms %lld is negative",
                              (long long)e->not_before_ms);
    memset(row, 0, sizeof(*row));
    row->owner = e->owner ? e->owner : "";
    row->effect_id = e->id;
    row->subject = e->subject;
    row->payload = e->len ? e->payload : "";
    row->len = e->len;
    row->order_key = e->order_key;
    row->created_at = now;
    row->not_before = e->not_before_ms ? e->not_before_ms : now;
    if ((rc = jsd_effect_msg_id(s->ns, row->owner, row->effect_id, row->msg_id)) != JSD_OK)
        return jsd__store_err(s, rc, "cannot derive the effect's message id (%s)",
                              jsd_status_str(rc));
    if (e->n_headers) {
        row->headers_len = jsd__headers_encoded_size(e->headers, e->n_headers);
        *enc = jsd__malloc(row->headers_len);
        if (!*enc)
            return jsd__store_err(s, JSD_ERR_NOMEM, "out of memory encoding headers");
        jsd__headers_encode(e->headers, e->n_headers, *enc);
        row->headers = *enc;
    }
    return JSD_OK;
}

/* The index of the first row whose identity repeats an earlier row of the
 * batch, or n. A small open-addressing set of (owner, id) hashes. */
static uint64_t ident_hash(const jsd__row *r)
{
    uint64_t h = 1469598103934665603ULL;
    for (const char *p = r->owner; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    h = (h ^ 0xff) * 1099511628211ULL; /* separator: ("ab","c") != ("a","bc") */
    for (const char *p = r->effect_id; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    return h;
}

static size_t first_repeat(const jsd__row *rows, size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    size_t *slot = jsd__calloc(cap, sizeof(size_t)); /* row index + 1; 0 = empty */
    if (!slot) {
        for (size_t i = 1; i < n; i++) /* no memory: the slow way */
            for (size_t j = 0; j < i; j++)
                if (!strcmp(rows[i].owner, rows[j].owner) &&
                    !strcmp(rows[i].effect_id, rows[j].effect_id))
                    return i;
        return n;
    }
    size_t found = n;
    for (size_t i = 0; i < n && found == n; i++) {
        size_t k = (size_t)ident_hash(&rows[i]) & (cap - 1);
        while (slot[k]) {
            const jsd__row *o = &rows[slot[k] - 1];
            if (!strcmp(o->owner, rows[i].owner) && !strcmp(o->effect_id, rows[i].effect_id)) {
                found = i;
                break;
            }
            k = (k + 1) & (cap - 1);
        }
        if (found == n)
            slot[k] = i + 1;
    }
    jsd__free(slot);
    return found;
}

jsd_status jsd_tx_emit_batch(jsd_tx *tx, const jsd_effect *e, size_t n, size_t *bad_index)
{
    jsd_status rc = need_tx(tx, "jsd_tx_emit");
    if (bad_index)
        *bad_index = 0;
    if (rc != JSD_OK)
        return rc;
    jsd_store *s = tx->store;
    if (n == 0)
        return JSD_OK;
    if (!e)
        return jsd__store_err(s, JSD_ERR_INVALID, "effects array is NULL");
    jsd__row one = {0};
    unsigned char *one_enc = NULL;
    jsd__row *rows = n == 1 ? &one : jsd__calloc(n, sizeof(*rows));
    unsigned char **encs = n == 1 ? &one_enc : jsd__calloc(n, sizeof(*encs));
    if (!rows || !encs) {
        rc = jsd__store_err(s, JSD_ERR_NOMEM, "out of memory emitting %zu effects", n);
        goto done;
    }
    int64_t now = jsd__now_ms();
    for (size_t i = 0; i < n; i++) {
        rc = prepare_row(s, &e[i], now, &rows[i], &encs[i]);
        if (rc != JSD_OK) {
            if (bad_index)
                *bad_index = i;
            if (n > 1) {
                char m[JSD_ERRMSG_MAX];
                jsd__strlcpy(m, s->err.msg, sizeof(m));
                jsd__snprintf(s->err.msg, sizeof(s->err.msg), "effect %zu: %s", i, m);
            }
            goto done;
        }
    }
    size_t dup = 0;
    if (n > 1 && (dup = first_repeat(rows, n)) < n) {
        rc = JSD_ERR_EXISTS;
        if (bad_index)
            *bad_index = dup;
        jsd__store_err(s, rc,
                       "effect (owner \"%.128s\", id \"%.128s\") appears twice in the batch: an "
                       "effect identity is emitted once; no effect of this batch was added",
                       rows[dup].owner, rows[dup].effect_id);
        goto done;
    }
    rc = s->ops->emit(s, rows, n, &dup);
    if (rc == JSD_ERR_EXISTS && dup >= n) {
        char cause[JSD_ERRMSG_MAX];
        char state[sizeof(s->err.sqlstate)];
        jsd__strlcpy(cause, s->err.msg, sizeof(cause));
        memcpy(state, s->err.sqlstate, sizeof(state));
        jsd__store_err(s, JSD_ERR_EXISTS,
                       "an effect of this batch was emitted at the same time by another "
                       "transaction; this transaction is aborted: roll it back (%.300s)",
                       cause);
        memcpy(s->err.sqlstate, state, sizeof(state));
    } else if (rc == JSD_ERR_EXISTS) {
        if (bad_index)
            *bad_index = dup;
        jsd__store_err(s, JSD_ERR_EXISTS,
                       "effect (owner \"%.128s\", id \"%.128s\") already exists: an effect "
                       "identity is emitted once%s",
                       rows[dup].owner, rows[dup].effect_id,
                       n > 1 ? "; no effect of this batch was added" : "");
    } else if (rc == JSD_OK) {
        tx->emitted = true;
    }
done:
    if (encs)
        for (size_t i = 0; i < n; i++)
            jsd__free(encs[i]);
    if (n > 1) {
        jsd__free(rows);
        jsd__free(encs);
    }
    return rc;
}

jsd_status jsd_tx_emit(jsd_tx *tx, const jsd_effect *e)
{
    return jsd_tx_emit_batch(tx, e, 1, NULL);
}

jsd_status jsd_tx_commit(jsd_tx *tx)
{
    jsd_status rc = need_tx(tx, "jsd_tx_commit");
    if (rc != JSD_OK)
        return rc;
    jsd_store *s = tx->store;
    JSD_CRASH_POINT("store.before_commit");
    rc = s->ops->tx(s, tx->emitted ? JSD__TX_COMMIT_NOTIFY : JSD__TX_COMMIT);
    if (rc != JSD_OK) {
        jsd_error keep = s->err;
        s->ops->tx(s, JSD__TX_ROLLBACK);
        s->err = keep;
    }
    tx->active = false;
    return rc;
}

void jsd_tx_rollback(jsd_tx *tx)
{
    if (!tx || !tx->active)
        return;
    jsd_error keep = tx->store->err;
    tx->store->ops->tx(tx->store, JSD__TX_ROLLBACK);
    tx->store->err = keep;
    tx->active = false;
}

/* One savepoint operation: SAVEPOINT needs none open, RELEASE and ROLLBACK TO
 * need one; on success the transaction notes whether one is open now. */
static jsd_status savepoint_step(jsd_tx *tx, const char *fn, jsd__txop op, bool needs_open)
{
    jsd_status rc = need_tx(tx, fn);
    if (rc != JSD_OK)
        return rc;
    if (tx->savepoint != needs_open)
        return jsd__store_err(tx->store, JSD_ERR_INVALID,
                              needs_open ? "no savepoint is open" : "a savepoint is already open");
    rc = tx->store->ops->tx(tx->store, op);
    if (rc == JSD_OK)
        tx->savepoint = !needs_open;
    return rc;
}

jsd_status jsd__tx_savepoint(jsd_tx *tx)
{
    return savepoint_step(tx, "jsd__tx_savepoint", JSD__TX_SAVEPOINT, false);
}

jsd_status jsd__tx_release(jsd_tx *tx)
{
    return savepoint_step(tx, "jsd__tx_release", JSD__TX_RELEASE, true);
}

jsd_status jsd__tx_rollback_to(jsd_tx *tx)
{
    return savepoint_step(tx, "jsd__tx_rollback_to", JSD__TX_ROLLBACK_TO, true);
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
    if ((rc = need_idle(s, "claim")) != JSD_OK || (rc = check_token(s, lease_token)) != JSD_OK)
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

jsd_status jsd__store_record_receipts(jsd_store *s, const char *lease_token, const jsd__receipt *r,
                                      size_t n, size_t *applied)
{
    if (applied)
        *applied = 0;
    if (!s || (n && !r))
        return JSD_ERR_INVALID;
    jsd_status rc;
    if ((rc = need_idle(s, "receipts")) != JSD_OK || (rc = check_token(s, lease_token)) != JSD_OK)
        return rc;
    for (size_t i = 0; i < n; i++) {
        if (!r[i].stream || !*r[i].stream || strlen(r[i].stream) > 256 || r[i].seq == 0 ||
            r[i].seq > (uint64_t)INT64_MAX)
            return jsd__store_err(s, JSD_ERR_INVALID,
                                  "receipt %zu (row %lld) has no stream or a sequence of 0", i,
                                  (long long)r[i].row_id);
    }
    if (n == 0)
        return JSD_OK;
    size_t a = 0;
    rc = s->ops->receipts(s, lease_token, r, n, &a);
    if (applied)
        *applied = a;
    return rc;
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
    if ((rc = need_idle(s, "failures")) != JSD_OK || (rc = check_token(s, lease_token)) != JSD_OK)
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
    jsd_status rc = need_idle(s, "outbox trouble");
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
    if ((rc = need_idle(s, "release")) != JSD_OK || (rc = check_token(s, lease_token)) != JSD_OK)
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
    jsd_status rc = need_idle(s, "requeue");
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
    jsd_status rc = need_idle(s, "next_due");
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
    jsd_status rc = need_idle(s, "wait_wakeup");
    if (rc != JSD_OK)
        return rc;
    bool w = false;
    rc = s->ops->wait(s, timeout_ms < 0 ? 0 : timeout_ms, &w);
    if (woken)
        *woken = w;
    return rc;
}

/* ---- inbox ---------------------------------------------------------------------------- */

static jsd_status check_delivery(jsd_store *s, const char *stream, const char *consumer,
                                 uint64_t seq)
{
    if (!stream || !*stream || strlen(stream) > 256 || !consumer || !*consumer ||
        strlen(consumer) > 256)
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "delivery identity needs a stream and a consumer of 1..256 bytes");
    if (seq == 0 || seq > (uint64_t)INT64_MAX)
        return jsd__store_err(s, JSD_ERR_INVALID, "delivery stream sequence %llu is out of range",
                              (unsigned long long)seq);
    if (!text_ok(stream, strlen(stream)) || !text_ok(consumer, strlen(consumer)))
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "delivery stream or consumer is not printable UTF-8");
    return JSD_OK;
}

static jsd_status check_msg_id(jsd_store *s, const char *msg_id)
{
    if (msg_id && (strlen(msg_id) > 256 || !text_ok(msg_id, strlen(msg_id))))
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "message id is over 256 bytes or not printable UTF-8");
    return JSD_OK;
}

jsd_status jsd__tx_inbox_lookup(jsd_tx *tx, const char *stream, const char *consumer,
                                uint64_t stream_seq, bool *found, jsd__inbox_outcome *out)
{
    jsd_status rc = need_tx(tx, "inbox lookup");
    if (found)
        *found = false;
    if (rc != JSD_OK || !found)
        return rc != JSD_OK ? rc : JSD_ERR_INVALID;
    if ((rc = check_delivery(tx->store, stream, consumer, stream_seq)) != JSD_OK)
        return rc;
    return tx->store->ops->inbox_lookup(tx->store, stream, consumer, stream_seq, NULL, found, out);
}

jsd_status jsd__tx_inbox_lookup_msg_id(jsd_tx *tx, const char *stream, const char *consumer,
                                       const char *msg_id, bool *found, jsd__inbox_outcome *out)
{
    jsd_status rc = need_tx(tx, "inbox lookup");
    if (found)
        *found = false;
    if (rc != JSD_OK || !found)
        return rc != JSD_OK ? rc : JSD_ERR_INVALID;
    if ((rc = check_delivery(tx->store, stream, consumer, 1)) != JSD_OK ||
        (rc = check_msg_id(tx->store, msg_id)) != JSD_OK)
        return rc;
    if (!msg_id || !*msg_id)
        return jsd__store_err(tx->store, JSD_ERR_INVALID, "inbox lookup: message id is empty");
    return tx->store->ops->inbox_lookup(tx->store, stream, consumer, 0, msg_id, found, out);
}

jsd_status jsd__tx_inbox_insert(jsd_tx *tx, const char *stream, const char *consumer,
                                uint64_t stream_seq, const char *msg_id, int outcome_code,
                                const char *detail)
{
    jsd_status rc = need_tx(tx, "inbox insert");
    if (rc != JSD_OK)
        return rc;
    jsd_store *s = tx->store;
    if ((rc = check_delivery(s, stream, consumer, stream_seq)) != JSD_OK ||
        (rc = check_msg_id(s, msg_id)) != JSD_OK)
        return rc;
    char cut[JSD__ERROR_TEXT_MAX + 1];
    if (detail) {
        jsd__strlcpy(cut, detail, sizeof(cut));
        detail = cut;
    }
    rc = s->ops->inbox_insert(s, stream, consumer, stream_seq, msg_id && *msg_id ? msg_id : NULL,
                              outcome_code, detail, jsd__now_ms());
    if (rc == JSD_ERR_EXISTS)
        jsd__store_err(s, JSD_ERR_EXISTS,
                       "delivery (stream \"%.64s\", consumer \"%.64s\", sequence %llu) is already "
                       "in the inbox",
                       stream, consumer, (unsigned long long)stream_seq);
    return rc;
}

/* ---- poison ---------------------------------------------------------------------------- */

static jsd_status check_poison(jsd_store *s, const jsd__poison *p)
{
    if (!p)
        return jsd__store_err(s, JSD_ERR_INVALID, "poison record is NULL");
    jsd_status rc = check_delivery(s, p->stream, p->consumer, p->stream_seq);
    if (rc != JSD_OK || (rc = check_msg_id(s, p->msg_id)) != JSD_OK)
        return rc;
    if (!p->subject || strlen(p->subject) > 1024 || !text_ok(p->subject, strlen(p->subject)))
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "poison record subject is missing, over 1024 bytes or unprintable");
    if ((p->len && !p->payload) || (p->headers_len && !p->headers))
        return jsd__store_err(s, JSD_ERR_INVALID, "poison record bytes are NULL with a length");
    return JSD_OK;
}

static jsd_status poison_insert(jsd_store *s, const jsd__poison *p, bool *inserted)
{
    jsd__poison c = *p;
    char diag[JSD__ERROR_TEXT_MAX + 1];
    jsd__strlcpy(diag, p->diagnostic ? p->diagnostic : "", sizeof(diag));
    c.diagnostic = diag;
    bool ins = false;
    jsd_status rc =
        s->ops->poison_insert(s, &c, p->created_at_ms ? p->created_at_ms : jsd__now_ms(), &ins);
    if (inserted)
        *inserted = ins;
    return rc;
}

jsd_status jsd__tx_poison_insert(jsd_tx *tx, const jsd__poison *p, bool *inserted)
{
    if (inserted)
        *inserted = false;
    jsd_status rc = need_tx(tx, "poison insert");
    if (rc != JSD_OK || (rc = check_poison(tx->store, p)) != JSD_OK)
        return rc;
    return poison_insert(tx->store, p, inserted);
}

jsd_status jsd__store_poison_insert(jsd_store *s, const jsd__poison *p, bool *inserted)
{
    if (inserted)
        *inserted = false;
    if (!s)
        return JSD_ERR_INVALID;
    jsd_tx *tx;
    jsd_status rc = check_poison(s, p);
    if (rc != JSD_OK || (rc = jsd_tx_begin(s, &tx)) != JSD_OK)
        return rc;
    rc = poison_insert(s, p, inserted);
    if (rc != JSD_OK) {
        jsd_tx_rollback(tx);
        return rc;
    }
    return jsd_tx_commit(tx);
}

jsd_status jsd__store_poison_mark_published(jsd_store *s, const char *stream, const char *consumer,
                                            uint64_t stream_seq, const char *dlq_stream,
                                            uint64_t dlq_seq)
{
    if (!s)
        return JSD_ERR_INVALID;
    jsd_status rc = need_idle(s, "poison mark");
    if (rc != JSD_OK || (rc = check_delivery(s, stream, consumer, stream_seq)) != JSD_OK)
        return rc;
    if (!dlq_stream || !*dlq_stream || strlen(dlq_stream) > 256 || dlq_seq > (uint64_t)INT64_MAX)
        return jsd__store_err(s, JSD_ERR_INVALID, "dead-letter stream or sequence is not valid");
    return s->ops->poison_mark(s, stream, consumer, stream_seq, dlq_stream, dlq_seq);
}

jsd_status jsd__store_poison_get(jsd_store *s, const char *stream, const char *consumer,
                                 uint64_t stream_seq, jsd__poison_record *out)
{
    if (!s || !out)
        return JSD_ERR_INVALID;
    memset(out, 0, sizeof(*out));
    jsd_status rc = need_idle(s, "poison get");
    if (rc != JSD_OK || (rc = check_delivery(s, stream, consumer, stream_seq)) != JSD_OK)
        return rc;
    jsd__poison_record *recs = NULL;
    size_t n = 0;
    rc = s->ops->poison_read(s, stream, consumer, stream_seq, 0, 1, &recs, &n);
    if (rc != JSD_OK)
        return rc;
    if (n == 0) {
        jsd__free(recs);
        return jsd__store_err(s, JSD_ERR_NOT_FOUND,
                              "no poison record for stream \"%.64s\" consumer \"%.64s\" "
                              "sequence %llu",
                              stream, consumer, (unsigned long long)stream_seq);
    }
    *out = recs[0];
    jsd__free(recs);
    return JSD_OK;
}

jsd_status jsd__store_poison_list(jsd_store *s, int64_t after_id, size_t max,
                                  jsd__poison_record **out, size_t *n)
{
    if (!s || !out || !n)
        return JSD_ERR_INVALID;
    *out = NULL;
    *n = 0;
    jsd_status rc = need_idle(s, "poison list");
    if (rc != JSD_OK)
        return rc;
    if (max == 0 || max > 100000)
        return jsd__store_err(s, JSD_ERR_INVALID, "poison list: max %zu is outside 1..100000", max);
    return s->ops->poison_read(s, NULL, NULL, 0, after_id, max, out, n);
}

jsd_status jsd__store_poison_unpublished(jsd_store *s, const char *stream, const char *consumer,
                                         int64_t after_id, size_t max, jsd__poison_record **out,
                                         size_t *n)
{
    if (!s || !stream || !consumer || !out || !n)
        return JSD_ERR_INVALID;
    *out = NULL;
    *n = 0;
    jsd_status rc = need_idle(s, "unpublished poison records");
    if (rc != JSD_OK)
        return rc;
    if (max == 0 || max > 100000)
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "unpublished poison records: max %zu is outside 1..100000", max);
    return s->ops->poison_read(s, stream, consumer, 0, after_id, max, out, n);
}

/* ---- stats and retention ---------------------------------------------------------------- */

jsd_status jsd_store_stats_get(jsd_store *s, jsd_store_stats *out)
{
    if (!s || !out)
        return JSD_ERR_INVALID;
    memset(out, 0, sizeof(*out));
    jsd_status rc = need_idle(s, "stats");
    if (rc != JSD_OK)
        return rc;
    return s->ops->stats(s, jsd__now_ms(), false, out);
}

jsd_status jsd__store_backlog(jsd_store *s, int64_t now_ms, jsd_store_stats *out)
{
    if (!s || !out)
        return JSD_ERR_INVALID;
    memset(out, 0, sizeof(*out));
    jsd_status rc = need_idle(s, "backlog");
    if (rc != JSD_OK)
        return rc;
    return s->ops->stats(s, now_ms, true, out);
}

jsd_status jsd__store_gc_step(jsd_store *s, int64_t cutoff_ms, int batch, int64_t *removed)
{
    if (removed)
        *removed = 0;
    if (!s)
        return JSD_ERR_INVALID;
    jsd_status rc = need_idle(s, "gc");
    if (rc != JSD_OK)
        return rc;
    if (batch <= 0 || batch > 1000000)
        return jsd__store_err(s, JSD_ERR_INVALID, "gc: batch %d is outside 1..1000000", batch);
    int64_t k = 0;
    rc = s->ops->gc_step(s, cutoff_ms, batch, &k);
    if (removed)
        *removed = k;
    return rc;
}

jsd_status jsd_store_gc_step(jsd_store *s, int64_t older_than_ms, int batch, int64_t *removed)
{
    if (removed)
        *removed = 0;
    if (!s)
        return JSD_ERR_INVALID;
    if (older_than_ms < 0)
        return jsd__store_err(s, JSD_ERR_INVALID, "gc: older_than_ms %lld is negative",
                              (long long)older_than_ms);
    return jsd__store_gc_step(s, jsd__now_ms() - older_than_ms, batch, removed);
}

jsd_status jsd_store_gc(jsd_store *s, int64_t older_than_ms, int batch, int64_t *removed)
{
    if (removed)
        *removed = 0;
    if (!s)
        return JSD_ERR_INVALID;
    if (older_than_ms < 0)
        return jsd__store_err(s, JSD_ERR_INVALID, "gc: older_than_ms %lld is negative",
                              (long long)older_than_ms);
    int64_t cutoff = jsd__now_ms() - older_than_ms, total = 0;
    for (;;) {
        int64_t k = 0;
        jsd_status rc = jsd__store_gc_step(s, cutoff, batch, &k);
        total += k;
        if (removed)
            *removed = total;
        if (rc != JSD_OK)
            return rc;
        if (k == 0)
            return JSD_OK;
    }
}
