/*
 * streams — which stream captures a subject, asked once and remembered.
 *
 * One request answers it: $JS.API.STREAM.NAMES with a {"subject": ...}
 * filter (nats.c 3.4.1's js_StreamNames has no subject option, so the request
 * is made raw). jsd__streams caches the answers, found ("positive") and not
 * found ("negative") alike, each for its own TTL, in a bounded table, and
 * beside them what the relay needs per found stream: its duplicate window,
 * read lazily with one stream info request and kept as long as a positive
 * answer (and, read with it, whether it allows atomic batches). The relay, the publication engine's
 * callers and the dead-letter code all ask here.
 */
#ifndef JSD_STREAMS_H
#define JSD_STREAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "jsd_int.h"

#define JSD__STREAMS_POS_TTL_MS 60000 /* a found stream is re-checked after this */
#define JSD__STREAMS_NEG_TTL_MS 1000  /* "no stream captures" is re-checked after this */
#define JSD__STREAMS_MAX        4096  /* answers kept; when full, all are forgotten */

#define JSD__JS_STREAM_NOT_FOUND 10059 /* JetStream's err_code for "stream not found" */

/*
 * One JetStream API request made raw: <API prefix>.<api> (e.g.
 * "STREAM.INFO.ORDERS") with body (NULL: empty), within the connection's
 * request timeout, for what nats.c 3.4.1 cannot say or read (a subject
 * filter, stream fields it does not know: allow_atomic, persist_mode, ...).
 * JSD_OK with *out the answer's root object (the caller's to json_decref).
 * An answer carrying "error" is JSD_ERR_NOT_FOUND for 10059 (stream not
 * found), else JSD_ERR_NATS, with err->js_err_code and the server's
 * description; JSD_ERR_NO_JETSTREAM when nothing answers; `what` starts the
 * error text ("reading stream \"X\"").
 */
jsd_status jsd__js_api(jsd_conn *conn, const char *api, const char *body, json_t **out,
                       const char *what, jsd_error *err);

/* A stream's configuration as the server holds it: the "config" object of
 * STREAM.INFO, every field kept (the caller's to json_decref). Errors as
 * jsd__js_api's (JSD_ERR_NOT_FOUND: no such stream). */
jsd_status jsd__stream_config_json(jsd_conn *conn, const char *stream, json_t **cfg,
                                   jsd_error *err);

/*
 * Find the stream that captures an exact subject with one request, within the
 * connection's request timeout. name_out receives the stream name.
 * JSD_ERR_NOT_FOUND ("no stream captures subject ...") when none does;
 * JSD_ERR_INVALID for a subject that is not exact; JSD_ERR_NO_JETSTREAM,
 * JSD_ERR_TIMEOUT, JSD_ERR_NATS when the question could not be answered.
 * Uncached; thread-safe (it only makes a request on conn).
 */
jsd_status jsd__stream_for_subject(jsd_conn *conn, const char *subject, char *name_out, size_t cap,
                                   jsd_error *err);

/*
 * The cache. Thread-safe: one mutex guards the table, never held across a
 * request (two threads missing the same subject at once both ask; the later
 * answer wins). pos_ttl_ms / neg_ttl_ms <= 0 take the defaults above, max 0
 * takes JSD__STREAMS_MAX.
 */
typedef struct jsd__streams jsd__streams;
jsd_status jsd__streams_create(jsd__streams **out, jsd_conn *conn, int64_t pos_ttl_ms,
                               int64_t neg_ttl_ms, size_t max);
void jsd__streams_destroy(jsd__streams *c);

/* As jsd__stream_for_subject, answered from the cache while the entry lives
 * (a cached "not found" gives JSD_ERR_NOT_FOUND again). Lookups that could
 * not be made (NATS down, timeout) are not cached. */
jsd_status jsd__streams_lookup(jsd__streams *c, const char *subject, char *name_out, size_t cap,
                               jsd_error *err);

/* Forget one subject's answer (e.g. after a FAILED 10060 wrong expected
 * stream or no responders), or everything. */
void jsd__streams_forget(jsd__streams *c, const char *subject);
void jsd__streams_clear(jsd__streams *c);

/*
 * The duplicate window of a stream, in ms (0: none configured), read with one
 * stream info request and kept for the positive TTL. On failure err carries
 * the natsStatus (nats_status) and jsErrCode (js_err_code); JSD_ERR_NOT_FOUND
 * when the stream does not exist, JSD_ERR_NATS otherwise.
 */
jsd_status jsd__streams_dup_window(jsd__streams *c, const char *stream, int64_t *window_ms,
                                   jsd_error *err);
/* The same read, with the stream's allow_atomic (false on a server that
 * does not know the field): whether atomic batches may be tried on it. */
jsd_status jsd__streams_info(jsd__streams *c, const char *stream, int64_t *window_ms,
                             bool *allow_atomic, jsd_error *err);

#endif
