//! The configuration file as written: its composition, and the sections that are the
//! service's own. A section that is one library option type is that type, which
//! deserializes itself (`deny_unknown_fields`, its own defaults, durations through
//! [`human`](crate::engine::duration::human)): `[dispatcher]` is
//! [`DispatcherOptions`], `[housekeeping]` [`HousekeepingOptions`], `[dead]`
//! [`DeadLetterOptions`]. A table that is partly one embeds it in a field renamed
//! `<options>`, whose keys sit in the table itself (see `embed`): `[reconciliation]`'s
//! [`ReconcileOptions`], each `[[handlers]]` entry's [`WorkerOptions`], `[http]`'s
//! [`HttpLimits`] and the top level's [`ClientOptions`]. Elsewhere unset fields mean "the library's default": no default
//! is written here that a library option type already has.

use super::TelemetryOptions;
use crate::engine::client::ClientOptions;
use crate::engine::loops::dispatcher::DispatcherOptions;
use crate::engine::loops::housekeeping::{DeadLetterOptions, HousekeepingOptions};
use crate::engine::redact;
use crate::engine::worker::WorkerOptions;
use crate::orders::reconcile::ReconcileOptions;
use crate::service::http::HttpLimits;
use serde::Deserialize;

/// The whole configuration file. Its `Debug` masks credentials, tokens and secrets.
#[derive(Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Redis URL: required (no silent default; `DELAYQ_REDIS_URL` sets it too). Once the
    /// configuration is checked, it also carries the `redis_tls_*` files as its `tls_ca`,
    /// `tls_cert` and `tls_key` query parameters (see [`crate::engine::conn`]).
    pub redis_url: String,
    /// A PEM file of the CA that signed the Redis server's certificate, trusted instead of
    /// the system's roots (a `rediss://` URL only; `DELAYQ_REDIS_TLS_CA`).
    pub redis_tls_ca: Option<String>,
    /// A PEM client certificate for servers that require one (mutual TLS); needs
    /// `redis_tls_key` (`DELAYQ_REDIS_TLS_CERT`).
    pub redis_tls_cert: Option<String>,
    /// The client certificate's PEM private key (`DELAYQ_REDIS_TLS_KEY`).
    pub redis_tls_key: Option<String>,
    /// `namespace`, `shards`, `max_payload_bytes`, `durability`, `max_queues`,
    /// `max_groups`: the client's options, top-level keys.
    #[serde(rename = "<options>")]
    pub client: ClientOptions,
    /// Queues created at start-up (besides those of handlers and reconciliation). Which
    /// queues this process dispatches is `dispatch`'s business.
    pub queues: Vec<String>,
    /// Which registered queues this process dispatches: `"all"` (default: every queue of
    /// the registry, followed as it changes), `"none"`, or a list of names.
    pub dispatch: Option<DispatchConfig>,
    /// How long shutdown waits for running handlers (default 10 s); `serve` exits within
    /// this plus a moment, whatever the backlog.
    pub shutdown_grace: Option<String>,
    /// How long `serve` waits for Redis at start-up (default `60s`), answering `/healthz`
    /// 200 and `/readyz` 503 meanwhile; then it exits 3.
    pub startup_timeout: Option<String>,
    /// How long the history of dispatched orders is kept (`GET .../messages/{id}`, `delayq
    /// get`, reconciliation): default `24h`, `0s` turns it off. Set on every queue this
    /// service dispatches.
    pub history_retention: Option<String>,
    /// The default `expires_after` of orders that set none (e.g. `30m`; `0s` clears it):
    /// an order a group would get later than this past its due time is dead-lettered for
    /// that group with reason `expired`. Set on every queue of the configuration.
    pub expires_after: Option<String>,
    /// The dedup window after dispatch set on every queue created at start-up (e.g. `24h`;
    /// `0s`: off; unset: each queue keeps its own, off unless set): scheduling an id
    /// dispatched within it answers `duplicate` unless the order asks to `repeat`.
    pub dedup_window: Option<String>,
    /// Cancel-on-event rules (e.g. `[{ event = "order.paid", match = "order_id", remember =
    /// "15m", queues = ["order-close", "reminder"] }]`): set on the queues a rule names
    /// (every queue of the configuration without `queues`); given, it replaces each
    /// queue's rules (`[]` removes them); unset: each queue keeps its own.
    pub cancel_on: Option<Vec<serde_json::Value>>,
    /// The HTTP API.
    pub http: HttpConfig,
    /// The dispatcher.
    pub dispatcher: DispatcherOptions,
    /// Housekeeping chores.
    pub housekeeping: HousekeepingOptions,
    /// Dead-letter retention.
    pub dead: DeadLetterOptions,
    /// Business handlers: one consumer group each.
    pub handlers: Vec<HandlerConfig>,
    /// The reconciliation job (orders database → Redis).
    pub reconciliation: ReconciliationConfig,
    /// Recurring schedules, declared (created or replaced) at start-up; their queues are
    /// created with the others.
    pub schedules: Vec<ScheduleConfig>,
    /// Log lines on stderr: `text` (the default, for people) or `json` (one object per
    /// line, carrying `trace_id` and `span_id` inside a traced delivery or request);
    /// `DELAYQ_LOG_FORMAT`.
    pub log_format: Option<String>,
    /// Trace export over OTLP (see `[telemetry]`).
    pub telemetry: TelemetryOptions,
}

