//! `POST /v1/events` (issue 43 item 4): one event `{"name", "data", "id"}` or a batch (an
//! array of them); each cancels the orders that its queues' cancel_on rules match (see
//! [`crate::engine::client::events`]).

use super::AppState;
use super::error::ApiResult;
use super::messages::json_body;
use crate::engine::client::events::Event;
use crate::engine::error::InvalidInput;
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use serde_json::{Value, json};

/// Posts one event (answers its [`EventPosted`](crate::engine::client::events::EventPosted))
/// or a batch (answers `{"results": [...]}`, one per event). Every event is checked
/// first: a bad one refuses the request (400 naming the field; in a batch, its index) and
/// nothing is done.
pub(super) async fn post_events(
    State(st): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<Value>> {
    let v: Value = json_body(body)?;
    let client = &st.client;
    match &v {
        Value::Array(items) => {
            let events = items
                .iter()
                .enumerate()
                .map(|(index, e)| {
                    Event::from_json(e).map_err(|e| InvalidInput::InBatch {
                        index,
                        source: Box::new(e),
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let out = client.post_events(&events).await?;
            Ok(Json(json!({ "results": out })))
        }
        one => {
            let e = Event::from_json(one)?;
            let out = client.post_event(&e).await?;
            Ok(Json(serde_json::to_value(out).unwrap_or(Value::Null)))
        }
    }
}
