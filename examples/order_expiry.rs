//! Order expiry end to end, with zero configuration.
//!
//! Uses the Redis at `REDIS_URL` (default `redis://127.0.0.1:6379`) when one answers, else
//! starts a throwaway `redis-server` on a free port. A "checkout service" creates 20 orders
//! due 1–4 s from now, every third customer pays in time (the close event is cancelled), and
//! a dispatcher plus one consumer group ("close-order") print each unpaid order as it
//! expires, with its lateness. Keys live in a namespace of their own, removed at the end.
//!
//! Run: `cargo run --example order_expiry`

use delayq::{
    Client, ClientOptions, Delivery, Dispatcher, DispatcherOptions, LocalRedis, Mode, NewOrder,
    When, Worker, WorkerOptions,
};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "order-close";
const ORDERS: usize = 20;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let wanted = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let (_server, url) = if delayq::testing::local_redis::reachable(&wanted) {
        println!("using Redis at {wanted}");
        (None, wanted)
    } else {
        let s = LocalRedis::start()?;
        println!(
            "no Redis at {wanted}: started a throwaway redis-server at {}",
            s.url()
        );
        let url = s.url();
        (Some(s), url)
    };
    let namespace = format!("dq-example-{}", std::process::id());
    let client = Client::connect_with(&url, ClientOptions::default().namespace(&namespace)).await?;
    // Declare the queue first: scheduling into an unknown queue is refused.
    client.admin().create_queue("order-close", 1).await?;

    // The checkout service: create orders that expire 1..4 s from now.
    let orders: Vec<NewOrder> = (0..ORDERS)
        .map(|i| {
            let expires_in_ms = 1000 + (i as i64 * 150);
            NewOrder::new(
                format!("order-{i:04}"),
                When::in_ms(expires_in_ms),
                json!({"order_id": format!("order-{i:04}"), "amount_cents": 1000 + i * 10}),
            )
        })
        .collect();
    client.schedule_many(QUEUE, &orders, Mode::Upsert).await?;
    println!("created {ORDERS} orders");
    let mut unpaid = 0;
    for (i, o) in orders.iter().enumerate() {
        if i % 3 == 0 {
            client.cancel(QUEUE, &o.id).await?;
            println!("  {} paid: close event cancelled", o.id);
        } else {
            unpaid += 1;
        }
    }

    // The business handler: close the order.
    let closed = Arc::new(AtomicUsize::new(0));
    let all_closed = CancellationToken::new();
    let handler = {
        let (closed, all_closed, clock) =
            (closed.clone(), all_closed.clone(), client.clock().clone());
        move |d: Delivery| {
            let late = clock.now_ms() - d.due_at_ms;
            println!(
                "  {} expired: closing it (handler started {late} ms after due)",
                d.id
            );
            if closed.fetch_add(1, Ordering::SeqCst) + 1 == unpaid {
                all_closed.cancel();
            }
            async { Ok(()) }
        }
    };
    let stop = CancellationToken::new();
    let dispatcher = Dispatcher::new(&client, QUEUE, DispatcherOptions::default())?;
    let worker = Worker::new(
        &client,
        QUEUE,
        "close-order",
        handler,
        WorkerOptions::default(),
    )?;
    let d = tokio::spawn(dispatcher.run(stop.clone()));
    let w = tokio::spawn(worker.run(stop.clone()));

    tokio::select! {
        _ = all_closed.cancelled() => {}
        _ = tokio::time::sleep(std::time::Duration::from_secs(60)) => {
            anyhow::bail!("not every unpaid order was closed within 60 s");
        }
    }
    stop.cancel();
    d.await?;
    w.await??;
    println!(
        "done: {ORDERS} created, {} paid, {} closed",
        ORDERS - unpaid,
        closed.load(Ordering::SeqCst)
    );

    // Leave nothing behind in a shared Redis.
    client.delete_namespace().await?;
    Ok(())
}
