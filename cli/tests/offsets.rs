//! `squall offsets` (the binary) against a real ZooKeeper (the harness, one chroot per test) and
//! Kafka (librdkafka's mock cluster, whose watermarks are right; tansu's are not), with offsets
//! committed by the real Kafka spout running in this process:
//!
//! - describe shows what the running spout committed and who owns each partition, and a reset
//!   is refused while the spout is a live member, then allowed once it stopped;
//! - export, then reset from the file, restores the exact offsets; targets out of range are
//!   clamped with a warning;
//! - a replay from a snapshot re-delivers exactly the messages after it; snapshots are listed
//!   (a damaged one named as unreadable) and deleted without touching the offsets;
//! - bad input is an error naming it, and nothing in ZooKeeper changes.
//!
//! Every wait polls with a deadline.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster_state::coord::{CreateMode, Ensemble, Session, SessionOptions};
use kafka_spout::{KafkaSpout, KafkaSpoutConfig, SpoutEnv};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use test_harness::ZkServer;
use worker::{Bolt, BoltCollector, ComponentError, LocalCluster, TopologyBuilder, Tuple};

const SQUALL: &str = env!("CARGO_BIN_EXE_squall");
const TOPIC: &str = "events";
const PARTITIONS: i32 = 4;
const WAIT: Duration = Duration::from_secs(60);

use test_harness::wait_until;

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Every partition at `offset`.
fn all(offset: i64) -> BTreeMap<i32, i64> {
    (0..PARTITIONS).map(|p| (p, offset)).collect()
}

/// One test's world: a ZooKeeper chroot, a mock Kafka with topic `events` (4 partitions), a
/// group named after the test.
struct Rig {
    runtime: tokio::runtime::Runtime,
    zookeeper: String,
    session: Session,
    kafka: MockCluster<'static, DefaultProducerContext>,
    dir: tempfile::TempDir,
    group: String,
}

impl Rig {
    fn new(test: &str) -> Rig {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let zookeeper = runtime.block_on(ZkServer::shared().chroot(test));
        let session = runtime
            .block_on(Ensemble::zookeeper(zookeeper.clone()).connect(&SessionOptions::default()))
            .unwrap();
        let kafka = MockCluster::new(1).unwrap();
        kafka.create_topic(TOPIC, PARTITIONS, 1).unwrap();
        Rig { runtime, zookeeper, session, kafka, dir: tempfile::tempdir().unwrap(), group: test.into() }
    }

    /// Produces offsets `range` to every partition (the value names partition and offset).
    fn produce(&self, range: std::ops::Range<i64>) {
        let producer: BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", self.kafka.bootstrap_servers())
            .create()
            .unwrap();
        for n in range {
            for p in 0..PARTITIONS {
                let value = format!("{p}:{n}");
                producer.send(BaseRecord::to(TOPIC).key(&value).payload(&value).partition(p)).unwrap();
            }
        }
        producer.flush(Duration::from_secs(30)).unwrap();
    }

    fn squall(&self, args: &[&str]) -> Output {
        Command::new(SQUALL)
            .arg("offsets")
            .args(args)
            .args(["--zookeeper", &self.zookeeper, "--brokers", &self.kafka.bootstrap_servers()])
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    }

