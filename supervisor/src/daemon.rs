//! The supervisor process: registration, the sync task and the process task, wired together.
//!
//! Every `supervisor.monitor.frequency.secs`, and whenever the assignments change (a children
//! watch on `/storm/assignments`, re-armed each round), one round runs: read every assignment,
//! keep this node's ports, make sure each assigned topology's code is here (downloading it from
//! nimbus), reconcile the workers, publish the ports in use, and delete code nothing needs.
//! Reconcile, don't react: a round always starts from what ZooKeeper and the heartbeats say now.
//!
//! Stopping the supervisor leaves its workers running, as Storm does: the next supervisor on
//! this machine adopts them.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cluster_state::code::CodeFile;
use cluster_state::coord::{AUTH_ENV, Ensemble, Session, SessionOptions, ZkAuth};
use cluster_state::files;
use cluster_state::ids::{SupervisorId, TopologyId, WorkerId};
use cluster_state::launch::{WorkerLaunch, WorkerbeatWriter};
use cluster_state::metrics::CoordMetrics;
use cluster_state::paths::StormPaths;
use cluster_state::tls::{self, ClientTls};
use cluster_state::worker_logs;
use cluster_state::znode::{MetricsScheme, SupervisorInfo};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backoff::{Backoff, BackoffPolicy};
use crate::code_sync::CodeSync;
use crate::heartbeat::{LocalFiles, Reporter, RunningWorker};
use crate::launch::{Launcher, WorkerSpec};
use crate::metrics::SupervisorMetrics;
use crate::plan::{LocalAssignment, WorkerTimeouts};
use crate::process_task::{Done, ProcessError, ProcessTask, SpecBuilder};
use crate::registration::Registration;
use crate::run_as::{RunAs, WorkerUser};
use crate::sync::{Node, SyncLoop};
use crate::workerbeats::Workerbeats;

