//! The OpenAPI 3 description served at `/openapi.json`: every route, every answer's shape,
//! and the error envelope as the `default` response of each operation (so a client, or a
//! schema fuzzer, can check that every error is inside it).

use crate::engine::keys::{MAX_ID_LEN, MAX_NAME_LEN};
use crate::engine::schedules::MAX_SCHEDULE_ID_LEN;
use crate::service::surface::{MAX_BATCH, MAX_DEAD_LIMIT};
use serde_json::{Value, json};

fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

/// A JSON response with the schema `name`.
fn ok(desc: &str, name: &str) -> Value {
    json!({"description": desc, "content": {"application/json": {"schema": schema_ref(name)}}})
}

/// An operation: its summary, parameters, request body (a schema name), success responses,
/// and the error envelope for every other status.
fn op(summary: &str, params: Vec<&Value>, body: Option<&str>, success: Value) -> Value {
    let mut responses = success;
    if let Some(r) = responses.as_object_mut() {
        r.insert(
            "default".into(),
            ok(
                "an error: 400 bad input, 401 token, 404, 405, 408, 409, 413, 414, 431, 503 (redis_unavailable, redis_oom, outcome_unknown, partial_write, not_replicated)",
                "Error",
            ),
        );
    }
    let mut o = json!({"summary": summary, "parameters": params, "responses": responses});
    if let (Some(name), Some(m)) = (body, o.as_object_mut()) {
        m.insert(
            "requestBody".into(),
            json!({"required": true, "content": {"application/json": {"schema": schema_ref(name)}}}),
        );
    }
    o
}

/// The API described as OpenAPI 3.
pub fn openapi() -> Value {
    json!({
        "openapi": "3.0.3",
        "info": {"title": "delayq", "version": env!("CARGO_PKG_VERSION"),
                 "description": "Order-expiry delay queue on Redis. Scheduling and cancelling by id are idempotent: a request that failed with a 503 is safe to repeat."},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": merged(merged(schemas(), tag_schemas()), key_schemas())
        },
        "security": [{"bearer": []}],
        "paths": merged(merged(paths(), tag_paths()), key_paths())
    })
}

/// The `{queue}` path parameter.
fn queue_param() -> Value {
    json!({"name": "queue", "in": "path", "required": true, "schema": {"type": "string", "pattern": format!("^[A-Za-z0-9._-]{{1,{MAX_NAME_LEN}}}$")}})
}

/// `a` with the fields of `b` (both objects).
fn merged(mut a: Value, b: Value) -> Value {
    if let (Some(a), Value::Object(b)) = (a.as_object_mut(), b) {
        a.extend(b);
    }
    a
}

/// The schemas of the tag routes (issue 43; `engine::client::tags`).
fn tag_schemas() -> Value {
    json!({
        "TagCounts": object(&["total", "queues"], json!({"total": int(), "queues": {"type": "object", "additionalProperties": int(), "description": "per queue (queues with none left out)"}})),
        "TagPage": object(&["orders", "next"], json!({"orders": {"type": "array", "items": object(&["queue", "id", "due_at_ms"], json!({"queue": {"type": "string"}, "id": {"type": "string"}, "due_at_ms": int()}))}, "next": nullable("string")})),
        "TagAction": {"type": "object", "additionalProperties": false,
            "description": ":cancel takes {} (or no body); :reschedule exactly one of due_at (RFC 3339 or unix ms), delay_ms (from now) or shift_ms (added to each order's due time, may be negative)",
            "properties": {"due_at": {"oneOf": [{"type": "string", "format": "date-time"}, {"type": "integer"}]}, "delay_ms": {"type": "integer", "minimum": 0}, "shift_ms": {"type": "integer"}}},
        "Event": {"type": "object", "additionalProperties": false, "required": ["name"],
            "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[A-Za-z0-9._:/-]+$"},
                "data": {"type": "object", "description": "the rules' match fields are read here (data.order_id); default {}"},
                "id": {"type": "string", "minLength": 1, "maxLength": 128, "description": "a repeated post with this id within the rules' longest remember window answers duplicate and cancels nothing"}}},
        "EventPosted": object(&["name", "cancelled", "queues", "matched_rules", "duplicate"], json!({"name": {"type": "string"}, "id": {"type": "string"},
            "cancelled": int(), "queues": {"type": "object", "additionalProperties": int(), "description": "orders cancelled per queue (queues with none left out)"},
            "matched_rules": int(), "duplicate": {"type": "boolean"}})),
        "CancelRule": {"type": "object", "additionalProperties": false, "required": ["event", "match"],
            "properties": {"event": {"type": "string", "minLength": 1, "maxLength": 128},
                "match": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 4}],
                    "description": "dotted JSON field paths (order_id, customer.id) compared between the order's payload and the event's data; required (a rule without one is refused)"},
                "remember": {"type": "string", "description": "how long an event that arrives first is remembered (default 15m, at most 7d)"}}}
    })
}

