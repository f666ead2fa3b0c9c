#![allow(clippy::unwrap_used)]
//! The core engine against real redis-server processes: scheduling, cancelling,
//! dispatching into streams, consumer groups, shutdown and bad input.

use crate::support;

use delayq::{
    CancelOutcome, Client, ClientOptions, Clock, Delivery, DeliveryFlag, Dispatcher,
    DispatcherOptions, HandlerError, InvalidInput, ManualClock, Mode, NewOrder, Payload,
    RescheduleOutcome, ScheduleOutcome, When, Worker, WorkerOptions,
};
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use support::{Recorder, pending, raw, snapshot, start, start_with, start_with_clock, wait_for};
use tokio_util::sync::CancellationToken;

const T0: i64 = 1_800_000_000_000;
const Q: &str = "order-close";
const STREAM: &str = "{dq:order-close:0}:stream";
const WAIT: Duration = Duration::from_secs(60);

fn fast_worker() -> WorkerOptions {
    WorkerOptions::default()
        .block(Duration::from_millis(100))
        .concurrency(32)
}

/// Starts `n` dispatchers and one worker per group; returns the token that stops them.
fn spawn_pipeline(
    client: &Client,
    dispatchers: usize,
    groups: &[(&str, &Recorder)],
) -> (CancellationToken, Vec<tokio::task::JoinHandle<()>>) {
    let cancel = CancellationToken::new();
    let mut handles = Vec::new();
    for _ in 0..dispatchers {
        let d = Dispatcher::new(client, Q, DispatcherOptions::default()).unwrap();
        handles.push(tokio::spawn(d.run(cancel.clone())));
    }
    for (group, rec) in groups {
        let w = Worker::new(client, Q, group, rec.handler(), fast_worker()).unwrap();
        let c = cancel.clone();
        handles.push(tokio::spawn(async move { w.run(c).await.unwrap() }));
    }
    (cancel, handles)
}

async fn stop(cancel: CancellationToken, handles: Vec<tokio::task::JoinHandle<()>>) {
    cancel.cancel();
    for h in handles {
        h.await.unwrap();
    }
}

#[tokio::test]
async fn enqueue_writes_schedule_and_payload_together() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_s, client) = start_with_clock(clock.clone()).await;
    let r = client
        .schedule(Q, "order-1", When::in_ms(15 * 60_000), json!({"user": 7}))
        .await
        .unwrap();
    assert_eq!(r.outcome, ScheduleOutcome::Created);
    assert_eq!(r.due_at_ms, T0 + 15 * 60_000);
    let score: String = raw(&client, &["ZSCORE", "{dq:order-close:0}:due", "order-1"]).await;
    assert_eq!(score, (T0 + 15 * 60_000).to_string());
    let stored: String = raw(&client, &["HGET", "{dq:order-close:0}:payload", "order-1"]).await;
    assert_eq!(stored, format!("{T0}:{{\"user\":7}}"));
    let got = client.get(Q, "order-1").await.unwrap().unwrap();
    assert_eq!(got.due_at_ms, T0 + 15 * 60_000);
    assert_eq!(got.enqueued_at_ms, Some(T0));
    assert_eq!(got.payload, json!({"user": 7}));
    assert!(client.get(Q, "order-2").await.unwrap().is_none());
    // The registered queues (the test declared them); scheduling registers nothing.
    assert_eq!(
        client.queues().await.unwrap(),
        support::QUEUES_SORTED.to_vec()
    );
}

#[tokio::test]
async fn upsert_replaces_and_if_absent_keeps() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_s, client) = start_with_clock(clock).await;
    let a = client
        .schedule(Q, "o", When::at_ms(T0 + 1000), json!(1))
        .await
        .unwrap();
    assert_eq!(a.outcome, ScheduleOutcome::Created);
    let b = client
        .schedule(Q, "o", When::at_ms(T0 + 2000), json!(2))
        .await
        .unwrap();
    assert_eq!(b.outcome, ScheduleOutcome::Updated);
    let got = client.get(Q, "o").await.unwrap().unwrap();
    assert_eq!((got.due_at_ms, got.payload), (T0 + 2000, json!(2)));

    let c = client
        .schedule_with(
            Q,
            NewOrder::new("o", When::at_ms(T0 + 3000), json!(3)),
            Mode::IfAbsent,
        )
        .await
        .unwrap();
    assert_eq!(c.outcome, ScheduleOutcome::Unchanged);
    let got = client.get(Q, "o").await.unwrap().unwrap();
    assert_eq!((got.due_at_ms, got.payload), (T0 + 2000, json!(2)));

    let d = client
        .schedule_with(
            Q,
            NewOrder::new("p", When::at_ms(T0 + 3000), json!(3)),
            Mode::IfAbsent,
        )
        .await
        .unwrap();
    assert_eq!(d.outcome, ScheduleOutcome::Created);

    // Batches report per order, in order.
    let out = client
        .schedule_many(
            Q,
            &[
                NewOrder::new("o", When::at_ms(T0), json!(null)),
                NewOrder::new("q", When::at_ms(T0), json!(null)),
            ],
            Mode::IfAbsent,
        )
        .await
        .unwrap();
    let outcomes: Vec<_> = out.iter().map(|s| s.outcome).collect();
    assert_eq!(
        outcomes,
        vec![ScheduleOutcome::Unchanged, ScheduleOutcome::Created]
    );
}

