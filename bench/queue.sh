#!/usr/bin/env bash
# Queued delivery (issue 47), on the profiling build, one run each:
#
#   1. submissions/s (202s) of one core (`[server] workers = 1`, wxgate
#      pinned alone on CPU BENCH_PROXY_CPU when the machine has 2 CPUs):
#      wrk POSTs of a 500-byte body with `Prefer: respond-async`, 1 and 32
#      connections, BENCH_SECONDS (20) each, on the embedded store (SQLite)
#      and on Redis, with wxgate's CPU (and Redis') from /proc;
#   2. storage per queued job (500-byte body) over BENCH_JOBS (100,000) jobs:
#      the SQLite file (with its -wal) and Redis' `used_memory` delta;
#   3. BENCH_BIG (1,000,000) jobs in the SQLite file: its size, and wxgate's
#      start-up time (exec to /readyz 200) and RSS with them in it. Filled
#      through wxgate; if the measured 32-connection rate says the fill would
#      take more than BENCH_FILL_MAX seconds (600), 200,000 are stored instead
#      and the report says so (size scales per job; start-up is measured);
#   4. instructions (callgrind, wxgate's user space, all its threads) of a
#      live call and of a queued message (submitted, stored, dispatched and
#      sent), memory store + SQLite, BENCH_LIVE (1000) sequential live calls
#      and BENCH_QUEUED (300) queued messages after a warm-up.
#
# The queue's rule has a day quota of 1 in 1-3: the dispatcher sends the
# first job and every later one waits for the quota day's midnight, so 1-3
# measure intake and storage, not sends. In 4 its limits never throttle and
# every job is sent to the mock (nginx answering the token endpoint and
# every message send with errcode 0).
#
# Everything listens on 127.0.0.1 only, in a temp directory, and is stopped
# on exit; every wait is bounded. Needs nginx, wrk, redis-server, redis-cli,
# curl, valgrind (installed with apt-get when missing and we are root).
# Writes bench/results/<date>-<host>-BENCH_NAME.md (default name
# "queue"; a file of that name already there is kept: -2, -3, ... added).
#
#   bench/queue.sh
#   BENCH_NAME=issue47-queue BENCH_SKIP=4 bench/queue.sh   # BENCH_SKIP: items not run
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
export PATH="$PATH:/usr/sbin:/sbin"
REPO=$(pwd)

SECONDS_RUN=${BENCH_SECONDS:-20}
JOBS=${BENCH_JOBS:-100000}
BIG=${BENCH_BIG:-1000000}
FILL_MAX=${BENCH_FILL_MAX:-600}
LIVE=${BENCH_LIVE:-1000}
QUEUED=${BENCH_QUEUED:-300}
PROXY_CPU=${BENCH_PROXY_CPU:-0}
SKIP=" ${BENCH_SKIP:-} "
NAME=${BENCH_NAME:-queue}
for v in SECONDS_RUN JOBS BIG FILL_MAX LIVE QUEUED PROXY_CPU; do
  [[ ${!v} =~ ^[0-9]+$ ]] && { [ "$v" = PROXY_CPU ] || ((${!v} > 0)); } || { echo "bench: $v must be a positive whole number" >&2; exit 2; }
done
run_item() { [[ $SKIP != *" $1 "* ]]; }
log() { printf '== %s\n' "$*" >&2; }
die() { printf 'bench: ERROR: %s\n' "$*" >&2; exit 1; }

missing=()
command -v nginx >/dev/null || missing+=(nginx)
command -v wrk >/dev/null || missing+=(wrk)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v curl >/dev/null || missing+=(curl)
command -v valgrind >/dev/null || missing+=(valgrind)
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    die "missing tools: ${missing[*]}"
  fi
fi

log "building wxgate (cargo build --profile profiling --locked)"
cargo build --profile profiling --locked >&2
WXGATE=$REPO/target/profiling/wxgate
COMMIT=$(git rev-parse --short HEAD)

