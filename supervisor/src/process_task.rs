//! The supervisor's process task: make the workers running on this machine match the local
//! assignment (Storm's `sync-processes`).
//!
//! Each [`ProcessTask::reconcile`] reads every known worker's local heartbeat file, asks
//! [`crate::plan::plan_workers`] what to do, and does it through the [`Launcher`]: kills first
//! (TERM, then KILL after `supervisor.worker.shutdown.sleep.secs`), then launches. What it
//! started is recorded in the durable [`LocalState`], so a restarted supervisor adopts its
//! workers (by pid and worker id) instead of starting a second set on the same ports.
//!
//! A corrupt state file is logged, removed and rebuilt empty; the supervisor keeps running.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cluster_state::ids::{SupervisorId, TopologyId, WorkerId};
use cluster_state::znode::{LocalWorkerHeartbeat, ZnodeData};
use serde::{Deserialize, Serialize};

use crate::launch::{LaunchError, Launcher, WorkerSpec};
use crate::local_state::{LocalState, LocalStateError};
use crate::plan::{Action, LocalAssignment, LocalBeat, RunningWorker, WorkerTimeouts, plan_workers};

/// One worker this supervisor started, as recorded in its local state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRecord {
    pub port: u16,
    pub pid: u32,
    pub launched_at_secs: u64,
    pub topology_id: TopologyId,
}

/// The supervisor's durable local state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SupervisorState {
    /// Stable across restarts: nimbus's assignments name it.
    pub supervisor_id: SupervisorId,
    /// Worker id -> what was started.
    pub workers: BTreeMap<String, WorkerRecord>,
}

/// Builds the launch of one worker: its program and what it is told (the caller knows where the
/// code and the cluster are).
pub type SpecBuilder =
    Arc<dyn Fn(&SupervisorId, &WorkerId, u16, &LocalAssignment) -> WorkerSpec + Send + Sync>;

/// What a reconcile did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    Killed { worker_id: String, port: u16, state: crate::plan::WorkerState },
    Launched { worker_id: String, port: u16, pid: u32 },
}

/// A process-task failure that the caller should log and retry on the next tick.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error(transparent)]
    State(#[from] LocalStateError),
    #[error(transparent)]
    Id(#[from] cluster_state::ids::IdError),
}

/// See the module docs.
pub struct ProcessTask {
    local_dir: PathBuf,
    launcher: Arc<dyn Launcher>,
    spec: SpecBuilder,
    timeouts: WorkerTimeouts,
    shutdown_grace: Duration,
    file: LocalState,
    state: SupervisorState,
}

impl std::fmt::Debug for ProcessTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessTask").field("state", &self.state).finish_non_exhaustive()
    }
}

fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

impl ProcessTask {
    /// Opens the state under `local_dir/supervisor/state` (creating a supervisor id the first
    /// time) and adopts the recorded workers that still run; the others are forgotten.
    pub fn open(
        local_dir: &Path,
        launcher: Arc<dyn Launcher>,
        spec: SpecBuilder,
        timeouts: WorkerTimeouts,
        shutdown_grace: Duration,
    ) -> Result<Self, ProcessError> {
        let dir = local_dir.join("supervisor");
        std::fs::create_dir_all(&dir).map_err(|source| LocalStateError::Io { path: dir.clone(), source })?;
        let file = LocalState::new(dir.join("state"));
        let loaded = match file.load::<SupervisorState>() {
            Ok(state) => state,
            Err(e @ LocalStateError::Corrupt { .. }) => {
                tracing::warn!(error = %e, "starting with an empty supervisor state");
                file.remove()?;
                None
            }
            Err(e) => return Err(e.into()),
        };
        let mut state = match loaded {
            Some(state) => state,
            None => SupervisorState { supervisor_id: SupervisorId::new(new_id())?, workers: BTreeMap::new() },
        };
        state.workers.retain(|worker_id, record| {
            let alive = launcher.adopt(record.pid, worker_id);
            tracing::info!(%worker_id, pid = record.pid, adopted = alive, "worker from before the restart");
            alive
        });
        file.store(&state)?;
        Ok(ProcessTask {
            local_dir: local_dir.to_path_buf(),
            launcher,
            spec,
            timeouts,
            shutdown_grace,
            file,
            state,
        })
    }

