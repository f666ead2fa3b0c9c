//! Pull consumption ([`Puller`]): receive with a lease, ack/nack/extend by receipt, through
//! the worker's own scripts (reclaim of a lease that ran out, retries, `max_attempts`, dead
//! letters); stale and forged receipts are refused.
#![allow(clippy::unwrap_used)]

use crate::support;

use delayq::{
    Client, Dispatcher, DispatcherOptions, Extended, Nack, PullDelivery, Puller, Settled, When,
    WorkerOptions,
};
use serde_json::json;
use std::time::Duration;
use support::{pending, poll, raw, snapshot, start};

const Q: &str = "order-close";
const G: &str = "close";
const STREAM: &str = "{dq:order-close:0}:stream";
const TIMERS: &str = "{dq:order-close:0}:timers:close";
/// How long a condition may take to come true before a test fails.
const WAIT: Duration = Duration::from_secs(10);
const LONG: Duration = Duration::from_secs(60);

fn puller(client: &Client, consumer: &str, opts: WorkerOptions) -> Puller {
    Puller::new(client, Q, G, opts.consumer(consumer)).unwrap()
}

/// Schedules `n` orders due now and moves them into the stream.
async fn due_now(client: &Client, n: usize) {
    for i in 0..n {
        client
            .schedule(
                Q,
                &format!("o-{i}"),
                When::in_ms(0),
                json!({"n": i, "s": "é ✓"}),
            )
            .await
            .unwrap();
    }
    Dispatcher::new(client, Q, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
}

/// Receives until one delivery comes (a retry or a taken-over lease comes due when its
/// timer does).
async fn receive_one(p: &Puller, lease: Duration) -> PullDelivery {
    poll(WAIT, || async {
        p.receive(1, lease).await.unwrap().into_iter().next()
    })
    .await
    .expect("a delivery")
}

async fn timers(client: &Client) -> i64 {
    raw(client, &["ZCARD", TIMERS]).await
}

#[tokio::test]
async fn receive_then_ack_empties_the_pending_list_and_nothing_is_acked_twice() {
    let (_s, client) = start().await;
    let p = puller(&client, "a", WorkerOptions::default());
    p.ensure_groups().await.unwrap();
    due_now(&client, 5).await;
    let got = p.receive(10, LONG).await.unwrap();
    assert_eq!(got.len(), 5);
    let mut ids: Vec<&str> = got.iter().map(|d| d.delivery.id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["o-0", "o-1", "o-2", "o-3", "o-4"]);
    for d in &got {
        let n: u64 = d.delivery.id[2..].parse().unwrap();
        assert_eq!(
            d.delivery.payload_text,
            json!({"n": n, "s": "é ✓"}).to_string(),
            "the payload byte for byte"
        );
        assert_eq!(d.delivery.attempt, 1);
        assert!(d.lease_until_ms > client.now_ms());
    }
    assert_eq!(pending(&client, STREAM, G).await, 5);
    assert_eq!(timers(&client).await, 5, "each delivery is leased");
    assert!(
        p.receive(10, LONG).await.unwrap().is_empty(),
        "nothing else is due"
    );

    let receipts: Vec<&str> = got.iter().map(|d| d.receipt.as_str()).collect();
    let settled = p.ack(&receipts).await.unwrap();
    assert_eq!(settled, vec![Settled::Done; 5]);
    assert_eq!(pending(&client, STREAM, G).await, 0);
    assert_eq!(timers(&client).await, 0);
    assert_eq!(
        p.stats().acked.load(std::sync::atomic::Ordering::Relaxed),
        5
    );
    // Acknowledged already: refused, not acknowledged again.
    let again = p.ack(&receipts[..1]).await.unwrap();
    assert_eq!(again, vec![Settled::LeaseLost]);
    assert_eq!(
        p.stats().acked.load(std::sync::atomic::Ordering::Relaxed),
        5
    );
}

#[tokio::test]
async fn a_lease_that_runs_out_goes_to_another_consumer_and_the_first_receipt_is_lease_lost() {
    let (_s, client) = start().await;
    let a = puller(&client, "a", WorkerOptions::default());
    let b = puller(&client, "b", WorkerOptions::default());
    a.ensure_groups().await.unwrap();
    due_now(&client, 1).await;
    let first = a.receive(1, Duration::from_millis(200)).await.unwrap();
    assert_eq!(first.len(), 1);
    let first = &first[0];
    // B gets it once A's lease has run out: attempt 2.
    let second = receive_one(&b, LONG).await;
    assert_eq!(second.delivery.id, "o-0");
    assert_eq!(second.delivery.attempt, 2);
    let owner: redis::Value = raw(&client, &["XPENDING", STREAM, G, "-", "+", "10"]).await;
    assert!(format!("{owner:?}").contains("\"b\""), "{owner:?}");

    // A's receipt no longer settles anything.
    assert_eq!(
        a.ack(&[&first.receipt]).await.unwrap(),
        vec![Settled::LeaseLost]
    );
    assert_eq!(
        a.stats()
            .late_acks
            .load(std::sync::atomic::Ordering::Relaxed),
        1,
        "the late ack is counted"
    );
    let dead = Nack::Dead {
        error: "late".into(),
    };
    assert_eq!(
        a.nack(&first.receipt, dead).await.unwrap(),
        Settled::LeaseLost
    );
    assert_eq!(
        a.extend(&[&first.receipt], LONG).await.unwrap(),
        vec![Extended::LeaseLost]
    );
    assert_eq!(pending(&client, STREAM, G).await, 1, "B still holds it");
    assert!(
        client
            .admin()
            .dead_list(Q, Some(G), 10)
            .await
            .unwrap()
            .is_empty()
    );

    assert_eq!(
        b.ack(&[&second.receipt]).await.unwrap(),
        vec![Settled::Done]
    );
    assert_eq!(pending(&client, STREAM, G).await, 0);
    let h = client.admin().history(Q, "o-0").await.unwrap();
    assert!(h.is_some(), "the history knows the order");
}

#[tokio::test]
async fn an_extended_lease_gets_a_new_receipt_and_the_old_one_is_stale() {
    let (_s, client) = start().await;
    let a = puller(&client, "a", WorkerOptions::default());
    a.ensure_groups().await.unwrap();
    due_now(&client, 1).await;
    let d = a
        .receive(1, Duration::from_secs(5))
        .await
        .unwrap()
        .remove(0);
    let ext = a.extend(&[&d.receipt], LONG).await.unwrap();
    let Extended::Receipt(new) = &ext[0] else {
        panic!("not extended: {ext:?}");
    };
    let score: f64 = raw(&client, &["ZSCORE", TIMERS, &d.delivery.entry_id]).await;
    assert!(score > d.lease_until_ms as f64, "the timer moved");
    assert_eq!(
        a.ack(&[&d.receipt]).await.unwrap(),
        vec![Settled::LeaseLost]
    );
    assert_eq!(pending(&client, STREAM, G).await, 1);
    // The same receipt twice extends once; both copies get the one new receipt.
    let twice = a.extend(&[new, new], LONG).await.unwrap();
    assert!(matches!(&twice[0], Extended::Receipt(_)), "{twice:?}");
    assert_eq!(twice[0], twice[1]);
    let Extended::Receipt(newest) = &twice[0] else {
        unreachable!()
    };
    // The stale receipt beside the live one, and the live one twice, in one call: each
    // answers for itself and the entry is acknowledged once.
    let settled = a.ack(&[new, newest, newest]).await.unwrap();
    assert_eq!(
        settled,
        vec![Settled::LeaseLost, Settled::Done, Settled::Done]
    );
    assert_eq!(pending(&client, STREAM, G).await, 0);
    assert_eq!(
        a.stats().acked.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test]
async fn nack_dead_lands_in_the_dead_letters_with_the_error_text() {
    let (_s, client) = start().await;
    let a = puller(&client, "a", WorkerOptions::default());
    a.ensure_groups().await.unwrap();
    due_now(&client, 1).await;
    let d = a.receive(1, LONG).await.unwrap().remove(0);
    let how = Nack::Dead {
        error: "card declined: insufficient funds".into(),
    };
    assert_eq!(a.nack(&d.receipt, how).await.unwrap(), Settled::Done);
    let dead = client.admin().dead_list(Q, Some(G), 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id, "o-0");
    assert_eq!(dead[0].last_error, "card declined: insufficient funds");
    assert_eq!(dead[0].attempts, 1);
    assert_eq!(pending(&client, STREAM, G).await, 0);
    assert_eq!(timers(&client).await, 0);
}

#[tokio::test]
async fn nacks_up_to_max_attempts_dead_letter_the_order() {
    let (_s, client) = start().await;
    let a = puller(&client, "a", WorkerOptions::default().max_attempts(3));
    a.ensure_groups().await.unwrap();
    due_now(&client, 1).await;
    for attempt in 1..=3u32 {
        let d = receive_one(&a, LONG).await;
        assert_eq!(d.delivery.id, "o-0");
        assert_eq!(d.delivery.attempt, attempt);
        let how = Nack::Retry {
            after: Some(Duration::ZERO),
            error: format!("boom {attempt}"),
        };
        assert_eq!(a.nack(&d.receipt, how).await.unwrap(), Settled::Done);
        let dead = client.admin().dead_list(Q, Some(G), 10).await.unwrap();
        assert_eq!(
            dead.len(),
            usize::from(attempt == 3),
            "after attempt {attempt}"
        );
    }
    let dead = client.admin().dead_list(Q, Some(G), 10).await.unwrap();
    assert_eq!(dead[0].last_error, "boom 3");
    assert_eq!(dead[0].attempts, 3);
    assert_eq!(pending(&client, STREAM, G).await, 0);
    assert!(a.receive(1, LONG).await.unwrap().is_empty());
}

#[tokio::test]
async fn forged_altered_and_foreign_receipts_are_refused_and_change_nothing() {
    let (_s, client) = start().await;
    let a = puller(&client, "a", WorkerOptions::default());
    // Same consumer name, another key: a puller that did not issue the receipt.
    let other = puller(&client, "a", WorkerOptions::default());
    a.ensure_groups().await.unwrap();
    due_now(&client, 1).await;
    let d = a.receive(1, LONG).await.unwrap().remove(0);
    let (body, mac) = d.receipt.rsplit_once('.').unwrap();
    let lease = d.lease_until_ms.to_string();
    let altered = format!(
        "{}.{mac}",
        body.replacen(&lease, &(d.lease_until_ms + 1).to_string(), 1)
    );
    let flipped = format!(
        "{body}.{}{}",
        if mac.starts_with('0') { '1' } else { '0' },
        &mac[1..]
    );
    let before = snapshot(&client).await;
    for forged in [
        altered.as_str(),
        flipped.as_str(),
        "",
        "0.1-0.1.1.00",
        "junk",
    ] {
        let e = a.ack(&[forged]).await.unwrap_err();
        assert_eq!(
            e.as_invalid().unwrap().code(),
            "invalid_receipt",
            "{forged:?}"
        );
        let how = Nack::Dead { error: "x".into() };
        assert!(a.nack(forged, how).await.is_err(), "{forged:?}");
        assert!(a.extend(&[forged], LONG).await.is_err(), "{forged:?}");
    }
    // One bad receipt refuses the whole call.
    assert!(a.ack(&[&d.receipt, "junk"]).await.is_err());
    let e = other.ack(&[&d.receipt]).await.unwrap_err();
    assert_eq!(e.as_invalid().unwrap().code(), "invalid_receipt");
    // Bad arguments name the field.
    let e = a.receive(0, LONG).await.unwrap_err();
    assert!(e.to_string().contains("max"), "{e}");
    let e = a.receive(1, Duration::ZERO).await.unwrap_err();
    assert!(e.to_string().contains("lease"), "{e}");
    assert_eq!(snapshot(&client).await, before, "nothing changed");
    assert_eq!(a.ack(&[&d.receipt]).await.unwrap(), vec![Settled::Done]);
}

#[tokio::test]
async fn an_expired_order_is_dead_lettered_on_hand_off_not_received() {
    let (_s, client) = start().await;
    let a = puller(&client, "a", WorkerOptions::default());
    a.ensure_groups().await.unwrap();
    let past = client.now_ms() - 5_000;
    let orders = [
        delayq::NewOrder::new("stale", When::at_ms(past), json!({"n": 1}))
            .with_expires_after(Duration::from_millis(1000)),
        delayq::NewOrder::new("fresh", When::at_ms(past), json!({"n": 2})),
    ];
    client
        .schedule_many(Q, &orders, delayq::Mode::Upsert)
        .await
        .unwrap();
    Dispatcher::new(&client, Q, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
    let got = a.receive(10, LONG).await.unwrap();
    let ids: Vec<&str> = got.iter().map(|d| d.delivery.id.as_str()).collect();
    assert_eq!(ids, ["fresh"]);
    let dead = client.admin().dead_list(Q, Some(G), 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id, "stale");
    assert_eq!(dead[0].reason.as_deref(), Some("expired"));
    assert_eq!(
        a.stats().expired.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(
        pending(&client, STREAM, G).await,
        1,
        "only the fresh one is held"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_receive_gets_an_order_another_process_dispatches_and_ends_on_cancel() {
    let (server, producer) = start().await;
    // The consumer's process runs no dispatcher: the order is dispatched by another client
    // (another process's dispatcher), and the waiting receive hears of it.
    let consumer = Client::connect(&server.url()).await.unwrap();
    let p = puller(&consumer, "c1", WorkerOptions::default());
    p.ensure_groups().await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let dispatch = tokio::spawn(
        Dispatcher::new(&producer, Q, DispatcherOptions::default())
            .unwrap()
            .run(stop.clone()),
    );
    let cancel = tokio_util::sync::CancellationToken::new();
    let waiting = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let got = p
                .receive_wait(10, LONG, Duration::from_secs(20), &cancel)
                .await
                .unwrap();
            (p, got)
        })
    };
    producer
        .schedule(Q, "later", When::in_ms(300), json!({"n": 1}))
        .await
        .unwrap();
    let (p, got) = waiting.await.unwrap();
    assert_eq!(
        got.iter()
            .map(|d| d.delivery.id.as_str())
            .collect::<Vec<_>>(),
        ["later"]
    );
    // Nothing more is due: a 20 s wait ends at once when cancelled (far within the test's
    // own deadline).
    let again = tokio::spawn({
        let cancel = cancel.clone();
        async move {
            p.receive_wait(10, LONG, Duration::from_secs(20), &cancel)
                .await
                .unwrap()
        }
    });
    cancel.cancel();
    let got = tokio::time::timeout(WAIT, again).await.unwrap().unwrap();
    assert!(got.is_empty());
    // Over the limit: refused naming the option.
    let p = puller(&consumer, "c2", WorkerOptions::default());
    let e = p
        .receive_wait(1, LONG, Duration::from_millis(20_001), &cancel)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("wait"), "{e}");
    stop.cancel();
    dispatch.await.unwrap();
}

/// Runs `extend.lua` on `key`: the ids it moved to `until`.
async fn extend_raw(
    client: &Client,
    key: &str,
    until: i64,
    pairs: &[(String, i64)],
) -> Vec<String> {
    let script = redis::Script::new(&delayq::engine::scripts::EXTEND_LUA);
    let mut inv = script.prepare_invoke();
    inv.key(key).arg(until);
    for (id, lease) in pairs {
        inv.arg(id).arg(*lease);
    }
    inv.invoke_async(&mut client.connection()).await.unwrap()
}

/// `extend.lua` (the compare-and-set behind ack, nack and extend) settles its pairs in order,
/// as one ZSCORE and ZADD per pair would: a stale or missing one is left, a second pair of
/// an entry compares with the end the first set, across the 1,000-pair chunks; and it costs
/// one ZMSCORE and one ZADD per chunk, not one ZSCORE and ZADD per entry.
#[tokio::test]
async fn extend_compares_each_pair_in_order_with_two_calls_per_chunk() {
    let (_server, client) = start().await;
    let key = "{t}:timers";
    let ids: Vec<String> = (0..2500).map(|i| format!("e{i}")).collect();
    let mut add = vec!["ZADD", key];
    let scores: Vec<String> = (0..2500).map(|i| (1000 + i).to_string()).collect();
    for (id, sc) in ids.iter().zip(&scores) {
        add.push(sc);
        add.push(id);
    }
    let _: i64 = raw(&client, &add).await;
    let until = 9000;
    let p = |id: &str, lease: i64| (id.to_owned(), lease);
    let mut pairs = vec![
        p("e0", 1000),  // held: moved
        p("e1", 999),   // stale: left
        p("gone", 7),   // no timer: left, not added
        p("e2", 1002),  // held: moved ...
        p("e2", 1002),  // ... so this older copy no longer holds it
        p("e3", 1003),  // held: moved ...
        p("e3", until), // ... and this one holds the new end
    ];
    pairs.extend((4..2500).map(|i| p(&ids[i], 1000 + i as i64)));
    pairs.push(p("e0", 1000)); // past the first chunk: e0 holds `until` now
    pairs.push(p("e1", 1001)); // past the first chunk: held, moved
    let _: () = raw(&client, &["CONFIG", "RESETSTAT"]).await;
    let moved = extend_raw(&client, key, until, &pairs).await;
    // 2,509 pairs: three chunks, each one ZMSCORE and one ZADD.
    let stats: String = raw(&client, &["INFO", "commandstats"]).await;
    let calls = |cmd: &str| -> u64 {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
            .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
    };
    assert_eq!(calls("zscore"), 0, "{stats}");
    assert_eq!(calls("zmscore"), 3, "{stats}");
    assert_eq!(calls("zadd"), 3, "{stats}");
    let mut want = vec!["e0", "e2", "e3", "e3"];
    want.extend(ids[4..].iter().map(String::as_str));
    want.push("e1");
    assert_eq!(moved, want);
    for id in ["e0", "e1", "e2", "e3", "e4", "e1000", "e2499"] {
        let sc: i64 = raw(&client, &["ZSCORE", key, id]).await;
        assert_eq!(sc, until, "{id}");
    }
    let gone: Option<String> = raw(&client, &["ZSCORE", key, "gone"]).await;
    assert_eq!(gone, None);
}

/// Subscribers of `Q`'s wake channels, fewest first (`PUBSUB SHARDNUMSUB`; `NUMSUB` on
/// Redis 6.2, which has no sharded channels: its listeners `SUBSCRIBE`).
async fn least_subscribed(client: &Client) -> i64 {
    let channels: Vec<String> = (0..client.options().shards)
        .map(|s| format!("{{dq:{Q}:{s}}}:wake"))
        .collect();
    let mut counts = Vec::new();
    for sub in ["SHARDNUMSUB", "NUMSUB"] {
        let flat: redis::RedisResult<Vec<redis::Value>> = redis::cmd("PUBSUB")
            .arg(sub)
            .arg(&channels)
            .query_async(&mut client.connection())
            .await;
        let Ok(flat) = flat else { continue };
        let n: Vec<i64> = flat
            .chunks(2)
            .map(|c| redis::from_redis_value::<i64>(c[1].clone()).unwrap())
            .collect();
        if counts.is_empty() {
            counts = n;
        } else {
            counts.iter_mut().zip(n).for_each(|(a, b)| *a += b);
        }
    }
    counts.into_iter().min().unwrap_or(0)
}

/// Another process of the group: a dispatcher that looks only when woken (its listener
/// holds the queue's wake channels, subscribed once the server lists them) and a pull
/// consumer `b` whose fallback look is longer than any wait, so only a signal can bring a
/// waiting receive an entry. Returns the client, the puller, and the dispatcher's stop.
async fn other_process(
    server: &delayq::LocalRedis,
    client: &Client,
) -> (
    Client,
    Puller,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let other = Client::connect(&server.url()).await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let hour = Duration::from_secs(3600);
    let dispatch = tokio::spawn(
        Dispatcher::new(
            &other,
            Q,
            DispatcherOptions::default().max_idle(hour).idle_poll(hour),
        )
        .unwrap()
        .run(stop.clone()),
    );
    poll(WAIT, || async {
        (least_subscribed(client).await >= 1).then_some(())
    })
    .await
    .expect("B listens");
    let b = puller(&other, "b", WorkerOptions::default()).with_fallback_poll(Duration::MAX);
    (other, b, stop, dispatch)
}

/// Starts `b` waiting for one entry (its longest wait), once it has read and found none.
async fn waiting(b: Puller) -> tokio::task::JoinHandle<Vec<PullDelivery>> {
    let stats = b.stats();
    let task = tokio::spawn(async move {
        let cancel = tokio_util::sync::CancellationToken::new();
        b.receive_wait(1, LONG, delayq::engine::worker::MAX_WAIT, &cancel)
            .await
            .unwrap()
    });
    poll(WAIT, || async {
        (stats.waits.load(std::sync::atomic::Ordering::Relaxed) > 0).then_some(())
    })
    .await
    .expect("B waits");
    task
}

/// What a waiting receive got, when a signal ended its wait long before its own end (20 s,
/// when it reads once more and would find the entry without any signal).
async fn got_by_signal(task: tokio::task::JoinHandle<Vec<PullDelivery>>) -> Vec<(String, u32)> {
    tokio::time::timeout(delayq::engine::worker::MAX_WAIT / 2, task)
        .await
        .expect("a signal wakes B before its wait ends")
        .unwrap()
        .iter()
        .map(|d| (d.delivery.id.clone(), d.delivery.attempt))
        .collect()
}

/// Process A (consumer `a` on `client`) holds order `o-0`, moved by another process's
/// dispatcher when it heard of it (so that process's listener has taken its
/// subscriptions' confirmations by then).
async fn holds_one(client: &Client) -> (Puller, PullDelivery) {
    let a = puller(client, "a", WorkerOptions::default());
    a.ensure_groups().await.unwrap();
    client
        .schedule(Q, "o-0", When::in_ms(0), json!({"n": 0}))
        .await
        .unwrap();
    let d = receive_one(&a, LONG).await;
    (a, d)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_back_in_one_process_wakes_a_receive_waiting_in_another() {
    let (server, client) = start().await;
    let (_other, b, stop, dispatch) = other_process(&server, &client).await;
    let (a, d) = holds_one(&client).await;
    // B reads (finds nothing: A's lease ends in a minute) and waits.
    let task = waiting(b).await;
    let how = Nack::Retry {
        after: Some(Duration::from_millis(200)),
        error: "partner API busy".into(),
    };
    assert_eq!(a.nack(&d.receipt, how).await.unwrap(), Settled::Done);
    assert_eq!(
        got_by_signal(task).await,
        [("o-0".to_owned(), 2)],
        "B's waiting receive gets the hand-back when it comes due"
    );
    stop.cancel();
    dispatch.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_wakes_a_receive_waiting_in_another_process() {
    let (server, client) = start().await;
    let (_other, b, stop, dispatch) = other_process(&server, &client).await;
    let (a, d) = holds_one(&client).await;
    let how = Nack::Dead {
        error: "card declined".into(),
    };
    assert_eq!(a.nack(&d.receipt, how).await.unwrap(), Settled::Done);
    let task = waiting(b).await;
    let n = client
        .admin()
        .dead_replay(Q, Some(G), &delayq::Selection::All)
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(
        got_by_signal(task).await,
        [("o-0".to_owned(), 1)],
        "B's waiting receive gets the replayed order at once"
    );
    stop.cancel();
    dispatch.await.unwrap();
}
