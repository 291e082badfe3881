# Sourced by bench/run.sh (BENCH_TARGETS=peers and/or accounts): the limiters a
# platform team would build instead of wxgate, and the cost per account.
#
# peers: one account, a rule that never throttles, each proxy alone on its
# pinned core, BENCH_ROUNDS rounds of:
#   nginx proxy_pass            no limiting (the floor of a proxy)
#   nginx limit_req             a local leaky bucket per account (shared memory zone)
#   OpenResty + Redis           access_by_lua: one EVALSHA of a GCRA on Redis TIME
#                               per call, lua-resty-redis over pooled connections
#                               (Debian's libnginx-mod-http-lua and lua-nginx-redis)
#   wxgate, memory store        target 3's config
#   wxgate, Redis store         target 4's config
# accounts: each of BENCH_ACCOUNTS (default "1 1000 100000") accounts, every
# call another account's (round-robin: no two consecutive calls of a wrk thread
# share one, so batching per account cannot help), against wxgate (memory and
# Redis; a rule with a window and a day quota), wxgate on a Redis Cluster of
# three masters (BENCH_CLUSTER=1, the default; 0 leaves it out), OpenResty +
# Redis and nginx limit_req (their one key per account); with the proxy's RSS
# and Redis' used_memory after the run, and for each row on Redis the calls per
# script run and the script runs per socket read Redis made (INFO stats
# total_reads_processed: above 1, the client pipelines runs on its connection).
#
# Uses run.sh's functions and variables (start, run_wrk, per_run, alloc_port,
# wxgate_config, TMP, PROXY_PIN, REDIS_PORT, UP_PORT, ...).

