//! Nimbus as a whole: its configuration and the `run` entry the `squall nimbus` command calls.
//!
//! [`serve`] connects one coordination session, opens the code store, joins the leader
//! election ([`crate::leader`]) and serves the HTTP API and the consumer-group lag evaluator
//! ([`crate::lag`]) at once; while it follows it copies the leader's code, and once it leads it
//! runs the deadline timers and the monitor (the leader's duties), until `shutdown` or until the
//! session ends. Nimbus keeps nothing that is not in ZooKeeper or its code dir, so on an
//! expired session it stops and returns [`NimbusError::SessionEnded`]: [`run`] then starts over
//! with a new session as a candidate (a deposed leader rejoins as a follower), and a leader
//! re-arms every pending transition from ZooKeeper.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cluster_state::coord::{self, Ensemble, SessionOptions, SessionState};
use cluster_state::paths::{KafkaPaths, StormPaths};
use cluster_state::tls::{self, ClientTls, ServerTls, TlsAcceptor, TlsError, TlsFile};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::assigner::{Assigner, MonitorTimeouts};
use crate::code_store::{CodeStore, CodeStoreError, CodeStoreLimits};
use crate::http::{self, ApiConfig, ApiState};
use crate::lag::{LagMetrics, LagMonitor, LagSettings, Rules};
use crate::leader::{Election, Leadership, Replicator};
use crate::limits::TopologyLimits;
use crate::liveness::Timeouts;
use crate::metrics::NimbusMetrics;
use crate::transitions::{DeadlineTimers, Transitions};
use cluster_state::api::ClusterConfiguration;
use cluster_state::clock::now_secs;
use cluster_state::znode::NimbusSummary;

