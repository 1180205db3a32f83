/*
 * The private umbrella header: helpers every module shares — allocation (one
 * wrapper, so tests can inject failure), error filling, logging, clocks,
 * bounded string helpers, digests and crash points. Module-specific internal
 * APIs live in their own headers (src/store/store.h, src/publisher_int.h, ...).
 */
#ifndef JSD_INT_H
#define JSD_INT_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jsdurable.h"
#include "metrics_int.h"

#define JSD_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define JSD_MIN(a, b)    ((a) < (b) ? (a) : (b))
#define JSD_MAX(a, b)    ((a) > (b) ? (a) : (b))

#if defined(__GNUC__)
#define JSD_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define JSD_UNUSED       __attribute__((unused))
#else
#define JSD_PRINTF(f, a)
#define JSD_UNUSED
#endif

/* ---- allocation (alloc.c) ----------------------------------------------------
 * Every allocation goes through these. JSD_FAIL_ALLOC_AFTER=N in the
 * environment makes the (N+1)-th allocation fail, for tests. */
void *jsd__malloc(size_t n);
void *jsd__calloc(size_t count, size_t n);
void *jsd__realloc(void *p, size_t n);
char *jsd__strdup(const char *s); /* NULL stays NULL */
char *jsd__strndup(const char *s, size_t n);
void *jsd__memdup(const void *p, size_t n);
void jsd__free(void *p);
/* false when the failure injection says the next allocation fails (it counts
 * as one): for allocations made outside these wrappers (OpenSSL contexts). */
bool jsd__alloc_allowed(void);
/* Overwrite then free a secret string. Accepts NULL. */
void jsd__free_secret(char *s);
/* Overwrite n bytes so the compiler cannot drop it. */
void jsd__wipe(void *p, size_t n);

/* ---- errors (status.c) -------------------------------------------------------- */
/* Fill err (may be NULL) and return s. The message is printf-formatted; it must
 * never include credentials. */
jsd_status jsd__err(jsd_error *err, jsd_status s, const char *fmt, ...) JSD_PRINTF(3, 4);
jsd_status jsd__verr(jsd_error *err, jsd_status s, const char *fmt, va_list ap);
/* Copy src into dst (either may be NULL). */
void jsd__err_copy(jsd_error *dst, const jsd_error *src);

/* ---- logging (log.c) ------------------------------------------------------------
 * kv is an optional list of "key", "value" string pairs ended by NULL, rendered
 * as key=value (text) or JSON members. */
bool jsd__log_enabled(jsd_log_level level);
void jsd__log(jsd_log_level level, const char *component, const char *fmt, ...) JSD_PRINTF(3, 4);
#define JSD_DEBUG(comp, ...)                                                                       \
    do {                                                                                           \
        if (jsd__log_enabled(JSD_LOG_DEBUG))                                                       \
            jsd__log(JSD_LOG_DEBUG, comp, __VA_ARGS__);                                            \
    } while (0)
#define JSD_INFO(comp, ...)  jsd__log(JSD_LOG_INFO, comp, __VA_ARGS__)
#define JSD_WARN(comp, ...)  jsd__log(JSD_LOG_WARN, comp, __VA_ARGS__)
#define JSD_ERROR(comp, ...) jsd__log(JSD_LOG_ERROR, comp, __VA_ARGS__)

/* ---- clocks and strings (util.c) ------------------------------------------------- */
int64_t jsd__now_ms(void);  /* wall clock, unix ms */
int64_t jsd__mono_ms(void); /* monotonic ms */
int64_t jsd__mono_us(void); /* monotonic µs */
void jsd__sleep_ms(int64_t ms);
/* The one timed wait: a condition variable made by jsd__cond_init_mono waits
 * on the monotonic clock (a wall-clock step neither stretches nor cuts it);
 * jsd__cond_wait_ms waits at most ms (<= 0: returns at once) with mu held,
 * and returns false on a timeout, true when signalled (or spuriously woken:
 * callers re-check their condition). */
int jsd__cond_init_mono(pthread_cond_t *cv);
bool jsd__cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t ms);
bool jsd__cond_wait_until_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t mono_deadline_ms);
/* snprintf that reports truncation as false. */
bool jsd__strlcpy(char *dst, const char *src, size_t cap);
bool jsd__snprintf(char *dst, size_t cap, const char *fmt, ...) JSD_PRINTF(3, 4);
/* Parse a whole decimal integer in [min, max]. */
bool jsd__parse_i64(const char *s, int64_t min, int64_t max, int64_t *out);
/* Parse a duration: "250ms", "30s", "5m", "2h", "7d", or plain milliseconds. */
bool jsd__parse_duration_ms(const char *s, int64_t *out);
/* Lower-case hex of n bytes into out (2n+1 bytes). */
void jsd__hex(const unsigned char *in, size_t n, char *out);
/* A random hex token of 2*nbytes characters (nbytes <= 32) into out. */
bool jsd__random_hex(char *out, size_t nbytes);
/* The file at path whole, NUL-terminated, in a buffer of jsd__malloc's; *len
 * (may be NULL) its length without the NUL. NULL with errno set: fopen's,
 * EFBIG when it holds more than max bytes, ENOMEM, or EIO for a read error.
 * Every buffer outgrown on the way is wiped before it is freed (the file may
 * hold a key); the caller wipes the one returned if it must. */
char *jsd__read_file(const char *path, size_t max, size_t *len);

/* Length-delimited SHA-256: each part is hashed as its 8-byte big-endian
 * length then its bytes, so ("ab","c") and ("a","bc") differ. out_hex holds
 * 65 bytes. lens may be NULL (strlen of each part). JSD_OK, or
 * JSD_ERR_NOMEM / JSD_ERR_INTERNAL when OpenSSL fails; then out_hex is ""
 * (never a made-up digest: every id derived from it would collide). */
jsd_status jsd__ld_sha256_hex(const char *const *parts, const size_t *lens, size_t n,
                              char out_hex[65]);

/* ---- crash points (crash.c) --------------------------------------------------------
 * JSD_CRASH_AT="<point>:<n>" makes the process SIGKILL itself the n-th time it
 * reaches <point>. Inert (one relaxed load) when the variable is unset. */
void jsd__crash_point(const char *point);
/* Whether point is the one armed (so that it may first make its state
 * visible, e.g. write what is buffered, before the crash). */
bool jsd__crash_armed(const char *point);
#define JSD_CRASH_POINT(name) jsd__crash_point(name)

#endif
