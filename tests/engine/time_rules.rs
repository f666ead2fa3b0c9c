#![allow(clippy::unwrap_used)]
//! Issue 44's time rules in the library, on a fixed clock so every instant is exact: the
//! dedup window after dispatch (duplicate, `repeat`, expiry, trimming, its cost in memory)
//! and debounce with a maximum wait.

use crate::support;

use delayq::{
    Client, Debounce, Dispatcher, DispatcherOptions, InvalidInput, ManualClock, Mode, NewOrder,
    ScheduleOutcome, When,
};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use support::{raw, snapshot, start_with_clock};

const T0: i64 = 1_800_000_000_000;
const Q: &str = "order-close";
const STREAM: &str = "{dq:order-close:0}:stream";
const DISPATCHED: &str = "{dq:order-close:0}:dispatched";
const DEBOUNCE: &str = "{dq:order-close:0}:debounce";
const HOUR: Duration = Duration::from_secs(3600);

async fn xlen(client: &Client, stream: &str) -> i64 {
    raw(client, &["XLEN", stream]).await
}

/// One dispatch pass on `queue` at the clock's current time.
async fn pass(client: &Client, queue: &str) -> usize {
    Dispatcher::new(client, queue, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap()
        .moved
}

/// The payloads of the stream's entries, in order (the stored value after its `<ms>:`).
async fn stream_payloads(client: &Client) -> Vec<String> {
    let v: redis::Value = raw(client, &["XRANGE", STREAM, "-", "+"]).await;
    let redis::Value::Array(entries) = v else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries {
        let (_, fields): (String, Vec<String>) = redis::from_redis_value(e).unwrap();
        let data = fields
            .iter()
            .position(|f| f == "data")
            .map(|i| fields[i + 1].clone())
            .unwrap();
        out.push(data.split_once(':').unwrap().1.to_owned());
    }
    out
}

#[tokio::test]
async fn a_dispatched_id_is_a_duplicate_within_the_window_until_repeat_or_expiry() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_s, client) = start_with_clock(clock.clone()).await;
    client.admin().set_dedup_window(Q, HOUR).await.unwrap();
    let info = client.admin().queue_info(Q).await.unwrap().unwrap();
    assert_eq!(info.dedup_window_ms, 3_600_000);
    let a = client
        .schedule(Q, "o", When::in_ms(0), json!(1))
        .await
        .unwrap();
    assert_eq!(a.outcome, ScheduleOutcome::Created);
    assert_eq!(pass(&client, Q).await, 1);

    // Ten minutes later the same schedule, upsert or if-absent, is a duplicate: nothing
    // written, nothing dispatched.
    clock.advance(Duration::from_millis(600_000));
    let before = snapshot(&client).await;
    let b = client
        .schedule(Q, "o", When::in_ms(0), json!(2))
        .await
        .unwrap();
    assert_eq!(
        (b.outcome, b.dispatched_at_ms),
        (ScheduleOutcome::Duplicate, Some(T0))
    );
    let c = client
        .schedule_with(
            Q,
            NewOrder::new("o", When::in_ms(0), json!(3)),
            Mode::IfAbsent,
        )
        .await
        .unwrap();
    assert_eq!(c.outcome, ScheduleOutcome::Duplicate);
    assert_eq!(
        snapshot(&client).await,
        before,
        "a duplicate wrote something"
    );
    assert_eq!(pass(&client, Q).await, 0);
    // In a batch, one order by one.
    let many = client
        .schedule_many(
            Q,
            &[
                NewOrder::new("o", When::in_ms(0), json!(4)),
                NewOrder::new("p", When::in_ms(0), json!(5)),
            ],
            Mode::Upsert,
        )
        .await
        .unwrap();
    let outcomes: Vec<_> = many.iter().map(|s| s.outcome).collect();
    assert_eq!(
        outcomes,
        [ScheduleOutcome::Duplicate, ScheduleOutcome::Created]
    );

    // Asked for explicitly, it is scheduled and delivered again.
    let d = client
        .schedule_with(
            Q,
            NewOrder::new("o", When::in_ms(0), json!(6)).repeat(true),
            Mode::Upsert,
        )
        .await
        .unwrap();
    assert_eq!(d.outcome, ScheduleOutcome::Created);
    assert_eq!(pass(&client, Q).await, 2);
    assert_eq!(xlen(&client, STREAM).await, 3);
    // Due together: earliest first, ties in id order ("o" before "p").
    assert_eq!(stream_payloads(&client).await, ["1", "6", "5"]);

    // The window runs from the last dispatch: just inside it still a duplicate, past it
    // scheduled anew.
    clock.advance(Duration::from_millis(3_600_000));
    let e = client
        .schedule(Q, "o", When::in_ms(0), json!(7))
        .await
        .unwrap();
    assert_eq!(
        (e.outcome, e.dispatched_at_ms),
        (ScheduleOutcome::Duplicate, Some(T0 + 600_000))
    );
    clock.advance(Duration::from_millis(1));
    let f = client
        .schedule(Q, "o", When::in_ms(0), json!(8))
        .await
        .unwrap();
    assert_eq!(f.outcome, ScheduleOutcome::Created);

    // A queue without a window is as before: a dispatched id is created anew, and nothing
    // is kept for it.
    client
        .schedule("q", "o", When::in_ms(0), json!(1))
        .await
        .unwrap();
    assert_eq!(pass(&client, "q").await, 1);
    let g = client
        .schedule("q", "o", When::in_ms(0), json!(2))
        .await
        .unwrap();
    assert_eq!(g.outcome, ScheduleOutcome::Created);
    let kept: i64 = raw(&client, &["EXISTS", "{dq:q:0}:dispatched"]).await;
    assert_eq!(kept, 0);

    // Turning the window off drops what was kept, and the id is created anew.
    pass(&client, Q).await;
    client
        .admin()
        .set_dedup_window(Q, Duration::ZERO)
        .await
        .unwrap();
    let kept: i64 = raw(&client, &["EXISTS", DISPATCHED]).await;
    assert_eq!(kept, 0);
    let h = client
        .schedule(Q, "o", When::in_ms(0), json!(9))
        .await
        .unwrap();
    assert_eq!(h.outcome, ScheduleOutcome::Created);
    assert_eq!(
        client
            .admin()
            .queue_info(Q)
            .await
            .unwrap()
            .unwrap()
            .dedup_window_ms,
        0
    );
}

