//! The supervisor's aggregated heartbeat to nimbus (issue 18; Storm 2's
//! `sendSupervisorWorkerHeartbeats`, STORM-2693).
//!
//! Workers heartbeat to their local file every second (with their executors' stats); every
//! `supervisor.heartbeat.frequency.secs` the [`Reporter`] reads the files of the workers this
//! supervisor runs and sends them all in one [`SupervisorHeartbeat`] to the leader nimbus over
//! its API (`nimbus_client` follows the leader through `nimbus.seeds` and carries the token).
//! Nimbus judges liveness from these reports, so a worker's liveness costs no ZooKeeper write.
//!
//! A failed send is logged (at most once a minute while it keeps failing) and retried at the
//! next tick: a report is a snapshot, there is nothing to queue.

use std::path::PathBuf;
use std::time::Duration;

use cluster_state::api::{ExecutorStatsReport, SupervisorHeartbeat, WorkerReport};
use cluster_state::ids::{SupervisorId, TopologyId};
use cluster_state::znode::{LocalWorkerHeartbeat, ZnodeData};
use nimbus_client::NimbusClient;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

/// A worker the supervisor runs, as its process task recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningWorker {
    pub worker_id: String,
    pub port: u16,
    pub topology_id: TopologyId,
}

/// The heartbeat of `beats` (each worker's latest local heartbeat), pure: what the supervisor
/// sends. A beat is reported under the port it was recorded on.
pub fn build_heartbeat(
    supervisor_id: &SupervisorId,
    time_secs: u64,
    uptime_secs: u64,
    beats: impl IntoIterator<Item = LocalWorkerHeartbeat>,
) -> SupervisorHeartbeat {
    let mut workers: Vec<WorkerReport> = beats
        .into_iter()
        .map(|beat| {
            let start = beat.start_time_secs.unwrap_or(0);
            WorkerReport {
                topology_id: beat.topology_id,
                port: beat.port,
                executors: beat.executors,
                time_secs: beat.time_secs,
                start_time_secs: start,
                uptime_secs: if start == 0 { 0 } else { beat.time_secs.saturating_sub(start) },
                executor_stats: beat.executor_stats.iter().map(ExecutorStatsReport::from).collect(),
                metrics_endpoint: beat.metrics_endpoint,
                metrics_scheme: beat.metrics_scheme,
            }
        })
        .collect();
    workers.sort_by_key(|w| w.port);
    // One report per port (nimbus refuses duplicates): a stale file of a replaced worker loses.
    workers.dedup_by(|later, earlier| {
        if later.port == earlier.port {
            if later.time_secs > earlier.time_secs {
                std::mem::swap(later, earlier);
            }
            true
        } else {
            false
        }
    });
    SupervisorHeartbeat { supervisor_id: supervisor_id.clone(), time_secs, uptime_secs, workers }
}

/// Reads the local heartbeat of each worker in `workers`, keeping those that say what the
/// record says (topology and port); a missing or unreadable file is left out (the worker then
/// stops being reported and times out at nimbus, as it would at its supervisor).
pub fn read_local_beats(local_dir: &std::path::Path, workers: &[RunningWorker]) -> Vec<LocalWorkerHeartbeat> {
    workers
        .iter()
        .filter_map(|w| {
            let path = LocalWorkerHeartbeat::path(local_dir, &w.worker_id);
            let bytes = std::fs::read(&path).ok()?;
            let beat = LocalWorkerHeartbeat::decode(&path.display().to_string(), &bytes).ok()?;
            (beat.topology_id == w.topology_id && beat.port == w.port).then_some(beat)
        })
        .collect()
}

/// Where a [`Reporter`] gets the workers' beats from.
pub trait BeatSource: Send + 'static {
    fn beats(&mut self) -> Vec<LocalWorkerHeartbeat>;
}

/// The real supervisor's source: the local heartbeat files of the workers its process task
/// runs (published after every round).
#[derive(Debug, Clone)]
pub struct LocalFiles {
    pub local_dir: PathBuf,
    pub workers: watch::Receiver<Vec<RunningWorker>>,
}

impl BeatSource for LocalFiles {
    fn beats(&mut self) -> Vec<LocalWorkerHeartbeat> {
        let workers = self.workers.borrow().clone();
        read_local_beats(&self.local_dir, &workers)
    }
}

