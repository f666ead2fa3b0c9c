//! Names: validated queue names, and the one place where Redis key names are made.
//!
//! Every key of one shard of one queue shares the hash tag `{<ns>:<queue>:<shard>}`, so a
//! script touching them runs on one Redis Cluster slot. See ARCHITECTURE.md for the layout.

use crate::engine::error::InvalidInput;
use crate::engine::priority::Priority;
use std::fmt;

/// Longest queue name or namespace, in bytes.
pub const MAX_NAME_LEN: usize = 64;
/// Longest order id, in bytes.
pub const MAX_ID_LEN: usize = 256;

/// A queue name: `[A-Za-z0-9._-]{1,64}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueName(String);

impl QueueName {
    /// Validates `name`.
    pub fn new(name: &str) -> Result<Self, InvalidInput> {
        check_name(name).map_err(|reason| InvalidInput::QueueName {
            name: name.to_owned(),
            reason,
        })?;
        Ok(QueueName(name.to_owned()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks the `[A-Za-z0-9._-]{1,64}` rule shared by queue names and namespaces.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name == "." || name == ".." {
        return Err(format!("{name:?} is reserved"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "must be at most {MAX_NAME_LEN} bytes, got {}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "character {c:?} is not allowed (use A-Z a-z 0-9 . _ -)"
        ));
    }
    Ok(())
}

/// Validates an order id: 1..=256 bytes of UTF-8 with no control characters.
pub fn validate_id(id: &str) -> Result<(), InvalidInput> {
    validate_text(id, MAX_ID_LEN).map_err(|reason| InvalidInput::Id { reason })
}

/// Validates a consumer group or consumer name (same rule as ids, at most 128 bytes).
pub fn validate_member_name(field: &'static str, name: &str) -> Result<(), InvalidInput> {
    validate_text(name, 128).map_err(|reason| InvalidInput::Name { field, reason })
}

/// The id rule (1..=`max` bytes of UTF-8, no control characters), as a reason; shared by
/// ids, member names and order keys ([`crate::engine::order_key`]).
pub(crate) fn validate_text(s: &str, max: usize) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > max {
        return Err(format!("must be at most {max} bytes, got {}", s.len()));
    }
    if let Some(pos) = s.chars().position(char::is_control) {
        return Err(format!("control character at position {pos}"));
    }
    Ok(())
}

/// The key namespace (default `dq`) that prefixes every key delayq writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyspace {
    ns: String,
}

impl Keyspace {
    /// Validates `namespace` (`[A-Za-z0-9._-]{1,64}`).
    pub fn new(namespace: &str) -> Result<Self, InvalidInput> {
        check_name(namespace).map_err(|reason| InvalidInput::Namespace {
            name: namespace.to_owned(),
            reason,
        })?;
        Ok(Keyspace {
            ns: namespace.to_owned(),
        })
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.ns
    }

    /// The keys of one shard of `queue`.
    pub fn shard(&self, queue: &QueueName, shard: u16) -> ShardKeys {
        let tag = format!("{{{}:{}:{}}}", self.ns, queue, shard);
        ShardKeys {
            due: format!("{tag}:due"),
            payload: format!("{tag}:payload"),
            levels: format!("{tag}:levels"),
            stream: format!("{tag}:stream"),
            dead: format!("{tag}:dead"),
            meta: format!("{tag}:meta"),
            dispatched: format!("{tag}:dispatched"),
            debounce: format!("{tag}:debounce"),
            tags: format!("{tag}:tags"),
            keyed: format!("{tag}:keyed"),
            key_ring: format!("{tag}:key_ring"),
            remembered: format!("{tag}:remembered"),
            level: Priority::Normal,
            lane: tag.clone(),
            tag,
            shard,
        }
    }

    /// SET of the registered queue names (the registry's index).
    pub fn queues(&self) -> String {
        format!("{{{}}}:queues", self.ns)
    }

    /// HASH: one queue's registry record (`shards`, `epoch`, `history_retention_ms`, the
    /// pause flags as last set).
    pub fn queue_record(&self, queue: &QueueName) -> String {
        format!("{{{}}}:queue:{}", self.ns, queue)
    }

