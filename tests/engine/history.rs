//! What happened to order 1234: an order followed through its states by HTTP
//! (`GET /v1/queues/{q}/messages/{id}`) and the command line (`delayq get`), group by group,
//! until its history expires.
#![allow(clippy::unwrap_used)]

use crate::support;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use delayq::service::handlers::{Builtin, Webhook};
use delayq::service::http::{AppState, app};
use delayq::{Backoff, Delivery, Dispatcher, DispatcherOptions, When, Worker, WorkerOptions};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use support::{start, wait_for};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

const BIN: &str = env!("CARGO_BIN_EXE_delayq");
const Q: &str = "order-close";
const WAIT: Duration = Duration::from_secs(20);

/// `GET /v1/queues/{q}/messages/{id}` through the router: status and body.
async fn lookup(router: &axum::Router, id: &str) -> (StatusCode, Value) {
    let req = Request::builder()
        .uri(format!("/v1/queues/{Q}/messages/{id}"))
        .body(Body::empty())
        .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

/// `delayq get QUEUE ID`: exit code and the JSON line.
fn cli_get(url: &str, id: &str) -> (i32, Value) {
    let o = Command::new(BIN)
        .args(["--redis-url", url, "get", Q, id])
        .env_remove("DELAYQ_REDIS_URL")
        .env_remove("DELAYQ_NAMESPACE")
        .output()
        .unwrap();
    let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o.status.code().unwrap_or(-1), v)
}

/// The state of `group` in an answer (`None` when the group is not listed).
fn group_state(v: &Value, group: &str) -> Option<Value> {
    v["groups"]
        .as_array()?
        .iter()
        .find(|g| g["group"] == group)
        .cloned()
}

/// Polls the lookup until `cond` holds; returns that answer.
async fn await_answer(
    router: &axum::Router,
    id: &str,
    what: &str,
    cond: impl Fn(&Value) -> bool,
) -> Value {
    let found = Arc::new(std::sync::Mutex::new(Value::Null));
    wait_for(what, WAIT, || {
        let (r, found) = (router.clone(), found.clone());
        let cond = &cond;
        async move {
            let (st, v) = lookup(&r, id).await;
            let ok = st == StatusCode::OK && cond(&v);
            *found.lock().unwrap() = v;
            ok
        }
    })
    .await;
    found.lock().unwrap().clone()
}

