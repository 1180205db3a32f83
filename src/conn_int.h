/*
 * Internal view of a jsd_conn for the modules that talk to NATS directly
 * (publisher, relay, ingress, topology, deadletter). Shared by conn.c and its
 * users; not part of the public API.
 */
#ifndef JSD_CONN_INT_H
#define JSD_CONN_INT_H

#include <nats/nats.h>

#include "jsd_int.h"

/* The underlying connection and a JetStream context made with the profile's
 * request timeout. Owned by the jsd_conn; valid until jsd_conn_close. */
natsConnection *jsd__conn_nats(jsd_conn *c);
jsCtx *jsd__conn_js(jsd_conn *c);
int jsd__conn_request_timeout_ms(const jsd_conn *c);
/* On a connection that coalesces writes: write what is buffered now instead
 * of after the flusher's millisecond, for a caller that knows nothing else is
 * coming soon (it waits at most a few ms for the server's PONG). Does
 * nothing on a connection that writes each message at once, or one that is
 * not connected. */
void jsd__conn_write_now(jsd_conn *c);
/* The JetStream API prefix of the profile, without a trailing dot:
 * "$JS.API", "$JS.<domain>.API" or the profile's js_api_prefix. For the raw
 * API requests a module makes itself ("<prefix>.STREAM.NAMES"). */
const char *jsd__conn_js_api_prefix(const jsd_conn *c);

/* Asynchronous errors the server reports on the connection (for example
 * "Permissions Violation for Publish to ..."), fanned out to listeners from
 * nats.c's thread. A listener only records what it needs under its own lock,
 * and must not add or remove listeners itself (they run under the
 * connection's listener lock). Up to 16 per connection. Returns a handle for
 * removal, or -1. Once remove returns, that listener is never called again,
 * so its user data may be freed. */
typedef void (*jsd__conn_error_fn)(natsStatus s, const char *text, void *user);
int jsd__conn_add_error_listener(jsd_conn *c, jsd__conn_error_fn fn, void *user);
void jsd__conn_remove_error_listener(jsd_conn *c, int handle);

/* natserr.c: fill err from a nats.c failure: natsStatus, the library's last error text
 * (credentials redacted) and, when given, a jsErrCode. Returns the mapped
 * jsd_status. */
jsd_status jsd__err_nats(jsd_error *err, natsStatus s, jsErrCode jerr, const char *what);

/* The checks jsd_conn_open makes before touching the network (server URLs,
 * authentication choice, files readable, ranges), with the same redacted
 * error texts; for tests and the fuzz target. */
jsd_status jsd__conn_opts_check(const jsd_conn_opts *o, jsd_error *err);

/* nkeys.c: the public user NKey ("U...") of a user seed ("SU...", n = 58 bytes) into
 * out (cap >= 57). JSD_ERR_CONFIG if the seed is not a valid user seed. */
jsd_status jsd__nkey_public_from_seed(const char *seed, size_t n, char *out, size_t cap);

/* The NKey text encoding (base32 of prefix, key and CRC-16): a seed (58
 * characters) or public key (56) of a 32-byte Ed25519 key of the given type
 * prefix (user 20 << 3, account 0, operator 14 << 3), and the reverse for a
 * seed. For jsd__nkey_public_from_seed and the tests' key tool. */
jsd_status jsd__nkey_encode(unsigned char type, bool seed, const unsigned char key[32], char *out,
                            size_t cap);
jsd_status jsd__nkey_decode_seed(const char *seed, size_t n, unsigned char *type,
                                 unsigned char key[32]);

/* The Ed25519 signature of a server's nonce with the user seed in the file at
 * path (a seed file or a creds file), read afresh; *unsendable when its first
 * byte is zero, which nats.c 3.4.1 cannot send (nkeys.c, "Signing the
 * server's nonce"). JSD_ERR_CONFIG when the file cannot be read or holds no
 * user seed; JSD_ERR_AUTH, and no signature, when expect_public (may be
 * NULL) is not the seed's public user key: the file now holds another key
 * than the one the connection announces. */
jsd_status jsd__nkey_sign_nonce(const char *path, const char *expect_public, const char *nonce,
                                unsigned char sig[64], bool *unsendable);

/* The user JWT of a creds file (the first JWT-shaped line between a header
 * and a footer line), malloc'd; JSD_ERR_CONFIG when there is none. */
jsd_status jsd__creds_jwt(const char *path, char **jwt);
/* The same from the file's text (for the fuzz target). */
jsd_status jsd__creds_jwt_in(const char *text, char **jwt);

/* Per-subscription pending limits of the profile, for natsSubscription_
 * SetPendingLimits (nats.c has no connection-wide setting for bytes). */
void jsd__conn_pending_limits(const jsd_conn *c, int *msgs, int64_t *bytes);

/* nats.c closed the connection for good (reconnection attempts exhausted, or
 * the server refused the credentials twice in a row), not jsd_conn_close:
 * it will not come back, and a relay or consumer on it stops with
 * JSD_ERR_CONNECT instead of waiting for ever. */
bool jsd__conn_gone(jsd_conn *c);

#endif
