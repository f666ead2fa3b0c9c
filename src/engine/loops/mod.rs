//! The background loops but the worker's (which has its own folder, `engine::worker`), one
//! file each; each loop's decisions are pure functions beside it, unit-tested without Redis.
//!
//! - [`dispatcher`]: moves due orders into the streams; its call sizing and lateness-budget
//!   spacing are `pacing` (pure).
//! - [`supervisor`]: one dispatcher for every queue of the registry, following it.
//! - [`housekeeping`]: the cron chores (stream trimming, dead-letter retention, idle
//!   consumers, the safety sweep); `chores` runs them (a tick skipped while the last run
//!   goes on, a shutdown that waits).
//! - [`scheduler`]: the recurring schedules' loop (a pass whenever a tick is due; the pass
//!   and its pure `step` are in [`crate::engine::schedules`]).

pub(crate) mod chores;
pub mod dispatcher;
pub mod housekeeping;
pub(crate) mod pacing;
pub mod scheduler;
pub mod supervisor;
