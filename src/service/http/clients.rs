//! Who is calling, and how often they failed to authenticate.
//!
//! Failed authentications (a wrong bearer token on `/v1`, a wrong token at `POST
//! /ui/login`) are counted per client in one-minute windows: a client past
//! [`PER_CLIENT`] failures gets 429 until its window ends, whatever it sends; other clients
//! are not affected (a correct token from elsewhere still works). A global ceiling
//! ([`GLOBAL`]) bounds what many addresses together may try. The client is the peer
//! address, or, when the peer is one of `http.trusted_proxies`, the last address of
//! `X-Forwarded-For` that is not a trusted proxy. The map is bounded ([`MAX_CLIENTS`]):
//! beyond it new clients share one bucket.

use axum::extract::ConnectInfo;
use axum::http::HeaderMap;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failed authentications a client may make per window before it is refused (429).
pub const PER_CLIENT: u32 = 20;
/// Failed authentications all clients together may make per window.
pub const GLOBAL: u32 = 2_000;
/// The window.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Clients tracked at once; beyond, new ones share the overflow bucket.
pub const MAX_CLIENTS: usize = 10_000;

/// The bucket of clients that cannot be told apart (no peer address, or the map is full).
const OVERFLOW: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

/// The client of a request (see the module docs); `None` without a peer address (a request
/// driven in-process, as the tests do).
pub fn client_of(
    extensions: &axum::http::Extensions,
    headers: &HeaderMap,
    trusted: &[IpAddr],
) -> Option<IpAddr> {
    let peer = extensions.get::<ConnectInfo<SocketAddr>>()?.0.ip();
    if !trusted.contains(&peer) {
        return Some(peer);
    }
    let forwarded = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|a| a.trim().parse::<IpAddr>().ok())
        .collect::<Vec<_>>();
    Some(
        forwarded
            .into_iter()
            .rev()
            .find(|a| !trusted.contains(a))
            .unwrap_or(peer),
    )
}

/// Failed authentications per client. See the module docs.
#[derive(Debug)]
pub struct AuthLimiter {
    inner: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    started: Instant,
    total: u32,
    per_client: HashMap<IpAddr, u32>,
}

/// What [`AuthLimiter::failed`] concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Counted; the client may try again.
    Counted,
    /// This failure used up the client's (or everyone's) allowance: log it once.
    NowBlocked,
    /// Already blocked.
    Blocked,
}

impl Default for AuthLimiter {
    fn default() -> Self {
        AuthLimiter {
            inner: Mutex::new(Window {
                started: Instant::now(),
                total: 0,
                per_client: HashMap::new(),
            }),
        }
    }
}

impl AuthLimiter {
    fn window(&self) -> std::sync::MutexGuard<'_, Window> {
        let mut w = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if w.started.elapsed() >= WINDOW {
            w.started = Instant::now();
            w.total = 0;
            w.per_client.clear();
        }
        w
    }

    /// Whether `client` is refused now (checked before its token).
    pub fn blocked(&self, client: Option<IpAddr>) -> bool {
        let w = self.window();
        let key = client.unwrap_or(OVERFLOW);
        w.total >= GLOBAL || w.per_client.get(&key).is_some_and(|n| *n >= PER_CLIENT)
    }

    /// Counts one failure of `client`.
    pub fn failed(&self, client: Option<IpAddr>) -> Verdict {
        let mut w = self.window();
        let mut key = client.unwrap_or(OVERFLOW);
        if !w.per_client.contains_key(&key) && w.per_client.len() >= MAX_CLIENTS {
            key = OVERFLOW;
        }
        let before_global = w.total;
        w.total = w.total.saturating_add(1);
        let n = w.per_client.entry(key).or_insert(0);
        let before = *n;
        *n = n.saturating_add(1);
        if before >= PER_CLIENT || before_global >= GLOBAL {
            Verdict::Blocked
        } else if *n >= PER_CLIENT || w.total >= GLOBAL {
            Verdict::NowBlocked
        } else {
            Verdict::Counted
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_client_is_blocked_alone() {
        let l = AuthLimiter::default();
        let a: IpAddr = "10.0.0.1".parse().unwrap_or(OVERFLOW);
        let b: IpAddr = "10.0.0.2".parse().unwrap_or(OVERFLOW);
        for i in 1..PER_CLIENT {
            assert_eq!(l.failed(Some(a)), Verdict::Counted, "{i}");
        }
        assert_eq!(l.failed(Some(a)), Verdict::NowBlocked);
        assert!(l.blocked(Some(a)));
        assert_eq!(l.failed(Some(a)), Verdict::Blocked);
        assert!(!l.blocked(Some(b)), "another client is not affected");
    }

    #[test]
    fn the_client_behind_a_trusted_proxy_is_the_forwarded_one() {
        let proxy: IpAddr = "10.0.0.9".parse().unwrap_or(OVERFLOW);
        let mut ext = axum::http::Extensions::new();
        ext.insert(ConnectInfo(SocketAddr::new(proxy, 4000)));
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            "1.2.3.4, 5.6.7.8"
                .parse()
                .unwrap_or(axum::http::HeaderValue::from_static("")),
        );
        assert_eq!(
            client_of(&ext, &h, &[proxy]),
            Some("5.6.7.8".parse().unwrap_or(OVERFLOW))
        );
        // Not trusted: the header is ignored.
        assert_eq!(client_of(&ext, &h, &[]), Some(proxy));
        assert_eq!(client_of(&axum::http::Extensions::new(), &h, &[]), None);
    }
}
