/*
 * The README's "CLI in five minutes" block, run as written: the test reads
 * the first ```sh block after that heading out of README.md and runs it with
 * bash -e from the project's folder, so a walkthrough that no longer works
 * (a binary not on PATH, a table never created, a path relative to the
 * wrong folder) fails here. The one change made to the text: the server
 * port 4222 becomes a free one, so the test never meets a server of the
 * machine's own; and under a build folder of the runner's own (BUILD, e.g.
 * make check-asan's build-asan) "$PWD/build" names that folder, so `make`
 * finds its build current and PATH its binaries. Afterwards the test checks,
 * from the scratch store the
 * block created, that the sink holds the two messages of ORDERS.
 */
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fixture.h"
#include "test.h"

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t len = sizeof(a);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* README.md's walkthrough block, malloc'd. */
static char *walkthrough(const char *top)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/README.md", top);
    FILE *f = fopen(path, "r");
    if (!f)
        fail_msg("cannot read %s", path);
    static char text[65536];
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *h = strstr(text, "\n## The CLI in five minutes\n");
    if (!h)
        fail_msg("README.md has no \"## The CLI in five minutes\" section");
    const char *start = strstr(h, "\n```sh\n");
    const char *next_section = strstr(h + 1, "\n## ");
    if (!start || (next_section && start > next_section))
        fail_msg("the walkthrough section has no ```sh block");
    start += strlen("\n```sh\n");
    const char *end = strstr(start, "\n```");
    if (!end)
        fail_msg("the walkthrough's ```sh block does not end");
    return strndup(start, (size_t)(end - start) + 1);
}

/* s with every "4222" replaced by port, malloc'd. */
static char *with_port(const char *s, int port)
{
    char p[16];
    snprintf(p, sizeof(p), "%d", port);
    size_t n = 0;
    for (const char *q = strstr(s, "4222"); q; q = strstr(q + 4, "4222"))
        n++;
    char *out = malloc(strlen(s) + n * strlen(p) + 1), *o = out;
    assert_non_null(out);
    for (const char *q; (q = strstr(s, "4222")) != NULL; s = q + 4) {
        memcpy(o, s, (size_t)(q - s));
        o += q - s;
        memcpy(o, p, strlen(p));
        o += strlen(p);
    }
    memcpy(o, s, strlen(s) + 1);
    return out;
}

static void walkthrough_runs_as_written(void **state)
{
    (void)state;
    const char *top = getenv("JSD_TOP") ? getenv("JSD_TOP") : ".";
    char *block = walkthrough(top);
    ASSERT_CONTAINS(block, "4222");
    char *script = with_port(block, free_port());
    const char *build = getenv("BUILD");
    if (build && *build && strcmp(build, "build") != 0) {
        char from[] = "$PWD/build:", to[PATH_MAX + 8];
        snprintf(to, sizeof(to), "%s%s:", build[0] == '/' ? "" : "$PWD/", build);
        char *p = strstr(script, from);
        if (p) {
            size_t head = (size_t)(p - script), tail = strlen(p + strlen(from));
            char *re = malloc(head + strlen(to) + tail + 1);
            assert_non_null(re);
            memcpy(re, script, head);
            memcpy(re + head, to, strlen(to));
            memcpy(re + head + strlen(to), p + strlen(from), tail + 1);
            free(script);
            script = re;
        }
    }
    char path[1024];
    snprintf(path, sizeof(path), "%s/walkthrough.sh", jsd_test_dir());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    /* Stop whatever the block left running in the background, even when it
     * fails half way; then report what the scratch store holds. */
    fprintf(
        f,
        "set -eu\n"
        "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n"
        "%s"
        "echo \"README-CHECK audit=$(sqlite3 app.db 'SELECT count(*) FROM audit') "
        "published=$(sqlite3 app.db 'SELECT count(*) FROM jsd_outbox_state WHERE published_at IS "
        "NOT NULL')\"\n",
        script);
    fclose(f);
    free(script);
    free(block);
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "cd '%s' && env -u JSD_STORE -u JSD_NATS_URL TMPDIR='%s' bash '%s'",
             top, jsd_test_dir(), path);
    static char out[262144];
    int rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 0)
        fail_msg("the README walkthrough exited %d:\n%s", rc, out);
    /* the effect and the direct publication, each applied once */
    ASSERT_CONTAINS(out, "README-CHECK audit=2 published=1");
}

JSD_TEST_MAIN(cmocka_unit_test(walkthrough_runs_as_written))
