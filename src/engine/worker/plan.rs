//! The reader's plan (pure: no I/O, unit-tested): which of its lanes to read, with how much
//! of the budget each, by the worker's priority mode, and what a read's outcome teaches it.
//!
//! A reader ([`super::reader`]) asks a [`Pass`] for its next [`Ask`], reads those lanes
//! (`read.lua`, all in flight together), tells the pass each lane's [`LaneOutcome`], and
//! asks again until the pass has nothing more to read.

use crate::engine::priority::{Priority, Rotation};

/// What the plan knows of one lane: its shard and its level's rank.
#[derive(Debug, Clone, Copy)]
struct Lane {
    shard: usize,
    level: Priority,
}

/// One reader's knowledge of its lanes (every priority lane of its shards, by index).
#[derive(Debug)]
pub(super) struct LanePlan {
    lanes: Vec<Lane>,
    /// Which lanes may have entries: all at first; then those the blocking wait reported
    /// new entries in, or whose last read came back full; all of them after a failed read.
    pub(super) to_read: Vec<usize>,
    /// Which lanes are in use: every `normal` lane; a `high` or `low` lane once its stream
    /// exists (`read.lua` reports the shard's lanes in use with every read). A lane in use
    /// more urgent than any in `to_read` is read on every pass (strict), and every lane in
    /// use is (weighted): a busy reader never blocks, so this is how it sees new urgent
    /// entries.
    live: Vec<bool>,
    /// Where the next read starts among a rank's lanes, so a small budget rotates over shards.
    rotate: usize,
    /// The weighted mode's rotation over levels.
    rotation: Rotation,
}

/// One read the plan asks for: `per_lane` entries from each of `lanes` (all of one level).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Ask {
    /// The level's rank.
    pub(super) rank: usize,
    /// The lanes to read (indexes).
    pub(super) lanes: Vec<usize>,
    /// Entries to take from each.
    pub(super) per_lane: usize,
}

/// How one lane's read went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LaneOutcome {
    /// It returned `got` entries; `lanes` are its shard's lanes in use (1 = high, 2 = low).
    Read { got: usize, lanes: u8 },
    /// The group is paused (nothing taken).
    Paused { lanes: u8 },
    /// The lane's stream does not exist (a `high` or `low` lane not used yet).
    Missing { lanes: u8 },
    /// The read failed: every lane is read again later (the blocking wait reads the same
    /// streams, so it fails too and cannot tell which healthy lanes got entries).
    Failed,
}

/// Where a pass is.
#[derive(Debug)]
enum Stage {
    /// Strict: the next rank to look at.
    Strict {
        rank: usize,
    },
    /// Weighted: the levels that may still have entries, and this round's reads not asked yet.
    Weighted {
        weights: Vec<u32>,
        active: Vec<usize>,
        pending: Vec<(usize, usize)>,
    },
    Done,
}

/// One read of up to `budget` entries over the plan's lanes.
#[derive(Debug)]
pub(super) struct Pass {
    cands: Vec<usize>,
    left: usize,
    again: Vec<usize>,
    stage: Stage,
    /// The last ask's rank and its share (weighted: a level that comes back short of it
    /// leaves the rotation).
    asked: Option<(usize, usize)>,
    paused: bool,
    /// A read of this pass failed.
    failed: bool,
}

impl LanePlan {
    /// A plan over lanes given as (shard, level); every lane may have entries at first.
    pub(super) fn new(lanes: impl IntoIterator<Item = (usize, Priority)>) -> Self {
        let lanes: Vec<Lane> = lanes
            .into_iter()
            .map(|(shard, level)| Lane { shard, level })
            .collect();
        let mut plan = LanePlan {
            to_read: Vec::new(),
            live: Vec::new(),
            lanes,
            rotate: 0,
            rotation: Rotation::default(),
        };
        plan.restart();
        plan
    }

    /// Forgets what it knew (the queue was deleted and created again): every lane may have
    /// entries, and only the `normal` ones are known to be in use.
    pub(super) fn restart(&mut self) {
        self.to_read = self.all();
        self.live = self
            .lanes
            .iter()
            .map(|l| l.level == Priority::Normal)
            .collect();
    }

    /// Every lane.
    pub(super) fn all(&self) -> Vec<usize> {
        (0..self.lanes.len()).collect()
    }

    /// The lanes of rank `rank` among `among`, in `among`'s order.
    fn of_rank(&self, among: &[usize], rank: usize) -> Vec<usize> {
        among
            .iter()
            .copied()
            .filter(|&i| self.lanes[i].level.rank() == rank)
            .collect()
    }

