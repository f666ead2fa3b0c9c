//! `/v1/queues...` other than messages: the registry, pause and resume, consumer groups,
//! statistics and dead letters.

use super::AppState;
use super::error::{ApiError, ApiResult};
use super::messages::json_body;
use crate::engine::admin::dead::DeadPage;
use crate::engine::flow::PauseState;
use crate::service::admin;
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

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
    let a = st
        .admin
        .create_queue(
            &queue,
            b.shards,
            retention,
            expires_after,
            window,
            cancel_on.as_deref(),
        )
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
) -> ApiResult<Json<admin::QueueDeletedAnswer>> {
    let q = query(q)?;
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
    Ok(Json(
        st.admin
            .set_paused(queue, b.group.as_deref(), paused)
            .await?,
    ))
}

pub(super) async fn delete_group(
    State(st): State<AppState>,
    Path((queue, group)): Path<(String, String)>,
    q: Result<Query<ForceQuery>, QueryRejection>,
) -> ApiResult<Json<admin::GroupDeletedAnswer>> {
    let q = query(q)?;
    Ok(Json(
        st.admin
            .delete_group(&queue, &group, q.force.unwrap_or(false))
            .await?,
    ))
}

pub(super) async fn list_queues(
    State(st): State<AppState>,
) -> ApiResult<Json<admin::QueuesAnswer>> {
    Ok(Json(st.admin.queues().await?))
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
) -> ApiResult<Json<admin::StatsAnswer>> {
    let q = query(q)?;
    let limit = admin::stats_limit(q.limit).map_err(crate::Error::from)?;
    let all = st.all_stats().await?;
    Ok(Json(admin::StatsAnswer::page(
        &all,
        q.after.as_deref(),
        limit,
    )))
}

/// The dashboard's timing of a registered queue (this process's numbers, the last hour).
pub(super) async fn timing(
    State(st): State<AppState>,
    Path(queue): Path<String>,
) -> ApiResult<Json<crate::service::ui::timing::TimingAnswer>> {
    if st
        .admin
        .client()
        .admin()
        .queue_info(&queue)
        .await?
        .is_none()
    {
        return Err(crate::Error::QueueNotFound { queue }.into());
    }
    Ok(Json(match &st.timing {
        Some(t) => t.answer(&queue),
        None => crate::service::ui::timing::Timing::new(st.admin.client().clock().clone())
            .answer(&queue),
    }))
}

pub(super) async fn stats(
    State(st): State<AppState>,
    Path(queue): Path<String>,
) -> ApiResult<Json<admin::StatsAnswer>> {
    Ok(Json(st.admin.stats(Some(&queue)).await?))
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

pub(super) async fn dead_replay(
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

pub(super) async fn dead_purge(
    State(st): State<AppState>,
    Path(queue): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<admin::PurgedAnswer>> {
    let b: ReplayBody = json_body(body)?;
    let sel = admin::selection(b.all, b.entry_ids)?;
    let a = st
        .admin
        .dead_purge(&queue, b.group.as_deref(), &sel)
        .await?;
    Ok(Json(a))
}
