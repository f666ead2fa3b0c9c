//! `delayq demo`: the whole flow with zero configuration.
//!
//! Uses the Redis at `--redis-url` when it answers, else starts a throwaway `redis-server`;
//! uses the orders database at `--database-url` when given, else a temporary SQLite file.
//! A simulated checkout service creates orders in the database (expiring within a window)
//! and schedules their close events; a share of the customers pay in time (the order is
//! marked paid and its close event cancelled). A dispatcher and two handler groups run:
//! `close-order` (the built-in [`OrderClose`] handler, closing orders in the database) and
//! `notify-user`. Progress is shown every second; the run ends with a summary read back
//! from the database. Redis keys live in a namespace of their own, removed at the end.

use crate::orders::db::Db;
use crate::orders::repo::{Orders, PayOutcome};
use crate::{
    Client, ClientOptions, Delivery, Dispatcher, DispatcherOptions, Handler, Mode, NewOrder,
    OrderClose, When, Worker, WorkerOptions,
};
use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "order-close";

/// Demo options.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Orders to create.
    pub orders: usize,
    /// Orders expire uniformly within this window after creation.
    pub window: Duration,
    /// Share of customers who pay in time, 0..=100 percent.
    pub paid_percent: u32,
    /// The orders database (default: a temporary SQLite file).
    pub database_url: Option<String>,
}

/// The demo's summary.
#[derive(Debug, Clone, Serialize)]
pub struct DemoSummary {
    /// Orders created.
    pub created: usize,
    /// Orders paid in time (close event cancelled).
    pub paid: usize,
    /// Orders closed in the database.
    pub closed: usize,
    /// Orders still pending in the database (0 when all went well).
    pub pending: usize,
    /// The orders database (password redacted).
    pub database: String,
    /// Users notified by the notify-user group.
    pub notified: usize,
    /// Handler lateness (start − due), p50 ms.
    pub late_p50_ms: f64,
    /// Handler lateness p99 ms.
    pub late_p99_ms: f64,
    /// Handler lateness max ms.
    pub late_max_ms: f64,
}

/// Runs the demo; `url` may be unreachable (a throwaway redis-server is started then).
pub async fn run(url: &str, opts: &DemoOptions) -> anyhow::Result<DemoSummary> {
    anyhow::ensure!(opts.orders > 0, "--orders must be at least 1");
    anyhow::ensure!(opts.paid_percent <= 100, "--paid-percent must be 0..=100");
    let (_server, url) = redis_for_demo(url)?;
    let (_dir, db_url) = match &opts.database_url {
        Some(u) => (None, u.clone()),
        None => {
            let dir = tempfile::tempdir().context("creating a temporary directory")?;
            let u = format!("sqlite://{}", dir.path().join("orders.db").display());
            (Some(dir), u)
        }
    };
    let db = Db::connect(&db_url)
        .await
        .with_context(|| format!("opening {}", crate::engine::redact::url(&db_url)))?;
    db.migrate().await?;
    eprintln!("orders database: {}", crate::engine::redact::url(&db_url));
    let ns = format!("dq-demo-{}", std::process::id());
    let client = Client::connect_with(&url, ClientOptions::default().namespace(&ns)).await?;
    // A deployment's first step: the queue exists before anything is scheduled into it.
    client.admin().create_queue(QUEUE, 1).await?;
    let result = demo(&client, Orders::new(db.clone()), &ns, opts).await;
    db.close().await;
    let result = result.map(|s| DemoSummary {
        database: crate::engine::redact::url(&db_url),
        ..s
    });
    if let Err(e) = client.delete_namespace().await {
        eprintln!("could not remove the demo's keys: {e}");
    }
    result
}

/// The Redis the demo runs on: `url` when it answers, else a throwaway `redis-server`
/// (kept alive by the returned guard) in a build with the developers' tools.
#[cfg(feature = "dev-tools")]
fn redis_for_demo(url: &str) -> anyhow::Result<(Option<crate::LocalRedis>, String)> {
    if crate::testing::local_redis::reachable(url) {
        eprintln!("using Redis at {url}");
        return Ok((None, url.to_owned()));
    }
    let s =
        crate::LocalRedis::start().context("no Redis reachable, and no throwaway one either")?;
    eprintln!(
        "no Redis at {url}: started a throwaway redis-server at {}",
        s.url()
    );
    let u = s.url();
    Ok((Some(s), u))
}

/// The Redis the demo runs on: `url` (this build has no throwaway `redis-server`: feature
/// `dev-tools`, which the container image leaves out).
#[cfg(not(feature = "dev-tools"))]
fn redis_for_demo(url: &str) -> anyhow::Result<(Option<()>, String)> {
    eprintln!("using Redis at {url} (this build starts no throwaway redis-server)");
    Ok((None, url.to_owned()))
}

