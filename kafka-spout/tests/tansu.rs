//! End to end against a real Kafka-protocol broker (tansu) and a real ZooKeeper: numbers
//! produced to a topic go kafka spout -> pass-through -> Kafka producer bolt -> output topic.
//! Every number arrives at least once, with failures, across a worker kill and restart, and
//! while partitions move between tasks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cluster_state::coord::Ensemble;
use kafka_spout::{BoltMetrics, KafkaBolt, KafkaBoltConfig, KafkaSpout, KafkaSpoutConfig, SpoutEnv};
use support::tansu::Tansu;
use support::{Zk, produce, wait_until};
use test_harness::ZkServer;
use worker::{
    Bolt, BoltCollector, ComponentError, Fields, LocalCluster, OutputDeclarer, TopologyBuilder,
    TopologyConfig, Tuple, Value,
};

const WAIT: Duration = Duration::from_secs(120);

/// Emits (key "partition:offset", value) anchored to the input; fails `fail_per_mille` of first
/// deliveries (a deterministic hash of partition and offset).
struct PassThrough {
    fail_per_mille: u64,
    failed: Arc<AtomicU64>,
}

impl Bolt for PassThrough {
    fn declare_outputs(&self, declarer: &mut OutputDeclarer) {
        declarer.declare(Fields::new(["key", "value"]));
    }

    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        let (partition, offset) = (input.get_int(1).unwrap_or(-1), input.get_int(2).unwrap_or(-1));
        let mut x = (partition as u64) << 48 ^ offset as u64 ^ self.failed.load(Ordering::Relaxed) << 20;
        x = (x ^ (x >> 31)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        if (x >> 11) % 1000 < self.fail_per_mille {
            self.failed.fetch_add(1, Ordering::Relaxed);
            out.fail(input);
            return Ok(());
        }
        let value = input.get(4).cloned().unwrap_or(Value::Null);
        out.emit(&[input], vec![Value::from(format!("{partition}:{offset}")), value])?;
        out.ack(input);
        Ok(())
    }
}

fn chroot(test: &str) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(ZkServer::shared().chroot(test))
}

fn spout_config(bootstrap: &str, zk: &str, topic: &str, group: &str) -> KafkaSpoutConfig {
    let mut config = KafkaSpoutConfig {
        bootstrap_servers: bootstrap.into(),
        topics: vec![topic.into()],
        group_id: group.into(),
        auto_offset_reset: consumer_registry::OffsetReset::Smallest,
        offsets_commit_interval_ms: 200,
        zookeeper_connect: zk.into(),
        ..KafkaSpoutConfig::default()
    };
    config.registry.rebalance_backoff_ms = 200;
    config.registry.zookeeper_session_timeout_ms = 4000;
    // tansu holds every fetch for the whole fetch.wait.max.ms (BENCHMARKS.md).
    config.librdkafka.insert("fetch.wait.max.ms".into(), "10".into());
    config
}

struct Pipeline {
    spout: KafkaSpoutConfig,
    bolt: KafkaBoltConfig,
    spouts: u32,
    fail_per_mille: u64,
    failed: Arc<AtomicU64>,
}

impl Pipeline {
    fn new(bootstrap: &str, zk: &str, input: &str, output: &str, group: &str) -> Self {
        Pipeline {
            spout: spout_config(bootstrap, zk, input, group),
            bolt: KafkaBoltConfig {
                bootstrap_servers: bootstrap.into(),
                topic: output.into(),
                ..KafkaBoltConfig::default()
            },
            spouts: 2,
            fail_per_mille: 0,
            failed: Arc::new(AtomicU64::new(0)),
        }
    }

    fn start(&self, name: &str, metrics: &prometheus::Registry) -> LocalCluster {
        let env = SpoutEnv::register(metrics).unwrap();
        let bolt_metrics = BoltMetrics::register(metrics).unwrap();
        let (spout, bolt) = (Arc::new(self.spout.clone()), Arc::new(self.bolt.clone()));
        let (fail_per_mille, failed) = (self.fail_per_mille, self.failed.clone());
        let mut builder = TopologyBuilder::new(name);
        builder.config(TopologyConfig { max_spout_pending: Some(2000), ..TopologyConfig::default() });
        builder.set_spout("kafka", self.spouts, move || KafkaSpout::new(spout.clone(), env.clone()));
        builder
            .set_bolt("pass", 2, move || PassThrough { fail_per_mille, failed: failed.clone() })
            .shuffle_grouping("kafka");
        builder
            .set_bolt("out", 2, move || KafkaBolt::new(bolt.clone(), bolt_metrics.clone()))
            .shuffle_grouping("pass");
        LocalCluster::start(builder.build().unwrap()).unwrap()
    }
}

