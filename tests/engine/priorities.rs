#![allow(clippy::unwrap_used)]
//! Priorities against real redis-server processes: urgent orders overtake a backlog
//! (strict), weighted shares, one handler over several queues, and the level kept through
//! reschedule, get, history, dead letters and replay.

use crate::support;

use delayq::{
    Client, Delivery, Dispatcher, DispatcherOptions, HandlerError, HandlerResult, Mode, NewOrder,
    Priority, PriorityMode, Selection, When, Worker, WorkerOptions,
};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{raw, start, wait_for};
use tokio_util::sync::CancellationToken;

const Q: &str = "order-close";
const WAIT: Duration = Duration::from_secs(120);

/// Every handler call in order: (priority, order id).
type Log = Arc<Mutex<Vec<(Priority, String)>>>;

/// A handler that logs each call, then works for `work`.
fn logging(
    log: &Log,
    work: Duration,
) -> impl Fn(Delivery) -> std::pin::Pin<Box<dyn std::future::Future<Output = HandlerResult> + Send>>
+ Send
+ Sync
+ 'static {
    let log = log.clone();
    move |d: Delivery| {
        log.lock().unwrap().push((d.priority, d.id.clone()));
        Box::pin(async move {
            if !work.is_zero() {
                // The handler's simulated work (a slow partner API).
                tokio::time::sleep(work).await;
            }
            Ok(())
        })
    }
}

async fn schedule_level(client: &Client, prefix: &str, n: usize, p: Priority) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let orders: Vec<NewOrder> = chunk
            .iter()
            .map(|i| {
                NewOrder::new(format!("{prefix}-{i}"), When::in_ms(0), json!({"i": i}))
                    .with_priority(p)
            })
            .collect();
        client
            .schedule_many(Q, &orders, Mode::Upsert)
            .await
            .unwrap();
    }
}

fn spawn_dispatcher(client: &Client, cancel: &CancellationToken) -> tokio::task::JoinHandle<()> {
    let d = Dispatcher::new(client, Q, DispatcherOptions::default()).unwrap();
    tokio::spawn(d.run(cancel.clone()))
}

async fn wait_log(log: &Log, n: usize) {
    let log = log.clone();
    wait_for(&format!("{n} handler calls"), WAIT, move || {
        let l = log.lock().unwrap().len();
        async move { l >= n }
    })
    .await;
}

