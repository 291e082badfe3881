#!/usr/bin/env bash
# Instructions per call of one or more wxgate binaries, counted by callgrind:
# a figure that does not move with the machine's load, for before/after
# comparisons of a change on the per-call path (bench/run.sh measures time,
# which moves 10-20 % between runs on a shared machine).
#
#   bench/instructions.sh                                  # target/profiling/wxgate
#   bench/instructions.sh old/wxgate target/profiling/wxgate # side by side
#   bench/instructions.sh target/profiling/examples/hyper_floor target/profiling/wxgate
#                          # with the bare hyper proxy: the floor under wxgate
#                          # (cargo build --profile profiling --example hyper_floor)
#   BENCH_LOAD=64 bench/instructions.sh nginx target/profiling/examples/hyper_floor target/profiling/wxgate
#                          # "nginx": nginx proxy_pass itself (one process,
#                          # master_process off), counted the same way
#
# For each binary and store (memory, Redis), wxgate runs under
# `valgrind --tool=callgrind` with `workers = 1`, in front of an nginx mock
# upstream (`return 200`) and its own redis-server, all on 127.0.0.1. curl
# sends BENCH_CALLS sequential calls on one keep-alive connection after a
# warm-up; callgrind's counters are zeroed before them and dumped after, so
# the figure is wxgate's user-space instructions for those calls only,
# divided by their number. Sequential calls are never batched: this is the
# cost of one decision and one forward. (Redis' own cost is not counted: for
# a change to a script, compare the scripts with redis-benchmark.)
#
# Needs valgrind, nginx, redis-server, redis-cli, curl (installed with
# apt-get when missing and we are root). BENCH_CALLS defaults to 2000.
# BENCH_ACCOUNTS=100000 (with BENCH_LOAD): every call another account's,
# round-robin over that many (X-Wx-Account), as bench/run.sh's accounts mode.
# BENCH_LOAD=64 counts under load instead: wrk (1 thread, 64 connections,
# BENCH_LOAD_SECONDS, default 20) against the proxy under callgrind, the
# total divided by the calls wrk completed (the few in flight at the end
# count against it: under 2 % at 64 connections). Under load a proxy
# batches reads and wake-ups; sequential calls show none of that.
# BENCH_SERVER_MORE='window_margin_max = "0s"' adds lines to [server] (that
# one: the margin's probe wakes once a second, not every 10 ms: under
# callgrind a run's 2000 calls take a minute, and the probe's wake-ups
# would count against them).
# BENCH_REDIS_MORE='quota_leases = false' adds lines to the Redis store's
# [store] table (e.g. the per-call path; leases and reserves are the default).
# BENCH_AUTH=1 runs wxgate with caller_auth = "required" (one [[caller]],
# key_sha256, accounts = ["*"]) and every call carries its
# `Authorization: Bearer` key: the cost of proving the caller.
# BENCH_AUTH=header sends the same header to a wxgate without
# caller_auth: the cost of a header that size alone, to tell it apart.
# BENCH_LIMITS='[{ count = 1000000000, per = "day" }]' gives the rule other
# limits than ones that never throttle (a day quota: the admissions journal).
# BENCH_INJECT=1 gives wxgate an [[account]] and sends every call without
# an access_token, naming the account (`/@wxbench.../`): the cost of adding
# the account's token to a call (the credential broker).
# BENCH_RECIPIENTS=N gives wxgate a second rule, "message_send", that
# counts a message's recipients (cost = "recipients", recipients = { field
# = "touser", separator = "|" }, per_recipient windows of 1m and 1h, and a
# day quota: limits that never refuse), and every call is `POST
# /cgi-bin/message/send` with the JSON body {"touser":"u0|u1|...|u(N-1)",
# "msgtype":"text",...} (the same N recipients every call, Content-Length
# set): the cost of reading the body and of N recipients' own windows
# (in Redis one key each). BENCH_RECIPIENTS="0 1 100" runs each in turn,
# with a recipients column (0: the plain calls above, as without it).
# With it, every call must be admitted (the mock's 200) or the run fails.
# BENCH_TRACE=1 (or 0.01) turns tracing on, exporting to the nginx mock:
# the cost of a traced call (docs/tracing.md).
# BENCH_PROFILES=dir keeps each run's callgrind profile there
# (`callgrind_annotate --inclusive=yes dir/1-memory.callgrind.out`).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
export PATH="$PATH:/usr/sbin:/sbin"

