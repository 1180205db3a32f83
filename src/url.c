/*
 * url — the server list of a connection profile: parsing "nats://" and
 * "tls://" URLs (host, port, the user-info they may carry) and redaction, so
 * that no error, log line or status text shows a URL's user-info, the token
 * or the password ("***" instead). Used by conn.c, natserr.c and probe.c.
 */
#include <string.h>

#include "conn_priv.h"

/* ---- redaction --------------------------------------------------------------- */

/* Copy src into dst replacing the user-info of every "scheme://user-info@"
 * with "***". */
void jsd__redact_urls(char *dst, size_t cap, const char *src)
{
    size_t o = 0;
    if (cap == 0)
        return;
    if (!src)
        src = "";
    for (size_t i = 0; src[i] && o + 1 < cap;) {
        if (src[i] == ':' && src[i + 1] == '/' && src[i + 2] == '/') {
            for (int k = 0; k < 3 && o + 1 < cap; k++)
                dst[o++] = src[i++];
            /* user-info: up to the last '@' before a space, ',' or quote (a
             * password may itself hold '@' or '/'; an '@' in a path is
             * over-redacted, which is harmless) */
            size_t j = i, at = 0;
            bool found = false;
            while (src[j] && src[j] != ' ' && src[j] != ',' && src[j] != '"' && src[j] != '\'' &&
                   src[j] != '\n' && src[j] != ')') {
                if (src[j] == '@') {
                    at = j;
                    found = true;
                }
                j++;
            }
            if (found) {
                const char *stars = "***@";
                for (int k = 0; stars[k] && o + 1 < cap; k++)
                    dst[o++] = stars[k];
                i = at + 1;
            }
            continue;
        }
        dst[o++] = src[i++];
    }
    dst[o] = '\0';
}

/* Replace every occurrence of secret in buf (in place) with "***". A last
 * line of defence: no text we build quotes a secret. Secrets shorter than
 * three bytes are not searched for (they would match ordinary text). */
static void scrub_secret(char *buf, const char *secret)
{
    size_t sl;
    char *p = buf;
    if (!secret || (sl = strlen(secret)) < 3)
        return;
    /* Search on after each replacement: a secret that is itself "***" would
     * otherwise be found in its own replacement for ever. */
    while ((p = strstr(p, secret)) != NULL) {
        p[0] = p[1] = p[2] = '*';
        memmove(p + 3, p + sl, strlen(p + sl) + 1);
        p += 3;
    }
}

/* Scrub the secrets of a profile as given (used on every failed open, also
 * before the profile has been copied): token, password and the user-info of
 * every URL, whole and split at its first ':'. */
void jsd__conn_scrub_profile(char *buf, const jsd_conn_opts *o)
{
    const char *p;
    if (!o)
        return;
    scrub_secret(buf, o->token);
    scrub_secret(buf, o->password);
    for (p = o->servers; p && (p = strstr(p, "://")) != NULL;) {
        const char *ui = p + 3, *end = ui + strcspn(ui, ", \t"), *at = NULL;
        char tmp[512];
        for (const char *q = ui; q < end; q++)
            if (*q == '@')
                at = q;
        if (at && (size_t)(at - ui) < sizeof(tmp)) {
            memcpy(tmp, ui, (size_t)(at - ui));
            tmp[at - ui] = '\0';
            scrub_secret(buf, tmp);
            char *colon = strchr(tmp, ':');
            if (colon)
                scrub_secret(buf, colon + 1);
            jsd__wipe(tmp, sizeof(tmp));
        }
        p = end;
    }
}

void jsd__conn_scrub(const jsd_conn *c, char *buf)
{
    if (!c)
        return;
    scrub_secret(buf, c->token);
    scrub_secret(buf, c->password);
    for (int i = 0; i < c->nurls; i++) {
        /* the raw URL's user-info, in case a text quotes it without scheme */
        const char *r = c->urls[i].raw;
        const char *s = strstr(r, "://");
        const char *at = s ? strchr(s + 3, '@') : NULL;
        if (s && at) {
            char ui[256];
            size_t n = (size_t)(at - (s + 3));
            if (n > 0 && n < sizeof(ui)) {
                memcpy(ui, s + 3, n);
                ui[n] = '\0';
                scrub_secret(buf, ui);
                char *colon = strchr(ui, ':');
                if (colon)
                    scrub_secret(buf, colon + 1);
                jsd__wipe(ui, sizeof(ui));
            }
        }
    }
}

