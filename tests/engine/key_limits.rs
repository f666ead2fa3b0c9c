#![allow(clippy::unwrap_used)]
//! Slots per order key (issue 42 items 2 and 3) against real redis-server processes: at
//! most `key_concurrency` deliveries of a key in flight across workers and shards, waits
//! that are no attempts, sequences in due order with a retry keeping its key, a crashed
//! holder's slots freed with its lease, and no state left behind.

use crate::support;

use delayq::{
    Backoff, Client, ClientOptions, Delivery, Dispatcher, DispatcherOptions, HandlerError,
    HandlerResult, Mode, NewOrder, When, Worker, WorkerOptions,
};
use serde_json::json;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{raw, start_with, wait_for};
use tokio_util::sync::CancellationToken;

const Q: &str = "order-close";
const WAIT: Duration = Duration::from_secs(120);

/// (start | end, order id, attempt).
type Event = (&'static str, String, u32);

type Reply = Pin<Box<dyn Future<Output = HandlerResult> + Send>>;

fn spawn_dispatcher(client: &Client, cancel: &CancellationToken) -> tokio::task::JoinHandle<()> {
    let d = Dispatcher::new(client, Q, DispatcherOptions::default()).unwrap();
    tokio::spawn(d.run(cancel.clone()))
}

/// The group's per-key state, read raw: (holds, waiters, active keys).
async fn slot_state(client: &Client, group: &str) -> (i64, i64, i64) {
    let q = delayq::engine::keys::QueueName::new(Q).unwrap();
    let k = client.keyspace().key_slots(&q, group);
    (
        raw(client, &["ZCARD", &k.holders]).await,
        raw(client, &["ZCARD", &k.waiters]).await,
        raw(client, &["ZCARD", &k.active]).await,
    )
}

/// What the handlers saw: per key, how many ran at once now and at most; every delivery.
#[derive(Default)]
struct Seen {
    now: HashMap<String, usize>,
    most: HashMap<String, usize>,
    delivered: Vec<(String, u32)>,
}

/// Two workers (two consumers, as two processes would be) on four shards with
/// `key_concurrency = 2`, 30 keys × 50 orders due at once: no key ever has more than two
/// deliveries running, every order is delivered once, at attempt 1 (waiting for a slot is
/// no attempt), and the per-key state is gone afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_concurrency_holds_across_workers_and_shards() {
    let (_s, client) = start_with(ClientOptions::default().shards(4)).await;
    two_workers_at_two_per_key(&client, 30, 50).await;
}

/// The same on a Redis Cluster: the slots live under one hash tag, the parked entries on
/// their lanes' slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_concurrency_holds_on_a_cluster() {
    let cluster = support::cluster::LocalCluster::start();
    let client = Client::connect_with(&cluster.url(), ClientOptions::default().shards(4))
        .await
        .unwrap();
    support::declare_queues(&client).await;
    assert!(client.is_cluster());
    two_workers_at_two_per_key(&client, 10, 20).await;
}

