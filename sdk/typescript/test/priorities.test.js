// Priority levels (issue 26) against a real redis-server: schedule, batches, reschedule, get
// and cancel keep the shard's levels HASH as the Rust client does, and an invalid level is
// refused before anything is sent. (Dispatch into the level's stream by `delayq serve`:
// interop.test.js.)

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Client, InvalidInputError, MAX_BATCH, shardKeys, shardOf } from "../dist/index.js";
import { LocalRedis, createQueue } from "./support/harness.js";

const NOW = 1_800_000_000_000;
let redis;
let client;
let admin;

before(async () => {
  redis = await LocalRedis.start();
  for (const [q, shards] of [["prio", 3], ["move", 2], ["mix", 4], ["bad", 2]]) await createQueue(redis.url, q, shards);
  client = await Client.connect(redis.url, { clock: () => NOW });
  admin = await redis.connect();
});

after(async () => {
  admin?.disconnect();
  await client?.close();
  await redis?.stop();
});

/** Every entry of the queue's levels HASHes, as { id: level }. */
async function levels(queue, shards) {
  const out = {};
  for (let s = 0; s < shards; s++) Object.assign(out, await admin.hgetall(shardKeys("dq", queue, s).levels));
  return out;
}

async function commandsProcessed() {
  const info = await admin.info("stats");
  return Number(/^total_commands_processed:(\d+)/m.exec(info)[1]);
}

test("scheduled at high, get reads high, and the levels HASH holds it", { timeout: 90_000 }, async () => {
  const vip = await client.schedule("prio", { id: "vip", delayMs: 60_000, payload: { v: 1 }, priority: "high" });
  assert.equal(vip.outcome, "created");
  await client.schedule("prio", { id: "plain", delayMs: 60_000, payload: { v: 2 } });
  await client.schedule("prio", { id: "slow", delayMs: 60_000, priority: "low" });
  await client.schedule("prio", { id: "explicit", delayMs: 60_000, priority: "normal" });
  const got = await client.get("prio", "vip");
  assert.equal(got.priority, "high");
  assert.equal(got.dueAtMs, NOW + 60_000);
  assert.deepEqual(got.payload, { v: 1 });
  assert.equal((await client.get("prio", "plain")).priority, "normal");
  assert.equal((await client.get("prio", "slow")).priority, "low");
  assert.equal((await client.get("prio", "explicit")).priority, "normal");
  // The engine's layout: only the orders that are not normal, each in its shard's HASH.
  assert.deepEqual(await levels("prio", 3), { vip: "high", slow: "low" });
  assert.equal(await admin.hget(shardKeys("dq", "prio", shardOf("vip", 3)).levels, "vip"), "high");
});

test("reschedule changes the level, or keeps it", { timeout: 90_000 }, async () => {
  await client.schedule("move", { id: "a", delayMs: 60_000, payload: { x: 1 }, priority: "high" });
  assert.equal(await client.reschedule("move", "a", { delayMs: 90_000 }, { priority: "low" }), "rescheduled");
  let got = await client.get("move", "a");
  assert.deepEqual([got.priority, got.dueAtMs, got.payloadJson], ["low", NOW + 90_000, '{"x":1}']);
  assert.equal(await client.reschedule("move", "a", { delayMs: 5_000 }), "rescheduled");
  got = await client.get("move", "a");
  assert.deepEqual([got.priority, got.dueAtMs], ["low", NOW + 5_000]);
  assert.equal(await client.reschedule("move", "a", { delayMs: 5_000 }, { priority: "normal" }), "rescheduled");
  assert.equal((await client.get("move", "a")).priority, "normal");
  assert.deepEqual(await levels("move", 2), {});
  // Not scheduled: not found, and no level is written for it.
  assert.equal(await client.reschedule("move", "ghost", { delayMs: 1 }, { priority: "high" }), "not_found");
  assert.deepEqual(await levels("move", 2), {});
});

