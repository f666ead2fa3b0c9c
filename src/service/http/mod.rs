//! The HTTP API of `delayq serve`: [`app`] builds the router (tests drive it in-process),
//! [`server::serve`] runs it on a listener with connection limits.
//!
//! - [`error`]: the error envelope `{"error":{"code","message"}}` and the one mapping from
//!   library errors to statuses: 400 bad input (the library's input codes), 401 without a
//!   valid bearer token on `/v1/...`, 404, 405, 408 body too slow, 409, 413 body too large,
//!   414, 431, 503 (`redis_unavailable`, `redis_oom`, `outcome_unknown`, `partial_write`,
//!   `not_replicated`). Internal details are logged (redacted), never returned.
//! - [`edge`]: the envelope for framework rejections, size limits, bearer tokens, body and
//!   request deadlines.
//! - [`messages`], [`queues`]: the handlers.
//! - `pull`: pull consumption (`/v1/queues/{queue}/groups/{group}:receive`, `:ack`,
//!   `:nack`, `:extend`) over the library's `Puller`.
//! - `events`: `POST /v1/events`, events that cancel the orders their rules match.
//! - `keys`: a group's order keys in use (`/v1/queues/{queue}/groups/{group}/keys`).
//! - `schedules`: the handlers of recurring schedules (`/v1/queues/{queue}/schedules...`).
//! - `consumers`: consumer-only tokens ([`ConsumerToken`]), which may only pull from their
//!   groups.
//! - [`clients`]: who is calling, and failed authentications per client.
//! - [`limits`]: [`HttpLimits`], the edge's limits and their one set of defaults.
//! - [`server`]: the accept loop: header, idle and connection limits, bounded shutdown.
//! - [`openapi`]: the OpenAPI 3 document at `/openapi.json`.

pub mod clients;
mod consumers;
pub(crate) mod edge;
pub mod error;
mod events;
mod keys;
pub mod limits;
mod messages;
mod openapi;
mod pull;
mod queues;
mod schedules;
pub mod server;
mod tags;

pub use consumers::ConsumerToken;
pub use error::ApiError;
pub use limits::HttpLimits;
pub use openapi::openapi;
pub(crate) use pull::{CONSUMER as PULL_CONSUMER, PullGroup};

use crate::engine::client::Client;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub(crate) client: Client,
    pub(crate) tokens: Arc<Vec<String>>,
    pub(crate) limits: Arc<HttpLimits>,
    /// Dashboard sessions (signed with a key derived from `tokens`).
    pub(crate) sessions: Arc<crate::service::ui::session::Sessions>,
    /// The dashboard's ring buffer of throughput and lateness (`None`: not recorded).
    pub(crate) timing: Option<Arc<crate::service::ui::timing::Timing>>,
    /// Every queue's statistics, read at most once a second for every dashboard and scraper.
    stats: Arc<StatsSnapshot>,
    /// Failed authentications per client (bearer tokens and dashboard sign-ins).
    pub(crate) auth_failures: Arc<clients::AuthLimiter>,
    /// The last rendered `/metrics` text and when it was made: refreshed at most once per
    /// second whatever the scrape rate, and served to every scraper as shared bytes.
    metrics_cache: Arc<MetricsCache>,
    /// The pull consumers of this process, one per (queue, group), and the receipt key.
    pullers: Arc<pull::Pullers>,
    /// Fires when the server shuts down: waiting receives (long polls) answer at once.
    pub(crate) shutdown: tokio_util::sync::CancellationToken,
    /// Tokens that may only pull from their groups (`[[http.consumer_tokens]]`).
    pub(crate) consumer_tokens: Arc<Vec<ConsumerToken>>,
}

/// What a dashboard session cookie is worth now (see [`AppState::session_ok`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Session {
    /// A live session.
    Live,
    /// No session: none, forged, expired or signed out.
    None,
    /// Redis could not say whether it was signed out: refused (503), never trusted.
    Unknown,
}

/// 503 `redis_unavailable`: a session cannot be checked while Redis does not answer.
pub(crate) fn session_unknown() -> Response {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "redis_unavailable",
        "redis is unavailable: the session cannot be checked; try again",
    )
    .into_response()
}

