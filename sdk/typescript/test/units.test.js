// The pure parts, without Redis: the shard function, due times, payload depth and
// serialization, the stored value's encoding, Redis URLs.

import assert from "node:assert/strict";
import { test } from "node:test";
import { PRIORITIES, checkPriority, fnv1a64, jsonText, shardKeys, shardOf } from "../dist/index.js";
import { parseRedisUrl } from "../dist/connection.js";
import { decodeStored, jsonDepth, laneArg, parseAt, resolveWhen, rustDebug, toJsonText } from "../dist/message.js";

test("the shard function is FNV-1a 64 of the UTF-8 bytes", { timeout: 90_000 }, () => {
  // Published test vectors.
  assert.equal(fnv1a64(""), 0xcbf29ce484222325n);
  assert.equal(fnv1a64("a"), 0xaf63dc4c8601ec8cn);
  assert.equal(fnv1a64("foobar"), 0x85944171f73967e8n);
  assert.equal(shardOf("a", 1000), Number(0xaf63dc4c8601ec8cn % 1000n));
  assert.equal(shardOf("anything", 1), 0);
  // UTF-8 bytes, not UTF-16 units.
  assert.notEqual(fnv1a64("é"), fnv1a64("\u00e9".normalize("NFD")));
  const counts = new Array(8).fill(0);
  for (let i = 0; i < 8000; i++) counts[shardOf(`order-${i}`, 8)]++;
  assert.ok(counts.every((c) => c > 800), `skewed: ${counts}`);
  assert.deepEqual(shardKeys("dq", "order-close", 7), {
    tag: "{dq:order-close:7}",
    shard: 7,
    due: "{dq:order-close:7}:due",
    payload: "{dq:order-close:7}:payload",
    meta: "{dq:order-close:7}:meta",
    levels: "{dq:order-close:7}:levels",
    dispatched: "{dq:order-close:7}:dispatched",
    debounce: "{dq:order-close:7}:debounce",
    tags: "{dq:order-close:7}:tags",
    keyed: "{dq:order-close:7}:keyed",
    keyRing: "{dq:order-close:7}:key_ring",
  });
});

test("due times as the Rust When", { timeout: 90_000 }, () => {
  const now = 1_800_000_000_000;
  assert.equal(parseAt("1795000000000"), 1_795_000_000_000);
  assert.equal(parseAt(" 1795000000000\n"), 1_795_000_000_000);
  assert.throws(() => parseAt("1795000000"), { code: "invalid_due_time" });
  assert.throws(() => parseAt("2026-11-22T10:30:00"), /ambiguous/);
  assert.equal(parseAt("2026-11-22T10:30:00Z"), Date.UTC(2026, 10, 22, 10, 30));
  assert.equal(parseAt("2026-11-22T10:30:00+01:00"), Date.UTC(2026, 10, 22, 9, 30));
  assert.equal(parseAt("2026-11-22T10:30:00.123456-00:30"), Date.UTC(2026, 10, 22, 11, 0, 0, 123));
  assert.equal(parseAt("2016-12-31T23:59:60Z"), Date.UTC(2016, 11, 31, 23, 59, 59, 999));
  assert.throws(() => parseAt("2026-02-30T10:30:00Z"), { code: "invalid_due_time" });
  assert.throws(() => parseAt("tomorrow"), { code: "invalid_due_time" });
  assert.equal(resolveWhen({ delayMs: 500 }, now), now + 500);
  assert.equal(resolveWhen({ delayMs: 500n }, now), now + 500);
  assert.equal(resolveWhen({ at: now - 10 }, now), now - 10);
  assert.equal(resolveWhen({ at: new Date(now + 5) }, now), now + 5);
  assert.throws(() => resolveWhen({ delayMs: -1 }, now), { code: "invalid_delay" });
  assert.throws(() => resolveWhen({ at: -5 }, now), { code: "invalid_due_time" });
  assert.throws(() => resolveWhen({ at: new Date(NaN) }, now), { code: "invalid_due_time" });
  assert.throws(() => resolveWhen({ delayMs: 1, at: 1 }, now), { code: "invalid_due_time" });
});

