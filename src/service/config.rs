//! `delayq serve`'s configuration: TOML, every key overridable by `DELAYQ_<KEY>` environment
//! variables (nested keys with `__`, e.g. `DELAYQ_HTTP__LISTEN`), unknown keys and bad values
//! refused at start-up with the key named.

use crate::engine::backoff::Backoff;
use crate::engine::duration::parse_duration;
use crate::engine::keys::{Keyspace, QueueName, validate_member_name};
use crate::error::InvalidInput;
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Redis URL.
    pub redis_url: String,
    /// Key namespace.
    pub namespace: String,
    /// Shards per queue.
    pub shards: u16,
    /// Largest accepted payload, bytes.
    pub max_payload_bytes: usize,
    /// `leader` (acknowledge once the master has it) or `replicated` (once a replica confirms
    /// it, within one second; else the API answers 503 `not_replicated`).
    pub durability: String,
    /// Extra queues to dispatch (queues of handlers are dispatched anyway).
    pub queues: Vec<String>,
    /// The HTTP API.
    pub http: HttpConfig,
    /// The dispatcher.
    pub dispatcher: DispatcherConfig,
    /// Housekeeping chores.
    pub housekeeping: HousekeepingConfig,
    /// Business handlers: one consumer group each.
    pub handlers: Vec<HandlerConfig>,
    /// The reconciliation job (orders database → Redis).
    pub reconciliation: ReconciliationConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            redis_url: "redis://127.0.0.1:6379".into(),
            namespace: "dq".into(),
            shards: 1,
            max_payload_bytes: crate::engine::client::DEFAULT_MAX_PAYLOAD_BYTES,
            durability: "leader".into(),
            queues: Vec::new(),
            http: HttpConfig::default(),
            dispatcher: DispatcherConfig::default(),
            housekeeping: HousekeepingConfig::default(),
            handlers: Vec::new(),
            reconciliation: ReconciliationConfig::default(),
        }
    }
}

/// `[reconciliation]`: reschedules the close event of every order still pending in the
/// database well past its expiry (see [`crate::orders::reconcile`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReconciliationConfig {
    /// On or off; unset = on when an `order-close` handler is configured.
    pub enabled: Option<bool>,
    /// The orders database; unset = the first `order-close` handler's.
    pub database_url: Option<String>,
    /// The queue of close events; unset = the first `order-close` handler's.
    pub queue: Option<String>,
    /// When to run (six fields, seconds first, UTC).
    pub cron: String,
    /// How long past its expiry a pending order must be to be rescheduled.
    pub grace: String,
    /// Orders per query and per schedule call, 1..=1000.
    pub batch: usize,
}

impl Default for ReconciliationConfig {
    fn default() -> Self {
        let d = crate::orders::reconcile::ReconcileOptions::default();
        ReconciliationConfig {
            enabled: None,
            database_url: None,
            queue: None,
            cron: d.cron,
            grace: "60s".into(),
            batch: d.batch,
        }
    }
}

/// The reconciliation job's settings, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ReconcileSpec {
    /// The orders database.
    pub database_url: String,
    /// The queue of close events.
    pub queue: String,
    /// Schedule, grace and batch size.
    pub options: crate::orders::reconcile::ReconcileOptions,
}

/// `[http]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address to listen on.
    pub listen: String,
    /// Bearer tokens accepted on `/v1/...`; empty = the API is open (a warning is logged).
    pub tokens: Vec<String>,
    /// Largest request body, bytes (413 above).
    pub max_body_bytes: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: "127.0.0.1:7070".into(),
            tokens: Vec::new(),
            max_body_bytes: 1 << 20,
        }
    }
}

/// `[dispatcher]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DispatcherConfig {
    /// Orders per dequeue call, 1..=1000.
    pub batch: usize,
    /// Longest idle sleep.
    pub max_idle: String,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        DispatcherConfig {
            batch: 1000,
            max_idle: "250ms".into(),
        }
    }
}

/// `[housekeeping]` (six-field cron expressions, seconds first, UTC).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HousekeepingConfig {
    /// Stream trimming.
    pub trim_cron: String,
    /// Idle consumer cleanup.
    pub consumers_cron: String,
    /// Idle time after which a consumer with nothing pending is deleted.
    pub consumer_max_idle: String,
    /// Safety sweep.
    pub sweep_cron: String,
}

