/*
 * jsdurable — durable, effectively-once messaging between a transactional SQL
 * store (SQLite or PostgreSQL) and NATS JetStream.
 *
 * This is the one header an application includes. It gathers the public API,
 * one part per object, from include/jsdurable/:
 *
 *   status.h     jsd_status, jsd_error, logging, version
 *   conn.h       connection profile -> NATS connection + JetStream context
 *   store.h      the durable owner: store, transactions, outbox effects
 *   publisher.h  stream binding and the bounded publisher with typed outcomes
 *   relay.h      outbox -> JetStream relay
 *   consumer.h   durable ingress: handler in a transaction, then ACK
 *   dlq.h        death envelopes and the dead-letter stream tools
 *   topology.h   declarative streams and consumers
 *   metrics.h    counters, snapshot, Prometheus exposition
 *   inspect.h    read-only views of streams and durables for operators
 *   outbox.h     the outbox's operator tools: list, show, requeue dead letters
 *   verify.h     receipts audited against the stream (and lost ones repaired)
 *
 * Handles are opaque. Every call returns jsd_status (JSD_OK is 0) unless its
 * comment says otherwise; each handle keeps its last error, readable with
 * jsd_<object>_errmsg(). Constructors take an optional jsd_error * that
 * receives the reason when they fail.
 */
#ifndef JSDURABLE_H
#define JSDURABLE_H

#include "jsdurable/status.h"
#include "jsdurable/conn.h"
#include "jsdurable/store.h"
#include "jsdurable/publisher.h"
#include "jsdurable/relay.h"
#include "jsdurable/consumer.h"
#include "jsdurable/dlq.h"
#include "jsdurable/topology.h"
#include "jsdurable/metrics.h"
#include "jsdurable/inspect.h"
#include "jsdurable/outbox.h"
#include "jsdurable/verify.h"
#include "jsdurable/doctor.h"

#endif
