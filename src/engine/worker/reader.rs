//! Readers: take new entries (`read.lua`, leased atomically) and wait for more with a
//! blocking `XREAD` on a connection of their own.

use super::entry::{Taken, as_string, ensure_groups, entries_of, is_nogroup, ms, to_taken};
use super::settle::{AckSender, spawn_process};
use super::{Handler, Shared};
use crate::engine::conn::Conn;
use crate::engine::flow::{PAUSE_REFRESH, refund_permits, take_permits as take_rate};
use crate::engine::keys::ShardKeys;
use crate::engine::retry::{Pacer, RetryPolicy, until_ok};
use crate::engine::scripts;
use crate::engine::telemetry;
use crate::error::{Error, RedisContext, Result};
use redis::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Takes and handles new entries of `shards` until `cancel`; returns the handler tasks still
/// running (shutdown waits for them).
pub(super) async fn reader_loop<H: Handler>(
    s: Arc<Shared<H>>,
    shards: Vec<ShardKeys>,
    ack_tx: AckSender,
    cancel: CancellationToken,
) -> JoinSet<()> {
    let mut tasks = JoinSet::new();
    let reader_timeout = s.opts.block + Duration::from_secs(10);
    let opened = until_ok("opening the reader connection", &cancel, || {
        s.client.dedicated_connection(reader_timeout)
    })
    .await;
    let Ok(Some(conn)) = opened else {
        return tasks;
    };
    let mut r = Reader::new(&s, &shards, conn);
    while !cancel.is_cancelled() {
        while tasks.try_join_next().is_some() {}
        if r.to_read.is_empty() {
            r.wait(&cancel).await;
            continue;
        }
        if !may_take(&s, &cancel).await {
            continue;
        }
        let Some(mut permits) = take_permits(&s, &cancel).await else {
            break;
        };
        if !limit(&s, &mut permits, &cancel).await {
            continue;
        }
        let taken = r.read(permits.len(), &cancel).await;
        if std::mem::take(&mut r.paused) {
            // read.lua found the group paused: wait for a resume (or look again later).
            if let Some(rl) = &s.opts.rate_limit
                && let Err(e) =
                    refund_permits(&s.client, &s.queue, &s.group, rl, permits.len()).await
            {
                tracing::warn!(error = %e, "refunding rate-limit permits failed");
            }
            drop(permits);
            paused_wait(&s, &cancel).await;
            r.to_read = r.all();
            continue;
        }

        for t in taken {
            // A read never returns more entries than it was given permits for.
            let Some(permit) = permits.pop() else { break };
            spawn_process(&mut tasks, &s, &ack_tx, t, permit);
        }
        // Rate-limit permits taken for entries the read did not return go back.
        if let Some(rl) = &s.opts.rate_limit
            && !permits.is_empty()
            && let Err(e) = refund_permits(&s.client, &s.queue, &s.group, rl, permits.len()).await
        {
            tracing::warn!(queue = %s.queue, group = %s.group, error = %e, "refunding rate-limit permits failed");
        }
    }
    tasks
}

/// Waits (cancellably) for one place among the entries this worker may hold, then takes as
/// many more as are free, up to one read's worth.
async fn take_permits<H>(
    s: &Shared<H>,
    cancel: &CancellationToken,
) -> Option<Vec<OwnedSemaphorePermit>> {
    let first = tokio::select! {
        p = s.taken.clone().acquire_owned() => p.ok()?,
        _ = cancel.cancelled() => return None,
    };
    let mut permits = vec![first];
    while permits.len() < s.opts.taken_limit().min(MAX_READ) {
        match s.taken.clone().try_acquire_owned() {
            Ok(p) => permits.push(p),
            Err(_) => break,
        }
    }
    Some(permits)
}

/// Whether the group may take entries now: not while it is paused (waits a refresh
/// interval then) or its pause flag cannot be read.
pub(super) async fn may_take<H>(s: &Shared<H>, cancel: &CancellationToken) -> bool {
    match s.pause.paused(&s.client).await {
        Ok(false) => true,
        other => {
            if let Err(e) = other {
                tracing::warn!(queue = %s.queue, group = %s.group, error = %e, "reading the pause flag failed");
            }
            paused_wait(s, cancel).await;
            false
        }
    }
}

/// Waits while the group is paused: until this process resumes it, [`PAUSE_REFRESH`]
/// passes (another process may have), or `cancel`.
async fn paused_wait<H>(s: &Shared<H>, cancel: &CancellationToken) {
    let wake = s.client.wake().get(s.queue.as_str());
    tokio::select! {
        _ = tokio::time::sleep(PAUSE_REFRESH) => {}
        _ = wake.resume.notified() => s.pause.invalidate(),
        _ = cancel.cancelled() => {}
    }
}