    /// Starts a read of up to `budget` entries: strict (`weights` none) takes the most
    /// urgent level first and a less urgent one only with what budget is left; weighted
    /// shares the budget among the levels in use by their weights (a level that comes back
    /// short leaves its share to the others).
    pub(super) fn begin(&self, budget: usize, weights: Option<&[u32]>) -> Pass {
        // The lanes to look at: those that may have entries, plus every lane in use that is
        // more urgent than all of them (strict) or every lane in use (weighted).
        let most_urgent = self
            .to_read
            .iter()
            .map(|&i| self.lanes[i].level.rank())
            .min()
            .unwrap_or(usize::MAX);
        let mut cands = self.to_read.clone();
        for (i, l) in self.lanes.iter().enumerate() {
            if self.live[i]
                && (weights.is_some() || l.level.rank() < most_urgent)
                && !cands.contains(&i)
            {
                cands.push(i);
            }
        }
        let stage = match weights {
            None => Stage::Strict { rank: 0 },
            Some(w) => Stage::Weighted {
                weights: w.to_vec(),
                active: (0..Priority::ALL.len())
                    .filter(|&r| !self.of_rank(&cands, r).is_empty())
                    .collect(),
                pending: Vec::new(),
            },
        };
        Pass {
            cands,
            left: budget,
            again: Vec::new(),
            stage,
            asked: None,
            paused: false,
            failed: false,
        }
    }

    /// Chooses among `lanes` (one level) the ones a read of `budget` entries looks at, the
    /// budget split so the reader never holds more than it; lanes left out stay to read.
    fn choose(&mut self, pass: &mut Pass, rank: usize, lanes: &[usize], budget: usize) -> Ask {
        let n = lanes.len().min(budget).max(1);
        let start = self.rotate % lanes.len();
        self.rotate = self.rotate.wrapping_add(1);
        let chosen: Vec<usize> = (0..n).map(|k| lanes[(start + k) % lanes.len()]).collect();
        pass.again.extend(
            lanes
                .iter()
                .copied()
                .filter(|i| !chosen.contains(i) && self.to_read.contains(i)),
        );
        Ask {
            rank,
            lanes: chosen,
            per_lane: budget / n,
        }
    }

    /// Marks the lanes in use of lane `i`'s shard, as `read.lua` reported them.
    fn learn_lanes(&mut self, i: usize, bits: u8) {
        let shard = self.lanes[i].shard;
        for (j, l) in self.lanes.iter().enumerate() {
            if l.shard == shard {
                match l.level {
                    Priority::High if bits & 1 != 0 => self.live[j] = true,
                    Priority::Low if bits & 2 != 0 => self.live[j] = true,
                    _ => {}
                }
            }
        }
    }
}

impl Pass {
    /// The next read, or `None` when the pass is over (then call [`Pass::finish`]).
    pub(super) fn next(&mut self, plan: &mut LanePlan) -> Option<Ask> {
        loop {
            match &mut self.stage {
                Stage::Done => return None,
                Stage::Strict { rank } => {
                    let r = *rank;
                    if r >= Priority::ALL.len() {
                        self.stage = Stage::Done;
                        continue;
                    }
                    *rank += 1;
                    let lanes = plan.of_rank(&self.cands, r);
                    if lanes.is_empty() {
                        continue;
                    }
                    if self.left == 0 || self.paused {
                        self.again
                            .extend(lanes.iter().filter(|i| plan.to_read.contains(i)));
                        continue;
                    }
                    let left = self.left;
                    self.asked = Some((r, left));
                    return Some(plan.choose(self, r, &lanes, left));
                }
                Stage::Weighted {
                    weights,
                    active,
                    pending,
                } => {
                    if self.paused {
                        pending.clear();
                    }
                    if pending.is_empty() {
                        if self.left == 0 || active.is_empty() || self.paused {
                            let rest = std::mem::take(active);
                            for rank in rest {
                                let lanes = plan.of_rank(&self.cands, rank);
                                self.again
                                    .extend(lanes.into_iter().filter(|i| plan.to_read.contains(i)));
                            }
                            self.stage = Stage::Done;
                            continue;
                        }
                        let mut quota = [0usize; 3];
                        for _ in 0..self.left {
                            if let Some(r) = plan.rotation.pick(weights, active) {
                                quota[r] += 1;
                            }
                        }
                        // Asked most urgent first: popped from the end.
                        *pending = quota
                            .iter()
                            .enumerate()
                            .filter(|(_, want)| **want > 0)
                            .map(|(r, want)| (r, *want))
                            .rev()
                            .collect();
                        continue;
                    }
                    let Some((rank, want)) = pending.pop() else {
                        continue;
                    };
                    let lanes = plan.of_rank(&self.cands, rank);
                    self.asked = Some((rank, want));
                    return Some(plan.choose(self, rank, &lanes, want));
                }
            }
        }
    }

