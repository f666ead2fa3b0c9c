//! The producer conformance cases (`tests/conformance/inputs.json`, described in the README
//! beside it) through the Rust library: every case, in file order, on a redis-server of this
//! test's own, with the client's clock fixed at the file's `now_ms`. The Python and
//! TypeScript SDKs run the same file; all three must agree with it.
//!
//! One run reports every case that disagrees (the test fails once, at the end, listing them).
#![allow(clippy::unwrap_used)]

use crate::support;

use delayq::engine::keys::{MAX_ID_LEN, MAX_NAME_LEN, QueueName, shard_of};
use delayq::engine::message::{DueFields, MAX_AHEAD_MS, MAX_PAYLOAD_DEPTH};
use delayq::service::surface as admin;
use delayq::{
    CancelOutcome, Client, ClientOptions, Clock, Debounce, Error, LocalRedis, ManualClock, Mode,
    NewOrder, Payload, Priority, RescheduleOutcome, ScheduleOutcome, Scheduled, When,
};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

const INPUTS: &str = include_str!("../conformance/inputs.json");

const OPS: [&str; 7] = [
    "schedule",
    "schedule_many",
    "cancel",
    "get",
    "reschedule",
    "connect",
    "post_event",
];

/// Every key a case may have (README, format 6); another key means the file changed format.
const CASE_KEYS: [&str; 27] = [
    "name",
    "event",
    "data",
    "op",
    "queue",
    "id",
    "delay_ms",
    "due_ms",
    "payload",
    "mode",
    "orders",
    "generate",
    "namespace",
    "fixed_clock",
    "expect",
    "index",
    "priority",
    "expect_priority",
    "at_local",
    "timezone",
    "expect_due_ms",
    "expires_after_ms",
    "debounce",
    "repeat",
    "tags",
    "key",
    "cancel_on",
];

/// Every key an order of a batch may have.
const ORDER_KEYS: [&str; 8] = [
    "id",
    "delay_ms",
    "due_ms",
    "payload",
    "priority",
    "expires_after_ms",
    "tags",
    "key",
];

/// The stored body the case's (or batch order's) payload text must have: the text, after
/// `\x1d<tags>\x1d` when it has tags (src/engine/tags.rs), after `\x1e<key>\x1e` when it
/// has a key (src/engine/order_key.rs), after `!<expires_after_ms>!` when the order has its
/// own expiry (src/engine/expiry.rs).
fn stored_body(o: &serde_json::Map<String, Value>, payload: &str) -> String {
    let tagged = match tags_of(o) {
        Some(t) if !t.is_empty() => format!("\u{1d}{}\u{1d}{payload}", t.join("\u{1f}")),
        _ => payload.to_owned(),
    };
    let keyed = match o.get("key").and_then(Value::as_str) {
        Some(k) => format!("\u{1e}{k}\u{1e}{tagged}"),
        None => tagged,
    };
    match o.get("expires_after_ms").and_then(Value::as_i64) {
        Some(e) => format!("!{e}!{keyed}"),
        None => keyed,
    }
}

/// The case's (or batch order's) `tags`, as given (strings).
fn tags_of(o: &serde_json::Map<String, Value>) -> Option<Vec<String>> {
    o.get("tags").and_then(Value::as_array).map(|a| {
        a.iter()
            .map(|t| t.as_str().unwrap_or_default().to_owned())
            .collect()
    })
}

/// `order` with the case's (or batch order's) `expires_after_ms`, `tags` and `key`, as
/// given.
fn expiring(o: &serde_json::Map<String, Value>, order: NewOrder) -> Result<NewOrder, String> {
    let order = match tags_of(o) {
        Some(t) => order.with_tags(t),
        None => order,
    };
    let order = match o.get("key") {
        Some(Value::String(k)) => order.with_key(k.clone()),
        Some(other) => return Err(format!("key: {other} is not a string")),
        None => order,
    };
    let order = match o.get("cancel_on") {
        Some(v) => order.with_cancel_on(rules_of(v)?),
        None => order,
    };
    Ok(match o.get("expires_after_ms") {
        Some(v) => NewOrder {
            expires_after_ms: Some(int(v, "expires_after_ms")?),
            ..order
        },
        None => order,
    })
}

