// Issue 45's first test, scaled to run in seconds: orders due now, three Python consumer
// processes (concurrency 8 each) and one TypeScript consumer process on one pull group of a
// real `delayq serve`, one Python consumer SIGKILLed mid-way. Every order is handled at least
// once, duplicates come only from the killed consumer's leases, everything is acked, and the
// group's pending list is empty at the end.
//
// Each consumer writes "<id> <attempt>" to its own file when its handler runs (before the
// ack), so a line of the killed process may stand for an order it never acked: that order
// comes back to another consumer once the lease (5 s) runs out.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";
import { Client } from "../dist/index.js";
import { LocalRedis, Serve, createQueue, waitFor } from "./support/harness.js";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const PY_SRC = path.resolve(HERE, "../../python/src");
const DIST = pathToFileURL(path.resolve(HERE, "../dist/index.js")).href;
const TOKEN = "consumers-together-token-5521";
const QUEUE = "pull-many";
const GROUP = "close";
const ORDERS = 2000;
// The Python of the SDK's CI venv when there is one (a full standard library), else python3.
const VENV_PY = path.resolve(HERE, "../../../target/sdk-python-venv/bin/python");
const PYTHON = process.env.DELAYQ_PYTHON || (fs.existsSync(VENV_PY) ? VENV_PY : "python3");

// The Python consumer as a process: only consumer.py and errors.py of the package are
// loaded (a bare package module stands for `delayq`, so no Redis client library is needed).
const PY = `
import signal, sys, threading, types
src, base, token, queue, group, out = sys.argv[1:7]
pkg = types.ModuleType("delayq"); pkg.__path__ = [src + "/delayq"]; sys.modules["delayq"] = pkg
from delayq.consumer import Consumer
f = open(out, "a", buffering=1)
lock = threading.Lock()
def handle(d):
    with lock:
        f.write(f"{d.id} {d.attempt}\\n")
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: stop.set())
Consumer(base, token, queue, group, lease_ms=5000).run(handle, concurrency=8, stop=stop, wait_ms=1000, grace=5)
`;

const TS = `
import fs from "node:fs";
const { Consumer } = await import(process.argv[1]);
const [base, token, queue, group, out] = process.argv.slice(2);
const f = fs.openSync(out, "a");
const stop = new AbortController();
process.once("SIGTERM", () => stop.abort());
await new Consumer({ baseUrl: base, token, queue, group, leaseMs: 5000 }).run(
  async (d) => { fs.writeSync(f, d.id + " " + d.attempt + "\\n"); },
  { concurrency: 8, signal: stop.signal, waitMs: 1000, graceMs: 5000, onError: () => {} },
);
`;

let redis;
let serve;
let client;
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "delayq-consumers-"));

before(async () => {
  redis = await LocalRedis.start();
  await createQueue(redis.url, QUEUE);
  serve = await Serve.start(`
redis_url = "${redis.url}"
namespace = "dq"
[http]
listen = "127.0.0.1:{port}"
tokens = ["${TOKEN}"]
[[handlers]]
queue = "${QUEUE}"
group = "${GROUP}"
kind = "pull"
`);
  client = await Client.connect(redis.url);
});

after(async () => {
  await client?.close();
  await serve?.stop();
  await redis?.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

/** Lines "<id> <attempt>" written by a consumer so far. */
function lines(file) {
  if (!fs.existsSync(file)) return [];
  return fs.readFileSync(file, "utf8").split("\n").filter((l) => l.length > 0);
}

function start(kind, i) {
  const out = path.join(dir, `${kind}-${i}.txt`);
  const args = kind === "py"
    ? [PYTHON, ["-c", PY, PY_SRC, serve.base, TOKEN, QUEUE, GROUP, out]]
    : [process.execPath, ["--input-type=module", "-e", TS, DIST, serve.base, TOKEN, QUEUE, GROUP, out]];
  const child = spawn(args[0], args[1], { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (b) => (stderr += b));
  const exited = new Promise((resolve) => child.on("exit", (code, sig) => resolve({ code, sig, stderr: () => stderr })));
  return { child, out, exited };
}

/** The group's pending entries over the queue's one shard's three lanes. */
async function pending() {
  let n = 0;
  for (const lane of ["", "high:", "low:"]) {
    const key = `{dq:${QUEUE}:0}:${lane}stream`;
    if ((await redis.cmd("EXISTS", key)) === 0) continue;
    n += Number((await redis.cmd("XPENDING", key, GROUP))[0]);
  }
  return n;
}

test("three Python and one TypeScript consumer share a pull group; one is SIGKILLed mid-way", { timeout: 120_000 }, async () => {
  const ids = Array.from({ length: ORDERS }, (_, i) => `o${i}`);
  const consumers = [start("py", 0), start("py", 1), start("py", 2), start("ts", 0)];
  const victim = consumers[0];
  try {
    await client.scheduleMany(QUEUE, ids.map((id) => ({ id, delayMs: 0, payload: { id } })));
    // Mid-way: the victim has handled some, and not every order has been handled yet.
    await waitFor("the victim to handle 100 orders", () => lines(victim.out).length >= 100, 60_000);
    victim.child.kill("SIGKILL");
    const { sig } = await victim.exited;
    assert.equal(sig, "SIGKILL");
    const handled = () => new Set(consumers.flatMap((c) => lines(c.out)).map((l) => l.split(" ")[0]));
    assert.ok(handled().size < ORDERS, "every order was handled before the kill: not mid-way");
    await waitFor("every order handled and acked", async () => handled().size === ORDERS && (await pending()) === 0, 90_000, 100);
  } finally {
    for (const c of consumers.slice(1)) c.child.kill("SIGTERM");
    for (const c of consumers.slice(1)) {
      const r = await c.exited;
      assert.equal(r.code, 0, `a consumer exited ${r.code} ${r.sig}: ${r.stderr()}`);
    }
  }
  // At least once, and duplicates only for orders the killed consumer had.
  const victimIds = new Set(lines(victim.out).map((l) => l.split(" ")[0]));
  const counts = new Map();
  for (const c of consumers) for (const l of lines(c.out)) {
    const id = l.split(" ")[0];
    counts.set(id, (counts.get(id) ?? 0) + 1);
  }
  assert.deepEqual([...counts.keys()].sort(), [...ids].sort());
  const dups = [...counts].filter(([, n]) => n > 1).map(([id]) => id);
  assert.deepEqual(dups.filter((id) => !victimIds.has(id)), [], "a duplicate not from the killed consumer's leases");
  // Every consumer took part.
  for (const c of consumers) assert.ok(lines(c.out).length > 0, `${c.out} handled nothing`);
  assert.equal(await pending(), 0);
});
