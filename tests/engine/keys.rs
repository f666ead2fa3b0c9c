#![allow(clippy::unwrap_used)]
//! Order keys (issue 42) against real redis-server processes: the key kept with the order
//! on every path (get, delivery, history, dead letters, replay, reschedule, upsert), the
//! shard's key index kept exact, and the fair share between keys at dispatch.

use crate::support;

use delayq::{
    Client, ClientOptions, Delivery, Dispatcher, DispatcherOptions, HandlerError, HandlerResult,
    Mode, NewOrder, Selection, When, Worker, WorkerOptions,
};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{raw, start, start_with, wait_for};
use tokio_util::sync::CancellationToken;

const Q: &str = "order-close";
const WAIT: Duration = Duration::from_secs(120);

fn spawn_dispatcher(client: &Client, cancel: &CancellationToken) -> tokio::task::JoinHandle<()> {
    let d = Dispatcher::new(client, Q, DispatcherOptions::default()).unwrap();
    tokio::spawn(d.run(cancel.clone()))
}

/// Every shard's key index members and key ring (key -> earliest score), read raw.
async fn index_of(client: &Client) -> (BTreeSet<String>, BTreeMap<String, i64>) {
    let q = delayq::engine::keys::QueueName::new(Q).unwrap();
    let mut members = BTreeSet::new();
    let mut ring = BTreeMap::new();
    for k in client.keyspace().shards(&q, client.options().shards) {
        let m: Vec<String> = raw(client, &["ZRANGE", &k.keyed, "0", "-1"]).await;
        members.extend(m);
        let r: Vec<(String, f64)> =
            raw(client, &["ZRANGE", &k.key_ring, "0", "-1", "WITHSCORES"]).await;
        for (k, s) in r {
            // Each shard rings its own keys: the earliest over the shards.
            #[allow(clippy::cast_possible_truncation)]
            let s = s as i64;
            let e = ring.entry(k).or_insert(s);
            *e = (*e).min(s);
        }
    }
    (members, ring)
}

/// What the index must hold for these scheduled (id, key, due) orders.
fn expected(orders: &[(&str, Option<&str>, i64)]) -> (BTreeSet<String>, BTreeMap<String, i64>) {
    let mut members = BTreeSet::new();
    let mut ring: BTreeMap<String, i64> = BTreeMap::new();
    for (id, key, due) in orders {
        if let Some(k) = key {
            members.insert(format!("{k}\u{1f}{due:016}\u{1f}{id}"));
            let e = ring.entry((*k).to_owned()).or_insert(*due);
            *e = (*e).min(*due);
        }
    }
    (members, ring)
}

/// Whether any shard's meta hash says it holds keyed orders.
async fn marked(client: &Client) -> bool {
    let q = delayq::engine::keys::QueueName::new(Q).unwrap();
    for k in client.keyspace().shards(&q, client.options().shards) {
        let v: Option<String> = raw(client, &["HGET", &k.meta, "keys"]).await;
        if v.is_some() {
            return true;
        }
    }
    false
}