/// The case's `cancel_on` as given (`[{event, match: path or [paths], remember_ms?}]`),
/// unchecked: the client checks it.
fn rules_of(v: &Value) -> Result<Vec<delayq::CancelRule>, String> {
    let list = v.as_array().ok_or("cancel_on is not an array")?;
    list.iter()
        .map(|r| {
            let paths = match &r["match"] {
                Value::String(p) => vec![p.clone()],
                Value::Array(a) => a
                    .iter()
                    .map(|p| {
                        p.as_str()
                            .map(str::to_owned)
                            .ok_or("a match path is not a string")
                    })
                    .collect::<Result<_, _>>()?,
                Value::Null => Vec::new(),
                other => return Err(format!("match: {other} is not a path")),
            };
            Ok(delayq::CancelRule {
                event: r["event"]
                    .as_str()
                    .ok_or("event is not a string")?
                    .to_owned(),
                match_paths: paths,
                remember_ms: match r.get("remember_ms") {
                    Some(v) => int(v, "remember_ms")?,
                    None => delayq::engine::events::DEFAULT_REMEMBER_MS,
                },
            })
        })
        .collect()
}

fn doc() -> Value {
    let doc: Value = serde_json::from_str(INPUTS).expect("inputs.json is JSON");
    assert_eq!(doc["format"], 6, "inputs.json: unknown format");
    doc
}

/// What a call came to, in the file's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// It succeeded; the string says with what (for the report).
    Ok(String),
    /// It was refused with this stable code; `index` when the error names a batch order.
    Refused { code: String, index: Option<usize> },
    /// It failed with an error that has no stable code (a Redis failure, a bug).
    Other(String),
}

impl Outcome {
    fn of(e: &Error) -> Outcome {
        match e {
            Error::Invalid(delayq::InvalidInput::InBatch { index, source }) => Outcome::Refused {
                code: source.code().to_owned(),
                index: Some(*index),
            },
            Error::Invalid(i) => Outcome::Refused {
                code: i.code().to_owned(),
                index: None,
            },
            Error::QueueNotFound { .. } => Outcome::Refused {
                code: "queue_not_found".to_owned(),
                index: None,
            },
            other => Outcome::Other(other.to_string()),
        }
    }

    /// An input error from building part of the call (a payload's JSON text), for the
    /// batch order `index` when it is one.
    fn invalid(e: &delayq::InvalidInput, index: Option<usize>) -> Outcome {
        Outcome::Refused {
            code: e.code().to_owned(),
            index,
        }
    }

    fn is_input_error(&self) -> bool {
        matches!(self, Outcome::Refused { code, .. } if code != "queue_not_found")
    }
}

/// `delay_ms` or `due_ms` of a case or of a batch order (exactly one of them).
fn when_of(o: &Map<String, Value>) -> Result<(When, i64), String> {
    match (o.get("delay_ms"), o.get("due_ms")) {
        (Some(d), None) => {
            let ms = int(d, "delay_ms")?;
            Ok((When::in_ms(ms), ms))
        }
        (None, Some(d)) => {
            let ms = int(d, "due_ms")?;
            Ok((When::at_ms(ms), ms))
        }
        _ => Err("needs exactly one of delay_ms and due_ms".into()),
    }
}

/// A case's due time from its text fields when it has `at_local` or `timezone` (README,
/// format 3), built as a caller builds it from text ([`DueFields`]); `None` otherwise.
fn local_when_of(
    o: &Map<String, Value>,
) -> Result<Option<Result<When, delayq::InvalidInput>>, String> {
    if !o.contains_key("at_local") && !o.contains_key("timezone") {
        return Ok(None);
    }
    let opt_text = |k: &str| match o.get(k) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(other) => Err(format!("{k} is not a string: {other}")),
    };
    let due_at = o
        .get("due_ms")
        .map(|d| int(d, "due_ms"))
        .transpose()?
        .map(|ms| ms.to_string());
    let fields = DueFields {
        delay_ms: o.get("delay_ms").map(|d| int(d, "delay_ms")).transpose()?,
        due_at: due_at.as_deref(),
        at_local: opt_text("at_local")?,
        timezone: opt_text("timezone")?,
    };
    Ok(Some(fields.when()))
}

