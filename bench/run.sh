#!/usr/bin/env bash
# Benchmark wxgate against the alternatives, end to end, on one machine:
#
#   1. direct           wrk -> mock WeChat (nginx `return 200`): the floor
#   2. nginx proxy_pass wrk -> nginx -> mock      (upstream keep-alive, no limiting)
#   3. wxgate memory    wrk -> wxgate -> mock     (embedded store, rule never throttles)
#   4. wxgate redis     wrk -> wxgate -> mock     (Redis store; concurrent calls of an
#                                                  account decided together, [store] batch)
#   5. wxgate redis 1:1 wrk -> wxgate -> mock     (Redis store, batch = false: one EVALSHA per call)
#   6. wxgate redis 90% wrk -> wxgate -> mock     (limit at ~10 % of target 4's rate)
#   7. the same, refusal_cache = false            (every refusal asks Redis)
#   8. wxgate redis, quota spent                  (day quota of 1, used up: every call refused
#                                                  for hours; answered locally, [store] refusal_cache)
#   9. the same, refusal_cache = false            (every refusal asks Redis)
#
# Pass 1 drives each target as hard as wrk can (same threads, connections,
# duration); pass 2 drives targets 1-5 at about half of the slowest of 1-4,
# to compare latency at equal, moderate load.
#
# Everything listens on 127.0.0.1 only, in a temp directory, and is stopped
# on exit. Needs: nginx, wrk, redis-server, curl (installed with apt-get when
# missing and we are root), and cargo. Rerun: `bench/run.sh`.
#
# Knobs (environment):
#   BENCH_DURATION     seconds per measured run            (default 10)
#   BENCH_WARMUP       seconds of warm-up before each run  (default 2)
#   BENCH_CONNECTIONS  wrk connections in pass 1            (default 64)
#   BENCH_THREADS      wrk threads                          (default 2)
#   BENCH_PORT_BASE    first loopback port tried            (default 18400)
#   BENCH_PERF=1       also record `perf` of wxgate during target 3
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$(pwd)
export PATH="$PATH:/usr/sbin:/sbin"

DURATION=${BENCH_DURATION:-10}; DURATION=${DURATION%s}
WARMUP=${BENCH_WARMUP:-2}; WARMUP=${WARMUP%s}
CONNS=${BENCH_CONNECTIONS:-64}
THREADS=${BENCH_THREADS:-2}
PORT_BASE=${BENCH_PORT_BASE:-18400}
PERF=${BENCH_PERF:-0}
REQ_PATH='/cgi-bin/message/template/send?access_token=BENCH'
BODY='{"errcode":0,"errmsg":"ok"}'

for v in DURATION WARMUP CONNS THREADS PORT_BASE; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "bench: $v must be a whole number, got '${!v}'" >&2; exit 2; }
done
((DURATION >= 3)) || { echo "bench: BENCH_DURATION must be at least 3 (seconds)" >&2; exit 2; }
((CONNS >= THREADS)) || { echo "bench: BENCH_CONNECTIONS must be >= BENCH_THREADS" >&2; exit 2; }

log() { printf '== %s\n' "$*" >&2; }
die() { printf 'bench: ERROR: %s\n' "$*" >&2; exit 1; }

# --- tools -------------------------------------------------------------------

missing=()
command -v nginx >/dev/null || missing+=(nginx)
command -v wrk >/dev/null || missing+=(wrk)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v curl >/dev/null || missing+=(curl)
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing ${missing[*]}"
    apt-get update -qq
    # Note: Debian's nginx/redis-server packages may start their own system
    # services (port 80 / 6379). This script never uses or touches them.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    die "missing tools: ${missing[*]} (install them, e.g. apt-get install -y ${missing[*]}, and rerun)"
  fi
fi
command -v cargo >/dev/null || die "cargo is missing (install a Rust toolchain, 1.85 or newer)"

# wrk cannot hold a fixed request rate; wrk2 can. Use it when present
# (it is not packaged in Debian 12: `apt-cache policy wrk2` finds nothing).
WRK2=$(command -v wrk2 || true)
if [ -z "$WRK2" ] && [ "$(id -u)" = 0 ] &&
   apt-cache policy wrk2 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  log "installing wrk2"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk2 >/dev/null && WRK2=$(command -v wrk2 || true)
fi

