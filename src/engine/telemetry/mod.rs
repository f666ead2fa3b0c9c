//! Every metric delayq records: its name, its labels, and the one function that records it.
//!
//! The library records through the `metrics` facade, a no-op until an application (or
//! `delayq serve`, see `service::metrics`) installs a recorder. No other module writes a
//! metric name.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `delayq_scheduled_total` | counter | queue |
//! | `delayq_cancelled_total` | counter | queue, reason (id: one order cancelled by its id; tag: by a bulk cancel of a tag) |
//! | `delayq_dispatched_total` | counter | queue |
//! | `delayq_handled_total` | counter | queue, group, outcome (success, retry, dead, skipped) |
//! | `delayq_dead_lettered_total` | counter | queue, group |
//! | `delayq_expired_total` | counter | queue, group (orders not handed to the group past due + `expires_after`: dead-lettered with reason `expired`) |
//! | `delayq_order_close_total` | counter | queue, group, outcome (closed, already_paid, already_closed, not_yet_expired, unknown_order) |
//! | `delayq_reconciled_total` | counter | queue |
//! | `delayq_dead_trimmed_total` | counter | queue (retention and cap) |
//! | `delayq_rate_limited_total` | counter | queue, group (reads that waited for the limit) |
//! | `delayq_paused` | gauge | queue, group (empty for the queue's dispatch): 1 when paused |
//! | `delayq_lateness_seconds` | histogram | queue, group, priority (handler start − due time, first deliveries only) |
//! | `delayq_redelivery_age_seconds` | histogram | queue, group, reason (retry, replay, reconcile): handler start − due time of a redelivery |
//! | `delayq_key_waits_total` | counter | queue, group (entries parked to wait for a slot of their order key: `key_concurrency`, `key_sequence`) |
//! | `delayq_late_acks_total` | counter | queue, group (acks of entries this consumer no longer owned: another consumer had taken them over after its lease ran out, or acknowledged them) |
//! | `delayq_scheduled`, `delayq_overdue`, `delayq_oldest_overdue_seconds`, `delayq_dead`, `delayq_history` | gauge | queue |
//! | `delayq_pending` | gauge | queue, group |
//! | `delayq_stream_length`, `delayq_unread` | gauge | queue, priority (high, normal, low): entries in the level's streams; of them, not yet read, summed over the groups |
//! | `delayq_workers_stopped_total` | counter | queue, group (a worker stopped because its group or queue was deleted) |
//! | `delayq_maintenance_runs_total` | counter | service (each maintenance pass) |
//! | `delayq_maintenance_errors_total` | counter | service |
//! | `delayq_maintenance_removed_total` | counter | service, what (entries, dead letters, consumers, heartbeats, ...) |
//! | `delayq_supervised_queues` | gauge | (none): queues a supervisor dispatches in this process |
//! | `delayq_dispatcher_restarts_total` | counter | queue: dispatchers a supervisor started again after they stopped on their own (a panic, a refusal) |
//! | `delayq_wake_channels` | gauge | (none): wake channels this process's listener holds (one per shard of each queue a dispatcher here runs) |
//! | `delayq_dispatch_roster` | gauge | (none): members of the namespace's dispatch roster as this process last read it (one per queue per running dispatching process; see [`crate::engine::roster`]) |
//! | `delayq_dispatch_takeovers_total` | counter | queue: shards this process took over from their owner in the roster (their earliest order stayed overdue by `takeover_after`: the owner crashed, stopped or stalls) |
//! | `delayq_wake_reconnects_total` | counter | (none): times the wake-up listener's connection ended and was opened again |
//! | `delayq_metric_series` | gauge | (none): label sets of per-queue counters and histograms the service holds (those of a queue the registry no longer lists go at the second refresh) |
//! | `delayq_history_count_cache_buckets` | gauge | (none): sealed history buckets whose length this process caches for the stats (bounded; see [`crate::engine::history_counts`]) |
//! | `delayq_pull_waiting` | gauge | (none): pull receives of this process waiting for an entry (long polls) |
//! | `delayq_schedule_ticks_total` | counter | queue: ticks of recurring schedules enqueued |
//! | `delayq_schedule_missed_total` | counter | queue: ticks of recurring schedules missed (no scheduler ran in time) |
//! | `delayq_http_connections_cut_total` | counter | deadline (idle, header, write): HTTP connections the server closed past a deadline |
//! | `delayq_trace_spans_dropped_total` | counter | reason (queue_full, export_failed): finished spans the trace exporter never delivered (its queue was full, or the collector did not take them in time) |
//! | `delayq_redis_call_duration_seconds` | histogram | op (the script's name, e.g. `enqueue`, `dequeue`, `read`; `other` for any other command or pipeline): seconds from sending a call to Redis's reply, every call delayq makes (blocking reads and `WAIT` are not timed) |
//! | `delayq_redis_errors_total` | counter | op (as above, or `blocking`), kind (timeout, connection, busy, readonly, oom, noscript, denied, reply, other: see [`redis_error_kind`]) |
//! | `delayq_http_requests_total` | counter | route (the route's template, e.g. `/v1/queues/{queue}/messages/{id}`, or `unmatched`), method (GET, PUT, ..., `other`), status (the code, e.g. `200`, `503`) |
//! | `delayq_http_request_duration_seconds` | histogram | route, method: seconds from a request's head to its response's head |
//!
//! Gauges labelled by queue (and group) are shown only while the queue (and group) exists:
//! the service drops the series of deleted ones when it renders ([`QUEUE_GAUGES`]).
//! The service's recorder also forgets a gauge not set for a minute (every refresh sets
//! those of what exists), so a deleted queue's gauges do not stay in memory. Counters and
//! histograms labelled by queue are kept in a registry the service owns
//! (`service::metrics::QueueSeries`): a deleted queue's are left out of the text at once and
//! dropped when a second refresh still does not list it; a live queue's are never reset.

