/*
 * subject — the validators and the idempotency-id derivation declared in
 * subject.h and publisher.h. Every check that guards what reaches the broker
 * lives here (the connection's JetStream domain and API prefix too), so the
 * publisher, the store (effect subjects), tenancy and the relay apply the
 * same rules with the same error texts; and the one matcher of subject
 * patterns (capture, overlap) that the publisher, the dead-letter code and
 * the topology file share.
 */
#include <string.h>
#include <strings.h>

#include "subject.h"

static bool token_char(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

void jsd__printable(const char *s, size_t len, char *out, size_t cap)
{
    size_t n = 0, i;
    if (!cap)
        return;
    if (!s) {
        jsd__strlcpy(out, "(null)", cap);
        return;
    }
    for (i = 0; i < len && i < 48 && n + 4 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        out[n++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (i < len && n + 4 <= cap) {
        memcpy(out + n, "...", 3);
        n += 3;
    }
    out[n] = '\0';
}

/* Describe the first offending byte of s at offset i. */
static jsd_status bad_char(jsd_error *err, const char *what, const char *s, size_t len, size_t i,
                           const char *rule)
{
    char shown[64];
    jsd__printable(s, len, shown, sizeof(shown));
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x21 && c < 0x7f)
        return jsd__err(err, JSD_ERR_INVALID, "%s \"%s\" has '%c' at byte %zu; %s", what, shown,
                        (char)c, i, rule);
    return jsd__err(err, JSD_ERR_INVALID, "%s \"%s\" has byte 0x%02x at byte %zu; %s", what, shown,
                    c, i, rule);
}

static const char TOKEN_RULE[] = "names and subject tokens are [A-Za-z0-9_-] separated by dots";

bool jsd__stream_name_valid(const char *name, jsd_error *err)
{
    if (!name || !*name) {
        jsd__err(err, JSD_ERR_INVALID, "stream name is empty; %s", TOKEN_RULE);
        return false;
    }
    size_t len = strlen(name);
    if (len > JSD_STREAM_NAME_MAX) {
        char shown[64];
        jsd__printable(name, len, shown, sizeof(shown));
        jsd__err(err, JSD_ERR_INVALID, "stream name \"%s\" is %zu bytes; the limit is %d", shown,
                 len, JSD_STREAM_NAME_MAX);
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        if (!token_char((unsigned char)name[i])) {
            bad_char(err, "stream name", name, len, i,
                     "a stream name is one token of [A-Za-z0-9_-]");
            return false;
        }
    }
    return true;
}

bool jsd__js_domain_valid(const char *domain, jsd_error *err)
{
    static const char rule[] = "a JetStream domain is one token of [A-Za-z0-9_-], 1..128 bytes";
    size_t len = domain ? strlen(domain) : 0;
    if (!len || len > 128) {
        char shown[64];
        jsd__printable(domain, len, shown, sizeof(shown));
        jsd__err(err, JSD_ERR_INVALID, "JetStream domain \"%s\" is %zu bytes; %s", shown, len,
                 rule);
        return false;
    }
    for (size_t i = 0; i < len; i++)
        if (!token_char((unsigned char)domain[i])) {
            bad_char(err, "JetStream domain", domain, len, i, rule);
            return false;
        }
    return true;
}

bool jsd__js_api_prefix_valid(const char *prefix, jsd_error *err)
{
    static const char rule[] = "a JetStream API prefix is a subject without wildcards: "
                               "dot-separated non-empty tokens, no spaces, '*' or '>', 1..256 "
                               "bytes";
    size_t len = prefix ? strlen(prefix) : 0;
    char shown[64];
    if (!len || len > 256 || prefix[0] == '.' || strstr(prefix, "..")) {
        jsd__printable(prefix, len, shown, sizeof(shown));
        jsd__err(err, JSD_ERR_INVALID, "JetStream API prefix \"%s\" is not valid; %s", shown, rule);
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)prefix[i];
        if (c <= ' ' || c >= 0x7f || c == '*' || c == '>') {
            bad_char(err, "JetStream API prefix", prefix, len, i, rule);
            return false;
        }
    }
    return true;
}

bool jsd__subject_valid_exact(const char *subject, jsd_error *err)
{
    if (!subject || !*subject) {
        jsd__err(err, JSD_ERR_INVALID, "subject is empty; %s", TOKEN_RULE);
        return false;
    }
    size_t len = strlen(subject);
    char shown[64];
    if (len > JSD_SUBJECT_MAX) {
        jsd__printable(subject, len, shown, sizeof(shown));
        jsd__err(err, JSD_ERR_INVALID, "subject \"%s\" is %zu bytes; the limit is %d", shown, len,
                 JSD_SUBJECT_MAX);
        return false;
    }
    size_t tok = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)subject[i];
        if (c == '.') {
            if (tok == 0 || i + 1 == len) {
                jsd__printable(subject, len, shown, sizeof(shown));
                jsd__err(err, JSD_ERR_INVALID, "subject \"%s\" has an empty token; %s", shown,
                         TOKEN_RULE);
                return false;
            }
            tok = 0;
            continue;
        }
        if (c == '*' || c == '>') {
            jsd__printable(subject, len, shown, sizeof(shown));
            jsd__err(err, JSD_ERR_INVALID,
                     "subject \"%s\" has the wildcard '%c'; an exact subject is required", shown,
                     (char)c);
            return false;
        }
        if (!token_char(c)) {
            bad_char(err, "subject", subject, len, i, TOKEN_RULE);
            return false;
        }
        tok++;
    }
    return true;
}

