//! Built-in handlers for `delayq serve`: `webhook` (POST each order to a URL, signed),
//! `log` (write each order to the log and acknowledge it) and `order-close` (close the order
//! in the orders database: [`crate::orders::close`]).

use crate::engine::worker::{Delivery, Handler, HandlerError, HandlerResult};
use crate::error::{Error, Result};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
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
                    queue = %d.queue, group = %d.group, id = %d.id, due_at_ms = d.due_at_ms,
                    attempt = d.attempt, payload = %d.payload, "order due"
                );
                Ok(())
            }
            Builtin::OrderClose(h) => h.handle(d).await,
        }
    }
}

/// POSTs `{"queue","id","group","due_at_ms","payload","attempt"}` with the headers
/// `Idempotency-Key`, `X-Delayq-Attempt` and, when a secret is set,
/// `X-Delayq-Signature: sha256=<hex HMAC-SHA256 of the body>`. 2xx acknowledges; anything
/// else, a connection error or a timeout is a retryable failure (a `Retry-After` in seconds
/// is honoured).
#[derive(Debug, Clone)]
pub struct Webhook {
    http: reqwest::Client,
    url: String,
    secret: Option<Vec<u8>>,
}

/// The longest `Retry-After` honoured (one hour): a partner cannot park an order for years.
const MAX_RETRY_AFTER_SECS: u64 = 3600;

/// The one rule for a webhook URL: an absolute `http://` or `https://` URL.
pub fn check_webhook_url(url: &str) -> std::result::Result<(), String> {
    let ok = url.starts_with("http://") || url.starts_with("https://");
    if !ok || reqwest::Url::parse(url).is_err() {
        return Err(format!("{url:?} is not an http(s) URL"));
    }
    Ok(())
}

impl Webhook {
    /// A webhook handler posting to `url` with a per-request `timeout`. Redirects are never
    /// followed: a 3xx answer is a failed attempt (the configured endpoint did not take the
    /// order).
    pub fn new(url: &str, secret: Option<&str>, timeout: Duration) -> Result<Self> {
        check_webhook_url(url).map_err(|reason| crate::error::InvalidInput::Option {
            name: "url",
            reason,
        })?;
        // TLS through rustls with the ring provider (no C toolchain needed).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Io {
                context: "building the webhook client".into(),
                source: std::io::Error::other(e),
            })?;
        Ok(Webhook {
            http,
            url: url.to_owned(),
            secret: secret.map(|s| s.as_bytes().to_vec()),
        })
    }

    /// The JSON body sent for `d`.
    pub fn body(d: &Delivery) -> Vec<u8> {
        serde_json::json!({
            "queue": d.queue,
            "id": d.id,
            "group": d.group,
            "due_at_ms": d.due_at_ms,
            "payload": d.payload,
            "attempt": d.attempt,
        })
        .to_string()
        .into_bytes()
    }

    /// `sha256=<hex HMAC-SHA256(secret, body)>`.
    pub fn signature(secret: &[u8], body: &[u8]) -> String {
        // HMAC accepts keys of any length.
        let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
            Ok(m) => m,
            Err(_) => return String::new(),
        };
        mac.update(body);
        format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
    }

    /// The idempotency key of a delivery: hex SHA-256 of `queue \n id \n due_at_ms`, stable
    /// across attempts and replays of the same order and due time (and header-safe whatever
    /// the id holds).
    pub fn idempotency_key(d: &Delivery) -> String {
        let mut h = Sha256::new();
        h.update(d.queue.as_bytes());
        h.update(b"\n");
        h.update(d.id.as_bytes());
        h.update(b"\n");
        h.update(d.due_at_ms.to_string().as_bytes());
        hex::encode(h.finalize())
    }

    async fn call(&self, d: &Delivery) -> HandlerResult {
        let body = Self::body(d);
        let mut req = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("idempotency-key", Self::idempotency_key(d))
            .header("x-delayq-attempt", d.attempt.to_string());
        if let Some(secret) = &self.secret {
            req = req.header("x-delayq-signature", Self::signature(secret, &body));
        }
        let resp = req
            .body(body)
            .send()
            .await
            .map_err(|e| HandlerError::retry(format!("webhook request failed: {e}")))?;
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
                .map(|l| l.split(['?', '#']).next().unwrap_or_default().to_owned())
                .unwrap_or_default();
            format!("webhook answered {status} (redirect to {to:?} not followed)")
        } else {
            format!("webhook answered {status}")
        };
        Err(match after {
            Some(a) => HandlerError::retry_after(msg, a),
            None => HandlerError::retry(msg),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderMap;
    use std::sync::{Arc, Mutex};

    fn delivery() -> Delivery {
        Delivery {
            queue: "order-close".into(),
            group: "close-order".into(),
            id: "o1".into(),
            payload: serde_json::json!({"amount_cents": 1999}),
            due_at_ms: 1_800_000_000_000,
            enqueued_at_ms: Some(1_799_999_000_000),
            dispatched_at_ms: 1_800_000_000_001,
            entry_id: "1800000000001-0".into(),
            shard: 0,
            attempt: 3,
            flag: None,
        }
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
                &format!("http://127.0.0.1:{port}/{path}"),
                Some("k"),
                Duration::from_secs(5),
            )
            .unwrap();
            match w.call(&delivery()).await {
                Err(HandlerError::Retry { message, .. }) => {
                    assert!(message.contains("not followed"), "{message}");
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
            None,
            Duration::from_secs(5),
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
    fn signature_is_hex_hmac_sha256() {
        // RFC 4231 test case 2.
        assert_eq!(
            Webhook::signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn idempotency_key_is_stable_per_queue_id_and_due_time() {
        let a = delivery();
        let mut b = delivery();
        b.attempt = 9;
        b.entry_id = "1800000009999-0".into();
        assert_eq!(Webhook::idempotency_key(&a), Webhook::idempotency_key(&b));
        b.due_at_ms += 1;
        assert_ne!(Webhook::idempotency_key(&a), Webhook::idempotency_key(&b));
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
            None,
            Duration::from_secs(5),
        )
        .unwrap();
        Builtin::Webhook(w).handle(delivery()).await.unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert!(seen[0].get("x-delayq-signature").is_none());
        assert_eq!(seen[0]["x-delayq-attempt"], "3");
        assert_eq!(seen[0]["content-type"], "application/json");
    }
}
