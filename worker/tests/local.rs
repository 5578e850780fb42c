#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Topologies run in-process ([`LocalCluster`]): groupings, acking, timeouts, replay,
//! max spout pending, tick tuples and backpressure, observed through test components.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster_state::ids::TaskId;
use test_harness::wait_for;
use worker::grouping::SplitMix64;
use worker::{
    Bolt, BoltCollector, ComponentError, Fields, LocalCluster, OutputDeclarer, Spout, SpoutCollector,
    TopologyBuilder, TopologyConfig, TopologyContext, Tuple, Value, values,
};

#[derive(Debug, Default)]
struct SpoutRecord {
    acked: BTreeSet<u64>,
    failed: Vec<u64>,
    emitted: u64,
    in_flight: u64,
    max_in_flight: u64,
}

/// Emits ids `0..n` as `(id, key)` with `key = k{id % keys}`; replays failures when asked.
struct TestSpout {
    n: u64,
    keys: u64,
    next: u64,
    replay: bool,
    reliable: bool,
    queue: VecDeque<u64>,
    rec: Arc<Mutex<SpoutRecord>>,
}

impl TestSpout {
    fn new(n: u64, rec: &Arc<Mutex<SpoutRecord>>) -> Self {
        TestSpout {
            n,
            keys: 50,
            next: 0,
            replay: false,
            reliable: true,
            queue: VecDeque::new(),
            rec: rec.clone(),
        }
    }
}

impl Spout for TestSpout {
    fn declare_outputs(&self, d: &mut OutputDeclarer) {
        d.declare(Fields::new(["id", "key"]));
    }

    fn next_tuple(&mut self, out: &mut SpoutCollector<'_>) -> Result<(), ComponentError> {
        let id = match self.queue.pop_front() {
            Some(id) => id,
            None if self.next < self.n => {
                self.next += 1;
                self.next - 1
            }
            None => return Ok(()),
        };
        {
            let mut r = self.rec.lock().unwrap();
            r.emitted += 1;
            if self.reliable {
                r.in_flight += 1;
                r.max_in_flight = r.max_in_flight.max(r.in_flight);
            }
        }
        out.emit(values![id as i64, format!("k{}", id % self.keys)], self.reliable.then_some(id))?;
        Ok(())
    }

    fn ack(&mut self, id: u64) {
        let mut r = self.rec.lock().unwrap();
        r.in_flight -= 1;
        r.acked.insert(id);
    }

    fn fail(&mut self, id: u64) {
        let mut r = self.rec.lock().unwrap();
        r.in_flight -= 1;
        r.failed.push(id);
        if self.replay {
            self.queue.push_back(id);
        }
    }
}

type Seen = Arc<Mutex<Vec<(TaskId, i64, String)>>>;

/// Records `(task, id, key)` of every input and acks it.
struct Recorder {
    seen: Seen,
}

impl Bolt for Recorder {
    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        let key = input.get_by_field("key").and_then(Value::as_str).unwrap_or("").to_owned();
        self.seen.lock().unwrap().push((out.task(), input.get_int(0).unwrap_or(-1), key));
        out.ack(input);
        Ok(())
    }
}

fn acked(rec: &Arc<Mutex<SpoutRecord>>) -> usize {
    rec.lock().unwrap().acked.len()
}

fn config(f: impl FnOnce(&mut TopologyConfig)) -> TopologyConfig {
    let mut c = TopologyConfig::default();
    f(&mut c);
    c
}

#[test]
fn groupings_fields_all_global_shuffle() {
    let rec = Arc::new(Mutex::new(SpoutRecord::default()));
    let seen: BTreeMap<&str, Seen> =
        ["fields", "all", "global", "shuffle"].into_iter().map(|n| (n, Seen::default())).collect();
    let n = 4000u64;
    let mut b = TopologyBuilder::new("groupings");
    b.config(config(|c| c.workers = 2));
    let r = rec.clone();
    b.set_spout("spout", 1, move || TestSpout::new(n, &r));
    let s = seen["fields"].clone();
    b.set_bolt("fields", 4, move || Recorder { seen: s.clone() }).fields_grouping("spout", ["key"]);
    let s = seen["all"].clone();
    b.set_bolt("all", 3, move || Recorder { seen: s.clone() }).all_grouping("spout");
    let s = seen["global"].clone();
    b.set_bolt("global", 3, move || Recorder { seen: s.clone() }).global_grouping("spout");
    let s = seen["shuffle"].clone();
    b.set_bolt("shuffle", 2, move || Recorder { seen: s.clone() }).num_tasks(4).shuffle_grouping("spout");
    let cluster = LocalCluster::start(b.build().unwrap()).unwrap();
    wait_for(Duration::from_secs(60), "every tuple tree acked", || acked(&rec) == n as usize);

    // Fields: each key at exactly one task, and the keys spread over all four tasks.
    let mut key_task: BTreeMap<String, BTreeSet<TaskId>> = BTreeMap::new();
    for (t, _, k) in seen["fields"].lock().unwrap().iter() {
        key_task.entry(k.clone()).or_default().insert(*t);
    }
    assert_eq!(key_task.len(), 50);
    assert!(key_task.values().all(|ts| ts.len() == 1), "a key reached two tasks: {key_task:?}");
    let used: BTreeSet<TaskId> = key_task.values().flatten().copied().collect();
    assert_eq!(used.len(), 4);

    // All: every task got every tuple.
    let mut per_task: BTreeMap<TaskId, BTreeSet<i64>> = BTreeMap::new();
    for (t, id, _) in seen["all"].lock().unwrap().iter() {
        per_task.entry(*t).or_default().insert(*id);
    }
    assert_eq!(per_task.keys().copied().collect::<Vec<_>>(), cluster.tasks_of("all"));
    assert!(per_task.values().all(|ids| ids.len() == n as usize));

    // Global: only the lowest task id.
    let tasks: BTreeSet<TaskId> = seen["global"].lock().unwrap().iter().map(|(t, _, _)| *t).collect();
    assert_eq!(tasks, BTreeSet::from([cluster.tasks_of("global")[0]]));
    assert_eq!(seen["global"].lock().unwrap().len(), n as usize);

    // Shuffle: four tasks, each within 10% of an even share.
    let mut counts: BTreeMap<TaskId, u64> = BTreeMap::new();
    for (t, _, _) in seen["shuffle"].lock().unwrap().iter() {
        *counts.entry(*t).or_default() += 1;
    }
    assert_eq!(counts.len(), 4);
    for (t, c) in &counts {
        let share = n as f64 / 4.0;
        assert!((*c as f64 - share).abs() <= share * 0.1, "task {t} got {c} of {n}");
    }
    assert!(rec.lock().unwrap().failed.is_empty());
    cluster.shutdown(Duration::from_secs(1));
}

