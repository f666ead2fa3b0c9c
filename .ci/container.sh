#!/usr/bin/env bash
# CI for the container image and compose.yaml (issue 31), run after `cargo test`:
#
#   DELAYQ_BIN=target/debug/delayq bash .ci/container.sh
#
# 1. installs podman, runc, debootstrap (apt) and podman-compose (PyPI, in a venv) if missing;
# 2. makes the Debian base image from Debian's packages (no registry is reachable), once,
#    reusing the tag when it exists, and stand-ins for compose's redis and postgres images;
# 3. builds the image from the Dockerfile (--target prebuilt, with DELAYQ_BIN stripped: the
#    Rust stage needs a toolchain image CI cannot pull), checks its user, health check,
#    stop signal and labels, prints its size;
# 4. brings up compose.yaml (with .ci/container/compose.ci.yaml's loopback ports: host
#    network, never the shared 6379/5432), runs the migration, runs `delayq demo` in the
#    image, starts `delayq serve`, schedules 100 orders over HTTP (their rows in PostgreSQL),
#    receives them on a webhook receiver on the host, stops serve with SIGTERM mid-way
#    (exit 0 within shutdown_grace), restarts Redis (AOF) and serve, and checks every order
#    arrived, signed, closed in the database, with no secret in any log;
# 5. tears everything down, always (trap).
#
# Every wait is bounded; any failure exits non-zero. Secrets are per run and never printed.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
here=$repo/.ci/container
t_start=$SECONDS
export PYTHONDONTWRITEBYTECODE=1   # no __pycache__ in the work tree

# Each step is one check: a step that begins means the one before it passed.
checks=0
current=
step() {
  [ -n "$current" ] && checks=$((checks + 1))
  current=$*
  printf '\n== %s (%ss)\n' "$*" "$((SECONDS - t_start))"
}
fail() { echo "FAIL: $*" >&2; exit 1; }

bin=${DELAYQ_BIN:-target/debug/delayq}
[ -x "$bin" ] || fail "DELAYQ_BIN ($bin) is not an executable: run cargo test (or cargo build) first"

# runc, cgroupfs and explicit rlimits for every podman call, podman-compose's included
# (containers.conf), and on the command line as well for the direct calls.
export CONTAINERS_CONF=$here/containers.conf
podman=(podman --runtime runc --cgroup-manager=cgroupfs)
ulimits=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
build=("${podman[@]}" build --pull=never --network host "${ulimits[@]}" --format docker)

# ---------------------------------------------------------------------------------------
# Everything this run makes, torn down on any exit.
run_id=$$
project=delayq-ci-$run_id
image=localhost/delayq:ci-$run_id
work=$(mktemp -d /tmp/delayq-container-ci.XXXXXX)
chmod 700 "$work"
receiver_pid=
compose_up=0

