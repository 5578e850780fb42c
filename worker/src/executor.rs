//! Executors: one OS thread each, running the tasks `[start end]` of one component.
//!
//! Inbound queues hold batches. A bolt's queue is bounded (`topology.executor.receive.buffer.size`
//! tuples), so a slow bolt blocks its senders and, through them, the spouts: backpressure
//! instead of memory growth. Spout and acker queues carry only acking messages and are
//! unbounded: acking traffic is bounded by the pending tuples (`topology.max.spout.pending`), and
//! keeping it unbounded means a cycle spout -> bolt -> acker -> spout can never deadlock.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cluster_state::ids::{ComponentId, ExecutorId, TaskId};
use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};
use hdrhistogram::Histogram;
use tokio_util::sync::CancellationToken;

use crate::acker::{AckLedger, AckMsg};
use crate::bolt_cell::{BoltCell, BoltCore, Poisoned};
use crate::collector::{
    Batch, BoltCollector, Emitter, Envelope, ErrorSender, OutStream, Pass, SharedRoutes, SpoutCollector,
    SpoutPending, Subscriber, own_inbox,
};
use crate::component::{Bolt, Spout, TopologyContext};
use crate::error::{Error, Result};
use crate::grouping::Chooser;
use crate::layout::TaskLayout;
use crate::pending::{PendingTrees, PendingTuple};
use crate::queue::{QueueReceiver, QueueSender};
use crate::stats::ExecStats;
use crate::topology::{ACKER_COMPONENT, ComponentKind, Topology};
use crate::tuple::{Anchors, Fields, SYSTEM_COMPONENT, StreamMeta, TICK_STREAM, Tuple, Value};

/// How often an idle executor looks at its cancellation token.
const IDLE_POLL: Duration = Duration::from_millis(50);
/// How often a spout publishes its complete-latency histogram.
const HIST_PUBLISH: Duration = Duration::from_millis(100);

/// Every stream of the topology with its index (the same in every worker: components sorted
/// by id, streams in declaration order) and its subscribers.
#[derive(Debug, Default)]
pub(crate) struct StreamTable {
    pub(crate) metas: Vec<Arc<StreamMeta>>,
    by_key: BTreeMap<(ComponentId, String), usize>,
}

impl StreamTable {
    pub(crate) fn new(topology: &Topology) -> Self {
        let mut table = StreamTable::default();
        for spec in topology.components().values() {
            for (stream, fields) in &spec.outputs {
                let index = table.metas.len();
                table.metas.push(Arc::new(StreamMeta {
                    component: spec.id.clone(),
                    stream: stream.clone(),
                    fields: fields.clone(),
                    index: index as u32,
                }));
                table.by_key.insert((spec.id.clone(), stream.clone()), index);
            }
        }
        table
    }

    pub(crate) fn get(&self, component: &ComponentId, stream: &str) -> Option<&Arc<StreamMeta>> {
        self.by_key.get(&(component.clone(), stream.to_owned())).map(|i| &self.metas[*i])
    }
}

/// Output streams of `component`, with one chooser per subscriber.
pub(crate) fn out_streams(
    topology: &Topology,
    layout: &TaskLayout,
    table: &StreamTable,
    component: &ComponentId,
    local_tasks: &BTreeSet<TaskId>,
    seed: u64,
) -> Vec<OutStream> {
    let Some(spec) = topology.components().get(component) else { return Vec::new() };
    spec.outputs
        .iter()
        .filter_map(|(stream, fields)| {
            let meta = table.get(component, stream)?.clone();
            let subscribers = topology
                .components()
                .values()
                .flat_map(|sub| sub.inputs.iter().map(move |i| (sub, i)))
                .filter(|(_, i)| i.from == component.as_str() && &i.stream == stream)
                .map(|(sub, i)| {
                    let tasks = layout.component_tasks.get(&sub.id).cloned().unwrap_or_default();
                    Subscriber { chooser: Chooser::new(&i.grouping, fields, &tasks, local_tasks, seed) }
                })
                .collect();
            Some(OutStream { meta, subscribers })
        })
        .collect()
}

/// What every executor of a worker shares.
#[derive(Debug, Clone)]
pub(crate) struct Shared {
    pub(crate) topology: Arc<Topology>,
    pub(crate) layout: Arc<TaskLayout>,
    pub(crate) table: Arc<StreamTable>,
    pub(crate) routes: Arc<SharedRoutes>,
    pub(crate) errors: Option<ErrorSender>,
    pub(crate) active: Arc<AtomicBool>,
    pub(crate) cancel: CancellationToken,
}

