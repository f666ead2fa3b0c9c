//! The queue registry: a queue exists once registered, and its record holds its shard count.
//!
//! `{ns}:queue:<q>` (HASH: `shards`, `epoch`, settings) and `{ns}:queues` (SET of names);
//! `{ns}:registry:version` is bumped by every change, so a supervisor notices one with a
//! single `GET`. Each shard also carries the queue's **epoch** in its meta hash
//! (`{ns:q:s}:meta`), written at creation and removed first at deletion: `enqueue.lua`
//! refuses a shard without it (`queue_not_found`) or with another one (`stale_epoch`), so a
//! producer with a stale view can never write into a deleted queue. Producer and admin
//! calls on an unregistered queue fail with [`Error::QueueNotFound`] and write nothing;
//! they use the shard count of the record, so no surface ever sees a subset of a queue's
//! shards.
//!
//! A client caches the records it has seen; a refusal by the scripts drops the entry.

use super::Queues;
use crate::engine::client::{HEARTBEAT_KEPT_MS, QueueCreated};
use crate::engine::error::{Error, RedisContext, Result};
use crate::engine::flow::{PauseState, pause_field};
use crate::engine::history::{HistoryPolicy, RETENTION_FIELD};
use crate::engine::keys::{QueueName, ShardKeys};
use crate::engine::scripts;
use crate::engine::time_rules::{DEDUP_FIELD, DedupWindow};
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
    /// Its default `expires_after`, ms (`None`: orders without their own never expire;
    /// left out of the JSON then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_after_ms: Option<i64>,
    /// Its dedup window after dispatch, ms (0: none; see [`crate::engine::time_rules`]).
    pub dedup_window_ms: i64,
    /// Its cancel-on-event rules (see [`crate::engine::events`]; none: left out of the
    /// JSON).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cancel_on: Vec<crate::engine::events::CancelRule>,
}

/// What is still in a queue: why a delete without `force` was refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QueueContents {
    /// Orders scheduled.
    pub scheduled: u64,
    /// Stream entries some group has not read yet (the largest lag of any group).
    pub unread: u64,
    /// Entries pending in some group (taken, not settled).
    pub pending: u64,
    /// Dead letters.
    pub dead: u64,
    /// Each group's lag (entries it has not read yet), summed over the shards.
    #[serde(skip)]
    pub lag: Vec<(String, u64)>,
}

/// A consumer that read or sent a heartbeat within this window counts as alive: its group
/// is not deleted without `force`.
pub const GROUP_ALIVE_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);
impl QueueContents {
    fn add(&mut self, f: &scripts::Fence) {
        self.scheduled += f.scheduled;
        self.dead += f.dead;
        for (g, pending, lag) in &f.groups {
            self.pending += pending;
            match self.lag.iter_mut().find(|(n, _)| n == g) {
                Some((_, l)) => *l += lag,
                None => self.lag.push((g.clone(), *lag)),
            }
        }
        self.unread = self.lag.iter().map(|(_, l)| *l).max().unwrap_or(0);
    }
}

impl Queues {
    /// Pauses or resumes dispatch of `queue` (`group` = `None`) or consumption by one group.
    /// [`Error::QueueNotFound`] / [`Error::GroupNotFound`] when they do not exist. With
    /// `durability = "replicated"` it answers once the replicas have it
    /// ([`Client::replicated_barrier`](crate::Client::replicated_barrier)), as every admin
    /// write does.
    pub async fn set_paused(
        &self,
        queue: &str,
        group: Option<&str>,
        paused: bool,
    ) -> Result<PauseState> {
        let q = QueueName::new(queue)?;
        self.client.shards_of(&q).await?;
        if let Some(g) = group {
            crate::engine::keys::validate_member_name("group", g)?;
            let stats = self.stats(queue).await?;
            if !stats.groups.iter().any(|s| s.group == g) {
                return Err(Error::GroupNotFound {
                    queue: queue.to_owned(),
                    group: g.to_owned(),
                });
            }
        }
        // The shards' meta hashes first: the scripts that dispatch and read check them, so the
        // pause holds from the moment this call answers. The record's copy is what listings
        // show.
        let keys = self.client.registered_keys(&q).await?;
        let field = pause_field(group);
        self.client
            .set_meta(&keys, &field, paused.then_some("1"))
            .await?;
        let mut pipe = redis::pipe();
        if paused {
            pipe.cmd("HSET")
                .arg(self.client.queue_meta_key(&q))
                .arg(&field)
                .arg("1");
        } else {
            pipe.cmd("HDEL")
                .arg(self.client.queue_meta_key(&q))
                .arg(&field);
        }
        pipe.cmd("INCR")
            .arg(self.client.keyspace().registry_version());
        let _: (i64, i64) = pipe
            .query_async(&mut self.client.connection())
            .await
            .ctx("setting the pause flag")?;
        if !paused {
            // Resumed: this process's dispatchers and readers look again at once; those of
            // other processes when they hear it.
            self.client.wake().resumed(queue);
            if group.is_none() {
                crate::engine::listen::publish_now(&self.client, &keys).await;
            }
        }
        self.client.replicated_barrier().await?;
        Ok(PauseState {
            queue: queue.to_owned(),
            group: group.map(str::to_owned),
            paused,
        })
    }

