/*
 * topology_apply — bringing JetStream to a parsed topology file (TOPO-2):
 * read the server's streams and consumers, build a plan (create / keep /
 * update per object), refuse the plan as a whole when one object cannot be
 * brought to the file without deleting it, and only then act. An update
 * starts from the server's own configuration and overwrites only the fields
 * the file declares, so settings the file does not know (deny-delete,
 * placement, ...) survive.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn_int.h"
#include "streams.h"
#include "subject.h"
#include "topology_int.h"

/* ---- applying ------------------------------------------------------------------ */

const char *jsd_topology_action_str(jsd_topology_action a)
{
    switch (a) {
    case JSD_TOPOLOGY_CREATED:
        return "created";
    case JSD_TOPOLOGY_UNCHANGED:
        return "unchanged";
    case JSD_TOPOLOGY_KEPT:
        return "kept";
    case JSD_TOPOLOGY_UPDATED:
        return "updated";
    }
    return "?";
}

void jsd_topology_apply_opts_init(jsd_topology_apply_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->policy = JSD_TOPOLOGY_CREATE;
}

#define MAX_CHANGES 16

typedef struct plan_item {
    bool is_consumer;
    size_t index; /* into streams or consumers */
    char name[300];
    jsd_topology_action action;
    jsd_topology_change changes[MAX_CHANGES];
    size_t n_changes;
    jsStreamInfo *si;   /* existing stream, or NULL */
    json_t *raw;        /* its configuration as the server sent it (every field) */
    jsConsumerInfo *ci; /* existing consumer, or NULL */
} plan_item;

static void fmt_dur(char *out, size_t cap, int64_t ms, bool zero_none)
{
    if (ms == 0 && zero_none)
        jsd__snprintf(out, cap, "none");
    else if (ms < 0)
        jsd__snprintf(out, cap, "unlimited");
    else if (ms % DAY_MS == 0 && ms)
        jsd__snprintf(out, cap, "%lldd", (long long)(ms / DAY_MS));
    else if (ms % (3600 * 1000) == 0 && ms)
        jsd__snprintf(out, cap, "%lldh", (long long)(ms / (3600 * 1000)));
    else if (ms % 60000 == 0 && ms)
        jsd__snprintf(out, cap, "%lldm", (long long)(ms / 60000));
    else if (ms % 1000 == 0 && ms)
        jsd__snprintf(out, cap, "%llds", (long long)(ms / 1000));
    else
        jsd__snprintf(out, cap, "%lldms", (long long)ms);
}

static void fmt_count(char *out, size_t cap, int64_t v)
{
    if (v < 0)
        jsd__snprintf(out, cap, "unlimited");
    else
        jsd__snprintf(out, cap, "%lld", (long long)v);
}

static jsd_topology_change *add_change(plan_item *it, const char *field)
{
    if (it->n_changes >= MAX_CHANGES)
        return NULL;
    jsd_topology_change *ch = &it->changes[it->n_changes++];
    memset(ch, 0, sizeof(*ch));
    ch->field = field;
    return ch;
}

static void diff_count(plan_item *it, const char *field, int64_t server, int64_t file)
{
    if (server <= 0)
        server = -1;
    if (server == file)
        return;
    jsd_topology_change *ch = add_change(it, field);
    if (ch) {
        fmt_count(ch->server, sizeof(ch->server), server);
        fmt_count(ch->file, sizeof(ch->file), file);
    }
}

static void diff_dur(plan_item *it, const char *field, int64_t server_ns, int64_t file_ms,
                     bool zero_none)
{
    int64_t server_ms = server_ns / NS_PER_MS;
    if (server_ms == file_ms)
        return;
    jsd_topology_change *ch = add_change(it, field);
    if (ch) {
        fmt_dur(ch->server, sizeof(ch->server), server_ms, zero_none);
        fmt_dur(ch->file, sizeof(ch->file), file_ms, zero_none);
    }
}

static void diff_word(plan_item *it, const char *field, const char *server, const char *file)
{
    if (!strcmp(server, file))
        return;
    jsd_topology_change *ch = add_change(it, field);
    if (ch) {
        jsd__strlcpy(ch->server, server, sizeof(ch->server));
        jsd__strlcpy(ch->file, file, sizeof(ch->file));
    }
}

