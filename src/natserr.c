/*
 * natserr — a nats.c failure as a jsd_error: the natsStatus and jsErrCode
 * mapped to a jsd_status, nats.c's last error text with its source locations
 * dropped and URL credentials redacted. Declared in conn_int.h for every
 * module that calls nats.c.
 */
#include <string.h>

#include "conn_priv.h"

/* ---- error mapping ----------------------------------------------------------- */

/* nats.c prefixes its texts with the source location, "(conn.c:1905): ";
 * drop those in place. */
void jsd__nats_strip_locations(char *t)
{
    char *p = t;
    while ((p = strchr(p, '(')) != NULL) {
        char *q = p + 1;
        while ((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || *q == '_' || *q == '/')
            q++;
        if (strncmp(q, ".c:", 3) == 0) {
            q += 3;
            while (*q >= '0' && *q <= '9')
                q++;
            if (q[0] == ')' && q[1] == ':' && q[2] == ' ') {
                memmove(p, q + 3, strlen(q + 3) + 1);
                continue;
            }
        }
        p++;
    }
}

static bool text_has(const char *t, const char *needle)
{
    return t && strcasestr(t, needle) != NULL;
}

jsd_status jsd__err_nats(jsd_error *err, natsStatus s, jsErrCode jerr, const char *what)
{
    jsd_status st;
    natsStatus ls = NATS_OK;
    const char *lt = nats_GetLastError(&ls);
    char text[384];

    jsd__redact_urls(text, sizeof(text), (lt && *lt && ls == s) ? lt : "");
    jsd__nats_strip_locations(text);
    if (strcmp(text, natsStatus_GetText(s)) == 0)
        text[0] = '\0';
    switch (s) {
    case NATS_OK:
        st = JSD_OK;
        break;
    case NATS_CONNECTION_AUTH_FAILED:
    case NATS_NOT_PERMITTED:
        /* a refused login, or a subject the account may not use */
        st = JSD_ERR_AUTH;
        break;
    case NATS_SSL_ERROR:
    case NATS_SECURE_CONNECTION_WANTED:
    case NATS_SECURE_CONNECTION_REQUIRED:
        st = JSD_ERR_TLS;
        break;
    case NATS_TIMEOUT:
        st = JSD_ERR_TIMEOUT;
        break;
    case NATS_NO_MEMORY:
        st = JSD_ERR_NOMEM;
        break;
    case NATS_NOT_FOUND:
        st = JSD_ERR_NOT_FOUND;
        break;
    case NATS_NO_SERVER:
    case NATS_IO_ERROR:
    case NATS_CONNECTION_CLOSED:
    case NATS_CONNECTION_DISCONNECTED:
    case NATS_STALE_CONNECTION:
    case NATS_NOT_YET_CONNECTED:
        st = JSD_ERR_CONNECT;
        break;
    case NATS_NO_RESPONDERS:
        st = JSD_ERR_NO_JETSTREAM;
        break;
    case NATS_INVALID_ARG:
    case NATS_INVALID_SUBJECT:
    case NATS_ADDRESS_MISSING:
        st = JSD_ERR_INVALID;
        break;
    case NATS_MAX_PAYLOAD:
        st = JSD_ERR_LIMIT;
        break;
    default:
        st = JSD_ERR_NATS;
        break;
    }
    if (text_has(text, "Authorization Violation") || text_has(text, "Authentication Violation") ||
        text_has(text, "Permissions Violation"))
        st = JSD_ERR_AUTH;
    if (jerr == JSNotEnabledErr || jerr == JSNotEnabledForAccountErr)
        st = JSD_ERR_NO_JETSTREAM;
    else if (jerr == JSStreamNotFoundErr || jerr == JSConsumerNotFoundErr)
        st = JSD_ERR_NOT_FOUND;
    else if (jerr == JSStreamNameExistErr || jerr == JSConsumerNameExistErr)
        st = JSD_ERR_EXISTS;
    else if (jerr == JSInsufficientResourcesErr || jerr == JSStorageResourcesExceededErr ||
             jerr == JSMemoryResourcesExceededErr || jerr == JSAccountResourcesExceededErr)
        st = JSD_ERR_FULL;
    else if (jerr == JSMaximumStreamsLimitErr || jerr == JSMaximumConsumersLimitErr ||
             jerr == JSStreamMessageExceedsMaximumErr)
        st = JSD_ERR_LIMIT;
    else if (jerr == JSClusterNotAvailErr)
        st = JSD_ERR_BUSY;
    if (!err)
        return st;
    if (text[0] && jerr)
        jsd__err(err, st, "%s: %s (%s, JetStream error %d)", what ? what : "NATS",
                 natsStatus_GetText(s), text, (int)jerr);
    else if (text[0])
        jsd__err(err, st, "%s: %s (%s)", what ? what : "NATS", natsStatus_GetText(s), text);
    else if (jerr)
        jsd__err(err, st, "%s: %s (JetStream error %d)", what ? what : "NATS",
                 natsStatus_GetText(s), (int)jerr);
    else
        jsd__err(err, st, "%s: %s", what ? what : "NATS", natsStatus_GetText(s));
    err->nats_status = (int)s;
    err->js_err_code = (int)jerr;
    return st;
}