/// The schema and route of a group's order keys in use (`service::http::keys`).
fn key_schemas() -> Value {
    json!({
        "KeysPage": object(&["queue", "group", "active", "waiting", "keys", "next"], json!({
            "queue": {"type": "string"}, "group": {"type": "string"},
            "active": {"type": "integer", "minimum": 0, "description": "order keys holding or waiting for slots"},
            "waiting": {"type": "integer", "minimum": 0, "description": "entries parked for a slot of their key"},
            "keys": {"type": "array", "items": object(&["key", "in_flight", "waiting"], json!({"key": {"type": "string"}, "in_flight": int(), "waiting": int()}))},
            "next": nullable("string")}))
    })
}

/// The route of a group's order keys in use (`service::http::keys`).
fn key_paths() -> Value {
    let q = queue_param();
    let g = json!({"name": "group", "in": "path", "required": true, "schema": {"type": "string", "minLength": 1, "maxLength": 128}});
    let limit = json!({"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": crate::engine::admin::keys::MAX_KEYS_LIMIT}});
    let after = json!({"name": "after", "in": "query", "schema": {"type": "string"}, "description": "a page's next cursor"});
    json!({
        "/v1/queues/{queue}/groups/{group}/keys": {"get": op("The group's order keys in use (key_concurrency, key_sequence), busiest first: slots held and entries waiting per key, paged (`next` is the next page's `after`). Keys with nothing in flight or waiting are not kept", vec![&q, &g, &limit, &after], None,
            json!({"200": ok("a page and the cursor of the next", "KeysPage")}))}
    })
}

/// The tag routes (issue 43; `service::http::tags`).
fn tag_paths() -> Value {
    // Tags (issue 43): a tag, or a tag with its action (`customer:42:cancel`).
    let tag = json!({"name": "tag", "in": "path", "required": true, "example": "customer:42",
        "schema": {"type": "string", "minLength": 1, "maxLength": crate::engine::tags::MAX_TAG_LEN, "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"}});
    let tag_action = json!({"name": "tag", "in": "path", "required": true, "example": "customer:42:cancel",
        "schema": {"type": "string", "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]{1,128}:(cancel|reschedule)$"}});
    let tag_limit = json!({"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": crate::engine::client::tags::MAX_TAG_PAGE}});
    let after = json!({"name": "after", "in": "query", "schema": {"type": "string"}, "description": "a page's next cursor"});
    let q = queue_param();
    json!({
        "/v1/tags/{tag}": {
            "get": op("How many scheduled orders carry the tag, in total and per queue, over every queue of the namespace", vec![&tag], None,
                json!({"200": ok("the counts", "TagCounts")})),
            "post": op("`{tag}:cancel` (every scheduled order with the tag, in every queue: worked in bounded batches, each atomic with dispatch; repeating it answers 0) or `{tag}:reschedule` (body: exactly one of due_at, delay_ms, shift_ms)", vec![&tag_action], Some("TagAction"),
                json!({"200": ok("how many orders were cancelled or moved, in total and per queue", "TagCounts")}))
        },
        "/v1/events": {
            "post": op("Post an event (or an array of them): cancels the scheduled orders of every queue whose cancel_on rules name it and whose payload matches its data, and remembers it for the rules' remember window (an order scheduled inside it answers cancelled_by_event)", vec![], Some("Event"),
                json!({"200": ok("what it did (a batch: {results: [...]})", "EventPosted")}))
        },
        "/v1/tags/{tag}/messages": {"get": op("The scheduled orders with the tag in every queue, by queue then id, paged (`next` is the next page's `after`)", vec![&tag, &tag_limit, &after], None,
            json!({"200": ok("a page and the cursor of the next", "TagPage")}))},
        "/v1/queues/{queue}/tags/{tag}": {
            "get": op("How many scheduled orders of the queue carry the tag", vec![&q, &tag], None,
                json!({"200": ok("the count", "TagCounts")})),
            "post": op("`{tag}:cancel` or `{tag}:reschedule`, as /v1/tags/{tag}, in this queue only", vec![&q, &tag_action], Some("TagAction"),
                json!({"200": ok("how many orders were cancelled or moved", "TagCounts")}))
        },
        "/v1/queues/{queue}/tags/{tag}/messages": {"get": op("The queue's scheduled orders with the tag, by id, paged", vec![&q, &tag, &tag_limit, &after], None,
            json!({"200": ok("a page and the cursor of the next", "TagPage")}))}
    })
}

fn int() -> Value {
    json!({"type": "integer"})
}

fn nullable(t: &str) -> Value {
    json!({"type": t, "nullable": true})
}

fn object(required: &[&str], props: Value) -> Value {
    json!({"type": "object", "required": required, "properties": props})
}

/// The priority levels, most urgent first (from the engine's one list).
fn priority() -> Value {
    let levels: Vec<&str> = crate::engine::priority::Priority::ALL
        .iter()
        .map(|p| p.as_str())
        .collect();
    json!({"type": "string", "enum": levels})
}

