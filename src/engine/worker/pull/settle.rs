//! Settling pulled deliveries: `ack`, `nack` and `extend`, each honouring a receipt only
//! while the group's timer still holds its lease (see the parent module).

use super::super::key_gate;
use super::super::receipt::Receipt;
use super::super::settle::{ack_commands, handled_metric, settle_dead, settle_retry};
use super::super::{Delivery, LaneId};
use super::{Extended, MAX_LEASE, Nack, Puller, Settled, bad_option, check_count, check_lease};
use crate::engine::duration::ms;
use crate::engine::error::{Error, RedisContext, Result};
use crate::engine::history::HistoryPolicy;
use crate::engine::retry::{RetryPolicy, with_retries};
use crate::engine::scripts;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl Puller {
    /// Opens every receipt (any invalid one refuses the call, nothing changed).
    fn open_all(&self, receipts: &[&str]) -> Result<Vec<Receipt>> {
        check_count(receipts.len())?;
        receipts
            .iter()
            .map(|r| Ok(self.signer.open(r, self.s.lanes.len())?))
            .collect()
    }

    /// Moves the leases of `held` (one lane) to `until` where the timer still holds each
    /// receipt's lease; returns the ids moved.
    async fn cas_leases(
        &self,
        lane: LaneId,
        until: i64,
        held: &[(String, i64)],
    ) -> Result<Vec<String>> {
        let s = &self.s;
        let key = s.lanes[lane.index()].timers(&s.group);
        with_retries("extend.lua", RetryPolicy::CALL, None, || {
            let mut conn = s.client.connection();
            let key = &key;
            async move { scripts::extend(&mut conn, key, until, held).await }
        })
        .await
    }

    /// Takes the leases of `rs` (one lane) over for settling: moves each to a fresh lease
    /// end (the visibility timeout from now, never equal to a receipt's) while it still
    /// holds the receipt's. Returns which did.
    async fn fence(&self, lane: LaneId, rs: &[&Receipt]) -> Result<Vec<bool>> {
        let held: Vec<(String, i64)> = rs
            .iter()
            .map(|r| (r.entry_id.clone(), r.lease_until))
            .collect();
        let until = fresh_end(
            self.s.client.now_ms() + ms(self.s.opts.visibility_timeout),
            &held,
        );
        self.cas_each(lane, until, &held).await
    }

    /// Which of the distinct `held` (entry id, lease end) pairs of one lane still held
    /// their lease and now hold `until` (which none of them holds): each pair answers for
    /// itself, also when several name one entry (an older receipt beside a newer one), with
    /// one `extend.lua` call per round of distinct entries.
    async fn cas_each(
        &self,
        lane: LaneId,
        until: i64,
        held: &[(String, i64)],
    ) -> Result<Vec<bool>> {
        let mut out = vec![false; held.len()];
        let mut left: Vec<usize> = (0..held.len()).collect();
        while !left.is_empty() {
            let mut ids = std::collections::HashSet::new();
            let (round, rest): (Vec<usize>, Vec<usize>) = left
                .into_iter()
                .partition(|&i| ids.insert(held[i].0.as_str()));
            let pairs: Vec<(String, i64)> = round.iter().map(|&i| held[i].clone()).collect();
            let moved = self.cas_leases(lane, until, &pairs).await?;
            for i in round {
                out[i] = moved.contains(&held[i].0);
            }
            left = rest;
        }
        Ok(out)
    }

    /// Acknowledges entries of one lane this consumer holds (fenced, or just taken): the
    /// worker's ack commands in one pipeline (one `XACK` of them all, the timers' `ZREM`,
    /// the history markers), without the worker's ownership check, since the fence (a
    /// compare-and-set on each lease) settled it and counted the late ones. Returns how many
    /// Redis acknowledged.
    pub(super) async fn ack_lane(&self, lane: LaneId, entries: &[(String, u32)]) -> Option<u64> {
        let s = &self.s;
        let keys = &s.lanes[lane.index()];
        let history = if entries.iter().any(|(_, n)| *n > 1) {
            s.pause.history(&s.client).await
        } else {
            HistoryPolicy::from_ms(0)
        };
        let mut pipe = redis::pipe();
        ack_commands(
            &mut pipe,
            keys,
            &s.group,
            entries,
            &history,
            s.client.now_ms(),
        );
        let r = with_retries("XACK", RetryPolicy::CALL, None, || {
            let mut conn = s.client.connection();
            let pipe = &pipe;
            async move {
                let replies: Vec<redis::Value> = pipe
                    .query_async(&mut conn)
                    .await
                    .ctx("acknowledging entries (XACK + ZREM)")?;
                Ok(replies)
            }
        })
        .await;
        match r {
            Ok(replies) => {
                let acked = match replies.first() {
                    Some(redis::Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
                    _ => 0,
                };
                s.stats.acked.fetch_add(acked, Ordering::Relaxed);
                Some(acked)
            }
            Err(e) => {
                tracing::error!(error = %e, entries = entries.len(),
                    "ack failed; the entries stay pending and will be delivered again");
                None
            }
        }
    }

    /// Acknowledges the deliveries of `receipts` (1..=[`MAX_RECEIPTS`](super::MAX_RECEIPTS)), in order: each is
    /// [`Settled::Done`], or [`Settled::LeaseLost`] (counted as a late ack, nothing
    /// changed) when its lease ran out and the entry was taken over or settled. An invalid
    /// receipt refuses the whole call ([`InvalidInput::Receipt`](crate::engine::error::InvalidInput::Receipt)), nothing changed.
    pub async fn ack(&self, receipts: &[&str]) -> Result<Vec<Settled>> {
        let opened = self.open_all(receipts)?;
        let s = &self.s;
        let mut by_lane: HashMap<LaneId, Vec<usize>> = HashMap::new();
        for (i, r) in opened.iter().enumerate() {
            by_lane.entry(r.lane).or_default().push(i);
        }
        let mut out = vec![Settled::LeaseLost; opened.len()];
        let mut lost = 0u64;
        for (lane, idx) in by_lane {
            // A receipt given twice is settled once.
            let mut seen = std::collections::HashSet::new();
            let idx: Vec<usize> = idx
                .into_iter()
                .filter(|&i| seen.insert(&opened[i]))
                .collect();
            let rs: Vec<&Receipt> = idx.iter().map(|&i| &opened[i]).collect();
            let fenced = self.fence(lane, &rs).await?;
            let entries: Vec<(String, u32)> = rs
                .iter()
                .zip(&fenced)
                .filter(|(_, f)| **f)
                .map(|(r, _)| (r.entry_id.clone(), r.attempt))
                .collect();
            lost += (rs.len() - entries.len()) as u64;
            if entries.is_empty() {
                continue;
            }
            if self.ack_lane(lane, &entries).await.is_none() {
                return Err(Error::Reply {
                    context: "acknowledging pulled deliveries",
                    detail: "the acknowledgement failed; the deliveries come due again when their lease runs out".into(),
                });
            }
            for (&i, f) in idx.iter().zip(&fenced) {
                if *f {
                    out[i] = Settled::Done;
                    handled_metric(s, "success");
                }
            }
        }
        // Their order keys' slots go to the next waiters (`key_concurrency`).
        if s.key_gate.is_some() {
            let done = opened
                .iter()
                .zip(&out)
                .filter(|(_, o)| **o == Settled::Done)
                .map(|(r, _)| key_gate::member(r.lane, &r.entry_id))
                .collect();
            key_gate::release_entries(s, done).await;
        }
        // Receipts given twice in one call: the copies after the first are not counted.
        for (i, r) in opened.iter().enumerate() {
            if out[i] == Settled::LeaseLost
                && let Some(j) = opened.iter().position(|o| o == r)
                && j < i
            {
                out[i] = out[j].clone();
            }
        }
        if lost > 0 {
            s.stats.late_acks.fetch_add(lost, Ordering::Relaxed);
            s.metrics().late_acks(lost);
        }
        Ok(out)
    }

    /// Settles one delivery that was not handled successfully: retried (with the group's
    /// backoff, or `after`) or dead-lettered with the error text, as a worker's failed
    /// handler is. [`Settled::LeaseLost`] (nothing changed) when its lease ran out and the
    /// entry was taken over or settled.
    pub async fn nack(&self, receipt: &str, how: Nack) -> Result<Settled> {
        let r = self.open_all(&[receipt])?.remove(0);
        if let Nack::Retry {
            after: Some(after), ..
        } = &how
            && *after > MAX_LEASE
        {
            return Err(bad_option(
                "retry_in",
                format!("{after:?} is over {MAX_LEASE:?}"),
            ));
        }
        let s = &self.s;
        if !self.fence(r.lane, &[&r]).await?[0] {
            return Ok(Settled::LeaseLost);
        }
        let keys = &s.lanes[r.lane.index()];
        let d = Delivery {
            queue: s.queue.as_str().to_owned(),
            group: s.group.clone(),
            id: String::new(),
            payload: serde_json::Value::Null,
            payload_text: String::new(),
            due_at_ms: 0,
            enqueued_at_ms: None,
            dispatched_at_ms: 0,
            entry_id: r.entry_id.clone(),
            shard: keys.shard,
            priority: keys.level,
            attempt: r.attempt,
            flag: None,
            trace: None,
            tags: Vec::new(),
            key: None,
        };
        let (done, retry_at) = match how {
            Nack::Retry { after, error } if r.attempt < s.opts.max_attempts => {
                let delay = after.unwrap_or_else(|| s.opts.backoff.delay(r.attempt));
                let at = s.client.now_ms() + ms(delay);
                (settle_retry(s, &d, &error, delay).await, Some(at))
            }
            Nack::Retry { error, .. } | Nack::Dead { error } => {
                (settle_dead(s, &d, &error, false).await, None)
            }
        };
        if done && s.key_gate.is_some() {
            let member = key_gate::member(r.lane, &r.entry_id);
            match retry_at {
                Some(at) => key_gate::entry_retried(s, member, at).await,
                None => key_gate::release_entries(s, vec![member]).await,
            }
        }
        if !done {
            return Err(Error::Reply {
                context: "settling a pulled delivery",
                detail: "the retry or dead letter could not be written; the delivery comes due again when its lease runs out".into(),
            });
        }
        Ok(Settled::Done)
    }

    /// Extends the leases of `receipts` to `lease` from now: each answers with its new
    /// receipt, or [`Extended::LeaseLost`] when its lease ran out and the entry was taken
    /// over or settled.
    pub async fn extend(&self, receipts: &[&str], lease: Duration) -> Result<Vec<Extended>> {
        check_lease(lease)?;
        let opened = self.open_all(receipts)?;
        // Each distinct receipt once, by lane.
        let mut by_lane: HashMap<LaneId, Vec<(String, i64)>> = HashMap::new();
        for r in &opened {
            let held = by_lane.entry(r.lane).or_default();
            let pair = (r.entry_id.clone(), r.lease_until);
            if !held.contains(&pair) {
                held.push(pair);
            }
        }
        let all: Vec<(String, i64)> = by_lane.values().flatten().cloned().collect();
        let until = fresh_end(self.s.client.now_ms() + ms(lease), &all);
        let mut extended: std::collections::HashSet<(LaneId, String, i64)> = Default::default();
        for (lane, held) in by_lane {
            let moved = self.cas_each(lane, until, &held).await?;
            for ((id, l), m) in held.into_iter().zip(moved) {
                if m {
                    extended.insert((lane, id, l));
                }
            }
        }
        if self.s.key_gate.is_some() {
            let members = extended
                .iter()
                .map(|(lane, id, _)| key_gate::member(*lane, id))
                .collect();
            key_gate::extend_entries(&self.s, members, until).await;
        }
        Ok(opened
            .into_iter()
            .map(|r| {
                if extended.contains(&(r.lane, r.entry_id.clone(), r.lease_until)) {
                    Extended::Receipt(self.signer.sign(&Receipt {
                        lease_until: until,
                        ..r
                    }))
                } else {
                    Extended::LeaseLost
                }
            })
            .collect())
    }
}

/// `wanted`, or the next millisecond after it that no pair of `held` has as its lease end:
/// a lease moved by compare-and-set always gets a value no other receipt of it carries.
fn fresh_end(wanted: i64, held: &[(String, i64)]) -> i64 {
    let mut until = wanted;
    while held.iter().any(|(_, l)| *l == until) {
        until += 1;
    }
    until
}
