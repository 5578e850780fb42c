//! The output side of an executor: stream tables, groupings, batching per destination, and
//! the collectors components emit through.
//!
//! Everything here is owned by one executor thread: no locks on the emit path. Tuples are
//! appended to a per-destination batch (another executor's queue, or a peer worker's
//! connection) and handed over when the batch is full or the executor runs out of input.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use crate::queue::QueueSender;
use cluster_state::ids::{ComponentId, TaskId};

/// Where components' errors go (drained by the worker's error reporter).
pub(crate) type ErrorSender = tokio::sync::mpsc::Sender<ErrorReport>;

use crate::acker::AckMsg;
use crate::bolt_cell::BoltCell;
use crate::error::Error;
use crate::grouping::{Chooser, SplitMix64};
use crate::pending::{PendingTrees, PendingTuple};
use crate::stats::ExecStats;
use crate::tuple::{Anchor, Anchors, DEFAULT_STREAM, StreamMeta, Tuple, Value, Values};

/// A tuple in flight. Its stream travels as an index into the topology's stream table: the
/// receiving executor attaches its own copy of the stream's metadata, so no reference count
/// is shared between the emitting and the receiving thread (an `Arc` cloned on one core and
/// dropped on the other cost the emitting bolt ~40% of its CPU in cache-line transfers).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sent {
    pub(crate) values: Values,
    /// Index in the stream table (the same in every worker of the topology).
    pub(crate) stream: u32,
    pub(crate) source_task: TaskId,
    /// Empty for an unanchored tuple; otherwise one entry per spout tree it belongs to.
    pub(crate) anchors: Anchors,
}

/// What travels between executors (and, encoded, between workers).
#[derive(Debug, Clone)]
pub(crate) enum Envelope {
    /// A tuple for task `task`.
    Tuple { task: TaskId, tuple: Sent },
    /// An acking message for task `task` (an acker, or a spout for `Done`).
    Ack { task: TaskId, msg: AckMsg },
}

impl Envelope {
    pub(crate) fn task(&self) -> TaskId {
        match self {
            Envelope::Tuple { task, .. } | Envelope::Ack { task, .. } => *task,
        }
    }
}

// Every tuple on every queue is one envelope: a word count writes and reads one per word.
const _: () = assert!(std::mem::size_of::<Envelope>() <= 88, "an envelope stays 11 words");

/// A batch of envelopes: the unit of every queue.
pub(crate) type Batch = Vec<Envelope>;

/// Appends the envelope `$env` to the batch `$batch`, built in the batch's next slot.
///
/// `Vec::push` takes an envelope already built: the compiler assembles it on the stack (its
/// fields in 4- and 8-byte stores) and copies it into the slot in 16-byte loads, each load
/// waiting for the stores it straddles to retire (store-forwarding stalls: half of the split
/// bolt's `execute` samples on word count). Here room is made first and `$env` is evaluated
/// inside the write, so each field is stored once, into the slot. (A macro: passed in a
/// closure, the fields it captured were copied through the stack again.)
macro_rules! push_in_place {
    ($batch:expr, $env:expr) => {{
        let batch: &mut Batch = $batch;
        batch.reserve(1);
        let len = batch.len();
        if let Some(slot) = batch.spare_capacity_mut().first_mut() {
            slot.write($env);
            // SAFETY: `len < capacity` (the slot exists) and the element at `len` was
            // initialised by the write just above.
            #[allow(unsafe_code)]
            unsafe {
                batch.set_len(len + 1)
            };
        }
    }};
}

/// The envelopes of `buf` moved into a new batch of their number, written with streaming
/// (non-temporal) stores; `buf` is left empty, its memory kept for the next batch.
///
/// Writing each envelope straight into a fresh batch, whose memory the receiving executor's
/// core held last, costs a cache-line fetch per slot, and on some stretches of a shared host
/// those fetches doubled the split bolt's CPU per sentence on word count (issue 21: half load's
/// standing backlogs; full load at ~1.7 cores busy instead of ~1.95). Built in a buffer that
/// stays in this core's cache and streamed out in one pass, a batch costs about the same at
/// any time, and a little more than the direct writes when those are cheap; the emitter's
/// owner picks whichever costs less ([`crate::bolt_cell::HandOver`]).
#[cfg(target_arch = "x86_64")]
fn copy_out(buf: &mut Batch) -> Batch {
    use std::arch::x86_64::{_mm_sfence, _mm_stream_si64};
    const WORDS: usize = std::mem::size_of::<Envelope>() / 8;
    const _: () = assert!(
        std::mem::size_of::<Envelope>().is_multiple_of(8) && std::mem::align_of::<Envelope>() >= 8,
        "envelopes are copied as whole aligned 8-byte words"
    );
    let n = buf.len();
    let mut out: Batch = Vec::with_capacity(n);
    // SAFETY: `out` has room for `n` envelopes and does not overlap `buf`; both are aligned
    // for `Envelope`, so for 8-byte words. The `n` envelopes are moved bitwise (as
    // `Vec::append` moves them): `out` owns them once its length is set, and `buf`, its
    // length set to 0 first, no longer does. The fence orders the streaming stores before
    // whatever publishes `out` to another thread (they are not ordered by release stores).
    #[allow(unsafe_code)]
    unsafe {
        let src = buf.as_ptr().cast::<i64>();
        let dst = out.as_mut_ptr().cast::<i64>();
        buf.set_len(0);
        for i in 0..n * WORDS {
            _mm_stream_si64(dst.add(i), src.add(i).read());
        }
        _mm_sfence();
        out.set_len(n);
    }
    out
}

/// Elsewhere a plain move of the envelopes (one `memcpy`).
#[cfg(not(target_arch = "x86_64"))]
fn copy_out(buf: &mut Batch) -> Batch {
    let mut out = Vec::with_capacity(buf.len());
    out.append(buf);
    out
}

/// The inbox of the spout executor whose thread this is, taken without its queue.
///
/// A spout executor's thread runs its bolts inline at partial load (`BoltCell::try_run`), and
/// their acks go to the worker's acker, which runs on that same thread (fused: its tasks share
/// the spout's inbox). Sent through the queue, each batch of acks paid the channel's send and
/// receive and the bell's fence on the one thread that does all of a sentence's work. Here the
/// thread says which queue it receives from ([`claim`]); a batch an emitter on this thread
/// hands over to that queue is moved into the thread's own batch instead ([`take_from`]), and
/// the spout's loop takes it from there ([`swap`]) before it looks at its queue and before
/// it waits. Envelopes for any other queue, or sent from any other thread, go through the
/// queue as before. Measured (issue 21, docs/performance-log.md), the spout's thread then makes
/// fewer, larger passes at partial load (at 400k sentences/s ~34k a second, against 65-110k with
/// the acks queued; why, is not pinned down): at a fixed half load more runs kept p99 under
/// 1 ms, and the median rose to ~100 us.
pub(crate) mod own_inbox {
    use std::cell::{Cell, RefCell};

    use super::Batch;

    thread_local! {
        /// [`crate::queue::QueueReceiver::key`] of the queue this thread receives from; 0:
        /// none.
        static KEY: Cell<usize> = const { Cell::new(0) };
        /// What emitters on this thread handed over to that queue, in order.
        static HELD: RefCell<Batch> = const { RefCell::new(Vec::new()) };
    }

    /// This thread receives from the queue `key` from now on, until [`release`].
    pub(crate) fn claim(key: usize) {
        KEY.set(key);
    }

    /// This thread no longer receives from its queue; what it held is dropped (its loop has
    /// ended, as a queue's contents are dropped with the queue).
    pub(crate) fn release() {
        KEY.set(0);
        HELD.with_borrow_mut(Vec::clear);
    }

