//! Submit and assignments: Storm's `submitTopology` and `mk-assignments`.
//!
//! [`Assigner`] is the one writer of `/assignments/<id>`. Every `nimbus.monitor.freq.secs` its
//! monitor pass reads the cluster (bases, assignments, supervisors) from ZooKeeper and the
//! worker heartbeats from the supervisors' aggregated reports in memory ([`HeartbeatStore`]),
//! judges which executors are alive on nimbus's own clock ([`HeartbeatCache`]) and which
//! supervisors are alive (present in `/supervisors`, and reporting: their last report or node
//! time changed within `nimbus.supervisor.timeout.secs`), and re-runs the even scheduler for every topology: alive
//! executors keep their slot, dead ones (no heartbeat for `nimbus.task.timeout.secs`, or on a
//! supervisor gone) move. An assignment is written only when it changes, with compare-and-set.
//!
//! A rebalance falling due calls [`Assigner`] as the [`Rescheduler`]: that topology is
//! rescheduled from scratch (no executor counts as alive) with the base's new worker count and
//! executor counts. Submit installs the code, creates `/workerbeats/<id>`, writes `/storms/<id>`
//! and then the first assignment, and (like everything here) runs under one lock, so a monitor
//! pass or the orphan cleanup never sees a submit half-done.
//!
//! The executors of a topology come from its structure ([`TopologyStructure`], read from the
//! topology file in the code store, cached per id) and the base's `component_executors`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use cluster_state::coord::{self, Session};
use cluster_state::ids::{ComponentId, ExecutorId, SupervisorId, TopologyId, TopologyName, WorkerSlot};
use cluster_state::paths::StormPaths;
use cluster_state::structure::{StructureError, TopologyStructure};
use cluster_state::znode::{
    Assignment, ExecutorAssignment, StormBase, SupervisorInfo, TopologyStatus, ZnodeData,
};
use tokio::sync::Mutex;

use crate::assignments::{AssignmentWriteError, write_assignment};
use crate::code_store::{CodeFile, CodeStore, CodeStoreError, UploadId};
use crate::heartbeats::{self, HeartbeatStore};
use crate::leader::{self, Leadership};
use crate::limits::{LimitError, TopologyLimits};
use crate::liveness::{HeartbeatCache, Timeouts};
use crate::metrics::NimbusMetrics;
use crate::node_index::{StoredIndex, desired_index, diff_index, read_index, write_index};
use crate::scheduler::{Schedule, ScheduleInput, schedule};
use crate::state::{self, ClusterCache, Read, Skipped, VersionedSnapshot};
use crate::transitions::{RescheduleError, Rescheduler, Transitions};
use cluster_state::clock::now_secs;

/// The largest topology file nimbus reads (the definition, not the worker binary).
pub const MAX_TOPOLOGY_FILE_BYTES: u64 = 1024 * 1024;

/// The timeouts the monitor judges liveness with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MonitorTimeouts {
    /// `nimbus.task.timeout.secs` and `nimbus.task.launch.secs`.
    pub tasks: Timeouts,
    /// `nimbus.supervisor.timeout.secs` (Storm: 60).
    pub supervisor_timeout_secs: u64,
}

impl Default for MonitorTimeouts {
    fn default() -> Self {
        MonitorTimeouts { tasks: Timeouts::default(), supervisor_timeout_secs: 60 }
    }
}

/// What a submit asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitRequest {
    /// A finished upload holding the topology file.
    pub topology: UploadId,
    /// A finished upload holding the user's worker binary, if any.
    pub worker_binary: Option<UploadId>,
    /// The finished upload of the shell components' resources archive, if any.
    pub resources: Option<UploadId>,
    /// Start deactivated (`squall submit --inactive`).
    pub inactive: bool,
    /// Who submits (recorded in the base).
    pub owner: String,
}