/* ---- URL validation ---------------------------------------------------------- */

/* One server URL as error texts show it. Unlike redact_urls (free text, where
 * a URL ends at a space, quote or parenthesis) the whole entry is one URL:
 * everything before its last '@' past the scheme is user-info, shown as "***@";
 * with no scheme (or an '@' before the "://") only what follows the last '@'
 * is shown. An '@' in a path is over-redacted, which is harmless. */
static void redact_one_url(char *dst, size_t cap, const char *raw)
{
    const char *at = strrchr(raw, '@');
    const char *s = strstr(raw, "://");
    if (!at)
        jsd__strlcpy(dst, raw, cap);
    else if (s && s < at && !memchr(raw, '@', (size_t)(s - raw)))
        jsd__snprintf(dst, cap, "%.*s***@%s", (int)(s + 3 - raw), raw, at + 1);
    else
        jsd__snprintf(dst, cap, "***@%s", at + 1);
}

jsd_status jsd__url_parse(const char *raw, conn_url *u, jsd_error *err)
{
    char red[512];
    const char *p, *hs, *he, *at, *end;

    redact_one_url(red, sizeof(red), raw);
    p = strstr(raw, "://");
    if (!p || memchr(raw, '@', (size_t)(p - raw))) {
        if (!p)
            return jsd__err(
                err, JSD_ERR_CONFIG,
                "server URL \"%s\" has no scheme; write nats://host:port or tls://host:port", red);
        return jsd__err(err, JSD_ERR_CONFIG, "server URL \"%s\" has an unknown scheme", red);
    }
    if ((size_t)(p - raw) >= sizeof(u->scheme) || p == raw)
        return jsd__err(err, JSD_ERR_CONFIG, "server URL \"%s\" has an unknown scheme", red);
    memcpy(u->scheme, raw, (size_t)(p - raw));
    u->scheme[p - raw] = '\0';
    for (char *q = u->scheme; *q; q++)
        if (*q >= 'A' && *q <= 'Z')
            *q = (char)(*q - 'A' + 'a');
    if (strcmp(u->scheme, "ws") == 0 || strcmp(u->scheme, "wss") == 0)
        return jsd__err(err, JSD_ERR_NOT_SUPPORTED,
                        "server URL \"%s\": WebSocket URLs are not supported by nats.c %s; use "
                        "nats:// or tls://",
                        red, nats_GetVersion());
    if (strcmp(u->scheme, "nats") != 0 && strcmp(u->scheme, "tls") != 0)
        return jsd__err(err, JSD_ERR_CONFIG,
                        "server URL \"%s\" has scheme \"%s\"; use nats:// or tls://", red,
                        u->scheme);
    hs = p + 3;
    end = hs + strcspn(hs, "/?#");
    if (*end && !(end[0] == '/' && end[1] == '\0'))
        return jsd__err(err, JSD_ERR_CONFIG,
                        "server URL \"%s\" has a path or query; give only scheme://host:port", red);
    at = NULL;
    for (const char *q = hs; q < end; q++)
        if (*q == '@')
            at = q;
    if (at)
        hs = at + 1;
    if (hs < end && *hs == '[') {
        he = memchr(hs, ']', (size_t)(end - hs));
        if (!he)
            return jsd__err(err, JSD_ERR_CONFIG, "server URL \"%s\": unclosed '[' in host", red);
        if ((size_t)(he - hs - 1) >= sizeof(u->host) || he == hs + 1)
            return jsd__err(err, JSD_ERR_CONFIG, "server URL \"%s\" has a bad host", red);
        memcpy(u->host, hs + 1, (size_t)(he - hs - 1));
        u->host[he - hs - 1] = '\0';
        he++;
    } else {
        he = hs;
        while (he < end && *he != ':')
            he++;
        if (he == hs)
            return jsd__err(err, JSD_ERR_CONFIG, "server URL \"%s\" has no host", red);
        if ((size_t)(he - hs) >= sizeof(u->host))
            return jsd__err(err, JSD_ERR_CONFIG, "server URL \"%s\": host name too long", red);
        memcpy(u->host, hs, (size_t)(he - hs));
        u->host[he - hs] = '\0';
    }
    for (const char *q = u->host; *q; q++) {
        char ch = *q;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '-' || ch == ':' || ch == '_' || ch == '%'))
            return jsd__err(err, JSD_ERR_CONFIG,
                            "server URL \"%s\": invalid character '%c' in host", red, ch);
    }
    u->port = 4222;
    if (he < end) {
        char portbuf[16];
        int64_t port;
        if (*he != ':')
            return jsd__err(err, JSD_ERR_CONFIG, "server URL \"%s\": junk after host", red);
        he++;
        if ((size_t)(end - he) >= sizeof(portbuf) || end == he)
            return jsd__err(err, JSD_ERR_CONFIG, "server URL \"%s\" has a bad port", red);
        memcpy(portbuf, he, (size_t)(end - he));
        portbuf[end - he] = '\0';
        if (!jsd__parse_i64(portbuf, 1, 65535, &port))
            return jsd__err(err, JSD_ERR_CONFIG,
                            "server URL \"%s\": port \"%s\" is not a number in 1..65535", red,
                            portbuf);
        u->port = (int)port;
    }
    u->raw = jsd__strdup(raw);
    u->redacted = jsd__strdup(red);
    if (!u->raw || !u->redacted)
        return jsd__err(err, JSD_ERR_NOMEM, "out of memory copying server URLs");
    return JSD_OK;
}