/// Nimbus's settings, with Storm's key names where Storm has the setting.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NimbusConfig {
    /// Local state; nimbus keeps its code under `<dir>/nimbus` (Storm's layout).
    #[serde(rename = "storm.local.dir")]
    pub local_dir: PathBuf,
    #[serde(rename = "storm.zookeeper.root")]
    pub zookeeper_root: String,
    #[serde(rename = "storm.zookeeper.session.timeout")]
    pub zookeeper_session_timeout_ms: u64,
    #[serde(rename = "storm.zookeeper.connection.timeout")]
    pub zookeeper_connection_timeout_ms: u64,
    /// How often heartbeats are checked, assignments recomputed and stored transitions re-read.
    #[serde(rename = "nimbus.monitor.freq.secs")]
    pub monitor_freq_secs: u64,
    /// An executor whose heartbeat has not changed for this long is reassigned.
    #[serde(rename = "nimbus.task.timeout.secs")]
    pub task_timeout_secs: u64,
    /// An executor assigned less than this long ago counts as alive (its worker is starting).
    #[serde(rename = "nimbus.task.launch.secs")]
    pub task_launch_secs: u64,
    /// A supervisor whose heartbeat has not changed for this long is dead: its executors move.
    #[serde(rename = "nimbus.supervisor.timeout.secs")]
    pub supervisor_timeout_secs: u64,
    /// Uploads idle this long are discarded.
    #[serde(rename = "nimbus.file.copy.expiration.secs")]
    pub file_copy_expiration_secs: u64,
    /// Storm's: the host name other processes reach this machine at; nimbus registers
    /// `<this>:<nimbus.http.port>` in `/storm/nimbuses` (default: `nimbus.http.host` unless it is
    /// a wildcard, else `$HOSTNAME`, else `localhost`).
    #[serde(rename = "storm.local.hostname")]
    pub hostname: Option<String>,
    /// Storm's: every nimbus's `host:port` (clients and supervisors try them to find the leader;
    /// nimbus itself finds the others in ZooKeeper).
    #[serde(rename = "nimbus.seeds")]
    pub seeds: Vec<String>,
    /// Storm's: a submit is acknowledged once this many nimbuses hold the code (or after
    /// `topology.max.replication.wait.time.sec`).
    #[serde(rename = "topology.min.replication.count")]
    pub min_replication_count: u32,
    /// Storm's: the longest a submit waits for `topology.min.replication.count`.
    #[serde(rename = "topology.max.replication.wait.time.sec")]
    pub max_replication_wait_secs: u64,
    /// Squall's: the API's listen address (default loopback: nothing off this machine reaches
    /// nimbus until the operator says so).
    #[serde(rename = "nimbus.http.host")]
    pub http_host: String,
    /// Squall's: the API's port (0 picks a free one).
    #[serde(rename = "nimbus.http.port")]
    pub http_port: u16,
    /// Squall's: required as `Authorization: Bearer <token>` on mutating calls and code
    /// downloads when set.
    #[serde(rename = "nimbus.http.token")]
    pub http_token: Option<String>,
    /// Squall's: allows the API on a non-loopback address without a token (anyone who reaches
    /// the port can then submit code that supervisors run). Off by default.
    #[serde(rename = "nimbus.http.insecure")]
    pub http_insecure: bool,
    /// Squall's: the API's certificate chain (PEM). With `nimbus.http.tls.key`, the API is
    /// HTTPS only.
    #[serde(rename = "nimbus.http.tls.cert")]
    pub http_tls_cert: Option<PathBuf>,
    /// Squall's: the private key of `nimbus.http.tls.cert` (PEM).
    #[serde(rename = "nimbus.http.tls.key")]
    pub http_tls_key: Option<PathBuf>,
    /// Squall's: mutual TLS: clients must present a certificate chaining to this CA (PEM).
    #[serde(rename = "nimbus.http.tls.client.ca")]
    pub http_tls_client_ca: Option<PathBuf>,
    /// Squall's, as a client of other nimbuses (copying code): the CA their certificates chain to.
    #[serde(rename = "nimbus.http.tls.ca")]
    pub http_tls_ca: Option<PathBuf>,
    /// Squall's, as a client of other nimbuses under mutual TLS: this nimbus's client certificate.
    #[serde(rename = "nimbus.http.tls.client.cert")]
    pub http_tls_client_cert: Option<PathBuf>,
    /// Squall's: the private key of `nimbus.http.tls.client.cert`.
    #[serde(rename = "nimbus.http.tls.client.key")]
    pub http_tls_client_key: Option<PathBuf>,
    /// Squall's: the largest topology code upload.
    #[serde(rename = "nimbus.code.max.upload.bytes")]
    pub max_upload_bytes: u64,
    /// Storm's: the most executors one component may have; nimbus refuses more (Storm caps).
    #[serde(rename = "topology.max.task.parallelism")]
    pub max_task_parallelism: Option<u32>,
    /// Squall's: the most tasks one topology may have, ackers included.
    #[serde(rename = "nimbus.topology.max.tasks")]
    pub max_topology_tasks: u32,
    /// Squall's: the most executors one topology may have, ackers included.
    #[serde(rename = "nimbus.topology.max.executors")]
    pub max_topology_executors: u32,
    /// Squall's: seconds between two passes of the consumer-group lag evaluator.
    #[serde(rename = "squall.lag.interval.secs")]
    pub lag_interval_secs: u64,
    /// Burrow's `intervals`: commits and log-end offsets kept per partition.
    #[serde(rename = "squall.lag.intervals")]
    pub lag_intervals: u64,
    /// Burrow's `allowed-lag`: a lag at or below this counts as caught up.
    #[serde(rename = "squall.lag.allowed.lag")]
    pub lag_allowed_lag: u64,
    /// Burrow's `minimum-complete` (0.0 to 1.0).
    #[serde(rename = "squall.lag.minimum.complete")]
    pub lag_minimum_complete: f32,
    /// Brokers the lag evaluator asks for log-end offsets, besides those of the Kafka spouts of
    /// stored topologies.
    #[serde(rename = "squall.lag.kafka.bootstrap.servers")]
    pub lag_bootstrap_servers: Option<String>,
    /// The chroot of the Kafka consumer registry the groups live in (none: the root).
    #[serde(rename = "squall.lag.zookeeper.chroot")]
    pub lag_zookeeper_chroot: Option<String>,
    /// Burrow's cluster name: the `cluster` label of the `burrow_kafka_*` series.
    #[serde(rename = "squall.lag.cluster")]
    pub lag_cluster: String,
}

