//! Scheduling: validating a batch, cutting it into script calls per shard, and durable
//! writes.

use super::Client;
use super::options::{Durability, ENQUEUE_CHUNK_BYTES, ENQUEUE_CHUNK_ORDERS};
use crate::engine::conn::Conn;
use crate::engine::keys::{QueueName, ShardKeys, shard_of};
use crate::engine::message::{Mode, NewOrder, ScheduleOutcome, Scheduled, When};
use crate::engine::scripts::{self, EnqueueArg};
use crate::engine::telemetry;
use crate::error::{Error, InvalidInput, RedisContext, Result};
use futures_util::future::try_join_all;
use std::collections::HashSet;
use std::time::Duration;

impl Client {
    /// Schedules one order (upsert: a known id gets the new due time and payload).
    pub async fn schedule(
        &self,
        queue: &str,
        id: &str,
        when: impl Into<When>,
        payload: impl Into<crate::Payload>,
    ) -> Result<Scheduled> {
        self.schedule_with(queue, NewOrder::new(id, when, payload), Mode::Upsert)
            .await
    }

    /// Schedules one order with an explicit [`Mode`].
    pub async fn schedule_with(
        &self,
        queue: &str,
        order: NewOrder,
        mode: Mode,
    ) -> Result<Scheduled> {
        let mut out = self
            .schedule_many(queue, std::slice::from_ref(&order), mode)
            .await
            .map_err(|e| match e {
                // A single order's error names no batch index.
                Error::Invalid(InvalidInput::InBatch { source, .. }) => Error::Invalid(*source),
                other => other,
            })?;
        out.pop().ok_or(Error::Reply {
            context: "scheduling an order",
            detail: "no outcome".into(),
        })
    }

    /// Schedules a batch. The whole batch is validated first: one invalid order refuses the
    /// batch ([`InvalidInput::InBatch`] names its index) and nothing is written. Orders are
    /// sent many per script call; each order is atomic, and a batch interrupted by a Redis
    /// failure may be partly applied (scheduling is idempotent: retry it).
    ///
    /// Returns one result per order, in order. An id repeated in one batch is applied in
    /// order (the last upsert wins).
    pub async fn schedule_many(
        &self,
        queue: &str,
        orders: &[NewOrder],
        mode: Mode,
    ) -> Result<Vec<Scheduled>> {
        let queue = QueueName::new(queue)?;
        let now = self.now_ms();
        let dues = orders
            .iter()
            .enumerate()
            .map(|(index, o)| {
                o.validate(now, self.inner.opts.max_payload_bytes)
                    .map_err(|e| InvalidInput::InBatch {
                        index,
                        source: Box::new(e),
                    })
            })
            .collect::<Result<Vec<i64>, InvalidInput>>()?;
        let shards = self.shards_of(&queue).await?;
        if orders.is_empty() {
            return Ok(Vec::new());
        }
        let calls = self.plan_enqueue(&queue, shards, orders);
        let outcomes = self
            .enqueue_calls(&calls, orders, &dues, now, mode == Mode::IfAbsent)
            .await?;
        let mut results: Vec<Option<ScheduleOutcome>> = vec![None; orders.len()];
        for ((_, idxs), outs) in calls.iter().zip(outcomes) {
            for (&i, o) in idxs.iter().zip(outs) {
                results[i] = Some(o);
            }
        }
        let written =
            |o: &Option<ScheduleOutcome>| o.is_some_and(|o| o != ScheduleOutcome::Unchanged);
        let earliest = results
            .iter()
            .zip(&dues)
            .filter(|(o, _)| written(o))
            .map(|(_, &d)| d)
            .min();
        if let Some(due) = earliest {
            self.inner.wake.scheduled(queue.as_str(), due);
        }
        telemetry::scheduled(
            queue.as_str(),
            results.iter().filter(|o| written(o)).count() as u64,
        );
        results
            .into_iter()
            .zip(orders.iter().zip(dues))
            .map(|(o, (order, due))| {
                Ok(Scheduled {
                    id: order.id.clone(),
                    due_at_ms: due,
                    outcome: o.ok_or(Error::Reply {
                        context: "scheduling orders",
                        detail: "an order got no outcome".into(),
                    })?,
                })
            })
            .collect()
    }