static void join_list(char *out, size_t cap, const char *const *items, size_t n)
{
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(out);
        if (!jsd__snprintf(out + len, cap - len, "%s%s", i ? "," : "", items[i])) {
            if (cap > 4)
                memcpy(out + cap - 4, "...", 4);
            return;
        }
    }
}

static bool same_set(const char *const *a, size_t na, const char *const *b, size_t nb)
{
    if (na != nb)
        return false;
    for (size_t i = 0; i < na; i++) {
        bool found = false;
        for (size_t j = 0; j < nb && !found; j++)
            found = !strcmp(a[i], b[j]);
        if (!found)
            return false;
    }
    return true;
}

static const char *storage_word(int v)
{
    return v == js_MemoryStorage ? "memory" : "file";
}
static const char *retention_word(int v)
{
    return v == js_InterestPolicy ? "interest" : v == js_WorkQueuePolicy ? "workqueue" : "limits";
}
static const char *discard_word(int v)
{
    return v == js_DiscardNew ? "new" : "old";
}
static jsStorageType storage_of(jsd_topology_storage s)
{
    return s == JSD_TOPOLOGY_MEMORY ? js_MemoryStorage : js_FileStorage;
}
static jsRetentionPolicy retention_of(jsd_topology_retention r)
{
    return r == JSD_TOPOLOGY_INTEREST    ? js_InterestPolicy
           : r == JSD_TOPOLOGY_WORKQUEUE ? js_WorkQueuePolicy
                                         : js_LimitsPolicy;
}

/* Immutable differences first; they refuse the plan. */
/* The stream's persist mode as the server reports it: servers before 2.12
 * know only the default. */
static const char *persist_word(const json_t *raw)
{
    const char *pm = json_string_value(json_object_get(raw, "persist_mode"));
    return pm && *pm ? pm : "default";
}

static void add_immutable(char *immut, size_t cap, const char *field, const char *server,
                          const char *file)
{
    size_t n = strlen(immut);
    jsd__snprintf(immut + n, cap - n, "%s%s (server %s, file %s)", n ? " and " : "", field, server,
                  file);
}

static jsd_status diff_stream(plan_item *it, const topo_stream *s, const jsStreamConfig *cfg,
                              bool reconcile, jsd_error *err)
{
    const char *fs = storage_word(storage_of(s->pub.storage));
    const char *fr = retention_word(retention_of(s->pub.retention));
    char immut[240] = "";
    if (strcmp(storage_word(cfg->Storage), fs) != 0)
        add_immutable(immut, sizeof(immut), "storage", storage_word(cfg->Storage), fs);
    if (strcmp(retention_word(cfg->Retention), fr) != 0)
        add_immutable(immut, sizeof(immut), "retention", retention_word(cfg->Retention), fr);
    if (s->pub.persist_mode && strcmp(persist_word(it->raw), s->pub.persist_mode) != 0)
        add_immutable(immut, sizeof(immut), "persist_mode", persist_word(it->raw),
                      s->pub.persist_mode);
    if (immut[0] && reconcile)
        return jsd__err(err, JSD_ERR_CONFIG,
                        "stream \"%s\" (%s): %s cannot be changed in place by JetStream; "
                        "jsdurable never deletes a stream to re-create it. Migrate the data to "
                        "a new stream, or change the file to match the server",
                        s->pub.name, s->path, immut);
    diff_word(it, "storage", storage_word(cfg->Storage), fs);
    diff_word(it, "retention", retention_word(cfg->Retention), fr);

    if (!same_set((const char *const *)cfg->Subjects, (size_t)cfg->SubjectsLen, s->subjects,
                  s->pub.n_subjects)) {
        jsd_topology_change *ch = add_change(it, "subjects");
        if (ch) {
            join_list(ch->server, sizeof(ch->server), (const char *const *)cfg->Subjects,
                      (size_t)cfg->SubjectsLen);
            join_list(ch->file, sizeof(ch->file), s->subjects, s->pub.n_subjects);
        }
    }
    if (s->pub.description)
        diff_word(it, "description", cfg->Description ? cfg->Description : "", s->pub.description);
    diff_dur(it, "max_age", cfg->MaxAge, s->pub.max_age_ms, true);
    diff_count(it, "max_bytes", cfg->MaxBytes, s->pub.max_bytes);
    diff_count(it, "max_msgs", cfg->MaxMsgs, s->pub.max_msgs);
    diff_count(it, "max_msgs_per_subject", cfg->MaxMsgsPerSubject, s->pub.max_msgs_per_subject);
    diff_word(it, "discard", discard_word(cfg->Discard),
              s->pub.discard == JSD_TOPOLOGY_DISCARD_NEW ? "new" : "old");
    diff_dur(it, "duplicate_window", cfg->Duplicates, s->pub.duplicate_window_ms, false);
    diff_count(it, "replicas", cfg->Replicas <= 0 ? 1 : cfg->Replicas, s->pub.replicas);
    if (s->pub.allow_atomic >= 0)
        diff_word(it, "allow_atomic",
                  json_is_true(json_object_get(it->raw, "allow_atomic")) ? "true" : "false",
                  s->pub.allow_atomic ? "true" : "false");
    if (s->pub.persist_mode)
        diff_word(it, "persist_mode", persist_word(it->raw), s->pub.persist_mode);
    return JSD_OK;
}

