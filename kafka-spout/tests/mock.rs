//! The spout and the producer bolt against librdkafka's mock cluster and the in-memory
//! registry: every message at least once (with failures), committed offsets never past an
//! un-acked one, hand-off without double emission, group gauges following their partitions,
//! pause, out-of-range reset, YAML wiring.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use cluster_state::coord::Ensemble;
use kafka_spout::{BoltMetrics, KafkaSpout, KafkaSpoutConfig, OffsetsStorage, SpoutEnv};
use support::*;
use worker::{LocalCluster, TopologyBuilder, TopologyConfig};

const WAIT: Duration = Duration::from_secs(60);

struct Rig {
    ensemble: Ensemble,
    metrics: prometheus::Registry,
    env: SpoutEnv,
}

impl Rig {
    fn new() -> Self {
        let metrics = prometheus::Registry::new();
        let mut env = SpoutEnv::register(&metrics).unwrap();
        let ensemble = Ensemble::in_memory();
        env.ensemble = Some(ensemble.clone());
        Rig { ensemble, metrics, env }
    }

    /// Topology `name`: kafka spout (`spouts` tasks) -> recorder (2 tasks).
    fn start(
        &self,
        name: &str,
        config: KafkaSpoutConfig,
        spouts: u32,
        record: &Arc<Record>,
        decide: fn(&Seen, usize) -> Verdict,
        topology: TopologyConfig,
    ) -> LocalCluster {
        LocalCluster::start(self.topology(name, config, spouts, record, decide, topology)).unwrap()
    }

    fn topology(
        &self,
        name: &str,
        config: KafkaSpoutConfig,
        spouts: u32,
        record: &Arc<Record>,
        decide: fn(&Seen, usize) -> Verdict,
        topology: TopologyConfig,
    ) -> worker::Topology {
        let config = Arc::new(config);
        let env = self.env.clone();
        let mut builder = TopologyBuilder::new(name);
        builder.config(topology);
        builder.set_spout("kafka", spouts, move || KafkaSpout::new(config.clone(), env.clone()));
        let record = record.clone();
        builder.set_bolt("record", 2, move || Recorder::new(&record, decide)).shuffle_grouping("kafka");
        builder.build().unwrap()
    }
}

impl Rig {
    /// Another process on the same ZooKeeper: its own metrics registry.
    fn another_process(&self) -> Rig {
        let metrics = prometheus::Registry::new();
        let mut env = SpoutEnv::register(&metrics).unwrap();
        env.ensemble = Some(self.ensemble.clone());
        Rig { ensemble: self.ensemble.clone(), metrics, env }
    }

    /// Partitions of `group` that this process's gauge `name` has a series for.
    fn gauge_partitions(&self, name: &str, group: &str) -> BTreeSet<i32> {
        let families = self.metrics.gather();
        let Some(family) = families.iter().find(|f| f.name() == name) else { return BTreeSet::new() };
        family
            .get_metric()
            .iter()
            .filter(|m| m.get_label().iter().any(|l| l.name() == "group" && l.value() == group))
            .filter_map(|m| m.get_label().iter().find(|l| l.name() == "partition")?.value().parse().ok())
            .collect()
    }
}

fn all(n: u64) -> BTreeSet<u64> {
    (0..n).collect()
}

#[test]
fn every_message_at_least_once_with_ten_percent_failures_and_commits_reach_the_end() {
    let kafka = MockKafka::start(&[("in", 4)]);
    produce(&kafka.bootstrap(), "in", 4, 0..2000);
    let rig = Rig::new();
    let record = Arc::new(Record::default());
    let cluster = rig.start(
        "t1",
        spout_config(&kafka.bootstrap(), "in", "g1"),
        2,
        &record,
        ten_percent,
        TopologyConfig::default(),
    );
    assert!(wait_until(WAIT, || record.numbers() == all(2000)), "missing: {}", 2000 - record.numbers().len());
    let zk = Zk::connect(&rig.ensemble);
    assert!(
        wait_until(WAIT, || (0..4).all(|p| zk.committed("g1", "in", p) == Some(500))),
        "committed: {:?}",
        (0..4).map(|p| zk.committed("g1", "in", p)).collect::<Vec<_>>()
    );
    // Fields: topic, partition, offset, key, value, timestamp.
    for s in record.seen.lock().unwrap().iter() {
        assert_eq!(s.topic, "in");
        assert_eq!(s.key, s.value);
        assert_eq!(s.number() % 4, s.partition as u64);
        assert_eq!(s.number() / 4, s.offset as u64, "numbers are produced in order per partition");
        assert!(s.timestamp.is_some_and(|t| t > 0));
    }
    let failed = record.failed.load(Ordering::Relaxed) as f64;
    assert!(failed > 100.0, "about 10% fail: {failed}");
    let m = |name| metric(&rig.metrics, name, &[("component", "kafka")]);
    // The second task may join after the first emitted from all partitions: a hand-off
    // re-emits what follows a failed, not yet replayed message (at-least-once duplicates).
    let (emitted, replayed) = (m("squall_spout_emitted_total"), m("squall_spout_replayed_total"));
    assert!(emitted >= 2000.0, "{emitted}");
    assert_eq!(emitted + replayed, record.len() as f64, "every emission reached the bolt");
    assert_eq!(m("squall_spout_failed_total"), failed);
    assert!(replayed <= failed && replayed > 0.0, "replayed {replayed} of {failed} failures");
    assert_eq!(m("squall_spout_acked_total"), record.acked.load(Ordering::Relaxed) as f64);
    // The consumer-group view is labelled by group (as Kafka's tools and Burrow show it).
    let committed = metric(&rig.metrics, "squall_spout_committed_offset", &[("group", "g1")]);
    assert_eq!(committed, 2000.0);
    let statuses: Vec<f64> = rig
        .metrics
        .gather()
        .iter()
        .filter(|f| f.name() == "squall_spout_lag_status")
        .flat_map(|f| f.get_metric().iter().map(|m| m.get_gauge().get_value()).collect::<Vec<_>>())
        .collect();
    assert_eq!(statuses.len(), 4, "one Burrow status per partition: {statuses:?}");
    assert!(statuses.iter().all(|s| (0.0..=4.0).contains(s)), "{statuses:?}");
    println!(
        "emitted {emitted}, replayed {replayed}, failed {failed}, duplicates {}",
        record.duplicates().len()
    );
    cluster.shutdown(Duration::from_secs(5));
}

