// The Consumer class against a real `delayq serve` (HTTP pull): receive and ack empty the
// group, a throwing handler is nacked and retried, an expired lease is LeaseLostError, and
// the token never shows in an error.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Client, Consumer, ConsumerApiError, DelayqError, LeaseLostError } from "../dist/index.js";
import { parseDeliveries } from "../dist/consumer.js";
import { LocalRedis, Serve, createQueue, waitFor } from "./support/harness.js";

const TOKEN = "s3cret-consumer-token-0123456789";
let redis;
let serve;
let client;

before(async () => {
  redis = await LocalRedis.start();
  for (const q of ["pull-ack", "pull-retry", "pull-lease", "pull-dead", "pull-exact", "pull-long", "pull-wait", "pull-grace", "pull-batch"]) await createQueue(redis.url, q);
  serve = await Serve.start(`
redis_url = "${redis.url}"
namespace = "dq"
[http]
listen = "127.0.0.1:{port}"
tokens = ["${TOKEN}"]
`);
  client = await Client.connect(redis.url);
});

after(async () => {
  await client?.close();
  await serve?.stop();
  await redis?.stop();
});

function consumer(queue, extra = {}) {
  return new Consumer({ baseUrl: serve.base, token: TOKEN, queue, group: "close", ...extra });
}

/** Receives until `n` deliveries came (orders become due through the dispatcher). */
async function receiveAll(c, n, max = 10) {
  const got = [];
  await waitFor(`${n} deliveries`, async () => {
    got.push(...(await c.receive(max)));
    return got.length >= n;
  });
  return got;
}

/** The group's pending entries on the queue's one shard, over its three priority lanes. */
async function pending(queue) {
  let n = 0;
  for (const lane of ["", "high:", "low:"]) {
    const key = `{dq:${queue}:0}:${lane}stream`;
    if ((await redis.cmd("EXISTS", key)) === 0) continue;
    const r = await redis.cmd("XPENDING", key, "close").catch(() => [0]);
    n += Number(r[0]);
  }
  return n;
}

test("receive then ack: payload, attempt 1, and the group is left empty", async () => {
  const c = consumer("pull-ack");
  assert.deepEqual(await c.receive(10), []); // joins the group before anything is due
  const text = '{"n":12,"s":"заказ ✓"}'; // canonical: see the todo test below
  await client.schedule("pull-ack", { id: "a", delayMs: 0, payloadJson: text });
  await client.schedule("pull-ack", { id: "b", delayMs: 0, payload: { user: 42 }, priority: "high" });
  const got = await receiveAll(c, 2);
  assert.equal(got.length, 2);
  const a = got.find((d) => d.id === "a");
  const b = got.find((d) => d.id === "b");
  assert.equal(a.payloadJson, text);
  assert.equal(a.payload.s, "заказ ✓");
  assert.deepEqual(b.payload, { user: 42 });
  assert.equal(b.priority, "high");
  for (const d of got) {
    assert.equal(d.attempt, 1);
    assert.equal(typeof d.receipt, "string");
    assert.ok(d.leaseUntilMs > d.dispatchedAtMs, JSON.stringify(d));
    assert.ok(d.dueAtMs > 0);
  }
  assert.equal(await pending("pull-ack"), 2);
  assert.deepEqual(await c.ack(got), ["acked", "acked"]);
  assert.equal(await pending("pull-ack"), 0);
  assert.deepEqual(await c.receive(10), []);
  // Acked twice: nothing holds the receipt any more.
  await assert.rejects(c.ack(a.receipt), LeaseLostError);
});

test("payloadJson is the answer's payload text, byte for byte (numbers beyond a double, key order, spacing)", () => {
  const payload = '{ "z": 123456789012345678901234567890, "a": [1.50, {"}": "]\\\""}] }';
  const answer = `{"deliveries": [ {"id":"x","payload":${payload},"priority":"low","attempt":3,"due_at_ms":5,` +
    `"dispatched_at_ms":6,"enqueued_at_ms":4,"traceparent":"00-ab-cd-01","receipt":"r.1","lease_until_ms":9} ]}`;
  const [d] = parseDeliveries(answer);
  assert.equal(d.payloadJson, payload);
  assert.deepEqual(d.payload, JSON.parse(payload));
  assert.deepEqual({ ...d, payload: undefined, payloadJson: undefined }, {
    id: "x", payload: undefined, payloadJson: undefined, priority: "low", attempt: 3, dueAtMs: 5,
    dispatchedAtMs: 6, enqueuedAtMs: 4, traceparent: "00-ab-cd-01", receipt: "r.1", leaseUntilMs: 9,
  });
  assert.deepEqual(parseDeliveries('{"deliveries":[]}'), []);
});

test("serve answers :receive with the payload byte for byte", { timeout: 90_000 }, async () => {
  const c = consumer("pull-exact");
  await c.receive(1);
  const text = '{"z":123456789012345678901234567890,"a":1}';
  await client.schedule("pull-exact", { id: "e1", delayMs: 0, payloadJson: text });
  const [d] = await receiveAll(c, 1);
  await c.ack(d);
  assert.equal(d.payloadJson, text);
});

