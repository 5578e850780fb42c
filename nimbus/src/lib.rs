//! Nimbus: the cluster's master.
//!
//! It owns topology submission and code storage
//! under `stormdist/<topology-id>`, the topology state machine (active, inactive, rebalancing,
//! killed) with delayed transitions that survive a restart, the even scheduler as a pure
//! function, the heartbeat monitor that reassigns dead executors, and the HTTP/JSON API shaped
//! like Storm's UI REST API. It keeps no state of its own beyond ZooKeeper and its code dir.
//!
//! Layout:
//! - [`assigner`]: the one writer of `/assignments`: submit (install the code, write the topology
//!   and its first assignment), the monitor pass that reassigns dead executors (Storm's
//!   `mk-assignments`), and the rescheduling a due rebalance asks for.
//! - [`assignments`]: `write_assignment`, the compare-and-set of `/assignments/<id>` against
//!   the base and assignment a pass read; oversized assignments are never sent.
//! - [`code_store`]: `stormdist/<topology-id>` and chunked uploads (begin / chunk / finish /
//!   install), with ids from clients validated so none becomes a path.
//! - [`daemon`]: [`NimbusConfig`] (Storm's key names) and the [`run`] / [`serve`] entries that
//!   wire a session, the code store, the deadline timers and the API together.
//! - [`http`]: the HTTP/JSON API (Storm UI REST shapes), served by `http::run`.
//! - [`lag`]: consumer-group lag of every group under `/consumers`, judged with Burrow's rules
//!   on an interval and exported under kafka_exporter's, Burrow's and Squall's names.
//! - [`leader`]: high availability: the leader election (`/leader-lock`), the registry of
//!   nimbuses (`/nimbuses`), fenced leader writes and code replication to followers.
//! - [`lifecycle`]: the topology state machine (active, inactive, rebalancing, killed) as a pure
//!   function over the stored base record, delayed transitions included.
//! - [`limits`]: how large a topology may be (tasks, executors, assignment bytes), checked at
//!   submit and rebalance.
//! - [`heartbeats`]: the supervisors' aggregated heartbeats (`POST /api/v1/supervisor/heartbeat`),
//!   kept in memory for the monitor, the API and discovery: no ZooKeeper write per worker.
//! - [`liveness`]: which executors are alive, from heartbeats measured on nimbus's own clock.
//! - [`metrics`]: `squall_nimbus_*` counters on the caller's registry.
//! - [`node_index`]: the per-node assignment index (`/node-assignments/<node>`: which
//!   topologies' assignments name the node), written by the pass when a node's set changes,
//!   so a supervisor reads only its own assignments.
//! - [`scheduler`]: Storm's even scheduler as a pure function (`schedule(input) -> Schedule`).
//! - [`state`]: reading ZooKeeper into the pure functions' inputs, skipping garbage znodes.
//! - [`stats`]: Storm UI's topology page, component page and component graph as pure
//!   functions of the executors' reported counters, with the ten-minute window's samples.
//! - [`transitions`]: the state machine applied to ZooKeeper with compare-and-set, removal of
//!   a killed topology (and of orphans), the deadline timers that a restarted nimbus re-arms
//!   from ZooKeeper, and the `Rescheduler` hook a due rebalance needs (filled by submit).
//! - [`ui`]: the web UI (static page, script and style compiled into the binary) and its
//!   security headers.
//! - [`views`]: the read side of the HTTP API (Storm UI's summaries) as pure functions.

// Async code: `tokio::time::Instant`, never std's (see clippy.toml).
#![deny(clippy::disallowed_types)]

pub mod assigner;
pub mod assignments;
pub mod code_store;
pub mod daemon;
pub mod heartbeats;
pub mod http;
pub mod lag;
pub mod leader;
pub mod lifecycle;
pub mod limits;
pub mod liveness;
pub mod metrics;
pub mod node_index;
pub mod scheduler;
pub mod state;
pub mod stats;
pub mod transitions;
pub mod ui;
pub mod views;

pub use daemon::{NimbusConfig, NimbusError, run, run_rejoining, serve};
