//! `cross`: orders scheduled by another process, as the SDKs schedule them, while this
//! process's dispatcher and worker idle: how late they are handled.
//!
//! The producer is a child process of the same binary (`bench --scenario cross-producer`,
//! [`producer`]) that loads nothing of delayq's client: it reads the queue's record
//! (`HMGET shards epoch`) once, then for each order reads the Redis `TIME` and runs the
//! exported `enqueue.lua` by `EVALSHA` (one order per call), due 10–200 ms after that time
//! (order i: 10 + (7,919·i mod 191) ms), the orders paced evenly over `--window`. It prints
//! every order's due time; lateness = handler start − due, on the Redis clock.

use super::*;
use crate::engine::keys::{Keyspace, shard_of};

/// The hidden scenario name of the producer child.
pub(super) const PRODUCER: &str = "cross-producer";

/// Shortest and longest time from scheduling to due, ms.
const AHEAD_MS: (usize, usize) = (10, 200);

/// What the producer prints: every order's due time, by index.
#[derive(serde::Serialize, serde::Deserialize)]
struct Produced {
    due_ms: Vec<i64>,
}

/// How far ahead of its scheduling order `i` is due, ms.
fn ahead_ms(i: usize) -> i64 {
    let span = AHEAD_MS.1 - AHEAD_MS.0 + 1;
    i64::try_from(AHEAD_MS.0 + (i.wrapping_mul(7919)) % span).unwrap_or(0)
}

/// The parent: a worker and a dispatcher idle here while the child schedules.
pub(super) async fn cross(
    client: &Client,
    url: &str,
    opts: &BenchOptions,
) -> anyhow::Result<BenchReport> {
    let n = opts.orders;
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
    let w = tokio::spawn(worker.run(stop.clone()));
    let d =
        tokio::spawn(Dispatcher::new(client, QUEUE, dispatcher_options(opts))?.run(stop.clone()));
    // Let both settle into their idle rhythm first.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let start = client.now_ms();
    let cpu0 = redis_cpu_s(client).await?;
    let child = tokio::process::Command::new(std::env::current_exe()?)
        .arg("--redis-url")
        .arg(url)
        .arg("--namespace")
        .arg(client.keyspace().namespace())
        .args(["bench", "--scenario", PRODUCER])
        .arg("--orders")
        .arg(n.to_string())
        .arg("--window")
        .arg(format!("{}ms", opts.window.as_millis()))
        .arg("--payload-bytes")
        .arg(opts.payload_bytes.to_string())
        .env_remove("DELAYQ_REDIS_URL")
        .env_remove("DELAYQ_NAMESPACE")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let out = tokio::time::timeout(
        opts.window + Duration::from_secs(60),
        child.wait_with_output(),
    )
    .await
    .map_err(|_| anyhow::anyhow!("the producer did not finish in time"))??;
    anyhow::ensure!(
        out.status.success(),
        "the producer failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let produced: Produced = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .map(serde_json::from_str)
        .transpose()?
        .ok_or_else(|| anyhow::anyhow!("the producer printed nothing"))?;
    anyhow::ensure!(
        produced.due_ms.len() == n,
        "the producer scheduled {} of {n} orders",
        produced.due_ms.len()
    );
    let timed_out = tokio::time::timeout(Duration::from_secs(60), rec.all_done.cancelled())
        .await
        .is_err();
    stop.cancel();
    d.await?;
    w.await??;
    let cpu1 = redis_cpu_s(client).await?;
    let seen = rec
        .seen
        .lock()
        .map_err(|_| anyhow::anyhow!("lock poisoned"))?;
    let due = |i: usize| produced.due_ms.get(i).copied().unwrap_or(i64::MAX / 2000) * 1000;
    let l = Lateness::of(&seen, due)?;
    let distinct = seen.len();
    let mut report = BenchReport {
        scenario: "cross".into(),
        n,
        redis_cpu_us_per_order: Some((cpu1 - cpu0) * 1e6 / n as f64),
        timed_out,
        notes: format!(
            "{n} orders scheduled by another process (raw EVALSHA of the exported enqueue.lua, \
             one order per call, a TIME read before each) over {} ms, each due {}-{} ms after \
             it was scheduled; one dispatcher and one worker (concurrency {}) in this process, \
             {} shard(s); lateness = handler start - due, Redis clock",
            opts.window.as_millis(),
            AHEAD_MS.0,
            AHEAD_MS.1,
            opts.concurrency,
            opts.shards
        ),
        ..BenchReport::default()
    };
    l.fill(&mut report, n, distinct, start);
    Ok(report)
}

/// The child: schedules `opts.orders` orders into the bench queue of `namespace` as an SDK
/// would, paced over `opts.window`, and prints their due times as one JSON line.
pub(super) async fn producer(
    url: &str,
    namespace: &str,
    opts: &BenchOptions,
) -> anyhow::Result<()> {
    let keyspace = Keyspace::new(namespace)?;
    let queue = QueueName::new(QUEUE)?;
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let (shards, epoch): (Option<u16>, Option<String>) = redis::cmd("HMGET")
        .arg(keyspace.queue_record(&queue))
        .arg("shards")
        .arg("epoch")
        .query_async(&mut conn)
        .await?;
    let (shards, epoch) = shards
        .zip(epoch)
        .ok_or_else(|| anyhow::anyhow!("no queue {QUEUE} in namespace {namespace}"))?;
    let text = crate::engine::scripts::all()
        .into_iter()
        .find_map(|(name, text)| (name == "enqueue").then_some(text))
        .ok_or_else(|| anyhow::anyhow!("no enqueue script"))?;
    let script = redis::Script::new(text);
    let n = opts.orders;
    let started = tokio::time::Instant::now();
    let mut due_ms = Vec::with_capacity(n);
    for i in 0..n {
        let at = started + opts.window.mul_f64(i as f64 / n as f64);
        tokio::time::sleep_until(at).await;
        let (s, us): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
        let now = s * 1000 + us / 1000;
        let due = now + ahead_ms(i);
        let id = format!("order-{i}");
        let keys = keyspace.shard(&queue, shard_of(&id, shards));
        let mut inv = script.prepare_invoke();
        for k in crate::engine::scripts::enqueue_keys(&keys) {
            inv.key(k);
        }
        let codes: Vec<i64> = inv
            .arg("upsert:")
            .arg(now)
            .arg(&epoch)
            .arg(&id)
            .arg(due)
            .arg(payload(opts.payload_bytes, i, due).as_str())
            .arg("")
            .invoke_async(&mut conn)
            .await?;
        anyhow::ensure!(codes == [1], "enqueue.lua answered {codes:?} for {id}");
        due_ms.push(due);
    }
    crate::cli::print_json(&Produced { due_ms });
    Ok(())
}
