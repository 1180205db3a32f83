#!/usr/bin/env bash
# Run the test suite: every test case in its own process, with a deadline.
#
#   BUILD=build scripts/run-tests.sh [unit] [integration] [slow] [chaos] [compat]
#
# compat is the compatibility lane: the integration tests of the relay, the
# consumer, the publisher, doctor and topology (COMPAT_TESTS) once more,
# against the system's own nats-server (Debian 12: 2.9.10; JSD_COMPAT_NATS
# names another) while every other group runs on the newest one
# (scripts/deps.sh). A feature the old server lacks is skipped there with its
# reason, printed beside the case. test_consumer_outage is left out: its
# faults are the store's, and the server plays no part in them.
#
# Starts the run's shared services (a JetStream nats-server and a PostgreSQL)
# unless JSD_TEST_NATS_URL / JSD_TEST_PG_URL are set, keeps every fixture under
# one temporary folder, and on every exit path stops all that it, or any test,
# started there. Ends with the line "N passed, N failed".
#
# JSD_TEST_FILTER=substr  run only cases whose "group/binary/case" contains it
# JSD_TEST_WRAP=cmd       run each case under cmd (valgrind)
# JSD_TEST_TIMEOUT_SCALE  multiply the per-case deadlines
# JSD_TEST_VERBOSE=1      print every case's output, not only failures'
set -uo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
BUILD=${BUILD:-build}
case "$BUILD" in /*) ;; *) BUILD="$top/$BUILD" ;; esac
export JSD_BUILD="$BUILD" JSD_TOP="$top"
groups=("$@")
[ ${#groups[@]} -gt 0 ] || groups=(unit integration slow chaos compat)
scale=${JSD_TEST_TIMEOUT_SCALE:-1}

root=$(mktemp -d "${TMPDIR:-/tmp}/jsd-test.XXXXXX")
chmod 755 "$root"
export JSD_TEST_TMP="$root"
cleanup() {
  bash "$top/scripts/fixture.sh" sweep "$root" >/dev/null 2>&1
  # a chaos case killed by its deadline leaves its tmpfs (disk-full) mounted
  awk -v r="$root/" 'index($2, r) == 1 {print $2}' /proc/mounts 2>/dev/null |
    while read -r m; do umount -l "$m" 2>/dev/null; done
  rm -rf "$root"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

needs_services=0
for g in "${groups[@]}"; do [ "$g" != unit ] && needs_services=1; done

COMPAT_TESTS="test_relay test_relay_atomic test_relay_faults test_relay_horizon test_consumer test_consumer_batch
  test_consumer_cli test_consumer_foreign test_publisher test_publisher_cli test_publisher_faults test_publisher_proxy
  test_publisher_replies test_doctor test_topology"
compat_url="" compat_bin=""
for g in "${groups[@]}"; do
  [ "$g" = compat ] || continue
  compat_bin=${JSD_COMPAT_NATS:-$(command -v nats-server || true)}
  [ -x "$compat_bin" ] || { echo "compat lane: no system nats-server (run scripts/deps.sh)"; exit 1; }
  if ! JSD_NATS_SERVER=$compat_bin bash scripts/fixture.sh nats-start "$root/compat-nats" plain \
       > "$root/compat-nats.log" 2>&1; then
    echo "cannot start the compatibility lane's nats-server:"; cat "$root/compat-nats.log"; exit 1
  fi
  compat_url=$(sed -n 's/^NATS_URL=//p' "$root/compat-nats/fixture.env")
  echo "compat lane: nats-server $(sed -n 's/^NATS_VERSION=//p' "$root/compat-nats/fixture.env") ($compat_bin) at $compat_url"
done

if [ $needs_services = 1 ]; then
  if [ -z "${JSD_TEST_NATS_URL:-}" ]; then
    if ! bash scripts/fixture.sh nats-start "$root/shared-nats" plain > "$root/shared-nats.log" 2>&1; then
      echo "cannot start the shared nats-server:"; cat "$root/shared-nats.log"; exit 1
    fi
    JSD_TEST_NATS_URL=$(sed -n 's/^NATS_URL=//p' "$root/shared-nats/fixture.env")
    export JSD_TEST_NATS_URL
    echo "shared nats-server $(sed -n 's/^NATS_VERSION=//p' "$root/shared-nats/fixture.env") at $JSD_TEST_NATS_URL (fsync always: $(sed -n 's/^NATS_FSYNC_ALWAYS=//p' "$root/shared-nats/fixture.env"))"
  fi
  if [ -z "${JSD_TEST_PG_URL:-}" ]; then
    if ! bash scripts/fixture.sh pg-start "$root/shared-pg" > "$root/shared-pg.log" 2>&1; then
      echo "cannot start the shared PostgreSQL:"; cat "$root/shared-pg.log"; exit 1
    fi
    JSD_TEST_PG_URL=$(sed -n 's/^PG_URL=//p' "$root/shared-pg/fixture.env")
    export JSD_TEST_PG_URL
    echo "shared PostgreSQL at ${JSD_TEST_PG_URL%%\?*}"
  fi
fi

# the chaos group's ci_random case: a fresh seed unless one is given, printed
# so that a failure can be replayed (CHAOS_SEED=N)
for g in "${groups[@]}"; do
  if [ "$g" = chaos ] && [ "${CHAOS_LONG:-0}" != 1 ]; then
    CHAOS_SEED=${CHAOS_SEED:-$(( (RANDOM << 15) | RANDOM ))}
    export CHAOS_SEED
    echo "chaos: ci_random uses seed $CHAOS_SEED (replay: CHAOS_SEED=$CHAOS_SEED make check JSD_TEST_GROUPS=chaos)"
  fi
done

passed=0 failed=0 skipped=0
failures=()
for g in "${groups[@]}"; do
  case $g in
    unit) limit=60 ;; integration | compat) limit=300 ;; slow) limit=900 ;;
    chaos) limit=${JSD_CHAOS_CASE_LIMIT:-300} ;; # one seeded run; `make chaos` raises it
    *) limit=300 ;;
  esac
  limit=$((limit * scale))
  bins=("$BUILD/tests/$g"/*)
  if [ "$g" = compat ]; then
    bins=()
    for t in $COMPAT_TESTS; do bins+=("$BUILD/tests/integration/$t"); done
  fi
  [ "$g" = compat ] || [ -d "$BUILD/tests/$g" ] || continue
  for bin in "${bins[@]}"; do
    [ -x "$bin" ] && [ -f "$bin" ] || continue
    name=$(basename "$bin")
    cases=$("$bin" --list 2>/dev/null) || { echo "FAIL $g/$name: cannot list cases"; failed=$((failed+1)); failures+=("$g/$name"); continue; }
    for c in $cases; do
      id="$g/$name/$c"
      if [ -n "${JSD_TEST_FILTER:-}" ] && [[ "$id" != *"$JSD_TEST_FILTER"* ]]; then continue; fi
      log="$root/log.$g.$name.$c"
      start=$(date +%s.%N)
      # shellcheck disable=SC2086
      if [ "$g" = compat ]; then
        JSD_TEST_NATS_URL=$compat_url JSD_NATS_SERVER=$compat_bin \
          timeout -k 10 "$limit" ${JSD_TEST_WRAP:-} "$bin" "$c" > "$log" 2>&1
      else
        timeout -k 10 "$limit" ${JSD_TEST_WRAP:-} "$bin" "$c" > "$log" 2>&1
      fi
      rc=$?
      secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN{printf "%.1f", e-s}')
      if [ $rc = 0 ] && grep -q '^\[  SKIPPED \]' "$log"; then
        why=$(sed -n 's/^skipped: //p' "$log" | head -1)
        echo "skip $id (${secs}s)${why:+: $why}"; skipped=$((skipped+1))
        [ "${JSD_TEST_VERBOSE:-0}" = 1 ] && sed 's/^/    /' "$log"
      elif [ $rc = 0 ]; then
        echo "ok   $id (${secs}s)"; passed=$((passed+1))
        [ "${JSD_TEST_VERBOSE:-0}" = 1 ] && sed 's/^/    /' "$log"
      else
        [ $rc = 124 ] || [ $rc = 137 ] && why=" (timed out after ${limit}s or killed)" || why=""
        echo "FAIL $id (${secs}s, exit $rc)$why"
        # the head holds the failed assertion, the tail a sanitizer's report
        lines=$(wc -l < "$log")
        if [ "$lines" -gt 120 ]; then
          { head -n 40 "$log"; echo "[... $((lines - 120)) lines ...]"; tail -n 80 "$log"; } | sed 's/^/    /'
        else
          sed 's/^/    /' "$log"
        fi
        failed=$((failed+1)); failures+=("$id")
      fi
    done
  done
done

echo
if [ $failed -gt 0 ]; then
  echo "failed cases:"; printf '  %s\n' "${failures[@]}"
fi
echo "wall time: $((SECONDS / 60))m $((SECONDS % 60))s for ${groups[*]}"
if [ $skipped -gt 0 ]; then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
[ $failed = 0 ] && [ $passed -gt 0 ]
