// Every case of tests/conformance/inputs.json (the one statement of the producers' input
// rules), run against a redis-server of the test's own with the queues the file names
// registered by the delayq binary, the client's clock fixed at the file's now_ms.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import path from "node:path";
import { after, before, test } from "node:test";
import { Client, DelayqError, InvalidInputError } from "../dist/index.js";
import { LocalRedis, REPO, createQueue } from "./support/harness.js";

const FILE = path.join(REPO, "tests/conformance/inputs.json");
const spec = JSON.parse(readFileSync(FILE, "utf8"));
const OPS = new Set(["schedule", "schedule_many", "cancel", "get", "reschedule", "connect", "post_event"]);
const CASE_KEYS = new Set([
  "name", "op", "queue", "id", "delay_ms", "due_ms", "payload", "mode", "orders", "generate",
  "namespace", "fixed_clock", "expect", "index", "priority", "expect_priority",
  "at_local", "timezone", "expect_due_ms", "expires_after_ms", "debounce", "repeat", "tags",
  "key", "event", "data", "cancel_on",
]);

let redis;
let client;

before(async () => {
  assert.equal(spec.format, 6, "a conformance format this reader does not know");
  redis = await LocalRedis.start();
  for (const q of spec.queues) await createQueue(redis.url, q.name, q.shards, spec.namespace);
  client = await Client.connect(redis.url, { namespace: spec.namespace, clock: () => spec.now_ms });
});

after(async () => {
  await client?.close();
  await redis?.stop();
});

/** How many times Redis ran each command so far. */
async function commandCounts() {
  const info = await redis.cmd("INFO", "commandstats");
  const counts = {};
  for (const m of info.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) counts[m[1]] = Number(m[2]);
  return counts;
}

/** The due-time fields as given (a local time's combination cases give several). */
function when(o) {
  const w = {};
  if ("delay_ms" in o) w.delayMs = o.delay_ms;
  if ("due_ms" in o) w.at = o.due_ms;
  if ("at_local" in o) w.atLocal = o.at_local;
  if ("timezone" in o) w.timezone = o.timezone;
  if ("debounce" in o) w.debounce = { delayMs: o.debounce.delay_ms, maxWaitMs: o.debounce.max_wait_ms };
  if ("repeat" in o) w.repeat = o.repeat;
  return w;
}

/** The `priority` exactly as the file has it (absent: none given, i.e. normal). */
function level(o) {
  return "priority" in o ? { priority: o.priority } : {};
}

/** The order's own `expires_after_ms` exactly as the file has it (absent: none). */
function expiry(o) {
  return {
    ...("expires_after_ms" in o ? { expiresAfterMs: o.expires_after_ms } : {}),
    ...("tags" in o ? { tags: o.tags } : {}),
    // The rules as given; `remember_ms` is the TypeScript option `rememberMs`.
    ...("cancel_on" in o
      ? { cancelOn: o.cancel_on.map(({ remember_ms: ms, ...r }) => (ms === undefined ? r : { ...r, rememberMs: ms })) }
      : {}),
  };
}

/** The order's `key` exactly as the file has it (absent: none). */
function keyOf(o) {
  return "key" in o ? { key: o.key } : {};
}

function orderOf(o) {
  return { id: o.id, ...when(o), payloadJson: o.payload, ...level(o), ...expiry(o), ...keyOf(o) };
}

function ordersOf(c) {
  if (c.orders) return c.orders.map(orderOf);
  const g = c.generate;
  return Array.from({ length: g.count }, (_, i) => ({
    id: `${g.id_prefix}${i}`,
    delayMs: g.delay_ms,
    payloadJson: g.payload,
  }));
}

async function run(c) {
  const opts = c.mode ? { mode: c.mode } : {};
  switch (c.op) {
    case "schedule":
      return client.schedule(c.queue, orderOf(c), opts);
    case "schedule_many":
      return client.scheduleMany(c.queue, ordersOf(c), opts);
    case "cancel":
      return client.cancel(c.queue, c.id);
    case "post_event":
      return client.postEvent(c.event, c.data, { id: c.id });
    case "get":
      return client.get(c.queue, c.id);
    case "reschedule":
      return client.reschedule(c.queue, c.id, when(c), level(c));
    case "connect": {
      const other = await Client.connect(redis.url, { namespace: c.namespace, clock: () => spec.now_ms });
      await other.close();
      return other.namespace;
    }
    default:
      throw new Error(`unknown op ${c.op}`);
  }
}

