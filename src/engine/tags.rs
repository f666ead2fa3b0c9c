//! Tags on orders (issue 43): labels such as `customer:42` or `order:1234` that an order
//! carries, so that every order with a tag can be listed, counted, cancelled or moved
//! together.
//!
//! **Rules** (the one place, for every surface; the SDKs mirror them through
//! `tests/conformance/inputs.json`): at most [`MAX_TAGS`] tags per order, each 1..=
//! [`MAX_TAG_LEN`] bytes of UTF-8 without control characters (the rule of ids), no tag
//! given twice. Errors name the field [`FIELD`].
//!
//! **How they are stored.** In the stored value, after the `!<expires_after_ms>!` and key
//! prefixes and before the trace context: `"<enqueued_ms>:[!..!][\x1e<key>\x1e]\x1d<tag1>\x1f
//! <tag2>...\x1d[~<trace>~]<json>"` (ASCII GS around the list, US between tags). Tags
//! forbid control characters and a JSON text never holds a raw one, so the first GS of a
//! stored value opens the list. An order without tags stores exactly the bytes it stored
//! before tags existed. The dispatcher copies the value into the stream entry, so the tags
//! travel with every delivery, retry, dead letter and replay.
//!
//! **The index.** Each shard keeps one ZSET, [`crate::engine::keys::ShardKeys::tags`]
//! (`{ns:q:s}:tags`), score 0, one member `<tag>\x1f<id>` per tag of each scheduled order,
//! written by the scripts that write orders (see ARCHITECTURE.md, "Tags").

use crate::engine::error::InvalidInput;

/// The name of the option on every surface (in errors, JSON and conformance data).
pub const FIELD: &str = "tags";

/// Most tags per order.
pub const MAX_TAGS: usize = 10;

/// Longest tag, in bytes.
pub const MAX_TAG_LEN: usize = 128;

/// Opens and closes the stored tag list (ASCII GS).
pub(crate) const OPEN: char = '\u{1d}';

/// Separates stored tags, and a tag from the id in an index member (ASCII US).
pub(crate) const SEP: char = '\u{1f}';

/// Checks an order's tags: at most [`MAX_TAGS`], each 1..=[`MAX_TAG_LEN`] bytes without
/// control characters, none twice. The error names the field `tags`.
pub fn validate(tags: &[String]) -> Result<(), InvalidInput> {
    if tags.len() > MAX_TAGS {
        return Err(InvalidInput::Option {
            name: FIELD,
            reason: format!("at most {MAX_TAGS} tags per order, got {}", tags.len()),
        });
    }
    for (i, t) in tags.iter().enumerate() {
        validate_one(t).map_err(|e| InvalidInput::Option {
            name: FIELD,
            reason: format!("tag {i}: {e}"),
        })?;
        if tags[..i].contains(t) {
            return Err(InvalidInput::Option {
                name: FIELD,
                reason: format!("tag {i} ({t:?}) is given twice"),
            });
        }
    }
    Ok(())
}

/// Checks one tag (a bulk action's, a filter's): 1..=[`MAX_TAG_LEN`] bytes without control
/// characters. The error names the field `tag`.
pub fn validate_tag(tag: &str) -> Result<(), InvalidInput> {
    validate_one(tag).map_err(|e| InvalidInput::Option {
        name: "tag",
        reason: e,
    })
}

/// `tags` in a JSON body: an array of strings, checked as [`validate`]; anything else is
/// refused naming the field.
pub fn from_json(v: &serde_json::Value) -> Result<Vec<String>, InvalidInput> {
    let bad = || InvalidInput::Option {
        name: FIELD,
        reason: "must be an array of strings".into(),
    };
    let tags = v
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|t| t.as_str().map(str::to_owned).ok_or_else(bad))
        .collect::<Result<Vec<_>, _>>()?;
    validate(&tags)?;
    Ok(tags)
}

/// The rule of ids ([`crate::engine::keys::validate_id`]) with the tag's length.
fn validate_one(tag: &str) -> Result<(), String> {
    crate::engine::keys::validate_text(tag, MAX_TAG_LEN)
}

