/*
 * Stream binding and the bounded publisher with typed outcomes (PUB-1..7,
 * SEC-1,2). DRAFT: owned by the publisher work; the shape may change.
 */
#ifndef JSDURABLE_PUBLISHER_H
#define JSDURABLE_PUBLISHER_H

#include "conn.h"
#include "store.h" /* jsd_header */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct jsd_publisher jsd_publisher;

#define JSD_OUTCOME_MAP(X)                                                     \
    X(ACCEPTED, "accepted")                                                    \
    X(RETRYABLE, "retryable")                                                  \
    X(REJECTED, "rejected")                                                    \
    X(UNAVAILABLE, "unavailable")                                              \
    X(DENIED, "denied")                                                        \
    X(FAILED, "failed")                                                        \
    X(UNKNOWN, "unknown")

typedef enum jsd_outcome {
#define JSD__OUTCOME_ENUM(name, text) JSD_OUTCOME_##name,
    JSD_OUTCOME_MAP(JSD__OUTCOME_ENUM)
#undef JSD__OUTCOME_ENUM
        JSD__OUTCOME_COUNT
} jsd_outcome;

/* "accepted", "unknown", ... */
const char *jsd_outcome_str(jsd_outcome o);

#ifdef __cplusplus
}
#endif
#endif
