//! The failure path against real redis-server processes: retries with backoff to the failing
//! group only, reclaim of a dead consumer's entries, lease extension for slow handlers, dead
//! letters, replay and purge, hooks.
#![allow(clippy::unwrap_used)]

use crate::support;

use delayq::{
    Backoff, Client, Delivery, Dispatcher, DispatcherOptions, HandlerError, Hooks, Selection, When,
    Worker, WorkerOptions,
};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{Recorder, pending, raw, start, wait_for};
use tokio_util::sync::CancellationToken;

const Q: &str = "order-close";
const STREAM: &str = "{dq:order-close:0}:stream";
const WAIT: Duration = Duration::from_secs(60);

fn opts() -> WorkerOptions {
    WorkerOptions::default()
        .block(Duration::from_millis(100))
        .reclaim_every(Duration::from_millis(50))
        .backoff(Backoff::Fixed(Duration::from_millis(100)))
}

/// Records (order id, attempt) of every call, and fails while `fail(id, attempt)` says so.
#[derive(Clone, Default)]
struct Flaky {
    calls: Arc<Mutex<Vec<(String, u32)>>>,
}

impl Flaky {
    fn handler(
        &self,
        fail: impl Fn(&str, u32) -> bool + Send + Sync + 'static,
    ) -> impl Fn(Delivery) -> std::future::Ready<delayq::HandlerResult> + Send + Sync + 'static
    {
        let calls = self.calls.clone();
        move |d: Delivery| {
            calls.lock().unwrap().push((d.id.clone(), d.attempt));
            std::future::ready(if fail(&d.id, d.attempt) {
                Err(HandlerError::retry(format!("attempt {} failed", d.attempt)))
            } else {
                Ok(())
            })
        }
    }

    fn calls(&self) -> Vec<(String, u32)> {
        self.calls.lock().unwrap().clone()
    }
}

