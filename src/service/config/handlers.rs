//! `[[handlers]]`: each entry becomes a [`HandlerSpec`] whose worker options the library
//! checked.

use super::{ConfigError, HandlerConfig, duration, lib_err};
use crate::engine::keys::{QueueName, validate_member_name};
use crate::engine::priority::PriorityMode;
use crate::engine::worker::{WorkerOptions, check_queues};

/// A handler's settings, checked.
#[derive(Debug, Clone)]
pub struct HandlerSpec {
    /// The queues it serves, most urgent first (one, unless `queues` was given).
    pub queues: Vec<String>,
    /// How it picks among `queues` (strict unless `queue_weights` was given).
    pub queue_mode: PriorityMode,
    /// The consumer group.
    pub group: String,
    /// What it does.
    pub kind: HandlerKind,
    /// The worker's options (concurrency, timeout, attempts, backoff, visibility, prefetch).
    pub worker: WorkerOptions,
}

/// The built-in handler kinds.
#[derive(Clone, PartialEq, Eq)]
pub enum HandlerKind {
    /// POST each order to `url`, signed with every secret of `secrets` (Standard Webhooks).
    Webhook {
        /// The URL.
        url: String,
        /// The signing secrets (none: unsigned).
        secrets: Vec<String>,
    },
    /// Write each order to the log and acknowledge it.
    Log,
    /// Close the order in the orders database (see [`crate::orders::close`]).
    OrderClose {
        /// The orders database.
        database_url: String,
    },
    /// No handler: consumers pull over HTTP (`:receive`, `:ack`, `:nack`, `:extend`), with
    /// this group's worker options (`max_attempts`, `backoff`, `visibility_timeout`,
    /// `rate_limit`).
    Pull {
        /// The lease of a receive that names none.
        lease: std::time::Duration,
    },
}

impl HandlerKind {
    /// The word the kind is declared with (`[[handlers]] kind`), recorded in the registry.
    pub fn name(&self) -> &'static str {
        match self {
            HandlerKind::Webhook { .. } => "webhook",
            HandlerKind::Log => "log",
            HandlerKind::OrderClose { .. } => "order-close",
            HandlerKind::Pull { .. } => crate::engine::admin::kinds::PULL,
        }
    }
}

impl std::fmt::Debug for HandlerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // URLs with their credentials masked; secrets counted, never shown.
        use crate::engine::redact::url;
        match self {
            HandlerKind::Webhook { url: u, secrets } => f
                .debug_struct("Webhook")
                .field("url", &url(u))
                .field("secrets", &secrets.len())
                .finish(),
            HandlerKind::Log => f.write_str("Log"),
            HandlerKind::Pull { lease } => f.debug_struct("Pull").field("lease", lease).finish(),
            HandlerKind::OrderClose { database_url } => f
                .debug_struct("OrderClose")
                .field("database_url", &url(database_url))
                .finish(),
        }
    }
}

/// The library's option names that the config spells differently.
const RENAMES: &[(&str, &str)] = &[("handler_timeout", "timeout")];

/// Checks every `[[handlers]]` entry; a queue and group may appear once.
pub(super) fn check_all(
    list: &[HandlerConfig],
    shutdown_grace: std::time::Duration,
) -> Result<Vec<HandlerSpec>, ConfigError> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(list.len());
    for (i, h) in list.iter().enumerate() {
        let prefix = format!("handlers[{i}]");
        let mut spec = check_one(&prefix, h)?;
        spec.worker = spec.worker.shutdown_grace(shutdown_grace);
        for q in &spec.queues {
            if !seen.insert((q.clone(), h.group.clone())) {
                return Err(ConfigError::at(
                    format!("{prefix}.group"),
                    format!("{:?} is configured twice for queue {q:?}", h.group),
                ));
            }
        }
        out.push(spec);
    }
    Ok(out)
}

