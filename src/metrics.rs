//! Prometheus metrics. The library records through the `metrics` facade (a no-op until a
//! recorder is installed); [`handle`] installs the Prometheus recorder once per process.
//!
//! Counters: `delayq_scheduled_total{queue}`, `delayq_cancelled_total{queue}`,
//! `delayq_dispatched_total{queue}`, `delayq_handled_total{queue,group,outcome}` (outcome =
//! success, retry, dead, skipped), `delayq_dead_lettered_total{queue,group}`,
//! `delayq_order_close_total{queue,group,outcome}` (outcome = closed, already_paid,
//! already_closed, not_yet_expired, unknown_order), `delayq_reconciled_total{queue}`.
//! Histogram: `delayq_lateness_seconds{queue,group}` (handler start − due time).
//! Gauges (refreshed by `serve`): `delayq_scheduled{queue}`, `delayq_overdue{queue}`,
//! `delayq_oldest_overdue_seconds{queue}`, `delayq_pending{queue,group}`,
//! `delayq_dead{queue}`.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Lateness buckets, seconds: 1 ms .. 5 min.
const LATENESS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// The process's Prometheus handle (installs the recorder on first call). `None` when another
/// recorder was installed first.
pub fn handle() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("delayq_lateness_seconds".into()),
                    LATENESS_BUCKETS,
                )
                .ok()?;
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok()?;
            Some(handle)
        })
        .as_ref()
}

/// Refreshes the gauges of one queue from its statistics.
pub fn record_stats(s: &crate::stats::QueueStats) {
    let q = s.queue.clone();
    metrics::gauge!("delayq_scheduled", "queue" => q.clone()).set(s.scheduled as f64);
    metrics::gauge!("delayq_overdue", "queue" => q.clone()).set(s.overdue as f64);
    metrics::gauge!("delayq_oldest_overdue_seconds", "queue" => q.clone())
        .set(s.oldest_overdue_ms as f64 / 1000.0);
    metrics::gauge!("delayq_dead", "queue" => q.clone()).set(s.dead as f64);
    for g in &s.groups {
        metrics::gauge!("delayq_pending", "queue" => q.clone(), "group" => g.group.clone())
            .set(g.pending as f64);
    }
}
