//! Every parser of a Redis reply shape the engine reads back: bulk strings as text, a stream
//! entry's field list, the entries of `XRANGE`/`read.lua`, `reclaim.lua`'s claimed entries,
//! ZSET scores as milliseconds and a stored priority level. Each is total: a malformed reply
//! is an [`Error::Reply`] (or `None`), never a panic. Unit tests below cover every shape,
//! RESP2 and RESP3 alike.

use crate::engine::error::{Error, Result};
use crate::engine::priority::Priority;
use redis::Value;

/// A stream entry's fields, in order.
pub(crate) type Fields = Vec<(String, String)>;
/// A stream entry: its id and fields (`None` when the entry was deleted).
pub(crate) type RawEntry = (String, Option<Fields>);

/// A scalar reply as text: bulk, simple and verbatim strings (lossy UTF-8) and integers.
pub(crate) fn as_string(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// A field list (`[f, v, f, v, ...]`, or a RESP3 map) as pairs; a non-text field or value
/// reads as empty and a trailing odd field is dropped. `None` when it is not a list.
pub(crate) fn field_pairs(v: Value) -> Option<Fields> {
    match v {
        Value::Array(fv) => {
            let mut pairs = Vec::with_capacity(fv.len() / 2);
            let mut it = fv.iter();
            while let (Some(f), Some(v)) = (it.next(), it.next()) {
                pairs.push((
                    as_string(f).unwrap_or_default(),
                    as_string(v).unwrap_or_default(),
                ));
            }
            Some(pairs)
        }
        Value::Map(fv) => Some(
            fv.iter()
                .map(|(f, v)| {
                    (
                        as_string(f).unwrap_or_default(),
                        as_string(v).unwrap_or_default(),
                    )
                })
                .collect(),
        ),
        _ => None,
    }
}

/// Entries of one stream (`[[id, [f, v, ...] | nil], ...]`), as in `XRANGE` and
/// `read.lua`'s reply. Anything but a list is no entries; an entry that is not a list, or
/// has no id, is an [`Error::Reply`].
pub(crate) fn entries_of(v: Value) -> Result<Vec<RawEntry>> {
    let Value::Array(items) = v else {
        return Ok(Vec::new());
    };
    items
        .into_iter()
        .map(|e| {
            let Value::Array(parts) = e else {
                return Err(Error::Reply {
                    context: "parsing stream entries",
                    detail: format!("entry {e:?}"),
                });
            };
            let mut parts = parts.into_iter();
            let id = parts
                .next()
                .as_ref()
                .and_then(as_string)
                .ok_or(Error::Reply {
                    context: "parsing stream entries",
                    detail: "entry without id".into(),
                })?;
            Ok((id, parts.next().and_then(field_pairs)))
        })
        .collect()
}

/// `reclaim.lua`'s claimed entries: (entry id, fields, delivery count; 1 when absent).
pub(crate) fn claimed_entries(v: Value) -> Result<Vec<(String, Fields, u32)>> {
    let Value::Array(items) = v else {
        return Ok(Vec::new());
    };
    let bad = || Error::Reply {
        context: "parsing reclaimed entries",
        detail: "unexpected shape".into(),
    };
    items
        .into_iter()
        .map(|e| {
            let Value::Array(parts) = e else {
                return Err(bad());
            };
            let mut parts = parts.into_iter();
            let id = parts.next().as_ref().and_then(as_string).ok_or_else(bad)?;
            let fields = parts.next().and_then(field_pairs).ok_or_else(bad)?;
            let count = match parts.next() {
                Some(Value::Int(n)) => u32::try_from(n).unwrap_or(u32::MAX),
                _ => 1,
            };
            Ok((id, fields, count))
        })
        .collect()
}

/// A ZSET score (a double holding whole milliseconds) as unix ms.
#[allow(clippy::cast_possible_truncation)]
pub(crate) fn score_to_ms(score: f64) -> i64 {
    // Scores are written from i64 milliseconds below 2^53, so they are exact integers.
    score.round() as i64
}

/// A level as stored in the levels HASH or a stream entry's `priority` field (absent, or
/// anything else a foreign writer left: normal).
pub(crate) fn stored_level(text: Option<&str>) -> Priority {
    text.and_then(|t| Priority::parse(t).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn as_string_reads_every_scalar_and_refuses_the_rest() {
        assert_eq!(as_string(&bulk("a")).as_deref(), Some("a"));
        assert_eq!(
            as_string(&Value::SimpleString("OK".into())).as_deref(),
            Some("OK")
        );
        assert_eq!(as_string(&Value::Int(-7)).as_deref(), Some("-7"));
        assert_eq!(
            as_string(&Value::BulkString(vec![0xff, b'x'])).as_deref(),
            Some("\u{fffd}x")
        );
        assert_eq!(as_string(&Value::Nil), None);
        assert_eq!(as_string(&Value::Array(vec![bulk("a")])), None);
    }

    #[test]
    fn field_pairs_reads_lists_and_maps() {
        let list = Value::Array(vec![bulk("id"), bulk("o1"), bulk("n"), Value::Int(3)]);
        assert_eq!(
            field_pairs(list),
            Some(vec![("id".into(), "o1".into()), ("n".into(), "3".into())])
        );
        let map = Value::Map(vec![(bulk("id"), bulk("o2"))]);
        assert_eq!(field_pairs(map), Some(vec![("id".into(), "o2".into())]));
        // A trailing odd field is dropped; a non-text value reads as empty.
        let odd = Value::Array(vec![bulk("a"), Value::Nil, bulk("b")]);
        assert_eq!(field_pairs(odd), Some(vec![("a".into(), String::new())]));
        assert_eq!(field_pairs(Value::Nil), None);
        assert_eq!(field_pairs(bulk("x")), None);
    }

    #[test]
    fn entries_of_reads_entries_and_deleted_ones() {
        let v = Value::Array(vec![
            Value::Array(vec![
                bulk("1-0"),
                Value::Array(vec![bulk("id"), bulk("o1")]),
            ]),
            Value::Array(vec![bulk("2-0"), Value::Nil]),
        ]);
        let e = entries_of(v).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0], ("1-0".into(), Some(vec![("id".into(), "o1".into())])));
        assert_eq!(e[1], ("2-0".into(), None));
        assert!(entries_of(Value::Nil).unwrap().is_empty());
    }

    #[test]
    fn entries_of_refuses_malformed_entries() {
        let not_a_list = Value::Array(vec![bulk("1-0")]);
        assert!(matches!(entries_of(not_a_list), Err(Error::Reply { .. })));
        let no_id = Value::Array(vec![Value::Array(vec![])]);
        assert!(matches!(entries_of(no_id), Err(Error::Reply { .. })));
        let nil_id = Value::Array(vec![Value::Array(vec![Value::Nil, Value::Nil])]);
        assert!(matches!(entries_of(nil_id), Err(Error::Reply { .. })));
    }

    #[test]
    fn claimed_entries_reads_counts_and_refuses_malformed() {
        let v = Value::Array(vec![
            Value::Array(vec![
                bulk("1-0"),
                Value::Array(vec![bulk("id"), bulk("o")]),
                Value::Int(4),
            ]),
            Value::Array(vec![bulk("2-0"), Value::Array(vec![])]),
            Value::Array(vec![bulk("3-0"), Value::Array(vec![]), Value::Int(-1)]),
        ]);
        let c = claimed_entries(v).unwrap();
        assert_eq!(c[0], ("1-0".into(), vec![("id".into(), "o".into())], 4));
        assert_eq!(c[1].2, 1, "no count reads as a first delivery");
        assert_eq!(c[2].2, u32::MAX, "a count out of range saturates");
        assert!(claimed_entries(Value::Nil).unwrap().is_empty());
        let no_fields = Value::Array(vec![Value::Array(vec![bulk("1-0"), Value::Nil])]);
        assert!(matches!(
            claimed_entries(no_fields),
            Err(Error::Reply { .. })
        ));
        let not_a_list = Value::Array(vec![Value::Int(1)]);
        assert!(matches!(
            claimed_entries(not_a_list),
            Err(Error::Reply { .. })
        ));
    }

    #[test]
    fn scores_and_levels() {
        assert_eq!(score_to_ms(1_700_000_000_123.0), 1_700_000_000_123);
        assert_eq!(score_to_ms(-5.0), -5);
        assert_eq!(stored_level(Some("high")), Priority::High);
        assert_eq!(stored_level(Some("low")), Priority::Low);
        assert_eq!(stored_level(Some("urgent")), Priority::Normal);
        assert_eq!(stored_level(None), Priority::Normal);
    }
}
