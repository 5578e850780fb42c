//! Rebalance latency on a real ZooKeeper: C members over P partitions of one topic; one member
//! joins, then leaves, repeatedly. Prints the median and p99 time from the membership change
//! (the joiner starting, the leaver being told to leave) until every member holds exactly its
//! range share, and the ZooKeeper requests all members made per membership change.
//!
//! `cargo bench -p consumer-registry --bench rebalance [-- C:P:ROUNDS ...]` (default
//! `16:256:30 64:256:10`). Not a timed test: it prints figures.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use cluster_state::coord::{CreateMode, Ensemble, SessionOptions};
use cluster_state::ids::{ConsumerId, GroupId, Partition, Topic};
use cluster_state::paths::KafkaPaths;
use cluster_state::znode::{TopicRegistration, ZnodeData};
use consumer_registry::{
    Member, MemberEvent, MemberHandle, MemberSpec, RegistryConfig, RegistryMetrics, Subscriptions,
    TopicPartitions, assigned_to, range_assign,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

struct Running {
    handle: MemberHandle,
    cancel: CancellationToken,
    task: JoinHandle<consumer_registry::Result<()>>,
}

struct Bench {
    ensemble: Ensemble,
    paths: KafkaPaths,
    group: GroupId,
    topic: Topic,
    partitions: TopicPartitions,
    metrics: RegistryMetrics,
    next: usize,
}

impl Bench {
    fn start(&mut self) -> Running {
        self.next += 1;
        let spec = MemberSpec {
            ensemble: self.ensemble.clone(),
            paths: self.paths.clone(),
            group: self.group.clone(),
            consumer_id: Some(ConsumerId::new(format!("bench_m{:04}", self.next)).unwrap()),
            host: "bench".into(),
            subscription: BTreeMap::from([(self.topic.clone(), 1)]),
            partition_source: None,
            detached_session: false,
        };
        let (member, handle, mut events) =
            Member::new(spec, RegistryConfig::default(), self.metrics.clone()).unwrap();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(member.run(cancel.clone()));
        // The caller: stops at once and acknowledges.
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                if let MemberEvent::Revoking { ack, .. } = event {
                    ack.ack();
                }
            }
        });
        Running { handle, cancel, task }
    }

    /// Waits until every member holds exactly its range share; returns how long it took.
    async fn settle(&self, members: &[Running], since: Instant) -> Duration {
        let subs: Subscriptions = members
            .iter()
            .map(|m| (m.handle.consumer_id().clone(), BTreeMap::from([(self.topic.clone(), 1)])))
            .collect();
        let assignment = range_assign(&self.partitions, &subs);
        let expected: Vec<_> =
            members.iter().map(|m| assigned_to(&assignment, m.handle.consumer_id())).collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if members.iter().zip(&expected).all(|(m, e)| m.handle.ownership().partitions == *e) {
                return since.elapsed();
            }
            assert!(Instant::now() < deadline, "the group did not settle within 60 s");
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn report(label: &str, samples: &mut [Duration]) {
    samples.sort();
    println!(
        "  {label:<6} n={:<3} p50={:>7.1} ms  p99={:>7.1} ms  max={:>7.1} ms",
        samples.len(),
        percentile(samples, 50.0).as_secs_f64() * 1e3,
        percentile(samples, 99.0).as_secs_f64() * 1e3,
        samples.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );
}

async fn run(consumers: usize, partitions: i32, rounds: usize) {
    let server = test_harness::ZkServer::shared();
    let connect = server.chroot(&format!("bench-{consumers}x{partitions}")).await;
    let ensemble = Ensemble::zookeeper(connect);
    let admin = ensemble.connect(&SessionOptions::default()).await.unwrap();
    let paths = KafkaPaths::new(None).unwrap();
    let topic = Topic::new("t").unwrap();
    let registration = TopicRegistration {
        partitions: (0..partitions).map(|p| (Partition::new(p).unwrap(), vec![])).collect(),
    };
    admin
        .create(&paths.topic(&topic), &registration.encode(), CreateMode::Persistent.with_parents())
        .await
        .unwrap();
    let metrics = RegistryMetrics::register(&prometheus::Registry::new()).unwrap();
    let mut bench = Bench {
        ensemble,
        paths,
        group: GroupId::new("bench").unwrap(),
        topic: topic.clone(),
        partitions: BTreeMap::from([(topic, registration.partitions().collect())]),
        metrics,
        next: 0,
    };

    let start = Instant::now();
    let mut members: Vec<Running> = (0..consumers).map(|_| bench.start()).collect();
    let initial = bench.settle(&members, start).await;
    println!("{consumers} members x {partitions} partitions: initial join of all settled in {initial:?}");

    let (mut joins, mut leaves) = (Vec::new(), Vec::new());
    let ops_before = bench.metrics.zookeeper_operations("bench");
    for _ in 0..rounds {
        let since = Instant::now();
        members.push(bench.start());
        joins.push(bench.settle(&members, since).await);

        let leaver = members.pop().unwrap();
        let since = Instant::now();
        leaver.cancel.cancel();
        leaves.push(bench.settle(&members, since).await);
        leaver.task.await.unwrap().unwrap();
    }
    let ops = bench.metrics.zookeeper_operations("bench") - ops_before;
    report("join", &mut joins);
    report("leave", &mut leaves);
    let mut all: Vec<Duration> = joins.iter().chain(&leaves).copied().collect();
    report("all", &mut all);
    println!(
        "  ZooKeeper requests per membership change (all members, incl. the joiner's session setup): {:.0}",
        ops as f64 / (2 * rounds) as f64
    );
    for member in members {
        member.cancel.cancel();
        member.task.await.unwrap().unwrap();
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let scenarios: Vec<(usize, i32, usize)> = if args.is_empty() {
        vec![(16, 256, 30), (64, 256, 10)]
    } else {
        args.iter()
            .map(|a| {
                let parts: Vec<&str> = a.split(':').collect();
                assert_eq!(parts.len(), 3, "expected C:P:ROUNDS, got {a}");
                (parts[0].parse().unwrap(), parts[1].parse().unwrap(), parts[2].parse().unwrap())
            })
            .collect()
    };
    for (consumers, partitions, rounds) in scenarios {
        runtime.block_on(run(consumers, partitions, rounds));
    }
}