/// Every queue's statistics as one read saw them, shared by `/v1/stats` (every page of it)
/// and the `/metrics` gauges.
#[derive(Default)]
struct StatsSnapshot {
    /// The last read.
    last: std::sync::Mutex<Option<StatsRead>>,
    /// Set while one request reads them again (others use the previous ones meanwhile).
    refreshing: std::sync::atomic::AtomicBool,
}

/// One read of every queue's statistics.
#[derive(Clone)]
struct StatsRead {
    /// When it ended.
    at: std::time::Instant,
    /// How long it took.
    took: Duration,
    /// The statistics, sorted by queue.
    all: Arc<Vec<crate::engine::admin::stats::QueueStats>>,
}

/// Clears a "refreshing" flag however the refresh ends.
struct ClearOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// `/metrics`, rendered once and shared.
#[derive(Default)]
pub(crate) struct MetricsCache {
    /// The text and when it was rendered.
    text: std::sync::Mutex<Option<(std::time::Instant, axum::body::Bytes)>>,
    /// Set while one request refreshes it (others serve the previous text meanwhile).
    refreshing: std::sync::atomic::AtomicBool,
}

impl AppState {
    /// State for `client`, accepting `tokens` (empty = open API), with default limits.
    pub fn new(client: Client, tokens: Vec<String>) -> Self {
        AppState {
            client,
            sessions: Arc::new(crate::service::ui::session::Sessions::new(&tokens)),
            pullers: Arc::new(pull::Pullers::new(&tokens)),
            tokens: Arc::new(tokens),
            limits: Arc::new(HttpLimits::default()),
            timing: None,
            metrics_cache: Arc::default(),
            auth_failures: Arc::default(),
            stats: Arc::default(),
            shutdown: tokio_util::sync::CancellationToken::new(),
            consumer_tokens: Arc::default(),
        }
    }

    /// The same state, also accepting `tokens` for pulls from their groups only.
    pub fn with_consumer_tokens(mut self, tokens: Vec<ConsumerToken>) -> Self {
        self.consumer_tokens = Arc::new(tokens);
        self
    }

    /// The same state, with the groups declared `kind = "pull"` (by queue and group) and
    /// their options.
    pub(crate) fn with_pull_groups(
        mut self,
        groups: std::collections::HashMap<(String, String), PullGroup>,
    ) -> Self {
        self.pullers = Arc::new(pull::Pullers::new(&self.tokens).with_declared(groups));
        self
    }

    /// The same state, with long polls answered at once when `shutdown` fires (serve passes
    /// its shutdown token).
    pub fn with_shutdown(mut self, shutdown: tokio_util::sync::CancellationToken) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// Every registered queue's statistics, sorted by name: read from Redis at most once per
    /// [`GAUGE_REFRESH`], or per four times the last read's duration when that is longer (a
    /// read of thousands of queues takes seconds: Redis spends at most a fifth of its time on
    /// them), whatever the number of dashboards and scrapers. While one request reads them,
    /// the others get the previous ones. No lock is held across the Redis calls.
    pub(crate) async fn all_stats(
        &self,
    ) -> crate::Result<Arc<Vec<crate::engine::admin::stats::QueueStats>>> {
        use std::sync::atomic::Ordering;
        let snap = &self.stats;
        let cached = snap.last.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match cached {
            Some(s) if s.at.elapsed() < GAUGE_REFRESH.max(s.took * 4) => return Ok(s.all),
            Some(s) if snap.refreshing.swap(true, Ordering::AcqRel) => return Ok(s.all),
            _ => {}
        }
        let _clear = ClearOnDrop(&snap.refreshing);
        let started = std::time::Instant::now();
        let mut all = self.client.admin().stats_all().await?;
        all.sort_by(|a, b| a.queue.cmp(&b.queue));
        let all = Arc::new(all);
        *snap.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(StatsRead {
            at: std::time::Instant::now(),
            took: started.elapsed(),
            all: all.clone(),
        });
        Ok(all)
    }

    /// The same state, answering `GET /v1/queues/{queue}/timing` from `timing`.
    pub fn with_timing(mut self, timing: Arc<crate::service::ui::timing::Timing>) -> Self {
        self.timing = Some(timing);
        self
    }

