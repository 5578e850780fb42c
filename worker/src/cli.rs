//! The worker's command line, shared by `squall worker` and users' own worker binaries:
//! Storm's worker arguments plus where to find ZooKeeper and the topology definition.
//!
//! A user binary with its own components:
//!
//! ```no_run
//! use clap::Parser;
//! use worker::cli::WorkerCommand;
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     worker: WorkerCommand,
//! }
//!
//! let mut registry = worker::Registry::with_builtins();
//! registry.register_bolt("my-bolt", |_params| Ok(std::sync::Arc::new(|| {
//!     Box::new(worker::builtin::LogSink) as Box<dyn worker::Bolt>
//! })));
//! let metrics = prometheus::Registry::new();
//! if let Err(e) = worker::cli::execute(Cli::parse().worker, &registry, &metrics) {
//!     eprintln!("worker: {e}");
//!     std::process::exit(1);
//! }
//! ```

use std::path::PathBuf;

use cluster_state::coord::Ensemble;
use cluster_state::ids::{SupervisorId, TopologyId};
use cluster_state::paths::StormPaths;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::flux::Registry;
use crate::process::{WorkerArgs, WorkerConfig, run};

/// `worker` arguments (Storm's `topology-id supervisor-id port worker-id`, as options).
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
    pub worker_id: String,
    /// ZooKeeper connect string, `host:port[,host:port][/chroot]`.
    #[arg(long, default_value = "127.0.0.1:2181")]
    pub zookeeper: String,
    /// `storm.zookeeper.root`.
    #[arg(long, default_value = StormPaths::DEFAULT_ROOT)]
    pub storm_root: String,
    /// The topology definition (Flux YAML), as stored under the supervisor's stormdist.
    #[arg(long)]
    pub topology_file: PathBuf,
    /// The supervisor's local dir (`storm.local.dir`); the local heartbeat goes under it.
    #[arg(long, default_value = "storm-local")]
    pub local_dir: PathBuf,
    /// This host's name as reported with errors (default: $HOSTNAME, else "localhost").
    #[arg(long)]
    pub hostname: Option<String>,
    /// Address to bind the worker port on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind_host: String,
}

/// Validates the arguments, loads the topology, and runs the worker until SIGTERM or Ctrl-C
/// (then shuts down gracefully). `metrics` is the process's registry, served at `/metrics`
/// (components registered with it, like the Kafka spout, appear there too).
pub fn execute(cmd: WorkerCommand, registry: &Registry, metrics: &prometheus::Registry) -> Result<()> {
    // Validate everything before binding or connecting anything.
    let paths = StormPaths::new(&cmd.storm_root)
        .map_err(|e| Error::BadConfig { key: "storm.zookeeper.root", reason: e.to_string() })?;
    let topology = registry.load_file(&cmd.topology_file)?;
    let args = WorkerArgs {
        topology_id: cmd.topology_id,
        supervisor_id: cmd.supervisor_id,
        port: cmd.port,
        worker_id: cmd.worker_id,
        local_dir: cmd.local_dir,
        hostname: cmd
            .hostname
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "localhost".to_owned()),
    };
    let config = WorkerConfig { bind_host: cmd.bind_host, ..WorkerConfig::default() };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::io("start the async runtime", e))?;
    rt.block_on(async move {
        let shutdown = CancellationToken::new();
        let s = shutdown.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutdown requested");
            s.cancel();
        });
        run(args, config, topology, Ensemble::zookeeper(cmd.zookeeper), paths, metrics, shutdown).await
    })
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
