// A Redis Cluster (three masters on free ports, `redis-cli --cluster create`): the client
// follows the slots, every call's keys share one hash tag, the Rust CLI sees the orders.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { after, before, test } from "node:test";
import { Client, NotReplicatedError, shardOf } from "../dist/index.js";
import { LocalRedis, createQueue, delayq, freePort, waitFor } from "./support/harness.js";

let nodes = [];
let url;
let client;

before(async () => {
  for (let i = 0; i < 3; i++) {
    nodes.push(
      await LocalRedis.start([
        "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
        "--cluster-node-timeout", "2000", "--cluster-port", String(await freePort()),
      ]),
    );
  }
  const addrs = nodes.map((n) => `127.0.0.1:${n.port}`);
  await new Promise((resolve, reject) =>
    execFile("redis-cli", ["--cluster", "create", ...addrs, "--cluster-replicas", "0", "--cluster-yes"], { timeout: 60_000 }, (err, out, errOut) =>
      err ? reject(new Error(`cluster create failed: ${out}${errOut}`)) : resolve(),
    ),
  );
  await waitFor("the cluster to be ok on every node", async () => {
    for (const n of nodes) {
      if (!/cluster_state:ok/.test(await n.cmd("CLUSTER", "INFO"))) return false;
    }
    return true;
  }, 30_000, 50);
  url = `redis+cluster://${addrs.join(",")}`;
  await createQueue(url, "clustered", 8);
  client = await Client.connect(url);
});

after(async () => {
  await client?.close();
  for (const n of nodes) await n.stop();
});

test("cluster: schedule, get, reschedule and cancel across every shard", { timeout: 90_000 }, async () => {
  assert.equal(client.isCluster, true);
  const ids = Array.from({ length: 3000 }, (_, i) => `c-${i}`);
  const out = await client.scheduleMany("clustered", ids.map((id) => ({ id, delayMs: 600_000, payload: { id } })));
  assert.ok(out.every((r) => r.outcome === "created"));
  assert.equal(new Set(ids.map((id) => shardOf(id, 8))).size, 8);
  // Spread over the masters.
  let total = 0;
  const holders = new Set();
  for (const n of nodes) {
    for (let s = 0; s < 8; s++) {
      const c = await n.cmd("ZCARD", `{dq:clustered:${s}}:due`).catch(() => 0);
      if (c > 0) holders.add(n.port);
      total += c;
    }
  }
  assert.equal(total, 3000);
  assert.ok(holders.size >= 2, "every shard on one node");
  const again = await client.scheduleMany("clustered", ids.slice(0, 700).map((id) => ({ id, delayMs: 5 })), { mode: "if_absent" });
  assert.ok(again.every((r) => r.outcome === "unchanged"));
  assert.equal((await client.get("clustered", "c-7")).payloadJson, '{"id":"c-7"}');
  assert.equal(await client.reschedule("clustered", "c-7", { delayMs: 900_000 }), "rescheduled");
  assert.equal(await client.cancel("clustered", "c-7"), "cancelled");
  assert.equal(await client.get("clustered", "c-7"), null);
  // The Rust side finds them.
  const r = await delayq(["--redis-url", url, "get", "clustered", "c-8"]);
  assert.equal(r.code, 0, r.stderr);
  assert.ok(r.stdout.includes("c-8"));
  // The cancelled one: its history says so (issue 43), recorded in its shard's slot.
  const gone = await delayq(["--redis-url", url, "get", "clustered", "c-7"]);
  assert.equal(gone.code, 0, gone.stderr);
  assert.equal(JSON.parse(gone.stdout).state, "cancelled");
});

test("cluster: durable writes send WAIT to each shard's node (no replicas: not replicated)", { timeout: 90_000 }, async () => {
  const d = client.withDurability({ replicas: 1, timeoutMs: 50 });
  await assert.rejects(
    d.scheduleMany("clustered", Array.from({ length: 40 }, (_, i) => ({ id: `w-${i}`, delayMs: 600_000 }))),
    (e) => e instanceof NotReplicatedError && e.acked === 0 && e.wanted === 1,
  );
  // Written on the leaders all the same.
  assert.ok(await client.get("clustered", "w-3"));
});

test("cluster: an undeclared queue is refused", { timeout: 90_000 }, async () => {
  await assert.rejects(client.schedule("nope", { id: "x", delayMs: 1 }), { code: "queue_not_found" });
});