LUA_MOD=/usr/lib/nginx/modules/ngx_http_lua_module.so
NDK_MOD=/usr/lib/nginx/modules/ndk_http_module.so
LUA_REDIS=/usr/share/lua/5.1/nginx/redis.lua
ACCOUNTS=" ${BENCH_ACCOUNTS:-1 1000 100000} "; ACCOUNTS=${ACCOUNTS//,/ }
[[ $ACCOUNTS =~ ^(\ +[1-9][0-9]*)+\ +$ ]] ||
  die "BENCH_ACCOUNTS must list account counts (whole numbers ≥ 1), got '${BENCH_ACCOUNTS:-}'"

# The GCRA a team would write: BENCH_GCRA_LUA (bench/lib.sh).
GCRA_LUA=$BENCH_GCRA_LUA
# 1,000,000 calls/s with a burst of 1,000,000: never throttles (as BENCH_NEVER).
GCRA_ARGS='1, 1000000'
# The accounts mode's wxgate rule: a window and a day quota, neither throttling.
ACCOUNT_LIMITS='[{ count = 1000000000, per = "1s", burst = 1000000 }, { count = 1000000000, per = "day" }]'

# With the token cache off (the memory store's default is on), so that each
# token request is forwarded and learns the fresh token the mock answers: a
# cached token would answer all but an account's first request from the cache.
TOKEN_RULE="[[rule]]
name = \"token\"
match = [\"/cgi-bin/token\"]
limits = $ACCOUNT_LIMITS

[tokens]
cache = false"
alloc_port OR_PORT
alloc_port LR_PORT
alloc_port WX_ACC_MEM_PORT
alloc_port WX_ACC_REDIS_PORT
alloc_port WX_ACC_CLUSTER_PORT
CLUSTER=${BENCH_CLUSTER:-1}
[[ $CLUSTER == [01] ]] || die "BENCH_CLUSTER must be 0 or 1, got '$CLUSTER'"
CLUSTER_PORTS=(); CLUSTER_PIDS=""
# cluster_start: three masters (no replicas) on loopback, pinned with Redis, all slots assigned
cluster_start() {
  local i p nodes=() toml=""
  for i in 1 2 3; do
    alloc_port p; check_free "$p"; CLUSTER_PORTS+=("$p")
    mkdir -p "$TMP/cluster-$p"
    start "cluster-$p" redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no --cluster-enabled yes \
      --cluster-config-file "$TMP/cluster-$p/nodes.conf" --dir "$TMP/cluster-$p"
    CLUSTER_PIDS+="${CLUSTER_PIDS:+,}$LAST_PID"
    nodes+=("127.0.0.1:$p"); toml+="${toml:+, }\"redis://127.0.0.1:$p\""
  done
  for p in "${CLUSTER_PORTS[@]}"; do
    for i in $(seq 100); do
      redis-cli -p "$p" ping 2>/dev/null | grep -q PONG && break
      ((i < 100)) || die "cluster node $p did not answer PING within 10 s"
      sleep 0.1
    done
  done
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >"$TMP/cluster-create.log" 2>&1 ||
    { cat "$TMP/cluster-create.log" >&2; die "redis-cli --cluster create failed"; }
  for i in $(seq 100); do
    redis-cli -p "${CLUSTER_PORTS[0]}" cluster info | tr -d '\r' | grep -q '^cluster_state:ok' && break
    ((i < 100)) || die "the bench's Redis Cluster did not reach cluster_state:ok within 10 s"
    sleep 0.1
  done
  wxgate_config acc_cluster "$WX_ACC_CLUSTER_PORT" "$(printf 'kind = "redis-cluster"\nnodes = [%s]\ntimeout = "1s"\nkey_prefix = "benchc"' "$toml")" "$ACCOUNT_LIMITS"
}
# redis_ports ROW: the Redis ports a row uses (the Cluster's three, else the one server)
redis_ports() { if [[ $1 == acc_cluster* ]]; then echo "${CLUSTER_PORTS[*]}"; else echo "$REDIS_PORT"; fi; }
# redis_sum ROW SECTION FIELD: FIELD of INFO SECTION summed over the row's Redis ports
redis_sum() {
  local p t=0 v
  for p in $(redis_ports "$1"); do
    v=$(redis-cli -p "$p" info "$2" | tr -d '\r' | awk -F'[:=,]' -v f="$3" '$1 == f { print ($2 ~ /^[0-9]+$/ ? $2 : $3); x = 1 } END { if (!x) print 0 }')
    t=$((t + v))
  done
  echo "$t"
}

peers_start() { # the OpenResty and limit_req nginx, pinned like the proxy_pass one
  local sha
  sha=$(redis-cli -p "$REDIS_PORT" script load "$GCRA_LUA") || die "redis-cli script load (the GCRA) failed"
  mkdir -p "$TMP/openresty" "$TMP/limitreq"
  proxy_conf "$OR_PORT" "load_module $NDK_MOD;
load_module $LUA_MOD;" "  lua_package_path \"/usr/share/lua/5.1/?.lua;;\";
  init_by_lua_block {
    GCRA_SHA = \"$sha\"
    GCRA_SRC = [==[$GCRA_LUA]==]
    redis = require \"nginx.redis\"
  }" "$(cat <<EOF
      access_by_lua_block {
        local r = redis:new()
        r:set_timeouts(1000, 1000, 1000)
        local ok, err = r:connect("127.0.0.1", $REDIS_PORT)
        if not ok then ngx.log(ngx.ERR, "redis: ", err) return ngx.exit(503) end
        local key = "gcra:" .. (ngx.var.http_x_wx_account or "default") .. ":bench"
        local res
        res, err = r:evalsha(GCRA_SHA, 1, key, $GCRA_ARGS)
        if not res and err and err:find("NOSCRIPT", 1, true) then
          res, err = r:eval(GCRA_SRC, 1, key, $GCRA_ARGS)
        end
        if not res then ngx.log(ngx.ERR, "redis: ", err) return ngx.exit(503) end
        r:set_keepalive(60000, 64)
        if res > 0 then
          ngx.status = 429
          ngx.header["Retry-After"] = math.ceil(res / 1000000)
          ngx.header["Content-Type"] = "application/json"
          ngx.print('{"errcode":45009,"errmsg":"rate limited"}')
          return ngx.exit(429)
        end
      }
EOF
)" >"$TMP/openresty/nginx.conf"
  # An empty key is not limited at all: a call without the header is "default".
  proxy_conf "$LR_PORT" "" '  map $http_x_wx_account $wx_account { "" default; default $http_x_wx_account; }
  limit_req_zone $wx_account zone=bench:64m rate=1000000r/s;' '      limit_req zone=bench burst=1000000 nodelay;
      limit_req_status 429;' >"$TMP/limitreq/nginx.conf"
  local n port
  for n in openresty limitreq; do
    nginx -t -q -c "$TMP/$n/nginx.conf" -p "$TMP/$n/" -e "$TMP/$n/error.log" ||
      die "nginx refused the $n config ($TMP/$n/nginx.conf)"
    port=$LR_PORT; [ "$n" = openresty ] && port=$OR_PORT
    check_free "$port"
    start "$n" "${PROXY_PIN[@]}" nginx -c "$TMP/$n/nginx.conf" -p "$TMP/$n/" -e "$TMP/$n/error.log"
    wait_up "$n" "$LAST_PID" "http://127.0.0.1:$port$REQ_PATH"
    [ "$n" = openresty ] && OR_WORKERS=$(workers "$LAST_PID") || LR_WORKERS=$(workers "$LAST_PID")
    # Each must answer the mock's body, for an account too.
    redis-cli -p "$REDIS_PORT" config resetstat >/dev/null
    [ "$(curl -s -H 'X-Wx-Account: wxcheck' "http://127.0.0.1:$port$REQ_PATH")" = "$BODY" ] ||
      die "$n does not pass the mock's answer through ($TMP/$n/error.log)"
    if [ "$n" = openresty ] && [ "$(evalsha_calls)" != 1 ]; then die "OpenResty did not run the GCRA on Redis once"; fi
  done
  wxgate_config acc_memory "$WX_ACC_MEM_PORT" 'kind = "memory"' "$ACCOUNT_LIMITS"
  # The same, plus a rule for /cgi-bin/token: runs of token requests (each
  # answered by the mock with a fresh 128-character token) measure what a
  # learned token costs.
  wxgate_config tok_memory "$WX_ACC_MEM_PORT" 'kind = "memory"' "$ACCOUNT_LIMITS" "$TOKEN_RULE"
  wxgate_config tok_redis "$WX_ACC_REDIS_PORT" "$(redis_store bencht)" "$ACCOUNT_LIMITS" "$TOKEN_RULE"
  wxgate_config acc_redis "$WX_ACC_REDIS_PORT" "$(redis_store bencha)" "$ACCOUNT_LIMITS"
}

# wrk script of both modes: each call names the next of BENCH_NACCT accounts
# (wxacct1..N), each wrk thread starting at its own offset. The 1-account runs
# use it too, so wrk's own cost is the same in every row.
cat >"$TMP/accounts.lua" <<'EOF'
local n = tonumber(os.getenv("BENCH_NACCT")) or 1
local threads = tonumber(os.getenv("BENCH_NTHREADS")) or 1
local next_id = 0
function setup(thread) thread:set("tid", next_id); next_id = next_id + 1 end
function init(args)
  i = math.floor(n * tid / threads)
  hdr = { ["X-Wx-Account"] = "" }
end
local tokens = os.getenv("BENCH_TOKENS") == "1"
local pace = tonumber(os.getenv("BENCH_PACE_MS") or "")
if pace then function delay() return pace end end -- moderate load: a pause after each answer
function request()
  i = i + 1
  if i > n then i = 1 end
  if tokens then -- a token request of appid wxacct<i>: wxgate learns the token it answers
    return wrk.format(nil, "/cgi-bin/token?grant_type=client_credential&appid=wxacct" .. i .. "&secret=BENCHSECRET")
  end
  hdr["X-Wx-Account"] = "wxacct" .. i
  return wrk.format(nil, nil, hdr)
end
EOF

rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; } # rss_kb PID
redis_used() { redis_sum "${1:-}" memory used_memory; } # redis_used [ROW]
redis_keys() { local p t=0; for p in $(redis_ports "${1:-}"); do t=$((t + $(redis-cli -p "$p" dbsize))); done; echo "$t"; }

# peer_run KEY ROW ACCOUNTS: one measured run of ROW (proxy_pass, limitreq,
# openresty, memory, redis, acc_memory, acc_redis; a wxgate one with ".base":
# the baseline binary) with ACCOUNTS accounts; figures in $TMP/KEY.* (and
# KEY.mem: "proxy_rss_kB redis_used_bytes redis_keys"; KEY.runs: "script_runs
# socket_reads" at Redis, warm-up included)
peer_run() {
  local key=$1 what=${2%.base} bin=$WXGATE url port watch pid="" used0 p rw=redis=$REDIS_PID
  [[ $2 == *.base ]] && bin=$BASE_BIN
  for p in $(redis_ports "$what"); do redis-cli -p "$p" flushall >/dev/null; done
  redis-cli -p "$REDIS_PORT" script load "$GCRA_LUA" >/dev/null
  used0=$(redis_used "$what")
  case $what in
    proxy_pass) port=$NGX_PORT; watch="nginx-proxy=$NGX_WORKERS" ;;
    limitreq) port=$LR_PORT; watch="nginx-proxy=$LR_WORKERS" ;;
    openresty) port=$OR_PORT; watch="nginx-proxy=$OR_WORKERS" ;;
    memory) port=$WX_MEM_PORT ;;& redis) port=$WX_REDIS_PORT ;;&
    acc_memory | tok_memory) port=$WX_ACC_MEM_PORT ;;& acc_redis | tok_redis) port=$WX_ACC_REDIS_PORT ;;&
    acc_cluster) port=$WX_ACC_CLUSTER_PORT; rw=redis=$CLUSTER_PIDS ;;&
    *) start_wxgate "$what" "$port" "$bin"; pid=$WX_PID; watch="wxgate=$WX_PID" ;;
  esac
  url="http://127.0.0.1:$port$REQ_PATH"
  log "$key: $2, $3 account(s) (-c$CONNS)"
  for p in $(redis_ports "$what"); do redis-cli -p "$p" config resetstat >/dev/null; done
  local tok=0; [[ $what == tok_* ]] && tok=1
  BENCH_PACE_MS=${PEER_PACE:-} BENCH_TOKENS=$tok BENCH_NACCT=$3 BENCH_NTHREADS=$THREADS run_wrk "$key" "$url" "$CONNS" "$watch upstream=$UP_WORKERS $rw" \
    -s "$TMP/accounts.lua"
  local rss=0
  if [ -n "$pid" ]; then rss=$(rss_kb "$pid"); else
    local w; for w in ${watch#*=}; do rss=$(rss_kb "${w%%,*}"); done
  fi
  echo "$rss $(($(redis_used "$what") - used0)) $(redis_keys "$what")" >"$TMP/$key.mem"
  echo "$(redis_sum "$what" commandstats cmdstat_evalsha) $(redis_sum "$what" stats total_reads_processed)" >"$TMP/$key.runs"
  if [ -n "$pid" ]; then stop_pid "$pid"; fi
}