/// Runs `keys` × `per_key` orders due at once through two workers with
/// `key_concurrency = 2` and checks what [`key_concurrency_holds_across_workers_and_shards`]
/// says.
async fn two_workers_at_two_per_key(client: &Client, keys: usize, per_key: usize) {
    let due = client.now_ms();
    let mut orders = Vec::new();
    for i in 0..keys * per_key {
        orders.push(
            NewOrder::new(format!("o-{i:05}"), When::at_ms(due), json!(i))
                .with_key(format!("merchant:{}", i % keys)),
        );
    }
    for chunk in orders.chunks(500) {
        client.schedule_many(Q, chunk, Mode::Upsert).await.unwrap();
    }
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let handler = {
        let seen = seen.clone();
        move |d: Delivery| {
            let key = d.key().unwrap_or_default().to_owned();
            {
                let mut s = seen.lock().unwrap();
                let n = {
                    let n = s.now.entry(key.clone()).or_default();
                    *n += 1;
                    *n
                };
                let m = s.most.entry(key.clone()).or_default();
                *m = (*m).max(n);
                s.delivered.push((d.id.clone(), d.attempt));
            }
            let seen = seen.clone();
            Box::pin(async move {
                // The handler's simulated work, so that deliveries overlap.
                tokio::time::sleep(Duration::from_millis(2)).await;
                *seen.lock().unwrap().now.entry(key).or_default() -= 1;
                Ok(())
            }) as Reply
        }
    };
    let cancel = CancellationToken::new();
    let disp = spawn_dispatcher(client, &cancel);
    let mut workers = Vec::new();
    for name in ["w1", "w2"] {
        let w = Worker::new(
            client,
            Q,
            "close",
            handler.clone(),
            WorkerOptions::default()
                .concurrency(16)
                .consumer(name)
                .key_concurrency(2)
                .block(Duration::from_millis(100)),
        )
        .unwrap();
        workers.push(tokio::spawn(w.run(cancel.clone())));
    }
    let s2 = seen.clone();
    wait_for("every order handled", WAIT, move || {
        let n = s2.lock().unwrap().delivered.len();
        async move { n >= keys * per_key }
    })
    .await;
    let c2 = client.clone();
    wait_for("the key slots given back", WAIT, move || {
        let c2 = c2.clone();
        async move { slot_state(&c2, "close").await == (0, 0, 0) }
    })
    .await;
    cancel.cancel();
    disp.await.unwrap();
    for w in workers {
        w.await.unwrap().unwrap();
    }
    let seen = seen.lock().unwrap();
    let over: Vec<_> = seen.most.iter().filter(|(_, m)| **m > 2).collect();
    assert!(
        over.is_empty(),
        "keys with more than 2 running at once: {over:?}"
    );
    assert!(
        seen.most.values().any(|m| *m == 2),
        "no key ever ran 2 at once: the limit is 2, not 1"
    );
    let mut times: HashMap<&str, usize> = HashMap::new();
    for (id, attempt) in &seen.delivered {
        *times.entry(id.as_str()).or_default() += 1;
        assert_eq!(
            *attempt, 1,
            "{id} arrived as attempt {attempt}: a wait counted"
        );
    }
    assert_eq!(times.len(), keys * per_key, "orders handled");
    assert!(times.values().all(|n| *n == 1), "an order handled twice");
}