/// A started executor.
#[derive(Debug)]
pub(crate) struct RunningExecutor {
    pub(crate) id: ExecutorId,
    pub(crate) component: ComponentId,
    pub(crate) stats: Arc<ExecStats>,
    pub(crate) thread: Option<JoinHandle<()>>,
    pub(crate) is_spout: bool,
    /// Set when its thread ended because a spout or bolt panicked (on its own thread, or, for a
    /// bolt, on an upstream thread that ran it inline). Shared by an acker run on a spout's
    /// thread: the acker dies with it.
    pub(crate) died: Arc<AtomicBool>,
}

/// Marks an executor dead when its thread unwinds (a spout or bolt panicked).
struct DeathWatch(Arc<AtomicBool>);

impl DeathWatch {
    /// `run`, as an executor thread's body watched by this guard.
    fn around(self, run: impl FnOnce() + Send + 'static) -> impl FnOnce() + Send + 'static {
        move || {
            let _watch = self;
            run();
        }
    }
}

impl Drop for DeathWatch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Release);
        }
    }
}

/// The inbound queue of an executor of `component`: bounded for bolts, unbounded otherwise.
pub(crate) fn inbox(
    topology: &Topology,
    component: &ComponentId,
) -> (QueueSender<Batch>, QueueReceiver<Batch>) {
    match topology.components().get(component) {
        Some(spec) if !spec.is_spout() => crate::queue::bounded(topology.config().queue_batches()),
        _ => crate::queue::unbounded(),
    }
}

/// An executor's queue as its thread takes it: a bolt's in its cell (which an upstream thread
/// may also run it from), a spout's or an acker's plain.
pub(crate) enum ExecutorInbox {
    Queue(QueueReceiver<Batch>),
    Bolt(Arc<BoltCell>),
}