# pget KEY GROUP: "rps cpu_us_per_call calls_per_core_s proxy_cpu% p50 p99 non2xx% redis_us_per_call"
pget() {
  local rps p50 p99 req non _s cpu us core
  read -r rps p50 p99 req non _s <"$TMP/$1.parsed"
  read -r _ _ _ cpu us core <<<"$(per_run "$1" "$2")"
  echo "$rps $us $core $cpu $p50 $p99 $(awk -v n="$non" -v r="$req" 'BEGIN { printf "%.1f", r ? 100 * n / r : 0 }')" \
    "$(awk -v r="$rps" '$1 == "redis" { printf "%.3f", $2 / 100 * 1e6 / r }' "$TMP/$1.cpuv")"
}
# pmed KEYPREFIX GROUP COL: the median over the rounds of column COL of pget
pmed() { local r; for ((r = 1; r <= ROUNDS; r++)); do pget "r${r}_$1" "$2" | awk -v c="$3" '{ print $c }'; done | median; }
prange() { local r; for ((r = 1; r <= ROUNDS; r++)); do pget "r${r}_$1" "$2" | awk -v c="$3" '{ print $c }'; done | summ "$4" "$5"; }
group_of() { case $1 in proxy_pass | limitreq | openresty) echo nginx-proxy ;; *) echo wxgate ;; esac; }
uses_redis() { [[ $1 == openresty || $1 == redis* || $1 == acc_redis* || $1 == acc_cluster* || $1 == tok_redis* ]]; }
# with_base ROW...: the rows, each wxgate one preceded by its baseline run (BENCH_BASELINE*)
with_base() {
  local w
  for w in "$@"; do
    if [ -n "$BASE_BIN" ] && [ "$(group_of "$w")" = wxgate ]; then echo "$w.base"; fi
    echo "$w"
  done
}
label() { # label ROW
  local l=${PEER_LABEL[${1%.base}]}
  if [ -n "$BASE_BIN" ] && [ "$(group_of "$1")" = wxgate ]; then
    if [[ $1 == *.base ]]; then l+=", baseline"; else l+=", current"; fi
  fi
  echo "$l"
}

