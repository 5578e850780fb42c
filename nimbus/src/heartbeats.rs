//! The supervisors' aggregated heartbeats, kept in memory (issue 18; Storm 2's heartbeats over
//! RPC, STORM-2693).
//!
//! Each supervisor sends, every `supervisor.heartbeat.frequency.secs`, one
//! [`SupervisorHeartbeat`] listing every worker it runs (executors, the worker's last local
//! heartbeat time, uptime, stats) to the leader. The store keeps the latest per supervisor,
//! replacing the previous one whole, so a worker the supervisor no longer reports stops being
//! reported (its executors then time out as before). Nothing here is written to ZooKeeper:
//! liveness costs no ZooKeeper write per worker.
//!
//! Nimbus never compares a supervisor's or a worker's clock with its own: the monitor feeds the
//! reported times to [`crate::liveness::HeartbeatCache`], which watches them *change* on
//! nimbus's clock. A new leader starts with an empty store ([`HeartbeatStore::clear`]) and gives
//! everything `nimbus.task.launch.secs` of fresh reports before declaring it dead.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};

use cluster_state::api::{SupervisorHeartbeat, WorkerReport};
use cluster_state::ids::{ExecutorId, SupervisorId, TopologyId, WorkerSlot};
use cluster_state::znode::{ExecutorStats, SupervisorInfo};

use crate::state::WorkerEndpoint;
use crate::stats::{StatsHistory, WorkerStats};

/// What nimbus remembers of one supervisor's latest heartbeat.
#[derive(Debug, Clone)]
struct SupervisorBeat {
    /// The supervisor's clock when it sent the beat.
    time_secs: u64,
    uptime_secs: u64,
    workers: Vec<WorkerReport>,
}

/// The latest aggregated heartbeat of every supervisor; see the module docs. Shared by the API
/// (which records) and the monitor (which reads); the lock is never held across an await.
#[derive(Debug, Default)]
pub struct HeartbeatStore {
    supervisors: Mutex<HashMap<SupervisorId, SupervisorBeat>>,
    /// The executors' counters over the last ten minutes, for the UI's `600` window.
    history: Mutex<StatsHistory>,
}

impl HeartbeatStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SupervisorId, SupervisorBeat>> {
        // A panic elsewhere while holding it cannot leave a half-written map (inserts are whole).
        self.supervisors.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `beat` (validated by the caller), replacing that supervisor's previous one.
    /// Returns how many workers it reported.
    pub fn record(&self, beat: SupervisorHeartbeat) -> usize {
        self.record_at(beat, cluster_state::clock::now_secs())
    }

    /// [`HeartbeatStore::record`] at `now_secs` on nimbus's clock (when the counters were seen).
    pub fn record_at(&self, beat: SupervisorHeartbeat, now_secs: u64) -> usize {
        {
            let mut history = self.history.lock().unwrap_or_else(PoisonError::into_inner);
            for worker in &beat.workers {
                let stats: Vec<ExecutorStats> =
                    worker.executor_stats.iter().map(ExecutorStats::from).collect();
                history.record(&worker.topology_id, &stats, now_secs);
            }
            history.forget_stale(now_secs);
        }
        let workers = beat.workers.len();
        let entry = SupervisorBeat {
            time_secs: beat.time_secs,
            uptime_secs: beat.uptime_secs,
            workers: beat.workers,
        };
        self.lock().insert(beat.supervisor_id, entry);
        workers
    }

    /// Forgets everything (a new leadership term starts from fresh reports).
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Forgets supervisors not in `keep` (gone from ZooKeeper).
    pub fn retain(&self, keep: impl Fn(&SupervisorId) -> bool) {
        self.lock().retain(|id, _| keep(id));
    }

    /// Each reporting supervisor's latest beat time (its clock).
    pub fn supervisor_times(&self) -> BTreeMap<SupervisorId, u64> {
        self.lock().iter().map(|(id, beat)| (id.clone(), beat.time_secs)).collect()
    }

    /// Workers reported, over all supervisors.
    pub fn workers_reported(&self) -> usize {
        self.lock().values().map(|b| b.workers.len()).sum()
    }

    /// For every topology: per slot reported, the worker's beat time and its executors.
    pub fn slot_beats(&self) -> HashMap<TopologyId, HashMap<WorkerSlot, (u64, BTreeSet<ExecutorId>)>> {
        let mut out: HashMap<TopologyId, HashMap<WorkerSlot, (u64, BTreeSet<ExecutorId>)>> = HashMap::new();
        for (supervisor, beat) in self.lock().iter() {
            for worker in &beat.workers {
                let slot = WorkerSlot { node: supervisor.clone(), port: worker.port };
                let executors = worker.executors.iter().copied().collect();
                out.entry(worker.topology_id.clone())
                    .or_default()
                    .insert(slot, (worker.time_secs, executors));
            }
        }
        out
    }

    /// The latest reports of `topology`'s workers, with their executors' counters.
    pub fn topology_workers(&self, topology: &TopologyId) -> Vec<WorkerStats> {
        let mut out = Vec::new();
        for (supervisor, beat) in self.lock().iter() {
            for worker in beat.workers.iter().filter(|w| &w.topology_id == topology) {
                out.push(WorkerStats {
                    slot: WorkerSlot { node: supervisor.clone(), port: worker.port },
                    uptime_secs: worker.uptime_secs,
                    executors: worker.executor_stats.iter().map(ExecutorStats::from).collect(),
                });
            }
        }
        out.sort_by(|a, b| a.slot.cmp(&b.slot));
        out
    }

