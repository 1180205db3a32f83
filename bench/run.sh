#!/usr/bin/env bash
# Benchmarks: `make bench` runs this after building. It starts private
# nats-server fixtures (scripts/fixture.sh) in a temporary folder, removed on
# every exit path, runs the programs under $BUILD/bench/ against them and
# prints one `NAME VALUE UNIT` line per figure on stdout (notes go to stderr).
#
#   the newest nats-server (scripts/deps.sh) with the file store's default
#     lazy fsync: the client path's ceiling -> raw.publish, publisher, ...
#   the same server with `sync_interval: always` (the fixtures' default):
#     the durable configuration  -> *.durable figures, the headline: a server
#     that loses no acknowledged write. Its ceilings are raw.publish.durable
#     (per-message, pipelined like the relay) and raw.batch.durable (atomic
#     batches of the relay's size and depth, bench_batch); its streams allow
#     atomic batches.
#
# Every other program under $BUILD/bench/ (but bench_scale, which
# `make bench-scale` runs through bench/scale.sh) runs once, with no arguments,
# and finds the services in JSD_BENCH_NATS_URL (no per-message fsync),
# JSD_BENCH_NATS_FSYNC_URL (sync_interval: always) and JSD_BENCH_PG_URL
# (a private PostgreSQL 15 with fixture.sh's deployment-like bench profile,
# its settings printed on stderr; JSD_BENCH_PG=0 skips it).
# BENCH_MESSAGES (default 100000), BENCH_FSYNC_MESSAGES (default 5000: the
# per-message ceiling on the durable server) and BENCH_DURABLE_MESSAGES
# (default 20000: everything else there) set the sizes.
set -uo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
. "$top/bench/common.sh"

JSD_BENCH_NATS_URL=$(start_nats "$root/nats" default) || exit 1
JSD_BENCH_NATS_FSYNC_URL=$(start_nats "$root/nats-fsync" always) || exit 1
export JSD_BENCH_NATS_URL JSD_BENCH_NATS_FSYNC_URL
# The servers' process ids: the programs read their CPU from /proc and print
# it per message beside their own (*.server.cpu, *.pg.cpu).
fsync_pid=$(sed -n 's/^NATS_PID=//p' "$root/nats-fsync/fixture.env")
JSD_BENCH_NATS_PID=$(sed -n 's/^NATS_PID=//p' "$root/nats/fixture.env")
export JSD_BENCH_NATS_PID
echo "bench: nats-server $(sed -n 's/^NATS_VERSION=//p' "$root/nats/fixture.env") (fsync always: $(sed -n 's/^NATS_FSYNC_ALWAYS=//p' "$root/nats/fixture.env")) and $(sed -n 's/^NATS_VERSION=//p' "$root/nats-fsync/fixture.env") (fsync always: $(sed -n 's/^NATS_FSYNC_ALWAYS=//p' "$root/nats-fsync/fixture.env")); $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2

if [ "${JSD_BENCH_PG:-1}" = 1 ]; then
  start_pg "$root/pg"
fi

rc=0
if [ -x "$BUILD/bench/bench_publish" ]; then
  "$BUILD/bench/bench_publish" "$JSD_BENCH_NATS_URL" "${BENCH_MESSAGES:-100000}" | tee -a "$figures" || rc=1
  JSD_BENCH_NATS_PID=$fsync_pid "$BUILD/bench/bench_publish" "$JSD_BENCH_NATS_FSYNC_URL" "${BENCH_FSYNC_MESSAGES:-5000}" .durable | tee -a "$figures" || rc=1
else
  echo "bench: $BUILD/bench/bench_publish is not built" >&2; rc=1
fi
durable=${BENCH_DURABLE_MESSAGES:-20000}
if [ -x "$BUILD/bench/bench_batch" ]; then
  "$BUILD/bench/bench_batch" "$JSD_BENCH_NATS_URL" "${BENCH_MESSAGES:-100000}" | tee -a "$figures" || rc=1
  "$BUILD/bench/bench_batch" "$JSD_BENCH_NATS_FSYNC_URL" "$durable" .durable | tee -a "$figures" || rc=1
