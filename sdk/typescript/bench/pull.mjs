// Pull consumers over HTTP against the webhook path, on one `delayq serve` of its own (the
// binary of $DELAYQ_BIN, else target/debug/delayq) and a throwaway redis-server:
//
//   node bench/pull.mjs [orders=20000] [pullers=4] [max=100] [paths=webhook,pull]
//
// For each path, the queue's dispatch is paused, the orders are scheduled due now, then the
// queue is resumed and the clock runs until every order was handled: acked by the pullers
// (`:receive` with `max` and a long poll, then one `:ack` of the whole batch), or received
// by a local HTTP endpoint answering 200 (the webhook group, concurrency 64). Both figures
// include the dispatch. Prints one JSON line per path, with where the time went: CPU per order
// of redis-server, serve and this Node process (from /proc and `process.cpuUsage`, so the
// figures hold on a loaded machine too), and Redis commands and their time per order (`INFO
// commandstats`).

import { readFileSync } from "node:fs";
import http from "node:http";
import { Client, Consumer } from "../dist/index.js";
import { LocalRedis, Serve, createQueue } from "../test/support/harness.js";

const args = process.argv.slice(2);
const [orders = 20000, pullers = 4, max = 100] = args.slice(0, 3).map(Number);
const paths = (args[3] ?? "webhook,pull").split(",");
const TOKEN = "bench-pull-token-0001";

const hits = { n: 0, done: null, want: orders, at: {} };
const receiver = http.createServer((req, res) => {
  req.resume();
  req.on("end", () => {
    res.writeHead(200).end();
    hits.n++;
    for (const f of [0.5, 0.9, 0.99]) if (hits.n === Math.ceil(hits.want * f)) hits.at[f] = performance.now();
    if (hits.n === hits.want) hits.done?.();
  });
});
await new Promise((r) => receiver.listen(0, "127.0.0.1", r));
const hook = `http://127.0.0.1:${receiver.address().port}/hook`;

const redis = await LocalRedis.start();
for (const q of ["bench-pull", "bench-hook"]) await createQueue(redis.url, q);
const serve = await Serve.start(`
redis_url = "${redis.url}"
namespace = "dq"
[http]
listen = "127.0.0.1:{port}"
tokens = ["${TOKEN}"]
[[handlers]]
queue = "bench-pull"
group = "pull"
kind = "pull"
[[handlers]]
queue = "bench-hook"
group = "hook"
kind = "webhook"
url = "${hook}"
concurrency = 64
`);
const client = await Client.connect(redis.url);

async function api(path) {
  const r = await fetch(`${serve.base}${path}`, { method: "POST", headers: { authorization: `Bearer ${TOKEN}` } });
  if (!r.ok) throw new Error(`${path}: ${r.status} ${await r.text()}`);
}

/** A process's CPU time so far (user + system, all threads), ms. */
function cpuMs(pid) {
  const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ");
  return ((Number(f[11]) + Number(f[12])) * 1000) / 100; // utime, stime in clock ticks (USER_HZ = 100)
}

/** Redis' calls and time (µs) by command so far. */
async function commandCalls() {
  const text = await redis.cmd("INFO", "commandstats");
  const out = {};
  const usec = {};
  for (const m of text.matchAll(/^cmdstat_([^:]+):calls=(\d+),usec=(\d+)/gm)) {
    out[m[1]] = Number(m[2]);
    usec[m[1]] = Number(m[3]);
  }
  return { out, usec };
}

/** What the measured part cost, per order: CPU µs of each process, Redis calls by command. */
async function costs() {
  const node = process.cpuUsage();
  return { redis: cpuMs(redis.child.pid), serve: cpuMs(serve.child.pid), node: (node.user + node.system) / 1000, node_kernel: node.system / 1000, calls: await commandCalls() };
}

function perOrder(before, after) {
  const us = (k) => Math.round(((after[k] - before[k]) * 1000) / orders);
  const per = (field, min, digits) =>
    Object.entries(after.calls[field])
      .map(([c, n]) => [c, (n - (before.calls[field][c] ?? 0)) / orders])
      .filter(([, n]) => n >= min)
      .sort((a, b) => b[1] - a[1])
      .map(([c, n]) => `${c}=${n.toFixed(digits)}`)
      .join(" ");
  // Redis' own time per command (a script's time includes its inner calls, which count
  // again under their names).
  return { cpu_us_per_order: { redis: us("redis"), serve: us("serve"), node: us("node"), of_which_node_kernel: us("node_kernel") }, redis_calls_per_order: per("out", 0.005, 2), redis_us_per_order: per("usec", 0.05, 1) };
}

async function load(queue) {
  await api(`/v1/queues/${queue}:pause`);
  for (let i = 0; i < orders; i += 5000) {
    const n = Math.min(5000, orders - i);
    await client.scheduleMany(queue, Array.from({ length: n }, (_, k) => ({ id: `o${i + k}`, delayMs: 0, payload: { n: i + k } })));
  }
}

try {
  if (paths.includes("webhook")) {
    await load("bench-hook");
    const hooked = new Promise((r) => (hits.done = r));
    const before = await costs();
    const t0 = performance.now();
    await api("/v1/queues/bench-hook:resume");
    await hooked;
    const hookMs = performance.now() - t0;
    const spent = perOrder(before, await costs());
    const upTo = Object.fromEntries(Object.entries(hits.at).map(([f, t]) => [`ms_to_${Math.round(Number(f) * 100)}pct`, Math.round(t - t0)]));
    console.log(JSON.stringify({ path: "webhook", orders, concurrency: 64, ms: Math.round(hookMs), per_s: Math.round(orders / (hookMs / 1000)), ...upTo, ...spent }));
  }
  if (paths.includes("pull")) await pull();
} finally {
  await client.close();
  await serve.stop();
  await redis.stop();
  receiver.close();
}

async function pull() {
  await load("bench-pull");
  const c = new Consumer({ baseUrl: serve.base, token: TOKEN, queue: "bench-pull", group: "pull", leaseMs: 60_000, timeoutMs: 30_000 });
  let acked = 0;
  let receives = 0;
  // The clock stops when the last order is acked, not when the other pullers' long polls
  // (then waiting for orders that will not come) run out.
  let doneAt = 0;
  let doneCosts = null;
  const loop = async () => {
    while (acked < orders) {
      const got = await c.receive(max, 60_000, 1000);
      receives++;
      if (got.length > 0) {
        await c.ack(got);
        acked += got.length;
        if (acked >= orders && doneAt === 0) {
          doneAt = performance.now();
          doneCosts = await costs();
        }
      }
    }
  };
  const before = await costs();
  const t0 = performance.now();
  await api("/v1/queues/bench-pull:resume");
  await Promise.all(Array.from({ length: pullers }, loop));
  const pullMs = doneAt - t0;
  const spent = perOrder(before, doneCosts);
  console.log(JSON.stringify({ path: "pull", orders, pullers, max, receives, ms: Math.round(pullMs), per_s: Math.round(orders / (pullMs / 1000)), ...spent }));
}
