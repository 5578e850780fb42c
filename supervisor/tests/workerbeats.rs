//! The supervisor writes its workers' `/storm/workerbeats` nodes (issue 18), on a real
//! ZooKeeper: all of them in one transaction, a changed content within
//! `squall.workerbeats.zk.secs`, a node in the way or missing handled, and a killed topology's
//! missing directory stopping none of the other workers' beats.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use cluster_state::coord::{CreateMode, Ensemble, Session, SessionOptions, Stat};
use cluster_state::ids::{ExecutorId, SupervisorId, TaskId, TopologyId, WorkerSlot};
use cluster_state::paths::StormPaths;
use cluster_state::znode::{
    ExecutorStats, LocalWorkerHeartbeat, MetricsScheme, SupervisorInfo, WorkerHeartbeat, ZnodeData,
};
use supervisor::heartbeat::{LocalFiles, RunningWorker};
use supervisor::metrics::SupervisorMetrics;
use supervisor::registration::Registration;
use supervisor::workerbeats::Workerbeats;
use test_harness::{ZkServer, eventually};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The supervisor's beat, and its `squall.workerbeats.zk.secs`.
const BEAT: Duration = Duration::from_millis(200);
const Z: Duration = Duration::from_secs(2);

fn sup() -> SupervisorId {
    SupervisorId::new("sup-1").unwrap()
}

fn local_beat(topology: &TopologyId, port: u16, acked: u64) -> LocalWorkerHeartbeat {
    LocalWorkerHeartbeat {
        time_secs: cluster_state::clock::now_secs(),
        topology_id: topology.clone(),
        executors: vec![ExecutorId::single(TaskId(u32::from(port)))],
        port,
        start_time_secs: Some(1_700_000_000),
        executor_stats: vec![ExecutorStats {
            executor: ExecutorId::single(TaskId(u32::from(port))),
            emitted: acked,
            transferred: acked,
            acked,
            failed: 0,
            execute_latency_ms: 0.5,
            process_latency_ms: 0.5,
            complete_latency_ms: 3.0,
        }],
        metrics_endpoint: None,
        metrics_scheme: MetricsScheme::Http,
        workerbeats_zk_secs: Some(Z.as_secs()),
    }
}

/// What a worker does every second: its local heartbeat file.
fn write_local(dir: &Path, worker: &RunningWorker, acked: u64) {
    let path = LocalWorkerHeartbeat::path(dir, &worker.worker_id);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, local_beat(&worker.topology_id, worker.port, acked).encode()).unwrap();
}

async fn node(session: &Session, path: &str) -> Option<(WorkerHeartbeat, Stat)> {
    let (data, stat) = session.get(path).await.ok()?;
    Some((WorkerHeartbeat::decode(path, &data).unwrap(), stat))
}