fi
for prog in "$BUILD"/bench/*; do
  [ -x "$prog" ] && [ -f "$prog" ] || continue
  case $(basename "$prog") in bench_publish | bench_batch | bench_scale) continue ;; esac
  "$prog" | tee -a "$figures" || rc=1
done
# The durable configuration: the relay on atomic-batch streams, the consumer.
if [ -x "$BUILD/bench/bench_relay" ]; then
  JSD_BENCH_NATS_PID=$fsync_pid BENCH_RELAY_SUFFIX=.durable BENCH_RELAY_ATOMIC=1 \
    BENCH_RELAY_ONLY=sqlite,postgres,keyed,latency BENCH_RELAY_MESSAGES=$durable \
    "$BUILD/bench/bench_relay" "$JSD_BENCH_NATS_FSYNC_URL" | tee -a "$figures" || rc=1
fi
if [ -x "$BUILD/bench/bench_ingress" ]; then
  JSD_BENCH_NATS_PID=$fsync_pid BENCH_INGRESS_SUFFIX=.durable BENCH_INGRESS_MESSAGES=$durable \
    "$BUILD/bench/bench_ingress" "$JSD_BENCH_NATS_FSYNC_URL" | tee -a "$figures" || rc=1
fi
# A three-node cluster, R3 streams, every node with `sync_interval: always`
# (R3 with lazy fsync lost acknowledged writes in Jepsen's analysis of 2.12.1):
# raw.batch.cluster and the relay on it. JSD_BENCH_CLUSTER=0 skips it.
if [ "${JSD_BENCH_CLUSTER:-1}" = 1 ]; then
  if JSD_NATS_SERVER=${JSD_BENCH_NATS_SERVER:-} JSD_FX_FSYNC=always \
       bash scripts/fixture.sh cluster-start "$root/cluster" > "$root/cluster.log" 2>&1; then
    # one node's URL: the client learns the others from the server
    curls=$(sed -n 's/^NODE1_URL=//p' "$root/cluster/fixture.env")
    BENCH_REPLICAS=3 "$BUILD/bench/bench_batch" "$curls" "$durable" .cluster | tee -a "$figures" || rc=1
    BENCH_REPLICAS=3 BENCH_RELAY_SUFFIX=.cluster BENCH_RELAY_ATOMIC=1 BENCH_RELAY_ONLY=sqlite,postgres \
      BENCH_RELAY_MESSAGES=$durable "$BUILD/bench/bench_relay" "$curls" | tee -a "$figures" || rc=1
    bash scripts/fixture.sh stop "$root/cluster" > /dev/null 2>&1
  else
    echo "bench: cannot start the cluster:" >&2; cat "$root/cluster.log" >&2; rc=1
  fi
fi

# Issue 5's ratios: relay.X / raw.publish.best (raw nats.c async publish with
# a MsgId, 256 B, on the same server in this run, the faster of SendAsap and
# coalesced writes: the relay's connection coalesces, so its ceiling must be
# allowed to as well). The latency figures have no ceiling of their own: a raw
# publish's round trip is not measured here.
ratio relay.sqlite.ratio relay.sqlite raw.publish.best
ratio relay.postgres.ratio relay.postgres raw.publish.best
# Issue 43's targets, on the durable server: the relay against the atomic
# batch ceiling (>= 0.8 SQLite, >= 0.6 PostgreSQL) and against per-message
# publication (>= 8), keyed against unkeyed (>= 0.5).
ratio relay.sqlite.durable.ratio relay.sqlite.durable raw.batch.durable
ratio relay.postgres.durable.ratio relay.postgres.durable raw.batch.durable
ratio relay.sqlite.durable.vs_publish relay.sqlite.durable raw.publish.best.durable
ratio relay.sqlite.durable.keyed.ratio relay.sqlite.durable.keyed relay.sqlite.durable
ratio relay.sqlite.cluster.ratio relay.sqlite.cluster raw.batch.cluster
ratio relay.postgres.cluster.ratio relay.postgres.cluster raw.batch.cluster
exit $rc