/* The body of a stream create or update request: the server's own
 * configuration (an update), or nothing (a create), with the file's fields
 * written over it. It is JSON built here, not nats.c's jsStreamConfig:
 * nats.c 3.4.1 does not know the fields of newer servers, and an update
 * without one resets it (seen on 2.15.1: an update that leaves out
 * allow_atomic turns atomic batches off; one that leaves out persist_mode
 * of an async stream is refused). Starting from the server's JSON keeps
 * every field the file does not declare as it is. */
static json_t *stream_body(const topo_stream *s, const json_t *server_cfg)
{
    static const char *const retentions[] = {"limits", "interest", "workqueue"};
    json_t *b = server_cfg ? json_deep_copy(server_cfg) : json_object();
    json_t *subjects = json_array();
    if (!b || !subjects) {
        json_decref(b);
        json_decref(subjects);
        return NULL;
    }
    bool ok = true;
    for (size_t i = 0; i < s->pub.n_subjects; i++)
        ok = ok && json_array_append_new(subjects, json_string(s->subjects[i])) == 0;
    ok = ok && json_object_set_new(b, "subjects", subjects) == 0;
    ok = ok && json_object_set_new(b, "name", json_string(s->pub.name)) == 0;
    if (s->pub.description)
        ok = ok && json_object_set_new(b, "description", json_string(s->pub.description)) == 0;
    ok = ok && json_object_set_new(b, "retention", json_string(retentions[s->pub.retention])) == 0;
    ok = ok && json_object_set_new(
                   b, "storage",
                   json_string(s->pub.storage == JSD_TOPOLOGY_MEMORY ? "memory" : "file")) == 0;
    ok = ok && json_object_set_new(b, "max_age", json_integer(s->pub.max_age_ms * NS_PER_MS)) == 0;
    ok = ok && json_object_set_new(b, "max_bytes", json_integer(s->pub.max_bytes)) == 0;
    ok = ok && json_object_set_new(b, "max_msgs", json_integer(s->pub.max_msgs)) == 0;
    ok = ok && json_object_set_new(b, "max_msgs_per_subject",
                                   json_integer(s->pub.max_msgs_per_subject)) == 0;
    ok = ok && json_object_set_new(
                   b, "discard",
                   json_string(s->pub.discard == JSD_TOPOLOGY_DISCARD_NEW ? "new" : "old")) == 0;
    ok = ok && json_object_set_new(b, "duplicate_window",
                                   json_integer(s->pub.duplicate_window_ms * NS_PER_MS)) == 0;
    ok = ok && json_object_set_new(b, "num_replicas", json_integer(s->pub.replicas)) == 0;
    ok = ok && json_object_set_new(b, "no_ack", json_false()) == 0;
    if (s->pub.allow_atomic >= 0)
        ok = ok && json_object_set_new(b, "allow_atomic", json_boolean(s->pub.allow_atomic)) == 0;
    if (s->pub.persist_mode)
        ok = ok && json_object_set_new(b, "persist_mode", json_string(s->pub.persist_mode)) == 0;
    if (!ok) {
        json_decref(b);
        return NULL;
    }
    return b;
}