/// The due time an accepted `when` resolves to at `now` (for checking what was stored).
fn due_of(o: &Map<String, Value>, now: i64) -> i64 {
    if let Some(d) = o.get("expect_due_ms").and_then(Value::as_i64) {
        d
    } else if let Some(d) = o.get("delay_ms").and_then(Value::as_i64) {
        now + d
    } else {
        o.get("due_ms").and_then(Value::as_i64).unwrap_or(i64::MIN)
    }
}

fn int(v: &Value, what: &str) -> Result<i64, String> {
    let n = v
        .as_i64()
        .ok_or_else(|| format!("{what} is not an integer: {v}"))?;
    if n.unsigned_abs() > (1u64 << 53) {
        return Err(format!("{what} is beyond ±2^53: {n}"));
    }
    Ok(n)
}

fn text<'a>(o: &'a Map<String, Value>, key: &str) -> Result<&'a str, String> {
    o.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("needs the string {key:?}"))
}

/// The `priority` of a case or of a batch order: absent (`None`), or the text parsed as the
/// library parses it (README, check 1). A level that is not a string is a broken file.
fn priority_of(
    o: &Map<String, Value>,
) -> Result<Option<Result<Priority, delayq::InvalidInput>>, String> {
    match o.get("priority") {
        None => Ok(None),
        Some(Value::String(text)) => Ok(Some(Priority::parse(text))),
        Some(other) => Err(format!("priority is not a string: {other}")),
    }
}

fn mode_of(case: &Map<String, Value>) -> Result<Mode, String> {
    match case.get("mode").map(|m| m.as_str()) {
        None | Some(Some("upsert")) => Ok(Mode::Upsert),
        Some(Some("if_absent")) => Ok(Mode::IfAbsent),
        Some(other) => Err(format!("unknown mode {other:?}")),
    }
}

/// The world the cases run in: one client and what this run has scheduled
/// (so a cancel, get or reschedule of an id knows whether to find it).
struct Run {
    url: String,
    clock: Arc<ManualClock>,
    namespace: String,
    now: i64,
    client: Client,
    /// Shard count of each registered queue.
    shards: HashMap<String, u16>,
    /// (queue, id) of every order scheduled and not cancelled.
    scheduled: HashSet<(String, String)>,
}

