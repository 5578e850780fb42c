//! The supervisor: one per machine, turning assignments into running worker processes.
//!
//! It owns the durable local state and stable
//! supervisor id, the ephemeral registration under `/storm/supervisors`, the sync task
//! (assignments to local assignment, code download and cleanup) and the process task (worker
//! heartbeats versus local assignment: kill, start, adopt). Workers are launched through a trait
//! so `squall local` can run them in-process; this crate never depends on `worker`.
//!
//! Layout:
//! - [`backoff`]: exponential backoff (2 s doubling to 60 s) for relaunching a crashing worker
//!   and for code downloads that fail.
//! - [`code_sync`]: topology code downloaded from nimbus into `stormdist/<id>`, checksum-checked,
//!   installed atomically, removed when stale.
//! - [`daemon`]: [`daemon::SupervisorConfig`] (Storm's keys) and [`daemon::run`], wiring
//!   registration, assignment sync, code sync and the process task together.
//! - [`launch`]: the [`launch::Launcher`] trait and the process launcher (no shell, own
//!   process group and log file, TERM then KILL, adoption by pid after a restart).
//! - [`metrics`]: `squall_supervisor_*` (workers running, launches, kills, slots).
//! - [`out_rotation`]: every worker's `worker.log.out` (stdout and stderr) copied and truncated
//!   past `worker.log.max.bytes`, keeping `worker.log.max.files`.
//! - The supervisor's HTTP port (`/metrics` and the workers' log viewer) is
//!   `cluster_state::logviewer`.
//! - [`local_state`]: the durable local state file (atomic replace, checksummed, corruption
//!   reported, never a crash).
//! - [`process_task`]: the process task: heartbeats -> plan -> launcher actions, recorded in the
//!   local state so a restarted supervisor adopts its workers.
//! - [`registration`]: the ephemeral `/storm/supervisors/<id>` heartbeat, re-created after a
//!   session expiry; on the same session and tick, [`workerbeats`].
//! - [`workerbeats`]: the `/storm/workerbeats` nodes of all this supervisor's workers, in one
//!   `multi` at most every `squall.workerbeats.zk.secs`.
//! - [`sync`]: the sync task: `/storm/assignments` kept in a watch-driven cache, this node's
//!   local assignment, and a [`sync::Node`] that runs it (worker processes here; simulated
//!   workers in the scale bench).
//! - [`plan`]: the sync decisions as pure functions: this node's local assignment, and which
//!   workers to kill and which ports to launch (Storm's `sync-processes`).

// Async code: `tokio::time::Instant`, never std's (see clippy.toml).
#![deny(clippy::disallowed_types)]

pub mod backoff;
pub mod code_sync;
pub mod daemon;
pub mod heartbeat;
pub mod launch;
pub mod local_state;
pub mod metrics;
pub mod out_rotation;
pub mod plan;
pub mod process_task;
pub mod registration;
pub mod run_as;
pub mod sync;
pub mod workerbeats;
