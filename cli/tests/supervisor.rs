//! A supervisor runs real workers: ZooKeeper (the harness), nimbus serving the topology's code,
//! the supervisor daemon launching `squall worker` processes for its assignment, the workers
//! processing tuples between themselves; a worker killed with SIGKILL is replaced.
//!
//! Nimbus's submit and scheduler are not wired yet, so the test writes what nimbus would: the
//! base record and the assignment, computed with the same task layout nimbus uses.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cluster_state::code::CodeFile;
use cluster_state::coord::{CreateMode, Ensemble, Session, SessionOptions};
use cluster_state::ids::{SupervisorId, TopologyId, TopologyName, WorkerSlot};
use cluster_state::layout::TaskLayout;
use cluster_state::paths::StormPaths;
use cluster_state::znode::{
    Assignment, ExecutorAssignment, StormBase, SupervisorInfo, TopologyStatus, WorkerHeartbeat, ZnodeData,
};
use nimbus::code_store::{CodeStore, CodeStoreLimits, sha256_hex};
use supervisor::daemon::{SupervisorConfig, WorkerLaunch};
use supervisor::launch::ProcessLauncher;
use test_harness::ZkServer;
use tokio_util::sync::CancellationToken;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Kills every process whose command line mentions `marker` (the test's temp dir), so no worker
/// outlives the test, whatever happens in it.
struct KillWorkers(String);

fn pids_mentioning(marker: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(marker)
        {
            pids.push(pid);
        }
    }
    pids
}

