/*
 * The harness's runner glue around cmocka (--list, run one case by name) and
 * small helpers shared by tests: monotonic clock, unique names, scratch
 * directory, running a command with its output captured.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

/* Every case ends as a process using the library should: after its last
 * close, jsd_conn_shutdown waits (up to 5 s) for nats.c's threads, so the
 * exit handlers never run under them (nats.c 3.4.1's exit race, src/conn.c:
 * test_conn/tls_with_token_connects passed, then died in glibc's heap check
 * about once in 30 runs without it). */
static int jsd_test_exit(int rc)
{
    (void)jsd_conn_shutdown(5000);
    return rc;
}

int jsd_test_main(int argc, char **argv, const struct CMUnitTest *tests, size_t n, const char *file)
{
    if (argc > 1 && !strcmp(argv[1], "--list")) {
        for (size_t i = 0; i < n; i++)
            printf("%s\n", tests[i].name);
        return 0;
    }
    if (argc > 1) {
        size_t i;
        for (i = 0; i < n && strcmp(tests[i].name, argv[1]) != 0; i++)
            ;
        if (i == n) {
            fprintf(stderr, "%s: no test named %s\n", file, argv[1]);
            return 2;
        }
        return jsd_test_exit(_cmocka_run_group_tests(argv[1], &tests[i], 1, NULL, NULL));
    }
    return jsd_test_exit(_cmocka_run_group_tests(file, tests, n, NULL, NULL));
}

int64_t jsd_test_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void jsd_test_sleep_ms(int64_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

const char *jsd_test_unique(const char *prefix)
{
    static char bufs[8][96];
    static unsigned counter;
    char *b = bufs[counter % 8];
    snprintf(b, sizeof(bufs[0]), "%s_%ld_%u", prefix, (long)getpid(), counter++);
    return b;
}

const char *jsd_test_dir(void)
{
    static char dir[512];
    if (dir[0])
        return dir;
    const char *base = getenv("JSD_TEST_TMP");
    if (!base || !*base)
        base = "/tmp";
    snprintf(dir, sizeof(dir), "%s/t-%ld", base, (long)getpid());
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        fail_msg("cannot create %s: %s", dir, strerror(errno));
    return dir;
}

int jsd_test_child_wait(int pid)
{
    int st = 0;
    pid_t r;
    while ((r = waitpid((pid_t)pid, &st, 0)) < 0 && errno == EINTR)
        ;
    if (r != (pid_t)pid)
        fail_msg("cannot wait for child %d: %s", pid, strerror(errno));
    return st;
}

void jsd_test_child_ok(int pid, const char *what)
{
    int st = jsd_test_child_wait(pid);
    if (WIFSIGNALED(st))
        fail_msg("%s (pid %d) was killed by signal %d", what, pid, WTERMSIG(st));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("%s (pid %d) exited with %d, expected 0", what, pid, WEXITSTATUS(st));
}

void jsd_test_alloc_failures(const char *child_case, int max_runs, const char *what)
{
    char self[512], cmd[700], out[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    ASSERT_TRUE(n > 0);
    self[n] = '\0';
    for (int k = 0; k < max_runs; k++) {
        snprintf(cmd, sizeof(cmd), "JSD_FAIL_ALLOC_AFTER=%d %s %s", k, self, child_case);
        int rc = jsd_test_run(cmd, out, sizeof(out));
        if (rc != 0)
            fail_msg("with JSD_FAIL_ALLOC_AFTER=%d %s failed (exit %d):\n%s", k, what, rc, out);
        if (strstr(out, "status=JSD_OK"))
            return;
        ASSERT_CONTAINS(out, "status=JSD_ERR_NOMEM");
    }
    fail_msg("%s still ran out of memory after %d allocations", what, max_runs);
}

extern char **environ;

pid_t jsd_test_spawn(const char *const argv[], const char *log, bool truncate, const char *crash_at)
{
    static const char key[] = "JSD_CRASH_AT=";
    size_t n = 0;
    while (environ[n])
        n++;
    char **envp = calloc(n + 2, sizeof(*envp));
    char *crash = NULL;
    assert_non_null(envp);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], key, sizeof(key) - 1) != 0)
            envp[k++] = environ[i];
    if (crash_at) {
        size_t len = sizeof(key) + strlen(crash_at);
        crash = malloc(len);
        assert_non_null(crash);
        snprintf(crash, len, "%s%s", key, crash_at);
        envp[k++] = crash;
    }
    envp[k] = NULL;
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        /* The child dies with the case: a case that fails an assertion
         * while its relay or consumer runs must not leave them running
         * past the suite (run-tests.sh sweeps fixtures only). */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | (truncate ? O_TRUNC : O_APPEND), 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execve(argv[0], (char *const *)argv, envp);
        _exit(127);
    }
    free(crash);
    free(envp);
    if (pid < 0)
        fail_msg("fork: %s", strerror(errno));
    return pid;
}

