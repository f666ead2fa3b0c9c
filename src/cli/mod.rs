//! The `delayq` command line (feature `cli`): one file per verb.
//!
//! Output is one JSON line per result on stdout; errors go to stderr. Exit codes: 0 success,
//! 1 not found, 2 invalid input, 3 Redis unreachable or another runtime failure. The verbs
//! that touch queues call the engine's client and admin API and print its types, with the
//! rules the HTTP API applies too ([`crate::service::surface`]).

/// `println!` for the CLI's stdout: a closed stdout (`delayq stats --watch | head -1`,
/// `less` quit early) ends the process quietly with exit 0 instead of a panic.
macro_rules! outln {
    ($($t:tt)*) => { $crate::cli::write_out(&format!($($t)*), true) };
}

/// `print!` for the CLI's stdout (see [`outln!`]).
macro_rules! out {
    ($($t:tt)*) => { $crate::cli::write_out(&format!($($t)*), false) };
}

mod args;
#[cfg(feature = "dev-tools")]
pub mod bench;
mod cancel;
mod cron;
mod dead;
pub mod demo;
mod event;
mod get;
mod healthcheck;
mod migrate;
mod queue;
mod schedule;
mod scripts;
mod serve;
mod stats;
mod tags;
mod telemetry;

pub use args::{Cli, Command, CronAction, DeadAction, GroupAction, QueueAction, ScriptsAction};

use crate::engine::error::{Error, InvalidInput};
use serde::Serialize;
use std::process::ExitCode;

/// A verb's failure, mapped to an exit code.
pub(crate) enum Failure {
    /// Exit 1, printing this answer on stdout.
    NotFound(String),
    /// Exit 1, with this message on stderr (e.g. an unknown queue).
    Missing(String),
    /// Exit 2.
    Invalid(String),
    /// Exit 3.
    Runtime(String),
}

impl Failure {
    /// Exit 1 with `answer` printed as one JSON line.
    pub(crate) fn not_found(answer: &impl Serialize) -> Self {
        Failure::NotFound(json_line(answer))
    }
}

impl From<crate::orders::error::Error> for Failure {
    fn from(e: crate::orders::error::Error) -> Self {
        match e {
            crate::orders::error::Error::Engine(e) => Failure::from(e),
            other => Failure::Runtime(other.to_string()),
        }
    }
}

impl From<crate::service::serve::ServeError> for Failure {
    fn from(e: crate::service::serve::ServeError) -> Self {
        match e {
            crate::service::serve::ServeError::Engine(e) => Failure::from(e),
            crate::service::serve::ServeError::Orders(e) => Failure::from(e),
        }
    }
}

#[cfg(feature = "dev-tools")]
impl From<crate::testing::local_redis::LocalRedisError> for Failure {
    fn from(e: crate::testing::local_redis::LocalRedisError) -> Self {
        Failure::Runtime(e.to_string())
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        match e {
            Error::Invalid(i) => Failure::Invalid(i.to_string()),
            e @ (Error::QueueNotFound { .. } | Error::GroupNotFound { .. }) => {
                Failure::Missing(e.to_string())
            }
            e @ (Error::ShardMismatch { .. }
            | Error::QueueNotEmpty { .. }
            | Error::TooManyQueues { .. }
            | Error::TooManyGroups { .. }
            | Error::TooManySchedules { .. }
            | Error::GroupBusy { .. }) => Failure::Invalid(e.to_string()),
            other => Failure::Runtime(other.to_string()),
        }
    }
}

impl From<InvalidInput> for Failure {
    fn from(e: InvalidInput) -> Self {
        Failure::Invalid(e.to_string())
    }
}

/// What a verb returns.
pub(crate) type VerbResult = Result<(), Failure>;

/// One value as one JSON line.
pub(crate) fn json_line(v: &impl Serialize) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// Prints one value as one JSON line on stdout.
pub(crate) fn print_json(v: &impl Serialize) {
    outln!("{}", json_line(v));
}

/// Writes `text` (and a newline) on stdout and flushes; exits 0 when the reader is gone.
pub(crate) fn write_out(text: &str, newline: bool) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    let r = o
        .write_all(text.as_bytes())
        .and_then(|()| if newline { o.write_all(b"\n") } else { Ok(()) })
        .and_then(|()| o.flush());
    if let Err(e) = r
        && e.kind() == std::io::ErrorKind::BrokenPipe
    {
        std::process::exit(0);
    }
}

