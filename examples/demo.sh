#!/usr/bin/env bash
# make demo — jsdurable end to end, on SQLite, with a local nats-server that
# this script starts and stops itself.
#
#   orders service ──(one tx: order row + outbox effect)──▶ orders.db
#   relay A ──▶ ORDERS stream ──▶ shipping service (inbox + shipment row +
#   follow-up effect, one tx, then ACK) ──▶ shipping.db ──▶ relay B ──▶ SHIPPING
#
# Mid-run the relay and the shipping service are killed with SIGKILL and
# restarted, and one poison message is published. The demo then checks, from
# the databases and the streams themselves, that every order was shipped
# exactly once, that nothing was published twice, and that the poison message
# sits in the dead-letter stream with its reason.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
BUILD=${BUILD:-build}
J="$top/$BUILD/jsdurable"
ORDERS_BIN="$top/$BUILD/examples/orders"
SHIPPING_BIN="$top/$BUILD/examples/shipping"
N=${JSD_DEMO_ORDERS:-3000}
run="$top/demo-run"

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
fail() { echo "demo: FAILED: $*" >&2; exit 1; }

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  bash "$top/scripts/fixture.sh" stop "$run/nats" >/dev/null 2>&1 || true
  bash "$top/scripts/fixture.sh" sweep "$run" >/dev/null 2>&1 || true
}
trap cleanup EXIT

# wait_progress DESCRIPTION STALL TARGET COMMAND...: poll until COMMAND prints a
# number >= TARGET; give up only when that number has not moved for STALL
# seconds, so a slow (loaded) machine that keeps making progress never fails.
wait_progress() {
  local what=$1 stall=$2 target=$3; shift 3
  local last="" since=$SECONDS v
  while :; do
    v=$("$@" 2>/dev/null) || v=""
    [ -n "$v" ] && [ "$v" -ge "$target" ] && return 0
    if [ "$v" != "$last" ]; then last=$v; since=$SECONDS; fi
    [ $((SECONDS - since)) -lt "$stall" ] ||
      fail "no progress for ${stall}s waiting for $what (at ${v:-?}, want $target)"
    sleep 0.2
  done
}
# wait_for DESCRIPTION SECONDS COMMAND...: poll until COMMAND succeeds.
wait_for() {
  local what=$1 secs=$2; shift 2
  local end=$((SECONDS + secs))
  until "$@"; do
    [ $SECONDS -lt $end ] || fail "timed out after ${secs}s waiting for $what"
    sleep 0.2
  done
}
json_num() { sed -n "s/.*\"$1\":\([0-9][0-9]*\).*/\1/p" | head -1; }
count_sql() { sqlite3 "$1" "$2"; }

rm -rf "$run"; mkdir -p "$run"
say "starting a local nats-server with JetStream (file storage)"
bash scripts/fixture.sh nats-start "$run/nats" plain > "$run/nats-start.log" 2>&1 \
  || { cat "$run/nats-start.log"; fail "nats-server did not start"; }
NATS=$(sed -n 's/^NATS_URL=//p' "$run/nats/fixture.env")
export JSD_NATS_URL=$NATS
echo "    nats-server $(sed -n 's/^NATS_VERSION=//p' "$run/nats/fixture.env") at $NATS"

say "provisioning streams ORDERS, SHIPPING, the dead-letter stream and the shipping consumer"
"$J" provision --file examples/demo/topology.json | sed 's/^/    /'

ORDERS_DB="sqlite:$run/orders.db"
SHIP_DB="sqlite:$run/shipping.db"
METRICS_PORT=$((20000 + RANDOM % 20000))

start_relay_a() {
  "$J" relay --store "$ORDERS_DB" --metrics "127.0.0.1:$METRICS_PORT" --log-level warn \
    >> "$run/relay-a.log" 2>&1 &
  RELAY_A=$!; pids+=("$RELAY_A")
}
start_shipping() {
  "$SHIPPING_BIN" --store "$SHIP_DB" --nats "$NATS" >> "$run/shipping.log" 2>&1 &
  SHIPPING=$!; pids+=("$SHIPPING")
}

say "orders service: committing $N orders, each with its outbox effect in the same transaction"
"$ORDERS_BIN" --store "$ORDERS_DB" --count "$N" --per-tx 20 --rate 1500 > "$run/orders.log" 2>&1 &
ORDERS=$!; pids+=("$ORDERS")
start_relay_a
start_shipping
"$J" relay --store "$SHIP_DB" --log-level warn >> "$run/relay-b.log" 2>&1 &
RELAY_B=$!; pids+=("$RELAY_B")