impl Default for HousekeepingConfig {
    fn default() -> Self {
        let d = crate::engine::housekeeping::HousekeepingOptions::default();
        HousekeepingConfig {
            trim_cron: d.trim_cron,
            consumers_cron: d.consumers_cron,
            consumer_max_idle: "1h".into(),
            sweep_cron: d.sweep_cron,
        }
    }
}

/// One `[[handlers]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerConfig {
    /// The queue.
    pub queue: String,
    /// The consumer group.
    pub group: String,
    /// `webhook` or `log`.
    pub kind: String,
    /// The orders database (kind = order-close): `postgres://...` or `sqlite://file`.
    #[serde(default)]
    pub database_url: Option<String>,
    /// Webhook URL (kind = webhook).
    #[serde(default)]
    pub url: Option<String>,
    /// HMAC-SHA256 key signing webhook bodies.
    #[serde(default)]
    pub secret: Option<String>,
    /// Handler calls at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Handler timeout.
    #[serde(default = "default_timeout")]
    pub timeout: String,
    /// Attempts before dead-lettering.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// Backoff policy: `fixed:5s`, `linear:2m:1m`, `exponential:1s:10m`.
    #[serde(default = "default_backoff")]
    pub backoff: String,
    /// Pending longer than this with no live lease = reclaimed.
    #[serde(default = "default_visibility")]
    pub visibility_timeout: String,
    /// Entries taken ahead of free handler slots (default three times `concurrency`).
    #[serde(default)]
    pub prefetch: Option<usize>,
}

fn default_concurrency() -> usize {
    16
}
fn default_timeout() -> String {
    "10s".into()
}
fn default_max_attempts() -> u32 {
    10
}
fn default_backoff() -> String {
    "exponential:1s:10m".into()
}
fn default_visibility() -> String {
    "30s".into()
}

/// A handler's settings, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct HandlerSpec {
    /// The queue.
    pub queue: String,
    /// The consumer group.
    pub group: String,
    /// What it does.
    pub kind: HandlerKind,
    /// Handler calls at once.
    pub concurrency: usize,
    /// Handler timeout.
    pub timeout: Duration,
    /// Attempts before dead-lettering.
    pub max_attempts: u32,
    /// Backoff policy.
    pub backoff: Backoff,
    /// Visibility timeout.
    pub visibility_timeout: Duration,
    /// Prefetch (`None` = the default).
    pub prefetch: Option<usize>,
}

/// The built-in handler kinds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandlerKind {
    /// POST each order to `url`, signed with `secret` when set.
    Webhook {
        /// The URL.
        url: String,
        /// The HMAC key.
        secret: Option<String>,
    },
    /// Write each order to the log and acknowledge it.
    Log,
    /// Close the order in the orders database (see [`crate::orders::close`]).
    OrderClose {
        /// The orders database.
        database_url: String,
    },
}

/// The configuration, checked: what `serve` runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The raw configuration.
    pub config: Config,
    /// Where the HTTP API listens.
    pub listen: SocketAddr,
    /// Dispatcher idle cap.
    pub max_idle: Duration,
    /// Idle consumer age.
    pub consumer_max_idle: Duration,
    /// The handlers.
    pub handlers: Vec<HandlerSpec>,
    /// Every queue to dispatch (handlers' and extra), sorted, unique.
    pub queues: Vec<String>,
    /// The reconciliation job, when on.
    pub reconciliation: Option<ReconcileSpec>,
}

/// A configuration problem, naming the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config error: {0}")]
pub struct ConfigError(pub String);

/// Reads `path` (TOML) with `DELAYQ_...` environment overrides and checks every value.
pub fn load(path: &Path) -> Result<Settings, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
    load_str(&text, Env::prefixed("DELAYQ_").split("__"))
}

/// Like [`load`], from TOML text and an environment provider (tests pass their own).
pub fn load_str(text: &str, env: Env) -> Result<Settings, ConfigError> {
    let config: Config = Figment::from(Serialized::defaults(Config::default()))
        .merge(Toml::string(text))
        .merge(env)
        .extract()
        .map_err(|e| ConfigError(e.to_string()))?;
    check(config)
}

fn key_err(key: &str, e: impl std::fmt::Display) -> ConfigError {
    ConfigError(format!("{key}: {e}"))
}

