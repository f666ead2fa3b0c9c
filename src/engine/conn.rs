//! Connections to one Redis or to a Redis Cluster, behind one type.
//!
//! A URL `redis://`/`rediss://` names one server; `redis+cluster://host:port,host:port` (or
//! `rediss+cluster://`, credentials as in `redis+cluster://user:pass@h1:p1,h2:p2`) names a
//! cluster, reached through the redis crate's async cluster client (which follows MOVED/ASK
//! and reconnects). Every script receives all its keys under one hash tag, so each runs on one
//! slot.

use crate::error::InvalidInput;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};
use std::time::Duration;

/// A connection: one server (self-healing multiplexed connection) or a cluster.
#[derive(Clone)]
pub enum Conn {
    /// One server.
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
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
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Opens connections to one server or to a cluster.
#[derive(Clone)]
pub enum RedisTarget {
    /// One server.
    Single(Box<redis::Client>),
    /// A cluster, by its seed nodes.
    Cluster(Vec<String>),
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print credentials.
        match self {
            RedisTarget::Single(_) => f.write_str("RedisTarget::Single"),
            RedisTarget::Cluster(n) => write!(f, "RedisTarget::Cluster({} seed nodes)", n.len()),
        }
    }
}

impl RedisTarget {
    /// Parses a Redis URL (see the module docs).
    pub fn open(url: &str) -> Result<Self, InvalidInput> {
        let bad = |reason: String| InvalidInput::RedisUrl { reason };
        for (scheme, plain) in [
            ("redis+cluster://", "redis://"),
            ("rediss+cluster://", "rediss://"),
        ] {
            if let Some(rest) = url.strip_prefix(scheme) {
                let (auth, hosts) = match rest.rsplit_once('@') {
                    Some((a, h)) => (format!("{a}@"), h),
                    None => (String::new(), rest),
                };
                let hosts = hosts.trim_end_matches('/');
                let nodes: Vec<String> = hosts
                    .split(',')
                    .map(str::trim)
                    .filter(|h| !h.is_empty())
                    .map(|h| format!("{plain}{auth}{h}"))
                    .collect();
                if nodes.is_empty() {
                    return Err(bad("a cluster URL needs at least one host:port".into()));
                }
                for n in &nodes {
                    redis::Client::open(n.as_str()).map_err(|e| bad(e.to_string()))?;
                }
                return Ok(RedisTarget::Cluster(nodes));
            }
        }
        redis::Client::open(url)
            .map(|c| RedisTarget::Single(Box::new(c)))
            .map_err(|e| bad(e.to_string()))
    }

    /// True for a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisTarget::Cluster(_))
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
                Ok(Conn::Single(
                    ConnectionManager::new_with_config((**client).clone(), config).await?,
                ))
            }
            RedisTarget::Cluster(nodes) => {
                let client = ClusterClient::builder(nodes.clone())
                    .response_timeout(response_timeout)
                    .connection_timeout(connect_timeout)
                    .retries(6)
                    .build()?;
                Ok(Conn::Cluster(client.get_async_connection().await?))
            }
        }
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
                n,
                vec!["redis://u:p@127.0.0.1:7000", "redis://u:p@127.0.0.1:7001"]
            ),
            other => panic!("{other:?}"),
        }
        assert!(RedisTarget::open("redis+cluster://").is_err());
        assert!(RedisTarget::open("mysql://x").is_err());
    }
}
