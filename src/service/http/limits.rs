//! [`HttpLimits`]: what the HTTP edge allows a client, with the one place their defaults
//! and ranges are written (the `[http]` config keys map onto it).

use crate::engine::error::InvalidInput;
use std::time::Duration;

/// The HTTP edge's limits; in `serve`'s configuration, keys of `[http]`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct HttpLimits {
    /// Largest request body, bytes (413 above; default 1 MiB).
    pub max_body_bytes: usize,
    /// A request's head (request line and headers) must arrive within this once its first
    /// byte did, or the connection is closed (default `10s`).
    #[serde(with = "crate::engine::duration::human")]
    pub header_timeout: Duration,
    /// A request's whole body must arrive within this (408 `body_timeout`; default `30s`).
    #[serde(with = "crate::engine::duration::human")]
    pub body_timeout: Duration,
    /// A keep-alive connection with no request in progress is closed after this (default
    /// `60s`).
    #[serde(with = "crate::engine::duration::human")]
    pub idle_timeout: Duration,
    /// A connection whose client takes no byte of its response for this long (the socket
    /// stays full) is closed, in any phase (default `30s`): a client that asks and never
    /// reads holds its response's memory at most this long.
    #[serde(with = "crate::engine::duration::human")]
    pub write_timeout: Duration,
    /// A request's handling (after its body arrived) is cut off after this (503; default
    /// `30s`).
    #[serde(with = "crate::engine::duration::human")]
    pub request_timeout: Duration,
    /// Connections served at once (default 10,000): beyond it new connections wait in the
    /// listen backlog; the effective cap also stays under the process's open-files limit.
    pub max_connections: usize,
    /// Host names (the `Host` header without its port) a request may name: any other is
    /// refused with 421 before routing, so a page that rebinds its own name to this address
    /// (DNS rebinding) cannot drive the API. Default: `localhost`, `127.0.0.1`, `[::1]` and
    /// the listen address; `"*"` allows any (behind a proxy that checks it). `/healthz` and
    /// `/readyz` answer whatever the host (orchestrators probe by address).
    pub allowed_hosts: Vec<String>,
    /// Peers whose `X-Forwarded-For` is believed (reverse proxies, by IP address): the
    /// client of a request is then the last address in that header that is not one of them.
    #[serde(deserialize_with = "ip_addresses")]
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// A bearer token `/metrics` requires (default: none, `/metrics` is open; at least 8
    /// characters, no spaces); never printed, `Debug` included.
    #[serde(deserialize_with = "metrics_token")]
    pub metrics_token: Option<MetricsToken>,
}

/// `trusted_proxies = ["10.0.0.1", ...]`: each an IP address, refused at its index.
fn ip_addresses<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<std::net::IpAddr>, D::Error> {
    struct Ip(std::net::IpAddr);
    impl<'de> serde::Deserialize<'de> for Ip {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            crate::engine::duration::human::from_text(d, |p| {
                p.parse().map(Ip).map_err(|_| InvalidInput::Option {
                    name: "trusted_proxies",
                    reason: format!("{p:?} is not an IP address"),
                })
            })
        }
    }
    let list: Vec<Ip> = serde::Deserialize::deserialize(d)?;
    Ok(list.into_iter().map(|Ip(ip)| ip).collect())
}

/// `metrics_token = "..."`: at least 8 characters, no spaces.
fn metrics_token<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<MetricsToken>, D::Error> {
    crate::engine::duration::human::from_text(d, |t| {
        if t.trim().len() < 8 || t.chars().any(char::is_whitespace) {
            return Err(InvalidInput::Option {
                name: "metrics_token",
                reason: "must be at least 8 characters, without spaces".into(),
            });
        }
        Ok(Some(MetricsToken(t.to_owned())))
    })
}

/// The `/metrics` token: compared in constant time, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct MetricsToken(pub String);

impl std::fmt::Debug for MetricsToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MetricsToken(hidden)")
    }
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_body_bytes: 1 << 20,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(30),
            max_connections: 10_000,
            allowed_hosts: DEFAULT_ALLOWED_HOSTS
                .iter()
                .map(|h| (*h).to_owned())
                .collect(),
            trusted_proxies: Vec::new(),
            metrics_token: None,
        }
    }
}

/// The hosts always allowed (with the listen address).
pub const DEFAULT_ALLOWED_HOSTS: &[&str] = &["localhost", "127.0.0.1", "[::1]"];

