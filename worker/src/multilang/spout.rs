//! [`ShellSpout`]: a spout whose tuples a multilang subprocess emits (Storm's `ShellSpout`).

use std::collections::{HashMap, VecDeque};

use crossbeam_channel::RecvTimeoutError;
use serde_json::Value as Json;

use super::bolt::{log, text};
use super::process::{Failure, Incoming};
use super::protocol::{self, Emit, ShellMsg, SpoutCommand, frame};
use super::{Shell, ShellSpec};
use crate::collector::SpoutCollector;
use crate::component::{ComponentError, OutputDeclarer, Spout, TopologyContext};
use crate::tuple::{DEFAULT_STREAM, Values};

/// A spout run by a subprocess speaking Storm's multilang protocol.
#[derive(Debug)]
pub struct ShellSpout {
    shell: Shell,
    /// Message ids of pending tuples: Squall's `u64` -> the subprocess's id and the generation
    /// (subprocess) that emitted it; a restarted subprocess is not told about its
    /// predecessor's tuples.
    ids: HashMap<u64, (u64, Json)>,
    next_msg_id: u64,
    generation: u64,
    /// Emits made while answering `ack`, `fail`, `activate` or `deactivate`, which have no
    /// collector: emitted at the next `next_tuple`.
    deferred: VecDeque<Emit>,
    /// Errors met without a collector, reported at the next `next_tuple`.
    unreported: Vec<String>,
    /// `metrics` commands heard while no collector was at hand (in `ack`, `fail`, ...).
    uncounted: Vec<(String, u64)>,
}

impl ShellSpout {
    /// A shell spout running `spec`.
    pub fn new(spec: ShellSpec) -> Self {
        ShellSpout {
            shell: Shell::new("spout", spec),
            ids: HashMap::new(),
            next_msg_id: 1,
            generation: 0,
            deferred: VecDeque::new(),
            unreported: Vec::new(),
            uncounted: Vec::new(),
        }
    }

    fn start(&mut self) -> bool {
        let was_running = self.shell.process.is_some();
        match self.shell.ensure_running(None) {
            Ok(running) => {
                if running && !was_running {
                    self.generation += 1;
                }
                running
            }
            Err(e) => {
                self.unreported.push(e);
                false
            }
        }
    }

