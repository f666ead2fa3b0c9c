//! Queue statistics: what is scheduled, overdue, in the streams, pending per group, dead.

use super::Queues;
use crate::engine::error::{RedisContext, Result};
use crate::engine::history::HistoryPolicy;
use crate::engine::keys::QueueName;
use crate::engine::priority::Priority;
use serde::Serialize;
use std::collections::BTreeMap;

use crate::engine::scripts::admin::STATS;

/// One queue's numbers (summed over its shards).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct QueueStats {
    /// The queue.
    pub queue: String,
    /// Orders scheduled and not yet dispatched.
    pub scheduled: u64,
    /// Scheduled orders whose due time has passed (the dispatcher is behind).
    pub overdue: u64,
    /// Age of the oldest overdue order, ms (0 when none).
    pub oldest_overdue_ms: i64,
    /// Due time of the next scheduled order, unix ms.
    pub next_due_at_ms: Option<i64>,
    /// Entries in the streams (dispatched, not yet trimmed).
    pub stream_length: u64,
    /// Dead letters.
    pub dead: u64,
    /// Records in the order history (dispatched and cancelled orders kept for
    /// `history_retention`, plus the markers of entries that died or needed several
    /// attempts).
    pub history: u64,
    /// Whether dispatch is paused.
    pub paused: bool,
    /// Per consumer group.
    pub groups: Vec<GroupStats>,
    /// The backlog of each priority level (`high`, `normal`, `low`, in that order).
    pub priorities: Vec<PriorityStats>,
}

/// One priority level's backlog, summed over the shards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PriorityStats {
    /// The level.
    pub priority: Priority,
    /// Entries in its streams (dispatched, not yet trimmed).
    pub stream_length: u64,
    /// Of its entries, those delivered to a group and not yet acknowledged, summed over the
    /// groups.
    pub pending: u64,
    /// Of its entries, those not yet delivered, summed over the groups: what waits at this
    /// level.
    pub unread: u64,
}

/// One consumer group's numbers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct GroupStats {
    /// The group.
    pub group: String,
    /// Entries delivered and not yet acknowledged (being handled or waiting for a retry).
    pub pending: u64,
    /// Entries not yet delivered to the group (`None` when Redis cannot tell).
    pub lag: Option<u64>,
    /// Live consumers: workers that sent a heartbeat within the last minute (for consumers
    /// that send none, such as another language's, the largest count over the shards).
    pub consumers: u64,
    /// Milliseconds since any consumer of the group was last seen alive (a heartbeat, or a
    /// read that took entries; `None` without consumers): a group whose handler was removed
    /// shows a growing value.
    pub idle_ms: Option<u64>,
    /// Whether the group is paused.
    pub paused: bool,
    /// The kind it was declared with (`pull`, `webhook`, ...: [`super::kinds`]), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Order keys holding or waiting for slots (`key_concurrency`, `key_sequence`:
    /// [`super::keys`]); absent when none.
    #[serde(skip_serializing_if = "is_zero")]
    pub keys_active: u64,
    /// Entries waiting for a slot of their order key; absent when none.
    #[serde(skip_serializing_if = "is_zero")]
    pub key_waiting: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

type Raw = (
    u64,
    u64,
    Option<f64>,
    u64,
    u64,
    Vec<(String, u64, u64, i64, i64)>,
    Vec<(u64, u64, u64)>,
);

