// Interoperability with the Rust engine: orders scheduled by this SDK are dispatched and
// delivered by `delayq serve` (webhook, payload byte for byte), found and cancelled by its
// HTTP API and CLI; orders scheduled through the Rust side are read and cancelled here.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Client, jsonText, shardOf } from "../dist/index.js";
import { LocalRedis, Receiver, Serve, delayq, rawPayload } from "./support/harness.js";

const Q = "order-close";
const SHARDS = 4;
let redis;
let hook;
let serve;
let client;

before(async () => {
  redis = await LocalRedis.start();
  hook = await Receiver.start();
  serve = await Serve.start(`
redis_url = "${redis.url}"
namespace = "dq"
shards = ${SHARDS}
[http]
listen = "127.0.0.1:{port}"
[[handlers]]
queue = "${Q}"
group = "hook"
kind = "webhook"
url = "${hook.url}"
concurrency = 1
timeout = "5s"
backoff = "fixed:200ms"
`);
  client = await Client.connect(redis.url);
});

after(async () => {
  await client?.close();
  await serve?.stop();
  await hook?.close();
  await redis?.stop();
});

test("scheduled here, delivered by delayq serve with the payload byte for byte", { timeout: 90_000 }, async () => {
  const cases = [
    {
      id: "заказ-1 ✓",
      order: { payloadJson: '{"n":123456789012345678901234567890,"d":0.1000000000000000055511151231257827,"s":"заказ ✓ 🎉","esc":"\\u00e9\\n"}' },
      expect: '{"n":123456789012345678901234567890,"d":0.1000000000000000055511151231257827,"s":"заказ ✓ 🎉","esc":"\\u00e9\\n"}',
    },
    {
      id: "big-2",
      order: { payload: { amount: 123456789012345678901234567890n, name: "Zoë ✓", items: [1, 2.5, null, true] } },
      expect: '{"amount":123456789012345678901234567890,"name":"Zoë ✓","items":[1,2.5,null,true]}',
    },
    {
      id: "raw-3",
      order: { payload: { total: jsonText("-0.000000000000000000000000001e-400"), note: "🎉" } },
      expect: '{"total":-0.000000000000000000000000001e-400,"note":"🎉"}',
    },
    { id: "string-4", order: { payload: "just text" }, expect: '"just text"' },
  ];
  const out = await client.scheduleMany(Q, cases.map((c) => ({ id: c.id, delayMs: 200, ...c.order })));
  assert.ok(out.every((r) => r.outcome === "created"));
  for (const c of cases) {
    const body = await hook.waitFor(c.id, 30_000);
    assert.equal(rawPayload(body), c.expect, `payload of ${c.id} changed on its way`);
    const v = JSON.parse(body);
    assert.equal(v.queue, Q);
    assert.equal(v.group, "hook");
    assert.equal(v.due_at_ms, out[cases.indexOf(c)].dueAtMs);
  }
});

test("cancelled here before due: never delivered, and the Rust side's history says cancelled", { timeout: 90_000 }, async () => {
  // The sentinel is due after the cancelled order, in the same shard: once it is
  // delivered, the cancelled one would have been too (one handler slot, earliest first).
  const paid = "paid-1";
  let sentinel = "sentinel-0";
  for (let i = 1; shardOf(sentinel, SHARDS) !== shardOf(paid, SHARDS); i++) sentinel = `sentinel-${i}`;
  await client.schedule(Q, { id: paid, delayMs: 1500, payload: { order: paid } });
  assert.equal(await client.cancel(Q, paid), "cancelled");
  await client.schedule(Q, { id: sentinel, delayMs: 2000, payload: { order: sentinel } });
  await hook.waitFor(sentinel, 30_000);
  assert.ok(!hook.ids().includes(paid), "a cancelled order was delivered");
  // The SDK's cancel is recorded in the order history (issue 43).
  const [status, body] = await serve.message(Q, paid);
  assert.equal(status, 200, body);
  assert.deepEqual([JSON.parse(body).state, JSON.parse(body).cancelled.reason], ["cancelled", "id"]);
  const cli = await delayq(["--redis-url", redis.url, "get", Q, paid]);
  assert.equal(cli.code, 0, cli.stdout + cli.stderr);
  assert.equal(JSON.parse(cli.stdout).state, "cancelled");
});

