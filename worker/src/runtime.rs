//! Running executors: one worker's set ([`WorkerRuntime`]), and the in-process mode that runs
//! all workers of a topology in one process ([`LocalCluster`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::queue::QueueSender;
use cluster_state::ids::{ComponentId, ExecutorId, TaskId};
use tokio_util::sync::CancellationToken;

use crate::acker::AckMsg;
use crate::bolt_cell::BoltCell;
use crate::collector::{Batch, Envelope, ErrorReport, ErrorSender, Routes, SharedRoutes};
use crate::cpu_latency::CpuLatencyRequest;
use crate::error::Result;
use crate::executor::{self, ExecutorInbox, RunningExecutor, Shared, StreamTable};
use crate::layout::TaskLayout;
use crate::stats::ExecStats;
use crate::topology::{ACKER_COMPONENT, Topology};

/// How often shutdown looks at the pending counts while draining.
const DRAIN_POLL: Duration = Duration::from_millis(5);
/// How long a worker without spouts must see its executors do nothing before its graceful
/// stop ends the drain: the trees in flight through it are other workers' (it cannot count
/// them), and a worker stopped with them, as `squall local` and a topology's kill stop them
/// all, would drop the tuples that are still on their way to it.
const DRAIN_QUIET: Duration = Duration::from_millis(200);

/// The executors of one worker, running.
#[derive(Debug)]
pub struct WorkerRuntime {
    executors: Vec<RunningExecutor>,
    active: Arc<AtomicBool>,
    cancel: CancellationToken,
    pub(crate) routes: Arc<SharedRoutes>,
    pub(crate) table: Arc<StreamTable>,
    pub(crate) layout: Arc<TaskLayout>,
    /// Inbox of each local task, for frames received from peers.
    pub(crate) inboxes: BTreeMap<TaskId, QueueSender<Batch>>,
    /// The bolt executor of each local task that upstream threads may run inline (routes
    /// rebuilt by `set_remote` keep them; its thread owns it).
    cells: BTreeMap<TaskId, Weak<BoltCell>>,
    /// `squall.worker.cpu.latency.us`, held while this runtime lives (`None`: not set, or the
    /// kernel refused it; a warning said so).
    cpu_latency: Option<CpuLatencyRequest>,
}

/// An executor to start: id, component, its worker's tasks, its inbox.
type ExecutorQueue = (ExecutorId, ComponentId, Arc<BTreeSet<TaskId>>, ExecutorInbox);

/// What to build a runtime from.
pub(crate) struct RuntimeParts {
    pub(crate) topology: Arc<Topology>,
    pub(crate) layout: Arc<TaskLayout>,
    /// Executors to run here, each with the task set of "its worker" (for local-or-shuffle).
    pub(crate) executors: Vec<(ExecutorId, Arc<BTreeSet<TaskId>>)>,
    /// Destinations of tasks run elsewhere: task -> index into `remote_dests`.
    pub(crate) remote_tasks: BTreeMap<TaskId, usize>,
    pub(crate) remote_dests: Vec<QueueSender<Batch>>,
    pub(crate) errors: Option<ErrorSender>,
    pub(crate) start_active: bool,
}