    /// Sets `queue`'s dedup window after dispatch (zero: off; see
    /// [`crate::engine::time_rules`]). The shards' meta hashes first (the scripts read them, so
    /// the window holds from the moment this answers), then the record's copy for listings.
    /// Turning it off also drops the dispatched ids kept for it.
    pub async fn set_dedup_window(&self, queue: &str, window: std::time::Duration) -> Result<()> {
        let q = QueueName::new(queue)?;
        let w = DedupWindow::new(window)?;
        let keys = self.client.registered_keys(&q).await?;
        let value = w.as_ms().to_string();
        self.client
            .set_meta(&keys, DEDUP_FIELD, w.is_on().then_some(value.as_str()))
            .await?;
        let mut pipe = redis::pipe();
        if w.is_on() {
            pipe.cmd("HSET")
                .arg(self.client.queue_meta_key(&q))
                .arg(DEDUP_FIELD)
                .arg(w.as_ms())
                .ignore();
        } else {
            pipe.cmd("HDEL")
                .arg(self.client.queue_meta_key(&q))
                .arg(DEDUP_FIELD)
                .ignore();
        }
        pipe.cmd("INCR")
            .arg(self.client.keyspace().registry_version())
            .ignore();
        let () = pipe
            .query_async(&mut self.client.connection())
            .await
            .ctx("setting the dedup window")?;
        if !w.is_on() {
            for k in &keys {
                let _: i64 = redis::cmd("UNLINK")
                    .arg(&k.dispatched)
                    .query_async(&mut self.client.connection())
                    .await
                    .ctx("dropping the dispatched ids")?;
            }
        }
        self.client.replicated_barrier().await
    }

    /// `queue`'s dedup window, as its record says.
    pub async fn dedup_window(&self, queue: &QueueName) -> Result<DedupWindow> {
        let ms: Option<i64> = redis::cmd("HGET")
            .arg(self.client.queue_meta_key(queue))
            .arg(DEDUP_FIELD)
            .query_async(&mut self.client.connection())
            .await
            .ctx("reading the dedup window")?;
        Ok(DedupWindow::from_ms(ms.unwrap_or(0)))
    }

    /// Whether `queue` (`group` = `None`) or one of its groups is paused.
    pub async fn is_paused(&self, queue: &QueueName, group: Option<&str>) -> Result<bool> {
        let v: Option<String> = redis::cmd("HGET")
            .arg(self.client.queue_meta_key(queue))
            .arg(pause_field(group))
            .query_async(&mut self.client.connection())
            .await
            .ctx("reading the pause flag")?;
        Ok(v.is_some())
    }

    /// Registers `queue` with `shards` shards. Idempotent: an existing queue with that count
    /// answers `created: false`; one with another count is refused
    /// ([`Error::ShardMismatch`]) and left as it is. Refused with [`Error::TooManyQueues`]
    /// when the namespace already has `max_queues` queues.
    /// With `durability = "replicated"` it answers once the replicas have the queue
    /// ([`Client::replicated_barrier`](crate::Client::replicated_barrier)).
    pub async fn create_queue(&self, queue: &str, shards: u16) -> Result<QueueCreated> {
        let created = self.client.declare_queue(queue, shards).await?;
        self.client.replicated_barrier().await?;
        Ok(created)
    }

    /// A registered queue, or `None`.
    pub async fn queue_info(&self, queue: &str) -> Result<Option<QueueInfo>> {
        let q = QueueName::new(queue)?;
        match self.client.lookup(&q).await? {
            Some(r) => {
                let flags = crate::engine::flow::queue_flags(&self.client, &q, None).await?;
                Ok(Some(QueueInfo {
                    queue: queue.to_owned(),
                    shards: r.shards,
                    paused: flags.paused,
                    history_retention_ms: flags.history.retention_ms(),
                    expires_after_ms: flags.expires_after_ms,
                    dedup_window_ms: self.dedup_window(&q).await?.as_ms(),
                    cancel_on: self.cancel_on(&q).await?,
                }))
            }
            None => Ok(None),
        }
    }

