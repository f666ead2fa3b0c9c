//! The orders domain against real databases (SQLite always, PostgreSQL too): migrations, the
//! conditional close of the `order-close` handler, database outages, and reconciliation
//! after Redis loses its data.
#![allow(clippy::unwrap_used)]

use crate::support;

use delayq::orders::db::Db;
use delayq::{
    Backoff, CloseOutcome, Dispatcher, DispatcherOptions, OrderClose, OrderStatus, Orders,
    PayOutcome, ReconcileOptions, Reconciler, When, Worker, WorkerOptions,
};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use support::db::TestDb;
use support::{raw, wait_for};
use tokio_util::sync::CancellationToken;

const Q: &str = "order-close";

#[tokio::test]
async fn migrations_apply_on_an_empty_database_are_idempotent_and_refuse_edits() {
    for t in TestDb::all().await {
        let db = Db::connect(&t.url).await.unwrap();
        db.migrate().await.unwrap();
        db.migrate().await.unwrap();
        let orders = Orders::new(db.clone());
        assert!(
            orders.create("o-1", 1999, 1, 2).await.unwrap(),
            "{}",
            t.backend
        );
        assert_eq!(orders.counts().await.unwrap().pending, 1, "{}", t.backend);
        // The status check is in the schema, not only in the code.
        let bad = support::db::exec(&db, "UPDATE orders SET status = 'lost'").await;
        assert!(
            bad.is_err(),
            "{}: the CHECK constraint accepted 'lost'",
            t.backend
        );

        // An applied migration that was edited afterwards is refused.
        support::db::exec(
            &db,
            "UPDATE _sqlx_migrations SET checksum = checksum || checksum",
        )
        .await
        .unwrap();
        match db.migrate().await {
            Err(delayq::orders::error::Error::Migrate(e)) => {
                assert!(e.to_string().contains("modified"), "{}: {e}", t.backend)
            }
            other => panic!(
                "{}: a modified migration was accepted: {other:?}",
                t.backend
            ),
        }
        db.close().await;
    }
}