fn worker_opts() -> WorkerOptions {
    WorkerOptions::default()
        .block(Duration::from_millis(50))
        .reclaim_every(Duration::from_millis(50))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_is_followed_from_scheduled_to_done_in_every_group() {
    let (server, client) = start().await;
    let router = app(AppState::new(client.clone(), vec![]));
    client
        .schedule(Q, "o-1234", When::in_ms(400), json!({"amount_cents": 1999}))
        .await
        .unwrap();

    // Scheduled: due time and payload, no group yet.
    let (st, v) = lookup(&router, "o-1234").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["state"], "scheduled");
    assert_eq!(v["payload"], json!({"amount_cents": 1999}));
    assert_eq!(
        (v["dispatched_at_ms"].clone(), v["entry_id"].clone()),
        (Value::Null, Value::Null)
    );
    assert_eq!(v["groups"], json!([]));
    let due = v["due_at_ms"].as_i64().unwrap();
    let (code, cli) = cli_get(&server.url(), "o-1234");
    assert_eq!((code, cli), (0, v.clone()));

    // Two groups: "close" handles it (held until released), "notify" has not read yet.
    let release = Arc::new(Semaphore::new(0));
    let r2 = release.clone();
    let stop = CancellationToken::new();
    let close = Worker::new(
        &client,
        Q,
        "close",
        move |_d: Delivery| {
            let r = r2.clone();
            async move {
                let _ = r.acquire().await.unwrap();
                Ok(())
            }
        },
        worker_opts(),
    )
    .unwrap();
    close.ensure_groups().await.unwrap();
    let notify = Worker::new(
        &client,
        Q,
        "notify",
        |_d: Delivery| async { Ok(()) },
        worker_opts(),
    )
    .unwrap();
    notify.ensure_groups().await.unwrap();
    let hc = tokio::spawn(close.run(stop.clone()));
    let hd = tokio::spawn(
        Dispatcher::new(&client, Q, DispatcherOptions::default())
            .unwrap()
            .run(stop.clone()),
    );

    let v = await_answer(&router, "o-1234", "close running, notify waiting", |v| {
        group_state(v, "close").is_some_and(|g| g["state"] == "running")
    })
    .await;
    assert_eq!(v["state"], "dispatched");
    assert_eq!(v["due_at_ms"], json!(due));
    assert_eq!(v["payload"], json!({"amount_cents": 1999}));
    let entry = v["entry_id"].as_str().unwrap().to_owned();
    let dispatched: i64 = entry.split('-').next().unwrap().parse().unwrap();
    assert_eq!(v["dispatched_at_ms"], json!(dispatched));
    assert!(
        dispatched >= due,
        "dispatched {dispatched} before due {due}"
    );
    assert_eq!(
        group_state(&v, "close").unwrap(),
        json!({"group": "close", "state": "running", "attempts": 1, "last_error": null, "next_attempt_at_ms": null})
    );
    assert_eq!(
        group_state(&v, "notify").unwrap(),
        json!({"group": "notify", "state": "waiting", "attempts": 0, "last_error": null, "next_attempt_at_ms": null})
    );
    let (code, cli) = cli_get(&server.url(), "o-1234");
    assert_eq!(code, 0);
    assert_eq!(
        (cli["state"].clone(), cli["entry_id"].clone()),
        (json!("dispatched"), json!(entry))
    );

    // "close" finishes; "notify" starts and finishes.
    release.add_permits(1);
    await_answer(&router, "o-1234", "close done", |v| {
        group_state(v, "close").is_some_and(|g| g["state"] == "done" && g["attempts"] == 1)
            && group_state(v, "notify").is_some_and(|g| g["state"] == "waiting")
    })
    .await;
    let hn = tokio::spawn(notify.run(stop.clone()));
    let v = await_answer(&router, "o-1234", "notify done", |v| {
        group_state(v, "notify").is_some_and(|g| g["state"] == "done")
    })
    .await;
    assert_eq!(group_state(&v, "close").unwrap()["state"], "done");
    let (code, cli) = cli_get(&server.url(), "o-1234");
    assert_eq!(code, 0);
    assert_eq!(cli["groups"], v["groups"]);

    // Never scheduled: 404 and exit 1; a cancelled order says so (issue 43; the reasons are
    // in cancel_history.rs).
    let (st, v) = lookup(&router, "o-never").await;
    assert_eq!(
        (st, v["error"]["code"].clone()),
        (StatusCode::NOT_FOUND, json!("not_found"))
    );
    assert_eq!(cli_get(&server.url(), "o-never").0, 1);
    client
        .schedule(Q, "o-paid", When::in_ms(60_000), json!(null))
        .await
        .unwrap();
    client.cancel(Q, "o-paid").await.unwrap();
    let (st, v) = lookup(&router, "o-paid").await;
    assert_eq!(
        (st, v["state"].clone()),
        (StatusCode::OK, json!("cancelled"))
    );
    assert_eq!(v["cancelled"]["reason"], "id");
    assert_eq!(cli_get(&server.url(), "o-paid").1["state"], "cancelled");
    stop.cancel();
    hc.await.unwrap().unwrap();
    hn.await.unwrap().unwrap();
    hd.await.unwrap();
}

