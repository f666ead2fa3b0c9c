//! Durable (replicated) schedules: the enqueue calls and a `WAIT` as one pipeline on one
//! of a few dedicated connections, the whole write bounded in time (see
//! [`Client::enqueue_replicated`]).

use super::Client;
use super::replicas::{ConnFigure, ReplicaCounts};
use crate::engine::conn::Conn;
use crate::engine::error::{Error, RedisContext, Result};
use crate::engine::keys::ShardKeys;
use crate::engine::redact;
use crate::engine::scripts::Enqueued;
use crate::engine::scripts::{self, EnqueueArg};
use futures_util::future::join_all;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

impl Client {
    /// Durable writes: each node's enqueue calls and a `WAIT` after them go out as **one
    /// pipeline** on a durable connection, so the `WAIT` always runs on the connection that
    /// made the writes. A connection lost anywhere in between (a reset, a `CLIENT KILL`, a
    /// timeout) fails the whole pipeline and is reported as [`Error::NotReplicated`], never
    /// as success: the writes may have reached the leader and may still fire, and repeating
    /// them is safe. No lock is held: a pipeline is sent contiguously, and a `WAIT` that
    /// also covers another batch's writes only waits for more.
    ///
    /// A `WAIT` blocks its connection, so the writes after it on the same connection wait
    /// for it: each write takes the least busy of [`DURABLE_CONNECTIONS`] connections, and
    /// concurrent writes do not queue behind one another's `WAIT` (which lasts its whole
    /// timeout when no replica follows, e.g. just after a failover).
    ///
    /// The whole write, (re)connecting included, is bounded by [`durable_bound`] (the
    /// client's response timeout plus the `WAIT` timeout), not by the durable connection's
    /// long reply timeout, so a failover never leaves it hanging. A write that runs out of
    /// it is [`Error::NotReplicated`] too (or, when it never got a connection, a
    /// `MASTERDOWN` error: nothing was sent). A connection that broke or ran out of time is
    /// dropped, so the next write on its slot opens a new one to the current master (on a
    /// Sentinel target: resolved through the sentinels again) instead of reusing a dead or
    /// blocked one.
    pub(super) async fn enqueue_replicated(
        &self,
        calls: &[(ShardKeys, Vec<usize>)],
        epoch: &str,
        args: &[Vec<EnqueueArg<'_>>],
        if_absent: bool,
        now: i64,
        wait: Wait,
    ) -> Vec<Result<Vec<Enqueued>>> {
        let bound = durable_bound(self.inner.opts.response_timeout, wait);
        let deadline = tokio::time::Instant::now() + bound;
        let (slot, cell, durable, wait) = match self.durable_start(wait, deadline).await {
            Ok(started) => started,
            Err(e) => return calls.iter().map(|_| Err(e.duplicate())).collect(),
        };
        let conn = durable.conn.clone();
        // One pipeline per node: on a cluster each shard is its own slot, on one server
        // every call goes together.
        let mut groups: Vec<Vec<usize>> = Vec::new();
        if self.is_cluster() {
            let mut by_shard: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
            for (i, (keys, _)) in calls.iter().enumerate() {
                by_shard.entry(keys.shard).or_default().push(i);
            }
            groups.extend(by_shard.into_values());
        } else {
            groups.push((0..calls.len()).collect());
        }
        let done = join_all(groups.iter().map(|g| {
            let invs: Vec<_> = g
                .iter()
                .map(|&i| scripts::enqueue_invocation(&calls[i].0, epoch, if_absent, now, &args[i]))
                .collect();
            let sizes: Vec<usize> = g.iter().map(|&i| args[i].len()).collect();
            let conn = conn.clone();
            async move {
                match tokio::time::timeout_at(deadline, durable_pipeline(conn, invs, sizes, wait))
                    .await
                {
                    Ok(piped) => piped,
                    // Sent, or waiting to be: it may have been written.
                    Err(_) => Piped {
                        results: g.iter().map(|_| Err(wait.not_replicated(0))).collect(),
                        broken: true,
                    },
                }
            }
        }))
        .await;
        if done.iter().any(|p| p.broken) {
            tracing::warn!(
                bound_ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX),
                "a durable write lost its connection or ran out of time: the connection is replaced"
            );
            slot.discard(&cell);
        }
        let mut out: Vec<Option<Result<Vec<Enqueued>>>> = calls.iter().map(|_| None).collect();
        for (g, piped) in groups.iter().zip(done) {
            for (&i, r) in g.iter().zip(piped.results) {
                out[i] = Some(r);
            }
        }
        out.into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(Error::Reply {
                        context: "scheduling orders",
                        detail: "a call got no result".into(),
                    })
                })
            })
            .collect()
    }

    /// The start of a durable write: a durable slot, its connection (opened within
    /// `deadline`) and the `WAIT` to make, with every replica's count learned
    /// ([`ConnFigure::replicas`]; on a cluster, the configured minimum per shard). Nothing
    /// has been written when this fails: the error says so (`MASTERDOWN`), or is the
    /// server's own refusal (e.g. `NOPERM` for `INFO`).
    pub(super) async fn durable_start(
        &self,
        wait: Wait,
        deadline: tokio::time::Instant,
    ) -> Result<(DurableLease<'_>, DurableCell, Arc<DurableConn>, Wait)> {
        let bound = durable_bound(self.inner.opts.response_timeout, wait);
        let slot = self.inner.durable_conns.lease();
        let (cell, durable) =
            match tokio::time::timeout_at(deadline, self.durable_connection(&slot)).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(no_connection_within(bound)),
            };
        if !wait.every || self.is_cluster() {
            return Ok((slot, cell, durable, wait));
        }
        let learning = durable.figure.replicas(
            &self.inner.durable_conns.counts,
            &durable.conn,
            wait.replicas,
        );
        match tokio::time::timeout_at(deadline, learning).await {
            Ok(Ok(n)) => {
                let wait = Wait {
                    replicas: n,
                    ..wait
                };
                Ok((slot, cell, durable, wait))
            }
            Ok(Err(e)) => {
                slot.discard(&cell);
                Err(if e.is_transient() {
                    nothing_sent(&e.to_string())
                } else {
                    e
                })
            }
            Err(_) => {
                slot.discard(&cell);
                Err(no_connection_within(bound))
            }
        }
    }

    /// The durable connection of `slot`, and the cell it came from (to
    /// [`DurableLease::discard`] it). Opened on first use (and after a discard), with
    /// `enqueue.lua` loaded, so a first pipeline is not spent on `NOSCRIPT` (whose `WAIT`
    /// would block for its whole timeout when no replica follows): its `WAIT`s block it, so
    /// only durable writes use it. The writes that find the slot empty share one opening.
    async fn durable_connection(
        &self,
        slot: &DurableLease<'_>,
    ) -> Result<(DurableCell, Arc<DurableConn>)> {
        let cell = slot.cell();
        let conn = cell
            .get_or_try_init(|| async {
                let mut conn = self.dedicated_connection(DURABLE_RESPONSE_TIMEOUT).await?;
                scripts::load_enqueue(&mut conn).await?;
                Ok::<_, Error>(Arc::new(DurableConn {
                    conn,
                    figure: ConnFigure::default(),
                }))
            })
            .await?
            .clone();
        Ok((cell, conn))
    }
}

