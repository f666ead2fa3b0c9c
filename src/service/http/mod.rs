//! The HTTP API of `delayq serve`: [`app`] builds the router (tests drive it in-process).
//!
//! Every error is `{"error":{"code":"...","message":"..."}}`: 400 bad input (the library's
//! input error codes, e.g. `invalid_id`, `payload_too_large`), 401 without a valid bearer
//! token on `/v1/...`, 404, 413 body over `max_body_bytes`, 503 Redis unavailable. Internal
//! details (Redis URLs, OS errors, panics) are logged, never returned.

mod openapi;

pub use openapi::openapi;

use crate::engine::client::Client;
use crate::engine::message::{Mode, NewOrder, Payload, ScheduleOutcome, When};
use crate::error::{Error, InvalidInput};
use crate::service::admin::{self, Admin};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use subtle::ConstantTimeEq;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    admin: Admin,
    tokens: Arc<Vec<String>>,
    /// When the gauges were last refreshed: at most once per second, whatever the scrape
    /// rate.
    gauges_at: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

impl AppState {
    /// State for `client`, accepting `tokens` (empty = open API).
    pub fn new(client: Client, tokens: Vec<String>) -> Self {
        AppState {
            admin: Admin::new(client),
            tokens: Arc::new(tokens),
            gauges_at: Arc::default(),
        }
    }
}

/// The router. `max_body_bytes` bounds every request body (413 above).
pub fn app(state: AppState, max_body_bytes: usize) -> Router {
    let v1 = Router::new()
        .route("/v1/queues", get(list_queues))
        .route(
            "/v1/queues/{queue}",
            put(create_queue).delete(delete_queue).post(queue_action),
        )
        .route("/v1/queues/{queue}/groups/{group}", delete(delete_group))
        .route(
            "/v1/queues/{queue}/messages/{id}",
            put(put_message).get(get_message).delete(delete_message),
        )
        .route("/v1/queues/{queue}/messages:batch", post(batch))
        .route("/v1/queues/{queue}/stats", get(stats))
        .route("/v1/queues/{queue}/dead", get(dead_list))
        .route("/v1/queues/{queue}/dead/replay", post(dead_replay))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(|| async { Json(openapi()) }))
        .merge(v1)
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method",
            )
        })
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(state)
}

/// An API error, rendered in the envelope.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    fn bad(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

impl From<InvalidInput> for ApiError {
    fn from(e: InvalidInput) -> Self {
        ApiError::bad(e.code(), e.to_string())
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        match e {
            Error::Invalid(i) => i.into(),
            e @ Error::QueueNotFound { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "queue_not_found", e.to_string())
            }
            e @ Error::ShardMismatch { .. } => {
                ApiError::new(StatusCode::CONFLICT, "shard_mismatch", e.to_string())
            }
            e @ Error::GroupNotFound { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "group_not_found", e.to_string())
            }
            e @ Error::GroupBusy { .. } => {
                ApiError::new(StatusCode::CONFLICT, "group_busy", e.to_string())
            }
            e @ Error::QueueNotEmpty { .. } => {
                ApiError::new(StatusCode::CONFLICT, "queue_not_empty", e.to_string())
            }
            e @ Error::NotReplicated { .. } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_replicated",
                e.to_string(),
            ),
            e if e.is_transient() => {
                tracing::warn!(error = %e, "redis unavailable");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "redis_unavailable",
                    "redis is unavailable; try again",
                )
            }
            e => {
                tracing::error!(error = %e, "request failed");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error",
                )
            }
        }
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// The token of an `Authorization: Bearer <token>` header; the scheme is case-insensitive
/// (RFC 7235).
fn bearer_token(v: &str) -> Option<&str> {
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Bearer-token check for `/v1/...`, comparing in constant time against every token.
async fn auth(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if st.tokens.is_empty() {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .unwrap_or("");
    let mut ok = subtle::Choice::from(0u8);
    for t in st.tokens.iter() {
        ok |= given.as_bytes().ct_eq(t.as_bytes());
    }
    if bool::from(ok) {
        next.run(req).await
    } else {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid bearer token is required",
        )
        .into_response()
    }
}

/// Parses a JSON body (413 over the limit, 400 when not valid JSON of the expected shape).
fn json_body<T: serde::de::DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> ApiResult<T> {
    let bytes = body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                "the request body is too large",
            )
        } else {
            ApiError::bad("invalid_body", "the request body could not be read")
        }
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad("invalid_json", format!("invalid request body: {e}")))
}

