#!/usr/bin/env python3
"""Host-side helpers for .ci/container.sh (standard library only): plan orders, schedule them
through delayq's HTTP API, wait for readiness and for the webhook receiver, check each
order's history. The bearer token comes from DELAYQ_TOKEN (never printed).

    api.py ready     BASE TIMEOUT_S
    api.py plan      N FIRST_MS LAST_MS PLAN.tsv      (ids and due times, from now)
    api.py sql       PLAN.tsv                         (INSERT statements for the orders table)
    api.py schedule  BASE QUEUE PLAN.tsv
    api.py received  RECEIVER.log PLAN.tsv TIMEOUT_S [AT_LEAST]
    api.py history   BASE QUEUE PLAN.tsv SECONDS GROUP...
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request


def call(method, url, body=None, token=True, timeout=10):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", "Bearer " + os.environ["DELAYQ_TOKEN"])
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def read_plan(path):
    with open(path) as f:
        return [(line.split("\t")[0], int(line.split("\t")[1])) for line in f if line.strip()]


def ready(base, timeout_s):
    deadline = time.monotonic() + float(timeout_s)
    last = None
    while time.monotonic() < deadline:
        try:
            status, _ = call("GET", base + "/readyz", token=False, timeout=2)
            if status == 200:
                return 0
            last = status
        except OSError as e:
            last = e
        time.sleep(0.25)
    print(f"not ready within {timeout_s}s: {last}", file=sys.stderr)
    return 1


def plan(n, first_ms, last_ms, path):
    n, first_ms, last_ms = int(n), int(first_ms), int(last_ms)
    now = int(time.time() * 1000)
    run = os.environ.get("CI_RUN_ID", str(os.getpid()))
    with open(path, "w") as f:
        for i in range(n):
            due = now + first_ms + (last_ms - first_ms) * i // max(n - 1, 1)
            f.write(f"ci-{run}-{i:04d}\t{due}\n")
    return 0


def sql(path):
    now = int(time.time() * 1000)
    rows = ",\n".join(f"('{oid}', 'pending', 1999, {now}, {due})" for oid, due in read_plan(path))
    print("INSERT INTO orders (id, status, amount_cents, created_at, expires_at) VALUES\n"
          + rows + ";")
    return 0


def schedule(base, queue, path):
    orders = read_plan(path)
    # Without a token: refused, nothing written.
    status, _ = call("POST", f"{base}/v1/queues/{queue}/messages:batch",
                     {"messages": []}, token=False)
    if status != 401:
        print(f"a request without a token answered {status}, not 401", file=sys.stderr)
        return 1
    messages = [{"id": oid, "due_at": due, "payload": {"order": oid, "amount_cents": 1999}}
                for oid, due in orders]
    status, body = call("POST", f"{base}/v1/queues/{queue}/messages:batch",
                        {"messages": messages})
    if status not in (200, 201):
        print(f"batch schedule answered {status}: {body[:500]!r}", file=sys.stderr)
        return 1
    # One more through the single-message call, rescheduling the last order to its own
    # due time (unchanged): the API answers 200.
    oid, due = orders[-1]
    status, body = call("PUT", f"{base}/v1/queues/{queue}/messages/{oid}",
                        {"due_at": due, "payload": {"order": oid, "amount_cents": 1999}})
    if status not in (200, 201):
        print(f"PUT answered {status}: {body[:300]!r}", file=sys.stderr)
        return 1
    print(f"scheduled {len(orders)} orders over HTTP")
    return 0


def received_ids(log):
    ids, bad = set(), []
    try:
        with open(log) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if "refused" in rec:
                    bad.append(rec["refused"])
                elif rec.get("order"):
                    if not rec.get("signed"):
                        bad.append(f"unsigned delivery of {rec['order']}")
                    ids.add(rec["order"])
    except FileNotFoundError:
        pass
    return ids, bad


def received(log, path, timeout_s, at_least=None):
    want = {oid for oid, _ in read_plan(path)}
    need = len(want) if at_least is None else int(at_least)
    deadline = time.monotonic() + float(timeout_s)
    while True:
        ids, bad = received_ids(log)
        if bad:
            print(f"receiver refused or saw unsigned deliveries: {bad[:5]}", file=sys.stderr)
            return 1
        stray = ids - want
        if stray:
            print(f"unexpected orders delivered: {sorted(stray)[:5]}", file=sys.stderr)
            return 1
        if len(ids & want) >= need:
            print(f"receiver has {len(ids & want)}/{len(want)} orders")
            return 0
        if time.monotonic() > deadline:
            missing = sorted(want - ids)
            print(f"receiver has {len(ids)}/{len(want)} after {timeout_s}s; missing "
                  f"{missing[:10]}", file=sys.stderr)
            return 1
        time.sleep(0.2)


def history(base, queue, path, timeout_s, *groups):
    """Waits until every order of the plan is dispatched and done in each group (an entry
    its stopped consumer never ran comes back once handed back or its lease runs out)."""
    deadline = time.monotonic() + float(timeout_s)
    while True:
        problems = []
        for oid, _ in read_plan(path):
            status, body = call("GET", f"{base}/v1/queues/{queue}/messages/{oid}")
            if status != 200:
                problems.append(f"{oid}: GET answered {status}")
                continue
            h = json.loads(body)
            states = {g["group"]: g["state"] for g in h.get("groups", [])}
            if h.get("state") != "dispatched" or any(states.get(g) != "done" for g in groups):
                problems.append(f"{oid}: {h.get('state')} {states}")
        if not problems:
            print(f"every order dispatched and done in {', '.join(groups)}")
            return 0
        if time.monotonic() > deadline:
            print(f"{len(problems)} orders not done after {timeout_s}s: {problems[:5]}",
                  file=sys.stderr)
            return 1
        time.sleep(0.5)


def main(argv):
    verbs = {"ready": ready, "plan": plan, "sql": sql, "schedule": schedule,
             "received": received, "history": history}
    if len(argv) < 2 or argv[1] not in verbs:
        print(__doc__, file=sys.stderr)
        return 2
    return verbs[argv[1]](*argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
