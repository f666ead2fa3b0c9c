//! The history checker. An order's versions are told apart by their due time (each
//! schedule of an id gets a due time it never had). An operation answered with a timeout
//! or a 5xx other than `redis_unavailable` is "unknown": it may or may not have happened,
//! and every rule allows both.

use crate::drive::Healed;
use crate::history::{Answer, Delivery, Fault, Kind, Op, Res, Via};
use crate::world::{EPH, HELD_PER_CONSUMER, HOOK, LIB, QUEUE, World};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write;

/// The summary and the violations.
pub struct Checked {
    pub summary: String,
    pub violations: Vec<String>,
}

fn groups_of(queue: &str) -> &'static [&'static str] {
    if queue == QUEUE {
        &[HOOK, LIB]
    } else {
        &[HOOK]
    }
}

fn describe(op: &Op) -> String {
    let via = match op.via {
        Via::Http(i) => format!("HTTP serve {i}"),
        Via::Lib => "library".into(),
    };
    format!(
        "{:?} via {via} sent {} answered {} -> {:?}",
        op.kind, op.sent_ms, op.answered_ms, op.res
    )
}

/// Whether `op` creates a version (an order with its due time) if it happened.
fn version_due(op: &Op) -> Option<i64> {
    match (&op.kind, &op.res) {
        (Kind::Schedule { due }, Res::Ok(_) | Res::Unknown(_)) => Some(*due),
        (Kind::Reschedule { due }, Res::Unknown(_)) => Some(*due),
        (Kind::Reschedule { due }, Res::Ok(o)) if o == "rescheduled" => Some(*due),
        _ => None,
    }
}

/// Whether `op` was answered "it was scheduled" (and then replaced, moved or removed it).
fn found_scheduled(op: &Op) -> bool {
    matches!(
        op.res.outcome(),
        Some("updated" | "unchanged" | "rescheduled" | "cancelled")
    )
}

