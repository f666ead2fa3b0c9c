//! The rules the command line and the HTTP API add to the engine's admin API, and nothing
//! else: both surfaces call the engine ([`Client`], [`crate::engine::admin::Queues`])
//! directly and serialize its types; what lives here is what only a surface has.
//!
//! - The checks made before anything is opened (a queue name with an order id or a group).
//! - Batch caps ([`MAX_BATCH`]), dead-letter and statistics page limits, dead-letter
//!   selections (`--all` or ids).
//! - The few answer shapes that name what the engine returns bare: a count
//!   ([`Replayed`], [`Purged`]), a value with the queue it belongs to ([`InQueue`],
//!   [`QueueDeleted`], [`GroupDeleted`]), an outcome as an object ([`Outcome`]), and the
//!   statistics page with its totals ([`StatsAnswer`]).

use crate::engine::admin::QueueContents;
use crate::engine::admin::dead::Selection;
use crate::engine::admin::stats::QueueStats;
use crate::engine::client::Client;
use crate::engine::error::{InvalidInput, Result};
use crate::engine::keys::{QueueName, validate_id, validate_member_name};
use crate::engine::message::{Mode, NewOrder, Scheduled};
use serde::Serialize;

/// Most messages in one batch call.
pub const MAX_BATCH: usize = 10_000;
/// Dead letters listed when no limit is given.
pub const DEFAULT_DEAD_LIMIT: usize = 100;
/// Most dead letters one list call returns.
pub const MAX_DEAD_LIMIT: usize = 10_000;
/// Queues per page of `GET /v1/stats` when `limit` is not given.
pub const DEFAULT_STATS_LIMIT: usize = 200;
/// The most queues one page of `GET /v1/stats` holds.
pub const MAX_STATS_LIMIT: usize = 1000;

/// An engine value with the queue it belongs to: `{"queue": ..., <its fields>}` (a
/// schedule's answer is `InQueue<Scheduled>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InQueue<'a, T> {
    /// The queue.
    pub queue: &'a str,
    /// The value, its fields beside `queue`.
    #[serde(flatten)]
    pub value: T,
}

/// An outcome as an object: `{"outcome": ...}` (a cancel's answer is
/// `Outcome<CancelOutcome>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Outcome<T> {
    /// The engine's outcome.
    pub outcome: T,
}

/// A deleted queue: its name, `deleted: true` and what it held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueDeleted<'a> {
    /// The queue.
    pub queue: &'a str,
    /// Always true.
    pub deleted: bool,
    /// What it held (scheduled, unread, pending, dead).
    #[serde(flatten)]
    pub held: QueueContents,
}

impl<'a> QueueDeleted<'a> {
    /// The answer to deleting `queue`, which held `held`.
    pub fn new(queue: &'a str, held: QueueContents) -> Self {
        QueueDeleted {
            queue,
            deleted: true,
            held,
        }
    }
}

/// A deleted consumer group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupDeleted<'a> {
    /// The queue.
    pub queue: &'a str,
    /// The group.
    pub group: &'a str,
    /// Always true.
    pub deleted: bool,
    /// Entries that were pending in it (dropped with it).
    pub pending: u64,
}

/// How many dead letters were replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Replayed {
    /// Count.
    pub replayed: u64,
}

/// How many dead letters were purged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Purged {
    /// Count.
    pub purged: u64,
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

