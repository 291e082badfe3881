#!/usr/bin/env bash
# The real WeChat SDKs that tests/sdks.rs drives wxgate with, installed from
# their registries at pinned versions into target/sdk-env/ (git-ignored):
#   py/    a Python venv with wechatpy (tests/sdk/requirements.txt)
#   node/  wechat-api for Node.js (tests/sdk/package.json + package-lock.json, npm ci)
# Idempotent: a stamp of the pins makes a second run return at once; changed
# pins reinstall from scratch. When python3 (with venv/ensurepip), node or npm
# is missing and we are root on Debian/Ubuntu, they are installed with apt-get.
# WXGATE_SDK_ENV overrides the directory. Concurrent runs wait for one install.
set -euo pipefail
cd "$(dirname "$0")/.."

env_dir=${WXGATE_SDK_ENV:-$PWD/target/sdk-env}
pins=(tests/sdk/requirements.txt tests/sdk/package.json tests/sdk/package-lock.json scripts/sdk-env.sh)
want=$(cat "${pins[@]}" | sha256sum | cut -d' ' -f1)
stamp=$env_dir/stamp

ready() { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; }
ready && exit 0

mkdir -p "$env_dir"
exec 9>"$env_dir/lock"
flock 9
ready && exit 0
start=$SECONDS

missing=()
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== sdk-env: installing ${missing[*]} with apt-get" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "sdk-env: ${missing[*]} missing: install them (e.g. apt-get install python3 python3-venv nodejs npm) and rerun" >&2
    exit 1
  fi
fi

rm -rf "$env_dir/py" "$env_dir/node" "$stamp"

echo "== sdk-env: Python venv with $(grep -m1 '^wechatpy' tests/sdk/requirements.txt) in $env_dir/py" >&2
python3 -m venv "$env_dir/py"
"$env_dir/py/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
  --only-binary=:all: -r tests/sdk/requirements.txt >&2

echo "== sdk-env: wechat-api $(sed -n 's/.*"wechat-api": "\(.*\)".*/\1/p' tests/sdk/package.json) with npm ci in $env_dir/node" >&2
mkdir -p "$env_dir/node"
cp tests/sdk/package.json tests/sdk/package-lock.json "$env_dir/node/"
(cd "$env_dir/node" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)

echo "$want" >"$stamp.new"
mv "$stamp.new" "$stamp"
echo "== sdk-env: ready in $((SECONDS - start)) s" >&2