/// Each order id exactly once.
fn assert_each_once(log: &[(Priority, String)], expected: usize) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (_, id) in log {
        *seen.entry(id.as_str()).or_default() += 1;
    }
    assert_eq!(seen.len(), expected, "orders handled");
    let dup: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(dup.is_empty(), "handled more than once: {dup:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_orders_overtake_a_backlog_of_low_ones() {
    let (_s, client) = start().await;
    let cancel = CancellationToken::new();
    let log: Log = Arc::default();
    let disp = spawn_dispatcher(&client, &cancel);
    let w = Worker::new(
        &client,
        Q,
        "close",
        logging(&log, Duration::from_millis(2)),
        WorkerOptions::default()
            .concurrency(4)
            .block(Duration::from_millis(200)),
    )
    .unwrap();
    let worker = tokio::spawn(w.run(cancel.clone()));

    schedule_level(&client, "low", 20_000, Priority::Low).await;
    wait_log(&log, 500).await;
    schedule_level(&client, "high", 100, Priority::High).await;
    let mark = log.lock().unwrap().len();
    // Once every high order was handled, count the low ones handled in between.
    let l = log.clone();
    wait_for("100 high orders handled", WAIT, move || {
        let n = l
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| *p == Priority::High)
            .count();
        async move { n == 100 }
    })
    .await;
    let (low_between, last_high) = {
        let log = log.lock().unwrap();
        let last_high = log.iter().rposition(|(p, _)| *p == Priority::High).unwrap();
        let low = log[mark..=last_high]
            .iter()
            .filter(|(p, _)| *p == Priority::Low)
            .count();
        (low, last_high)
    };
    println!(
        "strict: {low_between} low orders handled between scheduling the 100 high ones and \
         the last of them (call {last_high})"
    );
    assert!(
        low_between < 1000,
        "{low_between} low orders handled before the high ones were done"
    );
    wait_log(&log, 20_100).await;
    let stats = client.admin().stats(Q).await.unwrap();
    assert_eq!(stats.scheduled, 0);
    cancel.cancel();
    worker.await.unwrap().unwrap();
    disp.await.unwrap();
    let log = log.lock().unwrap().clone();
    assert_each_once(&log, 20_100);
    // Each delivery came from its level's lane, and the stream of every level is settled.
    assert!(log.iter().all(|(p, id)| id.starts_with(p.as_str())));
    for lane in ["high:stream", "stream", "low:stream"] {
        let stream = format!("{{dq:{Q}:0}}:{lane}");
        assert_eq!(
            support::pending(&client, &stream, "close").await,
            0,
            "{lane}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_mode_shares_reads_six_three_one() {
    let (_s, client) = start().await;
    let cancel = CancellationToken::new();
    let log: Log = Arc::default();
    // Every level backlogged before the worker starts: 1,500 orders each, dispatched.
    for p in Priority::ALL {
        schedule_level(&client, p.as_str(), 1500, p).await;
    }
    let disp = spawn_dispatcher(&client, &cancel);
    let c = client.clone();
    wait_for("4,500 orders dispatched", WAIT, move || {
        let c = c.clone();
        async move {
            let s = c.admin().stats(Q).await.unwrap();
            s.scheduled == 0 && s.stream_length == 4500
        }
    })
    .await;
    let stats = client.admin().stats(Q).await.unwrap();
    let lengths: Vec<u64> = stats.priorities.iter().map(|p| p.stream_length).collect();
    assert_eq!(lengths, vec![1500, 1500, 1500], "{:?}", stats.priorities);

    let w = Worker::new(
        &client,
        Q,
        "close",
        logging(&log, Duration::ZERO),
        WorkerOptions::default()
            .concurrency(4)
            .priority(PriorityMode::weighted(vec![6, 3, 1], 3).unwrap()),
    )
    .unwrap();
    let worker = tokio::spawn(w.run(cancel.clone()));
    wait_log(&log, 4500).await;
    cancel.cancel();
    worker.await.unwrap().unwrap();
    disp.await.unwrap();
    let log = log.lock().unwrap().clone();
    assert_each_once(&log, 4500);
    let mut mix = [0usize; 3];
    for (p, _) in &log[..2000] {
        mix[p.rank()] += 1;
    }
    let pct: Vec<f64> = mix.iter().map(|n| *n as f64 / 20.0).collect();
    println!("weighted 6:3:1, first 2,000 handled: {mix:?} ({pct:?} %)");
    for (got, want) in pct.iter().zip([60.0, 30.0, 10.0]) {
        assert!(
            (got - want).abs() <= 5.0,
            "mix {pct:?} %, wanted 60/30/10 within 5 points"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_level_is_kept_through_reschedule_get_history_dead_letters_and_replay() {
    let (_s, client) = start().await;
    client
        .admin()
        .set_history_retention(Q, Duration::from_secs(3600))
        .await
        .unwrap();
    let far = When::in_ms(3_600_000);
    client
        .schedule_with(
            Q,
            NewOrder::new("vip", far, json!({"n": 1})).with_priority(Priority::High),
            Mode::Upsert,
        )
        .await
        .unwrap();
    client
        .schedule(Q, "plain", far, json!({"n": 2}))
        .await
        .unwrap();
    assert_eq!(
        client.get(Q, "vip").await.unwrap().unwrap().priority,
        Priority::High
    );
    assert_eq!(
        client.get(Q, "plain").await.unwrap().unwrap().priority,
        Priority::Normal
    );
    let h = client.admin().history(Q, "vip").await.unwrap().unwrap();
    assert_eq!(h.priority, Priority::High);

    // A reschedule without a level keeps it; with one, changes it.
    client.reschedule(Q, "vip", When::in_ms(0)).await.unwrap();
    assert_eq!(
        client.get(Q, "vip").await.unwrap().unwrap().priority,
        Priority::High
    );
    client
        .reschedule_with(Q, "plain", When::in_ms(0), Some(Priority::Low))
        .await
        .unwrap();
    assert_eq!(
        client.get(Q, "plain").await.unwrap().unwrap().priority,
        Priority::Low
    );
    // An upsert without a level makes it normal again; cancel drops the level with it.
    client.schedule(Q, "again", far, json!({})).await.unwrap();
    client
        .schedule_with(
            Q,
            NewOrder::new("again", far, json!({})).with_priority(Priority::Low),
            Mode::Upsert,
        )
        .await
        .unwrap();
    client.schedule(Q, "again", far, json!({})).await.unwrap();
    assert_eq!(
        client.get(Q, "again").await.unwrap().unwrap().priority,
        Priority::Normal
    );
    // An id given twice in one call: the last level wins, as the last payload does ("q" has
    // no levels HASH yet).
    let twice = [
        NewOrder::new("twice", far, json!({})).with_priority(Priority::High),
        NewOrder::new("twice", far, json!({})),
    ];
    client
        .schedule_many("q", &twice, Mode::Upsert)
        .await
        .unwrap();
    assert_eq!(
        client.get("q", "twice").await.unwrap().unwrap().priority,
        Priority::Normal
    );
    client
        .schedule_with(
            Q,
            NewOrder::new("gone", far, json!({})).with_priority(Priority::High),
            Mode::Upsert,
        )
        .await
        .unwrap();
    client.cancel(Q, "gone").await.unwrap();
    let level: Option<String> = raw(&client, &["HGET", "{dq:order-close:0}:levels", "gone"]).await;
    assert_eq!(level, None);

    // A handler that fails for good: both die, each at its level.
    let cancel = CancellationToken::new();
    let disp = spawn_dispatcher(&client, &cancel);
    let seen: Log = Arc::default();
    let s2 = seen.clone();
    let failing = move |d: Delivery| {
        s2.lock().unwrap().push((d.priority, d.id.clone()));
        std::future::ready(Err::<(), _>(HandlerError::permanent("partner says no")))
    };
    let opts = WorkerOptions::default().block(Duration::from_millis(100));
    let w = Worker::new(&client, Q, "close", failing, opts.clone()).unwrap();
    let worker = tokio::spawn(w.run(cancel.clone()));
    let c = client.clone();
    wait_for("two dead letters", WAIT, move || {
        let c = c.clone();
        async move { c.admin().dead_list(Q, None, 10).await.unwrap().len() == 2 }
    })
    .await;
    cancel.cancel();
    worker.await.unwrap().unwrap();
    disp.await.unwrap();
    let mut levels: Vec<(String, Priority)> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(p, id)| (id.clone(), *p))
        .collect();
    levels.sort();
    assert_eq!(
        levels,
        vec![
            ("plain".into(), Priority::Low),
            ("vip".into(), Priority::High)
        ]
    );
    let mut dead: Vec<(String, Priority)> = client
        .admin()
        .dead_list(Q, None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.id, d.priority))
        .collect();
    dead.sort();
    assert_eq!(dead, levels);
    let h = client.admin().history(Q, "vip").await.unwrap().unwrap();
    assert_eq!(h.priority, Priority::High);
    assert_eq!(h.groups.len(), 1);
    assert_eq!(h.groups[0].state, delayq::GroupState::Dead);

    // Replayed, each comes back at its level; this time the handler succeeds.
    assert_eq!(
        client
            .admin()
            .dead_replay(Q, None, &Selection::All)
            .await
            .unwrap(),
        2
    );
    let cancel = CancellationToken::new();
    let log: Log = Arc::default();
    let w = Worker::new(&client, Q, "close", logging(&log, Duration::ZERO), opts).unwrap();
    let worker = tokio::spawn(w.run(cancel.clone()));
    wait_log(&log, 2).await;
    let mut again = log
        .lock()
        .unwrap()
        .iter()
        .map(|(p, id)| (id.clone(), *p))
        .collect::<Vec<_>>();
    again.sort();
    assert_eq!(again, levels);
    let c = client.clone();
    wait_for(
        "the replayed vip order done in the history",
        WAIT,
        move || {
            let c = c.clone();
            async move {
                let h = c.admin().history(Q, "vip").await.unwrap().unwrap();
                h.groups.first().map(|g| g.state) == Some(delayq::GroupState::Done)
            }
        },
    )
    .await;
    cancel.cancel();
    worker.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_queue_without_priorities_makes_no_lane_keys_and_bad_levels_change_nothing() {
    let (_s, client) = start().await;
    client
        .schedule(Q, "o1", When::in_ms(0), json!({}))
        .await
        .unwrap();
    let cancel = CancellationToken::new();
    let disp = spawn_dispatcher(&client, &cancel);
    let log: Log = Arc::default();
    let w = Worker::new(
        &client,
        Q,
        "close",
        logging(&log, Duration::ZERO),
        WorkerOptions::default().block(Duration::from_millis(100)),
    )
    .unwrap();
    let worker = tokio::spawn(w.run(cancel.clone()));
    wait_log(&log, 1).await;
    cancel.cancel();
    worker.await.unwrap().unwrap();
    disp.await.unwrap();
    for key in [
        "{dq:order-close:0}:levels",
        "{dq:order-close:0}:high:stream",
        "{dq:order-close:0}:low:stream",
    ] {
        let n: i64 = raw(&client, &["EXISTS", key]).await;
        assert_eq!(n, 0, "{key} exists");
    }
    // The script refuses a bad level before writing anything.
    assert!(Priority::parse("urgent").is_err());
    let bad = WorkerOptions::default().priority(PriorityMode::Weighted(vec![1, 2]));
    let e = Worker::new(&client, Q, "g", logging(&log, Duration::ZERO), bad).unwrap_err();
    assert!(e.to_string().contains("priority"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_handler_over_urgent_then_bulk_drains_urgent_first() {
    let (_s, client) = start().await;
    for q in ["urgent", "bulk"] {
        client.admin().create_queue(q, 1).await.unwrap();
        let orders: Vec<NewOrder> = (0..1000)
            .map(|i| NewOrder::new(format!("{q}-{i}"), When::in_ms(0), json!({})))
            .collect();
        client
            .schedule_many(q, &orders, Mode::Upsert)
            .await
            .unwrap();
    }
    let cancel = CancellationToken::new();
    let mut disp = Vec::new();
    for q in ["urgent", "bulk"] {
        let d = Dispatcher::new(&client, q, DispatcherOptions::default()).unwrap();
        disp.push(tokio::spawn(d.run(cancel.clone())));
    }
    let c = client.clone();
    wait_for("both queues dispatched", WAIT, move || {
        let c = c.clone();
        async move {
            c.admin().stats("urgent").await.unwrap().stream_length == 1000
                && c.admin().stats("bulk").await.unwrap().stream_length == 1000
        }
    })
    .await;

    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let l = log.clone();
    let handler = move |d: Delivery| {
        l.lock().unwrap().push(d.queue.clone());
        std::future::ready(Ok::<(), HandlerError>(()))
    };
    let opts = WorkerOptions::default()
        .concurrency(4)
        .block(Duration::from_millis(100));
    let w = delayq::MultiWorker::new(
        &client,
        &["urgent", "bulk"],
        "close",
        handler,
        opts,
        PriorityMode::Strict,
    )
    .unwrap();
    let run = tokio::spawn(w.run(cancel.clone()));
    let l = log.clone();
    wait_for("2,000 handled", WAIT, move || {
        let n = l.lock().unwrap().len();
        async move { n == 2000 }
    })
    .await;
    cancel.cancel();
    run.await.unwrap().unwrap();
    for d in disp {
        d.await.unwrap();
    }
    let log = log.lock().unwrap().clone();
    let last_urgent = log.iter().rposition(|q| q == "urgent").unwrap();
    let bulk_before = log[..last_urgent].iter().filter(|q| *q == "bulk").count();
    println!("urgent then bulk: {bulk_before} bulk orders started before the last urgent one");
    // At most one read's worth (concurrency 4 + prefetch 12) may overlap the urgent tail.
    assert!(
        bulk_before <= 16,
        "{bulk_before} bulk orders before urgent was drained"
    );
    assert_eq!(log.iter().filter(|q| *q == "bulk").count(), 1000);
    // Each queue's group kept its own pending list, now settled.
    for q in ["urgent", "bulk"] {
        let s = client.admin().stats(q).await.unwrap();
        assert_eq!(s.groups.len(), 1, "{q}");
        assert_eq!(s.groups[0].group, "close");
        assert_eq!(s.groups[0].pending, 0, "{q}");
        // Redis 6.2's XINFO GROUPS has no lag: it cannot tell (None).
        let lag_known = client.server().is_some_and(|v| v.at_least((7, 0, 0)));
        let want = if lag_known { Some(0) } else { None };
        assert_eq!(s.groups[0].lag, want, "{q}");
    }
    // A bad queue list is refused before anything runs.
    let e = delayq::MultiWorker::new(
        &client,
        &["urgent", "urgent"],
        "close",
        |_d: Delivery| std::future::ready(Ok::<(), HandlerError>(())),
        WorkerOptions::default(),
        PriorityMode::Strict,
    )
    .unwrap_err();
    assert!(e.to_string().contains("listed twice"), "{e}");
}
