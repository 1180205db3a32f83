/*
 * The daemons' service plumbing (cli/service.h): one service thread takes the
 * stop and reload signals with sigtimedwait, so that nothing runs in a signal
 * handler, and speaks systemd's notification protocol through libsystemd.
 *
 * DESIGN. The signals are blocked before the first thread exists, so every
 * thread inherits the mask and only the service thread ever receives them. A
 * stop asks the library to stop (thread-safe calls) and arms a deadline; the
 * deadline covers the whole way out, the clean-up after the run included
 * (closing a NATS subscription or connection waits on a server that may be
 * paused). Missing the deadline ends the process with _exit: every step of
 * the relay and the consumer already survives a SIGKILL at any point (nothing
 * is ACKed before its commit, no receipt is written before its PubAck), so an
 * early exit loses nothing; leases expire and deliveries come again.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "service.h"

#define STOP_TIMEOUT_DEFAULT_MS 5000
#define WAIT_SLICE_MS           250

static struct {
    const char *cmd;
    bool token, password, creds, nkey; /* credentials in use, for SIGHUP */
    int64_t stop_timeout_ms;
    uint64_t watchdog_usec; /* 0: no watchdog */
    pthread_mutex_t mu;
    void (*stop)(void *arg);
    void *arg;
    bool stopping;
    int64_t stop_deadline_ms; /* monotonic; 0 until a stop signal */
    char log_path[4096];      /* stderr's file at start; "" when not a file */
} svc = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void stop_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGHUP);
}

/* The path of stderr's file at start, when stderr is a regular file
 * (`2>>relay.log`, systemd's StandardError=append:). Read at start: once the
 * file is renamed, /proc names the new name. */
static void remember_log_path(void)
{
    struct stat cur;
    svc.log_path[0] = '\0';
    if (fstat(STDERR_FILENO, &cur) != 0 || !S_ISREG(cur.st_mode))
        return;
    ssize_t n = readlink("/proc/self/fd/2", svc.log_path, sizeof(svc.log_path) - 1);
    svc.log_path[n > 0 ? n : 0] = '\0';
}

/* Open the log file's path again and put the new file on fd 2 when the path
 * now names another file (rotated away) or none (deleted). Describes what it
 * did. */
static void reopen_log(char *what, size_t cap)
{
    struct stat cur, now;
    const char *path = svc.log_path;
    if (!path[0] || fstat(STDERR_FILENO, &cur) != 0) {
        snprintf(what, cap, "logs go to a stream, not a file: nothing to reopen");
        return;
    }
    if (stat(path, &now) == 0 && now.st_dev == cur.st_dev && now.st_ino == cur.st_ino) {
        snprintf(what, cap, "log file %s not rotated: kept", path);
        return;
    }
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0) {
        snprintf(what, cap, "cannot reopen log file %s: %s (still writing to the old one)", path,
                 strerror(errno));
        return;
    }
    fflush(stderr);
    int rc = dup2(fd, STDERR_FILENO);
    close(fd);
    if (rc < 0)
        snprintf(what, cap, "cannot reopen log file %s: %s", path, strerror(errno));
    else
        snprintf(what, cap, "log file %s reopened", path);
}

static void on_hup(void)
{
    char logs[4400], creds[256] = "";
    reopen_log(logs, sizeof(logs));
    /* nats.c reads .creds and NKey seed files at every (re)connect; a token or
     * a password is handed over once, at start. */
    if (svc.creds || svc.nkey)
        snprintf(creds, sizeof(creds), "; the %s file is read afresh at every reconnect",
                 svc.creds ? "creds" : "NKey seed");
    else if (svc.token || svc.password)
        snprintf(creds, sizeof(creds),
                 "; the %s was read at start: restart the process to change it",
                 svc.token ? "token" : "password");
    jsd_log(JSD_LOG_INFO, svc.cmd, "SIGHUP received: %s%s; still running", logs, creds);
}

