//! Slots per order key (`key_concurrency`, `key_sequence`): at most N deliveries of one key
//! in flight in a group, across every process and shard of the group.
//!
//! # How it works
//!
//! A key's orders live on every shard (orders are sharded by id), so its slots live in one
//! place: five keys per group under the queue's shard 0 hash tag (`lua/key_slots.lua`).
//! When a worker has a keyed entry and a handler slot for it, it asks for a slot of the key:
//!
//! - **granted:** the hold lasts as long as the entry's lease and is extended with it
//!   ([`KeyGate::extend`], from the lease loop), so a crashed holder's slot is free again
//!   when its lease runs out, exactly when its entry is reclaimed;
//! - **refused:** the entry becomes one of the key's waiters (in due order) and is *parked*
//!   on its lane (`lua/park.lua`): its timer moves a few leases ahead and nothing runs it.
//!   It holds no handler slot and no place among the worker's taken entries, so other keys
//!   go on. A parked entry is taken again without counting an attempt (`reclaim.lua`).
//!
//! Whoever gives a slot back ([`release`]: an ack, a dead letter, a retry outside a
//! sequence) hands it to the key's earliest waiter in the same call and moves that entry's
//! timer to now; this worker's reclaim loop takes it at once (any other consumer's next look
//! may take it first: the slot is held for whoever takes it). A wake-up that is lost (the
//! waker crashed) costs a waiter at most its parked time ([`PARKED_LEASES`] leases), never
//! the order.
//!
//! Under `key_sequence` a retry keeps its key ([`keep`]) until it is done or dead-lettered,
//! so the key's later orders wait for it; the waiters go in due order.

use super::entry::Lease;
use super::{Delivery, LaneId, Shared};
use crate::engine::duration::ms;
use crate::engine::keys::KeySlotKeys;
use crate::engine::retry::{RetryPolicy, with_retries};
use crate::engine::scripts::key_slots::{self as script, SlotScope};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A parked entry's timer is this many visibility timeouts ahead: the longest a waiter
/// waits when its wake-up was lost.
pub(super) const PARKED_LEASES: i64 = 4;

/// A group's slots per key, as this worker uses them.
#[derive(Debug)]
pub(super) struct KeyGate {
    keys: KeySlotKeys,
    /// Slots per key.
    limit: u32,
    /// `key_sequence`: a retry keeps its key.
    sequence: bool,
    /// The holds this worker owns (member -> key): extended with the leases.
    holds: Arc<Mutex<HashMap<String, String>>>,
}

/// One slot of one key, owned by the task that settles its entry. Dropped without being
/// given back (a panic), it is no longer extended and runs out with the entry's lease.
#[derive(Debug)]
pub(super) struct KeyHold {
    key: String,
    member: String,
    holds: Arc<Mutex<HashMap<String, String>>>,
}

impl Drop for KeyHold {
    fn drop(&mut self) {
        lock(&self.holds).remove(&self.member);
    }
}

fn lock(m: &Mutex<HashMap<String, String>>) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `<lane>:<entry id>`: an entry among a group's key slots.
pub(super) fn member(lane: LaneId, entry_id: &str) -> String {
    format!("{}:{entry_id}", lane.number())
}

impl KeyGate {
    /// The gate of `group` on `queue`, when its options limit keys.
    pub(super) fn new(keys: KeySlotKeys, opts: &super::WorkerOptions) -> Option<KeyGate> {
        Some(KeyGate {
            keys,
            limit: opts.key_slots()?,
            sequence: opts.key_sequence,
            holds: Arc::default(),
        })
    }

    fn scope<'a, H>(&'a self, s: &Shared<H>) -> SlotScope<'a> {
        SlotScope {
            keys: &self.keys,
            now_ms: s.client.now_ms(),
            limit: self.limit,
            ttl_ms: (PARKED_LEASES + 1) * ms(s.opts.visibility_timeout),
        }
    }

    /// Extends every hold this worker owns to `until_ms` (one call).
    pub(super) async fn extend<H>(&self, s: &Shared<H>, until_ms: i64) {
        let holds: Vec<(String, String)> = lock(&self.holds)
            .iter()
            .map(|(m, k)| (k.clone(), m.clone()))
            .collect();
        move_holds(s, self, &holds, until_ms).await;
    }
}

