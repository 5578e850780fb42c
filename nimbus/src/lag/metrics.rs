//! The lag report as Prometheus series, under three sets of names: kafka_exporter's
//! (`kafka_consumergroup_*`, `kafka_topic_partition_*`), Burrow's own `/metrics`
//! (`burrow_kafka_*`, status values Burrow's codes) and Squall's (`squall_group_*`).
//!
//! A collector renders the latest report at scrape time, so a group gone from ZooKeeper
//! disappears from the next scrape and a pass never shows half-updated.

use std::sync::{Arc, Mutex, PoisonError};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{GaugeVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use super::window::LagReport;

const CG: &[&str] = &["consumergroup"];
const CG_T: &[&str] = &["consumergroup", "topic"];
const CG_TP: &[&str] = &["consumergroup", "topic", "partition"];
const TP: &[&str] = &["topic", "partition"];
const B_G: &[&str] = &["cluster", "consumer_group"];
const B_GTP: &[&str] = &["cluster", "consumer_group", "topic", "partition"];
const B_TP: &[&str] = &["cluster", "topic", "partition"];
const G: &[&str] = &["group"];
const GTP: &[&str] = &["group", "topic", "partition"];

/// Every family: name, help, labels. The index is the family's place in [`FAMILIES`].
const FAMILIES: &[(&str, &str, &[&str])] = &[
    ("kafka_consumergroup_current_offset", "Current Offset of a ConsumerGroup at Topic/Partition", CG_TP),
    ("kafka_consumergroup_lag", "Current Approximate Lag of a ConsumerGroup at Topic/Partition", CG_TP),
    (
        "kafka_consumergroup_lag_sum",
        "Current Approximate Lag of a ConsumerGroup at Topic for all partitions",
        CG_T,
    ),
    ("kafka_consumergroup_members", "Amount of members in a consumer group", CG),
    ("kafka_topic_partition_current_offset", "Current Offset of a Broker at Topic/Partition", TP),
    ("kafka_topic_partition_oldest_offset", "Oldest Offset of a Broker at Topic/Partition", TP),
    (
        "burrow_kafka_consumer_partition_lag",
        "Number of messages the consumer group is behind by for a partition",
        B_GTP,
    ),
    ("burrow_kafka_consumer_current_offset", "Latest committed offset stored for this partition", B_GTP),
    (
        "burrow_kafka_topic_partition_status",
        "Partition status as Burrow's code: 1 OK, 2 WARN, 3 ERR, 4 STOP, 5 STALL, 6 REWIND",
        B_GTP,
    ),
    ("burrow_kafka_consumer_status", "Group status as Burrow's code: 1 OK, 2 WARN, 3 ERR", B_G),
    ("burrow_kafka_consumer_lag_total", "The sum of all partition current lag values for the group", B_G),
    ("burrow_kafka_topic_partition_offset", "Latest log-end offset of the topic partition", B_TP),
    (
        "squall_group_lag_status",
        "Worst partition lag status of the group (Burrow's codes: 1 OK, 2 WARN, 3 ERR, 4 STOP, 5 STALL, 6 REWIND)",
        G,
    ),
    ("squall_group_partition_lag_status", "Lag status of the group's partition (Burrow's codes)", GTP),
    ("squall_group_lag", "Log end minus the group's committed offset", GTP),
    ("squall_group_committed_offset", "The group's committed offset in ZooKeeper", GTP),
    ("squall_group_log_end_offset", "The partition's log-end offset (high watermark)", GTP),
    ("squall_group_members", "Members registered under /consumers/<group>/ids", G),
    (
        "squall_group_lag_window_complete",
        "Fraction of the group's partitions whose window of commits is full",
        G,
    ),
];

/// The collector of the latest [`LagReport`], plus the evaluator's own health counters.
#[derive(Clone)]
pub struct LagMetrics {
    report: Arc<Mutex<LagReport>>,
    cluster: String,
    descs: Vec<Desc>,
    /// Failures of a pass by source (`zookeeper`, `kafka`, `znode`).
    pub errors: IntCounterVec,
    /// When the last pass finished, in seconds since the epoch.
    pub last_pass: IntGauge,
    /// Passes finished (a pass whose ZooKeeper reads failed does not count).
    pub passes: IntCounter,
}

impl std::fmt::Debug for LagMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LagMetrics").field("cluster", &self.cluster).finish_non_exhaustive()
    }
}

