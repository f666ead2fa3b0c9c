//! Expiry of stale work: an order that would be handed to a consumer group later than
//! `due + expires_after` is not handed to that group.
//!
//! **Where the limit comes from.** An order's own `expires_after` (stored with it, see
//! below), else its queue's default (the registry record's field [`QUEUE_FIELD`], set with
//! [`Queues::set_expires_after`](crate::engine::admin::Queues::set_expires_after)), else
//! none. The queue default is read by the workers at hand-off time (with the pause flags,
//! at most [`PAUSE_REFRESH`](crate::engine::flow::PAUSE_REFRESH) stale), so it applies to
//! orders scheduled before it was set and by producers that know nothing of it.
//!
//! **Where it is checked.** Where an entry is handed to a group's handler: a worker's read
//! (`read.lua`) and every redelivery (a retry's or a dead consumer's reclaim,
//! `reclaim.lua`) go through one check ([`lateness`]) just before the handler would run,
//! so an entry that waited for a handler slot in a backlog is judged when it would start.
//! An expired entry is dead-lettered for that group alone (`dead.lua` with the lateness:
//! the dead letter carries `reason expired` and `late_ms`, its error reads
//! `expired: ...`, the group's history says `expired` with the lateness) and counted in
//! `delayq_expired_total{queue,group}`; the other groups are judged on their own. A dead
//! letter replayed by an operator (`for_group`) is an explicit decision and is delivered
//! whatever its age.
//!
//! **How it is stored.** In front of the payload in the stored value, as the trace context
//! is: `"<enqueued_ms>:!<expires_after_ms>!<rest>"`, where `<rest>` is the payload or the
//! trace-prefixed payload. `!` never starts a JSON text, so every reader strips it and the
//! payload reads back byte for byte. An order without expiry stores exactly the bytes it
//! always had: the dispatcher forwards the value as is, and no script does string work on
//! it, so orders without expiry cost what they did.

use crate::engine::duration::{MAX_DURATION, format_duration, ms};
use crate::engine::error::InvalidInput;
use std::time::Duration;

/// The registry record field holding a queue's default `expires_after`, in ms (absent: no
/// default).
pub(crate) const QUEUE_FIELD: &str = "expires_after_ms";

/// The name of the option on every surface (in errors, JSON and conformance data).
pub const FIELD: &str = "expires_after";

/// The dead-letter reason of an expired order (its `reason` field, and the start of its
/// error text).
pub const REASON: &str = "expired";

/// Checks an order's `expires_after` in milliseconds: 1 ms ..= 10 years
/// ([`MAX_DURATION`]); zero and negative values are refused, naming the field.
pub fn check_ms(expires_after_ms: i64) -> Result<i64, InvalidInput> {
    if expires_after_ms < 1 || expires_after_ms > ms(MAX_DURATION) {
        return Err(InvalidInput::Option {
            name: FIELD,
            reason: format!(
                "must be 1ms..=10 years (3653d), got {expires_after_ms} ms{}",
                if expires_after_ms == 0 {
                    " (leave it out for no expiry)"
                } else {
                    ""
                }
            ),
        });
    }
    Ok(expires_after_ms)
}

/// Checks a duration given for `expires_after` (the CLI's and HTTP's text, a library
/// [`Duration`]): as [`check_ms`]; a sub-millisecond duration is refused too.
pub fn check(d: Duration) -> Result<i64, InvalidInput> {
    check_ms(ms(d))
}

/// `expires_after` as text (the CLI's `--expires-after`, HTTP's string form): a duration
/// (`500ms`, `30s`, `15m`, `1h30m`, `2d`), checked as [`check`].
pub fn parse(text: &str) -> Result<i64, InvalidInput> {
    check(crate::engine::duration::parse_duration(FIELD, text)?)
}

/// `expires_after` in a JSON body: a duration string (as [`parse`]) or whole milliseconds
/// (as [`check_ms`]); anything else is refused naming the field.
pub fn from_json(v: &serde_json::Value) -> Result<i64, InvalidInput> {
    match v {
        serde_json::Value::String(s) => parse(s),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(ms) => check_ms(ms),
            None => Err(InvalidInput::Option {
                name: FIELD,
                reason: format!("{n} is not whole milliseconds"),
            }),
        },
        _ => Err(InvalidInput::Option {
            name: FIELD,
            reason: "must be a duration (\"30m\") or whole milliseconds".into(),
        }),
    }
}

/// A queue's default: zero clears it (no default), anything else as [`check`].
pub fn check_queue_default(d: Duration) -> Result<Option<i64>, InvalidInput> {
    if d.is_zero() {
        return Ok(None);
    }
    check(d).map(Some)
}