jsd_status jsd__conn_parse_servers(jsd_conn *c, const char *servers, jsd_error *err)
{
    const char *p = servers;
    size_t total = 0;

    if (!servers || !*servers)
        return jsd__err(err, JSD_ERR_CONFIG,
                        "no NATS server given; set servers, e.g. \"nats://127.0.0.1:4222\"");
    while (*p) {
        const char *s = p, *e;
        char one[512];
        size_t n;
        while (*s == ' ' || *s == '\t')
            s++;
        e = s + strcspn(s, ",");
        p = *e ? e + 1 : e;
        if (*e == ',' && e[1] == '\0')
            return jsd__err(err, JSD_ERR_CONFIG,
                            "server list ends with a comma (an empty entry); remove it");
        n = (size_t)(e - s);
        while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
            n--;
        if (n == 0)
            return jsd__err(err, JSD_ERR_CONFIG,
                            "server list has an empty entry; separate URLs with single commas");
        if (n >= sizeof(one))
            return jsd__err(err, JSD_ERR_CONFIG, "a server URL is longer than %zu bytes",
                            sizeof(one) - 1);
        if (c->nurls >= CONN_MAX_URLS)
            return jsd__err(err, JSD_ERR_CONFIG, "more than %d server URLs", CONN_MAX_URLS);
        memcpy(one, s, n);
        one[n] = '\0';
        jsd_status st = jsd__url_parse(one, &c->urls[c->nurls], err);
        c->nurls++; /* so a partial entry is freed */
        jsd__wipe(one, sizeof(one));
        if (st != JSD_OK)
            return st;
        total += strlen(c->urls[c->nurls - 1].redacted) + 1;
    }
    c->servers_redacted = jsd__malloc(total + 1);
    if (!c->servers_redacted)
        return jsd__err(err, JSD_ERR_NOMEM, "out of memory");
    c->servers_redacted[0] = '\0';
    size_t off = 0;
    for (int i = 0; i < c->nurls; i++) {
        size_t l = strlen(c->urls[i].redacted);
        if (i)
            c->servers_redacted[off++] = ',';
        memcpy(c->servers_redacted + off, c->urls[i].redacted, l);
        off += l;
        c->servers_redacted[off] = '\0';
    }
    return JSD_OK;
}

bool jsd__url_has_userinfo(const conn_url *u)
{
    const char *s = strstr(u->raw, "://");
    return s && strchr(s + 3, '@') != NULL;
}
