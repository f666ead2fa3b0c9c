//! The dispatcher's pacing policies, pure and unit-tested: how many orders one dispatch
//! call asks for ([`CallSizer`], sized by time: `max_call`) and how long the dispatcher
//! waits between passes while orders come due steadily ([`ArrivalRate`], the lateness
//! budget). No I/O here: the dispatcher feeds them what its passes saw.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The share of the lateness budget the dispatcher spends waiting for more due orders
/// (1/3: with 5 ms, passes about 1.7 ms apart under load); the rest covers the read and the
/// handler's start, which take 2–3 ms at p99 on a 2-core machine (with 2/5 the p99 was at
/// the budget's edge, 4.7–5.5 ms: docs/benchmarks.md).
pub const BUDGET_SPACING: (u32, u32) = (1, 3);

/// The fewest orders a call sized by `max_call` asks for (below, the per-call cost would
/// outweigh the orders').
pub const MIN_CALL_BATCH: usize = 64;

/// The time per order a dispatcher assumes before it has measured one (ns): FACTS' 4–10 µs
/// per order of `dequeue.lua`, on the high side.
const FIRST_NS_PER_ORDER: u64 = 8_000;

/// The range the measured time per order is kept in (ns): the pass's wall time also holds
/// a busy host's scheduling delays (unbounded: 112 orders per call, a third of the drain
/// rate); `dequeue.lua` itself costs 4–10 µs per order.
const NS_PER_ORDER_RANGE: (u64, u64) = (2_000, 12_000);

/// The wait between passes a lateness budget allows: its [`BUDGET_SPACING`] share.
pub(crate) fn budget_spacing(lateness_budget: Duration) -> Duration {
    lateness_budget * BUDGET_SPACING.0 / BUDGET_SPACING.1
}

/// Orders per dispatch call, from the measured time per order (shared by the passes of
/// one dispatcher; a relaxed atomic: a stale reading only sizes one call differently).
#[derive(Debug)]
pub(crate) struct CallSizer {
    ns_per_order: AtomicU64,
}

impl Default for CallSizer {
    fn default() -> Self {
        CallSizer {
            ns_per_order: AtomicU64::new(FIRST_NS_PER_ORDER),
        }
    }
}

impl CallSizer {
    /// Orders per call now: what fits `max_call` at the measured time per order, within
    /// [`MIN_CALL_BATCH`]..=`batch` (`batch` when `max_call` is zero: sizing off).
    pub(crate) fn size(&self, max_call: Duration, batch: usize) -> usize {
        fit(max_call, self.ns_per_order.load(Ordering::Relaxed), batch)
    }

    /// Records a pass that took `elapsed` to move `moved` orders in calls of up to `n` (only
    /// passes with a full call count: with a few orders the per-call cost would dominate).
    pub(crate) fn measure(&self, elapsed: Duration, moved: usize, n: usize) {
        if moved < n || moved < MIN_CALL_BATCH {
            return;
        }
        let sample = u64::try_from(elapsed.as_nanos() / moved as u128).unwrap_or(u64::MAX);
        let old = self.ns_per_order.load(Ordering::Relaxed);
        self.ns_per_order
            .store(smooth(old, sample), Ordering::Relaxed);
    }
}

/// What fits `max_call` at `ns_per_order`, within [`MIN_CALL_BATCH`]..=`batch`.
fn fit(max_call: Duration, ns_per_order: u64, batch: usize) -> usize {
    let max_ns = u64::try_from(max_call.as_nanos()).unwrap_or(u64::MAX);
    if max_ns == 0 {
        return batch;
    }
    let fit = usize::try_from(max_ns / ns_per_order.max(1)).unwrap_or(usize::MAX);
    fit.clamp(MIN_CALL_BATCH.min(batch), batch)
}

/// The time per order after one more sample: smoothed over a few passes (one stall of this
/// process does not shrink calls), kept within [`NS_PER_ORDER_RANGE`].
fn smooth(old: u64, sample: u64) -> u64 {
    (old.saturating_mul(3).saturating_add(sample) / 4)
        .clamp(NS_PER_ORDER_RANGE.0, NS_PER_ORDER_RANGE.1)
}

