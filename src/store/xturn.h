/*
 * The writer turn across processes on one SQLite file (xturn.c): a
 * connection that waits for SQLite's write lock says so, and a connection
 * about to begin a write transaction lets such a waiter go first, for a
 * bounded time. Used by sqlite.c alone.
 */
#ifndef JSD_STORE_XTURN_H
#define JSD_STORE_XTURN_H

#include <stdbool.h>
#include <stdint.h>

/* The most a transaction's begin waits for another process's waiter: a
 * waiter retries the lock every 100 µs (sq_busy), so it takes the lock
 * within a few retries of the holder's commit; a waiter that does not (a
 * stopped process) costs each begin this much, never more. */
#define JSD__XTURN_YIELD_MAX_US 5000

/* Open (creating it if need be) the turn file of the database at db_path:
 * db_path with "-jsdturn" appended. -1 when it cannot be opened: the turn
 * across processes is then off for this connection, which only loses the
 * fairness it adds. */
int jsd__xturn_open(const char *db_path);

/* Say that this connection waits for the write lock (idempotent). */
void jsd__xturn_announce(int fd, bool *announced);

/* Stop saying it. */
void jsd__xturn_withdraw(int fd, bool *announced);

/* Before a write transaction begins: wait while another connection (of any
 * process) says it waits, at most JSD__XTURN_YIELD_MAX_US. Returns whether
 * it found one (and so waited). */
bool jsd__xturn_yield(int fd);

#endif