/// The emitter of executor `id` of `component`, publishing to `stats`.
fn emitter_of(
    shared: &Shared,
    id: ExecutorId,
    component: &ComponentId,
    local_tasks: &BTreeSet<TaskId>,
    stats: Arc<ExecStats>,
) -> Emitter {
    let streams = out_streams(
        &shared.topology,
        &shared.layout,
        &shared.table,
        component,
        local_tasks,
        u64::from(id.start_task().0),
    );
    let ackers = if shared.topology.config().effective_acker_executors() > 0 {
        ComponentId::new(ACKER_COMPONENT)
            .ok()
            .and_then(|a| shared.layout.component_tasks.get(&a).cloned())
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let config = shared.topology.config();
    Emitter::new(
        component.clone(),
        id.start_task(),
        streams,
        shared.routes.clone(),
        config.producer_batch_size as usize,
        Duration::from_micros(config.batch_flush_interval_us),
        ackers,
        shared.errors.clone(),
        stats,
    )
}

/// Starts the executor `id` of `component` on its own thread. A spout executor may also run
/// the acker executor `fused_acker` on that thread (its tasks' inbox is the spout's): its
/// entry, without a thread of its own, comes second.
pub(crate) fn spawn(
    shared: &Shared,
    id: ExecutorId,
    component: ComponentId,
    inbox: ExecutorInbox,
    local_tasks: &BTreeSet<TaskId>,
    fused_acker: Option<ExecutorId>,
    inline: bool,
) -> Result<(RunningExecutor, Option<RunningExecutor>)> {
    let stats = Arc::new(ExecStats::new(id));
    // A bolt executor's flag is its cell's (set there by an inline run's panic too).
    let died = match &inbox {
        ExecutorInbox::Bolt(cell) => cell.died.clone(),
        ExecutorInbox::Queue(_) => Arc::default(),
    };
    let watch = DeathWatch(died.clone());
    let tasks: Vec<TaskId> = id.tasks().collect();
    let emitter = emitter_of(shared, id, &component, local_tasks, stats.clone());
    let acker = fused_acker.and_then(|acker_id| {
        let acker_component = ComponentId::new(ACKER_COMPONENT).ok()?;
        let acker_stats = Arc::new(ExecStats::new(acker_id));
        let em = emitter_of(shared, acker_id, &acker_component, local_tasks, acker_stats.clone());
        let entry = RunningExecutor {
            id: acker_id,
            component: acker_component,
            stats: acker_stats,
            thread: None,
            is_spout: false,
            died: died.clone(),
        };
        Some((em, entry))
    });
    let (acker_em, acker_entry) = acker.map_or((None, None), |(em, entry)| (Some(em), Some(entry)));
    let tasks_by_component = Arc::new(shared.layout.component_tasks.clone());
    let ctx = |task: TaskId| TopologyContext {
        topology_name: shared.topology.name().to_owned(),
        component_id: component.clone(),
        task_id: task,
        component_tasks: shared.layout.component_tasks.get(&component).cloned().unwrap_or_default(),
        config: shared.topology.config().clone(),
        tasks_by_component: tasks_by_component.clone(),
    };
    let contexts: Vec<TopologyContext> = tasks.iter().map(|t| ctx(*t)).collect();
    let shared2 = shared.clone();
    let name = format!("{component}-{}", id.start_task());
    let builder = std::thread::Builder::new().name(name);
    let spec = shared.topology.components().get(&component);
    let (thread, is_spout) = match (spec.map(|s| s.kind.clone()), inbox) {
        (Some(ComponentKind::Spout(factory)), ExecutorInbox::Queue(inbox)) => {
            let spouts: Vec<Box<dyn Spout>> = tasks.iter().map(|_| factory()).collect();
            let st = stats.clone();
            let died = died.clone();
            let run =
                move || run_spout(shared2, emitter, inbox, spouts, contexts, st, acker_em, &died, inline);
            (builder.spawn(watch.around(run)), true)
        }
        (Some(ComponentKind::Bolt(factory)), inbox) => {
            let cell = match inbox {
                ExecutorInbox::Bolt(cell) => cell,
                ExecutorInbox::Queue(rx) => BoltCell::new(rx, died.clone()),
            };
            let bolts: Vec<Box<dyn Bolt>> = tasks.iter().map(|_| factory()).collect();
            let st = stats.clone();
            let run = move || run_bolt(shared2, emitter, cell, bolts, contexts, st, inline);
            (builder.spawn(watch.around(run)), false)
        }
        (None, ExecutorInbox::Queue(inbox)) if component.as_str() == ACKER_COMPONENT => {
            (builder.spawn(watch.around(move || run_acker(shared2, emitter, inbox))), false)
        }
        (None, ExecutorInbox::Queue(_)) => {
            return Err(Error::Executor {
                executor: id.to_string(),
                reason: format!("unknown component {component}"),
            });
        }
        (_, ExecutorInbox::Bolt(_)) => {
            return Err(Error::Executor {
                executor: id.to_string(),
                reason: format!("{component} is not a bolt but was given a bolt executor's queue"),
            });
        }
    };
    let thread = thread.map_err(|e| Error::Executor { executor: id.to_string(), reason: e.to_string() })?;
    Ok((RunningExecutor { id, component, stats, thread: Some(thread), is_spout, died }, acker_entry))
}

/// A spout's `open` or a bolt's `prepare` failed: the error goes to `/storm/errors` and the
/// executor is marked dead, as if it had panicked. Storm's executor dies with its worker when
/// `open` / `prepare` throws, and its supervisor starts a fresh worker (`squall worker` does,
/// `process::run`); running on without the executor left its queue filling up and every
/// tree through it timing out, with only the error to tell why. (`report_error` logs it.)
fn report_start_failure(em: &mut Emitter, ctx: &TopologyContext, reason: String, died: &AtomicBool) {
    let err = Error::ComponentStart { component: ctx.component_id.to_string(), task: ctx.task_id.0, reason };
    em.report_error(err.to_string());
    em.flush();
    died.store(true, Ordering::Release);
}

// One function over 100 lines, on purpose: the spout executor's loop (verdicts, timeouts,
// activation, `next_tuple`, publishing stats) runs per batch, and its state lives in locals the
// compiler keeps in registers; the pieces that are not per batch are functions of their own
// (`on_done`, `fail_all`).
#[allow(clippy::too_many_arguments)]
fn run_spout(
    shared: Shared,
    mut em: Emitter,
    inbox: QueueReceiver<Batch>,
    mut spouts: Vec<Box<dyn Spout>>,
    contexts: Vec<TopologyContext>,
    stats: Arc<ExecStats>,
    acker: Option<Emitter>,
    died: &AtomicBool,
    inline: bool,
) {
    for (spout, ctx) in spouts.iter_mut().zip(&contexts) {
        if let Err(e) = spout.open(ctx) {
            report_start_failure(&mut em, ctx, e.to_string(), died);
            // The worker's acker still serves the other spouts' trees until the worker exits
            // (and for as long as a local cluster runs on).
            if let Some(acker) = acker {
                run_acker(shared, acker, inbox);
            }
            return;
        }
    }
    let config = shared.topology.config().clone();
    let own_tasks: Vec<TaskId> = contexts.iter().map(|c| c.task_id).collect();
    let mut fused = acker.map(|em| FusedAcker::new(em, own_tasks));
    let ackers_here = fused.as_ref().map(|a| a.em.stats.executor.tasks().collect()).unwrap_or_default();
    let mut pending =
        SpoutPending { per_task: vec![0; spouts.len()], ackers_here, ..SpoutPending::default() };
    let rotate_every = Duration::from_millis(config.message_timeout_secs.saturating_mul(1000) / 2)
        .max(Duration::from_millis(1));
    let mut next_rotate = Instant::now() + rotate_every;
    let wait = Duration::from_millis(config.spout_wait_ms);
    // The first waits of an idle streak, until the streak is `wait` long (`SpoutWait`).
    let mut idle = SpoutWait::new(Duration::from_micros(config.spout_wait_short_us), wait);
    let linger = Duration::from_micros(config.spout_linger_us);
    let batch = config.producer_batch_size as usize;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 2).ok();
    let mut lat = LatencyAcc::default();
    let mut last_publish = Instant::now();
    let mut was_active = false;
    // Counted here (registers on the per-tree path), handed to the emitter to publish.
    let mut acked = 0u64;
    let mut failed = 0u64;
    // After tasks moved: until when trees may have gone to a place that is gone, and when to
    // look next (see `MovedSweep`).
    let mut sweep: Option<MovedSweep> = None;
    // Tasks moved (news from the worker's control loop), not yet acted on.
    let mut moved = false;
    // Acks the bolts this thread runs inline sent to the acker fused here (`own_inbox`).
    let mut own = Batch::new();
    own_inbox::claim(inbox.key());

    loop {
        if shared.cancel.is_cancelled() {
            break;
        }
        // The pass's clock: the time of the verdicts the inline bolts sent here and of the
        // checks below. At half load a pass emits 3-4 sentences, and each clock read was ~1%
        // of the thread. (Its emits read the clock themselves: a spout's `next_tuple` may take
        // a while before it emits, a multilang one a round trip to its subprocess.)
        let now = Instant::now();
        own_inbox::swap(&mut own);
        if !own.is_empty() {
            let verdicts = (&mut acked, &mut failed);
            on_done(
                &mut spouts,
                &mut pending,
                &mut own,
                (&mut lat, &mut hist, Some(now)),
                verdicts,
                &mut moved,
                &mut fused,
            );
        }
        while let Ok(mut b) = inbox.try_recv() {
            let verdicts = (&mut acked, &mut failed);
            let times = (&mut lat, &mut hist, None);
            on_done(&mut spouts, &mut pending, &mut b, times, verdicts, &mut moved, &mut fused);
        }
        if std::mem::take(&mut moved) {
            // The routes were replaced before the news was sent: take them now, so that
            // everything emitted after `moved_at` goes to the tasks' new places.
            em.refresh_routes();
            let now = Instant::now();
            sweep = Some(MovedSweep { until: now + MOVED_TASKS_WINDOW, next: now + MOVED_TASKS_GRACE });
        }
        if let Some(s) = sweep.as_mut()
            && now >= s.next
        {
            // Trees older than the grace are lost, if they were emitted before the other
            // workers can have applied the same assignment (`until`).
            let cutoff = now.checked_sub(MOVED_TASKS_GRACE).map_or(s.until, |c| c.min(s.until));
            let lost = pending.trees.remove_where(|_, p| p.emitted_at <= cutoff);
            if !lost.is_empty() {
                tracing::info!(component = %em.component, trees = lost.len(), "failing tuples whose trees went through a worker that is gone; they replay now");
            }
            fail_all(&mut spouts, &mut pending.per_task, lost, &mut failed);
            if cutoff >= s.until {
                sweep = None;
            } else {
                s.next = now + MOVED_TASKS_SWEEP;
            }
        }
        // The acker on this thread forgets its trees on the spout's schedule (the same
        // period), also when the spout does not time its tuples out.
        if (config.enable_message_timeouts || fused.is_some()) && now >= next_rotate {
            next_rotate = now + rotate_every;
            if let Some(acker) = fused.as_mut() {
                acker.ledger.rotate();
            }
            if config.enable_message_timeouts {
                let timed_out = pending.trees.rotate();
                fail_all(&mut spouts, &mut pending.per_task, timed_out, &mut failed);
            }
        }
        let active = shared.active.load(Ordering::Relaxed);
        if active != was_active {
            for s in spouts.iter_mut() {
                if active { s.activate() } else { s.deactivate() }
            }
            was_active = active;
        }
        let mut emitted = false;
        // A task held back by `topology.max.spout.pending`: its verdicts, not time, let it go on.
        let mut capped = false;
        pending.new_pass();
        // A burst (a rate-limited spout catching up) goes to its subscribers as it is emitted.
        let mut pass = Pass::default();
        // Rounds of `next_tuple` calls this pass (the last one emitted nothing, unless all ran).
        let mut rounds = 0;
        if active {
            'rounds: for _ in 0..batch {
                rounds += 1;
                let mut any = false;
                for (i, spout) in spouts.iter_mut().enumerate() {
                    if config.max_spout_pending.is_some_and(|m| pending.per_task[i] >= m) {
                        capped = true;
                        continue;
                    }
                    em.task = contexts[i].task_id;
                    let mut out = SpoutCollector {
                        em: &mut em,
                        pending: &mut pending,
                        task_index: i,
                        emitted_any: false,
                    };
                    if let Err(e) = spout.next_tuple(&mut out) {
                        out.report_error(e);
                    }
                    any |= out.emitted_any;
                }
                let acked_now = std::mem::take(&mut pending.acked_now);
                if !acked_now.is_empty() {
                    for &(i, id) in &acked_now {
                        acked += 1;
                        spouts[i].ack(id);
                    }
                    // A batch of verdicts like the acker's (`on_done`): a spout that buffers
                    // acks applies them now, or acking off would leave them buffered.
                    for spout in spouts.iter_mut() {
                        spout.verdicts_delivered();
                    }
                }
                if !any {
                    break 'rounds;
                }
                emitted = true;
                pass.ran(&mut em);
            }
        }
        em.acked += std::mem::take(&mut acked);
        em.failed += std::mem::take(&mut failed);
        // Publishes the counts too (emitted, acked, ...). A partial batch held back by the
        // flush interval goes at `flush_at` at the latest: the wait below ends by then.
        // With no verdicts waiting, a partial batch for an idle local bolt executor runs here
        // (`BoltCell::try_run`): at partial load the spout's thread splits its own sentences.
        em.inline_ok = inline && inbox.is_empty() && own_inbox::is_empty();
        let flush_at = em.flush_paced();
        em.inline_ok = false;
        // Ran dry (or emitted nothing) and not held back by max pending: about to wait, this
        // thread first runs what a local bolt executor's thread was woken for and has had no
        // core to run (`BoltCell::help`). Not under load: a spout that did not run dry, or
        // waits for verdicts, doing its bolts' work cost word count 4% of its throughput.
        if inline && !capped && rounds < batch {
            em.help_stalled();
        }
        if let Some(acker) = fused.as_mut() {
            acker.flush();
        }
        stats.pending.store(pending.trees.len() as u64, Ordering::Relaxed);
        // Merging histograms walks every bucket: publish at most every HIST_PUBLISH.
        if let Some(h) = hist.as_mut()
            && lat.n > 0
            && now.saturating_duration_since(last_publish) >= HIST_PUBLISH
        {
            stats.record_complete(h, lat.sum_ns, lat.n);
            lat = LatencyAcc::default();
            last_publish = now;
        }
        if emitted {
            idle.reset();
            if rounds < batch && !capped && !linger.is_zero() {
                // Ran dry: linger until `linger` after the pass began (`squall.spout.linger.us`),
                // taking verdicts (the inline bolts' at once, as at the top of the loop).
                let until = now + linger;
                let mut serve = |b: &mut Batch, at: Option<Instant>| {
                    let times = (&mut lat, &mut hist, at);
                    on_done(
                        &mut spouts,
                        &mut pending,
                        b,
                        times,
                        (&mut acked, &mut failed),
                        &mut moved,
                        &mut fused,
                    );
                };
                loop {
                    own_inbox::swap(&mut own);
                    if !own.is_empty() {
                        serve(&mut own, Some(Instant::now()));
                    }
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    match inbox.recv_timeout(left) {
                        Ok(mut b) => serve(&mut b, None),
                        Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
                    }
                }
            }
        } else {
            // Held back by max pending, it waits for verdicts (their arrival ends the wait), so
            // looking again sooner would only cut its next burst short.
            let mut timeout = match (active, capped) {
                (false, _) => IDLE_POLL,
                (true, true) => wait,
                (true, false) => idle.next(),
            };
            if let Some(at) = flush_at {
                timeout = timeout.min(at.saturating_duration_since(Instant::now()));
            }
            // Acks the inline bolts just sent here are taken at once, as they would be from
            // the queue.
            if !own_inbox::is_empty() {
                continue;
            }
            match inbox.recv_timeout(timeout) {
                Ok(mut b) => on_done(
                    &mut spouts,
                    &mut pending,
                    &mut b,
                    (&mut lat, &mut hist, None),
                    (&mut acked, &mut failed),
                    &mut moved,
                    &mut fused,
                ),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
    }
    if was_active {
        for s in spouts.iter_mut() {
            s.deactivate();
        }
    }
    for s in spouts.iter_mut() {
        s.close();
    }
    em.flush();
    if let Some(acker) = fused.as_mut() {
        acker.flush();
    }
    own_inbox::release();
}

/// How long a spout executor that emitted nothing waits (`squall.spout.wait.short.us`): the
/// short wait while the idle streak is shorter than the long one, then the long one, until it
/// emits again. Not for a spout held back by max pending: that one waits for verdicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SpoutWait {
    short: Duration,
    long: Duration,
    /// The waits of the current streak, added up.
    streak: Duration,
}

