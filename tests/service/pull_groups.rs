//! Pull groups declared in serve's configuration (`[[handlers]] kind = "pull"`): listed with
//! their kind before any receive, their worker options applied to HTTP pulls, pulls of a
//! group that a handler consumes refused, and, once the configuration declares pull groups,
//! pulls of any group it does not declare refused.
#![allow(clippy::unwrap_used)]

use crate::http::TOKEN;
use crate::pull_wait::{http, post};
use crate::support::serve::Serve;
use delayq::LocalRedis;
use serde_json::{Value, json};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_pull_group_is_listed_uses_its_options_and_a_handlers_group_is_refused() {
    let redis = LocalRedis::start().unwrap();
    let mut serve = Serve::start(
        &format!(
            r#"
redis_url = "{}"
shutdown_grace = "2s"
[http]
listen = "127.0.0.1:{{port}}"
tokens = ["{TOKEN}"]
[[handlers]]
queue = "order-close"
group = "pullers"
kind = "pull"
max_attempts = 2
backoff = "fixed:100ms"
lease = "1s"
[[handlers]]
queue = "order-close"
group = "hook"
kind = "webhook"
url = "http://127.0.0.1:9/ok"
"#,
            redis.url()
        ),
        None,
    );
    serve.wait_ready(WAIT).await;
    let (h, base) = (http(), serve.base());
    // Listed with their kinds before anyone pulled.
    let stats: Value = serde_json::from_str(
        &h.get(format!("{base}/v1/queues/order-close/stats"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    )
    .unwrap();
    let groups = stats["queues"][0]["groups"].as_array().unwrap();
    let kind_of = |g: &str| {
        groups
            .iter()
            .find(|x| x["group"] == g)
            .map(|x| x["kind"].clone())
    };
    assert_eq!(kind_of("pullers"), Some(json!("pull")), "{stats}");
    assert_eq!(kind_of("hook"), Some(json!("webhook")), "{stats}");

    // The webhook's group is not for pulls.
    let (st, v) = post(
        &h,
        &base,
        "/v1/queues/order-close/groups/hook:receive",
        json!({"max": 1}),
    )
    .await;
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (409, Some("wrong_group_kind")),
        "{v}"
    );

    // A group this configuration does not declare (a typo of "pullers"): refused, and no
    // consumer group is made for it.
    for action in ["receive", "ack"] {
        let body = if action == "receive" {
            json!({"max": 1})
        } else {
            json!({"receipts": ["x"]})
        };
        let (st, v) = post(
            &h,
            &base,
            &format!("/v1/queues/order-close/groups/puller:{action}"),
            body,
        )
        .await;
        assert_eq!(
            (st, v["error"]["code"].as_str()),
            (404, Some("group_not_found")),
            "{v}"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("not declared for pulls")),
            "{v}"
        );
    }
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let groups: redis::Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg("{dq:order-close:0}:stream")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        !format!("{groups:?}").contains("\"puller\""),
        "no group made for the undeclared name: {groups:?}"
    );

    let r = h
        .put(format!("{base}/v1/queues/order-close/messages/o1"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(json!({"delay_ms": 0, "payload": {"n": 1}}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let receive = "/v1/queues/order-close/groups/pullers:receive";
    // No lease asked: the group's (1 s) applies, so an unsettled delivery comes back within
    // a 20 s wait (the default 30 s lease would not).
    let (st, first) = post(&h, &base, receive, json!({"max": 1, "wait_ms": 20000})).await;
    assert_eq!(st, 200, "{first}");
    assert_eq!(first["deliveries"][0]["attempt"], 1, "{first}");
    let (st, second) = post(&h, &base, receive, json!({"max": 1, "wait_ms": 20000})).await;
    assert_eq!(st, 200, "{second}");
    let d = &second["deliveries"][0];
    assert_eq!(
        (d["id"].as_str(), d["attempt"].as_u64()),
        (Some("o1"), Some(2)),
        "{second}"
    );
    // max_attempts = 2: a nack of the second attempt dead-letters it (the default 10 would
    // retry).
    let (st, v) = post(
        &h,
        &base,
        "/v1/queues/order-close/groups/pullers:nack",
        json!({"receipt": d["receipt"], "error": "shop says no"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let dead: Value = serde_json::from_str(
        &h.get(format!("{base}/v1/queues/order-close/dead?group=pullers"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    )
    .unwrap();
    let text = dead.to_string();
    assert!(
        text.contains("o1") && text.contains("shop says no"),
        "{dead}"
    );
}
