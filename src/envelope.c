/*
 * envelope — the typed envelope a delivery must carry before its handler may
 * see it (IN-1, DLQ-1): a Jsd-Type header drawn from the consumer's accepted
 * list, and a payload in the declared format (raw bytes, or one JSON value
 * nested at most JSD_JSON_DEPTH_MAX deep). Anything else is poison on its
 * first delivery: a redelivery would fail identically.
 *
 * The JSON check is a bounded recursive-descent validator: no allocation,
 * recursion depth capped by the nesting limit, every byte read at most once,
 * so hostile payloads cost linear time (fuzzed by fuzz/fuzz_envelope.c).
 */
#include <string.h>

#include "consumer_int.h"
#include "subject.h"

typedef struct json_cur {
    const unsigned char *p, *end, *start;
    int max_depth;
    const char *err;
} json_cur;

static void ws(json_cur *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static bool fail(json_cur *c, const char *what)
{
    if (!c->err)
        c->err = what;
    return false;
}

static bool lit(json_cur *c, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0)
        return fail(c, "invalid literal");
    c->p += n;
    return true;
}

static bool is_hex(unsigned char ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}

static bool string(json_cur *c)
{
    c->p++; /* opening quote */
    while (c->p < c->end) {
        unsigned char ch = *c->p++;
        if (ch == '"')
            return true;
        if (ch < 0x20)
            return fail(c, "control character in string");
        if (ch == '\\') {
            if (c->p >= c->end)
                break;
            unsigned char e = *c->p++;
            if (e == 'u') {
                for (int i = 0; i < 4; i++) {
                    if (c->p >= c->end || !is_hex(*c->p))
                        return fail(c, "bad \\u escape");
                    c->p++;
                }
            } else if (!strchr("\"\\/bfnrt", e) || e == '\0') {
                return fail(c, "bad escape");
            }
        }
    }
    return fail(c, "unterminated string");
}

static bool digits(json_cur *c)
{
    const unsigned char *s = c->p;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9')
        c->p++;
    return c->p > s;
}

static bool number(json_cur *c)
{
    if (c->p < c->end && *c->p == '-')
        c->p++;
    if (c->p < c->end && *c->p == '0') {
        c->p++;
    } else if (!digits(c)) {
        return fail(c, "bad number");
    }
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        if (!digits(c))
            return fail(c, "bad fraction");
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        c->p++;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-'))
            c->p++;
        if (!digits(c))
            return fail(c, "bad exponent");
    }
    return true;
}

static bool value(json_cur *c, int depth);

static bool container(json_cur *c, int depth, bool object)
{
    if (depth + 1 > c->max_depth)
        return fail(c, "nesting deeper than the limit");
    unsigned char close = object ? '}' : ']';
    c->p++;
    ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return true;
    }
    for (;;) {
        if (object) {
            ws(c);
            if (c->p >= c->end || *c->p != '"')
                return fail(c, "expected a member name");
            if (!string(c))
                return false;
            ws(c);
            if (c->p >= c->end || *c->p != ':')
                return fail(c, "expected ':'");
            c->p++;
        }
        if (!value(c, depth + 1))
            return false;
        ws(c);
        if (c->p >= c->end)
            return fail(c, "unterminated container");
        if (*c->p == ',') {
            c->p++;
            continue;
        }
        if (*c->p == close) {
            c->p++;
            return true;
        }
        return fail(c, "expected ',' or a closing bracket");
    }
}

static bool value(json_cur *c, int depth)
{
    ws(c);
    if (c->p >= c->end)
        return fail(c, "expected a value");
    switch (*c->p) {
    case '{':
        return container(c, depth, true);
    case '[':
        return container(c, depth, false);
    case '"':
        return string(c);
    case 't':
        return lit(c, "true");
    case 'f':
        return lit(c, "false");
    case 'n':
        return lit(c, "null");
    default:
        if (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'))
            return number(c);
        return fail(c, "unexpected character");
    }
}

bool jsd__json_valid(const void *p, size_t len, int max_depth, char *why, size_t cap)
{
    json_cur c = {.p = p,
                  .end = (const unsigned char *)p + len,
                  .start = p,
                  .max_depth = max_depth,
                  .err = NULL};
    if (!p)
        c.p = c.end = c.start = (const unsigned char *)"";
    bool ok = value(&c, 0);
    if (ok) {
        ws(&c);
        if (c.p != c.end)
            ok = fail(&c, "trailing bytes after the value");
    }
    if (!ok && why && cap)
        jsd__snprintf(why, cap, "malformed JSON payload: %s at byte %zu", c.err,
                      (size_t)(c.p - c.start));
    return ok;
}

bool jsd__envelope_check(const char *type, const void *payload, size_t len,
                         const char *const *types, size_t n_types, jsd_payload_format fmt,
                         char *why, size_t cap)
{
    if (n_types > 0) {
        bool known = false;
        for (size_t i = 0; type && *type && i < n_types && !known; i++)
            known = types[i] && strcmp(types[i], type) == 0;
        if (!known) {
            if (!type || !*type) {
                jsd__snprintf(why, cap, "missing " JSD_HDR_TYPE " header");
            } else {
                char shown[64];
                jsd__printable(type, strlen(type), shown, sizeof(shown));
                jsd__snprintf(why, cap, "unsupported " JSD_HDR_TYPE " \"%s\"", shown);
            }
            return false;
        }
    }
    if (fmt == JSD_PAYLOAD_JSON)
        return jsd__json_valid(payload, len, JSD_JSON_DEPTH_MAX, why, cap);
    return true;
}
