// Durable writes on a master + replica (two redis-servers, REPLICAOF): WAIT goes in the same
// pipeline right after the enqueue calls, on the connection that made them; fewer acks than
// asked (the replica stopped) or a connection broken before WAIT answered is not-replicated.

import assert from "node:assert/strict";
import net from "node:net";
import { after, before, test } from "node:test";
import { Client, NotReplicatedError, SCRIPTS } from "../dist/index.js";
import { LocalRedis, createQueue, exited, waitFor } from "./support/harness.js";

/** MONITOR on a raw socket: pushes {cmd, source, args} for every command the server runs. */
function monitor(port, seen) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, "127.0.0.1", () => sock.write("MONITOR\r\n"));
    let buf = "";
    sock.setEncoding("utf8");
    sock.on("error", reject);
    sock.on("data", (d) => {
      buf += d;
      let nl;
      while ((nl = buf.indexOf("\r\n")) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 2);
        if (line === "+OK") resolve(sock);
        const m = /^\+\d+\.\d+ \[\d+ ([^\]]+)\] (.*)$/.exec(line);
        if (!m) continue;
        const args = [...m[2].matchAll(/"((?:[^"\\]|\\.)*)"/g)].map((a) => a[1]);
        seen.push({ cmd: String(args[0]).toLowerCase(), source: m[1], args });
      }
    });
  });
}

let master;
let replica;
let client;

before(async () => {
  // No delay before the first full sync (diskless sync waits 5 s for more replicas by default).
  master = await LocalRedis.start(["--repl-diskless-sync-delay", "0"]);
  replica = await LocalRedis.start(["--replicaof", "127.0.0.1", String(master.port)]);
  await waitFor("the replica to be in sync", async () => {
    const m = await master.cmd("INFO", "replication");
    const r = await replica.cmd("INFO", "replication");
    return /connected_slaves:1/.test(m) && /master_link_status:up/.test(r);
  }, 20_000);
  await createQueue(master.url, "durable", 2);
  client = await Client.connect(master.url);
});

after(async () => {
  await client?.close();
  await replica?.stop();
  await master?.stop();
});

test("a durable schedule waits for the replica, in the same pipeline as its writes", { timeout: 90_000 }, async () => {
  const seen = [];
  const mon = await monitor(master.port, seen);
  try {
    const d = client.withDurability({ replicas: 1, timeoutMs: 5000 });
    const orders = Array.from({ length: 1200 }, (_, i) => ({ id: `d-${i}`, delayMs: 600_000, payload: { i } }));
    const out = await d.scheduleMany("durable", orders);
    assert.ok(out.every((r) => r.outcome === "created"));
    assert.equal((await d.schedule("durable", { id: "d-one", delayMs: 600_000 })).outcome, "created");
    // The replica has them.
    const onReplica = await replica.cmd("ZCARD", "{dq:durable:0}:due");
    const onMaster = await master.cmd("ZCARD", "{dq:durable:0}:due");
    assert.equal(onReplica, onMaster);
    await waitFor("MONITOR to show the WAITs", () => seen.filter((s) => s.cmd === "wait").length >= 2, 10_000);
    // Each WAIT follows its batch's EVALSHAs on the same connection, nothing between them.
    const waits = seen.map((s, i) => [s, i]).filter(([s]) => s.cmd === "wait");
    const [firstWait, at] = waits[0];
    assert.deepEqual(firstWait.args.slice(1), ["1", "5000"]);
    const fromSame = seen.slice(0, at).filter((s) => s.source === firstWait.source);
    const evals = fromSame.filter((s) => s.cmd === "evalsha" && s.args[1] === SCRIPTS.enqueue.sha);
    // 1,200 orders in two shards: at least three calls, all before the WAIT.
    assert.ok(evals.length >= 3, `only ${evals.length} enqueue calls before WAIT`);
    const last = fromSame[fromSame.length - 1];
    assert.equal(last.cmd, "evalsha", "something other than the enqueue calls came before WAIT");
  } finally {
    mon.destroy();
  }
  // Leader durability sends no WAIT.
  const n = seen.length;
  await client.schedule("durable", { id: "leader-1", delayMs: 600_000 });
  assert.ok(seen.slice(n).every((s) => s.cmd !== "wait"));
});

test("a connection broken while WAIT blocks reports not-replicated", { timeout: 90_000 }, async () => {
  // WAIT for two replicas (there is one) blocks until its timeout: kill the connection first.
  const d = client.withDurability({ replicas: 2, timeoutMs: 30_000 });
  const p = d.schedule("durable", { id: "killed-1", delayMs: 600_000 });
  p.catch(() => {}); // checked below
  const id = await waitFor("the WAIT to block", async () => {
    const list = await master.cmd("CLIENT", "LIST");
    // Blocked (flags has b) in WAIT right now.
    const line = list.split("\n").find((l) => / flags=[A-Za-z]*b[A-Za-z]* /.test(l) && / cmd=wait\b/.test(l));
    return line ? /\bid=(\d+)/.exec(line)[1] : null;
  }, 10_000);
  await master.cmd("CLIENT", "KILL", "ID", id);
  await assert.rejects(p, (e) => {
    assert.ok(e instanceof NotReplicatedError, `${e.name}: ${e.message}`);
    assert.equal(e.acked, 0);
    assert.equal(e.code, "not_replicated");
    assert.equal(e.writeOutcome, "unknown");
    return true;
  });
  // It reached the leader (and may still fire).
  assert.ok(await client.get("durable", "killed-1"));
  // The next durable schedule opens a new connection.
  const ok = client.withDurability({ replicas: 1, timeoutMs: 5000 });
  assert.equal((await ok.schedule("durable", { id: "after-kill", delayMs: 600_000 })).outcome, "created");
});

test("with the replica stopped, a durable schedule reports not-replicated", { timeout: 90_000 }, async () => {
  replica.child.kill("SIGTERM");
  await exited(replica.child);
  const d = client.withDurability({ replicas: 1, timeoutMs: 300 });
  await assert.rejects(d.schedule("durable", { id: "lonely", delayMs: 600_000, payload: { x: 1 } }), (e) => {
    assert.ok(e instanceof NotReplicatedError, `${e.name}: ${e.message}`);
    assert.equal(e.code, "not_replicated");
    assert.equal(e.acked, 0);
    assert.equal(e.wanted, 1);
    assert.equal(e.timeoutMs, 300);
    return true;
  });
  // Written on the leader all the same: repeating it is safe.
  assert.equal((await client.get("durable", "lonely")).payloadJson, '{"x":1}');
  await assert.rejects(
    d.scheduleMany("durable", Array.from({ length: 600 }, (_, i) => ({ id: `l-${i}`, delayMs: 600_000 }))),
    (e) => e instanceof NotReplicatedError && e.acked === 0,
  );
  // Leader durability still succeeds.
  assert.equal((await client.schedule("durable", { id: "lonely", delayMs: 600_000 })).outcome, "updated");
});
