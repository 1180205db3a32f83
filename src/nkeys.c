/*
 * nkeys — the NKey text encoding (base32 of a type prefix, a 32-byte Ed25519
 * key and a CRC-16), enough to derive a user's public key from a seed file,
 * which nats.c 3.4.1 must be told beside the file it signs with. The tests'
 * key tool uses the encoder to make keys.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>

#include "conn_priv.h"

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
jsd_status jsd__nkey_public_from_file(const char *path, char *out, size_t cap, jsd_error *err)
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
