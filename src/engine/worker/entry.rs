//! A taken stream entry: parsing replies into [`Taken`] deliveries, consumer names, group
//! creation, and the entry's lease.
//!
//! # Leases: who owns a taken entry, and the loop that keeps owned entries' timers ahead
//!
//! Every entry a worker takes (a read, or a reclaim) gets one [`Lease`]: a guard value owned
//! by the task that handles and settles the entry. While it exists, the entry is in the
//! worker's [`LeaseSet`] and [`lease_loop`] extends its timer, whether the entry is running
//! or waiting for a handler slot. Settling releases it ([`Lease::release`]) before the
//! settling call is sent; dropping it unsettled (a panic, an aborted task) removes it too, so
//! the entry's lease simply runs out and another consumer reclaims it. Nothing is ever
//! extended forever.
//!
//! The set is behind a `std` mutex held only for map operations, never across a Redis call.
//! An extension is a compare-and-set (`extend.lua`: only where the timer still holds the
//! lease this worker last set), so an extension that races a settlement cannot overwrite a
//! retry time or revive an acknowledged entry.

use super::{Delivery, DeliveryFlag, LaneId, Shared};
use crate::engine::duration::ms;
use crate::engine::error::{Error, Result};
use crate::engine::keys::{QueueName, ShardKeys};
use crate::engine::scripts;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio_util::sync::CancellationToken;

/// A stream entry taken for handling, with its owner's lease.
pub(super) struct Taken {
    pub(super) delivery: Delivery,
    /// Set on dead-letter replays: only this group handles it.
    pub(super) for_group: Option<String>,
    /// Why the entry cannot be handled (no order id, deleted from the stream): it is
    /// dead-lettered with this error on its first delivery, the handler never sees it.
    pub(super) bad: Option<String>,
    /// Ownership of the entry until it is settled.
    pub(super) lease: Lease,
    /// The order's own `expires_after`, ms, from its stored value (see
    /// [`crate::engine::expiry`]).
    pub(super) expires_after_ms: Option<i64>,
}

/// Creates `group` on every shard's stream when it is new (`join_group.lua`: from the start
/// of the stream, creating the stream if needed). `rejoin`: a running worker's read found no
/// group; it is created again only where the stream is gone too (Redis lost its data), and
/// refused ([`Error::GroupDeleted`]) where the stream exists, since the group was deleted on
/// purpose. [`Error::QueueNotFound`] when the queue was deleted; [`Error::TooManyGroups`]
/// at the cap.
pub(crate) async fn ensure_groups(
    client: &crate::engine::client::Client,
    queue: &crate::engine::keys::QueueName,
    shards: &[ShardKeys],
    group: &str,
    rejoin: bool,
) -> Result<()> {
    use crate::engine::scripts::{ScriptRefusal, join_group};
    let max = client.options().max_groups;
    for s in shards {
        match join_group(&mut client.connection(), s, group, rejoin, max).await {
            Ok(true) => tracing::info!(stream = %s.stream, %group, "consumer group created"),
            Ok(false) => {}
            Err(e) => {
                return Err(match ScriptRefusal::of(&e) {
                    Some(ScriptRefusal::QueueNotFound) => Error::QueueNotFound {
                        queue: queue.as_str().to_owned(),
                    },
                    Some(ScriptRefusal::GroupDeleted) => Error::GroupDeleted {
                        queue: queue.as_str().to_owned(),
                        group: group.to_owned(),
                    },
                    Some(ScriptRefusal::TooManyGroups) => Error::TooManyGroups {
                        queue: queue.as_str().to_owned(),
                        max,
                    },
                    _ => e,
                });
            }
        }
    }
    Ok(())
}

pub(super) fn is_nogroup(e: &Error) -> bool {
    matches!(e, Error::Redis { source, .. } if source.code() == Some("NOGROUP"))
}

