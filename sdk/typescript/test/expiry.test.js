// Expiry of stale work (issue 44): an order's own `expiresAfterMs` is stored the way the
// Rust client stores it (`"<ms>:!<expires>!<json>"`, src/engine/expiry.rs), so Rust workers
// judge it; the payload reads back byte for byte; a refusal names the field and writes
// nothing. (Expired by `delayq serve`: interop.test.js.)

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
  await createQueue(redis.url, "exp", 1);
  client = await Client.connect(redis.url, { clock: () => NOW });
  admin = await redis.connect();
});

after(async () => {
  admin?.disconnect();
  await client?.close();
  await redis?.stop();
});

test("expiresAfterMs is stored in front of the payload, which reads back as sent", { timeout: 90_000 }, async () => {
  await client.schedule("exp", { id: "a", delayMs: 60_000, payloadJson: ' {"n": 1} ', expiresAfterMs: 1500 });
  await client.scheduleMany("exp", [
    { id: "b", delayMs: 60_000, payload: [2], expiresAfterMs: 60_000 },
    { id: "c", delayMs: 0 },
  ]);
  const raw = await admin.hgetall(shardKeys("dq", "exp", 0).payload);
  assert.equal(raw.a, `${NOW}:!1500! {"n": 1} `);
  assert.equal(raw.b, `${NOW}:!60000![2]`);
  assert.equal(raw.c, `${NOW}:null`, "no expiry: the bytes every order always had");
  const got = await client.get("exp", "a");
  assert.equal(got.payloadJson, ' {"n": 1} ');
  assert.deepEqual(got.payload, { n: 1 });
});

test("a bad expiresAfterMs names the field and writes nothing", { timeout: 90_000 }, async () => {
  const before = await admin.dbsize();
  for (const ms of [0, -1, 3653 * 86_400_000 + 1, 1.5, "1s", true]) {
    await assert.rejects(client.schedule("exp", { id: "x", delayMs: 0, expiresAfterMs: ms }), (e) => {
      assert.ok(e instanceof InvalidInputError, String(e));
      assert.equal(e.code, "invalid_option");
      assert.match(e.message, /expires_after/);
      return true;
    });
    await assert.rejects(
      client.scheduleMany("exp", [{ id: "y", delayMs: 0 }, { id: "z", delayMs: 0, expiresAfterMs: ms }]),
      (e) => e instanceof InvalidInputError && e.code === "invalid_option" && e.index === 1,
    );
  }
  assert.equal(await admin.dbsize(), before);
});