log "building wxgate (cargo build --release --locked)"
cargo build --release --locked
WXGATE=$REPO/target/release/wxgate
[ -x "$WXGATE" ] || die "$WXGATE was not built"

# --- processes: started in $TMP, all stopped on exit ---------------------------

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
TMP=$(mktemp -d /tmp/wxgate-bench.XXXXXX)
chmod 755 "$TMP"   # nginx workers run as an unprivileged user
PIDS=()

stop_pid() { # stop_pid PID: SIGTERM, then SIGKILL after 5 s
  local pid=$1 i
  kill "$pid" 2>/dev/null || return 0
  for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local rc=$? pid
  for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
  if [ "$rc" = 0 ]; then rm -rf "$TMP"; else echo "bench: failed (exit $rc); logs kept in $TMP" >&2; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port_in_use() { (: <>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
NEXT_PORT=$PORT_BASE
alloc_port() { # alloc_port VAR: next loopback port nothing listens on
  while port_in_use "$NEXT_PORT"; do
    NEXT_PORT=$((NEXT_PORT + 1))
    ((NEXT_PORT < PORT_BASE + 200)) || die "no free port in $PORT_BASE..$((PORT_BASE + 199)) (set BENCH_PORT_BASE)"
  done
  printf -v "$1" '%s' "$NEXT_PORT"
  NEXT_PORT=$((NEXT_PORT + 1))
}
check_free() { port_in_use "$1" && die "port 127.0.0.1:$1 is not free (set BENCH_PORT_BASE)"; return 0; }

start() { # start NAME CMD...: run in the background, log to $TMP/NAME.log, pid in LAST_PID
  "${@:2}" >>"$TMP/$1.log" 2>&1 &
  LAST_PID=$!
  PIDS+=("$LAST_PID")
}
wait_up() { # wait_up NAME PID URL: poll with curl (10 s at most) until it answers
  local i code
  for i in $(seq 100); do
    kill -0 "$2" 2>/dev/null || { tail -20 "$TMP/$1.log" >&2; die "$1 exited at start-up (log above; port taken?)"; }
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$3" || true)
    [ "$code" != 000 ] && [ -n "$code" ] && return 0
    sleep 0.1
  done
  tail -20 "$TMP/$1.log" >&2
  die "$1 did not answer on $3 within 10 s"
}
workers() { pgrep -P "$1" | paste -sd, -; } # nginx master pid -> its worker pids, comma-separated

# --- the mock WeChat upstream and the nginx proxy -------------------------------

UP_PORT='' NGX_PORT=''   # set by alloc_port
alloc_port UP_PORT
alloc_port NGX_PORT
WC=$((CONNS * 4 > 1024 ? CONNS * 4 : 1024))   # worker_connections

# One worker per nginx: the machine has 2 cores shared by wrk, the proxy
# under test, the mock upstream and Redis. Access logs off everywhere, as in
# wxgate (`[log] access = false`): one log line per call would dominate.
mkdir -p "$TMP/upstream" "$TMP/proxy"
cat >"$TMP/upstream/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid nginx.pid;
error_log error.log warn;
events { worker_connections $WC; }
http {
  access_log off;
  keepalive_timeout 75s;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:$UP_PORT;
    location / {
      types { }
      default_type application/json;
      return 200 '$BODY';
    }
  }
}
EOF
cat >"$TMP/proxy/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid nginx.pid;
error_log error.log warn;
events { worker_connections $WC; }
http {
  access_log off;
  keepalive_timeout 75s;
  keepalive_requests 1000000;
  upstream wechat {
    server 127.0.0.1:$UP_PORT;
    keepalive 64;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:$NGX_PORT;
    location / {
      proxy_pass http://wechat;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
EOF
for n in upstream proxy; do
  nginx -t -q -c "$TMP/$n/nginx.conf" -p "$TMP/$n/" -e "$TMP/$n/error.log" ||
    die "nginx refused the $n config ($TMP/$n/nginx.conf)"
done
check_free "$UP_PORT"
start upstream nginx -c "$TMP/upstream/nginx.conf" -p "$TMP/upstream/" -e "$TMP/upstream/error.log"
UP_PID=$LAST_PID
wait_up upstream "$UP_PID" "http://127.0.0.1:$UP_PORT$REQ_PATH"
check_free "$NGX_PORT"
start proxy nginx -c "$TMP/proxy/nginx.conf" -p "$TMP/proxy/" -e "$TMP/proxy/error.log"
NGX_PID=$LAST_PID
wait_up proxy "$NGX_PID" "http://127.0.0.1:$NGX_PORT$REQ_PATH"
UP_WORKERS=$(workers "$UP_PID")
NGX_WORKERS=$(workers "$NGX_PID")

# The mock must answer exactly like WeChat's success: JSON, errcode 0.
head=$(curl -s -D - -o "$TMP/body" "http://127.0.0.1:$UP_PORT$REQ_PATH")
grep -qi '^content-type: application/json' <<<"$head" || die "mock upstream does not send application/json"
[ "$(cat "$TMP/body")" = "$BODY" ] || die "mock upstream body is not $BODY"

# --- Redis ------------------------------------------------------------------------

alloc_port REDIS_PORT
check_free "$REDIS_PORT"
start redis-server redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --daemonize no --dir "$TMP"
REDIS_PID=$LAST_PID
for i in $(seq 100); do
  redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && break
  kill -0 "$REDIS_PID" 2>/dev/null || { tail -20 "$TMP/redis-server.log" >&2; die "redis-server exited at start-up"; }
  ((i < 100)) || die "redis-server did not answer PING within 10 s"
  sleep 0.1
done

# --- wxgate -----------------------------------------------------------------------

NEVER='[{ count = 1000000000, per = "1s", burst = 1000000 }]'   # never throttles

wxgate_config() { # wxgate_config NAME PORT STORE_TOML LIMITS: write $TMP/NAME.toml, `check` it
  cat >"$TMP/$1.toml" <<EOF
[server]
listen = "127.0.0.1:$2"
admin_listen = "off"
upstream = "http://127.0.0.1:$UP_PORT"
shutdown_timeout = "2s"

[store]
$3

[log]
access = false   # one access-log line per call would dominate the cost

[[rule]]
name = "bench"
match = ["/cgi-bin/message/template/send"]
limits = $4
EOF
  "$WXGATE" check --config "$TMP/$1.toml" >"$TMP/$1.check" 2>&1 ||
    { cat "$TMP/$1.check" >&2; die "wxgate check refused $TMP/$1.toml"; }
}
start_wxgate() { # start_wxgate NAME PORT: start, wait until it answers; pid in WX_PID
  check_free "$2"
  WXGATE_LOG=warn start "$1" "$WXGATE" --config "$TMP/$1.toml"
  WX_PID=$LAST_PID
  wait_up "$1" "$WX_PID" "http://127.0.0.1:$2$REQ_PATH"
}

# --- wrk runs and their parsing -----------------------------------------------------

# Warm-up script: counts answers by status (checks that 1-5 answer 200 and
# that targets 6-7's refusals are 429s). Not used for measured runs: a Lua
# response() callback costs wrk time.
cat >"$TMP/status.lua" <<'EOF'
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) ok, s429, other = 0, 0, 0 end
function response(status, headers, body)
  if status == 200 then ok = ok + 1 elseif status == 429 then s429 = s429 + 1 else other = other + 1 end
end
function done(summary, latency, requests)
  local a, b, c = 0, 0, 0
  for _, t in ipairs(threads) do a = a + t:get("ok"); b = b + t:get("s429"); c = c + t:get("other") end
  io.write(string.format("status: 200=%d 429=%d other=%d\n", a, b, c))
end
EOF
# Pacing script for pass 2 without wrk2: each connection waits
# $WRK_PACE_MS ms after every answer (wrk's delay() hook; not in latency).
cat >"$TMP/pace.lua" <<'EOF'
local pace = tonumber(os.getenv("WRK_PACE_MS"))
function delay() return pace end
EOF

CLK=$(getconf CLK_TCK)
gticks() { local -a p; IFS=, read -ra p <<<"${1#*=}"; ticks "${p[@]}"; } # gticks name=pid,pid...
ticks() { # ticks PID...: total user+system CPU ticks of these processes
  local t=0 p s f
  for p in "$@"; do
    s=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null) || continue
    read -ra f <<<"$s"   # f[0] is field 3 (state): utime, stime are fields 14, 15
    t=$((t + f[11] + f[12]))
  done
  echo "$t"
}

# run_wrk KEY URL CONNS WATCH [wrk args...]: warm up, then the measured run into
# $TMP/KEY.wrk; samples CPU of wrk and of each "name=pids" group in WATCH
# (space-separated, pids joined by commas) into $TMP/KEY.cpu.
run_wrk() {
  local key=$1 url=$2 c=$3 watch=$4; shift 4
  local tool=wrk; [ "${RATE:-}" ] && tool=$WRK2
  "$tool" -t"$THREADS" -c"$c" -d"${WARMUP}s" -s "$TMP/status.lua" "$@" "$url" >"$TMP/$key.warm" 2>&1 ||
    { cat "$TMP/$key.warm" >&2; die "wrk warm-up for $key failed"; }
  "$tool" -t"$THREADS" -c"$c" -d"${DURATION}s" --latency "$@" "$url" >"$TMP/$key.wrk" 2>&1 &
  local wpid=$!
  PIDS+=("$wpid")
  # CPU of each process from 0.5 s in to 0.5 s before the end
  sleep 0.5
  local g names=() before=() after=() t0 t1
  for g in wrk="$wpid" $watch; do names+=("$g"); before+=("$(gticks "$g")"); done
  t0=$(date +%s.%N)
  sleep $((DURATION - 1))
  t1=$(date +%s.%N)
  local i pct out=""
  : >"$TMP/$key.cpuv"
  for i in "${!names[@]}"; do
    g=${names[$i]}
    after[i]=$(gticks "$g")
    pct=$(awk -v a="${before[$i]}" -v b="${after[$i]}" -v t0="$t0" -v t1="$t1" -v hz="$CLK" \
      'BEGIN { printf "%.0f", (b - a) / hz / (t1 - t0) * 100 }')
    out+="${g%%=*} $pct%, "
    echo "${g%%=*} $pct" >>"$TMP/$key.cpuv"
  done
  echo "${out%, }" >"$TMP/$key.cpu"
  wait "$wpid" || { cat "$TMP/$key.wrk" >&2; die "wrk run for $key failed"; }
  parse "$TMP/$key.wrk" >"$TMP/$key.parsed"
}
res() { cat "$TMP/$1.parsed"; } # res KEY -> the parsed figures of a run
# per_call KEY RPS: CPU time of the proxy under test per call (nginx or wxgate), "-" for direct
per_call() {
  awk -v r="$2" '$1 == "wxgate" || $1 == "nginx-proxy" { printf "%.1f µs", $2 / 100 * 1e6 / r; f = 1 }
    END { if (!f) printf "-" }' "$TMP/$1.cpuv"
}

# parse FILE -> "rps p50_us p99_us requests non2xx socket_errors"
parse() {
  awk '
    function us(v) { if (v ~ /us$/) return v + 0; if (v ~ /ms$/) return v * 1000;
                     if (v ~ /m$/) return v * 60e6; if (v ~ /s$/) return v * 1e6; return v + 0 }
    /^ *50(\.0+)?%/ { p50 = us($2) }
    /^ *99(\.0+)?%/ { p99 = us($2) }
    / requests in / { req = $1 }
    /Non-2xx or 3xx responses:/ { non = $NF }
    /Socket errors:/ { gsub(",", ""); serr = $4 + $6 + $8 + $10 }
    /^Requests\/sec:/ { rps = $2 }
    END { if (rps == "") exit 1; printf "%s %d %d %d %d %d\n", rps, p50, p99, req, non, serr }' "$1" ||
    { cat "$1" >&2; die "could not parse wrk output $1"; }
}
fmt_us() { awk -v u="$1" 'BEGIN { if (u < 0) { s = "-"; u = -u } else s = "";
  if (u >= 1000) printf "%s%.2f ms", s, u / 1000; else printf "%s%d µs", s, u }'; }
fmt_add() { if awk -v u="$1" 'BEGIN { exit !(u >= 0) }'; then echo "+$(fmt_us "$1")"; else fmt_us "$1"; fi; }

# --- targets ------------------------------------------------------------------------

alloc_port WX_MEM_PORT
alloc_port WX_REDIS_PORT
alloc_port WX_REDIS1_PORT
alloc_port WX_REJECT_PORT
alloc_port WX_REJECTNC_PORT
alloc_port WX_SPENT_PORT
alloc_port WX_SPENTNC_PORT
# redis_store PREFIX [EXTRA_TOML]: the [store] body of a Redis target
redis_store() {
  printf 'kind = "redis"\nurl = "redis://127.0.0.1:%s"\ntimeout = "1s"\nkey_prefix = "%s"\n%s' \
    "$REDIS_PORT" "$1" "${2:-}"
}
wxgate_config memory "$WX_MEM_PORT" 'kind = "memory"' "$NEVER"
wxgate_config redis "$WX_REDIS_PORT" "$(redis_store bench4)" "$NEVER"
wxgate_config redis1 "$WX_REDIS1_PORT" "$(redis_store bench4b 'batch = false')" "$NEVER"

NAMES=([1]="direct (mock upstream)" [2]="nginx proxy_pass" [3]="wxgate, memory store"
       [4]="wxgate, Redis store" [5]="wxgate, Redis, batch = false (1 EVALSHA per call)"
       [6]="wxgate, Redis, rejects ~90 %" [7]="wxgate, Redis, rejects ~90 %, refusal_cache = false"
       [8]="wxgate, Redis, day quota spent" [9]="wxgate, Redis, day quota spent, refusal_cache = false")
UPW="upstream=$UP_WORKERS"
NGXW="nginx-proxy=$NGX_WORKERS"
REDISW="redis=$REDIS_PID"
declare -A EVALSHA

evalsha_calls() { redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' |
  awk -F'[=,:]' '/^cmdstat_evalsha:/ { print $3; f = 1 } END { if (!f) print 0 }'; }

# target KEY N CONNS: pass-1/2 run of target N (its proxy must be running)
target() {
  local key=$1 n=$2 c=$3; shift 3
  local url watch
  case $n in
    1) url="http://127.0.0.1:$UP_PORT$REQ_PATH"; watch="$UPW" ;;
    2) url="http://127.0.0.1:$NGX_PORT$REQ_PATH"; watch="$NGXW $UPW" ;;
    3) url="http://127.0.0.1:$WX_MEM_PORT$REQ_PATH"; watch="wxgate=$WX_PID $UPW" ;;
    4) url="http://127.0.0.1:$WX_REDIS_PORT$REQ_PATH"; watch="wxgate=$WX_PID $UPW $REDISW" ;;
    5) url="http://127.0.0.1:$WX_REDIS1_PORT$REQ_PATH"; watch="wxgate=$WX_PID $UPW $REDISW" ;;
    6) url="http://127.0.0.1:$WX_REJECT_PORT$REQ_PATH"; watch="wxgate=$WX_PID $UPW $REDISW" ;;
    7) url="http://127.0.0.1:$WX_REJECTNC_PORT$REQ_PATH"; watch="wxgate=$WX_PID $UPW $REDISW" ;;
    8) url="http://127.0.0.1:$WX_SPENT_PORT$REQ_PATH"; watch="wxgate=$WX_PID $UPW $REDISW" ;;
    9) url="http://127.0.0.1:$WX_SPENTNC_PORT$REQ_PATH"; watch="wxgate=$WX_PID $UPW $REDISW" ;;
  esac
  log "$key: ${NAMES[$n]} (-c$c${RATE:+ -R$RATE}${PACE:+, pace ${PACE} ms})"
  redis-cli -p "$REDIS_PORT" config resetstat >/dev/null
  run_wrk "$key" "$url" "$c" "$watch" "$@"
  EVALSHA[$key]=$(evalsha_calls)   # warm-up + measured run
}

