//! What the consumer-registry tests share: a group of members, each driven by a caller that
//! acts on its events like a spout would, and an independent checker of ownership.

#![allow(dead_code)] // each test binary uses a different part

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster_state::coord::{Ensemble, Session, SessionOptions};
use cluster_state::ids::{ConsumerId, ConsumerThreadId, GroupId, Partition, Topic};
use cluster_state::paths::KafkaPaths;
use cluster_state::znode::{OwnerData, TopicRegistration, ZnodeData};
use consumer_registry::{
    Assignment, Member, MemberEvent, MemberHandle, MemberSpec, OffsetStore, PartitionSource, RegistryConfig,
    RegistryMetrics, RevokeAck, SourcedPartitions, Subscriptions, TopicPartition, TopicPartitions,
};
use futures::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use test_harness::eventually;

pub const DEADLINE: Duration = Duration::from_secs(30);

pub fn topic(name: &str) -> Topic {
    Topic::new(name).unwrap()
}

pub fn tp(t: &str, p: i32) -> TopicPartition {
    TopicPartition::new(topic(t), Partition::new(p).unwrap())
}

/// A partition source answering from a fixed table, like the spout's metadata client.
/// The next `.1` calls fail, as a metadata request to a broker that does not answer.
#[derive(Debug, Default)]
pub struct FixedSource(pub Mutex<BTreeMap<Topic, BTreeSet<Partition>>>, pub std::sync::atomic::AtomicU32);

impl PartitionSource for FixedSource {
    fn partitions<'a>(&'a self, topic: &'a Topic) -> BoxFuture<'a, SourcedPartitions> {
        use std::sync::atomic::Ordering;
        let failing = self.1.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        let answer = self.0.lock().unwrap().get(topic).cloned();
        Box::pin(async move {
            if failing {
                return Err("the broker did not answer".into());
            }
            Ok(answer)
        })
    }
}

/// What one caller does and when, as the checker saw it.
#[derive(Debug, Clone)]
pub struct Logged {
    pub at: Instant,
    pub member: String,
    /// The event's kind: `Assigned`, `Revoking`, `Paused`, ... or `killed`.
    pub what: &'static str,
    pub partitions: BTreeSet<TopicPartition>,
}

/// The callers' view: which member emits from which partition. Every change is checked
/// against the rule that no two members emit from one partition.
#[derive(Debug, Default)]
pub struct Visible {
    /// Partition -> members holding it (emitting unless paused).
    pub held: HashMap<TopicPartition, BTreeSet<String>>,
    /// Counts assignments, so that the checker can tell a continuous holding from a new one.
    pub epoch: u64,
    pub since: HashMap<(TopicPartition, String), u64>,
    pub paused: BTreeSet<String>,
    pub violations: Vec<String>,
    pub log: Vec<Logged>,
    /// Commits made at hand-off that succeeded.
    pub hand_off_commits: usize,
}

impl Visible {
    fn emitting(&self, tp: &TopicPartition) -> Vec<&String> {
        self.held.get(tp).into_iter().flatten().filter(|m| !self.paused.contains(*m)).collect()
    }

    /// Partition -> (member, assignment epoch) of those emitting from it.
    fn emitters(&self) -> HashMap<TopicPartition, Vec<(String, u64)>> {
        self.held
            .keys()
            .map(|tp| {
                let who = self
                    .emitting(tp)
                    .into_iter()
                    .map(|m| (m.clone(), self.since.get(&(tp.clone(), m.clone())).copied().unwrap_or(0)));
                (tp.clone(), who.collect())
            })
            .collect()
    }

    fn check(&mut self, tp: &TopicPartition) {
        let emitting = self.emitting(tp);
        if emitting.len() > 1 {
            let v = format!("{tp} emitted by {emitting:?} at once");
            self.violations.push(v);
        }
    }

    fn record(&mut self, member: &str, what: &'static str, partitions: BTreeSet<TopicPartition>) {
        self.log.push(Logged { at: Instant::now(), member: member.to_owned(), what, partitions });
    }

    /// The member is gone (killed): it emits nothing any more.
    pub fn forget(&mut self, member: &str) {
        self.held.values_mut().for_each(|m| {
            m.remove(member);
        });
        self.paused.remove(member);
        self.record(member, "killed", BTreeSet::new());
    }
}