impl Run {
    /// Runs one case; returns its outcome, or the checks on an accepted call that failed.
    async fn call(&mut self, case: &Map<String, Value>) -> Result<Outcome, String> {
        let op = text(case, "op")?;
        if op == "connect" {
            let ns = text(case, "namespace")?;
            let opts = ClientOptions::default().namespace(ns);
            let clock: Arc<dyn Clock> = self.clock.clone();
            return Ok(
                match Client::connect_with_clock(&self.url, opts, clock).await {
                    Ok(_) => Outcome::Ok("connected".into()),
                    Err(e) => Outcome::of(&e),
                },
            );
        }
        if op == "post_event" {
            let event = delayq::Event {
                name: text(case, "event")?.to_owned(),
                data: case.get("data").cloned().unwrap_or(serde_json::Value::Null),
                id: case.get("id").and_then(|v| v.as_str()).map(str::to_owned),
            };
            return Ok(match self.client.post_event(&event).await {
                Ok(_) => Outcome::Ok("posted".into()),
                Err(e) => Outcome::of(&e),
            });
        }
        let queue = text(case, "queue")?;
        match op {
            "schedule" => {
                let id = text(case, "id")?;
                let payload_text = text(case, "payload")?;
                let local = local_when_of(case)?;
                let debounce = case.get("debounce");
                let when = match &local {
                    Some(_) => When::in_ms(0),
                    None if debounce.is_some()
                        && !case.contains_key("delay_ms")
                        && !case.contains_key("due_ms") =>
                    {
                        When::in_ms(0)
                    }
                    None => when_of(case)?.0,
                };
                let mode = mode_of(case)?;
                // The payload is built from its text before the call (README, check 1).
                let payload = match Payload::from_json(payload_text) {
                    Ok(p) => p,
                    Err(e) => return Ok(Outcome::invalid(&e, None)),
                };
                // Then the level (README, check 1).
                let priority = match priority_of(case)? {
                    None => Priority::Normal,
                    Some(Ok(p)) => p,
                    Some(Err(e)) => return Ok(Outcome::invalid(&e, None)),
                };
                // Then the local time's text (built by the caller, like the payload).
                let when = match local {
                    None => when,
                    Some(Ok(w)) => w,
                    Some(Err(e)) => return Ok(Outcome::invalid(&e, None)),
                };
                // Then the debounce (built by the caller from its two numbers); a due time
                // given beside it stays the order's, which the library refuses.
                let order = match debounce {
                    None => NewOrder::new(id, when, payload),
                    Some(d) => {
                        let ms = |k: &str| d.get(k).map_or(Ok(-1), |v| int(v, k));
                        match Debounce::from_ms(ms("delay_ms")?, ms("max_wait_ms")?) {
                            Ok(d) => {
                                let mut o = NewOrder::debounced(id, d, payload);
                                if case.contains_key("delay_ms") || case.contains_key("due_ms") {
                                    o.when = when;
                                }
                                o
                            }
                            Err(e) => return Ok(Outcome::invalid(&e, None)),
                        }
                    }
                };
                let repeat = case.get("repeat").and_then(Value::as_bool).unwrap_or(false);
                let order = expiring(case, order.with_priority(priority).repeat(repeat))?;
                match self.client.schedule_with(queue, order, mode).await {
                    Ok(s) => {
                        let due = due_of(case, self.now);
                        let body = stored_body(case, payload_text);
                        self.accepted(queue, &[(id, &body, due, priority)], &[s])
                            .await?;
                        Ok(Outcome::Ok("scheduled".into()))
                    }
                    Err(e) => Ok(Outcome::of(&e)),
                }
            }
            "schedule_many" => self.schedule_many(case, queue).await,
            "cancel" => {
                let id = text(case, "id")?;
                match self.client.cancel(queue, id).await {
                    Ok(o) => {
                        let key = (queue.to_owned(), id.to_owned());
                        let want = if self.scheduled.remove(&key) {
                            CancelOutcome::Cancelled
                        } else {
                            CancelOutcome::NotFound
                        };
                        if o != want {
                            return Err(format!("cancel answered {o:?}, expected {want:?}"));
                        }
                        Ok(Outcome::Ok(format!("{o:?}")))
                    }
                    Err(e) => Ok(Outcome::of(&e)),
                }
            }
            "get" => {
                let id = text(case, "id")?;
                match self.client.get(queue, id).await {
                    Ok(o) => {
                        let known = self.scheduled.contains(&(queue.to_owned(), id.to_owned()));
                        if o.is_some() != known {
                            return Err(format!(
                                "get answered {}, expected {}",
                                if o.is_some() { "an order" } else { "not found" },
                                if known { "an order" } else { "not found" },
                            ));
                        }
                        if let Some(want) = case.get("expect_priority") {
                            let want = want.as_str().ok_or("expect_priority is not a string")?;
                            let got = o.map(|o| o.priority.as_str());
                            if got != Some(want) {
                                return Err(format!(
                                    "get read the level {got:?}, expected {want:?}"
                                ));
                            }
                        }
                        Ok(Outcome::Ok(
                            if known { "found" } else { "not found" }.into(),
                        ))
                    }
                    Err(e) => Ok(Outcome::of(&e)),
                }
            }
            "reschedule" => {
                let id = text(case, "id")?;
                let (when, _) = when_of(case)?;
                // The level first (README, check 1); absent: the order keeps its own.
                let priority = match priority_of(case)? {
                    None => None,
                    Some(Ok(p)) => Some(p),
                    Some(Err(e)) => return Ok(Outcome::invalid(&e, None)),
                };
                match self.client.reschedule_with(queue, id, when, priority).await {
                    Ok(o) => {
                        let known = self.scheduled.contains(&(queue.to_owned(), id.to_owned()));
                        let want = if known {
                            RescheduleOutcome::Rescheduled
                        } else {
                            RescheduleOutcome::NotFound
                        };
                        if o != want {
                            return Err(format!("reschedule answered {o:?}, expected {want:?}"));
                        }
                        if let (RescheduleOutcome::Rescheduled, Some(p)) = (o, priority) {
                            let got = self
                                .client
                                .get(queue, id)
                                .await
                                .map_err(|e| e.to_string())?
                                .map(|o| o.priority);
                            if got != Some(p) {
                                return Err(format!("rescheduled to {p}, but get reads {got:?}"));
                            }
                        }
                        Ok(Outcome::Ok(format!("{o:?}")))
                    }
                    Err(e) => Ok(Outcome::of(&e)),
                }
            }
            other => Err(format!("unknown op {other:?}")),
        }
    }

