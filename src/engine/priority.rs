//! Priorities: three levels per order, and how a reader picks among them.
//!
//! An order is `high`, `normal` (the default) or `low`. Dispatch stays earliest-due first
//! and atomic; a due order goes into its level's stream (a *lane* of its shard: see
//! [`ShardKeys::lane`](crate::engine::keys::ShardKeys::lane)), and each consumer group reads
//! its lanes in the order a [`PriorityMode`] says: strictly (every `high` entry before any
//! `normal` one, every `normal` before any `low`) or weighted (e.g. 6:3:1 of the reads while
//! every level has a backlog, so `low` never starves). `normal` lives in the keys every
//! queue had before priorities existed, so queues and producers that never use them work as
//! before and an order scheduled by an older producer is `normal`.

use crate::engine::error::InvalidInput;
use serde::{Deserialize, Serialize};
use std::fmt;

/// An order's priority level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Priority {
    /// Taken before every `normal` and `low` entry.
    High,
    /// The default.
    #[default]
    Normal,
    /// Taken when no `high` or `normal` entry waits (strict mode).
    Low,
}

impl Priority {
    /// Every level, most urgent first (the order a strict read takes them in).
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    /// The level's name: `high`, `normal` or `low` (in keys, stream fields, APIs, metrics).
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// 0 for `high`, 1 for `normal`, 2 for `low`: the index into [`Priority::ALL`] and into
    /// a weights array.
    pub fn rank(self) -> usize {
        match self {
            Priority::High => 0,
            Priority::Normal => 1,
            Priority::Low => 2,
        }
    }

    /// Parses a level name (`high`, `normal`, `low`); the one rule every surface uses.
    pub fn parse(text: &str) -> Result<Self, InvalidInput> {
        match text {
            "high" => Ok(Priority::High),
            "normal" => Ok(Priority::Normal),
            "low" => Ok(Priority::Low),
            other => Err(InvalidInput::Priority {
                reason: format!("{other:?} is not high, normal or low"),
            }),
        }
    }
}

impl Priority {
    /// A level given as a JSON value (the HTTP API's `priority` field): a level name; any
    /// other value (a number, `null`, ...) is refused naming the field and the value.
    pub fn from_json(v: &serde_json::Value) -> Result<Self, InvalidInput> {
        match v {
            serde_json::Value::String(s) => Priority::parse(s),
            other => Err(InvalidInput::Priority {
                reason: format!("priority {other} is not \"high\", \"normal\" or \"low\""),
            }),
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Priority {
    type Err = InvalidInput;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Priority::parse(s)
    }
}

impl Serialize for Priority {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Priority {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Priority;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("one of \"high\", \"normal\", \"low\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Priority, E> {
                Priority::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

/// Most weight one level may have in [`PriorityMode::Weighted`].
pub const MAX_WEIGHT: u32 = 1000;

/// How a consumer picks among levels (or, for a handler over several queues, among queues).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PriorityMode {
    /// Every entry of a more urgent level before any of a less urgent one. The default.
    #[default]
    Strict,
    /// While several levels have a backlog, each gets this share of the reads (most urgent
    /// first, e.g. `[6, 3, 1]`); an idle level's share goes to the others, so the less
    /// urgent ones never starve.
    Weighted(Vec<u32>),
}

impl PriorityMode {
    /// Checks a weights list: `len` weights (one per level or queue), each 1..=1000.
    pub fn weighted(weights: Vec<u32>, len: usize) -> Result<Self, InvalidInput> {
        if weights.len() != len {
            return Err(InvalidInput::Priority {
                reason: format!(
                    "priority_weights needs {len} weights (one per level or queue, most urgent first), got {}",
                    weights.len()
                ),
            });
        }
        if let Some(w) = weights.iter().find(|w| !(1..=MAX_WEIGHT).contains(*w)) {
            return Err(InvalidInput::Priority {
                reason: format!("priority weight {w} is outside 1..={MAX_WEIGHT}"),
            });
        }
        Ok(PriorityMode::Weighted(weights))
    }
}

/// Smooth weighted round robin over ranks (nginx's algorithm): each pick adds every
/// candidate's weight to its credit and takes the largest, which then pays the total. Over
/// any run of picks among the same candidates, each gets its share within one pick.
#[derive(Debug, Clone, Default)]
pub(crate) struct Rotation {
    credit: Vec<i64>,
}

impl Rotation {
    /// Picks one of `candidates` (ranks, indexes into `weights`); `None` when there are none.
    pub(crate) fn pick(&mut self, weights: &[u32], candidates: &[usize]) -> Option<usize> {
        if self.credit.len() < weights.len() {
            self.credit.resize(weights.len(), 0);
        }
        let mut total = 0i64;
        let mut best: Option<usize> = None;
        for &r in candidates {
            let w = i64::from(weights.get(r).copied().unwrap_or(1));
            self.credit[r] += w;
            total += w;
            if best.is_none_or(|b| self.credit[r] > self.credit[b]) {
                best = Some(r);
            }
        }
        if let Some(b) = best {
            self.credit[b] -= total;
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_ones_are_named() {
        for p in Priority::ALL {
            assert_eq!(Priority::parse(p.as_str()), Ok(p));
            assert_eq!(
                serde_json::to_string(&p).unwrap(),
                format!("\"{}\"", p.as_str())
            );
        }
        let e = Priority::parse("bogus").unwrap_err();
        assert!(e.to_string().contains("\"bogus\""), "{e}");
        assert!(serde_json::from_str::<Priority>("7").is_err());
        let e = Priority::from_json(&serde_json::json!(7)).unwrap_err();
        assert_eq!(e.code(), "invalid_priority");
        assert!(e.to_string().contains("priority 7"), "{e}");
        assert_eq!(
            Priority::from_json(&serde_json::json!("low")),
            Ok(Priority::Low)
        );
        assert_eq!(Priority::default(), Priority::Normal);
        assert!(Priority::High < Priority::Normal && Priority::Normal < Priority::Low);
    }

    #[test]
    fn weights_are_checked() {
        assert!(PriorityMode::weighted(vec![6, 3, 1], 3).is_ok());
        assert!(PriorityMode::weighted(vec![6, 3], 3).is_err());
        assert!(PriorityMode::weighted(vec![6, 0, 1], 3).is_err());
        assert!(PriorityMode::weighted(vec![6, 3, 1001], 3).is_err());
    }

    #[test]
    fn rotation_gives_each_its_share() {
        let mut r = Rotation::default();
        let mut got = [0u32; 3];
        for _ in 0..1000 {
            got[r.pick(&[6, 3, 1], &[0, 1, 2]).unwrap()] += 1;
        }
        assert_eq!(got, [600, 300, 100]);
        // An idle level's share goes to the others.
        let mut got = [0u32; 3];
        for _ in 0..100 {
            got[r.pick(&[6, 3, 1], &[1, 2]).unwrap()] += 1;
        }
        assert_eq!(got[0], 0);
        assert!((74..=76).contains(&got[1]), "{got:?}");
        assert_eq!(r.pick(&[1], &[]), None);
    }
}
