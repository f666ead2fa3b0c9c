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
//! The folders are the layers; each depends only on those above it.
//!
//! - [`engine`]: always built, in four tiers, each importing only those above it:
//!   - the vocabulary: the errors ([`Error`], [`InvalidInput`]; also at [`error`]), write
//!     outcomes, key names, what producers send, [`Priority`] levels, metric names;
//!   - the store: connections, the clock, the Lua scripts and the parsers of their replies,
//!     and the producer [`Client`] (schedule, cancel, reschedule, get) with its catalog of
//!     the queue registry;
//!   - administration: [`Queues`] (from [`Client::admin`]): queues and groups, pause,
//!     statistics, order history and redelivery, dead letters;
//!   - the loops (`engine::loops`, the worker apart in `engine::worker`): the
//!     [`Dispatcher`] and the [`Supervisor`] that runs one per registered queue, the
//!     [`Worker`] (and [`MultiWorker`] over several queues), the [`Puller`] (a
//!     group consumed by receive and ack, with receipts), recurring
//!     [`Schedules`] and their [`Scheduler`], the maintenance services. No loop imports
//!     another.
//! - [`orders`] (feature `orders`): the orders database, its repository, the `order-close`
//!   handler and the reconciliation job; its own error ([`orders::error::Error`]) wraps the
//!   engine's.
//! - [`service`] (feature `server`): configuration, the rules the CLI and HTTP add to the
//!   engine's admin API, the HTTP API, the built-in handlers, Prometheus metrics, `delayq serve`.
//! - [`cli`] (feature `cli`): the `delayq` command line, one file per verb (`main.rs` only
//!   parses and calls it).
//! - [`testing`] (feature `test-util`): a throwaway `redis-server` ([`LocalRedis`]) for
//!   tests, the demo and the bench; [`ManualClock`].
//!
//! # Features
//!
//! | feature | adds | pulls in |
//! |---|---|---|
//! | (none) | the engine | redis, tokio, serde, serde_json, chrono, chrono-tz, croner, tracing, tokio-cron-scheduler, metrics (facade) |
//! | `otel` | the `send` / `process` spans of [`engine::trace`] and the caller's context taken from its `tracing` span (no exporter) | opentelemetry (API), tracing-opentelemetry |
//! | `orders` | [`orders`] | sqlx (PostgreSQL, SQLite) |
//! | `server` | [`service`] (implies `orders`, `otel`) | axum, reqwest (rustls), figment, metrics-exporter-prometheus |
//! | `test-util` | [`testing`], [`ManualClock`] | tempfile |
//! | `cli` (default) | [`cli`] and the `delayq` binary, the product (implies all the above but `test-util`) | clap, tracing-subscriber, hdrhistogram, anyhow, tempfile, opentelemetry_sdk, opentelemetry-otlp (HTTP/protobuf on reqwest) |
//! | `dev-tools` (default) | `delayq bench`, and the throwaway `redis-server` of `delayq demo` (implies `cli`, `test-util`); the container image builds `cli` alone | |
//!
//! A service that only schedules and cancels depends on
//! `delayq = { version = "0.1", default-features = false }` (with `features = ["otel"]` to
//! carry its OpenTelemetry trace context into the orders).
//! An order can carry a W3C trace context without `otel` too
//! ([`NewOrder::with_trace`], [`Delivery::trace`]).
//!
//! ARCHITECTURE.md describes the data flow, the key layout and the invariants.

pub mod engine;
/// The engine's errors, at the crate root (`delayq::error`).
pub use engine::error;

#[cfg(feature = "orders")]
pub mod orders;

#[cfg(feature = "server")]
pub mod service;

#[cfg(feature = "cli")]
pub mod cli;

#[cfg(feature = "test-util")]
pub mod testing;

pub use engine::admin::Queues;
pub use engine::admin::dead::{DeadLetter, Selection};
pub use engine::admin::history::{GroupHistory, GroupState, OrderHistory, OrderState};
pub use engine::admin::stats::{GroupStats, PriorityStats, QueueStats};
pub use engine::backoff::Backoff;
pub use engine::client::events::{Event, EventPosted};
pub use engine::client::tags::{TagCounts, TagMove, TagPage, TaggedOrder};
pub use engine::client::{Client, ClientOptions, Durability};
#[cfg(feature = "test-util")]
pub use engine::clock::ManualClock;
pub use engine::clock::{Clock, RedisClock};
pub use engine::error::{Error, InvalidInput, Result};
pub use engine::events::CancelRule;
pub use engine::history::{Cancellation, CancelledBy};
pub use engine::loops::dispatcher::{Dispatcher, DispatcherOptions, DispatcherStats, Pass};
pub use engine::loops::housekeeping::{DeadLetterOptions, Housekeeper, HousekeepingOptions};
pub use engine::loops::scheduler::Scheduler;
pub use engine::loops::supervisor::{
    DispatchSelection, Supervisor, SupervisorOptions, SupervisorReport,
};
pub use engine::message::{
    BatchItem, CancelOutcome, ItemOutcome, Mode, NewOrder, Payload, RescheduleOutcome,
    ScheduleOutcome, Scheduled, ScheduledOrder, When,
};
pub use engine::outcome::WriteOutcome;
pub use engine::priority::{Priority, PriorityMode};
pub use engine::schedules::{Missed, ScheduleInfo, ScheduleSpec, Schedules};
pub use engine::time_rules::{Debounce, DebounceState, DedupWindow};
pub use engine::trace::{ConsumerSpan, TraceContext};
pub use engine::worker::{
    Delivery, DeliveryFlag, Extended, Handler, HandlerError, HandlerResult, Hooks, MultiWorker,
    Nack, NoHooks, PullDelivery, Puller, Settled, Worker, WorkerOptions, WorkerStats,
};
#[cfg(feature = "orders")]
pub use orders::close::OrderClose;
#[cfg(feature = "orders")]
pub use orders::reconcile::{ReconcileOptions, Reconciler};
#[cfg(feature = "orders")]
pub use orders::repo::{CloseOutcome, OrderRow, OrderStatus, Orders, PayOutcome};
#[cfg(feature = "test-util")]
pub use testing::local_redis::LocalRedis;
