/*
 * natsmsg — the one place that steps past nats.c's public message API, for
 * two per-message costs of nats.c 3.4.1 that the public API cannot avoid:
 *
 * - natsMsg_Destroy (src/msg.c) hands every message made by natsMsg_Create,
 *   and every one nats.c received, to its collector thread (natsGC_collect in
 *   src/nats.c), signalling that thread under a lock whenever it sleeps: a
 *   wake-up for nearly every message at tens of thousands a second, paid in
 *   context switches on both sides. A perf profile of the SQLite relay put
 *   about a tenth of its process CPU there. natsMsg_free is the collector's
 *   own free; a message its owner is done with can go to it directly.
 * - natsMsgHeader_Set/Add keep headers in a hash table made for each message
 *   (a table, a value object per header, all freed again), then encode it
 *   when the message is written: 10-12 % of the relay's publishing thread.
 *   natsMsg_create, the constructor nats.c uses for what it receives, takes
 *   the headers already encoded ("NATS/1.0\r\n" ... "\r\n\r\n" ahead of the
 *   data); nats.c then writes them as they are (natsMsgHeader_encode's
 *   needsLift case), exactly as it forwards a received message.
 *
 * Both functions are exported by libnats.so though not declared in nats.h,
 * with the same signatures from nats.c 2.3 to 3.13 (checked in its sources).
 * They are weak references: with a libnats that lacks either, the public API
 * is used (natsMsg_Create with natsMsgHeader_Add, natsMsg_Destroy).
 * tests/unit/test_natsmsg checks that this libnats has both, that a message
 * made here carries the same subject, reply, headers and data as one made
 * with the public API, and that a freed message is gone when the call
 * returns.
 */
#include <string.h>

#include "natsmsg.h"
#include "subject.h"

extern void natsMsg_free(void *object) __attribute__((weak));
extern natsStatus natsMsg_create(natsMsg **newMsg, const char *subject, int subjLen,
                                 const char *reply, int replyLen, const char *buf, int bufLen,
                                 int hdrLen) __attribute__((weak));

#define HDR_LINE "NATS/1.0\r\n"

bool jsd__msg_direct(void)
{
    return natsMsg_free != NULL && natsMsg_create != NULL;
}

void jsd__msg_free(natsMsg *m)
{
    if (!m)
        return;
    if (natsMsg_free)
        natsMsg_free(m);
    else
        natsMsg_Destroy(m);
}

void jsd__msg_scratch_free(jsd__msg_scratch *sc)
{
    if (!sc)
        return;
    jsd__free(sc->p);
    sc->p = NULL;
    sc->cap = 0;
}

static char *put(char *at, const char *s, size_t n)
{
    memcpy(at, s, n);
    return at + n;
}

static char *put_line(char *at, const jsd_header *h)
{
    at = put(at, h->name, strlen(h->name));
    at = put(at, ": ", 2);
    at = put(at, h->value, strlen(h->value));
    return put(at, "\r\n", 2);
}

static natsStatus make_public(natsMsg **out, const char *subject, const char *reply,
                              const jsd_header *fixed, size_t n_fixed, const jsd_header *extra,
                              size_t n_extra, const void *data, size_t len)
{
    natsMsg *m = NULL;
    natsStatus s = natsMsg_Create(&m, subject, reply, (const char *)data, (int)len);
    for (size_t i = 0; s == NATS_OK && i < n_fixed + n_extra; i++) {
        const jsd_header *h = i < n_fixed ? &fixed[i] : &extra[i - n_fixed];
        s = natsMsgHeader_Add(m, h->name, h->value);
    }
    if (s != NATS_OK) {
        natsMsg_Destroy(m);
        return s;
    }
    *out = m;
    return NATS_OK;
}

natsStatus jsd__msg_make(natsMsg **out, const char *subject, const char *reply,
                         const jsd_header *fixed, size_t n_fixed, const jsd_header *extra,
                         size_t n_extra, const void *data, size_t len, jsd__msg_scratch *sc)
{
    *out = NULL;
    if (!jsd__msg_direct() || n_fixed + n_extra == 0)
        return make_public(out, subject, reply, fixed, n_fixed, extra, n_extra, data, len);
    size_t hdr = JSD__HEADERS_FRAME_BYTES;
    for (size_t i = 0; i < n_fixed + n_extra; i++) {
        const jsd_header *h = i < n_fixed ? &fixed[i] : &extra[i - n_fixed];
        hdr += jsd__header_wire_size(strlen(h->name), strlen(h->value));
    }
    if (hdr + len > (size_t)INT32_MAX)
        return NATS_INVALID_ARG;
    if (sc->cap < hdr + len) {
        size_t cap = JSD_MAX(hdr + len, 2 * sc->cap);
        char *p = jsd__realloc(sc->p, cap);
        if (!p)
            return NATS_NO_MEMORY;
        sc->p = p;
        sc->cap = cap;
    }
    char *at = put(sc->p, HDR_LINE, strlen(HDR_LINE));
    for (size_t i = 0; i < n_fixed + n_extra; i++)
        at = put_line(at, i < n_fixed ? &fixed[i] : &extra[i - n_fixed]);
    at = put(at, "\r\n", 2);
    if (len)
        memcpy(at, data, len);
    return natsMsg_create(out, subject, (int)strlen(subject), reply, reply ? (int)strlen(reply) : 0,
                          sc->p, (int)(hdr + len), (int)hdr);
}
