//! The Kafka spout and the Kafka producer bolt.
//!
//! The spout ingests Kafka at least once: each spout task is one member of a consumer group in
//! Kafka's ZooKeeper registry (`consumer-registry`), fetches with librdkafka from the partitions
//! it owns, and commits, per partition, only the offset after the contiguous acknowledged
//! prefix. Failed tuples are replayed with bounded exponential backoff; partitions are handed
//! off with a drain; nothing is emitted from a partition unless the ownership lease of the
//! session that claimed it is fresh (consumer-registry's `lease.rs`), so a process stopped past
//! its session timeout never emits what another task now owns. The producer bolt
//! writes tuples to a topic and acks them once the broker has them.
//!
//! Layout:
//! - `offsets`: the pure core: [`offsets::safe_offset`], [`offsets::PartitionOffsets`],
//!   [`offsets::RetryPolicy`], [`offsets::MsgId`].
//! - `config`: [`KafkaSpoutConfig`], [`KafkaBoltConfig`] (topology `params:`).
//! - `spout`: [`KafkaSpout`] (executor side: the lease-fenced hot path) and its coordinator
//!   (registry side).
//! - `group_offsets`: a group's offsets in Kafka's group coordinator (`offsets_storage: kafka |
//!   dual`) and the start rule over both stores ([`group_offsets::start_position`]).
//! - `context`: librdkafka's log and error callbacks, into `tracing` with the task.
//! - `bolt`: [`KafkaBolt`].
//! - `metrics`: `squall_spout_*` and `squall_kafka_bolt_*` families.
//! - `error`: the crate's error enum.
//!
//! Registering both by name for topology YAML (`className: kafka-spout` / `kafka-bolt`):
//!
//! ```
//! let mut components = worker::Registry::with_builtins();
//! kafka_spout::register(&mut components, &prometheus::Registry::new())?;
//! # Ok::<(), kafka_spout::Error>(())
//! ```

pub mod bolt;
pub mod config;
mod context;
pub mod error;
pub mod group_offsets;
pub mod metrics;
pub mod offsets;
pub mod spout;

use std::sync::Arc;

pub use bolt::KafkaBolt;
pub use config::{KafkaBoltConfig, KafkaSpoutConfig, OffsetsStorage};
pub use error::{Error, Result};
pub use metrics::{BoltMetrics, SpoutMetrics};
pub use spout::{FIELDS, KafkaSpout, SpoutEnv};
use worker::flux::parse_params;
use worker::{Bolt, Spout};

/// The spout's registry name.
pub const SPOUT_NAME: &str = "kafka-spout";
/// The producer bolt's registry name.
pub const BOLT_NAME: &str = "kafka-bolt";

/// Registers `kafka-spout` and `kafka-bolt` on `components`, with their metrics (and the
/// consumer registry's) on `metrics`. Call once per metrics registry.
pub fn register(components: &mut worker::Registry, metrics: &prometheus::Registry) -> Result<()> {
    register_with(components, SpoutEnv::register(metrics)?, BoltMetrics::register(metrics)?);
    Ok(())
}

/// Like [`register`], with metric families already registered and, optionally, an ensemble
/// in `env` (the in-memory one of `squall local`).
pub fn register_with(components: &mut worker::Registry, env: SpoutEnv, bolt_metrics: BoltMetrics) {
    components.register_spout(SPOUT_NAME, move |p| {
        let config: KafkaSpoutConfig = parse_params(p)?;
        config.validate().map_err(|e| e.to_string())?;
        let config = Arc::new(config);
        let env = env.clone();
        Ok(Arc::new(move || Box::new(KafkaSpout::new(config.clone(), env.clone())) as Box<dyn Spout>))
    });
    components.register_bolt(BOLT_NAME, move |p| {
        let config: KafkaBoltConfig = parse_params(p)?;
        config.validate().map_err(|e| e.to_string())?;
        let config = Arc::new(config);
        let metrics = bolt_metrics.clone();
        Ok(Arc::new(move || Box::new(KafkaBolt::new(config.clone(), metrics.clone())) as Box<dyn Bolt>))
    });
}
