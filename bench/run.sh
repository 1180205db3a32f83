#!/usr/bin/env bash
# Benchmarks: `make bench` runs this after building. It starts private
# nats-server fixtures (scripts/fixture.sh) in a temporary folder, removed on
# every exit path, runs the programs under $BUILD/bench/ against them and
# prints one `NAME VALUE UNIT` line per figure on stdout (notes go to stderr).
#
#   nats-server without per-message fsync (the system's 2.9.10 when present):
#     the client path's ceiling -> raw.publish, publisher, publisher.ratio
#   nats-server 2.10 with `sync_interval: always` (the fixtures' default):
#     the durable configuration  -> *.fsync figures (fewer messages: fsync-bound)
#
# Every other program under $BUILD/bench/ runs once, with no arguments, and
# finds the services in JSD_BENCH_NATS_URL (no per-message fsync),
# JSD_BENCH_NATS_FSYNC_URL (2.10, sync_interval: always) and JSD_BENCH_PG_URL
# (a private PostgreSQL 15; JSD_BENCH_PG=0 skips it).
# BENCH_MESSAGES (default 100000) and BENCH_FSYNC_MESSAGES (default 5000)
# set the sizes.
set -uo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
BUILD=${BUILD:-build}
case "$BUILD" in /*) ;; *) BUILD="$top/$BUILD" ;; esac
export JSD_TOP="$top"

root=$(mktemp -d "${TMPDIR:-/tmp}/jsd-bench.XXXXXX")
# mktemp makes it 0700; PostgreSQL's initdb runs as another user when we are
# root and must reach its data folder inside (fixture.env files stay 0600).
chmod 755 "$root"
cleanup() {
  bash "$top/scripts/fixture.sh" sweep "$root" >/dev/null 2>&1
  rm -rf "$root"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_nats() { # start_nats DIR [SERVER_BINARY]
  local dir=$1 bin=${2:-}
  if ! JSD_NATS_SERVER=$bin bash "$top/scripts/fixture.sh" nats-start "$dir" plain > "$dir.log" 2>&1; then
    echo "bench: cannot start nats-server:" >&2; cat "$dir.log" >&2; exit 1
  fi
  sed -n 's/^NATS_URL=//p' "$dir/fixture.env"
}

fast_bin=""
if sys=$(command -v nats-server 2>/dev/null); then fast_bin=$sys; fi
JSD_BENCH_NATS_URL=$(start_nats "$root/nats" "$fast_bin") || exit 1
JSD_BENCH_NATS_FSYNC_URL=$(start_nats "$root/nats-fsync") || exit 1
export JSD_BENCH_NATS_URL JSD_BENCH_NATS_FSYNC_URL
echo "bench: nats-server $(sed -n 's/^NATS_VERSION=//p' "$root/nats/fixture.env") (fsync always: $(sed -n 's/^NATS_FSYNC_ALWAYS=//p' "$root/nats/fixture.env")) and $(sed -n 's/^NATS_VERSION=//p' "$root/nats-fsync/fixture.env") (fsync always: $(sed -n 's/^NATS_FSYNC_ALWAYS=//p' "$root/nats-fsync/fixture.env")); $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2

if [ "${JSD_BENCH_PG:-1}" = 1 ]; then
  if ! bash "$top/scripts/fixture.sh" pg-start "$root/pg" > "$root/pg.log" 2>&1; then
    echo "bench: cannot start PostgreSQL:" >&2; cat "$root/pg.log" >&2; exit 1
  fi
  JSD_BENCH_PG_URL=$(sed -n 's/^PG_URL=//p' "$root/pg/fixture.env")
  export JSD_BENCH_PG_URL
fi

# Every figure line is also kept in $root/figures so that the ratios below
# divide figures of this same run (same servers, same machine state).
figures="$root/figures"
: > "$figures"
rc=0
if [ -x "$BUILD/bench/bench_publish" ]; then
  "$BUILD/bench/bench_publish" "$JSD_BENCH_NATS_URL" "${BENCH_MESSAGES:-100000}" | tee -a "$figures" || rc=1
  "$BUILD/bench/bench_publish" "$JSD_BENCH_NATS_FSYNC_URL" "${BENCH_FSYNC_MESSAGES:-5000}" .fsync | tee -a "$figures" || rc=1
else
  echo "bench: $BUILD/bench/bench_publish is not built" >&2; rc=1
fi
for prog in "$BUILD"/bench/*; do
  [ -x "$prog" ] && [ -f "$prog" ] || continue
  case $(basename "$prog") in bench_publish) continue ;; esac
  "$prog" | tee -a "$figures" || rc=1
done

# Issue 5's ratios: relay.X / raw.publish (raw nats.c async publish with a
# MsgId, 256 B, on the same server in this run). A figure missing from this run
# gives no ratio line (and a note), never a made-up one.
ratio() { # ratio NAME NUMERATOR DENOMINATOR
  awk -v name="$1" -v a="$2" -v b="$3" '
    $1 == a && $3 == "msg/s" { x = $2 } $1 == b && $3 == "msg/s" { y = $2 }
    END { if (x != "" && y > 0) printf "%s %.2f x\n", name, x / y; else exit 1 }' "$figures" ||
    echo "bench: no $1 (needs $2 and $3 from this run)" >&2
}
ratio relay.sqlite.ratio relay.sqlite raw.publish
ratio relay.postgres.ratio relay.postgres raw.publish
exit $rc
