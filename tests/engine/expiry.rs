//! Expiry of stale work (issue 44 item 3): an order handed to a group later than due +
//! `expires_after` is not handed to it; that group's history says `expired` with the
//! lateness, it is dead-lettered with reason `expired`, and a replay delivers it. Judged per
//! group. No sleeps: the due times pass by the server clock while the queue (or a group) is
//! paused, and every outcome is awaited.
#![allow(clippy::unwrap_used)]

use crate::support;

use delayq::{
    Backoff, Client, Delivery, Dispatcher, DispatcherOptions, GroupState, HandlerError, NewOrder,
    Selection, When, Worker, WorkerOptions,
};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use support::{Recorder, start, wait_for};
use tokio_util::sync::CancellationToken;

const Q: &str = "order-close";
const WAIT: Duration = Duration::from_secs(20);

fn worker_opts() -> WorkerOptions {
    WorkerOptions::default()
        .block(Duration::from_millis(50))
        .reclaim_every(Duration::from_millis(50))
}

/// Waits until the server clock is past `at_ms` (the due times pass while paused).
async fn until_server_time(client: &Client, at_ms: i64) {
    wait_for("the server clock to pass the deadline", WAIT, || {
        let now = client.now_ms();
        async move { now > at_ms }
    })
    .await;
}

async fn dead_count(client: &Client, group: &str) -> usize {
    client
        .admin()
        .dead_list(Q, Some(group), 100)
        .await
        .unwrap()
        .len()
}

async fn group_history(client: &Client, id: &str, group: &str) -> Option<delayq::GroupHistory> {
    client
        .admin()
        .history(Q, id)
        .await
        .unwrap()
        .and_then(|h| h.groups.into_iter().find(|g| g.group == group))
}

