//! What the bench measures: the report, handler start times, lateness, CPU of Redis and of
//! this process.

use crate::{Client, Delivery};
use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// One scenario's result, printed as one JSON line.
#[derive(Debug, Clone, Serialize, Default)]
pub struct BenchReport {
    /// The scenario.
    pub scenario: String,
    /// Orders.
    pub n: usize,
    /// Seconds to schedule all orders.
    pub enqueue_s: Option<f64>,
    /// Orders scheduled per second.
    pub enqueue_rate: Option<f64>,
    /// When scheduling finished, ms after the start.
    pub enqueue_done_offset_ms: Option<f64>,
    /// Redis used_memory before scheduling.
    pub mem_before: Option<i64>,
    /// Redis used_memory right after scheduling.
    pub mem_after: Option<i64>,
    /// (mem_after − mem_before) / n.
    pub mem_per_order_bytes: Option<f64>,
    /// Handler calls.
    pub processed: Option<usize>,
    /// Distinct orders handled.
    pub handled: Option<usize>,
    /// Handler calls beyond the first per order.
    pub duplicates: Option<usize>,
    /// Orders never handled.
    pub missing: Option<usize>,
    /// Orders handled before their due time.
    pub early_count: Option<usize>,
    /// Lateness minimum, ms.
    pub late_min_ms: Option<f64>,
    /// Lateness p50, ms.
    pub late_p50_ms: Option<f64>,
    /// Lateness p90, ms.
    pub late_p90_ms: Option<f64>,
    /// Lateness p99, ms.
    pub late_p99_ms: Option<f64>,
    /// Lateness maximum, ms.
    pub late_max_ms: Option<f64>,
    /// First handler start, ms after the start.
    pub first_handled_ms: Option<f64>,
    /// Last handler start, ms after the start.
    pub last_handled_ms: Option<f64>,
    /// Storm: seconds from the due instant to the last handled.
    pub drain_s: Option<f64>,
    /// Storm: orders per second over drain_s (dispatch rate, for `dispatch`).
    pub drain_rate: Option<f64>,
    /// Redis CPU (user + sys) over the run / n, µs.
    pub redis_cpu_us_per_order: Option<f64>,
    /// This process's CPU (user + sys: producer, dispatcher and worker together) over the
    /// scenario / n, µs.
    pub client_cpu_us_per_order: Option<f64>,
    /// Redis time in script calls (`EVALSHA` in `INFO commandstats`) / n, µs.
    pub script_us_per_order: Option<f64>,
    /// Of it, the Lua interpreter's own work (`EVALSHA` time less the time of the commands
    /// the scripts ran, which `commandstats` counts under their own names) / n, µs.
    pub interpreter_us_per_order: Option<f64>,
    /// Script calls per order (`EVALSHA` calls / n): how many orders each call moves.
    pub script_calls_per_order: Option<f64>,
    /// Bytes of order history kept per dispatched order (`dispatch`).
    pub history_bytes_per_order: Option<f64>,
    /// Idle: Redis commands per second with nothing due (`idle`, `--orders` = queues).
    pub commands_per_s: Option<f64>,
    /// Idle: Redis CPU (user + sys) per second of wall time, ms.
    pub redis_cpu_ms_per_s: Option<f64>,
    /// A ratio line (`spread/seed`, `storm/seed-storm`): delayq's Redis CPU per order over
    /// the seed design's, in the same run.
    pub cpu_ratio: Option<f64>,
    /// True when not every order was handled in time.
    pub timed_out: bool,
    /// Free text: what was measured and how.
    pub notes: String,
}

