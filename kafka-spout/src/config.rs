//! The spout's and the producer bolt's configuration (their `params:` in topology YAML).
//!
//! Field names are Kafka's config keys with `.` as `_` where Kafka has one; defaults cite their
//! source. Validate once with `validate`, at topology load: the error names the key.

use std::collections::BTreeMap;

use consumer_registry::{OffsetReset, RegistryConfig};
use rdkafka::ClientConfig;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::offsets::RetryPolicy;

/// librdkafka's re-check interval of a partition whose fetch queue is full, and the spout's
/// default for it (see [`KafkaSpoutConfig::consumer_config`]); the pass-through map may set it.
const FETCH_QUEUE_BACKOFF: &str = "fetch.queue.backoff.ms";
const DEFAULT_FETCH_QUEUE_BACKOFF_MS: u32 = 10;

/// librdkafka keys the spout sets itself; the pass-through map may not override them.
const OWNED_CONSUMER_KEYS: &[&str] =
    &["bootstrap.servers", "group.id", "enable.auto.commit", "enable.auto.offset.store", "auto.offset.reset"];

/// Where a group's committed offsets live (Kafka 0.8.2's `offsets.storage`, with its
/// `dual.commit.enabled` folded in as `dual`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OffsetsStorage {
    /// `/consumers/[group]/offsets` in the ZooKeeper registry only (Kafka 0.8's way).
    #[default]
    Zookeeper,
    /// The group coordinator only (`__consumer_offsets`, what today's Kafka tools read).
    Kafka,
    /// Both, the same offset at every commit; a partition starts from the larger of the two
    /// (Kafka's rule while a group migrates from ZooKeeper to Kafka storage).
    Dual,
}

impl OffsetsStorage {
    /// Every value, as spelled in config.
    pub const NAMES: [&'static str; 3] = ["zookeeper", "kafka", "dual"];

    /// Whether offsets are committed to (and read from) ZooKeeper.
    pub fn uses_zookeeper(self) -> bool {
        matches!(self, OffsetsStorage::Zookeeper | OffsetsStorage::Dual)
    }

    /// Whether offsets are committed to (and read from) the group coordinator.
    pub fn uses_kafka(self) -> bool {
        matches!(self, OffsetsStorage::Kafka | OffsetsStorage::Dual)
    }

    /// The name as spelled in config.
    pub fn as_str(self) -> &'static str {
        match self {
            OffsetsStorage::Zookeeper => "zookeeper",
            OffsetsStorage::Kafka => "kafka",
            OffsetsStorage::Dual => "dual",
        }
    }
}

impl std::fmt::Display for OffsetsStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for OffsetsStorage {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "zookeeper" => Ok(OffsetsStorage::Zookeeper),
            "kafka" => Ok(OffsetsStorage::Kafka),
            "dual" => Ok(OffsetsStorage::Dual),
            other => Err(format!("{other:?} is not one of {}", OffsetsStorage::NAMES.join(", "))),
        }
    }
}

/// The Kafka spout's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaSpoutConfig {
    /// `bootstrap.servers`: Kafka brokers, `host:port,...`.
    pub bootstrap_servers: String,
    /// Topics to consume (each spout task subscribes one consumer thread per topic).
    pub topics: Vec<String>,
    /// `group.id`: the consumer group in the ZooKeeper registry.
    pub group_id: String,
    /// `auto.offset.reset`: where a partition without a (valid) committed offset starts.
    /// Kafka 0.8's default: `largest`.
    pub auto_offset_reset: OffsetReset,
    /// `offsets.commit.interval.ms`: Kafka 0.8's default, 2000 (SPEC section 5).
    pub offsets_commit_interval_ms: u64,
    /// `offsets.storage`: where acknowledged offsets are committed (Kafka 0.8.2's key and
    /// names; its default, `zookeeper`). Membership and ownership stay in the ZooKeeper
    /// registry whatever this says.
    pub offsets_storage: OffsetsStorage,
    /// `fetch.min.bytes`: librdkafka's default, 1.
    pub fetch_min_bytes: u32,
    /// `fetch.max.bytes`: librdkafka's default, 52428800.
    pub fetch_max_bytes: u32,
    /// `max.partition.fetch.bytes`: librdkafka's default, 1048576.
    pub max_partition_fetch_bytes: u32,
    /// `zookeeper.connect`: the registry's ensemble, `host:port,...` (Kafka 0.8's key).
    pub zookeeper_connect: String,
    /// The registry's chroot (Kafka's paths under it); `null` for the ZooKeeper root.
    pub zookeeper_chroot: Option<String>,
    /// The rest of the consumer registry's settings (session timeout, rebalance retries...).
    /// Its `auto_offset_reset` is replaced by the one above.
    pub registry: RegistryConfig,
    /// How failed tuples are replayed.
    pub retry: RetryPolicy,
    /// Squall's: the most messages one `next_tuple` call emits (amortises locking).
    pub emit_batch: u32,
    /// Squall's: the most messages a task keeps in flight (emitted, not yet acked, kept for
    /// replay). It bounds the spout's memory when `topology.max.spout.pending` is unset
    /// (Storm's default); the smaller of the two applies.
    pub max_in_flight: u32,
    /// Any other librdkafka consumer property, passed through (e.g. `fetch.wait.max.ms`).
    pub librdkafka: BTreeMap<String, String>,
}

