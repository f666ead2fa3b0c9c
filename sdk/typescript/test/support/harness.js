// Test support: throwaway redis-server processes on free ports in temp dirs, the delayq
// binary, `delayq serve`, a webhook receiver, and bounded waits (no fixed sleeps).

import { spawn, execFile } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync, readFileSync, existsSync, openSync, closeSync } from "node:fs";
import { createServer } from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Redis } from "ioredis";

const here = path.dirname(fileURLToPath(import.meta.url));
/** sdk/typescript. */
export const PKG_DIR = path.resolve(here, "../..");
/** The repository's root. */
export const REPO = path.resolve(PKG_DIR, "../..");
/** The delayq binary: $DELAYQ_BIN, else <repo>/target/debug/delayq. */
export const BIN = process.env.DELAYQ_BIN || path.join(REPO, "target/debug/delayq");

/** Every process the tests started: stopped when the test process ends, however it ends. */
const children = new Set();
const dirs = new Set();
/** A temp dir, removed when the test process ends if nothing removed it before. */
function tempDir(prefix) {
  const d = mkdtempSync(path.join(os.tmpdir(), prefix));
  dirs.add(d);
  return d;
}
function track(child) {
  children.add(child);
  child.once("exit", () => children.delete(child));
  return child;
}
process.once("exit", () => {
  for (const c of children) c.kill("SIGKILL");
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});
for (const sig of ["SIGINT", "SIGTERM"]) {
  process.once(sig, () => process.exit(1));
}

/** A free TCP port on 127.0.0.1. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/**
 * Waits until `check()` returns a truthy value (awaited), polling every `every` ms; fails
 * naming `what` after `within` ms. Returns that value.
 */
export async function waitFor(what, check, within = 20_000, every = 20) {
  const deadline = Date.now() + within;
  let last;
  for (;;) {
    try {
      const v = await check();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${within} ms waiting for ${what}${last ? `: ${last.message}` : ""}`);
    }
    await new Promise((r) => setTimeout(r, every));
  }
}

/** Resolves when `child` exits (at most `within` ms, then it is killed). */
export function exited(child, within = 15_000) {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(child.exitCode);
  return new Promise((resolve) => {
    const t = setTimeout(() => {
      child.kill("SIGKILL");
    }, within);
    child.once("exit", (code) => {
      clearTimeout(t);
      resolve(code);
    });
  });
}

/** A throwaway redis-server (its own port and temp dir, no persistence). */
export class LocalRedis {
  /** Starts one (a few tries: another process may take the free port first). */
  static async start(extra = []) {
    for (let attempt = 1; ; attempt++) {
      try {
        return await LocalRedis.startOnce(extra);
      } catch (e) {
        if (attempt >= 3) throw e;
      }
    }
  }
  static async startOnce(extra) {
    const port = await freePort();
    const dir = tempDir("delayq-ts-redis-");
    const child = track(spawn(
      "redis-server",
      [
        "--port", String(port), "--bind", "127.0.0.1", "--dir", dir, "--save", "",
        "--appendonly", "no", "--logfile", path.join(dir, "redis.log"), ...extra,
      ],
      { stdio: "ignore" },
    ));
    const r = new LocalRedis(port, dir, child);
    try {
      await waitFor(`redis-server on port ${port}`, async () => {
        if (child.exitCode !== null) throw new Error(`redis-server exited: ${r.log()}`);
        return (await r.cmd("PING")) === "PONG";
      }, 15_000);
    } catch (e) {
      await r.stop();
      throw e;
    }
    return r;
  }
  constructor(port, dir, child) {
    this.port = port;
    this.dir = dir;
    this.child = child;
    this.url = `redis://127.0.0.1:${port}`;
  }
  log() {
    try {
      return readFileSync(path.join(this.dir, "redis.log"), "utf8").slice(-2000);
    } catch {
      return "";
    }
  }
  /** One command on a short-lived connection. */
  async cmd(...args) {
    // A reply timeout too: a port taken by another process that accepts and never answers
    // (a test's stalled receiver, say) fails the check instead of hanging the suite.
    const c = new Redis({ port: this.port, host: "127.0.0.1", lazyConnect: true, retryStrategy: () => null, maxRetriesPerRequest: 0, connectTimeout: 2000, commandTimeout: 2000 });
    c.on("error", () => {});
    try {
      await c.connect();
      return await c.call(...args);
    } finally {
      c.disconnect();
    }
  }
  /** A connection for the test's own inspection. */
  async connect() {
    const c = new Redis({ port: this.port, host: "127.0.0.1", lazyConnect: true, connectTimeout: 5000, commandTimeout: 30_000 });
    c.on("error", () => {});
    await c.connect();
    return c;
  }
  async stop() {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      this.child.kill("SIGTERM");
      await exited(this.child);
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** Runs the delayq binary; resolves with its exit code and output (30 s at most). */
export function delayq(args, { env = {}, timeout = 30_000 } = {}) {
  return new Promise((resolve) => {
    const e = { ...process.env, ...env };
    delete e.DELAYQ_REDIS_URL;
    delete e.DELAYQ_NAMESPACE;
    execFile(BIN, args, { env: { ...e, ...env }, timeout, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === "number" ? err.code : -1) : 0, stdout, stderr });
    });
  });
}