/// Applies the group's rate limit to `permits`: keeps as many as the limiter grants (the
/// rest are released). With none granted, waits until one is free and returns false.
pub(super) async fn limit<H, P>(
    s: &Shared<H>,
    permits: &mut Vec<P>,
    cancel: &CancellationToken,
) -> bool {
    let Some(rl) = &s.opts.rate_limit else {
        return true;
    };
    let wait = match take_rate(&s.client, &s.queue, &s.group, rl, permits.len()).await {
        Ok((granted, _)) if granted > 0 => {
            permits.truncate(granted);
            return true;
        }
        Ok((_, wait)) => {
            telemetry::rate_limited(s.queue.as_str(), &s.group);
            wait.clamp(Duration::from_millis(1), Duration::from_secs(1))
        }
        Err(e) => {
            tracing::warn!(queue = %s.queue, group = %s.group, error = %e, "rate limiter failed");
            Duration::from_millis(100)
        }
    };
    permits.clear();
    tokio::select! {
        _ = tokio::time::sleep(wait) => {}
        _ = cancel.cancelled() => {}
    }
    false
}

/// Most entries one read takes.
const MAX_READ: usize = 1000;

/// One reader's view of its shards.
struct Reader<'a, H> {
    s: &'a Shared<H>,
    shards: &'a [ShardKeys],
    /// The dedicated connection for the blocking wait.
    conn: Conn,
    /// Which shards to read next (indexes into `shards`): all at first; then only those the
    /// blocking wait reported new entries in, or whose last read came back full.
    to_read: Vec<usize>,
    /// Each shard's last seen stream id, for the blocking wait.
    last_ids: Vec<String>,
    /// Where the next read starts among `to_read`, so a small budget rotates over shards.
    rotate: usize,
    /// The last read found the group paused.
    paused: bool,
    pacer: Pacer,
}

impl<'a, H: Handler> Reader<'a, H> {
    fn new(s: &'a Shared<H>, shards: &'a [ShardKeys], conn: Conn) -> Self {
        Reader {
            s,
            shards,
            conn,
            to_read: (0..shards.len()).collect(),
            last_ids: vec!["0-0".to_owned(); shards.len()],
            rotate: 0,
            paused: false,
            pacer: Pacer::new(RetryPolicy::LOOP),
        }
    }

    fn all(&self) -> Vec<usize> {
        (0..self.shards.len()).collect()
    }

    /// Nothing known to be waiting: block until a shard has a new entry (or the block time
    /// passes: then look at every shard once, e.g. after a restart of Redis).
    async fn wait(&mut self, cancel: &CancellationToken) {
        let waited = tokio::select! {
            r = wait_for_new(self.s, self.shards, &mut self.conn, &self.last_ids) => r,
            // Leaves a reply in flight on the dedicated connection, which is dropped with
            // the reader.
            _ = cancel.cancelled() => return,
        };
        match waited {
            Ok(ready) if ready.is_empty() => self.to_read = self.all(),
            Ok(ready) => self.to_read = ready,
            Err(e) => {
                tracing::warn!(queue = %self.s.queue, error = %e, "blocking read failed");
                self.pacer.wait(Some(cancel)).await;
                self.to_read = self.all();
            }
        }
    }

    /// Reads the shards in `to_read` with `budget` entries in all (split between them, so
    /// the reader never holds more than its budget), all in flight together. A shard whose
    /// read fails is read again later; the entries other shards returned are kept.
    async fn read(&mut self, budget: usize, cancel: &CancellationToken) -> Vec<Taken> {
        let n = self.to_read.len().min(budget).max(1);
        let start = self.rotate % self.to_read.len();
        self.rotate = self.rotate.wrapping_add(1);
        let chosen: Vec<usize> = (0..n)
            .map(|k| self.to_read[(start + k) % self.to_read.len()])
            .collect();
        let per_shard = budget / n;
        let results = take_new(self.s, self.shards, &chosen, per_shard).await;
        let mut again: Vec<usize> = self
            .to_read
            .iter()
            .copied()
            .filter(|i| !chosen.contains(i))
            .collect();
        let mut out = Vec::new();
        let mut failed = None;
        for (&i, r) in chosen.iter().zip(results) {
            match r {
                Ok((_, _, _, true)) => self.paused = true,
                Ok((taken, got, last, false)) => {
                    self.last_ids[i] = last;
                    if got >= per_shard {
                        again.push(i); // maybe more: read it again at once
                    }
                    out.extend(taken);
                }
                Err(e) => {
                    again.push(i);
                    failed = Some(e);
                }
            }
        }
        self.to_read = again;
        match failed {
            None => self.pacer.reset(),
            Some(e) => self.read_failed(e, out.is_empty(), cancel).await,
        }
        out
    }