    /// A batch, through the surfaces' batch path (`surface::schedule_batch`, what the HTTP
    /// API's batch endpoint calls): it applies the batch-size rule (`admin::check_batch_len`,
    /// at most `MAX_BATCH` orders) before `Client::schedule_many`, which has no limit of
    /// its own.
    async fn schedule_many(
        &mut self,
        case: &Map<String, Value>,
        queue: &str,
    ) -> Result<Outcome, String> {
        let mode = mode_of(case)?;
        // (id, payload text, due time, level) of each order, and the orders themselves.
        let mut spec: Vec<(String, String, i64, Priority)> = Vec::new();
        let mut orders = Vec::new();
        match (case.get("orders"), case.get("generate")) {
            (Some(Value::Array(list)), None) => {
                for (i, o) in list.iter().enumerate() {
                    let o = o
                        .as_object()
                        .ok_or_else(|| format!("order {i} is not an object"))?;
                    if let Some(k) = o.keys().find(|k| !ORDER_KEYS.contains(&k.as_str())) {
                        return Err(format!("order {i}: unknown key {k:?}"));
                    }
                    let id = text(o, "id")?;
                    let payload_text = text(o, "payload")?;
                    let (when, _) = when_of(o)?;
                    // Each payload is built from its text, then its level parsed, before the
                    // call; an invalid one refuses the batch, naming its order.
                    let payload = match Payload::from_json(payload_text) {
                        Ok(p) => p,
                        Err(e) => return Ok(Outcome::invalid(&e, Some(i))),
                    };
                    let priority = match priority_of(o)? {
                        None => Priority::Normal,
                        Some(Ok(p)) => p,
                        Some(Err(e)) => return Ok(Outcome::invalid(&e, Some(i))),
                    };
                    spec.push((
                        id.into(),
                        stored_body(o, payload_text),
                        due_of(o, self.now),
                        priority,
                    ));
                    orders.push(expiring(
                        o,
                        NewOrder::new(id, when, payload).with_priority(priority),
                    )?);
                }
            }
            (None, Some(Value::Object(g))) => {
                let count = g
                    .get("count")
                    .and_then(Value::as_u64)
                    .ok_or("generate needs count")?;
                let prefix = text(g, "id_prefix")?;
                let payload_text = text(g, "payload")?;
                let (when, _) = when_of(g)?;
                let payload = match Payload::from_json(payload_text) {
                    Ok(p) => p,
                    Err(e) => return Ok(Outcome::invalid(&e, None)),
                };
                for i in 0..count {
                    let id = format!("{prefix}{i}");
                    spec.push((
                        id.clone(),
                        payload_text.into(),
                        due_of(g, self.now),
                        Priority::Normal,
                    ));
                    orders.push(NewOrder::new(id, when, payload.clone()));
                }
            }
            _ => return Err("needs exactly one of orders (a list) and generate".into()),
        }
        match admin::schedule_batch(&self.client, queue, &orders, mode).await {
            Ok(results) => {
                let spec: Vec<(&str, &str, i64, Priority)> = spec
                    .iter()
                    .map(|(id, p, due, level)| (id.as_str(), p.as_str(), *due, *level))
                    .collect();
                self.accepted(queue, &spec, &results).await?;
                Ok(Outcome::Ok(format!("{} scheduled", results.len())))
            }
            Err(e) => Ok(Outcome::of(&e)),
        }
    }

