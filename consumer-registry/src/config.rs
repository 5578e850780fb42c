//! How a member behaves, with Kafka 0.8 consumer config names and defaults.

use std::time::Duration;

use cluster_state::coord::SessionOptions;
use serde::{Deserialize, Serialize};

use crate::assign::Strategy;
use crate::error::{Error, Result};

/// Where to start a partition that has no committed offset (Kafka's `auto.offset.reset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OffsetReset {
    /// The oldest offset the broker still has.
    Smallest,
    /// The next offset to be written: only new messages.
    #[default]
    Largest,
}

/// A member's configuration. Field names are Kafka's consumer config keys with `.` as `_`;
/// defaults are Kafka 0.8's unless noted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryConfig {
    /// `zookeeper.session.timeout.ms`: a member that does not heartbeat for this long loses its
    /// id and owner nodes, and the others take its partitions over.
    pub zookeeper_session_timeout_ms: u64,
    /// `zookeeper.connection.timeout.ms`: how long to wait for a session to be established.
    pub zookeeper_connection_timeout_ms: u64,
    /// `partition.assignment.strategy`: `range` or `roundrobin`.
    pub partition_assignment_strategy: Strategy,
    /// `rebalance.max.retries`: how many times a claim of partitions still owned by another
    /// member waits `rebalance_backoff_ms` for that owner to let go before the rebalance gives
    /// up (the periodic reconcile tries again). A wait cut short because the owner node went
    /// does not count.
    pub rebalance_max_retries: u32,
    /// `rebalance.backoff.ms`: the longest wait per retry above.
    pub rebalance_backoff_ms: u64,
    /// `auto.offset.reset`: where to start a partition without a committed offset.
    pub auto_offset_reset: OffsetReset,
    /// Squall's: whether a committed offset that is not a decimal number also follows
    /// `auto_offset_reset` (counted and logged). Off: it is an error the caller must handle.
    pub reset_on_corrupt_offset: bool,
    /// Squall's: how long the caller may take to stop, drain and commit partitions it is losing
    /// before their owner nodes are deleted anyway. Storm's `topology.message.timeout.secs`
    /// (30 s), the longest a tuple may be in flight.
    pub revoke_timeout_ms: u64,
    /// Squall's: how long to gather a burst of membership or metadata changes into one
    /// rebalance. Kept short: every member of the group pays it once per rebalance.
    pub rebalance_coalesce_ms: u64,
    /// Squall's: how often to re-read everything and re-claim partitions left without an owner,
    /// in case a change was missed.
    pub reconcile_interval_ms: u64,
    /// How often to ask the caller's partition source for partition counts of topics not
    /// registered in ZooKeeper. storm-kafka's `ZkHosts.refreshFreqSecs` (60 s).
    pub partition_refresh_interval_ms: u64,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            zookeeper_session_timeout_ms: 6000,
            zookeeper_connection_timeout_ms: 6000,
            partition_assignment_strategy: Strategy::Range,
            rebalance_max_retries: 4,
            rebalance_backoff_ms: 2000,
            auto_offset_reset: OffsetReset::Largest,
            reset_on_corrupt_offset: false,
            revoke_timeout_ms: 30_000,
            rebalance_coalesce_ms: 10,
            reconcile_interval_ms: 10_000,
            partition_refresh_interval_ms: 60_000,
        }
    }
}

impl RegistryConfig {
    /// Checks the values once, at startup; the error names the key.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("zookeeper_session_timeout_ms", self.zookeeper_session_timeout_ms),
            ("zookeeper_connection_timeout_ms", self.zookeeper_connection_timeout_ms),
            ("rebalance_backoff_ms", self.rebalance_backoff_ms),
            ("revoke_timeout_ms", self.revoke_timeout_ms),
            ("reconcile_interval_ms", self.reconcile_interval_ms),
            ("partition_refresh_interval_ms", self.partition_refresh_interval_ms),
        ];
        if let Some((key, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(Error::InvalidConfig { key, reason: "must be greater than 0".into() });
        }
        // ZooKeeper negotiates between 2 and 20 ticks; beyond a minute is surely a unit mistake.
        if self.zookeeper_session_timeout_ms > 600_000 {
            return Err(Error::InvalidConfig {
                key: "zookeeper_session_timeout_ms",
                reason: "must be at most 600000 (10 minutes); is it in seconds?".into(),
            });
        }
        Ok(())
    }

    /// The session options for a member's ZooKeeper session.
    pub fn session_options(&self) -> SessionOptions {
        SessionOptions {
            session_timeout: Duration::from_millis(self.zookeeper_session_timeout_ms),
            connect_timeout: Duration::from_millis(self.zookeeper_connection_timeout_ms),
            detached: false,
        }
    }

    pub(crate) fn backoff(&self) -> Duration {
        Duration::from_millis(self.rebalance_backoff_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_kafkas() {
        let config = RegistryConfig::default();
        assert_eq!(config.rebalance_max_retries, 4);
        assert_eq!(config.rebalance_backoff_ms, 2000);
        assert_eq!(config.zookeeper_session_timeout_ms, 6000);
        assert_eq!(config.auto_offset_reset, OffsetReset::Largest);
        assert_eq!(config.partition_assignment_strategy, Strategy::Range);
        config.validate().unwrap();
    }

    #[test]
    fn parses_partial_json_and_rejects_unknown_keys() {
        let config: RegistryConfig = serde_json::from_str(
            r#"{"auto_offset_reset":"smallest","partition_assignment_strategy":"roundrobin"}"#,
        )
        .unwrap();
        assert_eq!(config.auto_offset_reset, OffsetReset::Smallest);
        assert_eq!(config.partition_assignment_strategy, Strategy::RoundRobin);
        assert_eq!(config.rebalance_max_retries, 4);
        let err = serde_json::from_str::<RegistryConfig>(r#"{"rebalance_backoff":5}"#).unwrap_err();
        assert!(err.to_string().contains("rebalance_backoff"), "{err}");
    }

    #[test]
    fn validation_names_the_key() {
        let config = RegistryConfig { rebalance_backoff_ms: 0, ..RegistryConfig::default() };
        let err = config.validate().unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { key: "rebalance_backoff_ms", .. }), "{err}");
    }
}
