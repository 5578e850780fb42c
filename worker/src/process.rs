//! The worker process: what `squall worker` (or a user's own worker binary) runs for one slot.
//!
//! [`run`] reads the slot's assignment, starts the executors, connects to the peer workers it
//! sends to and accepts theirs, then loops until `shutdown`: a local heartbeat file and a
//! ZooKeeper heartbeat with executor stats at the periods of [`WorkerConfig`], errors to
//! `/storm/errors` (rate-limited, last 10 kept), and a reconcile of peers and activation on
//! every assignment / storm-base watch and every [`WorkerConfig::refresh_poll_secs`]. Its
//! ZooKeeper session has the cluster's timeouts ([`WorkerArgs::session`], from the launch).
//! Shutdown is graceful: spouts deactivate, pending tuples drain up to
//! a bound, connections flush, the heartbeats are removed.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cluster_state::clock::now_secs;
use cluster_state::coord::{
    CreateMode, Ensemble, Error as CoordError, Session, SessionOptions, SessionState, Watch, WatchEvent,
};
use cluster_state::ids::{ComponentId, ExecutorId, SupervisorId, TopologyId, WorkerSlot};
use cluster_state::paths::StormPaths;
use cluster_state::znode::{
    Assignment, ErrorInfo, ExecutorStats, LocalWorkerHeartbeat, MetricsScheme, StormBase, TopologyStatus,
    WorkerHeartbeat, WorkerbeatThrottle, ZnodeData,
};
use prometheus::{IntCounter, Registry as MetricsRegistry};
use tokio_util::sync::CancellationToken;

use crate::collector::ErrorReport;
use crate::error::{Error, Result};
use crate::layout::{PlanError, TaskLayout, plan_worker};
use crate::runtime::WorkerRuntime;
pub use crate::static_worker::{StaticWorker, TransportOptions};
use crate::topology::Topology;
use crate::transport::{DEFAULT_MAX_CONNECTIONS, TopologySecret, TransportStats};

/// Process-level worker settings with Storm's defaults (defaults.yaml). No config file or flag
/// sets them: the worker binary takes the defaults (`bind_host` aside, which its launch gives),
/// and embedders (`squall local`, tests) set
/// their own. What the cluster configures reaches the worker through its launch
/// (`cluster_state::launch::WorkerLaunch`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// Local heartbeat file period, in seconds. Storm: 1.
    pub heartbeat_frequency_secs: u64,
    /// How often the worker considers writing its `/storm/workerbeats` node, in seconds
    /// (Storm writes it every 3). It writes only when the content changed and at least the
    /// topology's `squall.workerbeats.zk.secs` (60) after the last write.
    pub zk_heartbeat_frequency_secs: u64,
    /// Overrides the topology's `squall.workerbeats.zk.secs` (tests reading executor stats
    /// from the node set 1).
    pub workerbeats_zk_secs: Option<u64>,
    /// Whether this worker writes (and at its end removes) its own `/storm/workerbeats` node:
    /// true when it runs alone; a supervisor's workers leave it to their supervisor
    /// (`--workerbeat-writer supervisor`), which writes all of them in one transaction.
    pub writes_workerbeat: bool,
    /// Re-read assignment and status even without a watch, in seconds. Storm: 10.
    pub refresh_poll_secs: u64,
    /// Bound on draining pending tuples at shutdown, in milliseconds. Clearly below the
    /// supervisor's grace before SIGKILL (`supervisor.worker.shutdown.sleep.secs` = 3 s), so a
    /// worker stopped for a rebalance finishes its shutdown (flush, heartbeats removed, session
    /// closed within `cluster_state::coord::SHUTDOWN_CLOSE_BOUND`) instead of being killed mid-way.
    pub shutdown_drain_ms: u64,
    /// Address the worker's port is bound on.
    pub bind_host: String,
    /// Errors kept per component under `/storm/errors` (Storm keeps 10).
    pub errors_kept: usize,
    /// Peer connections the worker's port keeps open at once. At the limit a new connection
    /// takes the place of the oldest one still in its handshake
    /// (`squall_worker_transport_connections_evicted_total`), and is closed only when every
    /// open connection is authenticated (`..._connections_refused_total`). A worker has one
    /// connection from each peer worker of its topology, so the default, 256, is generous.
    pub max_peer_connections: usize,
    /// TLS of the worker's `/metrics` (`worker.metrics.tls.*`, from the launch); `None`: plain
    /// HTTP. Published in the heartbeats as the endpoint's scheme, for discovery.
    pub metrics_tls: Option<cluster_state::tls::ServerTls>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            heartbeat_frequency_secs: 1,
            zk_heartbeat_frequency_secs: 3,
            workerbeats_zk_secs: None,
            writes_workerbeat: true,
            refresh_poll_secs: 10,
            shutdown_drain_ms: 1500,
            bind_host: "0.0.0.0".into(),
            errors_kept: 10,
            max_peer_connections: DEFAULT_MAX_CONNECTIONS,
            metrics_tls: None,
        }
    }
}

