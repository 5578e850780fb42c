//! Membership in a Kafka 0.8-style consumer group through the ZooKeeper consumer registry.
//!
//! This crate will own (issue "consumer-registry"): registering a consumer id under
//! `/consumers/[group]/ids`, watching the group and the topic metadata, Kafka's range and
//! round-robin assignment as pure functions, claiming partitions through ephemeral owner nodes
//! with a drained hand-off, session-loss handling, and reading / committing offsets under
//! `/consumers/[group]/offsets`. It knows nothing about Storm: any caller can be a member.
//!
//! The znode formats and paths it uses live in `cluster-state` (`znode::kafka`, `paths`).
