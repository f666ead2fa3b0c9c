//! `delayq serve`'s configuration: TOML ([`raw`]), every key overridable by `DELAYQ_<KEY>`
//! environment variables (nested keys with `__`, e.g. `DELAYQ_HTTP__LISTEN`), unknown keys
//! and bad values refused at start-up with the key named.
//!
//! Each raw section is converted into the library's option type (`ClientOptions`,
//! `DispatcherOptions`, `HousekeepingOptions`, `WorkerOptions`, `ReconcileOptions`), and the
//! option type validates itself: ranges and defaults are written once, in the library. A
//! library error is mapped to the config key it came from.

mod handlers;
pub mod raw;

pub use handlers::{HandlerKind, HandlerSpec};
pub use raw::{
    Config, DeadConfig, DispatcherConfig, HandlerConfig, HousekeepingConfig, HttpConfig,
    ReconciliationConfig, Secrets,
};

use crate::engine::client::{ClientOptions, Durability};
use crate::engine::dispatcher::DispatcherOptions;
use crate::engine::duration::parse_duration;
use crate::engine::housekeeping::HousekeepingOptions;
use crate::engine::keys::QueueName;
use crate::engine::redact;
use crate::error::InvalidInput;
use crate::orders::reconcile::ReconcileOptions;
use crate::service::http::HttpLimits;
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// The reconciliation job's settings, checked.
#[derive(Clone, PartialEq)]
pub struct ReconcileSpec {
    /// The orders database.
    pub database_url: String,
    /// The queue of close events.
    pub queue: String,
    /// The group that closes orders: the only one reconciliation events go to.
    pub group: String,
    /// Schedule, grace and batch size.
    pub options: ReconcileOptions,
}

impl std::fmt::Debug for ReconcileSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReconcileSpec")
            .field("database_url", &redact::url(&self.database_url))
            .field("queue", &self.queue)
            .field("group", &self.group)
            .field("options", &self.options)
            .finish()
    }
}

/// The configuration, checked: what `serve` runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The raw configuration.
    pub config: Config,
    /// Where the HTTP API listens.
    pub listen: SocketAddr,
    /// The HTTP edge's limits.
    pub http: HttpLimits,
    /// The client (namespace, shards, payload limit, durability).
    pub client: ClientOptions,
    /// Every dispatcher's options.
    pub dispatcher: DispatcherOptions,
    /// The housekeeping chores.
    pub housekeeping: HousekeepingOptions,
    /// The handlers.
    pub handlers: Vec<HandlerSpec>,
    /// Every queue to dispatch (handlers' and extra), sorted, unique.
    pub queues: Vec<String>,
    /// How long shutdown waits for running handlers (every worker's `shutdown_grace`).
    pub shutdown_grace: Duration,
    /// The order-history retention set on every queue it dispatches (`None`: leave each
    /// queue's as it is, 24 h unless set).
    pub history_retention: Option<Duration>,
    /// The reconciliation job, when on.
    pub reconciliation: Option<ReconcileSpec>,
}

/// A configuration problem: the key and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config error: {}{cause}", key.as_deref().map(|k| format!("{k}: ")).unwrap_or_default())]
pub struct ConfigError {
    /// The key (`handlers[1].visibility_timeout`), when one is to blame.
    pub key: Option<String>,
    /// What is wrong.
    pub cause: String,
}

impl ConfigError {
    /// An error about `key`.
    pub fn at(key: impl Into<String>, cause: impl std::fmt::Display) -> Self {
        ConfigError {
            key: Some(key.into()),
            cause: cause.to_string(),
        }
    }

    /// An error about the file as a whole.
    pub fn whole(cause: impl std::fmt::Display) -> Self {
        ConfigError {
            key: None,
            cause: cause.to_string(),
        }
    }
}

/// Maps a library option error to the config key it came from: `prefix.<key>`, where the
/// library's option name is renamed through `renames` (library name, config key) when they
/// differ. Any other input error is blamed on `whole` (or the prefix).
pub(crate) fn lib_err<'a>(
    prefix: &'a str,
    renames: &'a [(&'a str, &'a str)],
) -> impl Fn(InvalidInput) -> ConfigError + 'a {
    move |e| match e {
        InvalidInput::Option { name, reason } => {
            let key = renames
                .iter()
                .find(|(lib, _)| *lib == name)
                .map_or(name, |(_, cfg)| cfg);
            ConfigError::at(join(prefix, key), reason)
        }
        other => ConfigError::at(prefix, other),
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

/// Blames a value's parse error on `key` (an option error's reason alone, else the error).
pub(crate) fn at_key(key: &str) -> impl Fn(InvalidInput) -> ConfigError + '_ {
    move |e| match e {
        InvalidInput::Option { reason, .. } => ConfigError::at(key, reason),
        other => ConfigError::at(key, other),
    }
}

