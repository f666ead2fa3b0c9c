#![allow(clippy::unwrap_used)]
//! The dispatch roster (`engine::roster`): several processes dispatching one queue split
//! its shards, each shard called by one of them; a process that stops hands its shards to
//! the others; a crashed process's shards (its seat still in the roster) are taken over
//! once their orders stay overdue.
//!
//! Each "process" is a client of its own (its own connections, listener and roster seat).

use crate::support;

use delayq::{Client, ClientOptions, Dispatcher, DispatcherOptions, DispatcherStats, When};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use support::{Recorder, raw, start_with, wait_for};
use tokio_util::sync::CancellationToken;

const Q: &str = "order-close";
const SHARDS: u16 = 8;
const WAIT: Duration = Duration::from_secs(90);

fn opts() -> ClientOptions {
    ClientOptions::default().shards(SHARDS)
}

/// A dispatcher of `client` running until `cancel`, and its stats.
fn dispatch(
    client: &Client,
    o: DispatcherOptions,
    cancel: &CancellationToken,
) -> (Arc<DispatcherStats>, tokio::task::JoinHandle<()>) {
    let d = Dispatcher::new(client, Q, o).unwrap();
    let stats = d.stats();
    (stats, tokio::spawn(d.run(cancel.clone())))
}

/// A worker recording every delivery of `Q`, running until `cancel`.
async fn worker(client: &Client, cancel: &CancellationToken) -> Recorder {
    let rec = Recorder::default();
    let w = delayq::Worker::new(
        client,
        Q,
        "close",
        rec.handler(),
        delayq::WorkerOptions::default().block(Duration::from_millis(100)),
    )
    .unwrap();
    w.ensure_groups().await.unwrap();
    let c = cancel.clone();
    tokio::spawn(async move { w.run(c).await.unwrap() });
    rec
}

/// `n` orders due now, spread over the shards by id, scheduled by `client`.
async fn schedule_due(client: &Client, prefix: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = format!("{prefix}-{i}");
        client
            .schedule(Q, &id, When::in_ms(0), json!({ "i": i }))
            .await
            .unwrap();
        ids.push(id);
    }
    ids
}

/// The shards each of several dispatchers calls split the queue: every shard called by
/// exactly one of them.
fn split(all: &[&Arc<DispatcherStats>]) -> bool {
    (0..usize::from(SHARDS)).all(|s| all.iter().filter(|d| d.calling()[s]).count() == 1)
}

/// Waits until the two dispatchers' rosters split the shards.
async fn wait_split(sa: &Arc<DispatcherStats>, sb: &Arc<DispatcherStats>) {
    wait_for("both processes' rosters to split the shards", WAIT, || {
        let (sa, sb) = (sa.clone(), sb.clone());
        async move { split(&[&sa, &sb]) }
    })
    .await;
}

/// The roster's seats (members), read raw.
async fn seats(client: &Client) -> Vec<String> {
    raw(
        client,
        &["ZRANGE", &client.keyspace().dispatchers(), "0", "-1"],
    )
    .await
}

/// Seats three processes that died with their seats in the roster for an hour.
async fn seat_ghosts(client: &Client) {
    let until = (client.now_ms() + 3_600_000).to_string();
    let key = client.keyspace().dispatchers();
    for ghost in ["ghost-1", "ghost-2", "ghost-3"] {
        let member = format!("{Q}\u{1}{ghost}");
        let _: i64 = raw(client, &["ZADD", &key, &until, &member]).await;
    }
}

/// Waits until the dispatcher behind `stats` sees other seats (it owns only some shards).
async fn wait_sees_ghosts(stats: &Arc<DispatcherStats>) {
    wait_for("the dispatcher to see the ghosts' seats", WAIT, || {
        let stats = stats.clone();
        async move { stats.calling().iter().any(|m| !*m) }
    })
    .await;
}

#[tokio::test]
async fn two_processes_split_the_shards_and_each_shard_is_called_by_one() {
    let (server, a) = start_with(opts()).await;
    let b = Client::connect_with(&server.url(), opts()).await.unwrap();
    let producer = Client::connect_with(&server.url(), opts()).await.unwrap();
    let cancel = CancellationToken::new();
    // No takeover within the test: a shard's calls can only come from its owner.
    let o = DispatcherOptions::default().takeover_after(Duration::from_secs(60));
    let (sa, _) = dispatch(&a, o.clone(), &cancel);
    let (sb, _) = dispatch(&b, o, &cancel);
    let rec = worker(&producer, &cancel).await;
    wait_split(&sa, &sb).await;
    let members = seats(&a).await;
    assert_eq!(members.len(), 2, "one seat per process: {members:?}");
    let (ca, cb) = (sa.calls(), sb.calls());
    let mine_a = sa.calling();
    assert!(
        mine_a.iter().any(|m| *m) && mine_a.iter().any(|m| !*m),
        "each of two processes owns some of {SHARDS} shards: {mine_a:?}"
    );

    let ids = schedule_due(&producer, "split", 400).await;
    rec.wait_len(ids.len(), WAIT).await;
    let counts = rec.counts();
    for id in &ids {
        assert_eq!(counts.get(id), Some(&1), "{id} delivered once");
    }
    // Since the split, each shard was called only by the process that owns it.
    let (da, db) = (sa.calls(), sb.calls());
    for s in 0..usize::from(SHARDS) {
        let (by_a, by_b) = (da[s] - ca[s], db[s] - cb[s]);
        if mine_a[s] {
            assert_eq!(by_b, 0, "shard {s} is A's, yet B called it {by_b} times");
            assert!(
                by_a > 0,
                "shard {s} had orders due, yet its owner A never called it"
            );
        } else {
            assert_eq!(by_a, 0, "shard {s} is B's, yet A called it {by_a} times");
            assert!(
                by_b > 0,
                "shard {s} had orders due, yet its owner B never called it"
            );
        }
    }
    assert_eq!(sa.takeovers() + sb.takeovers(), 0);
    cancel.cancel();
}

