//! Deleting a queue for good, without ever blocking Redis: the registry record is marked
//! `deleting` first (`retire.lua`), then every shard is fenced (`fence.lua`: no producer
//! may write into it any more), then each shard's keys are unlinked (`purge.lua`: `UNLINK`
//! frees large values in Redis's background thread, so a call costs O(keys), never
//! O(orders)), and the record goes last. A delete cut off at any step is finished by the
//! next delete of the queue, by a create of it (which then starts empty), or by the
//! housekeeper ([`Client::finish_deletions`]): a marked record is never listed, never
//! looked up, and the deleted queue's orders never come back. A producer that still holds
//! the record is refused by each fenced shard; one that wrote into a shard before its
//! fence wrote before the delete reached it, and that order goes with the queue.

use super::Client;
use crate::engine::error::{RedisContext, Result};
use crate::engine::history::{HistoryPolicy, RETENTION_FIELD};
use crate::engine::keys::{QueueName, ShardKeys};
use crate::engine::scripts::{self, Fence};

impl Client {
    /// Removes every key of `queue` (`shards` shards, epoch `epoch`), then its record when
    /// it is marked deleting with that epoch. Shards that already belong to a queue created
    /// again since are left alone. Idempotent, and safe to run from several processes at
    /// once. Returns what each shard held.
    pub(crate) async fn purge_queue(
        &self,
        queue: &QueueName,
        shards: u16,
        epoch: &str,
    ) -> Result<Vec<Fence>> {
        let retention: Option<i64> = redis::cmd("HGET")
            .arg(self.keyspace().queue_record(queue))
            .arg(RETENTION_FIELD)
            .query_async(&mut self.connection())
            .await
            .ctx("reading the history retention")?;
        let history = retention.map_or_else(HistoryPolicy::default, HistoryPolicy::from_ms);
        let now = self.now_ms();
        // Every shard is fenced before any is purged: a few O(1) calls, so a producer that
        // still holds the queue's record is refused everywhere almost at once, and the
        // slow part (the unlinks) runs on shards nobody can write into any more.
        let shard_keys = self.keyspace().shards(queue, shards);
        let mut fences = Vec::with_capacity(usize::from(shards));
        for k in &shard_keys {
            fences.push(scripts::fence(&mut self.connection(), k, epoch, true).await?);
        }
        for (k, f) in shard_keys.iter().zip(&fences) {
            if f.fenced == 1 {
                let keys = self.shard_key_list(queue, k, f, &history, now);
                scripts::purge(&mut self.connection(), &k.meta, &keys, epoch).await?;
            }
        }
        scripts::retire_end(&mut self.connection(), self.keyspace(), queue, epoch).await?;
        self.forget(queue);
        Ok(fences)
    }

    /// Finishes every delete that was cut off (the queues in `{ns}:deleting`): what the
    /// housekeeper runs before each safety sweep. Returns how many it finished.
    pub(crate) async fn finish_deletions(&self) -> Result<u64> {
        let names: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.keyspace().deleting())
            .query_async(&mut self.connection())
            .await
            .ctx("listing the queues being deleted")?;
        let mut done = 0;
        for name in names {
            let Ok(q) = QueueName::new(&name) else {
                continue;
            };
            let (shards, epoch, deleting): (Option<u16>, Option<String>, Option<String>) =
                redis::cmd("HMGET")
                    .arg(self.keyspace().queue_record(&q))
                    .arg("shards")
                    .arg("epoch")
                    .arg("deleting")
                    .query_async(&mut self.connection())
                    .await
                    .ctx("reading a deleted queue's record")?;
            match (shards, epoch, deleting) {
                (Some(shards), Some(epoch), Some(_)) => {
                    self.purge_queue(&q, shards, &epoch).await?;
                    tracing::info!(queue = %name, "finished deleting a queue whose delete was cut off");
                    done += 1;
                }
                _ => {
                    let _: i64 = redis::cmd("SREM")
                        .arg(self.keyspace().deleting())
                        .arg(&name)
                        .query_async(&mut self.connection())
                        .await
                        .ctx("listing the queues being deleted")?;
                }
            }
        }
        Ok(done)
    }

    /// Every key of one shard but its meta hash: schedule, payloads, levels, dead letters,
    /// ticks, each lane's stream and each group's timers and errors, rate limits and
    /// heartbeats (shard 0), and the history buckets `history` may have written (buckets
    /// of an earlier retention setting expire on their own).
    fn shard_key_list(
        &self,
        queue: &QueueName,
        k: &ShardKeys,
        fence: &Fence,
        history: &HistoryPolicy,
        now_ms: i64,
    ) -> Vec<String> {
        let mut keys = vec![
            k.due.clone(),
            k.payload.clone(),
            k.levels.clone(),
            k.dispatched.clone(),
            k.debounce.clone(),
            k.tags.clone(),
            k.keyed.clone(),
            k.key_ring.clone(),
            k.remembered.clone(),
            k.dead.clone(),
            k.ticks(),
        ];
        for lane in k.lanes() {
            keys.push(lane.stream.clone());
            for (g, _, _) in &fence.groups {
                keys.push(lane.timers(g));
                keys.push(lane.errors(g));
            }
        }
        if k.shard == 0 {
            for (g, _, _) in &fence.groups {
                keys.push(self.keyspace().rate(queue, g));
                let slots = self.keyspace().key_slots(queue, g);
                keys.extend(slots.all().map(str::to_owned));
            }
            keys.push(self.keyspace().alive(queue));
        }
        keys.extend(history.buckets(k, now_ms));
        keys.push(k.history_touched());
        keys.sort();
        keys.dedup();
        keys
    }
}
