//! The dashboard in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`) driving the real `delayq serve` on its own redis-server. Sign-in, the
//! overview following scheduled orders, an order lookup, a dead letter replayed from the page
//! and delivered, pause and resume, refused cross-origin and session-less changes, the
//! Redis-down banner, a phone-width layout, and the page weight with 100 queues. Each test
//! saves a screenshot (see `support::browser`).
#![allow(clippy::unwrap_used)]

use crate::support;

use axum::extract::State;
use axum::http::StatusCode;
use delayq::LocalRedis;
use fantoccini::Locator;
use fantoccini::key::Key;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use support::browser::Browser;
use support::serve::Serve;
use support::wait_for;

pub(crate) const TOKEN: &str = "dashboard-token-123";
pub(crate) const WAIT: Duration = Duration::from_secs(30);

fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// `delayq serve` with a token, the queue `order-close` and `extra` handler sections.
pub(crate) async fn serve_with(redis: &LocalRedis, extra: &str) -> Serve {
    let mut s = Serve::start(
        &format!(
            r#"
redis_url = "{}"
shutdown_grace = "1s"
queues = ["order-close"]
[http]
listen = "127.0.0.1:{{port}}"
tokens = ["{TOKEN}"]
{extra}
"#,
            redis.url()
        ),
        None,
    );
    s.wait_ready(WAIT).await;
    s
}

/// Opens the dashboard and signs in with `token`.
pub(crate) async fn sign_in(b: &Browser, serve: &Serve, token: &str) {
    b.client
        .goto(&format!("{}/ui/", serve.base()))
        .await
        .unwrap();
    let input = b.wait("#signin #token").await;
    input.send_keys(token).await.unwrap();
    b.click("#signin button[type=submit]").await;
}

