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

# tests/sdks.rs drives wxgate with real WeChat SDKs, pinned, installed from
# PyPI and npm into target/sdk-env/ (python3-venv, nodejs and npm with
# apt-get when missing); a second run returns at once.
echo "== SDK environment (scripts/sdk-env.sh)"
scripts/sdk-env.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --all-targets --locked
