/*
 * conn — the connection profile: explicit settings (jsd_conn_opts) become one
 * natsConnection and one jsCtx (CONN-1..5).
 *
 * Open validates the whole profile first (URLs, one auth method, ranges), then
 * connects with nats.c's own retry-on-failed-connect off: the start-up budget
 * is ours, so a definitive refusal (authorization, TLS) ends the attempt at
 * once while an unreachable server is retried with backoff until the budget
 * is spent. Before each attempt a raw probe checks that the servers answer
 * PING (the nats.c 3.4.1 workaround above guard_silent_servers: its connect
 * never returns from a server that sends INFO and then nothing). With
 * require_jetstream the JetStream API must answer; there is no
 * fallback to core NATS. At run time nats.c reconnects for ever by default;
 * callbacks keep an atomic "connected" flag and a reconnect counter, and one
 * asynchronous error handler installed at open fans server errors out to the
 * listeners of conn_int.h.
 *
 * Credentials. The profile's token, user, password and credential file paths
 * are copied at open and wiped at close; no error, log line or status text
 * ever contains the token, the password or a file's contents (a path is
 * named when the file cannot be read), and URLs are shown with their user-info replaced by "***"
 * (nats.c's own error texts pass through the same redaction). The token is handed to nats.c through
 * a token callback so the library keeps no copy of it in its options. Limits we cannot fix from
 * outside (checked in the nats.c 3.4.1 sources): natsOptions_SetUserInfo copies user and password,
 * and URLs that carry user-info are copied into the options and the server pool; the CONNECT line
 * holding the token or password is built in a heap buffer and passes through the socket write
 * buffer. nats.c frees all of these with plain free(), without overwriting, so those bytes may
 * linger in freed heap memory until reused. Creds and NKey seed files are read by nats.c at each
 * connect; it does overwrite those file buffers and the decoded seed after use. Our own copy of a
 * seed file (read to derive the public key) is wiped too.
 *
 * Server version. nats.c 3.4.1 does not expose the server's INFO, so the
 * version is read from the plain-text INFO line a NATS server sends to any new
 * TCP client: one short extra connection, at open and after a reconnection
 * (not possible with TLS handshake-first, where it stays unknown).
 *
 * Callbacks and lifetime. nats.c runs connection callbacks on its own thread
 * and may deliver the closed callback after natsConnection_Destroy returned,
 * so callbacks get a separate state block (struct conn_shared) that close
 * frees only once the closed callback has run.
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "conn_int.h"

#define CONN_MAX_URLS      32
#define CONN_MAX_LISTENERS 16
#define CONN_CLOSE_WAIT_MS 5000

typedef struct conn_listener {
    jsd__conn_error_fn fn;
    void *user;
} conn_listener;

/* State shared with nats.c's callback thread. */
typedef struct conn_shared {
    pthread_mutex_t lk;
    pthread_cond_t cv;
    atomic_int connected;
    atomic_uint_least64_t reconnects;
    atomic_int version_stale;
    atomic_int closing; /* jsd_conn_close started: a disconnect is expected */
    bool closed;        /* the closed callback ran */
    bool have_nc;       /* a connection exists, so a closed callback will come */
    conn_listener listeners[CONN_MAX_LISTENERS];
} conn_shared;

typedef struct conn_url {
    char *raw;      /* as given (may hold credentials) */
    char *redacted; /* user-info replaced by *** */
    char scheme[8];
    char host[256];
    int port;
} conn_url;

struct jsd_conn {
    natsConnection *nc;
    jsCtx *js;
    conn_shared *sh;

    conn_url urls[CONN_MAX_URLS];
    int nurls;
    char *servers_redacted;

    /* secrets and profile copies (wiped at close) */
    char *token;
    char *user;
    char *password;
    char *creds_file;
    char *nkey_seed_file;
    char *name;

    int connect_timeout_ms;
    int request_timeout_ms;
    int require_jetstream;
    int tls_handshake_first; /* the server sends no plain-text INFO */
    int max_pending_msgs;
    int64_t max_pending_bytes;

    char server_version[64];
    jsd_error last;
};

/* ---- library init ------------------------------------------------------------ */

static pthread_once_t nats_once = PTHREAD_ONCE_INIT;
static natsStatus nats_open_status = NATS_OK;

static void nats_open_once(void)
{
    /* Never paired with nats_Close(): other connections (and other users of
     * nats.c in the process) may exist at any time. */
    nats_open_status = nats_Open(-1);
}

/* ---- defaults ---------------------------------------------------------------- */

void jsd_conn_opts_init(jsd_conn_opts *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof(*o));
    o->name = "jsdurable";
    o->connect_timeout_ms = 2000;
    o->request_timeout_ms = 5000;
    o->startup_budget_ms = 10000;
    o->reconnect_attempts = -1;
    o->reconnect_wait_ms = 250;
    o->reconnect_jitter_ms = 100;
    o->reconnect_buffer_bytes = 8 * 1024 * 1024;
    o->max_pending_msgs = 65536;
    o->max_pending_bytes = 64 * 1024 * 1024;
    o->require_jetstream = 1;
    o->ping_interval_ms = 5000;
}

/* ---- redaction --------------------------------------------------------------- */

/* Copy src into dst replacing the user-info of every "scheme://user-info@"
 * with "***". */
static void redact_urls(char *dst, size_t cap, const char *src)
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
static void scrub_profile(char *buf, const jsd_conn_opts *o)
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

static void conn_scrub(const jsd_conn *c, char *buf)
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

/* ---- error mapping ----------------------------------------------------------- */

/* nats.c prefixes its texts with the source location, "(conn.c:1905): ";
 * drop those in place. */
static void strip_locations(char *t)
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

    redact_urls(text, sizeof(text), (lt && *lt && ls == s) ? lt : "");
    strip_locations(text);
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

static jsd_status parse_url(const char *raw, conn_url *u, jsd_error *err)
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

static jsd_status parse_servers(jsd_conn *c, const char *servers, jsd_error *err)
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
        jsd_status st = parse_url(one, &c->urls[c->nurls], err);
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

static bool url_has_userinfo(const conn_url *u)
{
    const char *s = strstr(u->raw, "://");
    return s && strchr(s + 3, '@') != NULL;
}

static bool set(const char *s)
{
    return s && *s;
}

/* ---- NKey: the public key of a user seed -------------------------------------
 * nats.c 3.4.1 signs with the seed file itself but must be told the public
 * key (natsOptions_SetNKeyFromSeed), so derive it: a seed is base32 of two
 * prefix bytes, the 32-byte Ed25519 seed and a CRC-16 (XMODEM, little endian);
 * a user public key is base32 of the byte 'U' type (20 << 3), the 32-byte
 * public key and its CRC-16. */

