//! The reclaim loop: claims the group's due timers (a dead consumer's entries, retries whose
//! backoff elapsed) with `reclaim.lua`.

use super::entry::to_taken;
use super::reader::may_take;
use super::settle::{self, AckSender, spawn_process};
use super::{Handler, LaneId, Shared};
use crate::engine::duration::ms;
use crate::engine::keys::ShardKeys;
use crate::engine::reply::{Fields, claimed_entries};
use crate::engine::scripts;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Most entries one reclaim pass takes.
const MAX_CLAIM: usize = 100;

/// The earliest timer this worker set itself (a retry) since the reclaim loop last looked,
/// and the wake-up that tells the loop: without it the loop would see the retry only at its
/// next look (`reclaim_every`, or an earlier timer it already knew of).
#[derive(Debug)]
pub(super) struct TimerHint {
    at: AtomicI64,
    wake: Notify,
}

impl Default for TimerHint {
    fn default() -> Self {
        TimerHint {
            at: AtomicI64::new(i64::MAX),
            wake: Notify::new(),
        }
    }
}

/// How long the loop waits after a look that saw no timer in any lane (an idle group: nothing
/// leased, nothing to retry): `reclaim_every`, doubling with each such look up to a third of
/// the visibility timeout; back to `reclaim_every` once a look sees a timer. An idle worker
/// then costs one look per lane every few seconds, not every second. Nothing it must act on
/// soon goes unseen: its own retries wake it ([`TimerHint`]), and a lease another consumer
/// takes after a look runs out no sooner than a visibility timeout later, by when a look
/// has seen it.
#[derive(Debug, Clone, Copy)]
pub(super) struct IdleLooks {
    base: Duration,
    cap: Duration,
    next: Duration,
}

impl IdleLooks {
    /// Looks every `reclaim_every` while busy, backing off to `visibility_timeout / 3`.
    pub(super) fn new(reclaim_every: Duration, visibility_timeout: Duration) -> Self {
        let cap = (visibility_timeout / 3).max(reclaim_every);
        IdleLooks {
            base: reclaim_every,
            cap,
            next: reclaim_every,
        }
    }

    /// The wait before the next look, after a look that saw a timer or not.
    pub(super) fn after(&mut self, saw_timer: bool) -> Duration {
        if saw_timer {
            self.next = self.base;
            return self.base;
        }
        let wait = self.next;
        self.next = (self.next * 2).min(self.cap);
        wait
    }
}

