//! The reclaim loop: claims the group's due timers (a dead consumer's entries, retries whose
//! backoff elapsed) with `reclaim.lua`.

use super::entry::{Fields, claimed_entries, ms, to_taken};
use super::reader::may_take;
use super::settle::{AckSender, process_guarded};
use super::{Handler, Shared};
use crate::engine::keys::ShardKeys;
use crate::engine::scripts;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Claims due timers until `cancel`; returns the tasks it spawned that still run, so
/// shutdown can wait for them (and abort them after the grace).
pub(super) async fn reclaim_loop<H: Handler>(
    s: Arc<Shared<H>>,
    ack_tx: AckSender,
    cancel: CancellationToken,
) -> JoinSet<()> {
    let mut handles: JoinSet<()> = JoinSet::new();
    let mut next_look = s.client.now_ms();
    loop {
        if cancel.is_cancelled() {
            return handles;
        }
        while handles.try_join_next().is_some() {}
        let wait = u64::try_from(next_look - s.client.now_ms()).unwrap_or(0);
        if wait > 0 {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
                _ = cancel.cancelled() => return handles,
            }
        }
        if !may_take(&s, &cancel).await {
            continue;
        }
        // Only claim what can be handled now.
        let first = tokio::select! {
            p = s.sem.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return handles },
            _ = cancel.cancelled() => return handles,
        };
        let mut permits = vec![first];
        while permits.len() < 100 {
            match s.sem.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        let now = s.client.now_ms();
        next_look = now + ms(s.opts.reclaim_every);
        for keys in &s.shards {
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
            let Some((claimed, next)) = claim(&s, keys, now, lease_until, count).await else {
                continue;
            };
            if let Some(n) = next {
                next_look = next_look.min(n);
            }
            if claimed.len() == count {
                next_look = now; // maybe more are due
            }
            for (entry_id, fields, count) in claimed {
                s.stats.reclaimed.fetch_add(1, Ordering::Relaxed);
                // A claim never returns more entries than there are permits.
                let Some(permit) = permits.pop() else { break };
                let t = to_taken(&s, keys.shard, &entry_id, Some(fields), count, lease_until);
                let (s2, ack_tx) = (s.clone(), ack_tx.clone());
                handles.spawn(async move {
                    process_guarded(&s2, &ack_tx, t).await;
                    drop(permit);
                });
            }
        }
    }
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

/// Claims up to `count` due timers of one shard; the claimed entries and the shard's next
/// due timer (unix ms). `None` (logged) when the call failed.
async fn claim<H>(
    s: &Shared<H>,
    keys: &ShardKeys,
    now: i64,
    lease_until: i64,
    count: usize,
) -> Option<(Vec<(String, Fields, u32)>, Option<i64>)> {
    let mut conn = s.client.connection();
    let r = scripts::reclaim(
        &mut conn,
        keys,
        &s.group,
        &s.consumer,
        now,
        lease_until,
        count,
    )
    .await;
    let (claimed, next) = match r {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!(error = %e, "reclaim failed");
            return None;
        }
    };
    match claimed_entries(claimed) {
        Ok(c) => Some((c, next.map(scripts::score_to_ms))),
        Err(e) => {
            tracing::error!(error = %e, "unexpected reclaim reply");
            None
        }
    }
}
