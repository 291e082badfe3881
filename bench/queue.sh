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
#      and BENCH_QUEUED (300) queued messages after a warm-up;
#
# and the sends of issue 63 (several in flight per queue), nothing pinned
# (the whole instance, default `workers`), to a python asyncio mock WeChat
# that answers each send after a delay (the round trip) and records when it
# received it and for whom:
#
#   5. the pace of one queue of BENCH_PACE_JOBS (2,000) jobs, each to its own
#      recipient, under a rule of BENCH_PACE_RATE (200)/s, burst
#      BENCH_PACE_BURST (10), at round trips of BENCH_DELAYS ("10 50 150")
#      ms, on SQLite and on Redis: sends a second at the mock from the first
#      to the last, the most in any 1 s, duplicates; with BENCH_BEFORE_BIN
#      (an older wxgate, named BENCH_BEFORE_LABEL) run the same way, given
#      min(jobs, BENCH_BEFORE_SECONDS (15) / round trip) jobs;
#   6. a campaign: BENCH_CAMPAIGN_JOBS (100,000) jobs under a rule of
#      BENCH_CAMPAIGN_RATE (1,000)/s, burst BENCH_CAMPAIGN_BURST (50), two
#      instances on one Redis, half submitted through each, a round trip of
#      BENCH_CAMPAIGN_DELAY (50) ms: drain time against the quota's
#      (jobs / rate), duplicates, the most in any 1 s, CPU of each process;
#      BENCH_PERF=SECONDS adds a perf profile of one instance while draining;
#   7. CPU (wxgate's and Redis' user+system from /proc) per queued send
#      against a live call, BENCH_CPU_CALLS (5,000) of each, SQLite and Redis.
#
# The queue's rule has a day quota of 1 in 1-3: the dispatcher sends the
# first job and every later one waits for the quota day's midnight, so 1-3
# measure intake and storage, not sends. In 4 its limits never throttle and
# every job is sent to the mock (nginx answering the token endpoint and
# every message send with errcode 0).
#
# Everything listens on 127.0.0.1 only, in a temp directory, and is stopped
# on exit; every wait is bounded. Needs nginx, wrk, redis-server, redis-cli,
# curl, valgrind, python3 (installed with apt-get when missing and we are root).
# Writes bench/results/<date>-<host>-BENCH_NAME.md (default name
# "queue"; a file of that name already there is kept: -2, -3, ... added).
#
#   bench/queue.sh
#   BENCH_NAME=issue47-queue BENCH_SKIP=4 bench/queue.sh   # BENCH_SKIP: items not run
#   BENCH_NAME=issue63-queue BENCH_SKIP="2 3 4" BENCH_SECONDS=10 \
#     BENCH_BEFORE_BIN=/tmp/wxgate-old BENCH_BEFORE_LABEL=before bench/queue.sh
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
PACE_JOBS=${BENCH_PACE_JOBS:-2000}
PACE_RATE=${BENCH_PACE_RATE:-200}
PACE_BURST=${BENCH_PACE_BURST:-10}
DELAYS=${BENCH_DELAYS:-10 50 150}
BEFORE_BIN=${BENCH_BEFORE_BIN:-}
BEFORE_LABEL=${BENCH_BEFORE_LABEL:-${BEFORE_BIN:+$(basename "$BEFORE_BIN")}}
BEFORE_SECONDS=${BENCH_BEFORE_SECONDS:-15}
CAMPAIGN_JOBS=${BENCH_CAMPAIGN_JOBS:-100000}
CAMPAIGN_RATE=${BENCH_CAMPAIGN_RATE:-1000}
CAMPAIGN_BURST=${BENCH_CAMPAIGN_BURST:-50}
CAMPAIGN_DELAY=${BENCH_CAMPAIGN_DELAY:-50}
CPU_CALLS=${BENCH_CPU_CALLS:-5000}
PERF=${BENCH_PERF:-}
for v in SECONDS_RUN JOBS BIG FILL_MAX LIVE QUEUED PROXY_CPU PACE_JOBS PACE_RATE PACE_BURST BEFORE_SECONDS CAMPAIGN_JOBS CAMPAIGN_RATE CAMPAIGN_BURST CAMPAIGN_DELAY CPU_CALLS ${PERF:+PERF}; do
  [[ ${!v} =~ ^[0-9]+$ ]] && { [ "$v" = PROXY_CPU ] || ((${!v} > 0)); } || { echo "bench: $v must be a positive whole number" >&2; exit 2; }