    /// Groups a batch by shard (keeping batch order within a shard) and cuts it into script
    /// calls of at most [`ENQUEUE_CHUNK_ORDERS`] orders and [`ENQUEUE_CHUNK_BYTES`] bytes.
    fn plan_enqueue(
        &self,
        queue: &QueueName,
        shards: u16,
        orders: &[NewOrder],
    ) -> Vec<(ShardKeys, Vec<usize>)> {
        let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); usize::from(shards)];
        for (i, o) in orders.iter().enumerate() {
            by_shard[usize::from(shard_of(&o.id, shards))].push(i);
        }
        let mut calls = Vec::new();
        for (shard, idxs) in by_shard.iter().enumerate() {
            let keys = self.shard_keys(queue, u16::try_from(shard).unwrap_or(0));
            let mut start = 0;
            while start < idxs.len() {
                let mut end = start;
                let mut bytes = 0;
                while end < idxs.len()
                    && end - start < ENQUEUE_CHUNK_ORDERS
                    && (end == start
                        || bytes + orders[idxs[end]].payload.len() <= ENQUEUE_CHUNK_BYTES)
                {
                    bytes += orders[idxs[end]].payload.len();
                    end += 1;
                }
                calls.push((keys.clone(), idxs[start..end].to_vec()));
                start = end;
            }
        }
        calls
    }

    /// Runs the planned enqueue calls, in flight together; with durable schedules, on a
    /// connection of their own followed by `WAIT` on every shard written.
    async fn enqueue_calls(
        &self,
        calls: &[(ShardKeys, Vec<usize>)],
        orders: &[NewOrder],
        dues: &[i64],
        now: i64,
        if_absent: bool,
    ) -> Result<Vec<Vec<ScheduleOutcome>>> {
        let mut durable_guard = match self.durability {
            Durability::Leader => None,
            Durability::Replicated { .. } => {
                let mut g = self.inner.durable_conn.lock().await;
                if g.is_none() {
                    *g = Some(self.dedicated_connection(Duration::from_secs(60)).await?);
                }
                Some(g)
            }
        };
        let base_conn = match durable_guard.as_ref().and_then(|g| g.as_ref()) {
            Some(c) => c.clone(),
            None => self.inner.conn.clone(),
        };
        let outcomes = try_join_all(calls.iter().map(|(keys, idxs)| {
            let mut conn = base_conn.clone();
            let args: Vec<EnqueueArg<'_>> = idxs
                .iter()
                .map(|&i| EnqueueArg {
                    id: &orders[i].id,
                    due_ms: dues[i],
                    payload: orders[i].payload.as_str(),
                })
                .collect();
            async move { scripts::enqueue(&mut conn, keys, if_absent, now, &args).await }
        }))
        .await?;
        if let (Durability::Replicated { replicas, timeout }, Some(g)) =
            (self.durability, durable_guard.as_mut())
            && let Some(conn) = g.as_mut()
        {
            wait_replicated(conn, calls, replicas, timeout).await?;
        }
        Ok(outcomes)
    }
}

/// `WAIT` on the node of every shard written (each shard lives on its own node in a
/// cluster); fails with [`Error::NotReplicated`] when fewer than `replicas` confirmed.
async fn wait_replicated(
    conn: &mut Conn,
    calls: &[(ShardKeys, Vec<usize>)],
    replicas: u32,
    timeout: Duration,
) -> Result<()> {
    let mut acked = u32::MAX;
    let mut waited = HashSet::new();
    for (keys, _) in calls {
        if waited.insert(keys.shard) {
            let n = conn
                .wait_for_replicas(
                    &keys.due,
                    replicas,
                    u64::try_from(timeout.as_millis()).unwrap_or(1000).max(1),
                )
                .await
                .ctx("waiting for replicas (WAIT)")?;
            acked = acked.min(n);
        }
    }
    if acked < replicas {
        return Err(Error::NotReplicated {
            acked,
            wanted: replicas,
            timeout,
        });
    }
    Ok(())
}