/// Every record of `topic` as (key, number), once `expect` distinct numbers are there, then
/// what else is already written.
fn read_output(bootstrap: &str, topic: &str, partitions: i32, expect: usize) -> Vec<(String, u64)> {
    support::read_records(bootstrap, topic, partitions, expect, WAIT, 10)
}

/// Numbers of `0..n` missing from `got`, as (partition, offset) for `partitions`, at most 40.
fn missing(got: &BTreeSet<u64>, n: u64, partitions: u64) -> Vec<(u64, u64)> {
    (0..n).filter(|x| !got.contains(x)).take(40).map(|x| (x % partitions, x / partitions)).collect()
}

fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

fn numbers(records: &[(String, u64)]) -> BTreeSet<u64> {
    records.iter().map(|(_, n)| *n).collect()
}

#[test]
fn numbers_reach_the_output_topic_at_least_once() {
    logs();
    let tansu = Tansu::start();
    tansu.create_topic("in1", 4);
    tansu.create_topic("out1", 4);
    let zk = chroot("e2e-plain");
    produce(&tansu.bootstrap(), "in1", 4, 0..2000);
    let pipeline = Pipeline::new(&tansu.bootstrap(), &zk, "in1", "out1", "g");
    let cluster = pipeline.start("plain", &prometheus::Registry::new());
    let out = read_output(&tansu.bootstrap(), "out1", 4, 2000);
    assert!(missing(&numbers(&out), 2000, 4).is_empty(), "missing {:?}", missing(&numbers(&out), 2000, 4));
    println!("plain: {} records for 2000 numbers", out.len());
    let registry = Zk::connect(&Ensemble::zookeeper(zk));
    assert!(wait_until(WAIT, || (0..4).all(|p| registry.committed("g", "in1", p) == Some(500))));
    cluster.shutdown(Duration::from_secs(5));
}

#[test]
fn ten_percent_failures_still_deliver_every_number() {
    logs();
    let tansu = Tansu::start();
    tansu.create_topic("in2", 4);
    tansu.create_topic("out2", 4);
    let zk = chroot("e2e-failures");
    produce(&tansu.bootstrap(), "in2", 4, 0..2000);
    let mut pipeline = Pipeline::new(&tansu.bootstrap(), &zk, "in2", "out2", "g");
    pipeline.fail_per_mille = 100;
    let registry = Zk::connect(&Ensemble::zookeeper(zk));
    let cluster = pipeline.start("failing", &prometheus::Registry::new());
    // Committed offsets must never pass an offset whose number is not in the output yet.
    let mut samples: Vec<(i32, i64)> = Vec::new();
    let done = wait_until(WAIT, || {
        for p in 0..4 {
            if let Some(c) = registry.committed("g", "in2", p) {
                samples.push((p, c));
            }
        }
        (0..4).all(|p| registry.committed("g", "in2", p) == Some(500))
    });
    assert!(done, "committed offsets reach the end");
    let out = read_output(&tansu.bootstrap(), "out2", 4, 2000);
    assert!(missing(&numbers(&out), 2000, 4).is_empty(), "missing {:?}", missing(&numbers(&out), 2000, 4));
    let failed = pipeline.failed.load(Ordering::Relaxed);
    assert!(failed > 50, "about 10% failed: {failed}");
    let written: BTreeSet<String> = out.iter().map(|(k, _)| k.clone()).collect();
    for (p, c) in samples {
        for o in 0..c {
            assert!(
                written.contains(&format!("{p}:{o}")),
                "committed {c} on {p}, but {p}:{o} was never written"
            );
        }
    }
    println!("failures: {failed} failed deliveries, {} records for 2000 numbers", out.len());
    cluster.shutdown(Duration::from_secs(5));
}

