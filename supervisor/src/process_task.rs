//! The supervisor's process task: make the workers running on this machine match the local
//! assignment (Storm's `sync-processes`).
//!
//! Each [`ProcessTask::reconcile`] reads every known worker's local heartbeat file, asks
//! [`crate::plan::plan_workers`] what to do, and does it through the [`Launcher`]: kills first
//! (TERM, then KILL after `supervisor.worker.shutdown.sleep.secs`), then launches. What it
//! started is recorded in the durable [`LocalState`], so a restarted supervisor adopts its
//! workers (by pid and worker id) instead of starting a second set on the same ports.
//!
//! Local state: `supervisor/supervisor-id` (the id, on its own) and `supervisor/state` (the
//! workers), both checksummed and replaced atomically ([`LocalState`]). An unreadable file is
//! logged and kept aside as `<name>.corrupt`, never deleted; the id then comes from the state
//! file or the running workers, and the workers from the process table (each worker's command
//! line is its launch, naming its supervisor), so running workers are adopted, not orphaned.
//!
//! Heartbeats: a read that fails (a torn write, garbage) is logged and the worker judged by its
//! last good beat, so it is killed only once that beat is older than the heartbeat timeout
//! (with no good beat yet, the timeout runs from the first bad read).
//!
//! Reaping and backoff: a stopped worker is waited for (TERM, the grace period, KILL, then until
//! it is gone), so none is left a zombie. A worker that dies or stops heartbeating is relaunched
//! after a backoff per port ([`BackoffPolicy`]: 2 s doubling to 60 s, from 2 s again once a
//! worker ran a minute), and so is a port whose launch failed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cluster_state::ids::{SupervisorId, TopologyId, WorkerId};
use cluster_state::launch::WorkerLaunch;
use cluster_state::znode::{LocalWorkerHeartbeat, ZnodeData};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::backoff::{Backoff, BackoffPolicy};
use crate::launch::{LaunchError, Launcher, WorkerSpec};
use crate::local_state::{LocalState, LocalStateError};
use crate::plan::{
    Action, LocalAssignment, LocalBeat, RunningWorker, WorkerState, WorkerTimeouts, plan_workers,
};

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
    backoff: BackoffPolicy,
    /// Per port: relaunches of a worker that keeps dying wait.
    relaunch: BTreeMap<u16, Backoff>,
    /// Per worker: the last heartbeat read whole, used when a read fails.
    last_beats: BTreeMap<String, LocalBeat>,
    /// Per worker without a good beat yet: since when its heartbeat file is unreadable.
    unreadable_since: BTreeMap<String, u64>,
}

impl std::fmt::Debug for ProcessTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessTask").field("state", &self.state).finish_non_exhaustive()
    }
}

/// How long a SIGKILLed worker may take to disappear (it cannot ignore the signal; only a
/// process stuck in the kernel takes longer).
const KILL_WAIT: Duration = Duration::from_secs(5);

fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The supervisor id's own file (`supervisor/supervisor-id`), so that a damaged state file
/// never changes the id nimbus's assignments name.
const ID_FILE: &str = "supervisor-id";
const STATE_FILE: &str = "state";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct IdRecord {
    supervisor_id: SupervisorId,
}

/// Loads `file`; a corrupt one is logged and renamed to `<name>.corrupt` (kept for a look,
/// replacing an older one) and reads as absent. The flag: whether it was corrupt.
fn load_or_set_aside<T: serde::de::DeserializeOwned>(
    file: &LocalState,
) -> Result<(Option<T>, bool), LocalStateError> {
    match file.load::<T>() {
        Ok(loaded) => Ok((loaded, false)),
        Err(e @ LocalStateError::Corrupt { .. }) => {
            let mut aside = file.path().as_os_str().to_owned();
            aside.push(".corrupt");
            let aside = PathBuf::from(aside);
            std::fs::rename(file.path(), &aside)
                .map_err(|source| LocalStateError::Io { path: file.path().to_path_buf(), source })?;
            tracing::error!(error = %e, kept_as = %aside.display(), "unreadable supervisor local state; recovering from the running workers");
            Ok((None, true))
        }
        Err(e) => Err(e),
    }
}

