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
# and, with BENCH_TARGETS=flood, the caller flood guard ([[caller]] rate):
#   one caller floods at full speed without back-off while another sends
#   steadily, both on one account and rule of the Redis store, with and
#   without the flooder's guard (see "flood" below and bench/README).
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
#   BENCH_TARGETS      what to run: "standard" (targets 1-9 and pass 2, the default),
#                      "flood" (the flood guard runs only), or "standard flood"
#   BENCH_FLOOD_LIMIT  flood runs: the rule's limit per second   (default 1000)
#   BENCH_FLOOD_RATE   flood runs: the flooder's guard per second (default 500)
#   BENCH_PIN          1: the proxy under test (nginx proxy_pass, wxgate with
#                      `workers = 1`) alone on CPU BENCH_PROXY_CPU, wrk, the mock
#                      upstream and Redis on the other CPUs; 0: everything shares
#                      every core. Default 1 on machines with 2 or more CPUs (and
#                      taskset), else 0. Pinned, the report opens with calls/s per
#                      proxy core (requests/s over the proxy's share of its core),
#                      CPU µs per call, p50/p99, per target, median and range over
#                      the rounds; use BENCH_ROUNDS=3 (or 5) for medians.
#   BENCH_PROXY_CPU    the CPU of the proxy under test when pinned (default 0)
#   BENCH_REDIS_MORE   lines added to every Redis target's [store] table,
#                      e.g. 'quota_leases = false' (the per-call path)
#   BENCH_MEMORY_LIMITS  target 3's limits instead of ones that never throttle,
#                      e.g. '[{ count = 1000000000, per = "day" }]' (a day quota:
#                      each admission also goes to the admissions journal)
#
# Before/after a change (baseline mode):
#   BENCH_BASELINE     a git revision (main~3, a hash, a tag) to compare the working
#                      tree against: its wxgate is built with `cargo build --release
#                      --locked` in a temporary git worktree (removed on exit), into
#                      CARGO_TARGET_DIR=target/bench-baseline/<short hash> (kept: a
#                      rerun against the same commit reuses the binary)
#   BENCH_BASELINE_BIN an already built baseline binary instead of a build
#                      (BENCH_BASELINE, if set too, then only names it in the report)
#   BENCH_BIN          an already built binary measured as "current" instead of
#                      building this tree (to compare two old commits: build each,
#                      then BENCH_BASELINE_BIN=old BENCH_BIN=new; BENCH_BIN_NAME
#                      names it in the report, as BENCH_BASELINE does the baseline)
#   BENCH_NAME         a suffix of the results file's name (bench/results/<date>-<host>[-peers|-flood]
#                      [-BENCH_NAME].md); a file of that name already there is kept: -2, -3, ... is added
#   BENCH_ROUNDS       rounds of pass 1 (default 3 with a baseline, 1 without). Each
#                      round runs targets 1-9; each compared target is run with the
#                      baseline and at once after it with the current binary (same
#                      config file, port and wrk settings; Redis flushed before each
#                      wxgate start), so baseline and current interleave.
#   BENCH_COMPARE      the targets run with the baseline too (default "3 4 5 6 7 8 9")
# With a baseline (or BENCH_ROUNDS > 1) the report opens with the median and the
# min-max of requests/s and of CPU per call (wxgate, Redis) of each binary over
# the rounds, and the ratio current/baseline; the nine-target table then shows,
# per target, the current binary's median round (by requests/s). Pass 2 runs
# once, with the current binary. Example:
#   BENCH_BASELINE=main bench/run.sh    # this working tree against main, 3 rounds
set -euo pipefail

BASELINE=${BENCH_BASELINE:-}
BASE_BIN=""
if [ -n "${BENCH_BASELINE_BIN:-}" ]; then   # resolved before the cd below
  BASE_BIN=$(realpath -e -- "$BENCH_BASELINE_BIN" 2>/dev/null) ||
    { echo "bench: BENCH_BASELINE_BIN: no such file: $BENCH_BASELINE_BIN" >&2; exit 2; }
fi
CUR_BIN=""
if [ -n "${BENCH_BIN:-}" ]; then
  CUR_BIN=$(realpath -e -- "$BENCH_BIN" 2>/dev/null) ||
    { echo "bench: BENCH_BIN: no such file: $BENCH_BIN" >&2; exit 2; }
  [ -x "$CUR_BIN" ] || { echo "bench: BENCH_BIN=$CUR_BIN is not executable" >&2; exit 2; }
