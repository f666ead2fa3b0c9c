//! The shards whose streams this process wrote to and that the trim chore has not found
//! clean since (see [`crate::engine::loops::housekeeping`]): the chore calls only those between
//! its full passes, so an idle process makes no trim call.

/// The shards whose streams this process dispatched into and that the trim chore has not
/// found clean since: at most one entry per shard of the queues this process dispatches
/// (entries of deleted queues go at the next full pass).
#[derive(Debug, Default)]
pub(crate) struct Touched(std::sync::Mutex<std::collections::HashSet<String>>);

impl Touched {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that `keys`' shard stream grew.
    pub(crate) fn mark(&self, keys: &crate::engine::keys::ShardKeys) {
        let mut set = self.lock();
        if !set.contains(&keys.tag) {
            set.insert(keys.tag.clone());
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    pub(crate) fn contains(&self, keys: &crate::engine::keys::ShardKeys) -> bool {
        self.lock().contains(&keys.tag)
    }

    pub(crate) fn clear(&self, keys: &crate::engine::keys::ShardKeys) {
        self.lock().remove(&keys.tag);
    }

    /// Keeps only the shards in `live` (a full pass's view of the registry).
    pub(crate) fn retain(&self, live: &std::collections::HashSet<&str>) {
        self.lock().retain(|t| live.contains(t.as_str()));
    }
}