    /// Takes in how each lane of `ask` went (in `ask.lanes`' order).
    pub(super) fn record(&mut self, plan: &mut LanePlan, ask: &Ask, outcomes: &[LaneOutcome]) {
        let mut taken = 0;
        for (&i, o) in ask.lanes.iter().zip(outcomes) {
            match *o {
                LaneOutcome::Missing { lanes } => {
                    plan.learn_lanes(i, lanes);
                    plan.live[i] = false;
                }
                LaneOutcome::Paused { lanes } => {
                    plan.learn_lanes(i, lanes);
                    plan.live[i] = true;
                    self.paused = true;
                }
                LaneOutcome::Read { got, lanes } => {
                    plan.learn_lanes(i, lanes);
                    plan.live[i] = true;
                    if got >= ask.per_lane {
                        self.again.push(i); // maybe more: read it again at once
                    }
                    taken += got;
                }
                LaneOutcome::Failed => self.failed = true,
            }
        }
        self.left = self.left.saturating_sub(taken);
        if let (Some((rank, want)), Stage::Weighted { active, .. }) =
            (self.asked.take(), &mut self.stage)
            && taken < want
        {
            active.retain(|&r| r != rank);
        }
    }

    /// Ends the pass: the lanes that may have more are the ones to read next; every lane
    /// after a failed read (one broken stream fails the blocking wait over all of them, so
    /// reads are then the only way to see new entries on the healthy ones).
    pub(super) fn finish(mut self, plan: &mut LanePlan) {
        if self.failed {
            plan.to_read = plan.all();
            return;
        }
        self.again.sort_unstable();
        self.again.dedup();
        plan.to_read = self.again;
    }

