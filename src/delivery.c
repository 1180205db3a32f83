/*
 * delivery — what a handler sees of one delivery (its subject, payload,
 * headers and identity), the progress signal it may send, and the
 * dispositions it answers with. The delivery itself is a slot of the
 * consumer's batch in hand (struct jsd_delivery in consumer_int.h).
 */
#include <string.h>

#include "conn_int.h"
#include "consumer_int.h"

/* ---- dispositions --------------------------------------------------------------- */

jsd_disposition jsd_disposition_commit(void)
{
    jsd_disposition d = {JSD_DISPOSITION_COMMIT, 0, NULL};
    return d;
}

jsd_disposition jsd_disposition_retry(int64_t delay_ms, const char *reason)
{
    jsd_disposition d = {JSD_DISPOSITION_RETRY, delay_ms < 0 ? 0 : delay_ms, reason};
    return d;
}

jsd_disposition jsd_disposition_poison(const char *reason)
{
    jsd_disposition d = {JSD_DISPOSITION_POISON, 0, reason};
    return d;
}

/* ---- delivery accessors ------------------------------------------------------------ */

const char *jsd_delivery_subject(const jsd_delivery *d)
{
    return d ? d->subject : "";
}

const void *jsd_delivery_payload(const jsd_delivery *d, size_t *len)
{
    if (len)
        *len = d ? (size_t)natsMsg_GetDataLength(d->msg) : 0;
    return d ? natsMsg_GetData(d->msg) : NULL;
}

const char *jsd_delivery_header(const jsd_delivery *d, const char *name)
{
    const char *v = NULL;
    if (!d || !name || natsMsgHeader_Get(d->msg, name, &v) != NATS_OK)
        return NULL;
    return v;
}

const char *jsd_delivery_stream(const jsd_delivery *d)
{
    return d ? d->c->stream : "";
}

const char *jsd_delivery_consumer(const jsd_delivery *d)
{
    return d ? d->c->durable : "";
}

uint64_t jsd_delivery_stream_seq(const jsd_delivery *d)
{
    return d ? d->seq : 0;
}

uint64_t jsd_delivery_deliveries(const jsd_delivery *d)
{
    return d ? d->deliveries : 0;
}

const char *jsd_delivery_msg_id(const jsd_delivery *d)
{
    return d && d->msg_id ? d->msg_id : "";
}

const char *jsd_delivery_type(const jsd_delivery *d)
{
    return d && d->type ? d->type : "";
}

jsd_status jsd_delivery_progress(const jsd_delivery *d)
{
    if (!d || !d->msg)
        return JSD_ERR_INVALID;
    if (d->replay)
        return JSD_OK; /* applied from the store: no delivery to keep alive */
    natsStatus s = natsMsg_InProgress(d->msg, NULL);
    return s == NATS_OK ? JSD_OK : jsd__err_nats(NULL, s, 0, "progress");
}