/* Create or update stream s (it->raw: the server's configuration, or NULL
 * for a create), then check that the server took the newer fields the file
 * declares: a server that does not know a field ignores it. */
static jsd_status stream_write(jsd_conn *c, const plan_item *it, const topo_stream *s,
                               jsd_error *err)
{
    char api[64 + JSD_STREAM_NAME_MAX], what[400];
    jsd__snprintf(api, sizeof(api), "STREAM.%s.%s", it->raw ? "UPDATE" : "CREATE", s->pub.name);
    jsd__snprintf(what, sizeof(what), "%s stream \"%s\" (%s)", it->raw ? "updating" : "creating",
                  s->pub.name, s->path);
    json_t *b = stream_body(s, it->raw), *ans = NULL;
    char *body = b ? json_dumps(b, JSON_COMPACT) : NULL;
    json_decref(b);
    if (!body)
        return jsd__err(err, JSD_ERR_NOMEM, "%s: out of memory", what);
    jsd_status st = jsd__js_api(c, api, body, &ans, what, err);
    free(body);
    if (st != JSD_OK)
        return st;
    const json_t *cfg = json_object_get(ans, "config");
    if (s->pub.allow_atomic == 1 && !json_is_true(json_object_get(cfg, "allow_atomic"))) {
        const char *v = jsd_conn_server_version(c);
        st = jsd__err(err, JSD_ERR_CONFIG,
                      "%s: nats-server %s did not take \"allow_atomic\": true (atomic batch "
                      "publish needs nats-server 2.12 or later); the stream was %s without it",
                      what, v ? v : "(version unknown)", it->raw ? "left" : "created");
    }
    json_decref(ans);
    return st;
}

static bool server_at_least(jsd_conn *c, int major, int minor)
{
    const char *v = jsd_conn_server_version(c);
    char *end = NULL;
    if (!v)
        return false;
    errno = 0;
    long ma = strtol(v, &end, 10);
    if (errno || end == v || *end != '.')
        return false;
    const char *m = end + 1;
    long mi = strtol(m, &end, 10);
    if (errno || end == m)
        return false;
    return ma > major || (ma == major && mi >= minor);
}