/// The key goes with the order everywhere: `get`, the history, the delivery, the dead
/// letter and its replay; a reschedule keeps it; an upsert without one removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_travels_with_the_order() {
    let (_s, client) = start().await;
    let due = client.now_ms() + 60_000;
    let order = NewOrder::new("o-1", When::at_ms(due), json!({"a": 1}))
        .with_key("merchant:17")
        .with_expires_after(Duration::from_secs(3600));
    client.schedule_with(Q, order, Mode::Upsert).await.unwrap();
    let got = client.get(Q, "o-1").await.unwrap().unwrap();
    assert_eq!(got.key.as_deref(), Some("merchant:17"));
    assert_eq!(got.payload, json!({"a": 1}));
    let h = client.admin().history(Q, "o-1").await.unwrap().unwrap();
    assert_eq!(h.key.as_deref(), Some("merchant:17"));
    // Rescheduled: kept, and due now.
    client.reschedule(Q, "o-1", When::in_ms(0)).await.unwrap();
    assert_eq!(
        client.get(Q, "o-1").await.unwrap().unwrap().key.as_deref(),
        Some("merchant:17")
    );
    // Delivered with it, failed for good, dead-lettered with it, replayed with it.
    let seen: Arc<Mutex<Vec<Delivery>>> = Arc::default();
    let s2 = seen.clone();
    let handler = move |d: Delivery| {
        let first = {
            let mut s = s2.lock().unwrap();
            s.push(d);
            s.len() == 1
        };
        Box::pin(async move {
            if first {
                Err(HandlerError::Permanent {
                    message: "no".into(),
                })
            } else {
                Ok(())
            }
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = HandlerResult> + Send>>
    };
    let cancel = CancellationToken::new();
    let disp = spawn_dispatcher(&client, &cancel);
    let w = Worker::new(
        &client,
        Q,
        "close",
        handler,
        WorkerOptions::default().block(Duration::from_millis(100)),
    )
    .unwrap();
    let worker = tokio::spawn(w.run(cancel.clone()));
    let c = client.clone();
    wait_for("the dead letter", WAIT, move || {
        let c = c.clone();
        async move { c.admin().dead_list(Q, None, 10).await.unwrap().len() == 1 }
    })
    .await;
    let dead = client.admin().dead_list(Q, None, 10).await.unwrap();
    assert_eq!(dead[0].key.as_deref(), Some("merchant:17"));
    client
        .admin()
        .dead_replay(Q, None, &Selection::All)
        .await
        .unwrap();
    let s3 = seen.clone();
    wait_for("the replay delivered", WAIT, move || {
        let n = s3.lock().unwrap().len();
        async move { n == 2 }
    })
    .await;
    for d in seen.lock().unwrap().iter() {
        assert_eq!(d.key(), Some("merchant:17"), "attempt {}", d.attempt);
        assert_eq!(d.payload, json!({"a": 1}));
    }
    let h = client.admin().history(Q, "o-1").await.unwrap().unwrap();
    assert_eq!(h.key.as_deref(), Some("merchant:17"));
    cancel.cancel();
    disp.await.unwrap();
    worker.await.unwrap().unwrap();

    // An upsert without a key removes it; the stored bytes are then exactly an unkeyed
    // order's.
    client
        .schedule_with(
            Q,
            NewOrder::new("o-2", When::in_ms(60_000), json!(1)).with_key("k"),
            Mode::Upsert,
        )
        .await
        .unwrap();
    client
        .schedule(Q, "o-2", When::in_ms(60_000), json!(1))
        .await
        .unwrap();
    let o2 = client.get(Q, "o-2").await.unwrap().unwrap();
    assert_eq!(o2.key, None);
    // Still indexed, as an unkeyed order of a shard that holds keyed ones: under "".
    assert_eq!(
        index_of(&client).await,
        expected(&[("o-2", Some(""), o2.due_at_ms)])
    );
}

/// A bad key is refused naming `key`, nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_key_is_refused_naming_the_field() {
    let (_s, client) = start().await;
    for bad in [String::new(), "k".repeat(129), "a\u{7}b".into()] {
        let e = client
            .schedule_with(
                Q,
                NewOrder::new("o", When::in_ms(0), json!(1)).with_key(bad.clone()),
                Mode::Upsert,
            )
            .await
            .unwrap_err();
        assert!(e.to_string().contains("key"), "{bad:?}: {e}");
    }
    assert!(client.get(Q, "o").await.unwrap().is_none());
}