/// How many durable connections a client opens at most (one more only while every open one
/// is busy): concurrent durable writes each get their own, up to this many, so that their
/// `WAIT`s run side by side; beyond it they share the least busy.
const DURABLE_CONNECTIONS: usize = 8;

/// One opening of a durable connection (empty until opened).
pub(super) type DurableCell = Arc<tokio::sync::OnceCell<Arc<DurableConn>>>;

/// A durable connection, and how many replicas its master wants confirmations from
/// ([`Durability::EveryReplica`](super::Durability::EveryReplica)).
pub(super) struct DurableConn {
    pub(super) conn: Conn,
    figure: ConnFigure,
}

/// The durable connections of a client: [`DURABLE_CONNECTIONS`] slots, each opened on first
/// use and replaced by a fresh (unopened) cell when a write on it broke or ran out of time.
/// Mutexes are held only to read or swap a cell, never across a Redis call.
#[derive(Default)]
pub(super) struct DurableConns {
    slots: [DurableSlot; DURABLE_CONNECTIONS],
    /// What the slots learned of each master's replicas (shared, so that a connection
    /// opened after a promotion starts from what the others saw).
    counts: ReplicaCounts,
}

/// One durable connection's slot: its current cell and how many writes use it.
#[derive(Default)]
struct DurableSlot {
    current: Mutex<DurableCell>,
    busy: AtomicUsize,
}

