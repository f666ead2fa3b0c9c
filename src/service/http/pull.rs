//! Pull consumption over HTTP: `POST /v1/queues/{queue}/groups/{group}:receive`, `:ack`,
//! `:nack` and `:extend`, each a call of the library's [`Puller`] (the worker's own scripts:
//! see `engine::worker::pull`).
//!
//! Every `delayq serve` process consumes as the consumer `http` and signs receipts with a
//! key derived from the API tokens, so a receipt issued by one process of a deployment is
//! honoured by the others. The queue must be registered (404 otherwise); the group is
//! joined on its first receive, as a starting worker joins it.
//!
//! **Long polling.** A receive with `wait_ms` (0..=20,000) waits that long for an entry
//! when none is due ([`Puller::receive_wait`]: woken by this process's dispatcher and by
//! other processes' wake-ups, no Redis polling in a loop). A waiting receive holds its
//! connection (it counts against `http.max_connections` like any open connection) and
//! nothing else; it answers at once, empty, when serve shuts down, and never past the
//! request deadline: the wait is cut to `http.request_timeout` less a margin.

use super::AppState;
use super::error::{ApiError, ApiResult};
use super::messages::json_body;
use crate::engine::error::Error;
use crate::engine::keys::QueueName;
use crate::engine::worker::{
    DEFAULT_LEASE, Extended, MAX_LEASE, MAX_RECEIVE, MAX_WAIT, MIN_LEASE, Nack, PullDelivery,
    Puller, Settled, WorkerOptions,
};
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The consumer name of every HTTP pull (one per deployment: receipts move between
/// processes).
pub const CONSUMER: &str = "http";
/// Most (queue, group) pullers kept; past it the map starts again (a puller holds no
/// state a receipt needs: any puller of the same group takes its receipts).
const MAX_PULLERS: usize = 1024;

/// A group declared `kind = "pull"` in this process's configuration.
#[derive(Debug, Clone)]
pub(crate) struct PullGroup {
    /// Its worker options (`max_attempts`, backoff, visibility timeout, rate limit).
    pub(crate) opts: WorkerOptions,
    /// The lease of a receive that names none.
    pub(crate) lease: Duration,
}

/// A puller and the lease its receives default to.
type Entry = (Arc<Puller>, Duration);

/// The pullers of this process, one per (queue, group), made on first use.
pub(crate) struct Pullers {
    map: Mutex<HashMap<(String, String), Entry>>,
    /// The groups declared `kind = "pull"` here, by (queue, group): their options.
    declared: HashMap<(String, String), PullGroup>,
    /// The receipt key: derived from the API tokens (random without tokens; empty only
    /// when the operating system gave no random bytes, then each puller keeps its own).
    key: Vec<u8>,
}

impl Pullers {
    /// Pullers signing with a key derived from `tokens`.
    pub(crate) fn new(tokens: &[String]) -> Self {
        let key = if tokens.is_empty() {
            // This process's pullers' own random key (receipts then stay with it).
            Puller::random_key().unwrap_or_default()
        } else {
            let mut h = Sha256::new();
            h.update(b"delayq-pull-receipts\0");
            for t in tokens {
                h.update(t.as_bytes());
                h.update(b"\0");
            }
            h.finalize().to_vec()
        };
        Pullers {
            map: Mutex::default(),
            declared: HashMap::new(),
            key,
        }
    }

    /// The same pullers, with the options of the groups declared `kind = "pull"`.
    pub(crate) fn with_declared(mut self, declared: HashMap<(String, String), PullGroup>) -> Self {
        self.declared = declared;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Entry>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The puller of `queue`/`group` and its default lease: 404 when the queue is not
/// registered, 409 `wrong_group_kind` when the group is declared with a kind other than
/// `pull` (checked when this process first pulls it). A group declared `pull` in this
/// process's configuration gets its options; one recorded `pull` by another process, the
/// defaults; an undeclared one is 404 `group_not_found` when this configuration declares
/// pull groups, else pulled with the defaults. No lock is held across the registry lookups.
async fn puller(st: &AppState, queue: &str, group: &str) -> ApiResult<Entry> {
    let k = (queue.to_owned(), group.to_owned());
    if let Some(p) = st.pullers.lock().get(&k) {
        return Ok(p.clone());
    }
    let client = &st.client;
    let q = QueueName::new(queue).map_err(Error::from)?;
    if client.lookup(&q).await?.is_none() {
        return Err(Error::QueueNotFound {
            queue: queue.to_owned(),
        }
        .into());
    }
    crate::engine::keys::validate_member_name("group", group).map_err(Error::from)?;
    let kind = st.client.admin().group_kind(queue, group).await?;
    if let Some(kind) = kind
        .as_deref()
        .filter(|k| *k != crate::engine::admin::kinds::PULL)
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "wrong_group_kind",
            format!(
                "group {group:?} of queue {queue:?} is declared with kind = {kind:?}: serve's handler consumes it, pulls may not"
            ),
        ));
    }
    let (opts, lease) = match st.pullers.declared.get(&k) {
        Some(g) => (g.opts.clone(), g.lease),
        // This configuration declares its pull groups: any other is a typo or a group
        // nobody set up, refused before a consumer group is created (a deployment that
        // declares none pulls any group with the defaults). A group another process
        // declared `pull` (recorded in the registry) is accepted, with the defaults.
        None if !st.pullers.declared.is_empty() && kind.is_none() => {
            return Err(undeclared(queue, group));
        }
        None => (WorkerOptions::default(), DEFAULT_LEASE),
    };
    let mut p = Puller::for_registered(client, queue, group, opts.consumer(CONSUMER))?;
    if !st.pullers.key.is_empty() {
        p = p.with_key(st.pullers.key.clone());
    }
    let p = (Arc::new(p), lease);
    let mut map = st.pullers.lock();
    if map.len() >= MAX_PULLERS {
        map.clear();
    }
    Ok(map.entry(k).or_insert(p).clone())
}

