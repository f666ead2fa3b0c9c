//! `delayq stats [QUEUE] [--json] [--watch]`.

use super::{Global, VerbResult, print_json};
use crate::engine::admin::stats::QueueStats;
use crate::service::surface::{self, StatsAnswer};

/// Runs the verb.
pub(super) async fn run(g: &Global, queue: Option<&str>, json: bool, watch: bool) -> VerbResult {
    if let Some(q) = queue {
        surface::check_queue_group(q, None)?;
    }
    let client = g.connect().await?;
    loop {
        let answer = StatsAnswer::of(match queue {
            Some(q) => vec![client.admin().stats(q).await?],
            None => client.admin().stats_all().await?,
        });
        if json {
            print_json(&answer);
        } else {
            if watch {
                out!("\x1b[2J\x1b[H");
            }
            out!("{}", table(&answer.queues, client.now_ms()));
        }
        if !watch {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// A human-readable table of queue statistics.
fn table(all: &[QueueStats], now_ms: i64) -> String {
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
            let kind = g
                .kind
                .as_deref()
                .map_or(String::new(), |k| format!(" kind={k}"));
            let keys = if g.keys_active > 0 {
                format!(" keys={} key_waiting={}", g.keys_active, g.key_waiting)
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "  group {:<16} pending={} lag={} consumers={}{kind}{keys}",
                g.group, g.pending, lag, g.consumers
            );
        }
    }
    out
}
