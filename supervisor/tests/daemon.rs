//! The supervisor daemon against real ZooKeeper (the harness) and real worker processes: a
//! failed code download leaves the running worker alone, and the supervisor stops promptly while
//! ZooKeeper is down.
//!
//! The topology's code is put in place by the test (a shell-script worker binary with its
//! checksums, as a download leaves it); nimbus is unreachable throughout.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cluster_state::coord::{CreateMode, Ensemble, Session, SessionOptions};
use cluster_state::ids::{ExecutorId, SupervisorId, TaskId, TopologyId};
use cluster_state::paths::StormPaths;
use cluster_state::znode::{Assignment, ExecutorAssignment, ZnodeData};
use sha2::{Digest, Sha256};
use supervisor::daemon::{SupervisorConfig, WorkerProgram, run};
use supervisor::launch::ProcessLauncher;
use supervisor::local_state::LocalState;
use supervisor::process_task::SupervisorState;
use test_harness::{ZkServer, eventually, eventually_true};
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(20);

struct Supervisor {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), supervisor::daemon::SupervisorError>>,
    registry: prometheus::Registry,
    local_dir: tempfile::TempDir,
}

use test_harness::free_port;

fn start(connect: &str, port: u16) -> Supervisor {
    let local_dir = tempfile::tempdir().unwrap();
    let config = SupervisorConfig {
        local_dir: local_dir.path().to_path_buf(),
        slots_ports: vec![port],
        monitor_frequency_secs: 1,
        heartbeat_frequency_secs: 1,
        worker_shutdown_sleep_secs: 1,
        nimbus_address: "127.0.0.1:1".into(),
        hostname: Some("127.0.0.1".into()),
        ..SupervisorConfig::default()
    };
    let program = WorkerProgram { squall: "/bin/false".into(), zookeeper: Some(connect.to_owned()) };
    let (cancel, registry) = (CancellationToken::new(), prometheus::Registry::new());
    let ensemble = Ensemble::zookeeper(connect.to_owned());
    let (stop, metrics) = (cancel.clone(), registry.clone());
    let task = tokio::spawn(async move {
        run(config, ensemble, Arc::new(ProcessLauncher::new()), program, &metrics, stop).await
    });
    Supervisor { cancel, task, registry, local_dir }
}