/// Under `key_sequence`, puts a batch of taken entries in due order (within each priority
/// level, the order reads give), so that the orders of a key that one read took ask for the
/// key earliest first. Other groups keep the read order.
pub(super) fn sequence_order<H>(s: &Shared<H>, taken: &mut [super::entry::Taken]) {
    if s.key_gate.as_ref().is_some_and(|g| g.sequence) {
        taken.sort_by_key(|t| (t.delivery.priority.rank(), t.delivery.due_at_ms));
    }
}

/// What [`admit`] decided.
pub(super) enum Admission {
    /// Run it (with its key's hold, when its group limits keys and it has a key).
    Run(Lease, Option<KeyHold>),
    /// Parked for a slot of its key, or left to its lease (a failure): not this task's
    /// any more.
    Waits,
}

/// Takes a slot of `d`'s key for it, held until `hold_ms` (its lease end), or parks it.
/// Entries without a key, and groups that do not limit keys, run at once without a Redis
/// call.
pub(super) async fn admit<H>(s: &Shared<H>, d: &Delivery, lease: Lease, hold_ms: i64) -> Admission {
    let (Some(gate), Some(key)) = (&s.key_gate, &d.key) else {
        return Admission::Run(lease, None);
    };
    let (lane, entry_id) = lease.key();
    let member = member(lane, entry_id);
    let r = with_retries("key_slots.lua", RetryPolicy::CALL, None, || {
        let mut conn = s.client.connection();
        let scope = gate.scope(s);
        let (key, member) = (key.as_str(), member.as_str());
        async move {
            script::acquire_key_slot(&mut conn, &scope, hold_ms, key, member, d.due_at_ms).await
        }
    })
    .await;
    let (granted, woken) = match r {
        Ok(v) => v,
        Err(e) => {
            // The lease runs out and the entry comes back (as another delivery).
            tracing::warn!(queue = %s.queue, group = %s.group, error = %e, "taking a key slot failed; the entry is delivered again after its lease");
            return Admission::Waits;
        }
    };
    wake(s, woken).await;
    if granted {
        lock(&gate.holds).insert(member.clone(), key.clone());
        let hold = KeyHold {
            key: key.clone(),
            member,
            holds: gate.holds.clone(),
        };
        return Admission::Run(lease, Some(hold));
    }
    let until = s.client.now_ms() + PARKED_LEASES * ms(s.opts.visibility_timeout);
    s.metrics().key_waited();
    if !lease.park(s, until).await {
        tracing::debug!(entry = %d.entry_id, "parking for a key slot failed; the entry comes back after its lease");
        return Admission::Waits;
    }
    // A slot given to it between the refusal and the park could not wake it: look.
    let scope = gate.scope(s);
    let mut conn = s.client.connection();
    match script::has_key_slot(&mut conn, &scope, key, &member).await {
        Ok(true) => wake(s, vec![member]).await,
        Ok(false) => {}
        Err(e) => {
            tracing::debug!(error = %e, "looking up a key slot failed; the entry waits for its parked time")
        }
    }
    Admission::Waits
}

/// Gives `holds` back (their entries were acknowledged, dead-lettered, or wait for a retry
/// outside a sequence) and wakes the waiters they go to. A failure leaves the holds to run
/// out with their leases.
pub(super) async fn release<H>(s: &Shared<H>, holds: Vec<KeyHold>) {
    let Some(gate) = &s.key_gate else { return };
    let pairs = holds
        .iter()
        .map(|h| (h.key.clone(), h.member.clone()))
        .collect();
    give_back(s, gate, pairs).await;
    drop(holds);
}

/// Gives back the holds of `members` (`<lane>:<entry id>`, whatever their key; a member
/// without a hold is passed over): a pull consumer's acks and dead letters, which name
/// only their entries.
pub(super) async fn release_entries<H>(s: &Shared<H>, members: Vec<String>) {
    let Some(gate) = &s.key_gate else { return };
    give_back(s, gate, by_entry(members)).await;
}

/// Moves the holds of `members` (`<lane>:<entry id>`) to `until_ms`: a pull consumer's
/// extended leases.
pub(super) async fn extend_entries<H>(s: &Shared<H>, members: Vec<String>, until_ms: i64) {
    let Some(gate) = &s.key_gate else { return };
    move_holds(s, gate, &by_entry(members), until_ms).await;
}

/// A pull consumer's retry of `member` at `retry_at_ms` ([`after_retry`]'s rule).
pub(super) async fn entry_retried<H>(s: &Shared<H>, member: String, retry_at_ms: i64) {
    let Some(gate) = &s.key_gate else { return };
    retried(s, gate, (String::new(), member), retry_at_ms).await;
}

