//! `seed` and `seed-storm`: the design of the seed posts (`/work/shared/seeds/004`), run on
//! the bench's server as the yardstick of delayq's cost per order.
//!
//! - Enqueue: one `seed_enqueue.lua` call per order (`ZADD` + `HSET`), pipelined 1,000
//!   calls at a time.
//! - A poller: `seed_dequeue.lua` (`ZRANGE BYSCORE LIMIT`, `ZREM`, `HMGET`, `HDEL`, one
//!   `XADD` per order), earliest due first, [`BATCH`] ids per call; again at once when a
//!   call was full, else after [`POLL`].
//! - One consumer: `XREADGROUP` (up to [`BATCH`] entries, blocking up to [`BLOCK`]) then
//!   one `XACK` of what it read.
//!
//! The orders, due times, payloads and lateness are those of `spread` and `storm` (same
//! options), so the Redis CPU per order compares in one run: [`ratios`] prints delayq's
//! over the seed's for each pair present.

use super::*;
use redis::AsyncCommands;
use redis::streams::{StreamReadOptions, StreamReadReply};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Ids per dequeue call and entries per read.
const BATCH: usize = 1000;
/// The poller's pause after a call that was not full.
const POLL: Duration = Duration::from_millis(5);
/// The consumer's longest block in `XREADGROUP`.
const BLOCK: usize = 50;
/// The consumer group.
const GROUP: &str = "seed";

/// The seed design's keys, in the bench's namespace (deleted with it).
struct SeedKeys {
    due: String,
    payload: String,
    stream: String,
}

impl SeedKeys {
    fn of(client: &Client) -> Self {
        let ns = client.keyspace().namespace();
        SeedKeys {
            due: format!("{{{ns}}}:seed:due"),
            payload: format!("{{{ns}}}:seed:payload"),
            stream: format!("{{{ns}}}:seed:stream"),
        }
    }
}

