//! `squall`: the one user-facing command, in Storm's shape.
//!
//! The verbs arrive with the issues that build what they drive: `local`, `nimbus`,
//! `supervisor`, `submit`, `kill`, `activate`, `deactivate`, `rebalance`, `list`, `errors`,
//! `worker` (nimbus and supervisor issue) and `offsets` (operations issue). Until then the
//! command only answers `--help` and `--version`.

use clap::Parser;

/// Squall: a Storm-style stream processor that ingests Kafka through the ZooKeeper consumer registry.
#[derive(Debug, Parser)]
#[command(name = "squall", version, about)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
}