/// Builds a delivery from a stream entry's fields: the delivery, its `for_group`, and why it
/// cannot be handled (no order id).
pub(super) fn parse_delivery(
    queue: &QueueName,
    group: &str,
    lane: &ShardKeys,
    entry_id: &str,
    fields: Vec<(String, String)>,
    attempt: u32,
) -> (Delivery, Option<String>, Option<String>) {
    let mut id = None;
    let mut due = None;
    let mut data = None;
    let mut flag = None;
    let mut for_group = None;
    for (f, v) in fields {
        match f.as_str() {
            "id" => id = Some(v),
            "due_ms" => due = v.parse::<f64>().ok().map(crate::engine::reply::score_to_ms),
            "data" => data = Some(v),
            "flag" if v == "payload_missing" => flag = Some(DeliveryFlag::PayloadMissing),
            "for_group" => for_group = Some(v),
            _ => {}
        }
    }
    let (enq, tags, trace, text) = match &data {
        Some(d) => match crate::engine::message::decode_stored_tagged(d) {
            (Some(enq), tags, trace, json) => (Some(enq), tags, trace, json),
            (None, _, _, raw) => {
                flag = flag.or(Some(DeliveryFlag::BadEncoding));
                (None, Vec::new(), None, raw)
            }
        },
        None => (None, Vec::new(), None, "null"),
    };
    let key = data
        .as_deref()
        .and_then(crate::engine::order_key::of_stored)
        .map(str::to_owned);
    let payload = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(_) => {
            flag = flag.or(Some(DeliveryFlag::InvalidJson));
            serde_json::Value::String(text.to_owned())
        }
    };
    let dispatched_at_ms = entry_id
        .split_once('-')
        .and_then(|(ms, _)| ms.parse().ok())
        .unwrap_or(0);
    let delivery = Delivery {
        queue: queue.as_str().to_owned(),
        group: group.to_owned(),
        id: id.clone().unwrap_or_default(),
        payload,
        payload_text: text.to_owned(),
        due_at_ms: due.unwrap_or(dispatched_at_ms),
        enqueued_at_ms: enq,
        dispatched_at_ms,
        entry_id: entry_id.to_owned(),
        shard: lane.shard,
        priority: lane.level,
        attempt,
        flag,
        trace,
        tags,
        key,
    };
    let bad = id
        .is_none()
        .then(|| "the stream entry has no order id (written by a foreign producer?)".to_owned());
    (delivery, for_group, bad)
}

/// `<host>-<pid>-<random hex>`: unique per process start.
pub(super) fn default_consumer_name() -> String {
    crate::engine::roster::process_name()
}

/// Turns a raw entry, leased until `lease_until`, into a [`Taken`] owned by this worker. An
/// entry that cannot be handled (deleted from the stream, no order id) is taken all the same,
/// marked `bad`, and dead-lettered on this first delivery.
pub(super) fn to_taken<H>(
    s: &Shared<H>,
    lane: &ShardKeys,
    entry_id: &str,
    fields: Option<Vec<(String, String)>>,
    attempt: u32,
    lease_until: i64,
) -> Taken {
    let lease = s
        .leases
        .hold(LaneId::of(lane.shard, lane.level), entry_id, lease_until);
    let expires_after_ms = fields.as_ref().and_then(|f| {
        f.iter()
            .find(|(k, _)| k == "data")
            .and_then(|(_, v)| crate::engine::expiry::of_stored(v))
    });
    let (delivery, for_group, bad) = match fields {
        Some(f) => parse_delivery(&s.queue, &s.group, lane, entry_id, f, attempt),
        None => {
            let (d, _, _) = parse_delivery(&s.queue, &s.group, lane, entry_id, Vec::new(), attempt);
            (
                d,
                None,
                Some("the stream entry was deleted (trimmed while pending)".to_owned()),
            )
        }
    };
    if let Some(reason) = &bad {
        tracing::error!(entry = %entry_id, %reason, "stream entry cannot be handled: dead-lettering it");
    }
    Taken {
        delivery,
        for_group,
        bad,
        lease,
        expires_after_ms,
    }
}

/// (lane, stream entry id).
pub(super) type EntryKey = (LaneId, String);

/// One held entry: the lease end last set (unix ms) and the generation of the [`Lease`]
/// that owns it.
#[derive(Debug, Clone, Copy)]
struct Held {
    until_ms: i64,
    generation: u64,
}

/// The entries this worker holds, with the lease end it last set for each (unix ms).
#[derive(Debug, Default)]
pub(super) struct LeaseSet {
    held: Mutex<HashMap<EntryKey, Held>>,
    /// Generations handed out: a lease removes its entry only while it is the owner, so two
    /// leases of one entry (which the reclaim path avoids) could never unhold each other.
    next_generation: std::sync::atomic::AtomicU64,
}