#[tokio::test]
async fn an_id_twice_in_one_call_acts_as_two_calls_in_order() {
    // enqueue.lua writes a whole call with one ZADD and one HSET per 500 orders; an id that
    // appears twice must still read as two schedules in order, and a call larger than Lua's
    // unpack limit (8,000 values) must work when the script is called directly.
    let (_s, client) = start().await;
    let at = |ms: i64| When::at_ms(T0 + ms);
    let out = client
        .schedule_many(
            Q,
            &[
                NewOrder::new("a", at(1), json!(1)),
                NewOrder::new("a", at(2), json!(2)),
                NewOrder::new("b", at(3), json!(3)),
            ],
            Mode::Upsert,
        )
        .await
        .unwrap();
    let outcomes: Vec<_> = out.iter().map(|s| s.outcome).collect();
    use ScheduleOutcome::{Created, Unchanged, Updated};
    assert_eq!(outcomes, vec![Created, Updated, Created]);
    let a = client.get(Q, "a").await.unwrap().unwrap();
    assert_eq!((a.due_at_ms, a.payload), (T0 + 2, json!(2)));

    let out = client
        .schedule_many(
            Q,
            &[
                NewOrder::new("c", at(4), json!(4)),
                NewOrder::new("c", at(5), json!(5)),
                NewOrder::new("a", at(6), json!(6)),
            ],
            Mode::IfAbsent,
        )
        .await
        .unwrap();
    let outcomes: Vec<_> = out.iter().map(|s| s.outcome).collect();
    assert_eq!(outcomes, vec![Created, Unchanged, Unchanged]);
    let c = client.get(Q, "c").await.unwrap().unwrap();
    assert_eq!((c.due_at_ms, c.payload), (T0 + 4, json!(4)));
    let a = client.get(Q, "a").await.unwrap().unwrap();
    assert_eq!((a.due_at_ms, a.payload), (T0 + 2, json!(2)));

    // 5,000 orders in one direct call: 10,000 values for ZADD and for HSET.
    let script = redis::Script::new(&delayq::engine::scripts::ENQUEUE_LUA);
    let epoch = support::epoch(&client, "order-close").await;
    let mut inv = support::enqueue_call(&script, "order-close", 0);
    inv.arg("upsert:").arg(T0.to_string()).arg(&epoch);
    for i in 0..5000 {
        inv.arg(format!("big-{i}"))
            .arg((T0 + i).to_string())
            .arg(format!("{{\"i\":{i}}}"))
            .arg("");
    }
    let mut conn = client.connection();
    let codes: Vec<i64> = inv.invoke_async(&mut conn).await.unwrap();
    assert_eq!(codes.len(), 5000);
    assert!(codes.iter().all(|&c| c == 1));
    let last = client.get(Q, "big-4999").await.unwrap().unwrap();
    assert_eq!(
        (last.due_at_ms, last.payload),
        (T0 + 4999, json!({"i": 4999}))
    );
    let n: i64 = redis::cmd("ZCARD")
        .arg("{dq:order-close:0}:due")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(n, 5003);
}

/// Dispatch script calls so far, from `INFO commandstats` (only the dispatcher calls scripts
/// while no worker runs).
async fn script_calls(client: &Client) -> u64 {
    command_calls(client, "evalsha").await
}

#[tokio::test]
async fn a_lateness_budget_moves_a_steady_trickle_in_fewer_calls() {
    // 100 orders due 2 ms apart: with no budget the dispatcher passes once per due
    // millisecond (about 100 calls); with a 50 ms budget, once it has seen orders come due
    // faster than one per 17 ms (the budget's 1/3), a pass that moved a few waits 17 ms, so
    // the 200 ms trickle takes a handful of calls. Every order still goes out, in due order.
    trickle_in_few_calls(DispatcherOptions::default().lateness_budget(Duration::from_millis(50)))
        .await;
    assert!(
        DispatcherOptions::default()
            .lateness_budget(Duration::from_millis(1001))
            .validate()
            .is_err()
    );
}

#[tokio::test]
async fn a_lingering_dispatcher_moves_a_trickle_in_fewer_calls() {
    // The same with a fixed 50 ms linger (which replaces the budget's own spacing).
    trickle_in_few_calls(
        DispatcherOptions::default()
            .lateness_budget(Duration::ZERO)
            .linger(Duration::from_millis(50)),
    )
    .await;
}

async fn trickle_in_few_calls(opts: DispatcherOptions) {
    let (_s, client) = start().await;
    let t = client.now_ms() + 300;
    let orders: Vec<NewOrder> = (0..100)
        .map(|i| NewOrder::new(format!("o{i:03}"), When::at_ms(t + 2 * i), json!(i)))
        .collect();
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
    let before = script_calls(&client).await;
    let cancel = CancellationToken::new();
    let d = tokio::spawn(
        Dispatcher::new(&client, Q, opts)
            .unwrap()
            .run(cancel.clone()),
    );
    wait_for("all 100 dispatched", WAIT, || async {
        raw::<i64>(&client, &["XLEN", STREAM]).await == 100
    })
    .await;
    cancel.cancel();
    d.await.unwrap();
    let calls = script_calls(&client).await - before;
    assert!(calls < 30, "{calls} dispatch calls for a 200 ms trickle");
    let ids: Vec<String> = parse_xrange(raw(&client, &["XRANGE", STREAM, "-", "+"]).await)
        .into_iter()
        .map(|(_, f)| f.into_iter().find(|(k, _)| k == "id").unwrap().1)
        .collect();
    let want: Vec<String> = (0..100).map(|i| format!("o{i:03}")).collect();
    assert_eq!(ids, want);
    assert!(
        DispatcherOptions::default()
            .linger(Duration::from_millis(51))
            .validate()
            .is_err()
    );
}

#[tokio::test]
async fn cancel_before_due_is_never_delivered() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_s, client) = start_with_clock(clock.clone()).await;
    client
        .schedule(Q, "paid", When::in_ms(1000), json!({}))
        .await
        .unwrap();
    client
        .schedule(Q, "unpaid", When::in_ms(1000), json!({}))
        .await
        .unwrap();
    assert_eq!(
        client.cancel(Q, "paid").await.unwrap(),
        CancelOutcome::Cancelled
    );
    assert_eq!(
        client.cancel(Q, "paid").await.unwrap(),
        CancelOutcome::NotFound
    );
    assert_eq!(
        client.cancel(Q, "never").await.unwrap(),
        CancelOutcome::NotFound
    );

    let d = Dispatcher::new(&client, Q, DispatcherOptions::default()).unwrap();
    assert_eq!(d.pass().await.unwrap().moved, 0, "nothing is due yet");
    clock.advance(Duration::from_millis(1000));
    assert_eq!(d.pass().await.unwrap().moved, 1);

    let rec = Recorder::default();
    let (cancel, handles) = spawn_pipeline(&client, 0, &[("close", &rec)]);
    rec.wait_len(1, WAIT).await;
    stop(cancel, handles).await;
    let ids: Vec<String> = rec.deliveries().into_iter().map(|d| d.id).collect();
    assert_eq!(ids, vec!["unpaid"]);
    let len: i64 = raw(&client, &["XLEN", STREAM]).await;
    assert_eq!(len, 1, "the cancelled order never reached the stream");
    // Cancelling after dispatch is too late and says so.
    assert_eq!(
        client.cancel(Q, "unpaid").await.unwrap(),
        CancelOutcome::NotFound
    );
}