mod redis_calls;
pub use redis_calls::{RedisOp, RedisReply, redis_error_kind, timed_redis_call};

use crate::engine::priority::Priority;
use std::sync::{Arc, OnceLock};

/// Ticks of recurring schedules fired and missed on `queue`.
pub fn schedule_ticks(queue: &str, fired: u64, missed: u64) {
    if fired > 0 {
        metrics::counter!("delayq_schedule_ticks_total", "queue" => queue.to_owned())
            .increment(fired);
    }
    if missed > 0 {
        metrics::counter!("delayq_schedule_missed_total", "queue" => queue.to_owned())
            .increment(missed);
    }
}

/// An HTTP connection closed past its `deadline` (`idle`, `header`, `write`).
pub fn http_connection_cut(deadline: &'static str) {
    metrics::counter!("delayq_http_connections_cut_total", "deadline" => deadline).increment(1);
}

/// `n` finished spans the trace exporter dropped, for `reason` (`queue_full`: its bounded
/// queue was full; `export_failed`: the collector refused them, could not be reached, or did
/// not answer within the export timeout). Recording 0 makes the series visible.
pub fn trace_spans_dropped(reason: &'static str, n: u64) {
    metrics::counter!("delayq_trace_spans_dropped_total", "reason" => reason).increment(n);
}

/// The lateness histogram's name (the service sets its buckets): first deliveries only.
pub const LATENESS_SECONDS: &str = "delayq_lateness_seconds";
/// The redelivery age histogram's name (the service sets its buckets).
pub const REDELIVERY_AGE_SECONDS: &str = "delayq_redelivery_age_seconds";

/// Why an entry was delivered again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redelivery {
    /// A later attempt of a failed entry, or a reclaim of one whose lease ran out.
    Retry = 0,
    /// A dead letter replayed to its group.
    Replay = 1,
    /// A lost order sent again by reconciliation.
    Reconcile = 2,
}

impl Redelivery {
    const ALL: [Redelivery; 3] = [Redelivery::Retry, Redelivery::Replay, Redelivery::Reconcile];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Redelivery::Retry => "retry",
            Redelivery::Replay => "replay",
            Redelivery::Reconcile => "reconcile",
        }
    }
}

/// Receives the same numbers as the metrics, as they are recorded (the dashboard's ring
/// buffer of throughput and lateness). One per process, installed with [`set_sink`].
pub trait Sink: Send + Sync + 'static {
    /// Orders written by a schedule call.
    fn scheduled(&self, queue: &str, n: u64);
    /// Orders moved into the streams.
    fn dispatched(&self, queue: &str, n: u64);
    /// One settled entry, by outcome (`success`, `retry`, `dead`, `skipped`).
    fn handled(&self, queue: &str, group: &str, outcome: &'static str);
    /// How late a handler started, in seconds.
    fn lateness(&self, queue: &str, group: &str, seconds: f64);
}

static SINK: OnceLock<Arc<dyn Sink>> = OnceLock::new();

/// Installs the process's sink; false when one is already installed.
pub fn set_sink(sink: Arc<dyn Sink>) -> bool {
    SINK.set(sink).is_ok()
}

fn sink() -> Option<&'static Arc<dyn Sink>> {
    SINK.get()
}

