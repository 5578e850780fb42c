//! How every `squall` process logs: to stderr, through [`RedactingWriter`] (known secret values
//! never reach a log), as plain text or JSON lines.
//!
//! - Colour (ANSI escapes) only when stderr is a terminal: a daemon's or worker's log file, a
//!   pipe or journald gets plain text.
//! - `--log-format json` (or `SQUALL_LOG_FORMAT=json`): one JSON object a line (`timestamp`,
//!   `level`, `target`, `fields`, `spans`), for log shippers. Workers inherit their supervisor's
//!   environment, so `SQUALL_LOG_FORMAT` set for a supervisor reaches its workers too.
//! - Levels: the daemons (`nimbus`, `supervisor`, `worker`) log at info; the operator verbs
//!   (and `local`, which prints its own progress) at warn, so their stdout and stderr carry
//!   their results and problems only. Each `-v` raises the level one step (info, debug,
//!   trace) and then wins over `RUST_LOG`; without `-v`, `RUST_LOG` (an `EnvFilter`
//!   directive) wins over the default.

use std::io::IsTerminal;

use cluster_state::launch::WorkerLaunch;
use cluster_state::secrets::RedactingWriter;
use cluster_state::worker_logs::{self, RotatingFile};
use tracing_subscriber::EnvFilter;

/// The format of log lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines; coloured only on a terminal.
    #[default]
    Plain,
    /// One JSON object a line.
    Json,
}

/// The logging options every verb takes.
#[derive(Debug, Default, clap::Args)]
pub struct LogArgs {
    /// Log line format (`plain` or `json`).
    #[arg(long, global = true, value_enum, env = "SQUALL_LOG_FORMAT", default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
    /// More log output on stderr: `-v` info, `-vv` debug, `-vvv` trace (wins over `RUST_LOG`).
    #[arg(short = 'v', long = "verbose", global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// What kind of process logs: its default level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A long-running process whose log is its record: info.
    Daemon,
    /// A command whose output is its result: warn.
    Command,
}

/// The filter directive: the role's level raised by `verbose` steps; `None` when `RUST_LOG`
/// should decide (no `-v`).
fn level(role: Role, verbose: u8) -> &'static str {
    const LEVELS: [&str; 5] = ["warn", "info", "debug", "trace", "trace"];
    let base = match role {
        Role::Command => 0,
        Role::Daemon => 1,
    };
    LEVELS[(base + usize::from(verbose)).min(LEVELS.len() - 1)]
}

/// Installs the process's subscriber, writing to stderr. Call once, first thing in `main`.
pub fn init(args: &LogArgs, role: Role) {
    install(args, role, || RedactingWriter(std::io::stderr()), std::io::stderr().is_terminal());
}

/// Installs a worker's subscriber: its `worker.log` at Storm's place
/// (`<storm.local.dir>/workers-artifacts/<topology-id>/<port>/worker.log`), size-rotated as the
/// launch says. If that file cannot be opened, stderr (which the supervisor sends to
/// `worker.log.out`) gets the logs and says why.
pub fn init_worker(args: &LogArgs, launch: &WorkerLaunch) {
    let path = worker_logs::worker_log(&launch.local_dir, &launch.topology_id, launch.port);
    let opened = path
        .parent()
        .map_or(Ok(()), cluster_state::files::create_private_dir_all)
        .and_then(|()| RotatingFile::open(&path, launch.log_rotation()));
    match opened {
        Ok(file) => install(args, Role::Daemon, move || RedactingWriter(file.clone()), false),
        Err(e) => {
            init(args, Role::Daemon);
            tracing::error!("cannot open {}, logging to stderr: {e}", path.display());
        }
    }
}

fn install<W>(args: &LogArgs, role: Role, writer: impl Fn() -> W + Send + Sync + 'static, ansi: bool)
where
    W: std::io::Write + 'static,
{
    // The base filter's directives, which runtime log levels (a worker's) are added to.
    let base = if args.verbose > 0 {
        level(role, args.verbose).to_owned()
    } else {
        std::env::var(EnvFilter::DEFAULT_ENV)
            .ok()
            .filter(|d| EnvFilter::try_new(d).is_ok())
            .unwrap_or_else(|| level(role, 0).to_owned())
    };
    let builder = tracing_subscriber::fmt().with_env_filter(EnvFilter::new(&base)).with_writer(writer);
    // Only a worker's levels change at runtime (`set-log-level`); others ignore the handle.
    let reloader = |reload: Box<dyn Fn(EnvFilter) -> Result<(), String> + Send + Sync>| {
        let reloader: worker::log_levels::Reloader = std::sync::Arc::new(move |directives: &[String]| {
            let mut all = vec![base.clone()];
            all.extend(directives.iter().cloned());
            let filter = EnvFilter::try_new(all.join(",")).map_err(|e| e.to_string())?;
            reload(filter)
        });
        worker::log_levels::install(reloader);
    };
    match args.log_format {
        LogFormat::Plain => {
            let builder = builder.with_ansi(ansi).with_filter_reloading();
            let handle = builder.reload_handle();
            reloader(Box::new(move |f| handle.reload(f).map_err(|e| e.to_string())));
            builder.init();
        }
        LogFormat::Json => {
            let builder = builder.json().with_ansi(false).with_filter_reloading();
            let handle = builder.reload_handle();
            reloader(Box::new(move |f| handle.reload(f).map_err(|e| e.to_string())));
            builder.init();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_log_warnings_and_daemons_info_each_v_one_step_more() {
        let table = [
            (Role::Command, 0, "warn"),
            (Role::Command, 1, "info"),
            (Role::Command, 2, "debug"),
            (Role::Daemon, 0, "info"),
            (Role::Daemon, 1, "debug"),
            (Role::Daemon, 3, "trace"),
            (Role::Daemon, 200, "trace"),
        ];
        for (role, verbose, want) in table {
            assert_eq!(level(role, verbose), want, "{role:?} -v x{verbose}");
        }
    }
}
