//! The `spread`, `storm` and `storm3` scenarios: N orders due over a window (or all at one
//! instant, perhaps over the three priority levels) drained by one dispatcher and one worker
//! group in this process, measuring lateness, duplicates and missing orders, the drain rate,
//! memory per pending order and Redis CPU per order.

use super::*;

/// spread (due over the window) or storm (all due at one instant); `levels`: the orders
/// take the three priority levels in turn.
pub(super) async fn timed(
    client: &Client,
    opts: &BenchOptions,
    storm: bool,
    levels: bool,
) -> anyhow::Result<BenchReport> {
    let n = opts.orders;
    let start = client.now_ms();
    let lead = i64::try_from(opts.lead.as_millis()).unwrap_or(3000);
    let window = i64::try_from(opts.window.as_millis()).unwrap_or(10_000) * i64::from(!storm);
    let due_of = |i: usize| start + lead + window * i as i64 / n as i64;
    let mut orders = bench_orders(n, opts.payload_bytes, due_of);
    with_traces(&mut orders, opts.traced);
    if levels {
        for (i, o) in orders.iter_mut().enumerate() {
            o.priority = crate::Priority::ALL[i % 3];
        }
    }
    let rec = Recorder::default();
    let stop = CancellationToken::new();
    let worker = Worker::new(
        client,
        QUEUE,
        "bench",
        rec.handler(client, n),
        worker_options(opts),
    )?;
    worker.ensure_groups().await?;
    let mem_before = info_field::<i64>(client, "memory", "used_memory").await?;
    // Redis time of the whole run: enqueue, dispatch, reads, acks.
    let cpu0 = redis_cpu_s(client).await?;
    let own0 = process_cpu_s();
    let stats0 = command_stats(client).await?;
    let took = enqueue_all(client, &orders).await?;
    let enqueue_done = client.now_ms();
    let mem_after = info_field::<i64>(client, "memory", "used_memory").await?;
    let w = tokio::spawn(worker.run(stop.clone()));
    let d =
        tokio::spawn(Dispatcher::new(client, QUEUE, dispatcher_options(opts))?.run(stop.clone()));
    let limit = opts.lead + opts.window + Duration::from_secs(120);
    let timed_out = tokio::time::timeout(limit, rec.all_done.cancelled())
        .await
        .is_err();
    stop.cancel();
    d.await?;
    w.await??;
    let cpu1 = redis_cpu_s(client).await?;
    let own1 = process_cpu_s();
    let stats1 = command_stats(client).await?;
    let (script_us, interp_us, calls_per_order) = script_split(&stats0, &stats1, n);

    let seen = rec
        .seen
        .lock()
        .map_err(|_| anyhow::anyhow!("lock poisoned"))?;
    let l = Lateness::of(&seen, |i| due_of(i) * 1000)?;
    let distinct = seen.len();
    let (drain_s, drain_rate) = if storm && distinct > 0 {
        let s = ((l.last - (start + lead) * 1000) as f64 / 1e6).max(1e-6);
        (Some(s), Some(distinct as f64 / s))
    } else {
        (None, None)
    };
    let mut report = BenchReport {
        scenario: match (storm, levels) {
            (true, true) => "storm3",
            (true, false) => "storm",
            _ => "spread",
        }
        .into(),
        n,
        enqueue_s: Some(took.as_secs_f64()),
        enqueue_rate: Some(n as f64 / took.as_secs_f64()),
        enqueue_done_offset_ms: Some((enqueue_done - start) as f64),
        mem_before: Some(mem_before),
        mem_after: Some(mem_after),
        mem_per_order_bytes: Some((mem_after - mem_before) as f64 / n as f64),
        drain_s,
        drain_rate,
        redis_cpu_us_per_order: Some((cpu1 - cpu0) * 1e6 / n as f64),
        client_cpu_us_per_order: own0.zip(own1).map(|(a, b)| (b - a) * 1e6 / n as f64),
        script_us_per_order: Some(script_us),
        interpreter_us_per_order: Some(interp_us),
        script_calls_per_order: Some(calls_per_order),
        timed_out,
        notes: format!(
            "{} shard(s){}{}, worker concurrency {}, payload ~{} B{}; lateness = handler start - due, Redis clock",
            opts.shards,
            if levels {
                ", 3 priority levels (strict)"
            } else {
                ""
            },
            if opts.traced {
                ", every order traced (W3C context stored, no export)"
            } else {
                ""
            },
            opts.concurrency,
            opts.payload_bytes,
            opts.rate_limit
                .map(|r| format!(", rate limit {}/{:?}", r.count, r.period))
                .unwrap_or_default()
        ),
        ..BenchReport::default()
    };
    l.fill(&mut report, n, distinct, start);
    Ok(report)
}