/// Upserts, reschedules and cancels keep the key index exact; dispatch empties it and
/// clears the shards' meta field; unkeyed orders never make one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_index_stays_exact() {
    let (_s, client) = start_with(ClientOptions::default().shards(4)).await;
    let now = client.now_ms();
    let t = |s: i64| now + 60_000 + s;
    // Unkeyed orders alone: no index, no meta field.
    client
        .schedule(Q, "plain-0", When::at_ms(t(0)), json!(0))
        .await
        .unwrap();
    assert!(!marked(&client).await);
    let mut orders: Vec<NewOrder> = Vec::new();
    for i in 0..12 {
        let key = ["a", "b", "c"][i % 3];
        orders.push(
            NewOrder::new(format!("o-{i}"), When::at_ms(t(i as i64)), json!(i)).with_key(key),
        );
    }
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
    assert!(marked(&client).await);
    // o-0: key a -> key z, later; o-1: key removed; o-2: rescheduled; o-3: cancelled;
    // o-4: nx with another key (unchanged); a new keyed order in the same batch twice.
    client
        .schedule_many(
            Q,
            &[
                NewOrder::new("o-0", When::at_ms(t(100)), json!(0)).with_key("z"),
                NewOrder::new("o-1", When::at_ms(t(1)), json!(1)),
                NewOrder::new("n-1", When::at_ms(t(50)), json!(1)).with_key("a"),
                NewOrder::new("n-1", When::at_ms(t(40)), json!(1)).with_key("b"),
                // Moved away and back in one call: it keeps its member.
                NewOrder::new("o-5", When::at_ms(t(60)), json!(5)).with_key("y"),
                NewOrder::new("o-5", When::at_ms(t(5)), json!(5)).with_key("c"),
            ],
            Mode::Upsert,
        )
        .await
        .unwrap();
    client
        .schedule_with(
            Q,
            NewOrder::new("o-4", When::at_ms(t(7)), json!(4)).with_key("q"),
            Mode::IfAbsent,
        )
        .await
        .unwrap();
    client
        .reschedule(Q, "o-2", When::at_ms(t(-10)))
        .await
        .unwrap();
    client.cancel(Q, "o-3").await.unwrap();
    let want: Vec<(String, Option<String>, i64)> = {
        let mut v = Vec::new();
        for id in (0..12).map(|i| format!("o-{i}")).chain(["n-1".into()]) {
            if let Some(o) = client.get(Q, &id).await.unwrap() {
                v.push((id, o.key, o.due_at_ms));
            }
        }
        v
    };
    let refs: Vec<(&str, Option<&str>, i64)> = want
        .iter()
        .map(|(i, k, d)| (i.as_str(), k.as_deref(), *d))
        .collect();
    assert_eq!(refs.iter().find(|o| o.0 == "o-0").unwrap().1, Some("z"));
    assert_eq!(refs.iter().find(|o| o.0 == "o-1").unwrap().1, None);
    // The unkeyed orders written while the shard holds keyed ones are indexed under "";
    // plain-0, written before, is not.
    let refs: Vec<(&str, Option<&str>, i64)> = refs
        .into_iter()
        .map(|(i, k, d)| (i, k.or(Some("")), d))
        .collect();
    assert_eq!(refs.iter().find(|o| o.0 == "o-4").unwrap().1, Some("b"));
    assert_eq!(refs.iter().find(|o| o.0 == "n-1").unwrap().1, Some("b"));
    assert_eq!(
        refs.iter().find(|o| o.0 == "o-5").map(|o| (o.1, o.2)),
        Some((Some("c"), t(5)))
    );
    assert!(!refs.iter().any(|o| o.0 == "o-3"));
    assert_eq!(index_of(&client).await, expected(&refs));

    // Everything due now: dispatched, the index and the meta fields gone.
    let all: Vec<String> = want.iter().map(|w| w.0.clone()).collect();
    for id in &all {
        client.reschedule(Q, id, When::in_ms(0)).await.unwrap();
    }
    client
        .reschedule(Q, "plain-0", When::in_ms(0))
        .await
        .unwrap();
    let d = Dispatcher::new(&client, Q, DispatcherOptions::default()).unwrap();
    d.drain().await.unwrap();
    assert_eq!(client.admin().stats(Q).await.unwrap().scheduled, 0);
    assert_eq!(index_of(&client).await, Default::default());
    assert!(!marked(&client).await);
}

