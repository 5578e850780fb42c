//! Nimbus's HTTP API and delayed transitions, against a real server on 127.0.0.1:0 and either a
//! real ZooKeeper (where sessions and restarts matter) or the in-memory ensemble.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cluster_state::api::{
    API_PREFIX, BeginUpload, ChunkReceived, ClusterConfiguration, ClusterSummary, ComponentPage,
    ConsumerGroups, Count, ErrorBody, ExecutorStatsReport, FinishUpload, Operation, PendingAction,
    RebalanceOptions, RebalanceRequest, ResetPlanRequest, ResetTarget, Route, StatsWindow, SubmitTopology,
    Submitted, SupervisorHeartbeat, SupervisorSummaries, TopologyDetail, TopologyErrors, TopologyOperation,
    TopologySummaries, UploadBegun, UploadFinished, UploadId, Visualization, WorkerReport,
};
use cluster_state::clock::now_secs;
use cluster_state::coord::{CreateMode, Ensemble, Session, SessionOptions};
use cluster_state::ids::{
    ComponentId, ExecutorId, GroupId, SupervisorId, TaskId, TopologyId, TopologyName, WorkerSlot,
};
use cluster_state::paths::StormPaths;
use cluster_state::znode::{
    Assignment, DelayedTransition, ErrorInfo, ExecutorAssignment, StormBase, SupervisorInfo, TopologyStatus,
    WorkerHeartbeat, ZnodeData,
};
use nimbus::NimbusConfig;
use nimbus::assigner::{Assigner, MonitorTimeouts};
use nimbus::code_store::{CodeFile, CodeStore, CodeStoreLimits, sha256_hex};
use nimbus::http::{ApiConfig, ApiState, CHECKSUM_HEADER};
use nimbus::leader::Leadership;
use nimbus::lifecycle::Event;
use nimbus::metrics::NimbusMetrics;
use nimbus::transitions::{DeadlineTimers, Transitions};
use serde::Serialize;
use serde::de::DeserializeOwned;
use test_harness::{ZkServer, eventually};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// How long nimbus may take to finish what a test waits for.
const DEADLINE: Duration = Duration::from_secs(20);
const ID: &str = "wc-1-1700000000";

fn id() -> TopologyId {
    ID.parse().unwrap()
}

fn comp(name: &str) -> ComponentId {
    ComponentId::new(name).unwrap()
}

/// A running nimbus: HTTP server and deadline timers over one session.
struct Nimbus {
    addr: SocketAddr,
    cancel: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    transitions: Arc<Transitions>,
}

impl Nimbus {
    async fn start(ensemble: &Ensemble, dir: &Path, config: ApiConfig) -> Nimbus {
        Self::start_with(ensemble, dir, config, CodeStoreLimits::default(), Duration::from_secs(1)).await
    }

