//! Who is calling, and how often they failed to authenticate.
//!
//! Failed authentications (a wrong bearer token on `/v1`, a wrong token at `POST
//! /ui/login`, a wrong `metrics_token`) are counted per client in one-minute windows. The
//! rule, stated once: **a client's [`PER_CLIENT`]th failure in a window is answered 429
//! instead of 401, and from then on every request of that client that needs a token is
//! refused with 429, before its token is looked at, until the window ends** (so 19 failures
//! answered 401, then 429s). Other clients are not affected: a client with no failure in
//! the window always reaches the token check, so a correct token from elsewhere always
//! works.
//!
//! Many addresses together are bounded too: once [`GLOBAL`] failures were counted in a
//! window, a client that has already failed in it is refused (429) on its next try, so past
//! the ceiling every address gets one failure a window; a client that has not failed is
//! never refused. The table of clients is bounded ([`MAX_CLIENTS`]): once full, failures of
//! clients not in it are counted in the total only (they are not refused, and cannot lock
//! anyone else out). The client is the peer address, or, when the peer is one of
//! `http.trusted_proxies`, the last address of `X-Forwarded-For` that is not a trusted
//! proxy.

use axum::extract::ConnectInfo;
use axum::http::HeaderMap;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A client's failed authentications per window: the last of them is answered 429, and so is
/// everything the client sends that needs a token until the window ends.
pub const PER_CLIENT: u32 = 20;
/// Failed authentications of all clients together per window after which a client that has
/// failed once in the window is refused (a client that has not failed never is).
pub const GLOBAL: u32 = 2_000;
/// The window.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Clients tracked at once (the memory bound); beyond, failures are only counted in the
/// total.
pub const MAX_CLIENTS: usize = 10_000;

/// The client of requests without a peer address (driven in-process).
const UNKNOWN: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

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
    /// This failure used up the client's allowance: log it once.
    NowBlocked,
    /// This failure reached the ceiling of everyone's failures: log it once a window.
    CeilingReached,
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

    /// Whether `client` is refused now (checked before its token): it reached its own
    /// allowance, or it has failed in this window and everyone's failures together reached
    /// [`GLOBAL`]. A client with no failure in the window is never refused.
    pub fn blocked(&self, client: Option<IpAddr>) -> bool {
        let w = self.window();
        let key = client.unwrap_or(UNKNOWN);
        w.per_client
            .get(&key)
            .is_some_and(|n| *n >= PER_CLIENT || w.total >= GLOBAL)
    }

    /// Counts one failure of `client`.
    pub fn failed(&self, client: Option<IpAddr>) -> Verdict {
        let mut w = self.window();
        let key = client.unwrap_or(UNKNOWN);
        let before_global = w.total;
        w.total = w.total.saturating_add(1);
        if !w.per_client.contains_key(&key) && w.per_client.len() >= MAX_CLIENTS {
            // The table is full: counted in the total only.
            return Verdict::Counted;
        }
        let n = w.per_client.entry(key).or_insert(0);
        let before = *n;
        *n = n.saturating_add(1);
        let now = *n;
        if before >= PER_CLIENT || (before > 0 && before_global >= GLOBAL) {
            Verdict::Blocked
        } else if now >= PER_CLIENT {
            Verdict::NowBlocked
        } else if before_global < GLOBAL && w.total >= GLOBAL {
            Verdict::CeilingReached
        } else if w.total >= GLOBAL {
            Verdict::Blocked
        } else {
            Verdict::Counted
        }
    }

    /// Clients in the table now (at most [`MAX_CLIENTS`]).
    pub fn tracked(&self) -> usize {
        self.window().per_client.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_client_is_blocked_alone() {
        let l = AuthLimiter::default();
        let a: IpAddr = "10.0.0.1".parse().unwrap_or(UNKNOWN);
        let b: IpAddr = "10.0.0.2".parse().unwrap_or(UNKNOWN);
        for i in 1..PER_CLIENT {
            assert_eq!(l.failed(Some(a)), Verdict::Counted, "{i}");
        }
        assert_eq!(l.failed(Some(a)), Verdict::NowBlocked);
        assert!(l.blocked(Some(a)));
        assert_eq!(l.failed(Some(a)), Verdict::Blocked);
        assert!(!l.blocked(Some(b)), "another client is not affected");
    }

    fn addr(i: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i))
    }

    #[test]
    fn the_ceiling_refuses_only_clients_that_failed_and_the_table_stays_bounded() {
        let l = AuthLimiter::default();
        let per = PER_CLIENT - 1; // each stays under its own allowance
        let n = GLOBAL.div_ceil(per);
        let mut verdicts = std::collections::BTreeMap::new();
        for i in 0..n {
            for _ in 0..per {
                *verdicts
                    .entry(format!("{:?}", l.failed(Some(addr(i)))))
                    .or_insert(0) += 1;
            }
        }
        assert_eq!(verdicts.get("CeilingReached"), Some(&1), "{verdicts:?}");
        // Every client that failed is refused now; one that did not is not.
        assert!(l.blocked(Some(addr(0))));
        assert!(
            !l.blocked(Some(addr(n))),
            "a fresh client reaches the token check"
        );
        assert!(!l.blocked(None));
        // Its first failure past the ceiling is refused, and it is then blocked.
        assert_eq!(l.failed(Some(addr(n))), Verdict::Blocked);
        assert!(l.blocked(Some(addr(n))));
        // The table never grows past its bound; clients beyond it are never refused.
        for i in 0..u32::try_from(MAX_CLIENTS).unwrap_or(u32::MAX) + 50 {
            l.failed(Some(addr(1_000_000 + i)));
        }
        assert_eq!(l.tracked(), MAX_CLIENTS);
        let beyond = addr(5_000_000);
        for _ in 0..PER_CLIENT * 2 {
            assert_eq!(l.failed(Some(beyond)), Verdict::Counted);
        }
        assert!(!l.blocked(Some(beyond)));
    }

    #[test]
    fn the_client_behind_a_trusted_proxy_is_the_forwarded_one() {
        let proxy: IpAddr = "10.0.0.9".parse().unwrap_or(UNKNOWN);
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
            Some("5.6.7.8".parse().unwrap_or(UNKNOWN))
        );
        // Not trusted: the header is ignored.
        assert_eq!(client_of(&ext, &h, &[]), Some(proxy));
        assert_eq!(client_of(&axum::http::Extensions::new(), &h, &[]), None);
    }
}
