//! The worker's Prometheus metrics, per executor: a collector that reads the executors'
//! statistics when scraped (nothing extra on the tuple path beyond the counters the executors
//! keep anyway).
//!
//! Families (labels `topology`, `component`, `task`: the executor's first task):
//! `squall_executor_{emitted,transferred,acked,failed}_total`, `squall_executor_pending`
//! (spouts), `squall_executor_queue_depth` / `_capacity` (inbound queue, in batches),
//! `squall_executor_backpressure_seconds_total`, and the histograms
//! `squall_executor_execute_latency_seconds` (bolts, sampled 1 in 20) and
//! `squall_executor_complete_latency_seconds` (spouts); and `squall_component_count_total`
//! (labels plus `name`): what a component counts itself (the multilang `metrics` command,
//! [`crate::BoltCollector::count`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};

use crate::collector::Batch;
use crate::stats::{ExecStats, LATENCY_BUCKETS};

/// One executor, as the collector sees it.
#[derive(Debug, Clone)]
pub struct ExecutorSource {
    pub component: String,
    pub task: u32,
    pub is_spout: bool,
    pub stats: Arc<ExecStats>,
    /// Its inbound queue (for depth and capacity).
    pub(crate) inbox: Option<crate::queue::QueueSender<Batch>>,
}

/// The collector; register it once, then [`ExecutorMetrics::set_sources`] whenever the
/// worker's executors change.
#[derive(Debug, Clone)]
pub struct ExecutorMetrics {
    topology: String,
    sources: Arc<Mutex<Vec<ExecutorSource>>>,
    descs: Vec<Desc>,
}

const FAMILIES: [(&str, &str, MetricType); 11] = [
    ("squall_executor_emitted_total", "Tuples emitted by the executor", MetricType::COUNTER),
    ("squall_executor_transferred_total", "Tuples the executor sent to other tasks", MetricType::COUNTER),
    ("squall_executor_acked_total", "Tuples acked by the executor", MetricType::COUNTER),
    ("squall_executor_failed_total", "Tuples failed by the executor", MetricType::COUNTER),
    ("squall_executor_pending", "Spout tuples emitted and not yet acked or failed", MetricType::GAUGE),
    ("squall_executor_queue_depth", "Batches waiting in the executor's inbound queue", MetricType::GAUGE),
    (
        "squall_executor_queue_capacity",
        "Batches the executor's inbound queue holds (bolts)",
        MetricType::GAUGE,
    ),
    (
        "squall_executor_backpressure_seconds_total",
        "Time the executor's emits waited for a full downstream queue",
        MetricType::COUNTER,
    ),
    (
        "squall_executor_execute_latency_seconds",
        "Time a bolt spends in execute (sampled, 1 tuple in 20)",
        MetricType::HISTOGRAM,
    ),
    (
        "squall_executor_complete_latency_seconds",
        "Time from a spout's emit to the full ack of the tuple tree",
        MetricType::HISTOGRAM,
    ),
    (
        "squall_component_count_total",
        "What a component counts itself, by name (Storm's CountShellMetric; the multilang metrics command)",
        MetricType::COUNTER,
    ),
];

/// The index in [`FAMILIES`] of the one family with the extra `name` label.
const COUNTS: usize = 10;

const LABELS: [&str; 3] = ["topology", "component", "task"];

impl ExecutorMetrics {
    /// The collector for topology `topology` (no executors yet).
    pub fn new(topology: &str) -> prometheus::Result<Self> {
        let descs = FAMILIES
            .iter()
            .enumerate()
            .map(|(i, (name, help, _))| {
                let mut labels: Vec<String> = LABELS.iter().map(|l| (*l).to_owned()).collect();
                if i == COUNTS {
                    labels.push("name".to_owned());
                }
                Desc::new((*name).to_owned(), (*help).to_owned(), labels, HashMap::new())
            })
            .collect::<prometheus::Result<Vec<_>>>()?;
        Ok(ExecutorMetrics {
            topology: topology.to_owned(),
            sources: Arc::new(Mutex::new(Vec::new())),
            descs,
        })
    }

    /// Replaces the executors reported.
    pub fn set_sources(&self, sources: Vec<ExecutorSource>) {
        *self.sources.lock().unwrap_or_else(PoisonError::into_inner) = sources;
    }

    fn labels(&self, s: &ExecutorSource) -> Vec<proto::LabelPair> {
        let values = [self.topology.clone(), s.component.clone(), s.task.to_string()];
        LABELS
            .iter()
            .zip(values)
            .map(|(name, value)| {
                let mut pair = proto::LabelPair::default();
                pair.set_name((*name).to_owned());
                pair.set_value(value);
                pair
            })
            .collect()
    }
}