done
for d in $DELAYS; do [[ $d =~ ^[0-9]+$ ]] || { echo "bench: BENCH_DELAYS must be whole milliseconds" >&2; exit 2; }; done
[ -z "$BEFORE_BIN" ] || [ -x "$BEFORE_BIN" ] || { echo "bench: BENCH_BEFORE_BIN $BEFORE_BIN is not an executable" >&2; exit 2; }
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
command -v python3 >/dev/null || missing+=(python3)
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
-- QUEUE_DISTINCT=1: each job to its own recipient (OPENID replaced by a
-- counter of the same width: the body stays 500 bytes), so no two share a
-- lane; otherwise every job names OPENID: one lane, one after another.
if os.getenv("QUEUE_DISTINCT") == "1" then
  local n = 0
  function request()
    n = n + 1
    return wrk.format(nil, nil, nil, (string.gsub(wrk.body, "OPENID", string.format("%06d", n % 1000000), 1)))
  end
end
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
start() { start_conf "$TMP/wxgate.toml" "$AP" "$@"; }
# start_conf CONFIG ADMIN_PORT [PREFIX...]: the same with CONFIG, ready at
# ADMIN_PORT's /readyz.
start_conf() {
  local t0 t1 code conf=$1 admin=$2
  shift 2
  t0=$(date +%s%N)
  "$@" "${GATE_BIN:-$WXGATE}" --config "$conf" 2>>"$TMP/wxgate.log" &
  GATE=$!
  PIDS+=("$GATE")
  for _ in $(seq 12000); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$admin/readyz" || true)
    [ "$code" = 200 ] && break
    kill -0 "$GATE" 2>/dev/null || { tail -20 "$TMP/wxgate.log" >&2; die "wxgate exited at start"; }
    sleep 0.01
  done
  [ "$code" = 200 ] || { tail -20 "$TMP/wxgate.log" >&2; die "wxgate not ready in 120 s"; }
  t1=$(date +%s%N)
  STARTUP_MS=$(((t1 - t0) / 1000000))
}
# stop: SIGINT (graceful), 60 s at most, then SIGKILL.
stop() { stop_pid "$GATE"; }
# stop_pid PID: the same for PID (taken out of PIDS).
stop_pid() {
  local p keep=()
  kill -INT "$1" 2>/dev/null || true
  for _ in $(seq 600); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  for p in "${PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  PIDS=("${keep[@]}")
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
  QUEUE_STOP=$marker QUEUE_DISTINCT=${DISTINCT:-0} "${OTHER[@]}" \
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
    echo "wrk -t1, ${SECONDS_RUN} s per row (no warm-up beyond the readiness probe), a 500-byte JSON body with \`Prefer: respond-async\` to a rule with \`queue = true\` and a day quota of 1 (the dispatcher sends the first job, every later one waits for the quota day's midnight: intake only). Each row on a fresh store. Recipients: \"one\": every job to the same \`touser\` (one lane: the job behind the waiting first one is not free, so each store write that refreshes the queue's head walks up to 512 jobs, \`CLAIM_SCAN\`); \"distinct\": each job to its own (a campaign's case). CPU: wxgate's (all its threads, the SQLite writer among them) and Redis' user+system time over the run, from /proc/<pid>/stat, as a share of one core; µs per 202 = that time / 202s."
    echo
    echo "| store | recipients | connections | 202/s | other answers | wxgate CPU | wxgate µs per 202 | Redis CPU | p50 | p99 |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  } >>"$OUT"
  for store in memory redis; do
    for run in 1:one 32:one 1:distinct 32:distinct; do
      c=${run%%:*}; rcpts=${run#*:}
      DISTINCT=$([ "$rcpts" = distinct ] && echo 1 || echo 0)
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
      printf '| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s |\n' "$label" "$rcpts" "$c" "$rate" "$OTHER_N" "$gcpu" "$gus" "$rcpu" "$p50" "$p99" >>"$OUT"
      log "  $store $rcpts c=$c: $rate/s ($ACCEPTED 202, $OTHER_N other), wxgate $gcpu"
      [ "$store" = memory ] && ((c == 32)) && [ "$rcpts" = one ] && RATE32_SQLITE=$rate
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

# --- 5-7: sends (issue 63) ----------------------------------------------------
# The mock WeChat of 5-7: python asyncio, one thread, answering each send
# after a delay (the round trip) without holding a thread, the token endpoint
# at once; it records each send's receive time and `touser` (GET /_count:
# sends received; GET /_dump: "ns touser" lines to its file). ~20 µs of its
# CPU per request (measured: 20,000 requests in 0.35 s), so it carries
# thousands a second; its CPU is reported with every run.
cat >"$TMP/mock.py" <<'EOF'
import asyncio, re, sys, time
port, delay, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
recs = []
TOKEN = b'{"access_token":"BENCHTOKEN","expires_in":7200}'
OK = b'{"errcode":0,"errmsg":"ok","msgid":1}'
TOUSER = re.compile(rb'"touser"\s*:\s*"([^"]*)"')
def resp(body):
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
async def read_body(r, head):
    n, chunked = 0, False
    for h in head.split(b"\r\n")[1:]:
        k, _, v = h.partition(b":")
        k = k.strip().lower()
        if k == b"content-length": n = int(v)
        elif k == b"transfer-encoding" and b"chunked" in v.lower(): chunked = True
    if not chunked:
        return await r.readexactly(n) if n else b""
    body = b""
    while True:
        size = int((await r.readuntil(b"\r\n")).split(b";")[0], 16)
        body += await r.readexactly(size + 2)
        if size == 0:
            while (await r.readuntil(b"\r\n")) != b"\r\n": pass
            return body
async def handle(r, w):
    try:
        while True:
            head = await r.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].split(b"?")[0]   # a send's query names its access_token
            body = await read_body(r, head)
            if b"token" in path:
                w.write(resp(TOKEN))
            elif path.startswith(b"/_count"):
                w.write(resp(str(len(recs)).encode()))
            elif path.startswith(b"/_dump"):
                with open(out, "w") as f:
                    f.writelines("%d %s\n" % (t, u.decode()) for t, u in recs)
                w.write(resp(b"ok"))
            else:
                m = TOUSER.search(body)
                recs.append((time.monotonic_ns(), m.group(1) if m else b"-"))
                if delay > 0:
                    await asyncio.sleep(delay)
                w.write(resp(OK))
            await w.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError, IndexError):
        pass
    finally:
        w.close()
