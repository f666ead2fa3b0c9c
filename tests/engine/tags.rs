//! Tags on orders (issue 43): stored in front of the payload, read back by `get`, carried
//! by every delivery, history record and dead letter; an upsert replaces the set; untagged
//! orders store the bytes they always stored. No sleeps: every outcome is awaited.
#![allow(clippy::unwrap_used)]

use crate::support;

use delayq::{
    Dispatcher, DispatcherOptions, HandlerError, Mode, NewOrder, Selection, When, Worker,
    WorkerOptions,
};
use serde_json::json;
use std::time::Duration;
use support::{raw, start, wait_for};
use tokio_util::sync::CancellationToken;

const Q: &str = "order-close";
const WAIT: Duration = Duration::from_secs(20);

fn tags(t: &[&str]) -> Vec<String> {
    t.iter().map(|s| (*s).to_owned()).collect()
}

async fn stored(client: &delayq::Client, id: &str) -> Option<String> {
    raw(client, &["HGET", "{dq:order-close:0}:payload", id]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_are_stored_read_back_and_replaced_by_an_upsert() {
    let (_server, client) = start().await;
    let order = NewOrder::new("o-1", When::in_ms(60_000), json!({"a": 1}))
        .with_tags(["order:1234", "customer:42"]);
    client.schedule_with(Q, order, Mode::Upsert).await.unwrap();
    let got = client.get(Q, "o-1").await.unwrap().unwrap();
    assert_eq!(got.tags, tags(&["order:1234", "customer:42"]));
    assert_eq!(got.payload, json!({"a": 1}));
    let value = stored(&client, "o-1").await.unwrap();
    let (ms, body) = value.split_once(':').unwrap();
    assert!(ms.parse::<i64>().is_ok(), "{value:?}");
    assert_eq!(body, "\u{1d}order:1234\u{1f}customer:42\u{1d}{\"a\":1}");

    // An untagged order stores exactly `<ms>:<json>`.
    client
        .schedule(Q, "plain", When::in_ms(60_000), json!({"b": 2}))
        .await
        .unwrap();
    let value = stored(&client, "plain").await.unwrap();
    assert_eq!(value.split_once(':').unwrap().1, "{\"b\":2}");
    assert!(
        client
            .get(Q, "plain")
            .await
            .unwrap()
            .unwrap()
            .tags
            .is_empty()
    );

    // An upsert replaces the set; one without tags leaves none.
    let again = NewOrder::new("o-1", When::in_ms(60_000), json!({"a": 2})).with_tags(["x"]);
    client.schedule_with(Q, again, Mode::Upsert).await.unwrap();
    assert_eq!(
        client.get(Q, "o-1").await.unwrap().unwrap().tags,
        tags(&["x"])
    );
    client
        .schedule(Q, "o-1", When::in_ms(60_000), json!({"a": 3}))
        .await
        .unwrap();
    assert!(client.get(Q, "o-1").await.unwrap().unwrap().tags.is_empty());

    // Bad tags: refused naming the field, nothing written.
    let bad = NewOrder::new("bad", When::in_ms(0), json!(1)).with_tags(["a", "a"]);
    let e = client
        .schedule_with(Q, bad, Mode::Upsert)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("tags"), "{e}");
    assert!(client.get(Q, "bad").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_its_history_a_dead_letter_and_a_replay_carry_the_tags() {
    let (_server, client) = start().await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let handler = move |d: delayq::Delivery| {
        let _ = tx.send(d);
        std::future::ready(Err::<(), _>(HandlerError::permanent("no")))
    };
    let stop = CancellationToken::new();
    let w = Worker::new(
        &client,
        Q,
        "close",
        handler,
        WorkerOptions::default().block(Duration::from_millis(50)),
    )
    .unwrap();
    w.ensure_groups().await.unwrap();
    let hw = tokio::spawn(w.run(stop.clone()));
    let hd = tokio::spawn(
        Dispatcher::new(&client, Q, DispatcherOptions::default())
            .unwrap()
            .run(stop.clone()),
    );
    let order = NewOrder::new("o-9", When::in_ms(0), json!({"n": 9}))
        .with_tags(["customer:7", "order:9"])
        .with_expires_after(Duration::from_secs(3600));
    client.schedule_with(Q, order, Mode::Upsert).await.unwrap();
    let d = tokio::time::timeout(WAIT, rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.tags(), tags(&["customer:7", "order:9"]).as_slice());
    assert_eq!(d.payload_text, "{\"n\":9}");
    let c = client.clone();
    wait_for("the dead letter", WAIT, move || {
        let c = c.clone();
        async move { !c.admin().dead_list(Q, None, 10).await.unwrap().is_empty() }
    })
    .await;
    let dead = client.admin().dead_list(Q, None, 10).await.unwrap();
    assert_eq!(dead[0].tags, tags(&["customer:7", "order:9"]));
    let h = client.admin().history(Q, "o-9").await.unwrap().unwrap();
    assert_eq!(h.tags, tags(&["customer:7", "order:9"]));
    client
        .admin()
        .dead_replay(Q, None, &Selection::All)
        .await
        .unwrap();
    let again = tokio::time::timeout(WAIT, rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.tags(), d.tags());
    stop.cancel();
    let _ = hw.await;
    let _ = hd.await;
}

/// The shard's tag index as `(tag, id)` pairs, sorted.
async fn index(client: &delayq::Client) -> Vec<(String, String)> {
    let members: Vec<String> = raw(client, &["ZRANGE", "{dq:order-close:0}:tags", "0", "-1"]).await;
    let mut out: Vec<(String, String)> = members
        .iter()
        .map(|m| {
            let (t, id) = m.split_once('\u{1f}').unwrap();
            (t.to_owned(), id.to_owned())
        })
        .collect();
    out.sort();
    out
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = p
        .iter()
        .map(|(t, id)| ((*t).to_owned(), (*id).to_owned()))
        .collect();
    v.sort();
    v
}

/// The index follows every write in the same script: schedule, upsert (the set replaced,
/// also within one batch), if_absent (untouched), cancel, reschedule (kept), dispatch
/// (emptied); untagged orders never enter it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_is_exact_through_upsert_cancel_reschedule_and_dispatch() {
    let (_server, client) = start().await;
    let later = When::in_ms(3_600_000);
    let o = |id: &str, t: &[&str]| NewOrder::new(id, later, json!(1)).with_tags(t.to_vec());
    client
        .schedule_many(
            Q,
            &[o("a", &["x", "y"]), o("b", &["x"]), o("c", &[])],
            Mode::Upsert,
        )
        .await
        .unwrap();
    assert_eq!(
        index(&client).await,
        pairs(&[("x", "a"), ("y", "a"), ("x", "b")])
    );
    client
        .schedule_with(Q, o("a", &["y", "z"]), Mode::Upsert)
        .await
        .unwrap();
    client.schedule(Q, "b", later, json!(2)).await.unwrap();
    assert_eq!(index(&client).await, pairs(&[("y", "a"), ("z", "a")]));
    // One batch: the later write of an id wins, for its tags too.
    client
        .schedule_many(Q, &[o("d", &["p"]), o("d", &["q"])], Mode::Upsert)
        .await
        .unwrap();
    client
        .schedule_with(Q, o("a", &["w"]), Mode::IfAbsent)
        .await
        .unwrap();
    assert_eq!(
        index(&client).await,
        pairs(&[("y", "a"), ("z", "a"), ("q", "d")])
    );
    assert_eq!(
        client.cancel(Q, "a").await.unwrap(),
        delayq::CancelOutcome::Cancelled
    );
    assert_eq!(index(&client).await, pairs(&[("q", "d")]));
    client.reschedule(Q, "d", When::in_ms(0)).await.unwrap();
    assert_eq!(
        client.get(Q, "d").await.unwrap().unwrap().tags,
        tags(&["q"])
    );
    assert_eq!(index(&client).await, pairs(&[("q", "d")]));
    let stop = CancellationToken::new();
    let hd = tokio::spawn(
        Dispatcher::new(&client, Q, DispatcherOptions::default())
            .unwrap()
            .run(stop.clone()),
    );
    let c = client.clone();
    wait_for("d dispatched", WAIT, move || {
        let c = c.clone();
        async move { c.get(Q, "d").await.unwrap().is_none() }
    })
    .await;
    assert_eq!(index(&client).await, pairs(&[]));
    stop.cancel();
    let _ = hd.await;
}

/// 3 queues of 4 shards, 900 orders, 150 of them tagged `customer:7`: count and list find
/// exactly those (paged), a reschedule by tag shifts exactly those of one queue (checked
/// through `get`), a cancel by tag over every queue answers 150 and leaves every other order
/// scheduled, and a repeated cancel answers 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_actions_by_tag_touch_exactly_the_tagged_orders() {
    let (_server, client) = start().await;
    let admin = client.admin();
    let queues = ["tq-a", "tq-b", "tq-c"];
    let due = client.now_ms() + 3_600_000;
    let mut tagged = std::collections::BTreeSet::new();
    for q in queues {
        admin.create_queue(q, 4).await.unwrap();
        let orders: Vec<NewOrder> = (0..300)
            .map(|i| {
                let o = NewOrder::new(format!("{q}-{i:03}"), When::at_ms(due + i), json!(i));
                if i % 6 == 0 {
                    tagged.insert((q.to_owned(), format!("{q}-{i:03}")));
                    o.with_tags([format!("order:{i}"), "customer:7".into()])
                } else {
                    o.with_tags([format!("order:{i}")])
                }
            })
            .collect();
        client
            .schedule_many(q, &orders, Mode::Upsert)
            .await
            .unwrap();
    }
    let counts = client.tag_count(None, "customer:7").await.unwrap();
    assert_eq!(counts.total, 150);
    assert_eq!(
        counts.queues.values().copied().collect::<Vec<_>>(),
        vec![50; 3]
    );
    assert_eq!(
        client
            .tag_count(Some("tq-b"), "customer:7")
            .await
            .unwrap()
            .total,
        50
    );
    // Paged through every queue: each tagged order once, in order.
    let (mut seen, mut after) = (Vec::new(), None::<String>);
    loop {
        let page = client
            .tag_list(None, "customer:7", 7, after.as_deref())
            .await
            .unwrap();
        seen.extend(page.orders.iter().map(|o| (o.queue.clone(), o.id.clone())));
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(seen, tagged.iter().cloned().collect::<Vec<_>>());
    // Reschedule by tag: a shift of +1 min, tq-a only.
    let moved = client
        .tag_reschedule(Some("tq-a"), "customer:7", delayq::TagMove::ShiftMs(60_000))
        .await
        .unwrap();
    assert_eq!(moved.total, 50);
    for i in 0..300i64 {
        let got = client
            .get("tq-a", &format!("tq-a-{i:03}"))
            .await
            .unwrap()
            .unwrap();
        let shift = if i % 6 == 0 { 60_000 } else { 0 };
        assert_eq!(got.due_at_ms, due + i + shift, "tq-a-{i:03}");
    }
    let cancelled = client.tag_cancel(None, "customer:7").await.unwrap();
    assert_eq!(cancelled.total, 150);
    assert_eq!(client.tag_count(None, "customer:7").await.unwrap().total, 0);
    assert_eq!(
        client.tag_cancel(None, "customer:7").await.unwrap().total,
        0
    );
    for q in queues {
        for i in 0..300 {
            let id = format!("{q}-{i:03}");
            assert_eq!(
                client.get(q, &id).await.unwrap().is_some(),
                i % 6 != 0,
                "{id}"
            );
        }
    }
    // The other tags' members of the cancelled orders left the index with them.
    assert_eq!(client.tag_count(None, "order:0").await.unwrap().total, 0);
    assert_eq!(client.tag_count(None, "order:1").await.unwrap().total, 3);
    let e = client.tag_cancel(None, "").await.unwrap_err();
    assert!(e.to_string().contains("tag"), "{e}");
}

/// A cancel by tag racing dispatch (every order due at the instant of the cancel): each
/// order is either cancelled or delivered, never both and never neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_by_tag_racing_dispatch_cancels_or_delivers_each_order_once() {
    let (_server, client) = start().await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let handler = move |d: delayq::Delivery| {
        let _ = tx.send(d.id.clone());
        std::future::ready(Ok::<(), HandlerError>(()))
    };
    let stop = CancellationToken::new();
    let w = Worker::new(
        &client,
        Q,
        "close",
        handler,
        WorkerOptions::default().block(Duration::from_millis(50)),
    )
    .unwrap();
    w.ensure_groups().await.unwrap();
    let hw = tokio::spawn(w.run(stop.clone()));
    let hd = tokio::spawn(
        Dispatcher::new(&client, Q, DispatcherOptions::default().batch(20))
            .unwrap()
            .run(stop.clone()),
    );
    let n = 2000;
    let due = client.now_ms() + 500;
    let orders: Vec<NewOrder> = (0..n)
        .map(|i| NewOrder::new(format!("r-{i}"), When::at_ms(due), json!(i)).with_tags(["race"]))
        .collect();
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
    let c = client.clone();
    wait_for("the due time", WAIT, move || {
        let now = c.now_ms();
        async move { now >= due }
    })
    .await;
    let cancelled = client.tag_cancel(Some(Q), "race").await.unwrap().total;
    let want = n - usize::try_from(cancelled).unwrap();
    let mut delivered = std::collections::HashSet::new();
    while delivered.len() < want {
        let id = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(delivered.insert(id.clone()), "{id} delivered twice");
    }
    // Every dispatched order is one stream entry: exactly those not cancelled.
    let xlen: usize = raw(&client, &["XLEN", "{dq:order-close:0}:stream"]).await;
    assert_eq!(xlen, want);
    // Nothing of the tag is left scheduled or indexed, and nothing more arrives.
    assert_eq!(client.tag_count(Some(Q), "race").await.unwrap().total, 0);
    for i in 0..n {
        let id = format!("r-{i}");
        assert!(
            client.get(Q, &id).await.unwrap().is_none(),
            "{id} still scheduled"
        );
    }
    stop.cancel();
    let _ = hw.await;
    let _ = hd.await;
    while let Ok(id) = rx.try_recv() {
        assert!(delivered.insert(id.clone()), "{id} delivered twice");
    }
    assert_eq!(delivered.len() + usize::try_from(cancelled).unwrap(), n);
}