# Pass 1: each target at full load.
target p1_direct 1 "$CONNS"
target p1_nginx 2 "$CONNS"
start_wxgate memory "$WX_MEM_PORT"; target p1_memory 3 "$CONNS"
if [ "$PERF" = 1 ]; then
  # An extra, unreported run of target 3 under `perf record` (perf slows it).
  log "perf: profiling wxgate (memory store) under full load"
  wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" "http://127.0.0.1:$WX_MEM_PORT$REQ_PATH" >/dev/null 2>&1 &
  PIDS+=("$!")
  perf record -q -g -F 499 -o "$TMP/perf.data" -p "$WX_PID" -- sleep $((DURATION - 1)) >"$TMP/perf.log" 2>&1 ||
    log "perf record failed: $(tail -1 "$TMP/perf.log")"
  wait "$!" || true
fi
stop_pid "$WX_PID"
start_wxgate redis "$WX_REDIS_PORT"; target p1_redis 4 "$CONNS"; stop_pid "$WX_PID"
start_wxgate redis1 "$WX_REDIS1_PORT"; target p1_redis1 5 "$CONNS"; stop_pid "$WX_PID"

# Targets 6 and 7: a limit at ~10 % of what target 4 achieved, burst 1.
read -r RATE4 _ <<<"$(res p1_redis)"
LIMIT5=$(awk -v r="$RATE4" 'BEGIN { x = r * 0.1; c = int(x); if (c < x) c++; if (c < 1) c = 1; print c }')
RATE5="[{ count = $LIMIT5, per = \"1s\", burst = 1 }]"
wxgate_config reject "$WX_REJECT_PORT" "$(redis_store bench5)" "$RATE5"
wxgate_config rejectnc "$WX_REJECTNC_PORT" "$(redis_store bench5b 'refusal_cache = false')" "$RATE5"
start_wxgate reject "$WX_REJECT_PORT"; target p1_reject 6 "$CONNS"; stop_pid "$WX_PID"
start_wxgate rejectnc "$WX_REJECTNC_PORT"; target p1_rejectnc 7 "$CONNS"; stop_pid "$WX_PID"

