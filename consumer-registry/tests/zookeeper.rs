//! Consumer groups on a real ZooKeeper 3.8: members join and leave (cleanly and killed), a
//! session expires, offsets round-trip. Each test works in its own chroot; an independent
//! checker watches ownership throughout.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cluster_state::coord::Ensemble;
use cluster_state::ids::Partition;
use consumer_registry::{Error, OffsetReset, RegistryConfig, StartPosition, TopicPartition};
use support::*;
use test_harness::{TcpRelay, ZkServer};
use tokio_util::sync::CancellationToken;

async fn chroot(test: &str) -> (Ensemble, SocketAddr, String) {
    let server = ZkServer::shared();
    let direct = server.chroot(test).await;
    let chroot = direct[direct.find('/').unwrap()..].to_owned();
    (Ensemble::zookeeper(direct), SocketAddr::from(([127, 0, 0, 1], server.port())), chroot)
}

fn config(session_timeout_ms: u64) -> RegistryConfig {
    RegistryConfig {
        zookeeper_session_timeout_ms: session_timeout_ms,
        zookeeper_connection_timeout_ms: 10_000,
        revoke_timeout_ms: 10_000,
        reconcile_interval_ms: 2_000,
        partition_refresh_interval_ms: 1_000,
        ..RegistryConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_to_eight_to_three_members_follow_range_assignment() {
    let (ensemble, _, _) = chroot("membership").await;
    let admin = Arc::new(ensemble.connect(&session_options()).await.unwrap());
    let subscription = BTreeMap::from([(topic("clicks"), 1), (topic("views"), 1)]);
    let mut group = Group::new(ensemble, config(4_000), subscription);
    // Callers take a while to drain and commit: new owners must wait for them.
    group.drain = Some(Duration::from_millis(30));
    // 32 partitions over two topics: one registered by "Kafka" in ZooKeeper, one known only to
    // the caller's partition source.
    group.register_topic(&admin, "clicks", 20).await;
    group.source_topic("views", 12);
    let stop = CancellationToken::new();
    let checker = spawn_checker(
        admin.clone(),
        group.paths.clone(),
        group.group.clone(),
        group.partitions.clone(),
        group.visible.clone(),
        stop.clone(),
    );

    let mut members = vec![group.start(None)];
    wait_for_assignment(&admin, &group, &members.iter().collect::<Vec<_>>(), DEADLINE).await;

    for _ in 0..7 {
        members.push(group.start(None));
    }
    wait_for_assignment(&admin, &group, &members.iter().collect::<Vec<_>>(), DEADLINE).await;

    // Five leave: two cleanly, three killed (their sessions linger until they time out).
    for _ in 0..2 {
        members.remove(1).close().await;
    }
    for _ in 0..3 {
        let killed = members.remove(1);
        killed.kill(&group.visible).await;
    }
    assert_eq!(members.len(), 3);
    // The killed members' sessions linger, as a crashed process's do, until they time out.
    let ids = admin.children(&group.paths.ids_dir(&group.group)).await.unwrap();
    assert_eq!(ids.len(), 6, "3 running + 3 killed but not yet expired: {ids:?}");
    let killed_at = tokio::time::Instant::now();
    wait_for_assignment(&admin, &group, &members.iter().collect::<Vec<_>>(), DEADLINE).await;
    println!("killed members' partitions re-owned after {:?}", killed_at.elapsed());

    // A partition-count change rebalances too.
    group.register_topic(&admin, "clicks", 24).await;
    wait_for_assignment(&admin, &group, &members.iter().collect::<Vec<_>>(), DEADLINE).await;

    stop.cancel();
    assert!(checker.await.unwrap() > 0);
    group.assert_no_violations();
    assert!(group.visible.lock().unwrap().hand_off_commits > 0);
    for member in members {
        member.close().await;
    }
    // A clean leave leaves nothing behind.
    let owners = read_owners(&admin, &group.paths, &group.group, &group.partitions).await;
    assert!(owners.is_empty(), "owner nodes left behind: {owners:?}");
    let rebalances = group.metrics_text();
    assert!(rebalances.contains("squall_consumer_rebalances_total"), "{rebalances}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_member_stops_before_others_take_over() {
    let (ensemble, server, chroot) = chroot("expiry").await;
    let admin = Arc::new(ensemble.connect(&session_options()).await.unwrap());
    let timeout_ms = 3_000;
    let mut group = Group::new(ensemble, config(timeout_ms), BTreeMap::from([(topic("clicks"), 1)]));
    group.register_topic(&admin, "clicks", 12).await;
    let stop = CancellationToken::new();
    let checker = spawn_checker(
        admin.clone(),
        group.paths.clone(),
        group.group.clone(),
        group.partitions.clone(),
        group.visible.clone(),
        stop.clone(),
    );
    // The victim reaches ZooKeeper through a relay that the test can cut.
    let relay = TcpRelay::start(server).unwrap();
    let through_relay = Ensemble::zookeeper(format!("{}{chroot}", relay.addr()));
    let victim = group.start(Some(through_relay));
    let others = [group.start(None), group.start(None)];
    let all = [&victim, &others[0], &others[1]];
    wait_for_assignment(&admin, &group, &all, DEADLINE).await;
    let victims_partitions: Vec<TopicPartition> = victim.handle.ownership().partitions.into_keys().collect();
    assert_eq!(victims_partitions.len(), 4);

    let cut_at = tokio::time::Instant::now();
    relay.cut();
    // Its partitions are re-owned by the others within the session timeout plus one second.
    let survivors = [&others[0], &others[1]];
    wait_for_assignment(&admin, &group, &survivors, Duration::from_millis(timeout_ms + 1_000)).await;
    let took = cut_at.elapsed();

    // The victim stopped (paused) before any other member started on its partitions.
    {
        let v = group.visible.lock().unwrap();
        let paused =
            v.log.iter().find(|l| l.member == victim.name && l.what == "Paused").expect("victim paused").at;
        let first_taken = v
            .log
            .iter()
            .filter(|l| l.member != victim.name && l.at > cut_at && l.what == "Assigned")
            .filter(|l| victims_partitions.iter().any(|tp| l.partitions.contains(tp)))
            .map(|l| l.at)
            .min()
            .expect("others took the victim's partitions");
        assert!(paused < first_taken, "victim paused at {paused:?}, others started at {first_taken:?}");
        println!("re-owned {took:?} after the cut; victim paused {:?} after it", paused - cut_at);
    }

    // Healed, the victim learns its session expired, re-registers and gets its share back.
    relay.restore();
    eventually(DEADLINE, "the victim to report expiry", || async {
        let v = group.visible.lock().unwrap();
        v.log.iter().any(|l| l.member == victim.name && l.what == "Expired").then_some(())
    })
    .await;
    wait_for_assignment(&admin, &group, &all, DEADLINE).await;
    stop.cancel();
    checker.await.unwrap();
    group.assert_no_violations();
    let [first, second] = others;
    for member in [victim, first, second] {
        member.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_round_trip_and_unchanged_ones_are_not_rewritten() {
    let (ensemble, _, _) = chroot("offsets").await;
    let admin = Arc::new(ensemble.connect(&session_options()).await.unwrap());
    let mut group = Group::new(ensemble, config(6_000), BTreeMap::from([(topic("clicks"), 1)]));
    group.register_topic(&admin, "clicks", 3).await;
    let stop = CancellationToken::new();
    let checker = group.checker(admin.clone(), stop.clone());
    let member = group.start(None);
    wait_for_assignment(&admin, &group, &[&member], DEADLINE).await;
    let offsets = member.handle.offsets().clone();
    let (p0, p1, p2) = (tp("clicks", 0), tp("clicks", 1), tp("clicks", 2));
    let path = |p: i32| group.paths.offset(&group.group, &topic("clicks"), Partition::new(p).unwrap());

    assert_eq!(offsets.committed(&p0).await.unwrap(), None);
    assert_eq!(offsets.start_position(&p0).await.unwrap(), StartPosition::Reset(OffsetReset::Largest));

    let report = offsets.commit(&BTreeMap::from([(p0.clone(), 5), (p1.clone(), 7)])).await.unwrap();
    assert_eq!((report.written, report.unchanged), (2, 0));
    assert_eq!(offsets.committed(&p0).await.unwrap(), Some(5));
    assert_eq!(offsets.start_position(&p1).await.unwrap(), StartPosition::Committed(7));
    let (bytes, before) = admin.get(&path(0)).await.unwrap();
    assert_eq!(bytes, b"5", "Kafka's plain decimal");

    // Unchanged offsets are not rewritten: the node's version does not move.
    let report = offsets.commit(&BTreeMap::from([(p0.clone(), 5), (p1.clone(), 8)])).await.unwrap();
    assert_eq!((report.written, report.unchanged), (1, 1));
    assert_eq!(admin.get(&path(0)).await.unwrap().1.version, before.version);
    assert_eq!(admin.get(&path(1)).await.unwrap().0, b"8");

    // Written by someone else meanwhile: a fresh store reads the truth, and rewrites.
    admin.set(&path(0), b"9", None).await.unwrap();
    assert_eq!(offsets.committed(&p0).await.unwrap(), Some(9));
    let report = offsets.commit(&BTreeMap::from([(p0.clone(), 5)])).await.unwrap();
    assert_eq!(report.written, 1);

    // Garbage is a clear, counted error; the member resets only if configured to.
    admin.create(&path(2), b"forty-two", cluster_state::coord::CreateMode::Persistent).await.unwrap();
    let err = offsets.start_position(&p2).await.unwrap_err();
    assert!(
        matches!(&err, Error::CorruptOffset { path, .. } if path.ends_with("/offsets/clicks/2")),
        "{err}"
    );
    assert!(!err.is_retryable());
    assert!(
        group
            .metrics_text()
            .contains("squall_consumer_offset_errors_total{group=\"g\",partition=\"2\",topic=\"clicks\"} 1")
    );
    let lenient = RegistryConfig { reset_on_corrupt_offset: true, ..config(6_000) };
    let (name, spec) = group.spec(None);
    let other = group.start_spec(name, spec, lenient);
    wait_for_assignment(&admin, &group, &[&member, &other], DEADLINE).await;
    assert_eq!(
        other.handle.offsets().start_position(&p2).await.unwrap(),
        StartPosition::Reset(OffsetReset::Largest)
    );
    // A commit overwrites garbage.
    other.handle.offsets().commit(&BTreeMap::from([(p2.clone(), 3)])).await.unwrap();
    assert_eq!(offsets.committed(&p2).await.unwrap(), Some(3));

    let err = offsets.commit(&BTreeMap::from([(p2.clone(), -1)])).await.unwrap_err();
    assert!(matches!(err, Error::NegativeOffset { offset: -1, .. }), "{err}");
    member.close().await;
    other.close().await;
    stop.cancel();
    checker.await.unwrap();
    group.assert_no_violations();
    // The store of a stopped member refuses politely.
    let err = offsets.committed(&p0).await.unwrap_err();
    assert!(matches!(&err, Error::Stopped { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_is_fenced_by_partition_owners_on_zookeeper() {
    let (ensemble, _, _) = chroot("reset_fence").await;
    let session = ensemble.connect(&session_options()).await.unwrap();
    a_reset_is_fenced_by_partition_owners(&session).await;
}