impl Default for NimbusConfig {
    fn default() -> Self {
        NimbusConfig {
            // Storm's defaults.yaml: `storm.local.dir: "storm-local"`.
            local_dir: PathBuf::from("storm-local"),
            // Storm's defaults.yaml: `storm.zookeeper.root: "/storm"`.
            zookeeper_root: StormPaths::DEFAULT_ROOT.to_owned(),
            // Storm's defaults.yaml: `storm.zookeeper.session.timeout: 20000`,
            // `storm.zookeeper.connection.timeout: 15000`.
            zookeeper_session_timeout_ms: 20_000,
            zookeeper_connection_timeout_ms: 15_000,
            // Storm's defaults.yaml: `nimbus.monitor.freq.secs: 10`.
            monitor_freq_secs: 10,
            // Storm's defaults.yaml: `nimbus.task.timeout.secs: 30`, `nimbus.task.launch.secs:
            // 120`, `nimbus.supervisor.timeout.secs: 60`.
            task_timeout_secs: 30,
            task_launch_secs: 120,
            supervisor_timeout_secs: 60,
            // Storm's defaults.yaml: `nimbus.file.copy.expiration.secs: 600`.
            file_copy_expiration_secs: 600,
            hostname: None,
            seeds: Vec::new(),
            // Storm's defaults.yaml: `topology.min.replication.count: 1`,
            // `topology.max.replication.wait.time.sec: 60`.
            min_replication_count: 1,
            max_replication_wait_secs: 60,
            // Loopback unless configured (Storm UI binds every address; Squall's API takes code
            // to run, so it starts closed). SECURITY.md.
            http_host: "127.0.0.1".to_owned(),
            // Storm UI's `ui.port: 8080`, since the API is shaped like Storm UI's.
            http_port: 8080,
            http_token: None,
            http_insecure: false,
            // Plain HTTP unless configured (SECURITY.md).
            http_tls_cert: None,
            http_tls_key: None,
            http_tls_client_ca: None,
            http_tls_ca: None,
            http_tls_client_cert: None,
            http_tls_client_key: None,
            max_upload_bytes: CodeStoreLimits::default().max_upload_bytes,
            // Storm's defaults.yaml: `topology.max.task.parallelism: null`; the other two are
            // Squall's (see `TopologyLimits`).
            max_task_parallelism: TopologyLimits::default().max_task_parallelism,
            max_topology_tasks: TopologyLimits::default().max_tasks,
            max_topology_executors: TopologyLimits::default().max_executors,
            // Burrow's `offset-refresh` (10 s), `intervals` (10), `allowed-lag` (0) and
            // `minimum-complete` (unset: 0).
            lag_interval_secs: 10,
            lag_intervals: 10,
            lag_allowed_lag: 0,
            lag_minimum_complete: 0.0,
            lag_bootstrap_servers: None,
            lag_zookeeper_chroot: None,
            // Burrow's example config names its cluster `local`.
            lag_cluster: "local".to_owned(),
        }
    }
}

