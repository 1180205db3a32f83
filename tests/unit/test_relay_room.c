/*
 * Unit tests for the relay's two bounds (relay.c DESIGN 12) through
 * jsd__relay_claim_room: max_in_flight bounds the publications awaiting a
 * PubAck, and the effects waiting for their receipt have a bound of their
 * own. The run loop claims only what this returns. And through
 * jsd__relay_acks_due, when the next claim waits for the PubAcks of what is
 * in flight (DESIGN 11).
 */
#include "test.h"
#include "relay_int.h"

static void publications_use_the_whole_window(void **state)
{
    (void)state;
    ASSERT_EQ(jsd__relay_claim_room(1024, 0, 0), 1024);
    ASSERT_EQ(jsd__relay_claim_room(1024, 768, 0), 256);
    ASSERT_EQ(jsd__relay_claim_room(1024, 1023, 0), 1);
    ASSERT_EQ(jsd__relay_claim_room(1024, 1024, 0), 0);
    ASSERT_EQ(jsd__relay_claim_room(1, 0, 0), 1);
    ASSERT_EQ(jsd__relay_claim_room(1, 1, 0), 0);
}

static void receipts_waiting_take_no_publication_slots(void **state)
{
    (void)state;
    /* batches waiting for the writer do not shrink the window ... */
    ASSERT_EQ(jsd__relay_claim_room(1024, 0, 768), 1024);
    ASSERT_EQ(jsd__relay_claim_room(1024, 512, 1023), 512);
    /* ... until as many effects as the window wait: then no claim at all */
    ASSERT_EQ(jsd__relay_claim_room(1024, 0, 1024), 0);
    ASSERT_EQ(jsd__relay_claim_room(1024, 0, 5000), 0);
    ASSERT_EQ(jsd__relay_claim_room(16, 8, 16), 0);
}

static void held_effects_stay_under_twice_the_window(void **state)
{
    (void)state;
    /* Drive the rule as the loop does, with a writer that records nothing:
     * claim what the room allows, then settle every publication into the
     * writer's queue; claims stop, and what is held never exceeds 2 x max. */
    for (size_t max = 1; max <= 64; max++) {
        for (size_t batch = 1; batch <= max; batch++) {
            size_t in_flight = 0, unrecorded = 0, most = 0;
            for (int round = 0; round < 1000; round++) {
                size_t room = jsd__relay_claim_room(max, in_flight, unrecorded);
                if (room >= batch)
                    in_flight += batch;
                else if (in_flight > 0) {
                    size_t settled = round % 2 ? in_flight : (in_flight + 1) / 2;
                    in_flight -= settled;
                    unrecorded += settled;
                } else
                    break;
                if (in_flight + unrecorded > most)
                    most = in_flight + unrecorded;
                ASSERT_LE(in_flight, max);
            }
            ASSERT_EQ(in_flight, 0);
            ASSERT_TRUE(unrecorded >= max);
            ASSERT_LE(most, 2 * max);
        }
    }
}

static void a_short_claims_fresh_publications_are_settled_before_a_claim(void **state)
{
    (void)state;
    int64_t t = 5000000; /* a short claim went out at t */
    ASSERT_TRUE(jsd__relay_acks_due(1, t, t));
    ASSERT_TRUE(jsd__relay_acks_due(3, t, t + 150));
    ASSERT_TRUE(jsd__relay_acks_due(JSD__ACKS_DUE_MAX - 1, t, t + JSD__ACKS_DUE_US - 1));
    /* nothing in flight: nothing to wait for */
    ASSERT_TRUE(!jsd__relay_acks_due(0, t, t));
}

static void late_acks_and_a_backlog_never_hold_claims(void **state)
{
    (void)state;
    int64_t t = 5000000;
    /* PubAcks later than the bound (a slow broker): claim anyway */
    ASSERT_TRUE(!jsd__relay_acks_due(1, t, t + JSD__ACKS_DUE_US));
    ASSERT_TRUE(!jsd__relay_acks_due(2, t, t + 60 * 1000 * 1000));
    /* the last claim came back full (0): a backlog keeps claiming while it
     * publishes, even with batches smaller than JSD__ACKS_DUE_MAX */
    ASSERT_TRUE(!jsd__relay_acks_due(1, 0, t));
    ASSERT_TRUE(!jsd__relay_acks_due(16, 0, 100));
    /* many in flight: a short claim of a large batch is not waited for */
    ASSERT_TRUE(!jsd__relay_acks_due(JSD__ACKS_DUE_MAX, t, t));
    ASSERT_TRUE(!jsd__relay_acks_due(1024, t, t + 10));
    /* a clock read before the submission does not hold claims */
    ASSERT_TRUE(!jsd__relay_acks_due(1, t, t - 5));
}

JSD_TEST_MAIN(cmocka_unit_test(publications_use_the_whole_window),
              cmocka_unit_test(a_short_claims_fresh_publications_are_settled_before_a_claim),
              cmocka_unit_test(late_acks_and_a_backlog_never_hold_claims),
              cmocka_unit_test(receipts_waiting_take_no_publication_slots),
              cmocka_unit_test(held_effects_stay_under_twice_the_window))
