#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `squall worker` as real processes: two workers of one topology over loopback sockets, with
//! the assignment in the real ZooKeeper harness; one is killed (SIGKILL) and started again and
//! the flow resumes; SIGTERM-free cleanup is the test's. Two workers of a topology with
//! `topology.transport.tls` count a finite stream exactly, and refuse (and count) a plaintext
//! peer and a peer with another topology's key.

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
use worker::transport::{TopologySecret, TransportTls, connect_as_peer, connect_as_tls_peer};

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

use test_harness::free_port;

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

/// Everything nimbus and a supervisor would have laid out for `yaml` over two slots: the
/// topology file and its secret in a code dir, the base (active) and the assignment in
/// ZooKeeper. Returns the dir, the file, the layout, the spout's slot and the other one.
struct Laid {
    dir: tempfile::TempDir,
    file: std::path::PathBuf,
    layout: TaskLayout,
    spout_slot: WorkerSlot,
    other: WorkerSlot,
}

async fn lay_out(s: &Session, paths: &StormPaths, id: &TopologyId, yaml: &str) -> Laid {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wc.yaml");
    std::fs::write(&file, yaml).unwrap();
    // What nimbus creates at submit and the supervisor downloads beside the topology file.
    TopologySecret::generate().write_new(&dir.path().join("topology.secret")).unwrap();
    let topology = worker::Registry::with_builtins().load_file(&file).unwrap();
    let layout = TaskLayout::compute(&topology.component_parallelism());
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
    s.create(&paths.storm(id), &base.encode(), CreateMode::Persistent.with_parents()).await.unwrap();
    s.create(&paths.assignment(id), &assignment.encode(), CreateMode::Persistent.with_parents())
        .await
        .unwrap();
    let spout_exec =
        layout.executors.iter().find(|(_, c)| c.as_str() == "sentences").map(|(e, _)| *e).unwrap();
    let spout_slot = assignment.slot_of(&spout_exec).unwrap();
    let other = slots.iter().find(|s| **s != spout_slot).unwrap().clone();
    Laid { dir, file, layout, spout_slot, other }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_worker_processes_resume_after_one_is_killed_and_restarted() {
    let connect = ZkServer::shared().chroot("two_worker_processes").await;
    let s = Ensemble::zookeeper(connect.clone()).connect(&SessionOptions::default()).await.unwrap();
    let paths = StormPaths::default();
    let id = TopologyId::new(&TopologyName::new("wc").unwrap(), 1, 1_700_000_000);
    let Laid { dir, file, layout, spout_slot, other } = lay_out(&s, &paths, &id, TOPOLOGY).await;

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

/// [`TOPOLOGY`] with transport TLS, a finite spout (3000 sentences), the default message
/// timeout and workerbeats written every second.
fn tls_topology() -> String {
    let tls = TOPOLOGY
        .replace(
            "  topology.message.timeout.secs: 2\n  topology.max.spout.pending: 500\n",
            "  topology.transport.tls: true\n  squall.workerbeats.zk.secs: 1\n",
        )
        .replace("{rate_per_sec: 2000}", "{count: 3000, rate_per_sec: 3000}");
    assert!(tls.contains("transport.tls") && tls.contains("count: 3000"), "TOPOLOGY has the lines replaced");
    tls
}

/// Sums of (acked, failed) over the executors of `component` in `slot`'s workerbeat.
async fn component_stats(
    s: &Session,
    paths: &StormPaths,
    id: &TopologyId,
    slot: &WorkerSlot,
    layout: &TaskLayout,
    component: &str,
) -> (u64, u64) {
    let Ok((beat, _)) = s.read::<WorkerHeartbeat>(&paths.workerbeat(id, slot)).await else {
        return (0, 0);
    };
    beat.executor_stats
        .iter()
        .filter(|e| layout.executors.get(&e.executor).is_some_and(|c| c.as_str() == component))
        .fold((0, 0), |(a, f), e| (a + e.acked, f + e.failed))
}

/// The value of the unlabelled series `name` on a worker's `/metrics`.
fn scrape(endpoint: &str, name: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(endpoint).ok()?;
    conn.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    conn.read_to_string(&mut text).ok()?;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tls_worker_processes_count_exactly_and_refuse_other_peers() {
    let connect = ZkServer::shared().chroot("two_tls_worker_processes").await;
    let s = Ensemble::zookeeper(connect.clone()).connect(&SessionOptions::default()).await.unwrap();
    let paths = StormPaths::default();
    let id = TopologyId::new(&TopologyName::new("wc").unwrap(), 1, 1_700_000_000);
    let Laid { dir, file, layout, spout_slot, other } = lay_out(&s, &paths, &id, &tls_topology()).await;
    let _a = launch(&connect, &id, &spout_slot, &file, dir.path());
    let _b = launch(&connect, &id, &other, &file, dir.path());

    // Every sentence's tree completes across the two processes (split and count tasks are on
    // both, so words cross in both directions), and each word is counted once.
    let corpus = worker::builtin::reference_corpus();
    let words: u64 = (0..3000).map(|i| corpus[i % corpus.len()].split(' ').count() as u64).sum();
    let slots = [spout_slot.clone(), other.clone()];
    let stats = |component: &'static str| {
        let (s, paths, id, layout, slots) = (&s, &paths, &id, &layout, &slots);
        async move {
            let mut sum = (0, 0);
            for slot in slots {
                let (a, f) = component_stats(s, paths, id, slot, layout, component).await;
                sum = (sum.0 + a, sum.1 + f);
            }
            sum
        }
    };
    eventually_true(Duration::from_secs(90), "3000 sentences acked over TLS", || async {
        stats("sentences").await.0 >= 3000 && stats("count").await.0 >= words
    })
    .await;
    assert_eq!(stats("sentences").await, (3000, 0), "every sentence acked once, none failed");
    assert_eq!(stats("count").await, (words, 0), "every word counted once");

    // Strangers at the other worker's port: a plaintext peer holding the topology's secret, and
    // a TLS peer with another topology's key. Both are refused and counted.
    let secret = TopologySecret::read(&dir.path().join("topology.secret")).unwrap();
    let port: std::net::SocketAddr = format!("127.0.0.1:{}", other.port).parse().unwrap();
    assert!(connect_as_peer(port, id.as_str(), &secret).is_err(), "a plaintext peer got in");
    let stranger = TransportTls::for_topology(&TopologySecret::generate()).unwrap();
    assert!(connect_as_tls_peer(port, id.as_str(), &secret, &stranger).is_err(), "another key got in");
    let (beat, _) = s.read::<WorkerHeartbeat>(&paths.workerbeat(&id, &other)).await.unwrap();
    let endpoint = beat.metrics_endpoint.unwrap();
    let failed = "squall_worker_transport_handshakes_failed_total";
    test_harness::wait_for(Duration::from_secs(30), "two refused handshakes counted", || {
        scrape(&endpoint, failed) == Some(2.0)
    });
    // The strangers' connections are gone; the spout worker's own stays up.
    test_harness::wait_for(Duration::from_secs(30), "only the peer worker's connection open", || {
        scrape(&endpoint, "squall_worker_transport_connections") == Some(1.0)
    });
}
