//! A Pub/Sub connection to the target (one server, the master sentinels name, or a
//! cluster), for the wake-up listener (`engine::listen`).
//!
//! It speaks RESP3, so subscriptions and messages arrive as push frames, handed to a
//! callback as they come (no queue in between). One server and a Sentinel master: a
//! multiplexed connection; subscribing sends `SSUBSCRIBE` (or `SUBSCRIBE`) without
//! awaiting a reply, and the server's confirmations come as pushes. Its end (a killed
//! client, a failover, a broken socket) comes as a `Disconnection` push; the listener then
//! opens a new one and subscribes again. A cluster: the crate's cluster connection, whose
//! `ssubscribe` sends each channel to the node owning its slot and subscribes again by
//! itself after reconnects and slot moves.

use super::{RedisTarget, SentinelTarget};
use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, ConnectionInfo, ProtocolVersion, PushInfo, RedisResult};
use std::sync::Arc;
use std::time::Duration;

/// What a subscriber's pushes (confirmations, messages, the connection's end) are given to.
pub(crate) type Push = Arc<dyn Fn(PushInfo) + Send + Sync>;

/// `info` in RESP3 and `config` with `push` as its push sender, when `push` is given.
pub(super) fn with_push(
    info: ConnectionInfo,
    config: AsyncConnectionConfig,
    push: Option<&Push>,
) -> (ConnectionInfo, AsyncConnectionConfig) {
    let Some(push) = push else {
        return (info, config);
    };
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    let push = push.clone();
    (
        info.set_redis_settings(settings),
        config.set_push_sender(move |p: PushInfo| {
            push(p);
            Ok::<(), std::convert::Infallible>(())
        }),
    )
}

/// A subscriber's connection.
#[derive(Clone)]
pub(crate) enum PubSubConn {
    /// One server, or a Sentinel master (with its target and the watcher's epoch when it
    /// was opened: the sentinels naming another master makes it stale).
    Plain(MultiplexedConnection, Option<(Arc<SentinelTarget>, u64)>),
    /// A cluster.
    Cluster(ClusterConnection),
}

impl PubSubConn {
    /// Subscribes to `channels` (sharded or not). A plain connection sends the commands and
    /// returns: the server confirms each channel with a push. A cluster connection awaits
    /// each channel's node.
    pub(crate) async fn subscribe(
        &mut self,
        channels: &[String],
        sharded: bool,
    ) -> RedisResult<()> {
        self.send(channels, if sharded { "SSUBSCRIBE" } else { "SUBSCRIBE" })
            .await
    }

    /// Unsubscribes from `channels`.
    pub(crate) async fn unsubscribe(
        &mut self,
        channels: &[String],
        sharded: bool,
    ) -> RedisResult<()> {
        self.send(
            channels,
            if sharded {
                "SUNSUBSCRIBE"
            } else {
                "UNSUBSCRIBE"
            },
        )
        .await
    }

    async fn send(&mut self, channels: &[String], command: &str) -> RedisResult<()> {
        match self {
            PubSubConn::Plain(c, _) => {
                // One command per channel: a cluster-mode server refuses channels of several
                // slots in one; each confirmed by a push.
                for ch in channels {
                    let mut cmd = redis::cmd(command);
                    cmd.arg(ch).set_no_response(true);
                    c.send_packed_command(&cmd).await?;
                }
                Ok(())
            }
            PubSubConn::Cluster(c) => {
                for ch in channels {
                    match command {
                        "SSUBSCRIBE" => c.ssubscribe(ch).await?,
                        "SUBSCRIBE" => c.subscribe(ch).await?,
                        "SUNSUBSCRIBE" => c.sunsubscribe(ch).await?,
                        _ => c.unsubscribe(ch).await?,
                    }
                }
                Ok(())
            }
        }
    }

    /// A round trip: fails when the connection is gone.
    pub(crate) async fn ping(&mut self) -> RedisResult<()> {
        match self {
            PubSubConn::Plain(c, _) => redis::cmd("PING").query_async(c).await,
            // The cluster client reconnects and subscribes again by itself.
            PubSubConn::Cluster(_) => Ok(()),
        }
    }

    /// True when the sentinels have named another master since this connection opened
    /// (the old master may still answer, but writes go to the new one).
    pub(crate) fn is_stale(&self) -> bool {
        match self {
            PubSubConn::Plain(_, Some((target, epoch))) => target.epoch() != *epoch,
            _ => false,
        }
    }

    /// True for a cluster connection (which subscribes again by itself).
    pub(crate) fn heals_itself(&self) -> bool {
        matches!(self, PubSubConn::Cluster(_))
    }
}

impl RedisTarget {
    /// Opens a Pub/Sub connection whose pushes go to `push`.
    pub(crate) async fn pubsub(
        &self,
        push: Push,
        response_timeout: Duration,
        connect_timeout: Duration,
    ) -> RedisResult<PubSubConn> {
        match self {
            RedisTarget::Single(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_response_timeout(Some(response_timeout))
                    .set_connection_timeout(Some(connect_timeout));
                let (info, config) =
                    with_push(client.get_connection_info().clone(), config, Some(&push));
                let client = redis::Client::open(info)?;
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map(|c| PubSubConn::Plain(c, None))
            }
            RedisTarget::Sentinel(target) => {
                target.watch(connect_timeout.min(response_timeout));
                let epoch = target.epoch();
                target
                    .clone()
                    .connect_master(response_timeout, connect_timeout, Some(&push))
                    .await
                    .map(|c| PubSubConn::Plain(c, Some((target.clone(), epoch))))
            }
            RedisTarget::Cluster(seeds) => {
                let push = push.clone();
                let mut builder = ClusterClient::builder(seeds.nodes.clone())
                    .response_timeout(response_timeout)
                    .connection_timeout(connect_timeout)
                    .use_protocol(ProtocolVersion::RESP3)
                    .push_sender(move |p: PushInfo| {
                        push(p);
                        Ok::<(), std::convert::Infallible>(())
                    })
                    .retries(6);
                if let Some(c) = &seeds.certs {
                    builder = builder.certs(c.clone());
                }
                builder
                    .build()?
                    .get_async_connection()
                    .await
                    .map(PubSubConn::Cluster)
            }
        }
    }
}
