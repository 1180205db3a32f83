/*
 * nkeytool: the NKeys and JWTs the test fixtures need (scripts/fixture.sh's
 * nkey and operator variants), made without nsc: Ed25519 keys in the NKey text
 * encoding (the library's own, src/nkeys.c) and JWTs in nats-server's v2 format,
 * signed with the issuer's seed.
 *
 *   nkeytool gen user|account|operator SEEDFILE   new key: seed to SEEDFILE
 *                                                 (mode 600), public key on
 *                                                 stdout
 *   nkeytool pub SEEDFILE                         public key of a seed file
 *   nkeytool jwt operator|account|system-account|user ISSUER_SEEDFILE SUBJECT_PUB NAME
 *                                                 a JWT for SUBJECT_PUB signed
 *                                                 by the issuer, on stdout
 *
 * An operator JWT is self-signed (ISSUER_SEEDFILE is the operator's own seed).
 * An account JWT enables JetStream without limits; a system-account JWT
 * does not enable it. Seeds are written only to
 * the named files, never printed.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/rand.h>

#include "conn_int.h"

static unsigned char type_of(const char *kind)
{
    if (!strcmp(kind, "user"))
        return 20 << 3;
    if (!strcmp(kind, "account"))
        return 0;
    if (!strcmp(kind, "operator"))
        return 14 << 3;
    fprintf(stderr, "nkeytool: unknown key kind \"%s\" (user|account|operator)\n", kind);
    exit(2);
}

/* Read a seed file into an Ed25519 key; its type into *type. */
static EVP_PKEY *load_seed(const char *path, unsigned char *type)
{
    char buf[256];
    unsigned char raw[32];
    FILE *f = fopen(path, "re");
    if (!f) {
        fprintf(stderr, "nkeytool: cannot read %s\n", path);
        exit(1);
    }
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    n = strcspn(buf, "\r\n");
    if (jsd__nkey_decode_seed(buf, n, type, raw) != JSD_OK) {
        fprintf(stderr, "nkeytool: %s holds no valid seed\n", path);
        exit(1);
    }
    EVP_PKEY *k = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, raw, 32);
    OPENSSL_cleanse(raw, sizeof(raw));
    OPENSSL_cleanse(buf, sizeof(buf));
    if (!k)
        exit(1);
    return k;
}

static void public_of(EVP_PKEY *k, unsigned char type, char *out, size_t cap)
{
    unsigned char pk[32];
    size_t len = sizeof(pk);
    if (EVP_PKEY_get_raw_public_key(k, pk, &len) != 1 || len != 32 ||
        jsd__nkey_encode(type, false, pk, out, cap) != JSD_OK)
        exit(1);
}

static void b64url(const unsigned char *in, size_t n, char *out, size_t cap)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < n)
            v |= in[i + 2];
        int chars = i + 2 < n ? 4 : i + 1 < n ? 3 : 2;
        for (int c = 0; c < chars && o + 1 < cap; c++)
            out[o++] = a[(v >> (18 - 6 * c)) & 63];
    }
    out[o] = '\0';
}

static int cmd_gen(const char *kind, const char *path)
{
    unsigned char raw[32];
    char seed[64], pub[64];
    unsigned char type = type_of(kind);
    if (RAND_bytes(raw, sizeof(raw)) != 1 || jsd__nkey_encode(type, true, raw, seed, sizeof(seed)))
        return 1;
    EVP_PKEY *k = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, raw, 32);
    OPENSSL_cleanse(raw, sizeof(raw));
    if (!k)
        return 1;
    public_of(k, type, pub, sizeof(pub));
    EVP_PKEY_free(k);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, seed, strlen(seed)) != (ssize_t)strlen(seed) ||
        write(fd, "\n", 1) != 1 || close(fd) != 0) {
        fprintf(stderr, "nkeytool: cannot write %s\n", path);
        return 1;
    }
    OPENSSL_cleanse(seed, sizeof(seed));
    printf("%s\n", pub);
    return 0;
}

