//! The per-node assignment index, `/node-assignments/<supervisor-id>` (Squall's, not Storm's).
//!
//! In Storm's layout a supervisor cannot tell which assignments name it without reading them
//! all, so a change of one assignment is read by every supervisor: at 2,000 supervisors and 180
//! assignments of ~28 KB rewritten by a reassignment, ~9 GB through ZooKeeper. Storm 2 answered
//! with RPC (nimbus sends each supervisor its own assignments); here the leader keeps, per node,
//! the ids of the topologies whose assignment names it ([`NodeAssignments`]), and a supervisor
//! watches its own index and reads only the assignments listed there. `/assignments/<id>` stays
//! as it is and stays the truth (tools read it); the index only says where to look.
//!
//! An index exists for every node an assignment names and for every registered supervisor
//! (empty: it runs nothing, and need not read anything), and goes when neither holds. It is
//! written only when its set changes, by the monitor pass, after the pass's assignment writes
//! (so a supervisor reading a new entry finds the assignment already written), batched into
//! multis each fenced like every leader write. Steady state: no write. What the index holds is
//! remembered between passes; a new term, or a write that failed, reads it back from ZooKeeper
//! first, so a new leader repairs whatever an older one (or one that died between an
//! assignment and its index) left behind.

use std::collections::{BTreeMap, BTreeSet};

use cluster_state::coord::{self, CreateMode, Op, Session};
use cluster_state::ids::{SupervisorId, TopologyId, WorkerSlot};
use cluster_state::paths::StormPaths;
use cluster_state::znode::{NodeAssignments, ZnodeData};
use futures::StreamExt;

use crate::leader::Leadership;

/// Index writes per multi: each is ~50 bytes plus ~30 per topology listed, so a multi stays far
/// below ZooKeeper's `jute.maxbuffer` (1 MB) even for nodes running hundreds of topologies.
pub const OPS_PER_MULTI: usize = 100;

/// Index reads in flight when a term starts.
pub const READS_IN_FLIGHT: usize = 32;

/// What ZooKeeper holds per node: the topologies listed, or `None` for a node whose data does
/// not decode (rewritten or removed by the next write).
pub type StoredIndex = BTreeMap<SupervisorId, Option<BTreeSet<TopologyId>>>;

/// The index the assignments call for: per node, the topologies with a slot on it; every
/// registered supervisor has one (maybe empty).
pub fn desired_index<'a>(
    assignments: impl IntoIterator<Item = (&'a TopologyId, &'a BTreeSet<WorkerSlot>)>,
    registered: impl IntoIterator<Item = &'a SupervisorId>,
) -> BTreeMap<SupervisorId, BTreeSet<TopologyId>> {
    let mut index: BTreeMap<SupervisorId, BTreeSet<TopologyId>> =
        registered.into_iter().map(|node| (node.clone(), BTreeSet::new())).collect();
    for (topology, slots) in assignments {
        for slot in slots {
            index.entry(slot.node.clone()).or_default().insert(topology.clone());
        }
    }
    index
}

/// One write that brings a node's index to what it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexChange {
    Create(SupervisorId, BTreeSet<TopologyId>),
    Set(SupervisorId, BTreeSet<TopologyId>),
    Delete(SupervisorId),
}

/// The writes turning `stored` into `desired` (none when they agree), in node order.
pub fn diff_index(
    stored: &StoredIndex,
    desired: &BTreeMap<SupervisorId, BTreeSet<TopologyId>>,
) -> Vec<IndexChange> {
    let mut changes = Vec::new();
    for (node, topologies) in desired {
        match stored.get(node) {
            None => changes.push(IndexChange::Create(node.clone(), topologies.clone())),
            Some(Some(held)) if held == topologies => {}
            Some(_) => changes.push(IndexChange::Set(node.clone(), topologies.clone())),
        }
    }
    for node in stored.keys() {
        if !desired.contains_key(node) {
            changes.push(IndexChange::Delete(node.clone()));
        }
    }
    changes
}

