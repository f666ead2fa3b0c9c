//! Reading an order's history (where it is, group by group) and redelivering orders to one
//! group: the admin side of [`crate::engine::history`], whose records the dispatcher and the
//! workers write.

use super::Queues;
use crate::engine::client::Client;
use crate::engine::error::{Error, InvalidInput, RedisContext, Result};
use crate::engine::history::{Cancellation, CancelledBy, HistoryPolicy, RETENTION_FIELD, entry_ms};
use crate::engine::keys::{QueueName, ShardKeys, shard_of, validate_id, validate_member_name};
use crate::engine::message::{NewOrder, decode_stored, raw_json};
use crate::engine::priority::Priority;
use crate::engine::reply::Fields;
use crate::engine::reply::stored_level;
use crate::engine::scripts::admin::{HISTORY, REDELIVER};
use serde::Serialize;
use serde_json::value::RawValue;
use std::time::Duration;

/// Where an order is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderState {
    /// Waiting for its due time.
    Scheduled,
    /// Moved into the stream: see each group's state.
    Dispatched,
    /// Cancelled before its due time (by id, tag or event): see `cancelled`.
    Cancelled,
}

/// Where a dispatched order is in one consumer group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupState {
    /// Not yet read by the group.
    Waiting,
    /// Taken by a consumer (leased), being handled.
    Running,
    /// An attempt failed; the next one is at `next_attempt_at_ms`.
    Retrying,
    /// Handled and acknowledged.
    Done,
    /// Given up on: dead-lettered.
    Dead,
    /// Not handed to the group: it would have been later than due + `expires_after`
    /// (dead-lettered with reason `expired`; see [`crate::engine::expiry`]).
    Expired,
}

/// One group's part in a dispatched order's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupHistory {
    /// The consumer group.
    pub group: String,
    /// Where the order is in it.
    pub state: GroupState,
    /// Deliveries so far (0 while waiting).
    pub attempts: u32,
    /// The last failure, when one is known.
    pub last_error: Option<String>,
    /// When the next attempt is due (retrying only), unix ms.
    pub next_attempt_at_ms: Option<i64>,
    /// How late its hand-off would have been past due + `expires_after`, ms (expired only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late_ms: Option<i64>,
}

/// What happened to an order: the answer of `GET /v1/queues/{q}/messages/{id}` and `delayq
/// get`.
#[derive(Debug, Clone, Serialize)]
pub struct OrderHistory {
    /// The queue.
    pub queue: String,
    /// The order id.
    pub id: String,
    /// Scheduled, dispatched or cancelled.
    pub state: OrderState,
    /// When it is (or was) due, unix ms.
    pub due_at_ms: i64,
    /// The payload, byte for byte as it was scheduled, while the order is scheduled or its
    /// stream entry exists; `null` after.
    pub payload: Option<Box<RawValue>>,
    /// When it was dispatched, unix ms.
    pub dispatched_at_ms: Option<i64>,
    /// Its stream entry id.
    pub entry_id: Option<String>,
    /// Each consumer group's state (dispatched orders; empty while scheduled).
    pub groups: Vec<GroupHistory>,
    /// The order's priority level (of its first delivery once dispatched).
    pub priority: Priority,
    /// A waiting debounced order's first call and cap ([`crate::engine::time_rules`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub debounce: Option<crate::engine::time_rules::DebounceState>,
    /// The order's tags while its payload is known (none: left out of the JSON).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Its key (see [`crate::engine::order_key`]), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// A cancelled order's cancellation: when, and by what (`{"at_ms": ..., "reason":
    /// "id" | "tag" | "event", "tag": ..., "event": ..., "event_id": ...}`); left out of
    /// the JSON otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled: Option<Cancellation>,
}

/// What [`Queues::redeliver`](crate::engine::admin::Queues::redeliver) did with one order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Redelivered {
    /// Appended to the stream for the group alone.
    Sent,
    /// Left alone: it is scheduled.
    Scheduled,
    /// Left alone: its latest entry is pending in the group or not yet read by it.
    InFlight,
}

impl Queues {
    /// Sets how long `queue` keeps the history of its dispatched orders (zero: none). Every
    /// dispatcher and worker of the queue follows it within a second.
    pub async fn set_history_retention(&self, queue: &str, retention: Duration) -> Result<()> {
        let q = QueueName::new(queue)?;
        let policy = HistoryPolicy::new(retention)?;
        self.client.shards_of(&q).await?;
        let _: i64 = redis::cmd("HSET")
            .arg(self.client.queue_meta_key(&q))
            .arg(RETENTION_FIELD)
            .arg(policy.retention_ms())
            .query_async(&mut self.client.connection())
            .await
            .ctx("setting the history retention")?;
        self.client.bump_registry().await
    }

