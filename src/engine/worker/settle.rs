//! Running a handler and settling its entry: ack (batched), retry or dead letter.

pub(super) use super::ack::{ack_commands, ack_pipeline, late_acks};
use super::entry::Lease;
use super::entry::Taken;
use super::key_gate::{self, KeyHold};
use super::{Delivery, Handler, HandlerError, HandlerResult, LaneId, Shared, WorkerStats};
use crate::engine::duration::ms;
use crate::engine::error::RedisContext;
use crate::engine::history::HistoryPolicy;
use crate::engine::keys::ShardKeys;
use crate::engine::redact;
use crate::engine::retry::{RetryPolicy, with_retries};
use crate::engine::scripts::{self, DeadArgs};
use crate::engine::telemetry::Redelivery;
use crate::engine::trace;
use futures_util::FutureExt;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::task::JoinSet;
use tracing::Instrument;

/// Spawns the task that owns `t` until it is settled: it waits for a handler slot (the
/// entry's lease is extended meanwhile), handles it and settles it. A panic anywhere in that
/// path drops the lease unsettled, so the entry comes due again when its lease runs out.
/// Entries still waiting for a slot when the worker stops are handed back
/// ([`super::entry::Lease::hand_back`]): the next consumer takes them at once.
pub(super) fn spawn_process<H: Handler>(
    tasks: &mut JoinSet<()>,
    s: &Arc<Shared<H>>,
    ack_tx: &AckSender,
    t: Taken,
    permit: OwnedSemaphorePermit,
) {
    let (s, ack_tx) = (s.clone(), ack_tx.clone());
    tasks.spawn(async move {
        // `permit` holds the entry's place among those taken; wait for a handler slot.
        let slot = tokio::select! {
            slot = s.sem.clone().acquire_owned() => slot.ok(),
            _ = s.stopping.cancelled() => None,
        };
        match slot {
            Some(slot) => {
                process_guarded(&s, &ack_tx, t).await;
                drop(slot);
            }
            None => t.lease.hand_back(&s).await,
        }
        drop(permit);
    });
}

/// [`process`], with a panic in the settling path (a hook, a bug) caught and logged: the
/// entry's lease is dropped unsettled and it is delivered again after its lease.
pub(super) async fn process_guarded<H: Handler>(s: &Shared<H>, ack_tx: &AckSender, t: Taken) {
    let entry = t.delivery.entry_id.clone();
    if AssertUnwindSafe(process(s, ack_tx, t))
        .catch_unwind()
        .await
        .is_err()
    {
        s.stats.panicked.fetch_add(1, Ordering::Relaxed);
        tracing::error!(%entry, group = %s.group, "panic while settling an entry; it is retried when its lease runs out");
    }
}

/// Handles one entry and settles it: ack, retry or dead letter.
async fn process<H: Handler>(s: &Shared<H>, ack_tx: &AckSender, t: Taken) {
    let Taken {
        delivery: d,
        for_group,
        bad,
        lease,
        expires_after_ms,
    } = t;
    if let Some(reason) = bad {
        lease.release();
        settle_dead(s, &d, &reason, false).await;
        return;
    }
    // Stale work is not handed to the handler (replays are: see `engine::expiry`).
    if let Some((late, limit)) =
        super::expire::past_limit(s, &d, for_group.is_some(), expires_after_ms).await
    {
        lease.release();
        settle_expired(s, &d, late, limit).await;
        return;
    }
    if let Some(g) = &for_group
        && *g != s.group
    {
        // A dead-letter replay for another group: not ours to handle.
        s.stats.skipped.fetch_add(1, Ordering::Relaxed);
        handled_metric(s, "skipped");
        let _ = ack_tx.send(Acked {
            lease,
            attempt: d.attempt,
            hold: None,
        });
        return;
    }
    // A key at its slots per key (`key_concurrency`): the entry waits, parked.
    let hold_ms = s.client.now_ms() + ms(s.opts.visibility_timeout);
    let (lease, hold) = match key_gate::admit(s, &d, lease, hold_ms).await {
        key_gate::Admission::Run(lease, hold) => (lease, hold),
        key_gate::Admission::Waits => return,
    };
    let late_us = delivery_metrics(s, &d, for_group.is_some());
    // The delivery's `process` span (free when nothing records it): the handler, its SQL
    // and its webhook call, and the settlement run inside it.
    let span = trace::process_span(&trace::Process {
        queue: s.queue.as_str(),
        group: &s.group,
        id: &d.id,
        entry_id: &d.entry_id,
        attempt: d.attempt,
        lateness_ms: late_us / 1000,
        priority: d.priority.as_str(),
        stored: d.trace.as_ref(),
    });
    handle_and_settle(s, ack_tx, d, (lease, hold), &span)
        .instrument(span.clone())
        .await;
}

