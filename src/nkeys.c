/*
 * nkeys — the NKey text encoding (base32 of a type prefix, a 32-byte Ed25519
 * key and a CRC-16), enough to derive a user's public key from a seed file,
 * and the signature of a server's nonce with a seed file or a creds file (for
 * nats.c 3.4.1, which cannot send one signature in 256: see "Signing the
 * server's nonce" below). The tests' key tool uses the encoder to make keys.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>

#include "conn_priv.h"

/* ---- NKey: the public key of a user seed -------------------------------------
 * nats.c 3.4.1 must be told an NKey user's public key beside the signature
 * callback (natsOptions_SetNKey), so derive it: a seed is base32 of two
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

/* Public user key text ("U...", 56 characters) of a decoded user seed. */
static jsd_status user_public(const unsigned char key32[32], char *out, size_t cap)
{
    unsigned char pk[32];
    size_t pklen = sizeof(pk);
    jsd_status st = JSD_ERR_CONFIG;
    EVP_PKEY *key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, key32, 32);
    if (cap >= 57 && key && EVP_PKEY_get_raw_public_key(key, pk, &pklen) == 1 && pklen == 32)
        st = jsd__nkey_encode(20 << 3, false, pk, out, cap);
    EVP_PKEY_free(key);
    return st;
}

/* Public user key ("U...", 56 characters) of the seed text "SU..." (58). */
jsd_status jsd__nkey_public_from_seed(const char *seed, size_t n, char *out, size_t cap)
{
    unsigned char key32[32], type = 0;
    jsd_status st = JSD_ERR_CONFIG;
    if (jsd__nkey_decode_seed(seed, n, &type, key32) == JSD_OK && type == (20 << 3))
        st = user_public(key32, out, cap);
    jsd__wipe(key32, sizeof(key32));
    return st;
}

#define KEY_FILE_MAX (1 << 20) /* a creds file's JWT may carry long permission lists */

/* Give back a key file's text (jsd__read_file's), wiped. */
static void drop_key_text(char *text)
{
    if (text) {
        jsd__wipe(text, strlen(text));
        jsd__free(text);
    }
}

/* The first valid user seed ("SU...", 58 characters) in text, decoded. */
static bool find_user_seed(const char *text, unsigned char key[32])
{
    unsigned char type = 0;
    for (const char *p = text; (p = strstr(p, "SU")) != NULL; p++) {
        size_t n = strspn(p, b32_alpha);
        if (n == 58 && jsd__nkey_decode_seed(p, n, &type, key) == JSD_OK && type == (20 << 3))
            return true;
    }
    return false;
}

/* Read a seed file and derive its public key; the file may hold only the seed
 * or a creds-style block with it. */
jsd_status jsd__nkey_public_from_file(const char *path, char *out, size_t cap, jsd_error *err)
{
    unsigned char key32[32];
    jsd_status st = JSD_ERR_CONFIG;
    char *text = jsd__read_file(path, KEY_FILE_MAX, NULL);

    if (!text)
        return jsd__err(err, JSD_ERR_CONFIG, "cannot read the NKey seed file \"%s\": %s", path,
                        strerror(errno));
    if (find_user_seed(text, key32))
        st = user_public(key32, out, cap);
    drop_key_text(text);
    jsd__wipe(key32, sizeof(key32));
    if (st != JSD_OK)
        return jsd__err(err, JSD_ERR_CONFIG,
                        "the NKey seed file \"%s\" holds no valid user seed (a 58-character "
                        "\"SU...\" key)",
                        path);
    return JSD_OK;
}

/* ---- Signing the server's nonce ---------------------------------------------
 * jsdurable signs the nonce itself instead of handing nats.c 3.4.1 the file:
 * that version's base64 encoder (util.c _base64Encode) takes the raw
 * signature for a C string and encodes nothing when its first byte is zero,
 * so about one CONNECT in 256 would go out without "sig" and be refused
 * (fixed upstream in nats.c 3.8.0). Refused twice in a row while
 * reconnecting, nats.c closes the connection for good. Here such a
 * signature is reported (*unsendable) instead of returned: conn.c fails
 * that attempt before its CONNECT, and the next one gets a new nonce. The
 * file is read afresh at each signature, as nats.c does, so that a rotated
 * key is picked up at the next reconnection: a creds file's JWT, which
 * names the user's public key, is read afresh too. A bare seed file's
 * public key is told to nats.c 3.4.1 once (natsOptions_SetNKey) and
 * announced at every reconnection, so a seed rotated under a running
 * process would sign for another key than the one announced, and be
 * refused; two refusals in a row close the connection for good. The
 * caller passes the announced key, and such a seed signs nothing
 * (JSD_ERR_AUTH): that attempt fails before its CONNECT, and the next one
 * reads the file again. */