    /// What happened to order `id` of `queue`: scheduled, dispatched with each group's
    /// state, or cancelled (by what, when). `None` when it was never seen, is past the
    /// retention, or was cancelled while the queue kept no history.
    pub async fn history(&self, queue: &str, id: &str) -> Result<Option<OrderHistory>> {
        let q = QueueName::new(queue)?;
        validate_id(id)?;
        let shards = self.client.shards_of(&q).await?;
        let keys = self.client.shard_keys(&q, shard_of(id, shards));
        let policy = crate::engine::flow::queue_flags(&self.client, &q, None)
            .await?
            .history;
        let groups = group_names(&self.client, &keys).await?;
        let mut fields = vec![id.to_owned()];
        fields.extend(groups.iter().map(|g| redirect_field(g, id)));
        let buckets = locate(
            &self.client,
            &keys,
            &policy,
            &policy.lookup(self.client.now_ms()),
            &fields,
        )
        .await?;
        let mut inv = HISTORY.for_server(self.client.server()).prepare_invoke();
        let [high, normal, low] = keys.lanes();
        inv.key(&keys.due)
            .key(&keys.payload)
            .key(&normal.stream)
            .key(&keys.dead)
            .key(&high.stream)
            .key(&low.stream)
            .key(&keys.levels);
        for &b in &buckets {
            inv.key(keys.history(policy.bucket_ms(), b));
        }
        for g in &groups {
            for lane in [&normal, &high, &low] {
                inv.key(lane.timers(g)).key(lane.errors(g));
            }
        }
        inv.arg(id).arg(buckets.len()).arg(policy.bucket_ms());
        for &b in &buckets {
            inv.arg(b);
        }
        inv.arg(policy.cutoff(self.client.now_ms()));
        for g in &groups {
            inv.arg(g);
        }
        let reply: redis::Value = inv
            .invoke_async(&mut self.client.connection())
            .await
            .ctx("reading an order's history (history.lua)")?;
        let mut h = parse_history(q.as_str(), id, reply)?;
        if let Some(h) = h.as_mut().filter(|h| h.state == OrderState::Scheduled) {
            // A debounced order's record (a separate read: it only adds to the answer).
            let rec: Option<String> = redis::cmd("HGET")
                .arg(&keys.debounce)
                .arg(id)
                .query_async(&mut self.client.connection())
                .await
                .ctx("reading an order's debounce")?;
            h.debounce = rec
                .as_deref()
                .and_then(crate::engine::time_rules::DebounceState::parse);
        }
        Ok(h)
    }

    /// Sends `orders` straight to consumer group `group` of `queue` (due now; no other
    /// group sees them, as with a dead-letter replay), except those still on their way: an
    /// order that is scheduled, or whose latest entry is pending in the group or not yet
    /// read by it, is left alone. The check and the send are one script per call, so
    /// concurrent runs never send an order twice. Used by reconciliation.
    pub async fn redeliver(
        &self,
        queue: &str,
        group: &str,
        orders: &[NewOrder],
    ) -> Result<Vec<Redelivered>> {
        let q = QueueName::new(queue)?;
        validate_member_name("group", group)?;
        let now = self.client.now_ms();
        for (index, o) in orders.iter().enumerate() {
            o.validate(now, self.client.options().max_payload_bytes)
                .map_err(|e| InvalidInput::InBatch {
                    index,
                    source: Box::new(e),
                })?;
        }
        let shards = self.client.shards_of(&q).await?;
        let policy = crate::engine::flow::queue_flags(&self.client, &q, None)
            .await?
            .history;
        let buckets = policy.lookup(now);
        let mut out = vec![Redelivered::Scheduled; orders.len()];
        let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); usize::from(shards)];
        for (i, o) in orders.iter().enumerate() {
            by_shard[usize::from(shard_of(&o.id, shards))].push(i);
        }
        for (shard, idxs) in by_shard.iter().enumerate() {
            let keys = self
                .client
                .shard_keys(&q, u16::try_from(shard).unwrap_or(0));
            for chunk in idxs.chunks(REDELIVER_CHUNK) {
                let fields: Vec<String> = chunk
                    .iter()
                    .flat_map(|&i| [orders[i].id.clone(), redirect_field(group, &orders[i].id)])
                    .collect();
                let buckets = locate(&self.client, &keys, &policy, &buckets, &fields).await?;
                let mut inv = REDELIVER.prepare_invoke();
                let [high, _, low] = keys.lanes();
                inv.key(&keys.due)
                    .key(&keys.stream)
                    .key(&high.stream)
                    .key(&low.stream);
                for &b in &buckets {
                    inv.key(keys.history(policy.bucket_ms(), b));
                }
                inv.arg(group).arg(buckets.len()).arg(policy.bucket_ms());
                for &b in &buckets {
                    inv.arg(b);
                }
                inv.arg(now).arg(policy.write_target(&keys, now).1);
                for &i in chunk {
                    inv.arg(&orders[i].id).arg(orders[i].payload.as_str());
                }
                let codes: Vec<i64> = inv
                    .invoke_async(&mut self.client.connection())
                    .await
                    .ctx("redelivering orders (redeliver.lua)")?;
                for (&i, c) in chunk.iter().zip(codes) {
                    out[i] = match c {
                        1 => Redelivered::Sent,
                        2 => Redelivered::InFlight,
                        _ => Redelivered::Scheduled,
                    };
                }
            }
        }
        Ok(out)
    }
}