test("run: a throwing handler is nacked with its text and comes back at attempt 2, then acked", async () => {
  const c = consumer("pull-retry");
  await c.receive(1); // joins the group
  await client.schedule("pull-retry", { id: "r1", delayMs: 0, payload: { n: 1 } });
  const seen = [];
  const stop = new AbortController();
  const errors = [];
  const loop = c.run(
    async (d) => {
      seen.push([d.id, d.attempt]);
      if (d.attempt === 1) throw new Error("the shop is down");
    },
    { concurrency: 2, signal: stop.signal, retryInMs: 0, waitMs: 500, onError: (e) => errors.push(e) },
  );
  try {
    await waitFor("r1 handled at attempt 2", () => seen.some(([, a]) => a === 2));
    await waitFor("r1 acked", async () => (await pending("pull-retry")) === 0);
  } finally {
    stop.abort();
    await loop;
  }
  assert.deepEqual(seen, [["r1", 1], ["r1", 2]]);
  assert.deepEqual(errors, []);
  assert.deepEqual(await c.receive(10), []);
});

test("run: handlers that finish together share one :ack call", async () => {
  const c = consumer("pull-batch");
  await c.receive(1); // joins the group
  for (let i = 0; i < 10; i++) await client.schedule("pull-batch", { id: `b${i}`, delayMs: 0, payload: { i } });
  const sizes = [];
  const ack = c.ack.bind(c);
  c.ack = (x) => {
    sizes.push(Array.isArray(x) ? x.length : 1);
    return ack(x);
  };
  let release;
  const gate = new Promise((r) => (release = r));
  const started = new Set();
  const stop = new AbortController();
  const loop = c.run(
    async (d) => {
      started.add(d.id);
      await gate;
    },
    { concurrency: 10, signal: stop.signal, waitMs: 500 },
  );
  try {
    await waitFor("all 10 handlers running", () => started.size === 10);
    release();
    await waitFor("all 10 acked", async () => (await pending("pull-batch")) === 0);
  } finally {
    stop.abort();
    await loop;
  }
  assert.deepEqual(sizes, [10]);
});

test("run: a handler running past its lease keeps it (extended), is acked once and not redelivered", async () => {
  const c = consumer("pull-long", { leaseMs: 1000 });
  await c.receive(1);
  await client.schedule("pull-long", { id: "long1", delayMs: 0, payload: {} });
  const seen = [];
  const receipts = new Set();
  const errors = [];
  const stop = new AbortController();
  const loop = c.run(
    async (d) => {
      seen.push([d.id, d.attempt]);
      // Runs until the lease was extended twice (three receipts): past the first lease.
      await waitFor("two extensions", () => receipts.add(d.receipt).size >= 3);
    },
    // concurrency 2: the loop keeps receiving, so an expired lease would be taken over.
    { concurrency: 2, signal: stop.signal, waitMs: 500, onError: (e) => errors.push(e) },
  );
  try {
    await waitFor("long1 acked", async () => seen.length === 1 && (await pending("pull-long")) === 0);
  } finally {
    stop.abort();
    await loop;
  }
  assert.deepEqual(seen, [["long1", 1]]);
  assert.deepEqual(errors, []);
  assert.deepEqual(await c.receive(10), []);
});

test("run long-polls (waitMs) instead of pausing: an order scheduled while it waits is handled", async () => {
  const c = consumer("pull-wait");
  await c.receive(1);
  const waits = [];
  const receive = c.receive.bind(c);
  c.receive = (max, leaseMs, waitMs) => {
    waits.push(waitMs);
    return receive(max, leaseMs, waitMs);
  };
  const handled = [];
  const stop = new AbortController();
  const loop = c.run(async (d) => void handled.push(d.id), { concurrency: 2, signal: stop.signal, waitMs: 2000 });
  try {
    await waitFor("the first long poll", () => waits.length >= 1);
    await client.schedule("pull-wait", { id: "w1", delayMs: 0, payload: {} });
    await waitFor("w1 handled", async () => handled.length === 1 && (await pending("pull-wait")) === 0);
  } finally {
    stop.abort();
    await loop;
  }
  assert.deepEqual(handled, ["w1"]);
  assert.deepEqual([...new Set(waits)], [2000]);
});

test("stop: a running handler finishes within graceMs; one still running after it is left to its lease", async () => {
  const c = consumer("pull-grace", { leaseMs: 60_000 });
  await c.receive(1);
  await client.schedule("pull-grace", { id: "finishes", delayMs: 0, payload: {} });
  await client.schedule("pull-grace", { id: "hangs", delayMs: 0, payload: {} });
  const started = new Set();
  let release;
  const released = new Promise((r) => (release = r));
  const stop = new AbortController();
  const loop = c.run(
    async (d) => {
      started.add(d.id);
      if (d.id === "hangs") await new Promise(() => {}); // never settles
      await released;
    },
    { concurrency: 2, signal: stop.signal, waitMs: 500, graceMs: 500 },
  );
  await waitFor("both handlers running", () => started.size === 2);
  stop.abort();
  release();
  await loop;
  // The finished one was acked; the hanging one still holds its lease (not nacked).
  assert.equal(await pending("pull-grace"), 1);
});

