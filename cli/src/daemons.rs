//! `squall nimbus` and `squall supervisor`: the long-running daemons, configured by the cluster
//! config file ([`crate::config`]: Storm's key names, missing keys take Storm's defaults, unknown
//! keys are errors naming them), stopped gracefully by SIGTERM or Ctrl-C.

use std::path::PathBuf;
use std::sync::Arc;

use cluster_state::signal::run_until_signal;
use tokio_util::sync::CancellationToken;

use crate::config::ClusterConfig;

/// Where the daemon finds its settings and ZooKeeper.
#[derive(Debug, clap::Args)]
pub struct DaemonArgs {
    /// Cluster config file (YAML, Storm's key names, e.g. `supervisor.slots.ports: [6700, 6701]`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// ZooKeeper connect string, `host:port[,host:port...][/chroot]`; overrides the config's
    /// `storm.zookeeper.servers` / `storm.zookeeper.port` (default 127.0.0.1:2181).
    #[arg(long)]
    pub zookeeper: Option<String>,
    /// Overrides a key of the config file, `KEY=VALUE` (Storm's `-c`; repeatable).
    #[arg(short = 'c', value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

impl DaemonArgs {
    /// The config file and the ZooKeeper connect string.
    fn load(&self) -> Result<(ClusterConfig, String), String> {
        let mut config = ClusterConfig::load(self.config.as_deref())?;
        for assignment in &self.set {
            config.set(assignment)?;
        }
        let zookeeper = match &self.zookeeper {
            Some(z) => z.clone(),
            None => config.zookeeper()?.unwrap_or_else(|| "127.0.0.1:2181".to_owned()),
        };
        Ok((config, zookeeper))
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| format!("cannot start: {e}"))
}

/// `squall supervisor`.
pub fn supervisor(args: DaemonArgs) -> Result<(), String> {
    let (file, zookeeper) = args.load()?;
    let config = file.supervisor()?;
    config.validate().map_err(|e| e.to_string())?;
    let squall = std::env::current_exe().map_err(|e| format!("cannot find the squall executable: {e}"))?;
    let program = supervisor::daemon::WorkerProgram { squall, zookeeper: Some(zookeeper.clone()) };
    runtime()?.block_on(async {
        let shutdown = CancellationToken::new();
        let launcher = Arc::new(supervisor::launch::ProcessLauncher::new());
        let registry = prometheus::Registry::new();
        let ensemble = file.ensemble(zookeeper, &config.zookeeper_root)?;
        let supervisor =
            supervisor::daemon::run(config, ensemble, launcher, program, &registry, shutdown.clone());
        run_until_signal(shutdown, supervisor).await.map_err(|e| e.to_string())
    })
}

/// `squall nimbus`.
pub fn nimbus(args: DaemonArgs) -> Result<(), String> {
    let (file, zookeeper) = args.load()?;
    let config = file.nimbus()?;
    runtime()?.block_on(async {
        let shutdown = CancellationToken::new();
        let ensemble = file.ensemble(zookeeper, &config.zookeeper_root)?;
        let nimbus = nimbus::run_rejoining(config, ensemble, prometheus::Registry::new, shutdown.clone());
        run_until_signal(shutdown, nimbus).await.map_err(|e| e.to_string())
    })
}