/// Records how late `d` is handed to the group (`replayed`: a dead-letter replay or a
/// reconciliation); returns the lateness, µs. The on-time promise is measured on first
/// deliveries only; redeliveries (a retry or a reclaim, a replay, a reconciliation) have
/// their own histogram, by reason.
pub(super) fn delivery_metrics<H>(s: &Shared<H>, d: &Delivery, replayed: bool) -> i64 {
    let late_us = s.client.clock().now_us() - d.due_at_ms * 1000;
    let late_s = late_us as f64 / 1e6;
    match (replayed, d.attempt) {
        (false, 1) => s.metrics().lateness(d.priority, late_s),
        (false, _) => s.metrics().redelivery_age(Redelivery::Retry, late_s),
        // A reconciliation sends an order due at the moment it sends it; a replay keeps
        // the order's due time.
        (true, _) if d.due_at_ms >= d.dispatched_at_ms => {
            s.metrics().redelivery_age(Redelivery::Reconcile, late_s);
        }
        (true, _) => s.metrics().redelivery_age(Redelivery::Replay, late_s),
    }
    late_us
}

/// Runs the handler on `d` and settles its entry: ack, retry or dead letter, and its key
/// slot with it; the outcome is recorded on `span`.
async fn handle_and_settle<H: Handler>(
    s: &Shared<H>,
    ack_tx: &AckSender,
    d: Delivery,
    (lease, hold): (Lease, Option<KeyHold>),
    span: &tracing::Span,
) {
    // What settling needs once the handler has the delivery: all of it with hooks, else
    // the few fields that name the entry.
    let (d, outcome) = if d.attempt > s.opts.max_attempts {
        // Delivered more often than allowed without a result: its consumers kept dying.
        let e = HandlerError::permanent(exhausted(d.attempt));
        (d, Err(e))
    } else if s.has_hooks {
        let r = run_handler(&s.handler, d.clone(), s.opts.handler_timeout, &s.stats).await;
        (d, r)
    } else {
        let kept = d.settling_copy();
        let r = run_handler(&s.handler, d, s.opts.handler_timeout, &s.stats).await;
        (kept, r)
    };
    match outcome {
        Ok(()) => {
            trace::record_outcome(span, "success", None);
            handled_metric(s, "success");
            hook(s, "on_success", || s.hooks.on_success(&d));
            // The lease travels with the ack and is released once XACK is done. The acker
            // outlives every task; a closed channel means shutdown already gave up on this
            // entry, which then stays pending and is delivered again.
            let _ = ack_tx.send(Acked {
                lease,
                attempt: d.attempt,
                hold,
            });
        }
        Err(HandlerError::Retry { message, after }) if d.attempt < s.opts.max_attempts => {
            trace::record_outcome(span, "retry", Some(&message));
            let delay = after.unwrap_or_else(|| s.opts.backoff.delay(d.attempt));
            lease.release();
            settle_retry(s, &d, &message, delay).await;
            key_gate::after_retry(s, hold, s.client.now_ms() + ms(delay)).await;
        }
        Err(HandlerError::Retry { message, .. } | HandlerError::Permanent { message }) => {
            trace::record_outcome(span, "dead", Some(&message));
            lease.release();
            settle_dead(s, &d, &message, true).await;
            key_gate::release(s, hold.into_iter().collect()).await;
        }
    }
}

