//! Consumer-only tokens (`[[http.consumer_tokens]]`): receive, ack, nack and extend on their
//! own groups; 403 on schedules, administration and other groups; never shown.
#![allow(clippy::unwrap_used)]

use crate::http::{TOKEN, call, code};
use crate::support;

use axum::http::StatusCode;
use delayq::service::config::{env, load_str};
use delayq::service::http::{AppState, ConsumerToken, app};
use delayq::{Client, Dispatcher, DispatcherOptions, When};
use serde_json::json;
use support::start;

const CONSUMER: &str = "consumer-token-1";

async fn due_now(client: &Client, id: &str) {
    client
        .schedule("order-close", id, When::in_ms(0), json!({"n": 1}))
        .await
        .unwrap();
    Dispatcher::new(client, "order-close", DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_consumer_token_pulls_its_group_and_is_refused_everything_else() {
    let (_s, client) = start().await;
    let ct = ConsumerToken::new(CONSUMER, &["order-close/close".into()]).unwrap();
    let r = app(AppState::new(client.clone(), vec![TOKEN.into()]).with_consumer_tokens(vec![ct]));
    let base = "/v1/queues/order-close/groups/close";
    let t = Some(CONSUMER);
    // Join, then receive and ack with the consumer token.
    let (st, v) = call(&r, "POST", &format!("{base}:receive"), Some(json!({})), t).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    due_now(&client, "o1").await;
    let (st, v) = call(
        &r,
        "POST",
        &format!("{base}:receive"),
        Some(json!({"max": 5})),
        t,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let d = v["deliveries"][0].clone();
    assert_eq!(d["id"], "o1", "{v}");
    let (st, v) = call(
        &r,
        "POST",
        &format!("{base}:extend"),
        Some(json!({"receipts": [d["receipt"]], "lease_ms": 60000})),
        t,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let receipt = v["results"][0]["receipt"].clone();
    let (st, v) = call(
        &r,
        "POST",
        &format!("{base}:ack"),
        Some(json!({"receipts": [receipt]})),
        t,
    )
    .await;
    assert_eq!(
        (st, &v["results"][0]["status"]),
        (StatusCode::OK, &json!("acked")),
        "{v}"
    );

    // Everything else is 403, and nothing is written.
    let refused = [
        (
            "PUT",
            "/v1/queues/order-close/messages/o2".to_owned(),
            Some(json!({"delay_ms": 0, "payload": {}})),
        ),
        ("GET", "/v1/queues/order-close/messages/o1".to_owned(), None),
        ("GET", "/v1/queues".to_owned(), None),
        ("GET", "/v1/queues/order-close/stats".to_owned(), None),
        (
            "POST",
            "/v1/queues/order-close:pause".to_owned(),
            Some(json!({})),
        ),
        ("DELETE", base.to_owned(), None),
        ("PUT", "/v1/queues/other".to_owned(), Some(json!({}))),
        (
            "POST",
            "/v1/queues/order-close/groups/other:receive".to_owned(),
            Some(json!({})),
        ),
        (
            "POST",
            "/v1/queues/refunds/groups/close:receive".to_owned(),
            Some(json!({})),
        ),
    ];
    for (m, uri, body) in refused {
        let (st, v) = call(&r, m, &uri, body, t).await;
        assert_eq!(
            (st, code(&v)),
            (StatusCode::FORBIDDEN, "forbidden_for_token"),
            "{m} {uri}: {v}"
        );
    }
    let (st, _) = call(
        &r,
        "GET",
        "/v1/queues/order-close/messages/o2",
        None,
        Some(TOKEN),
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "the refused PUT wrote nothing");
    // An unknown token is still 401.
    let (st, _) = call(
        &r,
        "POST",
        &format!("{base}:receive"),
        Some(json!({})),
        Some("not-a-token-at-all"),
    )
    .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
}

#[test]
fn consumer_tokens_are_checked_naming_the_key_and_never_shown() {
    let base = "redis_url = \"redis://x\"\n[http]\ntokens = [\"api-token-123\"]\n";
    let good = format!(
        "{base}[[http.consumer_tokens]]\ntoken = \"{CONSUMER}\"\ngroups = [\"order-close/close\"]\n"
    );
    let s = load_str(&good, env()).unwrap();
    assert_eq!(s.consumer_tokens.len(), 1);
    assert!(
        !format!("{s:?}").contains(CONSUMER),
        "shown in the settings"
    );
    for (text, key) in [
        (
            format!("{base}[[http.consumer_tokens]]\ntoken = \"short\"\ngroups = [\"q/g\"]\n"),
            "http.consumer_tokens[0].token",
        ),
        (
            format!(
                "{base}[[http.consumer_tokens]]\ntoken = \"api-token-123\"\ngroups = [\"q/g\"]\n"
            ),
            "http.consumer_tokens[0].token",
        ),
        (
            format!(
                "{base}[[http.consumer_tokens]]\ntoken = \"{CONSUMER}\"\ngroups = [\"q/g\", \"nogroup\"]\n"
            ),
            "http.consumer_tokens[0].groups[1]",
        ),
        (
            format!("{base}[[http.consumer_tokens]]\ntoken = \"{CONSUMER}\"\ngroups = []\n"),
            "http.consumer_tokens[0].groups",
        ),
        (
            format!(
                "redis_url = \"redis://x\"\n[[http.consumer_tokens]]\ntoken = \"{CONSUMER}\"\ngroups = [\"q/g\"]\n"
            ),
            "http.consumer_tokens",
        ),
    ] {
        let e = load_str(&text, env()).unwrap_err();
        assert_eq!(e.key.as_deref(), Some(key), "{text}: {e}");
        assert!(!e.to_string().contains(CONSUMER), "{e}");
    }
}