test("batches, upserts, if_absent and cancel keep the levels HASH right", { timeout: 90_000 }, async () => {
  const given = ["high", "normal", "low", undefined, "high"];
  const ids = given.map((_, i) => `m-${i}`);
  const out = await client.scheduleMany("mix", ids.map((id, i) => ({ id, delayMs: 60_000, priority: given[i] })));
  assert.ok(out.every((r) => r.outcome === "created"));
  const read = [];
  for (const id of ids) read.push((await client.get("mix", id)).priority);
  assert.deepEqual(read, ["high", "normal", "low", "normal", "high"]);
  assert.deepEqual(await levels("mix", 4), { "m-0": "high", "m-2": "low", "m-4": "high" });
  // if_absent leaves a known order's level; an upsert sets it again (absent: normal).
  assert.equal((await client.schedule("mix", { id: "m-2", delayMs: 1_000, priority: "high" }, { mode: "if_absent" })).outcome, "unchanged");
  assert.equal((await client.get("mix", "m-2")).priority, "low");
  assert.equal((await client.schedule("mix", { id: "m-0", delayMs: 1_000 })).outcome, "updated");
  assert.equal((await client.get("mix", "m-0")).priority, "normal");
  assert.equal((await client.schedule("mix", { id: "m-1", delayMs: 1_000, priority: "low" })).outcome, "updated");
  assert.equal((await client.get("mix", "m-1")).priority, "low");
  // Cancel removes the level with the order.
  assert.equal(await client.cancel("mix", "m-4"), "cancelled");
  assert.deepEqual(await levels("mix", 4), { "m-1": "low", "m-2": "low" });
  // A level the engine does not know (another writer's) reads as normal.
  await admin.hset(shardKeys("dq", "mix", shardOf("m-3", 4)).levels, "m-3", "urgent");
  assert.equal((await client.get("mix", "m-3")).priority, "normal");
});

test("an invalid level is refused with invalid_priority before anything is sent", { timeout: 90_000 }, async () => {
  await client.schedule("bad", { id: "known", delayMs: 60_000, priority: "low" });
  const keys = (await admin.keys("{dq:bad:*")).sort();
  const before = await commandsProcessed();
  for (const bad of ["urgent", "", "HIGH", " high", "high\n", 1, true]) {
    const reason =
      typeof bad === "string"
        ? `invalid priority: ${JSON.stringify(bad)} is not high, normal or low`
        : `invalid priority: must be a string (high, normal or low), got ${typeof bad}`;
    const calls = [
      [() => client.schedule("bad", { id: "o-1", delayMs: 1_000, priority: bad }), undefined],
      [() => client.scheduleMany("bad", [{ id: "o-2", delayMs: 1_000 }, { id: "o-3", delayMs: 1_000, priority: bad }]), 1],
      [() => client.reschedule("bad", "known", { delayMs: 1_000 }, { priority: bad }), undefined],
    ];
    for (const [call, index] of calls) {
      await assert.rejects(call(), (e) => {
        assert.ok(e instanceof InvalidInputError, String(e));
        assert.equal(e.code, "invalid_priority");
        assert.equal(e.index, index);
        assert.equal(e.reason, reason);
        assert.equal(e.message, index === undefined ? reason : `message ${index}: ${reason}`);
        return true;
      });
    }
  }
  // Nothing reached Redis (only the two INFOs of this test), nothing changed.
  assert.equal(await commandsProcessed(), before + 1);
  assert.deepEqual((await admin.keys("{dq:bad:*")).sort(), keys);
  assert.equal((await client.get("bad", "known")).priority, "low");
  assert.equal(await client.get("bad", "o-1"), null);
  assert.equal(await client.get("bad", "o-2"), null);
});

test("the level is checked before the batch size and the queue name", { timeout: 90_000 }, async () => {
  const tooMany = Array.from({ length: MAX_BATCH }, (_, i) => ({ id: `o${i}`, delayMs: 1 }));
  tooMany.push({ id: "last", delayMs: 1, priority: "urgent" });
  await assert.rejects(client.scheduleMany("q", tooMany), (e) => e.code === "invalid_priority" && e.index === MAX_BATCH);
  await assert.rejects(client.schedule("a b", { id: "", delayMs: -1, priority: "HIGH" }), (e) => e.code === "invalid_priority" && e.index === undefined);
  await assert.rejects(client.reschedule("a b", "", { delayMs: -1 }, { priority: "" }), { code: "invalid_priority" });
  // The payload's text comes first (tests/conformance/README.md, check 1).
  await assert.rejects(client.schedule("prio", { id: "x", delayMs: 1, payloadJson: "{", priority: "urgent" }), { code: "invalid_payload" });
});