/// Parses an optional duration under `key`.
pub(crate) fn duration(key: &str, v: Option<&str>) -> Result<Option<Duration>, ConfigError> {
    v.map(|v| parse_duration("duration", v).map_err(at_key(key)))
        .transpose()
}

/// A figment error as a [`ConfigError`] naming its key, with no value in it: a mistyped
/// token, secret or URL must not be echoed to the terminal or the logs.
fn figment_error(e: figment::Error) -> ConfigError {
    use figment::error::{Actual, Kind};
    let kind_of = |a: &Actual| -> String {
        match a {
            Actual::Bool(_) => "a boolean".into(),
            Actual::Unsigned(_) | Actual::Signed(_) => "an integer".into(),
            Actual::Float(_) => "a float".into(),
            Actual::Char(_) | Actual::Str(_) => "a string".into(),
            Actual::Bytes(_) => "bytes".into(),
            Actual::Seq => "a list".into(),
            Actual::Map => "a table".into(),
            other => format!("{other}"),
        }
    };
    let cause = match &e.kind {
        Kind::InvalidType(a, expected) => format!("found {}, expected {expected}", kind_of(a)),
        Kind::InvalidValue(a, expected) => {
            format!("invalid {}, expected {expected}", kind_of(a))
        }
        Kind::UnknownField(f, known) => format!("unknown key {f:?} (known: {})", known.join(", ")),
        Kind::Message(m) => crate::engine::redact::text(m.lines().next().unwrap_or_default()),
        other => crate::engine::redact::text(&other.to_string()),
    };
    let key = e.path.join(".");
    if key.is_empty() {
        ConfigError::whole(cause)
    } else {
        ConfigError::at(key, cause)
    }
}

/// Reads `path` (TOML) with `DELAYQ_...` environment overrides and checks every value.
pub fn load(path: &Path) -> Result<Settings, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::whole(format!("cannot read {}: {e}", path.display())))?;
    load_str(&text, env())
}

/// The `DELAYQ_<KEY>` environment overrides (nested keys with `__`), for the config's own
/// keys only.
pub fn env() -> Env {
    Env::prefixed("DELAYQ_")
        .filter(|k| {
            let top = k.as_str().split("__").next().unwrap_or_default();
            raw::TOP_LEVEL_KEYS
                .iter()
                .any(|known| known.eq_ignore_ascii_case(top))
        })
        .split("__")
}

/// Like [`load`], from TOML text and an environment provider (tests pass their own).
pub fn load_str(text: &str, env: Env) -> Result<Settings, ConfigError> {
    let config: Config = Figment::from(Serialized::defaults(Config::default()))
        .merge(Toml::string(text))
        .merge(env)
        .extract()
        .map_err(figment_error)?;
    check(config)
}

/// Checks every value of `config`.
pub fn check(config: Config) -> Result<Settings, ConfigError> {
    crate::engine::conn::RedisTarget::open(&config.redis_url)
        .map_err(|e| ConfigError::at("redis_url", e))?;
    let client = client_options(&config)?;
    let (listen, http) = check_http(&config.http)?;
    let dispatcher = dispatcher_options(&config.dispatcher)?;
    let housekeeping = housekeeping_options(&config.housekeeping, &config.dead)?;
    let mut queues: Vec<String> = Vec::new();
    for (i, q) in config.queues.iter().enumerate() {
        QueueName::new(q).map_err(|e| ConfigError::at(format!("queues[{i}]"), e))?;
        queues.push(q.clone());
    }
    let shutdown_grace = duration("shutdown_grace", config.shutdown_grace.as_deref())?
        .unwrap_or(crate::engine::worker::WorkerOptions::default().shutdown_grace);
    let history_retention = duration("history_retention", config.history_retention.as_deref())?;
    if let Some(r) = history_retention {
        crate::engine::history::HistoryPolicy::new(r).map_err(at_key("history_retention"))?;
    }
    let handlers = handlers::check_all(&config.handlers, shutdown_grace)?;
    queues.extend(handlers.iter().map(|h| h.queue.clone()));
    let reconciliation = check_reconciliation(&config.reconciliation, &handlers)?;
    if let Some(r) = &reconciliation {
        queues.push(r.queue.clone());
    }
    queues.sort();
    queues.dedup();
    Ok(Settings {
        config,
        listen,
        http,
        client,
        dispatcher,
        housekeeping,
        handlers,
        queues,
        shutdown_grace,
        history_retention,
        reconciliation,
    })
}

