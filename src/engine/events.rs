//! Cancel-on-event (issue 43 items 4-5): a queue declares rules such as `{event =
//! "order.paid", match = ["order_id"]}`, and an event named `order.paid` whose
//! `data.order_id` equals an order's `payload.order_id` cancels that order.
//!
//! **Rules** (the one place, for every surface; errors name the field `cancel_on`): at most
//! [`MAX_RULES`] per queue, each an event name (1..=[`MAX_EVENT_LEN`] bytes of `A-Z a-z 0-9
//! . _ - : /`), 1..=[`MAX_MATCH`] match paths (dotted JSON object paths such as
//! `order_id` or `customer.id`: segments of `A-Z a-z 0-9 _ -`; a rule without one is refused,
//! since it would cancel everything) and a `remember` window (default 15 min, at most 7 days).
//!
//! **Match tokens.** At schedule time, each rule of the order's queue whose match paths
//! all hold a JSON scalar (string, number, boolean) in the payload gives the order one
//! *token*, `\x01<event> {"<path>":<value JSON>,...}` (paths in the rule's order, values
//! as compact JSON: `1234` and `"1234"` differ). A missing field, `null`, an array or an
//! object: the rule does not apply to that order. A token is stored as a tag of the order
//! (its leading control character is one no user tag can hold), so the tag index keeps it
//! exact (enqueue, cancel, dispatch) and [`crate::engine::tags`] hides it from every
//! reader. An event computes the same token from its `data` and cancels by it, through
//! the bounded batches of the tag actions (`tag_bulk.lua`): an order is either cancelled or
//! dispatched, never both.
//!
//! **Event first.** Before cancelling, an event records its token per shard of each
//! matching queue (`{ns:q:s}:remembered`, token -> expiry ms, at most [`MAX_REMEMBERED`]
//! per shard): `enqueue.lua` answers `cancelled_by_event` for a new order with a
//! remembered token, and writes nothing. Orders of a queue without rules carry no token
//! and pay nothing (the script looks for tokens only in a call that carries tags).
//!
//! **Order rules.** An order may declare rules of its own on schedule (same type, same
//! checks, at most [`MAX_RULES`]): its payload gives their tokens as above, but with the
//! rule's window in the event part (`\x01<event>@<remember ms> {...}`), so that a
//! remembered event refuses an order exactly within that order's window, whatever other
//! rules of the same event say. The queue keeps the distinct rules its orders declared
//! (fields `order_rule:<rule JSON>` of its registry record, at most [`MAX_ORDER_RULES`],
//! written by `order_rules.lua` before the first order declaring one is scheduled),
//! and an event computes its tokens for them as for the queue's rules: it cancels the
//! orders that declared a matching rule and is remembered for them. An event that arrives
//! before any order of the queue ever declared its rule is not remembered for that rule.
//!
//! **Rule versions.** A queue's rules live in its registry record (field [`RECORD_FIELD`],
//! JSON with a version); each shard's meta hash holds the version, and `enqueue.lua` refuses a
//! producer whose cached version differs (it re-reads the record and retries), so no order
//! is scheduled under rules older than a change that has answered.

use crate::engine::error::InvalidInput;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The name of the option on every surface (errors, JSON, configuration).
pub const FIELD: &str = "cancel_on";

/// The registry record's and the shard meta hash's field holding a queue's rules.
pub const RECORD_FIELD: &str = "cancel_on";

/// Most rules per queue.
pub const MAX_RULES: usize = 8;

/// Most match paths per rule.
pub const MAX_MATCH: usize = 4;

/// Longest event name, in bytes.
pub const MAX_EVENT_LEN: usize = 128;

/// Longest match path, in bytes.
pub const MAX_PATH_LEN: usize = 128;

/// Longest matched value (its compact JSON), in bytes.
pub const MAX_VALUE_LEN: usize = 256;

/// The default `remember` window: 15 minutes.
pub const DEFAULT_REMEMBER_MS: i64 = 15 * 60 * 1000;

/// The longest `remember` window: 7 days.
pub const MAX_REMEMBER_MS: i64 = 7 * 24 * 3600 * 1000;

/// Most remembered tokens per shard (the soonest to expire go first beyond it).
pub const MAX_REMEMBERED: usize = 100_000;

/// Longest event id, in bytes.
pub const MAX_EVENT_ID_LEN: usize = 128;

/// Most events in one posted batch.
pub const MAX_EVENT_BATCH: usize = 1000;

/// The first character of a match token (ASCII SOH; user tags refuse control characters).
pub(crate) const TOKEN: char = '\u{1}';