#[tokio::test]
async fn reschedule_moves_due_time_and_keeps_payload() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_s, client) = start_with_clock(clock.clone()).await;
    client
        .schedule(Q, "o", When::in_ms(1000), json!({"keep": true}))
        .await
        .unwrap();
    assert_eq!(
        client.reschedule(Q, "o", When::in_ms(5000)).await.unwrap(),
        RescheduleOutcome::Rescheduled
    );
    assert_eq!(
        client
            .reschedule(Q, "missing", When::in_ms(5000))
            .await
            .unwrap(),
        RescheduleOutcome::NotFound
    );
    assert!(
        client.get(Q, "missing").await.unwrap().is_none(),
        "reschedule creates nothing"
    );
    let d = Dispatcher::new(&client, Q, DispatcherOptions::default()).unwrap();
    clock.advance(Duration::from_millis(1000));
    let p = d.pass().await.unwrap();
    assert_eq!((p.moved, p.next_due_ms), (0, Some(T0 + 5000)));
    clock.advance(Duration::from_millis(4000));
    assert_eq!(d.pass().await.unwrap().moved, 1);
    let entries: redis::Value = raw(&client, &["XRANGE", STREAM, "-", "+"]).await;
    let text = format!("{entries:?}");
    assert!(text.contains("keep"), "payload kept: {text}");
}

#[tokio::test]
async fn every_order_is_delivered_once_on_the_server_clock() {
    let (_s, client) = start().await;
    let rec = Recorder::default();
    let (cancel, handles) = spawn_pipeline(&client, 1, &[("close", &rec)]);
    let orders: Vec<NewOrder> = (0..500)
        .map(|i| NewOrder::new(format!("o{i}"), When::in_ms(i % 300), json!({"i": i})))
        .collect();
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
    rec.wait_len(500, WAIT).await;
    stop(cancel, handles).await;
    let counts = rec.counts();
    assert_eq!(counts.len(), 500);
    assert!(
        counts.values().all(|&c| c == 1),
        "a duplicate without any fault"
    );
    for d in rec.deliveries() {
        assert!(d.dispatched_at_ms >= d.due_at_ms, "dispatched early: {d:?}");
        assert_eq!(d.attempt, 1);
        assert_eq!(d.flag, None);
        assert_eq!(d.payload["i"], json!(d.id[1..].parse::<i64>().unwrap()));
    }
    assert_eq!(pending(&client, STREAM, "close").await, 0, "all acked");
}

