//! Bulk actions by tag (issue 43): list, count, cancel and reschedule every scheduled order
//! that carries a tag, in one queue or in every queue of the namespace, through the shards'
//! tag indexes (see [`crate::engine::tags`]). Reads are single commands on the index; writes
//! go in bounded batches of [`TAG_BATCH`] orders per `tag_bulk.lua` call (each atomic with
//! dispatch), looped until the tag has no order left.

use super::Client;
use crate::engine::error::{InvalidInput, RedisContext, Result};
use crate::engine::history::{CancelledBy, HistoryPolicy};
use crate::engine::keys::{QueueName, ShardKeys};
use crate::engine::message::When;
use crate::engine::scripts::tags::{BulkAction, tag_bulk};
use crate::engine::tags::{SEP, validate_tag};
use crate::engine::telemetry;
use serde::Serialize;
use std::collections::BTreeMap;

/// Orders per `tag_bulk.lua` call: a call stays well under a few ms of Redis time.
pub const TAG_BATCH: usize = 200;

/// Most orders one [`Client::tag_list`] page holds.
pub const MAX_TAG_PAGE: usize = 1000;

/// One scheduled order with a tag, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TaggedOrder {
    /// Its queue.
    pub queue: String,
    /// Its id.
    pub id: String,
    /// When it is due, unix ms.
    pub due_at_ms: i64,
}

/// A page of [`Client::tag_list`]: orders by queue, then id; `next` is the `after` of the
/// next page (`None`: this was the last).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TagPage {
    /// The orders of this page.
    pub orders: Vec<TaggedOrder>,
    /// The cursor of the next page (`<queue>:<id>`), if there may be one.
    pub next: Option<String>,
}

/// How many orders a count, cancel or reschedule by tag found or changed, in total and per
/// queue (queues with none left out).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TagCounts {
    /// Over every queue.
    pub total: u64,
    /// Per queue.
    pub queues: BTreeMap<String, u64>,
}

impl TagCounts {
    fn add(&mut self, queue: &str, n: u64) {
        if n > 0 {
            self.total += n;
            *self.queues.entry(queue.to_owned()).or_default() += n;
        }
    }
}

/// Where a reschedule by tag moves each order.
#[derive(Debug, Clone, PartialEq)]
pub enum TagMove {
    /// To this due time (every order the same).
    At(When),
    /// By this many ms (negative: earlier; never before 1970).
    ShiftMs(i64),
}

/// The index range of `tag`'s members after id `after`: `[<tag>\x1f` (or `(<tag>\x1f<after>`)
/// to `(<tag>\x20` (no tag holds a control character, so nothing else lies between).
fn range(tag: &str, after: Option<&str>) -> (String, String) {
    let from = match after {
        Some(a) => format!("({tag}{SEP}{a}"),
        None => format!("[{tag}{SEP}"),
    };
    (from, format!("({tag} "))
}

impl Client {
    /// The queues a tag action covers: `queue`, or every registered queue (sorted).
    async fn tag_queues(&self, queue: Option<&str>) -> Result<Vec<QueueName>> {
        match queue {
            Some(q) => {
                let q = QueueName::new(q)?;
                self.shards_of(&q).await?;
                Ok(vec![q])
            }
            None => self
                .queues()
                .await?
                .iter()
                .map(|q| QueueName::new(q).map_err(Into::into))
                .collect(),
        }
    }

    async fn queue_shards(&self, q: &QueueName) -> Result<Vec<ShardKeys>> {
        let shards = self.shards_of(q).await?;
        Ok((0..shards).map(|s| self.shard_keys(q, s)).collect())
    }

    /// The scheduled orders with `tag` in `queue` (`None`: every queue of the namespace),
    /// by queue then id, at most `limit` (1..=[`MAX_TAG_PAGE`]), after the cursor `after`
    /// (a page's `next`).
    pub async fn tag_list(
        &self,
        queue: Option<&str>,
        tag: &str,
        limit: usize,
        after: Option<&str>,
    ) -> Result<TagPage> {
        validate_tag(tag)?;
        if !(1..=MAX_TAG_PAGE).contains(&limit) {
            return Err(InvalidInput::Option {
                name: "limit",
                reason: format!("must be 1..={MAX_TAG_PAGE}, got {limit}"),
            }
            .into());
        }
        let (after_queue, after_id) = match after {
            Some(c) => match c.split_once(':') {
                Some((q, id)) if !id.is_empty() => (Some(QueueName::new(q)?), Some(id)),
                _ => {
                    return Err(InvalidInput::Option {
                        name: "after",
                        reason: "must be a page's next cursor (<queue>:<id>)".into(),
                    }
                    .into());
                }
            },
            None => (None, None),
        };
        let mut orders = Vec::new();
        let mut conn = self.inner.conn.clone();
        for q in self.tag_queues(queue).await? {
            let from = match &after_queue {
                Some(aq) if q.as_str() < aq.as_str() => continue,
                Some(aq) if q.as_str() == aq.as_str() => after_id,
                _ => None,
            };
            let want = limit - orders.len();
            let (lo, hi) = range(tag, from);
            let mut found: Vec<TaggedOrder> = Vec::new();
            for keys in self.queue_shards(&q).await? {
                let members: Vec<String> = redis::cmd("ZRANGEBYLEX")
                    .arg(&keys.tags)
                    .arg(&lo)
                    .arg(&hi)
                    .arg("LIMIT")
                    .arg(0)
                    .arg(want)
                    .query_async(&mut conn)
                    .await
                    .ctx("listing the orders of a tag")?;
                let prefix = tag.len() + SEP.len_utf8();
                let ids: Vec<&str> = members.iter().filter_map(|m| m.get(prefix..)).collect();
                if ids.is_empty() {
                    continue;
                }
                let scores: Vec<Option<f64>> = redis::cmd("ZMSCORE")
                    .arg(&keys.due)
                    .arg(&ids)
                    .query_async(&mut conn)
                    .await
                    .ctx("reading the due times of a tag's orders")?;
                for (id, s) in ids.iter().zip(scores) {
                    if let Some(s) = s {
                        found.push(TaggedOrder {
                            queue: q.as_str().to_owned(),
                            id: (*id).to_owned(),
                            due_at_ms: crate::engine::reply::score_to_ms(s),
                        });
                    }
                }
            }
            found.sort_by(|a, b| a.id.cmp(&b.id));
            found.truncate(want);
            orders.extend(found);
            if orders.len() == limit {
                let next = orders.last().map(|o| format!("{}:{}", o.queue, o.id));
                return Ok(TagPage { orders, next });
            }
        }
        Ok(TagPage { orders, next: None })
    }

