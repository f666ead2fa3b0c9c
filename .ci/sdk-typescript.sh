#!/usr/bin/env bash
# CI for the TypeScript producer (sdk/typescript): install with `npm ci`, build with tsc, run
# every test with node's runner against redis-servers the tests start themselves and the
# delayq binary at $DELAYQ_BIN (default target/debug/delayq, built by `cargo test`), then
# build the npm tarball with `npm pack`. Exits non-zero on any failure; never skips.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
started=$(date +%s)

export DEBIAN_FRONTEND=noninteractive
apt_updated=
apt_install() {
  if [ -z "$apt_updated" ]; then apt-get update -qq; apt_updated=1; fi
  apt-get install -y -qq "$@" >/dev/null
}

# Node.js 18 or later with npm (Debian's packages on a fresh machine).
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$node_major" -lt 18 ] || ! command -v npm >/dev/null 2>&1; then
  echo "node >= 18 / npm not found: installing Debian's nodejs and npm"
  apt_install nodejs npm
fi
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "redis-server / redis-cli not found: installing them"
  apt_install redis-server
fi
echo "node $(node --version), npm $(npm --version), $(redis-server --version | cut -d' ' -f1-3)"

export DELAYQ_BIN="${DELAYQ_BIN:-$repo/target/debug/delayq}"
if [ ! -x "$DELAYQ_BIN" ]; then
  echo "error: the delayq binary is not at DELAYQ_BIN=$DELAYQ_BIN (run cargo build first)" >&2
  exit 1
fi

cd sdk/typescript
timeout 120 npm ci --no-audit --no-fund
npm run build
# The published declarations serve a TypeScript caller (test/types/usage.ts).
npm run typecheck

# One test file at a time on small machines (each starts its own redis-servers).
concurrency=()
if node --help | grep -q -- '--test-concurrency'; then concurrency=(--test-concurrency=1); fi
timeout 150 node --test "${concurrency[@]}" test/*.test.js

# The npm tarball: built, and holding the compiled code, its types and the scripts.
pack_dir=$(mktemp -d)
trap 'rm -rf "$pack_dir"' EXIT
npm pack --pack-destination "$pack_dir" >/dev/null
tarball=$(ls "$pack_dir"/delayq-*.tgz)
listing=$(tar -tzf "$tarball")
for f in package/dist/index.js package/dist/index.d.ts package/lua/enqueue.lua package/lua/cancel.lua \
  package/lua/reschedule.lua package/lua/get.lua package/README.md package/package.json; do
  if ! grep -qx "$f" <<<"$listing"; then
    echo "error: $f is missing from $(basename "$tarball")" >&2
    exit 1
  fi
done
if grep -q '^package/test/' <<<"$listing"; then
  echo "error: the tarball holds the tests" >&2
  exit 1
fi
echo "npm pack: $(basename "$tarball") ($(du -k "$tarball" | cut -f1) KiB)"
echo "sdk/typescript CI passed in $(( $(date +%s) - started )) s"