/// How a message says when it is due.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageBody {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    delay_ms: Option<i64>,
    #[serde(default)]
    due_at: Option<Value>,
    #[serde(default)]
    payload: Value,
    #[serde(default)]
    if_absent: bool,
}

impl MessageBody {
    fn when(&self) -> Result<When, InvalidInput> {
        match (&self.delay_ms, &self.due_at) {
            (Some(ms), None) => Ok(When::in_ms(*ms)),
            (None, Some(Value::String(s))) => When::parse_at(s),
            (None, Some(Value::Number(n))) => When::parse_at(&n.to_string()),
            (None, Some(_)) => Err(InvalidInput::DueTime {
                reason: "due_at must be an RFC 3339 string or unix milliseconds".into(),
            }),
            _ => Err(InvalidInput::DueTime {
                reason: "give exactly one of delay_ms or due_at".into(),
            }),
        }
    }
}

async fn put_message(
    State(st): State<AppState>,
    Path((queue, id)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let b: MessageBody = json_body(body)?;
    if b.id.is_some() {
        return Err(ApiError::bad(
            "invalid_body",
            "the id goes in the path, not the body",
        ));
    }
    let when = b.when()?;
    let order = NewOrder::new(id, when, Payload::from_value(&b.payload));
    let a = st.admin.schedule(&queue, order, mode(b.if_absent)).await?;
    let status = if a.outcome == ScheduleOutcome::Created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(a)).into_response())
}

fn mode(if_absent: bool) -> Mode {
    if if_absent {
        Mode::IfAbsent
    } else {
        Mode::Upsert
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody {
    messages: Vec<MessageBody>,
    #[serde(default)]
    if_absent: bool,
}

async fn batch(
    State(st): State<AppState>,
    Path(queue): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<admin::BatchAnswer>> {
    let b: BatchBody = json_body(body)?;
    admin::check_batch_len(b.messages.len())?;
    let mut orders = Vec::with_capacity(b.messages.len());
    for (index, m) in b.messages.iter().enumerate() {
        let in_batch = |e: InvalidInput| InvalidInput::InBatch {
            index,
            source: Box::new(e),
        };
        let id = m.id.clone().ok_or_else(|| {
            in_batch(InvalidInput::Id {
                reason: "missing".into(),
            })
        })?;
        if m.if_absent {
            return Err(in_batch(InvalidInput::Option {
                name: "if_absent",
                reason: "set if_absent for the whole batch, not per message".into(),
            })
            .into());
        }
        let when = m.when().map_err(in_batch)?;
        orders.push(NewOrder::new(id, when, Payload::from_value(&m.payload)));
    }
    let a = st
        .admin
        .schedule_batch(&queue, &orders, mode(b.if_absent))
        .await?;
    Ok(Json(a))
}

async fn get_message(
    State(st): State<AppState>,
    Path((queue, id)): Path<(String, String)>,
) -> ApiResult<Json<crate::engine::history::OrderHistory>> {
    match st.admin.get(&queue, &id).await? {
        Ok(o) => Ok(Json(o)),
        Err(_) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such order: never scheduled, cancelled, or dispatched longer ago than the history retention",
        )),
    }
}

async fn delete_message(
    State(st): State<AppState>,
    Path((queue, id)): Path<(String, String)>,
) -> ApiResult<Json<admin::CancelledAnswer>> {
    match st.admin.cancel(&queue, &id).await? {
        Ok(a) => Ok(Json(a)),
        Err(_) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "the order is not scheduled (never, cancelled, or already dispatched)",
        )),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateQueueBody {
    shards: Option<u16>,
    /// A duration (`24h`, `0s` = no history).
    history_retention: Option<String>,
}

async fn create_queue(
    State(st): State<AppState>,
    Path(queue): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let b: CreateQueueBody = json_body(body)?;
    let retention = b
        .history_retention
        .as_deref()
        .map(|t| crate::engine::duration::parse_duration("history_retention", t))
        .transpose()?;
    let a = st.admin.create_queue(&queue, b.shards, retention).await?;
    let status = if a.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(a)).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ForceQuery {
    force: Option<bool>,
}

async fn delete_queue(
    State(st): State<AppState>,
    Path(queue): Path<String>,
    q: Result<Query<ForceQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<admin::QueueDeletedAnswer>> {
    let Query(q) = q.map_err(|e| ApiError::bad("invalid_query", e.body_text()))?;
    Ok(Json(
        st.admin
            .delete_queue(&queue, q.force.unwrap_or(false))
            .await?,
    ))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    group: Option<String>,
}

/// `POST /v1/queues/{q}:pause` and `POST /v1/queues/{q}:resume` (queue names cannot hold a
/// colon, so the suffix is unambiguous).
async fn queue_action(
    State(st): State<AppState>,
    Path(target): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<crate::engine::flow::PauseState>> {
    let (queue, paused) = match target.rsplit_once(':') {
        Some((q, "pause")) => (q, true),
        Some((q, "resume")) => (q, false),
        _ => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such route (POST /v1/queues/{queue}:pause or :resume)",
            ));
        }
    };
    let b: PauseBody = match body {
        Ok(bytes) if bytes.is_empty() => PauseBody::default(),
        other => json_body(other)?,
    };
    Ok(Json(
        st.admin
            .set_paused(queue, b.group.as_deref(), paused)
            .await?,
    ))
}