fn schemas() -> Value {
    let outcome = json!({"type": "string", "enum": ["created", "updated", "unchanged", "duplicate", "cancelled_by_event"],
        "description": "duplicate: the id is not waiting and was dispatched within the queue's dedup_window; nothing was written (give repeat to schedule it again). cancelled_by_event: an event matching one of the queue's (or the order's own) cancel_on rules arrived before, within the rule's remember window; nothing was written and the order never fires"});
    let scheduled = object(
        &["queue", "id", "due_at_ms", "outcome"],
        json!({"queue": {"type": "string"}, "id": {"type": "string"}, "due_at_ms": int(), "outcome": outcome,
               "dispatched_at_ms": {"type": "integer", "description": "with duplicate: when the id was last dispatched, unix ms"},
               "event": {"type": "string", "description": "with cancelled_by_event: the event's name"}}),
    );
    let group_stats = object(
        &["group", "pending", "lag", "consumers", "idle_ms", "paused"],
        json!({"group": {"type": "string"}, "pending": int(), "lag": nullable("integer"),
               "consumers": int(), "idle_ms": nullable("integer"), "paused": {"type": "boolean"},
               "kind": {"type": "string", "description": "what consumes the group, as declared (serve's [[handlers]] kind: pull, webhook, log, order-close); absent when undeclared"},
               "keys_active": {"type": "integer", "minimum": 1, "description": "order keys holding or waiting for slots (key_concurrency, key_sequence); absent when none"},
               "key_waiting": {"type": "integer", "minimum": 1, "description": "entries waiting for a slot of their order key; absent when none"}}),
    );
    let queue_stats = object(
        &[
            "queue",
            "scheduled",
            "overdue",
            "oldest_overdue_ms",
            "next_due_at_ms",
            "stream_length",
            "dead",
            "history",
            "paused",
            "groups",
            "priorities",
        ],
        json!({"queue": {"type": "string"}, "scheduled": int(), "overdue": int(), "oldest_overdue_ms": int(),
               "next_due_at_ms": nullable("integer"), "stream_length": int(), "dead": int(), "history": int(),
               "paused": {"type": "boolean"}, "groups": {"type": "array", "items": group_stats},
               "priorities": {"type": "array", "items": object(&["priority", "stream_length", "pending", "unread"],
                   json!({"priority": priority(), "stream_length": int(), "pending": int(), "unread": int()}))}}),
    );
    let dead_letter = object(
        &[
            "entry_id",
            "queue",
            "id",
            "group",
            "attempts",
            "last_error",
            "dead_at_ms",
            "due_at_ms",
            "payload",
            "priority",
        ],
        json!({"entry_id": {"type": "string"}, "queue": {"type": "string"}, "id": {"type": "string"},
               "group": {"type": "string"}, "attempts": int(), "last_error": {"type": "string"},
               "dead_at_ms": int(), "due_at_ms": int(), "payload": {"nullable": true}, "priority": priority(),
               "reason": {"type": "string", "enum": ["expired"]}, "late_ms": int(), "tags": tags_schema(),
               "key": {"type": "string", "description": "the order's key, when it has one"}}),
    );
    let selection = json!({"type": "object", "additionalProperties": false, "properties": {
        "all": {"type": "boolean"}, "entry_ids": {"type": "array", "items": {"type": "string"}},
        "group": {"type": "string"}}});
    // A local wall-clock due time (issue 44): both or neither, instead of delay_ms/due_at.
    let at_local = json!({"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}(:\\d{2}(\\.\\d{1,9})?)?$",
        "example": "2027-03-28T09:00",
        "description": "due at this local wall-clock time (no offset) in `timezone`, resolved once when scheduled: a time that does not exist (spring forward) is the end of the gap, one that happens twice (fall back) its first occurrence; the answer's due_at_ms is the resolved instant. Not with delay_ms or due_at (400 invalid_local_time, also for an offset or a malformed time)"});
    let timezone = json!({"type": "string", "example": "Europe/Berlin",
        "description": "the IANA time zone of at_local (case-insensitive), required with it and only with it (400 invalid_timezone, also for an unknown zone)"});
    // Expiry of stale work (issue 44): per message, over the queue's default.
    let expires_after = json!({"oneOf": [{"type": "string", "example": "30m"}, {"type": "integer", "minimum": 1}],
        "description": "not handed to a consumer group later than this past the due time (a duration such as 30m, or whole ms; 1ms..10 years, else 400 invalid_option): that group dead-letters it with reason expired instead. Default: the queue's expires_after, if any"});
    // Time rules (issue 44; src/engine/time_rules.rs).
    let debounce = json!({"type": "object", "additionalProperties": false, "required": ["delay_ms", "max_wait_ms"],
        "description": "instead of a due time: due delay_ms after each call (payload replaced), never later than max_wait_ms after the first call; both 1 ms ..= 10 years, max_wait_ms >= delay_ms, not with if_absent (400 invalid_option naming debounce.delay, debounce.max_wait or debounce)",
        "properties": {"delay_ms": {"type": "integer", "minimum": 1}, "max_wait_ms": {"type": "integer", "minimum": 1}}});
    // Order keys (issue 42; src/engine/order_key.rs).
    let key = order_key();
    let repeat = json!({"type": "boolean", "description": "schedule it even if it was dispatched within the queue's dedup_window (otherwise the answer is duplicate and nothing is written)"});
    // Tags (issue 43; src/engine/tags.rs).
    let tags = tags_schema();
    // An order's own cancel-on-event rules (issue 43; src/engine/events.rs).
    let cancel_on = json!({"type": "array", "maxItems": crate::engine::events::MAX_RULES, "items": schema_ref("CancelRule"),
        "description": "the order's own cancel-on-event rules, checked as a queue's (400 invalid_option naming cancel_on): an event they name whose data matches the payload on their match paths cancels it; an event that arrived first within a rule's remember answers cancelled_by_event"});
    json!({
        "Error": object(&["error"], json!({"error": object(&["code", "message"], json!({
            "code": {"type": "string"}, "message": {"type": "string"}}))})),
        "Message": {"type": "object", "additionalProperties": false, "properties": {
            "delay_ms": {"type": "integer", "minimum": 0},
            "due_at": {"oneOf": [{"type": "string", "format": "date-time"}, {"type": "integer"}]},
            "at_local": at_local.clone(),
            "timezone": timezone.clone(),
            "payload": {"description": "any JSON value, stored and delivered byte for byte (at most 64 levels deep)"},
            "if_absent": {"type": "boolean"},
            "priority": priority(),
            "expires_after": expires_after.clone(),
            "debounce": debounce.clone(),
            "key": key.clone(),
            "repeat": repeat.clone(),
            "tags": tags.clone(),
            "cancel_on": cancel_on.clone()}},
        "BatchMessage": {"type": "object", "additionalProperties": false, "required": ["id"], "properties": {
            "id": {"type": "string", "minLength": 1, "maxLength": MAX_ID_LEN},
            "delay_ms": {"type": "integer", "minimum": 0},
            "due_at": {"oneOf": [{"type": "string", "format": "date-time"}, {"type": "integer"}]},
            "at_local": at_local,
            "timezone": timezone,
            "payload": {},
            "priority": priority(),
            "expires_after": expires_after,
            "debounce": debounce,
            "key": key,
            "repeat": repeat,
            "tags": tags,
            "cancel_on": cancel_on}},
        "Batch": {"type": "object", "additionalProperties": false, "required": ["messages"], "properties": {
            "messages": {"type": "array", "maxItems": MAX_BATCH, "items": schema_ref("BatchMessage")},
            "if_absent": {"type": "boolean"}}},
        "Scheduled": scheduled.clone(),
        "BatchAnswer": object(&["results"], json!({"results": {"type": "array", "items": scheduled}})),
        "Cancelled": object(&["outcome"], json!({"outcome": {"type": "string", "enum": ["cancelled"]}})),
        "OrderHistory": order_history(),
        "Queues": object(&["queues"], json!({"queues": {"type": "array", "items": {"type": "string"}}})),
        "CreateQueue": {"type": "object", "additionalProperties": false, "properties": {
            "shards": {"type": "integer", "minimum": 1, "maximum": 1024},
            "history_retention": {"type": "string", "description": "a duration: 24h, 7d, 0s (off)"},
            "expires_after": {"type": "string", "description": "the default expires_after of orders that set none: a duration (30m, 1h); 0s clears it"},
            "dedup_window": {"type": "string", "description": "a duration (24h; 0s: off, the default): scheduling an id that is not waiting and was dispatched within it answers 200 duplicate and writes nothing, unless the message gives repeat; at most 10 years"},
            "cancel_on": {"type": "array", "maxItems": 8, "items": {"$ref": "#/components/schemas/CancelRule"}, "description": "cancel-on-event rules, replacing the queue's ([] removes them)"}}},
        "QueueCreated": object(&["queue", "shards", "created"], json!({"queue": {"type": "string"}, "shards": int(), "created": {"type": "boolean"}})),
        "QueueDeleted": object(&["queue", "deleted", "scheduled", "unread", "pending", "dead"], json!({"queue": {"type": "string"},
            "deleted": {"type": "boolean"}, "scheduled": int(), "unread": int(), "pending": int(), "dead": int()})),
        "Pause": {"type": "object", "additionalProperties": false, "properties": {"group": {"type": "string"}}},
        "PauseState": object(&["queue", "group", "paused"], json!({"queue": {"type": "string"}, "group": nullable("string"), "paused": {"type": "boolean"}})),
        "GroupDeleted": object(&["queue", "group", "deleted", "pending"], json!({"queue": {"type": "string"},
            "group": {"type": "string"}, "deleted": {"type": "boolean"}, "pending": int()})),
        "Stats": object(&["queues"], json!({"queues": {"type": "array", "items": queue_stats},
            "next": nullable("string"),
            "summary": object(&["queues", "paused", "groups", "scheduled", "overdue", "stream_length", "pending", "dead"],
                json!({"queues": int(), "paused": int(), "groups": int(), "scheduled": int(), "overdue": int(),
                       "stream_length": int(), "pending": int(), "dead": int()}))})),
        "DeadPage": object(&["dead_letters", "next"], json!({"dead_letters": {"type": "array", "items": dead_letter}, "next": nullable("string")})),
        "Selection": selection,
        "Replayed": object(&["replayed"], json!({"replayed": int()})),
        "Purged": object(&["purged"], json!({"purged": int()})),
        "Status": object(&["status"], json!({"status": {"type": "string"}})),
        "Schedule": schedule_body(),
        "ScheduleInfo": schedule_info(),
        "Schedules": object(&["schedules"], json!({"schedules": {"type": "array", "items": schema_ref("ScheduleInfo")}})),
        "ScheduleUpserted": object(&["queue", "id", "created", "next_ms"], json!({"queue": {"type": "string"},
            "id": {"type": "string"}, "created": {"type": "boolean"}, "next_ms": nullable("integer")})),
        "ScheduleRemoved": object(&["removed"], json!({"removed": {"type": "boolean", "enum": [true]}})),
        "Timing": object(&["queue", "slot_ms", "points"], json!({"queue": {"type": "string"}, "slot_ms": int(),
            "points": {"type": "array", "items": object(
                &["at_ms", "scheduled_per_s", "dispatched_per_s", "acked_per_s", "late_p50_ms", "late_p99_ms"],
                json!({"at_ms": int(), "scheduled_per_s": {"type": "number"}, "dispatched_per_s": {"type": "number"},
                       "acked_per_s": {"type": "number"}, "late_p50_ms": nullable("number"), "late_p99_ms": nullable("number")}))}})),
        "PullAction": pull_action(),
        "PullAnswer": pull_answer()
    })
}