impl NimbusConfig {
    /// Checks every setting; the error names the key.
    pub fn validate(&self) -> Result<StormPaths, NimbusError> {
        let paths = StormPaths::new(&self.zookeeper_root)
            .map_err(|e| NimbusError::Config { key: "storm.zookeeper.root", message: e.to_string() })?;
        let positive = [
            ("storm.zookeeper.session.timeout", self.zookeeper_session_timeout_ms),
            ("storm.zookeeper.connection.timeout", self.zookeeper_connection_timeout_ms),
            ("nimbus.monitor.freq.secs", self.monitor_freq_secs),
            ("nimbus.task.timeout.secs", self.task_timeout_secs),
            ("nimbus.supervisor.timeout.secs", self.supervisor_timeout_secs),
            ("nimbus.file.copy.expiration.secs", self.file_copy_expiration_secs),
            ("nimbus.code.max.upload.bytes", self.max_upload_bytes),
            ("topology.max.task.parallelism", self.max_task_parallelism.map_or(1, u64::from)),
            ("nimbus.topology.max.tasks", u64::from(self.max_topology_tasks)),
            ("nimbus.topology.max.executors", u64::from(self.max_topology_executors)),
            ("squall.lag.interval.secs", self.lag_interval_secs),
            ("squall.lag.intervals", self.lag_intervals),
        ];
        if let Some((key, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(NimbusError::Config { key, message: "must be at least 1".into() });
        }
        if self.min_replication_count == 0 {
            return Err(NimbusError::Config {
                key: "topology.min.replication.count",
                message: "must be at least 1 (the leader itself)".into(),
            });
        }
        if let Some(seed) = self.seeds.iter().find(|s| parse_host_port(s).is_none()) {
            return Err(NimbusError::Config {
                key: "nimbus.seeds",
                message: format!("{seed:?} is not host:port"),
            });
        }
        if self.hostname.as_deref().is_some_and(|h| h.is_empty() || h.contains(['/', ':', ' '])) {
            return Err(NimbusError::Config {
                key: "storm.local.hostname",
                message: "must be a host name (no '/', ':' or spaces)".into(),
            });
        }
        if self.local_dir.as_os_str().is_empty() {
            return Err(NimbusError::Config { key: "storm.local.dir", message: "must not be empty".into() });
        }
        if self.http_token.as_deref().is_some_and(str::is_empty) {
            return Err(NimbusError::Config {
                key: "nimbus.http.token",
                message: "must not be empty (leave it out to run without a token)".into(),
            });
        }
        if self.http_token.is_none() && !self.http_insecure && !is_loopback_host(&self.http_host) {
            return Err(NimbusError::Config {
                key: "nimbus.http.host",
                message: format!(
                    "{:?} is not a loopback address and no nimbus.http.token is set: anyone reaching it \
                     could submit code to run; set a token, bind 127.0.0.1, or set \
                     nimbus.http.insecure: true to accept that",
                    self.http_host
                ),
            });
        }
        if !(0.0..=1.0).contains(&self.lag_minimum_complete) {
            return Err(NimbusError::Config {
                key: "squall.lag.minimum.complete",
                message: "must be between 0.0 and 1.0".into(),
            });
        }
        if self.lag_cluster.is_empty() {
            return Err(NimbusError::Config {
                key: "squall.lag.cluster",
                message: "must not be empty".into(),
            });
        }
        self.lag_paths()?;
        self.server_tls()?;
        self.client_tls()?;
        Ok(paths)
    }

    /// The API's TLS (`nimbus.http.tls.cert` / `.key` / `.client.ca`), read from its files;
    /// `None`: plain HTTP.
    pub fn server_tls(&self) -> Result<Option<TlsAcceptor>, NimbusError> {
        let file = |key, path: &Option<PathBuf>| TlsFile::from_setting(key, path.as_deref());
        let server = ServerTls::from_settings(
            file(tls::NIMBUS_CERT, &self.http_tls_cert),
            file(tls::NIMBUS_KEY, &self.http_tls_key),
            file(tls::NIMBUS_CLIENT_CA, &self.http_tls_client_ca),
            [tls::NIMBUS_CERT, tls::NIMBUS_KEY, tls::NIMBUS_CLIENT_CA],
        )?;
        Ok(server.map(|s| s.acceptor()).transpose()?)
    }

    /// TLS towards other nimbuses (`nimbus.http.tls.ca` / `.client.cert` / `.client.key`).
    pub fn client_tls(&self) -> Result<Option<ClientTls>, NimbusError> {
        Ok(tls::nimbus_client(
            self.http_tls_ca.as_deref(),
            self.http_tls_client_cert.as_deref(),
            self.http_tls_client_key.as_deref(),
        )?)
    }

    /// The limits a topology must keep to.
    pub fn topology_limits(&self) -> TopologyLimits {
        TopologyLimits {
            max_task_parallelism: self.max_task_parallelism,
            max_tasks: self.max_topology_tasks,
            max_executors: self.max_topology_executors,
        }
    }

    /// The consumer registry the lag evaluator reads (`squall.lag.zookeeper.chroot`).
    pub fn lag_paths(&self) -> Result<KafkaPaths, NimbusError> {
        KafkaPaths::new(self.lag_zookeeper_chroot.as_deref())
            .map_err(|e| NimbusError::Config { key: "squall.lag.zookeeper.chroot", message: e.to_string() })
    }

    /// The lag evaluator's settings.
    pub fn lag_settings(&self) -> LagSettings {
        let interval = Duration::from_secs(self.lag_interval_secs);
        LagSettings {
            interval,
            intervals: usize::try_from(self.lag_intervals).unwrap_or(usize::MAX),
            rules: Rules { allowed_lag: self.lag_allowed_lag, minimum_complete: self.lag_minimum_complete },
            bootstrap_servers: self.lag_bootstrap_servers.clone().filter(|s| !s.trim().is_empty()),
            kafka_timeout: interval.min(Duration::from_secs(5)),
        }
    }

    /// The configuration as `GET /api/v1/cluster/configuration` shows it: every key with
    /// Storm's name, secrets (`nimbus.http.token`) replaced by `<redacted>`.
    pub fn ui_configuration(&self) -> ClusterConfiguration {
        let map = match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        ClusterConfiguration(
            map.into_iter()
                .map(|(key, value)| {
                    let secret = cluster_state::secrets::is_secret_key(&key, &[]) && !value.is_null();
                    let value = if secret {
                        serde_json::Value::String(cluster_state::secrets::REDACTED.to_owned())
                    } else {
                        value
                    };
                    (key, value)
                })
                .collect(),
        )
    }

    /// `<storm.local.dir>/nimbus`.
    pub fn nimbus_dir(&self) -> PathBuf {
        self.local_dir.join("nimbus")
    }

    /// The host this nimbus registers under (see `storm.local.hostname`).
    pub fn advertised_host(&self) -> String {
        if let Some(host) = &self.hostname {
            return host.clone();
        }
        if !matches!(self.http_host.as_str(), "0.0.0.0" | "::" | "[::]" | "") {
            return self.http_host.clone();
        }
        std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "localhost".to_owned())
    }
}

