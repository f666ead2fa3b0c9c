// The producer against a real redis-server: outcomes of upsert and if-absent, payload forms,
// batching (500 orders and 1 MiB per enqueue.lua call, one shard per call), undeclared and
// deleted queues, a queue created again (stale epoch), NOSCRIPT after SCRIPT FLUSH.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import {
  Client,
  InvalidInputError,
  JsonText,
  QueueNotFoundError,
  SCRIPTS,
  jsonText,
  shardKeys,
  shardOf,
} from "../dist/index.js";
import { LocalRedis, createQueue, delayq } from "./support/harness.js";

let redis;
let client;
let admin;

before(async () => {
  redis = await LocalRedis.start();
  await createQueue(redis.url, "orders", 4);
  await createQueue(redis.url, "one", 1);
  client = await Client.connect(redis.url);
  admin = await redis.connect();
});

after(async () => {
  admin?.disconnect();
  await client?.close();
  await redis?.stop();
});

async function calls(cmd) {
  const info = await admin.info("commandstats");
  const m = new RegExp(`^cmdstat_${cmd}:calls=(\\d+)`, "m").exec(info);
  return m ? Number(m[1]) : 0;
}

test("upsert and if-absent outcomes", { timeout: 90_000 }, async () => {
  const a = await client.schedule("orders", { id: "o-1", delayMs: 60_000, payloadJson: '{"v":1}' });
  assert.equal(a.outcome, "created");
  const b = await client.schedule("orders", { id: "o-1", delayMs: 120_000, payloadJson: '{"v":2}' }, { mode: "if_absent" });
  assert.equal(b.outcome, "unchanged");
  let got = await client.get("orders", "o-1");
  assert.equal(got.payloadJson, '{"v":1}');
  assert.equal(got.dueAtMs, a.dueAtMs);
  const c = await client.schedule("orders", { id: "o-1", delayMs: 120_000, payloadJson: '{"v":3}' });
  assert.equal(c.outcome, "updated");
  got = await client.get("orders", "o-1");
  assert.equal(got.payloadJson, '{"v":3}');
  assert.equal(got.dueAtMs, c.dueAtMs);
  // A batch with an id twice applies them in order.
  const many = await client.scheduleMany("orders", [
    { id: "dup", delayMs: 1000, payload: 1 },
    { id: "dup", delayMs: 2000, payload: 2 },
  ]);
  assert.deepEqual(many.map((r) => r.outcome), ["created", "updated"]);
  assert.equal((await client.get("orders", "dup")).payloadJson, "2");
  const nx = await client.scheduleMany("orders", [{ id: "dup", delayMs: 5, payload: 3 }, { id: "new-nx", delayMs: 5 }], { mode: "if_absent" });
  assert.deepEqual(nx.map((r) => r.outcome), ["unchanged", "created"]);
  assert.equal((await client.get("orders", "new-nx")).payloadJson, "null");
});

test("cancel, reschedule and get", { timeout: 90_000 }, async () => {
  await client.schedule("orders", { id: "c-1", delayMs: 60_000, payload: { a: 1 } });
  const before = await client.get("orders", "c-1");
  assert.equal(await client.reschedule("orders", "c-1", { delayMs: 90_000 }), "rescheduled");
  const moved = await client.get("orders", "c-1");
  assert.ok(moved.dueAtMs >= before.dueAtMs + 29_000);
  assert.equal(moved.payloadJson, '{"a":1}');
  assert.equal(await client.reschedule("orders", "c-1", { at: new Date(moved.dueAtMs + 5) }), "rescheduled");
  assert.equal((await client.get("orders", "c-1")).dueAtMs, moved.dueAtMs + 5);
  assert.equal(await client.cancel("orders", "c-1"), "cancelled");
  assert.equal(await client.cancel("orders", "c-1"), "not_found");
  assert.equal(await client.get("orders", "c-1"), null);
  assert.equal(await client.reschedule("orders", "c-1", { delayMs: 1 }), "not_found");
  // Both keys are gone (cancel removes schedule and payload together).
  const k = shardKeys("dq", "orders", shardOf("c-1", 4));
  assert.equal(await admin.zscore(k.due, "c-1"), null);
  assert.equal(await admin.hget(k.payload, "c-1"), null);
});

