//! How a supervisor starts a worker: [`WorkerLaunch`], the worker's command line as a typed
//! wire format.
//!
//! A supervisor runs `squall worker ...`, or the topology's own worker binary, with the
//! arguments [`WorkerLaunch::to_args`] writes; the worker reads them back with clap
//! (`worker::cli::WorkerCommand`, tested to agree with [`WorkerLaunch::parse`]). `squall
//! local`'s in-process launcher takes the value itself. No other code spells a worker flag.
//!
//! Compatibility: the flags are those `squall worker` has always accepted, because a user's
//! worker binary built against an older `worker` crate gets the same command line. The
//! ZooKeeper timeouts and the log rotation (`--log-max-bytes`, `--log-max-files`) came later,
//! so they are written only when they differ from their defaults: an older binary keeps working on a cluster that keeps the defaults, and on one
//! that does not it refuses the flag by name instead of running with the wrong timeout. The
//! `/metrics` TLS files (`worker.metrics.tls.*`) came later still and are written only when set,
//! with the same consequence. So is `--workerbeat-writer supervisor`, which every supervisor
//! writes now: a worker binary older than the flag refuses it by name (rebuild it against the
//! current `worker` crate).
//!
//! ```
//! use cluster_state::launch::WorkerLaunch;
//!
//! let launch = WorkerLaunch::new(
//!     "wc-1-1700000000".parse()?,
//!     "sup-1".parse()?,
//!     6700,
//!     "w-1".parse()?,
//!     "/var/storm/stormdist/wc-1-1700000000/topology.yaml".into(),
//! );
//! assert_eq!(WorkerLaunch::parse(launch.to_args())?, launch);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ffi::OsString;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::coord::SessionOptions;
pub use crate::ids::WorkerId;
use crate::ids::{SupervisorId, TopologyId};
use crate::paths::StormPaths;
use crate::worker_logs;

/// The verb before the flags: `squall` dispatches on it, and users' worker binaries are
/// started the same way.
pub const VERB: &str = "worker";
/// Where a worker connects when the launch names no ZooKeeper (Storm's
/// `storm.zookeeper.servers` default, `localhost`, on port 2181).
pub const DEFAULT_ZOOKEEPER: &str = "127.0.0.1:2181";
/// The default `--local-dir` (Storm's `storm.local.dir` is `storm-local` too).
pub const DEFAULT_LOCAL_DIR: &str = "storm-local";
/// The default `--bind-host`: every interface.
pub const DEFAULT_BIND_HOST: &str = "0.0.0.0";
/// Storm's `storm.zookeeper.session.timeout` default (defaults.yaml), in milliseconds.
pub const DEFAULT_SESSION_TIMEOUT_MS: u64 = 20_000;
/// Storm's `storm.zookeeper.connection.timeout` default (defaults.yaml), in milliseconds.
pub const DEFAULT_CONNECTION_TIMEOUT_MS: u64 = 15_000;

