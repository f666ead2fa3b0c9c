#![allow(clippy::unwrap_used)]
//! Cross-process wake-ups (`engine::listen`): orders scheduled by another client, or by a
//! raw `EVALSHA` of the exported script as the SDKs run it, wake a dispatcher that would
//! otherwise sleep for an hour; the listener subscribes again after its connection is
//! killed; an idle queue costs a bounded number of script calls.
//!
//! Every dispatcher here has `max_idle` and `idle_poll` of an hour, so nothing but a
//! wake-up can deliver an order within the tests' wait.

use crate::support;

use delayq::{
    Client, ClientOptions, Dispatcher, DispatcherOptions, Housekeeper, HousekeepingOptions,
    Supervisor, SupervisorOptions, When, Worker, WorkerOptions,
};
use serde_json::json;
use std::time::Duration;
use support::{Recorder, raw, start_with, wait_for};
use tokio_util::sync::CancellationToken;

const Q: &str = "order-close";
const SHARDS: u16 = 4;
const WAIT: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

fn sleepy() -> DispatcherOptions {
    DispatcherOptions::default().max_idle(HOUR).idle_poll(HOUR)
}

fn channels(queue: &str) -> Vec<String> {
    (0..SHARDS)
        .map(|s| format!("{{dq:{queue}:{s}}}:wake"))
        .collect()
}

/// Subscribers of each of `queue`'s wake channels (`PUBSUB SHARDNUMSUB`).
async fn subscribers(client: &Client, queue: &str) -> Vec<i64> {
    let mut args = vec!["PUBSUB".to_owned(), "SHARDNUMSUB".to_owned()];
    args.extend(channels(queue));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let flat: Vec<redis::Value> = raw(client, &args).await;
    flat.chunks(2)
        .map(|c| match &c[1] {
            redis::Value::Int(n) => *n,
            other => panic!("{other:?}"),
        })
        .collect()
}

async fn wait_subscribed(client: &Client, queue: &str) {
    wait_for("every shard's wake channel subscribed", WAIT, || async {
        subscribers(client, queue).await.iter().all(|n| *n >= 1)
    })
    .await;
}

/// A client with [`SHARDS`] shards on a fresh server, a sleepy dispatcher and a worker.
async fn pipeline() -> (
    delayq::LocalRedis,
    Client,
    Recorder,
    CancellationToken,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let (server, client) = start_with(ClientOptions::default().shards(SHARDS)).await;
    let rec = Recorder::default();
    let cancel = CancellationToken::new();
    let d = Dispatcher::new(&client, Q, sleepy()).unwrap();
    let dh = tokio::spawn(d.run(cancel.clone()));
    let w = Worker::new(
        &client,
        Q,
        "close",
        rec.handler(),
        WorkerOptions::default().block(Duration::from_millis(100)),
    )
    .unwrap();
    w.ensure_groups().await.unwrap();
    let wc = cancel.clone();
    let wh = tokio::spawn(async move { w.run(wc).await.unwrap() });
    wait_subscribed(&client, Q).await;
    (server, client, rec, cancel, vec![dh, wh])
}

async fn stop(cancel: CancellationToken, handles: Vec<tokio::task::JoinHandle<()>>) {
    cancel.cancel();
    for h in handles {
        h.await.unwrap();
    }
}

#[tokio::test]
async fn an_order_scheduled_by_another_client_wakes_the_dispatcher() {
    let (server, _client, rec, cancel, handles) = pipeline().await;
    // Another client: its own connection and no in-process signal shared with the
    // dispatcher's.
    let other = Client::connect_with(&server.url(), ClientOptions::default().shards(SHARDS))
        .await
        .unwrap();
    // After the dispatcher's first passes (it looks once per confirmed subscription) it
    // sleeps for an hour; these come due 50 ms after scheduling.
    for i in 0..20 {
        other
            .schedule(Q, &format!("o{i}"), When::in_ms(50), json!({"i": i}))
            .await
            .unwrap();
    }
    rec.wait_len(20, WAIT).await;
    let mut ids: Vec<String> = rec.deliveries().into_iter().map(|d| d.id).collect();
    ids.sort();
    let mut want: Vec<String> = (0..20).map(|i| format!("o{i}")).collect();
    want.sort();
    assert_eq!(ids, want);
    stop(cancel, handles).await;
}

