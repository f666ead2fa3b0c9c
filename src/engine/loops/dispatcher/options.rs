//! A dispatcher's options: `[dispatcher]` in `serve`'s configuration, their defaults and
//! ranges (checked in one place, [`DispatcherOptions::validate`]).

use crate::engine::error::InvalidInput;
use crate::engine::scripts::MAX_DEQUEUE_BATCH;
use std::time::Duration;

/// Options of a [`Dispatcher`](super::Dispatcher); `[dispatcher]` in `serve`'s configuration (durations
/// written `250ms`, `30s`; unset keys keep the defaults).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct DispatcherOptions {
    /// Most orders moved per script call, 1..=1000 (default 1000); `max_call` may make
    /// calls smaller.
    pub batch: usize,
    /// Longest idle sleep while other processes' wake-ups are not heard (default `250ms`:
    /// before the listener's subscriptions are confirmed, after its connection broke).
    #[serde(with = "crate::engine::duration::human")]
    pub max_idle: Duration,
    /// Longest idle sleep while every shard's wake-ups are heard (default `30s`, never less
    /// than `max_idle`): the look at an idle shard in case a wake-up was lost, one script
    /// call per shard per `idle_poll` per process.
    #[serde(with = "crate::engine::duration::human")]
    pub idle_poll: Duration,
    /// How long one dispatch call should hold Redis at most (default `4ms`; `0s`: off,
    /// every call takes up to `batch`): every other client waits behind a script. Calls are
    /// sized to fit at the time per order measured over full passes, from
    /// [`MIN_CALL_BATCH`] (64) up to `batch`.
    #[serde(with = "crate::engine::duration::human")]
    pub max_call: Duration,
    /// How often the Redis clock is re-read to bound drift (default 30 s; not a
    /// configuration key).
    #[serde(skip)]
    pub clock_sync_every: Duration,
    /// After a pass that moved a few orders (a steady trickle, not a backlog), the next pass
    /// waits at least this long (default `0s`: off). With 2 ms, one call moves a couple of
    /// milliseconds' worth instead of one millisecond's: about a third of the calls (and of
    /// the readers' wake-ups and reads behind them) for up to this much more lateness. A pass
    /// that found nothing does not wait: the first order after a quiet spell goes out at once.
    /// Off by default: [`lateness_budget`](DispatcherOptions::lateness_budget) spaces passes
    /// by itself, from the arrival rate; a linger set here replaces that with a fixed wait.
    #[serde(with = "crate::engine::duration::human")]
    pub linger: Duration,
    /// How late the dispatcher may let a due order be, to move more orders per call
    /// (default `5ms`; `0s`: each order as soon as it is due, the behaviour before budgets).
    /// While orders come due faster than one per [`BUDGET_SPACING`] (a third) of the
    /// budget, a pass that moved some (not a full batch) is followed by the next no sooner
    /// than that share of the budget after it started, so each call moves that much time's
    /// worth; under a trickle (less than one order expected in that time) or a backlog (full
    /// batches) it does not wait. The rest of the budget is the reader's and the handler's start.
    #[serde(with = "crate::engine::duration::human")]
    pub lateness_budget: Duration,
    /// While several processes dispatch the queue, each shard is called by one of them (its
    /// owner in the dispatch roster) and the others stand by: a standby takes a shard over
    /// when its earliest order stays this long overdue (default `1s`; `0s`: no split, every
    /// process calls every shard, as before 2026-11-28). A crashed owner's orders are then
    /// about twice this late at most, once (ARCHITECTURE.md, "Several dispatching processes").
    #[serde(with = "crate::engine::duration::human")]
    pub takeover_after: Duration,
}

/// The default [`DispatcherOptions::idle_poll`].
pub const DEFAULT_IDLE_POLL: Duration = Duration::from_secs(30);

/// Longest [`DispatcherOptions::idle_poll`].
pub const MAX_IDLE_POLL: Duration = Duration::from_secs(86_400);