test("payloads: JSON text byte for byte, JS values with bigints, nested JsonText", { timeout: 90_000 }, async () => {
  const text = ' {"n": 123456789012345678901234567890, "d":0.1000000000000000055511151231257827, "s":"заказ ✓ 🎉"} ';
  await client.schedule("orders", { id: "p-1", delayMs: 60_000, payloadJson: text });
  assert.equal((await client.get("orders", "p-1")).payloadJson, text);
  await client.schedule("orders", { id: "p-2", delayMs: 60_000, payload: jsonText(text) });
  assert.equal((await client.get("orders", "p-2")).payloadJson, text);
  await client.schedule("orders", {
    id: "p-3",
    delayMs: 60_000,
    payload: { amount: 123456789012345678901234567890n, name: "Zoë ✓", raw: new JsonText("[1.50]"), skip: undefined, at: new Date(0) },
  });
  const got = await client.get("orders", "p-3");
  assert.equal(got.payloadJson, '{"amount":123456789012345678901234567890,"name":"Zoë ✓","raw":[1.50],"at":"1970-01-01T00:00:00.000Z"}');
  // The stored value is "<enqueued_ms>:<payload JSON text>".
  const k = shardKeys("dq", "orders", shardOf("p-3", 4));
  assert.equal(await admin.hget(k.payload, "p-3"), `${got.enqueuedAtMs}:${got.payloadJson}`);
  assert.equal(await admin.zscore(k.due, "p-3"), String(got.dueAtMs));
  // Refused forms.
  const circular = {};
  circular.self = circular;
  await assert.rejects(client.schedule("orders", { id: "p-4", delayMs: 1, payload: circular }), { code: "invalid_payload" });
  await assert.rejects(client.schedule("orders", { id: "p-4", delayMs: 1, payloadJson: "{" }), { code: "invalid_payload" });
  await assert.rejects(client.schedule("orders", { id: "p-4", delayMs: 1, payload: { a: jsonText("nope") } }), { code: "invalid_payload" });
  await assert.rejects(client.schedule("orders", { id: "p-4", delayMs: 1, payload: 1, payloadJson: "1" }), { code: "invalid_payload" });
  await assert.rejects(client.schedule("orders", { id: "p-4", delayMs: 1, at: 5 }), { code: "invalid_due_time" });
  await assert.rejects(client.schedule("orders", { id: "p-4" }), { code: "invalid_due_time" });
  await assert.rejects(client.schedule("orders", { id: "p-4", delayMs: 1.5 }), { code: "invalid_delay" });
  await assert.rejects(client.schedule("orders", { id: "p-4", at: "2026-11-22T10:30:00" }), { code: "invalid_due_time" });
  await assert.rejects(client.schedule("orders", { id: "p-4", at: "1795000000" }), { code: "invalid_due_time" });
  await assert.rejects(client.schedule("orders", { id: "p-4", delayMs: 1 }, { mode: "nx" }), { code: "invalid_option" });
  // Absolute times as text.
  const now = client.nowMs();
  const iso = new Date(now + 3_600_000).toISOString().replace("Z", "+00:00");
  const r = await client.schedule("orders", { id: "p-5", at: iso });
  assert.equal(r.dueAtMs, Date.parse(iso));
  const r2 = await client.schedule("orders", { id: "p-6", at: String(now + 1000) });
  assert.equal(r2.dueAtMs, now + 1000);
  assert.equal(await calls("evalsha") > 0, true);
});

test("a batch of 5,000 goes out in calls of at most 500 orders, one shard per call", { timeout: 90_000 }, async () => {
  const orders = Array.from({ length: 5000 }, (_, i) => ({ id: `bulk-${i}`, delayMs: 600_000, payload: { i } }));
  const perShard = [0, 0, 0, 0];
  for (const o of orders) perShard[shardOf(o.id, 4)]++;
  const expectedCalls = perShard.reduce((n, c) => n + Math.ceil(c / 500), 0);
  const before = await calls("evalsha");
  const out = await client.scheduleMany("orders", orders);
  assert.equal(await calls("evalsha") - before, expectedCalls);
  assert.equal(out.length, 5000);
  assert.ok(out.every((r, i) => r.outcome === "created" && r.id === `bulk-${i}`));
  let total = 0;
  for (let s = 0; s < 4; s++) {
    const k = shardKeys("dq", "orders", s);
    const ids = await admin.zrange(k.due, 0, -1);
    const bulk = ids.filter((id) => id.startsWith("bulk-"));
    assert.equal(bulk.length, perShard[s]);
    assert.ok(bulk.every((id) => shardOf(id, 4) === s), "an order in another shard's keys");
    total += bulk.length;
  }
  assert.equal(total, 5000);
  const again = await client.scheduleMany("orders", orders, { mode: "if_absent" });
  assert.ok(again.every((r) => r.outcome === "unchanged"));
  const upsert = await client.scheduleMany("orders", orders);
  assert.ok(upsert.every((r) => r.outcome === "updated"));
  // Refused as a whole: one bad order, nothing written.
  const bad = [...orders.slice(0, 10), { id: "", delayMs: 1 }];
  await assert.rejects(client.scheduleMany("orders", bad), (e) => e instanceof InvalidInputError && e.code === "invalid_id" && e.index === 10);
});