impl SpoutWait {
    /// `short` 0 (or not shorter than `long`): the long wait only.
    fn new(short: Duration, long: Duration) -> Self {
        SpoutWait {
            short: if short.is_zero() { long } else { short.min(long) },
            long,
            streak: Duration::ZERO,
        }
    }

    /// The next wait of the streak.
    fn next(&mut self) -> Duration {
        let wait = if self.streak < self.long { self.short } else { self.long };
        self.streak = self.streak.saturating_add(wait);
        wait
    }

    /// The spout emitted: the next wait starts a streak.
    fn reset(&mut self) {
        self.streak = Duration::ZERO;
    }
}

/// The worker's acker executor run on a spout executor's thread (`WorkerRuntime::start` pairs
/// them): the acker's tasks share the spout's inbox, so a tree whose root this spout emitted
/// is settled where it is tracked, with no verdict sent between threads, and the worker has
/// one thread fewer competing for cores. Its counts are the acker executor's own (`em`).
struct FusedAcker {
    /// Counts its verdicts (published by `flush`) and sends those for other spout executors.
    em: Emitter,
    ledger: AckLedger,
    /// The spout executor's tasks: their verdicts are settled in place.
    own_tasks: Vec<TaskId>,
    /// A verdict was sent since the last flush.
    sent: bool,
}

