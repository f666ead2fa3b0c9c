//! What consumes a group: the kind it was declared with (`delayq serve`'s `[[handlers]]`
//! `kind`: `pull`, `webhook`, `log`, `order-close`, or an application's own word), kept in
//! the queue's registry record (field `kind:<group>`), so every process, the statistics and
//! the dashboard see it, and a pull of a group that a handler consumes is refused.

use super::Queues;
use crate::engine::error::{RedisContext, Result};
use crate::engine::keys::{QueueName, validate_member_name};

/// The registry record field holding `group`'s declared kind.
pub fn kind_field(group: &str) -> String {
    format!("kind:{group}")
}

/// The kind of a group consumed by pulls (`Puller`, HTTP `:receive`).
pub const PULL: &str = "pull";

impl Queues {
    /// Records that `group` of the registered `queue` is consumed as `kind` (a member name:
    /// letters, digits, `-`, `_`, ...). Creates nothing else: the consumer groups are made by
    /// whoever consumes (a worker, a puller).
    pub async fn declare_group_kind(&self, queue: &str, group: &str, kind: &str) -> Result<()> {
        let q = QueueName::new(queue)?;
        validate_member_name("group", group)?;
        validate_member_name("kind", kind)?;
        self.client.shards_of(&q).await?;
        let _: i64 = redis::cmd("HSET")
            .arg(self.client.queue_meta_key(&q))
            .arg(kind_field(group))
            .arg(kind)
            .query_async(&mut self.client.connection())
            .await
            .ctx("declaring the group's kind")?;
        Ok(())
    }

    /// The kind `group` of `queue` was declared with, if any.
    pub async fn group_kind(&self, queue: &str, group: &str) -> Result<Option<String>> {
        let q = QueueName::new(queue)?;
        redis::cmd("HGET")
            .arg(self.client.queue_meta_key(&q))
            .arg(kind_field(group))
            .query_async(&mut self.client.connection())
            .await
            .ctx("reading the group's kind")
    }

    /// Forgets `group`'s declared kind (the group was deleted).
    pub(crate) async fn forget_group_kind(&self, queue: &QueueName, group: &str) -> Result<()> {
        let _: i64 = redis::cmd("HDEL")
            .arg(self.client.queue_meta_key(queue))
            .arg(kind_field(group))
            .query_async(&mut self.client.connection())
            .await
            .ctx("forgetting the group's kind")?;
        Ok(())
    }
}
