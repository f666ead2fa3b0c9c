//! `delayq bench`: a load generator to measure delayq on a Redis of the user's choosing.
//!
//! Scenarios (order i is due at start + lead + window·i/N and carries its due time in its
//! payload; lateness = handler start − that due time, on the Redis clock):
//! - `spread`: N orders due uniformly over `window`, starting `lead` after the start; one
//!   worker group (`concurrency`, no-op handler). Lateness, duplicates, missing, memory per
//!   pending order, Redis CPU per order.
//! - `storm`: N orders all due at one instant; drain rate from that instant to the last one
//!   handled (dispatched, handled, acked), and lateness.
//! - `spread` and `storm` with `--processes P` > 1: P dispatchers, each on a client of its
//!   own, splitting the shards through the dispatch roster (script calls per order beside
//!   one process's).
//! - `storm3`: `storm` with the orders spread over the three priority levels (order i is
//!   high, normal, low for i mod 3 = 0, 1, 2), read strictly: the drain rate beside the
//!   one-level storm's.
//! - `enqueue`: N orders due in an hour, no worker: producer rate and memory per pending
//!   order.
//! - `ceiling`: this Redis's raw limits in the same run (pipelined ZADD, a trivial script),
//!   and delayq's enqueue rate as a fraction of them.
//! - `dispatch`: N orders already due, drained by one dispatcher: orders/s into the streams.
//! - `depth`: N orders pending (due in an hour) beside 100,000 due ones; the due ones are
//!   drained by one dispatcher: Redis CPU per dispatched order at that depth (compare
//!   `--orders 10000` with `--orders 10000000`).
//! - `schedules`: N recurring schedules ticking every minute (`--orders` is the schedule
//!   count), with a scheduler and the supervisor: Redis commands and CPU per second and per
//!   tick.
//! - `idle`: `--queues` declared queues of `--shards` shards and nothing due, for `window`,
//!   with `--processes` `delayq serve` processes (0: the supervisor and maintenance
//!   services in this process): what dispatching and maintenance cost Redis at rest, in
//!   commands per second and Redis CPU per second (see `idle.rs`).
//! - `seed`, `seed-storm`: the seed posts' design (Lua enqueue, a poller moving due ids
//!   into a stream, a consumer group) in the `spread` and `storm` shapes, on the same
//!   server: Redis CPU per order and lateness, the yardstick of `spread` and `storm` (a run
//!   with both prints their ratio; see `seed.rs`).
//! - `cross`: orders scheduled by another process (raw `EVALSHA` of the exported enqueue
//!   script, as the SDKs do), each due 10–200 ms after it is scheduled, while one
//!   dispatcher and one worker idle in this process: lateness (see `cross.rs`).
//!
//! - `scripts`: each hot-path script (`dequeue.lua`, `read.lua`) called one at a time on
//!   one shard with 1, 10, 100 and 1,000 orders per call and with nothing to do: Redis time
//!   per call and per order, and the interpreter's part (see `scripts.rs`).
//!
//! Everything runs in a namespace of its own (`dq-bench-<pid>`), deleted at the end; nothing
//! else in the Redis is touched (never FLUSHALL).

use crate::engine::keys::QueueName;
use crate::{
    Client, ClientOptions, Dispatcher, DispatcherOptions, Mode, NewOrder, Payload, When, Worker,
    WorkerOptions,
};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

mod at_rest;
mod cross;
mod idle;
mod measure;
mod rates;
mod scripts;
mod seed;

pub use measure::BenchReport;
use measure::{
    Lateness, Recorder, command_stats, info_field, print_report, process_cpu_s, redis_cpu_s,
    script_split,
};

const QUEUE: &str = "bench";

/// `idle`'s shards per queue when `--shards` is not given.
const IDLE_SHARDS: u16 = 4;

/// Options of a run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Orders in the run.
    pub orders: usize,
    /// Time from the start to the first due order.
    pub lead: Duration,
    /// Spread of the due times (spread).
    pub window: Duration,
    /// Worker concurrency.
    pub concurrency: usize,
    /// Payload size in bytes (approximate, JSON).
    pub payload_bytes: usize,
    /// Shards per queue.
    pub shards: u16,
    /// idle: queues declared.
    pub queues: usize,
    /// idle: `delayq serve` processes (0: in this process); spread, storm: dispatchers,
    /// each on a client of its own.
    pub processes: usize,
    /// The handler group's rate limit, if any.
    pub rate_limit: Option<crate::engine::flow::RateLimit>,
    /// The bench queue's order-history retention (zero: off).
    pub history_retention: Duration,
    /// The dispatcher's linger between small passes (`None`: its default).
    pub linger: Option<Duration>,
    /// The dispatcher's lateness budget (`None`: its default).
    pub lateness_budget: Option<Duration>,
    /// The dispatchers' `takeover_after` (`None`: its default).
    pub takeover_after: Option<Duration>,
    /// Every order carries a W3C trace context (as a traced producer's would), stored and
    /// decoded with it; no spans are exported.
    pub traced: bool,
    /// Tags per order (spread, storm).
    pub tags: usize,
    /// Order keys: order i gets key `k<i mod keys>` (0: none).
    pub keys: usize,
}

