//! In-process wake-ups: a dispatcher sleeping until its next due time is woken early when
//! this process schedules an earlier order.
//!
//! The registry holds each queue's signal weakly: an entry lives while a dispatcher or a
//! reader of the queue holds its signal, and is removed when the last one drops it, so the
//! registry never grows with queue names seen once (deleted queues, one-off producers).

use crate::engine::sync::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use tokio::sync::Notify;

/// The signals by queue, held weakly.
type Map = Mutex<HashMap<String, Weak<Wake>>>;

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
    /// Wake-ups heard from other processes (`engine::listen`) since the dispatcher's last
    /// pass: shard index -> the earliest due time heard (unix ms; `i64::MIN`: look now).
    /// At most one entry per shard.
    pushed: Mutex<HashMap<usize, i64>>,
    /// The earliest time in `pushed` (`i64::MAX` = none), for the dispatcher's check
    /// after it stores its next look (as `early_ms`).
    pub(crate) pushed_ms: AtomicI64,
    /// How many of the queue's shard channels the listener is subscribed to now: with all
    /// of them, the dispatcher's idle sleep is its `idle_poll`, else its `max_idle`.
    pub(crate) listening: AtomicUsize,
    /// Fired when this process resumes the queue or one of its groups: paused readers and
    /// dispatchers look again at once.
    pub(crate) resume: Notify,
    /// Per consumer group, the signal of its waiting pull receives (long polls) in this
    /// process, held weakly by them: when this process's dispatcher moves orders of the
    /// queue into its streams, one waiter of each group reads ([`Wake::dispatched`]), not
    /// all of them; a waiter whose read fills its batch wakes the next. At most one entry
    /// per group with waiters (dead ones go at each dispatch and each new entry).
    moved: Mutex<HashMap<String, Weak<Notify>>>,
    /// Fired (to every waiter) on each wake-up heard from another process, whose due time is
    /// then in `heard_ms`: waiting pull receives read at that time.
    pub(crate) heard: Notify,
    /// The due time of the last wake-up heard (unix ms; `i64::MIN`: look now).
    pub(crate) heard_ms: AtomicI64,
    /// Set by the test hook (`Client::kill_dispatchers_for_test`): the queue's running
    /// dispatcher panics at its next turn.
    #[cfg(feature = "test-util")]
    pub(crate) kill: std::sync::atomic::AtomicBool,
    /// Where it is registered, and under which queue (its entry goes when it drops).
    registry: Weak<Map>,
    queue: String,
}

impl Drop for Wake {
    fn drop(&mut self) {
        // The last holder dropped it: remove its entry, unless a new signal for the queue
        // was registered meanwhile. (No `Arc<Wake>` is ever dropped under this lock.)
        if let Some(map) = self.registry.upgrade() {
            let mut m = lock(&map);
            if m.get(&self.queue).is_some_and(|w| w.strong_count() == 0) {
                m.remove(&self.queue);
            }
        }
    }
}

impl Wake {
    /// Another process made shard `shard`'s earliest due time `due_ms` (or the listener
    /// subscribed again, `i64::MIN`: messages may have been missed): the dispatcher looks at
    /// that shard then, woken now if it would otherwise look later. Record first, then look
    /// (see [`WakeRegistry::scheduled`]).
    pub(crate) fn pushed(&self, shard: usize, due_ms: i64) {
        {
            let mut p = lock(&self.pushed);
            let e = p.entry(shard).or_insert(due_ms);
            *e = (*e).min(due_ms);
        }
        self.pushed_ms.fetch_min(due_ms, Ordering::SeqCst);
        if due_ms < self.next_look_ms.load(Ordering::SeqCst) {
            self.notify.notify_one();
        }
        self.heard_ms.store(due_ms, Ordering::SeqCst);
        self.heard.notify_waiters();
    }

    /// Another process set a group's timer (a pull consumer's retry, a replay: message
    /// `t<ms>`) on one of the queue's shards, due at `due_ms`: waiting pull receives read
    /// then. The dispatcher is not concerned (no order was scheduled).
    pub(crate) fn timer_heard(&self, due_ms: i64) {
        self.heard_ms.store(due_ms, Ordering::SeqCst);
        self.heard.notify_waiters();
    }

    /// The signal of `group`'s waiting pull receives; hold it while waiting.
    pub(crate) fn moved_signal(&self, group: &str) -> Arc<Notify> {
        let mut m = lock(&self.moved);
        if let Some(n) = m.get(group).and_then(Weak::upgrade) {
            return n;
        }
        m.retain(|_, w| w.strong_count() > 0);
        let n = Arc::new(Notify::new());
        m.insert(group.to_owned(), Arc::downgrade(&n));
        n
    }

    /// This process's dispatcher moved orders of the queue into its streams: one waiting
    /// pull receive of each group reads now (no Redis call here). A group whose waiters are
    /// all busy reading keeps the wake-up for its next waiter.
    pub(crate) fn dispatched(&self) {
        let live: Vec<Arc<Notify>> = {
            let mut m = lock(&self.moved);
            m.retain(|_, w| w.strong_count() > 0);
            m.values().filter_map(Weak::upgrade).collect()
        };
        // Notified outside the lock (a waiter woken may ask for its signal at once).
        for n in live {
            n.notify_one();
        }
    }