    /// `squall offsets ARGS`, which must succeed; its stdout and stderr.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.squall(args);
        assert!(out.status.success(), "squall offsets {args:?}: {}", text(&out));
        text(&out)
    }

    /// `squall offsets ARGS`, which must fail saying `says`.
    fn refused(&self, args: &[&str], says: &str) {
        let out = self.squall(args);
        assert!(!out.status.success(), "squall offsets {args:?} should fail: {}", text(&out));
        assert!(text(&out).contains(says), "squall offsets {args:?}: {says:?} not in {}", text(&out));
    }

    fn describe_json(&self) -> Vec<serde_json::Value> {
        let out = self.squall(&["describe", "--group", &self.group, "--output", "json"]);
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap().as_array().unwrap().clone()
    }

    fn get(&self, path: &str) -> Option<String> {
        let (bytes, _) = self.runtime.block_on(self.session.get(path)).ok()?;
        Some(String::from_utf8(bytes).unwrap())
    }

    fn children(&self, path: &str) -> Vec<String> {
        self.runtime.block_on(self.session.children(path)).unwrap_or_default()
    }

    /// The committed offsets, read from ZooKeeper directly.
    fn committed(&self) -> BTreeMap<i32, i64> {
        (0..PARTITIONS)
            .filter_map(|p| {
                let o = self.get(&format!("/consumers/{}/offsets/{TOPIC}/{p}", self.group))?;
                Some((p, o.parse().unwrap()))
            })
            .collect()
    }

    /// Commits `offsets` directly, as a consumer would.
    fn commit(&self, offsets: &BTreeMap<i32, i64>) {
        for (p, o) in offsets {
            let path = format!("/consumers/{}/offsets/{TOPIC}/{p}", self.group);
            self.runtime
                .block_on(self.session.create(
                    &path,
                    o.to_string().as_bytes(),
                    CreateMode::Persistent.with_parents(),
                ))
                .unwrap();
        }
    }

    /// Every node under the chroot with its data: "nothing changed" is this staying equal.
    fn tree(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let mut stack = vec!["/".to_owned()];
        while let Some(path) = stack.pop() {
            for child in self.children(&path) {
                let child = if path == "/" { format!("/{child}") } else { format!("{path}/{child}") };
                out.insert(child.clone(), self.get(&child).unwrap_or_default());
                stack.push(child);
            }
        }
        out
    }

    fn members(&self) -> Vec<String> {
        self.children(&format!("/consumers/{}/ids", self.group))
    }

    /// Starts the Kafka spout (one task, the group's member) -> a bolt recording what it gets.
    fn start_spout(&self) -> RunningSpout {
        let metrics = prometheus::Registry::new();
        let mut env = SpoutEnv::register(&metrics).unwrap();
        env.ensemble = Some(Ensemble::zookeeper(self.zookeeper.clone()));
        let mut config = KafkaSpoutConfig {
            bootstrap_servers: self.kafka.bootstrap_servers(),
            topics: vec![TOPIC.into()],
            group_id: self.group.clone(),
            auto_offset_reset: consumer_registry::OffsetReset::Smallest,
            offsets_commit_interval_ms: 100,
            ..KafkaSpoutConfig::default()
        };
        config.registry.rebalance_backoff_ms = 200;
        config.librdkafka.insert("fetch.wait.max.ms".into(), "10".into());
        let config = Arc::new(config);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut builder = TopologyBuilder::new(&format!("{}-topology", self.group));
        builder.set_spout("kafka", 1, move || KafkaSpout::new(config.clone(), env.clone()));
        let sink = seen.clone();
        builder.set_bolt("record", 1, move || Recorder(sink.clone())).shuffle_grouping("kafka");
        let cluster = LocalCluster::start(builder.build().unwrap()).unwrap();
        RunningSpout { cluster, seen }
    }

    /// Runs the spout until it committed `until`; returns the (partition, offset) pairs it
    /// delivered.
    fn consume(&self, until: &BTreeMap<i32, i64>) -> Vec<(i64, i64)> {
        let spout = self.start_spout();
        spout.wait_committed(self, until);
        spout.stop(self)
    }
}

/// Records (partition, offset) of every tuple and acks it.
struct Recorder(Arc<Mutex<Vec<(i64, i64)>>>);

impl Bolt for Recorder {
    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        let seen = (input.get_int(1).unwrap(), input.get_int(2).unwrap());
        self.0.lock().unwrap().push(seen);
        out.ack(input);
        Ok(())
    }
}

struct RunningSpout {
    cluster: LocalCluster,
    seen: Arc<Mutex<Vec<(i64, i64)>>>,
}

impl RunningSpout {
    fn wait_committed(&self, rig: &Rig, until: &BTreeMap<i32, i64>) {
        assert!(
            wait_until(WAIT, || rig.committed() == *until),
            "the spout committed {:?}, expected {until:?}; it delivered {}",
            rig.committed(),
            self.seen.lock().unwrap().len()
        );
    }

    /// Stops the topology and waits until the group has no live member.
    fn stop(self, rig: &Rig) -> Vec<(i64, i64)> {
        self.cluster.shutdown(Duration::from_secs(10));
        assert!(wait_until(WAIT, || rig.members().is_empty()), "members left: {:?}", rig.members());
        let mut seen = self.seen.lock().unwrap().clone();
        seen.sort_unstable();
        seen
    }
}

