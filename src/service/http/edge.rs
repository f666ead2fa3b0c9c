//! Middleware at the edge, in the order a request meets it:
//!
//! 1. [`envelope`]: any error response that is not JSON yet (a framework rejection: a bad
//!    path, a wrong method, bad UTF-8) is put into the error envelope;
//! 2. [`head_limits`]: request targets over [`MAX_URI_BYTES`] (414) and headers over
//!    [`MAX_HEADERS`] / [`MAX_HEADER_BYTES`] (431) are refused;
//! 3. [`host_check`]: a `Host` outside `http.allowed_hosts` is refused (421);
//! 4. [`auth`] (on `/v1`): bearer tokens, before any body is read; failures limited per
//!    client ([`super::clients`]);
//! 5. [`read_body`]: the whole body is read within `body_timeout` and `max_body_bytes` (408,
//!    413), then the handler runs within `request_timeout` (503).

use super::AppState;
use super::error::ApiError;
use super::limits::{MAX_HEADER_BYTES, MAX_HEADERS, MAX_URI_BYTES};
use crate::engine::duration::format_duration;
use crate::service::ui::session;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

/// Puts error responses that are not JSON into the envelope.
pub(super) async fn envelope(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if status.as_u16() < 400 || json {
        return resp;
    }
    let body = axum::body::to_bytes(resp.into_body(), 4096)
        .await
        .unwrap_or_default();
    ApiError::for_status(status, &String::from_utf8_lossy(&body)).into_response()
}

/// Refuses oversized request targets and headers, in the envelope.
pub(super) async fn head_limits(req: Request, next: Next) -> Response {
    let target = req.uri().path_and_query().map_or(0, |pq| pq.as_str().len());
    if target > MAX_URI_BYTES {
        return ApiError::new(
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            format!("the request target is {target} bytes; at most {MAX_URI_BYTES}"),
        )
        .into_response();
    }
    let headers = req.headers();
    let bytes: usize = headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    if headers.len() > MAX_HEADERS || bytes > MAX_HEADER_BYTES {
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!(
                "{} headers of {bytes} bytes; at most {MAX_HEADERS} headers and {MAX_HEADER_BYTES} bytes",
                headers.len()
            ),
        )
        .into_response();
    }
    next.run(req).await
}

/// The token of an `Authorization: Bearer <token>` header; the scheme is case-insensitive
/// (RFC 7235).
pub(super) fn bearer_token(v: &str) -> Option<&str> {
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// True when `given` is one of `tokens`: compared in constant time against every token,
/// as SHA-256 digests, so neither the position of the first difference nor the length of a
/// token shows in the time taken.
pub(crate) fn token_ok(tokens: &[String], given: &str) -> bool {
    let g = digest(given);
    let mut ok = subtle::Choice::from(0u8);
    for t in tokens {
        ok |= g.ct_eq(&digest(t));
    }
    bool::from(ok)
}

/// Two secrets compared in constant time (as digests: lengths do not show either).
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    bool::from(digest(a).ct_eq(&digest(b)))
}

fn digest(s: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(s.as_bytes()).into()
}

/// Refuses a request naming a host that is not allowed (421), before routing: a page
/// that rebinds its own name to this address cannot reach the API. Health probes answer
/// whatever the host.
pub(super) async fn host_check(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let probe = matches!(req.uri().path(), "/healthz" | "/readyz");
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    if probe || st.limits.host_allowed(host) {
        return next.run(req).await;
    }
    ApiError::new(
        StatusCode::MISDIRECTED_REQUEST,
        "host_not_allowed",
        "this host name is not served here (see http.allowed_hosts)",
    )
    .into_response()
}

/// A refused authentication: counted for its client; 401, or 429 once the client used up
/// its allowance (logged once, with the client's address, never the token). The rule is in
/// [`super::clients`].
pub(crate) fn auth_failed(st: &AppState, client: Option<std::net::IpAddr>, what: &str) -> Response {
    use super::clients::Verdict;
    match st.auth_failures.failed(client) {
        Verdict::Counted => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            format!("{what} is required"),
        )
        .into_response(),
        Verdict::NowBlocked => {
            tracing::warn!(
                client = %client.map_or_else(|| "unknown".to_owned(), |c| c.to_string()),
                "too many failed authentications from this client; refusing it for up to a minute"
            );
            too_many()
        }
        Verdict::CeilingReached => {
            tracing::warn!(
                ceiling = super::clients::GLOBAL,
                "failed authentications from all clients reached the ceiling for this minute: \
                 every client that fails from now on is refused until the minute ends (clients \
                 that have not failed are not)"
            );
            too_many()
        }
        Verdict::Blocked => too_many(),
    }
}

/// 429: too many failed authentications from this client.
pub(crate) fn too_many() -> Response {
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too_many_attempts",
        "too many failed authentications from this client; try again in a minute",
    )
    .into_response()
}

