//! [`ClientOptions`] and [`Durability`]: the client's settings, their defaults and the one
//! place their ranges are checked.

use crate::engine::conn::TlsFiles;
use crate::engine::error::InvalidInput;
use crate::engine::keys::Keyspace;
use std::time::Duration;

/// Most shards a queue may have.
pub const MAX_SHARDS: u16 = 1024;
/// Default cap on the queues of one namespace.
pub const DEFAULT_MAX_QUEUES: usize = 1000;
/// Default cap on the consumer groups of one queue.
pub const DEFAULT_MAX_GROUPS: usize = 100;
/// Default payload limit: 64 KiB of JSON text.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// Most orders per enqueue script call: amortises the ~15 µs fixed cost of a script call
/// while keeping each call short (Redis runs one script at a time).
pub(super) const ENQUEUE_CHUNK_ORDERS: usize = 500;
/// Most payload bytes per enqueue script call.
pub(super) const ENQUEUE_CHUNK_BYTES: usize = 1 << 20;

/// Options of a [`Client`]; in `serve`'s configuration, top-level keys.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ClientOptions {
    /// Key namespace: the prefix of every key (default `dq`).
    pub namespace: String,
    /// Shards per queue (default 1). Every process using a queue must agree on it.
    pub shards: u16,
    /// Largest accepted payload, bytes of JSON text (default 64 KiB).
    pub max_payload_bytes: usize,
    /// How long a command may wait for its reply (default 10 s).
    #[serde(skip)]
    pub response_timeout: Duration,
    /// How long connecting may take (default 5 s).
    #[serde(skip)]
    pub connect_timeout: Duration,
    /// When a schedule counts as done: `leader` (the default, [`Durability::Leader`]:
    /// acknowledge once the master has it) or `replicated` ([`Durability::replicated`]:
    /// once every replica the master has had lately confirms it, within one second; else
    /// the API answers 503 `not_replicated`).
    #[serde(deserialize_with = "durability_word")]
    pub durability: Durability,
    /// Most queues the namespace may have (default 1,000): creating one more is refused
    /// ([`Error::TooManyQueues`](crate::Error::TooManyQueues)).
    pub max_queues: usize,
    /// Most consumer groups a queue may have (default 100): a worker of one more group is
    /// refused ([`Error::TooManyGroups`](crate::Error::TooManyGroups)).
    pub max_groups: usize,
    /// TLS files for a `rediss` URL: a CA to trust instead of the system's roots, and a
    /// client certificate with its key (mutual TLS). Default none. The same files can be
    /// given in the URL itself (`?tls_ca=...&tls_cert=...&tls_key=...`, see
    /// [`conn`](crate::engine::conn)); a file given both ways must be the same path.
    #[serde(skip)]
    pub tls: Option<TlsFiles>,
}

/// `durability = "leader"` or `"replicated"`.
fn durability_word<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Durability, D::Error> {
    crate::engine::duration::human::from_text(d, |word| match word {
        "leader" => Ok(Durability::Leader),
        "replicated" => Ok(Durability::replicated()),
        other => Err(InvalidInput::Option {
            name: "durability",
            reason: format!("{other:?} is not leader or replicated"),
        }),
    })
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            namespace: "dq".into(),
            shards: 1,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            response_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            durability: Durability::Leader,
            max_queues: DEFAULT_MAX_QUEUES,
            max_groups: DEFAULT_MAX_GROUPS,
            tls: None,
        }
    }
}