test("a batch is cut at 1 MiB of payloads per call", { timeout: 90_000 }, async () => {
  const big = JSON.stringify("x".repeat(60_000));
  const orders = Array.from({ length: 40 }, (_, i) => ({ id: `mib-${i}`, delayMs: 600_000, payloadJson: big }));
  const before = await calls("evalsha");
  const out = await client.scheduleMany("one", orders);
  // 17 payloads of 60,002 bytes fit in 1 MiB: 40 orders take 3 calls.
  assert.equal(await calls("evalsha") - before, 3);
  assert.ok(out.every((r) => r.outcome === "created"));
});

test("an undeclared queue is refused and nothing is written", { timeout: 90_000 }, async () => {
  const keys = await admin.dbsize();
  for (const call of [
    () => client.schedule("nope", { id: "x", delayMs: 1 }),
    () => client.scheduleMany("nope", []),
    () => client.cancel("nope", "x"),
    () => client.get("nope", "x"),
    () => client.reschedule("nope", "x", { delayMs: 1 }),
  ]) {
    await assert.rejects(call(), (e) => e instanceof QueueNotFoundError && e.code === "queue_not_found" && e.queue === "nope");
  }
  assert.equal(await admin.dbsize(), keys);
  assert.deepEqual(await admin.keys("{dq:nope:*"), []);
});

test("a deleted queue takes nothing, even from a client that knew it; created again, it does", { timeout: 90_000 }, async () => {
  await createQueue(redis.url, "gone", 2);
  const c = await Client.connect(redis.url);
  const cached = await Client.connect(redis.url);
  const r2 = async () => (await delayq(["--redis-url", redis.url, "queue", "delete", "gone", "--force"])).code;
  try {
    assert.equal((await c.schedule("gone", { id: "g-1", delayMs: 600_000 })).outcome, "created");
    assert.equal(await cached.get("gone", "g-0"), null); // reads (and caches) the record
    const r = await delayq(["--redis-url", redis.url, "queue", "delete", "gone", "--force"]);
    assert.equal(r.code, 0, r.stderr);
    // The client still has the record cached: the script refuses the write.
    await assert.rejects(c.schedule("gone", { id: "g-2", delayMs: 600_000 }), (e) => e instanceof QueueNotFoundError);
    assert.deepEqual(await admin.keys("{dq:gone:*"), []);
    // Created again (a new epoch) with another shard count: a client with the old record
    // cached gets stale_epoch, reads the record again and writes into the new queue.
    await createQueue(redis.url, "gone", 3);
    assert.equal((await cached.schedule("gone", { id: "g-3", delayMs: 600_000 })).outcome, "created");
    assert.notEqual(await admin.zscore(shardKeys("dq", "gone", shardOf("g-3", 3)).due, "g-3"), null);
    assert.equal((await cached.get("gone", "g-3")).id, "g-3");
    assert.equal((await c.schedule("gone", { id: "g-4", delayMs: 600_000 })).outcome, "created");
    assert.notEqual(await admin.zscore(shardKeys("dq", "gone", shardOf("g-4", 3)).due, "g-4"), null);
    // Deleted and created again with fewer shards: the cached view's extra shards have no
    // epoch (queue_not_found), the others another one (stale_epoch); every call refused, the
    // record is read again and the whole batch goes to the new shards.
    assert.equal(await r2(), 0);
    await createQueue(redis.url, "gone", 1);
    const out = await cached.scheduleMany("gone", Array.from({ length: 30 }, (_, i) => ({ id: `h-${i}`, delayMs: 600_000 })));
    assert.ok(out.every((x) => x.outcome === "created"));
    assert.equal(await admin.zcard(shardKeys("dq", "gone", 0).due), 30);
    assert.deepEqual(await admin.keys("{dq:gone:1}*"), []);
  } finally {
    await c.close();
    await cached.close();
  }
});

