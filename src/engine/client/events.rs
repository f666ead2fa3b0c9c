//! Posting events (issue 43 item 4): an event cancels the orders of every queue whose
//! cancel-on-event rules name it and match its data (see [`crate::engine::events`]), and is
//! remembered for the rules' `remember` window so that a matching order scheduled later is
//! answered `cancelled_by_event`.
//!
//! Per matching queue and shard, in this order: the token is remembered first
//! (`{ns:q:s}:remembered`, trimmed of expired tokens and capped), then the orders carrying
//! it are cancelled in bounded `tag_bulk.lua` batches. An order scheduled concurrently is
//! either written before the token is remembered (then the sweep finds it in the index) or
//! after (then `enqueue.lua` refuses it): never missed. An event id is kept (`SET NX`) for
//! the longest window of the rules it matched: a repeated post answers `duplicate` and
//! cancels nothing, so counts add up once.

use super::Client;
use crate::engine::error::{InvalidInput, RedisContext, Result};
use crate::engine::events::{
    DEFAULT_REMEMBER_MS, MAX_EVENT_BATCH, MAX_ORDER_RULES, MAX_REMEMBERED, RECORD_FIELD,
    StoredRules, order_rule_field, parse_order_rule, validate_event_id, validate_event_name,
};
use crate::engine::history::CancelledBy;
use crate::engine::keys::QueueName;
use crate::engine::scripts::tags::{BulkAction, OrderRules, order_rules, tag_bulk};
use crate::engine::telemetry;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::tags::TAG_BATCH;

/// An event to post: its name, its data (a JSON object) and an optional id that makes
/// retried posts harmless.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Its name, e.g. `order.paid`.
    pub name: String,
    /// Its data: the rules' match paths are read here (`data.order_id`).
    #[serde(default = "empty_object")]
    pub data: serde_json::Value,
    /// Its id: a second post with the same id within the window does nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

impl Event {
    /// An event without an id.
    pub fn new(name: impl Into<String>, data: serde_json::Value) -> Self {
        Event {
            name: name.into(),
            data,
            id: None,
        }
    }

    /// The same event with id `id`.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// An event as a JSON body holds it: `{"name": ..., "data": {...}, "id": ...}` (`data`
    /// defaults to `{}`, `id` to none), checked as [`Event::validate`]; anything else is
    /// refused naming the field.
    pub fn from_json(v: &serde_json::Value) -> std::result::Result<Self, InvalidInput> {
        let bad = |name: &'static str, reason: &str| InvalidInput::Option {
            name,
            reason: reason.into(),
        };
        let o = v
            .as_object()
            .ok_or_else(|| bad("event", "must be an object {name, data, id}"))?;
        if let Some(k) = o
            .keys()
            .find(|k| !["name", "data", "id"].contains(&k.as_str()))
        {
            return Err(InvalidInput::Option {
                name: "event",
                reason: format!("unknown field {k:?} (name, data, id)"),
            });
        }
        let name = match o.get("name") {
            Some(serde_json::Value::String(n)) => n.clone(),
            None => return Err(bad("name", "an event needs a name")),
            Some(_) => return Err(bad("name", "must be a string")),
        };
        let id = match o.get("id") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(i)) => Some(i.clone()),
            Some(_) => return Err(bad("id", "must be a string")),
        };
        let e = Event {
            name,
            data: o.get("data").cloned().unwrap_or_else(empty_object),
            id,
        };
        e.validate()?;
        Ok(e)
    }

    /// Checks name (field `name`), id (field `id`) and data (field `data`: an object).
    pub fn validate(&self) -> std::result::Result<(), InvalidInput> {
        validate_event_name(&self.name)?;
        if let Some(id) = &self.id {
            validate_event_id(id)?;
        }
        if !self.data.is_object() {
            return Err(InvalidInput::Option {
                name: "data",
                reason: "must be a JSON object".into(),
            });
        }
        Ok(())
    }
}

/// What posting one event did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventPosted {
    /// The event's name.
    pub name: String,
    /// Its id, if it had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Orders it cancelled, over every queue.
    pub cancelled: u64,
    /// Per queue (queues with none left out).
    pub queues: BTreeMap<String, u64>,
    /// How many rules (queue, rule) it matched.
    pub matched_rules: u64,
    /// Its id was posted before, within the window: nothing was done.
    pub duplicate: bool,
}

