//! Test harness: every test starts its own `redis-server` (free port, temp dir, killed on
//! drop, its log printed when the test panics). Nothing here touches a shared Redis.
#![allow(dead_code, missing_docs, clippy::unwrap_used)]

#[cfg(feature = "cli")]
pub mod browser;
pub mod cluster;
#[cfg(feature = "orders")]
pub mod db;
#[cfg(feature = "cli")]
pub mod sentinel;
#[cfg(feature = "cli")]
pub mod serve;

use delayq::{Client, ClientOptions, Clock, Delivery, HandlerResult, LocalRedis};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A fresh server and a client on it using the server's clock.
pub async fn start() -> (LocalRedis, Client) {
    start_with(ClientOptions::default()).await
}

pub async fn start_with(opts: ClientOptions) -> (LocalRedis, Client) {
    let server = LocalRedis::start().expect("start redis-server");
    let client = Client::connect_with(&server.url(), opts)
        .await
        .expect("connect");
    declare_queues(&client).await;
    (server, client)
}

/// The queues the tests use, declared as a deployment would (with the client's shard
/// count). Other names stay unregistered.
pub const QUEUES: [&str; 3] = ["order-close", "q", "notify"];
/// [`QUEUES`], sorted by name.
pub const QUEUES_SORTED: [&str; 3] = ["notify", "order-close", "q"];

pub async fn declare_queues(client: &Client) {
    for q in QUEUES {
        client
            .admin()
            .create_queue(q, client.options().shards)
            .await
            .expect("create queue");
    }
}

/// A fresh server and a client on it driven by `clock`.
pub async fn start_with_clock(clock: Arc<dyn Clock>) -> (LocalRedis, Client) {
    let server = LocalRedis::start().expect("start redis-server");
    let client = Client::connect_with_clock(&server.url(), ClientOptions::default(), clock)
        .await
        .expect("connect");
    declare_queues(&client).await;
    (server, client)
}

/// Runs a raw command on the client's connection.
pub async fn raw<T: redis::FromRedisValue>(client: &Client, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(&mut client.connection())
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// Every key and its serialized value (DUMP) in the server: a snapshot to compare.
pub async fn snapshot(client: &Client) -> Vec<(String, Vec<u8>)> {
    let mut keys: Vec<String> = raw(client, &["KEYS", "*"]).await;
    keys.sort();
    let mut out = Vec::new();
    for k in keys {
        let dump: Vec<u8> = raw(client, &["DUMP", &k]).await;
        out.push((k, dump));
    }
    out
}

/// The epoch of a registered queue (what direct callers of `enqueue.lua` pass).
pub async fn epoch(client: &Client, queue: &str) -> String {
    raw(client, &["HGET", &format!("{{dq}}:queue:{queue}"), "epoch"]).await
}

/// The keys of shard `shard` of `queue` in the tests' namespace `dq`.
pub fn shard_keys(queue: &str, shard: u16) -> delayq::engine::keys::ShardKeys {
    let queue = delayq::engine::keys::QueueName::new(queue).unwrap();
    delayq::engine::keys::Keyspace::new("dq")
        .unwrap()
        .shard(&queue, shard)
}

/// A direct call of `enqueue.lua` on shard `shard` of `queue`, its ten KEYS given (then its
/// mode, now, epoch and orders as arguments).
pub fn enqueue_call<'a>(
    script: &'a redis::Script,
    queue: &str,
    shard: u16,
) -> redis::ScriptInvocation<'a> {
    let keys = shard_keys(queue, shard);
    let mut inv = script.prepare_invoke();
    for k in delayq::engine::scripts::enqueue_keys(&keys) {
        inv.key(k);
    }
    inv
}

/// Keys that hold data: everything but the queue registry (`{dq}:...`).
pub async fn data_keys(client: &Client) -> usize {
    let keys: Vec<String> = raw(client, &["KEYS", "*"]).await;
    // The registry ({dq}:...) and each shard's marker ({dq:q:s}:meta) are not data.
    keys.iter()
        .filter(|k| !k.starts_with("{dq}:") && !k.ends_with(":meta"))
        .count()
}

/// Calls `f` every 10 ms until its future gives a value; `None` once `within` has passed.
/// The one polling loop of the tests, for conditions no event announces (a port opening, a
/// process exiting, a page changing); everything else awaits its event.
pub async fn poll<T, F, Fut>(within: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls `cond` (see [`poll`]) until it holds; panics with `what` after `within`.
pub async fn wait_for<F, Fut>(what: &str, within: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let held = poll(within, || {
        let c = cond();
        async move { c.await.then_some(()) }
    })
    .await;
    if held.is_none() {
        panic!("timed out after {within:?} waiting for: {what}");
    }
}

/// A handler that records every delivery.
#[derive(Clone, Default)]
pub struct Recorder {
    pub seen: Arc<Mutex<Vec<Delivery>>>,
}

impl Recorder {
    pub fn handler(
        &self,
    ) -> impl Fn(Delivery) -> std::future::Ready<HandlerResult> + Send + Sync + 'static {
        let seen = self.seen.clone();
        move |d: Delivery| {
            seen.lock().unwrap().push(d);
            std::future::ready(Ok(()))
        }
    }

    pub fn len(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    pub fn deliveries(&self) -> Vec<Delivery> {
        self.seen.lock().unwrap().clone()
    }

    /// Deliveries per order id.
    pub fn counts(&self) -> HashMap<String, usize> {
        let mut m = HashMap::new();
        for d in self.seen.lock().unwrap().iter() {
            *m.entry(d.id.clone()).or_insert(0) += 1;
        }
        m
    }

    pub async fn wait_len(&self, n: usize, within: Duration) {
        let me = self.clone();
        wait_for(&format!("{n} deliveries"), within, move || {
            let l = me.len();
            async move { l >= n }
        })
        .await;
    }
}

/// Number of pending entries of `group` on `stream`.
pub async fn pending(client: &Client, stream: &str, group: &str) -> i64 {
    let v: redis::Value = raw(client, &["XPENDING", stream, group]).await;
    match v {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::Int(n)) => *n,
            other => panic!("XPENDING reply {other:?}"),
        },
        other => panic!("XPENDING reply {other:?}"),
    }
}

/// Appends a dead letter with stream id `id` to shard `shard`'s dead-letter stream of queue
/// `order-close` (namespace `dq`), as `dead.lua` writes one.
pub fn xadd_dead(pipe: &mut redis::Pipeline, shard: u16, id: &str, order: &str, data: &str) {
    pipe.cmd("XADD")
        .arg(format!("{{dq:order-close:{shard}}}:dead"))
        .arg(id)
        .arg("id")
        .arg(order)
        .arg("due_ms")
        .arg("1000")
        .arg("data")
        .arg(data)
        .arg("group")
        .arg("close")
        .arg("attempts")
        .arg("3")
        .arg("error")
        .arg("boom")
        .arg("dead_ms")
        .arg("1000")
        .arg("entry")
        .arg("1-0")
        .ignore();
}