pub fn judge(ops: &[Op], dels: &[Delivery], faults: &[Fault], drained: bool) -> Judged {
    let mut v = Vec::new();

    // Deliveries by (queue, id).
    let mut by_key: HashMap<(String, String), Vec<&Delivery>> = HashMap::new();
    for d in dels {
        by_key
            .entry((d.queue.clone(), d.id.clone()))
            .or_default()
            .push(d);
    }
    let delivered_ok = |q: &str, id: &str, due: i64, g: &str| -> usize {
        by_key
            .get(&(q.to_owned(), id.to_owned()))
            .map(|ds| {
                ds.iter()
                    .filter(|d| d.due_ms == due && d.group == g && d.answer == Answer::Ok)
                    .count()
            })
            .unwrap_or(0)
    };

    // 1. Nothing before its due time: the receiver's clock is Redis TIME's (checked at
    //    start); a library delivery also carries the dispatch time Redis wrote.
    for d in dels {
        if d.received_ms < d.due_ms {
            v.push(format!(
                "[early] {}/{} received before its due time: group {} attempt {} due {} received {} dispatched {:?}",
                d.queue, d.id, d.group, d.attempt, d.due_ms, d.received_ms, d.dispatched_ms
            ));
        } else if let Some(t) = d.dispatched_ms.filter(|t| *t < d.due_ms) {
            // The latest fault before it: a clue to the cause.
            let after = faults.iter().rev().find(|f| f.at_ms <= t).map_or_else(
                || "no fault before it".to_owned(),
                |f| format!("{} ms after \"{}\"", t - f.at_ms, f.what),
            );
            v.push(format!(
                "[early-dispatch] {}/{} dispatched {} ms before its due time by Redis TIME (the stream entry id): group {} attempt {} due {} dispatched {t} received {}; {after}",
                d.queue, d.id, d.due_ms - t, d.group, d.attempt, d.due_ms, d.received_ms
            ));
        }
        if let Some((_, instant)) = d.id.split_once('@')
            && instant.parse::<i64>().ok() != Some(d.due_ms)
        {
            v.push(format!(
                "[phantom] {}/{}: a schedule tick delivered with due time {} (its id names another)",
                d.queue, d.id, d.due_ms
            ));
        }
    }

    // Order operations per (queue, id), in the order sent (one lifecycle sends them one
    // after the other).
    let mut orders: BTreeMap<(String, String), Vec<&Op>> = BTreeMap::new();
    for op in ops {
        if matches!(
            op.kind,
            Kind::Schedule { .. } | Kind::Reschedule { .. } | Kind::Cancel
        ) {
            orders
                .entry((op.queue.clone(), op.id.clone()))
                .or_default()
                .push(op);
        }
    }
    for list in orders.values_mut() {
        list.sort_by_key(|o| o.sent_ms);
    }
    let deletes: Vec<&Op> = ops
        .iter()
        .filter(|o| o.queue == EPH && o.kind == Kind::QueueDelete && !o.res.is_refused())
        .collect();

    let (mut required_n, mut forbidden_n, mut optional_n) = (0usize, 0usize, 0usize);
    let mut last_required: Vec<(String, String, i64)> = Vec::new();
    let mut never_dispatched: Vec<(String, String)> = Vec::new();
    for ((queue, id), list) in &orders {
        // 2. Versions replaced, moved or cancelled while scheduled: never delivered.
        let mut forbidden: BTreeMap<i64, &Op> = BTreeMap::new();
        for (k, opk) in list.iter().enumerate() {
            if !found_scheduled(opk) {
                continue;
            }
            for opj in list[..k].iter().rev() {
                if opj.res.is_unknown() {
                    break;
                }
                if let Some(due) = version_due(opj) {
                    forbidden.insert(due, opk);
                    break;
                }
            }
        }
        // 3. Versions on EPH scheduled, then deleted with the queue before they were due.
        for opi in list.iter().filter(|o| queue == EPH && o.res.is_ok()) {
            let Some(due) = version_due(opi) else {
                continue;
            };
            if let Some(d) = deletes.iter().find(|d| {
                d.res.outcome() == Some("deleted")
                    && d.sent_ms > opi.answered_ms
                    && d.answered_ms < due
            }) {
                forbidden.entry(due).or_insert(d);
            }
        }
        let dues: BTreeSet<i64> = list.iter().filter_map(|o| version_due(o)).collect();
        for d in by_key
            .get(&(queue.clone(), id.clone()))
            .into_iter()
            .flatten()
        {
            if let Some(why) = forbidden.get(&d.due_ms) {
                v.push(format!(
                    "[cancelled-delivered] {queue}/{id}: the version due {} was delivered (group {} attempt {} received {}) \
                     although {}",
                    d.due_ms,
                    d.group,
                    d.attempt,
                    d.received_ms,
                    describe(why)
                ));
            } else if !dues.contains(&d.due_ms) {
                v.push(format!(
                    "[phantom] {queue}/{id}: delivered with due time {} that no operation asked for (group {} received {})",
                    d.due_ms, d.group, d.received_ms
                ));
            }
        }
        // 4. Every acknowledged version not replaced, moved, cancelled or deleted, and not
        //    followed by an operation of unknown outcome: delivered at least once per group.
        let mut any_delivery_possible = false;
        let last_version = list.iter().rposition(|o| version_due(o).is_some());
        for (i, opi) in list.iter().enumerate() {
            let Some(due) = version_due(opi) else {
                continue;
            };
            any_delivery_possible |= !forbidden.contains_key(&due);
            if forbidden.contains_key(&due) {
                forbidden_n += 1;
                continue;
            }
            let later_unknown = list[i + 1..].iter().any(|o| o.res.is_unknown());
            let deleted_maybe =
                queue == EPH && deletes.iter().any(|d| d.answered_ms >= opi.sent_ms);
            if !opi.res.is_ok() || later_unknown || deleted_maybe {
                optional_n += 1;
                continue;
            }
            required_n += 1;
            for g in groups_of(queue) {
                if delivered_ok(queue, id, due, g) == 0 {
                    v.push(format!(
                        "[lost] {queue}/{id}: acknowledged version due {due} never delivered to group {g} \
                         ({}); operations: {}",
                        describe(opi),
                        list.iter().map(|o| describe(o)).collect::<Vec<_>>().join("; ")
                    ));
                }
            }
            if queue == QUEUE && last_version == Some(i) {
                last_required.push((queue.clone(), id.clone(), due));
            }
        }
        if queue == QUEUE && !any_delivery_possible {
            never_dispatched.push((queue.clone(), id.clone()));
        }
    }

    // 5. Recurring schedules: no tick after an acknowledged removal (until the schedule
    //    is declared again).
    let mut crons: BTreeMap<String, Vec<&Op>> = BTreeMap::new();
    for op in ops {
        if matches!(op.kind, Kind::CronUpsert { .. } | Kind::CronRemove) {
            crons.entry(op.id.clone()).or_default().push(op);
        }
    }
    let mut ticks = 0usize;
    for (cid, list) in &mut crons {
        list.sort_by_key(|o| o.sent_ms);
        for (k, r) in list.iter().enumerate() {
            if r.kind != Kind::CronRemove || r.res.outcome() != Some("removed") {
                continue;
            }
            let until = list[k + 1..]
                .iter()
                .find(|o| matches!(o.kind, Kind::CronUpsert { .. }))
                .map_or(i64::MAX, |o| o.sent_ms);
            for d in dels.iter().filter(|d| d.queue == QUEUE) {
                let Some((sid, instant)) = d.id.split_once('@') else {
                    continue;
                };
                let Ok(t) = instant.parse::<i64>() else {
                    continue;
                };
                if sid == cid && t > r.answered_ms && t < until {
                    v.push(format!(
                        "[tick-after-removal] {QUEUE}/{}: a tick due {t} was delivered (group {} received {}) after its schedule's removal was acknowledged: {}",
                        d.id, d.group, d.received_ms, describe(r)
                    ));
                }
            }
        }
    }

    // 6. Dispatch is atomic: what one group got, every group got (after the healing).
    let mut seen: BTreeMap<(String, i64), BTreeSet<&str>> = BTreeMap::new();
    for d in dels
        .iter()
        .filter(|d| d.queue == QUEUE && d.answer == Answer::Ok)
    {
        seen.entry((d.id.clone(), d.due_ms))
            .or_default()
            .insert(d.group.as_str());
        if d.id.contains('@') {
            ticks += 1;
        }
    }
    if drained {
        for ((id, due), groups) in &seen {
            if groups.len() != groups_of(QUEUE).len() {
                v.push(format!(
                    "[partial] {QUEUE}/{id} (due {due}) was delivered to {groups:?} only"
                ));
            }
        }
    } else {
        v.push("[not-drained] the queues did not drain (nothing scheduled, pending or dead) within the wait after healing".into());
    }

    // 7. Duplicates: only work a killed or frozen process held. Each fault may leave
    //    every consumer it touched re-delivering what it held.
    let mut ok_count: HashMap<(&str, &str, i64, &str), usize> = HashMap::new();
    for d in dels.iter().filter(|d| d.answer == Answer::Ok) {
        *ok_count
            .entry((&d.queue, &d.id, d.due_ms, &d.group))
            .or_default() += 1;
    }
    let dups: usize = ok_count.values().map(|n| n - 1).sum();
    let count = |p: &str| faults.iter().filter(|f| f.what.contains(p)).count();
    let (serve_kills, serve_terms) = (count("SIGKILL") - count("redis SIGKILL"), count("SIGTERM"));
    let (redis_kills, redis_stops) = (count("redis SIGKILL"), count("redis SIGSTOP"));
    let failovers = count("redis SENTINEL FAILOVER (");
    // A serve consumes both queues; a Redis fault touches every consumer (2 serves x 2
    // queues, and the library worker).
    let bound = HELD_PER_CONSUMER
        * (2 * (serve_kills + serve_terms) + 5 * (redis_kills + redis_stops + failovers));
    if dups > bound {
        v.push(format!(
            "[duplicates] {dups} duplicate acknowledged deliveries, more than the {bound} the faults' held work allows"
        ));
    }

    // 9. Answers the campaign never provokes: a 4xx other than a deleted queue's 404,
    //    a 5xx other than 503 (bad input is never sent; failures must say what happened).
    for op in ops {
        let reason = match &op.res {
            Res::Refused(r) | Res::Unknown(r) => r,
            Res::Ok(_) => continue,
        };
        let eph_gone = op.queue == EPH && reason.starts_with("404 queue_not_found");
        let client_error = reason.starts_with('4') && !eph_gone;
        let server_error = reason.starts_with('5') && !reason.starts_with("503");
        if client_error || server_error {
            v.push(format!(
                "[unexpected-answer] {}/{}: unexpected answer: {}",
                op.queue,
                op.id,
                describe(op)
            ));
        }
    }

    let mut s = String::new();
    let class = |f: fn(&Res) -> bool| ops.iter().filter(|o| f(&o.res)).count();
    let _ = writeln!(
        s,
        "  operations: {} ({} acknowledged, {} refused, {} unknown); order versions: {required_n} required, {forbidden_n} forbidden, {optional_n} either way",
        ops.len(),
        class(Res::is_ok),
        class(Res::is_refused),
        class(Res::is_unknown)
    );
    let _ = writeln!(
        s,
        "  deliveries: {} ({} acknowledged, {} schedule ticks); duplicates {dups} (bound {bound})",
        dels.len(),
        dels.iter().filter(|d| d.answer == Answer::Ok).count(),
        ticks
    );
    let _ = writeln!(
        s,
        "  faults: serve SIGKILL {serve_kills}, serve SIGTERM {serve_terms}, redis SIGKILL {redis_kills}, redis SIGSTOP {redis_stops}, SENTINEL FAILOVER {failovers}, queue deletes {}",
        deletes.len(),
    );
    let early: Vec<i64> = dels
        .iter()
        .filter_map(|d| d.dispatched_ms.map(|t| d.due_ms - t))
        .filter(|e| *e > 0)
        .collect();
    let early_received = dels.iter().filter(|d| d.received_ms < d.due_ms).count();
    let _ = writeln!(
        s,
        "  early: {} library deliveries dispatched before due (at most {} ms), {early_received} deliveries received before due",
        early.len(),
        early.iter().max().unwrap_or(&0)
    );
    if !v.is_empty() {
        let timeline: Vec<String> = faults
            .iter()
            .map(|f| format!("{} {}", f.at_ms, f.what))
            .collect();
        let _ = writeln!(s, "  fault timeline: {}", timeline.join("; "));
    }
    Judged {
        violations: v,
        last_required,
        never_dispatched,
        summary: s,
    }
}