static char tmpfs_dir[512];

static void tmpfs_unmount_at_exit(void)
{
    if (tmpfs_dir[0])
        umount2(tmpfs_dir, MNT_DETACH);
}

const char *jsd_test_mount_tmpfs(const char *name, const char *size)
{
    if (snprintf(tmpfs_dir, sizeof(tmpfs_dir), "%s/%s", jsd_test_dir(), name) >=
        (int)sizeof(tmpfs_dir)) {
        print_message("tmpfs path %s/%s is too long\n", jsd_test_dir(), name);
        tmpfs_dir[0] = '\0';
        return NULL;
    }
    mkdir(tmpfs_dir, 0755);
    char opts[64];
    snprintf(opts, sizeof(opts), "size=%s,mode=0755", size);
    if (mount("tmpfs", tmpfs_dir, "tmpfs", 0, opts) != 0) {
        print_message("cannot mount a tmpfs at %s: %s\n", tmpfs_dir, strerror(errno));
        tmpfs_dir[0] = '\0';
        return NULL;
    }
    atexit(tmpfs_unmount_at_exit);
    return tmpfs_dir;
}

int jsd_test_file_lines(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char *line = NULL;
    size_t cap = 0;
    int n = 0;
    while (getline(&line, &cap, f) >= 0)
        n += strstr(line, needle) != NULL;
    free(line);
    fclose(f);
    return n;
}

bool jsd_test_file_contains(const char *path, const char *needle)
{
    return jsd_test_file_lines(path, needle) > 0;
}

int jsd_test_run(const char *cmd, char *out, size_t cap)
{
    char full[8192];
    int fl = snprintf(full, sizeof(full), "( %s ) 2>&1", cmd);
    if (fl < 0 || (size_t)fl >= sizeof(full))
        fail_msg("jsd_test_run: command of %zu bytes does not fit in %zu", strlen(cmd),
                 sizeof(full));
    FILE *p = popen(full, "r"); /* the test's own command line, by design */
    if (!p)
        return -1;
    size_t used = 0;
    if (out && cap)
        out[0] = '\0';
    char chunk[4096];
    size_t got;
    while ((got = fread(chunk, 1, sizeof(chunk), p)) > 0) {
        if (out && used + 1 < cap) {
            size_t take = got < cap - 1 - used ? got : cap - 1 - used;
            memcpy(out + used, chunk, take);
            used += take;
            out[used] = '\0';
        }
    }
    int st = pclose(p);
    if (st == -1)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void jsd_test_skip_because(const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    print_message("skipped: %s\n", why);
    skip();
    abort(); /* skip() longjmps out of the case */
}

bool jsd_test_version_at_least(const char *version, int major, int minor)
{
    int ma = 0, mi = 0;
    if (!version || sscanf(version, "%d.%d", &ma, &mi) != 2)
        return false;
    return ma > major || (ma == major && mi >= minor);
}

int jsd_test_metrics_port(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[2048];
    int port = 0;
    while (f && fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "(port ");
        if (p && strstr(line, "metrics on"))
            port = (int)strtol(p + 6, NULL, 10);
    }
    if (f)
        fclose(f);
    return port;
}

const char *jsd_test_http_get(int port, const char *path)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    static char body[131072];
    size_t used = 0;
    ssize_t n;
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    char req[256];
    int rl = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\n\r\n", path);
    if (rl < 0 || (size_t)rl >= sizeof(req) || write(fd, req, (size_t)rl) != (ssize_t)rl) {
        close(fd);
        return NULL;
    }
    while (used + 1 < sizeof(body) && (n = read(fd, body + used, sizeof(body) - 1 - used)) > 0)
        used += (size_t)n;
    body[used] = '\0';
    close(fd);
    return body;
}

int jsd_test_count(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}
