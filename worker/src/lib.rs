//! The worker: the topology API users program against, and the process that runs executors.
//!
//! This crate will own (issue "worker"): the `Spout` and `Bolt` traits, tuples and output
//! collectors, the topology builder and the Flux-style YAML loader with its component registry,
//! executors with Storm's task ids and groupings, XOR acking, the inter-worker TCP transport,
//! and the worker's heartbeats and error reports.