    /// How many scheduled orders carry `tag`, in `queue` (`None`: every queue).
    pub async fn tag_count(&self, queue: Option<&str>, tag: &str) -> Result<TagCounts> {
        validate_tag(tag)?;
        let (lo, hi) = range(tag, None);
        let mut conn = self.inner.conn.clone();
        let mut out = TagCounts::default();
        for q in self.tag_queues(queue).await? {
            for keys in self.queue_shards(&q).await? {
                let n: u64 = redis::cmd("ZLEXCOUNT")
                    .arg(&keys.tags)
                    .arg(&lo)
                    .arg(&hi)
                    .query_async(&mut conn)
                    .await
                    .ctx("counting the orders of a tag")?;
                out.add(q.as_str(), n);
            }
        }
        Ok(out)
    }

    /// Cancels every scheduled order with `tag` in `queue` (`None`: every queue), in
    /// batches of [`TAG_BATCH`] per script call, each atomic with dispatch (an order is
    /// either cancelled here or dispatched, never both). Repeating it is harmless (0).
    pub async fn tag_cancel(&self, queue: Option<&str>, tag: &str) -> Result<TagCounts> {
        let out = self.tag_bulk(queue, tag, None).await?;
        for (q, n) in &out.queues {
            telemetry::cancelled_by(q, "tag", *n);
        }
        Ok(out)
    }

    /// Moves every scheduled order with `tag` in `queue` (`None`: every queue) to a new due
    /// time or by a shift, keeping payloads, tags and levels.
    pub async fn tag_reschedule(
        &self,
        queue: Option<&str>,
        tag: &str,
        to: TagMove,
    ) -> Result<TagCounts> {
        let action = match to {
            TagMove::At(w) => BulkAction::At(w.resolve(self.now_ms())?),
            TagMove::ShiftMs(ms) => {
                let max = crate::engine::message::MAX_AHEAD_MS;
                if !(-max..=max).contains(&ms) {
                    return Err(InvalidInput::Option {
                        name: "shift",
                        reason: "must be within 10 years either way".into(),
                    }
                    .into());
                }
                BulkAction::Shift(ms)
            }
        };
        let out = self.tag_bulk(queue, tag, Some(action)).await?;
        for q in out.queues.keys() {
            self.inner.wake.scheduled(q, self.now_ms());
        }
        Ok(out)
    }

    /// Works the orders of `tag` in `queue` (`None`: every queue): moved by `action`, or
    /// cancelled (`None`; each cancellation recorded in the order history).
    async fn tag_bulk(
        &self,
        queue: Option<&str>,
        tag: &str,
        action: Option<BulkAction<'_>>,
    ) -> Result<TagCounts> {
        validate_tag(tag)?;
        let mut conn = self.inner.conn.clone();
        let mut out = TagCounts::default();
        let by = CancelledBy::Tag {
            tag: tag.to_owned(),
        };
        for q in self.tag_queues(queue).await? {
            // A move records nothing: history off for it.
            let policy = match action {
                Some(_) => HistoryPolicy::from_ms(0),
                None => {
                    crate::engine::flow::queue_flags(self, &q, None)
                        .await?
                        .history
                }
            };
            for keys in self.queue_shards(&q).await? {
                let mut cursor: Option<String> = None;
                loop {
                    let record = policy.cancel_target(&keys, self.now_ms());
                    let act = action.unwrap_or(BulkAction::Cancel(&by));
                    let step = tag_bulk(
                        &mut conn,
                        &keys,
                        tag,
                        TAG_BATCH,
                        act,
                        &record,
                        cursor.as_deref(),
                    )
                    .await?;
                    out.add(q.as_str(), step.affected);
                    if !step.more {
                        break;
                    }
                    cursor = step.last;
                }
            }
        }
        Ok(out)
    }
}
