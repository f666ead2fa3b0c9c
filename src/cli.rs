//! The `delayq` command line: argument definitions and the verbs.
//!
//! Output is one JSON line per result on stdout; errors go to stderr. Exit codes: 0 success,
//! 1 not found, 2 invalid input, 3 Redis unreachable or another runtime failure.

use crate::duration::parse_duration;
use crate::error::{Error, InvalidInput};
use crate::order::{CancelOutcome, Mode, NewOrder, Payload, When};
use crate::{Client, ClientOptions};
use clap::{Parser, Subcommand};
use serde_json::json;
use std::process::ExitCode;

/// delayq: an order-expiry delay queue on Redis.
#[derive(Debug, Parser)]
#[command(name = "delayq", version, about)]
pub struct Cli {
    /// Redis URL (redis://, rediss:// for TLS; user:password@ for auth).
    #[arg(
        long,
        global = true,
        env = "DELAYQ_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
    /// Key namespace.
    #[arg(long, global = true, env = "DELAYQ_NAMESPACE", default_value = "dq")]
    pub namespace: String,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Schedule an order.
    Schedule {
        /// Queue name.
        queue: String,
        /// Order id.
        id: String,
        /// Delay from now: 500ms, 30s, 15m, 1h30m.
        #[arg(long = "in", conflicts_with = "at", required_unless_present = "at")]
        delay: Option<String>,
        /// Absolute time: RFC 3339 with an offset, or unix milliseconds.
        #[arg(long)]
        at: Option<String>,
        /// Payload as JSON (default null).
        #[arg(long, default_value = "null")]
        payload: String,
        /// Leave an already scheduled id untouched.
        #[arg(long)]
        if_absent: bool,
    },
    /// Show a scheduled order (exit 1 when not scheduled).
    Get {
        /// Queue name.
        queue: String,
        /// Order id.
        id: String,
    },
    /// Cancel a scheduled order (exit 1 when not found).
    Cancel {
        /// Queue name.
        queue: String,
        /// Order id.
        id: String,
    },
    /// Measure delayq on this Redis (own namespace, cleaned up; starts a throwaway
    /// redis-server when none is reachable). Prints one JSON line per scenario.
    Bench {
        /// Scenarios: enqueue, dispatch, steady (comma separated).
        #[arg(long, default_value = "enqueue,dispatch,steady")]
        scenario: String,
        /// Orders per scenario.
        #[arg(long, default_value_t = 100_000)]
        orders: usize,
        /// Orders per schedule_many call.
        #[arg(long, default_value_t = 1000)]
        batch: usize,
        /// steady: orders scheduled per second.
        #[arg(long, default_value_t = 5000)]
        rate: u64,
        /// steady: time from scheduling to due.
        #[arg(long, default_value = "2s")]
        lead: String,
        /// Payload size, bytes.
        #[arg(long, default_value_t = 150)]
        payload_bytes: usize,
        /// Worker concurrency.
        #[arg(long, default_value_t = 50)]
        concurrency: usize,
    },
}

/// A verb's failure, mapped to an exit code.
enum Failure {
    NotFound(serde_json::Value),
    Invalid(String),
    Runtime(String),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        match e {
            Error::Invalid(i) => Failure::Invalid(i.to_string()),
            other => Failure::Runtime(other.to_string()),
        }
    }
}

impl From<InvalidInput> for Failure {
    fn from(e: InvalidInput) -> Self {
        Failure::Invalid(e.to_string())
    }
}

/// Runs the parsed command line; returns the process exit code.
pub async fn run(cli: Cli) -> ExitCode {
    match dispatch(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::NotFound(out)) => {
            println!("{out}");
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

async fn dispatch(cli: Cli) -> Result<(), Failure> {
    let opts = ClientOptions::default().namespace(cli.namespace.clone());
    match cli.command {
        Command::Schedule {
            queue,
            id,
            delay,
            at,
            payload,
            if_absent,
        } => {
            // Validate everything that needs no server before connecting.
            let when = match (delay, at) {
                (Some(d), None) => {
                    let d = parse_duration("--in", &d)?;
                    When::from(d)
                }
                (None, Some(t)) => When::parse_at(&t)?,
                _ => return Err(Failure::Invalid("give exactly one of --in or --at".into())),
            };
            let payload = Payload::from_json(&payload)?;
            crate::keys::QueueName::new(&queue)?;
            crate::keys::validate_id(&id)?;
            let client = Client::connect_with(&cli.redis_url, opts).await?;
            let mode = if if_absent {
                Mode::IfAbsent
            } else {
                Mode::Upsert
            };
            let s = client
                .schedule_with(&queue, NewOrder::new(id, when, payload), mode)
                .await?;
            println!(
                "{}",
                json!({"queue": queue, "id": s.id, "due_at_ms": s.due_at_ms, "outcome": s.outcome})
            );
            Ok(())
        }
        Command::Get { queue, id } => {
            crate::keys::QueueName::new(&queue)?;
            crate::keys::validate_id(&id)?;
            let client = Client::connect_with(&cli.redis_url, opts).await?;
            match client.get(&queue, &id).await? {
                Some(o) => {
                    println!(
                        "{}",
                        json!({"queue": queue, "id": o.id, "due_at_ms": o.due_at_ms, "payload": o.payload})
                    );
                    Ok(())
                }
                None => Err(Failure::NotFound(
                    json!({"queue": queue, "id": id, "outcome": "not_found"}),
                )),
            }
        }
        Command::Cancel { queue, id } => {
            crate::keys::QueueName::new(&queue)?;
            crate::keys::validate_id(&id)?;
            let client = Client::connect_with(&cli.redis_url, opts).await?;
            match client.cancel(&queue, &id).await? {
                CancelOutcome::Cancelled => {
                    println!("{}", json!({"outcome": "cancelled"}));
                    Ok(())
                }
                CancelOutcome::NotFound => Err(Failure::NotFound(json!({"outcome": "not_found"}))),
            }
        }
        Command::Bench {
            scenario,
            orders,
            batch,
            rate,
            lead,
            payload_bytes,
            concurrency,
        } => {
            let opts = crate::bench::BenchOptions {
                orders,
                batch,
                rate,
                lead: parse_duration("--lead", &lead)?,
                payload_bytes,
                concurrency,
            };
            let (_server, url) = if crate::local_redis::reachable(&cli.redis_url) {
                (None, cli.redis_url.clone())
            } else {
                let s = crate::LocalRedis::start()?;
                eprintln!(
                    "no Redis at {}: using a throwaway redis-server",
                    cli.redis_url
                );
                let url = s.url();
                (Some(s), url)
            };
            for sc in scenario.split(',') {
                let report = crate::bench::run(&url, sc.trim(), &opts)
                    .await
                    .map_err(|e| Failure::Runtime(format!("bench {sc}: {e:#}")))?;
                println!("{}", serde_json::to_string(&report).unwrap_or_default());
            }
            Ok(())
        }
    }
}