static uint16_t nkey_crc16(const unsigned char *p, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)(p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

static const char b32_alpha[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

static bool b32_decode(const char *in, size_t n, unsigned char *out, size_t cap, size_t *outlen)
{
    uint32_t buf = 0;
    int bits = 0;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const char *q = strchr(b32_alpha, in[i]);
        if (!q || !in[i])
            return false;
        buf = (buf << 5) | (uint32_t)(q - b32_alpha);
        bits += 5;
        if (bits >= 8) {
            if (o >= cap)
                return false;
            out[o++] = (unsigned char)(buf >> (bits - 8));
            bits -= 8;
        }
    }
    *outlen = o;
    return true;
}

static void b32_encode(const unsigned char *in, size_t n, char *out, size_t cap)
{
    uint32_t buf = 0;
    int bits = 0;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        buf = (buf << 8) | in[i];
        bits += 8;
        while (bits >= 5 && o + 1 < cap) {
            out[o++] = b32_alpha[(buf >> (bits - 5)) & 31];
            bits -= 5;
        }
    }
    if (bits > 0 && o + 1 < cap)
        out[o++] = b32_alpha[(buf << (5 - bits)) & 31];
    out[o] = '\0';
}

/* Seed text (58 characters) or public key text (56) of a 32-byte key of the
 * given type prefix (user 20 << 3, account 0, operator 14 << 3). */
jsd_status jsd__nkey_encode(unsigned char type, bool seed, const unsigned char key[32], char *out,
                            size_t cap)
{
    unsigned char raw[36];
    size_t n = 0;
    if (cap < (seed ? 59u : 57u))
        return JSD_ERR_INVALID;
    if (seed) {
        raw[n++] = (unsigned char)((18 << 3) | (type >> 5));
        raw[n++] = (unsigned char)((type & 31) << 3);
    } else {
        raw[n++] = type;
    }
    memcpy(raw + n, key, 32);
    n += 32;
    uint16_t crc = nkey_crc16(raw, n);
    raw[n++] = (unsigned char)(crc & 0xff);
    raw[n++] = (unsigned char)(crc >> 8);
    b32_encode(raw, n, out, cap);
    jsd__wipe(raw, sizeof(raw));
    return JSD_OK;
}

jsd_status jsd__nkey_decode_seed(const char *seed, size_t n, unsigned char *type,
                                 unsigned char key[32])
{
    unsigned char raw[64];
    size_t rawlen = 0;
    jsd_status st = JSD_ERR_CONFIG;
    if (n != 58 || !b32_decode(seed, n, raw, sizeof(raw), &rawlen) || rawlen != 36)
        goto done;
    if (nkey_crc16(raw, 34) != (uint16_t)(raw[34] | (raw[35] << 8)) || (raw[0] & 0xf8) != (18 << 3))
        goto done;
    *type = (unsigned char)(((raw[0] & 7) << 5) | (raw[1] >> 3));
    memcpy(key, raw + 2, 32);
    st = JSD_OK;
done:
    jsd__wipe(raw, sizeof(raw));
    return st;
}

/* Public user key ("U...", 56 characters) of the seed text "SU..." (58). */
jsd_status jsd__nkey_public_from_seed(const char *seed, size_t n, char *out, size_t cap)
{
    unsigned char key32[32], pk[32], type = 0;
    size_t pklen = sizeof(pk);
    EVP_PKEY *key = NULL;
    jsd_status st = JSD_ERR_CONFIG;

    if (cap < 57 || jsd__nkey_decode_seed(seed, n, &type, key32) != JSD_OK || type != (20 << 3))
        goto done;
    key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, key32, 32);
    if (!key || EVP_PKEY_get_raw_public_key(key, pk, &pklen) != 1 || pklen != 32)
        goto done;
    st = jsd__nkey_encode(20 << 3, false, pk, out, cap);
done:
    EVP_PKEY_free(key);
    jsd__wipe(key32, sizeof(key32));
    return st;
}

/* Read a seed file and derive its public key; the file may hold only the seed
 * or a creds-style block with it. */
static jsd_status nkey_public_from_file(const char *path, char *out, size_t cap, jsd_error *err)
{
    char buf[4096];
    size_t len;
    FILE *f = fopen(path, "re");
    jsd_status st;

    if (!f)
        return jsd__err(err, JSD_ERR_CONFIG, "cannot read the NKey seed file \"%s\": %s", path,
                        strerror(errno));
    len = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[len] = '\0';
    st = JSD_ERR_CONFIG;
    for (char *p = buf; (p = strstr(p, "SU")) != NULL; p++) {
        size_t n = strspn(p, b32_alpha);
        if (n == 58 && jsd__nkey_public_from_seed(p, n, out, cap) == JSD_OK) {
            st = JSD_OK;
            break;
        }
    }
    jsd__wipe(buf, sizeof(buf));
    if (st != JSD_OK)
        return jsd__err(err, JSD_ERR_CONFIG,
                        "the NKey seed file \"%s\" holds no valid user seed (a 58-character "
                        "\"SU...\" key)",
                        path);
    return JSD_OK;
}

static jsd_status check_readable(const char *path, const char *what, jsd_error *err)
{
    FILE *f;
    if (!set(path))
        return JSD_OK;
    f = fopen(path, "re");
    if (!f)
        return jsd__err(err, JSD_ERR_CONFIG, "cannot read the %s \"%s\": %s", what, path,
                        strerror(errno));
    fclose(f);
    return JSD_OK;
}

/* ---- validation -------------------------------------------------------------- */

