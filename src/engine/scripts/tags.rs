//! The tag scripts (issue 43): `tag_bulk.lua`, a bounded batch of one shard's orders with a
//! tag cancelled or moved; `order_rules.lua`, the cancel-on-event rules a queue's orders
//! declare, registered in its record.

use super::CancelRecord;
use crate::engine::error::{Error, RedisContext, Result};
use crate::engine::history::CancelledBy;
use crate::engine::keys::ShardKeys;
use redis::aio::ConnectionLike;
use std::sync::LazyLock;

/// Source of `lua/tag_bulk.lua`.
pub static TAG_BULK_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/tag_bulk.lua")));

static TAG_BULK: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&TAG_BULK_LUA));

/// Source of `lua/order_rules.lua`.
pub static ORDER_RULES_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/order_rules.lua")));

static ORDER_RULES: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&ORDER_RULES_LUA));

/// What `order_rules.lua` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OrderRules {
    /// Registered (this many were new).
    Added(u64),
    /// The queue is not registered (or being deleted).
    NoQueue,
    /// The queue would keep more than the bound.
    Full,
}

/// Runs `order_rules.lua` on `record` (a queue's registry record) for `fields`
/// ([`crate::engine::events::order_rule_field`]).
pub(crate) async fn order_rules<C: ConnectionLike>(
    conn: &mut C,
    record: &str,
    max: usize,
    fields: &[String],
) -> Result<OrderRules> {
    let n: i64 = ORDER_RULES
        .key(record)
        .arg(max)
        .arg(fields)
        .invoke_async(conn)
        .await
        .ctx("registering the orders' cancel_on rules (order_rules.lua)")?;
    Ok(match n {
        -1 => OrderRules::NoQueue,
        -2 => OrderRules::Full,
        n => OrderRules::Added(u64::try_from(n).unwrap_or(0)),
    })
}

/// What a bulk call does to each order with the tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BulkAction<'a> {
    /// Cancel it, recording the cancellation for this reason (where: the call's
    /// [`CancelRecord`]).
    Cancel(&'a CancelledBy),
    /// A new due time, unix ms.
    At(i64),
    /// Move its due time by this many ms.
    Shift(i64),
}

/// One `tag_bulk.lua` call's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BulkStep {
    /// Orders cancelled or moved.
    pub affected: u64,
    /// The last id looked at (the next call's cursor).
    pub last: Option<String>,
    /// Ids of the tag remain after `last`.
    pub more: bool,
}

/// Runs `tag_bulk.lua` on one shard: at most `limit` orders with `tag` after `cursor`. A
/// cancel is recorded as `record` says; a move records nothing, but its bucket is passed
/// all the same (the script takes one KEYS arity and leaves it untouched then).
pub(crate) async fn tag_bulk<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    tag: &str,
    limit: usize,
    action: BulkAction<'_>,
    record: &CancelRecord,
    cursor: Option<&str>,
) -> Result<BulkStep> {
    let (name, arg) = match action {
        BulkAction::Cancel(..) => ("cancel", String::new()),
        BulkAction::At(ms) => ("at", ms.to_string()),
        BulkAction::Shift(ms) => ("shift", ms.to_string()),
    };
    let mut inv = TAG_BULK.prepare_invoke();
    inv.key(&keys.due)
        .key(&keys.payload)
        .key(&keys.levels)
        .key(&keys.debounce)
        .key(&keys.tags)
        .key(&keys.keyed)
        .key(&keys.key_ring)
        .key(&record.bucket)
        .arg(tag)
        .arg(limit.clamp(1, 1000))
        .arg(name)
        .arg(arg)
        .arg(cursor.unwrap_or(""));
    if let BulkAction::Cancel(by) = action {
        inv.arg(record.expires_at)
            .arg(record.now_ms)
            .arg(by.record());
    }
    let (affected, last, more): (u64, Option<String>, i64) = inv
        .invoke_async(conn)
        .await
        .ctx("working the orders of a tag (tag_bulk.lua)")?;
    if more != 0 && last.is_none() {
        return Err(Error::Reply {
            context: "working the orders of a tag (tag_bulk.lua)",
            detail: "more remain but no cursor".into(),
        });
    }
    Ok(BulkStep {
        affected,
        last,
        more: more != 0,
    })
}