# Targets 8 and 9: a day quota of 1, spent by the first call of the warm-up.
SPENT='[{ count = 1, per = "day" }]'
wxgate_config spent "$WX_SPENT_PORT" "$(redis_store bench8)" "$SPENT"
wxgate_config spentnc "$WX_SPENTNC_PORT" "$(redis_store bench9 'refusal_cache = false')" "$SPENT"
start_wxgate spent "$WX_SPENT_PORT"; target p1_spent 8 "$CONNS"; stop_pid "$WX_PID"
start_wxgate spentnc "$WX_SPENTNC_PORT"; target p1_spentnc 9 "$CONNS"; stop_pid "$WX_PID"

# Pass 2: targets 1-5 at ~half the slowest full-load rate of 1-4.
MINRATE=$(for k in direct nginx memory redis; do res "p1_$k"; done | awk '{ print $1 }' | sort -g | head -1)
HALF=$(awk -v r="$MINRATE" 'BEGIN { printf "%d", r / 2 }')
((HALF >= 1)) || die "measured rates are too low for pass 2"
if [ -n "$WRK2" ]; then
  RATE=$HALF; C2=$CONNS; EXTRA=(-R "$RATE")
  PASS2_HOW="wrk2 -R $RATE (constant request rate, $C2 connections)"
