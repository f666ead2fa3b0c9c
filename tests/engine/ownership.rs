//! In-flight ownership: a worker never re-runs work it still holds, a panic anywhere in the
//! per-entry path cannot pin an entry, shutdown is bounded whatever the backlog, one failing
//! shard does not hold up the others, and entries that cannot be handled are dead-lettered
//! at once.
#![allow(clippy::unwrap_used)]

use crate::support;

use delayq::{
    Backoff, Client, ClientOptions, Delivery, Dispatcher, DispatcherOptions, HandlerError, Hooks,
    Mode, NewOrder, When, Worker, WorkerOptions,
};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{pending, raw, start_with, wait_for};
use tokio_util::sync::CancellationToken;

const Q: &str = "order-close";
const WAIT: Duration = Duration::from_secs(90);

/// Records (order id, attempt) of every call after sleeping `work`.
#[derive(Clone, Default)]
struct Slow {
    calls: Arc<Mutex<Vec<(String, u32)>>>,
}

impl Slow {
    fn handler(
        &self,
        work: Duration,
    ) -> impl Fn(Delivery) -> std::pin::Pin<Box<dyn Future<Output = delayq::HandlerResult> + Send>>
    + Send
    + Sync
    + 'static {
        let calls = self.calls.clone();
        move |d: Delivery| {
            let calls = calls.clone();
            Box::pin(async move {
                tokio::time::sleep(work).await;
                calls.lock().unwrap().push((d.id.clone(), d.attempt));
                Ok(())
            })
        }
    }

    fn calls(&self) -> Vec<(String, u32)> {
        self.calls.lock().unwrap().clone()
    }
}

async fn schedule_due_now(client: &Client, n: usize, prefix: &str) -> Vec<String> {
    let orders: Vec<NewOrder> = (0..n)
        .map(|i| NewOrder::new(format!("{prefix}{i}"), When::in_ms(0), json!({"i": i})))
        .collect();
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
    orders.into_iter().map(|o| o.id).collect()
}

