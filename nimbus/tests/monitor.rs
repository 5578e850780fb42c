//! Reassignment as Storm's scheduler does it, against the whole daemon on a real ZooKeeper:
//! when a supervisor dies, only its executors move; a slot whose executors are all alive is
//! never touched (its supervisor would restart the worker), even when the cluster has no free
//! slot left for the dead ones, which then wait for one.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cluster_state::api::SubmitTopology;
use cluster_state::clock::now_secs;
use cluster_state::coord::{CreateMode, Ensemble, Session, SessionOptions};
use cluster_state::ids::{ExecutorId, SupervisorId, TopologyId, WorkerSlot};
use cluster_state::paths::StormPaths;
use cluster_state::znode::{Assignment, SupervisorInfo, ZnodeData};
use nimbus::NimbusConfig;
use nimbus_client::NimbusClient;
use test_harness::{ZkServer, eventually};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(30);

/// A supervisor's node, ephemeral in a session of its own: closing the session is its death.
async fn supervisor(ensemble: &Ensemble, paths: &StormPaths, name: &str) -> Session {
    let session = ensemble.connect(&SessionOptions::default()).await.unwrap();
    let id = SupervisorId::new(name).unwrap();
    let info = SupervisorInfo::starting(id.clone(), format!("host-{name}"), vec![6700, 6701], now_secs());
    session
        .create(&paths.supervisor(&id), &info.encode(), CreateMode::Ephemeral.with_parents())
        .await
        .unwrap();
    session
}

/// Four workers of three executors each (4 spouts, 4 splits, 4 ackers).
fn topology_file(name: &str) -> String {
    format!(
        "name: {name}\nconfig: {{topology.workers: 4}}\nspouts:\n  - {{id: sentences, className: sentence-generator, parallelism: 4}}\n\
         bolts:\n  - {{id: split, className: split-sentence, parallelism: 4}}\n"
    )
}

/// Executor -> (slot, start time), from the stored assignment.
async fn placed(
    session: &Session,
    paths: &StormPaths,
    id: &TopologyId,
) -> BTreeMap<ExecutorId, (WorkerSlot, u64)> {
    let Ok((a, _)) = session.read::<Assignment>(&paths.assignment(id)).await else { return BTreeMap::new() };
    a.executors.iter().map(|e| (e.executor, (e.slot(), e.start_time_secs))).collect()
}

fn counter(registry: &prometheus::Registry, name: &str) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|family| family.name() == name)
        .flat_map(|family| family.get_metric().iter().map(|m| m.get_counter().get_value()))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_supervisor_moves_only_its_own_executors() {
    let ensemble = Ensemble::zookeeper(ZkServer::shared().chroot("only-the-dead-move").await);
    let paths = StormPaths::default();
    let look = ensemble.connect(&SessionOptions::default()).await.unwrap();
    // Four supervisors of two slots: two topologies of four workers fill all eight.
    let mut supervisors = BTreeMap::new();
    for name in ["sup-1", "sup-2", "sup-3", "sup-4"] {
        supervisors.insert(name, supervisor(&ensemble, &paths, name).await);
    }
    let dir = tempfile::tempdir().unwrap();
    // The launch grace (120 s) covers the test: executors count as alive without heartbeats,
    // so only the supervisors' nodes decide.
    let config =
        NimbusConfig { local_dir: dir.path().to_owned(), monitor_freq_secs: 1, ..Default::default() };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = NimbusClient::new(listener.local_addr().unwrap().to_string(), None);
    let registry = prometheus::Registry::new();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (shutdown, ensemble, registry) = (shutdown.clone(), ensemble.clone(), registry.clone());
        async move { nimbus::serve(config, listener, ensemble, &registry, shutdown).await }
    });
    let mut ids = Vec::new();
    for name in ["alpha", "beta"] {
        let upload = eventually(DEADLINE, "nimbus to take an upload", || async {
            client.upload(topology_file(name).as_bytes(), |_| {}).await.ok()
        })
        .await;
        ids.push(client.submit(&SubmitTopology::file(upload, "t")).await.unwrap().id);
    }
    let mut before = BTreeMap::new();
    for id in &ids {
        let placed = eventually(DEADLINE, "the first assignment", || async {
            Some(placed(&look, &paths, id).await).filter(|p| p.len() == 12)
        })
        .await;
        before.insert(id.clone(), placed);
    }
    let slots: BTreeSet<&WorkerSlot> = before.values().flat_map(|p| p.values().map(|(s, _)| s)).collect();
    assert_eq!(slots.len(), 8, "the two topologies fill the cluster");
    let moved_before = counter(&registry, "squall_nimbus_executors_reassigned_total");

    // sup-2 dies. No slot is free: its executors wait, and nothing else changes.
    let dead = SupervisorId::new("sup-2").unwrap();
    supervisors.remove("sup-2").unwrap().close().await.unwrap();
    let on_dead = |p: &BTreeMap<ExecutorId, (WorkerSlot, u64)>| {
        p.iter().filter(|(_, (s, _))| s.node == dead).map(|(e, _)| *e).collect::<BTreeSet<_>>()
    };
    for id in &ids {
        let after = eventually(DEADLINE, "sup-2's executors to leave the assignment", || async {
            Some(placed(&look, &paths, id).await).filter(|p| on_dead(p).is_empty())
        })
        .await;
        let mut survivors = before[id].clone();
        survivors.retain(|_, (s, _)| s.node != dead);
        assert_eq!(after, survivors, "{id}: the living slots keep exactly their executors and start times");
    }

    // A new supervisor brings free slots: the waiting executors go there, and only they move.
    supervisors.insert("sup-5", supervisor(&ensemble, &paths, "sup-5").await);
    let mut moved = 0;
    for id in &ids {
        let waiting = on_dead(&before[id]);
        let after = eventually(DEADLINE, "the waiting executors to get sup-5's slots", || async {
            Some(placed(&look, &paths, id).await).filter(|p| p.len() == 12)
        })
        .await;
        for (executor, (slot, start)) in &after {
            if waiting.contains(executor) {
                assert_eq!(slot.node.as_str(), "sup-5", "{id}: {executor:?} went to a free slot");
                moved += 1;
            } else {
                assert_eq!(&before[id][executor], &(slot.clone(), *start), "{id}: {executor:?} stayed");
            }
        }
    }
    assert_eq!(moved, 6, "sup-2 ran two workers of three executors");
    let counted = counter(&registry, "squall_nimbus_executors_reassigned_total") - moved_before;
    assert_eq!(counted, f64::from(moved), "nimbus counts exactly the executors that moved");

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap().unwrap();
}
