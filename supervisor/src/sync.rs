//! The sync task: `/storm/assignments` -> this node's local assignment -> a [`Node`] that makes
//! it run (Storm's `sync-supervisor`).
//!
//! [`SyncLoop::run`] holds its own ZooKeeper session and runs one round every
//! `supervisor.monitor.frequency.secs` and whenever an assignment changes: the
//! [`AssignmentCache`] brings its copy of the assignments up to date, [`local_assignment`] keeps
//! this node's ports, and the [`Node`] acts on them: the real supervisor's [`crate::daemon`]
//! fetches code and reconciles worker processes; the scale simulation (`cli/benches/scale.rs`)
//! runs simulated workers. After each round the loop publishes the ports in use (to the
//! [`crate::registration::Registration`]) and the running workers (to the heartbeat
//! [`crate::heartbeat::Reporter`]), each only when it changed.
//!
//! **Why a cache, and why an index.** In Storm's layout every supervisor reads every
//! assignment (it cannot tell which ones name its ports without reading them). Reading them
//! all on every tick would cost `S x T` reads per tick; reading each one only when it appears
//! or changes (a data watch per assignment) still costs `S` reads per changed assignment: a
//! reassignment rewriting 180 assignments of ~28 KB at 2,000 supervisors is ~9 GB through
//! ZooKeeper. So the leader nimbus keeps a per-node index, `/node-assignments/<node>`
//! ([`NodeAssignments`], `nimbus::node_index`): the topologies whose assignment names this
//! node. The cache watches its node's index and reads (with a data watch) only the
//! assignments listed there; a changed assignment is read by the supervisors it names, not by
//! all. `/assignments/<id>` stays the truth: a listed assignment that does not name the node is
//! left out, and one that stops naming it goes as soon as its data watch fires, before the
//! index catches up.
//!
//! **Fallback.** While the node has no index (a nimbus older than the index, or a supervisor
//! nimbus has not seen yet: it writes an index for every registered supervisor at its next
//! pass), the cache lists `/assignments` (children watch) and reads every assignment as before,
//! and watches for its index to appear, switching to it then; an index that is deleted or does
//! not decode sends it back to listing. Watches survive a disconnect (the coordination client
//! delivers what happened meanwhile) and end with the session; a new session starts with an
//! empty cache and reads everything again, so nothing missed while a session was gone is ever
//! trusted.
//!
//! Only assignments whose bytes contain this node's id, JSON-quoted as nimbus's serializer
//! writes it, are decoded, and each one's share of this node ([`local_assignment`]) is kept per
//! topology.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use cluster_state::coord::{self, Ensemble, Session, SessionOptions, Watch, join};
use cluster_state::ids::{SupervisorId, TopologyId};
use cluster_state::metrics::CoordMetrics;
use cluster_state::paths::StormPaths;
use cluster_state::znode::{Assignment, NodeAssignments, ZnodeData};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::heartbeat::RunningWorker;
use crate::plan::{LocalAssignment, local_assignment};

type Fired = Pin<Box<dyn Future<Output = TopologyId> + Send>>;

/// One session's copy of `/storm/assignments`, as far as it concerns one node, kept current by
/// watches; see the module docs.
pub struct AssignmentCache {
    node: SupervisorId,
    /// `node` as a JSON string (quoted): an assignment naming the node contains it.
    needle: Vec<u8>,
    /// The assignments that name this node (garbage ones and those naming it not left out).
    assignments: BTreeMap<TopologyId, Assignment>,
    /// The topologies to keep: this node's index, or (without one) every topology listed
    /// under `/storm/assignments` at the last listing.
    listed: BTreeSet<TopologyId>,
    /// The watch on this node's index (its data, or its creation while it is absent); `None`:
    /// read the index again.
    index_watch: Option<Watch>,
    /// Whether the last read found this node's index (else: list every assignment).
    indexed: bool,
    /// Assignments read so far (each `getData` of `/storm/assignments/<id>`).
    reads: u64,
    /// Listed topologies to read (new, or their data watch fired, or their last read failed).
    stale: BTreeSet<TopologyId>,
    /// The children watch while there is no index; `None` when it fired (or was never set, or
    /// the index is used): list again when falling back.
    children: Option<Watch>,
    /// One data watch per assignment read, resolving to its topology.
    data: FuturesUnordered<Fired>,
    /// Bumped whenever [`AssignmentCache::assignments`] changes.
    generation: u64,
}

