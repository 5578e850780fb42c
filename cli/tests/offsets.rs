//! `squall offsets` against a real ZooKeeper (the harness) and Kafka (librdkafka's mock cluster,
//! whose watermarks are right), with the group's offsets committed by the real Kafka spout
//! (`squall local --zookeeper --brokers`): describe matches the commits, export then reset from
//! the file restores them exactly, a reset is refused while the group has a live member, a
//! replay from a snapshot re-delivers exactly the messages after it, and bad input is an error
//! naming it that changes nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::time::Duration;

use cluster_state::coord::{CreateMode, Ensemble, Session, SessionOptions};
use cluster_state::znode::OffsetData;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use test_harness::ZkServer;

const SQUALL: &str = env!("CARGO_BIN_EXE_squall");
const GROUP: &str = "replay";
const PARTITIONS: i32 = 4;
const PER_PARTITION: i64 = 50;

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

struct Rig {
    dir: tempfile::TempDir,
    zookeeper: String,
    kafka: rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    session: Session,
}

impl Rig {
    fn offsets(&self, args: &[&str]) -> Output {
        Command::new(SQUALL)
            .arg("offsets")
            .args(args)
            .args(["--zookeeper", &self.zookeeper, "--brokers", &self.kafka.bootstrap_servers()])
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.offsets(args);
        assert!(out.status.success(), "squall offsets {args:?}: {}", text(&out));
        text(&out)
    }

    fn refused(&self, args: &[&str], says: &str) {
        let out = self.offsets(args);
        assert!(!out.status.success(), "squall offsets {args:?} should fail: {}", text(&out));
        assert!(text(&out).contains(says), "squall offsets {args:?}: {says:?} not in {}", text(&out));
    }

    /// The committed offsets, read from ZooKeeper directly.
    async fn committed(&self) -> BTreeMap<i32, i64> {
        let mut out = BTreeMap::new();
        for p in 0..PARTITIONS {
            let path = format!("/consumers/{GROUP}/offsets/events/{p}");
            if let Ok((o, _)) = self.session.read::<OffsetData>(&path).await {
                out.insert(p, o.get());
            }
        }
        out
    }

