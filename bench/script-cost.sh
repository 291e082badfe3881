#!/usr/bin/env bash
# Redis' own time per call of wxgate's acquire.lua (lua/prelude.lua + lua/acquire.lua,
# as the Redis store loads it) against the GCRA of the OpenResty peer (bench/peers.sh):
# `redis-benchmark -c1` sends the same EVALSHA over and over, then INFO
# commandstats gives Redis' time inside the command (usec_per_call: the script,
# no network, no client). Cases:
#   gcra              OpenResty's GCRA, one key
#   window            acquire.lua, one call, a rule with one window
#   window+day        the same rule with a day quota too (as the accounts mode),
#                     with an instance id (production: the per-instance day count)
#   window+day x8     eight calls in one run (a batch), same account
#   window+day x8 acc eight calls in one run, eight accounts
# each on one hot key (1 account) and on fresh keys (BENCH_KEYS random
# accounts, default 100000: most calls create their account's state).
#
#   bench/script-cost.sh                    # BENCH_CALLS=100000 per case, BENCH_ROUNDS=3
#   BENCH_CALLGRIND=1 BENCH_CALLS=3000 BENCH_ROUNDS=1 bench/script-cost.sh
#                                           # redis-server's instructions instead of its time
#                                           # (under callgrind: exact, needs valgrind)
#   BENCH_ACQUIRE_BASE=old-acquire.lua bench/script-cost.sh   # each acquire case also with an
#                                           # older lua/acquire.lua, run just before (before/after;
#                                           # it must take the same arguments: the one of
#                                           # the commit that changed them, at the earliest)
# Needs redis-server and redis-benchmark (redis-tools); installs them as root.
set -euo pipefail
cd "$(dirname "$0")/.."
CALLS=${BENCH_CALLS:-100000}
ROUNDS=${BENCH_ROUNDS:-3}
NKEYS=${BENCH_KEYS:-100000}
for v in CALLS ROUNDS NKEYS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "script-cost: $v must be a whole number ≥ 1, got '${!v}'" >&2; exit 2; }
done
if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
  else
    echo "script-cost: needs redis-server and redis-benchmark (apt-get install redis-server redis-tools)" >&2; exit 1
  fi
