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
        #[arg(
            long = "in",
            conflicts_with = "at",
            required_unless_present = "at",
            allow_hyphen_values = true
        )]
        delay: Option<String>,
        /// Absolute time: RFC 3339 with an offset, or unix milliseconds.
        #[arg(long, allow_hyphen_values = true)]
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
    /// Run the service: dispatchers, housekeeping, handlers and the HTTP API, as configured.
    /// Redis URL and namespace come from the file (or DELAYQ_REDIS_URL / DELAYQ_NAMESPACE).
    Serve {
        /// The TOML configuration file.
        #[arg(long)]
        config: std::path::PathBuf,
    },
    /// The whole flow with zero configuration: a simulated checkout service, a dispatcher and
    /// two handler groups; uses --redis-url when it answers, else a throwaway redis-server.
    Demo {
        /// Orders to create.
        #[arg(long, default_value_t = 2000)]
        orders: usize,
        /// Orders expire uniformly within this window (after a 1 s lead).
        #[arg(long, default_value = "10s")]
        window: String,
        /// Share of customers who pay in time, percent.
        #[arg(long, default_value_t = 30)]
        paid_percent: u32,
        /// The orders database (postgres://... or sqlite://file); default: a temporary
        /// SQLite file.
        #[arg(long, env = "DELAYQ_DATABASE_URL")]
        database_url: Option<String>,
    },
    /// Apply the orders schema (the embedded migrations) to a database. Idempotent; creates a
    /// missing SQLite file; refuses a database whose applied migrations were modified.
    Migrate {
        /// postgres://user@host/db or sqlite://file.
        #[arg(long, env = "DELAYQ_DATABASE_URL")]
        database_url: String,
    },
    /// Queue statistics: scheduled, overdue, stream, per-group pending / lag / consumers, dead.
    Stats {
        /// One queue (default: every queue of the namespace).
        queue: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Redraw every second until interrupted.
        #[arg(long)]
        watch: bool,
    },
    /// Dead letters: list, replay to the group that failed them, purge.
    Dead {
        /// What to do.
        #[command(subcommand)]
        action: DeadAction,
    },
    /// Measure delayq on this Redis (own namespace, cleaned up; starts a throwaway
    /// redis-server when none is reachable).
    Bench {
        /// Scenarios, comma separated: spread, storm, enqueue, ceiling, dispatch, depth.
        #[arg(long, default_value = "spread")]
        scenario: String,
        /// Orders per scenario.
        #[arg(long, default_value_t = 100_000)]
        orders: usize,
        /// Time from the start to the first due order.
        #[arg(long, default_value = "3s")]
        lead: String,
        /// Spread of the due times (spread).
        #[arg(long, default_value = "10s")]
        window: String,
        /// Worker concurrency.
        #[arg(long, default_value_t = 50)]
        concurrency: usize,
        /// Payload size, bytes.
        #[arg(long, default_value_t = 150)]
        payload_bytes: usize,
        /// Shards per queue.
        #[arg(long, default_value_t = 1)]
        shards: u16,
        /// Print one JSON line per scenario (the last line of stdout).
        #[arg(long)]
        json: bool,
    },
}

