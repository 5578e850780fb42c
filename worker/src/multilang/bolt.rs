//! [`ShellBolt`]: a bolt whose work a multilang subprocess does (Storm's `ShellBolt`).

use std::collections::HashMap;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use serde_json::Value as Json;

use super::process::{Failure, Incoming};
use super::protocol::{self, BoltTuple, Emit, HEARTBEAT_STREAM, JsonValues, SYSTEM_TASK_ID, ShellMsg, frame};
use super::{HEARTBEAT_EVERY, Shell, ShellSpec};
use crate::collector::BoltCollector;
use crate::component::{Bolt, ComponentError, OutputDeclarer, TopologyContext};
use crate::tuple::{DEFAULT_STREAM, SYSTEM_COMPONENT, Tuple, Values};

/// Messages handled per drain, so a chatty subprocess cannot keep its executor from its inbox.
const DRAIN_LIMIT: usize = 4096;

/// A bolt run by a subprocess speaking Storm's multilang protocol.
#[derive(Debug)]
pub struct ShellBolt {
    shell: Shell,
    /// Inputs the subprocess has not acked or failed yet, by the id it knows them by.
    inputs: HashMap<u64, Tuple>,
    next_id: u64,
    /// Whether a message arrived since the clock was last read.
    heard: bool,
    last_heard: Instant,
    next_heartbeat: Instant,
    wake_tx: Sender<()>,
    wake_rx: Receiver<()>,
    /// Errors from `prepare`, which has no collector: reported at the next chance.
    unreported: Vec<String>,
}

impl ShellBolt {
    /// A shell bolt running `spec`.
    pub fn new(spec: ShellSpec) -> Self {
        let (wake_tx, wake_rx) = crossbeam_channel::bounded(1);
        ShellBolt {
            shell: Shell::new("bolt", spec),
            inputs: HashMap::new(),
            next_id: 1,
            heard: false,
            last_heard: Instant::now(),
            next_heartbeat: Instant::now(),
            wake_tx,
            wake_rx,
            unreported: Vec::new(),
        }
    }

    fn start(&mut self) -> Result<bool, String> {
        let was_running = self.shell.process.is_some();
        let running = self.shell.ensure_running(Some(self.wake_tx.clone()))?;
        if running && !was_running {
            let now = Instant::now();
            self.last_heard = now;
            self.next_heartbeat = now + HEARTBEAT_EVERY;
        }
        Ok(running)
    }

    /// Running, or started now; `false` while it waits for its restart.
    fn ensure_running(&mut self, out: &mut BoltCollector<'_>) -> bool {
        for e in self.unreported.drain(..) {
            out.report_error(e);
        }
        match self.start() {
            Ok(running) => running,
            Err(e) => {
                out.report_error(e);
                false
            }
        }
    }

    /// Queues `bytes` for the subprocess, applying its output while the queue is full.
    fn push(&mut self, mut bytes: Vec<u8>, out: &mut BoltCollector<'_>) {
        loop {
            let Some(p) = self.shell.process.as_ref() else { return };
            match p.try_send(bytes) {
                Ok(None) => return,
                Ok(Some(b)) => bytes = b,
                Err(f) => return self.die(f, out),
            }
            p.wait_ready(HEARTBEAT_EVERY);
            self.drain(out);
            self.check_heartbeat(out);
        }
    }

    /// Applies what the subprocess wrote, without waiting.
    fn drain(&mut self, out: &mut BoltCollector<'_>) {
        for _ in 0..DRAIN_LIMIT {
            let Some(incoming) = self.shell.process.as_ref().and_then(|p| p.try_recv()) else { return };
            match incoming {
                Incoming::Msg(m) => {
                    self.heard = true;
                    self.handle(m, out);
                }
                Incoming::Pid(_) => {
                    return self.die(Failure::Protocol("sent its pid again".into()), out);
                }
                Incoming::Garbage { line, reason } => {
                    return self.die(Failure::Garbage { line, reason }, out);
                }
                Incoming::Closed => return self.die(Failure::Exited, out),
            }
        }
    }

    fn handle(&mut self, msg: ShellMsg, out: &mut BoltCollector<'_>) {
        match msg {
            ShellMsg::Emit(e) => self.emit(e, out),
            ShellMsg::Ack { id } => match self.take_input(&id) {
                Some(t) => out.ack(&t),
                None => out.report_error(format!(
                    "{}: acked an unknown or already acked/failed id {id}",
                    self.shell.label()
                )),
            },
            ShellMsg::Fail { id } => match self.take_input(&id) {
                Some(t) => out.fail(&t),
                None => out.report_error(format!(
                    "{}: failed an unknown or already acked/failed id {id}",
                    self.shell.label()
                )),
            },
            ShellMsg::Sync => {}
            ShellMsg::Log { msg, level } => log(&self.shell.label(), &msg, level),
            ShellMsg::Error { msg } => out.report_error(format!("{}: {}", self.shell.label(), text(&msg))),
            ShellMsg::Metrics { name, params } => {
                if let Err(reason) =
                    super::count_of(&params).and_then(|by| out.count(&name, by).map_err(|e| e.to_string()))
                {
                    out.report_error(format!("{}: metric {name:?}: {reason}", self.shell.label()));
                }
            }
        }
    }

    fn take_input(&mut self, id: &Json) -> Option<Tuple> {
        let id = protocol::id_text(id)?.parse::<u64>().ok()?;
        self.inputs.remove(&id)
    }