async fn dispatch_now(client: &Client, ids: &[&str]) {
    for id in ids {
        client
            .schedule(Q, id, When::in_ms(0), json!({"id": id}))
            .await
            .unwrap();
    }
    Dispatcher::new(client, Q, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
}

fn spawn<H: delayq::Handler>(
    w: Worker<H>,
    cancel: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let c = cancel.clone();
    tokio::spawn(async move { w.run(c).await.unwrap() })
}

#[tokio::test]
async fn a_retry_goes_to_the_failing_group_only_with_backoff() {
    let (_s, client) = start().await;
    let ok = Recorder::default();
    let flaky = Flaky::default();
    let cancel = CancellationToken::new();
    let a = Worker::new(&client, Q, "notify", ok.handler(), opts()).unwrap();
    let b = Worker::new(&client, Q, "close", flaky.handler(|_, n| n < 3), opts()).unwrap();
    let b_stats = b.stats();
    a.ensure_groups().await.unwrap();
    b.ensure_groups().await.unwrap();
    let handles = vec![spawn(a, &cancel), spawn(b, &cancel)];
    dispatch_now(&client, &["o1"]).await;
    let f = flaky.clone();
    wait_for("three attempts by close", WAIT, move || {
        let n = f.calls().len();
        async move { n == 3 }
    })
    .await;
    let st = b_stats.clone();
    wait_for("the third attempt acked", WAIT, move || {
        let acked = st.acked.load(Ordering::SeqCst);
        async move { acked == 1 }
    })
    .await;
    assert_eq!(
        flaky.calls(),
        vec![("o1".into(), 1), ("o1".into(), 2), ("o1".into(), 3)]
    );
    assert_eq!(ok.len(), 1, "the group that succeeded never saw it again");
    assert_eq!(b_stats.retried.load(Ordering::SeqCst), 2);
    assert_eq!(pending(&client, STREAM, "close").await, 0);
    let timers: i64 = raw(&client, &["ZCARD", "{dq:order-close:0}:timers:close"]).await;
    assert_eq!(timers, 0, "no timer left behind");
    cancel.cancel();
    for h in handles {
        h.await.unwrap();
    }
}

#[tokio::test]
async fn the_attempt_count_survives_a_worker_restart() {
    let (_s, client) = start().await;
    let first = Flaky::default();
    let cancel1 = CancellationToken::new();
    let w1 = Worker::new(
        &client,
        Q,
        "close",
        first.handler(|_, _| true),
        opts().backoff(Backoff::Fixed(Duration::from_millis(300))),
    )
    .unwrap();
    let st = w1.stats();
    w1.ensure_groups().await.unwrap();
    let h1 = spawn(w1, &cancel1);
    dispatch_now(&client, &["o1"]).await;
    wait_for("the first attempt to fail", WAIT, || {
        let n = st.retried.load(Ordering::SeqCst);
        async move { n == 1 }
    })
    .await;
    cancel1.cancel();
    h1.await.unwrap();

    // A new process: another consumer name, nothing in memory.
    let second = Flaky::default();
    let cancel2 = CancellationToken::new();
    let w2 = Worker::new(&client, Q, "close", second.handler(|_, _| false), opts()).unwrap();
    let h2 = spawn(w2, &cancel2);
    let s2 = second.clone();
    wait_for("the retry", WAIT, move || {
        let n = s2.calls().len();
        async move { n == 1 }
    })
    .await;
    assert_eq!(second.calls(), vec![("o1".into(), 2)]);
    cancel2.cancel();
    h2.await.unwrap();
}

#[derive(Default)]
struct CountingHooks {
    success: AtomicU32,
    failure: AtomicU32,
    dead: AtomicU32,
}

impl Hooks for CountingHooks {
    fn on_success(&self, _: &Delivery) {
        self.success.fetch_add(1, Ordering::SeqCst);
    }
    fn on_failure(&self, _: &Delivery, _: &str, _: Option<Duration>) {
        self.failure.fetch_add(1, Ordering::SeqCst);
    }
    fn on_dead(&self, _: &Delivery, _: &str) {
        self.dead.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_poison_order_is_dead_lettered_after_max_attempts_while_others_flow() {
    let (_s, client) = start().await;
    let flaky = Flaky::default();
    let hooks = Arc::new(CountingHooks::default());
    let w = Worker::new(
        &client,
        Q,
        "close",
        flaky.handler(|id, _| id == "poison"),
        opts().max_attempts(3),
    )
    .unwrap()
    .with_hooks(hooks.clone());
    let st = w.stats();
    w.ensure_groups().await.unwrap();
    let cancel = CancellationToken::new();
    let h = spawn(w, &cancel);
    dispatch_now(&client, &["poison", "a", "b", "c"]).await;
    wait_for("the poison order dead-lettered", WAIT, || {
        let (d, a) = (
            st.dead_lettered.load(Ordering::SeqCst),
            st.acked.load(Ordering::SeqCst),
        );
        async move { d == 1 && a == 3 }
    })
    .await;
    let dead = client
        .admin()
        .dead_list(Q, Some("close"), 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    let d = &dead[0];
    assert_eq!(
        (
            d.id.as_str(),
            d.group.as_str(),
            d.attempts,
            d.last_error.as_str()
        ),
        ("poison", "close", 3, "attempt 3 failed")
    );
    assert_eq!(d.payload.to_value(), json!({"id": "poison"}));
    assert!(d.dead_at_ms >= d.due_at_ms);
    assert_eq!(
        pending(&client, STREAM, "close").await,
        0,
        "dead-lettering acked it"
    );
    let poison_calls = flaky
        .calls()
        .iter()
        .filter(|(id, _)| id == "poison")
        .count();
    assert_eq!(poison_calls, 3);
    assert_eq!(hooks.success.load(Ordering::SeqCst), 3);
    assert_eq!(hooks.failure.load(Ordering::SeqCst), 3);
    assert_eq!(hooks.dead.load(Ordering::SeqCst), 1);
    assert!(
        client
            .admin()
            .dead_list(Q, Some("notify"), 10)
            .await
            .unwrap()
            .is_empty()
    );
    cancel.cancel();
    h.await.unwrap();
}

#[tokio::test]
async fn replay_redelivers_to_the_failing_group_only_from_attempt_one() {
    let (_s, client) = start().await;
    let ok = Recorder::default();
    let healthy = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let calls: Arc<Mutex<Vec<(String, u32)>>> = Arc::default();
    let handler = {
        let (healthy, calls) = (healthy.clone(), calls.clone());
        move |d: Delivery| {
            calls.lock().unwrap().push((d.id.clone(), d.attempt));
            let up = healthy.load(Ordering::SeqCst);
            std::future::ready(if up {
                Ok(())
            } else {
                Err(HandlerError::permanent("partner down"))
            })
        }
    };
    let cancel = CancellationToken::new();
    let a = Worker::new(&client, Q, "notify", ok.handler(), opts()).unwrap();
    let b = Worker::new(&client, Q, "webhook", handler, opts()).unwrap();
    let (a_stats, b_stats) = (a.stats(), b.stats());
    a.ensure_groups().await.unwrap();
    b.ensure_groups().await.unwrap();
    let handles = vec![spawn(a, &cancel), spawn(b, &cancel)];
    dispatch_now(&client, &["o1", "o2"]).await;
    wait_for("both dead in webhook", WAIT, || {
        let n = b_stats.dead_lettered.load(Ordering::SeqCst);
        async move { n == 2 }
    })
    .await;
    ok.wait_len(2, WAIT).await;

    healthy.store(true, Ordering::SeqCst);
    let dead = client.admin().dead_list(Q, None, 10).await.unwrap();
    assert_eq!(dead.len(), 2);
    // Replay one by id, then the rest with "all".
    let one = client
        .admin()
        .dead_replay(
            Q,
            Some("webhook"),
            &Selection::Ids(vec![dead[0].entry_id.clone()]),
        )
        .await
        .unwrap();
    assert_eq!(one, 1);
    assert_eq!(
        client.admin().dead_list(Q, None, 10).await.unwrap().len(),
        1
    );
    let rest = client
        .admin()
        .dead_replay(Q, None, &Selection::All)
        .await
        .unwrap();
    assert_eq!(rest, 1);
    assert!(
        client
            .admin()
            .dead_list(Q, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    wait_for("both replays handled", WAIT, || {
        let n = b_stats.acked.load(Ordering::SeqCst);
        async move { n == 2 }
    })
    .await;
    let st = a_stats.clone();
    wait_for("notify skipped both replays", WAIT, move || {
        let n = st.skipped.load(Ordering::SeqCst);
        async move { n == 2 }
    })
    .await;
    let mut after: Vec<(String, u32)> = calls.lock().unwrap()[2..].to_vec();
    after.sort();
    assert_eq!(
        after,
        vec![("o1".into(), 1), ("o2".into(), 1)],
        "replays start at attempt 1"
    );
    assert_eq!(
        ok.len(),
        2,
        "notify already succeeded and never saw the replays"
    );
    // A skipped entry is acknowledged in the next ack batch: await it, do not race it.
    for group in ["notify", "webhook"] {
        let c = client.clone();
        wait_for(&format!("{group} settled"), WAIT, move || {
            let c = c.clone();
            async move { pending(&c, STREAM, group).await == 0 }
        })
        .await;
    }
    cancel.cancel();
    for h in handles {
        h.await.unwrap();
    }
}

#[tokio::test]
async fn purge_deletes_dead_letters_and_bad_ids_are_refused() {
    let (_s, client) = start().await;
    let w = Worker::new(
        &client,
        Q,
        "close",
        |_d: Delivery| async { Err(HandlerError::permanent("no")) },
        opts(),
    )
    .unwrap();
    let st = w.stats();
    w.ensure_groups().await.unwrap();
    let cancel = CancellationToken::new();
    let h = spawn(w, &cancel);
    dispatch_now(&client, &["o1", "o2", "o3"]).await;
    wait_for("three dead", WAIT, || {
        let n = st.dead_lettered.load(Ordering::SeqCst);
        async move { n == 3 }
    })
    .await;
    cancel.cancel();
    h.await.unwrap();
    let dead = client.admin().dead_list(Q, None, 10).await.unwrap();
    let e = client
        .admin()
        .dead_purge(Q, None, &Selection::Ids(vec!["not-an-id".into()]))
        .await
        .unwrap_err();
    assert_eq!(e.as_invalid().unwrap().code(), "invalid_id");
    assert_eq!(
        client
            .admin()
            .dead_purge(Q, Some("other-group"), &Selection::All)
            .await
            .unwrap(),
        0,
        "a group filter that matches nothing purges nothing"
    );
    let n = client
        .admin()
        .dead_purge(Q, None, &Selection::Ids(vec![dead[0].entry_id.clone()]))
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(
        client.admin().dead_list(Q, None, 10).await.unwrap().len(),
        2
    );
    assert_eq!(
        client
            .admin()
            .dead_purge(Q, Some("close"), &Selection::All)
            .await
            .unwrap(),
        2
    );
    assert!(
        client
            .admin()
            .dead_list(Q, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn a_dead_consumers_entries_are_reclaimed_after_the_visibility_timeout() {
    let (_s, client) = start().await;
    let vt = Duration::from_millis(300);
    // Consumer 1 takes the order and dies while handling it (its task is dropped).
    let started = Arc::new(AtomicU32::new(0));
    let hang = {
        let started = started.clone();
        move |_d: Delivery| {
            started.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<delayq::HandlerResult>()
        }
    };
    let w1 = Worker::new(
        &client,
        Q,
        "close",
        hang,
        opts().visibility_timeout(vt).consumer("c1"),
    )
    .unwrap();
    w1.ensure_groups().await.unwrap();
    let dying = tokio::spawn(w1.run(CancellationToken::new()));
    dispatch_now(&client, &["o1"]).await;
    let s1 = started.clone();
    wait_for("consumer 1 to start handling", WAIT, move || {
        let n = s1.load(Ordering::SeqCst);
        async move { n == 1 }
    })
    .await;
    dying.abort();
    let _ = dying.await;

    let rec = Recorder::default();
    let cancel = CancellationToken::new();
    let w2 = Worker::new(
        &client,
        Q,
        "close",
        rec.handler(),
        opts().visibility_timeout(vt).consumer("c2"),
    )
    .unwrap();
    let st = w2.stats();
    let h = spawn(w2, &cancel);
    rec.wait_len(1, WAIT).await;
    let d = &rec.deliveries()[0];
    assert_eq!(
        (d.id.as_str(), d.attempt),
        ("o1", 2),
        "taken over as the second delivery"
    );
    assert_eq!(st.reclaimed.load(Ordering::SeqCst), 1);
    wait_for("acked", WAIT, || {
        let c = client.clone();
        async move { pending(&c, STREAM, "close").await == 0 }
    })
    .await;
    cancel.cancel();
    h.await.unwrap();
}

#[tokio::test]
async fn a_slow_live_handler_keeps_its_lease_and_is_not_run_twice() {
    let (_s, client) = start().await;
    let vt = Duration::from_millis(200);
    let calls: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let handler = {
        let calls = calls.clone();
        move |d: Delivery| {
            *calls.lock().unwrap().entry(d.id.clone()).or_insert(0) += 1;
            async move {
                // The work itself takes three visibility timeouts.
                tokio::time::sleep(Duration::from_millis(600)).await;
                Ok(())
            }
        }
    };
    let cancel = CancellationToken::new();
    let mut handles = Vec::new();
    let mut stats = Vec::new();
    for c in ["c1", "c2"] {
        let w = Worker::new(
            &client,
            Q,
            "close",
            handler.clone(),
            opts().visibility_timeout(vt).consumer(c),
        )
        .unwrap();
        w.ensure_groups().await.unwrap();
        stats.push(w.stats());
        handles.push(spawn(w, &cancel));
    }
    dispatch_now(&client, &["slow"]).await;
    wait_for("the slow order acked", WAIT, || {
        let acked: u64 = stats.iter().map(|s| s.acked.load(Ordering::SeqCst)).sum();
        async move { acked == 1 }
    })
    .await;
    assert_eq!(
        calls.lock().unwrap().get("slow"),
        Some(&1),
        "run exactly once"
    );
    let reclaimed: u64 = stats
        .iter()
        .map(|s| s.reclaimed.load(Ordering::SeqCst))
        .sum();
    assert_eq!(reclaimed, 0);
    cancel.cancel();
    for h in handles {
        h.await.unwrap();
    }
}

#[tokio::test]
async fn an_entry_deleted_while_waiting_for_its_retry_is_dead_lettered_as_entry_missing() {
    let (_s, client) = start().await;
    let flaky = Flaky::default();
    let w = Worker::new(
        &client,
        Q,
        "close",
        flaky.handler(|_, _| true),
        opts().backoff(Backoff::Fixed(Duration::from_millis(200))),
    )
    .unwrap();
    let st = w.stats();
    w.ensure_groups().await.unwrap();
    let cancel = CancellationToken::new();
    let h = spawn(w, &cancel);
    dispatch_now(&client, &["o1"]).await;
    wait_for("a retry scheduled", WAIT, || {
        let n = st.retried.load(Ordering::SeqCst);
        async move { n == 1 }
    })
    .await;
    let entries: redis::Value = raw(&client, &["XRANGE", STREAM, "-", "+"]).await;
    let redis::Value::Array(items) = entries else {
        panic!()
    };
    let redis::Value::Array(first) = &items[0] else {
        panic!()
    };
    let id: String = redis::from_redis_value(first[0].clone()).unwrap();
    let _: i64 = raw(&client, &["XDEL", STREAM, &id]).await;
    wait_for("the timer and pending entry gone", WAIT, || {
        let c = client.clone();
        async move {
            let timers: i64 = raw(&c, &["ZCARD", "{dq:order-close:0}:timers:close"]).await;
            timers == 0 && pending(&c, STREAM, "close").await == 0
        }
    })
    .await;
    assert_eq!(flaky.calls().len(), 1, "nothing left to deliver");
    // It left the pending list through a dead letter with a stable reason, never silently.
    let page = client.admin().dead_page(Q, None, None, 10).await.unwrap();
    assert_eq!(page.dead_letters.len(), 1, "{page:?}");
    assert!(
        page.dead_letters[0].last_error.starts_with("entry_missing"),
        "{:?}",
        page.dead_letters[0]
    );
    assert_eq!(st.dead_lettered.load(Ordering::SeqCst), 1);
    let hist = client.admin().history(Q, "o1").await.unwrap().unwrap();
    assert_eq!(hist.groups[0].state, delayq::GroupState::Dead, "{hist:?}");
    cancel.cancel();
    h.await.unwrap();
}

#[tokio::test]
async fn a_handlers_retry_after_overrides_the_backoff() {
    let (_s, client) = start().await;
    let calls: Arc<Mutex<Vec<u32>>> = Arc::default();
    let handler = {
        let calls = calls.clone();
        move |d: Delivery| {
            calls.lock().unwrap().push(d.attempt);
            std::future::ready(if d.attempt == 1 {
                Err(HandlerError::retry_after(
                    "rate limited",
                    Duration::from_millis(50),
                ))
            } else {
                Ok(())
            })
        }
    };
    // The policy alone would wait an hour.
    let w = Worker::new(
        &client,
        Q,
        "close",
        handler,
        opts().backoff(Backoff::Fixed(Duration::from_secs(3600))),
    )
    .unwrap();
    w.ensure_groups().await.unwrap();
    let cancel = CancellationToken::new();
    let h = spawn(w, &cancel);
    dispatch_now(&client, &["o1"]).await;
    let c2 = calls.clone();
    wait_for("the second attempt", WAIT, move || {
        let n = c2.lock().unwrap().len();
        async move { n == 2 }
    })
    .await;
    assert_eq!(*calls.lock().unwrap(), vec![1, 2]);
    cancel.cancel();
    h.await.unwrap();
}

/// The on-time promise is measured on first deliveries only: a retry after a 2 s backoff
/// lands in `delayq_redelivery_age_seconds`, not in `delayq_lateness_seconds`.
#[tokio::test]
async fn lateness_counts_first_deliveries_only() {
    let (_s, client) = start().await;
    let sink = Arc::new(LatenessSink::default());
    assert!(delayq::engine::telemetry::set_sink(sink.clone()));
    // A queue of its own: the sink is the process's, shared with the other tests.
    const LQ: &str = "lateness-q";
    client.admin().create_queue(LQ, 1).await.unwrap();
    let flaky = Flaky::default();
    let w = Worker::new(
        &client,
        LQ,
        "close",
        flaky.handler(|_, attempt| attempt == 1),
        opts().backoff(Backoff::Fixed(Duration::from_secs(2))),
    )
    .unwrap();
    w.ensure_groups().await.unwrap();
    let cancel = CancellationToken::new();
    let h = spawn(w, &cancel);
    client
        .schedule(LQ, "late", When::in_ms(0), json!({}))
        .await
        .unwrap();
    Dispatcher::new(&client, LQ, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
    wait_for("the retry handled", WAIT, || {
        let n = flaky.calls().len();
        async move { n == 2 }
    })
    .await;
    let seen: Vec<f64> = sink
        .lateness
        .lock()
        .unwrap()
        .iter()
        .filter(|(q, _)| q == LQ)
        .map(|(_, s)| *s)
        .collect();
    assert_eq!(seen.len(), 1, "one first delivery: {seen:?}");
    assert!(
        seen[0] < 1.0,
        "the first delivery's lateness, not the retry's: {seen:?}"
    );
    cancel.cancel();
    h.await.unwrap();
}

#[derive(Default)]
struct LatenessSink {
    lateness: Mutex<Vec<(String, f64)>>,
}

impl delayq::engine::telemetry::Sink for LatenessSink {
    fn scheduled(&self, _: &str, _: u64) {}
    fn dispatched(&self, _: &str, _: u64) {}
    fn handled(&self, _: &str, _: &str, _: &'static str) {}
    fn lateness(&self, queue: &str, _: &str, seconds: f64) {
        self.lateness
            .lock()
            .unwrap()
            .push((queue.to_owned(), seconds));
    }
}