/// The API, with the bearer token.
pub(crate) async fn v1(
    method: reqwest::Method,
    serve: &Serve,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = http()
        .request(method, format!("{}{path}", serve.base()))
        .bearer_auth(TOKEN);
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_refused_and_the_right_one_opens_the_overview() {
    let redis = LocalRedis::start().unwrap();
    let serve = serve_with(&redis, "").await;
    let b = Browser::start(1280, 800).await;
    sign_in(&b, &serve, "not-the-token").await;
    b.wait_text("#signin-error", "the refusal", |t| {
        t.contains("not accepted")
    })
    .await;
    b.screenshot("signin").await;
    // The token never appears in the page or its address.
    assert!(!b.client.source().await.unwrap().contains("not-the-token"));
    let input = b.wait("#signin #token").await;
    input.clear().await.unwrap();
    input.send_keys(TOKEN).await.unwrap();
    input.send_keys(&Key::Enter.to_string()).await.unwrap();
    b.wait_text("#queues-body", "the queue row", |t| {
        t.contains("order-close")
    })
    .await;
    let page = b.client.source().await.unwrap();
    assert!(!page.contains(TOKEN), "the token is in the page");
    assert!(
        !b.client
            .current_url()
            .await
            .unwrap()
            .as_str()
            .contains(TOKEN)
    );
    // The session is an HttpOnly cookie: scripts cannot read it.
    let cookie: Value = b
        .client
        .execute("return document.cookie", vec![])
        .await
        .unwrap();
    assert_eq!(cookie, json!(""));
    let cookies = b.client.get_all_cookies().await.unwrap();
    let c = cookies
        .iter()
        .find(|c| c.name() == "delayq_session")
        .unwrap();
    assert_eq!(c.http_only(), Some(true));
    assert_eq!(
        c.same_site().map(|s| format!("{s:?}")).as_deref(),
        Some("Strict")
    );
    assert!(c.expires().is_some(), "the session expires");
    // Signing out ends it.
    b.click("#signout").await;
    b.wait("#signin #token").await;
    b.client.refresh().await.unwrap();
    b.wait("#signin #token").await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_follows_orders_scheduled_through_the_api() {
    let redis = LocalRedis::start().unwrap();
    let serve = serve_with(
        &redis,
        "[[handlers]]\nqueue = \"order-close\"\ngroup = \"close\"\nkind = \"log\"\n",
    )
    .await;
    let b = Browser::start(1280, 1100).await;
    sign_in(&b, &serve, TOKEN).await;
    let cell = "tr[data-queue='order-close'] td[data-field='scheduled']";
    b.wait_text(cell, "0 scheduled", |t| t == "0").await;
    b.wait_text("tr[data-group='order-close/close']", "the group row", |t| {
        t.contains("close")
    })
    .await;
    for i in 0..7 {
        let (st, _) = v1(
            reqwest::Method::PUT,
            &serve,
            &format!("/v1/queues/order-close/messages/o{i}"),
            Some(json!({"delay_ms": 3_600_000, "payload": {"i": i}})),
        )
        .await;
        assert_eq!(st, 201);
    }
    // Refreshed in place, without a reload.
    b.client
        .execute("window.__same_page = true", vec![])
        .await
        .unwrap();
    b.wait_text(cell, "7 scheduled", |t| t == "7").await;
    let same: Value = b
        .client
        .execute("return window.__same_page === true", vec![])
        .await
        .unwrap();
    assert_eq!(same, json!(true), "the page was reloaded");
    b.screenshot("overview").await;
    // The queue page: groups, facts and the timing charts.
    b.click("tr[data-queue='order-close'] th a").await;
    b.wait_text("#fact-scheduled", "the queue's facts", |t| t == "7")
        .await;
    b.wait("figure svg.chart polyline").await;
    b.screenshot("queue").await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_is_looked_up_with_its_state_in_every_group() {
    let redis = LocalRedis::start().unwrap();
    let serve = serve_with(
        &redis,
        "[[handlers]]\nqueue = \"order-close\"\ngroup = \"close\"\nkind = \"log\"\n",
    )
    .await;
    let payload = r#"{"order":1234,"amount_cents":123456789012345678901234567890}"#;
    let r = http()
        .put(format!(
            "{}/v1/queues/order-close/messages/order-1234",
            serve.base()
        ))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(format!(r#"{{"delay_ms": 0, "payload": {payload}}}"#))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    wait_for("the order to be done", WAIT, || async {
        let (_, v) = v1(
            reqwest::Method::GET,
            &serve,
            "/v1/queues/order-close/messages/order-1234",
            None,
        )
        .await;
        v["groups"][0]["state"] == "done"
    })
    .await;
    let b = Browser::start(1280, 800).await;
    sign_in(&b, &serve, TOKEN).await;
    b.wait("#queues-body tr").await;
    b.click("nav a[data-nav=order]").await;
    b.wait("#order-queue option[value='order-close']").await;
    b.client
        .find(Locator::Css("#order-id"))
        .await
        .unwrap()
        .send_keys("order-1234")
        .await
        .unwrap();
    b.click("#order-form button").await;
    b.wait_text(
        "#order-groups tr[data-group='close']",
        "the close group",
        |t| t.contains("done"),
    )
    .await;
    // The payload byte for byte (big numbers not rounded).
    b.wait_text("#order-payload", "the payload", |t| t == payload)
        .await;
    b.wait_text("#order-result h2", "the state", |t| {
        t.contains("dispatched")
    })
    .await;
    b.screenshot("order").await;
    // An unknown order says so.
    b.client
        .goto(&format!(
            "{}/ui/#/order?queue=order-close&id=nope",
            serve.base()
        ))
        .await
        .unwrap();
    b.wait_text("#order-missing", "not found", |t| {
        t.contains("No order nope")
    })
    .await;
    // A cancelled order tells why (issue 43): scheduled, cancelled by its id, looked up.
    let r = http()
        .put(format!(
            "{}/v1/queues/order-close/messages/order-paid",
            serve.base()
        ))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(r#"{"delay_ms": 3600000, "payload": {"order": 7}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let r = http()
        .delete(format!(
            "{}/v1/queues/order-close/messages/order-paid",
            serve.base()
        ))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    b.client
        .goto(&format!(
            "{}/ui/#/order?queue=order-close&id=order-paid",
            serve.base()
        ))
        .await
        .unwrap();
    b.wait_text("#order-cancelled", "the cancel reason", |t| {
        t.starts_with("cancelled by id (")
    })
    .await;
    b.wait_text("#order-result h2", "the state", |t| t.contains("cancelled"))
        .await;
    b.close().await;
}

/// A webhook receiver that fails every call until `healthy` is set; counts the calls that
/// succeeded.
#[derive(Clone, Default)]
struct Flaky {
    healthy: Arc<AtomicBool>,
    delivered: Arc<AtomicUsize>,
}

async fn flaky(State(f): State<Flaky>) -> StatusCode {
    if f.healthy.load(Ordering::SeqCst) {
        f.delivered.fetch_add(1, Ordering::SeqCst);
        StatusCode::OK
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_is_replayed_from_the_page_and_delivered() {
    let redis = LocalRedis::start().unwrap();
    let f = Flaky::default();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = l.local_addr().unwrap().port();
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(flaky))
        .with_state(f.clone());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    let serve = serve_with(
        &redis,
        &format!(
            "[[handlers]]\nqueue = \"order-close\"\ngroup = \"partner\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{hook}/hook\"\nmax_attempts = 1\n"
        ),
    )
    .await;
    for id in ["dl-1", "dl-2"] {
        let (st, _) = v1(
            reqwest::Method::PUT,
            &serve,
            &format!("/v1/queues/order-close/messages/{id}"),
            Some(json!({"delay_ms": 0})),
        )
        .await;
        assert_eq!(st, 201);
    }
    wait_for("2 dead letters", WAIT, || async {
        let (_, v) = v1(
            reqwest::Method::GET,
            &serve,
            "/v1/queues/order-close/dead",
            None,
        )
        .await;
        v["dead_letters"].as_array().is_some_and(|d| d.len() == 2)
    })
    .await;
    let b = Browser::start(1280, 800).await;
    sign_in(&b, &serve, TOKEN).await;
    b.wait("#queues-body tr").await;
    b.client
        .goto(&format!("{}/ui/#/dead/order-close", serve.base()))
        .await
        .unwrap();
    b.wait_text("#dead tbody", "the dead letters", |t| {
        t.contains("dl-1") && t.contains("dl-2")
    })
    .await;
    assert!(
        b.client.source().await.unwrap().contains("500"),
        "the error is shown"
    );
    b.screenshot("dead-letters").await;
    // The partner is fixed; replay dl-1 only, confirming in the dialog.
    f.healthy.store(true, Ordering::SeqCst);
    let rows = b
        .client
        .find_all(Locator::Css("#dead tbody tr"))
        .await
        .unwrap();
    for row in rows {
        if row.text().await.unwrap().contains("dl-1") {
            row.find(Locator::Css("input[type=checkbox]"))
                .await
                .unwrap()
                .click()
                .await
                .unwrap();
        }
    }
    b.click("#replay-selected").await;
    b.wait_text("#confirm-text", "the confirmation", |t| {
        t.contains("Replay 1 dead letter")
    })
    .await;
    b.screenshot("dead-letters-confirm").await;
    b.click("#confirm-ok").await;
    b.wait_text(".notice", "the result", |t| t.contains("Replayed 1"))
        .await;
    wait_for("the replayed order to be delivered", WAIT, || {
        let n = f.delivered.load(Ordering::SeqCst);
        async move { n == 1 }
    })
    .await;
    let (_, v) = v1(
        reqwest::Method::GET,
        &serve,
        "/v1/queues/order-close/dead",
        None,
    )
    .await;
    let left: Vec<&str> = v["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(left, vec!["dl-2"]);
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_and_a_group_are_paused_and_resumed_from_the_page_with_the_keyboard() {
    let redis = LocalRedis::start().unwrap();
    let serve = serve_with(
        &redis,
        "[[handlers]]\nqueue = \"order-close\"\ngroup = \"close\"\nkind = \"log\"\n",
    )
    .await;
    let b = Browser::start(1280, 800).await;
    sign_in(&b, &serve, TOKEN).await;
    let button = "tr[data-queue='order-close'] button[data-pause='order-close']";
    b.wait_text(button, "the pause button", |t| t == "Pause")
        .await;
    // Keyboard: focus the button and press Enter.
    b.client
        .find(Locator::Css(button))
        .await
        .unwrap()
        .send_keys(&Key::Enter.to_string())
        .await
        .unwrap();
    b.wait_text(button, "the resume button", |t| t == "Resume")
        .await;
    b.wait_text("tr[data-queue='order-close'] th", "the paused badge", |t| {
        t.contains("paused")
    })
    .await;
    let (_, v) = v1(
        reqwest::Method::GET,
        &serve,
        "/v1/queues/order-close/stats",
        None,
    )
    .await;
    assert_eq!(v["queues"][0]["paused"], true);
    let group = "button[data-pause='order-close/close']";
    b.click(group).await;
    b.wait_text(group, "the group's resume button", |t| t == "Resume")
        .await;
    let (_, v) = v1(
        reqwest::Method::GET,
        &serve,
        "/v1/queues/order-close/stats",
        None,
    )
    .await;
    assert_eq!(v["queues"][0]["groups"][0]["paused"], true);
    b.screenshot("paused").await;
    b.click(button).await;
    b.wait_text(button, "the pause button again", |t| t == "Pause")
        .await;
    b.click(group).await;
    b.wait_text(group, "the group's pause button again", |t| t == "Pause")
        .await;
    let (_, v) = v1(
        reqwest::Method::GET,
        &serve,
        "/v1/queues/order-close/stats",
        None,
    )
    .await;
    assert_eq!(
        (
            v["queues"][0]["paused"].clone(),
            v["queues"][0]["groups"][0]["paused"].clone()
        ),
        (json!(false), json!(false))
    );
    // A skip link leads keyboard users past the header.
    b.wait("a.skip[href='#main']").await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_without_the_session_or_from_another_origin_are_refused() {
    let redis = LocalRedis::start().unwrap();
    let serve = serve_with(&redis, "").await;
    let base = serve.base();
    let paused = || async {
        let (_, v) = v1(
            reqwest::Method::GET,
            &serve,
            "/v1/queues/order-close/stats",
            None,
        )
        .await;
        v["queues"][0]["paused"].as_bool().unwrap()
    };
    // No session, no token.
    let r = http()
        .post(format!("{base}/v1/queues/order-close:pause"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // A session cookie without its CSRF token.
    let login = http()
        .post(format!("{base}/ui/login"))
        .header("content-type", "application/json")
        .body(json!({"token": TOKEN}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 204);
    let cookie = login.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let r = http()
        .post(format!("{base}/v1/queues/order-close:pause"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(!paused().await);
    // A page of another origin, in the signed-in browser, posting with the cookie.
    let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let other_port = other.local_addr().unwrap().port();
    let target = format!("{base}/v1/queues/order-close:pause");
    let page = format!(
        r#"<!doctype html><title>evil</title><script>
fetch("{target}", {{method: "POST", credentials: "include", mode: "no-cors", body: "{{}}"}})
  .finally(() => {{ document.title = "sent"; }});
</script>"#
    );
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let p = page.clone();
            async move { axum::response::Html(p) }
        }),
    );
    tokio::spawn(async move { axum::serve(other, app).await.unwrap() });
    let b = Browser::start(1280, 800).await;
    sign_in(&b, &serve, TOKEN).await;
    b.wait("#queues-body tr").await;
    b.client
        .goto(&format!("http://127.0.0.1:{other_port}/"))
        .await
        .unwrap();
    wait_for("the other page's request", WAIT, || async {
        b.client.title().await.unwrap() == "sent"
    })
    .await;
    assert!(!paused().await, "a cross-origin request paused the queue");
    // Back on the dashboard, the same change goes through.
    b.client.goto(&format!("{base}/ui/")).await.unwrap();
    let button = "button[data-pause='order-close']";
    b.wait_text(button, "the pause button", |t| t == "Pause")
        .await;
    b.click(button).await;
    wait_for("the queue to be paused", WAIT, || async { paused().await }).await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_going_away_shows_a_banner_not_a_blank_page() {
    let mut redis = LocalRedis::start().unwrap();
    let serve = serve_with(&redis, "").await;
    let b = Browser::start(1280, 800).await;
    sign_in(&b, &serve, TOKEN).await;
    b.wait("#queues-body tr[data-queue='order-close']").await;
    redis.kill();
    b.wait_text("#banner", "the banner", |t| {
        t.contains("Redis is unreachable")
    })
    .await;
    // The last numbers stay on the page.
    b.wait("#queues-body tr[data-queue='order-close']").await;
    b.screenshot("redis-down").await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_queues_on_a_laptop_and_on_a_phone() {
    let redis = LocalRedis::start().unwrap();
    let serve = serve_with(&redis, "").await;
    for i in 0..99 {
        let (st, _) = v1(
            reqwest::Method::PUT,
            &serve,
            &format!("/v1/queues/shop-{i:02}"),
            None,
        )
        .await;
        assert_eq!(st, 201);
    }
    // Page weight: the HTML, CSS and JS the overview loads.
    let mut weight = 0;
    for path in ["/ui/", "/ui/app.css", "/ui/app.js"] {
        let r = http()
            .get(format!("{}{path}", serve.base()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(
            r.headers()["content-security-policy"]
                .to_str()
                .unwrap()
                .contains("script-src 'self'")
        );
        weight += r.bytes().await.unwrap().len();
    }
    assert!(weight < 200 * 1024, "the overview weighs {weight} bytes");
    let b = Browser::start(1280, 800).await;
    sign_in(&b, &serve, TOKEN).await;
    let hundred = || async {
        b.client
            .find_all(Locator::Css("#queues-body tr[data-queue]"))
            .await
            .unwrap()
            .len()
            == 100
    };
    wait_for("100 queue rows", WAIT, hundred).await;
    // Load the page afresh, signed in: from navigation start to every queue on screen.
    b.client
        .execute("window.__before_reload = true", vec![])
        .await
        .unwrap();
    b.client.refresh().await.unwrap();
    wait_for("100 queue rows after a reload", WAIT, hundred).await;
    let reloaded: Value = b
        .client
        .execute("return window.__before_reload === undefined", vec![])
        .await
        .unwrap();
    assert_eq!(reloaded, json!(true));
    // Measured, not asserted (docs/benchmarks.md): milliseconds from navigation start to
    // the first overview with every queue, and where they went.
    let timing: Value = b
        .client
        .execute(
            "const n = performance.getEntriesByType('navigation')[0]; \
             const r = (p) => performance.getEntriesByType('resource').filter((e) => e.name.includes(p)).map((e) => Math.round(e.duration)); \
             return {rendered_ms: Math.round(performance.getEntriesByName('overview-rendered')[0].startTime), \
                     dom_content_loaded_ms: Math.round(n.domContentLoadedEventEnd), session_ms: r('/ui/session'), stats_ms: r('/v1/stats')}",
            vec![],
        )
        .await
        .unwrap();
    eprintln!("overview with 100 queues: {timing}; page weight {weight} bytes");
    b.screenshot("overview-100-queues").await;
    b.close().await;
    // Phone width: nothing wider than the screen but the tables, which scroll in place.
    let phone = Browser::start(390, 844).await;
    sign_in(&phone, &serve, TOKEN).await;
    phone.wait("#queues-body tr[data-queue='shop-00']").await;
    let overflow: Value = phone
        .client
        .execute(
            "return document.documentElement.scrollWidth <= window.innerWidth",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(overflow, json!(true), "the page is wider than a phone");
    phone.screenshot("overview-phone").await;
    phone.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_page_lists_its_recurring_schedules() {
    let redis = LocalRedis::start().unwrap();
    let serve = serve_with(&redis, "").await;
    let b = Browser::start(1280, 1100).await;
    sign_in(&b, &serve, TOKEN).await;
    b.wait("#queues-body").await;
    b.client
        .goto(&format!("{}/ui/#/queue/order-close", serve.base()))
        .await
        .unwrap();
    // None yet: a line saying how to add one.
    b.wait_text("#schedules-empty", "the empty line", |t| {
        t.contains("No recurring schedules") && t.contains("/v1/queues/order-close/schedules/")
    })
    .await;
    let (st, v) = v1(
        reqwest::Method::PUT,
        &serve,
        "/v1/queues/order-close/schedules/nightly-report",
        Some(json!({"cron": "0 30 2 * * *", "timezone": "Europe/Berlin"})),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    // Shown on the next refresh, without a reload.
    let row = b
        .wait_text(
            "#schedules tr[data-schedule='nightly-report']",
            "the schedule row",
            |t| t.contains("0 30 2 * * *"),
        )
        .await;
    assert!(row.contains("Europe/Berlin"), "{row}");
    assert!(row.contains("in "), "the next fire is ahead: {row}");
    let header: Value = b
        .client
        .execute(
            "return document.querySelector('#schedules tr[data-schedule] th').getAttribute('scope')",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(header, json!("row"));
    let empty_hidden: Value = b
        .client
        .execute(
            "return document.getElementById('schedules-empty').hidden",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(empty_hidden, json!(true));
    b.screenshot("schedules").await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_page_shows_the_backlog_of_each_priority() {
    let redis = LocalRedis::start().unwrap();
    let serve = serve_with(&redis, "").await;
    let b = Browser::start(1280, 1100).await;
    sign_in(&b, &serve, TOKEN).await;
    b.wait("#queues-body").await;
    // Two high orders due now: dispatched into the high lane (no handler reads them here).
    for id in ["vip-1", "vip-2"] {
        let (st, v) = v1(
            reqwest::Method::PUT,
            &serve,
            &format!("/v1/queues/order-close/messages/{id}"),
            Some(json!({"delay_ms": 0, "priority": "high"})),
        )
        .await;
        assert_eq!(st, 201, "{v}");
    }
    b.client
        .goto(&format!("{}/ui/#/queue/order-close", serve.base()))
        .await
        .unwrap();
    let row = b
        .wait_text(
            "#priorities tr[data-priority='high']",
            "the high row with both orders",
            |t| t.split_whitespace().nth(1) == Some("2"),
        )
        .await;
    assert!(row.starts_with("high"), "{row}");
    let low = b
        .wait_text("#priorities tr[data-priority='low']", "the low row", |t| {
            t.starts_with("low")
        })
        .await;
    assert_eq!(low.split_whitespace().nth(1), Some("0"), "{low}");
    b.screenshot("priorities").await;
    b.close().await;
}
