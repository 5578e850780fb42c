//! `squall local <topology.yaml>`: a whole cluster in this process, with nothing else installed.
//!
//! Nimbus (its HTTP API on a loopback port), one supervisor and the topology's workers run in
//! this process over the in-memory coordination backend (ZooKeeper's semantics, see
//! `cluster_state::coord`); the topology is submitted through nimbus's API exactly as `squall
//! submit` does, and the supervisor runs its workers in-process ([`InProcessLauncher`]) instead
//! of as child processes. `--zookeeper` uses a real ZooKeeper instead.
//!
//! A topology with Kafka components whose `bootstrap_servers` is not set gets an embedded Kafka
//! endpoint (librdkafka's mock cluster), its spout topics seeded with sample sentences and fed
//! more while it runs; `--brokers` points them at real brokers instead.
//!
//! Progress is printed while it runs (from the workers' heartbeats), a summary when it stops
//! (after `--duration`, or on Ctrl-C / SIGTERM): the counts each worker returned once it had
//! drained its tuples in flight, or, if one did not stop in time, the last heartbeats'.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cluster_state::coord::{Ensemble, Session, SessionOptions};
use cluster_state::ids::TopologyId;
use cluster_state::layout::TaskLayout;
use cluster_state::paths::StormPaths;
use cluster_state::znode::{ExecutorStats, WorkerHeartbeat};
use supervisor::launch::{LaunchError, Launcher, WorkerSpec};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use worker::Registry;

use cluster_state::api::{SubmitTopology, UploadId};
use nimbus_client::{ClientError, NimbusClient};

/// How long stopping workers may take (in-flight tuples drain meanwhile).
const DRAIN: Duration = Duration::from_secs(5);

/// `squall local` arguments.
#[derive(Debug, clap::Args)]
pub struct LocalCommand {
    /// The topology file (Flux-style YAML), e.g. examples/wordcount.yaml.
    pub topology: PathBuf,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<u64>,
    /// Seconds between progress lines (0: none).
    #[arg(long, value_name = "SECS", default_value_t = 2)]
    pub progress: u64,
    /// Use this ZooKeeper (`host:port[/chroot]`) instead of the in-memory one.
    #[arg(long)]
    pub zookeeper: Option<String>,
    /// Kafka brokers for Kafka components without `bootstrap_servers` (default: an embedded
    /// mock cluster).
    #[arg(long)]
    pub brokers: Option<String>,
    /// Port of the Kafka components' and nimbus's `/metrics` (0: a free one; the address is
    /// printed). Each worker serves its own executor metrics as in a cluster.
    #[arg(long, value_name = "PORT", default_value_t = 0)]
    pub metrics_port: u16,
    /// The directory of the shell components' files, uploaded with the topology as `squall
    /// submit --resources` does (default: `resources/` beside the topology file, if any).
    #[arg(long, value_name = "DIR")]
    pub resources: Option<PathBuf>,
}

/// Per-component totals, summed over its executors.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Totals {
    executors: usize,
    emitted: u64,
    acked: u64,
    failed: u64,
    /// Mean complete latency over the spout executors that report one.
    complete_ms: Option<f64>,
}

/// One progress line: the spouts' totals and rates since the previous line.
fn progress_line(
    elapsed: Duration,
    now: &BTreeMap<String, Totals>,
    before: &BTreeMap<String, Totals>,
    since: Duration,
    components: &[(String, bool)],
) -> String {
    let secs = since.as_secs_f64().max(1e-3);
    let mut line = format!("[{:>5.1}s]", elapsed.as_secs_f64());
    for (name, _) in components.iter().filter(|(_, is_spout)| *is_spout) {
        let t = now.get(name).copied().unwrap_or_default();
        let b = before.get(name).copied().unwrap_or_default();
        let rate = (t.acked.saturating_sub(b.acked)) as f64 / secs;
        let _ = write!(
            line,
            " {name}: emitted {} acked {} ({rate:.0}/s) failed {}",
            t.emitted, t.acked, t.failed
        );
    }
    line
}

