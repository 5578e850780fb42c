//! The sync task's assignment cache against a real nimbus on a real ZooKeeper: a supervisor
//! reads only the assignments that name its node (found through its node's index,
//! `/storm/node-assignments/<node>`), still picks up a reassignment onto it and a removal from
//! it, falls back to reading every assignment while it has no index, and a restarted nimbus
//! repairs an index that was lost or damaged.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::time::Duration;

use cluster_state::api::SubmitTopology;
use cluster_state::clock::now_secs;
use cluster_state::coord::{CreateMode, Ensemble, Session, SessionOptions};
use cluster_state::ids::{SupervisorId, TopologyId};
use cluster_state::paths::StormPaths;
use cluster_state::znode::{NodeAssignments, SupervisorInfo, ZnodeData};
use nimbus::NimbusConfig;
use nimbus_client::NimbusClient;
use supervisor::sync::AssignmentCache;
use test_harness::{ZkServer, eventually};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(30);

/// A supervisor's registration, ephemeral in a session of its own: closing it is its death.
async fn register(ensemble: &Ensemble, paths: &StormPaths, id: &SupervisorId) -> Session {
    let session = ensemble.connect(&SessionOptions::default()).await.unwrap();
    let info = SupervisorInfo::starting(id.clone(), format!("host-{id}"), vec![6700, 6701], now_secs());
    session
        .create(&paths.supervisor(id), &info.encode(), CreateMode::Ephemeral.with_parents())
        .await
        .unwrap();
    session
}

/// One supervisor's sync side: its own session and cache.
struct Syncer {
    node: SupervisorId,
    session: Session,
    cache: AssignmentCache,
}

impl Syncer {
    fn holds(&self) -> BTreeSet<TopologyId> {
        self.cache.assignments().keys().cloned().collect()
    }
}

/// Refreshes every cache (as the sync loop does on a watch or a tick) until `done` holds.
async fn refresh_until(
    syncers: &mut [Syncer],
    paths: &StormPaths,
    what: &str,
    done: impl Fn(&[Syncer]) -> bool,
) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        for s in syncers.iter_mut() {
            s.cache.refresh(&s.session, paths).await.unwrap();
        }
        if done(syncers) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out after {DEADLINE:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One worker running one spout.
fn topology_file(name: &str) -> String {
    format!(
        "name: {name}\nconfig: {{topology.workers: 1}}\nspouts: [{{id: s, className: sentence-generator}}]\n"
    )
}

/// Submits a one-worker topology named `name` (once nimbus answers).
async fn submit(client: &NimbusClient, name: &str) -> TopologyId {
    let file = topology_file(name);
    let upload =
        eventually(DEADLINE, "an upload", || async { client.upload(file.as_bytes(), |_| {}).await.ok() })
            .await;
    client.submit(&SubmitTopology::file(upload, "t")).await.unwrap().id
}

async fn start_nimbus(
    ensemble: &Ensemble,
    dir: &std::path::Path,
) -> (NimbusClient, CancellationToken, tokio::task::JoinHandle<Result<(), nimbus::NimbusError>>) {
    // The launch grace (120 s) covers the test: only the supervisors' nodes decide liveness.
    let config = NimbusConfig { local_dir: dir.to_owned(), monitor_freq_secs: 1, ..Default::default() };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = NimbusClient::new(listener.local_addr().unwrap().to_string(), None);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (shutdown, ensemble) = (shutdown.clone(), ensemble.clone());
        async move { nimbus::serve(config, listener, ensemble, &prometheus::Registry::new(), shutdown).await }
    });
    (client, shutdown, task)
}

