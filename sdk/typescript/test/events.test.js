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

test("schedule into a queue with rules carries the match tokens: an event cancels exactly the matching order", async () => {
  // Refused before the SDK computed the tokens ("this producer does not compute their match tokens").
  const c = await bin("queue", "create", "evp", "--cancel-on", "order.paid:order_id");
  assert.equal(c.code, 0, c.stderr);
  const res = await client.scheduleMany(
    "evp",
    [0, 1, 2].map((i) => ({ id: `p-${i}`, delayMs: 3_600_000, payload: { order_id: 100 + i }, tags: ["customer:7"] })),
  );
  assert.deepEqual(res.map((r) => r.outcome), ["created", "created", "created"]);
  const r = await bin("event", "order.paid", "--data", '{"order_id":101}');
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual([JSON.parse(r.stdout).cancelled, JSON.parse(r.stdout).queues], [1, { evp: 1 }], r.stdout);
  const left = await Promise.all([0, 1, 2].map((i) => client.get("evp", `p-${i}`)));
  assert.deepEqual(left.map((o) => o === null), [false, true, false]);
  assert.deepEqual(left[0].tags, ["customer:7"], "the match token is not shown as a tag");
  // The SDK's own postEvent finds the SDK's tokens too.
  assert.equal((await client.postEvent("order.paid", { order_id: 102 })).cancelled, 1);
  assert.equal(await client.get("evp", "p-2"), null);
  assert.notEqual(await client.get("evp", "p-0"), null);
});

test("event first: schedule of the matching order answers cancelled_by_event", async () => {
  const c = await bin("queue", "create", "evf", "--cancel-on", "order.paid:order_id");
  assert.equal(c.code, 0, c.stderr);
  const e = await bin("event", "order.paid", "--data", '{"order_id":109}');
  assert.equal(e.code, 0, e.stderr);
  const r = await client.schedule("evf", { id: "o-9", delayMs: 3_600_000, payload: { order_id: 109 } });
  assert.deepEqual([r.outcome, r.event], ["cancelled_by_event", "order.paid"]);
  assert.equal(await client.get("evf", "o-9"), null);
  const other = await client.schedule("evf", { id: "o-10", delayMs: 3_600_000, payload: { order_id: 110 } });
  assert.equal(other.outcome, "created");
});

test("changed rules are read again (stale_epoch) and the new tokens sent", async () => {
  const c = await bin("queue", "create", "evc");
  assert.equal(c.code, 0, c.stderr);
  assert.equal((await client.schedule("evc", { id: "a", delayMs: 3_600_000, payload: { order_id: 201 } })).outcome, "created");
  const u = await bin("queue", "create", "evc", "--cancel-on", "order.paid:order_id");
  assert.equal(u.code, 0, u.stderr);
  assert.equal((await client.schedule("evc", { id: "b", delayMs: 3_600_000, payload: { order_id: 202 } })).outcome, "created");
  assert.equal((await client.postEvent("order.paid", { order_id: 202 })).cancelled, 1);
  assert.equal(await client.get("evc", "b"), null);
});

test("an overlong match value is refused naming cancel_on, nothing written", async () => {
  const c = await bin("queue", "create", "evl", "--cancel-on", "order.paid:order_id");
  assert.equal(c.code, 0, c.stderr);
  await assert.rejects(
    client.schedule("evl", { id: "x", delayMs: 1000, payload: { order_id: "x".repeat(300) } }),
    (e) => e instanceof InvalidInputError && e.message.includes("cancel_on"),
  );
  assert.equal(await client.get("evl", "x"), null);
});

test("postEvent honours the rules orders declared for themselves", async () => {
  assert.equal((await bin("queue", "create", "own")).code, 0);
  for (const [id, extra] of [["with", ["--cancel-on", "order.paid:order_id@1m"]], ["without", []]]) {
    const r = await bin("schedule", "own", id, "--in", "1h", "--payload", '{"order_id":9}', ...extra);
    assert.equal(r.code, 0, r.stderr);
  }
  const a = await client.postEvent("order.paid", { order_id: 9 });
  assert.deepEqual([a.cancelled, a.queues], [1, { own: 1 }]);
  assert.equal(await client.get("own", "with"), null);
  assert.notEqual(await client.get("own", "without"), null);
  assert.equal((await client.postEvent("order.paid", { order_id: 10 })).cancelled, 0);
  const out = await bin("schedule", "own", "o-10", "--in", "1h", "--payload", '{"order_id":10}', "--cancel-on", "order.paid:order_id@1m");
  assert.equal(JSON.parse(out.stdout).outcome, "cancelled_by_event");
});

test("an order declares its own rules on schedule", async () => {
  assert.equal((await bin("queue", "create", "mine")).code, 0);
  const cancelOn = [{ event: "order.paid", match: "order_id", rememberMs: 60_000 }];
  assert.equal((await client.schedule("mine", { id: "with", delayMs: 3_600_000, payload: { order_id: 9 }, cancelOn })).outcome, "created");
  await client.schedule("mine", { id: "without", delayMs: 3_600_000, payload: { order_id: 9 } });
  const fields = (await admin.hkeys("{dq}:queue:mine")).filter((f) => f.startsWith("order_rule:"));
  assert.deepEqual(fields, ['order_rule:{"event":"order.paid","match":["order_id"],"remember_ms":60000}']);
  const out = JSON.parse((await bin("event", "order.paid", "--data", '{"order_id":9}')).stdout);
  assert.deepEqual([out.cancelled, out.queues.mine], [1, 1]);
  assert.equal(await client.get("mine", "with"), null);
  assert.notEqual(await client.get("mine", "without"), null);
  // Remembered for the rule: the order scheduled inside its window is refused.
  await bin("event", "order.paid", "--data", '{"order_id":10}');
  const s = await client.schedule("mine", { id: "o-10", delayMs: 3_600_000, payload: { order_id: 10 }, cancelOn });
  assert.deepEqual([s.outcome, s.event], ["cancelled_by_event", "order.paid"]);
});

test("bad order rules are refused naming cancel_on, nothing written", async () => {
  assert.equal((await bin("queue", "create", "mine2")).code, 0);
  const before = await admin.dbsize();
  for (const cancelOn of [
    [{ event: "order.paid" }],
    [{ event: "order.paid", match: [] }],
    [{ event: "order.paid", match: "$.a" }],
    [{ event: "order.paid", match: "items[0]" }],
    [{ event: "", match: "a" }],
    [{ event: "a\nb", match: "a" }],
    [{ event: "a", match: "a", rememberMs: 0 }],
    [{ event: "a", match: "a", other: 1 }],
    [{ event: "a", match: "a" }, { event: "a", match: ["a"] }],
    { event: "a", match: "a" },
  ]) {
    await assert.rejects(
      client.schedule("mine2", { id: "x", delayMs: 1000, payload: { a: 1 }, cancelOn }),
      (e) => e instanceof InvalidInputError && e.code === "invalid_option" && e.message.includes("cancel_on"),
      JSON.stringify(cancelOn),
    );
  }
  assert.equal(await admin.dbsize(), before);
  assert.deepEqual((await admin.hkeys("{dq}:queue:mine2")).filter((f) => f.startsWith("order_rule:")), []);
});