impl ClientOptions {
    /// Sets the key namespace.
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = ns.into();
        self
    }

    /// Sets the number of shards per queue (1..=1024).
    pub fn shards(mut self, shards: u16) -> Self {
        self.shards = shards;
        self
    }

    /// Sets the durability of schedules.
    pub fn durability(mut self, d: Durability) -> Self {
        self.durability = d;
        self
    }

    /// Sets the payload limit in bytes.
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// Sets the cap on queues (1..=1,000,000).
    pub fn max_queues(mut self, n: usize) -> Self {
        self.max_queues = n;
        self
    }

    /// Sets the cap on groups per queue (1..=10,000).
    pub fn max_groups(mut self, n: usize) -> Self {
        self.max_groups = n;
        self
    }

    /// Sets the TLS files (CA, client certificate and key) of a `rediss` connection.
    pub fn tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// Checks every option (the one place they are checked).
    pub fn validate(&self) -> Result<(), InvalidInput> {
        Keyspace::new(&self.namespace)?;
        if !(1..=MAX_SHARDS).contains(&self.shards) {
            return Err(InvalidInput::Option {
                name: "shards",
                reason: format!("must be 1..={MAX_SHARDS}, got {}", self.shards),
            });
        }
        if !(1..=1_000_000).contains(&self.max_queues) {
            return Err(InvalidInput::Option {
                name: "max_queues",
                reason: format!("must be 1..=1000000, got {}", self.max_queues),
            });
        }
        if !(1..=10_000).contains(&self.max_groups) {
            return Err(InvalidInput::Option {
                name: "max_groups",
                reason: format!("must be 1..=10000, got {}", self.max_groups),
            });
        }
        if self.max_payload_bytes == 0 {
            return Err(InvalidInput::Option {
                name: "max_payload_bytes",
                reason: "must be at least 1".into(),
            });
        }
        let bad_durability = match self.durability {
            Durability::Leader => false,
            Durability::Replicated { replicas, timeout } => {
                replicas == 0 || timeout.is_zero() || timeout > super::durable::MAX_WAIT
            }
            Durability::EveryReplica { timeout } => {
                timeout.is_zero() || timeout > super::durable::MAX_WAIT
            }
        };
        if bad_durability {
            return Err(InvalidInput::Option {
                name: "durability",
                reason: format!(
                    "replicated durability needs at least one replica and a timeout of 1 ms..={:?}",
                    super::durable::MAX_WAIT
                ),
            });
        }
        if let Some(files) = &self.tls {
            files.check_pairing().map_err(|e| InvalidInput::Option {
                name: "tls",
                reason: e.to_string(),
            })?;
        }
        if self.response_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(InvalidInput::Option {
                name: "timeout",
                reason: "response and connect timeouts must be more than zero".into(),
            });
        }
        Ok(())
    }
}

/// When a schedule counts as done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// As soon as the leader (master) has it. Fast; a failover or a crash of a master without
    /// persistence can lose it (see ARCHITECTURE.md, "Durability").
    #[default]
    Leader,
    /// Only once `replicas` replicas confirm it (`WAIT`), within `timeout`; otherwise the call
    /// fails with [`Error::NotReplicated`](crate::Error::NotReplicated) and the order, already
    /// on the leader, may still fire.
    ///
    /// A fixed count does not survive a forced failover when the master has more replicas
    /// than `replicas`: the old master's other replicas still confirm writes that its
    /// demotion discards. [`Durability::EveryReplica`] does.
    Replicated {
        /// Replicas that must confirm.
        replicas: u32,
        /// How long to wait for them.
        timeout: Duration,
    },
    /// Only once **every** replica the master has had lately confirms it (`WAIT`; at least
    /// one), within `timeout`; otherwise the call fails with
    /// [`Error::NotReplicated`](crate::Error::NotReplicated) and the order, already on the
    /// leader, may still fire. The count is learned from the master's `INFO replication`
    /// (replicas in sync, asked again at most every second) and falls only after the
    /// master reported fewer for 10 s, so that a replica promoted by a failover is still
    /// waited for on the old master: its writes are refused there instead of acknowledged
    /// then discarded. The cost: for 10 s after a replica is lost, every such write is
    /// refused. `durability = "replicated"` in `serve`. On a cluster, one replica per shard
    /// (the nodes' replicas are not learned).
    EveryReplica {
        /// How long to wait for them.
        timeout: Duration,
    },
}

impl Durability {
    /// Every replica the master has had lately, within one second
    /// ([`Durability::EveryReplica`]; `durability = "replicated"` in `serve`).
    pub fn replicated() -> Self {
        Durability::EveryReplica {
            timeout: Duration::from_secs(1),
        }
    }
}
