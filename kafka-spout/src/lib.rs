//! The Kafka spout and the Kafka producer bolt.
//!
//! This crate will own (issue "kafka-spout"): a spout whose every task is one member of a
//! consumer group (through `consumer-registry`), fetching with rdkafka from the partitions that
//! task owns, tracking acknowledged offsets per partition and committing only the contiguous
//! acknowledged prefix (at-least-once), replaying failed tuples, and handing partitions off with a
//! drain; plus a producer bolt that acks its input only after the broker acknowledged the write.
