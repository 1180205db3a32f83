/*
 * puback — reading a JetStream publish reply and judging its PubAck (PUB-4).
 *
 * A reply is read once (jsd__reply_parse: no responders, a status header, a
 * JetStream error with its code and err_code, or an acknowledgement with its
 * stream, sequence and duplicate flag; the usual acknowledgement without
 * allocating, anything else through jansson) and an acknowledgement is judged
 * by one rule, jsd__puback_judge: it names the expected stream and a sequence
 * above 0. The publication engine and the dead-letter code both ask it.
 * Everything here is pure and thread-safe.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "puback.h"

void jsd__copy_printable(char *dst, size_t cap, const char *src)
{
    size_t n = 0;
    for (; src && *src && n + 1 < cap; src++)
        dst[n++] = ((unsigned char)*src >= 0x20 && (unsigned char)*src < 0x7f) ? *src : '?';
    dst[n] = '\0';
}

/* The usual acknowledgement, {"stream":"S", "seq":N} with an optional
 * ,"duplicate": true|false (nats-server puts spaces after some separators),
 * read without allocating. Anything else (a domain, escapes, errors) returns
 * false and goes to jansson. */
typedef struct scan {
    const char *d;
    size_t n, i;
} scan;

static void sc_ws(scan *s)
{
    while (s->i < s->n && (s->d[s->i] == ' ' || s->d[s->i] == '\t'))
        s->i++;
}

static bool sc_lit(scan *s, const char *lit)
{
    size_t l = strlen(lit);
    sc_ws(s);
    if (s->n - s->i < l || memcmp(s->d + s->i, lit, l) != 0)
        return false;
    s->i += l;
    return true;
}

static bool parse_ack_fast(const char *d, size_t n, jsd__reply *p)
{
    scan s = {d, n, 0};
    size_t k = 0;
    if (!sc_lit(&s, "{") || !sc_lit(&s, "\"stream\"") || !sc_lit(&s, ":") || !sc_lit(&s, "\""))
        return false;
    while (s.i < n && d[s.i] != '"' && k + 1 < sizeof(p->text)) {
        if ((unsigned char)d[s.i] < 0x20 || d[s.i] == '\\')
            return false;
        p->text[k++] = d[s.i++];
    }
    p->text[k] = '\0';
    if (k == 0 || !sc_lit(&s, "\"") || !sc_lit(&s, ",") || !sc_lit(&s, "\"seq\"") ||
        !sc_lit(&s, ":"))
        return false;
    sc_ws(&s);
    int64_t seq = 0;
    size_t digits = 0;
    while (s.i < n && d[s.i] >= '0' && d[s.i] <= '9' && digits < 18) {
        seq = seq * 10 + (d[s.i++] - '0');
        digits++;
    }
    if (digits == 0 || (s.i < n && d[s.i] >= '0' && d[s.i] <= '9') ||
        (digits > 1 && d[s.i - digits] == '0')) /* JSON has no leading zeros */
        return false;
    p->dup = false;
    if (sc_lit(&s, ",")) {
        if (!sc_lit(&s, "\"duplicate\"") || !sc_lit(&s, ":"))
            return false;
        if (sc_lit(&s, "true"))
            p->dup = true;
        else if (!sc_lit(&s, "false"))
            return false;
    }
    if (!sc_lit(&s, "}"))
        return false;
    sc_ws(&s);
    if (s.i != n)
        return false;
    p->kind = JSD__REPLY_ACK;
    p->seq = seq;
    return true;
}

void jsd__reply_parse(natsMsg *msg, jsd__reply *p)
{
    const char *status = NULL;
    if (natsMsg_IsNoResponders(msg)) {
        memset(p, 0, sizeof(*p));
        p->kind = JSD__REPLY_NORESP;
        return;
    }
    if (natsMsgHeader_Get(msg, "Status", &status) != NATS_OK)
        status = NULL;
    jsd__reply_parse_body(natsMsg_GetData(msg), natsMsg_GetDataLength(msg), status, p);
}

void jsd__reply_parse_body(const char *data, int dlen, const char *status, jsd__reply *p)
{
    memset(p, 0, sizeof(*p));
    if (status && *status) {
        char shown[16];
        jsd__copy_printable(shown, sizeof(shown), status);
        long code = strtol(shown, NULL, 10);
        p->kind = JSD__REPLY_STATUS;
        p->code = code > 0 && code < 1000 ? (int)code : 0;
        jsd__copy_printable(p->text, sizeof(p->text), shown);
        return;
    }
    p->dlen = dlen;
    if (data && dlen > 0 && parse_ack_fast(data, (size_t)dlen, p))
        return;
    memset(p, 0, sizeof(*p));
    p->dlen = dlen;
    p->kind = JSD__REPLY_MALFORMED;
    json_error_t jerr;
    json_t *root = (data && dlen > 0) ? json_loadb(data, (size_t)dlen, 0, &jerr) : NULL;
    if (!root || !json_is_object(root)) {
        jsd__strlcpy(p->text, "not a JSON object", sizeof(p->text));
        json_decref(root);
        return;
    }
    json_t *jerrobj = json_object_get(root, "error");
    if (jerrobj) {
        json_t *jc = json_object_get(jerrobj, "code");
        json_t *je = json_object_get(jerrobj, "err_code");
        json_t *jd = json_object_get(jerrobj, "description");
        p->kind = JSD__REPLY_ERROR;
        p->code = json_is_integer(jc) ? (int)json_integer_value(jc) : 0;
        p->err_code = json_is_integer(je) ? (int)json_integer_value(je) : 0;
        jsd__copy_printable(p->text, sizeof(p->text),
                            json_is_string(jd) ? json_string_value(jd) : "");
        json_decref(root);
        return;
    }
    json_t *js = json_object_get(root, "stream");
    json_t *jq = json_object_get(root, "seq");
    json_t *jdup = json_object_get(root, "duplicate");
    if (!json_is_string(js) || !json_is_integer(jq) || (jdup && !json_is_boolean(jdup))) {
        jsd__strlcpy(p->text, "no stream or sequence", sizeof(p->text));
        json_decref(root);
        return;
    }
    p->kind = JSD__REPLY_ACK;
    p->seq = (int64_t)json_integer_value(jq);
    p->dup = jdup && json_is_true(jdup);
    json_t *jb = json_object_get(root, "batch");
    json_t *jn = json_object_get(root, "count");
    if (json_is_string(jb) && json_is_integer(jn)) {
        jsd__copy_printable(p->batch, sizeof(p->batch), json_string_value(jb));
        p->count = (int64_t)json_integer_value(jn);
    }
    jsd__copy_printable(p->text, sizeof(p->text), json_string_value(js));
    json_decref(root);
}

jsd__puback_verdict jsd__puback_judge(const char *stream, int64_t seq, const char *expected)
{
    if (!stream)
        return JSD__PUBACK_NO_STREAM;
    if (expected && *expected && strcmp(stream, expected) != 0)
        return JSD__PUBACK_FOREIGN;
    if (seq <= 0)
        return JSD__PUBACK_NO_SEQ;
    return JSD__PUBACK_OK;
}