    /// `rescan` is `nimbus.monitor.freq.secs`, how often stored deadlines are re-read.
    async fn start_with(
        ensemble: &Ensemble,
        dir: &Path,
        config: ApiConfig,
        limits: CodeStoreLimits,
        rescan: Duration,
    ) -> Nimbus {
        let session = Arc::new(ensemble.connect(&SessionOptions::default()).await.unwrap());
        let code = CodeStore::open(dir, limits).await.unwrap();
        let metrics = NimbusMetrics::unregistered().unwrap();
        let paths = StormPaths::default();
        let assigner = Arc::new(Assigner::new(
            session.clone(),
            paths.clone(),
            code.clone(),
            MonitorTimeouts::default(),
            metrics.clone(),
        ));
        let transitions = Arc::new(Transitions::new(session, paths, code, assigner.clone(), metrics));
        let (timers, handle) = DeadlineTimers::new(transitions.clone(), rescan);
        let cluster_configuration =
            NimbusConfig { http_token: config.token.clone(), ..Default::default() }.ui_configuration();
        let state = Arc::new(ApiState {
            transitions: transitions.clone(),
            assigner,
            registry: prometheus::Registry::new(),
            timers: handle,
            config,
            nimbus_start_secs: now_secs(),
            leadership: Leadership::standalone(),
            replicator: None,
            lag: None,
            kafka_paths: Default::default(),
            cluster_configuration,
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cancel = CancellationToken::new();
        let tasks = vec![
            tokio::spawn({
                let (mut timers, cancel) = (timers, cancel.clone());
                async move { timers.run(cancel).await }
            }),
            tokio::spawn(nimbus::http::run(listener, state, cancel.clone())),
        ];
        Nimbus { addr, cancel, tasks, transitions }
    }

    /// Stops everything and waits for it: nothing of this nimbus acts afterwards.
    async fn stop(self) {
        self.cancel.cancel();
        for task in self.tasks {
            tokio::time::timeout(Duration::from_secs(10), task).await.expect("nimbus stops in time").unwrap();
        }
    }

    fn session(&self) -> &Session {
        self.transitions.session()
    }

    async fn request(&self, method: &str, path: &str, body: &[u8]) -> Reply {
        request(self.addr, method, path, &[], body).await
    }

    /// `route` with the method it accepts.
    async fn call(&self, route: &Route, body: &[u8]) -> Reply {
        self.request(route.method().as_str(), &route.path(), body).await
    }
}

/// A request body as the API's typed request serializes it.
fn body(request: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec(request).unwrap()
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    /// The body as the API's response type `T`.
    fn decode<T: DeserializeOwned>(&self) -> T {
        cluster_state::api::decode_response(&self.body).unwrap_or_else(|e| {
            let body = String::from_utf8_lossy(&self.body);
            panic!("not a {} ({e}): {body}", std::any::type_name::<T>())
        })
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// Asserts a JSON error with this status whose message contains `needle`.
    fn assert_error(&self, status: u16, needle: &str) {
        assert_eq!(self.status, status, "{}", String::from_utf8_lossy(&self.body));
        let body: ErrorBody = self.decode();
        assert!(body.error_message.contains(needle), "{needle:?} not in {body:?}");
    }
}

/// One HTTP/1.1 request over a fresh connection (`Connection: close`), read to the end.
async fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    request_from([127, 0, 0, 1], addr, method, path, headers, body).await
}

/// [`request`] from the loopback address `source` (any of 127.0.0.0/8), as another client.
async fn request_from(
    source: [u8; 4],
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((source, 0))).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: nimbus\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    parse_reply(&raw)
}

fn parse_reply(raw: &[u8]) -> Reply {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete response head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Reply { status, headers, body: raw[split + 4..].to_vec() }
}

fn base(status: TopologyStatus) -> StormBase {
    StormBase {
        name: TopologyName::new("wc").unwrap(),
        launch_time_secs: now_secs() - 65,
        status,
        num_workers: 2,
        component_executors: [(comp("split"), 2), (comp("count"), 1)].into_iter().collect(),
        owner: "alice".into(),
        prev_status: None,
        pending_transition: None,
    }
}

fn executor(start: u32, end: u32) -> ExecutorId {
    ExecutorId::new(TaskId(start), TaskId(end)).unwrap()
}

/// Writes what a submitted topology leaves behind: base, assignment, heartbeats, an error, and
/// code in the store; plus a live supervisor.
async fn seed(session: &Session, code: &CodeStore) {
    let paths = StormPaths::default();
    let persistent = CreateMode::Persistent.with_parents();
    let sup = SupervisorId::new("sup-1").unwrap();
    session.create(&paths.storm(&id()), &base(TopologyStatus::Active).encode(), persistent).await.unwrap();
    let assignment = Assignment {
        master_code_dir: code.topology_dir(&id()).display().to_string(),
        node_host: [(sup.clone(), "host1".to_owned())].into_iter().collect(),
        executors: [(1, 1, 6700), (2, 2, 6701), (3, 3, 6700)]
            .into_iter()
            .map(|(s, e, port)| ExecutorAssignment {
                executor: executor(s, e),
                node: sup.clone(),
                port,
                start_time_secs: now_secs(),
            })
            .collect(),
    };
    session.create(&paths.assignment(&id()), &assignment.encode(), persistent).await.unwrap();
    let slot = WorkerSlot { node: sup.clone(), port: 6700 };
    let beat = WorkerHeartbeat {
        topology_id: id(),
        executor_stats: vec![],
        start_time_secs: now_secs(),
        time_secs: now_secs(),
        uptime_secs: 1,
        metrics_endpoint: None,
        metrics_scheme: cluster_state::znode::MetricsScheme::Http,
    };
    session.create(&paths.workerbeat(&id(), &slot), &beat.encode(), persistent).await.unwrap();
    for (text, age) in [("older failure", 30), ("newest failure", 5)] {
        let info =
            ErrorInfo { error: text.into(), time_secs: now_secs() - age, host: "host1".into(), port: 6700 };
        let mode = CreateMode::PersistentSequential.with_parents();
        session
            .create(&paths.error_sequential_prefix(&id(), &comp("split")), &info.encode(), mode)
            .await
            .unwrap();
    }
    let info = SupervisorInfo {
        time_secs: now_secs(),
        hostname: "host1".into(),
        supervisor_id: sup.clone(),
        used_ports: vec![6700, 6701],
        all_ports: vec![6700, 6701, 6702],
        uptime_secs: 3661,
        version: "0.1.0".into(),
        metrics_endpoint: None,
        metrics_scheme: cluster_state::znode::MetricsScheme::Http,
    };
    session
        .create(&paths.supervisor(&sup), &info.encode(), CreateMode::Ephemeral.with_parents())
        .await
        .unwrap();
    install(code, TOPOLOGY_FILE.as_bytes(), CodeFile::Topology).await;
}

/// The seeded topology's file: tasks 1 (count), 2-3 (split), as the seeded assignment has them.
const TOPOLOGY_FILE: &str = "name: wc
config: {topology.workers: 2, topology.acker.executors: 0}
bolts:
  - {id: count, className: word-count}
  - {id: split, className: split-sentence, parallelism: 2}
";

async fn install(code: &CodeStore, data: &[u8], file: CodeFile) {
    let upload = code.begin(data.len() as u64).await.unwrap();
    code.chunk(upload, 0, data).await.unwrap();
    let finished = code.finish(upload, &sha256_hex(data)).await.unwrap();
    code.install(&finished, &id(), file).await.unwrap();
}

async fn stored_base(session: &Session) -> Option<StormBase> {
    session.read::<StormBase>(&StormPaths::default().storm(&id())).await.ok().map(|(b, _)| b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summaries_over_real_zookeeper_skip_garbage_znodes() {
    let ensemble = Ensemble::zookeeper(ZkServer::shared().chroot("summaries").await);
    let dir = tempfile::tempdir().unwrap();
    let nimbus = Nimbus::start(&ensemble, dir.path(), ApiConfig::default()).await;
    seed(nimbus.session(), nimbus.transitions.code()).await;
    let persistent = CreateMode::Persistent.with_parents();
    nimbus.session().create("/storm/storms/not..an-id", b"{}", persistent).await.unwrap();
    nimbus.session().create("/storm/storms/wc-2-1700000001", b"\x00\xffgarbage", persistent).await.unwrap();
    nimbus.session().create("/storm/assignments/wc-2-1700000001", b"[]", persistent).await.unwrap();

    let cluster = nimbus.call(&Route::ClusterSummary, b"").await;
    assert_eq!(cluster.status, 200);
    assert_eq!(cluster.header("content-type"), Some("application/json"));
    let body: ClusterSummary = cluster.decode();
    assert_eq!(
        (body.topologies, body.supervisors, body.slots_total, body.slots_used, body.executors_total),
        (1, 1, 3, 2, 3)
    );
    // The garbage under storms (a bad name, bad data) and assignments was skipped and counted
    // (the deadline timers' rescans may have counted it too).
    assert!(nimbus.transitions.metrics().garbage_znodes.get() >= 3);
    let supervisors: SupervisorSummaries = nimbus.call(&Route::SupervisorSummary, b"").await.decode();
    assert_eq!(supervisors.supervisors[0].id.as_str(), "sup-1");
    assert_eq!(supervisors.supervisors[0].uptime, "1h 1m 1s");
    let topologies: TopologySummaries = nimbus.call(&Route::TopologySummary, b"").await.decode();
    let list = &topologies.topologies;
    assert_eq!(list.len(), 1, "{topologies:?}");
    assert_eq!((&list[0].id, list[0].status.as_str(), list[0].workers_total), (&id(), "ACTIVE", 2));
    nimbus.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_view_errors_and_bad_requests() {
    let ensemble = Ensemble::in_memory();
    let dir = tempfile::tempdir().unwrap();
    let nimbus = Nimbus::start(&ensemble, dir.path(), ApiConfig::default()).await;
    seed(nimbus.session(), nimbus.transitions.code()).await;

    let view = nimbus.call(&Route::Topology(id()), b"").await;
    assert_eq!(view.status, 200);
    let view: TopologyDetail = view.decode();
    let summary = &view.summary;
    assert_eq!((&summary.id, summary.name.as_str(), summary.status.as_str()), (&id(), "wc", "ACTIVE"));
    assert_eq!((view.requested_workers, view.component_executors.get(&comp("split"))), (2, Some(&2)));
    assert_eq!(view.pending_transition, None);

    let errors: TopologyErrors = nimbus.call(&Route::TopologyErrors(id()), b"").await.decode();
    let texts: Vec<&str> = errors.errors.iter().map(|e| e.error.as_str()).collect();
    assert_eq!(texts, ["newest failure", "older failure"]);
    assert_eq!((&errors.errors[0].component, errors.errors[0].error_port), (&comp("split"), 6700));

    let other: TopologyId = "wc-9-1700000000".parse().unwrap();
    nimbus.call(&Route::Topology(other.clone()), b"").await.assert_error(404, "no topology wc-9-1700000000");
    nimbus.call(&Route::TopologyErrors(other), b"").await.assert_error(404, "no topology");
    nimbus.request("GET", &format!("{API_PREFIX}/topology/.."), b"").await.assert_error(400, "topology id");
    nimbus
        .request("GET", &format!("{API_PREFIX}/topology/../errors"), b"")
        .await
        .assert_error(400, "topology id");
    nimbus.request("GET", &format!("{API_PREFIX}/nope"), b"").await.assert_error(404, "no such resource");
    let wrong = nimbus.request("POST", &Route::ClusterSummary.path(), b"").await;
    wrong.assert_error(405, "accepts GET");
    assert_eq!(wrong.header("allow"), Some("GET"));
    nimbus
        .request("GET", &Route::Kill { id: id(), wait_secs: 0 }.path(), b"")
        .await
        .assert_error(405, "accepts POST");
    nimbus.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_operations_write_the_base_record() {
    let ensemble = Ensemble::in_memory();
    let dir = tempfile::tempdir().unwrap();
    let nimbus = Nimbus::start(&ensemble, dir.path(), ApiConfig::default()).await;
    seed(nimbus.session(), nimbus.transitions.code()).await;
    let rebalance = |wait_secs| Route::Rebalance { id: id(), wait_secs };
    let kill = |wait_secs| Route::Kill { id: id(), wait_secs };

    let reply = nimbus.call(&Route::Deactivate(id()), b"").await;
    assert_eq!(reply.status, 200);
    // The whole body, byte for byte: no other field (the keys are golden in cluster-state).
    let deactivated = TopologyOperation {
        topology_operation: Operation::Deactivate,
        topology_id: id(),
        status: "success".into(),
        topology_status: "INACTIVE".into(),
    };
    assert_eq!(String::from_utf8_lossy(&reply.body), String::from_utf8_lossy(&body(&deactivated)));
    assert_eq!(stored_base(nimbus.session()).await.unwrap().status, TopologyStatus::Inactive);
    assert_eq!(nimbus.call(&Route::Activate(id()), b"").await.status, 200);
    let before = stored_base(nimbus.session()).await.unwrap();
    assert_eq!(before.status, TopologyStatus::Active);

    nimbus
        .request("POST", &format!("{API_PREFIX}/topology/{ID}/rebalance/x"), b"")
        .await
        .assert_error(400, "wait-time");
    nimbus.call(&rebalance(5), br#"{"numWorkers":"many"}"#).await.assert_error(400, "numWorkers");
    let unknown =
        RebalanceRequest { executors: Some([(comp("nope"), Count(2))].into()), ..Default::default() };
    nimbus.call(&rebalance(5), &body(&unknown)).await.assert_error(400, "no component nope");
    // Storm caps executors at tasks: more executors than split's 2 tasks is refused. Written as
    // Storm UI writes counts (a string), so the refusal shows it was read.
    nimbus
        .call(&rebalance(5), br#"{"executors":{"split":"4"}}"#)
        .await
        .assert_error(400, "component split has 2 tasks");
    let other: TopologyId = "wc-9-1700000000".parse().unwrap();
    nimbus.call(&Route::Activate(other), b"").await.assert_error(404, "no topology");
    let huge = vec![b' '; 100 * 1024];
    nimbus.call(&rebalance(5), &huge).await.assert_error(413, "larger than");
    assert_eq!(stored_base(nimbus.session()).await.unwrap(), before, "refused requests wrote nothing");

    let options = RebalanceOptions {
        num_workers: Some(Count(3)),
        executors: [(comp("split"), Count(1))].into_iter().collect(),
    };
    let reply = nimbus.call(&rebalance(600), &body(&RebalanceRequest::new(options))).await;
    assert_eq!(reply.decode::<TopologyOperation>().topology_status, "REBALANCING");
    let stored = stored_base(nimbus.session()).await.unwrap();
    assert!(matches!(
        stored.pending_transition,
        Some(DelayedTransition::Rebalance { num_workers: Some(3), ref component_executors, .. })
            if component_executors == &BTreeMap::from([(comp("split"), 1)])
    ));
    nimbus.call(&Route::Activate(id()), b"").await.assert_error(409, "is rebalancing");

    // Any wait is taken, even one no clock reaches; a later kill brings it forward.
    let forever = nimbus.call(&kill(u64::MAX), b"").await;
    assert_eq!(forever.decode::<TopologyOperation>().topology_status, "KILLED");
    assert_eq!(nimbus.call(&kill(600), b"").await.decode::<TopologyOperation>().topology_status, "KILLED");
    let view: TopologyDetail = nimbus.call(&Route::Topology(id()), b"").await.decode();
    let pending = view.pending_transition.as_ref().expect("a pending kill");
    assert_eq!(pending.action, PendingAction::Kill);
    assert!(pending.seconds_left > 590, "{view:?}");
    nimbus.call(&Route::Deactivate(id()), b"").await.assert_error(409, "is killed");
    nimbus.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutating_calls_need_the_token() {
    let ensemble = Ensemble::in_memory();
    let dir = tempfile::tempdir().unwrap();
    let config = ApiConfig { token: Some("s3cret".into()), ..Default::default() };
    let nimbus = Nimbus::start(&ensemble, dir.path(), config).await;
    seed(nimbus.session(), nimbus.transitions.code()).await;
    let path = Route::Deactivate(id()).path();

    request(nimbus.addr, "POST", &path, &[], b"").await.assert_error(401, "Authorization: Bearer");
    request(nimbus.addr, "POST", &path, &[("Authorization", "Bearer nope")], b"")
        .await
        .assert_error(401, "wrong");
    request(nimbus.addr, "POST", &Route::BeginUpload.path(), &[], &body(&BeginUpload { size: 1 }))
        .await
        .assert_error(401, "Bearer");
    assert_eq!(stored_base(nimbus.session()).await.unwrap().status, TopologyStatus::Active);
    let ok = request(nimbus.addr, "POST", &path, &[("Authorization", "Bearer s3cret")], b"").await;
    assert_eq!(ok.status, 200);
    assert_eq!(stored_base(nimbus.session()).await.unwrap().status, TopologyStatus::Inactive);
    assert_eq!(nimbus.call(&Route::TopologySummary, b"").await.status, 200, "reads need no token");
    nimbus.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_downloads_need_the_token_and_secret_params_never_come_back() {
    let ensemble = Ensemble::in_memory();
    let dir = tempfile::tempdir().unwrap();
    let config = ApiConfig { token: Some("s3cret".into()), ..Default::default() };
    let nimbus = Nimbus::start(&ensemble, dir.path(), config).await;
    seed(nimbus.session(), nimbus.transitions.code()).await;
    nimbus.transitions.remove(&id(), None).await.unwrap();
    let auth = [("Authorization", "Bearer s3cret")];
    // A topology whose spout holds a Kafka password, submitted through the API.
    let file = format!(
        "{TOPOLOGY_FILE}spouts:\n  - id: in\n    className: kafka-spout\n    params:\n      librdkafka: {{sasl.password: hunter2-pw}}\n"
    );
    let path = Route::BeginUpload.path();
    let begun =
        request(nimbus.addr, "POST", &path, &auth, &body(&BeginUpload { size: file.len() as u64 })).await;
    let upload = begun.decode::<UploadBegun>().upload_id;
    let chunk = Route::Chunk { upload, offset: 0 }.path();
    assert_eq!(request(nimbus.addr, "POST", &chunk, &auth, file.as_bytes()).await.status, 200);
    let finish = body(&FinishUpload { sha256: sha256_hex(file.as_bytes()) });
    assert_eq!(
        request(nimbus.addr, "POST", &Route::FinishUpload(upload).path(), &auth, &finish).await.status,
        200
    );
    let submitted = request(nimbus.addr, "POST", &Route::Submit.path(), &auth, &body(&submit(upload))).await;
    assert_eq!(submitted.status, 201, "{}", String::from_utf8_lossy(&submitted.body));
    let id: TopologyId = submitted.decode::<Submitted>().id;

    // Code files: the user's program and a file with credentials. No token, no code; a wrong
    // token or an unknown file name gets no further.
    for file in [CodeFile::Topology, CodeFile::Secret, CodeFile::WorkerBinary] {
        let path = Route::Code(id.clone(), file).path();
        request(nimbus.addr, "GET", &path, &[], b"").await.assert_error(401, "Authorization: Bearer");
        request(nimbus.addr, "GET", &path, &[("Authorization", "Bearer nope")], b"")
            .await
            .assert_error(401, "wrong");
    }
    let unknown = format!("{}/topology/{id}/code/passwd", API_PREFIX);
    assert_eq!(request(nimbus.addr, "GET", &unknown, &[], b"").await.status, 401);
    let topology = Route::Code(id.clone(), CodeFile::Topology).path();
    let served = request(nimbus.addr, "GET", &topology, &auth, b"").await;
    assert_eq!((served.status, served.body.as_slice()), (200, file.as_bytes()), "token holders get it whole");

    // A component's error quoting the password (written by a worker that did not know it was
    // one) comes back redacted.
    let paths = StormPaths::default();
    let info = ErrorInfo {
        error: "SASL authentication failed for user alice password hunter2-pw".into(),
        time_secs: now_secs(),
        host: "h".into(),
        port: 6700,
    };
    let error_path = paths.error_sequential_prefix(&id, &comp("in"));
    nimbus
        .session()
        .create(&error_path, &info.encode(), CreateMode::PersistentSequential.with_parents())
        .await
        .unwrap();
    let mut answers = Vec::new();
    for route in [
        Route::TopologyErrors(id.clone()),
        Route::Topology(id.clone()),
        Route::TopologySummary,
        Route::ClusterSummary,
    ] {
        let reply = nimbus.call(&route, b"").await;
        assert_eq!(reply.status, 200, "{route:?}");
        answers.push(String::from_utf8_lossy(&reply.body).into_owned());
    }
    assert!(answers[0].contains("password <redacted>"), "{}", answers[0]);
    for answer in &answers {
        assert!(!answer.contains("hunter2-pw"), "{answer}");
    }
    nimbus.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_case_insensitive() {
    let ensemble = Ensemble::in_memory();
    let dir = tempfile::tempdir().unwrap();
    let config = ApiConfig { token: Some("s3cret".into()), ..Default::default() };
    let nimbus = Nimbus::start(&ensemble, dir.path(), config).await;
    seed(nimbus.session(), nimbus.transitions.code()).await;
    // RFC 7235: "bearer", "BEARER" are the same scheme; spaces may separate it from the token.
    for (route, authorization) in [
        (Route::Deactivate(id()), "bearer s3cret"),
        (Route::Activate(id()), "BEARER s3cret"),
        (Route::Deactivate(id()), "Bearer  s3cret"),
    ] {
        let path = route.path();
        let reply = request(nimbus.addr, "POST", &path, &[("Authorization", authorization)], b"").await;
        assert_eq!(reply.status, 200, "{authorization:?}: {}", String::from_utf8_lossy(&reply.body));
    }
    assert_eq!(stored_base(nimbus.session()).await.unwrap().status, TopologyStatus::Inactive);
    let path = Route::Activate(id()).path();
    for authorization in ["Basic s3cret", "bearer", "Bearers3cret"] {
        let reply = request(nimbus.addr, "POST", &path, &[("Authorization", authorization)], b"").await;
        assert_eq!(reply.status, 401, "{authorization:?}");
    }
    nimbus.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_failures_say_what_failed_without_server_paths() {
    let ensemble = Ensemble::in_memory();
    let dir = tempfile::tempdir().unwrap();
    let nimbus = Nimbus::start(&ensemble, dir.path(), ApiConfig::default()).await;
    let topology = upload(&nimbus, TOPOLOGY_FILE.as_bytes()).await;
    // The code dir cannot be written: installing the code fails on the server's disk.
    std::fs::remove_dir_all(dir.path().join("stormdist")).unwrap();
    std::fs::write(dir.path().join("stormdist"), b"not a directory").unwrap();
    let reply = nimbus.call(&Route::Submit, &body(&submit(topology))).await;
    reply.assert_error(500, "nimbus's code store failed to read or write a file");
    let message = reply.decode::<ErrorBody>().error_message;
    assert!(!message.contains(dir.path().to_str().unwrap()) && !message.contains('/'), "{message}");
    nimbus.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_cannot_take_every_upload_slot() {
    let ensemble = Ensemble::in_memory();
    let dir = tempfile::tempdir().unwrap();
    let limits =
        CodeStoreLimits { max_pending_uploads: 3, max_pending_uploads_per_client: 2, ..Default::default() };
    let nimbus =
        Nimbus::start_with(&ensemble, dir.path(), ApiConfig::default(), limits, Duration::from_secs(1)).await;
    let (path, one_byte) = (Route::BeginUpload.path(), body(&BeginUpload { size: 1 }));
    let begin = |source: [u8; 4]| request_from(source, nimbus.addr, "POST", &path, &[], &one_byte);
    assert_eq!(begin([127, 0, 0, 1]).await.status, 201);
    assert_eq!(begin([127, 0, 0, 1]).await.status, 201);
    begin([127, 0, 0, 1]).await.assert_error(429, "from 127.0.0.1 (2)");
    assert_eq!(begin([127, 0, 0, 2]).await.status, 201, "another client still uploads");
    nimbus.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_upload_and_code_download() {
    let ensemble = Ensemble::in_memory();
    let dir = tempfile::tempdir().unwrap();
    let limits = CodeStoreLimits { max_upload_bytes: 1000, ..Default::default() };
    let config = ApiConfig { max_chunk_bytes: 100, ..Default::default() };
    let nimbus = Nimbus::start_with(&ensemble, dir.path(), config, limits, Duration::from_secs(1)).await;
    let data: Vec<u8> = (0..250u32).map(|i| (i % 251) as u8).collect();

    let begun = nimbus.call(&Route::BeginUpload, &body(&BeginUpload { size: 250 })).await;
    assert_eq!(begun.status, 201);
    let upload = begun.decode::<UploadBegun>().upload_id;
    let chunk_at = |offset| Route::Chunk { upload, offset };
    for (offset, chunk) in [(0, &data[..100]), (100, &data[100..200]), (200, &data[200..])] {
        let reply = nimbus.call(&chunk_at(offset), chunk).await;
        assert_eq!(reply.decode::<ChunkReceived>().received, offset + chunk.len() as u64);
    }
    nimbus.call(&chunk_at(0), &data[..10]).await.assert_error(409, "offset 0");
    let wrong = FinishUpload { sha256: sha256_hex(b"other") };
    // A wrong checksum discards the upload; begin again.
    nimbus.call(&Route::FinishUpload(upload), &body(&wrong)).await.assert_error(400, "mismatch");
    nimbus.call(&Route::FinishUpload(upload), b"{}").await.assert_error(400, "sha256");

    let begun = nimbus.call(&Route::BeginUpload, &body(&BeginUpload { size: 250 })).await;
    let upload = begun.decode::<UploadBegun>().upload_id;
    for (offset, chunk) in [(0, &data[..100]), (100, &data[100..200]), (200, &data[200..])] {
        assert_eq!(nimbus.call(&Route::Chunk { upload, offset }, chunk).await.status, 200);
    }
    let right = FinishUpload { sha256: sha256_hex(&data) };
    let finished: UploadFinished = nimbus.call(&Route::FinishUpload(upload), &body(&right)).await.decode();
    assert_eq!((finished.size, finished.sha256), (250, sha256_hex(&data)));

    // Submit (a later issue) installs it; here the code store does what submit will.
    let code = nimbus.transitions.code();
    let verified = nimbus::code_store::Upload { id: upload, size: 250, sha256: sha256_hex(&data) };
    code.install(&verified, &id(), CodeFile::WorkerBinary).await.unwrap();
    let download = nimbus.call(&Route::Code(id(), CodeFile::WorkerBinary), b"").await;
    assert_eq!(download.status, 200);
    assert_eq!(download.body, data);
    assert_eq!(download.header(CHECKSUM_HEADER), Some(sha256_hex(&data).as_str()));
    assert_eq!(download.header("content-length"), Some("250"));
    nimbus.call(&Route::Code(id(), CodeFile::Topology), b"").await.assert_error(404, "no code file");

    // Sizes and names a client cannot get past.
    nimbus
        .call(&Route::BeginUpload, &body(&BeginUpload { size: 1001 }))
        .await
        .assert_error(413, "limit of 1000");
    nimbus.call(&Route::BeginUpload, br#"{"size":-1}"#).await.assert_error(400, "size");
    let small = nimbus.call(&Route::BeginUpload, &body(&BeginUpload { size: 500 })).await;
    let small = small.decode::<UploadBegun>().upload_id;
    nimbus
        .call(&Route::Chunk { upload: small, offset: 0 }, &[0; 101])
        .await
        .assert_error(413, "larger than 100");
    nimbus
        .request("POST", &format!("{API_PREFIX}/uploads/{small}/chunks/x"), b"a")
        .await
        .assert_error(400, "offset");
    for bad in ["..", "..%2F..%2Fstormdist", "%2e%2e", "123e4567e89b42d3a456426614174000", "nope"] {
        nimbus
            .request("POST", &format!("{API_PREFIX}/uploads/{bad}/chunks/0"), b"a")
            .await
            .assert_error(400, "invalid upload id");
    }
    nimbus
        .request("POST", &format!("{API_PREFIX}/uploads/../../x/chunks/0"), b"a")
        .await
        .assert_error(404, "no such resource");
    for bad in ["..", "worker.sha256", "..%2Fworker", "%2e%2e"] {
        nimbus
            .request("GET", &format!("{API_PREFIX}/topology/{ID}/code/{bad}"), b"")
            .await
            .assert_error(404, "unknown code file");
    }
    for bad in ["..", "%2e%2e"] {
        nimbus
            .request("GET", &format!("{API_PREFIX}/topology/{bad}/code/worker"), b"")
            .await
            .assert_error(400, "topology id");
    }
    let unknown: UploadId = "123e4567-e89b-42d3-a456-426614174000".parse().unwrap();
    nimbus.call(&Route::Chunk { upload: unknown, offset: 0 }, b"a").await.assert_error(404, "no upload");
    nimbus.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_survives_a_nimbus_restart() {
    let ensemble = Ensemble::zookeeper(ZkServer::shared().chroot("kill-restart").await);
    let dir = tempfile::tempdir().unwrap();
    let first = Nimbus::start(&ensemble, dir.path(), ApiConfig::default()).await;
    seed(first.session(), first.transitions.code()).await;
    let killed = first.call(&Route::Kill { id: id(), wait_secs: 2 }, b"").await;
    assert_eq!(killed.decode::<TopologyOperation>().topology_status, "KILLED");
    // The first nimbus goes away before the deadline, with everything it kept in memory.
    first.stop().await;
    let observer = ensemble.connect(&SessionOptions::default()).await.unwrap();
    let pending = stored_base(&observer).await.expect("the kill waits for its deadline");
    assert!(matches!(pending.pending_transition, Some(DelayedTransition::Kill { .. })));
    assert!(dir.path().join(format!("stormdist/{ID}/topology.yaml")).exists());

    let second = Nimbus::start(&ensemble, dir.path(), ApiConfig::default()).await;
    let paths = StormPaths::default();
    eventually(DEADLINE, "the restarted nimbus to finish the kill", || async {
        observer.exists(&paths.storm(&id())).await.unwrap().is_none().then_some(())
    })
    .await;
    for path in [paths.assignment(&id()), paths.workerbeats_topology(&id()), paths.errors_topology(&id())] {
        assert!(observer.exists(&path).await.unwrap().is_none(), "{path} is left");
    }
    assert!(!dir.path().join(format!("stormdist/{ID}")).exists(), "code dir is left");
    let list: TopologySummaries = second.call(&Route::TopologySummary, b"").await.decode();
    assert_eq!(list.topologies, []);
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_fires_at_its_deadline_without_waiting_for_a_rescan() {
    let ensemble = Ensemble::in_memory();
    let dir = tempfile::tempdir().unwrap();
    let hour = Duration::from_secs(3600);
    let nimbus =
        Nimbus::start_with(&ensemble, dir.path(), ApiConfig::default(), CodeStoreLimits::default(), hour)
            .await;
    seed(nimbus.session(), nimbus.transitions.code()).await;
    let started = tokio::time::Instant::now();
    assert_eq!(nimbus.call(&Route::Kill { id: id(), wait_secs: 1 }, b"").await.status, 200);
    eventually(DEADLINE, "the kill to complete", || async {
        stored_base(nimbus.session()).await.is_none().then_some(())
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(5), "fired by the armed timer, not an hourly rescan");
    assert!(nimbus.session().exists(&StormPaths::default().assignment(&id())).await.unwrap().is_none());
    assert!(!dir.path().join(format!("stormdist/{ID}")).exists());
    nimbus.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_rebalance_reschedules_onto_the_new_worker_count() {
    let ensemble = Ensemble::in_memory();
    let dir = tempfile::tempdir().unwrap();
    // No rescan during the test, so the only deadline applied is the test's own.
    let hour = Duration::from_secs(3600);
    let nimbus =
        Nimbus::start_with(&ensemble, dir.path(), ApiConfig::default(), CodeStoreLimits::default(), hour)
            .await;
    seed(nimbus.session(), nimbus.transitions.code()).await;
    let slots = |a: &Assignment| a.slots().into_iter().map(|s| s.port).collect::<Vec<_>>();
    let path = StormPaths::default().assignment(&id());
    let (before, _) = nimbus.session().read::<Assignment>(&path).await.unwrap();
    assert_eq!(slots(&before), vec![6700, 6701]);
    let rebalance = Event::Rebalance {
        wait_secs: 0,
        num_workers: Some(1),
        component_executors: [(comp("split"), 1)].into_iter().collect(),
    };
    nimbus.transitions.apply(&id(), rebalance, now_secs()).await.unwrap();
    // The timers' start-up rescan may race the test to the due rebalance; either applies it.
    let _ = nimbus.transitions.apply(&id(), Event::Deadline, now_secs()).await;
    let stored = stored_base(nimbus.session()).await.unwrap();
    assert_eq!((stored.status, stored.num_workers), (TopologyStatus::Active, 1));
    let (after, _) = nimbus.session().read::<Assignment>(&path).await.unwrap();
    assert_eq!(slots(&after).len(), 1, "one worker now");
    let executors: Vec<(u32, u32)> =
        after.executors.iter().map(|e| (e.executor.start_task().0, e.executor.end_task().0)).collect();
    assert_eq!(executors, vec![(1, 1), (2, 3)], "split's two tasks in one executor");
    nimbus.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_operations_each_apply_once() {
    let ensemble = Ensemble::in_memory();
    let dir = tempfile::tempdir().unwrap();
    let nimbus = Nimbus::start(&ensemble, dir.path(), ApiConfig::default()).await;
    seed(nimbus.session(), nimbus.transitions.code()).await;
    // Racing kills: compare-and-set makes each one read the other's write; all succeed.
    let kills = (0..8).map(|i| {
        let transitions = nimbus.transitions.clone();
        tokio::spawn(
            async move { transitions.apply(&id(), Event::Kill { wait_secs: 600 + i }, now_secs()).await },
        )
    });
    for kill in futures::future::join_all(kills).await {
        kill.unwrap().unwrap();
    }
    assert_eq!(stored_base(nimbus.session()).await.unwrap().status, TopologyStatus::Killed);
    nimbus.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_idle_keep_alive_connections() {
    let ensemble = Ensemble::in_memory();
    let dir = tempfile::tempdir().unwrap();
    let nimbus = Nimbus::start(&ensemble, dir.path(), ApiConfig::default()).await;
    let mut stream = TcpStream::connect(nimbus.addr).await.unwrap();
    let head = format!("GET {} HTTP/1.1\r\nHost: n\r\n\r\n", Route::ClusterSummary.path());
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0; 4096];
    let n = stream.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
    // The connection stays open (keep-alive); stopping must not wait for the client.
    nimbus.stop().await;
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the server closed the idle connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_until_shutdown_or_until_its_session_ends() {
    let memory = cluster_state::coord::MemoryEnsemble::new();
    let ensemble = Ensemble::Memory(memory.clone());
    let dir = tempfile::tempdir().unwrap();
    let config = nimbus::NimbusConfig { local_dir: dir.path().to_owned(), ..Default::default() };
    let start = |config: nimbus::NimbusConfig| {
        let ensemble = ensemble.clone();
        async move {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let shutdown = CancellationToken::new();
            let task = tokio::spawn({
                let shutdown = shutdown.clone();
                async move {
                    let registry = prometheus::Registry::new();
                    nimbus::serve(config, listener, ensemble, &registry, shutdown).await
                }
            });
            eventually(DEADLINE, "nimbus to answer", || async {
                let reply = request(addr, "GET", &Route::ClusterSummary.path(), &[], b"").await;
                (reply.status == 200).then_some(())
            })
            .await;
            (shutdown, task)
        }
    };

    let (shutdown, task) = start(config.clone()).await;
    assert!(dir.path().join("nimbus/stormdist").is_dir(), "code lives under storm.local.dir/nimbus");
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap().unwrap();

    let (_shutdown, task) = start(config).await;
    for session in memory.sessions() {
        memory.expire(session);
    }
    let ended = tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap();
    assert!(matches!(ended, Err(nimbus::NimbusError::SessionEnded { .. })), "{ended:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftovers_of_topologies_without_a_base_record_are_cleaned_up() {
    let ensemble = Ensemble::in_memory();
    let dir = tempfile::tempdir().unwrap();
    let nimbus = Nimbus::start(&ensemble, dir.path(), ApiConfig::default()).await;
    seed(nimbus.session(), nimbus.transitions.code()).await;
    let paths = StormPaths::default();
    let orphan: TopologyId = "gone-3-1700000000".parse().unwrap();
    let persistent = CreateMode::Persistent.with_parents();
    nimbus.session().create(&paths.assignment(&orphan), b"{}", persistent).await.unwrap();
    nimbus
        .session()
        .create(&format!("{}/sup-1-6700", paths.workerbeats_topology(&orphan)), b"", persistent)
        .await
        .unwrap();
    nimbus
        .session()
        .create(&format!("{}/split/e0000000000", paths.errors_topology(&orphan)), b"", persistent)
        .await
        .unwrap();
    // Garbage data under a valid name still means the topology exists: its parts stay.
    let garbled: TopologyId = "garbled-1-1700000000".parse().unwrap();
    nimbus.session().create(&paths.storm(&garbled), b"junk", persistent).await.unwrap();
    nimbus.session().create(&paths.assignment(&garbled), b"{}", persistent).await.unwrap();
    nimbus.session().create("/storm/assignments/not-an-id", b"{}", persistent).await.unwrap();

    let code_only: TopologyId = "codeonly-1-1700000000".parse().unwrap();
    std::fs::create_dir_all(dir.path().join(format!("stormdist/{code_only}"))).unwrap();
    std::fs::write(dir.path().join(format!("stormdist/{code_only}/worker")), b"x").unwrap();

    assert_eq!(nimbus.transitions.cleanup_orphans().await.unwrap(), vec![code_only.clone(), orphan.clone()]);
    assert!(!dir.path().join(format!("stormdist/{code_only}")).exists());
    for path in
        [paths.assignment(&orphan), paths.workerbeats_topology(&orphan), paths.errors_topology(&orphan)]
    {
        assert!(nimbus.session().exists(&path).await.unwrap().is_none(), "{path} is left");
    }
    for path in [paths.assignment(&id()), paths.assignment(&garbled), "/storm/assignments/not-an-id".into()] {
        assert!(nimbus.session().exists(&path).await.unwrap().is_some(), "{path} was removed");
    }
    assert!(dir.path().join(format!("stormdist/{ID}/topology.yaml")).exists());
    assert_eq!(nimbus.transitions.cleanup_orphans().await.unwrap(), vec![]);
    nimbus.stop().await;
}

/// Uploads `data` through the API; returns the upload id.
async fn upload(nimbus: &Nimbus, data: &[u8]) -> UploadId {
    let begun = nimbus.call(&Route::BeginUpload, &body(&BeginUpload { size: data.len() as u64 })).await;
    let id = begun.decode::<UploadBegun>().upload_id;
    assert_eq!(nimbus.call(&Route::Chunk { upload: id, offset: 0 }, data).await.status, 200);
    let finish = FinishUpload { sha256: sha256_hex(data) };
    assert_eq!(nimbus.call(&Route::FinishUpload(id), &body(&finish)).await.status, 200);
    id
}

/// The submit of an uploaded topology file, as `squall submit` sends it by default.
fn submit(topology: UploadId) -> SubmitTopology {
    SubmitTopology {
        topology_upload: topology,
        worker_upload: None,
        resources_upload: None,
        inactive: false,
        owner: String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_writes_base_heartbeat_dir_code_and_first_assignment() {
    let ensemble = Ensemble::in_memory();
    let dir = tempfile::tempdir().unwrap();
    let nimbus = Nimbus::start(&ensemble, dir.path(), ApiConfig::default()).await;
    let paths = StormPaths::default();
    // A live supervisor with three ports.
    seed(nimbus.session(), nimbus.transitions.code()).await;
    nimbus.transitions.remove(&id(), None).await.unwrap();

    let file = TOPOLOGY_FILE.replace("name: wc", "name: counter");
    let topology = upload(&nimbus, file.as_bytes()).await;
    let request = SubmitTopology { inactive: true, owner: "alice".into(), ..submit(topology) };
    let reply = nimbus.call(&Route::Submit, &body(&request)).await;
    assert_eq!(reply.status, 201, "{}", String::from_utf8_lossy(&reply.body));
    let submitted: Submitted = reply.decode();
    let id = submitted.id;
    assert_eq!((id.name(), submitted.status.as_str()), ("counter", "inactive"));
    let (base, _) = nimbus.session().read::<StormBase>(&paths.storm(&id)).await.unwrap();
    assert_eq!((base.status, base.num_workers, base.owner.as_str()), (TopologyStatus::Inactive, 2, "alice"));
    assert_eq!(base.component_executors, [(comp("count"), 1), (comp("split"), 2)].into_iter().collect());
    assert!(nimbus.session().exists(&paths.workerbeats_topology(&id)).await.unwrap().is_some());
    assert_eq!(
        std::fs::read(dir.path().join("stormdist").join(id.as_str()).join("topology.yaml")).unwrap(),
        file.as_bytes()
    );
    let (assignment, _) = nimbus.session().read::<Assignment>(&paths.assignment(&id)).await.unwrap();
    assert_eq!(assignment.executors.len(), 3);
    assert_eq!(assignment.slots().len(), 2, "topology.workers slots");

    // The same name again: refused while the first runs; nothing new is written.
    let again = upload(&nimbus, file.as_bytes()).await;
    nimbus.call(&Route::Submit, &body(&submit(again))).await.assert_error(409, "already running");
    assert_eq!(nimbus.session().children(&paths.storms_dir()).await.unwrap(), vec![id.to_string()]);
    nimbus.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_submits_are_refused_naming_what_is_wrong_and_write_nothing() {
    let ensemble = Ensemble::in_memory();
    let dir = tempfile::tempdir().unwrap();
    let nimbus = Nimbus::start(&ensemble, dir.path(), ApiConfig::default()).await;
    let bad_file = upload(&nimbus, b"name: t\nbolts: [{id: b, parallelism: 0}]\n").await;
    let not_text = upload(&nimbus, b"name: \xff\xfe").await;
    let never_uploaded: UploadId = "00000000-0000-4000-8000-000000000000".parse().unwrap();
    // Malformed bodies as literals; well-formed ones that nimbus refuses, typed.
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"{}".into(), 400, "topologyUpload"),
        (br#"{"topologyUpload": 7}"#.into(), 400, "topologyUpload"),
        (br#"{"topologyUpload": "../../etc"}"#.into(), 400, "upload id"),
        (body(&submit(never_uploaded)), 404, "upload"),
        (body(&submit(bad_file)), 400, "bolts[0] \"b\": parallelism must be at least 1"),
        (body(&submit(not_text)), 400, "not UTF-8"),
        (format!(r#"{{"topologyUpload": "{bad_file}", "inactive": "yes"}}"#).into(), 400, "inactive"),
        (format!(r#"{{"topologyUpload": "{bad_file}", "workerUpload": "nope"}}"#).into(), 400, "upload id"),
        (b"[1]".into(), 400, "JSON object"),
    ];
    for (request, status, says) in cases {
        nimbus.call(&Route::Submit, &request).await.assert_error(status, says);
    }
    assert!(
        nimbus.session().children(&StormPaths::default().storms_dir()).await.unwrap_or_default().is_empty()
    );
    assert_eq!(std::fs::read_dir(dir.path().join("stormdist")).unwrap().count(), 0, "no code installed");
    nimbus.stop().await;
}

/// The web UI's files and the Storm UI pages through the real server: security headers on
/// every answer, the topology page's stats from a supervisor's heartbeat, the component page,
/// the graph, the configuration without the token, and the consumer-group routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ui_and_storm_ui_pages_are_served_with_security_headers() {
    let ensemble = Ensemble::in_memory();
    let dir = tempfile::tempdir().unwrap();
    let token = "ui-test-token-5521";
    let nimbus =
        Nimbus::start(&ensemble, dir.path(), ApiConfig { token: Some(token.into()), ..Default::default() })
            .await;
    seed(nimbus.session(), nimbus.transitions.code()).await;

    let page = nimbus.request("GET", "/", b"").await;
    assert_eq!(page.status, 200);
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    assert!(page.header("content-security-policy").unwrap().contains("script-src 'self'"));
    assert!(String::from_utf8_lossy(&page.body).contains("id=\"routes\""));
    let script = nimbus.request("GET", "/ui/app.js", b"").await;
    assert_eq!((script.status, script.header("x-content-type-options")), (200, Some("nosniff")));
    nimbus.request("POST", "/", b"").await.assert_error(405, "accepts GET");
    let json = nimbus.call(&Route::ClusterSummary, b"").await;
    assert_eq!(json.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(json.header("x-frame-options"), Some("DENY"));

    let configuration = nimbus.call(&Route::ClusterConfiguration, b"").await;
    let text = String::from_utf8_lossy(&configuration.body).into_owned();
    assert!(text.contains("\"nimbus.http.token\":\"<redacted>\"") && !text.contains(token), "{text}");
    let config: ClusterConfiguration = configuration.decode();
    assert_eq!(config.0["nimbus.monitor.freq.secs"], serde_json::Value::from(10));

    // A supervisor reports stats: tasks 1 (count) and 2-3 (split).
    let stats = |executor, emitted| ExecutorStatsReport {
        executor,
        emitted,
        transferred: emitted,
        acked: emitted,
        failed: 0,
        execute_latency_ms: 0.5,
        process_latency_ms: 0.5,
        complete_latency_ms: 0.0,
    };
    let worker = |port, executors: Vec<ExecutorStatsReport>| WorkerReport {
        topology_id: id(),
        port,
        executors: executors.iter().map(|s| s.executor).collect(),
        time_secs: now_secs(),
        start_time_secs: now_secs() - 60,
        uptime_secs: 60,
        executor_stats: executors,
        metrics_endpoint: None,
        metrics_scheme: cluster_state::znode::MetricsScheme::Http,
    };
    let beat = SupervisorHeartbeat {
        supervisor_id: SupervisorId::new("sup-1").unwrap(),
        time_secs: now_secs(),
        uptime_secs: 60,
        workers: vec![
            worker(6700, vec![stats(executor(1, 1), 7), stats(executor(3, 3), 20)]),
            worker(6701, vec![stats(executor(2, 2), 30)]),
        ],
    };
    let auth = format!("Bearer {token}");
    let beat_path = Route::SupervisorHeartbeat.path();
    let accepted = request(nimbus.addr, "POST", &beat_path, &[("Authorization", &auth)], &body(&beat)).await;
    assert_eq!(accepted.status, 200, "{}", String::from_utf8_lossy(&accepted.body));
    let detail: TopologyDetail = nimbus.call(&Route::Topology(id()), b"").await.decode();
    let bolts: Vec<(&str, usize, u64)> =
        detail.bolts.iter().map(|b| (b.bolt_id.as_str(), b.executors, b.emitted)).collect();
    assert_eq!(bolts, [("count", 1, 7), ("split", 2, 50)]);
    assert!(detail.spouts.is_empty());
    assert_eq!(detail.workers.len(), 2);
    assert_eq!(detail.bolts[1].last_error.last_error, "newest failure");
    let ten: TopologyDetail =
        nimbus.request("GET", &format!("{}?window=600", Route::Topology(id()).path()), b"").await.decode();
    assert_eq!(ten.window, StatsWindow::TEN_MINUTES);
    nimbus
        .request("GET", &format!("{}?window=3", Route::Topology(id()).path()), b"")
        .await
        .assert_error(400, "window \"3\"");
    let split: ComponentPage = nimbus.call(&Route::Component(id(), comp("split")), b"").await.decode();
    assert_eq!(
        (split.component_type.as_str(), split.executor_stats.len(), split.component_errors.len()),
        ("bolt", 2, 2)
    );
    nimbus.call(&Route::Component(id(), comp("nope")), b"").await.assert_error(404, "no spout or bolt nope");
    let graph: Visualization = nimbus.call(&Route::Visualization(id()), b"").await.decode();
    assert_eq!(graph.0.len(), 2);

    let groups: ConsumerGroups = nimbus.call(&Route::ConsumerGroups, b"").await.decode();
    assert!(groups.groups.is_empty());
    let group = GroupId::new("nobody").unwrap();
    nimbus
        .call(&Route::ConsumerGroup(group.clone()), b"")
        .await
        .assert_error(404, "no consumer group nobody");
    let plan = body(&ResetPlanRequest { topic: None, to: ResetTarget::Earliest, value: None });
    nimbus.call(&Route::ResetPlan(group.clone()), &plan).await.assert_error(401, "Bearer");
    let refused =
        request(nimbus.addr, "POST", &Route::ResetPlan(group).path(), &[("Authorization", &auth)], &plan)
            .await;
    refused.assert_error(404, "no consumer group nobody");
    nimbus.stop().await;
}
