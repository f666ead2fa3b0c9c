//! The admin layer: every operation the command line and the HTTP API both offer, with the
//! same validation and the same typed answers (the JSON shapes of both surfaces).
//!
//! A surface parses its own syntax (flags, paths, bodies) into these calls and renders the
//! answer; it never validates a queue name or an id, opens a client, or builds an answer of
//! its own.

use crate::engine::admin::Queues;
use crate::engine::admin::dead::{DeadPage, Selection};
use crate::engine::admin::history::OrderHistory;
use crate::engine::admin::stats::QueueStats;
use crate::engine::client::{Client, ClientOptions};
use crate::engine::error::{InvalidInput, Result};
use crate::engine::flow::PauseState;
use crate::engine::history::HistoryPolicy;
use crate::engine::keys::{QueueName, validate_id, validate_member_name};
use crate::engine::message::{CancelOutcome, Mode, NewOrder, ScheduleOutcome, Scheduled};
use crate::engine::{admin::QueueInfo, client::QueueCreated};
use serde::Serialize;
use std::time::Duration;

/// Most messages in one batch call.
pub const MAX_BATCH: usize = 10_000;
/// Dead letters listed when no limit is given.
pub const DEFAULT_DEAD_LIMIT: usize = 100;
/// Most dead letters one list call returns.
pub const MAX_DEAD_LIMIT: usize = 10_000;

/// One scheduled order, as both surfaces answer a schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScheduledAnswer {
    /// The queue.
    pub queue: String,
    /// The order id.
    pub id: String,
    /// When it is due, unix ms.
    pub due_at_ms: i64,
    /// `created`, `updated`, `unchanged`, `duplicate` or `cancelled_by_event`.
    pub outcome: ScheduleOutcome,
    /// With `duplicate`: when the id was last dispatched, unix ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dispatched_at_ms: Option<i64>,
    /// With `cancelled_by_event`: the name of the event that arrived first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
}

impl ScheduledAnswer {
    fn new(queue: &str, s: Scheduled) -> Self {
        ScheduledAnswer {
            queue: queue.to_owned(),
            id: s.id,
            due_at_ms: s.due_at_ms,
            outcome: s.outcome,
            dispatched_at_ms: s.dispatched_at_ms,
            event: s.event,
        }
    }
}

/// A batch's answer: one result per message, in order.
#[derive(Debug, Clone, Serialize)]
pub struct BatchAnswer {
    /// The results.
    pub results: Vec<ScheduledAnswer>,
}

/// The answer to a lookup of something that is not there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NotFoundAnswer {
    /// The queue, when the lookup named one order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// The order id, when the lookup named one order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Always `not_found`.
    pub outcome: &'static str,
}

/// A cancel's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CancelledAnswer {
    /// Always `cancelled`.
    pub outcome: &'static str,
}

/// Statistics of one or more queues.
#[derive(Debug, Clone, Serialize)]
pub struct StatsAnswer {
    /// One entry per queue (a page of them for every queue: see `next`).
    pub queues: Vec<QueueStats>,
    /// For every queue: the name to pass as `after` for the next page (`null` on the last).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<Option<String>>,
    /// For every queue: the totals over all of them, whatever the page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<StatsSummary>,
}

/// Totals over every registered queue (the overview's first line, however many queues).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StatsSummary {
    /// Registered queues.
    pub queues: u64,
    /// Queues whose dispatch is paused.
    pub paused: u64,
    /// Consumer groups, over every queue.
    pub groups: u64,
    /// Orders scheduled and not yet dispatched.
    pub scheduled: u64,
    /// Of those, orders whose due time has passed.
    pub overdue: u64,
    /// Entries in the streams.
    pub stream_length: u64,
    /// Entries delivered and not yet acknowledged, over every group.
    pub pending: u64,
    /// Dead letters.
    pub dead: u64,
}

/// Queues per page of `GET /v1/stats` when `limit` is not given.
pub const DEFAULT_STATS_LIMIT: usize = 200;
/// The most queues one page of `GET /v1/stats` holds.
pub const MAX_STATS_LIMIT: usize = 1000;

/// A statistics page limit: the default when absent; outside 1..=[`MAX_STATS_LIMIT`]
/// refused, naming `limit`.
pub fn stats_limit(limit: Option<usize>) -> Result<usize, InvalidInput> {
    match limit {
        None => Ok(DEFAULT_STATS_LIMIT),
        Some(n) if (1..=MAX_STATS_LIMIT).contains(&n) => Ok(n),
        Some(_) => Err(InvalidInput::Option {
            name: "limit",
            reason: format!("must be 1..={MAX_STATS_LIMIT}"),
        }),
    }
}

