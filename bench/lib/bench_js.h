/*
 * bench_js — what the bench programs share: the clocks, the fatal error,
 * and a separate nats.c connection that makes, counts and drops the
 * benchmark streams (the library under test never makes its own stream
 * here, so a figure measures publishing, not provisioning), and fresh
 * PostgreSQL databases for the stores under test. Linked into every program
 * under bench/ by the Makefile.
 */
#ifndef JSD_BENCH_JS_H
#define JSD_BENCH_JS_H

#include <stddef.h>
#include <stdint.h>

#include <nats/nats.h>

#include "jsdurable.h"

/* The program's name for messages ("bench_relay"); set it first in main. */
extern const char *bench_prog;
extern natsConnection *bench_nc;
extern jsCtx *bench_js;

int64_t bench_mono_us(void);
/* CPU time (user + system) of this process, µs: a steadier measure than
 * wall time on a shared machine. */
int64_t bench_cpu_us(void);
/* CPU time (user + system) of the server whose process id is in the
 * environment variable pid_env (JSD_BENCH_NATS_PID, JSD_BENCH_PG_PID), µs,
 * read from /proc: the process's own time plus, with tree, that of its live
 * children and of those it has reaped (a PostgreSQL postmaster's backends
 * and helpers). -1 when the variable is unset or the process unreadable.
 * With the bench process's own CPU (bench_cpu_us) it shows how a
 * machine's cores are shared during a run. */
int64_t bench_server_cpu_us(const char *pid_env, int tree);
/* (after - before) / n, two bench_server_cpu_us readings made per message;
 * -1 when either was not known. */
double bench_per_msg(int64_t before, int64_t after, int n);
/* The machine's CPU time so far, all cores, from /proc/stat (clock ticks):
 * *busy everything but idle and iowait, *all everything. false when
 * unreadable. Two readings give the share of the machine that was busy. */
int bench_machine_ticks(long long *busy, long long *all);
/* The median of v[0..n) (n odd); sorts v in place. */
double bench_median(double *v, size_t n);
/* Print "PROG: " fmt (with detail) and exit 1. */
void bench_die(const char *fmt, const char *detail);
/* Connect bench_nc / bench_js to url, or die. */
void bench_nats_up(const char *url);
/* A fresh file-storage stream capturing subject (2 min duplicate window). */
void bench_stream_make(const char *name, const char *subject);
/* The same with allow_atomic (nats-server 2.12+; dies when refused) and
 * $BENCH_REPLICAS replicas (default 1). */
void bench_stream_make_atomic(const char *name, const char *subject);
uint64_t bench_stream_msgs(const char *name);
void bench_stream_drop(const char *name);

/* The library's store and connection for the code under test, or die. The
 * connection coalesces its writes, as `jsdurable relay` and `jsdurable
 * consume` open theirs, unless the variable write_each_env is "1" (as with
 * their --write-each). */
jsd_store *bench_store_open(const char *url);
jsd_conn *bench_conn_open(const char *nats_url, const char *write_each_env);

/* CREATE DATABASE name on the server of base_url (a postgresql:// URL), and
 * write into url the same URL naming that database; or die. */
void bench_pg_create(const char *base_url, const char *name, char *url, size_t cap);
void bench_pg_drop(const char *base_url, const char *name);

#endif
