//! The scenarios that measure a rate without handlers: `enqueue` (producer rate, memory
//! per pending order), `dispatch` (orders/s into the streams), `depth` (Redis CPU per
//! dispatched order beside a deep schedule) and `ceiling` (this Redis's raw limits).

use super::*;

pub(super) async fn enqueue(client: &Client, opts: &BenchOptions) -> anyhow::Result<BenchReport> {
    let now = client.now_ms();
    let mut orders: Vec<NewOrder> = (0..opts.orders)
        .map(|i| {
            let due = now + 3_600_000;
            NewOrder::new(
                format!("order-{i}"),
                When::at_ms(due),
                payload(opts.payload_bytes, i, due),
            )
        })
        .collect();
    with_traces(&mut orders, opts.traced);
    with_keys(&mut orders, opts.keys);
    let before = info_field::<i64>(client, "memory", "used_memory").await?;
    let (cpu0, stats0) = (redis_cpu_s(client).await?, command_stats(client).await?);
    let took = enqueue_all(client, &orders).await?;
    let (cpu1, stats1) = (redis_cpu_s(client).await?, command_stats(client).await?);
    let after = info_field::<i64>(client, "memory", "used_memory").await?;
    let (script_us, interp_us, calls_per_order) = script_split(&stats0, &stats1, opts.orders);
    let n = opts.orders as f64;
    Ok(BenchReport {
        scenario: "enqueue".into(),
        n: opts.orders,
        enqueue_s: Some(took.as_secs_f64()),
        enqueue_rate: Some(n / took.as_secs_f64()),
        mem_before: Some(before),
        mem_after: Some(after),
        mem_per_order_bytes: Some((after - before) as f64 / n),
        redis_cpu_us_per_order: Some((cpu1 - cpu0) * 1e6 / n),
        script_us_per_order: Some(script_us),
        interpreter_us_per_order: Some(interp_us),
        script_calls_per_order: Some(calls_per_order),
        notes: format!(
            "schedule_many, 1,000 orders per call, 4 calls in flight, {} shard(s)",
            opts.shards
        ),
        ..Default::default()
    })
}

pub(super) async fn dispatch(client: &Client, opts: &BenchOptions) -> anyhow::Result<BenchReport> {
    let now = client.now_ms();
    let orders: Vec<NewOrder> = (0..opts.orders)
        .map(|i| {
            let due = now - 1 - (i % 1000) as i64;
            NewOrder::new(
                format!("order-{i}"),
                When::at_ms(due),
                payload(opts.payload_bytes, i, due),
            )
        })
        .collect();
    enqueue_all(client, &orders).await?;
    let drained = drain_due(client, opts.orders).await?;
    let history = history_bytes(client).await?;
    Ok(BenchReport {
        scenario: "dispatch".into(),
        n: opts.orders,
        history_bytes_per_order: Some(history as f64 / opts.orders as f64),
        notes: format!(
            "orders already due, drained by one dispatcher into the stream (no worker); \
             history retention {}",
            crate::engine::duration::format_duration(opts.history_retention)
        ),
        ..drained
    })
}

/// Bytes held by the bench queue's order-history buckets (`MEMORY USAGE ... SAMPLES 0`:
/// every field counted).
async fn history_bytes(client: &Client) -> anyhow::Result<u64> {
    let mut conn = client.connection();
    let mut total = 0;
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(client.keyspace().history_pattern(&QueueName::new(QUEUE)?))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        for k in keys {
            let n: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&k)
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut conn)
                .await?;
            total += n.unwrap_or(0);
        }
        if next == 0 {
            return Ok(total);
        }
        cursor = next;
    }
}