/// `[[schedules]]`: a recurring schedule (see `engine::schedules`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// The queue its ticks go to.
    pub queue: String,
    /// Its id (`[A-Za-z0-9._-]`, at most 128 bytes).
    pub id: String,
    /// A cron expression (six fields with seconds first, or the classic five).
    pub cron: Option<String>,
    /// An interval (`30s`, `5m`; at least 1 s) instead of `cron`.
    pub every: Option<String>,
    /// An IANA time zone for `cron` (default `UTC`).
    pub timezone: Option<String>,
    /// The payload each tick delivers (default `{}`).
    pub payload: Option<serde_json::Value>,
    /// No tick before this (RFC 3339 or unix ms).
    pub start: Option<String>,
    /// No tick after this (RFC 3339 or unix ms).
    pub end: Option<String>,
    /// `skip` (default) or `fire_once`: what to do with ticks no process was running for.
    pub missed: Option<String>,
}

/// `dispatch`: a word (`"all"`, `"none"`) or a list of queue names.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum DispatchConfig {
    /// `"all"` or `"none"`.
    Word(String),
    /// Only these queues.
    List(Vec<String>),
}

/// The top-level keys of [`Config`]: the only `DELAYQ_<KEY>` environment variables `serve`
/// reads (others, such as the CLI's `DELAYQ_DATABASE_URL`, are not its business).
pub const TOP_LEVEL_KEYS: &[&str] = &[
    "redis_url",
    "redis_tls_ca",
    "redis_tls_cert",
    "redis_tls_key",
    "namespace",
    "shards",
    "max_payload_bytes",
    "durability",
    "queues",
    "dispatch",
    "max_queues",
    "max_groups",
    "shutdown_grace",
    "startup_timeout",
    "history_retention",
    "expires_after",
    "dedup_window",
    "cancel_on",
    "http",
    "dispatcher",
    "housekeeping",
    "dead",
    "handlers",
    "reconciliation",
    "schedules",
    "log_format",
    "telemetry",
];

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("redis_url", &redact::url(&self.redis_url))
            .field("redis_tls_ca", &self.redis_tls_ca)
            .field("redis_tls_cert", &self.redis_tls_cert)
            .field("redis_tls_key", &self.redis_tls_key)
            .field("client", &self.client)
            .field("queues", &self.queues)
            .field("dispatch", &self.dispatch)
            .field("http", &self.http)
            .field("handlers", &self.handlers)
            .field("reconciliation", &self.reconciliation)
            .field("log_format", &self.log_format)
            .field("telemetry", &self.telemetry)
            .finish_non_exhaustive()
    }
}

/// `[http]`. Unset limits are [`HttpLimits`]'s defaults.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address to listen on.
    pub listen: String,
    /// Bearer tokens accepted on `/v1/...`; empty = the API is open (a warning is logged).
    pub tokens: Vec<String>,
    /// `max_body_bytes`, the timeouts, `max_connections`, `allowed_hosts`,
    /// `trusted_proxies`, `metrics_token`: the HTTP edge's limits, keys of this same table.
    #[serde(rename = "<options>")]
    pub limits: HttpLimits,
    /// Consumer-only tokens, each `{token = "...", groups = ["queue/group", ...]}`: it may
    /// only receive, ack, nack and extend on those groups (403 `forbidden_for_token` on
    /// anything else); needs `tokens`.
    pub consumer_tokens: Vec<ConsumerTokenConfig>,
}

/// `[[http.consumer_tokens]]`: a bearer token for pull consumers of some groups.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerTokenConfig {
    /// The bearer token (at least 8 characters, no spaces; never logged).
    pub token: String,
    /// The groups it may pull from, each `"queue/group"`.
    pub groups: Vec<String>,
}