test("a queue being deleted (its shards fenced, its record still there) takes nothing", { timeout: 90_000 }, async () => {
  await createQueue(redis.url, "fenced", 2);
  const c = await Client.connect(redis.url);
  try {
    await admin.del(shardKeys("dq", "fenced", 0).meta, shardKeys("dq", "fenced", 1).meta);
    await assert.rejects(c.scheduleMany("fenced", [{ id: "a", delayMs: 1 }, { id: "b", delayMs: 1 }]), (e) => e instanceof QueueNotFoundError);
    assert.deepEqual((await admin.keys("{dq:fenced:*")).sort(), []);
  } finally {
    await c.close();
  }
});

test("a stale epoch is re-read and the batch retried once", { timeout: 90_000 }, async () => {
  await createQueue(redis.url, "epochs", 2);
  const c = await Client.connect(redis.url);
  try {
    await c.get("epochs", "x"); // caches the record
    // Another process deleted the queue and created it again: new epoch everywhere.
    const rec = "{dq}:queue:epochs";
    await admin.hset(rec, "epoch", "new-epoch");
    for (let s = 0; s < 2; s++) await admin.hset(shardKeys("dq", "epochs", s).meta, "epoch", "new-epoch");
    const out = await c.scheduleMany("epochs", Array.from({ length: 20 }, (_, i) => ({ id: `e-${i}`, delayMs: 600_000 })));
    assert.ok(out.every((r) => r.outcome === "created"));
    // A shard still carrying an old epoch (a create in progress) is refused after one retry,
    // and nothing is written there.
    await admin.hset(shardKeys("dq", "epochs", 0).meta, "epoch", "other");
    const c2 = await Client.connect(redis.url);
    const ids = Array.from({ length: 20 }, (_, i) => `f-${i}`);
    await assert.rejects(c2.scheduleMany("epochs", ids.map((id) => ({ id, delayMs: 600_000 }))), (e) => {
      assert.equal(e.code, "partial_write");
      for (const r of e.results) {
        assert.equal(r.outcome, shardOf(r.id, 2) === 0 ? "not_written" : "created");
      }
      return true;
    });
    await c2.close();
  } finally {
    await c.close();
  }
});

test("NOSCRIPT (Redis restarted or SCRIPT FLUSH) loads the scripts again", { timeout: 90_000 }, async () => {
  await admin.script("FLUSH");
  assert.equal((await admin.script("EXISTS", SCRIPTS.enqueue.sha))[0], 0);
  const out = await client.scheduleMany("orders", [{ id: "ns-1", delayMs: 600_000 }, { id: "ns-2", delayMs: 600_000 }]);
  assert.deepEqual(out.map((r) => r.outcome), ["created", "created"]);
  await admin.script("FLUSH");
  assert.equal((await client.get("orders", "ns-1")).payloadJson, "null");
  await admin.script("FLUSH");
  assert.equal(await client.cancel("orders", "ns-1"), "cancelled");
  await admin.script("FLUSH");
  assert.equal(await client.reschedule("orders", "ns-2", { delayMs: 5 }), "rescheduled");
  assert.equal((await admin.script("EXISTS", SCRIPTS.reschedule.sha))[0], 1);
});

test("connection errors carry no secrets", { timeout: 90_000 }, async () => {
  const secret = "s3cr3t-pa55";
  await assert.rejects(Client.connect(`redis://user:${secret}@127.0.0.1:1`, { connectTimeoutMs: 500 }), (e) => {
    assert.ok(!e.message.includes(secret), e.message);
    assert.ok(!String(e.stack).includes(secret));
    return e.code === "redis_unavailable" || e.code === "outcome_unknown";
  });
  await assert.rejects(Client.connect(`http://user:${secret}@h`), (e) => e.code === "invalid_redis_url" && !e.message.includes(secret));
  await assert.rejects(Client.connect(redis.url, { namespace: "a:b" }), { code: "invalid_namespace" });
  await assert.rejects(Client.connect(redis.url, { durability: { replicas: 0, timeoutMs: 5 } }), { code: "invalid_option" });
});
