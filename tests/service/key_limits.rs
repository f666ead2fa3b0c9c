//! Slots per order key through `delayq serve` (issue 42): two serve processes share a
//! webhook group's `key_concurrency`, checked from the receiver's own log; the group's keys
//! in use over HTTP, in the stats and on the command line, with bad input refused.
#![allow(clippy::unwrap_used)]

use crate::cli::run;
use crate::http::TOKEN;
use crate::support;

use delayq::{Client, ClientOptions, Mode, NewOrder, When};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::serve::Serve;
use support::wait_for;

const Q: &str = "order-close";
const WAIT: Duration = Duration::from_secs(120);

/// What the receiver saw: per key, requests in flight now and at most; each order's
/// deliveries.
#[derive(Default)]
struct Log {
    now: HashMap<String, usize>,
    most: HashMap<String, usize>,
    delivered: HashMap<String, usize>,
}

async fn receiver(log: Arc<Mutex<Log>>) -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: String| {
            let log = log.clone();
            async move {
                let v: Value = serde_json::from_str(&body).unwrap();
                let key = v["key"].as_str().unwrap_or_default().to_owned();
                {
                    let mut l = log.lock().unwrap();
                    let n = {
                        let n = l.now.entry(key.clone()).or_default();
                        *n += 1;
                        *n
                    };
                    let m = l.most.entry(key.clone()).or_default();
                    *m = (*m).max(n);
                }
                // The partner's work, so that requests overlap.
                tokio::time::sleep(Duration::from_millis(5)).await;
                let mut l = log.lock().unwrap();
                *l.now.entry(key).or_default() -= 1;
                *l.delivered
                    .entry(v["id"].as_str().unwrap().to_owned())
                    .or_default() += 1;
                axum::http::StatusCode::OK
            }
        }),
    );
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    port
}

fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

async fn get(serve: &Serve, path: &str) -> (u16, Value) {
    let r = http()
        .get(format!("{}{path}", serve.base()))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (st, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Two serves, four shards, `key_concurrency = 2` on a webhook group, 30 keys × 50 orders
/// due at once: the receiver never has more than two requests of one key at once, and
/// every order arrives once. Afterwards the group has no key in use (HTTP, stats, CLI);
/// bad input is refused naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_serves_share_a_groups_key_concurrency() {
    const KEYS: usize = 30;
    const PER_KEY: usize = 50;
    let redis = delayq::LocalRedis::start().unwrap();
    let log: Arc<Mutex<Log>> = Arc::default();
    let hook = receiver(log.clone()).await;
    let config = format!(
        r#"
redis_url = "{}"
namespace = "dq"
shards = 4
shutdown_grace = "2s"
[http]
listen = "127.0.0.1:{{port}}"
tokens = ["{TOKEN}"]
[[handlers]]
queue = "{Q}"
group = "notify"
kind = "webhook"
url = "http://127.0.0.1:{hook}/hook"
concurrency = 16
key_concurrency = 2
"#,
        redis.url()
    );
    let mut serves = [Serve::start(&config, None), Serve::start(&config, None)];
    for s in &mut serves {
        s.wait_ready(WAIT).await;
    }
    let client = Client::connect_with(
        &redis.url(),
        ClientOptions::default().namespace("dq").shards(4),
    )
    .await
    .unwrap();
    let due = client.now_ms();
    let orders: Vec<NewOrder> = (0..KEYS * PER_KEY)
        .map(|i| {
            NewOrder::new(format!("o-{i:05}"), When::at_ms(due), json!({"n": i}))
                .with_key(format!("merchant:{}", i % KEYS))
        })
        .collect();
    for chunk in orders.chunks(500) {
        client.schedule_many(Q, chunk, Mode::Upsert).await.unwrap();
    }
    let l2 = log.clone();
    wait_for("every order delivered", WAIT, move || {
        let n = l2.lock().unwrap().delivered.len();
        async move { n >= KEYS * PER_KEY }
    })
    .await;
    {
        let l = log.lock().unwrap();
        let over: Vec<_> = l.most.iter().filter(|(_, m)| **m > 2).collect();
        assert!(
            over.is_empty(),
            "keys with more than 2 requests at once: {over:?}"
        );
        assert_eq!(l.most.len(), KEYS, "every key delivered");
        let twice: Vec<_> = l.delivered.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    }
    // Drained: no key in use anywhere.
    let path = format!("/v1/queues/{Q}/groups/notify/keys");
    let s0 = &serves[0];
    wait_for("the keys given back", WAIT, || async {
        let (st, v) = get(s0, &path).await;
        st == 200 && v["active"] == 0 && v["keys"] == json!([])
    })
    .await;
    let (st, v) = get(s0, &format!("/v1/queues/{Q}/stats")).await;
    assert_eq!(st, 200, "{v}");
    let group = v["queues"][0]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["group"] == "notify")
        .unwrap();
    assert!(group.get("keys_active").is_none(), "{group}");
    let o = run(
        &redis.url(),
        &["--namespace", "dq", "group", "keys", Q, "notify"],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.json()["active"], 0, "{}", o.stdout);
    // Bad input.
    let (st, v) = get(s0, &format!("{path}?limit=1001")).await;
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("limit"),
        "{v}"
    );
    let (st, v) = get(s0, &format!("/v1/queues/{Q}/groups/nobody/keys")).await;
    assert_eq!(st, 404, "{v}");
    let o = run(
        &redis.url(),
        &[
            "--namespace",
            "dq",
            "group",
            "keys",
            Q,
            "notify",
            "--limit",
            "0",
        ],
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("limit"), "{}", o.stderr);
    let o = run(
        &redis.url(),
        &["--namespace", "dq", "group", "keys", Q, "nobody"],
    );
    assert_eq!(o.code, 1, "{} {}", o.stdout, o.stderr);
    for s in &serves {
        s.sigterm();
    }
}