/// The stored form of an order's body with its expiry: `!<ms>!<body>`.
pub(crate) fn encode(expires_after_ms: i64, body: &str) -> String {
    format!("!{expires_after_ms}!{body}")
}

/// Splits the part of a stored value after `<enqueued_ms>:` into its expiry and the rest
/// (the trace-prefixed or plain payload). A body that does not start with `!<n>!`, `n` a
/// canonical positive decimal (`[1-9][0-9]*`, as every producer writes it), has no expiry
/// and is returned whole.
pub(crate) fn split_stored(body: &str) -> (Option<i64>, &str) {
    let Some(rest) = body.strip_prefix('!') else {
        return (None, body);
    };
    let Some(end) = rest.find('!') else {
        return (None, body);
    };
    let digits = &rest[..end];
    let canonical = digits.bytes().all(|b| b.is_ascii_digit()) && !digits.starts_with('0');
    match digits.parse::<i64>() {
        Ok(n) if canonical && n > 0 => (Some(n), &rest[end + 1..]),
        _ => (None, body),
    }
}

/// The expiry of a stored value `"<enqueued_ms>:<body>"` (`None` when it has none).
pub(crate) fn of_stored(raw: &str) -> Option<i64> {
    raw.split_once(':')
        .and_then(|(_, body)| split_stored(body).0)
}

/// How late (ms) handing an order due at `due_ms` to a group at `now_ms` would be past its
/// limit `expires_after_ms`: `Some(late)` when `now_ms > due_ms + expires_after_ms` (the
/// order is expired for that group), `None` when it is in time.
pub fn lateness(due_ms: i64, expires_after_ms: i64, now_ms: i64) -> Option<i64> {
    let deadline = due_ms.saturating_add(expires_after_ms);
    (now_ms > deadline).then(|| now_ms - deadline)
}

/// The error text of an expired order's dead letter: `expired: <late> ms past due +
/// expires_after (<limit>)`.
pub(crate) fn error_text(late_ms: i64, expires_after_ms: i64) -> String {
    let limit = Duration::from_millis(u64::try_from(expires_after_ms).unwrap_or(0));
    format!(
        "{REASON}: handed to the group {late_ms} ms after due + expires_after ({})",
        format_duration(limit)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_names_the_field() {
        assert_eq!(check_ms(1), Ok(1));
        assert_eq!(check_ms(ms(MAX_DURATION)), Ok(ms(MAX_DURATION)));
        for bad in [0, -1, ms(MAX_DURATION) + 1] {
            let e = check_ms(bad).unwrap_err();
            assert!(e.to_string().contains("expires_after"), "{e}");
            assert_eq!(e.code(), "invalid_option");
        }
        assert!(check(Duration::from_micros(500)).is_err());
        assert_eq!(parse("1m30s"), Ok(90_000));
        assert_eq!(from_json(&serde_json::json!("1s")), Ok(1000));
        assert_eq!(from_json(&serde_json::json!(250)), Ok(250));
        for bad in [
            serde_json::json!("0s"),
            serde_json::json!("-1s"),
            serde_json::json!("3654d"),
            serde_json::json!(0),
            serde_json::json!(-5),
            serde_json::json!(1.5),
            serde_json::json!(true),
        ] {
            let e = from_json(&bad).unwrap_err();
            assert!(e.to_string().contains("expires_after"), "{bad}: {e}");
        }
        assert_eq!(check_queue_default(Duration::ZERO), Ok(None));
        assert_eq!(check_queue_default(Duration::from_secs(1)), Ok(Some(1000)));
    }

    #[test]
    fn stored_values_round_trip() {
        let body = encode(1500, "~00-x~{\"a\":1}");
        assert_eq!(split_stored(&body), (Some(1500), "~00-x~{\"a\":1}"));
        assert_eq!(of_stored(&format!("12:{body}")), Some(1500));
        assert_eq!(split_stored("{\"a\":1}"), (None, "{\"a\":1}"));
        assert_eq!(split_stored("!x!1"), (None, "!x!1"));
        assert_eq!(split_stored("!0!1"), (None, "!0!1"));
        assert_eq!(split_stored("!+5!1"), (None, "!+5!1"));
        assert_eq!(split_stored("!05!1"), (None, "!05!1"));
        assert_eq!(split_stored("!12"), (None, "!12"));
        assert_eq!(of_stored("12:[1]"), None);
    }

    #[test]
    fn lateness_is_past_the_deadline_only() {
        assert_eq!(lateness(1000, 500, 1500), None);
        assert_eq!(lateness(1000, 500, 1501), Some(1));
        assert_eq!(lateness(1000, 500, 4000), Some(2500));
        assert_eq!(lateness(i64::MAX - 1, 500, i64::MAX), None);
    }
}