    /// This supervisor's id.
    pub fn supervisor_id(&self) -> &SupervisorId {
        &self.state.supervisor_id
    }

    /// The workers it runs now.
    pub fn workers(&self) -> &BTreeMap<String, WorkerRecord> {
        &self.state.workers
    }

    /// The ports in use (for the supervisor's registration).
    pub fn used_ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self.state.workers.values().map(|w| w.port).collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    fn running(&self) -> Vec<RunningWorker> {
        self.state
            .workers
            .iter()
            .map(|(worker_id, record)| {
                let path = LocalWorkerHeartbeat::path(&self.local_dir, worker_id);
                let alive = self.launcher.is_running(record.pid);
                let beat = if alive {
                    std::fs::read(&path).ok().and_then(|bytes| {
                        LocalWorkerHeartbeat::decode(&path.display().to_string(), &bytes)
                            .map_err(|e| tracing::warn!(error = %e, "unreadable worker heartbeat"))
                            .ok()
                    })
                } else {
                    None
                };
                RunningWorker {
                    worker_id: worker_id.clone(),
                    port: record.port,
                    // A dead process counts as launched long ago: it is timed out at once.
                    launched_at_secs: if alive { record.launched_at_secs } else { 0 },
                    beat: beat.map(|b| LocalBeat {
                        topology_id: b.topology_id,
                        executors: b.executors.into_iter().collect(),
                        time_secs: b.time_secs,
                    }),
                }
            })
            .collect()
    }

    /// One round: see the module docs. Returns what was done.
    pub async fn reconcile(
        &mut self,
        desired: &BTreeMap<u16, LocalAssignment>,
        now_secs: u64,
    ) -> Result<Vec<Done>, ProcessError> {
        let actions = plan_workers(desired, &self.running(), now_secs, self.timeouts);
        let mut done = Vec::new();
        for action in actions {
            match action {
                Action::Kill { worker_id, port, state } => {
                    tracing::info!(%worker_id, port, ?state, "killing worker");
                    if let Some(record) = self.state.workers.get(&worker_id) {
                        self.stop(record.pid).await?;
                    }
                    self.state.workers.remove(&worker_id);
                    let _ = std::fs::remove_dir_all(self.local_dir.join("workers").join(&worker_id));
                    self.file.store(&self.state)?;
                    done.push(Done::Killed { worker_id, port, state });
                }
                Action::Launch { port, assignment } => {
                    let id = WorkerId::new(new_id())?;
                    let spec = (self.spec)(&self.state.supervisor_id, &id, port, &assignment);
                    let worker_id = id.to_string();
                    let pid = self.launcher.launch(&spec)?;
                    tracing::info!(%worker_id, port, pid, topology = %assignment.topology_id, "launched worker");
                    self.state.workers.insert(
                        worker_id.clone(),
                        WorkerRecord {
                            port,
                            pid,
                            launched_at_secs: now_secs,
                            topology_id: assignment.topology_id,
                        },
                    );
                    self.file.store(&self.state)?;
                    done.push(Done::Launched { worker_id, port, pid });
                }
            }
        }
        Ok(done)
    }

    /// TERM, wait up to the grace period, then KILL.
    async fn stop(&self, pid: u32) -> Result<(), LaunchError> {
        self.launcher.terminate(pid)?;
        let deadline = tokio::time::Instant::now() + self.shutdown_grace;
        while self.launcher.is_running(pid) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if self.launcher.is_running(pid) {
            self.launcher.force_kill(pid)?;
        }
        Ok(())
    }
}
