//! Prometheus metrics. The library records through the `metrics` facade (a no-op until a
//! recorder is installed); [`handle`] installs the Prometheus recorder once per process.
//!
//! The metric names and labels are listed in [`crate::engine::telemetry`].

mod series;
pub use series::{Layered, QueueSeries};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::{Arc, OnceLock};

static HANDLE: OnceLock<Option<(PrometheusHandle, Arc<QueueSeries>)>> = OnceLock::new();

/// A gauge not set for this long is forgotten by the recorder (its label set freed). Every
/// refresh before a render sets the gauges of every queue and group that exists (and the
/// supervisor its own every few seconds), so only those of deleted queues and groups go:
/// the process's memory does not grow with every queue name it ever saw. Counters and
/// histograms are kept (a forgotten counter would come back from zero, and `increase()`
/// would miss its first step).
pub(crate) const GAUGE_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Lateness buckets, seconds: 1 ms .. 5 min.
pub(crate) const LATENESS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Redelivery age buckets, seconds: 10 ms .. 1 week (retries wait minutes, replays days).
pub(crate) const REDELIVERY_BUCKETS: &[f64] = &[
    0.01, 0.1, 1.0, 10.0, 60.0, 300.0, 1800.0, 3600.0, 21600.0, 86400.0, 604800.0,
];

/// Redis round-trip buckets, seconds: 100 µs .. 5 s.
pub(crate) const REDIS_CALL_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// HTTP latency buckets, seconds: 1 ms .. 30 s.
pub(crate) const HTTP_REQUEST_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Each histogram's buckets, by name (the exporter's and [`series`]' one table).
pub(crate) const HISTOGRAM_BUCKETS: &[(&str, &[f64])] = &[
    (crate::engine::telemetry::LATENESS_SECONDS, LATENESS_BUCKETS),
    (
        crate::engine::telemetry::REDELIVERY_AGE_SECONDS,
        REDELIVERY_BUCKETS,
    ),
    (
        crate::engine::telemetry::REDIS_CALL_SECONDS,
        REDIS_CALL_BUCKETS,
    ),
    (
        crate::engine::telemetry::HTTP_REQUEST_SECONDS,
        HTTP_REQUEST_BUCKETS,
    ),
];

/// The process's Prometheus handle (installs the recorder on first call). `None` when another
/// recorder was installed first. Its own `render()` holds neither the per-queue counters nor
/// the histograms ([`QueueSeries`]): [`render`] writes the whole text.
pub fn handle() -> Option<&'static PrometheusHandle> {
    installed().map(|(h, _)| h)
}

/// The handle and the per-queue series of the installed recorder.
fn installed() -> Option<&'static (PrometheusHandle, Arc<QueueSeries>)> {
    HANDLE
        .get_or_init(|| {
            let mut builder = builder(GAUGE_IDLE_TIMEOUT);
            for (name, buckets) in HISTOGRAM_BUCKETS {
                builder = builder
                    .set_buckets_for_metric(Matcher::Full((*name).into()), buckets)
                    .ok()?;
            }
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            let series = Arc::new(QueueSeries::default());
            let layered = Layered {
                inner: recorder,
                series: series.clone(),
                buckets: HISTOGRAM_BUCKETS,
            };
            metrics::set_global_recorder(layered).ok()?;
            Some((handle, series))
        })
        .as_ref()
}

/// The recorder's builder: gauges idle for `gauge_idle` are forgotten.
fn builder(gauge_idle: std::time::Duration) -> PrometheusBuilder {
    PrometheusBuilder::new().idle_timeout(metrics_util::MetricKindMask::GAUGE, Some(gauge_idle))
}

