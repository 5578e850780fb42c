//! `squall`: the one user-facing command, in Storm's shape.
//!
//! Verbs: `local` (run a topology in this process), `nimbus` and `supervisor` (the daemons),
//! `worker` (what a supervisor launches for one slot), and the operator verbs over nimbus's API
//! ([`ops`]): `submit`, `list`, `kill`, `activate`, `deactivate`, `rebalance`, `errors`; `replay` ([`replay`]); and
//! `offsets` ([`offsets`]) for consumer groups.

// Async code: `tokio::time::Instant`, never std's (see clippy.toml).
#![deny(clippy::disallowed_types)]

mod config;
mod daemons;
mod local;
mod logging;
mod logs;
mod offsets;
mod ops;
mod replay;

/// Tuples are allocated on one executor thread and freed on another; mimalloc handles that far
/// better than glibc malloc (worker benchmark: +20-40% throughput). Users' own worker binaries
/// should do the same.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Squall: a Storm-style stream processor that ingests Kafka through the ZooKeeper consumer registry.
#[derive(Debug, Parser)]
#[command(name = "squall", version, about)]
struct Cli {
    #[command(flatten)]
    log: logging::LogArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a topology in this process, with nothing else installed.
    Local(local::LocalCommand),
    /// Run nimbus: the HTTP API, topology code, kill and rebalance transitions.
    Nimbus(daemons::DaemonArgs),
    /// Run a supervisor: register, sync assignments and code, run and watch workers.
    Supervisor(daemons::DaemonArgs),
    /// Run one worker of a topology on one slot (launched by the supervisor).
    Worker(worker::cli::WorkerCommand),
    /// Check a topology file, upload it (and a worker binary) to nimbus and start it.
    Submit(ops::SubmitCommand),
    /// List the running topologies.
    List(ops::ClientArgs),
    /// List every nimbus and which one leads.
    NimbusSummary(ops::ClientArgs),
    /// Deactivate a topology's spouts, wait, then remove the topology.
    Kill(ops::KillCommand),
    /// Let a topology's spouts emit.
    Activate(ops::NameCommand),
    /// Pause a topology's spouts.
    Deactivate(ops::NameCommand),
    /// Move a topology's executors, optionally to a new worker count or parallelism.
    Rebalance(ops::RebalanceCommand),
    /// Show the errors a topology's components reported, newest first.
    Errors(ops::NameCommand),
    /// Print the last lines of a topology's worker logs (of one component's workers with
    /// --component), read from the supervisors' log viewers; --follow keeps printing.
    Logs(logs::LogsCommand),
    /// Change log levels of a running topology's workers without a restart, for a while or
    /// until changed again (Storm's set_log_level): LOGGER=LEVEL[:TIMEOUT-SECS].
    SetLogLevel(ops::SetLogLevelCommand),
    /// Replay a running topology's Kafka input from an earlier position: deactivate, wait for
    /// the group to empty, reset its offsets, activate.
    Replay(Box<replay::ReplayCommand>),
    /// Inspect, export, reset and snapshot a consumer group's offsets (ZooKeeper and Kafka).
    Offsets(offsets::OffsetsCommand),
}

fn main() -> ExitCode {
    // Whatever this process or a library writes is its owner's alone (0600 / 0700).
    cluster_state::files::restrict_umask();
    let cli = Cli::parse();
    // The daemons' logs are their record; a command's output is its result (and `squall local`
    // prints its own progress), so commands log warnings only unless `-v`.
    let role = match cli.command {
        Some(Command::Nimbus(_) | Command::Supervisor(_) | Command::Worker(_)) => logging::Role::Daemon,
        _ => logging::Role::Command,
    };
    match &cli.command {
        Some(Command::Worker(cmd)) => {
            logging::init_worker(&cli.log, &cluster_state::launch::WorkerLaunch::from(cmd.clone()))
        }
        _ => logging::init(&cli.log, role),
    }
    match cli.command {
        Some(Command::Local(cmd)) => report("local", local::execute(cmd)),
        Some(Command::Nimbus(args)) => report("nimbus", daemons::nimbus(args)),
        Some(Command::Supervisor(args)) => report("supervisor", daemons::supervisor(args)),
        Some(Command::Worker(cmd)) => {
            // One registry for the process: the worker's and its components' metrics.
            let metrics = prometheus::Registry::new();
            report(
                "worker",
                components(&metrics)
                    .and_then(|c| worker::cli::execute(cmd, &c, &metrics).map_err(|e| e.to_string())),
            )
        }
        Some(Command::Submit(cmd)) => {
            report("submit", components(&prometheus::Registry::new()).and_then(|c| ops::submit(cmd, &c)))
        }
        Some(Command::List(args)) => report("list", ops::list(args)),
        Some(Command::NimbusSummary(args)) => report("nimbus-summary", ops::nimbus_summary(args)),
        Some(Command::Kill(cmd)) => report("kill", ops::kill(cmd)),
        Some(Command::Activate(cmd)) => report("activate", ops::set_active(cmd, true)),
        Some(Command::Deactivate(cmd)) => report("deactivate", ops::set_active(cmd, false)),
        Some(Command::Rebalance(cmd)) => report("rebalance", ops::rebalance(cmd)),
        Some(Command::Errors(cmd)) => report("errors", ops::errors(cmd)),
        Some(Command::Logs(cmd)) => report("logs", logs::logs(cmd)),
        Some(Command::SetLogLevel(cmd)) => report("set-log-level", ops::set_log_level(cmd)),
        Some(Command::Replay(cmd)) => report("replay", replay::replay(*cmd)),
        Some(Command::Offsets(cmd)) => report("offsets", offsets::execute(cmd)),
        None => ExitCode::SUCCESS,
    }
}

/// Exits with the error printed, naming the verb.
fn report(verb: &str, result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("squall {verb}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The components a topology file can name: the worker's built-ins and the Kafka spout and bolt,
/// whose metrics go to `metrics`.
fn components(metrics: &prometheus::Registry) -> Result<worker::Registry, String> {
    let mut components = worker::Registry::with_builtins();
    kafka_spout::register(&mut components, metrics)
        .map_err(|e| format!("cannot register the Kafka components: {e}"))?;
    Ok(components)
}