impl StatsAnswer {
    /// The page of `all` (sorted by queue name) after the queue `after`, at most `limit`
    /// queues, with the totals over all of them.
    pub fn page(all: &[QueueStats], after: Option<&str>, limit: usize) -> StatsAnswer {
        let mut summary = StatsSummary::default();
        for s in all {
            summary.queues += 1;
            summary.paused += u64::from(s.paused);
            summary.groups += s.groups.len() as u64;
            summary.scheduled += s.scheduled;
            summary.overdue += s.overdue;
            summary.stream_length += s.stream_length;
            summary.dead += s.dead;
            summary.pending += s.groups.iter().map(|g| g.pending).sum::<u64>();
        }
        let start = after.map_or(0, |a| all.partition_point(|s| s.queue.as_str() <= a));
        let queues: Vec<QueueStats> = all[start..].iter().take(limit).cloned().collect();
        let next = (start + queues.len() < all.len())
            .then(|| queues.last().map(|q| q.queue.clone()))
            .flatten();
        StatsAnswer {
            queues,
            next: Some(next),
            summary: Some(summary),
        }
    }
}

/// The queues of the namespace.
#[derive(Debug, Clone, Serialize)]
pub struct QueuesAnswer {
    /// Their names, sorted.
    pub queues: Vec<String>,
}

/// A deleted queue: what it held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueDeletedAnswer {
    /// The queue.
    pub queue: String,
    /// Always true.
    pub deleted: bool,
    /// Orders that were scheduled.
    pub scheduled: u64,
    /// Stream entries some group had not read yet.
    pub unread: u64,
    /// Entries that were pending.
    pub pending: u64,
    /// Dead letters.
    pub dead: u64,
}

/// A deleted consumer group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupDeletedAnswer {
    /// The queue.
    pub queue: String,
    /// The group.
    pub group: String,
    /// Always true.
    pub deleted: bool,
    /// Entries that were pending in it (dropped with it).
    pub pending: u64,
}

/// How many dead letters were replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ReplayedAnswer {
    /// Count.
    pub replayed: u64,
}

/// How many dead letters were purged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PurgedAnswer {
    /// Count.
    pub purged: u64,
}

/// Checks a queue name and an order id (before anything is opened).
pub fn check_order_ref(queue: &str, id: &str) -> Result<(), InvalidInput> {
    QueueName::new(queue)?;
    validate_id(id)
}

/// Checks a queue name and an optional group name.
pub fn check_queue_group(queue: &str, group: Option<&str>) -> Result<(), InvalidInput> {
    QueueName::new(queue)?;
    if let Some(g) = group {
        validate_member_name("group", g)?;
    }
    Ok(())
}

/// Which dead letters a replay or purge is about: every one, or the listed entry ids.
pub fn selection(all: bool, entry_ids: Vec<String>) -> Result<Selection, InvalidInput> {
    match (all, entry_ids.is_empty()) {
        (true, true) => Ok(Selection::All),
        (false, false) => Ok(Selection::Ids(entry_ids)),
        _ => Err(InvalidInput::Selection {
            reason: "give either all (--all, \"all\": true) or a non-empty list of entry ids \
                     (ENTRY_ID..., \"entry_ids\"), not both"
                .into(),
        }),
    }
}

/// A dead-letter list limit: the default when absent, capped; zero is refused (every
/// surface: HTTP `?limit=0` and the CLI's `--limit 0` answer the same 400 / exit 2).
pub fn dead_limit(limit: Option<usize>) -> Result<usize, InvalidInput> {
    match limit {
        Some(0) => Err(InvalidInput::Option {
            name: "limit",
            reason: format!("must be 1..={MAX_DEAD_LIMIT}"),
        }),
        other => Ok(other.unwrap_or(DEFAULT_DEAD_LIMIT).min(MAX_DEAD_LIMIT)),
    }
}

/// The batch size rule.
pub fn check_batch_len(n: usize) -> Result<(), InvalidInput> {
    if n > MAX_BATCH {
        return Err(InvalidInput::BatchTooLarge {
            size: n,
            limit: MAX_BATCH,
        });
    }
    Ok(())
}

/// The admin operations on one client.
#[derive(Debug, Clone)]
pub struct Admin {
    queues: Queues,
}

impl Admin {
    /// Admin operations through `client`.
    pub fn new(client: Client) -> Self {
        Admin {
            queues: client.admin(),
        }
    }

