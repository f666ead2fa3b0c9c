//! Housekeeping against real redis-server processes: stream trimming that never loses an
//! unacknowledged entry, idle-consumer cleanup, the scheduled safety sweep.
#![allow(clippy::unwrap_used)]

use crate::support;

use delayq::{
    Backoff, Delivery, Dispatcher, DispatcherOptions, HandlerError, Housekeeper,
    HousekeepingOptions, Mode, NewOrder, When, Worker, WorkerOptions,
};
use serde_json::json;
use std::sync::atomic::Ordering;
use std::time::Duration;
use support::{pending, raw, start, wait_for};
use tokio_util::sync::CancellationToken;

const Q: &str = "order-close";
const STREAM: &str = "{dq:order-close:0}:stream";
const WAIT: Duration = Duration::from_secs(120);

fn opts() -> WorkerOptions {
    WorkerOptions::default()
        .block(Duration::from_millis(100))
        .concurrency(64)
        .backoff(Backoff::Fixed(Duration::from_secs(3600)))
}

async fn xlen(client: &delayq::Client) -> i64 {
    raw(client, &["XLEN", STREAM]).await
}

#[tokio::test]
async fn trimming_bounds_the_stream_and_keeps_what_a_slow_group_has_not_acked() {
    let (_s, client) = start().await;
    let hk = Housekeeper::new(&client, &[Q], HousekeepingOptions::default()).unwrap();
    let fast = Worker::new(&client, Q, "fast", |_d: Delivery| async { Ok(()) }, opts()).unwrap();
    // The slow group fails ten orders (retry in an hour: they stay pending).
    let slow_handler = |d: Delivery| async move {
        let n: usize = d.id[1..].parse().unwrap();
        if (100..110).contains(&n) {
            Err(HandlerError::retry("partner down"))
        } else {
            Ok(())
        }
    };
    let slow = Worker::new(&client, Q, "slow", slow_handler, opts()).unwrap();
    fast.ensure_groups().await.unwrap();
    slow.ensure_groups().await.unwrap();

    let orders: Vec<NewOrder> = (0..50_000)
        .map(|i| NewOrder::new(format!("o{i}"), When::in_ms(0), json!(i)))
        .collect();
    for chunk in orders.chunks(5000) {
        client.schedule_many(Q, chunk, Mode::Upsert).await.unwrap();
    }
    let d = Dispatcher::new(&client, Q, DispatcherOptions::default()).unwrap();
    assert_eq!(d.drain().await.unwrap().moved, 50_000);

    // Only "fast" has read anything: "slow" still needs every entry.
    let cancel = CancellationToken::new();
    let fast_stats = fast.stats();
    let hf = tokio::spawn(fast.run(cancel.clone()));
    wait_for("fast to ack 50,000", WAIT, || {
        let n = fast_stats.acked.load(Ordering::SeqCst);
        async move { n == 50_000 }
    })
    .await;
    assert_eq!(
        hk.trim().await.unwrap().count,
        0,
        "slow has read nothing yet"
    );
    assert_eq!(xlen(&client).await, 50_000);

    let slow_stats = slow.stats();
    let hs = tokio::spawn(slow.run(cancel.clone()));
    wait_for("slow to settle all", WAIT, || {
        let (a, r) = (
            slow_stats.acked.load(Ordering::SeqCst),
            slow_stats.retried.load(Ordering::SeqCst),
        );
        async move { a == 49_990 && r == 10 }
    })
    .await;
    let removed = hk.trim().await.unwrap().count;
    assert!(removed > 0, "something was trimmed");
    assert_eq!(pending(&client, STREAM, "slow").await, 10);
    // Every entry still pending in "slow" is still in the stream.
    let pend: redis::Value = raw(&client, &["XPENDING", STREAM, "slow", "-", "+", "100"]).await;
    let redis::Value::Array(rows) = pend else {
        panic!()
    };
    assert_eq!(rows.len(), 10);
    for row in rows {
        let redis::Value::Array(f) = row else {
            panic!()
        };
        let id: String = redis::from_redis_value(f[0].clone()).unwrap();
        let e: redis::Value = raw(&client, &["XRANGE", STREAM, &id, &id]).await;
        assert!(
            matches!(e, redis::Value::Array(ref v) if v.len() == 1),
            "pending entry {id} was trimmed"
        );
    }
    assert!(xlen(&client).await < 50_000);

    // Once everything is acknowledged, the stream shrinks to (at most) its last entry.
    let ids: Vec<String> = {
        let pend: redis::Value = raw(&client, &["XPENDING", STREAM, "slow", "-", "+", "100"]).await;
        let redis::Value::Array(rows) = pend else {
            panic!()
        };
        rows.into_iter()
            .map(|r| {
                let redis::Value::Array(f) = r else { panic!() };
                redis::from_redis_value(f[0].clone()).unwrap()
            })
            .collect()
    };
    let mut args = vec!["XACK", STREAM, "slow"];
    args.extend(ids.iter().map(String::as_str));
    let _: i64 = raw(&client, &args).await;
    hk.trim().await.unwrap();
    assert!(
        xlen(&client).await <= 1,
        "stream left at {}",
        xlen(&client).await
    );
    cancel.cancel();
    hf.await.unwrap().unwrap();
    hs.await.unwrap().unwrap();
}

