//! The worker's command line, shared by `squall worker` and users' own worker binaries.
//!
//! Its wire format is `cluster_state::launch::WorkerLaunch` (what supervisors write):
//! [`WorkerCommand`] is the same flags for clap, and converts into a `WorkerLaunch` (a test
//! holds the two parsers to the same answers). A supervisor starts a worker binary with the
//! verb `worker` and the flags, so a user binary with its own components takes that subcommand:
//!
//! ```no_run
//! use clap::{Parser, Subcommand};
//! use worker::cli::WorkerCommand;
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(subcommand)]
//!     command: Command,
//! }
//!
//! #[derive(Subcommand)]
//! enum Command {
//!     /// Run one worker (what the supervisor launches).
//!     Worker(WorkerCommand),
//! }
//!
//! let mut registry = worker::Registry::with_builtins();
//! registry.register_bolt("my-bolt", |_params| Ok(std::sync::Arc::new(|| {
//!     Box::new(worker::builtin::LogSink) as Box<dyn worker::Bolt>
//! })));
//! let metrics = prometheus::Registry::new();
//! let Command::Worker(cmd) = Cli::parse().command;
//! if let Err(e) = worker::cli::execute(cmd, &registry, &metrics) {
//!     eprintln!("worker: {e}");
//!     std::process::exit(1);
//! }
//! ```

use std::path::PathBuf;

use cluster_state::code::CodeFile;
use cluster_state::coord::{AUTH_ENV, Ensemble, Security, ZkAuth};
use cluster_state::ids::{SupervisorId, TopologyId};
use cluster_state::launch::{self, WorkerId, WorkerLaunch};
use cluster_state::paths::StormPaths;
use cluster_state::tls;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::flux::Registry;
use crate::process::{WorkerArgs, WorkerConfig, run};
use crate::topology::Topology;
use crate::transport::TopologySecret;

/// `worker` arguments (Storm's `topology-id supervisor-id port worker-id`, as options); the
/// flags of `cluster_state::launch::WorkerLaunch`, documented there.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerCommand {
    /// The topology this worker runs.
    #[arg(long)]
    pub topology_id: TopologyId,
    /// The supervisor that launched it.
    #[arg(long)]
    pub supervisor_id: SupervisorId,
    /// The slot's port, which the worker listens on.
    #[arg(long)]
    pub port: u16,
    /// The worker's id (its local heartbeat directory name).
    #[arg(long)]
    pub worker_id: WorkerId,
    /// ZooKeeper connect string, `host:port[,host:port][/chroot]` (default: 127.0.0.1:2181).
    #[arg(long)]
    pub zookeeper: Option<String>,
    /// `storm.zookeeper.root`.
    #[arg(long, default_value = StormPaths::DEFAULT_ROOT)]
    pub storm_root: StormPaths,
    /// The topology definition (Flux YAML), as stored under the supervisor's stormdist.
    #[arg(long)]
    pub topology_file: PathBuf,
    /// The supervisor's local dir (`storm.local.dir`); the local heartbeat goes under it.
    #[arg(long, default_value = launch::DEFAULT_LOCAL_DIR)]
    pub local_dir: PathBuf,
    /// This host's name as reported with errors (default: $HOSTNAME, else "localhost").
    #[arg(long)]
    pub hostname: Option<String>,
    /// Address to bind the worker port on.
    #[arg(long, default_value = launch::DEFAULT_BIND_HOST)]
    pub bind_host: String,
    /// The cluster's `storm.zookeeper.session.timeout`, in milliseconds.
    #[arg(long, default_value_t = launch::DEFAULT_SESSION_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub zookeeper_session_timeout_ms: u64,
    /// The cluster's `storm.zookeeper.connection.timeout`, in milliseconds.
    #[arg(long, default_value_t = launch::DEFAULT_CONNECTION_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub zookeeper_connection_timeout_ms: u64,
    /// `worker.log.max.bytes`: `worker.log` rotates before it would pass this size.
    #[arg(long, default_value_t = cluster_state::worker_logs::DEFAULT_MAX_BYTES, value_parser = clap::value_parser!(u64).range(1..))]
    pub log_max_bytes: u64,
    /// `worker.log.max.files`: how many log files are kept, the live one included.
    #[arg(long, default_value_t = cluster_state::worker_logs::DEFAULT_MAX_FILES, value_parser = clap::value_parser!(u32).range(1..))]
    pub log_max_files: u32,
    /// The cluster's `worker.metrics.tls.cert`: `/metrics` is HTTPS only with it (and its key).
    #[arg(long)]
    pub metrics_tls_cert: Option<PathBuf>,
    /// The cluster's `worker.metrics.tls.key`.
    #[arg(long)]
    pub metrics_tls_key: Option<PathBuf>,
    /// The cluster's `worker.metrics.tls.client.ca`: scrapers must present a certificate from it.
    #[arg(long)]
    pub metrics_tls_client_ca: Option<PathBuf>,
    /// Who writes this worker's `/storm/workerbeats` node: `worker` (itself, the default) or
    /// `supervisor` (its supervisor, with its other workers' nodes in one transaction).
    #[arg(long, default_value_t = launch::WorkerbeatWriter::Worker)]
    pub workerbeat_writer: launch::WorkerbeatWriter,
}

