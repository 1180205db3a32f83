/*
 * Unit tests for the pace of the relay's backlog gauges
 * (jsd__relay_gauge_interval_ms, relay_gauge.c): counted every
 * JSD__GAUGES_EVERY_MS while a count is quick, and JSD__GAUGES_COST_X
 * counts' time apart once counting is slow, so that it never takes more
 * than 1/JSD__GAUGES_COST_X of the store's time.
 */
#include "test.h"
#include "relay_int.h"

static void quick_counts_come_every_five_seconds(void **state)
{
    (void)state;
    ASSERT_EQ(jsd__relay_gauge_interval_ms(0), JSD__GAUGES_EVERY_MS);
    ASSERT_EQ(jsd__relay_gauge_interval_ms(1), JSD__GAUGES_EVERY_MS);
    ASSERT_EQ(jsd__relay_gauge_interval_ms(JSD__GAUGES_EVERY_MS / JSD__GAUGES_COST_X - 1),
              JSD__GAUGES_EVERY_MS);
    ASSERT_EQ(JSD__GAUGES_EVERY_MS, 5000);
}

static void slow_counts_take_a_bounded_share(void **state)
{
    (void)state;
    /* at the edge the two rules agree */
    ASSERT_EQ(jsd__relay_gauge_interval_ms(JSD__GAUGES_EVERY_MS / JSD__GAUGES_COST_X),
              JSD__GAUGES_EVERY_MS);
    /* a count of a second (millions pending) comes every 20 s, not every 5 */
    ASSERT_EQ(jsd__relay_gauge_interval_ms(1000), 20000);
    ASSERT_EQ(jsd__relay_gauge_interval_ms(3000), 60000);
    for (int64_t took = 0; took <= 100000; took += 250) {
        int64_t every = jsd__relay_gauge_interval_ms(took);
        ASSERT_TRUE(every >= JSD__GAUGES_EVERY_MS);
        ASSERT_TRUE(took * JSD__GAUGES_COST_X <= every);
    }
}

JSD_TEST_MAIN(cmocka_unit_test(quick_counts_come_every_five_seconds),
              cmocka_unit_test(slow_counts_take_a_bounded_share))
