/*
 * Helpers shared by the publisher's integration tests (test_publisher*.c,
 * test_tenancy.c): open a jsd_conn on a fixture, create streams with raw
 * nats.c (the publisher never creates them), and read what the broker stored
 * over a second, direct nats.c connection so the checks do not trust the code
 * under test. Compiled once (publisher_env.c) and linked into every test; it
 * brings in test.h and fixture.h, which all its users need.
 */
#ifndef JSD_PUBLISHER_ENV_H
#define JSD_PUBLISHER_ENV_H

#include <stdbool.h>
#include <stdint.h>

#include <nats/nats.h>

#include "fixture.h"
#include "test.h"

/* A jsd_conn with short reconnect and request timings (user may be NULL). */
jsd_conn *ph_open_user(const char *url, const char *user, const char *password);
jsd_conn *ph_open(const char *url);

/* A direct nats.c connection, independent of the library (user may be NULL). */
natsConnection *ph_direct(const char *url, const char *user, const char *password);
/* A JetStream context on it with a 5 s wait. */
jsCtx *ph_js(natsConnection *nc);

typedef struct ph_stream {
    const char *name;
    const char *subject; /* one subject or filter */
    bool memory;
    bool no_ack;
    int64_t dup_window_ms; /* 0 = server default (2 min) */
} ph_stream;

void ph_add_stream(jsCtx *js, const ph_stream *p);
void ph_delete_stream(jsCtx *js, const char *name);
/* Messages stored in the stream, or -1 if it cannot be read. */
int64_t ph_stream_msgs(jsCtx *js, const char *name);
/* Messages the client has written so far (its outgoing message counter). */
uint64_t ph_out_msgs(natsConnection *nc);

/* jsd_publisher_bind with the given admission and deadline; fails the test
 * with the bind's error. */
jsd_publisher *ph_bind(jsd_conn *c, const char *stream, const char *subject, int admission,
                       int deadline_ms);

#define ASSERT_OUTCOME(expr, want, res)                                                            \
    do {                                                                                           \
        jsd_outcome ph__o = (expr);                                                                \
        if (ph__o != (want))                                                                       \
            fail_msg("`%s` gave %s, expected %s: %s", #expr, jsd_outcome_str(ph__o),               \
                     jsd_outcome_str(want), (res).reason);                                         \
    } while (0)

#endif