/// Longest [`DispatcherOptions::max_call`].
pub const MAX_CALL: Duration = Duration::from_secs(1);

/// Longest lateness budget.
pub const MAX_LATENESS_BUDGET: Duration = Duration::from_secs(1);

/// Longest [`DispatcherOptions::takeover_after`].
pub const MAX_TAKEOVER_AFTER: Duration = Duration::from_secs(60);

impl Default for DispatcherOptions {
    fn default() -> Self {
        DispatcherOptions {
            batch: MAX_DEQUEUE_BATCH,
            max_idle: Duration::from_millis(250),
            idle_poll: DEFAULT_IDLE_POLL,
            max_call: Duration::from_millis(4),
            clock_sync_every: Duration::from_secs(30),
            linger: Duration::ZERO,
            lateness_budget: Duration::from_millis(5),
            takeover_after: Duration::from_secs(1),
        }
    }
}

impl DispatcherOptions {
    /// Sets the batch size.
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }

    /// Sets the longest idle sleep.
    pub fn max_idle(mut self, d: Duration) -> Self {
        self.max_idle = d;
        self
    }

    /// Sets the idle look while wake-ups are heard.
    pub fn idle_poll(mut self, d: Duration) -> Self {
        self.idle_poll = d;
        self
    }

    /// Sets the longest time one dispatch call should hold Redis (zero: off).
    pub fn max_call(mut self, d: Duration) -> Self {
        self.max_call = d;
        self
    }

    /// Sets the linger between small passes.
    pub fn linger(mut self, d: Duration) -> Self {
        self.linger = d;
        self
    }

    /// Sets the lateness budget.
    pub fn lateness_budget(mut self, d: Duration) -> Self {
        self.lateness_budget = d;
        self
    }

    /// Sets how long a shard owned by another process may stay overdue before this one
    /// takes it over (zero: every process calls every shard).
    pub fn takeover_after(mut self, d: Duration) -> Self {
        self.takeover_after = d;
        self
    }

    /// Checks every option's range (the one place they are written).
    pub fn validate(&self) -> Result<(), InvalidInput> {
        if !(1..=MAX_DEQUEUE_BATCH).contains(&self.batch) {
            return Err(InvalidInput::Option {
                name: "batch",
                reason: format!("must be 1..={MAX_DEQUEUE_BATCH}, got {}", self.batch),
            });
        }
        if self.max_idle.is_zero() {
            return Err(InvalidInput::Option {
                name: "max_idle",
                reason: "must be more than zero".into(),
            });
        }
        if self.idle_poll.is_zero() || self.idle_poll > MAX_IDLE_POLL {
            return Err(InvalidInput::Option {
                name: "idle_poll",
                reason: format!("must be more than zero and at most {MAX_IDLE_POLL:?}"),
            });
        }
        if self.max_call > MAX_CALL {
            return Err(InvalidInput::Option {
                name: "max_call",
                reason: format!("must be at most {MAX_CALL:?} (zero: off)"),
            });
        }
        if self.linger > Duration::from_millis(50) || self.linger > self.max_idle {
            return Err(InvalidInput::Option {
                name: "linger",
                reason: "must be at most 50ms and at most max_idle".into(),
            });
        }
        if self.lateness_budget > MAX_LATENESS_BUDGET {
            return Err(InvalidInput::Option {
                name: "lateness_budget",
                reason: format!("must be at most {MAX_LATENESS_BUDGET:?}"),
            });
        }
        if self.takeover_after > MAX_TAKEOVER_AFTER {
            return Err(InvalidInput::Option {
                name: "takeover_after",
                reason: format!("must be at most {MAX_TAKEOVER_AFTER:?} (zero: off)"),
            });
        }
        if self.clock_sync_every.is_zero() {
            return Err(InvalidInput::Option {
                name: "clock_sync_every",
                reason: "must be more than zero".into(),
            });
        }
        Ok(())
    }
}