/// 404 `group_not_found`: a pull of a group that serve's configuration, which declares its
/// pull groups, does not declare (and no process recorded as `pull`).
fn undeclared(queue: &str, group: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "group_not_found",
        format!(
            "group {group:?} of queue {queue:?} is not declared for pulls: serve's configuration declares its pull groups ([[handlers]] kind = \"pull\") and this is not one of them"
        ),
    )
}

/// `POST .../{group}:receive` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReceiveBody {
    max: Option<usize>,
    wait_ms: Option<u64>,
    lease_ms: Option<u64>,
}

/// `POST .../{group}:ack` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AckBody {
    receipts: Vec<String>,
}

/// `POST .../{group}:nack` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NackBody {
    receipt: String,
    retry_in_ms: Option<u64>,
    #[serde(default)]
    dead: bool,
    error: Option<String>,
}

/// `POST .../{group}:extend` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExtendBody {
    receipts: Vec<String>,
    lease_ms: u64,
}

/// What `:receive` answers.
#[derive(Serialize)]
struct ReceiveAnswer {
    deliveries: Vec<DeliveryOut>,
}

/// One delivery as `:receive` answers it.
#[derive(Serialize)]
struct DeliveryOut {
    id: String,
    /// Byte for byte as scheduled.
    payload: Box<serde_json::value::RawValue>,
    priority: &'static str,
    attempt: u32,
    due_at_ms: i64,
    dispatched_at_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    enqueued_at_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tracestate: Option<String>,
    /// The order's key (issue 42), for a keyed order only.
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    receipt: String,
    lease_until_ms: i64,
}

impl From<PullDelivery> for DeliveryOut {
    fn from(p: PullDelivery) -> Self {
        let d = p.delivery;
        DeliveryOut {
            payload: crate::engine::message::raw_json(&d.payload_text),
            id: d.id,
            priority: d.priority.as_str(),
            attempt: d.attempt,
            due_at_ms: d.due_at_ms,
            dispatched_at_ms: d.dispatched_at_ms,
            enqueued_at_ms: d.enqueued_at_ms,
            traceparent: d.trace.as_ref().map(|t| t.traceparent().to_owned()),
            tracestate: d
                .trace
                .as_ref()
                .and_then(|t| t.tracestate().map(str::to_owned)),
            key: d.key,
            receipt: p.receipt,
            lease_until_ms: p.lease_until_ms,
        }
    }
}

/// One receipt's result in an `:ack` or `:extend` answer.
#[derive(Serialize)]
struct ReceiptResult {
    /// `acked`, `extended` or `lease_lost`.
    status: &'static str,
    /// The delivery's new receipt (extended only).
    #[serde(skip_serializing_if = "Option::is_none")]
    receipt: Option<String>,
}

fn lease_lost() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "lease_lost",
        "the receipt's lease ran out and the delivery was taken over (or it was settled already); nothing was changed",
    )
}

fn bad_option(field: &'static str, reason: String) -> ApiError {
    Error::from(crate::engine::error::InvalidInput::Option {
        name: field,
        reason,
    })
    .into()
}

fn ms_of(field: &'static str, ms: u64) -> ApiResult<Duration> {
    let d = Duration::from_millis(ms);
    if d < MIN_LEASE || d > MAX_LEASE {
        return Err(bad_option(
            field,
            format!(
                "{ms} ms is outside {}..={} ms",
                MIN_LEASE.as_millis(),
                MAX_LEASE.as_millis()
            ),
        ));
    }
    Ok(d)
}

