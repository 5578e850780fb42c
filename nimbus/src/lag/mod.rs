//! Consumer-group lag as a property of the group, not of a running spout: nimbus evaluates
//! every group under `/consumers` with Burrow's rules, whether or not a topology runs, and
//! exports the result under kafka_exporter's, Burrow's and Squall's metric names.
//!
//! Layout:
//! - [`evaluator`]: Burrow's rules as pure functions (partition and group status, codes).
//! - [`window`]: the windows of commits and log ends kept between passes, and the pure step
//!   from one pass's reads to a report.
//! - [`metrics`]: the report as Prometheus series, rendered at scrape time.
//! - [`monitor`]: the task that reads ZooKeeper and the brokers every interval.
//! - [`view`]: the consumer-group pages of the API (verdicts, owners, reset dry runs).

pub mod evaluator;
pub mod metrics;
pub mod monitor;
pub mod view;
pub mod window;

pub use evaluator::{Rules, Status};
pub use metrics::LagMetrics;
pub use monitor::{LagMonitor, LagSettings};