/// A webhook partner that answers 500 to everything.
async fn failing_partner() -> (u16, tokio::task::JoinHandle<()>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(|| async { StatusCode::INTERNAL_SERVER_ERROR }),
    );
    (
        port,
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_webhook_fails_shows_retrying_then_dead() {
    let (_server, client) = start().await;
    let router = app(AppState::new(client.clone(), vec![]));
    let (port, partner) = failing_partner().await;
    let hook = Webhook::new(
        &format!("http://127.0.0.1:{port}/hook?token=SECRET-TOKEN"),
        &[],
        Duration::from_secs(5),
        client.clock().clone(),
    )
    .unwrap();
    let stop = CancellationToken::new();
    let w = Worker::new(
        &client,
        Q,
        "webhook",
        Builtin::Webhook(hook),
        worker_opts()
            .max_attempts(3)
            .backoff(Backoff::Fixed(Duration::from_millis(700))),
    )
    .unwrap();
    w.ensure_groups().await.unwrap();
    let ok = Worker::new(
        &client,
        Q,
        "notify",
        |_d: Delivery| async { Ok(()) },
        worker_opts(),
    )
    .unwrap();
    ok.ensure_groups().await.unwrap();
    let hw = tokio::spawn(w.run(stop.clone()));
    let ho = tokio::spawn(ok.run(stop.clone()));
    client
        .schedule(Q, "o-500", When::in_ms(0), json!({"n": 1}))
        .await
        .unwrap();
    let hd = tokio::spawn(
        Dispatcher::new(&client, Q, DispatcherOptions::default())
            .unwrap()
            .run(stop.clone()),
    );

    // Two groups in different states at once: notify done, webhook retrying.
    let v = await_answer(&router, "o-500", "webhook retrying after attempt 1", |v| {
        group_state(v, "webhook").is_some_and(|g| g["state"] == "retrying" && g["attempts"] == 1)
            && group_state(v, "notify").is_some_and(|g| g["state"] == "done")
    })
    .await;
    let g = group_state(&v, "webhook").unwrap();
    let err = g["last_error"].as_str().unwrap();
    assert!(err.contains("500"), "{err}");
    assert!(!v.to_string().contains("SECRET-TOKEN"), "{v}");
    let next = g["next_attempt_at_ms"].as_i64().unwrap();
    assert!(next > v["dispatched_at_ms"].as_i64().unwrap(), "{v}");

    let v = await_answer(&router, "o-500", "webhook retrying after attempt 2", |v| {
        group_state(v, "webhook").is_some_and(|g| g["state"] == "retrying" && g["attempts"] == 2)
    })
    .await;
    assert!(
        group_state(&v, "webhook").unwrap()["last_error"]
            .as_str()
            .unwrap()
            .contains("500")
    );

    let v = await_answer(&router, "o-500", "webhook dead", |v| {
        group_state(v, "webhook").is_some_and(|g| g["state"] == "dead")
    })
    .await;
    let g = group_state(&v, "webhook").unwrap();
    assert_eq!(g["attempts"], 3);
    assert!(g["last_error"].as_str().unwrap().contains("500"), "{g}");
    assert_eq!(g["next_attempt_at_ms"], Value::Null);
    assert!(!v.to_string().contains("SECRET-TOKEN"), "{v}");
    assert_eq!(group_state(&v, "notify").unwrap()["state"], "done");
    stop.cancel();
    hw.await.unwrap().unwrap();
    ho.await.unwrap().unwrap();
    hd.await.unwrap();
    partner.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_history_retention_an_order_answers_not_found() {
    let (server, client) = start().await;
    client
        .admin()
        .set_history_retention(Q, Duration::from_secs(2))
        .await
        .unwrap();
    let router = app(AppState::new(client.clone(), vec![]));
    let stop = CancellationToken::new();
    let w = Worker::new(
        &client,
        Q,
        "close",
        |_d: Delivery| async { Ok(()) },
        worker_opts(),
    )
    .unwrap();
    w.ensure_groups().await.unwrap();
    let hw = tokio::spawn(w.run(stop.clone()));
    let hd = tokio::spawn(
        Dispatcher::new(&client, Q, DispatcherOptions::default())
            .unwrap()
            .run(stop.clone()),
    );
    client
        .schedule(Q, "o-old", When::in_ms(0), json!(1))
        .await
        .unwrap();
    await_answer(&router, "o-old", "done", |v| {
        group_state(v, "close").is_some_and(|g| g["state"] == "done")
    })
    .await;
    let done_at = client.now_ms();
    wait_for("the history to expire", WAIT, || {
        let r = router.clone();
        async move { lookup(&r, "o-old").await.0 == StatusCode::NOT_FOUND }
    })
    .await;
    // Not before the retention (2 s after dispatch).
    assert!(client.now_ms() - done_at >= 1_000, "expired too early");
    assert_eq!(cli_get(&server.url(), "o-old").0, 1);
    stop.cancel();
    hw.await.unwrap().unwrap();
    hd.await.unwrap();
}

#[tokio::test]
async fn history_off_answers_only_scheduled_orders() {
    let (_server, client) = start().await;
    client
        .admin()
        .set_history_retention(Q, Duration::ZERO)
        .await
        .unwrap();
    client
        .schedule(Q, "o-x", When::in_ms(0), json!(1))
        .await
        .unwrap();
    assert!(client.admin().history(Q, "o-x").await.unwrap().is_some());
    Dispatcher::new(&client, Q, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
    assert!(client.admin().history(Q, "o-x").await.unwrap().is_none());
    // No history bucket was written.
    let keys: Vec<String> = support::raw(&client, &["KEYS", "*history*"]).await;
    assert!(keys.is_empty(), "{keys:?}");
    assert!(
        client
            .admin()
            .set_history_retention(Q, Duration::from_millis(10))
            .await
            .is_err(),
        "a retention below one second is refused"
    );
    let info = client.admin().queue_info(Q).await.unwrap().unwrap();
    assert_eq!(info.history_retention_ms, 0);
}

/// A replay of group A's dead letter moves only A to the new entry: group B, still retrying
/// the original delivery, keeps reporting it (it used to read `done, attempts 1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_for_one_group_leaves_the_other_groups_on_their_own_delivery() {
    let (_server, client) = start().await;
    let router = app(AppState::new(client.clone(), vec![]));
    let stop = CancellationToken::new();
    let a_fails = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flag = a_fails.clone();
    let a = Worker::new(
        &client,
        Q,
        "a",
        move |_d: Delivery| {
            let fail = flag.load(std::sync::atomic::Ordering::SeqCst);
            async move {
                if fail {
                    Err(delayq::HandlerError::permanent("partner refused"))
                } else {
                    Ok(())
                }
            }
        },
        worker_opts().max_attempts(1),
    )
    .unwrap();
    let b = Worker::new(
        &client,
        Q,
        "b",
        |_d: Delivery| async { Err(delayq::HandlerError::retry("erp down")) },
        worker_opts().backoff(Backoff::Fixed(Duration::from_secs(3600))),
    )
    .unwrap();
    a.ensure_groups().await.unwrap();
    b.ensure_groups().await.unwrap();
    let ha = tokio::spawn(a.run(stop.clone()));
    let hb = tokio::spawn(b.run(stop.clone()));
    let hd = tokio::spawn(
        Dispatcher::new(&client, Q, DispatcherOptions::default())
            .unwrap()
            .run(stop.clone()),
    );
    client
        .schedule(Q, "o-1", When::in_ms(0), json!({"n": 1}))
        .await
        .unwrap();
    await_answer(&router, "o-1", "a dead, b retrying", |v| {
        group_state(v, "a").is_some_and(|g| g["state"] == "dead")
            && group_state(v, "b").is_some_and(|g| g["state"] == "retrying")
    })
    .await;
    a_fails.store(false, std::sync::atomic::Ordering::SeqCst);
    let replayed = client
        .admin()
        .dead_replay(Q, Some("a"), &delayq::Selection::All)
        .await
        .unwrap();
    assert_eq!(replayed, 1);
    let v = await_answer(&router, "o-1", "a done after the replay", |v| {
        group_state(v, "a").is_some_and(|g| g["state"] == "done")
    })
    .await;
    let b_state = group_state(&v, "b").unwrap();
    assert_eq!(b_state["state"], json!("retrying"), "{v}");
    assert_eq!(b_state["attempts"], json!(1), "{v}");
    assert_eq!(b_state["last_error"], json!("erp down"), "{v}");
    stop.cancel();
    ha.await.unwrap().unwrap();
    hb.await.unwrap().unwrap();
    hd.await.unwrap();
}

/// Changing the retention keeps every record in reach (the bucket width no longer follows
/// it), so lookups answer and a reconciliation run adds nothing for orders on their way.
#[tokio::test]
async fn a_retention_change_hides_no_record_and_reconciliation_adds_nothing() {
    let (_server, client) = start().await;
    client
        .admin()
        .set_history_retention(Q, Duration::from_secs(24 * 3600))
        .await
        .unwrap();
    let router = app(AppState::new(client.clone(), vec![]));
    // The close group exists but no worker runs: the orders wait in the stream.
    Worker::new(
        &client,
        Q,
        "close",
        |_d: Delivery| async { Ok(()) },
        worker_opts(),
    )
    .unwrap()
    .ensure_groups()
    .await
    .unwrap();
    let orders: Vec<delayq::NewOrder> = (0..10)
        .map(|i| delayq::NewOrder::new(format!("o-{i}"), When::in_ms(0), json!({"i": i})))
        .collect();
    client
        .schedule_many(Q, &orders, delayq::Mode::Upsert)
        .await
        .unwrap();
    Dispatcher::new(&client, Q, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
    client
        .admin()
        .set_history_retention(Q, Duration::from_secs(12 * 3600))
        .await
        .unwrap();
    for i in 0..10 {
        let (st, v) = lookup(&router, &format!("o-{i}")).await;
        assert_eq!(st, StatusCode::OK, "o-{i}: {v}");
        assert_eq!(group_state(&v, "close").unwrap()["state"], json!("waiting"));
    }
    let sent = client.admin().redeliver(Q, "close", &orders).await.unwrap();
    assert!(
        sent.iter()
            .all(|r| *r == delayq::engine::admin::history::Redelivered::InFlight),
        "{sent:?}"
    );
    let len: i64 = support::raw(&client, &["XLEN", "{dq:order-close:0}:stream"]).await;
    assert_eq!(len, 10, "nothing appended");
}

/// Issue 39 item 6: at the longest retention (90 days: 2,162 history buckets per shard),
/// with history present, neither a reconciliation page (`redeliver` of 500 orders, most
/// of them never dispatched, so no bucket holds them) nor a message lookup reads every
/// bucket of the retention: the scripts read a handful of located buckets, a few commands
/// per order (counted with `INFO commandstats`; no timing is asserted).
#[tokio::test]
async fn lookups_at_the_longest_retention_never_block_redis() {
    let (_s, client) = start().await;
    let admin = client.admin();
    admin
        .set_history_retention(Q, delayq::engine::history::MAX_HISTORY_RETENTION)
        .await
        .unwrap();
    let groups = ["close", "notify", "audit", "billing", "search", "mail"];
    for g in groups {
        Worker::new(
            &client,
            Q,
            g,
            |_d: Delivery| async { Ok(()) },
            WorkerOptions::default(),
        )
        .unwrap()
        .ensure_groups()
        .await
        .unwrap();
    }
    for i in 0..50 {
        client
            .schedule(Q, &format!("d{i}"), Duration::ZERO, json!({"i": i}))
            .await
            .unwrap();
    }
    let moved = Dispatcher::new(&client, Q, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap()
        .moved;
    assert_eq!(moved, 50);
    // Markers in an old bucket: history present across the retention.
    let _: () = support::raw(
        &client,
        &[
            "HSET",
            "{dq:order-close:0}:history:3600000:1",
            "old",
            "1-0:1",
        ],
    )
    .await;

    let before = all_command_calls(&client).await;
    let h = admin.history(Q, "d7").await.unwrap().unwrap();
    assert_eq!(h.groups.len(), groups.len(), "{h:?}");
    assert!(
        h.groups
            .iter()
            .all(|g| g.state == delayq::GroupState::Waiting),
        "{h:?}"
    );
    assert!(admin.history(Q, "never").await.unwrap().is_none());
    let orders: Vec<delayq::NewOrder> = (0..500)
        .map(|i| {
            let id = if i < 50 {
                format!("d{i}")
            } else {
                format!("lost{i}")
            };
            delayq::NewOrder::new(id, When::AtMs(client.now_ms()), json!({"reconciled": true}))
        })
        .collect();
    let out = admin.redeliver(Q, "close", &orders).await.unwrap();
    use delayq::engine::admin::history::Redelivered;
    assert!(
        out[..50].iter().all(|o| *o == Redelivered::InFlight),
        "{out:?}"
    );
    assert!(out[50..].iter().all(|o| *o == Redelivered::Sent), "{out:?}");
    // Sent again: each is now on its way, found in the bucket of now.
    let again = admin.redeliver(Q, "close", &orders[50..]).await.unwrap();
    assert!(
        again.iter().all(|o| *o == Redelivered::InFlight),
        "{again:?}"
    );
    // Every command Redis ran for these lookups (inside the scripts too): 2 message lookups
    // and 950 orders redelivered. Reading every bucket of the retention would cost 2,162
    // bucket reads per order; a located lookup costs a few dozen (33 measured: mostly
    // `EXISTS` of the buckets near its due time, an `HGET`, a `ZSCORE`).
    let after = all_command_calls(&client).await;
    let ran: u64 = after
        .iter()
        .map(|(c, n)| n - before.get(c).copied().unwrap_or(0))
        .sum();
    eprintln!("commands for 952 lookups: {ran}");
    let looked_up = 2 + 500 + 450;
    assert!(
        ran < 100 * looked_up,
        "{ran} commands for {looked_up} lookups"
    );
}

/// Calls of every command Redis ran so far (inside scripts too), from `INFO commandstats`:
/// (command, calls).
async fn all_command_calls(client: &delayq::Client) -> std::collections::BTreeMap<String, u64> {
    let info: String = support::raw(client, &["INFO", "commandstats"]).await;
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (cmd, rest) = l.split_once(":calls=")?;
            Some((cmd.to_owned(), rest.split(',').next()?.parse().ok()?))
        })
        .collect()
}

/// The records in every history bucket of the retention of shard 0 (`HLEN` of each): what
/// the stats' `history` must equal.
async fn full_history_count(client: &delayq::Client) -> u64 {
    let h = delayq::engine::history::HISTORY_BUCKET_MS;
    let now = client.now_ms();
    let newest = now / h + 1;
    let oldest = (now - 90 * 24 * h) / h;
    let mut total = 0;
    for b in oldest..=newest {
        let n: u64 =
            support::raw(client, &["HLEN", &format!("{{dq:{Q}:0}}:history:{h}:{b}")]).await;
        total += n;
    }
    total
}

/// Issue 39 item 6 (stats part): at the longest retention (2,162 buckets per shard) the
/// `history` count of a queue's stats equals a full count of every bucket, including the
/// markers that a dead letter (`dead.lua`) and an ack after a retry (the ack pipeline) write
/// into **sealed** buckets 1,000 hours old (their entries' time), after the count's cache was
/// filled; and a refresh with the cache warm runs a handful of `HLEN`s, not one per bucket
/// (counted with `INFO commandstats`; the whole refresh's commands are printed with
/// `--nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_history_exactly_at_the_longest_retention() {
    let (_s, client) = start().await;
    let admin = client.admin();
    admin
        .set_history_retention(Q, delayq::engine::history::MAX_HISTORY_RETENTION)
        .await
        .unwrap();
    // Two entries dispatched 1,000 hours ago (stream ids of that time, written first so the
    // stream takes them): settling them writes markers into a sealed bucket.
    let h = delayq::engine::history::HISTORY_BUCKET_MS;
    let old = client.now_ms() - 1000 * h;
    let stream = format!("{{dq:{Q}:0}}:stream");
    for (n, id) in ["old-dead", "old-retried"].iter().enumerate() {
        let eid = format!("{old}-{n}");
        let due = old.to_string();
        let _: String = support::raw(
            &client,
            &[
                "XADD", &stream, &eid, "id", id, "due_ms", &due, "data", "{}",
            ],
        )
        .await;
    }
    for i in 0..50 {
        client
            .schedule(Q, &format!("s{i}"), Duration::ZERO, json!({"i": i}))
            .await
            .unwrap();
    }
    let moved = Dispatcher::new(&client, Q, DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap()
        .moved;
    assert_eq!(moved, 50);
    // The cache is filled here, before the markers exist.
    assert_eq!(admin.stats(Q).await.unwrap().history, 50);
    assert_eq!(full_history_count(&client).await, 50);

    let w = Worker::new(
        &client,
        Q,
        "close",
        |d: Delivery| async move {
            match (d.id.as_str(), d.attempt) {
                ("old-dead", _) | ("old-retried", 1) => Err(delayq::HandlerError::retry("not yet")),
                _ => Ok(()),
            }
        },
        worker_opts()
            .max_attempts(2)
            .backoff(Backoff::Fixed(Duration::from_millis(50))),
    )
    .unwrap();
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    let marked = format!("{{dq:{Q}:0}}:history:{h}:{}", old / h);
    wait_for("both markers in the sealed bucket", WAIT, || async {
        let n: u64 = support::raw(&client, &["HLEN", &marked]).await;
        n == 2
    })
    .await;
    stop.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(full_history_count(&client).await, 52);
    assert_eq!(admin.stats(Q).await.unwrap().history, 52);

    let before = all_command_calls(&client).await;
    assert_eq!(admin.stats(Q).await.unwrap().history, 52);
    let after = all_command_calls(&client).await;
    let mut total = 0;
    let mut per: Vec<String> = Vec::new();
    for (cmd, n) in &after {
        // The INFO of the first snapshot is counted in the second.
        let d = n - before.get(cmd).copied().unwrap_or(0) - u64::from(cmd == "info");
        if d > 0 {
            total += d;
            per.push(format!("{cmd}={d}"));
        }
    }
    let hlen: u64 =
        after.get("hlen").copied().unwrap_or(0) - before.get("hlen").copied().unwrap_or(0);
    println!(
        "one stats refresh of one queue at 90-day retention: {total} Redis commands ({}); HLEN: {hlen}",
        per.join(" ")
    );
    // Three open buckets, the touched bucket (within the log's margin) and the buckets
    // re-read in turn: a handful, not 2,162.
    let bound = 3 + 1 + delayq::engine::history_counts::VERIFY_PER_CALL as u64;
    assert!(
        hlen <= bound,
        "{hlen} HLEN in one refresh (at most {bound})"
    );
    assert!(total < 60, "{total} commands: {}", per.join(" "));
}