/// The rate at which orders come due, as the passes saw it (orders moved per ms between
/// pass starts, smoothed), and the wait between passes it calls for.
#[derive(Debug, Default)]
pub(crate) struct ArrivalRate {
    /// Orders per millisecond.
    per_ms: f64,
    /// When the previous pass started, unix µs.
    last_us: Option<i64>,
}

impl ArrivalRate {
    /// Records a pass that started at `started_us` and moved `moved`; returns how long the
    /// next pass should wait after it: `linger` when one is set (non-zero); else the
    /// budget's share when at least one more order is expected in that time, zero
    /// otherwise (a trickle goes out as soon as due, a backlog in full batches anyway).
    pub(crate) fn spacing(
        &mut self,
        started_us: i64,
        moved: usize,
        linger: Duration,
        lateness_budget: Duration,
    ) -> Duration {
        if let Some(last) = self.last_us {
            let ms = ((started_us - last) as f64 / 1000.0).max(0.001);
            let now = moved as f64 / ms;
            // Smoothed over a few passes, so one empty or one full pass does not swing it.
            self.per_ms = 0.7 * self.per_ms + 0.3 * now;
        }
        self.last_us = Some(started_us);
        if !linger.is_zero() {
            return linger;
        }
        let spacing = budget_spacing(lateness_budget);
        let expected = self.per_ms * spacing.as_secs_f64() * 1000.0;
        if expected >= 1.0 {
            spacing
        } else {
            Duration::ZERO
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_call_fits_max_call_within_its_bounds() {
        // 4 ms at 8 µs per order: 500 orders.
        assert_eq!(fit(4 * MS, 8_000, 1000), 500);
        // Never fewer than MIN_CALL_BATCH, never more than the batch.
        assert_eq!(fit(4 * MS, 1_000_000, 1000), MIN_CALL_BATCH);
        assert_eq!(fit(4 * MS, 1, 1000), 1000);
        // A batch below MIN_CALL_BATCH is the batch.
        assert_eq!(fit(4 * MS, 1_000_000, 10), 10);
        // Sizing off.
        assert_eq!(fit(Duration::ZERO, 8_000, 700), 700);
    }

    #[test]
    fn the_time_per_order_is_smoothed_and_bounded() {
        let s = CallSizer::default();
        assert_eq!(s.size(4 * MS, 1000), 500);
        // A pass with less than a full call is not a sample.
        s.measure(Duration::from_millis(100), 10, 500);
        assert_eq!(s.size(4 * MS, 1000), 500);
        // Full passes at 2 µs per order move the estimate a quarter of the way each time.
        s.measure(Duration::from_millis(1), 500, 500);
        assert_eq!(s.ns_per_order.load(Ordering::Relaxed), 6_500);
        for _ in 0..50 {
            s.measure(Duration::from_millis(1), 500, 500);
        }
        assert_eq!(s.ns_per_order.load(Ordering::Relaxed), NS_PER_ORDER_RANGE.0);
        // A stall (1 s for 500 orders) cannot push it past the top of the range.
        for _ in 0..50 {
            s.measure(Duration::from_secs(1), 500, 500);
        }
        assert_eq!(s.ns_per_order.load(Ordering::Relaxed), NS_PER_ORDER_RANGE.1);
    }

    #[test]
    fn a_steady_flow_is_spaced_by_the_budget_share_a_trickle_is_not() {
        let budget = 5 * MS;
        let mut r = ArrivalRate::default();
        // The first pass has no rate yet.
        assert_eq!(r.spacing(0, 10, Duration::ZERO, budget), Duration::ZERO);
        // 10 orders per ms for a while: more than one expected per 1.67 ms.
        let mut t = 0;
        let mut last = Duration::ZERO;
        for _ in 0..10 {
            t += 1000;
            last = r.spacing(t, 10, Duration::ZERO, budget);
        }
        assert_eq!(last, budget_spacing(budget));
        // A trickle: one order per second.
        let mut r = ArrivalRate::default();
        let mut t = 0;
        for _ in 0..10 {
            t += 1_000_000;
            last = r.spacing(t, 1, Duration::ZERO, budget);
        }
        assert_eq!(last, Duration::ZERO);
        // A linger replaces the budget's spacing.
        assert_eq!(r.spacing(t + 1000, 1, 2 * MS, budget), 2 * MS);
    }
}
