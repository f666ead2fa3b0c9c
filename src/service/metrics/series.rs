//! Per-queue counters and histograms in a registry delayq owns, so a deleted queue's series
//! can go (the Prometheus exporter cannot delete a series, and forgetting idle ones would
//! reset a live queue's counters after each quiet spell).
//!
//! [`Layered`] is the recorder the service installs: a counter or a histogram whose key has a
//! `queue` label is kept here (a histogram when its buckets are configured, which every
//! per-queue one is); everything else, gauges included, goes to the Prometheus recorder.
//! [`QueueSeries::render`] writes these series in the Prometheus text format after the
//! exporter's. A queue the registry no longer lists in two refreshes in a row has its series
//! dropped ([`QueueSeries::retain`]); until then they are only left out of the text. A
//! handle still held for a dropped series (a worker that has not stopped yet) keeps counting
//! into nothing rendered, and frees it when dropped.

use metrics::{Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder};
use metrics::{SharedString, Unit};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One histogram's buckets (upper bounds, seconds), counts per bucket, sum and count.
#[derive(Debug)]
pub(crate) struct Hist {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_bits: AtomicU64,
    count: AtomicU64,
}

impl Hist {
    fn new(bounds: &'static [f64]) -> Self {
        Hist {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_bits: AtomicU64::new(0f64.to_bits()),
            count: AtomicU64::new(0),
        }
    }
}

impl HistogramFn for Hist {
    fn record(&self, value: f64) {
        if let Some(i) = self.bounds.iter().position(|b| value <= *b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        let _ = self
            .sum_bits
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
        self.count.fetch_add(1, Ordering::Relaxed);
    }
}

/// The per-queue series this process holds.
#[derive(Debug, Default)]
pub struct QueueSeries {
    counters: Mutex<HashMap<Key, Arc<AtomicU64>>>,
    histograms: Mutex<HashMap<Key, Arc<Hist>>>,
    /// Queues missing from the last refresh's listing (dropped when missing again).
    missing: Mutex<HashSet<String>>,
}

fn queue_of(key: &Key) -> Option<&str> {
    key.labels().find(|l| l.key() == "queue").map(|l| l.value())
}

impl QueueSeries {
    /// Label sets held (counters and histograms): the `delayq_metric_series` gauge.
    pub fn len(&self) -> usize {
        lock(&self.counters).len() + lock(&self.histograms).len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps the series of `live` queues; those of a queue missing from this listing and
    /// the previous one are dropped.
    pub fn retain(&self, live: &HashSet<String>) {
        let mut present: HashSet<String> = HashSet::new();
        for k in lock(&self.counters).keys() {
            present.extend(queue_of(k).map(str::to_owned));
        }
        for k in lock(&self.histograms).keys() {
            present.extend(queue_of(k).map(str::to_owned));
        }
        let now_missing: HashSet<String> = present.difference(live).cloned().collect();
        let gone: HashSet<String> = {
            let mut missing = lock(&self.missing);
            let gone = missing.intersection(&now_missing).cloned().collect();
            *missing = now_missing;
            gone
        };
        if gone.is_empty() {
            return;
        }
        let keep = |k: &Key| queue_of(k).is_none_or(|q| !gone.contains(q));
        lock(&self.counters).retain(|k, _| keep(k));
        lock(&self.histograms).retain(|k, _| keep(k));
    }

    /// The Prometheus text of the series of queues `live` lists (all, without a listing).
    pub fn render(&self, live: Option<&HashSet<String>>) -> String {
        let shown = |k: &Key| live.is_none_or(|l| queue_of(k).is_some_and(|q| l.contains(q)));
        let mut families: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (k, v) in lock(&self.counters).iter().filter(|(k, _)| shown(k)) {
            families
                .entry(k.name().to_owned())
                .or_default()
                .push(format!(
                    "{}{} {}",
                    k.name(),
                    labels(k),
                    v.load(Ordering::Relaxed)
                ));
        }
        let mut out = String::new();
        for (name, mut lines) in families {
            lines.sort();
            let _ = writeln!(out, "# TYPE {name} counter");
            for l in lines {
                out.push_str(&l);
                out.push('\n');
            }
        }
        let mut hists: BTreeMap<String, Vec<(String, Arc<Hist>)>> = BTreeMap::new();
        for (k, h) in lock(&self.histograms).iter().filter(|(k, _)| shown(k)) {
            hists
                .entry(k.name().to_owned())
                .or_default()
                .push((labels(k), h.clone()));
        }
        for (name, mut series) in hists {
            series.sort_by(|a, b| a.0.cmp(&b.0));
            let _ = writeln!(out, "# TYPE {name} histogram");
            for (lab, h) in series {
                let inner = lab.trim_start_matches('{').trim_end_matches('}');
                let sep = if inner.is_empty() { "" } else { "," };
                let mut cum = 0;
                for (b, c) in h.bounds.iter().zip(&h.counts) {
                    cum += c.load(Ordering::Relaxed);
                    let _ = writeln!(out, "{name}_bucket{{{inner}{sep}le=\"{b}\"}} {cum}");
                }
                let count = h.count.load(Ordering::Relaxed);
                let _ = writeln!(out, "{name}_bucket{{{inner}{sep}le=\"+Inf\"}} {count}");
                let sum = f64::from_bits(h.sum_bits.load(Ordering::Acquire));
                let _ = writeln!(out, "{name}_sum{lab} {sum}");
                let _ = writeln!(out, "{name}_count{lab} {count}");
            }
        }
        out
    }

    fn counter(&self, key: &Key) -> Counter {
        let c = lock(&self.counters)
            .entry(key.clone())
            .or_insert_with(|| Arc::new(AtomicU64::new(0)))
            .clone();
        Counter::from_arc(c)
    }

    fn histogram(&self, key: &Key, bounds: &'static [f64]) -> Histogram {
        let h = lock(&self.histograms)
            .entry(key.clone())
            .or_insert_with(|| Arc::new(Hist::new(bounds)))
            .clone();
        Histogram::from_arc(h)
    }
}

/// `{k="v",...}` of `key`'s labels, escaped (empty without labels).
fn labels(key: &Key) -> String {
    let parts: Vec<String> = key
        .labels()
        .map(|l| format!("{}=\"{}\"", l.key(), escape(l.value())))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The recorder: per-queue counters and histograms into [`QueueSeries`], the rest into the
/// Prometheus recorder `R`.
#[derive(Debug)]
pub struct Layered<R> {
    /// The Prometheus recorder.
    pub inner: R,
    /// The per-queue series.
    pub series: Arc<QueueSeries>,
    /// The buckets of each histogram by name.
    pub buckets: &'static [(&'static str, &'static [f64])],
}

impl<R: Recorder> Recorder for Layered<R> {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        if queue_of(key).is_some() {
            return self.series.counter(key);
        }
        self.inner.register_counter(key, metadata)
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.inner.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        let bounds = self
            .buckets
            .iter()
            .find(|(n, _)| *n == key.name())
            .map(|(_, b)| *b);
        match (queue_of(key), bounds) {
            (Some(_), Some(b)) => self.series.histogram(key, b),
            _ => self.inner.register_histogram(key, metadata),
        }
    }
}