    /// Whether `cookie` is a live dashboard session: signed by this key, not expired at
    /// `now_ms`, and not signed out (checked in Redis on every request, so a sign-out
    /// through any process ends it everywhere). When Redis cannot say (unreachable, frozen:
    /// no answer within the client's response timeout), the answer is
    /// [`Session::Unknown`]: never a session, since the cookie may have been revoked.
    pub(crate) async fn session_ok(&self, cookie: &str, now_ms: i64) -> Session {
        if !self.sessions.valid(cookie, now_ms) {
            return Session::None;
        }
        let Some((nonce, _)) = crate::service::ui::session::Sessions::nonce_and_expiry(cookie)
        else {
            return Session::None;
        };
        let client = &self.client;
        let revoked = tokio::time::timeout(
            client.options().response_timeout,
            redis::cmd("EXISTS")
                .arg(client.keyspace().ui_revoked(nonce))
                .query_async::<bool>(&mut client.connection()),
        )
        .await;
        match revoked {
            Ok(Ok(false)) => Session::Live,
            Ok(Ok(true)) => Session::None,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "checking a dashboard session failed");
                Session::Unknown
            }
            Err(_) => {
                tracing::warn!("checking a dashboard session timed out");
                Session::Unknown
            }
        }
    }

    /// The same state with `limits`.
    pub fn with_limits(mut self, limits: HttpLimits) -> Self {
        self.limits = Arc::new(limits);
        self
    }
}

/// The router: every route, the error envelope, the limits of `state`.
pub fn app(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/queues", get(queues::list_queues))
        .route("/v1/stats", get(queues::stats_all))
        .route("/v1/queues/{queue}/timing", get(queues::timing))
        .route(
            "/v1/queues/{queue}",
            put(queues::create_queue)
                .delete(queues::delete_queue)
                .post(queues::queue_action),
        )
        .route(
            "/v1/queues/{queue}/groups/{group}",
            delete(queues::delete_group).post(pull::group_action),
        )
        .route(
            "/v1/queues/{queue}/groups/{group}/keys",
            get(keys::group_keys),
        )
        .route(
            "/v1/queues/{queue}/messages/{id}",
            put(messages::put_message)
                .get(messages::get_message)
                .delete(messages::delete_message),
        )
        .route("/v1/queues/{queue}/messages:batch", post(messages::batch))
        .route(
            "/v1/tags/{tag}",
            get(tags::all_count).post(tags::all_action),
        )
        .route("/v1/tags/{tag}/messages", get(tags::all_list))
        .route(
            "/v1/queues/{queue}/tags/{tag}",
            get(tags::queue_count).post(tags::queue_action),
        )
        .route(
            "/v1/queues/{queue}/tags/{tag}/messages",
            get(tags::queue_list),
        )
        .route("/v1/events", post(events::post_events))
        .route("/v1/queues/{queue}/stats", get(queues::stats))
        .route("/v1/queues/{queue}/dead", get(queues::dead_list))
        .route("/v1/queues/{queue}/dead/replay", post(queues::dead_replay))
        .route("/v1/queues/{queue}/dead/purge", post(queues::dead_purge))
        .route(
            "/v1/queues/{queue}/schedules",
            get(schedules::list_schedules),
        )
        .route(
            "/v1/queues/{queue}/schedules/{id}",
            put(schedules::put_schedule)
                .get(schedules::get_schedule)
                .delete(schedules::delete_schedule)
                .post(schedules::schedule_action),
        )
        // Layers run outside in: tokens first, then the body is read.
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            edge::read_body,
        ))
        .route_layer(middleware::from_fn_with_state(state.clone(), edge::auth));
    Router::new()
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(|| async { Json(openapi()) }))
        .merge(v1)
        .merge(crate::service::ui::routes())
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method",
            )
        })
        .layer(DefaultBodyLimit::max(state.limits.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            edge::host_check,
        ))
        .layer(middleware::from_fn(edge::head_limits))
        .layer(middleware::from_fn(edge::envelope))
        // Outermost: every answer the router gives, as the client gets it.
        .layer(middleware::from_fn(observe))
        .with_state(state)
}