bool jsd__subject_valid_tenant(const char *subject, jsd_error *err)
{
    return jsd__subject_valid_publish(subject, err);
}

size_t jsd__header_wire_size(size_t name_len, size_t value_len)
{
    return name_len + 2 + value_len + 2;
}

bool jsd__subject_valid_publish(const char *subject, jsd_error *err)
{
    if (subject && subject[0] == '$') {
        char shown[64];
        jsd__printable(subject, strlen(subject), shown, sizeof(shown));
        jsd__err(err, JSD_ERR_INVALID, "subject \"%s\" uses the reserved \"$\" system prefix",
                 shown);
        return false;
    }
    if (!jsd__subject_valid_exact(subject, err))
        return false;
    if (strncmp(subject, "_INBOX", 6) == 0 && (subject[6] == '.' || subject[6] == '\0')) {
        char shown[64];
        jsd__printable(subject, strlen(subject), shown, sizeof(shown));
        jsd__err(err, JSD_ERR_INVALID, "subject \"%s\" uses the reserved \"_INBOX\" prefix", shown);
        return false;
    }
    return true;
}

bool jsd__subject_valid_filter(const char *filter, jsd_error *err)
{
    if (!filter || !*filter) {
        jsd__err(err, JSD_ERR_INVALID, "filter subject is empty");
        return false;
    }
    size_t len = strlen(filter);
    char shown[64];
    jsd__printable(filter, len, shown, sizeof(shown));
    const char *p = filter;
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t tl = dot ? (size_t)(dot - p) : strlen(p);
        if (tl == 0) {
            jsd__err(err, JSD_ERR_INVALID, "filter subject \"%s\" has an empty token", shown);
            return false;
        }
        for (size_t i = 0; i < tl; i++) {
            unsigned char c = (unsigned char)p[i];
            if (c <= 0x20 || c == 0x7f || ((c == '*' || c == '>') && tl != 1)) {
                jsd__err(err, JSD_ERR_INVALID,
                         "filter subject \"%s\" has a bad character or partial wildcard", shown);
                return false;
            }
        }
        if (tl == 1 && p[0] == '>' && dot) {
            jsd__err(err, JSD_ERR_INVALID, "filter subject \"%s\" has '>' before its last token",
                     shown);
            return false;
        }
        if (!dot)
            return true;
        p = dot + 1;
    }
}

/* ---- subject patterns: capture and overlap ------------------------------------ */

static bool tok_is(const char *p, size_t n, char c)
{
    return n == 1 && p[0] == c;
}

bool jsd_subjects_overlap(const char *a, const char *b)
{
    const char *p = a, *q = b;
    if (!a || !b)
        return false;
    for (;;) {
        size_t la = strcspn(p, "."), lb = strcspn(q, ".");
        if (tok_is(p, la, '>') || tok_is(q, lb, '>'))
            return true;
        if (!tok_is(p, la, '*') && !tok_is(q, lb, '*') && (la != lb || memcmp(p, q, la) != 0))
            return false;
        bool ea = p[la] == '\0', eb = q[lb] == '\0';
        if (ea || eb)
            return ea && eb;
        p += la + 1;
        q += lb + 1;
    }
}

bool jsd__subject_within(const char *a, const char *b)
{
    const char *p = a, *q = b;
    for (;;) {
        size_t la = strcspn(p, "."), lb = strcspn(q, ".");
        if (tok_is(q, lb, '>'))
            return la > 0;
        if (tok_is(p, la, '>'))
            return false;
        if (!tok_is(q, lb, '*')) {
            if (tok_is(p, la, '*') || la != lb || memcmp(p, q, la) != 0)
                return false;
        }
        bool ea = p[la] == '\0', eb = q[lb] == '\0';
        if (ea || eb)
            return ea && eb;
        p += la + 1;
        q += lb + 1;
    }
}