/// One running member and the caller task acting on its events.
#[derive(Debug)]
pub struct Running {
    pub name: String,
    pub handle: MemberHandle,
    pub cancel: CancellationToken,
    pub member: JoinHandle<consumer_registry::Result<()>>,
    pub caller: JoinHandle<()>,
}

impl Running {
    pub fn consumer_id(&self) -> &ConsumerId {
        self.handle.consumer_id()
    }

    /// Leaves cleanly and waits for the member to finish.
    pub async fn close(self) {
        self.cancel.cancel();
        tokio::time::timeout(DEADLINE, self.member).await.expect("member did not stop").unwrap().unwrap();
        let _ = tokio::time::timeout(DEADLINE, self.caller).await;
    }

    /// A crash: the member stops dead; its (detached) session lingers until it times out.
    pub async fn kill(self, visible: &Mutex<Visible>) {
        self.member.abort();
        let _ = self.member.await;
        self.caller.abort();
        let _ = self.caller.await;
        visible.lock().unwrap().forget(&self.name);
    }
}

/// Starts the caller task: it acts on events as a spout would (stop before acknowledging).
/// On a revocation it stops and, given a `drain` time, drains for that long (simulated work)
/// and commits the partitions' offsets (a made-up position) through the member's store; then
/// it acknowledges.
pub fn spawn_caller(
    name: String,
    mut events: tokio::sync::mpsc::Receiver<MemberEvent>,
    visible: Arc<Mutex<Visible>>,
    offsets: OffsetStore,
    drain: Option<Duration>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            let Some((partitions, ack)) = observe(&name, event, &mut visible.lock().unwrap()) else {
                continue;
            };
            if let Some(drain) = drain {
                tokio::time::sleep(drain).await;
                let positions = partitions.iter().map(|tp| (tp.clone(), 100)).collect();
                let committed = offsets.commit(&positions).await.is_ok();
                visible.lock().unwrap().hand_off_commits += usize::from(committed);
            }
            ack.ack();
        }
    })
}

/// Applies `event` to the callers' view; returns a revocation still to drain and acknowledge.
fn observe(name: &str, event: MemberEvent, v: &mut Visible) -> Option<(BTreeSet<TopicPartition>, RevokeAck)> {
    let (what, partitions) = match &event {
        MemberEvent::Assigned { partitions, .. } => ("Assigned", partitions.clone()),
        MemberEvent::Revoking { partitions, .. } => ("Revoking", partitions.clone()),
        MemberEvent::Revoked { partitions } => ("Revoked", partitions.clone()),
        MemberEvent::Paused => ("Paused", BTreeSet::new()),
        MemberEvent::Resumed => ("Resumed", BTreeSet::new()),
        MemberEvent::Expired { partitions } => ("Expired", partitions.clone()),
    };
    v.record(name, what, partitions);
    match event {
        MemberEvent::Assigned { partitions, .. } => {
            for tp in partitions {
                v.epoch += 1;
                let epoch = v.epoch;
                v.since.insert((tp.clone(), name.to_owned()), epoch);
                v.held.entry(tp.clone()).or_default().insert(name.to_owned());
                v.check(&tp);
            }
        }
        MemberEvent::Revoking { partitions, ack } => {
            for tp in &partitions {
                v.held.entry(tp.clone()).or_default().remove(name);
            }
            return Some((partitions, ack));
        }
        MemberEvent::Revoked { .. } => {}
        MemberEvent::Paused => {
            v.paused.insert(name.to_owned());
        }
        MemberEvent::Resumed => {
            v.paused.remove(name);
            let mine: Vec<TopicPartition> =
                v.held.iter().filter(|(_, m)| m.contains(name)).map(|(tp, _)| tp.clone()).collect();
            mine.iter().for_each(|tp| v.check(tp));
        }
        MemberEvent::Expired { .. } => {
            v.held.values_mut().for_each(|m| {
                m.remove(name);
            });
            v.paused.remove(name);
        }
    }
    None
}