/// Runs the seed design in the `spread` (`storm` false) or `storm` shape.
pub(super) async fn seed(
    client: &Client,
    url: &str,
    opts: &BenchOptions,
    storm: bool,
) -> anyhow::Result<BenchReport> {
    let n = opts.orders;
    let keys = Arc::new(SeedKeys::of(client));
    let raw = redis::Client::open(url)?;
    let mut producer = raw.get_multiplexed_async_connection().await?;
    let enqueue = redis::Script::new(include_str!("seed_enqueue.lua"));
    let dequeue = redis::Script::new(include_str!("seed_dequeue.lua"));
    let _: String = enqueue.prepare_invoke().load_async(&mut producer).await?;
    let _: String = dequeue.prepare_invoke().load_async(&mut producer).await?;
    let () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&keys.stream)
        .arg(GROUP)
        .arg("$")
        .arg("MKSTREAM")
        .query_async(&mut producer)
        .await?;

    let start = client.now_ms();
    let lead = i64::try_from(opts.lead.as_millis()).unwrap_or(3000);
    let window = i64::try_from(opts.window.as_millis()).unwrap_or(10_000) * i64::from(!storm);
    let due_of = |i: usize| start + lead + window * i as i64 / n as i64;

    let seen: Arc<Mutex<HashMap<usize, Vec<i64>>>> = Arc::default();
    let all_done = CancellationToken::new();
    let stop = CancellationToken::new();
    let cpu0 = redis_cpu_s(client).await?;
    let stats0 = command_stats(client).await?;
    let started = Instant::now();
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut p = redis::pipe();
        for &i in chunk {
            let due = due_of(i);
            let body = payload(opts.payload_bytes, i, due);
            p.cmd("EVALSHA")
                .arg(enqueue.get_hash())
                .arg(2)
                .arg(&keys.due)
                .arg(&keys.payload)
                .arg(format!("order-{i}"))
                .arg(due)
                .arg(body.as_str())
                .ignore();
        }
        let () = p.query_async(&mut producer).await?;
    }
    let took = started.elapsed();
    let enqueue_done = client.now_ms();

    let poller = {
        let (client, keys, stop) = (client.clone(), keys.clone(), stop.clone());
        let mut conn = raw.get_multiplexed_async_connection().await?;
        let hash = dequeue.get_hash().to_owned();
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let moved: usize = redis::cmd("EVALSHA")
                    .arg(&hash)
                    .arg(3)
                    .arg(&keys.due)
                    .arg(&keys.payload)
                    .arg(&keys.stream)
                    .arg(client.now_ms())
                    .arg(BATCH)
                    .query_async(&mut conn)
                    .await?;
                if moved < BATCH {
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = tokio::time::sleep(POLL) => {}
                    }
                }
            }
            anyhow::Ok(())
        })
    };
    let consumer = {
        let (client, keys, stop) = (client.clone(), keys.clone(), stop.clone());
        let (seen, all_done) = (seen.clone(), all_done.clone());
        let mut conn = raw.get_multiplexed_async_connection().await?;
        tokio::spawn(async move {
            let read = StreamReadOptions::default()
                .group(GROUP, "c1")
                .count(BATCH)
                .block(BLOCK);
            let mut handled = 0;
            while !stop.is_cancelled() {
                let reply: Option<StreamReadReply> =
                    conn.xread_options(&[&keys.stream], &[">"], &read).await?;
                let mut ids = Vec::new();
                for entry in reply.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids) {
                    let at = client.clock().now_us();
                    let i = entry
                        .get::<String>("payload")
                        .and_then(|p| serde_json::from_str::<serde_json::Value>(&p).ok())
                        .and_then(|v| v["order"].as_u64())
                        .and_then(|i| usize::try_from(i).ok())
                        .unwrap_or(usize::MAX);
                    let mut m = seen.lock().map_err(|_| anyhow::anyhow!("lock poisoned"))?;
                    let times = m.entry(i).or_default();
                    times.push(at);
                    if times.len() == 1 {
                        handled += 1;
                    }
                    ids.push(entry.id);
                }
                if !ids.is_empty() {
                    let _: usize = conn.xack(&keys.stream, GROUP, &ids).await?;
                }
                if handled >= n {
                    all_done.cancel();
                }
            }
            anyhow::Ok(())
        })
    };
    let limit = opts.lead + opts.window + Duration::from_secs(120);
    let timed_out = tokio::time::timeout(limit, all_done.cancelled())
        .await
        .is_err();
    stop.cancel();
    poller.await??;
    consumer.await??;
    let cpu1 = redis_cpu_s(client).await?;
    let stats1 = command_stats(client).await?;

    // Nothing left behind: the ZSET and HASH empty, nothing read and not acknowledged.
    let mut conn = client.connection();
    let left_due: usize = conn.zcard(&keys.due).await?;
    let left_payload: usize = conn.hlen(&keys.payload).await?;
    let pending: redis::Value = redis::cmd("XPENDING")
        .arg(&keys.stream)
        .arg(GROUP)
        .query_async(&mut conn)
        .await?;
    let unacked = match pending {
        redis::Value::Array(v) => v
            .first()
            .and_then(|c| redis::from_redis_value::<usize>(c.clone()).ok())
            .unwrap_or(0),
        _ => 0,
    };
    let () = redis::cmd("DEL")
        .arg(&keys.due)
        .arg(&keys.payload)
        .arg(&keys.stream)
        .query_async(&mut conn)
        .await?;

    let diff = |k: &str| measure::stat_delta(&stats0, &stats1, k);
    let (calls, script) = diff("evalsha");
    let inner: f64 = ["zadd", "hset", "zrange", "zrem", "hmget", "hdel", "xadd"]
        .iter()
        .map(|k| diff(k).1)
        .sum();
    let seen = seen.lock().map_err(|_| anyhow::anyhow!("lock poisoned"))?;
    let l = Lateness::of(&seen, |i| due_of(i) * 1000)?;
    let distinct = seen.len();
    let (drain_s, drain_rate) = if storm && distinct > 0 {
        let s = ((l.last - (start + lead) * 1000) as f64 / 1e6).max(1e-6);
        (Some(s), Some(distinct as f64 / s))
    } else {
        (None, None)
    };
    let nf = n as f64;
    let mut report = BenchReport {
        scenario: if storm { "seed-storm" } else { "seed" }.into(),
        n,
        enqueue_s: Some(took.as_secs_f64()),
        enqueue_rate: Some(nf / took.as_secs_f64()),
        enqueue_done_offset_ms: Some((enqueue_done - start) as f64),
        drain_s,
        drain_rate,
        redis_cpu_us_per_order: Some((cpu1 - cpu0) * 1e6 / nf),
        script_us_per_order: Some(script / nf),
        interpreter_us_per_order: Some((script - inner).max(0.0) / nf),
        script_calls_per_order: Some(calls / nf),
        timed_out,
        notes: format!(
            "the seed design: one enqueue script call per order (ZADD + HSET), a poller moving \
             up to {BATCH} due ids earliest first into a stream (every {} ms unless full), one \
             consumer (XREADGROUP of {BATCH}, XACK); payload ~{} B; left behind: {left_due} due, \
             {left_payload} payloads, {unacked} unacknowledged; lateness = read - due, Redis clock",
            POLL.as_millis(),
            opts.payload_bytes
        ),
        ..BenchReport::default()
    };
    l.fill(&mut report, n, distinct, start);
    anyhow::ensure!(
        left_due + left_payload + unacked == 0 || timed_out,
        "the seed design left {left_due} due, {left_payload} payloads, {unacked} unacknowledged"
    );
    Ok(report)
}

/// One ratio line for each pair of delayq's and the seed design's reports in `reports`
/// (`spread` with `seed`, `storm` with `seed-storm`): delayq's Redis CPU per order over
/// the seed's.
pub(super) fn ratios(reports: &[BenchReport]) -> Vec<BenchReport> {
    let cpu = |name: &str| {
        reports
            .iter()
            .find(|r| r.scenario == name)
            .and_then(|r| r.redis_cpu_us_per_order)
    };
    [("spread", "seed"), ("storm", "seed-storm")]
        .into_iter()
        .filter_map(|(ours, theirs)| {
            let (a, b) = (cpu(ours)?, cpu(theirs)?);
            Some(BenchReport {
                scenario: format!("{ours}/{theirs}"),
                cpu_ratio: Some(a / b),
                notes: format!(
                    "Redis CPU per order: delayq {a:.2} us, the seed design {b:.2} us, ratio {:.2}",
                    a / b
                ),
                ..BenchReport::default()
            })
        })
        .collect()
}