/// A topology submitted inactive opens its spouts without joining the group (Storm calls
/// `activate` only when a topology runs): offsets can be reset before its first run.
#[test]
fn a_topology_started_inactive_joins_its_group_only_when_activated() {
    let kafka = MockKafka::start(&[("dormant", 4)]);
    produce(&kafka.bootstrap(), "dormant", 4, 0..40);
    let rig = Rig::new();
    let record = Arc::new(Record::default());
    let topology = rig.topology(
        "dormant",
        spout_config(&kafka.bootstrap(), "dormant", "g-dormant"),
        2,
        &record,
        ack_all,
        TopologyConfig::default(),
    );
    let cluster = LocalCluster::start_inactive(topology).unwrap();
    let zk = Zk::connect(&rig.ensemble);
    // Opened but inactive: no member, no owner, so an operator may reset the offsets.
    assert!(
        !wait_until(Duration::from_secs(2), || !zk.ids("g-dormant").is_empty()),
        "joined while inactive: {:?}",
        zk.ids("g-dormant")
    );
    for p in 0..4 {
        zk.reset_committed("g-dormant", "dormant", p, 5);
    }
    assert_eq!(record.len(), 0, "emitted while inactive");
    cluster.runtime().activate();
    assert!(
        wait_until(WAIT, || zk.ids("g-dormant").len() == 2),
        "both tasks joined: {:?}",
        zk.ids("g-dormant")
    );
    // From the reset offsets: offsets 5..10 of each partition, numbers 20..40.
    assert!(wait_until(WAIT, || record.numbers() == (20..40).collect()), "{:?}", record.numbers());
    cluster.shutdown(Duration::from_secs(5));
}

/// Issue 15: deactivate releases the group (tuples in flight complete, offsets are committed,
/// `/ids` and `/owners` empty), an operator resets the offsets, activate joins again from them:
/// every message is delivered again.
#[test]
fn deactivate_leaves_the_group_and_activate_replays_from_reset_offsets() {
    let kafka = MockKafka::start(&[("replay", 4)]);
    produce(&kafka.bootstrap(), "replay", 4, 0..400);
    let rig = Rig::new();
    let record = Arc::new(Record::default());
    let cluster = rig.start(
        "replay",
        spout_config(&kafka.bootstrap(), "replay", "g-replay"),
        2,
        &record,
        ack_all,
        TopologyConfig::default(),
    );
    let zk = Zk::connect(&rig.ensemble);
    let committed = |p| zk.committed("g-replay", "replay", p);
    assert!(wait_until(WAIT, || record.numbers() == all(400)), "first pass: {}", record.numbers().len());
    assert_eq!(zk.ids("g-replay").len(), 2, "both tasks registered");
    cluster.runtime().deactivate();
    assert!(
        wait_until(WAIT, || zk.ids("g-replay").is_empty() && zk.owners("g-replay", "replay").is_empty()),
        "still registered after deactivate: ids {:?}, owners {:?}",
        zk.ids("g-replay"),
        zk.owners("g-replay", "replay")
    );
    assert_eq!(
        (0..4).map(committed).collect::<Vec<_>>(),
        vec![Some(100); 4],
        "everything acked is committed"
    );
    // Nothing is emitted while deactivated, even as new messages arrive.
    produce(&kafka.bootstrap(), "replay", 4, 400..440);
    let seen_before = record.len();
    for p in 0..4 {
        zk.reset_committed("g-replay", "replay", p, 0);
    }
    assert_eq!(record.len(), seen_before, "emitted while deactivated");
    cluster.runtime().activate();
    let twice = || {
        let seen = record.seen.lock().unwrap();
        let mut counts = std::collections::BTreeMap::<u64, usize>::new();
        for s in seen.iter() {
            *counts.entry(s.number()).or_default() += 1;
        }
        (0..400).all(|n| counts.get(&n).copied().unwrap_or(0) >= 2)
            && (400..440).all(|n| counts.contains_key(&n))
    };
    assert!(wait_until(WAIT, twice), "not every message was delivered again: {} seen", record.len());
    // The second task may join later (the first takes every partition meanwhile).
    assert!(
        wait_until(WAIT, || zk.ids("g-replay").len() == 2),
        "both tasks joined again: {:?}",
        zk.ids("g-replay")
    );
    assert!(
        wait_until(WAIT, || (0..4).all(|p| committed(p) == Some(110))),
        "{:?}",
        (0..4).map(committed).collect::<Vec<_>>()
    );
    cluster.shutdown(Duration::from_secs(5));
}