/// What an SDK does: `EVALSHA` of the exported `enqueue.lua` with the shard's keys.
async fn sdk_schedule(client: &Client, id: &str, due_ms: i64) {
    let text = delayq::engine::scripts::source(include_str!("../../lua/enqueue.lua"));
    let sha: String = raw(client, &["SCRIPT", "LOAD", &text]).await;
    let shard = delayq::engine::keys::shard_of(id, SHARDS);
    let keys = support::shard_keys(Q, shard);
    let epoch = support::epoch(client, Q).await;
    let now = client.now_ms().to_string();
    let due = due_ms.to_string();
    let mut call = vec!["EVALSHA", sha.as_str(), "10"];
    call.extend(delayq::engine::scripts::enqueue_keys(&keys));
    call.extend([
        "upsert:",
        now.as_str(),
        epoch.as_str(),
        id,
        due.as_str(),
        "{}",
        "",
    ]);
    let _: Vec<i64> = raw(client, &call).await;
}

#[tokio::test]
async fn an_order_scheduled_by_a_raw_evalsha_wakes_the_dispatcher() {
    let (server, _client, rec, cancel, handles) = pipeline().await;
    let other = Client::connect_with(&server.url(), ClientOptions::default().shards(SHARDS))
        .await
        .unwrap();
    for i in 0..8 {
        sdk_schedule(&other, &format!("sdk{i}"), other.now_ms() + 50).await;
    }
    rec.wait_len(8, WAIT).await;
    stop(cancel, handles).await;
}