/// The summary table printed when the topology stops.
fn summary_table(totals: &BTreeMap<String, Totals>, components: &[(String, bool)]) -> String {
    let width = components.iter().map(|(n, _)| n.len()).max().unwrap_or(9).max(9);
    let mut out = format!(
        "{:<width$}  {:>9}  {:>12}  {:>12}  {:>8}  {:>11}\n",
        "component", "executors", "emitted", "acked", "failed", "complete ms"
    );
    for (name, is_spout) in components {
        let t = totals.get(name).copied().unwrap_or_default();
        let latency = match (is_spout, t.complete_ms) {
            (true, Some(ms)) => format!("{ms:.2}"),
            _ => "-".to_owned(),
        };
        let _ = writeln!(
            out,
            "{name:<width$}  {:>9}  {:>12}  {:>12}  {:>8}  {latency:>11}",
            t.executors, t.emitted, t.acked, t.failed
        );
    }
    out
}

/// The Kafka component classes that need brokers.
const KAFKA_SPOUT: &str = "kafka-spout";
const KAFKA_BOLT: &str = "kafka-bolt";

/// Topics the file's Kafka components use (spout topics, bolt topics), and whether any of them
/// lacks `bootstrap_servers`; those get `brokers` written in. Returns the text to submit.
fn fill_brokers(
    text: &str,
    brokers: impl FnOnce(&[String], &[String]) -> Result<String, String>,
) -> Result<String, String> {
    let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    let (mut spout_topics, mut bolt_topics, mut missing) = (Vec::new(), Vec::new(), false);
    for section in ["spouts", "bolts"] {
        for c in doc.get(section).and_then(|v| v.as_sequence()).into_iter().flatten() {
            let class = c.get("className").and_then(|v| v.as_str()).unwrap_or_default();
            if class != KAFKA_SPOUT && class != KAFKA_BOLT {
                continue;
            }
            let params = c.get("params");
            missing |= params.and_then(|p| p.get("bootstrap_servers")).is_none();
            if class == KAFKA_SPOUT {
                let topics = params.and_then(|p| p.get("topics")).and_then(|t| t.as_sequence());
                spout_topics
                    .extend(topics.into_iter().flatten().filter_map(|t| t.as_str().map(str::to_owned)));
            } else if let Some(topic) = params.and_then(|p| p.get("topic")).and_then(|t| t.as_str()) {
                bolt_topics.push(topic.to_owned());
            }
        }
    }
    if !missing {
        return Ok(text.to_owned());
    }
    let servers = brokers(&spout_topics, &bolt_topics)?;
    for section in ["spouts", "bolts"] {
        let Some(list) = doc.get_mut(section).and_then(|v| v.as_sequence_mut()) else { continue };
        for c in list {
            let class = c.get("className").and_then(|v| v.as_str()).unwrap_or_default().to_owned();
            if class != KAFKA_SPOUT && class != KAFKA_BOLT {
                continue;
            }
            let Some(map) = c.as_mapping_mut() else { continue };
            let params = map
                .entry("params".into())
                .or_insert_with(|| serde_yaml_ng::Value::Mapping(Default::default()));
            if params.is_null() {
                *params = serde_yaml_ng::Value::Mapping(Default::default());
            }
            if let Some(p) = params.as_mapping_mut() {
                p.entry("bootstrap_servers".into()).or_insert_with(|| servers.clone().into());
            }
        }
    }
    serde_yaml_ng::to_string(&doc).map_err(|e| e.to_string())
}

/// librdkafka's mock cluster, with the spout topics fed sample sentences while it lives.
struct EmbeddedKafka {
    cluster: rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    /// Dropped to stop the feeder, which waits on it between sentences.
    stop: Option<std::sync::mpsc::Sender<()>>,
    feeder: Option<std::thread::JoinHandle<()>>,
}

/// Partitions of each embedded topic.
const EMBEDDED_PARTITIONS: i32 = 4;
/// Sentences written before the topology starts, and per second while it runs.
const SEED_SENTENCES: u64 = 1000;
const FEED_PER_SEC: u64 = 20;