#[tokio::test]
async fn ten_thousand_random_orders_dispatch_in_due_order_and_arrive_once() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_s, client) = start_with_clock(clock.clone()).await;
    let mut rng = fastrand::Rng::with_seed(7);
    let orders: Vec<NewOrder> = (0..10_000)
        .map(|i| {
            NewOrder::new(
                format!("o{i}"),
                When::at_ms(T0 + rng.i64(0..60_000)),
                json!(i),
            )
        })
        .collect();
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
    let d = Dispatcher::new(&client, Q, DispatcherOptions::default().batch(700)).unwrap();
    // Time moves forward in uneven steps; each step drains what is due.
    let mut moved = 0;
    while clock.now_ms() <= T0 + 60_000 {
        clock.advance(Duration::from_millis(rng.u64(1..5_000)));
        moved += d.drain().await.unwrap().moved;
    }
    assert_eq!(moved, 10_000);

    let entries: Vec<(String, Vec<(String, String)>)> = {
        let v: redis::Value = raw(&client, &["XRANGE", STREAM, "-", "+"]).await;
        parse_xrange(v)
    };
    let dues: Vec<i64> = entries
        .iter()
        .map(|(_, f)| {
            f.iter()
                .find(|(k, _)| k == "due_ms")
                .unwrap()
                .1
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(dues.len(), 10_000);
    assert!(
        dues.windows(2).all(|w| w[0] <= w[1]),
        "stream not in due order"
    );

    let rec = Recorder::default();
    let (cancel, handles) = spawn_pipeline(&client, 0, &[("close", &rec)]);
    rec.wait_len(10_000, WAIT).await;
    stop(cancel, handles).await;
    let counts = rec.counts();
    assert_eq!(counts.len(), 10_000);
    assert!(counts.values().all(|&c| c == 1));
}

#[tokio::test]
async fn four_concurrent_dispatchers_neither_duplicate_nor_lose() {
    let (s, client) = start().await;
    let rec = Recorder::default();
    // Each dispatcher gets its own client (its own connection), like separate processes.
    let cancel = CancellationToken::new();
    let mut handles = Vec::new();
    for _ in 0..4 {
        let c = Client::connect(&s.url()).await.unwrap();
        let d = Dispatcher::new(&c, Q, DispatcherOptions::default().batch(50)).unwrap();
        handles.push(tokio::spawn(d.run(cancel.clone())));
    }
    let w = Worker::new(&client, Q, "close", rec.handler(), fast_worker()).unwrap();
    let wc = cancel.clone();
    handles.push(tokio::spawn(async move { w.run(wc).await.unwrap() }));
    let orders: Vec<NewOrder> = (0..5000)
        .map(|i| NewOrder::new(format!("o{i}"), When::in_ms(i % 500), json!(i)))
        .collect();
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
    rec.wait_len(5000, WAIT).await;
    stop(cancel, handles).await;
    let counts = rec.counts();
    assert_eq!(counts.len(), 5000, "lost orders");
    assert!(counts.values().all(|&c| c == 1), "duplicated orders");
    let len: i64 = raw(&client, &["XLEN", STREAM]).await;
    assert_eq!(len, 5000, "each order written to the stream once");
}

#[tokio::test]
async fn two_groups_each_receive_every_order() {
    let (_s, client) = start().await;
    // Dispatch before any group exists: groups read from the start of the stream.
    let orders: Vec<NewOrder> = (0..1000)
        .map(|i| NewOrder::new(format!("o{i}"), When::in_ms(0), json!(i)))
        .collect();
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
    let d = Dispatcher::new(&client, Q, DispatcherOptions::default()).unwrap();
    assert_eq!(d.drain().await.unwrap().moved, 1000);

    let (close, notify) = (Recorder::default(), Recorder::default());
    let (cancel, handles) = spawn_pipeline(&client, 1, &[("close", &close), ("notify", &notify)]);
    close.wait_len(1000, WAIT).await;
    notify.wait_len(1000, WAIT).await;
    stop(cancel, handles).await;
    for rec in [&close, &notify] {
        let counts = rec.counts();
        assert_eq!(counts.len(), 1000);
        assert!(counts.values().all(|&c| c == 1));
    }
    assert!(close.deliveries().iter().all(|d| d.group == "close"));
    assert!(notify.deliveries().iter().all(|d| d.group == "notify"));
}

#[tokio::test]
async fn graceful_shutdown_finishes_and_acks_in_flight_handlers() {
    let (_s, client) = start().await;
    let started = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let handler = {
        let (started, release) = (started.clone(), release.clone());
        move |_d: Delivery| {
            let (started, release) = (started.clone(), release.clone());
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                release.acquire().await.unwrap().forget();
                Ok(())
            }
        }
    };
    let w = Worker::new(&client, Q, "close", handler, fast_worker()).unwrap();
    let stats = w.stats();
    w.ensure_groups().await.unwrap();
    let cancel = CancellationToken::new();
    let run = tokio::spawn(w.run(cancel.clone()));
    for i in 0..3 {
        client
            .schedule(Q, &format!("o{i}"), When::in_ms(0), json!(i))
            .await
            .unwrap();
    }
    Dispatcher::new(&client, Q, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
    let s2 = started.clone();
    wait_for("3 handlers running", WAIT, move || {
        let n = s2.load(Ordering::SeqCst);
        async move { n == 3 }
    })
    .await;
    cancel.cancel();
    assert_eq!(
        pending(&client, STREAM, "close").await,
        3,
        "in flight, not yet acked"
    );
    release.add_permits(3);
    run.await.unwrap().unwrap();
    assert_eq!(
        pending(&client, STREAM, "close").await,
        0,
        "finished handlers were acked"
    );
    assert_eq!(stats.acked.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn shutdown_grace_abandons_stuck_handlers_and_leaves_them_pending() {
    let (_s, client) = start().await;
    let handler = |_d: Delivery| async {
        std::future::pending::<()>().await;
        Ok(())
    };
    let opts = fast_worker().shutdown_grace(Duration::from_millis(50));
    let w = Worker::new(&client, Q, "close", handler, opts).unwrap();
    w.ensure_groups().await.unwrap();
    let cancel = CancellationToken::new();
    let run = tokio::spawn(w.run(cancel.clone()));
    client
        .schedule(Q, "stuck", When::in_ms(0), json!(null))
        .await
        .unwrap();
    Dispatcher::new(&client, Q, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
    wait_for("the entry to be read", WAIT, || {
        let c = client.clone();
        async move { pending(&c, STREAM, "close").await == 1 }
    })
    .await;
    cancel.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(
        pending(&client, STREAM, "close").await,
        1,
        "not acked, so not lost"
    );
}

#[tokio::test]
async fn failed_panicked_and_timed_out_attempts_stay_pending_permanent_ones_die() {
    let (_s, client) = start().await;
    let handler = |d: Delivery| async move {
        match d.id.as_str() {
            "fail" => Err(HandlerError::retry("downstream is down")),
            "permanent" => Err(HandlerError::permanent("bad order")),
            "panic" => panic!("handler bug"),
            "slow" => {
                std::future::pending::<()>().await;
                Ok(())
            }
            _ => Ok(()),
        }
    };
    // Retries an hour away: this test sees only the first attempt of each.
    let opts = fast_worker()
        .handler_timeout(Duration::from_millis(200))
        .backoff(delayq::Backoff::Fixed(Duration::from_secs(3600)));
    let w = Worker::new(&client, Q, "close", handler, opts).unwrap();
    let stats = w.stats();
    let cancel = CancellationToken::new();
    let run = tokio::spawn(w.run(cancel.clone()));
    for id in ["ok1", "fail", "permanent", "panic", "slow", "ok2"] {
        client
            .schedule(Q, id, When::in_ms(0), json!(null))
            .await
            .unwrap();
    }
    Dispatcher::new(&client, Q, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
    let st = stats.clone();
    wait_for("all six settled", WAIT, move || {
        let retried = st.retried.load(Ordering::SeqCst);
        let dead = st.dead_lettered.load(Ordering::SeqCst);
        let acked = st.acked.load(Ordering::SeqCst);
        async move { retried == 3 && dead == 1 && acked == 2 }
    })
    .await;
    assert_eq!(stats.failed.load(Ordering::SeqCst), 2);
    assert_eq!(stats.panicked.load(Ordering::SeqCst), 1);
    assert_eq!(stats.timed_out.load(Ordering::SeqCst), 1);
    assert_eq!(
        pending(&client, STREAM, "close").await,
        3,
        "retries wait in the pending list"
    );
    let dead = client.admin().dead_list(Q, None, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].id.as_str(), dead[0].last_error.as_str()),
        ("permanent", "bad order")
    );
    cancel.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test]
async fn bad_input_is_refused_with_its_error_and_changes_nothing() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_s, client) = start_with_clock(clock).await;
    client
        .schedule(Q, "existing", When::in_ms(1000), json!({"a": 1}))
        .await
        .unwrap();
    let before = snapshot(&client).await;

    let big = Payload::from_value(&json!("x".repeat(64 * 1024)));
    let cases: Vec<(&str, delayq::Error)> = vec![
        (
            "bad queue",
            client
                .schedule("a:b", "o", When::in_ms(1), json!(1))
                .await
                .unwrap_err(),
        ),
        (
            "empty id",
            client
                .schedule(Q, "", When::in_ms(1), json!(1))
                .await
                .unwrap_err(),
        ),
        (
            "control id",
            client
                .schedule(Q, "a\u{7}b", When::in_ms(1), json!(1))
                .await
                .unwrap_err(),
        ),
        (
            "long id",
            client
                .schedule(Q, &"x".repeat(257), When::in_ms(1), json!(1))
                .await
                .unwrap_err(),
        ),
        (
            "big payload",
            client
                .schedule(Q, "o", When::in_ms(1), big.clone())
                .await
                .unwrap_err(),
        ),
        (
            "negative delay",
            client
                .schedule(Q, "o", When::in_ms(-1), json!(1))
                .await
                .unwrap_err(),
        ),
        (
            "before 1970",
            client
                .schedule(Q, "o", When::at_ms(-1), json!(1))
                .await
                .unwrap_err(),
        ),
        (
            "11 years ahead",
            client
                .schedule(Q, "o", When::in_ms(11 * 366 * 86_400_000), json!(1))
                .await
                .unwrap_err(),
        ),
        (
            "upsert over existing with bad payload",
            client
                .schedule(Q, "existing", When::in_ms(1), big)
                .await
                .unwrap_err(),
        ),
        ("cancel bad id", client.cancel(Q, "").await.unwrap_err()),
        (
            "cancel bad queue",
            client.cancel("", "o").await.unwrap_err(),
        ),
        (
            "reschedule negative",
            client
                .reschedule(Q, "existing", When::in_ms(-5))
                .await
                .unwrap_err(),
        ),
        ("get bad id", client.get(Q, "a\nb").await.unwrap_err()),
    ];
    let codes: Vec<(&str, &str)> = cases
        .iter()
        .map(|(what, e)| {
            (
                *what,
                e.as_invalid()
                    .unwrap_or_else(|| panic!("{what}: {e}"))
                    .code(),
            )
        })
        .collect();
    assert_eq!(
        codes,
        vec![
            ("bad queue", "invalid_queue"),
            ("empty id", "invalid_id"),
            ("control id", "invalid_id"),
            ("long id", "invalid_id"),
            ("big payload", "payload_too_large"),
            ("negative delay", "invalid_delay"),
            ("before 1970", "invalid_due_time"),
            ("11 years ahead", "invalid_delay"),
            ("upsert over existing with bad payload", "payload_too_large"),
            ("cancel bad id", "invalid_id"),
            ("cancel bad queue", "invalid_queue"),
            ("reschedule negative", "invalid_delay"),
            ("get bad id", "invalid_id"),
        ]
    );
    // Messages name the field.
    assert!(
        cases[1].1.to_string().starts_with("invalid id"),
        "{}",
        cases[1].1
    );
    assert!(
        cases[4].1.to_string().contains("65538 bytes"),
        "{}",
        cases[4].1
    );
    assert!(Payload::from_json("{\"a\":").is_err());

    // One bad order refuses the whole batch, naming its index.
    let batch: Vec<NewOrder> = (0..10)
        .map(|i| {
            let id = if i == 3 {
                String::new()
            } else {
                format!("b{i}")
            };
            NewOrder::new(id, When::in_ms(1), json!(i))
        })
        .collect();
    let e = client
        .schedule_many(Q, &batch, Mode::Upsert)
        .await
        .unwrap_err();
    match e.as_invalid() {
        Some(InvalidInput::InBatch { index: 3, source }) => {
            assert!(matches!(**source, InvalidInput::Id { .. }))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(e.to_string(), "message 3: invalid id: must not be empty");

    // Bad options, too.
    let opts = DispatcherOptions::default().batch(1001);
    assert!(Dispatcher::new(&client, Q, opts).is_err());
    assert!(Worker::new(&client, Q, "", Recorder::default().handler(), fast_worker()).is_err());

    assert_eq!(
        snapshot(&client).await,
        before,
        "a refused call changed Redis"
    );
}

#[tokio::test]
async fn the_scripts_refuse_malformed_arguments_without_writing() {
    // Producers in other languages call enqueue.lua directly: it checks before writing.
    let (_s, client) = start().await;
    let script = redis::Script::new(&delayq::engine::scripts::ENQUEUE_LUA);
    let mut conn = client.connection();
    let epoch = support::epoch(&client, "q").await;
    let r: redis::RedisResult<Vec<i64>> = support::enqueue_call(&script, "q", 0)
        .arg("upsert:")
        .arg(T0)
        .arg(&epoch)
        .arg("a")
        .arg(T0)
        .arg("{}")
        .arg("")
        .arg("b")
        .arg("soon")
        .arg("{}")
        .arg("")
        .invoke_async(&mut conn)
        .await;
    let e = r.unwrap_err();
    assert!(
        e.to_string().contains("due_ms of order b is not a number"),
        "{e}"
    );
    assert_eq!(support::data_keys(&client).await, 0);
}

#[tokio::test]
async fn the_producer_scripts_refuse_a_shorter_set_of_keys_without_writing() {
    // Each takes one KEYS arity (issue 40): the shorter forms producers sent before a key
    // existed, otherwise valid, are refused before any write.
    let (_s, client) = start().await;
    client
        .schedule(Q, "existing", When::in_ms(60_000), json!(1))
        .await
        .unwrap();
    let before = snapshot(&client).await;
    let epoch = support::epoch(&client, "order-close").await;
    let k = support::shard_keys("order-close", 0);
    let t0 = T0.to_string();
    // As every supported server runs them (what `delayq scripts export` gives the SDKs: a
    // read-only script without the flags line Redis 6.2 cannot compile).
    let text = |name: &str| {
        delayq::engine::scripts::all()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| t)
            .unwrap()
    };
    for (name, keys, args, n) in [
        (
            "enqueue",
            vec![&k.due, &k.payload, &k.meta],
            vec!["upsert", &t0, &epoch, "a", &t0, "{}"],
            10,
        ),
        ("cancel", vec![&k.due, &k.payload], vec!["existing"], 8),
        ("reschedule", vec![&k.due], vec!["existing", &t0], 5),
        ("get", vec![&k.due, &k.payload], vec!["existing"], 4),
        (
            "tag_bulk",
            vec![
                &k.due,
                &k.payload,
                &k.levels,
                &k.debounce,
                &k.tags,
                &k.keyed,
                &k.key_ring,
            ],
            vec!["t", "10", "at", &t0, ""],
            8,
        ),
    ] {
        let script = redis::Script::new(text(name));
        let mut inv = script.prepare_invoke();
        for key in keys {
            inv.key(key);
        }
        for a in args {
            inv.arg(a);
        }
        let r: redis::RedisResult<redis::Value> = inv.invoke_async(&mut client.connection()).await;
        let e = r.unwrap_err().to_string();
        assert!(e.contains(&format!("{n} KEYS expected")), "{e}");
        assert_eq!(snapshot(&client).await, before);
    }
}

#[tokio::test]
async fn the_scripts_accept_only_canonical_integers() {
    // Each malformed number, in `now` or in a due time after a valid order of the same
    // call, leaves every key exactly as it was (DUMP of every key compared).
    let (_s, client) = start().await;
    client
        .schedule(Q, "existing", When::in_ms(60_000), json!(1))
        .await
        .unwrap();
    let before = snapshot(&client).await;
    let script = redis::Script::new(&delayq::engine::scripts::ENQUEUE_LUA);
    let epoch = support::epoch(&client, "order-close").await;
    let good = T0.to_string();
    for bad in [
        " 5",
        "5 ",
        "nan",
        "inf",
        "-inf",
        "1e3",
        "0x10",
        "",
        "-5",
        "99999999999999999",
        // 16 digits, beyond what a double holds exactly (2^53 = 9007199254740992).
        "9999999999999999",
        "9007199254740992",
    ] {
        for (now, due) in [(bad, good.as_str()), (good.as_str(), bad)] {
            let mut conn = client.connection();
            let r: redis::RedisResult<Vec<i64>> = support::enqueue_call(&script, "order-close", 0)
                .arg("upsert:")
                .arg(now)
                .arg(&epoch)
                .arg("a")
                .arg(&good)
                .arg("{}")
                .arg("")
                .arg("b")
                .arg(due)
                .arg("{}")
                .arg("")
                .invoke_async(&mut conn)
                .await;
            assert!(r.is_err(), "now {now:?} due {due:?} was accepted");
            assert_eq!(snapshot(&client).await, before, "now {now:?} due {due:?}");
        }
    }
    // The dispatcher's and reschedule's numbers too, each refused for what is wrong with it
    // (every KEYS given: a count the script does not take is refused before the numbers).
    let k = support::shard_keys("order-close", 0);
    let dequeue_keys = vec![
        k.due.clone(),
        k.payload.clone(),
        k.stream.clone(),
        k.history(3_600_000, 500_000),
        k.meta.clone(),
        k.levels.clone(),
        k.lane(delayq::Priority::High).stream,
        k.lane(delayq::Priority::Low).stream,
        k.dispatched.clone(),
        k.debounce.clone(),
        k.tags.clone(),
        k.keyed.clone(),
        k.key_ring.clone(),
    ];
    let reschedule_keys = vec![
        k.due.clone(),
        k.levels.clone(),
        k.payload.clone(),
        k.keyed.clone(),
        k.key_ring.clone(),
    ];
    for (src, keys, args, refusal) in [
        (
            &delayq::engine::scripts::DEQUEUE_LUA,
            dequeue_keys.clone(),
            vec!["1e13", "10", "0"],
            "now must be unix milliseconds",
        ),
        (
            // A valid "now" that would move "existing", and a malformed history expiry.
            &delayq::engine::scripts::DEQUEUE_LUA,
            dequeue_keys,
            vec!["4000000000000", "10", "1e13"],
            "history expiry must be unix milliseconds or 0",
        ),
        (
            // A valid order first, then a malformed "now".
            &delayq::engine::scripts::admin::REDELIVER_LUA,
            vec![k.due.clone(), k.stream.clone()],
            vec!["close", "0", "1000", "17e11", "0", "a", "{}"],
            "now and expiry must be unix milliseconds",
        ),
        (
            &delayq::engine::scripts::RESCHEDULE_LUA,
            reschedule_keys,
            vec!["existing", "-inf"],
            "due_ms is not a number",
        ),
    ] {
        let script = redis::Script::new(src);
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        for a in args {
            inv.arg(a);
        }
        let r: redis::RedisResult<redis::Value> = inv.invoke_async(&mut client.connection()).await;
        let e = r.unwrap_err().to_string();
        assert!(e.contains(refusal), "{e}");
        assert_eq!(snapshot(&client).await, before);
    }
}

#[tokio::test]
async fn an_order_whose_payload_was_deleted_is_still_delivered_flagged() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_s, client) = start_with_clock(clock.clone()).await;
    client
        .schedule(Q, "gone", When::in_ms(0), json!({"x": 1}))
        .await
        .unwrap();
    client
        .schedule(Q, "raw", When::in_ms(0), json!({"x": 2}))
        .await
        .unwrap();
    client
        .schedule(Q, "fine", When::in_ms(0), json!({"x": 3}))
        .await
        .unwrap();
    let _: i64 = raw(&client, &["HDEL", "{dq:order-close:0}:payload", "gone"]).await;
    let _: i64 = raw(
        &client,
        &["HSET", "{dq:order-close:0}:payload", "raw", "{\"x\":2}"],
    )
    .await;
    let d = Dispatcher::new(&client, Q, DispatcherOptions::default()).unwrap();
    assert_eq!(d.drain().await.unwrap().moved, 3);

    let rec = Recorder::default();
    let (cancel, handles) = spawn_pipeline(&client, 0, &[("close", &rec)]);
    rec.wait_len(3, WAIT).await;
    stop(cancel, handles).await;
    let mut got: Vec<(String, serde_json::Value, Option<DeliveryFlag>)> = rec
        .deliveries()
        .into_iter()
        .map(|d| (d.id, d.payload, d.flag))
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        got,
        vec![
            ("fine".into(), json!({"x": 3}), None),
            (
                "gone".into(),
                json!(null),
                Some(DeliveryFlag::PayloadMissing)
            ),
            (
                "raw".into(),
                json!({"x": 2}),
                Some(DeliveryFlag::BadEncoding)
            ),
        ]
    );
}