    /// Every registered queue, sorted by name (empty on a fresh Redis).
    pub async fn list_queues(&self) -> Result<Vec<QueueInfo>> {
        let names = self.client.queues().await?;
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for n in &names {
            let q = QueueName::new(n)?;
            pipe.cmd("HMGET")
                .arg(self.client.keyspace().queue_record(&q))
                .arg("shards")
                .arg(crate::engine::flow::pause_field(None))
                .arg(RETENTION_FIELD)
                .arg(crate::engine::expiry::QUEUE_FIELD)
                .arg(DEDUP_FIELD)
                .arg(crate::engine::events::RECORD_FIELD);
        }
        type Record = (
            Option<u16>,
            Option<String>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<String>,
        );
        let records: Vec<Record> = pipe
            .query_async(&mut self.client.connection())
            .await
            .ctx("reading the queue registry")?;
        Ok(names
            .into_iter()
            .zip(records)
            .filter_map(
                |(queue, (shards, paused, history, expires, dedup, rules))| {
                    shards.map(|shards| QueueInfo {
                        queue,
                        shards,
                        paused: paused.is_some(),
                        history_retention_ms: history
                            .map_or_else(HistoryPolicy::default, HistoryPolicy::from_ms)
                            .retention_ms(),
                        expires_after_ms: expires.filter(|e| *e > 0),
                        dedup_window_ms: DedupWindow::from_ms(dedup.unwrap_or(0)).as_ms(),
                        cancel_on: rules
                            .as_deref()
                            .and_then(crate::engine::events::StoredRules::parse)
                            .map(|s| s.rules)
                            .unwrap_or_default(),
                    })
                },
            )
            .collect())
    }

    /// Deletes `queue` and every key of it (schedule, payloads, streams, groups, timers, dead
    /// letters, history, its record). Without `force` it is refused ([`Error::QueueNotEmpty`])
    /// while anything is scheduled, not yet read by a group, pending in a group or dead.
    /// Returns what it held.
    ///
    /// Final, and never a long Redis call: without `force`, each shard is first *fenced*
    /// and checked (`fence.lua` removes its epoch in the same script, so `enqueue.lua`
    /// refuses it from then on; a refusal on any shard restores the epochs of those already
    /// fenced). Then the record is marked deleting (`retire.lua`: no longer listed, looked
    /// up or dispatched; a create finishes the delete first and starts empty), each shard's
    /// keys are unlinked (`purge.lua`) and the record goes. A delete cut off at any step
    /// after the mark is resumed by the next delete (which answers what was left) or
    /// finished by the housekeeper.
    pub async fn delete_queue(&self, queue: &str, force: bool) -> Result<QueueContents> {
        let q = QueueName::new(queue)?;
        // Read the record afresh: a cached epoch may be stale.
        self.client.forget(&q);
        let mut contents = QueueContents::default();
        let checked = if force {
            false
        } else if let Some(r) = self.client.lookup(&q).await? {
            // A record already marked deleting is resumed below whatever `force` says: the
            // first delete decided.
            let keys = self.client.keyspace().shards(&q, r.shards);
            let mut fenced = Vec::new();
            let mut refused = false;
            for k in &keys {
                let f = scripts::fence(&mut self.client.connection(), k, &r.epoch, false).await;
                let f = match f {
                    Ok(f) => f,
                    Err(e) => {
                        self.unfence(&fenced, &r.epoch).await;
                        return Err(e);
                    }
                };
                contents.add(&f);
                match f.fenced {
                    1 => fenced.push(k.clone()),
                    0 => refused = true,
                    _ => {}
                }
            }
            if refused {
                self.unfence(&fenced, &r.epoch).await;
                return Err(Error::QueueNotEmpty {
                    queue: queue.to_owned(),
                    scheduled: contents.scheduled,
                    unread: contents.unread,
                    lag: contents.lag,
                    pending: contents.pending,
                    dead: contents.dead,
                });
            }
            true
        } else {
            false
        };
        let begun = scripts::retire_begin(
            &mut self.client.connection(),
            self.client.keyspace(),
            &q,
            self.client.now_ms(),
        )
        .await?;
        let Some((shards, epoch)) = begun else {
            return Err(Error::QueueNotFound {
                queue: queue.to_owned(),
            });
        };
        let fences = self.client.purge_queue(&q, shards, &epoch).await?;
        if !checked {
            for f in &fences {
                contents.add(f);
            }
        }
        // `durability = "replicated"`: answered once the replicas have the delete.
        self.client.replicated_barrier().await?;
        Ok(contents)
    }