test("scheduled here, read and cancelled by the Rust side", { timeout: 90_000 }, async () => {
  const text = '{"order":"ts-1","amount":123456789012345678901234567890,"name":"Zoë ✓"}';
  const r = await client.schedule(Q, { id: "ts-1", delayMs: 600_000, payloadJson: text });
  const [status, body] = await serve.message(Q, "ts-1");
  assert.equal(status, 200, body);
  const h = JSON.parse(body);
  assert.equal(h.state, "scheduled");
  assert.equal(h.due_at_ms, r.dueAtMs);
  assert.ok(body.includes(`"payload":${text}`), `payload not kept byte for byte: ${body}`);
  const cli = await delayq(["--redis-url", redis.url, "get", Q, "ts-1"]);
  assert.equal(cli.code, 0, cli.stderr);
  assert.ok(cli.stdout.includes("123456789012345678901234567890"), cli.stdout);
  const del = await fetch(`${serve.base}/v1/queues/${Q}/messages/ts-1`, { method: "DELETE" });
  assert.equal(del.status, 200, await del.text());
  assert.equal(await client.get(Q, "ts-1"), null);
  assert.equal(await client.cancel(Q, "ts-1"), "not_found");
});

test("scheduled by the Rust side, read and cancelled here", { timeout: 90_000 }, async () => {
  const raw = '{"n":123456789012345678901234567890,"s":"заказ ✓"}';
  const put = await fetch(`${serve.base}/v1/queues/${Q}/messages/rust-1`, {
    method: "PUT",
    headers: { "content-type": "application/json" },
    body: `{"delay_ms":600000,"payload":${raw}}`,
  });
  assert.equal(put.status, 201, await put.text());
  const scheduled = JSON.parse(await (await fetch(`${serve.base}/v1/queues/${Q}/messages/rust-1`)).text());
  const got = await client.get(Q, "rust-1");
  assert.ok(got);
  assert.equal(got.payloadJson, raw);
  assert.equal(got.dueAtMs, scheduled.due_at_ms);
  assert.ok(got.enqueuedAtMs > 0 && got.enqueuedAtMs <= got.dueAtMs);
  assert.equal(await client.reschedule(Q, "rust-1", { delayMs: 700_000 }), "rescheduled");
  assert.equal(await client.cancel(Q, "rust-1"), "cancelled");
  const [status, body] = await serve.message(Q, "rust-1");
  assert.equal(status, 200, body);
  assert.equal(JSON.parse(body).state, "cancelled");
  // The CLI's schedule too.
  const cli = await delayq(["--redis-url", redis.url, "schedule", Q, "cli-1", "--in", "10m", "--payload", raw]);
  assert.equal(cli.code, 0, cli.stderr);
  assert.equal((await client.get(Q, "cli-1")).payloadJson, raw);
  assert.equal(await client.cancel(Q, "cli-1"), "cancelled");
});

test("scheduled by delayq serve in a trace context, read here byte for byte", { timeout: 90_000 }, async () => {
  // serve stores the request's W3C context in front of the payload; get leaves it out.
  const raw = '{"n":123456789012345678901234567890,"s":"~a~"}';
  const put = await fetch(`${serve.base}/v1/queues/${Q}/messages/traced-1`, {
    method: "PUT",
    headers: {
      "content-type": "application/json",
      traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      tracestate: "shop=1",
    },
    body: `{"delay_ms":600000,"payload":${raw}}`,
  });
  assert.equal(put.status, 201, await put.text());
  const admin = await redis.connect();
  try {
    const stored = await admin.hget(`{dq:${Q}:${shardOf("traced-1", SHARDS)}}:payload`, "traced-1");
    assert.match(stored, /^\d+:~00-4bf92f3577b34da6a3ce929d0e0e4736-[0-9a-f]{16}-01;shop=1~/);
    assert.ok(stored.endsWith(`~${raw}`), stored);
  } finally {
    admin.disconnect();
  }
  const got = await client.get(Q, "traced-1");
  assert.equal(got.payloadJson, raw);
  assert.deepEqual(got.payload, { n: got.payload.n, s: "~a~" });
  assert.equal(await client.cancel(Q, "traced-1"), "cancelled");
});

test("every shard agrees: the Rust side finds each order scheduled here", { timeout: 90_000 }, async () => {
  const ids = Array.from({ length: 40 }, (_, i) => [`o-${i}`, `заказ:${i} ✓`, `{x}:${i}`, `🎉${i}`][i % 4]);
  const out = await client.scheduleMany(Q, ids.map((id) => ({ id, delayMs: 600_000, payload: { id } })));
  assert.ok(out.every((r) => r.outcome === "created"));
  const shards = new Set(ids.map((id) => shardOf(id, SHARDS)));
  assert.equal(shards.size, SHARDS, "the ids do not cover every shard");
  for (const id of ids) {
    const [status, body] = await serve.message(Q, id);
    assert.equal(status, 200, `${id}: ${body}`);
    assert.equal(JSON.parse(body).state, "scheduled");
  }
  for (const id of ids) assert.equal(await client.cancel(Q, id), "cancelled");
});

