//! The web dashboard, served by `delayq serve` under `/ui/` from assets embedded in the
//! binary (nothing fetched at run time).
//!
//! - [`session`]: sign-in with a bearer token, then a signed `HttpOnly`, `SameSite=Strict`
//!   session cookie; CSRF tokens for changes.
//! - [`timing`]: the in-process ring buffer behind the throughput and lateness charts.
//!
//! The page is one HTML document with its script and style sheet (`assets/`); it reads and
//! changes everything through the same `/v1` API and engine calls as every other client, its
//! session cookie standing in for the bearer token. Every text from Redis (order ids,
//! payloads, errors) is put in the page as text, never as markup, and a strict Content
//! Security Policy allows only the page's own script and style.

pub mod session;
pub mod timing;

use crate::service::http::edge::{cross_origin, token_ok};
use crate::service::http::{ApiError, AppState, Session, session_unknown};
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

/// The page.
const INDEX_HTML: &str = include_str!("assets/index.html");
/// Its script: `app.js`, then the pages kept in files of their own (one script, so they
/// share its helpers).
const APP_JS: &str = concat!(
    include_str!("assets/app.js"),
    include_str!("assets/tags.js")
);
/// Its style sheet.
const APP_CSS: &str = include_str!("assets/app.css");

/// Bytes of the dashboard's HTML, CSS and JS together (the page weight).
pub fn page_weight() -> usize {
    INDEX_HTML.len() + APP_JS.len() + APP_CSS.len()
}

/// The dashboard's routes.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(index))
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/ui/app.css",
            get(|| async { asset("text/css; charset=utf-8", APP_CSS) }),
        )
        .route("/ui/session", get(session_info))
        .route("/ui/login", post(login))
        .route("/ui/logout", post(logout))
        .layer(middleware::from_fn(security_headers))
}

/// Only the page's own script, style and API: no inline script, no frames, no other origin.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

async fn security_headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    for (k, v) in [
        ("content-security-policy", CSP),
        ("x-frame-options", "DENY"),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("cache-control", "no-store"),
    ] {
        h.insert(k, HeaderValue::from_static(v));
    }
    resp
}

async fn index() -> Response {
    asset(
        "text/html; charset=utf-8",
        &INDEX_HTML.replace("{{version}}", env!("CARGO_PKG_VERSION")),
    )
}

fn asset(content_type: &'static str, body: &str) -> Response {
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
        body.to_owned(),
    )
        .into_response()
}

/// What the page learns about its session.
#[derive(Debug, Serialize)]
struct SessionInfo {
    /// No tokens are configured: the API and the dashboard are open.
    open: bool,
    /// A valid session cookie came with the request.
    signed_in: bool,
    /// The session's CSRF token, to send in `X-CSRF-Token` with changes.
    csrf: Option<String>,
}

async fn session_info(State(st): State<AppState>, headers: HeaderMap) -> Response {
    let open = st.tokens.is_empty();
    let now = st.client.now_ms();
    // An open API needs no session and trusts none (its signing key would be public).
    let mut cookie = if open {
        None
    } else {
        session::from_headers(&headers)
    };
    if let Some(c) = &cookie {
        match st.session_ok(c, now).await {
            Session::Live => {}
            Session::None => cookie = None,
            // Redis cannot say whether it was signed out: never a session (the page says
            // that Redis is unreachable).
            Session::Unknown => return session_unknown(),
        }
    }
    let csrf = cookie.as_deref().map(|c| st.sessions.csrf(c));
    axum::Json(SessionInfo {
        open,
        signed_in: cookie.is_some(),
        csrf,
    })
    .into_response()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginBody {
    token: String,
}

/// `POST /ui/login {"token"}`: 204 with the session cookie (no cookie on an open API: there
/// is nothing to sign in to), 401 for a wrong token (the
/// token is never logged), 429 after too many failures in a minute.
async fn login(State(st): State<AppState>, req: axum::extract::Request) -> Response {
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    if cross_origin(&headers) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "cross_origin",
            "requests from another origin are refused",
        )
        .into_response();
    }
    let client = crate::service::http::clients::client_of(
        &parts.extensions,
        &headers,
        &st.limits.trusted_proxies,
    );
    if st.auth_failures.blocked(client) {
        return crate::service::http::edge::too_many();
    }
    // The one body rule: a small body (a token), whole within the body deadline, or the
    // request is refused (408, 413) and its connection freed.
    let body = match crate::service::http::edge::read_limited(
        body,
        crate::service::http::limits::LOGIN_MAX_BODY_BYTES,
        st.limits.body_timeout,
    )
    .await
    {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let Ok(b) = serde_json::from_slice::<LoginBody>(&body) else {
        return ApiError::bad("invalid_body", "expected {\"token\": \"...\"}").into_response();
    };
    if st.tokens.is_empty() {
        // An open API: nothing to sign in to, and no cookie issued.
        return StatusCode::NO_CONTENT.into_response();
    }
    let now = st.client.now_ms();
    if token_ok(&st.tokens, &b.token) {
        let value = st.sessions.issue(now);
        let mut resp = StatusCode::NO_CONTENT.into_response();
        if let Ok(v) =
            HeaderValue::from_str(&session::set_cookie(&value, session::over_https(&headers)))
        {
            resp.headers_mut().insert(header::SET_COOKIE, v);
        }
        return resp;
    }
    crate::service::http::edge::auth_failed(&st, client, "one of the configured tokens")
}

async fn logout(State(st): State<AppState>, headers: HeaderMap) -> Response {
    if cross_origin(&headers) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "cross_origin",
            "requests from another origin are refused",
        )
        .into_response();
    }
    // Revoke the session itself, not only the browser's copy: a copied cookie stops
    // working too (everywhere: every process checks Redis).
    let now = st.client.now_ms();
    if let Some(cookie) = session::from_headers(&headers)
        && st.sessions.valid(&cookie, now)
        && let Some((nonce, expires_s)) = session::Sessions::nonce_and_expiry(&cookie)
    {
        let client = &st.client;
        let ttl_ms = (expires_s * 1000 - now).max(1000);
        let r: redis::RedisResult<()> = redis::cmd("SET")
            .arg(client.keyspace().ui_revoked(nonce))
            .arg(1)
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut client.connection())
            .await;
        if let Err(e) = r {
            tracing::warn!(error = %e, "revoking the session failed");
            return ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "redis_unavailable",
                "the session could not be revoked; try again",
            )
            .into_response();
        }
    }
    let mut resp = StatusCode::NO_CONTENT.into_response();
    if let Ok(v) = HeaderValue::from_str(&session::clear_cookie(session::over_https(&headers))) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}
