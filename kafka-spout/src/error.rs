//! The one error type of the Kafka spout and producer bolt.

use cluster_state::ids::IdError;
use rdkafka::error::KafkaError;

/// What the spout and the bolt can fail with. [`Error::is_retryable`] says which ones may pass.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value is wrong; names the key.
    #[error("invalid kafka config {key}: {reason}")]
    InvalidConfig { key: String, reason: String },
    /// A topic, group or consumer id is not valid.
    #[error(transparent)]
    InvalidId(#[from] IdError),
    /// librdkafka refused a client configuration or a call that concerns no single partition.
    #[error("kafka client: {context}: {source}")]
    Client {
        context: &'static str,
        #[source]
        source: KafkaError,
    },
    /// A call about one partition failed (assign, seek, watermarks).
    #[error("kafka {topic}/{partition}: {context}: {source}")]
    Partition {
        topic: String,
        partition: i32,
        context: &'static str,
        #[source]
        source: KafkaError,
    },
    /// A blocking librdkafka call did not answer in time (it may still complete).
    #[error("kafka client: {context}: no answer within {after_ms} ms")]
    TimedOut { context: &'static str, after_ms: u64 },
    /// The consumer registry (ZooKeeper) failed.
    #[error(transparent)]
    Registry(#[from] consumer_registry::Error),
    /// A produce to `topic` failed.
    #[error("kafka producer: writing to {topic}: {source}")]
    Produce {
        topic: String,
        #[source]
        source: KafkaError,
    },
    /// A tuple lacks a field the bolt was configured to write.
    #[error("kafka producer: tuple has no field {field:?}")]
    MissingField { field: String },
    /// Registering metric families failed (a name registered twice on one registry).
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The spout's coordination thread could not start or stopped.
    #[error("kafka spout {component}/{task}: {reason}")]
    Task { component: String, task: u32, reason: String },
}

impl Error {
    /// Whether the same call may succeed if repeated.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Registry(e) => e.is_retryable(),
            Error::Client { source, .. }
            | Error::Partition { source, .. }
            | Error::Produce { source, .. } => source.rdkafka_error_code().is_some_and(|c| {
                use rdkafka::types::RDKafkaErrorCode as C;
                matches!(
                    c,
                    C::OperationTimedOut
                        | C::RequestTimedOut
                        | C::BrokerTransportFailure
                        | C::AllBrokersDown
                        | C::QueueFull
                        | C::LeaderNotAvailable
                        | C::NotLeaderForPartition
                        | C::NetworkException
                )
            }),
            Error::TimedOut { .. } => true,
            Error::InvalidConfig { .. }
            | Error::InvalidId(_)
            | Error::MissingField { .. }
            | Error::Metrics(_)
            | Error::Task { .. } => false,
        }
    }
}

/// Result of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
