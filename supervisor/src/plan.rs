//! The supervisor's decisions, as pure functions: what this node should run
//! ([`local_assignment`]) and what to do about the workers it runs ([`plan_workers`]).
//!
//! Storm's `sync-processes`, made a function: each running worker is classified from its local
//! heartbeat, every worker that is not valid (and not still starting) is killed, and every
//! assigned port without a valid worker gets a new one. A worker still starting keeps its port,
//! so a slow JVM-sized start is not killed and relaunched in a loop.

use std::collections::{BTreeMap, BTreeSet};

use cluster_state::ids::{ExecutorId, SupervisorId, TopologyId};
use cluster_state::znode::Assignment;

/// What one port of this node should run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalAssignment {
    pub topology_id: TopologyId,
    pub executors: BTreeSet<ExecutorId>,
}

/// Two topologies assigned to one port: nimbus's state is inconsistent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("port {port} of supervisor {supervisor} is assigned to both {first} and {second}")]
pub struct PortConflict {
    pub supervisor: SupervisorId,
    pub port: u16,
    pub first: TopologyId,
    pub second: TopologyId,
}

/// This supervisor's share of all assignments: port -> what runs there.
pub fn local_assignment(
    supervisor: &SupervisorId,
    assignments: &BTreeMap<TopologyId, Assignment>,
) -> Result<BTreeMap<u16, LocalAssignment>, Box<PortConflict>> {
    let mut ports: BTreeMap<u16, LocalAssignment> = BTreeMap::new();
    for (topology_id, assignment) in assignments {
        for entry in assignment.executors.iter().filter(|e| &e.node == supervisor) {
            let local = ports.entry(entry.port).or_insert_with(|| LocalAssignment {
                topology_id: topology_id.clone(),
                executors: BTreeSet::new(),
            });
            if &local.topology_id != topology_id {
                return Err(Box::new(PortConflict {
                    supervisor: supervisor.clone(),
                    port: entry.port,
                    first: local.topology_id.clone(),
                    second: topology_id.clone(),
                }));
            }
            local.executors.insert(entry.executor);
        }
    }
    Ok(ports)
}

/// A worker's local heartbeat, as the supervisor read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalBeat {
    pub topology_id: TopologyId,
    pub executors: BTreeSet<ExecutorId>,
    /// When the worker wrote it (same machine, same clock).
    pub time_secs: u64,
}

/// A worker process this supervisor started (or adopted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningWorker {
    pub worker_id: String,
    pub port: u16,
    pub launched_at_secs: u64,
    /// `None` until the worker wrote its first heartbeat. A read that fails (a torn or
    /// garbled file) gives the last good beat instead, so it times out only as a stale beat
    /// would.
    pub beat: Option<LocalBeat>,
    /// With no good beat ever read: since when its heartbeat file has been unreadable. Such a
    /// worker is given the heartbeat timeout from then before it counts as timed out.
    pub unreadable_since_secs: Option<u64>,
}

/// Storm's worker states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkerState {
    /// Heartbeating in time, running what its port is assigned.
    Valid,
    /// No heartbeat yet, within `supervisor.worker.start.timeout.secs` of its launch.
    NotStarted,
    /// Its heartbeat is older than `supervisor.worker.timeout.secs` (or it never beat in time).
    TimedOut,
    /// It runs something its port is no longer assigned.
    Disallowed,
}

/// The supervisor's timeouts in seconds (Storm's defaults: 30 and 120).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerTimeouts {
    /// `supervisor.worker.timeout.secs`.
    pub heartbeat_secs: u64,
    /// `supervisor.worker.start.timeout.secs`.
    pub start_secs: u64,
}

impl Default for WorkerTimeouts {
    /// Storm's defaults.yaml.
    fn default() -> Self {
        WorkerTimeouts { heartbeat_secs: 30, start_secs: 120 }
    }
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Kill this worker and clean up after it.
    Kill { worker_id: String, port: u16, state: WorkerState },
    /// Start a worker for this port.
    Launch { port: u16, assignment: LocalAssignment },
}

