//! Readers: take new entries (`read.lua`, leased atomically) and wait for more with a
//! blocking `XREAD` on a connection of their own.

use super::block::wait_for_new;
use super::entry::{Taken, ensure_groups, is_nogroup, to_taken};
use super::plan::{LaneOutcome, LanePlan};
use super::settle::{AckSender, spawn_process};
use super::{Handler, Shared};
use crate::engine::conn::Conn;
use crate::engine::duration::ms;
use crate::engine::error::{Error, Result};
use crate::engine::flow::{PAUSE_REFRESH, refund_permits, take_permits as take_rate};
use crate::engine::keys::ShardKeys;
use crate::engine::priority::PriorityMode;
use crate::engine::reply::entries_of;
use crate::engine::retry::{Pacer, RetryPolicy, until_ok};
use crate::engine::scripts;
use crate::engine::telemetry;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Takes and handles new entries of `lanes` until `cancel`; returns the handler tasks still
/// running (shutdown waits for them).
pub(super) async fn reader_loop<H: Handler>(
    s: Arc<Shared<H>>,
    lanes: Vec<ShardKeys>,
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
    let mut r = Reader::new(&s, &lanes, conn);
    // A queue of a MultiWorker: whether this reader told the gate it has a backlog (every
    // reader starts so).
    let mut backlog = super::multi::Backlog::new(&s.gate);
    while !cancel.is_cancelled() {
        while tasks.try_join_next().is_some() {}
        if r.plan.to_read.is_empty() {
            backlog.set(false);
            r.wait(&cancel).await;
            continue;
        }
        backlog.set(true);
        if !backlog.turn(&cancel).await {
            continue;
        }
        if !may_take(&s, &cancel).await {
            backlog.set(false);
            continue;
        }
        let Some(mut permits) = take_permits(&s, &cancel).await else {
            break;
        };
        if !limit(&s, &mut permits, &cancel).await {
            backlog.set(false);
            continue;
        }
        let mut taken = r.read(permits.len(), &cancel).await;
        super::key_gate::sequence_order(&s, &mut taken);
        backlog.took(taken.len());
        if std::mem::take(&mut r.paused) {
            backlog.set(false);
            // read.lua found the group paused: wait for a resume (or look again later).
            if let Some(rl) = &s.opts.rate_limit
                && let Err(e) =
                    refund_permits(&s.client, &s.queue, &s.group, rl, permits.len()).await
            {
                tracing::warn!(error = %e, "refunding rate-limit permits failed");
            }
            drop(permits);
            paused_wait(&s, &cancel).await;
            r.plan.to_read = r.plan.all();
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
        if std::mem::take(&mut r.gone) {
            // The queue was deleted: read nothing, hold nothing back, until it is created
            // again; then read its new streams from the start.
            drop(permits);
            backlog.set(false);
            if super::wait_for_queue(&s, &cancel).await {
                r.restart();
            }
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

/// One reader's view of its lanes (every priority lane of its shards).
struct Reader<'a, H> {
    s: &'a Shared<H>,
    lanes: &'a [ShardKeys],
    /// The dedicated connection for the blocking wait.
    conn: Conn,
    /// Which lanes to read, with how much of the budget each ([`LanePlan`], pure).
    plan: LanePlan,
    /// Each lane's last seen stream id, for the blocking wait.
    last_ids: Vec<String>,
    /// The last read found the group paused.
    paused: bool,
    /// The last read found the queue deleted.
    gone: bool,
    /// When an idle wait last ended in a read of every lane.
    full_read_at: tokio::time::Instant,
    /// The registry's version at the last idle wait's end (one `GET`): a change makes the
    /// reader read every lane (its queue or group may be gone).
    version: Option<i64>,
    pacer: Pacer,
}

/// How often an idle reader reads every lane although its blocking wait reported nothing
/// new: a net (the wait follows each lane's last id, so it misses no entry), paid once per
/// 30 s per lane instead of once per `block`.
const IDLE_FULL_READ: Duration = Duration::from_secs(30);

impl<'a, H: Handler> Reader<'a, H> {
    fn new(s: &'a Shared<H>, lanes: &'a [ShardKeys], conn: Conn) -> Self {
        Reader {
            s,
            lanes,
            conn,
            plan: LanePlan::new(lanes.iter().map(|k| (k.shard as usize, k.level))),
            last_ids: vec!["0-0".to_owned(); lanes.len()],
            paused: false,
            gone: false,
            full_read_at: tokio::time::Instant::now(),
            version: None,
            pacer: Pacer::new(RetryPolicy::LOOP),
        }
    }

    /// Forgets what it knew of the lanes (their queue was deleted and created again): reads
    /// every lane, and waits for entries from the start of each stream.
    fn restart(&mut self) {
        self.plan.restart();
        self.last_ids = vec!["0-0".to_owned(); self.lanes.len()];
        self.pacer.reset();
    }

    /// Nothing known to be waiting: block until a lane has a new entry. When the block time
    /// passes with none, block again, unless the registry changed (one `GET`) or
    /// [`IDLE_FULL_READ`] passed: then look at every lane once (`XREAD` after the last ids
    /// seen misses no entry, so this is for deleted queues and groups, and a net).
    async fn wait(&mut self, cancel: &CancellationToken) {
        let waited = tokio::select! {
            r = wait_for_new(self.s, self.lanes, &mut self.conn, &self.last_ids) => r,
            // Leaves a reply in flight on the dedicated connection, which is dropped with
            // the reader.
            _ = cancel.cancelled() => return,
        };
        match waited {
            Ok(ready) if ready.is_empty() => {
                // A queue or group deleted (or changed) meanwhile: the registry's version
                // moved, and a read of every lane finds out at once.
                let version = self.s.client.registry_version().await.ok();
                let changed = version.is_none() || version != self.version;
                self.version = version;
                if changed || self.full_read_at.elapsed() >= IDLE_FULL_READ {
                    self.full_read_at = tokio::time::Instant::now();
                    self.plan.to_read = self.plan.all();
                }
            }
            Ok(ready) => self.plan.to_read = ready,
            Err(e) => {
                tracing::warn!(queue = %self.s.queue, error = %e, "blocking read failed");
                self.pacer.wait(Some(cancel)).await;
                self.plan.to_read = self.plan.all();
            }
        }
    }

    /// Reads up to `budget` entries in all from the lanes that may have some, as the plan
    /// asks ([`LanePlan::begin`]: strict or weighted). A lane whose read fails is read again
    /// later; what other lanes returned is kept.
    async fn read(&mut self, budget: usize, cancel: &CancellationToken) -> Vec<Taken> {
        let s = self.s;
        let weights = match &s.opts.priority {
            PriorityMode::Strict => None,
            PriorityMode::Weighted(w) => Some(w.as_slice()),
        };
        let mut pass = self.plan.begin(budget, weights);
        let mut taken = Vec::new();
        let mut failed = None;
        while let Some(ask) = pass.next(&mut self.plan) {
            let results = take_new(self.s, self.lanes, &ask.lanes, ask.per_lane).await;
            let mut outcomes = Vec::with_capacity(results.len());
            for (&i, r) in ask.lanes.iter().zip(results) {
                outcomes.push(match r {
                    Ok(t) if t.missing => LaneOutcome::Missing { lanes: t.lanes },
                    Ok(t) if t.paused => LaneOutcome::Paused { lanes: t.lanes },
                    Ok(t) => {
                        self.last_ids[i] = t.last_id;
                        taken.extend(t.taken);
                        LaneOutcome::Read {
                            got: t.got,
                            lanes: t.lanes,
                        }
                    }
                    Err(e) => {
                        failed = Some(e);
                        LaneOutcome::Failed
                    }
                });
            }
            pass.record(&mut self.plan, &ask, &outcomes);
        }
        self.paused |= pass.paused();
        pass.finish(&mut self.plan);
        match failed {
            None => self.pacer.reset(),
            Some(e) => self.read_failed(e, taken.is_empty(), cancel).await,
        }
        taken
    }

    async fn read_failed(&mut self, e: Error, nothing_read: bool, cancel: &CancellationToken) {
        if is_nogroup(&e) && self.s.queue_replaced().await {
            // The queue was deleted (and maybe created again): the reader loop waits
            // (holding no permit and no place at a MultiWorker's gate) until it exists,
            // then joins the new queue's group.
            self.gone = true;
            return;
        }
        if is_nogroup(&e) {
            // Created again only where the stream is gone too; a group deleted on purpose
            // (or a deleted queue) stops this worker instead of redelivering everything.
            match ensure_groups(
                &self.s.client,
                &self.s.queue,
                self.lanes,
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
                Err(Error::QueueNotFound { .. }) => {
                    // The queue was deleted: the reader loop waits (holding no permit and
                    // no place at a MultiWorker's gate) until it exists again.
                    self.gone = true;
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

/// One lane's read.
struct LaneRead {
    taken: Vec<Taken>,
    /// How many entries the stream returned.
    got: usize,
    last_id: String,
    paused: bool,
    /// The shard's lanes in use (see `read.lua`).
    lanes: u8,
    /// The lane's stream does not exist (a `high` or `low` lane not used yet).
    missing: bool,
}

/// Takes up to `count` new entries from each chosen lane (leased atomically), the reads in
/// flight together on the multiplexed connection.
async fn take_new<H: Handler>(
    s: &Shared<H>,
    lanes: &[ShardKeys],
    chosen: &[usize],
    count: usize,
) -> Vec<Result<LaneRead>> {
    let lease_until = s.client.now_ms() + ms(s.opts.visibility_timeout);
    futures_util::future::join_all(chosen.iter().map(|&i| {
        let mut conn = s.client.connection();
        let keys = &lanes[i];
        async move {
            let r =
                scripts::read(&mut conn, keys, &s.group, &s.consumer, count, lease_until).await?;
            if r.paused || r.missing {
                return Ok(LaneRead {
                    taken: Vec::new(),
                    got: 0,
                    last_id: r.last_id,
                    paused: r.paused,
                    lanes: r.lanes,
                    missing: r.missing,
                });
            }
            let entries = entries_of(r.entries)?;
            let got = entries.len();
            let taken = entries
                .into_iter()
                .map(|(entry_id, fields)| to_taken(s, keys, &entry_id, fields, 1, lease_until))
                .collect();
            Ok(LaneRead {
                taken,
                got,
                last_id: r.last_id,
                paused: false,
                lanes: r.lanes,
                missing: false,
            })
        }
    }))
    .await
}