    /// Moves `buf`'s envelopes into this thread's own batch when `key` is the queue this
    /// thread receives from (true); false, `buf` untouched, otherwise.
    #[inline]
    pub(crate) fn take_from(key: usize, buf: &mut Batch) -> bool {
        if KEY.get() != key {
            return false;
        }
        HELD.with_borrow_mut(|held| held.append(buf));
        true
    }

    /// Whether this thread is a spout executor's (it has claimed its queue).
    pub(crate) fn claimed() -> bool {
        KEY.get() != 0
    }

    /// Whether nothing is held.
    pub(crate) fn is_empty() -> bool {
        HELD.with_borrow(Vec::is_empty)
    }

    /// Swaps what is held with `into` (empty: its memory serves the next envelopes).
    pub(crate) fn swap(into: &mut Batch) {
        HELD.with_borrow_mut(|held| std::mem::swap(held, into));
    }
}

/// Where each task's envelopes go, from one worker.
#[derive(Debug, Default)]
pub(crate) struct Routes {
    /// Destination index per task id (index 0 unused); `u32::MAX` for unassigned tasks.
    pub(crate) dest_of_task: Vec<u32>,
    /// Destination queues: local executors' inboxes and peer workers' send queues.
    pub(crate) dests: Vec<QueueSender<Batch>>,
    /// Per destination, the bolt executor behind it when an upstream thread may run it inline
    /// (`BoltCell::try_run`; a local bolt executor of a topology without cycles). Weak: the
    /// executor's thread owns it, and when that thread ends its queue goes with it, so a sender
    /// blocked on the full queue sees it closed instead of waiting forever.
    pub(crate) cells: Vec<Option<Weak<BoltCell>>>,
}

/// Routes that the worker may replace when the assignment changes; executors pick up a new
/// version between batches.
#[derive(Debug, Default)]
pub(crate) struct SharedRoutes {
    version: AtomicU64,
    routes: RwLock<Arc<Routes>>,
}

impl SharedRoutes {
    pub(crate) fn new(routes: Routes) -> Arc<Self> {
        Arc::new(SharedRoutes { version: AtomicU64::new(1), routes: RwLock::new(Arc::new(routes)) })
    }

    pub(crate) fn replace(&self, routes: Routes) {
        let mut guard = self.routes.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        *guard = Arc::new(routes);
        self.version.fetch_add(1, Ordering::Release);
    }

    fn load(&self) -> (u64, Arc<Routes>) {
        let version = self.version.load(Ordering::Acquire);
        let routes = self.routes.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        (version, routes)
    }
}

/// One subscriber of a stream.
#[derive(Debug)]
pub(crate) struct Subscriber {
    pub(crate) chooser: Chooser,
}

/// One declared output stream of the executor's component.
#[derive(Debug)]
pub(crate) struct OutStream {
    pub(crate) meta: Arc<StreamMeta>,
    pub(crate) subscribers: Vec<Subscriber>,
}

/// An error a component reported, on its way to `/storm/errors`.
#[derive(Debug, Clone)]
pub struct ErrorReport {
    pub component: ComponentId,
    pub task: TaskId,
    pub error: String,
}

/// Partial batches to one destination within one flush interval, sent at once, after which
/// the destination's partial batches are paced (one per interval).
const PACE_AFTER: u32 = 3;

/// How partial batches go to one destination (`Emitter::flush_paced`). A destination that
/// gets partial batches faster than [`PACE_AFTER`] per flush interval (an executor running
/// out of input every few microseconds at partial load: batches of one or two tuples, each
/// waking the receiver) is paced: its next partial batch is held until one interval after
/// the last, collecting what the executor's next passes add. Pacing ends when a held batch
/// collected nothing before it was due (a trickle, or input that itself comes in paced
/// batches): then partial batches go at once again. At half load this cut a word count's CPU
/// per tuple by 40%; a trickle is not held back.
#[derive(Debug, Clone, Copy)]
struct Pace {
    /// When the last partial batch went (read only while holding, which starts at a send).
    last: Instant,
    /// Partial batches sent at once since the instant, within one interval of it.
    window: (Instant, u32),
    /// Partial batches wait until one interval after `last`.
    holding: bool,
    /// The held batch's length at the last look, and whether a look before it was due found
    /// it grown (a pass added to it).
    seen: usize,
    merged: bool,
    /// Batches sent so far (wrapping), and its value at a long pass's last look (`Pass`) when
    /// the batch was open then: a batch still open at the next look with no batch sent in
    /// between has waited a whole interval and is handed over; a younger one waits.
    sent: u32,
    open_at_look: Option<u32>,
}

impl Default for Pace {
    fn default() -> Self {
        let now = Instant::now();
        Pace {
            last: now,
            window: (now, 0),
            holding: false,
            seen: 0,
            merged: false,
            sent: 0,
            open_at_look: None,
        }
    }
}

/// Tuples run (or spout rounds) between two looks at the clock during a pass.
const LOOK_EVERY: u32 = 64;

/// A long pass hands its partial batches over once per flush interval instead of at its end: a
/// bolt working off a backlog (a burst of sentences after its spout was held up, ~1.2 us each
/// in split) kept every ack of the pass until its last tuple, so each tree of a 1,000-sentence
/// burst completed at once, over a millisecond after its first could have; a spout emitting
/// such a burst kept it from split until its last sentence. The clock is read once per
/// [`LOOK_EVERY`] tuples, and never in a pass shorter than that. Only a batch that was already
/// open at the previous look goes: under load every pass is long, and handing over each
/// batch at every look halved the batches to a destination they fill within an interval
/// (words to count over TCP: word count over two processes did 15% fewer words per CPU-s).
#[derive(Debug, Default)]
pub(crate) struct Pass {
    /// Tuples run since the last look.
    since: u32,
    /// When the pass's partial batches were last handed over (or its first look).
    mark: Option<Instant>,
}

impl Pass {
    /// Counts one tuple (or round) of the pass, handing `em`'s partial batches over when a
    /// flush interval passed since the last hand-over.
    #[inline]
    pub(crate) fn ran(&mut self, em: &mut Emitter) {
        self.since += 1;
        if self.since >= LOOK_EVERY {
            self.since = 0;
            self.look(em);
        }
    }

    fn look(&mut self, em: &mut Emitter) {
        let now = Instant::now();
        match self.mark {
            Some(mark) if now.saturating_duration_since(mark) >= em.flush_interval => {
                em.hand_over_partial();
                self.mark = Some(now);
            }
            Some(_) => {}
            None => {
                // The pass's first look: the batches open now are handed over at the next.
                em.note_open_batches();
                self.mark = Some(now);
            }
        }
    }
}