/// The supervisor's settings, with Storm's key names.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SupervisorConfig {
    #[serde(rename = "storm.local.dir")]
    pub local_dir: PathBuf,
    #[serde(rename = "storm.zookeeper.root")]
    pub zookeeper_root: String,
    #[serde(rename = "storm.zookeeper.session.timeout")]
    pub zookeeper_session_timeout_ms: u64,
    #[serde(rename = "storm.zookeeper.connection.timeout")]
    pub zookeeper_connection_timeout_ms: u64,
    /// This machine's name as nimbus and peers should reach it (default: $HOSTNAME).
    #[serde(rename = "storm.local.hostname")]
    pub hostname: Option<String>,
    #[serde(rename = "supervisor.slots.ports")]
    pub slots_ports: Vec<u16>,
    #[serde(rename = "supervisor.worker.timeout.secs")]
    pub worker_timeout_secs: u64,
    #[serde(rename = "supervisor.worker.start.timeout.secs")]
    pub worker_start_timeout_secs: u64,
    #[serde(rename = "supervisor.monitor.frequency.secs")]
    pub monitor_frequency_secs: u64,
    #[serde(rename = "supervisor.heartbeat.frequency.secs")]
    pub heartbeat_frequency_secs: u64,
    /// Squall's: the shortest time between two writes of a worker's `/storm/workerbeats`
    /// node, which the supervisor writes for all its workers in one transaction, and only
    /// for nodes whose content changed (the key a worker running alone takes from its
    /// topology; liveness travels in the aggregated heartbeat, the node is for tools).
    #[serde(rename = "squall.workerbeats.zk.secs")]
    pub workerbeats_zk_secs: u64,
    /// Grace between asking a worker to stop and killing it.
    #[serde(rename = "supervisor.worker.shutdown.sleep.secs")]
    pub worker_shutdown_sleep_secs: u64,
    /// Squall's: nimbus's API, `host:port`, where topology code is downloaded from.
    #[serde(rename = "nimbus.http.address")]
    pub nimbus_address: String,
    /// Squall's: nimbus's token, which code downloads need (the same key nimbus reads).
    #[serde(rename = "nimbus.http.token")]
    pub nimbus_token: Option<String>,
    /// Squall's: the CA nimbus's certificate must chain to; set, code downloads are HTTPS
    /// (the same key the CLI reads).
    #[serde(rename = "nimbus.http.tls.ca")]
    pub nimbus_tls_ca: Option<PathBuf>,
    /// Squall's: this supervisor's client certificate, for a nimbus requiring mutual TLS.
    #[serde(rename = "nimbus.http.tls.client.cert")]
    pub nimbus_tls_client_cert: Option<PathBuf>,
    /// Squall's: the private key of `nimbus.http.tls.client.cert`.
    #[serde(rename = "nimbus.http.tls.client.key")]
    pub nimbus_tls_client_key: Option<PathBuf>,
    /// Storm's: every nimbus's `host:port`; code is downloaded from whichever holds it (the
    /// nimbuses registered in `/storm/nimbuses` are tried too). Empty: `nimbus.http.address`.
    #[serde(rename = "nimbus.seeds")]
    pub seeds: Vec<String>,
    /// Storm's key (a boolean there, running workers as the topology's submitter through
    /// `worker-launcher`); Squall's value is the user name: with the supervisor running as
    /// root, every worker runs as this unprivileged user (SECURITY.md). Unset: the
    /// supervisor's own user.
    #[serde(rename = "supervisor.run.worker.as.user")]
    pub run_worker_as_user: Option<String>,
    /// Squall's: the port of this supervisor's Prometheus `/metrics` (0: any free port; the
    /// endpoint is published in `/storm/supervisors/<id>` for discovery either way).
    #[serde(rename = "supervisor.metrics.port")]
    pub metrics_port: u16,
    /// Storm's `worker.xml` size trigger: a worker's `worker.log` rotates before it would pass
    /// this many bytes.
    #[serde(rename = "worker.log.max.bytes")]
    pub worker_log_max_bytes: u64,
    /// Storm's `worker.xml` rollover count: log files kept per worker, the live one included.
    #[serde(rename = "worker.log.max.files")]
    pub worker_log_max_files: u32,
    /// Squall's: PEM certificate (chain) and key making this supervisor's `/metrics` HTTPS
    /// only; discovery then publishes it with `__scheme__: https`. Unset: plain HTTP.
    #[serde(rename = "supervisor.metrics.tls.cert")]
    pub metrics_tls_cert: Option<PathBuf>,
    #[serde(rename = "supervisor.metrics.tls.key")]
    pub metrics_tls_key: Option<PathBuf>,
    /// Squall's: with it, only scrapers presenting a certificate from this CA are served
    /// (mutual TLS).
    #[serde(rename = "supervisor.metrics.tls.client.ca")]
    pub metrics_tls_client_ca: Option<PathBuf>,
    /// Squall's: the same for every worker this supervisor starts (passed on in the worker's
    /// launch; the worker reads the files, so they must be readable by the worker's user, and
    /// the key is within reach of topology code: give workers a certificate for metrics only).
    #[serde(rename = "worker.metrics.tls.cert")]
    pub worker_metrics_tls_cert: Option<PathBuf>,
    #[serde(rename = "worker.metrics.tls.key")]
    pub worker_metrics_tls_key: Option<PathBuf>,
    #[serde(rename = "worker.metrics.tls.client.ca")]
    pub worker_metrics_tls_client_ca: Option<PathBuf>,
}

impl Default for SupervisorConfig {
    /// Storm's defaults.yaml, key by key.
    fn default() -> Self {
        SupervisorConfig {
            local_dir: PathBuf::from("storm-local"),
            zookeeper_root: StormPaths::DEFAULT_ROOT.to_owned(),
            zookeeper_session_timeout_ms: 20_000,
            zookeeper_connection_timeout_ms: 15_000,
            hostname: None,
            slots_ports: vec![6700, 6701, 6702, 6703],
            worker_timeout_secs: 30,
            worker_start_timeout_secs: 120,
            monitor_frequency_secs: 3,
            heartbeat_frequency_secs: 5,
            // Squall's (issue 18): ZooKeeper's writes at S / 60 per second.
            workerbeats_zk_secs: 60,
            worker_shutdown_sleep_secs: 3,
            nimbus_address: "127.0.0.1:8080".to_owned(),
            nimbus_token: None,
            // Plain HTTP unless configured (SECURITY.md).
            nimbus_tls_ca: None,
            nimbus_tls_client_cert: None,
            nimbus_tls_client_key: None,
            seeds: Vec::new(),
            run_worker_as_user: None,
            metrics_port: 0,
            // Storm's worker.xml: 100 MB, nine rolled files beside the live one.
            worker_log_max_bytes: cluster_state::worker_logs::DEFAULT_MAX_BYTES,
            worker_log_max_files: cluster_state::worker_logs::DEFAULT_MAX_FILES,
            // Plain HTTP unless configured (SECURITY.md).
            metrics_tls_cert: None,
            metrics_tls_key: None,
            metrics_tls_client_ca: None,
            worker_metrics_tls_cert: None,
            worker_metrics_tls_key: None,
            worker_metrics_tls_client_ca: None,
        }
    }
}