/// The bodies of `POST /v1/queues/{queue}/groups/{group}:receive`, `:ack`, `:nack` and
/// `:extend` (one per action), with the engine's limits.
fn pull_action() -> Value {
    use crate::engine::worker::{MAX_LEASE, MAX_RECEIPTS, MAX_RECEIVE, MAX_WAIT, MIN_LEASE};
    let lease = json!({"type": "integer", "minimum": MIN_LEASE.as_millis(), "maximum": MAX_LEASE.as_millis()});
    let receipts = json!({"type": "array", "minItems": 1, "maxItems": MAX_RECEIPTS, "items": {"type": "string"}});
    let strict = |mut o: Value| {
        if let Some(m) = o.as_object_mut() {
            m.insert("additionalProperties".into(), json!(false));
        }
        o
    };
    json!({"oneOf": [
        strict(object(&[], json!({
            "max": {"type": "integer", "minimum": 1, "maximum": MAX_RECEIVE, "description": ":receive: most deliveries (default 1)"},
            "wait_ms": {"type": "integer", "minimum": 0, "maximum": MAX_WAIT.as_millis(), "description": ":receive: when nothing can be received now, wait up to this long for an entry and answer as soon as one is received (long poll; default 0: answer at once). The wait holds the connection (counted against http.max_connections), ends at once, empty, when the server shuts down, and never runs past http.request_timeout less a margin"},
            "lease_ms": {"type": "integer", "minimum": MIN_LEASE.as_millis(), "maximum": MAX_LEASE.as_millis(),
                "description": format!("the lease (default: the group's lease if it is declared kind = \"pull\" with one, else {} ms)", crate::engine::worker::DEFAULT_LEASE.as_millis())}}))),
        strict(object(&["receipts"], json!({"receipts": receipts.clone()}))),
        strict(object(&["receipt"], json!({"receipt": {"type": "string"},
            "retry_in_ms": {"type": "integer", "minimum": 0, "maximum": MAX_LEASE.as_millis(), "description": "default: the group's backoff"},
            "dead": {"type": "boolean", "description": "straight to the dead letters (not with retry_in_ms)"},
            "error": {"type": "string"}}))),
        strict(object(&["receipts", "lease_ms"], json!({"receipts": receipts, "lease_ms": lease})))
    ]})
}

