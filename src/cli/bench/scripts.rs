//! The `scripts` scenario: what one call of each hot-path script costs Redis, by batch size.
//!
//! For each batch size (1, 10, 100, 1,000 orders per call, plus an empty call) it runs
//! `dequeue.lua` on shard 0 of the bench queue until the due orders are gone, then `read.lua`
//! on the same shard's stream until it is read, and reports, from `INFO commandstats`
//! around each, the Redis time per call and per order and the Lua interpreter's part of it
//! (the script's time less the commands it ran). The fixed cost per call is what a sharded
//! queue pays once per shard and pass, so this is where the 8-shard figures come from.

use super::measure::{command_stats, stat_delta};
use super::{BenchOptions, BenchReport, QUEUE, enqueue_all, payload};
use crate::engine::flow::QueueWatch;
use crate::engine::keys::{QueueName, shard_of};
use crate::engine::reply::entries_of;
use crate::engine::scripts;
use crate::{Client, Delivery, HandlerResult, NewOrder, When, Worker, WorkerOptions};
use std::fmt::Write as _;

/// Batch sizes measured (orders per call).
const BATCHES: [usize; 4] = [1, 10, 100, 1000];

/// Orders moved per batch size (capped by `--orders`): enough calls at every size for
/// `commandstats` microsecond totals to mean something.
const ORDERS_PER_SIZE: usize = 20_000;

/// Calls of a script on a shard with nothing to do.
const EMPTY_CALLS: usize = 5_000;

/// One measured row.
struct Row {
    /// Orders asked for per call (0: the empty call).
    batch: usize,
    calls: usize,
    /// Orders the calls moved or read.
    orders: usize,
    /// Redis time in the script calls, µs.
    script_us: f64,
    /// Of it, the interpreter's (less the commands the scripts ran), µs.
    interp_us: f64,
}

impl Row {
    fn line(&self, script: &str) -> String {
        let calls = self.calls.max(1) as f64;
        let per_order = if self.orders == 0 {
            String::new()
        } else {
            format!(", {:.2} µs per order", self.script_us / self.orders as f64)
        };
        format!(
            "{script} batch {}: {} calls, {:.1} µs per call (interpreter {:.1}){per_order}",
            self.batch,
            self.calls,
            self.script_us / calls,
            self.interp_us / calls
        )
    }
}

/// Runs the scenario; the figures are in the report's notes, one line per script and size.
pub(super) async fn scripts(client: &Client, opts: &BenchOptions) -> anyhow::Result<BenchReport> {
    let queue = QueueName::new(QUEUE)?;
    let keys = client.keyspace().shard(&queue, 0);
    let history = QueueWatch::new(queue.clone(), None)
        .flags(client)
        .await?
        .history;
    let hgetdel = client.server().is_some_and(|s| s.has_hgetdel());
    let worker = Worker::new(
        client,
        QUEUE,
        "bench",
        |_d: Delivery| async { HandlerResult::Ok(()) },
        WorkerOptions::default(),
    )?;
    worker.ensure_groups().await?;
    let conn = client.connection();
    let mut rows: Vec<(&str, Row)> = Vec::new();
    let mut seq = 0usize;

    // Nothing due, nothing new: the floor every call pays.
    let now = client.now_ms();
    let (deq, read) = (
        measure(client, 0, || async {
            for _ in 0..EMPTY_CALLS {
                scripts::orders::dequeue(&mut conn.clone(), &keys, now, 1, &history, hgetdel)
                    .await?;
            }
            Ok((EMPTY_CALLS, 0))
        })
        .await?,
        measure(client, 0, || async {
            for _ in 0..EMPTY_CALLS {
                scripts::consume::read(&mut conn.clone(), &keys, "bench", "c", 1, now).await?;
            }
            Ok((EMPTY_CALLS, 0))
        })
        .await?,
    );
    rows.push(("dequeue.lua", deq));
    rows.push(("read.lua", read));

    for batch in BATCHES {
        let n = ORDERS_PER_SIZE.min(opts.orders).max(batch);
        // Only orders whose id hashes to shard 0 land where the calls look.
        let mut orders = Vec::with_capacity(n);
        let now = client.now_ms();
        while orders.len() < n {
            let id = format!("s-{seq}");
            seq += 1;
            if shard_of(&id, opts.shards) != 0 {
                continue;
            }
            let due = now - 1;
            orders.push(NewOrder::new(
                id,
                When::at_ms(due),
                payload(opts.payload_bytes, seq, due),
            ));
        }
        enqueue_all(client, &orders).await?;
        let now = client.now_ms();
        rows.push((
            "dequeue.lua",
            measure(client, batch, || async {
                let (mut calls, mut moved) = (0, 0);
                loop {
                    let r = scripts::orders::dequeue(
                        &mut conn.clone(),
                        &keys,
                        now,
                        batch,
                        &history,
                        hgetdel,
                    )
                    .await?;
                    calls += 1;
                    moved += r.moved;
                    if r.moved < batch {
                        return Ok((calls, moved));
                    }
                }
            })
            .await?,
        ));
        let lease = client.now_ms() + 600_000;
        rows.push((
            "read.lua",
            measure(client, batch, || async {
                let (mut calls, mut read) = (0, 0);
                loop {
                    let r = scripts::consume::read(
                        &mut conn.clone(),
                        &keys,
                        "bench",
                        "c",
                        batch,
                        lease,
                    )
                    .await?;
                    calls += 1;
                    let got = entries_of(r.entries)?.len();
                    read += got;
                    if got < batch {
                        return Ok((calls, read));
                    }
                }
            })
            .await?,
        ));
    }
    let mut notes = String::from(
        "one script call at a time on shard 0 (no pipelining); Redis time from INFO commandstats, \
         interpreter = script time less the commands it ran:",
    );
    for (script, row) in &rows {
        let _ = write!(notes, "\n  {}", row.line(script));
    }
    Ok(BenchReport {
        scenario: "scripts".into(),
        n: rows.iter().map(|(_, r)| r.orders).sum(),
        notes,
        ..Default::default()
    })
}

/// Runs `calls` (which returns the script calls it made and the orders they moved or read)
/// between two `commandstats` readings. Nothing but the scripts (and `INFO`) runs meanwhile,
/// so every other command counted ran inside them.
async fn measure<F, Fut>(client: &Client, batch: usize, calls: F) -> anyhow::Result<Row>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = crate::Result<(usize, usize)>>,
{
    let before = command_stats(client).await?;
    let (calls, orders) = calls().await?;
    let after = command_stats(client).await?;
    let diff = |k: &str| stat_delta(&before, &after, k).1;
    let script_us = diff("evalsha") + diff("evalsha_ro");
    let inner: f64 = after
        .keys()
        .filter(|k| !matches!(k.as_str(), "evalsha" | "evalsha_ro" | "info"))
        .map(|k| diff(k))
        .sum();
    Ok(Row {
        batch,
        calls,
        orders,
        script_us,
        interp_us: (script_us - inner).max(0.0),
    })
}
