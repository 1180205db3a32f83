#!/usr/bin/env bash
# Scale benchmarks: `make bench-scale` runs this after building (not part of
# `make bench`: at the full sizes it runs for 12-20 minutes on a 2-core
# machine). Like bench/run.sh it starts a private nats-server (the newest,
# with the default lazy fsync) and PostgreSQL 15 (fixture.sh's
# deployment-like bench profile, settings printed on stderr) in a temporary
# folder removed on every exit path, runs $BUILD/bench/bench_scale against
# them and prints one `NAME VALUE UNIT` line per figure on stdout:
#   relay.X.scale_base / scale_pending / scale_published   msg/s  (X = sqlite, postgres)
#   gc.X                                                    rows/s
#   rss.relay.max_mib, rss.consume.max_mib (SQLite), rss.relay.postgres.max_mib,
#   rss.consume.postgres.max_mib                            MiB
# then the same-run ratio lines:
#   relay.X.scale_pending_ratio    scale_pending / scale_base
#   relay.X.scale_published_ratio  scale_published / scale_base
#   relay.X.scale_ratio            the smaller of the two (issue 12's target)
# Sizes: SCALE_BASE (100000), SCALE_PENDING (1000000), SCALE_PUBLISHED
# (5000000), SCALE_RSS_MESSAGES (1000000); SCALE_STORES ("sqlite postgres"),
# SCALE_PARTS ("relay gc rss") pick what runs; JSD_BENCH_PG=0 skips PostgreSQL.
set -uo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
. "$top/bench/common.sh"
start=$(date +%s)

JSD_BENCH_NATS_URL=$(start_nats "$root/nats" default) || exit 1
export JSD_BENCH_NATS_URL
echo "bench-scale: nats-server $(sed -n 's/^NATS_VERSION=//p' "$root/nats/fixture.env") (fsync always: $(sed -n 's/^NATS_FSYNC_ALWAYS=//p' "$root/nats/fixture.env")); $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); sizes: base ${SCALE_BASE:-100000}, pending ${SCALE_PENDING:-1000000}, published ${SCALE_PUBLISHED:-5000000}, rss ${SCALE_RSS_MESSAGES:-1000000}" >&2
if [ "${JSD_BENCH_PG:-1}" = 1 ]; then
  start_pg "$root/pg"
else
  unset JSD_BENCH_PG_URL
fi

rc=0
if [ -x "$BUILD/bench/bench_scale" ]; then
  TMPDIR=$root JSD_BENCH_CLI="$BUILD/jsdurable" "$BUILD/bench/bench_scale" | tee -a "$figures" || rc=1
else
  echo "bench-scale: $BUILD/bench/bench_scale is not built" >&2; rc=1
fi

for x in sqlite postgres; do
  ratio "relay.$x.scale_pending_ratio" "relay.$x.scale_pending" "relay.$x.scale_base"
  ratio "relay.$x.scale_published_ratio" "relay.$x.scale_published" "relay.$x.scale_base"
done | tee -a "$figures"
awk '$1 ~ /^relay\.[a-z]+\.scale_(pending|published)_ratio$/ {
       split($1, p, "."); if (!(p[2] in m) || $2 < m[p[2]]) m[p[2]] = $2 }
     END { for (x in m) printf "relay.%s.scale_ratio %.2f x\n", x, m[x] }' "$figures" | sort
echo "bench-scale: run time $(( $(date +%s) - start )) s" >&2
exit $rc
