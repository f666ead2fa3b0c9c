#!/usr/bin/env python3
"""A checkout service in Python that schedules delayq orders without the Rust client.

It does exactly what ARCHITECTURE.md ("Redis key layout" / "Producing from another
language") says, with nothing but the standard library (a minimal RESP client):

  1. now_ms from the Redis server's TIME;
  2. SCRIPT LOAD enqueue.lua as `delayq scripts export` writes it, then EVALSHA by its SHA;
  3. the queue's shard count and epoch from its registry record {ns}:queue:<q>; the shard
     of an id is FNV-1a 64 of its UTF-8 bytes modulo the shard count;
  4. the ten keys of the shard {ns:q:s}: due, payload, meta, levels, dispatched, tags,
     debounce, keyed, key_ring, remembered; ARGV upsert:|nx:, now_ms, epoch, then
     id/due_ms/json/level quadruples (level "" for normal; one shard per call).

Usage: checkout.py HOST PORT NAMESPACE QUEUE SHARDS SCRIPT_PATH ORDERS_JSON
ORDERS_JSON is a list of {"id", "delay_ms", "payload"}. Prints one JSON object:
{"now_ms": N, "codes": {id: code}} (1 created, 2 updated, 0 unchanged).
"""
import json
import socket
import sys

# enqueue.lua's KEYS, in order, after the shard's hash tag "{ns:q:s}:".
ENQUEUE_KEYS = ["due", "payload", "meta", "levels", "dispatched", "tags", "debounce",
                "keyed", "key_ring", "remembered"]


class Redis:
    def __init__(self, host, port):
        self.sock = socket.create_connection((host, port))
        self.buf = self.sock.makefile("rb")

    def call(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            b = a if isinstance(a, bytes) else str(a).encode("utf-8")
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        self.sock.sendall(b"".join(out))
        return self.read()

    def read(self):
        line = self.buf.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.buf.read(n + 2)[:-2]
            return data.decode()
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError("unexpected reply %r" % line)


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for byte in data:
        h ^= byte
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    host, port, ns, queue, shards, script_path, orders_json = sys.argv[1:8]
    shards = int(shards)
    orders = json.loads(orders_json)
    r = Redis(host, int(port))
    stored, epoch = r.call("HMGET", "{%s}:queue:%s" % (ns, queue), "shards", "epoch")
    if stored is None or epoch is None:
        raise SystemExit("queue %s is not registered" % queue)
    if int(stored) != shards:
        raise SystemExit("queue %s has %s shards, not %d" % (queue, stored, shards))
    secs, micros = r.call("TIME")
    now_ms = int(secs) * 1000 + int(micros) // 1000
    with open(script_path, "rb") as f:
        sha = r.call("SCRIPT", "LOAD", f.read())
    by_shard = {}
    for o in orders:
        s = fnv1a64(o["id"].encode("utf-8")) % shards
        by_shard.setdefault(s, []).append(o)
    codes = {}
    for s, batch in sorted(by_shard.items()):
        tag = "{%s:%s:%d}" % (ns, queue, s)
        keys = [tag + ":" + k for k in ENQUEUE_KEYS]
        argv = ["upsert:", now_ms, epoch]
        for o in batch:
            argv += [o["id"], now_ms + int(o["delay_ms"]), json.dumps(o["payload"]), ""]
        reply = r.call("EVALSHA", sha, len(keys), *keys, *argv)
        for o, code in zip(batch, reply):
            codes[o["id"]] = code
    print(json.dumps({"now_ms": now_ms, "codes": codes}))


if __name__ == "__main__":
    main()
