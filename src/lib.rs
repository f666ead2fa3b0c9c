//! # delayq
//!
//! An order-expiry delay queue on Redis. A checkout service schedules "close order 1234 at
//! 10:30"; if the customer pays it cancels that event; when the time comes delayq hands the
//! event to every subscribed business handler (a Redis Streams consumer group each), at least
//! once, on time to the millisecond.
//!
//! ```no_run
//! # async fn example() -> delayq::Result<()> {
//! let client = delayq::Client::connect("redis://127.0.0.1:6379").await?;
//! client.schedule("order-close", "order-1234", std::time::Duration::from_secs(15 * 60),
//!                 serde_json::json!({"user": 42})).await?;
//! client.cancel("order-close", "order-1234").await?; // paid in time
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! - [`error`]: the error enums ([`Error`], [`InvalidInput`]).
//! - [`keys`]: queue-name and id validation; the Redis key layout and the shard function.
//! - [`conn`]: one connection type for a single Redis or a Redis Cluster.
//! - [`clock`]: the one clock ("now" is the Redis server's `TIME`), replaceable in tests.
//! - [`order`]: what producers send ([`NewOrder`], [`When`], [`Payload`]) and get back.
//! - [`scripts`]: the Lua scripts of `lua/`, one typed wrapper each.
//! - [`client`]: the producer API ([`Client`]: schedule, cancel, reschedule, get).
//! - [`dispatcher`]: the poller moving due orders into the streams ([`Dispatcher`]).
//! - [`backoff`]: retry backoff policies (fixed, linear, exponential with jitter).
//! - [`stats`]: queue statistics (scheduled, overdue, stream, pending per group, dead).
//! - [`dead`]: dead letters: list, replay to the failing group, purge.
//! - [`worker`]: consumer groups running business handlers ([`Worker`], [`Handler`]).
//! - [`duration`]: human durations (`500ms`, `1h30m`).
//! - [`builtin`]: the built-in handlers of `delayq serve` (webhook, log).
//! - [`metrics`]: Prometheus metrics (names, recorder, gauges).
//! - [`http`]: the HTTP API (`http::app(state) -> Router`).
//! - [`config`]: `delayq serve`'s TOML configuration, env overrides, validation.
//! - [`serve`]: `delayq serve`: dispatchers, housekeeping, workers and the HTTP API together.
//! - [`cli`]: the `delayq` command line (`main.rs` only parses and calls it).
//! - [`demo`]: `delayq demo`, the zero-configuration walk-through.
//! - [`bench`]: the `delayq bench` load generator.
//! - [`housekeeping`]: cron chores: stream trimming, idle consumers, the safety sweep.
//! - [`local_redis`]: a throwaway `redis-server` for demos and tests ([`LocalRedis`]).
//! - [`db`]: the orders database pool (PostgreSQL or SQLite) and the embedded migrations.
//! - [`orders`]: the `orders` table: create, pay, extend, conditional close, overdue scan.
//! - [`order_close`]: the `order-close` built-in handler ([`OrderClose`]).
//! - [`reconcile`]: the reconciliation job that reschedules overdue pending orders
//!   ([`Reconciler`]).
//! - `wake` (private): in-process wake-ups of sleeping dispatchers.
//!
//! ARCHITECTURE.md describes the data flow, the key layout and the invariants.

pub mod backoff;
pub mod bench;
pub mod builtin;
pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod conn;
pub mod db;
pub mod dead;
pub mod demo;
pub mod dispatcher;
pub mod duration;
pub mod error;
pub mod housekeeping;
pub mod http;
pub mod keys;
pub mod local_redis;
pub mod metrics;
pub mod order;
pub mod order_close;
pub mod orders;
pub mod reconcile;
pub mod scripts;
pub mod serve;
pub mod stats;
mod wake;
pub mod worker;

pub use backoff::Backoff;
pub use client::{Client, ClientOptions, Durability};
pub use clock::{Clock, ManualClock, RedisClock};
pub use dead::{DeadLetter, Selection};
pub use dispatcher::{Dispatcher, DispatcherOptions, Pass};
pub use error::{Error, InvalidInput, Result};
pub use housekeeping::{Housekeeper, HousekeepingOptions};
pub use local_redis::LocalRedis;
pub use order::{
    CancelOutcome, Mode, NewOrder, Payload, RescheduleOutcome, ScheduleOutcome, Scheduled,
    ScheduledOrder, When,
};
pub use order_close::OrderClose;
pub use orders::{CloseOutcome, OrderRow, OrderStatus, Orders, PayOutcome};
pub use reconcile::{ReconcileOptions, Reconciler};
pub use stats::{GroupStats, QueueStats};
pub use worker::{
    Delivery, DeliveryFlag, Handler, HandlerError, HandlerResult, Hooks, NoHooks, Worker,
    WorkerOptions, WorkerStats,
};
