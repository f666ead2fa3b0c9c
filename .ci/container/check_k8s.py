#!/usr/bin/env python3
"""Checks deploy/k8s/ (run by .ci/container.sh with the CI venv's Python, which has PyYAML and
kubernetes-validate; nothing is downloaded: the schemas ship in the package).

1. Every manifest validates against the Kubernetes schemas (strict: unknown fields are
   errors), for the oldest and newest versions named below.
2. kustomization.yaml lists every manifest but the example Secret.
3. The Deployment agrees with the config: terminationGracePeriodSeconds above
   shutdown_grace + 1 s; probes on /healthz (liveness) and /readyz (readiness) at the
   listen port; every secretKeyRef names a key of the example Secret.
4. `delayq serve` accepts the configuration as the pod would get it: the ConfigMap's TOML
   and the container's environment ($(VAR) references expanded with the example Secret's
   values), run for a few seconds against a closed Redis port (a config error exits 2 at
   once; a good config keeps retrying Redis).

    check_k8s.py DEPLOY_K8S_DIR DELAYQ_BIN
"""

import os
import re
import subprocess
import sys
import tempfile
import tomllib

import yaml

VERSIONS = ["1.30.0", "1.37.0"]


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def duration_s(text):
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", text)
    if not m:
        raise ValueError(f"cannot read duration {text!r}")
    n, unit = int(m.group(1)), m.group(2)
    return n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


def main(k8s_dir, delayq_bin):
    problems = []
    files = sorted(f for f in os.listdir(k8s_dir) if f.endswith(".yaml"))
    manifests = [f for f in files if f != "kustomization.yaml"]
    validator = os.path.join(os.path.dirname(sys.executable), "kubernetes-validate")
    for v in VERSIONS:
        r = subprocess.run([validator, "--strict", "--quiet", "-k", v]
                           + [os.path.join(k8s_dir, f) for f in manifests],
                           capture_output=True, text=True, timeout=120)
        out = (r.stdout + r.stderr).strip()
        if r.returncode != 0:
            problems.append(f"schema (Kubernetes {v}):\n{out}")
        else:
            print(f"schema: {len(manifests)} manifests valid against Kubernetes {v} (strict)")

    kust = load(os.path.join(k8s_dir, "kustomization.yaml"))[0]
    listed = set(kust.get("resources", []))
    for f in manifests:
        if f == "secret.example.yaml":
            if f in listed:
                problems.append("kustomization.yaml must not apply the example Secret")
        elif f not in listed:
            problems.append(f"kustomization.yaml does not list {f}")
    for f in listed - set(manifests):
        problems.append(f"kustomization.yaml lists a missing {f}")

    docs = {}
    for f in manifests:
        for d in load(os.path.join(k8s_dir, f)):
            docs[d["kind"]] = d
    config_text = docs["ConfigMap"]["data"]["delayq.toml"]
    config = tomllib.loads(config_text)
    grace = duration_s(config.get("shutdown_grace", "10s"))
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    tgp = pod.get("terminationGracePeriodSeconds", 30)
    if not tgp > grace + 1:
        problems.append(f"terminationGracePeriodSeconds {tgp} is not above shutdown_grace "
                        f"{grace}s + 1s")
    else:
        print(f"terminationGracePeriodSeconds {tgp} > shutdown_grace {grace:g}s + 1s")
    serve = next(c for c in pod["containers"] if c["name"] == "delayq")
    port = int(config["http"]["listen"].rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in serve["ports"]}
    if ports.get("http") != port:
        problems.append(f"containerPort http {ports.get('http')} is not the listen port {port}")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        got = serve.get(probe, {}).get("httpGet", {})
        if got.get("path") != path or got.get("port") not in ("http", port):
            problems.append(f"{probe} should GET {path} on the http port, not {got}")
    if pod.get("securityContext", {}).get("runAsNonRoot") is not True:
        problems.append("the pod should set runAsNonRoot")

    secret = docs["Secret"]["stringData"]
    env = {}
    for c in [serve] + pod.get("initContainers", []):
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref and ref["key"] not in secret:
                problems.append(f"{c['name']}: secret key {ref['key']} not in the example Secret")
    for e in serve.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        value = secret.get(ref["key"], "") if ref else e.get("value", "")
        # Kubernetes' dependent variables: $(NAME) of a variable defined earlier.
        env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)
    env.update({"DELAYQ_REDIS_URL": "redis://127.0.0.1:1", "DELAYQ_HTTP__LISTEN": "127.0.0.1:0",
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "RUST_LOG": "error"})
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as cfg:
        cfg.write(config_text)
        cfg.flush()
        p = subprocess.Popen([delayq_bin, "serve", "--config", cfg.name], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _, err = p.communicate(timeout=3)
            problems.append(f"delayq serve refused the pod's configuration (exit "
                            f"{p.returncode}): {err.strip()[-500:]}")
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                p.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
            print("delayq serve accepts the pod's configuration (ConfigMap + env)")

    if problems:
        print("\n".join("FAIL: " + p for p in problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
