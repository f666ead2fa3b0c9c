//! One function per config section: its raw values turned into the library's option type,
//! which validates itself; a library error is blamed on the section's key.

use super::{
    Config, ConfigError, HandlerKind, HandlerSpec, HttpConfig, LogFormat, ReconcileSpec,
    ReconciliationConfig, lib_err,
};
use crate::engine::client::ClientOptions;
use crate::engine::error::InvalidInput;
use crate::engine::keys::QueueName;
use crate::engine::loops::housekeeping::HousekeepingOptions;
use crate::service::http::HttpLimits;
use std::net::SocketAddr;

/// The top-level client keys, checked by the library (a bad namespace is named as such).
pub(super) fn client_options(c: &Config) -> Result<ClientOptions, ConfigError> {
    c.client.validate().map_err(|e| match e {
        InvalidInput::Namespace { .. } => ConfigError::at("namespace", e),
        e => lib_err("", &[])(e),
    })?;
    Ok(c.client.clone())
}

/// `redis_tls_ca`, `redis_tls_cert`, `redis_tls_key`: checked (a `rediss` URL, the
/// certificate with its key, every file a readable PEM file), then added to `redis_url` as
/// its `tls_*` query parameters, which is how the connection receives them.
pub(super) fn redis_tls(c: &mut Config) -> Result<(), ConfigError> {
    use crate::engine::conn::{TlsFile, TlsFiles, is_tls_url, url_with_tls_files};
    let key_of = |f: TlsFile| match f {
        TlsFile::Ca => "redis_tls_ca",
        TlsFile::Cert => "redis_tls_cert",
        TlsFile::Key => "redis_tls_key",
    };
    let path = |v: &Option<String>| {
        v.as_deref()
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(std::path::PathBuf::from)
    };
    let mut files = TlsFiles::new();
    files.ca = path(&c.redis_tls_ca);
    files.cert = path(&c.redis_tls_cert);
    files.key = path(&c.redis_tls_key);
    let Some(first) = [TlsFile::Ca, TlsFile::Cert, TlsFile::Key]
        .into_iter()
        .find(|f| files.get(*f).is_some())
    else {
        return Ok(());
    };
    if !is_tls_url(&c.redis_url) {
        return Err(ConfigError::at(
            key_of(first),
            "TLS files need a rediss:// redis_url (or rediss+cluster://, rediss+sentinel://)",
        ));
    }
    files
        .check_pairing()
        .map_err(|e| ConfigError::at(key_of(e.file), e.reason))?;
    let url =
        url_with_tls_files(&c.redis_url, &files).map_err(|e| ConfigError::at("redis_url", e))?;
    files
        .load()
        .map_err(|e| ConfigError::at(key_of(e.file), e.reason))?;
    c.redis_url = url;
    Ok(())
}

pub(super) fn check_http(h: &HttpConfig) -> Result<(SocketAddr, HttpLimits), ConfigError> {
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
    let mut l = h.limits.clone();
    if l.allowed_hosts.is_empty() || l.allowed_hosts.iter().any(|h| h.trim().is_empty()) {
        return Err(ConfigError::at(
            "http.allowed_hosts",
            "list at least one host name (or \"*\" for any)",
        ));
    }
    l = l.allow_listen_host(listen);
    l.validate().map_err(lib_err("http", &[]))?;
    Ok((listen, l))
}

/// `[[http.consumer_tokens]]`, checked: each token valid and no API token, its groups
/// `queue/group`; only beside `http.tokens` (without them the API is open to anyone).
pub(super) fn consumer_tokens(
    h: &HttpConfig,
) -> Result<Vec<crate::service::http::ConsumerToken>, ConfigError> {
    if !h.consumer_tokens.is_empty() && h.tokens.is_empty() {
        return Err(ConfigError::at(
            "http.consumer_tokens",
            "needs http.tokens: without them the whole API is open, and a consumer token restricts nothing",
        ));
    }
    let mut out = Vec::with_capacity(h.consumer_tokens.len());
    for (i, c) in h.consumer_tokens.iter().enumerate() {
        let t = crate::service::http::ConsumerToken::new(&c.token, &c.groups).map_err(
            |(at, reason)| match at {
                Some(j) => {
                    ConfigError::at(format!("http.consumer_tokens[{i}].groups[{j}]"), reason)
                }
                None if c.groups.is_empty() => {
                    ConfigError::at(format!("http.consumer_tokens[{i}].groups"), reason)
                }
                None => ConfigError::at(format!("http.consumer_tokens[{i}].token"), reason),
            },
        )?;
        let reused = h.tokens.iter().any(|a| a == t.secret())
            || out
                .iter()
                .any(|o: &crate::service::http::ConsumerToken| o.secret() == t.secret());
        if reused {
            return Err(ConfigError::at(
                format!("http.consumer_tokens[{i}].token"),
                "is also an API token or another consumer token: give each its own",
            ));
        }
        out.push(t);
    }
    Ok(out)
}

