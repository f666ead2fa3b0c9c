//! `/v1/queues...` other than messages: the registry, pause and resume, consumer groups,
//! statistics and dead letters.

use super::AppState;
use super::error::{ApiError, ApiResult};
use super::messages::json_body;
use crate::engine::admin::QueueSettings;
use crate::engine::admin::dead::DeadPage;
use crate::engine::flow::PauseState;
use crate::service::surface::{self, GroupDeleted, Purged, QueueDeleted, Replayed, StatsAnswer};
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateQueueBody {
    shards: Option<u16>,
    /// A duration (`24h`, `0s` = no history).
    history_retention: Option<String>,
    /// The queue's default `expires_after` (`30m`; `0s` clears it).
    expires_after: Option<String>,
    /// A duration (`24h`, `0s` = off): scheduling an id dispatched within it answers
    /// `duplicate`.
    dedup_window: Option<String>,
    /// Cancel-on-event rules (`[{"event": ..., "match": [...], "remember": "15m"}]`; `[]`
    /// removes them).
    cancel_on: Option<serde_json::Value>,
}

pub(super) async fn create_queue(
    State(st): State<AppState>,
    Path(queue): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let b: CreateQueueBody = match body {
        Ok(bytes) if bytes.is_empty() => CreateQueueBody {
            shards: None,
            history_retention: None,
            expires_after: None,
            dedup_window: None,
            cancel_on: None,
        },
        other => json_body(other)?,
    };
    let retention = b
        .history_retention
        .as_deref()
        .map(|t| crate::engine::duration::parse_duration("history_retention", t))
        .transpose()?;
    let expires_after = b
        .expires_after
        .as_deref()
        .map(|t| crate::engine::duration::parse_duration(crate::engine::expiry::FIELD, t))
        .transpose()?;
    let window = b
        .dedup_window
        .as_deref()
        .map(|t| crate::engine::duration::parse_duration("dedup_window", t))
        .transpose()?;
    let cancel_on = b
        .cancel_on
        .as_ref()
        .map(crate::engine::events::rules_from_json)
        .transpose()?;
    let settings = QueueSettings {
        shards: b.shards,
        history_retention: retention,
        expires_after,
        dedup_window: window,
        cancel_on,
    };
    let a = st
        .client
        .admin()
        .create_queue_with(&queue, &settings)
        .await?;
    let status = if a.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(a)).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ForceQuery {
    force: Option<bool>,
}

/// A query string of the expected shape (400 `invalid_query`).
pub(super) fn query<T>(q: Result<Query<T>, QueryRejection>) -> ApiResult<T> {
    q.map(|Query(q)| q)
        .map_err(|e| ApiError::bad("invalid_query", e.body_text()))
}