/// What the history alone says (every rule but the history records').
pub struct Judged {
    pub violations: Vec<String>,
    /// The last version of each `chaos` order that had to be delivered: (queue, id, due).
    pub last_required: Vec<(String, String, i64)>,
    /// `chaos` orders whose every version was cancelled, replaced or moved.
    pub never_dispatched: Vec<(String, String)>,
    /// Summary lines.
    pub summary: String,
}

/// Checks the history in the campaign's world: [`judge`], then the order history records.
pub async fn check(w: &World, healed: &Healed) -> Checked {
    let ops = w.hist.ops.lock().unwrap().clone();
    let dels = w.hist.deliveries.lock().unwrap().clone();
    let faults = w.hist.faults.lock().unwrap().clone();
    let judged = judge(&ops, &dels, &faults, healed.drained);
    let mut v = judged.violations;
    let (last_required, never_dispatched) = (judged.last_required, judged.never_dispatched);

    // 8. The order history agrees with the deliveries: the last version of each order
    //    delivered to every group is "dispatched", at that due time, done in every group;
    //    an order never dispatched has no history, or the record of its cancellation.
    let admin = w.client.admin();
    let mut history_checked = 0;
    let mut attempts_differ = 0;
    if healed.drained {
        for (queue, id, due) in &last_required {
            history_checked += 1;
            match admin.history(queue, id).await {
                Ok(Some(h)) => {
                    let done = groups_of(queue).iter().all(|g| {
                        h.groups
                            .iter()
                            .any(|gh| gh.group == *g && gh.state == delayq::GroupState::Done)
                    });
                    if h.state != delayq::OrderState::Dispatched || h.due_at_ms != *due || !done {
                        v.push(format!(
                            "[history] {queue}/{id}: history says {:?} due {} groups {:?}; delivered due {due} to every group",
                            h.state, h.due_at_ms, h.groups
                        ));
                    }
                    for gh in &h.groups {
                        let last = dels
                            .iter()
                            .filter(|d| {
                                d.id == *id && d.due_ms == *due && d.group == gh.group && d.queue == *queue
                            })
                            .map(|d| d.attempt)
                            .next_back();
                        if last.is_some_and(|a| a != gh.attempts) {
                            attempts_differ += 1;
                        }
                    }
                }
                Ok(None) => v.push(format!(
                    "[history] {queue}/{id}: delivered (due {due}) but the history has no record of it"
                )),
                Err(e) => v.push(format!("[history] {queue}/{id}: history lookup failed: {e}")),
            }
        }
        for (queue, id) in &never_dispatched {
            history_checked += 1;
            // No record, or the record of a cancellation: never one of a dispatch.
            if let Ok(Some(h)) = admin.history(queue, id).await
                && h.state != delayq::OrderState::Cancelled
            {
                v.push(format!(
                    "[history] {queue}/{id}: every version was replaced or cancelled, yet the history says {:?} due {}",
                    h.state, h.due_at_ms
                ));
            }
        }
    }

    let mut s = judged.summary;
    let _ = writeln!(
        s,
        "  history records checked {history_checked}, attempts differing from the receiver's last {attempts_differ}; healing took {} replay round(s)",
        healed.rounds
    );
    let _ = write!(s, "  violations: {}", v.len());
    Checked {
        summary: s,
        violations: v,
    }
}