impl WorkerRuntime {
    pub(crate) fn start(parts: RuntimeParts) -> Result<Self> {
        let table = Arc::new(StreamTable::new(&parts.topology));
        let mut queues: Vec<ExecutorQueue> = Vec::new();
        let mut inboxes = BTreeMap::new();
        let mut routes = Routes {
            dest_of_task: vec![u32::MAX; parts.layout.max_task() as usize + 1],
            ..Routes::default()
        };
        let inline = runs_downstream_inline(&parts.topology);
        let mut cells = BTreeMap::new();
        let fused = fused_ackers(&parts);
        let fused_into: BTreeMap<ExecutorId, ExecutorId> = fused.iter().map(|(s, a)| (*a, *s)).collect();
        for (id, local) in &parts.executors {
            let Some(component) = parts.layout.executors.get(id).cloned() else { continue };
            if fused_into.contains_key(id) {
                continue; // Its tasks share its spout's inbox (below).
            }
            let (tx, rx) = executor::inbox(&parts.topology, &component);
            let is_bolt = parts.topology.components().get(&component).is_some_and(|c| !c.is_spout());
            let (rx, cell) = if is_bolt {
                let cell = BoltCell::new(rx, Arc::default());
                let routed = inline.then(|| Arc::downgrade(&cell));
                (ExecutorInbox::Bolt(cell), routed)
            } else {
                (ExecutorInbox::Queue(rx), None)
            };
            let dest = routes.dests.len() as u32;
            routes.dests.push(tx.clone());
            routes.cells.push(cell.clone());
            for t in id.tasks() {
                if let Some(slot) = routes.dest_of_task.get_mut(t.0 as usize) {
                    *slot = dest;
                }
                inboxes.insert(t, tx.clone());
                if let Some(cell) = &cell {
                    cells.insert(t, cell.clone());
                }
            }
            queues.push((*id, component, local.clone(), rx));
        }
        for (acker, spout) in &fused_into {
            let Some(tx) = inboxes.get(&spout.start_task()).cloned() else { continue };
            let dest = routes.dest_of_task.get(spout.start_task().0 as usize).copied().unwrap_or(u32::MAX);
            for t in acker.tasks() {
                if let Some(slot) = routes.dest_of_task.get_mut(t.0 as usize) {
                    *slot = dest;
                }
                inboxes.insert(t, tx.clone());
            }
        }
        let base = routes.dests.len() as u32;
        routes.dests.extend(parts.remote_dests.iter().cloned());
        routes.cells.resize(routes.dests.len(), None);
        for (task, idx) in &parts.remote_tasks {
            if let Some(slot) = routes.dest_of_task.get_mut(task.0 as usize) {
                *slot = base + *idx as u32;
            }
        }
        let routes = SharedRoutes::new(routes);
        let active = Arc::new(AtomicBool::new(parts.start_active));
        let cancel = CancellationToken::new();
        let shared = Shared {
            topology: parts.topology.clone(),
            layout: parts.layout.clone(),
            table: table.clone(),
            routes: routes.clone(),
            errors: parts.errors,
            active: active.clone(),
            cancel: cancel.clone(),
        };
        let mut runtime = WorkerRuntime {
            executors: Vec::new(),
            active,
            cancel,
            routes,
            table,
            layout: parts.layout,
            inboxes,
            cells,
            cpu_latency: crate::cpu_latency::hold_configured(parts.topology.config().cpu_latency_us),
        };
        // Calibrated (~1 ms, at most 200 ms on a stalled host) before any executor runs, not
        // on the first bolt's thread while spouts already emit.
        crate::stats::sample_clock();
        for (id, component, local, rx) in queues {
            match executor::spawn(&shared, id, component, rx, &local, fused.get(&id).copied(), inline) {
                Ok((e, acker)) => runtime.executors.extend(std::iter::once(e).chain(acker)),
                Err(e) => {
                    runtime.stop();
                    return Err(e);
                }
            }
        }
        Ok(runtime)
    }

    /// The CPU wake-up latency this worker holds a request for (`squall.worker.cpu.latency.us`),
    /// in microseconds; `None` when the key is not set or the kernel refused the request.
    pub fn cpu_latency_us(&self) -> Option<u32> {
        self.cpu_latency.as_ref().map(CpuLatencyRequest::us)
    }

    /// Replaces where tasks of other workers are sent (after an assignment change).
    pub(crate) fn set_remote(
        &self,
        remote_tasks: &BTreeMap<TaskId, usize>,
        remote_dests: &[QueueSender<Batch>],
    ) {
        let mut routes =
            Routes { dest_of_task: vec![u32::MAX; self.layout.max_task() as usize + 1], ..Routes::default() };
        let mut local: BTreeMap<usize, u32> = BTreeMap::new();
        for (task, tx) in &self.inboxes {
            // One destination per local executor queue (tasks of one executor share it).
            let dest = routes.dests.iter().position(|d| d.same_channel(tx)).unwrap_or_else(|| {
                routes.dests.push(tx.clone());
                routes.cells.push(self.cells.get(task).cloned());
                routes.dests.len() - 1
            }) as u32;
            local.insert(task.0 as usize, dest);
        }
        for (task, dest) in local {
            if let Some(slot) = routes.dest_of_task.get_mut(task) {
                *slot = dest;
            }
        }
        let base = routes.dests.len() as u32;
        routes.dests.extend(remote_dests.iter().cloned());
        routes.cells.resize(routes.dests.len(), None);
        for (task, idx) in remote_tasks {
            if let Some(slot) = routes.dest_of_task.get_mut(task.0 as usize) {
                *slot = base + *idx as u32;
            }
        }
        self.routes.replace(routes);
    }

