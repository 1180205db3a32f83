/*
 * The store's common front: opening from a URL (options, the PostgreSQL
 * schema, the namespace and the store id in force), the handle's errors,
 * effect message ids, stats and retention. The application's transaction
 * (validation, emit, inbox, poison) is in tx.c, the relay's operations and
 * the failure policy in outbox.c, the rows shared with the SQLite
 * (sqlite.c) and PostgreSQL (postgres.c) back ends in rows.c.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "store/front.h"
#include "subject.h"

/* ---- errors ------------------------------------------------------------------------ */

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

jsd_status jsd__store_need_idle(jsd_store *s, const char *what)
{
    if (s->tx.active)
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "%s: a transaction is open on this store; commit or roll it back "
                              "first (or use another jsd_store)",
                              what);
    return JSD_OK;
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

bool jsd__pg_schema_name_valid(const char *s)
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

int jsd_store_schema_found(const jsd_store *s)
{
    return s ? s->schema_found : -1;
}

void jsd_store_opts_init(jsd_store_opts *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof(*o));
    o->busy_timeout_ms = 5000;
    o->payload_max = JSD_PAYLOAD_DEFAULT_CAP;
}

/* The URL may hold a password: wipe it before the memory goes back. */
static void forget_open(jsd_store *s)
{
    if (s->open_url)
        jsd__wipe(s->open_url, strlen(s->open_url));
    jsd__free(s->open_url);
    jsd__free(s->open_schema);
    jsd__free(s->open_ns);
    s->open_url = s->open_schema = s->open_ns = NULL;
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
        if (!jsd__pg_schema_name_valid(sch)) {
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
    s->open_url = jsd__strdup(o->url);
    s->open_schema = o->pg_schema ? jsd__strdup(o->pg_schema) : NULL;
    s->open_ns = o->id_namespace ? jsd__strdup(o->id_namespace) : NULL;
    if (!s->open_url || (o->pg_schema && !s->open_schema) || (o->id_namespace && !s->open_ns)) {
        rc = jsd__err(err, JSD_ERR_NOMEM, "out of memory opening the store");
        s->ops->close(s);
        forget_open(s);
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

/* A second handle on s's database, opened with s's options. */
static jsd_status open_again(const jsd_store *s, jsd_store **out, jsd_error *err)
{
    jsd_store_opts o;
    jsd_store_opts_init(&o);
    o.url = s->open_url;
    o.pg_schema = s->open_schema;
    o.id_namespace = s->open_ns;
    o.busy_timeout_ms = s->busy_timeout_ms;
    o.payload_max = s->payload_max;
    return jsd_store_open_opts(out, &o, err);
}

jsd_status jsd__store_open_writer(const jsd_store *s, jsd_store **out, jsd_error *err)
{
    *out = NULL;
    if (s->backend != JSD_STORE_POSTGRES)
        return JSD_OK;
    return open_again(s, out, err);
}

jsd_status jsd__store_open_reader(const jsd_store *s, jsd_store **out, jsd_error *err)
{
    *out = NULL;
    jsd_status rc = open_again(s, out, err);
    if (rc != JSD_OK)
        return rc;
    /* The store id is drawn when a database is made: another id means
     * another database (an SQLite ":memory:" store opened twice). */
    if (strcmp((*out)->store_id, s->store_id) != 0) {
        jsd_store_close(*out);
        *out = NULL;
        return jsd__err(err, JSD_ERR_CONFIG, "a second connection opens another database");
    }
    return JSD_OK;
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
    forget_open(s);
    jsd__free(s);
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

/* ---- stats and retention ---------------------------------------------------------------- */

jsd_status jsd_store_stats_get(jsd_store *s, jsd_store_stats *out)
{
    if (!s || !out)
        return JSD_ERR_INVALID;
    memset(out, 0, sizeof(*out));
    jsd_status rc = jsd__store_need_idle(s, "stats");
    if (rc != JSD_OK)
        return rc;
    return s->ops->stats(s, jsd__now_ms(), false, out);
}

jsd_status jsd__store_backlog(jsd_store *s, int64_t now_ms, jsd_store_stats *out)
{
    if (!s || !out)
        return JSD_ERR_INVALID;
    memset(out, 0, sizeof(*out));
    jsd_status rc = jsd__store_need_idle(s, "backlog");
    if (rc != JSD_OK)
        return rc;
    return s->ops->stats(s, now_ms, true, out);
}

static jsd_status gc_check(jsd_store *s, int64_t older_than_ms, int batch)
{
    jsd_status rc = jsd__store_need_idle(s, "gc");
    if (rc != JSD_OK)
        return rc;
    if (batch <= 0 || batch > 1000000)
        return jsd__store_err(s, JSD_ERR_INVALID, "gc: batch %d is outside 1..1000000", batch);
    if (older_than_ms < 0)
        return jsd__store_err(s, JSD_ERR_INVALID, "gc: older_than_ms %lld is negative",
                              (long long)older_than_ms);
    return JSD_OK;
}

static jsd_status gc_step(jsd_store *s, int64_t cutoff_ms, int batch, bool inbox, int64_t *removed)
{
    if (removed)
        *removed = 0;
    if (!s)
        return JSD_ERR_INVALID;
    jsd_status rc = gc_check(s, 0, batch);
    if (rc != JSD_OK)
        return rc;
    int64_t k = 0;
    rc = s->ops->gc_step(s, cutoff_ms, batch, inbox, &k);
    if (removed)
        *removed = k;
    return rc;
}

jsd_status jsd__store_gc_step(jsd_store *s, int64_t cutoff_ms, int batch, int64_t *removed)
{
    return gc_step(s, cutoff_ms, batch, true, removed);
}

jsd_status jsd_store_gc_outbox_step(jsd_store *s, int64_t older_than_ms, int batch,
                                    int64_t *removed)
{
    if (removed)
        *removed = 0;
    if (!s)
        return JSD_ERR_INVALID;
    jsd_status rc = gc_check(s, older_than_ms, batch);
    if (rc != JSD_OK)
        return rc;
    return gc_step(s, jsd__now_ms() - older_than_ms, batch, false, removed);
}

jsd_status jsd_store_inbox_aged(jsd_store *s, int64_t older_than_ms, jsd_inbox_aged **out,
                                size_t *n)
{
    if (!s || !out || !n)
        return JSD_ERR_INVALID;
    *out = NULL;
    *n = 0;
    jsd_status rc = gc_check(s, older_than_ms, 1);
    if (rc != JSD_OK)
        return rc;
    return s->ops->inbox_aged(s, jsd__now_ms() - older_than_ms, out, n);
}

jsd_status jsd_store_inbox_high_water(jsd_store *s, const char *stream, const char *durable,
                                      uint64_t *seq)
{
    if (!s || !seq)
        return JSD_ERR_INVALID;
    *seq = 0;
    if (!stream || !durable)
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "inbox high-water mark: a stream and a durable are needed");
    return s->ops->inbox_high(s, stream, durable, seq);
}

static jsd_status floor_check(jsd_store *s, const char *stream, const char *durable,
                              const char *what)
{
    if (!stream || !durable || !*stream || !*durable)
        return jsd__store_err(s, JSD_ERR_INVALID, "%s: a stream and a durable are needed", what);
    return jsd__store_need_idle(s, what);
}

jsd_status jsd_store_durable_floor_record(jsd_store *s, const char *stream, const char *durable,
                                          uint64_t floor)
{
    if (!s)
        return JSD_ERR_INVALID;
    jsd_status rc = floor_check(s, stream, durable, "recording a durable's ack floor");
    if (rc != JSD_OK)
        return rc;
    if (floor > (uint64_t)INT64_MAX)
        return jsd__store_err(s, JSD_ERR_INVALID, "ack floor %" PRIu64 " is out of range", floor);
    return s->ops->floor_put(s, stream, durable, floor, jsd__now_ms(), false);
}

jsd_status jsd__store_durable_floor_set(jsd_store *s, const char *stream, const char *durable,
                                        uint64_t floor)
{
    if (!s)
        return JSD_ERR_INVALID;
    jsd_status rc = floor_check(s, stream, durable, "resetting a durable's ack floor");
    if (rc != JSD_OK)
        return rc;
    if (floor > (uint64_t)INT64_MAX)
        return jsd__store_err(s, JSD_ERR_INVALID, "ack floor %" PRIu64 " is out of range", floor);
    return s->ops->floor_put(s, stream, durable, floor, jsd__now_ms(), true);
}

jsd_status jsd_store_durable_floor_get(jsd_store *s, const char *stream, const char *durable,
                                       uint64_t *floor, int64_t *recorded_at_ms)
{
    int64_t at = 0;
    if (!s || !floor)
        return JSD_ERR_INVALID;
    *floor = 0;
    if (recorded_at_ms)
        *recorded_at_ms = 0;
    jsd_status rc = floor_check(s, stream, durable, "reading a durable's recorded ack floor");
    if (rc == JSD_OK)
        rc = s->ops->floor_get(s, stream, durable, floor, &at);
    if (rc == JSD_OK && recorded_at_ms)
        *recorded_at_ms = at;
    return rc;
}

void jsd_inbox_aged_free(jsd_inbox_aged *a, size_t n)
{
    if (!a)
        return;
    for (size_t i = 0; i < n; i++) {
        jsd__free(a[i].stream);
        jsd__free(a[i].durable);
    }
    jsd__free(a);
}

jsd_status jsd_store_gc_inbox_step(jsd_store *s, const char *stream, const char *durable,
                                   int64_t older_than_ms, int64_t max_seq, int batch,
                                   int64_t *removed)
{
    if (removed)
        *removed = 0;
    if (!s)
        return JSD_ERR_INVALID;
    if (!stream || !durable)
        return jsd__store_err(s, JSD_ERR_INVALID,
                              "gc: the inbox step needs a stream and a "
                              "durable");
    jsd_status rc = gc_check(s, older_than_ms, batch);
    if (rc != JSD_OK)
        return rc;
    int64_t k = 0;
    rc = s->ops->gc_inbox(s, stream, durable, jsd__now_ms() - older_than_ms, max_seq, batch, &k);
    if (removed)
        *removed = rc == JSD_OK ? k : 0;
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

bool jsd__store_outage(jsd_status st)
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