impl Queues {
    /// Statistics of `queue`.
    pub async fn stats(&self, queue: &str) -> Result<QueueStats> {
        let q = QueueName::new(queue)?;
        let now = self.client.now_ms();
        let mut s = QueueStats {
            queue: q.as_str().to_owned(),
            scheduled: 0,
            overdue: 0,
            oldest_overdue_ms: 0,
            next_due_at_ms: None,
            stream_length: 0,
            dead: 0,
            history: 0,
            paused: false,
            groups: Vec::new(),
            priorities: Priority::ALL
                .iter()
                .map(|&priority| PriorityStats {
                    priority,
                    stream_length: 0,
                    pending: 0,
                    unread: 0,
                })
                .collect(),
        };
        let flags: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.client.queue_meta_key(&q))
            .query_async(&mut self.client.connection())
            .await
            .ctx("reading the queue's flags")?;
        s.paused = flags.contains_key(&crate::engine::flow::pause_field(None));
        let history = flags
            .get(crate::engine::history::RETENTION_FIELD)
            .and_then(|v| v.parse().ok())
            .map_or_else(HistoryPolicy::default, HistoryPolicy::from_ms);
        let epoch = flags.get("epoch").map_or("", String::as_str);
        let mut groups: BTreeMap<String, GroupStats> = BTreeMap::new();
        for keys in self.client.registered_keys(&q).await? {
            // Sealed buckets from this process's cache, the open ones and those written
            // since it last looked from Redis: O(open buckets), whatever the retention.
            s.history += self
                .client
                .history_counts()
                .count(
                    &self.client.connection(),
                    q.as_str(),
                    &keys,
                    epoch,
                    &history,
                    now,
                )
                .await?;
            let [high, _, low] = keys.lanes();
            let raw: Raw = STATS
                .for_server(self.client.server())
                .key(&keys.due)
                .key(&keys.stream)
                .key(&keys.dead)
                .key(&high.stream)
                .key(&low.stream)
                .arg(now)
                .invoke_async(&mut self.client.connection())
                .await
                .ctx("reading queue statistics (stats.lua)")?;
            let (scheduled, overdue, head, stream_len, dead, gs, lanes) = raw;
            // The script's lanes come normal, high, low.
            for ((len, pending, unread), level) in
                lanes
                    .into_iter()
                    .zip([Priority::Normal, Priority::High, Priority::Low])
            {
                let p = &mut s.priorities[level.rank()];
                p.stream_length += len;
                p.pending += pending;
                p.unread += unread;
            }
            s.scheduled += scheduled;
            s.overdue += overdue;
            s.stream_length += stream_len;
            s.dead += dead;
            if let Some(h) = head.map(crate::engine::reply::score_to_ms) {
                s.next_due_at_ms = Some(s.next_due_at_ms.map_or(h, |n| n.min(h)));
                if overdue > 0 {
                    s.oldest_overdue_ms = s.oldest_overdue_ms.max(now - h);
                }
            }
            for (group, consumers, pending, lag, idle) in gs {
                let paused = flags.contains_key(&crate::engine::flow::pause_field(Some(&group)));
                let kind = flags.get(&super::kinds::kind_field(&group)).cloned();
                let g = groups.entry(group.clone()).or_insert(GroupStats {
                    group,
                    pending: 0,
                    lag: Some(0),
                    consumers: 0,
                    idle_ms: None,
                    paused,
                    kind,
                    keys_active: 0,
                    key_waiting: 0,
                });
                g.pending += pending;
                g.consumers = g.consumers.max(consumers);
                if let Ok(idle) = u64::try_from(idle) {
                    g.idle_ms = Some(g.idle_ms.map_or(idle, |i| i.min(idle)));
                }
                g.lag = match (g.lag, u64::try_from(lag)) {
                    (Some(a), Ok(b)) => Some(a + b),
                    _ => None,
                };
            }
        }
        // Workers' heartbeats say more than the streams: an empty read neither creates a
        // consumer nor refreshes its idle time.
        for (group, (live, last)) in self.liveness(&q).await? {
            if let Some(g) = groups.get_mut(&group) {
                let since = u64::try_from(now - last).unwrap_or(0);
                g.idle_ms = Some(g.idle_ms.map_or(since, |i| i.min(since)));
                g.consumers = live;
            }
        }
        let names: Vec<&str> = groups.keys().map(String::as_str).collect();
        let totals = self.key_totals(&q, &names).await?;
        for (g, (active, waiting)) in groups.values_mut().zip(totals) {
            (g.keys_active, g.key_waiting) = (active, waiting);
        }
        s.groups = groups.into_values().collect();
        Ok(s)
    }

    /// Statistics of every queue in the namespace, sorted by name (eight queues' calls in
    /// flight at a time). One queue that cannot be read (deleted meanwhile, or an error of
    /// its own, logged) is left out, so it never hides the others; the call fails only
    /// when no queue could be read.
    pub async fn stats_all(&self) -> Result<Vec<QueueStats>> {
        use futures_util::StreamExt;
        let names = self.client.queues().await?;
        let counts = self.client.history_counts();
        counts.retain_queues(&names);
        crate::engine::telemetry::history_count_cache(counts.cached_buckets());
        let results: Vec<(String, Result<QueueStats>)> =
            futures_util::stream::iter(names.into_iter().map(|q| {
                let c = self.clone();
                async move {
                    let r = c.stats(&q).await;
                    (q, r)
                }
            }))
            .buffered(8)
            .collect()
            .await;
        let mut out = Vec::with_capacity(results.len());
        let mut first_err = None;
        for (queue, r) in results {
            match r {
                Ok(s) => out.push(s),
                // Deleted between the listing and its read: not a queue any more.
                Err(crate::engine::error::Error::QueueNotFound { .. }) => {}
                Err(e) => {
                    tracing::warn!(queue = %queue, error = %e, "reading a queue's statistics failed; left out of this overview");
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) if out.is_empty() => Err(e),
            _ => Ok(out),
        }
    }
}