fi
# The exact command, for the report: the BENCH_* variables of the environment
# (BENCH_BASELINE_BIN as an absolute path), quoted only where the shell needs it.
shq() { if [[ $1 =~ ^[A-Za-z0-9_./@:+,=-][A-Za-z0-9_./~^@:+,=-]*$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi; }
CMD=""
for v in $(compgen -e | grep '^BENCH_' || true); do
  if [ "$v" = BENCH_BASELINE_BIN ]; then CMD+="$v=$(shq "$BASE_BIN") "; else CMD+="$v=$(shq "${!v}") "; fi
done
CMD+="bench/run.sh"

cd "$(dirname "$0")/.."
. bench/lib.sh
REPO=$(pwd)
export PATH="$PATH:/usr/sbin:/sbin"

DURATION=${BENCH_DURATION:-10}; DURATION=${DURATION%s}
WARMUP=${BENCH_WARMUP:-2}; WARMUP=${WARMUP%s}
CONNS=${BENCH_CONNECTIONS:-64}
THREADS=${BENCH_THREADS:-2}
PORT_BASE=${BENCH_PORT_BASE:-18400}
PERF=${BENCH_PERF:-0}
PROXY_CPU=${BENCH_PROXY_CPU:-0}
if [ -n "${BENCH_PIN:-}" ]; then PIN=$BENCH_PIN
elif (($(nproc) >= 2)) && command -v taskset >/dev/null; then PIN=1; else PIN=0; fi
if [ -n "$BASELINE$BASE_BIN" ]; then ROUNDS=${BENCH_ROUNDS:-3}; else ROUNDS=${BENCH_ROUNDS:-1}; fi
COMPARE=" ${BENCH_COMPARE:-3 4 5 6 7 8 9} "; COMPARE=${COMPARE//,/ }
TARGETS=" ${BENCH_TARGETS:-standard} "; TARGETS=${TARGETS//,/ }
FLOOD_LIMIT=${BENCH_FLOOD_LIMIT:-1000}
FLOOD_RATE=${BENCH_FLOOD_RATE:-500}
want() { [[ $TARGETS == *" $1 "* ]]; } # want standard|flood|peers|accounts: is it in BENCH_TARGETS?
REQ_PATH='/cgi-bin/message/template/send?access_token=BENCH'
BODY='{"errcode":0,"errmsg":"ok"}'

[[ $TARGETS =~ ^(\ +(standard|flood|peers|accounts))+\ +$ ]] ||
  { echo "bench: BENCH_TARGETS must list standard, flood, peers and/or accounts, got '${BENCH_TARGETS:-}'" >&2; exit 2; }
[[ $PIN =~ ^[01]$ ]] || { echo "bench: BENCH_PIN must be 0 or 1, got '$PIN'" >&2; exit 2; }
for v in DURATION WARMUP CONNS THREADS PORT_BASE ROUNDS FLOOD_LIMIT FLOOD_RATE PROXY_CPU; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "bench: $v must be a whole number, got '${!v}'" >&2; exit 2; }
done
((ROUNDS >= 1)) || { echo "bench: BENCH_ROUNDS must be at least 1" >&2; exit 2; }
[[ $COMPARE =~ ^(\ +[3-9])*\ +$ ]] ||
  { echo "bench: BENCH_COMPARE must list wxgate targets (3-9), got '${BENCH_COMPARE:-}'" >&2; exit 2; }
# MULTI: pass 1 in rounds (keys r<round>_cur_<target>, r<round>_base_<target>)
# instead of the single run of each target (keys p1_<target>).
MULTI=0
if [ -n "$BASELINE$BASE_BIN" ] || ((ROUNDS > 1)); then MULTI=1; fi
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
# peers/accounts: OpenResty's parts as Debian packages them (bench/peers.sh)
if want peers || want accounts; then
  [ -f /usr/lib/nginx/modules/ngx_http_lua_module.so ] || missing+=(libnginx-mod-http-lua)
  [ -f /usr/share/lua/5.1/nginx/redis.lua ] || missing+=(lua-nginx-redis)
fi
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

if [ -n "$CUR_BIN" ]; then
  WXGATE=$CUR_BIN
  log "measuring $WXGATE (BENCH_BIN) as the current binary: this tree is not built"
else
  log "building wxgate (cargo build --profile profiling --locked)"
  cargo build --profile profiling --locked
  WXGATE=$REPO/target/profiling/wxgate
fi
# What was built, read now: edits made while the benchmark runs are not in it.
COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$(git -C "$REPO" status --porcelain -- src lua Cargo.toml Cargo.lock 2>/dev/null)" ] &&
  COMMIT+=" (with uncommitted changes in src/, lua/ or Cargo.*)"
[ -x "$WXGATE" ] || die "$WXGATE was not built"

# --- the baseline binary (BENCH_BASELINE / BENCH_BASELINE_BIN) ------------------

BASE_WT=""      # the baseline's temporary git worktree while it builds
remove_worktree() {
  [ -n "$BASE_WT" ] || return 0
  git -C "$REPO" worktree remove --force "$BASE_WT" 2>/dev/null ||
    { rm -rf "$BASE_WT"; echo "bench: git worktree remove $BASE_WT failed; deleted it (git worktree prune drops its entry)" >&2; }
  BASE_WT=""
}
trap remove_worktree EXIT   # until cleanup (below) takes over
trap 'exit 130' INT TERM
subject() { git -C "$REPO" log -1 --format='%<(64,trunc)%s' "$1" 2>/dev/null | sed 's/ *$//'; } # its subject, cut to 64
BASE_LABEL=""
[[ ${BENCH_NAME:-} =~ ^[A-Za-z0-9._-]*$ ]] || die "BENCH_NAME may hold letters, digits, . _ - only, got '${BENCH_NAME:-}'"
if [ -n "$BASE_BIN" ]; then
  [ -x "$BASE_BIN" ] || die "BENCH_BASELINE_BIN=$BASE_BIN is not executable"
  BASE_LABEL="${BASELINE:+$BASELINE: }binary \`$BASE_BIN\` (sha256 $(sha256sum "$BASE_BIN" | cut -c1-12))"
elif [ -n "$BASELINE" ]; then
  BASE_REV=$(git -C "$REPO" rev-parse --verify --quiet "$BASELINE^{commit}") ||
    die "BENCH_BASELINE=$BASELINE is not a commit of this repository"
  BASE_SHORT=$(git -C "$REPO" rev-parse --short "$BASE_REV")
  BASE_DIR=$REPO/target/bench-baseline/$BASE_SHORT
  BASE_BIN=$BASE_DIR/release/wxgate
  stamp="$BASE_REV $(rustc -V)"
  if [ -x "$BASE_BIN" ] && [ "$(cat "$BASE_DIR/built-from" 2>/dev/null)" = "$stamp" ]; then
    log "baseline $BASELINE = $BASE_SHORT: reusing $BASE_BIN (built from that commit by an earlier run)"
  else
    BASE_WT=$(mktemp -d /tmp/wxgate-baseline.XXXXXX)
    log "baseline $BASELINE = $BASE_SHORT: building it in a git worktree at $BASE_WT (CARGO_TARGET_DIR=$BASE_DIR)"
    git -C "$REPO" worktree add -q --detach "$BASE_WT" "$BASE_REV" || die "git worktree add $BASE_WT $BASE_SHORT failed"
    rm -f "$BASE_DIR/built-from"
    (cd "$BASE_WT" && CARGO_TARGET_DIR=$BASE_DIR cargo build --release --locked) ||
      die "building the baseline $BASE_SHORT failed (build it yourself and pass BENCH_BASELINE_BIN=<its binary>)"
    [ -x "$BASE_BIN" ] || die "$BASE_BIN was not built"
    echo "$stamp" >"$BASE_DIR/built-from"
    remove_worktree
  fi
  BASE_LABEL="$BASE_SHORT"
  [ "$BASELINE" = "$BASE_SHORT" ] || [ "$BASELINE" = "$BASE_REV" ] || BASE_LABEL="\`$BASELINE\` = $BASE_SHORT"
  BASE_LABEL+=" ($(subject "$BASE_REV"))"
fi
if [ -n "$BASE_BIN" ] && cmp -s "$BASE_BIN" "$WXGATE"; then
  log "note: the baseline and the current binary are identical (an A/A run: their spread is the noise)"
fi

# --- processes: started in $TMP, all stopped on exit ---------------------------

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# Pinned (BENCH_PIN=1): this script, and so wrk, the mock upstream and Redis,
# move to the other CPUs; the proxy under test is started on PROXY_CPU alone
# (PROXY_PIN prefixes its command). Calls/s per proxy core then compares the
# proxies, not how the scheduler shares two cores among five processes.
PROXY_PIN=()
OTHER_CPUS=""
if ((PIN)); then
  command -v taskset >/dev/null || die "BENCH_PIN=1 needs taskset (util-linux)"
  allowed=$(taskset -cp $$ | sed 's/.*: *//')   # e.g. 0-3,6
  cpus=()
  IFS=, read -ra ranges <<<"$allowed"
  for r in "${ranges[@]}"; do
    if [[ $r == *-* ]]; then for ((c = ${r%-*}; c <= ${r#*-}; c++)); do cpus+=("$c"); done; else cpus+=("$r"); fi
  done
  others=()
  for c in "${cpus[@]}"; do if [ "$c" != "$PROXY_CPU" ]; then others+=("$c"); fi; done
  ((${#others[@]} < ${#cpus[@]})) || die "BENCH_PROXY_CPU=$PROXY_CPU is not among the CPUs this script may use ($allowed)"
  ((${#others[@]} >= 1)) || die "BENCH_PIN=1 needs at least 2 CPUs (this script may use $allowed); set BENCH_PIN=0"
  OTHER_CPUS=$(IFS=,; echo "${others[*]}")
  taskset -cp "$OTHER_CPUS" $$ >/dev/null || die "taskset -cp $OTHER_CPUS failed"
  PROXY_PIN=(taskset -c "$PROXY_CPU")
  log "pinned: the proxy under test on CPU $PROXY_CPU; wrk, the mock upstream and Redis on CPU $OTHER_CPUS"
fi
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
  remove_worktree
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
    # A fresh 128-character token per call (BENCH_TARGETS=accounts, bench/peers.sh).
    location = /cgi-bin/token {
      types { }
      default_type application/json;
      return 200 '{"access_token":"\$request_id\$request_id\$request_id\$request_id","expires_in":7200}';
    }
  }
}
EOF
# proxy_conf PORT [MAIN] [HTTP] [LOCATION]: an nginx proxy on PORT in front of
# the mock (one worker, keep-alive upstream, access log off), with more
# main-context, http-context and `location /` directives (bench/peers.sh's
# OpenResty and limit_req are this proxy plus their limiter).
proxy_conf() {
  cat <<EOF
${2:-}
worker_processes 1;
daemon off;
pid nginx.pid;
error_log error.log warn;
events { worker_connections $WC; }
http {
  access_log off;
  keepalive_timeout 75s;
  keepalive_requests 1000000;
${3:-}
  upstream wechat {
    server 127.0.0.1:$UP_PORT;
    keepalive 64;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:$1;
    location / {
${4:-}
      proxy_pass http://wechat;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
EOF
}
proxy_conf "$NGX_PORT" >"$TMP/proxy/nginx.conf"
for n in upstream proxy; do
  nginx -t -q -c "$TMP/$n/nginx.conf" -p "$TMP/$n/" -e "$TMP/$n/error.log" ||
    die "nginx refused the $n config ($TMP/$n/nginx.conf)"
done
check_free "$UP_PORT"
start upstream nginx -c "$TMP/upstream/nginx.conf" -p "$TMP/upstream/" -e "$TMP/upstream/error.log"
UP_PID=$LAST_PID
wait_up upstream "$UP_PID" "http://127.0.0.1:$UP_PORT$REQ_PATH"
check_free "$NGX_PORT"
start proxy "${PROXY_PIN[@]}" nginx -c "$TMP/proxy/nginx.conf" -p "$TMP/proxy/" -e "$TMP/proxy/error.log"
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

NEVER=$BENCH_NEVER   # never throttles (bench/lib.sh)

wxgate_config() { # wxgate_config NAME PORT STORE_TOML LIMITS [MORE_TOML]: write $TMP/NAME.toml, `check` it
  bench_wxgate_toml "127.0.0.1:$2" "http://127.0.0.1:$UP_PORT" "$3" "shutdown_timeout = \"2s\"
${PIN_WORKERS:-}" "$4" "${5:-}" >"$TMP/$1.toml"
  "$WXGATE" check --config "$TMP/$1.toml" >"$TMP/$1.check" 2>&1 ||
    { cat "$TMP/$1.check" >&2; die "wxgate check refused $TMP/$1.toml"; }
  # The baseline runs the same file: a target whose config it refuses (a key
  # it does not know yet) is measured with the current binary only.
  if [ -n "$BASE_BIN" ]; then
    if "$BASE_BIN" check --config "$TMP/$1.toml" >"$TMP/$1.base-check" 2>&1; then BASE_OK[$1]=1; else
      BASE_OK[$1]=0
      log "the baseline refuses $1.toml ($(grep . "$TMP/$1.base-check" | tail -1)): not compared"
    fi
  fi
}
declare -A BASE_OK
# Pinned: one serving thread on the proxy's one core, as nginx has one worker.
if ((PIN)); then PIN_WORKERS='workers = 1   # pinned: one core, one serving thread (nginx: worker_processes 1)'; fi
start_wxgate() { # start_wxgate NAME PORT [BINARY]: start, wait until it answers; pid in WX_PID
  local bin=${3:-$WXGATE} log=$1
  [ "$bin" = "$WXGATE" ] || log=$1.base
  check_free "$2"
  # Every start begins empty, as every Redis target does (flushed): the
  # memory store's state file (beside the config files, shared by them) and
  # its journal would otherwise carry one run's accounts and tokens into the next.
  rm -rf "$TMP/wxgate-state.json" "$TMP/wxgate-state.json.journal"
  WXGATE_LOG=warn start "$log" "${PROXY_PIN[@]}" "$bin" --config "$TMP/$1.toml"
  WX_PID=$LAST_PID
  wait_up "$log" "$WX_PID" "http://127.0.0.1:$2$REQ_PATH"
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
  local i pct pct0 out=""
  : >"$TMP/$key.cpuv"
  for i in "${!names[@]}"; do
    g=${names[$i]}
    after[i]=$(gticks "$g")
    read -r pct pct0 < <(awk -v a="${before[$i]}" -v b="${after[$i]}" -v t0="$t0" -v t1="$t1" -v hz="$CLK" \
      'BEGIN { p = (b - a) / hz / (t1 - t0) * 100; printf "%.2f %.0f\n", p, p }')
    out+="${g%%=*} $pct0%, "
    echo "${g%%=*} $pct" >>"$TMP/$key.cpuv"   # unrounded: CPU per call is computed from it
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

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
summ() { # summ FMT UNIT: "median UNIT (min–max)" of the numbers on stdin; "–" for none
  sort -g | awk -v f="$1" -v u="$2" '{ v[NR] = $1 } END { if (!NR) { printf "–"; exit }
    printf f u, NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    if (NR > 1) printf " (" f "–" f ")", v[1], v[NR] }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) printf "–"; else printf "%.2f×", a / b }'; }
# per_run KEY GROUP: "rps p50 p99 cpu% cpu_us_per_call calls_per_core_s" of one run; GROUP: the proxy's
per_run() {
  awk -v g="$2" -v f="$TMP/$1.parsed" 'BEGIN { getline l < f; split(l, a, " ") }
    $1 == g { c = $2 } END { printf "%s %s %s %s %.3f %.0f\n", a[1], a[2], a[3], c, c / 100 * 1e6 / a[1], (c > 0 ? a[1] * 100 / c : 0) }' "$TMP/$1.cpuv"
}
ms() { awk '{ print $1 / 1000 }'; } # µs on stdin -> ms

# --- targets ------------------------------------------------------------------------

alloc_port WX_MEM_PORT
alloc_port WX_REDIS_PORT
alloc_port WX_REDIS1_PORT
alloc_port WX_REJECT_PORT
alloc_port WX_REJECTNC_PORT
alloc_port WX_SPENT_PORT
alloc_port WX_SPENTNC_PORT
# redis_store PREFIX [EXTRA_TOML]: the [store] body of a Redis target
# (BENCH_REDIS_MORE: lines added to every Redis target's, e.g.
# 'quota_leases = false')
redis_store() {
  printf 'kind = "redis"\nurl = "redis://127.0.0.1:%s"\ntimeout = "1s"\nkey_prefix = "%s"\n%s\n%s' \
    "$REDIS_PORT" "$1" "${2:-}" "${BENCH_REDIS_MORE:-}"
}
wxgate_config memory "$WX_MEM_PORT" 'kind = "memory"' "${BENCH_MEMORY_LIMITS:-$NEVER}"
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

# --- flood: the caller flood guard ([[caller]] rate) -------------------------------
#
# One account, one rule of FLOOD_LIMIT calls per second (burst 10 %), on the
# Redis store. Two callers at once for DURATION seconds: "flood" (wrk, CONNS
# connections, no back-off, X-Wx-Caller: flood) and "steady" (wrk, 2
# connections, each pausing 20 ms after every answer: ≤ 100 calls/s,
# X-Wx-Caller: steady). Run twice: with flood's guard (rate = FLOOD_RATE/s)
# and without it. Measured over the run (from 0.5 s in to 0.5 s before the
# end): Redis commands and EVALSHA per second (INFO commandstats deltas),
# wxgate's and Redis' CPU, the flooder's calls and refusals per second, the
# steady caller's calls, refusals and latency.

alloc_port WX_FLOOD_PORT
FLOOD_LIMITS="[{ count = $FLOOD_LIMIT, per = \"1s\", burst = $(((FLOOD_LIMIT + 9) / 10)) }]"
flood_callers() { # flood_callers [RATE]: the [[caller]] blocks; flood guarded at RATE/s if given
  printf '[[caller]]\nname = "flood"\n%s\n[[caller]]\nname = "steady"\npriority = "high"\n' "${1:+rate = \"$1/s\"}"
}
redis_calls() { # redis_calls: "evalsha all" command calls so far (INFO and CONFIG excluded)
  redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' | awk -F'[=,:]' '
    /^cmdstat_/ { if ($1 != "cmdstat_info" && $1 != "cmdstat_config") all += $3; if ($1 == "cmdstat_evalsha") ev += $3 }
    END { printf "%d %d\n", ev, all }'
}

# flood_run KEY: both callers against the running wxgate ($WX_PID); figures in $TMP/KEY.*
flood_run() {
  local key=$1 url="http://127.0.0.1:$WX_FLOOD_PORT$REQ_PATH" ev0 all0 ev1 all1 w0 r0 w1 r1 t0 t1
  # Warm-up: both callers for WARMUP seconds (connections, the script cache, Redis' keys).
  wrk -t1 -c"$CONNS" -d"${WARMUP}s" -H 'X-Wx-Caller: flood' "$url" >"$TMP/$key.flood.warm" 2>&1 &
  local fw=$!
  WRK_PACE_MS=20 wrk -t1 -c2 -d"${WARMUP}s" -H 'X-Wx-Caller: steady' -s "$TMP/pace.lua" "$url" \
    >"$TMP/$key.steady.warm" 2>&1 || die "wrk warm-up (steady) for $key failed"
  wait "$fw" || die "wrk warm-up (flood) for $key failed"
  wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -H 'X-Wx-Caller: flood' "$url" >"$TMP/$key.flood.wrk" 2>&1 &
  local fpid=$!
  WRK_PACE_MS=20 wrk -t1 -c2 -d"${DURATION}s" --latency -H 'X-Wx-Caller: steady' -s "$TMP/pace.lua" "$url" \
    >"$TMP/$key.steady.wrk" 2>&1 &
  local spid=$!
  PIDS+=("$fpid" "$spid")
  sleep 0.5
  read -r ev0 all0 <<<"$(redis_calls)"
  w0=$(ticks "$WX_PID"); r0=$(ticks "$REDIS_PID"); t0=$(date +%s.%N)
  sleep $((DURATION - 1))
  read -r ev1 all1 <<<"$(redis_calls)"
  w1=$(ticks "$WX_PID"); r1=$(ticks "$REDIS_PID"); t1=$(date +%s.%N)
  wait "$fpid" || { cat "$TMP/$key.flood.wrk" >&2; die "wrk (flood) for $key failed"; }
  wait "$spid" || { cat "$TMP/$key.steady.wrk" >&2; die "wrk (steady) for $key failed"; }
  parse "$TMP/$key.flood.wrk" >"$TMP/$key.flood.parsed"
  parse "$TMP/$key.steady.wrk" >"$TMP/$key.steady.parsed"
  # "evalsha/s commands/s wxgate-CPU% redis-CPU%" over the sampled span
  awk -v e="$((ev1 - ev0))" -v a="$((all1 - all0))" -v w="$((w1 - w0))" -v r="$((r1 - r0))" -v t0="$t0" -v t1="$t1" \
    -v hz="$CLK" 'BEGIN { s = t1 - t0; printf "%.0f %.0f %.1f %.1f\n", e / s, a / s, w / hz / s * 100, r / hz / s * 100 }' \
    >"$TMP/$key.sampled"
}

flood_section() { # runs both flood runs; the markdown report goes to $TMP/flood.md
  local k rps p50 p99 req non serr srps s50 s99 sreq snon ev all wcpu rcpu
  wxgate_config flood_guard "$WX_FLOOD_PORT" "$(redis_store benchf)" "$FLOOD_LIMITS" "$(flood_callers "$FLOOD_RATE")"
  wxgate_config flood_open "$WX_FLOOD_PORT" "$(redis_store benchf)" "$FLOOD_LIMITS" "$(flood_callers)"
  for k in flood_open flood_guard; do
    log "flood: $k (flood: -c$CONNS, no back-off; steady: -c2, 20 ms pause after each answer)"
    redis-cli -p "$REDIS_PORT" flushall >/dev/null
    start_wxgate "$k" "$WX_FLOOD_PORT"
    flood_run "$k"
    stop_pid "$WX_PID"
  done
  {
    echo "### Flood guard: one caller floods, one sends steadily (Redis store, one account, one rule)"
    echo
    echo "Rule \`bench\`: \`$FLOOD_LIMITS\`. Callers: \`flood\` (wrk -t1 -c$CONNS, no back-off, answers ignored)"
    echo "and \`steady\` (priority high; wrk -t1 -c2, each connection pausing 20 ms after every answer: ≤ 100 calls/s)."
    echo "\"guard\": \`[[caller]] name = \"flood\" rate = \"$FLOOD_RATE/s\"\`; \"no guard\": the same without \`rate\`."
    echo "${DURATION} s each after a ${WARMUP} s warm-up; Redis and CPU figures from 0.5 s in to 0.5 s before the end."
    echo
    echo "| run | Redis commands/s (scripts' own included) | EVALSHA/s (round trips) | flood calls/s | flood refused/s | wxgate CPU | wxgate CPU per flood call | Redis CPU | steady calls/s | steady refused | steady p50 | steady p99 |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for k in flood_open flood_guard; do
      read -r rps p50 p99 req non serr <<<"$(cat "$TMP/$k.flood.parsed")"
      read -r srps s50 s99 sreq snon _ <<<"$(cat "$TMP/$k.steady.parsed")"
      read -r ev all wcpu rcpu <<<"$(cat "$TMP/$k.sampled")"
      printf '| %s | %s | %s | %.0f | %s | %s %% | %s | %s %% | %.0f | %s of %s | %s | %s |\n' \
        "$([ "$k" = flood_guard ] && echo "guard ($FLOOD_RATE/s)" || echo "no guard")" "$all" "$ev" "$rps" \
        "$(awk -v n="$non" -v d="$DURATION" 'BEGIN { printf "%.0f", n / d }')" "$wcpu" \
        "$(awk -v c="$wcpu" -v r="$rps" -v s="$srps" 'BEGIN { printf "%.1f µs", c / 100 * 1e6 / (r + s) }')" \
        "$rcpu" "$srps" "$snon" "$sreq" "$(fmt_us "$s50")" "$(fmt_us "$s99")"
    done
    echo
    echo "Redis counts the commands a script runs (TIME, HMGET, HSET...) as commands too: the first column is the work"
    echo "Redis does, the second the round trips (one EVALSHA decides a batch of an account's concurrent calls)."
    echo "\"wxgate CPU per flood call\": wxgate's CPU time over all calls answered (flood and steady) per call; the"
    echo "flooder's are most of them. Refused calls (flood or steady) are 429: by the rule (reason \`rate\`, decided"
    echo "in Redis, or answered from the refusal cache) without the guard; by the guard (\`caller_rate\`, in-process)"
    local rev; rev=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
    [ -z "$(git -C "$REPO" status --porcelain -- src lua Cargo.toml Cargo.lock 2>/dev/null)" ] || rev+=" + uncommitted changes"
    echo "with it. wxgate $rev, $(nproc) cores shared by"
    echo "both wrk, wxgate, Redis and the mock: compare the two rows, not these figures with another machine's."
  } >"$TMP/flood.md"
}

# section_results NAME FILE HEADER: the report $TMP/NAME.md (flood, peers),
# printed and appended to FILE (after HEADER lines, if any)
section_results() {
  echo
  cat "$TMP/$1.md"
  mkdir -p "$REPO/bench/results"
  { if [ -n "$3" ]; then echo "$3"; echo; fi; cat "$TMP/$1.md"; echo; } >>"$2"
  log "$1 results saved to $2"
}
. bench/peers.sh
machine() { # machine: the machine and tool versions, a markdown table
  echo "| | |"
  echo "|---|---|"
  echo "| date | $(date -u) |"
  echo "| host | $(hostname -s) |"
  echo "| nproc | $(nproc) |"
  echo "| memory | $(free -h | awk '/^Mem:/ { print $2 }') |"
  echo "| CPU | $(lscpu | sed -n 's/^Model name: *//p' | head -1) |"
  echo "| kernel | $(uname -r) |"
  echo "| nginx | $(nginx -v 2>&1 | sed 's/^nginx version: //') |"
  if want peers || want accounts; then
    echo "| ngx_http_lua, lua-resty-redis, LuaJIT | $(dpkg-query -W -f='${Version}' libnginx-mod-http-lua 2>/dev/null || echo '?'), $(dpkg-query -W -f='${Version}' lua-nginx-redis 2>/dev/null || echo '?'), $(dpkg-query -W -f='${Version}' libluajit2-5.1-2 2>/dev/null || echo '?') (Debian packages) |"
  fi
  echo "| wrk | $(wrk -v 2>&1 | head -1 | awk '{ print $1, $2 }')${WRK2:+; wrk2 $WRK2} |"
  echo "| redis-server | $(redis-server --version | head -1) |"
  echo "| wxgate | $COMMIT |"
}
# results_path [SUFFIX]: bench/results/<date>-<host>[-SUFFIX][-BENCH_NAME].md, or with -2, -3, ...
# before .md when that file exists already (a second run the same day never overwrites the first)
results_path() {
  local base p n=2
  base="$REPO/bench/results/$(date -u +%Y-%m-%d)-$(hostname -s)${1:+-$1}${BENCH_NAME:+-$BENCH_NAME}"
  p="$base.md"
  while [ -e "$p" ]; do p="$base-$n.md"; n=$((n + 1)); done
  echo "$p"
}
mkdir -p "$REPO/bench/results"
if ! want standard; then
  if want peers || want accounts; then
    OUT=$(results_path peers)
    peers_section
    section_results peers "$OUT" "# wxgate against its peers, $(date -u) ($(hostname -s), \`$CMD\`)"$'\n\n'"$(machine)"
  fi
  if want flood; then
    flood_section
    section_results flood "$(results_path flood)" \
      "# wxgate flood guard benchmark, $(date -u) ($(hostname -s), \`$CMD\`)"
  fi
  exit 0
fi

# Pass 1: each target at full load; in rounds (MULTI), with the baseline too.
CFG=([3]=memory [4]=redis [5]=redis1 [6]=reject [7]=rejectnc [8]=spent [9]=spentnc)  # config = key name
declare -A PORT_OF=([memory]=$WX_MEM_PORT [redis]=$WX_REDIS_PORT [redis1]=$WX_REDIS1_PORT
  [reject]=$WX_REJECT_PORT [rejectnc]=$WX_REJECTNC_PORT [spent]=$WX_SPENT_PORT [spentnc]=$WX_SPENTNC_PORT)
KEYS=(direct nginx memory redis redis1 reject rejectnc spent spentnc)   # targets 1-9
# p1key WHO NAME ROUND -> the key of a pass-1 run (WHO: cur or base)
p1key() { if ((MULTI)); then echo "r$3_$1_$2"; else echo "p1_$2"; fi; }
# compared N: is target N run with the baseline too?
compared() { [ -n "$BASE_BIN" ] && [[ $COMPARE == *" $1 "* ]] && [ "${BASE_OK[${CFG[$1]}]:-0}" = 1 ]; }

# Targets 8 and 9: a day quota of 1, spent by the first call of the warm-up.
SPENT='[{ count = 1, per = "day" }]'
wxgate_config spent "$WX_SPENT_PORT" "$(redis_store bench8)" "$SPENT"
wxgate_config spentnc "$WX_SPENTNC_PORT" "$(redis_store bench9 'refusal_cache = false')" "$SPENT"
if [ -n "$BASE_BIN" ] && ! compared 3 && ! compared 4; then
  cat "$TMP/memory.base-check" "$TMP/redis.base-check" >&2
  die "the baseline compares neither target 3 nor 4 (BENCH_COMPARE, or it refused both configs: above)"
fi

# Targets 6 and 7: a limit at ~10 % of what target 4 achieved (the current
# binary, round 1), burst 1.
reject_configs() {
  read -r RATE4 _ <<<"$(res "$(p1key cur redis 1)")"
  LIMIT5=$(awk -v r="$RATE4" 'BEGIN { x = r * 0.1; c = int(x); if (c < x) c++; if (c < 1) c = 1; print c }')
  RATE5="[{ count = $LIMIT5, per = \"1s\", burst = 1 }]"
  wxgate_config reject "$WX_REJECT_PORT" "$(redis_store bench5)" "$RATE5"
  wxgate_config rejectnc "$WX_REJECTNC_PORT" "$(redis_store bench5b 'refusal_cache = false')" "$RATE5"
}

perf_memory() { # an extra, unreported run of target 3 under `perf record` (perf slows it)
  log "perf: profiling wxgate (memory store) under full load"
  wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" "http://127.0.0.1:$WX_MEM_PORT$REQ_PATH" >/dev/null 2>&1 &
  PIDS+=("$!")
  perf record -q -g -F 499 -o "$TMP/perf.data" -p "$WX_PID" -- sleep $((DURATION - 1)) >"$TMP/perf.log" 2>&1 ||
    log "perf record failed: $(tail -1 "$TMP/perf.log")"
  wait "$!" || true
}

# pass1_wx N KEY [BINARY]: target N's wxgate (default: the current build) at full load
pass1_wx() {
  local n=$1 key=$2 bin=${3:-$WXGATE} name=${CFG[$1]}
  # In rounds, every run starts from an empty Redis: the two binaries' Lua
  # scripts need not agree on the state they keep, and runs stay alike.
  if ((MULTI)); then redis-cli -p "$REDIS_PORT" flushall >/dev/null; fi
  start_wxgate "$name" "${PORT_OF[$name]}" "$bin"
  target "$key" "$n" "$CONNS"
  if ((n == 3 && ROUND == 1)) && [ "$bin" = "$WXGATE" ] && [ "$PERF" = 1 ]; then perf_memory; fi
  stop_pid "$WX_PID"
}

for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
  if ((MULTI)); then log "pass 1, round $ROUND of $ROUNDS${BASE_BIN:+ (each compared target: baseline, then current)}"; fi
  target "$(p1key cur direct "$ROUND")" 1 "$CONNS"
  target "$(p1key cur nginx "$ROUND")" 2 "$CONNS"
  for n in 3 4 5 6 7 8 9; do
    if ((n == 6 && ROUND == 1)); then reject_configs; fi
    if compared "$n"; then pass1_wx "$n" "r${ROUND}_base_${CFG[$n]}" "$BASE_BIN"; fi
    pass1_wx "$n" "$(p1key cur "${CFG[$n]}" "$ROUND")"
  done
done

# mid_round KEYS...: the round (1-based) of the median requests/s among these runs
# (the lower middle one for an even count)
mid_round() {
  local k r=0
  for k in "$@"; do r=$((r + 1)); echo "$(awk '{ print $1 }' "$TMP/$k.parsed") $r"; done |
    sort -g | awk '{ a[NR] = $2 } END { print a[int((NR + 1) / 2)] }'
}
if ((MULTI)); then
  # The nine-target tables below show, per target, the current binary's median round.
  declare -A MID
  for k in "${KEYS[@]}"; do
    runs=(); for ((r = 1; r <= ROUNDS; r++)); do runs+=("r${r}_cur_$k"); done
    MID[$k]=$(mid_round "${runs[@]}")
    for ext in wrk warm cpu cpuv parsed; do cp "$TMP/r${MID[$k]}_cur_$k.$ext" "$TMP/p1_$k.$ext"; done
    EVALSHA[p1_$k]=${EVALSHA[r${MID[$k]}_cur_$k]}
  done
fi

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

# series WHO KEY WHAT: per round (WHO: cur or base), requests/s (WHAT = rps) or
# the CPU µs per call of the process group WHAT (wxgate, redis, nginx-proxy)
series() {
  local r f
  for ((r = 1; r <= ROUNDS; r++)); do
    f=$TMP/r${r}_$1_$2
    [ -f "$f.parsed" ] || continue
    if [ "$3" = rps ]; then awk '{ print $1 }' "$f.parsed"; else
      awk -v g="$3" -v r="$(awk '{ print $1 }' "$f.parsed")" '$1 == g { printf "%.3f\n", $2 / 100 * 1e6 / r }' "$f.cpuv"
    fi
  done
}
# per_round KEY WHAT: each round's current/baseline of WHAT (as for series)
per_round() {
  paste -d' ' <(series base "$1" "$2") <(series cur "$1" "$2") |
    awk '$1 > 0 && $2 != "" { printf "%s%.2f", n++ ? " " : "", $2 / $1 } END { if (!n) printf "–" }'
}
nonok() { # nonok WHO KEY: non-2xx answers in % of all over the rounds (+ socket errors)
  local r f
  for ((r = 1; r <= ROUNDS; r++)); do f=$TMP/r${r}_$1_$2.parsed; if [ -f "$f" ]; then cat "$f"; fi; done |
    awk '{ req += $4; non += $5; serr += $6 } END { if (!NR) { printf "–"; exit }
      printf "%.1f %%", req ? 100 * non / req : 0; if (serr) printf " (+%d socket errors)", serr }'
}
# why_not N: why target N has no baseline runs
why_not() {
  if [[ $COMPARE != *" $1 "* ]]; then echo "not in BENCH_COMPARE"; else
    echo "the baseline refuses its config: $(grep . "$TMP/${CFG[$1]}.base-check" | tail -1 | tr '|' '/')"
  fi
}

compare_report() {
  local n k w b c
  if [ -n "$BASE_BIN" ]; then echo "### Baseline comparison: pass 1 in $ROUNDS round$( ((ROUNDS == 1)) || echo s), interleaved"
  else echo "### Pass 1 in $ROUNDS rounds"; fi
  echo
  [ -z "$BASE_BIN" ] || echo "- baseline: $BASE_LABEL"
  echo "- current: $CURRENT_LABEL"
  echo "- command: \`$CMD\`"
  echo "- each run: wrk -t$THREADS -c$CONNS -d${DURATION}s after a ${WARMUP} s warm-up. Each round runs targets 1-9 in order;${BASE_BIN:+ a compared target runs with the baseline, then at once with the current binary (same config file, port and wrk settings);} Redis is flushed before each wxgate start."
  echo "- each cell: median (min–max) over the rounds. CPU per call = the process's CPU time over the measured run / calls answered.${BASE_BIN:+ current/baseline: of the medians; per round: current/baseline in each round, a pair measured back to back.}"
  echo
  if [ -z "$BASE_BIN" ]; then
    echo "| # | target | requests/s | proxy CPU per call | Redis CPU per call | non-2xx |"
    echo "|---|---|---:|---:|---:|---:|"
    for n in 1 2 3 4 5 6 7 8 9; do
      k=${KEYS[$((n - 1))]}; w=wxgate; ((n == 2)) && w=nginx-proxy
      printf '| %d | %s | %s | %s | %s | %s |\n' "$n" "${NAMES[$n]}" "$(series cur "$k" rps | summ %.0f '')" \
        "$(if ((n > 1)); then series cur "$k" "$w" | summ %.1f ' µs'; else echo –; fi)" \
        "$(if ((n >= 4)); then series cur "$k" redis | summ %.1f ' µs'; else echo –; fi)" "$(nonok cur "$k")"
    done
    echo
    return
  fi
  echo "Requests/s:"
  echo
  echo "| # | target | baseline | current | current/baseline | per round | non-2xx, baseline / current |"
  echo "|---|---|---:|---:|---:|---:|---:|"
  for n in 3 4 5 6 7 8 9; do
    k=${CFG[$n]}
    if ! compared "$n"; then
      printf '| %d | %s | %s | %s | | | – / %s |\n' "$n" "${NAMES[$n]}" "$(why_not "$n")" \
        "$(series cur "$k" rps | summ %.0f '')" "$(nonok cur "$k")"
      continue
    fi
    b=$(series base "$k" rps | median); c=$(series cur "$k" rps | median)
    printf '| %d | %s | %s | %s | **%s** | %s | %s / %s |\n' "$n" "${NAMES[$n]}" "$(series base "$k" rps | summ %.0f '')" \
      "$(series cur "$k" rps | summ %.0f '')" "$(ratio "$c" "$b")" "$(per_round "$k" rps)" \
      "$(nonok base "$k")" "$(nonok cur "$k")"
  done
  echo
  echo "CPU per call (µs):"
  echo
  echo "| # | target | wxgate, baseline | wxgate, current | current/baseline | per round | Redis, baseline | Redis, current | current/baseline |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
  for n in 3 4 5 6 7 8 9; do
    k=${CFG[$n]}
    if ! compared "$n"; then
      printf '| %d | %s | %s | %s | | | | %s | |\n' "$n" "${NAMES[$n]}" "$(why_not "$n")" \
        "$(series cur "$k" wxgate | summ %.1f '')" "$(if ((n >= 4)); then series cur "$k" redis | summ %.1f ''; else echo –; fi)"
      continue
    fi
    b=$(series base "$k" wxgate | median); c=$(series cur "$k" wxgate | median)
    printf '| %d | %s | %s | %s | **%s** | %s |' "$n" "${NAMES[$n]}" "$(series base "$k" wxgate | summ %.1f '')" \
      "$(series cur "$k" wxgate | summ %.1f '')" "$(ratio "$c" "$b")" "$(per_round "$k" wxgate)"
    if ((n >= 4)); then
      b=$(series base "$k" redis | median); c=$(series cur "$k" redis | median)
      printf ' %s | %s | %s |\n' "$(series base "$k" redis | summ %.1f '')" "$(series cur "$k" redis | summ %.1f '')" "$(ratio "$c" "$b")"
    else
      printf ' – | – | |\n'
    fi
  done
  echo
  echo "For scale, the same rounds without wxgate: direct $(series cur direct rps | summ %.0f '') requests/s;" \
    "nginx proxy_pass $(series cur nginx rps | summ %.0f '') requests/s at $(series cur nginx nginx-proxy | summ %.1f ' µs') CPU per call."
  echo "Targets 6 and 7 use the limit of round 1 (below) for both binaries. A ratio within the min–max spread of either binary is noise."
  echo
}

# runs WHO K: the keys of target K's pass-1 runs by WHO (cur or base), one per round
runs() {
  local r
  if ((MULTI)); then for ((r = 1; r <= ROUNDS; r++)); do
    if [ -f "$TMP/r${r}_$1_$2.parsed" ]; then echo "r${r}_$1_$2"; fi
  done; else echo "p1_$2"; fi
}
# pinned_report: per target (its proxy alone on one core), median and range over the rounds
pinned_report() {
  local n k who w key rows col med ngx=""
  echo "### Per proxy core (pinned: the proxy under test alone on CPU $PROXY_CPU, wrk, the mock upstream and Redis on CPU $OTHER_CPUS)"
  echo
  echo "nginx: worker_processes 1; wxgate: \`workers = 1\`. Each cell: median (min–max) over $(((MULTI)) && echo "$ROUNDS rounds" || echo "1 run")."
  echo "Calls/s per proxy core = requests/s ÷ the proxy's share of its core over the measured run (= 10⁶ ÷ CPU µs per call);"
  echo "vs nginx: of the medians of calls/s per proxy core."
  echo
  echo "| # | target | binary | requests/s | proxy CPU (% of its core) | calls/s per proxy core | vs nginx | CPU per call | p50 | p99 |"
  echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
  for n in 2 3 4 5 6 7 8 9; do
    k=${KEYS[$((n - 1))]}; w=wxgate; ((n == 2)) && w=nginx-proxy
    for who in base cur; do
      if [ "$who" = base ] && { ((n == 2)) || ! compared "$n"; }; then continue; fi
      rows=$(for key in $(runs "$who" "$k"); do per_run "$key" "$w"; done)
      [ -n "$rows" ] || continue
      col() { awk -v i="$1" '{ print $i }' <<<"$rows"; }
      med=$(col 6 | median)
      ((n == 2)) && ngx=$med
      printf '| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$n" "${NAMES[$n]}" \
        "$([ "$who" = base ] && echo baseline || echo current)" "$(col 1 | summ %.0f '')" "$(col 4 | summ %.0f ' %%')" \
        "$(col 6 | summ %.0f '')" "$(if ((n == 2)); then echo 1.00×; else ratio "$med" "$ngx"; fi)" \
        "$(col 5 | summ %.1f ' µs')" "$(col 2 | ms | summ %.2f ' ms')" "$(col 3 | ms | summ %.2f ' ms')"
    done
  done
  echo
  local low; low=$(for n in 2 3 4 5 6 7 8 9; do k=${KEYS[$((n - 1))]}; w=wxgate; ((n == 2)) && w=nginx-proxy
    for key in $(runs cur "$k"); do per_run "$key" "$w"; done; done | awk '$4 < 90 { n++ } END { print n + 0 }')
  if ((low)); then
    echo "Note: in $low run(s) the proxy used less than 90 % of its core: wrk, the mock or Redis (on CPU $OTHER_CPUS) set the pace, and calls/s per proxy core is extrapolated from the proxy's CPU time."
    echo
  fi
}

report() {
  local k n rps p50 p99 req non serr
  read -r NGX_RPS _ <<<"$(res p1_nginx)"
  read -r _ D50 D99 _ <<<"$(res p1_direct)"
  echo "### Pass 1: full load (wrk -t$THREADS -c$CONNS -d${DURATION}s --latency, after a ${WARMUP} s warm-up)"
  echo
  if ((MULTI)); then
    echo "The current binary: per target, its median round of $ROUNDS by requests/s (for targets 1-9, rounds$(for k in "${KEYS[@]}"; do printf ' %s' "${MID[$k]}"; done))."
    echo
  fi
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
  echo "Targets 6 and 7: limit \`{ count = $LIMIT5, per = \"1s\", burst = 1 }\` (ceil of 10 % of target 4's $(printf %.0f "$RATE4") requests/s$( ((MULTI == 0)) || echo " in round 1"))."
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
  echo "| # | target | requests/s | p50 | p99 | p50 added over direct | p99 added over direct | p99 over nginx proxy_pass's | CPU (% of one core) |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---|"
  read -r _ D50 D99 _ <<<"$(res p2_direct)"
  read -r _ _ N99 _ <<<"$(res p2_nginx)"
  n=0
  for k in direct nginx memory redis redis1; do
    n=$((n + 1))
    read -r rps p50 p99 req non serr <<<"$(res p2_$k)"
    printf '| %d | %s | %.0f | %s | %s | %s | %s | %s | %s |\n' "$n" "${NAMES[$n]}" "$rps" "$(fmt_us "$p50")" \
      "$(fmt_us "$p99")" "$(fmt_add $((p50 - D50)))" "$(fmt_add $((p99 - D99)))" \
      "$(if ((n >= 3)); then fmt_add $((p99 - N99)); else echo –; fi)" "$(cat "$TMP/p2_$k.cpu")"
  done
  echo
  echo "Notes:"
  if ((PIN)); then
    echo "- Pinned: the proxy under test (nginx proxy_pass, worker_processes 1; wxgate, workers = 1) alone on CPU"
    echo "  $PROXY_CPU; wrk ($THREADS threads), the mock upstream (nginx, worker_processes 1) and Redis on CPU $OTHER_CPUS."
    echo "  Target 1 (direct) measures what CPU $OTHER_CPUS can drive without a proxy."
  else
    echo "- All processes share one $(nproc)-core machine: wrk ($THREADS threads), the proxy under test, the mock"
    echo "  upstream (nginx, worker_processes 1, as is the nginx proxy) and Redis. The numbers compare CPU cost"
    echo "  per call as much as capacity, and are noisy; rerun before trusting a few-% difference."
  fi
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

CURRENT_LABEL="${COMMIT%% *}"
[ "$COMMIT" = "$CURRENT_LABEL" ] || CURRENT_LABEL+=" + uncommitted changes (in src/, lua/ or Cargo.*)"
if [ -n "$CUR_BIN" ]; then   # BENCH_BIN: a built binary, not this tree
  COMMIT="binary \`$CUR_BIN\` (sha256 $(sha256sum "$CUR_BIN" | cut -c1-12))"
  CURRENT_LABEL="BENCH_BIN ${BENCH_BIN_NAME:-$CUR_BIN}"
else
  CURRENT_LABEL+=" ($(subject HEAD))"
fi
if ((MULTI)); then TABLE="$(compare_report)"$'\n\n'"$(report)"; else TABLE=$(report); fi
if ((PIN)); then TABLE="$(pinned_report)"$'\n\n'"$TABLE"; fi
echo
echo "$TABLE"

# --- results file -------------------------------------------------------------------

OUT=$(results_path)
{
  echo "# wxgate benchmark, $(date -u)"
  echo
  echo "Produced by \`bench/run.sh\` (BENCH_DURATION=$DURATION BENCH_CONNECTIONS=$CONNS BENCH_THREADS=$THREADS BENCH_PIN=$PIN)."
  echo
  machine
  [ -z "$BASE_BIN" ] || echo "| baseline | $BASE_LABEL |"
  ((MULTI == 0)) || echo "| command | \`$CMD\` |"
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
  if ((MULTI)); then # in the order they ran
    raw=()
    for ((r = 1; r <= ROUNDS; r++)); do
      for k in "${KEYS[@]}"; do for f in "$TMP/r${r}_base_$k.wrk" "$TMP/r${r}_cur_$k.wrk"; do
        if [ -f "$f" ]; then raw+=("$f"); fi
      done; done
    done
    raw+=("$TMP"/p2_*.wrk)
  else raw=("$TMP"/p[12]_*.wrk); fi
  for f in "${raw[@]}"; do
    echo "#### $(basename "$f" .wrk)"
    echo
    echo '```'
    cat "$f"
    echo '```'
  done
  echo "</details>"
} >"$OUT"
log "results saved to $OUT"
if want peers || want accounts; then
  peers_section
  section_results peers "$OUT" ""
fi
if want flood; then
  flood_section
  section_results flood "$OUT" ""
fi