fn client_options(c: &Config) -> Result<ClientOptions, ConfigError> {
    let mut o = ClientOptions::default();
    if let Some(ns) = &c.namespace {
        o = o.namespace(ns.clone());
    }
    if let Some(n) = c.shards {
        o = o.shards(n);
    }
    if let Some(n) = c.max_payload_bytes {
        o = o.max_payload_bytes(n);
    }
    o = o.durability(match c.durability.as_str() {
        "leader" => Durability::Leader,
        "replicated" => Durability::replicated(),
        other => {
            return Err(ConfigError::at(
                "durability",
                format!("{other:?} is not leader or replicated"),
            ));
        }
    });
    o.validate().map_err(|e| match e {
        InvalidInput::Namespace { .. } => ConfigError::at("namespace", e),
        e => lib_err("", &[])(e),
    })?;
    Ok(o)
}

fn check_http(h: &HttpConfig) -> Result<(SocketAddr, HttpLimits), ConfigError> {
    let listen: SocketAddr = h
        .listen
        .parse()
        .map_err(|e| ConfigError::at("http.listen", format!("{:?}: {e}", h.listen)))?;
    if h.tokens
        .iter()
        .any(|t| t.trim().len() < 8 || t.chars().any(char::is_whitespace))
    {
        return Err(ConfigError::at(
            "http.tokens",
            "each token must be at least 8 characters, without spaces",
        ));
    }
    let mut l = HttpLimits::default();
    if let Some(n) = h.max_body_bytes {
        l = l.max_body_bytes(n);
    }
    if let Some(d) = duration("http.header_timeout", h.header_timeout.as_deref())? {
        l = l.header_timeout(d);
    }
    if let Some(d) = duration("http.body_timeout", h.body_timeout.as_deref())? {
        l = l.body_timeout(d);
    }
    if let Some(d) = duration("http.idle_timeout", h.idle_timeout.as_deref())? {
        l = l.idle_timeout(d);
    }
    if let Some(d) = duration("http.request_timeout", h.request_timeout.as_deref())? {
        l = l.request_timeout(d);
    }
    if let Some(n) = h.max_connections {
        l = l.max_connections(n);
    }
    l.validate().map_err(lib_err("http", &[]))?;
    Ok((listen, l))
}

fn dispatcher_options(d: &DispatcherConfig) -> Result<DispatcherOptions, ConfigError> {
    let mut o = DispatcherOptions::default();
    if let Some(b) = d.batch {
        o = o.batch(b);
    }
    if let Some(m) = duration("dispatcher.max_idle", d.max_idle.as_deref())? {
        o = o.max_idle(m);
    }
    if let Some(l) = duration("dispatcher.linger", d.linger.as_deref())? {
        o = o.linger(l);
    }
    o.validate().map_err(lib_err("dispatcher", &[]))?;
    Ok(o)
}

fn housekeeping_options(
    h: &HousekeepingConfig,
    dead: &DeadConfig,
) -> Result<HousekeepingOptions, ConfigError> {
    let mut o = HousekeepingOptions::default();
    if let Some(c) = &h.trim_cron {
        o = o.trim_cron(c.clone());
    }
    if let Some(c) = &h.consumers_cron {
        o = o.consumers_cron(c.clone());
    }
    if let Some(c) = &h.sweep_cron {
        o = o.sweep_cron(c.clone());
    }
    let key = "housekeeping.consumer_max_idle";
    if let Some(d) = duration(key, h.consumer_max_idle.as_deref())? {
        o = o.consumer_max_idle(d);
    }
    if let Some(d) = duration("dead.retention", dead.retention.as_deref())? {
        o = o.dead_retention(d);
    }
    if let Some(n) = dead.max_per_queue {
        o = o.dead_max_per_queue(n);
    }
    o.validate().map_err(|e| match e {
        InvalidInput::Option {
            name: "dead_max_per_queue",
            reason,
        } => ConfigError::at("dead.max_per_queue", reason),
        e => lib_err("housekeeping", &[])(e),
    })?;
    Ok(o)
}