shipments() { count_sql "$run/shipping.db" 'SELECT count(*) FROM shipments' 2>/dev/null || echo 0; }
wait_progress "the first shipments" 60 $((N / 3)) shipments

say "SIGKILL the orders relay and the shipping service mid-run"
{ kill -KILL "$RELAY_A" "$SHIPPING"; wait "$RELAY_A"; wait "$SHIPPING"; } 2>/dev/null || true
echo "    killed at $(count_sql "$run/shipping.db" 'SELECT count(*) FROM shipments') shipments"

say "a buggy producer commits one poison order event (its payload is not JSON)"
printf 'this is not an order' | "$J" enqueue --store "$ORDERS_DB" --subject orders.created \
  --owner order-bad --id created --header Jsd-Type:order.created | sed 's/^/    /'

say "restarting the relay and the shipping service"
start_relay_a
start_shipping

wait "$ORDERS" || fail "the orders service failed: $(cat "$run/orders.log")"
wait_progress "all $N orders to be shipped" 60 "$N" shipments
# minus the backlog, so that draining is progress towards 0
drained() { local b; b=$("$J" status --store "$1" --json | json_num backlog); [ -n "$b" ] && echo $((-b)); }
wait_progress "the orders outbox to drain" 60 0 drained "$ORDERS_DB"
wait_progress "the shipping outbox to drain" 60 0 drained "$SHIP_DB"
dlq_list() { "$J" dlq list --stream JSD_DLQ 2>/dev/null; }
dlq_has_one() { [ "$(dlq_list | grep -c poison)" -ge 1 ]; }
wait_for "the poison message in the dead-letter stream" 30 dlq_has_one

say "verifying from the databases and the streams"
orders=$(count_sql "$run/orders.db" 'SELECT count(*) FROM orders')
ships=$(count_sql "$run/shipping.db" 'SELECT count(*) FROM shipments')
distinct=$(count_sql "$run/shipping.db" 'SELECT count(DISTINCT order_id) FROM shipments')
orders_msgs=$("$J" status --stream ORDERS --json | json_num messages)
ship_msgs=$("$J" status --stream SHIPPING --json | json_num messages)
orders_dup=$(count_sql "$run/orders.db" 'SELECT count(*) FROM jsd_outbox_state WHERE duplicate = 1')
dead=$(dlq_list | grep -c poison || true)
reason=$(dlq_list | grep poison | head -1)

ok=1
check() { if eval "$2"; then printf '    %-58s ok\n' "$1"; else printf '    %-58s MISMATCH\n' "$1"; ok=0; fi; }
check "orders committed: $orders (expected $N)" "[ $orders = $N ]"
check "order events in ORDERS: $orders_msgs (orders + 1 poison = $((N + 1)))" "[ ${orders_msgs:-0} = $((N + 1)) ]"
check "shipments: $ships, distinct orders shipped: $distinct" "[ $ships = $N ] && [ $distinct = $N ]"
check "duplicate shipments: $((ships - distinct))" "[ $((ships - distinct)) = 0 ]"
check "shipment events in SHIPPING: $ship_msgs (expected $N)" "[ ${ship_msgs:-0} = $N ]"
check "re-publications after the SIGKILL, absorbed by JetStream dedup: $orders_dup" "true"
check "dead letters: $dead" "[ $dead = 1 ]"
echo "    dead letter: $reason"

say "metrics excerpt (relay A, http://127.0.0.1:$METRICS_PORT/metrics)"
scrape() {
  exec 3<>"/dev/tcp/127.0.0.1/$METRICS_PORT" || return 1
  printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
  cat <&3; exec 3>&-
}
# The relay reads its backlog gauges from the store every 5 s.
gauge_drained() { scrape 2>/dev/null | grep -q '^jsd_outbox_backlog 0$'; }
wait_for "the relay's backlog gauge to reach 0" 15 gauge_drained
scrape | grep -E '^jsd_(relay_published_total|relay_duplicates_total|outbox_backlog|outbox_oldest_unpublished_age_seconds|nats_connected)' | sed 's/^/    /'

[ $ok = 1 ] || fail "the summary above shows a mismatch"
say "demo passed: $N orders shipped exactly once across two SIGKILLs and a poison message"