pub(super) async fn delete_queue(
    State(st): State<AppState>,
    Path(queue): Path<String>,
    q: Result<Query<ForceQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let q = query(q)?;
    let held = st
        .client
        .admin()
        .delete_queue(&queue, q.force.unwrap_or(false))
        .await?;
    Ok(Json(QueueDeleted::new(&queue, held)).into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    group: Option<String>,
}

/// `POST /v1/queues/{q}:pause` and `POST /v1/queues/{q}:resume` (queue names cannot hold a
/// colon, so the suffix is unambiguous).
pub(super) async fn queue_action(
    State(st): State<AppState>,
    Path(target): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<PauseState>> {
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
    surface::check_queue_group(queue, b.group.as_deref())?;
    Ok(Json(
        st.client
            .admin()
            .set_paused(queue, b.group.as_deref(), paused)
            .await?,
    ))
}

pub(super) async fn delete_group(
    State(st): State<AppState>,
    Path((queue, group)): Path<(String, String)>,
    q: Result<Query<ForceQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let q = query(q)?;
    surface::check_queue_group(&queue, Some(&group))?;
    let pending = st
        .client
        .admin()
        .delete_group(&queue, &group, q.force.unwrap_or(false))
        .await?;
    Ok(Json(GroupDeleted {
        queue: &queue,
        group: &group,
        deleted: true,
        pending,
    })
    .into_response())
}

/// `GET /v1/queues`: `{"queues": [names, sorted]}`.
pub(super) async fn list_queues(State(st): State<AppState>) -> ApiResult<Json<QueuesAnswer>> {
    Ok(Json(QueuesAnswer {
        queues: st.client.queues().await?,
    }))
}

/// The queues of the namespace (the HTTP API's envelope).
#[derive(Debug, Serialize)]
pub(super) struct QueuesAnswer {
    /// Their names, sorted.
    queues: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StatsQuery {
    pub(super) limit: Option<usize>,
    pub(super) after: Option<String>,
}

/// Every queue's statistics, a page at a time (`limit`, default 200, at most 1,000; `after`
/// the last queue of the previous page), with the totals over all of them. Every page comes
/// from one shared read of Redis renewed at most once a second, whatever the number of
/// dashboards polling.
pub(super) async fn stats_all(
    State(st): State<AppState>,
    q: Result<Query<StatsQuery>, QueryRejection>,
) -> ApiResult<Json<StatsAnswer>> {
    let q = query(q)?;
    let limit = surface::stats_limit(q.limit).map_err(crate::Error::from)?;
    let all = st.all_stats().await?;
    Ok(Json(StatsAnswer::page(&all, q.after.as_deref(), limit)))
}

/// The dashboard's timing of a registered queue (this process's numbers, the last hour).
pub(super) async fn timing(
    State(st): State<AppState>,
    Path(queue): Path<String>,
) -> ApiResult<Json<crate::service::ui::timing::TimingAnswer>> {
    if st.client.admin().queue_info(&queue).await?.is_none() {
        return Err(crate::Error::QueueNotFound { queue }.into());
    }
    Ok(Json(match &st.timing {
        Some(t) => t.answer(&queue),
        None => crate::service::ui::timing::Timing::new(st.client.clock().clone()).answer(&queue),
    }))
}

pub(super) async fn stats(
    State(st): State<AppState>,
    Path(queue): Path<String>,
) -> ApiResult<Json<StatsAnswer>> {
    Ok(Json(StatsAnswer::of(vec![
        st.client.admin().stats(&queue).await?,
    ])))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DeadQuery {
    pub(super) group: Option<String>,
    pub(super) limit: Option<usize>,
    pub(super) after: Option<String>,
}

pub(super) async fn dead_list(
    State(st): State<AppState>,
    Path(queue): Path<String>,
    q: Result<Query<DeadQuery>, QueryRejection>,
) -> ApiResult<Json<DeadPage>> {
    let q = query(q)?;
    surface::check_queue_group(&queue, q.group.as_deref())?;
    let limit = surface::dead_limit(q.limit)?;
    let page = st
        .client
        .admin()
        .dead_page(&queue, q.group.as_deref(), q.after.as_deref(), limit)
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

pub(super) async fn dead_replay(
    State(st): State<AppState>,
    Path(queue): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<Replayed>> {
    let b: ReplayBody = json_body(body)?;
    let sel = surface::selection(b.all, b.entry_ids)?;
    surface::check_queue_group(&queue, b.group.as_deref())?;
    let replayed = st
        .client
        .admin()
        .dead_replay(&queue, b.group.as_deref(), &sel)
        .await?;
    Ok(Json(Replayed { replayed }))
}

pub(super) async fn dead_purge(
    State(st): State<AppState>,
    Path(queue): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<Purged>> {
    let b: ReplayBody = json_body(body)?;
    let sel = surface::selection(b.all, b.entry_ids)?;
    surface::check_queue_group(&queue, b.group.as_deref())?;
    let purged = st
        .client
        .admin()
        .dead_purge(&queue, b.group.as_deref(), &sel)
        .await?;
    Ok(Json(Purged { purged }))
}