/// The answers of the pull actions: deliveries (`:receive`), one result per receipt
/// (`:ack`, `:extend`), or a status (`:nack`).
fn pull_answer() -> Value {
    let delivery = object(
        &[
            "id",
            "payload",
            "priority",
            "attempt",
            "due_at_ms",
            "dispatched_at_ms",
            "receipt",
            "lease_until_ms",
        ],
        json!({"id": {"type": "string"}, "payload": {"description": "byte for byte as scheduled"},
               "priority": priority(), "attempt": int(), "due_at_ms": int(), "dispatched_at_ms": int(),
               "enqueued_at_ms": int(), "traceparent": {"type": "string"}, "tracestate": {"type": "string"},
               "key": {"type": "string", "description": "the order's key, when it has one"},
               "receipt": {"type": "string", "description": "opaque; settles this delivery while its lease holds"},
               "lease_until_ms": int()}),
    );
    let result = object(
        &["status"],
        json!({"status": {"type": "string", "enum": ["acked", "extended", "lease_lost"]},
        "receipt": {"type": "string", "description": "the new receipt (extended)"}}),
    );
    json!({"oneOf": [
        object(&["deliveries"], json!({"deliveries": {"type": "array", "items": delivery}})),
        object(&["results"], json!({"results": {"type": "array", "items": result}})),
        object(&["status"], json!({"status": {"type": "string", "enum": ["settled"]}}))
    ]})
}

