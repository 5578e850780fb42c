//! `squall`: the one user-facing command, in Storm's shape.
//!
//! Verbs so far: `local` (run a topology in this process), `nimbus` and `supervisor` (the
//! daemons) and `worker` (what a supervisor launches for one slot). The others arrive with the
//! issues that build what they drive: `submit`, `kill`, `activate`, `deactivate`, `rebalance`,
//! `list`, `errors` and `offsets`.

mod daemons;
mod local;

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Some(Command::Local(cmd)) => report("local", components().and_then(|c| local::execute(cmd, &c))),
        Some(Command::Nimbus(args)) => report("nimbus", daemons::nimbus(args)),
        Some(Command::Supervisor(args)) => report("supervisor", daemons::supervisor(args)),
        Some(Command::Worker(cmd)) => report(
            "worker",
            components().and_then(|c| worker::cli::execute(cmd, &c).map_err(|e| e.to_string())),
        ),
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

/// The components a topology file can name: the worker's built-ins and the Kafka spout and bolt.
/// Their metrics go to a registry of this process (exported once `/metrics` lands).
fn components() -> Result<worker::Registry, String> {
    let mut components = worker::Registry::with_builtins();
    kafka_spout::register(&mut components, &prometheus::Registry::new())
        .map_err(|e| format!("cannot register the Kafka components: {e}"))?;
    Ok(components)
}
