//! The full flow over a Redis Cluster of our own (3 masters, 3 replicas): schedule, cancel,
//! dispatch, fan-out, retry, dead-letter; then a master killed mid-run with durable enqueue on:
//! every acknowledged schedule is delivered.
#![allow(clippy::unwrap_used)]

use crate::support;

use delayq::{
    Backoff, CancelOutcome, Client, ClientOptions, Delivery, Dispatcher, DispatcherOptions,
    Durability, HandlerError, Mode, NewOrder, When, Worker, WorkerOptions,
};
use serde_json::json;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::cluster::LocalCluster;
use support::{Recorder, wait_for};
use tokio_util::sync::CancellationToken;

const Q: &str = "order-close";
const WAIT: Duration = Duration::from_secs(120);

fn wopts() -> WorkerOptions {
    WorkerOptions::default()
        .block(Duration::from_millis(200))
        .reclaim_every(Duration::from_millis(100))
        .backoff(Backoff::Fixed(Duration::from_millis(100)))
        .max_attempts(3)
}

#[tokio::test]
async fn the_full_flow_runs_on_a_cluster() {
    let cluster = LocalCluster::start();
    let client = Client::connect_with(&cluster.url(), ClientOptions::default().shards(4))
        .await
        .unwrap();
    support::declare_queues(&client).await;
    assert!(client.is_cluster());
    let close = Recorder::default();
    let notify = Recorder::default();
    let poison_calls = Arc::new(Mutex::new(0));
    let flaky = {
        let (close, poison_calls) = (close.clone(), poison_calls.clone());
        let record = close.handler();
        move |d: Delivery| {
            if d.id == "poison" {
                *poison_calls.lock().unwrap() += 1;
                return std::future::ready(Err(HandlerError::retry("always fails")));
            }
            if d.id == "retry-once" && d.attempt == 1 {
                return std::future::ready(Err(HandlerError::retry("first attempt fails")));
            }
            let _ = &close;
            record(d)
        }
    };
    let cancel = CancellationToken::new();
    let w1 = Worker::new(&client, Q, "close", flaky, wopts()).unwrap();
    let w2 = Worker::new(&client, Q, "notify", notify.handler(), wopts()).unwrap();
    let (st1, st2) = (w1.stats(), w2.stats());
    w1.ensure_groups().await.unwrap();
    w2.ensure_groups().await.unwrap();
    let h1 = tokio::spawn(w1.run(cancel.clone()));
    let h2 = tokio::spawn(w2.run(cancel.clone()));
    let hd = tokio::spawn(
        Dispatcher::new(&client, Q, DispatcherOptions::default())
            .unwrap()
            .run(cancel.clone()),
    );

    let mut orders: Vec<NewOrder> = (0..400)
        .map(|i| NewOrder::new(format!("o{i}"), When::in_ms(i % 300), json!({"i": i})))
        .collect();
    orders.push(NewOrder::new("poison", When::in_ms(0), json!(null)));
    orders.push(NewOrder::new("retry-once", When::in_ms(0), json!(null)));
    orders.push(NewOrder::new("paid", When::in_ms(2000), json!(null)));
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
    assert!(client.get(Q, "paid").await.unwrap().is_some());
    assert_eq!(
        client.cancel(Q, "paid").await.unwrap(),
        CancelOutcome::Cancelled
    );

    close.wait_len(401, WAIT).await; // 400 + retry-once
    notify.wait_len(402, WAIT).await; // 400 + poison + retry-once
    let st = st1.clone();
    wait_for("poison dead-lettered", WAIT, move || {
        let n = st.dead_lettered.load(Ordering::SeqCst);
        async move { n == 1 }
    })
    .await;
    let dead = client
        .admin()
        .dead_list(Q, Some("close"), 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].id.as_str(), dead[0].attempts), ("poison", 3));
    assert_eq!(*poison_calls.lock().unwrap(), 3);
    let ids: HashSet<String> = close.counts().into_keys().collect();
    assert!(!ids.contains("paid") && ids.contains("retry-once"));
    assert!(close.counts().values().all(|&c| c == 1));
    let shards: HashSet<u16> = close.deliveries().iter().map(|d| d.shard).collect();
    assert_eq!(shards.len(), 4, "all shards served");
    let stats = client.admin().stats(Q).await.unwrap();
    assert_eq!(stats.dead, 1);
    let _ = st2;
    cancel.cancel();
    h1.await.unwrap().unwrap();
    h2.await.unwrap().unwrap();
    hd.await.unwrap();
}

