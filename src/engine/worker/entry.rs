//! Stream entries: parsing replies into [`Taken`] deliveries, consumer names, group creation.

use super::lease::Lease;
use super::{Delivery, DeliveryFlag, Shared, lane_index};
use crate::engine::keys::{QueueName, ShardKeys};
use crate::error::{Error, Result};
use redis::Value;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// A stream entry taken for handling, with its owner's lease.
pub(super) struct Taken {
    pub(super) delivery: Delivery,
    /// Set on dead-letter replays: only this group handles it.
    pub(super) for_group: Option<String>,
    /// Why the entry cannot be handled (no order id, deleted from the stream): it is
    /// dead-lettered with this error on its first delivery, the handler never sees it.
    pub(super) bad: Option<String>,
    /// Ownership of the entry until it is settled.
    pub(super) lease: Lease,
}

pub(super) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

/// Creates `group` on every shard's stream when it is new (`join_group.lua`: from the start
/// of the stream, creating the stream if needed). `rejoin`: a running worker's read found no
/// group; it is created again only where the stream is gone too (Redis lost its data), and
/// refused ([`Error::GroupDeleted`]) where the stream exists, since the group was deleted on
/// purpose. [`Error::QueueNotFound`] when the queue was deleted; [`Error::TooManyGroups`]
/// at the cap.
pub(crate) async fn ensure_groups(
    client: &crate::engine::client::Client,
    queue: &crate::engine::keys::QueueName,
    shards: &[ShardKeys],
    group: &str,
    rejoin: bool,
) -> Result<()> {
    use crate::engine::scripts::{ScriptRefusal, join_group};
    let max = client.options().max_groups;
    for s in shards {
        match join_group(&mut client.connection(), s, group, rejoin, max).await {
            Ok(true) => tracing::info!(stream = %s.stream, %group, "consumer group created"),
            Ok(false) => {}
            Err(e) => {
                return Err(match ScriptRefusal::of(&e) {
                    Some(ScriptRefusal::QueueNotFound) => Error::QueueNotFound {
                        queue: queue.as_str().to_owned(),
                    },
                    Some(ScriptRefusal::GroupDeleted) => Error::GroupDeleted {
                        queue: queue.as_str().to_owned(),
                        group: group.to_owned(),
                    },
                    Some(ScriptRefusal::TooManyGroups) => Error::TooManyGroups {
                        queue: queue.as_str().to_owned(),
                        max,
                    },
                    _ => e,
                });
            }
        }
    }
    Ok(())
}

pub(super) fn is_nogroup(e: &Error) -> bool {
    matches!(e, Error::Redis { source, .. } if source.code() == Some("NOGROUP"))
}

pub(crate) fn as_string(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// Builds a delivery from a stream entry's fields: the delivery, its `for_group`, and why it
/// cannot be handled (no order id).
pub(super) fn parse_delivery(
    queue: &QueueName,
    group: &str,
    lane: &ShardKeys,
    entry_id: &str,
    fields: Vec<(String, String)>,
    attempt: u32,
) -> (Delivery, Option<String>, Option<String>) {
    let mut id = None;
    let mut due = None;
    let mut data = None;
    let mut flag = None;
    let mut for_group = None;
    for (f, v) in fields {
        match f.as_str() {
            "id" => id = Some(v),
            "due_ms" => {
                due = v
                    .parse::<f64>()
                    .ok()
                    .map(crate::engine::scripts::score_to_ms)
            }
            "data" => data = Some(v),
            "flag" if v == "payload_missing" => flag = Some(DeliveryFlag::PayloadMissing),
            "for_group" => for_group = Some(v),
            _ => {}
        }
    }
    let (enq, trace, text) = match &data {
        Some(d) => match crate::engine::message::decode_stored_traced(d) {
            (Some(enq), trace, json) => (Some(enq), trace, json),
            (None, _, raw) => {
                flag = flag.or(Some(DeliveryFlag::BadEncoding));
                (None, None, raw)
            }
        },
        None => (None, None, "null"),
    };
    let payload = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(_) => {
            flag = flag.or(Some(DeliveryFlag::InvalidJson));
            serde_json::Value::String(text.to_owned())
        }
    };
    let dispatched_at_ms = entry_id
        .split_once('-')
        .and_then(|(ms, _)| ms.parse().ok())
        .unwrap_or(0);
    let delivery = Delivery {
        queue: queue.as_str().to_owned(),
        group: group.to_owned(),
        id: id.clone().unwrap_or_default(),
        payload,
        payload_text: text.to_owned(),
        due_at_ms: due.unwrap_or(dispatched_at_ms),
        enqueued_at_ms: enq,
        dispatched_at_ms,
        entry_id: entry_id.to_owned(),
        shard: lane.shard,
        priority: lane.level,
        attempt,
        flag,
        trace,
    };
    let bad = id
        .is_none()
        .then(|| "the stream entry has no order id (written by a foreign producer?)".to_owned());
    (delivery, for_group, bad)
}

/// `<host>-<pid>-<random hex>`: unique per process start.
pub(super) fn default_consumer_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty() && s.len() <= 64 && !s.chars().any(char::is_control))
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "host".into());
    let rand = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("{host}-{}-{:06x}", std::process::id(), rand & 0xff_ffff)
}

/// A stream entry's fields, in order.
pub(crate) type Fields = Vec<(String, String)>;
/// A stream entry: its id and fields (`None` when the entry was deleted).
pub(crate) type RawEntry = (String, Option<Fields>);

/// Entries of one stream (`[[id, [f, v, ...] | nil], ...]`), as in `read.lua`'s reply.
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

/// `reclaim.lua`'s claimed entries: (entry id, fields, delivery count).
pub(super) fn claimed_entries(v: Value) -> Result<Vec<(String, Fields, u32)>> {
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

pub(crate) fn field_pairs(v: Value) -> Option<Vec<(String, String)>> {
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

/// Turns a raw entry, leased until `lease_until`, into a [`Taken`] owned by this worker. An
/// entry that cannot be handled (deleted from the stream, no order id) is taken all the same,
/// marked `bad`, and dead-lettered on this first delivery.
pub(super) fn to_taken<H>(
    s: &Shared<H>,
    lane: &ShardKeys,
    entry_id: &str,
    fields: Option<Vec<(String, String)>>,
    attempt: u32,
    lease_until: i64,
) -> Taken {
    let lease = s
        .leases
        .hold(lane_index(lane.shard, lane.level), entry_id, lease_until);
    let (delivery, for_group, bad) = match fields {
        Some(f) => parse_delivery(&s.queue, &s.group, lane, entry_id, f, attempt),
        None => {
            let (d, _, _) = parse_delivery(&s.queue, &s.group, lane, entry_id, Vec::new(), attempt);
            (
                d,
                None,
                Some("the stream entry was deleted (trimmed while pending)".to_owned()),
            )
        }
    };
    if let Some(reason) = &bad {
        tracing::error!(entry = %entry_id, %reason, "stream entry cannot be handled: dead-lettering it");
    }
    Taken {
        delivery,
        for_group,
        bad,
        lease,
    }
}