async def main():
    s = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    async with s:
        await s.serve_forever()
asyncio.run(main())
EOF
# What the mock received: N sends, distinct recipients, duplicates (N minus
# distinct), first to last (s), pace (distinct - 1 over first to last), the
# most in any window [t, t + 1 s), the pace of the second half of the sends
# (past any ramp-up).
cat >"$TMP/sends.py" <<'EOF'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
if not rows:
    print(0, 0, 0, "0.00", "0.0", 0, "0.0")
    sys.exit()
ts = sorted(int(r[0]) for r in rows)
n, distinct = len(rows), len({r[1] for r in rows})
span = (ts[-1] - ts[0]) / 1e9 if n > 1 else 0
best, j = 0, 0
for i in range(n):
    while ts[i] - ts[j] >= 1_000_000_000: j += 1
    best = max(best, i - j + 1)
h = n // 2
late = (ts[-1] - ts[h]) / 1e9
print(n, distinct, n - distinct, "%.2f" % span, "%.1f" % ((distinct - 1) / span if span else 0), best,
      "%.1f" % ((n - h - 1) / late if late else 0))
EOF
MP=$(free_port); WP2=$(free_port); AP2=$(free_port)
MOCK_PID=""
# mock_start DELAY_MS: the mock on MP recording into $RUN/sends.txt.
mock_start() {
  python3 "$TMP/mock.py" "$MP" "$(awk -v d="$1" 'BEGIN {print d / 1000}')" "$RUN/sends.txt" & MOCK_PID=$!
  PIDS+=("$MOCK_PID")
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$MP/_count" && return 0; sleep 0.1; done
  die "the mock did not start"
}
# mock_stop: the mock killed (it keeps nothing; asyncio's SIGINT path may
# wait for its connections).
mock_stop() { { kill -KILL "$MOCK_PID" && wait "$MOCK_PID"; } 2>/dev/null || true; stop_pid "$MOCK_PID"; }
mock_count() { curl -s "http://127.0.0.1:$MP/_count" || echo 0; }
# mock_sends: N DISTINCT DUPLICATES SPAN PACE MAX_1S PACE_2ND_HALF of the
# sends so far.
mock_sends() {
  curl -s -o /dev/null "http://127.0.0.1:$MP/_dump"
  python3 "$TMP/sends.py" "$RUN/sends.txt"
}
# machine_busy: busy ticks of all CPUs (/proc/stat), whoever used them.
machine_busy() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
# pct TICKS SECONDS: CPU time as a share of one core
pct() { awk -v d="$1" -v t="$TICK" -v s="$2" 'BEGIN {printf "%.0f %%", (s > 0 ? 100 * d / t / s : 0)}'; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b - a) / 1e9}'; }
# send_toml FILE STORE LIMITS LISTEN ADMIN: a config to the python mock, the
# rule "bench" with `queue = true`, default `[server] workers` (the whole
# instance), bounds that never refuse.
send_toml() {
  local store queue=""
  if [ "$2" = memory ]; then
    store=$(printf 'kind = "memory"\nstate_file = "%s/state"' "$RUN")
    queue="file = \"$RUN/queue.db\""
  else
    store=$(printf 'kind = "redis"\nurl = "redis://127.0.0.1:%s"\ntimeout = "2s"' "$RP")
  fi
  cat >"$1" <<EOF2
[server]
listen = "127.0.0.1:$4"
admin_listen = "127.0.0.1:$5"
upstream = "http://127.0.0.1:$MP"

[store]
$store

[log]
access = false

[queue]
$queue
caller_jobs = 100000000
account_jobs = 100000000
caller_bytes = "16GiB"
account_bytes = "16GiB"

[[rule]]
name = "bench"
match = ["/cgi-bin/message/template/send"]
limits = $3
queue = true

[[account]]
id = "$APPID"
kind = "official_account"
secret_file = "$TMP/bench.secret"
EOF2
}
# calls_cfg FILE PREFIX N PORT async|live: a curl config of N calls, each to
# its own recipient PREFIX1..PREFIXN (no two jobs share a lane).
calls_cfg() {
  awk -v p="$2" -v n="$3" -v u="http://127.0.0.1:$4/@$APPID/cgi-bin/message/template/send" -v a="$5" 'BEGIN {
    for (i = 1; i <= n; i++) {
      if (i > 1) print "next"
      printf "url = \"%s\"\noutput = \"/dev/null\"\nwrite-out = \"%%{http_code}\\n\"\n", u
      printf "data = \"{\\\"touser\\\":\\\"%s%d\\\",\\\"template_id\\\":\\\"TEMPLATE_ID\\\",\\\"data\\\":{\\\"thing1\\\":{\\\"value\\\":\\\"campaign\\\"}}}\"\n", p, i
      print "header = \"Content-Type: application/json\""
      if (a == "async") print "header = \"Prefer: respond-async\""
    } }' >"$1"
}
# calls FILE: the calls of FILE, 16 at a time; prints how many got 2xx.
calls() { curl -s --parallel --parallel-max 16 -K "$1" 2>/dev/null | grep -c '^20[02]$' || true; }
# wait_mock N SECONDS: until the mock received N sends, SECONDS at most
# (then returns 1).
wait_mock() {
  local end=$(($(date +%s) + $2))
  while (($(date +%s) < end)); do (($(mock_count) >= $1)) && return 0; sleep 0.1; done
  return 1
}
label_of() { [ "$1" = memory ] && echo "embedded (SQLite)" || echo Redis; }

