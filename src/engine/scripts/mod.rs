//! The Lua scripts in `lua/`, loaded at compile time, one typed wrapper each, grouped by who
//! runs them: [`orders`] (producers and the dispatcher), [`consume`] (workers), [`registry`]
//! (queues, groups and maintenance), [`schedules`] (recurring schedules and their ticks),
//! [`admin`] (statistics, order history and redelivery, the rate limiter). No script is
//! made (`Script::new`) anywhere else.
//!
//! Scripts are invoked by SHA (`EVALSHA`) and loaded again when Redis answers `NOSCRIPT`
//! (after a restart or `SCRIPT FLUSH`); [`redis::Script::invoke_async`] does both. Every
//! script's source is listed once, in [`all`].

pub mod admin;
pub mod consume;
pub mod orders;
pub mod registry;
pub mod schedules;

pub use consume::*;
pub use orders::*;
pub use registry::*;

use crate::engine::error::Error;

/// Source of `lua/prelude.lua`: the helpers every script may use (`int()`), put into each
/// script's text by [`source`].
pub const PRELUDE_LUA: &str = include_str!("../../../lua/prelude.lua");

/// A script's text as Redis runs it: its file's header (the leading `--` lines), then the
/// prelude, then the rest of the file. The SHA1 covers the whole text.
pub fn source(file: &str) -> String {
    let header: usize = file
        .split_inclusive('\n')
        .take_while(|l| l.starts_with("--"))
        .map(str::len)
        .sum();
    format!("{}\n{PRELUDE_LUA}\n{}", &file[..header], &file[header..])
}

/// Every script, by name (the file name without `.lua`), as the engine runs it: what
/// `delayq scripts export` writes for the SDKs, whose copies must match byte for byte.
pub fn all() -> Vec<(&'static str, &'static str)> {
    vec![
        ("enqueue", ENQUEUE_LUA.as_str()),
        ("dequeue", DEQUEUE_LUA.as_str()),
        ("cancel", CANCEL_LUA.as_str()),
        ("reschedule", RESCHEDULE_LUA.as_str()),
        ("get", GET_LUA.as_str()),
        ("read", READ_LUA.as_str()),
        ("reclaim", RECLAIM_LUA.as_str()),
        ("retry", RETRY_LUA.as_str()),
        ("dead", DEAD_LUA.as_str()),
        ("replay", REPLAY_LUA.as_str()),
        ("extend", EXTEND_LUA.as_str()),
        ("trim", TRIM_LUA.as_str()),
        ("consumers", CONSUMERS_LUA.as_str()),
        ("create_queue", CREATE_QUEUE_LUA.as_str()),
        ("fence", FENCE_LUA.as_str()),
        ("join_group", JOIN_GROUP_LUA.as_str()),
        ("heartbeat", HEARTBEAT_LUA.as_str()),
        ("stats", admin::STATS_LUA.as_str()),
        ("history", admin::HISTORY_LUA.as_str()),
        ("redeliver", admin::REDELIVER_LUA.as_str()),
        ("ratelimit", admin::RATELIMIT_LUA.as_str()),
        ("schedule", schedules::SCHEDULE_LUA.as_str()),
        ("tick", schedules::TICK_LUA.as_str()),
    ]
}

/// The SHA1 Redis knows `text` by (what `EVALSHA` takes).
pub fn sha1_of(text: &str) -> String {
    redis::Script::new(text).get_hash().to_owned()
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