/// Orders written by a schedule call.
pub fn scheduled(queue: &str, n: u64) {
    metrics::counter!("delayq_scheduled_total", "queue" => queue.to_owned()).increment(n);
    if let Some(s) = sink() {
        s.scheduled(queue, n);
    }
}

/// An order cancelled by its id.
pub fn cancelled(queue: &str) {
    cancelled_by(queue, "id", 1);
}

/// A posted event (see [`crate::engine::events`]): `outcome` is `matched` (some rule named
/// it), `unmatched` or `duplicate` (its id was seen within the window).
pub fn event_received(outcome: &'static str) {
    metrics::counter!("delayq_events_received_total", "outcome" => outcome).increment(1);
}

/// `n` orders cancelled, for `reason` (`id`, `tag`, `event`).
pub fn cancelled_by(queue: &str, reason: &'static str, n: u64) {
    metrics::counter!("delayq_cancelled_total", "queue" => queue.to_owned(), "reason" => reason)
        .increment(n);
}

/// Orders moved into the streams.
pub fn dispatched(queue: &str, n: u64) {
    metrics::counter!("delayq_dispatched_total", "queue" => queue.to_owned()).increment(n);
    if let Some(s) = sink() {
        s.dispatched(queue, n);
    }
}

/// One outcome of the order-close handler.
pub fn order_close(queue: &str, group: &str, outcome: &'static str) {
    metrics::counter!(
        "delayq_order_close_total",
        "queue" => queue.to_owned(),
        "group" => group.to_owned(),
        "outcome" => outcome
    )
    .increment(1);
}

/// One consumer group's per-order metrics, registered once when its worker starts, so
/// handling an order allocates no label strings.
#[derive(Clone)]
pub struct GroupMetrics {
    queue: String,
    group: String,
    success: metrics::Counter,
    retry: metrics::Counter,
    dead: metrics::Counter,
    skipped: metrics::Counter,
    dead_lettered: metrics::Counter,
    expired: metrics::Counter,
    late_acks: metrics::Counter,
    key_waits: metrics::Counter,
    /// By priority rank (high, normal, low).
    lateness: [metrics::Histogram; 3],
    redelivery: [metrics::Histogram; 3],
}

impl std::fmt::Debug for GroupMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupMetrics")
            .field("queue", &self.queue)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl GroupMetrics {
    /// The handles of `group` on `queue` (with the recorder installed now).
    pub fn new(queue: &str, group: &str) -> Self {
        let handled = |outcome: &'static str| {
            metrics::counter!(
                "delayq_handled_total",
                "queue" => queue.to_owned(),
                "group" => group.to_owned(),
                "outcome" => outcome
            )
        };
        GroupMetrics {
            queue: queue.to_owned(),
            group: group.to_owned(),
            success: handled("success"),
            retry: handled("retry"),
            dead: handled("dead"),
            skipped: handled("skipped"),
            dead_lettered: metrics::counter!(
                "delayq_dead_lettered_total",
                "queue" => queue.to_owned(),
                "group" => group.to_owned()
            ),
            expired: metrics::counter!(
                "delayq_expired_total",
                "queue" => queue.to_owned(),
                "group" => group.to_owned()
            ),
            late_acks: metrics::counter!(
                "delayq_late_acks_total",
                "queue" => queue.to_owned(),
                "group" => group.to_owned()
            ),
            key_waits: metrics::counter!(
                "delayq_key_waits_total",
                "queue" => queue.to_owned(),
                "group" => group.to_owned()
            ),
            lateness: Priority::ALL.map(|p| {
                metrics::histogram!(
                    LATENESS_SECONDS,
                    "queue" => queue.to_owned(),
                    "group" => group.to_owned(),
                    "priority" => p.as_str()
                )
            }),
            redelivery: Redelivery::ALL.map(|r| {
                metrics::histogram!(
                    REDELIVERY_AGE_SECONDS,
                    "queue" => queue.to_owned(),
                    "group" => group.to_owned(),
                    "reason" => r.label()
                )
            }),
        }
    }

    /// One settled entry, by outcome (`success`, `retry`, `dead`, `skipped`).
    pub fn handled(&self, outcome: &'static str) {
        match outcome {
            "success" => self.success.increment(1),
            "retry" => self.retry.increment(1),
            "dead" => self.dead.increment(1),
            _ => self.skipped.increment(1),
        }
        if let Some(s) = sink() {
            s.handled(&self.queue, &self.group, outcome);
        }
    }

    /// One entry moved to the dead-letter stream.
    pub fn dead_lettered(&self) {
        self.dead_lettered.increment(1);
    }

    /// One order not handed to the group because it expired (see [`crate::engine::expiry`]).
    pub fn expired(&self) {
        self.expired.increment(1);
    }

    /// Acknowledgements of entries another consumer had acknowledged already.
    pub fn late_acks(&self, n: u64) {
        self.late_acks.increment(n);
    }

    /// One entry parked to wait for a slot of its order key (`key_concurrency`).
    pub fn key_waited(&self) {
        self.key_waits.increment(1);
    }

    /// How long after its due time a redelivery started (a retry, a reclaim, a replay or
    /// a reconciliation), in seconds: kept apart from the first deliveries' lateness.
    pub fn redelivery_age(&self, reason: Redelivery, seconds: f64) {
        self.redelivery[reason as usize].record(seconds.max(0.0));
    }

    /// How late a handler started on a first delivery of an order of level `priority`, in
    /// seconds (never negative).
    pub fn lateness(&self, priority: Priority, seconds: f64) {
        self.lateness[priority.rank()].record(seconds.max(0.0));
        if let Some(s) = sink() {
            s.lateness(&self.queue, &self.group, seconds.max(0.0));
        }
    }
}