/// Emits `children` anchored children per input, then acks the input.
struct Fanout {
    children: i64,
}

impl Bolt for Fanout {
    fn declare_outputs(&self, d: &mut OutputDeclarer) {
        d.declare(Fields::new(["id", "child"]));
    }

    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        let id = input.get_int(0).unwrap_or(-1);
        for c in 0..self.children {
            out.emit(&[input], values![id, c])?;
        }
        out.ack(input);
        Ok(())
    }
}

/// Holds every input unacked until `release` is set, then acks them on the next tick tuple.
struct Holder {
    held: Vec<Tuple>,
    received: Arc<AtomicU64>,
    ticks: Arc<AtomicU64>,
    release: Arc<AtomicBool>,
}

impl Bolt for Holder {
    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        if input.is_tick() {
            self.ticks.fetch_add(1, Ordering::Relaxed);
            if self.release.load(Ordering::Relaxed) {
                for t in self.held.drain(..) {
                    out.ack(&t);
                }
            }
        } else {
            self.received.fetch_add(1, Ordering::Relaxed);
            self.held.push(input.clone());
        }
        Ok(())
    }

    fn tick_tuple_freq_secs(&self) -> Option<u64> {
        Some(1)
    }
}

#[test]
fn a_tuple_tree_completes_exactly_when_every_descendant_is_acked() {
    let rec = Arc::new(Mutex::new(SpoutRecord::default()));
    let (received, ticks, release) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let n = 20u64;
    let mut b = TopologyBuilder::new("tree");
    let r = rec.clone();
    b.set_spout("spout", 1, move || TestSpout::new(n, &r));
    b.set_bolt("fanout", 2, || Fanout { children: 3 }).shuffle_grouping("spout");
    let (rc, tk, rl) = (received.clone(), ticks.clone(), release.clone());
    b.set_bolt("holder", 2, move || Holder {
        held: Vec::new(),
        received: rc.clone(),
        ticks: tk.clone(),
        release: rl.clone(),
    })
    .shuffle_grouping("fanout");
    let cluster = LocalCluster::start(b.build().unwrap()).unwrap();

    // Every child is held and a tick has passed: the spout tuples and fanout acks are in, the
    // children's are not, so no tree may be complete.
    wait_for(Duration::from_secs(30), "all children at the holders", || {
        received.load(Ordering::Relaxed) == 3 * n
    });
    let t0 = ticks.load(Ordering::Relaxed);
    wait_for(Duration::from_secs(30), "a tick after the children arrived", || {
        ticks.load(Ordering::Relaxed) > t0 + 2
    });
    assert_eq!(acked(&rec), 0, "a tree completed before its children were acked");
    assert!(rec.lock().unwrap().failed.is_empty());

    release.store(true, Ordering::Relaxed);
    wait_for(Duration::from_secs(30), "every tree complete", || acked(&rec) == n as usize);
    assert!(rec.lock().unwrap().failed.is_empty());
    cluster.shutdown(Duration::from_secs(1));
}

/// Acks everything except the tuple with id `drop`, which it silently drops.
struct Dropper {
    drop: i64,
}

impl Bolt for Dropper {
    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        if input.get_int(0) != Some(self.drop) {
            out.ack(input);
        }
        Ok(())
    }
}

#[test]
fn a_dropped_tuple_times_out_and_fails() {
    let rec = Arc::new(Mutex::new(SpoutRecord::default()));
    let mut b = TopologyBuilder::new("timeout");
    b.config(config(|c| c.message_timeout_secs = 1));
    let r = rec.clone();
    b.set_spout("spout", 1, move || TestSpout::new(10, &r));
    b.set_bolt("dropper", 1, || Dropper { drop: 7 }).shuffle_grouping("spout");
    let started = Instant::now();
    let cluster = LocalCluster::start(b.build().unwrap()).unwrap();
    wait_for(Duration::from_secs(10), "the dropped tuple to fail", || !rec.lock().unwrap().failed.is_empty());
    // Between one and two message timeouts (rotating buckets), not at once.
    assert!(started.elapsed() >= Duration::from_millis(900), "failed too early: {:?}", started.elapsed());
    let r = rec.lock().unwrap();
    assert_eq!(r.failed, vec![7]);
    assert_eq!(r.acked, (0..10).filter(|i| *i != 7).collect());
    drop(r);
    cluster.shutdown(Duration::from_secs(1));
}

/// Fails about a third of its inputs at random, acks the rest.
struct Flaky {
    rng: SplitMix64,
}

