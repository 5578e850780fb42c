//! Nimbus's Prometheus metrics, registered on the registry the caller passes down.

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// Counters nimbus keeps. Labels are bounded: a status class, an operation name.
#[derive(Debug, Clone)]
pub struct NimbusMetrics {
    /// Znodes skipped because their name or data is not what their place says.
    pub garbage_znodes: IntCounter,
    /// API responses by status class (`2xx`, `4xx`, `5xx`).
    pub http_responses: IntCounterVec,
    /// Lifecycle events applied, by event and result (`ok`, `refused`, `failed`).
    pub transitions: IntCounterVec,
    /// Assignments written (first ones, reassignments and rebalances).
    pub assignments_written: IntCounter,
    /// Executors given a new slot (dead, on a supervisor gone, rebalanced, or new).
    pub executors_reassigned: IntCounter,
    /// `squall_nimbus_node_index_writes_total`: `/node-assignments/<node>` creates, sets and
    /// deletes (the per-node index, written only when a node's set of topologies changes).
    pub node_index_writes: IntCounter,
    /// Topologies by status (`active`, `inactive`, `rebalancing`, `killed`), at the last pass.
    pub topologies: IntGaugeVec,
    /// Live supervisors at the last pass.
    pub supervisors: IntGauge,
    /// Worker slots of live supervisors, by `state` (`used`, `free`), at the last pass.
    pub slots: IntGaugeVec,
    /// Executors without a slot at the last pass (the cluster has too few free slots).
    pub executors_unassigned: IntGauge,
    /// `squall_nimbus_assignment_failures_total{reason}`: assignments a monitor pass did not
    /// write (`too_large`, `conflict`: changed since read, `error`, `over_limit`); the pass went on.
    pub assignment_failures: IntCounterVec,
    /// `squall_nimbus_monitor_pass_duration_seconds`: how long each monitor pass took.
    pub monitor_pass_seconds: Histogram,
    /// `squall_nimbus_supervisor_heartbeats_total`: aggregated supervisor heartbeats recorded.
    pub supervisor_heartbeats: IntCounter,
    /// `squall_nimbus_workers_reported`: workers in the supervisors' latest reports, as of the
    /// last report or monitor pass.
    pub workers_reported: IntGauge,
    /// Znodes read to bring nimbus's watched copy of the cluster up to date (issue 18).
    pub cluster_reads: IntCounter,
}

impl NimbusMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = Self::unregistered()?;
        registry.register(Box::new(metrics.garbage_znodes.clone()))?;
        registry.register(Box::new(metrics.http_responses.clone()))?;
        registry.register(Box::new(metrics.transitions.clone()))?;
        registry.register(Box::new(metrics.assignments_written.clone()))?;
        registry.register(Box::new(metrics.executors_reassigned.clone()))?;
        registry.register(Box::new(metrics.node_index_writes.clone()))?;
        registry.register(Box::new(metrics.topologies.clone()))?;
        registry.register(Box::new(metrics.supervisors.clone()))?;
        registry.register(Box::new(metrics.slots.clone()))?;
        registry.register(Box::new(metrics.executors_unassigned.clone()))?;
        registry.register(Box::new(metrics.assignment_failures.clone()))?;
        registry.register(Box::new(metrics.monitor_pass_seconds.clone()))?;
        registry.register(Box::new(metrics.supervisor_heartbeats.clone()))?;
        registry.register(Box::new(metrics.workers_reported.clone()))?;
        registry.register(Box::new(metrics.cluster_reads.clone()))?;
        Ok(metrics)
    }

    /// Metrics counted but exported nowhere (tests, or a caller without a registry).
    pub fn unregistered() -> prometheus::Result<Self> {
        Ok(NimbusMetrics {
            garbage_znodes: IntCounter::with_opts(Opts::new(
                "squall_nimbus_garbage_znodes_total",
                "Znodes nimbus skipped because their name or data did not decode",
            ))?,
            http_responses: IntCounterVec::new(
                Opts::new("squall_nimbus_http_responses_total", "Nimbus API responses by status class"),
                &["class"],
            )?,
            transitions: IntCounterVec::new(
                Opts::new("squall_nimbus_transitions_total", "Topology lifecycle events applied by nimbus"),
                &["event", "result"],
            )?,
            assignments_written: IntCounter::with_opts(Opts::new(
                "squall_nimbus_assignments_written_total",
                "Assignments nimbus wrote to ZooKeeper",
            ))?,
            executors_reassigned: IntCounter::with_opts(Opts::new(
                "squall_nimbus_executors_reassigned_total",
                "Executors nimbus placed on a new slot",
            ))?,
            node_index_writes: IntCounter::with_opts(Opts::new(
                "squall_nimbus_node_index_writes_total",
                "Per-node assignment index nodes nimbus created, rewrote or deleted",
            ))?,
            topologies: IntGaugeVec::new(
                Opts::new("squall_nimbus_topologies", "Topologies by status at nimbus's last monitor pass"),
                &["status"],
            )?,
            supervisors: IntGauge::with_opts(Opts::new(
                "squall_nimbus_supervisors",
                "Live supervisors at nimbus's last monitor pass",
            ))?,
            slots: IntGaugeVec::new(
                Opts::new("squall_nimbus_slots", "Worker slots of live supervisors by state (used, free)"),
                &["state"],
            )?,
            executors_unassigned: IntGauge::with_opts(Opts::new(
                "squall_nimbus_executors_unassigned",
                "Executors without a slot at nimbus's last monitor pass",
            ))?,
            assignment_failures: IntCounterVec::new(
                Opts::new(
                    "squall_nimbus_assignment_failures_total",
                    "Assignments a monitor pass did not write, by reason (too_large, conflict, error, over_limit)",
                ),
                &["reason"],
            )?,
            monitor_pass_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "squall_nimbus_monitor_pass_duration_seconds",
                    "Duration of nimbus's monitor passes (read, schedule, write what changed)",
                )
                // Fine around the issue-18 goal (p99 <= 1 s), so quantiles read from it are close.
                .buckets(vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6,
                    0.75, 1.0, 1.5, 2.5, 5.0, 10.0,
                ]),
            )?,
            supervisor_heartbeats: IntCounter::with_opts(Opts::new(
                "squall_nimbus_supervisor_heartbeats_total",
                "Aggregated supervisor heartbeats nimbus recorded",
            ))?,
            workers_reported: IntGauge::with_opts(Opts::new(
                "squall_nimbus_workers_reported",
                "Workers in the supervisors' latest heartbeats (updated at every heartbeat and monitor pass)",
            ))?,
            cluster_reads: IntCounter::with_opts(Opts::new(
                "squall_nimbus_cluster_reads_total",
                "Bases, assignments and supervisor nodes nimbus read because they changed (watched copy)",
            ))?,
        })
    }

    /// Counts a response of `status`.
    pub fn response(&self, status: u16) {
        let class = match status {
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        self.http_responses.with_label_values(&[class]).inc();
    }
}
