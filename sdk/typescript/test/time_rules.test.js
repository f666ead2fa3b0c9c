// Issue 44's dedup window and debounce through the SDK: a dispatched id is a duplicate
// within the window (with and without if_absent) until `repeat`; a debounce is capped at its
// first call + maxWait and read back by `get`. Dispatch runs the engine's own dequeue.lua
// (`delayq scripts export`).

import assert from "node:assert/strict";
import { mkdtemp, readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { Client, InvalidInputError } from "../dist/index.js";
import { LocalRedis, delayq } from "./support/harness.js";

let redis;
let client;
let admin;
let dequeue;

before(async () => {
  redis = await LocalRedis.start();
  const dir = await mkdtemp(join(tmpdir(), "dq-scripts-"));
  const ex = await delayq(["scripts", "export", dir]);
  assert.equal(ex.code, 0, ex.stderr);
  dequeue = await readFile(join(dir, "dequeue.lua"), "utf8");
  const r = await delayq(["--redis-url", redis.url, "queue", "create", "dd", "--dedup-window", "1h"]);
  assert.equal(r.code, 0, r.stderr);
  client = await Client.connect(redis.url);
  admin = await redis.connect();
});

after(async () => {
  admin?.disconnect();
  await client?.close();
  await redis?.stop();
});

async function dispatch() {
  const tag = "{dq:dd:0}";
  const keys = ["due", "payload", "stream", "history:0:0", "meta", "levels", "high:stream", "low:stream", "dispatched", "debounce", "tags", "keyed", "key_ring"].map(
    (k) => `${tag}:${k}`,
  );
  const [sec, usec] = await admin.time();
  // A second ahead of the server's clock: an order scheduled "now" is due by the client's
  // estimate of that clock, which may lead it by a few ms (it failed once under load).
  const now = Number(sec) * 1000 + Math.floor(Number(usec) / 1000) + 1000;
  const r = await admin.eval(dequeue, keys.length, ...keys, String(now), "1000", "0", "0");
  return Number(r[0]);
}

test("a dispatched id is a duplicate within the window until repeat", async () => {
  assert.equal((await client.schedule("dd", { id: "o", delayMs: 0 })).outcome, "created");
  assert.equal(await dispatch(), 1);
  const dup = await client.schedule("dd", { id: "o", delayMs: 0, payload: 2 });
  assert.equal(dup.outcome, "duplicate");
  assert.equal(typeof dup.dispatchedAtMs, "number");
  assert.equal((await client.schedule("dd", { id: "o", delayMs: 0 }, { mode: "if_absent" })).outcome, "duplicate");
  assert.equal(await client.get("dd", "o"), null, "a duplicate wrote something");
  const res = await client.scheduleMany("dd", [
    { id: "o", delayMs: 0 },
    { id: "p", delayMs: 0 },
  ]);
  assert.deepEqual(
    res.map((r) => r.outcome),
    ["duplicate", "created"],
  );
  assert.equal((await client.schedule("dd", { id: "o", delayMs: 0, repeat: true })).outcome, "created");
  assert.equal(await dispatch(), 2);
});

test("a debounce is capped at its first call + maxWait and shown by get", async () => {
  const debounce = { delayMs: 3_600_000, maxWaitMs: 3_600_000 };
  const a = await client.schedule("dd", { id: "cart", debounce, payload: 1 });
  const b = await client.schedule("dd", { id: "cart", debounce, payload: 2 });
  assert.deepEqual([a.outcome, b.outcome], ["created", "updated"]);
  assert.equal(b.dueAtMs, a.dueAtMs);
  const got = await client.get("dd", "cart");
  assert.equal(got.payload, 2);
  assert.deepEqual(got.debounce, { firstCallMs: a.dueAtMs - 3_600_000, maxDueMs: a.dueAtMs });
  await assert.rejects(
    client.schedule("dd", { id: "cart", debounce: { delayMs: 500, maxWaitMs: 2000 } }, { mode: "if_absent" }),
    (e) => e instanceof InvalidInputError && e.code === "invalid_option" && /debounce/.test(e.message),
  );
});
