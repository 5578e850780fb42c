//! Prometheus metrics of the members in a process, registered on the caller's registry.
//! Labels are bounded: group, topic, partition.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use cluster_state::coord::SessionState;

/// Metric families shared by every member of the process; clone it into each member.
#[derive(Debug, Clone)]
pub struct RegistryMetrics {
    pub(crate) rebalances: IntCounterVec,
    pub(crate) rebalance_duration: HistogramVec,
    pub(crate) owner_conflicts: IntCounterVec,
    pub(crate) owned_partitions: IntGaugeVec,
    pub(crate) orphaned_partitions: IntCounterVec,
    pub(crate) session_state: IntGaugeVec,
    pub(crate) offset_errors: IntCounterVec,
    pub(crate) offset_commits: IntCounterVec,
    pub(crate) zk_ops: IntCounterVec,
}

impl RegistryMetrics {
    /// Creates the families and registers them on `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = RegistryMetrics {
            rebalances: IntCounterVec::new(
                Opts::new("squall_consumer_rebalances_total", "Rebalances that changed a member's ownership"),
                &["group"],
            )?,
            rebalance_duration: HistogramVec::new(
                HistogramOpts::new(
                    "squall_consumer_rebalance_duration_seconds",
                    "Time from the first change seen to the member holding its whole share",
                )
                .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
                &["group"],
            )?,
            owner_conflicts: IntCounterVec::new(
                Opts::new(
                    "squall_consumer_owner_conflicts_total",
                    "Claims that found the owner node held by another",
                ),
                &["group", "topic"],
            )?,
            owned_partitions: IntGaugeVec::new(
                Opts::new("squall_consumer_owned_partitions", "Partitions owned by this process's members"),
                &["group", "topic"],
            )?,
            orphaned_partitions: IntCounterVec::new(
                Opts::new(
                    "squall_consumer_orphaned_partitions_total",
                    "Partitions a periodic reconcile found without an owner node",
                ),
                &["group", "topic"],
            )?,
            session_state: IntGaugeVec::new(
                Opts::new(
                    "squall_consumer_sessions_connected",
                    "Members of this process whose ZooKeeper session is connected",
                ),
                &["group"],
            )?,
            offset_errors: IntCounterVec::new(
                Opts::new(
                    "squall_consumer_offset_errors_total",
                    "Committed offsets that were not decimal numbers",
                ),
                &["group", "topic", "partition"],
            )?,
            offset_commits: IntCounterVec::new(
                Opts::new(
                    "squall_consumer_offset_commits_total",
                    "Offsets written (unchanged ones are skipped)",
                ),
                &["group", "topic"],
            )?,
            zk_ops: IntCounterVec::new(
                Opts::new("squall_consumer_zookeeper_operations_total", "ZooKeeper requests made by members"),
                &["group"],
            )?,
        };
        registry.register(Box::new(metrics.rebalances.clone()))?;
        registry.register(Box::new(metrics.rebalance_duration.clone()))?;
        registry.register(Box::new(metrics.owner_conflicts.clone()))?;
        registry.register(Box::new(metrics.owned_partitions.clone()))?;
        registry.register(Box::new(metrics.orphaned_partitions.clone()))?;
        registry.register(Box::new(metrics.session_state.clone()))?;
        registry.register(Box::new(metrics.offset_errors.clone()))?;
        registry.register(Box::new(metrics.offset_commits.clone()))?;
        registry.register(Box::new(metrics.zk_ops.clone()))?;
        Ok(metrics)
    }

    /// ZooKeeper requests made by members of `group` so far.
    pub fn zookeeper_operations(&self, group: &str) -> u64 {
        self.zk_ops.with_label_values(&[group]).get()
    }

    /// Moves the connected-sessions gauge when a member's session goes from `was` to `now`.
    pub(crate) fn session_changed(&self, group: &str, was: SessionState, now: SessionState) {
        let connected = |s| i64::from(s == SessionState::Connected);
        let delta = connected(now) - connected(was);
        if delta != 0 {
            self.session_state.with_label_values(&[group]).add(delta);
        }
    }
}