    /// Gives fenced shards their epoch back (a delete that was refused part way).
    async fn unfence(&self, shards: &[ShardKeys], epoch: &str) {
        if let Err(e) = self.client.set_meta(shards, "epoch", Some(epoch)).await {
            tracing::error!(queue_shards = shards.len(), error = %e, "restoring the shards' epoch after a refused delete failed; create the queue again to repair it");
        }
    }

    /// Deletes consumer group `group` on every shard of `queue`, with its timers, so stream
    /// trimming no longer waits for it. Refused ([`Error::GroupBusy`]) while a consumer of it
    /// read within the last minute, unless `force`; [`Error::GroupNotFound`] when no shard
    /// has it. Returns the entries that were pending in it (they are dropped).
    pub async fn delete_group(&self, queue: &str, group: &str, force: bool) -> Result<u64> {
        let q = QueueName::new(queue)?;
        crate::engine::keys::validate_member_name("group", group)?;
        let keys = self.client.registered_keys(&q).await?;
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
        for k in keys.iter().flat_map(ShardKeys::lanes) {
            let mut conn = self.client.connection();
            let exists: bool = redis::cmd("EXISTS")
                .arg(&k.stream)
                .query_async(&mut conn)
                .await
                .ctx("deleting the consumer group")?;
            if exists {
                // A lane made before the group joined it has no such group: nothing to do.
                let r: redis::RedisResult<i64> = redis::cmd("XGROUP")
                    .arg("DESTROY")
                    .arg(&k.stream)
                    .arg(group)
                    .query_async(&mut conn)
                    .await;
                r.ctx("deleting the consumer group (XGROUP DESTROY)")?;
            }
            let _: i64 = redis::cmd("DEL")
                .arg(k.timers(group))
                .arg(k.errors(group))
                .query_async(&mut conn)
                .await
                .ctx("deleting the group's timers")?;
        }
        // Its slots per order key (`key_concurrency`): one place for every shard.
        let slots = self.client.keyspace().key_slots(&q, group);
        let _: i64 = redis::cmd("DEL")
            .arg(&slots.all()[..])
            .query_async(&mut self.client.connection())
            .await
            .ctx("deleting the group's key slots")?;
        self.forget_group_kind(&q, group).await?;
        // Its idle workers look at their lanes when the registry changes: they find the
        // group gone and stop.
        self.client.bump_registry().await?;
        self.client.replicated_barrier().await?;
        Ok(g.pending)
    }

    /// The ZSET of a queue's live consumers: member `<group>\x01<consumer>`, score = the unix
    /// ms of its last heartbeat. (Redis 7.0 neither creates a consumer nor refreshes its idle
    /// time on a read that finds nothing, so a quiet group would look abandoned without it.)
    pub(crate) fn alive_key(&self, queue: &QueueName) -> String {
        self.client.keyspace().alive(queue)
    }

    /// Per group: live consumers (a heartbeat within [`GROUP_ALIVE_WITHIN`]) and the unix
    /// ms of the latest heartbeat.
    pub(crate) async fn liveness(
        &self,
        queue: &QueueName,
    ) -> Result<std::collections::HashMap<String, (u64, i64)>> {
        let now = self.client.now_ms();
        let beats: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(self.alive_key(queue))
            .arg(now - HEARTBEAT_KEPT_MS)
            .arg("+inf")
            .arg("BYSCORE")
            .arg("WITHSCORES")
            .query_async(&mut self.client.connection())
            .await
            .ctx("reading heartbeats")?;
        let alive_ms = i64::try_from(GROUP_ALIVE_WITHIN.as_millis()).unwrap_or(60_000);
        let mut out: std::collections::HashMap<String, (u64, i64)> = Default::default();
        for (member, score) in beats {
            let Some((group, _)) = member.split_once('\u{1}') else {
                continue;
            };
            let at = crate::engine::reply::score_to_ms(score);
            let e = out.entry(group.to_owned()).or_insert((0, at));
            if at >= now - alive_ms {
                e.0 += 1;
            }
            e.1 = e.1.max(at);
        }
        Ok(out)
    }
}
