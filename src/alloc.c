/*
 * The one allocation wrapper. Tests set JSD_FAIL_ALLOC_AFTER=N to make every
 * allocation after the N-th fail, to prove that out-of-memory paths return
 * JSD_ERR_NOMEM and leak nothing.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "jsd_int.h"

static atomic_long fail_after = -2; /* -2: not read yet, -1: never fail */

bool jsd__alloc_allowed(void)
{
    long v = atomic_load_explicit(&fail_after, memory_order_relaxed);
    if (v == -2) {
        const char *e = getenv("JSD_FAIL_ALLOC_AFTER");
        int64_t n = -1;
        if (!e || !jsd__parse_i64(e, 0, INT32_MAX, &n))
            n = -1;
        atomic_store(&fail_after, (long)n);
        v = (long)n;
    }
    if (v < 0)
        return true;
    return atomic_fetch_sub(&fail_after, 1) > 0;
}

void *jsd__malloc(size_t n)
{
    return jsd__alloc_allowed() ? malloc(n ? n : 1) : NULL;
}

void *jsd__calloc(size_t count, size_t n)
{
    return jsd__alloc_allowed() ? calloc(count ? count : 1, n ? n : 1) : NULL;
}

void *jsd__realloc(void *p, size_t n)
{
    return jsd__alloc_allowed() ? realloc(p, n ? n : 1) : NULL;
}

void jsd__free(void *p)
{
    free(p);
}

void *jsd__memdup(const void *p, size_t n)
{
    void *q = jsd__malloc(n);
    if (q && n)
        memcpy(q, p, n);
    return q;
}

char *jsd__strndup(const char *s, size_t n)
{
    if (!s)
        return NULL;
    size_t len = strnlen(s, n);
    char *q = jsd__malloc(len + 1);
    if (q) {
        memcpy(q, s, len);
        q[len] = '\0';
    }
    return q;
}

char *jsd__strdup(const char *s)
{
    return s ? jsd__strndup(s, strlen(s)) : NULL;
}

void jsd__wipe(void *p, size_t n)
{
    volatile unsigned char *v = p;
    while (n--)
        *v++ = 0;
}

void jsd__free_secret(char *s)
{
    if (!s)
        return;
    jsd__wipe(s, strlen(s));
    free(s);
}
