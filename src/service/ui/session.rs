//! Dashboard sign-in. A browser signs in once with one of the configured bearer tokens and
//! then carries a session cookie instead: `HttpOnly` (no script reads it), `SameSite=Strict`
//! (no other site sends it), expiring after [`SESSION_TTL`]. The token itself never reaches
//! a page, a URL or a log.
//!
//! The cookie is `<expires unix s>.<nonce>.<signature>`, signed (HMAC-SHA256) with a key
//! derived from the configured tokens: every `serve` process with the same tokens accepts
//! it, a restart keeps it, and changing the tokens signs everyone out. State-changing
//! requests made with the cookie also need the session's CSRF token in `X-CSRF-Token`
//! (which a page of another site cannot read or send), and the edge refuses cross-origin
//! requests outright.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::time::Duration;

/// The session cookie's name.
pub const COOKIE: &str = "delayq_session";
/// How long a session lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// The header carrying the CSRF token on state-changing requests.
pub const CSRF_HEADER: &str = "x-csrf-token";

/// Issues and checks sessions.
pub struct Sessions {
    key: [u8; 32],
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sessions(..)")
    }
}

impl Sessions {
    /// Sessions signed with a key derived from `tokens`.
    pub fn new(tokens: &[String]) -> Self {
        let mut h = Sha256::new();
        h.update(b"delayq-ui-session\0");
        for t in tokens {
            h.update(t.as_bytes());
            h.update(b"\0");
        }
        Sessions {
            key: h.finalize().into(),
        }
    }

    fn mac(&self, parts: &[&[u8]]) -> String {
        let Ok(mut m) = Hmac::<Sha256>::new_from_slice(&self.key) else {
            return String::new();
        };
        for p in parts {
            m.update(p);
            m.update(b"|");
        }
        B64.encode(m.finalize().into_bytes())
    }

    /// A new session cookie value, valid until `now_ms` + [`SESSION_TTL`].
    pub fn issue(&self, now_ms: i64) -> String {
        let expires = now_ms.div_euclid(1000) + i64::try_from(SESSION_TTL.as_secs()).unwrap_or(0);
        let nonce = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        let sig = self.mac(&[b"session", expires.to_string().as_bytes(), nonce.as_bytes()]);
        format!("{expires}.{nonce}.{sig}")
    }

    /// Whether `value` is a session this key signed that has not expired at `now_ms`.
    pub fn valid(&self, value: &str, now_ms: i64) -> bool {
        let mut parts = value.split('.');
        let (Some(expires), Some(nonce), Some(sig), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return false;
        };
        let Ok(exp) = expires.parse::<i64>() else {
            return false;
        };
        let want = self.mac(&[b"session", expires.as_bytes(), nonce.as_bytes()]);
        exp > now_ms.div_euclid(1000) && crate::service::http::edge::same_secret(sig, &want)
    }

    /// The nonce of a session value (what a sign-out revokes) and its expiry (unix s).
    pub fn nonce_and_expiry(value: &str) -> Option<(&str, i64)> {
        let mut parts = value.split('.');
        let expires = parts.next()?.parse().ok()?;
        let nonce = parts.next()?;
        Some((nonce, expires))
    }

    /// The CSRF token of session `value`.
    pub fn csrf(&self, value: &str) -> String {
        self.mac(&[b"csrf", value.as_bytes()])
    }

    /// Whether `given` is the CSRF token of session `value`.
    pub fn csrf_ok(&self, value: &str, given: &str) -> bool {
        crate::service::http::edge::same_secret(given, &self.csrf(value))
    }
}

/// Whether the browser reached the page over HTTPS (behind a TLS-terminating proxy): its
/// `Origin` is `https://...`, or the proxy says `X-Forwarded-Proto: https`. The cookie is
/// then marked `Secure`, so it is never sent over plain HTTP; over plain HTTP (a local
/// `serve`) a `Secure` cookie would not be stored at all.
pub fn over_https(headers: &axum::http::HeaderMap) -> bool {
    let is = |name: &str, f: fn(&str) -> bool| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(f)
    };
    is("origin", |o| {
        o.get(..8)
            .is_some_and(|p| p.eq_ignore_ascii_case("https://"))
    }) || is("x-forwarded-proto", |p| {
        p.trim().eq_ignore_ascii_case("https")
    })
}

/// The attributes every session cookie carries.
fn attributes(secure: bool) -> &'static str {
    if secure {
        "Path=/; HttpOnly; SameSite=Strict; Secure"
    } else {
        "Path=/; HttpOnly; SameSite=Strict"
    }
}

/// The `Set-Cookie` value for session `value` (`secure`: see [`over_https`]).
pub fn set_cookie(value: &str, secure: bool) -> String {
    format!(
        "{COOKIE}={value}; {}; Max-Age={}",
        attributes(secure),
        SESSION_TTL.as_secs()
    )
}

/// The `Set-Cookie` value that ends the session in the browser.
pub fn clear_cookie(secure: bool) -> String {
    format!("{COOKIE}=; {}; Max-Age=0", attributes(secure))
}

/// The session cookie's value in a request's `Cookie` headers.
pub fn from_headers(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_secure_when_the_browser_came_over_https() {
        use axum::http::{HeaderMap, HeaderValue};
        let with = |name: &'static str, v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_static(v));
            h
        };
        assert!(over_https(&with("origin", "https://ops.example.com")));
        assert!(over_https(&with("origin", "HTTPS://ops.example.com")));
        assert!(over_https(&with("x-forwarded-proto", "https")));
        assert!(!over_https(&with("origin", "http://127.0.0.1:8080")));
        assert!(!over_https(&with("x-forwarded-proto", "http")));
        assert!(!over_https(&HeaderMap::new()));
        assert!(set_cookie("v", true).contains("; Secure;"));
        assert!(!set_cookie("v", false).contains("Secure"));
        assert!(clear_cookie(true).contains("; Secure;"));
        assert!(set_cookie("v", false).contains("HttpOnly; SameSite=Strict"));
    }

    #[test]
    fn sessions_are_signed_expire_and_follow_the_tokens() {
        let s = Sessions::new(&["token-one-123".into()]);
        let now = 1_800_000_000_000;
        let v = s.issue(now);
        assert!(s.valid(&v, now));
        assert!(!s.valid(&v, now + 13 * 3_600_000), "expired");
        assert!(!s.valid(&v.replace('.', "x"), now));
        let mut forged = v.clone();
        forged.insert(0, '9');
        assert!(!s.valid(&forged, now), "a longer expiry is not signed");
        assert!(!Sessions::new(&["other-token-9".into()]).valid(&v, now));
        assert!(s.csrf_ok(&v, &s.csrf(&v)));
        assert!(!s.csrf_ok(&v, &s.csrf(&s.issue(now))));
        let mut h = axum::http::HeaderMap::new();
        h.insert("cookie", format!("a=b; {COOKIE}={v}").parse().unwrap());
        assert_eq!(from_headers(&h), Some(v));
    }
}