#[test]
fn committed_offsets_never_pass_an_unacked_offset() {
    let kafka = MockKafka::start(&[("held", 2)]);
    produce(&kafka.bootstrap(), "held", 2, 0..400);
    let rig = Rig::new();
    let record = Arc::new(Record::default());
    // Offset 50 of partition 0 is dropped on its first delivery: it times out and is replayed.
    fn hold_50(seen: &Seen, deliveries: usize) -> Verdict {
        if seen.partition == 0 && seen.offset == 50 && deliveries == 0 { Verdict::Drop } else { Verdict::Ack }
    }
    let topology = TopologyConfig { message_timeout_secs: 2, ..TopologyConfig::default() };
    let zk = Zk::connect(&rig.ensemble);
    let highest_while_unacked = Arc::new(AtomicI64::new(-1));
    let replay_acked = Arc::new(AtomicBool::new(false));
    let cluster =
        rig.start("t2", spout_config(&kafka.bootstrap(), "held", "g2"), 1, &record, hold_50, topology);
    // Sample the committed offset of partition 0 until offset 50's replay was acked.
    let watching = wait_until(WAIT, || {
        let acked =
            record.seen.lock().unwrap().iter().filter(|s| s.partition == 0 && s.offset == 50).count() >= 2;
        if let Some(c) = zk.committed("g2", "held", 0)
            && !acked
        {
            highest_while_unacked.fetch_max(c, Ordering::Relaxed);
        }
        if acked {
            replay_acked.store(true, Ordering::Relaxed);
        }
        acked
    });
    assert!(watching, "offset 50 was replayed");
    assert!(wait_until(WAIT, || zk.committed("g2", "held", 1) == Some(200)));
    assert!(
        highest_while_unacked.load(Ordering::Relaxed) <= 50,
        "committed {} while offset 50 was not acked",
        highest_while_unacked.load(Ordering::Relaxed)
    );
    assert!(highest_while_unacked.load(Ordering::Relaxed) == 50, "the acked prefix before it was committed");
    assert!(wait_until(WAIT, || zk.committed("g2", "held", 0) == Some(200)));
    assert_eq!(record.numbers(), all(400));
    assert_eq!(metric(&rig.metrics, "squall_spout_failed_total", &[("partition", "0")]), 1.0);
    cluster.shutdown(Duration::from_secs(5));
}

#[test]
fn partitions_move_from_two_tasks_to_four_without_double_emission() {
    let kafka = MockKafka::start(&[("moving", 8)]);
    let bootstrap = kafka.bootstrap();
    produce(&bootstrap, "moving", 8, 0..2000);
    let rig = Rig::new();
    let zk = Zk::connect(&rig.ensemble);
    let first = Arc::new(Record::default());
    let a = rig.start(
        "ta",
        spout_config(&bootstrap, "moving", "g3"),
        2,
        &first,
        ack_all,
        TopologyConfig::default(),
    );
    // The first task to register may hold all 8 until the second one's rebalance moves half.
    let shared_by_two = || {
        let owners = zk.owners("g3", "moving");
        owners.len() == 8 && owners.values().collect::<BTreeSet<_>>().len() == 2
    };
    assert!(wait_until(WAIT, shared_by_two), "two tasks share 8 partitions: {:?}", zk.owners("g3", "moving"));
    // Produce while the second topology joins and partitions move, then after.
    let second = Arc::new(Record::default());
    let producing = std::thread::spawn(move || produce(&bootstrap, "moving", 8, 2000..4000));
    let b = rig.start(
        "tb",
        spout_config(&kafka.bootstrap(), "moving", "g3"),
        2,
        &second,
        ack_all,
        TopologyConfig::default(),
    );
    producing.join().unwrap();
    assert!(wait_until(WAIT, || {
        let owners = zk.owners("g3", "moving");
        owners.len() == 8 && owners.values().collect::<BTreeSet<_>>().len() == 4
    }));
    produce(&kafka.bootstrap(), "moving", 8, 4000..6000);
    let union = || first.numbers().union(&second.numbers()).copied().collect::<BTreeSet<u64>>();
    assert!(wait_until(WAIT, || union() == all(6000)), "missing {}", 6000 - union().len());
    assert!(!second.numbers().is_empty(), "the new tasks consumed");
    // No (partition, offset) was emitted by two tasks, nor twice by one.
    let both: Vec<Seen> =
        first.seen.lock().unwrap().iter().chain(second.seen.lock().unwrap().iter()).cloned().collect();
    let mut keys = BTreeSet::new();
    let doubles: Vec<(i64, i64)> =
        both.iter().map(|s| (s.partition, s.offset)).filter(|k| !keys.insert(*k)).collect();
    assert!(doubles.is_empty(), "emitted twice: {doubles:?}");
    assert!(wait_until(WAIT, || (0..8).all(|p| zk.committed("g3", "moving", p) == Some(750))));
    a.shutdown(Duration::from_secs(5));
    b.shutdown(Duration::from_secs(5));
}

