//! Flow control: pausing a queue's dispatch or a group's consumption, and rate limits shared
//! by every process of a group.
//!
//! **Pause** flags live in every shard's meta hash (`{ns:q:s}:meta`: field `paused` for the
//! queue, `paused:<group>` for a group), checked inside `dequeue.lua` and `read.lua`: once
//! a pause call has answered, no dispatch or read starts anywhere. The registry record
//! keeps a copy for listings. A resume wakes this process's dispatchers and readers at
//! once; other processes look again within [`PAUSE_REFRESH`]. A paused
//! queue keeps accepting schedules, cancels and reads; its orders wait in the schedule and
//! go out earliest first when resumed. A paused group takes no new entries; entries it
//! holds finish and are acknowledged, the rest wait in the stream (no attempt used, no
//! lease running).
//!
//! **Rate limits** are a GCRA in Redis (`lua/ratelimit.lua`, key `{ns}:rate:<q>:<g>`): a
//! reader takes the permits for a whole read in one call; entries beyond the limit stay in
//! the stream, unread.

use crate::engine::client::Client;
use crate::engine::error::{InvalidInput, RedisContext, Result};
use crate::engine::history::{HistoryPolicy, RETENTION_FIELD};
use crate::engine::keys::QueueName;
use serde::Serialize;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How stale a process's view of the pause flags may be.
pub const PAUSE_REFRESH: Duration = Duration::from_millis(400);

/// A queue's or a group's pause state, as the surfaces answer it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PauseState {
    /// The queue.
    pub queue: String,
    /// The group (`None`: the queue's dispatch).
    pub group: Option<String>,
    /// Whether it is paused now.
    pub paused: bool,
}

/// The registry field holding a pause flag.
pub(crate) fn pause_field(group: Option<&str>) -> String {
    match group {
        None => "paused".to_owned(),
        Some(g) => format!("paused:{g}"),
    }
}

/// A queue's registry flags, as one process sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueFlags {
    /// The watched pause flag (the queue's dispatch, or one group's consumption).
    pub(crate) paused: bool,
    /// The queue's order-history retention.
    pub(crate) history: HistoryPolicy,
    /// The queue's default `expires_after`, ms (see [`crate::engine::expiry`]).
    pub(crate) expires_after_ms: Option<i64>,
}

/// The pause flag of `queue` (or of `group`) and the queue's history retention, read
/// together.
pub(crate) async fn queue_flags(
    client: &Client,
    queue: &QueueName,
    group: Option<&str>,
) -> Result<QueueFlags> {
    let (paused, history, expires): (Option<String>, Option<i64>, Option<i64>) =
        redis::cmd("HMGET")
            .arg(client.queue_meta_key(queue))
            .arg(pause_field(group))
            .arg(RETENTION_FIELD)
            .arg(crate::engine::expiry::QUEUE_FIELD)
            .query_async(&mut client.connection())
            .await
            .ctx("reading the queue's flags")?;
    Ok(QueueFlags {
        paused: paused.is_some(),
        history: history.map_or_else(HistoryPolicy::default, HistoryPolicy::from_ms),
        expires_after_ms: expires.filter(|e| *e > 0),
    })
}

/// A process's cached view of a queue's flags (one pause flag and the history retention),
/// refreshed at most every [`PAUSE_REFRESH`].
#[derive(Debug)]
pub(crate) struct QueueWatch {
    queue: QueueName,
    group: Option<String>,
    seen: Mutex<Option<(Instant, QueueFlags)>>,
}

impl QueueWatch {
    /// Watches `queue`'s flags (with `group`'s pause flag, when given).
    pub(crate) fn new(queue: QueueName, group: Option<String>) -> Self {
        QueueWatch {
            queue,
            group,
            seen: Mutex::new(None),
        }
    }

    /// The flags (a Redis read when the cached value is older than [`PAUSE_REFRESH`]; no
    /// lock is held across it).
    pub(crate) async fn flags(&self, client: &Client) -> Result<QueueFlags> {
        let cached = *self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, f)) = cached
            && at.elapsed() < PAUSE_REFRESH
        {
            return Ok(f);
        }
        let f = queue_flags(client, &self.queue, self.group.as_deref()).await?;
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), f));
        Ok(f)
    }

    /// Forgets the cached flags: the next call reads them again.
    pub(crate) fn invalidate(&self) {
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The queue's default `expires_after` in ms (none when the record cannot be read: an
    /// order without its own is then handed over; the next read decides again).
    pub(crate) async fn expires_after_ms(&self, client: &Client) -> Option<i64> {
        match self.flags(client).await {
            Ok(f) => f.expires_after_ms,
            Err(e) => {
                tracing::warn!(queue = %self.queue, error = %e, "reading the queue's flags failed");
                None
            }
        }
    }

    /// Whether the watched flag says paused.
    pub(crate) async fn paused(&self, client: &Client) -> Result<bool> {
        Ok(self.flags(client).await?.paused)
    }

    /// The queue's history retention (history off when the record cannot be read: an entry
    /// then just has no meta hash).
    pub(crate) async fn history(&self, client: &Client) -> HistoryPolicy {
        match self.flags(client).await {
            Ok(f) => f.history,
            Err(e) => {
                tracing::warn!(queue = %self.queue, error = %e, "reading the queue's flags failed");
                HistoryPolicy::from_ms(0)
            }
        }
    }
}