impl TimerHint {
    /// A timer at `at_ms` (unix ms) was set: the loop looks by then.
    pub(super) fn set(&self, at_ms: i64) {
        self.at.fetch_min(at_ms, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// The earliest timer set since the last call, if any.
    fn take(&self) -> Option<i64> {
        let at = self.at.swap(i64::MAX, Ordering::SeqCst);
        (at != i64::MAX).then_some(at)
    }
}

/// Claims due timers until `cancel`; returns the tasks it spawned that still run, so
/// shutdown can wait for them (and abort them after the grace).
///
/// Each pass first asks every shard for its earliest timer (no permit held): only when
/// something is due does it take places among the entries the worker may hold (the same
/// budget the readers use; handler slots are taken by each entry's task when it runs, never
/// across a Redis call), then claims that many. A due entry this worker still holds (its
/// extension failed for a while, so its timer ran out) is neither claimed nor handled twice:
/// `reclaim.lua` is told which entries the worker holds and only leases those again (a
/// claim would count a delivery, so the retry would arrive one attempt late); the running
/// copy keeps the lease, at the new lease end.
pub(super) async fn reclaim_loop<H: Handler>(
    s: Arc<Shared<H>>,
    ack_tx: AckSender,
    cancel: CancellationToken,
) -> JoinSet<()> {
    let mut handles: JoinSet<()> = JoinSet::new();
    let mut next_look = s.client.now_ms();
    let mut idle = IdleLooks::new(s.opts.reclaim_every, s.opts.visibility_timeout);
    loop {
        if cancel.is_cancelled() {
            return handles;
        }
        while handles.try_join_next().is_some() {}
        if let Some(at) = s.timer_hint.take() {
            next_look = next_look.min(at);
        }
        let wait = u64::try_from(next_look - s.client.now_ms()).unwrap_or(0);
        if wait > 0 {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
                // A retry this worker set: look again by its due time.
                _ = s.timer_hint.wake.notified() => continue,
                _ = cancel.cancelled() => return handles,
            }
        }
        if !may_take(&s, &cancel).await {
            continue;
        }
        let now = s.client.now_ms();
        next_look = i64::MAX;
        let due = due_shards(&s, now, &mut next_look).await;
        let saw_timer = !due.is_empty() || next_look != i64::MAX;
        next_look = next_look.min(now + ms(idle.after(saw_timer)));
        if due.is_empty() {
            continue;
        }
        // Something is due: places among the entries this worker may hold.
        let first = tokio::select! {
            p = s.taken.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return handles },
            _ = cancel.cancelled() => return handles,
        };
        let mut permits = vec![first];
        while permits.len() < MAX_CLAIM {
            match s.taken.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        let now = s.client.now_ms();
        for i in due {
            let keys = &s.lanes[i];
            if permits.is_empty() {
                next_look = now;
                break;
            }
            let lease_until = now + ms(s.opts.visibility_timeout);
            let Some(count) = rate_limited_count(&s, keys, now, permits.len()).await else {
                next_look = now + 10;
                break;
            };
            if count == 0 {
                continue;
            }
            let lane = LaneId::of(keys.shard, keys.level);
            let held = s.leases.held_in(lane);
            let Some((claimed, next, missing, kept)) =
                claim(&s, keys, now, lease_until, count, &held).await
            else {
                continue;
            };
            for entry_id in kept {
                if s.leases.renew_if_held(lane, &entry_id, lease_until) {
                    s.stats.reclaimed_own.fetch_add(1, Ordering::Relaxed);
                } else {
                    // Settled since the call was sent: its settlement moved or dropped the
                    // timer, unless a retry due at once was leased again just after it.
                    // Hand that one back (where the timer still holds this lease).
                    give_back(&s, keys, &entry_id, lease_until, now).await;
                    next_look = now;
                }
            }
            for (entry_id, owner, attempts) in missing {
                settle::settle_missing(&s, keys, &entry_id, &owner, attempts).await;
            }
            if let Some(n) = next {
                next_look = next_look.min(n);
            }
            if claimed.len() == count {
                next_look = now; // maybe more are due
            } else if let Some(rl) = &s.opts.rate_limit {
                let unused = count - claimed.len().min(count);
                if let Err(e) =
                    crate::engine::flow::refund_permits(&s.client, &s.queue, &s.group, rl, unused)
                        .await
                {
                    tracing::warn!(error = %e, "refunding rate-limit permits failed");
                }
            }
            for (entry_id, fields, count) in claimed {
                if s.leases.renew_if_held(lane, &entry_id, lease_until) {
                    // Still running here, though another consumer claimed it meanwhile
                    // (this worker's lease had run out): one owner, one copy.
                    s.stats.reclaimed_own.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                s.stats.reclaimed.fetch_add(1, Ordering::Relaxed);
                // A claim never returns more entries than there are permits.
                let Some(permit) = permits.pop() else { break };
                let t = to_taken(&s, keys, &entry_id, Some(fields), count, lease_until);
                spawn_process(&mut handles, &s, &ack_tx, t, permit);
            }
        }
    }
}

/// The shards whose earliest timer is due at `now` (one `ZRANGE ... 0 0` each, in flight
/// together, no permit held); lowers `next_look` to the earliest timer not yet due.
pub(super) async fn due_shards<H>(s: &Shared<H>, now: i64, next_look: &mut i64) -> Vec<usize> {
    let firsts = futures_util::future::join_all(s.lanes.iter().map(|k| {
        let mut conn = s.client.connection();
        let key = k.timers(&s.group);
        async move {
            redis::cmd("ZRANGE")
                .arg(key)
                .arg(0)
                .arg(0)
                .arg("WITHSCORES")
                .query_async::<Vec<(String, f64)>>(&mut conn)
                .await
        }
    }))
    .await;
    let mut due = Vec::new();
    for (i, r) in firsts.into_iter().enumerate() {
        match r {
            Ok(v) => {
                if let Some((_, score)) = v.first() {
                    let at = crate::engine::reply::score_to_ms(*score);
                    if at <= now {
                        due.push(i);
                    } else {
                        *next_look = (*next_look).min(at);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the group's timers failed");
                due.push(i);
            }
        }
    }
    due
}

/// How many due timers of a shard to claim: all that fit in `free` slots, or, under a rate
/// limit, as many of the due ones as the limiter grants (permits are only taken for entries
/// that are due). `None` when the limiter granted nothing.
async fn rate_limited_count<H>(
    s: &Shared<H>,
    keys: &ShardKeys,
    now: i64,
    free: usize,
) -> Option<usize> {
    let Some(rl) = &s.opts.rate_limit else {
        return Some(free);
    };
    let due: usize = redis::cmd("ZCOUNT")
        .arg(keys.timers(&s.group))
        .arg("-inf")
        .arg(now)
        .query_async(&mut s.client.connection())
        .await
        .unwrap_or(0);
    let want = due.min(free);
    if want == 0 {
        return Some(0);
    }
    match crate::engine::flow::take_permits(&s.client, &s.queue, &s.group, rl, want).await {
        Ok((granted, _)) if granted > 0 => Some(granted),
        Ok(_) => {
            crate::engine::telemetry::rate_limited(s.queue.as_str(), &s.group);
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "rate limiter failed");
            None
        }
    }
}

/// Moves the timer of an entry that `reclaim.lua` leased again for this worker, but that
/// the worker settled meanwhile, back to `now` where it still holds that lease (a retry due
/// at once), so the next pass claims it. Logged when it fails: the entry then waits for its
/// lease to run out.
async fn give_back<H>(s: &Shared<H>, keys: &ShardKeys, entry_id: &str, lease_until: i64, now: i64) {
    let held = [(entry_id.to_owned(), lease_until)];
    if let Err(e) = scripts::extend(
        &mut s.client.connection(),
        &keys.timers(&s.group),
        now,
        &held,
    )
    .await
    {
        tracing::warn!(error = %e, entry = %entry_id, "handing back a settled entry's timer failed");
    }
}

/// What one `reclaim.lua` call returns: the claimed entries, the shard's next due timer
/// (unix ms), the pending entries whose stream entry is gone, and the held entries leased
/// again.
pub(super) type Claim = (
    Vec<(String, Fields, u32)>,
    Option<i64>,
    Vec<(String, String, u32)>,
    Vec<String>,
);

/// Claims up to `count` due timers of one shard, leasing again those of `held` that are
/// due. `None` (logged) when the call failed.
pub(super) async fn claim<H>(
    s: &Shared<H>,
    keys: &ShardKeys,
    now: i64,
    lease_until: i64,
    count: usize,
    held: &[String],
) -> Option<Claim> {
    let mut conn = s.client.connection();
    let r = scripts::reclaim(
        &mut conn,
        keys,
        &s.group,
        &s.consumer,
        now,
        lease_until,
        count,
        held,
    )
    .await;
    let (claimed, next, missing, kept) = match r {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!(error = %e, "reclaim failed");
            return None;
        }
    };
    match claimed_entries(claimed) {
        Ok(c) => Some((
            c,
            next.map(crate::engine::reply::score_to_ms),
            missing,
            kept,
        )),
        Err(e) => {
            tracing::error!(error = %e, "unexpected reclaim reply");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{IdleLooks, TimerHint};
    use std::time::Duration;

    #[test]
    fn an_idle_group_is_looked_at_less_and_less_often_until_a_timer_shows() {
        let s = Duration::from_secs;
        let mut l = IdleLooks::new(s(1), s(30));
        let waits: Vec<Duration> = (0..6).map(|_| l.after(false)).collect();
        assert_eq!(
            waits,
            [s(1), s(2), s(4), s(8), s(10), s(10)],
            "capped at 30 s / 3"
        );
        assert_eq!(l.after(true), s(1), "a timer: back to reclaim_every");
        assert_eq!(l.after(false), s(1));
        assert_eq!(l.after(false), s(2));
        // A visibility timeout under three looks keeps the looks at reclaim_every.
        let mut short = IdleLooks::new(s(1), s(2));
        assert_eq!((short.after(false), short.after(false)), (s(1), s(1)));
    }

    #[test]
    fn a_timer_hint_keeps_the_earliest_and_is_taken_once() {
        let h = TimerHint::default();
        assert_eq!(h.take(), None);
        h.set(500);
        h.set(300);
        h.set(900);
        assert_eq!(h.take(), Some(300));
        assert_eq!(h.take(), None, "taken");
    }
}