impl EmbeddedKafka {
    fn start(spout_topics: &[String], bolt_topics: &[String]) -> Result<EmbeddedKafka, String> {
        use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
        let cluster = rdkafka::mocking::MockCluster::new(1)
            .map_err(|e| format!("cannot start the embedded Kafka: {e}"))?;
        for topic in spout_topics.iter().chain(bolt_topics) {
            cluster
                .create_topic(topic, EMBEDDED_PARTITIONS, 1)
                .map_err(|e| format!("embedded Kafka: cannot create topic {topic}: {e}"))?;
        }
        let producer: BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("linger.ms", "5")
            .create()
            .map_err(|e| format!("embedded Kafka: cannot create a producer: {e}"))?;
        let topics = spout_topics.to_vec();
        // A thread, not a task: librdkafka's producer calls block.
        let (stop, feeding) = std::sync::mpsc::channel::<()>();
        let feeder = std::thread::Builder::new()
            .name("embedded-kafka-feed".into())
            .spawn(move || {
                let send = |k: u64| {
                    let sentence = worker::builtin::reference_sentence(k);
                    for topic in &topics {
                        let key = k.to_string();
                        let _ = producer.send(BaseRecord::to(topic).key(&key).payload(&sentence));
                    }
                    producer.poll(Duration::ZERO);
                };
                (0..SEED_SENTENCES).for_each(send);
                let _ = producer.flush(Duration::from_secs(10));
                let mut k = SEED_SENTENCES;
                let period = Duration::from_millis(1000 / FEED_PER_SEC);
                while let Err(RecvTimeoutError::Timeout) = feeding.recv_timeout(period) {
                    send(k);
                    k += 1;
                }
                let _ = producer.flush(Duration::from_secs(5));
            })
            .map_err(|e| format!("embedded Kafka: cannot start the feeder: {e}"))?;
        Ok(EmbeddedKafka { cluster, stop: Some(stop), feeder: Some(feeder) })
    }
}

impl Drop for EmbeddedKafka {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(feeder) = self.feeder.take() {
            let _ = feeder.join();
        }
    }
}

/// Runs the supervisor's workers as tasks of this process: the launch the supervisor would give
/// a child process, run by `worker::process::run` over this process's ensemble (whatever
/// ZooKeeper the launch names, the workers share the launcher's). A "pid" is a number of this
/// launcher's.
pub struct InProcessLauncher {
    registry: Registry,
    ensemble: Ensemble,
    runtime: tokio::runtime::Handle,
    next_pid: AtomicU32,
    /// Per worker: its stop, and a token cancelled once its task has ended.
    workers: Mutex<HashMap<u32, (CancellationToken, CancellationToken)>>,
    /// Every worker task, for [`InProcessLauncher::stop_all`].
    tasks: TaskTracker,
    /// What the workers that stopped returned: their executors' final statistics.
    finals: Arc<Mutex<Finals>>,
}

/// The final statistics of the in-process workers that have stopped.
#[derive(Debug, Default)]
struct Finals {
    stats: Vec<ExecutorStats>,
    /// Workers that stopped with an error (they return none).
    failed: usize,
}

impl std::fmt::Debug for InProcessLauncher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessLauncher").field("workers", &self.workers().len()).finish_non_exhaustive()
    }
}

impl InProcessLauncher {
    pub fn new(registry: Registry, ensemble: Ensemble, runtime: tokio::runtime::Handle) -> Self {
        InProcessLauncher {
            registry,
            ensemble,
            runtime,
            next_pid: AtomicU32::new(1),
            workers: Mutex::new(HashMap::new()),
            tasks: TaskTracker::new(),
            finals: Arc::new(Mutex::new(Finals::default())),
        }
    }

    fn workers(&self) -> std::sync::MutexGuard<'_, HashMap<u32, (CancellationToken, CancellationToken)>> {
        self.workers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops every worker and waits (bounded) until they have finished.
    pub async fn stop_all(&self, within: Duration) {
        for (stop, _) in self.workers().values() {
            stop.cancel();
        }
        self.tasks.close();
        let _ = tokio::time::timeout(within, self.tasks.wait()).await;
    }

    /// Every executor's final statistics, summed over the workers launched (a worker started
    /// again counts from zero, so each run adds what it did), once every worker has stopped
    /// without an error; `None` while one runs or if one failed.
    pub fn final_stats(&self) -> Option<Vec<ExecutorStats>> {
        let stopped = self.workers().values().all(|(_, done)| done.is_cancelled());
        let finals = self.finals.lock().unwrap_or_else(PoisonError::into_inner);
        (stopped && finals.failed == 0).then(|| finals.stats.clone())
    }
}

