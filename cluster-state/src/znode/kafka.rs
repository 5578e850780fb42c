//! Payloads of Kafka's ZooKeeper registry, byte-compatible with Kafka 0.8 so that Kafka's
//! tools, Burrow and old high-level consumers read what Squall writes and vice versa.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use super::{DecodeError, JsonObject, ZnodeData, decode_json, text};
use crate::ids::{BrokerId, ConsumerThreadId, IdError, Partition};

/// Reads Kafka's millisecond timestamps: a JSON string of decimal digits (what Kafka writes)
/// or a JSON number (what some other writers produce).
fn millis<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    struct Millis;
    impl Visitor<'_> for Millis {
        type Value = u64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("milliseconds as a decimal string or a non-negative integer")
        }
        fn visit_u64<E: de::Error>(self, ms: u64) -> Result<u64, E> {
            Ok(ms)
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<u64, E> {
            match s.bytes().all(|b| b.is_ascii_digit()) {
                true => s.parse().map_err(|_| E::invalid_value(de::Unexpected::Str(s), &self)),
                false => Err(E::invalid_value(de::Unexpected::Str(s), &self)),
            }
        }
    }
    deserializer.deserialize_any(Millis)
}

/// How a consumer subscribes (Kafka's `TopicCount` pattern).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubscriptionPattern {
    /// Named topics: subscription keys are topic names.
    Static,
    /// Topics matching a regex: the single subscription key is the regex.
    WhiteList,
    /// Topics not matching a regex: the single subscription key is the regex.
    BlackList,
}

impl SubscriptionPattern {
    /// Kafka's name: `static`, `white_list` or `black_list`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Static => "static",
            Self::WhiteList => "white_list",
            Self::BlackList => "black_list",
        }
    }
}

/// A consumer's registration, at `/consumers/[group]/ids/[consumer_id]` (ephemeral).
///
/// Encodes exactly as Kafka 0.8's `ZookeeperConsumerConnector` writes it, compact, in this key
/// order, with the timestamp as a string of milliseconds:
/// ```json
/// {"version":1,"subscription":{"topic1":1},"pattern":"static","timestamp":"1400000000000"}
/// ```
/// Decoding accepts any key order and whitespace, a numeric timestamp, and ignores unknown
/// keys; it rejects any version but 1.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ConsumerRegistration {
    /// Topic (or, for wildcard patterns, regex) -> number of consumer threads.
    pub subscription: BTreeMap<String, u32>,
    /// How `subscription` is to be read.
    pub pattern: SubscriptionPattern,
    /// Registration time, milliseconds since the epoch.
    #[serde(rename = "timestamp", deserialize_with = "millis")]
    pub timestamp_ms: u64,
}

impl ZnodeData for ConsumerRegistration {
    const FORMAT: &'static str = "Kafka consumer-registration v1 JSON";

    fn encode(&self) -> Vec<u8> {
        JsonObject::versioned(1)
            .raw("subscription", &JsonObject::map(self.subscription.iter().map(|(t, n)| (t, *n))))
            .field("pattern", self.pattern.as_str())
            .field("timestamp", self.timestamp_ms.to_string())
            .finish()
            .into_bytes()
    }

    fn decode(path: &str, bytes: &[u8]) -> Result<Self, DecodeError> {
        decode_json::<Self>(path, bytes, 1..=1).map(|(_, registration)| registration)
    }
}

/// The owner of a partition, at `/consumers/[group]/owners/[topic]/[partition]` (ephemeral):
/// the consumer thread id as plain UTF-8, no quotes, no newline, e.g.
/// `mygroup_host1-1400000000000-a1b2c3d4-0`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OwnerData(pub ConsumerThreadId);

impl ZnodeData for OwnerData {
    const FORMAT: &'static str = "Kafka partition-owner (plain consumer thread id)";

    fn encode(&self) -> Vec<u8> {
        self.0.as_str().as_bytes().to_vec()
    }

    fn decode(path: &str, bytes: &[u8]) -> Result<Self, DecodeError> {
        let text = text::<Self>(path, bytes)?;
        text.parse().map(Self).map_err(|e: IdError| DecodeError::new::<Self>(path, e))
    }
}

/// A committed offset, at `/consumers/[group]/offsets/[topic]/[partition]`: the next offset
/// to consume as a plain decimal string, e.g. `42`, no newline. Kafka offsets are Java longs,
/// so the value is in `0..=i64::MAX`. Decoding tolerates surrounding ASCII whitespace (offsets
/// set by hand with zkCli) and rejects anything else but digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OffsetData(i64);

