//! A bolt executor's state behind a lock, so that an idle bolt executor can be run on the thread
//! of an upstream executor in the same worker instead of waking its own.
//!
//! A bolt executor's thread that works on the last batch in its queue (it has nothing else to
//! do) hands a batch for a local bolt executor that is idle (its queue empty, its lock free)
//! to that executor's tuples right there, on its own thread ([`BoltCell::try_run`]), instead
//! of queueing it and waking the other thread. At partial load a word count's split then
//! counts its own words: two threads are busy instead of three, and on two cores no thread of
//! the pipeline waits a scheduler slice for a core behind the others (most of the half-load
//! latency tail, issue 21). A spout executor's thread does the same at the end of a pass when
//! no verdicts wait for its acker (the spout splits its own sentences): a hand-over and a
//! wake-up fewer per batch, which halved the word count's median complete latency at half load.
//! A busy downstream executor (its lock held, or input queued) gets the batch queued as before,
//! and an upstream executor with input of its own waiting queues too: under load every executor
//! runs on its own thread, in parallel. Only partial batches run inline (a full one always
//! goes to the executor's own thread), and only those expected to take at most
//! [`INLINE_BUDGET`] by what the executor's recent batches took per tuple ([`RecentCost`]; none
//! before its first batch): a slow bolt does not hold its upstream's thread, nor a spout's
//! acker, for long, and one that turns slow stops being run inline within a batch or two.
//!
//! An executor run inline hands its own partial batches over the same way at the end of its
//! run, so a chain of idle executors runs on the first one's thread (the spout's, at partial
//! load: a word count tree completes in microseconds with no hand-over), each batch within the
//! budget.
//!
//! Order holds: a batch runs inline only after what was already in the executor's queue, and
//! the executor's own thread takes from its queue only while it holds the lock. The worker
//! turns it on only for topologies without cycles (`squall.executor.inline.downstream`): a
//! thread takes these locks only with `try_lock` and in the order of the topology, and every
//! wait for a full queue ends downstream (acks go to unbounded spout and acker queues), so no
//! wait closes a cycle: no deadlock.
//!
//! A bolt that panics while run inline is caught on the borrowed thread: its executor's state is
//! dropped and the executor marked dead (the cell holds its death flag, `RunningExecutor::died`),
//! so its own thread ends as if the panic had happened there, and the upstream executor goes on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::Duration;

use cluster_state::ids::TaskId;

use crate::collector::{Batch, BoltCollector, Emitter, Envelope, Pass, Sent, own_inbox};
use crate::component::Bolt;
use crate::executor::StreamTable;
use crate::queue::QueueReceiver;
use crate::stats::{ExecStats, ExecuteSamples};
use crate::tuple::{StreamMeta, Tuple, Value, Values};

/// The longest an upstream thread is expected to spend running a batch for an idle executor
/// ([`BoltCell::try_run`]): a spout's thread then leaves its acker's verdicts waiting at most
/// about this long (a 100 us budget kept the half-load tail no better than none at all).
pub(crate) const INLINE_BUDGET: Duration = Duration::from_millis(1);

/// The most batches an executor's queue may hold for a spout's thread to run them, with its
/// own batch, instead of queueing behind them ([`BoltCell::try_run`]). At 64, the spout's
/// thread took count's queue over after every burst, and word count's half-load p99 <= 1 ms
/// held in 2 and 3 of 6 runs, against 4 and 6 at 4 (issue 21). At 1 rather than 4, a backlog
/// is left to count's own thread after its first batch, so count's state stays on one core
/// more: at 790k sentences/s with a neighbour process taking 3 ms of every 33, 27 of 30 runs
/// against 21 of 30 with idle CPUs polling (`squall.worker.cpu.latency.us: 0`), 14 of 18
/// against 11 of 18 without, quiet 18 of 18 against 17 of 18; at 0, 9 of 12. Full load moved
/// within the host's spread (issue 21, 2026-11-30).
pub(crate) const TAKE_OVER_QUEUED: usize = 1;