/// Orders per `redeliver.lua` call: each may append a stream entry and a history record, so
/// a call stays at a few milliseconds of Redis time even on a busy host.
const REDELIVER_CHUNK: usize = 100;

/// History buckets one locating pipeline checks (one `EXISTS` each; a quarter of that reads
/// with one `HMGET` each).
const LOCATE_BUCKETS: usize = 256;
/// Fields one locating `HMGET` asks for.
const LOCATE_FIELDS: usize = 200;

/// The field of the redirect a replay or a redelivery to `group` writes for order `id`.
fn redirect_field(group: &str, id: &str) -> String {
    format!("\u{2}{group}\u{2}{id}")
}

/// Of `buckets` (newest first), those a script about `fields` needs: the two newest (where
/// anything written from now on lands: a dispatch, a redirect), every bucket holding one of
/// `fields`, and the bucket of each entry id those hold (its markers). Found with `EXISTS`
/// and `HMGET` per bucket (at most 200 fields) outside any script, so a script's work no longer grows with the
/// retention (90 days = 2,162 buckets): each command here is O(fields), and the script
/// reads a handful of buckets. A record written or expiring between this and the script is
/// in the newest buckets, or was past the retention anyway.
async fn locate(
    client: &Client,
    keys: &ShardKeys,
    policy: &HistoryPolicy,
    buckets: &[i64],
    fields: &[String],
) -> Result<Vec<i64>> {
    if buckets.is_empty() {
        return Ok(Vec::new()); // history off
    }
    let mut wanted: std::collections::BTreeSet<i64> = buckets.iter().take(2).copied().collect();
    // Which buckets exist (one EXISTS each, tiny replies): only those are read.
    let mut live = Vec::new();
    for group in buckets.chunks(LOCATE_BUCKETS) {
        let mut pipe = redis::pipe();
        for &b in group {
            pipe.cmd("EXISTS").arg(keys.history(policy.bucket_ms(), b));
        }
        let exists: Vec<bool> = pipe
            .query_async(&mut client.connection())
            .await
            .ctx("locating an order's history")?;
        live.extend(
            group
                .iter()
                .zip(exists)
                .filter(|(_, e)| *e)
                .map(|(&b, _)| b),
        );
    }
    for fields in fields.chunks(LOCATE_FIELDS) {
        for group in live.chunks(LOCATE_BUCKETS / 4) {
            let mut pipe = redis::pipe();
            for &b in group {
                pipe.cmd("HMGET")
                    .arg(keys.history(policy.bucket_ms(), b))
                    .arg(fields);
            }
            let found: Vec<Vec<Option<String>>> = pipe
                .query_async(&mut client.connection())
                .await
                .ctx("locating an order's history")?;
            for (&b, values) in group.iter().zip(found) {
                for v in values.into_iter().flatten() {
                    wanted.insert(b);
                    let entry = v.split_once(':').map_or("", |(e, _)| e);
                    if let Some(ms) = entry_ms(entry) {
                        wanted.insert(ms.div_euclid(policy.bucket_ms()));
                    }
                }
            }
        }
    }
    Ok(buckets
        .iter()
        .copied()
        .filter(|b| wanted.contains(b))
        .collect())
}

/// The consumer groups of a shard's stream (none when it does not exist).
async fn group_names(client: &Client, keys: &ShardKeys) -> Result<Vec<String>> {
    let r: redis::RedisResult<redis::Value> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(&keys.stream)
        .query_async(&mut client.connection())
        .await;
    let v = match r {
        Ok(v) => v,
        Err(e) if e.code() == Some("ERR") && e.to_string().contains("no such key") => {
            return Ok(Vec::new());
        }
        Err(e) => return Err(e).ctx("listing consumer groups (XINFO GROUPS)"),
    };
    let redis::Value::Array(groups) = v else {
        return Ok(Vec::new());
    };
    Ok(groups
        .into_iter()
        .filter_map(|g| {
            crate::engine::reply::field_pairs(g)?
                .into_iter()
                .find(|(k, _)| k == "name")
                .map(|(_, v)| v)
        })
        .collect())
}

fn reply_err(detail: impl Into<String>) -> Error {
    Error::Reply {
        context: "reading an order's history (history.lua)",
        detail: detail.into(),
    }
}