    /// Whether a read of this pass found the group paused.
    pub(super) fn paused(&self) -> bool {
        self.paused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `shards` shards, each with its high, normal and low lane (the reader's order).
    fn plan(shards: usize) -> LanePlan {
        LanePlan::new((0..shards).flat_map(|s| Priority::ALL.map(|p| (s, p))))
    }

    /// Runs a pass, answering each ask with `answer(lane, per_lane)`; returns the asks.
    fn run(
        p: &mut LanePlan,
        budget: usize,
        weights: Option<&[u32]>,
        mut answer: impl FnMut(usize, usize) -> LaneOutcome,
    ) -> Vec<Ask> {
        let mut pass = p.begin(budget, weights);
        let mut asks = Vec::new();
        while let Some(ask) = pass.next(p) {
            let out: Vec<LaneOutcome> =
                ask.lanes.iter().map(|&i| answer(i, ask.per_lane)).collect();
            pass.record(p, &ask, &out);
            asks.push(ask);
        }
        pass.finish(p);
        asks
    }

    const HIGH: usize = 0;
    const NORMAL: usize = 1;
    const LOW: usize = 2;

    #[test]
    fn at_first_only_the_normal_lanes_are_in_use_and_every_lane_is_read() {
        let mut p = plan(1);
        let asks = run(&mut p, 10, None, |i, _| match i {
            NORMAL => LaneOutcome::Read { got: 0, lanes: 0 },
            _ => LaneOutcome::Missing { lanes: 0 },
        });
        assert_eq!(asks.iter().map(|a| a.rank).collect::<Vec<_>>(), [0, 1, 2]);
        assert!(p.to_read.is_empty(), "nothing more to read");
        assert_eq!(p.live, [false, true, false]);
    }

    #[test]
    fn strict_reads_a_less_urgent_level_only_with_the_budget_left() {
        let mut p = plan(1);
        let answers = |i: usize, want: usize| match i {
            HIGH => LaneOutcome::Read {
                got: want.min(3),
                lanes: 3,
            },
            _ => LaneOutcome::Read {
                got: want,
                lanes: 3,
            },
        };
        let asks = run(&mut p, 10, None, answers);
        // High gives 3 of 10, normal gets the 7 left and fills them: low waits.
        assert_eq!(
            asks,
            [
                Ask {
                    rank: 0,
                    lanes: vec![HIGH],
                    per_lane: 10
                },
                Ask {
                    rank: 1,
                    lanes: vec![NORMAL],
                    per_lane: 7
                },
            ]
        );
        assert_eq!(
            p.to_read,
            [NORMAL, LOW],
            "the full lane and the one not read"
        );
    }

    #[test]
    fn strict_always_looks_at_a_more_urgent_lane_in_use() {
        let mut p = plan(1);
        // Learn that the shard's high lane is in use, with nothing in it.
        run(&mut p, 10, None, |i, _| match i {
            HIGH => LaneOutcome::Read { got: 0, lanes: 1 },
            _ => LaneOutcome::Read { got: 0, lanes: 1 },
        });
        assert!(p.to_read.is_empty());
        // Only normal is reported new; the high lane in use is looked at first anyway.
        p.to_read = vec![NORMAL];
        let asks = run(&mut p, 10, None, |_, _| LaneOutcome::Read {
            got: 0,
            lanes: 1,
        });
        assert_eq!(asks.iter().map(|a| a.rank).collect::<Vec<_>>(), [0, 1]);
    }

    #[test]
    fn weighted_shares_the_budget_by_weight_and_gives_a_short_level_s_share_to_the_others() {
        let mut p = plan(1);
        // Every level in use and full.
        let asks = run(&mut p, 10, Some(&[6, 3, 1]), |_, want| LaneOutcome::Read {
            got: want,
            lanes: 3,
        });
        let share: Vec<(usize, usize)> = asks.iter().map(|a| (a.rank, a.per_lane)).collect();
        assert_eq!(share, [(0, 6), (1, 3), (2, 1)]);
        // Now high has only 2: its share goes to normal and low in the same pass.
        let asks = run(&mut p, 10, Some(&[6, 3, 1]), |i, want| match i {
            HIGH => LaneOutcome::Read {
                got: want.min(2),
                lanes: 3,
            },
            _ => LaneOutcome::Read {
                got: want,
                lanes: 3,
            },
        });
        let total: usize = asks
            .iter()
            .map(|a| {
                if a.rank == 0 {
                    a.per_lane.min(2)
                } else {
                    a.per_lane
                }
            })
            .sum();
        assert_eq!(total, 10, "the whole budget is used: {asks:?}");
        assert!(
            asks.iter().skip(3).all(|a| a.rank != 0),
            "high left the rotation: {asks:?}"
        );
    }

    #[test]
    fn a_budget_smaller_than_the_lanes_rotates_over_the_shards_and_keeps_the_rest() {
        let mut p = LanePlan::new((0..4).map(|s| (s, Priority::Normal)));
        let asks = run(&mut p, 2, None, |_, want| LaneOutcome::Read {
            got: want,
            lanes: 0,
        });
        assert_eq!(
            asks,
            [Ask {
                rank: 1,
                lanes: vec![0, 1],
                per_lane: 1
            }]
        );
        assert_eq!(p.to_read, [0, 1, 2, 3], "full lanes and the ones left out");
        let asks = run(&mut p, 2, None, |_, want| LaneOutcome::Read {
            got: want,
            lanes: 0,
        });
        assert_eq!(asks[0].lanes, [1, 2], "the next read starts one further");
    }

    #[test]
    fn a_paused_group_ends_the_pass_and_keeps_every_lane_still_to_read() {
        let mut p = plan(1);
        let mut pass = p.begin(10, None);
        let ask = pass.next(&mut p).unwrap();
        assert_eq!(ask.rank, 0);
        pass.record(&mut p, &ask, &[LaneOutcome::Paused { lanes: 3 }]);
        assert!(pass.paused());
        assert_eq!(pass.next(&mut p), None, "nothing more is read while paused");
        pass.finish(&mut p);
        assert_eq!(p.to_read, [NORMAL, LOW]);
    }

    #[test]
    fn a_failed_read_makes_every_lane_read_again_and_a_restart_forgets_the_lanes_in_use() {
        let mut p = plan(2);
        run(&mut p, 10, None, |i, _| {
            if i == 4 {
                LaneOutcome::Failed
            } else {
                LaneOutcome::Read { got: 0, lanes: 3 }
            }
        });
        assert_eq!(
            p.to_read,
            p.all(),
            "shard 1's normal lane failed: the healthy lanes are read again too"
        );
        assert!(p.live.iter().all(|l| *l), "every lane learnt in use");
        p.restart();
        assert_eq!(p.to_read, p.all());
        assert_eq!(p.live, [false, true, false, false, true, false]);
    }
}
