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

/* Asynchronous errors the server reports on the connection (for example
 * "Permissions Violation for Publish to ..."), fanned out to listeners from
 * nats.c's thread. A listener only records what it needs under its own lock.
 * Returns a handle for removal, or -1. */
typedef void (*jsd__conn_error_fn)(natsStatus s, const char *text, void *user);
int jsd__conn_add_error_listener(jsd_conn *c, jsd__conn_error_fn fn, void *user);
void jsd__conn_remove_error_listener(jsd_conn *c, int handle);

/* Fill err from a nats.c failure: natsStatus, the library's last error text
 * (credentials redacted) and, when given, a jsErrCode. Returns the mapped
 * jsd_status. */
jsd_status jsd__err_nats(jsd_error *err, natsStatus s, jsErrCode jerr, const char *what);

#endif
