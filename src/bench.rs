//! `delayq bench`: measures delayq on a Redis of the user's choosing.
//!
//! Scenarios:
//! - `enqueue`: `schedule_many` throughput (orders due in an hour, nothing consumes them);
//! - `dispatch`: orders all already due, drained by one dispatcher: orders/s moved into the
//!   stream;
//! - `steady`: a producer schedules at a fixed rate, each order due `lead` after it is
//!   scheduled; one dispatcher and one worker group; reports the handler's lateness
//!   (handler start − due time, on the Redis clock) p50/p90/p99/max.
//!
//! Everything runs in a namespace of its own (`dq-bench-<pid>`), removed at the end; nothing
//! else in the Redis is touched.

use crate::{
    Client, ClientOptions, Delivery, Dispatcher, DispatcherOptions, Mode, NewOrder, Payload, When,
    Worker, WorkerOptions,
};
use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "bench";

/// Options of a run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Orders in the run.
    pub orders: usize,
    /// Orders per `schedule_many` call.
    pub batch: usize,
    /// For `steady`: orders scheduled per second.
    pub rate: u64,
    /// For `steady`: delay between scheduling an order and its due time.
    pub lead: Duration,
    /// Payload size in bytes (approximate, JSON).
    pub payload_bytes: usize,
    /// Worker concurrency.
    pub concurrency: usize,
}

/// The result of one scenario (printed as one JSON line).
#[derive(Debug, Clone, Serialize, Default)]
pub struct BenchReport {
    /// The scenario.
    pub scenario: String,
    /// Orders.
    pub n: usize,
    /// Orders scheduled per second.
    pub enqueue_rate: Option<f64>,
    /// Orders moved into the stream per second.
    pub dispatch_rate: Option<f64>,
    /// Orders handled.
    pub handled: Option<usize>,
    /// Handler lateness percentiles, ms.
    pub late_p50_ms: Option<f64>,
    /// 90th percentile.
    pub late_p90_ms: Option<f64>,
    /// 99th percentile.
    pub late_p99_ms: Option<f64>,
    /// Maximum.
    pub late_max_ms: Option<f64>,
    /// Redis memory per pending order, bytes (used_memory delta / n after enqueue).
    pub mem_per_order_bytes: Option<f64>,
    /// Dispatch lateness (stream entry time − due, the dispatcher's share), p50 / p99 ms.
    pub dispatch_late_p50_ms: Option<f64>,
    /// 99th percentile of the dispatch lateness.
    pub dispatch_late_p99_ms: Option<f64>,
}

fn payload(bytes: usize, i: usize) -> Payload {
    let pad = bytes.saturating_sub(40);
    Payload::from_value(&serde_json::json!({"order": i, "pad": "x".repeat(pad)}))
}

async fn used_memory(client: &Client) -> anyhow::Result<i64> {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut client.connection())
        .await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .context("INFO memory has no used_memory")
}

async fn cleanup(client: &Client) -> anyhow::Result<()> {
    let mut conn = client.connection();
    let pattern = format!("*{}*", client.keyspace().namespace());
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(pattern)
        .query_async(&mut conn)
        .await?;
    for chunk in keys.chunks(500) {
        let _: i64 = redis::cmd("DEL").arg(chunk).query_async(&mut conn).await?;
    }
    Ok(())
}

/// Schedules `orders` due at `due(i)` with `batch` per call, 4 calls in flight; returns the
/// elapsed time.
async fn enqueue_all(
    client: &Client,
    opts: &BenchOptions,
    due: impl Fn(usize) -> When,
) -> anyhow::Result<Duration> {
    let orders: Vec<NewOrder> = (0..opts.orders)
        .map(|i| NewOrder::new(format!("order-{i}"), due(i), payload(opts.payload_bytes, i)))
        .collect();
    let started = Instant::now();
    let mut in_flight = futures_util::stream::FuturesUnordered::new();
    use futures_util::StreamExt;
    for chunk in orders.chunks(opts.batch.max(1)) {
        if in_flight.len() >= 4
            && let Some(r) = in_flight.next().await
        {
            let _: Vec<_> = r?;
        }
        in_flight.push(client.schedule_many(QUEUE, chunk, Mode::Upsert));
    }
    while let Some(r) = in_flight.next().await {
        r?;
    }
    Ok(started.elapsed())
}

/// Runs `scenario` against the Redis at `url`.
pub async fn run(url: &str, scenario: &str, opts: &BenchOptions) -> anyhow::Result<BenchReport> {
    let ns = format!("dq-bench-{}", std::process::id());
    let client = Client::connect_with(url, ClientOptions::default().namespace(ns)).await?;
    let result = match scenario {
        "enqueue" => enqueue(&client, opts).await,
        "dispatch" => dispatch(&client, opts).await,
        "steady" => steady(&client, opts).await,
        other => Err(anyhow::anyhow!(
            "unknown scenario {other:?} (enqueue, dispatch, steady)"
        )),
    };
    cleanup(&client).await?;
    result
}

