/*
 * atomic — the atomic batch capability probe of atomic.h: one throwaway
 * memory stream, one batch of one message, the answer read, the stream
 * deleted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "atomic.h"
#include "conn_int.h"
#include "puback.h"
#include "streams.h"

/* Publish one atomic batch of one message with a Nats-Msg-Id to subject and
 * judge the answer. */
static jsd__atomic_support publish_batch(jsd_conn *conn, const char *subject, const char *token,
                                         char *why, size_t cap)
{
    natsConnection *nc = jsd__conn_nats(conn);
    natsMsg *m = NULL, *reply = NULL;
    json_t *root = NULL;
    jsd__atomic_support out = JSD__ATOMIC_UNKNOWN;
    natsStatus s = natsMsg_Create(&m, subject, NULL, "probe", 5);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, JSD__HDR_BATCH_ID, token);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, JSD__HDR_BATCH_SEQ, "1");
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, JSD__HDR_BATCH_COMMIT, "1");
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Nats-Msg-Id", token);
    if (s == NATS_OK)
        s = natsConnection_RequestMsg(&reply, nc, m, jsd__conn_request_timeout_ms(conn));
    if (s != NATS_OK) {
        jsd__snprintf(why, cap, "the probe's batch got no answer: %s", natsStatus_GetText(s));
        goto done;
    }
    json_error_t jerr;
    root = json_loadb(natsMsg_GetData(reply), (size_t)natsMsg_GetDataLength(reply), 0, &jerr);
    json_t *e = json_object_get(root, "error");
    if (!json_is_object(root)) {
        jsd__snprintf(why, cap, "the probe's batch was answered with something not JSON");
    } else if (e) {
        int code = (int)json_integer_value(json_object_get(e, "err_code"));
        char desc[160];
        const char *d = json_string_value(json_object_get(e, "description"));
        jsd__copy_printable(desc, sizeof(desc), d ? d : "");
        jsd__snprintf(why, cap, "a batch with a Nats-Msg-Id was refused: %s (err_code %d)", desc,
                      code);
        out = code == JSD__JS_ATOMIC_UNSUPP_HDR ? JSD__ATOMIC_NO_IDS : JSD__ATOMIC_UNKNOWN;
    } else if (json_object_get(root, "batch") && json_object_get(root, "count")) {
        jsd__snprintf(why, cap, "a batch with a Nats-Msg-Id was stored whole");
        out = JSD__ATOMIC_WITH_IDS;
    } else {
        /* a server without batches stores it as a plain message */
        jsd__snprintf(why, cap, "the batch headers were ignored (a plain PubAck)");
        out = JSD__ATOMIC_NONE;
    }
done:
    json_decref(root);
    natsMsg_Destroy(reply);
    natsMsg_Destroy(m);
    return out;
}

jsd__atomic_support jsd__atomic_probe(jsd_conn *conn, char *why, size_t cap)
{
    char token[33], api[96], subject[64], body[256];
    jsd_error err;
    json_t *ans = NULL;
    jsd__atomic_support out = JSD__ATOMIC_UNKNOWN;
    jsd_error_clear(&err);
    if (!conn || !jsd__conn_nats(conn)) {
        jsd__snprintf(why, cap, "no NATS connection");
        return JSD__ATOMIC_UNKNOWN;
    }
    if (!jsd__random_hex(token, 8)) {
        jsd__snprintf(why, cap, "no random bytes for the probe's name");
        return JSD__ATOMIC_UNKNOWN;
    }
    jsd__snprintf(subject, sizeof(subject), "_jsd.probe.%s", token);
    jsd__snprintf(body, sizeof(body),
                  "{\"name\":\"JSD_PROBE_%s\",\"subjects\":[\"%s\"],\"storage\":\"memory\","
                  "\"max_msgs\":1,\"allow_atomic\":true}",
                  token, subject);
    jsd__snprintf(api, sizeof(api), "STREAM.CREATE.JSD_PROBE_%s", token);
    if (jsd__js_api(conn, api, body, &ans, "creating the probe stream", &err) != JSD_OK) {
        jsd__snprintf(why, cap, "%s", err.msg);
        return JSD__ATOMIC_UNKNOWN;
    }
    if (!json_is_true(json_object_get(json_object_get(ans, "config"), "allow_atomic"))) {
        jsd__snprintf(why, cap, "the server does not know allow_atomic");
        out = JSD__ATOMIC_NONE;
    } else {
        out = publish_batch(conn, subject, token, why, cap);
    }
    json_decref(ans);
    ans = NULL;
    jsd__snprintf(api, sizeof(api), "STREAM.DELETE.JSD_PROBE_%s", token);
    if (jsd__js_api(conn, api, NULL, &ans, "deleting the probe stream", &err) != JSD_OK)
        JSD_WARN("atomic", "the atomic batch probe could not delete stream JSD_PROBE_%s: %s", token,
                 err.msg);
    json_decref(ans);
    return out;
}