else
  # Closed loop with a pause after each answer: C2 connections x 1000/PACE ms.
  PACE=$((CONNS * 1000 / HALF)); ((PACE >= 1)) || PACE=1
  C2=$(((HALF * PACE + 999) / 1000)); ((C2 >= THREADS)) || C2=$THREADS
  EXTRA=(-s "$TMP/pace.lua")
  export WRK_PACE_MS=$PACE
  PASS2_HOW="wrk2 is not available (not packaged in Debian), so wrk paces itself: $C2 connections, each pausing ${PACE} ms after every answer (wrk's Lua delay() hook, excluded from latency), for ≤ $HALF requests/s offered; still closed-loop, so a slower target is offered slightly less"
fi
target p2_direct 1 "$C2" "${EXTRA[@]}"
target p2_nginx 2 "$C2" "${EXTRA[@]}"
start_wxgate memory "$WX_MEM_PORT"; target p2_memory 3 "$C2" "${EXTRA[@]}"; stop_pid "$WX_PID"
start_wxgate redis "$WX_REDIS_PORT"; target p2_redis 4 "$C2" "${EXTRA[@]}"; stop_pid "$WX_PID"
start_wxgate redis1 "$WX_REDIS1_PORT"; target p2_redis1 5 "$C2" "${EXTRA[@]}"; stop_pid "$WX_PID"
unset RATE PACE