static jsd_status validate(jsd_conn *c, const jsd_conn_opts *o, jsd_error *err)
{
    int methods = 0;
    jsd_status st;

    if ((st = parse_servers(c, o->servers, err)) != JSD_OK)
        return st;
    methods += set(o->token);
    methods += set(o->user) || set(o->password);
    methods += set(o->creds_file);
    methods += set(o->nkey_seed_file);
    if (methods > 1)
        return jsd__err(err, JSD_ERR_CONFIG,
                        "more than one authentication method set; use only one of token, "
                        "user+password, creds_file, nkey_seed_file");
    if (set(o->user) != set(o->password))
        return jsd__err(err, JSD_ERR_CONFIG, "%s",
                        set(o->user) ? "user given without password"
                                     : "password given without user");
    for (int i = 0; i < c->nurls; i++)
        if (methods > 0 && url_has_userinfo(&c->urls[i]))
            return jsd__err(err, JSD_ERR_CONFIG,
                            "server URL \"%s\" carries credentials and an authentication method "
                            "is also set; use only one",
                            c->urls[i].redacted);
    if (set(o->tls_cert_file) != set(o->tls_key_file))
        return jsd__err(err, JSD_ERR_CONFIG,
                        "a TLS client certificate needs both tls_cert_file and tls_key_file");
    if ((st = check_readable(o->creds_file, "credentials file", err)) != JSD_OK ||
        (st = check_readable(o->nkey_seed_file, "NKey seed file", err)) != JSD_OK ||
        (st = check_readable(o->tls_ca_file, "TLS CA file", err)) != JSD_OK ||
        (st = check_readable(o->tls_cert_file, "TLS certificate file", err)) != JSD_OK ||
        (st = check_readable(o->tls_key_file, "TLS key file", err)) != JSD_OK)
        return st;
    if (o->tls_handshake_first) {
#if JSD_HAVE_NATS_TLS_HANDSHAKE_FIRST
        /* Set in build_options(); the server must be configured for it too. */
#else
        return jsd__err(err, JSD_ERR_NOT_SUPPORTED,
                        "TLS handshake-first is not supported by nats.c %s (needs a newer client "
                        "and nats-server >= 2.10.4)",
                        nats_GetVersion());
#endif
    }
#define RANGE(field, lo, hi, what)                                                                 \
    do {                                                                                           \
        if ((int64_t)o->field < (int64_t)(lo) || (int64_t)o->field > (int64_t)(hi))                \
            return jsd__err(err, JSD_ERR_CONFIG, "%s is %lld; it must be in %lld..%lld", what,     \
                            (long long)o->field, (long long)(lo), (long long)(hi));                \
    } while (0)
    RANGE(connect_timeout_ms, 1, 600000, "connect_timeout_ms");
    RANGE(request_timeout_ms, 1, 600000, "request_timeout_ms");
    RANGE(startup_budget_ms, 0, 86400000, "startup_budget_ms");
    RANGE(reconnect_attempts, -1, 1000000000, "reconnect_attempts (-1 = for ever)");
    RANGE(reconnect_wait_ms, 0, 3600000, "reconnect_wait_ms");
    RANGE(reconnect_jitter_ms, 0, 3600000, "reconnect_jitter_ms");
    RANGE(reconnect_buffer_bytes, 1, 1024 * 1024 * 1024, "reconnect_buffer_bytes");
    RANGE(ping_interval_ms, 100, 3600000, "ping_interval_ms");
    RANGE(max_pending_msgs, 1, 100000000, "max_pending_msgs");
    RANGE(max_pending_bytes, 1, INT32_MAX, "max_pending_bytes");
#undef RANGE
    if (o->name && strlen(o->name) > 256)
        return jsd__err(err, JSD_ERR_CONFIG, "connection name is longer than 256 bytes");
    return JSD_OK;
}

/* ---- callbacks --------------------------------------------------------------- */

static void on_disconnected(natsConnection *nc, void *closure)
{
    conn_shared *sh = closure;
    (void)nc;
    atomic_store(&sh->connected, 0);
    if (!atomic_load(&sh->closing))
        JSD_WARN("conn", "disconnected from NATS; reconnecting");
}

static void on_reconnected(natsConnection *nc, void *closure)
{
    conn_shared *sh = closure;
    (void)nc;
    atomic_fetch_add(&sh->reconnects, 1);
    atomic_store(&sh->version_stale, 1);
    atomic_store(&sh->connected, 1);
    JSD_INFO("conn", "reconnected to NATS");
}

static void on_closed(natsConnection *nc, void *closure)
{
    conn_shared *sh = closure;
    (void)nc;
    atomic_store(&sh->connected, 0);
    if (!atomic_load(&sh->closing))
        JSD_ERROR("conn", "NATS connection closed: reconnection attempts exhausted; this "
                          "connection will not recover (raise reconnect_attempts, -1 = for ever)");
    pthread_mutex_lock(&sh->lk);
    sh->closed = true;
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->lk);
}

static void on_async_error(natsConnection *nc, natsSubscription *sub, natsStatus s, void *closure)
{
    conn_shared *sh = closure;
    const char *t = NULL;
    char text[384];
    (void)sub;
    /* the connection's last error text belongs to this event only if its
     * status matches (a slow-consumer event leaves it unchanged) */
    if (natsConnection_GetLastError(nc, &t) != s || !t)
        t = "";
    redact_urls(text, sizeof(text), t && *t ? t : natsStatus_GetText(s));
    strip_locations(text);
    pthread_mutex_lock(&sh->lk);
    for (int i = 0; i < CONN_MAX_LISTENERS; i++)
        if (sh->listeners[i].fn)
            sh->listeners[i].fn(s, text, sh->listeners[i].user);
    pthread_mutex_unlock(&sh->lk);
    if (s != NATS_SLOW_CONSUMER)
        JSD_DEBUG("conn", "asynchronous NATS error: %s (%s)", natsStatus_GetText(s), text);
}

/* nats.c asks for the token at each (re)connect and does not keep it. */
static const char *token_cb(void *closure)
{
    const jsd_conn *c = closure;
    return c->token ? c->token : "";
}

/* ---- options ----------------------------------------------------------------- */