/// The stored form of a tagged order's body: `\x1d<t1>\x1f<t2>\x1d<body>`; no tags: the body
/// as is.
pub(crate) fn encode(tags: &[String], body: &str) -> String {
    if tags.is_empty() {
        return body.to_owned();
    }
    let mut s =
        String::with_capacity(body.len() + tags.iter().map(|t| t.len() + 1).sum::<usize>() + 1);
    s.push(OPEN);
    for (i, t) in tags.iter().enumerate() {
        if i > 0 {
            s.push(SEP);
        }
        s.push_str(t);
    }
    s.push(OPEN);
    s.push_str(body);
    s
}

/// Splits the part of a stored value after its expiry and key prefixes into its tags and
/// the rest (the trace-prefixed or plain payload). A body that does not start with GS, or
/// has no closing GS, has no tags and is returned whole. The match tokens of cancel-on-event
/// rules ([`crate::engine::events`]) are stored as tags and left out here: the one place
/// tags are decoded, so no reader (get, history, dead letters, deliveries) shows them.
pub(crate) fn split_stored(body: &str) -> (Vec<String>, &str) {
    let Some(rest) = body.strip_prefix(OPEN) else {
        return (Vec::new(), body);
    };
    let Some(end) = rest.find(OPEN) else {
        return (Vec::new(), body);
    };
    let list = &rest[..end];
    let tags = if list.is_empty() {
        Vec::new()
    } else {
        list.split(SEP)
            .filter(|t| !crate::engine::events::is_token(t))
            .map(str::to_owned)
            .collect()
    };
    (tags, &rest[end + OPEN.len_utf8()..])
}

/// The tags of a whole stored value `"<enqueued_ms>:<body>"` (empty when it has none): the
/// list between its first two GS.
pub(crate) fn of_stored(raw: &str) -> Vec<String> {
    match raw.find(OPEN) {
        Some(at) => split_stored(&raw[at..]).0,
        None => Vec::new(),
    }
}

/// The index member of `id` under `tag`: `<tag>\x1f<id>`.
pub fn member(tag: &str, id: &str) -> String {
    format!("{tag}{SEP}{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(t: &[&str]) -> Vec<String> {
        t.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn rules_name_the_field() {
        assert!(validate(&[]).is_ok());
        assert!(validate(&v(&["customer:42", "order:1234"])).is_ok());
        let ten: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
        assert!(validate(&ten).is_ok());
        let eleven: Vec<String> = (0..11).map(|i| format!("t{i}")).collect();
        let long = "x".repeat(129);
        for bad in [
            eleven,
            v(&[""]),
            v(&[&long]),
            v(&["a\u{1f}b"]),
            v(&["a", "a"]),
        ] {
            let e = validate(&bad).unwrap_err();
            assert!(e.to_string().contains("tags"), "{e}");
            assert_eq!(e.code(), "invalid_option");
        }
        assert!(validate(&v(&[&"x".repeat(128)])).is_ok());
        assert!(validate_tag("").unwrap_err().to_string().contains("tag"));
        assert_eq!(from_json(&serde_json::json!(["a"])), Ok(v(&["a"])));
        for bad in [
            serde_json::json!("a"),
            serde_json::json!([1]),
            serde_json::json!(["a", "a"]),
        ] {
            assert!(from_json(&bad).unwrap_err().to_string().contains("tags"));
        }
    }

    #[test]
    fn stored_values_round_trip() {
        let body = encode(&v(&["a", "b:c"]), "~00-x~{\"a\":1}");
        assert_eq!(body, "\u{1d}a\u{1f}b:c\u{1d}~00-x~{\"a\":1}");
        assert_eq!(split_stored(&body), (v(&["a", "b:c"]), "~00-x~{\"a\":1}"));
        assert_eq!(encode(&[], "{}"), "{}");
        assert_eq!(split_stored("{}"), (vec![], "{}"));
        let with_token = encode(&v(&["a", "\u{1}order.paid {\"order_id\":1}"]), "{}");
        assert_eq!(split_stored(&with_token), (v(&["a"]), "{}"));
        assert_eq!(split_stored("\u{1d}open"), (vec![], "\u{1d}open"));
        assert_eq!(of_stored(&format!("12:!5!{body}")), v(&["a", "b:c"]));
        assert_eq!(of_stored("12:{}"), Vec::<String>::new());
        assert_eq!(member("a", "o1"), "a\u{1f}o1");
    }
}