impl DurableSlot {
    fn is_open(&self) -> bool {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .initialized()
    }
}

impl DurableConns {
    /// The slot for one write: the least busy, an open one before one still to open.
    fn lease(&self) -> DurableLease<'_> {
        let slot = self
            .slots
            .iter()
            .enumerate()
            .min_by_key(|(i, s)| (s.busy.load(Ordering::Acquire), !s.is_open(), *i))
            .map(|(_, s)| s)
            .unwrap_or(&self.slots[0]);
        slot.busy.fetch_add(1, Ordering::AcqRel);
        DurableLease { slot }
    }
}

/// A write's use of a durable slot (counted busy until dropped, also when the write is
/// cancelled).
pub(super) struct DurableLease<'a> {
    slot: &'a DurableSlot,
}

impl DurableLease<'_> {
    /// The slot's current cell.
    fn cell(&self) -> DurableCell {
        self.slot
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Drops the connection of `cell`, unless another write already replaced it: the next
    /// write on this slot opens a new one. Writes still running on it finish on it.
    pub(super) fn discard(&self, cell: &DurableCell) {
        let mut current = self.slot.current.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::ptr_eq(&current, cell) {
            *current = DurableCell::default();
        }
    }
}

impl Drop for DurableLease<'_> {
    fn drop(&mut self) {
        self.slot.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long a reply on the durable connection may take: the longest `WAIT` timeout
/// ([`MAX_WAIT`]) plus the writes before it. Each write is bounded more tightly by
/// [`durable_bound`].
const DURABLE_RESPONSE_TIMEOUT: Duration = Duration::from_secs(70);

/// How long one durable write may take in all, connecting, the writes and the `WAIT`
/// included: the client's response timeout plus the `WAIT` timeout.
pub(super) fn durable_bound(response_timeout: Duration, wait: Wait) -> Duration {
    response_timeout.saturating_add(wait.timeout.min(MAX_WAIT))
}

/// The error of a durable write that got no connection within `bound`: nothing was sent
/// (`MASTERDOWN`, which callers treat as "not written, try again").
fn no_connection_within(bound: Duration) -> Error {
    Error::Redis {
        context: "opening the durable connection",
        source: redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::MasterDown),
            "no connection to the master in time; nothing was sent",
            format!("within {bound:?} (the response timeout plus the WAIT timeout)"),
        )),
    }
}

/// The error of a durable write whose master could not say how many replicas it has (a
/// connection that broke on `INFO replication`): nothing was sent (`MASTERDOWN`, "not
/// written, try again").
fn nothing_sent(why: &str) -> Error {
    Error::Redis {
        context: "learning the master's replicas",
        source: redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::MasterDown),
            "the master's replicas could not be learned; nothing was sent",
            redact::text(why),
        )),
    }
}

/// A `WAIT`: how many replicas must confirm, within how long.
#[derive(Debug, Clone, Copy)]
pub(super) struct Wait {
    /// How many (with `every`: at least how many).
    pub(super) replicas: u32,
    /// Every replica the master has had lately ([`ConnFigure::replicas`]).
    pub(super) every: bool,
    pub(super) timeout: Duration,
}

impl Wait {
    pub(super) fn not_replicated(&self, acked: u32) -> Error {
        Error::NotReplicated {
            acked,
            wanted: self.replicas,
            timeout: self.timeout,
        }
    }
}

/// What [`durable_pipeline`] did: one result per invocation, and whether the connection
/// failed under it (then it is not used again).
struct Piped {
    results: Vec<Result<Vec<Enqueued>>>,
    broken: bool,
}

