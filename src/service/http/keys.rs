//! `GET /v1/queues/{queue}/groups/{group}/keys`: a group's order keys in use (slots held and
//! entries waiting, `key_concurrency`), busiest first ([`crate::engine::admin::keys`]).

use super::AppState;
use super::error::ApiResult;
use super::queues::query;
use crate::engine::admin::keys::{KeysPage, keys_limit};
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use serde::Deserialize;

/// `limit` (1..=1000, default 100) and `after` (the previous page's `next`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KeysQuery {
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    after: Option<String>,
}

pub(super) async fn group_keys(
    State(st): State<AppState>,
    Path((queue, group)): Path<(String, String)>,
    q: Result<Query<KeysQuery>, QueryRejection>,
) -> ApiResult<Json<KeysPage>> {
    let q = query(q)?;
    let limit = keys_limit(q.limit)?;
    Ok(Json(
        st.client
            .admin()
            .group_keys(&queue, &group, limit, q.after.as_deref())
            .await?,
    ))
}