# Pinning: wxgate (every thread: the SQLite writer too) alone on one CPU,
# wrk, nginx and Redis on the others.
PIN=()
OTHER=()
if (($(nproc) >= 2)) && command -v taskset >/dev/null; then
  others=$(seq 0 $(($(nproc) - 1)) | grep -vx "$PROXY_CPU" | paste -sd,)
  PIN=(taskset -c "$PROXY_CPU")
  OTHER=(taskset -c "$others")
fi

bench_tmp queue
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
UP=$(free_port); RP=$(free_port); WP=$(free_port); AP=$(free_port)
TICK=$(getconf CLK_TCK)

# The mock WeChat: the token endpoint and every message send answered.
BENCH_BODY='{"errcode":0,"errmsg":"ok","msgid":1}'
bench_nginx_mock "127.0.0.1:$UP" "$TMP/nginx.pid" "$TMP/nginx-error.log" >"$TMP/nginx.conf"
"${OTHER[@]}" nginx -c "$TMP/nginx.conf" -p "$TMP" & PIDS+=($!)
"${OTHER[@]}" redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" >/dev/null & PIDS+=($!)
REDIS_PID=$!
for _ in $(seq 100); do
  redis-cli -p "$RP" ping >/dev/null 2>&1 && curl -s -o /dev/null "http://127.0.0.1:$UP/" && break
  sleep 0.1
done
redis-cli -p "$RP" ping >/dev/null || die "redis-server did not start"

export WXGATE_TOKEN_KEY=5f0c9a3e7b2d4f6a8c1e3b5d7f9a0c2e4b6d8f1a3c5e7b9d0f2a4c6e8b1d3f5a  # Redis: the shared token cache
printf 'BENCHSECRET\n' >"$TMP/bench.secret"
chmod 600 "$TMP/bench.secret"
APPID=wxbench00000001
URL="http://127.0.0.1:$WP/@$APPID/cgi-bin/message/template/send"

