//! The expiry check where an entry is handed to the group's handler (see
//! [`crate::engine::expiry`]): every taken entry (a read or a reclaim) passes here before
//! its handler runs; `settle` dead-letters the expired ones.

use super::{Delivery, Shared};
use crate::engine::expiry;

/// How late handing `d` to the group now would be past its limit, with that limit:
/// `Some((late_ms, limit_ms))` when it expired, `None` when it may be handled: it is a
/// replay (`replayed`: an operator's explicit decision), it has no `expires_after` (its
/// own, `own_ms`, or the queue's default), or it is in time. Orders without expiry cost one
/// cached flag read.
pub(super) async fn past_limit<H>(
    s: &Shared<H>,
    d: &Delivery,
    replayed: bool,
    own_ms: Option<i64>,
) -> Option<(i64, i64)> {
    if replayed {
        return None;
    }
    let limit = match own_ms {
        Some(ms) => ms,
        None => s.pause.expires_after_ms(&s.client).await?,
    };
    expiry::lateness(d.due_at_ms, limit, s.client.now_ms()).map(|late| (late, limit))
}