/// `key_sequence`: five orders of key K due 10 ms apart, the second failing twice; the
/// third to fifth start only after the second succeeded, in due order; key J's orders are
/// all handled while K's second waits for its retries (the second's last attempt waits for
/// them: were J held up behind K, this test would never end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_runs_each_key_in_due_order_and_a_retry_keeps_its_key() {
    let (_s, client) = start_with(ClientOptions::default().shards(4)).await;
    let due = client.now_ms() + 300;
    for i in 0..5_i64 {
        for key in ["K", "J"] {
            let o = NewOrder::new(format!("{key}{i}"), When::at_ms(due + 10 * i), json!(i))
                .with_key(key);
            client.schedule_with(Q, o, Mode::Upsert).await.unwrap();
        }
    }
    // (event, id, attempt) in order; event = start | end.
    let log: Arc<Mutex<Vec<Event>>> = Arc::default();
    let j_done = Arc::new(tokio::sync::Notify::new());
    let handler = {
        let (log, j_done) = (log.clone(), j_done.clone());
        move |d: Delivery| {
            let (log, j_done) = (log.clone(), j_done.clone());
            log.lock().unwrap().push(("start", d.id.clone(), d.attempt));
            Box::pin(async move {
                let r = if d.id == "K1" && d.attempt < 3 {
                    Err(HandlerError::retry("not yet"))
                } else {
                    if d.id == "K1" {
                        // J's five orders done, while K1 held its key through two retries.
                        loop {
                            let notified = j_done.notified();
                            let js = log
                                .lock()
                                .unwrap()
                                .iter()
                                .filter(|(e, id, _)| *e == "end" && id.starts_with('J'))
                                .count();
                            if js == 5 {
                                break;
                            }
                            notified.await;
                        }
                    }
                    Ok(())
                };
                log.lock().unwrap().push(("end", d.id.clone(), d.attempt));
                if d.id.starts_with('J') {
                    j_done.notify_waiters();
                }
                r
            }) as Reply
        }
    };
    let cancel = CancellationToken::new();
    let disp = spawn_dispatcher(&client, &cancel);
    let w = Worker::new(
        &client,
        Q,
        "close",
        handler,
        WorkerOptions::default()
            .concurrency(8)
            .key_sequence(true)
            .backoff(Backoff::Fixed(Duration::from_millis(200)))
            .block(Duration::from_millis(100)),
    )
    .unwrap();
    let worker = tokio::spawn(w.run(cancel.clone()));
    let l2 = log.clone();
    wait_for("every order handled", WAIT, move || {
        let n = l2
            .lock()
            .unwrap()
            .iter()
            .filter(|(e, id, _)| *e == "end" && id.starts_with('K'))
            .count();
        async move { n >= 7 }
    })
    .await;
    cancel.cancel();
    disp.await.unwrap();
    worker.await.unwrap().unwrap();
    let log = log.lock().unwrap().clone();
    let k_starts: Vec<(String, u32)> = log
        .iter()
        .filter(|(e, id, _)| *e == "start" && id.starts_with('K'))
        .map(|(_, id, a)| (id.clone(), *a))
        .collect();
    let want: Vec<(String, u32)> = [("K0", 1), ("K1", 1), ("K1", 2), ("K1", 3)]
        .into_iter()
        .chain([("K2", 1), ("K3", 1), ("K4", 1)])
        .map(|(i, a)| (i.to_owned(), a))
        .collect();
    assert_eq!(k_starts, want, "K's deliveries, in order");
    // One at a time: every K start comes after the previous K delivery ended.
    let mut running = false;
    for (e, id, _) in log.iter().filter(|(_, id, _)| id.starts_with('K')) {
        match *e {
            "start" => {
                assert!(!running, "{id} started while another K delivery ran");
                running = true;
            }
            _ => running = false,
        }
    }
    assert_eq!(slot_state(&client, "close").await.1, 0, "no waiter left");
}

/// A worker holding key slots crashes (its task aborted, nothing given back); after the
/// lease, another worker delivers the key's remaining orders and the one the crashed worker
/// held: no key stays blocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_slots_are_freed_with_its_lease() {
    let (_s, client) = start_with(ClientOptions::default().shards(4)).await;
    let due = client.now_ms();
    for i in 0..6 {
        let o = NewOrder::new(format!("k{i}"), When::at_ms(due + i), json!(i)).with_key("K");
        client.schedule_with(Q, o, Mode::Upsert).await.unwrap();
    }
    let opts = |name: &str| {
        WorkerOptions::default()
            .concurrency(8)
            .consumer(name)
            .key_concurrency(1)
            .visibility_timeout(Duration::from_secs(1))
            .reclaim_every(Duration::from_millis(100))
            .block(Duration::from_millis(100))
    };
    // Worker A: its handler never returns.
    let started = Arc::new(tokio::sync::Notify::new());
    let a_handler = {
        let started = started.clone();
        move |_d: Delivery| {
            started.notify_one();
            Box::pin(std::future::pending::<HandlerResult>()) as Reply
        }
    };
    let cancel = CancellationToken::new();
    let disp = spawn_dispatcher(&client, &cancel);
    let a = Worker::new(&client, Q, "close", a_handler, opts("a")).unwrap();
    let a_task = tokio::spawn(a.run(cancel.child_token()));
    started.notified().await;
    let c2 = client.clone();
    wait_for("the other orders parked", WAIT, move || {
        let c2 = c2.clone();
        async move { slot_state(&c2, "close").await.1 == 5 }
    })
    .await;
    // What an operator sees meanwhile: one key in use, one delivery in flight, five waiting.
    let stats = client.admin().stats(Q).await.unwrap();
    let g = stats.groups.iter().find(|g| g.group == "close").unwrap();
    assert_eq!((g.keys_active, g.key_waiting), (1, 5));
    let page = client
        .admin()
        .group_keys(Q, "close", 10, None)
        .await
        .unwrap();
    assert_eq!((page.active, page.waiting), (1, 5));
    assert_eq!(
        page.keys,
        [delayq::engine::admin::keys::KeyUse {
            key: "K".into(),
            in_flight: 1,
            waiting: 5
        }]
    );
    assert_eq!(page.next, None);
    a_task.abort();
    let _ = a_task.await;
    // Worker B: handles everything.
    let done: Arc<Mutex<Vec<String>>> = Arc::default();
    let b_handler = {
        let done = done.clone();
        move |d: Delivery| {
            done.lock().unwrap().push(d.id.clone());
            Box::pin(async { Ok(()) }) as Reply
        }
    };
    let b = Worker::new(&client, Q, "close", b_handler, opts("b")).unwrap();
    let b_task = tokio::spawn(b.run(cancel.clone()));
    let d2 = done.clone();
    wait_for("every order of K handled by B", WAIT, move || {
        let n = d2.lock().unwrap().len();
        async move { n >= 6 }
    })
    .await;
    cancel.cancel();
    disp.await.unwrap();
    b_task.await.unwrap().unwrap();
    let mut done = done.lock().unwrap().clone();
    done.sort();
    assert_eq!(done, ["k0", "k1", "k2", "k3", "k4", "k5"]);
}