impl FusedAcker {
    fn new(em: Emitter, own_tasks: Vec<TaskId>) -> Self {
        FusedAcker { em, ledger: AckLedger::default(), own_tasks, sent: false }
    }

    /// Applies an acker message; the verdict when it decides a tree, `None` otherwise. A tree
    /// this spout executor emitted is tracked in its pending trees (`trees`, whose `Init` was
    /// applied there); another's in the ledger, and its verdict is sent to its spout task.
    fn apply(&mut self, trees: &mut PendingTrees, msg: AckMsg) -> Option<(u64, bool)> {
        let here = match msg {
            AckMsg::Ack { root, val } => trees.xor_acks(root, val).map(|done| done.then_some((root, true))),
            AckMsg::Fail { root } if trees.acked_here(root) => Some(Some((root, false))),
            _ => None,
        };
        // The verdict, and the spout task to send it to when that is not this executor's.
        let (root, ok, elsewhere) = match here {
            Some(verdict) => {
                let (root, ok) = verdict?;
                (root, ok, None)
            }
            None => {
                let o = self.ledger.apply(msg)?;
                (o.root, o.ok, (!self.own_tasks.contains(&o.spout_task)).then_some(o.spout_task))
            }
        };
        count_verdict(&mut self.em, ok);
        let Some(task) = elsewhere else { return Some((root, ok)) };
        self.sent = true;
        // Routes replaced since (tasks moved) are taken before sending, as the acker's own
        // thread does per batch.
        self.em.refresh_routes();
        self.em.send(Envelope::Ack { task, msg: AckMsg::Done { root, ok } });
        None
    }

