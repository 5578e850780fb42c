//! The brokers' side of `squall offsets`: partitions, earliest and log-end offsets, offsets by
//! time, through a plain librdkafka consumer; and a group's offsets in Kafka's group
//! coordinator (`--offsets-storage kafka | dual`), through a consumer of that group that never
//! joins it (as the spouts commit them).

use std::collections::BTreeMap;
use std::time::Duration;

use cluster_state::ids::{GroupId, Partition, Topic};
use consumer_registry::TopicPartition;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::Connection;

pub(super) const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// The broker side.
pub(super) struct Kafka {
    consumer: BaseConsumer,
    brokers: String,
}

impl Kafka {
    pub(super) fn connect(brokers: &str) -> Result<Kafka, String> {
        let consumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", "squall-offsets-tool")
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| format!("Kafka client for {brokers}: {e}"))?;
        Ok(Kafka { consumer, brokers: brokers.to_owned() })
    }

    /// A consumer whose `group.id` is `group`, for its offsets in the group coordinator.
    fn group_consumer(&self, group: &GroupId) -> Result<BaseConsumer, String> {
        ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", group.as_str())
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| format!("Kafka client for {}: {e}", self.brokers))
    }

    /// The offsets Kafka's group coordinator holds for `group` (`None`: nothing committed).
    pub(super) fn group_offsets(
        &self,
        group: &GroupId,
        tps: &[TopicPartition],
    ) -> Result<BTreeMap<TopicPartition, Option<i64>>, String> {
        kafka_spout::group_offsets::committed(&self.group_consumer(group)?, tps, KAFKA_TIMEOUT)
            .map_err(|e| format!("Kafka at {}: offsets of group {group}: {e}", self.brokers))
    }

    /// Commits `offsets` for `group` in Kafka's group coordinator.
    pub(super) fn commit_group(
        &self,
        group: &GroupId,
        offsets: &BTreeMap<TopicPartition, i64>,
    ) -> Result<(), String> {
        kafka_spout::group_offsets::commit(&self.group_consumer(group)?, offsets)
            .map_err(|e| format!("Kafka at {}: committing offsets of group {group}: {e}", self.brokers))
    }

    /// The topic's partitions; an unknown topic is an error naming it.
    pub(super) fn partitions(&self, topic: &Topic) -> Result<Vec<Partition>, String> {
        let metadata = self.consumer.fetch_metadata(Some(topic.as_str()), KAFKA_TIMEOUT).map_err(|e| {
            format!("Kafka at {}: metadata of topic {topic}: {e} (check --brokers)", self.brokers)
        })?;
        let t = metadata.topics().iter().find(|t| t.name() == topic.as_str());
        let partitions: Vec<Partition> = t
            .filter(|t| t.error().is_none())
            .map(|t| t.partitions().iter().filter_map(|p| Partition::new(p.id()).ok()).collect())
            .unwrap_or_default();
        if partitions.is_empty() {
            return Err(format!("topic {topic} does not exist on the brokers at {}", self.brokers));
        }
        Ok(partitions)
    }

    /// `(earliest, log end)` of a partition.
    pub(super) fn range(&self, tp: &TopicPartition) -> Result<(i64, i64), String> {
        self.consumer.fetch_watermarks(tp.topic.as_str(), tp.partition.get(), KAFKA_TIMEOUT).map_err(|e| {
            format!("Kafka at {}: offsets of {} partition {}: {e}", self.brokers, tp.topic, tp.partition)
        })
    }

    /// `(earliest, log end)` of each partition, one request each; progress on stderr when it
    /// takes more than a second (hundreds of partitions, a slow broker).
    // Synchronous code timing blocking broker calls for a progress line: std's clock is right.
    #[allow(clippy::disallowed_types)]
    pub(super) fn ranges(
        &self,
        tps: &[TopicPartition],
    ) -> Result<BTreeMap<TopicPartition, (i64, i64)>, String> {
        let started = std::time::Instant::now();
        let mut reported = started;
        let mut out = BTreeMap::new();
        for (i, tp) in tps.iter().enumerate() {
            out.insert(tp.clone(), self.range(tp)?);
            if reported.elapsed() >= Duration::from_secs(1) {
                reported = std::time::Instant::now();
                eprintln!(
                    "reading offsets from Kafka at {}: {}/{} partitions",
                    self.brokers,
                    i + 1,
                    tps.len()
                );
            }
        }
        Ok(out)
    }

    /// The first offset at or after `ms` in each partition (the log end when none is).
    pub(super) fn at_time(
        &self,
        tps: &[TopicPartition],
        ms: i64,
    ) -> Result<BTreeMap<TopicPartition, i64>, String> {
        let mut list = TopicPartitionList::new();
        for tp in tps {
            list.add_partition_offset(tp.topic.as_str(), tp.partition.get(), Offset::Offset(ms))
                .map_err(|e| e.to_string())?;
        }
        let found = self
            .consumer
            .offsets_for_times(list, KAFKA_TIMEOUT)
            .map_err(|e| format!("Kafka at {}: offsets by time: {e}", self.brokers))?;
        let mut out = BTreeMap::new();
        for tp in tps {
            let offset = match found.find_partition(tp.topic.as_str(), tp.partition.get()).map(|e| e.offset())
            {
                Some(Offset::Offset(o)) => o,
                // No message at or after the time: the log end.
                Some(Offset::End) => self.range(tp)?.1,
                other => {
                    return Err(format!(
                        "Kafka at {}: {} partition {} has no offset for that time ({other:?}); the broker may not support lookups by time",
                        self.brokers, tp.topic, tp.partition
                    ));
                }
            };
            out.insert(tp.clone(), offset);
        }
        Ok(out)
    }
}

pub(super) fn connection_kafka(connection: &Connection) -> Result<Kafka, String> {
    connection
        .kafka()?
        .ok_or_else(|| "a reset checks partitions and their ranges on the brokers: pass --brokers".to_owned())
}