impl std::fmt::Debug for AssignmentCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AssignmentCache")
            .field("node", &self.node)
            .field("assignments", &self.assignments.len())
            .field("indexed", &self.indexed)
            .field("reads", &self.reads)
            .field("stale", &self.stale)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl AssignmentCache {
    /// An empty cache for `node`.
    pub fn new(node: SupervisorId) -> Self {
        let needle = serde_json::to_vec(node.as_str()).unwrap_or_default();
        AssignmentCache {
            node,
            needle,
            assignments: BTreeMap::new(),
            listed: BTreeSet::new(),
            index_watch: None,
            indexed: false,
            reads: 0,
            stale: BTreeSet::new(),
            children: None,
            data: FuturesUnordered::new(),
            generation: 0,
        }
    }

    /// Whether `data` may name this node (it cannot if the quoted id is not in it).
    fn may_name_us(&self, data: &[u8]) -> bool {
        self.needle.is_empty() || memchr::memmem::find(data, &self.needle).is_some()
    }

    /// The assignments naming this node as of the last [`AssignmentCache::refresh`].
    pub fn assignments(&self) -> &BTreeMap<TopologyId, Assignment> {
        &self.assignments
    }

    /// Assignments read so far (what the index saves: without it, every changed assignment).
    pub fn assignment_reads(&self) -> u64 {
        self.reads
    }

    /// Whether the cache follows this node's index (else it reads every assignment).
    pub fn indexed(&self) -> bool {
        self.indexed
    }

    /// Changes whenever the assignments do: a caller recomputes what depends on them only then.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Takes every watch that fired since the last call into account, without waiting.
    fn take_fired(&mut self) {
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        if let Some(children) = &mut self.children
            && Pin::new(children).poll(&mut cx).is_ready()
        {
            self.children = None;
        }
        if let Some(index) = &mut self.index_watch
            && Pin::new(index).poll(&mut cx).is_ready()
        {
            self.index_watch = None;
        }
        while let std::task::Poll::Ready(Some(topology)) = self.data.poll_next_unpin(&mut cx) {
            self.stale.insert(topology);
        }
    }

    /// Resolves when a watch fires (something to read again); pending forever when none is set.
    pub async fn changed(&mut self) {
        let Self { children, data, stale, index_watch, .. } = self;
        let index_fired = async {
            match index_watch.as_mut() {
                Some(w) => {
                    w.await;
                }
                None => std::future::pending().await,
            }
        };
        let children_fired = async {
            match children.as_mut() {
                Some(w) => {
                    w.await;
                }
                None => std::future::pending().await,
            }
        };
        let data_fired = async {
            match data.next().await {
                Some(topology) => topology,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = index_fired => *index_watch = None,
            () = children_fired => *children = None,
            topology = data_fired => {
                stale.insert(topology);
            }
        }
    }

    /// Reads what changed: this node's index when its watch fired (or, without an index, the
    /// topology list when its watch fired), and every new or changed assignment listed (each
    /// read leaving a data watch), keeping those that name this node. An assignment that does
    /// not decode is logged, left out, and read again when it changes. On an error the cache
    /// keeps what it read; what failed is read at the next call.
    pub async fn refresh(&mut self, session: &Session, paths: &StormPaths) -> coord::Result<()> {
        self.take_fired();
        if self.index_watch.is_none() {
            match self.read_index(session, paths).await? {
                Some(listed) => {
                    // The index decides from now on: the listing's watch is not needed.
                    self.children = None;
                    self.indexed = true;
                    self.set_listed(listed);
                }
                None => {
                    if self.indexed {
                        // Back to listing: what an earlier listing saw may be stale.
                        self.children = None;
                    }
                    self.indexed = false;
                }
            }
        }
        if !self.indexed && self.children.is_none() {
            let dir = paths.assignments_dir();
            // No assignment was ever written: the watch fires when the directory appears.
            let (names, watch) = session.children_watch_or_absent(&dir).await?;
            self.children = Some(watch);
            let mut listed = BTreeSet::new();
            for name in names {
                match name.parse::<TopologyId>() {
                    Ok(id) => {
                        listed.insert(id);
                    }
                    Err(_) => {
                        tracing::warn!(path = %join(&dir, &name), "ignoring an assignment with a bad name");
                    }
                }
            }
            self.set_listed(listed);
        }
        self.stale.retain(|id| self.listed.contains(id));
        let stale: Vec<TopologyId> = self.stale.iter().cloned().collect();
        for id in stale {
            let path = paths.assignment(&id);
            self.reads += 1;
            let read = match session.get_watch(&path).await {
                Ok((data, _, watch)) => {
                    let fired = id.clone();
                    self.data.push(Box::pin(async move {
                        watch.await;
                        fired
                    }));
                    if !self.may_name_us(&data) {
                        None
                    } else {
                        match Assignment::decode(&path, &data) {
                            Ok(assignment) if assignment.executors.iter().any(|e| e.node == self.node) => {
                                Some(assignment)
                            }
                            Ok(_) => None,
                            Err(e) => {
                                tracing::warn!(error = %e, "ignoring an unreadable assignment");
                                None
                            }
                        }
                    }
                }
                // Removed since listed: the children watch brings the new list.
                Err(coord::Error::NoNode { .. }) => None,
                Err(e) => return Err(e),
            };
            self.stale.remove(&id);
            let changed = match read {
                Some(assignment) => {
                    self.assignments.insert(id.clone(), assignment.clone()) != Some(assignment)
                }
                None => self.assignments.remove(&id).is_some(),
            };
            if changed {
                self.generation += 1;
            }
        }
        Ok(())
    }
}

impl AssignmentCache {
    /// Reads this node's index, leaving a watch on it: its topologies, or `None` when it is
    /// absent (the watch then fires when it is created) or does not decode (logged).
    async fn read_index(
        &mut self,
        session: &Session,
        paths: &StormPaths,
    ) -> coord::Result<Option<BTreeSet<TopologyId>>> {
        let path = paths.node_assignments(&self.node);
        // Twice at most: an index created between the read and the watch is read again once;
        // should it change yet again, its watch fires and the next call reads it.
        for _ in 0..2 {
            match session.get_watch(&path).await {
                Ok((data, _, watch)) => {
                    self.index_watch = Some(watch);
                    return Ok(match NodeAssignments::decode(&path, &data) {
                        Ok(index) => Some(index.topologies),
                        Err(e) => {
                            tracing::warn!(error = %e, "ignoring this node's unreadable assignment index; reading every assignment");
                            None
                        }
                    });
                }
                Err(coord::Error::NoNode { .. }) => {
                    let (stat, watch) = session.exists_watch(&path).await?;
                    self.index_watch = Some(watch);
                    if stat.is_none() {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Keeps `listed` from now on: the new ones are read, those gone are forgotten.
    fn set_listed(&mut self, listed: BTreeSet<TopologyId>) {
        for id in listed.difference(&self.listed) {
            self.stale.insert(id.clone());
        }
        let before = self.assignments.len();
        self.assignments.retain(|id, _| listed.contains(id));
        if self.assignments.len() != before {
            self.generation += 1;
        }
        self.listed = listed;
    }
}

/// What a sync round drives: the workers of this node. The real supervisor's implementation
/// fetches code and starts and stops worker processes; a simulation runs simulated workers.
pub trait Node: Send {
    /// Makes this node run `desired` (port -> what runs there, already limited to the node's
    /// slots). `session` is the sync task's (for whatever else the node reads).
    fn apply(
        &mut self,
        session: &Session,
        desired: &BTreeMap<u16, LocalAssignment>,
    ) -> impl Future<Output = ()> + Send;

    /// The workers running now (for the aggregated heartbeat).
    fn running(&self) -> Vec<RunningWorker>;

    /// The ports in use (for the registration).
    fn used_ports(&self) -> Vec<u16>;
}

/// The sync task of one supervisor; see the module docs.
#[derive(Debug)]
pub struct SyncLoop {
    pub ensemble: Ensemble,
    pub session_options: SessionOptions,
    pub paths: StormPaths,
    pub supervisor_id: SupervisorId,
    /// The ports this supervisor offers (`supervisor.slots.ports`).
    pub slots: BTreeSet<u16>,
    /// `supervisor.monitor.frequency.secs`.
    pub tick: Duration,
    /// Instruments the session with the process's ZooKeeper metrics.
    pub coord_metrics: Option<CoordMetrics>,
}

impl SyncLoop {
    /// Runs rounds until `shutdown`, publishing the ports in use and the running workers after
    /// each; closes its session (bounded) before returning.
    pub async fn run<N: Node>(
        self,
        node: &mut N,
        ports: &watch::Sender<Vec<u16>>,
        workers: &watch::Sender<Vec<RunningWorker>>,
        shutdown: CancellationToken,
    ) {
        let mut session: Option<(Session, AssignmentCache)> = None;
        // The local assignment, recomputed only when the assignments changed.
        let mut desired: Option<(u64, BTreeMap<u16, LocalAssignment>)> = None;
        while !shutdown.is_cancelled() {
            if session.as_ref().is_none_or(|(s, _)| s.state().is_terminal()) {
                desired = None;
                session = match self.ensemble.connect(&self.session_options).await {
                    Ok(s) => {
                        let s = match &self.coord_metrics {
                            Some(metrics) => s.instrument(metrics.clone()),
                            None => s,
                        };
                        Some((s, AssignmentCache::new(self.supervisor_id.clone())))
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "supervisor cannot reach ZooKeeper; retrying");
                        None
                    }
                };
            }
            if let Some((s, cache)) = &mut session {
                match cache.refresh(s, &self.paths).await {
                    Ok(()) => {
                        if desired.as_ref().is_none_or(|(generation, _)| *generation != cache.generation()) {
                            desired = self.local(cache.assignments()).map(|d| (cache.generation(), d));
                        }
                        if let Some((_, desired)) = &desired {
                            node.apply(s, desired).await;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot read assignments; retrying"),
                }
                publish(workers, node.running());
                publish(ports, node.used_ports());
            }
            let wait = async {
                match &mut session {
                    Some((_, cache)) => {
                        let _ = tokio::time::timeout(self.tick, cache.changed()).await;
                    }
                    None => tokio::time::sleep(self.tick).await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = wait => {}
            }
        }
        if let Some((s, _)) = session {
            // Bounded: the supervisor must stop even while ZooKeeper is down.
            s.close_within(coord::SHUTDOWN_CLOSE_BOUND).await;
        }
    }

    /// This node's ports from `assignments`, limited to its slots; `None` (logged) when nimbus's
    /// assignments conflict, which the node then waits out.
    fn local(
        &self,
        assignments: &BTreeMap<TopologyId, Assignment>,
    ) -> Option<BTreeMap<u16, LocalAssignment>> {
        let local = match local_assignment(&self.supervisor_id, assignments) {
            Ok(local) => local,
            Err(conflict) => {
                tracing::error!(error = %conflict, "inconsistent assignments; waiting for nimbus to fix them");
                return None;
            }
        };
        let mut desired = BTreeMap::new();
        for (port, assignment) in local {
            if !self.slots.contains(&port) {
                tracing::warn!(port, topology = %assignment.topology_id, "assigned a port this supervisor does not offer");
                continue;
            }
            desired.insert(port, assignment);
        }
        Some(desired)
    }
}

/// Sends `now` only if it differs from what was sent (a real change wakes the receiver).
fn publish<T: PartialEq>(tx: &watch::Sender<T>, now: T) {
    tx.send_if_modified(|current| {
        let changed = *current != now;
        if changed {
            *current = now;
        }
        changed
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use cluster_state::coord::CreateMode;
    use cluster_state::ids::{ExecutorId, TaskId};
    use cluster_state::znode::ExecutorAssignment;

    fn assignment(node: &str, port: u16, task: u32) -> Assignment {
        Assignment {
            master_code_dir: "/code".into(),
            node_host: BTreeMap::from([(node.parse().unwrap(), "h".into())]),
            executors: vec![ExecutorAssignment {
                executor: ExecutorId::single(TaskId(task)),
                node: node.parse().unwrap(),
                port,
                start_time_secs: 1,
            }],
        }
    }

    /// The cache reads an assignment once, again only after it changed, and forgets a removed
    /// one; each change bumps the generation.
    #[tokio::test]
    async fn the_cache_reads_only_what_changed() {
        let ensemble = Ensemble::in_memory();
        let session = ensemble.connect(&SessionOptions::default()).await.unwrap();
        let paths = StormPaths::default();
        let (a, b): (TopologyId, TopologyId) = ("a-1-1".parse().unwrap(), "b-1-1".parse().unwrap());
        let mut cache = AssignmentCache::new("s".parse().unwrap());
        cache.refresh(&session, &paths).await.unwrap();
        assert!(cache.assignments().is_empty());

        let create = CreateMode::Persistent.with_parents();
        session.create(&paths.assignment(&a), &assignment("s", 1, 1).encode(), create).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), cache.changed()).await.unwrap();
        cache.refresh(&session, &paths).await.unwrap();
        assert_eq!(cache.assignments().get(&a), Some(&assignment("s", 1, 1)));
        let seen = cache.generation();
        cache.refresh(&session, &paths).await.unwrap();
        assert_eq!(cache.generation(), seen, "nothing changed, nothing read");

        session.set(&paths.assignment(&a), &assignment("s", 2, 1).encode(), None).await.unwrap();
        session.create(&paths.assignment(&b), b"garbage", CreateMode::Persistent).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), cache.changed()).await.unwrap();
        cache.refresh(&session, &paths).await.unwrap();
        assert_eq!(cache.assignments().get(&a), Some(&assignment("s", 2, 1)));
        assert!(!cache.assignments().contains_key(&b), "garbage is left out");
        assert!(cache.generation() > seen);

        session.set(&paths.assignment(&b), &assignment("s", 3, 2).encode(), None).await.unwrap();
        session.delete(&paths.assignment(&a), None).await.unwrap();
        // Both watches may fire; refresh takes whatever fired.
        tokio::time::timeout(Duration::from_secs(5), cache.changed()).await.unwrap();
        cache.refresh(&session, &paths).await.unwrap();
        assert_eq!(cache.assignments().keys().collect::<Vec<_>>(), [&b]);

        // An assignment that does not name this node is not kept; one that stops naming it goes.
        let c: TopologyId = "c-1-1".parse().unwrap();
        session.create(&paths.assignment(&c), &assignment("other", 1, 1).encode(), create).await.unwrap();
        session.set(&paths.assignment(&b), &assignment("other", 3, 2).encode(), None).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), cache.changed()).await.unwrap();
        cache.refresh(&session, &paths).await.unwrap();
        assert!(cache.assignments().is_empty(), "{cache:?}");
    }
}
