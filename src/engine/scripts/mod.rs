//! The Lua scripts in `lua/`, loaded at compile time, one typed wrapper each, grouped by who
//! runs them: [`orders`] (producers and the dispatcher), [`consume`] (workers), [`registry`]
//! (queues, groups and maintenance), [`schedules`] (recurring schedules and their ticks),
//! [`admin`] (statistics, order history and redelivery, the rate limiter), [`key_slots`]
//! (workers' slots per order key). No script is
//! made (`Script::new`) anywhere else.
//!
//! Scripts are invoked by SHA (`EVALSHA`) and loaded again when Redis answers `NOSCRIPT`
//! (after a restart or `SCRIPT FLUSH`); [`redis::Script::invoke_async`] does both. Every
//! script's source is listed once, in [`all`].

pub mod admin;
pub mod consume;
pub mod key_slots;
pub mod orders;
pub mod registry;
pub mod schedules;
pub mod tags;

pub use consume::*;
pub use orders::*;
pub use registry::*;

use crate::engine::error::Error;

/// The helpers a script may include, by name (`lua/include/<name>.lua`). A script names
/// the ones it calls in its header (`-- @include int, wake`); an include may name others
/// the same way. [`source`] puts them into the script's text after its header, each once,
/// an include's own includes before it.
pub const INCLUDES: [(&str, &str); 8] = [
    ("int", include_str!("../../../lua/include/int.lua")),
    ("wake", include_str!("../../../lua/include/wake.lua")),
    ("tags", include_str!("../../../lua/include/tags.lua")),
    (
        "stream_ids",
        include_str!("../../../lua/include/stream_ids.lua"),
    ),
    ("groups", include_str!("../../../lua/include/groups.lua")),
    ("lanes", include_str!("../../../lua/include/lanes.lua")),
    ("keyed", include_str!("../../../lua/include/keyed.lua")),
    (
        "unschedule",
        include_str!("../../../lua/include/unschedule.lua"),
    ),
];

/// The names a text's header (its leading `--` lines) includes (`-- @include a, b`).
pub fn includes_of(text: &str) -> Vec<&str> {
    text.lines()
        .skip_while(|l| l.starts_with("#!"))
        .take_while(|l| l.starts_with("--"))
        .filter_map(|l| l.strip_prefix("-- @include "))
        .flat_map(|names| names.split(','))
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect()
}

/// Appends include `name` (after its own includes) to `out`, once.
fn resolve<'a>(name: &'a str, out: &mut Vec<(&'a str, &'static str)>) {
    if out.iter().any(|(n, _)| *n == name) {
        return;
    }
    let Some(&(name, text)) = INCLUDES.iter().find(|(n, _)| *n == name) else {
        // The scripts are the crate's own files: a unit test loads every one.
        panic!("lua: no include named {name:?} (lua/include/)");
    };
    for dep in includes_of(text) {
        resolve(dep, out);
    }
    out.push((name, text));
}

/// The includes a script's text gets, in order: each named include after its own.
pub fn resolved_includes(file: &str) -> Vec<(&str, &'static str)> {
    let mut out = Vec::new();
    for name in includes_of(file) {
        resolve(name, &mut out);
    }
    out
}

/// The first line of a read-only script: Redis 7.0+ then runs it on read-only replicas and
/// under `maxmemory`, and refuses any write command in it.
pub const NO_WRITES: &str = "#!lua flags=no-writes\n";

