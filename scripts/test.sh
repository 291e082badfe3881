#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit, property and socket-level
# tests, and real WeChat SDKs against wxgate (tests/sdks.rs). Tests start
# their own redis-server processes on free loopback ports, so redis-server
# must be on PATH; it is installed here when missing and we are root on a
# Debian/Ubuntu machine.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing redis-server"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
    # Debian starts the packaged service on 6379; tests never use it.
  else
    echo "redis-server is missing: install it (e.g. apt-get install redis-server) and rerun" >&2
    exit 1
  fi
fi

# tests/dashboards.rs runs promtool on deploy/prometheus/ (and fails in CI
# without it). It comes from Debian's `prometheus` package, unpacked into
# target/tools/prometheus/ rather than installed: no Prometheus service, no
# user, none of its dependencies (promtool is one static Go binary).
# tests/quickstart.rs runs the README's quick start, which uses curl.
if ! command -v curl >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing curl"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl >/dev/null
  else
    echo "curl is missing: install it (e.g. apt-get install curl) and rerun" >&2
    exit 1
  fi
fi

# tests/console.rs drives the admin console in a headless browser:
# Debian's chromium (without its recommended packages), unless
# WXGATE_TEST_CHROMIUM names another Chromium or Chrome.
if [ -z "${WXGATE_TEST_CHROMIUM:-}" ] && ! command -v chromium >/dev/null 2>&1 \
  && ! command -v chromium-browser >/dev/null 2>&1 && ! command -v google-chrome >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing chromium"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
  else
    echo "chromium is missing: install it (e.g. apt-get install chromium) or set WXGATE_TEST_CHROMIUM, and rerun" >&2
    exit 1
  fi
fi

if ! command -v promtool >/dev/null 2>&1 && [ ! -x target/tools/prometheus/usr/bin/promtool ]; then
  if command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1; then
    echo "== unpacking promtool (Debian package prometheus) into target/tools/prometheus"
    debs=$(mktemp -d)
    chmod 0777 "$debs"   # apt-get download runs as _apt when it can
    if ! (cd "$debs" && apt-get download -qq prometheus >/dev/null 2>&1); then
      if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && (cd "$debs" && apt-get download -qq prometheus >/dev/null)
      else
        echo "cannot download the prometheus package: run apt-get update as root, or install promtool" >&2
        exit 1
      fi
    fi
    mkdir -p target/tools/prometheus
    dpkg-deb -x "$debs"/prometheus_*.deb target/tools/prometheus
    rm -rf "$debs"
  else
    echo "promtool is missing: install it (Debian/Ubuntu: prometheus) and rerun" >&2
    exit 1
  fi
fi

# tests/sdks.rs drives wxgate with real WeChat SDKs, pinned, installed from
# PyPI and npm into target/sdk-env/ (python3-venv, nodejs and npm with
# apt-get when missing); a second run returns at once.
echo "== SDK environment (scripts/sdk-env.sh)"
scripts/sdk-env.sh

# tests/deploy.rs checks deploy/kubernetes-*.yaml against the Kubernetes
# API's JSON schemas with kubernetes-validate (PyPI; the schemas ship inside
# the package, so it runs offline), pinned with its dependencies in
# tests/tools/kubernetes-validate.txt, in a venv at
# target/tools/kubernetes-validate/ (python3 with venv: scripts/sdk-env.sh
# above installs it when missing). A stamp of the pins skips a second install.
kv=target/tools/kubernetes-validate
kv_pins=$(sha256sum tests/tools/kubernetes-validate.txt | cut -d' ' -f1)
if [ "$(cat "$kv/stamp" 2>/dev/null)" != "$kv_pins" ]; then
  echo "== installing kubernetes-validate (tests/tools/kubernetes-validate.txt) into $kv"
  rm -rf "$kv"
  python3 -m venv "$kv"
  "$kv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    --only-binary=:all: -r tests/tools/kubernetes-validate.txt
  echo "$kv_pins" >"$kv/stamp"
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --all-targets --locked -- --skip queue_pace::
# tests/queue_pace.rs measures queued delivery's pace against real round
# trips (the issue's numbers, in real time): alone, one test at a time, so
# the rest of the suite does not take its CPU.
echo "== cargo test, queue pace (real time, one test at a time)"
cargo test --locked --test all -- queue_pace:: --test-threads=1

# The suites whose guarantees must hold whatever decides a call, again with
# every call decided on its own on every Redis store they start
# (`quota_leases = false`, `quota_reserve = "0s"`; tests/support:
# WXGATE_TEST_PER_CALL=1; the first run has the defaults, leases and
# reserves on): windows and day quotas exact across instances, refunds,
# penalties, reserves, shares, clear_quota, learned limits, a campaign
# beside HR's notices. The same test binary (tests/all.rs), these files'
# modules: no second build.
echo "== cargo test, every call decided on its own (no quota lease, no reserve)"
WXGATE_TEST_PER_CALL=1 cargo test --locked --test all -- \
  multi_instance:: learned_quota:: campaign:: refunds:: penalties:: \
  reserve:: share:: quota_clear:: per_path:: callers:: forecasts:: broker::