#[test]
fn emits_nothing_while_zookeeper_is_disconnected() {
    let kafka = MockKafka::start(&[("paused", 2)]);
    produce(&kafka.bootstrap(), "paused", 2, 0..100);
    let rig = Rig::new();
    let Ensemble::Memory(memory) = rig.ensemble.clone() else { panic!() };
    let zk = Zk::connect(&rig.ensemble);
    let before = memory.sessions();
    let record = Arc::new(Record::default());
    let cluster = rig.start(
        "t4",
        spout_config(&kafka.bootstrap(), "paused", "g4"),
        1,
        &record,
        ack_all,
        TopologyConfig::default(),
    );
    assert!(wait_until(WAIT, || record.len() == 100));
    let spout_session = memory.sessions().into_iter().find(|s| !before.contains(s)).unwrap();
    zk.block_on(async { memory.disconnect(spout_session) });
    assert!(wait_until(WAIT, || metric(&rig.metrics, "squall_spout_paused", &[]) == 1.0));
    produce(&kafka.bootstrap(), "paused", 2, 100..200);
    // An observation window, not a synchronisation: nothing may be emitted during it.
    assert!(!wait_until(Duration::from_millis(700), || record.len() > 100), "emitted while paused");
    memory.reconnect(spout_session);
    assert!(wait_until(WAIT, || record.numbers() == all(200)));
    assert!(record.duplicates().is_empty());
    cluster.shutdown(Duration::from_secs(5));
}

#[test]
fn an_out_of_range_committed_offset_is_reset_and_counted() {
    let kafka = MockKafka::start(&[("range", 2)]);
    produce(&kafka.bootstrap(), "range", 2, 0..100);
    let rig = Rig::new();
    let zk = Zk::connect(&rig.ensemble);
    zk.set_committed("g5", "range", 0, 10_000);
    zk.set_committed("g5", "range", 1, 20);
    let record = Arc::new(Record::default());
    let cluster = rig.start(
        "t5",
        spout_config(&kafka.bootstrap(), "range", "g5"),
        1,
        &record,
        ack_all,
        TopologyConfig::default(),
    );
    // Partition 0 restarts from the smallest offset; partition 1 resumes at 20.
    let expected: BTreeSet<u64> = (0..100).filter(|n| n % 2 == 0 || n / 2 >= 20).collect();
    assert!(wait_until(WAIT, || record.numbers() == expected));
    assert_eq!(metric(&rig.metrics, "squall_spout_offset_out_of_range_total", &[("partition", "0")]), 1.0);
    assert_eq!(metric(&rig.metrics, "squall_spout_offset_out_of_range_total", &[("partition", "1")]), 0.0);
    assert!(wait_until(WAIT, || zk.committed("g5", "range", 0) == Some(50)));
    cluster.shutdown(Duration::from_secs(5));
}

/// A broker that answers "offset out of range" at an offset it has just served (tansu does,
/// now and then, under a concurrent producer) is asked again from that offset: the spout does
/// not replay the partition from where auto.offset.reset puts librdkafka.
#[test]
fn an_out_of_range_answer_at_an_offset_just_served_is_fetched_again_not_replayed() {
    let kafka = MockKafka::start(&[("spurious", 1)]);
    produce(&kafka.bootstrap(), "spurious", 1, 0..50);
    let rig = Rig::new();
    let record = Arc::new(Record::default());
    let cluster = rig.start(
        "t13",
        spout_config(&kafka.bootstrap(), "spurious", "g13"),
        1,
        &record,
        ack_all,
        TopologyConfig::default(),
    );
    assert!(wait_until(WAIT, || record.numbers() == (0..50).collect()));
    // librdkafka resets the position to the log's start (auto.offset.reset: smallest).
    kafka.answer_next_fetch_out_of_range();
    produce(&kafka.bootstrap(), "spurious", 1, 50..100);
    assert!(wait_until(WAIT, || record.numbers() == (0..100).collect()), "got {:?}", record.numbers());
    assert!(record.duplicates().is_empty(), "replayed: {:?}", record.duplicates());
    assert_eq!(metric(&rig.metrics, "squall_spout_offset_out_of_range_total", &[("partition", "0")]), 0.0);
    cluster.shutdown(Duration::from_secs(5));
}

