//! A queue's cancel-on-event rules (see [`crate::engine::events`]): set and read.

use super::Queues;
use crate::engine::error::{RedisContext, Result};
use crate::engine::events::{CancelRule, RECORD_FIELD, StoredRules, validate_rules};
use crate::engine::keys::QueueName;

impl Queues {
    /// Sets `queue`'s cancel-on-event rules (empty: none), checked first (nothing is written
    /// on a bad rule). In three steps, so that no producer is refused while it changes: the
    /// shards' meta hashes first accept both versions (`<old>|<new>`), then the record gets the
    /// new rules with their version, then the meta hashes the new version alone. From the moment
    /// this answers, every order scheduled carries the new rules' tokens (a producer with
    /// older rules is refused by `enqueue.lua` and re-reads them). Orders already scheduled
    /// keep the tokens they were scheduled with.
    pub async fn set_cancel_on(&self, queue: &str, rules: &[CancelRule]) -> Result<()> {
        let q = QueueName::new(queue)?;
        validate_rules(rules)?;
        let keys = self.client.registered_keys(&q).await?;
        let stored = StoredRules {
            v: format!("{:x}-{:08x}", self.client.now_ms(), fastrand::u32(..)),
            rules: rules.to_vec(),
        };
        let text =
            serde_json::to_string(&stored).map_err(|e| crate::engine::error::Error::Reply {
                context: "writing the cancel_on rules",
                detail: e.to_string(),
            })?;
        let old: Option<String> = redis::cmd("HGET")
            .arg(self.client.queue_meta_key(&q))
            .arg(RECORD_FIELD)
            .query_async(&mut self.client.connection())
            .await
            .ctx("reading the cancel_on rules")?;
        let before = old.as_deref().and_then(StoredRules::parse);
        if before.as_ref().map_or(&[][..], |s| s.rules.as_slice()) == rules {
            // Unchanged (a restart applying its configuration): nothing to do.
            return Ok(());
        }
        let old_v = before.map(|s| s.v).unwrap_or_default();
        let new_v = if rules.is_empty() {
            ""
        } else {
            stored.v.as_str()
        };
        self.client
            .set_meta(&keys, RECORD_FIELD, Some(&format!("{old_v}|{new_v}")))
            .await?;
        let mut pipe = redis::pipe();
        if rules.is_empty() {
            pipe.cmd("HDEL")
                .arg(self.client.queue_meta_key(&q))
                .arg(RECORD_FIELD)
                .ignore();
        } else {
            pipe.cmd("HSET")
                .arg(self.client.queue_meta_key(&q))
                .arg(RECORD_FIELD)
                .arg(&text)
                .ignore();
        }
        pipe.cmd("INCR")
            .arg(self.client.keyspace().registry_version())
            .ignore();
        let () = pipe
            .query_async(&mut self.client.connection())
            .await
            .ctx("writing the cancel_on rules")?;
        self.client
            .set_meta(
                &keys,
                RECORD_FIELD,
                (!rules.is_empty()).then_some(stored.v.as_str()),
            )
            .await?;
        // This process's producers use the new rules at once.
        self.client.forget(&q);
        self.client.replicated_barrier().await
    }

    /// `queue`'s cancel-on-event rules, as its record says (empty: none).
    pub async fn cancel_on(&self, queue: &QueueName) -> Result<Vec<CancelRule>> {
        let text: Option<String> = redis::cmd("HGET")
            .arg(self.client.queue_meta_key(queue))
            .arg(RECORD_FIELD)
            .query_async(&mut self.client.connection())
            .await
            .ctx("reading the cancel_on rules")?;
        Ok(text
            .as_deref()
            .and_then(StoredRules::parse)
            .map(|s| s.rules)
            .unwrap_or_default())
    }
}