/// The body of `PUT /v1/queues/{queue}/schedules/{id}`: exactly one of `cron` and `every`.
fn schedule_body() -> Value {
    let window = |d: &str| json!({"type": "integer", "minimum": 0, "maximum": crate::engine::schedules::MAX_WINDOW_MS, "description": d});
    json!({"type": "object", "additionalProperties": false,
        "example": {"cron": "0 30 2 * * *", "timezone": "Europe/Berlin", "payload": {"report": "nightly"}},
        "properties": {
        "cron": {"type": "string", "description": "a cron expression: six fields with seconds first (`0 0 9 * * MON-FRI`), or the classic five; exactly one of cron and every"},
        "every": {"type": "string", "description": "an interval of at least 1s (`30s`, `5m`, `1h30m`), ticks aligned to the Unix epoch or to start_ms"},
        "timezone": {"type": "string", "description": "an IANA time zone for the cron fields (default UTC)"},
        "payload": {"description": "any JSON value delivered by every tick, stored byte for byte (default {})"},
        "start_ms": window("no tick before this (unix ms, inclusive)"),
        "end_ms": window("no tick after this (unix ms, inclusive; after start_ms)"),
        "missed": {"type": "string", "enum": ["skip", "fire_once"],
                   "description": "ticks that passed while no scheduler ran: skip them (default), or deliver one catch-up tick"},
        "paused": {"type": "boolean", "description": "declared paused: no tick until resumed (default false)"}}})
}

/// A schedule as stored, with where it stands (`engine::schedules::ScheduleInfo`).
fn schedule_info() -> Value {
    let count = json!({"type": "integer", "minimum": 0});
    object(
        &[
            "queue",
            "id",
            "cron",
            "every",
            "timezone",
            "payload",
            "start_ms",
            "end_ms",
            "missed",
            "paused",
            "next_ms",
            "next_id",
            "last_fired_ms",
            "ticks",
            "missed_ticks",
            "upcoming_ms",
            "created_ms",
            "updated_ms",
        ],
        json!({"queue": {"type": "string"}, "id": {"type": "string"},
               "cron": nullable("string"), "every": nullable("string"), "timezone": {"type": "string"},
               "payload": {"nullable": true, "description": "byte for byte as declared"},
               "start_ms": nullable("integer"), "end_ms": nullable("integer"),
               "missed": {"type": "string", "enum": ["skip", "fire_once"]},
               "paused": {"type": "boolean"},
               "next_ms": {"type": "integer", "nullable": true, "description": "the next tick, already scheduled as the order next_id; null once it has ended"},
               "next_id": nullable("string"), "last_fired_ms": nullable("integer"),
               "ticks": count.clone(), "missed_ticks": count,
               "upcoming_ms": {"type": "array", "items": int(), "description": "the next fire times from now"},
               "created_ms": int(), "updated_ms": int()}),
    )
}

