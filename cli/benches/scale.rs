//! Scale simulation (issue 18): a real ZooKeeper (the test harness's server) and a real
//! `squall nimbus` process; S simulated supervisors in this process, each registering,
//! syncing assignments and sending aggregated heartbeats through the supervisor crate's own
//! code ([`Registration`], [`SyncLoop`], [`Reporter`]), with a [`Node`] that runs simulated
//! workers instead of processes. Topologies (word count: 10 Kafka spouts, 100 split, 100
//! count and 100 ackers on 100 workers) fill 90% of the 10 slots of every supervisor (so the
//! workers of the 10% of supervisors killed at the end have free slots to go to); each spout task
//! is a real consumer-registry [`Member`] owning one partition and committing its offset
//! through [`consumer_registry::OffsetStore::commit`] every `offsets.commit.interval.ms`
//! (2 s, or `SQUALL_SCALE_COMMIT_MS`) as the Kafka spout does; each simulated supervisor
//! writes its workers' `/storm/workerbeats` nodes as a real one does ([`Workerbeats`] on its
//! registration's session: one `multi` of the changed nodes at most every
//! `squall.workerbeats.zk.secs`, 60).
//!
//! For each S it prints: ZooKeeper transactions/s at steady state (the server's zxid) and the
//! bytes/s and node writes/s under `/storm` and `/consumers` (`mntr`'s write_per_namespace),
//! nimbus CPU per second and RSS (`/proc`), monitor pass p50 / p99
//! (`squall_nimbus_monitor_pass_duration_seconds`), time from the first submit to every
//! simulated worker reporting (`squall_nimbus_workers_reported`), and time from closing the
//! sessions of 10% of the supervisors until no assignment names them and every executor is
//! assigned again, with the executors nimbus moved meanwhile (ideally exactly those that were
//! on the dead supervisors); then the goals.
//!
//! `cargo bench -p squall-cli --bench scale` (release). Environment: `SQUALL_SCALE_S`
//! (default `10,100,500,2000`), `SQUALL_SCALE_WINDOW_SECS` (steady-state window, 120),
//! `SQUALL_SCALE_LOG=DIR` keeps nimbus's log. Storm's defaults otherwise
//! (`nimbus.monitor.freq.secs` 10, `nimbus.supervisor.timeout.secs` 60,
//! `supervisor.heartbeat.frequency.secs` 5, `supervisor.monitor.frequency.secs` 3).
//! Not a timed test: it prints figures.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster_state::api::SubmitTopology;
use cluster_state::coord::{Ensemble, Session, SessionOptions};
use cluster_state::ids::{ConsumerId, ExecutorId, GroupId, Partition, SupervisorId, Topic, TopologyId};
use cluster_state::metrics::CoordMetrics;
use cluster_state::paths::{KafkaPaths, StormPaths};
use cluster_state::znode::{
    Assignment, ExecutorStats, LocalWorkerHeartbeat, MetricsScheme, SupervisorInfo, TopicRegistration,
    ZnodeData,
};
use consumer_registry::{
    Member, MemberEvent, MemberHandle, MemberSpec, RegistryConfig, RegistryMetrics, TopicPartition,
};
use nimbus_client::NimbusClient;
use supervisor::heartbeat::{BeatSource, Reporter, RunningWorker};
use supervisor::plan::LocalAssignment;
use supervisor::registration::Registration;
use supervisor::sync::{Node, SyncLoop};
use supervisor::workerbeats::Workerbeats;
use test_harness::{ZkServer, eventually};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const SQUALL: &str = env!("CARGO_BIN_EXE_squall");
const SLOTS: u16 = 10;
/// Slots the topologies fill, in percent: 90, so that when 10% of the supervisors die the free
/// slots can take their workers (Storm's scheduler never puts dead executors onto a slot whose
/// executors are alive: with no free slot they would wait, unassigned).
const FILL_PERCENT: usize = 90;
const FIRST_PORT: u16 = 6700;
/// Workers per topology (the last one may be smaller, to fill the slots exactly).
const TOPOLOGY_WORKERS: usize = 100;
/// Storm's defaults.yaml: `supervisor.heartbeat.frequency.secs` 5, `supervisor.monitor.frequency.secs` 3.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);
const SUPERVISOR_TICK: Duration = Duration::from_secs(3);
/// Storm's defaults.yaml: `nimbus.monitor.freq.secs` 10, `nimbus.supervisor.timeout.secs` 60.
const MONITOR_SECS: u64 = 10;
const SUPERVISOR_TIMEOUT_SECS: u64 = 60;
/// The supervisor's `squall.workerbeats.zk.secs`.
const WORKERBEATS_ZK_EVERY: Duration = Duration::from_secs(60);
/// Tuples a simulated executor handles per second (its counters grow, so its workerbeat
/// content changes as a busy worker's does).
const TUPLES_PER_SEC: u64 = 1000;

fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| s.trim().parse().unwrap_or_else(|_| panic!("{name}: {s:?} is not a number")))
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn now_secs() -> u64 {
    cluster_state::clock::now_secs()
}

/// What one simulated supervisor runs: port -> (what, since when). Shared by its [`Node`]
/// (the sync task writes it) and its [`BeatSource`]s (the reporter's and the workerbeats', which read it).
type Running = Arc<Mutex<BTreeMap<u16, (LocalAssignment, u64)>>>;

/// The simulated workers of one supervisor: "started" the moment their port is assigned.
struct SimNode {
    running: Running,
}

impl Node for SimNode {
    async fn apply(&mut self, _: &Session, desired: &BTreeMap<u16, LocalAssignment>) {
        let mut running = self.running.lock().unwrap();
        running.retain(|port, (assignment, _)| desired.get(port) == Some(assignment));
        for (port, assignment) in desired {
            running.entry(*port).or_insert_with(|| (assignment.clone(), now_secs()));
        }
    }

    fn running(&self) -> Vec<RunningWorker> {
        self.running
            .lock()
            .unwrap()
            .iter()
            .map(|(port, (a, start))| RunningWorker {
                worker_id: format!("sim-{port}-{start}"),
                port: *port,
                topology_id: a.topology_id.clone(),
            })
            .collect()
    }

    fn used_ports(&self) -> Vec<u16> {
        self.running.lock().unwrap().keys().copied().collect()
    }
}

/// Stats of a simulated executor that has run since `start`.
fn stats(executors: &BTreeSet<ExecutorId>, start: u64, now: u64) -> Vec<ExecutorStats> {
    let n = now.saturating_sub(start) * TUPLES_PER_SEC;
    executors
        .iter()
        .map(|e| ExecutorStats {
            executor: *e,
            emitted: n,
            transferred: n,
            acked: n,
            failed: 0,
            execute_latency_ms: 0.05,
            process_latency_ms: 0.08,
            complete_latency_ms: 2.5,
        })
        .collect()
}

/// The simulated workers' local heartbeats, as their files would say now.
struct SimBeats {
    running: Running,
}

impl BeatSource for SimBeats {
    fn beats(&mut self) -> Vec<LocalWorkerHeartbeat> {
        let now = now_secs();
        self.running
            .lock()
            .unwrap()
            .iter()
            .map(|(port, (a, start))| LocalWorkerHeartbeat {
                time_secs: now,
                topology_id: a.topology_id.clone(),
                executors: a.executors.iter().copied().collect(),
                port: *port,
                start_time_secs: Some(*start),
                executor_stats: stats(&a.executors, *start, now),
                metrics_endpoint: None,
                metrics_scheme: MetricsScheme::Http,
                workerbeats_zk_secs: Some(WORKERBEATS_ZK_EVERY.as_secs()),
            })
            .collect()
    }
}

struct SimSupervisor {
    id: SupervisorId,
    cancel: CancellationToken,
}