#[test]
fn partitions_move_from_two_spout_tasks_to_four_without_overlap() {
    logs();
    let tansu = Tansu::start();
    tansu.create_topic("in3", 8);
    tansu.create_topic("out3", 8);
    let zk = chroot("e2e-rebalance");
    let registry = Zk::connect(&Ensemble::zookeeper(zk.clone()));
    produce(&tansu.bootstrap(), "in3", 8, 0..2000);
    let pipeline = Pipeline::new(&tansu.bootstrap(), &zk, "in3", "out3", "g");
    let a = pipeline.start("two", &prometheus::Registry::new());
    assert!(wait_until(WAIT, || {
        let owners = registry.owners("g", "in3");
        owners.len() == 8 && owners.values().collect::<BTreeSet<_>>().len() == 2
    }));
    let bootstrap = tansu.bootstrap();
    let producing = std::thread::spawn(move || produce(&bootstrap, "in3", 8, 2000..4000));
    let b = pipeline.start("four", &prometheus::Registry::new());
    // Sample owners while partitions move: never two owners of one partition is guaranteed
    // by the owner node itself; check each sample is a partial function of partitions.
    assert!(wait_until(WAIT, || {
        let owners = registry.owners("g", "in3");
        owners.len() == 8 && owners.values().collect::<BTreeSet<_>>().len() == 4
    }));
    producing.join().unwrap();
    produce(&tansu.bootstrap(), "in3", 8, 4000..6000);
    let out = read_output(&tansu.bootstrap(), "out3", 8, 6000);
    assert!(missing(&numbers(&out), 6000, 8).is_empty(), "missing {:?}", missing(&numbers(&out), 6000, 8));
    // No (partition, offset) emitted twice: the drained hand-off commits before the next
    // owner starts, and nothing failed.
    let mut keys = BTreeMap::new();
    for (k, _) in &out {
        *keys.entry(k.clone()).or_insert(0) += 1;
    }
    let twice: Vec<&String> = keys.iter().filter(|(_, n)| **n > 1).map(|(k, _)| k).collect();
    assert!(twice.is_empty(), "emitted by two tasks or twice: {twice:?}");
    a.shutdown(Duration::from_secs(5));
    b.shutdown(Duration::from_secs(5));
}

/// The worker process of `a_killed_worker_resumes_from_committed_offsets`: runs the pipeline
/// described by `SQUALL_E2E_CHILD` until killed. Without that variable it does nothing.
#[test]
fn child_worker() {
    logs();
    let Ok(spec) = std::env::var("SQUALL_E2E_CHILD") else { return };
    let parts: Vec<&str> = spec.split('|').collect();
    let [bootstrap, zk, input, output] = parts[..] else { panic!("bad SQUALL_E2E_CHILD {spec}") };
    let pipeline = Pipeline::new(bootstrap, zk, input, output, "g");
    let _cluster = pipeline.start("killed", &prometheus::Registry::new());
    // Runs until the parent kills it; never longer than the parent waits.
    std::thread::sleep(WAIT);
}

fn start_child(spec: &str) -> Child {
    Command::new("setpriv")
        .args(["--pdeathsig", "KILL", "--"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "child_worker", "--nocapture", "--test-threads", "1"])
        .env("SQUALL_E2E_CHILD", spec)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn a_killed_worker_resumes_from_committed_offsets() {
    logs();
    let tansu = Tansu::start();
    tansu.create_topic("in4", 4);
    tansu.create_topic("out4", 4);
    let zk = chroot("e2e-kill");
    let registry = Zk::connect(&Ensemble::zookeeper(zk.clone()));
    produce(&tansu.bootstrap(), "in4", 4, 0..20_000);
    let spec = format!("{}|{}|in4|out4", tansu.bootstrap(), zk);
    let mut first = start_child(&spec);
    // Kill it mid-stream: once something is committed, long before everything is.
    let committed = || (0..4).map(|p| registry.committed("g", "in4", p).unwrap_or(0)).collect::<Vec<i64>>();
    assert!(wait_until(WAIT, || committed().iter().sum::<i64>() > 2000));
    first.kill().unwrap();
    first.wait().unwrap();
    let at_kill = committed();
    assert!(at_kill.iter().sum::<i64>() < 20_000, "killed mid-stream: {at_kill:?}");
    let mut second = start_child(&spec);
    let out = read_output(&tansu.bootstrap(), "out4", 4, 20_000);
    second.kill().unwrap();
    second.wait().unwrap();
    assert!(
        missing(&numbers(&out), 20_000, 4).is_empty(),
        "missing {:?}",
        missing(&numbers(&out), 20_000, 4)
    );
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (k, _) in &out {
        *counts.entry(k.as_str()).or_default() += 1;
    }
    let duplicates: Vec<(i64, i64)> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, _)| {
            let (p, o) = k.split_once(':').unwrap();
            (p.parse().unwrap(), o.parse().unwrap())
        })
        .collect();
    // Duplicates are only what the killed worker emitted past its last commit.
    for (p, o) in &duplicates {
        assert!(*o >= at_kill[*p as usize], "{p}:{o} duplicated below the committed offset {at_kill:?}");
    }
    println!(
        "kill and restart: committed at kill {at_kill:?}, {} records, {} duplicates",
        out.len(),
        duplicates.len()
    );
}