/// The executor's output machinery.
#[derive(Debug)]
pub(crate) struct Emitter {
    pub(crate) component: ComponentId,
    pub(crate) task: TaskId,
    streams: Vec<OutStream>,
    /// The index in `streams` of the default stream, if it declares one.
    default_stream: Option<usize>,
    shared: Arc<SharedRoutes>,
    version: u64,
    routes: Arc<Routes>,
    bufs: Vec<Batch>,
    /// How partial batches go to each destination (`flush_paced`).
    paces: Vec<Pace>,
    /// `squall.batch.flush.interval.us`: the shortest time between two partial batches to one
    /// destination.
    flush_interval: Duration,
    batch_size: usize,
    /// Acker tasks; empty when acking is off.
    pub(crate) ackers: Vec<TaskId>,
    pub(crate) rng: SplitMix64,
    targets: Vec<TaskId>,
    /// The one task the last emit went to when it had no choice (`emit_one`); `targets` holds
    /// them otherwise.
    sole_target: Option<TaskId>,
    errors: Option<ErrorSender>,
    pub(crate) stats: Arc<ExecStats>,
    pub(crate) emitted: u64,
    pub(crate) transferred: u64,
    /// What the executor acked and failed since the last flush (a bolt's inputs, a spout's or
    /// an acker's trees), published by [`Self::flush`]. A bolt's are not kept in its
    /// [`BoltCollector`]: a collector's counters, zeroed together before `execute` and read
    /// back after it, were loaded as one 16-byte word straddling two stores (a stall costing
    /// a counting bolt ~10% of its time).
    pub(crate) acked: u64,
    pub(crate) failed: u64,
    /// Whether a batch for an idle local bolt executor may run on this thread instead of
    /// being queued for its own (`BoltCell::try_run`): set by a bolt executor's loop while it
    /// works on the last batch of its queue, by a spout executor's while no verdicts wait for
    /// it, and for an executor run inline at the end of its run (`flush`); never for an
    /// acker's emitter.
    pub(crate) inline_ok: bool,
    /// Whether a batch handed over is first copied out of its buffer with streaming stores
    /// ([`copy_out`]); chosen per executor by what its batches cost ([`crate::bolt_cell::HandOver`]).
    pub(crate) copy_out: bool,
}