/// The bench dispatcher's options: the defaults, with `--linger` and `--lateness-budget`
/// when given.
fn dispatcher_options(opts: &BenchOptions) -> DispatcherOptions {
    let mut o = DispatcherOptions::default();
    if let Some(l) = opts.linger {
        o = o.linger(l);
    }
    if let Some(b) = opts.lateness_budget {
        o = o.lateness_budget(b);
    }
    if let Some(t) = opts.takeover_after {
        o = o.takeover_after(t);
    }
    o
}

fn payload(bytes: usize, i: usize, due_ms: i64) -> Payload {
    let base = 60;
    let pad = bytes.saturating_sub(base);
    Payload::from_value(&serde_json::json!({"order": i, "due_ms": due_ms, "pad": "x".repeat(pad)}))
}

/// Schedules `orders` (4 calls of 1,000 in flight); returns the elapsed time.
async fn enqueue_all(client: &Client, orders: &[NewOrder]) -> anyhow::Result<Duration> {
    use futures_util::StreamExt;
    let started = Instant::now();
    let mut in_flight = futures_util::stream::FuturesUnordered::new();
    for chunk in orders.chunks(1000) {
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
    anyhow::ensure!(opts.orders > 0, "--orders must be at least 1");
    let ns = format!("dq-bench-{}", std::process::id());
    let client = Client::connect_with(
        url,
        ClientOptions::default().namespace(ns).shards(opts.shards),
    )
    .await?;
    client.delete_namespace().await?;
    client.admin().create_queue(QUEUE, opts.shards).await?;
    client
        .admin()
        .set_history_retention(QUEUE, opts.history_retention)
        .await?;
    let result = match scenario {
        "spread" => timed(&client, url, opts, false, false).await,
        "storm" => timed(&client, url, opts, true, false).await,
        "storm3" => timed(&client, url, opts, true, true).await,
        "enqueue" => rates::enqueue(&client, opts).await,
        "ceiling" => rates::ceiling(&client, opts).await,
        "dispatch" => rates::dispatch(&client, opts).await,
        "depth" => rates::depth(&client, opts).await,
        "idle" if opts.processes == 0 => at_rest::idle(&client, opts).await,
        "idle" => idle::idle(&client, url, opts).await,
        "seed" => seed::seed(&client, url, opts, false).await,
        "seed-storm" => seed::seed(&client, url, opts, true).await,
        "cross" => cross::cross(&client, url, opts).await,
        "schedules" => at_rest::schedules(&client, opts).await,
        "scripts" => scripts::scripts(&client, opts).await,
        other => Err(anyhow::anyhow!(
            "unknown scenario {other:?} (spread, storm, storm3, enqueue, ceiling, dispatch, depth, idle, schedules, scripts, seed, seed-storm, cross)"
        )),
    };
    client.delete_namespace().await?;
    result
}

/// spread (due over the window) or storm (all due at one instant); `levels`: the orders
/// take the three priority levels in turn.
async fn timed(
    client: &Client,
    url: &str,
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
    with_tags(&mut orders, opts.tags);
    with_keys(&mut orders, opts.keys);
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
    // `--processes P` > 1: P − 1 more dispatchers, each on a client of its own (its own
    // connections, listener and roster seat: another process as Redis sees it).
    let mut others = Vec::new();
    for _ in 1..opts.processes.max(1) {
        let c = Client::connect_with(url, client.options().clone()).await?;
        let d = Dispatcher::new(&c, QUEUE, dispatcher_options(opts))?;
        others.push(tokio::spawn(d.run(stop.clone())));
    }
    let limit = opts.lead + opts.window + Duration::from_secs(120);
    let timed_out = tokio::time::timeout(limit, rec.all_done.cancelled())
        .await
        .is_err();
    stop.cancel();
    d.await?;
    for o in others {
        o.await?;
    }
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
            "{} shard(s), {} dispatching process(es){}{}, worker concurrency {}, payload ~{} B{}; lateness = handler start - due, Redis clock",
            opts.shards,
            opts.processes.max(1),
            if levels {
                ", 3 priority levels (strict)"
            } else {
                ""
            },
            if opts.traced {
                ", every order traced (W3C context stored, no export)".to_owned()
            } else if opts.tags > 0 {
                format!(", {} tags per order", opts.tags)
            } else if opts.keys > 0 {
                format!(", orders keyed over {} keys", opts.keys)
            } else {
                String::new()
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

/// The bench worker's options: its concurrency, and the rate limit when one is asked for.
fn worker_options(opts: &BenchOptions) -> WorkerOptions {
    let w = WorkerOptions::default().concurrency(opts.concurrency);
    match opts.rate_limit {
        Some(r) => w.rate_limit(r),
        None => w,
    }
}

/// `n` orders `order-<i>` due at `due_of(i)`.
fn bench_orders(n: usize, payload_bytes: usize, due_of: impl Fn(usize) -> i64) -> Vec<NewOrder> {
    (0..n)
        .map(|i| {
            NewOrder::new(
                format!("order-{i}"),
                When::at_ms(due_of(i)),
                payload(payload_bytes, i, due_of(i)),
            )
        })
        .collect()
}

/// `orders` with `k` tags each (`t<j>:<i mod 100>`: a hundred orders per tag).
fn with_tags(orders: &mut [NewOrder], k: usize) {
    if k == 0 {
        return;
    }
    for (i, o) in orders.iter_mut().enumerate() {
        o.tags = (0..k).map(|j| format!("t{j}:{}", i % 100)).collect();
    }
}

/// `orders` with a trace context each (a distinct trace id per order), when `traced`.
fn with_traces(orders: &mut [NewOrder], traced: bool) {
    if !traced {
        return;
    }
    for (i, o) in orders.iter_mut().enumerate() {
        let tp = format!("00-{:032x}-{:016x}-01", i + 1, i + 1);
        if let Some(t) = crate::engine::trace::TraceContext::parse(&tp, None) {
            *o = o.clone().with_trace(t);
        }
    }
}

/// `orders` with key `k<i mod keys>` each, when `keys` > 0.
fn with_keys(orders: &mut [NewOrder], keys: usize) {
    if keys == 0 {
        return;
    }
    for (i, o) in orders.iter_mut().enumerate() {
        o.key = Some(format!("k{}", i % keys));
    }
}

/// `delayq bench`: runs the named scenarios and prints one report each (`c` is a
/// [`Command::Bench`](super::Command::Bench)).
pub(super) async fn verb(g: &super::Global, c: super::Command) -> super::VerbResult {
    use super::Failure;
    use crate::engine::duration::parse_duration;
    let super::Command::Bench {
        scenario,
        orders,
        lead,
        window,
        concurrency,
        payload_bytes,
        shards,
        queues,
        processes,
        rate_limit,
        history_retention,
        linger,
        lateness_budget,
        takeover_after,
        traced,
        tags,
        keys,
        json,
    } = c
    else {
        return Err(Failure::Runtime("not a bench command".into()));
    };
    let opts = BenchOptions {
        orders,
        lead: parse_duration("--lead", &lead)?,
        window: parse_duration("--window", &window)?,
        concurrency,
        payload_bytes,
        shards: shards.unwrap_or(1),
        queues,
        processes,
        rate_limit: rate_limit
            .as_deref()
            .map(crate::engine::flow::RateLimit::parse)
            .transpose()?,
        history_retention: parse_duration("--history-retention", &history_retention)?,
        linger: linger
            .as_deref()
            .map(|l| parse_duration("--linger", l))
            .transpose()?,
        lateness_budget: lateness_budget
            .as_deref()
            .map(|b| parse_duration("--lateness-budget", b))
            .transpose()?,
        takeover_after: takeover_after
            .as_deref()
            .map(|t| parse_duration("--takeover-after", t))
            .transpose()?,
        traced,
        tags,
        keys,
    };
    dispatcher_options(&opts).validate()?;
    crate::engine::history::HistoryPolicy::new(opts.history_retention)?;
    if tags > crate::engine::tags::MAX_TAGS {
        return Err(Failure::Invalid(format!(
            "--tags: at most {} per order",
            crate::engine::tags::MAX_TAGS
        )));
    }
    if orders == 0 || concurrency == 0 || queues == 0 || !(1..=1024).contains(&opts.shards) {
        return Err(Failure::Invalid(
            "--orders, --queues and --concurrency must be >= 1, --shards 1..=1024".into(),
        ));
    }
    if scenario.trim() == cross::PRODUCER {
        // The producer child of `cross` (its parent gave it a reachable server).
        return cross::producer(&g.redis_url, &g.namespace, &opts)
            .await
            .map_err(|e| Failure::Runtime(format!("bench cross producer: {e:#}")));
    }
    let (_server, url) = if crate::testing::local_redis::reachable(&g.redis_url) {
        (None, g.redis_url.clone())
    } else {
        let s = crate::testing::local_redis::LocalRedis::start()?;
        eprintln!("no Redis at the given URL: using a throwaway redis-server");
        let url = s.url();
        (Some(s), url)
    };
    let mut reports = Vec::new();
    for sc in scenario.split(',') {
        eprintln!("bench {}: {} orders ...", sc.trim(), orders);
        let mut o = opts.clone();
        if shards.is_none() && sc.trim() == "idle" {
            o.shards = IDLE_SHARDS;
        }
        let report = run(&url, sc.trim(), &o)
            .await
            .map_err(|e| Failure::Runtime(format!("bench {sc}: {e:#}")))?;
        print_report(&report, json);
        reports.push(report);
    }
    for ratio in seed::ratios(&reports) {
        print_report(&ratio, json);
    }
    Ok(())
}