impl Bolt for Flaky {
    fn prepare(&mut self, ctx: &TopologyContext) -> Result<(), ComponentError> {
        self.rng = SplitMix64::new(u64::from(ctx.task_id.0));
        Ok(())
    }

    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        if self.rng.below(3) == 0 {
            out.fail(input)
        } else {
            out.ack(input)
        }
        Ok(())
    }
}

#[test]
fn a_randomly_failing_bolt_still_gets_every_message_acked_by_replay() {
    let rec = Arc::new(Mutex::new(SpoutRecord::default()));
    let n = 1000u64;
    let mut b = TopologyBuilder::new("flaky");
    let r = rec.clone();
    b.set_spout("spout", 1, move || TestSpout { replay: true, ..TestSpout::new(n, &r) });
    b.set_bolt("split", 2, || Fanout { children: 2 }).shuffle_grouping("spout");
    b.set_bolt("flaky", 3, || Flaky { rng: SplitMix64::new(0) }).shuffle_grouping("split");
    let cluster = LocalCluster::start(b.build().unwrap()).unwrap();
    wait_for(Duration::from_secs(60), "every message acked", || acked(&rec) == n as usize);
    let r = rec.lock().unwrap();
    assert_eq!(r.acked, (0..n).collect());
    assert!(
        r.failed.len() as u64 > n / 4,
        "the bolt should have failed many trees, failed {}",
        r.failed.len()
    );
    drop(r);
    cluster.shutdown(Duration::from_secs(1));
}

/// The worker's one acker runs on one spout executor's thread; the other spout executor's trees
/// go to it through its inbox and their verdicts come back as messages. Both spouts' trees
/// complete (acked, or failed and replayed), and the acker executor counts every verdict.
#[test]
fn the_acker_on_a_spouts_thread_serves_every_spout_executor() {
    let (first, second) =
        (Arc::new(Mutex::new(SpoutRecord::default())), Arc::new(Mutex::new(SpoutRecord::default())));
    let n = 500u64;
    let mut b = TopologyBuilder::new("fused");
    b.config(config(|c| c.acker_executors = Some(1)));
    let (r1, r2) = (first.clone(), second.clone());
    b.set_spout("first", 1, move || TestSpout { replay: true, ..TestSpout::new(n, &r1) });
    b.set_spout("second", 1, move || TestSpout { replay: true, ..TestSpout::new(n, &r2) });
    b.set_bolt("split", 2, || Fanout { children: 2 }).shuffle_grouping("first").shuffle_grouping("second");
    b.set_bolt("flaky", 2, || Flaky { rng: SplitMix64::new(7) }).shuffle_grouping("split");
    let cluster = LocalCluster::start(b.build().unwrap()).unwrap();
    wait_for(Duration::from_secs(60), "every message of both spouts acked", || {
        acked(&first) == n as usize && acked(&second) == n as usize
    });
    let failed = first.lock().unwrap().failed.len() + second.lock().unwrap().failed.len();
    assert!(failed as u64 > n / 4, "the bolt should have failed many trees, failed {failed}");
    for rec in [&first, &second] {
        assert_eq!(rec.lock().unwrap().acked, (0..n).collect());
    }
    // One acker executor, with no thread of its own, reports every verdict it gave.
    let ackers = cluster.runtime().component_stats("__acker");
    assert_eq!(ackers.len(), 1);
    let verdicts = || {
        let (acked, failed) =
            (ackers[0].acked.load(Ordering::Relaxed), ackers[0].failed.load(Ordering::Relaxed));
        (acked, failed)
    };
    wait_for(Duration::from_secs(10), "the acker's counts published", || verdicts().0 == 2 * n);
    assert_eq!(verdicts().1, failed as u64);
    cluster.shutdown(Duration::from_secs(1));
}

#[test]
fn max_spout_pending_bounds_tuples_in_flight() {
    let rec = Arc::new(Mutex::new(SpoutRecord::default()));
    let (received, ticks, release) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(true)));
    let n = 40u64;
    let mut b = TopologyBuilder::new("pending");
    b.config(config(|c| c.max_spout_pending = Some(10)));
    let r = rec.clone();
    b.set_spout("spout", 1, move || TestSpout::new(n, &r));
    let (rc, tk, rl) = (received.clone(), ticks.clone(), release.clone());
    b.set_bolt("holder", 1, move || Holder {
        held: Vec::new(),
        received: rc.clone(),
        ticks: tk.clone(),
        release: rl.clone(),
    })
    .shuffle_grouping("spout");
    let cluster = LocalCluster::start(b.build().unwrap()).unwrap();
    // The holder acks only on ticks (1 s), so the spout must stop at 10 in flight each time.
    wait_for(Duration::from_secs(30), "ten held", || received.load(Ordering::Relaxed) >= 10);
    wait_for(Duration::from_secs(30), "every tree complete", || acked(&rec) == n as usize);
    assert_eq!(rec.lock().unwrap().max_in_flight, 10);
    cluster.shutdown(Duration::from_secs(1));
}

/// Takes 200 µs per tuple (a slow bolt), counting what it processed.
struct Slow {
    processed: Arc<AtomicU64>,
}

impl Bolt for Slow {
    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        let until = Instant::now() + Duration::from_micros(200);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        self.processed.fetch_add(1, Ordering::Relaxed);
        out.ack(input);
        Ok(())
    }
}