impl Emitter {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        component: ComponentId,
        task: TaskId,
        streams: Vec<OutStream>,
        shared: Arc<SharedRoutes>,
        batch_size: usize,
        flush_interval: Duration,
        ackers: Vec<TaskId>,
        errors: Option<ErrorSender>,
        stats: Arc<ExecStats>,
    ) -> Self {
        let (version, routes) = shared.load();
        let bufs: Vec<Batch> = (0..routes.dests.len()).map(|_| Vec::new()).collect();
        Emitter {
            component,
            task,
            default_stream: streams.iter().position(|s| s.meta.stream == DEFAULT_STREAM),
            streams,
            shared,
            version,
            routes,
            paces: vec![Pace::default(); bufs.len()],
            bufs,
            flush_interval,
            batch_size: batch_size.max(1),
            ackers,
            rng: SplitMix64::new(
                0x5eed ^ u64::from(task.0).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ now_nanos(),
            ),
            targets: Vec::new(),
            sole_target: None,
            errors,
            stats,
            emitted: 0,
            transferred: 0,
            acked: 0,
            failed: 0,
            inline_ok: false,
            copy_out: false,
        }
    }

    pub(crate) fn acking(&self) -> bool {
        !self.ackers.is_empty()
    }

    /// The index in `streams` of the output stream `stream`.
    ///
    /// The default stream (most emits), passed as [`DEFAULT_STREAM`] itself, is known by its
    /// address without comparing names: static text at that address can only be that text.
    /// Any other `"default"` takes the comparison, with the same answer.
    #[inline(always)]
    fn stream_index(&self, stream: &str) -> Option<usize> {
        if std::ptr::eq(stream, DEFAULT_STREAM) {
            return self.default_stream;
        }
        self.streams.iter().position(|s| s.meta.stream == stream)
    }

    /// Routes one envelope, handing over the destination's batch when it is full.
    ///
    /// `send`, `emit_with` and the bolt collector's `emit_inner` are inlined into each caller:
    /// as calls, each wrote the tuple to the stack and the next read it back with other widths
    /// (store-forwarding stalls: word count +15% per CPU-s inlined, measured interleaved).
    /// The hot senders below (`send_tuple`, `send_init`, `send_ack`) go further and build their
    /// envelope in its batch slot (`push_in_place!`); this one, for the rarer messages (a
    /// fail, a spout's `Done`), pushes an envelope built by its caller.
    #[inline(always)]
    pub(crate) fn send(&mut self, env: Envelope) {
        if let Some((dest, buf, full)) = self.batch_of(env.task()) {
            buf.push(env);
            if buf.len() >= full {
                self.flush_dest(dest);
            }
        }
    }

    /// The destination of `task`'s envelopes, its batch and the batch size (a full batch is
    /// handed over: `flush_dest`); `None` when the task is not assigned (yet): its envelopes
    /// are dropped like Storm does, acking replays them on timeout.
    #[inline(always)]
    fn batch_of(&mut self, task: TaskId) -> Option<(usize, &mut Batch, usize)> {
        let dest = self.routes.dest_of_task.get(task.0 as usize).copied().unwrap_or(u32::MAX) as usize;
        let full = self.batch_size;
        self.bufs.get_mut(dest).map(|buf| (dest, buf, full))
    }

    /// Sends a tuple from this task to `task`: its envelope, and its values (`values()`, called
    /// once), are built in the batch slot.
    #[inline(always)]
    fn send_tuple(&mut self, task: TaskId, values: impl FnOnce() -> Values, stream: u32, anchors: Anchors) {
        let source_task = self.task;
        if let Some((dest, buf, full)) = self.batch_of(task) {
            push_in_place!(
                buf,
                Envelope::Tuple { task, tuple: Sent { values: values(), stream, source_task, anchors } }
            );
            if buf.len() >= full {
                self.flush_dest(dest);
            }
        }
    }

    /// Sends `Init(root, val)` of a tree this spout task emitted to `acker`.
    #[inline(always)]
    fn send_init(&mut self, acker: TaskId, root: u64, val: u64) {
        let spout_task = self.task;
        if let Some((dest, buf, full)) = self.batch_of(acker) {
            push_in_place!(buf, Envelope::Ack { task: acker, msg: AckMsg::Init { root, val, spout_task } });
            if buf.len() >= full {
                self.flush_dest(dest);
            }
        }
    }

    /// Sends `Ack(root, val)` to `acker`, XORed into the batch's last envelope when that is an
    /// `Ack` of the same tree: the acker only ever XORs the values of a tree together, so one
    /// message carrying `a ^ b` is the same to it as `a` then `b`. The words of a sentence reach
    /// a counting bolt one after another and are acked one after another: their acks become one
    /// message (the acker's work per tree no longer grows with the words).
    ///
    /// The XOR is inlined into the bolt's ack; a new message is written out of line
    /// ([`Self::push_ack`]). As one function, the hand-over it may end with made every ack save
    /// and restore registers: 20 instructions per word of a word count with acking (callgrind).
    #[inline(always)]
    pub(crate) fn send_ack(&mut self, acker: TaskId, root: u64, val: u64) {
        if let Some((_, buf, _)) = self.batch_of(acker)
            && let Some(Envelope::Ack { task, msg: AckMsg::Ack { root: last, val: acc } }) = buf.last_mut()
            && *task == acker
            && *last == root
        {
            *acc ^= val;
            return;
        }
        self.push_ack(acker, root, val);
    }

    /// [`Self::send_ack`]'s new message: the batch's last envelope is not an `Ack` of this tree.
    #[inline(never)]
    fn push_ack(&mut self, acker: TaskId, root: u64, val: u64) {
        let Some((dest, buf, full)) = self.batch_of(acker) else { return };
        push_in_place!(buf, Envelope::Ack { task: acker, msg: AckMsg::Ack { root, val } });
        if buf.len() >= full {
            self.flush_dest(dest);
        }
    }

    fn flush_dest(&mut self, dest: usize) {
        if self.bufs[dest].is_empty() {
            return;
        }
        if let Some(pace) = self.paces.get_mut(dest) {
            pace.sent = pace.sent.wrapping_add(1);
        }
        // Acks for the fused acker of the spout executor whose thread runs this bolt inline.
        if own_inbox::take_from(self.routes.dests[dest].key(), &mut self.bufs[dest]) {
            return;
        }
        // In place, the next batch starts with the capacity this one needed: a busy
        // destination keeps full-size batches, one that gets a few tuples at a time keeps small
        // buffers (batches are large, and an executor has one per destination). Copied out, the
        // buffer keeps what it grew to, at most a full batch.
        let batch = if self.copy_out {
            copy_out(&mut self.bufs[dest])
        } else {
            let cap = self.bufs[dest].len();
            std::mem::replace(&mut self.bufs[dest], Vec::with_capacity(cap))
        };
        // A closed queue means its executor or connection is gone (shutdown or reconnect):
        // drop the batch, acking replays what mattered.
        match self.routes.dests[dest].try_send(batch) {
            Ok(()) | Err(crossbeam_channel::TrySendError::Disconnected(_)) => {}
            Err(crossbeam_channel::TrySendError::Full(batch)) => {
                // Backpressure: the slow consumer holds this executor up; the wait is measured.
                let waited = std::time::Instant::now();
                let _ = self.routes.dests[dest].send(batch);
                self.stats.backpressure_ns.fetch_add(waited.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
        }
    }

    /// Runs the batch for `dest` on this thread when this thread may and the bolt executor
    /// behind it is idle (`BoltCell::try_run`); false, with the batch left in place, otherwise.
    #[inline]
    fn run_inline(&mut self, dest: usize) -> bool {
        if !self.inline_ok {
            return false;
        }
        let Some(cell) = self.routes.cells.get(dest).and_then(Option::as_ref).and_then(Weak::upgrade) else {
            return false;
        };
        // Run in place: the buffer, emptied, keeps its capacity for the next pass.
        cell.try_run(&mut self.bufs[dest], self.batch_size)
    }

    /// Runs the queued batches of local bolt executors whose threads were woken for them and
    /// still wait for a core (`BoltCell::help`): for a spout executor's thread that ran dry
    /// and would wait otherwise.
    pub(crate) fn help_stalled(&self) {
        for cell in self.routes.cells.iter().flatten().filter_map(Weak::upgrade) {
            cell.help(self.batch_size);
        }
    }

    /// Notes which batches are open, for the next `hand_over_partial`.
    fn note_open_batches(&mut self) {
        for (pace, buf) in self.paces.iter_mut().zip(&self.bufs) {
            pace.open_at_look = (!buf.is_empty()).then_some(pace.sent);
        }
    }

    /// A long pass's look ([`Pass`]), at most once per flush interval, so not paced: hands
    /// over the partial batches open since the last look (a batch opened since then, at a
    /// destination whose batches fill within an interval under load, say, would only be cut
    /// short), then notes the open ones for the next. Counters are published at the pass's end.
    fn hand_over_partial(&mut self) {
        for dest in 0..self.bufs.len() {
            if !self.bufs[dest].is_empty()
                && self.paces.get(dest).is_some_and(|p| p.open_at_look == Some(p.sent))
            {
                self.flush_dest(dest);
            }
        }
        self.note_open_batches();
    }

    /// Hands over every partial batch (running it on this thread where [`Self::run_inline`]
    /// may), publishes counters and picks up new routes.
    pub(crate) fn flush(&mut self) {
        for dest in 0..self.bufs.len() {
            if !self.bufs[dest].is_empty() && self.run_inline(dest) {
                continue;
            }
            self.flush_dest(dest);
        }
        self.publish();
        if self.shared.version.load(Ordering::Acquire) != self.version {
            let (version, routes) = self.shared.load();
            self.version = version;
            self.routes = routes;
            self.bufs = (0..self.routes.dests.len()).map(|_| Vec::new()).collect();
            self.paces = vec![Pace::default(); self.bufs.len()];
        }
    }

    fn publish(&mut self) {
        if self.emitted > 0 || self.transferred > 0 {
            self.stats.emitted.fetch_add(self.emitted, Ordering::Relaxed);
            self.stats.transferred.fetch_add(self.transferred, Ordering::Relaxed);
            self.emitted = 0;
            self.transferred = 0;
        }
        if self.acked > 0 || self.failed > 0 {
            self.stats.acked.fetch_add(self.acked, Ordering::Relaxed);
            self.stats.failed.fetch_add(self.failed, Ordering::Relaxed);
            self.acked = 0;
            self.failed = 0;
        }
    }

    /// Hands over partial batches like [`Self::flush`], paced per destination (see [`Pace`]):
    /// a destination that gets partial batches faster than [`PACE_AFTER`] per
    /// `flush_interval` gets at most one per interval while holding a batch back merges
    /// enough into it. Returns when the first batch held back is due (the executor waits no
    /// longer than that for input). A full batch always goes at once.
    pub(crate) fn flush_paced(&mut self) -> Option<Instant> {
        if self.flush_interval.is_zero() || self.shared.version.load(Ordering::Acquire) != self.version {
            // New routes: everything goes where it was routed first (`flush` takes them).
            self.flush();
            return None;
        }
        // The clock is read only when there is something to hand over.
        let due_first =
            if self.bufs.iter().any(|b| !b.is_empty()) { self.pace(Instant::now()) } else { None };
        self.publish();
        due_first
    }

    /// `flush_paced`'s hand-over at `now`.
    fn pace(&mut self, now: Instant) -> Option<Instant> {
        let interval = self.flush_interval;
        let mut due_first: Option<Instant> = None;
        for dest in 0..self.bufs.len() {
            let len = self.bufs[dest].len();
            if len == 0 {
                continue;
            }
            if self.run_inline(dest) {
                // A partial batch at the end of a pass, run on this thread by the idle
                // executor it was for: no wake-up to save by holding it. (A full batch always
                // goes to its executor's own thread: under load the two run in parallel.)
                continue;
            }
            let p = &mut self.paces[dest];
            if p.holding {
                let due = p.last + interval;
                if now < due {
                    if len != p.seen {
                        // A pass since the last look added to the held batch (or a full batch
                        // went).
                        p.merged |= p.seen > 0 && len > p.seen;
                        p.seen = len;
                    }
                    due_first = Some(due_first.map_or(due, |d| d.min(due)));
                    continue;
                }
                // Holding pays while passes before the batch is due add to it: each would have
                // woken the receiver with a batch of its own. What the pass at the due time
                // adds does not count: that pass is the wake-up holding cost this executor.
                p.holding = p.merged;
                p.window = (now, 1);
            } else if now.saturating_duration_since(p.window.0) < interval {
                p.window.1 += 1;
                p.holding = p.window.1 >= PACE_AFTER;
            } else {
                p.window = (now, 1);
            }
            p.last = now;
            p.seen = 0;
            p.merged = false;
            self.flush_dest(dest);
        }
        due_first
    }

    /// Picks up routes replaced since the last flush (one atomic load when they were not):
    /// called before a batch is processed, so that tuples never go to where a task was before
    /// an assignment moved it (those trees would wait for the message timeout).
    pub(crate) fn refresh_routes(&mut self) {
        if self.shared.version.load(Ordering::Acquire) != self.version {
            self.flush();
        }
    }

    /// Emits `values` on `stream`; `tree` is called once per target with the new tuple's edge
    /// id and returns its anchors. Returns the number of targets.
    #[inline(always)]
    fn emit_with(
        &mut self,
        stream: &str,
        direct: Option<TaskId>,
        values: Values,
        mut anchors_for: impl FnMut(&mut SplitMix64) -> Anchors,
    ) -> Result<usize, Error> {
        let Some(si) = self.stream_index(stream) else {
            return Err(Error::BadEmit {
                component: self.component.to_string(),
                stream: stream.to_owned(),
                reason: "stream not declared".into(),
            });
        };
        let (stream_index, arity) = (self.streams[si].meta.index, self.streams[si].meta.fields.len());
        if values.len() != arity {
            return Err(Error::BadEmit {
                component: self.component.to_string(),
                stream: stream.to_owned(),
                reason: format!("{} values for {arity} declared fields", values.len()),
            });
        }
        let mut targets = std::mem::take(&mut self.targets);
        targets.clear();
        self.sole_target = None;
        for sub in &mut self.streams[si].subscribers {
            match direct {
                Some(task) => {
                    if sub.chooser.is_direct() && sub.chooser.has_task(task) {
                        targets.push(task);
                    }
                }
                None => sub.chooser.choose(&values, &mut targets),
            }
        }
        if direct.is_some() && targets.is_empty() {
            self.targets = targets;
            return Err(Error::BadEmit {
                component: self.component.to_string(),
                stream: stream.to_owned(),
                reason: "direct emit to a task that does not subscribe to this stream with direct grouping"
                    .into(),
            });
        }
        self.emitted += 1;
        let n = targets.len();
        // Copies for all targets but the last, which takes the values themselves (moved once,
        // straight into its envelope).
        if let Some((last, rest)) = targets.split_last() {
            for task in rest {
                let anchors = anchors_for(&mut self.rng);
                self.transferred += 1;
                self.send_tuple(*task, || values.clone(), stream_index, anchors);
            }
            let anchors = anchors_for(&mut self.rng);
            self.transferred += 1;
            self.send_tuple(*last, move || values, stream_index, anchors);
        }
        self.targets = targets;
        Ok(n)
    }

    /// Emits the one-field tuple `[value]` on `stream`, as `emit_with` does. When the stream
    /// has one subscriber with one task (no choice to make), the value is converted only where
    /// it is written, in its batch slot: built first, it would be copied there from the stack
    /// with loads straddling the stores that built it (a quarter of the split bolt's time).
    #[inline(always)]
    fn emit_one(
        &mut self,
        stream: &str,
        value: impl Into<Value>,
        mut anchors_for: impl FnMut(&mut SplitMix64) -> Anchors,
    ) -> Result<usize, Error> {
        let sole = self.stream_index(stream).and_then(|si| {
            let out = &self.streams[si];
            match out.subscribers.as_slice() {
                [sub] if out.meta.fields.len() == 1 => sub.chooser.only().map(|task| (out.meta.index, task)),
                _ => None,
            }
        });
        let Some((stream_index, task)) = sole else {
            return self.emit_routed(stream, value.into(), anchors_for);
        };
        self.sole_target = Some(task);
        self.emitted += 1;
        self.transferred += 1;
        let anchors = anchors_for(&mut self.rng);
        self.send_tuple(task, move || Values::from_buf([value.into()]), stream_index, anchors);
        Ok(1)
    }

    /// `emit_one` for a stream with a choice of targets (or an error to report).
    #[inline(never)]
    fn emit_routed(
        &mut self,
        stream: &str,
        value: Value,
        anchors_for: impl FnMut(&mut SplitMix64) -> Anchors,
    ) -> Result<usize, Error> {
        self.emit_with(stream, None, Values::from_buf([value]), anchors_for)
    }

    /// The tasks the last emit went to (a multilang subprocess's `need_task_ids`).
    pub(crate) fn last_targets(&self) -> &[TaskId] {
        match &self.sole_target {
            Some(task) => std::slice::from_ref(task),
            None => &self.targets,
        }
    }

    pub(crate) fn acker_of(&self, root: u64) -> Option<TaskId> {
        match self.ackers.as_slice() {
            [] => None,
            // The usual case needs no division (a 64-bit `div` per ack was a tenth of `ack`).
            [only] => Some(*only),
            ackers => ackers.get((root % ackers.len() as u64) as usize).copied(),
        }
    }

    pub(crate) fn report_error(&mut self, error: String) {
        tracing::warn!(component = %self.component, task = %self.task, %error, "component error");
        if let Some(tx) = &self.errors {
            // Bounded and non-blocking: errors beyond the reporter's pace are dropped here,
            // as the rate limit would drop them anyway.
            let _ = tx.try_send(ErrorReport { component: self.component.clone(), task: self.task, error });
        }
    }
}

fn now_nanos() -> u64 {
    // Truncated: only the low bits vary, which is what a seed wants.
    cluster_state::clock::since_epoch().as_nanos() as u64
}

/// The spout executor's pending tuples.
#[derive(Debug, Default)]
pub(crate) struct SpoutPending {
    pub(crate) trees: PendingTrees,
    pub(crate) per_task: Vec<u32>,
    /// Message ids acked at once because acking is off or nobody subscribes.
    pub(crate) acked_now: Vec<(usize, u64)>,
    /// Acker tasks running on this executor's thread (`executor::FusedAcker`): the trees they
    /// track are tracked in `trees` itself.
    pub(crate) ackers_here: Vec<TaskId>,
    /// The emit time given to tracked tuples, and how many more may take it: the clock is read
    /// once per [`EMITS_PER_CLOCK_READ`] tracked emits (a read per tuple was ~20% of a generator
    /// spout's thread) and again after the executor's loop starts a pass ([`Self::new_pass`]).
    pub(crate) emit_clock: Option<(Instant, u32)>,
}

/// Tracked emits that share one clock read. An emit time read earlier than the emit can only
/// make a complete latency look longer, by at most the time 64 emits take (~10 us for the
/// generator spout), never shorter.
pub(crate) const EMITS_PER_CLOCK_READ: u32 = 64;

impl SpoutPending {
    /// The executor starts a pass of its loop: the next tracked emit reads the clock (a spout
    /// may have waited since the last read).
    pub(crate) fn new_pass(&mut self) {
        self.emit_clock = None;
    }

    fn emit_time(&mut self) -> Instant {
        match &mut self.emit_clock {
            Some((at, left)) if *left > 0 => {
                *left -= 1;
                *at
            }
            clock => {
                let now = Instant::now();
                *clock = Some((now, EMITS_PER_CLOCK_READ - 1));
                now
            }
        }
    }
}

/// What a spout emits through (Storm's `SpoutOutputCollector`).
#[derive(Debug)]
pub struct SpoutCollector<'a> {
    pub(crate) em: &'a mut Emitter,
    pub(crate) pending: &'a mut SpoutPending,
    pub(crate) task_index: usize,
    pub(crate) emitted_any: bool,
}