/// Why an entry delivered `attempt` times, more than the group's `max_attempts`, is
/// dead-lettered without being handled.
pub(super) fn exhausted(attempt: u32) -> String {
    format!("delivered {attempt} times without a result (consumers crashed or lost their lease)")
}

/// Runs a hook; a panic in it is logged and otherwise ignored (the entry is settled all the
/// same).
fn hook<H>(s: &Shared<H>, name: &'static str, f: impl FnOnce()) {
    if std::panic::catch_unwind(AssertUnwindSafe(f)).is_err() {
        s.stats.panicked.fetch_add(1, Ordering::Relaxed);
        tracing::error!(group = %s.group, hook = name, "hook panicked; settling the entry anyway");
    }
}

/// A failed attempt with attempts left: `retry.lua` moves the entry's timer to the next
/// attempt. The caller released the lease. True when the retry was scheduled.
pub(super) async fn settle_retry<H>(
    s: &Shared<H>,
    d: &Delivery,
    message: &str,
    delay: Duration,
) -> bool {
    handled_metric(s, "retry");
    hook(s, "on_failure", || {
        s.hooks.on_failure(d, message, Some(delay))
    });
    let keys = s.lane(d.shard, d.priority);
    let at = s.client.now_ms() + ms(delay);
    let error = redact::error(message);
    let args = scripts::RetryArgs {
        group: &s.group,
        consumer: &s.consumer,
        entry_id: d.entry_id.as_str(),
        at_ms: at,
        error: error.as_str(),
        announce: s.pull,
    };
    let args = &args;
    let r = with_retries("retry.lua", RetryPolicy::CALL, None, || {
        let mut conn = s.client.connection();
        async move { scripts::retry(&mut conn, keys, args).await }
    })
    .await;
    match r {
        Ok(true) => {
            s.stats.retried.fetch_add(1, Ordering::Relaxed);
            s.timer_hint.set(at);
            tracing::debug!(id = ?d.id, attempt = d.attempt, ?delay, "retry scheduled");
            true
        }
        Ok(false) => {
            tracing::debug!(id = ?d.id, "entry taken over by another consumer");
            false
        }
        // The lease stays as it was: the entry is retried when it runs out.
        Err(e) => {
            tracing::warn!(id = ?d.id, error = %e, "could not schedule the retry");
            false
        }
    }
}

/// A permanent failure, the last attempt, or an entry that cannot be handled: `dead.lua`
/// moves the entry to the dead-letter stream and acknowledges it. Hooks run only for
/// entries a handler saw. The caller released the lease. True when it was dead-lettered.
pub(super) async fn settle_dead<H>(
    s: &Shared<H>,
    d: &Delivery,
    message: &str,
    hooks: bool,
) -> bool {
    if hooks {
        hook(s, "on_failure", || s.hooks.on_failure(d, message, None));
    }
    let error = redact::error(message);
    let lane = s.lane(d.shard, d.priority);
    match dead_letter(s, lane, &d.entry_id, &s.consumer, d.attempt, &error, None).await {
        Ok(true) => {
            tracing::warn!(id = ?d.id, entry = %d.entry_id, group = %s.group, attempts = d.attempt, %error, "dead-lettered");
            if hooks {
                hook(s, "on_dead", || s.hooks.on_dead(d, message));
            }
            true
        }
        Ok(false) => {
            tracing::debug!(id = ?d.id, "entry taken over by another consumer");
            false
        }
        Err(e) => {
            tracing::warn!(id = ?d.id, error = %e, "could not dead-letter; it stays pending");
            false
        }
    }
}

/// Runs `dead.lua` for an entry owned by `owner` (with retries) and counts a dead letter;
/// false when the entry was no longer that owner's. `late_ms`: the entry expired (see
/// [`crate::engine::expiry`]).
async fn dead_letter<H>(
    s: &Shared<H>,
    keys: &ShardKeys,
    entry_id: &str,
    owner: &str,
    attempts: u32,
    error: &str,
    late_ms: Option<i64>,
) -> crate::engine::error::Result<bool> {
    let args = DeadArgs {
        group: &s.group,
        consumer: owner,
        entry_id,
        attempts,
        error,
        now_ms: s.client.now_ms(),
        history: s.pause.history(&s.client).await,
        late_ms,
    };
    let r = with_retries("dead.lua", RetryPolicy::CALL, None, || {
        let mut conn = s.client.connection();
        let args = &args;
        async move { scripts::dead_letter(&mut conn, keys, args).await }
    })
    .await;
    if matches!(r, Ok(true)) {
        // The dead letters grew: the trim chore holds them to the cap at its next pass.
        s.client.touched().mark(keys);
        s.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
        handled_metric(s, "dead");
        s.metrics().dead_lettered();
    }
    r
}