/// Reads every index node, [`READS_IN_FLIGHT`] at a time (a new term at 2,000 supervisors
/// reads 2,000 nodes once); a node removed meanwhile is left out, one that does not decode is
/// `None` (logged).
pub async fn read_index(session: &Session, paths: &StormPaths) -> coord::Result<StoredIndex> {
    let dir = paths.node_assignments_dir();
    let names = match session.children(&dir).await {
        Ok(names) => names,
        Err(coord::Error::NoNode { .. }) => return Ok(StoredIndex::new()),
        Err(e) => return Err(e),
    };
    let mut nodes = Vec::new();
    for name in names {
        match name.parse::<SupervisorId>() {
            Ok(node) => nodes.push(node),
            Err(_) => {
                tracing::warn!(path = %coord::join(&dir, &name), "ignoring a node index with a bad name")
            }
        }
    }
    let mut reads = futures::stream::iter(nodes.into_iter().map(|node| async move {
        let path = paths.node_assignments(&node);
        let read = session.get(&path).await;
        (node, path, read)
    }))
    .buffer_unordered(READS_IN_FLIGHT);
    let mut stored = StoredIndex::new();
    while let Some((node, path, read)) = reads.next().await {
        match read {
            Ok((data, _)) => {
                let topologies = match NodeAssignments::decode(&path, &data) {
                    Ok(index) => Some(index.topologies),
                    Err(e) => {
                        tracing::warn!(error = %e, "a node index does not decode; it is rewritten");
                        None
                    }
                };
                stored.insert(node, topologies);
            }
            Err(coord::Error::NoNode { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(stored)
}

/// Applies `changes` in fenced multis of at most [`OPS_PER_MULTI`], updating `stored` as each
/// multi commits. Returns the number of nodes written. A failed fence is the leadership's
/// refusal (this nimbus steps down); any other error leaves `stored` as far as it got, and the
/// caller reads the index back before trying again.
pub async fn write_index(
    session: &Session,
    leadership: &Leadership,
    paths: &StormPaths,
    stored: &mut StoredIndex,
    changes: Vec<IndexChange>,
) -> coord::Result<usize> {
    if changes.is_empty() {
        return Ok(0);
    }
    session.ensure_path(&paths.node_assignments_dir()).await?;
    let mut written = 0;
    for chunk in changes.chunks(OPS_PER_MULTI) {
        let mut ops: Vec<Op> = leadership.fence_op()?.into_iter().collect();
        let fenced = !ops.is_empty();
        for change in chunk {
            ops.push(match change {
                IndexChange::Create(node, topologies) => Op::Create {
                    path: paths.node_assignments(node),
                    data: NodeAssignments { topologies: topologies.clone() }.encode(),
                    mode: CreateMode::Persistent,
                },
                IndexChange::Set(node, topologies) => Op::SetData {
                    path: paths.node_assignments(node),
                    data: NodeAssignments { topologies: topologies.clone() }.encode(),
                    version: None,
                },
                IndexChange::Delete(node) => Op::Delete { path: paths.node_assignments(node), version: None },
            });
        }
        match session.multi(&ops).await {
            Ok(_) => {}
            Err(coord::Error::MultiFailed { index: 0, .. }) if fenced => {
                return Err(leadership.refused(&ops[0]));
            }
            Err(e) => return Err(e),
        }
        for change in chunk {
            match change {
                IndexChange::Create(node, topologies) | IndexChange::Set(node, topologies) => {
                    stored.insert(node.clone(), Some(topologies.clone()));
                }
                IndexChange::Delete(node) => {
                    stored.remove(node);
                }
            }
        }
        written += chunk.len();
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(s: &str) -> SupervisorId {
        s.parse().unwrap()
    }

    fn topology(s: &str) -> TopologyId {
        s.parse().unwrap()
    }

    fn slots(nodes: &[&str]) -> BTreeSet<WorkerSlot> {
        nodes.iter().map(|n| WorkerSlot { node: node(n), port: 6700 }).collect()
    }

    fn set(ids: &[&str]) -> BTreeSet<TopologyId> {
        ids.iter().map(|t| topology(t)).collect()
    }

    #[test]
    fn the_index_lists_per_node_the_topologies_naming_it_and_every_registered_supervisor() {
        let (a, b) = (topology("a-1-1"), topology("b-2-1"));
        let (slots_a, slots_b) = (slots(&["s1", "s2"]), slots(&["s2", "gone"]));
        let registered = [node("s1"), node("s2"), node("idle")];
        let index = desired_index([(&a, &slots_a), (&b, &slots_b)], &registered);
        assert_eq!(
            index,
            BTreeMap::from([
                (node("gone"), set(&["b-2-1"])),
                (node("idle"), set(&[])),
                (node("s1"), set(&["a-1-1"])),
                (node("s2"), set(&["a-1-1", "b-2-1"])),
            ])
        );
    }

    #[test]
    fn only_what_differs_is_written() {
        let desired = BTreeMap::from([
            (node("same"), set(&["a-1-1"])),
            (node("grew"), set(&["a-1-1", "b-2-1"])),
            (node("new"), set(&[])),
            (node("garbage"), set(&["a-1-1"])),
        ]);
        let stored = StoredIndex::from([
            (node("same"), Some(set(&["a-1-1"]))),
            (node("grew"), Some(set(&["a-1-1"]))),
            (node("garbage"), None),
            (node("dead"), Some(set(&["a-1-1"]))),
        ]);
        assert_eq!(
            diff_index(&stored, &desired),
            [
                IndexChange::Set(node("garbage"), set(&["a-1-1"])),
                IndexChange::Set(node("grew"), set(&["a-1-1", "b-2-1"])),
                IndexChange::Create(node("new"), set(&[])),
                IndexChange::Delete(node("dead")),
            ]
        );
        let agreed: StoredIndex = desired.iter().map(|(n, t)| (n.clone(), Some(t.clone()))).collect();
        assert!(diff_index(&agreed, &desired).is_empty(), "steady state writes nothing");
    }
}
