/*
 * metrics — DRAFT placeholder; the public API of this part is written by its issue.
 */
#ifndef JSDURABLE_METRICS_H
#define JSDURABLE_METRICS_H

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
