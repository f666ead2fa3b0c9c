//! Cancel-on-event (issue 43 items 4-5): queue rules, events that cancel the matching
//! orders of every queue (exactly once per event id), events that arrive first and are
//! remembered for a window (the test clock, not sleeps), bad rules and events refused.
#![allow(clippy::unwrap_used)]

use crate::support;

use delayq::{
    CancelRule, Client, Dispatcher, DispatcherOptions, Event, ManualClock, Mode, NewOrder,
    ScheduleOutcome, When,
};
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use support::{raw, start, start_with_clock};

const T0: i64 = 1_800_000_000_000;
const CLOSE: &str = "order-close";
const REMIND: &str = "notify";

fn paid_rule() -> Vec<CancelRule> {
    vec![CancelRule::new("order.paid", vec!["order_id".into()], None).unwrap()]
}

/// The ids in a shard-0 stream of `queue`, as dispatched.
async fn dispatched_ids(client: &Client, queue: &str) -> HashSet<String> {
    let key = format!("{{dq:{queue}:0}}:stream");
    let entries: Vec<(String, Vec<(String, String)>)> =
        raw(client, &["XRANGE", &key, "-", "+"]).await;
    entries
        .into_iter()
        .filter_map(|(_, f)| f.into_iter().find(|(k, _)| k == "id").map(|(_, v)| v))
        .collect()
}

/// Two queues with `order.paid` on `order_id`; 500 orders in each; events for 200 of
/// them from 4 tasks, 50 of them posted twice with the same id: exactly those 200 are
/// never dispatched, the other 300 are, and the answers add up to 200 per queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_cancel_exactly_the_matching_orders_of_every_queue_once() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_s, client) = start_with_clock(clock.clone()).await;
    for q in [CLOSE, REMIND] {
        client.admin().set_cancel_on(q, &paid_rule()).await.unwrap();
    }
    let orders: Vec<NewOrder> = (0..500)
        .map(|i| {
            NewOrder::new(
                format!("o-{i}"),
                When::in_ms(60_000),
                json!({"order_id": i}),
            )
        })
        .collect();
    for q in [CLOSE, REMIND] {
        let out = client
            .schedule_many(q, &orders, Mode::Upsert)
            .await
            .unwrap();
        assert!(out.iter().all(|s| s.outcome == ScheduleOutcome::Created));
    }
    // Not shown as tags to readers.
    assert!(
        client
            .get(CLOSE, "o-1")
            .await
            .unwrap()
            .unwrap()
            .tags
            .is_empty()
    );
    let mut tasks = Vec::new();
    for t in 0..4 {
        let c = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for i in (t..200).step_by(4) {
                let e = Event::new("order.paid", json!({"order_id": i, "amount": 5}))
                    .with_id(format!("pay-{i}"));
                answers.push(c.post_event(&e).await.unwrap());
                if i % 4 == 0 {
                    answers.push(c.post_event(&e).await.unwrap());
                }
            }
            answers
        }));
    }
    let mut per_queue = std::collections::BTreeMap::<String, u64>::new();
    let (mut total, mut duplicates) = (0, 0);
    for t in tasks {
        for a in t.await.unwrap() {
            total += a.cancelled;
            duplicates += u64::from(a.duplicate);
            for (q, n) in a.queues {
                *per_queue.entry(q).or_default() += n;
            }
        }
    }
    assert_eq!(duplicates, 50);
    assert_eq!(total, 400);
    assert_eq!(per_queue.get(CLOSE), Some(&200));
    assert_eq!(per_queue.get(REMIND), Some(&200));
    // An event whose data matches nothing cancels nothing.
    let none = client
        .post_event(&Event::new("order.paid", json!({"order_id": 9999})))
        .await
        .unwrap();
    assert_eq!(none.cancelled, 0);
    clock.advance(Duration::from_secs(60));
    for q in [CLOSE, REMIND] {
        let d = Dispatcher::new(&client, q, DispatcherOptions::default()).unwrap();
        while d.pass().await.unwrap().moved > 0 {}
        let ids = dispatched_ids(&client, q).await;
        let want: HashSet<String> = (200..500).map(|i| format!("o-{i}")).collect();
        assert_eq!(ids, want, "{q}");
    }
    // Nothing of them is left in the index.
    let left: i64 = raw(&client, &["ZCARD", "{dq:order-close:0}:tags"]).await;
    assert_eq!(left, 0);
}

/// An event that arrives first is remembered for its rule's window: the order scheduled
/// inside it is answered cancelled_by_event and never written; after it, scheduled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_first_cancels_an_order_scheduled_inside_its_window() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_s, client) = start_with_clock(clock.clone()).await;
    client
        .admin()
        .set_cancel_on(CLOSE, &paid_rule())
        .await
        .unwrap();
    let paid = client
        .post_event(&Event::new("order.paid", json!({"order_id": 9})).with_id("e-9"))
        .await
        .unwrap();
    assert_eq!((paid.cancelled, paid.matched_rules), (0, 1));
    clock.advance(Duration::from_secs(2));
    let o = NewOrder::new("o-9", When::in_ms(1000), json!({"order_id": 9}));
    let s = client
        .schedule_with(CLOSE, o.clone(), Mode::Upsert)
        .await
        .unwrap();
    assert_eq!(s.outcome, ScheduleOutcome::CancelledByEvent);
    assert_eq!(s.event.as_deref(), Some("order.paid"));
    assert!(client.get(CLOSE, "o-9").await.unwrap().is_none());
    // Another order of the same queue is not affected; nor is order 9 on a queue without
    // rules.
    let other = NewOrder::new("o-10", When::in_ms(1000), json!({"order_id": 10}));
    let s = client
        .schedule_with(CLOSE, other, Mode::Upsert)
        .await
        .unwrap();
    assert_eq!(s.outcome, ScheduleOutcome::Created);
    let s = client
        .schedule_with("q", o.clone(), Mode::Upsert)
        .await
        .unwrap();
    assert_eq!(s.outcome, ScheduleOutcome::Created);
    // The window (15 min by default) passes: scheduled, and dispatched when due.
    clock.advance(Duration::from_secs(15 * 60));
    let s = client.schedule_with(CLOSE, o, Mode::Upsert).await.unwrap();
    assert_eq!(s.outcome, ScheduleOutcome::Created);
    clock.advance(Duration::from_secs(2));
    let d = Dispatcher::new(&client, CLOSE, DispatcherOptions::default()).unwrap();
    d.pass().await.unwrap();
    let ids = dispatched_ids(&client, CLOSE).await;
    assert!(ids.contains("o-9") && ids.contains("o-10"), "{ids:?}");
}

