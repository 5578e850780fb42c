//! Membership in a Kafka 0.8-style consumer group through the ZooKeeper consumer registry.
//!
//! Any caller can be one member of a group; the crate knows nothing about Storm. It owns:
//! registering a consumer id under `/consumers/[group]/ids`, watching the group and the topic
//! metadata, Kafka's range and round-robin assignment, claiming partitions through checked
//! ephemeral owner nodes with an ordered, acknowledged hand-off, session-loss handling, and
//! reading / committing offsets under `/consumers/[group]/offsets`. The znode formats and paths
//! live in `cluster-state` (`znode::kafka`, `paths`).
//!
//! Layout:
//! - `admin.rs`: [`admin::Admin`], the operators' offsets (`squall offsets`): read with owners,
//!   plan a reset (clamped), write it in one transaction, export / import, snapshots.
//! - `assign.rs`: the pure decisions: range and round-robin assignment, the ownership diff.
//! - `config.rs`: [`RegistryConfig`], Kafka's consumer config names and defaults.
//! - `error.rs`: the crate's one error enum.
//! - `lag.rs`: [`lag::LagWindow`], Burrow's lag status rules over a sliding window of commits.
//! - `lease.rs`: [`Lease`], the ownership lease (when the caller may emit from owned
//!   partitions, however long the process was stopped) and the keeper that renews it.
//! - `member.rs`: [`Member`], the actor that is one member of a group, its [`MemberHandle`] and
//!   the [`MemberEvent`]s it tells its caller.
//! - `offsets.rs`: [`OffsetStore`], committed offsets read and written in batches.
//! - `metrics.rs`: [`RegistryMetrics`], registered on the caller's Prometheus registry.
//! - `zk.rs`: the member's counted view of its coordination session.
//! - `tests/zookeeper.rs` (real ZooKeeper: membership changes, expiry, offsets),
//!   `tests/memory.rs` (in-memory: disconnects, conflicts, timeouts), `benches/rebalance.rs`
//!   (rebalance latency and ZooKeeper requests per membership change).
//!
//! A member in short:
//!
//! ```no_run
//! # async fn example() -> consumer_registry::Result<()> {
//! use consumer_registry::{Member, MemberEvent, MemberSpec, RegistryConfig, RegistryMetrics};
//! use cluster_state::{coord::Ensemble, ids::{GroupId, Topic}, paths::KafkaPaths};
//!
//! let spec = MemberSpec {
//!     ensemble: Ensemble::zookeeper("127.0.0.1:2181"),
//!     paths: KafkaPaths::new(None)?,
//!     group: GroupId::new("clicks")?,
//!     consumer_id: None, // Kafka's group_host-millis-uuid8
//!     host: "host1".into(),
//!     subscription: [(Topic::new("clicks")?, 1)].into(),
//!     partition_source: None,
//!     detached_session: false,
//! };
//! let metrics = RegistryMetrics::register(&prometheus::Registry::new()).expect("fresh registry");
//! let (member, handle, mut events) = Member::new(spec, RegistryConfig::default(), metrics)?;
//! let cancel = tokio_util::sync::CancellationToken::new();
//! tokio::spawn(member.run(cancel.clone()));
//! while let Some(event) = events.recv().await {
//!     match event {
//!         MemberEvent::Revoking { partitions, ack } => {
//!             // stop emitting from `partitions`, drain, commit through handle.offsets()
//!             ack.ack();
//!         }
//!         other => println!("{other:?}, now owning {:?}", handle.ownership().partitions),
//!     }
//! }
//! # Ok(())
//! # }
//! ```

pub mod admin;
mod assign;
mod config;
mod error;
pub mod lag;
mod lease;
mod member;
mod metrics;
mod offsets;
mod zk;

pub use assign::{
    AssignError, Assignment, OwnershipDiff, Strategy, Subscriptions, TopicPartition, TopicPartitions, assign,
    assigned_to, ownership_diff, range_assign, round_robin_assign,
};
pub use config::{OffsetReset, RegistryConfig};
pub use error::{Error, Result};
pub use lease::{Lease, lease_bound};
pub use member::{
    Member, MemberEvent, MemberHandle, MemberSpec, Ownership, PartitionSource, RevokeAck, SourcedPartitions,
};
pub use metrics::RegistryMetrics;
pub use offsets::{CommitReport, OffsetStore, StartPosition};