async fn demo(
    client: &Client,
    orders: Orders,
    prefix: &str,
    opts: &DemoOptions,
) -> anyhow::Result<DemoSummary> {
    let stop = CancellationToken::new();
    let notified = Arc::new(AtomicUsize::new(0));
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1,
        3_600_000_000,
        3,
    )?));
    // close-order: the built-in handler, timed.
    let close = {
        let (hist, clock) = (hist.clone(), client.clock().clone());
        let handler = Arc::new(OrderClose::new(orders.clone(), client));
        move |d: Delivery| {
            let late_us = clock.now_us() - d.due_at_ms * 1000;
            if let Ok(mut h) = hist.lock() {
                let _ = h.record(u64::try_from(late_us).unwrap_or(0).max(1));
            }
            let handler = handler.clone();
            async move { handler.handle(d).await }
        }
    };
    let notify = {
        let notified = notified.clone();
        move |_d: Delivery| {
            notified.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(()))
        }
    };
    let wopts = WorkerOptions::default().concurrency(32);
    let w1 = Worker::new(client, QUEUE, "close-order", close, wopts.clone())?;
    let w2 = Worker::new(client, QUEUE, "notify-user", notify, wopts)?;
    w1.ensure_groups().await?;
    w2.ensure_groups().await?;
    let h1 = tokio::spawn(w1.run(stop.clone()));
    let h2 = tokio::spawn(w2.run(stop.clone()));
    let hd = tokio::spawn(
        Dispatcher::new(client, QUEUE, DispatcherOptions::default())?.run(stop.clone()),
    );

    let n = opts.orders;
    let paid = checkout(client, &orders, prefix, opts).await?;
    let unpaid = n - paid;
    wait_handled(
        &orders,
        &notified,
        unpaid,
        opts.window + Duration::from_secs(60),
    )
    .await?;
    stop.cancel();
    h1.await??;
    h2.await??;
    hd.await?;
    let c = orders.counts().await?;
    let h = hist
        .lock()
        .map_err(|_| anyhow::anyhow!("histogram lock poisoned"))?;
    let ms = |us: u64| us as f64 / 1000.0;
    Ok(DemoSummary {
        created: n,
        paid: usize::try_from(c.paid).unwrap_or(usize::MAX),
        closed: usize::try_from(c.closed).unwrap_or(usize::MAX),
        pending: usize::try_from(c.pending).unwrap_or(usize::MAX),
        database: String::new(),
        notified: notified.load(Ordering::SeqCst),
        late_p50_ms: ms(h.value_at_quantile(0.5)),
        late_p99_ms: ms(h.value_at_quantile(0.99)),
        late_max_ms: ms(h.max()),
    })
}

/// The checkout service: each order is committed in the database, then its close event is
/// scheduled for its expiry (the reconciliation job of `delayq serve` covers a crash in
/// between); customers who pay in time get their order marked paid and the event cancelled.
/// Returns how many paid.
async fn checkout(
    client: &Client,
    orders: &Orders,
    prefix: &str,
    opts: &DemoOptions,
) -> anyhow::Result<usize> {
    let window_ms = i64::try_from(opts.window.as_millis())
        .unwrap_or(10_000)
        .max(1);
    let n = opts.orders;
    let now = client.now_ms();
    let mut events = Vec::with_capacity(n);
    for i in 0..n {
        let id = format!("{prefix}-order-{i:06}");
        let expires =
            now + 1000 + window_ms * i64::try_from(i).unwrap_or(0) / i64::try_from(n).unwrap_or(1);
        let amount = 1000 + i64::try_from(i % 9000).unwrap_or(0);
        orders.create(&id, amount, now, expires).await?;
        events.push(NewOrder::new(
            id,
            When::AtMs(expires),
            serde_json::json!({"user_id": i % 977, "amount_cents": amount}),
        ));
    }
    for chunk in events.chunks(1000) {
        client.schedule_many(QUEUE, chunk, Mode::Upsert).await?;
    }
    let mut paid = 0;
    for (i, o) in events.iter().enumerate() {
        if (i * 7919 % 100) < opts.paid_percent as usize
            && orders.pay(&o.id, client.now_ms()).await? == PayOutcome::Paid
        {
            client.cancel(QUEUE, &o.id).await?;
            paid += 1;
        }
    }
    eprintln!(
        "created {n} orders expiring over {:?}; {paid} paid in time",
        opts.window
    );
    Ok(paid)
}

/// Waits until every unpaid order is closed in the database and notified, printing progress
/// every second; fails after `deadline`.
async fn wait_handled(
    orders: &Orders,
    notified: &AtomicUsize,
    unpaid: usize,
    deadline: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let c = orders.counts().await?;
        let nt = notified.load(Ordering::SeqCst);
        eprintln!(
            "  closed {}/{unpaid} in the database, notified {nt}/{unpaid}, {:.0} s",
            c.closed,
            started.elapsed().as_secs_f64()
        );
        if c.pending == 0 && nt >= unpaid {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < deadline,
            "not every expired order was handled within {deadline:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `delayq demo`: runs the walk-through and prints its summary (`c` is a
/// [`Command::Demo`](super::Command::Demo)).
pub(super) async fn verb(g: &super::Global, c: super::Command) -> super::VerbResult {
    use super::Failure;
    let super::Command::Demo {
        orders,
        window,
        paid_percent,
        database_url,
    } = c
    else {
        return Err(Failure::Runtime("not a demo command".into()));
    };
    if let Some(u) = &database_url {
        crate::orders::db::check_url(u)?;
    }
    let opts = DemoOptions {
        orders,
        window: crate::engine::duration::parse_duration("--window", &window)?,
        paid_percent,
        database_url,
    };
    if orders == 0 || paid_percent > 100 {
        return Err(Failure::Invalid(
            "--orders must be >= 1 and --paid-percent 0..=100".into(),
        ));
    }
    let s = run(&g.redis_url, &opts)
        .await
        .map_err(|e| Failure::Runtime(format!("demo: {e:#}")))?;
    outln!(
        "summary: created {}, paid {}, closed {} (in the database, {} still pending), notified {}; lateness p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        s.created,
        s.paid,
        s.closed,
        s.pending,
        s.notified,
        s.late_p50_ms,
        s.late_p99_ms,
        s.late_max_ms
    );
    super::print_json(&s);
    Ok(())
}
