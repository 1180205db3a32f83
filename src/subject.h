/*
 * subject — validation of the names that reach the broker (stream names, exact
 * subjects, stream filter subjects, tenant topics, header names and values,
 * JetStream domains and API prefixes)
 * and the derivation of idempotency ids, and the algebra of subject patterns
 * (capture and overlap, for the topology file). Pure code: no I/O, no
 * allocation.
 *
 * The rules are this project's conservative profile (PUB-1, SEC-1,2), stricter
 * than what nats-server accepts:
 *   - a token is one or more of [A-Za-z0-9_-];
 *   - an exact subject is tokens separated by single dots, 1..256 bytes, no
 *     wildcards;
 *   - a stream name is one token of 1..128 bytes (no dots);
 *   - a tenant topic is an exact subject that does not start with "$" (which
 *     the character set already excludes) nor with an "_INBOX" token.
 * Each validator returns true when the input is valid; otherwise false, with
 * err (optional) set to JSD_ERR_INVALID and a message that names the input (or
 * a printable prefix of it) and the rule it broke.
 */
#ifndef JSD_SUBJECT_H
#define JSD_SUBJECT_H

#include <stdbool.h>
#include <stddef.h>

#include "jsd_int.h"

#define JSD_STREAM_NAME_MAX 128
/* JSD_SUBJECT_MAX, JSD_HEADER_NAME_MAX and the other limits of a message are
 * public, in include/jsdurable/store.h. */

/* One token [A-Za-z0-9_-]+ of 1..128 bytes. */
bool jsd__stream_name_valid(const char *name, jsd_error *err);

/* A JetStream domain: one token [A-Za-z0-9_-]+ of 1..128 bytes. An API
 * prefix: dot-separated non-empty tokens of printable ASCII other than
 * space, "*" and ">", 1..256 bytes (a trailing dot allowed; nats.c drops
 * it), so "$JS.hub.API" passes. */
bool jsd__js_domain_valid(const char *domain, jsd_error *err);
bool jsd__js_api_prefix_valid(const char *prefix, jsd_error *err);

/* Tokens [A-Za-z0-9_-]+ separated by single dots, 1..256 bytes; no "*", ">",
 * spaces, control characters, empty tokens. */
bool jsd__subject_valid_exact(const char *subject, jsd_error *err);

/* An exact subject that is also acceptable as a tenant's logical topic or
 * mapped subject: no "$" system prefix and no "_INBOX" first token. */
bool jsd__subject_valid_tenant(const char *subject, jsd_error *err);

/* The subject of a message this project publishes (an outbox effect, a
 * publication, a relayed message): the same rule as a tenant subject, so
 * jsd_tx_emit refuses what the relay could not publish. */
bool jsd__subject_valid_publish(const char *subject, jsd_error *err);

/* Bytes a header "Name: value\r\n" takes on the wire (JSD_HEADERS_MAX_BYTES
 * counts these plus "NATS/1.0\r\n" and the final "\r\n"). */
size_t jsd__header_wire_size(size_t name_len, size_t value_len);
#define JSD__HEADERS_FRAME_BYTES 12 /* "NATS/1.0\r\n" + "\r\n" */

/* A stream's filter subject as the server may hold it: non-empty tokens
 * separated by dots, "*" as a whole token, ">" only as the last whole token.
 * Looser on characters than the exact rule (a stream may capture "$X.>"). */
bool jsd__subject_valid_filter(const char *filter, jsd_error *err);

/* True when the exact subject is captured by the filter ("*" one token, ">"
 * one or more trailing tokens). Both must be well-formed. */
bool jsd__subject_matches(const char *filter, const char *subject);

/* Subject patterns (the topology file's stream subjects and consumer
 * filters). jsd_subjects_overlap (public, include/jsdurable/topology.h): some
 * subject matches both a and b. jsd__subject_within: every subject matching
 * pattern a also matches pattern b (both well-formed; jsd__subject_matches is
 * its case of an exact a). */
bool jsd__subject_within(const char *a, const char *b);

/* The literal tokens before a pattern's first wildcard, as a length of s:
 * "jsd.dlq.>" -> 7 ("jsd.dlq"); and whether roots a (la bytes) and b (lb) are
 * nested, one a whole-token prefix of the other (or equal; an empty root is
 * nested with every root). */
size_t jsd__subject_root_len(const char *s);
bool jsd__subject_roots_nested(const char *a, size_t la, const char *b, size_t lb);

/* The topology file's subject pattern: tokens [A-Za-z0-9_-]+ separated by
 * single dots, "*" a whole token, ">" only as the whole last token,
 * 1..JSD_SUBJECT_MAX bytes. On false why receives the rule broken. */
bool jsd__subject_pattern_check(const char *s, char *why, size_t cap);

/* A header name: 1..max_len bytes of printable ASCII (0x21..0x7e) without ':'.
 * A header value: 1..max_len bytes with no CR, LF or NUL (len given
 * explicitly so an embedded NUL is caught), and no white space first or last
 * (jsd__header_value_edges). what names the field in errors, e.g.
 * "attribute". */
bool jsd__header_name_valid(const char *name, size_t max_len, const char *what, jsd_error *err);
bool jsd__header_value_valid(const char *value, size_t len, size_t max_len, const char *what,
                             jsd_error *err);

/* What a receiver could not read back as it was sent, or NULL: an empty value
 * ("is empty"), or one with white space first or last. nats.c 3.4.1 reads a
 * header line by skipping every white-space byte after the ':' (CR and LF
 * among them, src/msg.c _processKeyValue): an empty value makes it take the
 * next line as the value, or fail on the whole message, so that not even its
 * Nats-Msg-Id can be read; white space around a value is trimmed by it (and
 * by the other clients). tests/unit/test_natsmsg shows nats.c's reading,
 * tests/unit/test_subject the rule. */
const char *jsd__header_value_edges(const char *value, size_t len);

/* W3C trace context (JSD_TRACESTATE_MAX in store.h has the rule): name is
 * "traceparent" or "tracestate" (jsd__trace_header tells, ignoring case), value
 * the text to check. On false err says what is wrong. */
bool jsd__trace_header(const char *name);
bool jsd__trace_value_valid(const char *name, const char *value, jsd_error *err);

/* Copy up to 48 bytes of s into out (cap >= 64) for an error message, every
 * byte outside printable ASCII shown as '?', "..." appended when cut. */
void jsd__printable(const char *s, size_t len, char *out, size_t cap);

#endif
