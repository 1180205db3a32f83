/*
 * jsdurable status codes, error details, logging and version.
 *
 * The status list is one X-macro, so jsd_status_name() and jsd_status_str()
 * can never drift from the enum.
 */
#ifndef JSDURABLE_STATUS_H
#define JSDURABLE_STATUS_H

#include <stddef.h>
#include <stdint.h>

/* JSD_EXTERN marks every public function, as UV_EXTERN does in libuv: the
 * library is built with -fvisibility=hidden, so only what carries it is
 * exported from libjsdurable.so (`make check` fails on any other export and
 * on a public declaration that lacks it: scripts/check-exports.sh). Every
 * public header includes this one. */
#ifndef JSD_EXTERN
#if defined(__GNUC__) || defined(__clang__)
#define JSD_EXTERN __attribute__((visibility("default")))
#else
#define JSD_EXTERN
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define JSD_STATUS_MAP(X)                                                                          \
    X(OK, "success")                                                                               \
    X(ERR_INVALID, "invalid argument")                                                             \
    X(ERR_NOMEM, "out of memory")                                                                  \
    X(ERR_CONFIG, "invalid configuration")                                                         \
    X(ERR_CONNECT, "cannot connect")                                                               \
    X(ERR_AUTH, "authorization failed")                                                            \
    X(ERR_TLS, "TLS failure")                                                                      \
    X(ERR_NO_JETSTREAM, "JetStream not available")                                                 \
    X(ERR_NOT_SUPPORTED, "not supported")                                                          \
    X(ERR_TIMEOUT, "timed out")                                                                    \
    X(ERR_NOT_FOUND, "not found")                                                                  \
    X(ERR_EXISTS, "already exists")                                                                \
    X(ERR_LIMIT, "limit exceeded")                                                                 \
    X(ERR_BIND, "stream binding rejected")                                                         \
    X(ERR_STORE, "store error")                                                                    \
    X(ERR_SCHEMA, "unsupported schema version")                                                    \
    X(ERR_READONLY, "store is read-only")                                                          \
    X(ERR_FULL, "storage full")                                                                    \
    X(ERR_BUSY, "busy")                                                                            \
    X(ERR_LEASE_LOST, "lease lost")                                                                \
    X(ERR_NATS, "NATS error")                                                                      \
    X(ERR_IO, "I/O error")                                                                         \
    X(ERR_STOPPED, "stopped")                                                                      \
    X(ERR_INTERNAL, "internal error")

typedef enum jsd_status {
#define JSD__STATUS_ENUM(name, text) JSD_##name,
    JSD_STATUS_MAP(JSD__STATUS_ENUM)
#undef JSD__STATUS_ENUM
        JSD__STATUS_COUNT
} jsd_status;

/* "JSD_ERR_TIMEOUT" for JSD_ERR_TIMEOUT; "JSD_?" for an unknown value. */
JSD_EXTERN const char *jsd_status_name(jsd_status s);
/* "timed out" for JSD_ERR_TIMEOUT; a short human description. */
JSD_EXTERN const char *jsd_status_str(jsd_status s);

#define JSD_ERRMSG_MAX 512

/*
 * The detail of a failure: the status, a message that names what failed, with
 * what input and what to do, and the underlying cause where there is one.
 * Never contains credentials.
 */
typedef struct jsd_error {
    jsd_status status;
    char msg[JSD_ERRMSG_MAX];
    int nats_status;  /* natsStatus, 0 if none */
    int js_err_code;  /* JetStream API error code (e.g. 10060), 0 if none */
    char sqlstate[6]; /* PostgreSQL SQLSTATE, "" if none */
    int sqlite_code;  /* SQLite extended result code, 0 if none */
} jsd_error;

/* Reset an error to JSD_OK with an empty message. */
JSD_EXTERN void jsd_error_clear(jsd_error *err);

/* ---- logging --------------------------------------------------------------
 * Structured logs. The default sink writes text lines to stderr at WARN and
 * above. Nothing secret is ever passed to a log call.
 */
typedef enum jsd_log_level {
    JSD_LOG_DEBUG = 0,
    JSD_LOG_INFO,
    JSD_LOG_WARN,
    JSD_LOG_ERROR,
    JSD_LOG_OFF
} jsd_log_level;

typedef enum jsd_log_format { JSD_LOG_TEXT = 0, JSD_LOG_JSON } jsd_log_format;

/* A sink receives one finished line (no trailing newline). Thread-safe sinks
 * only: logs come from any thread. */
typedef void (*jsd_log_fn)(jsd_log_level level, const char *component, const char *line,
                           void *user);

/* Configure the process-wide logger. fn NULL restores the stderr sink.
 * Thread-safe. */
JSD_EXTERN void jsd_log_configure(jsd_log_level min_level, jsd_log_format format, jsd_log_fn fn,
                                  void *user);
/* Write one line through the process-wide logger, as the library's own lines
 * are written (text or JSON, the same threshold and sink): for programs, such
 * as the jsdurable tool, whose lines must match the library's. Never pass a
 * secret. Thread-safe. */
JSD_EXTERN void jsd_log(jsd_log_level level, const char *component, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Parse "debug|info|warn|error|off"; JSD_ERR_INVALID otherwise. */
JSD_EXTERN jsd_status jsd_log_level_parse(const char *s, jsd_log_level *out);

/* "0.1.0" */
JSD_EXTERN const char *jsd_version(void);
/* The linked nats.c version, e.g. "3.4.1". */
JSD_EXTERN const char *jsd_nats_client_version(void);

#ifdef __cplusplus
}
#endif
#endif