/// An owned partition whose start fails (here: its committed offset is not a number, and
/// `reset.on.corrupt.offset` is off) is tried again while it is owned, and starts once an
/// operator repairs the offset, without a rebalance. It used to stay idle until the next
/// rebalance: in a steady group, for good.
#[test]
fn a_partition_that_failed_to_start_starts_once_its_offset_is_repaired() {
    let kafka = MockKafka::start(&[("repair", 2)]);
    produce(&kafka.bootstrap(), "repair", 2, 0..100);
    let rig = Rig::new();
    let zk = Zk::connect(&rig.ensemble);
    zk.write_committed("g12", "repair", 0, b"not a number");
    zk.set_committed("g12", "repair", 1, 10);
    let record = Arc::new(Record::default());
    let cluster = rig.start(
        "t12",
        spout_config(&kafka.bootstrap(), "repair", "g12"),
        1,
        &record,
        ack_all,
        TopologyConfig::default(),
    );
    // Partition 1 runs from 10; partition 0 is owned but cannot start.
    let odd: BTreeSet<u64> = (0..100).filter(|n| n % 2 == 1 && n / 2 >= 10).collect();
    assert!(wait_until(WAIT, || record.numbers() == odd), "got {:?}", record.numbers());
    assert_eq!(zk.owners("g12", "repair").len(), 2, "both partitions are owned");
    assert!(record.numbers().iter().all(|n| n % 2 == 1), "nothing of partition 0 before the repair");
    // The operator repairs it (as `squall offsets reset` would): partition 0 starts from 30.
    zk.reset_committed("g12", "repair", 0, 30);
    let expected: BTreeSet<u64> =
        (0..100).filter(|n| if n % 2 == 0 { n / 2 >= 30 } else { n / 2 >= 10 }).collect();
    assert!(wait_until(WAIT, || record.numbers() == expected), "got {:?}", record.numbers());
    assert!(wait_until(WAIT, || zk.committed("g12", "repair", 0) == Some(50)));
    cluster.shutdown(Duration::from_secs(5));
}

/// A Kafka -> Kafka copy topology, from YAML: `parallelism` spout tasks on `src` (group
/// `group`) shuffled to as many producer bolts writing `dst`.
fn start_copy(
    kafka: &MockKafka,
    rig: &Rig,
    (src, dst, group): (&str, &str, &str),
    parallelism: u32,
) -> LocalCluster {
    start_copy_with(kafka, rig, (src, dst, group), parallelism, "{}")
}

/// [`start_copy`] with `librdkafka` (a YAML map) for the producer bolts.
fn start_copy_with(
    kafka: &MockKafka,
    rig: &Rig,
    (src, dst, group): (&str, &str, &str),
    parallelism: u32,
    librdkafka: &str,
) -> LocalCluster {
    let mut components = worker::Registry::with_builtins();
    kafka_spout::register_with(
        &mut components,
        rig.env.clone(),
        BoltMetrics::register(&rig.metrics).unwrap(),
    );
    let yaml = format!(
        r#"
name: copy
spouts:
  - id: kafka
    className: kafka-spout
    parallelism: {parallelism}
    params:
      bootstrap_servers: "{b}"
      topics: [{src}]
      group_id: {group}
      auto_offset_reset: smallest
      offsets_commit_interval_ms: 100
      librdkafka: {{fetch.wait.max.ms: "10"}}
bolts:
  - id: out
    className: kafka-bolt
    parallelism: {parallelism}
    params:
      bootstrap_servers: "{b}"
      topic: {dst}
      librdkafka: {librdkafka}
streams:
  - from: kafka
    to: out
    grouping: {{type: SHUFFLE}}
"#,
        b = kafka.bootstrap()
    );
    LocalCluster::start(components.load_str(&yaml).unwrap()).unwrap()
}

#[test]
fn yaml_topology_spout_to_producer_bolt_copies_every_message() {
    let kafka = MockKafka::start(&[("src", 4), ("dst", 3)]);
    produce(&kafka.bootstrap(), "src", 4, 0..1000);
    let rig = Rig::new();
    let cluster = start_copy(&kafka, &rig, ("src", "dst", "g6"), 2);
    let copied: BTreeSet<u64> = read_numbers(&kafka.bootstrap(), "dst", 3, 1000, WAIT).into_iter().collect();
    assert_eq!(copied, all(1000));
    // The inputs are acked once the broker has the writes, so the spout commits the end.
    let zk = Zk::connect(&rig.ensemble);
    assert!(wait_until(WAIT, || (0..4).all(|p| zk.committed("g6", "src", p) == Some(250))));
    assert!(wait_until(WAIT, || metric(&rig.metrics, "squall_kafka_bolt_written_total", &[]) >= 1000.0));
    cluster.shutdown(Duration::from_secs(5));
}

