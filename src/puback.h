/*
 * puback — one reading of a JetStream publish reply and one judge of its
 * PubAck, shared by the publication engine (src/pubengine.c) and the
 * dead-letter code (src/deadletter.c). Pure functions: thread-safe.
 */
#ifndef JSD_PUBACK_H
#define JSD_PUBACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nats/nats.h>

#include "jsd_int.h"

/* A reply as read (on nats.c's thread), before it is matched against what the
 * publication expected. */
enum {
    JSD__REPLY_NORESP = 1, /* no responders: no stream captures the subject */
    JSD__REPLY_STATUS,     /* a status header and no acknowledgement */
    JSD__REPLY_MALFORMED,  /* neither an acknowledgement nor an error */
    JSD__REPLY_ERROR,      /* {"error":{"code":C,"err_code":E,"description":D}} */
    JSD__REPLY_ACK         /* {"stream":S,"seq":N[,"duplicate":B][,"batch":I,"count":C]} */
};
typedef struct jsd__reply {
    int kind;
    int code;       /* STATUS: status; ERROR: JetStream code */
    int err_code;   /* ERROR */
    int dlen;       /* MALFORMED: reply size */
    int64_t seq;    /* ACK */
    bool dup;       /* ACK */
    int64_t count;  /* ACK of an atomic batch's commit: "count" (0 otherwise) */
    char batch[48]; /* ACK of an atomic batch's commit: "batch", its id ("" otherwise) */
    char text[160]; /* ACK: stream; ERROR: description; MALFORMED: what */
} jsd__reply;

/* Read a reply message / a reply's status header (NULL if none) and body. */
void jsd__reply_parse(natsMsg *msg, jsd__reply *p);
void jsd__reply_parse_body(const char *data, int dlen, const char *status, jsd__reply *p);

/* The acknowledgement rule: it must name a stream, the expected one (NULL or
 * "" expects none in particular), and a sequence above 0. Checked in this
 * order; a duplicate flag does not change the verdict (the caller reads it:
 * an earlier attempt stored the message). */
typedef enum jsd__puback_verdict {
    JSD__PUBACK_OK = 0,
    JSD__PUBACK_NO_STREAM, /* no acknowledgement or no stream named */
    JSD__PUBACK_FOREIGN,   /* another stream than the expected one */
    JSD__PUBACK_NO_SEQ     /* sequence 0 (or below) */
} jsd__puback_verdict;
jsd__puback_verdict jsd__puback_judge(const char *stream, int64_t seq, const char *expected);

/* Copy src into dst (cap bytes), each byte outside printable ASCII as '?'. */
void jsd__copy_printable(char *dst, size_t cap, const char *src);

#endif
