//! `delayq cron add|list|show|remove|pause|resume`: recurring schedules (cron expressions and intervals).
//!
//! Bad input is refused (exit 2, naming the field) before anything is opened; `add` on a
//! queue that is not registered is refused the same way (nothing is written). `show` and
//! `remove` of a schedule that does not exist exit 1.

use super::{CronAction, Failure, Global, VerbResult, print_json};
use crate::engine::client::ClientOptions;
use crate::engine::error::{Error, InvalidInput};
use crate::engine::keys::QueueName;
use crate::engine::message::Payload;
use crate::engine::schedules::{
    Missed, ScheduleInfo, ScheduleSpec, Schedules, validate_schedule_id,
};
use chrono::{DateTime, SecondsFormat, Utc};

/// Runs the verb.
pub(super) async fn run(g: &Global, action: CronAction) -> VerbResult {
    match action {
        CronAction::Add {
            queue,
            id,
            cron,
            every,
            timezone,
            payload,
            start,
            end,
            missed,
            json,
        } => {
            // Validate everything that needs no server before connecting.
            let payload = Payload::from_json(&payload)?;
            let mut spec = match (cron, every) {
                (Some(c), None) => ScheduleSpec::cron(&queue, &id, &c, payload),
                (None, Some(e)) => ScheduleSpec::every(&queue, &id, &e, payload),
                _ => {
                    return Err(Failure::Invalid(
                        "invalid option cron: give exactly one of --cron or --every".into(),
                    ));
                }
            };
            if let Some(tz) = &timezone {
                spec = spec.timezone(tz);
            }
            spec = spec.window(
                instant("start", start.as_deref())?,
                instant("end", end.as_deref())?,
            );
            if let Some(m) = &missed {
                spec = spec.missed(Missed::parse(m)?);
            }
            spec.validate(ClientOptions::default().max_payload_bytes)?;
            let client = g.connect().await?;
            let answer = Schedules::new(&client)
                .upsert(&spec)
                .await
                .map_err(unregistered_queue)?;
            if json {
                print_json(&answer);
            } else {
                let verb = if answer.created {
                    "created"
                } else {
                    "replaced"
                };
                match answer.next_ms {
                    Some(n) => outln!(
                        "{verb} schedule {} on queue {}; next fire {} ({n})",
                        answer.id,
                        answer.queue,
                        utc(n)
                    ),
                    None => outln!(
                        "{verb} schedule {} on queue {}; it never fires (its window has ended)",
                        answer.id,
                        answer.queue
                    ),
                }
            }
        }
        CronAction::List { queue, json } => {
            if let Some(q) = &queue {
                QueueName::new(q)?;
            }
            let client = g.connect().await?;
            let all = Schedules::new(&client).list(queue.as_deref()).await?;
            if json {
                print_json(&all);
            } else {
                out!("{}", table(&all));
            }
        }
        CronAction::Show { queue, id, json } => {
            check_ref(&queue, &id)?;
            let client = g.connect().await?;
            let Some(info) = Schedules::new(&client).get(&queue, &id).await? else {
                return Err(no_such_schedule(&queue, &id));
            };
            if json {
                print_json(&info);
            } else {
                out!("{}", details(&info));
            }
        }
        CronAction::Remove { queue, id } => {
            check_ref(&queue, &id)?;
            let client = g.connect().await?;
            if !Schedules::new(&client).remove(&queue, &id).await? {
                return Err(no_such_schedule(&queue, &id));
            }
            outln!("removed schedule {id} from queue {queue}");
        }
        CronAction::Pause { queue, id } => pause(g, &queue, &id, true).await?,
        CronAction::Resume { queue, id } => pause(g, &queue, &id, false).await?,
    }
    Ok(())
}

/// `cron pause` / `cron resume`.
async fn pause(g: &Global, queue: &str, id: &str, pause: bool) -> VerbResult {
    check_ref(queue, id)?;
    let client = g.connect().await?;
    let Some(info) = Schedules::new(&client).set_paused(queue, id, pause).await? else {
        return Err(no_such_schedule(queue, id));
    };
    match info.next_ms {
        Some(n) => outln!(
            "resumed schedule {id} of queue {queue}; next fire {}",
            utc(n)
        ),
        None if pause => outln!("paused schedule {id} of queue {queue}"),
        None => outln!("resumed schedule {id} of queue {queue}; it never fires again"),
    }
    Ok(())
}

/// Checks a queue name and a schedule id (before anything is opened).
fn check_ref(queue: &str, id: &str) -> Result<(), InvalidInput> {
    QueueName::new(queue)?;
    validate_schedule_id(id)
}

/// A window bound (`--start`, `--end`), read by the one rule every surface uses.
fn instant(name: &'static str, text: Option<&str>) -> Result<Option<i64>, InvalidInput> {
    text.map(|t| crate::engine::schedules::parse_window_bound(name, t))
        .transpose()
}