static void on_stop_signal(int sig)
{
    const char *name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
    /* stop() runs under the lock: cli_service_stopping, which takes it too,
     * cannot return (and the handle be destroyed) while stop() runs. */
    pthread_mutex_lock(&svc.mu);
    bool first = !svc.stopping, starting = first && !svc.stop;
    if (starting) {
        pthread_mutex_unlock(&svc.mu);
        /* Still starting: nothing to settle. Die by the signal, as without
         * this thread. */
        signal(sig, SIG_DFL);
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        pthread_sigmask(SIG_UNBLOCK, &one, NULL);
        raise(sig);
        _exit(128 + sig);
    }
    if (!svc.stop_deadline_ms) /* also a signal after the run returned */
        svc.stop_deadline_ms = mono_ms() + svc.stop_timeout_ms;
    svc.stopping = true;
    if (first) {
        sd_notify(0, "STOPPING=1");
        jsd_log(JSD_LOG_INFO, svc.cmd, "%s received: stopping gracefully (at most %lld ms)", name,
                (long long)svc.stop_timeout_ms);
        svc.stop(svc.arg);
    }
    pthread_mutex_unlock(&svc.mu);
    if (!first)
        jsd_log(JSD_LOG_INFO, svc.cmd, "%s received: already stopping", name);
}

static void *service_main(void *unused)
{
    (void)unused;
    sigset_t set;
    stop_signals(&set);
    int64_t next_ping = 0;
    for (;;) {
        int64_t now = mono_ms(), wait = WAIT_SLICE_MS;
        if (svc.watchdog_usec) {
            if (now >= next_ping) {
                sd_notify(0, "WATCHDOG=1");
                next_ping = now + (int64_t)(svc.watchdog_usec / 2000);
            }
            if (next_ping - now < wait)
                wait = next_ping - now;
        }
        pthread_mutex_lock(&svc.mu);
        int64_t deadline = svc.stop_deadline_ms;
        pthread_mutex_unlock(&svc.mu);
        if (deadline) {
            if (now >= deadline) {
                jsd_log(JSD_LOG_WARN, svc.cmd,
                        "graceful stop unfinished after %lld ms (NATS or the store is not "
                        "answering): exiting now; claimed effects are retried with the same ids "
                        "once their leases expire, unacknowledged deliveries come again",
                        (long long)svc.stop_timeout_ms);
                fflush(stdout);
                fflush(stderr);
                _exit(CLI_TEMPFAIL);
            }
            if (deadline - now < wait)
                wait = deadline - now;
        }
        struct timespec ts = {.tv_sec = wait / 1000, .tv_nsec = (long)(wait % 1000) * 1000000L};
        int sig = sigtimedwait(&set, NULL, &ts);
        if (sig == SIGHUP)
            on_hup();
        else if (sig == SIGTERM || sig == SIGINT)
            on_stop_signal(sig);
    }
    return NULL;
}

int cli_service_start(const char *cmd, const cli_conn *conn)
{
    svc.cmd = cmd;
    svc.stop_timeout_ms = STOP_TIMEOUT_DEFAULT_MS;
    const char *t = getenv("JSD_STOP_TIMEOUT_MS");
    long v;
    if (t && *t) {
        if (!cli_parse_long(t, 100, 3600000, &v)) {
            cli_err(cmd, "JSD_STOP_TIMEOUT_MS takes milliseconds from 100 to 3600000, not '%s'", t);
            return CLI_USAGE;
        }
        svc.stop_timeout_ms = v;
    }
    if (conn) {
        svc.token = conn->secret_token != NULL;
        svc.password = conn->secret_password != NULL;
        svc.creds = conn->opts.creds_file != NULL;
        svc.nkey = conn->opts.nkey_seed_file != NULL;
    }
    remember_log_path();
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0)
        svc.watchdog_usec = usec;

    sigset_t set;
    stop_signals(&set);
    if ((errno = pthread_sigmask(SIG_BLOCK, &set, NULL)) != 0) {
        cli_err(cmd, "cannot block signals: %s", strerror(errno));
        return CLI_SOFTWARE;
    }
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &attr, service_main, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        pthread_sigmask(SIG_UNBLOCK, &set, NULL);
        cli_err(cmd, "cannot start the signal thread: %s", strerror(rc));
        return CLI_SOFTWARE;
    }
    return 0;
}

void cli_service_ready(void (*stop)(void *arg), void *arg)
{
    pthread_mutex_lock(&svc.mu);
    svc.stop = stop;
    svc.arg = arg;
    pthread_mutex_unlock(&svc.mu);
    sd_notify(0, "READY=1");
}

void cli_service_stopping(void)
{
    pthread_mutex_lock(&svc.mu);
    bool sent = svc.stopping;
    svc.stopping = true;
    svc.stop = NULL; /* the handle is about to go: a late signal must not use it */
    pthread_mutex_unlock(&svc.mu);
    if (!sent)
        sd_notify(0, "STOPPING=1");
}