static jsd_status build_options(jsd_conn *c, const jsd_conn_opts *o, natsOptions **out,
                                jsd_error *err)
{
    natsOptions *no = NULL;
    natsStatus s;
    const char *urls[CONN_MAX_URLS];
    bool secure = o->tls_required != 0;
    const char *step = "creating NATS options";

    *out = NULL;
    for (int i = 0; i < c->nurls; i++) {
        urls[i] = c->urls[i].raw;
        if (strcmp(c->urls[i].scheme, "tls") == 0)
            secure = true;
    }
    if ((s = natsOptions_Create(&no)) != NATS_OK)
        goto fail;
    step = "setting the server URLs";
    if ((s = natsOptions_SetServers(no, urls, c->nurls)) != NATS_OK)
        goto fail;
    step = "setting options";
    if ((s = natsOptions_SetNoRandomize(no, c->nurls <= 1)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetName(no, c->name)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetTimeout(no, o->connect_timeout_ms)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetPingInterval(no, o->ping_interval_ms)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetMaxPingsOut(no, 2)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetSendAsap(no, true)) != NATS_OK)
        goto fail;
    /* With SendAsap every publish writes to the socket under the connection's
     * lock. Without a write deadline a server that stops reading (paused,
     * hung) blocks that write for ever, and the pinger, which needs the same
     * lock, can never notice. With it the write fails after this long and the
     * connection is dropped and re-established (publishers report UNKNOWN). */
    if ((s = natsOptions_SetWriteDeadline(no, o->request_timeout_ms)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetAllowReconnect(no, true)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetMaxReconnect(
             no, o->reconnect_attempts < 0 ? -1 : o->reconnect_attempts)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetReconnectWait(no, o->reconnect_wait_ms)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetReconnectJitter(no, o->reconnect_jitter_ms, o->reconnect_jitter_ms)) !=
        NATS_OK)
        goto fail;
    if ((s = natsOptions_SetReconnectBufSize(no, o->reconnect_buffer_bytes)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetMaxPendingMsgs(no, o->max_pending_msgs)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetRetryOnFailedConnect(no, false, NULL, NULL)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetDisconnectedCB(no, on_disconnected, c->sh)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetReconnectedCB(no, on_reconnected, c->sh)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetClosedCB(no, on_closed, c->sh)) != NATS_OK)
        goto fail;
    if ((s = natsOptions_SetErrorHandler(no, on_async_error, c->sh)) != NATS_OK)
        goto fail;
    step = "setting credentials";
    if (c->token && (s = natsOptions_SetTokenHandler(no, token_cb, c)) != NATS_OK)
        goto fail;
    if (c->user && (s = natsOptions_SetUserInfo(no, c->user, c->password)) != NATS_OK)
        goto fail;
    if (c->creds_file) {
        step = "loading the credentials file";
        if ((s = natsOptions_SetUserCredentialsFromFiles(no, c->creds_file, NULL)) != NATS_OK)
            goto fail;
    }
    if (c->nkey_seed_file) {
        step = "loading the NKey seed file";
        char pub[64];
        jsd_status kst = nkey_public_from_file(c->nkey_seed_file, pub, sizeof(pub), err);
        if (kst != JSD_OK) {
            natsOptions_Destroy(no);
            return kst;
        }
        if ((s = natsOptions_SetNKeyFromSeed(no, pub, c->nkey_seed_file)) != NATS_OK)
            goto fail;
    }
    if (secure) {
        step = "enabling TLS";
        if ((s = natsOptions_SetSecure(no, true)) != NATS_OK)
            goto fail;
    }
#if JSD_HAVE_NATS_TLS_HANDSHAKE_FIRST
    if (o->tls_handshake_first) {
        step = "enabling TLS handshake-first";
        if ((s = natsOptions_SetSecure(no, true)) != NATS_OK ||
            (s = natsOptions_TLSHandshakeFirst(no)) != NATS_OK)
            goto fail;
    }
#endif
    if (set(o->tls_ca_file)) {
        step = "loading the TLS CA file";
        if ((s = natsOptions_LoadCATrustedCertificates(no, o->tls_ca_file)) != NATS_OK)
            goto fail;
    }
    if (set(o->tls_cert_file)) {
        step = "loading the TLS client certificate and key";
        if ((s = natsOptions_LoadCertificatesChain(no, o->tls_cert_file, o->tls_key_file)) !=
            NATS_OK)
            goto fail;
    }
    if (set(o->tls_hostname)) {
        step = "setting the expected TLS host name";
        if ((s = natsOptions_SetExpectedHostname(no, o->tls_hostname)) != NATS_OK)
            goto fail;
    }
    *out = no;
    return JSD_OK;
fail:
    natsOptions_Destroy(no);
    {
        jsd_status st = jsd__err_nats(err, s, 0, step);
        if (st == JSD_ERR_TLS || st == JSD_ERR_INVALID || st == JSD_ERR_NATS ||
            s == NATS_SSL_ERROR || s == NATS_ERR || s == NATS_NOT_FOUND || s == NATS_IO_ERROR ||
            s == NATS_SYS_ERROR)
            st = (err ? (err->status = JSD_ERR_CONFIG) : JSD_ERR_CONFIG);
        if (err)
            conn_scrub(c, err->msg);
        return st;
    }
}

/* ---- the raw probe: INFO, and PING answered --------------------------------------- */

typedef enum probe_result {
    PROBE_NO_INFO,  /* unreachable, refused, closed, or no INFO line in time */
    PROBE_SILENT,   /* sent INFO, then did not answer PING in time */
    PROBE_ANSWERED, /* sent INFO and answered PING (or was not asked, see below) */
} probe_result;

/* Append bytes from fd to buf until a line past `from` ends in "\r\n" or the
 * deadline passes. */
static bool probe_line(int fd, char *buf, size_t cap, size_t *len, size_t from, int64_t deadline)
{
    while (*len + 1 < cap) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int64_t left = deadline - jsd__mono_ms();
        if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
            return false;
        ssize_t n = recv(fd, buf + *len, cap - 1 - *len, 0);
        if (n <= 0) {
            if (n < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            return false;
        }
        *len += (size_t)n;
        buf[*len] = '\0';
        if (strstr(buf + from, "\r\n"))
            return true;
    }
    return false;
}

/* One short extra TCP connection to host:port: read the plain-text INFO line a
 * NATS server sends to any new client (also TLS servers that do not require
 * the handshake first) and copy its "version" to out (when out is given).
 * With ping, also send PING and wait for the next line. Only servers that
 * require neither TLS nor authentication are asked: a TLS server takes no
 * plain text after INFO, and one that requires authentication answers a PING
 * before CONNECT with -ERR 'Authorization Violation' and logs an
 * authentication error for each probe; for those the INFO line is all that is
 * checked. */
static probe_result probe_server(const char *host, int port, int timeout_ms, bool ping, char *out,
                                 size_t cap)
{
    struct addrinfo hints, *res = NULL;
    char portstr[16], buf[4096];
    size_t len = 0, info_len;
    int fd = -1;
    probe_result r = PROBE_NO_INFO;
    int64_t deadline = jsd__mono_ms() + timeout_ms;

    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    jsd__snprintf(portstr, sizeof(portstr), "%d", port);
    if (getaddrinfo(host, portstr, &hints, &res) != 0 || !res)
        return PROBE_NO_INFO;
    fd = socket(res->ai_family, res->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, res->ai_protocol);
    if (fd < 0)
        goto done;
    if (connect(fd, res->ai_addr, res->ai_addrlen) != 0 && errno != EINPROGRESS)
        goto done;
    if (!probe_line(fd, buf, sizeof(buf), &len, 0, deadline) || strncmp(buf, "INFO ", 5) != 0)
        goto done;
    info_len = (size_t)(strstr(buf, "\r\n") + 2 - buf);
    buf[info_len - 2] = '\0';
    if (out) {
        const char *v = strstr(buf, "\"version\":\"");
        if (v) {
            v += 11;
            size_t n = strcspn(v, "\"");
            if (n > 0 && n < cap) {
                memcpy(out, v, n);
                out[n] = '\0';
            }
        }
    }
    r = PROBE_ANSWERED;
    if (!ping || strstr(buf, "\"tls_required\":true") || strstr(buf, "\"auth_required\":true"))
        goto done;
    /* bytes past the INFO line are the start of the answer */
    memmove(buf, buf + info_len, len - info_len + 1);
    len -= info_len;
    if (send(fd, "PING\r\n", 6, MSG_NOSIGNAL) != 6 ||
        !(strstr(buf, "\r\n") || probe_line(fd, buf, sizeof(buf), &len, 0, deadline)))
        r = PROBE_SILENT;
done:
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return r;
}

