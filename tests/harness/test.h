/*
 * The test harness: cmocka for assertions and running, plus the project's own
 * assertion macros that print both sides and the handle's error text, and a
 * deadline-bounded wait for conditions (no sleep-and-hope).
 *
 * A test file ends with JSD_TEST_MAIN(cmocka_unit_test(a), ...). The binary
 * lists its cases with --list and runs one case when given its name;
 * scripts/run-tests.sh runs every case in its own process.
 */
#ifndef JSD_TEST_H
#define JSD_TEST_H

#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include <cmocka.h>

#ifdef __clang_analyzer__
/* cmocka's _fail never returns (it longjmps out of the test or exits), but it
 * is not declared so; telling the analyzer lets clang-tidy follow an ASSERT_*
 * as the end of the path instead of reporting what happens after it. No effect
 * on the compiled tests. */
void _fail(const char *const file, const int line) __attribute__((noreturn));
#endif

#include "jsdurable.h"

int jsd_test_main(int argc, char **argv, const struct CMUnitTest *tests, size_t n,
                  const char *file);

#define JSD_TEST_MAIN(...)                                                                         \
    int main(int argc, char **argv)                                                                \
    {                                                                                              \
        const struct CMUnitTest jsd__tests[] = {__VA_ARGS__};                                      \
        return jsd_test_main(argc, argv, jsd__tests, sizeof(jsd__tests) / sizeof(jsd__tests[0]),   \
                             __FILE__);                                                            \
    }

/* `expr` must return JSD_OK; on failure prints the status name and, when
 * given, the error text: ASSERT_OK(expr) or ASSERT_OK(expr, errtext), where
 * errtext is the handle's last error (jsd_store_errmsg(s), err.msg, ...). The
 * text is evaluated only after expr has failed, so it reads the error that
 * call left. ASSERT_OK_E(expr, errtext) is the same as the two-argument form. */
#define ASSERT_OK(...)                                                                             \
    JSD__ASSERT_OK_PICK(__VA_ARGS__, ASSERT_OK_E, JSD__ASSERT_OK_1, -)(__VA_ARGS__)
#define JSD__ASSERT_OK_PICK(a, b, name, ...) name