/// `host:port` with a non-empty host and a port number.
pub fn parse_host_port(value: &str) -> Option<(&str, u16)> {
    let (host, port) = value.rsplit_once(':')?;
    let port = port.parse().ok()?;
    (!host.is_empty() && !host.contains(['/', ' '])).then_some((host, port))
}

/// Whether `host` (an address or `localhost`) only accepts connections from this machine.
/// Any other name counts as reachable from outside: it is resolved only at bind time.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Why nimbus could not start or stopped on its own.
#[derive(Debug, thiserror::Error)]
pub enum NimbusError {
    #[error("config key {key}: {message}")]
    Config { key: &'static str, message: String },
    /// A TLS setting that cannot be used (the error names the key and the file).
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot listen on {address} (nimbus.http.host / nimbus.http.port): {source}")]
    Bind { address: String, source: std::io::Error },
    #[error("cannot connect to ZooKeeper: {0}")]
    Connect(#[source] coord::Error),
    #[error(transparent)]
    CodeStore(#[from] CodeStoreError),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The session expired or was closed; a new nimbus process picks up from ZooKeeper.
    #[error("the ZooKeeper session ended ({state:?}); restart nimbus")]
    SessionEnded { state: SessionState },
}

/// Validates `config`, binds the API, and [`serve`]s until `shutdown`. The caller decides what
/// a [`NimbusError::SessionEnded`] means; `squall nimbus` runs this again (a new session, a
/// new candidate), see [`run_rejoining`].
pub async fn run(
    config: NimbusConfig,
    ensemble: Ensemble,
    registry: &prometheus::Registry,
    shutdown: CancellationToken,
) -> Result<(), NimbusError> {
    config.validate()?;
    let address = format!("{}:{}", config.http_host, config.http_port);
    let listener = TcpListener::bind(&address)
        .await
        .map_err(|source| NimbusError::Bind { address: address.clone(), source })?;
    serve(config, listener, ensemble, registry, shutdown).await
}

/// [`run`] again after every session end until `shutdown`: a leader whose session expired
/// (stopped, cut off) steps down and rejoins the election as a follower. Each round gets a
/// fresh registry from `registry` (its counters start again, as after a restart).
pub async fn run_rejoining(
    config: NimbusConfig,
    ensemble: Ensemble,
    registry: impl Fn() -> prometheus::Registry,
    shutdown: CancellationToken,
) -> Result<(), NimbusError> {
    loop {
        match run(config.clone(), ensemble.clone(), &registry(), shutdown.clone()).await {
            Err(NimbusError::SessionEnded { state }) if !shutdown.is_cancelled() => {
                tracing::warn!(
                    ?state,
                    "the ZooKeeper session ended: stepping down, rejoining with a new session"
                );
            }
            other => return other,
        }
    }
}

/// Runs nimbus on an already bound `listener` (tests and `squall local` bind port 0 and read
/// the address first).
pub async fn serve(
    config: NimbusConfig,
    listener: TcpListener,
    ensemble: Ensemble,
    registry: &prometheus::Registry,
    shutdown: CancellationToken,
) -> Result<(), NimbusError> {
    let paths = config.validate()?;
    let api_tls = config.server_tls()?;
    let client_tls = config.client_tls()?;
    let metrics = NimbusMetrics::register(registry)?;
    let options = SessionOptions {
        session_timeout: Duration::from_millis(config.zookeeper_session_timeout_ms),
        connect_timeout: Duration::from_millis(config.zookeeper_connection_timeout_ms),
        detached: false,
    };
    cluster_state::metrics::register_daemon_info(registry, "nimbus")?;
    let coord_metrics = cluster_state::metrics::CoordMetrics::register(registry)?;
    let session =
        Arc::new(ensemble.connect(&options).await.map_err(NimbusError::Connect)?.instrument(coord_metrics));
    let limits = CodeStoreLimits {
        max_upload_bytes: config.max_upload_bytes,
        upload_expiration: Duration::from_secs(config.file_copy_expiration_secs),
        ..Default::default()
    };
    let code = CodeStore::open(config.nimbus_dir(), limits).await?;
    let lag_metrics = LagMetrics::register(registry, &config.lag_cluster)?;
    let lag = LagMonitor::new(
        session.clone(),
        config.lag_paths()?,
        config.lag_settings(),
        Some(code.clone()),
        lag_metrics.clone(),
    );
    let timeouts = MonitorTimeouts {
        tasks: Timeouts {
            task_timeout_secs: config.task_timeout_secs,
            task_launch_secs: config.task_launch_secs,
        },
        supervisor_timeout_secs: config.supervisor_timeout_secs,
    };
    let leadership = Leadership::candidate();
    let assigner = Arc::new(
        Assigner::new(session.clone(), paths.clone(), code.clone(), timeouts, metrics.clone())
            .with_limits(config.topology_limits())
            .with_leadership(leadership.clone()),
    );
    let transitions = Arc::new(
        Transitions::new(session.clone(), paths.clone(), code.clone(), assigner.clone(), metrics)
            .with_leadership(leadership.clone()),
    );
    let monitor_freq = Duration::from_secs(config.monitor_freq_secs);
    let (timers, timer_handle) = DeadlineTimers::new(transitions.clone(), monitor_freq);
    let start_secs = now_secs();
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(config.http_port);
    let me = NimbusSummary {
        host: config.advertised_host(),
        port,
        start_time_secs: start_secs,
        uptime_secs: 0,
        version: env!("CARGO_PKG_VERSION").to_owned(),
        is_leader: false,
    };
    let replicator = Replicator::new(
        session.clone(),
        paths.clone(),
        code.clone(),
        me.address(),
        config.http_token.clone(),
        config.max_upload_bytes,
    )
    .with_tls(client_tls);
    let election = Election::new(
        session.clone(),
        paths,
        leadership.clone(),
        me.clone(),
        replicator.clone(),
        monitor_freq,
    );
    let api = Arc::new(ApiState {
        transitions: transitions.clone(),
        assigner: assigner.clone(),
        registry: registry.clone(),
        timers: timer_handle,
        config: ApiConfig {
            token: config.http_token.clone(),
            min_replication_count: config.min_replication_count as usize,
            max_replication_wait: Duration::from_secs(config.max_replication_wait_secs),
            https: api_tls.is_some(),
            ..Default::default()
        },
        nimbus_start_secs: start_secs,
        leadership: leadership.clone(),
        replicator: Some(replicator.clone()),
        lag: Some(lag_metrics),
        kafka_paths: config.lag_paths()?,
        cluster_configuration: config.ui_configuration(),
    });
    if let Ok(address) = listener.local_addr() {
        let scheme = if config.http_tls_cert.is_some() { "https" } else { "http" };
        tracing::info!(%address, scheme, registered_as = %me.address(), "nimbus API listening");
    }

    let children = shutdown.child_token();
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(http::run_tls(listener, api, api_tls, children.clone()));
    tasks.spawn(expire_uploads(code, monitor_freq, children.clone()));
    tasks.spawn(lag.run(children.clone()));
    let duties =
        LeaderDuties { election, replicator, leadership, assigner, transitions, timers, every: monitor_freq };
    tasks.spawn(duties.run(children.clone()));

    let mut states = session.state_changes();
    let ended = tokio::select! {
        _ = shutdown.cancelled() => None,
        state = async {
            loop {
                match states.next().await {
                    Some(event) if event.state.is_terminal() => return event.state,
                    Some(_) => continue,
                    None => return SessionState::Closed,
                }
            }
        } => Some(state),
    };
    children.cancel();
    while let Some(joined) = tasks.join_next().await {
        if let Err(e) = joined {
            tracing::error!("a nimbus task failed: {e}");
        }
    }
    match ended {
        Some(state) => Err(NimbusError::SessionEnded { state }),
        None => Ok(()),
    }
}

/// What a nimbus does about the leadership: campaign (copying the code meanwhile), then, once
/// it leads, the leader's duties: the deadline timers and the monitor.
struct LeaderDuties {
    election: Election,
    replicator: Replicator,
    leadership: Leadership,
    assigner: Arc<Assigner>,
    transitions: Arc<Transitions>,
    timers: DeadlineTimers,
    every: Duration,
}

impl LeaderDuties {
    async fn run(self, cancel: CancellationToken) {
        let LeaderDuties { election, replicator, leadership, assigner, transitions, mut timers, every } =
            self;
        // Terms: campaign, lead until deposed, campaign again; until `cancel` or the session's
        // end (`serve` then cancels us).
        loop {
            let campaign = async {
                loop {
                    match election.run(&cancel).await {
                        Ok(won) => return won,
                        Err(e) if e.is_session_lost() => return false,
                        Err(e) => {
                            tracing::warn!("leader election: {e}; trying again");
                            tokio::select! {
                                _ = cancel.cancelled() => return false,
                                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                            }
                        }
                    }
                }
            };
            let (won, ()) =
                tokio::join!(campaign, replicator.clone().run(leadership.clone(), every, cancel.clone()));
            let Some(latch) = leadership.election_node().filter(|_| won) else { return };
            // A new leader rebuilds everything from ZooKeeper: the assigner's memory starts
            // empty (with a launch grace for every executor) and the timers re-arm stored
            // deadlines.
            assigner.took_leadership(now_secs()).await;
            let term = cancel.child_token();
            let duties = async {
                tokio::join!(
                    timers.run(term.clone()),
                    monitor(assigner.clone(), transitions.clone(), every, term.clone())
                );
            };
            // The term ends when our election node goes (watched) or a fenced write finds it
            // gone (`Leadership::refused`): either way `leadership` no longer leads.
            let deposed = async {
                tokio::select! {
                    _ = election.watch_own_node(&latch, &term) => {}
                    _ = leadership.deposed() => {}
                    _ = term.cancelled() => {}
                }
                term.cancel();
            };
            tokio::join!(duties, deposed);
            if cancel.is_cancelled() {
                return;
            }
            leadership.step_down(&latch);
            tracing::warn!(node = %latch, "no longer the leader; rejoining the election as a follower");
        }
    }
}

/// Storm's monitor: every `every`, reassigns what died and removes what is left of removed
/// topologies. Failures are logged and retried at the next tick.
async fn monitor(
    assigner: Arc<Assigner>,
    transitions: Arc<Transitions>,
    every: Duration,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = assigner.monitor_pass().await {
            tracing::warn!("monitor pass failed, retrying at the next one: {e}");
        }
        assigner.cleanup_orphans(&transitions).await;
    }
}

/// Discards abandoned uploads every `every`.
async fn expire_uploads(code: CodeStore, every: Duration, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {
                code.expire().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_uses_storm_keys_and_defaults() {
        let config: NimbusConfig = serde_json::from_value(serde_json::json!({
            "storm.local.dir": "/var/squall",
            "nimbus.monitor.freq.secs": 2,
            "nimbus.http.token": "t",
        }))
        .unwrap();
        assert_eq!(config.nimbus_dir(), PathBuf::from("/var/squall/nimbus"));
        assert_eq!((config.monitor_freq_secs, config.file_copy_expiration_secs), (2, 600));
        assert_eq!(config.zookeeper_root, "/storm");
        config.validate().unwrap();
        let unknown = serde_json::from_value::<NimbusConfig>(serde_json::json!({"nimbus.monitor.freq": 2}));
        assert!(unknown.unwrap_err().to_string().contains("nimbus.monitor.freq"));
    }

    #[test]
    fn the_api_binds_loopback_unless_a_token_or_insecure_says_otherwise() {
        assert_eq!(NimbusConfig::default().http_host, "127.0.0.1");
        for host in ["127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost", "LOCALHOST"] {
            assert!(is_loopback_host(host), "{host}");
            NimbusConfig { http_host: host.into(), ..Default::default() }.validate().unwrap();
        }
        for host in ["0.0.0.0", "::", "10.0.0.1", "nimbus.example", "localhost.example"] {
            assert!(!is_loopback_host(host), "{host}");
            let open = NimbusConfig { http_host: host.into(), ..Default::default() };
            let err = open.validate().unwrap_err().to_string();
            assert!(err.contains("nimbus.http.token") && err.contains("nimbus.http.insecure"), "{err}");
            NimbusConfig { http_token: Some("t".into()), ..open.clone() }.validate().unwrap();
            NimbusConfig { http_insecure: true, ..open }.validate().unwrap();
        }
    }

    #[test]
    fn validation_names_the_key() {
        for (config, key) in [
            (NimbusConfig { zookeeper_root: "storm".into(), ..Default::default() }, "storm.zookeeper.root"),
            (NimbusConfig { monitor_freq_secs: 0, ..Default::default() }, "nimbus.monitor.freq.secs"),
            (NimbusConfig { http_token: Some(String::new()), ..Default::default() }, "nimbus.http.token"),
            (NimbusConfig { local_dir: PathBuf::new(), ..Default::default() }, "storm.local.dir"),
            (NimbusConfig { http_host: "0.0.0.0".into(), ..Default::default() }, "nimbus.http.host"),
            (NimbusConfig { http_host: "nimbus.example".into(), ..Default::default() }, "nimbus.http.host"),
            (NimbusConfig { lag_intervals: 0, ..Default::default() }, "squall.lag.intervals"),
            (NimbusConfig { lag_minimum_complete: 1.5, ..Default::default() }, "squall.lag.minimum.complete"),
            (
                NimbusConfig { lag_zookeeper_chroot: Some("kafka".into()), ..Default::default() },
                "squall.lag.zookeeper.chroot",
            ),
        ] {
            let err = config.validate().unwrap_err();
            assert!(err.to_string().starts_with(&format!("config key {key}:")), "{err}");
        }
    }
}
