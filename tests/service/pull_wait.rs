//! Long polls of pull consumers against a real `delayq serve`: an order scheduled while a
//! receive waits is returned to it, SIGTERM answers a waiting receive at once, and 200
//! waiting receives leave the API answering.
#![allow(clippy::unwrap_used)]

use crate::http::TOKEN;
use crate::support::serve::Serve;
use crate::support::wait_for;
use delayq::LocalRedis;
use serde_json::{Value, json};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);
const RECEIVE: &str = "/v1/queues/order-close/groups/pullers:receive";

pub(crate) fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// `delayq serve` with a token, the queues `order-close` and `other`, and `grace`.
async fn serve(redis: &LocalRedis, grace: &str) -> Serve {
    let mut s = Serve::start(
        &format!(
            r#"
redis_url = "{}"
shutdown_grace = "{grace}"
queues = ["order-close", "other"]
[http]
listen = "127.0.0.1:{{port}}"
tokens = ["{TOKEN}"]
"#,
            redis.url()
        ),
        None,
    );
    s.wait_ready(WAIT).await;
    s
}

/// `POST` of `body` to `path` with the token: status and JSON body.
pub(crate) async fn post(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let r = http
        .post(format!("{base}{path}"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    (
        st,
        serde_json::from_str(&r.text().await.unwrap()).unwrap_or(Value::Null),
    )
}

/// Waits until `/metrics` shows `n` receives waiting.
async fn waiting(http: &reqwest::Client, base: &str, n: usize) {
    let line = format!("delayq_pull_waiting {n}\n");
    wait_for(&format!("{n} waiting receives"), WAIT, || {
        let (http, line) = (http.clone(), line.clone());
        let url = format!("{base}/metrics");
        async move {
            let t = http.get(url).send().await.unwrap().text().await.unwrap();
            t.contains(&line)
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_scheduled_during_a_long_poll_is_returned_to_it() {
    let redis = LocalRedis::start().unwrap();
    let serve = serve(&redis, "2s").await;
    let (h, base) = (http(), serve.base());
    let poll = {
        let (h, base) = (h.clone(), base.clone());
        tokio::spawn(
            async move { post(&h, &base, RECEIVE, json!({"max": 10, "wait_ms": 10000})).await },
        )
    };
    // The receive found nothing and waits; then the order is scheduled, due a moment later.
    waiting(&h, &base, 1).await;
    assert!(!poll.is_finished());
    let r = h
        .put(format!("{base}/v1/queues/order-close/messages/late-1"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(json!({"delay_ms": 300, "payload": {"order": 1}}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let (st, v) = poll.await.unwrap();
    assert_eq!(st, 200, "{v}");
    let ds = v["deliveries"].as_array().unwrap();
    assert_eq!(ds.len(), 1, "{v}");
    assert_eq!(ds[0]["id"], "late-1");
    assert_eq!(ds[0]["payload"], json!({"order": 1}));
    waiting(&h, &base, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_a_waiting_long_poll_at_once() {
    let redis = LocalRedis::start().unwrap();
    // A grace longer than the wait: only the poll's own answer to the shutdown ends it
    // within the test's deadline.
    let mut serve = serve(&redis, "60s").await;
    let (h, base) = (http(), serve.base());
    let poll = {
        let (h, base) = (h.clone(), base.clone());
        tokio::spawn(
            async move { post(&h, &base, RECEIVE, json!({"max": 1, "wait_ms": 20000})).await },
        )
    };
    waiting(&h, &base, 1).await;
    serve.sigterm();
    // Far less than the 20 s wait: answered by the shutdown, not by the wait's end.
    let (st, v) = tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .expect("the waiting receive was answered at shutdown")
        .unwrap();
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["deliveries"], json!([]));
    assert_eq!(serve.wait_exit(Duration::from_secs(10)).await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_waiting_long_polls_leave_puts_answering() {
    let redis = LocalRedis::start().unwrap();
    let mut serve = serve(&redis, "60s").await;
    let (h, base) = (http(), serve.base());
    let polls: Vec<_> = (0..200)
        .map(|_| {
            let (h, base) = (h.clone(), base.clone());
            tokio::spawn(async move {
                post(&h, &base, RECEIVE, json!({"max": 1, "wait_ms": 20000})).await
            })
        })
        .collect();
    waiting(&h, &base, 200).await;
    // A schedule (into another queue: nothing for the pollers) answers while they all wait.
    let mut took = Vec::new();
    for i in 0..20 {
        let t = std::time::Instant::now();
        let r = h
            .put(format!("{base}/v1/queues/other/messages/o{i}"))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(json!({"delay_ms": 60000, "payload": {"n": i}}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        took.push(t.elapsed());
    }
    took.sort();
    eprintln!(
        "PUT under 200 waiting long polls: p50 {:?}, max {:?} (20 calls)",
        took[took.len() / 2],
        took[took.len() - 1]
    );
    assert!(polls.iter().all(|p| !p.is_finished()), "a poll ended early");
    // Shutdown answers them all.
    serve.sigterm();
    for p in polls {
        let (st, v) = tokio::time::timeout(Duration::from_secs(10), p)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((st, &v["deliveries"]), (200, &json!([])), "{v}");
    }
    assert_eq!(serve.wait_exit(Duration::from_secs(10)).await, Some(0));
}