# --- 5. pace of one queue against the round trip -------------------------------
if run_item 5; then
  log "5. pace of one queue: $PACE_JOBS jobs, $PACE_RATE/s burst $PACE_BURST, round trips $DELAYS ms"
  bins=("after:$WXGATE")
  [ -n "$BEFORE_BIN" ] && bins=("before:$BEFORE_BIN" "${bins[@]}")
  sustained=$((PACE_RATE - PACE_BURST + 1))
  {
    echo "### 5. Pace of one queue against WeChat's round trip"
    echo
    echo "One caller, one account, one rule \`{ count = $PACE_RATE, per = \"1s\", burst = $PACE_BURST }\` with \`queue = true\` (the GCRA's sustained rate is $PACE_RATE − $PACE_BURST + 1 = $sustained/s, docs/semantics.md), default \`[queue]\` in-flight ceilings and \`window_margin\`, default \`[server] workers\`, nothing pinned. The jobs (each to its own recipient, so no two share a lane) are submitted by curl, 16 at a time, as fast as wxgate takes them; the mock WeChat (python asyncio, see the script) answers each send after the round trip and records when it received it. Pace = sends at the mock from the first to the last (distinct recipients − 1 over that span): **pace ÷ $PACE_RATE** is against the rule's count; \"second half\": the same over the last half of the sends (past the burst and any ramp-up of the in-flight window). \"max in 1 s\": most sends the mock received in any window [t, t + 1 s) (the rule allows $PACE_RATE). \"before\": $BEFORE_LABEL, one send at a time per queue; it gets min($PACE_JOBS, $BEFORE_SECONDS s ÷ round trip) jobs, so that its run stays short. CPU: user+system time over the run (first submission to last send) as a share of one core; machine: every CPU's busy time (of $(nproc) cores: anything above ours + curl's is other work on the VM)."
    echo
    echo "| store | round trip | binary | jobs | submitted in | first → last send | pace | pace ÷ $PACE_RATE | pace, second half | max in 1 s | duplicates | wxgate CPU | Redis CPU | mock CPU | machine busy |"
    echo "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  } >>"$OUT"
  for store in memory redis; do
    for delay in $DELAYS; do
      for b in "${bins[@]}"; do
        kind=${b%%:*}; GATE_BIN=${b#*:}
        n=$PACE_JOBS
        [ "$kind" = before ] && n=$(awk -v n="$PACE_JOBS" -v s="$BEFORE_SECONDS" -v d="$delay" 'BEGIN {m = int(s * 1000 / d); print (m < n ? m : n)}')
        fresh
        mock_start "$delay"
        send_toml "$TMP/pace.toml" "$store" "[{ count = $PACE_RATE, per = \"1s\", burst = $PACE_BURST }]" "$WP" "$AP"
        start_conf "$TMP/pace.toml" "$AP"
        calls_cfg "$TMP/calls.cfg" o "$n" "$WP" async
        g0=$(cpu_ticks "$GATE"); r0=$(cpu_ticks "$REDIS_PID"); m0=$(cpu_ticks "$MOCK_PID"); b0=$(machine_busy); t0=$(date +%s%N)
        ok=$(calls "$TMP/calls.cfg")
        t1=$(date +%s%N)
        drained=yes
        wait_mock "$n" $((60 + 3 * n / PACE_RATE + 2 * n * delay / 1000)) || drained=no
        t2=$(date +%s%N)
        g1=$(cpu_ticks "$GATE"); r1=$(cpu_ticks "$REDIS_PID"); m1=$(cpu_ticks "$MOCK_PID"); b1=$(machine_busy)
        sleep 0.5   # a late duplicate would show
        read -r got distinct dup span pace maxwin late < <(mock_sends)
        GATE_BIN=""
        stop
        mock_stop
        s=$(secs "$t0" "$t2")
        rcpu=–
        [ "$store" = redis ] && rcpu=$(pct $((r1 - r0)) "$s")
        note=""
        ((ok == n)) || note+=" ($ok of $n accepted)"
        [ "$drained" = yes ] || note+=" (**not drained**: $got in $s s)"
        printf '| %s | %s ms | %s | %d%s | %s s | %s s | %s/s | %s | %s/s | %d | %d | %s | %s | %s | %s |\n' "$(label_of "$store")" "$delay" "$kind" "$n" "$note" "$(secs "$t0" "$t1")" "$span" "$pace" \
          "$(awk -v p="$pace" -v r="$PACE_RATE" 'BEGIN {printf "%.2f", p / r}')" "$late" "$maxwin" "$dup" "$(pct $((g1 - g0)) "$s")" "$rcpu" "$(pct $((m1 - m0)) "$s")" "$(pct $((b1 - b0)) "$s")" >>"$OUT"
        log "  $store ${delay}ms $kind: $got sends ($distinct distinct) in $span s: $pace/s (second half $late/s), max $maxwin in 1 s"
      done
    done
  done
  echo >>"$OUT"
fi

# --- 6. a campaign on Redis, two instances -----------------------------------
if run_item 6; then
  log "6. campaign: $CAMPAIGN_JOBS jobs, $CAMPAIGN_RATE/s burst $CAMPAIGN_BURST, two instances on Redis, round trip $CAMPAIGN_DELAY ms"
  fresh
  mock_start "$CAMPAIGN_DELAY"
  limits="[{ count = $CAMPAIGN_RATE, per = \"1s\", burst = $CAMPAIGN_BURST }]"
  send_toml "$TMP/a.toml" redis "$limits" "$WP" "$AP"
  send_toml "$TMP/b.toml" redis "$limits" "$WP2" "$AP2"
  start_conf "$TMP/a.toml" "$AP"; GA=$GATE
  start_conf "$TMP/b.toml" "$AP2"; GB=$GATE
  half=$((CAMPAIGN_JOBS / 2))
  calls_cfg "$TMP/a.cfg" a "$half" "$WP" async
  calls_cfg "$TMP/b.cfg" b "$((CAMPAIGN_JOBS - half))" "$WP2" async
  redis-cli -p "$RP" config resetstat >/dev/null
  ga0=$(cpu_ticks "$GA"); gb0=$(cpu_ticks "$GB"); r0=$(cpu_ticks "$REDIS_PID"); m0=$(cpu_ticks "$MOCK_PID"); b0=$(machine_busy); t0=$(date +%s%N)
  calls "$TMP/a.cfg" >"$TMP/a.ok" & ca=$!
  calls "$TMP/b.cfg" >"$TMP/b.ok" & cb=$!
  wait "$ca" "$cb" || true
  t1=$(date +%s%N)
  ga1=$(cpu_ticks "$GA"); gb1=$(cpu_ticks "$GB"); r1=$(cpu_ticks "$REDIS_PID"); m1=$(cpu_ticks "$MOCK_PID"); b1=$(machine_busy)
  ok=$(($(cat "$TMP/a.ok") + $(cat "$TMP/b.ok")))
  PROFILE=""
  if [ -n "$PERF" ] && command -v perf >/dev/null; then   # wxgate A while both drain (after the submissions)
    perf record -q -F 499 -g -p "$GA" -o "$TMP/perf.data" -- sleep "$PERF" >/dev/null 2>&1 &&
      PROFILE=$(perf report -q -i "$TMP/perf.data" --no-children --sort dso,symbol --percent-limit 2 -g none 2>/dev/null | grep -v '^$' | cut -c1-110 | sed 's/[[:space:]]*$//' | head -25) || true
  fi
  drained=yes
  wait_mock "$CAMPAIGN_JOBS" $((120 + 3 * CAMPAIGN_JOBS / CAMPAIGN_RATE)) || drained=no
  t2=$(date +%s%N)
  ga2=$(cpu_ticks "$GA"); gb2=$(cpu_ticks "$GB"); r2=$(cpu_ticks "$REDIS_PID"); m2=$(cpu_ticks "$MOCK_PID"); b2=$(machine_busy)
  sleep 1   # a late duplicate would show
  read -r got distinct dup span pace maxwin late < <(mock_sends)
  # Redis' commands over the run (INFO commandstats counts those a script
  # runs too): per send, the scripts and the job reads (HMGET) inside them.
  cstat() { redis-cli -p "$RP" info commandstats | awk -F'[:=,]' -v c="cmdstat_$1" -v f="$2" '$1 == c {for (i = 2; i < NF; i += 2) if ($i == f) print $(i + 1)}'; }
  ev=$(cstat evalsha calls); ev_us=$(cstat evalsha usec); hm=$(cstat hmget calls)
  sent_by() { curl -s "http://127.0.0.1:$1/metrics" | awk '/^wxgate_queue_ended_total/ && /state="sent"/ {n += $2} END {print n + 0}'; }
  sa=$(sent_by "$AP"); sb=$(sent_by "$AP2")
  unknown=$( (curl -s "http://127.0.0.1:$AP/metrics"; curl -s "http://127.0.0.1:$AP2/metrics") | awk '/^wxgate_queue_ended_total/ && !/state="sent"/ {n += $2} END {print n + 0}')
  stop_pid "$GB"; stop_pid "$GA"; mock_stop
  sub_s=$(secs "$t0" "$t1"); all_s=$(secs "$t0" "$t2"); drain_s=$(secs "$t1" "$t2")
  quota_s=$(awk -v n="$CAMPAIGN_JOBS" -v r="$CAMPAIGN_RATE" 'BEGIN {printf "%.0f", n / r}')
  {
    echo "### 6. A campaign: $CAMPAIGN_JOBS jobs, two instances on Redis"
    echo
    echo "Two wxgate instances (default \`[server] workers\`, default \`[queue]\` in-flight ceilings) on one Redis, one rule \`$limits\` with \`queue = true\` (sustained $((CAMPAIGN_RATE - CAMPAIGN_BURST + 1))/s), the mock answering after $CAMPAIGN_DELAY ms. Half the jobs submitted through each instance at once (two curls, 16 at a time each), each job to its own recipient; the instances start sending as the first jobs land. The quota's time: jobs ÷ the rule's count = $quota_s s. CPU as a share of one core, first over the submissions (both curls running), then over the rest of the drain."
    echo
    echo "| | value |"
    echo "|---|---:|"
    echo "| jobs accepted (202) | $ok of $CAMPAIGN_JOBS |"
    echo "| sends at the mock (distinct recipients) | $got ($distinct)$([ "$drained" = yes ] || echo " **not drained in the bound**") |"
    echo "| duplicates at the mock | $dup |"
    echo "| jobs ended other than \`sent\` (both instances' metrics) | $unknown |"
    echo "| sent by instance A; B | $sa; $sb |"
    echo "| submissions took | $sub_s s ($(awk -v n="$ok" -v s="$sub_s" 'BEGIN {printf "%.0f", n / s}')/s) |"
    echo "| first → last send at the mock | $span s |"
    echo "| first submission → last send | $all_s s |"
    echo "| pace (first → last send) | $pace/s |"
    echo "| pace of the second half of the sends | $late/s |"
    echo "| **pace ÷ $CAMPAIGN_RATE** (target ≥ 0.9) | **$(awk -v p="$pace" -v r="$CAMPAIGN_RATE" 'BEGIN {printf "%.2f", p / r}')** |"
    echo "| quota's time ÷ first submission → last send | $(awk -v q="$quota_s" -v a="$all_s" 'BEGIN {printf "%.2f", q / a}') |"
    echo "| most sends in any 1 s at the mock (the rule: $CAMPAIGN_RATE) | $maxwin |"
    echo "| CPU while submitting ($sub_s s): wxgate A, B, Redis, mock, machine (of $(nproc) cores) | $(pct $((ga1 - ga0)) "$sub_s"), $(pct $((gb1 - gb0)) "$sub_s"), $(pct $((r1 - r0)) "$sub_s"), $(pct $((m1 - m0)) "$sub_s"), $(pct $((b1 - b0)) "$sub_s") |"
    echo "| CPU draining after that ($drain_s s): wxgate A, B, Redis, mock, machine | $(pct $((ga2 - ga1)) "$drain_s"), $(pct $((gb2 - gb1)) "$drain_s"), $(pct $((r2 - r1)) "$drain_s"), $(pct $((m2 - m1)) "$drain_s"), $(pct $((b2 - b1)) "$drain_s") |"
    echo "| wxgate A+B CPU per send, whole run (submission + send) | $(awk -v d=$((ga2 - ga0 + gb2 - gb0)) -v t="$TICK" -v n="$got" 'BEGIN {printf "%.0f µs", n ? 1e6 * d / t / n : 0}') |"
    echo "| Redis per send: EVALSHA calls; their µs; HMGETs (inside the scripts) | $(awk -v e="${ev:-0}" -v u="${ev_us:-0}" -v h="${hm:-0}" -v n="$got" 'BEGIN {n = n ? n : 1; printf "%.1f; %.0f µs; %.0f", e / n, u / n, h / n}') |"
    echo "| Redis CPU per send, whole run | $(awk -v d=$((r2 - r0)) -v t="$TICK" -v n="$got" 'BEGIN {printf "%.0f µs", n ? 1e6 * d / t / n : 0}') |"
    echo
    if [ -n "$PROFILE" ]; then
      echo "perf (\`perf record -F 499 -g -p\` instance A for $PERF s right after the submissions, \`perf report --no-children --sort dso,symbol\`, ≥ 2 %):"
      echo
      echo '```'
      echo "$PROFILE"
      echo '```'
      echo
    fi
  } >>"$OUT"
  log "  $got sends ($dup duplicates) in $span s: $pace/s; submitted in $sub_s s"
fi

# --- 7. CPU per queued send against a live call ---------------------------------
if run_item 7; then
  log "7. CPU per call: $CPU_CALLS live calls, $CPU_CALLS queued"
  {
    echo "### 7. CPU per queued send against a live call"
    echo
    echo "One instance (default \`[server] workers\`), a rule with \`queue = true\` and limits that never throttle, the mock answering at once. $CPU_CALLS live calls (curl, 16 at a time, each to its own recipient), then $CPU_CALLS queued ones (submitted the same way, then waited for until the mock received them all; the figure holds everything: the 202, the store's writes, the claim, the decision, the send, the end). wxgate's (and Redis') user+system time over each phase from /proc, divided by its calls."
    echo
    echo "| store | mode | calls | wall | calls/s | wxgate µs per call | Redis µs per call | queued ÷ live (wxgate) |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|"
  } >>"$OUT"
  for store in memory redis; do
    fresh
    mock_start 0
    send_toml "$TMP/cpu.toml" "$store" "$BENCH_NEVER" "$WP" "$AP"
    start_conf "$TMP/cpu.toml" "$AP"
    calls_cfg "$TMP/warm.cfg" w 200 "$WP" live; calls "$TMP/warm.cfg" >/dev/null
    calls_cfg "$TMP/live.cfg" l "$CPU_CALLS" "$WP" live
    calls_cfg "$TMP/queued.cfg" q "$CPU_CALLS" "$WP" async
    base=$(mock_count)
    g0=$(cpu_ticks "$GATE"); r0=$(cpu_ticks "$REDIS_PID"); t0=$(date +%s%N)
    ok_live=$(calls "$TMP/live.cfg")
    g1=$(cpu_ticks "$GATE"); r1=$(cpu_ticks "$REDIS_PID"); t1=$(date +%s%N)
    ok_q=$(calls "$TMP/queued.cfg")
    wait_mock $((base + CPU_CALLS * 2)) $((60 + CPU_CALLS / 50)) || log "  not all queued sends arrived"
    g2=$(cpu_ticks "$GATE"); r2=$(cpu_ticks "$REDIS_PID"); t2=$(date +%s%N)
    stop
    mock_stop
    per() { awk -v d="$1" -v t="$TICK" -v n="$2" 'BEGIN {printf "%.0f", n ? 1e6 * d / t / n : 0}'; }
    lus=$(per $((g1 - g0)) "$ok_live"); qus=$(per $((g2 - g1)) "$ok_q")
    rl=–; rq=–
    [ "$store" = redis ] && { rl=$(per $((r1 - r0)) "$ok_live"); rq=$(per $((r2 - r1)) "$ok_q"); }
    ratio=$(awk -v q="$qus" -v l="$lus" 'BEGIN {printf "%.1f×", l ? q / l : 0}')
    printf '| %s | live | %d | %s s | %.0f | %s | %s | |\n' "$(label_of "$store")" "$ok_live" "$(secs "$t0" "$t1")" "$(awk -v n="$ok_live" -v s="$(secs "$t0" "$t1")" 'BEGIN {print n / s}')" "$lus" "$rl" >>"$OUT"
    printf '| %s | queued | %d | %s s | %.0f | %s | %s | %s |\n' "$(label_of "$store")" "$ok_q" "$(secs "$t1" "$t2")" "$(awk -v n="$ok_q" -v s="$(secs "$t1" "$t2")" 'BEGIN {print n / s}')" "$qus" "$rq" "$ratio" >>"$OUT"
    log "  $store: live $lus µs, queued $qus µs per call"
  done
  echo >>"$OUT"
fi

# --- the results file -------------------------------------------------------
mkdir -p bench/results
base="bench/results/$(date -u +%Y-%m-%d)-$(hostname -s)-$NAME"
file=$base.md
i=2
while [ -e "$file" ]; do file=$base-$i.md; i=$((i + 1)); done
pinned=$([ ${#PIN[@]} -gt 0 ] && echo "wxgate pinned alone on CPU $PROXY_CPU (taskset), wrk, nginx and Redis on the others" || echo "nothing pinned")
{
  echo "# bench/queue.sh: queued delivery (issues 47, 63) at $COMMIT"
  echo
  echo "Command: \`$(compgen -e | grep '^BENCH_' | while read -r v; do printf '%s=%s ' "$v" "${!v}"; done)bench/queue.sh\` ($(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), $STARTED–$(date -u +%H:%M) UTC). Profiling build (\`cargo build --profile profiling\`), $pinned in items 1-4; in 5-7 nothing is pinned but Redis (on the CPUs other than $PROXY_CPU). $(wrk --version 2>&1 | head -1 | cut -d' ' -f1-2), $(redis-server --version | cut -d' ' -f1-3), $(nginx -v 2>&1). One run each: on this shared VM, times move 10-20 % between runs; instruction counts do not."
  echo
  cat "$OUT"
} >"$file"
cat "$file"
log "written: $file"
