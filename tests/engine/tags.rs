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