fn acked(beat: &WorkerHeartbeat) -> u64 {
    beat.executor_stats[0].acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_transaction_for_all_workers_changes_within_z_and_a_killed_topology_stops_no_one() {
    let ensemble = Ensemble::zookeeper(ZkServer::shared().chroot("supervisor_workerbeats").await);
    let observer = ensemble.connect(&SessionOptions::default()).await.unwrap();
    let paths = StormPaths::default();
    let (t1, t2): (TopologyId, TopologyId) =
        ("wc-1-1700000000".parse().unwrap(), "wc-2-1700000000".parse().unwrap());
    for t in [&t1, &t2] {
        observer
            .create(&paths.workerbeats_topology(t), b"", CreateMode::Persistent.with_parents())
            .await
            .unwrap();
    }
    let workers: Vec<RunningWorker> = [(&t1, 6700), (&t1, 6701), (&t2, 6702)]
        .into_iter()
        .map(|(t, port)| RunningWorker { worker_id: format!("w-{port}"), port, topology_id: t.clone() })
        .collect();
    let beat_path =
        |w: &RunningWorker| paths.workerbeat(&w.topology_id, &WorkerSlot { node: sup(), port: w.port });
    let path: Vec<String> = workers.iter().map(beat_path).collect();
    // A node a previous supervisor (or worker) left: it is taken over, not an error.
    let old = WorkerHeartbeat { time_secs: 1, ..local_beat_node(&t1, 6700, 1) };
    observer.create(&path[0], &old.encode(), CreateMode::Persistent).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    for w in &workers {
        write_local(dir.path(), w, 10);
    }
    let (workers_tx, workers_rx) = watch::channel(workers.clone());
    let source = LocalFiles { local_dir: dir.path().to_owned(), workers: workers_rx };
    let (_ports_tx, used_ports) = watch::channel(vec![6700, 6701, 6702]);
    let metrics = SupervisorMetrics::register(&prometheus::Registry::new()).unwrap();
    let registration = Registration {
        ensemble: ensemble.clone(),
        session_options: SessionOptions::default(),
        paths: paths.clone(),
        info: SupervisorInfo {
            time_secs: 0,
            hostname: "host1".into(),
            supervisor_id: sup(),
            used_ports: vec![],
            all_ports: vec![6700, 6701, 6702],
            uptime_secs: 0,
            version: "0.1.0".into(),
            metrics_endpoint: None,
            metrics_scheme: MetricsScheme::Http,
        },
        used_ports,
        heartbeat_interval: BEAT,
        workerbeats: Some(
            Workerbeats::new(paths.clone(), sup(), Z, Box::new(source)).with_metrics(metrics.clone()),
        ),
    };
    let cancel = CancellationToken::new();
    let task = tokio::spawn(registration.run(cancel.clone()));

    // Every worker's node appears at the supervisor's first beats, all in one transaction.
    let first = eventually(Duration::from_secs(15), "every workerbeat node with acked 10", || async {
        let mut nodes = Vec::new();
        for p in &path {
            nodes.push(node(&observer, p).await.filter(|(b, _)| acked(b) == 10)?);
        }
        Some(nodes)
    })
    .await;
    let zxids: Vec<i64> = first.iter().map(|(_, s)| s.mzxid).collect();
    assert!(zxids.iter().all(|z| *z == zxids[0]), "one transaction writes them all: mzxids {zxids:?}");
    assert_eq!(first[0].0.start_time_secs, 1_700_000_000);
    assert!(first[0].0.time_secs > 1, "the node left behind was overwritten");

    // Two workers' counters move: both reach ZooKeeper within Z (plus a few beats), together;
    // the third's node, unchanged, is not rewritten.
    write_local(dir.path(), &workers[0], 5000);
    write_local(dir.path(), &workers[2], 5000);
    let changed = eventually(Z + Duration::from_secs(3), "the changed counters within Z", || async {
        let a = node(&observer, &path[0]).await.filter(|(b, _)| acked(b) == 5000)?;
        let c = node(&observer, &path[2]).await.filter(|(b, _)| acked(b) == 5000)?;
        Some((a.1, c.1))
    })
    .await;
    assert_eq!(changed.0.mzxid, changed.1.mzxid, "changed nodes are written in one transaction");
    let unchanged = node(&observer, &path[1]).await.unwrap().1;
    assert_eq!(unchanged.mzxid, zxids[1], "a node whose content did not change is not rewritten");

    // Topology 2 is killed (nimbus removes its directory) while its worker still runs, and a
    // node of topology 1 is removed behind the supervisor's back: topology 1's beats go on.
    observer.delete_recursive(&paths.workerbeats_topology(&t2)).await.unwrap();
    observer.delete(&path[1], None).await.unwrap();
    write_local(dir.path(), &workers[0], 90_000);
    write_local(dir.path(), &workers[1], 90_000);
    write_local(dir.path(), &workers[2], 90_000);
    eventually(Z + Duration::from_secs(5), "topology 1's beats after topology 2 was killed", || async {
        let a = node(&observer, &path[0]).await.filter(|(b, _)| acked(b) == 90_000)?;
        let b = node(&observer, &path[1]).await.filter(|(b, _)| acked(b) == 90_000)?;
        (a.1.mzxid == b.1.mzxid).then_some(())
    })
    .await;
    assert_eq!(
        observer.exists(&paths.workerbeats_topology(&t2)).await.unwrap(),
        None,
        "no killed topology is recreated"
    );
    let gone = metrics.workerbeat_skipped.with_label_values(&["topology_gone"]).get();
    assert_eq!(gone, 1, "the killed topology's node was tried once, then left out");
    assert_eq!(metrics.workerbeat_skipped.with_label_values(&["refused"]).get(), 0);

    // A worker that stops has its node removed.
    workers_tx.send(workers[..1].to_vec()).unwrap();
    eventually(Duration::from_secs(10), "the stopped worker's node to go", || async {
        observer.exists(&path[1]).await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(observer.exists(&path[0]).await.unwrap().is_some());

    cancel.cancel();
    task.await.unwrap();
    // The first write (one taken-over node: two tries), two changes, the kill (the missing
    // parent and the missing node: up to three tries), the worker gone: transactions grow with
    // rounds, not with workers.
    let sent = metrics.workerbeat_transactions.get();
    assert!((4..=12).contains(&sent), "{sent} workerbeat transactions");
}

/// The node the supervisor writes for [`local_beat`].
fn local_beat_node(topology: &TopologyId, port: u16, acked: u64) -> WorkerHeartbeat {
    WorkerHeartbeat::from(&local_beat(topology, port, acked))
}