jsd_status jsd__nkey_sign_nonce(const char *path, const char *expect_public, const char *nonce,
                                unsigned char sig[64], bool *unsendable)
{
    unsigned char key32[32];
    size_t siglen = 64;
    EVP_PKEY *key = NULL;
    EVP_MD_CTX *ctx = NULL;
    jsd_status st = JSD_ERR_CONFIG;
    char *text, pub[64];

    *unsendable = false;
    if (!(text = jsd__read_file(path, KEY_FILE_MAX, NULL)))
        return JSD_ERR_CONFIG;
    bool found = find_user_seed(text, key32);
    drop_key_text(text);
    if (found && expect_public &&
        (user_public(key32, pub, sizeof(pub)) != JSD_OK || strcmp(pub, expect_public) != 0)) {
        jsd__wipe(key32, sizeof(key32));
        return JSD_ERR_AUTH;
    }
    if (found && (key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, key32, 32)) &&
        (ctx = EVP_MD_CTX_new()) && EVP_DigestSignInit(ctx, NULL, NULL, NULL, key) == 1 &&
        EVP_DigestSign(ctx, sig, &siglen, (const unsigned char *)nonce, strlen(nonce)) == 1 &&
        siglen == 64) {
        st = JSD_OK;
        *unsendable = sig[0] == 0;
    }
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(key);
    jsd__wipe(key32, sizeof(key32));
    return st;
}

/* A creds file's header and footer lines: they end with at least three
 * dashes and hold three more before (nats.c's and nsc's rule). */
static bool creds_header(const char *line, size_t n)
{
    if (n < 6 || strncmp(line + n - 3, "---", 3) != 0)
        return false;
    size_t end = n - 3;
    while (end > 0 && line[end - 1] == '-')
        end--;
    for (size_t i = 0; i + 3 <= end; i++)
        if (!strncmp(line + i, "---", 3))
            return true;
    return false;
}

/* A JWT's shape: three base64url parts joined by dots (never a seed). */
static bool jwt_shaped(const char *t, size_t n)
{
    int dots = 0;
    for (size_t i = 0; i < n; i++) {
        if (t[i] == '.')
            dots++;
        else if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=", t[i]))
            return false;
    }
    return dots == 2 && t[0] != '.' && t[n - 1] != '.';
}

/* Next non-empty line of text at *p: its start and length; false at the end. */
static bool next_line(const char **p, const char **line, size_t *n)
{
    const char *q = *p;
    while (*q == '\r' || *q == '\n' || *q == ' ' || *q == '\t')
        q++;
    if (!*q)
        return false;
    *line = q;
    *n = strcspn(q, "\r\n");
    *p = q + *n;
    while (*n > 0 && (q[*n - 1] == ' ' || q[*n - 1] == '\t'))
        (*n)--;
    return true;
}

/* The user JWT in a creds file's text: the first JWT-shaped line framed by a
 * header and a footer line (a framed seed is never taken for it), as malloc'd
 * text (nats.c frees it). */
jsd_status jsd__creds_jwt_in(const char *text, char **jwt)
{
    const char *p = text, *line, *body;
    size_t n, bn;

    *jwt = NULL;
    while (next_line(&p, &line, &n)) {
        if (!creds_header(line, n) || !next_line(&p, &body, &bn))
            continue;
        if (jwt_shaped(body, bn) && next_line(&p, &line, &n) && creds_header(line, n))
            return (*jwt = strndup(body, bn)) != NULL ? JSD_OK : JSD_ERR_NOMEM;
    }
    return JSD_ERR_CONFIG;
}

jsd_status jsd__creds_jwt(const char *path, char **jwt)
{
    char *text = jsd__read_file(path, KEY_FILE_MAX, NULL);
    *jwt = NULL;
    if (!text)
        return JSD_ERR_CONFIG;
    jsd_status st = jsd__creds_jwt_in(text, jwt);
    drop_key_text(text);
    return st;
}