/// Who this worker is: Storm's worker arguments plus where to write its local heartbeat.
#[derive(Debug, Clone)]
pub struct WorkerArgs {
    pub topology_id: TopologyId,
    pub supervisor_id: SupervisorId,
    pub port: u16,
    pub worker_id: String,
    /// The supervisor's local dir; the heartbeat goes to `<local_dir>/workers/<worker_id>/heartbeat`.
    pub local_dir: PathBuf,
    /// This host's name, for error reports.
    pub hostname: String,
    /// How to open the ZooKeeper session: the cluster's `storm.zookeeper.session.timeout` and
    /// `storm.zookeeper.connection.timeout`, as the launch gives them.
    pub session: SessionOptions,
    /// The topology's secret, which its workers authenticate each other with (read from the
    /// code dir by `cli::prepare`).
    pub secret: TopologySecret,
}

/// Writes the local heartbeat (cluster-state's [`LocalWorkerHeartbeat`] format) atomically:
/// a temp file, then a rename, so the supervisor never reads half a beat.
pub fn write_local_heartbeat(path: &Path, beat: &LocalWorkerHeartbeat) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    cluster_state::files::create_private_dir_all(dir)
        .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let tmp = path.with_extension("tmp");
    cluster_state::files::write_private(&tmp, &beat.encode())
        .map_err(|e| Error::io(format!("write {}", tmp.display()), e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(format!("rename to {}", path.display()), e))
}

/// Reads a local heartbeat file.
pub fn read_local_heartbeat(path: &Path) -> Result<LocalWorkerHeartbeat> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    LocalWorkerHeartbeat::decode(&path.display().to_string(), &bytes)
        .map_err(|e| Error::Coord(cluster_state::coord::Error::Decode(e)))
}

/// Storm's error throttle: at most `max` reports per component in any `window`.
#[derive(Debug)]
pub struct ErrorThrottle {
    window: Duration,
    max: usize,
    recent: BTreeMap<ComponentId, VecDeque<Instant>>,
}

impl ErrorThrottle {
    /// A throttle allowing `max` per `window` (Storm: 5 per 10 s).
    pub fn new(max: u32, window: Duration) -> Self {
        ErrorThrottle { window, max: max as usize, recent: BTreeMap::new() }
    }

    /// Whether an error of `component` at `now` may be reported (and records it if so).
    pub fn allow(&mut self, component: &ComponentId, now: Instant) -> bool {
        let q = self.recent.entry(component.clone()).or_default();
        while q.front().is_some_and(|t| now.duration_since(*t) >= self.window) {
            q.pop_front();
        }
        if q.len() >= self.max {
            return false;
        }
        q.push_back(now);
        true
    }
}

/// Which error znodes to delete to keep the newest `keep` (names as ZooKeeper lists them).
pub fn errors_to_prune(children: &[String], keep: usize) -> Vec<String> {
    let mut seqs: Vec<(u32, &String)> =
        children.iter().filter_map(|c| StormPaths::parse_error_seq(c).map(|s| (s, c))).collect();
    seqs.sort();
    let excess = seqs.len().saturating_sub(keep);
    seqs.into_iter().take(excess).map(|(_, c)| c.clone()).collect()
}