/// The ids of the clients subscribed to shard channels (`ssub=` in `CLIENT LIST`).
async fn shard_subscribers(client: &Client) -> Vec<String> {
    let list: String = raw(client, &["CLIENT", "LIST"]).await;
    list.lines()
        .filter(|l| {
            l.split(' ')
                .any(|f| f.starts_with("ssub=") && f != "ssub=0")
        })
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_wake_up_works_after_the_listener_connection_is_killed() {
    let (server, client, rec, cancel, handles) = pipeline().await;
    let before = shard_subscribers(&client).await;
    assert_eq!(before.len(), 1, "one listener connection per client");
    // A RESP3 subscriber counts as a normal client for `CLIENT KILL TYPE pubsub`: kill it
    // by id.
    let killed: i64 = raw(&client, &["CLIENT", "KILL", "ID", &before[0]]).await;
    assert_eq!(killed, 1);
    wait_for("the listener subscribed again", WAIT, || async {
        let now = shard_subscribers(&client).await;
        now.len() == 1 && now != before
    })
    .await;
    wait_subscribed(&client, Q).await;
    let other = Client::connect_with(&server.url(), ClientOptions::default().shards(SHARDS))
        .await
        .unwrap();
    for i in 0..8 {
        other
            .schedule(Q, &format!("k{i}"), When::in_ms(50), json!(null))
            .await
            .unwrap();
    }
    rec.wait_len(8, WAIT).await;
    stop(cancel, handles).await;
}

/// Script calls Redis ran so far (`EVALSHA` and `EVAL`, from `INFO commandstats`).
async fn script_calls(client: &Client) -> u64 {
    command_calls(client, &["evalsha", "eval"]).await
}

/// Calls of `commands` so far, from `INFO commandstats` (commands run inside scripts
/// included).
async fn command_calls(client: &Client, commands: &[&str]) -> u64 {
    let info: String = raw(client, &["INFO", "commandstats"]).await;
    commands
        .iter()
        .filter_map(|c| {
            let p = format!("cmdstat_{c}:calls=");
            info.lines()
                .find_map(|l| l.strip_prefix(p.as_str()))
                .and_then(|r| r.split(',').next())
                .map(|n| n.parse::<u64>().unwrap())
        })
        .sum()
}

#[tokio::test]
async fn an_idle_supervisor_looks_at_each_shard_with_one_read_and_no_script() {
    const QUEUES: usize = 20;
    const POLL: Duration = Duration::from_secs(1);
    let (_server, client) = start_with(ClientOptions::default().shards(SHARDS)).await;
    let names: Vec<String> = (0..QUEUES).map(|i| format!("idle{i}")).collect();
    for q in &names {
        client.admin().create_queue(q, SHARDS).await.unwrap();
    }
    let cancel = CancellationToken::new();
    let sup = Supervisor::new(
        &client,
        SupervisorOptions::default().dispatcher(DispatcherOptions::default().idle_poll(POLL)),
    )
    .unwrap();
    let sh = tokio::spawn(sup.run(cancel.clone()));
    for q in &names {
        wait_subscribed(&client, q).await;
    }
    // Let every dispatcher's subscription-confirmation looks pass (one per shard), then
    // measure a span of idling.
    let settle = tokio::time::Instant::now();
    wait_for("the first idle look after subscribing", WAIT, || async {
        settle.elapsed() >= POLL
    })
    .await;
    let start = tokio::time::Instant::now();
    let (scripts_before, reads_before) = (
        script_calls(&client).await,
        command_calls(&client, &["zrange"]).await,
    );
    wait_for("a measured idle span", WAIT, || async {
        start.elapsed() >= 3 * POLL
    })
    .await;
    let (scripts, reads) = (
        script_calls(&client).await - scripts_before,
        command_calls(&client, &["zrange"]).await - reads_before,
    );
    let span = start.elapsed();
    // Nothing due: an idle look is a read of the shard's earliest due time, never a script.
    assert_eq!(scripts, 0, "script calls while idle");
    // Each shard is looked at once per idle poll (plus one look in flight at each end).
    let looks = u64::try_from(span.as_millis().div_ceil(POLL.as_millis())).unwrap() + 1;
    let bound = QUEUES as u64 * u64::from(SHARDS) * looks;
    assert!(
        reads <= bound,
        "{reads} reads in {span:?} idle over {QUEUES} queues x {SHARDS} shards; at most {bound} expected"
    );
    // And it did look: the fallback poll runs.
    assert!(reads >= QUEUES as u64 * u64::from(SHARDS), "{reads}");
    cancel.cancel();
    sh.await.unwrap().unwrap();
}

#[tokio::test]
async fn the_safety_sweep_probes_idle_shards_without_a_script_call() {
    let (_server, client) = start_with(ClientOptions::default().shards(SHARDS)).await;
    for i in 0..10 {
        client
            .admin()
            .create_queue(&format!("s{i}"), SHARDS)
            .await
            .unwrap();
    }
    client
        .schedule("s3", "later", When::in_ms(3_600_000), json!(null))
        .await
        .unwrap();
    let hk = Housekeeper::for_registry(&client, HousekeepingOptions::default()).unwrap();
    let before = script_calls(&client).await;
    assert_eq!(hk.sweep().await.unwrap().count, 0);
    assert_eq!(
        script_calls(&client).await,
        before,
        "nothing due: no script call"
    );
    // One order due now in one queue: only that queue is dispatched (one pass over its
    // shards), and the order moves.
    client
        .schedule("s7", "due", When::in_ms(0), json!(null))
        .await
        .unwrap();
    let before = script_calls(&client).await;
    assert_eq!(hk.sweep().await.unwrap().count, 1);
    // (On this fresh server each shard's first `EVALSHA` of dequeue.lua answers NOSCRIPT
    // and is sent again: at most two calls per shard.)
    let calls = script_calls(&client).await - before;
    assert!(
        calls <= 2 * u64::from(SHARDS),
        "{calls} script calls for one due queue"
    );
}

#[tokio::test]
async fn dispatch_calls_are_sized_by_time() {
    let (_server, client) = start_with(ClientOptions::default()).await;
    let orders: Vec<delayq::NewOrder> = (0..1000)
        .map(|i| delayq::NewOrder::new(format!("t{i}"), When::in_ms(0), json!(null)))
        .collect();
    client
        .schedule_many(Q, &orders, delayq::Mode::Upsert)
        .await
        .unwrap();
    let zpopmin = |info: String| {
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_zpopmin:calls="))
            .and_then(|r| r.split(',').next())
            .map_or(0, |n| n.parse::<u64>().unwrap())
    };
    let before = zpopmin(raw(&client, &["INFO", "commandstats"]).await);
    // A call may hold Redis 1 µs: whatever the measured time per order, each call takes
    // the fewest orders a sized call takes (MIN_CALL_BATCH), never the whole batch.
    let d = Dispatcher::new(
        &client,
        Q,
        DispatcherOptions::default().max_call(Duration::from_micros(1)),
    )
    .unwrap();
    assert_eq!(d.drain().await.unwrap().moved, 1000);
    let calls = zpopmin(raw(&client, &["INFO", "commandstats"]).await) - before;
    let min = delayq::engine::dispatcher::MIN_CALL_BATCH as u64;
    assert_eq!(
        calls,
        1000_u64.div_ceil(min),
        "one ZPOPMIN per dequeue call"
    );
}

/// Subscribers of each of `queue`'s wake channels on the server at `url`.
#[cfg(feature = "cli")]
async fn subscribers_at(url: &str, queue: &str) -> Vec<i64> {
    let mut args = vec!["PUBSUB".to_owned(), "SHARDNUMSUB".to_owned()];
    args.extend(channels(queue));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let flat: Vec<redis::Value> = support::sentinel::raw(url, &args).await.unwrap_or_default();
    flat.chunks(2)
        .filter_map(|c| match c.get(1) {
            Some(redis::Value::Int(n)) => Some(*n),
            _ => None,
        })
        .collect()
}

#[cfg(feature = "cli")]
#[tokio::test]
async fn a_wake_up_works_after_a_sentinel_failover() {
    use support::sentinel::{MASTER, master_port, raw as sraw, sentinel_group};
    let (master, replica, sentinels, url) = sentinel_group().await;
    let opts = ClientOptions::default().shards(SHARDS);
    let client = Client::connect_with(&url, opts.clone()).await.unwrap();
    support::declare_queues(&client).await;
    let rec = Recorder::default();
    let cancel = CancellationToken::new();
    let dh = tokio::spawn(
        Dispatcher::new(&client, Q, sleepy())
            .unwrap()
            .run(cancel.clone()),
    );
    let w = Worker::new(
        &client,
        Q,
        "close",
        rec.handler(),
        WorkerOptions::default().block(Duration::from_millis(100)),
    )
    .unwrap();
    w.ensure_groups().await.unwrap();
    let wc = cancel.clone();
    let wh = tokio::spawn(async move { w.run(wc).await.unwrap() });
    let m_url = master.url();
    wait_for("subscribed on the master", WAIT, || async {
        let n = subscribers_at(&m_url, Q).await;
        n.len() == usize::from(SHARDS) && n.iter().all(|n| *n >= 1)
    })
    .await;
    let ok: String = sraw(&sentinels[0].url(), &["SENTINEL", "FAILOVER", MASTER])
        .await
        .unwrap();
    assert_eq!(ok, "OK");
    let (s0, new_port) = (sentinels[0].url(), replica.port);
    wait_for("the sentinels name the new master", WAIT, || async {
        master_port(&s0).await == Some(new_port)
    })
    .await;
    // The listener follows the sentinels to the new master and subscribes there.
    let r_url = replica.url();
    wait_for("subscribed on the new master", WAIT, || async {
        let n = subscribers_at(&r_url, Q).await;
        n.len() == usize::from(SHARDS) && n.iter().all(|n| *n >= 1)
    })
    .await;
    let other = Client::connect_with(&url, opts).await.unwrap();
    for i in 0..8 {
        other
            .schedule(Q, &format!("f{i}"), When::in_ms(50), json!(null))
            .await
            .unwrap();
    }
    rec.wait_len(8, WAIT).await;
    cancel.cancel();
    dh.await.unwrap();
    wh.await.unwrap();
}

#[tokio::test]
async fn a_wake_up_reaches_a_dispatcher_on_a_cluster() {
    let cluster = support::cluster::LocalCluster::start();
    let opts = ClientOptions::default().shards(SHARDS);
    let client = Client::connect_with(&cluster.url(), opts.clone())
        .await
        .unwrap();
    support::declare_queues(&client).await;
    let rec = Recorder::default();
    let cancel = CancellationToken::new();
    let dh = tokio::spawn(
        Dispatcher::new(&client, Q, sleepy())
            .unwrap()
            .run(cancel.clone()),
    );
    let w = Worker::new(
        &client,
        Q,
        "close",
        rec.handler(),
        WorkerOptions::default().block(Duration::from_millis(100)),
    )
    .unwrap();
    w.ensure_groups().await.unwrap();
    let wc = cancel.clone();
    let wh = tokio::spawn(async move { w.run(wc).await.unwrap() });
    // Each shard's channel is on its slot's master: whether an order is scheduled before
    // or after the subscriptions, only the listener (a message, or the look each
    // confirmation makes) can deliver it within the wait.
    let other = Client::connect_with(&cluster.url(), opts).await.unwrap();
    for i in 0..8 {
        other
            .schedule(Q, &format!("c{i}"), When::in_ms(50), json!(null))
            .await
            .unwrap();
    }
    rec.wait_len(8, WAIT).await;
    cancel.cancel();
    dh.await.unwrap();
    wh.await.unwrap();
}

/// A user whose ACL grants no Pub/Sub (a least-privilege set-up from before wake-ups) still
/// schedules and reschedules: the refused publish is skipped, never the write's failure (the
/// dispatchers' fallback poll finds the order).
#[tokio::test]
async fn a_user_without_pubsub_rights_still_schedules() {
    let (s, admin) = start_with(ClientOptions::default().shards(SHARDS)).await;
    let _: () = raw(
        &admin,
        &[
            "ACL",
            "SETUSER",
            "nopubsub",
            "on",
            ">pw",
            "~*",
            "resetchannels",
            "+@all",
        ],
    )
    .await;
    let url = s.url().replacen("redis://", "redis://nopubsub:pw@", 1);
    let client = Client::connect_with(&url, ClientOptions::default().shards(SHARDS))
        .await
        .unwrap();
    client
        .schedule(Q, "o1", When::in_ms(60_000), json!({"n": 1}))
        .await
        .unwrap();
    client
        .reschedule(Q, "o1", When::in_ms(1_000))
        .await
        .unwrap();
    assert!(client.get(Q, "o1").await.unwrap().is_some());
    let denied: Vec<redis::Value> = raw(&admin, &["ACL", "LOG"]).await;
    assert!(
        !denied.is_empty(),
        "the publish was not refused: the test proves nothing"
    );
}

#[tokio::test]
async fn an_idle_worker_blocks_and_does_not_read_every_lane_each_block() {
    const BLOCK: Duration = Duration::from_millis(100);
    let (_server, client) = start_with(ClientOptions::default().shards(SHARDS)).await;
    let cancel = CancellationToken::new();
    let rec = Recorder::default();
    let w = Worker::new(
        &client,
        "quiet",
        "close",
        rec.handler(),
        WorkerOptions::default().block(BLOCK),
    )
    .unwrap();
    w.ensure_groups().await.unwrap();
    let wh = tokio::spawn(w.run(cancel.clone()));
    // Past the start (the first read of every lane, the first heartbeat), idle for ten
    // block times.
    let settle = tokio::time::Instant::now();
    wait_for("the worker's start", WAIT, || async {
        settle.elapsed() >= 5 * BLOCK
    })
    .await;
    let before = script_calls(&client).await;
    let start = tokio::time::Instant::now();
    wait_for("ten block times of idling", WAIT, || async {
        start.elapsed() >= 10 * BLOCK
    })
    .await;
    let calls = script_calls(&client).await - before;
    // A read of every lane after each block time would be 10 x 4 shards = 40 script calls;
    // a heartbeat may fall in the span.
    assert!(calls <= 1, "{calls} script calls while idle");
    // And it still delivers what comes.
    client
        .schedule("quiet", "late", When::in_ms(0), json!(null))
        .await
        .unwrap();
    let d = Dispatcher::new(&client, "quiet", DispatcherOptions::default()).unwrap();
    d.drain().await.unwrap();
    rec.wait_len(1, WAIT).await;
    cancel.cancel();
    wh.await.unwrap().unwrap();
}

/// A worker's own retry wakes its reclaim loop at the retry's due time: with the loop's
/// look (`reclaim_every`) and the lease both an hour, nothing but that wake-up brings the
/// second attempt within the test's wait.
#[tokio::test]
async fn a_retry_set_by_the_worker_wakes_its_reclaim_loop() {
    let (_s, client) = start_with(ClientOptions::default()).await;
    let attempts = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u32>::new()));
    let a2 = attempts.clone();
    let w = Worker::new(
        &client,
        Q,
        "close",
        move |d: delayq::Delivery| {
            a2.lock().unwrap().push(d.attempt);
            async move {
                if d.attempt == 1 {
                    Err(delayq::HandlerError::retry("first attempt fails"))
                } else {
                    Ok(())
                }
            }
        },
        WorkerOptions::default()
            .block(Duration::from_millis(100))
            .reclaim_every(HOUR)
            .visibility_timeout(HOUR)
            .backoff(delayq::Backoff::Fixed(Duration::from_millis(200))),
    )
    .unwrap();
    w.ensure_groups().await.unwrap();
    let cancel = CancellationToken::new();
    let h = tokio::spawn(w.run(cancel.clone()));
    client
        .schedule(Q, "r1", When::in_ms(0), &json!({}))
        .await
        .unwrap();
    Dispatcher::new(&client, Q, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
    let a3 = attempts.clone();
    wait_for("the second attempt", WAIT, move || {
        let n = a3.lock().unwrap().len();
        async move { n >= 2 }
    })
    .await;
    cancel.cancel();
    h.await.unwrap().unwrap();
    assert_eq!(*attempts.lock().unwrap(), vec![1, 2]);
}