/// One rule: orders whose payload matches the event's data on every path of `match_paths`
/// are cancelled by an event named `event`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRule {
    /// The event name.
    pub event: String,
    /// The JSON paths compared (payload against the event's data).
    #[serde(rename = "match")]
    pub match_paths: Vec<String>,
    /// How long an event that arrives first is remembered, ms.
    pub remember_ms: i64,
}

fn bad(reason: String) -> InvalidInput {
    InvalidInput::Option {
        name: FIELD,
        reason,
    }
}

/// Checks an event name: 1..=[`MAX_EVENT_LEN`] bytes of `A-Z a-z 0-9 . _ - : /`; the reason.
fn check_event(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the event name must not be empty".into());
    }
    if name.len() > MAX_EVENT_LEN {
        return Err(format!(
            "the event name must be at most {MAX_EVENT_LEN} bytes, got {}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || ".-_:/".contains(*c)))
    {
        return Err(format!(
            "the event name holds {c:?} (use A-Z a-z 0-9 . _ - : /)"
        ));
    }
    Ok(())
}

/// Checks a posted event's name; the error names the field `name`.
pub fn validate_event_name(name: &str) -> Result<(), InvalidInput> {
    check_event(name).map_err(|reason| InvalidInput::Option {
        name: "name",
        reason,
    })
}

/// Checks a posted event's id (the rule of order ids, at most [`MAX_EVENT_ID_LEN`] bytes);
/// the error names the field `id`.
pub fn validate_event_id(id: &str) -> Result<(), InvalidInput> {
    crate::engine::keys::validate_text(id, MAX_EVENT_ID_LEN)
        .map_err(|reason| InvalidInput::Option { name: "id", reason })
}

/// Checks a match path: dotted segments of `A-Z a-z 0-9 _ -`, at most [`MAX_PATH_LEN`]
/// bytes (a JSON scalar's path in an object: no `$`, brackets or wildcards).
fn check_path(p: &str) -> Result<(), String> {
    if p.is_empty() || p.len() > MAX_PATH_LEN {
        return Err(format!("match path {p:?} must be 1..={MAX_PATH_LEN} bytes"));
    }
    let ok = p.split('.').all(|s| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    });
    if !ok {
        return Err(format!(
            "match path {p:?} is not a JSON field path (dotted names of A-Z a-z 0-9 _ -, such as order_id or customer.id)"
        ));
    }
    Ok(())
}

impl CancelRule {
    /// A checked rule (`remember_ms` `None`: [`DEFAULT_REMEMBER_MS`]).
    pub fn new(
        event: impl Into<String>,
        match_paths: Vec<String>,
        remember_ms: Option<i64>,
    ) -> Result<Self, InvalidInput> {
        let r = CancelRule {
            event: event.into(),
            match_paths,
            remember_ms: remember_ms.unwrap_or(DEFAULT_REMEMBER_MS),
        };
        r.validate()?;
        Ok(r)
    }

    /// Checks the rule; the error names the field `cancel_on`.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        check_event(&self.event).map_err(bad)?;
        if self.match_paths.is_empty() {
            return Err(bad(format!(
                "the rule for {} has no match field (it would cancel every order)",
                self.event
            )));
        }
        if self.match_paths.len() > MAX_MATCH {
            return Err(bad(format!("at most {MAX_MATCH} match fields per rule")));
        }
        for (i, p) in self.match_paths.iter().enumerate() {
            check_path(p).map_err(bad)?;
            if self.match_paths[..i].contains(p) {
                return Err(bad(format!("match path {p:?} is given twice")));
            }
        }
        if !(1..=MAX_REMEMBER_MS).contains(&self.remember_ms) {
            return Err(bad("remember must be 1 ms..=7 days".into()));
        }
        Ok(())
    }

    /// The token of a JSON document (an order's payload, an event's data) under this
    /// rule: `None` when a path holds no scalar. Refused (naming `cancel_on`) when a value
    /// is longer than [`MAX_VALUE_LEN`].
    pub fn token(&self, doc: &Value) -> Result<Option<String>, InvalidInput> {
        self.token_as(doc, false)
    }

    /// The token under this rule declared by an order itself (see "Order rules" in the
    /// module docs): the event name carries the rule's window, `<event>@<remember ms>`, so
    /// that a remembered event answers exactly for that window.
    pub(crate) fn order_token(&self, doc: &Value) -> Result<Option<String>, InvalidInput> {
        self.token_as(doc, true)
    }

    fn token_as(&self, doc: &Value, order: bool) -> Result<Option<String>, InvalidInput> {
        let mut s = String::new();
        s.push(TOKEN);
        s.push_str(&self.event);
        if order {
            s.push('@');
            s.push_str(&self.remember_ms.to_string());
        }
        s.push_str(" {");
        for (i, p) in self.match_paths.iter().enumerate() {
            let Some(v) = scalar_at(doc, p) else {
                return Ok(None);
            };
            let text = v.to_string();
            if text.len() > MAX_VALUE_LEN {
                return Err(bad(format!(
                    "the value at {p} is longer than {MAX_VALUE_LEN} bytes"
                )));
            }
            if i > 0 {
                s.push(',');
            }
            s.push_str(&Value::String(p.clone()).to_string());
            s.push(':');
            s.push_str(&text);
        }
        s.push('}');
        Ok(Some(s))
    }
}

