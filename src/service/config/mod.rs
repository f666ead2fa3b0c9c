//! `delayq serve`'s configuration: TOML ([`raw`]), every key overridable by `DELAYQ_<KEY>`
//! environment variables (nested keys with `__`, e.g. `DELAYQ_HTTP__LISTEN`), unknown keys
//! and bad values refused at start-up with the key named.
//!
//! The library's option types are the file: `[dispatcher]`, `[housekeeping]` and `[dead]`
//! are `DispatcherOptions`, `HousekeepingOptions` and `DeadLetterOptions`, deserialized as
//! they are; `ClientOptions` (the top level), `HttpLimits` (`[http]`), `ReconcileOptions`
//! (`[reconciliation]`) and `WorkerOptions` (each `[[handlers]]` entry) sit beside the
//! service's own keys of their table (`embed`). The option type validates itself: keys,
//! ranges and defaults are written once, in the library. A library error is mapped to the
//! config key it came from. `[telemetry]` is [`TelemetryOptions`], the service's own
//! option type (the exporter is the binary's). `[[schedules]]` and the service's own keys
//! are read in [`raw`] and checked in `sections` and `handlers`.

mod embed;
mod error;
mod handlers;
pub mod raw;
mod sections;
mod telemetry;

pub use error::ConfigError;
use error::figment_error;
pub(crate) use error::{at_key, duration, lib_err};
pub use handlers::{HandlerKind, HandlerSpec};
pub use raw::{Config, HandlerConfig, HttpConfig, ReconciliationConfig, Secrets};
use sections::{check_http, check_reconciliation, client_options, housekeeping_options};
pub use telemetry::TelemetryOptions;

use crate::engine::client::ClientOptions;
use crate::engine::keys::QueueName;
use crate::engine::loops::dispatcher::DispatcherOptions;
use crate::engine::loops::housekeeping::HousekeepingOptions;
use crate::engine::redact;
use crate::orders::reconcile::ReconcileOptions;
use crate::service::http::HttpLimits;
use figment::Figment;
use figment::providers::{Env, Format, Toml};
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
    /// `[[http.consumer_tokens]]`: tokens that may only pull from their groups.
    pub consumer_tokens: Vec<crate::service::http::ConsumerToken>,
    /// The client (namespace, shards, payload limit, durability).
    pub client: ClientOptions,
    /// Every dispatcher's options.
    pub dispatcher: DispatcherOptions,
    /// The housekeeping chores.
    pub housekeeping: HousekeepingOptions,
    /// The handlers.
    pub handlers: Vec<HandlerSpec>,
    /// Every queue created at start-up (handlers', reconciliation's and `queues`), sorted,
    /// unique.
    pub queues: Vec<String>,
    /// Which registered queues this process dispatches (the supervisor's selection).
    pub dispatch: crate::engine::loops::supervisor::DispatchSelection,
    /// How long shutdown waits for running handlers (every worker's `shutdown_grace`).
    pub shutdown_grace: Duration,
    /// How long `serve` waits for Redis at start-up before it exits 3.
    pub startup_timeout: Duration,
    /// The order-history retention set on every queue it dispatches (`None`: leave each
    /// queue's as it is, 24 h unless set).
    pub history_retention: Option<Duration>,
    /// The default `expires_after` set on every queue of the configuration (`Some(0)`
    /// clears it; `None`: leave each queue's as it is).
    pub expires_after: Option<Duration>,
    /// The dedup window set on every queue created at start-up (`None`: leave each as it
    /// is).
    pub dedup_window: Option<Duration>,
    /// The cancel-on-event rules of each queue of the configuration (`None`: leave each
    /// queue's as they are).
    pub cancel_on: Option<Vec<(String, Vec<crate::engine::events::CancelRule>)>>,
    /// The reconciliation job, when on.
    pub reconciliation: Option<ReconcileSpec>,
    /// Recurring schedules declared at start-up.
    pub schedules: Vec<crate::engine::schedules::ScheduleSpec>,
    /// How log lines are written.
    pub log_format: LogFormat,
    /// Trace export and the consumer spans' relation to the producer's.
    pub telemetry: TelemetryOptions,
}

/// How `serve` writes its log lines (`log_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line, with `trace_id` and `span_id` inside a traced span.
    Json,
}

/// How long `serve` waits for Redis at start-up unless `startup_timeout` says otherwise.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

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
    check(read_raw(text, env)?)
}

/// The file as written (the TOML text, then the environment; unset keys take their
/// types' defaults), unchecked. Option keys of a table that is partly an option type are
/// moved where that type is ([`embed`]) before it is deserialized.
fn read_raw(text: &str, env: Env) -> Result<Config, ConfigError> {
    let mut tree: figment::value::Dict = Figment::from(Toml::string(text))
        .merge(env)
        .extract()
        .map_err(figment_error)?;
    embed::nest(&mut tree)?;
    figment::value::Value::from(tree)
        .deserialize()
        .map_err(figment_error)
}

/// `http.listen` as `serve` reads it from `path` (no file: the defaults and the environment
/// alone), checked with the rest of `[http]` only: the address `delayq healthcheck` asks.
pub fn listen_of(path: Option<&Path>) -> Result<SocketAddr, ConfigError> {
    let text = match path {
        Some(p) => std::fs::read_to_string(p)
            .map_err(|e| ConfigError::whole(format!("cannot read {}: {e}", p.display())))?,
        None => String::new(),
    };
    Ok(check_http(&read_raw(&text, env())?.http)?.0)
}