/// The fair-share test: key A has 20,000 orders and key B 200, all due at the same
/// instant (B's ids sort after A's, so the schedule's own order puts every B behind every
/// A); one worker with concurrency 8 and 1 ms handlers. Every B order starts before A's
/// 2,000th; nothing is lost or handled twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_share_serves_a_small_key_alongside_a_big_one() {
    const A: usize = 20_000;
    const B: usize = 200;
    let (_s, client) = start_with(ClientOptions::default().shards(4)).await;
    let due = client.now_ms();
    let mut orders = Vec::new();
    for i in 0..A {
        orders.push(NewOrder::new(format!("a-{i:05}"), When::at_ms(due), json!(i)).with_key("A"));
    }
    for i in 0..B {
        orders.push(NewOrder::new(format!("b-{i:05}"), When::at_ms(due), json!(i)).with_key("B"));
    }
    for chunk in orders.chunks(1000) {
        client.schedule_many(Q, chunk, Mode::Upsert).await.unwrap();
    }
    // Starts in order: (key, id).
    let log: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let l2 = log.clone();
    let handler = move |d: Delivery| {
        l2.lock()
            .unwrap()
            .push((d.key().unwrap_or_default().to_owned(), d.id.clone()));
        Box::pin(async move {
            // The handler's simulated work.
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok(())
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = HandlerResult> + Send>>
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
            .block(Duration::from_millis(100)),
    )
    .unwrap();
    let worker = tokio::spawn(w.run(cancel.clone()));
    let l3 = log.clone();
    wait_for("every order handled", WAIT, move || {
        let n = l3.lock().unwrap().len();
        async move { n >= A + B }
    })
    .await;
    cancel.cancel();
    disp.await.unwrap();
    worker.await.unwrap().unwrap();
    let log = log.lock().unwrap().clone();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (_, id) in &log {
        *seen.entry(id.as_str()).or_default() += 1;
    }
    assert_eq!(seen.len(), A + B, "orders handled");
    assert!(seen.values().all(|n| *n == 1), "an order handled twice");
    let a_mark = log
        .iter()
        .enumerate()
        .filter(|(_, (k, _))| k == "A")
        .nth(A / 10 - 1)
        .map(|(i, _)| i)
        .unwrap();
    let last_b = log.iter().rposition(|(k, _)| k == "B").unwrap();
    assert!(
        last_b < a_mark,
        "the last B order started at {last_b}, after A's {}th start (at {a_mark})",
        A / 10
    );
}

/// Many keys, unkeyed orders among them and two dispatchers at once on four shards: every
/// order is delivered exactly once, with its key, and the index is empty afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_keys_and_unkeyed_orders_are_each_delivered_once() {
    let (_s, client) = start_with(ClientOptions::default().shards(4)).await;
    let due = client.now_ms();
    let mut orders = Vec::new();
    for i in 0..3_000_usize {
        let o = NewOrder::new(
            format!("o-{i:05}"),
            When::at_ms(due + i64::try_from(i % 7).unwrap()),
            json!(i),
        );
        orders.push(if i.is_multiple_of(5) {
            o
        } else {
            o.with_key(format!("k{}", i % 301))
        });
    }
    for chunk in orders.chunks(1000) {
        client.schedule_many(Q, chunk, Mode::Upsert).await.unwrap();
    }
    let rec = support::Recorder::default();
    let cancel = CancellationToken::new();
    let d1 = spawn_dispatcher(&client, &cancel);
    let d2 = spawn_dispatcher(&client, &cancel);
    let w = Worker::new(
        &client,
        Q,
        "close",
        rec.handler(),
        WorkerOptions::default()
            .concurrency(16)
            .block(Duration::from_millis(100)),
    )
    .unwrap();
    let worker = tokio::spawn(w.run(cancel.clone()));
    rec.wait_len(3_000, WAIT).await;
    cancel.cancel();
    d1.await.unwrap();
    d2.await.unwrap();
    worker.await.unwrap().unwrap();
    let counts = rec.counts();
    assert_eq!(counts.len(), 3_000);
    assert!(counts.values().all(|n| *n == 1), "an order delivered twice");
    for d in rec.deliveries() {
        let i: usize = d.id[2..].parse().unwrap();
        let want = (!i.is_multiple_of(5)).then(|| format!("k{}", i % 301));
        assert_eq!(d.key().map(str::to_owned), want, "{}", d.id);
    }
    assert_eq!(index_of(&client).await, Default::default());
    assert!(!marked(&client).await);
}

/// Unkeyed orders are one participant of the rotation: 3,000 orders of key A and 30
/// unkeyed ones, all due at the same instant (the unkeyed ids sort after A's, so the
/// schedule's own order puts them behind every A), one shard: every unkeyed order starts
/// before A's 300th.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unkeyed_orders_are_one_participant() {
    const A: usize = 3_000;
    const U: usize = 30;
    let (_s, client) = start().await;
    let due = client.now_ms();
    let mut orders = Vec::new();
    for i in 0..A {
        orders.push(NewOrder::new(format!("a-{i:05}"), When::at_ms(due), json!(i)).with_key("A"));
    }
    for i in 0..U {
        orders.push(NewOrder::new(
            format!("u-{i:05}"),
            When::at_ms(due),
            json!(i),
        ));
    }
    for chunk in orders.chunks(1000) {
        client.schedule_many(Q, chunk, Mode::Upsert).await.unwrap();
    }
    let rec = support::Recorder::default();
    let cancel = CancellationToken::new();
    let disp = spawn_dispatcher(&client, &cancel);
    let w = Worker::new(
        &client,
        Q,
        "close",
        rec.handler(),
        WorkerOptions::default()
            .concurrency(8)
            .block(Duration::from_millis(100)),
    )
    .unwrap();
    let worker = tokio::spawn(w.run(cancel.clone()));
    rec.wait_len(A + U, WAIT).await;
    cancel.cancel();
    disp.await.unwrap();
    worker.await.unwrap().unwrap();
    let log = rec.deliveries();
    assert_eq!(rec.counts().len(), A + U);
    assert!(
        rec.counts().values().all(|n| *n == 1),
        "an order delivered twice"
    );
    let a_mark = log
        .iter()
        .enumerate()
        .filter(|(_, d)| d.key() == Some("A"))
        .nth(A / 10 - 1)
        .map(|(i, _)| i)
        .unwrap();
    let last_u = log.iter().rposition(|d| d.key().is_none()).unwrap();
    assert!(
        last_u < a_mark,
        "the last unkeyed order started at {last_u}, after A's {}th start (at {a_mark})",
        A / 10
    );
    assert_eq!(index_of(&client).await, Default::default());
    assert!(!marked(&client).await);
}