/// Refreshes the gauges of one queue from its statistics.
#[allow(clippy::cast_precision_loss)]
pub fn record_stats(s: &crate::engine::admin::stats::QueueStats) {
    let q = s.queue.clone();
    metrics::gauge!("delayq_scheduled", "queue" => q.clone()).set(s.scheduled as f64);
    metrics::gauge!("delayq_overdue", "queue" => q.clone()).set(s.overdue as f64);
    metrics::gauge!("delayq_oldest_overdue_seconds", "queue" => q.clone())
        .set(s.oldest_overdue_ms as f64 / 1000.0);
    metrics::gauge!("delayq_dead", "queue" => q.clone()).set(s.dead as f64);
    metrics::gauge!("delayq_history", "queue" => q.clone()).set(s.history as f64);
    metrics::gauge!("delayq_paused", "queue" => q.clone(), "group" => "")
        .set(f64::from(u8::from(s.paused)));
    for p in &s.priorities {
        let level = p.priority.as_str();
        metrics::gauge!("delayq_stream_length", "queue" => q.clone(), "priority" => level)
            .set(p.stream_length as f64);
        metrics::gauge!("delayq_unread", "queue" => q.clone(), "priority" => level)
            .set(p.unread as f64);
    }
    for g in &s.groups {
        metrics::gauge!("delayq_pending", "queue" => q.clone(), "group" => g.group.clone())
            .set(g.pending as f64);
        metrics::gauge!("delayq_paused", "queue" => q.clone(), "group" => g.group.clone())
            .set(f64::from(u8::from(g.paused)));
        metrics::gauge!("delayq_keys_active", "queue" => q.clone(), "group" => g.group.clone())
            .set(g.keys_active as f64);
        metrics::gauge!("delayq_key_waiting", "queue" => q.clone(), "group" => g.group.clone())
            .set(g.key_waiting as f64);
    }
}

/// The queues and groups that exist, as one refresh of the gauges saw them.
#[derive(Debug, Default)]
pub struct Live {
    queues: std::collections::HashSet<String>,
    groups: std::collections::HashSet<(String, String)>,
}

impl Live {
    /// From the statistics of every registered queue.
    pub fn of(all: &[crate::engine::admin::stats::QueueStats]) -> Self {
        let mut live = Live::default();
        for s in all {
            live.queues.insert(s.queue.clone());
            for g in &s.groups {
                live.groups.insert((s.queue.clone(), g.group.clone()));
            }
        }
        live
    }

    /// Whether a series with these labels belongs to something that exists.
    fn keeps(&self, queue: &str, group: Option<&str>) -> bool {
        match group {
            None | Some("") => self.queues.contains(queue),
            Some(g) => self.groups.contains(&(queue.to_owned(), g.to_owned())),
        }
    }
}

/// The Prometheus text. With `live`, the queue gauges
/// ([`QUEUE_GAUGES`](crate::engine::telemetry::QUEUE_GAUGES)) of queues and groups that no
/// longer exist are left out (the exporter forgets them once idle), and so are the per-queue
/// counters and histograms of deleted queues, which [`QueueSeries`] then drops.
pub fn render(live: Option<&Live>) -> String {
    let Some((handle, series)) = installed() else {
        return String::new();
    };
    render_with(handle, series, live)
}

/// [`render`] with a given recorder's parts.
#[allow(clippy::cast_precision_loss)]
fn render_with(handle: &PrometheusHandle, series: &QueueSeries, live: Option<&Live>) -> String {
    if let Some(live) = live {
        series.retain(&live.queues);
    }
    metrics::gauge!("delayq_metric_series").set(series.len() as f64);
    let text = handle.render();
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if live.is_some_and(|live| !line.starts_with('#') && !keep_line(line, live)) {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&series.render(live.map(|l| &l.queues)));
    out
}