impl From<WorkerCommand> for WorkerLaunch {
    fn from(cmd: WorkerCommand) -> Self {
        WorkerLaunch {
            topology_id: cmd.topology_id,
            supervisor_id: cmd.supervisor_id,
            port: cmd.port,
            worker_id: cmd.worker_id,
            zookeeper: cmd.zookeeper,
            storm_paths: cmd.storm_root,
            topology_file: cmd.topology_file,
            local_dir: cmd.local_dir,
            hostname: cmd.hostname,
            bind_host: cmd.bind_host,
            zookeeper_session_timeout_ms: cmd.zookeeper_session_timeout_ms,
            zookeeper_connection_timeout_ms: cmd.zookeeper_connection_timeout_ms,
            log_max_bytes: cmd.log_max_bytes,
            log_max_files: cmd.log_max_files,
            metrics_tls_cert: cmd.metrics_tls_cert,
            metrics_tls_key: cmd.metrics_tls_key,
            metrics_tls_client_ca: cmd.metrics_tls_client_ca,
            workerbeat_writer: cmd.workerbeat_writer,
        }
    }
}

/// A worker ready to [`run`]: its launch resolved and its topology loaded, nothing bound or
/// connected yet. `config` holds the defaults and the launch's bind host; embedders may
/// change it.
#[derive(Debug)]
pub struct PreparedWorker {
    pub args: WorkerArgs,
    pub config: WorkerConfig,
    pub topology: Topology,
    pub paths: StormPaths,
}

/// Loads the launch's topology file with `registry` and resolves the rest of the launch: the
/// session options it gives, the host name (`$HOSTNAME`, else `localhost`, when not given),
/// the topology's secret (the code file beside the topology file; a topology without one, as
/// submitted before workers authenticated each other, is refused: it must be resubmitted).
pub fn prepare(launch: WorkerLaunch, registry: &Registry) -> Result<PreparedWorker> {
    let topology = registry.load_file(&launch.topology_file)?;
    let secret = TopologySecret::read(&launch.topology_file.with_file_name(CodeFile::Secret.file_name()))?;
    let session = launch.session_options();
    let args = WorkerArgs {
        topology_id: launch.topology_id,
        supervisor_id: launch.supervisor_id,
        port: launch.port,
        worker_id: launch.worker_id.to_string(),
        local_dir: launch.local_dir,
        hostname: launch
            .hostname
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "localhost".to_owned()),
        session,
        secret,
    };
    let metrics_tls = cluster_state::tls::server(
        [tls::WORKER_METRICS_CERT, tls::WORKER_METRICS_KEY, tls::WORKER_METRICS_CLIENT_CA],
        launch.metrics_tls_cert.as_deref(),
        launch.metrics_tls_key.as_deref(),
        launch.metrics_tls_client_ca.as_deref(),
    )
    .map_err(|e| Error::Tls { reason: e.to_string() })?;
    let config = WorkerConfig {
        bind_host: launch.bind_host,
        metrics_tls,
        writes_workerbeat: launch.workerbeat_writer == launch::WorkerbeatWriter::Worker,
        ..WorkerConfig::default()
    };
    Ok(PreparedWorker { args, config, topology, paths: launch.storm_paths })
}