/// The checker bites: hand-made histories with one defect each.
mod self_test {
    use super::judge;
    use crate::history::{Answer, Delivery, Fault, Kind, Op, Res, Via};
    use crate::world::{EPH, HOOK, LIB, QUEUE};

    fn op(queue: &str, id: &str, kind: Kind, at: i64, res: Res) -> Op {
        Op {
            queue: queue.into(),
            id: id.into(),
            kind,
            via: Via::Lib,
            sent_ms: at,
            answered_ms: at + 5,
            res,
        }
    }

    fn ok(o: &str) -> Res {
        Res::Ok(o.into())
    }

    fn del(queue: &str, id: &str, group: &str, due: i64, at: i64) -> Delivery {
        Delivery {
            queue: queue.into(),
            id: id.into(),
            group: group.into(),
            due_ms: due,
            attempt: 1,
            received_ms: at,
            dispatched_ms: None,
            answer: Answer::Ok,
        }
    }

    /// Both groups of `chaos` got version `due` of `id` at `at`.
    fn both(id: &str, due: i64, at: i64) -> Vec<Delivery> {
        vec![del(QUEUE, id, HOOK, due, at), del(QUEUE, id, LIB, due, at)]
    }

    fn classes(ops: &[Op], dels: &[Delivery], faults: &[Fault]) -> Vec<String> {
        let mut c: Vec<String> = judge(ops, dels, faults, true)
            .violations
            .iter()
            .map(|v| crate::class_of(v).to_owned())
            .collect();
        c.dedup();
        c
    }

