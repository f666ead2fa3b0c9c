//! What a dispatcher knows per shard (its last view, whether it owns or took it over in
//! the dispatch roster) and what it reports ([`DispatcherStats`]).

use crate::engine::sync::lock;
use std::sync::atomic::Ordering;
use tokio::time::Instant;

/// What the last call on a shard said.
#[derive(Debug, Clone, Copy)]
pub(super) struct ShardView {
    /// Its earliest remaining due time (`None` = empty), as of `at`.
    pub(super) next_due_ms: Option<i64>,
    /// When it was last called (host monotonic clock; only compared with itself).
    pub(super) at: Instant,
}

/// What a dispatcher did, readable while it runs ([`Dispatcher::stats`](super::Dispatcher::stats)).
#[derive(Debug, Default)]
pub struct DispatcherStats {
    /// `dequeue.lua` calls per shard.
    pub(super) calls: Vec<std::sync::atomic::AtomicU64>,
    /// Per shard, whether this dispatcher calls it now (owns it or took it over).
    pub(super) calling: std::sync::Mutex<Vec<bool>>,
    /// Shards taken over from their owner in the roster.
    pub(super) takeovers: std::sync::atomic::AtomicU64,
}

impl DispatcherStats {
    pub(super) fn new(shards: usize) -> Self {
        DispatcherStats {
            calls: (0..shards).map(|_| Default::default()).collect(),
            calling: std::sync::Mutex::new(vec![true; shards]),
            takeovers: Default::default(),
        }
    }

    /// `dequeue.lua` calls made so far, per shard.
    pub fn calls(&self) -> Vec<u64> {
        self.calls
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// Per shard, whether this dispatcher calls it now: it owns it in the dispatch roster
    /// (every shard without one) or took it over.
    pub fn calling(&self) -> Vec<bool> {
        lock(&self.calling).clone()
    }

    /// Shards taken over so far from an owner that left them overdue.
    pub fn takeovers(&self) -> u64 {
        self.takeovers.load(Ordering::Relaxed)
    }
}

/// Per shard, what this dispatcher knows (under one lock, never held across a call).
#[derive(Debug)]
pub(super) struct Shards {
    /// What its last call or look said (`None` = never called or must be called).
    pub(super) views: Vec<Option<ShardView>>,
    /// This process owns it in the roster (all, without a roster).
    pub(super) owned: Vec<bool>,
    /// Not owned, but taken over (its owner left it overdue) until it has nothing due.
    pub(super) taken: Vec<bool>,
    /// Not owned: its earliest order at the last look (the same one overdue at the next
    /// look is a takeover).
    pub(super) heads: Vec<Option<String>>,
    /// The roster version `owned` was computed from.
    pub(super) version: Option<u64>,
}

impl Shards {
    pub(super) fn new(n: usize) -> Self {
        Shards {
            views: vec![None; n],
            owned: vec![true; n],
            taken: vec![false; n],
            heads: vec![None; n],
            version: None,
        }
    }

    /// Calls shard `i` itself: it owns it or took it over.
    pub(super) fn mine(&self, i: usize) -> bool {
        self.owned[i] || self.taken[i]
    }

    /// Takes the roster's new assignment: a shard gained is called at once.
    pub(super) fn assign(&mut self, owned: Vec<bool>, version: u64) {
        for (i, now) in owned.iter().enumerate() {
            if *now && !self.owned[i] {
                self.views[i] = None;
            }
            if !*now && self.owned[i] {
                self.heads[i] = None;
            }
        }
        self.owned = owned;
        self.version = Some(version);
    }
}
