//! Cross-process wake-ups: the listener that hears other processes' schedules.
//!
//! A write that makes a shard's earliest due time earlier (`enqueue.lua`, `reschedule.lua`,
//! `tick.lua`, whoever runs them: this process, another one, an SDK) publishes that time on
//! the shard's wake channel ([`ShardKeys::wake_channel`], sharded `SPUBLISH` on Redis 7,
//! `PUBLISH` on 6.2). Each client has one listener: one Pub/Sub connection (RESP3, pushes
//! handled as they arrive) subscribed to the channels of every queue a dispatcher of this
//! process runs. A message wakes the queue's dispatcher to look at that shard at that time
//! ([`Wake::pushed`]).
//!
//! **Nothing is lost for good.** While a queue's channels are not all subscribed (before
//! the first confirmation, after the connection broke) its dispatcher polls every
//! `max_idle` (250 ms) as before; once they are, every `idle_poll` (30 s, a one-command read of the shard's earliest due time). Each
//! confirmation of a subscription, the first one and those after a reconnect, makes the
//! dispatcher look at that shard once, so messages published while nobody listened cost
//! one call, never an order. The connection's end (a killed client, a failover, a broken
//! socket: a `Disconnection` push, or a `PING` every [`PING_EVERY`] that fails; with
//! Sentinel, the sentinels naming another master while the old one still answers) opens a
//! new one, through the target's own resolution (the master the sentinels name now); a
//! cluster's connection subscribes again by itself after reconnects and slot moves.
//!
//! The listener's task runs while some dispatcher watches a queue, and ends with the last
//! [`Watch`]. No lock is held across a Redis call.

use crate::engine::conn::{PubSubConn, Push, RedisTarget};
use crate::engine::keys::ShardKeys;
use crate::engine::retry::{Pacer, RetryPolicy};
use crate::engine::sync::lock;
use crate::engine::telemetry;
use crate::engine::wake::Wake;
use redis::{PushInfo, PushKind, Value};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// How often an idle listener checks its connection with a `PING` (a socket that died
/// without a reset is found within this plus the response timeout).
pub const PING_EVERY: Duration = Duration::from_secs(5);

/// How often the listener checks whether the sentinels named another master (an atomic
/// read; the target's watcher asks them every 500 ms).
const MASTER_CHECK_EVERY: Duration = Duration::from_millis(250);

/// Tells every dispatcher listening on `shards`' wake channels to look at them now (a
/// resume: their paused shards have orders due). Best effort: a dispatcher that misses it
/// looks within its idle poll.
pub(crate) async fn publish_now(client: &crate::engine::client::Client, shards: &[ShardKeys]) {
    let sharded = client.server().is_none_or(|s| s.has_spublish());
    let calls = shards.iter().map(|k| {
        let mut conn = client.connection();
        let channel = k.wake_channel();
        async move {
            let r: redis::RedisResult<i64> =
                redis::cmd(if sharded { "SPUBLISH" } else { "PUBLISH" })
                    .arg(channel)
                    .arg(0)
                    .query_async(&mut conn)
                    .await;
            if let Err(e) = r {
                tracing::debug!(error = %e, "publishing a wake-up failed");
            }
        }
    });
    futures_util::future::join_all(calls).await;
}

/// One subscribed channel: whose shard it is, and how many watches hold it.
#[derive(Debug)]
struct Entry {
    wake: Weak<Wake>,
    shard: usize,
    holders: usize,
    /// The server confirmed the subscription on the current connection.
    confirmed: bool,
}

#[derive(Debug, Default)]
struct Channels {
    by_name: HashMap<String, Entry>,
    /// The task is running.
    running: bool,
}

struct Shared {
    channels: Mutex<Channels>,
    /// A watch came or went.
    changed: Notify,
    target: RedisTarget,
    response_timeout: Duration,
    connect_timeout: Duration,
    /// Shard channels (`SSUBSCRIBE`, Redis 7) or plain ones (6.2).
    sharded: bool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("sharded", &self.sharded)
            .finish_non_exhaustive()
    }
}