    /// After an accepted schedule: one result per order, in order, and what each written
    /// order left in Redis: its payload byte for byte, its due time and its level (an id
    /// repeated in a batch: its last write).
    async fn accepted(
        &mut self,
        queue: &str,
        orders: &[(&str, &str, i64, Priority)],
        results: &[Scheduled],
    ) -> Result<(), String> {
        if results.len() != orders.len() {
            return Err(format!(
                "{} results for {} orders",
                results.len(),
                orders.len()
            ));
        }
        let mut last: BTreeMap<&str, (&str, i64, Priority)> = BTreeMap::new();
        for ((id, payload, due, level), r) in orders.iter().zip(results) {
            if r.id != *id || r.due_at_ms != *due {
                return Err(format!(
                    "result {r:?} for order {id:?} due at {due} (now is {})",
                    self.now
                ));
            }
            if matches!(
                r.outcome,
                ScheduleOutcome::Created | ScheduleOutcome::Updated
            ) {
                last.insert(id, (payload, *due, *level));
            }
            self.scheduled.insert((queue.to_owned(), (*id).to_owned()));
        }
        let shards = *self
            .shards
            .get(queue)
            .ok_or_else(|| format!("accepted on the unregistered queue {queue:?}"))?;
        let q = QueueName::new(queue).map_err(|e| e.to_string())?;
        let mut conn = self.client.connection();
        for (id, (payload, due, level)) in last {
            let keys = self.client.keyspace().shard(&q, shard_of(id, shards));
            let stored: Option<Vec<u8>> = redis::cmd("HGET")
                .arg(&keys.payload)
                .arg(id)
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            let stored = stored.ok_or_else(|| format!("no payload stored for {id:?}"))?;
            // Stored as "<enqueued unix ms>:<the JSON text>" (after "!<ms>!" with an expiry).
            let json = stored
                .iter()
                .position(|&b| b == b':')
                .map(|i| &stored[i + 1..])
                .unwrap_or(&stored[..]);
            if json != payload.as_bytes() {
                return Err(format!(
                    "order {id:?}: stored payload differs from the text sent ({} bytes stored, {} sent)",
                    json.len(),
                    payload.len()
                ));
            }
            let got = self
                .client
                .get(queue, id)
                .await
                .map_err(|e| e.to_string())?;
            match got {
                Some(o) if o.due_at_ms == due && o.priority == level => {}
                other => {
                    return Err(format!(
                        "order {id:?}: stored (due time, level) {:?}, expected ({due}, {level})",
                        other.map(|o| (o.due_at_ms, o.priority))
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Redis's count of commands processed so far (this `INFO` included).
async fn commands_processed(client: &Client) -> u64 {
    let info: String = support::raw(client, &["INFO", "stats"]).await;
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("INFO stats has total_commands_processed")
}

fn short(s: &str) -> String {
    if s.chars().count() > 300 {
        format!("{}…", s.chars().take(300).collect::<String>())
    } else {
        s.to_owned()
    }
}

#[test]
fn the_file_is_well_formed_and_its_limits_are_the_librarys() {
    let doc = doc();
    let codes: Vec<&str> = doc["codes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    let mut names = HashSet::new();
    for c in doc["cases"].as_array().unwrap() {
        let c = c.as_object().unwrap();
        let name = c["name"].as_str().unwrap();
        assert!(names.insert(name), "case name {name:?} is not unique");
        assert!(OPS.contains(&c["op"].as_str().unwrap()), "{name}: op");
        for k in c.keys() {
            assert!(CASE_KEYS.contains(&k.as_str()), "{name}: unknown key {k:?}");
        }
        let expect = &c["expect"];
        assert!(
            expect.is_null() || codes.contains(&expect.as_str().unwrap()),
            "{name}: expect {expect}"
        );
        if let Some(p) = c.get("expect_priority") {
            assert_eq!(c["op"], "get", "{name}: expect_priority on another op");
            assert!(
                Priority::parse(p.as_str().unwrap()).is_ok(),
                "{name}: expect_priority {p}"
            );
        }
    }
    assert!(
        codes.contains(&"invalid_priority"),
        "codes lacks invalid_priority"
    );
    assert_eq!(
        Priority::parse("urgent").unwrap_err().code(),
        "invalid_priority",
        "the library's code for a bad level"
    );
    let lim = &doc["limits"];
    assert_eq!(lim["max_id_bytes"], MAX_ID_LEN);
    assert_eq!(lim["max_name_bytes"], MAX_NAME_LEN);
    assert_eq!(
        lim["max_payload_bytes"],
        delayq::engine::client::DEFAULT_MAX_PAYLOAD_BYTES
    );
    assert_eq!(lim["max_payload_depth"], MAX_PAYLOAD_DEPTH);
    assert_eq!(lim["max_ahead_ms"], MAX_AHEAD_MS);
    assert_eq!(lim["max_batch"], admin::MAX_BATCH);
    // enqueue_call_orders / enqueue_call_bytes are private to the client
    // (ENQUEUE_CHUNK_ORDERS, ENQUEUE_CHUNK_BYTES in src/engine/client/options.rs).
}

#[tokio::test]
async fn every_case_gives_the_expected_outcome() {
    let doc = doc();
    let now = doc["now_ms"].as_i64().unwrap();
    let namespace = doc["namespace"].as_str().unwrap().to_owned();
    let server = LocalRedis::start().expect("start redis-server");
    let url = server.url();
    let clock = Arc::new(ManualClock::new(now));
    let dyn_clock: Arc<dyn Clock> = clock.clone();
    let client = Client::connect_with_clock(
        &url,
        ClientOptions::default().namespace(&namespace),
        dyn_clock,
    )
    .await
    .expect("connect");
    let mut shards = HashMap::new();
    for q in doc["queues"].as_array().unwrap() {
        let name = q["name"].as_str().unwrap();
        let n = u16::try_from(q["shards"].as_u64().unwrap()).unwrap();
        client
            .admin()
            .create_queue(name, n)
            .await
            .expect("create queue");
        shards.insert(name.to_owned(), n);
    }
    let mut run = Run {
        url,
        clock,
        namespace,
        now,
        client: client.clone(),
        shards,
        scheduled: HashSet::new(),
    };
    assert_eq!(run.client.keyspace().namespace(), run.namespace);

    let cases = doc["cases"].as_array().unwrap();
    let mut failures: Vec<String> = Vec::new();
    for case in cases {
        let case = case.as_object().unwrap();
        let name = case["name"].as_str().unwrap_or("(no name)");
        let expected = match &case["expect"] {
            Value::Null => None,
            Value::String(code) => Some(Outcome::Refused {
                code: code.clone(),
                index: case
                    .get("index")
                    .and_then(Value::as_u64)
                    .map(|i| usize::try_from(i).unwrap()),
            }),
            other => {
                failures.push(format!("{name}: expect is {other}"));
                continue;
            }
        };
        let before = support::snapshot(&client).await;
        let commands_before = commands_processed(&client).await;
        let got = match run.call(case).await {
            Ok(o) => o,
            Err(e) => {
                failures.push(format!("{name}: {}", short(&e)));
                continue;
            }
        };
        let commands_after = commands_processed(&client).await;
        let agrees = match (&expected, &got) {
            (None, Outcome::Ok(_)) => true,
            (
                Some(Outcome::Refused { code, index }),
                Outcome::Refused {
                    code: got_code,
                    index: got_index,
                },
            ) => {
                code == got_code
                    && match index {
                        Some(_) => index == got_index,
                        // A single call's error names no batch index.
                        None => case["op"] == "schedule_many" || got_index.is_none(),
                    }
            }
            _ => false,
        };
        if !agrees {
            let want = match &expected {
                None => "success".to_owned(),
                Some(e) => format!("{e:?}"),
            };
            failures.push(format!(
                "{name}: expected {want}, got {}",
                short(&format!("{got:?}"))
            ));
        }
        if matches!(got, Outcome::Refused { .. } | Outcome::Other(_)) {
            // A refused call wrote nothing.
            if support::snapshot(&client).await != before {
                failures.push(format!("{name}: refused ({got:?}) but Redis changed"));
            }
            // An input error is found before anything is sent to Redis (README, "The order
            // of checks": nothing is read before checks 1-4 pass): only our INFO ran.
            if got.is_input_error() && commands_after != commands_before + 1 {
                failures.push(format!(
                    "{name}: refused ({got:?}) after sending {} command(s) to Redis",
                    commands_after - commands_before - 1
                ));
            }
        }
    }
    drop(server);
    assert!(
        failures.is_empty(),
        "{} of {} conformance cases disagree with tests/conformance/inputs.json:\n  {}",
        failures.len(),
        cases.len(),
        failures.join("\n  ")
    );
    println!("{} conformance cases agree", cases.len());
}