impl Default for KafkaSpoutConfig {
    fn default() -> Self {
        KafkaSpoutConfig {
            bootstrap_servers: "localhost:9092".into(),
            topics: Vec::new(),
            group_id: String::new(),
            auto_offset_reset: OffsetReset::Largest,
            offsets_commit_interval_ms: 2000,
            offsets_storage: OffsetsStorage::Zookeeper,
            fetch_min_bytes: 1,
            fetch_max_bytes: 52_428_800,
            max_partition_fetch_bytes: 1_048_576,
            zookeeper_connect: "localhost:2181".into(),
            zookeeper_chroot: None,
            registry: RegistryConfig::default(),
            retry: RetryPolicy::default(),
            emit_batch: 64,
            max_in_flight: 100_000,
            librdkafka: BTreeMap::new(),
        }
    }
}

fn invalid(key: &str, reason: impl Into<String>) -> Error {
    Error::InvalidConfig { key: key.to_owned(), reason: reason.into() }
}

impl KafkaSpoutConfig {
    /// Checks the values once; the error names the key.
    pub fn validate(&self) -> Result<()> {
        if self.bootstrap_servers.trim().is_empty() {
            return Err(invalid("bootstrap_servers", "must not be empty"));
        }
        if self.topics.is_empty() {
            return Err(invalid("topics", "must name at least one topic"));
        }
        for topic in &self.topics {
            cluster_state::ids::Topic::new(topic.clone())?;
        }
        cluster_state::ids::GroupId::new(self.group_id.clone())
            .map_err(|e| invalid("group_id", e.to_string()))?;
        if self.offsets_commit_interval_ms == 0 {
            return Err(invalid("offsets_commit_interval_ms", "must be greater than 0"));
        }
        if self.max_in_flight == 0 {
            return Err(invalid("max_in_flight", "must be greater than 0"));
        }
        if self.emit_batch == 0 {
            return Err(invalid("emit_batch", "must be greater than 0"));
        }
        if self.retry.max_delay_ms == 0 && self.retry.delay_period_ms > 0 {
            return Err(invalid("retry.max_delay_ms", "must be greater than 0"));
        }
        if let Some(key) = self.librdkafka.keys().find(|k| OWNED_CONSUMER_KEYS.contains(&k.as_str())) {
            return Err(invalid(
                &format!("librdkafka.{key}"),
                "is set by the spout; use the spout's own key",
            ));
        }
        self.registry_config().validate().map_err(|e| invalid("registry", e.to_string()))?;
        self.consumer_config().create::<rdkafka::consumer::BaseConsumer>().map_err(|e| {
            invalid("librdkafka", format!("librdkafka refuses the consumer configuration: {e}"))
        })?;
        Ok(())
    }

    /// The consumer registry's config, with this spout's `auto_offset_reset`.
    pub fn registry_config(&self) -> RegistryConfig {
        RegistryConfig { auto_offset_reset: self.auto_offset_reset, ..self.registry.clone() }
    }

    /// The `group.id` librdkafka is given. With Kafka storage it is the group itself: the
    /// coordinator keeps the group's offsets under that name, where Kafka's tools look. With
    /// ZooKeeper storage the broker never sees a commit, but librdkafka insists on a group id
    /// for a consumer: a name no real Kafka group would take. No group protocol is used either
    /// way (assign, never subscribe).
    pub fn kafka_group_id(&self) -> String {
        if self.offsets_storage.uses_kafka() {
            self.group_id.clone()
        } else {
            format!("squall-{}", self.group_id)
        }
    }