    /// Connects to `redis_url` with the key `namespace`.
    pub async fn connect(redis_url: &str, namespace: &str) -> Result<Self> {
        let opts = ClientOptions::default().namespace(namespace);
        Ok(Admin::new(Client::connect_with(redis_url, opts).await?))
    }

    /// The client.
    pub fn client(&self) -> &Client {
        self.queues.client()
    }

    /// The engine's queue administration it goes through.
    pub fn engine_admin(&self) -> &Queues {
        &self.queues
    }

    /// Schedules one order.
    pub async fn schedule(
        &self,
        queue: &str,
        order: NewOrder,
        mode: Mode,
    ) -> Result<ScheduledAnswer> {
        let s = self
            .queues
            .client()
            .schedule_with(queue, order, mode)
            .await?;
        Ok(ScheduledAnswer::new(queue, s))
    }

    /// Schedules a batch (validated whole first).
    pub async fn schedule_batch(
        &self,
        queue: &str,
        orders: &[NewOrder],
        mode: Mode,
    ) -> Result<BatchAnswer> {
        check_batch_len(orders.len())?;
        let results = self
            .queues
            .client()
            .schedule_many(queue, orders, mode)
            .await?;
        Ok(BatchAnswer {
            results: results
                .into_iter()
                .map(|s| ScheduledAnswer::new(queue, s))
                .collect(),
        })
    }

    /// What happened to an order (scheduled, or dispatched with each group's state), or the
    /// not-found answer naming it.
    pub async fn get(
        &self,
        queue: &str,
        id: &str,
    ) -> Result<std::result::Result<OrderHistory, NotFoundAnswer>> {
        Ok(match self.queues.history(queue, id).await? {
            Some(h) => Ok(h),
            None => Err(NotFoundAnswer {
                queue: Some(queue.to_owned()),
                id: Some(id.to_owned()),
                outcome: "not_found",
            }),
        })
    }

    /// Cancels an order.
    pub async fn cancel(
        &self,
        queue: &str,
        id: &str,
    ) -> Result<std::result::Result<CancelledAnswer, NotFoundAnswer>> {
        Ok(match self.queues.client().cancel(queue, id).await? {
            CancelOutcome::Cancelled => Ok(CancelledAnswer {
                outcome: "cancelled",
            }),
            CancelOutcome::NotFound => Err(NotFoundAnswer {
                queue: None,
                id: None,
                outcome: "not_found",
            }),
        })
    }

    /// Registers a queue (`shards` defaults to 1 for a new queue; an existing queue keeps
    /// its count when none is given). Idempotent; another shard count than the registered
    /// one is refused. `history_retention`, the default `expires_after` (zero clears it)
    /// `dedup_window` and the `cancel_on` rules, when given, are set on it (checked before
    /// anything is written).
    pub async fn create_queue(
        &self,
        queue: &str,
        shards: Option<u16>,
        history_retention: Option<Duration>,
        expires_after: Option<Duration>,
        dedup_window: Option<Duration>,
        cancel_on: Option<&[crate::engine::events::CancelRule]>,
    ) -> Result<QueueCreated> {
        if let Some(rules) = cancel_on {
            crate::engine::events::validate_rules(rules)?;
        }
        if let Some(r) = history_retention {
            HistoryPolicy::new(r)?;
        }
        if let Some(e) = expires_after {
            crate::engine::expiry::check_queue_default(e)?;
        }
        if let Some(w) = dedup_window {
            crate::engine::time_rules::DedupWindow::new(w)?;
        }
        let shards = match shards {
            Some(n) => n,
            None => self
                .queues
                .queue_info(queue)
                .await?
                .map_or(1, |existing| existing.shards),
        };
        let created = self.queues.create_queue(queue, shards).await?;
        if let Some(r) = history_retention {
            self.queues.set_history_retention(queue, r).await?;
        }
        if let Some(e) = expires_after {
            self.queues.set_expires_after(queue, e).await?;
        }
        if let Some(w) = dedup_window {
            self.queues.set_dedup_window(queue, w).await?;
        }
        if let Some(rules) = cancel_on {
            self.queues.set_cancel_on(queue, rules).await?;
        }
        Ok(created)
    }

    /// Every registered queue.
    pub async fn list_queues(&self) -> Result<Vec<QueueInfo>> {
        self.queues.list_queues().await
    }

    /// Deletes a queue and all it holds (refused while it holds work, unless `force`).
    pub async fn delete_queue(&self, queue: &str, force: bool) -> Result<QueueDeletedAnswer> {
        let c = self.queues.delete_queue(queue, force).await?;
        Ok(QueueDeletedAnswer {
            queue: queue.to_owned(),
            deleted: true,
            scheduled: c.scheduled,
            unread: c.unread,
            pending: c.pending,
            dead: c.dead,
        })
    }

