/*
 * Starting and steering the fault proxy from a test (see proxy.h): fork/exec
 * of $BUILD/tests/tools/faultproxy with its stdout on a pipe (it announces
 * PORT= and CONTROL=), a kept-open control connection for synchronous mode
 * switches, and an atexit handler that stops every proxy this process
 * started.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"
#include "proxy.h"
#include "test.h"

#define PROXY_MAX 32

static pid_t started[PROXY_MAX];
static int n_started;
static pid_t owner;
static int seq;

static void stop_pid(pid_t pid)
{
    if (pid <= 0 || waitpid(pid, NULL, WNOHANG) != 0)
        return; /* reaped already, or not our child */
    kill(pid, SIGCONT);
    kill(pid, SIGTERM);
    int64_t end = jsd_test_mono_ms() + 3000;
    while (jsd_test_mono_ms() < end) {
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return;
        jsd_test_sleep_ms(5);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static void proxy_cleanup(void)
{
    if (owner != getpid())
        return;
    for (int i = 0; i < n_started; i++)
        stop_pid(started[i]);
    n_started = 0;
}

static void remember(pid_t pid)
{
    if (owner != getpid()) {
        owner = getpid();
        n_started = 0;
        atexit(proxy_cleanup);
    }
    if (n_started < PROXY_MAX)
        started[n_started++] = pid;
}

/* Read one '\n'-terminated line from fd within deadline_ms; 0 on success. */
static int read_line(int fd, char *line, size_t cap, int deadline_ms)
{
    size_t used = 0;
    int64_t end = jsd_test_mono_ms() + deadline_ms;
    while (used + 1 < cap) {
        int left = (int)(end - jsd_test_mono_ms());
        if (left <= 0)
            return -1;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int pr = poll(&pfd, 1, left);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            return -1;
        char ch;
        ssize_t n = read(fd, &ch, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        if (ch == '\n') {
            line[used] = '\0';
            return 0;
        }
        line[used++] = ch;
    }
    return -1;
}

static void log_tail(const jsd_fx_proxy *p, char *out, size_t cap)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/proxy.log", p->dir);
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    fclose(f);
}

static int parse_int(const char *s, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v <= 0 || v > 65535)
        return -1;
    *out = (int)v;
    return 0;
}

