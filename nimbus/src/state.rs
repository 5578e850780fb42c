//! Reading what ZooKeeper holds into the inputs of nimbus's pure functions.
//!
//! ZooKeeper is shared with other processes, older versions and operators with `zkCli`, so a
//! reader meets garbage (a znode whose name is not an id, or whose data does not decode) and
//! races (a node listed, then deleted before it is read). Neither may break a summary: a
//! garbage node is skipped, logged with its path and counted in [`Read::skipped`]; a vanished
//! node is simply absent. Only a failure of the session itself is an error.

use std::collections::BTreeMap;
use std::str::FromStr;

use cluster_state::coord::{self, Session, WatchedDir, join};
use cluster_state::ids::{ComponentId, SupervisorId, TopologyId, WorkerSlot};
use cluster_state::paths::StormPaths;
use cluster_state::znode::{Assignment, ErrorInfo, StormBase, SupervisorInfo, WorkerHeartbeat, ZnodeData};
use futures::future::join_all;

use crate::views::ClusterSnapshot;

/// A znode that was skipped because it is not what its place says it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub path: String,
    pub reason: String,
}

/// A value read from ZooKeeper, with the garbage skipped on the way.
#[derive(Debug, Clone, Default)]
pub struct Read<T> {
    pub value: T,
    pub skipped: Vec<Skipped>,
}

/// One error a component reported, with the component it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentError {
    pub component: ComponentId,
    /// Sequence number of the znode (`e<seq>`), increasing per component.
    pub seq: u32,
    pub info: ErrorInfo,
}

/// Reads every child of `dir` whose name parses as `K` and whose data decodes as `V`.
async fn read_dir<K, V>(
    session: &Session,
    dir: &str,
    skipped: &mut Vec<Skipped>,
) -> coord::Result<BTreeMap<K, V>>
where
    K: FromStr + Ord,
    K::Err: std::fmt::Display,
    V: ZnodeData,
{
    Ok(read_dir_versioned(session, dir, skipped).await?.into_iter().map(|(k, (v, _))| (k, v)).collect())
}

/// [`read_dir`] with each node's version, for a compare-and-set of what was read.
async fn read_dir_versioned<K, V>(
    session: &Session,
    dir: &str,
    skipped: &mut Vec<Skipped>,
) -> coord::Result<BTreeMap<K, (V, i32)>>
where
    K: FromStr + Ord,
    K::Err: std::fmt::Display,
    V: ZnodeData,
{
    let mut named = Vec::new();
    for name in session.children_or_empty(dir).await? {
        let path = join(dir, &name);
        match name.parse::<K>() {
            Ok(key) => named.push((key, path)),
            Err(e) => skip(skipped, path, e.to_string()),
        }
    }
    let reads = join_all(named.iter().map(|(_, path)| session.read::<V>(path))).await;
    let mut values = BTreeMap::new();
    for ((key, path), read) in named.into_iter().zip(reads) {
        if let Some((value, stat)) = tolerate(read, &path, skipped)? {
            values.insert(key, (value, stat.version));
        }
    }
    Ok(values)
}