/// How long a bolt executor's thread, woken for its queued batches, may wait for a core before
/// a spout's thread that ran dry runs them ([`BoltCell::help`]). Waking an idle thread onto an
/// idle core takes a few microseconds; at 20 us and at 50 us, word count's half-load p99 <= 1 ms
/// held in about as many runs, with a tenth of a core taken by another process (issue 21).
pub(crate) const HELP_AFTER: Duration = Duration::from_micros(20);

/// What runs a bolt executor's tuples, on whichever thread holds it.
pub(crate) struct BoltCore {
    pub(crate) bolts: Vec<Box<dyn Bolt>>,
    pub(crate) em: Emitter,
    inputs: Inputs,
    /// The executor's first task (bolts are indexed from it).
    start: u32,
    /// Tuples executed, for sampling the execute latency.
    seen: u64,
    /// Execute latencies sampled in this batch (added to `stats` at its end).
    samples: ExecuteSamples,
    /// What its recent batches took per tuple, for [`Self::fits_inline`].
    cost: RecentCost,
    /// How its batches are handed over (`Emitter::copy_out`).
    hand_over: HandOver,
    stats: Arc<ExecStats>,
    /// Whether upstream threads may run it (not a multilang bolt: those also wait on their
    /// subprocesses, on their own thread).
    inline: bool,
    /// The pass's clock (`Pass`).
    pass: Pass,
}

impl BoltCore {
    pub(crate) fn new(
        bolts: Vec<Box<dyn Bolt>>,
        em: Emitter,
        table: &StreamTable,
        start: TaskId,
        stats: Arc<ExecStats>,
        inline: bool,
    ) -> Self {
        BoltCore {
            bolts,
            em,
            inputs: Inputs::new(table),
            start: start.0,
            seen: 0,
            samples: ExecuteSamples::new(),
            cost: RecentCost::default(),
            hand_over: HandOver::new(),
            stats,
            inline,
            pass: Pass::default(),
        }
    }

    /// Runs every tuple of `batch`, with the routes of now, and leaves it empty (with its
    /// capacity, for an upstream emitter that ran it inline to fill again).
    pub(crate) fn process(&mut self, batch: &mut Batch) {
        self.em.refresh_routes();
        let BoltCore { bolts, em, inputs, start, seen, samples, cost, hand_over, stats, pass, .. } = self;
        // Two clock reads per batch (not per tuple) time the whole batch for the budget, less
        // what it waited for a full queue downstream (backpressure, not the bolt's cost).
        let (began, seen_before, waited_before) =
            (samples.start(), *seen, stats.backpressure_ns.load(Ordering::Relaxed));
        for env in batch.drain(..) {
            if let Envelope::Tuple { task, tuple } = env
                && let Some(tuple) = inputs.take(tuple)
            {
                execute(bolts, em, *start, seen, samples, task, tuple);
                pass.ran(em);
            }
        }
        let waited = stats.backpressure_ns.load(Ordering::Relaxed).wrapping_sub(waited_before);
        let (ns, tuples) = (samples.nanos_since(began).saturating_sub(waited), *seen - seen_before);
        cost.note(ns, tuples);
        em.copy_out = hand_over.note(ns, tuples);
        samples.publish(stats);
    }

    /// Whether `tuples` more are expected to run within [`INLINE_BUDGET`], by what the recent
    /// batches took per tuple (not before the first batch).
    fn fits_inline(&self, tuples: usize) -> bool {
        self.cost.fits(tuples as u64, INLINE_BUDGET.as_nanos() as u64)
    }

    /// Ends a pass: its remaining partial batches were just handed over (or held) by the
    /// caller's flush.
    pub(crate) fn end_pass(&mut self) {
        self.pass = Pass::default();
    }

    /// Ends a run on a borrowed thread (`BoltCell::try_run`, `BoltCell::help`): its partial
    /// batches for idle executors run here in turn (the batches it fills go to their executors'
    /// threads; at partial load a spout's thread runs a whole word count tree with no
    /// hand-over). No pacing: this executor's thread is parked and would not wake for a held
    /// batch.
    fn end_borrowed_run(&mut self) {
        self.em.inline_ok = true;
        self.em.flush();
        self.em.inline_ok = false;
        self.end_pass();
    }

