//! Connections to one Redis, to a Redis Cluster, or to the master a set of Redis Sentinels
//! names, behind one type.
//!
//! Every Redis URL is parsed here, in one place ([`RedisTarget::open`]):
//!
//! - `redis://[user:pass@]host:port[/db]` (or `rediss://` for TLS) names one server, reached
//!   through a self-healing multiplexed connection.
//! - `redis+cluster://host:port,host:port` (or `rediss+cluster://`, credentials as in
//!   `redis+cluster://user:pass@h1:p1,h2:p2`) names a cluster, reached through the redis
//!   crate's async cluster client (which follows MOVED/ASK and reconnects). Every script
//!   receives all its keys under one hash tag, so each runs on one slot.
//! - `redis+sentinel://[user:pass@]s1:26379,s2:26379/<master-name>[?db=N]` (or
//!   `rediss+sentinel://`: TLS to the sentinels and to the master) names the master that
//!   the sentinels agree on (`SENTINEL get-master-addr-by-name`). `user:pass@` are the
//!   master's credentials; the sentinels' own are the query parameters
//!   `sentinel_username` / `sentinel_password`. The connection ([`SentinelConn`]) resolves
//!   the master again and reconnects when its connection breaks or times out, when the
//!   server answers as a replica (`READONLY`, `UNBLOCKED`), or when a watcher task that asks
//!   a sentinel every 500 ms hears of another master: a failover needs no restart.
//!
//! TLS files: a `rediss` URL takes the query parameters `tls_ca=<path>` (a PEM file of the
//! CA(s) to trust instead of the system's roots) and `tls_cert=<path>&tls_key=<path>` (a
//! client certificate and its key: mutual TLS), or the same files as [`TlsFiles`]
//! ([`ClientOptions::tls`](crate::ClientOptions::tls)). The command line's `--redis-tls-*`
//! flags and `serve`'s `redis_tls_*` keys add them to the URL ([`url_with_tls_files`]). A
//! server whose certificate the CA does not vouch for fails the connect with a clear,
//! non-transient error; nothing ever falls back to plain TCP.

use crate::engine::error::InvalidInput;
use futures_util::future::{BoxFuture, FutureExt, Shared};
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, ClientTlsConfig, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind,
    IntoConnectionInfo, Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind,
    TlsCertificates, Value,
};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// A connection: one server (self-healing multiplexed connection), a cluster, or the master
/// named by sentinels.
#[derive(Clone)]
pub enum Conn {
    /// One server.
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
    /// The master named by Redis Sentinels, followed across failovers.
    Sentinel(SentinelConn),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(c) => c.get_db(),
        }
    }
}

/// Opens connections to one server, a cluster, or the master named by sentinels.
#[derive(Clone)]
pub enum RedisTarget {
    /// One server.
    Single(Box<redis::Client>),
    /// A cluster, by its seed nodes.
    Cluster(ClusterSeeds),
    /// The master a set of sentinels names.
    Sentinel(Arc<SentinelTarget>),
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print credentials.
        match self {
            RedisTarget::Single(_) => f.write_str("RedisTarget::Single"),
            RedisTarget::Cluster(n) => write!(f, "RedisTarget::Cluster({} seed nodes)", n.len()),
            RedisTarget::Sentinel(s) => write!(f, "RedisTarget::Sentinel({s:?})"),
        }
    }
}

/// The seed nodes of a cluster (`redis://[user:pass@]host:port` each; dereferences to
/// them) and its TLS certificates, if any.
#[derive(Clone)]
pub struct ClusterSeeds {
    nodes: Vec<String>,
    certs: Option<TlsCertificates>,
}

impl std::ops::Deref for ClusterSeeds {
    type Target = [String];

    fn deref(&self) -> &[String] {
        &self.nodes
    }
}

impl RedisTarget {
    /// Parses a Redis URL (see the module docs), reading the TLS files it names.
    pub fn open(url: &str) -> Result<Self, InvalidInput> {
        Self::open_with(url, None)
    }

    /// Parses a Redis URL with TLS files given besides it (e.g. by
    /// [`ClientOptions::tls`](crate::ClientOptions::tls)); a file given both ways must be
    /// the same.
    pub fn open_with(url: &str, tls: Option<&TlsFiles>) -> Result<Self, InvalidInput> {
        let bad = |reason: String| InvalidInput::RedisUrl { reason };
        let parts = UrlParts::parse(url).map_err(bad)?;
        let mut files = parts.tls.clone();
        if let Some(extra) = tls {
            files = files.merge(extra).map_err(bad)?;
        }
        if !files.is_empty() && !parts.is_tls() {
            return Err(bad(format!(
                "TLS files ({}) need a rediss:// URL (rediss+cluster://, rediss+sentinel://), \
                 not {}://",
                files.names(),
                parts.scheme
            )));
        }
        let certs = files.load().map_err(|e| bad(e.to_string()))?;
        if parts.sentinel.is_some() && !parts.scheme.ends_with("+sentinel") {
            return Err(bad(
                "sentinel_username / sentinel_password / db go with a redis+sentinel:// URL".into(),
            ));
        }
        match parts.scheme.as_str() {
            "redis+cluster" | "rediss+cluster" => parts.cluster(certs).map(RedisTarget::Cluster),
            "redis+sentinel" | "rediss+sentinel" => parts
                .sentinel(certs)
                .map(|t| RedisTarget::Sentinel(Arc::new(t))),
            _ => {
                let plain = parts.plain_url();
                match certs {
                    Some(c) => redis::Client::build_with_tls(plain.as_str(), c),
                    None => redis::Client::open(plain.as_str()),
                }
                .map(|c| RedisTarget::Single(Box::new(c)))
                .map_err(|e| e.to_string())
            }
        }
        .map_err(bad)
    }