/// Classifies one worker against what its port should run.
pub fn classify(
    worker: &RunningWorker,
    desired: &BTreeMap<u16, LocalAssignment>,
    now_secs: u64,
    timeouts: WorkerTimeouts,
) -> WorkerState {
    let Some(wanted) = desired.get(&worker.port) else { return WorkerState::Disallowed };
    match &worker.beat {
        Some(beat) if beat.topology_id != wanted.topology_id || beat.executors != wanted.executors => {
            WorkerState::Disallowed
        }
        Some(beat) if now_secs.saturating_sub(beat.time_secs) > timeouts.heartbeat_secs => {
            WorkerState::TimedOut
        }
        Some(_) => WorkerState::Valid,
        None if now_secs.saturating_sub(worker.launched_at_secs) <= timeouts.start_secs => {
            WorkerState::NotStarted
        }
        None if worker
            .unreadable_since_secs
            .is_some_and(|since| now_secs.saturating_sub(since) <= timeouts.heartbeat_secs) =>
        {
            WorkerState::NotStarted
        }
        None => WorkerState::TimedOut,
    }
}

/// Kills first (so ports are free), then launches, both in port order.
pub fn plan_workers(
    desired: &BTreeMap<u16, LocalAssignment>,
    running: &[RunningWorker],
    now_secs: u64,
    timeouts: WorkerTimeouts,
) -> Vec<Action> {
    let mut kills = Vec::new();
    let mut occupied = BTreeSet::new();
    for worker in running {
        match classify(worker, desired, now_secs, timeouts) {
            WorkerState::Valid | WorkerState::NotStarted => {
                occupied.insert(worker.port);
            }
            state => {
                kills.push(Action::Kill { worker_id: worker.worker_id.clone(), port: worker.port, state })
            }
        }
    }
    kills.sort_by_key(|action| match action {
        Action::Kill { port, .. } | Action::Launch { port, .. } => *port,
    });
    let launches = desired
        .iter()
        .filter(|(port, _)| !occupied.contains(port))
        .map(|(&port, assignment)| Action::Launch { port, assignment: assignment.clone() });
    kills.into_iter().chain(launches).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cluster_state::ids::TaskId;
    use cluster_state::znode::ExecutorAssignment;

    const T: WorkerTimeouts = WorkerTimeouts { heartbeat_secs: 30, start_secs: 120 };
    const NOW: u64 = 10_000;

    fn topo(id: &str) -> TopologyId {
        id.parse().unwrap()
    }

    fn sup(id: &str) -> SupervisorId {
        SupervisorId::new(id).unwrap()
    }

    fn executors(tasks: &[u32]) -> BTreeSet<ExecutorId> {
        tasks.iter().map(|&t| ExecutorId::single(TaskId(t))).collect()
    }

    fn assignment(entries: &[(&str, u16, u32)]) -> Assignment {
        Assignment {
            master_code_dir: "/code".into(),
            node_host: BTreeMap::new(),
            executors: entries
                .iter()
                .map(|&(node, port, task)| ExecutorAssignment {
                    executor: ExecutorId::single(TaskId(task)),
                    node: sup(node),
                    port,
                    start_time_secs: 1,
                })
                .collect(),
        }
    }

    fn wanted(topology: &str, tasks: &[u32]) -> LocalAssignment {
        LocalAssignment { topology_id: topo(topology), executors: executors(tasks) }
    }

    fn worker(id: &str, port: u16, launched: u64, beat: Option<(&str, &[u32], u64)>) -> RunningWorker {
        RunningWorker {
            worker_id: id.into(),
            port,
            launched_at_secs: launched,
            beat: beat.map(|(t, tasks, time)| LocalBeat {
                topology_id: topo(t),
                executors: executors(tasks),
                time_secs: time,
            }),
            unreadable_since_secs: None,
        }
    }

    #[test]
    fn local_assignment_picks_this_nodes_ports() {
        let all: BTreeMap<_, _> = [
            (topo("wc-1-100"), assignment(&[("a", 6700, 1), ("b", 6700, 2), ("a", 6700, 3)])),
            (topo("log-2-200"), assignment(&[("a", 6701, 1), ("b", 6701, 2)])),
        ]
        .into_iter()
        .collect();
        let local = local_assignment(&sup("a"), &all).unwrap();
        assert_eq!(local.len(), 2);
        assert_eq!(local[&6700], wanted("wc-1-100", &[1, 3]));
        assert_eq!(local[&6701], wanted("log-2-200", &[1]));
        assert!(local_assignment(&sup("c"), &all).unwrap().is_empty());
    }

    #[test]
    fn two_topologies_on_one_port_is_an_error_naming_both() {
        let all: BTreeMap<_, _> = [
            (topo("wc-1-100"), assignment(&[("a", 6700, 1)])),
            (topo("log-2-200"), assignment(&[("a", 6700, 1)])),
        ]
        .into_iter()
        .collect();
        let err = local_assignment(&sup("a"), &all).unwrap_err();
        assert_eq!(err.port, 6700);
        assert!(err.to_string().contains("log-2-200") && err.to_string().contains("wc-1-100"), "{err}");
    }

    #[test]
    fn workers_are_classified_as_storm_does() {
        let desired: BTreeMap<_, _> = [(6700, wanted("wc-1-100", &[1, 2]))].into_iter().collect();
        let table = [
            (worker("w", 6700, 0, Some(("wc-1-100", &[1, 2], NOW - 5))), WorkerState::Valid),
            (worker("w", 6700, 0, Some(("wc-1-100", &[1, 2], NOW - 30))), WorkerState::Valid),
            (worker("w", 6700, 0, Some(("wc-1-100", &[1, 2], NOW - 31))), WorkerState::TimedOut),
            (worker("w", 6700, 0, Some(("wc-1-100", &[1], NOW))), WorkerState::Disallowed),
            (worker("w", 6700, 0, Some(("log-2-200", &[1, 2], NOW))), WorkerState::Disallowed),
            (worker("w", 6701, 0, Some(("wc-1-100", &[1, 2], NOW))), WorkerState::Disallowed),
            (worker("w", 6700, NOW - 120, None), WorkerState::NotStarted),
            (worker("w", 6700, NOW - 121, None), WorkerState::TimedOut),
            // Only unreadable beats so far: the heartbeat timeout runs from the first bad read.
            (
                RunningWorker { unreadable_since_secs: Some(NOW - 30), ..worker("w", 6700, NOW - 500, None) },
                WorkerState::NotStarted,
            ),
            (
                RunningWorker { unreadable_since_secs: Some(NOW - 31), ..worker("w", 6700, NOW - 500, None) },
                WorkerState::TimedOut,
            ),
        ];
        for (w, expected) in table {
            assert_eq!(classify(&w, &desired, NOW, T), expected, "{w:?}");
        }
    }

    #[test]
    fn plan_kills_invalid_workers_then_fills_empty_ports() {
        let desired: BTreeMap<_, _> = [
            (6700, wanted("wc-1-100", &[1])),
            (6701, wanted("wc-1-100", &[2])),
            (6702, wanted("wc-1-100", &[3])),
        ]
        .into_iter()
        .collect();
        let running = [
            worker("ok", 6700, 0, Some(("wc-1-100", &[1], NOW))),
            worker("stale", 6701, 0, Some(("wc-1-100", &[2], NOW - 100))),
            worker("starting", 6702, NOW - 3, None),
            worker("orphan", 6703, 0, Some(("old-1-1", &[9], NOW))),
        ];
        let actions = plan_workers(&desired, &running, NOW, T);
        assert_eq!(
            actions,
            [
                Action::Kill { worker_id: "stale".into(), port: 6701, state: WorkerState::TimedOut },
                Action::Kill { worker_id: "orphan".into(), port: 6703, state: WorkerState::Disallowed },
                Action::Launch { port: 6701, assignment: wanted("wc-1-100", &[2]) },
            ]
        );
        // Once everything runs, nothing to do.
        let settled = [
            worker("ok", 6700, 0, Some(("wc-1-100", &[1], NOW))),
            worker("new", 6701, NOW, Some(("wc-1-100", &[2], NOW))),
            worker("starting", 6702, NOW - 3, None),
        ];
        assert_eq!(plan_workers(&desired, &settled, NOW, T), []);
    }
}