/// Settles a hold for an entry that waits for a retry at `retry_at_ms`: under
/// `key_sequence` it keeps its key until then and two leases more; otherwise it is given
/// back.
pub(super) async fn after_retry<H>(s: &Shared<H>, hold: Option<KeyHold>, retry_at_ms: i64) {
    let (Some(gate), Some(hold)) = (&s.key_gate, hold) else {
        return;
    };
    retried(
        s,
        gate,
        (hold.key.clone(), hold.member.clone()),
        retry_at_ms,
    )
    .await;
}

/// The one rule for a retry's hold (`(key, member)`; an empty key: the entry's own).
async fn retried<H>(s: &Shared<H>, gate: &KeyGate, pair: (String, String), retry_at_ms: i64) {
    if gate.sequence {
        let until = retry_at_ms + 2 * ms(s.opts.visibility_timeout);
        move_holds(s, gate, &[pair], until).await;
    } else {
        give_back(s, gate, vec![pair]).await;
    }
}

/// `(key, member)` pairs naming entries only: `key_slots.lua` finds each hold's key.
fn by_entry(members: Vec<String>) -> Vec<(String, String)> {
    members.into_iter().map(|m| (String::new(), m)).collect()
}

/// `key_slots.lua release` of `pairs` (with retries), then wakes the waiters the slots go
/// to. A failure leaves the holds to run out with their leases.
async fn give_back<H>(s: &Shared<H>, gate: &KeyGate, pairs: Vec<(String, String)>) {
    if pairs.is_empty() {
        return;
    }
    let wake_hold = s.client.now_ms() + ms(s.opts.visibility_timeout);
    let r = with_retries("key_slots.lua", RetryPolicy::CALL, None, || {
        let mut conn = s.client.connection();
        let scope = gate.scope(s);
        let pairs = &pairs;
        async move { script::release_key_slots(&mut conn, &scope, wake_hold, pairs).await }
    })
    .await;
    match r {
        Ok(woken) => wake(s, woken).await,
        Err(e) => {
            tracing::warn!(queue = %s.queue, group = %s.group, error = %e, "giving key slots back failed; they run out with their leases")
        }
    }
}

/// `key_slots.lua extend` of `pairs` to `until_ms`. A failure leaves the holds to run out
/// with their leases.
async fn move_holds<H>(s: &Shared<H>, gate: &KeyGate, pairs: &[(String, String)], until_ms: i64) {
    if pairs.is_empty() {
        return;
    }
    let scope = gate.scope(s);
    let mut conn = s.client.connection();
    if let Err(e) = script::extend_key_slots(&mut conn, &scope, until_ms, pairs).await {
        tracing::warn!(queue = %s.queue, group = %s.group, error = %e, "extending key slots failed; they run out with their leases");
    }
}

/// Moves the timers of the woken waiters (`<lane>:<entry id>`) to now, lane by lane, and
/// tells this worker's reclaim loop to look now.
async fn wake<H>(s: &Shared<H>, woken: Vec<String>) {
    if woken.is_empty() {
        return;
    }
    let mut by_lane: HashMap<usize, Vec<String>> = HashMap::new();
    for m in woken {
        let Some((lane, id)) = m.split_once(':') else {
            continue;
        };
        let Some(lane) = lane
            .parse::<u16>()
            .ok()
            .and_then(|n| LaneId::checked(n, s.lanes.len()))
        else {
            continue;
        };
        by_lane.entry(lane.index()).or_default().push(id.to_owned());
    }
    let now = s.client.now_ms();
    let mut any = false;
    for (lane, ids) in by_lane {
        let keys = &s.lanes[lane];
        let (timers, errors) = (keys.timers(&s.group), keys.errors(&s.group));
        let mut conn = s.client.connection();
        match script::unpark(&mut conn, &timers, &errors, now, &ids).await {
            Ok(done) => any |= !done.is_empty(),
            Err(e) => {
                tracing::debug!(error = %e, "waking parked entries failed; they wake at their parked time")
            }
        }
    }
    if any {
        s.timer_hint.set(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_hold_is_no_longer_extended() {
        let holds: Arc<Mutex<HashMap<String, String>>> = Arc::default();
        lock(&holds).insert("0:1-0".into(), "k".into());
        let h = KeyHold {
            key: "k".into(),
            member: "0:1-0".into(),
            holds: holds.clone(),
        };
        drop(h);
        assert!(lock(&holds).is_empty());
        assert_eq!(member(LaneId(4), "5-1"), "4:5-1");
    }
}