/// Runs `invs` then `WAIT` as one pipeline on `conn`; one result per invocation. A
/// `NOSCRIPT` (Redis restarted, `SCRIPT FLUSH`) loads the script and sends the refused
/// calls again (nothing of them was written).
async fn durable_pipeline(
    mut conn: Conn,
    invs: Vec<redis::ScriptInvocation<'_>>,
    sizes: Vec<usize>,
    wait: Wait,
) -> Piped {
    let mut broken = false;
    let timeout_ms = u64::try_from(wait.timeout.min(MAX_WAIT).as_millis())
        .unwrap_or(1000)
        .max(1);
    let mut out: Vec<Option<Result<Vec<Enqueued>>>> = invs.iter().map(|_| None).collect();
    for round in 0..2 {
        let todo: Vec<usize> = (0..invs.len()).filter(|&i| out[i].is_none()).collect();
        if todo.is_empty() {
            break;
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for &i in &todo {
            pipe.invoke_script(&invs[i]);
        }
        pipe.cmd("WAIT").arg(wait.replicas).arg(timeout_ms);
        let replies: Vec<redis::RedisResult<redis::Value>> = match pipe.query_async(&mut conn).await
        {
            Ok(r) => r,
            // The connection broke somewhere between the writes and WAIT's reply.
            Err(e) => {
                tracing::warn!(
                    error = %redact::text(&e.to_string()),
                    "durable write lost its connection before WAIT answered"
                );
                for i in todo {
                    out[i] = Some(Err(wait.not_replicated(0)));
                }
                broken = true;
                break;
            }
        };
        let mut replies = replies.into_iter();
        let calls: Vec<_> = replies.by_ref().take(todo.len()).collect();
        let acked = match replies.next() {
            Some(Ok(v)) => redis::from_redis_value::<u32>(v).unwrap_or(0),
            _ => 0,
        };
        let mut noscript = false;
        for (&i, r) in todo.iter().zip(calls) {
            out[i] = match r {
                Err(e)
                    if round == 0
                        && e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    noscript = true;
                    None
                }
                Err(e) => Some(Err(e).ctx("scheduling orders (enqueue.lua)")),
                Ok(v) => Some(
                    redis::from_redis_value::<Vec<redis::Value>>(v)
                        .map_err(|e| Error::Reply {
                            context: "scheduling orders (enqueue.lua)",
                            detail: e.to_string(),
                        })
                        .and_then(|codes| scripts::enqueue_outcomes(codes, sizes[i]))
                        .and_then(|o| {
                            if acked < wait.replicas {
                                Err(wait.not_replicated(acked))
                            } else {
                                Ok(o)
                            }
                        }),
                ),
            };
        }
        if noscript && let Err(e) = scripts::load_enqueue(&mut conn).await {
            broken = true;
            for o in out.iter_mut().filter(|o| o.is_none()) {
                *o = Some(Err(e.duplicate()));
            }
        }
    }
    Piped {
        results: out
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(wait.not_replicated(0))))
            .collect(),
        broken,
    }
}

/// The longest `WAIT` a durable schedule makes.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::outcome::WriteOutcome;

    #[test]
    fn concurrent_durable_writes_take_separate_connections_and_give_them_back() {
        let conns = DurableConns::default();
        // Concurrent writes each take a slot of their own, up to the number of slots.
        let leases: Vec<DurableLease<'_>> =
            (0..DURABLE_CONNECTIONS).map(|_| conns.lease()).collect();
        for s in &conns.slots {
            assert_eq!(s.busy.load(Ordering::Acquire), 1);
        }
        // Beyond it they share the least busy.
        let extra = conns.lease();
        assert_eq!(conns.slots[0].busy.load(Ordering::Acquire), 2);
        drop(extra);
        drop(leases);
        for s in &conns.slots {
            assert_eq!(s.busy.load(Ordering::Acquire), 0);
        }
        // A discarded cell is replaced; discarding a cell already replaced changes nothing.
        let lease = conns.lease();
        let old = lease.cell();
        lease.discard(&old);
        let fresh = lease.cell();
        assert!(!Arc::ptr_eq(&old, &fresh));
        lease.discard(&old);
        assert!(Arc::ptr_eq(&fresh, &lease.cell()));
    }

    #[test]
    fn a_durable_write_is_bounded_by_the_response_and_wait_timeouts() {
        let wait = Wait {
            replicas: 1,
            every: false,
            timeout: Duration::from_secs(1),
        };
        assert_eq!(
            durable_bound(Duration::from_secs(10), wait),
            Duration::from_secs(11)
        );
        let e = no_connection_within(Duration::from_secs(11));
        // Nothing was sent: "not written, try again" (503 redis_unavailable over HTTP).
        assert_eq!(e.write_outcome(), WriteOutcome::NotApplied);
        assert!(e.is_transient(), "{e}");
    }
}