#[test]
fn a_slow_bolt_slows_its_spout_instead_of_growing_queues() {
    let rec = Arc::new(Mutex::new(SpoutRecord::default()));
    let processed = Arc::new(AtomicU64::new(0));
    let mut b = TopologyBuilder::new("backpressure");
    b.config(config(|c| {
        c.acker_executors = Some(0);
        c.executor_receive_buffer_size = 64;
        c.producer_batch_size = 8;
    }));
    let r = rec.clone();
    b.set_spout("spout", 1, move || TestSpout { reliable: false, ..TestSpout::new(u64::MAX, &r) });
    let p = processed.clone();
    b.set_bolt("slow", 1, move || Slow { processed: p.clone() }).shuffle_grouping("spout");
    let cluster = LocalCluster::start(b.build().unwrap()).unwrap();
    wait_for(Duration::from_secs(30), "the bolt to process 500 tuples", || {
        processed.load(Ordering::Relaxed) >= 500
    });
    for _ in 0..20 {
        let emitted = rec.lock().unwrap().emitted;
        let done = processed.load(Ordering::Relaxed);
        // Queue (64) + the batch being processed (8) + the spout's batch being built (8).
        assert!(emitted.saturating_sub(done) <= 64 + 8 + 8 + 1, "emitted {emitted}, processed {done}");
        std::thread::sleep(Duration::from_millis(10));
    }
    cluster.shutdown(Duration::from_secs(1));
}

/// Spout `spout` (made from the shared record) -> recording sink, acking off, started.
fn acking_off_cluster<S: Spout + 'static>(
    name: &str,
    spout: impl Fn(&Arc<Mutex<SpoutRecord>>) -> S + Send + Sync + 'static,
) -> (LocalCluster, Arc<Mutex<SpoutRecord>>, Seen) {
    let rec = Arc::new(Mutex::new(SpoutRecord::default()));
    let seen = Seen::default();
    let mut b = TopologyBuilder::new(name);
    b.config(config(|c| c.acker_executors = Some(0)));
    let r = rec.clone();
    b.set_spout("spout", 1, move || spout(&r));
    let s = seen.clone();
    b.set_bolt("sink", 1, move || Recorder { seen: s.clone() }).shuffle_grouping("spout");
    (LocalCluster::start(b.build().unwrap()).unwrap(), rec, seen)
}

#[test]
fn with_acking_off_spout_tuples_are_acked_on_emit() {
    let (cluster, rec, seen) = acking_off_cluster("noack", |r| TestSpout::new(100, r));
    wait_for(Duration::from_secs(30), "all acked", || acked(&rec) == 100);
    wait_for(Duration::from_secs(30), "all delivered", || seen.lock().unwrap().len() == 100);
    cluster.shutdown(Duration::from_secs(1));
}

/// A spout that applies its acks only when told a batch of verdicts was delivered (as the
/// Kafka spout does, to settle them under one lock).
struct BufferingSpout {
    inner: TestSpout,
    buffered: Vec<u64>,
}

impl Spout for BufferingSpout {
    fn declare_outputs(&self, d: &mut OutputDeclarer) {
        self.inner.declare_outputs(d);
    }

    fn next_tuple(&mut self, out: &mut SpoutCollector<'_>) -> Result<(), ComponentError> {
        self.inner.next_tuple(out)
    }

    fn ack(&mut self, id: u64) {
        self.buffered.push(id);
    }

    fn verdicts_delivered(&mut self) {
        for id in self.buffered.drain(..) {
            self.inner.ack(id);
        }
    }
}

#[test]
fn with_acking_off_a_spout_buffering_its_acks_is_told_when_they_were_delivered() {
    let (cluster, rec, _) = acking_off_cluster("noackbuffered", |r| BufferingSpout {
        inner: TestSpout::new(100, r),
        buffered: Vec::new(),
    });
    wait_for(Duration::from_secs(30), "all acked", || acked(&rec) == 100);
    cluster.shutdown(Duration::from_secs(1));
}

/// Sends tuple `i` directly to task `i % n` of `direct`, recording refusals of a bad target.
struct DirectSpout {
    n: u64,
    next: u64,
    targets: Vec<TaskId>,
    refused: Arc<AtomicU64>,
}

impl Spout for DirectSpout {
    fn declare_outputs(&self, d: &mut OutputDeclarer) {
        d.declare(Fields::new(["id", "key"]));
    }

    fn open(&mut self, ctx: &TopologyContext) -> Result<(), ComponentError> {
        self.targets = ctx.tasks_of("direct").to_vec();
        Ok(())
    }