impl OffsetData {
    /// Wraps `offset`; fails if it is negative.
    pub fn new(offset: i64) -> Result<Self, IdError> {
        if offset < 0 {
            return Err(IdError { kind: "offset", value: offset.to_string(), rule: "must not be negative" });
        }
        Ok(Self(offset))
    }

    /// The offset.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl ZnodeData for OffsetData {
    const FORMAT: &'static str = "Kafka offset (plain decimal)";

    fn encode(&self) -> Vec<u8> {
        self.0.to_string().into_bytes()
    }

    fn decode(path: &str, bytes: &[u8]) -> Result<Self, DecodeError> {
        let digits = text::<Self>(path, bytes)?.trim_matches(|c: char| c.is_ascii_whitespace());
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            let reason = format_args!("expected a non-negative decimal integer, found {digits:?}");
            return Err(DecodeError::new::<Self>(path, reason));
        }
        let offset = digits.parse().map_err(|_| {
            DecodeError::new::<Self>(
                path,
                format_args!("offset {digits} does not fit a signed 64-bit integer"),
            )
        })?;
        Ok(Self(offset))
    }
}

/// A broker's registration, at `/brokers/ids/[id]` (written by Kafka, read-only for Squall).
///
/// Kafka 0.8 writes version 1:
/// `{"jmx_port":-1,"timestamp":"1400000000000","host":"b1","version":1,"port":9092}`.
/// Versions 2-5 add `endpoints` (`["PLAINTEXT://b1:9092"]`), `rack` (3+) and
/// `listener_security_protocol_map` (4+), and write `"host":null` and `"port":-1` when no
/// plaintext listener exists. Decoding accepts versions 1-5, requires what Kafka's reader
/// requires (`port`, `jmx_port`, `timestamp`; `host` in v1; `endpoints` in v2+) and ignores
/// unknown fields (later Kafka versions add some). Encoding writes the v1 form above when the value has only v1
/// fields, else all fields starting with `"version"`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BrokerRegistration {
    /// Registration format version (1-5).
    pub version: u32,
    /// Hostname of the plaintext listener; `None` (JSON `null`) if there is none.
    #[serde(default)]
    pub host: Option<String>,
    /// Port of the plaintext listener, `-1` if there is none.
    pub port: i32,
    /// JMX port, `-1` when JMX is off.
    pub jmx_port: i32,
    /// Registration time, milliseconds since the epoch.
    #[serde(rename = "timestamp", deserialize_with = "millis")]
    pub timestamp_ms: u64,
    /// Listeners as `NAME://host:port` (version 2+).
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// Listener name -> security protocol (version 4+).
    #[serde(default)]
    pub listener_security_protocol_map: BTreeMap<String, String>,
    /// Rack of the broker (version 3+).
    #[serde(default)]
    pub rack: Option<String>,
}

impl BrokerRegistration {
    /// A `host:port` to bootstrap a Kafka client from: `host`/`port` when set, else the
    /// first `PLAINTEXT` endpoint, else the first endpoint. `None` if there is no address.
    pub fn bootstrap_address(&self) -> Option<String> {
        if let Some(host) = self.host.as_deref().filter(|h| !h.is_empty())
            && self.port > 0
        {
            return Some(format!("{host}:{}", self.port));
        }
        let protocol = |endpoint: &String| {
            let listener = endpoint.split_once("://").map_or("", |(name, _)| name);
            self.listener_security_protocol_map.get(listener).map_or(listener, String::as_str) == "PLAINTEXT"
        };
        let endpoint = self.endpoints.iter().find(|e| protocol(e)).or(self.endpoints.first())?;
        let (_, address) = endpoint.split_once("://")?;
        let (host, port) = address.rsplit_once(':')?;
        (!host.is_empty() && port.parse::<u16>().is_ok()).then(|| address.to_owned())
    }
}

impl ZnodeData for BrokerRegistration {
    const FORMAT: &'static str = "Kafka broker-registration JSON (versions 1-5)";

    fn encode(&self) -> Vec<u8> {
        let host = self.host.as_deref();
        let timestamp = self.timestamp_ms.to_string();
        let v1_only = self.endpoints.is_empty()
            && self.listener_security_protocol_map.is_empty()
            && self.rack.is_none();
        let json = if self.version == 1 && v1_only {
            // Kafka 0.8's key order (a Scala map's), byte for byte.
            JsonObject::new()
                .field("jmx_port", self.jmx_port)
                .field("timestamp", timestamp)
                .field("host", host)
                .field("version", self.version)
                .field("port", self.port)
        } else {
            let protocols = self.listener_security_protocol_map.iter().map(|(l, p)| (l, p.as_str()));
            let obj = JsonObject::new()
                .field("version", self.version)
                .field("host", host)
                .field("port", self.port)
                .field("endpoints", self.endpoints.as_slice())
                .field("jmx_port", self.jmx_port)
                .field("timestamp", timestamp)
                .raw("listener_security_protocol_map", &JsonObject::map(protocols));
            match &self.rack {
                Some(rack) => obj.field("rack", rack.as_str()),
                None => obj,
            }
        };
        json.finish().into_bytes()
    }