/// Dead letters removed by retention or the per-queue cap.
pub fn dead_trimmed(queue: &str, n: u64) {
    metrics::counter!("delayq_dead_trimmed_total", "queue" => queue.to_owned()).increment(n);
}

/// A read or reclaim that waited for the group's rate limit.
pub fn rate_limited(queue: &str, group: &str) {
    metrics::counter!(
        "delayq_rate_limited_total",
        "queue" => queue.to_owned(),
        "group" => group.to_owned()
    )
    .increment(1);
}

/// Orders the reconciliation job rescheduled.
pub fn reconciled(queue: &str, n: u64) {
    metrics::counter!("delayq_reconciled_total", "queue" => queue.to_owned()).increment(n);
}

/// The gauges labelled by queue (and group) that a deleted queue or group must not keep.
pub const QUEUE_GAUGES: &[&str] = &[
    "delayq_scheduled",
    "delayq_overdue",
    "delayq_oldest_overdue_seconds",
    "delayq_dead",
    "delayq_history",
    "delayq_paused",
    "delayq_pending",
    "delayq_stream_length",
    "delayq_unread",
];

/// A worker stopped on its own because its group (or its queue) was deleted.
pub fn worker_stopped(queue: &str, group: &str) {
    metrics::counter!(
        "delayq_workers_stopped_total",
        "queue" => queue.to_owned(),
        "group" => group.to_owned()
    )
    .increment(1);
}

/// One pass of a maintenance service (`service` names it), and what it removed.
pub fn maintenance_pass(service: &'static str, ok: bool, removed: &[(&'static str, u64)]) {
    metrics::counter!("delayq_maintenance_runs_total", "service" => service).increment(1);
    if !ok {
        metrics::counter!("delayq_maintenance_errors_total", "service" => service).increment(1);
    }
    for (what, n) in removed {
        if *n > 0 {
            metrics::counter!(
                "delayq_maintenance_removed_total",
                "service" => service,
                "what" => *what
            )
            .increment(*n);
        }
    }
}

/// A supervisor started `queue`'s dispatcher again after it stopped on its own.
pub fn dispatcher_restarted(queue: &str) {
    metrics::counter!("delayq_dispatcher_restarts_total", "queue" => queue.to_owned()).increment(1);
}

/// How many wake channels this process's listener holds.
#[allow(clippy::cast_precision_loss)]
pub fn wake_channels(n: usize) {
    metrics::gauge!("delayq_wake_channels").set(n as f64);
}

/// How many members the dispatch roster had at this process's last read.
#[allow(clippy::cast_precision_loss)]
pub fn dispatch_roster(n: usize) {
    metrics::gauge!("delayq_dispatch_roster").set(n as f64);
}

/// This process took over a shard of `queue` from its owner in the roster.
pub fn dispatch_takeover(queue: &str) {
    metrics::counter!("delayq_dispatch_takeovers_total", "queue" => queue.to_owned()).increment(1);
}

/// The wake-up listener's connection ended (it opens a new one).
pub fn wake_reconnected() {
    metrics::counter!("delayq_wake_reconnects_total").increment(1);
}

/// How many pull receives of this process wait for an entry now (long polls).
#[allow(clippy::cast_precision_loss)]
pub fn pull_waiting(n: usize) {
    metrics::gauge!("delayq_pull_waiting").set(n as f64);
}

/// How many sealed history buckets this process's stats cache holds (bounded by
/// [`crate::engine::history_counts::MAX_CACHED_BUCKETS`]).
#[allow(clippy::cast_precision_loss)]
pub fn history_count_cache(n: usize) {
    metrics::gauge!("delayq_history_count_cache_buckets").set(n as f64);
}