/// A backlog that one dispatch call takes whole (fewer due orders than its limit) is still
/// shared between the keys (round robin in the stream, not key A's 30 before key B's 5), and
/// a call that moves only the due orders of keys that have later ones leaves the key index
/// and ring exact: each key's remaining members, scored by its earliest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_takes_every_due_order_still_shares_and_keeps_the_index_exact() {
    let (_s, client) = start().await;
    let now = client.now_ms();
    let mut orders = Vec::new();
    // Due now: A's 30 (earliest), then B's 5, then 3 unkeyed; later: 2 of each key, 1 unkeyed.
    for i in 0..30 {
        orders.push(
            NewOrder::new(format!("a-{i:02}"), When::at_ms(now - 100 + i), json!(i)).with_key("A"),
        );
    }
    for i in 0..5 {
        orders.push(
            NewOrder::new(format!("b-{i:02}"), When::at_ms(now - 50 + i), json!(i)).with_key("B"),
        );
    }
    for i in 0..3 {
        orders.push(NewOrder::new(
            format!("u-{i:02}"),
            When::at_ms(now - 40 + i),
            json!(i),
        ));
    }
    let later = |s: i64| now + 600_000 + s;
    let mut rest: Vec<(String, Option<&str>, i64)> = Vec::new();
    for (k, key) in [(0, "A"), (10, "B")] {
        for j in 0..2 {
            let id = format!("{}-later-{j}", key.to_lowercase());
            orders
                .push(NewOrder::new(id.clone(), When::at_ms(later(k + j)), json!(j)).with_key(key));
            rest.push((id, Some(key), later(k + j)));
        }
    }
    orders.push(NewOrder::new("u-later", When::at_ms(later(20)), json!(0)));
    rest.push(("u-later".into(), Some(""), later(20)));
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
    let d = Dispatcher::new(&client, Q, DispatcherOptions::default()).unwrap();
    d.drain().await.unwrap();

    let q = delayq::engine::keys::QueueName::new(Q).unwrap();
    let shard = client.keyspace().shards(&q, 1).remove(0);
    let entries: Vec<(String, Vec<(String, String)>)> =
        raw(&client, &["XRANGE", &shard.stream, "-", "+"]).await;
    let ids: Vec<String> = entries
        .iter()
        .filter_map(|(_, f)| f.iter().find(|(k, _)| k == "id").map(|(_, v)| v.clone()))
        .collect();
    assert_eq!(
        ids.len(),
        38,
        "every due order moved, nothing else: {ids:?}"
    );
    let last_b = ids.iter().rposition(|i| i.starts_with("b-")).unwrap();
    let last_u = ids.iter().rposition(|i| i.starts_with("u-")).unwrap();
    // Round robin between A, B and the unkeyed orders: B's 5th and the 3rd unkeyed within
    // the first 5 rounds of 3.
    assert!(last_b < 15 && last_u < 15, "not shared: {ids:?}");
    // Within a key, due order.
    let a: Vec<&String> = ids.iter().filter(|i| i.starts_with("a-")).collect();
    assert!(
        a.windows(2).all(|w| w[0] < w[1]),
        "A out of due order: {a:?}"
    );
    let refs: Vec<(&str, Option<&str>, i64)> =
        rest.iter().map(|(i, k, d)| (i.as_str(), *k, *d)).collect();
    assert_eq!(index_of(&client).await, expected(&refs));
    assert!(marked(&client).await);
}