    /// Tells the local spout executors that tasks moved to other workers: trees in flight that
    /// do not complete within a short grace are failed (they went through a worker that is
    /// gone, so they never would) and replay at once, instead of after the message timeout.
    pub(crate) fn tasks_moved(&self) {
        for executor in self.executors.iter().filter(|e| e.is_spout) {
            let task = executor.id.start_task();
            if let Some(inbox) = self.inboxes.get(&task) {
                // The spout's inbox is bounded; if it is full the spout is busy with verdicts
                // and the message timeout still applies.
                let _ = inbox.try_send(vec![Envelope::Ack { task, msg: AckMsg::TasksMoved }]);
            }
        }
    }

    /// Lets spouts emit (Storm's activate).
    pub fn activate(&self) {
        self.active.store(true, Ordering::Relaxed);
    }

    /// Stops spouts from emitting (Storm's deactivate); in-flight tuples still complete.
    pub fn deactivate(&self) {
        self.active.store(false, Ordering::Relaxed);
    }

    /// Whether spouts are active.
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Statistics of every executor.
    pub fn stats(&self) -> Vec<Arc<ExecStats>> {
        self.executors.iter().map(|e| e.stats.clone()).collect()
    }

    /// What the metrics collector reads of each executor: its stats and its inbound queue.
    pub fn metric_sources(&self) -> Vec<crate::metrics::ExecutorSource> {
        self.executors
            .iter()
            .map(|e| crate::metrics::ExecutorSource {
                component: e.component.to_string(),
                task: e.id.start_task().0,
                is_spout: e.is_spout,
                stats: e.stats.clone(),
                inbox: self.inboxes.get(&e.id.start_task()).cloned(),
            })
            .collect()
    }

    /// An executor that died because a spout or bolt panicked, or could not open / prepare:
    /// its id and component.
    /// The worker cannot run its topology without it; Storm's worker then exits so that its
    /// supervisor starts a fresh one (`squall worker` does, `process::run`).
    pub fn dead_executor(&self) -> Option<(ExecutorId, ComponentId)> {
        self.executors.iter().find(|e| e.died.load(Ordering::Acquire)).map(|e| (e.id, e.component.clone()))
    }

    /// Statistics of the executors of `component`.
    pub fn component_stats(&self, component: &str) -> Vec<Arc<ExecStats>> {
        self.executors.iter().filter(|e| e.component.as_str() == component).map(|e| e.stats.clone()).collect()
    }

    /// Spout tuples still pending in this worker.
    pub fn pending(&self) -> u64 {
        self.executors.iter().filter(|e| e.is_spout).map(|e| e.stats.pending.load(Ordering::Relaxed)).sum()
    }

    /// What every executor has done so far (emitted, transferred, acked and failed, as
    /// published): it stands still while the worker is idle.
    fn activity(&self) -> u64 {
        self.executors
            .iter()
            .flat_map(|e| [&e.stats.emitted, &e.stats.transferred, &e.stats.acked, &e.stats.failed])
            .fold(0u64, |sum, c| sum.wrapping_add(c.load(Ordering::Relaxed)))
    }

    /// Graceful stop: deactivate spouts, wait up to `drain` for the tuples in flight, then stop
    /// every executor and wait for its thread. A worker with spouts waits until their pending
    /// tuples completed; one without waits until its executors did nothing for 200 ms
    /// (`DRAIN_QUIET`: the trees through it are other workers', still completing while those
    /// drain).
    pub fn shutdown(mut self, drain: Duration) {
        self.deactivate();
        let deadline = Instant::now() + drain;
        let has_spouts = self.executors.iter().any(|e| e.is_spout);
        let (mut seen, mut quiet_since) = (self.activity(), Instant::now());
        loop {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            if has_spouts {
                if self.pending() == 0 {
                    break;
                }
            } else {
                let activity = self.activity();
                if activity != seen {
                    (seen, quiet_since) = (activity, now);
                } else if now.saturating_duration_since(quiet_since) >= DRAIN_QUIET {
                    break;
                }
            }
            std::thread::sleep(DRAIN_POLL);
        }
        self.stop();
    }