#[tokio::test]
async fn scheduling_an_earlier_order_wakes_a_sleeping_dispatcher() {
    let (_s, client) = start().await;
    let rec = Recorder::default();
    let cancel = CancellationToken::new();
    // Idle up to an hour: only the wake-up can get the order out within the test's wait.
    let d = Dispatcher::new(
        &client,
        Q,
        DispatcherOptions::default().max_idle(Duration::from_secs(3600)),
    )
    .unwrap();
    let dh = tokio::spawn(d.run(cancel.clone()));
    let w = Worker::new(&client, Q, "close", rec.handler(), fast_worker()).unwrap();
    w.ensure_groups().await.unwrap();
    let wc = cancel.clone();
    let wh = tokio::spawn(async move { w.run(wc).await.unwrap() });
    client
        .schedule(Q, "later", When::in_ms(3_000_000), json!(null))
        .await
        .unwrap();
    client
        .schedule(Q, "first", When::in_ms(0), json!(null))
        .await
        .unwrap();
    // Once "first" is delivered the dispatcher has passed and sleeps until "later" (50 min).
    rec.wait_len(1, WAIT).await;
    client
        .schedule(Q, "now", When::in_ms(0), json!(null))
        .await
        .unwrap();
    rec.wait_len(2, Duration::from_secs(120)).await;
    let ids: Vec<String> = rec.deliveries().into_iter().map(|d| d.id).collect();
    assert_eq!(ids, vec!["first", "now"]);
    cancel.cancel();
    dh.await.unwrap();
    wh.await.unwrap();
}