size_t jsd__subject_root_len(const char *s)
{
    size_t n = 0;
    const char *p = s;
    for (;;) {
        size_t l = strcspn(p, ".");
        if (tok_is(p, l, '*') || tok_is(p, l, '>'))
            return n ? n - 1 : 0;
        n += l + 1;
        if (p[l] == '\0')
            return n - 1;
        p += l + 1;
    }
}

bool jsd__subject_roots_nested(const char *a, size_t la, const char *b, size_t lb)
{
    if (la == 0 || lb == 0)
        return true;
    size_t n = JSD_MIN(la, lb);
    if (memcmp(a, b, n) != 0)
        return false;
    if (la == lb)
        return true;
    return (la > lb ? a[n] : b[n]) == '.';
}

bool jsd__subject_pattern_check(const char *s, char *why, size_t cap)
{
    size_t len = strlen(s);
    if (len == 0) {
        jsd__snprintf(why, cap, "subject is empty");
        return false;
    }
    if (len > JSD_SUBJECT_MAX) {
        jsd__snprintf(why, cap, "subject is %zu bytes; the limit is %d", len, JSD_SUBJECT_MAX);
        return false;
    }
    const char *p = s;
    for (;;) {
        size_t l = strcspn(p, ".");
        if (l == 0) {
            jsd__snprintf(why, cap, "empty token at byte %zu (a leading, trailing or double dot)",
                          (size_t)(p - s));
            return false;
        }
        if (tok_is(p, l, '>')) {
            if (p[l] != '\0') {
                jsd__snprintf(why, cap, "wildcard \">\" must be the last token");
                return false;
            }
            return true;
        }
        if (!tok_is(p, l, '*')) {
            for (size_t i = 0; i < l; i++) {
                unsigned char ch = (unsigned char)p[i];
                if (ch == '*' || ch == '>') {
                    jsd__snprintf(why, cap, "wildcard \"%c\" must be a whole token", ch);
                    return false;
                }
                if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                      (ch >= '0' && ch <= '9') || ch == '_' || ch == '-')) {
                    if (ch > 0x20 && ch < 0x7f)
                        jsd__snprintf(why, cap,
                                      "character '%c' at byte %zu; tokens use A-Z a-z 0-9 _ -", ch,
                                      (size_t)(p - s) + i);
                    else
                        jsd__snprintf(why, cap,
                                      "byte 0x%02x at byte %zu; tokens use A-Z a-z 0-9 _ -", ch,
                                      (size_t)(p - s) + i);
                    return false;
                }
            }
        }
        if (p[l] == '\0')
            return true;
        p += l + 1;
    }
}

/* An exact subject is a pattern without wildcards. */
bool jsd__subject_matches(const char *filter, const char *subject)
{
    if (!filter || !subject)
        return false;
    return jsd__subject_within(subject, filter);
}

bool jsd__header_name_valid(const char *name, size_t max_len, const char *what, jsd_error *err)
{
    if (!name || !*name) {
        jsd__err(err, JSD_ERR_INVALID, "%s name is empty", what);
        return false;
    }
    size_t len = strlen(name);
    if (len > max_len) {
        char shown[64];
        jsd__printable(name, len, shown, sizeof(shown));
        jsd__err(err, JSD_ERR_INVALID, "%s name \"%s\" is %zu bytes; the limit is %zu", what, shown,
                 len, max_len);
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c < 0x21 || c > 0x7e || c == ':') {
            char label[80];
            jsd__snprintf(label, sizeof(label), "%s name", what);
            bad_char(err, label, name, len, i,
                     "header names are printable ASCII without spaces, ':', CR, LF or NUL");
            return false;
        }
    }
    return true;
}

/* isspace() of the C locale, which nats.c's header parser skips */
static bool blank(char c)
{
    return c == ' ' || c == '\t' || c == '\v' || c == '\f' || c == '\r' || c == '\n';
}

const char *jsd__header_value_edges(const char *value, size_t len)
{
    if (!value || len == 0)
        return "is empty: nats.c receivers cannot read a message with an empty header value";
    if (blank(value[0]) || blank(value[len - 1]))
        return "starts or ends with white space, which receivers drop";
    return NULL;
}

