//! Stream entries: parsing replies into [`Taken`] deliveries, consumer names, group creation.

use super::lease::Lease;
use super::{Delivery, DeliveryFlag, Shared, lane_index};
use crate::engine::error::{Error, Result};
use crate::engine::keys::{QueueName, ShardKeys};
use std::hash::{BuildHasher, Hasher};

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
            "due_ms" => due = v.parse::<f64>().ok().map(crate::engine::reply::score_to_ms),
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