    fn decode(path: &str, bytes: &[u8]) -> Result<Self, DecodeError> {
        let (version, broker) = decode_json::<Self>(path, bytes, 1..=5)?;
        // What Kafka's own reader requires: host in version 1, endpoints from version 2.
        if version == 1 && broker.host.is_none() {
            return Err(DecodeError::new::<Self>(path, "version 1 registration without host"));
        }
        if version >= 2 && broker.endpoints.is_empty() {
            return Err(DecodeError::new::<Self>(
                path,
                format_args!("version {version} registration without endpoints"),
            ));
        }
        Ok(broker)
    }
}

/// A topic's replica assignment, at `/brokers/topics/[topic]` (written by Kafka).
///
/// ```json
/// {"version":1,"partitions":{"0":[0,1],"1":[1,0]}}
/// ```
/// Partition -> replica broker ids, preferred leader first. Decoding accepts versions 1-3
/// and ignores the fields later versions add (`adding_replicas`, `removing_replicas`,
/// `topic_id`); encoding writes version 1 with partitions in numeric order.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TopicRegistration {
    /// Replica broker ids of each partition.
    pub partitions: BTreeMap<Partition, Vec<BrokerId>>,
}

impl TopicRegistration {
    /// The topic's partitions in numeric order.
    pub fn partitions(&self) -> impl Iterator<Item = Partition> + '_ {
        self.partitions.keys().copied()
    }

    /// The replicas of `partition`, preferred leader first.
    pub fn replicas(&self, partition: Partition) -> Option<&[BrokerId]> {
        self.partitions.get(&partition).map(Vec::as_slice)
    }
}

impl ZnodeData for TopicRegistration {
    const FORMAT: &'static str = "Kafka topic-registration JSON (versions 1-3)";

    fn encode(&self) -> Vec<u8> {
        let partitions = self.partitions.iter().map(|(p, replicas)| {
            let ids: Vec<i32> = replicas.iter().map(|b| b.0).collect();
            (p, ids)
        });
        JsonObject::versioned(1).raw("partitions", &JsonObject::map(partitions)).finish().into_bytes()
    }

    fn decode(path: &str, bytes: &[u8]) -> Result<Self, DecodeError> {
        decode_json::<Self>(path, bytes, 1..=3).map(|(_, registration)| registration)
    }
}

/// A named snapshot of a consumer group's committed offsets, Squall's own, at
/// `/consumers/[group]/squall-snapshots/[name]` (Kafka's tools ignore children they do not
/// know), written by `squall offsets snapshot` and read back by `reset --from-snapshot` to
/// replay data:
///
/// ```json
/// {"version":1,"created_ms":1700000000000,"offsets":{"clicks":{"0":42,"1":17}}}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct OffsetSnapshot {
    /// When it was taken, milliseconds since the epoch.
    pub created_ms: u64,
    /// Topic -> partition -> committed offset.
    pub offsets: BTreeMap<String, BTreeMap<Partition, OffsetData>>,
}

impl<'de> Deserialize<'de> for OffsetData {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let offset = i64::deserialize(deserializer)?;
        OffsetData::new(offset).map_err(de::Error::custom)
    }
}

impl ZnodeData for OffsetSnapshot {
    const FORMAT: &'static str = "offset-snapshot v1 JSON";

    fn encode(&self) -> Vec<u8> {
        let topics = self.offsets.iter().map(|(topic, partitions)| {
            let inner = JsonObject::map(partitions.iter().map(|(p, o)| (p.get(), o.get())));
            (serde_json::Value::String(topic.clone()).to_string(), inner)
        });
        let mut offsets = String::from("{");
        for (i, (topic, inner)) in topics.enumerate() {
            if i > 0 {
                offsets.push(',');
            }
            offsets.push_str(&topic);
            offsets.push(':');
            offsets.push_str(&inner);
        }
        offsets.push('}');
        JsonObject::versioned(1)
            .field("created_ms", self.created_ms)
            .raw("offsets", &offsets)
            .finish()
            .into_bytes()
    }

    fn decode(path: &str, bytes: &[u8]) -> Result<Self, DecodeError> {
        decode_json::<Self>(path, bytes, 1..=1).map(|(_, snapshot)| snapshot)
    }
}