    fn stop(&mut self) {
        self.cancel.cancel();
        for e in &mut self.executors {
            if let Some(t) = e.thread.take()
                && t.join().is_err()
            {
                tracing::error!(executor = %e.id, component = %e.component, "executor thread panicked");
            }
        }
    }
}

impl Drop for WorkerRuntime {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Which acker executor runs on which spout executor's thread (spout -> acker): this worker's
/// ackers paired with its spout executors in executor order, while both last. An acker left
/// without a spout (a worker of bolts only, or more ackers than spouts) runs on a thread of its
/// own. On a spout's thread, the trees it emitted are settled where they are tracked: no verdict
/// crosses threads, and one thread fewer competes for the cores (issue 21's latency tail).
fn fused_ackers(parts: &RuntimeParts) -> BTreeMap<ExecutorId, ExecutorId> {
    let of = |wanted: fn(&RuntimeParts, &ComponentId) -> bool| {
        parts
            .executors
            .iter()
            .map(|(id, _)| *id)
            .filter(move |id| parts.layout.executors.get(id).is_some_and(|c| wanted(parts, c)))
    };
    let spouts = of(|parts, c| parts.topology.components().get(c).is_some_and(|spec| spec.is_spout()));
    let ackers = of(|_, c| c.as_str() == ACKER_COMPONENT);
    spouts.zip(ackers).collect()
}

/// Whether bolt executors of this topology may run idle downstream bolt executors of their
/// worker on their own thread (`bolt_cell`): `squall.executor.inline.downstream`, and only
/// when no component's output comes back to it (the locks are then taken in the topology's
/// order, and no thread waits for a queue only it would drain).
fn runs_downstream_inline(topology: &Topology) -> bool {
    topology.config().inline_downstream && !has_cycle(topology)
}

/// Whether some component's tuples can reach the component itself again.
fn has_cycle(topology: &Topology) -> bool {
    // Kahn's algorithm: components left once every one without unvisited inputs is taken sit on
    // a cycle (or downstream of one).
    let components = topology.components();
    let mut inputs: BTreeMap<&str, usize> = components
        .values()
        .map(|c| {
            let from: BTreeSet<&str> = c.inputs.iter().map(|i| i.from.as_str()).collect();
            (c.id.as_str(), from.len())
        })
        .collect();
    let mut ready: Vec<&str> = inputs.iter().filter(|(_, n)| **n == 0).map(|(c, _)| *c).collect();
    let mut taken = 0;
    while let Some(c) = ready.pop() {
        taken += 1;
        for sub in components.values() {
            if sub.inputs.iter().any(|i| i.from == c)
                && let Some(n) = inputs.get_mut(sub.id.as_str())
            {
                *n -= 1;
                if *n == 0 {
                    ready.push(sub.id.as_str());
                }
            }
        }
    }
    taken < inputs.len()
}

/// Which of `workers` virtual workers runs each executor: round-robin over executors in id
/// order (what the even scheduler does on an empty cluster).
pub fn local_placement(layout: &TaskLayout, workers: u32) -> BTreeMap<ExecutorId, u32> {
    let execs: Vec<ExecutorId> = layout.executors.keys().copied().collect();
    let mut out = BTreeMap::new();
    let workers = workers.max(1) as usize;
    for (i, e) in execs.iter().enumerate() {
        out.insert(*e, (i % workers) as u32);
    }
    out
}

/// A whole topology running in this process: `topology.workers` virtual workers whose
/// executors pass tuples without serialisation (used by tests, benchmarks and embedders;
/// `squall local` instead runs real worker sessions through the supervisor's in-process launcher).
#[derive(Debug)]
pub struct LocalCluster {
    runtime: WorkerRuntime,
    errors: std::sync::Mutex<tokio::sync::mpsc::Receiver<ErrorReport>>,
}

impl LocalCluster {
    /// Starts every executor of `topology`, spread over `topology.workers` virtual workers,
    /// with spouts active.
    pub fn start(topology: Topology) -> Result<Self> {
        Self::start_with(topology, true)
    }

    /// Starts every executor of `topology` with spouts inactive (as a topology submitted
    /// `--inactive`) until [`WorkerRuntime::activate`].
    pub fn start_inactive(topology: Topology) -> Result<Self> {
        Self::start_with(topology, false)
    }