/// Everything a worker needs to start, as its supervisor gives it. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerLaunch {
    /// `--topology-id`: the topology the worker runs.
    pub topology_id: TopologyId,
    /// `--supervisor-id`: the supervisor that launched it (the node of its slot).
    pub supervisor_id: SupervisorId,
    /// `--port`: the slot's port, which the worker listens on.
    pub port: u16,
    /// `--worker-id`: its local heartbeat directory name.
    pub worker_id: WorkerId,
    /// `--zookeeper`: the connect string, `host:port[,host:port][/chroot]`; `None` means
    /// [`DEFAULT_ZOOKEEPER`]. An in-process launcher runs its workers over its own ensemble.
    pub zookeeper: Option<String>,
    /// `--storm-root`: `storm.zookeeper.root`.
    pub storm_paths: StormPaths,
    /// `--topology-file`: the topology definition (Flux YAML) under the supervisor's stormdist.
    pub topology_file: PathBuf,
    /// `--local-dir`: the supervisor's `storm.local.dir`; the local heartbeat goes under it.
    pub local_dir: PathBuf,
    /// `--hostname`: this host as peers and error reports name it (`None`: the worker's
    /// `$HOSTNAME`, else `localhost`).
    pub hostname: Option<String>,
    /// `--bind-host`: the address the worker's port and `/metrics` are bound on.
    pub bind_host: String,
    /// `--zookeeper-session-timeout-ms`: the cluster's `storm.zookeeper.session.timeout`.
    pub zookeeper_session_timeout_ms: u64,
    /// `--zookeeper-connection-timeout-ms`: the cluster's `storm.zookeeper.connection.timeout`.
    pub zookeeper_connection_timeout_ms: u64,
    /// `--log-max-bytes`: `worker.log.max.bytes`, the size at which `worker.log` rotates.
    pub log_max_bytes: u64,
    /// `--log-max-files`: `worker.log.max.files`, how many log files are kept (the live one
    /// included).
    pub log_max_files: u32,
    /// `--metrics-tls-cert`, `--metrics-tls-key`, `--metrics-tls-client-ca`: the cluster's
    /// `worker.metrics.tls.cert` / `.key` / `.client.ca`, which make the worker's `/metrics`
    /// HTTPS only (`None`: plain HTTP).
    pub metrics_tls_cert: Option<PathBuf>,
    pub metrics_tls_key: Option<PathBuf>,
    pub metrics_tls_client_ca: Option<PathBuf>,
    /// `--workerbeat-writer`: who writes the worker's `/storm/workerbeats` node (written only
    /// when it is the supervisor).
    pub workerbeat_writer: WorkerbeatWriter,
}

/// Who writes a worker's `/storm/workerbeats/<topology>/<node>-<port>` node: the worker itself
/// (`worker`, the default: a worker started alone, as before this flag existed), or its
/// supervisor (`supervisor`: one `multi` of all its workers' nodes, so ZooKeeper's writes grow
/// with supervisors, not workers; the worker then writes none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum WorkerbeatWriter {
    #[default]
    Worker,
    Supervisor,
}

impl WorkerbeatWriter {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerbeatWriter::Worker => "worker",
            WorkerbeatWriter::Supervisor => "supervisor",
        }
    }
}

impl std::fmt::Display for WorkerbeatWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for WorkerbeatWriter {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "worker" => Ok(WorkerbeatWriter::Worker),
            "supervisor" => Ok(WorkerbeatWriter::Supervisor),
            _ => Err("must be worker or supervisor".to_owned()),
        }
    }
}

