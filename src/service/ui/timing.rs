//! The dashboard's timing: per queue, orders scheduled, dispatched and acknowledged per
//! second and handler lateness (p50, p99) over the last hour, in an in-process ring buffer
//! fed by the same calls as `/metrics` (a [`Sink`] of [`crate::engine::telemetry`]).
//!
//! Ten-second slots, 360 of them per queue, for at most [`MAX_QUEUES`] queues: bounded
//! whatever the traffic. Lateness is counted in the Prometheus histogram's buckets, and its
//! quantiles are estimated the way `histogram_quantile` does (linear within a bucket). The
//! numbers are this process's: its dispatchers, workers and API.

use crate::engine::clock::Clock;
use crate::engine::telemetry::Sink;
use crate::service::metrics::LATENESS_BUCKETS;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// One slot's length.
pub const SLOT_MS: i64 = 10_000;
/// Slots kept per queue: one hour.
pub const SLOTS: usize = 360;
/// Most queues tracked (registered queues only reach the sink; this bounds it regardless).
pub const MAX_QUEUES: usize = 1000;

#[derive(Debug, Clone, Default)]
struct Slot {
    scheduled: u64,
    dispatched: u64,
    acked: u64,
    /// Lateness counts per bucket of [`LATENESS_BUCKETS`], plus one above the last.
    late: Vec<u64>,
}

/// One queue's slots, oldest first; `first` is the slot number of the front.
#[derive(Debug, Default)]
struct Ring {
    first: i64,
    slots: VecDeque<Slot>,
}

impl Ring {
    /// The slot for `slot` (creating the ones in between, dropping those older than an
    /// hour); `None` for a slot already dropped.
    fn at(&mut self, slot: i64) -> Option<&mut Slot> {
        let len = i64::try_from(self.slots.len()).unwrap_or(0);
        if self.slots.is_empty() || slot >= self.first + len + i64::try_from(SLOTS).unwrap_or(360) {
            // Nothing kept would survive: start over at `slot`.
            self.slots.clear();
            self.first = slot;
        }
        if slot < self.first {
            return None;
        }
        while self.first + i64::try_from(self.slots.len()).unwrap_or(0) <= slot {
            self.slots.push_back(Slot::default());
        }
        while self.slots.len() > SLOTS {
            self.slots.pop_front();
            self.first += 1;
        }
        let i = usize::try_from(slot - self.first).ok()?;
        self.slots.get_mut(i)
    }
}

/// The ring buffers of every queue.
pub struct Timing {
    clock: Arc<dyn Clock>,
    queues: Mutex<HashMap<String, Ring>>,
}

impl std::fmt::Debug for Timing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timing").finish_non_exhaustive()
    }
}

/// One slot as the API answers it: rates per second and lateness in ms.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Point {
    /// The slot's start, unix ms.
    pub at_ms: i64,
    /// Orders scheduled per second.
    pub scheduled_per_s: f64,
    /// Orders dispatched per second.
    pub dispatched_per_s: f64,
    /// Entries acknowledged (handled successfully) per second, all groups.
    pub acked_per_s: f64,
    /// Lateness p50, ms (`None` without handler starts in the slot).
    pub late_p50_ms: Option<f64>,
    /// Lateness p99, ms.
    pub late_p99_ms: Option<f64>,
}

/// A queue's timing over the last hour.
#[derive(Debug, Clone, Serialize)]
pub struct TimingAnswer {
    /// The queue.
    pub queue: String,
    /// The slot length, ms.
    pub slot_ms: i64,
    /// One point per slot, oldest first, ending with the current slot.
    pub points: Vec<Point>,
}