/// The backlog path (more due orders than a call takes) keeps the index exact after every
/// call: the moved orders' members go (a key's taken members by range), a member whose
/// order does not exist or was moved behind the index's back is dropped and never
/// dispatched, and every other due order is moved exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_backlog_call_keeps_the_index_exact_and_drops_stale_members() {
    let (_s, client) = start().await;
    let now = client.now_ms();
    let later = |s: i64| now + 600_000 + s;
    let mut orders = Vec::new();
    let mut due_ids = Vec::new();
    // Due now: A 25, B 9, C 1 and 4 unkeyed; later: 2 of A and 1 of B.
    for (key, n, at) in [
        (Some("A"), 25, -300),
        (Some("B"), 9, -90),
        (Some("C"), 1, -80),
        (None, 4, -70),
    ] {
        for i in 0..n {
            let id = format!("{}-{i:02}", key.unwrap_or("u").to_lowercase());
            let o = NewOrder::new(id.clone(), When::at_ms(now + at + i), json!(i));
            orders.push(match key {
                Some(k) => o.with_key(k),
                None => o,
            });
            due_ids.push(id);
        }
    }
    for (id, key, at) in [
        ("a-later-0", "A", 0),
        ("a-later-1", "A", 1),
        ("b-later", "B", 2),
    ] {
        orders.push(NewOrder::new(id, When::at_ms(later(at)), json!(0)).with_key(key));
    }
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
    // Behind the index's back: a member of A whose order does not exist (A's earliest), and
    // b-00 moved later by a raw ZADD (its member keeps the old due time).
    let q = delayq::engine::keys::QueueName::new(Q).unwrap();
    let shard = client.keyspace().shards(&q, 1).remove(0);
    let ghost = format!("A\u{1f}{:016}\u{1f}ghost", now - 500);
    let _: i64 = raw(&client, &["ZADD", &shard.keyed, "0", &ghost]).await;
    let moved_to = later(50).to_string();
    let _: i64 = raw(&client, &["ZADD", &shard.due, &moved_to, "b-00"]).await;
    due_ids.retain(|i| i != "b-00");
    let stale_b = format!("B\u{1f}{:016}\u{1f}b-00", now - 90);

    let d = Dispatcher::new(&client, Q, DispatcherOptions::default().batch(7)).unwrap();
    let mut calls = 0;
    loop {
        let pass = d.pass().await.unwrap();
        calls += 1;
        // After every call, the index holds exactly the scheduled orders' members (b-00's
        // stale one aside, until a call drops it) and the ghost only until a call drops it.
        let scheduled: Vec<(String, f64)> =
            raw(&client, &["ZRANGE", &shard.due, "0", "-1", "WITHSCORES"]).await;
        let mut want = Vec::new();
        for (id, _) in scheduled.iter().filter(|(i, _)| i != "b-00") {
            let o = client.get(Q, id).await.unwrap().unwrap();
            want.push((id.clone(), Some(o.key.unwrap_or_default()), o.due_at_ms));
        }
        let refs: Vec<(&str, Option<&str>, i64)> = want
            .iter()
            .map(|(i, k, d)| (i.as_str(), k.as_deref(), *d))
            .collect();
        let (mut members, ring) = index_of(&client).await;
        members.remove(&ghost);
        members.remove(&stale_b);
        assert_eq!(members, expected(&refs).0, "after call {calls}");
        // Every key with scheduled orders is on the ring (its score: at most its earliest
        // member's due time, or the call's now when it was just served).
        for key in expected(&refs).1.keys() {
            assert!(ring.contains_key(key), "after call {calls}: {key} {ring:?}");
        }
        if pass.moved == 0 && !pass.more {
            break;
        }
        assert!(calls < 100, "the backlog never drained");
    }
    assert!(
        calls > 5,
        "the backlog was not taken over several calls ({calls})"
    );
    let entries: Vec<(String, Vec<(String, String)>)> =
        raw(&client, &["XRANGE", &shard.stream, "-", "+"]).await;
    let mut ids: Vec<String> = entries
        .iter()
        .filter_map(|(_, f)| f.iter().find(|(k, _)| k == "id").map(|(_, v)| v.clone()))
        .collect();
    ids.sort();
    due_ids.sort();
    assert_eq!(
        ids, due_ids,
        "every due order once; no ghost, b-00 not early"
    );
    let b00: Option<f64> = raw(&client, &["ZSCORE", &shard.due, "b-00"]).await;
    assert_eq!(b00, Some(later(50) as f64));
    let (members, ring) = index_of(&client).await;
    let rest = [
        ("a-later-0", Some("A"), later(0)),
        ("a-later-1", Some("A"), later(1)),
        ("b-later", Some("B"), later(2)),
    ];
    assert_eq!(members, expected(&rest).0);
    assert_eq!(ring.keys().collect::<Vec<_>>(), vec!["A", "B"]);
}

