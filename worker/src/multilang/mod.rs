//! Components in any language: Storm's multilang protocol (ShellBolt, ShellSpout).
//!
//! A shell component is a subprocess speaking JSON over stdio ([`protocol`]); pystorm and
//! streamparse components run unchanged. Each task has its own subprocess, started without a
//! shell with the topology's resources dir as working directory ([`process`]).
//!
//! - [`ShellBolt`] is asynchronous like Storm's: `execute` queues the tuple for the subprocess
//!   and returns; the subprocess's emits, acks and fails are applied on the executor thread
//!   between inputs and whenever the subprocess writes (the executor waits on the bolt's
//!   [`Bolt::waker`](crate::Bolt::waker) as well as its inbox). At most
//!   `topology.shellbolt.max.pending` tuples wait to be written: a slow subprocess holds its
//!   executor, whose bounded inbox holds the spouts (backpressure, bounded memory).
//! - [`ShellSpout`] is synchronous like Storm's: `next`, `ack`, `fail`, `activate`,
//!   `deactivate` each wait for the subprocess's `sync`. Emits made outside `next` (pystorm's
//!   reliable spout replays in `fail`) are emitted at the next `next_tuple`.
//! - Liveness: a bolt sends a heartbeat tuple every second and gives up on a subprocess that
//!   wrote nothing for `topology.subprocess.timeout.secs` (default: Storm's
//!   `supervisor.worker.timeout.secs`, 30); a spout gives up when a command gets no `sync` in
//!   that time. A subprocess that exits or writes anything but the protocol is given up at once.
//!   Giving up reports an error to `/storm/errors` naming the component, the task, the command
//!   and, for garbage, the line of output; the subprocess is killed, the bolt's pending inputs
//!   fail (their spouts replay them), and a new subprocess starts after a backoff (1 s doubling
//!   to 30 s, back to 1 s once one ran a minute). Storm kills the whole worker instead; here the
//!   other executors of the worker carry on.

mod bolt;
pub mod process;
pub mod protocol;
mod spout;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Select, TryRecvError};

pub use bolt::ShellBolt;
pub use spout::ShellSpout;

use crate::component::{OutputDeclarer, TopologyContext};
use crate::tuple::Fields;
use process::{Failure, ShellProcess};
use protocol::Context;

/// Storm's default of `supervisor.worker.timeout.secs`, the subprocess timeout when
/// `topology.subprocess.timeout.secs` is not set (as Storm's ShellBolt does).
pub const DEFAULT_SUBPROCESS_TIMEOUT_SECS: u64 = 30;
/// How often a shell bolt sends a heartbeat tuple (Storm: every second).
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
const RESTART_BACKOFF_MIN: Duration = Duration::from_secs(1);
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A subprocess that ran this long resets the backoff.
const HEALTHY_AFTER: Duration = Duration::from_secs(60);

/// A shell component as the topology file declares it (Flux's `FluxShellBolt` /
/// `FluxShellSpout`).
#[derive(Debug, Clone, PartialEq)]
pub struct ShellSpec {
    /// Program and arguments, run without a shell.
    pub command: Vec<String>,
    /// Merged over the topology config in the handshake's `conf` (Flux's component config).
    pub component_config: serde_json::Map<String, serde_json::Value>,
    /// Declared output streams.
    pub outputs: Vec<(String, Fields)>,
    /// The working directory: the topology's resources dir.
    pub working_dir: PathBuf,
}

impl ShellSpec {
    fn declare(&self, declarer: &mut OutputDeclarer) {
        for (stream, fields) in &self.outputs {
            declarer.declare_stream(stream, fields.clone());
        }
    }
}

/// What a shell bolt and a shell spout share: the subprocess and its restarts.
#[derive(Debug)]
struct Shell {
    kind: &'static str,
    spec: ShellSpec,
    context: Option<TopologyContext>,
    process: Option<ShellProcess>,
    restart_at: Instant,
    backoff: Duration,
    timeout: Duration,
    write_queue: usize,
}

impl Shell {
    fn new(kind: &'static str, spec: ShellSpec) -> Self {
        Shell {
            kind,
            spec,
            context: None,
            process: None,
            restart_at: Instant::now(),
            backoff: RESTART_BACKOFF_MIN,
            timeout: Duration::from_secs(DEFAULT_SUBPROCESS_TIMEOUT_SECS),
            write_queue: 100,
        }
    }

    fn set_context(&mut self, context: &TopologyContext) {
        self.timeout = Duration::from_secs(
            context.config.subprocess_timeout_secs.unwrap_or(DEFAULT_SUBPROCESS_TIMEOUT_SECS).max(1),
        );
        self.write_queue = context.config.shellbolt_max_pending.max(1) as usize;
        self.context = Some(context.clone());
    }

    /// `shell bolt "split" task 3 (["python3", "split.py"])`.
    fn label(&self) -> String {
        match &self.context {
            Some(c) => format!(
                "shell {} {:?} task {} ({:?})",
                self.kind,
                c.component_id.as_str(),
                c.task_id,
                self.spec.command
            ),
            None => format!("shell {} ({:?})", self.kind, self.spec.command),
        }
    }