impl StatsAnswer {
    /// Just these queues' statistics (`{"queues": [...]}`, no page, no totals).
    pub fn of(queues: Vec<QueueStats>) -> StatsAnswer {
        StatsAnswer {
            queues,
            next: None,
            summary: None,
        }
    }

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

/// A batch as the surfaces take it: the batch size rule ([`check_batch_len`]), then
/// [`Client::schedule_many`] (which has no limit of its own).
pub async fn schedule_batch(
    client: &Client,
    queue: &str,
    orders: &[NewOrder],
    mode: Mode,
) -> Result<Vec<Scheduled>> {
    check_batch_len(orders.len())?;
    client.schedule_many(queue, orders, mode).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::message::{CancelOutcome, ScheduleOutcome};

    #[test]
    fn answers_keep_their_json_shapes() {
        let s = Scheduled {
            id: "o1".into(),
            due_at_ms: 5,
            outcome: ScheduleOutcome::Created,
            dispatched_at_ms: None,
            event: None,
        };
        let a = InQueue {
            queue: "q",
            value: s.clone(),
        };
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#"{"queue":"q","id":"o1","due_at_ms":5,"outcome":"created"}"#
        );
        let d = InQueue {
            queue: "q",
            value: Scheduled {
                outcome: ScheduleOutcome::Duplicate,
                dispatched_at_ms: Some(4),
                ..s
            },
        };
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"queue":"q","id":"o1","due_at_ms":5,"outcome":"duplicate","dispatched_at_ms":4}"#
        );
        assert_eq!(
            serde_json::to_string(&Outcome {
                outcome: CancelOutcome::NotFound
            })
            .unwrap(),
            r#"{"outcome":"not_found"}"#
        );
        let held = QueueContents {
            scheduled: 1,
            unread: 2,
            pending: 3,
            dead: 4,
            lag: vec![("g".into(), 2)],
        };
        assert_eq!(
            serde_json::to_string(&QueueDeleted::new("q", held)).unwrap(),
            r#"{"queue":"q","deleted":true,"scheduled":1,"unread":2,"pending":3,"dead":4}"#
        );
        assert_eq!(
            serde_json::to_string(&Replayed { replayed: 3 }).unwrap(),
            r#"{"replayed":3}"#
        );
    }

    fn stats(queue: &str, scheduled: u64, paused: bool, pending: &[u64]) -> QueueStats {
        QueueStats {
            queue: queue.into(),
            scheduled,
            overdue: 1,
            oldest_overdue_ms: 0,
            next_due_at_ms: None,
            stream_length: 2,
            dead: 3,
            history: 0,
            paused,
            groups: pending
                .iter()
                .map(|&p| crate::engine::admin::stats::GroupStats {
                    group: format!("g{p}"),
                    pending: p,
                    lag: None,
                    consumers: 0,
                    idle_ms: None,
                    paused: false,
                    kind: None,
                    keys_active: 0,
                    key_waiting: 0,
                })
                .collect(),
            priorities: Vec::new(),
        }
    }

    #[test]
    fn a_stats_page_holds_its_queues_the_cursor_to_the_next_and_the_totals_of_all() {
        let all = [
            stats("a", 1, false, &[4]),
            stats("b", 10, true, &[]),
            stats("c", 100, false, &[5, 6]),
        ];
        let names = |p: &StatsAnswer| p.queues.iter().map(|q| q.queue.clone()).collect::<Vec<_>>();
        let first = StatsAnswer::page(&all, None, 2);
        assert_eq!(names(&first), ["a", "b"]);
        assert_eq!(first.next, Some(Some("b".to_owned())));
        // The totals are over every queue, whatever the page.
        let totals = StatsSummary {
            queues: 3,
            paused: 1,
            groups: 3,
            scheduled: 111,
            overdue: 3,
            stream_length: 6,
            pending: 15,
            dead: 9,
        };
        assert_eq!(first.summary.as_ref(), Some(&totals));
        let last = StatsAnswer::page(&all, Some("b"), 2);
        assert_eq!(names(&last), ["c"]);
        assert_eq!(last.next, Some(None), "the last page says so with null");
        assert_eq!(last.summary, Some(totals));
        // After a name between two queues: from the next one; after the last: empty.
        assert_eq!(names(&StatsAnswer::page(&all, Some("a0"), 5)), ["b", "c"]);
        assert!(StatsAnswer::page(&all, Some("z"), 5).queues.is_empty());
        // One queue's statistics: no cursor, no totals.
        assert_eq!(
            serde_json::to_value(StatsAnswer::of(Vec::new())).unwrap(),
            serde_json::json!({"queues": []})
        );
        assert_eq!(stats_limit(None), Ok(DEFAULT_STATS_LIMIT));
        assert!(stats_limit(Some(0)).is_err() && stats_limit(Some(MAX_STATS_LIMIT + 1)).is_err());
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