#define JSD__ASSERT_OK_1(expr)                                                                     \
    do {                                                                                           \
        jsd_status jsd__s = (expr);                                                                \
        if (jsd__s != JSD_OK)                                                                      \
            fail_msg("`%s` returned %s, expected JSD_OK", #expr, jsd_status_name(jsd__s));         \
    } while (0)

#define ASSERT_OK_E(expr, errtext)                                                                 \
    do {                                                                                           \
        jsd_status jsd__s = (expr);                                                                \
        if (jsd__s != JSD_OK) {                                                                    \
            const char *jsd__t = (errtext);                                                        \
            fail_msg("`%s` returned %s, expected JSD_OK: %s", #expr, jsd_status_name(jsd__s),      \
                     jsd__t ? jsd__t : "(no error text)");                                         \
        }                                                                                          \
    } while (0)

#define ASSERT_STATUS(expr, want)                                                                  \
    do {                                                                                           \
        jsd_status jsd__s = (expr), jsd__w = (want);                                               \
        if (jsd__s != jsd__w)                                                                      \
            fail_msg("`%s` returned %s, expected %s", #expr, jsd_status_name(jsd__s),              \
                     jsd_status_name(jsd__w));                                                     \
    } while (0)

#define ASSERT_EQ(a, b)                                                                            \
    do {                                                                                           \
        long long jsd__a = (long long)(a), jsd__b = (long long)(b);                                \
        if (jsd__a != jsd__b)                                                                      \
            fail_msg("`%s == %s` (%lld == %lld)", #a, #b, jsd__a, jsd__b);                         \
    } while (0)

#define ASSERT_NE(a, b)                                                                            \
    do {                                                                                           \
        long long jsd__a = (long long)(a), jsd__b = (long long)(b);                                \
        if (jsd__a == jsd__b)                                                                      \
            fail_msg("`%s != %s` (%lld != %lld)", #a, #b, jsd__a, jsd__b);                         \
    } while (0)

#define ASSERT_LE(a, b)                                                                            \
    do {                                                                                           \
        long long jsd__a = (long long)(a), jsd__b = (long long)(b);                                \
        if (!(jsd__a <= jsd__b))                                                                   \
            fail_msg("`%s <= %s` (%lld <= %lld)", #a, #b, jsd__a, jsd__b);                         \
    } while (0)

/* Typed comparisons: the operands are converted to the named type (no cast,
 * so passing a pointer or a struct is a compile error, not a silent
 * truncation) and printed with that type's format. Use them for uint64_t
 * sequences and counters (ASSERT_EQ goes through long long, which turns values
 * above INT64_MAX negative), int64_t times, size_t lengths and pointers. */
#define JSD__ASSERT_TYPED(type, fmt, a, op, b)                                                     \
    do {                                                                                           \
        type jsd__a = (a);                                                                         \
        type jsd__b = (b);                                                                         \
        if (!(jsd__a op jsd__b))                                                                   \
            fail_msg("`%s " #op " %s` (" fmt " " #op " " fmt ")", #a, #b, jsd__a, jsd__b);         \
    } while (0)
#define ASSERT_U64_EQ(a, b)  JSD__ASSERT_TYPED(uint64_t, "%" PRIu64, a, ==, b)
#define ASSERT_U64_NE(a, b)  JSD__ASSERT_TYPED(uint64_t, "%" PRIu64, a, !=, b)
#define ASSERT_U64_LE(a, b)  JSD__ASSERT_TYPED(uint64_t, "%" PRIu64, a, <=, b)
#define ASSERT_I64_EQ(a, b)  JSD__ASSERT_TYPED(int64_t, "%" PRId64, a, ==, b)
#define ASSERT_I64_LE(a, b)  JSD__ASSERT_TYPED(int64_t, "%" PRId64, a, <=, b)
#define ASSERT_SIZE_EQ(a, b) JSD__ASSERT_TYPED(size_t, "%zu", a, ==, b)
#define ASSERT_SIZE_LE(a, b) JSD__ASSERT_TYPED(size_t, "%zu", a, <=, b)
#define ASSERT_PTR_EQ(a, b)  JSD__ASSERT_TYPED(const void *, "%p", a, ==, b)
#define ASSERT_PTR_NE(a, b)  JSD__ASSERT_TYPED(const void *, "%p", a, !=, b)

#define ASSERT_TRUE(c)                                                                             \
    do {                                                                                           \
        if (!(c))                                                                                  \
            fail_msg("`%s` is false", #c);                                                         \
    } while (0)

#define ASSERT_STREQ(a, b)                                                                         \
    do {                                                                                           \
        const char *jsd__a = (a), *jsd__b = (b);                                                   \
        if (!jsd__a || !jsd__b || strcmp(jsd__a, jsd__b) != 0)                                     \
            fail_msg("`%s == %s` (\"%s\" == \"%s\")", #a, #b, jsd__a ? jsd__a : "(null)",          \
                     jsd__b ? jsd__b : "(null)");                                                  \
    } while (0)

/* haystack contains needle */
#define ASSERT_CONTAINS(hay, needle)                                                               \
    do {                                                                                           \
        const char *jsd__h = (hay), *jsd__n = (needle);                                            \
        if (!jsd__h || !jsd__n || !strstr(jsd__h, jsd__n))                                         \
            fail_msg("`%s` (\"%s\") does not contain \"%s\"", #hay, jsd__h ? jsd__h : "(null)",    \
                     jsd__n ? jsd__n : "(null)");                                                  \
    } while (0)

#define ASSERT_NOT_CONTAINS(hay, needle)                                                           \
    do {                                                                                           \
        const char *jsd__h = (hay), *jsd__n = (needle);                                            \
        if (jsd__h && jsd__n && strstr(jsd__h, jsd__n))                                            \
            fail_msg("`%s` contains \"%s\" and must not", #hay, jsd__n);                           \
    } while (0)

/* Poll `cond` every few ms until it holds or deadline_ms passes; true if it
 * held. Use for conditions that become true asynchronously. */
int64_t jsd_test_mono_ms(void);
void jsd_test_sleep_ms(int64_t ms);
#define WAIT_UNTIL(cond, deadline_ms)                                                              \
    ({                                                                                             \
        int64_t jsd__end = jsd_test_mono_ms() + (deadline_ms);                                     \
        bool jsd__ok;                                                                              \
        while (!(jsd__ok = (cond)) && jsd_test_mono_ms() < jsd__end)                               \
            jsd_test_sleep_ms(5);                                                                  \
        jsd__ok;                                                                                   \
    })
#define ASSERT_WAIT(cond, deadline_ms)                                                             \
    do {                                                                                           \
        if (!WAIT_UNTIL(cond, deadline_ms))                                                        \
            fail_msg("`%s` still false after %d ms", #cond, (int)(deadline_ms));                   \
    } while (0)

/* A name unique to this test process: prefix + pid + counter, using only
 * [A-Za-z0-9_-] so it is a valid stream, consumer or subject token. */
const char *jsd_test_unique(const char *prefix);

/* Directory for this test's scratch files (created on first use, under
 * JSD_TEST_TMP; removed by the runner). */
const char *jsd_test_dir(void);

/* Run a shell command, capture stdout+stderr (bounded) into out; return the
 * exit status (-1 on a signal death). */
int jsd_test_run(const char *cmd, char *out, size_t cap);

/* Start argv[0] with argv as a child process whose stdout and stderr append
 * to log (truncated first when truncate is set), with JSD_CRASH_AT set to
 * crash_at when given and removed otherwise. Everything that allocates is
 * done before fork: the child of a threaded process (nats.c's threads) may
 * only make async-signal-safe calls (an allocator lock held by another
 * thread at the fork never opens in the child). Returns the pid; fails the
 * test when fork fails. */
pid_t jsd_test_spawn(const char *const argv[], const char *log, bool truncate,
                     const char *crash_at);

/* Mount a tmpfs of the given size ("4m") at the test's folder/name, unmounted
 * at exit; its path, or NULL (with a message; the caller skips) when mounting
 * is not permitted here. One at a time per test process. */
const char *jsd_test_mount_tmpfs(const char *name, const char *size);

/* true when the file at path exists and contains needle (a log line a
 * spawned process wrote, for ASSERT_WAIT). */
bool jsd_test_file_contains(const char *path, const char *needle);
/* How many lines of the file at path contain needle; -1 if it cannot be read. */
int jsd_test_file_lines(const char *path, const char *needle);

/* Skip the running case, printing its reason first ("skipped: REASON"),
 * which scripts/run-tests.sh shows beside the case: for a feature the
 * server under test lacks (the compatibility lane runs Debian 12's
 * nats-server 2.9.10). Never returns. */
void jsd_test_skip_because(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* true when a server version "MAJOR.MINOR.PATCH..." is at least major.minor
 * (false for NULL or an unreadable version). */
bool jsd_test_version_at_least(const char *version, int major, int minor);

/* The metrics port a spawned jsdurable process logged ("metrics on ...
 * (port N)") in the file at path; 0 until it is written. */
int jsd_test_metrics_port(const char *path);

/* GET path from 127.0.0.1:port over HTTP/1.0: the whole response (status
 * line, headers, body; at most 128 KiB) in a buffer of the harness's, valid
 * until the next call, or NULL when the connection fails. */
const char *jsd_test_http_get(int port, const char *path);

/* How many times needle occurs in text (non-overlapping). */
int jsd_test_count(const char *text, const char *needle);

/* Wait for a child process of this test (retrying on EINTR) and return its
 * wait status; fails the test if it cannot be waited for. */
int jsd_test_child_wait(int pid);
/* Wait for a child and fail the test, naming `what` and how it ended, unless
 * it exited with status 0. */
void jsd_test_child_ok(int pid, const char *what);

/* Allocation-failure sweep: run this test binary's case `child_case` with
 * JSD_FAIL_ALLOC_AFTER=0, 1, 2, ... (at most max_runs times). Every run must
 * exit 0 and print "status=JSD_ERR_NOMEM", until one prints "status=JSD_OK";
 * fails the test otherwise. `what` names the code under test in the message. */
void jsd_test_alloc_failures(const char *child_case, int max_runs, const char *what);

#endif
