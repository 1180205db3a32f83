# Shared by bench/run.sh (`make bench`) and bench/scale.sh (`make bench-scale`):
# a temporary root removed on every exit path, private nats-server and
# PostgreSQL fixtures (scripts/fixture.sh) inside it, the PostgreSQL settings
# printed on stderr, and the same-run ratio lines. Sourced, never run; the
# caller has set top (the source tree) and cd'ed there.

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

# start_nats DIR FSYNC: the newest nats-server (scripts/deps.sh; the fixtures'
# choice), FSYNC "always" (`sync_interval: always`, the durable configuration)
# or "default" (the file store's lazy fsync: the client path's ceiling);
# prints the URL. JSD_BENCH_NATS_SERVER names another binary.
start_nats() {
  local dir=$1 fsync=$2
  if ! JSD_NATS_SERVER=${JSD_BENCH_NATS_SERVER:-} JSD_FX_FSYNC=$fsync \
       bash "$top/scripts/fixture.sh" nats-start "$dir" plain > "$dir.log" 2>&1; then
    echo "bench: cannot start nats-server:" >&2; cat "$dir.log" >&2; exit 1
  fi
  sed -n 's/^NATS_URL=//p' "$dir/fixture.env"
}

# start_pg DIR: a PostgreSQL 15 with the deployment-like settings of
# fixture.sh's bench profile; exports JSD_BENCH_PG_URL (and the postmaster's
# process id, JSD_BENCH_PG_PID) and prints the
# settings that shape the figures on stderr.
start_pg() {
  local dir=$1
  if ! JSD_PG_PROFILE=bench bash "$top/scripts/fixture.sh" pg-start "$dir" > "$dir.log" 2>&1; then
    echo "bench: cannot start PostgreSQL:" >&2; cat "$dir.log" >&2; exit 1
  fi
  JSD_BENCH_PG_URL=$(sed -n 's/^PG_URL=//p' "$dir/fixture.env")
  # the postmaster: bench_relay reads its and its children's CPU (*.pg.cpu)
  JSD_BENCH_PG_PID=$(sed -n 's/^PG_PID=//p' "$dir/fixture.env")
  export JSD_BENCH_PG_URL JSD_BENCH_PG_PID
  local psql settings
  psql=${JSD_PG_BIN:-/usr/lib/postgresql/15/bin}/psql
  [ -x "$psql" ] || psql=psql
  settings=$("$psql" "$JSD_BENCH_PG_URL" -XAtq -F= -c "SELECT name, current_setting(name) FROM
      unnest(ARRAY['server_version', 'shared_buffers', 'wal_buffers', 'max_wal_size',
      'checkpoint_timeout', 'effective_cache_size', 'work_mem', 'maintenance_work_mem',
      'synchronous_commit', 'fsync', 'max_connections']) AS name" 2>&1 | tr '\n' ' ')
  echo "bench: PostgreSQL settings: $settings" >&2
}

# Every figure line is also kept in $figures so that the ratios divide
# figures of this same run (same servers, same machine state). A figure
# missing from this run gives no ratio line (and a note), never a made-up one.
figures="$root/figures"
: > "$figures"
ratio() { # ratio NAME NUMERATOR DENOMINATOR [UNIT]
  awk -v name="$1" -v a="$2" -v b="$3" -v unit="${4:-msg/s}" '
    $1 == a && $3 == unit { x = $2 } $1 == b && $3 == unit { y = $2 }
    END { if (x != "" && y > 0) printf "%s %.2f x\n", name, x / y; else exit 1 }' "$figures" ||
    echo "bench: no $1 (needs $2 and $3 from this run)" >&2
}