async fn dispatch_all(client: &Client) {
    Dispatcher::new(client, Q, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
}

/// Handlers slower than the visibility timeout, with prefetched entries waiting for a slot:
/// every lease stays extended, so each order runs exactly once, at attempt 1.
async fn slow_handlers_never_lose_their_leases(shards: u16) {
    let (_s, client) = start_with(ClientOptions::default().shards(shards)).await;
    let ids = schedule_due_now(&client, 30, "o").await;
    dispatch_all(&client).await;
    let slow = Slow::default();
    let w = Worker::new(
        &client,
        Q,
        "close",
        slow.handler(Duration::from_millis(1500)),
        WorkerOptions::default()
            .concurrency(2)
            .visibility_timeout(Duration::from_secs(1))
            .block(Duration::from_millis(100))
            .reclaim_every(Duration::from_millis(50))
            .max_attempts(3),
    )
    .unwrap();
    let st = w.stats();
    let cancel = CancellationToken::new();
    let h = tokio::spawn(w.run(cancel.clone()));
    let s2 = slow.clone();
    wait_for("30 orders handled", WAIT, move || {
        let n = s2.calls().len();
        async move { n >= 30 }
    })
    .await;
    cancel.cancel();
    h.await.unwrap().unwrap();
    let calls = slow.calls();
    let mut counts: HashMap<String, usize> = HashMap::new();
    for (id, attempt) in &calls {
        assert_eq!(
            *attempt, 1,
            "{id} ran at attempt {attempt} ({shards} shards)"
        );
        *counts.entry(id.clone()).or_default() += 1;
    }
    for id in &ids {
        assert_eq!(
            counts.get(id),
            Some(&1),
            "{id} ({shards} shards): {calls:?}"
        );
    }
    assert_eq!(st.dead_lettered.load(Ordering::SeqCst), 0);
    assert_eq!(st.reclaimed.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handlers_keep_every_lease_one_shard() {
    slow_handlers_never_lose_their_leases(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handlers_keep_every_lease_four_shards() {
    slow_handlers_never_lose_their_leases(4).await;
}

/// An `on_failure` hook that panics every time.
struct PanickyHooks {
    dead: Arc<AtomicUsize>,
}

impl Hooks for PanickyHooks {
    fn on_failure(&self, _d: &Delivery, _error: &str, _retry_in: Option<Duration>) {
        panic!("hook bug");
    }
    fn on_dead(&self, _d: &Delivery, _error: &str) {
        self.dead.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_panicking_hook_does_not_pin_its_entry() {
    let (_s, client) = start_with(ClientOptions::default()).await;
    schedule_due_now(&client, 1, "p").await;
    dispatch_all(&client).await;
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let a2 = attempts.clone();
    let dead = Arc::new(AtomicUsize::new(0));
    let w = Worker::new(
        &client,
        Q,
        "close",
        move |d: Delivery| {
            a2.lock().unwrap().push(d.attempt);
            std::future::ready(Err(HandlerError::retry("down")))
        },
        WorkerOptions::default()
            .max_attempts(3)
            .backoff(Backoff::Fixed(Duration::from_millis(50)))
            .visibility_timeout(Duration::from_secs(30))
            .block(Duration::from_millis(100))
            .reclaim_every(Duration::from_millis(50)),
    )
    .unwrap()
    .with_hooks(PanickyHooks { dead: dead.clone() });
    let cancel = CancellationToken::new();
    let h = tokio::spawn(w.run(cancel.clone()));
    let d2 = dead.clone();
    // With a 30 s visibility timeout, only a settled retry (not a lease running out) can
    // bring attempts 2 and 3 within the wait.
    wait_for(
        "dead-lettered after 3 attempts",
        Duration::from_secs(20),
        move || {
            let n = d2.load(Ordering::SeqCst);
            async move { n == 1 }
        },
    )
    .await;
    cancel.cancel();
    h.await.unwrap().unwrap();
    assert_eq!(*attempts.lock().unwrap(), vec![1, 2, 3]);
    let dl = client.admin().dead_list(Q, None, 10).await.unwrap();
    assert_eq!(dl.len(), 1);
    // Nothing is left pending or timed.
    assert_eq!(
        pending(&client, "{dq:order-close:0}:stream", "close").await,
        0
    );
    let timers: i64 = raw(&client, &["ZCARD", "{dq:order-close:0}:timers:close"]).await;
    assert_eq!(timers, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_is_bounded_under_a_backlog() {
    let (_s, client) = start_with(ClientOptions::default()).await;
    let n = 200_000;
    for chunk in 0..(n / 10_000) {
        let orders: Vec<NewOrder> = (0..10_000)
            .map(|i| NewOrder::new(format!("b{chunk}-{i}"), When::in_ms(0), json!(i)))
            .collect();
        client
            .schedule_many(Q, &orders, Mode::Upsert)
            .await
            .unwrap();
    }
    let grace = Duration::from_millis(500);
    let started = Arc::new(AtomicUsize::new(0));
    let s2 = started.clone();
    let w = Worker::new(
        &client,
        Q,
        "close",
        move |_d: Delivery| {
            s2.fetch_add(1, Ordering::SeqCst);
            async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(())
            }
        },
        WorkerOptions::default()
            .concurrency(50)
            .shutdown_grace(grace)
            .block(Duration::from_millis(100)),
    )
    .unwrap();
    w.ensure_groups().await.unwrap();
    let d = Dispatcher::new(&client, Q, DispatcherOptions::default()).unwrap();
    let cancel = CancellationToken::new();
    let hd = tokio::spawn(d.run(cancel.clone()));
    let hw = tokio::spawn(w.run(cancel.clone()));
    let s3 = started.clone();
    wait_for("handlers running", WAIT, move || {
        let n = s3.load(Ordering::SeqCst);
        async move { n >= 50 }
    })
    .await;
    cancel.cancel();
    // Bounded: both return once their grace is over, whatever is left of 200,000 orders
    // (draining that backlog first would take seconds).
    let bound = grace + Duration::from_millis(1500);
    tokio::time::timeout(bound, hd)
        .await
        .expect("dispatcher stopped within the bound")
        .unwrap();
    tokio::time::timeout(bound, hw)
        .await
        .expect("worker stopped within the bound")
        .unwrap()
        .unwrap();
    // The abandoned entries stay pending (the next process reclaims them), nothing is lost:
    // every order is still scheduled, in the stream, or pending.
    let stats = client.admin().stats(Q).await.unwrap();
    assert!(
        stats.scheduled + stats.stream_length >= n as u64,
        "{stats:?}"
    );
}

/// A worker stopping with entries taken ahead of a free slot (prefetched) hands them back:
/// the next consumer takes them at once, not after the visibility timeout (600 s here, so
/// a leftover lease would keep them away for the whole test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_worker_hands_back_the_entries_it_never_ran() {
    let (_s, client) = start_with(ClientOptions::default()).await;
    // The one order that starts never finishes: its slot never comes free, so the other
    // three wait for it until the worker stops, and it is abandoned after the grace.
    let started = Arc::new(Mutex::new(Vec::<String>::new()));
    let s2 = started.clone();
    let a = Worker::new(
        &client,
        Q,
        "close",
        move |d: Delivery| {
            s2.lock().unwrap().push(d.id.clone());
            std::future::pending::<delayq::HandlerResult>()
        },
        WorkerOptions::default()
            .concurrency(1)
            .prefetch(5)
            .shutdown_grace(Duration::from_millis(100))
            .visibility_timeout(Duration::from_secs(600))
            .block(Duration::from_millis(100)),
    )
    .unwrap();
    a.ensure_groups().await.unwrap();
    let ids = schedule_due_now(&client, 4, "h").await;
    dispatch_all(&client).await;
    let cancel = CancellationToken::new();
    let ha = tokio::spawn(a.run(cancel.clone()));
    // One order runs, the other three wait for its slot, all four taken by this worker.
    let (c2, s3) = (client.clone(), started.clone());
    wait_for("one running, four taken", WAIT, move || {
        let (c, n) = (c2.clone(), s3.lock().unwrap().len());
        async move { n == 1 && pending(&c, "{dq:order-close:0}:stream", "close").await == 4 }
    })
    .await;
    cancel.cancel();
    ha.await.unwrap().unwrap();
    let ran = started.lock().unwrap().clone();
    assert_eq!(ran.len(), 1, "only one order ran: {ran:?}");
    // The next process (same visibility timeout) takes the three it never ran at once; the
    // abandoned one stays leased (its handler may have done its work).
    let rec = support::Recorder::default();
    let b = Worker::new(
        &client,
        Q,
        "close",
        rec.handler(),
        WorkerOptions::default()
            .visibility_timeout(Duration::from_secs(600))
            .block(Duration::from_millis(100)),
    )
    .unwrap();
    let cancel = CancellationToken::new();
    let hb = tokio::spawn(b.run(cancel.clone()));
    rec.wait_len(3, WAIT).await;
    cancel.cancel();
    hb.await.unwrap().unwrap();
    let mut got: Vec<String> = rec.deliveries().into_iter().map(|d| d.id).collect();
    got.sort();
    let mut want: Vec<String> = ids.into_iter().filter(|id| *id != ran[0]).collect();
    want.sort();
    assert_eq!(got, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_shard_does_not_hold_up_the_others() {
    let (_s, client) = start_with(ClientOptions::default().shards(4)).await;
    let rec = support::Recorder::default();
    let w = Worker::new(
        &client,
        Q,
        "close",
        rec.handler(),
        WorkerOptions::default()
            .visibility_timeout(Duration::from_secs(600))
            .block(Duration::from_millis(100)),
    )
    .unwrap();
    let cancel = CancellationToken::new();
    let h = tokio::spawn(w.run(cancel.clone()));
    // Warm up: the worker has started (groups created) once it handled one order.
    schedule_due_now(&client, 1, "warm").await;
    dispatch_all(&client).await;
    rec.wait_len(1, Duration::from_secs(30)).await;
    // Shard 2's stream becomes a string: every read of it fails (WRONGTYPE).
    let broken = 2;
    let _: () = raw(&client, &["DEL", "{dq:order-close:2}:stream"]).await;
    let _: () = raw(&client, &["SET", "{dq:order-close:2}:stream", "oops"]).await;
    let ids = schedule_due_now(&client, 40, "f").await;
    let healthy: Vec<String> = ids
        .iter()
        .filter(|id| delayq::engine::keys::shard_of(id, 4) != broken)
        .cloned()
        .collect();
    // Shard 2's dispatch fails; the other shards are dispatched.
    let d = Dispatcher::new(&client, Q, DispatcherOptions::default()).unwrap();
    let _ = d.pass().await;
    // With a 600 s visibility timeout, entries lost by a failed read would not come back
    // within the wait.
    rec.wait_len(1 + healthy.len(), Duration::from_secs(30))
        .await;
    cancel.cancel();
    h.await.unwrap().unwrap();
    let counts = rec.counts();
    for id in &healthy {
        assert_eq!(counts.get(id), Some(&1), "{id}");
    }
}

#[tokio::test]
async fn an_entry_without_an_id_is_dead_lettered_on_first_delivery() {
    let (_s, client) = start_with(ClientOptions::default()).await;
    let rec = support::Recorder::default();
    let w = Worker::new(
        &client,
        Q,
        "close",
        rec.handler(),
        WorkerOptions::default()
            .visibility_timeout(Duration::from_secs(600))
            .block(Duration::from_millis(100)),
    )
    .unwrap();
    let st = w.stats();
    w.ensure_groups().await.unwrap();
    let stream = "{dq:order-close:0}:stream";
    let _: String = raw(&client, &["XADD", stream, "*", "foo", "bar"]).await;
    let cancel = CancellationToken::new();
    let h = tokio::spawn(w.run(cancel.clone()));
    let st2 = st.clone();
    wait_for("dead-lettered", Duration::from_secs(20), move || {
        let n = st2.dead_lettered.load(Ordering::SeqCst);
        async move { n == 1 }
    })
    .await;
    cancel.cancel();
    h.await.unwrap().unwrap();
    assert_eq!(rec.len(), 0, "the handler never sees it");
    let dl = client.admin().dead_list(Q, None, 10).await.unwrap();
    assert_eq!(dl.len(), 1);
    assert_eq!(dl[0].attempts, 1);
    assert!(
        dl[0].last_error.contains("no order id"),
        "{}",
        dl[0].last_error
    );
    assert_eq!(pending(&client, stream, "close").await, 0);
}

/// Lease extensions fail for longer than the visibility timeout (Redis frozen): the worker's
/// own reclaim finds the timers run out while the first copies still run. It must not run
/// them twice, inflate their attempts or dead-letter them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_never_makes_a_worker_run_its_own_entries_twice() {
    let (server, client) = start_with(ClientOptions::default()).await;
    let slow = Slow::default();
    let w = Worker::new(
        &client,
        Q,
        "close",
        slow.handler(Duration::from_millis(1500)),
        WorkerOptions::default()
            .visibility_timeout(Duration::from_millis(300))
            .reclaim_every(Duration::from_millis(50))
            .block(Duration::from_millis(100)),
    )
    .unwrap();
    let stats = w.stats();
    w.ensure_groups().await.unwrap();
    let cancel = CancellationToken::new();
    let h = tokio::spawn(w.run(cancel.clone()));
    let ids = schedule_due_now(&client, 5, "frozen-").await;
    dispatch_all(&client).await;
    wait_for("every entry taken", WAIT, || {
        let c = client.clone();
        async move { pending(&c, "{dq:order-close:0}:stream", "close").await == 5 }
    })
    .await;
    server.suspend().unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    server.resume().unwrap();
    wait_for("every entry acknowledged", WAIT, || {
        let c = client.clone();
        async move { pending(&c, "{dq:order-close:0}:stream", "close").await == 0 }
    })
    .await;
    let calls = slow.calls();
    let mut by_id: HashMap<String, Vec<u32>> = HashMap::new();
    for (id, attempt) in calls {
        by_id.entry(id).or_default().push(attempt);
    }
    for id in &ids {
        assert_eq!(by_id.get(id), Some(&vec![1]), "{id}: {by_id:?}");
    }
    assert_eq!(stats.dead_lettered.load(Ordering::SeqCst), 0);
    let dead: i64 = raw(&client, &["XLEN", "{dq:order-close:0}:dead"]).await;
    assert_eq!(dead, 0);
    cancel.cancel();
    h.await.unwrap().unwrap();
}

/// Issue 39 item 9, at its worst case: the first attempt's lease runs out while its handler
/// still runs (as when its extension failed for a while), so the worker's own reclaim pass
/// meets it. The running copy keeps the entry without a new delivery: its retry arrives as
/// attempt 2, and `max_attempts(3)` dead-letters after the third handler call, recording 3
/// attempts.
#[tokio::test]
async fn a_self_reclaim_does_not_count_an_attempt() {
    let (_s, client) = start_with(ClientOptions::default()).await;
    schedule_due_now(&client, 1, "s").await;
    dispatch_all(&client).await;
    let attempts: Arc<Mutex<Vec<(String, u32)>>> = Arc::new(Mutex::new(Vec::new()));
    let release = Arc::new(tokio::sync::Notify::new());
    let (a2, r2) = (attempts.clone(), release.clone());
    let w = Worker::new(
        &client,
        Q,
        "close",
        move |d: Delivery| {
            let (a3, r3) = (a2.clone(), r2.clone());
            async move {
                a3.lock().unwrap().push((d.entry_id.clone(), d.attempt));
                if d.attempt == 1 {
                    r3.notified().await;
                }
                Err(HandlerError::retry("down"))
            }
        },
        WorkerOptions::default()
            .max_attempts(3)
            .backoff(Backoff::Fixed(Duration::from_millis(50)))
            .visibility_timeout(Duration::from_secs(30))
            .block(Duration::from_millis(100))
            .reclaim_every(Duration::from_millis(50)),
    )
    .unwrap();
    let st = w.stats();
    let cancel = CancellationToken::new();
    let h = tokio::spawn(w.run(cancel.clone()));
    let a4 = attempts.clone();
    wait_for("the first attempt runs", WAIT, move || {
        let n = a4.lock().unwrap().len();
        async move { n == 1 }
    })
    .await;
    let entry = attempts.lock().unwrap()[0].0.clone();
    // The lease runs out under the running handler.
    let _: i64 = raw(
        &client,
        &["ZADD", "{dq:order-close:0}:timers:close", "XX", "0", &entry],
    )
    .await;
    let st2 = st.clone();
    wait_for(
        "the worker's reclaim meets its own entry",
        WAIT,
        move || {
            let n = st2.reclaimed_own.load(Ordering::SeqCst);
            async move { n >= 1 }
        },
    )
    .await;
    release.notify_one();
    let st3 = st.clone();
    wait_for("dead-lettered", WAIT, move || {
        let n = st3.dead_lettered.load(Ordering::SeqCst);
        async move { n == 1 }
    })
    .await;
    cancel.cancel();
    h.await.unwrap().unwrap();
    let seen: Vec<u32> = attempts.lock().unwrap().iter().map(|(_, a)| *a).collect();
    assert_eq!(seen, vec![1, 2, 3], "attempts as the handler saw them");
    let dl = client.admin().dead_list(Q, None, 10).await.unwrap();
    assert_eq!(dl.len(), 1);
    assert_eq!(dl[0].attempts, 3);
    assert_eq!(st.reclaimed.load(Ordering::SeqCst), 2, "the two retries");
}

/// Issue 39 item 18: an ack by a worker whose lease was taken over (another consumer
/// claimed the entry while its handler still ran) is counted late, in the worker's stats
/// and in `delayq_late_acks_total`.
#[tokio::test]
async fn an_ack_after_a_takeover_is_counted_late() {
    const LQ: &str = "late-acks";
    delayq::service::metrics::handle().unwrap();
    let (_s, client) = start_with(ClientOptions::default()).await;
    client.admin().create_queue(LQ, 1).await.unwrap();
    client
        .schedule(LQ, "t1", Duration::ZERO, json!({}))
        .await
        .unwrap();
    Dispatcher::new(&client, LQ, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
    let started: Arc<Mutex<Vec<String>>> = Arc::default();
    let release = Arc::new(tokio::sync::Notify::new());
    let (s2, r2) = (started.clone(), release.clone());
    let w = Worker::new(
        &client,
        LQ,
        "close",
        move |d: Delivery| {
            let (s3, r3) = (s2.clone(), r2.clone());
            async move {
                s3.lock().unwrap().push(d.entry_id.clone());
                r3.notified().await;
                Ok(())
            }
        },
        WorkerOptions::default()
            .visibility_timeout(Duration::from_secs(30))
            .block(Duration::from_millis(100)),
    )
    .unwrap();
    let st = w.stats();
    let cancel = CancellationToken::new();
    let h = tokio::spawn(w.run(cancel.clone()));
    let s4 = started.clone();
    wait_for("the handler runs", WAIT, move || {
        let n = s4.lock().unwrap().len();
        async move { n == 1 }
    })
    .await;
    let entry = started.lock().unwrap()[0].clone();
    // Another consumer takes the entry over (as after this worker's lease ran out).
    let _: redis::Value = raw(
        &client,
        &[
            "XCLAIM",
            "{dq:late-acks:0}:stream",
            "close",
            "thief",
            "0",
            &entry,
        ],
    )
    .await;
    release.notify_one();
    let st2 = st.clone();
    wait_for("the late ack", WAIT, move || {
        let n = st2.late_acks.load(Ordering::SeqCst);
        async move { n == 1 }
    })
    .await;
    cancel.cancel();
    h.await.unwrap().unwrap();
    assert_eq!(st.late_acks.load(Ordering::SeqCst), 1);
    let text = delayq::service::metrics::render(None);
    assert!(
        text.contains(r#"delayq_late_acks_total{queue="late-acks",group="close"} 1"#),
        "{text}"
    );
}
