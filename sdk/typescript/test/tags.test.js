// Tags (issue 43): stored the way the Rust client stores them
// (`"<ms>:[!<expires>!]\x1d<t1>\x1f<t2>\x1d<json>"`, src/engine/tags.rs), read back by `get`,
// kept in the shard's tag index by enqueue.lua and cancel.lua; a refusal names the field and
// writes nothing.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Client, InvalidInputError, shardKeys } from "../dist/index.js";
import { LocalRedis, createQueue } from "./support/harness.js";

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