#[tokio::test]
async fn the_dispatched_ids_are_trimmed_past_the_window_and_expire_with_it() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_s, client) = start_with_clock(clock.clone()).await;
    client
        .admin()
        .set_dedup_window(Q, Duration::from_secs(10))
        .await
        .unwrap();
    let orders: Vec<NewOrder> = (0..50)
        .map(|i| NewOrder::new(format!("o{i}"), When::in_ms(0), json!(i)))
        .collect();
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
    assert_eq!(pass(&client, Q).await, 50);
    let kept: i64 = raw(&client, &["ZCARD", DISPATCHED]).await;
    assert_eq!(kept, 50);
    let ttl: i64 = raw(&client, &["PTTL", DISPATCHED]).await;
    assert!(ttl > 0 && ttl <= 10_000, "expiry {ttl}");
    // Past the window, the next dispatch call trims them (a batch's worth per call).
    clock.advance(Duration::from_millis(10_001));
    client
        .schedule(Q, "late", When::in_ms(0), json!(0))
        .await
        .unwrap();
    assert_eq!(pass(&client, Q).await, 1);
    let left: Vec<String> = raw(&client, &["ZRANGE", DISPATCHED, "0", "-1"]).await;
    assert_eq!(left, ["late"]);
    // A batch limit of 20 trims at most 20 per call (a fresh dispatcher calls the shard).
    let small = || Dispatcher::new(&client, Q, DispatcherOptions::default().batch(20)).unwrap();
    clock.advance(Duration::from_millis(1));
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
    small().drain().await.unwrap();
    clock.advance(Duration::from_millis(10_001));
    small().pass().await.unwrap();
    let kept: i64 = raw(&client, &["ZCARD", DISPATCHED]).await;
    assert_eq!(kept, 51 - 20);
    small().pass().await.unwrap();
    small().pass().await.unwrap();
    let kept: i64 = raw(&client, &["ZCARD", DISPATCHED]).await;
    assert_eq!(kept, 0);
}

