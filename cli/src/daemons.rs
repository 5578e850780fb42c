//! `squall nimbus` and `squall supervisor`: the long-running daemons, configured by a YAML file
//! with Storm's key names (missing keys take Storm's defaults; unknown keys are errors naming
//! them), stopped gracefully by SIGTERM or Ctrl-C.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cluster_state::coord::Ensemble;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

/// Where the daemon finds its settings and ZooKeeper.
#[derive(Debug, clap::Args)]
pub struct DaemonArgs {
    /// Config file (YAML, Storm's key names, e.g. `supervisor.slots.ports: [6700, 6701]`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// ZooKeeper connect string, `host:port[,host:port...][/chroot]`.
    #[arg(long, default_value = "127.0.0.1:2181")]
    pub zookeeper: String,
}

/// Reads a config file; a missing `--config` means all defaults.
fn load<T: DeserializeOwned + Default>(path: Option<&Path>) -> Result<T, String> {
    let Some(path) = path else { return Ok(T::default()) };
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
    if text.trim().is_empty() {
        return Ok(T::default());
    }
    serde_yaml_ng::from_str(&text).map_err(|e| format!("config {}: {e}", path.display()))
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| format!("cannot start: {e}"))
}

/// Cancels `token` on SIGTERM or Ctrl-C.
fn stop_on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        let terminate = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = terminate => {}
        }
        token.cancel();
    });
}

/// `squall supervisor`.
pub fn supervisor(args: DaemonArgs) -> Result<(), String> {
    let config: supervisor::daemon::SupervisorConfig = load(args.config.as_deref())?;
    config.validate().map_err(|e| e.to_string())?;
    let squall = std::env::current_exe().map_err(|e| format!("cannot find the squall executable: {e}"))?;
    let launch = supervisor::daemon::WorkerLaunch { squall, zookeeper: args.zookeeper.clone() };
    runtime()?.block_on(async {
        let shutdown = CancellationToken::new();
        stop_on_signal(shutdown.clone());
        let launcher = Arc::new(supervisor::launch::ProcessLauncher::new());
        supervisor::daemon::run(config, Ensemble::zookeeper(args.zookeeper), launcher, launch, shutdown)
            .await
            .map_err(|e| e.to_string())
    })
}

/// `squall nimbus`.
pub fn nimbus(args: DaemonArgs) -> Result<(), String> {
    let config: nimbus::NimbusConfig = load(args.config.as_deref())?;
    runtime()?.block_on(async {
        let shutdown = CancellationToken::new();
        stop_on_signal(shutdown.clone());
        let registry = prometheus::Registry::new();
        nimbus::run(config, Ensemble::zookeeper(args.zookeeper), &registry, shutdown)
            .await
            .map_err(|e| e.to_string())
    })
}