async fn enqueue(client: &Client, opts: &BenchOptions) -> anyhow::Result<BenchReport> {
    let before = used_memory(client).await?;
    let took = enqueue_all(client, opts, |_| When::in_ms(3_600_000)).await?;
    let after = used_memory(client).await?;
    Ok(BenchReport {
        scenario: "enqueue".into(),
        n: opts.orders,
        enqueue_rate: Some(opts.orders as f64 / took.as_secs_f64()),
        mem_per_order_bytes: Some((after - before) as f64 / opts.orders as f64),
        ..Default::default()
    })
}

async fn dispatch(client: &Client, opts: &BenchOptions) -> anyhow::Result<BenchReport> {
    let now = client.now_ms();
    enqueue_all(client, opts, |i| When::at_ms(now - 1 - (i % 1000) as i64)).await?;
    let d = Dispatcher::new(client, QUEUE, DispatcherOptions::default())?;
    let started = Instant::now();
    let moved = d.drain().await?.moved;
    let took = started.elapsed();
    anyhow::ensure!(moved == opts.orders, "moved {moved} of {}", opts.orders);
    Ok(BenchReport {
        scenario: "dispatch".into(),
        n: opts.orders,
        dispatch_rate: Some(moved as f64 / took.as_secs_f64()),
        ..Default::default()
    })
}

async fn steady(client: &Client, opts: &BenchOptions) -> anyhow::Result<BenchReport> {
    let hist = Arc::new(Mutex::new(
        Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).context("histogram")?,
    ));
    let dhist = Arc::new(Mutex::new(
        Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).context("histogram")?,
    ));
    let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let all_done = CancellationToken::new();
    let n = opts.orders;
    let handler = {
        let (hist, handled, all_done) = (hist.clone(), handled.clone(), all_done.clone());
        let dhist = dhist.clone();
        let clock = client.clock().clone();
        move |d: Delivery| {
            let late_us = clock.now_us() - d.due_at_ms * 1000;
            if let Ok(mut h) = hist.lock() {
                let _ = h.record(u64::try_from(late_us.max(1)).unwrap_or(1));
            }
            if let Ok(mut h) = dhist.lock() {
                let late_ms = (d.dispatched_at_ms - d.due_at_ms).max(0);
                let _ = h.record(u64::try_from(late_ms * 1000).unwrap_or(0).max(1));
            }
            if handled.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == n {
                all_done.cancel();
            }
            std::future::ready(Ok(()))
        }
    };
    let stop = CancellationToken::new();
    let worker = Worker::new(
        client,
        QUEUE,
        "bench",
        handler,
        WorkerOptions::default().concurrency(opts.concurrency),
    )?;
    worker.ensure_groups().await?;
    let w = tokio::spawn(worker.run(stop.clone()));
    let d = tokio::spawn(
        Dispatcher::new(client, QUEUE, DispatcherOptions::default())?.run(stop.clone()),
    );

    // Produce at `rate` per second in ticks of 10 ms.
    let per_tick = usize::try_from(opts.rate / 100)
        .unwrap_or(usize::MAX)
        .max(1);
    let lead_ms = i64::try_from(opts.lead.as_millis()).unwrap_or(2000);
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent = 0;
    while sent < n {
        tick.tick().await;
        let k = per_tick.min(n - sent);
        let batch: Vec<NewOrder> = (sent..sent + k)
            .map(|i| {
                NewOrder::new(
                    format!("order-{i}"),
                    When::in_ms(lead_ms),
                    payload(opts.payload_bytes, i),
                )
            })
            .collect();
        client.schedule_many(QUEUE, &batch, Mode::Upsert).await?;
        sent += k;
    }
    let produce_s = started.elapsed().as_secs_f64();
    tokio::select! {
        _ = all_done.cancelled() => {}
        _ = tokio::time::sleep(opts.lead + Duration::from_secs(60)) => {}
    }
    stop.cancel();
    d.await?;
    w.await??;
    let h = hist
        .lock()
        .map_err(|_| anyhow::anyhow!("histogram lock poisoned"))?;
    let dh = dhist
        .lock()
        .map_err(|_| anyhow::anyhow!("histogram lock poisoned"))?;
    let ms = |us: u64| us as f64 / 1000.0;
    Ok(BenchReport {
        scenario: "steady".into(),
        n,
        enqueue_rate: Some(n as f64 / produce_s),
        handled: Some(handled.load(std::sync::atomic::Ordering::SeqCst)),
        late_p50_ms: Some(ms(h.value_at_quantile(0.50))),
        late_p90_ms: Some(ms(h.value_at_quantile(0.90))),
        late_p99_ms: Some(ms(h.value_at_quantile(0.99))),
        late_max_ms: Some(ms(h.max())),
        dispatch_late_p50_ms: Some(ms(dh.value_at_quantile(0.50))),
        dispatch_late_p99_ms: Some(ms(dh.value_at_quantile(0.99))),
        ..Default::default()
    })
}