/// Pull consumers take the same slots: with `key_concurrency = 1`, two pullers receive one
/// order of key K at a time (the others park, no attempt counted) and every order of key J;
/// an ack hands K's slot to its next order; a nack under `key_sequence` keeps the key for
/// the retry, and the retry comes back before any other order of K.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pullers_share_the_slots_and_a_sequence_keeps_its_key_through_a_nack() {
    use delayq::{Nack, PullDelivery, Puller};
    let (_s, client) = start_with(ClientOptions::default().shards(4)).await;
    let due = client.now_ms();
    for i in 0..3_i64 {
        for key in ["K", "J"] {
            let o =
                NewOrder::new(format!("{key}{i}"), When::at_ms(due + i), json!(i)).with_key(key);
            client.schedule_with(Q, o, Mode::Upsert).await.unwrap();
        }
    }
    Dispatcher::new(&client, Q, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
    let opts = |name: &str| {
        WorkerOptions::default()
            .consumer(name)
            .key_sequence(true)
            .backoff(Backoff::Fixed(Duration::from_millis(10)))
    };
    let a = Puller::new(&client, Q, "close", opts("a")).unwrap();
    let b = Puller::new(&client, Q, "close", opts("b")).unwrap();
    a.ensure_groups().await.unwrap();
    let lease = Duration::from_secs(60);
    let ids = |got: &[PullDelivery]| {
        let mut v: Vec<String> = got.iter().map(|d| d.delivery.id.clone()).collect();
        v.sort();
        v
    };
    // Both pullers ask for everything: one K in all, and J's first only (a sequence).
    let got_a = a.receive(10, lease).await.unwrap();
    let got_b = b.receive(10, lease).await.unwrap();
    let all: Vec<PullDelivery> = got_a.iter().chain(&got_b).cloned().collect();
    assert_eq!(ids(&all), ["J0", "K0"], "one order per key at a time");
    assert_eq!(slot_state(&client, "close").await.1, 4, "four parked");
    // A receipt is settled by the puller that received it.
    let settle_by = |id: &str| {
        if got_a.iter().any(|d| d.delivery.id == id) {
            &a
        } else {
            &b
        }
    };
    // Nack K0 for a retry: K stays held by it; ack J0: J1 is woken.
    let k0 = all.iter().find(|d| d.delivery.id == "K0").unwrap();
    let j0 = all.iter().find(|d| d.delivery.id == "J0").unwrap();
    let r = settle_by("K0")
        .nack(
            &k0.receipt,
            Nack::Retry {
                after: None,
                error: "not yet".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(r, delayq::Settled::Done);
    let acked = settle_by("J0").ack(&[&j0.receipt]).await.unwrap();
    assert_eq!(acked, [delayq::Settled::Done]);
    // Next: K0 again (its retry, attempt 2) and J1, never K1.
    let next: Arc<Mutex<Vec<PullDelivery>>> = Arc::default();
    let n2 = next.clone();
    let a = &a;
    support::poll(WAIT, || {
        let n2 = n2.clone();
        async move {
            let got = a.receive(10, lease).await.unwrap();
            assert!(
                got.iter()
                    .all(|d| d.delivery.id != "K1" && d.delivery.id != "K2"),
                "K moved on while K0 waited for its retry"
            );
            let mut n = n2.lock().unwrap();
            n.extend(got);
            (n.len() >= 2).then_some(())
        }
    })
    .await
    .expect("K0's retry and J1");
    let next = next.lock().unwrap().clone();
    assert_eq!(ids(&next), ["J1", "K0"]);
    let k0 = next.iter().find(|d| d.delivery.id == "K0").unwrap();
    assert_eq!(k0.delivery.attempt, 2, "parking counted no attempt");
}

/// A sequence's retry far beyond the state's idle time to live (five leases) keeps its key:
/// with a 100 ms lease, K0 fails once and asks to be retried 2 s later; K1, due 1 s in,
/// starts only after K0 succeeded, although no call touched the key's slots meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_retry_keeps_its_key_while_the_group_is_quiet() {
    let (_s, client) = start_with(ClientOptions::default().shards(2)).await;
    let now = client.now_ms();
    for (id, at) in [("K0", now), ("K1", now + 1_000)] {
        let o = NewOrder::new(id, When::at_ms(at), json!(id)).with_key("K");
        client.schedule_with(Q, o, Mode::Upsert).await.unwrap();
    }
    let log: Arc<Mutex<Vec<Event>>> = Arc::default();
    let handler = {
        let log = log.clone();
        move |d: Delivery| {
            log.lock().unwrap().push(("start", d.id.clone(), d.attempt));
            let log = log.clone();
            Box::pin(async move {
                let r = if d.id == "K0" && d.attempt == 1 {
                    Err(HandlerError::Retry {
                        message: "later".into(),
                        after: Some(Duration::from_secs(2)),
                    })
                } else {
                    Ok(())
                };
                log.lock().unwrap().push(("end", d.id.clone(), d.attempt));
                r
            }) as Reply
        }
    };
    let cancel = CancellationToken::new();
    let disp = spawn_dispatcher(&client, &cancel);
    let w = Worker::new(
        &client,
        Q,
        "close",
        handler,
        WorkerOptions::default()
            .key_sequence(true)
            .visibility_timeout(Duration::from_millis(100))
            .reclaim_every(Duration::from_millis(50))
            .block(Duration::from_millis(50)),
    )
    .unwrap();
    let worker = tokio::spawn(w.run(cancel.clone()));
    let l2 = log.clone();
    wait_for("K0's retry and K1 handled", WAIT, move || {
        let n = l2
            .lock()
            .unwrap()
            .iter()
            .filter(|(e, _, _)| *e == "end")
            .count();
        async move { n >= 3 }
    })
    .await;
    cancel.cancel();
    disp.await.unwrap();
    worker.await.unwrap().unwrap();
    let starts: Vec<(String, u32)> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(e, _, _)| *e == "start")
        .map(|(_, id, a)| (id.clone(), *a))
        .collect();
    assert_eq!(
        starts,
        [
            ("K0".to_owned(), 1),
            ("K0".to_owned(), 2),
            ("K1".to_owned(), 1)
        ],
        "K1 started while K0 waited for its retry"
    );
}
