/*
 * The parsed topology as topology.c builds it and topology_apply.c applies
 * it, and the one translation of a declared consumer into nats.c's
 * jsConsumerConfig. Private to the library.
 */
#ifndef JSD_TOPOLOGY_INT_H
#define JSD_TOPOLOGY_INT_H

#include <jansson.h>
#include <nats/nats.h>

#include "jsd_int.h"

#define NS_PER_MS 1000000LL
#define DAY_MS    (24LL * 3600 * 1000)

#define PATH_CAP 128

typedef struct topo_stream {
    jsd_topology_stream pub;
    const char **subjects;
    char path[PATH_CAP]; /* "streams[2]" or "dead_letter" */
} topo_stream;

typedef struct topo_consumer {
    jsd_topology_consumer pub;
    int64_t *backoff;
    size_t stream_index;
    char path[PATH_CAP];
} topo_consumer;

struct jsd_topology {
    json_t *root; /* owns every string the structs point at */
    topo_stream *streams;
    size_t n_streams;
    topo_consumer *consumers;
    size_t n_consumers;
    int dead_letter; /* index into streams, -1 if none */
};

/* The durable consumer a topology declares, as nats.c's configuration: fills
 * Durable, Description (when set), DeliverPolicy (all, unless cfg holds by
 * start sequence: a re-created durable's, kept), AckPolicy (explicit),
 * FilterSubject, AckWait, MaxDeliver, MaxAckPending, InactiveThreshold and
 * BackOff over a cfg the caller made with jsConsumerConfig_Init (or read from
 * the server, for an update: other fields are left as they are). bo_ns holds
 * c->n_backoff entries (at most JSD_TOPOLOGY_BACKOFF_MAX) and must live as long as
 * cfg; cfg points into c's strings and bo_ns, it copies nothing. */
void jsd__topo_consumer_config(jsConsumerConfig *cfg, const jsd_topology_consumer *c,
                               int64_t *bo_ns);

#endif
