//! A consumer group that closes expired orders, written against the library: what the
//! built-in `order-close` handler of `delayq serve` does, for services that embed delayq.
//!
//! The handler must be idempotent (delivery is at least once) and must never close a paid
//! order: it relies on one conditional statement (`Orders::close`:
//! `UPDATE orders SET status = 'closed' ... WHERE id = $1 AND status = 'pending' AND
//! expires_at <= $now`) and treats every other answer as "nothing to do", except:
//! - the expiry was extended in the database → reschedule the event for the new expiry;
//! - the database failed → `HandlerError::retry` (the worker backs off and tries again; after
//!   `max_attempts` the event is dead-lettered, and can be replayed).
//!
//! Uses `REDIS_URL` (or a throwaway redis-server) and `DATABASE_URL` (or a temporary SQLite
//! file). Run: `cargo run --example order_close_consumer`

use delayq::orders::db::Db;
use delayq::{
    Backoff, Client, ClientOptions, CloseOutcome, Delivery, Dispatcher, DispatcherOptions, Handler,
    HandlerError, HandlerResult, LocalRedis, Mode, NewOrder, Orders, When, Worker, WorkerOptions,
};
use serde_json::json;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "order-close";

struct CloseExpiredOrders {
    orders: Orders,
    client: Client,
}

impl Handler for CloseExpiredOrders {
    async fn handle(&self, d: Delivery) -> HandlerResult {
        let now = self.client.now_ms();
        let outcome = self
            .orders
            .close(&d.id, now, "expired")
            .await
            .map_err(HandlerError::retry)?;
        match outcome {
            CloseOutcome::Closed => println!("{}: closed (attempt {})", d.id, d.attempt),
            CloseOutcome::AlreadyPaid => println!("{}: paid in time, left open", d.id),
            CloseOutcome::AlreadyClosed => println!("{}: already closed (a redelivery)", d.id),
            CloseOutcome::UnknownOrder => println!("{}: no such order; acknowledged", d.id),
            CloseOutcome::NotYetExpired { expires_at } => {
                self.client
                    .schedule_with(
                        &d.queue,
                        NewOrder::new(&d.id, When::AtMs(expires_at), &d.payload),
                        Mode::Upsert,
                    )
                    .await
                    .map_err(HandlerError::retry)?;
                println!("{}: expiry extended; rescheduled for {expires_at}", d.id);
            }
        }
        Ok(())
    }
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
    db.migrate().await?;
    let orders = Orders::new(db.clone());
    let namespace = format!("dq-example-{}", std::process::id());
    let client =
        Client::connect_with(&redis_url, ClientOptions::default().namespace(&namespace)).await?;
    client.admin().create_queue(QUEUE, 1).await?;

    // Three orders expiring within a second; one is paid, one gets more time.
    let tag = std::process::id();
    let ids: Vec<String> = (0..3).map(|i| format!("oc-{tag}-{i}")).collect();
    let now = client.now_ms();
    for (i, id) in ids.iter().enumerate() {
        let expires_at = now + 300 + 300 * i as i64;
        orders.create(id, 1000, now, expires_at).await?;
        client
            .schedule(QUEUE, id, When::AtMs(expires_at), json!({}))
            .await?;
    }
    orders.pay(&ids[0], client.now_ms()).await?; // its cancel "got lost": the event still fires
    orders.extend(&ids[1], now + 1_500).await?; // the reschedule "got lost" too

    let stop = CancellationToken::new();
    let worker = Worker::new(
        &client,
        QUEUE,
        "close-order",
        CloseExpiredOrders {
            orders: orders.clone(),
            client: client.clone(),
        },
        WorkerOptions::default()
            .max_attempts(20)
            .backoff(Backoff::Fixed(Duration::from_millis(500))),
    )?;
    let w = tokio::spawn(worker.run(stop.clone()));
    let d = tokio::spawn(
        Dispatcher::new(&client, QUEUE, DispatcherOptions::default())?.run(stop.clone()),
    );

    // Wait until nothing is pending in the database any more.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while orders.counts().await?.pending > 0 {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "orders still pending"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    w.await??;
    d.await?;
    for id in &ids {
        println!("{id}: {:?}", orders.get(id).await?.map(|o| o.status));
    }
    client.delete_namespace().await?;
    db.close().await;
    Ok(())
}
