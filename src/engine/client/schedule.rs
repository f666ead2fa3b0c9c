//! Scheduling: a batch's I/O (the registry, the `enqueue.lua` calls, durable writes)
//! around its pure steps in [`super::batch`] (validate, plan, fold).

use super::Client;
use super::batch;
use super::durable::Wait;
use super::options::Durability;
use crate::engine::error::{Error, InvalidInput, Result};
use crate::engine::keys::{QueueName, ShardKeys};
use crate::engine::message::{Mode, NewOrder, Scheduled, When};
use crate::engine::scripts::{self, EnqueueArg, Enqueued, ScriptRefusal};
use crate::engine::{redact, telemetry, trace};
use futures_util::future::join_all;
use tracing::Instrument;

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
    /// sent many per script call; each call is atomic (a call refused by Redis, e.g. out of
    /// memory, writes nothing). When a call fails after others succeeded, the error is
    /// [`Error::PartialBatch`], which says for every order whether it was written, not
    /// written, or may have been; repeating the batch is safe (scheduling is idempotent).
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
        let dues = batch::validate(orders, mode, now, self.inner.opts.max_payload_bytes)?;
        let mut qref = self.queue_ref(&queue).await?;
        if orders.is_empty() {
            return Ok(Vec::new());
        }
        let if_absent = mode == Mode::IfAbsent;
        // Traced orders store their context in front of the payload (see `engine::trace`);
        // the others keep exactly the bytes they always had.
        let producer = trace::Producer::start(
            queue.as_str(),
            orders.len(),
            match orders {
                [one] => Some(one.id.as_str()),
                _ => None,
            },
            orders.iter().filter_map(|o| o.trace.as_ref()).collect(),
        );
        let (mut stored, mut tokens) = stored_texts(&producer, orders, qref.cancel_rules())?;
        // The orders' own rules are made known to events before any order carries them.
        self.register_order_rules(&queue, orders).await?;
        let mut texts = Texts {
            orders,
            stored: &stored,
            tokens: &tokens,
        };
        let mut calls = self.plan_enqueue(&queue, qref.shards, orders);
        let mut outcomes = self
            .enqueue_calls(&calls, &qref.epoch_arg(), &texts, &dues, now, if_absent)
            .instrument(producer.span.clone())
            .await;
        // Every call refused by enqueue.lua (nothing written): the queue was deleted, or
        // deleted and created again. Re-read the registry once and retry with what it says.
        if outcomes
            .iter()
            .all(|o| o.as_ref().is_err_and(|e| ScriptRefusal::of(e).is_some()))
        {
            self.forget(&queue);
            let fresh = self.queue_ref(&queue).await?;
            if fresh == qref {
                return Err(Error::QueueNotFound {
                    queue: queue.as_str().to_owned(),
                });
            }
            qref = fresh;
            // The rules may have changed: the orders' match tokens are computed again.
            (stored, tokens) = stored_texts(&producer, orders, qref.cancel_rules())?;
            texts = Texts {
                orders,
                stored: &stored,
                tokens: &tokens,
            };
            calls = self.plan_enqueue(&queue, qref.shards, orders);
            outcomes = self
                .enqueue_calls(&calls, &qref.epoch_arg(), &texts, &dues, now, if_absent)
                .instrument(producer.span.clone())
                .await;
        }
        let outcomes: Vec<_> = outcomes
            .into_iter()
            .map(|o| match o {
                Err(e) if ScriptRefusal::of(&e).is_some() => {
                    self.forget(&queue);
                    Err(Error::QueueNotFound {
                        queue: queue.as_str().to_owned(),
                    })
                }
                other => other,
            })
            .collect();
        let groups: Vec<Vec<usize>> = calls.iter().map(|(_, idxs)| idxs.clone()).collect();
        let folded = batch::fold(&groups, outcomes, orders.len());
        if let Some(due) = folded.earliest_written(&dues) {
            self.inner.wake.scheduled(queue.as_str(), due);
        }
        telemetry::scheduled(queue.as_str(), folded.written());
        let early = folded.cancelled_by_event();
        if early > 0 {
            telemetry::cancelled_by(queue.as_str(), "event", early);
        }
        if let Some(e) = folded.failure() {
            producer.failed(&redact::error(&e.to_string()));
        }
        folded.answer(orders, &dues)
    }

    /// The batch's script calls ([`batch::plan`]), each with its shard's keys.
    fn plan_enqueue(
        &self,
        queue: &QueueName,
        shards: u16,
        orders: &[NewOrder],
    ) -> Vec<(ShardKeys, Vec<usize>)> {
        batch::plan(orders, shards)
            .into_iter()
            .map(|(shard, idxs)| (self.shard_keys(queue, shard), idxs))
            .collect()
    }

    /// Runs the planned enqueue calls; returns each call's outcomes (or its error), in call
    /// order. `Leader`: in flight together on the shared connection. `Replicated`: see
    /// [`Client::enqueue_replicated`].
    async fn enqueue_calls(
        &self,
        calls: &[(ShardKeys, Vec<usize>)],
        epoch: &str,
        texts: &Texts<'_>,
        dues: &[i64],
        now: i64,
        if_absent: bool,
    ) -> Vec<Result<Vec<Enqueued>>> {
        let orders = texts.orders;
        let args: Vec<Vec<EnqueueArg<'_>>> = calls
            .iter()
            .map(|(_, idxs)| {
                idxs.iter()
                    .map(|&i| EnqueueArg {
                        id: &orders[i].id,
                        due_ms: dues[i],
                        payload: texts.payload(i),
                        priority: orders[i].priority,
                        key: orders[i].key.as_deref(),
                        rules: crate::engine::time_rules::enqueue_rules_arg(
                            orders[i].repeat,
                            orders[i].debounce.as_ref(),
                        ),
                        tagged: !orders[i].tags.is_empty() || texts.has_tokens(i),
                    })
                    .collect()
            })
            .collect();
        match self.durable_wait() {
            None => {
                join_all(
                    calls.iter().zip(&args).map(|((keys, _), args)| {
                        let mut conn = self.inner.conn.clone();
                        async move {
                            scripts::enqueue(&mut conn, keys, epoch, if_absent, now, args).await
                        }
                    }),
                )
                .await
            }
            Some(wait) => {
                self.enqueue_replicated(calls, epoch, &args, if_absent, now, wait)
                    .await
            }
        }
    }

    /// The `WAIT` this handle's writes make (`None`: [`Durability::Leader`]).
    pub(super) fn durable_wait(&self) -> Option<Wait> {
        match self.durability {
            Durability::Leader => None,
            Durability::Replicated { replicas, timeout } => Some(Wait {
                replicas,
                every: false,
                timeout,
            }),
            Durability::EveryReplica { timeout } => Some(Wait {
                replicas: 1,
                every: true,
                timeout,
            }),
        }
    }
}