impl Launcher for InProcessLauncher {
    fn launch(&self, spec: &WorkerSpec) -> Result<u32, LaunchError> {
        let failed = |reason: String| LaunchError::Spawn {
            worker_id: spec.worker_id(),
            program: spec.program.clone(),
            source: std::io::Error::other(reason),
        };
        let worker::cli::PreparedWorker { args, mut config, topology, paths } =
            worker::cli::prepare(spec.launch.clone(), &self.registry).map_err(|e| failed(e.to_string()))?;
        // Its workerbeat node (which the supervisor writes, as the worker's heartbeat file
        // says) every second, so progress lines are fresh.
        config.zk_heartbeat_frequency_secs = 1;
        config.workerbeats_zk_secs = Some(1);
        config.shutdown_drain_ms = DRAIN.as_millis() as u64 / 2;
        let pid = self.next_pid.fetch_add(1, Ordering::Relaxed);
        let (stop, done) = (CancellationToken::new(), CancellationToken::new());
        self.workers().insert(pid, (stop.clone(), done.clone()));
        let (ensemble, finals) = (self.ensemble.clone(), self.finals.clone());
        let worker_id = spec.worker_id();
        self.tasks.spawn_on(
            async move {
                // Ended, however it ends (a panicking worker too), after its finals are kept.
                let _done = done.drop_guard();
                // Each worker its own registry: the same metric names, one set per worker.
                let metrics = prometheus::Registry::new();
                let ran = worker::process::run(args, config, topology, ensemble, paths, &metrics, stop).await;
                let mut finals = finals.lock().unwrap_or_else(PoisonError::into_inner);
                match ran {
                    Ok(stats) => finals.stats.extend(stats),
                    Err(e) => {
                        finals.failed += 1;
                        tracing::warn!(worker = %worker_id, "worker stopped: {e}");
                    }
                }
            },
            &self.runtime,
        );
        Ok(pid)
    }

    fn is_running(&self, pid: u32) -> bool {
        self.workers().get(&pid).is_some_and(|(_, done)| !done.is_cancelled())
    }

    fn terminate(&self, pid: u32) -> Result<(), LaunchError> {
        if let Some((stop, _)) = self.workers().get(&pid) {
            stop.cancel();
        }
        Ok(())
    }

    fn force_kill(&self, pid: u32) -> Result<(), LaunchError> {
        // A task cannot be killed harder than cancelled; its shutdown is bounded by the drain.
        self.terminate(pid)
    }

    fn adopt(&self, _pid: u32, _worker_id: &str) -> bool {
        false
    }
}

/// Totals per component from the workers' heartbeats.
async fn read_totals(
    session: &Session,
    paths: &StormPaths,
    id: &TopologyId,
    layout: &TaskLayout,
    components: &[(String, bool)],
) -> BTreeMap<String, Totals> {
    let dir = paths.workerbeats_topology(id);
    let mut stats = Vec::new();
    for child in session.children(&dir).await.unwrap_or_default() {
        let path = cluster_state::coord::join(&dir, &child);
        let Ok((beat, _)) = session.read::<WorkerHeartbeat>(&path).await else { continue };
        stats.extend(beat.executor_stats);
    }
    totals_of(stats, layout, components)
}

/// Totals per component of executors' statistics (one entry per executor and worker run).
fn totals_of(
    executor_stats: Vec<ExecutorStats>,
    layout: &TaskLayout,
    components: &[(String, bool)],
) -> BTreeMap<String, Totals> {
    let mut stats: BTreeMap<String, Vec<ExecutorStats>> = BTreeMap::new();
    for s in executor_stats {
        if let Some(component) = layout.task_component.get(&s.executor.start_task()) {
            stats.entry(component.to_string()).or_default().push(s);
        }
    }
    components
        .iter()
        .map(|(name, is_spout)| {
            let stats = stats.get(name).map(Vec::as_slice).unwrap_or_default();
            let latencies: Vec<f64> =
                stats.iter().map(|s| s.complete_latency_ms).filter(|&l| *is_spout && l > 0.0).collect();
            let totals = Totals {
                executors: stats.iter().map(|s| s.executor).collect::<std::collections::BTreeSet<_>>().len(),
                emitted: stats.iter().map(|s| s.emitted).sum(),
                acked: stats.iter().map(|s| s.acked).sum(),
                failed: stats.iter().map(|s| s.failed).sum(),
                complete_ms: (!latencies.is_empty())
                    .then(|| latencies.iter().sum::<f64>() / latencies.len() as f64),
            };
            (name.clone(), totals)
        })
        .collect()
}