/// The test: a queue paused past due + 2 s (its default `expires_after`); on resume nothing due during the pause
/// is handed over (queue default and an order's own limit alike), each group's history says
/// `expired`, the dead list holds them with reason `expired`, a replay delivers them; an
/// order with a longer limit of its own, and orders due after the resume, are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_expires_the_orders_due_during_the_pause_and_a_replay_delivers_them() {
    let (_server, client) = start().await;
    let admin = client.admin();
    admin
        .set_expires_after(Q, Duration::from_secs(2))
        .await
        .unwrap();
    let info = admin.queue_info(Q).await.unwrap().unwrap();
    assert_eq!(info.expires_after_ms, Some(2000));
    let (close, notify) = (Recorder::default(), Recorder::default());
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    let mut stats = Vec::new();
    for (group, rec) in [("close", &close), ("notify", &notify)] {
        let w = Worker::new(&client, Q, group, rec.handler(), worker_opts()).unwrap();
        w.ensure_groups().await.unwrap();
        stats.push(w.stats());
        tasks.push(tokio::spawn(w.run(stop.clone())));
    }
    let hd = tokio::spawn(
        Dispatcher::new(&client, Q, DispatcherOptions::default())
            .unwrap()
            .run(stop.clone()),
    );
    admin.set_paused(Q, None, true).await.unwrap();
    let due = client.now_ms() + 100;
    let mut orders = Vec::new();
    for i in 1..=3 {
        orders.push(NewOrder::new(
            format!("o-{i}"),
            When::at_ms(due),
            json!({"n": i}),
        ));
    }
    // Its own limit, shorter than the queue's: expires as well.
    orders.push(
        NewOrder::new("own-short", When::at_ms(due), json!({"n": 4}))
            .with_expires_after(Duration::from_millis(500)),
    );
    // Its own limit, longer than the pause: delivered.
    orders.push(
        NewOrder::new("own-long", When::at_ms(due), json!({"n": 5}))
            .with_expires_after(Duration::from_secs(3600)),
    );
    client
        .schedule_many(Q, &orders, delayq::Mode::Upsert)
        .await
        .unwrap();
    // The payload reads back byte for byte: the stored expiry is not part of it.
    let got = client.get(Q, "own-short").await.unwrap().unwrap();
    assert_eq!(got.payload, json!({"n": 4}));
    until_server_time(&client, due + 2000).await;
    admin.set_paused(Q, None, false).await.unwrap();
    client
        .schedule(Q, "after", When::in_ms(0), json!({"n": 6}))
        .await
        .unwrap();
    for (group, rec) in [("close", &close), ("notify", &notify)] {
        let c = client.clone();
        wait_for(&format!("4 dead letters of {group}"), WAIT, move || {
            let c = c.clone();
            async move { dead_count(&c, group).await == 4 }
        })
        .await;
        rec.wait_len(2, WAIT).await;
    }
    for rec in [&close, &notify] {
        let mut ids: Vec<String> = rec.deliveries().into_iter().map(|d| d.id).collect();
        ids.sort();
        assert_eq!(
            ids,
            ["after", "own-long"],
            "nothing expired was handed over"
        );
    }
    for s in &stats {
        assert_eq!(s.expired.load(Ordering::Relaxed), 4);
    }
    let dead = admin.dead_list(Q, Some("notify"), 100).await.unwrap();
    for d in &dead {
        assert_eq!(d.reason.as_deref(), Some("expired"), "{d:?}");
        assert!(d.last_error.starts_with("expired: "), "{d:?}");
        assert!(d.late_ms.is_some_and(|l| l > 0), "{d:?}");
    }
    for id in ["o-1", "o-2", "o-3", "own-short"] {
        for group in ["close", "notify"] {
            let g = group_history(&client, id, group).await.unwrap();
            assert_eq!(g.state, GroupState::Expired, "{id} in {group}: {g:?}");
            assert!(g.late_ms.is_some_and(|l| l > 0), "{g:?}");
        }
    }
    // A replay for one group delivers the expired orders to it alone, whatever their age.
    let replayed = admin
        .dead_replay(Q, Some("close"), &Selection::All)
        .await
        .unwrap();
    assert_eq!(replayed, 4);
    close.wait_len(6, WAIT).await;
    let mut ids: Vec<String> = close.deliveries().into_iter().map(|d| d.id).collect();
    ids.sort();
    assert_eq!(ids, ["after", "o-1", "o-2", "o-3", "own-long", "own-short"]);
    let c = client.clone();
    wait_for("o-1 done in close after the replay", WAIT, move || {
        let c = c.clone();
        async move {
            group_history(&c, "o-1", "close")
                .await
                .is_some_and(|g| g.state == GroupState::Done)
        }
    })
    .await;
    assert_eq!(
        group_history(&client, "o-1", "notify").await.unwrap().state,
        GroupState::Expired,
        "the other group keeps its own outcome"
    );
    assert_eq!(dead_count(&client, "notify").await, 4);
    assert_eq!(notify.len(), 2);
    stop.cancel();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    hd.await.unwrap();
}

/// Per group: one group takes the order in time, a paused one resumes past the deadline
/// and does not get it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_group_in_time_another_expired() {
    let (_server, client) = start().await;
    let admin = client.admin();
    let (close, notify) = (Recorder::default(), Recorder::default());
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    for (group, rec) in [("close", &close), ("notify", &notify)] {
        let w = Worker::new(&client, Q, group, rec.handler(), worker_opts()).unwrap();
        w.ensure_groups().await.unwrap();
        tasks.push(tokio::spawn(w.run(stop.clone())));
    }
    admin.set_paused(Q, Some("notify"), true).await.unwrap();
    let hd = tokio::spawn(
        Dispatcher::new(&client, Q, DispatcherOptions::default())
            .unwrap()
            .run(stop.clone()),
    );
    let order = NewOrder::new("o-1", When::in_ms(0), json!({"n": 1}))
        .with_expires_after(Duration::from_secs(2));
    let s = client
        .schedule_with(Q, order, delayq::Mode::Upsert)
        .await
        .unwrap();
    close.wait_len(1, WAIT).await;
    until_server_time(&client, s.due_at_ms + 2000).await;
    admin.set_paused(Q, Some("notify"), false).await.unwrap();
    let c = client.clone();
    wait_for("the notify dead letter", WAIT, move || {
        let c = c.clone();
        async move { dead_count(&c, "notify").await == 1 }
    })
    .await;
    assert_eq!(notify.len(), 0);
    assert_eq!(dead_count(&client, "close").await, 0);
    let c = client.clone();
    wait_for("close done", WAIT, move || {
        let c = c.clone();
        async move {
            group_history(&c, "o-1", "close")
                .await
                .is_some_and(|g| g.state == GroupState::Done)
        }
    })
    .await;
    let n = group_history(&client, "o-1", "notify").await.unwrap();
    assert_eq!(n.state, GroupState::Expired, "{n:?}");
    stop.cancel();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    hd.await.unwrap();
}