/// With neither the id file nor the state: the id the running workers launched from this
/// local dir were given, if they agree on one.
fn recover_id(local_dir: &Path, found: &[(u32, WorkerLaunch)]) -> Option<SupervisorId> {
    let ids: BTreeSet<&SupervisorId> =
        found.iter().filter(|(_, l)| l.local_dir == local_dir).map(|(_, l)| &l.supervisor_id).collect();
    match ids.into_iter().collect::<Vec<_>>().as_slice() {
        [id] => {
            tracing::warn!(supervisor_id = %id, "supervisor id recovered from its running workers");
            Some((*id).clone())
        }
        [] => None,
        several => {
            tracing::error!(ids = ?several, "running workers of several supervisor ids use this local dir; starting with a new id");
            None
        }
    }
}

/// Logs each local heartbeat directory of a worker that is neither recorded nor running.
fn log_stale_heartbeats(local_dir: &Path, workers: &BTreeMap<String, WorkerRecord>) {
    let Ok(entries) = std::fs::read_dir(local_dir.join("workers")) else { return };
    for entry in entries.flatten() {
        let worker_id = entry.file_name().to_string_lossy().into_owned();
        if !workers.contains_key(&worker_id) {
            tracing::info!(%worker_id, dir = %entry.path().display(), "heartbeat of a worker that is not running; ignored");
        }
    }
}

impl ProcessTask {
    /// Opens the local state under `local_dir/supervisor/`, keeps the supervisor id (its own
    /// `supervisor-id` file; created the first time) and adopts the workers still running: those
    /// the state file records, and those the process table shows with this supervisor's id
    /// (all of them when the state file is unreadable, which is then kept aside as
    /// `state.corrupt`, never deleted). Recorded workers that are gone are forgotten.
    pub fn open(
        local_dir: &Path,
        launcher: Arc<dyn Launcher>,
        spec: SpecBuilder,
        timeouts: WorkerTimeouts,
        shutdown_grace: Duration,
    ) -> Result<Self, ProcessError> {
        let dir = local_dir.join("supervisor");
        cluster_state::files::create_private_dir_all(&dir)
            .map_err(|source| LocalStateError::Io { path: dir.clone(), source })?;
        let id_file = LocalState::new(dir.join(ID_FILE));
        let file = LocalState::new(dir.join(STATE_FILE));
        let stored_id = load_or_set_aside::<IdRecord>(&id_file)?.0.map(|r| r.supervisor_id);
        let (recorded, state_corrupt) = load_or_set_aside::<SupervisorState>(&file)?;
        let found = launcher.find_workers();
        let supervisor_id = match (stored_id, &recorded) {
            (Some(id), _) => id,
            (None, Some(state)) => state.supervisor_id.clone(),
            (None, None) => recover_id(local_dir, &found).map_or_else(|| SupervisorId::new(new_id()), Ok)?,
        };
        let mut workers = BTreeMap::new();
        if let Some(state) = recorded {
            if state.supervisor_id != supervisor_id {
                tracing::warn!(
                    recorded = %state.supervisor_id, %supervisor_id,
                    "the state file names another supervisor id than {}; keeping the id file's",
                    id_file.path().display()
                );
            }
            for (worker_id, record) in state.workers {
                let alive = launcher.adopt(record.pid, &worker_id);
                tracing::info!(%worker_id, pid = record.pid, port = record.port, adopted = alive, "worker from before the restart");
                if alive {
                    workers.insert(worker_id, record);
                }
            }
        }
        for (pid, launch) in found.into_iter().filter(|(_, l)| l.supervisor_id == supervisor_id) {
            let worker_id = launch.worker_id.to_string();
            if workers.contains_key(&worker_id) {
                continue;
            }
            tracing::warn!(
                %worker_id, pid, port = launch.port, topology = %launch.topology_id,
                "adopting a running worker found in the process table but not in the local state"
            );
            workers.insert(
                worker_id,
                WorkerRecord {
                    port: launch.port,
                    pid,
                    // Unknown: counted from now, so it gets the start timeout to heartbeat.
                    launched_at_secs: cluster_state::clock::now_secs(),
                    topology_id: launch.topology_id,
                },
            );
        }
        if state_corrupt && workers.is_empty() {
            tracing::warn!(%supervisor_id, "no running workers found; starting with an empty supervisor state");
        } else if state_corrupt {
            tracing::warn!(%supervisor_id, adopted = workers.len(), "supervisor state rebuilt from the running workers");
        }
        log_stale_heartbeats(local_dir, &workers);
        let state = SupervisorState { supervisor_id, workers };
        id_file.store(&IdRecord { supervisor_id: state.supervisor_id.clone() })?;
        file.store(&state)?;
        Ok(ProcessTask {
            local_dir: local_dir.to_path_buf(),
            launcher,
            spec,
            timeouts,
            shutdown_grace,
            file,
            state,
            backoff: BackoffPolicy::default(),
            relaunch: BTreeMap::new(),
            last_beats: BTreeMap::new(),
            unreadable_since: BTreeMap::new(),
        })
    }

