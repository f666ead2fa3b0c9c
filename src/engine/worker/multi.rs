//! One handler over an ordered list of queues ([`MultiWorker`]): one worker per queue (each
//! with its own consumer group, pending list and leases), one shared concurrency budget, and
//! a [`Gate`] that lets the queues' readers take entries in priority order.

use super::{Handler, Hooks, Worker, WorkerOptions, WorkerStats};
use crate::engine::client::Client;
use crate::engine::error::{InvalidInput, Result};
use crate::engine::priority::PriorityMode;
use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

/// Most queues one [`MultiWorker`] serves.
pub const MAX_QUEUES_PER_HANDLER: usize = 16;

/// Who may read next among several queues' readers (rank 0 = the most urgent queue).
///
/// Each reader says whether its queue has a backlog (it will read again at once) or not (it
/// is about to block for new entries, is paused or rate limited). Strict: a queue reads only
/// while no more urgent queue has a backlog. Weighted: among the queues with a backlog, the
/// one that got the least of its share so far reads (entries taken divided by its weight);
/// a queue whose backlog returns starts level with the others, not with credit for its idle
/// time. No lock is held across an await.
#[derive(Debug)]
pub(crate) struct Gate {
    mode: PriorityMode,
    state: Mutex<GateState>,
    changed: Notify,
}

#[derive(Debug)]
struct GateState {
    /// Readers of each rank with a backlog.
    busy: Vec<usize>,
    /// Entries each rank took, divided by its weight (weighted mode).
    served: Vec<f64>,
}

impl Gate {
    /// A gate over `ranks` queues; every reader starts with a backlog (unknown until its
    /// first read).
    pub(crate) fn new(mode: PriorityMode, ranks: usize, readers_per_rank: &[usize]) -> Self {
        Gate {
            mode,
            state: Mutex::new(GateState {
                busy: (0..ranks)
                    .map(|r| readers_per_rank.get(r).copied().unwrap_or(1))
                    .collect(),
                served: vec![0.0; ranks],
            }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn allowed(&self, st: &GateState, rank: usize) -> bool {
        match &self.mode {
            PriorityMode::Strict => !st.busy.iter().take(rank).any(|&b| b > 0),
            PriorityMode::Weighted(_) => {
                let mine = st.served.get(rank).copied().unwrap_or(0.0);
                !st.busy
                    .iter()
                    .zip(&st.served)
                    .enumerate()
                    .any(|(j, (&b, &s))| j != rank && b > 0 && s < mine)
            }
        }
    }

    /// Waits until rank `rank` may read; false when `cancel` fired first.
    pub(crate) async fn turn(&self, rank: usize, cancel: &CancellationToken) -> bool {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.allowed(&self.lock(), rank) {
                return true;
            }
            tokio::select! {
                _ = changed => {}
                _ = cancel.cancelled() => return false,
            }
        }
    }

    /// One reader of `rank` now has a backlog (`true`) or no longer has one.
    pub(crate) fn set_busy(&self, rank: usize, busy: bool) {
        let mut st = self.lock();
        let Some(&now) = st.busy.get(rank) else {
            return;
        };
        if busy {
            if now == 0 {
                // Back from idle: level with the busy ones, no credit for the idle time.
                let floor = st
                    .busy
                    .iter()
                    .zip(&st.served)
                    .filter(|(b, _)| **b > 0)
                    .map(|(_, s)| *s)
                    .fold(f64::INFINITY, f64::min);
                if floor.is_finite() && st.served[rank] < floor {
                    st.served[rank] = floor;
                }
            }
            st.busy[rank] = now + 1;
        } else {
            st.busy[rank] = now.saturating_sub(1);
        }
        drop(st);
        self.changed.notify_waiters();
    }

    /// Rank `rank` took `n` entries.
    pub(crate) fn took(&self, rank: usize, n: usize) {
        if let PriorityMode::Weighted(w) = &self.mode {
            let weight = f64::from(w.get(rank).copied().unwrap_or(1).max(1));
            let mut st = self.lock();
            if let Some(s) = st.served.get_mut(rank) {
                *s += n as f64 / weight;
            }
            drop(st);
            self.changed.notify_waiters();
        }
    }
}

/// One reader's standing at its [`MultiWorker`]'s gate (nothing for a
/// worker of its own).
pub(super) struct Backlog<'a> {
    gate: Option<(&'a Gate, usize)>,
    busy: bool,
}

impl<'a> Backlog<'a> {
    pub(super) fn new(gate: &'a Option<(Arc<Gate>, usize)>) -> Self {
        Backlog {
            gate: gate.as_ref().map(|(g, r)| (&**g, *r)),
            busy: true,
        }
    }

    pub(super) fn set(&mut self, busy: bool) {
        if let Some((g, rank)) = self.gate
            && busy != self.busy
        {
            g.set_busy(rank, busy);
            self.busy = busy;
        }
    }

    pub(super) async fn turn(&self, cancel: &CancellationToken) -> bool {
        match self.gate {
            Some((g, rank)) => g.turn(rank, cancel).await,
            None => true,
        }
    }

    pub(super) fn took(&self, n: usize) {
        if let Some((g, rank)) = self.gate {
            g.took(rank, n);
        }
    }
}

impl Drop for Backlog<'_> {
    fn drop(&mut self) {
        // A stopped reader holds nobody back.
        self.set(false);
    }
}

/// One business handler over an ordered list of queues, most urgent first: the seed's
/// "watch high, then medium, then low". Each queue keeps its own consumer group (same name)
/// and pending list; the handler's concurrency and prefetch are one budget over all of them;
/// [`PriorityMode::Strict`] takes a queue's entries only while every more urgent queue is
/// drained, [`PriorityMode::Weighted`] (one weight per queue) shares the reads while several
/// have a backlog. Each queue's own priority levels are read as `opts.priority` says.
pub struct MultiWorker<H> {
    workers: Vec<Worker<H>>,
}

impl<H> std::fmt::Debug for MultiWorker<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(&self.workers).finish()
    }
}