/// A script's text as Redis runs it: its file's flags line (`#!lua ...`, when it has one),
/// its header (the leading `--` lines), then the includes its header names
/// ([`resolved_includes`]), then the rest of the file. The SHA1 covers the whole text.
pub fn source(file: &str) -> String {
    let (flags, file) = split_flags(file);
    let header: usize = file
        .split_inclusive('\n')
        .take_while(|l| l.starts_with("--"))
        .map(str::len)
        .sum();
    let mut text = format!("{flags}{}", &file[..header]);
    for (_, inc) in resolved_includes(file) {
        text.push('\n');
        text.push_str(inc);
    }
    text.push('\n');
    text.push_str(&file[header..]);
    text
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
        ("order_rules", tags::ORDER_RULES_LUA.as_str()),
        ("key_slots", key_slots::KEY_SLOTS_LUA.as_str()),
        ("park", key_slots::PARK_LUA.as_str()),
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
        // Includes too: a script includes only the helpers it calls.
        let own = text;
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

    /// A script with one KEYS arity refuses any other count, and the count it checks is the
    /// one its header documents (the highest `KEYS[n]` there, none of them optional).
    #[test]
    fn a_script_with_one_keys_arity_checks_the_count_its_header_documents() {
        let mut fixed = Vec::new();
        for (name, text) in flagged() {
            let Some(i) = text.find("if #KEYS ~= ") else {
                continue;
            };
            let checked: usize = text[i + "if #KEYS ~= ".len()..]
                .split(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{name}.lua: #KEYS compared with a number"));
            let header: Vec<&str> = text
                .lines()
                .skip_while(|l| l.starts_with("#!"))
                .take_while(|l| l.starts_with("--"))
                .collect();
            let documented = header
                .iter()
                .flat_map(|l| {
                    l.match_indices("KEYS[")
                        .map(move |(j, p)| &l[j + p.len()..])
                })
                .filter_map(|rest| rest.split(']').next()?.parse::<usize>().ok())
                .max();
            assert_eq!(documented, Some(checked), "{name}.lua");
            assert!(
                !header
                    .iter()
                    .any(|l| l.starts_with("-- KEYS[") && l.contains("optional")),
                "{name}.lua: an optional key beside a fixed count"
            );
            fixed.push(name);
        }
        fixed.sort_unstable();
        assert_eq!(
            fixed,
            [
                "cancel",
                "dequeue",
                "enqueue",
                "fence",
                "get",
                "replay",
                "reschedule",
                "stats",
                "tag_bulk"
            ]
        );
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

    /// The helper functions (`local function name(`) a text defines.
    fn defined(text: &str) -> Vec<&str> {
        text.match_indices("local function ")
            .filter_map(|(i, p)| text[i + p.len()..].split('(').next())
            .collect()
    }

    /// Whether `text`, without its comment lines, calls function `f`.
    fn calls(text: &str, f: &str) -> bool {
        text.lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .any(|l| {
                l.match_indices(&format!("{f}(")).any(|(i, _)| {
                    let before = l[..i].chars().next_back();
                    !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.')
                        && !l[..i].ends_with("local function ")
                })
            })
    }

    /// Each script includes exactly what it calls: every helper it (or an include it gets)
    /// calls is defined by an include it gets, and every include it names is called.
    #[test]
    fn every_script_includes_the_helpers_it_calls_and_only_those() {
        let helpers: Vec<(&str, &str)> = INCLUDES
            .iter()
            .flat_map(|(inc, text)| defined(text).into_iter().map(move |f| (f, *inc)))
            .collect();
        assert!(helpers.len() > 10, "{helpers:?}");
        for (name, text) in flagged() {
            let got: Vec<&str> = resolved_includes(legacy(text))
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            for (f, inc) in &helpers {
                if calls(text, f) {
                    assert!(
                        got.contains(inc),
                        "{name}.lua calls {f} but does not include {inc}"
                    );
                }
            }
            for inc in includes_of(legacy(text)) {
                let (_, inc_text) = INCLUDES.iter().find(|(n, _)| *n == inc).unwrap();
                let used = defined(inc_text).iter().any(|f| {
                    let without: String = text.replacen(inc_text, "", 1);
                    calls(&without, f)
                });
                assert!(
                    used,
                    "{name}.lua includes {inc} but calls none of its helpers"
                );
            }
        }
    }

    #[test]
    fn the_flags_line_stays_first_and_the_legacy_form_drops_only_it() {
        let text = source("#!lua flags=no-writes\n-- a.lua: a header\n-- @include int\nreturn 1\n");
        assert!(text.starts_with("#!lua flags=no-writes\n-- a.lua: a header\n-- @include int\n"));
        assert!(text.contains(INCLUDES[0].1));
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