#[tokio::test]
async fn a_stopping_process_hands_its_shards_to_the_others() {
    let (server, a) = start_with(opts()).await;
    let b = Client::connect_with(&server.url(), opts()).await.unwrap();
    let cancel = CancellationToken::new();
    let stop_b = CancellationToken::new();
    let o = DispatcherOptions::default().takeover_after(Duration::from_secs(60));
    let (sa, _) = dispatch(&a, o.clone(), &cancel);
    let (sb, hb) = dispatch(&b, o, &stop_b);
    let rec = worker(&a, &cancel).await;
    wait_split(&sa, &sb).await;
    stop_b.cancel();
    hb.await.unwrap();
    // B left its seat: A owns every shard again (no takeover needed).
    wait_for("A to own every shard", WAIT, || {
        let sa = sa.clone();
        async move { sa.calling().iter().all(|m| *m) }
    })
    .await;
    let members = seats(&a).await;
    assert_eq!(members.len(), 1, "B's seat is gone: {members:?}");
    let ids = schedule_due(&b, "after", 200).await;
    rec.wait_len(ids.len(), WAIT).await;
    assert_eq!(sa.takeovers(), 0);
    cancel.cancel();
}

#[tokio::test]
async fn a_crashed_processes_shards_are_taken_over() {
    let (_server, a) = start_with(opts()).await;
    let cancel = CancellationToken::new();
    // Three processes that died with their seats still in the roster for an hour.
    seat_ghosts(&a).await;
    let o = DispatcherOptions::default().takeover_after(Duration::from_millis(200));
    let (sa, _) = dispatch(&a, o, &cancel);
    let rec = worker(&a, &cancel).await;
    wait_sees_ghosts(&sa).await;
    let ids = schedule_due(&a, "orphan", 200).await;
    rec.wait_len(ids.len(), WAIT).await;
    let counts = rec.counts();
    for id in &ids {
        assert_eq!(counts.get(id), Some(&1), "{id} delivered once");
    }
    assert!(
        sa.takeovers() > 0,
        "the ghosts' shards were dispatched without a takeover"
    );
    cancel.cancel();
}

#[tokio::test]
async fn without_takeover_every_process_calls_every_shard() {
    let (server, a) = start_with(opts()).await;
    let b = Client::connect_with(&server.url(), opts()).await.unwrap();
    let cancel = CancellationToken::new();
    let o = DispatcherOptions::default().takeover_after(Duration::ZERO);
    let (sa, _) = dispatch(&a, o.clone(), &cancel);
    let (sb, _) = dispatch(&b, o, &cancel);
    let rec = worker(&a, &cancel).await;
    let ids = schedule_due(&b, "all", 50).await;
    rec.wait_len(ids.len(), WAIT).await;
    // Neither took a seat: both call every shard.
    let members = seats(&a).await;
    assert!(members.is_empty(), "{members:?}");
    assert!(sa.calling().iter().all(|m| *m) && sb.calling().iter().all(|m| *m));
    cancel.cancel();
}

#[tokio::test]
async fn a_paused_queue_is_never_taken_over() {
    let (_server, a) = start_with(opts()).await;
    let cancel = CancellationToken::new();
    seat_ghosts(&a).await;
    // Short looks: A calls its own paused shards every 300 ms, and looks at the ghosts'
    // every 200 ms once their orders are overdue.
    let o = DispatcherOptions::default()
        .takeover_after(Duration::from_millis(200))
        .max_idle(Duration::from_millis(300))
        .idle_poll(Duration::from_millis(300));
    let (sa, _) = dispatch(&a, o, &cancel);
    let rec = worker(&a, &cancel).await;
    wait_sees_ghosts(&sa).await;
    a.admin().set_paused(Q, None, true).await.unwrap();
    let ids = schedule_due(&a, "held", 80).await;
    let mine = sa.calling();
    let before = sa.calls();
    // A's own shards answer "paused" call after call; meanwhile the ghosts' shards stay
    // overdue, which is no reason to take them over.
    wait_for("A to call its paused shards again and again", WAIT, || {
        let sa = sa.clone();
        let (mine, before) = (mine.clone(), before.clone());
        async move {
            let now = sa.calls();
            (0..mine.len()).all(|s| !mine[s] || now[s] >= before[s] + 4)
        }
    })
    .await;
    assert_eq!(sa.takeovers(), 0, "a paused queue's shards were taken over");
    assert_eq!(rec.len(), 0, "nothing is dispatched while paused");
    a.admin().set_paused(Q, None, false).await.unwrap();
    rec.wait_len(ids.len(), WAIT).await;
    assert!(
        sa.takeovers() > 0,
        "the ghosts' shards were dispatched without a takeover"
    );
    cancel.cancel();
}