impl SpoutCollector<'_> {
    /// Emits on the default stream; with a `msg_id` the tuple is tracked: `ack` or `fail` of
    /// the spout is called with it when its tree completes, fails or times out.
    pub fn emit(&mut self, values: impl Into<Values>, msg_id: Option<u64>) -> Result<usize, Error> {
        self.emit_inner(crate::tuple::DEFAULT_STREAM, None, values.into(), msg_id)
    }

    /// Emits on `stream`.
    pub fn emit_stream(
        &mut self,
        stream: &str,
        values: impl Into<Values>,
        msg_id: Option<u64>,
    ) -> Result<usize, Error> {
        self.emit_inner(stream, None, values.into(), msg_id)
    }

    /// Emits on `stream` to `task`, which must subscribe with direct grouping.
    pub fn emit_direct(
        &mut self,
        task: TaskId,
        stream: &str,
        values: impl Into<Values>,
        msg_id: Option<u64>,
    ) -> Result<usize, Error> {
        self.emit_inner(stream, Some(task), values.into(), msg_id)
    }

    /// Reports an error to `/storm/errors` (rate-limited).
    pub fn report_error(&mut self, error: impl std::fmt::Display) {
        self.em.report_error(error.to_string());
    }

    /// Adds `by` to this executor's count `name`, exported as `squall_component_count_total`
    /// (Storm's `CountShellMetric`; the multilang `metrics` command comes here).
    pub fn count(&mut self, name: &str, by: u64) -> Result<(), crate::stats::CountError> {
        self.em.stats.count(name, by)
    }

    /// This task.
    pub fn task(&self) -> TaskId {
        self.em.task
    }

    fn emit_inner(
        &mut self,
        stream: &str,
        direct: Option<TaskId>,
        values: Values,
        msg_id: Option<u64>,
    ) -> Result<usize, Error> {
        self.emitted_any = true;
        let tracked = msg_id.is_some() && self.em.acking();
        if !tracked {
            let n = self.em.emit_with(stream, direct, values, |_| Anchors::None)?;
            if let Some(id) = msg_id {
                self.pending.acked_now.push((self.task_index, id));
            }
            return Ok(n);
        }
        // The tree's root names its pending slot (`crate::pending`): taken before the emit,
        // given back if nobody subscribes.
        let id = msg_id.unwrap_or_default();
        let emitted_at = self.pending.emit_time();
        let tracked = PendingTuple { msg_id: id, task_index: self.task_index, emitted_at };
        let root = self.pending.trees.insert(&mut self.em.rng, tracked);
        let mut val = 0u64;
        let emitted = self.em.emit_with(stream, direct, values, |rng| {
            let edge = rng.next_id();
            val ^= edge;
            Anchors::One(Anchor { root, edge })
        });
        let acker = self.em.acker_of(root);
        match (emitted, acker) {
            (Ok(n), Some(acker)) if n > 0 => {
                if !(self.pending.ackers_here.contains(&acker) && self.pending.trees.track_acks(root, val)) {
                    self.em.send_init(acker, root, val);
                }
                self.pending.per_task[self.task_index] += 1;
                Ok(n)
            }
            (Ok(n), _) => {
                self.pending.trees.remove(root);
                self.pending.acked_now.push((self.task_index, id));
                Ok(n)
            }
            (Err(e), _) => {
                self.pending.trees.remove(root);
                Err(e)
            }
        }
    }
}