    async fn read_failed(&mut self, e: Error, nothing_read: bool, cancel: &CancellationToken) {
        if is_nogroup(&e) {
            // Created again only where the stream is gone too; a group deleted on purpose
            // (or a deleted queue) stops this worker instead of redelivering everything.
            match ensure_groups(
                &self.s.client,
                &self.s.queue,
                self.shards,
                &self.s.group,
                true,
            )
            .await
            {
                Ok(()) => {
                    tracing::warn!(queue = %self.s.queue, group = %self.s.group, "consumer group vanished with its stream; created again")
                }
                Err(e @ Error::GroupDeleted { .. }) => {
                    tracing::error!(queue = %self.s.queue, group = %self.s.group, error = %e, "the worker stops");
                    telemetry::worker_stopped(self.s.queue.as_str(), &self.s.group);
                    cancel.cancel();
                    return;
                }
                Err(e) => tracing::warn!(queue = %self.s.queue, group = %self.s.group, error = %e,
                    retry_in = ?self.pacer.next_delay(), "recreating the group failed"),
            }
        } else {
            tracing::warn!(queue = %self.s.queue, group = %self.s.group, error = %e,
                retry_in = ?self.pacer.next_delay(), "read failed");
        }
        if nothing_read {
            self.pacer.wait(Some(cancel)).await;
        }
    }
}

/// Takes up to `count` new entries from each chosen shard (leased atomically), the reads in
/// flight together on the multiplexed connection; per shard, the entries, how many the
/// stream returned, and the stream's last id.
async fn take_new<H: Handler>(
    s: &Shared<H>,
    shards: &[ShardKeys],
    chosen: &[usize],
    count: usize,
) -> Vec<Result<(Vec<Taken>, usize, String, bool)>> {
    let lease_until = s.client.now_ms() + ms(s.opts.visibility_timeout);
    futures_util::future::join_all(chosen.iter().map(|&i| {
        let mut conn = s.client.connection();
        let keys = &shards[i];
        async move {
            let (entries, last, paused) =
                scripts::read(&mut conn, keys, &s.group, &s.consumer, count, lease_until).await?;
            if paused == 1 {
                return Ok((Vec::new(), 0, last, true));
            }
            let entries = entries_of(entries)?;
            let got = entries.len();
            let taken = entries
                .into_iter()
                .map(|(entry_id, fields)| {
                    to_taken(s, keys.shard, &entry_id, fields, 1, lease_until)
                })
                .collect();
            Ok((taken, got, last, false))
        }
    }))
    .await
}

/// Blocks (dedicated connection) until some shard's stream has an entry after `last_ids`, or
/// the block time passes; returns the indexes of the shards with new entries (empty on
/// timeout). Takes nothing: `read.lua` does.
pub(super) async fn wait_for_new<H: Handler>(
    s: &Shared<H>,
    shards: &[ShardKeys],
    reader: &mut Conn,
    last_ids: &[String],
) -> Result<Vec<usize>> {
    let mut cmd = redis::cmd("XREAD");
    cmd.arg("COUNT")
        .arg(1)
        .arg("BLOCK")
        .arg(ms(s.opts.block).max(1))
        .arg("STREAMS");
    for k in shards {
        cmd.arg(&k.stream);
    }
    cmd.arg(last_ids);
    let reply: Value = cmd
        .query_async(reader)
        .await
        .ctx("waiting for new entries (XREAD BLOCK)")?;
    let streams: Vec<(Value, Value)> = match reply {
        Value::Array(items) => items
            .into_iter()
            .filter_map(|st| match st {
                Value::Array(mut kv) if kv.len() == 2 => {
                    let v = kv.pop().unwrap_or(Value::Nil);
                    let k = kv.pop().unwrap_or(Value::Nil);
                    Some((k, v))
                }
                _ => None,
            })
            .collect(),
        Value::Map(kv) => kv,
        _ => Vec::new(),
    };
    Ok(streams
        .iter()
        .filter_map(|(k, _)| as_string(k))
        .filter_map(|key| shards.iter().position(|k| k.stream == key))
        .collect())
}