    /// librdkafka's consumer configuration. Offsets are committed by the spout itself (to
    /// ZooKeeper, the coordinator or both, see `offsets_storage`), never automatically; a
    /// fetch offset out of the broker's range is reset by librdkafka with the spout's
    /// `auto_offset_reset` (the spout notices, logs and counts it).
    pub fn consumer_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        for (k, v) in &self.librdkafka {
            c.set(k, v);
        }
        c.set("bootstrap.servers", &self.bootstrap_servers)
            .set("group.id", self.kafka_group_id())
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set(
                "auto.offset.reset",
                if self.auto_offset_reset == OffsetReset::Smallest { "earliest" } else { "latest" },
            )
            .set("fetch.min.bytes", self.fetch_min_bytes.to_string())
            .set("fetch.max.bytes", self.fetch_max_bytes.to_string())
            .set("max.partition.fetch.bytes", self.max_partition_fetch_bytes.to_string());
        // librdkafka stops fetching a partition whose local queue is over its thresholds and
        // looks again only after `fetch.queue.backoff.ms` (default 1000). A spout paced by
        // `topology.max.spout.pending` fills that queue all the time, so the default turned
        // into second-long stalls (throughput benchmark: 0.16 of a raw consumer; 10 ms: 0.7).
        if !self.librdkafka.contains_key(FETCH_QUEUE_BACKOFF) {
            c.set(FETCH_QUEUE_BACKOFF, DEFAULT_FETCH_QUEUE_BACKOFF_MS.to_string());
        }
        c
    }
}

/// The Kafka producer bolt's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaBoltConfig {
    /// `bootstrap.servers`.
    pub bootstrap_servers: String,
    /// The topic written to.
    pub topic: String,
    /// The field written as the record key; `null` for no key.
    pub key_field: Option<String>,
    /// The field written as the record value. storm-kafka-client's
    /// `FieldNameBasedTupleToKafkaMapper` defaults: key field `key`, value field `message`;
    /// here `value`, the spout's field name, so spout -> bolt works unconfigured.
    pub value_field: String,
    /// `acks`: librdkafka's default, `all`.
    pub acks: String,
    /// Squall's: the most writes awaiting the broker's answer before `execute` waits for one.
    pub max_in_flight: u32,
    /// Any other librdkafka producer property, passed through (e.g. `linger.ms`).
    pub librdkafka: BTreeMap<String, String>,
}

impl Default for KafkaBoltConfig {
    fn default() -> Self {
        KafkaBoltConfig {
            bootstrap_servers: "localhost:9092".into(),
            topic: String::new(),
            key_field: Some("key".into()),
            value_field: "value".into(),
            acks: "all".into(),
            max_in_flight: 10_000,
            librdkafka: BTreeMap::new(),
        }
    }
}

impl KafkaBoltConfig {
    /// Checks the values once; the error names the key.
    pub fn validate(&self) -> Result<()> {
        if self.bootstrap_servers.trim().is_empty() {
            return Err(invalid("bootstrap_servers", "must not be empty"));
        }
        cluster_state::ids::Topic::new(self.topic.clone()).map_err(|e| invalid("topic", e.to_string()))?;
        if self.value_field.is_empty() {
            return Err(invalid("value_field", "must not be empty"));
        }
        if self.max_in_flight == 0 {
            return Err(invalid("max_in_flight", "must be greater than 0"));
        }
        if let Some(key) =
            self.librdkafka.keys().find(|k| ["bootstrap.servers", "acks"].contains(&k.as_str()))
        {
            return Err(invalid(&format!("librdkafka.{key}"), "is set by the bolt; use the bolt's own key"));
        }
        Ok(())
    }

