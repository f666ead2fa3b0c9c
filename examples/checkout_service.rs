//! A checkout service: orders live in the database, their close events in delayq.
//!
//! The rule that keeps the two consistent: **the database first, Redis second**.
//! - place an order: commit the row (`pending`, `expires_at`), then schedule its close event
//!   for `expires_at`. A crash (or a Redis error) in between leaves a pending order without
//!   an event: the reconciliation job (`[reconciliation]` in `delayq serve`) schedules it once
//!   it is overdue, so the order is still closed, a little late.
//! - pay: one conditional update (`pending` and not expired → `paid`), then cancel the event.
//!   If the cancel is lost, the close event still fires and finds the order paid: no harm.
//! - extend the expiry: update the row, then reschedule the event. If the reschedule is lost,
//!   the close handler finds the order not yet expired and reschedules it itself.
//!
//! "Now" comes from the delayq client's clock (the Redis server's), the same clock the
//! close handler uses, so `expires_at` and the close decision never disagree.
//!
//! Uses `REDIS_URL` (or a throwaway redis-server) and `DATABASE_URL` (or a temporary SQLite
//! file). Run: `cargo run --example checkout_service`

use delayq::orders::db::Db;
use delayq::{
    Client, ClientOptions, LocalRedis, Mode, NewOrder, Orders, PayOutcome, ReconcileOptions,
    Reconciler, When,
};
use serde_json::json;
use std::time::Duration;

const QUEUE: &str = "order-close";
const EXPIRES_IN_MS: i64 = 15 * 60 * 1000;

/// Commit the order, then schedule its close event.
async fn place_order(
    orders: &Orders,
    client: &Client,
    id: &str,
    amount_cents: i64,
) -> anyhow::Result<i64> {
    let now = client.now_ms();
    let expires_at = now + EXPIRES_IN_MS;
    orders.create(id, amount_cents, now, expires_at).await?;
    // If this fails, the order is pending without an event: reconciliation will catch it.
    if let Err(e) = client
        .schedule_with(
            QUEUE,
            NewOrder::new(
                id,
                When::AtMs(expires_at),
                json!({"amount_cents": amount_cents}),
            ),
            Mode::Upsert,
        )
        .await
    {
        eprintln!("{id}: close event not scheduled ({e}); reconciliation will schedule it");
    }
    Ok(expires_at)
}

/// Mark paid (only if not expired), then cancel the close event.
async fn pay(orders: &Orders, client: &Client, id: &str) -> anyhow::Result<PayOutcome> {
    let outcome = orders.pay(id, client.now_ms()).await?;
    if outcome == PayOutcome::Paid {
        // A lost cancel is harmless: the close handler never closes a paid order.
        client.cancel(QUEUE, id).await?;
    }
    Ok(outcome)
}

/// Give the customer more time: update the row, then move the close event.
async fn extend(orders: &Orders, client: &Client, id: &str, by_ms: i64) -> anyhow::Result<()> {
    let Some(order) = orders.get(id).await? else {
        anyhow::bail!("no order {id}");
    };
    let expires_at = order.expires_at + by_ms;
    if orders.extend(id, expires_at).await? {
        client.reschedule(QUEUE, id, When::AtMs(expires_at)).await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let wanted = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let (_server, redis_url) = if delayq::testing::local_redis::reachable(&wanted) {
        (None, wanted)
    } else {
        let s = LocalRedis::start()?;
        let u = s.url();
        (Some(s), u)
    };
    let dir = tempfile::tempdir()?;
    let db_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| format!("sqlite://{}", dir.path().join("orders.db").display()));
    let db = Db::connect(&db_url).await?;
    db.migrate().await?; // in production: `delayq migrate --database-url ...` at deploy time
    let orders = Orders::new(db.clone());
    let namespace = format!("dq-example-{}", std::process::id());
    let client =
        Client::connect_with(&redis_url, ClientOptions::default().namespace(&namespace)).await?;
    client.admin().create_queue(QUEUE, 1).await?;
    let tag = std::process::id();

    let a = format!("co-{tag}-a");
    let b = format!("co-{tag}-b");
    let c = format!("co-{tag}-c");
    for (id, amount) in [(&a, 1999), (&b, 4500), (&c, 12000)] {
        let expires_at = place_order(&orders, &client, id, amount).await?;
        println!("placed {id}: {amount} cents, expires at {expires_at} (unix ms)");
    }
    println!("pay {a}: {:?}", pay(&orders, &client, &a).await?);
    println!("pay {a} again: {:?}", pay(&orders, &client, &a).await?);
    extend(&orders, &client, &b, 10 * 60 * 1000).await?;
    println!(
        "extended {b}: its close event is now due at {}",
        client.get(QUEUE, &b).await?.map_or(0, |o| o.due_at_ms)
    );

    // A crash between commit and schedule: the row exists, the event does not.
    let d = format!("co-{tag}-d");
    let now = client.now_ms();
    orders
        .create(&d, 700, now - EXPIRES_IN_MS - 120_000, now - 120_000)
        .await?;
    let report = Reconciler::new(
        orders.clone(),
        &client,
        QUEUE,
        "close-order",
        ReconcileOptions::default().grace(Duration::from_secs(60)),
    )?
    .run_once()
    .await?;
    println!(
        "reconciliation: {} overdue pending order(s), {} close event(s) sent to close-order ({d} is one)",
        report.overdue, report.sent
    );

    for id in [&a, &b, &c, &d] {
        let o = orders.get(id).await?;
        let event = client.admin().history(QUEUE, id).await?;
        println!(
            "{id}: {:?}, close event {}",
            o.map(|o| o.status),
            event.map_or("none".into(), |h| format!(
                "{:?}, due at {}",
                h.state, h.due_at_ms
            ))
        );
    }
    client.delete_namespace().await?;
    db.close().await;
    Ok(())
}