    /// Runs one tuple built here (a tick).
    pub(crate) fn execute(&mut self, task: TaskId, tuple: &Tuple) {
        execute(&mut self.bolts, &mut self.em, self.start, &mut self.seen, &mut self.samples, task, tuple);
        self.samples.publish(&self.stats);
    }
}

/// Runs `tuple` through the bolt of `task`; a bolt's error is reported and fails the tuple.
#[inline(always)]
fn execute(
    bolts: &mut [Box<dyn Bolt>],
    em: &mut Emitter,
    start: u32,
    seen: &mut u64,
    samples: &mut ExecuteSamples,
    task: TaskId,
    tuple: &Tuple,
) {
    let Some(bolt) = bolts.get_mut(task.0.wrapping_sub(start) as usize) else { return };
    em.task = task;
    *seen += 1;
    let started = samples.due().then(|| samples.start());
    let mut out = BoltCollector { em };
    if let Err(e) = bolt.execute(tuple, &mut out) {
        out.report_error(e);
        out.fail(tuple);
    }
    if let Some(t) = started {
        samples.record_since(t);
    }
}

/// What an executor's batches took per tuple lately: an average over its batches that halves a
/// batch's weight every ~2.4 batches (each new batch weighs 1/4), wherever they ran. The whole
/// batch is timed, the bolts' executes and the hand-overs of a long pass, less its waits for a
/// full queue downstream (those say how busy the next executor is, not what this one costs).
/// The mean sampled execute time over the executor's life, which the budget used first, let a
/// bolt that turned slow after thousands of fast tuples go on running on its upstream's thread
/// for thousands more.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecentCost {
    /// Nanoseconds per tuple; `None` before the first batch with a tuple.
    per_tuple_ns: Option<u64>,
}

impl RecentCost {
    /// Folds in a batch of `tuples` that took `ns` (nothing for a batch without tuples).
    pub(crate) fn note(&mut self, ns: u64, tuples: u64) {
        if tuples == 0 {
            return;
        }
        let batch = ns / tuples;
        self.per_tuple_ns = Some(match self.per_tuple_ns {
            None => batch,
            Some(avg) => avg - avg / 4 + batch / 4,
        });
    }

    /// Whether `tuples` are expected to take at most `budget_ns`.
    pub(crate) fn fits(&self, tuples: u64, budget_ns: u64) -> bool {
        self.per_tuple_ns.is_some_and(|ns| ns.saturating_mul(tuples) <= budget_ns)
    }
}

/// How a bolt executor hands its batches over: written in place (`Emitter::copy_out` off) or
/// built in a buffer that stays and streamed out (on), whichever its own batches cost less per
/// tuple lately. Which is cheaper depends on the host's moment, not on the code: on word count,
/// writing in place cost split's thread ~1.3 us per sentence in one stretch and ~2.7 in the
/// next, the streamed copy ~1.4 in both (issue 21). So it stays with one way for [`STAY`]
/// batches, tries the other for [`TRY`], and keeps the trial's way when that cost at least 5%
/// less per tuple. Batches without tuples say nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HandOver {
    copy: bool,
    /// Whether this stretch tries the other way.
    trial: bool,
    /// Batches (with tuples) left in this stretch.
    left: u32,
    /// Per way (in place, copy): nanoseconds and tuples of its latest stretch.
    sums: [(u64, u64); 2],
}

/// Batches a [`HandOver`] stays with the way it chose.
const STAY: u32 = 64;
/// Batches a [`HandOver`] tries the other way for.
const TRY: u32 = 8;

impl HandOver {
    /// In place first, for [`TRY`] batches.
    pub(crate) fn new() -> Self {
        HandOver { copy: false, trial: false, left: TRY, sums: [(0, 0); 2] }
    }

    /// Notes a batch of `tuples` that took `ns` the current way; whether the next copies out.
    pub(crate) fn note(&mut self, ns: u64, tuples: u64) -> bool {
        if tuples == 0 {
            return self.copy;
        }
        let way = usize::from(self.copy);
        let sum = &mut self.sums[way];
        *sum = (sum.0.saturating_add(ns), sum.1 + tuples);
        self.left -= 1;
        if self.left > 0 {
            return self.copy;
        }
        let per_tuple = |(ns, tuples): (u64, u64)| ns as f64 / tuples.max(1) as f64;
        if self.trial {
            // Keep the tried way only when it was clearly cheaper than the one stayed with.
            if per_tuple(self.sums[way]) >= 0.95 * per_tuple(self.sums[1 - way]) {
                self.copy = !self.copy;
            }
            self.trial = false;
            self.left = STAY;
        } else {
            self.copy = !self.copy;
            self.trial = true;
            self.left = TRY;
        }
        self.sums[usize::from(self.copy)] = (0, 0);
        self.copy
    }
}

