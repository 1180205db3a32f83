/*
 * inspect — read-only views of streams and their durable consumers, for
 * `jsdurable status --nats`: depth, lag, ack pending, dead-letter depth. One
 * STREAM.INFO and one CONSUMER.LIST request per stream, each bounded by the
 * connection's request timeout.
 */
#include <string.h>

#include "conn_int.h"

#define DLQ_ROOT "jsd.dlq."

static void fill_stream(jsd_stream_state *out, const jsStreamInfo *si)
{
    memset(out, 0, sizeof(*out));
    jsd__strlcpy(out->name, si->Config && si->Config->Name ? si->Config->Name : "",
                 sizeof(out->name));
    if (si->Config) {
        size_t used = 0;
        for (int i = 0; i < si->Config->SubjectsLen; i++) {
            const char *subj = si->Config->Subjects[i];
            if (!strncmp(subj, DLQ_ROOT, strlen(DLQ_ROOT)))
                out->dead_letter = true;
            int n = snprintf(out->subjects + used, sizeof(out->subjects) - used, "%s%s",
                             i ? "," : "", subj);
            if (n < 0 || (size_t)n >= sizeof(out->subjects) - used)
                break;
            used += (size_t)n;
        }
        out->duplicate_window_ms = si->Config->Duplicates / 1000000;
        out->replicas = si->Config->Replicas;
        out->file_storage = si->Config->Storage == js_FileStorage;
    }
    out->messages = si->State.Msgs;
    out->bytes = si->State.Bytes;
    out->first_seq = si->State.FirstSeq;
    out->last_seq = si->State.LastSeq;
    if (si->Cluster && si->Cluster->Leader)
        jsd__strlcpy(out->leader, si->Cluster->Leader, sizeof(out->leader));
}

static jsd_status fill_durables(jsd_conn *c, jsd_stream_state *out, jsd_error *err)
{
    jsConsumerInfoList *list = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_Consumers(&list, jsd__conn_js(c), out->name, NULL, &jerr);
    if (s == NATS_NOT_FOUND) /* no consumers at all */
        return JSD_OK;
    if (s != NATS_OK)
        return jsd__err_nats(err, s, jerr, "listing the consumers of a stream");
    if (list->Count > 0) {
        out->durables = jsd__calloc((size_t)list->Count, sizeof(*out->durables));
        if (!out->durables) {
            jsConsumerInfoList_Destroy(list);
            return jsd__err(err, JSD_ERR_NOMEM, "out of memory listing consumers");
        }
    }
    for (int i = 0; i < list->Count; i++) {
        const jsConsumerInfo *ci = list->List[i];
        jsd_durable_state *d = &out->durables[out->n_durables++];
        jsd__strlcpy(d->name, ci->Name ? ci->Name : "", sizeof(d->name));
        d->pending = ci->NumPending;
        d->ack_pending = ci->NumAckPending;
        d->redelivered = ci->NumRedelivered;
        d->waiting = ci->NumWaiting;
        d->delivered_seq = ci->Delivered.Stream;
        d->ack_floor_seq = ci->AckFloor.Stream;
        d->ahead = d->ack_floor_seq > out->last_seq || d->delivered_seq > out->last_seq;
    }
    jsConsumerInfoList_Destroy(list);
    return JSD_OK;
}

jsd_status jsd_stream_state_get(jsd_conn *c, const char *stream, jsd_stream_state *out,
                                jsd_error *err)
{
    if (!c || !stream || !out)
        return jsd__err(err, JSD_ERR_INVALID,
                        "jsd_stream_state_get needs a connection, a "
                        "stream name and an output");
    memset(out, 0, sizeof(*out));
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetStreamInfo(&si, jsd__conn_js(c), stream, NULL, &jerr);
    if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr) {
        jsStreamInfo_Destroy(si);
        return jsd__err(err, JSD_ERR_NOT_FOUND, "stream \"%s\" does not exist", stream);
    }
    if (s != NATS_OK)
        return jsd__err_nats(err, s, jerr, "reading stream info");
    fill_stream(out, si);
    jsStreamInfo_Destroy(si);
    jsd_status st = fill_durables(c, out, err);
    if (st != JSD_OK)
        jsd_stream_state_clear(out);
    return st;
}

jsd_status jsd_stream_states_list(jsd_conn *c, jsd_stream_state **out, size_t *n, jsd_error *err)
{
    if (!c || !out || !n)
        return jsd__err(err, JSD_ERR_INVALID,
                        "jsd_stream_states_list needs a connection and "
                        "outputs");
    *out = NULL;
    *n = 0;
    jsStreamInfoList *list = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_Streams(&list, jsd__conn_js(c), NULL, &jerr);
    if (s == NATS_NOT_FOUND) /* an account without streams */
        return JSD_OK;
    if (s != NATS_OK)
        return jsd__err_nats(err, s, jerr, "listing streams");
    jsd_status st = JSD_OK;
    jsd_stream_state *arr = list->Count ? jsd__calloc((size_t)list->Count, sizeof(*arr)) : NULL;
    if (list->Count && !arr) {
        jsStreamInfoList_Destroy(list);
        return jsd__err(err, JSD_ERR_NOMEM, "out of memory listing streams");
    }
    size_t got = 0;
    for (int i = 0; st == JSD_OK && i < list->Count; i++) {
        fill_stream(&arr[got], list->List[i]);
        st = fill_durables(c, &arr[got], err);
        if (st == JSD_OK)
            got++;
    }
    jsStreamInfoList_Destroy(list);
    if (st != JSD_OK) {
        jsd_stream_states_free(arr, got);
        return st;
    }
    *out = arr;
    *n = got;
    return JSD_OK;
}

void jsd_stream_state_clear(jsd_stream_state *s)
{
    if (!s)
        return;
    jsd__free(s->durables);
    s->durables = NULL;
    s->n_durables = 0;
}

void jsd_stream_states_free(jsd_stream_state *arr, size_t n)
{
    for (size_t i = 0; arr && i < n; i++)
        jsd_stream_state_clear(&arr[i]);
    jsd__free(arr);
}