/// An unregistered queue is the caller's mistake on a declaration (exit 2, nothing written).
fn unregistered_queue(e: Error) -> Failure {
    match e {
        Error::QueueNotFound { queue } => Failure::Invalid(format!(
            "queue {queue:?} is not registered: create it first (delayq queue create {queue}), \
             then add its schedules"
        )),
        other => other.into(),
    }
}

/// The exit-1 answer of a lookup of a schedule that does not exist.
fn no_such_schedule(queue: &str, id: &str) -> Failure {
    Failure::Missing(format!("no schedule {id:?} on queue {queue:?}"))
}

/// An instant as RFC 3339 in UTC (the raw milliseconds if out of range).
fn utc(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms).map_or_else(
        || ms.to_string(),
        |d| d.to_rfc3339_opts(SecondsFormat::AutoSi, true),
    )
}

/// An optional instant as RFC 3339 in UTC, `-` when absent.
fn utc_opt(ms: Option<i64>) -> String {
    ms.map_or_else(|| "-".to_owned(), utc)
}

/// An instant in the schedule's time zone, when it is not UTC (and is a known zone).
fn local(ms: i64, timezone: &str) -> Option<String> {
    if timezone == "UTC" {
        return None;
    }
    let tz: chrono_tz::Tz = timezone.parse().ok()?;
    let d = DateTime::<Utc>::from_timestamp_millis(ms)?;
    Some(
        d.with_timezone(&tz)
            .to_rfc3339_opts(SecondsFormat::AutoSi, true),
    )
}

/// The recurrence of a schedule as one cell: `cron <expr>` or `every <interval>`.
fn recurrence(s: &ScheduleInfo) -> String {
    match (&s.cron, &s.every) {
        (Some(c), _) => format!("cron {c}"),
        (None, Some(e)) => format!("every {e}"),
        (None, None) => "-".to_owned(),
    }
}

/// The missed-tick policy's name.
fn policy(m: Missed) -> &'static str {
    match m {
        Missed::Skip => "skip",
        Missed::FireOnce => "fire_once",
    }
}

/// A human-readable table of schedules (a header only when there are none).
fn table(all: &[ScheduleInfo]) -> String {
    use std::fmt::Write;
    let header = [
        "QUEUE", "ID", "SCHEDULE", "TIMEZONE", "NEXT", "LAST", "TICKS", "MISSED",
    ];
    let rows: Vec<[String; 8]> = all
        .iter()
        .map(|s| {
            [
                s.queue.clone(),
                s.id.clone(),
                recurrence(s),
                s.timezone.clone(),
                if s.paused && s.next_ms.is_none() {
                    "paused".to_owned()
                } else {
                    utc_opt(s.next_ms)
                },
                utc_opt(s.last_fired_ms),
                s.ticks.to_string(),
                s.missed_ticks.to_string(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            // The counts are right-aligned, the rest left-aligned.
            if i >= 6 {
                let _ = write!(l, "{cell:>w$}");
            } else {
                let _ = write!(l, "{cell:<w$}");
            }
        }
        let _ = writeln!(out, "{}", l.trim_end());
    };
    line(&header);
    for r in &rows {
        let cells: Vec<&str> = r.iter().map(String::as_str).collect();
        line(&cells);
    }
    out
}

/// Every field of one schedule, and its upcoming fire times.
fn details(s: &ScheduleInfo) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let when = |ms: Option<i64>| match ms {
        Some(n) => format!("{} ({n})", utc(n)),
        None => "-".to_owned(),
    };
    let mut field = |name: &str, value: String| {
        let l = format!("{:<13} {value}", format!("{name}:"));
        let _ = writeln!(out, "{}", l.trim_end());
    };
    field("queue", s.queue.clone());
    field("id", s.id.clone());
    if let Some(c) = &s.cron {
        field("cron", c.clone());
    }
    if let Some(e) = &s.every {
        field("every", e.clone());
    }
    field("timezone", s.timezone.clone());
    field("payload", s.payload.as_str().to_owned());
    field("start", when(s.start_ms));
    field("end", when(s.end_ms));
    field("missed", policy(s.missed).to_owned());
    field("next", when(s.next_ms));
    field(
        "next order",
        s.next_id.clone().unwrap_or_else(|| "-".into()),
    );
    field("last fired", when(s.last_fired_ms));
    field("ticks", s.ticks.to_string());
    field("missed ticks", s.missed_ticks.to_string());
    field("created", when(Some(s.created_ms)));
    field("updated", when(Some(s.updated_ms)));
    if s.upcoming_ms.is_empty() {
        let why = if s.paused {
            "none (the schedule is paused)"
        } else {
            "none (the schedule has ended)"
        };
        field("upcoming", why.to_owned());
    } else {
        field("upcoming", String::new());
        for &ms in &s.upcoming_ms {
            let mut l = format!("  {}", utc(ms));
            if let Some(t) = local(ms, &s.timezone) {
                let _ = write!(l, "  {t}");
            }
            let _ = write!(l, "  ({ms})");
            let _ = writeln!(out, "{l}");
        }
    }
    out
}