static jsd_status diff_consumer(jsd_conn *conn, plan_item *it, const topo_consumer *c,
                                const jsConsumerConfig *cfg, bool reconcile, jsd_error *err)
{
    char immut[256] = "";
    size_t n;
    if (cfg->DeliverSubject && cfg->DeliverSubject[0])
        jsd__snprintf(immut, sizeof(immut), "it is a push consumer (the file declares pull)");
    if (cfg->AckPolicy != js_AckExplicit) {
        n = strlen(immut);
        jsd__snprintf(immut + n, sizeof(immut) - n, "%sack policy (server %s, file explicit)",
                      n ? "; " : "", cfg->AckPolicy == js_AckNone ? "none" : "all");
    }
    /* A durable that consume re-created after its inbox's high-water mark
     * (by start sequence) is the file's durable: all of what it had not
     * applied is delivered. */
    bool deliver_ok =
        cfg->DeliverPolicy == js_DeliverAll || cfg->DeliverPolicy == js_DeliverByStartSequence;
    if (!deliver_ok) {
        n = strlen(immut);
        jsd__snprintf(immut + n, sizeof(immut) - n, "%sdeliver (server is not \"all\", file all)",
                      n ? "; " : "");
    }
    const char *sf = cfg->FilterSubject ? cfg->FilterSubject : "";
    const char *ff = c->pub.filter_subject ? c->pub.filter_subject : "";
    bool filter_differs = strcmp(sf, ff) != 0;
    if (reconcile && filter_differs && !server_at_least(conn, 2, 10)) {
        n = strlen(immut);
        jsd__snprintf(immut + n, sizeof(immut) - n,
                      "%sfilter_subject (server \"%s\", file \"%s\"; nats-server %s cannot "
                      "change it, 2.10 can)",
                      n ? "; " : "", sf, ff, jsd_conn_server_version(conn));
    }
    if (immut[0] && (reconcile || cfg->AckPolicy != js_AckExplicit ||
                     (cfg->DeliverSubject && cfg->DeliverSubject[0])))
        return jsd__err(err, JSD_ERR_CONFIG,
                        "consumer \"%s\" (%s): %s; JetStream cannot change this in place and "
                        "jsdurable never deletes a consumer to re-create it (its delivery state "
                        "would be lost). Remove it by hand or change the file to match",
                        it->name, c->path, immut);
    if (!deliver_ok)
        diff_word(it, "deliver", "not all", "all");
    diff_word(it, "filter_subject", sf, ff);
    if (c->pub.description)
        diff_word(it, "description", cfg->Description ? cfg->Description : "", c->pub.description);
    diff_dur(it, "ack_wait", cfg->AckWait, c->pub.ack_wait_ms, false);
    diff_count(it, "max_deliver", cfg->MaxDeliver, c->pub.max_deliver);
    diff_count(it, "max_ack_pending", cfg->MaxAckPending, c->pub.max_ack_pending);
    diff_dur(it, "inactive_threshold", cfg->InactiveThreshold, c->pub.inactive_threshold_ms, true);

    bool bo_same = (size_t)cfg->BackOffLen == c->pub.n_backoff;
    for (size_t i = 0; bo_same && i < c->pub.n_backoff; i++)
        bo_same = cfg->BackOff[i] / NS_PER_MS == c->pub.backoff_ms[i];
    if (!bo_same) {
        jsd_topology_change *ch = add_change(it, "backoff");
        if (ch) {
            for (int side = 0; side < 2; side++) {
                char *out = side ? ch->file : ch->server;
                size_t cnt = side ? c->pub.n_backoff : (size_t)cfg->BackOffLen;
                out[0] = '\0';
                for (size_t i = 0; i < cnt; i++) {
                    char d[32];
                    int64_t ms = side ? c->pub.backoff_ms[i] : cfg->BackOff[i] / NS_PER_MS;
                    fmt_dur(d, sizeof(d), ms, false);
                    size_t len = strlen(out);
                    jsd__snprintf(out + len, sizeof(ch->file) - len, "%s%s", i ? "," : "", d);
                }
                if (!cnt)
                    jsd__strlcpy(out, "none", sizeof(ch->file));
            }
        }
    }
    return JSD_OK;
}

void jsd__topo_consumer_config(jsConsumerConfig *cfg, const jsd_topology_consumer *c,
                               int64_t *bo_ns)
{
    cfg->Durable = c->durable;
    if (c->description)
        cfg->Description = c->description;
    /* An update keeps a start sequence (a durable re-created after its
     * inbox's high-water mark): JetStream cannot change it in place. */
    if (cfg->DeliverPolicy != js_DeliverByStartSequence)
        cfg->DeliverPolicy = js_DeliverAll;
    cfg->AckPolicy = js_AckExplicit;
    cfg->FilterSubject = c->filter_subject;
    cfg->AckWait = c->ack_wait_ms * NS_PER_MS;
    cfg->MaxDeliver = c->max_deliver;
    cfg->MaxAckPending = c->max_ack_pending;
    cfg->InactiveThreshold = c->inactive_threshold_ms * NS_PER_MS;
    for (size_t i = 0; i < c->n_backoff; i++)
        bo_ns[i] = c->backoff_ms[i] * NS_PER_MS;
    cfg->BackOff = c->n_backoff ? bo_ns : NULL;
    cfg->BackOffLen = (int)c->n_backoff;
}