/// Calls of `command` Redis ran so far (inside scripts too), from `INFO commandstats`.
async fn command_calls(client: &Client, command: &str) -> u64 {
    let info: String = raw(client, &["INFO", "commandstats"]).await;
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|r| r.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test]
async fn a_resume_wakes_a_sleeping_dispatcher_and_shutdown_stops_it_at_once() {
    let (_s, client) = start().await;
    let rec = Recorder::default();
    let cancel = CancellationToken::new();
    client.admin().set_paused(Q, None, true).await.unwrap();
    // Idle up to an hour: only a wake-up can move an order within the test's wait.
    let d = Dispatcher::new(
        &client,
        Q,
        DispatcherOptions::default().max_idle(Duration::from_secs(3600)),
    )
    .unwrap();
    // Nothing else runs yet; of the scripts dequeue.lua's paused path runs ZRANGE once per
    // pass, and enqueue.lua once per call (the shard's earliest due time before it writes).
    let dh = tokio::spawn(d.run(cancel.clone()));
    wait_for("the dispatcher's first pass", WAIT, || async {
        command_calls(&client, "zrange").await >= 1
    })
    .await;
    let before = command_calls(&client, "zrange").await;
    // An order due now wakes it; it finds the queue paused and sleeps again (an hour).
    client
        .schedule(Q, "held", When::in_ms(0), json!(null))
        .await
        .unwrap();
    wait_for("a pass that found the queue paused", WAIT, || async {
        command_calls(&client, "zrange").await >= before + 2
    })
    .await;
    assert!(
        client.get(Q, "held").await.unwrap().is_some(),
        "still scheduled"
    );
    let w = Worker::new(&client, Q, "close", rec.handler(), fast_worker()).unwrap();
    w.ensure_groups().await.unwrap();
    let wc = cancel.clone();
    let wh = tokio::spawn(async move { w.run(wc).await.unwrap() });
    client.admin().set_paused(Q, None, false).await.unwrap();
    rec.wait_len(1, WAIT).await;
    assert_eq!(rec.deliveries()[0].id, "held");
    // Nothing left: the dispatcher sleeps up to its hour; shutdown ends the sleep.
    cancel.cancel();
    tokio::time::timeout(WAIT, dh)
        .await
        .expect("the dispatcher stopped on shutdown, not after its idle hour")
        .unwrap();
    wh.await.unwrap();
}