impl<H: Handler + Clone> MultiWorker<H> {
    /// `handler` as group `group` on each of `queues` (most urgent first), sharing `opts`'
    /// concurrency and prefetch, picking among the queues as `mode` says.
    pub fn new(
        client: &Client,
        queues: &[&str],
        group: &str,
        handler: H,
        opts: WorkerOptions,
        mode: PriorityMode,
    ) -> Result<Self> {
        check_queues(queues, &mode)?;
        opts.validate()?;
        let sem = Arc::new(Semaphore::new(opts.concurrency));
        let taken = Arc::new(Semaphore::new(opts.taken_limit()));
        let readers = if client.is_cluster() {
            client.options().shards
        } else {
            1
        };
        let gate = Arc::new(Gate::new(
            mode,
            queues.len(),
            &vec![usize::from(readers); queues.len()],
        ));
        let workers = queues
            .iter()
            .enumerate()
            .map(|(rank, q)| {
                Worker::new(client, q, group, handler.clone(), opts.clone())
                    .map(|w| w.share_budget(sem.clone(), taken.clone(), gate.clone(), rank))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(MultiWorker { workers })
    }

    /// Sets the hooks of every queue's worker (before `run`).
    pub fn with_hooks(self, hooks: impl Hooks + Clone) -> Self {
        MultiWorker {
            workers: self
                .workers
                .into_iter()
                .map(|w| w.with_hooks(hooks.clone()))
                .collect(),
        }
    }

    /// Each queue's counters, in the order of the queues.
    pub fn stats(&self) -> Vec<Arc<WorkerStats>> {
        self.workers.iter().map(Worker::stats).collect()
    }

    /// Runs every queue's worker until `cancel` fires (see [`Worker::run`]); the first
    /// error stops the others.
    pub async fn run(self, cancel: CancellationToken) -> Result<()> {
        let mut set = tokio::task::JoinSet::new();
        for w in self.workers {
            set.spawn(w.run(cancel.clone()));
        }
        let mut first = Ok(());
        while let Some(r) = set.join_next().await {
            let r = r.unwrap_or_else(|e| {
                Err(crate::engine::error::Error::Reply {
                    context: "running a worker",
                    detail: e.to_string(),
                })
            });
            if let Err(e) = r {
                cancel.cancel();
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

/// The rules of a handler's queue list (the one place; `[[handlers]] queues` uses them).
pub fn check_queues(queues: &[&str], mode: &PriorityMode) -> std::result::Result<(), InvalidInput> {
    if queues.is_empty() || queues.len() > MAX_QUEUES_PER_HANDLER {
        return Err(InvalidInput::Option {
            name: "queues",
            reason: format!(
                "a handler serves 1..={MAX_QUEUES_PER_HANDLER} queues, got {}",
                queues.len()
            ),
        });
    }
    for (i, q) in queues.iter().enumerate() {
        crate::engine::keys::QueueName::new(q)?;
        if queues[..i].contains(q) {
            return Err(InvalidInput::Option {
                name: "queues",
                reason: format!("{q:?} is listed twice"),
            });
        }
    }
    if let PriorityMode::Weighted(w) = mode {
        PriorityMode::weighted(w.clone(), queues.len())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_lets_a_queue_read_only_behind_drained_urgent_ones() {
        let g = Gate::new(PriorityMode::Strict, 2, &[1, 1]);
        let st = g.lock();
        assert!(g.allowed(&st, 0));
        assert!(
            !g.allowed(&st, 1),
            "unknown backlog of the urgent queue holds the other"
        );
        drop(st);
        g.set_busy(0, false);
        assert!(g.allowed(&g.lock(), 1));
        g.set_busy(0, true);
        assert!(!g.allowed(&g.lock(), 1));
    }

    #[test]
    fn weighted_lets_the_queue_furthest_behind_its_share_read() {
        let g = Gate::new(PriorityMode::Weighted(vec![3, 1]), 2, &[1, 1]);
        g.took(0, 3);
        // 3 / 3 = 1 vs 0 / 1: the second is behind.
        assert!(!g.allowed(&g.lock(), 0));
        assert!(g.allowed(&g.lock(), 1));
        g.took(1, 1);
        assert!(g.allowed(&g.lock(), 0) && g.allowed(&g.lock(), 1));
        // An idle queue does not hold the others back, and comes back level with them.
        g.set_busy(1, false);
        g.took(0, 30);
        assert!(g.allowed(&g.lock(), 0));
        g.set_busy(1, true);
        assert!(g.allowed(&g.lock(), 1));
        assert!(g.allowed(&g.lock(), 0));
    }

    #[test]
    fn queue_lists_are_checked() {
        assert!(check_queues(&["a", "b"], &PriorityMode::Strict).is_ok());
        assert!(check_queues(&[], &PriorityMode::Strict).is_err());
        assert!(check_queues(&["a", "a"], &PriorityMode::Strict).is_err());
        assert!(check_queues(&["a", "b c"], &PriorityMode::Strict).is_err());
        assert!(check_queues(&["a", "b"], &PriorityMode::Weighted(vec![1])).is_err());
        assert!(check_queues(&["a", "b"], &PriorityMode::Weighted(vec![2, 1])).is_ok());
    }
}
