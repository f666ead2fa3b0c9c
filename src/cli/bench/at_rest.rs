//! The background-cost scenarios: `idle` (declared queues, nothing due) and `schedules`
//! (recurring schedules ticking): what `serve`'s supervisor, maintenance and scheduler cost
//! Redis per second.

use super::*;

/// A supervisor dispatching every registered queue with the bench's dispatcher options,
/// until `stop`.
fn spawn_supervisor(
    client: &Client,
    opts: &BenchOptions,
    stop: &CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<crate::Result<()>>> {
    use crate::engine::loops::supervisor::{Supervisor, SupervisorOptions};
    let sup = Supervisor::new(
        client,
        SupervisorOptions::default().dispatcher(dispatcher_options(opts)),
    )?;
    Ok(tokio::spawn(sup.run(stop.clone())))
}

/// `idle` with `--processes 0`: `opts.queues` queues declared, nothing due, the supervisor and the maintenance
/// services running for `opts.window` (after one second to settle): Redis commands and CPU
/// per second.
pub(super) async fn idle(client: &Client, opts: &BenchOptions) -> anyhow::Result<BenchReport> {
    use crate::engine::loops::housekeeping::{Housekeeper, HousekeepingOptions};
    for i in 0..opts.queues.saturating_sub(1) {
        client
            .admin()
            .create_queue(&format!("idle-{i}"), opts.shards)
            .await?;
    }
    let stop = CancellationToken::new();
    let sup = spawn_supervisor(client, opts, &stop)?;
    let hk = Housekeeper::for_registry(client, HousekeepingOptions::default())?;
    let hk = tokio::spawn(hk.run(stop.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cmds0: f64 = info_field(client, "stats", "total_commands_processed").await?;
    let cpu0 = redis_cpu_s(client).await?;
    let started = Instant::now();
    tokio::time::sleep(opts.window).await;
    let cmds1: f64 = info_field(client, "stats", "total_commands_processed").await?;
    let cpu1 = redis_cpu_s(client).await?;
    let took = started.elapsed().as_secs_f64();
    stop.cancel();
    sup.await??;
    hk.await??;
    Ok(BenchReport {
        scenario: "idle".into(),
        n: opts.queues,
        // Two INFO calls of the measurement itself are subtracted.
        commands_per_s: Some((cmds1 - cmds0 - 2.0) / took),
        redis_cpu_ms_per_s: Some((cpu1 - cpu0) * 1e3 / took),
        notes: format!(
            "{} queue(s) of {} shard(s), nothing due, supervisor + maintenance services in the bench process for {:.1} s",
            opts.queues, opts.shards, took
        ),
        ..Default::default()
    })
}

/// `schedules`: `opts.orders` recurring schedules ticking every minute, their ticks spread
/// evenly over the minute, with a scheduler and the supervisor (dispatching the ticks)
/// running for `opts.window` after the first minute has started: Redis commands and CPU per
/// second, and per tick (every tick an order scheduled ahead, advanced and dispatched).
pub(super) async fn schedules(client: &Client, opts: &BenchOptions) -> anyhow::Result<BenchReport> {
    use crate::engine::loops::scheduler::Scheduler;
    use crate::engine::schedules::{ScheduleSpec, Schedules};
    let s = Schedules::new(client);
    let base = client.now_ms() + 5_000;
    let n = i64::try_from(opts.orders).unwrap_or(i64::MAX);
    for i in 0..n {
        let spec = ScheduleSpec::every(QUEUE, &format!("s{i}"), "1m", serde_json::json!({"i": i}))
            .window(Some(base + i * 60_000 / n), None);
        s.upsert(&spec).await?;
    }
    let stop = CancellationToken::new();
    let sup = spawn_supervisor(client, opts, &stop)?;
    let sched = tokio::spawn(Scheduler::new(client).run(stop.clone()));
    // Start measuring once the ticks have begun.
    let wait = u64::try_from((base - client.now_ms()).max(0)).unwrap_or(0) + 1_000;
    tokio::time::sleep(Duration::from_millis(wait)).await;
    let stream = client
        .keyspace()
        .shard(&crate::engine::keys::QueueName::new(QUEUE)?, 0)
        .stream;
    let xlen = |c: &Client| {
        let stream = stream.clone();
        let c = c.clone();
        async move {
            let n: u64 = redis::cmd("XLEN")
                .arg(&stream)
                .query_async(&mut c.connection())
                .await?;
            anyhow::Ok(n)
        }
    };
    let ticks0 = xlen(client).await?;
    let cmds0: f64 = info_field(client, "stats", "total_commands_processed").await?;
    let cpu0 = redis_cpu_s(client).await?;
    let started = Instant::now();
    tokio::time::sleep(opts.window).await;
    let cmds1: f64 = info_field(client, "stats", "total_commands_processed").await?;
    let cpu1 = redis_cpu_s(client).await?;
    let ticks1 = xlen(client).await?;
    let took = started.elapsed().as_secs_f64();
    stop.cancel();
    sup.await??;
    sched.await?;
    let ticks = (ticks1 - ticks0) as f64;
    let cmds = cmds1 - cmds0 - 3.0;
    let cpu = cpu1 - cpu0;
    Ok(BenchReport {
        scenario: "schedules".into(),
        n: opts.orders,
        commands_per_s: Some(cmds / took),
        redis_cpu_ms_per_s: Some(cpu * 1e3 / took),
        notes: format!(
            "{} schedules every minute, {ticks:.0} ticks in {took:.1} s: {:.1} commands and {:.0} us of Redis CPU per tick (scheduler + dispatcher, idle polling included)",
            opts.orders,
            if ticks > 0.0 { cmds / ticks } else { 0.0 },
            if ticks > 0.0 { cpu * 1e6 / ticks } else { 0.0 },
        ),
        ..Default::default()
    })
}
