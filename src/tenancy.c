/*
 * tenancy — the mapping table from (tenant, logical topic) to one exact
 * subject and expected stream, and the grants that allow a tenant to publish
 * (SEC-1, SEC-2). A tenant never names a subject: the topic is looked up, the
 * message id is derived from (namespace, tenant, topic, key), and the
 * publication goes through the mapping's bound publisher. Every refusal here
 * happens before any I/O.
 */
#include <string.h>

#include "jsd_int.h"
#include "pubengine.h"
#include "subject.h"

#define TENANT_MAX 64

typedef struct mapping {
    char tenant[TENANT_MAX + 1];
    char topic[JSD_SUBJECT_MAX + 1];
    char subject[JSD_SUBJECT_MAX + 1];
    char stream[JSD_STREAM_NAME_MAX + 1];
    bool granted;
    jsd_publisher *pub;
} mapping;

struct jsd_tenancy {
    jsd_conn *conn;
    char ns[JSD_KEY_MAX + 1];
    int admission;
    int deadline_ms;
    int64_t window_ms;
    mapping m[JSD_TENANCY_MAX];
    size_t n;
    jsd_error last;
};

void jsd_tenancy_opts_init(jsd_tenancy_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->admission = 256;
    o->deadline_ms = 5000;
}

jsd_status jsd_tenancy_create(jsd_tenancy **out, jsd_conn *conn, const jsd_tenancy_opts *o,
                              jsd_error *err)
{
    if (!out)
        return jsd__err(err, JSD_ERR_INVALID, "tenancy: no output handle");
    *out = NULL;
    if (!o)
        return jsd__err(err, JSD_ERR_INVALID, "tenancy: options are required");
    if (!o->ns || !*o->ns)
        return jsd__err(err, JSD_ERR_INVALID, "tenancy: an idempotency namespace is required");
    if (strlen(o->ns) > JSD_KEY_MAX)
        return jsd__err(err, JSD_ERR_LIMIT, "tenancy: namespace is %zu bytes; the limit is %d",
                        strlen(o->ns), JSD_KEY_MAX);
    jsd_status admitted = jsd__admission_check(o->admission, o->deadline_ms, err);
    if (admitted != JSD_OK)
        return admitted;
    jsd_tenancy *t = jsd__calloc(1, sizeof(*t));
    if (!t)
        return jsd__err(err, JSD_ERR_NOMEM, "tenancy: out of memory");
    t->conn = conn;
    jsd__strlcpy(t->ns, o->ns, sizeof(t->ns));
    t->admission = o->admission;
    t->deadline_ms = o->deadline_ms;
    t->window_ms = o->expected_duplicate_window_ms;
    *out = t;
    return JSD_OK;
}

void jsd_tenancy_destroy(jsd_tenancy *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++)
        jsd_publisher_destroy(t->m[i].pub);
    jsd__free(t);
}

const char *jsd_tenancy_errmsg(const jsd_tenancy *t)
{
    return t ? t->last.msg : "";
}

static bool tenant_valid(const char *tenant, jsd_error *err)
{
    if (!tenant || !*tenant) {
        jsd__err(err, JSD_ERR_INVALID, "tenant is empty");
        return false;
    }
    size_t n = strlen(tenant);
    char shown[64];
    jsd__printable(tenant, n, shown, sizeof(shown));
    if (n > TENANT_MAX) {
        jsd__err(err, JSD_ERR_INVALID, "tenant \"%s\" is %zu bytes; the limit is %d", shown, n,
                 TENANT_MAX);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        char c = tenant[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-')) {
            jsd__err(err, JSD_ERR_INVALID, "tenant \"%s\" is not one token of [A-Za-z0-9_-]",
                     shown);
            return false;
        }
    }
    return true;
}

static mapping *find(jsd_tenancy *t, const char *tenant, const char *topic)
{
    for (size_t i = 0; t && tenant && topic && i < t->n; i++)
        if (strcmp(t->m[i].tenant, tenant) == 0 && strcmp(t->m[i].topic, topic) == 0)
            return &t->m[i];
    return NULL;
}