static void report_item(const jsd_topology_apply_opts *o, const plan_item *it)
{
    if (!o->report)
        return;
    jsd_topology_report r = {.kind = it->is_consumer ? "consumer" : "stream",
                             .name = it->name,
                             .action = it->action,
                             .dry_run = o->dry_run,
                             .changes = it->changes,
                             .n_changes = it->n_changes};
    o->report(&r, o->user);
}

/* Subjects of the file's stream s that overlap a stream on the server that
 * the file does not declare, or one the create policy keeps with its own
 * subjects. */
static jsd_status check_server_overlap(const jsd_topology *t, const topo_stream *s,
                                       const jsStreamInfoList *list, bool reconcile, jsd_error *err)
{
    for (int k = 0; list && k < list->Count; k++) {
        const jsStreamConfig *cfg = list->List[k] ? list->List[k]->Config : NULL;
        if (!cfg || !cfg->Name || !strcmp(cfg->Name, s->pub.name))
            continue;
        bool in_file = false;
        for (size_t i = 0; i < t->n_streams; i++)
            if (!strcmp(t->streams[i].pub.name, cfg->Name))
                in_file = true;
        if (in_file && reconcile)
            continue; /* its subjects become the file's, checked at parse time */
        for (size_t i = 0; i < s->pub.n_subjects; i++)
            for (int j = 0; j < cfg->SubjectsLen; j++)
                if (cfg->Subjects[j] && jsd_subjects_overlap(s->subjects[i], cfg->Subjects[j]))
                    return jsd__err(err, JSD_ERR_CONFIG,
                                    "%s.subjects[%zu]: \"%s\" of stream \"%s\" overlaps subject "
                                    "\"%s\" of the existing stream \"%s\" on the server%s; "
                                    "JetStream refuses overlapping stream subjects. Change the "
                                    "file or the existing stream",
                                    s->path, i, s->subjects[i], s->pub.name, cfg->Subjects[j],
                                    cfg->Name,
                                    in_file ? " (kept as it is under the create policy)" : "");
    }
    return JSD_OK;
}