/* nats.c 3.4.1 workaround: the one place that holds it.
 *
 * natsConnection_Connect of nats.c 3.4.1 can spin for ever against a server
 * that sends INFO but never answers the PING that follows CONNECT (a server
 * hung or paused right after greeting): its PONG read (_readProto in src/conn.c
 * of v3.4.1) loops until a byte or the end of the stream arrives and ignores
 * the NATS_TIMEOUT that natsSock_Read returns, at once and again and again,
 * once the connect deadline has passed. Neither the connect timeout nor our
 * start-up budget can interrupt it, and no option bounds it.
 *
 * So before each attempt every server URL is probed with a raw connection
 * (probe_server: INFO, then PING answered, within connect_timeout_ms and the
 * budget left). If none answered and one of them was silent after its INFO,
 * nats.c is not called: the attempt fails as a timeout, retried until the
 * budget is spent. If some answered while others were silent, nats.c gets the
 * answering URLs first and the silent ones last (in a rotated order, not
 * nats.c's shuffle), so it reaches a silent one only if every answering one
 * fails in between; the silent ones stay in the pool for later reconnection.
 * When none is silent the options are left as the profile made them.
 *
 * What this cannot cover: a server that goes silent between its answer to the
 * probe and nats.c's own PONG read, and servers the probe cannot PING (TLS,
 * authentication required: their INFO alone is checked, so one that hangs after
 * greeting still spins). Remove this guard with a nats.c whose _readProto
 * honours the deadline. */
static jsd_status guard_silent_servers(jsd_conn *c, natsOptions *no, int64_t deadline,
                                       bool *reordered, jsd_error *err)
{
    const char *order[CONN_MAX_URLS];
    probe_result r[CONN_MAX_URLS];
    int answered = 0, silent = 0, n = 0, first_silent = -1;
    int64_t left = deadline - jsd__mono_ms();
    int t = (int)(left > 0 ? JSD_MIN(left, (int64_t)c->connect_timeout_ms) : c->connect_timeout_ms);
    natsStatus s = NATS_OK;

    if (c->tls_handshake_first)
        return JSD_OK; /* no plain-text INFO to read: nothing to probe */
    for (int i = 0; i < c->nurls; i++) {
        r[i] = probe_server(c->urls[i].host, c->urls[i].port, t, true, NULL, 0);
        answered += r[i] == PROBE_ANSWERED;
        if (r[i] == PROBE_SILENT && silent++ == 0)
            first_silent = i;
    }
    if (silent == 0) {
        if (*reordered) {
            for (int i = 0; i < c->nurls; i++)
                order[i] = c->urls[i].raw;
            if ((s = natsOptions_SetServers(no, order, c->nurls)) == NATS_OK &&
                (s = natsOptions_SetNoRandomize(no, c->nurls <= 1)) == NATS_OK)
                *reordered = false;
        }
    } else if (answered == 0) {
        return jsd__err(err, JSD_ERR_TIMEOUT,
                        "NATS server %s sent INFO but did not answer PING within %d ms (hung or "
                        "paused?); not handing it to nats.c %s, whose connect would wait for "
                        "ever",
                        c->urls[first_silent].redacted, t, nats_GetVersion());
    } else {
        unsigned char rot = 0;
        char hex[3];
        if (jsd__random_hex(hex, 1))
            rot = (unsigned char)strtoul(hex, NULL, 16);
        for (probe_result want = PROBE_ANSWERED;; want = want == PROBE_ANSWERED ? PROBE_NO_INFO
                                                                                 : PROBE_SILENT) {
            for (int k = 0; k < c->nurls; k++) {
                int i = (k + rot) % c->nurls;
                if (r[i] == want)
                    order[n++] = c->urls[i].raw;
            }
            if (want == PROBE_SILENT)
                break;
        }
        if ((s = natsOptions_SetServers(no, order, n)) == NATS_OK &&
            (s = natsOptions_SetNoRandomize(no, true)) == NATS_OK)
            *reordered = true;
    }
    if (s != NATS_OK) {
        jsd_status st = jsd__err_nats(err, s, 0, "ordering the server URLs");
        if (err)
            conn_scrub(c, err->msg);
        return st;
    }
    return JSD_OK;
}

/* ---- connect ------------------------------------------------------------------- */

/* Only an unreachable or unresponsive server is worth another attempt; an
 * authorization or TLS refusal, a bad credentials file and the like are
 * definitive and end the start-up at once. */
static bool retryable(jsd_status st)
{
    return st == JSD_ERR_CONNECT || st == JSD_ERR_TIMEOUT;
}

/* The host name nats.c checks the certificate against: the profile's
 * tls_hostname, else the URL's host (nats.c 3.4.1 is built with forced host
 * verification). With several URLs of different hosts it cannot be known
 * which one was tried last. */
static void expected_host(const jsd_conn *c, const jsd_conn_opts *o, char *out, size_t cap)
{
    if (set(o->tls_hostname)) {
        jsd__strlcpy(out, o->tls_hostname, cap);
        return;
    }
    for (int i = 1; i < c->nurls; i++)
        if (strcmp(c->urls[i].host, c->urls[0].host) != 0) {
            jsd__strlcpy(out, "(the host of the server URL)", cap);
            return;
        }
    jsd__snprintf(out, cap, "%s", c->nurls > 0 ? c->urls[0].host : "");
}

/* Turn nats.c's "SSL handshake error: <code>:<reason>:..." into a diagnostic
 * that says what to fix. */