/// A supervisor that cannot start (a bad setting or its local state).
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("bad setting {key}: {reason}")]
    Config { key: &'static str, reason: String },
    /// A TLS setting that cannot be used (the error names the key and the file).
    #[error(transparent)]
    Tls(cluster_state::tls::TlsError),
    #[error(transparent)]
    Process(#[from] ProcessError),
}

impl SupervisorConfig {
    /// Checks what cannot be right, naming the key.
    pub fn validate(&self) -> Result<StormPaths, SupervisorError> {
        if self.slots_ports.is_empty() || self.slots_ports.contains(&0) {
            return Err(SupervisorError::Config {
                key: "supervisor.slots.ports",
                reason: "needs at least one port, none of them 0".into(),
            });
        }
        for (key, value) in [
            ("supervisor.monitor.frequency.secs", self.monitor_frequency_secs),
            ("supervisor.heartbeat.frequency.secs", self.heartbeat_frequency_secs),
            ("squall.workerbeats.zk.secs", self.workerbeats_zk_secs),
            ("supervisor.worker.timeout.secs", self.worker_timeout_secs),
            ("worker.log.max.bytes", self.worker_log_max_bytes),
            ("worker.log.max.files", u64::from(self.worker_log_max_files)),
        ] {
            if value == 0 {
                return Err(SupervisorError::Config { key, reason: "must be at least 1".into() });
            }
        }
        self.nimbus_tls()?;
        self.metrics_tls()?;
        // Read here too, so a bad file stops the supervisor rather than every worker.
        if let Some(tls) = self.worker_metrics_tls()? {
            tls.acceptor().map_err(SupervisorError::Tls)?;
        }
        self.worker_user()?;
        StormPaths::new(&self.zookeeper_root)
            .map_err(|e| SupervisorError::Config { key: "storm.zookeeper.root", reason: e.to_string() })
    }

    /// The user workers run as (`supervisor.run.worker.as.user`), checked: it exists, is not
    /// root, and this process is root.
    pub fn worker_user(&self) -> Result<Option<WorkerUser>, SupervisorError> {
        let Some(name) = &self.run_worker_as_user else { return Ok(None) };
        WorkerUser::for_supervisor(name)
            .map(Some)
            .map_err(|e| SupervisorError::Config { key: crate::run_as::KEY, reason: e.to_string() })
    }

    /// TLS towards nimbus for code downloads (`nimbus.http.tls.ca`, client certificate), read
    /// from its files; `None`: plain HTTP.
    pub fn nimbus_tls(&self) -> Result<Option<ClientTls>, SupervisorError> {
        cluster_state::tls::nimbus_client(
            self.nimbus_tls_ca.as_deref(),
            self.nimbus_tls_client_cert.as_deref(),
            self.nimbus_tls_client_key.as_deref(),
        )
        .map_err(SupervisorError::Tls)
    }

    /// TLS of this supervisor's `/metrics` (`supervisor.metrics.tls.*`), read from its files;
    /// `None`: plain HTTP.
    pub fn metrics_tls(&self) -> Result<Option<cluster_state::tls::TlsAcceptor>, SupervisorError> {
        let tls = cluster_state::tls::server(
            [tls::SUPERVISOR_METRICS_CERT, tls::SUPERVISOR_METRICS_KEY, tls::SUPERVISOR_METRICS_CLIENT_CA],
            self.metrics_tls_cert.as_deref(),
            self.metrics_tls_key.as_deref(),
            self.metrics_tls_client_ca.as_deref(),
        )
        .map_err(SupervisorError::Tls)?;
        tls.map(|t| t.acceptor()).transpose().map_err(SupervisorError::Tls)
    }

    /// The settings of workers' `/metrics` (`worker.metrics.tls.*`), checked for
    /// completeness; `None`: plain HTTP.
    pub fn worker_metrics_tls(&self) -> Result<Option<cluster_state::tls::ServerTls>, SupervisorError> {
        cluster_state::tls::server(
            [tls::WORKER_METRICS_CERT, tls::WORKER_METRICS_KEY, tls::WORKER_METRICS_CLIENT_CA],
            self.worker_metrics_tls_cert.as_deref(),
            self.worker_metrics_tls_key.as_deref(),
            self.worker_metrics_tls_client_ca.as_deref(),
        )
        .map_err(SupervisorError::Tls)
    }

    fn session_options(&self) -> SessionOptions {
        SessionOptions {
            session_timeout: Duration::from_millis(self.zookeeper_session_timeout_ms),
            connect_timeout: Duration::from_millis(self.zookeeper_connection_timeout_ms),
            detached: false,
        }
    }
}

/// The program workers run: the `squall` executable (used when a topology has no worker
/// binary of its own) and the ZooKeeper connect string they get (`None`: the worker's default;
/// an in-process launcher runs them over its own ensemble).
#[derive(Debug, Clone)]
pub struct WorkerProgram {
    pub squall: PathBuf,
    pub zookeeper: Option<String>,
}

/// Builds each worker's spec: its program, and a launch carrying the cluster's settings from
/// `config` (ZooKeeper root and timeouts, local dir, host name) and its code's location.
fn worker_spec(
    config: &SupervisorConfig,
    paths: &StormPaths,
    code: &CodeSync,
    program: &WorkerProgram,
    auth: Option<&ZkAuth>,
    user: Option<WorkerUser>,
) -> SpecBuilder {
    let (config, paths, code, program) = (config.clone(), paths.clone(), code.clone(), program.clone());
    // The cluster's ZooKeeper credentials, in the environment: a command line is public.
    let env: Vec<(OsString, OsString)> =
        auth.map(|a| (OsString::from(AUTH_ENV), OsString::from(a.to_env_value()))).into_iter().collect();
    Arc::new(
        move |supervisor: &SupervisorId, worker_id: &WorkerId, port: u16, assignment: &LocalAssignment| {
            let dir = code.topology_dir(&assignment.topology_id);
            let own_binary = dir.join(CodeFile::WorkerBinary.file_name());
            let topology_file = dir.join(CodeFile::Topology.file_name());
            let mut launch = WorkerLaunch::new(
                assignment.topology_id.clone(),
                supervisor.clone(),
                port,
                worker_id.clone(),
                topology_file,
            );
            launch.zookeeper = program.zookeeper.clone();
            launch.storm_paths = paths.clone();
            launch.local_dir = config.local_dir.clone();
            launch.hostname = config.hostname.clone();
            launch.zookeeper_session_timeout_ms = config.zookeeper_session_timeout_ms;
            launch.zookeeper_connection_timeout_ms = config.zookeeper_connection_timeout_ms;
            launch.log_max_bytes = config.worker_log_max_bytes;
            launch.log_max_files = config.worker_log_max_files;
            // Its `/storm/workerbeats` node is this supervisor's to write (`Registration`).
            launch.workerbeat_writer = WorkerbeatWriter::Supervisor;
            // Storm's place: the worker writes `worker.log` there itself (rotated); its
            // stdout and stderr go to `worker.log.out` beside it.
            let artifacts = worker_logs::artifacts_dir(&config.local_dir, &launch.topology_id, port);
            launch.metrics_tls_cert = config.worker_metrics_tls_cert.clone();
            launch.metrics_tls_key = config.worker_metrics_tls_key.clone();
            launch.metrics_tls_client_ca = config.worker_metrics_tls_client_ca.clone();
            let local = &config.local_dir;
            let run_as = user.clone().map(|user| RunAs {
                user,
                traverse: vec![
                    local.clone(),
                    code.stormdist.clone(),
                    local.join("workers"),
                    local.join(worker_logs::ARTIFACTS_DIR),
                    local.join(worker_logs::ARTIFACTS_DIR).join(launch.topology_id.as_str()),
                ],
                owned: vec![dir.clone(), local.join("workers").join(worker_id.as_str()), artifacts.clone()],
            });
            WorkerSpec {
                program: if own_binary.is_file() { own_binary } else { program.squall.clone() },
                launch,
                env: env.clone(),
                dir: config.local_dir.clone(),
                log_path: artifacts.join(worker_logs::WORKER_OUT),
                run_as,
            }
        },
    )
}

/// Runs the supervisor until `shutdown`.
// Over 100 lines on purpose: Storm's supervisor loop read top to bottom (set up metrics, local
// state and registration, then one round per `supervisor.monitor.frequency.secs` until
// shutdown, then stop the workers); each round's decisions are `reconcile` and the process
// task's pure functions.
pub async fn run(
    config: SupervisorConfig,
    ensemble: Ensemble,
    launcher: Arc<dyn Launcher>,
    program: WorkerProgram,
    registry: &prometheus::Registry,
    shutdown: CancellationToken,
) -> Result<(), SupervisorError> {
    let paths = config.validate()?;
    let metrics_error =
        |e: prometheus::Error| SupervisorError::Config { key: "metrics", reason: e.to_string() };
    let metrics = SupervisorMetrics::register(registry).map_err(metrics_error)?;
    cluster_state::metrics::register_daemon_info(registry, "supervisor").map_err(metrics_error)?;
    let coord_metrics = CoordMetrics::register(registry).map_err(metrics_error)?;
    files::create_private_dir_all(&config.local_dir).map_err(|e| SupervisorError::Config {
        key: "storm.local.dir",
        reason: format!("cannot create {}: {e}", config.local_dir.display()),
    })?;
    let configured_seeds =
        if config.seeds.is_empty() { vec![config.nimbus_address.clone()] } else { config.seeds.clone() };
    let mut code = CodeSync::with_seeds(configured_seeds.clone(), &config.local_dir);
    code.nimbus.token = config.nimbus_token.clone();
    code.nimbus.tls = config.nimbus_tls()?;
    let timeouts = WorkerTimeouts {
        heartbeat_secs: config.worker_timeout_secs,
        start_secs: config.worker_start_timeout_secs,
    };
    let worker_user = config.worker_user()?;
    if let Some(user) = &worker_user {
        tracing::info!(user = %user.name, uid = user.uid, gid = user.gid, "workers run as another user");
    }
    let process = ProcessTask::open(
        &config.local_dir,
        launcher,
        worker_spec(&config, &paths, &code, &program, ensemble.security().auth.as_ref(), worker_user),
        timeouts,
        Duration::from_secs(config.worker_shutdown_sleep_secs),
    )?;
    let supervisor_id = process.supervisor_id().clone();
    tracing::info!(%supervisor_id, ports = ?config.slots_ports, "supervisor starting");

    let (ports_tx, ports_rx) = watch::channel(process.used_ports());
    let hostname = config
        .hostname
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_owned());
    // Bound where peers reach this machine when that is configured, else on every interface.
    let metrics_host = config.hostname.clone().unwrap_or_else(|| "0.0.0.0".to_owned());
    // Read before binding: a bad file is an error naming its key.
    let metrics_tls = config.metrics_tls()?;
    let metrics_address = format!("{metrics_host}:{}", config.metrics_port);
    let listener =
        tokio::net::TcpListener::bind(&metrics_address).await.map_err(|e| SupervisorError::Config {
            key: "supervisor.metrics.port",
            reason: format!("cannot listen on {metrics_address}: {e}"),
        })?;
    let metrics_endpoint = listener.local_addr().ok().map(|a| format!("{hostname}:{}", a.port()));
    let metrics_scheme = MetricsScheme::from_tls(metrics_tls.is_some());
    // Every task of the supervisor, awaited before `run` returns.
    let mut tasks = tokio::task::JoinSet::new();
    // The same port serves the log viewer (its routes need the cluster's token, when set).
    let viewer = cluster_state::logviewer::LogViewer {
        local_dir: config.local_dir.clone(),
        token: config.nimbus_token.clone(),
    };
    tasks.spawn(cluster_state::logviewer::serve(
        listener,
        registry.clone(),
        viewer,
        metrics_tls,
        shutdown.child_token(),
    ));
    // The aggregated heartbeat of this supervisor's workers, to the leader nimbus.
    let (workers_tx, workers_rx) = watch::channel(running_workers(&process));
    let local_files = LocalFiles { local_dir: config.local_dir.clone(), workers: workers_rx };
    let heartbeat_interval = Duration::from_secs(config.heartbeat_frequency_secs);
    let reporter = Reporter {
        supervisor_id: supervisor_id.clone(),
        client: Reporter::<LocalFiles>::client_for(code.nimbus.clone(), heartbeat_interval),
        interval: heartbeat_interval,
        source: local_files.clone(),
    };
    tasks.spawn(reporter.run(shutdown.child_token()));
    let registration = Registration {
        ensemble: ensemble.clone(),
        session_options: config.session_options(),
        paths: paths.clone(),
        info: SupervisorInfo {
            time_secs: 0,
            hostname,
            supervisor_id: supervisor_id.clone(),
            used_ports: Vec::new(),
            all_ports: config.slots_ports.clone(),
            uptime_secs: 0,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            metrics_endpoint,
            metrics_scheme,
        },
        used_ports: ports_rx,
        heartbeat_interval: Duration::from_secs(config.heartbeat_frequency_secs),
        workerbeats: Some(
            Workerbeats::new(
                paths.clone(),
                supervisor_id.clone(),
                Duration::from_secs(config.workerbeats_zk_secs),
                Box::new(local_files),
            )
            .with_metrics(metrics.clone()),
        ),
    };
    tasks.spawn(registration.run(shutdown.child_token()));
    // Workers rotate their worker.log; their stdout and stderr the supervisor does.
    let out_rotation = crate::out_rotation::OutRotation {
        local_dir: config.local_dir.clone(),
        rotation: worker_logs::LogRotation {
            max_bytes: config.worker_log_max_bytes,
            max_files: config.worker_log_max_files,
        },
        interval: Duration::from_secs(config.monitor_frequency_secs),
    };
    tasks.spawn(out_rotation.run(shutdown.child_token()));

    let sync = SyncLoop {
        ensemble: ensemble.clone(),
        session_options: config.session_options(),
        paths: paths.clone(),
        supervisor_id: supervisor_id.clone(),
        slots: config.slots_ports.iter().copied().collect(),
        tick: Duration::from_secs(config.monitor_frequency_secs),
        coord_metrics: Some(coord_metrics),
    };
    let mut node = Workers {
        paths,
        configured_seeds,
        code,
        process,
        retries: CodeRetries::default(),
        metrics,
        slots: config.slots_ports.len(),
    };
    sync.run(&mut node, &ports_tx, &workers_tx, shutdown).await;
    while tasks.join_next().await.is_some() {}
    tracing::info!(%supervisor_id, "supervisor stopped; its workers keep running");
    Ok(())
}