jsd_status jsd_topology_apply(jsd_conn *c, const jsd_topology *t, const jsd_topology_apply_opts *o,
                              jsd_error *err)
{
    jsd_status st = JSD_OK;
    natsStatus ns;
    jsErrCode jerr = 0;
    jsStreamInfoList *list = NULL;
    plan_item *plan = NULL;
    size_t n_plan = 0;
    char what[400];

    if (!c || !t || !o)
        return jsd__err(err, JSD_ERR_INVALID,
                        "jsd_topology_apply: conn, topology and opts are "
                        "required");
    jsCtx *js = jsd__conn_js(c);
    if (!js)
        return jsd__err(err, JSD_ERR_NO_JETSTREAM,
                        "provisioning needs JetStream; the connection has no JetStream context");
    bool reconcile = o->policy == JSD_TOPOLOGY_RECONCILE;
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = o->timeout_ms > 0 ? o->timeout_ms : jsd__conn_request_timeout_ms(c);

    ns = js_Streams(&list, js, &jo, &jerr);
    if (ns == NATS_NOT_FOUND) {
        list = NULL; /* no stream at all */
    } else if (ns != NATS_OK) {
        return jsd__err_nats(err, ns, jerr, "listing the server's streams");
    }

    plan = jsd__calloc(t->n_streams + t->n_consumers + 1, sizeof(plan_item));
    if (!plan) {
        st = jsd__err(err, JSD_ERR_NOMEM, "out of memory planning the topology");
        goto done;
    }

    /* ---- plan: streams */
    for (size_t i = 0; i < t->n_streams; i++) {
        const topo_stream *s = &t->streams[i];
        plan_item *it = &plan[n_plan++];
        it->index = i;
        jsd__strlcpy(it->name, s->pub.name, sizeof(it->name));
        for (int k = 0; list && k < list->Count; k++)
            if (list->List[k] && list->List[k]->Config &&
                !strcmp(list->List[k]->Config->Name, s->pub.name))
                it->si = list->List[k];
        if (!it->si) {
            it->action = JSD_TOPOLOGY_CREATED;
        } else {
            if ((st = jsd__stream_config_json(c, s->pub.name, &it->raw, err)) != JSD_OK)
                goto done;
            if ((st = diff_stream(it, s, it->si->Config, reconcile, err)) != JSD_OK)
                goto done;
            it->action = !it->n_changes ? JSD_TOPOLOGY_UNCHANGED
                         : reconcile    ? JSD_TOPOLOGY_UPDATED
                                        : JSD_TOPOLOGY_KEPT;
        }
        if (it->action == JSD_TOPOLOGY_CREATED || it->action == JSD_TOPOLOGY_UPDATED)
            if ((st = check_server_overlap(t, s, list, reconcile, err)) != JSD_OK)
                goto done;
    }
    /* ---- plan: consumers */
    for (size_t i = 0; i < t->n_consumers; i++) {
        const topo_consumer *tc = &t->consumers[i];
        plan_item *it = &plan[n_plan++];
        it->is_consumer = true;
        it->index = i;
        jsd__snprintf(it->name, sizeof(it->name), "%s/%s", tc->pub.stream, tc->pub.durable);
        if (plan[tc->stream_index].si) {
            jerr = 0;
            ns = js_GetConsumerInfo(&it->ci, js, tc->pub.stream, tc->pub.durable, &jo, &jerr);
            if (ns != NATS_OK && !(ns == NATS_NOT_FOUND || jerr == JSConsumerNotFoundErr)) {
                jsd__snprintf(what, sizeof(what), "reading consumer \"%s\"", it->name);
                st = jsd__err_nats(err, ns, jerr, what);
                goto done;
            }
            if (ns != NATS_OK)
                it->ci = NULL;
        }
        if (!it->ci) {
            it->action = JSD_TOPOLOGY_CREATED;
            continue;
        }
        if ((st = diff_consumer(c, it, tc, it->ci->Config, reconcile, err)) != JSD_OK)
            goto done;
        it->action = !it->n_changes ? JSD_TOPOLOGY_UNCHANGED
                     : reconcile    ? JSD_TOPOLOGY_UPDATED
                                    : JSD_TOPOLOGY_KEPT;
    }

    /* ---- act */
    for (size_t i = 0; i < n_plan; i++) {
        plan_item *it = &plan[i];
        bool act = !o->dry_run &&
                   (it->action == JSD_TOPOLOGY_CREATED || it->action == JSD_TOPOLOGY_UPDATED);
        if (act && !it->is_consumer) {
            const topo_stream *s = &t->streams[it->index];
            if ((st = stream_write(c, it, s, err)) != JSD_OK)
                goto done;
            JSD_INFO("topology", "stream \"%s\" %s", s->pub.name,
                     jsd_topology_action_str(it->action));
        } else if (act) {
            const topo_consumer *tc = &t->consumers[it->index];
            jsConsumerConfig cfg;
            jsConsumerInfo *res = NULL;
            int64_t bo[JSD_TOPOLOGY_BACKOFF_MAX];
            if (it->ci)
                cfg = *it->ci->Config;
            else
                jsConsumerConfig_Init(&cfg);
            jsd__topo_consumer_config(&cfg, &tc->pub, bo);
            jerr = 0;
            ns = it->ci ? js_UpdateConsumer(&res, js, tc->pub.stream, &cfg, &jo, &jerr)
                        : js_AddConsumer(&res, js, tc->pub.stream, &cfg, &jo, &jerr);
            jsConsumerInfo_Destroy(res);
            if (ns != NATS_OK) {
                jsd__snprintf(what, sizeof(what), "%s consumer \"%s\" (%s)",
                              it->ci ? "updating" : "creating", it->name, tc->path);
                st = jsd__err_nats(err, ns, jerr, what);
                goto done;
            }
            JSD_INFO("topology", "consumer \"%s\" %s", it->name,
                     jsd_topology_action_str(it->action));
        }
        report_item(o, it);
    }
done:
    for (size_t i = 0; plan && i < n_plan; i++) {
        jsConsumerInfo_Destroy(plan[i].ci);
        json_decref(plan[i].raw);
    }
    jsd__free(plan);
    jsStreamInfoList_Destroy(list);
    return st;
}