    /// True for a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisTarget::Cluster(_))
    }

    /// True for a master found through sentinels.
    pub fn is_sentinel(&self) -> bool {
        matches!(self, RedisTarget::Sentinel(_))
    }

    /// Opens a new connection whose replies may take up to `response_timeout`.
    pub async fn connect(
        &self,
        response_timeout: Duration,
        connect_timeout: Duration,
    ) -> RedisResult<Conn> {
        match self {
            RedisTarget::Single(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(response_timeout))
                    .set_connection_timeout(Some(connect_timeout))
                    .set_number_of_retries(3)
                    .set_max_delay(Duration::from_secs(2));
                let addr = client.get_connection_info().addr();
                let tls = matches!(addr, ConnectionAddr::TcpTls { .. });
                ConnectionManager::new_with_config((**client).clone(), config)
                    .await
                    .map(Conn::Single)
                    .map_err(|e| explain_tls(e, tls, &addr.to_string()))
            }
            RedisTarget::Cluster(seeds) => {
                let mut builder = ClusterClient::builder(seeds.nodes.clone())
                    .response_timeout(response_timeout)
                    .connection_timeout(connect_timeout)
                    .retries(6);
                if let Some(c) = &seeds.certs {
                    builder = builder.certs(c.clone());
                }
                let tls = seeds.nodes.iter().any(|n| n.starts_with("rediss://"));
                let what = format!("the cluster ({} seed nodes)", seeds.nodes.len());
                let client = builder.build()?;
                client
                    .get_async_connection()
                    .await
                    .map(Conn::Cluster)
                    .map_err(|e| explain_tls(e, tls, &what))
            }
            RedisTarget::Sentinel(target) => {
                target.watch(connect_timeout.min(response_timeout));
                let conn = SentinelConn::new(target.clone(), response_timeout, connect_timeout);
                conn.ready().await?;
                Ok(Conn::Sentinel(conn))
            }
        }
    }
}

/// A TLS failure while connecting (an untrusted certificate, a refused client
/// certificate, a plain-text port) as an error that names it and is not retried: waiting
/// does not fix a certificate. Other errors are returned as they are.
fn explain_tls(e: RedisError, tls: bool, what: &str) -> RedisError {
    if !tls || !is_tls_failure(&e) {
        return e;
    }
    let text = e.to_string();
    let lower = text.to_ascii_lowercase();
    let hint = if lower.contains("invalid peer certificate") {
        "the server's certificate is not trusted: is it signed by the CA of tls_ca / \
         redis_tls_ca / --redis-tls-ca, and issued for this host name or IP address?"
    } else if lower.contains("alert") {
        "the server refused the handshake: does it require a client certificate (tls_cert \
         and tls_key / redis_tls_cert and redis_tls_key / --redis-tls-cert and \
         --redis-tls-key) signed by a CA it trusts?"
    } else {
        "is the port a TLS port, and the server's certificate a valid one?"
    };
    RedisError::from((
        ErrorKind::InvalidClientConfig,
        "TLS handshake failed",
        format!("{what}: {text} ({hint})"),
    ))
}

/// True for an I/O error that TLS raised (not a refused, reset or timed-out connection),
/// also when the cluster client wrapped it ("Failed to create initial connections").
fn is_tls_failure(e: &RedisError) -> bool {
    if e.kind() != ErrorKind::Io || e.is_timeout() || e.is_connection_refusal() {
        return false;
    }
    let text = e.to_string().to_ascii_lowercase();
    [
        "certificate",
        "received fatal alert",
        "handshake",
        "corrupt message",
        "peer misbehaved",
        "peer is incompatible",
    ]
    .iter()
    .any(|k| text.contains(k))
}

// ---------------------------------------------------------------------------------------
// TLS files

/// TLS files for `rediss` connections: a CA to trust instead of the system's roots, and a
/// client certificate with its key (mutual TLS). Paths may appear in logs and errors; the
/// files' contents never do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsFiles {
    /// A PEM file of the CA certificate(s) that signed the server's certificate (trusted
    /// instead of the system's roots).
    pub ca: Option<PathBuf>,
    /// A PEM file of the client certificate (chain), for servers that require one
    /// (`tls-auth-clients yes`); needs [`key`](Self::key).
    pub cert: Option<PathBuf>,
    /// A PEM file of the client certificate's private key.
    pub key: Option<PathBuf>,
}

/// One of the [`TlsFiles`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFile {
    /// The CA file.
    Ca,
    /// The client certificate.
    Cert,
    /// The client certificate's key.
    Key,
}

