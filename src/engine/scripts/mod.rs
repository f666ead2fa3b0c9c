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
pub mod tags;

pub use consume::*;
pub use orders::*;
pub use registry::*;

use crate::engine::error::Error;

/// Source of `lua/prelude.lua`: the helpers every script may use (`int()`), put into each
/// script's text by [`source`].
pub const PRELUDE_LUA: &str = include_str!("../../../lua/prelude.lua");

/// Source of `lua/keyed.lua`: the helpers of the scripts that keep a shard's key index
/// (issue 42), put into those scripts' text after the prelude by [`source_keyed`].
pub const KEYED_LUA: &str = include_str!("../../../lua/keyed.lua");

/// A script's text as Redis runs it, as [`source`], with the key index helpers
/// ([`KEYED_LUA`]) after the prelude.
pub fn source_keyed(file: &str) -> String {
    let (flags, file) = split_flags(file);
    let header: usize = file
        .split_inclusive('\n')
        .take_while(|l| l.starts_with("--"))
        .map(str::len)
        .sum();
    format!(
        "{flags}{}\n{PRELUDE_LUA}\n{KEYED_LUA}\n{}",
        &file[..header],
        &file[header..]
    )
}

/// The scripts built with [`source_keyed`]: those that keep a shard's key index.
pub const KEYED_SCRIPTS: [&str; 5] = ["enqueue", "dequeue", "cancel", "reschedule", "tag_bulk"];

/// The text of script `name` (the file name without `.lua`) from its file: [`source_keyed`]
/// for the [`KEYED_SCRIPTS`], [`source`] for the others.
pub fn source_named(name: &str, file: &str) -> String {
    if KEYED_SCRIPTS.contains(&name) {
        source_keyed(file)
    } else {
        source(file)
    }
}

/// The first line of a read-only script: Redis 7.0+ then runs it on read-only replicas and
/// under `maxmemory`, and refuses any write command in it.
pub const NO_WRITES: &str = "#!lua flags=no-writes\n";

/// A script's text as Redis runs it: its file's flags line (`#!lua ...`, when it has one),
/// its header (the leading `--` lines), then the prelude, then the rest of the file. The
/// SHA1 covers the whole text.
pub fn source(file: &str) -> String {
    let (flags, file) = split_flags(file);
    let header: usize = file
        .split_inclusive('\n')
        .take_while(|l| l.starts_with("--"))
        .map(str::len)
        .sum();
    format!(
        "{flags}{}\n{PRELUDE_LUA}\n{}",
        &file[..header],
        &file[header..]
    )
}

/// A script's flags line (`#!lua ...\n`, or nothing) and the rest of its text.
fn split_flags(text: &str) -> (&str, &str) {
    match text.strip_prefix("#!") {
        Some(_) => text.split_at(text.find('\n').map_or(text.len(), |i| i + 1)),
        None => ("", text),
    }
}

/// A script's text without its flags line: what servers before Redis 7.0, which know no
/// script flags, run (and what `delayq scripts export` writes, which runs everywhere).
pub fn legacy(text: &str) -> &str {
    split_flags(text).1
}

/// A read-only script (its file starts with [`NO_WRITES`]), in both forms: flagged for the
/// servers that know script flags, and without the flags line for the others.
pub(crate) struct ReadOnly {
    flagged: redis::Script,
    legacy: redis::Script,
}

impl ReadOnly {
    /// Both forms of `text` (a [`source`] starting with [`NO_WRITES`]).
    pub(crate) fn new(text: &str) -> ReadOnly {
        ReadOnly {
            flagged: redis::Script::new(text),
            legacy: redis::Script::new(legacy(text)),
        }
    }

    /// The form `server` runs: flagged on Redis 7.0+ and Valkey, plain on older servers
    /// and when the server is not known.
    pub(crate) fn for_server(
        &self,
        server: Option<crate::engine::version::ServerInfo>,
    ) -> &redis::Script {
        match server {
            Some(s) if s.has_script_flags() => &self.flagged,
            _ => &self.legacy,
        }
    }
}

/// Every script, by name (the file name without `.lua`), as every supported server runs it
/// (a read-only script without its flags line, see [`legacy`]): what `delayq scripts export`
/// writes for the SDKs, whose copies must match byte for byte.
pub fn all() -> Vec<(&'static str, &'static str)> {
    flagged().into_iter().map(|(n, t)| (n, legacy(t))).collect()
}

