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
//!   server answers as a replica (`READONLY`, `UNBLOCKED`, `MASTERDOWN`) or refuses writes
//!   for want of replicas (`NOREPLICAS`) or while loading (`LOADING`), retrying the refused
//!   call (it did nothing), or when a watcher task that asks
//!   a sentinel every 500 ms hears of another master: a failover needs no restart.
//!
//! TLS files: a `rediss` URL takes the query parameters `tls_ca=<path>` (a PEM file of the
//! CA(s) to trust instead of the system's roots) and `tls_cert=<path>&tls_key=<path>` (a
//! client certificate and its key: mutual TLS), or the same files as [`TlsFiles`]
//! ([`ClientOptions::tls`](crate::ClientOptions::tls)). The command line's `--redis-tls-*`
//! flags and `serve`'s `redis_tls_*` keys add them to the URL ([`url_with_tls_files`]). A
//! server whose certificate the CA does not vouch for fails the connect with a clear,
//! non-transient error; nothing ever falls back to plain TCP.

mod pubsub;
mod sentinel;
mod sentinel_policy;
mod tls;
mod url;

pub(crate) use pubsub::{PubSubConn, Push};
pub use sentinel::{SentinelConn, SentinelTarget};
pub use tls::{TlsFile, TlsFileError, TlsFiles, is_tls_url, url_with_tls_files};
use url::UrlParts;

use crate::engine::error::InvalidInput;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{
    Cmd, ConnectionAddr, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult,
    TlsCertificates, Value,
};
use std::sync::Arc;
use std::time::Duration;

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
        // Every Redis call delayq makes passes here: timed, and its errors counted.
        let op = crate::engine::telemetry::RedisOp::of(cmd);
        let call = match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(c) => c.req_packed_command(cmd),
        };
        crate::engine::telemetry::timed_redis_call(op, call)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let op = crate::engine::telemetry::RedisOp::of_pipeline(pipeline);
        let call = match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        };
        crate::engine::telemetry::timed_redis_call(op, call)
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
                let manager = ConnectionManager::new_with_config((**client).clone(), config);
                let connected = match addr {
                    // A plain-text port is named at once, not after every retry timed out.
                    ConnectionAddr::TcpTls { host, port, .. } => tokio::select! {
                        r = manager => r,
                        () = tls::answers_plain_text(host, *port, connect_timeout) => {
                            Err(tls::plain_text_port(&addr.to_string()))
                        }
                    },
                    _ => manager.await,
                };
                connected
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

#[cfg(test)]
mod tests {
    use super::url::{percent_decode, percent_encode};
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
