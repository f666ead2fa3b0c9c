//! Dead letters: orders a group gave up on, kept per shard in `{ns:q:s}:dead` with the group,
//! the attempts made, the last error and when. List, replay (to the failing group only) and
//! purge.

use super::Queues;
use crate::engine::error::{InvalidInput, RedisContext, Result};
use crate::engine::keys::{QueueName, ShardKeys, validate_member_name};
use crate::engine::message::decode_stored;
use crate::engine::scripts;
use serde::Serialize;

/// One dead letter.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct DeadLetter {
    /// Its id in the dead-letter stream: the stream id, prefixed by `<shard>/` when the queue
    /// has more than one shard. Pass it to replay and purge.
    pub entry_id: String,
    /// The queue.
    pub queue: String,
    /// The order id.
    pub id: String,
    /// The group that gave up on it.
    pub group: String,
    /// Attempts made.
    pub attempts: u32,
    /// The last error.
    pub last_error: String,
    /// When it was dead-lettered, unix ms.
    pub dead_at_ms: i64,
    /// When the order was due, unix ms.
    pub due_at_ms: i64,
    /// Its payload, byte for byte as scheduled (`null` when the entry had none).
    pub payload: crate::engine::message::Payload,
    /// The order's priority level (a replay puts it back at this level).
    pub priority: crate::engine::priority::Priority,
    /// Why it was dead-lettered when the group never handled it: `expired` (see
    /// [`crate::engine::expiry`]); `None` for a handler's failures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Expired only: how late its hand-off would have been past due + `expires_after`, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late_ms: Option<i64>,
    /// The order's tags (none: left out of the JSON).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// The order's key (see [`crate::engine::order_key`]), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Which dead letters an operation applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// Every dead letter (of the group, if one is given).
    All,
    /// These entry ids (as in [`DeadLetter::entry_id`]).
    Ids(Vec<String>),
}

/// One page of dead letters, oldest first across every shard.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadPage {
    /// The dead letters.
    pub dead_letters: Vec<DeadLetter>,
    /// The cursor of the next page (pass it as `after`), `None` on the last page.
    pub next: Option<String>,
}

/// Where a page starts: after this (stream id, shard).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Cursor {
    ms: u64,
    seq: u64,
    shard: u16,
}

impl Cursor {
    fn parse(entry_id: &str) -> Result<Self, InvalidInput> {
        let (shard, sid) = split_entry_id(entry_id)?;
        let (ms, seq) = sid.split_once('-').unwrap_or((sid, "0"));
        Ok(Cursor {
            ms: ms.parse().unwrap_or(0),
            seq: seq.parse().unwrap_or(0),
            shard,
        })
    }
}

/// Dead letters read per XRANGE call.
const DEAD_PAGE_READ: usize = 500;

