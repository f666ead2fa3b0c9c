// Tags (issue 43): stored the way the Rust client stores them
// (`"<ms>:[!<expires>!]\x1d<t1>\x1f<t2>\x1d<json>"`, src/engine/tags.rs), read back by `get`,
// kept in the shard's tag index by enqueue.lua and cancel.lua; a refusal names the field and
// writes nothing.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Client, InvalidInputError, shardKeys } from "../dist/index.js";
import { LocalRedis, createQueue, delayq } from "./support/harness.js";

const NOW = 1_800_000_000_000;
let redis;
let client;
let admin;

before(async () => {
  redis = await LocalRedis.start();
  await createQueue(redis.url, "tg", 1);
  client = await Client.connect(redis.url, { clock: () => NOW });
  admin = await redis.connect();
});

after(async () => {
  admin?.disconnect();
  await client?.close();
  await redis?.stop();
});

const index = async () => (await admin.zrange(shardKeys("dq", "tg", 0).tags, 0, -1)).sort();

test("tags are stored, read back, indexed, and leave the index on cancel", { timeout: 90_000 }, async () => {
  await client.schedule("tg", { id: "a", delayMs: 60_000, payload: [1], tags: ["order:1", "customer:42"], expiresAfterMs: 1500 });
  await client.scheduleMany("tg", [
    { id: "b", delayMs: 60_000, tags: ["customer:42"] },
    { id: "c", delayMs: 0 },
  ]);
  const raw = await admin.hgetall(shardKeys("dq", "tg", 0).payload);
  assert.equal(raw.a, `${NOW}:!1500!\x1dorder:1\x1fcustomer:42\x1d[1]`);
  assert.equal(raw.c, `${NOW}:null`, "no tags: the bytes every order always had");
  const got = await client.get("tg", "a");
  assert.deepEqual(got.tags, ["order:1", "customer:42"]);
  assert.deepEqual((await client.get("tg", "c")).tags, []);
  assert.deepEqual(await index(), ["customer:42\x1fa", "customer:42\x1fb", "order:1\x1fa"]);
  assert.equal(await client.cancel("tg", "a"), "cancelled");
  assert.deepEqual(await index(), ["customer:42\x1fb"]);
  await client.schedule("tg", { id: "b", delayMs: 60_000, tags: ["x"] });
  assert.deepEqual(await index(), ["x\x1fb"]);
});

test("cancelTag cancels exactly the tagged orders of a queue, and again answers 0", { timeout: 90_000 }, async () => {
  const orders = Array.from({ length: 500 }, (_, i) => ({ id: `c-${i}`, delayMs: 60_000, tags: i % 2 === 0 ? ["customer:7", `order:${i}`] : [`order:${i}`] }));
  await client.scheduleMany("tg", orders);
  assert.equal(await client.cancelTag("tg", "customer:7"), 250);
  assert.equal(await client.cancelTag("tg", "customer:7"), 0);
  for (const i of [0, 1, 2, 499]) assert.equal((await client.get("tg", `c-${i}`)) === null, i % 2 === 0, `c-${i}`);
  assert.deepEqual((await index()).filter((m) => m.startsWith("order:0\x1f")), []);
  await assert.rejects(client.cancelTag("tg", ""), InvalidInputError);
});

test("bad tags are refused naming the field, nothing written", { timeout: 90_000 }, async () => {
  const before = await admin.dbsize();
  for (const tags of [[""], ["a", "a"], ["x".repeat(129)], ["a\x07"], Array.from({ length: 11 }, (_, i) => `t${i}`), "abc", [1]]) {
    await assert.rejects(client.schedule("tg", { id: "x", delayMs: 0, tags }), (e) => {
      assert.ok(e instanceof InvalidInputError);
      assert.equal(e.code, "invalid_option");
      assert.match(e.message, /tags/);
      return true;
    });
  }
  assert.equal(await admin.dbsize(), before);
});

test("cancellations by id, tag and event are recorded in the order history", { timeout: 90_000 }, async () => {
  const r = await delayq(["--redis-url", redis.url, "queue", "create", "hq", "--cancel-on", "order.paid:order_id"]);
  assert.equal(r.code, 0, r.stderr);
  const live = await Client.connect(redis.url);
  try {
    await live.schedule("hq", { id: "by-id", delayMs: 600_000, payload: { order_id: 1 } });
    await live.schedule("hq", { id: "by-tag", delayMs: 600_000, payload: { order_id: 2 }, tags: ["customer:7"] });
    await live.schedule("hq", { id: "by-event", delayMs: 600_000, payload: { order_id: 3 } });
    const start = live.nowMs();
    assert.equal(await live.cancel("hq", "by-id"), "cancelled");
    assert.equal(await live.cancelTag("hq", "customer:7"), 1);
    assert.equal((await live.postEvent("order.paid", { order_id: 3 }, { id: "pay-3" })).cancelled, 1);
    const expect = {
      "by-id": { reason: "id" },
      "by-tag": { reason: "tag", tag: "customer:7" },
      "by-event": { reason: "event", event: "order.paid", event_id: "pay-3" },
    };
    for (const [id, reason] of Object.entries(expect)) {
      const g = await delayq(["--redis-url", redis.url, "get", "hq", id]);
      assert.equal(g.code, 0, `${id}: ${g.stdout} ${g.stderr}`);
      const got = JSON.parse(g.stdout);
      assert.equal(got.state, "cancelled");
      const { at_ms: at, ...rest } = got.cancelled;
      assert.ok(at >= start - 1000, `${at} >= ${start}`);
      assert.deepEqual(rest, reason);
    }
  } finally {
    await live.close();
  }
});