fn scalar(labels: Vec<proto::LabelPair>, kind: MetricType, value: f64) -> proto::Metric {
    let mut m = proto::Metric::from_label(labels);
    if kind == MetricType::COUNTER {
        let mut c = proto::Counter::default();
        c.set_value(value);
        m.set_counter(c);
    } else {
        let mut g = proto::Gauge::default();
        g.set_value(value);
        m.set_gauge(g);
    }
    m
}

fn histogram(labels: Vec<proto::LabelPair>, (cumulative, count, sum): (Vec<u64>, u64, f64)) -> proto::Metric {
    let mut h = proto::Histogram::default();
    h.set_sample_count(count);
    h.set_sample_sum(sum);
    h.set_bucket(
        LATENCY_BUCKETS
            .iter()
            .zip(cumulative)
            .map(|(bound, n)| {
                let mut b = proto::Bucket::default();
                b.set_upper_bound(*bound);
                b.set_cumulative_count(n);
                b
            })
            .collect(),
    );
    let mut m = proto::Metric::from_label(labels);
    m.set_histogram(h);
    m
}

impl Collector for ExecutorMetrics {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let sources = self.sources.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let mut families: Vec<Vec<proto::Metric>> = vec![Vec::new(); FAMILIES.len()];
        for s in &sources {
            let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as f64;
            let counts = [
                load(&s.stats.emitted),
                load(&s.stats.transferred),
                load(&s.stats.acked),
                load(&s.stats.failed),
            ];
            for (i, value) in counts.into_iter().enumerate() {
                families[i].push(scalar(self.labels(s), FAMILIES[i].2, value));
            }
            if s.is_spout {
                families[4].push(scalar(self.labels(s), MetricType::GAUGE, load(&s.stats.pending)));
                families[9].push(histogram(self.labels(s), s.stats.complete_histogram()));
            } else {
                families[8].push(histogram(self.labels(s), s.stats.execute_histogram()));
            }
            if let Some(inbox) = &s.inbox {
                families[5].push(scalar(self.labels(s), MetricType::GAUGE, inbox.len() as f64));
                if let Some(capacity) = inbox.capacity() {
                    families[6].push(scalar(self.labels(s), MetricType::GAUGE, capacity as f64));
                }
            }
            let backpressure = s.stats.backpressure_ns.load(Ordering::Relaxed) as f64 / 1e9;
            families[7].push(scalar(self.labels(s), MetricType::COUNTER, backpressure));
            for (name, value) in s.stats.counts() {
                let mut labels = self.labels(s);
                let mut pair = proto::LabelPair::default();
                pair.set_name("name".to_owned());
                pair.set_value(name);
                labels.push(pair);
                families[COUNTS].push(scalar(labels, MetricType::COUNTER, value as f64));
            }
        }
        FAMILIES
            .iter()
            .zip(families)
            .filter(|(_, metrics)| !metrics.is_empty())
            .map(|((name, help, kind), metrics)| {
                let mut family = MetricFamily::default();
                family.set_name((*name).to_owned());
                family.set_help((*help).to_owned());
                family.set_field_type(*kind);
                family.set_metric(metrics);
                family
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::stats::{CountError, MAX_COMPONENT_METRICS};
    use cluster_state::ids::{ExecutorId, TaskId};

    #[test]
    fn a_components_counts_are_a_counter_family_with_a_name_label_and_bounded() {
        let stats = Arc::new(ExecStats::new(ExecutorId::new(TaskId(3), TaskId(3)).unwrap()));
        stats.count("words", 5).unwrap();
        stats.count("words", 2).unwrap();
        stats.count("sentences", 1).unwrap();
        assert_eq!(stats.count("bad name", 1), Err(CountError::BadName("bad name".into())));
        assert_eq!(stats.count("", 1), Err(CountError::BadName(String::new())));
        let metrics = ExecutorMetrics::new("t").unwrap();
        let source = ExecutorSource {
            component: "split".into(),
            task: 3,
            is_spout: false,
            stats: stats.clone(),
            inbox: None,
        };
        metrics.set_sources(vec![source]);
        let registry = prometheus::Registry::new();
        registry.register(Box::new(metrics)).unwrap();
        let families = registry.gather();
        let family = families.iter().find(|f| f.name() == "squall_component_count_total").unwrap();
        let seen: Vec<(String, f64)> = family
            .get_metric()
            .iter()
            .map(|m| {
                let name = m.get_label().iter().find(|l| l.name() == "name").unwrap().value().to_owned();
                (name, m.get_counter().get_value())
            })
            .collect();
        assert_eq!(seen, vec![("sentences".to_owned(), 1.0), ("words".to_owned(), 7.0)]);
        for i in 2..MAX_COMPONENT_METRICS {
            stats.count(&format!("m{i}"), 1).unwrap();
        }
        assert_eq!(stats.count("one-too-many", 1), Err(CountError::TooMany("one-too-many".into())));
        stats.count("words", 1).unwrap();
    }
}