/// A worker command line that does not parse; each variant names the flag at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchArgsError {
    /// The first argument is not [`VERB`].
    #[error("a worker command line starts with {VERB:?}, not {found:?}")]
    NoVerb { found: Option<String> },
    /// An argument that is no worker flag.
    #[error("unknown worker argument {arg:?}")]
    UnknownFlag { arg: String },
    /// A required flag is absent.
    #[error("{flag} is required")]
    Missing { flag: &'static str },
    /// A flag at the end, without its value.
    #[error("{flag} needs a value")]
    NoValue { flag: &'static str },
    /// A flag given twice.
    #[error("{flag} is given more than once")]
    Repeated { flag: &'static str },
    /// A value that is not what the flag takes.
    #[error("{flag} {value:?}: {reason}")]
    BadValue { flag: &'static str, value: String, reason: String },
}

/// The flags, in the order [`WorkerLaunch::to_args`] writes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flag {
    TopologyId,
    SupervisorId,
    Port,
    WorkerId,
    Zookeeper,
    StormRoot,
    TopologyFile,
    LocalDir,
    Hostname,
    BindHost,
    SessionTimeout,
    ConnectionTimeout,
    LogMaxBytes,
    LogMaxFiles,
    MetricsTlsCert,
    MetricsTlsKey,
    MetricsTlsClientCa,
    WorkerbeatWriter,
}

impl Flag {
    const ALL: [Flag; 18] = [
        Flag::TopologyId,
        Flag::SupervisorId,
        Flag::Port,
        Flag::WorkerId,
        Flag::Zookeeper,
        Flag::StormRoot,
        Flag::TopologyFile,
        Flag::LocalDir,
        Flag::Hostname,
        Flag::BindHost,
        Flag::SessionTimeout,
        Flag::ConnectionTimeout,
        Flag::LogMaxBytes,
        Flag::LogMaxFiles,
        Flag::MetricsTlsCert,
        Flag::MetricsTlsKey,
        Flag::MetricsTlsClientCa,
        Flag::WorkerbeatWriter,
    ];

    fn name(self) -> &'static str {
        match self {
            Flag::TopologyId => "--topology-id",
            Flag::SupervisorId => "--supervisor-id",
            Flag::Port => "--port",
            Flag::WorkerId => "--worker-id",
            Flag::Zookeeper => "--zookeeper",
            Flag::StormRoot => "--storm-root",
            Flag::TopologyFile => "--topology-file",
            Flag::LocalDir => "--local-dir",
            Flag::Hostname => "--hostname",
            Flag::BindHost => "--bind-host",
            Flag::SessionTimeout => "--zookeeper-session-timeout-ms",
            Flag::ConnectionTimeout => "--zookeeper-connection-timeout-ms",
            Flag::LogMaxBytes => "--log-max-bytes",
            Flag::LogMaxFiles => "--log-max-files",
            Flag::MetricsTlsCert => "--metrics-tls-cert",
            Flag::MetricsTlsKey => "--metrics-tls-key",
            Flag::MetricsTlsClientCa => "--metrics-tls-client-ca",
            Flag::WorkerbeatWriter => "--workerbeat-writer",
        }
    }

    fn named(name: &str) -> Option<Flag> {
        Flag::ALL.into_iter().find(|f| f.name() == name)
    }
}

impl WorkerLaunch {
    /// The launch of worker `worker_id` on `supervisor_id`'s `port`, every optional setting at
    /// its default.
    pub fn new(
        topology_id: TopologyId,
        supervisor_id: SupervisorId,
        port: u16,
        worker_id: WorkerId,
        topology_file: PathBuf,
    ) -> Self {
        WorkerLaunch {
            topology_id,
            supervisor_id,
            port,
            worker_id,
            zookeeper: None,
            storm_paths: StormPaths::default(),
            topology_file,
            local_dir: PathBuf::from(DEFAULT_LOCAL_DIR),
            hostname: None,
            bind_host: DEFAULT_BIND_HOST.to_owned(),
            zookeeper_session_timeout_ms: DEFAULT_SESSION_TIMEOUT_MS,
            zookeeper_connection_timeout_ms: DEFAULT_CONNECTION_TIMEOUT_MS,
            log_max_bytes: worker_logs::DEFAULT_MAX_BYTES,
            log_max_files: worker_logs::DEFAULT_MAX_FILES,
            metrics_tls_cert: None,
            metrics_tls_key: None,
            metrics_tls_client_ca: None,
            workerbeat_writer: WorkerbeatWriter::Worker,
        }
    }

    /// The ZooKeeper connect string the worker uses.
    pub fn zookeeper_connect(&self) -> &str {
        self.zookeeper.as_deref().unwrap_or(DEFAULT_ZOOKEEPER)
    }

    /// How the worker's `worker.log` rotates.
    pub fn log_rotation(&self) -> worker_logs::LogRotation {
        worker_logs::LogRotation { max_bytes: self.log_max_bytes, max_files: self.log_max_files }
    }

    /// How the worker opens its ZooKeeper session: the cluster's timeouts.
    pub fn session_options(&self) -> SessionOptions {
        SessionOptions {
            session_timeout: Duration::from_millis(self.zookeeper_session_timeout_ms),
            connect_timeout: Duration::from_millis(self.zookeeper_connection_timeout_ms),
            detached: false,
        }
    }

    /// The worker's arguments after the program: [`VERB`], then one `--flag value` pair per
    /// setting (see the module docs for which are left out).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args = vec![OsString::from(VERB)];
        for flag in Flag::ALL {
            if let Some(value) = self.value(flag) {
                args.push(flag.name().into());
                args.push(value);
            }
        }
        args
    }

    /// The value written for `flag`, if it is written.
    fn value(&self, flag: Flag) -> Option<OsString> {
        let timeout = |ms: u64, default: u64| (ms != default).then(|| ms.to_string().into());
        match flag {
            Flag::TopologyId => Some(self.topology_id.as_str().into()),
            Flag::SupervisorId => Some(self.supervisor_id.as_str().into()),
            Flag::Port => Some(self.port.to_string().into()),
            Flag::WorkerId => Some(self.worker_id.as_str().into()),
            Flag::Zookeeper => self.zookeeper.as_ref().map(OsString::from),
            Flag::StormRoot => Some(self.storm_paths.root().into()),
            Flag::TopologyFile => Some(self.topology_file.clone().into()),
            Flag::LocalDir => Some(self.local_dir.clone().into()),
            Flag::Hostname => self.hostname.as_ref().map(OsString::from),
            Flag::BindHost => Some(self.bind_host.as_str().into()),
            Flag::SessionTimeout => timeout(self.zookeeper_session_timeout_ms, DEFAULT_SESSION_TIMEOUT_MS),
            Flag::ConnectionTimeout => {
                timeout(self.zookeeper_connection_timeout_ms, DEFAULT_CONNECTION_TIMEOUT_MS)
            }
            Flag::LogMaxBytes => timeout(self.log_max_bytes, worker_logs::DEFAULT_MAX_BYTES),
            Flag::LogMaxFiles => (self.log_max_files != worker_logs::DEFAULT_MAX_FILES)
                .then(|| self.log_max_files.to_string().into()),
            Flag::MetricsTlsCert => self.metrics_tls_cert.clone().map(OsString::from),
            Flag::MetricsTlsKey => self.metrics_tls_key.clone().map(OsString::from),
            Flag::MetricsTlsClientCa => self.metrics_tls_client_ca.clone().map(OsString::from),
            Flag::WorkerbeatWriter => (self.workerbeat_writer != WorkerbeatWriter::Worker)
                .then(|| self.workerbeat_writer.as_str().into()),
        }
    }

    /// Reads a worker command line (what [`WorkerLaunch::to_args`] writes; `--flag=value` is
    /// read too, as clap does). Errors name the flag at fault.
    pub fn parse<I, S>(args: I) -> Result<Self, LaunchArgsError>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let mut args = args.into_iter().map(Into::into);
        match args.next() {
            Some(verb) if verb == VERB => {}
            other => {
                return Err(LaunchArgsError::NoVerb {
                    found: other.map(|v| v.to_string_lossy().into_owned()),
                });
            }
        }
        let mut values: [Option<OsString>; Flag::ALL.len()] = Default::default();
        while let Some(arg) = args.next() {
            let unknown = || LaunchArgsError::UnknownFlag { arg: arg.to_string_lossy().into_owned() };
            // A flag is ASCII; `--flag=value` needs its value in UTF-8 to be split off.
            let text = arg.to_str();
            let (name, inline) = match text.and_then(|t| t.split_once('=')) {
                Some((name, value)) => (name, Some(OsString::from(value))),
                None => (text.ok_or_else(unknown)?, None),
            };
            let flag = Flag::named(name).ok_or_else(unknown)?;
            let value = match inline {
                Some(value) => value,
                None => args.next().ok_or(LaunchArgsError::NoValue { flag: flag.name() })?,
            };
            let slot = &mut values[flag as usize];
            if slot.replace(value).is_some() {
                return Err(LaunchArgsError::Repeated { flag: flag.name() });
            }
        }
        Self::from_values(values)
    }

    fn from_values(mut values: [Option<OsString>; Flag::ALL.len()]) -> Result<Self, LaunchArgsError> {
        let mut take = |flag: Flag| values[flag as usize].take();
        let required =
            |flag: Flag, value: Option<OsString>| value.ok_or(LaunchArgsError::Missing { flag: flag.name() });
        let mut launch = WorkerLaunch::new(
            typed(Flag::TopologyId, required(Flag::TopologyId, take(Flag::TopologyId))?)?,
            typed(Flag::SupervisorId, required(Flag::SupervisorId, take(Flag::SupervisorId))?)?,
            typed(Flag::Port, required(Flag::Port, take(Flag::Port))?)?,
            typed(Flag::WorkerId, required(Flag::WorkerId, take(Flag::WorkerId))?)?,
            required(Flag::TopologyFile, take(Flag::TopologyFile))?.into(),
        );
        if let Some(v) = take(Flag::Zookeeper) {
            launch.zookeeper = Some(text(Flag::Zookeeper, v)?);
        }
        if let Some(v) = take(Flag::StormRoot) {
            launch.storm_paths = typed(Flag::StormRoot, v)?;
        }
        if let Some(v) = take(Flag::LocalDir) {
            launch.local_dir = v.into();
        }
        if let Some(v) = take(Flag::Hostname) {
            launch.hostname = Some(text(Flag::Hostname, v)?);
        }
        if let Some(v) = take(Flag::BindHost) {
            launch.bind_host = text(Flag::BindHost, v)?;
        }
        if let Some(v) = take(Flag::SessionTimeout) {
            launch.zookeeper_session_timeout_ms = millis(Flag::SessionTimeout, v)?;
        }
        if let Some(v) = take(Flag::ConnectionTimeout) {
            launch.zookeeper_connection_timeout_ms = millis(Flag::ConnectionTimeout, v)?;
        }
        if let Some(v) = take(Flag::LogMaxBytes) {
            launch.log_max_bytes = millis(Flag::LogMaxBytes, v)?;
        }
        if let Some(v) = take(Flag::LogMaxFiles) {
            launch.log_max_files = typed(Flag::LogMaxFiles, v)?;
            if launch.log_max_files == 0 {
                return Err(LaunchArgsError::BadValue {
                    flag: Flag::LogMaxFiles.name(),
                    value: "0".into(),
                    reason: "at least 1 file is kept".into(),
                });
            }
        }
        launch.metrics_tls_cert = take(Flag::MetricsTlsCert).map(PathBuf::from);
        launch.metrics_tls_key = take(Flag::MetricsTlsKey).map(PathBuf::from);
        launch.metrics_tls_client_ca = take(Flag::MetricsTlsClientCa).map(PathBuf::from);
        if let Some(v) = take(Flag::WorkerbeatWriter) {
            launch.workerbeat_writer = typed(Flag::WorkerbeatWriter, v)?;
        }
        Ok(launch)
    }
}

