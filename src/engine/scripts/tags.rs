//! The tag scripts (issue 43): `tag_bulk.lua`, a bounded batch of one shard's orders with a
//! tag cancelled or moved.

use crate::engine::error::{Error, RedisContext, Result};
use crate::engine::keys::ShardKeys;
use redis::aio::ConnectionLike;
use std::sync::LazyLock;

/// Source of `lua/tag_bulk.lua`.
pub static TAG_BULK_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/tag_bulk.lua")));

static TAG_BULK: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&TAG_BULK_LUA));

/// What a bulk call does to each order with the tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BulkAction {
    /// Cancel it.
    Cancel,
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

/// Runs `tag_bulk.lua` on one shard: at most `limit` orders with `tag` after `cursor`.
pub(crate) async fn tag_bulk<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    tag: &str,
    limit: usize,
    action: BulkAction,
    cursor: Option<&str>,
) -> Result<BulkStep> {
    let (name, arg) = match action {
        BulkAction::Cancel => ("cancel", String::new()),
        BulkAction::At(ms) => ("at", ms.to_string()),
        BulkAction::Shift(ms) => ("shift", ms.to_string()),
    };
    let (affected, last, more): (u64, Option<String>, i64) = TAG_BULK
        .key(&keys.due)
        .key(&keys.payload)
        .key(&keys.levels)
        .key(&keys.debounce)
        .key(&keys.tags)
        .key(&keys.keyed)
        .key(&keys.key_ring)
        .arg(tag)
        .arg(limit.clamp(1, 1000))
        .arg(name)
        .arg(arg)
        .arg(cursor.unwrap_or(""))
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
