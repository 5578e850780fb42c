//! Rotation of every worker's `worker.log.out` (its stdout and stderr), which the worker's
//! process writes to directly through the file the supervisor opened for it, so neither can
//! rename it: every `interval` the supervisor copies and truncates the ones past
//! `worker.log.max.bytes`, keeping `worker.log.max.files` files
//! (`cluster_state::worker_logs::copy_truncate`). A file can pass the limit by what its worker
//! prints in one interval. A worker's own log, `worker.log`, the worker rotates itself.
//!
//! The files are found on disk (`workers-artifacts/*/*/worker.log.out`), not in the process
//! task's table: workers adopted after a restart, and a topology killed a moment ago, are
//! covered the same way.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cluster_state::worker_logs::{self, LogRotation};
use tokio_util::sync::CancellationToken;

/// The rotation task.
#[derive(Debug, Clone)]
pub struct OutRotation {
    pub local_dir: PathBuf,
    pub rotation: LogRotation,
    pub interval: Duration,
}

impl OutRotation {
    /// Rotates every `interval` until `cancel`.
    pub async fn run(self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
            let (local_dir, rotation) = (self.local_dir.clone(), self.rotation);
            if let Err(e) = tokio::task::spawn_blocking(move || rotate_all(&local_dir, rotation)).await {
                tracing::warn!("worker.log.out rotation failed: {e}");
            }
        }
    }
}

/// One pass: rotates each worker's `worker.log.out` past the limit; how many rotated.
pub fn rotate_all(local_dir: &Path, rotation: LogRotation) -> usize {
    let Ok(topologies) = std::fs::read_dir(local_dir.join(worker_logs::ARTIFACTS_DIR)) else { return 0 };
    let mut rotated = 0;
    for topology in topologies.flatten() {
        let Ok(ports) = std::fs::read_dir(topology.path()) else { continue };
        for port in ports.flatten() {
            let path = port.path().join(worker_logs::WORKER_OUT);
            match worker_logs::copy_truncate(&path, rotation) {
                Ok(true) => rotated += 1,
                Ok(false) => {}
                Err(e) => tracing::warn!(path = %path.display(), "cannot rotate a worker's stdout log: {e}"),
            }
        }
    }
    rotated
}
