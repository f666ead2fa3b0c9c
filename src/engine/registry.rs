//! The queue registry: a queue exists once registered, and its record holds its shard count.
//!
//! `{ns}:queue:<q>` (HASH, field `shards`) and `{ns}:queues` (SET of names). Producer and
//! admin calls on an unregistered queue fail with [`Error::QueueNotFound`] and write
//! nothing; they use the shard count of the record, so no surface ever sees a subset of a
//! queue's shards. Dispatchers and workers register their queue when they start, with their
//! client's shard count, and refuse a queue registered with another
//! ([`Error::ShardMismatch`]).
//!
//! A client caches the shard counts it has seen (they never change). A queue deleted by
//! another process stays known to this one until it restarts.

use crate::engine::client::{Client, MAX_SHARDS};
use crate::engine::history::{HistoryPolicy, RETENTION_FIELD};
use crate::engine::keys::{QueueName, ShardKeys};
use crate::error::{Error, InvalidInput, RedisContext, Result};
use serde::Serialize;

/// A registered queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueInfo {
    /// The name.
    pub queue: String,
    /// Its shard count, fixed at creation.
    pub shards: u16,
    /// Whether dispatch is paused.
    pub paused: bool,
    /// How long the history of its dispatched orders is kept, ms (0: none).
    pub history_retention_ms: i64,
}

/// What [`Client::create_queue`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueCreated {
    /// The name.
    pub queue: String,
    /// Its shard count.
    pub shards: u16,
    /// False when it already existed with that shard count.
    pub created: bool,
}

/// What is still in a queue: why a delete without `force` was refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct QueueContents {
    /// Orders scheduled.
    pub scheduled: u64,
    /// Entries pending in some group (taken, not settled).
    pub pending: u64,
    /// Dead letters.
    pub dead: u64,
}

/// A consumer that read or sent a heartbeat within this window counts as alive: its group
/// is not deleted without `force`.
pub const GROUP_ALIVE_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);
/// How often a running worker says it is alive (well within [`GROUP_ALIVE_WITHIN`]).
pub const HEARTBEAT_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
/// Heartbeats older than this are dropped (the key stays bounded by the consumers of the
/// last hour).
const HEARTBEAT_KEPT_MS: i64 = 3_600_000;

impl QueueContents {
    fn is_empty(&self) -> bool {
        self.scheduled == 0 && self.pending == 0 && self.dead == 0
    }
}

impl Client {
    /// Registers `queue` with `shards` shards. Idempotent: an existing queue with that count
    /// answers `created: false`; one with another count is refused
    /// ([`Error::ShardMismatch`]) and left as it is.
    pub async fn create_queue(&self, queue: &str, shards: u16) -> Result<QueueCreated> {
        let q = QueueName::new(queue)?;
        if !(1..=MAX_SHARDS).contains(&shards) {
            return Err(InvalidInput::Option {
                name: "shards",
                reason: format!("must be 1..={MAX_SHARDS}, got {shards}"),
            }
            .into());
        }
        let meta = self.queue_meta_key(&q);
        let (created, _, stored): (i64, i64, Option<u16>) = redis::pipe()
            .cmd("HSETNX")
            .arg(&meta)
            .arg("shards")
            .arg(shards)
            .cmd("SADD")
            .arg(self.queues_key())
            .arg(q.as_str())
            .cmd("HGET")
            .arg(&meta)
            .arg("shards")
            .query_async(&mut self.connection())
            .await
            .ctx("registering the queue")?;
        let stored = stored.ok_or_else(|| Error::Reply {
            context: "registering the queue",
            detail: "the queue record has no shard count".into(),
        })?;
        if stored != shards {
            return Err(Error::ShardMismatch {
                queue: queue.to_owned(),
                existing: stored,
                wanted: shards,
            });
        }
        self.remember(&q, stored);
        Ok(QueueCreated {
            queue: queue.to_owned(),
            shards,
            created: created == 1,
        })
    }

    /// A registered queue, or `None`.
    pub async fn queue_info(&self, queue: &str) -> Result<Option<QueueInfo>> {
        let q = QueueName::new(queue)?;
        match self.lookup(&q).await? {
            Some(shards) => {
                let flags = self.queue_flags(&q, None).await?;
                Ok(Some(QueueInfo {
                    queue: queue.to_owned(),
                    shards,
                    paused: flags.paused,
                    history_retention_ms: flags.history.retention_ms(),
                }))
            }
            None => Ok(None),
        }
    }