/// Runs the parsed command line; returns the process exit code. Sets up logging (on stderr,
/// filtered by `RUST_LOG`, warnings by default, delayq's own `info` lines too for `serve`):
/// plain text for every verb; `serve` sets up
/// its own from its configuration (`log_format`, `[telemetry]`).
pub async fn run(cli: Cli) -> ExitCode {
    if !matches!(cli.command, Command::Serve { .. }) {
        telemetry::init_plain();
    }
    match dispatch(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::NotFound(out)) => {
            outln!("{out}");
            ExitCode::from(1)
        }
        Err(Failure::Missing(msg)) => {
            eprintln!("delayq: {msg}");
            ExitCode::from(1)
        }
        Err(Failure::Invalid(msg)) => {
            eprintln!("delayq: invalid input: {msg}");
            ExitCode::from(2)
        }
        Err(Failure::Runtime(msg)) => {
            eprintln!("delayq: {msg}");
            ExitCode::from(3)
        }
    }
}

/// The global flags every verb that talks to Redis uses.
pub(crate) struct Global {
    /// The Redis URL.
    pub redis_url: String,
    /// The key namespace.
    pub namespace: String,
}

impl Global {
    /// A client of the Redis URL and namespace.
    pub(crate) async fn connect(
        &self,
    ) -> crate::engine::error::Result<crate::engine::client::Client> {
        let opts = crate::engine::client::ClientOptions::default().namespace(&self.namespace);
        crate::engine::client::Client::connect_with(&self.redis_url, opts).await
    }
}

async fn dispatch(cli: Cli) -> VerbResult {
    // The TLS files travel in the URL (its tls_* query parameters), so every verb's client
    // gets them. `serve` reads its own configuration (redis_tls_* keys); `migrate` and
    // `scripts` do not talk to Redis.
    let redis_url = match &cli.command {
        Command::Serve { .. }
        | Command::Migrate { .. }
        | Command::Scripts { .. }
        | Command::Healthcheck { .. } => cli.redis_url,
        _ => {
            let mut tls = crate::engine::conn::TlsFiles::new();
            tls.ca = cli.redis_tls_ca;
            tls.cert = cli.redis_tls_cert;
            tls.key = cli.redis_tls_key;
            tls.check_pairing().map_err(|e| {
                Failure::Invalid(format!(
                    "--redis-{}: {}",
                    e.file.param().replace('_', "-"),
                    e.reason
                ))
            })?;
            crate::engine::conn::url_with_tls_files(&cli.redis_url, &tls)?
        }
    };
    let g = Global {
        redis_url,
        namespace: cli.namespace,
    };
    match cli.command {
        c @ Command::Schedule { .. } => schedule::run(&g, c).await,
        Command::Get { queue, id } => get::run(&g, &queue, &id).await,
        Command::Event { name, data, id } => event::run(&g, &name, &data, id).await,
        Command::Cancel {
            queue,
            id,
            tag,
            tag_queue,
        } => match (tag, queue, id) {
            (Some(tag), q, None) => tags::cancel(&g, tag_queue.or(q).as_deref(), &tag).await,
            (None, Some(queue), Some(id)) => cancel::run(&g, &queue, &id).await,
            _ => Err(Failure::Invalid(
                "give QUEUE ID, or --tag TAG [--queue QUEUE]".into(),
            )),
        },
        Command::List {
            tag,
            queue,
            limit,
            after,
        } => tags::list(&g, queue.as_deref(), &tag, limit, after.as_deref()).await,
        Command::Reschedule {
            tag,
            queue,
            delay,
            at,
            shift,
        } => tags::reschedule(&g, queue.as_deref(), &tag, delay, at, shift).await,
        Command::Stats { queue, json, watch } => {
            stats::run(&g, queue.as_deref(), json, watch).await
        }
        Command::Dead { action } => dead::run(&g, action).await,
        Command::Cron { action } => cron::run(&g, action).await,
        Command::Queue { action } => queue::run(&g, action).await,
        Command::Group {
            action:
                GroupAction::Delete {
                    queue,
                    group,
                    force,
                },
        } => queue::delete_group(&g, &queue, &group, force).await,
        Command::Group {
            action:
                GroupAction::Keys {
                    queue,
                    group,
                    limit,
                    after,
                },
        } => queue::group_keys(&g, &queue, &group, limit, after.as_deref()).await,
        c @ Command::Demo { .. } => demo::verb(&g, c).await,
        Command::Migrate { database_url } => migrate::run(&database_url).await,
        Command::Serve { config } => serve::run(&config).await,
        #[cfg(feature = "dev-tools")]
        c @ Command::Bench { .. } => bench::verb(&g, c).await,
        Command::Scripts { action } => scripts::run(action),
        Command::Healthcheck {
            config,
            ready,
            timeout,
        } => healthcheck::run(config.as_deref(), ready, &timeout).await,
    }
}