/// One queue's rule that an event matched: the token and how long to remember it.
struct Hit {
    queue: QueueName,
    token: String,
    remember_ms: i64,
}

impl Client {
    /// Posts one event: cancels the orders of every queue whose rules name it and match its
    /// data, and remembers it for the rules' `remember` windows. Checked first (nothing is
    /// written on bad input).
    pub async fn post_event(&self, event: &Event) -> Result<EventPosted> {
        event.validate()?;
        let hits = self.event_hits(event).await?;
        let mut out = EventPosted {
            name: event.name.clone(),
            id: event.id.clone(),
            cancelled: 0,
            queues: BTreeMap::new(),
            matched_rules: hits.len() as u64,
            duplicate: false,
        };
        let seen_key = event.id.as_ref().map(|id| self.keyspace().event_id(id));
        if let Some(k) = &seen_key {
            let window = hits
                .iter()
                .map(|h| h.remember_ms)
                .max()
                .unwrap_or(DEFAULT_REMEMBER_MS);
            let first: Option<String> = redis::cmd("SET")
                .arg(k)
                .arg(self.now_ms())
                .arg("NX")
                .arg("PX")
                .arg(window)
                .query_async(&mut self.connection())
                .await
                .ctx("recording the event id")?;
            if first.is_none() {
                out.duplicate = true;
                out.matched_rules = 0;
                telemetry::event_received("duplicate");
                return Ok(out);
            }
        }
        match self.apply_hits(&hits, &mut out).await {
            Ok(()) => {}
            Err(e) => {
                // Not applied in full: the id is forgotten so that a retry does the rest.
                if let Some(k) = &seen_key {
                    let _: redis::RedisResult<i64> = redis::cmd("DEL")
                        .arg(k)
                        .query_async(&mut self.connection())
                        .await;
                }
                return Err(e);
            }
        }
        telemetry::event_received(if hits.is_empty() {
            "unmatched"
        } else {
            "matched"
        });
        for (q, n) in &out.queues {
            telemetry::cancelled_by(q, "event", *n);
        }
        Ok(out)
    }

    /// Posts a batch of events (at most [`MAX_EVENT_BATCH`]), all checked first: one bad
    /// event refuses the batch ([`InvalidInput::InBatch`] names its index), nothing done.
    pub async fn post_events(&self, events: &[Event]) -> Result<Vec<EventPosted>> {
        if events.len() > MAX_EVENT_BATCH {
            return Err(InvalidInput::Option {
                name: "events",
                reason: format!("at most {MAX_EVENT_BATCH} per batch, got {}", events.len()),
            }
            .into());
        }
        for (index, e) in events.iter().enumerate() {
            e.validate().map_err(|e| InvalidInput::InBatch {
                index,
                source: Box::new(e),
            })?;
        }
        let mut out = Vec::with_capacity(events.len());
        for e in events {
            out.push(self.post_event(e).await?);
        }
        Ok(out)
    }

    /// Registers in `queue`'s record the rules `orders` declare for themselves
    /// (`order_rules.lua`; nothing to do when none does): an event posted from then on
    /// computes its tokens for them. More than [`MAX_ORDER_RULES`] distinct rules per queue
    /// are refused naming `cancel_on`.
    pub(super) async fn register_order_rules(
        &self,
        queue: &QueueName,
        orders: &[crate::engine::message::NewOrder],
    ) -> Result<()> {
        let mut fields: Vec<String> = orders
            .iter()
            .flat_map(|o| o.cancel_on.iter().map(order_rule_field))
            .collect();
        if fields.is_empty() {
            return Ok(());
        }
        fields.sort();
        fields.dedup();
        let record = self.keyspace().queue_record(queue);
        match order_rules(&mut self.connection(), &record, MAX_ORDER_RULES, &fields).await? {
            OrderRules::Added(_) => Ok(()),
            OrderRules::NoQueue => {
                self.forget(queue);
                Err(crate::engine::error::Error::QueueNotFound {
                    queue: queue.as_str().to_owned(),
                })
            }
            OrderRules::Full => Err(InvalidInput::Option {
                name: crate::engine::events::FIELD,
                reason: format!(
                    "the orders of {queue} already declare {MAX_ORDER_RULES} distinct rules: use the queue's rules, or fewer distinct ones",
                    queue = queue.as_str()
                ),
            }
            .into()),
        }
    }

