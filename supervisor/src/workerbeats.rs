//! The Storm-layout `/storm/workerbeats/<topology>/<node>-<port>` nodes of this supervisor's
//! workers, written by the supervisor in one `multi` (issue 18).
//!
//! Storm's workers write their own node; at 10 workers a supervisor that is 10 ZooKeeper
//! transactions per interval. Here the supervisor reads its workers' local heartbeat files
//! (as the aggregated heartbeat to nimbus does, [`crate::heartbeat`]) and writes every node
//! whose content changed ([`WorkerHeartbeat::content_differs`]) in one transaction at most
//! every `squall.workerbeats.zk.secs` (Z): ZooKeeper's load is `S / Z`, not `W / Z`. A
//! worker's first node is written at the next supervisor beat, not a round later; a worker
//! that is gone has its node deleted in the next transaction. Workers the supervisor
//! launches are told so (`--workerbeat-writer supervisor`) and write none themselves.
//!
//! A `multi` is all or nothing, and one node must not stop the others: when an operation
//! fails, the server names it ([`coord::Error::MultiFailed`]) and the transaction is sent
//! again without it or with it turned around: a create of a node that exists becomes a set,
//! a set of a node that is gone becomes a create; a create whose parent is gone (the topology
//! was killed, nimbus deleted `/workerbeats/<id>`) is dropped, and that topology's nodes are
//! not written until its workers are gone. Transactions are split to stay well under
//! ZooKeeper's `jute.maxbuffer` (1 MB). The nodes get the ACL the session's security gives
//! any node under the root, as a worker's own writes did.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cluster_state::coord::{self, CreateMode, Op, Session};
use cluster_state::ids::{SupervisorId, TopologyId, WorkerSlot};
use cluster_state::paths::StormPaths;
use cluster_state::znode::{WorkerHeartbeat, ZnodeData};
use tokio::time::Instant;

use crate::heartbeat::BeatSource;
use crate::metrics::SupervisorMetrics;

/// The most node data (and paths) one transaction carries: half of ZooKeeper's default
/// `jute.maxbuffer` (1 MB), leaving room for the request's framing.
pub const MAX_MULTI_BYTES: usize = 512 * 1024;

/// What a round does to one node.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// The node is new to this supervisor (it may exist: then it is set).
    Create(WorkerHeartbeat),
    /// The node was written before and its content changed.
    Set(WorkerHeartbeat),
    /// Its worker is gone.
    Delete,
}

/// A round's changes, pure: `current` (node path -> beat, and whether its round is due: Z
/// has passed since the last round that could write it) against what was `written`. New nodes
/// are always created and nodes no longer current deleted; changed content is written only
/// when due.
pub fn plan(
    written: &BTreeMap<String, WorkerHeartbeat>,
    current: &BTreeMap<String, (WorkerHeartbeat, bool)>,
) -> Vec<(String, Change)> {
    let mut changes = Vec::new();
    for (path, (beat, due)) in current {
        match written.get(path) {
            None => changes.push((path.clone(), Change::Create(beat.clone()))),
            Some(last) if *due && beat.content_differs(last) => {
                changes.push((path.clone(), Change::Set(beat.clone())));
            }
            Some(_) => {}
        }
    }
    changes.extend(written.keys().filter(|p| !current.contains_key(*p)).map(|p| (p.clone(), Change::Delete)));
    changes
}

/// The bytes `change` adds to a transaction.
fn size(path: &str, change: &Change) -> usize {
    path.len()
        + match change {
            Change::Create(beat) | Change::Set(beat) => beat.encode().len(),
            Change::Delete => 0,
        }
}

/// `changes` split into transactions of at most `max_bytes` each (a change larger than that
/// alone in its own), in order.
pub fn batches(changes: Vec<(String, Change)>, max_bytes: usize) -> Vec<Vec<(String, Change)>> {
    let mut out: Vec<Vec<(String, Change)>> = Vec::new();
    let mut bytes = 0;
    for (path, change) in changes {
        let n = size(&path, &change);
        match out.last_mut() {
            Some(batch) if bytes + n <= max_bytes => {
                bytes += n;
                batch.push((path, change));
            }
            _ => {
                bytes = n;
                out.push(vec![(path, change)]);
            }
        }
    }
    out
}

