//! Recurring schedules: cron expressions and intervals in IANA time zones, each tick an
//! ordinary order enqueued exactly once.
//!
//! - [`spec`]: parsing and validating a recurrence, and its tick instants (pure, no Redis).

pub mod spec;