/// A group on one ensemble, its topics, and the members started so far.
#[derive(Debug)]
pub struct Group {
    pub ensemble: Ensemble,
    pub paths: KafkaPaths,
    pub group: GroupId,
    pub config: RegistryConfig,
    pub metrics: RegistryMetrics,
    pub registry: prometheus::Registry,
    pub source: Arc<FixedSource>,
    pub visible: Arc<Mutex<Visible>>,
    pub subscription: BTreeMap<Topic, u32>,
    pub partitions: TopicPartitions,
    /// How long callers take to drain a revoked partition before committing it; `None`: they
    /// neither drain nor commit.
    pub drain: Option<Duration>,
    next: usize,
}

impl Group {
    pub fn new(ensemble: Ensemble, config: RegistryConfig, subscription: BTreeMap<Topic, u32>) -> Group {
        let registry = prometheus::Registry::new();
        Group {
            ensemble,
            paths: KafkaPaths::new(None).unwrap(),
            group: GroupId::new("g").unwrap(),
            config,
            metrics: RegistryMetrics::register(&registry).unwrap(),
            registry,
            source: Arc::new(FixedSource::default()),
            visible: Arc::new(Mutex::new(Visible::default())),
            subscription,
            partitions: TopicPartitions::new(),
            drain: None,
            next: 0,
        }
    }

    /// Registers `topic` with `n` partitions the way Kafka does, at `/brokers/topics/[topic]`.
    pub async fn register_topic(&mut self, session: &Session, name: &str, n: i32) {
        let partitions: BTreeMap<Partition, Vec<_>> =
            (0..n).map(|p| (Partition::new(p).unwrap(), vec![])).collect();
        let registration = TopicRegistration { partitions: partitions.clone() };
        let path = self.paths.topic(&topic(name));
        session.ensure_path(&self.paths.brokers_topics_dir()).await.unwrap();
        match session.exists(&path).await.unwrap() {
            Some(_) => drop(session.set(&path, &registration.encode(), None).await.unwrap()),
            None => drop(
                session
                    .create(&path, &registration.encode(), cluster_state::coord::CreateMode::Persistent)
                    .await
                    .unwrap(),
            ),
        }
        self.partitions.insert(topic(name), partitions.into_keys().collect());
    }

    /// Serves `topic` with `n` partitions from the caller's partition source instead.
    pub fn source_topic(&mut self, name: &str, n: i32) {
        let partitions: BTreeSet<Partition> = (0..n).map(|p| Partition::new(p).unwrap()).collect();
        self.source.0.lock().unwrap().insert(topic(name), partitions.clone());
        self.partitions.insert(topic(name), partitions);
    }

    pub fn spec(&mut self, ensemble: Option<Ensemble>) -> (String, MemberSpec) {
        self.next += 1;
        let name = format!("m{:02}", self.next);
        let spec = MemberSpec {
            ensemble: ensemble.unwrap_or_else(|| self.ensemble.clone()),
            paths: self.paths.clone(),
            group: self.group.clone(),
            // Stable ids, like the spout's; sorted by start order.
            consumer_id: Some(ConsumerId::new(format!("g_{name}")).unwrap()),
            host: "test".into(),
            subscription: self.subscription.clone(),
            partition_source: Some(self.source.clone()),
            detached_session: true,
        };
        (name, spec)
    }

    /// Starts a member (through `ensemble`, else the group's).
    pub fn start(&mut self, ensemble: Option<Ensemble>) -> Running {
        let (name, spec) = self.spec(ensemble);
        self.start_spec(name, spec, self.config.clone())
    }

    pub fn start_spec(&self, name: String, spec: MemberSpec, config: RegistryConfig) -> Running {
        let (member, handle, events) = Member::new(spec, config, self.metrics.clone()).unwrap();
        let cancel = CancellationToken::new();
        let member = tokio::spawn(member.run(cancel.clone()));
        let offsets = handle.offsets().clone();
        let caller = spawn_caller(name.clone(), events, self.visible.clone(), offsets, self.drain);
        Running { name, handle, cancel, member, caller }
    }

    /// Kafka's range assignment for these members.
    pub fn expected(&self, members: &[&Running]) -> Assignment {
        let subs: Subscriptions =
            members.iter().map(|m| (m.consumer_id().clone(), self.subscription.clone())).collect();
        consumer_registry::range_assign(&self.partitions, &subs)
    }