/// A bolt executor: its queue, and its state once its bolts are prepared (`None` before, and
/// after its thread cleaned up).
pub(crate) struct BoltCell {
    core: Mutex<Option<BoltCore>>,
    pub(crate) inbox: QueueReceiver<Batch>,
    /// The executor's death flag (`RunningExecutor::died`): set here when one of its bolts
    /// panics while run inline, by its thread's guard when one panics there.
    pub(crate) died: Arc<AtomicBool>,
}

impl std::fmt::Debug for BoltCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoltCell").finish_non_exhaustive()
    }
}

/// The executor's state could not be taken: a bolt panicked while it was held.
#[derive(Debug)]
pub(crate) struct Poisoned;

impl BoltCell {
    pub(crate) fn new(inbox: QueueReceiver<Batch>, died: Arc<AtomicBool>) -> Arc<Self> {
        Arc::new(BoltCell { core: Mutex::new(None), inbox, died })
    }

    /// The executor's state, for its own thread (waits while an upstream thread runs it).
    pub(crate) fn lock(&self) -> Result<MutexGuard<'_, Option<BoltCore>>, Poisoned> {
        self.core.lock().map_err(|_| Poisoned)
    }

    /// Runs `batch` on this thread when the executor is not running elsewhere (prepared, not
    /// multilang), at most [`TAKE_OVER_QUEUED`] batches wait in its queue, and those (counted
    /// as `full` tuples each) and `batch` fit [`INLINE_BUDGET`]; says whether it did. The
    /// queued batches run first, so each sender's order is kept: they were queued when this
    /// executor was busy or a full batch went to it, and its thread, woken for them, may not
    /// have a core yet (on two busy cores a wake-up waited up to a scheduler slice, ~1 ms),
    /// while this thread is on one now. Refusing while anything was queued sent every batch
    /// after a burst to the woken thread (issue 21: at half load, the word count's count bolt
    /// then ran on its own thread 0.45-0.55 us per sentence where it took 0.15 on the spout's).
    ///
    /// A batch run is left empty in place: the emitter that ran it fills the same buffer again
    /// (a new one per inline run, grown by copying as the next pass's batch outgrew it, was ~4%
    /// of a spout's thread running a word count at half load). A batch not run is left as it
    /// was, to be queued.
    pub(crate) fn try_run(&self, batch: &mut Batch, full: usize) -> bool {
        // Only a spout's thread takes queued batches over: a bolt's thread doing so under load
        // would do its downstream's work instead of its own (word count at full load lost 5-7%
        // of its throughput that way).
        let may_take_over = if own_inbox::claimed() { TAKE_OVER_QUEUED } else { 0 };
        let queued = self.inbox.len();
        if queued > may_take_over {
            return false;
        }
        let mut guard = match self.core.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::WouldBlock | TryLockError::Poisoned(_)) => return false,
        };
        let work = batch.len().saturating_add(queued.saturating_mul(full));
        if !guard.as_ref().is_some_and(|c| c.inline && c.fits_inline(work)) {
            return false;
        }
        let ran = self.run_borrowed(&mut guard, |core| {
            // What was queued at the look above goes first, so each sender's order is kept
            // (what others queue since stays for the executor's own thread, woken for it).
            for _ in 0..queued {
                let Ok(mut b) = self.inbox.try_recv() else { break };
                core.process(&mut b);
            }
            core.process(batch);
            core.end_borrowed_run();
        });
        if !ran {
            // What the panic left of it goes with the executor, as on its own thread.
            batch.clear();
        }
        true
    }

    /// Runs what is queued for this executor on this thread, as many batches as fit
    /// [`INLINE_BUDGET`] (each counted as `full` tuples), when its own thread was woken for
    /// them at least [`HELP_AFTER`] ago and has not run since, and nothing else runs it (not
    /// multilang); says whether it ran any. For a spout's thread that ran dry and is about to
    /// wait: it has a core, the woken thread waits for one.
    ///
    /// On two cores a woken thread was placed on the core busy with another process (a 3 ms
    /// burst of CPU, a `kdamond` scan) and waited there up to that process's slice, while the
    /// other core went idle for ~60 us at a time between the spout's passes: too briefly for
    /// the kernel to pull it over (it balances a newly idle core only when that core's idle
    /// spells average over `sched_migration_cost`, 0.5 ms). The count bolt's batches then
    /// waited a millisecond or more behind a spout with nothing to do (issue 21).
    pub(crate) fn help(&self, full: usize) -> bool {
        if self.inbox.is_empty() || !self.inbox.woken_waiting(HELP_AFTER) {
            return false;
        }
        let mut guard = match self.core.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::WouldBlock | TryLockError::Poisoned(_)) => return false,
        };
        if !guard.as_ref().is_some_and(|c| c.inline) {
            return false;
        }
        let mut batches = 0usize;
        self.run_borrowed(&mut guard, |core| {
            // Taken while the lock is held, like the executor's own thread does: in order.
            while core.fits_inline(full.saturating_mul(batches + 1)) {
                let Ok(mut b) = self.inbox.try_recv() else { break };
                core.process(&mut b);
                batches += 1;
            }
            core.end_borrowed_run();
        });
        batches > 0
    }

    /// Runs `work` on the executor held in `guard`, on a thread borrowed from upstream; false
    /// when a bolt panicked. A bolt that panics here stops its own executor, as on its own
    /// thread, and not the executor whose thread it borrowed: its state is dropped, and its
    /// thread, finding none, ends.
    fn run_borrowed(
        &self,
        guard: &mut MutexGuard<'_, Option<BoltCore>>,
        work: impl FnOnce(&mut BoltCore),
    ) -> bool {
        let Some(core) = guard.as_mut() else { return false };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(core))).is_ok() {
            return true;
        }
        tracing::error!(component = %core.em.component, "a bolt panicked while run on an upstream executor's thread; its executor stops");
        **guard = None;
        self.died.store(true, Ordering::Release);
        false
    }
}

