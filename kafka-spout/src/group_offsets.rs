//! A group's offsets in Kafka (the group coordinator, `__consumer_offsets`), for
//! `offsets_storage: kafka | dual`, and the rule that picks a start position from both stores.
//!
//! Commits are a "simple consumer"'s: librdkafka's `commit` of an explicit list with the
//! consumer's `group.id` set to the group, never joining it (no subscribe, so no generation or
//! member id): the group stays `Empty` for the coordinator, its membership and ownership live
//! in the ZooKeeper registry, and Kafka's tools (`kafka-consumer-groups.sh --describe`,
//! kafka_exporter, UIs) read its offsets. Every call here blocks: callers on a runtime run
//! them on `spawn_blocking` under a timeout.

use std::collections::BTreeMap;
use std::time::Duration;

use consumer_registry::{OffsetReset, StartPosition, TopicPartition};
use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use crate::config::OffsetsStorage;
use crate::error::{Error, Result};

fn list(offsets: impl IntoIterator<Item = (TopicPartition, Offset)>) -> Result<TopicPartitionList> {
    let mut tpl = TopicPartitionList::new();
    for (tp, offset) in offsets {
        tpl.add_partition_offset(tp.topic.as_str(), tp.partition.get(), offset).map_err(|source| {
            Error::Partition {
                topic: tp.topic.to_string(),
                partition: tp.partition.get(),
                context: "listing an offset",
                source,
            }
        })?;
    }
    Ok(tpl)
}

/// Commits `offsets` (the next offset to consume, per partition) for `consumer`'s `group.id`
/// and waits for the coordinator's answer. A partition the coordinator refused fails the call.
pub fn commit<C: ConsumerContext, K: Consumer<C>>(
    consumer: &K,
    offsets: &BTreeMap<TopicPartition, i64>,
) -> Result<()> {
    if offsets.is_empty() {
        return Ok(());
    }
    let tpl = list(offsets.iter().map(|(tp, o)| (tp.clone(), Offset::Offset(*o))))?;
    consumer
        .commit(&tpl, CommitMode::Sync)
        .map_err(|source| Error::Client { context: "committing offsets to the group coordinator", source })
}

/// The offsets the coordinator holds for `consumer`'s `group.id`: `None` for a partition with
/// none (never committed, or expired under the broker's `offsets.retention.minutes`).
pub fn committed<C: ConsumerContext, K: Consumer<C>>(
    consumer: &K,
    partitions: &[TopicPartition],
    timeout: Duration,
) -> Result<BTreeMap<TopicPartition, Option<i64>>> {
    if partitions.is_empty() {
        return Ok(BTreeMap::new());
    }
    let tpl = list(partitions.iter().map(|tp| (tp.clone(), Offset::Invalid)))?;
    let read = consumer
        .committed_offsets(tpl, timeout)
        .map_err(|source| Error::Client { context: "reading offsets from the group coordinator", source })?;
    let mut out = BTreeMap::new();
    for tp in partitions {
        let element = read.find_partition(tp.topic.as_str(), tp.partition.get());
        let offset = match element {
            Some(e) => {
                if let Err(source) = e.error() {
                    return Err(Error::Partition {
                        topic: tp.topic.to_string(),
                        partition: tp.partition.get(),
                        context: "reading its offset from the group coordinator",
                        source,
                    });
                }
                match e.offset() {
                    Offset::Offset(o) if o >= 0 => Some(o),
                    _ => None,
                }
            }
            None => {
                return Err(Error::Partition {
                    topic: tp.topic.to_string(),
                    partition: tp.partition.get(),
                    context: "reading its offset from the group coordinator",
                    source: KafkaError::OffsetFetch(rdkafka::types::RDKafkaErrorCode::UnknownPartition),
                });
            }
        };
        out.insert(tp.clone(), offset);
    }
    Ok(out)
}

/// Where a partition starts, from what each store holds.
///
/// - `zookeeper`: the registry's answer (its committed offset, else `auto.offset.reset`).
/// - `kafka`: the coordinator's committed offset, else `reset`.
/// - `dual`: the larger committed offset of the two (Kafka's rule while `dual.commit.enabled`
///   migrates a group: whichever store went further has seen the later commit); one store's
///   offset when only it has one; `reset` when neither has.
///
/// `zookeeper` is `None` when ZooKeeper was not read (`kafka`), `kafka` is `None` when the
/// coordinator has no offset or was not read.
pub fn start_position(
    storage: OffsetsStorage,
    zookeeper: Option<StartPosition>,
    kafka: Option<i64>,
    reset: OffsetReset,
) -> StartPosition {
    let zk_committed = match zookeeper {
        Some(StartPosition::Committed(o)) => Some(o),
        _ => None,
    };
    match storage {
        OffsetsStorage::Zookeeper => zookeeper.unwrap_or(StartPosition::Reset(reset)),
        OffsetsStorage::Kafka => kafka.map_or(StartPosition::Reset(reset), StartPosition::Committed),
        OffsetsStorage::Dual => match (zk_committed, kafka) {
            (Some(z), Some(k)) => StartPosition::Committed(z.max(k)),
            (Some(o), None) | (None, Some(o)) => StartPosition::Committed(o),
            (None, None) => zookeeper.unwrap_or(StartPosition::Reset(reset)),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use OffsetsStorage::{Dual, Kafka, Zookeeper};
    use StartPosition::{Committed, Reset};

    #[test]
    fn start_position_follows_the_storage_and_dual_takes_the_larger() {
        let small = OffsetReset::Smallest;
        let cases = [
            // storage, ZooKeeper's, Kafka's, start
            (Zookeeper, Some(Committed(7)), Some(9), Committed(7)),
            (Zookeeper, Some(Reset(small)), Some(9), Reset(small)),
            (Kafka, None, Some(9), Committed(9)),
            (Kafka, None, None, Reset(small)),
            (Dual, Some(Committed(7)), Some(9), Committed(9)),
            (Dual, Some(Committed(12)), Some(9), Committed(12)),
            (Dual, Some(Reset(small)), Some(9), Committed(9)),
            (Dual, Some(Committed(7)), None, Committed(7)),
            (Dual, Some(Reset(small)), None, Reset(small)),
            (Dual, None, None, Reset(small)),
        ];
        for (storage, zookeeper, kafka, expected) in cases {
            assert_eq!(
                start_position(storage, zookeeper, kafka, small),
                expected,
                "{storage} zookeeper {zookeeper:?} kafka {kafka:?}"
            );
        }
    }
}
