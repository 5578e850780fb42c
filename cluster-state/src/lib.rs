//! What crosses Squall's process boundaries.
//!
//! Nimbus, supervisors, workers and the Kafka spout talk to each other only through ZooKeeper
//! (and nimbus's code download), so everything they agree on lives here:
//!
//! - [`ids`]: newtypes for every identifier (topology, supervisor, executor, task, worker slot,
//!   consumer, group, topic, partition), validated where they become path segments.
//! - [`paths`]: the functions that build ZooKeeper paths, for Storm's layout under a
//!   configurable root (default `/storm`) and Kafka's consumer registry under a configurable
//!   chroot (default: none, so Kafka's own tools and Burrow read it unchanged).
//! - [`znode`]: the payload stored at each path. A znode is a wire format: each type is
//!   versioned, documented, golden-tested, and decodes garbage to an error naming the path.
//! - [`code`]: the files of a topology's code, by their fixed names.
//! - [`layout`]: Storm's task ids and executors, computed the same way by nimbus and workers.
//! - [`structure`]: a topology's name, workers and executor / task counts, read from its
//!   Flux YAML without resolving classes (what nimbus schedules with).
//! - [`metrics`]: the `/metrics` endpoint every process serves, and the coordination client's
//!   metrics (request latency, session state).
//! - [`http`]: the one HTTP accept loop (nimbus's API, `/metrics`): every connection a
//!   tracked task, drained on shutdown.
//! - [`signal`]: SIGTERM / Ctrl-C as a shutdown: `run_until_signal(token, run)`.
//! - [`api`]: nimbus's HTTP/JSON API as a wire format: routes (the one place `/api/v1` is
//!   spelled), request and response bodies with Storm UI's keys, the upload id, the checksum
//!   header. Golden-tested like the znodes.
//! - [`launch`]: the worker's command line as a wire format ([`launch::WorkerLaunch`]): what
//!   a supervisor gives a worker, written and read in one place, round-trip and golden tested.
//! - [`clock`]: wall-clock time since the epoch (`now_secs`, `now_millis`), the one place
//!   timestamps that other processes read are taken.
//! - [`coord`]: the coordination client every other crate uses, with two backends of the same
//!   semantics: real ZooKeeper (`zookeeper-client`) and an in-memory ensemble for
//!   `squall local` and fast tests. One conformance suite holds both to the same behaviour.
//! - [`files`]: owner-only files (`0600`) and directories (`0700`), how Squall writes to disk.
//! - [`tls`]: TLS settings (server certificate and key, client CA for mutual TLS; a client's
//!   CA and certificate) loaded with rustls, errors naming the config key and file.
//! - [`worker_logs`]: where a worker's log lives (Storm's
//!   `workers-artifacts/<topology-id>/<port>/worker.log`) and its size-rotated file.
//! - [`logviewer`]: a supervisor's HTTP port: `/metrics` and the log viewer serving its
//!   workers' logs by topology id, port and file kind (tail, byte range, download).
//! - [`secrets`]: which topology params are secrets, and redaction of their values from API
//!   answers, reported errors and logs.

// Async code: `tokio::time::Instant`, never std's (see clippy.toml).
#![deny(clippy::disallowed_types)]

pub mod api;
pub mod clock;
pub mod code;
pub mod coord;
pub mod files;
pub mod http;
pub mod ids;
pub mod launch;
pub mod layout;
pub mod logviewer;
pub mod metrics;
pub mod paths;
pub mod resources;
pub mod secrets;
pub mod signal;
pub mod structure;
pub mod tls;
pub mod worker_logs;
pub mod znode;