/// What each order of a schedule call stores as its payload: the JSON text, or (a traced
/// order, an order with an expiry) its prefixes and the JSON text.
struct Texts<'a> {
    orders: &'a [NewOrder],
    /// Per order, the stored text of a traced or expiring order (empty when none is).
    stored: &'a [Option<String>],
    /// Per order, its cancel-on-event match tokens (empty when the queue has no rules).
    tokens: &'a [Vec<String>],
}

/// Per order: the stored text (empty when no order needs one) and the match tokens.
type StoredTexts = (Vec<Option<String>>, Vec<Vec<String>>);

/// Per order, the stored text (see [`Texts`]) and the cancel-on-event match tokens of the
/// queue's `rules` and of the order's own (see [`crate::engine::events`]; no rules: no
/// work). A matched value too long is refused naming the order's index.
fn stored_texts(
    producer: &trace::Producer,
    orders: &[NewOrder],
    rules: &[crate::engine::events::CancelRule],
) -> Result<StoredTexts> {
    let mut tokens: Vec<Vec<String>> = Vec::new();
    if !rules.is_empty() || orders.iter().any(|o| !o.cancel_on.is_empty()) {
        for (index, o) in orders.iter().enumerate() {
            let doc = o.payload.to_value();
            let mut mine = Vec::new();
            // The queue's rules, then the order's own (their tokens carry their window).
            let own = o.cancel_on.iter().map(|r| r.order_token(&doc));
            for t in rules.iter().map(|r| r.token(&doc)).chain(own) {
                match t {
                    Ok(Some(t)) => mine.push(t),
                    Ok(None) => {}
                    Err(e) => {
                        return Err(InvalidInput::InBatch {
                            index,
                            source: Box::new(e),
                        }
                        .into());
                    }
                }
            }
            tokens.push(mine);
        }
    }
    let has = |i: usize| tokens.get(i).is_some_and(|t| !t.is_empty());
    // Orders with an `expires_after` store it in front of everything (see
    // `engine::expiry`), keyed orders their key next (see `engine::order_key`), tagged
    // orders their tags (and match tokens) after that (see `engine::tags`), then the trace
    // context.
    let expiring = orders.iter().any(|o| o.expires_after_ms.is_some());
    let tagged = orders
        .iter()
        .enumerate()
        .any(|(i, o)| !o.tags.is_empty() || has(i));
    let keyed = orders.iter().any(|o| o.key.is_some());
    if !(producer.is_traced() || expiring || tagged || keyed) {
        return Ok((Vec::new(), tokens));
    }
    let stored = orders
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let traced = producer
                .stored(o.trace.as_ref())
                .map(|c| c.encode(o.payload.as_str()));
            let traced = if o.tags.is_empty() && !has(i) {
                traced
            } else {
                let all: Vec<String> = match tokens.get(i) {
                    Some(t) if !t.is_empty() => o.tags.iter().chain(t).cloned().collect(),
                    _ => o.tags.clone(),
                };
                Some(crate::engine::tags::encode(
                    &all,
                    traced.as_deref().unwrap_or(o.payload.as_str()),
                ))
            };
            let keyed = match &o.key {
                Some(k) => Some(crate::engine::order_key::encode(
                    k,
                    traced.as_deref().unwrap_or(o.payload.as_str()),
                )),
                None => traced,
            };
            match o.expires_after_ms {
                Some(e) => Some(crate::engine::expiry::encode(
                    e,
                    keyed.as_deref().unwrap_or(o.payload.as_str()),
                )),
                None => keyed,
            }
        })
        .collect();
    Ok((stored, tokens))
}

impl Texts<'_> {
    fn has_tokens(&self, i: usize) -> bool {
        self.tokens.get(i).is_some_and(|t| !t.is_empty())
    }

    fn payload(&self, i: usize) -> &str {
        match self.stored.get(i) {
            Some(Some(text)) => text,
            _ => self.orders[i].payload.as_str(),
        }
    }
}