/// The `dead` sub-verbs.
#[derive(Debug, Subcommand)]
pub enum DeadAction {
    /// List dead letters, oldest first.
    List {
        /// Queue name.
        queue: String,
        /// Only this group's.
        #[arg(long)]
        group: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Redeliver dead letters to the group that failed them (attempts start again at 1).
    Replay {
        /// Queue name.
        queue: String,
        /// Only this group's.
        #[arg(long)]
        group: Option<String>,
        /// Every dead letter (of the group, if given).
        #[arg(long, conflicts_with = "entry_ids")]
        all: bool,
        /// Dead-letter entry ids (as listed).
        entry_ids: Vec<String>,
    },
    /// Delete dead letters for good.
    Purge {
        /// Queue name.
        queue: String,
        /// Only this group's.
        #[arg(long)]
        group: Option<String>,
        /// Every dead letter (of the group, if given).
        #[arg(long, conflicts_with = "entry_ids")]
        all: bool,
        /// Dead-letter entry ids (as listed).
        entry_ids: Vec<String>,
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
        Command::Stats { queue, json, watch } => {
            if let Some(q) = &queue {
                crate::keys::QueueName::new(q)?;
            }
            let client = Client::connect_with(&cli.redis_url, opts).await?;
            loop {
                let all = match &queue {
                    Some(q) => vec![client.stats(q).await?],
                    None => client.stats_all().await?,
                };
                if json {
                    println!("{}", json!({ "queues": all }));
                } else {
                    if watch {
                        print!("\x1b[2J\x1b[H");
                    }
                    print!("{}", stats_table(&all, client.now_ms()));
                }
                if !watch {
                    return Ok(());
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
        Command::Dead { action } => dead(&cli.redis_url, opts, action).await,
        Command::Demo {
            orders,
            window,
            paid_percent,
            database_url,
        } => {
            if let Some(u) = &database_url {
                crate::db::check_url(u)?;
            }
            let opts = crate::demo::DemoOptions {
                orders,
                window: parse_duration("--window", &window)?,
                paid_percent,
                database_url,
            };
            if orders == 0 || paid_percent > 100 {
                return Err(Failure::Invalid(
                    "--orders must be >= 1 and --paid-percent 0..=100".into(),
                ));
            }
            let s = crate::demo::run(&cli.redis_url, &opts)
                .await
                .map_err(|e| Failure::Runtime(format!("demo: {e:#}")))?;
            println!(
                "summary: created {}, paid {}, closed {} (in the database, {} still pending), notified {}; lateness p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                s.created,
                s.paid,
                s.closed,
                s.pending,
                s.notified,
                s.late_p50_ms,
                s.late_p99_ms,
                s.late_max_ms
            );
            println!("{}", serde_json::to_string(&s).unwrap_or_default());
            Ok(())
        }
        Command::Migrate { database_url } => {
            crate::db::check_url(&database_url)?;
            let db = crate::db::Db::connect(&database_url).await?;
            let r = db.migrate().await;
            db.close().await;
            r?;
            let version = crate::db::MIGRATOR.iter().map(|m| m.version).max();
            println!(
                "{}",
                json!({"outcome": "migrated", "backend": db.backend(),
                       "database": crate::db::redact(&database_url), "version": version})
            );
            Ok(())
        }
        Command::Serve { config } => {
            let settings =
                crate::config::load(&config).map_err(|e| Failure::Invalid(e.to_string()))?;
            let cancel = crate::serve::shutdown_on_signals();
            crate::serve::run(settings, cancel).await?;
            Ok(())
        }
        Command::Bench {
            scenario,
            orders,
            lead,
            window,
            concurrency,
            payload_bytes,
            shards,
            json,
        } => {
            let opts = crate::bench::BenchOptions {
                orders,
                lead: parse_duration("--lead", &lead)?,
                window: parse_duration("--window", &window)?,
                concurrency,
                payload_bytes,
                shards,
            };
            if orders == 0 || concurrency == 0 || !(1..=1024).contains(&shards) {
                return Err(Failure::Invalid(
                    "--orders and --concurrency must be >= 1, --shards 1..=1024".into(),
                ));
            }
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
                eprintln!("bench {}: {} orders ...", sc.trim(), orders);
                let report = crate::bench::run(&url, sc.trim(), &opts)
                    .await
                    .map_err(|e| Failure::Runtime(format!("bench {sc}: {e:#}")))?;
                let line = serde_json::to_string(&report).unwrap_or_default();
                if json {
                    println!("{line}");
                } else {
                    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
                    if let Some(m) = v.as_object() {
                        println!("{}:", report.scenario);
                        for (k, val) in m {
                            if !val.is_null() && k != "scenario" {
                                println!("  {k:<24} {val}");
                            }
                        }
                    }
                }
            }
            Ok(())
        }
    }
}

async fn dead(url: &str, opts: ClientOptions, action: DeadAction) -> Result<(), Failure> {
    use crate::dead::Selection;
    let selection = |all: bool, ids: Vec<String>| -> Result<Selection, Failure> {
        match (all, ids.is_empty()) {
            (true, _) => Ok(Selection::All),
            (false, false) => Ok(Selection::Ids(ids)),
            (false, true) => Err(Failure::Invalid(
                "give --all or at least one ENTRY_ID".into(),
            )),
        }
    };
    let check = |queue: &str, group: &Option<String>| -> Result<(), Failure> {
        crate::keys::QueueName::new(queue)?;
        if let Some(g) = group {
            crate::keys::validate_member_name("group", g)?;
        }
        Ok(())
    };
    let action_kind = match &action {
        DeadAction::List { .. } => "list",
        DeadAction::Replay { .. } => "replay",
        DeadAction::Purge { .. } => "purge",
    };
    match action {
        DeadAction::List {
            queue,
            group,
            limit,
            json,
        } => {
            check(&queue, &group)?;
            let client = Client::connect_with(url, opts).await?;
            let list = client.dead_list(&queue, group.as_deref(), limit).await?;
            for d in &list {
                if json {
                    println!("{}", serde_json::to_string(d).unwrap_or_default());
                } else {
                    println!(
                        "{}  {}  group={}  attempts={}  error={}",
                        d.entry_id, d.id, d.group, d.attempts, d.last_error
                    );
                }
            }
            Ok(())
        }
        DeadAction::Replay {
            queue,
            group,
            all,
            entry_ids,
        }
        | DeadAction::Purge {
            queue,
            group,
            all,
            entry_ids,
        } => {
            let replay = matches!(action_kind, "replay");
            check(&queue, &group)?;
            let sel = selection(all, entry_ids)?;
            let client = Client::connect_with(url, opts).await?;
            let n = if replay {
                client.dead_replay(&queue, group.as_deref(), &sel).await?
            } else {
                client.dead_purge(&queue, group.as_deref(), &sel).await?
            };
            let word = if replay { "replayed" } else { "purged" };
            println!("{}", json!({ word: n }));
            Ok(())
        }
    }
}

/// A human-readable table of queue statistics.
fn stats_table(all: &[crate::stats::QueueStats], now_ms: i64) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} {:>10} {:>8} {:>12} {:>12} {:>10} {:>6}",
        "QUEUE", "SCHEDULED", "OVERDUE", "OLDEST_LATE", "NEXT_DUE_IN", "STREAM", "DEAD"
    );
    for q in all {
        let next = q
            .next_due_at_ms
            .map_or("-".to_owned(), |n| format!("{}ms", (n - now_ms).max(0)));
        let _ = writeln!(
            out,
            "{:<24} {:>10} {:>8} {:>10}ms {:>12} {:>10} {:>6}",
            q.queue, q.scheduled, q.overdue, q.oldest_overdue_ms, next, q.stream_length, q.dead
        );
        for g in &q.groups {
            let lag = g.lag.map_or("?".to_owned(), |l| l.to_string());
            let _ = writeln!(
                out,
                "  group {:<16} pending={} lag={} consumers={}",
                g.group, g.pending, lag, g.consumers
            );
        }
    }
    out
}
