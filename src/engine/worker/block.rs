//! The idle reader's blocking wait: one `XREAD BLOCK` over every lane after the last ids
//! seen, on the reader's dedicated connection (it takes nothing: `read.lua` does).

use super::{Handler, Shared};
use crate::engine::conn::Conn;
use crate::engine::duration::ms;
use crate::engine::error::{RedisContext, Result};
use crate::engine::keys::ShardKeys;
use crate::engine::reply::as_string;
use redis::Value;

/// Blocks (dedicated connection) until some shard's stream has an entry after `last_ids`, or
/// the block time passes; returns the indexes of the shards with new entries (empty on
/// timeout). Takes nothing: `read.lua` does.
pub(super) async fn wait_for_new<H: Handler>(
    s: &Shared<H>,
    shards: &[ShardKeys],
    reader: &mut Conn,
    last_ids: &[String],
) -> Result<Vec<usize>> {
    let mut cmd = redis::cmd("XREAD");
    cmd.arg("COUNT")
        .arg(1)
        .arg("BLOCK")
        .arg(ms(s.opts.block).max(1))
        .arg("STREAMS");
    for k in shards {
        cmd.arg(&k.stream);
    }
    cmd.arg(last_ids);
    let reply: Value = cmd
        .query_async(reader)
        .await
        .ctx("waiting for new entries (XREAD BLOCK)")?;
    let streams: Vec<(Value, Value)> = match reply {
        Value::Array(items) => items
            .into_iter()
            .filter_map(|st| match st {
                Value::Array(mut kv) if kv.len() == 2 => {
                    let v = kv.pop().unwrap_or(Value::Nil);
                    let k = kv.pop().unwrap_or(Value::Nil);
                    Some((k, v))
                }
                _ => None,
            })
            .collect(),
        Value::Map(kv) => kv,
        _ => Vec::new(),
    };
    Ok(streams
        .iter()
        .filter_map(|(k, _)| as_string(k))
        .filter_map(|key| shards.iter().position(|k| k.stream == key))
        .collect())
}