    /// librdkafka's producer configuration.
    pub fn producer_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        for (k, v) in &self.librdkafka {
            c.set(k, v);
        }
        c.set("bootstrap.servers", &self.bootstrap_servers).set("acks", &self.acks);
        c
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn parses_yaml_params_with_defaults_and_rejects_unknown_keys() {
        let config: KafkaSpoutConfig = serde_yaml_ng::from_str(
            "bootstrap_servers: 127.0.0.1:9092\ntopics: [clicks]\ngroup_id: g\nauto_offset_reset: smallest\n\
             librdkafka: {fetch.wait.max.ms: '10'}\nregistry: {rebalance_backoff_ms: 100}\n",
        )
        .unwrap();
        assert_eq!(config.offsets_commit_interval_ms, 2000);
        assert_eq!(config.offsets_storage, OffsetsStorage::Zookeeper);
        assert_eq!(config.consumer_config().get("group.id"), Some("squall-g"));
        assert_eq!(config.registry_config().auto_offset_reset, OffsetReset::Smallest);
        assert_eq!(config.registry.rebalance_backoff_ms, 100);
        config.validate().unwrap();
        assert_eq!(config.consumer_config().get("fetch.wait.max.ms"), Some("10"));
        assert_eq!(config.consumer_config().get("auto.offset.reset"), Some("earliest"));
        assert_eq!(config.consumer_config().get("fetch.queue.backoff.ms"), Some("10"));
        let mut tuned = config.clone();
        tuned.librdkafka.insert("fetch.queue.backoff.ms".into(), "50".into());
        assert_eq!(tuned.consumer_config().get("fetch.queue.backoff.ms"), Some("50"));
        let err = serde_yaml_ng::from_str::<KafkaSpoutConfig>("topic: x\n").unwrap_err();
        assert!(err.to_string().contains("topic"), "{err}");
    }

    #[test]
    fn validation_names_the_key() {
        let base = KafkaSpoutConfig { topics: vec!["t".into()], group_id: "g".into(), ..Default::default() };
        base.validate().unwrap();
        let key = |c: KafkaSpoutConfig| match c.validate() {
            Err(Error::InvalidConfig { key, .. }) => key,
            other => panic!("{other:?}"),
        };
        assert_eq!(key(KafkaSpoutConfig { topics: vec![], ..base.clone() }), "topics");
        assert_eq!(key(KafkaSpoutConfig { group_id: "a/b".into(), ..base.clone() }), "group_id");
        assert_eq!(
            key(KafkaSpoutConfig { offsets_commit_interval_ms: 0, ..base.clone() }),
            "offsets_commit_interval_ms"
        );
        let mut owned = base.clone();
        owned.librdkafka.insert("enable.auto.commit".into(), "true".into());
        assert_eq!(key(owned), "librdkafka.enable.auto.commit");
        let mut bogus = base.clone();
        bogus.librdkafka.insert("no.such.property".into(), "1".into());
        assert_eq!(key(bogus), "librdkafka");
        assert!(matches!(
            KafkaSpoutConfig { topics: vec!["bad topic".into()], ..base }.validate(),
            Err(Error::InvalidId(_))
        ));
    }

    #[test]
    fn offsets_storage_is_named_as_kafka_names_it_and_a_bad_value_names_the_key() {
        for (name, storage, zookeeper, kafka) in [
            ("zookeeper", OffsetsStorage::Zookeeper, true, false),
            ("kafka", OffsetsStorage::Kafka, false, true),
            ("dual", OffsetsStorage::Dual, true, true),
        ] {
            let config: KafkaSpoutConfig =
                serde_yaml_ng::from_str(&format!("topics: [t]\ngroup_id: g\noffsets_storage: {name}\n"))
                    .unwrap();
            assert_eq!(config.offsets_storage, storage);
            assert_eq!((storage.uses_zookeeper(), storage.uses_kafka()), (zookeeper, kafka), "{name}");
            assert_eq!(name.parse::<OffsetsStorage>().unwrap(), storage);
            assert_eq!(storage.to_string(), name);
            config.validate().unwrap();
            // With Kafka storage the coordinator keeps the offsets under the group's own name.
            let group_id = if kafka { "g" } else { "squall-g" };
            assert_eq!(config.consumer_config().get("group.id"), Some(group_id), "{name}");
        }
        let err = serde_yaml_ng::from_str::<KafkaSpoutConfig>("offsets_storage: broker\n").unwrap_err();
        assert!(err.to_string().contains("offsets_storage"), "{err}");
        assert!(err.to_string().contains("zookeeper"), "the accepted values are listed: {err}");
        let err = "Kafka".parse::<OffsetsStorage>().unwrap_err();
        assert!(err.contains("zookeeper, kafka, dual"), "{err}");
    }

    #[test]
    fn bolt_config_defaults_and_validation() {
        let config: KafkaBoltConfig = serde_yaml_ng::from_str("topic: out\nkey_field: null\n").unwrap();
        assert_eq!(config.value_field, "value");
        assert_eq!(config.key_field, None);
        config.validate().unwrap();
        let err = KafkaBoltConfig::default().validate().unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { ref key, .. } if key == "topic"), "{err}");
    }
}
