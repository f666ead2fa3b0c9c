//! Human durations: `500ms`, `30s`, `15m`, `1h30m`, `2d`.

use crate::engine::error::InvalidInput;
use std::time::Duration;

/// The longest duration accepted anywhere: 10 years (3,653 days), as for due times.
pub const MAX_DURATION: Duration = Duration::from_secs(3653 * 86_400);

/// Parses a duration made of `<integer><unit>` parts, units `ms`, `s`, `m`, `h`, `d`
/// (e.g. `1h30m`, `500ms`), at most [`MAX_DURATION`]. `field` names the input in the
/// error.
pub fn parse_duration(field: &'static str, text: &str) -> Result<Duration, InvalidInput> {
    let bad = |reason: String| InvalidInput::Option {
        name: field,
        reason,
    };
    let t = text.trim();
    if t.is_empty() {
        return Err(bad(
            "empty duration (use e.g. 500ms, 30s, 15m, 1h30m)".into()
        ));
    }
    let mut total: u128 = 0;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad(format!(
                "{t:?} is not a duration (use e.g. 500ms, 30s, 15m, 1h30m; negative values are not allowed)"
            )));
        }
        let n: u128 = rest[..digits]
            .parse()
            .map_err(|_| bad(format!("{t:?}: number too large")))?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let ms_per = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => {
                return Err(bad(format!(
                    "{t:?}: missing unit after {n} (ms, s, m, h, d)"
                )));
            }
            u => return Err(bad(format!("{t:?}: unknown unit {u:?} (ms, s, m, h, d)"))),
        };
        rest = &rest[unit_len..];
        total = total
            .checked_add(n.saturating_mul(ms_per))
            .ok_or_else(|| bad(format!("{t:?}: too large")))?;
    }
    let d = u64::try_from(total)
        .ok()
        .map(Duration::from_millis)
        .filter(|d| *d <= MAX_DURATION)
        .ok_or_else(|| bad(format!("{t:?} is more than 10 years")))?;
    Ok(d)
}

/// A duration in whole milliseconds, as Redis takes them (saturating far beyond any
/// setting delayq accepts).
pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

/// A duration as this module parses it back: `1h30m`, `500ms`, `0s`.
pub fn format_duration(d: Duration) -> String {
    let mut ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, per) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
        ("ms", 1),
    ] {
        if ms >= per {
            out.push_str(&format!("{}{unit}", ms / per));
            ms %= per;
        }
    }
    out
}

/// Serde for a [`Duration`] in the human form above (`#[serde(with =
/// "crate::engine::duration::human")]`): read with [`parse_duration`], written with
/// [`format_duration`]. The one way an option type's duration is spelled in a
/// configuration file; a bad one is refused with [`parse_duration`]'s reason, which the
/// configuration names by its key. A value of another type is refused as "expected a
/// string".
pub mod human {
    use super::{format_duration, parse_duration};
    use crate::engine::error::InvalidInput;
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};
    use std::time::Duration;

    /// Writes `d` as `1h30m`, `500ms`, `0s`.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(*d))
    }

    /// Reads `500ms`, `30s`, `1h30m`, `2d`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        from_text(d, |t| parse_duration("duration", t))
    }

    /// A value written as text and read by `parse` (a duration, a backoff policy, a rate
    /// limit): an option error is refused with its reason alone (the configuration names
    /// the key), another with its whole text.
    pub(crate) fn from_text<'de, D: Deserializer<'de>, T>(
        d: D,
        parse: impl FnOnce(&str) -> Result<T, InvalidInput>,
    ) -> Result<T, D::Error> {
        let text = String::deserialize(d)?;
        parse(&text).map_err(|e| match e {
            InvalidInput::Option { reason, .. } => D::Error::custom(reason),
            other => D::Error::custom(other),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert_eq!(parse_duration("d", "500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("d", "1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("d", "15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("d", "0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("d", "3653d"), Ok(MAX_DURATION));
        for d in ["1h30m", "500ms", "0s", "2d3h4m5s6ms"] {
            assert_eq!(format_duration(parse_duration("d", d).unwrap()), d);
        }
        for bad in [
            "",
            "-5s",
            "5",
            "5x",
            "s",
            "1.5s",
            "99999999999999999999999d",
            "200000000000d",
            "3654d",
        ] {
            assert!(parse_duration("d", bad).is_err(), "{bad}");
        }
    }

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Opts {
        #[serde(with = "human")]
        wait: Duration,
    }

    #[test]
    fn serde_reads_and_writes_the_human_form() {
        let o: Opts = serde_json::from_str(r#"{"wait": "1h30m"}"#).unwrap();
        assert_eq!(o.wait, Duration::from_secs(5400));
        assert_eq!(serde_json::to_string(&o).unwrap(), r#"{"wait":"1h30m"}"#);
        let e = serde_json::from_str::<Opts>(r#"{"wait": "soon"}"#).unwrap_err();
        assert!(
            e.to_string().starts_with("\"soon\" is not a duration"),
            "{e}"
        );
        let e = serde_json::from_str::<Opts>(r#"{"wait": 5}"#).unwrap_err();
        assert!(e.to_string().contains("expected a string"), "{e}");
    }
}