    fn next_tuple(&mut self, out: &mut SpoutCollector<'_>) -> Result<(), ComponentError> {
        if self.next >= self.n {
            return Ok(());
        }
        let id = self.next;
        self.next += 1;
        let target = self.targets[(id % self.targets.len() as u64) as usize];
        out.emit_direct(target, "default", values![id as i64, format!("{}", target.0)], Some(id))?;
        // A task that does not subscribe directly is refused with an error.
        if id == 0 && out.emit_direct(TaskId(10_000), "default", values![0i64, "x"], None).is_err() {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

#[test]
fn direct_grouping_delivers_to_the_named_task() {
    let seen = Seen::default();
    let refused = Arc::new(AtomicU64::new(0));
    let mut b = TopologyBuilder::new("direct");
    let r = refused.clone();
    b.set_spout("spout", 1, move || DirectSpout { n: 300, next: 0, targets: Vec::new(), refused: r.clone() });
    let s = seen.clone();
    b.set_bolt("direct", 3, move || Recorder { seen: s.clone() }).direct_grouping("spout");
    let cluster = LocalCluster::start(b.build().unwrap()).unwrap();
    wait_for(Duration::from_secs(30), "all delivered", || seen.lock().unwrap().len() == 300);
    for (task, _, key) in seen.lock().unwrap().iter() {
        assert_eq!(key, &task.0.to_string(), "tuple for task {key} delivered to {task}");
    }
    assert_eq!(refused.load(Ordering::Relaxed), 1);
    cluster.shutdown(Duration::from_secs(1));
}

/// Returns an error for every input (after acking it).
struct Erring;

impl Bolt for Erring {
    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        out.ack(input);
        Err(format!("cannot handle {}", input.get_int(0).unwrap_or(-1)).into())
    }
}

#[test]
fn component_errors_are_reported_with_component_and_task() {
    let rec = Arc::new(Mutex::new(SpoutRecord::default()));
    let mut b = TopologyBuilder::new("errors");
    let r = rec.clone();
    b.set_spout("spout", 1, move || TestSpout::new(3, &r));
    b.set_bolt("erring", 1, || Erring).shuffle_grouping("spout");
    let cluster = LocalCluster::start(b.build().unwrap()).unwrap();
    let mut errors = Vec::new();
    wait_for(Duration::from_secs(30), "three errors", || {
        errors.extend(cluster.take_errors());
        errors.len() == 3
    });
    let task = cluster.tasks_of("erring")[0];
    for (i, e) in errors.iter().enumerate() {
        assert_eq!((e.component.as_str(), e.task), ("erring", task));
        assert_eq!(e.error, format!("cannot handle {i}"));
    }
    cluster.shutdown(Duration::from_secs(1));
}

type Relayed = Arc<Mutex<Vec<(String, TaskId, i64)>>>;

/// Passes each input on with a sequence number of its own task, anchored.
struct Relay {
    next: i64,
}

impl Bolt for Relay {
    fn declare_outputs(&self, d: &mut OutputDeclarer) {
        d.declare(Fields::new(["id", "key", "seq"]));
    }

    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        let (id, key) = (input.get_int(0).unwrap_or(-1), input.get_str(1).unwrap_or("").to_owned());
        self.next += 1;
        out.emit(&[input], values![id, key, self.next])?;
        out.ack(input);
        Ok(())
    }
}

/// Records the thread it runs on, the emitting task and its sequence number, and acks.
struct ThreadRecorder {
    seen: Relayed,
}

impl Bolt for ThreadRecorder {
    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        let thread = std::thread::current().name().unwrap_or("").to_owned();
        self.seen.lock().unwrap().push((thread, input.source_task(), input.get_int(2).unwrap_or(-1)));
        out.ack(input);
        Ok(())
    }
}

/// Runs the topology `b` until its spout (recording into `rec`) saw all `n` trees acked, none
/// failed.
fn run_until_all_acked(b: TopologyBuilder, rec: &Arc<Mutex<SpoutRecord>>, n: u64) {
    let cluster = LocalCluster::start(b.build().unwrap()).unwrap();
    wait_for(Duration::from_secs(60), "every tree complete", || acked(rec) == n as usize);
    cluster.shutdown(Duration::from_secs(1));
    assert!(rec.lock().unwrap().failed.is_empty(), "nothing fails");
}

/// spout -> relay (2 executors) -> sink, `n` tuples, `squall.executor.inline.downstream` as
/// given: what the sink saw, once every tree completed.
fn relay_run(n: u64, inline: bool) -> Vec<(String, TaskId, i64)> {
    let rec = Arc::new(Mutex::new(SpoutRecord::default()));
    let seen = Relayed::default();
    let mut b = TopologyBuilder::new("relay");
    b.config(config(|c| {
        c.inline_downstream = inline;
        c.max_spout_pending = Some(500);
        c.producer_batch_size = 16;
    }));
    let r = rec.clone();
    b.set_spout("spout", 1, move || TestSpout::new(n, &r));
    b.set_bolt("relay", 2, || Relay { next: 0 }).shuffle_grouping("spout");
    let s = seen.clone();
    b.set_bolt("sink", 1, move || ThreadRecorder { seen: s.clone() }).global_grouping("relay");
    run_until_all_acked(b, &rec, n);
    seen.lock().unwrap().clone()
}

#[test]
fn an_idle_downstream_bolt_runs_on_its_upstreams_thread_and_keeps_each_senders_order() {
    let n = 20_000;
    for inline in [true, false] {
        let seen = relay_run(n, inline);
        assert_eq!(seen.len(), n as usize, "inline {inline}: every tuple once");
        // Each relay task's tuples reach the sink in the order it emitted them.
        let mut last: BTreeMap<TaskId, i64> = BTreeMap::new();
        for (_, task, seq) in &seen {
            let prev = last.insert(*task, *seq).unwrap_or(0);
            assert_eq!(*seq, prev + 1, "inline {inline}: from {task:?}, {seq} after {prev}");
        }
        let on = |name: &str| seen.iter().filter(|(thread, _, _)| thread.starts_with(name)).count();
        let (on_spout, on_relay, on_sink) = (on("spout-"), on("relay-"), on("sink-"));
        assert_eq!(
            on_spout + on_relay + on_sink,
            seen.len(),
            "inline {inline}: only those threads run the sink"
        );
        if inline {
            // On the spout's thread when it ran an idle relay that ran the idle sink in turn.
            assert!(on_spout + on_relay > 0, "an idle sink ran on an upstream thread at least once");
        } else {
            assert_eq!(on_spout + on_relay, 0, "off: the sink runs only on its own thread");
        }
    }
}

/// Records the thread each input runs on and its id, takes `pause` over each from id
/// `slow_from` on, and acks.
struct OnThread {
    seen: Arc<Mutex<Vec<(String, i64)>>>,
    pause: Duration,
    slow_from: i64,
}

impl Bolt for OnThread {
    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        let thread = std::thread::current().name().unwrap_or("").to_owned();
        let id = input.get_int(0).unwrap_or(-1);
        self.seen.lock().unwrap().push((thread, id));
        if id >= self.slow_from && !self.pause.is_zero() {
            std::thread::sleep(self.pause);
        }
        out.ack(input);
        Ok(())
    }
}