/// Dead-letters an entry that expired (`late_ms` past due + `limit_ms`) for this group, with
/// reason `expired`, and counts it; the handler never sees it. A dead-lettering that fails
/// leaves the entry pending: its lease runs out and the next hand-off judges it again. The
/// caller released the lease.
pub(super) async fn settle_expired<H>(s: &Shared<H>, d: &Delivery, late_ms: i64, limit_ms: i64) {
    let error = crate::engine::expiry::error_text(late_ms, limit_ms);
    let lane = s.lane(d.shard, d.priority);
    let owner = &s.consumer;
    match dead_letter(
        s,
        lane,
        &d.entry_id,
        owner,
        d.attempt,
        &error,
        Some(late_ms),
    )
    .await
    {
        Ok(true) => {
            s.stats.expired.fetch_add(1, Ordering::Relaxed);
            s.metrics().expired();
            tracing::warn!(id = ?d.id, entry = %d.entry_id, group = %s.group, late_ms, "expired: dead-lettered, not handed to the handler");
        }
        Ok(false) => tracing::debug!(id = ?d.id, "entry taken over by another consumer"),
        Err(e) => {
            tracing::warn!(id = ?d.id, error = %e, "could not dead-letter an expired entry; it stays pending")
        }
    }
}

/// The stable reason of a dead letter whose stream entry was deleted while pending.
pub(crate) const ENTRY_MISSING: &str =
    "entry_missing: the stream entry was deleted while it was pending in the group";

/// Dead-letters an entry still pending (owned by `owner`) whose stream entry is gone, with
/// the reason [`ENTRY_MISSING`]: nothing leaves the pending list without a record.
pub(super) async fn settle_missing<H>(
    s: &Shared<H>,
    lane: &ShardKeys,
    entry_id: &str,
    owner: &str,
    attempts: u32,
) {
    match dead_letter(s, lane, entry_id, owner, attempts, ENTRY_MISSING, None).await {
        Ok(true) => {
            tracing::warn!(entry = %entry_id, group = %s.group, attempts, "dead-lettered: its stream entry was deleted while pending");
        }
        Ok(false) => {
            tracing::debug!(entry = %entry_id, "missing entry settled by its owner meanwhile")
        }
        Err(e) => {
            tracing::warn!(entry = %entry_id, error = %e, "could not dead-letter a missing entry; it is looked at again after its lease")
        }
    }
}

pub(super) fn handled_metric<H>(s: &Shared<H>, outcome: &'static str) {
    s.metrics().handled(outcome);
}

/// Runs the handler once. Panics and timeouts count as retryable failures.
pub(super) async fn run_handler<H: Handler>(
    handler: &H,
    delivery: Delivery,
    timeout: Duration,
    stats: &WorkerStats,
) -> HandlerResult {
    let id = delivery.id.clone();
    let fut = AssertUnwindSafe(handler.handle(delivery)).catch_unwind();
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(Ok(()))) => {
            stats.succeeded.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        Ok(Ok(Err(e))) => {
            stats.failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(?id, error = %redact::text(&e.to_string()), "handler failed");
            Err(e)
        }
        Ok(Err(_)) => {
            stats.panicked.fetch_add(1, Ordering::Relaxed);
            tracing::error!(?id, "handler panicked");
            Err(HandlerError::retry("handler panicked"))
        }
        Err(_) => {
            stats.timed_out.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(?id, ?timeout, "handler timed out");
            Err(HandlerError::retry(format!(
                "handler timed out after {timeout:?}"
            )))
        }
    }
}