    fn emit(&mut self, e: Emit, out: &mut BoltCollector<'_>) {
        let wants_ids = e.wants_task_ids();
        let mut unknown = Vec::new();
        let anchors: Vec<&Tuple> = e
            .anchors
            .iter()
            .flatten()
            .filter_map(|a| {
                let t = protocol::id_text(a)
                    .and_then(|s| s.parse::<u64>().ok())
                    .and_then(|id| self.inputs.get(&id));
                if t.is_none() {
                    unknown.push(a.to_string());
                }
                t
            })
            .collect();
        let stream = e.stream.as_deref().unwrap_or(DEFAULT_STREAM);
        let direct = e.direct_task();
        let values: Values = e.tuple.into_iter().map(protocol::value_of).collect();
        let result = match direct {
            Ok(Some(task)) => out
                .emit_direct(cluster_state::ids::TaskId(task), stream, &anchors, values)
                .map(|_| vec![task])
                .map_err(|err| err.to_string()),
            Ok(None) => out
                .emit_stream(stream, &anchors, values)
                .map(|_| out.em.last_targets().iter().map(|t| t.0).collect())
                .map_err(|err| err.to_string()),
            Err(reason) => Err(reason),
        };
        let label = self.shell.label();
        if !unknown.is_empty() {
            out.report_error(format!(
                "{label}: emit anchored to unknown or already acked/failed ids {}",
                unknown.join(", ")
            ));
        }
        let tasks = result.unwrap_or_else(|reason| {
            out.report_error(format!("{label}: {reason}"));
            Vec::new()
        });
        if wants_ids {
            // The subprocess waits for this answer: it goes before anything else queued after it.
            let mut bytes = Vec::with_capacity(16);
            if frame(&mut bytes, &tasks).is_ok()
                && let Some(p) = self.shell.process.as_ref()
                && let Err(f) = p.send_blocking(bytes, self.shell.timeout)
            {
                self.die(f, out);
            }
        }
    }

    fn check_heartbeat(&mut self, out: &mut BoltCollector<'_>) {
        if self.shell.process.is_none() {
            return;
        }
        let now = Instant::now();
        if std::mem::take(&mut self.heard) {
            self.last_heard = now;
        }
        if now.duration_since(self.last_heard) > self.shell.timeout {
            return self.die(Failure::Timeout(self.shell.timeout), out);
        }
        if now >= self.next_heartbeat {
            self.next_heartbeat = now + HEARTBEAT_EVERY;
            let id = format!("hb{}", self.next_id);
            let tuple = BoltTuple {
                id: &id,
                comp: None,
                stream: HEARTBEAT_STREAM,
                task: SYSTEM_TASK_ID,
                tuple: JsonValues(&[]),
            };
            let mut bytes = Vec::with_capacity(96);
            // A full queue means inputs are on their way: the heartbeat is skipped, the
            // subprocess's answers to those inputs count as heartbeats.
            if frame(&mut bytes, &tuple).is_ok()
                && let Some(p) = self.shell.process.as_ref()
                && let Err(f) = p.try_send(bytes)
            {
                self.die(f, out);
            }
        }
    }

    /// Gives the subprocess up: report, kill, fail what it held, restart later.
    fn die(&mut self, failure: Failure, out: &mut BoltCollector<'_>) {
        let pending = self.inputs.len();
        if let Some(report) = self.shell.give_up(failure) {
            out.report_error(format!("{report}; {pending} pending inputs failed"));
        }
        for (_, t) in self.inputs.drain() {
            out.fail(&t);
        }
    }
}

impl Bolt for ShellBolt {
    fn declare_outputs(&self, declarer: &mut OutputDeclarer) {
        self.shell.spec.declare(declarer);
    }

    fn prepare(&mut self, context: &TopologyContext) -> Result<(), ComponentError> {
        self.shell.set_context(context);
        // A subprocess that cannot start is retried (with backoff) rather than failing the
        // executor: the error is reported at the first poll.
        if let Err(e) = self.start() {
            self.unreported.push(e);
        }
        Ok(())
    }

    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        if !self.ensure_running(out) {
            out.fail(input);
            return Ok(());
        }
        let id = self.next_id;
        self.next_id += 1;
        let id_text = id.to_string();
        let (comp, task) = if input.source_component().as_str() == SYSTEM_COMPONENT {
            (SYSTEM_COMPONENT, SYSTEM_TASK_ID)
        } else {
            (input.source_component().as_str(), i64::from(input.source_task().0))
        };
        let mut bytes = Vec::with_capacity(64 + 16 * input.values().len());
        frame(
            &mut bytes,
            &BoltTuple {
                id: &id_text,
                comp: Some(comp),
                stream: input.source_stream(),
                task,
                tuple: JsonValues(input.values()),
            },
        )?;
        self.inputs.insert(id, input.clone());
        self.push(bytes, out);
        self.drain(out);
        Ok(())
    }

    fn poll(&mut self, out: &mut BoltCollector<'_>) {
        if !self.ensure_running(out) {
            return;
        }
        self.drain(out);
        self.check_heartbeat(out);
    }

    fn waker(&self) -> Option<Receiver<()>> {
        Some(self.wake_rx.clone())
    }

    fn cleanup(&mut self) {
        self.shell.stop();
    }
}

/// A log command at its level (Storm's: 0 trace, 1 debug, 2 info, 3 warn, 4 error).
pub(super) fn log(label: &str, msg: &Json, level: Option<i64>) {
    let msg = text(msg);
    match level.unwrap_or(2) {
        ..=0 => tracing::trace!(component = %label, "{msg}"),
        1 => tracing::debug!(component = %label, "{msg}"),
        2 => tracing::info!(component = %label, "{msg}"),
        3 => tracing::warn!(component = %label, "{msg}"),
        _ => tracing::error!(component = %label, "{msg}"),
    }
}

/// A message field as text (a string as is, anything else as JSON).
pub(super) fn text(msg: &Json) -> String {
    match msg {
        Json::String(s) => s.clone(),
        other => other.to_string(),
    }
}