    /// Runs the Kafka spout topology for a few seconds; returns the spout's emitted count.
    fn consume(&self) -> u64 {
        let file = self.dir.path().join("consume.yaml");
        std::fs::write(
            &file,
            format!(
                "name: consume\nconfig: {{topology.workers: 1}}\nspouts:\n  - id: kafka\n    className: kafka-spout\n    \
                 parallelism: 1\n    params: {{topics: [events], group_id: {GROUP}, auto_offset_reset: smallest, \
                 offsets_commit_interval_ms: 200}}\nbolts:\n  - id: sink\n    className: log\n\
                 streams:\n  - {{from: kafka, to: sink, grouping: {{type: SHUFFLE}}}}\n"
            ),
        )
        .unwrap();
        let out = Command::new(SQUALL)
            .args(["local", file.to_str().unwrap(), "--duration", "4", "--progress", "0"])
            .args(["--zookeeper", &self.zookeeper, "--brokers", &self.kafka.bootstrap_servers()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        let row: Vec<&str> =
            stderr.lines().find(|l| l.starts_with("kafka ")).unwrap().split_whitespace().collect();
        row[2].parse().unwrap()
    }
}

fn all(offset: i64) -> BTreeMap<i32, i64> {
    (0..PARTITIONS).map(|p| (p, offset)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_export_reset_refuse_and_replay_from_a_snapshot() {
    let zookeeper = ZkServer::shared().chroot("offsets_cli").await;
    let session = Ensemble::zookeeper(zookeeper.clone()).connect(&SessionOptions::default()).await.unwrap();
    let kafka = rdkafka::mocking::MockCluster::new(1).unwrap();
    kafka.create_topic("events", PARTITIONS, 1).unwrap();
    let producer: BaseProducer =
        rdkafka::ClientConfig::new().set("bootstrap.servers", kafka.bootstrap_servers()).create().unwrap();
    for n in 0..PER_PARTITION * i64::from(PARTITIONS) {
        let partition = (n % i64::from(PARTITIONS)) as i32;
        producer
            .send(BaseRecord::to("events").key(&n.to_string()).payload("x").partition(partition))
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    let rig = Rig { dir: tempfile::tempdir().unwrap(), zookeeper, kafka, session };

    // The spout consumes everything and commits it; describe shows exactly that.
    assert_eq!(rig.consume(), 200);
    assert_eq!(rig.committed().await, all(PER_PARTITION));
    let described: serde_json::Value =
        serde_json::from_str(&rig.ok(&["describe", "--group", GROUP, "--output", "json"])).unwrap();
    let rows = described.as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for row in rows {
        assert_eq!((row["group"].as_str(), row["topic"].as_str()), (Some(GROUP), Some("events")));
        assert_eq!(
            (row["offset"].as_i64(), row["logEnd"].as_i64(), row["lag"].as_i64()),
            (Some(50), Some(50), Some(0))
        );
        assert!(row["owner"].is_null(), "nobody owns a partition of a stopped group: {row}");
    }
    let table = rig.ok(&["describe", "--group", GROUP, "--topic", "events"]);
    assert!(table.lines().next().unwrap().split_whitespace().eq([
        "Group",
        "Topic",
        "Partition",
        "Offset",
        "LogEnd",
        "Lag",
        "Owner"
    ]));

    // Export, move them, restore them from the file: exactly the exported offsets.
    let file = rig.dir.path().join("offsets.txt");
    rig.ok(&["export", "--group", GROUP, "--file", file.to_str().unwrap()]);
    let exported = std::fs::read_to_string(&file).unwrap();
    assert_eq!(exported.lines().next(), Some("/consumers/replay/offsets/events/0:50"));
    let dry = rig.ok(&["reset", "--group", GROUP, "--topic", "events", "--to-earliest"]);
    assert!(dry.contains("dry run"), "{dry}");
    assert_eq!(rig.committed().await, all(50), "a dry run writes nothing");
    rig.ok(&["reset", "--group", GROUP, "--topic", "events", "--to-earliest", "--execute"]);
    assert_eq!(rig.committed().await, all(0));
    rig.ok(&["reset", "--group", GROUP, "--from-file", file.to_str().unwrap(), "--execute"]);
    assert_eq!(rig.committed().await, all(50));

    // Out of range: clamped, with a warning.
    let clamped = rig.ok(&["reset", "--group", GROUP, "--topic", "events", "--to-offset", "999"]);
    assert!(clamped.contains("999 is outside [0, 50]"), "{clamped}");

    // A live member: refused, naming it and what to do; nothing changes.
    let member =
        Ensemble::zookeeper(rig.zookeeper.clone()).connect(&SessionOptions::default()).await.unwrap();
    let id = format!("/consumers/{GROUP}/ids/{GROUP}_host-1-abcd1234");
    member.create(&id, b"{}", CreateMode::Ephemeral.with_parents()).await.unwrap();
    rig.refused(
        &["reset", "--group", GROUP, "--topic", "events", "--to-earliest", "--execute"],
        "live member",
    );
    rig.refused(
        &["reset", "--group", GROUP, "--topic", "events", "--to-earliest", "--execute"],
        "deactivate or kill",
    );
    assert_eq!(rig.committed().await, all(50));
    member.close().await.unwrap();

    // Snapshot at 30, move on to the end, replay from the snapshot: the spout re-delivers
    // exactly the 4 x 20 messages after it.
    rig.ok(&["reset", "--group", GROUP, "--topic", "events", "--to-offset", "30", "--execute"]);
    rig.ok(&["snapshot", "--group", GROUP, "--name", "before-deploy"]);
    rig.refused(&["snapshot", "--group", GROUP, "--name", "before-deploy"], "already exists");
    rig.ok(&["reset", "--group", GROUP, "--topic", "events", "--to-latest", "--execute"]);
    assert_eq!(rig.committed().await, all(50));
    rig.ok(&["reset", "--group", GROUP, "--from-snapshot", "before-deploy", "--execute"]);
    assert_eq!(rig.committed().await, all(30));
    assert_eq!(rig.consume(), 80, "the messages after the snapshot, once each");
    assert_eq!(rig.committed().await, all(50));

    // Bad input: an error naming it, nothing written.
    let bad = rig.dir.path().join("bad.txt");
    std::fs::write(&bad, "/consumers/replay/offsets/events/0:1\n/consumers/replay/offsets/events/1:x\n")
        .unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["describe", "--group", "nope"], "no consumer group nope"),
        (
            vec!["reset", "--group", GROUP, "--from-file", bad.to_str().unwrap(), "--execute"],
            "line 2: offset \"x\"",
        ),
        (
            vec![
                "reset",
                "--group",
                GROUP,
                "--topic",
                "events",
                "--to-datetime",
                "last tuesday",
                "--execute",
            ],
            "\"last tuesday\"",
        ),
        (
            vec!["reset", "--group", GROUP, "--topic", "nope", "--to-earliest", "--execute"],
            "topic nope does not exist",
        ),
        (vec!["reset", "--group", GROUP, "--from-snapshot", "missing", "--execute"], "no snapshot missing"),
        (vec!["reset", "--group", GROUP, "--to-earliest", "--execute"], "--topic is required"),
        (vec!["describe", "--group", "a/b"], "--group"),
    ];
    for (args, says) in cases {
        rig.refused(&args, says);
    }
    assert_eq!(rig.committed().await, all(50));

    // A datetime after every message resets to the log end. (librdkafka's mock cluster answers
    // every lookup by time with "none", so an earlier time cannot be checked here.)
    rig.ok(&["reset", "--group", GROUP, "--topic", "events", "--to-earliest", "--execute"]);
    let later = [
        "reset",
        "--group",
        GROUP,
        "--topic",
        "events",
        "--to-datetime",
        "2099-01-01T00:00:00Z",
        "--execute",
    ];
    rig.ok(&later);
    assert_eq!(rig.committed().await, all(50));
}