impl std::fmt::Debug for ConsumerTokenConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerTokenConfig")
            .field("token", &"hidden")
            .field("groups", &self.groups)
            .finish()
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: "127.0.0.1:7070".into(),
            tokens: Vec::new(),
            limits: HttpLimits::default(),
            consumer_tokens: Vec::new(),
        }
    }
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConfig")
            .field("listen", &self.listen)
            .field("tokens", &format_args!("{} hidden", self.tokens.len()))
            .field("limits", &self.limits)
            .field("consumer_tokens", &self.consumer_tokens)
            .finish_non_exhaustive()
    }
}

/// One `[[handlers]]` entry.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerConfig {
    /// The queue (or `queues`).
    #[serde(default)]
    pub queue: Option<String>,
    /// Several queues served by this one handler, most urgent first, each with its own
    /// consumer group `group` and one concurrency budget (instead of `queue`).
    #[serde(default)]
    pub queues: Option<Vec<String>>,
    /// With `queues`: one weight per queue, most urgent first (e.g. `[6, 3, 1]`), to share
    /// the reads while several have a backlog; without it, strict order.
    #[serde(default)]
    pub queue_weights: Option<Vec<u32>>,
    /// The consumer group.
    pub group: String,
    /// `webhook`, `log`, `order-close`, or `pull` (consumed over HTTP by
    /// `POST /v1/queues/{queue}/groups/{group}:receive`; no handler runs in serve).
    pub kind: String,
    /// The orders database (kind = order-close): `postgres://...` or `sqlite://file`.
    #[serde(default)]
    pub database_url: Option<String>,
    /// Webhook URL (kind = webhook).
    #[serde(default)]
    pub url: Option<String>,
    /// The Standard Webhooks signing secret (`whsec_<base64>`, or any text used as the key
    /// as is), or a list of them while a key is rotated (each signs).
    #[serde(default)]
    pub secret: Option<Secrets>,
    /// `concurrency`, `timeout`, `max_attempts`, `backoff`, `visibility_timeout`,
    /// `prefetch`, `rate_limit`, `priority_weights`: the worker's options, keys of this same
    /// entry.
    #[serde(rename = "<options>")]
    pub worker: WorkerOptions,
    /// Which of the worker's keys the entry wrote (a pull group refuses a handler's own).
    #[serde(rename = "<written>", default)]
    pub written: Vec<String>,
    /// The lease of a receive that names none (kind = pull only; default 30 s; 100ms..12h).
    #[serde(default)]
    pub lease: Option<String>,
}

impl std::fmt::Debug for HandlerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerConfig")
            .field("queue", &self.queue)
            .field("queues", &self.queues)
            .field("group", &self.group)
            .field("kind", &self.kind)
            .field("url", &self.url.as_deref().map(redact::url))
            .field(
                "database_url",
                &self.database_url.as_deref().map(redact::url),
            )
            .field("secret", &self.secret)
            .finish_non_exhaustive()
    }
}

/// One webhook secret, or several (key rotation).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Secrets {
    /// One secret.
    One(String),
    /// Several; every one signs.
    Many(Vec<String>),
}

impl Secrets {
    /// The secrets, in order.
    pub fn list(&self) -> Vec<String> {
        match self {
            Secrets::One(s) => vec![s.clone()],
            Secrets::Many(v) => v.clone(),
        }
    }
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a secret.
        write!(f, "Secrets({} hidden)", self.list().len())
    }
}

/// `[reconciliation]`: sends the close event of every order still pending in the database
/// well past its expiry (see [`crate::orders::reconcile`]).
#[derive(Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReconciliationConfig {
    /// On or off; unset = on when an `order-close` handler is configured.
    pub enabled: Option<bool>,
    /// The orders database; unset = the first `order-close` handler's.
    pub database_url: Option<String>,
    /// The queue of close events; unset = the first `order-close` handler's.
    pub queue: Option<String>,
    /// The group that closes orders (the only one reconciliation events reach); unset = the
    /// `order-close` handler's group on that queue.
    pub group: Option<String>,
    /// `cron`, `grace`, `batch`: the reconciler's options, keys of this same table.
    #[serde(rename = "<options>")]
    pub options: ReconcileOptions,
}

impl std::fmt::Debug for ReconciliationConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReconciliationConfig")
            .field("enabled", &self.enabled)
            .field(
                "database_url",
                &self.database_url.as_deref().map(redact::url),
            )
            .field("queue", &self.queue)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}