/// The real supervisor's [`Node`]: code from nimbus, worker processes through the process task.
struct Workers {
    paths: StormPaths,
    configured_seeds: Vec<String>,
    code: CodeSync,
    process: ProcessTask,
    retries: CodeRetries,
    metrics: SupervisorMetrics,
    /// How many ports this supervisor offers.
    slots: usize,
}

impl Node for Workers {
    async fn apply(&mut self, session: &Session, desired: &BTreeMap<u16, LocalAssignment>) {
        // Nimbus HA: the nimbuses registered in ZooKeeper are code sources too, after the
        // configured ones.
        if let Ok(registered) = session.children_or_empty(&self.paths.nimbuses_dir()).await {
            let mut seeds = self.configured_seeds.clone();
            seeds.extend(registered.into_iter().filter(|n| !self.configured_seeds.contains(n)));
            self.code.nimbus.seeds = seeds;
        }
        let done = round(desired, &self.code, &mut self.process, &mut self.retries, &self.metrics).await;
        self.metrics.count(&done);
        self.metrics.set_slots(self.process.used_ports().len(), self.slots);
    }

    fn running(&self) -> Vec<RunningWorker> {
        running_workers(&self.process)
    }

    fn used_ports(&self) -> Vec<u16> {
        self.process.used_ports()
    }
}