/// A producer bolt whose idempotent producer hits a fatal error (a write lost under
/// `enable.gapless.guarantee`) fails the writes it had in flight and starts a new producer:
/// every message is still copied and the spout commits the end. Before, the dead producer
/// refused every write, and the topology replayed the same tuples into it until restarted.
#[test]
fn a_producer_bolt_starts_a_new_producer_after_a_fatal_error() {
    let kafka = MockKafka::start(&[("fsrc", 2), ("fdst", 2)]);
    let rig = Rig::new();
    let idempotent = r#"{enable.idempotence: "true", enable.gapless.guarantee: "true"}"#;
    let cluster = start_copy_with(&kafka, &rig, ("fsrc", "fdst", "g15"), 1, idempotent);
    produce(&kafka.bootstrap(), "fsrc", 2, 0..100);
    let copied: BTreeSet<u64> = read_numbers(&kafka.bootstrap(), "fdst", 2, 100, WAIT).into_iter().collect();
    assert_eq!(copied, all(100));
    // The next messages wait at the source while the spout is inactive, so that the error
    // meets the bolt's next write (not the test's own producer's).
    let zk = Zk::connect(&rig.ensemble);
    assert!(wait_until(WAIT, || (0..2).all(|p| zk.committed("g15", "fsrc", p) == Some(50))));
    cluster.runtime().deactivate();
    assert!(wait_until(WAIT, || zk.owners("g15", "fsrc").is_empty()), "the inactive spout left its group");
    produce(&kafka.bootstrap(), "fsrc", 2, 100..1000);
    kafka.answer_produces_out_of_order(1);
    cluster.runtime().activate();
    let restarts = || metric(&rig.metrics, "squall_kafka_bolt_producer_restarts_total", &[]);
    assert!(wait_until(WAIT, || restarts() >= 1.0), "no producer restart after the fatal error");
    // At least once: every message, some twice (those in flight at the error replay).
    let copied: BTreeSet<u64> = read_numbers(&kafka.bootstrap(), "fdst", 2, 1000, WAIT).into_iter().collect();
    assert_eq!(copied, all(1000));
    assert!(wait_until(WAIT, || (0..2).all(|p| zk.committed("g15", "fsrc", p) == Some(500))));
    cluster.shutdown(Duration::from_secs(5));
}

/// The producer bolt acks an input as soon as the broker has its write, not at its next input:
/// librdkafka's delivery report wakes the bolt's executor. A lone write used to be acked at the
/// bolt's next input or its next tick tuple, up to a second later.
#[test]
fn the_producer_bolt_acks_a_write_when_the_broker_answers_not_at_the_next_input() {
    let kafka = MockKafka::start(&[("trickle", 1), ("trickled", 1)]);
    let rig = Rig::new();
    let cluster = start_copy(&kafka, &rig, ("trickle", "trickled", "g14"), 1);
    let zk = Zk::connect(&rig.ensemble);
    assert!(wait_until(WAIT, || zk.owners("g14", "trickle").len() == 1));
    let spout = cluster.runtime().component_stats("kafka");
    let acked = || spout.iter().map(|s| s.acked.load(Ordering::Relaxed)).sum::<u64>();
    for n in 0..20 {
        produce(&kafka.bootstrap(), "trickle", 1, n..n + 1);
        // Each is acked before the next is written: 20 lone writes.
        assert!(wait_until(WAIT, || acked() == n + 1), "{} acked of {}", acked(), n + 1);
    }
    let (p50, p99, _) = spout[0].complete_percentiles_us();
    println!("lone writes: complete latency p50 {p50} us, p99 {p99} us");
    assert!(p50 < 100_000, "p50 {p50} us: acked at a later input or a tick, not at the broker's answer");
    assert!(wait_until(WAIT, || zk.committed("g14", "trickle", 0) == Some(20)));
    cluster.shutdown(Duration::from_secs(5));
}

#[test]
fn messages_in_flight_are_bounded_without_max_spout_pending() {
    let kafka = MockKafka::start(&[("bounded", 2)]);
    produce(&kafka.bootstrap(), "bounded", 2, 0..300);
    let rig = Rig::new();
    let record = Arc::new(Record::default());
    // Nothing is ever acked (and nothing times out during the test): without a bound the spout
    // would keep all 300 for replay; Storm's default max.spout.pending (unbounded) is in force.
    fn never(_: &Seen, _: usize) -> Verdict {
        Verdict::Drop
    }
    let topology =
        TopologyConfig { message_timeout_secs: 600, max_spout_pending: None, ..TopologyConfig::default() };
    let config = KafkaSpoutConfig { max_in_flight: 25, ..spout_config(&kafka.bootstrap(), "bounded", "g7") };
    let cluster = rig.start("t7", config, 1, &record, never, topology);
    let emitted = || metric(&rig.metrics, "squall_spout_emitted_total", &[("component", "kafka")]);
    assert!(wait_until(WAIT, || emitted() >= 25.0), "the spout emits up to its bound");
    // It then stays there: watch for a while that nothing more goes out.
    assert!(!wait_until(Duration::from_millis(1500), || emitted() > 25.0), "emitted {} > 25", emitted());
    assert_eq!(record.seen.lock().unwrap().len(), 25);
    cluster.shutdown(Duration::from_secs(1));
}