/// The retry path: an attempt fails, its retry comes due past due + `expires_after`; the
/// retry is not handed to the handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_past_the_deadline_is_not_handed_over() {
    let (_server, client) = start().await;
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let released = Arc::new(AtomicBool::new(false));
    let (n, r) = (calls.clone(), released.clone());
    let w = Worker::new(
        &client,
        Q,
        "close",
        move |_d: Delivery| {
            n.fetch_add(1, Ordering::SeqCst);
            let r = r.clone();
            async move {
                r.store(true, Ordering::SeqCst);
                Err(HandlerError::retry("partner down"))
            }
        },
        worker_opts().backoff(Backoff::Fixed(Duration::from_millis(2500))),
    )
    .unwrap();
    w.ensure_groups().await.unwrap();
    let stats = w.stats();
    let stop = CancellationToken::new();
    let hw = tokio::spawn(w.run(stop.clone()));
    let hd = tokio::spawn(
        Dispatcher::new(&client, Q, DispatcherOptions::default())
            .unwrap()
            .run(stop.clone()),
    );
    let order = NewOrder::new("o-1", When::in_ms(0), json!({"n": 1}))
        .with_expires_after(Duration::from_secs(2));
    client
        .schedule_with(Q, order, delayq::Mode::Upsert)
        .await
        .unwrap();
    let c = client.clone();
    // The worker counts the expiry once the dead letter is written: await both.
    let st = stats.clone();
    wait_for("the retry's dead letter", WAIT, move || {
        let (c, st) = (c.clone(), st.clone());
        async move { dead_count(&c, "close").await == 1 && st.expired.load(Ordering::Relaxed) == 1 }
    })
    .await;
    assert!(released.load(Ordering::SeqCst));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the retry was not handled");
    assert_eq!(stats.expired.load(Ordering::Relaxed), 1);
    let g = group_history(&client, "o-1", "close").await.unwrap();
    assert_eq!(g.state, GroupState::Expired, "{g:?}");
    assert_eq!(g.attempts, 2, "expired at its second delivery");
    stop.cancel();
    hw.await.unwrap().unwrap();
    hd.await.unwrap();
}

/// Bad limits are refused naming the field, and nothing is written.
#[tokio::test]
async fn bad_limits_are_refused_and_write_nothing() {
    let (_server, client) = start().await;
    for ms in [0, -1, 3653 * 86_400_000 + 1] {
        let mut order = NewOrder::new("o-1", When::in_ms(0), json!({}));
        order.expires_after_ms = Some(ms);
        let e = client
            .schedule_with(Q, order, delayq::Mode::Upsert)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("expires_after"), "{e}");
        assert!(client.get(Q, "o-1").await.unwrap().is_none());
    }
    let admin = client.admin();
    let e = admin
        .set_expires_after(Q, Duration::from_secs(3654 * 86_400))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("expires_after"), "{e}");
    assert_eq!(
        admin.queue_info(Q).await.unwrap().unwrap().expires_after_ms,
        None
    );
    admin
        .set_expires_after(Q, Duration::from_secs(60))
        .await
        .unwrap();
    admin.set_expires_after(Q, Duration::ZERO).await.unwrap();
    assert_eq!(
        admin.queue_info(Q).await.unwrap().unwrap().expires_after_ms,
        None,
        "zero clears the default"
    );
}