/// The workers the process task runs, for the heartbeat reporter.
fn running_workers(process: &ProcessTask) -> Vec<RunningWorker> {
    process
        .workers()
        .iter()
        .map(|(id, w)| RunningWorker {
            worker_id: id.clone(),
            port: w.port,
            topology_id: w.topology_id.clone(),
        })
        .collect()
}

/// Per topology: downloads of its code that keep failing wait ([`BackoffPolicy`]).
#[derive(Debug, Default)]
struct CodeRetries {
    policy: BackoffPolicy,
    by_topology: BTreeMap<TopologyId, Backoff>,
}

/// One sync-and-process round. A port whose topology's code is not here (or, before a launch,
/// does not match its checksum) and cannot be fetched only holds its launch: the worker already
/// running there is judged as usual, never killed for it.
async fn round(
    desired: &BTreeMap<u16, LocalAssignment>,
    code: &CodeSync,
    process: &mut ProcessTask,
    retries: &mut CodeRetries,
    metrics: &SupervisorMetrics,
) -> Vec<Done> {
    let now_secs = cluster_state::clock::now_secs();
    let launching = process.launches_due(desired, now_secs);
    let to_verify: BTreeSet<&TopologyId> =
        desired.iter().filter(|(port, _)| launching.contains(port)).map(|(_, a)| &a.topology_id).collect();
    let mut ready = BTreeMap::new();
    for assignment in desired.values() {
        let topology = &assignment.topology_id;
        if ready.contains_key(topology) {
            continue;
        }
        let ok = fetch_code(code, topology, to_verify.contains(topology), retries, metrics).await;
        ready.insert(topology.clone(), ok);
    }
    retries.by_topology.retain(|topology, _| ready.contains_key(topology));
    let held: BTreeSet<u16> = desired
        .iter()
        .filter(|(_, a)| !ready.get(&a.topology_id).copied().unwrap_or(false))
        .map(|(port, _)| *port)
        .collect();
    let done = match process.reconcile(desired, &held, now_secs).await {
        Ok(done) => {
            for action in &done {
                tracing::info!(?action, "worker action");
            }
            done
        }
        Err(e) => {
            tracing::warn!(error = %e, "worker actions failed; retrying next round");
            Vec::new()
        }
    };
    // Code stays while it is assigned here or a worker runs it, fetched or not.
    let mut keep: BTreeSet<TopologyId> = desired.values().map(|a| a.topology_id.clone()).collect();
    keep.extend(process.workers().values().map(|w| w.topology_id.clone()));
    for removed in code.remove_stale(&keep) {
        tracing::info!(topology = %removed, "removed code no assignment needs");
    }
    done
}

