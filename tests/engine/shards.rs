//! Sharded queues against a real redis-server: the shard count is fixed at creation and a
//! mismatched client is refused; dispatch is fair across shards.
#![allow(clippy::unwrap_used)]

use crate::support;

use delayq::engine::keys::shard_of;
use delayq::{
    Client, ClientOptions, Delivery, Dispatcher, DispatcherOptions, Error, Mode, NewOrder, When,
    Worker, WorkerOptions,
};
use serde_json::json;
use support::{raw, start_with};
use tokio_util::sync::CancellationToken;

const Q: &str = "order-close";

#[tokio::test]
async fn the_registry_holds_the_shard_count_and_unknown_queues_are_refused() {
    let (s, four) = start_with(ClientOptions::default().shards(4)).await;
    four.schedule(Q, "o1", When::in_ms(60_000), json!(1))
        .await
        .unwrap();
    let stored: String = raw(&four, &["HGET", "{dq}:queue:order-close", "shards"]).await;
    assert_eq!(stored, "4");

    // A producer configured with another count uses the registered one: it sees every
    // shard, never a subset.
    let eight = Client::connect_with(&s.url(), ClientOptions::default().shards(8))
        .await
        .unwrap();
    eight
        .schedule(Q, "o2", When::in_ms(60_000), json!(1))
        .await
        .unwrap();
    assert!(eight.get(Q, "o1").await.unwrap().is_some());
    assert_eq!(eight.admin().stats(Q).await.unwrap().scheduled, 2);
    let mut sum = 0;
    for i in 0..4 {
        let c: i64 = raw(&four, &["ZCARD", &format!("{{dq:order-close:{i}}}:due")]).await;
        sum += c;
    }
    assert_eq!(sum, 2, "both orders live in the 4 registered shards");

    // Creating it again: idempotent with the same count, refused with another.
    let again = eight.admin().create_queue(Q, 4).await.unwrap();
    assert!(!again.created);
    let e = eight.admin().create_queue(Q, 8).await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::ShardMismatch {
                existing: 4,
                wanted: 8,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("created with 4 shards"), "{e}");

    // Dispatchers and workers register with their own count, and refuse another.
    let d = Dispatcher::new(&eight, Q, DispatcherOptions::default()).unwrap();
    assert!(matches!(
        d.pass().await.unwrap_err(),
        Error::ShardMismatch { .. }
    ));
    let w = Worker::new(
        &eight,
        Q,
        "g",
        |_d: Delivery| async { Ok(()) },
        WorkerOptions::default(),
    )
    .unwrap();
    let r = w.run(CancellationToken::new()).await;
    assert!(
        matches!(r.unwrap_err(), Error::ShardMismatch { .. }),
        "the worker refuses to start"
    );

    // An unregistered queue: every call is refused and nothing is written.
    let before = support::snapshot(&four).await;
    let nf = |e: Error| matches!(e, Error::QueueNotFound { ref queue } if queue == "typo-queue");
    assert!(nf(four
        .schedule("typo-queue", "x", When::in_ms(1), json!(1))
        .await
        .unwrap_err()));
    assert!(nf(four.get("typo-queue", "x").await.unwrap_err()));
    assert!(nf(four.cancel("typo-queue", "x").await.unwrap_err()));
    assert!(nf(four.admin().stats("typo-queue").await.unwrap_err()));
    assert!(nf(four
        .admin()
        .dead_list("typo-queue", None, 10)
        .await
        .unwrap_err()));
    assert_eq!(support::snapshot(&four).await, before);
}

#[tokio::test]
async fn a_backlog_in_one_shard_does_not_starve_another() {
    let (_s, client) = start_with(ClientOptions::default().shards(2)).await;
    let ids = |shard: u16, n: usize| -> Vec<String> {
        (0..)
            .map(|i| format!("o{i}"))
            .filter(|id| shard_of(id, 2) == shard)
            .take(n)
            .collect()
    };
    // Shard 0: a backlog of 20,000 overdue orders. Shard 1: ten, due now too.
    let backlog: Vec<NewOrder> = ids(0, 20_000)
        .into_iter()
        .map(|id| NewOrder::new(id, When::in_ms(0), json!(null)))
        .collect();
    for chunk in backlog.chunks(5000) {
        client.schedule_many(Q, chunk, Mode::Upsert).await.unwrap();
    }
    let few: Vec<NewOrder> = ids(1, 10)
        .into_iter()
        .map(|id| NewOrder::new(id, When::in_ms(0), json!(null)))
        .collect();
    client.schedule_many(Q, &few, Mode::Upsert).await.unwrap();

    let d = Dispatcher::new(&client, Q, DispatcherOptions::default().batch(100)).unwrap();
    let p = d.pass().await.unwrap();
    assert_eq!(p.moved, 110, "one batch from each shard in the first pass");
    assert!(p.more);
    let s1: i64 = raw(&client, &["XLEN", "{dq:order-close:1}:stream"]).await;
    assert_eq!(
        s1, 10,
        "shard 1 was served at once despite shard 0's backlog"
    );
    let s0_left: i64 = raw(&client, &["ZCARD", "{dq:order-close:0}:due"]).await;
    assert_eq!(s0_left, 19_900);
}