fn duration(key: &str, v: &str) -> Result<Duration, ConfigError> {
    parse_duration("duration", v).map_err(|e| match e {
        InvalidInput::Option { reason, .. } => key_err(key, reason),
        other => key_err(key, other),
    })
}

/// Checks every value of `config`.
pub fn check(config: Config) -> Result<Settings, ConfigError> {
    crate::engine::conn::Backend::open(&config.redis_url).map_err(|e| key_err("redis_url", e))?;
    Keyspace::new(&config.namespace).map_err(|e| key_err("namespace", e))?;
    if !(1..=1024).contains(&config.shards) {
        return Err(key_err("shards", "must be 1..=1024"));
    }
    if config.max_payload_bytes == 0 {
        return Err(key_err("max_payload_bytes", "must be at least 1"));
    }
    if !matches!(config.durability.as_str(), "leader" | "replicated") {
        return Err(key_err(
            "durability",
            format!("{:?} is not leader or replicated", config.durability),
        ));
    }
    let listen: SocketAddr = config
        .http
        .listen
        .parse()
        .map_err(|e| key_err("http.listen", format!("{:?}: {e}", config.http.listen)))?;
    if config.http.max_body_bytes < 1024 {
        return Err(key_err("http.max_body_bytes", "must be at least 1024"));
    }
    if config.http.tokens.iter().any(|t| t.len() < 8) {
        return Err(key_err(
            "http.tokens",
            "each token must be at least 8 characters",
        ));
    }
    if !(1..=1000).contains(&config.dispatcher.batch) {
        return Err(key_err("dispatcher.batch", "must be 1..=1000"));
    }
    let max_idle = duration("dispatcher.max_idle", &config.dispatcher.max_idle)?;
    if max_idle.is_zero() {
        return Err(key_err("dispatcher.max_idle", "must be more than zero"));
    }
    let hk = &config.housekeeping;
    let consumer_max_idle = duration("housekeeping.consumer_max_idle", &hk.consumer_max_idle)?;
    for (key, cron) in [
        ("housekeeping.trim_cron", &hk.trim_cron),
        ("housekeeping.consumers_cron", &hk.consumers_cron),
        ("housekeeping.sweep_cron", &hk.sweep_cron),
    ] {
        crate::engine::housekeeping::validate_cron("cron", cron).map_err(|e| match e {
            InvalidInput::Option { reason, .. } => key_err(key, reason),
            other => key_err(key, other),
        })?;
    }
    let mut queues: Vec<String> = Vec::new();
    for (i, q) in config.queues.iter().enumerate() {
        QueueName::new(q).map_err(|e| key_err(&format!("queues[{i}]"), e))?;
        queues.push(q.clone());
    }
    let mut handlers = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, h) in config.handlers.iter().enumerate() {
        let k = |f: &str| format!("handlers[{i}].{f}");
        QueueName::new(&h.queue).map_err(|e| key_err(&k("queue"), e))?;
        validate_member_name("group", &h.group).map_err(|e| key_err(&k("group"), e))?;
        if !seen.insert((h.queue.clone(), h.group.clone())) {
            return Err(key_err(
                &k("group"),
                format!("{:?} is configured twice for queue {:?}", h.group, h.queue),
            ));
        }
        let kind = match h.kind.as_str() {
            "webhook" => {
                let url = h
                    .url
                    .clone()
                    .ok_or_else(|| key_err(&k("url"), "required for kind = \"webhook\""))?;
                let ok = url.starts_with("http://") || url.starts_with("https://");
                if !ok || reqwest::Url::parse(&url).is_err() {
                    return Err(key_err(&k("url"), format!("{url:?} is not an http(s) URL")));
                }
                HandlerKind::Webhook {
                    url,
                    secret: h.secret.clone(),
                }
            }
            "log" => HandlerKind::Log,
            "order-close" => {
                let url = h.database_url.clone().ok_or_else(|| {
                    key_err(&k("database_url"), "required for kind = \"order-close\"")
                })?;
                crate::orders::db::check_url(&url).map_err(|e| key_err(&k("database_url"), e))?;
                HandlerKind::OrderClose { database_url: url }
            }
            other => {
                return Err(key_err(
                    &k("kind"),
                    format!("{other:?} is not a handler kind (webhook, log, order-close)"),
                ));
            }
        };
        if !matches!(kind, HandlerKind::Webhook { .. }) && (h.url.is_some() || h.secret.is_some()) {
            return Err(key_err(
                &k("url"),
                "url and secret are for kind = \"webhook\" only",
            ));
        }
        if !matches!(kind, HandlerKind::OrderClose { .. }) && h.database_url.is_some() {
            return Err(key_err(
                &k("database_url"),
                "database_url is for kind = \"order-close\" only",
            ));
        }
        if !(1..=10_000).contains(&h.concurrency) {
            return Err(key_err(&k("concurrency"), "must be 1..=10000"));
        }
        let timeout = duration(&k("timeout"), &h.timeout)?;
        if timeout.is_zero() {
            return Err(key_err(&k("timeout"), "must be more than zero"));
        }
        if h.max_attempts == 0 {
            return Err(key_err(&k("max_attempts"), "must be at least 1"));
        }
        let backoff = Backoff::parse(&h.backoff).map_err(|e| match e {
            InvalidInput::Option { reason, .. } => key_err(&k("backoff"), reason),
            other => key_err(&k("backoff"), other),
        })?;
        let visibility_timeout = duration(&k("visibility_timeout"), &h.visibility_timeout)?;
        if visibility_timeout < Duration::from_millis(100) {
            return Err(key_err(&k("visibility_timeout"), "must be at least 100ms"));
        }
        if h.prefetch.is_some_and(|p| p > 10_000) {
            return Err(key_err(&k("prefetch"), "must be 0..=10000"));
        }
        queues.push(h.queue.clone());
        handlers.push(HandlerSpec {
            queue: h.queue.clone(),
            group: h.group.clone(),
            kind,
            concurrency: h.concurrency,
            timeout,
            max_attempts: h.max_attempts,
            backoff,
            visibility_timeout,
            prefetch: h.prefetch,
        });
    }
    let reconciliation = check_reconciliation(&config.reconciliation, &handlers)?;
    if let Some(r) = &reconciliation {
        queues.push(r.queue.clone());
    }
    queues.sort();
    queues.dedup();
    Ok(Settings {
        config,
        listen,
        max_idle,
        consumer_max_idle,
        handlers,
        queues,
        reconciliation,
    })
}