/// Drains the `expected` due orders with one dispatcher; reports the drain time, rate and
/// Redis CPU per dispatched order.
async fn drain_due(client: &Client, expected: usize) -> anyhow::Result<BenchReport> {
    let d = Dispatcher::new(client, QUEUE, DispatcherOptions::default())?;
    let cpu0 = redis_cpu_s(client).await?;
    let started = Instant::now();
    let moved = d.drain().await?.moved;
    let took = started.elapsed();
    let cpu1 = redis_cpu_s(client).await?;
    anyhow::ensure!(moved == expected, "moved {moved} of {expected}");
    Ok(BenchReport {
        drain_s: Some(took.as_secs_f64()),
        drain_rate: Some(moved as f64 / took.as_secs_f64()),
        redis_cpu_us_per_order: Some((cpu1 - cpu0) * 1e6 / moved as f64),
        ..Default::default()
    })
}

/// Due orders drained in the `depth` scenario.
const DEPTH_DUE: usize = 100_000;

pub(super) async fn depth(client: &Client, opts: &BenchOptions) -> anyhow::Result<BenchReport> {
    let now = client.now_ms();
    // The pending background, generated in chunks to keep the client's memory flat.
    let mut start = 0;
    while start < opts.orders {
        let end = (start + 100_000).min(opts.orders);
        let chunk: Vec<NewOrder> = (start..end)
            .map(|i| {
                let due = now + 3_600_000 + (i % 600_000) as i64;
                NewOrder::new(
                    format!("bg-{i}"),
                    When::at_ms(due),
                    payload(opts.payload_bytes, i, due),
                )
            })
            .collect();
        enqueue_all(client, &chunk).await?;
        start = end;
    }
    let due: Vec<NewOrder> = (0..DEPTH_DUE)
        .map(|i| {
            let due = now - 1 - (i % 1000) as i64;
            NewOrder::new(
                format!("due-{i}"),
                When::at_ms(due),
                payload(opts.payload_bytes, i, due),
            )
        })
        .collect();
    enqueue_all(client, &due).await?;
    // Let Redis finish growing its hash tables (incremental rehashing after millions of
    // inserts): the steady state of a deep queue, not the moment after it filled up.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let drained = drain_due(client, DEPTH_DUE).await?;
    Ok(BenchReport {
        scenario: "depth".into(),
        n: opts.orders,
        notes: format!(
            "{DEPTH_DUE} due orders drained by one dispatcher with n orders pending beside them \
             (after a 3 s settle); CPU is per dispatched order"
        ),
        ..drained
    })
}

pub(super) async fn ceiling(client: &Client, opts: &BenchOptions) -> anyhow::Result<BenchReport> {
    let n = opts.orders;
    let key = client.keyspace().bench_ceiling();
    let mut conn = client.connection();
    // Pipelined ZADD, 1,000 per pipeline.
    let started = Instant::now();
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut p = redis::pipe();
        for i in chunk {
            p.cmd("ZADD").arg(&key).arg(*i).arg(*i).ignore();
        }
        let () = p.query_async(&mut conn).await?;
    }
    let zadd_rate = n as f64 / started.elapsed().as_secs_f64();
    // A trivial script, 1,000 calls per pipeline.
    let script = &*crate::engine::scripts::admin::NOOP;
    let _: String = script.prepare_invoke().load_async(&mut conn).await?;
    let started = Instant::now();
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut p = redis::pipe();
        for _ in chunk {
            p.cmd("EVALSHA").arg(script.get_hash()).arg(0).ignore();
        }
        let () = p.query_async(&mut conn).await?;
    }
    let script_rate = n as f64 / started.elapsed().as_secs_f64();
    let e = enqueue(client, opts).await?;
    let rate = e.enqueue_rate.unwrap_or(0.0);
    Ok(BenchReport {
        scenario: "ceiling".into(),
        n,
        enqueue_rate: Some(rate),
        mem_per_order_bytes: e.mem_per_order_bytes,
        notes: format!(
            "raw pipelined ZADD {zadd_rate:.0}/s, trivial script calls {script_rate:.0}/s; \
             delayq enqueue {rate:.0}/s = {:.2} of raw ZADD, {:.2}x one-script-call-per-order",
            rate / zadd_rate,
            rate / script_rate
        ),
        ..Default::default()
    })
}
