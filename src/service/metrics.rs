//! Prometheus metrics. The library records through the `metrics` facade (a no-op until a
//! recorder is installed); [`handle`] installs the Prometheus recorder once per process.
//!
//! The metric names and labels are listed in [`crate::engine::telemetry`].

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Lateness buckets, seconds: 1 ms .. 5 min.
pub(crate) const LATENESS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// The process's Prometheus handle (installs the recorder on first call). `None` when another
/// recorder was installed first.
pub fn handle() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(crate::engine::telemetry::LATENESS_SECONDS.into()),
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
pub fn record_stats(s: &crate::engine::stats::QueueStats) {
    crate::engine::telemetry::queue_gauges(s);
}