/// True when a browser says the request comes from a page of another origin than this
/// service (an `Origin` that is not this host, `Sec-Fetch-Site: cross-site`). Clients that
/// are not browsers send neither.
pub(crate) fn cross_origin(headers: &axum::http::HeaderMap) -> bool {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if get("sec-fetch-site") == Some("cross-site") {
        return true;
    }
    match (get("origin"), get("host")) {
        (None, _) => false,
        (Some(origin), Some(host)) => {
            origin != format!("http://{host}") && origin != format!("https://{host}")
        }
        (Some(_), None) => true,
    }
}

fn forbidden(code: &'static str, message: &str) -> Response {
    ApiError::new(StatusCode::FORBIDDEN, code, message).into_response()
}

/// Who may call `/v1/...`: a request that would change something from a page of another
/// origin never does (this also guards an open API against cross-site forms); then a valid
/// bearer token, or a dashboard session cookie (with its CSRF token for changes). Open when
/// no tokens are configured.
pub(super) async fn auth(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let write = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if write && cross_origin(req.headers()) {
        return forbidden("cross_origin", "requests from another origin are refused");
    }
    if st.tokens.is_empty() {
        return next.run(req).await;
    }
    let client =
        super::clients::client_of(req.extensions(), req.headers(), &st.limits.trusted_proxies);
    if st.auth_failures.blocked(client) {
        return too_many();
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .unwrap_or("");
    if token_ok(&st.tokens, given) {
        return next.run(req).await;
    }
    if let Some(c) = super::consumers::find(&st.consumer_tokens, given) {
        if super::consumers::allows(c, req.method(), req.uri().path()) {
            return next.run(req).await;
        }
        return forbidden(
            "forbidden_for_token",
            "this consumer token may only receive, ack, nack and extend on its own groups",
        );
    }
    let now = st.client.now_ms();
    let cookie = session::from_headers(req.headers());
    let session = match &cookie {
        Some(c) => st.session_ok(c, now).await,
        None => super::Session::None,
    };
    if session == super::Session::Unknown {
        // Not a failure of the client's: not counted, and never let through.
        return super::session_unknown();
    }
    if let Some(cookie) = cookie
        && session == super::Session::Live
    {
        let csrf = req
            .headers()
            .get(session::CSRF_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if write && !st.sessions.csrf_ok(&cookie, csrf) {
            return forbidden("csrf", "this change needs the session's CSRF token");
        }
        return next.run(req).await;
    }
    auth_failed(&st, client, "a valid bearer token (or a dashboard session)")
}

/// Reads a whole body of at most `max` bytes within `within`; the error answer (408, 413,
/// 400) otherwise. The one body rule of every route that reads a body.
pub(crate) async fn read_limited(
    body: Body,
    max: usize,
    within: std::time::Duration,
) -> Result<axum::body::Bytes, Response> {
    let read = tokio::time::timeout(
        within,
        http_body_util::BodyExt::collect(http_body_util::Limited::new(body, max)),
    )
    .await;
    match read {
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!(
                "the request body did not arrive within {}",
                format_duration(within)
            ),
        )
        .into_response()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("the request body is larger than {max} bytes"),
        )
        .into_response()),
        Ok(Err(_)) => {
            Err(ApiError::bad("invalid_body", "the request body could not be read").into_response())
        }
        Ok(Ok(c)) => Ok(c.to_bytes()),
    }
}

/// Reads the whole body within the body deadline and size limit, then runs the handler
/// within the request deadline. A slow or stalled upload holds a connection and its bytes
/// for at most `body_timeout`.
pub(super) async fn read_body(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let l = &st.limits;
    let (parts, body) = req.into_parts();
    let bytes = match read_limited(body, l.max_body_bytes, l.body_timeout).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let safe = matches!(parts.method, Method::GET | Method::HEAD);
    let req = Request::from_parts(parts, Body::from(bytes));
    match tokio::time::timeout(l.request_timeout, next.run(req)).await {
        Ok(r) => r,
        Err(_) => {
            let took = format_duration(l.request_timeout);
            if safe {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "request_timeout",
                    format!("the request took longer than {took}; try again"),
                )
            } else {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "outcome_unknown",
                    format!(
                        "the request took longer than {took}: a write may or may not have been \
                         applied; repeating it is safe while the order waits (idempotent by id); \
                         once it may have been dispatched, a repeat schedules it again unless the \
                         queue has a dedup_window (then the answer is duplicate)"
                    ),
                )
            }
            .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_scheme_is_case_insensitive_and_tokens_compare_exactly() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bEaReR  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        let tokens = vec!["secret-one".to_owned(), "secret-two".to_owned()];
        assert!(token_ok(&tokens, "secret-two"));
        assert!(!token_ok(&tokens, "secret-tw"));
        assert!(!token_ok(&[], "x"));
    }
}
