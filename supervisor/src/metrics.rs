//! The supervisor's Prometheus metrics, on the registry its caller passes down.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::plan::WorkerState;
use crate::process_task::Done;

/// What a supervisor counts.
#[derive(Debug, Clone)]
pub struct SupervisorMetrics {
    /// Workers this supervisor runs (launched or adopted, not yet killed).
    pub workers_running: IntGauge,
    /// Worker launches, by `reason`: `assigned` (a port got work) or `restart` (replacing a
    /// worker that died, timed out or ran the wrong executors).
    pub worker_launches: IntCounterVec,
    /// Workers killed, by the state that condemned them (`timed_out`, `disallowed`, ...).
    pub worker_kills: IntCounterVec,
    /// Slots by `state` (`used`, `free`).
    pub slots: IntGaugeVec,
    /// Attempts to bring a topology's code here (download, or re-download of a local copy that
    /// no longer matches its checksum) that failed.
    pub code_failures: IntCounter,
    /// Transactions (`multi`s) writing the workers' `/storm/workerbeats` nodes, those the
    /// server refused for one node included (`S / Z` a second in a steady cluster).
    pub workerbeat_transactions: IntCounter,
    /// Workerbeat node writes left out of a transaction, by `reason`: `topology_gone` (its
    /// `/workerbeats/<id>` was removed: killed) or `refused` (any other error, logged).
    pub workerbeat_skipped: IntCounterVec,
}

impl SupervisorMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = SupervisorMetrics {
            workers_running: IntGauge::with_opts(Opts::new(
                "squall_supervisor_workers_running",
                "Worker processes this supervisor runs",
            ))?,
            worker_launches: IntCounterVec::new(
                Opts::new(
                    "squall_supervisor_worker_launches_total",
                    "Workers launched, by reason (assigned, restart)",
                ),
                &["reason"],
            )?,
            worker_kills: IntCounterVec::new(
                Opts::new(
                    "squall_supervisor_worker_kills_total",
                    "Workers killed, by the state that condemned them",
                ),
                &["state"],
            )?,
            slots: IntGaugeVec::new(
                Opts::new("squall_supervisor_slots", "Worker slots of this supervisor by state (used, free)"),
                &["state"],
            )?,
            code_failures: IntCounter::with_opts(Opts::new(
                "squall_supervisor_code_download_failures_total",
                "Failed attempts to download (or re-download) a topology's code from nimbus",
            ))?,
            workerbeat_transactions: IntCounter::with_opts(Opts::new(
                "squall_supervisor_workerbeat_transactions_total",
                "ZooKeeper transactions writing this supervisor's workers' workerbeat nodes",
            ))?,
            workerbeat_skipped: IntCounterVec::new(
                Opts::new(
                    "squall_supervisor_workerbeat_skipped_total",
                    "Workerbeat node writes left out of a transaction, by reason (topology_gone, refused)",
                ),
                &["reason"],
            )?,
        };
        registry.register(Box::new(metrics.workers_running.clone()))?;
        registry.register(Box::new(metrics.worker_launches.clone()))?;
        registry.register(Box::new(metrics.worker_kills.clone()))?;
        registry.register(Box::new(metrics.slots.clone()))?;
        registry.register(Box::new(metrics.code_failures.clone()))?;
        registry.register(Box::new(metrics.workerbeat_transactions.clone()))?;
        registry.register(Box::new(metrics.workerbeat_skipped.clone()))?;
        // Every label value exists from the start, so rates and sums see zeros, not gaps.
        for reason in ["assigned", "restart"] {
            metrics.worker_launches.with_label_values(&[reason]);
        }
        for reason in ["topology_gone", "refused"] {
            metrics.workerbeat_skipped.with_label_values(&[reason]);
        }
        Ok(metrics)
    }

    /// Counts one round's actions: a launch on a port whose worker was just killed for dying
    /// or timing out is a restart.
    pub fn count(&self, done: &[Done]) {
        let mut replaced = std::collections::BTreeSet::new();
        for action in done {
            if let Done::Killed { port, state, .. } = action {
                self.worker_kills.with_label_values(&[state_label(*state)]).inc();
                if matches!(state, WorkerState::TimedOut | WorkerState::NotStarted) {
                    replaced.insert(*port);
                }
            }
        }
        for action in done {
            if let Done::Launched { port, .. } = action {
                let reason = if replaced.contains(port) { "restart" } else { "assigned" };
                self.worker_launches.with_label_values(&[reason]).inc();
            }
        }
    }

    /// Sets the gauges from the ports in use and offered.
    pub fn set_slots(&self, used: usize, offered: usize) {
        self.workers_running.set(used as i64);
        self.slots.with_label_values(&["used"]).set(used as i64);
        self.slots.with_label_values(&["free"]).set(offered.saturating_sub(used) as i64);
    }
}

fn state_label(state: WorkerState) -> &'static str {
    match state {
        WorkerState::Valid => "valid",
        WorkerState::NotStarted => "not_started",
        WorkerState::TimedOut => "timed_out",
        WorkerState::Disallowed => "disallowed",
    }
}