fn text(v: &redis::Value) -> Option<String> {
    crate::engine::reply::as_string(v)
}

fn int(v: &redis::Value) -> Option<i64> {
    match v {
        redis::Value::Int(i) => Some(*i),
        other => text(other)
            .and_then(|s| s.parse::<f64>().ok())
            .map(crate::engine::reply::score_to_ms),
    }
}

/// The payload of a stored value (`"<enqueued_ms>:<json>"`), byte for byte; a traced
/// order's context (`"<enqueued_ms>:~<traceparent>...~<json>"`) is left out.
fn stored_payload(raw: &str) -> Box<RawValue> {
    raw_json(decode_stored(raw).1)
}

/// The key of a stored value (see [`crate::engine::order_key`]).
fn stored_key(raw: Option<&str>) -> Option<String> {
    raw.and_then(crate::engine::order_key::of_stored)
        .map(str::to_owned)
}

fn parse_history(queue: &str, id: &str, reply: redis::Value) -> Result<Option<OrderHistory>> {
    let redis::Value::Array(parts) = reply else {
        return Ok(None);
    };
    let mut parts = parts.into_iter();
    let state = parts
        .next()
        .as_ref()
        .and_then(text)
        .ok_or_else(|| reply_err("no state"))?;
    let base = |state, due_at_ms| OrderHistory {
        queue: queue.to_owned(),
        id: id.to_owned(),
        state,
        due_at_ms,
        payload: None,
        dispatched_at_ms: None,
        entry_id: None,
        groups: Vec::new(),
        priority: Priority::Normal,
        debounce: None,
        tags: Vec::new(),
        key: None,
        cancelled: None,
    };
    if state == "scheduled" {
        let due = parts
            .next()
            .as_ref()
            .and_then(int)
            .ok_or_else(|| reply_err("no due time"))?;
        let mut h = base(OrderState::Scheduled, due);
        let stored = parts.next().as_ref().and_then(text);
        h.key = stored_key(stored.as_deref());
        h.payload = stored.as_deref().map(stored_payload);
        h.tags = stored
            .as_deref()
            .map(crate::engine::tags::of_stored)
            .unwrap_or_default();
        h.priority = stored_level(parts.next().as_ref().and_then(text).as_deref());
        return Ok(Some(h));
    }
    if state == "cancelled" {
        let at_ms = parts
            .next()
            .as_ref()
            .and_then(int)
            .ok_or_else(|| reply_err("no cancel time"))?;
        let due = parts
            .next()
            .as_ref()
            .and_then(int)
            .ok_or_else(|| reply_err("no due time"))?;
        let by = parts
            .next()
            .as_ref()
            .and_then(text)
            .as_deref()
            .and_then(CancelledBy::parse)
            .ok_or_else(|| reply_err("a cancel reason this version does not know"))?;
        let mut h = base(OrderState::Cancelled, due);
        h.cancelled = Some(Cancellation { at_ms, by });
        return Ok(Some(h));
    }
    let entry = parts
        .next()
        .as_ref()
        .and_then(text)
        .ok_or_else(|| reply_err("no entry id"))?;
    let due = parts
        .next()
        .as_ref()
        .and_then(int)
        .ok_or_else(|| reply_err("no due time"))?;
    let mut h = base(OrderState::Dispatched, due);
    let fields: Option<Fields> = parts.next().and_then(crate::engine::reply::field_pairs);
    let data = fields
        .as_ref()
        .and_then(|f| f.iter().find(|(k, _)| k == "data").map(|(_, v)| v.as_str()));
    h.key = stored_key(data);
    h.payload = data.map(stored_payload);
    h.tags = data.map(crate::engine::tags::of_stored).unwrap_or_default();
    h.dispatched_at_ms = entry_ms(&entry);
    h.entry_id = Some(entry);
    if let Some(redis::Value::Array(groups)) = parts.next() {
        for g in groups {
            let redis::Value::Array(g) = g else { continue };
            let get = |i: usize| g.get(i);
            let state = match get(1).and_then(text).as_deref() {
                Some("waiting") => GroupState::Waiting,
                Some("running") => GroupState::Running,
                Some("retrying") => GroupState::Retrying,
                Some("dead") => GroupState::Dead,
                Some("expired") => GroupState::Expired,
                _ => GroupState::Done,
            };
            h.groups.push(GroupHistory {
                group: get(0).and_then(text).unwrap_or_default(),
                state,
                attempts: get(2)
                    .and_then(int)
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(0),
                last_error: get(3).and_then(text),
                next_attempt_at_ms: get(4).and_then(int),
                late_ms: get(5).and_then(int),
            });
        }
    }
    h.priority = stored_level(parts.next().as_ref().and_then(text).as_deref());
    Ok(Some(h))
}
