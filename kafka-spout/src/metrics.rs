//! Prometheus metrics of the Kafka spouts and producer bolts of a process, registered once on
//! the caller's registry and shared by every task. Labels: component, topic, partition; the
//! consumer-group view (committed offset, log-end offset, lag, Burrow's lag status) is labelled
//! group, topic, partition, as Kafka's tools and Burrow show it.

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

/// The spout's metric families.
#[derive(Debug, Clone)]
pub struct SpoutMetrics {
    pub(crate) emitted: IntCounterVec,
    pub(crate) acked: IntCounterVec,
    pub(crate) failed: IntCounterVec,
    pub(crate) replayed: IntCounterVec,
    pub(crate) given_up: IntCounterVec,
    pub(crate) stale_acks: IntCounterVec,
    pub(crate) out_of_range: IntCounterVec,
    /// Fetches given back unemitted because the ownership lease had run out.
    pub(crate) given_back: IntCounterVec,
    /// Offsets a fetch passed over between two messages of a partition.
    pub(crate) skipped: IntCounterVec,
    /// Seeks back sought again because the fetch resumed past them.
    pub(crate) seeks_repeated: IntCounterVec,
    pub(crate) committed_offset: IntGaugeVec,
    pub(crate) log_end_offset: IntGaugeVec,
    pub(crate) lag: IntGaugeVec,
    /// Burrow's status of the partition ([`consumer_registry::lag::LagStatus::code`]).
    pub(crate) lag_status: IntGaugeVec,
    pub(crate) paused: IntGaugeVec,
    /// Commits to and reads from the group coordinator that failed or timed out
    /// (`offsets_storage: kafka | dual`), by group and operation (`commit`, `fetch`).
    pub(crate) kafka_offset_failures: IntCounterVec,
}

/// The producer bolt's metric families.
#[derive(Debug, Clone)]
pub struct BoltMetrics {
    pub(crate) written: IntCounterVec,
    pub(crate) write_errors: IntCounterVec,
    pub(crate) producer_restarts: IntCounterVec,
}

const TP: &[&str] = &["component", "topic", "partition"];
const GTP: &[&str] = &["group", "topic", "partition"];

fn counter(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntCounterVec> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(c.clone()))?;
    Ok(c)
}

fn gauge(registry: &Registry, name: &str, help: &str) -> prometheus::Result<IntGaugeVec> {
    let g = IntGaugeVec::new(Opts::new(name, help), GTP)?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

impl SpoutMetrics {
    /// Creates the families and registers them on `registry` (once per registry).
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        Ok(SpoutMetrics {
            emitted: counter(
                registry,
                "squall_spout_emitted_total",
                "Kafka messages emitted as new tuples",
                TP,
            )?,
            acked: counter(
                registry,
                "squall_spout_acked_total",
                "Kafka spout tuples whose tree completed",
                TP,
            )?,
            failed: counter(
                registry,
                "squall_spout_failed_total",
                "Kafka spout tuples that failed or timed out",
                TP,
            )?,
            replayed: counter(
                registry,
                "squall_spout_replayed_total",
                "Failed Kafka messages emitted again",
                TP,
            )?,
            given_up: counter(
                registry,
                "squall_spout_given_up_total",
                "Failed Kafka messages dropped after the last retry",
                TP,
            )?,
            stale_acks: counter(
                registry,
                "squall_spout_stale_acks_total",
                "Acks and fails for partitions no longer owned or messages not outstanding (ignored)",
                &["component"],
            )?,
            out_of_range: counter(
                registry,
                "squall_spout_offset_out_of_range_total",
                "Offsets out of the broker's range, reset by auto.offset.reset (an answer at an offset the broker had just served up to is first fetched again, 3 times at most)",
                TP,
            )?,
            given_back: counter(
                registry,
                "squall_spout_fetches_given_back_total",
                "Fetched batches of the partition given back unemitted because the ownership lease had run out (the process stopped or stalled past its ZooKeeper session); the partition is read again from the batch's first offset",
                TP,
            )?,
            skipped: counter(
                registry,
                "squall_spout_offsets_skipped_total",
                "Offsets the fetch passed over between two messages of the partition: compacted away, transaction markers, or missing from the broker's log; the spout commits past them",
                TP,
            )?,
            seeks_repeated: counter(
                registry,
                "squall_spout_seeks_repeated_total",
                "Seeks back after a fetch given back (the ownership lease had run out) that the fetch resumed past (librdkafka dropped the asynchronous seek): the partition was sought again before anything more was emitted from it, 3 times in a row at most",
                TP,
            )?,
            committed_offset: gauge(
                registry,
                "squall_spout_committed_offset",
                "The offset last committed (next to consume), to ZooKeeper or with offsets_storage kafka to Kafka",
            )?,
            log_end_offset: gauge(registry, "squall_spout_log_end_offset", "The partition's high watermark")?,
            lag: gauge(registry, "squall_spout_lag", "Log-end offset minus committed offset")?,
            lag_status: gauge(
                registry,
                "squall_spout_lag_status",
                "Burrow's status of the partition over its last 10 commits: 0 OK, 1 WARN, 2 STOP, 3 STALL, 4 REWIND",
            )?,
            paused: {
                let g = IntGaugeVec::new(
                    Opts::new(
                        "squall_spout_paused",
                        "1 while the task's ZooKeeper session is disconnected and it emits nothing",
                    ),
                    &["component", "task"],
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            kafka_offset_failures: counter(
                registry,
                "squall_spout_kafka_offset_failures_total",
                "Offset commits to and reads from the Kafka group coordinator that failed or timed out (offsets_storage kafka or dual)",
                &["group", "operation"],
            )?,
        })
    }
}

impl BoltMetrics {
    /// Creates the families and registers them on `registry` (once per registry).
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        Ok(BoltMetrics {
            written: counter(
                registry,
                "squall_kafka_bolt_written_total",
                "Tuples written to Kafka and acknowledged by the broker",
                &["component", "topic"],
            )?,
            write_errors: counter(
                registry,
                "squall_kafka_bolt_write_errors_total",
                "Writes the broker refused or that timed out (the input tuple is failed)",
                &["component", "topic"],
            )?,
            producer_restarts: counter(
                registry,
                "squall_kafka_bolt_producer_restarts_total",
                "Producers replaced after a fatal error (their writes in flight were failed, to replay)",
                &["component", "topic"],
            )?,
        })
    }
}