test("the conformance file has cases this reader knows", { timeout: 90_000 }, () => {
  assert.ok(spec.cases.length > 100, "too few cases");
  const names = new Set();
  for (const c of spec.cases) {
    assert.ok(OPS.has(c.op), `${c.name}: unknown op ${c.op}`);
    assert.ok(!names.has(c.name), `duplicate case name ${c.name}`);
    names.add(c.name);
    if (c.expect !== null) assert.ok(spec.codes.includes(c.expect), `${c.name}: unknown code ${c.expect}`);
    for (const k of Object.keys(c)) assert.ok(CASE_KEYS.has(k), `${c.name}: unknown key ${k}`);
  }
  assert.ok(spec.codes.includes("invalid_priority"));
});

for (const c of spec.cases) {
  test(`conformance: ${c.name}`, { timeout: 90_000 }, async () => {
    const before = await commandCounts();
    let result;
    let error;
    try {
      result = await run(c);
    } catch (e) {
      error = e;
    }
    const after = await commandCounts();
    const ran = (cmd) => (after[cmd] ?? 0) - (before[cmd] ?? 0);
    if (c.expect === null) {
      assert.equal(error, undefined, `${c.name}: expected success, got ${error?.name} ${error?.code}: ${error?.message}`);
      if (c.op === "schedule") {
        // Kept byte for byte, due when asked.
        assert.ok(["created", "updated", "unchanged"].includes(result.outcome));
        const got = await client.get(c.queue, c.id);
        assert.ok(got, `${c.name}: not found after scheduling`);
        if (result.outcome !== "unchanged") {
          assert.equal(got.payloadJson, c.payload, `${c.name}: payload not kept byte for byte`);
          assert.equal(got.dueAtMs, result.dueAtMs);
          assert.equal(got.enqueuedAtMs, spec.now_ms);
        }
        const expectDue = "expect_due_ms" in c ? c.expect_due_ms : "delay_ms" in c ? spec.now_ms + c.delay_ms : c.due_ms;
        assert.equal(result.dueAtMs, expectDue);
        if (result.outcome !== "unchanged") assert.equal(got.priority, c.priority ?? "normal", `${c.name}: stored level`);
        if (result.outcome !== "unchanged") assert.deepEqual(got.tags, c.tags ?? [], `${c.name}: stored tags`);
        if (result.outcome !== "unchanged") assert.equal(got.key, c.key, `${c.name}: stored key`);
      } else if (c.op === "schedule_many") {
        const orders = ordersOf(c);
        assert.equal(result.length, orders.length);
        result.forEach((r, i) => assert.equal(r.id, orders[i].id));
        if (c.mode === "if_absent") assert.ok(result.every((r) => r.outcome === "created" || r.outcome === "unchanged"));
        if (c.orders) {
          // Each written order's level (an id repeated in the batch: its last write).
          const last = new Map();
          c.orders.forEach((o, i) => {
            if (result[i].outcome !== "unchanged") last.set(o.id, o.priority ?? "normal");
          });
          for (const [id, want] of last) assert.equal((await client.get(c.queue, id)).priority, want, `${c.name}: level of ${id}`);
        }
      } else if (c.op === "get") {
        if ("expect_priority" in c) {
          assert.ok(result, `${c.name}: not found, expected priority ${c.expect_priority}`);
          assert.equal(result.priority, c.expect_priority, `${c.name}: level`);
        }
      } else if (c.op === "cancel") {
        assert.ok(result === "not_found" || result === "cancelled");
      } else if (c.op === "reschedule") {
        assert.ok(result === "not_found" || result === "rescheduled");
        if (result === "rescheduled" && "priority" in c) {
          assert.equal((await client.get(c.queue, c.id)).priority, c.priority, `${c.name}: level not changed`);
        }
      } else if (c.op === "connect") {
        assert.equal(result, c.namespace);
      }
      return;
    }
    assert.ok(error instanceof DelayqError, `${c.name}: expected ${c.expect}, got ${error ? error.message : JSON.stringify(result)?.slice(0, 200)}`);
    assert.equal(error.code, c.expect, `${c.name}: ${error.message.slice(0, 300)}`);
    if (c.expect !== "queue_not_found") {
      assert.ok(error instanceof InvalidInputError);
      // Refused before anything is read from Redis.
      assert.equal(ran("hmget"), 0, `${c.name}: the registry was read before the input was checked`);
    }
    if ("index" in c) assert.equal(error.index, c.index, `${c.name}: index`);
    else if (c.op !== "schedule_many" && error instanceof InvalidInputError) assert.equal(error.index, undefined);
    // Nothing written.
    assert.equal(ran("evalsha") + ran("eval"), 0, `${c.name}: a script ran although the call was refused`);
  });
}
