//! What users implement: [`Spout`] and [`Bolt`], with their output declarations and context.

use std::collections::BTreeMap;
use std::sync::Arc;

use cluster_state::ids::{ComponentId, TaskId};

use crate::collector::{BoltCollector, SpoutCollector};
use crate::config::TopologyConfig;
use crate::tuple::{DEFAULT_STREAM, Fields, Tuple};

/// What a component's callbacks may fail with; the executor reports it to
/// `/storm/errors/<topology>/<component>` (rate-limited) and, for a bolt, fails the input.
pub type ComponentError = Box<dyn std::error::Error + Send + Sync>;

/// A source of tuples (Storm's `IRichSpout`). One instance per task; all calls come from the
/// task's executor thread, so implementations need no locking.
pub trait Spout: Send + 'static {
    /// The streams this spout emits and their fields.
    fn declare_outputs(&self, declarer: &mut OutputDeclarer);
    /// Called once before any other call, on the executor thread.
    fn open(&mut self, _context: &TopologyContext) -> Result<(), ComponentError> {
        Ok(())
    }
    /// Emit zero or more tuples. Called in a loop while the topology is active and fewer than
    /// `topology.max.spout.pending` tuples of this task are pending; must not block for long.
    fn next_tuple(&mut self, out: &mut SpoutCollector<'_>) -> Result<(), ComponentError>;
    /// The tuple tree of `msg_id` completed.
    fn ack(&mut self, _msg_id: u64) {}
    /// The tuple tree of `msg_id` failed or timed out (`topology.message.timeout.secs`).
    fn fail(&mut self, _msg_id: u64) {}
    /// The verdicts of one batch (`ack`, `fail`) have all been delivered: a spout that buffers
    /// acks to settle them together does it now. Called after every batch of verdicts, whether
    /// or not the topology is active.
    fn verdicts_delivered(&mut self) {}
    /// The topology became active (also called after `open` when it starts active).
    fn activate(&mut self) {}
    /// The topology was deactivated: `next_tuple` is not called until the next `activate`.
    fn deactivate(&mut self) {}
    /// The worker is shutting down; not guaranteed to be called on a crash.
    fn close(&mut self) {}
}

/// A processing step (Storm's `IRichBolt`). One instance per task, called from its executor
/// thread only.
pub trait Bolt: Send + 'static {
    /// The streams this bolt emits and their fields (none for a sink).
    fn declare_outputs(&self, _declarer: &mut OutputDeclarer) {}
    /// Called once before any tuple arrives.
    fn prepare(&mut self, _context: &TopologyContext) -> Result<(), ComponentError> {
        Ok(())
    }
    /// Processes one input. The bolt acks (or fails) `input` through `out`; an `Err` is
    /// reported and fails the input.
    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError>;
    /// This bolt's own tick frequency, overriding `topology.tick.tuple.freq.secs` (Storm's
    /// component configuration).
    fn tick_tuple_freq_secs(&self) -> Option<u64> {
        None
    }
    /// Called on the executor thread after each run of inputs, on every wake-up from
    /// [`Bolt::waker`] and at least every 50 ms, for a bolt whose work completes outside
    /// `execute` (a multilang subprocess): it emits, acks and fails through `out` here. Only
    /// bolts with a waker are polled.
    fn poll(&mut self, _out: &mut BoltCollector<'_>) {}
    /// A channel whose messages wake the idle executor to [`Bolt::poll`] this bolt; `None`
    /// (the default) for a bolt that does all its work in `execute`.
    fn waker(&self) -> Option<crossbeam_channel::Receiver<()>> {
        None
    }
    /// The worker is shutting down; not guaranteed to be called on a crash.
    fn cleanup(&mut self) {}
}

/// Collects a component's declared output streams.
#[derive(Debug, Default, Clone)]
pub struct OutputDeclarer {
    pub(crate) streams: Vec<(String, Fields)>,
}

impl OutputDeclarer {
    /// Declares the default stream with these fields.
    pub fn declare(&mut self, fields: Fields) {
        self.declare_stream(DEFAULT_STREAM, fields);
    }

    /// Declares stream `stream` with these fields (a later declaration of the same stream wins).
    pub fn declare_stream(&mut self, stream: &str, fields: Fields) {
        self.streams.retain(|(s, _)| s != stream);
        self.streams.push((stream.to_owned(), fields));
    }

    /// The declared streams.
    pub fn streams(&self) -> &[(String, Fields)] {
        &self.streams
    }
}

/// What a task knows about its place in the topology (Storm's `TopologyContext`).
#[derive(Debug, Clone)]
pub struct TopologyContext {
    /// The topology's name.
    pub topology_name: String,
    /// This task's component.
    pub component_id: ComponentId,
    /// This task.
    pub task_id: TaskId,
    /// All tasks of this component, ascending (this task's index in it is Storm's task index).
    pub component_tasks: Vec<TaskId>,
    /// The topology's configuration.
    pub config: Arc<TopologyConfig>,
    /// Tasks of every component (Storm's `getComponentTasks`), e.g. for `emit_direct`.
    pub tasks_by_component: Arc<BTreeMap<ComponentId, Vec<TaskId>>>,
}

impl TopologyContext {
    /// This task's index among its component's tasks (Storm's `getThisTaskIndex`).
    pub fn task_index(&self) -> usize {
        self.component_tasks.iter().position(|t| *t == self.task_id).unwrap_or(0)
    }

    /// The tasks of `component`, ascending (empty for an unknown component).
    pub fn tasks_of(&self, component: &str) -> &[TaskId] {
        self.tasks_by_component
            .iter()
            .find(|(c, _)| c.as_str() == component)
            .map_or(&[], |(_, t)| t.as_slice())
    }
}

/// Builds one spout instance per task.
pub type SpoutFactory = Arc<dyn Fn() -> Box<dyn Spout> + Send + Sync>;
/// Builds one bolt instance per task.
pub type BoltFactory = Arc<dyn Fn() -> Box<dyn Bolt> + Send + Sync>;