fn op(path: &str, change: &Change) -> Op {
    match change {
        Change::Create(beat) => {
            Op::Create { path: path.to_owned(), data: beat.encode(), mode: CreateMode::Persistent }
        }
        Change::Set(beat) => Op::SetData { path: path.to_owned(), data: beat.encode(), version: None },
        Change::Delete => Op::Delete { path: path.to_owned(), version: None },
    }
}

/// What one transaction did.
#[derive(Debug, Default, PartialEq)]
pub struct Committed {
    /// Changes applied (a delete of a node already gone counts).
    pub applied: Vec<(String, Change)>,
    /// Creates refused because the topology's `/workerbeats/<id>` is gone.
    pub parent_gone: Vec<String>,
    /// Changes left out for another reason (logged).
    pub dropped: Vec<String>,
    /// Transactions sent (1 when nothing failed).
    pub attempts: usize,
}

/// Commits `batch` in one `multi`, sending it again without (or with a turned-around) failing
/// operation until it goes through; see the module docs. Only a failure that is not about one
/// node (connection, session) is returned as an error.
pub async fn commit(session: &Session, mut batch: Vec<(String, Change)>) -> coord::Result<Committed> {
    let mut done = Committed::default();
    // Each operation fails at most twice (a create turned into a set, a set back into a
    // create) before it is dropped, so this ends.
    let mut turned: BTreeSet<String> = BTreeSet::new();
    while !batch.is_empty() {
        done.attempts += 1;
        let ops: Vec<Op> = batch.iter().map(|(path, change)| op(path, change)).collect();
        let (index, source) = match session.multi(&ops).await {
            Ok(_) => {
                done.applied.append(&mut batch);
                return Ok(done);
            }
            Err(coord::Error::MultiFailed { index, source }) if index < batch.len() => (index, *source),
            Err(e) => return Err(e),
        };
        let (path, change) = batch.remove(index);
        let first_failure = turned.insert(path.clone());
        match (source, change) {
            (coord::Error::NodeExists { .. }, Change::Create(beat)) if first_failure => {
                batch.insert(index, (path, Change::Set(beat)));
            }
            (coord::Error::NoNode { .. }, Change::Set(beat)) if first_failure => {
                batch.insert(index, (path, Change::Create(beat)));
            }
            (coord::Error::NoNode { .. }, Change::Create(_)) => done.parent_gone.push(path),
            (coord::Error::NoNode { .. }, Change::Delete) => done.applied.push((path, Change::Delete)),
            (e, _) if e.is_session_lost() || e.is_retryable() => return Err(e),
            (e, _) => {
                tracing::warn!(error = %e, %path, "cannot write a workerbeat node; the others are written without it");
                done.dropped.push(path);
            }
        }
    }
    Ok(done)
}

/// The supervisor's workerbeat writer: call [`Workerbeats::round`] every supervisor beat.
pub struct Workerbeats {
    paths: StormPaths,
    supervisor_id: SupervisorId,
    every: Duration,
    source: Box<dyn BeatSource + Sync>,
    /// What was last written to each node, by path (kept across sessions: the nodes are
    /// persistent; a node changed behind our back is found by the next write).
    written: BTreeMap<String, WorkerHeartbeat>,
    /// When the last round of each Z (`squall.workerbeats.zk.secs`, per topology) was due:
    /// topologies with the same Z share their rounds, so their nodes share transactions.
    rounds: BTreeMap<Duration, Instant>,
    /// Topologies whose `/workerbeats/<id>` is gone: not written while their workers remain.
    gone: BTreeSet<TopologyId>,
    metrics: Option<SupervisorMetrics>,
}

impl std::fmt::Debug for Workerbeats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workerbeats")
            .field("supervisor_id", &self.supervisor_id)
            .field("every", &self.every)
            .field("written", &self.written.len())
            .field("gone", &self.gone)
            .finish_non_exhaustive()
    }
}