#[tokio::test]
async fn scripts_are_reloaded_after_script_flush() {
    let (_s, client) = start().await;
    client
        .schedule(Q, "a", When::in_ms(0), json!(1))
        .await
        .unwrap();
    let _: () = raw(&client, &["SCRIPT", "FLUSH"]).await;
    client
        .schedule(Q, "b", When::in_ms(0), json!(2))
        .await
        .unwrap();
    let d = Dispatcher::new(&client, Q, DispatcherOptions::default()).unwrap();
    let _: () = raw(&client, &["SCRIPT", "FLUSH"]).await;
    assert_eq!(d.drain().await.unwrap().moved, 2);
}

#[tokio::test]
async fn sharded_queue_spreads_orders_and_delivers_all() {
    let (_s, client) = start_with(ClientOptions::default().shards(4)).await;
    let rec = Recorder::default();
    let (cancel, handles) = spawn_pipeline(&client, 1, &[("close", &rec)]);
    let orders: Vec<NewOrder> = (0..2000)
        .map(|i| NewOrder::new(format!("o{i}"), When::in_ms(i % 200), json!(i)))
        .collect();
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
    rec.wait_len(2000, WAIT).await;
    stop(cancel, handles).await;
    let counts = rec.counts();
    assert_eq!(counts.len(), 2000);
    assert!(counts.values().all(|&c| c == 1));
    let shards: HashSet<u16> = rec.deliveries().iter().map(|d| d.shard).collect();
    assert_eq!(shards.len(), 4, "every shard used");
    for d in rec.deliveries() {
        assert_eq!(d.shard, delayq::engine::keys::shard_of(&d.id, 4));
    }
    // get and cancel find the order's shard.
    client
        .schedule(Q, "x", When::in_ms(60_000), json!(1))
        .await
        .unwrap();
    assert!(client.get(Q, "x").await.unwrap().is_some());
    assert_eq!(
        client.cancel(Q, "x").await.unwrap(),
        CancelOutcome::Cancelled
    );
}