    /// Publishes the acker's counts and hands over its verdicts for other executors, when
    /// there are any: a spout emitting without message ids passes here thousands of times a
    /// second with nothing to publish.
    fn flush(&mut self) {
        if self.em.acked == 0 && self.em.failed == 0 && !std::mem::take(&mut self.sent) {
            return;
        }
        self.em.flush();
    }
}

/// Counts a verdict as the acker executor's (`em`, published at its flush).
fn count_verdict(em: &mut Emitter, ok: bool) {
    if ok {
        em.acked += 1;
    } else {
        em.failed += 1;
    }
}

/// Fails tuples taken out of the pending map (timed out, or lost with a worker).
fn fail_all(
    spouts: &mut [Box<dyn Spout>],
    per_task: &mut [u32],
    lost: Vec<(u64, PendingTuple)>,
    failed: &mut u64,
) {
    for (_, p) in lost {
        per_task[p.task_index] = per_task[p.task_index].saturating_sub(1);
        *failed += 1;
        spouts[p.task_index].fail(p.msg_id);
    }
}

/// After tasks moved, the spout looks for lost trees until this long after the move: every
/// worker applies the new assignment when its own ZooKeeper watch fires, so for a moment a bolt
/// elsewhere may still ack to (or emit toward) a task's old place, even for a tree this worker
/// emitted after it took the new routes.
const MOVED_TASKS_WINDOW: Duration = Duration::from_secs(5);
/// How often the pending trees are scanned during that window.
const MOVED_TASKS_SWEEP: Duration = Duration::from_millis(200);

/// The lost-tree sweep after tasks moved: trees emitted before `until` that are still pending
/// [`MOVED_TASKS_GRACE`] after their emission are failed; next scan at `next`.
#[derive(Debug, Clone, Copy)]
struct MovedSweep {
    until: Instant,
    next: Instant,
}

/// How long trees in flight when tasks moved get to complete before they count as lost: acks
/// of live trees arrive within milliseconds (complete latency p99 is under a millisecond at
/// half load), so this is generous, and far below Storm's 30 s message timeout.
const MOVED_TASKS_GRACE: Duration = Duration::from_secs(1);