#[test]
fn describe_shows_what_the_running_spout_committed_and_reset_waits_until_it_stopped() {
    let rig = Rig::new("describe_live");
    rig.produce(0..50);
    let spout = rig.start_spout();
    spout.wait_committed(&rig, &all(50));

    // Offsets, log ends, lags and owners as the spout left them in ZooKeeper.
    let owners: BTreeMap<i64, String> = (0..PARTITIONS)
        .map(|p| (i64::from(p), rig.get(&format!("/consumers/{}/owners/{TOPIC}/{p}", rig.group)).unwrap()))
        .collect();
    let rows = rig.describe_json();
    assert_eq!(rows.len(), 4, "{rows:?}");
    for row in &rows {
        let p = row["partition"].as_i64().unwrap();
        assert_eq!((row["group"].as_str(), row["topic"].as_str()), (Some(rig.group.as_str()), Some(TOPIC)));
        assert_eq!(
            (row["offset"].as_i64(), row["logEnd"].as_i64(), row["lag"].as_i64()),
            (Some(50), Some(50), Some(0))
        );
        assert_eq!(row["owner"].as_str(), Some(owners[&p].as_str()), "{row}");
    }
    let table = rig.ok(&["describe", "--group", &rig.group, "--topic", TOPIC]);
    let mut lines = table.lines();
    assert!(
        lines.next().unwrap().split_whitespace().eq([
            "Group",
            "Topic",
            "Partition",
            "Offset",
            "LogEnd",
            "Lag",
            "Owner"
        ]),
        "{table}"
    );
    for (p, line) in lines.take(4).enumerate() {
        let cells: Vec<&str> = line.split_whitespace().collect();
        let partition = p.to_string();
        let owner = owners[&(p as i64)].as_str();
        assert_eq!(cells, [rig.group.as_str(), TOPIC, partition.as_str(), "50", "50", "0", owner], "{table}");
    }

    // While the spout is a member: the plan is shown, executing it is refused naming the
    // member and what to do, and nothing changes.
    let members = rig.members();
    assert_eq!(members.len(), 1, "{members:?}");
    let dry = rig.ok(&["reset", "--group", &rig.group, "--topic", TOPIC, "--to-earliest"]);
    assert!(dry.contains("1 live member") && dry.contains("dry run"), "{dry}");
    let before = rig.tree();
    let execute = ["reset", "--group", &rig.group, "--topic", TOPIC, "--to-earliest", "--execute"];
    rig.refused(&execute, &members[0]);
    rig.refused(&execute, "deactivate or kill the topology");
    assert_eq!(rig.committed(), all(50));
    assert_eq!(rig.tree().keys().collect::<Vec<_>>(), before.keys().collect::<Vec<_>>());

    // Stopped: nobody owns anything, and the reset goes through.
    let delivered = spout.stop(&rig);
    assert_eq!(delivered.len(), 200);
    assert!(rig.describe_json().iter().all(|row| row["owner"].is_null()));
    rig.ok(&execute);
    assert_eq!(rig.committed(), all(0));
}