# A 500-byte JSON body.
BODY_HEAD='{"touser":"OPENID","template_id":"TEMPLATE_ID","data":{"thing1":{"value":"'
BODY_TAIL='"}}}'
fill=$((500 - ${#BODY_HEAD} - ${#BODY_TAIL}))
BODY=$BODY_HEAD$(head -c "$fill" /dev/zero | tr '\0' x)$BODY_TAIL
((${#BODY} == 500)) || die "body is ${#BODY} bytes"
printf '%s' "$BODY" >"$TMP/body.json"

# wrk: POST + Prefer, counting 202s and the rest; with QUEUE_STOP=FILE it
# creates FILE at the first answer that is not 202 (the queue's bound
# reached), and wrk_submit then stops it (SIGINT: wrk prints its summary).
cat >"$TMP/submit.lua" <<EOF
wrk.method = "POST"
wrk.body = [[$BODY]]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Prefer"] = "respond-async"
local threads = {}
function setup(thread) table.insert(threads, thread) end
accepted = 0
other = 0
local stop = os.getenv("QUEUE_STOP")
function response(status, headers, body)
  if status == 202 then accepted = accepted + 1 else
    other = other + 1
    if stop and stop ~= "" and other == 1 then io.open(stop, "w"):close() end
  end
end
function done(summary, latency, requests)
  local a, o = 0, 0
  for _, t in ipairs(threads) do a = a + t:get("accepted"); o = o + t:get("other") end
  io.write(string.format("accepted %d\nother %d\n", a, o))
end
EOF

DAY1='[{ count = 1, per = "day" }]'
# gate_toml STORE LIMITS JOBS_BOUND: a config in $TMP/wxgate.toml. STORE:
# memory (jobs in $RUN/queue.db) or redis; JOBS_BOUND: caller_jobs and
# account_jobs.
gate_toml() {
  local store queue
  if [ "$1" = memory ]; then
    store=$(printf 'kind = "memory"\nstate_file = "%s/state"' "$RUN")
    queue="file = \"$RUN/queue.db\""
  else
    store=$(printf 'kind = "redis"\nurl = "redis://127.0.0.1:%s"\ntimeout = "2s"' "$RP")
    queue=""
  fi
  cat >"$TMP/wxgate.toml" <<EOF2
[server]
listen = "127.0.0.1:$WP"
admin_listen = "127.0.0.1:$AP"
upstream = "http://127.0.0.1:$UP"
workers = 1

[store]
$store

[log]
access = false

[queue]
$queue
caller_jobs = $3
account_jobs = $3
caller_bytes = "16GiB"
account_bytes = "16GiB"

[[rule]]
name = "bench"
match = ["/cgi-bin/message/template/send"]
limits = $2
queue = true

[[account]]
id = "$APPID"
kind = "official_account"
secret_file = "$TMP/bench.secret"
EOF2
}

# start [PREFIX...]: wxgate (or PREFIX wxgate) in the background: GATE its
# pid, STARTUP_MS exec to /readyz 200 (polled every 10 ms, 120 s at most).
start() {
  local t0 t1 code
  t0=$(date +%s%N)
  "$@" "$WXGATE" --config "$TMP/wxgate.toml" 2>>"$TMP/wxgate.log" &
  GATE=$!
  PIDS+=("$GATE")
  for _ in $(seq 12000); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$AP/readyz" || true)
    [ "$code" = 200 ] && break
    kill -0 "$GATE" 2>/dev/null || { tail -20 "$TMP/wxgate.log" >&2; die "wxgate exited at start"; }
    sleep 0.01
  done
  [ "$code" = 200 ] || { tail -20 "$TMP/wxgate.log" >&2; die "wxgate not ready in 120 s"; }
  t1=$(date +%s%N)
  STARTUP_MS=$(((t1 - t0) / 1000000))
}
# stop: SIGINT (graceful), 60 s at most, then SIGKILL.
stop() {
  kill -INT "$GATE" 2>/dev/null || true
  for _ in $(seq 600); do kill -0 "$GATE" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$GATE" 2>/dev/null || true
  wait "$GATE" 2>/dev/null || true
  unset 'PIDS[-1]'
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
# one queued submission (curl): its status
submit_one() { curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -H 'Prefer: respond-async' --data-binary @"$TMP/body.json" "$URL"; }
# count_jobs COUNTER: a sum of the default caller's queues' counters (jq-free)
count_jobs() {
  curl -s "http://127.0.0.1:$WP/v1/deliveries" |
    python3 -c "import json,sys; print(sum(q['$1'] for q in json.load(sys.stdin)['queues']))"
}
# wrk_submit CONNECTIONS SECONDS [stop]: ACCEPTED, OTHER, WALL (s) of the run
wrk_submit() {
  local t0 t1
  t0=$(date +%s%N)
  local marker="" w
  [ "${3:-}" = stop ] && marker=$TMP/refused && rm -f "$marker"
  QUEUE_STOP=$marker "${OTHER[@]}" \
    wrk -t1 -c"$1" -d"$2s" --timeout 10s --latency -s "$TMP/submit.lua" "$URL" >"$TMP/wrk.out" 2>&1 &
  w=$!
  if [ -n "$marker" ]; then   # until the first refusal (or wrk's own end at -d)
    while kill -0 "$w" 2>/dev/null && ! [ -e "$marker" ]; do sleep 0.2; done
    kill -INT "$w" 2>/dev/null || true
  fi
  wait "$w" || true
  t1=$(date +%s%N)
  WALL=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", (b - a) / 1e9}')
  ACCEPTED=$(awk '/^accepted/ {print $2}' "$TMP/wrk.out")
  OTHER_N=$(awk '/^other/ {print $2}' "$TMP/wrk.out")
  [[ $ACCEPTED =~ ^[0-9]+$ ]] || { cat "$TMP/wrk.out" >&2; die "wrk gave no count"; }
  log "  wrk -c$1: $ACCEPTED 202, $OTHER_N other, $WALL s"
}
fresh() { # fresh STORE: a new run directory, Redis flushed
  RUN=$(mktemp -d "$TMP/run.XXXX")
  redis-cli -p "$RP" flushall >/dev/null
}
kib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1024}'; }
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
fsize() { local s=0 f; for f in "$@"; do [ -f "$f" ] && s=$((s + $(stat -c %s "$f"))); done; echo "$s"; }

OUT=$TMP/report.md
: >"$OUT"
STARTED=$(date -u '+%Y-%m-%d %H:%M')

# --- 1. submissions per second --------------------------------------------
RATE32_SQLITE=0
if run_item 1; then
  log "1. submissions/s, ${SECONDS_RUN} s per run"
  {
    echo "### 1. Submissions per second, one core (\`workers = 1\`)"
    echo
    echo "wrk -t1, ${SECONDS_RUN} s per row (no warm-up beyond the readiness probe), a 500-byte JSON body with \`Prefer: respond-async\` to a rule with \`queue = true\` and a day quota of 1 (the dispatcher sends the first job, every later one waits for the quota day's midnight: intake only). Each row on a fresh store. CPU: wxgate's (all its threads, the SQLite writer among them) and Redis' user+system time over the run, from /proc/<pid>/stat, as a share of one core; µs per 202 = that time / 202s."
    echo
    echo "| store | connections | 202/s | other answers | wxgate CPU | wxgate µs per 202 | Redis CPU | p50 | p99 |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  } >>"$OUT"
  for store in memory redis; do
    for c in 1 32; do
      fresh
      gate_toml "$store" "$DAY1" 100000000
      start "${PIN[@]}"
      g0=$(cpu_ticks "$GATE"); r0=$(cpu_ticks "$REDIS_PID")
      wrk_submit "$c" "$SECONDS_RUN"
      g1=$(cpu_ticks "$GATE"); r1=$(cpu_ticks "$REDIS_PID")
      stop
      rate=$(awk -v n="$ACCEPTED" -v s="$SECONDS_RUN" 'BEGIN {printf "%.0f", n / s}')
      gcpu=$(awk -v d=$((g1 - g0)) -v t="$TICK" -v s="$SECONDS_RUN" 'BEGIN {printf "%.0f %%", 100 * d / t / s}')
      gus=$(awk -v d=$((g1 - g0)) -v t="$TICK" -v n="$ACCEPTED" 'BEGIN {printf "%.1f", n ? 1e6 * d / t / n : 0}')
      rcpu=–
      [ "$store" = redis ] && rcpu=$(awk -v d=$((r1 - r0)) -v t="$TICK" -v s="$SECONDS_RUN" 'BEGIN {printf "%.0f %%", 100 * d / t / s}')
      p50=$(awk '$1 == "50%" {print $2}' "$TMP/wrk.out"); p99=$(awk '$1 == "99%" {print $2}' "$TMP/wrk.out")
      label=$([ "$store" = memory ] && echo "embedded (SQLite)" || echo Redis)
      printf '| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n' "$label" "$c" "$rate" "$OTHER_N" "$gcpu" "$gus" "$rcpu" "$p50" "$p99" >>"$OUT"
      log "  $store c=$c: $rate/s ($ACCEPTED 202, $OTHER_N other), wxgate $gcpu"
      [ "$store" = memory ] && ((c == 32)) && RATE32_SQLITE=$rate
    done
  done
  echo >>"$OUT"
fi

# --- 2. storage per job -----------------------------------------------------
if run_item 2; then
  log "2. storage per job, $JOBS jobs"
  {
    echo "### 2. Storage per queued job (500-byte body), $JOBS jobs"
    echo
    echo "Filled through wxgate (wrk, 32 connections) up to \`caller_jobs = $JOBS\` (wrk stops at the first 429 \`queue_full\`); the rule's day quota of 1 sends the first job, so the store holds $JOBS unfinished jobs plus that one sent (all counted, from \`GET /v1/deliveries\`). SQLite: the file and its \`-wal\` (and \`-shm\`) while wxgate runs, and after a graceful stop (SIGINT: SQLite checkpoints the WAL into the file and removes it), against the same files of the empty store right after start. Redis: \`INFO memory\` \`used_memory\` after the fill against after start (Redis flushed before)."
    echo
    echo "| store | jobs stored | empty | after the fill | per job |"
    echo "|---|---:|---:|---:|---:|"
  } >>"$OUT"
  fresh
  gate_toml memory "$DAY1" "$JOBS"
  start "${PIN[@]}"
  db=$RUN/queue.db
  empty=$(fsize "$db" "$db-wal" "$db-shm")
  wrk_submit 32 "$((FILL_MAX * 2))" stop
  n=$(( $(count_jobs queued) + $(count_jobs waiting) + $(count_jobs sent) + $(count_jobs sending) ))
  running=$(fsize "$db" "$db-wal" "$db-shm")
  wal_running=$(fsize "$db-wal")
  stop
  after=$(fsize "$db" "$db-wal" "$db-shm")
  printf '| SQLite, running (file + -wal %s MiB + -shm) | %d | %s KiB | %s MiB | %d bytes |\n' "$(mib "$wal_running")" "$n" "$(kib "$empty")" "$(mib "$running")" $(((running - empty) / n)) >>"$OUT"
  printf '| SQLite, after a graceful stop (checkpointed) | %d | %s KiB | %s MiB | %d bytes |\n' "$n" "$(kib "$empty")" "$(mib "$after")" $(((after - empty) / n)) >>"$OUT"
  log "  SQLite: $n jobs, $after bytes after stop ($running running)"

  fresh
  gate_toml redis "$DAY1" "$JOBS"
  start "${PIN[@]}"
  used() { redis-cli -p "$RP" info memory | awk -F: '/^used_memory:/ {print $2+0}'; }
  m0=$(used)
  wrk_submit 32 "$((FILL_MAX * 2))" stop
  n=$(( $(count_jobs queued) + $(count_jobs waiting) + $(count_jobs sent) + $(count_jobs sending) ))
  m1=$(used)
  keys=$(redis-cli -p "$RP" dbsize)
  stop
  printf '| Redis `used_memory` (%d keys after) | %d | %s KiB | %s MiB | %d bytes |\n' "$keys" "$n" "$(kib "$m0")" "$(mib "$m1")" $(((m1 - m0) / n)) >>"$OUT"
  log "  Redis: $n jobs, used_memory $m0 -> $m1"
  echo >>"$OUT"
fi

# --- 3. a big queue: file, RSS, start-up ------------------------------------
if run_item 3; then
  N=$BIG
  ((RATE32_SQLITE > 0)) && ((BIG / RATE32_SQLITE > FILL_MAX)) && N=200000
  NOTE="through wxgate (wrk, 32 connections, stopped at the first 429 at \`caller_jobs = $N\`)"
  if ((N < BIG)); then
    NOTE+=": **$N, not $BIG**: at item 1's $RATE32_SQLITE/s, $BIG would take $((BIG / RATE32_SQLITE)) s (over BENCH_FILL_MAX = $FILL_MAX s); the size is extrapolated linearly, the start-up and RSS are those of $N"
  fi
  log "3. $N jobs in the SQLite file"
  fresh
  gate_toml memory "$DAY1" "$N"
  start "${PIN[@]}"
  empty_ms=$STARTUP_MS
  sleep 1
  empty_rss=$(rss_kib "$GATE")
  t0=$(date +%s)
  wrk_submit 32 "$((FILL_MAX * 3))" stop
  fill_s=$(($(date +%s) - t0))
  n=$(( $(count_jobs queued) + $(count_jobs waiting) + $(count_jobs sent) + $(count_jobs sending) ))
  filled_rss=$(rss_kib "$GATE")
  stop
  db=$RUN/queue.db
  size=$(fsize "$db" "$db-wal" "$db-shm")
  start "${PIN[@]}"
  big_ms=$STARTUP_MS
  big_rss=$(rss_kib "$GATE")
  sleep 2
  big_rss2=$(rss_kib "$GATE")
  list_ms=$(curl -s -o /dev/null -w '%{time_total}' "http://127.0.0.1:$WP/v1/deliveries" | awk '{printf "%.0f", $1 * 1000}')
  listed=$(count_jobs queued)
  code=$(submit_one)
  stop
  start "${PIN[@]}"   # a second start: the file now in the page cache for sure
  big_ms2=$STARTUP_MS
  stop
  {
    echo "### 3. $n queued jobs in the embedded store"
    echo
    echo "Filled $NOTE in $fill_s s; the rule's day quota of 1 keeps them queued. Start-up: \`exec\` to the first \`/readyz\` 200 (polled every 10 ms), wxgate pinned as above; the file is in the page cache (just written). RSS: VmRSS from /proc."
    echo
    echo "| | value |"
    echo "|---|---:|"
    echo "| jobs in the file | $n |"
    echo "| file after a graceful stop (with -wal, -shm if any) | $(mib "$size") MiB ($((size / n)) bytes per job) |"
    ((n < BIG)) && echo "| the same extrapolated to $BIG jobs | $(mib $((size * BIG / n))) MiB |"
    echo "| start-up, empty file | $empty_ms ms |"
    echo "| start-up with the $n jobs (first start after the fill; second start) | $big_ms ms; $big_ms2 ms |"
    echo "| RSS after start, empty file (1 s after ready) | $(mib $((empty_rss * 1024))) MiB |"
    echo "| RSS at the end of the fill (same process) | $(mib $((filled_rss * 1024))) MiB |"
    echo "| RSS after start with the $n jobs (at ready; 2 s later) | $(mib $((big_rss * 1024))) MiB; $(mib $((big_rss2 * 1024))) MiB |"
    echo "| \`GET /v1/deliveries\` after that start (curl's time) | $list_ms ms (\`queued\`: $listed) |"
    echo "| a submission after that start | HTTP $code (429 \`queue_full\`: \`caller_jobs = $N\` reached, as it should) |"
    echo
  } >>"$OUT"
  log "  $n jobs: $size bytes, start $big_ms ms (empty $empty_ms), RSS $big_rss KiB"
fi

# --- 4. instructions: a live call against a queued message ------------------
if run_item 4; then
  log "4. instructions (callgrind): $LIVE live calls, $QUEUED queued messages"
  fresh
  gate_toml memory "$BENCH_NEVER" 100000000
  start valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.%p.out"
  VG=$GATE
  hdr=(-s -o /dev/null -w '%{http_code}\n' -H 'Content-Type: application/json' -H 'Expect:' --data-binary @"$TMP/body.json")
  urls() { local i; for ((i = 0; i < $1; i++)); do printf 'url = "%s"\noutput = "/dev/null"\n' "$URL"; done; }
  live() { urls "$1" >"$TMP/urls"; curl "${hdr[@]}" -K "$TMP/urls" | grep -c '^200$' || true; }
  queue_calls() { urls "$1" >"$TMP/urls"; curl "${hdr[@]}" -H 'Prefer: respond-async' -K "$TMP/urls" | grep -c '^202$' || true; }
  # wait_sent N: until N jobs are sent (300 s at most)
  wait_sent() {
    local s=0
    for _ in $(seq 3000); do s=$(count_jobs sent); ((s >= $1)) && return 0; sleep 0.1; done
    die "only $s of $1 queued messages sent in 300 s"
  }
  # dump: the instructions since the last zeroing (all threads)
  dump() {
    rm -f "$TMP"/cg.*
    callgrind_control -d "$VG" >/dev/null 2>&1
    local f=""
    for _ in $(seq 300); do f=$(find "$TMP" -maxdepth 1 -name "cg.$VG.out.*" | head -1); [ -n "$f" ] && break; sleep 0.1; done
    [ -n "$f" ] || die "no callgrind dump"
    sleep 0.5
    grep -m1 '^summary:' "$f" | awk '{print $2}'
  }
  ok=$(live 100); ((ok == 100)) || die "warm-up: $ok of 100 live calls answered 200"
  ok=$(queue_calls 20); ((ok == 20)) || die "warm-up: $ok of 20 queued"
  wait_sent 20
  callgrind_control -z "$VG" >/dev/null 2>&1
  ok=$(live "$LIVE"); ((ok == LIVE)) || die "$ok of $LIVE live calls answered 200"
  live_total=$(dump)
  callgrind_control -z "$VG" >/dev/null 2>&1
  t0=$(date +%s%N)
  ok=$(queue_calls "$QUEUED"); ((ok == QUEUED)) || die "$ok of $QUEUED queued"
  wait_sent $((20 + QUEUED))
  t1=$(date +%s%N)
  queued_total=$(dump)
  callgrind_control -z "$VG" >/dev/null 2>&1
  sleep 2
  idle_total=$(dump)
  stop
  qs=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", (b - a) / 1e9}')
  idle_part=$(awk -v i="$idle_total" -v s="$qs" -v n="$QUEUED" 'BEGIN {printf "%.0f", i / 2 * s / n}')
  {
    echo "### 4. Instructions: a live call against a queued message"
    echo
    echo "wxgate under \`valgrind --tool=callgrind\` (all its threads: the SQLite writer among them), \`workers = 1\`, memory store, jobs in SQLite, a rule with \`queue = true\` and limits that never throttle, the account's token added by wxgate (both kinds of call name the account: \`/@$APPID/\`), the nginx mock answering errcode 0. After 100 live calls and 20 queued messages sent (warm-up), counters zeroed, then: $LIVE sequential live calls (curl, one keep-alive connection, the same 500-byte POST body), dumped; zeroed, $QUEUED sequential submissions with \`Prefer: respond-async\` and a wait until all are \`sent\` (polling \`GET /v1/deliveries\` every 100 ms, those polls counted too), dumped. A queued message's figure is the whole of it: the submission (202), its SQLite writes (fsync'd), the dispatcher's round, the decision, the send and the \`sent\` write."
    echo
    echo "| | instructions |"
    echo "|---|---:|"
    echo "| a live call (500-byte POST, token added) | $((live_total / LIVE)) |"
    echo "| a queued message: submitted, stored, dispatched, sent | $((queued_total / QUEUED)) |"
    echo "| ratio | $(awk -v q=$((queued_total / QUEUED)) -v l=$((live_total / LIVE)) 'BEGIN {printf "%.2f×", q / l}') |"
    echo "| wxgate idle (dispatcher ticks), per second | $((idle_total / 2)) |"
    echo "| of which idle time spread over the queued run ($qs s), per message | ~$idle_part |"
    echo
  } >>"$OUT"
  log "  live $((live_total / LIVE)), queued $((queued_total / QUEUED))"
fi

# --- the results file -------------------------------------------------------
mkdir -p bench/results
base="bench/results/$(date -u +%Y-%m-%d)-$(hostname -s)-$NAME"
file=$base.md
i=2
while [ -e "$file" ]; do file=$base-$i.md; i=$((i + 1)); done
pinned=$([ ${#PIN[@]} -gt 0 ] && echo "wxgate pinned alone on CPU $PROXY_CPU (taskset), wrk, nginx and Redis on the others" || echo "nothing pinned")
{
  echo "# bench/queue.sh: queued delivery (issue 47) at $COMMIT"
  echo
  echo "Command: \`$(compgen -e | grep '^BENCH_' | while read -r v; do printf '%s=%s ' "$v" "${!v}"; done)bench/queue.sh\` ($(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), $STARTED–$(date -u +%H:%M) UTC). Profiling build (\`cargo build --profile profiling\`), $pinned. $(wrk --version 2>&1 | head -1 | cut -d' ' -f1-2), $(redis-server --version | cut -d' ' -f1-3), $(nginx -v 2>&1). One run each: on this shared VM, times move 10-20 % between runs; instruction counts do not."
  echo
  cat "$OUT"
} >"$file"
cat "$file"
log "written: $file"
