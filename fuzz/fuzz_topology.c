/*
 * libFuzzer target for the topology file parser: arbitrary bytes must either
 * parse into a topology whose accessors are consistent, or be refused with
 * JSD_ERR_CONFIG / JSD_ERR_LIMIT and a message that starts with a key path or
 * a JSON position. Never a crash, an out-of-bounds read or a leak.
 *
 * Build and run by hand (make fuzz does the same for every target):
 *   clang -g -O1 -std=c11 -D_GNU_SOURCE -DJSD_VERSION='"0"' \
 *     -fsanitize=fuzzer,address,undefined -Iinclude -Isrc \
 *     fuzz/fuzz_topology.c $(find src -name '*.c') -o build-fuzz/fuzz_topology \
 *     $(pkg-config --cflags --libs libnats sqlite3 libpq jansson openssl libmicrohttpd) \
 *     -lpthread -lm
 *   mkdir -p build-fuzz/corpus-fuzz_topology && cp examples/topology.json \
 *     build-fuzz/corpus-fuzz_topology/ && \
 *   build-fuzz/fuzz_topology -max_total_time=60 build-fuzz/corpus-fuzz_topology
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jsd_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    jsd_topology *t = NULL;
    jsd_error e;
    jsd_error_clear(&e);
    jsd_status s = jsd_topology_parse(&t, (const char *)data, size, &e);
    if (s == JSD_OK) {
        if (!t)
            abort();
        size_t ns = jsd_topology_stream_count(t);
        for (size_t i = 0; i < ns; i++) {
            const jsd_topology_stream *st = jsd_topology_stream_at(t, i);
            if (!st || !st->name || st->n_subjects == 0)
                abort();
            for (size_t k = 0; k < st->n_subjects; k++)
                for (size_t j = 0; j < ns; j++) {
                    const jsd_topology_stream *o = jsd_topology_stream_at(t, j);
                    for (size_t m = 0; j != i && m < o->n_subjects; m++)
                        if (jsd_subjects_overlap(st->subjects[k], o->subjects[m]))
                            abort(); /* overlaps must have been refused */
                }
        }
        for (size_t i = 0; i < jsd_topology_consumer_count(t); i++) {
            const jsd_topology_consumer *c = jsd_topology_consumer_at(t, i);
            if (!c || !c->durable || !c->stream || c->ack_wait_ms <= 0)
                abort();
        }
        jsd_topology_destroy(t);
    } else {
        if (t || (s != JSD_ERR_CONFIG && s != JSD_ERR_LIMIT && s != JSD_ERR_NOMEM) || !e.msg[0])
            abort();
    }
    return 0;
}
