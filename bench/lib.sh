# Shared by the scripts of bench/ (sourced).

# bench_wxgate_toml LISTEN UPSTREAM STORE_TOML [SERVER_MORE] [LIMITS] [RULE_MORE]:
# a bench wxgate config, admin and access log off, one rule "bench" (by
# default with limits that never throttle). SERVER_MORE: more [server] lines
# (e.g. `workers = 1`); RULE_MORE: more lines (keys of the rule, or tables).
BENCH_NEVER='[{ count = 1000000000, per = "1s", burst = 1000000 }]'   # limits that never throttle
bench_wxgate_toml() {
  cat <<EOF2
[server]
listen = "$1"
admin_listen = "off"
upstream = "$2"
${4:-}

[store]
$3

[log]
access = false   # one access-log line per call would dominate the cost

[[rule]]
name = "bench"
match = ["/cgi-bin/message/template/send"]
limits = ${5:-$BENCH_NEVER}
${6:-}
EOF2
}

# The GCRA a team would write on Redis (bench/peers.sh's OpenResty peer,
# bench/script-cost.sh): one key per account holding the theoretical arrival
# time (µs, on Redis TIME); ARGV[1] the emission interval (µs), ARGV[2] the
# burst tolerance (µs). Answers 0 (admit) or the wait in µs.
BENCH_GCRA_LUA='local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval, tolerance = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call("GET", KEYS[1])) or now
if tat < now then tat = now end
local wait = tat - tolerance - now
if wait > 0 then return wait end
local new = tat + interval
redis.call("SET", KEYS[1], new, "PX", math.floor((new - now) / 1000) + 1)
return 0'

# bench_tmp NAME: a scratch directory in TMP, and PIDS, the processes to
# stop on exit (with the directory removed).
bench_tmp() {
  TMP=$(mktemp -d "/tmp/wxgate-$1.XXXXXX")
  PIDS=()
  trap bench_cleanup EXIT
}
bench_cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}

# bench_port VAR: the next free loopback port from NEXT_PORT (set it to the
# script's first port before the first call) into VAR.
bench_port() {
  while ss -ltn "sport = :$NEXT_PORT" | grep -q LISTEN; do NEXT_PORT=$((NEXT_PORT + 1)); done
  printf -v "$1" '%s' "$NEXT_PORT"
  NEXT_PORT=$((NEXT_PORT + 1))
}

# bench_nginx_proxy LISTEN UPSTREAM PID ERROR_LOG [MORE]: the nginx
# proxy_pass config the benchmarks compare wxgate with (one worker,
# keep-alive to the upstream, access log off). MORE: more main-context
# directives (e.g. `master_process off;`).
bench_nginx_proxy() {
  cat <<EOF2
worker_processes 1; daemon off; pid $3; error_log $4 warn; ${5:-}
events { worker_connections 4096; }
http { access_log off; keepalive_timeout 75s; keepalive_requests 1000000;
  upstream wechat { server $2; keepalive 64; keepalive_requests 1000000; }
  server { listen $1;
    location / { proxy_pass http://wechat; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
EOF2
}

# bench_nginx_mock LISTEN PID ERROR_LOG: the mock WeChat upstream, an nginx
# answering every request 200 with BENCH_BODY (one worker), and
# /cgi-bin/stable_token with a token (BENCH_INJECT).
BENCH_BODY='{"errcode":0,"errmsg":"ok"}'
bench_nginx_mock() {
  cat <<EOF2
worker_processes 1; daemon off; pid $2; error_log $3 warn;
events { worker_connections 4096; }
http { access_log off; keepalive_timeout 75s; keepalive_requests 1000000;
  server { listen $1;
    location / { types { } default_type application/json; return 200 '$BENCH_BODY'; }
    location = /cgi-bin/stable_token { types { } default_type application/json;
      return 200 '{"access_token":"BENCHTOKEN","expires_in":7200}'; } } }
EOF2
}