    /// STRING: a posted event's id, kept for the longest `remember` window of the rules it
    /// matched (see [`crate::engine::events`]): a repeated post with that id does nothing.
    pub fn event_id(&self, id: &str) -> String {
        format!("{{{}}}:event:{}", self.ns, id)
    }

    /// SET of the queues being deleted: their records are marked `deleting` and their keys
    /// are still being removed (finished by the housekeeper when a delete was cut off).
    pub fn deleting(&self) -> String {
        format!("{{{}}}:deleting", self.ns)
    }

    /// ZSET: the dispatch roster, member `<queue>\x01<process id>` scored by its expiry (unix
    /// ms): which processes dispatch which queue (see [`crate::engine::roster`]).
    pub fn dispatchers(&self) -> String {
        format!("{{{}}}:dispatchers", self.ns)
    }

    /// STRING: a counter bumped by every change of the registry (a queue created, deleted
    /// or changed), so a supervisor sees a change with one `GET`.
    pub fn registry_version(&self) -> String {
        format!("{{{}}}:registry:version", self.ns)
    }

    /// Never written: `/readyz` deletes it, a write that changes nothing (and is not
    /// replicated) but that Redis refuses exactly when it refuses writes (a replica, a
    /// master short of `min-replicas-to-write` replicas).
    pub fn readiness_probe(&self) -> String {
        format!("{{{}}}:readyz", self.ns)
    }

    /// STRING (expiring after a minute): the write a replication barrier waits for
    /// ([`crate::Client::replicated_barrier`]).
    pub fn replication_barrier(&self) -> String {
        format!("{{{}}}:replicated", self.ns)
    }

    /// HASH: one recurring schedule's record (`spec` JSON, `gen`, `next`, `last`, `ticks`,
    /// `missed`, `created_ms`, `updated_ms`; see `lua/schedule.lua`).
    pub fn schedule_record(&self, queue: &QueueName, id: &str) -> String {
        format!("{{{}}}:schedule:{}:{id}", self.ns, queue)
    }

    /// ZSET: every recurring schedule of the namespace, member `<queue>:<id>` scored by its
    /// next tick (unix ms): what the schedulers poll.
    pub fn schedules(&self) -> String {
        format!("{{{}}}:schedules", self.ns)
    }

    /// ZSET: every recurring schedule of the namespace whatever its state (paused, ended),
    /// member `<queue>:<id>`, score 0 (read by lexical range): what lists and the cap count.
    pub fn schedules_all(&self) -> String {
        format!("{{{}}}:schedules:all", self.ns)
    }

    /// HASH: the namespace's schedule totals: `gen` (the last generation given to a
    /// schedule change) and `cost` (the sum of the schedules' costs; see `lua/schedule.lua`).
    pub fn schedules_totals(&self) -> String {
        format!("{{{}}}:schedules:totals", self.ns)
    }

    /// STRING: marks a dashboard session revoked by its sign-out (expires with the session).
    pub fn ui_revoked(&self, nonce: &str) -> String {
        format!("{{{}}}:ui:revoked:{nonce}", self.ns)
    }

    /// ZSET of a queue's live consumers (heartbeats). Under shard 0's hash tag, so each
    /// queue's heartbeats land in its own cluster slot, not in the namespace's.
    pub fn alive(&self, queue: &QueueName) -> String {
        format!("{}:alive", self.shard(queue, 0).tag)
    }

    /// STRING: the rate-limit state (GCRA) of `group` on `queue`, under shard 0's hash tag.
    pub fn rate(&self, queue: &QueueName, group: &str) -> String {
        format!("{}:rate:{group}", self.shard(queue, 0).tag)
    }

    /// The per-key slots of `group` on `queue` (`key_concurrency`, `key_sequence`: see
    /// `lua/key_slots.lua`), under shard 0's hash tag like the group's other cross-shard
    /// state: a key's orders live on every shard, its slots in one place.
    pub fn key_slots(&self, queue: &QueueName, group: &str) -> KeySlotKeys {
        let base = format!("{}:keyslots:{group}", self.shard(queue, 0).tag);
        KeySlotKeys {
            holders: format!("{base}:holders"),
            counts: format!("{base}:counts"),
            waiters: format!("{base}:waiters"),
            active: format!("{base}:active"),
            entries: format!("{base}:entries"),
        }
    }

