//! librdkafka's callbacks for the spout's consumers: its log lines and errors go to `tracing`
//! with the task they concern.
//!
//! The spout assigns partitions itself and keeps offsets in ZooKeeper, but librdkafka insists
//! on a `group.id` for `assign` and then looks up a group coordinator it never uses. Its
//! complaints about that coordinator (GroupCoordinator / FindCoordinator errors on brokers
//! without one, or while it moves) are noise here and go to debug; everything else keeps its
//! level.

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;

/// The consumer of one spout task.
pub(crate) type TaskConsumer = rdkafka::consumer::BaseConsumer<SpoutContext>;

/// Who a consumer's log lines are about.
#[derive(Debug, Clone)]
pub(crate) struct SpoutContext {
    pub(crate) component: String,
    pub(crate) task: u32,
}

/// Whether a librdkafka message is about the group coordinator the spout does not use.
fn about_the_group_coordinator(text: &str) -> bool {
    ["GroupCoordinator", "FindCoordinator", "Coordinator"].iter().any(|word| text.contains(word))
}

impl ClientContext for SpoutContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        let (component, task) = (self.component.as_str(), self.task);
        if about_the_group_coordinator(message) || about_the_group_coordinator(facility) {
            tracing::debug!(component, task, facility, "librdkafka: {message}");
            return;
        }
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(component, task, facility, "librdkafka: {message}")
            }
            RDKafkaLogLevel::Warning => tracing::warn!(component, task, facility, "librdkafka: {message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(component, task, facility, "librdkafka: {message}")
            }
            RDKafkaLogLevel::Debug => tracing::debug!(component, task, facility, "librdkafka: {message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let (component, task) = (self.component.as_str(), self.task);
        if about_the_group_coordinator(reason) {
            tracing::debug!(component, task, %error, "librdkafka: {reason}");
        } else {
            tracing::warn!(component, task, %error, "librdkafka: {reason}");
        }
    }
}

impl ConsumerContext for SpoutContext {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinator_noise_is_recognised() {
        for text in [
            "GroupCoordinator: 127.0.0.1:9092: Connect to ipv4#127.0.0.1:9092 failed",
            "FindCoordinator response error: Broker: Coordinator not available",
        ] {
            assert!(about_the_group_coordinator(text), "{text}");
        }
        assert!(!about_the_group_coordinator("127.0.0.1:9092/1: Connect failed: Connection refused"));
    }
}