/// `[housekeeping]` with `[dead]` inside, checked by the library (`dead_max_per_queue` is
/// `dead.max_per_queue` in the file).
pub(super) fn housekeeping_options(c: &Config) -> Result<HousekeepingOptions, ConfigError> {
    let mut o = c.housekeeping.clone();
    o.dead = c.dead.clone();
    o.validate().map_err(|e| match e {
        InvalidInput::Option {
            name: "dead_max_per_queue",
            reason,
        } => ConfigError::at("dead.max_per_queue", reason),
        e => lib_err("housekeeping", &[])(e),
    })?;
    Ok(o)
}

pub(super) fn check_reconciliation(
    r: &ReconciliationConfig,
    handlers: &[HandlerSpec],
) -> Result<Option<ReconcileSpec>, ConfigError> {
    let close = handlers.iter().find_map(|h| match &h.kind {
        HandlerKind::OrderClose { database_url } => Some((
            h.queues.first()?.clone(),
            h.group.clone(),
            database_url.clone(),
        )),
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
    let options = r.options.clone();
    options.validate().map_err(lib_err("reconciliation", &[]))?;
    Ok(Some(ReconcileSpec {
        database_url,
        queue,
        group,
        options,
    }))
}

/// `dispatch` → which registered queues this process dispatches.
pub(super) fn dispatch_selection(
    d: Option<&super::raw::DispatchConfig>,
) -> Result<crate::engine::loops::supervisor::DispatchSelection, ConfigError> {
    use super::raw::DispatchConfig;
    use crate::engine::loops::supervisor::DispatchSelection;
    Ok(match d {
        None => DispatchSelection::All,
        Some(DispatchConfig::Word(w)) if w == "all" => DispatchSelection::All,
        Some(DispatchConfig::Word(w)) if w == "none" => DispatchSelection::None,
        Some(DispatchConfig::Word(w)) => {
            return Err(ConfigError::at(
                "dispatch",
                format!("{w:?} is not \"all\", \"none\" or a list of queue names"),
            ));
        }
        Some(DispatchConfig::List(names)) => DispatchSelection::Only(
            names
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    crate::engine::keys::QueueName::new(n)
                        .map_err(|e| ConfigError::at(format!("dispatch[{i}]"), e))
                })
                .collect::<Result<_, _>>()?,
        ),
    })
}

/// `[[schedules]]`: each checked by the rules every surface applies
/// ([`ScheduleSpec::validate`](crate::engine::schedules::ScheduleSpec::validate)); an error
/// names `schedules[i].<field>`.
pub(super) fn schedules(
    list: &[super::raw::ScheduleConfig],
    max_payload: usize,
) -> Result<Vec<crate::engine::schedules::ScheduleSpec>, ConfigError> {
    use crate::engine::schedules::{Missed, ScheduleSpec};
    let mut out: Vec<ScheduleSpec> = Vec::new();
    for (i, c) in list.iter().enumerate() {
        let at = |field: &str| format!("schedules[{i}].{field}");
        let when =
            |field: &'static str, text: &Option<String>| -> Result<Option<i64>, ConfigError> {
                text.as_deref()
                    .map(|t| {
                        crate::engine::schedules::parse_window_bound(field, t)
                            .map_err(|e| ConfigError::at(at(field), e))
                    })
                    .transpose()
            };
        let payload = c
            .payload
            .as_ref()
            .map_or_else(
                || crate::Payload::from_json("{}"),
                |v| Ok(crate::Payload::from_value(v)),
            )
            .map_err(|e| ConfigError::at(at("payload"), e))?;
        let mut spec = match (&c.cron, &c.every) {
            (Some(cron), None) => ScheduleSpec::cron(&c.queue, &c.id, cron, payload),
            (None, Some(every)) => ScheduleSpec::every(&c.queue, &c.id, every, payload),
            _ => {
                return Err(ConfigError::at(
                    at("cron"),
                    "give exactly one of cron and every",
                ));
            }
        };
        if let Some(tz) = &c.timezone {
            spec = spec.timezone(tz);
        }
        spec = spec.window(when("start", &c.start)?, when("end", &c.end)?);
        if let Some(m) = &c.missed {
            spec = spec.missed(Missed::parse(m).map_err(|e| ConfigError::at(at("missed"), e))?);
        }
        spec.validate(max_payload).map_err(|e| {
            let field = match &e {
                crate::engine::error::InvalidInput::Option { name, .. } => *name,
                crate::engine::error::InvalidInput::QueueName { .. } => "queue",
                _ => "payload",
            };
            ConfigError::at(at(field), e)
        })?;
        if out.iter().any(|s| s.queue == spec.queue && s.id == spec.id) {
            return Err(ConfigError::at(
                at("id"),
                format!("{:?} is declared twice on queue {:?}", spec.id, spec.queue),
            ));
        }
        out.push(spec);
    }
    Ok(out)
}

/// `log_format`: `text` (default) or `json`.
pub(super) fn log_format(v: Option<&str>) -> Result<LogFormat, ConfigError> {
    match v.map(str::trim) {
        None | Some("text") => Ok(LogFormat::Text),
        Some("json") => Ok(LogFormat::Json),
        Some(other) => Err(ConfigError::at(
            "log_format",
            format!("{other:?} is not text or json"),
        )),
    }
}