fn start_supervisor(
    n: usize,
    ensemble: &Ensemble,
    nimbus: &str,
    sync_metrics: &CoordMetrics,
    tasks: &mut tokio::task::JoinSet<()>,
) -> SimSupervisor {
    let id = SupervisorId::new(format!("sim-{n:05}")).unwrap();
    let cancel = CancellationToken::new();
    let paths = StormPaths::default();
    let session_options =
        SessionOptions { session_timeout: Duration::from_secs(20), ..SessionOptions::default() };
    let ports: Vec<u16> = (FIRST_PORT..FIRST_PORT + SLOTS).collect();
    let running: Running = Arc::default();
    let (ports_tx, ports_rx) = watch::channel(Vec::new());
    let registration = Registration {
        ensemble: ensemble.clone(),
        session_options: session_options.clone(),
        paths: paths.clone(),
        info: SupervisorInfo {
            time_secs: 0,
            hostname: format!("host-{n:05}"),
            supervisor_id: id.clone(),
            used_ports: Vec::new(),
            all_ports: ports.clone(),
            uptime_secs: 0,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            metrics_endpoint: None,
            metrics_scheme: MetricsScheme::Http,
        },
        used_ports: ports_rx,
        heartbeat_interval: HEARTBEAT_EVERY,
        workerbeats: Some(Workerbeats::new(
            paths.clone(),
            id.clone(),
            WORKERBEATS_ZK_EVERY,
            Box::new(SimBeats { running: running.clone() }),
        )),
    };
    tasks.spawn(registration.run(cancel.child_token()));
    let reporter = Reporter {
        supervisor_id: id.clone(),
        client: Reporter::<SimBeats>::client_for(NimbusClient::new(nimbus, None), HEARTBEAT_EVERY),
        interval: HEARTBEAT_EVERY,
        source: SimBeats { running: running.clone() },
    };
    tasks.spawn(reporter.run(cancel.child_token()));
    let sync = SyncLoop {
        ensemble: ensemble.clone(),
        session_options,
        paths,
        supervisor_id: id.clone(),
        slots: ports.into_iter().collect(),
        tick: SUPERVISOR_TICK,
        coord_metrics: Some(sync_metrics.clone()),
    };
    let sync_cancel = cancel.child_token();
    tasks.spawn(async move {
        let mut node = SimNode { running };
        let (workers_tx, _) = watch::channel(Vec::new());
        sync.run(&mut node, &ports_tx, &workers_tx, sync_cancel).await;
    });
    SimSupervisor { id, cancel }
}

/// One Kafka spout task: a registry member that commits its partitions' offsets every
/// interval, advancing as a busy spout's would.
fn start_spout_task(
    ensemble: &Ensemble,
    group: &GroupId,
    topic: &Topic,
    consumer: ConsumerId,
    metrics: &RegistryMetrics,
    cancel: CancellationToken,
    tasks: &mut tokio::task::JoinSet<()>,
) -> MemberHandle {
    let spec = MemberSpec {
        ensemble: ensemble.clone(),
        paths: KafkaPaths::new(None).unwrap(),
        group: group.clone(),
        consumer_id: Some(consumer),
        host: "sim".into(),
        subscription: BTreeMap::from([(topic.clone(), 1)]),
        partition_source: None,
        detached_session: false,
    };
    // Kafka's 6 s session timeout is for one member per process; thousands of them in this one
    // process, on a shared 2-core machine, would expire for want of CPU, not of ZooKeeper.
    let config = RegistryConfig { zookeeper_session_timeout_ms: 30_000, ..RegistryConfig::default() };
    let (member, handle, mut events) = Member::new(spec, config, metrics.clone()).unwrap();
    let member_cancel = cancel.clone();
    tasks.spawn(async move {
        let _ = member.run(member_cancel).await;
    });
    tasks.spawn(async move {
        while let Some(event) = events.recv().await {
            if let MemberEvent::Revoking { ack, .. } = event {
                ack.ack();
            }
        }
    });
    let committer = handle.clone();
    let interval = Duration::from_millis(commit_interval_ms());
    tasks.spawn(async move {
        // Spread the tasks' commits over the interval, as tasks started at different times are.
        let phase = interval.mul_f64(rand_fraction(committer.consumer_id().as_str()));
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(phase) => {}
        }
        let mut tick = tokio::time::interval(interval);
        let mut offsets: BTreeMap<TopicPartition, i64> = BTreeMap::new();
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let owned: BTreeSet<TopicPartition> = committer.ownership().partitions.into_keys().collect();
            offsets.retain(|tp, _| owned.contains(tp));
            for tp in owned {
                *offsets.entry(tp).or_insert(0) += 2 * TUPLES_PER_SEC as i64;
            }
            if !offsets.is_empty() {
                let _ = committer.offsets().commit(&offsets).await;
            }
        }
    });
    handle
}

/// `offsets.commit.interval.ms` of the simulated spout tasks: `SQUALL_SCALE_COMMIT_MS`, else the
/// Kafka spout's default.
fn commit_interval_ms() -> u64 {
    std::env::var("SQUALL_SCALE_COMMIT_MS")
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("SQUALL_SCALE_COMMIT_MS: {v:?} is not a number")))
        .unwrap_or(kafka_spout::KafkaSpoutConfig::default().offsets_commit_interval_ms)
}

