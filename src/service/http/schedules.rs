//! `/v1/queues/{queue}/schedules...`: recurring schedules (cron expressions and intervals)
//! declared, shown, listed and removed. The answers are the engine's own
//! [`ScheduleUpserted`] and [`ScheduleInfo`]; payloads are taken as raw JSON and stored byte
//! for byte.

use super::AppState;
use super::error::{ApiError, ApiResult};
use super::messages::json_body;
use crate::engine::error::{Error, InvalidInput};
use crate::engine::message::Payload;
use crate::engine::schedules::{
    MAX_WINDOW_MS, Missed, ScheduleInfo, ScheduleSpec, ScheduleUpserted, Schedules,
};
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

/// A schedule as declared by `PUT`: exactly one of `cron` and `every`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleBody {
    #[serde(default)]
    cron: Option<String>,
    #[serde(default)]
    every: Option<String>,
    #[serde(default)]
    timezone: Option<String>,
    /// Kept as the caller wrote it (an explicit `null` too); `{}` when absent.
    #[serde(default, deserialize_with = "present")]
    payload: Option<Box<RawValue>>,
    #[serde(default)]
    start_ms: Option<i64>,
    #[serde(default)]
    end_ms: Option<i64>,
    /// A string checked by [`Missed::parse`] (so a bad value names the field).
    #[serde(default, deserialize_with = "missed_text")]
    missed: Option<String>,
    /// Declared paused (no tick until resumed).
    #[serde(default)]
    paused: bool,
}

/// The text of `missed` (`null`: the default); any other type is refused naming the field.
fn missed_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::String(s) => Ok(Some(s)),
        other => Err(serde::de::Error::custom(format!(
            "invalid option missed: {other} is not a missed-tick policy (skip or fire_once)"
        ))),
    }
}

/// A field that is present, whatever its value (`null` included).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

/// A window bound within what can be stored (0 ..= 2^53 - 1 unix ms), naming its field.
fn window_bound(name: &'static str, ms: Option<i64>) -> Result<Option<i64>, InvalidInput> {
    match ms {
        Some(v) if !(0..=MAX_WINDOW_MS).contains(&v) => Err(InvalidInput::Option {
            name,
            reason: format!("{v} is not unix milliseconds between 0 and {MAX_WINDOW_MS}"),
        }),
        other => Ok(other),
    }
}

impl ScheduleBody {
    fn spec(&self, queue: &str, id: &str) -> Result<ScheduleSpec, InvalidInput> {
        let payload = self.payload.as_deref().map_or_else(
            || Payload::from_value(&serde_json::json!({})),
            Payload::from_raw,
        );
        let missed = self
            .missed
            .as_deref()
            .map(Missed::parse)
            .transpose()?
            .unwrap_or_default();
        let start = window_bound("start_ms", self.start_ms)?;
        let end = window_bound("end_ms", self.end_ms)?;
        let mut spec = ScheduleSpec::cron(queue, id, "", payload)
            .window(start, end)
            .missed(missed)
            .paused(self.paused);
        spec.cron = self.cron.clone();
        spec.every = self.every.clone();
        spec.timezone = self.timezone.clone();
        Ok(spec)
    }
}

/// An unregistered queue is the caller's mistake on a declaration (400, writing nothing).
fn unknown_queue(e: Error) -> ApiError {
    match e {
        Error::QueueNotFound { queue } => ApiError::bad(
            "unknown_queue",
            format!(
                "queue {queue:?} is not registered: create it first (PUT /v1/queues/{queue} or \
                 delayq queue create {queue}), then declare its schedules"
            ),
        ),
        other => other.into(),
    }
}

fn no_such_schedule(queue: &str, id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no schedule {id:?} on queue {queue:?}"),
    )
}

/// `PUT /v1/queues/{queue}/schedules/{id}`: declares or replaces a schedule (201 created,
/// 200 replaced).
pub(super) async fn put_schedule(
    State(st): State<AppState>,
    Path((queue, id)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let b: ScheduleBody = json_body(body)?;
    let spec = b.spec(&queue, &id)?;
    let a: ScheduleUpserted = Schedules::new(&st.client)
        .upsert(&spec)
        .await
        .map_err(unknown_queue)?;
    let status = if a.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(a)).into_response())
}

