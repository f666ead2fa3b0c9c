//! The Lua scripts in `lua/`, loaded at compile time, one typed wrapper each, grouped by who
//! runs them: [`orders`] (producers and the dispatcher), [`consume`] (workers), [`registry`]
//! (queues, groups and maintenance), [`schedules`] (recurring schedules and their ticks).
//!
//! Scripts are invoked by SHA (`EVALSHA`) and loaded again when Redis answers `NOSCRIPT`
//! (after a restart or `SCRIPT FLUSH`); [`redis::Script::invoke_async`] does both. Every
//! script's source is listed once, in [`all`].

pub mod consume;
pub mod orders;
pub mod registry;
pub mod schedules;

pub use consume::*;
pub use orders::*;
pub use registry::*;

use crate::error::Error;

/// Every script, by name (the file name without `.lua`), as the engine runs it: what
/// `delayq scripts export` writes for the SDKs, whose copies must match byte for byte.
pub fn all() -> Vec<(&'static str, &'static str)> {
    vec![
        ("enqueue", ENQUEUE_LUA),
        ("dequeue", DEQUEUE_LUA),
        ("cancel", CANCEL_LUA),
        ("reschedule", RESCHEDULE_LUA),
        ("get", GET_LUA),
        ("read", READ_LUA),
        ("reclaim", RECLAIM_LUA),
        ("retry", RETRY_LUA),
        ("dead", DEAD_LUA),
        ("replay", REPLAY_LUA),
        ("extend", EXTEND_LUA),
        ("trim", TRIM_LUA),
        ("consumers", CONSUMERS_LUA),
        ("create_queue", CREATE_QUEUE_LUA),
        ("fence", FENCE_LUA),
        ("join_group", JOIN_GROUP_LUA),
        ("heartbeat", HEARTBEAT_LUA),
        ("stats", crate::engine::stats::STATS_LUA),
        ("history", crate::engine::history::HISTORY_LUA),
        ("redeliver", crate::engine::history::REDELIVER_LUA),
        ("ratelimit", crate::engine::flow::RATELIMIT_LUA),
        ("schedule", schedules::SCHEDULE_LUA),
        ("tick", schedules::TICK_LUA),
    ]
}

/// What a script's error reply says about the queue, when it says something
/// (`enqueue.lua`, `join_group.lua`, `create_queue.lua` answer these, writing nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScriptRefusal {
    /// The queue does not exist (deleted, or being deleted).
    QueueNotFound,
    /// The queue was deleted and created again: re-read the registry.
    StaleEpoch,
    /// The consumer group was deleted while its worker ran.
    GroupDeleted,
    /// The namespace's cap on queues is reached.
    TooManyQueues,
    /// The queue's cap on groups is reached.
    TooManyGroups,
    /// The namespace's cap on recurring schedules is reached.
    TooManySchedules,
}

impl ScriptRefusal {
    /// The refusal an error carries, if any.
    pub(crate) fn of(e: &Error) -> Option<ScriptRefusal> {
        let Error::Redis { source, .. } = e else {
            return None;
        };
        let text = source.to_string();
        [
            ("delayq queue_not_found", ScriptRefusal::QueueNotFound),
            ("delayq stale_epoch", ScriptRefusal::StaleEpoch),
            ("delayq group_deleted", ScriptRefusal::GroupDeleted),
            ("delayq too_many_queues", ScriptRefusal::TooManyQueues),
            ("delayq too_many_groups", ScriptRefusal::TooManyGroups),
            ("delayq too_many_schedules", ScriptRefusal::TooManySchedules),
        ]
        .into_iter()
        .find(|(needle, _)| text.contains(needle))
        .map(|(_, r)| r)
    }
}

/// A ZSET score (a double holding whole milliseconds) as unix ms.
#[allow(clippy::cast_possible_truncation)]
pub(crate) fn score_to_ms(score: f64) -> i64 {
    // Scores are written from i64 milliseconds below 2^53, so they are exact integers.
    score.round() as i64
}