impl Workerbeats {
    /// Writes the nodes of `source`'s workers at most every Z: the topology's, as each
    /// worker's heartbeat file says, else `every` (an older worker's).
    pub fn new(
        paths: StormPaths,
        supervisor_id: SupervisorId,
        every: Duration,
        source: Box<dyn BeatSource + Sync>,
    ) -> Self {
        Workerbeats {
            paths,
            supervisor_id,
            every,
            source,
            written: BTreeMap::new(),
            rounds: BTreeMap::new(),
            gone: BTreeSet::new(),
            metrics: None,
        }
    }

    /// Counts transactions and skipped writes in `metrics` (`squall_supervisor_workerbeat_*`).
    pub fn with_metrics(mut self, metrics: SupervisorMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// One round at `now` (the instant of the supervisor's evenly spaced tick, so a round that
    /// took a while does not push the next one a tick late): new nodes, deletions, and, once
    /// `every` has passed since the last such round, every node whose content changed. Returns
    /// the transactions sent.
    pub async fn round(&mut self, session: &Session, now: Instant) -> coord::Result<usize> {
        let beats = self.source.beats();
        let present: BTreeSet<TopologyId> = beats.iter().map(|b| b.topology_id.clone()).collect();
        self.gone.retain(|t| present.contains(t));
        let mut current: BTreeMap<String, (WorkerHeartbeat, Duration)> = BTreeMap::new();
        for local in beats.iter().filter(|b| !self.gone.contains(&b.topology_id)) {
            let slot = WorkerSlot { node: self.supervisor_id.clone(), port: local.port };
            let beat = WorkerHeartbeat::from(local);
            let every = local.workerbeats_zk_secs.map_or(self.every, |secs| Duration::from_secs(secs.max(1)));
            let path = self.paths.workerbeat(&local.topology_id, &slot);
            // One node per slot: a stale file of a replaced worker loses.
            match current.get(&path) {
                Some((WorkerHeartbeat { time_secs, .. }, _)) if *time_secs >= beat.time_secs => {}
                _ => {
                    current.insert(path, (beat, every));
                }
            }
        }
        let used: BTreeSet<Duration> = current.values().map(|(_, every)| *every).collect();
        self.rounds.retain(|every, _| used.contains(every));
        let due: BTreeSet<Duration> = used
            .into_iter()
            .filter(|every| {
                self.rounds.get(every).is_none_or(|at| now.saturating_duration_since(*at) >= *every)
            })
            .collect();
        for every in &due {
            self.rounds.insert(*every, now);
        }
        let current: BTreeMap<String, (WorkerHeartbeat, bool)> =
            current.into_iter().map(|(path, (beat, every))| (path, (beat, due.contains(&every)))).collect();
        let changes = plan(&self.written, &current);
        let mut transactions = 0;
        for batch in batches(changes, MAX_MULTI_BYTES) {
            let done = commit(session, batch).await?;
            transactions += done.attempts;
            if let Some(m) = &self.metrics {
                m.workerbeat_transactions.inc_by(done.attempts as u64);
                m.workerbeat_skipped
                    .with_label_values(&["topology_gone"])
                    .inc_by(done.parent_gone.len() as u64);
                m.workerbeat_skipped.with_label_values(&["refused"]).inc_by(done.dropped.len() as u64);
            }
            for (path, change) in done.applied {
                match change {
                    Change::Create(beat) | Change::Set(beat) => {
                        self.written.insert(path, beat);
                    }
                    Change::Delete => {
                        self.written.remove(&path);
                    }
                }
            }
            for path in done.parent_gone {
                if let Some((beat, _)) = current.get(&path) {
                    tracing::info!(topology = %beat.topology_id, "the topology's workerbeats directory is gone (killed?); not writing its workers' nodes");
                    self.gone.insert(beat.topology_id.clone());
                }
                self.written.remove(&path);
            }
        }
        Ok(transactions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cluster_state::ids::{ExecutorId, TaskId};
    use cluster_state::znode::{ExecutorStats, LocalWorkerHeartbeat, MetricsScheme};

    fn beat(acked: u64) -> WorkerHeartbeat {
        WorkerHeartbeat {
            topology_id: "wc-1-1700000000".parse().unwrap(),
            executor_stats: vec![ExecutorStats {
                executor: ExecutorId::single(TaskId(1)),
                emitted: 0,
                transferred: 0,
                acked,
                failed: 0,
                execute_latency_ms: 0.0,
                process_latency_ms: 0.0,
                complete_latency_ms: 0.0,
            }],
            start_time_secs: 100,
            time_secs: 200 + acked,
            uptime_secs: 100 + acked,
            metrics_endpoint: None,
            metrics_scheme: MetricsScheme::Http,
        }
    }

    fn map(entries: &[(&str, WorkerHeartbeat)]) -> BTreeMap<String, WorkerHeartbeat> {
        entries.iter().map(|(p, b)| ((*p).to_owned(), b.clone())).collect()
    }

    fn due(
        beats: &BTreeMap<String, WorkerHeartbeat>,
        due: bool,
    ) -> BTreeMap<String, (WorkerHeartbeat, bool)> {
        beats.iter().map(|(p, b)| (p.clone(), (b.clone(), due))).collect()
    }

    #[test]
    fn new_nodes_at_once_changed_ones_only_when_due_gone_ones_deleted() {
        let written = map(&[("/a", beat(10)), ("/b", beat(10)), ("/c", beat(10))]);
        // /a's content changed, /b's only in time, /c is gone, /d is new.
        let current =
            map(&[("/a", beat(20)), ("/b", WorkerHeartbeat { time_secs: 999, ..beat(10) }), ("/d", beat(1))]);
        let paths = |changes: Vec<(String, Change)>| {
            changes
                .into_iter()
                .map(|(p, c)| {
                    let kind = match c {
                        Change::Create(_) => "create",
                        Change::Set(_) => "set",
                        Change::Delete => "delete",
                    };
                    format!("{kind} {p}")
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(paths(plan(&written, &due(&current, true))), ["set /a", "create /d", "delete /c"]);
        assert_eq!(paths(plan(&written, &due(&current, false))), ["create /d", "delete /c"]);
        assert!(plan(&current, &due(&current, true)).is_empty());
    }

    #[test]
    fn transactions_stay_under_the_cap_and_a_large_node_goes_alone() {
        let one = size("/a", &Change::Set(beat(1)));
        let changes: Vec<(String, Change)> =
            ["/a", "/b", "/c", "/d", "/e"].iter().map(|p| ((*p).to_owned(), Change::Set(beat(1)))).collect();
        let split = batches(changes.clone(), 2 * one);
        assert_eq!(split.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);
        assert_eq!(batches(changes.clone(), 100 * one).len(), 1);
        assert_eq!(batches(changes, 1).iter().map(Vec::len).collect::<Vec<_>>(), [1, 1, 1, 1, 1]);
    }

    #[test]
    fn a_node_reads_back_as_the_worker_wrote_it() {
        let local = LocalWorkerHeartbeat {
            time_secs: 250,
            topology_id: "wc-1-1700000000".parse().unwrap(),
            executors: vec![ExecutorId::single(TaskId(1))],
            port: 6700,
            start_time_secs: Some(100),
            executor_stats: beat(5).executor_stats,
            metrics_endpoint: Some("h:1".into()),
            metrics_scheme: MetricsScheme::Https,
            workerbeats_zk_secs: None,
        };
        let node = WorkerHeartbeat::from(&local);
        assert_eq!((node.start_time_secs, node.time_secs, node.uptime_secs), (100, 250, 150));
        assert_eq!(node.metrics_endpoint.as_deref(), Some("h:1"));
        assert_eq!(WorkerHeartbeat::decode("/x", &node.encode()).unwrap(), node);
        let old = LocalWorkerHeartbeat { start_time_secs: None, ..local };
        assert_eq!(WorkerHeartbeat::from(&old).uptime_secs, 0);
    }
}