impl Timing {
    /// Empty buffers, slots on `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Timing {
            clock,
            queues: Mutex::new(HashMap::new()),
        }
    }

    fn with_slot(&self, queue: &str, f: impl FnOnce(&mut Slot)) {
        let slot = self.clock.now_ms().div_euclid(SLOT_MS);
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        if !queues.contains_key(queue) && queues.len() >= MAX_QUEUES {
            return;
        }
        if let Some(s) = queues.entry(queue.to_owned()).or_default().at(slot) {
            f(s);
        }
    }

    /// The last hour of `queue` (empty points where nothing happened).
    pub fn answer(&self, queue: &str) -> TimingAnswer {
        let now_slot = self.clock.now_ms().div_euclid(SLOT_MS);
        let first = now_slot - i64::try_from(SLOTS).unwrap_or(360) + 1;
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let ring = queues.get(queue);
        let per_s = |n: u64| n as f64 * 1000.0 / SLOT_MS as f64;
        let points = (first..=now_slot)
            .map(|slot| {
                let s = ring
                    .and_then(|r| {
                        let i = usize::try_from(slot - r.first).ok()?;
                        r.slots.get(i)
                    })
                    .cloned()
                    .unwrap_or_default();
                Point {
                    at_ms: slot * SLOT_MS,
                    scheduled_per_s: per_s(s.scheduled),
                    dispatched_per_s: per_s(s.dispatched),
                    acked_per_s: per_s(s.acked),
                    late_p50_ms: quantile(&s.late, 0.5).map(|x| x * 1000.0),
                    late_p99_ms: quantile(&s.late, 0.99).map(|x| x * 1000.0),
                }
            })
            .collect();
        TimingAnswer {
            queue: queue.to_owned(),
            slot_ms: SLOT_MS,
            points,
        }
    }
}

impl Sink for Timing {
    fn scheduled(&self, queue: &str, n: u64) {
        self.with_slot(queue, |s| s.scheduled += n);
    }

    fn dispatched(&self, queue: &str, n: u64) {
        self.with_slot(queue, |s| s.dispatched += n);
    }

    fn handled(&self, queue: &str, _group: &str, outcome: &'static str) {
        if outcome == "success" {
            self.with_slot(queue, |s| s.acked += 1);
        }
    }

    fn lateness(&self, queue: &str, _group: &str, seconds: f64) {
        let i = LATENESS_BUCKETS
            .iter()
            .position(|&le| seconds <= le)
            .unwrap_or(LATENESS_BUCKETS.len());
        self.with_slot(queue, |s| {
            if s.late.is_empty() {
                s.late = vec![0; LATENESS_BUCKETS.len() + 1];
            }
            s.late[i] += 1;
        });
    }
}

/// The `q` quantile of bucket counts (upper bounds [`LATENESS_BUCKETS`], then +Inf), seconds,
/// interpolated linearly within its bucket as Prometheus' `histogram_quantile` does.
fn quantile(counts: &[u64], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut seen = 0u64;
    for (i, &c) in counts.iter().enumerate() {
        if c > 0 && (seen + c) as f64 >= rank {
            let lower = if i == 0 { 0.0 } else { LATENESS_BUCKETS[i - 1] };
            let Some(&upper) = LATENESS_BUCKETS.get(i) else {
                // Beyond the last bucket: its lower bound, as Prometheus answers.
                return Some(lower);
            };
            let within = (rank - seen as f64) / c as f64;
            return Some(lower + (upper - lower) * within.clamp(0.0, 1.0));
        }
        seen += c;
    }
    LATENESS_BUCKETS.last().copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicI64, Ordering};

    #[derive(Debug)]
    struct Manual(AtomicI64);
    impl Clock for Manual {
        fn now_ms(&self) -> i64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    #[test]
    fn slots_roll_over_an_hour_and_quantiles_follow_the_buckets() {
        let clock = Arc::new(Manual(AtomicI64::new(1_800_000_000_000)));
        let t = Timing::new(clock.clone());
        t.scheduled("q", 50);
        t.dispatched("q", 20);
        t.handled("q", "g", "success");
        t.handled("q", "g", "retry");
        for _ in 0..99 {
            t.lateness("q", "g", 0.002);
        }
        t.lateness("q", "g", 20.0);
        let a = t.answer("q");
        assert_eq!(a.points.len(), SLOTS);
        let last = a.points.last().unwrap();
        assert_eq!(
            (
                last.scheduled_per_s,
                last.dispatched_per_s,
                last.acked_per_s
            ),
            (5.0, 2.0, 0.1)
        );
        let p50 = last.late_p50_ms.unwrap();
        assert!(p50 > 1.0 && p50 <= 2.5, "{p50}");
        assert!(last.late_p99_ms.unwrap() <= 2.5, "{:?}", last.late_p99_ms);
        assert_eq!(a.points[0].late_p50_ms, None);
        // Two hours later the old slot is gone; the buffer stays bounded.
        clock.0.fetch_add(2 * 3_600_000, Ordering::SeqCst);
        t.scheduled("q", 1);
        let a = t.answer("q");
        assert_eq!(a.points.iter().map(|p| p.scheduled_per_s).sum::<f64>(), 0.1);
        assert!(t.queues.lock().unwrap()["q"].slots.len() <= SLOTS);
        assert_eq!(t.answer("other").points.len(), SLOTS);
    }
}