declare -A PEER_LABEL=([proxy_pass]="nginx proxy_pass (no limiting)" [limitreq]="nginx limit_req (local only)"
  [openresty]="OpenResty + Redis (one EVALSHA of a GCRA per call)" [memory]="wxgate, memory store"
  [redis]="wxgate, Redis store" [acc_memory]="wxgate, memory store" [acc_redis]="wxgate, Redis store" [acc_cluster]="wxgate, Redis Cluster (3 masters)"
  [tok_memory]="wxgate, memory store, token requests" [tok_redis]="wxgate, Redis store, token requests")
PEER_ROWS=$(with_base proxy_pass limitreq openresty memory redis)
ACC_LAST=${ACCOUNTS% }; ACC_LAST=${ACC_LAST##* }
ACC_ROWS=$(with_base acc_memory acc_redis $( ((CLUSTER)) && echo acc_cluster) openresty limitreq)
TOK_ROWS=$(with_base tok_memory tok_redis)
HALF_ROWS=$(with_base acc_memory acc_redis openresty)
HALF_PACE=${BENCH_HALF_PACE_MS:-10}
[[ $HALF_PACE =~ ^[1-9][0-9]*$ ]] || die "BENCH_HALF_PACE_MS must be a whole number of ms ≥ 1, got '$HALF_PACE'"

peers_section() { # runs what BENCH_TARGETS asks of peers/accounts; the report goes to $TMP/peers.md
  local r w n k g
  peers_start
  if want accounts && ((CLUSTER)); then cluster_start; fi
  if want peers; then
    for ((r = 1; r <= ROUNDS; r++)); do
      for w in $PEER_ROWS; do peer_run "r${r}_peer_$w" "$w" 1; done
    done
  fi
  if want accounts; then
    for ((r = 1; r <= ROUNDS; r++)); do
      for n in $ACCOUNTS; do
        for w in $ACC_ROWS; do peer_run "r${r}_acc${n}_$w" "$w" "$n"; done
      done
      # The most accounts once more, as token requests: a token learned per account.
      for w in $TOK_ROWS; do peer_run "r${r}_acc${ACC_LAST}_$w" "$w" "$ACC_LAST"; done
      # And at moderate load: each connection pauses HALF_PACE ms after every answer.
      for w in $HALF_ROWS; do PEER_PACE=$HALF_PACE peer_run "r${r}_half${ACC_LAST}_$w" "$w" "$ACC_LAST"; done
    done
  fi
  if [ "$PERF" = 1 ]; then peers_perf; fi
  {
    echo "### The peers and the cost per account (pinned: each proxy alone on CPU $PROXY_CPU; wrk, the mock and Redis on CPU $OTHER_CPUS)"
    echo
    echo "wrk -t$THREADS -c$CONNS -d${DURATION}s after a ${WARMUP} s warm-up, each call naming its account in \`X-Wx-Account\`"
    echo "(bench/peers.sh's accounts.lua, also for one account). Each cell: the median (min–max) of $ROUNDS round(s);"
    echo "Redis flushed before each run. Calls/s per proxy core = requests/s ÷ the proxy's share of its core."
    echo "OpenResty's GCRA: $(printf '%s' "$GCRA_LUA" | wc -l) lines of Lua on Redis (bench/peers.sh), interval 1 µs, tolerance 1 s."
    echo "nginx: worker_processes 1, upstream keep-alive 64; wxgate: \`workers = 1\`, WXGATE_LOG=warn, access log off."
    [ -z "$BASE_BIN" ] || echo "Each wxgate row twice: baseline $BASE_LABEL, run just before current $COMMIT."
    echo
    if want peers; then
      local orp orr ngx
      orp=$(pmed peer_openresty nginx-proxy 2); orr=$(pmed peer_openresty nginx-proxy 8); ngx=$(pmed peer_proxy_pass nginx-proxy 3)
      echo "One account, a rule that never throttles (wxgate: targets 3 and 4's configs):"
      echo
      echo "| target | requests/s | calls/s per proxy core | vs nginx proxy_pass | proxy CPU per call | vs OpenResty | Redis CPU per call | vs OpenResty | p50 | p99 | non-2xx |"
      echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
      for w in $PEER_ROWS; do
        k=peer_$w; g=$(group_of "$w")
        printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s %% |\n' "$(label "$w")" \
          "$(prange "$k" "$g" 1 %.0f '')" "$(prange "$k" "$g" 3 %.0f '')" "$(ratio "$(pmed "$k" "$g" 3)" "$ngx")" \
          "$(prange "$k" "$g" 2 %.1f ' µs')" "$(ratio "$(pmed "$k" "$g" 2)" "$orp")" \
          "$(if uses_redis "$w"; then prange "$k" "$g" 8 %.1f ' µs'; else echo –; fi)" \
          "$(if uses_redis "$w"; then ratio "$(pmed "$k" "$g" 8)" "$orr"; else echo –; fi)" \
          "$(prange "$k" "$g" 5 '%.0f' ' µs')" "$(prange "$k" "$g" 6 '%.0f' ' µs')" "$(pmed "$k" "$g" 7)"
      done
      echo
    fi
    if want accounts; then
      local first=${ACCOUNTS# }; first=${first%% *}
      echo "Many accounts: every call another account's (round-robin over N accounts per wrk thread). wxgate's rule:"
      echo "\`$ACCOUNT_LIMITS\`; OpenResty and limit_req keep one key per account (a window only)."
      echo
      echo "| accounts | target | requests/s | calls/s per proxy core | vs $first account(s) | proxy CPU per call | Redis CPU per call | calls per script run | script runs per read | proxy RSS after | Redis memory added (keys) | non-2xx |"
      echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
      for w in $ACC_ROWS $TOK_ROWS; do
        g=$(group_of "$w")
        local base=""; [[ $w == tok_* ]] || base=$(pmed "acc${first}_$w" "$g" 3)
        local counts=$ACCOUNTS; [[ $w == tok_* ]] && counts=$ACC_LAST
        for n in $counts; do
          k=acc${n}_$w
          printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s %% |\n' "$n" "$(label "$w")" \
            "$(prange "$k" "$g" 1 %.0f '')" "$(prange "$k" "$g" 3 %.0f '')" "$(ratio "$(pmed "$k" "$g" 3)" "$base")" \
            "$(prange "$k" "$g" 2 %.1f ' µs')" \
            "$(if uses_redis "$w"; then prange "$k" "$g" 8 %.1f ' µs'; else echo –; fi)" \
            "$(if uses_redis "$w"; then script_runs "$k" 1 | summ %.1f ''; else echo –; fi)" \
            "$(if uses_redis "$w"; then script_runs "$k" 2 | summ %.2f ''; else echo –; fi)" \
            "$(memcol "$k" 1 | summ %.1f ' MB')" \
            "$(if uses_redis "$w"; then echo "$(memcol "$k" 2 | summ %.1f ' MB') ($(memcol "$k" 3 | median))"; else echo –; fi)" \
            "$(pmed "$k" "$g" 7)"
        done
      done
      echo
      echo "Moderate load at $ACC_LAST accounts: $CONNS connections, each pausing $HALF_PACE ms after every answer"
      echo "(wrk's delay(), not in the latency; closed loop, so a slower proxy is offered a little less):"
      echo
      echo "| target | requests/s | p50 | p99 | proxy CPU per call | Redis CPU per call | non-2xx |"
      echo "|---|---:|---:|---:|---:|---:|---:|"
      for w in $HALF_ROWS; do
        k=half${ACC_LAST}_$w; g=$(group_of "$w")
        printf '| %s | %s | %s | %s | %s | %s | %s %% |\n' "$(label "$w")" "$(prange "$k" "$g" 1 %.0f '')" \
          "$(prange "$k" "$g" 5 '%.0f' ' µs')" "$(prange "$k" "$g" 6 '%.0f' ' µs')" "$(prange "$k" "$g" 2 %.1f ' µs')" \
          "$(if uses_redis "$w"; then prange "$k" "$g" 8 %.1f ' µs'; else echo –; fi)" "$(pmed "$k" "$g" 7)"
      done
      echo
      local last=$ACC_LAST
      if ((last > first)); then
        echo "Memory per account and per learned token, from each round's runs at $last and $first accounts (accounts"
        echo "called = min(accounts, calls in the warm-up and the run)); a token: the token-request run at $last accounts"
        echo "over the plain one, per token request (the mock answers each with a fresh 128-character token, learned"
        echo "until it expires: one per request, on top of the same pairs):"
        echo
        for w in $ACC_ROWS; do
          [[ $w == openresty ]] && continue   # its keys live 1 ms at the bench's rate: nothing to weigh
          printf -- '- %s: %s per account in the proxy' "$(label "$w")" "$(per_acct "acc${last}_$w" "acc${first}_$w" 1 | summ %.0f ' B')"
          if uses_redis "$w"; then printf ', %s in Redis' "$(per_acct "acc${last}_$w" "acc${first}_$w" 2 | summ %.0f ' B')"; fi
          echo
        done
        printf -- '- a learned token: %s in the proxy (memory store), %s in the proxy and %s in Redis (Redis store)\n' \
          "$(per_acct "acc${last}_tok_memory" "acc${last}_acc_memory" 1 tokens | summ %.0f ' B')" \
          "$(per_acct "acc${last}_tok_redis" "acc${last}_acc_redis" 1 tokens | summ %.0f ' B')" \
          "$(per_acct "acc${last}_tok_redis" "acc${last}_acc_redis" 2 tokens | summ %.0f ' B')"
        echo
      fi
    fi
    if [ -f "$TMP/peers-perf.txt" ]; then
      echo "perf (BENCH_PERF=1): an extra, unreported run of each, \`perf record -F 499\` of the proxy and of Redis;"
      echo "self time by symbol (cpu-clock samples), the top 25 of each:"
      echo
      echo '```'
      cat "$TMP/peers-perf.txt"
      echo '```'
      echo
    fi
  } >"$TMP/peers.md"
}

# peers_perf: BENCH_PERF=1: profiles of wxgate (Redis, 1 account; both stores at
# the most accounts) and of Redis under the same load, into $TMP/peers-perf.txt
peers_perf() {
  local row n pid rp
  : >"$TMP/peers-perf.txt"
  for row in redis:1 openresty:1 acc_memory:$ACC_LAST acc_redis:$ACC_LAST tok_memory:$ACC_LAST; do
    n=${row#*:}; row=${row%:*}
    redis-cli -p "$REDIS_PORT" flushall >/dev/null
    case $row in
      openresty) pid=${OR_WORKERS%%,*} ;;
      redis) start_wxgate redis "$WX_REDIS_PORT"; pid=$WX_PID ;;
      acc_memory) start_wxgate acc_memory "$WX_ACC_MEM_PORT"; pid=$WX_PID ;;
      acc_redis) start_wxgate acc_redis "$WX_ACC_REDIS_PORT"; pid=$WX_PID ;;
      tok_memory) start_wxgate tok_memory "$WX_ACC_MEM_PORT"; pid=$WX_PID ;;
    esac
    local port; port=$(case $row in openresty) echo "$OR_PORT" ;; redis) echo "$WX_REDIS_PORT" ;;
      acc_memory | tok_memory) echo "$WX_ACC_MEM_PORT" ;; acc_redis) echo "$WX_ACC_REDIS_PORT" ;; esac)
    log "perf: $row, $n account(s)"
    local tok=0; [[ $row == tok_* ]] && tok=1
    BENCH_TOKENS=$tok BENCH_NACCT=$n BENCH_NTHREADS=$THREADS wrk -t"$THREADS" -c"$CONNS" -d"$((DURATION + 1))s" -s "$TMP/accounts.lua" \
      "http://127.0.0.1:$port$REQ_PATH" >/dev/null 2>&1 &
    local wpid=$!
    PIDS+=("$wpid")
    sleep 1
    perf record -q -F 499 -o "$TMP/perf-$row.data" -p "$pid" -- sleep $((DURATION - 1)) >"$TMP/perf-$row.log" 2>&1 &
    rp=$!
    if [[ $row != *_memory ]]; then
      perf record -q -F 499 -o "$TMP/perf-$row.redis-server.data" -p "$REDIS_PID" -- sleep $((DURATION - 1)) \
        >"$TMP/perf-$row.redis-server.log" 2>&1 || log "perf record (Redis) failed: $(tail -1 "$TMP/perf-$row.redis-server.log")"
    fi
    wait "$rp" || log "perf record failed: $(tail -1 "$TMP/perf-$row.log")"
    wait "$wpid" || true
    local f
    for f in "$TMP/perf-$row.data" "$TMP/perf-$row.redis-server.data"; do
      [ -f "$f" ] || continue
      { echo "== $(label "$row")$([[ $f == *.redis-server.data ]] && echo ": redis-server"), $n account(s)"
        perf report -i "$f" --stdio --no-children --sort dso,sym 2>/dev/null | grep -v '^#' | grep -v '^$' | head -25 || true
        echo
      } >>"$TMP/peers-perf.txt"
    done
    case $row in openresty) ;; *) stop_pid "$WX_PID" ;; esac
  done
}
# memcol KEY COL: per round, column COL of KEY.mem in MB (1: RSS kB, 2: bytes) or as is (3: keys)
memcol() {
  local r
  for ((r = 1; r <= ROUNDS; r++)); do
    awk -v c="$2" '{ if (c == 1) printf "%.3f\n", $1 / 1024; else if (c == 2) printf "%.3f\n", $2 / 1048576; else print $3 }' "$TMP/r${r}_$1.mem"
  done
}
# script_runs KEY COL: per round, calls per script run (COL 1) or script runs per socket read at Redis (2), warm-up included
script_runs() {
  local r
  for ((r = 1; r <= ROUNDS; r++)); do
    [ -f "$TMP/r${r}_$1.runs" ] || continue
    awk -v c="$2" -v calls="$(called "r${r}_$1" 1000000000000)" '$1 > 0 && $2 > 0 {
      if (c == 1) printf "%.3f\n", calls / $1; else printf "%.3f\n", $1 / $2 }' "$TMP/r${r}_$1.runs"
  done
}
# called KEY N: the accounts a run with N accounts called (its warm-up's and its own calls, at most N)
called() {
  awk -v n="$2" '/ requests in / { c += $1 } END { print (c < n ? c : n) }' "$TMP/$1.warm" "$TMP/$1.wrk"
}
# per_acct KEY_A KEY_B COL [tokens]: per round, the bytes of KEY_A.mem's column COL (1: RSS, 2: Redis)
# over KEY_B's, per account called more (with "tokens": per token request of KEY_A)
per_acct() {
  local r a b na nb
  for ((r = 1; r <= ROUNDS; r++)); do
    [ -f "$TMP/r${r}_$1.mem" ] && [ -f "$TMP/r${r}_$2.mem" ] || continue
    na=$(called "r${r}_$1" "$(sed 's/^acc\([0-9]*\)_.*/\1/' <<<"$1")")
    nb=$(called "r${r}_$2" "$(sed 's/^acc\([0-9]*\)_.*/\1/' <<<"$2")")
    # tokens: every token request learns a token of its own (the mock answers a fresh one each time)
    [ "${4:-}" = tokens ] && { na=$(called "r${r}_$1" 1000000000000); nb=0; }
    awk -v c="$3" -v na="$na" -v nb="$nb" -v fa="$TMP/r${r}_$1.mem" -v fb="$TMP/r${r}_$2.mem" 'BEGIN {
      getline la < fa; getline lb < fb; split(la, a, " "); split(lb, b, " ")
      d = (c == 1 ? (a[1] - b[1]) * 1024 : a[2] - b[2]); if (na > nb) printf "%.0f\n", d / (na - nb) }'
  done
}