#[test]
fn group_gauges_follow_their_partitions_to_another_process() {
    let kafka = MockKafka::start(&[("gauges", 4)]);
    produce(&kafka.bootstrap(), "gauges", 4, 0..400);
    let first = Rig::new();
    let second = first.another_process();
    let zk = Zk::connect(&first.ensemble);
    let record = Arc::new(Record::default());
    let config = || spout_config(&kafka.bootstrap(), "gauges", "g9");
    let a = first.start("ga", config(), 1, &record, ack_all, TopologyConfig::default());
    let everything: BTreeSet<i32> = (0..4).collect();
    let families = ["squall_spout_committed_offset", "squall_spout_lag", "squall_spout_lag_status"];
    assert!(wait_until(WAIT, || families.iter().all(|f| first.gauge_partitions(f, "g9") == everything)));
    let b = second.start("gb", config(), 1, &record, ack_all, TopologyConfig::default());
    let split = || {
        let owners = zk.owners("g9", "gauges");
        let of = |prefix: &str| -> BTreeSet<i32> {
            owners.iter().filter(|(_, t)| t.starts_with(prefix)).map(|(p, _)| *p).collect()
        };
        (of("ga_"), of("gb_"))
    };
    assert!(wait_until(WAIT, || {
        let (x, y) = split();
        x.len() == 2 && y.len() == 2
    }));
    // New messages everywhere, so the new owner commits and measures its partitions.
    produce(&kafka.bootstrap(), "gauges", 4, 400..800);
    let (kept, moved) = split();
    // Each process reports exactly the partitions it owns: the old owner's series of the moved
    // partitions are gone, not frozen at their last value.
    assert!(
        wait_until(WAIT, || families
            .iter()
            .all(|f| first.gauge_partitions(f, "g9") == kept && second.gauge_partitions(f, "g9") == moved)),
        "first {:?}, second {:?}, owners {:?}",
        first.gauge_partitions("squall_spout_lag", "g9"),
        second.gauge_partitions("squall_spout_lag", "g9"),
        zk.owners("g9", "gauges")
    );
    a.shutdown(Duration::from_secs(5));
    b.shutdown(Duration::from_secs(5));
}

/// ZooKeeper's committed offsets of `group` on partitions `0..partitions` of `topic`.
fn zk_committed(zk: &Zk, group: &str, topic: &str, partitions: i32) -> Vec<Option<i64>> {
    (0..partitions).map(|p| zk.committed(group, topic, p)).collect()
}

#[test]
fn dual_storage_commits_the_same_offsets_to_kafka_as_to_zookeeper() {
    let kafka = MockKafka::start(&[("dual", 3)]);
    let rig = Rig::new();
    let zk = Zk::connect(&rig.ensemble);
    let record = Arc::new(Record::default());
    let config = KafkaSpoutConfig {
        offsets_storage: OffsetsStorage::Dual,
        ..spout_config(&kafka.bootstrap(), "dual", "gd")
    };
    let cluster = rig.start("td", config, 2, &record, ack_all, TopologyConfig::default());
    // Three rounds of traffic; after each, once ZooKeeper has the end, Kafka has the same.
    for round in 1..=3u64 {
        produce(&kafka.bootstrap(), "dual", 3, (round - 1) * 300..round * 300);
        let end = Some(i64::try_from(round * 100).unwrap());
        assert!(
            wait_until(WAIT, || zk_committed(&zk, "gd", "dual", 3) == vec![end; 3]),
            "round {round}: ZooKeeper {:?}",
            zk_committed(&zk, "gd", "dual", 3)
        );
        assert!(
            wait_until(WAIT, || kafka_committed(&kafka.bootstrap(), "gd", "dual", 3)
                == zk_committed(&zk, "gd", "dual", 3)),
            "round {round}: Kafka {:?}, ZooKeeper {:?}",
            kafka_committed(&kafka.bootstrap(), "gd", "dual", 3),
            zk_committed(&zk, "gd", "dual", 3)
        );
    }
    assert_eq!(record.numbers(), all(900));
    assert_eq!(metric(&rig.metrics, "squall_spout_kafka_offset_failures_total", &[]), 0.0);
    cluster.shutdown(Duration::from_secs(5));
}