/// `POST /v1/queues/{queue}/groups/{group}:receive|:ack|:nack|:extend`.
pub(super) async fn group_action(
    State(st): State<AppState>,
    Path((queue, target)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let Some((group, action)) = target.rsplit_once(':') else {
        return Err(no_route());
    };
    match action {
        "receive" => receive(&st, &queue, group, json_body(body)?).await,
        "ack" => ack(&st, &queue, group, json_body(body)?).await,
        "nack" => nack(&st, &queue, group, json_body(body)?).await,
        "extend" => extend(&st, &queue, group, json_body(body)?).await,
        _ => Err(no_route()),
    }
}

fn no_route() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such route (POST /v1/queues/{queue}/groups/{group}:receive, :ack, :nack or :extend)",
    )
}

async fn receive(st: &AppState, queue: &str, group: &str, b: ReceiveBody) -> ApiResult<Response> {
    let max = b.max.unwrap_or(1);
    if max == 0 || max > MAX_RECEIVE {
        return Err(bad_option("max", format!("{max}; 1..={MAX_RECEIVE}")));
    }
    let wait = Duration::from_millis(b.wait_ms.unwrap_or(0));
    if wait > MAX_WAIT {
        return Err(bad_option(
            "wait_ms",
            format!("{} ms; 0..={} ms", wait.as_millis(), MAX_WAIT.as_millis()),
        ));
    }
    let lease = b.lease_ms.map(|l| ms_of("lease_ms", l)).transpose()?;
    let (p, default_lease) = puller(st, queue, group).await?;
    let lease = lease.unwrap_or(default_lease);
    let wait = wait.min(wait_room(st.limits.request_timeout));
    let got = p.receive_wait(max, lease, wait, &st.shutdown).await?;
    // Serialized as a struct, not through `json!` (a `Value` would re-print each payload:
    // keys sorted, numbers rewritten), so every payload goes out byte for byte.
    let deliveries: Vec<DeliveryOut> = got.into_iter().map(DeliveryOut::from).collect();
    Ok(Json(ReceiveAnswer { deliveries }).into_response())
}

/// The longest a receive may wait within the request deadline `deadline`: the deadline
/// less a quarter of it (at most 2 s), kept for the read and the answer.
fn wait_room(deadline: Duration) -> Duration {
    deadline.saturating_sub((deadline / 4).min(Duration::from_secs(2)))
}

async fn ack(st: &AppState, queue: &str, group: &str, b: AckBody) -> ApiResult<Response> {
    let (p, _) = puller(st, queue, group).await?;
    let receipts: Vec<&str> = b.receipts.iter().map(String::as_str).collect();
    let settled = p.ack(&receipts).await?;
    if settled.iter().all(|s| *s == Settled::LeaseLost) {
        return Err(lease_lost());
    }
    let results: Vec<ReceiptResult> = settled
        .iter()
        .map(|s| ReceiptResult {
            status: if *s == Settled::Done {
                "acked"
            } else {
                "lease_lost"
            },
            receipt: None,
        })
        .collect();
    Ok(Json(serde_json::json!({ "results": results })).into_response())
}

async fn nack(st: &AppState, queue: &str, group: &str, b: NackBody) -> ApiResult<Response> {
    let error = b
        .error
        .unwrap_or_else(|| "nacked by the consumer".to_owned());
    let how = if b.dead {
        if b.retry_in_ms.is_some() {
            return Err(bad_option(
                "retry_in_ms",
                "not with dead: a dead letter is not retried".into(),
            ));
        }
        Nack::Dead { error }
    } else {
        Nack::Retry {
            after: b.retry_in_ms.map(Duration::from_millis),
            error,
        }
    };
    let (p, _) = puller(st, queue, group).await?;
    match p.nack(&b.receipt, how).await? {
        Settled::LeaseLost => Err(lease_lost()),
        _ => Ok(Json(serde_json::json!({ "status": "settled" })).into_response()),
    }
}

async fn extend(st: &AppState, queue: &str, group: &str, b: ExtendBody) -> ApiResult<Response> {
    let lease = ms_of("lease_ms", b.lease_ms)?;
    let (p, _) = puller(st, queue, group).await?;
    let receipts: Vec<&str> = b.receipts.iter().map(String::as_str).collect();
    let extended = p.extend(&receipts, lease).await?;
    if extended.iter().all(|e| *e == Extended::LeaseLost) {
        return Err(lease_lost());
    }
    let results: Vec<ReceiptResult> = extended
        .into_iter()
        .map(|e| match e {
            Extended::Receipt(r) => ReceiptResult {
                status: "extended",
                receipt: Some(r),
            },
            _ => ReceiptResult {
                status: "lease_lost",
                receipt: None,
            },
        })
        .collect();
    Ok(Json(serde_json::json!({ "results": results })).into_response())
}