#[test]
fn export_then_reset_from_the_file_restores_the_exact_offsets() {
    let rig = Rig::new("export_restore");
    rig.produce(0..50);
    let committed: BTreeMap<i32, i64> = [(0, 3), (1, 17), (2, 42), (3, 50)].into_iter().collect();
    rig.commit(&committed);

    // Kafka's ExportZkOffsets lines, to a file or stdout.
    let file = rig.dir.path().join("offsets.txt");
    rig.ok(&["export", "--group", &rig.group, "--file", file.to_str().unwrap()]);
    let exported = std::fs::read_to_string(&file).unwrap();
    let expected: String = committed
        .iter()
        .map(|(p, o)| format!("/consumers/{}/offsets/{TOPIC}/{p}:{o}\n", rig.group))
        .collect();
    assert_eq!(exported, expected);
    let out = rig.squall(&["export", "--group", &rig.group]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected);

    // Describe's lag is the log end minus the commit.
    let lags: Vec<i64> = rig.describe_json().iter().map(|r| r["lag"].as_i64().unwrap()).collect();
    assert_eq!(lags, [47, 33, 8, 0]);

    // Move them all, then restore from the file: exactly what was exported.
    rig.ok(&["reset", "--group", &rig.group, "--topic", TOPIC, "--to-latest", "--execute"]);
    assert_eq!(rig.committed(), all(50));
    let plan = rig.ok(&["reset", "--group", &rig.group, "--from-file", file.to_str().unwrap()]);
    assert!(plan.contains("dry run"), "{plan}");
    assert_eq!(rig.committed(), all(50), "a dry run writes nothing");
    rig.ok(&["reset", "--group", &rig.group, "--from-file", file.to_str().unwrap(), "--execute"]);
    assert_eq!(rig.committed(), committed);

    // Out of the broker's range: clamped, with a warning naming the partition.
    let out = rig.ok(&["reset", "--group", &rig.group, "--topic", TOPIC, "--to-offset", "999"]);
    assert!(out.contains("events partition 3: 999 is outside [0, 50]"), "{out}");
    assert_eq!(rig.committed(), committed);
    let out = rig.ok(&["reset", "--group", &rig.group, "--topic", TOPIC, "--shift-by", "-10", "--execute"]);
    assert!(out.contains("events partition 0: -7 is outside [0, 50]"), "{out}");
    assert_eq!(rig.committed(), [(0, 0), (1, 7), (2, 32), (3, 40)].into_iter().collect());

    // A time after every message: the log end. (The mock cluster answers every lookup by time
    // with "none", so an earlier time cannot be checked against it.)
    rig.ok(&[
        "reset",
        "--group",
        &rig.group,
        "--topic",
        TOPIC,
        "--to-datetime",
        "2099-01-01T00:00:00Z",
        "--execute",
    ]);
    assert_eq!(rig.committed(), all(50));
}

#[test]
fn a_replay_from_a_snapshot_redelivers_the_messages_after_it() {
    let rig = Rig::new("snapshot_replay");
    rig.produce(0..30);
    assert_eq!(rig.consume(&all(30)).len(), 120);

    // Snapshot, then consume on.
    let out = rig.ok(&["snapshot", "--group", &rig.group, "--name", "before-deploy"]);
    assert!(out.contains("4 partition offsets"), "{out}");
    assert!(rig.get(&format!("/consumers/{}/squall-snapshots/before-deploy", rig.group)).is_some());
    rig.refused(&["snapshot", "--group", &rig.group, "--name", "before-deploy"], "already exists");
    // Listed, with a damaged snapshot next to it named as such (and deletable).
    let broken = format!("/consumers/{}/squall-snapshots/broken", rig.group);
    rig.runtime.block_on(rig.session.create(&broken, b"{not json", CreateMode::Persistent)).unwrap();
    let listed = rig.ok(&["snapshots", "--group", &rig.group]);
    let rows: Vec<Vec<&str>> = listed.lines().skip(1).map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows.len(), 2, "{listed}");
    assert_eq!((rows[0][0], rows[0][2], rows[0][3]), ("before-deploy", "4", TOPIC), "{listed}");
    assert!(rows[0][1].ends_with('Z'), "{listed}");
    assert_eq!((rows[1][0], rows[1][1]), ("broken", "unreadable:"), "{listed}");
    let json: serde_json::Value =
        serde_json::from_str(&rig.ok(&["snapshots", "--group", &rig.group, "--output", "json"])).unwrap();
    assert_eq!(json[0]["partitions"], 4);
    assert!(json[1]["error"].as_str().is_some_and(|e| e.contains("broken")), "{json}");
    rig.refused(
        &["delete-snapshot", "--group", &rig.group, "--name", "missing"],
        "no snapshot missing of group snapshot_replay (it has before-deploy, broken)",
    );
    let out = rig.ok(&["delete-snapshot", "--group", &rig.group, "--name", "broken"]);
    assert!(out.contains("deleted snapshot broken"), "{out}");
    assert!(rig.get(&broken).is_none());
    assert_eq!(rig.committed(), all(30), "deleting a snapshot changed the offsets");
    rig.produce(30..50);
    assert_eq!(rig.consume(&all(50)).len(), 80);

    // Back to the snapshot: the spout delivers exactly the messages after it, once each.
    let plan = rig.ok(&["reset", "--group", &rig.group, "--from-snapshot", "before-deploy"]);
    assert!(plan.contains("dry run"), "{plan}");
    assert_eq!(rig.committed(), all(50));
    rig.ok(&["reset", "--group", &rig.group, "--from-snapshot", "before-deploy", "--execute"]);
    assert_eq!(rig.committed(), all(30));
    let replayed = rig.consume(&all(50));
    let after_snapshot: Vec<(i64, i64)> =
        (0..i64::from(PARTITIONS)).flat_map(|p| (30..50).map(move |o| (p, o))).collect();
    assert_eq!(replayed, after_snapshot);
    rig.ok(&["delete-snapshot", "--group", &rig.group, "--name", "before-deploy"]);
    let listed = rig.ok(&["snapshots", "--group", &rig.group]);
    assert!(listed.contains("group snapshot_replay has no snapshots"), "{listed}");
}

