//! The engine's one way to take a `std::sync::Mutex`: its bookkeeping (shard views, roster
//! state, channel maps) is consistent between statements, so a lock whose holder panicked
//! is taken as it is rather than spreading the panic. No lock is held across an await.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking its data even when a former holder panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::lock;
    use std::sync::Mutex;

    #[test]
    fn a_poisoned_lock_is_taken_with_its_data() {
        let m = Mutex::new(7);
        let _ = std::panic::catch_unwind(|| {
            let _g = m.lock();
            panic!("holder panics");
        });
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 7);
    }
}