/// Every script, by name, as the engine runs it on a server that knows script flags.
pub fn flagged() -> Vec<(&'static str, &'static str)> {
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
        ("retire", RETIRE_LUA.as_str()),
        ("purge", PURGE_LUA.as_str()),
        ("join_group", JOIN_GROUP_LUA.as_str()),
        ("heartbeat", HEARTBEAT_LUA.as_str()),
        ("stats", admin::STATS_LUA.as_str()),
        ("history", admin::HISTORY_LUA.as_str()),
        ("redeliver", admin::REDELIVER_LUA.as_str()),
        ("ratelimit", admin::RATELIMIT_LUA.as_str()),
        ("schedule", schedules::SCHEDULE_LUA.as_str()),
        ("tick", schedules::TICK_LUA.as_str()),
        ("tag_bulk", tags::TAG_BULK_LUA.as_str()),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Commands that never write: a script calling only these is flagged `no-writes`.
    const READS: &[&str] = &[
        "EXISTS",
        "GET",
        "HGET",
        "HMGET",
        "HGETALL",
        "HLEN",
        "HEXISTS",
        "ZSCORE",
        "ZCARD",
        "ZCOUNT",
        "ZRANGE",
        "XLEN",
        "XRANGE",
        "XREVRANGE",
        "XINFO",
        "XPENDING",
        "TIME",
        "SMEMBERS",
        "SCARD",
        "PTTL",
    ];

    /// The commands a script's own text calls (`redis.call('X'` / `redis.pcall('X'`), upper
    /// case; a call whose command is not a literal reads as `?` (it may write).
    fn commands(text: &str) -> Vec<String> {
        let own = text.replacen(PRELUDE_LUA, "", 1).replacen(KEYED_LUA, "", 1);
        let mut out = Vec::new();
        for pat in ["redis.call(", "redis.pcall("] {
            for (i, _) in own.match_indices(pat) {
                let rest = own[i + pat.len()..].trim_start();
                let cmd = rest
                    .strip_prefix('\'')
                    .and_then(|r| r.split('\'').next())
                    .unwrap_or("?");
                out.push(cmd.to_ascii_uppercase());
            }
        }
        out
    }

    /// Every script's header (its leading `--` lines) states its cost in the sizes that
    /// matter and the oldest Redis it runs on (STYLE: a lookup whose cost grows with a
    /// setting must be seen before it ships).
    #[test]
    fn every_script_header_states_its_cost_and_its_minimum_redis() {
        for (name, text) in flagged() {
            let header: Vec<&str> = text
                .lines()
                .skip_while(|l| l.starts_with("#!"))
                .take_while(|l| l.starts_with("--"))
                .collect();
            let header = header.join("\n");
            assert!(
                header.contains("Cost:"),
                "{name}.lua: no Cost: line in its header"
            );
            assert!(
                header.contains("Redis >="),
                "{name}.lua: no minimum Redis version in its header"
            );
        }
    }

    #[test]
    fn every_read_only_script_is_flagged_no_writes_and_only_those() {
        let mut read_only = Vec::new();
        for (name, text) in flagged() {
            let cmds = commands(text);
            assert!(!cmds.is_empty(), "{name}.lua calls nothing?");
            let reads_only = cmds.iter().all(|c| READS.contains(&c.as_str()));
            assert_eq!(
                text.starts_with(NO_WRITES),
                reads_only,
                "{name}.lua: flagged {} but calls {cmds:?}",
                text.starts_with(NO_WRITES)
            );
            if reads_only {
                read_only.push(name);
            }
        }
        read_only.sort_unstable();
        assert_eq!(read_only, ["get", "history", "stats"]);
    }

    #[test]
    fn the_flags_line_stays_first_and_the_legacy_form_drops_only_it() {
        let text = source("#!lua flags=no-writes\n-- a.lua: a header\n-- more\nreturn 1\n");
        assert!(text.starts_with("#!lua flags=no-writes\n-- a.lua: a header\n-- more\n"));
        assert!(text.contains(PRELUDE_LUA));
        assert!(text.ends_with("return 1\n"));
        let plain = legacy(&text);
        assert!(plain.starts_with("-- a.lua: a header\n"));
        assert_eq!(&text[NO_WRITES.len()..], plain);
        // A script without a flags line is its own legacy form.
        let unflagged = source("-- b.lua\nreturn 2\n");
        assert!(unflagged.starts_with("-- b.lua\n"));
        assert_eq!(legacy(&unflagged), unflagged);
        for (name, t) in all() {
            assert!(
                !t.starts_with("#!"),
                "{name}: the export must run on Redis 6.2"
            );
        }
    }
}