struct Metrics {
    emitted: IntCounter,
    acked: IntCounter,
    failed: IntCounter,
    frames_sent: IntCounter,
    batches_dropped: IntCounter,
    envelopes_unsendable: IntCounter,
    handshakes_failed: IntCounter,
    connections_refused: IntCounter,
    connections_evicted: IntCounter,
    accept_errors: IntCounter,
    connections: prometheus::IntGauge,
    last: [u64; 10],
}

impl Metrics {
    fn register(registry: &MetricsRegistry) -> Result<Self> {
        let c = |name: &str, help: &str| -> Result<IntCounter> {
            let c = IntCounter::new(name, help)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        Ok(Metrics {
            emitted: c("squall_worker_emitted_total", "Tuples emitted by this worker's executors")?,
            acked: c("squall_worker_acked_total", "Tuples acked by this worker's executors")?,
            failed: c("squall_worker_failed_total", "Tuples failed by this worker's executors")?,
            frames_sent: c("squall_worker_frames_sent_total", "Frames sent to peer workers")?,
            batches_dropped: c(
                "squall_worker_batches_dropped_total",
                "Batches dropped for unreachable peers",
            )?,
            envelopes_unsendable: c(
                "squall_worker_envelopes_unsendable_total",
                "Tuples and acks dropped because they cannot be sent to a peer (larger than a frame may be)",
            )?,
            handshakes_failed: c(
                "squall_worker_transport_handshakes_failed_total",
                "Inbound peer connections closed for failing the handshake (wrong topology or secret, or too slow)",
            )?,
            connections_refused: c(
                "squall_worker_transport_connections_refused_total",
                "Inbound peer connections closed at once: the connection limit was reached with every connection authenticated",
            )?,
            connections_evicted: c(
                "squall_worker_transport_connections_evicted_total",
                "Inbound peer connections still in their handshake closed to make room for a new one at the connection limit",
            )?,
            accept_errors: c(
                "squall_worker_transport_accept_errors_total",
                "Failed accepts on the worker's port (out of file descriptors, say)",
            )?,
            connections: {
                let g = prometheus::IntGauge::new(
                    "squall_worker_transport_connections",
                    "Inbound peer connections open (authenticated or in their handshake)",
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            last: [0; 10],
        })
    }

    fn update(&mut self, runtime: &WorkerRuntime, transport: &TransportStats) {
        let stats = runtime.stats();
        let sum = |f: fn(&crate::stats::ExecStats) -> u64| stats.iter().map(|s| f(s)).sum::<u64>();
        let now = [
            sum(|s| s.emitted.load(Ordering::Relaxed)),
            sum(|s| s.acked.load(Ordering::Relaxed)),
            sum(|s| s.failed.load(Ordering::Relaxed)),
            transport.frames_sent.load(Ordering::Relaxed),
            transport.batches_dropped.load(Ordering::Relaxed),
            transport.envelopes_unsendable.load(Ordering::Relaxed),
            transport.handshakes_failed.load(Ordering::Relaxed),
            transport.connections_refused.load(Ordering::Relaxed),
            transport.connections_evicted.load(Ordering::Relaxed),
            transport.accept_errors.load(Ordering::Relaxed),
        ];
        let counters = [
            &self.emitted,
            &self.acked,
            &self.failed,
            &self.frames_sent,
            &self.batches_dropped,
            &self.envelopes_unsendable,
            &self.handshakes_failed,
            &self.connections_refused,
            &self.connections_evicted,
            &self.accept_errors,
        ];
        for (i, c) in counters.iter().enumerate() {
            c.inc_by(now[i].saturating_sub(self.last[i]));
        }
        self.last = now;
        self.connections
            .set(i64::try_from(transport.connections.load(Ordering::Relaxed)).unwrap_or(i64::MAX));
    }
}

/// Resolves when `w` fires; never when there is no watch.
async fn fired(w: &mut Option<Watch>) -> WatchEvent {
    match w {
        Some(w) => w.await,
        None => std::future::pending().await,
    }
}

/// How often activation is re-evaluated (cheap: a few atomic loads).
const ACTIVATION_CHECK: Duration = Duration::from_millis(100);
/// How long spouts wait for connections to every peer before starting anyway.
const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// Spouts run while the topology is active and, like Storm's workers, only once connections
/// to and from every peer are up (or [`CONNECT_WAIT`] has passed): tuples sent before would be
/// dropped and only replayed after the message timeout.
fn apply_activation(worker: &StaticWorker, status_active: bool, started: Instant) {
    let ready = worker.peers_connected() || started.elapsed() >= CONNECT_WAIT;
    let active = status_active && ready;
    if active != worker.runtime.is_active() {
        if active {
            worker.runtime.activate();
        } else {
            worker.runtime.deactivate();
        }
        tracing::info!(active, "spouts {}", if active { "activated" } else { "deactivated" });
    }
}

/// Runs the worker for `args`'s slot until `shutdown` is cancelled; then the final statistics
/// of the executors it ran last (after the drain; none if it never had an assignment), which
/// its heartbeats no longer carry: the in-process workers of `squall local` end their summary
/// with them.
pub async fn run(
    args: WorkerArgs,
    config: WorkerConfig,
    topology: Topology,
    ensemble: Ensemble,
    paths: StormPaths,
    metrics: &MetricsRegistry,
    shutdown: CancellationToken,
) -> Result<Vec<ExecutorStats>> {
    cluster_state::metrics::register_daemon_info(metrics, "worker")?;
    let coord_metrics = cluster_state::metrics::CoordMetrics::register(metrics)?;
    let session = ensemble.connect(&args.session).await?.instrument(coord_metrics);
    // Runtime log levels follow /logconfigs/<id> on the same session, for as long as it runs.
    let levels = crate::log_levels::follow(&session, &paths, &args.topology_id);
    let result = tokio::select! {
        result = run_session(&args, &config, topology, &session, &paths, metrics, &shutdown) => result,
        never = levels => match never {},
    };
    // Bounded: a worker must exit even while ZooKeeper is down.
    session.close_within(cluster_state::coord::SHUTDOWN_CLOSE_BOUND).await;
    result
}

async fn read_assignment(
    session: &Session,
    paths: &StormPaths,
    id: &TopologyId,
    shutdown: &CancellationToken,
) -> Result<Option<(Assignment, Watch)>> {
    let path = paths.assignment(id);
    loop {
        match session.read_watch::<Assignment>(&path).await {
            Ok((a, _, w)) => return Ok(Some((a, w))),
            Err(CoordError::NoNode { .. }) => {
                let (exists, w) = session.exists_watch(&path).await?;
                if exists.is_some() {
                    continue;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(None),
                    _ = w => {}
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The topology's status with a watch for its next change: `Ok(false)` when it is gone, an
/// error when ZooKeeper could not say. A ZooKeeper hiccup is not a `deactivate`: the caller
/// keeps the last known status and reads again.
async fn read_active(
    session: &Session,
    paths: &StormPaths,
    id: &TopologyId,
) -> Result<(bool, Watch), CoordError> {
    match session.read_watch::<StormBase>(&paths.storm(id)).await {
        Ok((base, _, w)) => Ok((base.status == TopologyStatus::Active, w)),
        Err(CoordError::NoNode { .. }) => {
            session.exists_watch(&paths.storm(id)).await.map(|(_, w)| (false, w))
        }
        Err(e) => Err(e),
    }
}

/// Applies a status read: the new status and its watch, or the last known status and a note
/// to read again soon.
fn take_status(
    read: Result<(bool, Watch), CoordError>,
    status_active: &mut bool,
    base_watch: &mut Option<Watch>,
    reread: &mut bool,
) {
    match read {
        Ok((active, w)) => {
            *status_active = active;
            *base_watch = Some(w);
            *reread = false;
        }
        Err(e) => {
            if !*reread {
                tracing::warn!(error = %e, active = *status_active, "cannot read the topology's status; keeping the last known one and reading again");
            }
            *base_watch = None;
            *reread = true;
        }
    }
}

/// One ZooKeeper session of a worker: start the executors for the assignment, then one
/// `select!` loop until shutdown or a fatal error.
///
/// Why one long function: the loop's state (the plan, the armed watches, the last known status,
/// the two heartbeat timers, the error throttle) lives for exactly one session and every arm
/// reads or writes several parts of it; the decisions themselves are small helpers
/// (`take_status`, `apply_activation`, `tasks_moved`, `plan_worker`). Splitting the loop would
/// pass that state around as a dozen `&mut` arguments without making any decision clearer.
#[allow(clippy::too_many_lines)]
async fn run_session(
    args: &WorkerArgs,
    config: &WorkerConfig,
    topology: Topology,
    session: &Session,
    paths: &StormPaths,
    metrics_registry: &MetricsRegistry,
    shutdown: &CancellationToken,
) -> Result<Vec<ExecutorStats>> {
    let slot = WorkerSlot { node: args.supervisor_id.clone(), port: args.port };
    let id = &args.topology_id;
    let topology = Arc::new(topology);
    // Tasks come from the file; executors from the assignment, which follows a rebalance's
    // `-e comp=N` while the file keeps its own parallelism.
    let file_layout = TaskLayout::compute(&topology.component_parallelism());
    let Some((assignment, assign_watch)) = read_assignment(session, paths, id, shutdown).await? else {
        return Ok(Vec::new());
    };
    let bad = |reason: String| Error::BadAssignment { topology: id.to_string(), reason };
    let plan_of = |a: &Assignment| {
        let unknown = |x: ExecutorId| bad(format!("executor {x} is not part of the topology's code"));
        let layout = file_layout.with_executors(a.executors.iter().map(|e| e.executor)).map_err(unknown)?;
        let plan = plan_worker(&layout, a, &slot).map_err(|e| match e {
            PlanError::UnknownExecutor(x) => unknown(x),
            PlanError::NothingAssigned => {
                bad(format!("nothing is assigned to slot {}:{}", slot.node, slot.port))
            }
        })?;
        Ok::<_, Error>((Arc::new(layout), plan))
    };
    let (layout, plan) = plan_of(&assignment)?;
    // `/metrics`' certificate read before anything is bound: a bad file names its key.
    let metrics_tls = match &config.metrics_tls {
        Some(tls) => Some(tls.acceptor().map_err(|e| Error::Tls { reason: e.to_string() })?),
        None => None,
    };
    let metrics_scheme = MetricsScheme::from_tls(metrics_tls.is_some());
    let (err_tx, mut err_rx) = tokio::sync::mpsc::channel::<ErrorReport>(256);
    let options = TransportOptions {
        bind_host: config.bind_host.clone(),
        secret: args.secret.clone(),
        max_connections: config.max_peer_connections,
        tls: topology.config().transport_tls,
    };
    let mut worker = StaticWorker::start(topology.clone(), layout.clone(), plan, id, options, Some(err_tx))?;
    let plan = worker.plan.clone();
    tracing::info!(topology = %id, port = args.port, addr = %worker.local_addr(), executors = plan.local_executors.len(), "worker started");
    let mut metrics = Metrics::register(metrics_registry)?;
    let executor_metrics = crate::metrics::ExecutorMetrics::new(id.as_str())?;
    executor_metrics.set_sources(worker.runtime.metric_sources());
    metrics_registry.register(Box::new(executor_metrics.clone()))?;
    // `/metrics` on a free port of the bind host, published in the heartbeat for discovery.
    let metrics_listener = tokio::net::TcpListener::bind((config.bind_host.as_str(), 0))
        .await
        .map_err(|e| Error::io("listen for /metrics", e))?;
    let metrics_endpoint =
        metrics_listener.local_addr().ok().map(|a| format!("{}:{}", args.hostname, a.port()));
    // Served until the worker has stopped (so the last scrape sees the drain), then awaited;
    // an early return cancels it through the guard.
    let metrics_stop = shutdown.child_token();
    let metrics_server = tokio::spawn(cluster_state::metrics::serve_tls(
        metrics_listener,
        metrics_registry.clone(),
        metrics_tls,
        metrics_stop.clone(),
    ));
    let stop_metrics = metrics_stop.drop_guard();
    // Until the status is known the spouts stay inactive (the worker starts them inactive).
    let (mut status_active, mut base_watch, mut reread_status) = (false, None, false);
    take_status(
        read_active(session, paths, id).await,
        &mut status_active,
        &mut base_watch,
        &mut reread_status,
    );
    let mut session_states = session.state_changes();
    let started = Instant::now();
    let mut activation = tokio::time::interval(ACTIVATION_CHECK);
    let mut assign_watch = Some(assign_watch);
    let mut plan = plan;
    let start_secs = now_secs();
    let beat_path = LocalWorkerHeartbeat::path(&args.local_dir, &args.worker_id);
    let executors: Vec<ExecutorId> = plan.local_executors.iter().copied().collect();
    let mut throttle = ErrorThrottle::new(
        topology.config().max_error_report_per_interval,
        Duration::from_secs(topology.config().error_throttle_interval_secs),
    );
    let mut local_beat = tokio::time::interval(Duration::from_secs(config.heartbeat_frequency_secs.max(1)));
    let mut zk_beat = tokio::time::interval(Duration::from_secs(config.zk_heartbeat_frequency_secs.max(1)));
    let mut refresh = tokio::time::interval(Duration::from_secs(config.refresh_poll_secs.max(1)));
    let beat_znode = paths.workerbeat(id, &slot);
    let mut fatal: Option<Error> = None;
    let mut assignment_gone = false;
    // The workerbeat node, when this worker writes it (run alone; a supervisor's workers leave
    // it to the supervisor, `config.writes_workerbeat`): written at once, then only when its
    // content changed and at least `squall.workerbeats.zk.secs` after the previous write
    // (liveness goes to nimbus through the supervisor's aggregated heartbeat; the node is for
    // tools reading Storm's layout).
    let zk_beat_every = Duration::from_secs(
        config.workerbeats_zk_secs.unwrap_or(topology.config().workerbeats_zk_secs).max(1),
    );
    let mut zk_throttle = WorkerbeatThrottle::new(zk_beat_every);

    // What the worker says of itself now, given its executors' stats: its local heartbeat
    // file, and the workerbeat node made of it (`WorkerHeartbeat::from`, as its supervisor
    // makes it).
    let local_heartbeat = |executor_stats| LocalWorkerHeartbeat {
        time_secs: now_secs(),
        topology_id: id.clone(),
        executors: executors.clone(),
        port: args.port,
        start_time_secs: Some(start_secs),
        executor_stats,
        metrics_endpoint: metrics_endpoint.clone(),
        metrics_scheme,
        workerbeats_zk_secs: Some(zk_beat_every.as_secs()),
    };
    loop {
        let mut reconcile = false;
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = local_beat.tick() => {
                // A spout or bolt panicked, or could not open / prepare, and its executor is
                // gone: like Storm's worker, report it and exit, so that the supervisor starts
                // a fresh worker instead of this one timing out every tree that needs the dead
                // executor. The errors already reported go first (a failed `prepare`'s own).
                if let Some((executor, component)) = worker.runtime.dead_executor() {
                    while let Ok(report) = err_rx.try_recv() {
                        report_component_error(args, config, session, paths, &mut throttle, report).await;
                    }
                    let reason = "a spout or bolt panicked or could not open / prepare, and its executor stopped; the worker exits so that its supervisor restarts it".to_owned();
                    tracing::error!(%component, %executor, "{reason}");
                    report_here(args, config, session, paths, &component, format!("executor {executor}: {reason}")).await;
                    fatal = Some(Error::Executor { executor: executor.to_string(), reason });
                    break;
                }
                if let Err(e) = write_local_heartbeat(&beat_path, &local_heartbeat(worker.runtime.stats().iter().map(|s| s.snapshot()).collect())) {
                    tracing::warn!(error = %e, "cannot write the local heartbeat");
                }
            }
            ticked = zk_beat.tick() => {
                metrics.update(&worker.runtime, &worker.transport);
                let beat = WorkerHeartbeat::from(&local_heartbeat(worker.runtime.stats().iter().map(|s| s.snapshot()).collect()));
                // Without a session the worker cannot see assignments: stop (gracefully) and let the
                // supervisor start a fresh one. Checked every tick, written or not.
                let lost = if session.state().is_terminal() {
                    Some(Error::Coord(CoordError::SessionExpired { path: Some(beat_znode.clone()) }))
                } else if config.writes_workerbeat && zk_throttle.due(&beat, ticked) {
                    // Judged by the ticks' own instants, evenly spaced: the time a write took
                    // must not make the next one a tick late (with a 1 s interval, every other
                    // tick was skipped and `squall local` showed no progress for 2 s).
                    match session.set_or_create(&beat_znode, &beat.encode()).await.map_err(Error::from) {
                        Ok(()) => {
                            zk_throttle.written(beat, ticked);
                            None
                        }
                        Err(Error::Coord(e)) if e.is_session_lost() => Some(Error::Coord(e)),
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot write the ZooKeeper heartbeat");
                            None
                        }
                    }
                } else {
                    None
                };
                if let Some(e) = lost {
                    tracing::error!(error = %e, "ZooKeeper session lost; stopping the worker");
                    fatal = Some(e);
                    break;
                }
            }
            _ = refresh.tick() => { worker.reap_peers(); reconcile = true; }
            // A status read that failed is tried again at the next check, not a refresh later.
            _ = activation.tick() => {
                if reread_status {
                    take_status(read_active(session, paths, id).await, &mut status_active, &mut base_watch, &mut reread_status);
                }
            }
            // Watches may have been missed while disconnected: re-read everything.
            Some(event) = session_states.next() => reconcile = event.state == SessionState::Connected,
            _ = fired(&mut assign_watch) => { assign_watch = None; reconcile = true; }
            _ = fired(&mut base_watch) => { base_watch = None; reconcile = true; }
            Some(report) = err_rx.recv() => {
                report_component_error(args, config, session, paths, &mut throttle, report).await;
            }
        }
        if reconcile {
            match session.read_watch::<Assignment>(&paths.assignment(id)).await {
                Ok((a, _, w)) => {
                    assign_watch = Some(w);
                    assignment_gone = false;
                    match plan_of(&a).map(|(_, plan)| plan) {
                        Ok(new_plan) if new_plan.local_executors == plan.local_executors => {
                            if new_plan != plan {
                                worker.update(new_plan.clone())?;
                                tracing::info!(
                                    peers = new_plan.peers.len(),
                                    "assignment changed: peers reconnected"
                                );
                                plan = new_plan;
                            }
                        }
                        // Storm's supervisor kills a worker whose executors moved; keep running
                        // what we have until it does.
                        Ok(_) => tracing::warn!(
                            "this slot's executors changed; waiting for the supervisor to restart the worker"
                        ),
                        Err(e) => tracing::warn!(error = %e, "assignment not applicable"),
                    }
                }
                // Nimbus removed it (topology killed): the supervisor stops this worker next,
                // as in Storm; say so once instead of warning on every refresh.
                Err(cluster_state::coord::Error::NoNode { .. }) => {
                    if !assignment_gone {
                        tracing::info!(
                            "assignment removed (topology killed); waiting for the supervisor to stop this worker"
                        );
                        assignment_gone = true;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot re-read the assignment"),
            }
            take_status(
                read_active(session, paths, id).await,
                &mut status_active,
                &mut base_watch,
                &mut reread_status,
            );
        }
        apply_activation(&worker, status_active, started);
    }

    // Graceful shutdown: drain, stop executors, flush peers, stop receiving, remove beats.
    let drain = Duration::from_millis(config.shutdown_drain_ms);
    let stats = worker.runtime.stats();
    let stopped = tokio::task::spawn_blocking(move || worker.shutdown(drain)).await;
    if stopped.is_err() {
        tracing::error!("worker shutdown panicked");
    }
    if config.writes_workerbeat
        && let Err(e) = session.delete(&beat_znode, None).await
        && !matches!(e, CoordError::NoNode { .. })
    {
        tracing::warn!(error = %e, "cannot remove the ZooKeeper heartbeat");
    }
    let _ = std::fs::remove_file(&beat_path);
    drop(stop_metrics);
    let _ = metrics_server.await;
    tracing::info!(topology = %id, port = args.port, "worker stopped");
    fatal.map_or_else(|| Ok(stats.iter().map(|s| s.snapshot()).collect()), Err)
}

/// Writes an error a component reported, redacted (it may quote the component's params, and
/// `squall errors` shows it), unless the component is over `throttle`'s rate.
async fn report_component_error(
    args: &WorkerArgs,
    config: &WorkerConfig,
    session: &Session,
    paths: &StormPaths,
    throttle: &mut ErrorThrottle,
    report: ErrorReport,
) {
    if throttle.allow(&report.component, Instant::now()) {
        let error = cluster_state::secrets::redact_known(&report.error).into_owned();
        report_here(args, config, session, paths, &report.component, error).await;
    }
}

/// Writes `error` of `component` to `/storm/errors` as this worker's (its host and port); a
/// write that fails is logged and the worker goes on.
async fn report_here(
    args: &WorkerArgs,
    config: &WorkerConfig,
    session: &Session,
    paths: &StormPaths,
    component: &ComponentId,
    error: String,
) {
    let info = ErrorInfo { error, time_secs: now_secs(), host: args.hostname.clone(), port: args.port };
    if let Err(e) =
        report_error(session, paths, &args.topology_id, component, &info, config.errors_kept).await
    {
        tracing::warn!(error = %e, "cannot report an error to ZooKeeper");
    }
}

/// Writes one error as `/storm/errors/<topology>/<component>/e<seq>` and prunes to the newest `keep`.
pub async fn report_error(
    session: &Session,
    paths: &StormPaths,
    id: &TopologyId,
    component: &ComponentId,
    info: &ErrorInfo,
    keep: usize,
) -> Result<()> {
    session
        .create(
            &paths.error_sequential_prefix(id, component),
            &info.encode(),
            CreateMode::PersistentSequential.with_parents(),
        )
        .await?;
    let dir = paths.errors_component(id, component);
    let children = session.children(&dir).await?;
    for name in errors_to_prune(&children, keep) {
        match session.delete(&format!("{dir}/{name}"), None).await {
            Ok(()) | Err(CoordError::NoNode { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_throttle_allows_five_per_ten_seconds_per_component() {
        let mut t = ErrorThrottle::new(5, Duration::from_secs(10));
        let (a, b) = (ComponentId::new("a").unwrap(), ComponentId::new("b").unwrap());
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let got: Vec<bool> = (0..7).map(|_| t.allow(&a, at(0))).collect();
        assert_eq!(got, [true, true, true, true, true, false, false]);
        assert!(t.allow(&b, at(1)), "another component has its own budget");
        assert!(!t.allow(&a, at(9)));
        assert!(t.allow(&a, at(10)), "the window has passed");
    }

    #[test]
    fn pruning_keeps_the_newest() {
        let names: Vec<String> =
            [3, 1, 12, 2, 11].iter().map(|n| format!("e{n:010}")).chain(["junk".to_owned()]).collect();
        assert_eq!(errors_to_prune(&names, 3), vec!["e0000000001".to_owned(), "e0000000002".to_owned()]);
        assert!(errors_to_prune(&names, 10).is_empty());
    }
}