    /// `SCAN MATCH` patterns covering every key of the namespace: the queues' shard keys
    /// (`{<ns>:<queue>:<shard>}:...`) and the namespace's own (`{<ns>}:...`).
    pub fn namespace_patterns(&self) -> [String; 2] {
        [format!("{{{}:*", self.ns), format!("{{{}}}:*", self.ns)]
    }

    /// `SCAN MATCH` pattern of every history bucket of every shard of `queue`.
    pub fn history_pattern(&self, queue: &QueueName) -> String {
        format!("{{{}:{}:*}}:history:*", self.ns, queue)
    }

    /// ZSET of `delayq bench`'s ceiling scenario (plain `ZADD` throughput, no queue).
    pub fn bench_ceiling(&self) -> String {
        format!("{{{}}}:ceiling", self.ns)
    }

    /// The keys of every shard of `queue`, shard 0 first.
    pub fn shards(&self, queue: &QueueName, count: u16) -> Vec<ShardKeys> {
        (0..count).map(|s| self.shard(queue, s)).collect()
    }
}

/// A group's per-key slots (see [`Keyspace::key_slots`] and `lua/key_slots.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySlotKeys {
    /// ZSET: `"<key>\x1f<lane>:<entry id>"` scored by until when the hold lasts (unix ms).
    pub holders: String,
    /// HASH: key -> its holds.
    pub counts: String,
    /// ZSET, every score 0: `"<key>\x1f<due ms, 16 digits>\x1f<lane>:<entry id>"` of the
    /// entries parked for a slot of their key.
    pub waiters: String,
    /// ZSET: key -> holds + waiters, for each key that has either.
    pub active: String,
    /// HASH: `"<lane>:<entry id>"` -> key, for each hold.
    pub entries: String,
}

impl KeySlotKeys {
    /// All five, in `key_slots.lua`'s KEYS order.
    pub fn all(&self) -> [&str; 5] {
        [
            &self.holders,
            &self.counts,
            &self.waiters,
            &self.active,
            &self.entries,
        ]
    }
}

/// The keys of one shard of one queue. All share one hash tag.
///
/// A shard has one *lane* per [`Priority`]: the stream its due orders of that level go to,
/// and each group's timers and errors for that stream. `normal` is the lane every queue had
/// before priorities (`{tag}:stream`, `{tag}:timers:<group>`, ...); `high` and `low` put
/// their level before the same names (`{tag}:high:stream`, `{tag}:high:timers:<group>`),
/// which no other key of the tag starts with. [`ShardKeys::lane`] gives a lane's keys; the
/// scheduling keys (`due`, `payload`, `levels`), the dead letters and the marker are the
/// shard's, shared by its lanes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardKeys {
    /// ZSET: order id scored by due time (unix ms).
    pub due: String,
    /// HASH: order id -> `"<enqueued_ms>:<payload JSON>"`.
    pub payload: String,
    /// HASH: order id -> level (`high` or `low`) of the scheduled orders that are not
    /// `normal` (absent for `normal` ones, so a queue that never uses priorities has none).
    pub levels: String,
    /// STREAM: dispatched orders of this lane's level, read by consumer groups.
    pub stream: String,
    /// STREAM: dead letters of every group of this shard.
    pub dead: String,
    /// HASH: the shard's marker. `epoch` (the queue's, while it exists: `enqueue.lua`
    /// refuses to write without it), `paused` (dispatch) and `paused:<group>` (a group's
    /// reads), checked inside the scripts that dispatch and read.
    pub meta: String,
    /// ZSET: order id scored by its last dispatch (unix ms), kept while the queue has a dedup
    /// window (see [`crate::engine::time_rules`]).
    pub dispatched: String,
    /// HASH: order id -> `"<first call ms>:<cap ms>"` of a waiting debounced order.
    pub debounce: String,
    /// ZSET, score 0: the tag index, one member `<tag>\x1f<id>` per tag of each scheduled
    /// order (see [`crate::engine::tags`]); absent while the shard has no tagged order.
    pub tags: String,
    /// ZSET, every score 0: the key index, one member `"<key>\x1f<due ms, 16
    /// digits>\x1f<order id>"` per keyed scheduled order (see
    /// [`crate::engine::order_key`], `lua/keyed.lua`).
    pub keyed: String,
    /// ZSET: the keys that have scheduled orders, each scored by its earliest due time
    /// (at least the time it was last served): the dispatcher's fair-share rotation.
    pub key_ring: String,
    /// ZSET: cancel-on-event match tokens of events that arrived, each scored by until when
    /// it is remembered, unix ms (see [`crate::engine::events`]); at most
    /// [`crate::engine::events::MAX_REMEMBERED`] members.
    pub remembered: String,
    /// The hash tag, `{<ns>:<queue>:<shard>}`.
    pub tag: String,
    /// The shard's index.
    pub shard: u16,
    /// The lane's level (`normal` for the keys [`Keyspace::shard`] gives).
    pub level: Priority,
    /// What the lane's stream, timers and errors keys start with: the tag, then the level
    /// for `high` and `low`.
    lane: String,
}

