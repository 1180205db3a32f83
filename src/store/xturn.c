/*
 * The writer turn across processes on one SQLite file.
 *
 * DESIGN. SQLite's write lock is not a queue, and a connection that finds
 * it held retries (sq_busy, every 100 µs). Within one process the writer
 * turn of sqlite.c (turn_take) queues write transactions in order; across
 * processes nothing did, so an application process that commits back to
 * back (each commit holds the lock through its fsync, and its next BEGIN
 * comes microseconds after) took the lock again before the relay's next
 * retry, and the relay's claim waited until the application paused:
 * relay.latency.xproc (commits at 1k/s from another process) had a p99 of
 * 10-280 ms against 2-4 ms in one process (docs/PERFORMANCE.md).
 *
 * So a connection that waits for the write lock says so, and a connection
 * about to begin a write transaction first lets such a waiter go:
 * - saying so is an open-file-description read lock on byte 0 of a turn
 *   file beside the database ("<db>-jsdturn", created empty with the
 *   database file's permissions), taken when the BEGIN's first attempt
 *   finds the lock held, dropped when the BEGIN returns; read locks do not
 *   exclude each other, so several waiters can say it at once, and the
 *   kernel drops the lock of a process that dies;
 * - letting it go is asking the kernel whether byte 0 could be write-locked
 *   (F_OFD_GETLK, one system call, ~1 µs) before BEGIN IMMEDIATE, and while
 *   someone says it waits, sleeping 50 µs and asking again, for at most
 *   JSD__XTURN_YIELD_MAX_US (5 ms). A waiter still waiting then (stopped by
 *   SIGSTOP or a debugger, or kept out by a third connection's long
 *   transaction) is not waited for again by this connection for
 *   JSD__XTURN_DEAF_US (1 s): a stopped waiter costs each connection one
 *   bounded wait a second, and nothing ever waits on it for good.
 * It is fairness only: the write lock is still SQLite's, and a connection
 * whose turn file cannot be opened (a read-only folder for it) simply does
 * not take part. Only jsdurable's own connections take part; a foreign
 * writer of the SQL contract meets SQLite's lock as before.
 *
 * OFD locks, not the classic fcntl locks: closing any descriptor of a file
 * drops every classic lock the process holds on it, and OFD locks belong to
 * the open file description alone. The turn file is a file of its own, not
 * a byte of the database or of its -shm file, because SQLite holds classic
 * locks on those, and a descriptor we closed there would drop them.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "jsd_int.h"
#include "store/xturn.h"

#define SUFFIX "-jsdturn"

void jsd__xturn_open(jsd__xturn *t, const char *db_path)
{
    *t = (jsd__xturn){.fd = -1};
    if (!db_path || !*db_path || strcmp(db_path, ":memory:") == 0)
        return;
    size_t cap = strlen(db_path) + sizeof(SUFFIX);
    char *p = jsd__malloc(cap);
    if (!p || !jsd__snprintf(p, cap, "%s" SUFFIX, db_path)) {
        jsd__free(p);
        t->open_errno = ENOMEM;
        return;
    }
    struct stat st;
    mode_t mode = stat(db_path, &st) == 0 ? (st.st_mode & 0666) : 0600;
    t->fd = open(p, O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, mode);
    t->open_errno = t->fd < 0 ? errno : 0;
    jsd__free(p);
}

void jsd__xturn_close(jsd__xturn *t)
{
    if (t->fd >= 0)
        close(t->fd);
    t->fd = -1;
    t->announced = false;
}

/* F_OFD_SETLK of type on byte 0: 0 or -1; F_OFD_GETLK: the type of a lock
 * that would conflict with type (F_UNLCK: none), or -1. */
static int lock_byte0(int fd, int cmd, short type)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    if (fcntl(fd, cmd, &fl) != 0)
        return -1;
    return cmd == F_OFD_GETLK ? fl.l_type : 0;
}

void jsd__xturn_announce(jsd__xturn *t)
{
    if (t->fd >= 0 && !t->announced && lock_byte0(t->fd, F_OFD_SETLK, F_RDLCK) == 0)
        t->announced = true;
}

void jsd__xturn_withdraw(jsd__xturn *t)
{
    if (t->announced) {
        lock_byte0(t->fd, F_OFD_SETLK, F_UNLCK);
        t->announced = false;
    }
}

void jsd__xturn_yield(jsd__xturn *t)
{
    if (t->fd < 0 || (t->deaf_until_us > 0 && jsd__mono_us() < t->deaf_until_us))
        return;
    int64_t until = 0;
    for (;;) {
        int type = lock_byte0(t->fd, F_OFD_GETLK, F_WRLCK);
        if (type == F_UNLCK || type < 0)
            return;
        int64_t now = jsd__mono_us();
        if (until == 0) {
            until = now + JSD__XTURN_YIELD_MAX_US;
            t->yields++;
        } else if (now >= until) {
            t->deaf_until_us = now + JSD__XTURN_DEAF_US;
            return;
        }
        struct timespec ts = {0, 50000L};
        nanosleep(&ts, NULL);
    }
}