async fn delete_group(
    State(st): State<AppState>,
    Path((queue, group)): Path<(String, String)>,
    q: Result<Query<ForceQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<admin::GroupDeletedAnswer>> {
    let Query(q) = q.map_err(|e| ApiError::bad("invalid_query", e.body_text()))?;
    Ok(Json(
        st.admin
            .delete_group(&queue, &group, q.force.unwrap_or(false))
            .await?,
    ))
}

async fn list_queues(State(st): State<AppState>) -> ApiResult<Json<admin::QueuesAnswer>> {
    Ok(Json(st.admin.queues().await?))
}

async fn stats(
    State(st): State<AppState>,
    Path(queue): Path<String>,
) -> ApiResult<Json<admin::StatsAnswer>> {
    Ok(Json(st.admin.stats(Some(&queue)).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadQuery {
    group: Option<String>,
    limit: Option<usize>,
    after: Option<String>,
}

async fn dead_list(
    State(st): State<AppState>,
    Path(queue): Path<String>,
    q: Result<Query<DeadQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<crate::engine::dead::DeadPage>> {
    let Query(q) = q.map_err(|e| ApiError::bad("invalid_query", e.body_text()))?;
    let page = st
        .admin
        .dead_list(&queue, q.group.as_deref(), q.after.as_deref(), q.limit)
        .await?;
    Ok(Json(page))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    #[serde(default)]
    all: bool,
    #[serde(default)]
    entry_ids: Vec<String>,
    #[serde(default)]
    group: Option<String>,
}

async fn dead_replay(
    State(st): State<AppState>,
    Path(queue): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<admin::ReplayedAnswer>> {
    let b: ReplayBody = json_body(body)?;
    let sel = admin::selection(b.all, b.entry_ids)?;
    let a = st
        .admin
        .dead_replay(&queue, b.group.as_deref(), &sel)
        .await?;
    Ok(Json(a))
}

async fn readyz(State(st): State<AppState>) -> Response {
    let ping = tokio::time::timeout(Duration::from_secs(2), async {
        redis::cmd("PING")
            .query_async::<String>(&mut st.admin.client().connection())
            .await
    })
    .await;
    match ping {
        Ok(Ok(_)) => Json(json!({"status": "ready"})).into_response(),
        _ => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "redis_unavailable",
            "redis is unavailable",
        )
        .into_response(),
    }
}

/// Least time between two refreshes of the gauges.
const GAUGE_REFRESH: Duration = Duration::from_secs(1);

async fn metrics(State(st): State<AppState>) -> Response {
    // Gauges are refreshed on scrape, at most once per second (the lock is released before
    // the Redis calls), over registered queues only.
    let due = {
        let mut at = st.gauges_at.lock().unwrap_or_else(|p| p.into_inner());
        let due = at.is_none_or(|t| t.elapsed() >= GAUGE_REFRESH);
        if due {
            *at = Some(std::time::Instant::now());
        }
        due
    };
    if due && let Ok(all) = st.admin.client().stats_all().await {
        for s in &all {
            crate::service::metrics::record_stats(s);
        }
    }
    let text = crate::service::metrics::handle()
        .map(|h| h.render())
        .unwrap_or_default();
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    (headers, text).into_response()
}