/// Rules changed while a producer holds the old ones: its next call re-reads them, so an
/// order scheduled after the change answered carries the new rule's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_change_reaches_producers_that_cached_the_old_rules() {
    let (_s, client) = start().await;
    let other = Client::connect(&_s.url()).await.unwrap();
    other
        .schedule(CLOSE, "warm", When::in_ms(60_000), json!({"order_id": 1}))
        .await
        .unwrap();
    client
        .admin()
        .set_cancel_on(CLOSE, &paid_rule())
        .await
        .unwrap();
    other
        .schedule(CLOSE, "a", When::in_ms(60_000), json!({"order_id": 2}))
        .await
        .unwrap();
    let e = client
        .post_event(&Event::new("order.paid", json!({"order_id": 2})))
        .await
        .unwrap();
    assert_eq!(e.cancelled, 1);
    // Rules removed: orders carry no token any more.
    client.admin().set_cancel_on(CLOSE, &[]).await.unwrap();
    other
        .schedule(CLOSE, "b", When::in_ms(60_000), json!({"order_id": 3}))
        .await
        .unwrap();
    let e = client
        .post_event(&Event::new("order.paid", json!({"order_id": 3})))
        .await
        .unwrap();
    assert_eq!(e.cancelled, 0);
    assert!(client.get(CLOSE, "b").await.unwrap().is_some());
}

/// Bad rules and events are refused naming the field, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rules_and_events_are_refused_naming_the_field() {
    let (_s, client) = start().await;
    let before = support::snapshot(&client).await;
    let no_match = CancelRule {
        event: "order.paid".into(),
        match_paths: vec![],
        remember_ms: 1000,
    };
    let bad_path = CancelRule {
        event: "order.paid".into(),
        match_paths: vec!["items[0]".into()],
        remember_ms: 1000,
    };
    for r in [no_match, bad_path] {
        let e = client.admin().set_cancel_on(CLOSE, &[r]).await.unwrap_err();
        assert!(e.to_string().contains("cancel_on"), "{e}");
    }
    for (ev, field) in [
        (Event::new("", json!({})), "name"),
        (Event::new("a\nb", json!({})), "name"),
        (Event::new("x".repeat(129), json!({})), "name"),
        (Event::new("order.paid", json!([1])), "data"),
        (Event::new("order.paid", json!({})).with_id(""), "id"),
    ] {
        let e = client.post_event(&ev).await.unwrap_err();
        assert!(e.to_string().contains(field), "{field}: {e}");
    }
    assert_eq!(support::snapshot(&client).await, before);
}

/// Schedules and events for the same orders racing each other: every order is either
/// scheduled and then cancelled by its event, or answered cancelled_by_event; none is left
/// scheduled, and the counts agree (the event remembers before it sweeps).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_racing_its_order_never_misses_it() {
    let (_s, client) = start().await;
    client
        .admin()
        .set_cancel_on(CLOSE, &paid_rule())
        .await
        .unwrap();
    const N: usize = 300;
    // The first half's events arrive first (remembered); the rest race their orders.
    let mut early_swept = 0;
    for i in 0..N / 2 {
        let e = Event::new("order.paid", json!({"order_id": i}));
        early_swept += client.post_event(&e).await.unwrap().cancelled;
    }
    assert_eq!(early_swept, 0);
    let c = client.clone();
    let producer = tokio::spawn(async move {
        let mut created = 0;
        let mut refused = 0;
        for i in 0..N {
            let o = NewOrder::new(
                format!("o-{i}"),
                When::in_ms(3_600_000),
                json!({"order_id": i}),
            );
            match c
                .schedule_with(CLOSE, o, Mode::Upsert)
                .await
                .unwrap()
                .outcome
            {
                ScheduleOutcome::Created => created += 1,
                ScheduleOutcome::CancelledByEvent => refused += 1,
                other => panic!("{other:?}"),
            }
        }
        (created, refused)
    });
    let c = client.clone();
    let payer = tokio::spawn(async move {
        let mut swept = 0;
        for i in N / 2..N {
            let e = Event::new("order.paid", json!({"order_id": i}));
            swept += c.post_event(&e).await.unwrap().cancelled;
        }
        swept
    });
    let (created, refused) = producer.await.unwrap();
    let swept = payer.await.unwrap();
    assert_eq!(created + refused, N);
    assert!(
        refused >= N / 2,
        "the orders of remembered events: {refused}"
    );
    assert_eq!(
        swept, created as u64,
        "every order written before its event was swept"
    );
    let left: i64 = raw(&client, &["ZCARD", "{dq:order-close:0}:due"]).await;
    assert_eq!(left, 0, "no order outlived its event");
}