impl LeaseSet {
    fn lock(&self) -> MutexGuard<'_, HashMap<EntryKey, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes ownership of an entry leased until `until_ms`.
    pub(super) fn hold(self: &Arc<Self>, lane: LaneId, entry_id: &str, until_ms: i64) -> Lease {
        let key = (lane, entry_id.to_owned());
        let generation = self
            .next_generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.lock().insert(
            key.clone(),
            Held {
                until_ms,
                generation,
            },
        );
        Lease {
            set: self.clone(),
            key: Some((key, generation)),
        }
    }

    /// When the entry is held (its copy still runs or waits here), records the lease end a
    /// reclaim just set and answers true: the reclaimed copy is not handled.
    pub(super) fn renew_if_held(&self, lane: LaneId, entry_id: &str, until_ms: i64) -> bool {
        match self.lock().get_mut(&(lane, entry_id.to_owned())) {
            Some(h) => {
                h.until_ms = until_ms;
                true
            }
            None => false,
        }
    }

    /// The ids of the entries of lane `lane` that are held.
    pub(super) fn held_in(&self, lane: LaneId) -> Vec<String> {
        self.lock()
            .keys()
            .filter(|(l, _)| *l == lane)
            .map(|(_, id)| id.clone())
            .collect()
    }

    /// Removes `key` if `generation` still owns it; answers its last lease end then.
    fn unhold(&self, key: &EntryKey, generation: u64) -> Option<i64> {
        let mut held = self.lock();
        if held.get(key).is_some_and(|h| h.generation == generation) {
            return held.remove(key).map(|h| h.until_ms);
        }
        None
    }

    /// How many entries are held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }

    /// The held entries of each lane, with their last lease end.
    fn snapshot(&self) -> HashMap<LaneId, Vec<(String, i64)>> {
        let mut by_lane: HashMap<LaneId, Vec<(String, i64)>> = HashMap::new();
        for ((lane, id), h) in self.lock().iter() {
            by_lane
                .entry(*lane)
                .or_default()
                .push((id.clone(), h.until_ms));
        }
        by_lane
    }

    /// Records the new lease end of the entries `extend.lua` extended that are still held.
    fn extended(&self, lane: LaneId, ids: Vec<String>, until_ms: i64) {
        let mut held = self.lock();
        for id in ids {
            if let Some(h) = held.get_mut(&(lane, id)) {
                h.until_ms = until_ms;
            }
        }
    }
}

/// Ownership of one taken entry. See the module docs.
#[derive(Debug)]
pub(super) struct Lease {
    set: Arc<LeaseSet>,
    key: Option<(EntryKey, u64)>,
}

impl Lease {
    /// The entry: (lane, stream entry id).
    pub(super) fn key(&self) -> (LaneId, &str) {
        match &self.key {
            Some(((lane, id), _)) => (*lane, id),
            None => (LaneId(0), ""),
        }
    }

    /// Stops extending the entry: its owner is about to settle it.
    pub(super) fn release(mut self) {
        if let Some((k, g)) = self.key.take() {
            self.set.unhold(&k, g);
        }
    }

    /// Gives the entry back unhandled (the worker stops before a handler slot came free):
    /// its timer moves to now, by compare-and-set on the lease end this worker last set
    /// (`extend.lua`), so the next consumer takes it at once instead of after the
    /// visibility timeout. When the call fails, the lease simply runs out as before.
    pub(super) async fn hand_back<H>(mut self, s: &Shared<H>) {
        let Some((key, g)) = self.key.take() else {
            return;
        };
        let Some(until) = self.set.unhold(&key, g) else {
            return;
        };
        let (lane, id) = key;
        let timers = s.lanes[lane.index()].timers(&s.group);
        let now = s.client.now_ms();
        let mut conn = s.client.connection();
        if let Err(e) = scripts::extend(&mut conn, &timers, now, &[(id, until)]).await {
            tracing::debug!(error = %e, "handing an unhandled entry back failed; its lease runs out instead");
        }
    }
}

