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
 *   JSD__XTURN_YIELD_MAX_US: a waiter that stopped (SIGSTOP, a debugger)
 *   costs each begin that much, and nothing ever waits on it for good.
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
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "jsd_int.h"
#include "store/xturn.h"

#define SUFFIX "-jsdturn"

int jsd__xturn_open(const char *db_path)
{
    if (!db_path || !*db_path || strcmp(db_path, ":memory:") == 0)
        return -1;
    size_t n = strlen(db_path);
    char *p = jsd__malloc(n + sizeof(SUFFIX));
    if (!p)
        return -1;
    memcpy(p, db_path, n);
    memcpy(p + n, SUFFIX, sizeof(SUFFIX));
    struct stat st;
    mode_t mode = stat(db_path, &st) == 0 ? (st.st_mode & 0666) : 0600;
    int fd = open(p, O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, mode);
    jsd__free(p);
    return fd;
}

static int lock_byte0(int fd, int cmd, short type)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    return fcntl(fd, cmd, &fl) == 0 ? (cmd == F_OFD_GETLK ? fl.l_type : 0) : -1;
}

void jsd__xturn_announce(int fd, bool *announced)
{
    if (fd >= 0 && !*announced && lock_byte0(fd, F_OFD_SETLK, F_RDLCK) == 0)
        *announced = true;
}

void jsd__xturn_withdraw(int fd, bool *announced)
{
    if (*announced) {
        lock_byte0(fd, F_OFD_SETLK, F_UNLCK);
        *announced = false;
    }
}

bool jsd__xturn_yield(int fd)
{
    if (fd < 0)
        return false;
    int64_t until = 0;
    for (;;) {
        int t = lock_byte0(fd, F_OFD_GETLK, F_WRLCK);
        if (t == F_UNLCK || t < 0)
            return until != 0;
        int64_t now = jsd__mono_us();
        if (until == 0)
            until = now + JSD__XTURN_YIELD_MAX_US;
        else if (now >= until)
            return true;
        struct timespec ts = {0, 50000L};
        nanosleep(&ts, NULL);
    }
}