fn check_reconciliation(
    r: &ReconciliationConfig,
    handlers: &[HandlerSpec],
) -> Result<Option<ReconcileSpec>, ConfigError> {
    let close = handlers.iter().find_map(|h| match &h.kind {
        HandlerKind::OrderClose { database_url } => {
            Some((h.queue.clone(), h.group.clone(), database_url.clone()))
        }
        _ => None,
    });
    if !r.enabled.unwrap_or(close.is_some()) {
        return Ok(None);
    }
    let needed = "required when no order-close handler is configured";
    let database_url = match (&r.database_url, &close) {
        (Some(u), _) => {
            crate::orders::db::check_url(u)
                .map_err(|e| ConfigError::at("reconciliation.database_url", e))?;
            u.clone()
        }
        (None, Some((_, _, u))) => u.clone(),
        (None, None) => return Err(ConfigError::at("reconciliation.database_url", needed)),
    };
    let queue = match (&r.queue, &close) {
        (Some(q), _) => {
            QueueName::new(q).map_err(|e| ConfigError::at("reconciliation.queue", e))?;
            q.clone()
        }
        (None, Some((q, _, _))) => q.clone(),
        (None, None) => return Err(ConfigError::at("reconciliation.queue", needed)),
    };
    // The close group: given, or the order-close handler's on that queue.
    let group = match (&r.group, &close) {
        (Some(g), _) => {
            crate::engine::keys::validate_member_name("group", g)
                .map_err(|e| ConfigError::at("reconciliation.group", e))?;
            g.clone()
        }
        (None, Some((q, g, _))) if *q == queue => g.clone(),
        _ => {
            return Err(ConfigError::at(
                "reconciliation.group",
                "required unless an order-close handler consumes the reconciliation queue",
            ));
        }
    };
    let mut options = ReconcileOptions::default();
    if let Some(c) = &r.cron {
        options = options.cron(c.clone());
    }
    if let Some(g) = duration("reconciliation.grace", r.grace.as_deref())? {
        options = options.grace(g);
    }
    if let Some(b) = r.batch {
        options = options.batch(b);
    }
    options.validate().map_err(lib_err("reconciliation", &[]))?;
    Ok(Some(ReconcileSpec {
        database_url,
        queue,
        group,
        options,
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
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
concurrency = 16
timeout = "10s"
max_attempts = 10
backoff = "linear:2m:1m"
visibility_timeout = "30s"
"#;

    #[test]
    fn the_environment_keys_are_the_config_keys() {
        let v = serde_json::to_value(Config::default()).unwrap();
        let mut fields: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        let mut known = raw::TOP_LEVEL_KEYS.to_vec();
        fields.sort_unstable();
        known.sort_unstable();
        assert_eq!(fields, known);
    }

    #[test]
    fn the_documented_example_loads() {
        let s = load_str(GOOD, env()).unwrap();
        assert_eq!(s.handlers.len(), 1);
        assert_eq!(s.queues, vec!["order-close"]);
        assert_eq!(
            s.handlers[0].worker.handler_timeout,
            Duration::from_secs(10)
        );
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

    /// Config and library agree: an empty file gives exactly the library's defaults, and a
    /// value the library refuses is refused by the config under its key.
    #[test]
    fn config_and_library_agree() {
        let text = "[[handlers]]\nqueue = \"q\"\ngroup = \"g\"\nkind = \"log\"\n";
        let s = load_str(text, env()).unwrap();
        let w = &s.handlers[0].worker;
        let d = crate::engine::worker::WorkerOptions::default();
        assert_eq!(
            (
                w.concurrency,
                w.handler_timeout,
                w.max_attempts,
                w.visibility_timeout,
                w.prefetch
            ),
            (
                d.concurrency,
                d.handler_timeout,
                d.max_attempts,
                d.visibility_timeout,
                d.prefetch
            )
        );
        assert_eq!(w.backoff, d.backoff);
        let dd = crate::engine::dispatcher::DispatcherOptions::default();
        assert_eq!(
            (
                s.dispatcher.batch,
                s.dispatcher.max_idle,
                s.dispatcher.linger
            ),
            (dd.batch, dd.max_idle, dd.linger)
        );
        let c = crate::engine::client::ClientOptions::default();
        assert_eq!(
            (
                s.client.shards,
                s.client.max_payload_bytes,
                s.client.namespace.as_str()
            ),
            (c.shards, c.max_payload_bytes, c.namespace.as_str())
        );
        // The library's limits, reported under the config's keys.
        let cases = [
            (
                "visibility_timeout = \"29ms\"",
                "handlers[0].visibility_timeout",
            ),
            ("visibility_timeout = \"30ms\"", ""),
            ("concurrency = 0", "handlers[0].concurrency"),
            ("concurrency = 10001", "handlers[0].concurrency"),
            ("timeout = \"0s\"", "handlers[0].timeout"),
            ("prefetch = 10001", "handlers[0].prefetch"),
            ("max_attempts = 0", "handlers[0].max_attempts"),
        ];
        for (line, key) in cases {
            let r = load_str(&format!("{text}{line}\n"), env());
            match (key, r) {
                ("", r) => assert!(r.is_ok(), "{line}: {:?}", r.err()),
                (key, Err(e)) => assert_eq!(e.key.as_deref(), Some(key), "{line}: {e}"),
                (key, Ok(_)) => panic!("{line} accepted; expected an error at {key}"),
            }
        }
        for (text, key) in [
            ("shards = 0\n", "shards"),
            ("shards = 1025\n", "shards"),
            ("max_payload_bytes = 0\n", "max_payload_bytes"),
            ("[dispatcher]\nbatch = 1001\n", "dispatcher.batch"),
            ("[dispatcher]\nmax_idle = \"0s\"\n", "dispatcher.max_idle"),
            ("[dispatcher]\nlinger = \"51ms\"\n", "dispatcher.linger"),
            (
                "[housekeeping]\ntrim_cron = \"* * *\"\n",
                "housekeeping.trim_cron",
            ),
            ("namespace = \"a b\"\n", "namespace"),
        ] {
            let e = load_str(text, env()).unwrap_err();
            assert_eq!(e.key.as_deref(), Some(key), "{text}: {e}");
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
                GOOD.replace(
                    "secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"",
                    "database_url = \"sqlite://x.db\"",
                ),
                "handlers[0].database_url",
            ),
        ];
        for (text, key) in cases {
            let e = load_str(&text, env()).unwrap_err();
            assert!(e.to_string().contains(key), "{key}: {e}");
        }
    }

    #[test]
    fn secrets_never_show_in_errors_or_debug_output() {
        // A value of the wrong type is named by its key and kind, never echoed.
        for (text, key) in [
            ("[http]\ntokens = \"TOKEN-VALUE-123\"\n", "http.tokens"),
            ("redis_url = [\"redis://:PASSWORD@h:1\"]\n", "redis_url"),
            (
                "[[handlers]]\nqueue = \"q\"\ngroup = \"g\"\nkind = \"webhook\"\nurl = \"http://h/x?token=QUERY-SECRET\"\nsecret = 42\n",
                "handlers",
            ),
            (
                "[[handlers]]\nqueue = \"q\"\ngroup = \"g\"\nkind = \"webhook\"\nurl = \"ftp://u:URLPASS@h/x?token=QUERY-SECRET\"\n",
                "handlers[0].url",
            ),
        ] {
            let e = load_str(text, env()).unwrap_err().to_string();
            assert!(e.contains(key), "{key}: {e}");
            for secret in ["TOKEN-VALUE-123", "PASSWORD", "QUERY-SECRET", "URLPASS"] {
                assert!(!e.contains(secret), "{e}");
            }
        }
        let text = r#"
redis_url = "redis://:REDISPASS@127.0.0.1:6379"
[http]
tokens = ["HTTP-TOKEN-1234"]
[[handlers]]
queue = "q"
group = "g"
kind = "webhook"
url = "https://u:HOOKPASS@h/x?token=HOOK-QUERY"
secret = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "a-second-secret-SECOND"]
[[handlers]]
queue = "q"
group = "c"
kind = "order-close"
database_url = "postgres://app:DBPASS@db/shop"
"#;
        let settings = load_str(text, env()).unwrap();
        let shown = format!("{settings:?}");
        for secret in [
            "REDISPASS",
            "HTTP-TOKEN-1234",
            "HOOKPASS",
            "HOOK-QUERY",
            "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "SECOND",
            "DBPASS",
        ] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
    }
}