    #[test]
    fn a_clean_history_passes() {
        let ops = [
            op(QUEUE, "a", Kind::Schedule { due: 1000 }, 0, ok("created")),
            op(QUEUE, "a", Kind::Cancel, 1200, ok("not_found")),
            op(QUEUE, "b", Kind::Schedule { due: 900 }, 0, ok("created")),
            op(
                QUEUE,
                "b",
                Kind::Reschedule { due: 1100 },
                100,
                ok("rescheduled"),
            ),
        ];
        let mut dels = both("a", 1000, 1000);
        dels.extend(both("b", 1100, 1101));
        assert_eq!(classes(&ops, &dels, &[]), Vec::<String>::new());
    }

    #[test]
    fn an_acknowledged_order_never_delivered_is_lost() {
        let ops = [op(
            QUEUE,
            "a",
            Kind::Schedule { due: 1000 },
            0,
            ok("created"),
        )];
        let dels = vec![del(QUEUE, "a", HOOK, 1000, 1000)];
        assert_eq!(classes(&ops, &dels, &[]), ["lost", "partial"]);
    }

    #[test]
    fn an_order_delivered_after_its_acknowledged_cancel_or_move_is_caught() {
        let ops = [
            op(QUEUE, "a", Kind::Schedule { due: 1000 }, 0, ok("created")),
            op(QUEUE, "a", Kind::Cancel, 100, ok("cancelled")),
            op(QUEUE, "b", Kind::Schedule { due: 1000 }, 0, ok("created")),
            op(
                QUEUE,
                "b",
                Kind::Reschedule { due: 2000 },
                100,
                ok("rescheduled"),
            ),
        ];
        let mut dels = both("a", 1000, 1000);
        dels.extend(both("b", 1000, 1000));
        dels.extend(both("b", 2000, 2000));
        assert_eq!(classes(&ops, &dels, &[]), ["cancelled-delivered"]);
    }