test("nack with dead: true dead-letters the delivery with the error text", async () => {
  const c = consumer("pull-dead");
  await c.receive(1);
  await client.schedule("pull-dead", { id: "d1", delayMs: 0, payload: {} });
  const [d] = await receiveAll(c, 1);
  await c.nack(d, { dead: true, error: "no such order in the shop" });
  assert.equal(await pending("pull-dead"), 0);
  const keys = await redis.cmd("KEYS", "*dead*");
  const found = [];
  for (const k of keys) {
    const type = await redis.cmd("TYPE", k);
    if (type === "hash") found.push(JSON.stringify(await redis.cmd("HGETALL", k)));
    if (type === "stream") found.push(JSON.stringify(await redis.cmd("XRANGE", k, "-", "+")));
    if (type === "zset") found.push(JSON.stringify(await redis.cmd("ZRANGE", k, "0", "-1")));
  }
  assert.ok(found.some((t) => t.includes("no such order in the shop")), found.join("\n"));
  // A retry delay with dead is refused, naming the field.
  await client.schedule("pull-dead", { id: "d2", delayMs: 0, payload: {} });
  const [d2] = await receiveAll(c, 1);
  await assert.rejects(c.nack(d2, { dead: true, retryInMs: 5 }), (e) => {
    assert.ok(e instanceof ConsumerApiError && e.status === 400, String(e));
    assert.equal(e.code, "invalid_option");
    assert.match(e.message, /retry_in_ms/);
    return true;
  });
  await c.ack(d2);
});

test("a receipt whose lease ran out and was taken over is LeaseLostError on ack, nack and extend", async () => {
  const c = consumer("pull-lease", { leaseMs: 200 });
  await c.receive(1);
  await client.schedule("pull-lease", { id: "l1", delayMs: 0, payload: {} });
  const [first] = await receiveAll(c, 1);
  assert.equal(first.attempt, 1);
  const oldReceipt = first.receipt;
  // Never acked: once the lease has run out a later receive takes it over.
  const [again] = await receiveAll(c, 1);
  assert.equal(again.id, "l1");
  assert.equal(again.attempt, 2);
  for (const call of [() => c.ack(oldReceipt), () => c.nack(oldReceipt, { error: "late" }), () => c.extend(oldReceipt)]) {
    await assert.rejects(call(), (e) => {
      assert.ok(e instanceof LeaseLostError, String(e));
      assert.ok(e instanceof DelayqError);
      assert.equal(e.code, "lease_lost");
      return true;
    });
  }
  // The new receipt extends (the delivery takes the new receipt) and then acks.
  const [ext] = await c.extend(again, 60_000);
  assert.equal(ext.status, "extended");
  assert.equal(again.receipt, ext.receipt);
  assert.deepEqual(await c.ack(again), ["acked"]);
  assert.equal(await pending("pull-lease"), 0);
});

test("errors carry the API's code and never the token", async () => {
  const wrong = new Consumer({ baseUrl: serve.base, token: `${TOKEN}-wrong`, queue: "pull-ack", group: "close" });
  await assert.rejects(wrong.receive(1), (e) => {
    assert.ok(e instanceof ConsumerApiError, String(e));
    assert.equal(e.status, 401);
    assert.ok(!e.message.includes(TOKEN), e.message);
    return true;
  });
  const c = consumer("no-such-queue");
  await assert.rejects(c.receive(1), (e) => {
    assert.equal(e.status, 404);
    assert.equal(e.code, "queue_not_found");
    assert.ok(!e.message.includes(TOKEN), e.message);
    return true;
  });
  await assert.rejects(consumer("pull-ack").receive(0), (e) => {
    assert.equal(e.code, "invalid_option");
    assert.match(e.message, /max/);
    return true;
  });
  await assert.rejects(consumer("pull-ack").ack("not-a-receipt"), (e) => {
    assert.equal(e.status, 400);
    assert.ok(!e.message.includes(TOKEN), e.message);
    return true;
  });
  // A server that cannot be reached: the token in the URL's place still does not show.
  const gone = new Consumer({ baseUrl: `http://127.0.0.1:1/${TOKEN}`, token: TOKEN, queue: "q", group: "g", timeoutMs: 2000 });
  await assert.rejects(gone.receive(1), (e) => {
    assert.equal(e.code, "unavailable");
    assert.ok(!e.message.includes(TOKEN), e.message);
    return true;
  });
  // run() gives up on a refusal that repeating cannot fix.
  await assert.rejects(wrong.run(() => {}), (e) => e.status === 401);
  assert.throws(() => new Consumer({ baseUrl: "nope", queue: "q", group: "g" }), /baseUrl/);
  assert.throws(() => new Consumer({ baseUrl: serve.base, queue: "q", group: "" }), /group/);
});
