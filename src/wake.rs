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
    pub(crate) notify: Notify,
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
                    notify: Notify::new(),
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
        if let Some(w) = wake
            && due_ms < w.next_look_ms.load(Ordering::Acquire)
        {
            w.notify.notify_one();
        }
    }
}
