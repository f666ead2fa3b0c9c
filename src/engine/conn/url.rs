//! Parsing Redis URLs: their parts, the sentinel parameters, percent-encoding.

use super::ClusterSeeds;
use super::sentinel::{SentinelTarget, Watch};
use super::tls::{TlsFile, TlsFiles};
use redis::{IntoConnectionInfo, TlsCertificates};
use std::path::PathBuf;

/// The sentinel-only query parameters.
#[derive(Debug, Clone, Default)]
pub(super) struct SentinelParams {
    pub(super) db: Option<i64>,
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
}

/// A Redis URL split into what delayq reads and what the redis crate reads.
pub(super) struct UrlParts {
    /// `redis`, `rediss+cluster`, ...
    pub(super) scheme: String,
    /// Between `://` and the query or fragment.
    pub(super) rest: String,
    /// Query parameters left for the redis crate (`protocol=resp3`), as written.
    pub(super) passthrough: Vec<String>,
    /// The fragment (`insecure`), as written.
    pub(super) fragment: Option<String>,
    /// The TLS files the URL names.
    pub(super) tls: TlsFiles,
    /// Sentinel parameters, when any is given.
    pub(super) sentinel: Option<SentinelParams>,
}

impl UrlParts {
    pub(super) fn parse(url: &str) -> Result<UrlParts, String> {
        let Some((scheme, after)) = url.split_once("://") else {
            return Err("not a URL: it needs a scheme such as redis://".into());
        };
        let scheme = scheme.to_ascii_lowercase();
        let (before_fragment, fragment) = match after.split_once('#') {
            Some((b, f)) => (b, Some(f.to_owned())),
            None => (after, None),
        };
        let (rest, query) = match before_fragment.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (before_fragment, None),
        };
        let mut parts = UrlParts {
            scheme,
            rest: rest.to_owned(),
            passthrough: Vec::new(),
            fragment,
            tls: TlsFiles::default(),
            sentinel: None,
        };
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let key = percent_decode(k)?;
            let value = || percent_decode(v);
            let file = match key.as_str() {
                "tls_ca" => Some(TlsFile::Ca),
                "tls_cert" => Some(TlsFile::Cert),
                "tls_key" => Some(TlsFile::Key),
                _ => None,
            };
            if let Some(which) = file {
                let v = value()?;
                if v.is_empty() {
                    return Err(format!("{key} needs a file path"));
                }
                if parts.tls.get(which).is_some() {
                    return Err(format!("{key} is given twice"));
                }
                *parts.tls.slot(which) = Some(PathBuf::from(v));
                continue;
            }
            let sentinel = parts.scheme.ends_with("+sentinel");
            match key.as_str() {
                "db" if sentinel => {
                    let db = value()?
                        .parse::<i64>()
                        .ok()
                        .filter(|d| *d >= 0)
                        .ok_or("db must be a database number")?;
                    parts.sentinel.get_or_insert_default().db = Some(db);
                }
                "sentinel_username" => {
                    parts.sentinel.get_or_insert_default().username = Some(value()?);
                }
                "sentinel_password" => {
                    parts.sentinel.get_or_insert_default().password = Some(value()?);
                }
                k if k.starts_with("tls_") || k.starts_with("sentinel_") => {
                    return Err(format!(
                        "unknown query parameter {k:?} (known: tls_ca, tls_cert, tls_key, \
                         db, sentinel_username, sentinel_password)"
                    ));
                }
                _ => parts.passthrough.push(pair.to_owned()),
            }
        }
        Ok(parts)
    }

    /// True for a TLS scheme.
    pub(super) fn is_tls(&self) -> bool {
        matches!(
            self.scheme.as_str(),
            "rediss" | "valkeys" | "rediss+cluster" | "rediss+sentinel"
        )
    }

    /// The plain scheme of each node: `redis` or `rediss`.
    pub(super) fn node_scheme(&self) -> &'static str {
        if self.is_tls() { "rediss" } else { "redis" }
    }

    /// The URL as the redis crate reads it: without delayq's query parameters.
    pub(super) fn plain_url(&self) -> String {
        let mut out = format!("{}://{}", self.scheme, self.rest);
        if !self.passthrough.is_empty() {
            out.push('?');
            out.push_str(&self.passthrough.join("&"));
        }
        if let Some(f) = &self.fragment {
            out.push('#');
            out.push_str(f);
        }
        out
    }

    /// `user:pass@` (as written) and the rest.
    pub(super) fn split_auth(rest: &str) -> (Option<&str>, &str) {
        match rest.rsplit_once('@') {
            Some((a, h)) => (Some(a), h),
            None => (None, rest),
        }
    }

    pub(super) fn cluster(&self, certs: Option<TlsCertificates>) -> Result<ClusterSeeds, String> {
        if self.fragment.is_some() {
            return Err("a cluster URL takes no #fragment".into());
        }
        let (auth, hosts) = Self::split_auth(&self.rest);
        let auth = auth.map(|a| format!("{a}@")).unwrap_or_default();
        let plain = format!("{}://", self.node_scheme());
        // The redis crate's own parameters (`protocol=resp3`) go to every node.
        let query = if self.passthrough.is_empty() {
            String::new()
        } else {
            format!("/?{}", self.passthrough.join("&"))
        };
        let nodes: Vec<String> = hosts
            .trim_end_matches('/')
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|h| format!("{plain}{auth}{h}{query}"))
            .collect();
        if nodes.is_empty() {
            return Err("a cluster URL needs at least one host:port".into());
        }
        for n in &nodes {
            redis::Client::open(n.as_str()).map_err(|e| e.to_string())?;
        }
        Ok(ClusterSeeds { nodes, certs })
    }

    pub(super) fn sentinel(
        &self,
        certs: Option<TlsCertificates>,
    ) -> Result<SentinelTarget, String> {
        if self.fragment.is_some() {
            return Err("a sentinel URL takes no #fragment".into());
        }
        if !self.passthrough.is_empty() {
            return Err("a sentinel URL takes only the query parameters db, \
                 sentinel_username, sentinel_password, tls_ca, tls_cert, tls_key"
                .into());
        }
        let (authority, path) = self.rest.split_once('/').unwrap_or((&self.rest, ""));
        let master_name = percent_decode(path.trim_matches('/'))?;
        if master_name.is_empty()
            || !master_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err("a sentinel URL names the master after the hosts: \
                 redis+sentinel://host:26379,host:26379/<master-name> (A-Z a-z 0-9 - _ .)"
                .into());
        }
        let (auth, hosts) = Self::split_auth(authority);
        let scheme = self.node_scheme();
        let params = self.sentinel.clone().unwrap_or_default();
        let mut sentinels = Vec::new();
        for (i, h) in hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .enumerate()
        {
            let h = if h.rsplit_once(':').is_some_and(|(_, p)| !p.contains(']')) {
                h.to_owned()
            } else {
                format!("{h}:26379")
            };
            let info = format!("{scheme}://{h}")
                .into_connection_info()
                // Not the host's text: a mistyped URL may put a credential there.
                .map_err(|e| format!("sentinel host #{} of the URL: {e}", i + 1))?;
            let mut redis = info.redis_settings().clone();
            if let Some(u) = &params.username {
                redis = redis.set_username(u);
            }
            if let Some(p) = &params.password {
                redis = redis.set_password(p);
            }
            sentinels.push(info.set_redis_settings(redis));
        }
        if sentinels.is_empty() {
            return Err("a sentinel URL needs at least one sentinel host:port".into());
        }
        // The master's credentials and database, on a placeholder address replaced by the
        // one the sentinels give.
        let auth = auth.map(|a| format!("{a}@")).unwrap_or_default();
        let db = params.db.unwrap_or(0);
        let master = format!("{scheme}://{auth}localhost:6379/{db}")
            .into_connection_info()
            .map_err(|e| e.to_string())?;
        Ok(SentinelTarget {
            master_name,
            sentinels,
            master,
            tls: self.is_tls(),
            certs,
            watch: Watch::default(),
        })
    }
}

/// `s` with every byte outside `A-Z a-z 0-9 - . _ ~ /` percent-encoded.
pub(super) fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Decodes `%XX` escapes and `+` (a space), as query strings are written.
pub(super) fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = s
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or("a bad %-escape in the URL")?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| "a %-escape in the URL is not UTF-8".into())
}

// ---------------------------------------------------------------------------------------
// Sentinel
