/*
 * Unit tests for jsd__msg_free (src/conn.c): the relay and the consumer free
 * the nats.c messages they are done with at once, not through nats.c 3.4.1's
 * collector thread, whose wake-up natsMsg_Destroy pays for nearly every
 * message. No server is needed: the messages are made with natsMsg_Create.
 */
#include <malloc.h>
#include <stdlib.h>

#include "test.h"
#include "conn_int.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

#define BIG (4 << 20) /* above glibc's mmap threshold: its own mapping */

/* The libnats this was built against exports natsMsg_free; without it,
 * jsd__msg_free falls back to natsMsg_Destroy and the relay pays for the
 * collector's wake-ups again. */
static void this_libnats_frees_directly(void **state)
{
    (void)state;
    if (!jsd__msg_free_is_direct())
        fail_msg("libnats has no natsMsg_free: messages go through its collector thread");
}

/* A message is gone when jsd__msg_free returns: the memory glibc mapped for
 * it is unmapped by then, not later by another thread. */
static void a_message_is_freed_before_the_call_returns(void **state)
{
    (void)state;
    const char *p = getenv("LD_PRELOAD");
    if (SANITIZED || (p && strstr(p, "vgpreload"))) {
        skip(); /* their allocators keep their own books */
        return;
    }
    char *data = calloc(1, BIG);
    ASSERT_TRUE(data != NULL);
    size_t before = mallinfo2().hblkhd;
    natsMsg *m = NULL;
    ASSERT_EQ(natsMsg_Create(&m, "a.b", NULL, data, BIG), NATS_OK);
    natsMsgHeader_Set(m, "Nats-Msg-Id", "one");
    size_t made = mallinfo2().hblkhd;
    ASSERT_TRUE(made >= before + BIG);
    jsd__msg_free(m);
    ASSERT_EQ(mallinfo2().hblkhd, before);
    free(data);
}

static void null_is_ignored(void **state)
{
    (void)state;
    jsd__msg_free(NULL);
}

JSD_TEST_MAIN(cmocka_unit_test(this_libnats_frees_directly),
              cmocka_unit_test(a_message_is_freed_before_the_call_returns),
              cmocka_unit_test(null_is_ignored))
