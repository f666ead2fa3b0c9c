#!/usr/bin/env bash
# CI for the Python SDK (sdk/python): run after `cargo test`, so target/debug/delayq exists
# (or DELAYQ_BIN names the binary). Installs what it needs from PyPI into a venv of its own,
# runs the tests against throwaway redis-servers, and builds the sdist and the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

export DELAYQ_BIN="${DELAYQ_BIN:-$ROOT/target/debug/delayq}"
if [ ! -x "$DELAYQ_BIN" ]; then
  echo "sdk-python: the delayq binary is needed at $DELAYQ_BIN (cargo build first)" >&2
  exit 1
fi
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq redis-server >/dev/null
fi

VENV="$ROOT/target/sdk-python-venv"
if ! python3 -m venv --clear "$VENV" >/dev/null 2>&1; then
  echo "sdk-python: python3 -m venv failed: installing python3-venv"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq python3-venv >/dev/null
  python3 -m venv --clear "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install --quiet --disable-pip-version-check "redis>=5.0.1,<9" "pytest>=7,<10" "build>=1,<2"
# Build from a copy, so nothing (egg-info, build/) is written into the source tree; then
# test the installed wheel: its scripts are the ones the drift check compares.
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp -r "$ROOT/sdk/python" "$WORK/sdk-python"
rm -rf "$WORK/sdk-python/tests"
DIST="$ROOT/target/sdk-python-dist"
rm -rf "$DIST"
"$PY" -m build --outdir "$DIST" "$WORK/sdk-python" >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; exit 1; }
tail -n 1 "$WORK/build.log"
ls "$DIST"/delayq-*.tar.gz "$DIST"/delayq-*-py3-none-any.whl
"$PY" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$DIST"/delayq-*-py3-none-any.whl
# The wheel carries the scripts.
"$PY" - "$DIST" <<'PYEOF'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/delayq-*.whl")[0]
names = zipfile.ZipFile(whl).namelist()
for s in ("enqueue", "cancel", "reschedule", "get", "create_queue"):
    assert f"delayq/lua/{s}.lua" in names, (s, names)
PYEOF

# -p no:cacheprovider and no bytecode: nothing written into the source tree; -rs: every
# skip is named. The tests import the installed package, not sdk/python/src.
cd "$ROOT/sdk/python"
PYTHONDONTWRITEBYTECODE=1 "$PY" -m pytest -p no:cacheprovider -q -rs tests
