//! The one error type of the consumer registry.

use cluster_state::coord;
use cluster_state::ids::{GroupId, IdError, Partition, Topic};

use crate::assign::AssignError;

/// What a member or its offset store can fail with. [`Error::is_retryable`] says which ones a
/// caller may simply try again.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A ZooKeeper call failed; the coordination error names the path.
    #[error("consumer group {group}: {source}")]
    Coordination {
        group: GroupId,
        #[source]
        source: coord::Error,
    },
    /// A committed offset is not a decimal number.
    #[error("consumer group {group}: committed offset of {topic}/{partition} at {path} is garbage: {reason}")]
    CorruptOffset { group: GroupId, topic: Topic, partition: Partition, path: String, reason: String },
    /// The assignment strategy refuses the group's subscriptions.
    #[error("consumer group {group}: {source}")]
    Assignment {
        group: GroupId,
        #[source]
        source: AssignError,
    },
    /// An offset that Kafka cannot hold (negative).
    #[error("consumer group {group}: offset {offset} for {topic}/{partition} is negative")]
    NegativeOffset { group: GroupId, topic: Topic, partition: Partition, offset: i64 },
    /// A configuration value is out of range.
    #[error("invalid consumer-registry config {key}: {reason}")]
    InvalidConfig { key: &'static str, reason: String },
    /// An id (consumer id, group) is not a valid path segment.
    #[error(transparent)]
    InvalidId(#[from] IdError),
    /// The member has stopped; its handle can no longer reach ZooKeeper through it.
    #[error("consumer group {group}: member {consumer} has stopped")]
    Stopped { group: GroupId, consumer: String },
}

impl Error {
    /// Whether the same call may succeed if repeated (after a reconnect or a new session).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Coordination { source, .. } => source.is_retryable() || source.is_session_lost(),
            Error::CorruptOffset { .. }
            | Error::Assignment { .. }
            | Error::NegativeOffset { .. }
            | Error::InvalidConfig { .. }
            | Error::InvalidId(_)
            | Error::Stopped { .. } => false,
        }
    }

    pub(crate) fn coord(group: &GroupId) -> impl FnOnce(coord::Error) -> Error + '_ {
        move |source| Error::Coordination { group: group.clone(), source }
    }
}

/// Result of the consumer registry.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_errors_and_messages_name_what_failed() {
        let group = GroupId::new("clicks").unwrap();
        let lost =
            Error::Coordination { group: group.clone(), source: coord::Error::ConnectionLoss { path: None } };
        assert!(lost.is_retryable());
        let expired =
            Error::Coordination { group: group.clone(), source: coord::Error::SessionExpired { path: None } };
        assert!(expired.is_retryable(), "the member opens a new session");
        let exists = Error::Coordination {
            group: group.clone(),
            source: coord::Error::NodeExists { path: "/x".into() },
        };
        assert!(!exists.is_retryable());
        let corrupt = Error::CorruptOffset {
            group,
            topic: Topic::new("t").unwrap(),
            partition: Partition::new(3).unwrap(),
            path: "/consumers/clicks/offsets/t/3".into(),
            reason: "expected a decimal".into(),
        };
        assert!(!corrupt.is_retryable());
        let message = corrupt.to_string();
        for part in ["clicks", "t/3", "/consumers/clicks/offsets/t/3"] {
            assert!(message.contains(part), "{message}");
        }
    }
}