/// A number in [0, 1) from `s` (a stable spread, no RNG needed).
fn rand_fraction(s: &str) -> f64 {
    let h =
        s.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    (h % 10_000) as f64 / 10_000.0
}

fn topology_file(name: &str, workers: usize) -> String {
    let spouts = workers.div_ceil(10);
    format!(
        "name: {name}\nconfig:\n  topology.workers: {workers}\nspouts:\n  - id: kafka-spout\n    className: kafka-spout\n    parallelism: {spouts}\n\
         bolts:\n  - id: split\n    className: split-sentence\n    parallelism: {workers}\n  - id: count\n    className: word-count\n    parallelism: {workers}\n\
         streams:\n  - from: kafka-spout\n    to: split\n    grouping: {{type: SHUFFLE}}\n  - from: split\n    to: count\n    grouping: {{type: FIELDS, args: [word]}}\n"
    )
}

/// nimbus's `/metrics` page.
async fn metrics_page(client: &NimbusClient) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(&client.address).await.ok()?;
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {}\r\n\r\n", client.address);
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut page = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut page)).await.ok()?.ok()?;
    Some(page)
}

fn metric(page: &str, name: &str) -> Option<f64> {
    page.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The monitor-pass histogram: (upper bound, cumulative count).
fn pass_buckets(page: &str) -> Vec<(f64, f64)> {
    page.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("squall_nimbus_monitor_pass_duration_seconds_bucket{le=\"")?;
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

/// Prometheus's `histogram_quantile` over the passes between two pages.
fn quantile(q: f64, before: &[(f64, f64)], after: &[(f64, f64)]) -> Option<f64> {
    let buckets: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| (*le, n - before.iter().find(|(b, _)| b == le).map_or(0.0, |(_, m)| *m)))
        .collect();
    let total = buckets.last()?.1;
    if total == 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for (le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let within = if count > lower.1 { (rank - lower.1) / (count - lower.1) } else { 1.0 };
            return Some(lower.0 + (le - lower.0) * within);
        }
        lower = (le, count);
    }
    None
}

