// Cancel-on-event (issue 43 item 4) through the TypeScript client: postEvent computes the
// Rust client's match tokens byte for byte, cancels the orders the Rust producer scheduled
// on a queue with cancel_on rules, deduplicates by event id, remembers the event for an
// order scheduled later, and refuses bad events naming the field with nothing written.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Client, InvalidInputError, eventToken } from "../dist/index.js";
import { LocalRedis, delayq } from "./support/harness.js";

let redis;
let client;
let admin;

const bin = (...args) => delayq(["--redis-url", redis.url, ...args]);

before(async () => {
  redis = await LocalRedis.start();
  const r = await bin("queue", "create", "ev", "--cancel-on", "order.paid:order_id");
  assert.equal(r.code, 0, r.stderr);
  client = await Client.connect(redis.url);
  admin = await redis.connect();
});

after(async () => {
  admin?.disconnect();
  await client?.close();
  await redis?.stop();
});

test("postEvent cancels the matching orders once and is remembered", async () => {
  for (let i = 0; i < 3; i++) {
    const r = await bin("schedule", "ev", `o-${i}`, "--in", "1h", "--payload", JSON.stringify({ order_id: i }));
    assert.equal(r.code, 0, r.stderr);
  }
  const a = await client.postEvent("order.paid", { order_id: 1, amount: 5 }, { id: "pay-1" });
  assert.deepEqual([a.cancelled, a.queues, a.duplicate, a.matchedRules], [1, { ev: 1 }, false, 1]);
  const again = await client.postEvent("order.paid", { order_id: 1 }, { id: "pay-1" });
  assert.deepEqual([again.cancelled, again.duplicate], [0, true]);
  const left = await Promise.all([0, 1, 2].map((i) => client.get("ev", `o-${i}`)));
  assert.deepEqual(left.map((o) => o === null), [false, true, false]);
  assert.deepEqual(left[0].tags, [], "the match token is not shown as a tag");
  assert.equal((await client.postEvent("order.paid", { order_id: 7 })).cancelled, 0);
  const r = await bin("schedule", "ev", "o-7", "--in", "1h", "--payload", '{"order_id":7}');
  assert.equal(JSON.parse(r.stdout).outcome, "cancelled_by_event");
});

test("tokens are the Rust client's", () => {
  assert.equal(
    eventToken("order.paid", ["order_id", "customer.id"], { order_id: 1234, customer: { id: "42" } }),
    '\x01order.paid {"order_id":1234,"customer.id":"42"}',
  );
  assert.equal(eventToken("order.paid", ["order_id"], { order_id: null }), null);
  assert.equal(eventToken("order.paid", ["order_id"], { x: 1 }), null);
});

test("bad events name the field and write nothing", async () => {
  const before = await admin.dbsize();
  for (const [name, data, id, field] of [
    ["", {}, undefined, "name"],
    ["a\x07", {}, undefined, "name"],
    ["x".repeat(129), {}, undefined, "name"],
    ["order.paid", [1], undefined, "data"],
    ["order.paid", {}, "", "id"],
  ]) {
    await assert.rejects(client.postEvent(name, data, { id }), (e) => e instanceof InvalidInputError && e.message.includes(field));
  }
  assert.equal(await admin.dbsize(), before);
});