/// On a Redis Cluster (every script's keys under its shard's hash tag, the key index
/// included): keyed orders over four shards are scheduled, upserted, cancelled and
/// rescheduled, then each is delivered exactly once with its key, and the index is empty.
#[tokio::test]
async fn keys_work_on_a_cluster() {
    let cluster = support::cluster::LocalCluster::start();
    let client = Client::connect_with(&cluster.url(), ClientOptions::default().shards(4))
        .await
        .unwrap();
    support::declare_queues(&client).await;
    assert!(client.is_cluster());
    let due = client.now_ms();
    let orders: Vec<NewOrder> = (0..400)
        .map(|i| {
            let o = NewOrder::new(format!("o-{i}"), When::at_ms(due), json!(i));
            if i % 4 == 0 {
                o
            } else {
                o.with_key(format!("k{}", i % 7))
            }
        })
        .collect();
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
    client.cancel(Q, "o-1").await.unwrap();
    client
        .reschedule(Q, "o-2", When::at_ms(due + 1))
        .await
        .unwrap();
    client
        .schedule_with(
            Q,
            NewOrder::new("o-3", When::at_ms(due), json!(3)).with_key("moved"),
            Mode::Upsert,
        )
        .await
        .unwrap();
    let rec = support::Recorder::default();
    let cancel = CancellationToken::new();
    let disp = spawn_dispatcher(&client, &cancel);
    let w = Worker::new(
        &client,
        Q,
        "close",
        rec.handler(),
        WorkerOptions::default().block(Duration::from_millis(100)),
    )
    .unwrap();
    let worker = tokio::spawn(w.run(cancel.clone()));
    rec.wait_len(399, WAIT).await;
    cancel.cancel();
    disp.await.unwrap();
    worker.await.unwrap().unwrap();
    let counts = rec.counts();
    assert_eq!(counts.len(), 399);
    assert!(
        !counts.contains_key("o-1"),
        "a cancelled order was delivered"
    );
    assert!(counts.values().all(|n| *n == 1), "an order delivered twice");
    for d in rec.deliveries() {
        let i: usize = d.id[2..].parse().unwrap();
        let want = match i {
            3 => Some("moved".to_owned()),
            _ if i.is_multiple_of(4) => None,
            _ => Some(format!("k{}", i % 7)),
        };
        assert_eq!(d.key().map(str::to_owned), want, "{}", d.id);
    }
    assert_eq!(index_of(&client).await, Default::default());
}

/// Every shard's tag index members, read raw.
async fn tag_index_of(client: &Client) -> BTreeSet<String> {
    let q = delayq::engine::keys::QueueName::new(Q).unwrap();
    let mut members = BTreeSet::new();
    for k in client.keyspace().shards(&q, client.options().shards) {
        let m: Vec<String> = raw(client, &["ZRANGE", &k.tags, "0", "-1"]).await;
        members.extend(m);
    }
    members
}