/// `GET /v1/queues/{queue}/schedules/{id}`.
pub(super) async fn get_schedule(
    State(st): State<AppState>,
    Path((queue, id)): Path<(String, String)>,
) -> ApiResult<Json<ScheduleInfo>> {
    match Schedules::new(&st.client).get(&queue, &id).await? {
        Some(info) => Ok(Json(info)),
        None => Err(no_such_schedule(&queue, &id)),
    }
}

/// The answer of `GET /v1/queues/{queue}/schedules`.
#[derive(Serialize)]
pub(super) struct SchedulesAnswer {
    schedules: Vec<ScheduleInfo>,
}

/// `GET /v1/queues/{queue}/schedules`: the queue's schedules, sorted by id.
pub(super) async fn list_schedules(
    State(st): State<AppState>,
    Path(queue): Path<String>,
) -> ApiResult<Json<SchedulesAnswer>> {
    let schedules = Schedules::new(&st.client).list(Some(&queue)).await?;
    Ok(Json(SchedulesAnswer { schedules }))
}

/// The answer of `DELETE /v1/queues/{queue}/schedules/{id}`.
#[derive(Serialize)]
pub(super) struct RemovedAnswer {
    removed: bool,
}

/// `POST /v1/queues/{queue}/schedules/{id}:pause` and `...:resume` (schedule ids cannot hold
/// a colon, so the suffix is unambiguous): the schedule as it stands after.
pub(super) async fn schedule_action(
    State(st): State<AppState>,
    Path((queue, target)): Path<(String, String)>,
) -> ApiResult<Json<ScheduleInfo>> {
    let (id, paused) = match target.rsplit_once(':') {
        Some((id, "pause")) => (id, true),
        Some((id, "resume")) => (id, false),
        _ => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such route (POST /v1/queues/{queue}/schedules/{id}:pause or :resume)",
            ));
        }
    };
    match Schedules::new(&st.client)
        .set_paused(&queue, id, paused)
        .await?
    {
        Some(info) => Ok(Json(info)),
        None => Err(no_such_schedule(&queue, id)),
    }
}

/// `DELETE /v1/queues/{queue}/schedules/{id}`: removes it and takes its pending tick back.
pub(super) async fn delete_schedule(
    State(st): State<AppState>,
    Path((queue, id)): Path<(String, String)>,
) -> ApiResult<Json<RemovedAnswer>> {
    if Schedules::new(&st.client).remove(&queue, &id).await? {
        Ok(Json(RemovedAnswer { removed: true }))
    } else {
        Err(no_such_schedule(&queue, &id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(text: &str) -> ScheduleBody {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn payloads_are_kept_byte_for_byte_and_default_to_an_empty_object() {
        let spec = body(r#"{"every": "1h"}"#).spec("q", "s").ok();
        assert_eq!(
            spec.map(|s| s.payload.as_str().to_owned()),
            Some("{}".into())
        );
        let spec = body(r#"{"every": "1h", "payload": null}"#)
            .spec("q", "s")
            .ok();
        assert_eq!(
            spec.map(|s| s.payload.as_str().to_owned()),
            Some("null".into())
        );
        let spec = body(r#"{"every": "1h", "payload": {"n": 1.10, "big": 123456789012345678901}}"#)
            .spec("q", "s")
            .ok();
        assert_eq!(
            spec.map(|s| s.payload.as_str().to_owned()),
            Some(r#"{"n": 1.10, "big": 123456789012345678901}"#.into())
        );
    }

    #[test]
    fn missed_of_another_type_names_the_field() {
        let e = serde_json::from_str::<ScheduleBody>(r#"{"every": "1h", "missed": 5}"#)
            .err()
            .map(|e| e.to_string());
        assert!(e.as_deref().is_some_and(|m| m.contains("missed")), "{e:?}");
        let b = body(r#"{"every": "1h", "missed": null}"#);
        assert_eq!(b.spec("q", "s").ok().map(|s| s.missed), Some(Missed::Skip));
    }

    #[test]
    fn bad_missed_and_window_bounds_name_their_field() {
        for (text, field) in [
            (r#"{"every": "1h", "missed": "often"}"#, "missed"),
            (r#"{"every": "1h", "start_ms": -1}"#, "start_ms"),
            (r#"{"every": "1h", "end_ms": 9007199254740992}"#, "end_ms"),
        ] {
            match body(text).spec("q", "s") {
                Err(InvalidInput::Option { name, .. }) => assert_eq!(name, field, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }
}