    /// Takes the wake-ups heard since the last call.
    pub(crate) fn take_pushed(&self) -> HashMap<usize, i64> {
        self.pushed_ms.store(i64::MAX, Ordering::SeqCst);
        std::mem::take(&mut *lock(&self.pushed))
    }
}

/// The wake-up signals of the dispatchers in this process, by queue.
#[derive(Debug, Default)]
pub(crate) struct WakeRegistry {
    by_queue: Arc<Map>,
}

impl WakeRegistry {
    /// The signal for `queue` (created when no one holds one).
    pub(crate) fn get(&self, queue: &str) -> Arc<Wake> {
        let mut m = lock(&self.by_queue);
        if let Some(w) = m.get(queue).and_then(Weak::upgrade) {
            return w;
        }
        let w = Arc::new(Wake {
            next_look_ms: AtomicI64::new(0),
            early_ms: AtomicI64::new(i64::MAX),
            notify: Notify::new(),
            pushed: Mutex::new(HashMap::new()),
            pushed_ms: AtomicI64::new(i64::MAX),
            listening: AtomicUsize::new(0),
            resume: Notify::new(),
            moved: Mutex::new(HashMap::new()),
            heard: Notify::new(),
            heard_ms: AtomicI64::new(i64::MAX),
            #[cfg(feature = "test-util")]
            kill: std::sync::atomic::AtomicBool::new(false),
            registry: Arc::downgrade(&self.by_queue),
            queue: queue.to_owned(),
        });
        m.insert(queue.to_owned(), Arc::downgrade(&w));
        w
    }

    /// The signal for `queue` if someone holds it.
    fn held(&self, queue: &str) -> Option<Arc<Wake>> {
        lock(&self.by_queue).get(queue).and_then(Weak::upgrade)
    }

    /// How many queues have a signal (held by a dispatcher or reader of this process).
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn len(&self) -> usize {
        lock(&self.by_queue).len()
    }

    /// An order of `queue` due at `due_ms` was scheduled: wake its dispatcher if it would
    /// otherwise look later than that.
    pub(crate) fn scheduled(&self, queue: &str, due_ms: i64) {
        // Record first, then look: with the dispatcher storing its next look first and then
        // reading `early_ms` (both SeqCst), one of the two always sees the other.
        if let Some(w) = self.held(queue) {
            w.early_ms.fetch_min(due_ms, Ordering::SeqCst);
            if due_ms < w.next_look_ms.load(Ordering::SeqCst) {
                w.notify.notify_one();
            }
        }
    }

    /// `queue` (or one of its groups) was resumed by this process: its dispatcher calls
    /// every shard now, and its paused readers read again.
    pub(crate) fn resumed(&self, queue: &str) {
        if let Some(w) = self.held(queue) {
            w.early_ms.fetch_min(i64::MIN, Ordering::SeqCst);
            w.notify.notify_one();
            w.resume.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dispatch_wakes_one_waiting_receive_of_each_group() {
        let r = WakeRegistry::default();
        let w = r.get("q");
        let (a, b) = (w.moved_signal("a"), w.moved_signal("b"));
        assert!(
            Arc::ptr_eq(&a, &w.moved_signal("a")),
            "one signal per group"
        );
        let mut waiting_a: Vec<_> = (0..3).map(|_| Box::pin(a.notified())).collect();
        let mut waiting_b = Box::pin(b.notified());
        for n in &mut waiting_a {
            n.as_mut().enable();
        }
        waiting_b.as_mut().enable();
        w.dispatched();
        let ready = |n: &mut std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>>| {
            futures_util::FutureExt::now_or_never(n.as_mut()).is_some()
        };
        let woken_a = waiting_a.iter_mut().map(ready).filter(|r| *r).count();
        assert_eq!(woken_a, 1, "one of group a's three waiters");
        assert!(ready(&mut waiting_b), "and group b's");
        // A group whose waiters are gone is forgotten.
        drop(waiting_b);
        drop(b);
        w.dispatched();
        assert_eq!(w.moved.lock().unwrap().len(), 1);
    }

    #[test]
    fn an_entry_lives_while_someone_holds_its_signal() {
        let r = WakeRegistry::default();
        let a = r.get("a");
        let a2 = r.get("a");
        assert!(Arc::ptr_eq(&a, &a2));
        r.scheduled("never-held", 1);
        r.resumed("never-held");
        assert_eq!(r.len(), 1);
        drop(a);
        assert_eq!(r.len(), 1, "still held");
        drop(a2);
        assert_eq!(r.len(), 0);
        // A new holder gets a new signal, and an old one dropping later leaves it alone.
        let old = r.get("b");
        drop(old);
        let new = r.get("b");
        assert_eq!(r.len(), 1);
        drop(new);
        assert_eq!(r.len(), 0);
    }
}