/// Script calls so far (`INFO commandstats`).
async fn script_calls(client: &delayq::Client) -> u64 {
    let info: String = raw(client, &["INFO", "commandstats"]).await;
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .filter_map(|r| r.split(',').next())
        .map(|n| n.parse::<u64>().unwrap())
        .sum()
}

#[tokio::test]
async fn the_trim_chore_looks_only_at_shards_dispatched_into_until_they_are_clean() {
    let (_s, client) = start().await;
    client.admin().create_queue("quiet", 4).await.unwrap();
    let hk = Housekeeper::new(&client, &[Q, "quiet"], HousekeepingOptions::default()).unwrap();
    let w = Worker::new(&client, Q, "g", |_d: Delivery| async { Ok(()) }, opts()).unwrap();
    w.ensure_groups().await.unwrap();
    // Nothing dispatched: a pass makes no script call.
    let before = script_calls(&client).await;
    assert_eq!(hk.trim_dispatched().await.unwrap().count, 0);
    assert_eq!(script_calls(&client).await - before, 0, "idle trim pass");

    let orders: Vec<NewOrder> = (0..100)
        .map(|i| NewOrder::new(format!("o{i}"), When::in_ms(0), json!(i)))
        .collect();
    client
        .schedule_many(Q, &orders, Mode::Upsert)
        .await
        .unwrap();
    let d = Dispatcher::new(&client, Q, DispatcherOptions::default()).unwrap();
    assert_eq!(d.drain().await.unwrap().moved, 100);
    // Dispatched, not read yet: nothing to trim, and the shard stays watched.
    assert_eq!(hk.trim_dispatched().await.unwrap().count, 0);
    assert_eq!(xlen(&client).await, 100);

    let cancel = CancellationToken::new();
    let stats = w.stats();
    let h = tokio::spawn(w.run(cancel.clone()));
    wait_for("100 acks", WAIT, || {
        let n = stats.acked.load(Ordering::SeqCst);
        async move { n == 100 }
    })
    .await;
    cancel.cancel();
    h.await.unwrap().unwrap();
    // Read and acknowledged: the next pass trims it.
    assert!(hk.trim_dispatched().await.unwrap().count >= 99);
    assert!(xlen(&client).await <= 1);
    // Clean: no more calls for it.
    let before = script_calls(&client).await;
    assert_eq!(hk.trim_dispatched().await.unwrap().count, 0);
    assert_eq!(
        script_calls(&client).await - before,
        0,
        "trim pass after clean"
    );
}

#[tokio::test]
async fn idle_consumers_go_but_never_one_with_pending_entries() {
    let (_s, client) = start().await;
    let w = Worker::new(
        &client,
        Q,
        "close",
        |_d: Delivery| async { Err(HandlerError::retry("down")) },
        opts().consumer("busy"),
    )
    .unwrap();
    let st = w.stats();
    w.ensure_groups().await.unwrap();
    let cancel = CancellationToken::new();
    let h = tokio::spawn(w.run(cancel.clone()));
    client
        .schedule(Q, "o1", When::in_ms(0), json!(1))
        .await
        .unwrap();
    Dispatcher::new(&client, Q, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
    wait_for("a pending retry", WAIT, || {
        let n = st.retried.load(Ordering::SeqCst);
        async move { n == 1 }
    })
    .await;
    cancel.cancel();
    h.await.unwrap().unwrap();
    let _: i64 = raw(
        &client,
        &["XGROUP", "CREATECONSUMER", STREAM, "close", "idle"],
    )
    .await;

    let hk = Housekeeper::new(
        &client,
        &[Q],
        HousekeepingOptions::default().consumer_max_idle(Duration::ZERO),
    )
    .unwrap();
    assert_eq!(hk.remove_idle_consumers().await.unwrap().count, 1);
    let consumers: Vec<std::collections::HashMap<String, redis::Value>> =
        raw(&client, &["XINFO", "CONSUMERS", STREAM, "close"]).await;
    let names: Vec<String> = consumers
        .iter()
        .map(|c| redis::from_redis_value(c["name"].clone()).unwrap())
        .collect();
    assert_eq!(names, vec!["busy".to_string()]);
    assert_eq!(
        pending(&client, STREAM, "close").await,
        1,
        "its pending entry is intact"
    );
}

#[tokio::test]
async fn the_scheduled_sweep_dispatches_without_any_dispatcher() {
    let (_s, client) = start().await;
    client
        .schedule(Q, "o1", When::in_ms(0), json!(1))
        .await
        .unwrap();
    let hk = Housekeeper::new(&client, &[Q], HousekeepingOptions::default()).unwrap();
    let cancel = CancellationToken::new();
    let h = tokio::spawn(hk.run(cancel.clone()));
    wait_for("the sweep to dispatch", WAIT, || {
        let c = client.clone();
        async move {
            let n: i64 = raw(&c, &["EXISTS", STREAM]).await;
            n == 1 && xlen(&c).await == 1
        }
    })
    .await;
    cancel.cancel();
    h.await.unwrap().unwrap();
}

#[tokio::test]
async fn bad_cron_expressions_are_refused_naming_the_option() {
    let (_s, client) = start().await;
    for (cron, field) in [("*/10 * * * *", "trim_cron"), ("x * * * * *", "trim_cron")] {
        let e = Housekeeper::new(
            &client,
            &[Q],
            HousekeepingOptions::default().trim_cron(cron),
        )
        .unwrap_err();
        assert!(e.to_string().contains(field), "{e}");
        assert_eq!(e.as_invalid().unwrap().code(), "invalid_option");
    }
}