static void tls_diagnostic(const jsd_conn *c, const jsd_conn_opts *o, const char *text,
                           jsd_error *err)
{
    const char *p = strstr(text, "SSL handshake error: ");
    const char *cert = strstr(text, "cert=");
    const char *issuer = strstr(text, "issuer=");
    char subject[160] = "", iss[160] = "", host[300];
    long code = 0;

    if (p) {
        p += strlen("SSL handshake error: ");
        char *endp;
        code = strtol(p, &endp, 10);
        if (endp == p || *endp != ':')
            code = 0;
    }
    if (cert) {
        cert += 5;
        size_t n = JSD_MIN(strcspn(cert, ":)"), sizeof(subject) - 1);
        memcpy(subject, cert, n);
        subject[n] = '\0';
    }
    if (issuer) {
        issuer += 7;
        size_t n = JSD_MIN(strcspn(issuer, ":)"), sizeof(iss) - 1);
        memcpy(iss, issuer, n);
        iss[n] = '\0';
    }
    expected_host(c, o, host, sizeof(host));
    if (code == 62 /* X509_V_ERR_HOSTNAME_MISMATCH */ || code == 64 /* IP_ADDRESS_MISMATCH */ ||
        code == 63 /* EMAIL */) {
        jsd__err(err, JSD_ERR_TLS,
                 "TLS: server certificate does not match expected host name \"%s\" (server %s, "
                 "certificate %s); connect with a name the certificate lists, or set "
                 "tls_hostname",
                 host, c->servers_redacted, subject[0] ? subject : "?");
    } else if (code == 20 || code == 21 || code == 2 || code == 19 || code == 18) {
        jsd__err(err, JSD_ERR_TLS,
                 "TLS: the server certificate of %s is not trusted: %s (certificate %s issued by "
                 "%s); set tls_ca_file to the CA that signed it",
                 c->servers_redacted,
                 code == 18 || code == 19 ? "self-signed certificate"
                                          : "unable to get local issuer certificate",
                 subject[0] ? subject : "?", iss[0] ? iss : "?");
    } else if (code == 10 || code == 9) {
        jsd__err(err, JSD_ERR_TLS, "TLS: the server certificate of %s is %s (certificate %s)",
                 c->servers_redacted, code == 10 ? "expired" : "not yet valid",
                 subject[0] ? subject : "?");
    } else {
        jsd__err(err, JSD_ERR_TLS, "TLS handshake with %s failed: %s", c->servers_redacted, text);
    }
}

static bool uses_tls(const jsd_conn *c, const jsd_conn_opts *o)
{
    if (o->tls_required || o->tls_handshake_first)
        return true;
    for (int i = 0; i < c->nurls; i++)
        if (strcmp(c->urls[i].scheme, "tls") == 0)
            return true;
    return false;
}

static jsd_status classify_connect(jsd_conn *c, const jsd_conn_opts *o, natsStatus s,
                                   jsd_error *err)
{
    jsd_error e;
    jsd_status st;

    jsd_error_clear(&e);
    st = jsd__err_nats(&e, s, 0, "connect");
    conn_scrub(c, e.msg);
    if (s == NATS_SECURE_CONNECTION_WANTED) {
        jsd__err(err, JSD_ERR_TLS,
                 "TLS: server %s does not offer TLS but TLS is required; refusing a plaintext "
                 "connection",
                 c->servers_redacted);
    } else if (s == NATS_SECURE_CONNECTION_REQUIRED) {
        jsd__err(err, JSD_ERR_TLS,
                 "TLS: server %s requires TLS; use a tls:// URL or set tls_required (with "
                 "tls_ca_file)",
                 c->servers_redacted);
    } else if (s == NATS_PROTOCOL_ERROR && uses_tls(c, o) && strstr(e.msg, "got ''")) {
        /* With TLS 1.3 a server that refuses the client's certificate (or its
         * absence) does so after the handshake: nats.c then reads the end of
         * the stream where it expected the PONG. */
        if (set(o->tls_cert_file))
            jsd__err(err, JSD_ERR_TLS,
                     "TLS: server %s closed the connection after the TLS handshake: it did not "
                     "accept the client certificate \"%s\" (is it signed by a CA the server "
                     "trusts?)",
                     c->servers_redacted, o->tls_cert_file);
        else
            jsd__err(err, JSD_ERR_TLS,
                     "TLS: server %s closed the connection after the TLS handshake: it requires a "
                     "client certificate; set tls_cert_file and tls_key_file",
                     c->servers_redacted);
    } else if (st == JSD_ERR_AUTH) {
        jsd__err(err, JSD_ERR_AUTH,
                 "authorization failed at %s: the server rejected the credentials (%s); check "
                 "the token, user/password or credentials file",
                 c->servers_redacted, e.msg);
    } else if (st == JSD_ERR_TLS) {
        tls_diagnostic(c, o, e.msg, err);
    } else {
        jsd__err_copy(err, &e);
    }
    (void)o;
    if (err) {
        err->nats_status = (int)s;
        conn_scrub(c, err->msg);
    }
    return err ? err->status : st;
}

static jsd_status connect_with_budget(jsd_conn *c, const jsd_conn_opts *o, natsOptions *no,
                                      jsd_error *err)
{
    int64_t start = jsd__mono_ms(), deadline = start + o->startup_budget_ms;
    int64_t backoff = 50;
    int attempts = 0;
    bool reordered = false;
    jsd_error last;
    jsd_status st;

    jsd_error_clear(&last);
    for (;;) {
        natsStatus s;
        attempts++;
        jsd_error_clear(&last);
        st = guard_silent_servers(c, no, deadline, &reordered, &last);
        if (st == JSD_OK) {
            s = natsConnection_Connect(&c->nc, no);
            if (s == NATS_OK)
                return JSD_OK;
            c->nc = NULL;
            st = classify_connect(c, o, s, &last);
        }
        if (!retryable(st)) {
            jsd__err_copy(err, &last);
            return st;
        }
        int64_t now = jsd__mono_ms();
        if (now >= deadline)
            break;
        int64_t nap = JSD_MIN(backoff, deadline - now);
        JSD_DEBUG("conn", "connect attempt %d to %s failed (%s); retrying in %lld ms", attempts,
                  c->servers_redacted, last.msg, (long long)nap);
        jsd__sleep_ms(nap);
        backoff = JSD_MIN(backoff * 2, 1000);
        if (jsd__mono_ms() >= deadline)
            break;
    }
    jsd__err(err, JSD_ERR_CONNECT,
             "cannot connect to NATS at %s within the start-up budget of %d ms (%d attempts); "
             "last cause: %s",
             c->servers_redacted, o->startup_budget_ms, attempts, last.msg);
    if (err) {
        err->nats_status = last.nats_status;
        conn_scrub(c, err->msg);
    }
    return JSD_ERR_CONNECT;
}

