#!/usr/bin/env bash
# Runs `delayq bench` against a throwaway Redis Cluster (3 masters, no replicas) on this
# machine, beside the same scenarios on a single node, so both are measured in one run.
#
#   cargo build --release && benches/cluster.sh [bench flags...]
#   e.g. benches/cluster.sh --scenario spread,storm,enqueue --shards 8 --json
#
# The cluster lives in a temp dir on free ports and is shut down at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${DELAYQ_BIN:-./target/release/delayq}
dir=$(mktemp -d)
ports=()
cleanup() {
  for p in "${ports[@]}"; do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
base=$((20000 + RANDOM % 20000))
for i in 0 1 2; do
  p=$((base + i))
  ports+=("$p")
  mkdir -p "$dir/$p"
  redis-server --port "$p" --bind 127.0.0.1 --dir "$dir/$p" --save "" --appendonly no \
    --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
    --daemonize yes --logfile "$dir/$p/log"
done
for p in "${ports[@]}"; do
  until redis-cli -p "$p" ping >/dev/null 2>&1; do sleep 0.1; done
done
redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >/dev/null
until redis-cli -p "${ports[0]}" cluster info | grep -q 'cluster_state:ok'; do sleep 0.2; done
urls=$(printf '127.0.0.1:%s,' "${ports[@]}")
echo "# cluster (3 masters): redis+cluster://${urls%,}" >&2
"$BIN" --redis-url "redis+cluster://${urls%,}" bench "$@"
echo "# single node (throwaway)" >&2
"$BIN" --redis-url redis://127.0.0.1:1 bench "$@"