fn keep_line(line: &str, live: &Live) -> bool {
    let Some((name, rest)) = line.split_once('{') else {
        return true;
    };
    if !crate::engine::telemetry::QUEUE_GAUGES.contains(&name) {
        return true;
    }
    let label = |key: &str| {
        let pat = format!("{key}=\"");
        rest.find(&pat).and_then(|i| {
            let v = &rest[i + pat.len()..];
            v.find('"').map(|j| &v[..j])
        })
    };
    match label("queue") {
        Some(q) => live.keeps(q, label("group")),
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gauges_of_a_deleted_queue_are_forgotten_and_the_live_ones_kept() {
        let recorder = builder(std::time::Duration::from_millis(50)).build_recorder();
        let handle = recorder.handle();
        let stats = |q: &str| crate::engine::admin::stats::QueueStats {
            queue: q.into(),
            scheduled: 1,
            overdue: 0,
            oldest_overdue_ms: 0,
            next_due_at_ms: None,
            stream_length: 0,
            dead: 0,
            history: 0,
            paused: false,
            groups: Vec::new(),
            priorities: Vec::new(),
        };
        metrics::with_local_recorder(&recorder, || {
            record_stats(&stats("live"));
            record_stats(&stats("gone"));
            crate::engine::telemetry::dispatched("gone", 1);
        });
        assert!(
            handle
                .render()
                .contains(r#"delayq_scheduled{queue="gone"}"#)
        );
        // "gone" is deleted: the refreshes set only "live"'s gauges from now on.
        let start = std::time::Instant::now();
        loop {
            metrics::with_local_recorder(&recorder, || record_stats(&stats("live")));
            let text = handle.render();
            assert!(text.contains(r#"delayq_scheduled{queue="live"}"#), "{text}");
            if !text.contains(r#"delayq_scheduled{queue="gone"}"#) {
                assert!(!text.contains(r#"delayq_paused{queue="gone""#), "{text}");
                // Its counter stays: counters are never forgotten.
                assert!(
                    text.contains(r#"delayq_dispatched_total{queue="gone"} 1"#),
                    "{text}"
                );
                break;
            }
            assert!(
                start.elapsed() < std::time::Duration::from_secs(30),
                "{text}"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Issue 39 item 17: 50 queues record counters, histograms and gauges; 49 are deleted.
    /// `/metrics` no longer names them, the label sets held go down (`delayq_metric_series`),
    /// and the live queue's counter and histogram keep counting (no reset).
    #[test]
    fn a_deleted_queues_counters_and_histograms_leave_metrics_and_memory() {
        let recorder = builder(std::time::Duration::from_secs(3600)).build_recorder();
        let handle = recorder.handle();
        let series = Arc::new(QueueSeries::default());
        let layered = Layered {
            inner: recorder,
            series: series.clone(),
            buckets: HISTOGRAM_BUCKETS,
        };
        let stats = |q: &str| crate::engine::admin::stats::QueueStats {
            queue: q.into(),
            scheduled: 1,
            overdue: 0,
            oldest_overdue_ms: 0,
            next_due_at_ms: None,
            stream_length: 0,
            dead: 0,
            history: 0,
            paused: false,
            groups: Vec::new(),
            priorities: Vec::new(),
        };
        let names: Vec<String> = (0..50).map(|i| format!("q{i}")).collect();
        metrics::with_local_recorder(&layered, || {
            for q in &names {
                record_stats(&stats(q));
                crate::engine::telemetry::dispatched(q, 1);
                let g = crate::engine::telemetry::GroupMetrics::new(q, "close");
                g.handled("success");
            }
        });
        let series_gauge = |text: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix("delayq_metric_series "))
                .and_then(|v| v.parse().ok())
                .unwrap_or(-1.0)
        };
        let all = metrics::with_local_recorder(&layered, || render_with(&handle, &series, None));
        assert!(
            all.contains(r#"delayq_dispatched_total{queue="q7"} 1"#),
            "{all}"
        );
        assert!(
            all.contains(r#"delayq_lateness_seconds_count{queue="q7""#)
                || all.contains("delayq_handled_total{queue=\"q7\""),
            "{all}"
        );
        let before = series_gauge(&all);
        assert!(before >= 100.0, "{before}");
        // q0 lives on; q1..q49 are deleted from the registry.
        let live = Live::of(&[stats("q0")]);
        for _ in 0..2 {
            let text = metrics::with_local_recorder(&layered, || {
                render_with(&handle, &series, Some(&live))
            });
            for q in &names[1..] {
                assert!(
                    !text.contains(&format!("queue=\"{q}\"")),
                    "{q} still named:\n{text}"
                );
            }
        }
        metrics::with_local_recorder(&layered, || {
            crate::engine::telemetry::dispatched("q0", 1);
        });
        let text =
            metrics::with_local_recorder(&layered, || render_with(&handle, &series, Some(&live)));
        let after = series_gauge(&text);
        assert!(after > 0.0 && after * 10.0 < before, "{before} -> {after}");
        // The live queue's counter went on from 1: no reset.
        assert!(
            text.contains(r#"delayq_dispatched_total{queue="q0"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"delayq_handled_total{queue="q0",group="close",outcome="success"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn series_of_deleted_queues_and_groups_are_left_out() {
        let mut live = Live::default();
        live.queues.insert("a".into());
        live.groups.insert(("a".into(), "g".into()));
        assert!(keep_line(r#"delayq_scheduled{queue="a"} 1"#, &live));
        assert!(!keep_line(r#"delayq_scheduled{queue="gone"} 1"#, &live));
        assert!(keep_line(r#"delayq_pending{queue="a",group="g"} 0"#, &live));
        assert!(!keep_line(
            r#"delayq_pending{queue="a",group="old"} 0"#,
            &live
        ));
        assert!(keep_line(r#"delayq_paused{queue="a",group=""} 0"#, &live));
        // Counters keep their history.
        assert!(keep_line(
            r#"delayq_dispatched_total{queue="gone"} 5"#,
            &live
        ));
    }
}
