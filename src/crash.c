/*
 * Crash points (FIX-3): JSD_CRASH_AT="<point>:<n>" makes the process SIGKILL
 * itself the n-th time it reaches the named point, so a test can prove what
 * survives a crash exactly there. Compiled into every build; inert unless the
 * variable is set (the first call reads it once).
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jsd_int.h"

static pthread_once_t crash_once = PTHREAD_ONCE_INIT;
static char crash_name[128];
static atomic_long crash_left = 0; /* 0: inert */

static void crash_init(void)
{
    const char *e = getenv("JSD_CRASH_AT");
    if (!e || !*e)
        return;
    const char *colon = strrchr(e, ':');
    int64_t n = 1;
    size_t len = colon ? (size_t)(colon - e) : strlen(e);
    if (colon && !jsd__parse_i64(colon + 1, 1, INT32_MAX, &n))
        return;
    if (len == 0 || len >= sizeof(crash_name))
        return;
    memcpy(crash_name, e, len);
    crash_name[len] = '\0';
    atomic_store(&crash_left, (long)n);
}

bool jsd__crash_armed(const char *point)
{
    pthread_once(&crash_once, crash_init);
    return atomic_load_explicit(&crash_left, memory_order_relaxed) > 0 &&
           strcmp(point, crash_name) == 0;
}

void jsd__crash_point(const char *point)
{
    pthread_once(&crash_once, crash_init);
    if (atomic_load_explicit(&crash_left, memory_order_relaxed) <= 0)
        return;
    if (strcmp(point, crash_name) != 0)
        return;
    if (atomic_fetch_sub(&crash_left, 1) == 1) {
        /* Say where we die, so a test log shows it; then die for real. */
        char line[200];
        int len =
            snprintf(line, sizeof(line), "jsdurable: crash point %s reached, SIGKILL\n", point);
        if (len > 0)
            (void)!write(2, line, (size_t)JSD_MIN(len, (int)sizeof(line) - 1));
        kill(getpid(), SIGKILL);
        pause();
    }
}
