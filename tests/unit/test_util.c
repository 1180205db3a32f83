/*
 * The internal clock helpers: the one monotonic timed wait times out no
 * sooner than asked, returns at once for a past deadline, and wakes when
 * signalled. And jsd__read_file: a file whole across its buffer's growth, up
 * to its limit and not a byte more.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>

#include "jsd_int.h"
#include "test.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static atomic_bool flag;

static void times_out_no_sooner_than_asked(void **state)
{
    (void)state;
    ASSERT_EQ(jsd__cond_init_mono(&cv), 0);
    pthread_mutex_lock(&mu);
    int64_t t0 = jsd__mono_ms();
    bool woken = false;
    /* a spurious wake-up may return early: wait out the deadline as callers do */
    int64_t end = t0 + 30;
    while (jsd__mono_ms() < end)
        woken = jsd__cond_wait_until_ms(&cv, &mu, end) || woken;
    ASSERT_TRUE(jsd__mono_ms() - t0 >= 30);
    ASSERT_TRUE(!jsd__cond_wait_ms(&cv, &mu, 0));
    ASSERT_TRUE(!jsd__cond_wait_until_ms(&cv, &mu, jsd__mono_ms() - 1));
    pthread_mutex_unlock(&mu);
    pthread_cond_destroy(&cv);
    (void)woken;
}

static void *signaller(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    atomic_store(&flag, true);
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    return NULL;
}

static void wakes_when_signalled(void **state)
{
    (void)state;
    ASSERT_EQ(jsd__cond_init_mono(&cv), 0);
    atomic_store(&flag, false);
    pthread_mutex_lock(&mu);
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, signaller, NULL), 0);
    int64_t end = jsd__mono_ms() + 60000;
    while (!atomic_load(&flag) && jsd__mono_ms() < end)
        jsd__cond_wait_until_ms(&cv, &mu, end);
    pthread_mutex_unlock(&mu);
    pthread_join(th, NULL);
    ASSERT_TRUE(atomic_load(&flag));
    pthread_cond_destroy(&cv);
}

/* 10 000 bytes (the buffer grows twice), read at a limit of exactly that;
 * one byte less is EFBIG, a missing file fopen's ENOENT. */
static void reads_a_file_whole_up_to_its_limit(void **state)
{
    (void)state;
    char path[512];
    size_t len = 0;
    snprintf(path, sizeof(path), "%s/whole.txt", jsd_test_dir());
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    for (int i = 0; i < 10000; i++)
        fputc('a' + i % 26, f);
    ASSERT_EQ(fclose(f), 0);
    char *t = jsd__read_file(path, 10000, &len);
    ASSERT_TRUE(t != NULL);
    ASSERT_EQ(len, 10000);
    ASSERT_EQ(strlen(t), 10000);
    ASSERT_EQ(t[9999], 'a' + 9999 % 26);
    jsd__free(t);
    errno = 0;
    ASSERT_TRUE(jsd__read_file(path, 9999, &len) == NULL);
    ASSERT_EQ(errno, EFBIG);
    snprintf(path, sizeof(path), "%s/missing.txt", jsd_test_dir());
    ASSERT_TRUE(jsd__read_file(path, 10000, &len) == NULL);
    ASSERT_EQ(errno, ENOENT);
}

JSD_TEST_MAIN(cmocka_unit_test(times_out_no_sooner_than_asked),
              cmocka_unit_test(wakes_when_signalled),
              cmocka_unit_test(reads_a_file_whole_up_to_its_limit))
