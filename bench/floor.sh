#!/usr/bin/env bash
# Where a call's CPU time goes, per proxy, pinned: user and kernel time per
# call and system calls per call, for nginx proxy_pass, the bare hyper proxy
# (examples/hyper_floor.rs: wxgate's serving parts without wxgate), and
# wxgate on the memory and the Redis store. It answers "how close to nginx
# can a hyper + Tokio proxy get on this machine": the floor under wxgate.
#
#   bench/floor.sh                    # 3 rounds of 5 s, 64 connections
#   FLOOR_ROUNDS=5 FLOOR_DURATION=10 bench/floor.sh
#   FLOOR_BINS="old=old/wxgate new=target/profiling/wxgate" bench/floor.sh
#                                     # several wxgate binaries, same rounds
#
# FLOOR_BINS: NAME=PATH pairs (default "current=target/profiling/wxgate", built
# here); each binary is measured on both stores. Layout as bench/run.sh's
# pinned mode: the proxy under test alone on CPU 0 (nginx with 1 worker;
# hyper_floor and wxgate with one serving thread); wrk (1 thread), the mock
# upstream (nginx, `return 200`) and Redis on CPU 1. Each round measures
# every proxy once, in turn; the table has medians and ranges. CPU times
# come from /proc/PID/stat over the measured run, system calls from
# `perf stat -e raw_syscalls:sys_enter` (left out where perf or that
# tracepoint is missing). Needs nginx, redis-server, wrk, taskset, curl, bc.
# Ports: FLOOR_PORT_BASE (default 19900) and up, all on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
export PATH="$PATH:/usr/sbin:/sbin"

ROUNDS=${FLOOR_ROUNDS:-3}
DURATION=${FLOOR_DURATION:-5}
CONNS=${FLOOR_CONNECTIONS:-64}
THREADS=${FLOOR_THREADS:-1}
BASE=${FLOOR_PORT_BASE:-19900}
for t in nginx redis-server wrk taskset curl bc; do
  command -v "$t" >/dev/null || { echo "floor: $t is missing" >&2; exit 1; }
done
(($(nproc) >= 2)) || { echo "floor: needs 2 CPUs (the proxy alone on one)" >&2; exit 1; }

cargo build --profile profiling --locked -q --example hyper_floor
FLOOR=target/profiling/examples/hyper_floor
if [ -z "${FLOOR_BINS:-}" ]; then
  cargo build --profile profiling --locked -q
  FLOOR_BINS="current=target/profiling/wxgate"