/// `utime + stime` of `pid`, and its RSS and peak RSS in MiB, from `/proc`.
fn proc_usage(pid: u32) -> (Duration, f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(") ").map(|(_, r)| r.split(' ').collect()).unwrap_or_default();
    let ticks: u64 = fields.get(11).and_then(|u| u.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    // USER_HZ is 100 on Linux.
    (Duration::from_millis(ticks * 10), kib("VmRSS:"), kib("VmHWM:"))
}

/// ZooKeeper's own counters: transactions (zxid), and per namespace the node writes and bytes.
#[derive(Debug, Clone, Default)]
struct ZkCounters {
    transactions: u64,
    /// namespace -> (writes, bytes) of creates and setData (each op of a multi counted).
    written: BTreeMap<String, (f64, f64)>,
}

fn zk_counters(server: &ZkServer) -> ZkCounters {
    let transactions = server.transactions().unwrap();
    let mntr = server.mntr().unwrap();
    let mut written = BTreeMap::new();
    for ns in ["storm", "consumers", "brokers"] {
        let get = |k: String| mntr.get(&k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        written.insert(
            ns.to_owned(),
            (
                get(format!("zk_cnt_{ns}_write_per_namespace")),
                get(format!("zk_sum_{ns}_write_per_namespace")),
            ),
        );
    }
    ZkCounters { transactions, written }
}

fn start_nimbus(dir: &Path, zookeeper: &str, port: u16) -> Child {
    std::fs::create_dir_all(dir).unwrap();
    let log = std::fs::File::create(dir.join("nimbus.log")).unwrap();
    Command::new(SQUALL)
        .args(["nimbus", "--zookeeper", zookeeper])
        .args(["-c", &format!("storm.local.dir={}", dir.join("local").display())])
        .args(["-c", &format!("nimbus.http.port={port}")])
        .args(["-c", "nimbus.http.host=127.0.0.1"])
        .args(["-c", "storm.local.hostname=127.0.0.1"])
        .args(["-c", &format!("nimbus.monitor.freq.secs={MONITOR_SECS}")])
        .args(["-c", &format!("nimbus.supervisor.timeout.secs={SUPERVISOR_TIMEOUT_SECS}")])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// Executors of every assignment: how many in all, and how many on a supervisor in `dead`.
async fn on_dead(session: &Session, dead: &BTreeSet<SupervisorId>) -> Option<(usize, usize)> {
    let paths = StormPaths::default();
    let (mut all, mut n) = (0, 0);
    for child in session.children(&paths.assignments_dir()).await.ok()? {
        let id: TopologyId = child.parse().ok()?;
        let (a, _) = session.read::<Assignment>(&paths.assignment(&id)).await.ok()?;
        all += a.executors.len();
        n += a.executors.iter().filter(|e| dead.contains(&e.node)).count();
    }
    Some((all, n))
}

struct Figures {
    supervisors: usize,
    workers: usize,
    spout_tasks: usize,
    topologies: usize,
    submit_secs: f64,
    reporting_secs: f64,
    /// From the last submit's start to every worker reporting: one submit's latency.
    last_reporting_secs: f64,
    window_secs: f64,
    transactions_per_sec: f64,
    written: BTreeMap<String, (f64, f64)>,
    nimbus_cpu_per_sec: f64,
    nimbus_rss_mib: f64,
    nimbus_peak_mib: f64,
    pass_p50: Option<f64>,
    pass_p99: Option<f64>,
    passes: f64,
    all_pass_p99: Option<f64>,
    reassign_secs: f64,
    /// Executors on the dead supervisors, and those nimbus moved until all were reassigned.
    to_move: usize,
    moved: f64,
    /// `/proc/loadavg`'s 1-minute figure at the end of the steady-state window.
    load: f64,
}

#[allow(clippy::too_many_lines)] // the story of one run, read top to bottom
async fn run(s: usize, window: Duration) -> Figures {
    let server = ZkServer::start();
    let zookeeper = server.connect_string();
    let root = tempfile::tempdir().unwrap();
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let mut nimbus = start_nimbus(root.path(), &zookeeper, port);
    let nimbus_pid = nimbus.id();
    let client = NimbusClient::new(address.clone(), None);
    eventually(Duration::from_secs(60), "nimbus to answer", || async { client.cluster_summary().await.ok() })
        .await;
    let ensemble = Ensemble::zookeeper(zookeeper.clone());
    let session = ensemble.connect(&SessionOptions::default()).await.unwrap();

    // Supervisors, in batches (thousands of sessions opening at once would time out).
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    // The simulated supervisors' sync sessions share one set of request counters: what they
    // read from ZooKeeper (getData) during the reassignment.
    let sync_metrics = CoordMetrics::register(&prometheus::Registry::new()).unwrap();
    let mut supervisors = Vec::new();
    for n in 0..s {
        supervisors.push(start_supervisor(n, &ensemble, &address, &sync_metrics, &mut tasks));
        if n % 50 == 49 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    eventually(Duration::from_secs(300), &format!("nimbus to see {s} supervisors"), || async {
        (client.cluster_summary().await.ok()?.supervisors == s).then_some(())
    })
    .await;
    eprintln!("S={s}: {s} supervisors registered in {:.1} s", started.elapsed().as_secs_f64());

    // Topologies filling every slot, submitted one after another.
    let workers = s * usize::from(SLOTS) * FILL_PERCENT / 100;
    let mut sizes = vec![TOPOLOGY_WORKERS; workers / TOPOLOGY_WORKERS];
    if !workers.is_multiple_of(TOPOLOGY_WORKERS) {
        sizes.push(workers % TOPOLOGY_WORKERS);
    }
    let submit_start = Instant::now();
    let mut topologies = Vec::new();
    let mut last_submit = submit_start;
    for (i, size) in sizes.iter().enumerate() {
        last_submit = Instant::now();
        let name = format!("sim-{i:04}");
        let upload = client.upload(topology_file(&name, *size).as_bytes(), |_| {}).await.unwrap();
        let request = SubmitTopology {
            topology_upload: upload,
            worker_upload: None,
            resources_upload: None,
            inactive: false,
            owner: "bench".into(),
        };
        let id = client.submit(&request).await.unwrap().id;
        topologies.push((name, id, size.div_ceil(10)));
    }
    let submit_secs = submit_start.elapsed().as_secs_f64();
    eventually(Duration::from_secs(600), &format!("nimbus to hear of all {workers} workers"), || async {
        let page = metrics_page(&client).await?;
        (metric(&page, "squall_nimbus_workers_reported")? as usize == workers).then_some(())
    })
    .await;
    let reporting_secs = submit_start.elapsed().as_secs_f64();
    let last_reporting_secs = last_submit.elapsed().as_secs_f64();
    eprintln!(
        "S={s}: {} topologies submitted in {submit_secs:.1} s, all reporting {reporting_secs:.1} s after the first submit, {last_reporting_secs:.1} s after the last",
        sizes.len()
    );

    // Spout tasks: one member per task, a 10-partition topic per topology.
    let spouts_cancel = CancellationToken::new();
    let registry_metrics = RegistryMetrics::register(&prometheus::Registry::new()).unwrap();
    let kafka = KafkaPaths::new(None).unwrap();
    let mut handles = Vec::new();
    for (name, _, spouts) in &topologies {
        let topic = Topic::new(format!("t-{name}")).unwrap();
        let registration = TopicRegistration {
            partitions: (0..*spouts as i32).map(|p| (Partition::new(p).unwrap(), vec![])).collect(),
        };
        session
            .create(
                &kafka.topic(&topic),
                &registration.encode(),
                cluster_state::coord::CreateMode::Persistent.with_parents(),
            )
            .await
            .unwrap();
        let group = GroupId::new(name.clone()).unwrap();
        for task in 0..*spouts {
            let consumer = ConsumerId::new(format!("{name}_kafka-spout-{task}")).unwrap();
            handles.push(start_spout_task(
                &ensemble,
                &group,
                &topic,
                consumer,
                &registry_metrics,
                spouts_cancel.child_token(),
                &mut tasks,
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let spout_tasks = handles.len();
    // Bounded, not fatal: the figures say how many owned a partition (and so committed).
    let owning = || handles.iter().filter(|h| h.ownership().partitions.len() == 1).count();
    let deadline = Instant::now() + Duration::from_secs(180);
    while owning() < spout_tasks && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("S={s}: {} of {spout_tasks} spout tasks own their partition", owning());

    // Steady state: let the first workerbeat writes and commits pass, then measure.
    tokio::time::sleep(WORKERBEATS_ZK_EVERY + Duration::from_secs(5)).await;
    let before_page = metrics_page(&client).await.unwrap();
    let zk_before = zk_counters(&server);
    let (cpu_before, _, _) = proc_usage(nimbus_pid);
    let window_start = Instant::now();
    tokio::time::sleep(window).await;
    let window_secs = window_start.elapsed().as_secs_f64();
    let zk_after = zk_counters(&server);
    let (cpu_after, rss, peak) = proc_usage(nimbus_pid);
    let load: f64 = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let after_page = metrics_page(&client).await.unwrap();
    let (before, after) = (pass_buckets(&before_page), pass_buckets(&after_page));
    let written: BTreeMap<String, (f64, f64)> = zk_after
        .written
        .iter()
        .map(|(ns, (w, b))| {
            let (w0, b0) = zk_before.written.get(ns).copied().unwrap_or_default();
            (ns.clone(), ((w - w0) / window_secs, (b - b0) / window_secs))
        })
        .collect();

    // The steady state's figures now, in case the reassignment below never completes.
    let tps = (zk_after.transactions - zk_before.transactions) as f64 / window_secs;
    eprintln!(
        "S={s}: steady state over {window_secs:.0} s: {tps:.1} txn/s, writes/bytes per s by namespace {written:?}, nimbus cpu {:.3} s/s rss {rss:.0} MiB (peak {peak:.0}), monitor p50 {} p99 {}",
        (cpu_after - cpu_before).as_secs_f64() / window_secs,
        ms(quantile(0.5, &before, &after)),
        ms(quantile(0.99, &before, &after)),
    );
    // Close the sessions of every tenth supervisor; time until no assignment names them.
    let dead: BTreeSet<SupervisorId> = supervisors.iter().step_by(10).map(|s| s.id.clone()).collect();
    // Read before the kill (retried: a read under this load can time out).
    let (executors, to_move) =
        eventually(Duration::from_secs(60), "the assignments", || on_dead(&session, &dead)).await;
    let killed = Instant::now();
    for sup in supervisors.iter().step_by(10) {
        sup.cancel.cancel();
    }
    let counters = |page: &str| {
        [
            "squall_nimbus_executors_reassigned_total",
            "squall_nimbus_assignments_written_total",
            "squall_nimbus_cluster_reads_total",
            "squall_nimbus_node_index_writes_total",
        ]
        .map(|name| metric(page, name).unwrap_or(0.0))
    };
    let counted_before = counters(&after_page);
    let reads_before = sync_reads(&sync_metrics);
    let timeline_cancel = CancellationToken::new();
    let timeline = tokio::spawn(reassignment_timeline(
        client.clone(),
        killed,
        workers,
        sync_metrics.clone(),
        timeline_cancel.clone(),
    ));
    // Every executor back in an assignment, none on a dead supervisor.
    eventually(Duration::from_secs(900), "the dead supervisors' executors to move", || async {
        (on_dead(&session, &dead).await? == (executors, 0)).then_some(())
    })
    .await;
    let reassign_secs = killed.elapsed().as_secs_f64();
    eprintln!("S={s}: {reassign_secs:.1} s: no assignment names a dead supervisor");
    // Then every moved worker running again on its new supervisor (reported to nimbus).
    eventually(Duration::from_secs(600), "every worker reporting again", || async {
        let page = metrics_page(&client).await?;
        (metric(&page, "squall_nimbus_workers_reported")? as usize == workers).then_some(())
    })
    .await;
    let running_again_secs = killed.elapsed().as_secs_f64();
    timeline_cancel.cancel();
    let events = timeline.await.unwrap_or_default();
    let (reads, read_secs) = sync_reads(&sync_metrics);
    eprintln!(
        "S={s}: timeline after the kill (s): {} | every worker reporting again {running_again_secs:.1} s | supervisors' getData meanwhile: {:.0} reads taking {:.1} s in all",
        events.join("; "),
        reads - reads_before.0,
        read_secs - reads_before.1,
    );
    let last_page = metrics_page(&client).await.unwrap();
    let counted = counters(&last_page);
    let [moved, rewritten, reads, indexes] = [0, 1, 2, 3].map(|i| counted[i] - counted_before[i]);
    eprintln!(
        "S={s}: reassigned in {reassign_secs:.1} s: {to_move} executors were on the dead supervisors; nimbus moved {moved} and wrote {rewritten} assignments and {indexes} node indexes, reading {reads} changed nodes"
    );

    let figures = Figures {
        supervisors: s,
        workers,
        spout_tasks,
        topologies: topologies.len(),
        submit_secs,
        reporting_secs,
        last_reporting_secs,
        window_secs,
        transactions_per_sec: tps,
        written,
        nimbus_cpu_per_sec: (cpu_after - cpu_before).as_secs_f64() / window_secs,
        nimbus_rss_mib: rss,
        nimbus_peak_mib: peak,
        pass_p50: quantile(0.5, &before, &after),
        pass_p99: quantile(0.99, &before, &after),
        passes: after.last().map_or(0.0, |(_, n)| *n) - before.last().map_or(0.0, |(_, n)| *n),
        all_pass_p99: quantile(0.99, &[], &pass_buckets(&last_page)),
        reassign_secs,
        to_move,
        moved,
        load,
    };

    spouts_cancel.cancel();
    for sup in &supervisors {
        sup.cancel.cancel();
    }
    while tasks.join_next().await.is_some() {}
    let _ = nimbus.kill();
    let _ = nimbus.wait();
    if let Ok(dir) = std::env::var("SQUALL_SCALE_LOG") {
        let _ =
            std::fs::copy(root.path().join("nimbus.log"), Path::new(&dir).join(format!("nimbus-{s}.log")));
    }
    drop(session);
    figures
}

/// The simulated supervisors' sync sessions' getData requests: how many, and their total time.
fn sync_reads(metrics: &CoordMetrics) -> (f64, f64) {
    let h = metrics.request_duration.with_label_values(&["getData"]);
    (h.get_sample_count() as f64, h.get_sample_sum())
}

/// What happened after the kill, second by second from nimbus's metrics until `cancel`: when
/// each monitor pass ended and how long it took, when nimbus wrote assignments, how many
/// workers reported, and the supervisors' reads.
async fn reassignment_timeline(
    client: NimbusClient,
    killed: Instant,
    workers: usize,
    sync_metrics: CoordMetrics,
    cancel: CancellationToken,
) -> Vec<String> {
    let mut events = Vec::new();
    let mut last: Option<(f64, f64, f64, f64)> = None;
    let mut reported_low = workers as f64;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    // Bounded by the caller's deadlines; at most one event per poll.
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        let Some(page) = metrics_page(&client).await else { continue };
        let at = killed.elapsed().as_secs_f64();
        let get = |name: &str| metric(&page, name).unwrap_or(0.0);
        let now = (
            get("squall_nimbus_monitor_pass_duration_seconds_count"),
            get("squall_nimbus_monitor_pass_duration_seconds_sum"),
            get("squall_nimbus_assignments_written_total"),
            get("squall_nimbus_supervisors"),
        );
        let reported = get("squall_nimbus_workers_reported");
        reported_low = reported_low.min(reported);
        if let Some(before) = last {
            let mut said = Vec::new();
            if now.0 > before.0 {
                said.push(format!("pass ended ({:.2} s)", (now.1 - before.1) / (now.0 - before.0)));
            }
            if now.2 > before.2 {
                said.push(format!("{} assignments written", now.2 - before.2));
            }
            if (now.3 - before.3).abs() > 0.0 {
                said.push(format!("live supervisors {}", now.3));
            }
            if !said.is_empty() {
                let (reads, _) = sync_reads(&sync_metrics);
                said.push(format!(
                    "workers reported {reported} (low {reported_low}), supervisor reads {reads}"
                ));
                events.push(format!("{at:.1}: {}", said.join(", ")));
            }
        }
        last = Some(now);
    }
    events
}

fn ms(q: Option<f64>) -> String {
    q.map_or_else(|| "-".into(), |v| format!("{:.0} ms", v * 1000.0))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // Thousands of sessions: as many descriptors as allowed (ZooKeeper inherits the limit).
    if let Ok(limit) = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum.ok_or(()) {
        let _ = rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit { current: Some(limit), maximum: Some(limit) },
        );
    }
    let sizes = env_list("SQUALL_SCALE_S", "10,100,500,2000");
    let window = Duration::from_secs(env_list("SQUALL_SCALE_WINDOW_SECS", "120")[0] as u64);
    let mut all = Vec::new();
    for s in sizes {
        let f = run(s, window).await;
        let ns = |n: &str| f.written.get(n).copied().unwrap_or_default();
        println!(
            "S={:>5} workers={:>6} spout_tasks={:>5} topologies={:>4} | zk {:>7.1} txn/s; /storm {:>6.1} writes/s {:>9.0} B/s; /consumers {:>6.1} writes/s {:>7.0} B/s | nimbus cpu {:.3} s/s rss {:.0} MiB (peak {:.0}) | monitor p50 {} p99 {} ({} passes; whole run p99 {}) | submit {:.1} s, all reporting {:.1} s (last submit -> all reporting {:.1} s) | reassigned {:.1} s after 10% died ({} executors to move, {} moved) | load {:.1}",
            f.supervisors,
            f.workers,
            f.spout_tasks,
            f.topologies,
            f.transactions_per_sec,
            ns("storm").0,
            ns("storm").1,
            ns("consumers").0,
            ns("consumers").1,
            f.nimbus_cpu_per_sec,
            f.nimbus_rss_mib,
            f.nimbus_peak_mib,
            ms(f.pass_p50),
            ms(f.pass_p99),
            f.passes,
            ms(f.all_pass_p99),
            f.submit_secs,
            f.reporting_secs,
            f.last_reporting_secs,
            f.reassign_secs,
            f.to_move,
            f.moved,
            f.load,
        );
        let _ = f.window_secs;
        all.push(f);
    }
    if let Some(f) = all.iter().find(|f| f.supervisors == 2000) {
        println!(
            "goals at S=2000: writes {:.0}/s (<= 1000) | monitor p99 {} (<= 1 s) | submit -> all reporting {:.1} s (<= 30 s) | reassigned {:.1} s (<= {} s) | nimbus rss {:.0} MiB (<= 1024)",
            f.transactions_per_sec,
            ms(f.pass_p99),
            f.last_reporting_secs,
            f.reassign_secs,
            SUPERVISOR_TIMEOUT_SECS + 2 * MONITOR_SECS,
            f.nimbus_peak_mib,
        );
    }
}
