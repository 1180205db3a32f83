/*
 * natsmsg — the messages of the hot path (every publication, PubAck,
 * delivery and ACK reply) made and freed without two of nats.c's per-message
 * costs; see natsmsg.c for why and how. Internal.
 */
#ifndef JSD_NATSMSG_H
#define JSD_NATSMSG_H

#include <stdbool.h>
#include <stddef.h>

#include <nats/nats.h>

#include "jsd_int.h"

/* A buffer the caller keeps between jsd__msg_make calls (one per thread that
 * makes messages); zero-initialised, released by jsd__msg_scratch_free. */
typedef struct jsd__msg_scratch {
    char *p;
    size_t cap;
} jsd__msg_scratch;

/* Make a message to publish: subject, reply (or NULL), the headers of
 * `fixed` then those of `extra`, and len bytes of data. Names and values
 * must already be valid (jsd__header_name_valid, jsd__header_value_valid in
 * src/subject.h: no value is NULL or empty). The message is the caller's, to
 * free with jsd__msg_free. */
natsStatus jsd__msg_make(natsMsg **out, const char *subject, const char *reply,
                         const jsd_header *fixed, size_t n_fixed, const jsd_header *extra,
                         size_t n_extra, const void *data, size_t len, jsd__msg_scratch *sc);
void jsd__msg_scratch_free(jsd__msg_scratch *sc);

/* Free a message its owner is done with (one it made, or one it received and
 * no longer references) at once. NULL is ignored. Not for a message nats.c
 * keeps itself (none reaches this library's callers). */
void jsd__msg_free(natsMsg *m);

/* Whether this libnats lets the two shortcuts be taken (else jsd__msg_make
 * and jsd__msg_free use the public API, at its cost). */
bool jsd__msg_direct(void);

#endif
