//! Which worker runs which task: a pure function of the shared task layout
//! ([`cluster_state::layout`], re-exported here) and the assignment.

use std::collections::{BTreeMap, BTreeSet};

use cluster_state::ids::{ExecutorId, TaskId, WorkerSlot};
use cluster_state::znode::Assignment;

pub use cluster_state::layout::{TaskLayout, partition_fixed};

/// Where every task of the topology runs, from one worker's point of view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerPlan {
    /// This worker's slot.
    pub slot: WorkerSlot,
    /// The executors this worker runs.
    pub local_executors: BTreeSet<ExecutorId>,
    /// Tasks of this worker.
    pub local_tasks: BTreeSet<TaskId>,
    /// The slot of every assigned task elsewhere.
    pub remote_tasks: BTreeMap<TaskId, WorkerSlot>,
    /// Host of each peer slot (from `node_host`; the supervisor id when missing).
    pub peers: BTreeMap<WorkerSlot, String>,
}

/// Why an assignment cannot be run by this worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// The assignment has an executor the topology does not (stale code or assignment).
    UnknownExecutor(ExecutorId),
    /// Nothing is assigned to this slot.
    NothingAssigned,
}

/// Splits an assignment into what `slot` runs and where everything else runs.
pub fn plan_worker(
    layout: &TaskLayout,
    assignment: &Assignment,
    slot: &WorkerSlot,
) -> Result<WorkerPlan, PlanError> {
    let mut plan = WorkerPlan {
        slot: slot.clone(),
        local_executors: BTreeSet::new(),
        local_tasks: BTreeSet::new(),
        remote_tasks: BTreeMap::new(),
        peers: BTreeMap::new(),
    };
    for entry in &assignment.executors {
        if !layout.executors.contains_key(&entry.executor) {
            return Err(PlanError::UnknownExecutor(entry.executor));
        }
        let s = entry.slot();
        if &s == slot {
            plan.local_executors.insert(entry.executor);
            plan.local_tasks.extend(entry.executor.tasks());
        } else {
            for t in entry.executor.tasks() {
                plan.remote_tasks.insert(t, s.clone());
            }
            let host = assignment.node_host.get(&s.node).cloned().unwrap_or_else(|| s.node.to_string());
            plan.peers.insert(s, host);
        }
    }
    if plan.local_executors.is_empty() {
        return Err(PlanError::NothingAssigned);
    }
    Ok(plan)
}