bool jsd__header_value_valid(const char *value, size_t len, size_t max_len, const char *what,
                             jsd_error *err)
{
    if (!value && len) {
        jsd__err(err, JSD_ERR_INVALID, "%s value is missing", what);
        return false;
    }
    if (len > max_len) {
        jsd__err(err, JSD_ERR_INVALID, "%s value is %zu bytes; the limit is %zu", what, len,
                 max_len);
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)value[i];
        if (c == '\r' || c == '\n' || c == '\0') {
            jsd__err(err, JSD_ERR_INVALID,
                     "%s value has %s at byte %zu; header values cannot hold CR, LF or NUL", what,
                     c == '\r'   ? "CR"
                     : c == '\n' ? "LF"
                                 : "NUL",
                     i);
            return false;
        }
    }
    const char *edge = jsd__header_value_edges(value, len);
    if (edge) {
        jsd__err(err, JSD_ERR_INVALID, "%s value %s", what, edge);
        return false;
    }
    return true;
}

jsd_status jsd_idempotency_id(const char *ns, const char *tenant, const char *topic,
                              const char *key, char out[JSD_IDEMPOTENCY_ID_SIZE], jsd_error *err)
{
    if (!out)
        return jsd__err(err, JSD_ERR_INVALID, "idempotency id: no output buffer");
    out[0] = '\0';
    if (!key || !*key)
        return jsd__err(err, JSD_ERR_INVALID, "idempotency key is empty; a caller key is required");
    const char *parts[4] = {ns ? ns : "", tenant ? tenant : "", topic ? topic : "", key};
    static const char *const names[4] = {"namespace", "tenant", "topic", "key"};
    size_t lens[4];
    for (int i = 0; i < 4; i++) {
        lens[i] = strlen(parts[i]);
        if (lens[i] > JSD_KEY_MAX)
            return jsd__err(err, JSD_ERR_LIMIT, "idempotency %s is %zu bytes; the limit is %d",
                            names[i], lens[i], JSD_KEY_MAX);
    }
    jsd_status st = jsd__ld_sha256_hex(parts, lens, 4, out);
    if (st != JSD_OK)
        return jsd__err(err, st, "idempotency id: the SHA-256 digest failed (%s)",
                        jsd_status_str(st));
    return JSD_OK;
}

/* ---- W3C trace context (propagation only: checked, never parsed further) ---- */

bool jsd__trace_header(const char *name)
{
    return name && (strcasecmp(name, "traceparent") == 0 || strcasecmp(name, "tracestate") == 0);
}

/* n lowercase hex digits at p, not all zero when nonzero is set. */
static bool lower_hex(const char *p, size_t n, bool nonzero)
{
    bool any = false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return false;
        any |= c != '0';
    }
    return any || !nonzero;
}

bool jsd__trace_value_valid(const char *name, const char *value, jsd_error *err)
{
    size_t n = strlen(value);
    char shown[64];
    jsd__printable(value, n, shown, sizeof(shown));
    if (strcasecmp(name, "tracestate") == 0) {
        if (n > JSD_TRACESTATE_MAX) {
            jsd__err(err, JSD_ERR_LIMIT, "tracestate is %zu bytes; the limit is %d", n,
                     JSD_TRACESTATE_MAX);
            return false;
        }
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)value[i] < 0x20 || (unsigned char)value[i] > 0x7e) {
                jsd__err(err, JSD_ERR_INVALID,
                         "tracestate has a byte 0x%02x at %zu: it is printable ASCII", value[i], i);
                return false;
            }
        return true;
    }
    /* vv-<32>-<16>-<2>: 55 bytes; a later version may add "-..." */
    bool ok = n >= 55 && n <= JSD_HEADER_VALUE_MAX && lower_hex(value, 2, false) &&
              value[2] == '-' && lower_hex(value + 3, 32, true) && value[35] == '-' &&
              lower_hex(value + 36, 16, true) && value[52] == '-' &&
              lower_hex(value + 53, 2, false);
    if (ok && strncmp(value, "ff", 2) == 0)
        ok = false;
    else if (ok && strncmp(value, "00", 2) == 0)
        ok = n == 55;
    else if (ok && n > 55)
        ok = value[55] == '-';
    for (size_t i = 0; ok && i < n; i++)
        ok = (unsigned char)value[i] > 0x20 && (unsigned char)value[i] < 0x7f;
    if (!ok)
        jsd__err(err, n > JSD_HEADER_VALUE_MAX ? JSD_ERR_LIMIT : JSD_ERR_INVALID,
                 "traceparent \"%s\" is not W3C trace context: version-traceid-parentid-flags "
                 "in lowercase hex (00-<32 hex>-<16 hex>-<2 hex>, ids not all zero)",
                 shown);
    return ok;
}