/// The memory a dispatched order costs while the window keeps it: 10,000 orders with ids
/// of 12 bytes, measured with `INFO memory` (used_memory with the ids kept, minus after
/// they are dropped). The bound is the one docs/time-rules.md states.
#[tokio::test]
async fn ten_thousand_dispatched_orders_cost_the_stated_bytes_each() {
    const N: usize = 10_000;
    const BOUND: i64 = 160;
    let clock = Arc::new(ManualClock::new(T0));
    let (_s, client) = start_with_clock(clock.clone()).await;
    client.admin().set_dedup_window(Q, HOUR).await.unwrap();
    let orders: Vec<NewOrder> = (0..N)
        .map(|i| NewOrder::new(format!("order-{i:06}"), When::in_ms(0), json!(null)))
        .collect();
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
    assert_eq!(pass(&client, Q).await, N);
    let used = |info: String| -> i64 {
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let with: i64 = used(raw(&client, &["INFO", "memory"]).await);
    let kept: i64 = raw(&client, &["ZCARD", DISPATCHED]).await;
    assert_eq!(kept, N as i64);
    // Freed by the DEL itself, not in the background (Valkey 8+ defaults to lazy freeing).
    let _: () = raw(&client, &["CONFIG", "SET", "lazyfree-lazy-user-del", "no"]).await;
    let _: i64 = raw(&client, &["DEL", DISPATCHED]).await;
    let without: i64 = used(raw(&client, &["INFO", "memory"]).await);
    let per_order = (with - without) / N as i64;
    println!(
        "dedup window: {per_order} bytes per dispatched order (used_memory {with} -> {without})"
    );
    assert!(
        per_order > 0 && per_order <= BOUND,
        "{per_order} bytes per dispatched order, stated at most {BOUND}"
    );
}

#[tokio::test]
async fn debounce_moves_the_order_but_never_past_its_max_wait_and_starts_afresh_after() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_s, client) = start_with_clock(clock.clone()).await;
    let deb = Debounce::new(Duration::from_millis(500), Duration::from_secs(2)).unwrap();
    // A call every 200 ms for 5 s (25 calls), a dispatch pass after each.
    let mut dispatched_at = Vec::new();
    for i in 0..25 {
        clock.set(T0 + 200 * i);
        let s = client
            .schedule_with(Q, NewOrder::debounced("cart", deb, json!(i)), Mode::Upsert)
            .await
            .unwrap();
        if pass(&client, Q).await > 0 {
            dispatched_at.push((200 * i, s.due_at_ms - T0));
        }
    }
    // The first debounce (calls at 0..2000) is capped at first + 2 s; the calls after it
    // start a new one (first at 2200, cap 4200); the last (first at 4400) is due 500 ms
    // after the last call, at 5300.
    assert_eq!(dispatched_at, [(2000, 2000), (4200, 4200)]);
    let got = client.get(Q, "cart").await.unwrap().unwrap();
    assert_eq!(got.due_at_ms, T0 + 5300);
    let st = got.debounce.unwrap();
    assert_eq!((st.first_call_ms, st.max_due_ms), (T0 + 4400, T0 + 6400));
    clock.set(T0 + 5299);
    assert_eq!(pass(&client, Q).await, 0);
    clock.set(T0 + 5300);
    assert_eq!(pass(&client, Q).await, 1);
    // Each dispatch carried the last call's payload before it.
    assert_eq!(stream_payloads(&client).await, ["10", "21", "24"]);
    // Dispatched: its record is gone, the next call starts afresh.
    let records: i64 = raw(&client, &["HLEN", DEBOUNCE]).await;
    assert_eq!(records, 0);

    // A cancel drops the record too; a plain upsert keeps it while the order waits.
    client
        .schedule_with(Q, NewOrder::debounced("c2", deb, json!(1)), Mode::Upsert)
        .await
        .unwrap();
    client
        .schedule_with(Q, NewOrder::debounced("c3", deb, json!(1)), Mode::Upsert)
        .await
        .unwrap();
    client.cancel(Q, "c2").await.unwrap();
    client
        .schedule(Q, "c3", When::in_ms(60_000), json!(2))
        .await
        .unwrap();
    let records: Vec<String> = raw(&client, &["HKEYS", DEBOUNCE]).await;
    assert_eq!(records, ["c3"]);
    let got = client.get(Q, "c3").await.unwrap().unwrap();
    assert_eq!(got.due_at_ms, T0 + 5300 + 60_000);
    assert_eq!(got.debounce.unwrap().max_due_ms, T0 + 5300 + 2000);
}

#[tokio::test]
async fn bad_time_rules_are_refused_naming_the_field_and_write_nothing() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_s, client) = start_with_clock(clock).await;
    let before = snapshot(&client).await;
    let name = |e: delayq::Error| match e {
        delayq::Error::Invalid(InvalidInput::Option { name, .. }) => name,
        other => panic!("{other}"),
    };
    let ms = Duration::from_millis;
    let deb = Debounce::new(ms(500), ms(2000)).unwrap();
    let e = client
        .schedule_with(Q, NewOrder::debounced("o", deb, json!(1)), Mode::IfAbsent)
        .await
        .unwrap_err();
    assert_eq!(name(e), "debounce");
    let mut o = NewOrder::debounced("o", deb, json!(1));
    o.debounce = Some(Debounce {
        delay: ms(3000),
        max_wait: ms(2000),
    });
    let e = client.schedule_with(Q, o, Mode::Upsert).await.unwrap_err();
    assert_eq!(name(e), "debounce.max_wait");
    let mut o = NewOrder::new("o", When::in_ms(5), json!(1));
    o.debounce = Some(deb);
    let e = client.schedule_with(Q, o, Mode::Upsert).await.unwrap_err();
    assert_eq!(name(e), "debounce");
    let e = client
        .admin()
        .set_dedup_window(Q, Duration::from_secs(3654 * 86_400))
        .await
        .unwrap_err();
    assert_eq!(name(e), "dedup_window");
    assert_eq!(snapshot(&client).await, before);
}