static void connected_url(jsd_conn *c, char *out, size_t cap)
{
    char buf[512];
    if (c->nc && natsConnection_GetConnectedUrl(c->nc, buf, sizeof(buf)) == NATS_OK && buf[0]) {
        redact_urls(out, cap, buf);
        jsd__wipe(buf, sizeof(buf));
    } else {
        jsd__strlcpy(out, c->servers_redacted ? c->servers_redacted : "", cap);
    }
}

static jsd_status check_jetstream(jsd_conn *c, const jsd_conn_opts *o, jsd_error *err)
{
    jsOptions jo;
    jsAccountInfo *ai = NULL;
    jsErrCode jerr = 0;
    natsStatus s;
    char where[512];
    int64_t deadline = jsd__mono_ms() + JSD_MAX(o->startup_budget_ms, o->request_timeout_ms);

    jsOptions_Init(&jo);
    jo.Wait = o->request_timeout_ms;
    for (;;) {
        jerr = 0;
        s = js_GetAccountInfo(&ai, c->js, &jo, &jerr);
        if (s == NATS_OK) {
            jsAccountInfo_Destroy(ai);
            return JSD_OK;
        }
        /* JetStream starting up (cluster without a leader yet): retry. */
        if (!(jerr == JSClusterNotAvailErr || jerr == JSClusterNoPeersErr) ||
            jsd__mono_ms() >= deadline)
            break;
        jsd__sleep_ms(100);
    }
    connected_url(c, where, sizeof(where));
    if (s == NATS_NO_RESPONDERS || jerr == JSNotEnabledErr || jerr == JSNotEnabledForAccountErr) {
        jsd__err(err, JSD_ERR_NO_JETSTREAM,
                 "JetStream is not enabled on NATS server %s%s; jsdurable needs it and does not "
                 "fall back to core NATS: start nats-server with -js (or a jetstream {} block in "
                 "its configuration)%s",
                 where, jerr == JSNotEnabledForAccountErr ? " for this account" : "",
                 jerr == JSNotEnabledForAccountErr ? " and enable JetStream for the account" : "");
        if (err) {
            err->nats_status = (int)s;
            err->js_err_code = (int)jerr;
        }
        return JSD_ERR_NO_JETSTREAM;
    }
    if (s == NATS_TIMEOUT) {
        jsd__err(err, JSD_ERR_TIMEOUT,
                 "JetStream on NATS server %s did not answer within request_timeout_ms=%d", where,
                 o->request_timeout_ms);
        if (err)
            err->nats_status = (int)s;
        return JSD_ERR_TIMEOUT;
    }
    jsd_status st = jsd__err_nats(err, s, jerr, "checking JetStream");
    if (err)
        conn_scrub(c, err->msg);
    return st;
}

static void refresh_version(jsd_conn *c)
{
    char url[512];
    conn_url u;
    jsd_error e;

    c->server_version[0] = '\0';
    if (c->tls_handshake_first)
        return; /* no plain-text INFO to read; the version stays unknown */
    if (!c->nc || natsConnection_GetConnectedUrl(c->nc, url, sizeof(url)) != NATS_OK || !url[0])
        return;
    memset(&u, 0, sizeof(u));
    if (parse_url(url, &u, &e) == JSD_OK)
        probe_server(u.host, u.port, c->connect_timeout_ms, false, c->server_version,
                     sizeof(c->server_version));
    jsd__free_secret(u.raw);
    jsd__free(u.redacted);
    jsd__wipe(url, sizeof(url));
}

/* ---- open / close ---------------------------------------------------------------- */

static void conn_free(jsd_conn *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->nurls; i++) {
        jsd__free_secret(c->urls[i].raw);
        jsd__free(c->urls[i].redacted);
    }
    jsd__free(c->servers_redacted);
    jsd__free_secret(c->token);
    jsd__free_secret(c->user);
    jsd__free_secret(c->password);
    jsd__free_secret(c->creds_file);
    jsd__free_secret(c->nkey_seed_file);
    jsd__free(c->name);
    if (c->sh) {
        pthread_mutex_destroy(&c->sh->lk);
        pthread_cond_destroy(&c->sh->cv);
        jsd__free(c->sh);
    }
    jsd__wipe(c, sizeof(*c));
    jsd__free(c);
}

static jsd_status copy_secret(char **dst, const char *src)
{
    if (!set(src))
        return JSD_OK;
    *dst = jsd__strdup(src);
    return *dst ? JSD_OK : JSD_ERR_NOMEM;
}

/* A handle with its callback state, not connected: jsd_conn_close frees it. */
static jsd_conn *conn_alloc(void)
{
    jsd_conn *c = jsd__calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->sh = jsd__calloc(1, sizeof(*c->sh));
    if (!c->sh) {
        jsd__free(c);
        return NULL;
    }
    pthread_mutex_init(&c->sh->lk, NULL);
    pthread_cond_init(&c->sh->cv, NULL);
    return c;
}

jsd_status jsd__conn_opts_check(const jsd_conn_opts *o, jsd_error *err)
{
    if (!o)
        return jsd__err(err, JSD_ERR_INVALID, "jsd__conn_opts_check: options are NULL");
    jsd_conn *c = conn_alloc();
    if (!c)
        return jsd__err(err, JSD_ERR_NOMEM, "out of memory checking a connection profile");
    jsd_status st = validate(c, o, err);
    jsd_conn_close(c);
    if (st != JSD_OK && err)
        scrub_profile(err->msg, o);
    return st;
}