cleanup() {
  local rc=$?
  set +e
  if [ "$rc" -ne 0 ] && [ "$compose_up" = 1 ]; then
    echo "--- logs (failure) ---"
    for c in $("${podman[@]}" ps -a --filter "label=io.podman.compose.project=$project" --format '{{.Names}}'); do
      echo "--- $c"
      timeout 20 "${podman[@]}" logs --tail 40 "$c" 2>&1 | sed 's/^/  /'
    done
  fi
  if [ "$rc" -ne 0 ] && [ -s "$work/podman.err" ]; then
    echo "--- podman (failure) ---"
    grep -v 'systemd connection' "$work/podman.err" | tail -n 20
  fi
  [ -n "$receiver_pid" ] && kill "$receiver_pid" 2>/dev/null && wait "$receiver_pid" 2>/dev/null
  if [ "$compose_up" = 1 ]; then
    timeout 120 "${compose[@]}" down -v -t 5 >/dev/null 2>&1
    # Whatever down left (a container started outside compose, a volume):
    local left
    mapfile -t left < <("${podman[@]}" ps -aq --filter "label=io.podman.compose.project=$project")
    [ ${#left[@]} -eq 0 ] || "${podman[@]}" rm -f "${left[@]}" >/dev/null 2>&1
    mapfile -t left < <("${podman[@]}" volume ls -q --filter "label=io.podman.compose.project=$project")
    [ ${#left[@]} -eq 0 ] || "${podman[@]}" volume rm -f "${left[@]}" >/dev/null 2>&1
  fi
  if command -v podman >/dev/null 2>&1; then
    "${podman[@]}" rm -f "delayq-ci-demo-$run_id" >/dev/null 2>&1
    "${podman[@]}" rmi -f "$image" >/dev/null 2>&1
  fi
  rm -rf "$work"
  echo "container CI: torn down after $((SECONDS - t_start)) s"
  if [ "$rc" -eq 0 ]; then
    echo "container: $checks passed, 0 failed"
  else
    echo "container: $checks passed, 1 failed (${current:-setup})"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------
step "tools"
need_apt=()
command -v podman >/dev/null 2>&1 || need_apt+=(podman)
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)
command -v strip >/dev/null 2>&1 || need_apt+=(binutils)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3-minimal)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing ${need_apt[*]} (apt)"
  t=$SECONDS
  export DEBIAN_FRONTEND=noninteractive
  timeout 300 apt-get update -qq
  timeout 600 apt-get install -y -qq "${need_apt[@]}" >/dev/null
  echo "installed in $((SECONDS - t)) s"
fi
PODMAN_COMPOSE_VERSION=1.6.0
KUBERNETES_VALIDATE_VERSION=1.37.0
venv=${DELAYQ_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/delayq-ci}/venv-podman-compose-$PODMAN_COMPOSE_VERSION-kubernetes-validate-$KUBERNETES_VALIDATE_VERSION
if ! "$venv/bin/podman-compose" --version >/dev/null 2>&1 ||
  ! "$venv/bin/kubernetes-validate" --version >/dev/null 2>&1; then
  echo "installing podman-compose $PODMAN_COMPOSE_VERSION and kubernetes-validate $KUBERNETES_VALIDATE_VERSION (PyPI) in $venv"
  t=$SECONDS
  rm -rf "$venv"
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    rm -rf "$venv"
    export DEBIAN_FRONTEND=noninteractive
    timeout 300 apt-get update -qq
    timeout 600 apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv "$venv"
  fi
  timeout 600 "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "podman-compose==$PODMAN_COMPOSE_VERSION" "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
  echo "installed in $((SECONDS - t)) s"
fi
compose_bin=$venv/bin/podman-compose
compose=("$compose_bin" -p "$project" -f "$repo/compose.yaml" -f "$work/compose.ci.yaml")
podman --version
"$compose_bin" --version | head -n 1
echo "kubernetes-validate $("$venv/bin/kubernetes-validate" --version 2>&1 | tail -n 1)"

# ---------------------------------------------------------------------------------------
step "Kubernetes manifests (deploy/k8s): schemas, probes, grace, the pod's config"
timeout 300 "$venv/bin/python" "$here/check_k8s.py" deploy/k8s "$bin" || fail "deploy/k8s"

# Per-run secrets, exported for compose.yaml's interpolation; never printed.
rand() { python3 -c 'import secrets; print(secrets.token_urlsafe(24))'; }
DELAYQ_TOKEN=ci-$(rand)
POSTGRES_PASSWORD=$(rand)
DELAYQ_WEBHOOK_SECRET=whsec_$(python3 -c 'import base64, secrets; print(base64.b64encode(secrets.token_bytes(32)).decode())')
export DELAYQ_TOKEN POSTGRES_PASSWORD DELAYQ_WEBHOOK_SECRET
export DELAYQ_IMAGE=$image CI_RUN_ID=$run_id

# Loopback ports for this run (host network; the shared Redis and PostgreSQL keep theirs).
read -r redis_port pg_port api_port receiver_port < <(python3 - <<'EOF'
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
EOF
)
for p in "$redis_port" "$pg_port" "$api_port" "$receiver_port"; do
  case $p in 6379 | 5432) fail "port $p is the shared server's" ;; esac
done
export DELAYQ_WEBHOOK_URL=http://127.0.0.1:$receiver_port/orders/close
base=http://127.0.0.1:$api_port

# ---------------------------------------------------------------------------------------
step "base image and stand-ins for compose's redis and postgres"
"$here/base-image.sh"
for s in redis:7-bookworm postgres:15-bookworm; do
  name=docker.io/library/$s
  if "${podman[@]}" image exists "$name"; then
    echo "$name exists, reused"
  else
    t=$SECONDS
    timeout 600 "${build[@]}" -q -t "$name" -f "$here/${s%%:*}.Containerfile" "$here" >/dev/null
    echo "$name: stand-in built in $((SECONDS - t)) s"
  fi
done

# ---------------------------------------------------------------------------------------
step "image: Dockerfile --target prebuilt with $bin (stripped)"
ctx=$work/context
mkdir -p "$ctx/deploy"
cp Dockerfile .dockerignore "$ctx/"
cp -r deploy/docker "$ctx/deploy/"
strip -o "$ctx/delayq" "$bin"
t=$SECONDS
# runtime-base gets a tag of its own, so removing this run's image at the end prunes this
# run's layers only, never the cached base another build may be using.
timeout 600 "${build[@]}" -q --target runtime-base -t localhost/delayq-ci:runtime-base "$ctx" >/dev/null
timeout 600 "${build[@]}" -q --target prebuilt --build-arg DELAYQ_BINARY=delayq \
  --build-arg REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
  --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  -t "$image" "$ctx" >/dev/null
echo "built in $((SECONDS - t)) s"
rm -rf "$ctx"
"${podman[@]}" image inspect "$image" >"$work/image.json"
python3 - "$image" "$work/image.json" <<'EOF' || fail "image metadata"
import json, sys
img = json.load(open(sys.argv[2]))[0]
cfg = img["Config"]
problems = []
user = cfg.get("User", "")
if not user or user.split(":")[0] in ("", "0", "root"):
    problems.append(f"runs as {user or 'root'}")
hc = img.get("Healthcheck") or {}
if (hc.get("Test") or [])[1:3] != ["/usr/local/bin/delayq", "healthcheck"]:
    problems.append(f"health check {hc}")
if cfg.get("StopSignal") != "SIGTERM":
    problems.append(f"stop signal {cfg.get('StopSignal')}")
labels = img.get("Labels") or {}
for k in ("title", "description", "version", "revision", "created", "licenses", "base.name"):
    if not labels.get(f"org.opencontainers.image.{k}"):
        problems.append(f"label org.opencontainers.image.{k} missing")
if problems:
    sys.exit(f"image {sys.argv[1]}: " + "; ".join(problems))
print(f"user {user}, stop signal {cfg['StopSignal']}, health check {hc['Test'][1:]}, "
      f"{len([k for k in labels if k.startswith('org.opencontainers.image.')])} OCI labels")
EOF
size=$("${podman[@]}" image inspect --format '{{.Size}}' "$image")
echo "image size: $((size / 1000000)) MB ($size bytes; base $(("$("${podman[@]}" image inspect --format '{{.Size}}' docker.io/library/debian:bookworm-slim)" / 1000000)) MB, binary $(("$(stat -c %s "$bin")" / 1000000)) MB before strip)"

# ---------------------------------------------------------------------------------------
step "compose.yaml: redis (AOF) and postgres"
python3 - "$repo/compose.yaml" "$work/compose.ci.yaml" "$redis_port" "$pg_port" "$api_port" <<'EOF'
# The CI override: every service on the host network with this run's loopback ports. The
# handlers are compose.yaml's own DELAYQ_HANDLERS with the postgres address replaced (the
# webhook URL comes from DELAYQ_WEBHOOK_URL); secrets stay ${...} references.
import json, re, sys
src, out, redis_port, pg_port, api_port = sys.argv[1:]
text = open(src).read()
m = re.search(r"^      DELAYQ_HANDLERS: >-\n((?:        .*\n)+)", text, re.M)
if not m:
    sys.exit("compose.yaml: delayq's DELAYQ_HANDLERS (a >- block) not found")
handlers = " ".join(line.strip() for line in m.group(1).splitlines())
if handlers.count("@postgres:5432/") != 1:
    sys.exit("compose.yaml: DELAYQ_HANDLERS should name @postgres:5432/ once")
handlers = handlers.replace("@postgres:5432/", f"@127.0.0.1:{pg_port}/")
pg_url = f"postgres://delayq:${{POSTGRES_PASSWORD}}@127.0.0.1:{pg_port}/shop"
q = json.dumps  # JSON strings are valid YAML strings
print(f"""services:
  redis:
    network_mode: host
    command: ["redis-server", "--appendonly", "yes", "--appendfsync", "everysec",
              "--bind", "127.0.0.1", "--port", "{redis_port}"]
    healthcheck:
      test: ["CMD", "redis-cli", "-p", "{redis_port}", "ping"]
  postgres:
    network_mode: host
    environment:
      PGPORT: "{pg_port}"
    command: ["postgres", "-c", "listen_addresses=127.0.0.1"]
  migrate:
    network_mode: host
    environment:
      DELAYQ_DATABASE_URL: {q(pg_url)}
  delayq:
    network_mode: host
    environment:
      DELAYQ_REDIS_URL: "redis://127.0.0.1:{redis_port}"
      DELAYQ_HTTP__LISTEN: "127.0.0.1:{api_port}"
      DELAYQ_HANDLERS: {q(handlers)}
  webhook:
    network_mode: host
""", file=open(out, "w"))
EOF
compose_up=1
timeout 180 "${compose[@]}" up -d --no-build redis postgres >"$work/up.log" 2>&1 ||
  { cat "$work/up.log"; fail "compose up redis postgres"; }

ctr() { # the container of a compose service
  "${podman[@]}" ps -a --filter "label=io.podman.compose.project=$project" \
    --filter "label=com.docker.compose.service=$1" --format '{{.Names}}' | head -n 1
}
healthy() { # podman runs no health-check timers without systemd: run the check, bounded
  local c deadline=$((SECONDS + $2))
  c=$(ctr "$1")
  [ -n "$c" ] || fail "no container for service $1"
  until timeout 10 "${podman[@]}" healthcheck run "$c" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail "$1 not healthy within $2 s"
    sleep 0.5
  done
  echo "$1 healthy ($c)"
}
healthy redis 60
healthy postgres 90

# ---------------------------------------------------------------------------------------
step "migration (compose's migrate service, twice: idempotent)"
for i in 1 2; do
  timeout 120 "${compose[@]}" up --no-build --no-deps migrate >"$work/migrate.log" 2>&1 ||
    { cat "$work/migrate.log"; fail "migrate run $i"; }
  c=$(ctr migrate)
  code=$(timeout 60 "${podman[@]}" wait "$c")
  [ "$code" = 0 ] || { "${podman[@]}" logs "$c"; fail "delayq migrate exited $code"; }
done
echo "delayq migrate exited 0, twice"
pg=$(ctr postgres)
psql_ci() { timeout 30 "${podman[@]}" exec -i "$pg" psql -q -v ON_ERROR_STOP=1 -U delayq -d shop "$@"; }
tables=$(psql_ci -tAc "SELECT count(*) FROM information_schema.tables WHERE table_name = 'orders'")
[ "$tables" = 1 ] || fail "no orders table after migrate"

# ---------------------------------------------------------------------------------------
step "delayq demo in the image (pointed at compose's Redis)"
t=$SECONDS
timeout 180 "${podman[@]}" run --rm --name "delayq-ci-demo-$run_id" --network host "${ulimits[@]}" --no-healthcheck \
  "$image" demo --orders 300 --window 3s --redis-url "redis://127.0.0.1:$redis_port" \
  >"$work/demo.out" 2>"$work/demo.err" || { tail -n 20 "$work/demo.err"; fail "demo exited non-zero"; }
grep -h "^summary:" "$work/demo.out" "$work/demo.err" || fail "no summary from demo"
python3 -c 'import json,sys; s=json.loads(open(sys.argv[1]).read().splitlines()[-1]); assert s["created"]==300 and s["pending"]==0 and s["closed"]+s["paid"]==300, s' \
  "$work/demo.out" || fail "demo summary"
echo "demo: exit 0 in $((SECONDS - t)) s"

# ---------------------------------------------------------------------------------------
step "delayq serve (compose's delayq service) and a webhook receiver on the host"
WEBHOOK_SECRET=$DELAYQ_WEBHOOK_SECRET python3 -u deploy/compose/webhook-receiver.py \
  --bind 127.0.0.1 --port "$receiver_port" --delay-ms 200 >"$work/received.log" 2>"$work/receiver.err" &
receiver_pid=$!
timeout 180 "${compose[@]}" up -d --no-build delayq >"$work/up-delayq.log" 2>&1 ||
  { cat "$work/up-delayq.log"; fail "compose up delayq"; }
serve=$(ctr delayq)
python3 "$here/api.py" ready "$base" 60 || fail "serve not ready"
healthy delayq 30
uid=$(timeout 10 "${podman[@]}" exec "$serve" id -u)
[ "$uid" != 0 ] || fail "serve runs as root"
pid1_user=$(timeout 10 "${podman[@]}" top "$serve" user | tail -n 1)
[ "$pid1_user" = delayq ] || [ "$pid1_user" = 10001 ] || fail "serve's PID 1 runs as $pid1_user"
echo "serve runs as uid $uid ($pid1_user), PID 1"
curl -fsS -o /dev/null --max-time 5 "$base/ui/" 2>/dev/null ||
  python3 -c 'import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' "$base/ui/" ||
  fail "dashboard /ui/"
echo "dashboard answers at /ui/"

# ---------------------------------------------------------------------------------------
step "100 orders: rows in PostgreSQL, scheduled over HTTP, received by the webhook"
python3 "$here/api.py" plan 100 3000 12000 "$work/plan.tsv"
python3 "$here/api.py" sql "$work/plan.tsv" | psql_ci || fail "inserting the orders"
python3 "$here/api.py" schedule "$base" order-close "$work/plan.tsv" || fail "scheduling"
python3 "$here/api.py" received "$work/received.log" "$work/plan.tsv" 30 10 || fail "first deliveries"

step "SIGTERM: podman stop serve mid-way (shutdown_grace 10s)"
t0=$(date +%s%N)
timeout 60 "${podman[@]}" stop -t 30 "$serve" >/dev/null 2>>"$work/podman.err"
elapsed_ms=$((($(date +%s%N) - t0) / 1000000))
code=$("${podman[@]}" inspect --format '{{.State.ExitCode}}' "$serve")
echo "serve stopped in $elapsed_ms ms, exit code $code"
[ "$code" = 0 ] || fail "serve exited $code on SIGTERM"
[ "$elapsed_ms" -le 11000 ] || fail "serve took $elapsed_ms ms to stop (shutdown_grace 10s + 1s)"
timeout 10 "${podman[@]}" logs "$serve" 2>&1 | grep -q "delayq stopped" || fail "no 'delayq stopped' in serve's log"
got=$(python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import api; print(len(api.received_ids(sys.argv[2])[0]))' "$here" "$work/received.log")
echo "$got/100 delivered before the stop"
[ "$got" -lt 100 ] || fail "every order was delivered before the stop: the restart proves nothing"

step "restart: Redis (AOF), then serve"
rc_=$(ctr redis)
timeout 60 "${podman[@]}" restart -t 10 "$rc_" >/dev/null 2>>"$work/podman.err"
healthy redis 60
timeout 60 "${podman[@]}" start "$serve" >/dev/null 2>>"$work/podman.err"
python3 "$here/api.py" ready "$base" 60 || fail "serve not ready after the restart"
python3 "$here/api.py" received "$work/received.log" "$work/plan.tsv" 60 || fail "orders lost"
python3 "$here/api.py" history "$base" order-close "$work/plan.tsv" 60 webhook close-in-db ||
  fail "order histories"
closed=$(psql_ci -tAc "SELECT count(*) FROM orders WHERE status = 'closed' AND id LIKE 'ci-$run_id-%'")
echo "$closed/100 orders closed in PostgreSQL"
[ "$closed" = 100 ] || fail "$closed/100 orders closed in the database"
healthy delayq 30

# ---------------------------------------------------------------------------------------
step "no secret in any log"
# Each container's log, this script's own files (podman-compose's output included), the
# image's metadata and history: none may hold a token, password or webhook secret.
srcdir=$work/secret-scan
mkdir -p "$srcdir"
for c in $("${podman[@]}" ps -a --filter "label=io.podman.compose.project=$project" --format '{{.Names}}'); do
  timeout 20 "${podman[@]}" logs "$c" >"$srcdir/container-$c.log" 2>&1
done
cp "$work"/*.log "$work"/*.err "$work/demo.out" "$srcdir/" 2>/dev/null
"${podman[@]}" image inspect "$image" >"$srcdir/image-inspect.json"
"${podman[@]}" history --no-trunc "$image" >"$srcdir/image-history.txt"
leaks=0
for s in "$DELAYQ_TOKEN" "$POSTGRES_PASSWORD" "${DELAYQ_WEBHOOK_SECRET#whsec_}"; do
  while IFS= read -r f; do
    echo "a secret appears in ${f##*/}" >&2
    leaks=1
  done < <(grep -lF -- "$s" "$srcdir"/* 2>/dev/null)
done
[ "$leaks" = 0 ] || fail "secrets in logs or image metadata"
echo "none in $(cat "$srcdir"/* | wc -l) lines of logs and image metadata"

checks=$((checks + 1))
current=
echo
echo "container CI passed in $((SECONDS - t_start)) s; image size $((size / 1000000)) MB"
