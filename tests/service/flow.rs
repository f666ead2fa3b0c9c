//! Flow control: pausing a queue or a group loses nothing and resumes earliest first; rate
//! limits are shared by every process of a group.
#![allow(clippy::unwrap_used)]

use crate::support;

use delayq::engine::flow::RateLimit;
use delayq::{
    Client, ClientOptions, Delivery, Dispatcher, DispatcherOptions, Error, Mode, NewOrder, When,
    Worker, WorkerOptions,
};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{Recorder, start, wait_for};
use tokio_util::sync::CancellationToken;

const Q: &str = "order-close";
const WAIT: Duration = Duration::from_secs(60);

fn fast() -> WorkerOptions {
    WorkerOptions::default()
        .block(Duration::from_millis(100))
        .reclaim_every(Duration::from_millis(50))
}

async fn schedule(client: &Client, n: usize, in_ms: i64, prefix: &str) {
    let orders: Vec<NewOrder> = (0..n)
        .map(|i| {
            NewOrder::new(
                format!("{prefix}{i:04}"),
                When::in_ms(in_ms + i64::try_from(i).unwrap() % 50),
                json!(i),
            )
        })
        .collect();
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_holds_its_orders_and_resumes_earliest_first() {
    let (_s, client) = start().await;
    let rec = Recorder::default();
    let stop = CancellationToken::new();
    let w = Worker::new(&client, Q, "close", rec.handler(), fast()).unwrap();
    w.ensure_groups().await.unwrap();
    let p = client.admin().set_paused(Q, None, true).await.unwrap();
    assert_eq!(
        serde_json::to_value(&p).unwrap(),
        json!({"queue": Q, "group": null, "paused": true})
    );
    let hw = tokio::spawn(w.run(stop.clone()));
    let hd = tokio::spawn(
        Dispatcher::new(&client, Q, DispatcherOptions::default())
            .unwrap()
            .run(stop.clone()),
    );
    schedule(&client, 1000, 200, "o").await;
    // Scheduling, reading and cancelling work while paused.
    client.cancel(Q, "o0999").await.unwrap();
    assert!(client.get(Q, "o0000").await.unwrap().is_some());
    let s = client.admin().stats(Q).await.unwrap();
    assert!(s.paused);
    // Nothing is delivered while paused, well after every order came due.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(rec.len(), 0);
    assert_eq!(client.admin().stats(Q).await.unwrap().overdue, 999);
    client.admin().set_paused(Q, None, false).await.unwrap();
    rec.wait_len(999, WAIT).await;
    let counts = rec.counts();
    assert_eq!(counts.len(), 999);
    assert!(counts.values().all(|&n| n == 1), "no duplicates");
    // Dispatched earliest first: the stream holds them in due order.
    let entries: Vec<(String, HashMap<String, String>)> =
        support::raw(&client, &["XRANGE", "{dq:order-close:0}:stream", "-", "+"]).await;
    let dues: Vec<f64> = entries
        .iter()
        .map(|(_, f)| f["due_ms"].parse().unwrap())
        .collect();
    assert!(dues.windows(2).all(|w| w[0] <= w[1]), "earliest first");
    stop.cancel();
    hd.await.unwrap();
    hw.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_group_waits_while_the_other_receives() {
    let (_s, client) = start().await;
    let (close, notify) = (Recorder::default(), Recorder::default());
    let stop = CancellationToken::new();
    let wc = Worker::new(&client, Q, "close", close.handler(), fast()).unwrap();
    let wn = Worker::new(&client, Q, "notify", notify.handler(), fast()).unwrap();
    wc.ensure_groups().await.unwrap();
    wn.ensure_groups().await.unwrap();
    // A second client (another process's view) pauses the group.
    let other = Client::connect_with(&_s.url(), ClientOptions::default())
        .await
        .unwrap();
    other
        .admin()
        .set_paused(Q, Some("notify"), true)
        .await
        .unwrap();
    let e = other
        .admin()
        .set_paused(Q, Some("nope"), true)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::GroupNotFound { .. }), "{e}");
    let e = other
        .admin()
        .set_paused("typo", None, true)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::QueueNotFound { .. }), "{e}");
    let hs = [
        tokio::spawn(wc.run(stop.clone())),
        tokio::spawn(wn.run(stop.clone())),
    ];
    let hd = tokio::spawn(
        Dispatcher::new(&client, Q, DispatcherOptions::default())
            .unwrap()
            .run(stop.clone()),
    );
    schedule(&client, 200, 0, "g").await;
    close.wait_len(200, WAIT).await;
    let groups = client.admin().stats(Q).await.unwrap().groups;
    let n = groups.iter().find(|g| g.group == "notify").unwrap();
    assert!(n.paused);
    assert_eq!(notify.len(), 0, "the paused group took nothing");
    assert_eq!(n.pending, 0, "no lease runs, no attempt is used");
    other
        .admin()
        .set_paused(Q, Some("notify"), false)
        .await
        .unwrap();
    notify.wait_len(200, WAIT).await;
    assert!(notify.deliveries().iter().all(|d| d.attempt == 1));
    assert_eq!(notify.counts().len(), 200);
    stop.cancel();
    hd.await.unwrap();
    for h in hs {
        h.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_is_shared_by_every_worker_of_the_group() {
    let (s, client) = start().await;
    let starts: Arc<Mutex<Vec<i64>>> = Arc::default();
    let stop = CancellationToken::new();
    let mut hs = Vec::new();
    for _ in 0..3 {
        // Three workers, each with its own client (as three processes would have).
        let c = Client::connect_with(&s.url(), ClientOptions::default())
            .await
            .unwrap();
        let (st, clock) = (starts.clone(), c.clock().clone());
        let w = Worker::new(
            &c,
            Q,
            "close",
            move |_d: Delivery| {
                st.lock().unwrap().push(clock.now_ms());
                std::future::ready(Ok(()))
            },
            fast().rate_limit(RateLimit::parse("100/s").unwrap()),
        )
        .unwrap();
        w.ensure_groups().await.unwrap();
        hs.push(tokio::spawn(w.run(stop.clone())));
    }
    // All due at once (the limit, not the schedule, paces them).
    let orders: Vec<NewOrder> = (0..1000)
        .map(|i| NewOrder::new(format!("r{i:04}"), When::in_ms(0), json!(i)))
        .collect();
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
    let hd = tokio::spawn(
        Dispatcher::new(&client, Q, DispatcherOptions::default())
            .unwrap()
            .run(stop.clone()),
    );
    let st2 = starts.clone();
    wait_for("1000 handled", WAIT, move || {
        let n = st2.lock().unwrap().len();
        async move { n >= 1000 }
    })
    .await;
    stop.cancel();
    hd.await.unwrap();
    for h in hs {
        h.await.unwrap().unwrap();
    }
    let mut t = starts.lock().unwrap().clone();
    t.sort_unstable();
    assert_eq!(t.len(), 1000, "all delivered, once");
    // 100/s over 5-second windows: 500 ± 10%.
    for w in [0i64, 5000] {
        let from = t[0] + w;
        let n = t.iter().filter(|&&x| x >= from && x < from + 5000).count();
        assert!((450..=550).contains(&n), "window at +{w} ms: {n} calls");
    }
    assert_eq!(client.admin().stats(Q).await.unwrap().dead, 0);
}

#[test]
fn bad_rate_limits_are_refused_with_the_key_named() {
    let e = delayq::service::config::load_str(
        "redis_url = \"redis://127.0.0.1:6379\"\n[[handlers]]\nqueue = \"q\"\ngroup = \"g\"\nkind = \"log\"\nrate_limit = \"fast\"\n",
        figment::providers::Env::prefixed("DELAYQ_TEST_NONE_"),
    )
    .unwrap_err();
    assert_eq!(e.key.as_deref(), Some("handlers[0].rate_limit"), "{e}");
}

/// Permits taken for a read that returned nothing go back (`ratelimit.lua` refund): idle
/// readers never drain a limit their busy peers share.
#[tokio::test]
async fn unused_rate_limit_permits_are_refunded() {
    let (_s, client) = support::start().await;
    let script = redis::Script::new(&delayq::engine::scripts::admin::RATELIMIT_LUA);
    let key = "{dq:order-close:0}:rate:g";
    let now = client.clock().now_us();
    let call = |mode: &'static str, n: i64| {
        let mut conn = client.connection();
        let script = &script;
        async move {
            let r: (i64, i64) = script
                .key(key)
                .arg(now)
                .arg(50_000) // 20 per second
                .arg(2) // a burst of two
                .arg(n)
                .arg(mode)
                .invoke_async(&mut conn)
                .await
                .unwrap();
            r
        }
    };
    assert_eq!(call("take", 5).await.0, 2, "the burst");
    assert_eq!(call("take", 1).await.0, 0, "spent");
    assert_eq!(call("refund", 2).await, (2, 0));
    assert_eq!(call("take", 5).await.0, 2, "given back, usable again");
    // A refund never banks permits beyond now.
    assert_eq!(call("refund", 50).await, (50, 0));
    assert_eq!(call("take", 10).await.0, 2, "still only the burst");
}