    /// Where `topology`'s executors' ten-minute window starts (see [`StatsHistory`]).
    pub fn window_starts(
        &self,
        topology: &TopologyId,
        now_secs: u64,
    ) -> HashMap<ExecutorId, (ExecutorStats, u64)> {
        self.history.lock().unwrap_or_else(PoisonError::into_inner).window_starts(topology, now_secs)
    }

    /// The metrics endpoints the reported workers published.
    pub fn worker_endpoints(&self) -> Vec<WorkerEndpoint> {
        let mut out = Vec::new();
        for (supervisor, beat) in self.lock().iter() {
            for worker in &beat.workers {
                if let Some(endpoint) = &worker.metrics_endpoint {
                    out.push(WorkerEndpoint {
                        topology: worker.topology_id.clone(),
                        slot: WorkerSlot { node: supervisor.clone(), port: worker.port },
                        endpoint: endpoint.clone(),
                        scheme: worker.metrics_scheme,
                    });
                }
            }
        }
        out.sort_by(|a, b| (&a.topology, &a.slot).cmp(&(&b.topology, &b.slot)));
        out
    }

    /// The supervisors' infos with the time-varying fields (`time_secs`, `uptime_secs`) taken
    /// from their latest report: the znode is rewritten only when its content changes.
    pub fn refresh_infos(&self, infos: &mut BTreeMap<SupervisorId, SupervisorInfo>) {
        let beats = self.lock();
        for (id, info) in infos.iter_mut() {
            if let Some(beat) = beats.get(id) {
                info.time_secs = info.time_secs.max(beat.time_secs);
                info.uptime_secs = info.uptime_secs.max(beat.uptime_secs);
            }
        }
    }
}

/// Each assigned executor's reported beat time, as its *assigned* slot reports it (a worker
/// still running an executor that moved away does not keep it alive): the monitor's input.
pub fn executor_beats(
    assigned: impl IntoIterator<Item = (ExecutorId, WorkerSlot)>,
    slots: Option<&HashMap<WorkerSlot, (u64, BTreeSet<ExecutorId>)>>,
) -> BTreeMap<ExecutorId, u64> {
    let Some(slots) = slots else { return BTreeMap::new() };
    assigned
        .into_iter()
        .filter_map(|(executor, slot)| {
            let (time, executors) = slots.get(&slot)?;
            executors.contains(&executor).then_some((executor, *time))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cluster_state::ids::TaskId;

    fn ex(t: u32) -> ExecutorId {
        ExecutorId::single(TaskId(t))
    }

    fn beat(sup: &str, time: u64, workers: &[(u16, &[u32])]) -> SupervisorHeartbeat {
        SupervisorHeartbeat {
            supervisor_id: sup.parse().unwrap(),
            time_secs: time,
            uptime_secs: 5,
            workers: workers
                .iter()
                .map(|(port, tasks)| WorkerReport {
                    topology_id: "wc-1-1700000000".parse().unwrap(),
                    port: *port,
                    executors: tasks.iter().map(|t| ex(*t)).collect(),
                    time_secs: time,
                    start_time_secs: 0,
                    uptime_secs: 0,
                    executor_stats: vec![],
                    metrics_endpoint: Some(format!("h:{port}")),
                    metrics_scheme: cluster_state::znode::MetricsScheme::Http,
                })
                .collect(),
        }
    }

    fn slot(sup: &str, port: u16) -> WorkerSlot {
        WorkerSlot { node: sup.parse().unwrap(), port }
    }

    #[test]
    fn only_the_assigned_slot_keeps_an_executor_alive() {
        let store = HeartbeatStore::default();
        assert_eq!(store.record(beat("a", 10, &[(6700, &[1, 2]), (6701, &[3])])), 2);
        store.record(beat("b", 99, &[(6700, &[3])]));
        let topology: TopologyId = "wc-1-1700000000".parse().unwrap();
        let slots = store.slot_beats();
        let assigned = [(ex(1), slot("a", 6700)), (ex(3), slot("b", 6700)), (ex(4), slot("a", 6701))];
        let beats = executor_beats(assigned, slots.get(&topology));
        assert_eq!(beats, BTreeMap::from([(ex(1), 10), (ex(3), 99)]));
        assert_eq!(store.workers_reported(), 3);
        assert_eq!(store.worker_endpoints().len(), 3);
    }

    #[test]
    fn a_new_beat_replaces_the_supervisors_last_and_clear_forgets_all() {
        let store = HeartbeatStore::default();
        store.record(beat("a", 10, &[(6700, &[1]), (6701, &[2])]));
        store.record(beat("a", 15, &[(6700, &[1])]));
        assert_eq!(store.workers_reported(), 1);
        assert_eq!(store.supervisor_times(), BTreeMap::from([("a".parse().unwrap(), 15)]));
        store.retain(|id| id.as_str() != "a");
        assert_eq!(store.workers_reported(), 0);
        store.record(beat("b", 1, &[(6700, &[1])]));
        store.clear();
        assert!(store.supervisor_times().is_empty());
    }
}