/// The supervisor's id once it registered.
async fn registered(session: &Session) -> SupervisorId {
    eventually(DEADLINE, "the supervisor's registration", || async {
        let children = session.children_or_empty("/storm/supervisors").await.ok()?;
        children.first().map(|id| id.parse().unwrap())
    })
    .await
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The topology's code as a download leaves it: a worker binary (a script writing the real
/// local heartbeat every 200 ms for executor [1 1]) and a definition, each with its checksum.
fn install_code(local_dir: &Path, topology: &TopologyId, port: u16) {
    let dir = local_dir.join("stormdist").join(topology.as_str());
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "#!/bin/sh\n\
         while [ $# -gt 1 ]; do case \"$1\" in --worker-id) id=$2;; --local-dir) ld=$2;; esac; shift; done\n\
         d=\"$ld/workers/$id\"; mkdir -p \"$d\"\n\
         while :; do printf '{{\"version\":1,\"time_secs\":%s,\"topology_id\":\"{topology}\",\"executors\":[[1,1]],\"port\":{port}}}' \
         \"$(date +%s)\" > \"$d/heartbeat.tmp\" && mv \"$d/heartbeat.tmp\" \"$d/heartbeat\"; sleep 0.2; done\n"
    );
    for (name, bytes) in [("topology.yaml", b"name: t\n".to_vec()), ("worker", script.into_bytes())] {
        std::fs::write(dir.join(name), &bytes).unwrap();
        std::fs::write(dir.join(format!("{name}.sha256")), sha256(&bytes)).unwrap();
    }
    std::fs::set_permissions(dir.join("worker"), std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn workers(local_dir: &Path) -> Vec<u32> {
    let state = LocalState::new(local_dir.join("supervisor/state"));
    state
        .load::<SupervisorState>()
        .ok()
        .flatten()
        .map(|s| s.workers.values().map(|w| w.pid).collect())
        .unwrap_or_default()
}

fn alive(pid: u32) -> bool {
    let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
    rustix::process::test_kill_process(pid).is_ok()
}

fn code_failures(registry: &prometheus::Registry) -> u64 {
    registry
        .gather()
        .iter()
        .find(|family| family.name() == "squall_supervisor_code_download_failures_total")
        .map_or(0, |family| family.get_metric()[0].get_counter().get_value() as u64)
}

/// Kills the workers the supervisor left running (it leaves them for the next one).
struct KillWorkers(Vec<u32>);

impl Drop for KillWorkers {
    fn drop(&mut self) {
        for pid in &self.0 {
            if let Some(pid) = rustix::process::Pid::from_raw(*pid as i32) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_code_download_leaves_the_running_worker_alone() {
    let connect = ZkServer::shared().chroot("a_failed_code_download").await;
    let session = Ensemble::zookeeper(connect.clone()).connect(&SessionOptions::default()).await.unwrap();
    // The assignments directory before the supervisor: it watches for the directory and runs a
    // round (no assignment: code is stale and removed) the moment it appears, which must not
    // come between the code being put in place by hand and the assignment.
    session.create("/storm/assignments", b"", CreateMode::Persistent.with_parents()).await.unwrap();
    let port = free_port();
    let supervisor = start(&connect, port);
    let id = registered(&session).await;
    let topology: TopologyId = "t-1-1700000000".parse().unwrap();
    install_code(supervisor.local_dir.path(), &topology, port);
    let assignment = Assignment {
        master_code_dir: "/nimbus/stormdist/t-1-1700000000".into(),
        node_host: [(id.clone(), "127.0.0.1".to_owned())].into(),
        executors: vec![ExecutorAssignment {
            executor: ExecutorId::single(TaskId(1)),
            node: id,
            port,
            start_time_secs: 1,
        }],
    };
    let path = StormPaths::default().assignment(&topology);
    session.create(&path, &assignment.encode(), CreateMode::Persistent.with_parents()).await.unwrap();

    let local_dir = supervisor.local_dir.path().to_path_buf();
    let pid = eventually(DEADLINE, "the worker to run and heartbeat", || async {
        let pids = workers(&local_dir);
        let beats = std::fs::read_dir(local_dir.join("workers")).map(|d| d.count()).unwrap_or(0);
        (pids.len() == 1 && beats == 1).then(|| pids[0])
    })
    .await;
    let _cleanup = KillWorkers(vec![pid]);

    // The local code goes, and nimbus cannot be reached to fetch it again.
    std::fs::remove_dir_all(local_dir.join("stormdist").join(topology.as_str())).unwrap();
    eventually_true(DEADLINE, "two failed downloads", || async { code_failures(&supervisor.registry) >= 2 })
        .await;
    assert!(alive(pid), "the running worker was killed for a failed download");
    assert_eq!(workers(&local_dir), [pid]);

    supervisor.cancel.cancel();
    supervisor.task.await.unwrap().unwrap();
    assert!(alive(pid), "stopping the supervisor leaves its worker running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_supervisor_stops_promptly_while_zookeeper_is_down() {
    let mut zk = ZkServer::start();
    let connect = zk.connect_string();
    let session = Ensemble::zookeeper(connect.clone()).connect(&SessionOptions::default()).await.unwrap();
    let supervisor = start(&connect, free_port());
    registered(&session).await;
    tokio::task::block_in_place(|| zk.stop());

    let started = tokio::time::Instant::now();
    supervisor.cancel.cancel();
    // Each of its two sessions (registration, assignments) waits at most the close bound.
    let bound = cluster_state::coord::SHUTDOWN_CLOSE_BOUND * 2 + Duration::from_secs(2);
    match tokio::time::timeout(DEADLINE, supervisor.task).await {
        Ok(stopped) => stopped.unwrap().unwrap(),
        Err(_) => panic!("the supervisor did not stop within {DEADLINE:?} with ZooKeeper down"),
    }
    let took = started.elapsed();
    assert!(took <= bound, "the supervisor took {took:?} to stop with ZooKeeper down (bound {bound:?})");
}