CALLS=${BENCH_CALLS:-2000}
LOAD=${BENCH_LOAD:-0}            # connections: wrk under load instead of sequential calls
ACCOUNTS=${BENCH_ACCOUNTS:-1}    # under load: each call another of this many accounts' (X-Wx-Account)
LOAD_SECONDS=${BENCH_LOAD_SECONDS:-20}
[[ $LOAD =~ ^[0-9]+$ && $LOAD_SECONDS =~ ^[0-9]+$ ]] || { echo "bench: BENCH_LOAD and BENCH_LOAD_SECONDS are numbers" >&2; exit 2; }
((LOAD == 0)) || command -v wrk >/dev/null || { echo "bench: BENCH_LOAD needs wrk" >&2; exit 1; }
if ! [[ $CALLS =~ ^[0-9]+$ ]] || ((CALLS == 0)); then
  echo "bench: BENCH_CALLS must be a positive number" >&2
  exit 2
fi
BINS=("$@")
((${#BINS[@]})) || BINS=(target/profiling/wxgate)
for b in "${BINS[@]}"; do
  [ "$b" = nginx ] && continue
  [ -x "$b" ] || { echo "bench: $b is not an executable (build it: cargo build --profile profiling)" >&2; exit 2; }
done

missing=()
command -v valgrind >/dev/null || missing+=(valgrind)
command -v nginx >/dev/null || missing+=(nginx)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v curl >/dev/null || missing+=(curl)
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "bench: missing tools: ${missing[*]}" >&2
    exit 1
  fi
fi

bench_tmp instructions
KEPT=0

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
UP=$(free_port); RP=$(free_port); WP=$(free_port)

bench_nginx_mock "127.0.0.1:$UP" "$TMP/nginx.pid" "$TMP/nginx-error.log" >"$TMP/nginx.conf"
nginx -c "$TMP/nginx.conf" -p "$TMP" & PIDS+=($!)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" >/dev/null & PIDS+=($!)
for _ in $(seq 100); do
  redis-cli -p "$RP" ping >/dev/null 2>&1 && curl -s -o /dev/null "http://127.0.0.1:$UP/" && break
  sleep 0.1
done
redis-cli -p "$RP" ping >/dev/null || { echo "bench: redis-server did not start" >&2; exit 1; }

ENDPOINT=/cgi-bin/message/template/send
URL="http://127.0.0.1:$WP$ENDPOINT?access_token=BENCH"
AUTH=${BENCH_AUTH:-0}
BENCH_KEY=bench-caller-key-0123456789abcdef
HDR=()
SERVER_MORE=$(printf 'workers = 1\n%s' "${BENCH_SERVER_MORE:-}")
RULE_MORE=""
if [ "$AUTH" = header ]; then
  HDR=(-H "Authorization: Bearer $BENCH_KEY")
elif [ "$AUTH" = 1 ]; then
  HDR=(-H "Authorization: Bearer $BENCH_KEY")
  SERVER_MORE=$(printf '%s\ncaller_auth = "required"' "$SERVER_MORE")
  RULE_MORE=$(printf '\n[[caller]]\nname = "bench"\nkey_sha256 = "%s"\naccounts = ["*"]' \
    "$(printf %s "$BENCH_KEY" | sha256sum | cut -d' ' -f1)")
fi
if [ "${BENCH_INJECT:-0}" = 1 ]; then
  export WXGATE_TOKEN_KEY=5f0c9a3e7b2d4f6a8c1e3b5d7f9a0c2e4b6d8f1a3c5e7b9d0f2a4c6e8b1d3f5a  # Redis: the shared token cache
  printf 'BENCHSECRET\n' >"$TMP/bench.secret"
  chmod 600 "$TMP/bench.secret"
  URL="http://127.0.0.1:$WP/@wxbench00000001$ENDPOINT"
  RULE_MORE="$RULE_MORE$(printf '\n[[account]]\nid = "wxbench00000001"\nkind = "official_account"\nsecret_file = "%s"' "$TMP/bench.secret")"
fi
# BENCH_TRACE=ratio: tracing on ([telemetry], docs/tracing.md), every
# call given a trace and `ratio` of them recorded and exported, to the
# nginx mock (which answers the OTLP posts 200).
if [ -n "${BENCH_TRACE:-}" ]; then
  [[ $BENCH_TRACE =~ ^(0|1|0\.[0-9]+)$ ]] || { echo "bench: BENCH_TRACE is a ratio from 0 to 1" >&2; exit 2; }
  RULE_MORE="$RULE_MORE$(printf '\n[telemetry]\nendpoint = "http://127.0.0.1:%s"\nsampling = %s' "$UP" "$BENCH_TRACE")"
fi
# BENCH_RECIPIENTS: the recipient counts to run (unset: plain calls only,
# without the recipients column).
RCPTS=${BENCH_RECIPIENTS:-}
RCPTS=(${RCPTS//,/ })
WITH_RCPT=$((${#RCPTS[@]} > 0))
((WITH_RCPT)) || RCPTS=(0)
for r in "${RCPTS[@]}"; do
  [[ $r =~ ^[0-9]+$ ]] && ((r <= 1000)) || { echo "bench: BENCH_RECIPIENTS: numbers from 0 to 1000 (a call names at most 1000)" >&2; exit 2; }
done
PLAIN_URL=$URL
PLAIN_RULE_MORE=$RULE_MORE
BODY=()   # curl's arguments for the call's body (none: a GET)
RCPT_LIMITS='[{ count = 1000000000, per = "day" }]'   # message_send's own (BENCH_LIMITS: both rules')
recipients() { # recipients N: URL, BODY and RULE_MORE for calls to N recipients (0: plain calls)
  URL=$PLAIN_URL
  RULE_MORE=$PLAIN_RULE_MORE
  BODY=()
  rm -f "$TMP/post.lua"
  (($1)) || return 0
  URL=${PLAIN_URL/$ENDPOINT//cgi-bin/message/send}
  local touser=u0 i
  for ((i = 1; i < $1; i++)); do touser+="|u$i"; done
  local body='{"touser":"'"$touser"'","msgtype":"text","agentid":1,"text":{"content":"hi"}}'
  # --data-binary: the body as is, with its Content-Length; no
  # `Expect: 100-continue` (curl's for bodies over 1 KiB).
  BODY=(-H 'Content-Type: application/json' -H 'Expect:' --data-binary "$body")
  printf 'wrk.method = "POST"\nwrk.body = [[%s]]\nwrk.headers["Content-Type"] = "application/json"\n' "$body" \
    >"$TMP/post.lua"
  RULE_MORE="$RULE_MORE$(printf '\n[[rule]]\nname = "message_send"\nmatch = ["/cgi-bin/message/send"]\nlimits = %s\ncost = "recipients"\nrecipients = { field = "touser", separator = "|" }\nper_recipient = %s' \
    "${BENCH_LIMITS:-$RCPT_LIMITS}" \
    '[{ count = 1000000000, per = "1m", burst = 1000000000 }, { count = 1000000000, per = "1h", burst = 1000000000 }]')"
}
calls() { # calls N: N sequential calls on one connection
  local urls=()
  for ((i = 0; i < $1; i++)); do urls+=("$URL"); done
  if ((WITH_RCPT)); then   # each call's status, after its answer: all 200
    local ok
    ok=$(curl -s "${HDR[@]}" "${BODY[@]}" -w ' %{http_code}\n' "${urls[@]}" | grep -c ' 200$' || true)
    ((ok == $1)) || { echo "bench: $(( $1 - ok )) of $1 calls not admitted (not the mock's 200)" >&2; exit 1; }
  else
    curl -s "${HDR[@]}" "${urls[@]}" >/dev/null
  fi
}

if ((WITH_RCPT)); then
  printf '| binary | store | recipients | instructions per call |\n|---|---|---:|---:|\n'
else
  printf '| binary | store | instructions per call |\n|---|---|---:|\n'
fi
for rcpt in "${RCPTS[@]}"; do
  recipients "$rcpt"
  for bin in "${BINS[@]}"; do
    stores=(memory redis)
    floor=0
    # The bare hyper proxy (examples/hyper_floor.rs) and nginx have no store
    # and no wxgate config.
    [ "$(basename "$bin")" = hyper_floor ] && { floor=1; stores=(none); }
    [ "$bin" = nginx ] && { floor=1; stores=(none); }
    for store in "${stores[@]}"; do
      if [ "$store" = memory ]; then
        store_toml='kind = "memory"'
      else
        store_toml=$(printf 'kind = "redis"\nurl = "redis://127.0.0.1:%s"\ntimeout = "2s"\n%s' "$RP" "${BENCH_REDIS_MORE:-}")
      fi
      bench_wxgate_toml "127.0.0.1:$WP" "http://127.0.0.1:$UP" "$store_toml" "$SERVER_MORE" "${BENCH_LIMITS:-$BENCH_NEVER}" "$RULE_MORE" \
        >"$TMP/wxgate.toml"
      redis-cli -p "$RP" flushall >/dev/null
      args=(--config "$TMP/wxgate.toml")
      ((floor)) && args=("127.0.0.1:$WP" "127.0.0.1:$UP")
      exe=$bin
      if [ "$bin" = nginx ]; then   # bench/floor.sh's nginx proxy_pass, in one process
        mkdir -p "$TMP/px"
        bench_nginx_proxy "127.0.0.1:$WP" "127.0.0.1:$UP" "$TMP/px/nginx.pid" "$TMP/px/error.log" \
          'master_process off;' >"$TMP/px/nginx.conf"
        exe=$(command -v nginx)
        args=(-c "$TMP/px/nginx.conf" -p "$TMP/px/")
      fi
      valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.%p.out" "$exe" "${args[@]}" 2>"$TMP/valgrind.log" &
      vg=$!
      PIDS+=("$vg")   # stopped by the cleanup if the run fails
      ok=0
      for _ in $(seq 150); do
        if curl -s -o /dev/null "${HDR[@]}" "${BODY[@]}" "$URL"; then ok=1; break; fi
        sleep 0.2
      done
      ((ok)) || { cat "$TMP/valgrind.log" >&2; echo "bench: $bin did not start" >&2; exit 1; }
      calls 200
      callgrind_control -z "$vg" >/dev/null 2>&1
      n=$CALLS
      if ((LOAD)); then
        script=()
        [ -f "$TMP/post.lua" ] && script=(-s "$TMP/post.lua")
        if ((ACCOUNTS > 1)); then   # every call another account's, round-robin
          printf 'local n, i = %d, 0\nlocal hdr = { ["X-Wx-Account"] = "" }\nfunction request()\n  i = i %% n + 1\n  hdr["X-Wx-Account"] = "wxacct" .. i\n  return wrk.format(nil, nil, hdr)\nend\n' \
            "$ACCOUNTS" >"$TMP/accounts.lua"
          script=(-s "$TMP/accounts.lua")
        fi
        wrk -t1 -c"$LOAD" -d"${LOAD_SECONDS}s" "${HDR[@]}" "${script[@]}" "$URL" >"$TMP/wrk.out"
        if ((WITH_RCPT)) && grep -q 'Non-2xx' "$TMP/wrk.out"; then
          cat "$TMP/wrk.out" >&2; echo "bench: calls not admitted under load" >&2; exit 1
        fi
        n=$(awk '/requests in/ {print $1}' "$TMP/wrk.out")
        [[ $n =~ ^[0-9]+$ ]] && ((n > 0)) || { cat "$TMP/wrk.out" >&2; echo "bench: wrk made no calls" >&2; exit 1; }
      else
        calls "$CALLS"
      fi
      callgrind_control -d "$vg" >/dev/null 2>&1
      # SIGINT: wxgate's graceful stop. The floor has no handler, and a
      # background job ignores SIGINT: it gets SIGTERM.
      if ((floor)); then kill -TERM "$vg"; else kill -INT "$vg"; fi
      wait "$vg" 2>/dev/null || true
      unset 'PIDS[-1]'
      dump=$(find "$TMP" -name "cg.$vg.out.*" -printf '%T@ %p\n' | sort -rn | head -1 | cut -d' ' -f2-)
      total=$(grep -m1 '^summary:' "$dump" | awk '{print $2}')
      if [ -n "${BENCH_PROFILES:-}" ]; then   # keep the profile, for callgrind_annotate
        mkdir -p "$BENCH_PROFILES"
        name=$((++KEPT))-$store
        ((WITH_RCPT)) && name+=-r$rcpt
        cp "$dump" "$BENCH_PROFILES/$name.callgrind.out"
      fi
      rm -f "$TMP"/cg.*
      if ((WITH_RCPT)); then
        printf '| %s | %s | %d | %d |\n' "$bin" "$store" "$rcpt" $((total / n))
      else
        printf '| %s | %s | %d |\n' "$bin" "$store" $((total / n))
      fi
    done
  done
done
echo
if ((LOAD)); then
  echo "(wrk with $LOAD connections for ${LOAD_SECONDS} s per row, divided by the calls wrk completed, after 200 warm-up calls; callgrind counts the proxy's user-space instructions only)"
else
  echo "($CALLS sequential calls per row, after 200 warm-up calls; callgrind counts the proxy's user-space instructions only)"
fi