fn parse_xrange(v: redis::Value) -> Vec<(String, Vec<(String, String)>)> {
    let redis::Value::Array(items) = v else {
        panic!("{v:?}")
    };
    items
        .into_iter()
        .map(|e| {
            let redis::Value::Array(mut parts) = e else {
                panic!()
            };
            let fields = parts.pop().unwrap();
            let id: String = redis::from_redis_value(parts.pop().unwrap()).unwrap();
            let flat: Vec<String> = redis::from_redis_value(fields).unwrap();
            (
                id,
                flat.chunks(2)
                    .map(|c| (c[0].clone(), c[1].clone()))
                    .collect(),
            )
        })
        .collect()
}

/// Prefetch: a worker with concurrency 2 and prefetch 3 takes (and leases) 5 entries at once
/// under a backlog, but never runs more than 2 handlers at a time; all 12 are handled.
#[tokio::test]
async fn prefetched_entries_are_leased_but_wait_for_a_handler_slot() {
    let (_s, client) = start().await;
    let orders: Vec<delayq::NewOrder> = (0..12)
        .map(|i| delayq::NewOrder::new(format!("p{i}"), delayq::When::in_ms(0), json!(i)))
        .collect();
    client
        .schedule_many("q", &orders, delayq::Mode::Upsert)
        .await
        .unwrap();
    delayq::Dispatcher::new(&client, "q", delayq::DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
    let running = Arc::new(AtomicUsize::new(0));
    let max_running = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let handler = {
        let (running, max_running, done, gate) = (
            running.clone(),
            max_running.clone(),
            done.clone(),
            gate.clone(),
        );
        move |_d: delayq::Delivery| {
            let (running, max_running, done, gate) = (
                running.clone(),
                max_running.clone(),
                done.clone(),
                gate.clone(),
            );
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                max_running.fetch_max(now, Ordering::SeqCst);
                gate.acquire().await.unwrap().forget();
                running.fetch_sub(1, Ordering::SeqCst);
                done.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        }
    };
    let w = delayq::Worker::new(
        &client,
        "q",
        "g",
        handler,
        delayq::WorkerOptions::default().concurrency(2).prefetch(3),
    )
    .unwrap();
    let stop = CancellationToken::new();
    let h = tokio::spawn(w.run(stop.clone()));
    // Two handlers start and block; five entries are taken (pending) in all.
    let r = running.clone();
    wait_for("two handlers running", Duration::from_secs(10), move || {
        let n = r.load(Ordering::SeqCst);
        async move { n == 2 }
    })
    .await;
    let c = client.clone();
    wait_for("five entries taken", Duration::from_secs(10), move || {
        let c = c.clone();
        async move { pending(&c, "{dq:q:0}:stream", "g").await == 5 }
    })
    .await;
    gate.add_permits(12);
    let d = done.clone();
    wait_for("all twelve handled", Duration::from_secs(10), move || {
        let n = d.load(Ordering::SeqCst);
        async move { n == 12 }
    })
    .await;
    assert_eq!(max_running.load(Ordering::SeqCst), 2);
    stop.cancel();
    h.await.unwrap().unwrap();
}

#[tokio::test]
async fn the_dispatcher_uses_hgetdel_where_the_server_has_it() {
    let (_s, client) = start().await;
    let server = client.server().expect("INFO answered");
    let _: String = raw(&client, &["CONFIG", "RESETSTAT"]).await;
    for i in 0..5 {
        client
            .schedule(Q, &format!("g{i}"), When::in_ms(0), json!({"i": i}))
            .await
            .unwrap();
    }
    Dispatcher::new(&client, Q, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
    let len: i64 = raw(&client, &["XLEN", STREAM]).await;
    assert_eq!(len, 5, "every order dispatched");
    let stats: String = raw(&client, &["INFO", "commandstats"]).await;
    let used = |cmd: &str| stats.contains(&format!("cmdstat_{cmd}:"));
    // The payloads are read and deleted by one HGETDEL, or by HMGET + HDEL (nothing else
    // deletes hash fields while dispatching).
    if server.has_hgetdel() {
        assert!(used("hgetdel") && !used("hdel"), "{server}: {stats}");
    } else {
        assert!(used("hdel") && !used("hgetdel"), "{server}: {stats}");
    }
}

/// The clock never runs ahead of the server's: a `TIME` reading whose reply was held up (here
/// behind a frozen server, as after a `SIGSTOP` or in a busy process) is credited to the moment
/// the reply was taken in, not to the middle of the wait. Crediting it to the midpoint put the
/// clock ahead by half the freeze, and the fault campaign saw orders dispatched up to 14 ms
/// before they were due.
#[tokio::test]
async fn a_clock_read_across_a_freeze_is_never_ahead_of_the_server() {
    let (redis, client) = start().await;
    redis.suspend().unwrap();
    let syncing = tokio::spawn({
        let client = client.clone();
        async move { client.sync_clock().await }
    });
    // The fault itself, not a wait for an event: the reading is on its way and held up for
    // as long as the server stays frozen. Any length shows the defect (the midpoint clock
    // ran ahead by half of it); 400 ms makes it 200 ms, far above any rounding.
    tokio::time::sleep(Duration::from_millis(400)).await;
    redis.resume().unwrap();
    syncing.await.unwrap().unwrap();
    let ours = client.clock().now_us();
    let t: Vec<i64> = raw(&client, &["TIME"]).await;
    let server = t[0] * 1_000_000 + t[1];
    assert!(
        ours <= server,
        "the clock reads {} µs ahead of the server's TIME",
        ours - server
    );
}
