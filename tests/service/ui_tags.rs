//! The dashboard's orders-by-tag page in a real browser (issue 43): a search by tag shows
//! the count and the orders, a cancel of them all asks first with the count and cancels
//! only that tag's orders, and the order page shows an order's tags.
#![allow(clippy::unwrap_used)]

use crate::support;
use crate::ui::{TOKEN, serve_with, sign_in, v1};

use delayq::LocalRedis;
use fantoccini::Locator;
use reqwest::Method;
use serde_json::json;
use support::browser::Browser;

/// Schedules `n` orders `<prefix>-<i>` due in an hour with `tags`.
async fn schedule(serve: &support::serve::Serve, prefix: &str, n: usize, tags: &[&str]) {
    for i in 0..n {
        let (st, v) = v1(
            Method::PUT,
            serve,
            &format!("/v1/queues/order-close/messages/{prefix}-{i}"),
            Some(json!({"delay_ms": 3_600_000, "payload": {"i": i}, "tags": tags})),
        )
        .await;
        assert_eq!(st, 201, "{v}");
    }
}

async fn count(serve: &support::serve::Serve, tag: &str) -> u64 {
    let (st, v) = v1(Method::GET, serve, &format!("/v1/tags/{tag}"), None).await;
    assert_eq!(st, 200, "{v}");
    v["total"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_are_found_by_tag_and_cancelled_from_the_page_after_a_confirmation_with_the_count() {
    let redis = LocalRedis::start().unwrap();
    let serve = serve_with(&redis, "").await;
    schedule(&serve, "c7", 30, &["customer:7"]).await;
    schedule(&serve, "c8", 5, &["customer:8", "campaign:bf26"]).await;
    let b = Browser::start(1280, 800).await;
    sign_in(&b, &serve, TOKEN).await;
    b.wait("#queues-body tr").await;
    b.client
        .goto(&format!("{}/ui/#/tags", serve.base()))
        .await
        .unwrap();
    let input = b.wait("#tags-tag").await;
    input.send_keys("customer:7").await.unwrap();
    b.click("#tags-form button[type=submit]").await;
    b.wait_text("#tags-count", "the count", |t| t == "30").await;
    let rows = b
        .client
        .find_all(Locator::Css("#tags-orders tbody tr[data-id]"))
        .await
        .unwrap();
    assert_eq!(rows.len(), 30, "every tagged order is listed");
    for r in rows {
        let text = r.text().await.unwrap();
        assert!(text.contains("c7-"), "only customer:7's orders: {text}");
    }
    let shown = b.wait_text("#tags-result", "the result", |_| true).await;
    assert!(
        !shown.contains("null"),
        "nothing missing shows as null: {shown}"
    );
    b.screenshot("tags").await;

    // Declining the confirmation cancels nothing.
    b.click("#tags-cancel").await;
    b.wait_text("#confirm-text", "the confirmation", |t| {
        t.contains("Cancel 30 scheduled orders tagged customer:7 in every queue")
    })
    .await;
    b.click("#confirm-cancel").await;
    assert_eq!(count(&serve, "customer:7").await, 30);

    // Confirming cancels exactly that tag's orders, and says how many.
    b.click("#tags-cancel").await;
    b.wait_text("#confirm-text", "the confirmation", |t| {
        t.contains("Cancel 30")
    })
    .await;
    b.click("#confirm-ok").await;
    b.wait_text("#tags-notice", "the result", |t| {
        t.contains("Cancelled 30 orders tagged customer:7")
    })
    .await;
    b.wait_text("#tags-count", "the count after", |t| t == "0")
        .await;
    assert_eq!(count(&serve, "customer:7").await, 0);
    assert_eq!(count(&serve, "customer:8").await, 5);

    // The order page shows an order's tags, each a link to its search.
    b.client
        .goto(&format!(
            "{}/ui/#/order?queue=order-close&id=c8-2",
            serve.base()
        ))
        .await
        .unwrap();
    b.wait_text("#order-tags", "the tags", |t| {
        t.contains("customer:8") && t.contains("campaign:bf26")
    })
    .await;
    b.click("#order-tags a.tag").await;
    b.wait_text("#tags-count", "the linked search", |t| t == "5")
        .await;
    b.close().await;
}
