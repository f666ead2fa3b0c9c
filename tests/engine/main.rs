//! The engine against real redis-server processes (and clusters): scheduling, dispatch, consumer groups, failures and recovery, history, priorities, dead letters, maintenance, shards, the registry, recurring schedules and the producer conformance cases.
//!
//! One test binary per area (this one, `tests/service/`, `tests/otel.rs`), so the suite
//! links a few times instead of once per file; each module is one former test file, its
//! tests named `<module>::<test>` (`cargo test --test engine -- engine::`).

#[path = "../support/mod.rs"]
mod support;

mod cancel_history;
mod cluster;
mod conformance;
mod crash;
mod dead_letters;
mod durability;
mod engine;
mod events;
mod expiry;
mod failure;
mod history;
mod housekeeping;
mod key_limits;
mod keys;
mod order_rules;
mod ownership;
mod priorities;
mod pull;
mod registry;
mod roster;
mod schedules;
mod shards;
mod tags;
mod time_rules;
mod wakeups;
