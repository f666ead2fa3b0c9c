//! Issue 44's dedup window and debounce over HTTP (a real `delayq serve`, restarted) and the
//! command line: duplicate answers, `repeat`, the debounce's cap shown by `get`, and
//! refusals that name the field and write nothing.
#![allow(clippy::unwrap_used)]

use crate::support;

use serde_json::{Value, json};
use std::process::Command;
use std::time::Duration;
use support::serve::Serve;
use support::{snapshot, wait_for};

const BIN: &str = env!("CARGO_BIN_EXE_delayq");
const WAIT: Duration = Duration::from_secs(60);

fn config(redis: &str) -> String {
    format!(
        "redis_url = \"{redis}\"\nqueues = [\"order-close\"]\n[http]\nlisten = \"127.0.0.1:{{port}}\"\n"
    )
}

async fn put(http: &reqwest::Client, url: &str, body: Value) -> (u16, Value) {
    let r = http
        .put(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (
        status,
        serde_json::from_str(&r.text().await.unwrap()).unwrap_or(Value::Null),
    )
}

async fn stop(mut serve: Serve) {
    assert!(
        Command::new("kill")
            .args(["-TERM", &serve.child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    assert!(serve.child.wait().unwrap().success(), "{}", serve.log());
}

async fn stream_length(client: &delayq::Client) -> u64 {
    client
        .admin()
        .stats("order-close")
        .await
        .unwrap()
        .stream_length
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedup_window_answers_duplicate_across_a_serve_restart_until_repeat() {
    let redis = delayq::LocalRedis::start().unwrap();
    let client = delayq::Client::connect(&redis.url()).await.unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let mut serve = Serve::start(&config(&redis.url()), None);
    serve.wait_ready(WAIT).await;
    let queue = format!("{}/v1/queues/order-close", serve.base());
    let (st, _) = put(&http, &queue, json!({"dedup_window": "1h"})).await;
    assert_eq!(st, 200);
    let msg = format!("{queue}/messages/o1");
    let (st, v) = put(&http, &msg, json!({"delay_ms": 0})).await;
    assert_eq!((st, v["outcome"].as_str()), (201, Some("created")), "{v}");
    let c = client.clone();
    wait_for("o1 dispatched", WAIT, move || {
        let c = c.clone();
        async move { stream_length(&c).await == 1 }
    })
    .await;

    // The same PUT, and with if_absent: 200 duplicate with the dispatch time, nothing
    // written (so nothing can be dispatched again).
    let before = snapshot(&client).await;
    let (st, v) = put(&http, &msg, json!({"delay_ms": 0})).await;
    assert_eq!((st, v["outcome"].as_str()), (200, Some("duplicate")), "{v}");
    let at = v["dispatched_at_ms"].as_i64().unwrap();
    let (st, v) = put(&http, &msg, json!({"delay_ms": 0, "if_absent": true})).await;
    assert_eq!((st, v["outcome"].as_str()), (200, Some("duplicate")), "{v}");
    assert_eq!(
        snapshot(&client).await,
        before,
        "a duplicate wrote something"
    );
    let info = client
        .admin()
        .queue_info("order-close")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.dedup_window_ms, 3_600_000);

    // A restarted serve answers the same: the window lives in Redis.
    stop(serve).await;
    let mut serve = Serve::start(&config(&redis.url()), None);
    serve.wait_ready(WAIT).await;
    let msg = format!("{}/v1/queues/order-close/messages/o1", serve.base());
    let (st, v) = put(&http, &msg, json!({"delay_ms": 0})).await;
    assert_eq!(
        (st, v["outcome"].as_str(), v["dispatched_at_ms"].as_i64()),
        (200, Some("duplicate"), Some(at)),
        "{v}"
    );
    // Asked for explicitly, it is scheduled and dispatched again.
    let (st, v) = put(&http, &msg, json!({"delay_ms": 0, "repeat": true})).await;
    assert_eq!((st, v["outcome"].as_str()), (201, Some("created")), "{v}");
    let c = client.clone();
    wait_for("o1 dispatched again", WAIT, move || {
        let c = c.clone();
        async move { stream_length(&c).await == 2 }
    })
    .await;
    stop(serve).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debounce_over_http_is_capped_shown_and_checked() {
    let redis = delayq::LocalRedis::start().unwrap();
    let client = delayq::Client::connect(&redis.url()).await.unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let mut serve = Serve::start(&config(&redis.url()), None);
    serve.wait_ready(WAIT).await;
    let msg = format!("{}/v1/queues/order-close/messages/cart", serve.base());
    // delay = max_wait: every later call is capped at the first call's due time.
    let deb = json!({"debounce": {"delay_ms": 3_600_000, "max_wait_ms": 3_600_000}, "payload": 1});
    let (st, first) = put(&http, &msg, deb.clone()).await;
    assert_eq!(
        (st, first["outcome"].as_str()),
        (201, Some("created")),
        "{first}"
    );
    let mut again = deb.clone();
    again["payload"] = json!(2);
    let (st, v) = put(&http, &msg, again).await;
    assert_eq!((st, v["outcome"].as_str()), (200, Some("updated")), "{v}");
    assert_eq!(v["due_at_ms"], first["due_at_ms"], "not capped: {v}");
    let got: Value =
        serde_json::from_str(&http.get(&msg).send().await.unwrap().text().await.unwrap()).unwrap();
    assert_eq!(got["payload"], json!(2), "{got}");
    assert_eq!(got["debounce"]["max_due_ms"], first["due_at_ms"], "{got}");
    let first_call = got["debounce"]["first_call_ms"].as_i64().unwrap();
    assert_eq!(
        first_call + 3_600_000,
        first["due_at_ms"].as_i64().unwrap(),
        "{got}"
    );

    // Refusals name the field and write nothing.
    let before = snapshot(&client).await;
    let d = |delay: i64, max: i64| json!({"delay_ms": delay, "max_wait_ms": max});
    for (body, field) in [
        (
            json!({"debounce": d(500, 2000), "if_absent": true}),
            "debounce",
        ),
        (json!({"debounce": d(500, 2000), "delay_ms": 5}), "debounce"),
        (json!({"debounce": d(3000, 2000)}), "debounce.max_wait"),
        (json!({"debounce": d(0, 2000)}), "debounce.delay"),
        (json!({"debounce": d(-1, 2000)}), "debounce.delay"),
        (
            json!({"debounce": d(500, 315_619_200_001_i64)}),
            "debounce.max_wait",
        ),
    ] {
        let (st, v) = put(&http, &msg, body.clone()).await;
        assert_eq!(st, 400, "{body}: {v}");
        assert_eq!(v["error"]["code"], "invalid_option", "{body}: {v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(
            m.contains(&format!("invalid option {field}:")),
            "{body}: {m}"
        );
    }
    let queue = format!("{}/v1/queues/order-close", serve.base());
    for w in ["-1h", "3654d", "soon"] {
        let (st, v) = put(&http, &queue, json!({"dedup_window": w})).await;
        assert_eq!(st, 400, "{w}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("dedup_window"),
            "{v}"
        );
    }
    assert_eq!(snapshot(&client).await, before);
    stop(serve).await;
}

fn run(url: &str, args: &[&str]) -> (i32, Value, String) {
    let o = Command::new(BIN)
        .arg("--redis-url")
        .arg(url)
        .args(args)
        .env_remove("DELAYQ_REDIS_URL")
        .env_remove("DELAYQ_NAMESPACE")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let v = serde_json::from_str(out.trim()).unwrap_or(Value::Null);
    (
        o.status.code().unwrap_or(-1),
        v,
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_command_line_sets_the_window_answers_duplicate_and_debounces() {
    let redis = delayq::LocalRedis::start().unwrap();
    let url = redis.url();
    let client = delayq::Client::connect(&url).await.unwrap();
    let (code, _, err) = run(&url, &["queue", "create", "dd", "--dedup-window", "3654d"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("dedup-window") || err.contains("dedup_window"),
        "{err}"
    );
    let (code, _, err) = run(&url, &["queue", "create", "dd", "--dedup-window", "1h"]);
    assert_eq!(code, 0, "{err}");
    let sched = |extra: &[&str]| {
        let mut a = vec!["schedule", "dd", "o1"];
        a.extend_from_slice(extra);
        run(&url, &a)
    };
    let (code, v, err) = sched(&["--in", "0s"]);
    assert_eq!((code, v["outcome"].as_str()), (0, Some("created")), "{err}");
    let moved = delayq::Dispatcher::new(&client, "dd", delayq::DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap()
        .moved;
    assert_eq!(moved, 1);
    for extra in [&["--in", "0s"][..], &["--in", "0s", "--if-absent"][..]] {
        let (code, v, err) = sched(extra);
        assert_eq!(
            (code, v["outcome"].as_str()),
            (0, Some("duplicate")),
            "{err}"
        );
        assert!(v["dispatched_at_ms"].as_i64().is_some(), "{v}");
    }
    let (code, v, err) = sched(&["--in", "0s", "--repeat"]);
    assert_eq!((code, v["outcome"].as_str()), (0, Some("created")), "{err}");

    // Debounce: the cap is kept and shown by get.
    let (code, v, err) = run(
        &url,
        &[
            "schedule",
            "dd",
            "cart",
            "--debounce",
            "1h",
            "--max-wait",
            "1h",
        ],
    );
    assert_eq!((code, v["outcome"].as_str()), (0, Some("created")), "{err}");
    let due = v["due_at_ms"].as_i64().unwrap();
    let (code, got, err) = run(&url, &["get", "dd", "cart"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(got["debounce"]["max_due_ms"].as_i64(), Some(due), "{got}");
    let before = snapshot(&client).await;
    for (args, field) in [
        (
            &["--debounce", "3s", "--max-wait", "2s"][..],
            "debounce.max_wait",
        ),
        (
            &["--debounce", "0s", "--max-wait", "2s"][..],
            "debounce.delay",
        ),
        (
            &["--debounce", "1s", "--max-wait", "2s", "--if-absent"][..],
            "if-absent",
        ),
        (&["--debounce", "1s"][..], "max-wait"),
        (
            &["--debounce", "1s", "--max-wait", "2s", "--in", "1s"][..],
            "--in",
        ),
    ] {
        let mut a = vec!["schedule", "dd", "cart"];
        a.extend_from_slice(args);
        let (code, _, err) = run(&url, &a);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(field), "{args:?}: {err}");
    }
    assert_eq!(snapshot(&client).await, before);
}