/// Counts and times every request by route template (`unmatched` when no route took it),
/// method and status: `delayq_http_requests_total`, `delayq_http_request_duration_seconds`.
async fn observe(req: axum::extract::Request, next: middleware::Next) -> Response {
    let start = std::time::Instant::now();
    let method = crate::engine::telemetry::http_method_label(req.method().as_str());
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .cloned();
    let resp = next.run(req).await;
    crate::engine::telemetry::http_request(
        route.as_ref().map_or("unmatched", |r| r.as_str()),
        method,
        resp.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    resp
}

/// Ready when Redis takes a write: a `DEL` of a key that never exists (it changes nothing
/// and is not replicated), refused like every write by a replica or by a master that
/// fewer replicas than its `min-replicas-to-write` follow (during a failover), so `/readyz`
/// is 503 while writes would be refused, not only while Redis is unreachable.
async fn readyz(State(st): State<AppState>) -> Response {
    let client = &st.client;
    let probe = client.keyspace().readiness_probe();
    let del = tokio::time::timeout(Duration::from_secs(2), async {
        redis::cmd("DEL")
            .arg(&probe)
            .query_async::<i64>(&mut client.connection())
            .await
    })
    .await;
    // With `durability = "replicated"`, ready only while a durable write would be
    // acknowledged: the replicas it waits for follow (a write and a `WAIT`).
    let del = match del {
        Ok(Ok(_)) => {
            match tokio::time::timeout(Duration::from_secs(2), client.replicated_barrier()).await {
                Ok(Ok(())) => Ok(Ok(0)),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "/readyz: durable writes are not acknowledged");
                    return ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not_replicated",
                    "the replicas durable writes wait for do not follow (durability = \"replicated\")",
                )
                .into_response();
                }
                Err(_) => Err(()),
            }
        }
        other => other.map_err(|_| ()),
    };
    match del {
        Ok(Ok(_)) => Json(json!({"status": "ready"})).into_response(),
        Ok(Err(e)) if e.code().is_some() => {
            tracing::debug!(error = %crate::engine::redact::text(&e.to_string()), "/readyz: redis refuses writes");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "redis_unavailable",
                "redis refuses writes (a failover in progress, or too few replicas)",
            )
            .into_response()
        }
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

async fn metrics(State(st): State<AppState>, req: axum::extract::Request) -> Response {
    use std::sync::atomic::Ordering;
    if let Some(want) = &st.limits.metrics_token {
        let client =
            clients::client_of(req.extensions(), req.headers(), &st.limits.trusted_proxies);
        if st.auth_failures.blocked(client) {
            return edge::too_many();
        }
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(edge::bearer_token)
            .unwrap_or("");
        if !edge::same_secret(given, &want.0) {
            return edge::auth_failed(&st, client, "the metrics token");
        }
    }
    let cache = &st.metrics_cache;
    let cached = cache.text.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let body = match cached {
        // Fresh: the shared bytes, no Redis call.
        Some((at, text)) if at.elapsed() < GAUGE_REFRESH => text,
        // Stale, and another request is refreshing it: the previous text meanwhile.
        cached if cache.refreshing.swap(true, Ordering::AcqRel) => cached.map_or_else(
            || axum::body::Bytes::from(crate::service::metrics::render(None)),
            |(_, text)| text,
        ),
        _ => {
            // This request renders (the flag is cleared however it ends). The gauges are
            // refreshed from the shared statistics of registered queues, within the request
            // deadline; series of queues and groups that no longer exist are left out.
            let _clear = ClearOnDrop(&cache.refreshing);
            let all = tokio::time::timeout(st.limits.request_timeout, st.all_stats()).await;
            let live = match &all {
                Ok(Ok(all)) => {
                    for s in all.iter() {
                        crate::service::metrics::record_stats(s);
                    }
                    Some(crate::service::metrics::Live::of(all))
                }
                _ => None,
            };
            let text = axum::body::Bytes::from(crate::service::metrics::render(live.as_ref()));
            *cache.text.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((std::time::Instant::now(), text.clone()));
            text
        }
    };
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    (headers, body).into_response()
}