fi
declare -A BIN
NAMES=()
for pair in $FLOOR_BINS; do
  name=${pair%%=*} path=${pair#*=}
  [[ $name =~ ^[A-Za-z0-9_.-]+$ ]] && [ "$name" != "$pair" ] ||
    { echo "floor: FLOOR_BINS takes NAME=PATH pairs, got '$pair'" >&2; exit 2; }
  [ -x "$path" ] || { echo "floor: $path ($name) is not an executable" >&2; exit 2; }
  BIN[$name]=$path
  NAMES+=("$name")
done

bench_tmp floor
chmod 755 "$TMP"   # nginx workers run as an unprivileged user
NEXT_PORT=$BASE
bench_port UP; bench_port NGX; bench_port HYP; bench_port RP
BODY=$BENCH_BODY
REQ=/cgi-bin/message/template/send?access_token=bench
mkdir -p "$TMP/up" "$TMP/px"
bench_nginx_mock "127.0.0.1:$UP" nginx.pid error.log >"$TMP/up/nginx.conf"
bench_nginx_proxy "127.0.0.1:$NGX" "127.0.0.1:$UP" nginx.pid error.log >"$TMP/px/nginx.conf"

spawn() { local log=$1; shift; "$@" >"$TMP/$log.log" 2>&1 & PIDS+=($!); LAST=$!; }
spawn upstream taskset -c 1 nginx -c "$TMP/up/nginx.conf" -p "$TMP/up/" -e "$TMP/up/error.log"
spawn redis taskset -c 1 redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP"
spawn nginx taskset -c 0 nginx -c "$TMP/px/nginx.conf" -p "$TMP/px/" -e "$TMP/px/error.log"
NGX_MASTER=$LAST
declare -A PID PORT LABEL
PORT[nginx]=$NGX LABEL[nginx]="nginx proxy_pass (1 worker)"
spawn hyper taskset -c 0 "$FLOOR" "127.0.0.1:$HYP" "127.0.0.1:$UP"
PID[hyper]=$LAST PORT[hyper]=$HYP LABEL[hyper]="bare hyper proxy (examples/hyper_floor.rs)"
PROXIES=(nginx hyper)
for name in "${NAMES[@]}"; do
  for store in memory redis; do
    id=$name-$store
    bench_port "PORT[$id]"
    if [ $store = memory ]; then
      store_toml="kind = \"memory\"
state_file = \"$TMP/$id.state.json\""
    else
      store_toml="kind = \"redis\"
url = \"redis://127.0.0.1:$RP\"
key_prefix = \"$name\""
    fi
    bench_wxgate_toml "127.0.0.1:${PORT[$id]}" "http://127.0.0.1:$UP" "$store_toml" "workers = 1" >"$TMP/$id.toml"
    WXGATE_LOG=warn spawn "$id" taskset -c 0 "${BIN[$name]}" --config "$TMP/$id.toml"
    PID[$id]=$LAST LABEL[$id]="wxgate $name, $store store"
    PROXIES+=("$id")
  done
done
for n in "${PROXIES[@]}"; do
  for _ in $(seq 100); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${PORT[$n]}$REQ")" = 200 ] && break
    sleep 0.1
  done
  [ "$(curl -s "http://127.0.0.1:${PORT[$n]}$REQ")" = "$BODY" ] ||
    { tail -5 "$TMP/$n.log" >&2; echo "floor: $n does not answer $BODY" >&2; exit 1; }
done
PID[nginx]=$(pgrep -P "$NGX_MASTER" | head -1)

PERF=0
if command -v perf >/dev/null && perf stat -e raw_syscalls:sys_enter -o /dev/null -- true 2>/dev/null; then PERF=1; fi
TCK=$(getconf CLK_TCK)
cpu() { awk '{print $14, $15}' "/proc/$1/stat"; } # utime stime, in ticks

for r in $(seq "$ROUNDS"); do
  for n in "${PROXIES[@]}"; do
    url="http://127.0.0.1:${PORT[$n]}$REQ" pid=${PID[$n]}
    taskset -c 1 wrk -t"$THREADS" -c"$CONNS" -d1s "$url" >/dev/null   # warm-up: connections, pools
    read -r u0 s0 < <(cpu "$pid")
    ((PERF)) && { perf stat -e raw_syscalls:sys_enter -p "$pid" -x, -o "$TMP/perf.$n.$r" -- sleep "$DURATION" & }
    taskset -c 1 wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" "$url" >"$TMP/wrk.$n.$r"
    ((PERF)) && wait $!
    read -r u1 s1 < <(cpu "$pid")
    calls=$(awk '/requests in/ {print $1}' "$TMP/wrk.$n.$r")
    sc=NA
    ((PERF)) && sc=$(awk -F, '/raw_syscalls/ {print $1}' "$TMP/perf.$n.$r")
    echo "$n $calls $((u1 - u0)) $((s1 - s0)) $sc" >>"$TMP/rows"
  done
  echo "floor: round $r of $ROUNDS done" >&2
done

median() { sort -g | awk '{v[NR]=$1} END {print NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
# stat PROXY EXPR: median (min–max) of EXPR over calls c, user ticks u,
# system ticks s, system calls k, per round.
stat() {
  awk -v n="$1" -v tck="$TCK" "\$1 == n { c=\$2; u=\$3; s=\$4; k=\$5; print $2 }" "$TMP/rows" | sort -g |
    awk '{v[NR]=$1} END {m = NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2; printf "%.1f (%.1f–%.1f)", m, v[1], v[NR]}'
}
rate() { awk -v tck="$TCK" -v n="$1" '$1 == n {print $2 * tck / ($3 + $4)}' "$TMP/rows" | median; }
echo "| proxy | calls/s per proxy core | vs nginx | user µs/call | kernel µs/call | system calls/call |"
echo "|---|---:|---:|---:|---:|---:|"
NGX_RATE=$(rate nginx)
for n in "${PROXIES[@]}"; do
  r=$(rate "$n")
  sys="–"
  ((PERF)) && sys=$(stat "$n" 'k / c')
  printf '| %s | %.0f | %.2f× | %s | %s | %s |\n' "${LABEL[$n]}" "$r" "$(echo "$r / $NGX_RATE" | bc -l)" \
    "$(stat "$n" 'u * 1e6 / tck / c')" "$(stat "$n" 's * 1e6 / tck / c')" "$sys"
done
echo
echo "$ROUNDS rounds of ${DURATION} s, $CONNS connections, wrk $THREADS thread(s); median (min–max); calls/s per proxy core ="
echo "calls ÷ the proxy's CPU time (user + kernel). $(date -u +%F), $(nproc) CPUs, $(nginx -v 2>&1 | cut -d' ' -f3)."
for name in "${NAMES[@]}"; do echo "- wxgate $name: \`${BIN[$name]}\` (sha256 $(sha256sum "${BIN[$name]}" | cut -c1-12))"; done
