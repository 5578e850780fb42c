//! Runtime log levels (Storm's `set_log_level`): the worker follows its topology's
//! `/storm/logconfigs/<topology-id>` (a watch; read again after every change and when a level's
//! timeout ends) and hands the filter directives in force to the process's log subscriber,
//! which rebuilds its filter without a restart.
//!
//! The subscriber belongs to the binary (`squall worker` sets it up in `main`), so the binary
//! installs a [`Reloader`] once ([`install`]); a worker binary that installs none simply keeps
//! its levels (the worker logs so once).

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cluster_state::clock::now_millis;
use cluster_state::coord::{Error as CoordError, Session, Watch};
use cluster_state::ids::TopologyId;
use cluster_state::paths::StormPaths;
use cluster_state::znode::LogConfig;

/// Rebuilds the process's log filter: the subscriber's base filter plus these directives
/// (`debug` for the default level, `target=debug` for one logger), empty for the base alone.
pub type Reloader = Arc<dyn Fn(&[String]) -> Result<(), String> + Send + Sync>;

static RELOADER: OnceLock<Reloader> = OnceLock::new();

/// Installs the process's [`Reloader`]; `false` if one was installed already.
pub fn install(reloader: Reloader) -> bool {
    RELOADER.set(reloader).is_ok()
}

/// How long to wait before reading again after ZooKeeper failed.
const RETRY: Duration = Duration::from_secs(5);

/// Follows the topology's log config for as long as the caller polls it (the worker's session).
pub async fn follow(session: &Session, paths: &StormPaths, id: &TopologyId) -> Infallible {
    let Some(reload) = RELOADER.get() else {
        tracing::info!("no log reloader installed: runtime log levels (set-log-level) are not applied");
        return std::future::pending().await;
    };
    let path = paths.log_config(id);
    let mut applied: Vec<String> = Vec::new();
    loop {
        let (config, watch): (Option<LogConfig>, Option<Watch>) =
            match session.read_watch::<LogConfig>(&path).await {
                Ok((config, _, watch)) => (Some(config), Some(watch)),
                Err(CoordError::NoNode { .. }) => match session.exists_watch(&path).await {
                    Ok((None, watch)) => (Some(LogConfig::default()), Some(watch)),
                    Ok((Some(_), _)) => continue,
                    Err(e) => {
                        tracing::warn!(%path, "cannot watch the log config: {e}");
                        (None, None)
                    }
                },
                Err(e) => {
                    tracing::warn!(%path, "cannot read the log config (the levels stay as they are): {e}");
                    (None, None)
                }
            };
        let mut wait = RETRY;
        if let Some(config) = config {
            let now = now_millis();
            let (directives, next_reset) = config.directives(now);
            if directives != applied {
                match reload(&directives) {
                    Ok(()) => tracing::info!(topology = %id, levels = ?directives, "log levels changed"),
                    Err(e) => {
                        tracing::warn!(topology = %id, levels = ?directives, "cannot change log levels: {e}")
                    }
                }
                applied = directives;
            }
            // Until the next level ends (a little after, so it has), or a long while.
            wait = next_reset
                .map_or(Duration::from_secs(3600), |r| Duration::from_millis(r.saturating_sub(now) + 20));
        }
        match watch {
            Some(watch) => {
                tokio::select! {
                    _ = watch => {}
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            None => tokio::time::sleep(wait).await,
        }
    }
}