/// Applies acker verdicts to the spout tasks, and notes when tasks moved (`moved`). The
/// complete latencies go to `lat` and `hist`, measured to `now` (the pass's clock), or to
/// one clock read for the batch when it has none: its verdicts arrived together.
fn on_done(
    spouts: &mut [Box<dyn Spout>],
    pending: &mut SpoutPending,
    b: &mut Batch,
    (lat, hist, mut now): (&mut LatencyAcc, &mut Option<Histogram<u64>>, Option<Instant>),
    (acked, failed): (&mut u64, &mut u64),
    moved: &mut bool,
    fused: &mut Option<FusedAcker>,
) {
    for env in b.drain(..) {
        let Envelope::Ack { msg, .. } = env else { continue };
        let (root, ok) = match msg {
            AckMsg::TasksMoved => {
                *moved = true;
                continue;
            }
            AckMsg::Done { root, ok } => (root, ok),
            // Init, Ack, Fail: for the worker's acker running on this thread.
            msg => match fused.as_mut().and_then(|a| a.apply(&mut pending.trees, msg)) {
                Some(verdict) => verdict,
                None => continue,
            },
        };
        if let Some(p) = pending.trees.remove(root) {
            pending.per_task[p.task_index] = pending.per_task[p.task_index].saturating_sub(1);
            if ok {
                *acked += 1;
                let now = *now.get_or_insert_with(Instant::now);
                let ns = now.saturating_duration_since(p.emitted_at).as_nanos() as u64;
                lat.sum_ns += ns;
                lat.n += 1;
                if let Some(h) = hist.as_mut() {
                    let _ = h.record((ns / 1000).max(1));
                }
                spouts[p.task_index].ack(p.msg_id);
            } else {
                *failed += 1;
                spouts[p.task_index].fail(p.msg_id);
            }
        }
    }
    for spout in spouts.iter_mut() {
        spout.verdicts_delivered();
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct LatencyAcc {
    sum_ns: u64,
    n: u64,
}

fn tick_meta() -> Option<Arc<StreamMeta>> {
    Some(Arc::new(StreamMeta {
        component: ComponentId::new(SYSTEM_COMPONENT).ok()?,
        stream: TICK_STREAM.to_owned(),
        fields: Fields::new(["rate_secs"]),
        index: u32::MAX,
    }))
}

/// A bolt executor's own thread: prepares its bolts, then runs what reaches its queue, its
/// ticks and its held batches, holding its cell (`BoltCell`) while it works; between passes
/// the cell is free for an upstream thread to run it inline.
fn run_bolt(
    shared: Shared,
    mut em: Emitter,
    cell: Arc<BoltCell>,
    mut bolts: Vec<Box<dyn Bolt>>,
    contexts: Vec<TopologyContext>,
    stats: Arc<ExecStats>,
    inline: bool,
) {
    for (bolt, ctx) in bolts.iter_mut().zip(&contexts) {
        if let Err(e) = bolt.prepare(ctx) {
            report_start_failure(&mut em, ctx, e.to_string(), &cell.died);
            return;
        }
    }
    let start = contexts.first().map_or(TaskId(0), |c| c.task_id);
    let tick_secs = bolts
        .first()
        .and_then(|b| b.tick_tuple_freq_secs())
        .or(shared.topology.config().tick_tuple_freq_secs);
    let tick = tick_secs.map(Duration::from_secs).zip(tick_meta());
    let mut next_tick = tick.as_ref().map(|(every, _)| Instant::now() + *every);
    // Bolts that finish work outside `execute` (multilang) wake the executor and are polled.
    let wakers: Vec<Receiver<()>> = bolts.iter().filter_map(|b| b.waker()).collect();
    let inline = inline && wakers.is_empty();
    let component = em.component.clone();
    match cell.lock() {
        Ok(mut core) => *core = Some(BoltCore::new(bolts, em, &shared.table, start, stats, inline)),
        Err(Poisoned) => return,
    }
    // When the first batch held back by the flush interval is due (`Emitter::flush_paced`).
    let mut flush_at: Option<Instant> = None;
    loop {
        // The clock is read only when tick tuples are on or a batch is held back (5% of a busy
        // bolt's CPU otherwise).
        let wake_at = next_tick.into_iter().chain(flush_at).min();
        let timeout =
            wake_at.map_or(IDLE_POLL, |t| t.saturating_duration_since(Instant::now()).min(IDLE_POLL));
        // Batches are taken from the queue only while holding the cell, so that a batch an
        // upstream thread runs inline never overtakes one queued before it. A multilang bolt
        // (never run inline) takes its first batch as it wakes.
        let first = if wakers.is_empty() {
            cell.inbox.wait_timeout(timeout);
            None
        } else {
            match crate::multilang::recv_or_wake(cell.inbox.channel(), &wakers, timeout) {
                Ok(b) => Some(b),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        };
        let Ok(mut guard) = cell.lock() else {
            tracing::error!(%component, "a bolt of this executor panicked while its state was held; the executor stops");
            return;
        };
        // Gone: a bolt panicked while run inline (`BoltCell::try_run`).
        let Some(core) = guard.as_mut() else { return };
        let mut next = first.map(Ok);
        let mut disconnected = false;
        loop {
            let mut b = match next.take().unwrap_or_else(|| cell.inbox.try_recv()) {
                Ok(b) => b,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    disconnected = true;
                    break;
                }
            };
            // Working on the last batch queued: nothing else waits, so an idle downstream
            // executor may run on this thread instead of being woken.
            core.em.inline_ok = inline && cell.inbox.is_empty();
            core.process(&mut b);
            if shared.cancel.is_cancelled() {
                break;
            }
        }
        if let (Some(at), Some((every, meta))) = (next_tick, tick.as_ref())
            && Instant::now() >= at
        {
            next_tick = Some(Instant::now() + *every);
            for ctx in &contexts {
                let t = Tuple {
                    values: [Value::Int(every.as_secs() as i64)].into_iter().collect(),
                    meta: meta.clone(),
                    source_task: TaskId(0),
                    anchors: Anchors::None,
                    ack_val: 0.into(),
                };
                core.execute(ctx.task_id, &t);
            }
        }
        if !wakers.is_empty() {
            poll_bolts(&mut core.bolts, &contexts, &mut core.em);
        }
        // Publishes the counts too (emitted, acked, ...). The partial batches of the pass's
        // last batch run inline like its full ones.
        flush_at = core.em.flush_paced();
        core.end_pass();
        core.em.inline_ok = false;
        drop(guard);
        if disconnected || shared.cancel.is_cancelled() {
            break;
        }
    }
    // Taken out of the cell: nobody runs it inline any more.
    let core = cell.lock().ok().and_then(|mut c| c.take());
    if let Some(mut core) = core {
        core.em.flush();
        for b in core.bolts.iter_mut() {
            b.cleanup();
        }
    }
}

/// Lets every bolt of the executor apply work it finished outside `execute`.
fn poll_bolts(bolts: &mut [Box<dyn Bolt>], contexts: &[TopologyContext], em: &mut Emitter) {
    for (bolt, ctx) in bolts.iter_mut().zip(contexts) {
        em.task = ctx.task_id;
        bolt.poll(&mut BoltCollector { em: &mut *em });
    }
}

fn run_acker(shared: Shared, mut em: Emitter, inbox: QueueReceiver<Batch>) {
    let mut ledger = AckLedger::default();
    let rotate_every =
        Duration::from_millis(shared.topology.config().message_timeout_secs.saturating_mul(1000) / 2)
            .max(Duration::from_millis(1));
    let mut next_rotate = Instant::now() + rotate_every;
    let mut flush_at: Option<Instant> = None;
    loop {
        let wake_at = flush_at.map_or(next_rotate, |f| f.min(next_rotate));
        let timeout = wake_at.saturating_duration_since(Instant::now()).min(IDLE_POLL);
        match inbox.recv_timeout(timeout) {
            Ok(mut b) => loop {
                em.refresh_routes();
                for env in b.drain(..) {
                    if let Envelope::Ack { msg, .. } = env
                        && let Some(outcome) = ledger.apply(msg)
                    {
                        count_verdict(&mut em, outcome.ok);
                        em.send(Envelope::Ack {
                            task: outcome.spout_task,
                            msg: AckMsg::Done { root: outcome.root, ok: outcome.ok },
                        });
                    }
                }
                match inbox.try_recv() {
                    Ok(next) => b = next,
                    Err(_) => break,
                }
            },
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if Instant::now() >= next_rotate {
            next_rotate = Instant::now() + rotate_every;
            ledger.rotate();
        }
        // Publishes the counts too.
        flush_at = em.flush_paced();
        if shared.cancel.is_cancelled() {
            break;
        }
    }
    em.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idle spout looks again after the short wait for the first long wait's worth of its
    /// streak, then after the long wait, and starts over once it emits.
    #[test]
    fn an_idle_spout_waits_short_first_then_long() {
        let us = Duration::from_micros;
        let mut w = SpoutWait::new(us(100), us(1_000));
        let streak: Vec<Duration> = (0..13).map(|_| w.next()).collect();
        assert_eq!(streak[..10], [us(100); 10]);
        assert_eq!(streak[10..], [us(1_000); 3]);
        w.reset();
        assert_eq!(w.next(), us(100), "emitting starts a new streak");
        // Off (0), or not shorter than the long wait: the long wait only.
        for short in [us(0), us(1_000), us(5_000)] {
            let mut w = SpoutWait::new(short, us(1_000));
            assert!((0..5).all(|_| w.next() == us(1_000)), "{short:?}");
        }
        // A long wait of 0 (a busy spout loop, as configured) stays 0.
        let mut w = SpoutWait::new(us(100), Duration::ZERO);
        assert_eq!(w.next(), Duration::ZERO);
    }
}