/// An order with both a key and tags (issues 42 and 43 together): stored `\x1e<key>\x1e`
/// then `\x1d<tags>\x1d`, read back with both, kept in both indexes by a move and a cancel
/// by tag, delivered with both, and out of both indexes once dispatched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_and_tags_go_together() {
    let (_s, client) = start().await;
    let due = client.now_ms() + 600_000;
    let both = |id: &str, due: i64, tags: &[&str]| {
        NewOrder::new(id, When::at_ms(due), json!({"id": id}))
            .with_key("merchant:17")
            .with_tags(tags.iter().copied())
            .with_expires_after(Duration::from_secs(3600))
    };
    client
        .schedule_with(
            Q,
            both("kt-1", due, &["order:1", "customer:9"]),
            Mode::Upsert,
        )
        .await
        .unwrap();
    client
        .schedule_with(Q, both("kt-2", due + 1, &["customer:9"]), Mode::Upsert)
        .await
        .unwrap();
    let got = client.get(Q, "kt-1").await.unwrap().unwrap();
    assert_eq!(got.key.as_deref(), Some("merchant:17"));
    assert_eq!(
        got.tags,
        vec!["order:1".to_owned(), "customer:9".to_owned()]
    );
    assert_eq!(got.payload, json!({"id": "kt-1"}));
    // The stored prefixes in their order: expiry, key, tags, then the payload.
    let q = delayq::engine::keys::QueueName::new(Q).unwrap();
    let mut values = Vec::new();
    for k in client.keyspace().shards(&q, client.options().shards) {
        let v: Option<String> = raw(&client, &["HGET", &k.payload, "kt-1"]).await;
        values.extend(v);
    }
    assert_eq!(values.len(), 1, "{values:?}");
    assert_eq!(
        values[0].split_once(':').unwrap().1,
        "!3600000!\u{1e}merchant:17\u{1e}\u{1d}order:1\u{1f}customer:9\u{1d}{\"id\":\"kt-1\"}"
    );
    let h = client.admin().history(Q, "kt-1").await.unwrap().unwrap();
    assert_eq!(h.key.as_deref(), Some("merchant:17"));
    assert_eq!(h.tags, vec!["order:1".to_owned(), "customer:9".to_owned()]);
    assert_eq!(
        index_of(&client).await,
        expected(&[
            ("kt-1", Some("merchant:17"), due),
            ("kt-2", Some("merchant:17"), due + 1)
        ])
    );
    let tag_members = |v: &[(&str, &str)]| -> BTreeSet<String> {
        v.iter().map(|(t, id)| format!("{t}\u{1f}{id}")).collect()
    };
    assert_eq!(
        tag_index_of(&client).await,
        tag_members(&[
            ("order:1", "kt-1"),
            ("customer:9", "kt-1"),
            ("customer:9", "kt-2")
        ])
    );

    // Moved by tag: the key index members move with the orders.
    let moved = client
        .tag_reschedule(Some(Q), "customer:9", delayq::TagMove::ShiftMs(1_000))
        .await
        .unwrap();
    assert_eq!(moved.total, 2);
    assert_eq!(
        index_of(&client).await,
        expected(&[
            ("kt-1", Some("merchant:17"), due + 1_000),
            ("kt-2", Some("merchant:17"), due + 1_001)
        ])
    );

    // Cancelled by tag: out of the key index too.
    let cancelled = client.tag_cancel(Some(Q), "order:1").await.unwrap();
    assert_eq!(cancelled.total, 1);
    assert!(client.get(Q, "kt-1").await.unwrap().is_none());
    assert_eq!(
        index_of(&client).await,
        expected(&[("kt-2", Some("merchant:17"), due + 1_001)])
    );
    assert_eq!(
        tag_index_of(&client).await,
        tag_members(&[("customer:9", "kt-2")])
    );

    // An upsert with other tags and the same key: the tag index follows, the key stays.
    client
        .schedule_with(Q, both("kt-2", due + 5, &["x"]), Mode::Upsert)
        .await
        .unwrap();
    assert_eq!(tag_index_of(&client).await, tag_members(&[("x", "kt-2")]));
    assert_eq!(
        index_of(&client).await,
        expected(&[("kt-2", Some("merchant:17"), due + 5)])
    );
    let got = client.get(Q, "kt-2").await.unwrap().unwrap();
    assert_eq!(
        (got.key.as_deref(), got.tags.clone()),
        (Some("merchant:17"), vec!["x".to_owned()])
    );

    // Due now: delivered with both, then out of both indexes.
    client.reschedule(Q, "kt-2", When::in_ms(0)).await.unwrap();
    let seen: Arc<Mutex<Vec<Delivery>>> = Arc::default();
    let s2 = seen.clone();
    let handler = move |d: Delivery| {
        s2.lock().unwrap().push(d);
        Box::pin(async move { Ok(()) })
            as std::pin::Pin<Box<dyn std::future::Future<Output = HandlerResult> + Send>>
    };
    let cancel = CancellationToken::new();
    let disp = spawn_dispatcher(&client, &cancel);
    let w = Worker::new(
        &client,
        Q,
        "close",
        handler,
        WorkerOptions::default().block(Duration::from_millis(100)),
    )
    .unwrap();
    let worker = tokio::spawn(w.run(cancel.clone()));
    let s3 = seen.clone();
    wait_for("kt-2 delivered", WAIT, move || {
        let n = s3.lock().unwrap().len();
        async move { n == 1 }
    })
    .await;
    {
        let s = seen.lock().unwrap();
        assert_eq!(s[0].id, "kt-2");
        assert_eq!(s[0].key(), Some("merchant:17"));
        assert_eq!(s[0].tags(), ["x".to_owned()]);
        assert_eq!(s[0].payload, json!({"id": "kt-2"}));
    }
    assert_eq!(index_of(&client).await, expected(&[]));
    assert!(tag_index_of(&client).await.is_empty());
    assert!(!marked(&client).await);
    cancel.cancel();
    disp.await.unwrap();
    worker.await.unwrap().unwrap();
}