impl Drop for KillWorkers {
    fn drop(&mut self) {
        for pid in pids_mentioning(&self.0) {
            let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
}

async fn beat(
    session: &Session,
    paths: &StormPaths,
    id: &TopologyId,
    slot: &WorkerSlot,
) -> Option<WorkerHeartbeat> {
    session.read::<WorkerHeartbeat>(&paths.workerbeat(id, slot)).await.ok().map(|(b, _)| b)
}

fn acked(beat: &WorkerHeartbeat) -> u64 {
    beat.executor_stats.iter().map(|s| s.acked).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supervisor_runs_workers_and_replaces_a_killed_one() {
    let root = tempfile::tempdir().unwrap();
    let marker = root.path().display().to_string();
    let _cleanup = KillWorkers(marker.clone());
    let connect = ZkServer::shared().chroot("supervisor_runs_workers").await;
    let ensemble = Ensemble::zookeeper(connect.clone());
    let paths = StormPaths::default();
    let session = ensemble.connect(&SessionOptions::default()).await.unwrap();

    // Nimbus, holding the word-count topology's code.
    let yaml =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/wordcount.yaml")).unwrap();
    let id: TopologyId = "wordcount-1-1700000000".parse().unwrap();
    let nimbus_dir = root.path().join("nimbus-local");
    {
        let store = CodeStore::open(nimbus_dir.join("nimbus"), CodeStoreLimits::default()).await.unwrap();
        let upload = store.begin(yaml.len() as u64).await.unwrap();
        store.chunk(upload, 0, &yaml).await.unwrap();
        let upload = store.finish(upload, &sha256_hex(&yaml)).await.unwrap();
        store.install(&upload, &id, CodeFile::Topology).await.unwrap();
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let nimbus_address = listener.local_addr().unwrap().to_string();
    let stop = CancellationToken::new();
    let nimbus_config = nimbus::NimbusConfig { local_dir: nimbus_dir, ..nimbus::NimbusConfig::default() };
    let (nimbus_ensemble, nimbus_stop) = (ensemble.clone(), stop.clone());
    tokio::spawn(async move {
        let registry = prometheus::Registry::new();
        let _ = nimbus::serve(nimbus_config, listener, nimbus_ensemble, &registry, nimbus_stop).await;
    });

    // The supervisor, offering two ports.
    let ports = [free_port(), free_port()];
    let local_dir: PathBuf = root.path().join("supervisor-local");
    let config = SupervisorConfig {
        local_dir: local_dir.clone(),
        slots_ports: ports.to_vec(),
        monitor_frequency_secs: 1,
        heartbeat_frequency_secs: 1,
        worker_timeout_secs: 10,
        worker_start_timeout_secs: 60,
        worker_shutdown_sleep_secs: 1,
        nimbus_address,
        hostname: Some("127.0.0.1".into()),
        ..SupervisorConfig::default()
    };
    let launch = WorkerLaunch { squall: env!("CARGO_BIN_EXE_squall").into(), zookeeper: connect.clone() };
    let supervisor_stop = stop.child_token();
    let daemon = tokio::spawn(supervisor::daemon::run(
        config,
        ensemble.clone(),
        Arc::new(ProcessLauncher::new()),
        launch,
        supervisor_stop.clone(),
    ));

    // What nimbus would do: find the supervisor, write the base record and an assignment that
    // spreads the executors over both ports.
    let supervisor: SupervisorId = eventually("the supervisor to register", || async {
        let children = session.children(&paths.supervisors_dir()).await.ok()?;
        let child = children.into_iter().next()?;
        let (info, _) = session.read::<SupervisorInfo>(&paths.supervisor(&child.parse().ok()?)).await.ok()?;
        Some(info.supervisor_id)
    })
    .await;
    let topology = worker::Registry::with_builtins().load_str(std::str::from_utf8(&yaml).unwrap()).unwrap();
    let layout = TaskLayout::compute(&topology.component_parallelism());
    let slots: Vec<WorkerSlot> =
        ports.iter().map(|&port| WorkerSlot { node: supervisor.clone(), port }).collect();
    let assignment = Assignment {
        master_code_dir: "nimbus".into(),
        node_host: [(supervisor.clone(), "127.0.0.1".to_owned())].into(),
        executors: layout
            .executors
            .keys()
            .enumerate()
            .map(|(i, executor)| ExecutorAssignment {
                executor: *executor,
                node: supervisor.clone(),
                port: slots[i % 2].port,
                start_time_secs: 1,
            })
            .collect(),
    };
    let base = StormBase {
        name: TopologyName::new("wordcount").unwrap(),
        launch_time_secs: 1_700_000_000,
        status: TopologyStatus::Active,
        num_workers: 2,
        component_executors: topology.component_executors(),
        owner: "test".into(),
        prev_status: None,
        pending_transition: None,
    };
    session.create(&paths.storm(&id), &base.encode(), CreateMode::Persistent.with_parents()).await.unwrap();
    session.ensure_path(&paths.workerbeats_topology(&id)).await.unwrap();
    session
        .create(&paths.assignment(&id), &assignment.encode(), CreateMode::Persistent.with_parents())
        .await
        .unwrap();

    // Both workers run and tuples flow between them.
    for slot in &slots {
        eventually("both workers to process tuples", || async {
            beat(&session, &paths, &id, slot).await.filter(|b| acked(b) > 0).map(|_| ())
        })
        .await;
    }

    // kill -9 one worker: the supervisor starts another, which beats and processes again.
    let workers_dir = local_dir.join("workers");
    let killed_id = std::fs::read_dir(&workers_dir).unwrap().flatten().next().unwrap().file_name();
    let killed_id = killed_id.to_string_lossy().into_owned();
    let pids = pids_mentioning(&killed_id);
    assert!(!pids.is_empty(), "the worker process {killed_id} runs");
    for pid in &pids {
        std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    }
    eventually("a replacement worker", || async {
        let ids: BTreeSet<String> = std::fs::read_dir(&workers_dir)
            .ok()?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        (!ids.contains(&killed_id) && ids.len() == 2).then_some(())
    })
    .await;
    let before: BTreeMap<u16, u64> = {
        let mut m = BTreeMap::new();
        for slot in &slots {
            m.insert(slot.port, beat(&session, &paths, &id, slot).await.map_or(0, |b| acked(&b)));
        }
        m
    };
    for slot in &slots {
        eventually("tuples to keep flowing after the restart", || async {
            let now = beat(&session, &paths, &id, slot).await.map_or(0, |b| acked(&b));
            (now > before[&slot.port]).then_some(())
        })
        .await;
    }

    supervisor_stop.cancel();
    daemon.await.unwrap().unwrap();
    stop.cancel();
}