impl TlsFile {
    /// Its URL query parameter: `tls_ca`, `tls_cert` or `tls_key`.
    pub fn param(self) -> &'static str {
        match self {
            TlsFile::Ca => "tls_ca",
            TlsFile::Cert => "tls_cert",
            TlsFile::Key => "tls_key",
        }
    }
}

/// A TLS file that cannot be used: which one, and why (its path, never its contents).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {reason}", file.param())]
pub struct TlsFileError {
    /// The file at fault.
    pub file: TlsFile,
    /// What is wrong with it.
    pub reason: String,
}

impl TlsFiles {
    /// No files: the system's roots, no client certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the CA(s) of the PEM file at `path` instead of the system's roots.
    pub fn ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca = Some(path.into());
        self
    }

    /// Presents the client certificate at `cert` (PEM) with its private key at `key`.
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.cert = Some(cert.into());
        self.key = Some(key.into());
        self
    }

    /// True when no file is set.
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// The file at `which`.
    pub fn get(&self, which: TlsFile) -> Option<&Path> {
        match which {
            TlsFile::Ca => self.ca.as_deref(),
            TlsFile::Cert => self.cert.as_deref(),
            TlsFile::Key => self.key.as_deref(),
        }
    }

    fn slot(&mut self, which: TlsFile) -> &mut Option<PathBuf> {
        match which {
            TlsFile::Ca => &mut self.ca,
            TlsFile::Cert => &mut self.cert,
            TlsFile::Key => &mut self.key,
        }
    }

    /// Checks what needs no file access: a client certificate comes with its key.
    pub fn check_pairing(&self) -> Result<(), TlsFileError> {
        match (&self.cert, &self.key) {
            (Some(_), None) => Err(TlsFileError {
                file: TlsFile::Key,
                reason: "a client certificate (tls_cert) needs its private key too".into(),
            }),
            (None, Some(_)) => Err(TlsFileError {
                file: TlsFile::Cert,
                reason: "a private key (tls_key) needs its client certificate too".into(),
            }),
            _ => Ok(()),
        }
    }

    /// Reads and checks every file: the certificates the redis crate takes, or `None` when
    /// no file is set.
    pub fn load(&self) -> Result<Option<TlsCertificates>, TlsFileError> {
        if self.is_empty() {
            return Ok(None);
        }
        self.check_pairing()?;
        let read = |which: TlsFile, marker: &str, what: &str| -> Result<_, TlsFileError> {
            let Some(path) = self.get(which) else {
                return Ok(None);
            };
            let err = |reason: String| TlsFileError {
                file: which,
                reason,
            };
            let bytes = std::fs::read(path)
                .map_err(|e| err(format!("cannot read {}: {e}", path.display())))?;
            if !String::from_utf8_lossy(&bytes).contains(marker) {
                return Err(err(format!("{} is not a PEM {what}", path.display())));
            }
            Ok(Some(bytes))
        };
        let ca = read(TlsFile::Ca, "-----BEGIN CERTIFICATE-----", "certificate")?;
        let cert = read(TlsFile::Cert, "-----BEGIN CERTIFICATE-----", "certificate")?;
        let key = read(TlsFile::Key, "PRIVATE KEY-----", "private key")?;
        // Let the redis crate parse each part, so a bad file is named.
        if let Some(ca) = &ca {
            parse_check(TlsCertificates {
                client_tls: None,
                root_cert: Some(ca.clone()),
            })
            .map_err(|reason| TlsFileError {
                file: TlsFile::Ca,
                reason,
            })?;
        }
        let client_tls = match (cert, key) {
            (Some(client_cert), Some(client_key)) => {
                let c = ClientTlsConfig {
                    client_cert,
                    client_key,
                };
                parse_check(TlsCertificates {
                    client_tls: Some(c.clone()),
                    root_cert: None,
                })
                .map_err(|reason| TlsFileError {
                    file: TlsFile::Cert,
                    reason,
                })?;
                Some(c)
            }
            _ => None,
        };
        Ok(Some(TlsCertificates {
            client_tls,
            root_cert: ca,
        }))
    }

    /// These files with `other`'s added; a file set in both must be the same path.
    fn merge(mut self, other: &TlsFiles) -> Result<TlsFiles, String> {
        for which in [TlsFile::Ca, TlsFile::Cert, TlsFile::Key] {
            let Some(theirs) = other.get(which) else {
                continue;
            };
            match self.get(which) {
                Some(mine) if mine != theirs => {
                    return Err(format!(
                        "{} is given twice ({} and {})",
                        which.param(),
                        mine.display(),
                        theirs.display()
                    ));
                }
                _ => *self.slot(which) = Some(theirs.to_path_buf()),
            }
        }
        Ok(self)
    }

    /// The names of the files set (`tls_ca, tls_cert`), for messages.
    fn names(&self) -> String {
        [TlsFile::Ca, TlsFile::Cert, TlsFile::Key]
            .into_iter()
            .filter(|w| self.get(*w).is_some())
            .map(TlsFile::param)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Parses certificates the way a connection will (no network).
fn parse_check(certs: TlsCertificates) -> Result<(), String> {
    redis::Client::build_with_tls("rediss://localhost:6379", certs)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// `url` with `files` added as its `tls_ca` / `tls_cert` / `tls_key` query parameters
/// (what the command line's flags and `serve`'s keys do). Only a `rediss` URL takes them; a
/// file the URL already names must be the same path (then it is not added again).
pub fn url_with_tls_files(url: &str, files: &TlsFiles) -> Result<String, InvalidInput> {
    let bad = |reason: String| InvalidInput::RedisUrl { reason };
    if files.is_empty() {
        return Ok(url.to_owned());
    }
    let parts = UrlParts::parse(url).map_err(bad)?;
    if !parts.is_tls() {
        return Err(bad(format!(
            "TLS files ({}) need a rediss:// URL (rediss+cluster://, rediss+sentinel://), not \
             {}://",
            files.names(),
            parts.scheme
        )));
    }
    let (before_fragment, fragment) = match url.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (url, None),
    };
    let mut out = before_fragment.to_owned();
    for which in [TlsFile::Ca, TlsFile::Cert, TlsFile::Key] {
        let Some(path) = files.get(which) else {
            continue;
        };
        match parts.tls.get(which) {
            Some(named) if named == path => continue,
            Some(named) => {
                return Err(bad(format!(
                    "{} is given twice ({} in the URL, {} besides it)",
                    which.param(),
                    named.display(),
                    path.display()
                )));
            }
            None => {}
        }
        let path = path.to_str().ok_or_else(|| {
            bad(format!(
                "{}: the path {} is not UTF-8",
                which.param(),
                path.display()
            ))
        })?;
        out.push(if out.contains('?') { '&' } else { '?' });
        out.push_str(which.param());
        out.push('=');
        out.push_str(&percent_encode(path));
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    Ok(out)
}

/// True when `url` is a TLS URL (`rediss://`, `rediss+cluster://`, `rediss+sentinel://`,
/// `valkeys://`): the only ones that take TLS files.
pub fn is_tls_url(url: &str) -> bool {
    UrlParts::parse(url).is_ok_and(|p| p.is_tls())
}

// ---------------------------------------------------------------------------------------
// URL parsing

/// The sentinel-only query parameters.
#[derive(Debug, Clone, Default)]
struct SentinelParams {
    db: Option<i64>,
    username: Option<String>,
    password: Option<String>,
}

/// A Redis URL split into what delayq reads and what the redis crate reads.
struct UrlParts {
    /// `redis`, `rediss+cluster`, ...
    scheme: String,
    /// Between `://` and the query or fragment.
    rest: String,
    /// Query parameters left for the redis crate (`protocol=resp3`), as written.
    passthrough: Vec<String>,
    /// The fragment (`insecure`), as written.
    fragment: Option<String>,
    /// The TLS files the URL names.
    tls: TlsFiles,
    /// Sentinel parameters, when any is given.
    sentinel: Option<SentinelParams>,
}

impl UrlParts {
    fn parse(url: &str) -> Result<UrlParts, String> {
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
    fn is_tls(&self) -> bool {
        matches!(
            self.scheme.as_str(),
            "rediss" | "valkeys" | "rediss+cluster" | "rediss+sentinel"
        )
    }

    /// The plain scheme of each node: `redis` or `rediss`.
    fn node_scheme(&self) -> &'static str {
        if self.is_tls() { "rediss" } else { "redis" }
    }

    /// The URL as the redis crate reads it: without delayq's query parameters.
    fn plain_url(&self) -> String {
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
    fn split_auth(rest: &str) -> (Option<&str>, &str) {
        match rest.rsplit_once('@') {
            Some((a, h)) => (Some(a), h),
            None => (None, rest),
        }
    }

    fn cluster(&self, certs: Option<TlsCertificates>) -> Result<ClusterSeeds, String> {
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

    fn sentinel(&self, certs: Option<TlsCertificates>) -> Result<SentinelTarget, String> {
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
fn percent_encode(s: &str) -> String {
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
fn percent_decode(s: &str) -> Result<String, String> {
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

/// How to reach the master a set of sentinels names, and what the sentinels said last.
pub struct SentinelTarget {
    master_name: String,
    /// Each sentinel's address and credentials.
    sentinels: Vec<ConnectionInfo>,
    /// The master's credentials and database (its address is the sentinels' answer).
    master: ConnectionInfo,
    tls: bool,
    certs: Option<TlsCertificates>,
    watch: Watch,
}

/// The master the sentinels named when last asked (by the watcher), and how many times
/// that answer changed: a connection opened at another epoch reconnects.
#[derive(Default)]
struct Watch {
    started: AtomicBool,
    epoch: AtomicU64,
    master: Mutex<Option<(String, u16)>>,
}

impl std::fmt::Debug for SentinelTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Addresses only: never a credential.
        let addrs: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| s.addr().to_string())
            .collect();
        f.debug_struct("SentinelTarget")
            .field("master_name", &self.master_name)
            .field("sentinels", &addrs)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl SentinelTarget {
    /// The master's name, as the sentinels know it.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// The sentinels' addresses (`host:port`).
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| s.addr().to_string())
            .collect()
    }

    fn client(&self, info: ConnectionInfo) -> RedisResult<redis::Client> {
        match &self.certs {
            Some(c) => redis::Client::build_with_tls(info, c.clone()),
            None => redis::Client::open(info),
        }
    }

    fn config(response_timeout: Duration, connect_timeout: Duration) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_response_timeout(Some(response_timeout))
            .set_connection_timeout(Some(connect_timeout))
    }

    /// Asks one sentinel where the master is.
    async fn ask(
        &self,
        sentinel: &ConnectionInfo,
        timeout: Duration,
    ) -> RedisResult<Option<(String, u16)>> {
        let addr = sentinel.addr().to_string();
        let client = self.client(sentinel.clone())?;
        let mut c = client
            .get_multiplexed_async_connection_with_config(&Self::config(timeout, timeout))
            .await
            .map_err(|e| explain_tls(e, self.tls, &format!("sentinel {addr}")))?;
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master_name)
            .query_async(&mut c)
            .await
    }

    /// Connects to `host:port` and checks that it is a master.
    async fn open_master(
        &self,
        host: String,
        port: u16,
        response_timeout: Duration,
        connect_timeout: Duration,
    ) -> RedisResult<MultiplexedConnection> {
        let what = format!("master {host}:{port}");
        let addr = if self.tls {
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host, port)
        };
        let client = self.client(self.master.clone().set_addr(addr))?;
        let mut c = client
            .get_multiplexed_async_connection_with_config(&Self::config(
                response_timeout,
                connect_timeout,
            ))
            .await
            .map_err(|e| explain_tls(e, self.tls, &what))?;
        // A sentinel may still name a demoted master for a moment: ask the server itself.
        // A user not allowed ROLE is trusted to the sentinels (a write to a replica still
        // answers READONLY, which resolves again).
        match c.req_packed_command(&redis::cmd("ROLE")).await? {
            Value::Array(items) => match items.first() {
                Some(Value::BulkString(role)) if role.as_slice() != b"master" => {
                    Err(RedisError::from((
                        ErrorKind::Server(ServerErrorKind::ReadOnly),
                        "the server the sentinels name is not a master (yet)",
                        format!("{what} is a {}", String::from_utf8_lossy(role)),
                    )))
                }
                _ => Ok(c),
            },
            Value::ServerError(e) if e.code() == "NOPERM" => Ok(c),
            Value::ServerError(e) => Err(e.into()),
            _ => Ok(c),
        }
    }

    /// How many times the watcher saw the sentinels name another master.
    fn epoch(&self) -> u64 {
        self.watch.epoch.load(Ordering::Acquire)
    }

    /// The master the watcher saw last.
    fn watched_master(&self) -> Option<(String, u16)> {
        self.watch
            .master
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records the sentinels' answer; a new master bumps the epoch.
    fn saw_master(&self, addr: (String, u16)) {
        let mut m = self.watch.master.lock().unwrap_or_else(|p| p.into_inner());
        if m.as_ref() != Some(&addr) {
            if m.is_some() {
                self.watch.epoch.fetch_add(1, Ordering::AcqRel);
                tracing::info!(master = %self.master_name, addr = ?addr, "the sentinels name a new master: reconnecting");
            }
            *m = Some(addr);
        }
    }

    /// Starts, once, the watcher: a task that asks a sentinel every
    /// [`SENTINEL_WATCH_INTERVAL`] where the master is, so that every connection moves to a
    /// new master as soon as the sentinels name it, even while the old one still answers
    /// (a `SENTINEL FAILOVER` leaves it a master until the sentinels reconfigure it, about
    /// ten seconds later). It stops when the target is dropped.
    fn watch(self: &Arc<Self>, timeout: Duration) {
        if self.watch.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.watch.started.store(false, Ordering::Release);
            return;
        };
        let weak = Arc::downgrade(self);
        runtime.spawn(async move {
            let mut conn: Option<MultiplexedConnection> = None;
            let mut next = 0;
            loop {
                tokio::time::sleep(SENTINEL_WATCH_INTERVAL).await;
                let Some(target) = weak.upgrade() else { break };
                target.poll(&mut conn, &mut next, timeout).await;
            }
        });
    }

    /// Asks one sentinel (the one of `conn`, else the next that answers) where the master
    /// is.
    async fn poll(
        &self,
        conn: &mut Option<MultiplexedConnection>,
        next: &mut usize,
        timeout: Duration,
    ) {
        for _ in 0..self.sentinels.len() {
            let c = match conn {
                Some(c) => c,
                None => {
                    let s = &self.sentinels[*next % self.sentinels.len()];
                    let opened = match self.client(s.clone()) {
                        Ok(client) => {
                            client
                                .get_multiplexed_async_connection_with_config(&Self::config(
                                    timeout, timeout,
                                ))
                                .await
                        }
                        Err(e) => Err(e),
                    };
                    match opened {
                        Ok(c) => conn.insert(c),
                        Err(_) => {
                            *next += 1;
                            continue;
                        }
                    }
                }
            };
            let answer: RedisResult<Option<(String, u16)>> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.master_name)
                .query_async(c)
                .await;
            match answer {
                Ok(Some(addr)) => {
                    self.saw_master(addr);
                    return;
                }
                _ => {
                    *conn = None;
                    *next += 1;
                }
            }
        }
    }

    /// Finds the master through the sentinels (each asked in turn) and connects to it.
    async fn connect_master(
        self: Arc<Self>,
        response_timeout: Duration,
        connect_timeout: Duration,
    ) -> RedisResult<MultiplexedConnection> {
        let ask_timeout = connect_timeout.min(response_timeout);
        let mut last: Option<RedisError> = None;
        let mut tried: Vec<(String, u16)> = Vec::new();
        // The watcher's latest answer first (the one that moved the epoch), then each
        // sentinel's.
        let watched = self.watched_master();
        for s in std::iter::once(None).chain(self.sentinels.iter().map(Some)) {
            let answer = match s {
                None => match &watched {
                    Some(a) => Ok(Some(a.clone())),
                    None => continue,
                },
                Some(s) => self.ask(s, ask_timeout).await,
            };
            let (host, port) = match answer {
                Ok(Some(a)) => a,
                Ok(None) => {
                    let addr = s.map(|s| s.addr().to_string()).unwrap_or_default();
                    last = Some(RedisError::from((
                        ErrorKind::MasterNameNotFoundBySentinel,
                        "the sentinel does not know this master name",
                        format!("sentinel {addr} about {:?}", self.master_name),
                    )));
                    continue;
                }
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
            if tried.contains(&(host.clone(), port)) {
                continue;
            }
            tried.push((host.clone(), port));
            match self
                .open_master(host, port, response_timeout, connect_timeout)
                .await
            {
                Ok(c) => {
                    tracing::debug!(master = %self.master_name, addr = ?tried.last(), "connected to the master the sentinels name");
                    return Ok(c);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            RedisError::from((ErrorKind::EmptySentinelList, "no sentinel to ask"))
        }))
    }
}

/// True for a failure that waiting does not fix: a TLS or client configuration error, a
/// refused login or permission.
fn is_permanent(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::InvalidClientConfig
            | ErrorKind::AuthenticationFailed
            | ErrorKind::Server(ServerErrorKind::NoPerm)
    )
}

/// A connection being opened (shared by every caller that waits for it).
type Connecting = Shared<BoxFuture<'static, RedisResult<MultiplexedConnection>>>;

/// Most attempts of one call at getting an answer from a master.
const SENTINEL_ATTEMPTS: u32 = 12;
/// The first wait between attempts (doubling).
const SENTINEL_FIRST_DELAY: Duration = Duration::from_millis(50);
/// The longest wait between attempts.
const SENTINEL_MAX_DELAY: Duration = Duration::from_millis(500);
/// How often the watcher asks a sentinel where the master is.
const SENTINEL_WATCH_INTERVAL: Duration = Duration::from_millis(500);

/// A connection to the master that Redis Sentinels name, followed across failovers.
///
/// Clones share one multiplexed connection. When it breaks or times out, when the server
/// answers as a replica (`READONLY`, or `UNBLOCKED` for a blocked read on a demoted
/// master), or when the target's watcher hears the sentinels name another master (it asks
/// every 500 ms), the master is resolved through the sentinels again and a new connection
/// opened, once for all clones. A call that the server refused as a replica did nothing and is
/// retried on the new master (bounded attempts with doubling delays, within the response
/// plus the connect timeout); a call whose connection broke may have run, so its error is
/// returned (the caller retries what is idempotent) and the next call reconnects. No lock is
/// held across a network call.
#[derive(Clone)]
pub struct SentinelConn {
    shared: Arc<SentinelShared>,
}

struct SentinelShared {
    target: Arc<SentinelTarget>,
    response_timeout: Duration,
    connect_timeout: Duration,
    slot: Mutex<Slot>,
}

/// The current connection (or its opening), its generation, and the watcher's epoch when
/// it was opened.
struct Slot {
    generation: u64,
    epoch: u64,
    conn: Connecting,
}

/// One call: a command or a pipeline.
#[derive(Clone, Copy)]
enum Request<'a> {
    One(&'a Cmd),
    Many(&'a Pipeline, usize, usize),
}

/// The reply to a [`Request`].
enum Reply {
    One(Value),
    Many(Vec<Value>),
}

impl Reply {
    /// True when a reply says the server is (now) a replica: nothing was done.
    fn is_from_replica(&self) -> bool {
        let is = |v: &Value| matches!(v, Value::ServerError(e) if matches!(e.code(), "READONLY" | "UNBLOCKED"));
        match self {
            Reply::One(v) => is(v),
            Reply::Many(vs) => vs.iter().any(is),
        }
    }
}

impl SentinelConn {
    fn new(
        target: Arc<SentinelTarget>,
        response_timeout: Duration,
        connect_timeout: Duration,
    ) -> Self {
        let conn = Self::connecting(&target, response_timeout, connect_timeout);
        let epoch = target.epoch();
        SentinelConn {
            shared: Arc::new(SentinelShared {
                target,
                response_timeout,
                connect_timeout,
                slot: Mutex::new(Slot {
                    generation: 0,
                    epoch,
                    conn,
                }),
            }),
        }
    }

    fn connecting(
        target: &Arc<SentinelTarget>,
        response_timeout: Duration,
        connect_timeout: Duration,
    ) -> Connecting {
        target
            .clone()
            .connect_master(response_timeout, connect_timeout)
            .boxed()
            .shared()
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.shared.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current connection's generation, epoch and (possibly unfinished) opening.
    fn current(&self) -> (u64, u64, Connecting) {
        let s = self.slot();
        (s.generation, s.epoch, s.conn.clone())
    }

    /// Replaces the connection of `generation` with a new resolution (unless another caller
    /// already did).
    fn invalidate(&self, generation: u64) {
        let mut s = self.slot();
        if s.generation == generation {
            s.generation += 1;
            s.epoch = self.shared.target.epoch();
            s.conn = Self::connecting(
                &self.shared.target,
                self.shared.response_timeout,
                self.shared.connect_timeout,
            );
        }
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.shared.response_timeout + self.shared.connect_timeout
    }

    /// A connection to the master, resolving it as often as needed within `deadline`.
    async fn obtain(&self, deadline: Instant) -> RedisResult<(u64, MultiplexedConnection)> {
        let mut delay = SENTINEL_FIRST_DELAY;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (generation, epoch, connecting) = self.current();
            if epoch != self.shared.target.epoch() {
                // The sentinels named another master since this connection was opened.
                self.invalidate(generation);
                continue;
            }
            let e = match tokio::time::timeout_at(deadline, connecting).await {
                Ok(Ok(c)) => return Ok((generation, c)),
                Ok(Err(e)) => e,
                Err(_) => {
                    return Err(RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "no master for {:?} through the sentinels within the timeout",
                            self.shared.target.master_name
                        ),
                    )));
                }
            };
            self.invalidate(generation);
            if is_permanent(&e)
                || attempt >= SENTINEL_ATTEMPTS
                || Instant::now() + delay >= deadline
            {
                return Err(e);
            }
            tracing::debug!(master = %self.shared.target.master_name, error = %e, "resolving the master again");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(SENTINEL_MAX_DELAY);
        }
    }

    /// Waits for the first connection (at connect time, so a bad URL or an unreachable
    /// set of sentinels fails there).
    async fn ready(&self) -> RedisResult<()> {
        self.obtain(self.deadline()).await.map(drop)
    }

    async fn request(&self, req: Request<'_>) -> RedisResult<Reply> {
        let deadline = self.deadline();
        let mut delay = SENTINEL_FIRST_DELAY;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (generation, mut c) = self.obtain(deadline).await?;
            let sent = match req {
                Request::One(cmd) => c.req_packed_command(cmd).await.map(Reply::One),
                Request::Many(p, offset, count) => c
                    .req_packed_commands(p, offset, count)
                    .await
                    .map(Reply::Many),
            };
            match sent {
                Ok(reply) if reply.is_from_replica() => {
                    // A replica refused it: nothing was done; find the new master.
                    self.invalidate(generation);
                    if attempt >= SENTINEL_ATTEMPTS || Instant::now() + delay >= deadline {
                        return Ok(reply);
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(SENTINEL_MAX_DELAY);
                }
                Ok(reply) => return Ok(reply),
                Err(e) => {
                    if e.is_unrecoverable_error() || e.is_timeout() || e.is_connection_dropped() {
                        // It may have run: no retry here; the next call reconnects.
                        self.invalidate(generation);
                    }
                    return Err(e);
                }
            }
        }
    }
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            match self.request(Request::One(cmd)).await? {
                Reply::One(v) => Ok(v),
                Reply::Many(_) => Err(RedisError::from((
                    ErrorKind::Client,
                    "a pipeline reply to one command",
                ))),
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            match self.request(Request::Many(pipeline, offset, count)).await? {
                Reply::Many(v) => Ok(v),
                Reply::One(_) => Err(RedisError::from((
                    ErrorKind::Client,
                    "one reply to a pipeline",
                ))),
            }
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.target.master.redis_settings().db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert!(
            !RedisTarget::open("redis://127.0.0.1:6379")
                .unwrap()
                .is_cluster()
        );
        match RedisTarget::open("redis+cluster://u:p@127.0.0.1:7000,127.0.0.1:7001").unwrap() {
            RedisTarget::Cluster(n) => assert_eq!(
                n.to_vec(),
                vec!["redis://u:p@127.0.0.1:7000", "redis://u:p@127.0.0.1:7001"]
            ),
            other => panic!("{other:?}"),
        }
        match RedisTarget::open("rediss+cluster://127.0.0.1:7000").unwrap() {
            RedisTarget::Cluster(n) => assert_eq!(n.to_vec(), vec!["rediss://127.0.0.1:7000"]),
            other => panic!("{other:?}"),
        }
        assert!(RedisTarget::open("redis+cluster://").is_err());
        assert!(RedisTarget::open("mysql://x").is_err());
        // The redis crate's own query parameters pass through (db: for unix sockets).
        assert!(RedisTarget::open("redis://127.0.0.1:6379/?protocol=resp3").is_ok());
        assert!(RedisTarget::open("redis+unix:///tmp/redis.sock?db=2").is_ok());
        match RedisTarget::open("redis+cluster://127.0.0.1:7000/?protocol=resp3").unwrap() {
            RedisTarget::Cluster(n) => {
                assert_eq!(n.to_vec(), vec!["redis://127.0.0.1:7000/?protocol=resp3"])
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn sentinel_urls() {
        let t = match RedisTarget::open(
            "redis+sentinel://app:S%40CRET@127.0.0.1:26379,[::1]:26380,localhost/mymaster?db=3&sentinel_password=SENTPW",
        )
        .unwrap()
        {
            RedisTarget::Sentinel(t) => t,
            other => panic!("{other:?}"),
        };
        assert_eq!(t.master_name(), "mymaster");
        assert_eq!(
            t.sentinel_addrs(),
            vec!["127.0.0.1:26379", "::1:26380", "localhost:26379"]
        );
        assert_eq!(t.master.redis_settings().db(), 3);
        assert_eq!(t.master.redis_settings().username(), Some("app"));
        assert_eq!(t.master.redis_settings().password(), Some("S@CRET"));
        assert_eq!(t.sentinels[0].redis_settings().password(), Some("SENTPW"));
        assert!(!t.tls);
        // No secret in its Debug output.
        let debug = format!("{:?}", RedisTarget::Sentinel(t));
        assert!(
            !debug.contains("SECRET") && !debug.contains("SENTPW"),
            "{debug}"
        );
        assert!(debug.contains("mymaster"), "{debug}");

        for bad in [
            "redis+sentinel://127.0.0.1:26379",
            "redis+sentinel://127.0.0.1:26379/",
            "redis+sentinel:///mymaster",
            "redis+sentinel://127.0.0.1:26379/mymaster?db=x",
            "redis+sentinel://127.0.0.1:26379/mymaster?sentinel_pasword=x",
            "redis+sentinel://127.0.0.1:26379/mymaster?protocol=resp3",
            "redis://127.0.0.1:6379/?sentinel_password=x",
            // A password with an unescaped '/' (it must be %2F): refused without echoing it.
            "redis+sentinel://app:SENT/PW@127.0.0.1:26379/mymaster",
            "redis+sentinel://app:SENT/PW@127.0.0.1:26379",
        ] {
            let e = RedisTarget::open(bad).unwrap_err().to_string();
            assert!(!e.contains("SENTPW") && !e.contains("SENT"), "{bad}: {e}");
        }
    }

    #[test]
    fn percent_coding_round_trips() {
        for s in ["/tmp/a b/c+d&e=f%g#h?i.pem", "plain/path.pem", "é/ü"] {
            assert_eq!(percent_decode(&percent_encode(s)).unwrap(), s);
        }
        assert!(percent_decode("%zz").is_err());
        assert!(percent_decode("%4").is_err());
        assert_eq!(percent_decode("a+b").unwrap(), "a b");
    }

    #[test]
    fn tls_files_need_a_tls_url_and_come_in_pairs() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let files = TlsFiles::new().ca(&missing);
        // Only a rediss URL takes them.
        let e = url_with_tls_files("redis://127.0.0.1:6379", &files).unwrap_err();
        assert!(e.to_string().contains("rediss://"), "{e}");
        let e = RedisTarget::open("redis://h:1/?tls_ca=/x.pem").unwrap_err();
        assert!(e.to_string().contains("rediss://"), "{e}");
        // An unreadable file is named with its path.
        let url = url_with_tls_files("rediss://127.0.0.1:6379/#insecure", &files).unwrap();
        assert!(url.ends_with("#insecure"), "{url}");
        let e = RedisTarget::open(&url).unwrap_err().to_string();
        assert!(e.contains("tls_ca") && e.contains("missing.pem"), "{e}");
        // Given twice (in the URL and as an option) with another path: refused.
        let e = RedisTarget::open_with(&url, Some(&TlsFiles::new().ca("/other.pem")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("twice"), "{e}");
        let e = url_with_tls_files(&url, &TlsFiles::new().ca("/other.pem"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("twice"), "{e}");
        // The same file again changes nothing (checking a configuration twice).
        assert_eq!(url_with_tls_files(&url, &files).unwrap(), url);
        // A certificate without its key (and the other way round).
        let mut f = TlsFiles::new();
        f.cert = Some("/c.pem".into());
        assert_eq!(f.check_pairing().unwrap_err().file, TlsFile::Key);
        let mut f = TlsFiles::new();
        f.key = Some("/k.pem".into());
        assert_eq!(f.check_pairing().unwrap_err().file, TlsFile::Cert);
        // A file that is not PEM.
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let e = TlsFiles::new().ca(&junk).load().unwrap_err();
        assert_eq!(e.file, TlsFile::Ca);
        assert!(e.reason.contains("not a PEM certificate"), "{e}");
        // Paths with odd characters survive the trip through the URL.
        let odd = dir.path().join("a b&c=d%e.pem");
        let url = url_with_tls_files("rediss://h:1", &TlsFiles::new().ca(&odd)).unwrap();
        let parts = UrlParts::parse(&url).unwrap();
        assert_eq!(parts.tls.ca.as_deref(), Some(odd.as_path()));
        assert_eq!(parts.plain_url(), "rediss://h:1");
    }
}