int jsd_fx_proxy_start(int upstream_port, const char *mode, jsd_fx_proxy *out)
{
    char upstream[32], ctl_path[PATH_MAX], log_path[PATH_MAX], pid_path[PATH_MAX];
    char line[128], tail[4096];
    memset(out, 0, sizeof(*out));
    out->ctl_fd = -1;
    snprintf(out->dir, sizeof(out->dir), "%s/proxy-%d", jsd_test_dir(), ++seq);
    if (mkdir(out->dir, 0755) != 0 && errno != EEXIST)
        fail_msg("cannot create %s: %s", out->dir, strerror(errno));
    snprintf(upstream, sizeof(upstream), "127.0.0.1:%d", upstream_port);
    snprintf(ctl_path, sizeof(ctl_path), "%s/control", out->dir);
    snprintf(log_path, sizeof(log_path), "%s/proxy.log", out->dir);
    snprintf(pid_path, sizeof(pid_path), "%s/faultproxy.pid", out->dir);
    const char *bin = jsd_fx_bin("faultproxy");
    if (access(bin, X_OK) != 0)
        fail_msg("fault proxy %s not built (make tests BUILD=...)", bin);

    int pfd[2];
    if (pipe(pfd) != 0)
        fail_msg("pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0)
        fail_msg("fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int lfd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(pfd[1], 1);
        if (lfd >= 0)
            dup2(lfd, 2);
        close(pfd[0]);
        execl(bin, "faultproxy", "--listen", "127.0.0.1:0", "--upstream", upstream, "--mode",
              mode ? mode : "pass", "--control-file", ctl_path, (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    remember(pid);
    out->pid = pid;
    FILE *pf = fopen(pid_path, "w");
    if (pf) {
        fprintf(pf, "%ld\n", (long)pid);
        fclose(pf);
    }
    for (int i = 0; i < 2; i++) {
        if (read_line(pfd[0], line, sizeof(line), 5000) != 0) {
            close(pfd[0]);
            log_tail(out, tail, sizeof(tail));
            fail_msg("faultproxy did not announce its ports:\n%s", tail);
            return -1;
        }
        if (!strncmp(line, "PORT=", 5))
            parse_int(line + 5, &out->port);
        else if (!strncmp(line, "CONTROL=", 8))
            parse_int(line + 8, &out->control_port);
    }
    close(pfd[0]);
    if (!out->port || !out->control_port)
        fail_msg("faultproxy announced no usable ports");
    snprintf(out->url, sizeof(out->url), "nats://127.0.0.1:%d", out->port);

    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)out->control_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        if (fd >= 0)
            close(fd);
        fail_msg("cannot reach the faultproxy control port %d", out->control_port);
        return -1;
    }
    out->ctl_fd = fd;
    return 0;
}

bool jsd_fx_proxy_alive(const jsd_fx_proxy *p)
{
    if (p->pid <= 0)
        return false;
    int st;
    return waitpid(p->pid, &st, WNOHANG) == 0;
}

static int proxy_command(jsd_fx_proxy *p, const char *cmd, char *reply, size_t cap)
{
    char line[160];
    if (!jsd_fx_proxy_alive(p) || p->ctl_fd < 0) {
        fail_msg("faultproxy pid %ld is not running; cannot send \"%s\"", (long)p->pid, cmd);
        return -1;
    }
    int n = snprintf(line, sizeof(line), "%s\n", cmd);
    if (n < 0 || (size_t)n >= sizeof(line) || write(p->ctl_fd, line, (size_t)n) != n) {
        fail_msg("cannot send \"%s\" to faultproxy", cmd);
        return -1;
    }
    if (read_line(p->ctl_fd, reply, cap, 5000) != 0) {
        fail_msg("faultproxy did not answer \"%s\"", cmd);
        return -1;
    }
    if (strncmp(reply, "OK", 2) != 0) {
        fail_msg("faultproxy refused \"%s\": %s", cmd, reply);
        return -1;
    }
    return 0;
}

int jsd_fx_proxy_mode(jsd_fx_proxy *p, const char *mode)
{
    char cmd[128], reply[256];
    snprintf(cmd, sizeof(cmd), "mode %s", mode);
    return proxy_command(p, cmd, reply, sizeof(reply));
}

int jsd_fx_proxy_cut(jsd_fx_proxy *p)
{
    char reply[256];
    return proxy_command(p, "cut", reply, sizeof(reply));
}

static uint64_t field_u64(const char *reply, const char *key)
{
    const char *f = strstr(reply, key);
    if (!f)
        return 0;
    return strtoull(f + strlen(key), NULL, 10);
}

int jsd_fx_proxy_stats_get(jsd_fx_proxy *p, jsd_fx_proxy_stats *st)
{
    char reply[256];
    memset(st, 0, sizeof(*st));
    if (proxy_command(p, "stats", reply, sizeof(reply)) != 0)
        return -1;
    const char *m = strstr(reply, "mode=");
    if (m)
        snprintf(st->mode, sizeof(st->mode), "%.*s", (int)strcspn(m + 5, " "), m + 5);
    st->conns = (int)field_u64(reply, " conns=");
    st->accepted = field_u64(reply, " accepted=");
    st->dropped_acks = field_u64(reply, " dropped_acks=");
    st->c2s = field_u64(reply, " c2s=");
    st->s2c = field_u64(reply, " s2c=");
    return 0;
}

uint64_t jsd_fx_proxy_dropped_acks(jsd_fx_proxy *p)
{
    jsd_fx_proxy_stats st;
    if (jsd_fx_proxy_stats_get(p, &st) != 0)
        return UINT64_MAX;
    return st.dropped_acks;
}

int jsd_fx_proxy_stop(jsd_fx_proxy *p)
{
    if (p->ctl_fd >= 0)
        close(p->ctl_fd);
    p->ctl_fd = -1;
    stop_pid(p->pid);
    for (int i = 0; i < n_started; i++)
        if (started[i] == p->pid)
            started[i] = 0;
    p->pid = 0;
    return 0;
}