/// The answer of `GET /v1/queues/{queue}/messages/{id}` (`engine::admin::history::OrderHistory`).
fn order_history() -> Value {
    let group = object(
        &[
            "group",
            "state",
            "attempts",
            "last_error",
            "next_attempt_at_ms",
        ],
        json!({"group": {"type": "string"},
               "state": {"type": "string", "enum": ["waiting", "running", "retrying", "done", "dead", "expired"]},
               "attempts": {"type": "integer", "minimum": 0}, "last_error": nullable("string"),
               "next_attempt_at_ms": nullable("integer"),
               "late_ms": {"type": "integer", "minimum": 0, "description": "expired only: ms past due + expires_after"}}),
    );
    object(
        &[
            "queue",
            "id",
            "state",
            "due_at_ms",
            "payload",
            "dispatched_at_ms",
            "entry_id",
            "groups",
            "priority",
        ],
        json!({"queue": {"type": "string"}, "id": {"type": "string"},
               "state": {"type": "string", "enum": ["scheduled", "dispatched", "cancelled"]}, "due_at_ms": int(),
               "payload": {"nullable": true, "description": "byte for byte as scheduled, while scheduled or in the stream"},
               "cancelled": {"type": "object", "required": ["at_ms", "reason"],
                   "description": "cancelled orders only (kept for the queue's history retention): when (unix ms, the Redis clock) and by what",
                   "properties": {"at_ms": int(), "reason": {"type": "string", "enum": ["id", "tag", "event"]},
                       "tag": {"type": "string", "description": "reason tag: the tag"},
                       "event": {"type": "string", "description": "reason event: the event's name"},
                       "event_id": {"type": "string", "description": "reason event: the event's id, when it had one"}}},
               "dispatched_at_ms": nullable("integer"), "entry_id": nullable("string"),
               "groups": {"type": "array", "items": group}, "priority": priority(),
               "debounce": {"type": "object", "description": "a waiting debounced order's first call and cap (its latest due time), unix ms",
                   "properties": {"first_call_ms": int(), "max_due_ms": int()}},
               "tags": tags_schema(),
               "key": {"type": "string", "description": "the order's key, when it has one"}}),
    )
}

/// An order's `tags` (`engine::tags`): at most 10, each 1..=128 bytes without control
/// characters, none twice.
fn tags_schema() -> Value {
    use crate::engine::tags::{MAX_TAG_LEN, MAX_TAGS};
    json!({"type": "array", "maxItems": MAX_TAGS, "uniqueItems": true,
        "items": {"type": "string", "minLength": 1, "maxLength": MAX_TAG_LEN, "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"},
        "example": ["order:1234", "customer:42"],
        "description": "the order's tags (list, count, cancel or reschedule every order with a tag); at most 10, each 1..=128 bytes without control characters, none twice (else 400 invalid_option naming tags); an upsert replaces the set; left out of answers when none"})
}

/// An order's `key` (src/engine/order_key.rs).
fn order_key() -> Value {
    use crate::engine::order_key::MAX_KEY_LEN;
    json!({"type": "string", "minLength": 1, "maxLength": MAX_KEY_LEN, "example": "merchant:17",
        "description": format!("the order's key: 1..{MAX_KEY_LEN} bytes, no control characters (else 400 invalid_option naming key). Due orders are dispatched round robin between the keys that have due work (unkeyed orders are one more participant), so a key with few orders is served alongside one with many. Shown by get, history and dead letters, kept by retries and replays, in the webhook body as key; an upsert without a key removes it")})
}