/// `value` as UTF-8 text.
fn text(flag: Flag, value: OsString) -> Result<String, LaunchArgsError> {
    value.into_string().map_err(|v| LaunchArgsError::BadValue {
        flag: flag.name(),
        value: v.to_string_lossy().into_owned(),
        reason: "is not UTF-8".into(),
    })
}

/// `value` parsed as a `T`.
fn typed<T: FromStr>(flag: Flag, value: OsString) -> Result<T, LaunchArgsError>
where
    T::Err: std::fmt::Display,
{
    let value = text(flag, value)?;
    value.parse().map_err(|e: T::Err| LaunchArgsError::BadValue {
        flag: flag.name(),
        reason: e.to_string(),
        value,
    })
}

/// A timeout in milliseconds: at least 1.
fn millis(flag: Flag, value: OsString) -> Result<u64, LaunchArgsError> {
    let ms: u64 = typed(flag, value)?;
    if ms == 0 {
        let reason = "must be at least 1".into();
        return Err(LaunchArgsError::BadValue { flag: flag.name(), value: "0".into(), reason });
    }
    Ok(ms)
}

/// The flag names, for tests elsewhere that check a parser of their own against them.
pub fn flag_names() -> impl Iterator<Item = &'static str> {
    Flag::ALL.into_iter().map(Flag::name)
}