    /// Deletes a consumer group on every shard (refused while a consumer of it is alive,
    /// unless `force`).
    pub async fn delete_group(
        &self,
        queue: &str,
        group: &str,
        force: bool,
    ) -> Result<GroupDeletedAnswer> {
        check_queue_group(queue, Some(group))?;
        let pending = self.queues.delete_group(queue, group, force).await?;
        Ok(GroupDeletedAnswer {
            queue: queue.to_owned(),
            group: group.to_owned(),
            deleted: true,
            pending,
        })
    }

    /// Pauses or resumes a queue's dispatch, or one group (`group`).
    pub async fn set_paused(
        &self,
        queue: &str,
        group: Option<&str>,
        paused: bool,
    ) -> Result<PauseState> {
        check_queue_group(queue, group)?;
        self.queues.set_paused(queue, group, paused).await
    }

    /// The queues of the namespace.
    pub async fn queues(&self) -> Result<QueuesAnswer> {
        Ok(QueuesAnswer {
            queues: self.queues.client().queues().await?,
        })
    }

    /// Statistics of `queue`, or of every queue.
    pub async fn stats(&self, queue: Option<&str>) -> Result<StatsAnswer> {
        let queues = match queue {
            Some(q) => vec![self.queues.stats(q).await?],
            None => self.queues.stats_all().await?,
        };
        Ok(StatsAnswer {
            queues,
            next: None,
            summary: None,
        })
    }

    /// A page of dead letters of `queue` (of `group`, if given), oldest first across all
    /// shards, after the cursor `after`.
    pub async fn dead_list(
        &self,
        queue: &str,
        group: Option<&str>,
        after: Option<&str>,
        limit: Option<usize>,
    ) -> Result<DeadPage> {
        check_queue_group(queue, group)?;
        self.queues
            .dead_page(queue, group, after, dead_limit(limit)?)
            .await
    }

    /// Replays dead letters to the group that failed them.
    pub async fn dead_replay(
        &self,
        queue: &str,
        group: Option<&str>,
        sel: &Selection,
    ) -> Result<ReplayedAnswer> {
        check_queue_group(queue, group)?;
        Ok(ReplayedAnswer {
            replayed: self.queues.dead_replay(queue, group, sel).await?,
        })
    }

    /// Deletes dead letters for good.
    pub async fn dead_purge(
        &self,
        queue: &str,
        group: Option<&str>,
        sel: &Selection,
    ) -> Result<PurgedAnswer> {
        check_queue_group(queue, group)?;
        Ok(PurgedAnswer {
            purged: self.queues.dead_purge(queue, group, sel).await?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_keep_their_json_shapes() {
        let a = ScheduledAnswer {
            queue: "q".into(),
            id: "o1".into(),
            due_at_ms: 5,
            outcome: ScheduleOutcome::Created,
            dispatched_at_ms: None,
            event: None,
        };
        assert_eq!(
            serde_json::to_value(&a).unwrap(),
            serde_json::json!({"queue": "q", "id": "o1", "due_at_ms": 5, "outcome": "created"})
        );
        let d = ScheduledAnswer {
            outcome: ScheduleOutcome::Duplicate,
            dispatched_at_ms: Some(4),
            ..a
        };
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            serde_json::json!({"queue": "q", "id": "o1", "due_at_ms": 5, "outcome": "duplicate", "dispatched_at_ms": 4})
        );
        let nf = NotFoundAnswer {
            queue: None,
            id: None,
            outcome: "not_found",
        };
        assert_eq!(
            serde_json::to_value(&nf).unwrap(),
            serde_json::json!({"outcome": "not_found"})
        );
        assert_eq!(
            serde_json::to_value(ReplayedAnswer { replayed: 3 }).unwrap(),
            serde_json::json!({"replayed": 3})
        );
    }

    #[test]
    fn selection_needs_exactly_one_form() {
        assert_eq!(selection(true, vec![]).unwrap(), Selection::All);
        assert!(selection(false, vec![]).is_err());
        assert!(selection(true, vec!["1-0".into()]).is_err());
        assert_eq!(dead_limit(None), Ok(DEFAULT_DEAD_LIMIT));
        assert_eq!(dead_limit(Some(1 << 30)), Ok(MAX_DEAD_LIMIT));
        assert!(
            dead_limit(Some(0)).is_err(),
            "zero is refused on every surface"
        );
    }
}