if [ "$PERF" = 1 ] && [ -f "$TMP/perf.data" ]; then
  { echo "by binary:"
    perf report -i "$TMP/perf.data" --stdio --no-children --sort dso -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -6
    echo "top symbols (self time):"
    perf report -i "$TMP/perf.data" --stdio --no-children --sort dso,sym -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -30
  } >"$TMP/perf.txt" || true
fi

# --- report -------------------------------------------------------------------------

report() {
  local k n rps p50 p99 req non serr
  read -r NGX_RPS _ <<<"$(res p1_nginx)"
  read -r _ D50 D99 _ <<<"$(res p1_direct)"
  echo "### Pass 1: full load (wrk -t$THREADS -c$CONNS -d${DURATION}s --latency, after a ${WARMUP} s warm-up)"
  echo
  echo "| # | target | requests/s | vs nginx proxy_pass | p50 | p99 | p50 added over direct | p99 added over direct | non-2xx | proxy CPU per call | CPU (% of one core) |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
  n=0
  for k in direct nginx memory redis redis1 reject rejectnc spent spentnc; do
    n=$((n + 1))
    read -r rps p50 p99 req non serr <<<"$(res p1_$k)"
    printf '| %d | %s | %.0f | %.2f× | %s | %s | %s | %s | %s | %s | %s |\n' "$n" "${NAMES[$n]}" "$rps" \
      "$(awk -v a="$rps" -v b="$NGX_RPS" 'BEGIN { print a / b }')" "$(fmt_us "$p50")" "$(fmt_us "$p99")" \
      "$(fmt_add $((p50 - D50)))" "$(fmt_add $((p99 - D99)))" \
      "$non$( ((serr)) && echo " (+$serr socket errors)")" "$(per_call "p1_$k" "$rps")" "$(cat "$TMP/p1_$k.cpu")"
  done
  echo
  read -r rps _ _ req non _ <<<"$(res p1_reject)"
  echo "Targets 6 and 7: limit \`{ count = $LIMIT5, per = \"1s\", burst = 1 }\` (ceil of 10 % of target 4's $(printf %.0f "$RATE4") requests/s)."
  echo "**Target 6 refused (non-2xx, 429 fraction): $non of $req = $(awk -v a="$non" -v b="$req" 'BEGIN { printf "%.1f", 100 * a / b }') %**;" \
    "admitted $(awk -v a="$req" -v b="$non" -v d="$DURATION" -v l="$LIMIT5" \
      'BEGIN { printf "%.0f/s = %.0f %% of the limit", (a - b) / d, 100 * (a - b) / d / l }')" \
    "(burst = 1 gives the GCRA no tolerance: an admission that comes a little late loses the rest of its slot)."
  echo "Warm-up answers by status (wrk Lua counter): target 6 $(grep -h '^status:' "$TMP/p1_reject.warm" | sed 's/status: //');" \
    "target 7 $(grep -h '^status:' "$TMP/p1_rejectnc.warm" | sed 's/status: //');" \
    "targets 8, 9 $(grep -h '^status:' "$TMP/p1_spent.warm" | sed 's/status: //'), $(grep -h '^status:' "$TMP/p1_spentnc.warm" | sed 's/status: //');" \
    "targets 1-5 $(cat "$TMP"/p1_{direct,nginx,memory,redis,redis1}.warm | awk '/^status:/ { split($2, a, "="); split($3, b, "="); split($4, c, "=");
      ok += a[2]; r += b[2]; o += c[2] } END { printf "200=%d 429=%d other=%d", ok, r, o }')."
  echo
  echo "Redis per target (warm-up + measured run):"
  echo
  echo "| # | target | EVALSHA calls | requests | Redis CPU per call |"
  echo "|---|---|---:|---:|---:|"
  local i=3
  for k in redis redis1 reject rejectnc spent spentnc; do
    i=$((i + 1))
    read -r rps _ _ req _ <<<"$(res p1_$k)"
    local wreq; wreq=$(awk '/ requests in / { print $1 }' "$TMP/p1_$k.warm")
    printf '| %d | %s | %s | %s | %s |\n' "$i" "${NAMES[$i]}" "${EVALSHA[p1_$k]}" "$((req + wreq))" \
      "$(awk -v r="$rps" '$1 == "redis" { printf "%.1f µs", $2 / 100 * 1e6 / r }' "$TMP/p1_$k.cpuv")"
  done
  echo
  echo "### Pass 2: moderate load (≈ half of the slowest full-load rate of targets 1-4, $HALF requests/s)"
  echo
  echo "How: $PASS2_HOW."
  echo
  echo "| # | target | requests/s | p50 | p99 | p50 added over direct | p99 added over direct | CPU (% of one core) |"
  echo "|---|---|---:|---:|---:|---:|---:|---|"
  read -r _ D50 D99 _ <<<"$(res p2_direct)"
  n=0
  for k in direct nginx memory redis redis1; do
    n=$((n + 1))
    read -r rps p50 p99 req non serr <<<"$(res p2_$k)"
    printf '| %d | %s | %.0f | %s | %s | %s | %s | %s |\n' "$n" "${NAMES[$n]}" "$rps" "$(fmt_us "$p50")" \
      "$(fmt_us "$p99")" "$(fmt_add $((p50 - D50)))" "$(fmt_add $((p99 - D99)))" "$(cat "$TMP/p2_$k.cpu")"
  done
  echo
  echo "Notes:"
  echo "- All processes share one $(nproc)-core machine: wrk ($THREADS threads), the proxy under test, the mock"
  echo "  upstream (nginx, worker_processes 1, as is the nginx proxy) and Redis. The numbers compare CPU cost"
  echo "  per call as much as capacity, and are noisy; rerun before trusting a few-% difference."
  echo "- Access logs are off everywhere (wxgate \`[log] access = false\`, nginx \`access_log off\`): one log"
  echo "  line per call would dominate the cost. wxgate runs with WXGATE_LOG=warn, admin listener off."
  echo "- CPU is sampled from /proc over the measured run (100 % = one core); wxgate/nginx figures cover"
  echo "  the proxy process (nginx: its worker), upstream = the mock's nginx worker. \"proxy CPU per call\""
  echo "  is the proxy's CPU time divided by the calls it answered."
  echo "- At full load the machine is saturated and wrk queues too: target 1's tail includes wrk's own"
  echo "  queueing at ~1.5x the rate, so an \"added\" p99 can come out negative in pass 1. Pass 2 is the"
  echo "  fairer latency comparison."
  local w; w=$(cat "$TMP"/{memory,redis,redis1,reject,rejectnc,spent,spentnc}.log 2>/dev/null | grep -c . || true)
  echo "- wxgate wrote $w log lines at level warn during the runs."
}