#[test]
fn bad_input_is_named_and_changes_nothing() {
    let rig = Rig::new("bad_input");
    rig.produce(0..50);
    rig.commit(&all(20));
    rig.ok(&["snapshot", "--group", &rig.group, "--name", "kept"]);
    // A group that exists but never committed.
    rig.runtime
        .block_on(rig.session.create("/consumers/idle/ids", b"", CreateMode::Persistent.with_parents()))
        .unwrap();
    let write = |name: &str, text: &str| {
        let path = rig.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let g = rig.group.as_str();
    let bad_offset =
        write("bad.txt", &format!("/consumers/{g}/offsets/events/0:1\n/consumers/{g}/offsets/events/1:x\n"));
    let no_colon = write("nocolon.txt", &format!("# a comment\n\n/consumers/{g}/offsets/events/0\n"));
    let other_group = write("other.txt", "/consumers/other/offsets/events/0:1\n");
    let bad_partition = write("partition.txt", &format!("/consumers/{g}/offsets/events/9:1\n"));
    let bad_topic = write("topic.txt", &format!("/consumers/{g}/offsets/nope/0:1\n"));
    let empty = write("empty.txt", "# nothing\n");
    let missing = rig.dir.path().join("missing.txt");
    let missing = missing.to_str().unwrap();
    let before = rig.tree();

    let reset = |rest: &[&'static str]| -> Vec<String> {
        ["reset", "--group", g].iter().chain(rest).map(|s| (*s).to_owned()).collect()
    };
    let from_file = |file: &str| -> Vec<String> {
        ["reset", "--group", g, "--from-file", file, "--execute"].map(str::to_owned).to_vec()
    };
    let cases: Vec<(Vec<String>, String)> = vec![
        (vec!["describe".into(), "--group".into(), "nope".into()], "no consumer group nope".into()),
        (vec!["export".into(), "--group".into(), "nope".into()], "no consumer group nope".into()),
        (
            ["snapshot", "--group", "nope", "--name", "x"].map(str::to_owned).to_vec(),
            "no consumer group nope".into(),
        ),
        (
            ["reset", "--group", "nope", "--topic", TOPIC, "--to-earliest", "--execute"]
                .map(str::to_owned)
                .to_vec(),
            "no consumer group nope".into(),
        ),
        (vec!["snapshots".into(), "--group".into(), "nope".into()], "no consumer group nope".into()),
        (["delete-snapshot", "--group", g, "--name", "a/b"].map(str::to_owned).to_vec(), "--name".into()),
        (
            ["snapshot", "--group", "idle", "--name", "x"].map(str::to_owned).to_vec(),
            "group idle has no committed offsets".into(),
        ),
        (vec!["describe".into(), "--group".into(), "a/b".into()], "--group".into()),
        (from_file(&bad_offset), "bad.txt line 2: offset \"x\" is not a non-negative number".into()),
        (from_file(&no_colon), "nocolon.txt line 3:".into()),
        (from_file(&other_group), "other.txt line 1: the line is for group other".into()),
        (from_file(&bad_partition), "events partition 9 does not exist".into()),
        (from_file(&bad_topic), "topic nope does not exist".into()),
        (from_file(missing), "cannot read".into()),
        (from_file(&empty), "empty.txt has no offsets: nothing to reset".into()),
        (
            reset(&["--topic", "other", "--from-snapshot", "kept", "--execute"]),
            "snapshot kept has no offsets for topic other".into(),
        ),
        (reset(&["--topic", TOPIC, "--to-datetime", "last tuesday", "--execute"]), "\"last tuesday\"".into()),
        (
            reset(&["--topic", TOPIC, "--to-datetime", "2026-02-30T00:00:00Z", "--execute"]),
            "2026-02-30".into(),
        ),
        (reset(&["--topic", "nope", "--to-earliest", "--execute"]), "topic nope does not exist".into()),
        (
            reset(&["--from-snapshot", "missing", "--execute"]),
            "no snapshot missing of group bad_input (it has kept)".into(),
        ),
        (reset(&["--to-earliest", "--execute"]), "--topic is required".into()),
        (reset(&["--topic", TOPIC, "--to-earliest", "--dry-run", "--execute"]), "cannot be used with".into()),
        (reset(&["--topic", TOPIC, "--to-earliest", "--to-latest"]), "cannot be used with".into()),
    ];
    for (args, says) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        rig.refused(&args, says);
    }
    assert_eq!(rig.tree(), before, "a refused command changed ZooKeeper");
    assert_eq!(rig.committed(), all(20));
}