fn check_reconciliation(
    r: &ReconciliationConfig,
    handlers: &[HandlerSpec],
) -> Result<Option<ReconcileSpec>, ConfigError> {
    let close = handlers.iter().find_map(|h| match &h.kind {
        HandlerKind::OrderClose { database_url } => Some((h.queue.clone(), database_url.clone())),
        _ => None,
    });
    if !r.enabled.unwrap_or(close.is_some()) {
        return Ok(None);
    }
    let database_url = match (&r.database_url, &close) {
        (Some(u), _) => {
            crate::orders::db::check_url(u)
                .map_err(|e| key_err("reconciliation.database_url", e))?;
            u.clone()
        }
        (None, Some((_, u))) => u.clone(),
        (None, None) => {
            return Err(key_err(
                "reconciliation.database_url",
                "required when no order-close handler is configured",
            ));
        }
    };
    let queue = match (&r.queue, &close) {
        (Some(q), _) => {
            QueueName::new(q).map_err(|e| key_err("reconciliation.queue", e))?;
            q.clone()
        }
        (None, Some((q, _))) => q.clone(),
        (None, None) => {
            return Err(key_err(
                "reconciliation.queue",
                "required when no order-close handler is configured",
            ));
        }
    };
    crate::engine::housekeeping::validate_cron("cron", &r.cron).map_err(|e| match e {
        InvalidInput::Option { reason, .. } => key_err("reconciliation.cron", reason),
        other => key_err("reconciliation.cron", other),
    })?;
    let grace = duration("reconciliation.grace", &r.grace)?;
    if !(1..=1000).contains(&r.batch) {
        return Err(key_err("reconciliation.batch", "must be 1..=1000"));
    }
    Ok(Some(ReconcileSpec {
        database_url,
        queue,
        options: crate::orders::reconcile::ReconcileOptions::default()
            .cron(r.cron.clone())
            .grace(grace)
            .batch(r.batch),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> Env {
        Env::prefixed("DELAYQ_TEST_NONE_")
    }

    const GOOD: &str = r#"
redis_url = "redis://127.0.0.1:6379"
namespace = "dq"
[http]
listen = "127.0.0.1:7070"
tokens = ["change-me"]
max_body_bytes = 1048576
[[handlers]]
queue = "order-close"
group = "close-order"
kind = "webhook"
url = "http://127.0.0.1:9000/orders/close"
secret = "hmac-key"
concurrency = 16
timeout = "10s"
max_attempts = 10
backoff = "linear:2m:1m"
visibility_timeout = "30s"
"#;

    #[test]
    fn the_documented_example_loads() {
        let s = load_str(GOOD, env()).unwrap();
        assert_eq!(s.handlers.len(), 1);
        assert_eq!(s.queues, vec!["order-close"]);
        assert_eq!(s.handlers[0].timeout, Duration::from_secs(10));
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            (
                GOOD.replace(
                    "namespace = \"dq\"",
                    "namespace = \"dq\"\nnamespaec = \"x\"",
                ),
                "namespaec",
            ),
            (
                GOOD.replace(
                    "max_body_bytes = 1048576",
                    "max_body_bytes = 1048576\nport = 1",
                ),
                "port",
            ),
            (
                GOOD.replace("concurrency = 16", "concurrency = 16\nretries = 3"),
                "retries",
            ),
            (
                GOOD.replace("timeout = \"10s\"", "timeout = \"10 seconds\""),
                "handlers[0].timeout",
            ),
            (
                GOOD.replace("linear:2m:1m", "linear:2m"),
                "handlers[0].backoff",
            ),
            (
                GOOD.replace("kind = \"webhook\"", "kind = \"email\""),
                "handlers[0].kind",
            ),
            (GOOD.replace("127.0.0.1:7070", "localhost"), "http.listen"),
            (
                GOOD.replace("concurrency = 16", "concurrency = \"many\""),
                "concurrency",
            ),
            (
                GOOD.replace("redis://127.0.0.1:6379", "mysql://x"),
                "redis_url",
            ),
            (
                GOOD.replace("http://127.0.0.1:9000/orders/close", "ftp://x"),
                "handlers[0].url",
            ),
        ];
        for (text, key) in cases {
            let e = load_str(&text, env()).unwrap_err();
            assert!(e.to_string().contains(key), "{key}: {e}");
        }
    }

    const CLOSE: &str = r#"
[[handlers]]
queue = "order-close"
group = "close-order"
kind = "order-close"
database_url = "sqlite://orders.db"
"#;

    #[test]
    fn an_order_close_handler_turns_reconciliation_on() {
        let s = load_str(CLOSE, env()).unwrap();
        assert_eq!(
            s.handlers[0].kind,
            HandlerKind::OrderClose {
                database_url: "sqlite://orders.db".into()
            }
        );
        let r = s.reconciliation.unwrap();
        assert_eq!(
            (r.queue.as_str(), r.database_url.as_str()),
            ("order-close", "sqlite://orders.db")
        );
        assert_eq!(
            (r.options.cron.as_str(), r.options.grace),
            ("*/30 * * * * *", Duration::from_secs(60))
        );
        let off = format!("{CLOSE}\n[reconciliation]\nenabled = false\n");
        assert!(load_str(&off, env()).unwrap().reconciliation.is_none());
        // Without an order-close handler it is off unless asked for.
        assert!(load_str(GOOD, env()).unwrap().reconciliation.is_none());
    }

    #[test]
    fn order_close_errors_name_the_key() {
        let cases = [
            (
                CLOSE.replace("database_url = \"sqlite://orders.db\"", ""),
                "handlers[0].database_url",
            ),
            (
                CLOSE.replace("sqlite://orders.db", "mysql://db/orders"),
                "handlers[0].database_url",
            ),
            (
                format!("{CLOSE}\n[reconciliation]\ngrace = \"soon\"\n"),
                "reconciliation.grace",
            ),
            (
                format!("{CLOSE}\n[reconciliation]\ncron = \"* * * * *\"\n"),
                "reconciliation.cron",
            ),
            (
                format!("{CLOSE}\n[reconciliation]\ngrase = \"1m\"\n"),
                "grase",
            ),
            (
                "[reconciliation]\nenabled = true\n".to_owned(),
                "reconciliation.database_url",
            ),
            (
                GOOD.replace("secret = \"hmac-key\"", "database_url = \"sqlite://x.db\""),
                "handlers[0].database_url",
            ),
        ];
        for (text, key) in cases {
            let e = load_str(&text, env()).unwrap_err();
            assert!(e.to_string().contains(key), "{key}: {e}");
        }
    }
}
