//! Nimbus: the cluster's master.
//!
//! This crate will own (issue "nimbus and supervisor"): topology submission and code storage
//! under `stormdist/<topology-id>`, the topology state machine (active, inactive, rebalancing,
//! killed) with delayed transitions that survive a restart, the even scheduler as a pure
//! function, the heartbeat monitor that reassigns dead executors, and the HTTP/JSON API shaped
//! like Storm's UI REST API. It keeps no state of its own beyond ZooKeeper and its code dir.
//!
//! Layout so far:
//! - [`lifecycle`]: the topology state machine (active, inactive, rebalancing, killed) as a pure
//!   function over the stored base record, delayed transitions included.
//! - [`liveness`]: which executors are alive, from heartbeats measured on nimbus's own clock.
//! - [`scheduler`]: Storm's even scheduler as a pure function (`schedule(input) -> Schedule`).
//! - [`views`]: the read side of the HTTP API (Storm UI's summaries) as pure functions.

pub mod lifecycle;
pub mod liveness;
pub mod scheduler;
pub mod views;
