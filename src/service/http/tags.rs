//! `/v1/tags/{tag}...` and `/v1/queues/{queue}/tags/{tag}...` (issue 43): list, count,
//! cancel and reschedule every scheduled order with a tag, in one queue or in every queue of
//! the namespace ([`crate::engine::client::tags`]).

use super::AppState;
use super::error::{ApiError, ApiResult};
use super::messages::json_body;
use super::queues::query;
use crate::engine::client::tags::{TagCounts, TagMove, TagPage};
use crate::engine::error::InvalidInput;
use crate::engine::message::{DueFields, When};
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::Value;

/// The default page of a tag's orders.
const DEFAULT_LIMIT: usize = 100;

/// `limit` and `after` of a listing.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PageQuery {
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    after: Option<String>,
}

/// A reschedule's target: exactly one of a new due time (`due_at`, `delay_ms`) or a shift.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    #[serde(default)]
    due_at: Option<Value>,
    #[serde(default)]
    delay_ms: Option<i64>,
    #[serde(default)]
    shift_ms: Option<i64>,
}

impl ActionBody {
    fn is_empty(&self) -> bool {
        self.due_at.is_none() && self.delay_ms.is_none() && self.shift_ms.is_none()
    }

    fn to_move(&self) -> Result<TagMove, InvalidInput> {
        let given = [
            self.due_at.is_some(),
            self.delay_ms.is_some(),
            self.shift_ms.is_some(),
        ];
        if given.iter().filter(|g| **g).count() != 1 {
            return Err(InvalidInput::Option {
                name: "reschedule",
                reason: "give exactly one of due_at, delay_ms or shift_ms".into(),
            });
        }
        if let Some(s) = self.shift_ms {
            return Ok(TagMove::ShiftMs(s));
        }
        let number;
        let due_at = match &self.due_at {
            None => None,
            Some(Value::String(s)) => Some(s.as_str()),
            Some(Value::Number(n)) => {
                number = n.to_string();
                Some(number.as_str())
            }
            Some(_) => {
                return Err(InvalidInput::DueTime {
                    reason: "due_at must be an RFC 3339 string or unix milliseconds".into(),
                });
            }
        };
        let when: When = DueFields {
            delay_ms: self.delay_ms,
            due_at,
            at_local: None,
            timezone: None,
        }
        .when()?;
        Ok(TagMove::At(when))
    }
}

fn page(queue: Option<&str>, tag: &str, q: PageQuery) -> PageArgs {
    PageArgs {
        queue: queue.map(str::to_owned),
        tag: tag.to_owned(),
        limit: q.limit.unwrap_or(DEFAULT_LIMIT),
        after: q.after,
    }
}

struct PageArgs {
    queue: Option<String>,
    tag: String,
    limit: usize,
    after: Option<String>,
}

async fn list(st: &AppState, a: PageArgs) -> ApiResult<Json<TagPage>> {
    Ok(Json(
        st.client
            .tag_list(a.queue.as_deref(), &a.tag, a.limit, a.after.as_deref())
            .await?,
    ))
}

/// `POST .../tags/{tag}:cancel` or `:reschedule`.
async fn act(
    st: &AppState,
    queue: Option<&str>,
    target: &str,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<TagCounts>> {
    let b: ActionBody = match body {
        Ok(bytes) if bytes.is_empty() => ActionBody::default(),
        other => json_body(other)?,
    };
    let client = &st.client;
    match target.rsplit_once(':') {
        Some((tag, "cancel")) => {
            if !b.is_empty() {
                return Err(InvalidInput::Option {
                    name: "cancel",
                    reason: "takes no due_at, delay_ms or shift_ms".into(),
                }
                .into());
            }
            Ok(Json(client.tag_cancel(queue, tag).await?))
        }
        Some((tag, "reschedule")) => {
            Ok(Json(client.tag_reschedule(queue, tag, b.to_move()?).await?))
        }
        _ => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such route (POST .../tags/{tag}:cancel or :reschedule)",
        )),
    }
}

pub(super) async fn all_list(
    State(st): State<AppState>,
    Path(tag): Path<String>,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> ApiResult<Json<TagPage>> {
    let a = page(None, &tag, query(q)?);
    list(&st, a).await
}

pub(super) async fn all_count(
    State(st): State<AppState>,
    Path(tag): Path<String>,
) -> ApiResult<Json<TagCounts>> {
    Ok(Json(st.client.tag_count(None, &tag).await?))
}

pub(super) async fn all_action(
    State(st): State<AppState>,
    Path(target): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<TagCounts>> {
    act(&st, None, &target, body).await
}

pub(super) async fn queue_list(
    State(st): State<AppState>,
    Path((queue, tag)): Path<(String, String)>,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> ApiResult<Json<TagPage>> {
    let a = page(Some(&queue), &tag, query(q)?);
    list(&st, a).await
}

pub(super) async fn queue_count(
    State(st): State<AppState>,
    Path((queue, tag)): Path<(String, String)>,
) -> ApiResult<Json<TagCounts>> {
    Ok(Json(st.client.tag_count(Some(&queue), &tag).await?))
}

pub(super) async fn queue_action(
    State(st): State<AppState>,
    Path((queue, target)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<TagCounts>> {
    act(&st, Some(&queue), &target, body).await
}