/// Runs the command; the error is a message for the user (naming the file and what is wrong).
pub fn execute(cmd: LocalCommand) -> Result<(), String> {
    let named = |e: String| format!("{}: {e}", cmd.topology.display());
    let text = std::fs::read_to_string(&cmd.topology).map_err(|e| named(e.to_string()))?;
    let mut kafka = None;
    let text = fill_brokers(&text, |spout_topics, bolt_topics| match &cmd.brokers {
        Some(brokers) => Ok(brokers.clone()),
        None => {
            let embedded = EmbeddedKafka::start(spout_topics, bolt_topics)?;
            let servers = embedded.cluster.bootstrap_servers();
            eprintln!(
                "squall local: embedded Kafka at {servers} (topics {}), seeded with {SEED_SENTENCES} sentences, \
                 {FEED_PER_SEC} more per second",
                spout_topics.iter().chain(bolt_topics).cloned().collect::<Vec<_>>().join(", ")
            );
            kafka = Some(embedded);
            Ok(servers)
        }
    })
    .map_err(named)?;

    let ensemble = match &cmd.zookeeper {
        Some(connect) => Ensemble::zookeeper(connect.clone()),
        None => Ensemble::in_memory(),
    };
    let mut registry = Registry::with_builtins();
    let kafka_metrics = prometheus::Registry::new();
    let mut env = kafka_spout::SpoutEnv::register(&kafka_metrics).map_err(|e| e.to_string())?;
    env.ensemble = Some(ensemble.clone());
    let bolt_metrics = kafka_spout::BoltMetrics::register(&kafka_metrics).map_err(|e| e.to_string())?;
    kafka_spout::register_with(&mut registry, env, bolt_metrics);

    // Everything a worker would refuse is refused here, naming the file and line.
    let topology = registry.load_str(&text).map_err(|e| named(e.to_string()))?;
    let layout = TaskLayout::compute(&topology.component_parallelism());
    let mut components: Vec<(String, bool)> =
        topology.components().iter().map(|(id, spec)| (id.to_string(), spec.is_spout())).collect();
    // Spouts first, then bolts, each by name: the order data flows in, roughly.
    components.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let workers = topology.config().workers;
    let executors: u32 = topology.component_executors().values().sum();
    eprintln!(
        "squall local: running topology {} ({} components, {executors} executors, {workers} workers) on \
         nimbus and one supervisor in this process{}",
        topology.name(),
        components.len(),
        match cmd.duration {
            Some(secs) => format!(" for {secs} s"),
            None => "; Ctrl-C to stop".to_owned(),
        }
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let dir = tempfile::Builder::new()
        .prefix("squall-local-")
        .tempdir()
        .map_err(|e| format!("cannot create a local dir: {e}"))?;
    let result = runtime.block_on(run_cluster(
        &cmd,
        &text,
        registry,
        kafka_metrics,
        ensemble,
        dir.path(),
        workers,
        &layout,
        &components,
    ));
    drop(kafka);
    result
}

/// Free loopback ports for the supervisor's slots.
fn free_ports(n: u32) -> Result<Vec<u16>, String> {
    let listeners: Vec<std::net::TcpListener> = (0..n.max(1))
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cannot find a free port: {e}"))?;
    listeners.iter().map(|l| l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())).collect()
}

