//! A schedule batch's pure steps (no I/O, unit-tested): [`validate`] the orders, [`plan`]
//! them into script calls per shard, and [`fold`] the calls' outcomes back into one answer
//! per order. [`Client::schedule_many`](super::Client::schedule_many) runs validate → plan →
//! send (`enqueue.lua`) → fold.

use super::options::{ENQUEUE_CHUNK_BYTES, ENQUEUE_CHUNK_ORDERS};
use crate::engine::error::{Error, InvalidInput, Result};
use crate::engine::keys::shard_of;
use crate::engine::message::{BatchItem, ItemOutcome, Mode, NewOrder, ScheduleOutcome, Scheduled};
use crate::engine::outcome::WriteOutcome;
use crate::engine::scripts::Enqueued;

/// Checks every order of a batch (at `now`, unix ms) and the batch's mode: each order's due
/// time, or the first error, naming the order's place in the batch.
pub(super) fn validate(
    orders: &[NewOrder],
    mode: Mode,
    now: i64,
    max_payload_bytes: usize,
) -> Result<Vec<i64>, InvalidInput> {
    let in_batch = |index: usize, e: InvalidInput| InvalidInput::InBatch {
        index,
        source: Box::new(e),
    };
    let dues = orders
        .iter()
        .enumerate()
        .map(|(index, o)| {
            o.validate(now, max_payload_bytes)
                .map_err(|e| in_batch(index, e))
        })
        .collect::<Result<Vec<i64>, InvalidInput>>()?;
    if mode == Mode::IfAbsent
        && let Some(index) = orders.iter().position(|o| o.debounce.is_some())
    {
        let e = InvalidInput::Option {
            name: "debounce",
            reason: "cannot go with if_absent (a debounce moves a waiting order)".into(),
        };
        return Err(in_batch(index, e));
    }
    Ok(dues)
}

/// Groups a batch by shard (batch order kept within a shard) and cuts it into script calls
/// of at most [`ENQUEUE_CHUNK_ORDERS`] orders and [`ENQUEUE_CHUNK_BYTES`] payload bytes (an
/// order larger than that goes alone): (shard, the orders' places in the batch) per call.
pub(super) fn plan(orders: &[NewOrder], shards: u16) -> Vec<(u16, Vec<usize>)> {
    let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); usize::from(shards)];
    for (i, o) in orders.iter().enumerate() {
        by_shard[usize::from(shard_of(&o.id, shards))].push(i);
    }
    let mut calls = Vec::new();
    for (shard, idxs) in by_shard.iter().enumerate() {
        let shard = u16::try_from(shard).unwrap_or(0);
        let mut start = 0;
        while start < idxs.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < idxs.len()
                && end - start < ENQUEUE_CHUNK_ORDERS
                && (end == start || bytes + orders[idxs[end]].payload.len() <= ENQUEUE_CHUNK_BYTES)
            {
                bytes += orders[idxs[end]].payload.len();
                end += 1;
            }
            calls.push((shard, idxs[start..end].to_vec()));
            start = end;
        }
    }
    calls
}

/// What a batch's calls did, order by order.
#[derive(Debug)]
pub(super) struct Folded {
    /// Each order's outcome (`None`: no call answered for it).
    results: Vec<Option<ItemOutcome>>,
    /// Per order: the due time the script set, and a duplicate's last dispatch.
    set_by_script: Vec<(Option<i64>, Option<i64>)>,
    /// Per order cancelled by an event that arrived first: the event's name.
    by_event: Vec<Option<String>>,
    /// The failed call's error that says the least ("may have been written" over "not
    /// written").
    failed: Option<Error>,
    /// Whether any call went through.
    succeeded: bool,
}

/// Folds each call's outcome (in `calls`' order: the orders' places per call) into one
/// result per order of a batch of `n`.
pub(super) fn fold(calls: &[Vec<usize>], outcomes: Vec<Result<Vec<Enqueued>>>, n: usize) -> Folded {
    let mut f = Folded {
        results: vec![None; n],
        set_by_script: vec![(None, None); n],
        by_event: vec![None; n],
        failed: None,
        succeeded: false,
    };
    for (idxs, r) in calls.iter().zip(outcomes) {
        match r {
            Ok(outs) => {
                f.succeeded = true;
                for (&i, o) in idxs.iter().zip(outs) {
                    f.results[i] = Some(o.outcome.into());
                    f.set_by_script[i] = (o.due_ms, o.dispatched_at_ms);
                    f.by_event[i] = o.event;
                }
            }
            Err(e) => {
                let o = match e.write_outcome() {
                    WriteOutcome::NotApplied => ItemOutcome::NotWritten,
                    WriteOutcome::Unknown => ItemOutcome::Unknown,
                };
                for &i in idxs {
                    f.results[i] = Some(o);
                }
                if f.failed
                    .as_ref()
                    .is_none_or(|e| e.write_outcome() == WriteOutcome::NotApplied)
                {
                    f.failed = Some(e);
                }
            }
        }
    }
    f
}