impl LagMetrics {
    /// Registers the collector on `registry`; `cluster` is Burrow's `cluster` label.
    pub fn register(registry: &Registry, cluster: &str) -> prometheus::Result<Self> {
        let mut descs = Vec::new();
        for family in build_families()? {
            descs.extend(family.desc().into_iter().cloned());
        }
        let metrics = LagMetrics {
            report: Arc::default(),
            cluster: cluster.to_owned(),
            descs,
            errors: IntCounterVec::new(
                Opts::new("squall_lag_errors_total", "Lag evaluator read failures by source"),
                &["source"],
            )?,
            last_pass: IntGauge::with_opts(Opts::new(
                "squall_lag_last_pass_timestamp_seconds",
                "When nimbus's lag evaluator last finished a pass",
            ))?,
            passes: IntCounter::with_opts(Opts::new(
                "squall_lag_passes_total",
                "Passes of nimbus's lag evaluator over every consumer group",
            ))?,
        };
        registry.register(Box::new(metrics.clone()))?;
        registry.register(Box::new(metrics.passes.clone()))?;
        registry.register(Box::new(metrics.errors.clone()))?;
        registry.register(Box::new(metrics.last_pass.clone()))?;
        Ok(metrics)
    }

    /// The last pass's report (what the next scrape shows).
    pub fn latest(&self) -> LagReport {
        self.report.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Replaces the report the next scrape shows.
    pub fn publish(&self, report: LagReport) {
        *self.report.lock().unwrap_or_else(PoisonError::into_inner) = report;
    }
}

fn build_families() -> prometheus::Result<Vec<GaugeVec>> {
    FAMILIES.iter().map(|(name, help, labels)| GaugeVec::new(Opts::new(*name, *help), labels)).collect()
}

impl Collector for LagMetrics {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let report = self.report.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let Ok(f) = build_families() else { return Vec::new() };
        let set = |i: usize, labels: &[&str], value: f64| f[i].with_label_values(labels).set(value);
        let c = self.cluster.as_str();
        for g in &report.groups {
            let group = g.group.as_str();
            set(3, &[group], g.members as f64);
            set(9, &[c, group], g.status.code() as f64);
            set(12, &[group], g.worst.code() as f64);
            set(17, &[group], g.members as f64);
            set(18, &[group], f64::from(g.complete));
            let mut total = 0u64;
            for p in &g.partitions {
                let (topic, partition) = (p.topic.as_str(), p.partition.to_string());
                let gtp = [group, topic, partition.as_str()];
                let bgtp = [c, group, topic, partition.as_str()];
                set(13, &gtp, p.status.code() as f64);
                if let Some(committed) = p.committed {
                    set(0, &gtp, committed as f64);
                    set(15, &gtp, committed as f64);
                    if p.complete >= 1.0 {
                        // Burrow shows offset and status only for a full window.
                        set(7, &bgtp, committed as f64);
                        set(8, &bgtp, p.status.code() as f64);
                    }
                }
                if let Some(lag) = p.lag {
                    total += lag;
                    set(1, &gtp, lag as f64);
                    set(6, &bgtp, lag as f64);
                    set(14, &gtp, lag as f64);
                    f[2].with_label_values(&[group, topic]).add(lag as f64);
                }
                if let Some(end) = p.log_end {
                    set(16, &gtp, end as f64);
                }
            }
            set(10, &[c, group], total as f64);
        }
        for t in &report.topics {
            let partition = t.partition.to_string();
            set(4, &[&t.topic, &partition], t.watermarks.log_end as f64);
            set(5, &[&t.topic, &partition], t.watermarks.oldest as f64);
            set(11, &[c, &t.topic, &partition], t.watermarks.log_end as f64);
        }
        f.iter().flat_map(Collector::collect).collect()
    }
}