/// `field` of `INFO section`, summed over every node that answered (a Redis Cluster
/// answers once per node; a single server once).
pub(super) async fn info_field<T: std::str::FromStr + std::iter::Sum>(
    client: &Client,
    section: &str,
    field: &str,
) -> anyhow::Result<T> {
    let reply: redis::Value = redis::cmd("INFO")
        .arg(section)
        .query_async(&mut client.connection())
        .await?;
    let texts: Vec<String> = match reply {
        redis::Value::Map(nodes) => nodes
            .into_iter()
            .filter_map(|(_, v)| redis::from_redis_value(v).ok())
            .collect(),
        other => vec![redis::from_redis_value(other)?],
    };
    let values = texts
        .iter()
        .map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix(&format!("{field}:")))
                .and_then(|v| v.trim().parse::<T>().ok())
                .with_context(|| format!("INFO {section} has no {field}"))
        })
        .collect::<anyhow::Result<Vec<T>>>()?;
    anyhow::ensure!(!values.is_empty(), "INFO {section}: no answer");
    Ok(values.into_iter().sum())
}

pub(super) async fn redis_cpu_s(client: &Client) -> anyhow::Result<f64> {
    Ok(info_field::<f64>(client, "cpu", "used_cpu_user").await?
        + info_field::<f64>(client, "cpu", "used_cpu_sys").await?)
}

/// `INFO commandstats`: per command, (calls, µs), summed over the nodes that answered.
pub(super) async fn command_stats(client: &Client) -> anyhow::Result<HashMap<String, (f64, f64)>> {
    let reply: redis::Value = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut client.connection())
        .await?;
    let texts: Vec<String> = match reply {
        redis::Value::Map(nodes) => nodes
            .into_iter()
            .filter_map(|(_, v)| redis::from_redis_value(v).ok())
            .collect(),
        other => vec![redis::from_redis_value(other)?],
    };
    let mut out: HashMap<String, (f64, f64)> = HashMap::new();
    for line in texts.iter().flat_map(|t| t.lines()) {
        // cmdstat_<name>:calls=N,usec=U,usec_per_call=...
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |k: &str| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(k))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let e = out.entry(name.to_owned()).or_default();
        e.0 += field("calls=");
        e.1 += field("usec=");
    }
    Ok(out)
}

/// Commands a client sends outside scripts in the bench scenarios (a worker's blocking
/// wait and acks, clock and flag reads, INFO itself): not part of any script's time.
const OUTSIDE_SCRIPTS: &[&str] = &[
    "xack", "xread", "time", "info", "ping", "client", "hello", "hgetall", "hmget", "get",
    "smembers", "select", "config",
];

/// What `command` did between two `commandstats` readings: (calls, µs).
pub(super) fn stat_delta(
    before: &HashMap<String, (f64, f64)>,
    after: &HashMap<String, (f64, f64)>,
    command: &str,
) -> (f64, f64) {
    let a = after.get(command).copied().unwrap_or_default();
    let b = before.get(command).copied().unwrap_or_default();
    (a.0 - b.0, a.1 - b.1)
}

/// The split of Redis time between two `commandstats` readings over `n` orders: (script
/// µs per order, interpreter µs per order, script calls per order). The ack pipeline's
/// `ZREM` and `HDEL` (one each per `XACK`) are taken out of the commands the scripts ran.
pub(super) fn script_split(
    before: &HashMap<String, (f64, f64)>,
    after: &HashMap<String, (f64, f64)>,
    n: usize,
) -> (f64, f64, f64) {
    let diff = |k: &str| stat_delta(before, after, k);
    let (calls, script) = diff("evalsha");
    let (xacks, _) = diff("xack");
    let mut inner = 0.0;
    for k in after.keys() {
        if k == "evalsha" || k == "evalsha_ro" || OUTSIDE_SCRIPTS.contains(&k.as_str()) {
            continue;
        }
        let (c, us) = diff(k);
        if c <= 0.0 {
            continue;
        }
        let outside = if k == "zrem" || k == "hdel" {
            xacks.min(c)
        } else {
            0.0
        };
        inner += us * (c - outside) / c;
    }
    let n = n.max(1) as f64;
    (script / n, (script - inner).max(0.0) / n, calls / n)
}