async fn index_of(look: &Session, paths: &StormPaths, node: &SupervisorId) -> Option<BTreeSet<TopologyId>> {
    let (index, _) = look.read::<NodeAssignments>(&paths.node_assignments(node)).await.ok()?;
    Some(index.topologies)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_reads_only_the_assignments_naming_its_node() {
    let ensemble = Ensemble::zookeeper(ZkServer::shared().chroot("node-index").await);
    let paths = StormPaths::default();
    let look = ensemble.connect(&SessionOptions::default()).await.unwrap();
    let nodes: Vec<SupervisorId> = ["sup-1", "sup-2", "sup-3"].iter().map(|n| n.parse().unwrap()).collect();
    let mut registrations = Vec::new();
    for node in &nodes {
        registrations.push(Some(register(&ensemble, &paths, node).await));
    }
    let dir = tempfile::tempdir().unwrap();
    let (client, shutdown, task) = start_nimbus(&ensemble, dir.path()).await;
    // Every registered supervisor gets an index, empty while it runs nothing.
    for node in &nodes {
        eventually(DEADLINE, "an empty index for every supervisor", || async {
            index_of(&look, &paths, node).await.filter(BTreeSet::is_empty)
        })
        .await;
    }
    let mut syncers = Vec::new();
    for node in &nodes {
        let session = ensemble.connect(&SessionOptions::default()).await.unwrap();
        syncers.push(Syncer { node: node.clone(), session, cache: AssignmentCache::new(node.clone()) });
    }
    refresh_until(&mut syncers, &paths, "every cache on its index", |s| s.iter().all(|s| s.cache.indexed()))
        .await;

    // Two one-worker topologies: each lands on one node, and only that node reads it.
    let mut ids = Vec::new();
    for name in ["alpha", "beta"] {
        ids.push(submit(&client, name).await);
    }
    let (alpha, beta) = (ids[0].clone(), ids[1].clone());
    let all: BTreeSet<TopologyId> = ids.iter().cloned().collect();
    refresh_until(&mut syncers, &paths, "each topology held by one node", |s| {
        let held: Vec<TopologyId> = s.iter().flat_map(Syncer::holds).collect();
        held.len() == 2 && held.iter().cloned().collect::<BTreeSet<_>>() == all
    })
    .await;
    for s in &syncers {
        assert!(s.cache.indexed(), "{}: on its index", s.node);
        assert_eq!(
            s.cache.assignment_reads(),
            s.holds().len() as u64,
            "{}: read only the assignments naming it (without the index: all {} of them)",
            s.node,
            all.len()
        );
    }

    // Reassignment onto a node: alpha's supervisor dies; the node alpha moves to reads it once,
    // nobody else reads anything.
    let was = syncers.iter().position(|s| s.holds().contains(&alpha)).unwrap();
    registrations[was].take().unwrap().close().await.unwrap();
    let dead = syncers.remove(was);
    let reads_before: Vec<u64> = syncers.iter().map(|s| s.cache.assignment_reads()).collect();
    let holds_before: Vec<BTreeSet<TopologyId>> = syncers.iter().map(Syncer::holds).collect();
    refresh_until(&mut syncers, &paths, "alpha on a living node", |s| {
        s.iter().any(|s| s.holds().contains(&alpha))
    })
    .await;
    for (i, s) in syncers.iter().enumerate() {
        let got_alpha = s.holds().contains(&alpha);
        assert_eq!(
            s.cache.assignment_reads() - reads_before[i],
            u64::from(got_alpha),
            "{}: one read for the assignment moved onto it, none otherwise",
            s.node
        );
        if !got_alpha {
            assert_eq!(s.holds(), holds_before[i], "{}: unchanged", s.node);
        }
    }
    eventually(DEADLINE, "the dead node's index to go", || async {
        (index_of(&look, &paths, &dead.node).await.is_none()).then_some(())
    })
    .await;

    // Removal from a node: beta is killed; its node drops it, the others read nothing.
    let reads_before: Vec<u64> = syncers.iter().map(|s| s.cache.assignment_reads()).collect();
    let beta_node = syncers.iter().position(|s| s.holds().contains(&beta)).unwrap();
    client.kill(&beta, 0).await.unwrap();
    refresh_until(&mut syncers, &paths, "beta dropped", |s| s.iter().all(|s| !s.holds().contains(&beta)))
        .await;
    eventually(DEADLINE, "beta out of its node's index", || async {
        let index = index_of(&look, &paths, &syncers[beta_node].node).await?;
        (!index.contains(&beta)).then_some(())
    })
    .await;
    for (i, s) in syncers.iter().enumerate() {
        let at_most = reads_before[i] + u64::from(i == beta_node);
        assert!(s.cache.assignment_reads() <= at_most, "{}: read only what named it", s.node);
    }

    // A supervisor nimbus has not seen yet has no index: it reads every assignment, then
    // switches to its index once it registers.
    let late: SupervisorId = "sup-late".parse().unwrap();
    let session = ensemble.connect(&SessionOptions::default()).await.unwrap();
    let mut late_sync =
        vec![Syncer { node: late.clone(), session, cache: AssignmentCache::new(late.clone()) }];
    refresh_until(&mut late_sync, &paths, "the late node's first refresh", |_| true).await;
    assert!(!late_sync[0].cache.indexed(), "no index yet");
    assert!(late_sync[0].cache.assignment_reads() >= 1, "without an index it reads every assignment");
    let _late_registration = register(&ensemble, &paths, &late).await;
    refresh_until(&mut late_sync, &paths, "the late node on its index", |s| s[0].cache.indexed()).await;
    assert!(late_sync[0].holds().is_empty());

    // A restarted nimbus repairs an index lost or damaged meanwhile (as after a nimbus that
    // died between an assignment and its index, or an older nimbus that led).
    shutdown.cancel();
    task.await.unwrap().unwrap();
    let holder = syncers.iter().find(|s| s.holds().contains(&alpha)).unwrap().node.clone();
    let other = syncers.iter().find(|s| s.node != holder).unwrap().node.clone();
    look.delete(&paths.node_assignments(&holder), None).await.unwrap();
    look.set(&paths.node_assignments(&other), b"garbage", None).await.unwrap();
    let (_client, shutdown, task) = start_nimbus(&ensemble, dir.path()).await;
    eventually(DEADLINE, "the lost index rebuilt", || async {
        (index_of(&look, &paths, &holder).await? == BTreeSet::from([alpha.clone()])).then_some(())
    })
    .await;
    eventually(DEADLINE, "the damaged index rewritten", || async {
        index_of(&look, &paths, &other).await.filter(|t| !t.contains(&alpha))
    })
    .await;
    refresh_until(&mut syncers, &paths, "the caches back on their indexes, alpha still held", |s| {
        s.iter().all(|s| s.cache.indexed()) && s.iter().any(|s| s.holds().contains(&alpha))
    })
    .await;
    shutdown.cancel();
    task.await.unwrap().unwrap();
}
