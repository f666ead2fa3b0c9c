// Enqueue rate: 100,000 orders in scheduleMany calls of 500 (and of 10,000), on a
// redis-server this script starts (free port, temp dir), one shard and four.
// Usage: npm run build && node bench/enqueue.mjs   (DELAYQ_BIN: the delayq binary)

import { Client } from "../dist/index.js";
import { LocalRedis, createQueue } from "../test/support/harness.js";

const TOTAL = 100_000;
const redis = await LocalRedis.start();
try {
  for (const shards of [1, 4]) {
    for (const batch of [500, 10_000]) {
      const queue = `bench-${shards}-${batch}`;
      await createQueue(redis.url, queue, shards);
      const client = await Client.connect(redis.url);
      await redis.cmd("CONFIG", "RESETSTAT");
      const t0 = performance.now();
      for (let start = 0; start < TOTAL; start += batch) {
        const orders = [];
        for (let i = start; i < start + batch; i++) {
          orders.push({ id: `order-${i}`, delayMs: 3_600_000, payload: { order: i, user: 42 } });
        }
        const out = await client.scheduleMany(queue, orders);
        if (out.length !== batch) throw new Error("short batch");
      }
      const secs = (performance.now() - t0) / 1000;
      // Time Redis spent running enqueue.lua, of the whole.
      const stats = await redis.cmd("INFO", "commandstats");
      const usec = Number(/^cmdstat_evalsha:calls=(\d+),usec=(\d+)/m.exec(stats)?.[2] ?? 0);
      const calls = Number(/^cmdstat_evalsha:calls=(\d+)/m.exec(stats)?.[1] ?? 0);
      console.log(JSON.stringify({
        shards, batch, orders: TOTAL, seconds: Number(secs.toFixed(3)),
        orders_per_second: Math.round(TOTAL / secs),
        enqueue_calls: calls, redis_script_seconds: Number((usec / 1e6).toFixed(3)),
      }));
      await client.close();
    }
  }
} finally {
  await redis.stop();
}