fn paths() -> Value {
    let q = queue_param();
    let id = json!({"name": "id", "in": "path", "required": true, "schema": {"type": "string", "minLength": 1, "maxLength": MAX_ID_LEN}});
    let g = json!({"name": "group", "in": "path", "required": true, "schema": {"type": "string", "minLength": 1, "maxLength": 128}});
    let force = json!({"name": "force", "in": "query", "schema": {"type": "boolean"}});
    let dead_group = json!({"name": "group", "in": "query", "schema": {"type": "string"}});
    let limit = json!({"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_DEAD_LIMIT}});
    let after = json!({"name": "after", "in": "query", "schema": {"type": "string"}});
    let sid = json!({"name": "id", "in": "path", "required": true, "example": "nightly-report",
        "schema": {"type": "string", "pattern": format!("^[A-Za-z0-9._-]{{1,{MAX_SCHEDULE_ID_LEN}}}$")}});
    // The queue of a schedule, with an example: a schedule is declared on a registered queue.
    let sq = {
        let mut p = q.clone();
        if let Some(m) = p.as_object_mut() {
            m.insert("example".into(), json!("order-close"));
        }
        p
    };
    let stats_limit = json!({"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": crate::service::surface::MAX_STATS_LIMIT}});
    let open = |mut o: Value| {
        if let Some(m) = o.as_object_mut() {
            m.insert("security".into(), json!([]));
        }
        o
    };
    json!({
        "/v1/queues/{queue}/messages/{id}": {
            "put": op("Schedule (upsert, or if_absent). Repeating a request is safe while the order waits; once it was dispatched, the same request schedules it again unless the queue has a dedup_window (then 200 duplicate)", vec![&q, &id], Some("Message"),
                json!({"201": ok("created", "Scheduled"), "200": ok("updated, unchanged, or duplicate (dispatched within the queue's dedup_window: nothing written)", "Scheduled")})),
            "get": op("What happened to an order: scheduled, or dispatched with each group's state", vec![&q, &id], None,
                json!({"200": ok("the order's history", "OrderHistory")})),
            "delete": op("Cancel a scheduled order", vec![&q, &id], None, json!({"200": ok("cancelled", "Cancelled")}))
        },
        "/v1/queues/{queue}/messages:batch": {
            "post": op("Schedule up to 10,000 orders, validated whole first (an error names the message's index); a 503 partial_write lists each message's outcome in `results`",
                vec![&q], Some("Batch"), json!({"200": ok("one result per message, in order", "BatchAnswer")}))
        },
        "/v1/queues": {"get": op("Registered queues", vec![], None, json!({"200": ok("queue names", "Queues")}))},
        "/v1/queues/{queue}": {
            "put": op("Register a queue (idempotent)", vec![&q], Some("CreateQueue"),
                json!({"201": ok("created", "QueueCreated"), "200": ok("already registered", "QueueCreated")})),
            "delete": op("Delete a queue and everything in it (409 queue_not_empty unless forced)", vec![&q, &force], None,
                json!({"200": ok("deleted", "QueueDeleted")})),
            "post": op("`{queue}:pause` or `{queue}:resume` (optional group)", vec![&q], Some("Pause"),
                json!({"200": ok("the new state", "PauseState")}))
        },
        "/v1/queues/{queue}/groups/{group}": {
            "delete": op("Delete a consumer group (409 group_busy while a consumer read in the last minute, unless forced)", vec![&q, &g, &force], None,
                json!({"200": ok("deleted", "GroupDeleted")})),
            "post": op("Pull consumption: `{group}:receive` (up to `max` deliveries, each leased for `lease_ms`, with a receipt; the group is joined on its first receive), `{group}:ack` (`receipts`), `{group}:nack` (`receipt`; retried after `retry_in_ms` or the group's backoff, or `dead` with `error`), `{group}:extend` (`receipts`, `lease_ms`: new receipts). 409 lease_lost when no receipt's lease holds any more (ran out and taken over, or settled); 400 invalid_receipt for a receipt this deployment did not issue for this group; 409 wrong_group_kind for a group declared with another kind than pull (a handler of serve consumes it); 404 group_not_found for a group that serve's configuration, which declares its pull groups, does not declare",
                vec![&q, &g], Some("PullAction"), json!({"200": ok("deliveries, one result per receipt, or a status", "PullAnswer")}))
        },
        "/v1/queues/{queue}/stats": {"get": op("Statistics", vec![&q], None, json!({"200": ok("as delayq stats --json", "Stats")}))},
        "/v1/stats": {"get": op("Statistics of every registered queue, paged by name, with totals", vec![&stats_limit, &after], None, json!({"200": ok("as delayq stats --json", "Stats")}))},
        "/v1/queues/{queue}/timing": {"get": op("Throughput and lateness over the last hour, in 10 s slots (this process's numbers)", vec![&q], None,
            json!({"200": ok("one point per slot, oldest first", "Timing")}))},
        "/v1/queues/{queue}/dead": {"get": op("Dead letters, oldest first across shards, paged", vec![&q, &dead_group, &limit, &after], None,
            json!({"200": ok("a page and the cursor of the next", "DeadPage")}))},
        "/v1/queues/{queue}/dead/replay": {"post": op("Replay dead letters to the group that failed them", vec![&q], Some("Selection"),
            json!({"200": ok("how many", "Replayed")}))},
        "/v1/queues/{queue}/dead/purge": {"post": op("Delete dead letters for good", vec![&q], Some("Selection"),
            json!({"200": ok("how many", "Purged")}))},
        "/v1/queues/{queue}/schedules": {"get": op("The queue's recurring schedules, sorted by id", vec![&sq], None,
            json!({"200": ok("every schedule of the queue", "Schedules")}))},
        "/v1/queues/{queue}/schedules/{id}": {
            "put": op("Declare or replace a recurring schedule (cron or every); its next tick is scheduled at once as the order `<id>@<instant ms>`. 400 unknown_queue when the queue is not registered",
                vec![&sq, &sid], Some("Schedule"),
                json!({"201": ok("created", "ScheduleUpserted"), "200": ok("replaced (or declared again as it was)", "ScheduleUpserted")})),
            "get": op("A schedule: its spec, next tick, counters and the next fire times", vec![&sq, &sid], None,
                json!({"200": ok("the schedule", "ScheduleInfo")})),
            "delete": op("Remove a schedule and take its pending tick back", vec![&sq, &sid], None,
                json!({"200": ok("removed", "ScheduleRemoved")})),
            "post": op("`{id}:pause` or `{id}:resume`: paused, its pending tick is taken back; resumed, it goes on from the next instant", vec![&sq, &sid], None,
                json!({"200": ok("the schedule after", "ScheduleInfo")}))
        },
        "/healthz": {"get": open(op("Process up", vec![], None, json!({"200": ok("ok", "Status")})))},
        "/readyz": {"get": open(op("Redis takes writes", vec![], None, json!({"200": ok("ready", "Status")})))},
        "/metrics": {"get": open(op("Prometheus metrics", vec![], None,
            json!({"200": {"description": "text", "content": {"text/plain": {"schema": {"type": "string"}}}}})))},
        "/openapi.json": {"get": open(op("This document", vec![], None,
            json!({"200": {"description": "OpenAPI 3", "content": {"application/json": {"schema": {"type": "object"}}}}})))}
    })
}