#[tokio::test]
async fn close_is_conditional_under_concurrent_duplicate_deliveries() {
    let (_redis, client) = support::start().await;
    for t in TestDb::all().await {
        let orders = Orders::new(t.migrated().await);
        let handler = Arc::new(OrderClose::new(orders.clone(), &client));
        let now = client.now_ms();
        let b = t.backend;
        orders
            .create("expired", 100, now - 60_000, now - 1)
            .await
            .unwrap();
        orders
            .create("paid", 100, now - 60_000, now + 60_000)
            .await
            .unwrap();
        assert_eq!(orders.pay("paid", now).await.unwrap(), PayOutcome::Paid);
        orders
            .create("extended", 100, now - 60_000, now + 3_600_000)
            .await
            .unwrap();

        // Sixteen deliveries of the same close event at once: exactly one closes it.
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let h = handler.clone();
            tasks.push(tokio::spawn(async move {
                h.close_order(Q, "expired", &json!({})).await.unwrap()
            }));
        }
        let mut outcomes = Vec::new();
        for t in tasks {
            outcomes.push(t.await.unwrap());
        }
        let closed = outcomes
            .iter()
            .filter(|o| **o == CloseOutcome::Closed)
            .count();
        let already = outcomes
            .iter()
            .filter(|o| **o == CloseOutcome::AlreadyClosed)
            .count();
        assert_eq!((closed, already), (1, 15), "{b}: {outcomes:?}");
        let row = orders.get("expired").await.unwrap().unwrap();
        assert_eq!(row.status, OrderStatus::Closed, "{b}");
        assert_eq!(row.close_reason.as_deref(), Some("expired"), "{b}");
        let closed_at = row.closed_at;

        // A late redelivery changes nothing; a payment after the close is refused.
        assert_eq!(
            handler.close_order(Q, "expired", &json!({})).await.unwrap(),
            CloseOutcome::AlreadyClosed
        );
        assert_eq!(
            orders.get("expired").await.unwrap().unwrap().closed_at,
            closed_at
        );
        assert_eq!(
            orders.pay("expired", client.now_ms()).await.unwrap(),
            PayOutcome::Expired
        );

        // A paid order stays paid, even when its close event arrives after the expiry.
        assert_eq!(
            handler.close_order(Q, "paid", &json!({})).await.unwrap(),
            CloseOutcome::AlreadyPaid
        );
        assert_eq!(
            orders.get("paid").await.unwrap().unwrap().status,
            OrderStatus::Paid
        );

        // An extended expiry: not closed, and the close event follows the new expiry.
        client.cancel(Q, "extended").await.unwrap();
        // The rescheduled event keeps its payload byte for byte (a big integer included).
        let text = r#"{"n":1,"big":123456789012345678901234567890}"#;
        let out = handler.close_with_text(Q, "extended", text).await.unwrap();
        assert_eq!(
            out,
            CloseOutcome::NotYetExpired {
                expires_at: now + 3_600_000
            },
            "{b}"
        );
        let ev = client
            .get(Q, "extended")
            .await
            .unwrap()
            .expect("rescheduled");
        assert_eq!(ev.due_at_ms, now + 3_600_000, "{b}");
        let stored: String = support::raw(
            &client,
            &["HGET", &format!("{{dq:{Q}:0}}:payload"), "extended"],
        )
        .await;
        assert!(stored.ends_with(&format!(":{text}")), "{b}: {stored}");
        // A reconciliation's event for an extended order becomes an ordinary expiry: the
        // reconciled flag is not carried into it.
        client.cancel(Q, "extended").await.unwrap();
        handler
            .close_with_text(Q, "extended", r#"{"expires_at":1,"reconciled":true}"#)
            .await
            .unwrap();
        let stored: String = support::raw(
            &client,
            &["HGET", &format!("{{dq:{Q}:0}}:payload"), "extended"],
        )
        .await;
        assert!(!stored.contains("reconciled"), "{b}: {stored}");
        assert_eq!(
            orders.get("extended").await.unwrap().unwrap().status,
            OrderStatus::Pending
        );

        // An event for an order the database does not have is acknowledged and counted.
        assert_eq!(
            handler.close_order(Q, "ghost", &json!({})).await.unwrap(),
            CloseOutcome::UnknownOrder
        );
        let c = orders.counts().await.unwrap();
        assert_eq!((c.pending, c.paid, c.closed), (1, 1, 1), "{b}");
        client.cancel(Q, "extended").await.unwrap();
        orders.db().close().await;
    }
}

/// A TCP proxy in front of PostgreSQL that can be cut (open connections reset, new ones
/// refused) and restored: a database outage as the handler sees it.
struct Proxy {
    port: u16,
    down: Arc<AtomicBool>,
    conns: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let down = Arc::new(AtomicBool::new(false));
        let conns: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let (d, c) = (down.clone(), conns.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = l.accept().await {
                if d.load(Ordering::SeqCst) {
                    continue; // dropped: the client sees a reset
                }
                let up = upstream.clone();
                c.lock().unwrap().push(tokio::spawn(async move {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(up).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                }));
            }
        });
        Proxy { port, down, conns }
    }

    fn cut(&self) {
        self.down.store(true, Ordering::SeqCst);
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }

    fn restore(&self) {
        self.down.store(false, Ordering::SeqCst);
    }
}

/// The database outage of each backend: PostgreSQL unreachable (the proxy cut), SQLite
/// locked by another writer (an exclusive transaction held open).
enum Outage {
    Postgres(Proxy),
    Sqlite(sqlx::SqliteConnection),
}