/// The scalar (string, number, boolean) at a dotted path of `doc`.
fn scalar_at<'a>(doc: &'a Value, path: &str) -> Option<&'a Value> {
    let mut v = doc;
    for seg in path.split('.') {
        v = v.as_object()?.get(seg)?;
    }
    matches!(v, Value::String(_) | Value::Number(_) | Value::Bool(_)).then_some(v)
}

/// Checks a queue's rule list: at most [`MAX_RULES`], each valid, none twice.
pub fn validate_rules(rules: &[CancelRule]) -> Result<(), InvalidInput> {
    if rules.len() > MAX_RULES {
        return Err(bad(format!(
            "at most {MAX_RULES} rules per queue, got {}",
            rules.len()
        )));
    }
    for (i, r) in rules.iter().enumerate() {
        r.validate()?;
        if rules[..i]
            .iter()
            .any(|o| o.event == r.event && o.match_paths == r.match_paths)
        {
            return Err(bad(format!("the rule for {} is given twice", r.event)));
        }
    }
    Ok(())
}

/// `cancel_on` in a JSON body or configuration: an array of `{"event": ..., "match": "f"
/// or ["f", ...], "remember": "15m"}`; anything else is refused naming the field.
pub fn rules_from_json(v: &Value) -> Result<Vec<CancelRule>, InvalidInput> {
    let list = v
        .as_array()
        .ok_or_else(|| bad("must be an array of rules {event, match, remember}".into()))?;
    let rules = list
        .iter()
        .map(|r| {
            let o = r.as_object().ok_or_else(|| {
                bad("each rule must be an object {event, match, remember}".into())
            })?;
            if let Some(k) = o
                .keys()
                .find(|k| !["event", "match", "remember"].contains(&k.as_str()))
            {
                return Err(bad(format!(
                    "unknown rule field {k:?} (event, match, remember)"
                )));
            }
            let event = match o.get("event") {
                Some(Value::String(s)) => s.clone(),
                _ => return Err(bad("a rule needs an event name (a string)".into())),
            };
            let paths = match o.get("match") {
                Some(Value::String(s)) => vec![s.clone()],
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|p| {
                        p.as_str().map(str::to_owned).ok_or_else(|| {
                            bad("match must be a field path or an array of them".into())
                        })
                    })
                    .collect::<Result<_, _>>()?,
                None => Vec::new(),
                Some(_) => {
                    return Err(bad("match must be a field path or an array of them".into()));
                }
            };
            let remember = match o.get("remember") {
                None => None,
                Some(Value::String(t)) => Some(crate::engine::duration::ms(
                    crate::engine::duration::parse_duration(FIELD, t)?,
                )),
                Some(_) => return Err(bad("remember must be a duration such as 15m".into())),
            };
            CancelRule::new(event, paths, remember)
        })
        .collect::<Result<Vec<_>, _>>()?;
    validate_rules(&rules)?;
    Ok(rules)
}

/// A rule written on the command line: `EVENT:FIELD[,FIELD...][@REMEMBER]`, e.g.
/// `order.paid:order_id` or `order.paid:order_id,customer.id@30m`.
pub fn parse_rule(spec: &str) -> Result<CancelRule, InvalidInput> {
    let (rest, remember) = match spec.rsplit_once('@') {
        Some((r, t)) => (
            r,
            Some(crate::engine::duration::ms(
                crate::engine::duration::parse_duration(FIELD, t)?,
            )),
        ),
        None => (spec, None),
    };
    let Some((event, fields)) = rest.split_once(':').filter(|(_, f)| !f.is_empty()) else {
        return Err(bad(format!(
            "{spec:?} has no match field (write EVENT:FIELD[,FIELD][@REMEMBER], e.g. order.paid:order_id)"
        )));
    };
    CancelRule::new(
        event,
        fields.split(',').map(str::to_owned).collect(),
        remember,
    )
}

/// Whether a stored tag is a match token (hidden from readers).
pub(crate) fn is_token(tag: &str) -> bool {
    tag.starts_with(TOKEN)
}