fn written(o: &Option<ItemOutcome>) -> bool {
    o.is_some_and(|o| matches!(o, ItemOutcome::Created | ItemOutcome::Updated))
}

impl Folded {
    /// The earliest due time among the orders written (`dues`: the requested ones).
    pub(super) fn earliest_written(&self, dues: &[i64]) -> Option<i64> {
        self.results
            .iter()
            .zip(dues.iter().zip(&self.set_by_script))
            .filter(|(o, _)| written(o))
            .map(|(_, (&d, (set, _)))| set.unwrap_or(d))
            .min()
    }

    /// How many orders were written (created or updated).
    pub(super) fn written(&self) -> u64 {
        self.results.iter().filter(|o| written(o)).count() as u64
    }

    /// How many orders an event that arrived first cancelled.
    pub(super) fn cancelled_by_event(&self) -> u64 {
        self.by_event.iter().filter(|e| e.is_some()).count() as u64
    }

    /// The failed call's error, if a call failed.
    pub(super) fn failure(&self) -> Option<&Error> {
        self.failed.as_ref()
    }

    /// The batch's answer: one [`Scheduled`] per order; the error when no call went
    /// through; [`Error::PartialBatch`] (each order's fate) when some did and some failed.
    pub(super) fn answer(self, orders: &[NewOrder], dues: &[i64]) -> Result<Vec<Scheduled>> {
        if let Some(e) = self.failed {
            if !self.succeeded {
                return Err(e);
            }
            return Err(Error::PartialBatch {
                results: self
                    .results
                    .into_iter()
                    .zip(orders)
                    .map(|(o, order)| BatchItem {
                        id: order.id.clone(),
                        outcome: o.unwrap_or(ItemOutcome::Unknown),
                    })
                    .collect(),
                source: Box::new(e),
            });
        }
        self.results
            .into_iter()
            .zip(
                orders
                    .iter()
                    .zip(dues)
                    .zip(self.set_by_script)
                    .zip(self.by_event),
            )
            .map(
                |(o, (((order, &due), (set_due, dispatched_at_ms)), event))| {
                    let outcome = match o {
                        Some(ItemOutcome::Created) => ScheduleOutcome::Created,
                        Some(ItemOutcome::Updated) => ScheduleOutcome::Updated,
                        Some(ItemOutcome::Unchanged) => ScheduleOutcome::Unchanged,
                        Some(ItemOutcome::Duplicate) => ScheduleOutcome::Duplicate,
                        Some(ItemOutcome::CancelledByEvent) => ScheduleOutcome::CancelledByEvent,
                        _ => {
                            return Err(Error::Reply {
                                context: "scheduling orders",
                                detail: "an order got no outcome".into(),
                            });
                        }
                    };
                    Ok(Scheduled {
                        id: order.id.clone(),
                        due_at_ms: set_due.unwrap_or(due),
                        outcome,
                        dispatched_at_ms,
                        event,
                    })
                },
            )
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::when::When;
    use serde_json::json;

    /// "Now" in the tests, unix ms (2027).
    const NOW: i64 = 1_800_000_000_000;

    fn order(id: &str) -> NewOrder {
        NewOrder::new(id, When::AtMs(NOW + 1_000), json!({"id": id}))
    }

    fn enq(outcome: ScheduleOutcome) -> Enqueued {
        Enqueued {
            outcome,
            due_ms: None,
            dispatched_at_ms: None,
            event: None,
        }
    }

    #[test]
    fn validation_names_the_first_bad_order_and_a_debounce_without_upsert() {
        let mut orders = vec![order("a"), order("b"), order("")];
        let e = validate(&orders, Mode::Upsert, NOW, 1 << 20).unwrap_err();
        assert!(matches!(e, InvalidInput::InBatch { index: 2, .. }), "{e}");
        orders.pop();
        assert_eq!(
            validate(&orders, Mode::Upsert, NOW, 1 << 20).unwrap(),
            [NOW + 1_000, NOW + 1_000]
        );
        let wait = std::time::Duration::from_secs(1);
        let d = crate::engine::time_rules::Debounce::new(wait, wait).unwrap();
        orders[1] = NewOrder::debounced("b", d, json!({}));
        let e = validate(&orders, Mode::IfAbsent, NOW, 1 << 20).unwrap_err();
        assert!(matches!(e, InvalidInput::InBatch { index: 1, .. }), "{e}");
        assert!(e.to_string().contains("debounce"), "{e}");
    }

    #[test]
    fn a_plan_keeps_batch_order_per_shard_and_cuts_calls_at_the_chunk_size() {
        let orders: Vec<NewOrder> = (0..ENQUEUE_CHUNK_ORDERS + 3)
            .map(|i| order(&format!("o{i}")))
            .collect();
        let one = plan(&orders, 1);
        assert_eq!(one.len(), 2);
        assert_eq!(one[0].1, (0..ENQUEUE_CHUNK_ORDERS).collect::<Vec<_>>());
        assert_eq!(
            one[1].1,
            (ENQUEUE_CHUNK_ORDERS..orders.len()).collect::<Vec<_>>()
        );
        let four = plan(&orders, 4);
        let mut seen: Vec<usize> = four.iter().flat_map(|(_, i)| i.clone()).collect();
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..orders.len()).collect::<Vec<_>>(),
            "each order once"
        );
        for (shard, idxs) in &four {
            assert!(idxs.windows(2).all(|w| w[0] < w[1]), "batch order");
            assert!(idxs.iter().all(|&i| shard_of(&orders[i].id, 4) == *shard));
        }
    }

    #[test]
    fn a_fold_answers_each_order_and_reports_a_partial_batch_by_order() {
        let orders = vec![order("a"), order("b"), order("c")];
        let dues = [2_000, 2_000, 2_000];
        let calls = vec![vec![0, 2], vec![1]];
        // Both calls through: one answer per order, in batch order.
        let mut debounced = enq(ScheduleOutcome::Updated);
        debounced.due_ms = Some(5_000);
        let f = fold(
            &calls,
            vec![
                Ok(vec![enq(ScheduleOutcome::Created), debounced]),
                Ok(vec![enq(ScheduleOutcome::Duplicate)]),
            ],
            3,
        );
        assert_eq!((f.written(), f.earliest_written(&dues)), (2, Some(2_000)));
        let answer = f.answer(&orders, &dues).unwrap();
        let got: Vec<(&str, ScheduleOutcome, i64)> = answer
            .iter()
            .map(|s| (s.id.as_str(), s.outcome, s.due_at_ms))
            .collect();
        assert_eq!(
            got,
            [
                ("a", ScheduleOutcome::Created, 2_000),
                ("b", ScheduleOutcome::Duplicate, 2_000),
                ("c", ScheduleOutcome::Updated, 5_000),
            ]
        );
        // The second call failed without writing: a partial batch naming each order's fate.
        let refused = || Error::QueueNotFound { queue: "q".into() };
        let f = fold(
            &calls,
            vec![
                Ok(vec![
                    enq(ScheduleOutcome::Created),
                    enq(ScheduleOutcome::Created),
                ]),
                Err(refused()),
            ],
            3,
        );
        match f.answer(&orders, &dues).unwrap_err() {
            Error::PartialBatch { results, .. } => {
                let fates: Vec<ItemOutcome> = results.iter().map(|r| r.outcome).collect();
                assert_eq!(
                    fates,
                    [
                        ItemOutcome::Created,
                        ItemOutcome::NotWritten,
                        ItemOutcome::Created
                    ]
                );
            }
            other => panic!("{other:?}"),
        }
        // No call through: the error itself; "may have been written" wins over "not written".
        let unknown = Error::NotReplicated {
            acked: 0,
            wanted: 1,
            timeout: std::time::Duration::from_millis(10),
        };
        let f = fold(&calls, vec![Err(refused()), Err(unknown)], 3);
        assert!(matches!(f.failure(), Some(Error::NotReplicated { .. })));
        assert!(matches!(
            f.answer(&orders, &dues),
            Err(Error::NotReplicated { .. })
        ));
    }
}
