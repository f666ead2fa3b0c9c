//! In-process wake-ups: a dispatcher sleeping until its next due time is woken early when
//! this process schedules an earlier order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// One queue's wake-up signal.
#[derive(Debug)]
pub(crate) struct Wake {
    /// The time the dispatcher will next look (unix ms); `i64::MAX` while it is busy.
    pub(crate) next_look_ms: AtomicI64,
    /// The earliest due time scheduled in this process since a pass last took it
    /// (`i64::MAX` = none): a dispatcher that skips shards it believes are not due yet
    /// calls every shard once this comes due.
    pub(crate) early_ms: AtomicI64,
    pub(crate) notify: Notify,
    /// Fired when this process resumes the queue or one of its groups: paused readers and
    /// dispatchers look again at once.
    pub(crate) resume: Notify,
}

/// The wake-up signals of the dispatchers in this process, by queue.
#[derive(Debug, Default)]
pub(crate) struct WakeRegistry {
    by_queue: Mutex<HashMap<String, Arc<Wake>>>,
}

impl WakeRegistry {
    /// The signal for `queue` (created on first use).
    pub(crate) fn get(&self, queue: &str) -> Arc<Wake> {
        self.by_queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(queue.to_owned())
            .or_insert_with(|| {
                Arc::new(Wake {
                    next_look_ms: AtomicI64::new(0),
                    early_ms: AtomicI64::new(i64::MAX),
                    notify: Notify::new(),
                    resume: Notify::new(),
                })
            })
            .clone()
    }

    /// An order of `queue` due at `due_ms` was scheduled: wake its dispatcher if it would
    /// otherwise look later than that.
    pub(crate) fn scheduled(&self, queue: &str, due_ms: i64) {
        let wake = self
            .by_queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(queue)
            .cloned();
        // Record first, then look: with the dispatcher storing its next look first and then
        // reading `early_ms` (both SeqCst), one of the two always sees the other.
        if let Some(w) = wake {
            w.early_ms.fetch_min(due_ms, Ordering::SeqCst);
            if due_ms < w.next_look_ms.load(Ordering::SeqCst) {
                w.notify.notify_one();
            }
        }
    }
}

impl WakeRegistry {
    /// `queue` (or one of its groups) was resumed by this process: its dispatcher calls
    /// every shard now, and its paused readers read again.
    pub(crate) fn resumed(&self, queue: &str) {
        let w = self.get(queue);
        w.early_ms.fetch_min(i64::MIN, Ordering::SeqCst);
        w.notify.notify_one();
        w.resume.notify_waiters();
    }
}