#[tokio::test]
async fn a_database_outage_is_retried_then_the_order_closes() {
    let (_redis, client) = support::start().await;
    for t in TestDb::all().await {
        let b = t.backend;
        // A queue per backend: each half sees only its own event.
        let q = &format!("order-close-{b}");
        let direct = Orders::new(t.migrated().await);
        // The handler's own pool: through the proxy for PostgreSQL.
        let (handler_url, mut outage) = match t.backend {
            "postgres" => {
                let rest = t.url.split_once('@').unwrap().1;
                let (hostport, db) = rest.split_once('/').unwrap();
                let proxy = Proxy::start(hostport.to_owned()).await;
                let user = t
                    .url
                    .split_once("://")
                    .unwrap()
                    .1
                    .split_once('@')
                    .unwrap()
                    .0;
                let url = format!("postgres://{user}@127.0.0.1:{}/{db}", proxy.port);
                (url, Some(Outage::Postgres(proxy)))
            }
            _ => (t.url.clone(), None),
        };
        let handler_orders = Orders::new(Db::connect_lazy(&handler_url, 2).unwrap());
        let now = client.now_ms();
        direct
            .create("o-outage", 500, now - 10_000, now - 1)
            .await
            .unwrap();

        // The outage starts before the close event is delivered.
        if t.backend == "sqlite" {
            use sqlx::Connection;
            let mut c = sqlx::SqliteConnection::connect(&t.url).await.unwrap();
            sqlx::query("BEGIN EXCLUSIVE")
                .execute(&mut c)
                .await
                .unwrap();
            outage = Some(Outage::Sqlite(c));
        } else if let Some(Outage::Postgres(p)) = &outage {
            p.cut();
        }

        let stop = CancellationToken::new();
        let w = Worker::new(
            &client,
            q,
            "close-order",
            OrderClose::new(handler_orders.clone(), &client),
            WorkerOptions::default()
                .backoff(Backoff::Fixed(Duration::from_millis(200)))
                .max_attempts(1000)
                .handler_timeout(Duration::from_secs(20)),
        )
        .unwrap();
        w.ensure_groups().await.unwrap();
        let stats = w.stats();
        let hw = tokio::spawn(w.run(stop.clone()));
        client.admin().create_queue(q, 1).await.unwrap();
        let hd = tokio::spawn(
            Dispatcher::new(&client, q, DispatcherOptions::default())
                .unwrap()
                .run(stop.clone()),
        );
        client
            .schedule(q, "o-outage", When::AtMs(now), json!({}))
            .await
            .unwrap();

        // At least two failed attempts while the database is out; the order is untouched.
        let s = stats.clone();
        wait_for(
            &format!("{b}: two failed attempts"),
            Duration::from_secs(60),
            move || {
                let n = s.failed.load(Ordering::SeqCst);
                async move { n >= 2 }
            },
        )
        .await;
        assert_eq!(
            stats.acked.load(Ordering::SeqCst),
            0,
            "{b}: acked during the outage"
        );

        match outage.take() {
            Some(Outage::Sqlite(mut c)) => {
                sqlx::query("ROLLBACK").execute(&mut c).await.unwrap();
            }
            Some(Outage::Postgres(p)) => p.restore(),
            None => unreachable!(),
        }
        let o = direct.clone();
        wait_for(&format!("{b}: the order closed after the outage"), Duration::from_secs(60), move || {
            let o = o.clone();
            async move {
                o.get("o-outage").await.unwrap().unwrap().status == OrderStatus::Closed
            }
        })
        .await;
        let s = stats.clone();
        wait_for(&format!("{b}: acked"), Duration::from_secs(10), move || {
            let n = s.acked.load(Ordering::SeqCst);
            async move { n == 1 }
        })
        .await;
        assert_eq!(stats.dead_lettered.load(Ordering::SeqCst), 0);
        stop.cancel();
        hw.await.unwrap().unwrap();
        hd.await.unwrap();
        handler_orders.db().close().await;
        direct.db().close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciliation_closes_every_unpaid_order_after_redis_loses_its_data() {
    for t in TestDb::all().await {
        reconcile_after_flushall(&t).await;
    }
}

async fn reconcile_after_flushall(t: &TestDb) {
    const N: usize = 5_000;
    let b = t.backend;
    let (_redis, client) = support::start().await;
    let db = t.migrated().await;
    let orders = Orders::new(db.clone());
    let stop = CancellationToken::new();
    let w = Worker::new(
        &client,
        Q,
        "close-order",
        OrderClose::new(orders.clone(), &client),
        WorkerOptions::default()
            .concurrency(16)
            .backoff(Backoff::Fixed(Duration::from_millis(100)))
            .max_attempts(1000),
    )
    .unwrap();
    w.ensure_groups().await.unwrap();
    let hw = tokio::spawn(w.run(stop.clone()));
    let hd = tokio::spawn(
        Dispatcher::new(&client, Q, DispatcherOptions::default())
            .unwrap()
            .run(stop.clone()),
    );
    let rec = Reconciler::new(
        orders.clone(),
        &client,
        Q,
        "close-order",
        ReconcileOptions::default()
            .cron("* * * * * *")
            .grace(Duration::from_millis(500))
            .batch(200),
    )
    .unwrap();
    let hr = tokio::spawn(rec.run(stop.clone()));

    // Mid-run, once closing is under way, Redis loses everything (while the checkout
    // service may still be creating orders).
    let flusher = {
        let (o, client) = (orders.clone(), client.clone());
        tokio::spawn(async move {
            wait_for(
                &format!("{b}: 500 orders closed"),
                Duration::from_secs(120),
                || {
                    let o = o.clone();
                    async move { o.counts().await.unwrap().closed >= 500 }
                },
            )
            .await;
            let _: () = raw(&client, &["FLUSHALL"]).await;
            o.counts().await.unwrap()
        })
    };

    // The checkout service: each order is committed, then its close event scheduled; every
    // 25th schedule call never happens (a crash between commit and schedule). 30% of the
    // customers pay at once: the order is marked paid, then its event cancelled.
    let mut paid = Vec::new();
    for i in 0..N {
        let id = format!("ord-{i:05}");
        let now = client.now_ms();
        let expires = now + 1_500 + (i as i64 % 3_000);
        assert!(
            orders
                .create(&id, 1_000 + i as i64, now, expires)
                .await
                .unwrap()
        );
        if i % 25 != 7 {
            // Right after the flush the queue is gone until its dispatcher declares it
            // again: that schedule is refused (queue_not_found), as good as never made.
            match client
                .schedule(Q, &id, When::AtMs(expires), json!({}))
                .await
            {
                Ok(_) | Err(delayq::Error::QueueNotFound { .. }) => {}
                Err(e) => panic!("{b}: {e}"),
            }
        }
        if i % 10 < 3 {
            assert_eq!(
                orders.pay(&id, client.now_ms()).await.unwrap(),
                PayOutcome::Paid
            );
            match client.cancel(Q, &id).await {
                Ok(_) | Err(delayq::Error::QueueNotFound { .. }) => {}
                Err(e) => panic!("{b}: {e}"),
            }
            paid.push(id);
        }
    }
    let before = flusher.await.unwrap();
    assert!(
        before.pending > 0,
        "{b}: the flush came too late to test anything: {before:?}"
    );

    let o = orders.clone();
    wait_for(
        &format!("{b}: no pending order left"),
        Duration::from_secs(180),
        move || {
            let o = o.clone();
            async move { o.counts().await.unwrap().pending == 0 }
        },
    )
    .await;
    let c = orders.counts().await.unwrap();
    assert_eq!(c.paid, paid.len() as u64, "{b}: {c:?}");
    assert_eq!(c.closed, (N - paid.len()) as u64, "{b}: {c:?}");
    for id in &paid {
        assert_eq!(
            orders.get(id).await.unwrap().unwrap().status,
            OrderStatus::Paid,
            "{b}: {id}"
        );
    }
    // The orders whose close event was never scheduled were closed by reconciliation.
    let mut reconciled = 0;
    for i in (0..N).filter(|i| i % 25 == 7) {
        let id = format!("ord-{i:05}");
        if !paid.contains(&id) {
            let row = orders.get(&id).await.unwrap().unwrap();
            assert_eq!(row.close_reason.as_deref(), Some("reconciled"), "{b}: {id}");
            reconciled += 1;
        }
    }
    assert!(reconciled > 0, "{b}");
    stop.cancel();
    hw.await.unwrap().unwrap();
    hd.await.unwrap();
    hr.await.unwrap().unwrap();
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciliation_leaves_events_on_their_way_alone_and_never_multiplies_them() {
    for t in TestDb::all().await {
        reconcile_backlogged(&t).await;
    }
}

/// 1,000 overdue pending orders whose close events are already in the stream, no close
/// worker running (a backlog): three reconciliation runs send nothing, the stream does not
/// grow, and the other group (notify) receives each order exactly once. Once the close
/// group has acknowledged an event without closing the row, the next run sends one new
/// event to the close group alone.
async fn reconcile_backlogged(t: &TestDb) {
    const N: usize = 1_000;
    let b = t.backend;
    let (_redis, client) = support::start().await;
    let db = t.migrated().await;
    let orders = Orders::new(db.clone());
    let now = client.now_ms();
    for i in 0..N {
        let id = format!("bk-{i:04}");
        orders
            .create(&id, 100, now - 600_000, now - 300_000)
            .await
            .unwrap();
        client
            .schedule(Q, &id, When::AtMs(now - 300_000), json!({}))
            .await
            .unwrap();
    }
    let stop = CancellationToken::new();
    // The close group exists but nobody consumes it.
    let close = Worker::new(
        &client,
        Q,
        "close-order",
        |_d: delayq::Delivery| async { Ok(()) },
        WorkerOptions::default(),
    )
    .unwrap();
    close.ensure_groups().await.unwrap();
    let rec = support::Recorder::default();
    let notify = Worker::new(
        &client,
        Q,
        "notify",
        rec.handler(),
        WorkerOptions::default().block(Duration::from_millis(50)),
    )
    .unwrap();
    notify.ensure_groups().await.unwrap();
    let hn = tokio::spawn(notify.run(stop.clone()));
    let moved = Dispatcher::new(&client, Q, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap()
        .moved;
    assert_eq!(moved, N, "{b}");
    let stream = "{dq:order-close:0}:stream";
    let rec_job = Reconciler::new(
        orders.clone(),
        &client,
        Q,
        "close-order",
        ReconcileOptions::default().grace(Duration::from_secs(60)),
    )
    .unwrap();
    for run in 0..3 {
        let r = rec_job.run_once().await.unwrap();
        assert_eq!(
            (r.overdue, r.sent, r.in_flight),
            (N as u64, 0, N as u64),
            "{b} run {run}"
        );
        let len: u64 = raw(&client, &["XLEN", stream]).await;
        assert_eq!(len, N as u64, "{b} run {run}: the stream grew");
    }
    rec.wait_len(N, Duration::from_secs(60)).await;
    assert!(
        rec.counts().values().all(|&n| n == 1),
        "{b}: notify got duplicates"
    );
    assert_eq!(rec.len(), N, "{b}");

    // The close group acknowledges one event without closing its row (say the handler
    // skipped it): the next run sends that order again, to the close group only.
    let entry: Vec<(String, Vec<(String, String)>)> =
        raw(&client, &["XRANGE", stream, "-", "+", "COUNT", "1"]).await;
    let first = entry[0].0.clone();
    // Delivered (its last-delivered id moves past it) and not pending: done.
    let _: String = raw(&client, &["XGROUP", "SETID", stream, "close-order", &first]).await;
    let r = rec_job.run_once().await.unwrap();
    assert_eq!((r.sent, r.in_flight), (1, N as u64 - 1), "{b}");
    let len: u64 = raw(&client, &["XLEN", stream]).await;
    assert_eq!(len, N as u64 + 1, "{b}");
    let last: Vec<(String, Vec<(String, String)>)> =
        raw(&client, &["XREVRANGE", stream, "+", "-", "COUNT", "1"]).await;
    let fields: std::collections::HashMap<_, _> = last[0].1.iter().cloned().collect();
    assert_eq!(
        fields.get("for_group").map(String::as_str),
        Some("close-order"),
        "{b}"
    );
    assert_eq!(fields.get("id"), Some(&entry[0].1[0].1), "{b}");
    // A run right after leaves it alone: it is now on its way.
    assert_eq!(rec_job.run_once().await.unwrap().sent, 0, "{b}");
    // Notify skips the close group's event: still exactly one delivery each.
    wait_for(
        &format!("{b}: notify passed the new entry"),
        Duration::from_secs(20),
        || {
            let c = client.clone();
            async move { support::pending(&c, "{dq:order-close:0}:stream", "notify").await == 0 }
        },
    )
    .await;
    assert_eq!(rec.len(), N, "{b}");
    stop.cancel();
    hn.await.unwrap().unwrap();
    db.close().await;
}
