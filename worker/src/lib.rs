//! The worker: the topology API users program against, and the runtime that runs executors.
//!
//! This crate owns the `Spout` and `Bolt` traits, tuples and output collectors, the topology
//! builder and the Flux-style YAML loader with its component registry, executors with Storm's
//! task ids and groupings, XOR acking, the in-process mode that runs a topology's workers in
//! one process, the inter-worker TCP transport, and the worker process (assignment from
//! ZooKeeper, heartbeats, error reports, graceful shutdown). It depends only on
//! `cluster-state`; nimbus and supervisor never depend on it.
//!
//! Layout:
//! - [`tuple`](mod@tuple): values, fields, tuples. [`component`]: the traits and the topology context.
//! - [`collector`]: emitting, acking, batching per destination (one executor's output side).
//! - [`topology`]: the validated graph and [`TopologyBuilder`]. [`config`]: Storm's keys and
//!   defaults. [`flux`]: YAML loader and [`Registry`]. [`builtin`]: built-in components.
//! - Pure decisions: [`layout`] (task ids, executors, which worker runs what), [`grouping`]
//!   (target choice), [`acker`] (the XOR ledger).
//! - `executor`: one thread per executor with bounded queues; `pending`: a spout executor's
//!   pending trees (a slab named by the root ids). [`runtime`]: a worker's
//!   executors and [`LocalCluster`]. [`stats`]: executor statistics.
//! - [`transport`]: length-delimited batched frames over TCP, one connection per peer.
//! - [`process`]: the worker process ([`process::run`]) and [`process::StaticWorker`] (the same
//!   without ZooKeeper). [`cli`]: the `worker` arguments shared by `squall worker` and users'
//!   own worker binaries.
//! - [`multilang`]: shell spouts and bolts (Storm's multilang protocol: pystorm, streamparse).
//! - [`error`]: the crate's error enum.
//!
//! Building and running a topology in code:
//!
//! ```
//! use std::time::{Duration, Instant};
//! use worker::builtin::{SentenceParams, SentenceSpout, SplitSentence, WordCount};
//! use worker::{LocalCluster, TopologyBuilder};
//!
//! let mut builder = TopologyBuilder::new("wordcount");
//! builder.set_spout("sentences", 1, || {
//!     SentenceSpout::new(SentenceParams { count: Some(100), ..SentenceParams::default() })
//! });
//! builder.set_bolt("split", 2, SplitSentence::default).shuffle_grouping("sentences");
//! builder.set_bolt("count", 2, WordCount::default).fields_grouping("split", ["word"]);
//! let topology = builder.build()?;
//!
//! let cluster = LocalCluster::start(topology)?;
//! let deadline = Instant::now() + Duration::from_secs(30);
//! let acked = || cluster.runtime().component_stats("sentences").iter()
//!     .map(|s| s.acked.load(std::sync::atomic::Ordering::Relaxed)).sum::<u64>();
//! while acked() < 100 && Instant::now() < deadline {
//!     std::thread::sleep(Duration::from_millis(5));
//! }
//! assert_eq!(acked(), 100);
//! cluster.shutdown(Duration::from_secs(1));
//! # Ok::<(), worker::Error>(())
//! ```

pub mod acker;
mod bolt_cell;
pub mod builtin;
pub mod cli;
pub mod collector;
pub mod component;
pub mod config;
pub mod cpu_latency;
pub mod error;
mod executor;
pub mod flux;
pub mod grouping;
pub mod layout;
pub mod log_levels;
pub mod metrics;
pub mod multilang;
mod pending;
pub mod process;
mod queue;
pub mod runtime;
mod static_worker;
pub mod stats;
pub mod topology;
pub mod transport;
pub mod tuple;

pub use collector::{BoltCollector, ErrorReport, SpoutCollector};
pub use component::{Bolt, ComponentError, OutputDeclarer, Spout, TopologyContext};
pub use config::TopologyConfig;
pub use error::{Error, Result};
pub use flux::Registry;
pub use runtime::{LocalCluster, WorkerRuntime};
pub use topology::{Grouping, Topology, TopologyBuilder};
pub use tuple::{Fields, Text, Tuple, Value, Values};