/// Validates the arguments, loads the topology, and runs the worker until SIGTERM or Ctrl-C
/// (then shuts down gracefully). `metrics` is the process's registry, served at `/metrics`
/// (components registered with it, like the Kafka spout, appear there too).
pub fn execute(cmd: WorkerCommand, registry: &Registry, metrics: &prometheus::Registry) -> Result<()> {
    // Everything is validated (by the parse and the topology load) before binding or connecting.
    let launch = WorkerLaunch::from(cmd);
    // The supervisor passes the cluster's ZooKeeper credentials in the environment.
    let auth = ZkAuth::from_env().map_err(|reason| Error::BadConfig { key: AUTH_ENV, reason })?;
    let security = Security::new(auth, launch.storm_paths.root());
    let ensemble = Ensemble::zookeeper(launch.zookeeper_connect()).with_security(security);
    let worker = prepare(launch, registry)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::io("start the async runtime", e))?;
    rt.block_on(async move {
        let shutdown = CancellationToken::new();
        let PreparedWorker { args, config, topology, paths } = worker;
        // Its final statistics are for in-process callers (`squall local`); a process's exit says
        // how it went.
        let worker = run(args, config, topology, ensemble, paths, metrics, shutdown.clone());
        let worker = async move { worker.await.map(drop) };
        cluster_state::signal::run_until_signal(shutdown, worker).await
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::collections::BTreeSet;
    use std::ffi::OsString;

    use clap::{CommandFactory, Parser, Subcommand};

    use super::*;

    /// How `squall` and users' binaries take the command line.
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(Debug, Subcommand)]
    enum Command {
        Worker(WorkerCommand),
    }

    fn clap_parse(args: &[OsString]) -> std::result::Result<WorkerLaunch, clap::Error> {
        let argv = std::iter::once(OsString::from("worker-binary")).chain(args.iter().cloned());
        let Command::Worker(cmd) = Cli::try_parse_from(argv)?.command;
        Ok(cmd.into())
    }

    fn launch() -> WorkerLaunch {
        WorkerLaunch::new(
            "wc-1-1700000000".parse().unwrap(),
            "6f1c-9a2b".parse().unwrap(),
            6700,
            "3d4e-77aa".parse().unwrap(),
            "/var/storm/stormdist/wc-1-1700000000/topology.yaml".into(),
        )
    }

    #[test]
    fn clap_and_the_wire_format_have_the_same_flags() {
        let cli = Cli::command();
        let worker = cli.find_subcommand("worker").unwrap();
        let clap_flags: BTreeSet<String> = worker
            .get_arguments()
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .filter(|l| l != "--help")
            .collect();
        let wire_flags: BTreeSet<String> = launch::flag_names().map(str::to_owned).collect();
        assert_eq!(clap_flags, wire_flags);
    }

    #[test]
    fn clap_and_the_wire_format_read_the_same_launch() {
        let mut everything = launch();
        everything.zookeeper = Some("zk1:2181,zk2:2181/squall".into());
        everything.storm_paths = "/squall/storm".parse().unwrap();
        everything.local_dir = "/var/storm".into();
        everything.hostname = Some("host1".into());
        everything.bind_host = "127.0.0.1".into();
        everything.zookeeper_session_timeout_ms = 7000;
        everything.zookeeper_connection_timeout_ms = 3000;
        everything.log_max_bytes = 4096;
        everything.log_max_files = 2;
        everything.workerbeat_writer = launch::WorkerbeatWriter::Supervisor;
        for launch in [launch(), everything] {
            let args = launch.to_args();
            assert_eq!(clap_parse(&args).unwrap(), launch);
            assert_eq!(WorkerLaunch::parse(args).unwrap(), launch);
        }
        // What squall's supervisors wrote before the launch was typed, and `--flag=value`.
        let old: Vec<OsString> =
            "worker --topology-id wc-1-1700000000 --supervisor-id 6f1c-9a2b --port=6700 \
             --worker-id 3d4e-77aa --zookeeper 127.0.0.1:2181 --storm-root /storm \
             --topology-file /var/storm/stormdist/wc-1-1700000000/topology.yaml --local-dir storm-local"
                .split_whitespace()
                .map(OsString::from)
                .collect();
        assert_eq!(clap_parse(&old).unwrap(), WorkerLaunch::parse(old).unwrap());
    }

    #[test]
    fn clap_and_the_wire_format_refuse_the_same_lines() {
        let base = "worker --topology-id wc-1-1700000000 --supervisor-id s --port 6700 --worker-id w \
                    --topology-file /t.yaml";
        for bad in [
            base.replace("--port 6700", "--port 70000"),
            base.replace("--worker-id w", "--worker-id a/b"),
            base.replace("--topology-id wc-1-1700000000 ", ""),
            format!("{base} --storm-root storm"),
            format!("{base} --zookeeper-session-timeout-ms 0"),
            format!("{base} --log-max-files 0"),
            format!("{base} --workerbeat-writer nimbus"),
            format!("{base} --port 6701"),
            format!("{base} --nimbus x"),
        ] {
            let args: Vec<OsString> = bad.split(' ').map(OsString::from).collect();
            assert!(clap_parse(&args).is_err(), "clap accepts {bad}");
            assert!(WorkerLaunch::parse(args).is_err(), "WorkerLaunch::parse accepts {bad}");
        }
    }
}
