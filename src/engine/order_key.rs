//! An order's **key** (issue 42): an optional text (`merchant:17`, `order:1234`) that groups
//! orders, so that a backlogged queue shares its dispatch fairly between keys.
//!
//! **The rule.** 1..=[`MAX_KEY_LEN`] bytes of UTF-8, no control characters (the id rule,
//! [`crate::engine::keys`]); refused naming the field [`FIELD`] on every surface.
//!
//! **How it is stored.** In the stored value, after `<enqueued_ms>:` and the expiry prefix
//! (`!<ms>!`, [`crate::engine::expiry`]), before the tags and trace prefixes:
//! `\x1e<key>\x1e` (ASCII RS). A key holds no control character and a JSON text never
//! starts with RS, so the prefix is unambiguous; an order without a key stores exactly the
//! bytes it stored before keys existed. The dispatcher copies the value into the stream
//! entry as is, so the key travels with every delivery, retry, reclaim, dead letter and
//! replay ([`crate::Delivery::key`]).
//!
//! **Fair share.** A shard that holds keyed orders also indexes them (the shard keys
//! [`crate::engine::keys::ShardKeys::keyed`] and `key_ring`, kept by `enqueue.lua`,
//! `cancel.lua`, `reschedule.lua` and `dequeue.lua`); `dequeue.lua` then moves due orders
//! into the streams round robin between the keys that have due work, unkeyed orders being
//! one more participant. See ARCHITECTURE.md ("Order keys").

use crate::engine::error::InvalidInput;
use crate::engine::keys::validate_text;

/// Longest order key, in bytes.
pub const MAX_KEY_LEN: usize = 128;

/// The name of the field on every surface (errors, JSON, CLI, conformance data).
pub const FIELD: &str = "key";

/// The delimiter around the key in the stored value (ASCII RS).
pub(crate) const DELIM: char = '\x1e';

/// Validates an order key: 1..=128 bytes of UTF-8, no control characters.
pub fn validate(key: &str) -> Result<(), InvalidInput> {
    validate_text(key, MAX_KEY_LEN).map_err(|reason| InvalidInput::Option {
        name: FIELD,
        reason,
    })
}

/// The stored form of an order's body with its key: `\x1e<key>\x1e<body>`.
pub(crate) fn encode(key: &str, body: &str) -> String {
    format!("{DELIM}{key}{DELIM}{body}")
}

/// Splits the part of a stored value after the expiry prefix into its key and the rest
/// (the tags-, trace-prefixed or plain payload). A body that does not start with
/// `\x1e<key>\x1e` has no key and is returned whole.
pub(crate) fn split_stored(body: &str) -> (Option<&str>, &str) {
    let Some(rest) = body.strip_prefix(DELIM) else {
        return (None, body);
    };
    match rest.find(DELIM) {
        Some(end) if end > 0 => (Some(&rest[..end]), &rest[end + 1..]),
        _ => (None, body),
    }
}

/// The key of a stored value `"<enqueued_ms>:<body>"` (`None` when it has none).
pub(crate) fn of_stored(raw: &str) -> Option<&str> {
    let (_, body) = raw.split_once(':')?;
    let (_, rest) = crate::engine::expiry::split_stored(body);
    split_stored(rest).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_names_the_field() {
        assert!(validate("merchant:17").is_ok());
        assert!(validate("заказ 42").is_ok());
        assert!(validate(&"k".repeat(128)).is_ok());
        for bad in [
            String::new(),
            "k".repeat(129),
            "a\u{1e}b".into(),
            "a\nb".into(),
        ] {
            let e = validate(&bad).unwrap_err();
            assert!(e.to_string().contains("key"), "{bad:?}: {e}");
            assert_eq!(e.code(), "invalid_option");
        }
    }

    #[test]
    fn stored_values_round_trip() {
        let body = encode("merchant:17", "~00-x~{\"a\":1}");
        assert_eq!(
            split_stored(&body),
            (Some("merchant:17"), "~00-x~{\"a\":1}")
        );
        let expiring = crate::engine::expiry::encode(500, &body);
        assert_eq!(of_stored(&format!("12:{expiring}")), Some("merchant:17"));
        assert_eq!(of_stored(&format!("12:{body}")), Some("merchant:17"));
        assert_eq!(of_stored("12:{\"a\":1}"), None);
        assert_eq!(split_stored("\u{1e}\u{1e}1"), (None, "\u{1e}\u{1e}1"));
        assert_eq!(split_stored("\u{1e}open"), (None, "\u{1e}open"));
    }
}