#[test]
fn kafka_storage_resumes_a_restarted_topology_from_kafkas_offsets() {
    let kafka = MockKafka::start(&[("kstore", 2)]);
    produce(&kafka.bootstrap(), "kstore", 2, 0..200);
    let rig = Rig::new();
    let zk = Zk::connect(&rig.ensemble);
    let config = KafkaSpoutConfig {
        offsets_storage: OffsetsStorage::Kafka,
        ..spout_config(&kafka.bootstrap(), "kstore", "gk")
    };
    let first = Arc::new(Record::default());
    let cluster = rig.start("tk", config.clone(), 1, &first, ack_all, TopologyConfig::default());
    assert!(wait_until(WAIT, || first.numbers() == all(200)));
    assert!(
        wait_until(WAIT, || kafka_committed(&kafka.bootstrap(), "gk", "kstore", 2) == vec![Some(100); 2]),
        "Kafka: {:?}",
        kafka_committed(&kafka.bootstrap(), "gk", "kstore", 2)
    );
    cluster.shutdown(Duration::from_secs(5));
    // Kafka only: ZooKeeper holds membership, never an offset.
    assert_eq!(zk_committed(&zk, "gk", "kstore", 2), vec![None, None]);
    produce(&kafka.bootstrap(), "kstore", 2, 200..300);
    let second = Arc::new(Record::default());
    let cluster = rig.start("tk", config, 1, &second, ack_all, TopologyConfig::default());
    let rest: BTreeSet<u64> = (200..300).collect();
    assert!(wait_until(WAIT, || second.numbers() == rest), "second run: {} records", second.len());
    assert!(wait_until(WAIT, || kafka_committed(&kafka.bootstrap(), "gk", "kstore", 2) == vec![Some(150); 2]));
    // An observation window, not a synchronisation: nothing before Kafka's offsets comes again.
    assert!(!wait_until(Duration::from_millis(300), || second.len() > 100), "re-delivered: {}", second.len());
    cluster.shutdown(Duration::from_secs(5));
}

#[test]
fn dual_storage_starts_from_the_larger_of_the_two_offsets() {
    let kafka = MockKafka::start(&[("ahead", 2)]);
    produce(&kafka.bootstrap(), "ahead", 2, 0..100);
    let rig = Rig::new();
    let zk = Zk::connect(&rig.ensemble);
    // Partition 0: Kafka is ahead (30 > 10); partition 1: ZooKeeper is (40 > 20).
    zk.set_committed("ga", "ahead", 0, 10);
    zk.set_committed("ga", "ahead", 1, 40);
    kafka_commit(&kafka.bootstrap(), "ga", "ahead", 0, 30);
    kafka_commit(&kafka.bootstrap(), "ga", "ahead", 1, 20);
    let record = Arc::new(Record::default());
    let config = KafkaSpoutConfig {
        offsets_storage: OffsetsStorage::Dual,
        ..spout_config(&kafka.bootstrap(), "ahead", "ga")
    };
    let cluster = rig.start("ta", config, 1, &record, ack_all, TopologyConfig::default());
    let expected: BTreeSet<u64> =
        (0..100).filter(|n| if n % 2 == 0 { n / 2 >= 30 } else { n / 2 >= 40 }).collect();
    assert!(wait_until(WAIT, || record.numbers() == expected), "got {} records", record.len());
    assert!(wait_until(WAIT, || zk_committed(&zk, "ga", "ahead", 2) == vec![Some(50); 2]));
    assert!(wait_until(WAIT, || kafka_committed(&kafka.bootstrap(), "ga", "ahead", 2) == vec![Some(50); 2]));
    assert!(record.duplicates().is_empty());
    cluster.shutdown(Duration::from_secs(5));
}

#[test]
fn with_dual_storage_a_coordinator_refusing_commits_never_holds_zookeeper_back() {
    let kafka = MockKafka::start(&[("outage", 2)]);
    produce(&kafka.bootstrap(), "outage", 2, 0..200);
    let rig = Rig::new();
    let zk = Zk::connect(&rig.ensemble);
    let record = Arc::new(Record::default());
    let config = KafkaSpoutConfig {
        offsets_storage: OffsetsStorage::Dual,
        ..spout_config(&kafka.bootstrap(), "outage", "go")
    };
    let cluster = rig.start("to", config, 1, &record, ack_all, TopologyConfig::default());
    assert!(wait_until(WAIT, || kafka_committed(&kafka.bootstrap(), "go", "outage", 2) == vec![Some(100); 2]));
    // The coordinator refuses every commit for a while: ZooKeeper's commits go on.
    kafka.refuse_offset_commits(10_000);
    produce(&kafka.bootstrap(), "outage", 2, 200..400);
    assert!(wait_until(WAIT, || record.numbers() == all(400)));
    assert!(wait_until(WAIT, || zk_committed(&zk, "go", "outage", 2) == vec![Some(200); 2]));
    let failures = || {
        metric(
            &rig.metrics,
            "squall_spout_kafka_offset_failures_total",
            &[("group", "go"), ("operation", "commit")],
        )
    };
    assert!(wait_until(WAIT, || failures() >= 2.0), "failures counted: {}", failures());
    assert_eq!(kafka_committed(&kafka.bootstrap(), "go", "outage", 2), vec![Some(100); 2]);
    // Back: the offsets Kafka missed are committed with the next commit, though ZooKeeper's
    // have not changed since.
    kafka.accept_offset_commits();
    assert!(
        wait_until(WAIT, || kafka_committed(&kafka.bootstrap(), "go", "outage", 2) == vec![Some(200); 2]),
        "Kafka: {:?}",
        kafka_committed(&kafka.bootstrap(), "go", "outage", 2)
    );
    cluster.shutdown(Duration::from_secs(5));
}