/// Checks every value of `config`.
pub fn check(mut config: Config) -> Result<Settings, ConfigError> {
    if config.redis_url.trim().is_empty() {
        return Err(ConfigError::at(
            "redis_url",
            "required: the Redis to use, e.g. redis_url = \"redis://127.0.0.1:6379\" (or DELAYQ_REDIS_URL)",
        ));
    }
    sections::redis_tls(&mut config)?;
    crate::engine::conn::RedisTarget::open(&config.redis_url)
        .map_err(|e| ConfigError::at("redis_url", e))?;
    let client = client_options(&config)?;
    let (listen, http) = check_http(&config.http)?;
    let consumer_tokens = sections::consumer_tokens(&config.http)?;
    let dispatcher = config.dispatcher.clone();
    dispatcher.validate().map_err(lib_err("dispatcher", &[]))?;
    let housekeeping = housekeeping_options(&config)?;
    let mut queues: Vec<String> = Vec::new();
    for (i, q) in config.queues.iter().enumerate() {
        QueueName::new(q).map_err(|e| ConfigError::at(format!("queues[{i}]"), e))?;
        queues.push(q.clone());
    }
    let shutdown_grace = duration("shutdown_grace", config.shutdown_grace.as_deref())?
        .unwrap_or(crate::engine::worker::WorkerOptions::default().shutdown_grace);
    let startup_timeout = duration("startup_timeout", config.startup_timeout.as_deref())?
        .unwrap_or(DEFAULT_STARTUP_TIMEOUT);
    if startup_timeout < Duration::from_secs(1) || startup_timeout > Duration::from_secs(3600) {
        return Err(ConfigError::at("startup_timeout", "must be 1s..=1h"));
    }
    let history_retention = duration("history_retention", config.history_retention.as_deref())?;
    if let Some(r) = history_retention {
        crate::engine::history::HistoryPolicy::new(r).map_err(at_key("history_retention"))?;
    }
    let expires_after = duration("expires_after", config.expires_after.as_deref())?;
    if let Some(e) = expires_after {
        crate::engine::expiry::check_queue_default(e).map_err(at_key("expires_after"))?;
    }
    let dedup_window = duration("dedup_window", config.dedup_window.as_deref())?;
    if let Some(w) = dedup_window {
        crate::engine::time_rules::DedupWindow::new(w).map_err(at_key("dedup_window"))?;
    }
    let handlers = handlers::check_all(&config.handlers, shutdown_grace)?;
    queues.extend(handlers.iter().flat_map(|h| h.queues.iter().cloned()));
    let reconciliation = check_reconciliation(&config.reconciliation, &handlers)?;
    if let Some(r) = &reconciliation {
        queues.push(r.queue.clone());
    }
    let schedules = sections::schedules(&config.schedules, client.max_payload_bytes)?;
    queues.extend(schedules.iter().map(|s| s.queue.clone()));
    queues.sort();
    queues.dedup();
    let cancel_on = config
        .cancel_on
        .as_deref()
        .map(|rules| cancel_on_rules(rules, &queues))
        .transpose()?;
    let dispatch = sections::dispatch_selection(config.dispatch.as_ref())?;
    let log_format = sections::log_format(config.log_format.as_deref())?;
    let telemetry = config.telemetry.clone();
    telemetry.validate().map_err(lib_err("telemetry", &[]))?;
    Ok(Settings {
        log_format,
        telemetry,
        dispatch,
        config,
        listen,
        http,
        consumer_tokens,
        client,
        dispatcher,
        housekeeping,
        handlers,
        queues,
        shutdown_grace,
        startup_timeout,
        history_retention,
        expires_after,
        dedup_window,
        cancel_on,
        reconciliation,
        schedules,
    })
}

/// `cancel_on`: each rule checked as every surface checks it, with an optional `queues`
/// list (each one of the configuration's queues); per queue, the rules that apply to it.
fn cancel_on_rules(
    rules: &[serde_json::Value],
    queues: &[String],
) -> Result<Vec<(String, Vec<crate::engine::events::CancelRule>)>, ConfigError> {
    let key = crate::engine::events::FIELD;
    let mut per_rule = Vec::new();
    for (i, v) in rules.iter().enumerate() {
        let mut v = v.clone();
        let only = match v.as_object_mut().and_then(|o| o.remove("queues")) {
            None => None,
            Some(serde_json::Value::Array(a)) => Some(
                a.iter()
                    .map(|q| match q.as_str() {
                        Some(q) if queues.iter().any(|c| c == q) => Ok(q.to_owned()),
                        _ => Err(ConfigError::at(
                            key,
                            format!("rule {i}: queues must name queues of the configuration"),
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Some(_) => {
                return Err(ConfigError::at(
                    key,
                    format!("rule {i}: queues must be a list of queue names"),
                ));
            }
        };
        let mut rule = crate::engine::events::rules_from_json(&serde_json::Value::Array(vec![v]))
            .map_err(at_key(key))?;
        per_rule.push((only, rule.remove(0)));
    }
    let out: Vec<(String, Vec<crate::engine::events::CancelRule>)> = queues
        .iter()
        .map(|q| {
            let mine: Vec<_> = per_rule
                .iter()
                .filter(|(only, _)| only.as_ref().is_none_or(|o| o.contains(q)))
                .map(|(_, r)| r.clone())
                .collect();
            (q.clone(), mine)
        })
        .collect();
    for (_, r) in &out {
        crate::engine::events::validate_rules(r).map_err(at_key(key))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
