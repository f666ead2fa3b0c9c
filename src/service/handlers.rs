//! Built-in handlers for `delayq serve`: `webhook` (POST each order to a URL, signed),
//! `log` (write each order to the log and acknowledge it) and `order-close` (close the order
//! in the orders database: [`crate::orders::close`]).

use crate::engine::clock::Clock;
use crate::engine::error::{Error, Result};
use crate::engine::redact;
use crate::engine::worker::{Delivery, Handler, HandlerError, HandlerResult};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use serde::Serialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;

/// A built-in handler.
#[derive(Debug, Clone)]
pub enum Builtin {
    /// POST to a URL.
    Webhook(Webhook),
    /// Log and acknowledge.
    Log,
    /// Close the order in the orders database.
    OrderClose(crate::orders::close::OrderClose),
}

impl Handler for Builtin {
    async fn handle(&self, d: Delivery) -> HandlerResult {
        match self {
            Builtin::Webhook(w) => w.call(&d).await,
            Builtin::Log => {
                tracing::info!(
                    queue = %d.queue, group = %d.group, id = ?d.id, due_at_ms = d.due_at_ms,
                    attempt = d.attempt, payload = %d.payload, "order due"
                );
                Ok(())
            }
            Builtin::OrderClose(h) => h.handle(d).await,
        }
    }
}

/// POSTs `{"queue","id","group","due_at_ms","payload","attempt"}`, with `"key"` for a keyed
/// order (the payload byte for byte as scheduled) with the headers `Idempotency-Key`, `X-Delayq-Attempt`, `traceparent` and
/// `tracestate` (W3C Trace Context: the delivery's `process` span, or the order's own
/// context when no spans are recorded; none for an order scheduled without one) and, with
/// secrets,
/// the [Standard Webhooks](https://www.standardwebhooks.com/) signature: `webhook-id` (the
/// idempotency key, stable across attempts), `webhook-timestamp` (unix seconds, the Redis
/// clock) and `webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">`, one per
/// secret, space separated. 2xx acknowledges; anything else, a connection error or a timeout
/// is a retryable failure (a `Retry-After` in seconds is honoured, capped at an hour).
/// Redirects are never followed. Failures name their cause with the URL's credentials and
/// query masked.
#[derive(Clone)]
pub struct Webhook {
    http: reqwest::Client,
    url: String,
    /// The URL as errors and logs show it (credentials and query masked).
    shown: String,
    /// The HMAC keys, one per secret.
    keys: Vec<Vec<u8>>,
    timeout: Duration,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("url", &self.shown)
            .field("secrets", &self.keys.len())
            .finish_non_exhaustive()
    }
}

/// The longest `Retry-After` honoured (one hour): a partner cannot park an order for years.
const MAX_RETRY_AFTER_SECS: u64 = 3600;

/// The Standard Webhooks secret prefix: `whsec_<base64 key>`.
const SECRET_PREFIX: &str = "whsec_";

/// The one rule for a webhook URL: an absolute `http://` or `https://` URL.
pub fn check_webhook_url(url: &str) -> std::result::Result<(), String> {
    let ok = url.starts_with("http://") || url.starts_with("https://");
    if !ok || reqwest::Url::parse(url).is_err() {
        return Err(format!("{} is not an http(s) URL", redact::url(url)));
    }
    Ok(())
}

/// The one rule for a signing secret: `whsec_<base64 of the key>`, the form every Standard
/// Webhooks library takes, so receivers verify with the same string. A raw secret is
/// refused with how to convert it (the message never repeats it).
pub fn check_secret(secret: &str) -> std::result::Result<(), String> {
    match secret.strip_prefix(SECRET_PREFIX) {
        Some(b64) => match BASE64.decode(b64) {
            Ok(k) if k.len() >= 16 => Ok(()),
            Ok(_) => Err("the whsec_ key must decode to at least 16 bytes".into()),
            Err(_) => Err("after whsec_ comes the key in base64".into()),
        },
        None => Err(
            "must be whsec_<base64 of the key>, as Standard Webhooks libraries take it: make one \
             with `echo whsec_$(openssl rand -base64 32)`, or convert a raw secret with \
             `echo whsec_$(printf %s \"$RAW\" | base64)` (the key stays the same bytes)"
                .into(),
        ),
    }
}

fn key_of(secret: &str) -> Vec<u8> {
    secret
        .strip_prefix(SECRET_PREFIX)
        .and_then(|b64| BASE64.decode(b64).ok())
        .unwrap_or_else(|| secret.as_bytes().to_vec())
}

/// What the webhook receives.
#[derive(Serialize)]
struct Body<'a> {
    queue: &'a str,
    id: &'a str,
    group: &'a str,
    due_at_ms: i64,
    payload: &'a RawValue,
    attempt: u32,
    /// The order's tags (untagged: left out, so the body is the one it always was).
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    tags: &'a [String],
    /// The order's key (issue 42), only for a keyed order.
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a str>,
}

