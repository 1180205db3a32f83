#!/usr/bin/env bash
# Benchmarks: `make bench` runs this after building. It starts private
# nats-server fixtures (scripts/fixture.sh) in a temporary folder, removed on
# every exit path, runs the programs under $BUILD/bench/ against them and
# prints one `NAME VALUE UNIT` line per figure on stdout (notes go to stderr).
#
#   the newest nats-server (scripts/deps.sh) with the file store's default
#     lazy fsync: the client path's ceiling -> raw.publish, publisher, ...
#   the same server with `sync_interval: always` (the fixtures' default):
#     the durable configuration  -> *.fsync figures (fewer messages: fsync-bound)
#
# Every other program under $BUILD/bench/ (but bench_scale, which
# `make bench-scale` runs through bench/scale.sh) runs once, with no arguments,
# and finds the services in JSD_BENCH_NATS_URL (no per-message fsync),
# JSD_BENCH_NATS_FSYNC_URL (sync_interval: always) and JSD_BENCH_PG_URL
# (a private PostgreSQL 15 with fixture.sh's deployment-like bench profile,
# its settings printed on stderr; JSD_BENCH_PG=0 skips it).
# BENCH_MESSAGES (default 100000) and BENCH_FSYNC_MESSAGES (default 5000)
# set the sizes.
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
  JSD_BENCH_NATS_PID=$fsync_pid "$BUILD/bench/bench_publish" "$JSD_BENCH_NATS_FSYNC_URL" "${BENCH_FSYNC_MESSAGES:-5000}" .fsync | tee -a "$figures" || rc=1
else
  echo "bench: $BUILD/bench/bench_publish is not built" >&2; rc=1
fi
for prog in "$BUILD"/bench/*; do
  [ -x "$prog" ] && [ -f "$prog" ] || continue
  case $(basename "$prog") in bench_publish | bench_scale) continue ;; esac
  "$prog" | tee -a "$figures" || rc=1
done

# Issue 5's ratios: relay.X / raw.publish.best (raw nats.c async publish with
# a MsgId, 256 B, on the same server in this run, the faster of SendAsap and
# coalesced writes: the relay's connection coalesces, so its ceiling must be
# allowed to as well). The latency figures have no ceiling of their own: a raw
# publish's round trip is not measured here.
ratio relay.sqlite.ratio relay.sqlite raw.publish.best
ratio relay.postgres.ratio relay.postgres raw.publish.best
exit $rc