#[allow(clippy::too_many_arguments)]
async fn run_cluster(
    cmd: &LocalCommand,
    text: &str,
    registry: Registry,
    shared_metrics: prometheus::Registry,
    ensemble: Ensemble,
    dir: &std::path::Path,
    workers: u32,
    layout: &TaskLayout,
    components: &[(String, bool)],
) -> Result<(), String> {
    let shutdown = CancellationToken::new();
    let listener =
        tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| format!("cannot listen: {e}"))?;
    let nimbus_address = listener.local_addr().map_err(|e| e.to_string())?.to_string();
    let nimbus_config = nimbus::NimbusConfig {
        local_dir: dir.join("nimbus"),
        monitor_freq_secs: 1,
        http_host: "127.0.0.1".into(),
        ..Default::default()
    };
    let supervisor_config = supervisor::daemon::SupervisorConfig {
        local_dir: dir.join("supervisor"),
        slots_ports: free_ports(workers)?,
        monitor_frequency_secs: 1,
        heartbeat_frequency_secs: 1,
        worker_shutdown_sleep_secs: DRAIN.as_secs(),
        nimbus_address: nimbus_address.clone(),
        hostname: Some("127.0.0.1".into()),
        ..Default::default()
    };
    let launcher =
        Arc::new(InProcessLauncher::new(registry, ensemble.clone(), tokio::runtime::Handle::current()));
    let program = supervisor::daemon::WorkerProgram {
        squall: std::env::current_exe().map_err(|e| format!("cannot find the squall executable: {e}"))?,
        zookeeper: cmd.zookeeper.clone(),
    };
    // The Kafka spouts' and bolts' metrics are shared by every in-process worker: served once,
    // with nimbus's (group lag included), on a port of their own.
    let metrics_listener = tokio::net::TcpListener::bind(("127.0.0.1", cmd.metrics_port))
        .await
        .map_err(|e| format!("cannot listen for /metrics on port {}: {e}", cmd.metrics_port))?;
    if let Ok(addr) = metrics_listener.local_addr() {
        eprintln!("squall local: Kafka and nimbus metrics at http://{addr}/metrics");
    }
    let metrics_server = tokio::spawn(cluster_state::metrics::serve(
        metrics_listener,
        shared_metrics.clone(),
        shutdown.clone(),
    ));
    // Spawned once nothing can fail before the awaits below.
    let metrics = shared_metrics;
    let nimbus = tokio::spawn({
        let (ensemble, shutdown) = (ensemble.clone(), shutdown.clone());
        async move { nimbus::serve(nimbus_config, listener, ensemble, &metrics, shutdown).await }
    });
    let supervisor = tokio::spawn({
        let (ensemble, launcher, shutdown) = (ensemble.clone(), launcher.clone(), shutdown.clone());
        async move {
            let registry = prometheus::Registry::new();
            supervisor::daemon::run(supervisor_config, ensemble, launcher, program, &registry, shutdown).await
        }
    });

    let outcome = drive(cmd, text, &ensemble, nimbus_address, layout, components).await;

    eprintln!("squall local: stopping (draining in-flight tuples for up to {} s)", DRAIN.as_secs());
    shutdown.cancel();
    let _ = supervisor.await;
    launcher.stop_all(DRAIN).await;
    let _ = nimbus.await;
    let _ = metrics_server.await;
    let Ran { took: ran, totals, errors } = outcome?;
    for e in errors.iter().flat_map(|reply| &reply.errors) {
        eprintln!("error in {}: {}", e.component, e.error);
    }
    let (totals, counted) = match launcher.final_stats() {
        Some(stats) => (totals_of(stats, layout, components), "final counts, tuples in flight drained"),
        None => (totals, "counts from the last heartbeats: a worker did not stop cleanly in time"),
    };
    eprintln!(
        "squall local: ran {:.1} s ({counted})\n{}",
        ran.as_secs_f64(),
        summary_table(&totals, components)
    );
    Ok(())
}

/// What a local run saw: how long it ran, the components' totals, the errors nimbus kept.
struct Ran {
    took: Duration,
    totals: BTreeMap<String, Totals>,
    errors: Option<cluster_state::api::TopologyErrors>,
}