impl Webhook {
    /// A webhook handler posting to `url` with a per-request `timeout`, signing with every
    /// one of `secrets` (none: unsigned), timestamps from `clock`.
    pub fn new(
        url: &str,
        secrets: &[String],
        timeout: Duration,
        clock: Arc<dyn Clock>,
    ) -> Result<Self> {
        check_webhook_url(url).map_err(|reason| crate::engine::error::InvalidInput::Option {
            name: "url",
            reason,
        })?;
        for s in secrets {
            check_secret(s).map_err(|reason| crate::engine::error::InvalidInput::Option {
                name: "secret",
                reason,
            })?;
        }
        // TLS through rustls with the ring provider (no C toolchain needed).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Io {
                context: "building the webhook client".into(),
                source: std::io::Error::other(e.without_url()),
            })?;
        Ok(Webhook {
            http,
            shown: redact::url(url),
            url: url.to_owned(),
            keys: secrets.iter().map(|s| key_of(s)).collect(),
            timeout,
            clock,
        })
    }

    /// The JSON body sent for `d`: the payload embedded byte for byte (a payload that is not
    /// valid JSON, from a foreign producer, as a JSON string).
    pub fn body(d: &Delivery) -> Vec<u8> {
        let raw = crate::engine::message::raw_json(&d.payload_text);
        serde_json::to_vec(&Body {
            queue: &d.queue,
            id: &d.id,
            group: &d.group,
            due_at_ms: d.due_at_ms,
            payload: &raw,
            attempt: d.attempt,
            tags: &d.tags,
            key: d.key(),
        })
        .unwrap_or_default()
    }

    /// One Standard Webhooks signature: `v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`.
    pub fn signature(key: &[u8], msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        // HMAC accepts keys of any length.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
            return String::new();
        };
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
    }

    /// Whether `signatures` (a `webhook-signature` header: space-separated `v1,<base64>`)
    /// holds a valid signature of `body` for `msg_id` and `timestamp` (the `webhook-id` and
    /// `webhook-timestamp` headers) under `secret`: what a receiver checks (it should also
    /// refuse timestamps far from its clock, e.g. beyond five minutes, against replays).
    pub fn verify(
        secret: &str,
        msg_id: &str,
        timestamp: &str,
        signatures: &str,
        body: &[u8],
    ) -> bool {
        let Ok(ts) = timestamp.trim().parse::<i64>() else {
            return false;
        };
        let want = Self::signature(&key_of(secret), msg_id, ts, body);
        signatures
            .split(' ')
            .any(|s| bool::from(subtle::ConstantTimeEq::ct_eq(s.as_bytes(), want.as_bytes())))
    }

    /// The idempotency key of a delivery (also its `webhook-id`): hex SHA-256 of `queue \n
    /// group \n id \n due_at_ms`, stable across attempts and replays of the same order and
    /// due time to one group, distinct between groups (a receiver that de-duplicates by it
    /// never drops another group's delivery), and header-safe whatever the id holds.
    pub fn idempotency_key(d: &Delivery) -> String {
        let mut h = Sha256::new();
        h.update(d.queue.as_bytes());
        h.update(b"\n");
        h.update(d.group.as_bytes());
        h.update(b"\n");
        h.update(d.id.as_bytes());
        h.update(b"\n");
        h.update(d.due_at_ms.to_string().as_bytes());
        hex::encode(h.finalize())
    }

    async fn call(&self, d: &Delivery) -> HandlerResult {
        let body = Self::body(d);
        let msg_id = Self::idempotency_key(d);
        let mut req = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("idempotency-key", &msg_id)
            .header("x-delayq-attempt", d.attempt.to_string());
        // The delivery's `process` span as the receiver's parent (the order's own context
        // when no spans are recorded): its trace goes on at the receiver.
        if let Some(ctx) = crate::engine::trace::outgoing(d.trace.as_ref()) {
            req = req.header("traceparent", ctx.traceparent());
            if let Some(state) = ctx.tracestate() {
                req = req.header("tracestate", state);
            }
        }
        if !self.keys.is_empty() {
            let ts = self.clock.now_ms().div_euclid(1000);
            let sigs: Vec<String> = self
                .keys
                .iter()
                .map(|k| Self::signature(k, &msg_id, ts, &body))
                .collect();
            req = req
                .header("webhook-id", &msg_id)
                .header("webhook-timestamp", ts.to_string())
                .header("webhook-signature", sigs.join(" "));
        }
        let resp = req
            .body(body)
            .send()
            .await
            .map_err(|e| HandlerError::retry(self.describe(&e)))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        let after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|secs| Duration::from_secs(secs.min(MAX_RETRY_AFTER_SECS)));
        let msg = if status.is_redirection() {
            // Never followed: the configured endpoint did not take the order.
            let to = resp
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .map(redact::url)
                .unwrap_or_default();
            format!(
                "webhook {} answered {status} (redirect to {to:?} not followed)",
                self.shown
            )
        } else {
            format!("webhook {} answered {status}", self.shown)
        };
        Err(match after {
            Some(a) => HandlerError::retry_after(msg, a),
            None => HandlerError::retry(msg),
        })
    }

    /// Why a request failed, in words an operator can act on, without the URL's secrets:
    /// a timeout, a refused connection, too many open files, or the underlying error.
    fn describe(&self, e: &reqwest::Error) -> String {
        let url = &self.shown;
        if e.is_timeout() {
            return format!("webhook {url} timed out after {:?}", self.timeout);
        }
        let mut cause: &dyn std::error::Error = e;
        let mut io = None;
        while let Some(next) = cause.source() {
            if let Some(i) = next.downcast_ref::<std::io::Error>() {
                io = Some(i);
            }
            cause = next;
        }
        let what = match io {
            Some(i) if i.kind() == std::io::ErrorKind::ConnectionRefused => {
                "connection refused".to_owned()
            }
            // EMFILE / ENFILE: this process or the system is out of file descriptors.
            Some(i) if matches!(i.raw_os_error(), Some(24 | 23)) => {
                "too many open files (this process is out of file descriptors)".to_owned()
            }
            Some(i) => i.to_string(),
            None => redact::text(&cause.to_string()),
        };
        let stage = if e.is_connect() {
            "could not connect"
        } else {
            "request failed"
        };
        format!("webhook {url}: {stage}: {what}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderMap;
    use std::sync::{Arc, Mutex};

    /// A clock stopped at `ms`.
    #[derive(Debug)]
    struct Fixed(i64);
    impl Clock for Fixed {
        fn now_ms(&self) -> i64 {
            self.0
        }
        fn now_us(&self) -> i64 {
            self.0 * 1000
        }
    }

    fn clock() -> Arc<dyn Clock> {
        Arc::new(Fixed(1_614_265_330_000))
    }

    fn delivery() -> Delivery {
        Delivery {
            queue: "order-close".into(),
            group: "close-order".into(),
            id: "o1".into(),
            payload: serde_json::json!({"amount_cents": 1999}),
            payload_text: r#"{"amount_cents":1999}"#.into(),
            due_at_ms: 1_800_000_000_000,
            enqueued_at_ms: Some(1_799_999_000_000),
            dispatched_at_ms: 1_800_000_000_001,
            entry_id: "1800000000001-0".into(),
            shard: 0,
            priority: crate::engine::priority::Priority::Normal,
            attempt: 3,
            flag: None,
            trace: None,
            tags: Vec::new(),
            key: None,
        }
    }

    /// The body carries `key` for a keyed order only (issue 42).
    #[test]
    fn the_body_carries_the_key_of_a_keyed_order() {
        let plain: serde_json::Value = serde_json::from_slice(&Webhook::body(&delivery())).unwrap();
        assert!(plain.get("key").is_none(), "{plain}");
        let mut d = delivery();
        d.key = Some("merchant:17".into());
        let keyed: serde_json::Value = serde_json::from_slice(&Webhook::body(&d)).unwrap();
        assert_eq!(keyed["key"], "merchant:17");
        assert_eq!(keyed["payload"], plain["payload"]);
    }

    #[tokio::test]
    async fn redirects_are_never_followed_and_retry_after_is_capped() {
        use axum::routing::post;
        let hits = Arc::new(Mutex::new(0u32));
        let h2 = hits.clone();
        let target = axum::Router::new().route(
            "/elsewhere",
            post(move || {
                *h2.lock().unwrap() += 1;
                async { "ok" }
            })
            .get(|| async { "ok" }),
        );
        let tl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tport = tl.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(tl, target).await.unwrap() });
        let loc = format!("http://127.0.0.1:{tport}/elsewhere?token=SECRET");
        let l2 = loc.clone();
        let app = axum::Router::new()
            .route(
                "/302",
                post(move || {
                    let l = l2.clone();
                    async move { (axum::http::StatusCode::FOUND, [("location", l)]) }
                }),
            )
            .route(
                "/307",
                post(move || {
                    let l = loc.clone();
                    async move {
                        (
                            axum::http::StatusCode::TEMPORARY_REDIRECT,
                            [("location", l)],
                        )
                    }
                }),
            )
            .route(
                "/busy",
                post(|| async {
                    (
                        axum::http::StatusCode::SERVICE_UNAVAILABLE,
                        [("retry-after", "4000000000")],
                    )
                }),
            );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        for path in ["302", "307"] {
            let w = Webhook::new(
                &format!("http://127.0.0.1:{port}/{path}?token=SECRET"),
                &["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()],
                Duration::from_secs(5),
                clock(),
            )
            .unwrap();
            match w.call(&delivery()).await {
                Err(HandlerError::Retry { message, .. }) => {
                    assert!(message.contains("not followed"), "{message}");
                    assert!(
                        message.contains("302") || message.contains("307"),
                        "{message}"
                    );
                    assert!(!message.contains("SECRET"), "{message}");
                }
                other => panic!("{path}: {other:?}"),
            }
        }
        assert_eq!(
            *hits.lock().unwrap(),
            0,
            "the redirect target received nothing"
        );
        let w = Webhook::new(
            &format!("http://127.0.0.1:{port}/busy"),
            &[],
            Duration::from_secs(5),
            clock(),
        )
        .unwrap();
        match w.call(&delivery()).await {
            Err(HandlerError::Retry { after, .. }) => {
                assert_eq!(after, Some(Duration::from_secs(MAX_RETRY_AFTER_SECS)))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn signatures_follow_standard_webhooks() {
        // The specification's example (standard-webhooks/spec, "Verifying webhook
        // authenticity").
        let key = key_of("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        assert_eq!(
            Webhook::signature(
                &key,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        assert!(check_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_ok());
        assert!(check_secret("whsec_***").is_err());
        assert!(check_secret("short").is_err());
        // A raw secret is refused, with how to convert it, and never repeated.
        let e = check_secret("a-plain-secret-of-enough-bytes").unwrap_err();
        assert!(e.contains("whsec_") && !e.contains("a-plain-secret"), "{e}");
    }

    #[test]
    fn the_body_embeds_the_payload_byte_for_byte() {
        let mut d = delivery();
        d.payload_text =
            r#"{"n":123456789012345678901234567890,"d":0.1000000000000000055511151231257827}"#
                .into();
        let body = String::from_utf8(Webhook::body(&d)).unwrap();
        assert!(
            body.contains(&format!("\"payload\":{}", d.payload_text)),
            "{body}"
        );
        d.payload_text = "not json".into();
        let body = String::from_utf8(Webhook::body(&d)).unwrap();
        assert!(body.contains(r#""payload":"not json""#), "{body}");
        assert!(!body.contains("tags"), "{body}");
        d.tags = vec!["customer:42".into(), "order:1".into()];
        let body = String::from_utf8(Webhook::body(&d)).unwrap();
        assert!(
            body.contains(r#""tags":["customer:42","order:1"]"#),
            "{body}"
        );
    }

    #[test]
    fn idempotency_key_is_stable_per_queue_group_id_and_due_time() {
        let a = delivery();
        let mut b = delivery();
        b.attempt = 9;
        b.entry_id = "1800000009999-0".into();
        assert_eq!(Webhook::idempotency_key(&a), Webhook::idempotency_key(&b));
        b.due_at_ms += 1;
        assert_ne!(Webhook::idempotency_key(&a), Webhook::idempotency_key(&b));
        // Two groups posting the same order to one receiver: two keys.
        let mut c = delivery();
        c.group = format!("{}-other", a.group);
        assert_ne!(Webhook::idempotency_key(&a), Webhook::idempotency_key(&c));
    }

    #[tokio::test]
    async fn without_a_secret_there_is_no_signature_header() {
        let seen: Arc<Mutex<Vec<HeaderMap>>> = Arc::default();
        let s2 = seen.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |h: HeaderMap| {
                let s = s2.clone();
                async move {
                    s.lock().map(|mut v| v.push(h)).ok();
                    axum::http::StatusCode::NO_CONTENT
                }
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(l, app).await });
        let w = Webhook::new(
            &format!("http://127.0.0.1:{port}/hook"),
            &[],
            Duration::from_secs(5),
            clock(),
        )
        .unwrap();
        Builtin::Webhook(w.clone())
            .handle(delivery())
            .await
            .unwrap();
        // Without recorded spans, a traced order's own context is passed on as it is.
        let mut traced = delivery();
        traced.trace = crate::engine::trace::TraceContext::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            Some("congo=t61rcWkgMzE"),
        );
        Builtin::Webhook(w).handle(traced).await.unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2);
        assert!(seen[0].get("webhook-signature").is_none());
        assert_eq!(seen[0]["x-delayq-attempt"], "3");
        assert_eq!(seen[0]["content-type"], "application/json");
        assert!(seen[0].get("traceparent").is_none());
        assert_eq!(
            seen[1]["traceparent"],
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        assert_eq!(seen[1]["tracestate"], "congo=t61rcWkgMzE");
    }
}