/// spout -> bolt (an [`OnThread`] taking `pause` per tuple from id `slow_from` on), or
/// spout -> relay -> bolt with
/// `relay`, `n` reliable tuples trickling (at most 4 pending, so the spout's batches are
/// partial), inline runs as given: which thread ran each tuple, in the order the bolt ran them,
/// once every tree completed.
fn spout_into_bolt(
    n: u64,
    (pause, slow_from): (Duration, i64),
    inline: bool,
    relay: bool,
) -> Vec<(String, i64)> {
    let rec = Arc::new(Mutex::new(SpoutRecord::default()));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut b = TopologyBuilder::new("spout-inline");
    b.config(config(|c| {
        c.inline_downstream = inline;
        c.max_spout_pending = Some(4);
    }));
    let r = rec.clone();
    b.set_spout("spout", 1, move || TestSpout::new(n, &r));
    let upstream = if relay {
        let ran = Arc::new(AtomicU64::new(0));
        b.set_bolt("relay", 1, move || CountingRelay { ran: ran.clone() }).shuffle_grouping("spout");
        "relay"
    } else {
        "spout"
    };
    let s = seen.clone();
    b.set_bolt("bolt", 1, move || OnThread { seen: s.clone(), pause, slow_from }).shuffle_grouping(upstream);
    run_until_all_acked(b, &rec, n);
    seen.lock().unwrap().clone()
}

#[test]
fn an_idle_bolt_runs_on_its_spouts_thread_in_order_unless_it_is_slow() {
    let n = 3_000;
    for inline in [true, false] {
        let seen = spout_into_bolt(n, (Duration::ZERO, 0), inline, false);
        let ids: Vec<i64> = seen.iter().map(|(_, id)| *id).collect();
        assert_eq!(ids, (0..n as i64).collect::<Vec<_>>(), "inline {inline}: every tuple once, in order");
        let on_spout = seen.iter().filter(|(thread, _)| thread.starts_with("spout-")).count();
        let on_bolt = seen.iter().filter(|(thread, _)| thread.starts_with("bolt-")).count();
        assert_eq!(on_spout + on_bolt, seen.len(), "inline {inline}: only those threads run the bolt");
        if inline {
            assert!(on_spout > 0, "an idle bolt ran on the spout's thread at least once");
        } else {
            assert_eq!(on_spout, 0, "off: the bolt runs only on its own thread");
        }
    }
    // spout -> relay -> bolt: an idle relay run on the spout's thread runs the idle bolt there too.
    let seen = spout_into_bolt(n, (Duration::ZERO, 0), true, true);
    assert_eq!(seen.len(), n as usize, "every tuple once");
    assert!(
        seen.iter().any(|(thread, _)| thread.starts_with("spout-")),
        "the bolt ran on the spout's thread"
    );
    // 2 ms a tuple: one tuple is over the budget (1 ms), so the spout's thread never runs it.
    let seen = spout_into_bolt(40, (Duration::from_millis(2), 0), true, false);
    assert_eq!(seen.len(), 40);
    let on_spout: Vec<_> = seen.iter().filter(|(thread, _)| !thread.starts_with("bolt-")).collect();
    assert!(on_spout.is_empty(), "a slow bolt ran on another thread: {on_spout:?}");
}

#[test]
fn a_bolt_that_turns_slow_soon_stops_running_on_its_spouts_thread() {
    // 2,000 fast tuples, then 2 ms each: within a few batches of at most 4 the estimate is over
    // the budget (1 ms) and the spout's thread leaves the bolt to its own. (An estimate over the
    // executor's whole life stayed under it: ~95 us a tuple after 100 slow ones.)
    let (fast, slow) = (2_000, 100);
    let seen = spout_into_bolt(fast + slow, (Duration::from_millis(2), fast as i64), true, false);
    assert_eq!(seen.len(), (fast + slow) as usize, "every tuple once");
    let on_spout = |from: i64| seen.iter().filter(|(t, id)| *id >= from && t.starts_with("spout-")).count();
    assert!(on_spout(0) > 0, "the bolt ran on the spout's thread while it was fast");
    let slow_on_spout = on_spout(fast as i64);
    assert!(slow_on_spout <= 12, "{slow_on_spout} of {slow} slow tuples ran on the spout's thread");
}

/// Counts the tuples it runs and passes each on, anchored.
struct CountingRelay {
    ran: Arc<AtomicU64>,
}

impl Bolt for CountingRelay {
    fn declare_outputs(&self, d: &mut OutputDeclarer) {
        d.declare(Fields::new(["id"]));
    }

    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        self.ran.fetch_add(1, Ordering::Relaxed);
        out.emit(&[input], values![input.get_int(0).unwrap_or(-1)])?;
        out.ack(input);
        Ok(())
    }
}

/// Panics on its first tuple, unless it runs on a thread named `<own>-...` (`own: None`:
/// wherever it runs); acks otherwise.
struct Panicking {
    own: Option<&'static str>,
    panicked: Arc<AtomicBool>,
}

impl Bolt for Panicking {
    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        let thread = std::thread::current().name().unwrap_or("").to_owned();
        if self.own.is_none_or(|own| !thread.starts_with(&format!("{own}-"))) {
            self.panicked.store(true, Ordering::Relaxed);
            panic!("a bug in a bolt, run on {thread}");
        }
        out.ack(input);
        Ok(())
    }
}