    /// Starts the subprocess if none runs and the backoff allows; `Err` says why it did not.
    fn ensure_running(&mut self, waker: Option<crossbeam_channel::Sender<()>>) -> Result<bool, String> {
        if self.process.is_some() {
            return Ok(true);
        }
        if Instant::now() < self.restart_at {
            return Ok(false);
        }
        let Some(ctx) = &self.context else { return Ok(false) };
        let mut conf = match serde_json::to_value(&*ctx.config) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        };
        conf.insert("topology.name".into(), ctx.topology_name.clone().into());
        conf.insert("supervisor.worker.timeout.secs".into(), self.timeout.as_secs().into());
        conf.extend(self.spec.component_config.iter().map(|(k, v)| (k.clone(), v.clone())));
        let task_component = ctx
            .tasks_by_component
            .iter()
            .flat_map(|(c, tasks)| tasks.iter().map(move |t| (t.0.to_string(), c.as_str())))
            .collect();
        let context = Context {
            task_component,
            taskid: ctx.task_id.0,
            componentid: ctx.component_id.as_str(),
            streams: self.spec.outputs.iter().map(|(s, _)| s.as_str()).collect(),
            stream_outputfields: self.spec.outputs.iter().map(|(s, f)| (s.as_str(), f.names())).collect(),
        };
        let label = self.label();
        match ShellProcess::start(&self.spec, &conf, context, &label, self.write_queue, self.timeout, waker) {
            Ok(p) => {
                tracing::info!(component = %label, pid = p.pid, "shell component started");
                self.process = Some(p);
                Ok(true)
            }
            Err(f) => {
                let retry = self.schedule_restart(Duration::ZERO);
                Err(format!("{label}: cannot start: {}; retrying in {retry:?}", describe(&f)))
            }
        }
    }

    /// Kills the subprocess; returns the error text to report (none when none ran).
    fn give_up(&mut self, failure: Failure) -> Option<String> {
        let mut p = self.process.take()?;
        if matches!(failure, Failure::Exited | Failure::StdinClosed) {
            // Its exit status and last words, if it is on its way out.
            p.settle(Duration::from_millis(200));
        }
        let ended = p.describe_end();
        p.kill();
        let retry = self.schedule_restart(p.started.elapsed());
        Some(format!(
            "{}: {}{ended}; subprocess {} killed, restarting in {retry:?}",
            self.label(),
            describe(&failure),
            p.pid
        ))
    }

    fn schedule_restart(&mut self, ran: Duration) -> Duration {
        if ran >= HEALTHY_AFTER {
            self.backoff = RESTART_BACKOFF_MIN;
        }
        let wait = self.backoff;
        self.restart_at = Instant::now() + wait;
        self.backoff = (self.backoff * 2).min(RESTART_BACKOFF_MAX);
        wait
    }

    fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }
}

fn describe(f: &Failure) -> String {
    match f {
        Failure::Spawn(r) => r.clone(),
        Failure::Garbage { line, reason } => format!("wrote garbage at line {line} of its output: {reason}"),
        Failure::Exited => "the subprocess exited".into(),
        Failure::Timeout(t) => format!("subprocess heartbeat timeout: nothing from it for {}s", t.as_secs()),
        Failure::StdinClosed => "the subprocess closed its input".into(),
        Failure::Protocol(r) => format!("protocol error: {r}"),
        Failure::Startup(f, ended) => format!("{}{ended}", describe(f)),
    }
}

/// The bolt executor's wait when some of its bolts have wakers: the next batch, or a wake-up
/// (returned as a timeout, after which the executor polls its bolts).
pub(crate) fn recv_or_wake<T>(
    inbox: &Receiver<T>,
    wakers: &[Receiver<()>],
    timeout: Duration,
) -> Result<T, RecvTimeoutError> {
    let mut sel = Select::new();
    sel.recv(inbox);
    for w in wakers {
        sel.recv(w);
    }
    match sel.ready_timeout(timeout) {
        Ok(0) => match inbox.try_recv() {
            Ok(b) => Ok(b),
            Err(TryRecvError::Disconnected) => Err(RecvTimeoutError::Disconnected),
            Err(TryRecvError::Empty) => Err(RecvTimeoutError::Timeout),
        },
        Ok(i) => {
            if let Some(w) = wakers.get(i - 1) {
                while w.try_recv().is_ok() {}
            }
            Err(RecvTimeoutError::Timeout)
        }
        Err(_) => Err(RecvTimeoutError::Timeout),
    }
}

/// What a `metrics` command adds to its count: Storm's `CountShellMetric` takes a whole number
/// (`params`), or counts one when there is none.
fn count_of(params: &serde_json::Value) -> Result<u64, String> {
    match params {
        serde_json::Value::Null => Ok(1),
        serde_json::Value::Number(n) => {
            n.as_u64().ok_or_else(|| format!("params {n} is not a whole number of at least 0"))
        }
        other => {
            Err(format!("params must be a whole number (Storm's CountShellMetric) or absent, not {other}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::count_of;
    use serde_json::json;

    #[test]
    fn a_metrics_command_counts_a_whole_number_or_one() {
        assert_eq!(count_of(&json!(null)), Ok(1));
        assert_eq!(count_of(&json!(12)), Ok(12));
        for bad in [json!(-1), json!(1.5), json!("3"), json!({"n": 1})] {
            assert!(count_of(&bad).is_err(), "{bad}");
        }
    }
}