jsd_status jsd_tenancy_map(jsd_tenancy *t, const char *tenant, const char *topic,
                           const char *subject, const char *stream)
{
    if (!t)
        return JSD_ERR_INVALID;
    jsd_error_clear(&t->last);
    jsd_error e;
    if (!tenant_valid(tenant, &t->last))
        return t->last.status;
    if (!jsd__subject_valid_tenant(topic, &e))
        return jsd__err(&t->last, JSD_ERR_INVALID, "topic refused: %s", e.msg);
    if (!jsd__subject_valid_tenant(subject, &e))
        return jsd__err(&t->last, JSD_ERR_INVALID, "mapped subject refused: %s", e.msg);
    if (!jsd__stream_name_valid(stream, &e))
        return jsd__err(&t->last, JSD_ERR_INVALID, "expected stream refused: %s", e.msg);
    if (find(t, tenant, topic))
        return jsd__err(&t->last, JSD_ERR_EXISTS, "tenant \"%s\" already maps topic \"%s\"", tenant,
                        topic);
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->m[i].subject, subject) == 0 && strcmp(t->m[i].tenant, tenant) != 0)
            return jsd__err(&t->last, JSD_ERR_EXISTS,
                            "subject \"%s\" is already mapped for tenant \"%s\"; two tenants "
                            "cannot share a subject",
                            subject, t->m[i].tenant);
    if (t->n >= JSD_TENANCY_MAX)
        return jsd__err(&t->last, JSD_ERR_LIMIT, "the tenancy table holds at most %d mappings",
                        JSD_TENANCY_MAX);
    mapping *m = &t->m[t->n];
    memset(m, 0, sizeof(*m));
    jsd__strlcpy(m->tenant, tenant, sizeof(m->tenant));
    jsd__strlcpy(m->topic, topic, sizeof(m->topic));
    jsd__strlcpy(m->subject, subject, sizeof(m->subject));
    jsd__strlcpy(m->stream, stream, sizeof(m->stream));
    if (t->conn) {
        jsd_publisher_opts o;
        jsd_publisher_opts_init(&o);
        o.stream = stream;
        o.subject = subject;
        o.admission = t->admission;
        o.deadline_ms = t->deadline_ms;
        o.expected_duplicate_window_ms = t->window_ms;
        jsd_status st = jsd_publisher_bind(&m->pub, t->conn, &o, &t->last);
        if (st != JSD_OK)
            return st;
    }
    t->n++;
    return JSD_OK;
}

static jsd_status set_grant(jsd_tenancy *t, const char *tenant, const char *topic, bool on)
{
    if (!t)
        return JSD_ERR_INVALID;
    jsd_error_clear(&t->last);
    mapping *m = find(t, tenant, topic);
    if (!m)
        return jsd__err(&t->last, JSD_ERR_NOT_FOUND,
                        "tenant \"%s\" has no mapping for topic \"%s\"", tenant ? tenant : "",
                        topic ? topic : "");
    m->granted = on;
    return JSD_OK;
}

jsd_status jsd_tenancy_grant(jsd_tenancy *t, const char *tenant, const char *topic)
{
    return set_grant(t, tenant, topic, true);
}

jsd_status jsd_tenancy_revoke(jsd_tenancy *t, const char *tenant, const char *topic)
{
    return set_grant(t, tenant, topic, false);
}

jsd_outcome jsd_tenancy_publish(jsd_tenancy *t, const char *tenant, const char *topic,
                                const char *key, const void *payload, size_t len,
                                const jsd_header *attrs, size_t n_attrs, jsd_publish_result *res)
{
    jsd_publish_result local;
    char id[JSD_IDEMPOTENCY_ID_SIZE];
    jsd_error e;
    if (!res)
        res = &local;
    memset(res, 0, sizeof(*res));
    res->outcome = JSD_OUTCOME_DENIED;
    mapping *m = find(t, tenant, topic);
    if (!m) {
        char st[64], sp[64];
        jsd__printable(tenant, tenant ? strlen(tenant) : 0, st, sizeof(st));
        jsd__printable(topic, topic ? strlen(topic) : 0, sp, sizeof(sp));
        jsd__snprintf(res->reason, sizeof(res->reason),
                      "tenant \"%s\" has no mapping for topic \"%s\"; nothing was sent", st, sp);
        goto out;
    }
    if (!m->granted) {
        jsd__snprintf(res->reason, sizeof(res->reason),
                      "tenant \"%s\" has no grant for topic \"%s\" (missing or revoked); nothing "
                      "was sent",
                      m->tenant, m->topic);
        goto out;
    }
    if (jsd_idempotency_id(t->ns, m->tenant, m->topic, key, id, &e) != JSD_OK) {
        res->outcome = JSD_OUTCOME_REJECTED;
        jsd__strlcpy(res->reason, e.msg, sizeof(res->reason));
        goto out;
    }
    if (!m->pub) {
        res->outcome = JSD_OUTCOME_UNAVAILABLE;
        jsd__strlcpy(res->reason, "the tenancy table has no connection; nothing was sent",
                     sizeof(res->reason));
        goto out;
    }
    return jsd_publish(m->pub, id, payload, len, attrs, n_attrs, res);
out:
    if (t)
        jsd__err(&t->last, JSD_ERR_INVALID, "%s: %s", jsd_outcome_str(res->outcome), res->reason);
    return res->outcome;
}