/// Why a submit was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the topology file is not UTF-8 text")]
    NotText,
    #[error(transparent)]
    Structure(#[from] StructureError),
    /// Over one of nimbus's [`TopologyLimits`]; the message names it.
    #[error("topology refused: {0}")]
    Limit(#[from] LimitError),
    /// Storm: "Topology with name `x` already exists on cluster".
    #[error("a topology named {name} is already running as {id}; kill it first or choose another name")]
    NameTaken { name: TopologyName, id: TopologyId },
    #[error(transparent)]
    Code(#[from] CodeStoreError),
    #[error(transparent)]
    Coord(#[from] coord::Error),
}

/// What one monitor pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Topologies whose assignment was written.
    pub written: Vec<TopologyId>,
    /// Executors that moved to another slot (or got one), over all topologies.
    pub moved: usize,
    /// Executors left without a slot (the cluster has none free).
    pub unassigned: usize,
    /// Znodes skipped as garbage.
    pub skipped: Vec<Skipped>,
    /// Topologies whose assignment could not be written, and why; the pass went on with the
    /// others. A conflict (the base or the assignment changed since the pass read them) is
    /// re-read and decided again at the next pass.
    pub failed: Vec<(TopologyId, AssignmentWriteError)>,
}

#[derive(Debug, Default)]
struct Memory {
    executors: BTreeMap<TopologyId, HeartbeatCache>,
    supervisors: HeartbeatCache<SupervisorId>,
    structures: BTreeMap<TopologyId, Arc<TopologyStructure>>,
    /// Storm's `submitted-count`: the middle part of topology ids.
    submitted: u64,
    /// When this nimbus took the leadership (0: it always led): executors count as launched
    /// then, so a new leader gives every worker `nimbus.task.launch.secs` of fresh heartbeats
    /// before declaring it dead (no mass reassignment after a failover).
    leader_since_secs: u64,
    /// The bases, assignments and supervisors, kept by watches; made at the first read of a
    /// term (so a new leader reads everything once).
    cluster: Option<ClusterCache>,
    /// What `/node-assignments` holds, as of the last write or read; `None`: read it first
    /// (a new term, or a write that failed).
    node_index: Option<StoredIndex>,
    /// The assignment versions and registered supervisors the index was last brought to: a
    /// pass whose are the same has nothing to check (at 18,000 slots, building the index is
    /// not free).
    node_index_inputs: Option<(BTreeMap<TopologyId, i32>, Vec<SupervisorId>)>,
}

/// Which topologies a pass decides on. Every pass reads the whole cluster (from the watched
/// copy: only what changed), but a submit or a rebalance decides only its own topology: the
/// others were decided at the last monitor pass and are decided again at the next.
#[derive(Debug, Clone, Copy)]
enum Scope<'a> {
    /// Storm's `mk-assignments`: every topology.
    All,
    /// A topology just submitted.
    Only(&'a TopologyId),
    /// A topology being rebalanced, with the base it is rebalanced to: all its executors move.
    Scratch(&'a TopologyId, &'a StormBase),
}

/// Submit, the monitor pass and rescheduling; see the module docs.
#[derive(Debug)]
pub struct Assigner {
    session: Arc<Session>,
    paths: StormPaths,
    code: CodeStore,
    timeouts: MonitorTimeouts,
    limits: TopologyLimits,
    metrics: NimbusMetrics,
    leadership: Leadership,
    memory: Mutex<Memory>,
    /// The supervisors' aggregated heartbeats (the API records them).
    heartbeats: Arc<HeartbeatStore>,
}

impl Assigner {
    pub fn new(
        session: Arc<Session>,
        paths: StormPaths,
        code: CodeStore,
        timeouts: MonitorTimeouts,
        metrics: NimbusMetrics,
    ) -> Self {
        Assigner {
            session,
            paths,
            code,
            timeouts,
            limits: TopologyLimits::default(),
            metrics,
            leadership: Leadership::standalone(),
            memory: Mutex::new(Memory::default()),
            heartbeats: Arc::new(HeartbeatStore::default()),
        }
    }

    /// The same assigner writing only while `leadership` leads, every write fenced.
    pub fn with_leadership(mut self, leadership: Leadership) -> Self {
        self.leadership = leadership;
        self
    }

    pub fn leadership(&self) -> &Leadership {
        &self.leadership
    }

    /// The supervisors' aggregated heartbeats, which the API records and the monitor reads.
    pub fn heartbeats(&self) -> &Arc<HeartbeatStore> {
        &self.heartbeats
    }

    /// Called when this nimbus takes the leadership at `now_secs`: executors get
    /// `nimbus.task.launch.secs` from now before they can be declared dead, and what the
    /// assigner remembered from an earlier term is forgotten (ZooKeeper is re-read).
    pub async fn took_leadership(&self, now_secs: u64) {
        let mut memory = self.memory.lock().await;
        memory.executors.clear();
        memory.supervisors = HeartbeatCache::default();
        memory.leader_since_secs = now_secs;
        memory.cluster = None;
        memory.node_index = None;
        memory.node_index_inputs = None;
        // Reports of an earlier term are stale; followers refuse reports, so this is empty
        // unless this nimbus led before.
        self.heartbeats.clear();
    }

    /// The same assigner with `limits` instead of the defaults.
    pub fn with_limits(mut self, limits: TopologyLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Storm's `submitTopology`: checks the file, installs the code, writes the base and the
    /// first assignment. Returns the new topology's id and base.
    pub async fn submit(&self, request: SubmitRequest) -> Result<(TopologyId, StormBase), SubmitError> {
        let mut memory = self.memory.lock().await;
        let bytes = self.code.read_finished(request.topology, MAX_TOPOLOGY_FILE_BYTES).await?;
        let text = String::from_utf8(bytes).map_err(|_| SubmitError::NotText)?;
        // Known before anything can quote the file: errors, answers and logs hide them from now on.
        cluster_state::secrets::remember(&cluster_state::secrets::Redactor::from_flux(&text));
        let structure = TopologyStructure::from_flux(&text)?;
        let snapshot = self.snapshot(&mut memory, now_secs()).await?.value.cluster;
        // By the name part of every id under /storms, so a node whose data does not decode
        // still holds its name; and by the bases' names, which an older nimbus wrote.
        let stored = state::stored_topology_ids(&self.session, &self.paths).await?;
        let taken = stored
            .iter()
            .find(|id| id.name() == structure.name.as_str())
            .or_else(|| snapshot.storms.iter().find(|(_, b)| b.name == structure.name).map(|(id, _)| id));
        if let Some(id) = taken {
            return Err(SubmitError::NameTaken { name: structure.name.clone(), id: id.clone() });
        }
        // The widest id this name can get, for the code dir the assignment names.
        let widest = TopologyId::new(&structure.name, u64::MAX, u64::MAX);
        self.limits.check(
            &structure,
            &structure.component_executors(),
            &node_hosts(&snapshot.supervisors),
            &self.code.topology_dir(&widest).display().to_string(),
        )?;
        let launch = now_secs();
        let id = loop {
            memory.submitted += 1;
            let id = TopologyId::new(&structure.name, memory.submitted, launch);
            // A restarted nimbus counts from 1 again; the launch second keeps ids apart, and this
            // check covers a restart within the same second.
            if !stored.contains(&id) && self.session.exists(&self.paths.storm(&id)).await?.is_none() {
                break id;
            }
        };
        // The worker binary first: it is the one that can be refused (unknown upload) after the
        // topology file was moved.
        if let Some(upload) = request.worker_binary {
            self.code.install_id(upload, &id, CodeFile::WorkerBinary).await?;
        }
        if let Some(upload) = request.resources {
            self.code.install_id(upload, &id, CodeFile::Resources).await?;
        }
        self.code.install_id(request.topology, &id, CodeFile::Topology).await?;
        // The secret its workers authenticate each other with: a code file, not a znode.
        self.code.install_secret(&id).await?;
        let base = StormBase {
            name: structure.name.clone(),
            launch_time_secs: launch,
            status: if request.inactive { TopologyStatus::Inactive } else { TopologyStatus::Active },
            num_workers: structure.num_workers,
            component_executors: structure.component_executors(),
            owner: request.owner,
            prev_status: None,
            pending_transition: None,
        };
        let written = async {
            // The parents are structural (created once per cluster); every node of the
            // topology itself is a fenced leader write.
            for dir in [self.paths.workerbeats_dir(), self.paths.blobstore_dir(), self.paths.storms_dir()] {
                self.session.ensure_path(&dir).await?;
            }
            let leader = &self.leadership;
            for dir in [self.paths.workerbeats_topology(&id), self.paths.blobstore_topology(&id)] {
                match leader::create(&self.session, leader, &dir, b"").await {
                    Ok(()) | Err(coord::Error::NodeExists { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            leader::create(&self.session, leader, &self.paths.storm(&id), &base.encode()).await?;
            Ok(())
        }
        .await;
        if let Err(e) = written {
            // Nothing of this topology may stay behind: the code goes, the heartbeat dir goes.
            let _ = self.code.remove(&id).await;
            for dir in [self.paths.workerbeats_topology(&id), self.paths.blobstore_topology(&id)] {
                let _ = leader::delete_recursive(&self.session, &self.leadership, &dir).await;
            }
            return Err(e.into());
        }
        memory.structures.insert(id.clone(), Arc::new(structure));
        tracing::info!(topology = %id, status = %base.status, workers = base.num_workers, "topology submitted");
        // The first assignment; a failure here is repaired by the next monitor pass.
        if let Err(e) = self.pass(&mut memory, Scope::Only(&id)).await {
            tracing::warn!(topology = %id, "first assignment failed, the monitor retries: {e}");
        }
        Ok((id, base))
    }

    /// Checks a rebalance to `executors` per component (`-e comp=N`) against the topology's
    /// tasks and nimbus's limits. A topology whose definition cannot be read passes: applying
    /// the rebalance reports what is wrong with it.
    pub async fn check_rebalance(
        &self,
        id: &TopologyId,
        executors: &BTreeMap<ComponentId, u32>,
    ) -> Result<(), SubmitError> {
        let mut memory = self.memory.lock().await;
        let Ok(structure) = self.structure(&mut memory, id).await else { return Ok(()) };
        let snapshot = self.snapshot(&mut memory, now_secs()).await?.value.cluster;
        drop(memory);
        let mut after = snapshot.storms.get(id).map(|b| b.component_executors.clone()).unwrap_or_default();
        after.extend(executors.iter().map(|(c, n)| (c.clone(), *n)));
        // Components not named keep their count, which the topology already runs with: only
        // what the request asks for can be over the component's tasks.
        for (component, n) in &mut after {
            if !executors.contains_key(component)
                && let Some(shape) = structure.components.get(component)
            {
                *n = (*n).min(shape.tasks);
            }
        }
        let master_code_dir = self.code.topology_dir(id).display().to_string();
        self.limits.check(&structure, &after, &node_hosts(&snapshot.supervisors), &master_code_dir)?;
        Ok(())
    }

    /// One monitor pass over every topology (Storm's `mk-assignments`).
    pub async fn monitor_pass(&self) -> Result<PassReport, RescheduleError> {
        let mut memory = self.memory.lock().await;
        let timer = self.metrics.monitor_pass_seconds.start_timer();
        let report = self.pass(&mut memory, Scope::All).await;
        timer.observe_duration();
        self.metrics.workers_reported.set(self.heartbeats.workers_reported() as i64);
        report
    }

    /// Storm's `cleanup-storm-ids`, under the submit lock (see
    /// [`Transitions::cleanup_orphans`]).
    pub async fn cleanup_orphans(&self, transitions: &Transitions) -> Vec<TopologyId> {
        let _memory = self.memory.lock().await;
        match transitions.cleanup_orphans().await {
            Ok(removed) => removed,
            Err(e) => {
                tracing::warn!("cleaning up removed topologies failed, retrying at the next pass: {e}");
                Vec::new()
            }
        }
    }

    async fn structure(
        &self,
        memory: &mut Memory,
        id: &TopologyId,
    ) -> Result<Arc<TopologyStructure>, RescheduleError> {
        if let Some(s) = memory.structures.get(id) {
            return Ok(s.clone());
        }
        let mut reader = self.code.open_code(id, CodeFile::Topology).await.map_err(|e| {
            RescheduleError::Other(format!("topology {id} has no readable topology file: {e}"))
        })?;
        if reader.size > MAX_TOPOLOGY_FILE_BYTES {
            return Err(RescheduleError::Other(format!("topology {id}: its topology file is too large")));
        }
        let mut text = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut reader.file, &mut text)
            .await
            .map_err(|e| RescheduleError::Other(format!("topology {id}: reading its topology file: {e}")))?;
        let structure = Arc::new(
            TopologyStructure::from_flux(&text)
                .map_err(|e| RescheduleError::Other(format!("topology {id}: {e}")))?,
        );
        memory.structures.insert(id.clone(), structure.clone());
        Ok(structure)
    }

    /// The cluster as the watched copy holds it, brought up to date (reading only what changed).
    async fn snapshot(&self, memory: &mut Memory, now: u64) -> Result<Read<VersionedSnapshot>, coord::Error> {
        let cache = memory.cluster.get_or_insert_with(|| ClusterCache::new(&self.paths));
        let (read, nodes) = cache.snapshot(&self.session, now).await?;
        self.metrics.cluster_reads.inc_by(nodes as u64);
        Ok(read)
    }

    /// Reads the cluster and writes every assignment in `scope` that changes.
    // Over 100 lines on purpose: Storm's `mk-assignments` read top to bottom (read, decide with
    // the pure scheduler, write only what changed) under the assigner's one lock; the
    // decisions themselves are the pure functions it calls.
    async fn pass(&self, memory: &mut Memory, scope: Scope<'_>) -> Result<PassReport, RescheduleError> {
        let now = now_secs();
        let read = self.snapshot(memory, now).await?;
        let mut report = PassReport { skipped: read.skipped, ..Default::default() };
        let state::VersionedSnapshot { cluster: snapshot, storm_versions, mut assignment_versions } =
            read.value;

        // Supervisors: present in ZooKeeper (their ephemeral node), and heartbeating on nimbus's
        // clock: the later of their node's time (written at registration and on a change) and
        // their last aggregated report's time. After taking the leadership every supervisor
        // gets `nimbus.task.launch.secs` (at least its own timeout) of fresh reports.
        self.heartbeats.retain(|id| snapshot.supervisors.contains_key(id));
        let reported = self.heartbeats.supervisor_times();
        let beats: BTreeMap<SupervisorId, u64> = snapshot
            .supervisors
            .iter()
            .map(|(id, info)| (id.clone(), info.time_secs.max(reported.get(id).copied().unwrap_or(0))))
            .collect();
        memory.supervisors.retain(|id| beats.contains_key(id));
        memory.supervisors.observe(&beats, now);
        let supervisor_timeouts = Timeouts {
            task_timeout_secs: self.timeouts.supervisor_timeout_secs,
            task_launch_secs: self.timeouts.tasks.task_launch_secs,
        };
        let live: BTreeMap<&SupervisorId, &SupervisorInfo> = snapshot
            .supervisors
            .iter()
            .filter(|(id, _)| {
                memory.supervisors.is_alive(id, memory.leader_since_secs, now, supervisor_timeouts)
            })
            .collect();
        let slot_beats = self.heartbeats.slot_beats();
        let supervisor_ports: BTreeMap<SupervisorId, BTreeSet<u16>> =
            live.iter().map(|(id, info)| ((*id).clone(), info.all_ports.iter().copied().collect())).collect();

        let leader_since = memory.leader_since_secs;
        memory.executors.retain(|id, _| snapshot.storms.contains_key(id));
        memory.structures.retain(|id, _| snapshot.storms.contains_key(id));

        // Slots each topology holds now; updated as topologies are rescheduled in turn.
        let mut held: BTreeMap<TopologyId, BTreeSet<WorkerSlot>> =
            snapshot.assignments.iter().map(|(id, a)| (id.clone(), a.slots())).collect();

        for (id, stored_base) in &snapshot.storms {
            let (base, from_scratch) = match scope {
                Scope::All => (stored_base, false),
                Scope::Only(only) if only == id => (stored_base, false),
                Scope::Scratch(scratch, new_base) if scratch == id => (new_base, true),
                Scope::Only(_) | Scope::Scratch(..) => continue,
            };
            if base.status == TopologyStatus::Killed {
                continue;
            }
            let structure = match self.structure(memory, id).await {
                Ok(s) => s,
                Err(e) if from_scratch => return Err(e),
                Err(e) => {
                    tracing::warn!(topology = %id, "cannot schedule: {e}");
                    continue;
                }
            };
            // A topology stored before the limit (or by an older nimbus) is not laid out: its
            // tasks are what a layout allocates.
            if structure.total_tasks() > u64::from(self.limits.max_tasks) {
                let e = AssignmentWriteError::OverLimit(format!(
                    "it has {} tasks, above nimbus.topology.max.tasks {}; kill it",
                    structure.total_tasks(),
                    self.limits.max_tasks
                ));
                self.not_assigned(&mut report, id, e, from_scratch)?;
                continue;
            }
            let executors: BTreeSet<ExecutorId> =
                structure.layout(&base.component_executors).executors.into_keys().collect();
            let existing = snapshot.assignments.get(id);
            let cache = memory.executors.entry(id.clone()).or_default();
            let alive = if from_scratch {
                *cache = HeartbeatCache::default();
                BTreeMap::new()
            } else {
                let assigned =
                    existing.iter().flat_map(|a| a.executors.iter().map(|e| (e.executor, e.slot())));
                let reported = heartbeats::executor_beats(assigned, slot_beats.get(id));
                cache.observe(&reported, now);
                existing
                    .map(|a| {
                        a.executors
                            .iter()
                            .filter(|e| {
                                let launched = e.start_time_secs.max(leader_since);
                                cache.is_alive(&e.executor, launched, now, self.timeouts.tasks)
                            })
                            .map(|e| (e.executor, e.slot()))
                            .collect()
                    })
                    .unwrap_or_default()
            };
            // Every executor alive on a live slot: the scheduler would keep them all where they
            // are and place nothing, so its answer is known without building its input (the
            // slots of every other topology), which at thousands of slots and hundreds of
            // topologies is most of a pass.
            let settled = alive.len() == executors.len()
                && alive.iter().all(|(executor, slot)| {
                    executors.contains(executor)
                        && supervisor_ports.get(&slot.node).is_some_and(|ports| ports.contains(&slot.port))
                });
            let decided = if settled {
                Schedule { assignment: alive, unassigned: Vec::new() }
            } else {
                let used_by_others: BTreeSet<WorkerSlot> = held
                    .iter()
                    .filter(|(other, _)| *other != id)
                    .flat_map(|(_, slots)| slots.iter().cloned())
                    .collect();
                schedule(&ScheduleInput {
                    num_workers: base.num_workers as usize,
                    executors,
                    alive,
                    supervisor_ports: supervisor_ports.clone(),
                    used_by_others,
                })
            };
            report.unassigned += decided.unassigned.len();
            if !decided.unassigned.is_empty() {
                tracing::warn!(
                    topology = %id,
                    executors = decided.unassigned.len(),
                    "no free slot for some executors; they wait for a supervisor with free ports"
                );
            }
            // The code dir of the nimbus that first assigned it: every nimbus holds the code at
            // its own dir (HA), and a new leader must not rewrite assignments for its path.
            let master_code_dir = existing
                .map(|a| a.master_code_dir.clone())
                .unwrap_or_else(|| self.code.topology_dir(id).display().to_string());
            let (assignment, moved) =
                to_assignment(&decided.assignment, existing, &live, now, master_code_dir);
            let cache_keep: BTreeSet<ExecutorId> = assignment.executors.iter().map(|e| e.executor).collect();
            if let Some(cache) = memory.executors.get_mut(id) {
                cache.retain(|e| cache_keep.contains(e));
            }
            if existing == Some(&assignment) {
                continue;
            }
            // Bases in the snapshot were read with their version; a scratch base is the stored
            // one's successor, checked against the stored version.
            let storm_version = storm_versions.get(id).copied().unwrap_or(0);
            let assignment_version = match assignment_versions.get(id) {
                Some(version) => Some(*version),
                None => self.garbage_assignment_version(id).await?,
            };
            let version = write_assignment(
                &self.session,
                &self.leadership,
                &self.paths,
                id,
                storm_version,
                assignment_version,
                &assignment,
            )
            .await?;
            let version = match version {
                Ok(version) => version,
                Err(e) => {
                    self.not_assigned(&mut report, id, e, from_scratch)?;
                    continue;
                }
            };
            held.insert(id.clone(), assignment.slots());
            assignment_versions.insert(id.clone(), version);
            report.written.push(id.clone());
            report.moved += moved;
            self.metrics.assignments_written.inc();
            self.metrics.executors_reassigned.inc_by(moved as u64);
            tracing::info!(topology = %id, moved, slots = assignment.slots().len(), "assignment written");
            if let Some(cache) = memory.cluster.as_mut() {
                cache.wrote_assignment(id.clone(), assignment, version);
            }
        }
        self.sync_node_index(memory, &held, &assignment_versions, snapshot.supervisors.keys()).await?;
        self.metrics.garbage_znodes.inc_by(report.skipped.len() as u64);
        for status in [
            TopologyStatus::Active,
            TopologyStatus::Inactive,
            TopologyStatus::Rebalancing,
            TopologyStatus::Killed,
        ] {
            let n = snapshot.storms.values().filter(|b| b.status == status).count();
            self.metrics.topologies.with_label_values(&[status.as_str()]).set(n as i64);
        }
        let total: usize = supervisor_ports.values().map(BTreeSet::len).sum();
        let used = held
            .values()
            .flatten()
            .filter(|slot| supervisor_ports.get(&slot.node).is_some_and(|ports| ports.contains(&slot.port)))
            .count();
        self.metrics.supervisors.set(live.len() as i64);
        self.metrics.slots.with_label_values(&["used"]).set(used as i64);
        self.metrics.slots.with_label_values(&["free"]).set(total.saturating_sub(used) as i64);
        self.metrics.executors_unassigned.set(report.unassigned as i64);
        Ok(report)
    }

    /// Brings `/node-assignments` to what `held` (every topology's slots after this pass's
    /// writes) and the registered supervisors call for, writing only the nodes that differ
    /// (see [`crate::node_index`]). A failed write is logged and the index read back at the
    /// next pass; only losing the leadership or the session fails the pass.
    async fn sync_node_index<'a>(
        &self,
        memory: &mut Memory,
        held: &'a BTreeMap<TopologyId, BTreeSet<WorkerSlot>>,
        versions: &BTreeMap<TopologyId, i32>,
        registered: impl Iterator<Item = &'a SupervisorId> + Clone,
    ) -> Result<(), RescheduleError> {
        let unchanged = memory.node_index_inputs.as_ref().is_some_and(|(last_versions, last_registered)| {
            last_versions == versions && last_registered.iter().eq(registered.clone())
        });
        if unchanged && memory.node_index.is_some() {
            return Ok(());
        }
        memory.node_index_inputs = None;
        let desired = desired_index(held, registered.clone());
        let mut stored = match memory.node_index.take() {
            Some(stored) => stored,
            None => read_index(&self.session, &self.paths).await?,
        };
        let changes = diff_index(&stored, &desired);
        let count = changes.len();
        match write_index(&self.session, &self.leadership, &self.paths, &mut stored, changes).await {
            Ok(written) => {
                self.metrics.node_index_writes.inc_by(written as u64);
                memory.node_index = Some(stored);
                memory.node_index_inputs = Some((versions.clone(), registered.cloned().collect()));
                Ok(())
            }
            Err(e) if e.is_retryable() || e.is_session_lost() || !self.leadership.is_leader() => {
                Err(e.into())
            }
            Err(e) => {
                tracing::warn!(
                    changes = count,
                    "writing the node assignment index failed, read again at the next pass: {e}"
                );
                Ok(())
            }
        }
    }

    /// Records that topology `id` got no assignment this pass: logged, counted and reported,
    /// and the pass goes on with the others (one topology's failure is its own). A topology
    /// being rebalanced fails the rebalance instead, which the timer retries.
    fn not_assigned(
        &self,
        report: &mut PassReport,
        id: &TopologyId,
        e: AssignmentWriteError,
        from_scratch: bool,
    ) -> Result<(), RescheduleError> {
        self.metrics.assignment_failures.with_label_values(&[e.reason()]).inc();
        if from_scratch {
            return Err(RescheduleError::Other(format!("topology {id}: {e}")));
        }
        match &e {
            AssignmentWriteError::Conflict => tracing::info!(topology = %id, "assignment not written: {e}"),
            _ => tracing::error!(topology = %id, "no assignment written, other topologies go on: {e}"),
        }
        report.failed.push((id.clone(), e));
        Ok(())
    }

    /// The version of `/assignments/<id>` when it holds garbage (skipped by the snapshot, and
    /// to be replaced), `None` when it is absent or decodes (then written by someone else since
    /// the snapshot: creating it is refused as a conflict).
    async fn garbage_assignment_version(&self, id: &TopologyId) -> Result<Option<i32>, coord::Error> {
        let path = self.paths.assignment(id);
        match self.session.get(&path).await {
            Ok((data, stat)) if Assignment::decode(&path, &data).is_err() => Ok(Some(stat.version)),
            Ok(_) | Err(coord::Error::NoNode { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[async_trait::async_trait]
impl Rescheduler for Assigner {
    async fn reschedule(
        &self,
        _: &Session,
        id: &TopologyId,
        base: &StormBase,
    ) -> Result<(), RescheduleError> {
        let mut memory = self.memory.lock().await;
        self.pass(&mut memory, Scope::Scratch(id, base)).await.map(|_| ())
    }
}

/// Each supervisor's host name, as an assignment's `node_host` holds it.
fn node_hosts(supervisors: &BTreeMap<SupervisorId, SupervisorInfo>) -> BTreeMap<SupervisorId, String> {
    supervisors.iter().map(|(id, info)| (id.clone(), info.hostname.clone())).collect()
}

/// The assignment for a schedule: executors that stay on their slot keep their start time, the
/// others start `now`; hosts come from the live supervisors. Also returns how many executors
/// moved (or got a slot for the first time).
pub fn to_assignment(
    placed: &BTreeMap<ExecutorId, WorkerSlot>,
    existing: Option<&Assignment>,
    supervisors: &BTreeMap<&SupervisorId, &SupervisorInfo>,
    now_secs: u64,
    master_code_dir: String,
) -> (Assignment, usize) {
    let before: BTreeMap<ExecutorId, &ExecutorAssignment> =
        existing.map(|a| a.executors.iter().map(|e| (e.executor, e)).collect()).unwrap_or_default();
    let mut moved = 0;
    let executors: Vec<ExecutorAssignment> = placed
        .iter()
        .map(|(executor, slot)| {
            let start_time_secs = match before.get(executor) {
                Some(e) if e.node == slot.node && e.port == slot.port => e.start_time_secs,
                _ => {
                    moved += 1;
                    now_secs
                }
            };
            ExecutorAssignment {
                executor: *executor,
                node: slot.node.clone(),
                port: slot.port,
                start_time_secs,
            }
        })
        .collect();
    let node_host = executors
        .iter()
        .map(|e| {
            let host = supervisors.get(&e.node).map_or_else(|| e.node.to_string(), |s| s.hostname.clone());
            (e.node.clone(), host)
        })
        .collect();
    (Assignment { master_code_dir, node_host, executors }, moved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cluster_state::ids::TaskId;

    fn sup(id: &str) -> SupervisorId {
        SupervisorId::new(id).unwrap()
    }

    fn slot(node: &str, port: u16) -> WorkerSlot {
        WorkerSlot { node: sup(node), port }
    }

    fn ex(t: u32) -> ExecutorId {
        ExecutorId::single(TaskId(t))
    }

    fn info(id: &str, host: &str) -> SupervisorInfo {
        SupervisorInfo {
            time_secs: 1,
            hostname: host.into(),
            supervisor_id: sup(id),
            used_ports: vec![],
            all_ports: vec![6700, 6701],
            uptime_secs: 1,
            version: "0".into(),
            metrics_endpoint: None,
            metrics_scheme: cluster_state::znode::MetricsScheme::Http,
        }
    }

    #[test]
    fn executors_that_stay_keep_their_start_time_and_movers_count() {
        let a = info("a", "host-a");
        let b = info("b", "host-b");
        let supervisors = BTreeMap::from([(&a.supervisor_id, &a), (&b.supervisor_id, &b)]);
        let first = BTreeMap::from([(ex(1), slot("a", 6700)), (ex(2), slot("b", 6700))]);
        let (before, moved) = to_assignment(&first, None, &supervisors, 100, "/code".into());
        assert_eq!(moved, 2);
        assert_eq!(before.node_host[&sup("b")], "host-b");

        let second = BTreeMap::from([(ex(1), slot("a", 6700)), (ex(2), slot("a", 6701))]);
        let (after, moved) = to_assignment(&second, Some(&before), &supervisors, 200, "/code".into());
        assert_eq!(moved, 1);
        let starts: Vec<u64> = after.executors.iter().map(|e| e.start_time_secs).collect();
        assert_eq!(starts, vec![100, 200]);
        assert_eq!(after.node_host.keys().collect::<Vec<_>>(), vec![&sup("a")]);

        let (same, moved) = to_assignment(&second, Some(&after), &supervisors, 300, "/code".into());
        assert_eq!((same == after, moved), (true, 0));
    }
}