#[tokio::test]
async fn a_master_killed_mid_run_loses_no_durably_acknowledged_schedule() {
    let mut cluster = LocalCluster::start();
    let url = cluster.url();
    let durable = Durability::Replicated {
        replicas: 1,
        timeout: Duration::from_millis(500),
    };
    let client = Client::connect_with(&url, ClientOptions::default().shards(3).durability(durable))
        .await
        .unwrap();
    // The queues are declared before the cluster's replicas may have caught up: the test
    // is about the orders' writes, so the declaration does not wait for them.
    support::declare_queues(&client.with_durability(Durability::Leader)).await;
    let rec = Recorder::default();
    let cancel = CancellationToken::new();
    let w = Worker::new(
        &client,
        Q,
        "close",
        rec.handler(),
        wopts().visibility_timeout(Duration::from_secs(2)),
    )
    .unwrap();
    w.ensure_groups().await.unwrap();
    let hw = tokio::spawn(w.run(cancel.clone()));
    let hd = tokio::spawn(
        Dispatcher::new(&client, Q, DispatcherOptions::default())
            .unwrap()
            .run(cancel.clone()),
    );

    // A producer schedules one order at a time until stopped; only acknowledged ones must
    // arrive. (After the failover the promoted master has no replica: durable writes to its
    // slots are refused, correctly, so the producer is stopped rather than run to a count.)
    let acked: Arc<Mutex<HashSet<String>>> = Arc::default();
    let producing = CancellationToken::new();
    let producer = {
        let (client, acked, producing) = (client.clone(), acked.clone(), producing.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !producing.is_cancelled() {
                let id = format!("p{i}");
                i += 1;
                if client
                    .schedule(Q, &id, When::in_ms(i % 300), json!(i))
                    .await
                    .is_ok()
                {
                    acked.lock().unwrap().insert(id);
                } else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        })
    };
    let a = acked.clone();
    wait_for("500 acknowledged", WAIT, move || {
        let n = a.lock().unwrap().len();
        async move { n >= 500 }
    })
    .await;
    // Kill the master of shard 0; its replica takes over.
    let victim = cluster.master_of("{dq:order-close:0}:due");
    cluster.kill(victim);
    cluster.wait_ok(WAIT);
    let before = acked.lock().unwrap().len();
    for _ in 0..300 {
        if acked.lock().unwrap().len() >= before + 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    producing.cancel();
    producer.await.unwrap();
    eprintln!(
        "failover: {} acknowledged ({} before the cluster recovered)",
        acked.lock().unwrap().len(),
        before
    );
    let want: HashSet<String> = acked.lock().unwrap().clone();
    let r = rec.clone();
    wait_for("every acknowledged schedule delivered", WAIT, move || {
        let got: HashSet<String> = r.counts().into_keys().collect();
        let done = want.is_subset(&got);
        async move { done }
    })
    .await;
    assert!(
        !hw.is_finished() && !hd.is_finished(),
        "the service kept going"
    );
    cancel.cancel();
    hw.await.unwrap().unwrap();
    hd.await.unwrap();
}

/// Issue 44 on a cluster: the dedup window and debounce live in each shard's hash tag, so
/// a sharded queue answers duplicate for every dispatched id, whichever master holds it,
/// and a debounced order keeps its cap there; another client (process) sees the same.
#[tokio::test]
async fn the_time_rules_hold_on_a_cluster_across_shards_and_clients() {
    let cluster = LocalCluster::start();
    let opts = ClientOptions::default().shards(4);
    let client = Client::connect_with(&cluster.url(), opts.clone())
        .await
        .unwrap();
    support::declare_queues(&client).await;
    client
        .admin()
        .set_dedup_window(Q, Duration::from_secs(3600))
        .await
        .unwrap();
    let orders: Vec<NewOrder> = (0..40)
        .map(|i| NewOrder::new(format!("o{i}"), When::in_ms(0), json!(i)))
        .collect();
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
    let moved = Dispatcher::new(&client, Q, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap()
        .moved;
    assert_eq!(moved, 40);
    let other = Client::connect_with(&cluster.url(), opts).await.unwrap();
    let again = other.schedule_many(Q, &orders, Mode::Upsert).await.unwrap();
    assert!(
        again.iter().all(
            |s| s.outcome == delayq::ScheduleOutcome::Duplicate && s.dispatched_at_ms.is_some()
        ),
        "{again:?}"
    );
    let deb = delayq::Debounce::new(Duration::from_secs(60), Duration::from_secs(60)).unwrap();
    let a = client
        .schedule_with(Q, NewOrder::debounced("cart", deb, json!(1)), Mode::Upsert)
        .await
        .unwrap();
    let b = other
        .schedule_with(Q, NewOrder::debounced("cart", deb, json!(2)), Mode::Upsert)
        .await
        .unwrap();
    assert_eq!(b.due_at_ms, a.due_at_ms, "the cap holds across clients");
    let got = other.get(Q, "cart").await.unwrap().unwrap();
    assert_eq!(got.debounce.unwrap().max_due_ms, a.due_at_ms);
}
