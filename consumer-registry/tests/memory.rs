//! Session handling and claim conflicts on the in-memory ensemble, where a test can
//! disconnect and expire a member's session at will.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cluster_state::coord::{CreateMode, Ensemble, MemoryEnsemble};
use cluster_state::ids::Partition;
use consumer_registry::RegistryConfig;
use support::*;
use tokio_util::sync::CancellationToken;

fn config() -> RegistryConfig {
    RegistryConfig {
        rebalance_backoff_ms: 200,
        reconcile_interval_ms: 500,
        revoke_timeout_ms: 5_000,
        ..RegistryConfig::default()
    }
}

/// The kinds of events `member` got, in order.
fn kinds(group: &Group, member: &str) -> Vec<&'static str> {
    group.visible.lock().unwrap().log.iter().filter(|l| l.member == member).map(|l| l.what).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_pauses_and_expiry_drops_ownership_before_re_registering() {
    let memory = MemoryEnsemble::new();
    let ensemble = Ensemble::Memory(memory.clone());
    let admin = Arc::new(ensemble.connect(&session_options()).await.unwrap());
    let mut group = Group::new(ensemble, config(), BTreeMap::from([(topic("clicks"), 1)]));
    group.register_topic(&admin, "clicks", 4).await;
    let stop = CancellationToken::new();
    let checker = group.checker(admin.clone(), stop.clone());
    let a = group.start(None);
    let b = group.start(None);
    wait_for_assignment(&admin, &group, &[&a, &b], DEADLINE).await;
    let first_session = a.handle.ownership().session.unwrap();

    memory.disconnect(first_session);
    eventually(DEADLINE, "a to pause", || async { a.handle.ownership().paused.then_some(()) }).await;
    assert_eq!(a.handle.ownership().partitions.len(), 2, "a pause keeps ownership");
    memory.reconnect(first_session);
    eventually(DEADLINE, "a to resume", || async { (!a.handle.ownership().paused).then_some(()) }).await;
    // The events reach the group's log from the member's event stream, after its ownership
    // view changed: wait for both, then check their order.
    let pauses = || -> Vec<&'static str> {
        kinds(&group, &a.name).into_iter().filter(|k| matches!(*k, "Paused" | "Resumed")).collect()
    };
    eventually(DEADLINE, "a's pause and resume events", || async { (pauses().len() >= 2).then_some(()) })
        .await;
    assert_eq!(pauses(), ["Paused", "Resumed"]);

    memory.expire(first_session);
    eventually(DEADLINE, "a to re-register with a new session", || async {
        let session = a.handle.ownership().session?;
        (session != first_session).then_some(())
    })
    .await;
    wait_for_assignment(&admin, &group, &[&a, &b], DEADLINE).await;
    // As above, the events may trail the ownership view.
    let reassigned = || {
        let log = kinds(&group, &a.name);
        log.iter().position(|k| *k == "Expired").is_some_and(|at| log[at + 1..].contains(&"Assigned"))
    };
    eventually(DEADLINE, "a's expiry, then an assignment, in its events", || async {
        reassigned().then_some(())
    })
    .await;
    stop.cancel();
    checker.await.unwrap();
    group.assert_no_violations();
    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_waits_for_the_previous_owner_and_leaves_nothing_behind() {
    let ensemble = Ensemble::in_memory();
    let admin = Arc::new(ensemble.connect(&session_options()).await.unwrap());
    let mut group = Group::new(ensemble.clone(), config(), BTreeMap::from([(topic("clicks"), 1)]));
    group.register_topic(&admin, "clicks", 3).await;
    let stop = CancellationToken::new();
    let checker = group.checker(admin.clone(), stop.clone());
    // A stale owner (a consumer of an older generation) still holds partition 1.
    let stale = ensemble.connect(&session_options()).await.unwrap();
    let owner = group.paths.owner(&group.group, &topic("clicks"), Partition::new(1).unwrap());
    stale.create(&owner, b"g_old-0", CreateMode::Ephemeral.with_parents()).await.unwrap();

    let a = group.start(None);
    eventually(DEADLINE, "a to claim the free partitions", || async {
        (a.handle.ownership().partitions.len() == 2).then_some(())
    })
    .await;
    assert!(!a.handle.ownership().partitions.contains_key(&tp("clicks", 1)));
    assert!(
        group.metrics_text().contains("squall_consumer_owner_conflicts_total{group=\"g\",topic=\"clicks\"}")
    );

    // The stale owner lets go: the claim goes through (a retry, or the periodic reconcile).
    stale.delete(&owner, None).await.unwrap();
    wait_for_assignment(&admin, &group, &[&a], Duration::from_secs(5)).await;

    // An owner node deleted behind the member's back: the periodic reconcile notices, has the
    // caller stop, and claims it again.
    let stolen = group.paths.owner(&group.group, &topic("clicks"), Partition::new(2).unwrap());
    admin.delete(&stolen, None).await.unwrap();
    eventually(DEADLINE, "the lost partition to be revoked and re-claimed", || async {
        let v = group.visible.lock().unwrap();
        let revoked =
            v.log.iter().position(|l| l.what == "Revoking" && l.partitions.contains(&tp("clicks", 2)))?;
        v.log[revoked..]
            .iter()
            .any(|l| l.what == "Assigned" && l.partitions.contains(&tp("clicks", 2)))
            .then_some(())
    })
    .await;
    wait_for_assignment(&admin, &group, &[&a], DEADLINE).await;
    assert!(
        group
            .metrics_text()
            .contains("squall_consumer_orphaned_partitions_total{group=\"g\",topic=\"clicks\"}")
    );
    stop.cancel();
    checker.await.unwrap();
    group.assert_no_violations();
    a.close().await;
    let owners = read_owners(&admin, &group.paths, &group.group, &group.partitions).await;
    assert!(owners.is_empty(), "nothing left behind: {owners:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_groups_and_partition_source_changes() {
    let ensemble = Ensemble::in_memory();
    let admin = Arc::new(ensemble.connect(&session_options()).await.unwrap());
    let config = RegistryConfig {
        partition_assignment_strategy: consumer_registry::Strategy::RoundRobin,
        partition_refresh_interval_ms: 100,
        ..config()
    };
    let mut group = Group::new(ensemble, config, BTreeMap::from([(topic("views"), 2)]));
    group.source_topic("views", 8);
    let stop = CancellationToken::new();
    let checker = group.checker(admin.clone(), stop.clone());
    group.source_topic("views", 5);
    let a = group.start(None);
    let b = group.start(None);
    let expected = |group: &Group| {
        let subs = [&a, &b].iter().map(|m| (m.consumer_id().clone(), group.subscription.clone())).collect();
        consumer_registry::round_robin_assign(&group.partitions, &subs).unwrap()
    };
    let want = expected(&group);
    eventually(DEADLINE, "round-robin owners", || async {
        let owners = read_owners(&admin, &group.paths, &group.group, &group.partitions).await;
        (owners == want).then_some(())
    })
    .await;
    // The source reports more partitions: the refresh picks them up and rebalances.
    group.source_topic("views", 8);
    let want = expected(&group);
    eventually(DEADLINE, "owners after the partition count grew", || async {
        let owners = read_owners(&admin, &group.paths, &group.group, &group.partitions).await;
        (owners == want).then_some(())
    })
    .await;
    stop.cancel();
    checker.await.unwrap();
    group.assert_no_violations();
    a.close().await;
    b.close().await;
}

/// A member whose partition source fails when it joins knows no partitions and claims nothing,
/// while the others already gave its share up: it asks again after the backoff, not at the
/// next periodic refresh (the supervisor kill story saw a partition idle 20 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_partition_source_failed_asks_again_soon() {
    let ensemble = Ensemble::in_memory();
    let config = RegistryConfig { partition_refresh_interval_ms: 600_000, ..config() };
    let mut group = Group::new(ensemble, config, BTreeMap::from([(topic("views"), 1)]));
    group.source_topic("views", 4);
    let a = group.start(None);
    eventually(DEADLINE, "a to own every partition", || async {
        (a.handle.ownership().partitions.len() == 4).then_some(())
    })
    .await;
    group.source.1.store(6, std::sync::atomic::Ordering::SeqCst);
    let joined = tokio::time::Instant::now();
    let b = group.start(None);
    eventually(DEADLINE, "b to get its share", || async {
        (b.handle.ownership().partitions.len() == 2 && a.handle.ownership().partitions.len() == 2)
            .then_some(())
    })
    .await;
    assert_eq!(group.source.1.load(std::sync::atomic::Ordering::SeqCst), 0, "the failure was used");
    let took = joined.elapsed();
    assert!(took < Duration::from_secs(10), "b claimed its share only after {took:?}");
    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_revocation_is_released_after_the_revoke_timeout() {
    let ensemble = Ensemble::in_memory();
    let admin = ensemble.connect(&session_options()).await.unwrap();
    let config = RegistryConfig { revoke_timeout_ms: 300, ..config() };
    let mut group = Group::new(ensemble, config.clone(), BTreeMap::from([(topic("clicks"), 1)]));
    group.register_topic(&admin, "clicks", 4).await;

    // A caller that never acknowledges (it keeps the acks).
    let (name, spec) = group.spec(None);
    let (member, stubborn, mut events) =
        consumer_registry::Member::new(spec, config, group.metrics.clone()).unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(member.run(cancel.clone()));
    let kept = tokio::spawn(async move {
        let mut acks = Vec::new();
        while let Some(event) = events.recv().await {
            if let consumer_registry::MemberEvent::Revoking { ack, .. } = event {
                acks.push(ack);
            }
        }
        acks.len()
    });
    eventually(DEADLINE, "the stubborn member to own everything", || async {
        (stubborn.ownership().partitions.len() == 4).then_some(())
    })
    .await;

    let joined = tokio::time::Instant::now();
    let b = group.start(None);
    eventually(DEADLINE, "b to get its share anyway", || async {
        (b.handle.ownership().partitions.len() == 2).then_some(())
    })
    .await;
    assert!(joined.elapsed() >= Duration::from_millis(300), "released only after the timeout");
    assert_eq!(stubborn.ownership().partitions.len(), 2, "{name} keeps its share");
    cancel.cancel();
    task.await.unwrap().unwrap();
    assert!(kept.await.unwrap() >= 2, "revocations at rebalance and at leave");
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_id_a_member_registers_kafkas_default_consumer_id() {
    let ensemble = Ensemble::in_memory();
    let admin = ensemble.connect(&session_options()).await.unwrap();
    let mut group = Group::new(ensemble, config(), BTreeMap::from([(topic("clicks"), 2)]));
    group.register_topic(&admin, "clicks", 2).await;
    let (name, mut spec) = group.spec(None);
    spec.consumer_id = None;
    spec.host = "host1".into();
    let member = group.start_spec(name, spec, config());
    // Kafka's `group_host-millis-uuid8`.
    let id = member.consumer_id().to_string();
    let rest = id.strip_prefix("g_host1-").unwrap();
    let (millis, uuid8) = rest.split_once('-').unwrap();
    assert!(millis.len() >= 13 && millis.bytes().all(|b| b.is_ascii_digit()), "{id}");
    assert!(uuid8.len() == 8 && uuid8.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    // Its two streams are threads `<id>-0` and `<id>-1`, registered as Kafka writes them.
    let registration: cluster_state::znode::ConsumerRegistration =
        eventually(DEADLINE, "the registration", || async {
            admin.read(&group.paths.id(&group.group, member.consumer_id())).await.ok().map(|(r, _)| r)
        })
        .await;
    assert_eq!(registration.subscription, BTreeMap::from([("clicks".to_owned(), 2)]));
    wait_for_assignment(&admin, &group, &[&member], DEADLINE).await;
    let threads: Vec<String> =
        member.handle.ownership().partitions.into_values().map(|t| t.to_string()).collect();
    assert_eq!(threads, [format!("{id}-0"), format!("{id}-1")]);
    member.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_is_fenced_by_partition_owners_in_memory() {
    let ensemble = Ensemble::Memory(MemoryEnsemble::new());
    let session = ensemble.connect(&session_options()).await.unwrap();
    a_reset_is_fenced_by_partition_owners(&session).await;
}

/// Connection flaps while the caller is not reading: once its event queue is full, the
/// member waits to hand over the `Paused` of the next disconnect, and the reconnect meanwhile
/// must not make it drop that event. The caller then reads every `Paused` before its
/// `Resumed`, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_behind_on_its_events_loses_no_pause_or_resume() {
    use consumer_registry::MemberEvent;
    let memory = MemoryEnsemble::new();
    let ensemble = Ensemble::Memory(memory.clone());
    let admin = ensemble.connect(&session_options()).await.unwrap();
    let mut group = Group::new(ensemble, config(), BTreeMap::from([(topic("clicks"), 1)]));
    group.register_topic(&admin, "clicks", 2).await;
    let (_, spec) = group.spec(None);
    let (member, handle, mut events) =
        consumer_registry::Member::new(spec, config(), group.metrics.clone()).unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(member.run(cancel.clone()));
    eventually(DEADLINE, "the member to own both partitions", || async {
        (handle.ownership().partitions.len() == 2).then_some(())
    })
    .await;
    let session = handle.ownership().session.unwrap();
    // 40 flaps would put 80 events behind the Assigned, more than the queue holds (64), and
    // nobody reads: the member ends up waiting to hand one over, and then sees no flap.
    const FLAPS: usize = 40;
    let within = |paused: bool| {
        let handle = handle.clone();
        tokio::time::timeout(Duration::from_millis(300), async move {
            while handle.ownership().paused != paused {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let mut observed = 0;
    for _ in 0..FLAPS {
        memory.disconnect(session);
        let paused = within(true).await.is_ok();
        memory.reconnect(session);
        if !paused {
            break;
        }
        observed += 1;
        if within(false).await.is_err() {
            break;
        }
    }
    assert!((31..FLAPS).contains(&observed), "the queue filled after {observed} flaps");
    let mut seen = Vec::new();
    let read = tokio::time::timeout(DEADLINE, async {
        while seen.len() < 2 * observed {
            match events.recv().await {
                Some(MemberEvent::Paused) => seen.push("Paused"),
                Some(MemberEvent::Resumed) => seen.push("Resumed"),
                Some(_) => {}
                None => break,
            }
        }
    })
    .await;
    assert!(read.is_ok(), "{} of {} pause and resume events arrived: {seen:?}", seen.len(), 2 * observed);
    let pairs: Vec<&str> = (0..observed).flat_map(|_| ["Paused", "Resumed"]).collect();
    assert_eq!(seen, pairs, "every Paused before its Resumed, none lost");
    assert_eq!(handle.ownership().session, Some(session), "a flap is not an expiry");
    cancel.cancel();
    task.await.unwrap().unwrap();
}