/// What the bench handler saw: handler start times (µs, Redis clock) per order index.
#[derive(Default)]
pub(super) struct Recorder {
    pub(super) seen: Arc<Mutex<HashMap<usize, Vec<i64>>>>,
    handled: Arc<std::sync::atomic::AtomicUsize>,
    /// Cancelled once every one of the `n` orders was handled at least once.
    pub(super) all_done: CancellationToken,
}

impl Recorder {
    /// A handler recording each delivery's start time.
    pub(super) fn handler(
        &self,
        client: &Client,
        n: usize,
    ) -> impl Fn(Delivery) -> std::future::Ready<crate::HandlerResult> + Send + Sync + 'static {
        let (seen, handled, all_done) = (
            self.seen.clone(),
            self.handled.clone(),
            self.all_done.clone(),
        );
        let clock = client.clock().clone();
        move |d: Delivery| {
            let at = clock.now_us();
            let i = d.payload["order"]
                .as_u64()
                .and_then(|i| usize::try_from(i).ok())
                .unwrap_or(usize::MAX);
            if let Ok(mut m) = seen.lock() {
                let v = m.entry(i).or_default();
                v.push(at);
                if v.len() == 1
                    && handled.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == n
                {
                    all_done.cancel();
                }
            }
            std::future::ready(Ok(()))
        }
    }
}

/// Lateness over every order's first handler start.
pub(super) struct Lateness {
    hist: Histogram<u64>,
    early: usize,
    min_late: i64,
    processed: usize,
    first: i64,
    pub(super) last: i64,
}

impl Lateness {
    /// Sets the report's handling and lateness fields.
    pub(super) fn fill(&self, r: &mut BenchReport, n: usize, distinct: usize, start_ms: i64) {
        let ms = |us: u64| us as f64 / 1000.0;
        let since_start = |us: i64| (us - start_ms * 1000) as f64 / 1000.0;
        r.processed = Some(self.processed);
        r.handled = Some(distinct);
        r.duplicates = Some(self.processed - distinct);
        r.missing = Some(n - distinct);
        r.early_count = Some(self.early);
        r.late_min_ms = (distinct > 0).then(|| self.min_late as f64 / 1000.0);
        r.late_p50_ms = Some(ms(self.hist.value_at_quantile(0.50)));
        r.late_p90_ms = Some(ms(self.hist.value_at_quantile(0.90)));
        r.late_p99_ms = Some(ms(self.hist.value_at_quantile(0.99)));
        r.late_max_ms = Some(ms(self.hist.max()));
        r.first_handled_ms = (distinct > 0).then(|| since_start(self.first));
        r.last_handled_ms = (distinct > 0).then(|| since_start(self.last));
    }

    pub(super) fn of(
        seen: &HashMap<usize, Vec<i64>>,
        due_us: impl Fn(usize) -> i64,
    ) -> anyhow::Result<Self> {
        let mut l = Lateness {
            hist: Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)?,
            early: 0,
            min_late: i64::MAX,
            processed: 0,
            first: i64::MAX,
            last: i64::MIN,
        };
        for (i, times) in seen {
            l.processed += times.len();
            let Some(&t) = times.first() else { continue };
            let late = t - due_us(*i);
            if late < 0 {
                l.early += 1;
            }
            l.min_late = l.min_late.min(late);
            let _ = l.hist.record(u64::try_from(late).unwrap_or(0).max(1));
            l.first = l.first.min(t);
            l.last = l.last.max(t);
        }
        Ok(l)
    }
}

/// This process's CPU time (user + system), seconds, from `/proc/self/stat` (Linux; `None`
/// elsewhere). Clock ticks are 100 per second on Linux.
pub(super) fn process_cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after ')'.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// One report: a JSON line, or `key value` lines for people.
pub(super) fn print_report(report: &BenchReport, json: bool) {
    let line = crate::cli::json_line(report);
    if json {
        outln!("{line}");
        return;
    }
    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
    if let Some(m) = v.as_object() {
        outln!("{}:", report.scenario);
        for (k, val) in m {
            if !val.is_null() && k != "scenario" {
                outln!("  {k:<24} {val}");
            }
        }
    }
}
