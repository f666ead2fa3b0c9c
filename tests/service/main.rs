//! The service and its surfaces, each against its own redis-server (and PostgreSQL, browser, sentinel, TLS server): the command line, HTTP API and its edge, flow control, the orders domain, production Redis, the OpenAPI fuzzing, `serve` and the dashboard.
//!
//! One test binary per area (this one, `tests/service/`, `tests/otel.rs`), so the suite
//! links a few times instead of once per file; each module is one former test file, its
//! tests named `<module>::<test>` (`cargo test --test service -- cli::`).

#[path = "../support/mod.rs"]
mod support;

mod cli;
mod edge;
mod events;
mod expiry;
mod flow;
mod http;
mod key_limits;
mod keys;
mod observability;
mod orders;
mod production;
mod pull;
mod pull_groups;
mod pull_tokens;
mod pull_wait;
mod reference;
mod schema;
mod serve;
mod tags;
mod time_rules;
mod ui;
mod ui_tags;
