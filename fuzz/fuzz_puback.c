/*
 * libFuzzer target for the publication engine's reading of replies: arbitrary
 * bytes as a PubAck body (and, when the first byte is odd, a Status header).
 * Must never crash, and must never call a reply ACCEPTED unless it is a JSON
 * object naming the expected stream with a positive integer sequence and no
 * error (checked against jansson as the oracle).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "pubengine.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    jsd_publish_result res;
    char status[8] = "";
    const char *body = (const char *)data;
    size_t len = size;
    if (size > 0 && (data[0] & 1) && size >= 4) {
        memcpy(status, data + 1, 3);
        body += 4;
        len -= 4;
    }
    jsd_outcome o =
        jsd__pubengine_judge_reply(body, len, status[0] ? status : NULL, "ORDERS", &res);
    if (o != JSD_OUTCOME_ACCEPTED)
        return 0;
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    json_t *st = root ? json_object_get(root, "stream") : NULL;
    json_t *seq = root ? json_object_get(root, "seq") : NULL;
    if (status[0] || !json_is_object(root) || json_object_get(root, "error") ||
        !json_is_string(st) || strcmp(json_string_value(st), "ORDERS") != 0 ||
        !json_is_integer(seq) || json_integer_value(seq) <= 0 ||
        (json_integer_value(seq) != (json_int_t)res.receipt.seq) ||
        strcmp(res.receipt.stream, "ORDERS") != 0)
        abort();
    json_decref(root);
    return 0;
}