/// Sends the aggregated heartbeat every `interval` until cancelled; see the module docs.
#[derive(Debug)]
pub struct Reporter<S> {
    pub supervisor_id: SupervisorId,
    pub client: NimbusClient,
    pub interval: Duration,
    pub source: S,
}

/// How often a heartbeat that keeps failing is logged.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

impl<S: BeatSource> Reporter<S> {
    /// A client for heartbeats: each call bounded well within one interval, so a nimbus that
    /// does not answer never delays the next report.
    pub fn client_for(mut client: NimbusClient, interval: Duration) -> NimbusClient {
        client.timeout = interval.clamp(Duration::from_secs(1), Duration::from_secs(5));
        client.failover = interval;
        client
    }

    pub async fn run(mut self, cancel: CancellationToken) {
        let started = Instant::now();
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut last_logged: Option<Instant> = None;
        let mut failures = 0u64;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let beat = build_heartbeat(
                &self.supervisor_id,
                cluster_state::clock::now_secs(),
                started.elapsed().as_secs(),
                self.source.beats(),
            );
            let sent = tokio::select! {
                () = cancel.cancelled() => return,
                sent = self.client.supervisor_heartbeat(&beat) => sent,
            };
            match sent {
                Ok(_) => {
                    if failures > 0 {
                        tracing::info!(failures, "heartbeats reach nimbus again");
                    }
                    failures = 0;
                    last_logged = None;
                }
                Err(e) => {
                    failures += 1;
                    if last_logged.is_none_or(|t| t.elapsed() >= FAILURE_LOG_EVERY) {
                        tracing::warn!(error = %e, failures, "cannot send the heartbeat to nimbus; retrying every tick");
                        last_logged = Some(Instant::now());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cluster_state::ids::{ExecutorId, TaskId};

    fn beat(port: u16, time: u64) -> LocalWorkerHeartbeat {
        LocalWorkerHeartbeat {
            time_secs: time,
            topology_id: "wc-1-1700000000".parse().unwrap(),
            executors: vec![ExecutorId::single(TaskId(u32::from(port)))],
            port,
            start_time_secs: Some(100),
            executor_stats: vec![],
            metrics_endpoint: None,
            metrics_scheme: cluster_state::znode::MetricsScheme::Http,
            workerbeats_zk_secs: None,
        }
    }

    #[test]
    fn one_report_per_port_the_freshest_wins() {
        let sup: SupervisorId = "sup-1".parse().unwrap();
        let hb = build_heartbeat(&sup, 500, 7, [beat(6701, 150), beat(6700, 120), beat(6701, 160)]);
        assert_eq!(
            hb.workers.iter().map(|w| (w.port, w.time_secs)).collect::<Vec<_>>(),
            [(6700, 120), (6701, 160)]
        );
        assert_eq!(hb.workers[0].uptime_secs, 20);
        assert!(hb.validate().is_ok());
        let old = LocalWorkerHeartbeat { start_time_secs: None, ..beat(6702, 9) };
        assert_eq!(build_heartbeat(&sup, 1, 1, [old]).workers[0].uptime_secs, 0);
    }

    #[test]
    fn only_beats_matching_the_record_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let write = |id: &str, b: &LocalWorkerHeartbeat| {
            let path = LocalWorkerHeartbeat::path(dir.path(), id);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, b.encode()).unwrap();
        };
        write("w-1", &beat(6700, 1));
        write("w-2", &beat(6799, 1));
        let garbage = LocalWorkerHeartbeat::path(dir.path(), "w-3");
        std::fs::create_dir_all(garbage.parent().unwrap()).unwrap();
        std::fs::write(garbage, b"junk").unwrap();
        let topology: TopologyId = "wc-1-1700000000".parse().unwrap();
        let workers: Vec<RunningWorker> = [("w-1", 6700), ("w-2", 6701), ("w-3", 6702), ("w-4", 6703)]
            .iter()
            .map(|(id, port)| RunningWorker {
                worker_id: (*id).into(),
                port: *port,
                topology_id: topology.clone(),
            })
            .collect();
        let read = read_local_beats(dir.path(), &workers);
        assert_eq!(read.iter().map(|b| b.port).collect::<Vec<_>>(), [6700]);
    }
}