/// What a bolt emits, acks and fails through (Storm's `OutputCollector`).
#[derive(Debug)]
pub struct BoltCollector<'a> {
    pub(crate) em: &'a mut Emitter,
}

/// The anchors of a new tuple emitted anchored to `anchors` (for one of its targets): a new
/// edge id, XORed into each input's ack value and into the tuple's anchor for each tree.
#[inline(always)]
fn new_edge(anchors: &[&Tuple], rng: &mut SplitMix64) -> Anchors {
    let edge = rng.next_id();
    let mut out = Anchors::None;
    for a in anchors {
        a.ack_val.xor(edge);
        for anchor in a.anchors.as_slice() {
            out.xor_edge(anchor.root, edge);
        }
    }
    out
}

impl BoltCollector<'_> {
    /// Emits on the default stream, anchored to `anchors` (empty: unanchored).
    pub fn emit(&mut self, anchors: &[&Tuple], values: impl Into<Values>) -> Result<usize, Error> {
        self.emit_inner(crate::tuple::DEFAULT_STREAM, None, anchors, values.into())
    }

    /// Emits on `stream`, anchored to `anchors`.
    pub fn emit_stream(
        &mut self,
        stream: &str,
        anchors: &[&Tuple],
        values: impl Into<Values>,
    ) -> Result<usize, Error> {
        self.emit_inner(stream, None, anchors, values.into())
    }

    /// Emits on `stream` to `task`, which must subscribe with direct grouping.
    pub fn emit_direct(
        &mut self,
        task: TaskId,
        stream: &str,
        anchors: &[&Tuple],
        values: impl Into<Values>,
    ) -> Result<usize, Error> {
        self.emit_inner(stream, Some(task), anchors, values.into())
    }

    #[inline(always)]
    fn emit_inner(
        &mut self,
        stream: &str,
        direct: Option<TaskId>,
        anchors: &[&Tuple],
        values: Values,
    ) -> Result<usize, Error> {
        if !self.anchored(anchors) {
            return self.em.emit_with(stream, direct, values, |_| Anchors::None);
        }
        self.em.emit_with(stream, direct, values, |rng| new_edge(anchors, rng))
    }

    /// Emits the one-field tuple `[value]` on the default stream, anchored to `anchors`: as
    /// `emit(anchors, [value])`, in less time when the stream goes to one task (the value is
    /// converted where the tuple is written).
    #[inline(always)]
    pub fn emit_value(&mut self, anchors: &[&Tuple], value: impl Into<Value>) -> Result<usize, Error> {
        let stream = crate::tuple::DEFAULT_STREAM;
        if !self.anchored(anchors) {
            return self.em.emit_one(stream, value, |_| Anchors::None);
        }
        self.em.emit_one(stream, value, |rng| new_edge(anchors, rng))
    }

    /// Whether a tuple emitted anchored to `anchors` joins any tree.
    #[inline(always)]
    fn anchored(&self, anchors: &[&Tuple]) -> bool {
        self.em.acking() && anchors.iter().any(|a| !a.anchors.is_empty())
    }

    /// Acks `input`: its part of every tree it belongs to is done.
    ///
    /// Inlined into the bolt (every bolt acks every input; a bolt in another crate cannot
    /// inline a plain function of this one): as a call it was ~2% of a word count's samples,
    /// and word count acking off did 7% more words per CPU-s inlined (10 of 10 interleaved
    /// pairs).
    #[inline]
    pub fn ack(&mut self, input: &Tuple) {
        self.em.acked += 1;
        let val = input.ack_val.get();
        for anchor in input.anchors.as_slice() {
            if let Some(acker) = self.em.acker_of(anchor.root) {
                self.em.send_ack(acker, anchor.root, anchor.edge ^ val);
            }
        }
    }

    /// Fails `input`: every tree it belongs to fails at once (the spouts replay).
    pub fn fail(&mut self, input: &Tuple) {
        self.em.failed += 1;
        for anchor in input.anchors.as_slice() {
            if let Some(acker) = self.em.acker_of(anchor.root) {
                self.em.send(Envelope::Ack { task: acker, msg: AckMsg::Fail { root: anchor.root } });
            }
        }
    }

    /// Reports an error to `/storm/errors` (rate-limited).
    pub fn report_error(&mut self, error: impl std::fmt::Display) {
        self.em.report_error(error.to_string());
    }

    /// Adds `by` to this executor's count `name`, exported as `squall_component_count_total`
    /// (Storm's `CountShellMetric`; the multilang `metrics` command comes here).
    pub fn count(&mut self, name: &str, by: u64) -> Result<(), crate::stats::CountError> {
        self.em.stats.count(name, by)
    }

    /// This task.
    pub fn task(&self) -> TaskId {
        self.em.task
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits (bounded) until the clock has moved past `t`.
    fn clock_passes(t: Instant) {
        let deadline = t + std::time::Duration::from_secs(5);
        while Instant::now() <= t && Instant::now() < deadline {
            std::hint::spin_loop();
        }
    }

    /// Partial batches go at once until a destination gets [`PACE_AFTER`] within one
    /// interval; then one per interval, carrying everything sent since, while passes before
    /// the due time add to the held batch; a held batch that only its due pass added to ends
    /// pacing. Full batches go at once; each destination has its own pace.
    #[test]
    fn partial_batches_are_paced_while_holding_them_merges_passes() {
        use cluster_state::ids::ExecutorId;

        let (tx_a, rx_a) = crate::queue::unbounded();
        let (tx_b, rx_b) = crate::queue::unbounded();
        // Tasks 5 and 6 live behind destination 0, task 7 behind destination 1.
        let dest_of_task = vec![u32::MAX, u32::MAX, u32::MAX, u32::MAX, u32::MAX, 0, 0, 1];
        let routes = SharedRoutes::new(Routes { dest_of_task, dests: vec![tx_a, tx_b], cells: Vec::new() });
        let stats = Arc::new(ExecStats::new(ExecutorId::single(TaskId(3))));
        let interval = Duration::from_millis(50);
        let mut em = Emitter::new(
            ComponentId::new("split").unwrap(),
            TaskId(3),
            Vec::new(),
            routes,
            4,
            interval,
            Vec::new(),
            None,
            stats,
        );
        let ack =
            |task: u32, root: u64| Envelope::Ack { task: TaskId(task), msg: AckMsg::Ack { root, val: 1 } };
        let lens =
            |rx: &crate::queue::QueueReceiver<Batch>| rx.try_iter().map(|b| b.len()).collect::<Vec<_>>();
        let ms = |n: u64| Duration::from_millis(n);
        let t0 = Instant::now();

        // Three partial batches within one interval go at once; the third starts pacing.
        for (i, at) in [0, 1, 2].into_iter().enumerate() {
            em.send(ack(5, i as u64));
            assert_eq!(em.pace(t0 + ms(at)), None, "nothing held back yet");
        }
        assert_eq!(lens(&rx_a), [1, 1, 1]);

        // Paced: held until one interval after the last, while other destinations go at once.
        em.send(ack(5, 10));
        em.send(ack(7, 11));
        assert_eq!(em.pace(t0 + ms(3)), Some(t0 + ms(52)));
        assert_eq!(lens(&rx_a), Vec::<usize>::new(), "held back within the interval");
        assert_eq!(lens(&rx_b), [1], "another destination has its own pace");
        // A pass adds to the held batch before it is due: holding merged something.
        em.send(ack(6, 12));
        assert_eq!(em.pace(t0 + ms(10)), Some(t0 + ms(52)));
        em.send(ack(6, 13));
        assert_eq!(em.pace(t0 + ms(52)), None);
        assert_eq!(lens(&rx_a), [3], "everything held back goes in one batch when due");

        // Still paced; a full batch (4) goes at once whatever the pace.
        for root in 20..24 {
            em.send(ack(5, root));
        }
        assert_eq!(lens(&rx_a), [4]);
        em.send(ack(5, 30));
        assert_eq!(em.pace(t0 + ms(53)), Some(t0 + ms(102)));
        // Only the due pass adds: holding merged nothing, and pacing ends ...
        em.send(ack(5, 31));
        assert_eq!(em.pace(t0 + ms(102)), None);
        assert_eq!(lens(&rx_a), [2]);
        // ... so the next partial batch goes at once.
        em.send(ack(5, 40));
        assert_eq!(em.pace(t0 + ms(103)), None);
        assert_eq!(lens(&rx_a), [1]);

        // `flush` hands over everything at once.
        em.send(ack(5, 50));
        em.send(ack(5, 51));
        em.flush();
        assert_eq!(lens(&rx_a), [2]);
    }

    /// A batch for the queue this thread receives from stays on the thread, in order; one for
    /// another queue, or sent from another thread, goes through its queue.
    #[test]
    fn own_inbox_takes_only_this_threads_own_queue() {
        let ack = |root| Envelope::Ack { task: TaskId(1), msg: AckMsg::Ack { root, val: 1 } };
        let roots = |b: &Batch| {
            b.iter()
                .map(|e| match e {
                    Envelope::Ack { msg: AckMsg::Ack { root, .. }, .. } => *root,
                    _ => 0,
                })
                .collect::<Vec<u64>>()
        };
        let (own_tx, own_rx) = crate::queue::unbounded::<Batch>();
        let (other_tx, _other_rx) = crate::queue::unbounded::<Batch>();
        assert_eq!(own_tx.key(), own_rx.key());
        assert_ne!(own_tx.key(), other_tx.key());
        let mut buf: Batch = vec![ack(1), ack(2)];
        assert!(!own_inbox::take_from(own_tx.key(), &mut buf), "nothing claimed yet");
        own_inbox::claim(own_rx.key());
        assert!(!own_inbox::take_from(other_tx.key(), &mut buf));
        assert_eq!(buf.len(), 2, "left for its queue");
        assert!(own_inbox::take_from(own_tx.key(), &mut buf));
        assert!(buf.is_empty() && !own_inbox::is_empty());
        buf.push(ack(3));
        assert!(own_inbox::take_from(own_tx.key(), &mut buf));
        // Another thread has its own (none): it sends through the queue.
        let key = own_tx.key();
        assert!(
            !std::thread::spawn(move || own_inbox::take_from(key, &mut vec![ack(4)])).join().unwrap_or(true)
        );
        let mut got = Batch::new();
        own_inbox::swap(&mut got);
        assert_eq!(roots(&got), [1, 2, 3]);
        assert!(own_inbox::is_empty());
        buf.push(ack(5));
        assert!(own_inbox::take_from(own_tx.key(), &mut buf));
        own_inbox::release();
        assert!(own_inbox::is_empty(), "released with the loop");
        buf.push(ack(6));
        assert!(!own_inbox::take_from(own_tx.key(), &mut buf));
    }

    /// `copy_out` moves every envelope, in order and whole (texts inline and shared, anchors,
    /// acks), into a batch of their number, and leaves the buffer empty with its memory.
    #[test]
    fn a_batch_copied_out_holds_what_the_buffer_held() {
        use crate::tuple::{Anchor, Text};

        let long = Text::from("a text longer than twenty-three bytes, so shared");
        let mut buf: Batch = Vec::with_capacity(8);
        for i in 0..5u32 {
            let values: Values =
                [Value::Str(Text::new(format!("w{i}"))), Value::Str(long.clone())].into_iter().collect();
            let anchors = Anchors::One(Anchor { root: u64::from(i), edge: 7 });
            buf.push(Envelope::Tuple {
                task: TaskId(i),
                tuple: Sent { values, stream: 1, source_task: TaskId(9), anchors },
            });
        }
        buf.push(Envelope::Ack { task: TaskId(2), msg: AckMsg::Ack { root: 3, val: 4 } });
        let expected = format!("{buf:?}");
        let memory = buf.as_ptr();
        let out = copy_out(&mut buf);
        assert_eq!(format!("{out:?}"), expected);
        assert_eq!(out.len(), 6);
        assert!(
            buf.is_empty() && buf.capacity() >= 8 && std::ptr::eq(buf.as_ptr(), memory),
            "the buffer stays"
        );
        drop(out);
        // The copy owned the envelopes: dropping it leaves the shared text to its last owner.
        assert_eq!(long.as_str(), "a text longer than twenty-three bytes, so shared");
        buf.push(Envelope::Ack { task: TaskId(1), msg: AckMsg::Fail { root: 1 } });
        assert_eq!(copy_out(&mut buf).len(), 1);
    }

    /// `emit_value(anchors, v)` sends what `emit(anchors, [v])` sends: to the one task of a
    /// one-task stream (built in its batch slot), by the field's hash over several tasks,
    /// anchored to the input's trees; a stream of two fields refuses it and sends nothing.
    #[test]
    fn a_one_value_emit_sends_what_emit_sends() {
        use crate::grouping::Chooser;
        use crate::topology::Grouping;
        use crate::tuple::{Fields, Text};
        use cluster_state::ids::ExecutorId;

        let (tx, rx) = crate::queue::unbounded();
        let routes =
            SharedRoutes::new(Routes { dest_of_task: vec![0; 8], dests: vec![tx], cells: Vec::new() });
        let words = |n: usize| (0..n).map(|i| Text::from(format!("w{i}")));
        let emitter = |fields: Fields, tasks: &[u32], ackers: Vec<TaskId>| {
            let meta = Arc::new(StreamMeta {
                component: ComponentId::new("split").unwrap(),
                stream: "default".into(),
                fields: fields.clone(),
                index: 0,
            });
            let tasks: Vec<TaskId> = tasks.iter().copied().map(TaskId).collect();
            let grouping = Grouping::Fields(vec!["word".into()]);
            let chooser = Chooser::new(&grouping, &fields, &tasks, &Default::default(), 7);
            let streams = vec![OutStream { meta, subscribers: vec![Subscriber { chooser }] }];
            let stats = Arc::new(ExecStats::new(ExecutorId::single(TaskId(3))));
            Emitter::new(
                ComponentId::new("split").unwrap(),
                TaskId(3),
                streams,
                routes.clone(),
                1024,
                Duration::ZERO,
                ackers,
                None,
                stats,
            )
        };
        let sent = |em: &mut Emitter| -> Vec<(TaskId, Sent)> {
            em.flush();
            rx.try_iter()
                .flatten()
                .map(|env| match env {
                    Envelope::Tuple { task, tuple } => (task, tuple),
                    other => panic!("unexpected {other:?}"),
                })
                .collect()
        };
        let unanchored = Tuple {
            values: Values::new(),
            meta: Arc::new(StreamMeta {
                component: ComponentId::new("sentences").unwrap(),
                stream: "default".into(),
                fields: Fields::new(["sentence"]),
                index: 1,
            }),
            source_task: TaskId(1),
            anchors: Anchors::None,
            ack_val: 0.into(),
        };

        for tasks in [&[5][..], &[5, 6, 7]] {
            let mut em = emitter(Fields::new(["word"]), tasks, Vec::new());
            let mut out = BoltCollector { em: &mut em };
            for w in words(50) {
                assert_eq!(out.emit_value(&[&unanchored], w).unwrap(), 1);
            }
            assert_eq!(out.em.last_targets().len(), 1);
            let by_value = sent(&mut em);
            let mut out = BoltCollector { em: &mut em };
            for w in words(50) {
                out.emit(&[&unanchored], [Value::Str(w)]).unwrap();
            }
            let by_emit = sent(&mut em);
            assert_eq!(by_value.len(), 50);
            assert_eq!(by_value, by_emit, "tasks {tasks:?}");
            // The default stream named by text of its own (not `DEFAULT_STREAM`'s address)
            // routes the same; an undeclared stream is refused.
            let named = String::from("default");
            let mut out = BoltCollector { em: &mut em };
            for w in words(50) {
                out.emit_stream(&named, &[&unanchored], [Value::Str(w)]).unwrap();
            }
            assert!(out.emit_stream("other", &[&unanchored], [Value::from("w")]).is_err());
            assert_eq!(sent(&mut em), by_value, "tasks {tasks:?}, stream named");
            let used: std::collections::BTreeSet<TaskId> = by_value.iter().map(|(t, _)| *t).collect();
            assert_eq!(used.len(), tasks.len(), "every task takes some words: {used:?}");
        }

        // Anchored: the new edge is in the input's ack value and in the tuple's anchor.
        let mut em = emitter(Fields::new(["word"]), &[5], vec![TaskId(4)]);
        let mut input = unanchored.clone();
        input.anchors = Anchors::One(Anchor { root: 9, edge: 1 });
        BoltCollector { em: &mut em }.emit_value(&[&input], "cow").unwrap();
        let [(task, tuple)] = &sent(&mut em)[..] else { panic!("one tuple") };
        assert_eq!(*task, TaskId(5));
        assert_eq!(tuple.values.as_slice(), [Value::from("cow")]);
        let [Anchor { root: 9, edge }] = tuple.anchors.as_slice() else { panic!("{:?}", tuple.anchors) };
        assert_ne!(*edge, 0);
        assert_eq!(input.ack_val.get(), *edge);

        // Two declared fields: an error that says so, and nothing sent.
        let mut em = emitter(Fields::new(["word", "count"]), &[5], Vec::new());
        let err = BoltCollector { em: &mut em }.emit_value(&[&unanchored], "cow").unwrap_err();
        assert!(err.to_string().contains("1 values for 2 declared fields"), "{err}");
        assert!(sent(&mut em).is_empty());
    }

    /// A bolt acking the inputs of one tree one after another sends one `Ack` carrying their
    /// XOR; an ack of another tree in between starts a new message. Either way the acker
    /// reaches the same verdict at the same last message as without merging.
    #[test]
    fn consecutive_acks_of_one_tree_become_one_message() {
        use crate::acker::AckLedger;
        use cluster_state::ids::ExecutorId;

        let acker = TaskId(5);
        let (tx, rx) = crate::queue::unbounded();
        let mut dest_of_task = vec![u32::MAX; 6];
        dest_of_task[5] = 0;
        let routes = SharedRoutes::new(Routes { dest_of_task, dests: vec![tx], cells: Vec::new() });
        let stats = Arc::new(ExecStats::new(ExecutorId::single(TaskId(3))));
        let mut em = Emitter::new(
            ComponentId::new("count").unwrap(),
            TaskId(3),
            Vec::new(),
            routes,
            1024,
            Duration::ZERO,
            vec![acker],
            None,
            stats,
        );
        let meta = Arc::new(StreamMeta {
            component: ComponentId::new("split").unwrap(),
            stream: "default".into(),
            fields: crate::tuple::Fields::new(["word"]),
            index: 0,
        });
        let input = |root: u64, edge: u64| Tuple {
            values: Values::new(),
            meta: meta.clone(),
            source_task: TaskId(2),
            anchors: Anchors::One(Anchor { root, edge }),
            ack_val: 0.into(),
        };
        // Tree 1: the spout's edge 0b1 to split; split acks it, anchoring three words.
        let (words, other) = ([0b10, 0b100, 0b1000], 0b1_0000);
        let mut out = BoltCollector { em: &mut em };
        for edge in words {
            out.ack(&input(1, edge));
        }
        out.ack(&input(2, other));
        out.ack(&input(1, 0b1));
        em.flush();
        let sent: Vec<AckMsg> = rx
            .try_iter()
            .flatten()
            .map(|env| match env {
                Envelope::Ack { task, msg } if task == acker => msg,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(
            sent,
            [
                AckMsg::Ack { root: 1, val: 0b1110 },
                AckMsg::Ack { root: 2, val: other },
                AckMsg::Ack { root: 1, val: 0b1 },
            ]
        );
        let mut ledger = AckLedger::default();
        let spout_task = TaskId(1);
        assert_eq!(ledger.apply(AckMsg::Init { root: 1, val: 0b1 ^ 0b1110, spout_task }), None);
        assert_eq!(ledger.apply(sent[0]), None);
        let done = ledger.apply(sent[2]).expect("tree 1 completes at its last ack");
        assert!(done.ok && done.root == 1 && done.spout_task == spout_task);
    }

    /// An emit time is shared by at most `EMITS_PER_CLOCK_READ` emits and never outlives a
    /// pass of the executor loop (a spout that waited must not date its tuples before the wait).
    #[test]
    fn an_emit_time_serves_64_emits_within_one_pass() {
        let mut pending = SpoutPending::default();
        let first = pending.emit_time();
        for _ in 1..EMITS_PER_CLOCK_READ {
            assert_eq!(pending.emit_time(), first);
        }
        clock_passes(first);
        let second = pending.emit_time();
        assert!(second > first, "the 65th emit reads the clock");
        assert_eq!(pending.emit_time(), second);
        clock_passes(second);
        pending.new_pass();
        assert!(pending.emit_time() > second, "a new pass reads the clock");
    }
}