    /// The rules of every queue (read afresh from the records, one pipeline) that name the
    /// event, with the event's token under each (rules whose paths its data lacks left out):
    /// the queue's rules and those its orders declared (their tokens carry their window).
    async fn event_hits(&self, event: &Event) -> Result<Vec<Hit>> {
        let names = self.queues().await?;
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let queues = names
            .iter()
            .map(|n| QueueName::new(n))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let mut pipe = redis::pipe();
        for q in &queues {
            pipe.cmd("HGET")
                .arg(self.keyspace().queue_record(q))
                .arg(RECORD_FIELD);
            pipe.cmd("HKEYS").arg(self.keyspace().queue_record(q));
        }
        let records: Vec<redis::Value> = pipe
            .query_async(&mut self.connection())
            .await
            .ctx("reading the queues' cancel_on rules")?;
        let mut hits = Vec::new();
        let mut records = records.into_iter();
        for q in queues {
            let (Some(rec), Some(fields)) = (records.next(), records.next()) else {
                break;
            };
            let rec: Option<String> = redis::from_redis_value(rec).unwrap_or(None);
            let fields: Vec<String> = redis::from_redis_value(fields).unwrap_or_default();
            let queue_rules = rec
                .as_deref()
                .and_then(StoredRules::parse)
                .map(|s| s.rules)
                .unwrap_or_default();
            let own: Vec<_> = fields.iter().filter_map(|f| parse_order_rule(f)).collect();
            let all = queue_rules
                .iter()
                .map(|r| (r, false))
                .chain(own.iter().map(|r| (r, true)));
            for (r, order) in all.filter(|(r, _)| r.event == event.name) {
                // A value too long for any order's token matches no order.
                let token = if order {
                    r.order_token(&event.data)
                } else {
                    r.token(&event.data)
                };
                if let Ok(Some(token)) = token {
                    hits.push(Hit {
                        queue: q.clone(),
                        token,
                        remember_ms: r.remember_ms,
                    });
                }
            }
        }
        Ok(hits)
    }

    /// Remembers each hit's token on every shard of its queue, then cancels the orders
    /// carrying it; counts into `out`. A queue deleted meanwhile is skipped.
    async fn apply_hits(&self, hits: &[Hit], out: &mut EventPosted) -> Result<()> {
        let now = self.now_ms();
        // Each cancellation is recorded in the order's history (by the script).
        let by = &CancelledBy::Event {
            event: out.name.clone(),
            event_id: out.id.clone(),
        };
        let mut conn = self.connection();
        for h in hits {
            let shards = match self.shards_of(&h.queue).await {
                Ok(n) => n,
                Err(crate::engine::error::Error::QueueNotFound { .. }) => continue,
                Err(e) => return Err(e),
            };
            let policy = crate::engine::flow::queue_flags(self, &h.queue, None)
                .await?
                .history;
            for keys in self.keyspace().shards(&h.queue, shards) {
                let cap = isize::try_from(MAX_REMEMBERED).unwrap_or(isize::MAX);
                let () = redis::pipe()
                    .cmd("ZADD")
                    .arg(&keys.remembered)
                    .arg("GT")
                    .arg(now + h.remember_ms)
                    .arg(&h.token)
                    .ignore()
                    .cmd("ZREMRANGEBYSCORE")
                    .arg(&keys.remembered)
                    .arg("-inf")
                    .arg(now)
                    .ignore()
                    .cmd("ZREMRANGEBYRANK")
                    .arg(&keys.remembered)
                    .arg(0)
                    .arg(-(cap + 1))
                    .ignore()
                    .query_async(&mut conn)
                    .await
                    .ctx("remembering an event")?;
                let mut cursor: Option<String> = None;
                loop {
                    let record = policy.cancel_target(&keys, self.now_ms());
                    let step = tag_bulk(
                        &mut conn,
                        &keys,
                        &h.token,
                        TAG_BATCH,
                        BulkAction::Cancel(by),
                        &record,
                        cursor.as_deref(),
                    )
                    .await?;
                    if step.affected > 0 {
                        out.cancelled += step.affected;
                        *out.queues.entry(h.queue.as_str().to_owned()).or_default() +=
                            step.affected;
                    }
                    if !step.more {
                        break;
                    }
                    cursor = step.last;
                }
            }
        }
        Ok(())
    }
}