impl Lease {
    /// Parks the entry until `until_ms` for a slot of its order key (`park.lua`, by
    /// compare-and-set on the lease end this worker last set): it stays pending, and is
    /// taken again when a slot is given to it or its parked time comes. False when the
    /// call failed or the lease was no longer this worker's (the lease then runs out).
    pub(super) async fn park<H>(mut self, s: &Shared<H>, until_ms: i64) -> bool {
        let Some((key, g)) = self.key.take() else {
            return false;
        };
        let Some(lease) = self.set.unhold(&key, g) else {
            return false;
        };
        let (lane, id) = key;
        let keys = &s.lanes[lane.index()];
        let (timers, errors) = (keys.timers(&s.group), keys.errors(&s.group));
        let mut conn = s.client.connection();
        match scripts::key_slots::park(&mut conn, &timers, &errors, until_ms, &[(id, lease)]).await
        {
            Ok(parked) => !parked.is_empty(),
            Err(e) => {
                tracing::debug!(error = %e, "parking an entry failed");
                false
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some((k, g)) = self.key.take() {
            self.set.unhold(&k, g);
        }
    }
}

/// Extends the leases of every held entry every third of the visibility timeout, one
/// `extend.lua` call per lane.
pub(super) async fn lease_loop<H>(s: Arc<Shared<H>>, stop: CancellationToken) {
    let every = s.opts.visibility_timeout / 3;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
        }
        let snapshot = s.leases.snapshot();
        if snapshot.is_empty() {
            continue;
        }
        let until = s.client.now_ms() + ms(s.opts.visibility_timeout);
        if let Some(gate) = &s.key_gate {
            gate.extend(&s, until).await;
        }
        let calls = snapshot.into_iter().map(|(lane, held)| {
            let mut conn = s.client.connection();
            let key = s.lanes[lane.index()].timers(&s.group);
            async move {
                let r = scripts::extend(&mut conn, &key, until, &held).await;
                (lane, r)
            }
        });
        for (lane, r) in futures_util::future::join_all(calls).await {
            match r {
                Ok(ids) => s.leases.extended(lane, ids, until),
                Err(e) => {
                    tracing::warn!(error = %e, "extending leases failed; retrying next round")
                }
            }
        }
    }
}

#[cfg(test)]
mod lease_tests {
    use super::*;

    #[test]
    fn lanes_are_numbered_shard_by_shard_most_urgent_first() {
        use crate::engine::priority::Priority;
        assert_eq!(LaneId::of(0, Priority::High).index(), 0);
        assert_eq!(LaneId::of(0, Priority::Low).index(), 2);
        assert_eq!(LaneId::of(2, Priority::Normal).index(), 7);
        assert_ne!(
            LaneId::of(1, Priority::High),
            LaneId(1),
            "lane 1 is shard 0's normal lane"
        );
        assert_eq!(LaneId::checked(8, 9), Some(LaneId(8)));
        assert_eq!(
            LaneId::checked(9, 9),
            None,
            "a queue of 3 shards has lanes 0..=8"
        );
    }

    #[test]
    fn a_lease_leaves_the_set_when_released_or_dropped() {
        let set = Arc::new(LeaseSet::default());
        let a = set.hold(LaneId(0), "1-0", 10);
        let b = set.hold(LaneId(1), "2-0", 10);
        assert_eq!(set.len(), 2);
        a.release();
        assert_eq!(set.len(), 1);
        drop(b); // e.g. a task that panicked
        assert_eq!(set.len(), 0);
    }

    #[test]
    fn a_second_lease_of_one_entry_is_never_undone_by_the_first() {
        let set = Arc::new(LeaseSet::default());
        let old = set.hold(LaneId(0), "1-0", 10);
        let new = set.hold(LaneId(0), "1-0", 20);
        old.release(); // the older copy settles first
        assert_eq!(set.len(), 1, "the newer owner still holds it");
        assert!(set.renew_if_held(LaneId(0), "1-0", 30));
        assert_eq!(set.snapshot()[&LaneId(0)], vec![("1-0".to_owned(), 30)]);
        drop(new);
        assert!(!set.renew_if_held(LaneId(0), "1-0", 40));
    }

    #[test]
    fn only_held_entries_record_an_extension() {
        let set = Arc::new(LeaseSet::default());
        let a = set.hold(LaneId(0), "1-0", 10);
        set.extended(LaneId(0), vec!["1-0".into(), "9-0".into()], 20);
        assert_eq!(set.snapshot()[&LaneId(0)], vec![("1-0".to_owned(), 20)]);
        a.release();
        set.extended(LaneId(0), vec!["1-0".into()], 30);
        assert!(set.snapshot().is_empty());
    }
}
