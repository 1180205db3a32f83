/*
 * Clocks, bounded string helpers, parsing, hex, randomness, the one
 * whole-file read (key files, topology files) and the
 * length-delimited SHA-256 (OpenSSL) used for every derived message id.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/evp.h>
#include <openssl/rand.h>

#include "jsd_int.h"

int64_t jsd__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t jsd__mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t jsd__mono_ms(void)
{
    return jsd__mono_us() / 1000;
}

int jsd__cond_init_mono(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    int rc = pthread_condattr_init(&ca);
    if (rc != 0)
        return rc;
    rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
    return rc;
}

bool jsd__cond_wait_until_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t mono_deadline_ms)
{
    if (mono_deadline_ms <= jsd__mono_ms())
        return false;
    struct timespec ts = {.tv_sec = mono_deadline_ms / 1000,
                          .tv_nsec = (mono_deadline_ms % 1000) * 1000000};
    return pthread_cond_timedwait(cv, mu, &ts) != ETIMEDOUT;
}

bool jsd__cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t ms)
{
    if (ms <= 0)
        return false;
    return jsd__cond_wait_until_ms(cv, mu, jsd__mono_ms() + ms);
}

void jsd__sleep_ms(int64_t ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

bool jsd__strlcpy(char *dst, const char *src, size_t cap)
{
    if (!cap)
        return false;
    size_t n = strlen(src);
    if (n >= cap) {
        memcpy(dst, src, cap - 1);
        dst[cap - 1] = '\0';
        return false;
    }
    memcpy(dst, src, n + 1);
    return true;
}

bool jsd__snprintf(char *dst, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(dst, cap, fmt, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < cap;
}

bool jsd__parse_i64(const char *s, int64_t min, int64_t max, int64_t *out)
{
    if (!s || !*s)
        return false;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < min || v > max)
        return false;
    *out = (int64_t)v;
    return true;
}

bool jsd__parse_duration_ms(const char *s, int64_t *out)
{
    if (!s || !*s)
        return false;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v < 0)
        return false;
    int64_t mul;
    if (!*end || !strcmp(end, "ms"))
        mul = 1;
    else if (!strcmp(end, "s"))
        mul = 1000;
    else if (!strcmp(end, "m"))
        mul = 60 * 1000;
    else if (!strcmp(end, "h"))
        mul = 3600 * 1000;
    else if (!strcmp(end, "d"))
        mul = 24 * 3600 * 1000;
    else
        return false;
    if (v > INT64_MAX / mul)
        return false;
    *out = (int64_t)v * mul;
    return true;
}

void jsd__hex(const unsigned char *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

bool jsd__random_hex(char *out, size_t nbytes)
{
    unsigned char buf[32];
    if (nbytes > sizeof(buf) || RAND_bytes(buf, (int)nbytes) != 1)
        return false;
    jsd__hex(buf, nbytes, out);
    return true;
}

jsd_status jsd__ld_sha256_hex(const char *const *parts, const size_t *lens, size_t n,
                              char out_hex[65])
{
    unsigned char md[32];
    unsigned int mdlen = 0;
    out_hex[0] = '\0';
    /* The context is an allocation (OpenSSL's own): it answers to the same
     * failure injection as jsd__malloc, so tests reach this path. */
    EVP_MD_CTX *ctx = jsd__alloc_allowed() ? EVP_MD_CTX_new() : NULL;
    if (!ctx)
        return JSD_ERR_NOMEM;
    bool ok = EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1;
    for (size_t i = 0; ok && i < n; i++) {
        uint64_t len = lens ? lens[i] : (parts[i] ? strlen(parts[i]) : 0);
        unsigned char be[8];
        for (int b = 0; b < 8; b++)
            be[b] = (unsigned char)(len >> (56 - 8 * b));
        ok = EVP_DigestUpdate(ctx, be, sizeof(be)) == 1;
        if (ok && len)
            ok = EVP_DigestUpdate(ctx, parts[i], (size_t)len) == 1;
    }
    ok = ok && EVP_DigestFinal_ex(ctx, md, &mdlen) == 1 && mdlen == 32;
    EVP_MD_CTX_free(ctx);
    if (!ok)
        return JSD_ERR_INTERNAL;
    jsd__hex(md, 32, out_hex);
    return JSD_OK;
}

char *jsd__read_file(const char *path, size_t max, size_t *len)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = jsd__malloc(cap + 1);
    int fail = buf ? 0 : ENOMEM;
    while (!fail) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n > max) {
            fail = EFBIG;
        } else if (got == 0) {
            fail = ferror(f) ? EIO : 0;
            break;
        } else if (n == cap) {
            char *nb = jsd__malloc(cap * 2 + 1);
            if (!nb) {
                fail = ENOMEM;
                break;
            }
            memcpy(nb, buf, n);
            jsd__wipe(buf, cap);
            jsd__free(buf);
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (fail) {
        if (buf)
            jsd__wipe(buf, cap);
        jsd__free(buf);
        errno = fail;
        return NULL;
    }
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}
