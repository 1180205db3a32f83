/*
 * The writer turn across processes on one SQLite file (xturn.c): a
 * connection that waits for SQLite's write lock says so, and a connection
 * about to begin a write transaction lets such a waiter go first, for a
 * bounded time. Used by sqlite.c alone, one per connection.
 */
#ifndef JSD_STORE_XTURN_H
#define JSD_STORE_XTURN_H

#include <stdbool.h>
#include <stdint.h>

/* The most a begin waits for another connection's waiter: a waiter retries
 * the lock every 100 µs (sq_busy), so it takes the lock within a few
 * retries of the holder's commit. */
#define JSD__XTURN_YIELD_MAX_US 5000
/* After a waiter did not go within that bound (a stopped process, or a
 * third connection holding the lock), this connection begins without
 * looking for this long: a stopped waiter costs it one bounded wait a
 * second, not one per transaction. */
#define JSD__XTURN_DEAF_US 1000000

typedef struct jsd__xturn {
    int fd;                /* the turn file; -1: not taking part */
    bool announced;        /* saying it waits */
    int64_t deaf_until_us; /* monotonic; no looking for waiters before it */
    int64_t yields;        /* begins that let a waiter go first */
    int open_errno;        /* why the turn file could not be opened; 0 */
} jsd__xturn;

/* Open (creating it if need be) the turn file of the database at db_path:
 * db_path with "-jsdturn" appended. When it cannot be opened t->fd is -1,
 * t->open_errno says why (0 for a database without a file), and the
 * connection does not take part, which loses only the fairness. */
void jsd__xturn_open(jsd__xturn *t, const char *db_path);
void jsd__xturn_close(jsd__xturn *t);

/* Say that this connection waits for the write lock (idempotent), and stop
 * saying it. */
void jsd__xturn_announce(jsd__xturn *t);
void jsd__xturn_withdraw(jsd__xturn *t);

/* Before a write transaction begins: while another connection (of any
 * process) says it waits, wait, at most JSD__XTURN_YIELD_MAX_US. */
void jsd__xturn_yield(jsd__xturn *t);

#endif