    /// Every registered queue, sorted by name.
    pub async fn list_queues(&self) -> Result<Vec<QueueInfo>> {
        let names = self.queues().await?;
        let mut pipe = redis::pipe();
        for n in &names {
            let q = QueueName::new(n)?;
            pipe.cmd("HMGET")
                .arg(self.queue_meta_key(&q))
                .arg("shards")
                .arg(crate::engine::flow::pause_field(None))
                .arg(RETENTION_FIELD);
        }
        let records: Vec<(Option<u16>, Option<String>, Option<i64>)> = pipe
            .query_async(&mut self.connection())
            .await
            .ctx("reading the queue registry")?;
        Ok(names
            .into_iter()
            .zip(records)
            .filter_map(|(queue, (shards, paused, history))| {
                shards.map(|shards| QueueInfo {
                    queue,
                    shards,
                    paused: paused.is_some(),
                    history_retention_ms: history
                        .map_or_else(HistoryPolicy::default, HistoryPolicy::from_ms)
                        .retention_ms(),
                })
            })
            .collect())
    }

    /// Deletes `queue` and every key of it (schedule, payloads, streams, groups, timers, dead
    /// letters, its record). Without `force` it is refused ([`Error::QueueNotEmpty`]) while
    /// anything is scheduled, pending in a group or dead. Returns what it held.
    pub async fn delete_queue(&self, queue: &str, force: bool) -> Result<QueueContents> {
        let q = QueueName::new(queue)?;
        let shards = self.shards_of(&q).await?;
        let keys = self.keyspace().shards(&q, shards);
        let stats = self.stats(queue).await?;
        let contents = QueueContents {
            scheduled: stats.scheduled,
            pending: stats.groups.iter().map(|g| g.pending).sum(),
            dead: stats.dead,
        };
        if !force && !contents.is_empty() {
            return Err(Error::QueueNotEmpty {
                queue: queue.to_owned(),
                scheduled: contents.scheduled,
                pending: contents.pending,
                dead: contents.dead,
            });
        }
        let groups: Vec<String> = stats.groups.iter().map(|g| g.group.clone()).collect();
        let history = self.queue_flags(&q, None).await?.history;
        for k in &keys {
            delete_shard(self, k, &groups, &history).await?;
        }
        let _: (i64, i64) = redis::pipe()
            .cmd("DEL")
            .arg(self.queue_meta_key(&q))
            .arg(self.alive_key(&q))
            .cmd("SREM")
            .arg(self.queues_key())
            .arg(q.as_str())
            .query_async(&mut self.connection())
            .await
            .ctx("deleting the queue record")?;
        self.inner_known().remove(q.as_str());
        Ok(contents)
    }

    /// Deletes consumer group `group` on every shard of `queue`, with its timers, so stream
    /// trimming no longer waits for it. Refused ([`Error::GroupBusy`]) while a consumer of it
    /// read within the last minute, unless `force`; [`Error::GroupNotFound`] when no shard
    /// has it. Returns the entries that were pending in it (they are dropped).
    pub async fn delete_group(&self, queue: &str, group: &str, force: bool) -> Result<u64> {
        let q = QueueName::new(queue)?;
        crate::engine::keys::validate_member_name("group", group)?;
        let keys = self.registered_keys(&q).await?;
        let stats = self.stats(queue).await?;
        let Some(g) = stats.groups.iter().find(|g| g.group == group) else {
            return Err(Error::GroupNotFound {
                queue: queue.to_owned(),
                group: group.to_owned(),
            });
        };
        let alive_ms = u64::try_from(GROUP_ALIVE_WITHIN.as_millis()).unwrap_or(u64::MAX);
        if !force && g.idle_ms.is_some_and(|i| i < alive_ms) {
            return Err(Error::GroupBusy {
                queue: queue.to_owned(),
                group: group.to_owned(),
                alive_ms,
            });
        }
        for k in &keys {
            let mut conn = self.connection();
            let exists: bool = redis::cmd("EXISTS")
                .arg(&k.stream)
                .query_async(&mut conn)
                .await
                .ctx("deleting the consumer group")?;
            if exists {
                let _: i64 = redis::cmd("XGROUP")
                    .arg("DESTROY")
                    .arg(&k.stream)
                    .arg(group)
                    .query_async(&mut conn)
                    .await
                    .ctx("deleting the consumer group (XGROUP DESTROY)")?;
            }
            let _: i64 = redis::cmd("DEL")
                .arg(k.timers(group))
                .arg(k.errors(group))
                .query_async(&mut conn)
                .await
                .ctx("deleting the group's timers")?;
        }
        Ok(g.pending)
    }

    /// The ZSET of a queue's live consumers: member `<group>\x01<consumer>`, score = the unix
    /// ms of its last heartbeat. (Redis 7.0 neither creates a consumer nor refreshes its idle
    /// time on a read that finds nothing, so a quiet group would look abandoned without it.)
    pub(crate) fn alive_key(&self, queue: &QueueName) -> String {
        format!("{{{}}}:alive:{}", self.keyspace().namespace(), queue)
    }