    fn start_with(topology: Topology, start_active: bool) -> Result<Self> {
        let topology = Arc::new(topology);
        let layout = Arc::new(TaskLayout::compute(&topology.component_parallelism()));
        let placement = local_placement(&layout, topology.config().workers);
        let mut worker_tasks: BTreeMap<u32, BTreeSet<TaskId>> = BTreeMap::new();
        for (e, w) in &placement {
            worker_tasks.entry(*w).or_default().extend(e.tasks());
        }
        let worker_tasks: BTreeMap<u32, Arc<BTreeSet<TaskId>>> =
            worker_tasks.into_iter().map(|(w, t)| (w, Arc::new(t))).collect();
        let executors =
            placement.iter().map(|(e, w)| (*e, worker_tasks.get(w).cloned().unwrap_or_default())).collect();
        let (err_tx, err_rx) = tokio::sync::mpsc::channel(1024);
        let runtime = WorkerRuntime::start(RuntimeParts {
            topology,
            layout,
            executors,
            remote_tasks: BTreeMap::new(),
            remote_dests: Vec::new(),
            errors: Some(err_tx),
            start_active,
        })?;
        Ok(LocalCluster { runtime, errors: std::sync::Mutex::new(err_rx) })
    }

    /// The running executors.
    pub fn runtime(&self) -> &WorkerRuntime {
        &self.runtime
    }

    /// Task ids of `component`.
    pub fn tasks_of(&self, component: &str) -> Vec<TaskId> {
        ComponentId::new(component)
            .ok()
            .and_then(|c| self.runtime.layout.component_tasks.get(&c).cloned())
            .unwrap_or_default()
    }

    /// Errors reported by components so far (drained).
    pub fn take_errors(&self) -> Vec<ErrorReport> {
        let mut out = Vec::new();
        if let Ok(mut rx) = self.errors.lock() {
            while let Ok(e) = rx.try_recv() {
                out.push(e);
            }
        }
        out
    }

    /// Graceful stop (see [`WorkerRuntime::shutdown`]).
    pub fn shutdown(self, drain: Duration) {
        self.runtime.shutdown(drain);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::TopologyConfig;
    use crate::builtin::{SentenceParams, SentenceSpout, SplitSentence, WordCount};
    use crate::topology::TopologyBuilder;

    fn sentences() -> SentenceSpout {
        SentenceSpout::new(SentenceParams::default())
    }

    /// Inline runs are for topologies whose tuples never come back to a component: a word count
    /// (also with a second path to the same bolt) has no cycle; a bolt fed by its own output, or
    /// by a bolt it feeds, has; and the key turns it off.
    #[test]
    fn downstream_runs_inline_only_without_cycles_and_when_configured() {
        let on = TopologyConfig { inline_downstream: true, ..TopologyConfig::default() };
        let mut b = TopologyBuilder::new("dag");
        b.config(on.clone());
        b.set_spout("s", 1, sentences);
        b.set_bolt("split", 2, SplitSentence::default).shuffle_grouping("s");
        b.set_bolt("count", 2, WordCount::default).fields_grouping("split", ["word"]).shuffle_grouping("s");
        let dag = b.build().unwrap();
        assert!(!has_cycle(&dag));
        assert!(runs_downstream_inline(&dag));

        let mut b = TopologyBuilder::new("off");
        b.config(TopologyConfig { inline_downstream: false, ..TopologyConfig::default() });
        b.set_spout("s", 1, sentences);
        b.set_bolt("split", 1, SplitSentence::default).shuffle_grouping("s");
        assert!(!runs_downstream_inline(&b.build().unwrap()));

        let mut b = TopologyBuilder::new("self");
        b.config(on);
        b.set_spout("s", 1, sentences);
        b.set_bolt("split", 1, SplitSentence::default).shuffle_grouping("s").shuffle_grouping("split");
        let own = b.build().unwrap();
        assert!(has_cycle(&own));
        assert!(!runs_downstream_inline(&own));

        let mut b = TopologyBuilder::new("loop");
        b.set_spout("s", 1, sentences);
        b.set_bolt("a", 1, SplitSentence::default).shuffle_grouping("s").shuffle_grouping("b");
        b.set_bolt("b", 1, SplitSentence::default).shuffle_grouping("a");
        b.set_bolt("c", 1, WordCount::default).shuffle_grouping("b");
        assert!(has_cycle(&b.build().unwrap()));
    }
}