/// Brings a topology's code here (`verify`: and checks it, before a launch), unless its
/// downloads are backing off. Whether the code is ready.
async fn fetch_code(
    code: &CodeSync,
    topology: &TopologyId,
    verify: bool,
    retries: &mut CodeRetries,
    metrics: &SupervisorMetrics,
) -> bool {
    let now = tokio::time::Instant::now();
    if retries.by_topology.get(topology).is_some_and(|b| !b.ready(now)) {
        return false;
    }
    let fetched = if verify { code.ensure_verified(topology).await } else { code.ensure(topology).await };
    match fetched {
        Ok(_) => {
            retries.by_topology.remove(topology);
            true
        }
        Err(e) => {
            metrics.code_failures.inc();
            let delay = retries.by_topology.entry(topology.clone()).or_default().failed(&retries.policy, now);
            tracing::warn!(%topology, error = %e, "cannot get topology code; retrying in {delay:?}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn workers_are_launched_with_the_cluster_settings() {
        let config = SupervisorConfig {
            local_dir: "/var/storm".into(),
            zookeeper_root: "/squall".into(),
            zookeeper_session_timeout_ms: 7000,
            zookeeper_connection_timeout_ms: 3000,
            hostname: Some("host1".into()),
            ..SupervisorConfig::default()
        };
        let paths = config.validate().unwrap();
        let code = CodeSync::new("127.0.0.1:1", &config.local_dir);
        let program = WorkerProgram { squall: "/usr/bin/squall".into(), zookeeper: Some("zk1:2181".into()) };
        let build = worker_spec(&config, &paths, &code, &program, None, None);
        let assignment =
            LocalAssignment { topology_id: "wc-1-1700000000".parse().unwrap(), executors: BTreeSet::new() };
        let (supervisor, worker) = ("sup-1".parse().unwrap(), "w-1".parse().unwrap());
        let spec = build(&supervisor, &worker, 6700, &assignment);
        assert_eq!(spec.program, PathBuf::from("/usr/bin/squall"));
        let launch = &spec.launch;
        assert_eq!((launch.port, &launch.worker_id, &launch.supervisor_id), (6700, &worker, &supervisor));
        assert_eq!(launch.zookeeper.as_deref(), Some("zk1:2181"));
        assert_eq!(launch.storm_paths.root(), "/squall");
        assert_eq!(launch.hostname.as_deref(), Some("host1"));
        assert_eq!(launch.session_options().session_timeout, Duration::from_secs(7));
        assert_eq!(launch.session_options().connect_timeout, Duration::from_secs(3));
        assert!(launch.topology_file.ends_with("wc-1-1700000000/topology.yaml"), "{launch:?}");
        assert_eq!(WorkerLaunch::parse(launch.to_args()).unwrap(), *launch);
    }
}