impl ShardKeys {
    /// The keys of this shard's lane of `level`: its stream, timers and errors; every other
    /// key is the shard's.
    pub fn lane(&self, level: Priority) -> ShardKeys {
        let lane = match level {
            Priority::Normal => self.tag.clone(),
            other => format!("{}:{}", self.tag, other.as_str()),
        };
        ShardKeys {
            stream: format!("{lane}:stream"),
            level,
            lane,
            ..self.clone()
        }
    }

    /// This shard's lanes, most urgent first.
    pub fn lanes(&self) -> [ShardKeys; 3] {
        Priority::ALL.map(|p| self.lane(p))
    }

    /// The shard's wake-up channel, `{tag}:wake` (the due key with `wake` for `due`: the
    /// scripts derive it that way, `lua/include/wake.lua`): writers that make the shard's
    /// earliest due time earlier publish that time there (`SPUBLISH`, `PUBLISH` on 6.2).
    pub fn wake_channel(&self) -> String {
        format!("{}:wake", self.tag)
    }

    /// The marker field (of [`ShardKeys::meta`]) `dequeue.lua` sets once it has made this
    /// lane's stream: readers learn from it that the lane is in use.
    pub fn lane_marker(&self) -> String {
        format!("lane:{}", self.level.as_str())
    }

    /// ZSET of `group`'s timers in this lane: entry id scored by the unix ms after which it
    /// may be taken (lease end of an entry being handled, or the time of its next attempt).
    pub fn timers(&self, group: &str) -> String {
        format!("{}:timers:{group}", self.lane)
    }

    /// HASH of `group`'s failed attempts in this lane: entry id -> `"<attempt>:<error>"`,
    /// for entries still pending (the order history's `retrying` and `last_error`).
    pub fn errors(&self, group: &str) -> String {
        format!("{}:errors:{group}", self.lane)
    }

    /// HASH: schedule id -> the latest tick instant (unix ms) of that recurring schedule
    /// enqueued in this shard, so each tick is enqueued at most once (`lua/tick.lua`).
    pub fn ticks(&self) -> String {
        format!("{}:ticks", self.tag)
    }

    /// STRING (expiring): the generation at which recurring schedule `schedule` was removed,
    /// so a scheduler that read it before the removal cannot enqueue a tick here after it.
    pub fn tick_tombstone(&self, schedule: &str) -> String {
        format!("{}:ticks:gone:{schedule}", self.tag)
    }

    /// HASH of one order-history bucket: order id -> `"<entry id>:<due ms>"` of the
    /// orders dispatched in bucket `bucket` (of `bucket_ms` milliseconds), plus the markers
    /// of entries that died or needed several attempts. Expires on its own (see
    /// [`crate::engine::history`]).
    pub fn history(&self, bucket_ms: i64, bucket: i64) -> String {
        format!("{}:history:{bucket_ms}:{bucket}", self.tag)
    }

    /// ZSET: bucket number -> when (unix ms) a marker was last written into that history
    /// bucket of this shard. Markers land in the bucket of their entry's time, which may be
    /// sealed (no longer written by dispatches); the stats' count cache re-counts the
    /// buckets touched since it last looked (see [`crate::engine::history_counts`]).
    pub fn history_touched(&self) -> String {
        format!("{}:history:touched", self.tag)
    }
}