test("scheduled here at high / low, dispatched by delayq serve into that level's stream", { timeout: 90_000 }, async () => {
  const want = { "lane-vip": "high", "lane-plain": "normal", "lane-slow": "low", "lane-vip-2": "high" };
  const ids = Object.keys(want);
  await client.scheduleMany(Q, ids.map((id) => ({ id, delayMs: 200, payload: { id }, priority: want[id] })));
  for (const id of ids) await hook.waitFor(id, 30_000);
  // Each order went into its shard's stream of its level ({tag}:high:stream, {tag}:stream,
  // {tag}:low:stream), with priority=<level> when it is not normal.
  const admin = await redis.connect();
  try {
    for (const id of ids) {
      const tag = `{dq:${Q}:${shardOf(id, SHARDS)}}`;
      const lanes = { high: `${tag}:high:stream`, normal: `${tag}:stream`, low: `${tag}:low:stream` };
      const found = {};
      for (const [lv, key] of Object.entries(lanes)) {
        for (const [, flat] of await admin.xrange(key, "-", "+")) {
          const fields = {};
          for (let i = 0; i < flat.length; i += 2) fields[flat[i]] = flat[i + 1];
          if (fields.id === id) found[lv] = fields;
        }
      }
      assert.deepEqual(Object.keys(found), [want[id]], `${id}: ${JSON.stringify(found)}`);
      assert.equal(found[want[id]].priority, want[id] === "normal" ? undefined : want[id]);
    }
    // Dispatched: no level is left behind in the levels HASHes.
    for (let s = 0; s < SHARDS; s++) {
      for (const id of ids) assert.equal(await admin.hget(`{dq:${Q}:${s}}:levels`, id), null);
    }
  } finally {
    admin.disconnect();
  }
});

test("an order scheduled here with expiresAfterMs, handed over too late, is expired by delayq serve", { timeout: 90_000 }, async () => {
  // Due 5 s ago with 1 s to spare: the webhook group would get it at least 4 s past its
  // limit, so it dead-letters it with reason expired; a long limit is delivered.
  const past = Date.now() - 5_000;
  const out = await client.scheduleMany(Q, [
    { id: "stale-1", at: past, expiresAfterMs: 1_000, payload: { n: 1 } },
    { id: "fresh-1", at: past, expiresAfterMs: 3_600_000, payload: { n: 2 } },
  ]);
  assert.ok(out.every((r) => r.outcome === "created"));
  const body = await hook.waitFor("fresh-1", 30_000);
  assert.equal(rawPayload(body), '{"n":2}');
  let dead;
  for (let i = 0; i < 3000 && !dead; i++) {
    const page = JSON.parse(await (await fetch(`${serve.base}/v1/queues/${Q}/dead`)).text());
    dead = page.dead_letters.find((d) => d.id === "stale-1");
    if (!dead) await new Promise((r) => setTimeout(r, 10));
  }
  assert.ok(dead, "stale-1 dead-lettered");
  assert.equal(dead.reason, "expired");
  // Past its limit: the due time above is this host's clock and "now" is Redis', so the
  // lateness is about 4 s give or take their difference; it is positive either way.
  assert.ok(dead.late_ms > 0, `late_ms ${dead.late_ms}`);
  assert.deepEqual(dead.payload, { n: 1 });
  const history = JSON.parse(await (await fetch(`${serve.base}/v1/queues/${Q}/messages/stale-1`)).text());
  assert.equal(history.groups[0].state, "expired");
  assert.ok(!hook.ids().includes("stale-1"), "never delivered");
});

test("a key set here reaches the webhook body and the engine's history (issue 42)", { timeout: 90_000 }, async () => {
  const k = await client.schedule(Q, { id: "keyed-ts-1", delayMs: 100, payload: { a: 1 }, key: "merchant:17", expiresAfterMs: 3_600_000 });
  await client.schedule(Q, { id: "plain-ts-1", delayMs: 100, payload: { a: 2 } });
  const keyed = JSON.parse(await hook.waitFor("keyed-ts-1", 30_000));
  assert.equal(keyed.key, "merchant:17");
  assert.deepEqual(keyed.payload, { a: 1 });
  const plain = JSON.parse(await hook.waitFor("plain-ts-1", 30_000));
  assert.equal(plain.key, undefined);
  const cli = await delayq(["--redis-url", redis.url, "get", Q, "keyed-ts-1"]);
  assert.equal(cli.code, 0, cli.stderr);
  const got = JSON.parse(cli.stdout);
  assert.equal(got.key, "merchant:17");
  assert.equal(got.due_at_ms, k.dueAtMs);
});