/// A paced spout's `n` unreliable tuples (one per 20 us, in passes of 50) -> relay -> `bolt` (a [`Panicking`]
/// whose own thread is `bolt`'s), inline runs as given: the cluster, how many tuples the relay
/// ran, and whether the bolt panicked.
fn relay_into_panicking(
    bolt: &'static str,
    own: Option<&'static str>,
    inline: bool,
    n: u64,
) -> (LocalCluster, Arc<AtomicU64>, Arc<AtomicBool>) {
    let (ran, panicked) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let mut b = TopologyBuilder::new("panics");
    b.config(config(|c| c.inline_downstream = inline));
    // Passes of 50 (1 ms): each pass's end may run the relay, and the bolt behind it, inline.
    // In one pass of 1,000 only its end could, and a bolt still busy then never did (CI).
    b.set_spout("spout", 1, move || SlowBurstSpout {
        n,
        emitted: Arc::new(AtomicU64::new(0)),
        burst: 50,
        ended_at: 0,
    });
    let counted = ran.clone();
    b.set_bolt("relay", 1, move || CountingRelay { ran: counted.clone() }).shuffle_grouping("spout");
    let p = panicked.clone();
    b.set_bolt(bolt, 1, move || Panicking { own, panicked: p.clone() }).global_grouping("relay");
    (LocalCluster::start(b.build().unwrap()).unwrap(), ran, panicked)
}

/// Waits until `cluster` knows an executor dead, and returns its component.
fn dead_component(cluster: &LocalCluster) -> String {
    wait_for(Duration::from_secs(10), "an executor known dead", || {
        cluster.runtime().dead_executor().is_some()
    });
    cluster.runtime().dead_executor().map(|(_, c)| c.to_string()).unwrap_or_default()
}

#[test]
fn a_bolt_that_panics_while_run_inline_stops_its_executor_not_the_upstream_one() {
    let n = 1_000;
    let (cluster, ran, panicked) = relay_into_panicking("sink", Some("sink"), true, n);
    wait_for(Duration::from_secs(60), "the sink ran on the relay's thread", || {
        panicked.load(Ordering::Relaxed)
    });
    // The relay's thread lived on: it runs every tuple the spout emits.
    wait_for(Duration::from_secs(60), "the relay ran every tuple", || ran.load(Ordering::Relaxed) == n);
    // The sink's executor is the one that died (a worker process then exits: `process.rs`).
    assert_eq!(dead_component(&cluster), "sink");
    cluster.shutdown(Duration::from_secs(1));
}

#[test]
fn a_bolt_that_panics_on_its_own_thread_leaves_its_executor_known_dead() {
    // It would panic off its own thread too: with inline runs off it never is.
    let (cluster, ran, panicked) = relay_into_panicking("panics", None, false, 100);
    assert_eq!(cluster.runtime().dead_executor(), None, "nothing died before any tuple");
    wait_for(Duration::from_secs(60), "the bolt panicked", || panicked.load(Ordering::Relaxed));
    assert_eq!(dead_component(&cluster), "panics");
    wait_for(Duration::from_secs(60), "the relay ran every tuple", || ran.load(Ordering::Relaxed) == 100);
    cluster.shutdown(Duration::from_secs(1));
}

/// Emits `n` reliable tuples at once, and notes how many the bolt had run when the first ack
/// came back.
struct BurstSpout {
    n: u64,
    next: u64,
    ran: Arc<AtomicU64>,
    at_first_ack: Arc<AtomicU64>,
    acked: Arc<AtomicU64>,
}

impl Spout for BurstSpout {
    fn declare_outputs(&self, d: &mut OutputDeclarer) {
        d.declare(Fields::new(["id"]));
    }

    fn next_tuple(&mut self, out: &mut SpoutCollector<'_>) -> Result<(), ComponentError> {
        if self.next < self.n {
            out.emit(values![self.next as i64], Some(self.next))?;
            self.next += 1;
        }
        Ok(())
    }

