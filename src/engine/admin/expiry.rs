//! A queue's default `expires_after` (see [`crate::engine::expiry`]): set in its registry
//! record, read by every worker of the queue with its pause flags.

use super::Queues;
use crate::engine::error::{RedisContext, Result};
use crate::engine::expiry::{QUEUE_FIELD, check_queue_default};
use crate::engine::keys::QueueName;
use std::time::Duration;

impl Queues {
    /// Sets `queue`'s default `expires_after` (zero: no default): an order without its own
    /// is not handed to a group later than this past its due time. Every worker of the queue
    /// follows it within [`PAUSE_REFRESH`](crate::engine::flow::PAUSE_REFRESH), for orders
    /// scheduled before the change too. Refused (naming `expires_after`, nothing written)
    /// outside 1 ms ..= 10 years.
    pub async fn set_expires_after(&self, queue: &str, expires_after: Duration) -> Result<()> {
        let q = QueueName::new(queue)?;
        let value = check_queue_default(expires_after)?;
        self.client.shards_of(&q).await?;
        let key = self.client.queue_meta_key(&q);
        let cmd = match value {
            Some(ms) => {
                let mut c = redis::cmd("HSET");
                c.arg(&key).arg(QUEUE_FIELD).arg(ms);
                c
            }
            None => {
                let mut c = redis::cmd("HDEL");
                c.arg(&key).arg(QUEUE_FIELD);
                c
            }
        };
        let _: i64 = cmd
            .query_async(&mut self.client.connection())
            .await
            .ctx("setting the queue's expires_after")?;
        self.client.bump_registry().await
    }
}
