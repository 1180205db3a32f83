/*
 * libFuzzer target for the envelope checks: arbitrary bytes as a JSON payload
 * (depth limit 8) and as a Jsd-Type against a small accepted list. Must never
 * crash, read out of bounds or take more than linear time.
 */
#include <stdint.h>
#include <string.h>

#include "consumer_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char why[256];
    (void)jsd__json_valid(data, size, JSD_JSON_DEPTH_MAX, why, sizeof(why));
    char type[300];
    size_t n = size < sizeof(type) - 1 ? size : sizeof(type) - 1;
    memcpy(type, data, n);
    type[n] = '\0';
    const char *types[] = {"a.b", "order.created"};
    (void)jsd__envelope_check(type, data, size, types, 2, JSD_PAYLOAD_JSON, why, sizeof(why));
    return 0;
}
