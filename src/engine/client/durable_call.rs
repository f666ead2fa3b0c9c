//! Durable cancels and reschedules: one script call and a `WAIT` as one pipeline on a
//! durable connection (see [`Client::replicated_script`]), so that with
//! `durability = "replicated"` an acknowledged cancel or reschedule survives a failover as
//! an acknowledged schedule does (a cancel lost with the old master would let the
//! cancelled order fire).

use super::Client;
use super::durable::{MAX_WAIT, Wait, durable_bound};
use crate::engine::error::{Error, RedisContext, Result};
use crate::engine::redact;

impl Client {
    /// Runs `inv` then `WAIT` as one pipeline on a durable connection (the same bounds and
    /// replica count as a durable schedule: [`Client::durable_start`]); the script's
    /// integer reply once the replicas confirmed it. A connection lost before `WAIT`
    /// answered, or fewer replicas than wanted, is [`Error::NotReplicated`]: the call may
    /// have been applied on the leader, and repeating it is safe (cancels and reschedules
    /// are idempotent). A `NOSCRIPT` loads the script and sends the call again (nothing of
    /// it was run).
    pub(super) async fn replicated_script(
        &self,
        inv: redis::ScriptInvocation<'_>,
        what: &'static str,
        wait: Wait,
    ) -> Result<i64> {
        let bound = durable_bound(self.inner.opts.response_timeout, wait);
        let deadline = tokio::time::Instant::now() + bound;
        let (slot, cell, durable, wait) = self.durable_start(wait, deadline).await?;
        let mut conn = durable.conn.clone();
        let timeout_ms = u64::try_from(wait.timeout.min(MAX_WAIT).as_millis())
            .unwrap_or(1000)
            .max(1);
        let run = async {
            for round in 0..2 {
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                pipe.invoke_script(&inv);
                pipe.cmd("WAIT").arg(wait.replicas).arg(timeout_ms);
                let replies: Vec<redis::RedisResult<redis::Value>> =
                    match pipe.query_async(&mut conn).await {
                        Ok(r) => r,
                        Err(e) => {
                            tracing::warn!(
                                error = %redact::text(&e.to_string()),
                                "durable write lost its connection before WAIT answered"
                            );
                            return (Err(wait.not_replicated(0)), true);
                        }
                    };
                let mut replies = replies.into_iter();
                let call = replies.next();
                let acked = match replies.next() {
                    Some(Ok(v)) => redis::from_redis_value::<u32>(v).unwrap_or(0),
                    _ => 0,
                };
                return match call {
                    Some(Err(e))
                        if round == 0
                            && e.kind()
                                == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                    {
                        if let Err(e) = inv.load_async(&mut conn).await {
                            return (Err(e).ctx(what), true);
                        }
                        continue;
                    }
                    Some(Err(e)) => (Err(e).ctx(what), false),
                    None => (
                        Err(Error::Reply {
                            context: what,
                            detail: "no reply to the script call".into(),
                        }),
                        false,
                    ),
                    Some(Ok(v)) => match redis::from_redis_value::<i64>(v) {
                        Err(e) => (
                            Err(Error::Reply {
                                context: what,
                                detail: e.to_string(),
                            }),
                            false,
                        ),
                        Ok(_) if acked < wait.replicas => (Err(wait.not_replicated(acked)), false),
                        Ok(n) => (Ok(n), false),
                    },
                };
            }
            (Err(wait.not_replicated(0)), false)
        };
        let (result, broken) = match tokio::time::timeout_at(deadline, run).await {
            Ok(done) => done,
            // Sent, or waiting to be: it may have been applied.
            Err(_) => (Err(wait.not_replicated(0)), true),
        };
        if broken {
            tracing::warn!(
                bound_ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX),
                "a durable write lost its connection or ran out of time: the connection is replaced"
            );
            slot.discard(&cell);
        }
        result
    }

    /// With `durability = "replicated"` ([`Durability::Replicated`](super::Durability::Replicated)
    /// or [`Durability::EveryReplica`](super::Durability::EveryReplica)), waits until the
    /// replicas a durable schedule waits for have everything this process wrote before the
    /// call: one small write (the namespace's replication barrier key, expiring after a
    /// minute) and a `WAIT` as one pipeline on a durable connection. Replication keeps the
    /// master's order, so a replica past that write holds every write that completed before
    /// it (queue creates and deletes, schedule changes, made on the shared connection). With
    /// [`Durability::Leader`](super::Durability::Leader) it does nothing. Fewer replicas, or a
    /// connection lost, is [`Error::NotReplicated`] (HTTP 503 `not_replicated`): the writes
    /// were applied on the master and may be lost with it, and repeating them is safe. On a
    /// Redis Cluster it covers the registry's node only. `/readyz` calls it too, so that it
    /// answers 200 only while a durable write would be acknowledged.
    pub async fn replicated_barrier(&self) -> Result<()> {
        let Some(wait) = self.durable_wait() else {
            return Ok(());
        };
        let bound = durable_bound(self.inner.opts.response_timeout, wait);
        let deadline = tokio::time::Instant::now() + bound;
        let (slot, cell, durable, wait) = self.durable_start(wait, deadline).await?;
        let mut conn = durable.conn.clone();
        let timeout_ms = u64::try_from(wait.timeout.min(MAX_WAIT).as_millis())
            .unwrap_or(1000)
            .max(1);
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(self.keyspace().replication_barrier())
            .arg(self.now_ms())
            .arg("PX")
            .arg(60_000)
            .ignore();
        pipe.cmd("WAIT").arg(wait.replicas).arg(timeout_ms);
        match tokio::time::timeout_at(deadline, pipe.query_async::<(u32,)>(&mut conn)).await {
            Ok(Ok((acked,))) if acked >= wait.replicas => Ok(()),
            Ok(Ok((acked,))) => Err(wait.not_replicated(acked)),
            Ok(Err(e)) if !e.is_io_error() && !e.is_timeout() => {
                Err(e).ctx("waiting for the replicas (WAIT)")
            }
            _ => {
                slot.discard(&cell);
                Err(wait.not_replicated(0))
            }
        }
    }
}