fi
. bench/lib.sh
bench_tmp script-cost
NEXT_PORT=18700
bench_port PORT
GRIND=()
if [ "${BENCH_CALLGRIND:-0}" = 1 ]; then
  command -v valgrind >/dev/null || { echo "script-cost: BENCH_CALLGRIND=1 needs valgrind (apt-get install valgrind)" >&2; exit 1; }
  GRIND=(valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.%p.out")
fi
"${GRIND[@]}" redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" >"$TMP/redis.log" 2>&1 &
RPID=$!
PIDS+=("$RPID")
for _ in $(seq 300); do redis-cli -p "$PORT" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
rc() { redis-cli -p "$PORT" "$@"; }
ACQ=$(cat lua/prelude.lua lua/acquire.lua | rc -x script load)
GCRA=$(rc script load "$BENCH_GCRA_LUA")

# One call's keys and values for acquire.lua (see its header): account A's
# pair state (a rule without warm-up or concurrency cap has no other key);
# the first call of a run sends the rule's spec, the next ones "=".
WIN='w w1000 1 1000000 0'                     # 1,000,000/s, burst 1,000,000: never refuses
DAY='day day 1000000000 0 0'
call() { echo "0 '' 0 0 1000000 $1 $2 '' 1 0 0"; } # call NLIMITS LIMITS
# acquire ACCOUNTS NLIMITS LIMITS INST: the EVALSHA of one run, one call per account given
acquire() {
  local accts=($1) k="" a x
  a="$(call "$2" "$3") "
  for x in "${accts[@]}"; do k+="b:{$x}:r "; done
  for x in "${accts[@]:1}"; do a+="0 '' = 0 "; done
  echo "EVALSHA $ACQ ${#accts[@]} $k'' 28800000000 '' '$4' $a"
}
declare -A CASE
CASE[gcra]="EVALSHA $GCRA 1 gcra:ACCT:bench 1 1000000"
CASE[window]=$(acquire ACCT 1 "$WIN" '')
CASE[window+day]=$(acquire ACCT 2 "$WIN $DAY" 0123456789abcdef)
CASE[window+day x8]=$(acquire "ACCT ACCT ACCT ACCT ACCT ACCT ACCT ACCT" 2 "$WIN $DAY" 0123456789abcdef)
CASE[window+day x8 acc]=$(acquire "ACCT1 ACCT2 ACCT3 ACCT4 ACCT5 ACCT6 ACCT7 ACCT8" 2 "$WIN $DAY" 0123456789abcdef)
ORDER=(gcra window window+day "window+day x8" "window+day x8 acc")
CALLS_PER=([0]=1 [1]=1 [2]=1 [3]=8 [4]=8)
if [ -n "${BENCH_ACQUIRE_BASE:-}" ]; then
  [ -f "$BENCH_ACQUIRE_BASE" ] || { echo "script-cost: BENCH_ACQUIRE_BASE: no such file" >&2; exit 2; }
  BASE=$(cat lua/prelude.lua "$BENCH_ACQUIRE_BASE" | rc -x script load)
  ORDER=(gcra); CALLS_PER=([0]=1); n=1
  for c in window window+day "window+day x8" "window+day x8 acc"; do
    CASE[$c, baseline]=${CASE[$c]//$ACQ/$BASE}
    ORDER+=("$c, baseline" "$c")
    CALLS_PER[n]=1; CALLS_PER[n + 1]=1
    if [[ $c == *x8* ]]; then CALLS_PER[n]=8; CALLS_PER[n + 1]=8; fi
    n=$((n + 2))
  done
fi

# run CASE KEYS: µs of Redis time per EVALSHA (one run)
run() {
  local cmd=${CASE[$1]} n=$CALLS
  if [ "$2" = fresh ]; then cmd=${cmd//ACCT/__rand_int__}; else cmd=${cmd//ACCT/hot}; fi
  rc flushall >/dev/null
  rc config resetstat >/dev/null
  if [ ${#GRIND[@]} -gt 0 ]; then
    # Instructions of redis-server per run: a first tenth of the runs
    # creates keys, then callgrind counts the rest (network handling
    # included, kernel excluded).
    # shellcheck disable=SC2086 # the command's words
    eval "redis-benchmark -p $PORT -c 1 -n $((n / 10 + 1)) -r $NKEYS -q $cmd" >/dev/null
    callgrind_control -z "$RPID" >/dev/null 2>&1
    # shellcheck disable=SC2086
    eval "redis-benchmark -p $PORT -c 1 -n $n -r $NKEYS -q $cmd" >/dev/null
    rm -f "$TMP"/cg.*.out.*
    callgrind_control -d "$RPID" >/dev/null 2>&1
    local f
    for _ in $(seq 50); do f=$(ls "$TMP"/cg.*.out.* 2>/dev/null | head -1); [ -n "$f" ] && grep -q '^totals:' "$f" && break; sleep 0.1; done
    awk -v n="$n" '/^totals:/ { print $2 / n }' "$f"
    return
  fi
  # shellcheck disable=SC2086 # the command's words
  eval "redis-benchmark -p $PORT -c 1 -n $n -r $NKEYS -q $cmd" >/dev/null
  rc info commandstats | tr -d '\r' | awk -F'[=,:]' '/^cmdstat_evalsha:/ { print $7 }'
}
UNIT=µs F=%.2f
[ ${#GRIND[@]} -gt 0 ] && UNIT=instructions F=%.0f
echo "# acquire.lua and the peer's GCRA: Redis time per script run ($(date -u), $(redis-server --version | awk '{ print $3 }'))"
echo
echo "\`bench/script-cost.sh\` (BENCH_CALLS=$CALLS BENCH_ROUNDS=$ROUNDS BENCH_KEYS=$NKEYS): median (min–max) of $ROUNDS rounds of"
if [ "$UNIT" = µs ]; then
  echo "$CALLS sequential EVALSHA each (redis-benchmark -c1), INFO commandstats usec_per_call; per call = per run ÷ calls in the run."
else
  echo "$CALLS sequential EVALSHA each (redis-benchmark -c1), BENCH_CALLGRIND=1: redis-server's instructions (callgrind, the"
  echo "network handling in user space included); per call = per run ÷ calls in the run."
fi
echo
echo "| case | one hot key: per run | per call | fresh keys ($NKEYS accounts): per run | per call |"
echo "|---|---:|---:|---:|---:|"
for i in "${!ORDER[@]}"; do
  c=${ORDER[$i]}
  hot=(); fresh=()
  for ((r = 1; r <= ROUNDS; r++)); do hot+=("$(run "$c" hot)"); fresh+=("$(run "$c" fresh)"); done
  med() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
  rng() { printf '%s\n' "$@" | sort -g | awk -v f="$F" 'NR == 1 { a = $1 } { b = $1 } END { printf f "–" f, a, b }'; }
  printf "| %s | $F $UNIT (%s) | $F $UNIT | $F $UNIT (%s) | $F $UNIT |\n" "$c" "$(med "${hot[@]}")" "$(rng "${hot[@]}")" \
    "$(awk -v a="$(med "${hot[@]}")" -v n="${CALLS_PER[$i]}" 'BEGIN { print a / n }')" \
    "$(med "${fresh[@]}")" "$(rng "${fresh[@]}")" \
    "$(awk -v a="$(med "${fresh[@]}")" -v n="${CALLS_PER[$i]}" 'BEGIN { print a / n }')"
done