/// A client's wake-up listener (see the module docs).
#[derive(Debug)]
pub(crate) struct Listener {
    shared: Arc<Shared>,
}

/// A dispatcher's subscription to its queue's channels, held while it runs.
#[derive(Debug)]
pub(crate) struct Watch {
    shared: Arc<Shared>,
    channels: Vec<String>,
}

impl Listener {
    /// A listener opening its connections through `target`.
    pub(crate) fn new(
        target: RedisTarget,
        response_timeout: Duration,
        connect_timeout: Duration,
        sharded: bool,
    ) -> Self {
        Listener {
            shared: Arc::new(Shared {
                channels: Mutex::new(Channels::default()),
                changed: Notify::new(),
                target,
                response_timeout,
                connect_timeout,
                sharded,
            }),
        }
    }

    /// Subscribes to the wake channels of `shards` (a queue's, in index order) for `wake`,
    /// until the returned watch drops. Starts the listener's task when it is not running
    /// (no task outside a tokio runtime: the dispatcher then keeps polling every
    /// `max_idle`).
    pub(crate) fn watch(&self, wake: &Arc<Wake>, shards: &[ShardKeys]) -> Watch {
        let channels: Vec<String> = shards.iter().map(ShardKeys::wake_channel).collect();
        let start = {
            let mut c = lock(&self.shared.channels);
            for (i, ch) in channels.iter().enumerate() {
                let e = c.by_name.entry(ch.clone()).or_insert_with(|| Entry {
                    wake: Arc::downgrade(wake),
                    shard: i,
                    holders: 0,
                    confirmed: false,
                });
                e.holders += 1;
            }
            telemetry::wake_channels(c.by_name.len());
            let start = !c.running && tokio::runtime::Handle::try_current().is_ok();
            c.running |= start;
            start
        };
        if start {
            tokio::spawn(run(self.shared.clone()));
        }
        self.shared.changed.notify_one();
        Watch {
            shared: self.shared.clone(),
            channels,
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut gone = Vec::new();
        {
            let mut c = lock(&self.shared.channels);
            for ch in &self.channels {
                if let Some(e) = c.by_name.get_mut(ch) {
                    e.holders -= 1;
                    if e.holders == 0
                        && let Some(e) = c.by_name.remove(ch)
                    {
                        gone.push(e);
                    }
                }
            }
            telemetry::wake_channels(c.by_name.len());
        }
        for e in gone {
            if e.confirmed
                && let Some(w) = e.wake.upgrade()
            {
                w.listening.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.shared.changed.notify_one();
    }
}

impl Shared {
    /// Marks `channel` confirmed (once per connection); the shard is looked at once.
    fn confirmed(&self, channel: &str) {
        let wake = {
            let mut c = lock(&self.channels);
            match c.by_name.get_mut(channel) {
                Some(e) if !e.confirmed => {
                    e.confirmed = true;
                    e.wake.upgrade().map(|w| (w, e.shard))
                }
                _ => None,
            }
        };
        if let Some((w, shard)) = wake {
            w.listening.fetch_add(1, Ordering::SeqCst);
            w.pushed(shard, i64::MIN);
        }
    }

    /// A message: `channel`'s shard has an order due at `due_ms` (`<ms>`), or a group's
    /// timer due then (`t<ms>`: a pull consumer's retry or a replay, for waiting pull
    /// receives only). Anything else is ignored.
    fn message(&self, channel: &str, text: &str) {
        let (timer, due) = match text.strip_prefix('t') {
            Some(ms) => (true, ms.parse::<i64>()),
            None => (false, text.parse::<i64>()),
        };
        let Ok(due_ms) = due else { return };
        let wake = {
            let c = lock(&self.channels);
            c.by_name
                .get(channel)
                .and_then(|e| e.wake.upgrade().map(|w| (w, e.shard)))
        };
        match wake {
            Some((w, _)) if timer => w.timer_heard(due_ms),
            Some((w, shard)) => w.pushed(shard, due_ms),
            None => {}
        }
    }

    /// The connection is gone: nothing is confirmed any more.
    fn lost_all(&self) {
        let mut wakes = Vec::new();
        {
            let mut c = lock(&self.channels);
            for e in c.by_name.values_mut() {
                if std::mem::take(&mut e.confirmed) {
                    wakes.extend(e.wake.upgrade());
                }
            }
        }
        for w in wakes {
            w.listening.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The channels to subscribe and to unsubscribe, given what this connection has; with
    /// nothing watched and nothing subscribed, marks the task stopped and answers `None`.
    fn diff(&self, subscribed: &HashSet<String>) -> Option<(Vec<String>, Vec<String>)> {
        let mut c = lock(&self.channels);
        if c.by_name.is_empty() && subscribed.is_empty() {
            c.running = false;
            return None;
        }
        let add = c
            .by_name
            .keys()
            .filter(|k| !subscribed.contains(*k))
            .cloned()
            .collect();
        let remove = subscribed
            .iter()
            .filter(|k| !c.by_name.contains_key(*k))
            .cloned()
            .collect();
        Some((add, remove))
    }

    /// True (and the task marked stopped) when nothing is watched.
    fn idle(&self) -> bool {
        let mut c = lock(&self.channels);
        if c.by_name.is_empty() {
            c.running = false;
            return true;
        }
        false
    }
}

/// A push from the connection: a confirmation, a message, or the connection's end.
fn on_push(shared: &Weak<Shared>, lost: &Notify, p: PushInfo) {
    let Some(shared) = shared.upgrade() else {
        return;
    };
    let text = |v: Option<&Value>| match v {
        Some(Value::BulkString(b)) => std::str::from_utf8(b).ok().map(str::to_owned),
        Some(Value::SimpleString(s)) => Some(s.clone()),
        _ => None,
    };
    match p.kind {
        PushKind::SMessage | PushKind::Message => {
            if let (Some(channel), Some(due)) = (text(p.data.first()), text(p.data.get(1))) {
                shared.message(&channel, &due);
            }
        }
        PushKind::SSubscribe | PushKind::Subscribe => {
            if let Some(channel) = text(p.data.first()) {
                shared.confirmed(&channel);
            }
        }
        PushKind::Disconnection => lost.notify_one(),
        _ => {}
    }
}

/// The listener's task: connect, subscribe to what is watched, follow the watches, and
/// start again when the connection ends; returns once nothing is watched.
async fn run(shared: Arc<Shared>) {
    let mut pacer = Pacer::new(RetryPolicy::LOOP);
    loop {
        if shared.idle() {
            return;
        }
        let lost = Arc::new(Notify::new());
        let push: Push = {
            let (weak, lost) = (Arc::downgrade(&shared), lost.clone());
            Arc::new(move |p| on_push(&weak, &lost, p))
        };
        let conn = shared
            .target
            .pubsub(push, shared.response_timeout, shared.connect_timeout)
            .await;
        let mut conn = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %crate::engine::redact::error(&e.to_string()), retry_in = ?pacer.next_delay(), "the wake-up listener could not connect");
                pacer.wait(None).await;
                continue;
            }
        };
        tracing::debug!("the wake-up listener connected");
        let since = tokio::time::Instant::now();
        if follow(&shared, &mut conn, &lost).await {
            return;
        }
        shared.lost_all();
        telemetry::wake_reconnected();
        tracing::info!("the wake-up listener lost its connection; reconnecting");
        // A connection that held a while starts the backoff afresh; one that ends at once
        // (a subscription refused, e.g. by an ACL without the wake channels) waits longer
        // each time instead of reconnecting in a tight loop.
        if since.elapsed() >= PING_EVERY {
            pacer.reset();
        } else {
            pacer.wait(None).await;
        }
    }
}

/// Follows the watches on one connection until it ends (false) or nothing is watched
/// (true).
async fn follow(shared: &Arc<Shared>, conn: &mut PubSubConn, lost: &Notify) -> bool {
    let mut subscribed = HashSet::new();
    let mut last_ping = tokio::time::Instant::now();
    loop {
        let changed = shared.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let Some((add, remove)) = shared.diff(&subscribed) else {
            return true;
        };
        if !add.is_empty() {
            if conn.subscribe(&add, shared.sharded).await.is_err() {
                return false;
            }
            if conn.heals_itself() {
                add.iter().for_each(|c| shared.confirmed(c));
            }
            subscribed.extend(add);
        }
        if !remove.is_empty() {
            if conn.unsubscribe(&remove, shared.sharded).await.is_err() {
                return false;
            }
            remove.iter().for_each(|c| {
                subscribed.remove(c);
            });
        }
        tokio::select! {
            _ = &mut changed => {}
            _ = lost.notified() => return false,
            _ = tokio::time::sleep(MASTER_CHECK_EVERY) => {
                if conn.is_stale() {
                    return false;
                }
                if last_ping.elapsed() >= PING_EVERY {
                    last_ping = tokio::time::Instant::now();
                    if conn.ping().await.is_err() {
                        return false;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::keys::{Keyspace, QueueName};
    use crate::engine::wake::WakeRegistry;

    fn push(kind: PushKind, data: &[&str]) -> PushInfo {
        PushInfo {
            kind,
            data: data
                .iter()
                .map(|d| Value::BulkString(d.as_bytes().to_vec()))
                .collect(),
        }
    }

    #[test]
    fn watches_hold_channels_and_pushes_reach_their_shard() {
        let target = RedisTarget::open("redis://127.0.0.1:1").unwrap();
        let l = Listener::new(target, Duration::from_secs(1), Duration::from_secs(1), true);
        let q = QueueName::new("q").unwrap();
        let shards = Keyspace::new("dq").unwrap().shards(&q, 2);
        let reg = WakeRegistry::default();
        let wake = reg.get("q");
        let a = l.watch(&wake, &shards);
        let b = l.watch(&wake, &shards);
        // Outside a runtime no task starts: the dispatcher keeps its short poll.
        assert!(!lock(&l.shared.channels).running);
        let weak = Arc::downgrade(&l.shared);
        let lost = Notify::new();
        let ch1 = shards[1].wake_channel();
        assert_eq!(ch1, "{dq:q:1}:wake");
        // A confirmation counts once per connection and makes the shard looked at.
        on_push(&weak, &lost, push(PushKind::SSubscribe, &[&ch1, "1"]));
        on_push(&weak, &lost, push(PushKind::SSubscribe, &[&ch1, "1"]));
        assert_eq!(wake.listening.load(Ordering::SeqCst), 1);
        assert_eq!(wake.take_pushed().get(&1), Some(&i64::MIN));
        // A message: the shard's earliest due time; junk is ignored.
        on_push(&weak, &lost, push(PushKind::SMessage, &[&ch1, "1234"]));
        on_push(&weak, &lost, push(PushKind::SMessage, &[&ch1, "x"]));
        on_push(
            &weak,
            &lost,
            push(PushKind::SMessage, &["{dq:other:0}:wake", "5"]),
        );
        let p = wake.take_pushed();
        assert_eq!((p.len(), p.get(&1)), (1, Some(&1234)));
        // A group's timer (`t<ms>`): heard by waiting pull receives, not a dispatcher's look.
        on_push(&weak, &lost, push(PushKind::SMessage, &[&ch1, "t777"]));
        on_push(&weak, &lost, push(PushKind::SMessage, &[&ch1, "tx"]));
        assert!(wake.take_pushed().is_empty());
        assert_eq!(wake.heard_ms.load(Ordering::SeqCst), 777);
        // The connection's end: nothing is confirmed any more.
        l.shared.lost_all();
        assert_eq!(wake.listening.load(Ordering::SeqCst), 0);
        // Channels live while a watch holds them.
        drop(a);
        assert_eq!(lock(&l.shared.channels).by_name.len(), 2);
        drop(b);
        assert!(lock(&l.shared.channels).by_name.is_empty());
    }
}
