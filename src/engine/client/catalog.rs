//! The queue registry as the store reads and writes it: a queue exists once registered, and
//! its record holds its shard count and epoch.
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
//! Creating, listing and deleting queues is administration:
//! [`Queues`](crate::engine::admin::Queues).

use super::{Client, MAX_SHARDS};
use crate::engine::error::{Error, InvalidInput, RedisContext, Result};
use crate::engine::events::{RECORD_FIELD, StoredRules};
use crate::engine::keys::{QueueName, ShardKeys};
use crate::engine::scripts::{self, ScriptRefusal};
use serde::Serialize;

/// What [`Queues::create_queue`](crate::engine::admin::Queues::create_queue) did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueCreated {
    /// The name.
    pub queue: String,
    /// Its shard count.
    pub shards: u16,
    /// False when it already existed with that shard count.
    pub created: bool,
}

/// What a producer needs to know of a registered queue: its shard count and its epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueRef {
    /// The shard count, fixed at creation.
    pub(crate) shards: u16,
    /// The epoch, checked by `enqueue.lua` against each shard's meta hash.
    pub(crate) epoch: String,
    /// Its cancel-on-event rules, as the record held them (see [`crate::engine::events`]).
    pub(crate) rules: Option<std::sync::Arc<StoredRules>>,
}

impl QueueRef {
    /// `enqueue.lua`'s epoch argument: the epoch, then the rules' version (see
    /// `lua/enqueue.lua`, ARGV[3]).
    pub(crate) fn epoch_arg(&self) -> String {
        let v = self.rules.as_ref().map_or("", |r| r.v.as_str());
        format!("{}\u{1f}{v}", self.epoch)
    }

    /// The rules (empty: none).
    pub(crate) fn cancel_rules(&self) -> &[crate::engine::events::CancelRule] {
        self.rules.as_ref().map_or(&[], |r| r.rules.as_slice())
    }
}

fn stored_rules(text: Option<String>) -> Option<std::sync::Arc<StoredRules>> {
    text.as_deref()
        .and_then(StoredRules::parse)
        .map(std::sync::Arc::new)
}

/// How often a running worker says it is alive (well within [`GROUP_ALIVE_WITHIN`](crate::engine::admin::GROUP_ALIVE_WITHIN)).
pub const HEARTBEAT_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
/// Heartbeats older than this are dropped (the key stays bounded by the consumers of the
/// last hour).
pub(crate) const HEARTBEAT_KEPT_MS: i64 = 3_600_000;

/// How many times a create runs again when a delete of the same queue races it.
const REGISTER_ATTEMPTS: usize = 3;

impl Client {
    /// Registers `queue` with `shards` shards. Idempotent: an existing queue with that count
    /// answers `created: false`; one with another count is refused
    /// ([`Error::ShardMismatch`]) and left as it is. Refused with [`Error::TooManyQueues`]
    /// when the namespace already has `max_queues` queues.
    pub(crate) async fn declare_queue(&self, queue: &str, shards: u16) -> Result<QueueCreated> {
        let q = QueueName::new(queue)?;
        if !(1..=MAX_SHARDS).contains(&shards) {
            return Err(InvalidInput::Option {
                name: "shards",
                reason: format!("must be 1..={MAX_SHARDS}, got {shards}"),
            }
            .into());
        }
        let (created, stored) = self.register_record(&q, shards).await?;
        if stored.shards != shards {
            return Err(Error::ShardMismatch {
                queue: queue.to_owned(),
                existing: stored.shards,
                wanted: shards,
            });
        }
        Ok(QueueCreated {
            queue: queue.to_owned(),
            shards,
            created,
        })
    }

    /// Runs `create_queue.lua` (the record, its epoch, the cap), writes the epoch into every
    /// shard's meta hash so producers may write into it, then checks the record again (write,
    /// then check): when a delete began meanwhile, those writes are undone (with anything
    /// written through them) and the create starts over, so no shard ever keeps an epoch
    /// its record lost. A queue being deleted is first finished off: a re-created queue
    /// starts empty. Remembers the record only once it is confirmed.
    async fn register_record(&self, q: &QueueName, shards: u16) -> Result<(bool, QueueRef)> {
        for _ in 0..REGISTER_ATTEMPTS {
            let new_epoch = format!("{:x}-{:016x}", self.now_ms(), fastrand::u64(..));
            let reply = scripts::create_queue(
                &mut self.connection(),
                self.keyspace(),
                q,
                shards,
                &new_epoch,
                self.options().max_queues,
            )
            .await;
            let (created, stored, epoch) = match reply {
                Err(e) if ScriptRefusal::of(&e) == Some(ScriptRefusal::TooManyQueues) => {
                    return Err(Error::TooManyQueues {
                        max: self.options().max_queues,
                    });
                }
                other => other?,
            };
            if created < 0 {
                // Being deleted: finish that delete, then create the queue afresh.
                self.purge_queue(q, stored, &epoch).await?;
                continue;
            }
            self.set_meta(&self.keyspace().shards(q, stored), "epoch", Some(&epoch))
                .await?;
            let (now_epoch, deleting, rules): (Option<String>, Option<String>, Option<String>) =
                redis::cmd("HMGET")
                    .arg(self.keyspace().queue_record(q))
                    .arg("epoch")
                    .arg("deleting")
                    .arg(RECORD_FIELD)
                    .query_async(&mut self.connection())
                    .await
                    .ctx("checking the queue registry")?;
            if now_epoch.as_deref() == Some(epoch.as_str()) && deleting.is_none() {
                let r = QueueRef {
                    shards: stored,
                    epoch,
                    rules: stored_rules(rules),
                };
                self.remember(q, r.clone());
                return Ok((created == 1, r));
            }
            // Deleted (or being deleted) since the script: our meta-hash writes may have landed on
            // shards the delete had already purged. Undo them, and what came through them.
            self.purge_queue(q, stored, &epoch).await?;
        }
        Err(Error::Reply {
            context: "registering the queue",
            detail: format!(
                "it was deleted by another process during each of {REGISTER_ATTEMPTS} attempts; try again"
            ),
        })
    }

