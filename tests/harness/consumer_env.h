/*
 * Shared set-up for the ingress tests (test_consumer*.c, test_ops_kit.c,
 * slow/test_consumer_crash.c): a stream and a dead-letter stream with unique
 * names on the run's shared nats-server, a store on either back end, raw
 * nats.c for administration and observation, and small SQL helpers that work
 * on SQLite and PostgreSQL alike. Compiled once (consumer_env.c) and linked
 * into every test; it brings in test.h and fixture.h, which all its users need.
 */
#ifndef JSD_CONSUMER_ENV_H
#define JSD_CONSUMER_ENV_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <libpq-fe.h>
#include <nats/nats.h>
#include <sqlite3.h>

#include "fixture.h"
#include "test.h"

typedef struct cenv {
    bool pg;
    char store_url[512];
    jsd_store *store;
    jsd_conn *conn;
    natsConnection *nc;
    jsCtx *js;
    char stream[64], prefix[64], dlq_stream[64], durable[64], dlq_subject[160];
} cenv;

/* Open e->conn (the library's) and e->nc / e->js (raw nats.c) on the shared
 * nats-server. */
void cenv_connect(cenv *e);
/* A stream capturing "<prefix>.>" and a dead-letter stream capturing
 * "jsd.dlq.<stream>.>", plus a store on the chosen back end. */
void cenv_up(cenv *e, bool pg);
/* The same with a store URL of the test's own (a private PostgreSQL, a
 * SQLite file on a small tmpfs); NULL: a fresh one on the run's shared
 * services. */
void cenv_up_at(cenv *e, bool pg, const char *store_url);
/* Delete both streams, close everything cenv_up opened. */
void cenv_down(cenv *e);

/* Create the durable with explicit settings. */
void cenv_durable(cenv *e, int64_t ack_wait_ms, int max_deliver, int max_ack_pending,
                  const int64_t *backoff_ms, int n_backoff);

/* Publish n messages "<prefix>.k" with body "msg-k" (k = first..first+n-1),
 * Nats-Msg-Id "id-k" and the given Jsd-Type (NULL: none). */
void cenv_publish(cenv *e, int first, int n, const char *type);
/* Publish one message with an arbitrary body. */
void cenv_publish_raw(cenv *e, const char *subj_tail, const void *body, int len, const char *type,
                      const char *msg_id);

/* Run one statement inside tx on its native handle; true on success. */
bool cenv_tx_exec(jsd_tx *tx, const char *sql);
/* Run one statement in a transaction of its own; fails the test on error. */
void cenv_store_exec(jsd_store *s, const char *sql);
/* One integer from a query (-1 on error). */
long long cenv_store_scalar(jsd_store *s, const char *sql);
/* The table "sink" of the store holds every stream sequence 1..n in its
 * column seq exactly once (n rows, n distinct, from 1 to n). */
void cenv_sink_seqs_once(cenv *e, int n);

/* The durable's info (NULL on error); jsConsumerInfo_Destroy it. */
jsConsumerInfo *cenv_info(cenv *e);
/* Messages in a stream (-1 on error). */
long long cenv_stream_msgs(cenv *e, const char *stream);
/* Nothing pending and nothing awaiting an ACK on the durable. */
bool cenv_settled(cenv *e);
/* The durable's waiting pull requests, and its unacknowledged deliveries
 * (-1 on error). */
long long cenv_waiting(cenv *e);
long long cenv_ack_pending(cenv *e);
/* A core pull request for the durable (body: its JSON), answered into inbox,
 * the subject of a consumer's pull subscription: a fetch made by hand while
 * the consumer's fetcher is stopped. */
void cenv_raw_pull(cenv *e, const char *inbox, const char *body);
/* A consumer on e's stream and durable (o may be NULL: defaults); o's stream,
 * durable and inbox retention are set here, fetch_wait_ms defaults to 200. */
jsd_consumer *cenv_consumer(cenv *e, jsd_consumer_opts *o);

/* GET /readyz of a process's metrics port answers with status (" 200 ",
 * " 503 ") and, when text is given, contains text. */
bool cenv_readyz_says(int port, const char *status, const char *text);
/* SIGTERM a spawned `jsdurable consume` and wait: its log (the file at log)
 * into out (cap bytes); fails the test unless it exited 0. */
void cenv_stop_consume(pid_t pid, const char *log, char *out, size_t cap);

/* The sqlite_ and pg_ cmocka cases of a suite function fn(bool pg). */
#define BOTH(fn)                                                                                   \
    static void fn##_sqlite(void **state)                                                          \
    {                                                                                              \
        (void)state;                                                                               \
        fn(false);                                                                                 \
    }                                                                                              \
    static void fn##_pg(void **state)                                                              \
    {                                                                                              \
        (void)state;                                                                               \
        fn(true);                                                                                  \
    }

/* Poll c with pollfn (jsd_consumer_poll or jsd_consumer_poll_batch) and
 * handler h (user data u) until cond holds, failing the test after ms. */
#define CENV_POLL_UNTIL(pollfn, c, h, u, cond, ms)                                                 \
    do {                                                                                           \
        int64_t end_ = jsd_test_mono_ms() + (ms);                                                  \
        while (!(cond) && jsd_test_mono_ms() < end_) {                                             \
            jsd_status st_ = pollfn((c), (h), (u), NULL);                                          \
            if (st_ != JSD_OK && st_ != JSD_ERR_STOPPED)                                           \
                fail_msg("poll: %s: %s", jsd_status_name(st_), jsd_consumer_errmsg(c));            \
        }                                                                                          \
        if (!(cond))                                                                               \
            fail_msg("`%s` still false after %d ms", #cond, (int)(ms));                            \
    } while (0)

#endif
