//! Sharded queues against a real redis-server: the shard count is fixed at creation and a
//! mismatched client is refused; dispatch is fair across shards.
#![allow(clippy::unwrap_used)]

mod support;

use delayq::keys::shard_of;
use delayq::{
    Client, ClientOptions, Delivery, Dispatcher, DispatcherOptions, Mode, NewOrder, When, Worker,
    WorkerOptions,
};
use serde_json::json;
use support::{raw, start_with};
use tokio_util::sync::CancellationToken;

const Q: &str = "order-close";

#[tokio::test]
async fn a_client_with_another_shard_count_is_refused() {
    let (s, four) = start_with(ClientOptions::default().shards(4)).await;
    four.schedule(Q, "o1", When::in_ms(60_000), json!(1))
        .await
        .unwrap();
    let stored: String = raw(&four, &["HGET", "{dq}:queue:order-close", "shards"]).await;
    assert_eq!(stored, "4");

    let eight = Client::connect_with(&s.url(), ClientOptions::default().shards(8))
        .await
        .unwrap();
    let e = eight
        .schedule(Q, "o2", When::in_ms(1), json!(1))
        .await
        .unwrap_err();
    assert_eq!(e.as_invalid().unwrap().code(), "invalid_option");
    assert!(e.to_string().contains("created with 4 shards"), "{e}");
    assert!(eight.get(Q, "o1").await.is_err());
    assert!(eight.cancel(Q, "o1").await.is_err());
    let d = Dispatcher::new(&eight, Q, DispatcherOptions::default()).unwrap();
    assert!(d.pass().await.unwrap_err().as_invalid().is_some());
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
        r.unwrap_err().as_invalid().is_some(),
        "the worker refuses to start"
    );
    // Nothing was written by the refused client.
    let mut sum = 0;
    for i in 0..4 {
        let c: i64 = raw(&four, &["ZCARD", &format!("{{dq:order-close:{i}}}:due")]).await;
        sum += c;
    }
    assert_eq!(sum, 1, "only o1");
    // A queue created by nobody yet accepts any client; reads create nothing.
    assert!(eight.get("other", "x").await.unwrap().is_none());
    let exists: i64 = raw(&four, &["EXISTS", "{dq}:queue:other"]).await;
    assert_eq!(exists, 0);
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