    /// The registry's version: it changes whenever a queue is created, deleted or changed
    /// (one `GET`; what a supervisor polls).
    pub(crate) async fn registry_version(&self) -> Result<i64> {
        let v: Option<i64> = redis::cmd("GET")
            .arg(self.keyspace().registry_version())
            .query_async(&mut self.connection())
            .await
            .ctx("reading the registry version")?;
        Ok(v.unwrap_or(0))
    }

    /// Records a change of a queue's settings (supervisors re-read the registry).
    pub(crate) async fn bump_registry(&self) -> Result<()> {
        let _: i64 = redis::cmd("INCR")
            .arg(self.keyspace().registry_version())
            .query_async(&mut self.connection())
            .await
            .ctx("bumping the registry version")?;
        Ok(())
    }

    /// Sets (`Some`) or removes (`None`) `field` of every shard's meta hash, the calls in
    /// flight together: the epoch, and the pause flags the scripts check.
    pub(crate) async fn set_meta(
        &self,
        shards: &[ShardKeys],
        field: &str,
        value: Option<&str>,
    ) -> Result<()> {
        futures_util::future::try_join_all(shards.iter().map(|k| {
            let mut conn = self.connection();
            let mut c = redis::cmd(if value.is_some() { "HSET" } else { "HDEL" });
            c.arg(&k.meta).arg(field);
            if let Some(v) = value {
                c.arg(v);
            }
            async move {
                let _: i64 = c
                    .query_async(&mut conn)
                    .await
                    .ctx("writing the shards' meta hashes")?;
                Ok::<(), Error>(())
            }
        }))
        .await?;
        Ok(())
    }

    /// Records that `consumer` of `group` is alive now (`alive = false`: it stopped), and
    /// drops heartbeats older than an hour. False when the queue no longer exists (nothing
    /// is written).
    pub(crate) async fn heartbeat(
        &self,
        queue: &QueueName,
        group: &str,
        consumer: &str,
        alive: bool,
    ) -> Result<bool> {
        let now = self.now_ms();
        scripts::heartbeat(
            &mut self.connection(),
            &self.keyspace().alive(queue),
            &self.keyspace().shard(queue, 0),
            &format!("{group}\u{1}{consumer}"),
            now,
            alive,
            now - HEARTBEAT_KEPT_MS,
        )
        .await
    }

    /// The shard count of a registered queue; [`Error::QueueNotFound`] when it is not.
    pub(crate) async fn shards_of(&self, queue: &QueueName) -> Result<u16> {
        Ok(self.queue_ref(queue).await?.shards)
    }

    /// The shard count and epoch of a registered queue; [`Error::QueueNotFound`] when it
    /// is not.
    pub(crate) async fn queue_ref(&self, queue: &QueueName) -> Result<QueueRef> {
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
        let known = self.inner_known().get(queue.as_str()).map(|r| r.shards);
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
        self.declare_queue(queue.as_str(), wanted).await.map(drop)
    }

    /// The record of `queue` (cached once seen). A record written by an earlier version,
    /// without an epoch, gets one here (and its shards their meta hashes).
    pub(crate) async fn lookup(&self, queue: &QueueName) -> Result<Option<QueueRef>> {
        if let Some(r) = self.inner_known().get(queue.as_str()) {
            return Ok(Some(r.clone()));
        }
        type Record = (Option<u16>, Option<String>, Option<String>, Option<String>);
        let (shards, epoch, deleting, rules): Record = redis::cmd("HMGET")
            .arg(self.keyspace().queue_record(queue))
            .arg("shards")
            .arg("epoch")
            .arg("deleting")
            .arg(RECORD_FIELD)
            .query_async(&mut self.connection())
            .await
            .ctx("reading the queue registry")?;
        if deleting.is_some() {
            // Being deleted: it no longer exists for producers and administration.
            return Ok(None);
        }
        match (shards, epoch) {
            (Some(shards), Some(epoch)) => {
                let r = QueueRef {
                    shards,
                    epoch,
                    rules: stored_rules(rules),
                };
                self.remember(queue, r.clone());
                Ok(Some(r))
            }
            (Some(shards), None) => Ok(Some(self.register_record(queue, shards).await?.1)),
            (None, _) => Ok(None),
        }
    }

    fn remember(&self, queue: &QueueName, r: QueueRef) {
        self.inner_known().insert(queue.as_str().to_owned(), r);
    }

    /// Drops what this client knows of `queue` (a script said it changed).
    pub(crate) fn forget(&self, queue: &QueueName) {
        self.inner_known().remove(queue.as_str());
    }
}