impl Rig {
    /// A plain consumer of the group, never joining it: how Kafka's own tools see its offsets.
    fn group_consumer(&self) -> rdkafka::consumer::BaseConsumer {
        rdkafka::ClientConfig::new()
            .set("bootstrap.servers", self.kafka.bootstrap_servers())
            .set("group.id", &self.group)
            .set("enable.auto.commit", "false")
            .create()
            .unwrap()
    }

    /// The group's offsets in Kafka's group coordinator.
    fn kafka_committed(&self) -> BTreeMap<i32, i64> {
        use rdkafka::consumer::Consumer;
        let mut list = rdkafka::TopicPartitionList::new();
        for p in 0..PARTITIONS {
            list.add_partition(TOPIC, p);
        }
        let read = self.group_consumer().committed_offsets(list, Duration::from_secs(10)).unwrap();
        (0..PARTITIONS)
            .filter_map(|p| match read.find_partition(TOPIC, p)?.offset() {
                rdkafka::Offset::Offset(o) => Some((p, o)),
                _ => None,
            })
            .collect()
    }

    /// Commits `offsets` for the group in Kafka, as a Kafka consumer would.
    fn kafka_commit(&self, offsets: &BTreeMap<i32, i64>) {
        use rdkafka::consumer::{CommitMode, Consumer};
        let mut list = rdkafka::TopicPartitionList::new();
        for (p, o) in offsets {
            list.add_partition_offset(TOPIC, *p, rdkafka::Offset::Offset(*o)).unwrap();
        }
        self.group_consumer().commit(&list, CommitMode::Sync).unwrap();
    }
}