/// How many queues this process's supervisor dispatches.
#[allow(clippy::cast_precision_loss)]
pub fn supervised_queues(n: usize) {
    metrics::gauge!("delayq_supervised_queues").set(n as f64);
}

// ---------------------------------------------------------------------------------------
// Redis calls and HTTP requests

/// The Redis round-trip histogram's name (the service sets its buckets): seconds from
/// sending a command (or pipeline) to its reply, labelled `op`.
pub const REDIS_CALL_SECONDS: &str = "delayq_redis_call_duration_seconds";
/// The Redis error counter's name, labelled `op` and `kind` ([`redis_error_kind`]).
pub const REDIS_ERRORS_TOTAL: &str = "delayq_redis_errors_total";
/// The HTTP request counter's name, labelled `route`, `method`, `status`.
pub const HTTP_REQUESTS_TOTAL: &str = "delayq_http_requests_total";
/// The HTTP latency histogram's name (the service sets its buckets), labelled `route`,
/// `method`: seconds from the request's head read to the response's head.
pub const HTTP_REQUEST_SECONDS: &str = "delayq_http_request_duration_seconds";

/// The `method` label: the standard methods by name, any other as `other` (a method is any
/// token a client sends: it must not make series).
pub fn http_method_label(method: &str) -> &'static str {
    [
        "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE",
    ]
    .into_iter()
    .find(|m| *m == method)
    .unwrap_or("other")
}

/// One HTTP request answered: `route` is the route's template (`/v1/queues/{queue}`), never
/// the raw path, or `unmatched`; `status` the response's code.
pub fn http_request(route: &str, method: &'static str, status: u16, seconds: f64) {
    metrics::counter!(
        HTTP_REQUESTS_TOTAL,
        "route" => route.to_owned(),
        "method" => method,
        "status" => status.to_string()
    )
    .increment(1);
    metrics::histogram!(HTTP_REQUEST_SECONDS, "route" => route.to_owned(), "method" => method)
        .record(seconds);
}

#[cfg(test)]
mod tests {
    use super::redis_calls::redis_reply_kind;
    use super::*;
    use crate::engine::scripts;

    fn evalsha(text: &str) -> redis::Cmd {
        let mut c = redis::cmd("EVALSHA");
        c.arg(scripts::sha1_of(text)).arg(0);
        c
    }

    #[test]
    fn redis_calls_are_named_by_script_and_blocking_ones_are_not_timed() {
        for (name, text) in scripts::flagged() {
            assert_eq!(RedisOp::of(&evalsha(text)).label(), name);
            assert_eq!(RedisOp::of(&evalsha(scripts::legacy(text))).label(), name);
        }
        assert_eq!(RedisOp::of(&evalsha("return 1")).label(), "other");
        assert_eq!(RedisOp::of(redis::cmd("GET").arg("k")).label(), "other");
        let mut read = redis::cmd("XREAD");
        read.arg("COUNT").arg(1).arg("STREAMS").arg("s").arg("$");
        assert_eq!(RedisOp::of(&read).label(), "other");
        let mut block = redis::cmd("xread");
        block.arg("block").arg(100).arg("STREAMS").arg("s").arg("$");
        assert_eq!(RedisOp::of(&block).label(), "blocking");
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg("k");
        pipe.add_command(evalsha(&scripts::DEQUEUE_LUA));
        assert_eq!(RedisOp::of_pipeline(&pipe).label(), "dequeue");
        pipe.cmd("WAIT").arg(1).arg(10);
        assert_eq!(RedisOp::of_pipeline(&pipe).label(), "blocking");
    }

    #[test]
    fn error_kinds_are_a_fixed_set() {
        let io = |k| redis::RedisError::from(std::io::Error::from(k));
        assert_eq!(
            redis_error_kind(&io(std::io::ErrorKind::TimedOut)),
            "timeout"
        );
        assert_eq!(
            redis_error_kind(&io(std::io::ErrorKind::ConnectionRefused)),
            "connection"
        );
        for (code, kind) in [
            ("NOSCRIPT", "noscript"),
            ("BUSY", "busy"),
            ("LOADING", "busy"),
            ("READONLY", "readonly"),
            ("NOREPLICAS", "readonly"),
            ("OOM", "oom"),
            ("NOPERM", "denied"),
            ("ERR", "reply"),
            ("NOGROUP", "reply"),
        ] {
            assert_eq!(redis_reply_kind(code), kind, "{code}");
        }
        assert_eq!(http_method_label("GET"), "GET");
        assert_eq!(http_method_label("BREW"), "other");
    }
}
