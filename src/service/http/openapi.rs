//! The OpenAPI 3 description served at `/openapi.json`.

use crate::service::admin::MAX_BATCH;
use serde_json::{Value, json};

/// An error response in the envelope.
fn e(desc: &str) -> Value {
    let err = json!({"$ref": "#/components/schemas/Error"});
    json!({"description": desc, "content": {"application/json": {"schema": err}}})
}

/// `base` responses plus `extra` plus the ones every `/v1` call may give.
fn with(mut base: Value, extra: Value) -> Value {
    let common =
        json!({"401": e("missing or invalid bearer token"), "503": e("redis unavailable")});
    if let (Some(b), Some(x), Some(c)) =
        (base.as_object_mut(), extra.as_object(), common.as_object())
    {
        for (k, v) in x.iter().chain(c) {
            b.insert(k.clone(), v.clone());
        }
    }
    base
}

/// The API described as OpenAPI 3.
pub fn openapi() -> Value {
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
                "Scheduled": scheduled,
                "OrderHistory": order_history()
            }
        },
        "security": [{"bearer": []}],
        "paths": paths(&q, &id)
    })
}

/// The answer of `GET /v1/queues/{queue}/messages/{id}` (`engine::history::OrderHistory`).
fn order_history() -> Value {
    let nullable_int = json!({"type": "integer", "nullable": true});
    json!({"type": "object", "required": ["queue", "id", "state", "due_at_ms", "payload", "dispatched_at_ms", "entry_id", "groups"],
        "properties": {
            "queue": {"type": "string"}, "id": {"type": "string"},
            "state": {"type": "string", "enum": ["scheduled", "dispatched"]},
            "due_at_ms": {"type": "integer"},
            "payload": {"nullable": true, "description": "byte for byte as scheduled, while scheduled or in the stream"},
            "dispatched_at_ms": nullable_int, "entry_id": {"type": "string", "nullable": true},
            "groups": {"type": "array", "items": {"type": "object",
                "required": ["group", "state", "attempts", "last_error", "next_attempt_at_ms"],
                "properties": {
                    "group": {"type": "string"},
                    "state": {"type": "string", "enum": ["waiting", "running", "retrying", "done", "dead"]},
                    "attempts": {"type": "integer", "minimum": 0},
                    "last_error": {"type": "string", "nullable": true},
                    "next_attempt_at_ms": nullable_int}}}}})
}

fn paths(q: &Value, id: &Value) -> Value {
    let mut p = message_paths(q, id);
    if let (Some(m), Some(o)) = (p.as_object_mut(), other_paths(q).as_object()) {
        m.extend(o.clone());
    }
    p
}

fn message_paths(q: &Value, id: &Value) -> Value {
    json!({
            "/v1/queues/{queue}/messages/{id}": {
                "put": {"summary": "Schedule (upsert, or if_absent)", "parameters": [q, id],
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Message"}}}},
                    "responses": with(json!({"201": {"description": "created"}, "200": {"description": "updated or unchanged"}}),
                        json!({"400": e("invalid input"), "413": e("body too large")}))},
                "get": {"summary": "What happened to an order: scheduled, or dispatched with each group's state", "parameters": [q, id],
                    "responses": with(json!({"200": {"description": "the order's history",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/OrderHistory"}}}}}),
                        json!({"404": e("never scheduled, cancelled, or past the history retention")}))},
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
            }
    })
}

fn other_paths(q: &Value) -> Value {
    json!({
            "/v1/queues": {"get": {"summary": "Queue names", "responses": with(json!({"200": {"description": "queues"}}), json!({}))}},
            "/v1/queues/{queue}/stats": {"get": {"summary": "Statistics", "parameters": [q],
                "responses": with(json!({"200": {"description": "as delayq stats --json"}}), json!({"400": e("invalid queue")}))}},
            "/v1/queues/{queue}/dead": {"get": {"summary": "Dead letters", "parameters": [q,
                {"name": "group", "in": "query", "schema": {"type": "string"}},
                {"name": "limit", "in": "query", "schema": {"type": "integer"}},
                {"name": "after", "in": "query", "schema": {"type": "string"}}],
                "responses": with(json!({"200": {"description": "{\"dead_letters\": [...], \"next\": cursor or null}, oldest first across shards"}}), json!({"400": e("invalid input"), "404": e("queue_not_found")}))}},
            "/v1/queues/{queue}/dead/replay": {"post": {"summary": "Replay dead letters to the group that failed them", "parameters": [q],
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "properties": {
                    "all": {"type": "boolean"}, "entry_ids": {"type": "array", "items": {"type": "string"}}, "group": {"type": "string"}}}}}},
                "responses": with(json!({"200": {"description": "how many were replayed"}}), json!({"400": e("invalid input")}))}},
            "/healthz": {"get": {"summary": "Process up", "security": [], "responses": {"200": {"description": "ok"}}}},
            "/readyz": {"get": {"summary": "Redis reachable", "security": [], "responses": {"200": {"description": "ready"}, "503": e("redis unavailable")}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "security": [], "responses": {"200": {"description": "text"}}}},
            "/openapi.json": {"get": {"summary": "This document", "security": [], "responses": {"200": {"description": "OpenAPI 3"}}}}
    })
}