/// Turns tuples in flight into the [`Tuple`]s a bolt sees, with this executor's own copy of
/// every stream's metadata. One `Tuple` is reused while consecutive inputs share a stream, so
/// taking an input touches no reference count (a bolt that keeps a clone keeps its own).
struct Inputs {
    metas: Vec<Arc<StreamMeta>>,
    current: Option<Tuple>,
}

impl Inputs {
    fn new(table: &StreamTable) -> Self {
        Inputs { metas: table.metas.iter().map(|m| Arc::new(StreamMeta::clone(m))).collect(), current: None }
    }

    /// The tuple for `sent`; `None` for a stream this worker does not know (never the case for
    /// envelopes built in this topology).
    fn take(&mut self, sent: Sent) -> Option<&Tuple> {
        let Sent { values, stream, source_task, anchors } = sent;
        match &mut self.current {
            Some(t) if t.meta.index == stream => {
                replace_values(&mut t.values, values);
                t.source_task = source_task;
                t.anchors = anchors;
                t.ack_val = 0.into();
            }
            slot => {
                let meta = self.metas.get(stream as usize)?.clone();
                *slot = Some(Tuple { values, meta, source_task, anchors, ack_val: 0.into() });
            }
        }
        self.current.as_ref()
    }
}

/// `*slot = values`, without the call to the old values' drop when they own nothing: numbers
/// and inline texts (a word, a key), most inputs. The call was ~7% of a word count's
/// instructions per word (callgrind). The old values are looked at in place: moved out first,
/// they went through the stack.
#[inline(always)]
fn replace_values(slot: &mut Values, values: Values) {
    let owns_nothing = !slot.spilled()
        && slot.iter().all(|v| match v {
            Value::Str(s) => !s.is_heap_allocated(),
            Value::Bytes(_) => false,
            Value::Null | Value::Bool(_) | Value::Int(_) | Value::Float(_) => true,
        });
    if owns_nothing {
        std::mem::forget(std::mem::replace(slot, values));
    } else {
        *slot = values;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builtin::{SentenceParams, SentenceSpout, SplitSentence, WordCount};
    use crate::topology::TopologyBuilder;
    use crate::tuple::{Anchors, Value};

    #[test]
    fn inputs_reuse_a_tuple_only_within_one_stream() {
        let mut b = TopologyBuilder::new("t");
        b.set_spout("s", 1, || SentenceSpout::new(SentenceParams::default()));
        b.set_bolt("split", 1, SplitSentence::default).shuffle_grouping("s");
        b.set_bolt("count", 1, WordCount::default).fields_grouping("split", ["word"]);
        let table = StreamTable::new(&b.build().unwrap());
        let stream_of = |c: &str| table.metas.iter().find(|m| m.component.as_str() == c).unwrap().index;
        let (s, split) = (stream_of("s"), stream_of("split"));
        let anchor = Anchors::One(crate::tuple::Anchor { root: 1, edge: 2 });
        let sent = |stream, text: &str, task, anchors: &Anchors| Sent {
            values: [Value::from(text)].into_iter().collect(),
            stream,
            source_task: TaskId(task),
            anchors: anchors.clone(),
        };
        let mut inputs = Inputs::new(&table);
        let mut kept = Vec::new();
        for (stream, text, task, anchors) in [
            (s, "a b", 1, &anchor),
            (s, "c d", 1, &Anchors::None),
            (split, "w", 2, &anchor),
            (s, "e", 1, &Anchors::None),
        ] {
            let t = inputs.take(sent(stream, text, task, anchors)).unwrap();
            t.ack_val.xor(7);
            let c = t.clone();
            assert_eq!(c.get_str(0), Some(text));
            assert_eq!(c.source_task(), TaskId(task));
            assert_eq!(c.anchors(), anchors.as_slice());
            assert_eq!(c.meta.index, stream);
            kept.push(c);
        }
        // A reused tuple starts from a clean ack value; clones kept by a bolt are untouched.
        let t = inputs.take(sent(s, "f", 1, &Anchors::None)).unwrap();
        assert_eq!(t.ack_val.get(), 0);
        let texts: Vec<_> = kept.iter().map(|t| t.get_str(0).unwrap()).collect();
        assert_eq!(texts, ["a b", "c d", "w", "e"]);
        assert_eq!(kept[2].source_component().as_str(), "split");
        assert_eq!(kept[3].source_component().as_str(), "s");
        assert!(kept.iter().all(|t| t.ack_val.get() == 7));
        // An index no table has is refused, not a panic.
        assert!(inputs.take(sent(999, "x", 1, &Anchors::None)).is_none());
    }

    /// Records the text of every tuple it executes.
    struct Seen(Arc<Mutex<Vec<String>>>);

    impl Bolt for Seen {
        fn execute(
            &mut self,
            input: &Tuple,
            _out: &mut BoltCollector<'_>,
        ) -> Result<(), crate::ComponentError> {
            self.0.lock().unwrap().push(input.get_str(0).unwrap_or_default().to_owned());
            Ok(())
        }
    }

    /// A bolt executor of a `Seen` bolt (task 2, its input from spout task 1) in its cell, its
    /// cost per tuple known from a first batch (`first`, already taken from the record): the
    /// cell, its queue's sender, what it saw, and how to build a batch of texts for it.
    #[allow(clippy::type_complexity)]
    fn seen_cell()
    -> (Arc<BoltCell>, crate::queue::QueueSender<Batch>, Arc<Mutex<Vec<String>>>, impl Fn(&[&str]) -> Batch)
    {
        use cluster_state::ids::{ComponentId, ExecutorId};

        let mut b = TopologyBuilder::new("t");
        b.set_spout("s", 1, || SentenceSpout::new(SentenceParams::default()));
        b.set_bolt("seen", 1, SplitSentence::default).shuffle_grouping("s");
        let table = StreamTable::new(&b.build().unwrap());
        let stream = table.metas.iter().find(|m| m.component.as_str() == "s").unwrap().index;
        let batch = move |texts: &[&str]| -> Batch {
            texts
                .iter()
                .map(|t| Envelope::Tuple {
                    task: TaskId(2),
                    tuple: Sent {
                        values: [Value::from(*t)].into_iter().collect(),
                        stream,
                        source_task: TaskId(1),
                        anchors: Anchors::None,
                    },
                })
                .collect()
        };
        let seen = Arc::new(Mutex::new(Vec::new()));
        let routes = crate::collector::SharedRoutes::new(crate::collector::Routes::default());
        let stats = Arc::new(ExecStats::new(ExecutorId::single(TaskId(2))));
        let em = Emitter::new(
            ComponentId::new("seen").unwrap(),
            TaskId(2),
            Vec::new(),
            routes,
            4,
            Duration::from_millis(1),
            Vec::new(),
            None,
            stats.clone(),
        );
        let mut core = BoltCore::new(vec![Box::new(Seen(seen.clone()))], em, &table, TaskId(2), stats, true);
        // A first batch on its own thread times it (none runs inline before).
        core.process(&mut batch(&["first"]));
        let (tx, rx) = crate::queue::bounded::<Batch>(16);
        let cell = BoltCell::new(rx, Arc::new(AtomicBool::new(false)));
        *cell.lock().unwrap() = Some(core);
        assert_eq!(taken(&seen), ["first"]);
        (cell, tx, seen, batch)
    }

    fn taken(seen: &Mutex<Vec<String>>) -> Vec<String> {
        std::mem::take(&mut *seen.lock().unwrap())
    }

    /// An upstream thread runs a batch for an executor that is not running: with nothing
    /// queued from any thread; with up to `TAKE_OVER_QUEUED` queued only from a spout's thread
    /// (which runs the queued batches first, in order), and never past that.
    #[test]
    fn a_spout_thread_takes_a_few_queued_batches_over_in_order() {
        let (cell, tx, seen, batch) = seen_cell();

        // Nothing queued: any thread runs it, and the emptied buffer keeps its capacity.
        let mut mine = batch(&["a"]);
        let cap = mine.capacity();
        assert!(cell.try_run(&mut mine, 4));
        assert!(mine.is_empty() && mine.capacity() == cap);
        assert_eq!(taken(&seen), ["a"]);

        // Queued: a bolt's thread leaves it to the executor's own thread.
        // `TAKE_OVER_QUEUED` batches, the first of two tuples.
        let queued: Vec<Vec<String>> = (0..TAKE_OVER_QUEUED)
            .map(
                |i| if i == 0 { vec!["q1".to_owned(), "q2".to_owned()] } else { vec![format!("q{}", i + 2)] },
            )
            .collect();
        for texts in &queued {
            tx.send(batch(&texts.iter().map(String::as_str).collect::<Vec<_>>())).unwrap();
        }
        let mut mine = batch(&["b"]);
        assert!(!cell.try_run(&mut mine, 4));
        assert_eq!(mine.len(), 1, "left as it was, to be queued");
        assert!(taken(&seen).is_empty());

        // A spout's thread runs what is queued first, then its own.
        crate::collector::own_inbox::claim(1);
        assert!(cell.try_run(&mut mine, 4));
        let expected: Vec<String> = queued.into_iter().flatten().chain(["b".to_owned()]).collect();
        assert_eq!(taken(&seen), expected);
        assert!(cell.inbox.is_empty());

        // More than `TAKE_OVER_QUEUED` queued: the executor's own thread's work.
        for i in 0..=TAKE_OVER_QUEUED {
            tx.send(batch(&[&format!("r{i}")])).unwrap();
        }
        let mut mine = batch(&["c"]);
        assert!(!cell.try_run(&mut mine, 4));
        assert!(taken(&seen).is_empty());
        crate::collector::own_inbox::release();
    }

    /// A thread that ran dry runs the batches an executor's thread was woken for and has had
    /// no core to run (`BoltCell::help`), in order; not what a thread that was not parked will
    /// take, nor while the executor runs elsewhere.
    #[test]
    fn a_thread_that_ran_dry_runs_what_a_woken_thread_has_no_core_for() {
        let (cell, tx, seen, batch) = seen_cell();
        // Queued while its thread ran (no wake-up): its own thread's to take.
        tx.send(batch(&["own"])).unwrap();
        assert!(!cell.help(4));
        assert!(taken(&seen).is_empty());
        assert_eq!(cell.inbox.try_recv().map(|b| b.len()), Ok(1), "still queued");

        // Its thread parked, woken by the sends, and not running (this thread, not parked,
        // stands for one waiting in a run queue).
        cell.inbox.pretend_waiting(std::thread::current());
        tx.send(batch(&["w1", "w2"])).unwrap();
        tx.send(batch(&["w3"])).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !cell.inbox.woken_waiting(HELP_AFTER) {
            assert!(std::time::Instant::now() < deadline, "woken {HELP_AFTER:?} ago by now");
            std::thread::yield_now();
        }
        {
            // Run by another thread meanwhile: left alone.
            let _held = cell.lock().unwrap();
            assert!(!cell.help(4));
        }
        assert!(taken(&seen).is_empty());
        assert!(cell.help(4));
        assert_eq!(taken(&seen), ["w1", "w2", "w3"]);
        assert!(cell.inbox.is_empty());
        // Nothing left to run.
        assert!(!cell.help(4));
    }

    /// The hand-over stays with the way that costs less per tuple, tries the other every
    /// `STAY` batches, and follows a change of which is cheaper.
    #[test]
    fn the_hand_over_keeps_the_cheaper_way_and_follows_a_change() {
        let mut h = HandOver::new();
        // `ns_per_tuple(copy)`: the cost of a batch of 100 tuples each way; the ways taken.
        let run = |h: &mut HandOver, batches: usize, ns_per_tuple: &dyn Fn(bool) -> u64| {
            let mut copies = 0;
            for _ in 0..batches {
                let copy = h.copy;
                copies += usize::from(copy);
                h.note(ns_per_tuple(copy) * 100, 100);
            }
            copies
        };
        // In place is cheaper: after the first trial only the trials copy (8 in every 72).
        let copies = run(&mut h, 8 + 8 + 72 * 10, &|copy| if copy { 1_400 } else { 1_300 });
        assert_eq!(copies, 8 * 11, "only trials copy while in place is cheaper");
        assert!(!h.copy);
        // In place turns expensive: the stretch in progress ends (64 in place), the next trial
        // copies (8) and the copy stays, left only for the in-place trials (8 in every 72).
        let copies = run(&mut h, 64 + 8 + 72 * 9, &|copy| if copy { 1_400 } else { 2_700 });
        assert_eq!(copies, 8 + 64 * 9, "copies once that is cheaper");
        assert!(h.copy);
        // Within 5% is no reason to switch: the way in use stays.
        let copies = run(&mut h, 72 * 5, &|copy| if copy { 1_400 } else { 1_350 });
        assert_eq!(copies, 72 * 5 - 8 * 5, "only the in-place trials leave the copy");
        // A batch without tuples is not counted.
        let before = h.clone();
        assert_eq!(h.note(5_000, 0), before.copy);
        assert_eq!(h, before);
    }

    #[test]
    fn the_recent_cost_follows_a_bolt_that_turns_slow_and_fast_again() {
        let budget = 1_000_000;
        let mut cost = RecentCost::default();
        assert!(!cost.fits(1, budget), "no estimate before the first batch");
        cost.note(0, 0);
        assert!(!cost.fits(1, budget), "a batch without tuples tells nothing");
        // Thousands of 1 us tuples, four to a batch.
        for _ in 0..1_000 {
            cost.note(4_000, 4);
        }
        assert!(cost.fits(4, budget));
        // It turns 2 ms a tuple: after one batch of those a batch of four no longer fits, after
        // three not even one tuple does.
        cost.note(2_000_000, 1);
        assert!(!cost.fits(4, budget) && cost.fits(1, budget));
        cost.note(2_000_000, 1);
        cost.note(2_000_000, 1);
        assert!(!cost.fits(1, budget));
        // Fast again: a few batches later four fit again.
        let mut batches = 0;
        while !cost.fits(4, budget) {
            cost.note(4_000, 4);
            batches += 1;
            assert!(batches <= 20, "a slow spell is forgotten within a score of batches");
        }
        assert!(batches >= 3, "one fast batch does not undo a slow spell ({batches})");
    }
}