static int cmd_jwt(const char *kind, const char *issuer_seed, const char *sub, const char *name)
{
    unsigned char itype;
    char iss[64], claims[2048], jti_src[2048], body[4096], head[128], signing[4400], sig64[128];
    unsigned char md[32], sig[64];
    unsigned int mdlen = 0;
    size_t siglen = sizeof(sig);
    const char *nats;
    EVP_PKEY *k = load_seed(issuer_seed, &itype);
    public_of(k, itype, iss, sizeof(iss));
    if (!strcmp(kind, "operator"))
        nats = "{\"type\":\"operator\",\"version\":2}";
    else if (!strcmp(kind, "account"))
        nats = "{\"limits\":{\"subs\":-1,\"data\":-1,\"payload\":-1,\"imports\":-1,\"exports\":-1,"
               "\"wildcards\":true,\"conn\":-1,\"leaf\":-1,\"mem_storage\":-1,"
               "\"disk_storage\":-1,\"streams\":-1,\"consumer\":-1},"
               "\"default_permissions\":{\"pub\":{},\"sub\":{}},\"type\":\"account\","
               "\"version\":2}";
    else if (!strcmp(kind, "system-account")) /* no JetStream: not allowed there */
        nats = "{\"limits\":{\"subs\":-1,\"data\":-1,\"payload\":-1,\"imports\":-1,\"exports\":-1,"
               "\"wildcards\":true,\"conn\":-1,\"leaf\":-1},"
               "\"default_permissions\":{\"pub\":{},\"sub\":{}},\"type\":\"account\","
               "\"version\":2}";
    else if (!strcmp(kind, "user"))
        nats = "{\"pub\":{},\"sub\":{},\"subs\":-1,\"data\":-1,\"payload\":-1,\"type\":\"user\","
               "\"version\":2}";
    else {
        fprintf(stderr, "nkeytool: unknown JWT kind \"%s\"\n", kind);
        return 2;
    }
    long long iat = (long long)time(NULL);
    /* jti: a hash of the claims without it (nats' jwt library encodes it in
     * base32; the server only needs a unique text) */
    snprintf(jti_src, sizeof(jti_src),
             "{\"iat\":%lld,\"iss\":\"%s\",\"name\":\"%s\",\"sub\":\"%s\",\"nats\":%s}", iat, iss,
             name, sub, nats);
    if (!EVP_Digest(jti_src, strlen(jti_src), md, &mdlen, EVP_sha256(), NULL))
        return 1;
    char jti[64];
    b64url(md, mdlen, jti, sizeof(jti));
    snprintf(
        claims, sizeof(claims),
        "{\"jti\":\"%s\",\"iat\":%lld,\"iss\":\"%s\",\"name\":\"%s\",\"sub\":\"%s\",\"nats\":%s}",
        jti, iat, iss, name, sub, nats);
    static const char header[] = "{\"typ\":\"JWT\",\"alg\":\"ed25519-nkey\"}";
    b64url((const unsigned char *)header, strlen(header), head, sizeof(head));
    b64url((const unsigned char *)claims, strlen(claims), body, sizeof(body));
    snprintf(signing, sizeof(signing), "%s.%s", head, body);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || EVP_DigestSignInit(ctx, NULL, NULL, NULL, k) != 1 ||
        EVP_DigestSign(ctx, sig, &siglen, (const unsigned char *)signing, strlen(signing)) != 1)
        return 1;
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(k);
    b64url(sig, siglen, sig64, sizeof(sig64));
    printf("%s.%s\n", signing, sig64);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "gen"))
        return cmd_gen(argv[2], argv[3]);
    if (argc == 3 && !strcmp(argv[1], "pub")) {
        unsigned char type;
        char pub[64];
        EVP_PKEY *k = load_seed(argv[2], &type);
        public_of(k, type, pub, sizeof(pub));
        EVP_PKEY_free(k);
        printf("%s\n", pub);
        return 0;
    }
    if (argc == 6 && !strcmp(argv[1], "jwt"))
        return cmd_jwt(argv[2], argv[3], argv[4], argv[5]);
    fprintf(stderr, "usage: nkeytool gen user|account|operator SEEDFILE\n"
                    "       nkeytool pub SEEDFILE\n"
                    "       nkeytool jwt operator|account|system-account|user ISSUER_SEEDFILE "
                    "SUBJECT_PUB NAME\n");
    return 2;
}
