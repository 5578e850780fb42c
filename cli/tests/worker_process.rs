#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `squall worker` as real processes: two workers of one topology over loopback sockets, with
//! the assignment in the real ZooKeeper harness; one is killed (SIGKILL) and started again and
//! the flow resumes; SIGTERM-free cleanup is the test's.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cluster_state::coord::{CreateMode, Ensemble, Session, SessionOptions};
use cluster_state::ids::{ComponentId, SupervisorId, TopologyId, TopologyName, WorkerSlot};
use cluster_state::paths::StormPaths;
use cluster_state::znode::{
    Assignment, ExecutorAssignment, StormBase, TopologyStatus, WorkerHeartbeat, ZnodeData,
};
use test_harness::ZkServer;
use test_harness::eventually_true;
use worker::layout::TaskLayout;

const TOPOLOGY: &str = r#"
name: wc
config:
  topology.workers: 2
  topology.message.timeout.secs: 2
  topology.max.spout.pending: 500
spouts:
  - id: sentences
    className: sentence-generator
    params: {rate_per_sec: 2000}
bolts:
  - id: split
    className: split-sentence
    parallelism: 2
  - id: count
    className: word-count
    parallelism: 2
streams:
  - from: sentences
    to: split
    grouping: {type: SHUFFLE}
  - from: split
    to: count
    grouping: {type: FIELDS, args: [word]}
"#;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Kills the process when dropped, so a failing test leaves nothing behind.
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn launch(
    connect: &str,
    id: &TopologyId,
    slot: &WorkerSlot,
    file: &std::path::Path,
    dir: &std::path::Path,
) -> Worker {
    let child = Command::new(env!("CARGO_BIN_EXE_squall"))
        .args(["worker", "--topology-id", id.as_str(), "--supervisor-id", slot.node.as_str()])
        .args(["--port", &slot.port.to_string(), "--worker-id", &format!("w-{}", slot.port)])
        .args(["--zookeeper", connect, "--bind-host", "127.0.0.1", "--hostname", "127.0.0.1"])
        .arg("--topology-file")
        .arg(file)
        .arg("--local-dir")
        .arg(dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    Worker(child)
}

async fn spout_acked(
    s: &Session,
    paths: &StormPaths,
    id: &TopologyId,
    slot: &WorkerSlot,
    layout: &TaskLayout,
) -> u64 {
    let spout = ComponentId::new("sentences").unwrap();
    match s.read::<WorkerHeartbeat>(&paths.workerbeat(id, slot)).await {
        Ok((b, _)) => b
            .executor_stats
            .iter()
            .filter(|e| layout.executors.get(&e.executor) == Some(&spout))
            .map(|e| e.acked)
            .sum(),
        Err(_) => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_worker_processes_resume_after_one_is_killed_and_restarted() {
    let connect = ZkServer::shared().chroot("two_worker_processes").await;
    let s = Ensemble::zookeeper(connect.clone()).connect(&SessionOptions::default()).await.unwrap();
    let paths = StormPaths::default();
    let id = TopologyId::new(&TopologyName::new("wc").unwrap(), 1, 1_700_000_000);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wc.yaml");
    std::fs::write(&file, TOPOLOGY).unwrap();
    // What nimbus creates at submit and the supervisor downloads beside the topology file.
    worker::transport::TopologySecret::generate().write_new(&dir.path().join("topology.secret")).unwrap();
    let topology = worker::Registry::with_builtins().load_file(&file).unwrap();
    let layout = TaskLayout::compute(&topology.component_parallelism());

    // What nimbus would write: the base (active) and the assignment over two slots.
    let node = SupervisorId::new("sup-1").unwrap();
    let slots = [
        WorkerSlot { node: node.clone(), port: free_port() },
        WorkerSlot { node: node.clone(), port: free_port() },
    ];
    let executors: Vec<ExecutorAssignment> = layout
        .executors
        .keys()
        .enumerate()
        .map(|(i, e)| ExecutorAssignment {
            executor: *e,
            node: node.clone(),
            port: slots[i % 2].port,
            start_time_secs: 1,
        })
        .collect();
    let assignment = Assignment {
        master_code_dir: "/none".into(),
        node_host: [(node.clone(), "127.0.0.1".to_owned())].into(),
        executors,
    };
    let base = StormBase {
        name: TopologyName::new("wc").unwrap(),
        launch_time_secs: 1_700_000_000,
        status: TopologyStatus::Active,
        num_workers: 2,
        component_executors: topology.component_executors(),
        owner: "test".into(),
        prev_status: None,
        pending_transition: None,
    };
    s.create(&paths.storm(&id), &base.encode(), CreateMode::Persistent.with_parents()).await.unwrap();
    s.create(&paths.assignment(&id), &assignment.encode(), CreateMode::Persistent.with_parents())
        .await
        .unwrap();
    let spout_exec =
        layout.executors.iter().find(|(_, c)| c.as_str() == "sentences").map(|(e, _)| *e).unwrap();
    let spout_slot = assignment.slot_of(&spout_exec).unwrap();
    let other = slots.iter().find(|s| **s != spout_slot).unwrap().clone();

    let _a = launch(&connect, &id, &spout_slot, &file, dir.path());
    let b = launch(&connect, &id, &other, &file, dir.path());
    eventually_true(Duration::from_secs(90), "200 sentences acked across two worker processes", || async {
        spout_acked(&s, &paths, &id, &spout_slot, &layout).await >= 200
    })
    .await;

    // SIGKILL the worker without the spout and start it again on the same port.
    drop(b);
    let before = spout_acked(&s, &paths, &id, &spout_slot, &layout).await;
    let _b = launch(&connect, &id, &other, &file, dir.path());
    eventually_true(Duration::from_secs(90), "the flow to resume after the restart", || async {
        spout_acked(&s, &paths, &id, &spout_slot, &layout).await >= before + 500
    })
    .await;
}
