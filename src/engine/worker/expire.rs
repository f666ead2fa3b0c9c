//! The expiry check where an entry is handed to the group's handler (see
//! [`crate::engine::expiry`]): every taken entry (a read or a reclaim) passes here before
//! its handler runs.

use super::entry::Lease;
use super::{Delivery, Shared};
use crate::engine::expiry;
use std::sync::atomic::Ordering;

/// Hands `lease` back when `d` may be handled: it is a replay (`replayed`: an operator's
/// explicit decision), it has no `expires_after` (its own, `own_ms`, or the queue's
/// default), or it is in time. Otherwise the entry is dead-lettered for this group with
/// reason `expired` and its lateness, counted, and `None` is returned: the handler never
/// sees it. A dead-lettering that fails leaves the entry pending; its lease runs out and the
/// next hand-off judges it again. Orders without expiry cost one cached flag read.
pub(super) async fn check<H>(
    s: &Shared<H>,
    d: &Delivery,
    replayed: bool,
    own_ms: Option<i64>,
    lease: Lease,
) -> Option<Lease> {
    if replayed {
        return Some(lease);
    }
    let limit = match own_ms {
        Some(ms) => ms,
        None => match s.pause.expires_after_ms(&s.client).await {
            Some(ms) => ms,
            None => return Some(lease),
        },
    };
    let now = s.client.now_ms();
    let Some(late) = expiry::lateness(d.due_at_ms, limit, now) else {
        return Some(lease);
    };
    lease.release();
    let error = expiry::error_text(late, limit);
    let lane = s.lane(d.shard, d.priority);
    match super::settle::dead_letter(
        s,
        lane,
        &d.entry_id,
        &s.consumer,
        d.attempt,
        &error,
        Some(late),
    )
    .await
    {
        Ok(true) => {
            s.stats.expired.fetch_add(1, Ordering::Relaxed);
            s.metrics().expired();
            tracing::warn!(id = ?d.id, entry = %d.entry_id, group = %s.group, late_ms = late, "expired: dead-lettered, not handed to the handler");
        }
        Ok(false) => tracing::debug!(id = ?d.id, "entry taken over by another consumer"),
        Err(e) => {
            tracing::warn!(id = ?d.id, error = %e, "could not dead-letter an expired entry; it stays pending")
        }
    }
    None
}
