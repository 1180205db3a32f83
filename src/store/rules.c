/*
 * The rules an effect meets, shared by the two paths that write or read one:
 * the emit front (tx.c) checks an application's effect with them before it
 * is stored, and the claim (rows.c) checks a stored row with them again, so a
 * row that reached the outbox without the library (a foreign writer that
 * broke the SQL contract, docs/SQL-CONTRACT.md, or a row written before the
 * schema's constraints existed) is dead-lettered with the rule it breaks
 * instead of wedging the relay. Also the reader of the headers_json column:
 * a JSON object of string values, turned into the headers column's own
 * encoding once its rules hold.
 */
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "store/backend.h"
#include "subject.h"

/* Valid UTF-8 without control characters. */
bool jsd__effect_text_ok(const char *s, size_t n)
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

jsd_status jsd__effect_check_ident(const char *what, const char *v, bool required, jsd_error *err)
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
    if (!jsd__effect_text_ok(v, n))
        return jsd__err(err, JSD_ERR_INVALID,
                        "effect %s is not valid UTF-8 text (control characters are refused)", what);
    return JSD_OK;
}

jsd_status jsd__effect_check_header(const char *name, const char *value, size_t i, jsd_error *err)
{
    if (!name || !value)
        return jsd__err(err, JSD_ERR_INVALID, "header %zu has no name or no value", i);
    size_t nl = strlen(name), vl = strlen(value);
    if (nl == 0)
        return jsd__err(err, JSD_ERR_INVALID, "header %zu has an empty name", i);
    if (nl > JSD_HEADER_NAME_MAX)
        return jsd__err(err, JSD_ERR_LIMIT,
                        "header name \"%.32s...\" is %zu bytes; the limit is %d", name, nl,
                        JSD_HEADER_NAME_MAX);
    for (size_t k = 0; k < nl; k++) {
        unsigned char c = (unsigned char)name[k];
        if (c <= 0x20 || c >= 0x7f || c == ':')
            return jsd__err(err, JSD_ERR_INVALID,
                            "header %zu name has a byte 0x%02x at %zu: names are printable ASCII "
                            "without spaces or ':'",
                            i, c, k);
    }
    if (strncasecmp(name, "Nats-", 5) == 0)
        return jsd__err(err, JSD_ERR_INVALID,
                        "header name \"%s\" is reserved: names starting with \"Nats-\" are set by "
                        "jsdurable and the server",
                        name);
    const char *edge = jsd__header_value_edges(value, vl);
    if (edge)
        return jsd__err(err, JSD_ERR_INVALID, "header \"%s\" value %s", name, edge);
    if (jsd__trace_header(name)) { /* trace context: its own rule (and tracestate's limit) */
        jsd_error te;
        jsd_error_clear(&te);
        return jsd__trace_value_valid(name, value, &te) ? JSD_OK
                                                        : jsd__err(err, te.status, "%s", te.msg);
    }
    if (vl > JSD_HEADER_VALUE_MAX)
        return jsd__err(err, JSD_ERR_LIMIT, "header \"%s\" value is %zu bytes; the limit is %d",
                        name, vl, JSD_HEADER_VALUE_MAX);
    for (size_t k = 0; k < vl; k++) {
        char c = value[k];
        if (c == '\r' || c == '\n')
            return jsd__err(err, JSD_ERR_INVALID, "header \"%s\" value holds CR or LF at byte %zu",
                            name, k);
    }
    return JSD_OK;
}

jsd_status jsd__headers_from_json(const unsigned char *text, size_t len, unsigned char **enc,
                                  size_t *enc_len, jsd_error *err)
{
    *enc = NULL;
    *enc_len = 0;
    json_error_t jerr;
    json_t *root = json_loadb((const char *)text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return jsd__err(err, JSD_ERR_INVALID, "headers_json is not JSON (%s at byte %d)", jerr.text,
                        jerr.position);
    jsd_status rc = JSD_OK;
    size_t n = json_is_object(root) ? json_object_size(root) : 0;
    jsd_header h[JSD_HEADERS_MAX];
    if (!json_is_object(root))
        rc = jsd__err(err, JSD_ERR_INVALID,
                      "headers_json is not a JSON object ({\"Name\": \"value\", ...})");
    else if (n > JSD_HEADERS_MAX)
        rc = jsd__err(err, JSD_ERR_LIMIT, "headers_json holds %zu headers; the limit is %d", n,
                      JSD_HEADERS_MAX);
    size_t i = 0, wire = JSD_HEADERS_RESERVED_BYTES;
    const char *name;
    json_t *v;
    if (rc == JSD_OK) {
        json_object_foreach(root, name, v)
        {
            if (!json_is_string(v)) {
                rc = jsd__err(err, JSD_ERR_INVALID, "headers_json header \"%.64s\" is not a string",
                              name);
                break;
            }
            const char *value = json_string_value(v);
            if (strlen(value) != json_string_length(v)) {
                rc = jsd__err(err, JSD_ERR_INVALID, "headers_json header \"%.64s\" holds a NUL",
                              name);
                break;
            }
            if ((rc = jsd__effect_check_header(name, value, i, err)) != JSD_OK)
                break;
            h[i].name = name;
            h[i].value = value;
            wire += jsd__header_wire_size(strlen(name), strlen(value));
            i++;
        }
    }
    if (rc == JSD_OK && wire > JSD_HEADERS_MAX_BYTES)
        rc = jsd__err(
            err, JSD_ERR_LIMIT, "headers_json is %zu bytes as encoded on the wire; the limit is %d",
            wire - JSD_HEADERS_RESERVED_BYTES, JSD_HEADERS_MAX_BYTES - JSD_HEADERS_RESERVED_BYTES);
    if (rc == JSD_OK && i > 0) {
        *enc_len = jsd__headers_encoded_size(h, i);
        *enc = jsd__malloc(*enc_len);
        if (!*enc) {
            *enc_len = 0;
            rc = jsd__err(err, JSD_ERR_NOMEM, "out of memory reading headers_json");
        } else {
            jsd__headers_encode(h, i, *enc);
        }
    }
    json_decref(root);
    return rc;
}