/// A producer in another language, doing exactly what ARCHITECTURE.md says (TIME, SCRIPT
/// LOAD of enqueue.lua as `delayq scripts export` writes it, FNV-1a shard, EVALSHA): `tests/producers/checkout.py`, standard
/// library only. The Rust side finds every order in the shard it computes and delivers it.
#[tokio::test]
async fn a_python_producer_following_architecture_md_is_delivered() {
    let (s, client) = start_with(ClientOptions::default().shards(4)).await;
    let mut orders: Vec<serde_json::Value> = (0..40)
        .map(|i| json!({"id": format!("py-{i}"), "delay_ms": 200, "payload": {"n": i, "note": "créé"}}))
        .collect();
    orders.push(json!({"id": "py-later", "delay_ms": 3_600_000, "payload": {"later": true}}));
    let root = env!("CARGO_MANIFEST_DIR");
    // The script as the engine runs it (lua/enqueue.lua with its includes after its
    // header), as `delayq scripts export` writes it for other languages.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("enqueue.lua");
    std::fs::write(&script, delayq::engine::scripts::ENQUEUE_LUA.as_str()).unwrap();
    let out = std::process::Command::new("python3")
        .arg(format!("{root}/tests/producers/checkout.py"))
        .args(["127.0.0.1", &s.port().to_string(), "dq", Q, "4"])
        .arg(&script)
        .arg(serde_json::Value::Array(orders).to_string())
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let codes = reply["codes"].as_object().unwrap();
    assert_eq!(codes.len(), 41);
    assert!(codes.values().all(|c| c == 1), "{reply}");
    let shards_used: std::collections::HashSet<u16> =
        (0..40).map(|i| shard_of(&format!("py-{i}"), 4)).collect();
    assert!(shards_used.len() > 1, "the ids should spread over shards");

    // The Rust client computes the same shard: it finds the later order where Python put it.
    let later = client.get(Q, "py-later").await.unwrap().expect("found");
    assert_eq!(later.payload, json!({"later": true}));
    assert_eq!(
        later.due_at_ms,
        reply["now_ms"].as_i64().unwrap() + 3_600_000
    );
    assert_eq!(later.enqueued_at_ms, reply["now_ms"].as_i64());

    let seen = support::Recorder::default();
    let stop = CancellationToken::new();
    let w = Worker::new(
        &client,
        Q,
        "close-order",
        seen.handler(),
        WorkerOptions::default(),
    )
    .unwrap();
    w.ensure_groups().await.unwrap();
    let hw = tokio::spawn(w.run(stop.clone()));
    let hd = tokio::spawn(
        Dispatcher::new(&client, Q, DispatcherOptions::default())
            .unwrap()
            .run(stop.clone()),
    );
    seen.wait_len(40, std::time::Duration::from_secs(30)).await;
    let got = seen.deliveries();
    for d in &got {
        let i: usize = d.id.strip_prefix("py-").unwrap().parse().unwrap();
        assert_eq!(d.payload, json!({"n": i, "note": "créé"}), "{}", d.id);
        assert_eq!(d.shard, shard_of(&d.id, 4));
        assert_eq!(d.flag, None);
        assert_eq!(d.enqueued_at_ms, reply["now_ms"].as_i64());
    }
    assert_eq!(seen.counts().len(), 40);
    assert!(client.cancel(Q, "py-later").await.is_ok());
    stop.cancel();
    hw.await.unwrap().unwrap();
    hd.await.unwrap();
}

/// The dispatcher skips shards whose earliest order is not due yet; an earlier order that
/// this process schedules into such a shard is still dispatched at once, not after
/// `max_idle` (set to a minute here, so waiting for it would time the test out).
#[tokio::test]
async fn an_earlier_order_in_a_skipped_shard_is_dispatched_at_once() {
    let (_s, client) = start_with(ClientOptions::default().shards(8)).await;
    let stop = CancellationToken::new();
    let d = Dispatcher::new(
        &client,
        Q,
        DispatcherOptions::default().max_idle(std::time::Duration::from_secs(60)),
    )
    .unwrap();
    let seen = support::Recorder::default();
    let w = Worker::new(&client, Q, "g", seen.handler(), WorkerOptions::default()).unwrap();
    w.ensure_groups().await.unwrap();
    let hw = tokio::spawn(w.run(stop.clone()));
    // Every shard holds an order due in an hour, and one due now to prove the loop runs.
    for i in 0..64 {
        client
            .schedule(Q, &format!("later-{i}"), When::in_ms(3_600_000), json!(i))
            .await
            .unwrap();
    }
    client
        .schedule(Q, "first", When::in_ms(0), json!(0))
        .await
        .unwrap();
    let hd = tokio::spawn(d.run(stop.clone()));
    seen.wait_len(1, std::time::Duration::from_secs(30)).await;
    // Now every shard is known to be due in an hour; schedule into each of them again.
    for i in 0..8 {
        client
            .schedule(Q, &format!("soon-{i}"), When::in_ms(50), json!(i))
            .await
            .unwrap();
    }
    seen.wait_len(9, std::time::Duration::from_secs(30)).await;
    let ids: std::collections::HashSet<String> =
        seen.deliveries().into_iter().map(|d| d.id).collect();
    assert!(
        (0..8).all(|i| ids.contains(&format!("soon-{i}"))),
        "{ids:?}"
    );
    assert!(!ids.iter().any(|i| i.starts_with("later-")));
    stop.cancel();
    hw.await.unwrap().unwrap();
    hd.await.unwrap();
}
