//! A group's order keys in use (`key_concurrency`, `key_sequence`): how many keys hold or
//! wait for slots, and the busiest of them, read from the group's slots
//! ([`crate::engine::keys::KeySlotKeys`], `lua/key_slots.lua`). Nothing here grows with
//! the keys ever seen: the slots keep only keys that hold or wait.

use super::Queues;
use crate::engine::error::{Error, InvalidInput, RedisContext, Result};
use crate::engine::keys::{QueueName, validate_member_name};

/// Keys per page when none is asked for.
pub const DEFAULT_KEYS_LIMIT: usize = 100;
/// The most keys one page lists.
pub const MAX_KEYS_LIMIT: usize = 1000;

/// One order key of a group: its deliveries in flight (holding a slot; a woken waiter's
/// slot counts as soon as it is given) and its entries waiting for a slot.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KeyUse {
    /// The order key.
    pub key: String,
    /// Slots held.
    pub in_flight: u64,
    /// Entries parked for a slot.
    pub waiting: u64,
}

/// A page of a group's busiest keys, most slots held and waiting first.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KeysPage {
    /// The queue.
    pub queue: String,
    /// The group.
    pub group: String,
    /// Keys that hold or wait for a slot, in all.
    pub active: u64,
    /// Entries waiting for a slot, in all.
    pub waiting: u64,
    /// This page's keys.
    pub keys: Vec<KeyUse>,
    /// The `after` of the next page, when there may be one.
    pub next: Option<String>,
}

/// Checks a page size: 1..=[`MAX_KEYS_LIMIT`], [`DEFAULT_KEYS_LIMIT`] when absent.
pub fn keys_limit(limit: Option<usize>) -> std::result::Result<usize, InvalidInput> {
    match limit {
        None => Ok(DEFAULT_KEYS_LIMIT),
        Some(n) if (1..=MAX_KEYS_LIMIT).contains(&n) => Ok(n),
        Some(_) => Err(InvalidInput::Option {
            name: "limit",
            reason: format!("must be 1..={MAX_KEYS_LIMIT}"),
        }),
    }
}

impl Queues {
    /// The keys in use in `group` of `queue`, busiest first, `limit` per page, starting
    /// after key `after` (the previous page's `next`; a key that has gone since starts
    /// from the top). [`Error::QueueNotFound`], [`Error::GroupNotFound`] when they do not
    /// exist.
    pub async fn group_keys(
        &self,
        queue: &str,
        group: &str,
        limit: usize,
        after: Option<&str>,
    ) -> Result<KeysPage> {
        let q = QueueName::new(queue)?;
        validate_member_name("group", group)?;
        let limit = keys_limit(Some(limit))?;
        let shards = self.client.registered_keys(&q).await?;
        self.require_group(&q, &shards, group).await?;
        let k = self.client.keyspace().key_slots(&q, group);
        let mut conn = self.client.connection();
        let start: i64 = match after {
            Some(a) => {
                let rank: Option<i64> = redis::cmd("ZREVRANK")
                    .arg(&k.active)
                    .arg(a)
                    .query_async(&mut conn)
                    .await
                    .ctx("reading a group's keys")?;
                rank.map_or(0, |r| r + 1)
            }
            None => 0,
        };
        let stop = start + i64::try_from(limit).unwrap_or(1000) - 1;
        let (active, waiting, names): (u64, u64, Vec<String>) = redis::pipe()
            .cmd("ZCARD")
            .arg(&k.active)
            .cmd("ZCARD")
            .arg(&k.waiters)
            .cmd("ZRANGE")
            .arg(&k.active)
            .arg(start)
            .arg(stop)
            .arg("REV")
            .query_async(&mut conn)
            .await
            .ctx("reading a group's keys")?;
        let mut keys = Vec::with_capacity(names.len());
        if !names.is_empty() {
            let mut pipe = redis::pipe();
            for name in &names {
                pipe.cmd("HGET").arg(&k.counts).arg(name);
                pipe.cmd("ZLEXCOUNT")
                    .arg(&k.waiters)
                    .arg(format!("[{name}\u{1f}"))
                    .arg(format!("({name}\u{20}"));
            }
            let counts: Vec<(Option<u64>, u64)> = pipe
                .query_async(&mut conn)
                .await
                .ctx("reading a group's keys")?;
            for (key, (in_flight, waiting)) in names.iter().zip(counts) {
                keys.push(KeyUse {
                    key: key.clone(),
                    in_flight: in_flight.unwrap_or(0),
                    waiting,
                });
            }
        }
        let next = (keys.len() == limit)
            .then(|| keys.last().map(|k| k.key.clone()))
            .flatten();
        Ok(KeysPage {
            queue: q.as_str().to_owned(),
            group: group.to_owned(),
            active,
            waiting,
            keys,
            next,
        })
    }

    /// Keys in use and entries waiting for a key slot, for each of `groups` (the stats):
    /// one pipeline, the groups' slots sharing shard 0's slot.
    pub(crate) async fn key_totals(
        &self,
        q: &QueueName,
        groups: &[&str],
    ) -> Result<Vec<(u64, u64)>> {
        if groups.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for g in groups {
            let k = self.client.keyspace().key_slots(q, g);
            pipe.cmd("ZCARD")
                .arg(&k.active)
                .cmd("ZCARD")
                .arg(&k.waiters);
        }
        let flat: Vec<u64> = pipe
            .query_async(&mut self.client.connection())
            .await
            .ctx("reading the groups' keys")?;
        Ok(flat
            .chunks(2)
            .map(|c| (c[0], c.get(1).copied().unwrap_or(0)))
            .collect())
    }

    /// [`Error::GroupNotFound`] unless shard 0's stream has `group`.
    async fn require_group(
        &self,
        q: &QueueName,
        shards: &[crate::engine::keys::ShardKeys],
        group: &str,
    ) -> Result<()> {
        let Some(first) = shards.first() else {
            return Err(Error::QueueNotFound {
                queue: q.as_str().to_owned(),
            });
        };
        let groups: redis::RedisResult<Vec<std::collections::HashMap<String, redis::Value>>> =
            redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(&first.stream)
                .query_async(&mut self.client.connection())
                .await;
        let found = groups.is_ok_and(|gs| {
            gs.iter().any(|g| {
                g.get("name")
                    .and_then(crate::engine::reply::as_string)
                    .as_deref()
                    == Some(group)
            })
        });
        if found {
            Ok(())
        } else {
            Err(Error::GroupNotFound {
                queue: q.as_str().to_owned(),
                group: group.to_owned(),
            })
        }
    }
}
