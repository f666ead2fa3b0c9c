//! The service (feature `server`): `delayq serve` and what it is made of.
//!
//! - [`config`]: the TOML configuration, env overrides, conversion into the library's
//!   option types with the key named on error.
//! - [`surface`]: the rules the CLI and the HTTP API add to the engine's admin API (batch
//!   caps, page limits, dead-letter selections) and the few answer shapes only they have.
//! - [`http`]: the HTTP API (`http::app(state) -> Router`) and its server.
//! - [`ui`]: the web dashboard under `/ui/` (sessions, the timing ring buffer, embedded
//!   assets).
//! - [`handlers`]: the built-in handlers (webhook, log, order-close).
//! - [`metrics`]: the Prometheus recorder and the gauges.
//! - [`serve`]: dispatchers, housekeeping, workers and the HTTP API together.

pub mod config;
pub mod handlers;
pub mod http;
pub mod metrics;
pub mod serve;
pub mod surface;
pub mod ui;