    fn ack(&mut self, _: u64) {
        if self.acked.fetch_add(1, Ordering::Relaxed) == 0 {
            self.at_first_ack.store(self.ran.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }
}

#[test]
fn a_long_pass_hands_its_acks_over_before_it_ends() {
    // 1,000 tuples reach the bolt as one batch: a pass of ~200 ms. Its acks go to the acker
    // (on the spout's thread) once per flush interval, so the first tree completes while the
    // bolt is still in the first tenth of the batch, not after its last tuple.
    let n = 1_000;
    let (ran, at_first_ack, acked) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut b = TopologyBuilder::new("long-pass");
    let (r, f, a) = (ran.clone(), at_first_ack.clone(), acked.clone());
    b.set_spout("spout", 1, move || BurstSpout {
        n,
        next: 0,
        ran: r.clone(),
        at_first_ack: f.clone(),
        acked: a.clone(),
    });
    let r = ran.clone();
    b.set_bolt("plod", 1, move || Slow { processed: r.clone() }).shuffle_grouping("spout");
    let cluster = LocalCluster::start(b.build().unwrap()).unwrap();
    wait_for(Duration::from_secs(60), "every tree complete", || acked.load(Ordering::Relaxed) == n);
    cluster.shutdown(Duration::from_secs(1));
    let first = at_first_ack.load(Ordering::Relaxed);
    assert!(first < 600, "the first ack came back after {first} of {n} tuples ran");
}

/// Emits `n` tuples, taking 20 µs over each, counting them: in one pass, or (`burst` > 0) in
/// passes of `burst`, each ended by a call that emits nothing.
struct SlowBurstSpout {
    n: u64,
    emitted: Arc<AtomicU64>,
    burst: u64,
    /// The tuple before which the last pass ended.
    ended_at: u64,
}

impl Spout for SlowBurstSpout {
    fn declare_outputs(&self, d: &mut OutputDeclarer) {
        d.declare(Fields::new(["id"]));
    }

    fn next_tuple(&mut self, out: &mut SpoutCollector<'_>) -> Result<(), ComponentError> {
        let next = self.emitted.load(Ordering::Relaxed);
        if self.burst > 0 && next > 0 && next.is_multiple_of(self.burst) && self.ended_at != next {
            self.ended_at = next;
            return Ok(());
        }
        if next < self.n {
            let until = Instant::now() + Duration::from_micros(20);
            while Instant::now() < until {
                std::hint::spin_loop();
            }
            out.emit(values![next as i64], None)?;
            self.emitted.store(next + 1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Notes how many tuples the spout had emitted when the first one arrived.
struct FirstArrival {
    emitted: Arc<AtomicU64>,
    at_first: Arc<AtomicU64>,
    seen: Arc<AtomicU64>,
}

impl Bolt for FirstArrival {
    fn execute(&mut self, _: &Tuple, _: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        if self.seen.fetch_add(1, Ordering::Relaxed) == 0 {
            self.at_first.store(self.emitted.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        Ok(())
    }
}

#[test]
fn a_spouts_long_pass_hands_its_tuples_over_as_it_emits() {
    // 1,000 tuples emitted in one pass of ~20 ms (fewer than a batch): the bolt gets the first
    // ones while the spout is still emitting, not after its last.
    let n = 1_000;
    let (emitted, at_first, seen) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut b = TopologyBuilder::new("long-spout-pass");
    b.config(config(|c| c.acker_executors = Some(0)));
    let e = emitted.clone();
    b.set_spout("spout", 1, move || SlowBurstSpout { n, emitted: e.clone(), burst: 0, ended_at: 0 });
    let (e, f, s) = (emitted.clone(), at_first.clone(), seen.clone());
    b.set_bolt("first", 1, move || FirstArrival { emitted: e.clone(), at_first: f.clone(), seen: s.clone() })
        .shuffle_grouping("spout");
    let cluster = LocalCluster::start(b.build().unwrap()).unwrap();
    wait_for(Duration::from_secs(60), "every tuple delivered", || seen.load(Ordering::Relaxed) == n);
    cluster.shutdown(Duration::from_secs(1));
    let first = at_first.load(Ordering::Relaxed);
    assert!(first < 600, "the first tuple arrived after {first} of {n} were emitted");
}

/// A spout that cannot open (a missing file, say); notes whether it was asked for tuples anyway.
struct Unopened {
    asked: Arc<AtomicBool>,
}

impl Spout for Unopened {
    fn declare_outputs(&self, d: &mut OutputDeclarer) {
        d.declare(Fields::new(["id", "key"]));
    }

    fn open(&mut self, _: &TopologyContext) -> Result<(), ComponentError> {
        Err("no such file: offsets.db".into())
    }

    fn next_tuple(&mut self, _: &mut SpoutCollector<'_>) -> Result<(), ComponentError> {
        self.asked.store(true, Ordering::Relaxed);
        Ok(())
    }
}

/// A spout whose `open` fails leaves its executor known dead, as a panic does (a worker process
/// then exits and its supervisor starts a fresh one, as Storm's does), and never emits; a local
/// cluster runs on, and the other spout's trees still complete, through the acker whichever
/// spout's thread it shares.
#[test]
fn a_spout_that_cannot_open_leaves_its_executor_known_dead_and_the_others_running() {
    let n = 200;
    let rec = Arc::new(Mutex::new(SpoutRecord::default()));
    let seen: Seen = Arc::default();
    let asked = Arc::new(AtomicBool::new(false));
    let mut b = TopologyBuilder::new("unopened");
    let a = asked.clone();
    b.set_spout("broken", 1, move || Unopened { asked: a.clone() });
    let r = rec.clone();
    b.set_spout("ok", 1, move || TestSpout::new(n, &r));
    let s = seen.clone();
    b.set_bolt("sink", 1, move || Recorder { seen: s.clone() })
        .shuffle_grouping("broken")
        .shuffle_grouping("ok");
    let cluster = LocalCluster::start(b.build().unwrap()).unwrap();
    assert_eq!(dead_component(&cluster), "broken");
    wait_for(Duration::from_secs(30), "every tree of the other spout acked", || acked(&rec) == n as usize);
    assert_eq!(seen.lock().unwrap().len(), n as usize, "only the other spout's tuples arrived");
    assert!(!asked.load(Ordering::Relaxed), "a spout that did not open was never asked for tuples");
    cluster.shutdown(Duration::from_secs(1));
}

/// A topology that sets `squall.worker.cpu.latency.us` runs either way: where the kernel
/// offers the device to this user, its worker holds the request while it runs (the device
/// reads at most the value); elsewhere it runs without it (a warning says why).
#[test]
fn a_worker_holds_its_cpu_latency_request_while_it_runs() {
    let rec = Arc::new(Mutex::new(SpoutRecord::default()));
    let n = 200u64;
    let mut b = TopologyBuilder::new("cpu-latency");
    b.config(config(|c| c.cpu_latency_us = Some(7)));
    let r = rec.clone();
    b.set_spout("spout", 1, move || TestSpout::new(n, &r));
    b.set_bolt("sink", 1, || Recorder { seen: Seen::default() }).shuffle_grouping("spout");
    let offered = worker::cpu_latency::CpuLatencyRequest::hold(100).is_ok();
    let cluster = LocalCluster::start(b.build().unwrap()).unwrap();
    wait_for(Duration::from_secs(30), "every tuple tree acked", || acked(&rec) == n as usize);
    if offered {
        assert_eq!(cluster.runtime().cpu_latency_us(), Some(7));
        let current = worker::cpu_latency::in_force().unwrap();
        assert!((0..=7).contains(&current), "the device reads {current} while the worker holds 7");
    } else {
        eprintln!("this user may not write {}: the worker ran without it", worker::cpu_latency::DEVICE);
        assert_eq!(cluster.runtime().cpu_latency_us(), None);
    }
    cluster.shutdown(Duration::from_secs(1));
}