test("payload depth, serialization and the stored value", { timeout: 90_000 }, () => {
  assert.equal(jsonDepth("1"), 0);
  assert.equal(jsonDepth('{"a":[1,{"b":"]]]]{{"}]}'), 3);
  assert.equal(jsonDepth('["\\"[[["]'), 1);
  assert.equal(toJsonText(undefined), "null");
  assert.equal(toJsonText({ a: 1n << 70n, b: [undefined, () => 1], c: undefined, d: NaN }), '{"a":1180591620717411303424,"b":[null,null],"d":null}');
  assert.equal(toJsonText({ raw: jsonText(" 1.10 ") }), '{"raw": 1.10 }');
  assert.equal(toJsonText(new String("x")), '"x"');
  assert.throws(() => toJsonText({ s: "\ud800" }), { code: "invalid_payload" });
  assert.deepEqual(decodeStored('12:{"a":1}'), { enqueuedAtMs: 12, json: '{"a":1}' });
  assert.deepEqual(decodeStored('{"a":1}'), { enqueuedAtMs: null, json: '{"a":1}' });
  // A trace context stored in front of the payload is left out; only after "<ms>:".
  const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  assert.deepEqual(decodeStored(`12:~${tp};k=v;w~{"a":"~"}`), { enqueuedAtMs: 12, json: '{"a":"~"}' });
  assert.deepEqual(decodeStored(`12:~${tp}~[1]`), { enqueuedAtMs: 12, json: "[1]" });
  assert.deepEqual(decodeStored("~x~1"), { enqueuedAtMs: null, json: "~x~1" });
  assert.deepEqual(decodeStored("12:~x"), { enqueuedAtMs: 12, json: "~x" });
});

test("Redis URLs, and no password in their errors", { timeout: 90_000 }, () => {
  assert.deepEqual(parseRedisUrl("redis://u:p%40ss@h:7000/2").options, { host: "h", port: 7000, username: "u", password: "p@ss", db: 2 });
  assert.equal(parseRedisUrl("rediss://h").options.tls.servername, "h");
  const c = parseRedisUrl("redis+cluster://:pw@a:1,b:2/");
  assert.equal(c.cluster, true);
  assert.deepEqual(c.nodes, [{ host: "a", port: 1 }, { host: "b", port: 2 }]);
  assert.equal(c.options.password, "pw");
  for (const bad of ["", "http://u:hunter2@h", "redis://u:hunter2@h/x", "redis+cluster://u:hunter2@", "nonsense hunter2"]) {
    assert.throws(() => parseRedisUrl(bad), (e) => e.code === "invalid_redis_url" && !e.message.includes("hunter2"));
  }
});

// What Rust's format!("{:?}", s) writes (checked with rustc): how the invalid_priority message
// quotes the refused text.
const RUST_DEBUG = [
  ["bogus", '"bogus"'],
  ["", '""'],
  ['a"b\\c\n\t\r\0', '"a\\"b\\\\c\\n\\t\\r\\0"'],
  ["\u0301x", '"\\u{301}x"'],
  ["x\u0301", '"x\\u{301}"'],
  ["\u00a0", '"\\u{a0}"'],
  ["\u200b", '"\\u{200b}"'],
  ["é", '"é"'],
  ["\x7f", '"\\u{7f}"'],
  ["\x85", '"\\u{85}"'],
  ["\u{1F600}", '"\u{1F600}"'],
  ["\ue000", '"\\u{e000}"'],
  ["\u0378", '"\\u{378}"'],
  ["\u2028", '"\\u{2028}"'],
  ["'", '"\'"'],
  ["\u00ad", '"\\u{ad}"'],
  ["\x1b", '"\\u{1b}"'],
  ["\u3000", '"\\u{3000}"'],
  ["\ufe0f", '"\\u{fe0f}"'],
  ["\u{1F3FB}", '"\u{1F3FB}"'],
  ["\u200d", '"\\u{200d}"'],
  ["\u0903", '"\u0903"'],
];

test("priority levels, and refused text quoted as Rust quotes it", { timeout: 90_000 }, () => {
  for (const [text, quoted] of RUST_DEBUG) assert.equal(rustDebug(text), quoted, JSON.stringify(text));
  assert.deepEqual([...PRIORITIES], ["high", "normal", "low"]);
  for (const p of PRIORITIES) assert.equal(checkPriority(p), p);
  assert.equal(checkPriority(undefined), "normal");
  assert.deepEqual(PRIORITIES.map(laneArg), ["high", "", "low"]);
  for (const [bad, message] of [
    ["bogus", 'invalid priority: "bogus" is not high, normal or low'],
    ["", 'invalid priority: "" is not high, normal or low'],
    ["Normal", 'invalid priority: "Normal" is not high, normal or low'],
    ["low\n", 'invalid priority: "low\\n" is not high, normal or low'],
    [1, "invalid priority: must be a string (high, normal or low), got number"],
    [new String("high"), "invalid priority: must be a string (high, normal or low), got object"],
  ]) {
    assert.throws(() => checkPriority(bad), (e) => {
      assert.equal(e.code, "invalid_priority");
      assert.equal(e.message, message);
      assert.equal(e.index, undefined);
      return true;
    });
  }
});
