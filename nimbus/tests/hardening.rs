//! Issue 14's hardening of nimbus, as stories against the whole daemon (`nimbus::serve`) on a
//! real ZooKeeper, driven through the typed client supervisors and `squall` use: every verb for
//! every name the rule accepts, the limits a topology must keep to, a monitor pass that goes on
//! past a topology it cannot assign, names held by undecodable nodes, and assignments written
//! as compare-and-set.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use cluster_state::api::{Count, RebalanceOptions, SubmitTopology};
use cluster_state::clock::now_secs;
use cluster_state::code::CodeFile;
use cluster_state::coord::{CreateMode, Ensemble, Session, SessionOptions};
use cluster_state::ids::{ComponentId, ExecutorId, SupervisorId, TaskId, TopologyId, TopologyName};
use cluster_state::paths::StormPaths;
use cluster_state::znode::{
    Assignment, ExecutorAssignment, StormBase, SupervisorInfo, TopologyStatus, ZnodeData,
};
use nimbus::NimbusConfig;
use nimbus::assignments::{AssignmentWriteError, write_assignment};
use nimbus::code_store::{CodeStore, CodeStoreError, CodeStoreLimits, sha256_hex};
use nimbus::leader::Leadership;
use nimbus_client::{ClientError, NimbusClient};
use test_harness::{ZkServer, eventually, eventually_true};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(30);

/// A nimbus daemon over its own chroot of the shared ZooKeeper, a live supervisor, and a
/// session of the test's own to look at ZooKeeper with.
struct Cluster {
    client: NimbusClient,
    session: Session,
    paths: StormPaths,
    dir: tempfile::TempDir,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), nimbus::NimbusError>>,
}

impl Cluster {
    async fn start(test: &str) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let ensemble = Ensemble::zookeeper(ZkServer::shared().chroot(test).await);
        let session = ensemble.connect(&SessionOptions::default()).await.unwrap();
        let paths = StormPaths::default();
        supervisor(&session, &paths).await;
        let config =
            NimbusConfig { local_dir: dir.path().to_owned(), monitor_freq_secs: 1, ..Default::default() };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = NimbusClient::new(listener.local_addr().unwrap().to_string(), None);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { nimbus::serve(config, listener, ensemble, &prometheus::Registry::new(), shutdown).await }
        });
        Cluster { client, session, paths, dir, shutdown, task }
    }

    /// Uploads `file` and submits it.
    async fn submit(&self, file: &str) -> Result<TopologyId, ClientError> {
        let upload = self.client.upload(file.as_bytes(), |_| {}).await?;
        let request = SubmitTopology {
            topology_upload: upload,
            worker_upload: None,
            resources_upload: None,
            inactive: false,
            owner: "t".into(),
        };
        Ok(self.client.submit(&request).await?.id)
    }

    async fn base(&self, id: &TopologyId) -> Option<StormBase> {
        self.session.read::<StormBase>(&self.paths.storm(id)).await.ok().map(|(b, _)| b)
    }

    async fn assignment(&self, id: &TopologyId) -> Option<Assignment> {
        self.session.read::<Assignment>(&self.paths.assignment(id)).await.ok().map(|(a, _)| a)
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let ended = tokio::time::timeout(Duration::from_secs(10), self.task).await.unwrap().unwrap();
        assert!(ended.is_ok(), "nimbus ended on its own: {ended:?}");
    }
}

/// A live supervisor with four ports.
async fn supervisor(session: &Session, paths: &StormPaths) {
    let id = SupervisorId::new("sup-1").unwrap();
    let info = SupervisorInfo {
        time_secs: now_secs(),
        hostname: "host1".into(),
        supervisor_id: id.clone(),
        used_ports: vec![],
        all_ports: vec![6700, 6701, 6702, 6703],
        uptime_secs: 1,
        version: "0".into(),
        metrics_endpoint: None,
        metrics_scheme: cluster_state::znode::MetricsScheme::Http,
    };
    session
        .create(&paths.supervisor(&id), &info.encode(), CreateMode::Persistent.with_parents())
        .await
        .unwrap();
}

fn topology_file(name: &str, split: &str) -> String {
    format!(
        "name: {name}\nconfig: {{topology.workers: 2}}\nspouts:\n  - {{id: sentences, className: sentence-generator}}\n\
         bolts:\n  - {{id: split, className: split-sentence, {split}}}\n"
    )
}