    #[test]
    fn an_operation_of_unknown_outcome_allows_both() {
        let ops = [
            op(QUEUE, "a", Kind::Schedule { due: 1000 }, 0, ok("created")),
            op(
                QUEUE,
                "a",
                Kind::Cancel,
                100,
                Res::Unknown("timeout".into()),
            ),
            op(QUEUE, "b", Kind::Schedule { due: 1000 }, 0, ok("created")),
            op(
                QUEUE,
                "b",
                Kind::Cancel,
                100,
                Res::Unknown("timeout".into()),
            ),
            op(
                QUEUE,
                "c",
                Kind::Schedule { due: 1000 },
                0,
                Res::Unknown("503".into()),
            ),
        ];
        let dels = both("a", 1000, 1000);
        assert_eq!(classes(&ops, &dels, &[]), Vec::<String>::new());
    }

    #[test]
    fn an_early_delivery_is_caught_to_the_millisecond() {
        let ops = [
            op(QUEUE, "a", Kind::Schedule { due: 1000 }, 0, ok("created")),
            op(QUEUE, "b", Kind::Schedule { due: 1000 }, 0, ok("created")),
        ];
        let mut dels = both("a", 1000, 999);
        let mut b = both("b", 1000, 1001);
        b[1].dispatched_ms = Some(999);
        dels.extend(b);
        assert_eq!(classes(&ops, &dels, &[]), ["early", "early-dispatch"]);
    }

    #[test]
    fn an_order_of_a_deleted_queue_that_fires_is_caught() {
        let ops = [
            op(EPH, "a", Kind::Schedule { due: 1000 }, 0, ok("created")),
            op(EPH, "", Kind::QueueDelete, 100, ok("deleted")),
            op(EPH, "", Kind::QueueCreate, 200, ok("created")),
        ];
        let dels = vec![del(EPH, "a", HOOK, 1000, 1000)];
        assert_eq!(classes(&ops, &dels, &[]), ["cancelled-delivered"]);
    }

    #[test]
    fn a_tick_after_an_acknowledged_removal_is_caught() {
        let ops = [
            op(
                QUEUE,
                "c0",
                Kind::CronUpsert { every_s: 1 },
                0,
                ok("created"),
            ),
            op(QUEUE, "c0", Kind::CronRemove, 1500, ok("removed")),
        ];
        let mut dels = both("c0@1000", 1000, 1000);
        dels.extend(both("c0@2000", 2000, 2000));
        assert_eq!(classes(&ops, &dels, &[]), ["tick-after-removal"]);
    }

    #[test]
    fn duplicates_beyond_what_faults_held_are_caught() {
        let ops = [op(
            QUEUE,
            "a",
            Kind::Schedule { due: 1000 },
            0,
            ok("created"),
        )];
        let mut dels = both("a", 1000, 1000);
        dels.extend(both("a", 1000, 1500));
        assert_eq!(classes(&ops, &dels, &[]), ["duplicates"]);
        let kill = Fault {
            at_ms: 1200,
            what: "serve 0 SIGKILL".into(),
        };
        assert_eq!(classes(&ops, &dels, &[kill]), Vec::<String>::new());
    }
}