    /// Sends `command` and applies the answer up to its `sync`.
    fn command(
        &mut self,
        command: &'static str,
        id: Option<&Json>,
        mut out: Option<&mut SpoutCollector<'_>>,
    ) {
        let mut bytes = Vec::with_capacity(48);
        if let Err(e) = frame(&mut bytes, &SpoutCommand { command, id }) {
            self.unreported.push(format!("{}: cannot encode {command}: {e}", self.shell.label()));
            return;
        }
        let timeout = self.shell.timeout;
        let Some(p) = self.shell.process.as_ref() else { return };
        if let Err(f) = p.send_blocking(bytes, timeout) {
            return self.die(f);
        }
        loop {
            let Some(p) = self.shell.process.as_ref() else { return };
            // The timeout restarts with every message: it bounds silence, not the answer's size.
            let incoming = match p.from_child.recv_timeout(timeout) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => return self.die(Failure::Timeout(timeout)),
                Err(RecvTimeoutError::Disconnected) => Incoming::Closed,
            };
            let msg = match incoming {
                Incoming::Msg(m) => m,
                Incoming::Pid(_) => return self.die(Failure::Protocol("sent its pid again".into())),
                Incoming::Garbage { line, reason } => return self.die(Failure::Garbage { line, reason }),
                Incoming::Closed => return self.die(Failure::Exited),
            };
            match msg {
                ShellMsg::Sync => return,
                ShellMsg::Emit(e) => match out.as_deref_mut() {
                    Some(out) => self.emit(e, out),
                    None => {
                        if e.wants_task_ids() {
                            // Not emitted yet, so no tasks to name; the subprocess waits for a list.
                            self.send_task_ids(&[]);
                        }
                        self.deferred.push_back(e);
                    }
                },
                ShellMsg::Log { msg, level } => log(&self.shell.label(), &msg, level),
                ShellMsg::Error { msg } => {
                    self.unreported.push(format!("{}: {}", self.shell.label(), text(&msg)))
                }
                ShellMsg::Metrics { name, params } => match super::count_of(&params) {
                    Ok(by) => self.uncounted.push((name, by)),
                    Err(reason) => {
                        self.unreported.push(format!("{}: metric {name:?}: {reason}", self.shell.label()))
                    }
                },
                ShellMsg::Ack { .. } | ShellMsg::Fail { .. } => {
                    return self
                        .die(Failure::Protocol("a spout sent ack or fail, which only bolts do".into()));
                }
            }
        }
    }

    fn emit(&mut self, e: Emit, out: &mut SpoutCollector<'_>) {
        let wants_ids = e.wants_task_ids();
        let msg_id = e.id.as_ref().filter(|id| !id.is_null()).map(|id| {
            let n = self.next_msg_id;
            self.next_msg_id += 1;
            self.ids.insert(n, (self.generation, id.clone()));
            n
        });
        let stream = e.stream.as_deref().unwrap_or(DEFAULT_STREAM);
        let direct = e.direct_task();
        let values: Values = e.tuple.into_iter().map(protocol::value_of).collect();
        let result = match direct {
            Ok(Some(task)) => out
                .emit_direct(cluster_state::ids::TaskId(task), stream, values, msg_id)
                .map(|_| vec![task])
                .map_err(|err| err.to_string()),
            Ok(None) => out
                .emit_stream(stream, values, msg_id)
                .map(|_| out.em.last_targets().iter().map(|t| t.0).collect())
                .map_err(|err| err.to_string()),
            Err(reason) => Err(reason),
        };
        let tasks = result.unwrap_or_else(|reason| {
            if let Some(id) = msg_id {
                self.ids.remove(&id);
            }
            out.report_error(format!("{}: {reason}", self.shell.label()));
            Vec::new()
        });
        if wants_ids {
            self.send_task_ids(&tasks);
        }
    }

    fn send_task_ids(&mut self, tasks: &[u32]) {
        let mut bytes = Vec::with_capacity(16);
        if frame(&mut bytes, &tasks).is_ok()
            && let Some(p) = self.shell.process.as_ref()
            && let Err(f) = p.send_blocking(bytes, self.shell.timeout)
        {
            self.die(f);
        }
    }

    fn die(&mut self, failure: Failure) {
        if let Some(report) = self.shell.give_up(failure) {
            self.unreported.push(report);
        }
        self.deferred.clear();
    }

    /// Tells the subprocess about `msg_id`'s tree, if the subprocess that emitted it still runs.
    fn verdict(&mut self, command: &'static str, msg_id: u64) {
        if let Some((generation, id)) = self.ids.remove(&msg_id)
            && generation == self.generation
            && self.shell.process.is_some()
        {
            self.command(command, Some(&id), None);
        }
    }
}

impl Spout for ShellSpout {
    fn declare_outputs(&self, declarer: &mut OutputDeclarer) {
        self.shell.spec.declare(declarer);
    }

    fn open(&mut self, context: &TopologyContext) -> Result<(), ComponentError> {
        self.shell.set_context(context);
        // Retried with backoff rather than failing the executor; reported at the first
        // `next_tuple`.
        self.start();
        Ok(())
    }

    fn next_tuple(&mut self, out: &mut SpoutCollector<'_>) -> Result<(), ComponentError> {
        for e in self.unreported.drain(..) {
            out.report_error(e);
        }
        if !self.start() {
            return Ok(());
        }
        while let Some(e) = self.deferred.pop_front() {
            self.emit(e, out);
        }
        self.command("next", None, Some(out));
        for (name, by) in self.uncounted.drain(..) {
            if let Err(e) = out.count(&name, by) {
                self.unreported.push(format!("{}: {e}", self.shell.label()));
            }
        }
        for e in self.unreported.drain(..) {
            out.report_error(e);
        }
        Ok(())
    }

    fn ack(&mut self, msg_id: u64) {
        self.verdict("ack", msg_id);
    }

    fn fail(&mut self, msg_id: u64) {
        self.verdict("fail", msg_id);
    }

    fn activate(&mut self) {
        if self.shell.process.is_some() {
            self.command("activate", None, None);
        }
    }

    fn deactivate(&mut self) {
        if self.shell.process.is_some() {
            self.command("deactivate", None, None);
        }
    }

    fn close(&mut self) {
        self.shell.stop();
    }
}