fn refused(result: Result<impl std::fmt::Debug, ClientError>, status: u16, says: &str) {
    match result {
        Err(ClientError::Refused { status: got, message, .. }) => {
            assert_eq!(got.as_u16(), status, "{message}");
            assert!(message.contains(says), "{says:?} not in {message:?}");
        }
        other => panic!("expected a {status} saying {says:?}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_verb_works_for_every_name_the_rule_accepts() {
    let cluster = Cluster::start("every-verb").await;
    let at_the_limit = format!("a-b_{}", "x".repeat(nimbus_name_max() - 4));
    assert_eq!(at_the_limit.len(), 128);
    for name in [at_the_limit.as_str(), "-_Word-Count_9-_"] {
        let file = topology_file(name, "parallelism: 2, numTasks: 4");
        let id = cluster.submit(&file).await.unwrap();
        assert_eq!(id.name(), name);
        let c = &cluster.client;
        assert_eq!(c.topology(&id).await.unwrap().summary.name.as_str(), name);
        assert!(c.errors(&id).await.unwrap().errors.is_empty());
        let mut download = c.download_code(&id, CodeFile::Topology).await.unwrap();
        let mut bytes = Vec::new();
        while let Some(chunk) = download.next_chunk().await.unwrap() {
            bytes.extend_from_slice(&chunk);
        }
        assert_eq!(bytes, file.as_bytes());
        assert!(c.topology_summary().await.unwrap().topologies.iter().any(|t| t.id == id));
        assert_eq!(c.deactivate(&id).await.unwrap().topology_status, "INACTIVE");
        assert_eq!(c.activate(&id).await.unwrap().topology_status, "ACTIVE");
        let options = RebalanceOptions {
            num_workers: Some(Count(1)),
            executors: BTreeMap::from([(ComponentId::new("split").unwrap(), Count(4))]),
        };
        assert_eq!(c.rebalance(&id, 0, options).await.unwrap().topology_status, "REBALANCING");
        eventually_true(DEADLINE, "the rebalance to 4 split executors", || async {
            cluster.base(&id).await.is_some_and(|b| {
                b.status == TopologyStatus::Active
                    && b.component_executors[&ComponentId::new("split").unwrap()] == 4
            })
        })
        .await;
        c.kill(&id, 0).await.unwrap();
        eventually_true(DEADLINE, "the killed topology to be removed", || async {
            cluster.base(&id).await.is_none() && cluster.assignment(&id).await.is_none()
        })
        .await;
        assert!(!cluster.dir.path().join("nimbus/stormdist").join(id.as_str()).exists());
    }

    // What the rule refuses is refused at submit, naming the rule; nothing is stored.
    let too_long = "x".repeat(nimbus_name_max() + 1);
    for name in ["word count", "a|b", "a`b", "ünï", too_long.as_str()] {
        let file = topology_file(&format!("\"{name}\""), "parallelism: 1");
        refused(cluster.submit(&file).await, 400, "each an ASCII letter, a digit, '-' or '_'");
    }
    let left = cluster.session.children(&cluster.paths.storms_dir()).await.unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
    cluster.stop().await;
}

fn nimbus_name_max() -> usize {
    cluster_state::ids::MAX_TOPOLOGY_NAME_LEN
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_checked_at_submit_and_rebalance_naming_them() {
    let cluster = Cluster::start("limits").await;
    let cases = [
        ("numTasks: 4294967295", "task ids are 32-bit"),
        ("parallelism: 2, numTasks: 20000", "nimbus.topology.max.tasks 10000"),
        ("parallelism: 5000", "nimbus.topology.max.executors 4000"),
    ];
    for (split, says) in cases {
        refused(cluster.submit(&topology_file("big", split)).await, 400, says);
    }
    assert!(cluster.session.children(&cluster.paths.storms_dir()).await.unwrap_or_default().is_empty());

    let id = cluster.submit(&topology_file("wc", "parallelism: 2, numTasks: 4")).await.unwrap();
    let before = cluster.base(&id).await.unwrap();
    let split = ComponentId::new("split").unwrap();
    for n in [5, 4000] {
        let options =
            RebalanceOptions { num_workers: None, executors: BTreeMap::from([(split.clone(), Count(n))]) };
        refused(cluster.client.rebalance(&id, 0, options).await, 400, "component split has 4 tasks");
    }
    assert_eq!(cluster.base(&id).await.unwrap(), before, "a refused rebalance changes nothing");
    cluster.stop().await;
}

/// Stores a topology as an older nimbus, without today's limits, would have: its base record,
/// then its code in nimbus's code dir. In that order, as nimbus's own submit does under its
/// lock: code without a base record is an orphan, which the running nimbus's cleanup pass
/// may remove at any moment. The code is written aside and renamed in, so nimbus never reads
/// half a file.
async fn store_unchecked(cluster: &Cluster, name: &str, split: &str) -> TopologyId {
    let id: TopologyId = format!("{name}-1-{}", now_secs()).parse().unwrap();
    let file = topology_file(name, split);
    let structure = cluster_state::structure::TopologyStructure::from_flux(&file).unwrap();
    let base = StormBase {
        name: TopologyName::new(name).unwrap(),
        launch_time_secs: now_secs(),
        status: TopologyStatus::Active,
        num_workers: 2,
        component_executors: structure.component_executors(),
        owner: "t".into(),
        prev_status: None,
        pending_transition: None,
    };
    let staged = cluster.dir.path().join(format!("staged-{id}"));
    std::fs::create_dir_all(&staged).unwrap();
    std::fs::write(staged.join("topology.yaml"), &file).unwrap();
    std::fs::write(staged.join("topology.yaml.sha256"), sha256_hex(file.as_bytes())).unwrap();
    let persistent = CreateMode::Persistent.with_parents();
    cluster.session.create(&cluster.paths.storm(&id), &base.encode(), persistent).await.unwrap();
    let code_dir = cluster.dir.path().join("nimbus/stormdist");
    std::fs::create_dir_all(&code_dir).unwrap();
    std::fs::rename(&staged, code_dir.join(id.as_str())).unwrap();
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topology_too_large_to_assign_does_not_stop_the_others() {
    let cluster = Cluster::start("too-large").await;
    // A bolt of 30,000 executors: its assignment (about 3 MB) is above ZooKeeper's
    // jute.maxbuffer, and writing it cost nimbus its connection on every pass. And one of
    // 20,000 tasks, above nimbus.topology.max.tasks. Both sort before the small one.
    let big = store_unchecked(&cluster, "aaa-big", "parallelism: 30000").await;
    let many = store_unchecked(&cluster, "aab-many", "numTasks: 20000").await;
    let small = cluster.submit(&topology_file("small", "parallelism: 2")).await.unwrap();
    let assigned = eventually(DEADLINE, "the small topology's assignment", || async {
        cluster.assignment(&small).await
    })
    .await;
    assert_eq!(assigned.executors.len(), 5, "spout, 2 split, 2 ackers");
    // Nimbus keeps its session and answers; the others stay stored, without an assignment.
    assert_eq!(cluster.client.cluster_summary().await.unwrap().topologies, 3);
    assert!(cluster.assignment(&big).await.is_none(), "the oversized assignment is never sent");
    assert!(cluster.assignment(&many).await.is_none(), "a topology over the task limit is not laid out");
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_held_by_an_undecodable_base_cannot_be_submitted_again() {
    let cluster = Cluster::start("undecodable-name").await;
    let persistent = CreateMode::Persistent.with_parents();
    cluster.session.create("/storm/storms/wc-7-1700000000", b"\x00garbage", persistent).await.unwrap();
    refused(cluster.submit(&topology_file("wc", "parallelism: 1")).await, 409, "wc-7-1700000000");
    assert_eq!(cluster.session.children(&cluster.paths.storms_dir()).await.unwrap(), vec!["wc-7-1700000000"]);
    // Another name goes through.
    cluster.submit(&topology_file("wc2", "parallelism: 1")).await.unwrap();
    cluster.stop().await;
}

fn assignment(port: u16) -> Assignment {
    let node = SupervisorId::new("sup-1").unwrap();
    Assignment {
        master_code_dir: "/code".into(),
        node_host: BTreeMap::from([(node.clone(), "host1".into())]),
        executors: vec![ExecutorAssignment {
            executor: ExecutorId::single(TaskId(1)),
            node,
            port,
            start_time_secs: 1,
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assignments_are_written_as_compare_and_set_of_what_was_read() {
    let ensemble = Ensemble::zookeeper(ZkServer::shared().chroot("assignment-cas").await);
    let session = Arc::new(ensemble.connect(&SessionOptions::default()).await.unwrap());
    let paths = StormPaths::default();
    let id: TopologyId = "wc-1-1700000000".parse().unwrap();
    let base = StormBase {
        name: TopologyName::new("wc").unwrap(),
        launch_time_secs: 1,
        status: TopologyStatus::Active,
        num_workers: 1,
        component_executors: BTreeMap::new(),
        owner: "t".into(),
        prev_status: None,
        pending_transition: None,
    };
    let persistent = CreateMode::Persistent.with_parents();
    session.create(&paths.storm(&id), &base.encode(), persistent).await.unwrap();
    let write = |storm: i32, read: Option<i32>, a: Assignment| {
        let (session, paths, id) = (session.clone(), paths.clone(), id.clone());
        async move {
            write_assignment(&session, &Leadership::standalone(), &paths, &id, storm, read, &a).await.unwrap()
        }
    };
    let stored = || async {
        session.read::<Assignment>(&paths.assignment(&id)).await.ok().map(|(a, s)| (a, s.version))
    };

    // Absent when read: created only if still absent.
    write(0, None, assignment(6700)).await.unwrap();
    assert_eq!(stored().await, Some((assignment(6700), 0)));
    assert_eq!(write(0, None, assignment(6701)).await, Err(AssignmentWriteError::Conflict));
    // Changed since read: not overwritten.
    write(0, Some(0), assignment(6701)).await.unwrap();
    assert_eq!(write(0, Some(0), assignment(6702)).await, Err(AssignmentWriteError::Conflict));
    assert_eq!(stored().await, Some((assignment(6701), 1)));
    // The base changed since read (a transition): not written.
    session.set(&paths.storm(&id), &base.encode(), Some(0)).await.unwrap();
    assert_eq!(write(0, Some(1), assignment(6702)).await, Err(AssignmentWriteError::Conflict));
    // A kill removed the assignment after the pass read it: it is not recreated.
    session.delete(&paths.assignment(&id), None).await.unwrap();
    assert_eq!(write(1, Some(1), assignment(6702)).await, Err(AssignmentWriteError::Conflict));
    assert_eq!(stored().await, None);
    // ... nor once the base is gone too.
    session.delete(&paths.storm(&id), None).await.unwrap();
    assert_eq!(write(1, None, assignment(6702)).await, Err(AssignmentWriteError::Conflict));
    assert_eq!(stored().await, None);

    // Too large for a znode: never sent, and the session is fine.
    session.create(&paths.storm(&id), &base.encode(), persistent).await.unwrap();
    let mut huge = assignment(6700);
    huge.master_code_dir = "/d".repeat(500_000);
    assert!(matches!(write(0, None, huge).await, Err(AssignmentWriteError::TooLarge { .. })));
    write(0, None, assignment(6703)).await.unwrap();
    assert_eq!(stored().await, Some((assignment(6703), 0)));
}

#[tokio::test(start_paused = true)]
async fn one_client_cannot_take_every_slot_and_stalled_uploads_go_within_a_minute() {
    let limits =
        CodeStoreLimits { max_pending_uploads: 4, max_pending_uploads_per_client: 2, ..Default::default() };
    let dir = tempfile::tempdir().unwrap();
    let store = CodeStore::open(dir.path(), limits).await.unwrap();
    let greedy = Some(IpAddr::from([10, 0, 0, 1]));
    let other = Some(IpAddr::from([10, 0, 0, 2]));
    let stalled = store.begin_for(4, greedy).await.unwrap();
    let finished = store.begin_for(1, greedy).await.unwrap();
    store.chunk(finished, 0, b"a").await.unwrap();
    store.finish(finished, &sha256_hex(b"a")).await.unwrap();
    let err = store.begin_for(1, greedy).await.unwrap_err();
    assert!(err.to_string().contains("from 10.0.0.1 (2)"), "{err}");
    // Another client still gets a slot.
    let theirs = store.begin_for(1, other).await.unwrap();

    // A minute without a chunk: the stalled upload is dropped at the next begin; the
    // finished one waits for its submit, the other client's upload progressed.
    tokio::time::advance(Duration::from_secs(45)).await;
    store.chunk(theirs, 0, b"b").await.unwrap();
    tokio::time::advance(Duration::from_secs(15)).await;
    store.begin_for(1, greedy).await.unwrap();
    assert!(matches!(store.chunk(stalled, 0, b"a").await, Err(CodeStoreError::UnknownUpload { .. })));
    assert_eq!(store.read_finished(finished, 10).await.unwrap(), b"a");
    store.finish(theirs, &sha256_hex(b"b")).await.unwrap();
}