/// A rate limit: at most `count` handler calls per `period`, shared by every process of a
/// group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Calls per period.
    pub count: u32,
    /// The period.
    pub period: Duration,
}

impl RateLimit {
    /// Parses `"200/s"`, `"30/m"`, `"1000/h"`.
    pub fn parse(text: &str) -> Result<Self, InvalidInput> {
        let bad = |reason: String| InvalidInput::Option {
            name: "rate_limit",
            reason,
        };
        let (n, unit) = text
            .trim()
            .split_once('/')
            .ok_or_else(|| bad(format!("{text:?} is not N/s, N/m or N/h")))?;
        let count: u32 = n
            .trim()
            .parse()
            .map_err(|_| bad(format!("{n:?} is not a whole number")))?;
        let period = match unit.trim() {
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            other => return Err(bad(format!("unit {other:?} is not s, m or h"))),
        };
        let r = RateLimit { count, period };
        r.validate()?;
        Ok(r)
    }

    /// Checks the range: 1..=1,000,000 per period.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        if !(1..=1_000_000).contains(&self.count) || self.period.is_zero() {
            return Err(InvalidInput::Option {
                name: "rate_limit",
                reason: "must allow 1..=1000000 calls per period".into(),
            });
        }
        Ok(())
    }

    /// Microseconds per permit.
    fn interval_us(&self) -> i64 {
        let us = i64::try_from(self.period.as_micros()).unwrap_or(i64::MAX);
        (us / i64::from(self.count)).max(1)
    }

    /// Permits that may be taken at once: a tenth of a second's worth, at least 1.
    fn burst(&self) -> i64 {
        (100_000 / self.interval_us()).max(1)
    }
}

use crate::engine::scripts::admin::RATELIMIT;

/// Takes up to `wanted` permits of `limit` for `queue`/`group`; returns how many were
/// granted and, when none, how long until one is free.
pub(crate) async fn take_permits(
    client: &Client,
    queue: &QueueName,
    group: &str,
    limit: &RateLimit,
    wanted: usize,
) -> Result<(usize, Duration)> {
    let key = client.keyspace().rate(queue, group);
    let (granted, wait_us): (i64, i64) = RATELIMIT
        .key(key)
        .arg(client.clock().now_us())
        .arg(limit.interval_us())
        .arg(limit.burst())
        .arg(wanted.clamp(1, 1000))
        .arg("take")
        .invoke_async(&mut client.connection())
        .await
        .ctx("taking rate-limit permits (ratelimit.lua)")?;
    Ok((
        usize::try_from(granted).unwrap_or(0),
        Duration::from_micros(u64::try_from(wait_us).unwrap_or(0)),
    ))
}

/// Gives back `unused` permits of `limit` taken for a read that returned fewer entries, so
/// idle readers never drain a limit shared with busy ones.
pub(crate) async fn refund_permits(
    client: &Client,
    queue: &QueueName,
    group: &str,
    limit: &RateLimit,
    unused: usize,
) -> Result<()> {
    if unused == 0 {
        return Ok(());
    }
    let _: (i64, i64) = RATELIMIT
        .key(client.keyspace().rate(queue, group))
        .arg(client.clock().now_us())
        .arg(limit.interval_us())
        .arg(limit.burst())
        .arg(unused.clamp(1, 1000))
        .arg("refund")
        .invoke_async(&mut client.connection())
        .await
        .ctx("refunding rate-limit permits (ratelimit.lua)")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limits_parse() {
        let r = RateLimit::parse("200/s").unwrap();
        assert_eq!((r.count, r.period), (200, Duration::from_secs(1)));
        assert_eq!(r.interval_us(), 5000);
        assert_eq!(r.burst(), 20);
        assert_eq!(
            RateLimit::parse("30/m").unwrap().period,
            Duration::from_secs(60)
        );
        assert_eq!(RateLimit::parse("1/h").unwrap().burst(), 1);
        for bad in ["", "200", "0/s", "x/s", "5/d", "-1/s", "2000000/s"] {
            assert!(RateLimit::parse(bad).is_err(), "{bad}");
        }
    }
}
