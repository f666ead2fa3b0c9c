//! The HTTP API of `delayq serve`: [`app`] builds the router (tests drive it in-process).
//!
//! Every error is `{"error":{"code":"...","message":"..."}}`: 400 bad input (the library's
//! input error codes, e.g. `invalid_id`, `payload_too_large`), 401 without a valid bearer
//! token on `/v1/...`, 404, 413 body over `max_body_bytes`, 503 Redis unavailable. Internal
//! details (Redis URLs, OS errors, panics) are logged, never returned.

use crate::client::Client;
use crate::dead::Selection;
use crate::error::{Error, InvalidInput};
use crate::order::{CancelOutcome, Mode, NewOrder, Payload, ScheduleOutcome, When};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use subtle::ConstantTimeEq;

/// Most messages in one batch request.
pub const MAX_BATCH: usize = 10_000;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    client: Client,
    tokens: Arc<Vec<String>>,
}

impl AppState {
    /// State for `client`, accepting `tokens` (empty = open API).
    pub fn new(client: Client, tokens: Vec<String>) -> Self {
        AppState {
            client,
            tokens: Arc::new(tokens),
        }
    }
}

/// The router. `max_body_bytes` bounds every request body (413 above).
pub fn app(state: AppState, max_body_bytes: usize) -> Router {
    let v1 = Router::new()
        .route("/v1/queues", get(list_queues))
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

/// Bearer-token check for `/v1/...`, comparing in constant time against every token.
async fn auth(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if st.tokens.is_empty() {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
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

fn scheduled_json(queue: &str, s: &crate::order::Scheduled) -> Value {
    json!({"queue": queue, "id": s.id, "due_at_ms": s.due_at_ms, "outcome": s.outcome})
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
    let mode = if b.if_absent {
        Mode::IfAbsent
    } else {
        Mode::Upsert
    };
    let s = st
        .client
        .schedule_with(
            &queue,
            NewOrder::new(id, when, Payload::from_value(&b.payload)),
            mode,
        )
        .await?;
    let status = if s.outcome == ScheduleOutcome::Created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(scheduled_json(&queue, &s))).into_response())
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
) -> ApiResult<Json<Value>> {
    let b: BatchBody = json_body(body)?;
    if b.messages.len() > MAX_BATCH {
        return Err(ApiError::bad(
            "batch_too_large",
            format!(
                "{} messages; at most {MAX_BATCH} per call",
                b.messages.len()
            ),
        ));
    }
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
    let mode = if b.if_absent {
        Mode::IfAbsent
    } else {
        Mode::Upsert
    };
    let results = st.client.schedule_many(&queue, &orders, mode).await?;
    let results: Vec<Value> = results.iter().map(|s| scheduled_json(&queue, s)).collect();
    Ok(Json(json!({ "results": results })))
}

async fn get_message(
    State(st): State<AppState>,
    Path((queue, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    match st.client.get(&queue, &id).await? {
        Some(o) => Ok(Json(
            json!({"queue": queue, "id": o.id, "due_at_ms": o.due_at_ms, "payload": o.payload}),
        )),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "the order is not scheduled",
        )),
    }
}

async fn delete_message(
    State(st): State<AppState>,
    Path((queue, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    match st.client.cancel(&queue, &id).await? {
        CancelOutcome::Cancelled => Ok(Json(json!({"outcome": "cancelled"}))),
        CancelOutcome::NotFound => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "the order is not scheduled (never, cancelled, or already dispatched)",
        )),
    }
}

async fn list_queues(State(st): State<AppState>) -> ApiResult<Json<Value>> {
    Ok(Json(json!({"queues": st.client.queues().await?})))
}

async fn stats(State(st): State<AppState>, Path(queue): Path<String>) -> ApiResult<Json<Value>> {
    Ok(Json(json!({"queues": [st.client.stats(&queue).await?]})))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadQuery {
    group: Option<String>,
    limit: Option<usize>,
}

async fn dead_list(
    State(st): State<AppState>,
    Path(queue): Path<String>,
    q: Result<Query<DeadQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Value>> {
    let Query(q) = q.map_err(|e| ApiError::bad("invalid_query", e.body_text()))?;
    let list = st
        .client
        .dead_list(
            &queue,
            q.group.as_deref(),
            q.limit.unwrap_or(100).min(10_000),
        )
        .await?;
    Ok(Json(serde_json::to_value(list).unwrap_or(Value::Null)))
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
) -> ApiResult<Json<Value>> {
    let b: ReplayBody = json_body(body)?;
    let sel = match (b.all, b.entry_ids.is_empty()) {
        (true, true) => Selection::All,
        (false, false) => Selection::Ids(b.entry_ids),
        _ => {
            return Err(ApiError::bad(
                "invalid_body",
                "give either \"all\": true or a non-empty \"entry_ids\"",
            ));
        }
    };
    if let Some(g) = &b.group {
        crate::keys::validate_member_name("group", g)?;
    }
    let n = st
        .client
        .dead_replay(&queue, b.group.as_deref(), &sel)
        .await?;
    Ok(Json(json!({"replayed": n})))
}

async fn readyz(State(st): State<AppState>) -> Response {
    let ping = tokio::time::timeout(Duration::from_secs(2), async {
        redis::cmd("PING")
            .query_async::<String>(&mut st.client.connection())
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

async fn metrics(State(st): State<AppState>) -> Response {
    // Gauges are refreshed on scrape, so they are never staler than the scrape itself.
    if let Ok(all) = st.client.stats_all().await {
        for s in &all {
            crate::metrics::record_stats(s);
        }
    }
    let text = crate::metrics::handle()
        .map(|h| h.render())
        .unwrap_or_default();
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    (headers, text).into_response()
}

/// The API described as OpenAPI 3.
pub fn openapi() -> Value {
    let err = json!({"$ref": "#/components/schemas/Error"});
    let e =
        |desc: &str| json!({"description": desc, "content": {"application/json": {"schema": err}}});
    let q = json!({"name": "queue", "in": "path", "required": true, "schema": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$"}});
    let id = json!({"name": "id", "in": "path", "required": true, "schema": {"type": "string", "minLength": 1, "maxLength": 256}});
    let msg = json!({
        "type": "object", "additionalProperties": false,
        "properties": {
            "delay_ms": {"type": "integer", "minimum": 0},
            "due_at": {"oneOf": [{"type": "string", "format": "date-time"}, {"type": "integer"}]},
            "payload": {},
            "if_absent": {"type": "boolean"}
        }
    });
    let scheduled = json!({"type": "object", "properties": {
        "queue": {"type": "string"}, "id": {"type": "string"}, "due_at_ms": {"type": "integer"},
        "outcome": {"type": "string", "enum": ["created", "updated", "unchanged"]}}});
    let common =
        json!({"401": e("missing or invalid bearer token"), "503": e("redis unavailable")});
    let with = |mut base: Value, extra: Value| {
        if let (Some(b), Some(x)) = (base.as_object_mut(), extra.as_object()) {
            for (k, v) in x {
                b.insert(k.clone(), v.clone());
            }
            if let Some(c) = common.as_object() {
                for (k, v) in c {
                    b.insert(k.clone(), v.clone());
                }
            }
        }
        base
    };
    json!({
        "openapi": "3.0.3",
        "info": {"title": "delayq", "version": env!("CARGO_PKG_VERSION"),
                 "description": "Order-expiry delay queue on Redis."},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "properties": {"error": {"type": "object", "properties": {
                    "code": {"type": "string"}, "message": {"type": "string"}}}}},
                "Message": msg,
                "Scheduled": scheduled
            }
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/queues/{queue}/messages/{id}": {
                "put": {"summary": "Schedule (upsert, or if_absent)", "parameters": [q, id],
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Message"}}}},
                    "responses": with(json!({"201": {"description": "created"}, "200": {"description": "updated or unchanged"}}),
                        json!({"400": e("invalid input"), "413": e("body too large")}))},
                "get": {"summary": "Read a scheduled order", "parameters": [q, id],
                    "responses": with(json!({"200": {"description": "the order"}}), json!({"404": e("not scheduled")}))},
                "delete": {"summary": "Cancel", "parameters": [q, id],
                    "responses": with(json!({"200": {"description": "cancelled"}}), json!({"404": e("not scheduled")}))}
            },
            "/v1/queues/{queue}/messages:batch": {
                "post": {"summary": "Schedule up to 10,000 orders; validated whole first", "parameters": [q],
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object",
                        "properties": {"messages": {"type": "array", "maxItems": MAX_BATCH, "items": {"$ref": "#/components/schemas/Message"}},
                                       "if_absent": {"type": "boolean"}}}}}},
                    "responses": with(json!({"200": {"description": "one result per message, in order"}}),
                        json!({"400": e("an invalid message (its index is named); nothing written"), "413": e("body too large")}))}
            },
            "/v1/queues": {"get": {"summary": "Queue names", "responses": with(json!({"200": {"description": "queues"}}), json!({}))}},
            "/v1/queues/{queue}/stats": {"get": {"summary": "Statistics", "parameters": [q],
                "responses": with(json!({"200": {"description": "as delayq stats --json"}}), json!({"400": e("invalid queue")}))}},
            "/v1/queues/{queue}/dead": {"get": {"summary": "Dead letters", "parameters": [q,
                {"name": "group", "in": "query", "schema": {"type": "string"}},
                {"name": "limit", "in": "query", "schema": {"type": "integer"}}],
                "responses": with(json!({"200": {"description": "as delayq dead list --json, in an array"}}), json!({"400": e("invalid input")}))}},
            "/v1/queues/{queue}/dead/replay": {"post": {"summary": "Replay dead letters to the group that failed them", "parameters": [q],
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "properties": {
                    "all": {"type": "boolean"}, "entry_ids": {"type": "array", "items": {"type": "string"}}, "group": {"type": "string"}}}}}},
                "responses": with(json!({"200": {"description": "how many were replayed"}}), json!({"400": e("invalid input")}))}},
            "/healthz": {"get": {"summary": "Process up", "security": [], "responses": {"200": {"description": "ok"}}}},
            "/readyz": {"get": {"summary": "Redis reachable", "security": [], "responses": {"200": {"description": "ready"}, "503": e("redis unavailable")}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "security": [], "responses": {"200": {"description": "text"}}}},
            "/openapi.json": {"get": {"summary": "This document", "security": [], "responses": {"200": {"description": "OpenAPI 3"}}}}
        }
    })
}