    /// Spaces relaunches of a crashing worker by `policy` instead of the default.
    pub fn with_backoff(mut self, policy: BackoffPolicy) -> Self {
        self.backoff = policy;
        self
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

    /// Each worker with its heartbeat as read now (or the last good one; see the module docs).
    fn running(&mut self, now_secs: u64) -> Vec<RunningWorker> {
        let mut running = Vec::with_capacity(self.state.workers.len());
        for (worker_id, record) in &self.state.workers {
            let alive = self.launcher.is_running(record.pid);
            let mut unreadable_since_secs = None;
            let beat = if !alive {
                None
            } else {
                match read_beat(&self.local_dir, worker_id) {
                    Ok(beat) => {
                        self.unreadable_since.remove(worker_id);
                        self.last_beats.insert(worker_id.clone(), beat.clone());
                        Some(beat)
                    }
                    Err(None) => self.last_beats.get(worker_id).cloned(),
                    Err(Some(problem)) => {
                        let last = self.last_beats.get(worker_id).cloned();
                        match &last {
                            Some(good) => tracing::warn!(
                                %worker_id, %problem, last_good_secs = good.time_secs,
                                "unreadable worker heartbeat; going by the last good one"
                            ),
                            None => {
                                let since =
                                    *self.unreadable_since.entry(worker_id.clone()).or_insert(now_secs);
                                unreadable_since_secs = Some(since);
                                tracing::warn!(%worker_id, %problem, since, "unreadable worker heartbeat; none read yet");
                            }
                        }
                        last
                    }
                }
            };
            running.push(RunningWorker {
                worker_id: worker_id.clone(),
                port: record.port,
                // A dead process counts as launched long ago: it is timed out at once.
                launched_at_secs: if alive { record.launched_at_secs } else { 0 },
                beat,
                unreadable_since_secs,
            });
        }
        running
    }

    /// The ports a [`ProcessTask::reconcile`] at `now_secs` would launch a worker on (those
    /// waiting out a relaunch backoff excluded): the caller checks their code first.
    pub fn launches_due(&mut self, desired: &BTreeMap<u16, LocalAssignment>, now_secs: u64) -> BTreeSet<u16> {
        let running = self.running(now_secs);
        let now = Instant::now();
        plan_workers(desired, &running, now_secs, self.timeouts)
            .into_iter()
            .filter_map(|action| match action {
                Action::Launch { port, .. } if self.relaunch.get(&port).is_none_or(|b| b.ready(now)) => {
                    Some(port)
                }
                _ => None,
            })
            .collect()
    }

    /// One round: see the module docs. Launches on the `held` ports wait (their code is not
    /// ready); their running workers are judged as usual. Returns what was done.
    pub async fn reconcile(
        &mut self,
        desired: &BTreeMap<u16, LocalAssignment>,
        held: &BTreeSet<u16>,
        now_secs: u64,
    ) -> Result<Vec<Done>, ProcessError> {
        let running = self.running(now_secs);
        let actions = plan_workers(desired, &running, now_secs, self.timeouts);
        self.relaunch.retain(|port, _| desired.contains_key(port));
        let mut done = Vec::new();
        for action in actions {
            match action {
                Action::Kill { worker_id, port, state } => {
                    tracing::info!(%worker_id, port, ?state, "killing worker");
                    if let Some(record) = self.state.workers.get(&worker_id).cloned() {
                        if state == WorkerState::TimedOut {
                            self.crashed(port, now_secs.saturating_sub(record.launched_at_secs));
                        }
                        self.stop(record.pid).await?;
                    }
                    self.state.workers.remove(&worker_id);
                    self.last_beats.remove(&worker_id);
                    self.unreadable_since.remove(&worker_id);
                    let _ = std::fs::remove_dir_all(self.local_dir.join("workers").join(&worker_id));
                    self.file.store(&self.state)?;
                    done.push(Done::Killed { worker_id, port, state });
                }
                Action::Launch { port, assignment } => {
                    if held.contains(&port) {
                        tracing::debug!(port, topology = %assignment.topology_id, "launch waits for the topology's code");
                        continue;
                    }
                    if !self.relaunch.get(&port).is_none_or(|b| b.ready(Instant::now())) {
                        continue;
                    }
                    let id = WorkerId::new(new_id())?;
                    let spec = (self.spec)(&self.state.supervisor_id, &id, port, &assignment);
                    let worker_id = id.to_string();
                    let pid = match self.launcher.launch(&spec) {
                        Ok(pid) => pid,
                        Err(e) => {
                            let delay =
                                self.relaunch.entry(port).or_default().failed(&self.backoff, Instant::now());
                            tracing::warn!(port, error = %e, "cannot launch a worker; next attempt in {delay:?}");
                            return Err(e.into());
                        }
                    };
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

    /// A worker on `port` died or hung after running `ran_secs`: its relaunch backs off, from
    /// the start again when it had run long enough to count as healthy.
    fn crashed(&mut self, port: u16, ran_secs: u64) {
        let backoff = self.relaunch.entry(port).or_default();
        if Duration::from_secs(ran_secs) >= self.backoff.reset_after {
            *backoff = Backoff::default();
        }
        let delay = backoff.failed(&self.backoff, Instant::now());
        tracing::warn!(
            port,
            ran_secs,
            failures = backoff.failures(),
            "worker died or stopped heartbeating; relaunching in {delay:?}"
        );
    }

    /// TERM, wait up to the grace period, then KILL and wait (bounded) until the process is
    /// gone: `is_running` reaps it, so a killed worker never stays a zombie.
    async fn stop(&self, pid: u32) -> Result<(), LaunchError> {
        self.launcher.terminate(pid)?;
        if self.exited_within(pid, self.shutdown_grace).await {
            return Ok(());
        }
        tracing::warn!(pid, grace = ?self.shutdown_grace, "worker still running after the grace period; killing it");
        self.launcher.force_kill(pid)?;
        if !self.exited_within(pid, KILL_WAIT).await {
            tracing::error!(
                pid,
                "worker process survived SIGKILL for {KILL_WAIT:?}; it is no longer tracked"
            );
        }
        Ok(())
    }

    /// Polls until the process is gone (and reaped) or `within` passes.
    async fn exited_within(&self, pid: u32, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if !self.launcher.is_running(pid) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Reads a worker's local heartbeat: `Err(None)` when there is none (yet), `Err(Some(why))`
/// when the file is there but cannot be read whole (a torn write, garbage).
fn read_beat(local_dir: &Path, worker_id: &str) -> Result<LocalBeat, Option<String>> {
    let path = LocalWorkerHeartbeat::path(local_dir, worker_id);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(None),
        Err(e) => return Err(Some(format!("local heartbeat file {}: {e}", path.display()))),
    };
    let beat = LocalWorkerHeartbeat::decode(&path.display().to_string(), &bytes).map_err(|e| {
        Some(format!("local heartbeat file {} is not a valid {}: {}", path.display(), e.format, e.reason))
    })?;
    Ok(LocalBeat {
        topology_id: beat.topology_id,
        executors: beat.executors.into_iter().collect(),
        time_secs: beat.time_secs,
    })
}