/// Most entries acknowledged in one call per shard.
const ACK_BATCH: usize = 1024;
/// How long a small batch of acknowledgements waits for more.
const ACK_LINGER: Duration = Duration::from_millis(2);

/// An entry handled successfully, on its way to be acknowledged, with its lease.
pub(super) struct Acked {
    pub(super) lease: Lease,
    /// Its delivery count: above 1, the entry may have an error record to drop, and its
    /// history keeps how many attempts it took.
    pub(super) attempt: u32,
    /// Its order key's slot (`key_concurrency`), given back once it is acknowledged.
    pub(super) hold: Option<KeyHold>,
}

/// Acknowledges entries in batches until every sender is gone. A failed ack is retried; an
/// entry whose ack is finally given up on stays pending (delivered again, never lost).
pub(super) async fn ack_loop<H>(s: Arc<Shared<H>>, mut rx: mpsc::UnboundedReceiver<Acked>) {
    let mut buf = Vec::with_capacity(ACK_BATCH);
    while rx.recv_many(&mut buf, ACK_BATCH).await > 0 {
        // A trickle of successes: gather a few milliseconds' worth into one call (their
        // leases stay held meanwhile). A closed channel (shutdown) flushes at once.
        if buf.len() < ACK_BATCH / 8 {
            let deadline = tokio::time::Instant::now() + ACK_LINGER;
            while buf.len() < ACK_BATCH {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(a)) => buf.push(a),
                    Ok(None) | Err(_) => break,
                }
            }
        }
        // By lane (the lease key's first part).
        let mut by_lane: HashMap<LaneId, Vec<(String, u32)>> = HashMap::new();
        for a in &buf {
            let (lane, id) = a.lease.key();
            by_lane
                .entry(lane)
                .or_default()
                .push((id.to_owned(), a.attempt));
        }
        let retried = by_lane.values().flatten().any(|(_, n)| *n > 1);
        let history = if retried {
            s.pause.history(&s.client).await
        } else {
            HistoryPolicy::from_ms(0)
        };
        // Every lane's pipeline in flight together (one round trip, not one per lane).
        let calls = by_lane.into_iter().map(|(lane, entries)| {
            let keys = &s.lanes[lane.index()];
            let pipe = ack_pipeline(
                keys,
                &s.group,
                &s.consumer,
                &entries,
                &history,
                s.client.now_ms(),
            );
            let client = &s.client;
            async move {
                let pipe = &pipe;
                let r = with_retries("XACK", RetryPolicy::CALL, None, || {
                    let mut conn = client.connection();
                    async move {
                        let replies: Vec<redis::Value> = pipe
                            .query_async(&mut conn)
                            .await
                            .ctx("acknowledging entries (XACK + ZREM)")?;
                        let acked = match replies.get(1) {
                            Some(redis::Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
                            _ => 0,
                        };
                        Ok((replies.into_iter().next(), acked))
                    }
                })
                .await;
                (entries, r)
            }
        });
        for (entries, r) in futures_util::future::join_all(calls).await {
            match r {
                Ok((owned, n)) => {
                    s.stats.acked.fetch_add(n, Ordering::Relaxed);
                    // Entries this consumer no longer owned when it acknowledged them: its
                    // lease ran out and another consumer took the entry over (or had
                    // acknowledged it already). This copy came late.
                    let late = late_acks(&entries, owned);
                    if late > 0 {
                        s.stats.late_acks.fetch_add(late, Ordering::Relaxed);
                        s.metrics().late_acks(late);
                    }
                }
                Err(e) => tracing::error!(
                    error = %e, entries = entries.len(),
                    "ack failed; the entries stay pending and will be delivered again"
                ),
            }
        }
        // Acknowledged (or given up on): the key slots go to their next waiters, and the
        // leases end here.
        let holds: Vec<KeyHold> = buf.iter_mut().filter_map(|a| a.hold.take()).collect();
        key_gate::release(&s, holds).await;
        buf.clear();
    }
}

/// Where settled-successfully entries go to be acknowledged in batches, with their leases.
pub(super) type AckSender = mpsc::UnboundedSender<Acked>;