fn check_one(prefix: &str, h: &HandlerConfig) -> Result<HandlerSpec, ConfigError> {
    let k = |f: &str| format!("{prefix}.{f}");
    let (queues, queue_mode) = match (&h.queue, &h.queues) {
        (Some(q), None) => {
            QueueName::new(q).map_err(|e| ConfigError::at(k("queue"), e))?;
            if h.queue_weights.is_some() {
                return Err(ConfigError::at(
                    k("queue_weights"),
                    "is for a handler over several `queues`",
                ));
            }
            (vec![q.clone()], PriorityMode::Strict)
        }
        (None, Some(list)) => {
            let mode = match &h.queue_weights {
                Some(w) => PriorityMode::Weighted(w.clone()),
                None => PriorityMode::Strict,
            };
            let names: Vec<&str> = list.iter().map(String::as_str).collect();
            check_queues(&names, &mode).map_err(|e| {
                let key = if matches!(e, crate::engine::error::InvalidInput::Priority { .. }) {
                    k("queue_weights")
                } else {
                    k("queues")
                };
                ConfigError::at(key, e)
            })?;
            (list.clone(), mode)
        }
        (Some(_), Some(_)) => {
            return Err(ConfigError::at(
                k("queues"),
                "give `queue` or `queues`, not both",
            ));
        }
        (None, None) => {
            return Err(ConfigError::at(k("queue"), "required (or `queues`)"));
        }
    };
    validate_member_name("group", &h.group).map_err(|e| ConfigError::at(k("group"), e))?;
    let kind = kind(prefix, h)?;
    Ok(HandlerSpec {
        queues,
        queue_mode,
        group: h.group.clone(),
        kind,
        worker: worker_options(prefix, h)?,
    })
}

fn kind(prefix: &str, h: &HandlerConfig) -> Result<HandlerKind, ConfigError> {
    let k = |f: &str| format!("{prefix}.{f}");
    let kind = match h.kind.as_str() {
        "webhook" => {
            let url = h
                .url
                .clone()
                .ok_or_else(|| ConfigError::at(k("url"), "required for kind = \"webhook\""))?;
            crate::service::handlers::check_webhook_url(&url)
                .map_err(|e| ConfigError::at(k("url"), e))?;
            let secrets = h.secret.as_ref().map(|s| s.list()).unwrap_or_default();
            for (j, sec) in secrets.iter().enumerate() {
                let key = match h.secret {
                    Some(super::Secrets::Many(_)) => format!("{}[{j}]", k("secret")),
                    _ => k("secret"),
                };
                crate::service::handlers::check_secret(sec).map_err(|e| ConfigError::at(key, e))?;
            }
            HandlerKind::Webhook { url, secrets }
        }
        "log" => HandlerKind::Log,
        "pull" => {
            // What a handler in serve would use has no meaning for consumers elsewhere.
            let written = |key: &str| h.written.iter().any(|k| k == key);
            for (set, key) in [
                (written("concurrency"), "concurrency"),
                (written("timeout"), "timeout"),
                (written("prefetch"), "prefetch"),
                (written("priority_weights"), "priority_weights"),
                (h.queue_weights.is_some(), "queue_weights"),
            ] {
                if set {
                    return Err(ConfigError::at(
                        k(key),
                        "is not for kind = \"pull\" (the consumers choose their own)",
                    ));
                }
            }
            let lease = duration(&k("lease"), h.lease.as_deref())?.map_or(
                Ok(crate::engine::worker::DEFAULT_LEASE),
                |d| {
                    crate::engine::worker::check_lease(d)
                        .map(|()| d)
                        .map_err(|e| ConfigError::at(k("lease"), e))
                },
            )?;
            HandlerKind::Pull { lease }
        }
        "order-close" => {
            let url = h.database_url.clone().ok_or_else(|| {
                ConfigError::at(k("database_url"), "required for kind = \"order-close\"")
            })?;
            crate::orders::db::check_url(&url)
                .map_err(|e| ConfigError::at(k("database_url"), e))?;
            HandlerKind::OrderClose { database_url: url }
        }
        other => {
            return Err(ConfigError::at(
                k("kind"),
                format!("{other:?} is not a handler kind (webhook, log, order-close, pull)"),
            ));
        }
    };
    if !matches!(kind, HandlerKind::Webhook { .. }) && (h.url.is_some() || h.secret.is_some()) {
        return Err(ConfigError::at(
            k("url"),
            "url and secret are for kind = \"webhook\" only",
        ));
    }
    if !matches!(kind, HandlerKind::Pull { .. }) && h.lease.is_some() {
        return Err(ConfigError::at(
            k("lease"),
            "lease is for kind = \"pull\" only",
        ));
    }
    if !matches!(kind, HandlerKind::OrderClose { .. }) && h.database_url.is_some() {
        return Err(ConfigError::at(
            k("database_url"),
            "database_url is for kind = \"order-close\" only",
        ));
    }
    Ok(kind)
}

/// The handler's [`WorkerOptions`] (deserialized from the entry's keys, see `embed`),
/// checked by the library.
fn worker_options(prefix: &str, h: &HandlerConfig) -> Result<WorkerOptions, ConfigError> {
    h.worker.validate().map_err(lib_err(prefix, RENAMES))?;
    Ok(h.worker.clone())
}