/** `delayq queue create` (fails the test when it fails). */
export async function createQueue(url, queue, shards = 1, namespace = "dq") {
  const r = await delayq(["--redis-url", url, "--namespace", namespace, "queue", "create", queue, "--shards", String(shards)]);
  if (r.code !== 0) throw new Error(`delayq queue create ${queue} failed (${r.code}): ${r.stderr}`);
  if (url.startsWith("redis://")) {
    const c = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, connectTimeout: 5000, commandTimeout: 30_000 });
    c.on("error", () => {});
    try {
      await c.connect();
      if ((await c.hget(`{${namespace}}:queue:${queue}`, "epoch")) === null) {
        throw new Error(`${BIN} created queue ${queue} without an epoch: it predates the enqueue contract of issue 22 (lua/enqueue.lua with the shard's meta key); build it from the current tree or set DELAYQ_BIN`);
      }
    } finally {
      c.disconnect();
    }
  }
  return r;
}

/** A tiny webhook receiver: records every body (raw text) and resolves waits on ids. */
export class Receiver {
  static async start() {
    const r = new Receiver();
    await new Promise((resolve) => r.server.listen(0, "127.0.0.1", resolve));
    r.port = r.server.address().port;
    r.url = `http://127.0.0.1:${r.port}/hook`;
    return r;
  }
  constructor() {
    /** Raw bodies, in arrival order. */
    this.bodies = [];
    this.waiters = [];
    this.server = createServer((req, res) => {
      const chunks = [];
      req.on("data", (c) => chunks.push(c));
      req.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        this.bodies.push(text);
        res.writeHead(200, { "content-type": "text/plain" });
        res.end("ok");
        for (const w of [...this.waiters]) w();
      });
    });
  }
  /** The parsed bodies (the payload also as its raw text: see `rawPayload`). */
  ids() {
    return this.bodies.map((b) => JSON.parse(b).id);
  }
  /** Resolves with the raw body of order `id` once it arrives (fails after `within` ms). */
  waitFor(id, within = 30_000) {
    const find = () => this.bodies.find((b) => JSON.parse(b).id === id);
    const got = find();
    if (got) return Promise.resolve(got);
    return new Promise((resolve, reject) => {
      const w = () => {
        const b = find();
        if (b) {
          clearTimeout(t);
          this.waiters = this.waiters.filter((x) => x !== w);
          resolve(b);
        }
      };
      const t = setTimeout(() => {
        this.waiters = this.waiters.filter((x) => x !== w);
        reject(new Error(`webhook for ${id} not received within ${within} ms (got ${JSON.stringify(this.ids())})`));
      }, within);
      this.waiters.push(w);
    });
  }
  close() {
    this.server.closeAllConnections?.();
    return new Promise((r) => this.server.close(() => r()));
  }
}

/**
 * The payload's raw JSON text inside a webhook body `{"queue","id","group","due_at_ms",
 * "payload":<raw>,"attempt":n}` (serde writes the fields in that order, compactly).
 */
export function rawPayload(body) {
  const start = body.indexOf(',"payload":');
  const end = body.lastIndexOf(',"attempt":');
  if (start < 0 || end < start) throw new Error(`unexpected webhook body: ${body.slice(0, 200)}`);
  return body.slice(start + ',"payload":'.length, end);
}

/** A running `delayq serve --config FILE`. */
export class Serve {
  /** Starts one (a few tries: another process may take the free port first). */
  static async start(configText) {
    for (let attempt = 1; ; attempt++) {
      try {
        return await Serve.startOnce(configText);
      } catch (e) {
        if (attempt >= 3) throw e;
      }
    }
  }
  static async startOnce(configText) {
    const dir = tempDir("delayq-ts-serve-");
    const port = await freePort();
    const cfg = path.join(dir, "delayq.toml");
    writeFileSync(cfg, configText.replaceAll("{port}", String(port)));
    const env = { ...process.env, RUST_LOG: "info" };
    delete env.DELAYQ_REDIS_URL;
    delete env.DELAYQ_NAMESPACE;
    const log = openSync(path.join(dir, "serve.log"), "w");
    const child = track(spawn(BIN, ["serve", "--config", cfg], { env, stdio: ["ignore", "ignore", log] }));
    closeSync(log);
    const s = new Serve(dir, port, child);
    try {
      await waitFor("delayq serve to answer /readyz", async () => {
        if (child.exitCode !== null) throw new Error(`serve exited with ${child.exitCode}: ${s.log()}`);
        // A timeout on each try: a connection made while serve starts may never be answered.
        const r = await fetch(`${s.base}/readyz`, { signal: AbortSignal.timeout(2000) }).catch(() => null);
        return r !== null && r.status === 200;
      }, 60_000, 50);
    } catch (e) {
      await s.stop();
      throw e;
    }
    return s;
  }
  constructor(dir, port, child) {
    this.dir = dir;
    this.port = port;
    this.child = child;
    this.base = `http://127.0.0.1:${port}`;
  }
  log() {
    const f = path.join(this.dir, "serve.log");
    return existsSync(f) ? readFileSync(f, "utf8").slice(-4000) : "";
  }
  /** GET /v1/queues/<q>/messages/<id>: [status, body]. */
  async message(queue, id) {
    const r = await fetch(`${this.base}/v1/queues/${encodeURIComponent(queue)}/messages/${encodeURIComponent(id)}`);
    return [r.status, await r.text()];
  }
  async stop() {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      this.child.kill("SIGTERM");
      await exited(this.child, 15_000);
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}