/// Turns a per-node read result into: a value, nothing (the node vanished or is garbage,
/// recorded), or an error of the session.
fn tolerate<T>(read: coord::Result<T>, path: &str, skipped: &mut Vec<Skipped>) -> coord::Result<Option<T>> {
    match read {
        Ok(value) => Ok(Some(value)),
        Err(coord::Error::NoNode { .. }) => Ok(None),
        Err(coord::Error::Decode(e)) => {
            skip(skipped, path.to_owned(), e.reason);
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn skip(skipped: &mut Vec<Skipped>, path: String, reason: String) {
    tracing::warn!(%path, %reason, "skipping a znode that is not what its place says");
    skipped.push(Skipped { path, reason });
}

/// Reads storms, assignments and supervisors into a [`ClusterSnapshot`].
pub async fn read_snapshot(
    session: &Session,
    paths: &StormPaths,
    nimbus_start_secs: u64,
    now_secs: u64,
) -> coord::Result<Read<ClusterSnapshot>> {
    let mut skipped = Vec::new();
    let storms = read_dir::<TopologyId, StormBase>(session, &paths.storms_dir(), &mut skipped).await?;
    let assignments =
        read_dir::<TopologyId, Assignment>(session, &paths.assignments_dir(), &mut skipped).await?;
    let supervisors =
        read_dir::<SupervisorId, SupervisorInfo>(session, &paths.supervisors_dir(), &mut skipped).await?;
    Ok(Read {
        value: ClusterSnapshot { storms, assignments, supervisors, nimbus_start_secs, now_secs },
        skipped,
    })
}

/// What a monitor pass reads: the cluster, with the version of every base and assignment
/// read, so each write is a compare-and-set of what the pass decided on.
#[derive(Debug, Clone, Default)]
pub struct VersionedSnapshot {
    pub cluster: ClusterSnapshot,
    pub storm_versions: BTreeMap<TopologyId, i32>,
    pub assignment_versions: BTreeMap<TopologyId, i32>,
}

/// What the monitor pass decides on, kept current by watches ([`WatchedDir`]): the bases,
/// assignments and supervisor nodes. A pass reads only the nodes that changed since the last
/// one (at 2,000 supervisors and 200 topologies, none of 2,400 in a steady pass), instead of
/// every node every pass. It belongs to one session (watches end with it) and is rebuilt
/// when a leadership term starts, so a new leader reads everything once.
#[derive(Debug)]
pub struct ClusterCache {
    storms: WatchedDir<TopologyId, StormBase>,
    assignments: WatchedDir<TopologyId, Assignment>,
    supervisors: WatchedDir<SupervisorId, SupervisorInfo>,
}

impl ClusterCache {
    pub fn new(paths: &StormPaths) -> Self {
        ClusterCache {
            storms: WatchedDir::new(paths.storms_dir()),
            assignments: WatchedDir::new(paths.assignments_dir()),
            supervisors: WatchedDir::new(paths.supervisors_dir()),
        }
    }

    /// Brings the copy up to date and returns it as a [`VersionedSnapshot`] (garbage skipped,
    /// as [`read_snapshot`] does), with how many nodes this refresh read.
    pub async fn snapshot(
        &mut self,
        session: &Session,
        now_secs: u64,
    ) -> coord::Result<(Read<VersionedSnapshot>, usize)> {
        let read = self.storms.refresh(session).await?
            + self.assignments.refresh(session).await?
            + self.supervisors.refresh(session).await?;
        let mut skipped = Vec::new();
        for (path, reason, _) in
            self.storms.garbage().chain(self.assignments.garbage()).chain(self.supervisors.garbage())
        {
            skipped.push(Skipped { path, reason: reason.to_owned() });
        }
        let storm_versions = self.storms.entries().iter().map(|(id, e)| (id.clone(), e.version)).collect();
        let assignment_versions =
            self.assignments.entries().iter().map(|(id, e)| (id.clone(), e.version)).collect();
        let cluster = ClusterSnapshot {
            storms: self.storms.entries().iter().map(|(id, e)| (id.clone(), e.value.clone())).collect(),
            assignments: self
                .assignments
                .entries()
                .iter()
                .map(|(id, e)| (id.clone(), e.value.clone()))
                .collect(),
            supervisors: self
                .supervisors
                .entries()
                .iter()
                .map(|(id, e)| (id.clone(), e.value.clone()))
                .collect(),
            nimbus_start_secs: 0,
            now_secs,
        };
        Ok((
            Read { value: VersionedSnapshot { cluster, storm_versions, assignment_versions }, skipped },
            read,
        ))
    }

    /// Records an assignment this session wrote (at `version`), so the next decision sees it
    /// before its watch fires: a submit right after another must not take the same slots.
    pub fn wrote_assignment(&mut self, id: TopologyId, assignment: Assignment, version: i32) {
        self.assignments.wrote(id, assignment, version);
    }
}

/// The ids of every node under `/storms` whose name is a topology id, decodable or not: a
/// name is taken as long as any of them carries it.
pub async fn stored_topology_ids(session: &Session, paths: &StormPaths) -> coord::Result<Vec<TopologyId>> {
    Ok(session.children_or_empty(&paths.storms_dir()).await?.iter().filter_map(|n| n.parse().ok()).collect())
}

/// Every stored topology base with its znode version (for compare-and-set).
pub async fn read_storms(
    session: &Session,
    paths: &StormPaths,
) -> coord::Result<Read<BTreeMap<TopologyId, StormBase>>> {
    let mut skipped = Vec::new();
    let value = read_dir::<TopologyId, StormBase>(session, &paths.storms_dir(), &mut skipped).await?;
    Ok(Read { value, skipped })
}

/// The errors reported for a topology, newest first (by time, then sequence number).
pub async fn read_errors(
    session: &Session,
    paths: &StormPaths,
    id: &TopologyId,
) -> coord::Result<Read<Vec<ComponentError>>> {
    let mut skipped = Vec::new();
    let mut errors = Vec::new();
    let topology_dir = paths.errors_topology(id);
    for name in session.children_or_empty(&topology_dir).await? {
        let component_dir = join(&topology_dir, &name);
        let component = match ComponentId::new(name) {
            Ok(c) => c,
            Err(e) => {
                skip(&mut skipped, component_dir, e.to_string());
                continue;
            }
        };
        let mut numbered = Vec::new();
        for entry in session.children_or_empty(&component_dir).await? {
            let path = join(&component_dir, &entry);
            match StormPaths::parse_error_seq(&entry) {
                Some(seq) => numbered.push((seq, path)),
                None => skip(&mut skipped, path, "not an error node name (e + 10 digits)".into()),
            }
        }
        let reads = join_all(numbered.iter().map(|(_, path)| session.read::<ErrorInfo>(path))).await;
        for ((seq, path), read) in numbered.into_iter().zip(reads) {
            if let Some((info, _)) = tolerate(read, &path, &mut skipped)? {
                errors.push(ComponentError { component: component.clone(), seq, info });
            }
        }
    }
    errors.sort_by(|a, b| {
        (b.info.time_secs, b.seq, &b.component).cmp(&(a.info.time_secs, a.seq, &a.component))
    });
    Ok(Read { value: errors, skipped })
}

/// A worker's metrics endpoint, from its heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerEndpoint {
    pub topology: TopologyId,
    pub slot: WorkerSlot,
    pub endpoint: String,
    /// HTTP or HTTPS (the worker's `worker.metrics.tls.*`).
    pub scheme: cluster_state::znode::MetricsScheme,
}

/// The metrics endpoints the workers of `topologies` published in their heartbeats.
pub async fn read_worker_endpoints(
    session: &Session,
    paths: &StormPaths,
    topologies: impl IntoIterator<Item = &TopologyId>,
) -> coord::Result<Read<Vec<WorkerEndpoint>>> {
    let mut skipped = Vec::new();
    let mut endpoints = Vec::new();
    for topology in topologies {
        let read = read_workerbeats(session, paths, topology).await?;
        skipped.extend(read.skipped);
        endpoints.extend(read.value.into_iter().filter_map(|(slot, beat)| {
            let scheme = beat.metrics_scheme;
            Some(WorkerEndpoint {
                topology: topology.clone(),
                slot,
                endpoint: beat.metrics_endpoint?,
                scheme,
            })
        }));
    }
    Ok(Read { value: endpoints, skipped })
}

/// Every workerbeat of `topology` with its slot (the UI's stats when no supervisor reported).
pub async fn read_workerbeats(
    session: &Session,
    paths: &StormPaths,
    topology: &TopologyId,
) -> coord::Result<Read<Vec<(WorkerSlot, WorkerHeartbeat)>>> {
    let mut skipped = Vec::new();
    let mut beats = Vec::new();
    let dir = paths.workerbeats_topology(topology);
    for name in session.children_or_empty(&dir).await? {
        let path = join(&dir, &name);
        let Ok(slot) = WorkerSlot::from_beat_node_name(&name) else {
            skip(&mut skipped, path, "not a <node>-<port> heartbeat name".into());
            continue;
        };
        if let Some((beat, _)) = read_optional::<WorkerHeartbeat>(session, &path, &mut skipped).await? {
            beats.push((slot, beat));
        }
    }
    Ok(Read { value: beats, skipped })
}

/// Reads one node that may be absent or garbage: `Ok(None)` then, with the garbage recorded.
pub async fn read_optional<T: ZnodeData>(
    session: &Session,
    path: &str,
    skipped: &mut Vec<Skipped>,
) -> coord::Result<Option<(T, coord::Stat)>> {
    tolerate(session.read::<T>(path).await, path, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cluster_state::coord::{CreateMode, Ensemble, SessionOptions};
    use cluster_state::ids::TopologyName;
    use cluster_state::znode::TopologyStatus;

    fn base() -> StormBase {
        StormBase {
            name: TopologyName::new("wc").unwrap(),
            launch_time_secs: 1_700_000_000,
            status: TopologyStatus::Active,
            num_workers: 1,
            component_executors: BTreeMap::new(),
            owner: "alice".into(),
            prev_status: None,
            pending_transition: None,
        }
    }

    #[tokio::test]
    async fn garbage_is_skipped_and_counted() {
        let session = Ensemble::in_memory().connect(&SessionOptions::default()).await.unwrap();
        let paths = StormPaths::default();
        let persistent = CreateMode::Persistent.with_parents();
        let good: TopologyId = "wc-1-1700000000".parse().unwrap();
        session.create(&paths.storm(&good), &base().encode(), persistent).await.unwrap();
        session.create("/storm/storms/not-an-id", &base().encode(), persistent).await.unwrap();
        session.create("/storm/storms/wc-2-1700000000", b"\xff garbage", persistent).await.unwrap();
        session.create("/storm/supervisors/sup-1", b"{\"version\":9}", persistent).await.unwrap();

        let read = read_snapshot(&session, &paths, 0, 10).await.unwrap();
        assert_eq!(read.value.storms.keys().collect::<Vec<_>>(), vec![&good]);
        assert!(read.value.supervisors.is_empty() && read.value.assignments.is_empty());
        let mut skipped: Vec<&str> = read.skipped.iter().map(|s| s.path.as_str()).collect();
        skipped.sort();
        assert_eq!(
            skipped,
            ["/storm/storms/not-an-id", "/storm/storms/wc-2-1700000000", "/storm/supervisors/sup-1"]
        );
        assert!(
            read.skipped.iter().any(|s| s.reason.contains("unsupported version 9")),
            "{:?}",
            read.skipped
        );
    }

    #[tokio::test]
    async fn an_empty_cluster_reads_as_empty() {
        let session = Ensemble::in_memory().connect(&SessionOptions::default()).await.unwrap();
        let read = read_snapshot(&session, &StormPaths::default(), 0, 0).await.unwrap();
        assert!(read.value.storms.is_empty() && read.skipped.is_empty());
        let id: TopologyId = "wc-1-1700000000".parse().unwrap();
        assert!(read_errors(&session, &StormPaths::default(), &id).await.unwrap().value.is_empty());
    }

    #[tokio::test]
    async fn errors_come_newest_first_and_garbage_is_skipped() {
        let session = Ensemble::in_memory().connect(&SessionOptions::default()).await.unwrap();
        let paths = StormPaths::default();
        let id: TopologyId = "wc-1-1700000000".parse().unwrap();
        let error = |text: &str, time_secs| {
            ErrorInfo { error: text.into(), time_secs, host: "h".into(), port: 6700 }.encode()
        };
        let split = ComponentId::new("split").unwrap();
        let count = ComponentId::new("count").unwrap();
        let seq = CreateMode::PersistentSequential.with_parents();
        session.create(&paths.error_sequential_prefix(&id, &split), &error("old", 10), seq).await.unwrap();
        session.create(&paths.error_sequential_prefix(&id, &count), &error("newest", 30), seq).await.unwrap();
        session.create(&paths.error_sequential_prefix(&id, &split), &error("newer", 20), seq).await.unwrap();
        session.create(&paths.error_sequential_prefix(&id, &split), b"junk", seq).await.unwrap();
        let read = read_errors(&session, &paths, &id).await.unwrap();
        let texts: Vec<&str> = read.value.iter().map(|e| e.info.error.as_str()).collect();
        assert_eq!(texts, ["newest", "newer", "old"]);
        assert_eq!(read.skipped.len(), 1);
    }
}