    /// The metrics in Prometheus's text format.
    pub fn metrics_text(&self) -> String {
        use prometheus::Encoder as _;
        let mut out = Vec::new();
        prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// Starts the independent checker over this group's topics; see [`spawn_checker`].
    pub fn checker(&self, session: Arc<Session>, stop: CancellationToken) -> JoinHandle<usize> {
        let topics = self.partitions.clone();
        spawn_checker(session, self.paths.clone(), self.group.clone(), topics, self.visible.clone(), stop)
    }

    pub fn assert_no_violations(&self) {
        let v = self.visible.lock().unwrap();
        assert!(v.violations.is_empty(), "ownership overlapped: {:#?}", v.violations);
    }
}

/// The owner nodes in ZooKeeper: partition -> thread id.
pub async fn read_owners(
    session: &Session,
    paths: &KafkaPaths,
    group: &GroupId,
    topics: &TopicPartitions,
) -> Assignment {
    let mut owners = Assignment::new();
    for topic in topics.keys() {
        let dir = paths.owners_topic(group, topic);
        let children = match session.children(&dir).await {
            Ok(children) => children,
            Err(cluster_state::coord::Error::NoNode { .. }) => continue,
            Err(e) => panic!("reading {dir}: {e}"),
        };
        for child in children {
            let partition: Partition = child.parse().unwrap();
            match session.read::<OwnerData>(&paths.owner(group, topic, partition)).await {
                Ok((owner, _)) => drop(owners.insert(TopicPartition::new(topic.clone(), partition), owner.0)),
                Err(cluster_state::coord::Error::NoNode { .. }) => {}
                Err(e) => panic!("reading owner of {topic}/{partition}: {e}"),
            }
        }
    }
    owners
}

/// Waits until the owner nodes equal `expected` and every member's visible ownership matches.
pub async fn wait_for_assignment(session: &Session, group: &Group, members: &[&Running], deadline: Duration) {
    let expected = group.expected(members);
    assert_eq!(expected.len(), group.partitions.values().map(BTreeSet::len).sum::<usize>());
    eventually(deadline, "owners to match the range assignment", || async {
        let owners = read_owners(session, &group.paths, &group.group, &group.partitions).await;
        let visible_ok = members.iter().all(|m| {
            let mine: BTreeMap<TopicPartition, ConsumerThreadId> = expected
                .iter()
                .filter(|(_, t)| t.as_str().starts_with(m.consumer_id().as_str()))
                .map(|(a, b)| (a.clone(), b.clone()))
                .collect();
            m.handle.ownership().partitions == mine
        });
        (owners == expected && visible_ok).then_some(())
    })
    .await;
}

/// The independent checker: polls the owner nodes and the callers' view until stopped, and
/// fails if a partition's owner node changed hands without being deleted, or a caller emits
/// from a partition whose owner node names another member.
pub fn spawn_checker(
    session: Arc<Session>,
    paths: KafkaPaths,
    group: GroupId,
    topics: TopicPartitions,
    visible: Arc<Mutex<Visible>>,
    stop: CancellationToken,
) -> JoinHandle<usize> {
    tokio::spawn(async move {
        let mut polls = 0;
        while !stop.is_cancelled() {
            // Who emits before and after reading ZooKeeper: a member that emitted from a
            // partition all along, under the same assignment, must own its node throughout.
            let before = visible.lock().unwrap().emitters();
            let owners = read_owners(&session, &paths, &group, &topics).await;
            let after = visible.lock().unwrap().emitters();
            for (tp, thread) in &owners {
                for (member, epoch) in after.get(tp).into_iter().flatten() {
                    if before.get(tp).is_some_and(|b| b.contains(&(member.clone(), *epoch))) {
                        // Thread ids are `g_<member>-<n>`.
                        assert!(
                            thread.as_str().starts_with(&format!("g_{member}-")),
                            "{tp} is owned by {thread} in ZooKeeper while {member} emits from it"
                        );
                    }
                }
            }
            polls += 1;
            tokio::select! {
                () = stop.cancelled() => {}
                () = tokio::time::sleep(Duration::from_millis(25)) => {}
            }
        }
        polls
    })
}

pub fn session_options() -> SessionOptions {
    SessionOptions {
        session_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(15),
        detached: false,
    }
}

/// Conformance, on each backend: a reset written while a consumer owns a partition but is not
/// (or no longer) under `/ids` (it registered after the membership check) is refused by the
/// owner fence in the same `multi`, naming the partition, and changes nothing; once the owner
/// is gone the same plan is written and leaves no owner node behind.
pub async fn a_reset_is_fenced_by_partition_owners(session: &Session) {
    use cluster_state::coord::CreateMode;
    use consumer_registry::admin::{Admin, AdminError, ResetTo, plan};
    let paths = KafkaPaths::new(None).unwrap();
    let group = GroupId::new("fenced").unwrap();
    let clicks = topic("clicks");
    let (p0, p1) = (Partition::new(0).unwrap(), Partition::new(1).unwrap());
    session.ensure_path(&paths.ids_dir(&group)).await.unwrap();
    session.ensure_path(&paths.offsets_topic(&group, &clicks)).await.unwrap();
    session.create(&paths.offset(&group, &clicks, p0), b"40", CreateMode::Persistent).await.unwrap();
    let admin = Admin::new(session, paths.clone());
    let reset = |read: &BTreeMap<TopicPartition, consumer_registry::admin::PartitionState>| {
        let current = read.iter().map(|(tp, s)| (tp.clone(), s.committed.map(|(o, _)| o))).collect();
        let ranges = BTreeMap::from([(tp("clicks", 0), (10, 100)), (tp("clicks", 1), (0, 50))]);
        plan(&current, &ranges, &ResetTo::Earliest).unwrap()
    };

    // A consumer claimed partition 1 after the membership check (no /ids node of its own).
    session.ensure_path(&paths.owners_topic(&group, &clicks)).await.unwrap();
    let owner = ConsumerThreadId::new(&ConsumerId::new("fenced_late-1").unwrap(), 0);
    session
        .create(&paths.owner(&group, &clicks, p1), &OwnerData(owner).encode(), CreateMode::Ephemeral)
        .await
        .unwrap();
    let read = admin.read(&group, Some(&clicks)).await.unwrap();
    let err = admin.write(&group, &read, &reset(&read)).await.unwrap_err();
    assert!(
        matches!(&err, AdminError::ClaimedMeanwhile { tp: claimed, .. } if claimed == &tp("clicks", 1)),
        "{err}"
    );
    assert!(err.is_consumer_live() && !err.is_retryable(), "{err:?}");
    assert!(
        err.to_string().contains("clicks partition 1") && err.to_string().contains("nothing was changed"),
        "{err}"
    );
    let (bytes, _) = session.get(&paths.offset(&group, &clicks, p0)).await.unwrap();
    assert_eq!(bytes, b"40", "nothing written");
    assert!(session.exists(&paths.offset(&group, &clicks, p1)).await.unwrap().is_none(), "nothing created");

    // The owner is gone: the same plan is written, and the fence leaves no owner node.
    session.delete(&paths.owner(&group, &clicks, p1), None).await.unwrap();
    let read = admin.read(&group, Some(&clicks)).await.unwrap();
    let joined = admin.write(&group, &read, &reset(&read)).await.unwrap();
    assert!(joined.is_empty(), "{joined:?}");
    assert_eq!(session.get(&paths.offset(&group, &clicks, p0)).await.unwrap().0, b"10");
    assert_eq!(session.get(&paths.offset(&group, &clicks, p1)).await.unwrap().0, b"0");
    assert!(session.children(&paths.owners_topic(&group, &clicks)).await.unwrap().is_empty());

    // A registered member is refused before anything is tried.
    session
        .create(&paths.id(&group, &ConsumerId::new("fenced_live-1").unwrap()), b"{}", CreateMode::Ephemeral)
        .await
        .unwrap();
    let read = admin.read(&group, Some(&clicks)).await.unwrap();
    let err = admin.write(&group, &read, &reset(&read)).await.unwrap_err();
    assert!(matches!(err, AdminError::LiveMembers { .. }) && err.is_consumer_live(), "{err}");
}