jsd_status jsd_conn_open(jsd_conn **out, const jsd_conn_opts *o, jsd_error *err)
{
    jsd_conn *c = NULL;
    natsOptions *no = NULL;
    jsd_status st;

    if (!out)
        return jsd__err(err, JSD_ERR_INVALID, "jsd_conn_open: out is NULL");
    *out = NULL;
    if (!o)
        return jsd__err(err, JSD_ERR_INVALID, "jsd_conn_open: options are NULL");
    pthread_once(&nats_once, nats_open_once);
    if (nats_open_status != NATS_OK)
        return jsd__err(err, JSD_ERR_INTERNAL, "cannot initialise the nats.c library: %s",
                        natsStatus_GetText(nats_open_status));

    if (!(c = conn_alloc()))
        return jsd__err(err, JSD_ERR_NOMEM, "out of memory opening a connection");
    if ((st = validate(c, o, err)) != JSD_OK)
        goto fail;
    if (copy_secret(&c->token, o->token) || copy_secret(&c->user, o->user) ||
        copy_secret(&c->password, o->password) || copy_secret(&c->creds_file, o->creds_file) ||
        copy_secret(&c->nkey_seed_file, o->nkey_seed_file) ||
        !(c->name = jsd__strdup(set(o->name) ? o->name : "jsdurable"))) {
        st = jsd__err(err, JSD_ERR_NOMEM, "out of memory copying the connection profile");
        goto fail;
    }
    c->connect_timeout_ms = o->connect_timeout_ms;
    c->request_timeout_ms = o->request_timeout_ms;
    c->require_jetstream = o->require_jetstream;
    c->tls_handshake_first = o->tls_handshake_first;
    c->max_pending_msgs = o->max_pending_msgs;
    c->max_pending_bytes = o->max_pending_bytes;

    if ((st = build_options(c, o, &no, err)) != JSD_OK)
        goto fail;
    if ((st = connect_with_budget(c, o, no, err)) != JSD_OK)
        goto fail;
    c->sh->have_nc = true;
    atomic_store(&c->sh->connected, 1);
    natsOptions_Destroy(no);
    no = NULL;

    {
        jsOptions jo;
        natsStatus s;
        jsOptions_Init(&jo);
        jo.Wait = c->request_timeout_ms;
        if ((s = natsConnection_JetStream(&c->js, c->nc, &jo)) != NATS_OK) {
            st = jsd__err_nats(err, s, 0, "creating the JetStream context");
            goto fail;
        }
    }
    if (c->require_jetstream && (st = check_jetstream(c, o, err)) != JSD_OK)
        goto fail;
    refresh_version(c);
    JSD_INFO("conn", "connected to NATS %s (server %s)", c->servers_redacted,
             c->server_version[0] ? c->server_version : "?");
    *out = c;
    return JSD_OK;
fail:
    natsOptions_Destroy(no);
    jsd_conn_close(c);
    if (err)
        scrub_profile(err->msg, o);
    return st;
}

void jsd_conn_close(jsd_conn *c)
{
    if (!c)
        return;
    if (c->js) {
        jsCtx_Destroy(c->js);
        c->js = NULL;
    }
    if (c->nc) {
        atomic_store(&c->sh->closing, 1);
        natsConnection_Destroy(c->nc);
        c->nc = NULL;
        if (c->sh->have_nc) {
            /* wait for nats.c's closed callback, the last one that touches sh */
            struct timespec until;
            bool done;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += CONN_CLOSE_WAIT_MS / 1000;
            pthread_mutex_lock(&c->sh->lk);
            while (!(done = c->sh->closed))
                if (pthread_cond_timedwait(&c->sh->cv, &c->sh->lk, &until) == ETIMEDOUT) {
                    done = c->sh->closed;
                    break;
                }
            pthread_mutex_unlock(&c->sh->lk);
            if (!done) {
                JSD_WARN("conn",
                         "nats.c did not report the connection closed within %d ms; "
                         "keeping its callback state allocated",
                         CONN_CLOSE_WAIT_MS);
                c->sh = NULL; /* leaked on purpose: a late callback may still use it */
            }
        }
    }
    conn_free(c);
}

/* ---- accessors ------------------------------------------------------------------- */

const char *jsd_conn_errmsg(const jsd_conn *c)
{
    return c ? c->last.msg : "";
}

const jsd_error *jsd_conn_error(const jsd_conn *c)
{
    return c ? &c->last : NULL;
}

int jsd_conn_is_connected(jsd_conn *c)
{
    return c && c->sh ? atomic_load(&c->sh->connected) : 0;
}

uint64_t jsd_conn_reconnects(jsd_conn *c)
{
    return c && c->sh ? (uint64_t)atomic_load(&c->sh->reconnects) : 0;
}

const char *jsd_conn_server_version(jsd_conn *c)
{
    if (!c)
        return "";
    if (atomic_exchange(&c->sh->version_stale, 0) && atomic_load(&c->sh->connected))
        refresh_version(c);
    return c->server_version;
}

const char *jsd_conn_servers_redacted(const jsd_conn *c)
{
    return c && c->servers_redacted ? c->servers_redacted : "";
}

jsd_status jsd_conn_publish_core(jsd_conn *c, const char *subject, const void *data, size_t len)
{
    natsStatus s;
    if (!c)
        return JSD_ERR_INVALID;
    jsd_error_clear(&c->last);
    if (!subject || !*subject)
        return jsd__err(&c->last, JSD_ERR_INVALID, "core publish: empty subject");
    if (len > (size_t)INT32_MAX)
        return jsd__err(&c->last, JSD_ERR_LIMIT, "core publish to \"%s\": %zu bytes is too large",
                        subject, len);
    s = natsConnection_Publish(c->nc, subject, data, (int)len);
    if (s != NATS_OK) {
        char what[300];
        jsd__snprintf(what, sizeof(what), "core publish to \"%s\"", subject);
        return jsd__err_nats(&c->last, s, 0, what);
    }
    return JSD_OK;
}

/* ---- internal API (conn_int.h) ------------------------------------------------- */

natsConnection *jsd__conn_nats(jsd_conn *c)
{
    return c ? c->nc : NULL;
}

jsCtx *jsd__conn_js(jsd_conn *c)
{
    return c ? c->js : NULL;
}

int jsd__conn_request_timeout_ms(const jsd_conn *c)
{
    return c ? c->request_timeout_ms : 5000;
}

int jsd__conn_add_error_listener(jsd_conn *c, jsd__conn_error_fn fn, void *user)
{
    int h = -1;
    if (!c || !c->sh || !fn)
        return -1;
    pthread_mutex_lock(&c->sh->lk);
    for (int i = 0; i < CONN_MAX_LISTENERS; i++) {
        if (!c->sh->listeners[i].fn) {
            c->sh->listeners[i].fn = fn;
            c->sh->listeners[i].user = user;
            h = i;
            break;
        }
    }
    pthread_mutex_unlock(&c->sh->lk);
    if (h < 0)
        JSD_ERROR("conn", "more than %d error listeners on one connection", CONN_MAX_LISTENERS);
    return h;
}

void jsd__conn_remove_error_listener(jsd_conn *c, int handle)
{
    if (!c || !c->sh || handle < 0 || handle >= CONN_MAX_LISTENERS)
        return;
    pthread_mutex_lock(&c->sh->lk);
    c->sh->listeners[handle].fn = NULL;
    c->sh->listeners[handle].user = NULL;
    pthread_mutex_unlock(&c->sh->lk);
}

void jsd__conn_pending_limits(const jsd_conn *c, int *msgs, int64_t *bytes)
{
    if (msgs)
        *msgs = c ? c->max_pending_msgs : 65536;
    if (bytes)
        *bytes = c ? c->max_pending_bytes : 64 * 1024 * 1024;
}