TABLE=$(report)
echo
echo "$TABLE"

# --- results file -------------------------------------------------------------------

mkdir -p "$REPO/bench/results"
OUT="$REPO/bench/results/$(date -u +%Y-%m-%d)-$(hostname -s).md"
COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$(git -C "$REPO" status --porcelain -- src lua Cargo.toml Cargo.lock 2>/dev/null)" ] &&
  COMMIT+=" (with uncommitted changes in src/, lua/ or Cargo.*)"
{
  echo "# wxgate benchmark, $(date -u)"
  echo
  echo "Produced by \`bench/run.sh\` (BENCH_DURATION=$DURATION BENCH_CONNECTIONS=$CONNS BENCH_THREADS=$THREADS)."
  echo
  echo "| | |"
  echo "|---|---|"
  echo "| date | $(date -u) |"
  echo "| host | $(hostname -s) |"
  echo "| nproc | $(nproc) |"
  echo "| memory | $(free -h | awk '/^Mem:/ { print $2 }') |"
  echo "| CPU | $(lscpu | sed -n 's/^Model name: *//p' | head -1) |"
  echo "| kernel | $(uname -r) |"
  echo "| nginx | $(nginx -v 2>&1 | sed 's/^nginx version: //') |"
  echo "| wrk | $(wrk -v 2>&1 | head -1 | awk '{ print $1, $2 }')${WRK2:+; wrk2 $WRK2} |"
  echo "| redis-server | $(redis-server --version | head -1) |"
  echo "| wxgate | $COMMIT |"
  echo
  echo "$TABLE"
  echo
  if [ -f "$TMP/perf.txt" ]; then
    echo "### perf: wxgate during an extra run of target 3 (cpu-clock samples, self time)"
    echo
    echo '```'
    cat "$TMP/perf.txt"
    echo '```'
    echo
  fi
  echo "<details><summary>raw wrk output</summary>"
  echo
  for f in "$TMP"/p[12]_*.wrk; do
    echo "#### $(basename "$f" .wrk)"
    echo
    echo '```'
    cat "$f"
    echo '```'
  done
  echo "</details>"
} >"$OUT"
log "results saved to $OUT"