/// The shard of an order id: FNV-1a (64-bit) of the id's UTF-8 bytes, modulo `shards`.
///
/// Stable across processes, versions and languages (documented in ARCHITECTURE.md), so
/// cancel, get and reschedule go straight to the order's shard.
pub fn shard_of(id: &str, shards: u16) -> u16 {
    if shards <= 1 {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // The remainder is < shards <= u16::MAX, so the conversion cannot fail.
    u16::try_from(h % u64::from(shards)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names() {
        assert!(QueueName::new("order-close.v2_x").is_ok());
        assert!(QueueName::new("").is_err());
        assert!(QueueName::new(".").is_err());
        assert!(QueueName::new("..").is_err());
        assert!(QueueName::new("a..b").is_ok());
        assert!(QueueName::new("a:b").is_err());
        assert!(QueueName::new("a b").is_err());
        assert!(QueueName::new(&"x".repeat(65)).is_err());
        assert!(QueueName::new(&"x".repeat(64)).is_ok());
    }

    #[test]
    fn ids() {
        assert!(validate_id("order-1234").is_ok());
        assert!(validate_id("заказ:42 ✓").is_ok());
        assert!(validate_id("").is_err());
        assert!(validate_id("a\nb").is_err());
        assert!(validate_id(&"x".repeat(257)).is_err());
        assert!(validate_id(&"x".repeat(256)).is_ok());
    }

    #[test]
    fn key_layout() {
        let ks = Keyspace::new("dq").unwrap();
        let q = QueueName::new("order-close").unwrap();
        let k = ks.shard(&q, 7);
        assert_eq!(k.due, "{dq:order-close:7}:due");
        assert_eq!(k.payload, "{dq:order-close:7}:payload");
        assert_eq!(k.stream, "{dq:order-close:7}:stream");
        assert_eq!(k.dead, "{dq:order-close:7}:dead");
        assert_eq!(k.meta, "{dq:order-close:7}:meta");
        assert_eq!(ks.queues(), "{dq}:queues");
        assert_eq!(ks.queue_record(&q), "{dq}:queue:order-close");
        assert_eq!(ks.registry_version(), "{dq}:registry:version");
        assert_eq!(ks.alive(&q), "{dq:order-close:0}:alive");
        assert_eq!(ks.rate(&q, "wh"), "{dq:order-close:0}:rate:wh");
        assert_eq!(k.timers("close"), "{dq:order-close:7}:timers:close");
        assert_eq!(k.errors("close"), "{dq:order-close:7}:errors:close");
        assert_eq!(
            k.history(3_600_000, 5),
            "{dq:order-close:7}:history:3600000:5"
        );
        assert_eq!(k.levels, "{dq:order-close:7}:levels");
        assert_eq!(k.keyed, "{dq:order-close:7}:keyed");
        assert_eq!(k.key_ring, "{dq:order-close:7}:key_ring");
        let high = k.lane(Priority::High);
        assert_eq!(high.stream, "{dq:order-close:7}:high:stream");
        assert_eq!(high.timers("close"), "{dq:order-close:7}:high:timers:close");
        assert_eq!(high.errors("close"), "{dq:order-close:7}:high:errors:close");
        assert_eq!(high.due, k.due);
        assert_eq!(high.dead, k.dead);
        assert_eq!(high.lane_marker(), "lane:high");
        assert_eq!(k.lane(Priority::Normal), k);
        assert_eq!(k.lanes()[2].stream, "{dq:order-close:7}:low:stream");
    }

    #[test]
    fn shard_function_is_fnv1a() {
        // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c (published test vector).
        assert_eq!(shard_of("a", 1), 0);
        assert_eq!(
            u64::from(shard_of("a", 1000)),
            0xaf63_dc4c_8601_ec8c_u64 % 1000
        );
        let counts = (0..8000).fold([0u32; 8], |mut acc, i| {
            acc[usize::from(shard_of(&format!("order-{i}"), 8))] += 1;
            acc
        });
        assert!(counts.iter().all(|&c| c > 800), "skewed: {counts:?}");
    }
}