/// A request body of `POST /ui/login` (a token in JSON) is at most this many bytes.
pub const LOGIN_MAX_BODY_BYTES: usize = 4096;

/// Longest request target (path and query) accepted, bytes (414 above).
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// Most request header bytes accepted (431 above, in the error envelope).
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Most request headers accepted (431 above, in the error envelope).
pub const MAX_HEADERS: usize = 100;

impl HttpLimits {
    /// Sets the body limit.
    pub fn max_body_bytes(mut self, n: usize) -> Self {
        self.max_body_bytes = n;
        self
    }

    /// Sets the header timeout.
    pub fn header_timeout(mut self, d: Duration) -> Self {
        self.header_timeout = d;
        self
    }

    /// Sets the body timeout.
    pub fn body_timeout(mut self, d: Duration) -> Self {
        self.body_timeout = d;
        self
    }

    /// Sets the keep-alive idle timeout.
    pub fn idle_timeout(mut self, d: Duration) -> Self {
        self.idle_timeout = d;
        self
    }

    /// Sets the write timeout.
    pub fn write_timeout(mut self, d: Duration) -> Self {
        self.write_timeout = d;
        self
    }

    /// Sets the request timeout.
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    /// Sets the connection cap.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n;
        self
    }

    /// Allows the listen address's host too (what a client naming the address sends).
    pub fn allow_listen_host(mut self, listen: std::net::SocketAddr) -> Self {
        let host = match listen.ip() {
            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            std::net::IpAddr::V4(ip) => ip.to_string(),
        };
        if !listen.ip().is_unspecified() && !self.allowed_hosts.contains(&host) {
            self.allowed_hosts.push(host);
        }
        self
    }

    /// Whether a `Host` header value names an allowed host (its port is not compared). A
    /// request without one is not from a browser and passes.
    pub fn host_allowed(&self, host: Option<&str>) -> bool {
        if self.allowed_hosts.iter().any(|h| h == "*") {
            return true;
        }
        // No Host at all: not a browser (every browser sends one), so no rebinding page.
        let Some(host) = host else { return true };
        let name = if host.starts_with('[') {
            host.split_inclusive(']').next().unwrap_or(host)
        } else {
            host.rsplit_once(':').map_or(host, |(n, _)| n)
        };
        self.allowed_hosts
            .iter()
            .any(|h| h.eq_ignore_ascii_case(name))
    }

    /// Checks every limit (the one place their ranges are written).
    pub fn validate(&self) -> Result<(), InvalidInput> {
        let bad = |name: &'static str, reason: String| Err(InvalidInput::Option { name, reason });
        if !(1024..=1 << 30).contains(&self.max_body_bytes) {
            return bad("max_body_bytes", "must be 1024..=1073741824".into());
        }
        for (name, d) in [
            ("header_timeout", self.header_timeout),
            ("body_timeout", self.body_timeout),
            ("idle_timeout", self.idle_timeout),
            ("write_timeout", self.write_timeout),
            ("request_timeout", self.request_timeout),
        ] {
            if d < Duration::from_millis(100) || d > Duration::from_secs(3600) {
                return bad(name, "must be 100ms..=1h".into());
            }
        }
        if !(1..=1_000_000).contains(&self.max_connections) {
            return bad("max_connections", "must be 1..=1000000".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_ranges_hold() {
        assert!(HttpLimits::default().validate().is_ok());
        assert!(HttpLimits::default().max_body_bytes(10).validate().is_err());
        assert!(
            HttpLimits::default()
                .header_timeout(Duration::ZERO)
                .validate()
                .is_err()
        );
        assert!(HttpLimits::default().max_connections(0).validate().is_err());
    }

    #[test]
    fn hosts_are_compared_without_their_port() {
        let l = HttpLimits::default().allow_listen_host("10.0.0.5:7070".parse().unwrap());
        assert!(l.host_allowed(Some("localhost:7070")));
        assert!(l.host_allowed(Some("127.0.0.1")));
        assert!(l.host_allowed(Some("[::1]:7070")));
        assert!(l.host_allowed(Some("10.0.0.5:7070")));
        assert!(!l.host_allowed(Some("evil.example:7070")));
        assert!(!l.host_allowed(Some("localhost.evil.example")));
        assert!(l.host_allowed(None), "no Host: not a browser");
        let any = HttpLimits {
            allowed_hosts: vec!["*".into()],
            ..HttpLimits::default()
        };
        assert!(any.host_allowed(Some("evil.example")));
    }
}