/// Submits the topology to the in-process nimbus, prints progress until the duration ends or a
/// signal arrives, reads the totals, then kills the topology and waits (bounded) for it to go.
async fn drive(
    cmd: &LocalCommand,
    text: &str,
    ensemble: &Ensemble,
    nimbus_address: String,
    layout: &TaskLayout,
    components: &[(String, bool)],
) -> Result<Ran, String> {
    let client = NimbusClient::new(nimbus_address, None);
    let upload = submit_when_up(&client, text).await?;
    let resources = crate::ops::resources_archive(&cmd.topology, cmd.resources.as_deref())?;
    let resources_upload = match resources {
        Some(bytes) => Some(client.upload(&bytes, |_| {}).await.map_err(|e| e.to_string())?),
        None => None,
    };
    let request = SubmitTopology {
        topology_upload: upload,
        worker_upload: None,
        resources_upload,
        inactive: false,
        owner: "local".into(),
    };
    let id = client.submit(&request).await.map_err(|e| e.to_string())?.id;
    eprintln!("squall local: submitted as {id}");
    let session = ensemble.connect(&SessionOptions::default()).await.map_err(|e| e.to_string())?;
    let paths = StormPaths::default();
    let started = Instant::now();
    let stop = async {
        match cmd.duration {
            Some(secs) => tokio::time::sleep(Duration::from_secs(secs)).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(stop);
    let mut signalled = std::pin::pin!(cluster_state::signal::terminate_requested());
    let period = Duration::from_secs(cmd.progress.max(1));
    let mut tick = tokio::time::interval_at(Instant::now() + period, period);
    let (mut before, mut last) = (BTreeMap::new(), Instant::now());
    loop {
        tokio::select! {
            () = &mut stop => break,
            () = &mut signalled => break,
            _ = tick.tick() => {
                if cmd.progress > 0 {
                    let now = read_totals(&session, &paths, &id, layout, components).await;
                    eprintln!("{}", progress_line(started.elapsed(), &now, &before, last.elapsed(), components));
                    (before, last) = (now, Instant::now());
                }
            }
        }
    }
    let totals = read_totals(&session, &paths, &id, layout, components).await;
    let errors = client.errors(&id).await.ok();
    // Remove the topology (its znodes matter with a real --zookeeper, which outlives us).
    if let Err(e) = client.kill(&id, 0).await {
        eprintln!("squall local: could not kill {id}: {e}");
    }
    let removed = Instant::now() + DRAIN;
    while Instant::now() < removed && session.exists(&paths.storm(&id)).await.is_ok_and(|s| s.is_some()) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = session.close().await;
    Ok(Ran { took: started.elapsed(), totals, errors })
}

/// Uploads the topology once nimbus answers (it starts alongside).
async fn submit_when_up(client: &NimbusClient, text: &str) -> Result<UploadId, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client.upload(text.as_bytes(), |_| {}).await {
            Ok(id) => return Ok(id),
            Err(ClientError::Unreachable { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn components() -> Vec<(String, bool)> {
        vec![("sentences".into(), true), ("count".into(), false)]
    }

    #[test]
    fn progress_shows_spout_totals_and_rates() {
        let before: BTreeMap<_, _> =
            [("sentences".to_owned(), Totals { acked: 1000, ..Default::default() })].into_iter().collect();
        let now: BTreeMap<_, _> = [(
            "sentences".to_owned(),
            Totals { executors: 1, emitted: 3100, acked: 3000, failed: 2, complete_ms: Some(1.5) },
        )]
        .into_iter()
        .collect();
        let line =
            progress_line(Duration::from_secs(4), &now, &before, Duration::from_secs(2), &components());
        assert_eq!(line, "[  4.0s] sentences: emitted 3100 acked 3000 (1000/s) failed 2");
    }

    #[test]
    fn summary_lists_every_component_with_latency_for_spouts_only() {
        let totals: BTreeMap<_, _> = [
            (
                "sentences".to_owned(),
                Totals { executors: 1, emitted: 10, acked: 9, failed: 1, complete_ms: Some(2.0) },
            ),
            (
                "count".to_owned(),
                Totals { executors: 2, emitted: 40, acked: 40, failed: 0, complete_ms: None },
            ),
        ]
        .into_iter()
        .collect();
        let table = summary_table(&totals, &components());
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("component") && lines[0].ends_with("complete ms"));
        assert!(lines[1].starts_with("sentences") && lines[1].ends_with("2.00"), "{}", lines[1]);
        assert!(lines[2].starts_with("count") && lines[2].trim_end().ends_with('-'), "{}", lines[2]);
    }
}