/// The event name of a match token (an order rule's without its `@<remember ms>`).
pub(crate) fn event_of_token(token: &str) -> &str {
    let t = token.strip_prefix(TOKEN).unwrap_or(token);
    let e = t.split_once(' ').map_or(t, |(e, _)| e);
    e.split_once('@').map_or(e, |(e, _)| e)
}

/// Most distinct rules that a queue's orders may declare for themselves (a schedule that
/// would add one more is refused, naming `cancel_on`).
pub const MAX_ORDER_RULES: usize = 64;

/// The prefix of a queue record's fields that hold the rules its orders declared.
pub(crate) const ORDER_RULE_PREFIX: &str = "order_rule:";

/// A rule declared by an order, as the queue's record keeps it: the field
/// `order_rule:<rule JSON>` (`order_rules.lua`).
pub(crate) fn order_rule_field(rule: &CancelRule) -> String {
    format!(
        "{ORDER_RULE_PREFIX}{}",
        serde_json::to_string(rule).unwrap_or_default()
    )
}

/// A record field read back as an order rule (`None`: another field, or a rule this
/// version does not read).
pub(crate) fn parse_order_rule(field: &str) -> Option<CancelRule> {
    field
        .strip_prefix(ORDER_RULE_PREFIX)
        .and_then(|j| serde_json::from_str::<CancelRule>(j).ok())
        .filter(|r| r.validate().is_ok())
}

/// A queue's rules as its record stores them: the version and the list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredRules {
    /// Changes with every write of the rules (the shards' meta hashes hold it).
    pub v: String,
    /// The rules.
    pub rules: Vec<CancelRule>,
}

impl StoredRules {
    /// The record's value parsed; a value this version cannot read counts as no rules.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_are_checked_naming_the_field() {
        let ok = rules_from_json(&json!([{"event": "order.paid", "match": "order_id"}])).unwrap();
        assert_eq!(ok[0].match_paths, vec!["order_id".to_owned()]);
        assert_eq!(ok[0].remember_ms, DEFAULT_REMEMBER_MS);
        for bad in [
            json!({"event": "a"}),
            json!([{"event": "order.paid"}]),
            json!([{"event": "order.paid", "match": []}]),
            json!([{"event": "", "match": "a"}]),
            json!([{"event": "a\u{1}b", "match": "a"}]),
            json!([{"event": "x".repeat(129), "match": "a"}]),
            json!([{"event": "a", "match": "$.a"}]),
            json!([{"event": "a", "match": "a[0]"}]),
            json!([{"event": "a", "match": "a..b"}]),
            json!([{"event": "a", "match": "a", "remember": "0s"}]),
            json!([{"event": "a", "match": "a", "other": 1}]),
        ] {
            let e = rules_from_json(&bad).unwrap_err();
            assert!(e.to_string().contains("cancel_on"), "{bad}: {e}");
        }
        assert!(parse_rule("order.paid").is_err());
        assert!(parse_rule("order.paid:").is_err());
        let r = parse_rule("order.paid:order_id,customer.id@30m").unwrap();
        assert_eq!(r.match_paths.len(), 2);
        assert_eq!(r.remember_ms, 30 * 60 * 1000);
        assert!(
            validate_event_name("")
                .unwrap_err()
                .to_string()
                .contains("name")
        );
    }

    #[test]
    fn tokens_match_payloads_and_data() {
        let r = parse_rule("order.paid:order_id,customer.id").unwrap();
        let pay = json!({"order_id": 1234, "customer": {"id": "42"}, "x": [1]});
        let t = r.token(&pay).unwrap().unwrap();
        assert_eq!(
            t,
            "\u{1}order.paid {\"order_id\":1234,\"customer.id\":\"42\"}"
        );
        assert_eq!(event_of_token(&t), "order.paid");
        assert!(is_token(&t));
        let data = json!({"customer": {"id": "42"}, "order_id": 1234, "amount": 5});
        assert_eq!(r.token(&data).unwrap().as_deref(), Some(t.as_str()));
        // A string is not the number it spells; a missing or non-scalar field: no token.
        assert_ne!(
            r.token(&json!({"order_id": "1234", "customer": {"id": "42"}}))
                .unwrap(),
            Some(t)
        );
        assert_eq!(r.token(&json!({"order_id": 1})).unwrap(), None);
        assert_eq!(
            r.token(&json!({"order_id": [1], "customer": {"id": "42"}}))
                .unwrap(),
            None
        );
        let long = json!({"order_id": "x".repeat(300), "customer": {"id": 1}});
        assert!(r.token(&long).is_err());
    }
}
