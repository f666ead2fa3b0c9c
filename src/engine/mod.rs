//! The engine: everything a producer or a consumer needs, and nothing else (no HTTP, no SQL,
//! no command line). Builds with `default-features = false`.
//!
//! - [`keys`]: queue-name and id validation; the Redis key layout and the shard function.
//! - [`conn`]: one connection type for a single Redis or a Redis Cluster.
//! - [`clock`]: the one clock ("now" is the Redis server's `TIME`), replaceable in tests.
//! - [`retry`]: the one transient-error retry helper every Redis loop uses.
//! - [`message`]: what producers send ([`NewOrder`](message::NewOrder),
//!   [`When`](message::When), [`Payload`](message::Payload)) and get back; [`when`]: when an
//!   order is due and the due-time rules.
//! - [`priority`]: order priority levels and how a reader picks among them.
//! - [`scripts`]: the Lua scripts of `lua/`, one typed wrapper each.
//! - [`client`]: the producer API ([`Client`](client::Client): schedule, cancel,
//!   reschedule, get) over the store's one connection, and its catalog of the queue registry.
//! - [`admin`]: queue administration ([`Queues`](admin::Queues), from `Client::admin`):
//!   queues and groups, pause, statistics, order history and redelivery, dead letters.
//! - `reply` (crate-private): every parser of a Redis reply shape.
//! - [`loops`]: the background loops but the worker's, one file each: the
//!   [`dispatcher`](loops::dispatcher) moving due orders into the streams (its sizing and
//!   spacing pure in `pacing`), the [`supervisor`](loops::supervisor) running one for every
//!   queue of the registry, [`housekeeping`](loops::housekeeping) (cron chores: stream
//!   trimming, idle consumers, the safety sweep; `chores` runs them) and the recurring
//!   schedules' [`scheduler`](loops::scheduler).
//! - [`worker`]: consumer groups running business handlers.
//! - [`expiry`]: expiry of stale work (`expires_after`): the rule, its stored form, the check.
//! - [`order_key`]: an order's key (issue 42): its rule, its stored form, fair share.
//! - [`flow`]: flow control the loops follow: pause flags, shared rate limits.
//! - [`history`]: the order-history records the dispatcher and workers write (retention,
//!   buckets, markers); [`admin::history`] reads them.
//! - [`redact`]: the one helper that masks URL credentials, query strings and tokens.
//! - [`backoff`], [`duration`]: retry policies and human durations.
//! - [`telemetry`]: metric names and label sets (recorded through the `metrics` facade).
//! - [`trace`]: the W3C trace context carried with orders, and (feature `otel`) the
//!   OpenTelemetry `send` / `process` spans.
//! - [`time_rules`]: a queue's dedup window after dispatch, an order's debounce.
//! - [`version`]: the server version check at connect.
//! - `wake` (private): in-process wake-ups of sleeping dispatchers.
//! - `listen` (private): cross-process wake-ups, the Pub/Sub listener of a client's
//!   dispatchers.

pub mod admin;
pub mod backoff;
pub mod client;
pub mod clock;
pub mod conn;
pub mod duration;
pub mod error;
pub mod events;
pub mod expiry;
pub mod flow;
pub mod history;
pub mod history_counts;
pub mod keys;
pub(crate) mod listen;
pub mod loops;
pub mod message;
pub mod order_key;
pub mod outcome;
pub mod priority;
pub mod redact;
pub(crate) mod reply;
pub mod retry;
pub mod roster;
pub mod schedules;
pub mod scripts;
pub(crate) mod sync;
pub mod tags;
pub mod telemetry;
pub mod time_rules;
pub mod trace;
pub mod version;
mod wake;
pub mod when;
pub mod worker;

// The loops' public paths from before they moved into `loops/`.
pub use loops::{dispatcher, housekeeping, supervisor};