#[test]
fn with_dual_storage_describe_shows_both_stores_and_a_reset_writes_both() {
    let rig = Rig::new("offsets-dual");
    rig.produce(0..20);
    rig.commit(&all(10));
    // Kafka ahead on partition 1, missing on partition 3.
    rig.kafka_commit(&BTreeMap::from([(0, 10), (1, 14), (2, 10)]));
    let dual = ["--offsets-storage", "dual"];
    let describe = |storage: &[&str]| {
        let mut args = vec!["describe", "--group", rig.group.as_str(), "--output", "json"];
        args.extend_from_slice(storage);
        serde_json::from_str::<serde_json::Value>(
            rig.ok(&args).lines().take_while(|l| !l.starts_with('*')).collect::<String>().as_str(),
        )
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
    };
    let rows = describe(&dual);
    let kafka: Vec<(Option<i64>, bool)> = rows
        .iter()
        .map(|r| (r["kafka"]["offset"].as_i64(), r["kafka"]["diverged"].as_bool().unwrap()))
        .collect();
    assert_eq!(kafka, [(Some(10), false), (Some(14), true), (Some(10), false), (None, true)], "{rows:?}");
    // Lag is counted from where the spouts would start: the larger offset.
    let lags: Vec<Option<i64>> = rows.iter().map(|r| r["lag"].as_i64()).collect();
    assert_eq!(lags, [Some(10), Some(6), Some(10), Some(10)]);
    // The table: a Kafka column next to ZooKeeper's, divergence marked and explained.
    let table = rig.ok(&["describe", "--group", &rig.group, "--offsets-storage", "dual"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["Group", "Topic", "Partition", "Offset", "Kafka", "LogEnd", "Lag", "Owner"]);
    assert!(table.contains("14*") && table.contains("differ on 2 partition(s)"), "{table}");
    // ZooKeeper storage: the table Kafka's tools print, unchanged.
    assert!(describe(&[]).iter().all(|r| r.get("kafka").is_none()));
    // Export with Kafka storage: Kafka's offsets; with dual: the larger.
    let exported = rig.ok(&["export", "--group", &rig.group, "--offsets-storage", "kafka"]);
    assert!(exported.contains(&format!("/consumers/{}/offsets/{TOPIC}/1:14", rig.group)), "{exported}");
    assert!(!exported.contains(&format!("/{TOPIC}/3:")), "nothing in Kafka for partition 3: {exported}");
    // A rewind writes both stores, so dual's larger-offset rule cannot undo it.
    rig.ok(&[
        "reset",
        "--group",
        &rig.group,
        "--topic",
        TOPIC,
        "--to-offset",
        "5",
        "--execute",
        "--offsets-storage",
        "dual",
    ]);
    assert_eq!(rig.committed(), all(5));
    assert_eq!(rig.kafka_committed(), all(5));
    assert!(describe(&dual).iter().all(|r| r["kafka"]["diverged"] == false && r["offset"] == 5));
    // Kafka storage without brokers is named.
    let out = Command::new(SQUALL)
        .args(["offsets", "describe", "--group", &rig.group, "--zookeeper", &rig.zookeeper])
        .args(["--offsets-storage", "kafka"])
        .output()
        .unwrap();
    assert!(!out.status.success() && text(&out).contains("--brokers"), "{}", text(&out));
    let out = rig.squall(&["describe", "--group", &rig.group, "--offsets-storage", "broker"]);
    assert!(!out.status.success() && text(&out).contains("zookeeper, kafka, dual"), "{}", text(&out));
}

/// Issue #19: an operator verb prints its result alone on stdout. Without `RUST_LOG` or `-v`,
/// `squall offsets describe` writes its table and nothing else (no ZooKeeper or Kafka client
/// chatter before it, on either stream); `-v` brings the info logs back on stderr only.
#[test]
fn describe_prints_only_its_table_unless_verbose() {
    let rig = Rig::new("describe_quiet");
    rig.produce(0..3);
    rig.commit(&all(2));
    let describe = |extra: &[&str]| {
        Command::new(SQUALL)
            .args(["offsets", "describe", "--group", &rig.group, "--topic", TOPIC])
            .args(["--zookeeper", &rig.zookeeper, "--brokers", &rig.kafka.bootstrap_servers()])
            .args(extra)
            .env_remove("RUST_LOG")
            .output()
            .unwrap()
    };
    let quiet = describe(&[]);
    assert!(quiet.status.success(), "{}", text(&quiet));
    let stdout = String::from_utf8(quiet.stdout.clone()).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("Group"), "the header comes first: {stdout}");
    let rows: Vec<&str> = lines.iter().copied().filter(|l| l.starts_with(&rig.group)).collect();
    assert_eq!(rows.len(), PARTITIONS as usize, "{stdout}");
    assert!(rows.iter().all(|r| r.split_whitespace().nth(3) == Some("2")), "{stdout}");
    assert!(!stdout.contains("INFO"), "{stdout}");
    assert!(quiet.stderr.is_empty(), "stderr: {}", String::from_utf8_lossy(&quiet.stderr));
    let verbose = describe(&["-v"]);
    assert!(verbose.status.success(), "{}", text(&verbose));
    assert_eq!(verbose.stdout, quiet.stdout, "-v changes stderr only");
    assert!(String::from_utf8_lossy(&verbose.stderr).contains("INFO"), "{}", text(&verbose));
}