    /// Records that `consumer` of `group` is alive now (`alive = false`: it stopped), and
    /// drops heartbeats older than an hour.
    pub(crate) async fn heartbeat(
        &self,
        queue: &QueueName,
        group: &str,
        consumer: &str,
        alive: bool,
    ) -> Result<()> {
        let key = self.alive_key(queue);
        let member = format!("{group}\u{1}{consumer}");
        let now = self.now_ms();
        let mut pipe = redis::pipe();
        if alive {
            pipe.cmd("ZADD").arg(&key).arg(now).arg(&member).ignore();
        } else {
            pipe.cmd("ZREM").arg(&key).arg(&member).ignore();
        }
        pipe.cmd("ZREMRANGEBYSCORE")
            .arg(&key)
            .arg("-inf")
            .arg(now - HEARTBEAT_KEPT_MS)
            .ignore();
        let () = pipe
            .query_async(&mut self.connection())
            .await
            .ctx("recording a heartbeat")?;
        Ok(())
    }

    /// Per group: live consumers (a heartbeat within [`GROUP_ALIVE_WITHIN`]) and the unix
    /// ms of the latest heartbeat.
    pub(crate) async fn liveness(
        &self,
        queue: &QueueName,
    ) -> Result<std::collections::HashMap<String, (u64, i64)>> {
        let now = self.now_ms();
        let beats: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(self.alive_key(queue))
            .arg(now - HEARTBEAT_KEPT_MS)
            .arg("+inf")
            .arg("BYSCORE")
            .arg("WITHSCORES")
            .query_async(&mut self.connection())
            .await
            .ctx("reading heartbeats")?;
        let alive_ms = i64::try_from(GROUP_ALIVE_WITHIN.as_millis()).unwrap_or(60_000);
        let mut out: std::collections::HashMap<String, (u64, i64)> = Default::default();
        for (member, score) in beats {
            let Some((group, _)) = member.split_once('\u{1}') else {
                continue;
            };
            let at = crate::engine::scripts::score_to_ms(score);
            let e = out.entry(group.to_owned()).or_insert((0, at));
            if at >= now - alive_ms {
                e.0 += 1;
            }
            e.1 = e.1.max(at);
        }
        Ok(out)
    }

    /// The shard count of a registered queue; [`Error::QueueNotFound`] when it is not.
    pub(crate) async fn shards_of(&self, queue: &QueueName) -> Result<u16> {
        self.lookup(queue)
            .await?
            .ok_or_else(|| Error::QueueNotFound {
                queue: queue.as_str().to_owned(),
            })
    }

    /// The keys of every shard of a registered queue.
    pub(crate) async fn registered_keys(&self, queue: &QueueName) -> Result<Vec<ShardKeys>> {
        let shards = self.shards_of(queue).await?;
        Ok(self.keyspace().shards(queue, shards))
    }

    /// Registers `queue` with this client's shard count (dispatchers and workers, at start).
    pub(crate) async fn register(&self, queue: &QueueName) -> Result<()> {
        let wanted = self.options().shards;
        let known = self.inner_known().get(queue.as_str()).copied();
        match known {
            Some(existing) if existing == wanted => return Ok(()),
            Some(existing) => {
                return Err(Error::ShardMismatch {
                    queue: queue.as_str().to_owned(),
                    existing,
                    wanted,
                });
            }
            None => {}
        }
        self.create_queue(queue.as_str(), wanted).await.map(drop)
    }

    async fn lookup(&self, queue: &QueueName) -> Result<Option<u16>> {
        if let Some(&n) = self.inner_known().get(queue.as_str()) {
            return Ok(Some(n));
        }
        let stored: Option<u16> = redis::cmd("HGET")
            .arg(self.queue_meta_key(queue))
            .arg("shards")
            .query_async(&mut self.connection())
            .await
            .ctx("reading the queue registry")?;
        if let Some(n) = stored {
            self.remember(queue, n);
        }
        Ok(stored)
    }

    fn remember(&self, queue: &QueueName, shards: u16) {
        self.inner_known().insert(queue.as_str().to_owned(), shards);
    }
}

/// Deletes one shard's keys: due, payloads, stream (with its groups), dead letters, the
/// timers and error records of `groups`, and the history buckets `history` may have
/// written (buckets of an earlier retention setting expire on their own).
async fn delete_shard(
    client: &Client,
    k: &ShardKeys,
    groups: &[String],
    history: &HistoryPolicy,
) -> Result<()> {
    let mut cmd = redis::cmd("DEL");
    cmd.arg(&k.due).arg(&k.payload).arg(&k.stream).arg(&k.dead);
    for g in groups {
        cmd.arg(k.timers(g)).arg(k.errors(g));
    }
    for bucket in history.buckets(k, client.now_ms()) {
        cmd.arg(bucket);
    }
    let _: i64 = cmd
        .query_async(&mut client.connection())
        .await
        .ctx("deleting the queue's keys")?;
    Ok(())
}