impl Queues {
    /// Dead letters of `queue` (of one group, or all), oldest first, at most `limit`.
    pub async fn dead_list(
        &self,
        queue: &str,
        group: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>> {
        Ok(self
            .dead_page(queue, group, None, limit)
            .await?
            .dead_letters)
    }

    /// One page of dead letters, ordered oldest first across all shards (by dead-letter
    /// stream id, then shard), starting after the cursor `after` (an entry id as listed).
    /// Memory is bounded by `limit` per shard.
    pub async fn dead_page(
        &self,
        queue: &str,
        group: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<DeadPage> {
        let q = QueueName::new(queue)?;
        if let Some(g) = group {
            validate_member_name("group", g)?;
        }
        let cursor = after.map(Cursor::parse).transpose()?;
        let shards = self.client.registered_keys(&q).await?;
        let many = shards.len() > 1;
        let limit = limit.max(1);
        let mut all: Vec<(Cursor, DeadLetter)> = Vec::new();
        for keys in &shards {
            let start = match cursor {
                None => "-".to_owned(),
                // Shards after the cursor's may hold the same stream id: include it.
                Some(c) if keys.shard > c.shard => format!("{}-{}", c.ms, c.seq),
                Some(c) => format!("({}-{}", c.ms, c.seq),
            };
            all.extend(
                self.dead_of_shard(&q, keys, many, group, start, limit)
                    .await?,
            );
        }
        all.sort_by_key(|(c, _)| *c);
        let more = all.len() > limit;
        all.truncate(limit);
        let next = if more {
            all.last().map(|(_, d)| d.entry_id.clone())
        } else {
            None
        };
        Ok(DeadPage {
            dead_letters: all.into_iter().map(|(_, d)| d).collect(),
            next,
        })
    }

    /// Up to `limit + 1` dead letters of one shard from `start`, `group`'s only.
    async fn dead_of_shard(
        &self,
        q: &QueueName,
        keys: &ShardKeys,
        many: bool,
        group: Option<&str>,
        mut start: String,
        limit: usize,
    ) -> Result<Vec<(Cursor, DeadLetter)>> {
        let mut out = Vec::new();
        loop {
            let page: redis::Value = redis::cmd("XRANGE")
                .arg(&keys.dead)
                .arg(&start)
                .arg("+")
                .arg("COUNT")
                .arg(DEAD_PAGE_READ)
                .query_async(&mut self.client.connection())
                .await
                .ctx("listing dead letters")?;
            let entries = crate::engine::reply::entries_of(page)?;
            let n = entries.len();
            for (sid, fields) in entries {
                start = format!("({sid}");
                let Some(fields) = fields else { continue };
                let d = to_dead(q, keys, many, &sid, fields);
                if group.is_none_or(|g| g == d.group) {
                    let mut c = Cursor::parse(&sid)?;
                    c.shard = keys.shard;
                    out.push((c, d));
                    if out.len() > limit {
                        return Ok(out);
                    }
                }
            }
            if n < DEAD_PAGE_READ {
                return Ok(out);
            }
        }
    }

    /// Replays dead letters: each goes back to the group that failed it (and only to it),
    /// starting again at attempt 1, and leaves the dead list. Each script call moves its
    /// entries atomically, so an interrupted replay loses nothing. Returns how many were
    /// replayed.
    pub async fn dead_replay(
        &self,
        queue: &str,
        group: Option<&str>,
        which: &Selection,
    ) -> Result<u64> {
        let q = QueueName::new(queue)?;
        self.client.shards_of(&q).await?;
        let history = crate::engine::flow::queue_flags(&self.client, &q, None)
            .await?
            .history;
        let history = &history;
        let n = self
            .apply_dead(queue, group, which, 200, |keys, chunk| async move {
                let now = self.client.now_ms();
                scripts::replay(
                    &mut self.client.connection(),
                    &keys,
                    group,
                    &chunk,
                    now,
                    history,
                )
                .await
            })
            .await?;
        self.client.replicated_barrier().await?;
        Ok(n)
    }

    /// Deletes dead letters for good. Returns how many were deleted. Replays and purges, like
    /// every admin write, answer once the replicas have them under `durability =
    /// "replicated"` ([`Client::replicated_barrier`](crate::Client::replicated_barrier)).
    pub async fn dead_purge(
        &self,
        queue: &str,
        group: Option<&str>,
        which: &Selection,
    ) -> Result<u64> {
        let n = self
            .apply_dead(queue, group, which, 500, |keys, chunk| async move {
                redis::cmd("XDEL")
                    .arg(&keys.dead)
                    .arg(&chunk)
                    .query_async::<u64>(&mut self.client.connection())
                    .await
                    .ctx("purging dead letters")
            })
            .await?;
        self.client.replicated_barrier().await?;
        Ok(n)
    }

    /// Runs `op` on the selected dead letters, `chunk` ids of one shard per call; `All` is
    /// worked page by page until a page changes nothing (bounded memory). Returns the sum
    /// of what `op` reported.
    async fn apply_dead<F, Fut>(
        &self,
        queue: &str,
        group: Option<&str>,
        which: &Selection,
        chunk: usize,
        op: F,
    ) -> Result<u64>
    where
        F: Fn(ShardKeys, Vec<String>) -> Fut,
        Fut: std::future::Future<Output = Result<u64>>,
    {
        let mut n = 0;
        loop {
            let mut done = 0;
            for (keys, ids) in self.select_dead(queue, group, which).await? {
                for c in ids.chunks(chunk) {
                    done += op(keys.clone(), c.to_vec()).await?;
                }
            }
            n += done;
            if !matches!(which, Selection::All) || done == 0 {
                return Ok(n);
            }
        }
    }

    /// The stream ids of `letters`, per shard.
    fn per_shard(
        &self,
        shards: Vec<ShardKeys>,
        letters: &[DeadLetter],
    ) -> Result<Vec<(ShardKeys, Vec<String>)>> {
        let mut per: Vec<(ShardKeys, Vec<String>)> =
            shards.into_iter().map(|k| (k, Vec::new())).collect();
        for d in letters {
            let (shard, sid) = split_entry_id(&d.entry_id)?;
            if let Some(slot) = per.get_mut(usize::from(shard)) {
                slot.1.push(sid.to_owned());
            }
        }
        Ok(per)
    }

    /// Resolves a selection into stream ids per shard, keeping only `group`'s. `All`
    /// resolves to the oldest page only: replay and purge repeat until nothing is left, so
    /// memory stays bounded whatever the number of dead letters.
    async fn select_dead(
        &self,
        queue: &str,
        group: Option<&str>,
        which: &Selection,
    ) -> Result<Vec<(ShardKeys, Vec<String>)>> {
        let q = QueueName::new(queue)?;
        let shards = self.client.registered_keys(&q).await?;
        match which {
            Selection::All => {
                // Callers page through `All` themselves (see `apply_dead`).
                let page = self.dead_page(queue, group, None, DEAD_PAGE_READ).await?;
                self.per_shard(shards, &page.dead_letters)
            }
            Selection::Ids(ids) => {
                let mut per: Vec<(ShardKeys, Vec<String>)> =
                    shards.iter().cloned().map(|k| (k, Vec::new())).collect();
                for id in ids {
                    let (shard, sid) = split_entry_id(id)?;
                    let slot = per
                        .get_mut(usize::from(shard))
                        .ok_or_else(|| InvalidInput::Id {
                            reason: format!(
                                "dead-letter id {id:?} names shard {shard}, the queue has {}",
                                shards.len()
                            ),
                        })?;
                    if group.is_some() {
                        // replay.lua filters by group; purge must too.
                        let e: redis::Value = redis::cmd("XRANGE")
                            .arg(&slot.0.dead)
                            .arg(sid)
                            .arg(sid)
                            .query_async(&mut self.client.connection())
                            .await
                            .ctx("reading a dead letter")?;
                        let keep =
                            crate::engine::reply::entries_of(e)?
                                .into_iter()
                                .any(|(_, f)| {
                                    f.is_some_and(|f| {
                                        f.iter()
                                            .any(|(k, v)| k == "group" && Some(v.as_str()) == group)
                                    })
                                });
                        if !keep {
                            continue;
                        }
                    }
                    slot.1.push(sid.to_owned());
                }
                Ok(per)
            }
        }
    }
}

/// `"<shard>/<stream id>"` or `"<stream id>"` (shard 0) → (shard, stream id).
fn split_entry_id(id: &str) -> Result<(u16, &str), InvalidInput> {
    let (shard, sid) = match id.split_once('/') {
        Some((s, sid)) => (
            s.parse::<u16>().map_err(|_| InvalidInput::Id {
                reason: format!("dead-letter id {id:?}: shard before '/' is not a number"),
            })?,
            sid,
        ),
        None => (0, id),
    };
    let valid = sid
        .split_once('-')
        .is_some_and(|(a, b)| a.parse::<u64>().is_ok() && b.parse::<u64>().is_ok());
    if !valid {
        return Err(InvalidInput::Id {
            reason: format!("dead-letter id {id:?} is not a stream id like 1700000000000-0"),
        });
    }
    Ok((shard, sid))
}

fn to_dead(
    q: &QueueName,
    keys: &ShardKeys,
    many: bool,
    sid: &str,
    fields: Vec<(String, String)>,
) -> DeadLetter {
    let get = |k: &str| fields.iter().find(|(f, _)| f == k).map(|(_, v)| v.as_str());
    let payload = get("data")
        .map(|d| decode_stored(d).1)
        .and_then(|json| crate::engine::message::Payload::from_json(json).ok())
        .unwrap_or_else(|| crate::engine::message::Payload::from_value(&serde_json::Value::Null));
    DeadLetter {
        entry_id: if many {
            format!("{}/{sid}", keys.shard)
        } else {
            sid.to_owned()
        },
        queue: q.as_str().to_owned(),
        id: get("id").unwrap_or_default().to_owned(),
        group: get("group").unwrap_or_default().to_owned(),
        attempts: get("attempts").and_then(|v| v.parse().ok()).unwrap_or(0),
        last_error: get("error").unwrap_or_default().to_owned(),
        dead_at_ms: get("dead_ms").and_then(|v| v.parse().ok()).unwrap_or(0),
        due_at_ms: get("due_ms")
            .and_then(|v| v.parse::<f64>().ok())
            .map(crate::engine::reply::score_to_ms)
            .unwrap_or(0),
        payload,
        priority: crate::engine::reply::stored_level(get("priority")),
        reason: get("reason").map(str::to_owned),
        late_ms: get("late_ms").and_then(|v| v.parse().ok()),
        tags: get("data")
            .map(crate::engine::tags::of_stored)
            .unwrap_or_default(),
        key: get("data")
            .and_then(crate::engine::order_key::of_stored)
            .map(str::to_owned),
    }
}
