#!/usr/bin/env bash
# Where the Redis store's added latency at moderate load goes: wrk's latency
# percentiles next to wxgate's own decision time (its decision_seconds
# histogram, read from /metrics before and after the run) and Redis' bare
# round trip (redis-cli --latency from the proxy's CPU during the run), on
# the memory and the Redis store, pinned as bench/run.sh's pinned mode (wxgate
# with workers = 1 alone on CPU 0; wrk, the mock upstream and Redis on CPU 1).
#
#   bench/decision-latency.sh              # 64 connections, each pausing 7 ms after every answer (~8k calls/s)
#   LAT_PACE_MS=3 bench/decision-latency.sh
#
# LAT_CONNECTIONS (64), LAT_PACE_MS (7), LAT_DURATION (10 s), LAT_PORT_BASE
# (19980) and up, all on 127.0.0.1; BENCH_BIN (default target/profiling/wxgate,
# built). The decision percentiles are bucket upper bounds (the histogram's
# buckets: 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 50 ms; docs/metrics.md). Needs nginx, redis-server, redis-cli, wrk,
# taskset, curl.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
export PATH="$PATH:/usr/sbin:/sbin"
for t in nginx redis-server redis-cli wrk taskset curl; do
  command -v "$t" >/dev/null || { echo "decision-latency: $t is missing" >&2; exit 1; }
done
(($(nproc) >= 2)) || { echo "decision-latency: needs 2 CPUs" >&2; exit 1; }
CONNS=${LAT_CONNECTIONS:-64} PACE=${LAT_PACE_MS:-7} DURATION=${LAT_DURATION:-10} BASE=${LAT_PORT_BASE:-19980}
for v in "$CONNS" "$PACE" "$DURATION" "$BASE"; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "decision-latency: LAT_* settings are whole numbers" >&2; exit 2; }
done
BIN=${BENCH_BIN:-}
if [ -z "$BIN" ]; then cargo build --profile profiling --locked -q; BIN=target/profiling/wxgate; fi
[ -x "$BIN" ] || { echo "decision-latency: $BIN is not an executable" >&2; exit 2; }

bench_tmp latency
chmod 755 "$TMP"   # nginx workers run as an unprivileged user
NEXT_PORT=$BASE
bench_port UP; bench_port RP; bench_port PX; bench_port AD
bench_nginx_mock "127.0.0.1:$UP" "$TMP/nginx.pid" "$TMP/error.log" >"$TMP/nginx.conf"
echo 'local pace = tonumber(os.getenv("WRK_PACE_MS")); function delay() return pace end' >"$TMP/pace.lua"
taskset -c 1 nginx -c "$TMP/nginx.conf" -p "$TMP/" -e "$TMP/error.log" & PIDS+=($!)
taskset -c 1 redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" >/dev/null & PIDS+=($!)
for _ in $(seq 100); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.1; done

URL="http://127.0.0.1:$PX/cgi-bin/message/template/send?access_token=bench"
METRICS="http://127.0.0.1:$AD/metrics"
decisions() { curl -s "$METRICS" | grep '^wxgate_decision_seconds_bucket.*rule="bench"' || true; }
echo "| store | calls/s | p50 | p90 | p99 | decision p50 | decision p90 | decision p99 | Redis PING round trip (min/avg/max) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---|"
for store in memory redis; do
  if [ $store = redis ]; then
    store_toml=$(printf 'kind = "redis"\nurl = "redis://127.0.0.1:%s"' "$RP")
  else
    store_toml='kind = "memory"'
  fi
  bench_wxgate_toml "127.0.0.1:$PX" "http://127.0.0.1:$UP" "$store_toml" "workers = 1" |
    sed "s/^admin_listen = \"off\"/admin_listen = \"127.0.0.1:$AD\"/" >"$TMP/$store.toml"
  WXGATE_LOG=warn taskset -c 0 "$BIN" --config "$TMP/$store.toml" >"$TMP/$store.log" 2>&1 & WX=$!
  PIDS+=("$WX")
  for _ in $(seq 100); do curl -sf -o /dev/null "$URL" && break; sleep 0.1; done
  WRK_PACE_MS=$PACE taskset -c 1 wrk -t2 -c"$CONNS" -d2s -s "$TMP/pace.lua" "$URL" >/dev/null   # warm-up
  decisions >"$TMP/before"
  (sleep 2; timeout -s INT $((DURATION - 4 > 1 ? DURATION - 4 : 1)) taskset -c 0 redis-cli -p "$RP" --latency --raw >"$TMP/ping" 2>&1 || true) &
  PING=$!
  WRK_PACE_MS=$PACE taskset -c 1 wrk -t2 -c"$CONNS" -d"${DURATION}s" --latency -s "$TMP/pace.lua" "$URL" >"$TMP/wrk"
  wait "$PING" || true
  decisions >"$TMP/after"
  kill -INT "$WX"; wait "$WX" 2>/dev/null || true
  # Calls per bucket over the run: after - before, per upper bound (le).
  paste "$TMP/before" "$TMP/after" |
    awk '{match($1, /le="[^"]*"/); le=substr($1, RSTART+4, RLENGTH-5); print le, $4 - $2}' >"$TMP/buckets"
  pct() { awk -v q="$1" 'NR==FNR {t=$2; next} $2 >= t*q && t > 0 {printf "≤ %g ms", $1*1000; exit}' <(tail -1 "$TMP/buckets") "$TMP/buckets"; }
  lat() { awk -v p="$1%" '$1 == p || $1 == p".000%" {print $2}' "$TMP/wrk" | head -1; }
  rate=$(awk '/Requests\/sec/ {printf "%.0f", $2}' "$TMP/wrk")
  ping=$(tail -1 "$TMP/ping" | awk 'NF >= 3 {printf "%s / %s / %s ms", $1, $3, $2}')
  echo "| $store | $rate | $(lat 50) | $(lat 90) | $(lat 99) | $(pct 0.5) | $(pct 0.9) | $(pct 0.99) | ${ping:-–} |"
done
echo
echo "$CONNS connections, each pausing ${PACE} ms after every answer (wrk's delay() hook, not counted in latency),"
echo "${DURATION} s after a 2 s warm-up; $(date -u +%F), $(nproc) CPUs; wxgate \`$BIN\` (sha256 $(sha256sum "$BIN" | cut -c1-12))."
