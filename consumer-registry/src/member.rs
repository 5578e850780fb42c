//! One member of a consumer group: an actor that keeps its registration, watches the group and
//! the topic metadata, and moves owner nodes to match the assignment, telling its caller.
//!
//! Never two consumers of one partition:
//! - Hand-off: a member gives a partition up only after its caller stopped, drained, committed
//!   and acknowledged ([`MemberEvent::Revoking`]); only then is the owner node deleted. The next
//!   owner claims it with a checked ephemeral create (KAFKA-1387: "node exists" is ours only if
//!   our session holds it with our data) and, while it is still held, watches it go.
//! - Session loss: the [`Lease`] is the fence (see `lease.rs` for the rule and its timing
//!   argument). The caller emits from a partition only while the lease of the session that
//!   claimed it is fresh: the server confirmed the session less than 2/3 of its timeout ago, on
//!   a clock that keeps running while the process is stopped. A [`Keeper`] task renews it and
//!   re-validates ownership after it ran out. [`MemberEvent::Paused`] on a disconnect stops the
//!   caller earlier still. The member waits for the server's verdict on a disconnected session
//!   (a restarted ZooKeeper restores sessions): once the server says it is gone, the member
//!   reports [`MemberEvent::Expired`], then registers again with a new session.
//!
//! Reconcile, don't count: every watch, tick or reconnect schedules one rebalance (bursts
//! within `rebalance_coalesce_ms` become one) that re-reads the group and diffs it with what
//! the member holds. Watches are re-armed only when they fired, so at most one is pending per
//! path. Other members' registrations are cached by consumer id while the id stays in the group:
//! a member writes its registration once per session and never changes it in place.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cluster_state::coord::{
    self, Ensemble, SessionEvent, SessionId, SessionOptions, SessionState, StateChanges, WatchEvent,
};
use cluster_state::ids::{ConsumerId, ConsumerThreadId, GroupId, Partition, Topic};
use cluster_state::paths::KafkaPaths;
use cluster_state::znode::{ConsumerRegistration, SubscriptionPattern, TopicRegistration, ZnodeData};
use futures::FutureExt as _;
use futures::future::{BoxFuture, join_all};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::assign::{TopicPartition, TopicPartitions, assign, assigned_to, ownership_diff};
use crate::config::RegistryConfig;
use crate::error::{Error, Result};
use crate::lease::{Keeper, Lease};
use crate::metrics::RegistryMetrics;
use crate::offsets::OffsetStore;
use crate::zk::Zk;

/// Room in the event channel; a caller that stops reading holds the member back.
const EVENT_CAPACITY: usize = 64;
/// First retry delay after a failed rebalance or connect; doubles up to `rebalance_backoff_ms`.
const FIRST_RETRY: Duration = Duration::from_millis(50);

/// What a [`PartitionSource`] answers: the topic's partitions, `None` if it does not exist.
pub type SourcedPartitions =
    std::result::Result<Option<BTreeSet<Partition>>, Box<dyn std::error::Error + Send + Sync>>;

/// Partition counts for topics that no Kafka cluster registers in this ZooKeeper (the spout
/// feeds it from Kafka's metadata API).
pub trait PartitionSource: Send + Sync + fmt::Debug {
    /// The partitions of `topic`, `None` if the topic does not exist.
    fn partitions<'a>(&'a self, topic: &'a Topic) -> BoxFuture<'a, SourcedPartitions>;
}

/// Who the member is and what it consumes.
#[derive(Debug, Clone)]
pub struct MemberSpec {
    pub ensemble: Ensemble,
    /// Kafka's registry layout (chroot).
    pub paths: KafkaPaths,
    pub group: GroupId,
    /// A stable id chosen by the caller, or `None` for Kafka's `group_host-millis-uuid8`.
    pub consumer_id: Option<ConsumerId>,
    /// The host name that goes into a generated consumer id.
    pub host: String,
    /// Topic -> number of consumer threads (Kafka's streams).
    pub subscription: BTreeMap<Topic, u32>,
    /// Used for subscribed topics without `/brokers/topics/[topic]`.
    pub partition_source: Option<Arc<dyn PartitionSource>>,
    /// Keep the session alive, until it times out, if the member is dropped without running
    /// to its end: what a killed process leaves behind (tests use it to simulate a crash).
    pub detached_session: bool,
}

/// What the caller must act on, in order.
#[derive(Debug)]
pub enum MemberEvent {
    /// These partitions are now ours, claimed in `session`: start consuming (unless paused).
    /// Emit from them only while [`Lease::valid_session`] is `session`.
    Assigned { partitions: BTreeSet<TopicPartition>, session: SessionId },
    /// These partitions are being given up: stop emitting from them, drain in-flight tuples,
    /// commit, then acknowledge. Their owner nodes stay until then (or `revoke_timeout_ms`).
    /// May repeat for partitions already stopped (after a reconnect): acknowledge again.
    Revoking { partitions: BTreeSet<TopicPartition>, ack: RevokeAck },
    /// The owner nodes of these (acknowledged) partitions are deleted.
    Revoked { partitions: BTreeSet<TopicPartition> },
    /// The session is disconnected: emit nothing from any partition, including ones assigned
    /// while paused, until [`MemberEvent::Resumed`] or [`MemberEvent::Expired`].
    Paused,
    /// The session is connected again; ownership is as before the pause.
    Resumed,
    /// The session ended: these partitions are no longer ours (others may own them now); do
    /// not commit them. Also ends a pause. The member registers again with a new session.
    Expired { partitions: BTreeSet<TopicPartition> },
}

/// Acknowledges a [`MemberEvent::Revoking`]; dropping it unacknowledged counts as an ack.
#[derive(Debug)]
pub struct RevokeAck(oneshot::Sender<()>);

impl RevokeAck {
    /// The partitions are stopped, drained and committed.
    pub fn ack(self) {
        // The member may have stopped waiting (session lost); nothing to tell then.
        let _ = self.0.send(());
    }
}

/// What the member holds now, as its caller may act on it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ownership {
    /// The session the ownership belongs to; `None` between sessions and after the member stopped.
    pub session: Option<SessionId>,
    /// Disconnected: nothing may be emitted.
    pub paused: bool,
    /// Partitions whose owner node we hold and whose caller has not been told to stop.
    pub partitions: BTreeMap<TopicPartition, ConsumerThreadId>,
}

/// The caller's side of a running member: its id, its ownership, its offsets.
#[derive(Debug, Clone)]
pub struct MemberHandle {
    group: GroupId,
    consumer_id: ConsumerId,
    ownership: watch::Receiver<Ownership>,
    offsets: OffsetStore,
    lease: Lease,
}

impl MemberHandle {
    pub fn group(&self) -> &GroupId {
        &self.group
    }

    pub fn consumer_id(&self) -> &ConsumerId {
        &self.consumer_id
    }

    /// The current ownership.
    pub fn ownership(&self) -> Ownership {
        self.ownership.borrow().clone()
    }

    /// Ownership as it changes.
    pub fn watch_ownership(&self) -> watch::Receiver<Ownership> {
        self.ownership.clone()
    }

    /// The group's committed offsets, through this member's session.
    pub fn offsets(&self) -> &OffsetStore {
        &self.offsets
    }

    /// The ownership lease: check it before emitting (once per batch).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }
}

/// The watches a member keeps armed, one each at most.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum WatchKey {
    Members,
    Brokers,
    Topic(Topic),
}

/// Why a rebalance (or registration) stopped early.
enum Halt {
    Cancelled,
    /// A session event arrived (kept in `pending_state`), or there is no session.
    Session,
    Zk(coord::Error),
    Failed(Error),
}

impl From<coord::Error> for Halt {
    fn from(e: coord::Error) -> Self {
        Halt::Zk(e)
    }
}

enum Waited<T> {
    Done(T),
    /// A membership or metadata watch fired meanwhile.
    ViewChanged,
}

/// The actor. Build it with [`Member::new`], then drive it with [`Member::run`].
pub struct Member {
    spec: MemberSpec,
    config: RegistryConfig,
    metrics: RegistryMetrics,
    consumer_id: ConsumerId,
    session_options: SessionOptions,

    zk: Option<Zk>,
    states: Option<StateChanges>,
    state: SessionState,
    pending_state: Option<SessionEvent>,
    /// The registration bytes of the current session (a retried create must write the same).
    registration: Vec<u8>,

    watches: FuturesUnordered<BoxFuture<'static, WatchKey>>,
    armed: HashSet<WatchKey>,
    registrations: HashMap<String, BTreeMap<Topic, u32>>,
    topic_partitions: TopicPartitions,
    refresh_source: bool,

    owned: BTreeMap<TopicPartition, ConsumerThreadId>,
    /// Partitions whose owner node may be ours although we do not count them owned (a create or
    /// delete whose reply was lost).
    uncertain: BTreeSet<TopicPartition>,
    paused: bool,
    owned_gauge: BTreeMap<Topic, i64>,

    due: Option<Instant>,
    first_trigger: Option<Instant>,
    check_orphans: bool,
    retry_delay: Duration,

    events: mpsc::Sender<MemberEvent>,
    ownership: watch::Sender<Ownership>,
    offsets: OffsetStore,

    lease: Lease,
    /// The current session's lease keeper; cancelled when the session is replaced or left.
    keeper: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
    /// Sessions a keeper found no longer holding our owner nodes (sender given to keepers).
    distrusted: mpsc::Receiver<SessionId>,
    distrust: mpsc::Sender<SessionId>,
}

impl fmt::Debug for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Member")
            .field("group", &self.spec.group)
            .field("consumer_id", &self.consumer_id)
            .field("owned", &self.owned.len())
            .finish_non_exhaustive()
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Member {
    /// Validates the config and builds the member, its handle and its event stream.
    pub fn new(
        spec: MemberSpec,
        config: RegistryConfig,
        metrics: RegistryMetrics,
    ) -> Result<(Member, MemberHandle, mpsc::Receiver<MemberEvent>)> {
        config.validate()?;
        let consumer_id = match &spec.consumer_id {
            Some(id) => id.clone(),
            None => {
                let uuid = uuid::Uuid::new_v4().simple().to_string();
                ConsumerId::generate(&spec.group, &spec.host, now_ms(), &uuid[..8])?
            }
        };
        let mut session_options = config.session_options();
        session_options.detached = spec.detached_session;
        let offsets = OffsetStore::new(
            spec.group.clone(),
            consumer_id.to_string(),
            spec.paths.clone(),
            config.auto_offset_reset,
            config.reset_on_corrupt_offset,
            metrics.clone(),
        );
        let (events, events_rx) = mpsc::channel(EVENT_CAPACITY);
        let (ownership, ownership_rx) = watch::channel(Ownership::default());
        let lease = Lease::default();
        let handle = MemberHandle {
            group: spec.group.clone(),
            consumer_id: consumer_id.clone(),
            ownership: ownership_rx,
            offsets: offsets.clone(),
            lease: lease.clone(),
        };
        let (distrust, distrusted) = mpsc::channel(1);
        let member = Member {
            spec,
            config,
            metrics,
            consumer_id,
            session_options,
            zk: None,
            states: None,
            state: SessionState::Closed,
            pending_state: None,
            registration: Vec::new(),
            watches: FuturesUnordered::new(),
            armed: HashSet::new(),
            registrations: HashMap::new(),
            topic_partitions: TopicPartitions::new(),
            refresh_source: true,
            owned: BTreeMap::new(),
            uncertain: BTreeSet::new(),
            paused: false,
            owned_gauge: BTreeMap::new(),
            due: None,
            first_trigger: None,
            check_orphans: false,
            retry_delay: FIRST_RETRY,
            events,
            ownership,
            offsets,
            lease,
            keeper: None,
            distrusted,
            distrust,
        };
        Ok((member, handle, events_rx))
    }

    /// Joins the group and follows it until `cancel`, then leaves cleanly: the caller is asked
    /// to give everything up, owner and id nodes are deleted, the session is closed. Dropping
    /// the future instead is a crash: the session's nodes stay until it times out (if detached).
    pub async fn run(mut self, cancel: CancellationToken) -> Result<()> {
        let group = self.spec.group.clone();
        tracing::info!(%group, consumer = %self.consumer_id, "joining consumer group");
        match self.open_session(&cancel).await {
            Ok(()) | Err(Halt::Session) => {}
            Err(Halt::Cancelled) => return Ok(()),
            Err(halt) => {
                return Err(self
                    .error(halt)
                    .unwrap_or(Error::Stopped { group, consumer: self.consumer_id.to_string() }));
            }
        }
        let period = Duration::from_millis(self.config.reconcile_interval_ms);
        let mut reconcile = tokio::time::interval_at(Instant::now() + period, period);
        reconcile.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let period = Duration::from_millis(self.config.partition_refresh_interval_ms);
        let mut refresh = tokio::time::interval_at(Instant::now() + period, period);
        refresh.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let has_source = self.spec.partition_source.is_some();
        loop {
            if let Some(event) = self.pending_state.take() {
                match self.on_session_event(event, &cancel).await {
                    Ok(()) | Err(Halt::Session) => continue,
                    Err(Halt::Cancelled) => break,
                    Err(halt) => {
                        let e = self.error(halt);
                        self.leave().await;
                        return e.map_or(Ok(()), Err);
                    }
                }
            }
            let due = self.due;
            let connected = self.state == SessionState::Connected;
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                Some(event) = next_state(&mut self.states) => self.pending_state = Some(event),
                Some(session_id) = self.distrusted.recv() => self.distrust_session(session_id),
                Some(key) = self.watches.next() => {
                    self.armed.remove(&key);
                    self.schedule(Duration::from_millis(self.config.rebalance_coalesce_ms));
                }
                _ = reconcile.tick() => {
                    self.check_orphans = true;
                    self.schedule(Duration::ZERO);
                }
                _ = refresh.tick(), if has_source => {
                    self.refresh_source = true;
                    self.schedule(Duration::ZERO);
                }
                () = sleep_until(due), if due.is_some() && connected => {
                    self.due = None;
                    self.rebalance(&cancel).await;
                }
            }
        }
        self.leave().await;
        Ok(())
    }

    /// A keeper found owner nodes of `session_id` no longer ours: treat the session as ended
    /// (its lease already is), so everything is claimed again in a new one.
    fn distrust_session(&mut self, session_id: SessionId) {
        if self.zk.as_ref().is_some_and(|zk| zk.session.id() == session_id) {
            // Closed, not Expired: the session lives, so resuming it must not be tried.
            self.pending_state = Some(SessionEvent { session_id, state: SessionState::Closed });
        }
    }

    /// Asks for a rebalance `after` from now, unless one is due sooner.
    fn schedule(&mut self, after: Duration) {
        let at = Instant::now() + after;
        self.first_trigger.get_or_insert_with(Instant::now);
        if self.due.is_none_or(|due| at < due) {
            self.due = Some(at);
        }
    }

    fn zk(&self) -> std::result::Result<Zk, Halt> {
        self.zk.clone().ok_or(Halt::Session)
    }

    /// The error behind a halt, naming our group; `None` for interruptions.
    fn error(&self, halt: Halt) -> Option<Error> {
        match halt {
            Halt::Zk(source) => Some(Error::Coordination { group: self.spec.group.clone(), source }),
            Halt::Failed(e) => Some(e),
            Halt::Cancelled | Halt::Session => None,
        }
    }

    /// Waits for `fut`, unless the session changes state, `cancel` fires, or (when
    /// `view_changes`) a membership or metadata watch fires.
    async fn wait<T>(
        &mut self,
        fut: impl Future<Output = T>,
        cancel: Option<&CancellationToken>,
        view_changes: bool,
    ) -> std::result::Result<Waited<T>, Halt> {
        let cancelled = async {
            match cancel {
                Some(cancel) => cancel.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = cancelled => Err(Halt::Cancelled),
            Some(event) = next_state(&mut self.states) => {
                self.pending_state = Some(event);
                Err(Halt::Session)
            }
            Some(session_id) = self.distrusted.recv() => {
                self.distrust_session(session_id);
                Err(Halt::Session)
            }
            Some(key) = self.watches.next(), if view_changes => {
                self.armed.remove(&key);
                Ok(Waited::ViewChanged)
            }
            out = fut => Ok(Waited::Done(out)),
        }
    }

    async fn send(
        &mut self,
        event: MemberEvent,
        cancel: Option<&CancellationToken>,
    ) -> std::result::Result<(), Halt> {
        let events = self.events.clone();
        // A caller that dropped its receiver does not care; keep the group's bookkeeping going.
        self.wait(async move { events.send(event).await.ok() }, cancel, false).await.map(|_| ())
    }

    fn publish(&mut self) {
        let ownership = Ownership {
            session: self.zk.as_ref().map(|zk| zk.session.id()),
            paused: self.paused,
            partitions: self.owned.clone(),
        };
        self.ownership.send_replace(ownership);
        let mut counts: BTreeMap<Topic, i64> =
            self.spec.subscription.keys().map(|t| (t.clone(), 0)).collect();
        for tp in self.owned.keys() {
            *counts.entry(tp.topic.clone()).or_default() += 1;
        }
        for (topic, count) in counts {
            let before = self.owned_gauge.insert(topic.clone(), count).unwrap_or(0);
            if count != before {
                let gauge = self
                    .metrics
                    .owned_partitions
                    .with_label_values(&[self.spec.group.as_str(), topic.as_str()]);
                gauge.add(count - before);
            }
        }
    }

    fn set_state(&mut self, state: SessionState) {
        self.metrics.session_changed(self.spec.group.as_str(), self.state, state);
        self.state = state;
    }

    /// Connects a new session and registers the consumer id, retrying until it works, the
    /// session changes state, or `cancel`.
    async fn open_session(&mut self, cancel: &CancellationToken) -> std::result::Result<(), Halt> {
        let group = self.spec.group.clone();
        let mut delay = FIRST_RETRY;
        loop {
            let zk = match self.zk.clone() {
                Some(zk) => Some(zk),
                None => match self.spec.ensemble.connect(&self.session_options).await {
                    Ok(session) => Some(self.adopt(session)),
                    Err(e) if e.is_retryable() => {
                        tracing::warn!(%group, error = %e, "cannot connect to ZooKeeper; retrying");
                        None
                    }
                    Err(e) => return Err(e.into()),
                },
            };
            if let Some(zk) = zk {
                match self.register(&zk, cancel).await {
                    Ok(()) => {
                        self.schedule(Duration::ZERO);
                        return Ok(());
                    }
                    Err(Halt::Zk(e)) if e.is_session_lost() => {
                        tracing::warn!(%group, error = %e, "session lost while registering; starting a new one");
                        self.set_state(SessionState::Expired);
                        self.drop_session();
                    }
                    Err(Halt::Zk(e)) if e.is_retryable() => {
                        tracing::warn!(%group, error = %e, "registering the consumer failed; retrying");
                    }
                    Err(halt) => return Err(halt),
                }
            }
            tokio::select! {
                () = cancel.cancelled() => return Err(Halt::Cancelled),
                () = tokio::time::sleep(delay) => delay = (delay * 2).min(self.config.backoff()),
            }
        }
    }

    /// Forgets the current session: its lease ends first, then its keeper stops.
    fn drop_session(&mut self) {
        self.lease.end();
        if let Some((cancel, _)) = self.keeper.take() {
            cancel.cancel();
        }
        self.zk = None;
        self.states = None;
        self.offsets.set_session(None);
    }

    /// Makes `session` the member's session.
    fn adopt(&mut self, session: coord::Session) -> Zk {
        let ops = self.metrics.zk_ops.with_label_values(&[self.spec.group.as_str()]);
        let zk = Zk::new(session, ops);
        self.lease.begin(zk.session.id());
        self.states = Some(zk.session.state_changes());
        self.set_state(zk.session.state());
        self.zk = Some(zk.clone());
        self.offsets.set_session(Some(zk.clone()));
        self.watches = FuturesUnordered::new();
        self.armed.clear();
        self.registrations.clear();
        // Fixed for the session's life: a create retried after a lost reply must write the
        // same bytes to be recognised as ours.
        let registration = ConsumerRegistration {
            subscription: self.spec.subscription.iter().map(|(t, n)| (t.to_string(), *n)).collect(),
            pattern: SubscriptionPattern::Static,
            timestamp_ms: now_ms(),
        };
        self.registration = registration.encode();
        self.publish();
        let keeper = Keeper {
            zk: zk.clone(),
            lease: self.lease.clone(),
            paths: self.spec.paths.clone(),
            group: self.spec.group.clone(),
            id_path: self.spec.paths.id(&self.spec.group, &self.consumer_id),
            ownership: self.ownership.subscribe(),
            distrust: self.distrust.clone(),
        };
        let cancel = CancellationToken::new();
        let task = tokio::spawn(keeper.run(cancel.clone()));
        if let Some((previous, _)) = self.keeper.replace((cancel, task)) {
            previous.cancel();
        }
        zk
    }

    /// Writes `/consumers/[group]/ids/[consumer_id]`. A node left by our previous session
    /// (same id, not yet expired) is waited out, like Kafka does, for a bounded time.
    async fn register(&mut self, zk: &Zk, cancel: &CancellationToken) -> std::result::Result<(), Halt> {
        let path = self.spec.paths.id(&self.spec.group, &self.consumer_id);
        self.create_registration(zk, &path, cancel).await
    }

    async fn create_registration(
        &mut self,
        zk: &Zk,
        path: &str,
        cancel: &CancellationToken,
    ) -> std::result::Result<(), Halt> {
        // An old session's node goes within its session timeout; give it two.
        let give_up = Instant::now() + 2 * self.session_options.session_timeout + self.config.backoff();
        loop {
            let data = self.registration.clone();
            match zk.create_ephemeral_checked(path, &data).await {
                Ok(_) => return Ok(()),
                Err(coord::Error::HeldByOther { owner, .. }) if Instant::now() < give_up => {
                    tracing::warn!(group = %self.spec.group, %path, %owner, "consumer id still registered by an older session; waiting for it to go");
                    let (exists, gone) = zk.exists_watch(path).await?;
                    if exists.is_some() {
                        let wait = tokio::time::timeout(self.config.backoff(), gone);
                        self.wait(wait, Some(cancel), false).await?;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    async fn on_session_event(
        &mut self,
        event: SessionEvent,
        cancel: &CancellationToken,
    ) -> std::result::Result<(), Halt> {
        if self.zk.as_ref().is_none_or(|zk| zk.session.id() != event.session_id) {
            return Ok(()); // from a session we already replaced
        }
        self.set_state(event.state);
        let group = self.spec.group.clone();
        match event.state {
            SessionState::Disconnected => {
                tracing::warn!(%group, consumer = %self.consumer_id, "ZooKeeper disconnected; pausing until it answers again");
                if !self.paused {
                    self.paused = true;
                    self.publish();
                    self.send(MemberEvent::Paused, Some(cancel)).await?;
                }
            }
            // Watches may have been missed while away: re-read everything.
            SessionState::Connected => self.reconnected(cancel).await?,
            SessionState::Expired if self.resume_session(cancel).await? => {}
            SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => {
                tracing::warn!(%group, consumer = %self.consumer_id, state = ?event.state, "ZooKeeper session ended; re-registering");
                let lost: BTreeSet<TopicPartition> = std::mem::take(&mut self.owned).into_keys().collect();
                self.uncertain.clear();
                self.offsets.forget(&lost);
                self.drop_session();
                self.paused = false;
                self.publish();
                self.send(MemberEvent::Expired { partitions: lost }, Some(cancel)).await?;
                self.open_session(cancel).await?;
            }
        }
        Ok(())
    }

    /// Connected again (or resumed): the pause ends, and everything is re-read, since watches
    /// may have been missed meanwhile.
    async fn reconnected(&mut self, cancel: &CancellationToken) -> std::result::Result<(), Halt> {
        if self.paused {
            self.paused = false;
            self.publish();
            self.send(MemberEvent::Resumed, Some(cancel)).await?;
        }
        self.check_orphans = true;
        self.schedule(Duration::ZERO);
        Ok(())
    }

    /// The client library reports a session expired when it could not reconnect within 7/5 of
    /// the session timeout, but a ZooKeeper ensemble that was down (restarted) restores its
    /// sessions with fresh timeouts: ask the server. If it still holds ours, carry on with it:
    /// owner nodes and registration are still ours (the keeper re-validates them before the
    /// lease lets anything be emitted). Returns whether the session was resumed.
    async fn resume_session(&mut self, cancel: &CancellationToken) -> std::result::Result<bool, Halt> {
        let Some(zk) = &self.zk else { return Ok(false) };
        self.lease.end();
        let credentials = zk.session.credentials();
        let resumed = tokio::select! {
            () = cancel.cancelled() => return Err(Halt::Cancelled),
            resumed = self.spec.ensemble.resume(&credentials, &self.session_options) => resumed,
        };
        match resumed {
            Ok(session) => {
                tracing::info!(group = %self.spec.group, consumer = %self.consumer_id, session = %session.id(), "the server still holds our session (restored after a ZooKeeper restart); resuming it");
                let registration = std::mem::take(&mut self.registration);
                self.adopt(session);
                // The registration node holds the bytes written when the session began.
                self.registration = registration;
                // Watches belonged to the old client: re-read everything.
                self.reconnected(cancel).await?;
                Ok(true)
            }
            Err(e) => {
                tracing::debug!(group = %self.spec.group, error = %e, "the session is gone at the server too");
                Ok(false)
            }
        }
    }

    /// One reconcile: re-read, decide, hand off. Errors that a retry can fix are retried after
    /// a backoff; others are logged and wait for the next change.
    async fn rebalance(&mut self, cancel: &CancellationToken) {
        let group = self.spec.group.clone();
        match self.try_rebalance(cancel).await {
            Ok(changed) => {
                self.retry_delay = FIRST_RETRY;
                let first = self.first_trigger.take();
                if let Some(first) = first
                    && changed
                {
                    self.metrics.rebalances.with_label_values(&[group.as_str()]).inc();
                    let seconds = first.elapsed().as_secs_f64();
                    self.metrics.rebalance_duration.with_label_values(&[group.as_str()]).observe(seconds);
                }
            }
            Err(halt) => {
                let Some(e) = self.error(halt) else { return };
                if self.zk.as_ref().is_none_or(|zk| zk.session.state() != SessionState::Connected) {
                    // A disconnect, not a failure: reconnecting schedules a fresh rebalance.
                    tracing::info!(%group, consumer = %self.consumer_id, error = %e, "rebalance interrupted by a ZooKeeper disconnect; it runs again once connected");
                } else if e.is_retryable() {
                    tracing::warn!(%group, error = %e, "rebalance failed; retrying");
                    self.schedule(self.retry_delay);
                    self.retry_delay = (self.retry_delay * 2).min(self.config.backoff());
                } else {
                    tracing::error!(%group, error = %e, "rebalance failed; waiting for the group to change");
                }
            }
        }
    }

    /// Returns whether anything was released or claimed.
    async fn try_rebalance(&mut self, cancel: &CancellationToken) -> std::result::Result<bool, Halt> {
        let zk = self.zk()?;
        let subscriptions = self.read_members(&zk, cancel).await?;
        let partitions = self.read_partitions(&zk).await?;
        let assignment = assign(self.config.partition_assignment_strategy, &partitions, &subscriptions)
            .map_err(|source| Halt::Failed(Error::Assignment { group: self.spec.group.clone(), source }))?;
        let desired = assigned_to(&assignment, &self.consumer_id);
        let lost = if std::mem::take(&mut self.check_orphans) {
            self.check_owners(&zk, &partitions).await?
        } else {
            BTreeSet::new()
        };
        self.drop_uncertain(&zk, &desired).await?;
        let diff = ownership_diff(&self.owned, &desired, &lost);
        if diff.is_empty() {
            return Ok(false);
        }
        tracing::debug!(group = %self.spec.group, consumer = %self.consumer_id, release = diff.release.len(), claim = diff.claim.len(), "rebalancing");
        self.release(&zk, diff.release, Some(cancel)).await?;
        self.claim(&zk, diff.claim, cancel).await?;
        Ok(true)
    }

    /// The group's subscriptions, re-registering ourselves if our node is gone.
    async fn read_members(
        &mut self,
        zk: &Zk,
        cancel: &CancellationToken,
    ) -> std::result::Result<crate::assign::Subscriptions, Halt> {
        let dir = self.spec.paths.ids_dir(&self.spec.group);
        let ids = if self.armed.contains(&WatchKey::Members) {
            zk.children(&dir).await?
        } else {
            let (ids, watch) = zk.children_watch(&dir).await?;
            self.arm(WatchKey::Members, watch);
            ids
        };
        if !ids.iter().any(|id| id == self.consumer_id.as_str()) {
            tracing::warn!(group = %self.spec.group, consumer = %self.consumer_id, "our registration is gone; registering again");
            let path = self.spec.paths.id(&self.spec.group, &self.consumer_id);
            self.create_registration(zk, &path, cancel).await?;
        }
        self.registrations.retain(|id, _| ids.contains(id));
        let missing: Vec<&String> = ids
            .iter()
            .filter(|id| *id != self.consumer_id.as_str() && !self.registrations.contains_key(*id))
            .collect();
        let reads = missing.iter().map(|id| {
            let path = coord::join(&dir, id);
            async move { (id, zk.read::<ConsumerRegistration>(&path).await) }
        });
        for (id, read) in join_all(reads).await {
            match read {
                Ok((registration, _)) if registration.pattern == SubscriptionPattern::Static => {
                    let topics = registration
                        .subscription
                        .iter()
                        .filter_map(|(t, n)| Topic::new(t.as_str()).ok().map(|t| (t, *n)))
                        .collect();
                    self.registrations.insert((*id).clone(), topics);
                }
                Ok((registration, _)) => {
                    // Wildcard subscriptions need the topic list and the same filter on every
                    // member; Squall members never register them.
                    tracing::warn!(group = %self.spec.group, member = %id, pattern = registration.pattern.as_str(), "ignoring a member with a wildcard subscription");
                }
                Err(coord::Error::NoNode { .. }) => {} // left meanwhile; its watch event follows
                Err(coord::Error::Decode(e)) => {
                    tracing::warn!(group = %self.spec.group, member = %id, error = %e, "ignoring a member with a garbage registration");
                }
                Err(e) => return Err(e.into()),
            }
        }
        let mut subscriptions: crate::assign::Subscriptions = self
            .registrations
            .iter()
            .filter_map(|(id, topics)| ConsumerId::new(id.as_str()).ok().map(|id| (id, topics.clone())))
            .collect();
        subscriptions.insert(self.consumer_id.clone(), self.spec.subscription.clone());
        Ok(subscriptions)
    }

    fn arm(&mut self, key: WatchKey, watch: coord::Watch) {
        self.armed.insert(key.clone());
        self.watches.push(Box::pin(async move {
            let _: WatchEvent = watch.await;
            key
        }));
    }

    /// The partitions of each subscribed topic: from `/brokers/topics/[topic]` when Kafka
    /// registers it there (watched), else from the caller's source.
    async fn read_partitions(&mut self, zk: &Zk) -> std::result::Result<TopicPartitions, Halt> {
        if !self.armed.contains(&WatchKey::Brokers) {
            // Broker changes re-trigger a rebalance, as in Kafka; the partition sets come from
            // the topics below.
            let dir = self.spec.paths.brokers_ids_dir();
            match zk.children_watch(&dir).await {
                Ok((_, watch)) => self.arm(WatchKey::Brokers, watch),
                Err(coord::Error::NoNode { .. }) => {
                    let (_, watch) = zk.exists_watch(&dir).await?;
                    self.arm(WatchKey::Brokers, watch);
                }
                Err(e) => return Err(e.into()),
            }
        }
        let refresh = std::mem::take(&mut self.refresh_source);
        let topics: Vec<Topic> = self.spec.subscription.keys().cloned().collect();
        for topic in topics {
            let key = WatchKey::Topic(topic.clone());
            if self.armed.contains(&key) && self.topic_partitions.contains_key(&topic) && !refresh {
                continue;
            }
            let path = self.spec.paths.topic(&topic);
            let registered = if self.armed.contains(&key) {
                match zk.read::<TopicRegistration>(&path).await {
                    Ok((registration, _)) => Some(registration),
                    Err(coord::Error::NoNode { .. }) => None,
                    Err(coord::Error::Decode(e)) => {
                        self.unreadable_topic(&topic, &e);
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                }
            } else {
                match zk.read_watch::<TopicRegistration>(&path).await {
                    Ok((registration, _, watch)) => {
                        self.arm(key, watch);
                        Some(registration)
                    }
                    Err(coord::Error::NoNode { .. }) => {
                        // Watch for Kafka registering it; if that happened just now, the watch
                        // fires and the next rebalance reads it.
                        let (_, watch) = zk.exists_watch(&path).await?;
                        self.arm(key, watch);
                        None
                    }
                    Err(coord::Error::Decode(e)) => {
                        self.unreadable_topic(&topic, &e);
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            match registered {
                Some(registration) => {
                    self.topic_partitions.insert(topic, registration.partitions().collect());
                }
                None => self.ask_source(&topic).await,
            }
        }
        Ok(self.topic_partitions.clone())
    }

    /// A garbage topic registration keeps the partitions we knew (and is read again on the next
    /// rebalance, since its watch is not armed).
    fn unreadable_topic(&self, topic: &Topic, e: &cluster_state::znode::DecodeError) {
        tracing::warn!(group = %self.spec.group, %topic, error = %e, "unreadable topic registration; keeping the partitions known before");
    }

    async fn ask_source(&mut self, topic: &Topic) {
        let Some(source) = self.spec.partition_source.clone() else {
            self.topic_partitions.remove(topic);
            return;
        };
        // A hung metadata call must not stall the group's bookkeeping.
        let answer = tokio::time::timeout(self.config.backoff(), source.partitions(topic)).await;
        match answer.unwrap_or_else(|_| Err("no answer within rebalance_backoff_ms".into())) {
            Ok(Some(partitions)) => {
                self.topic_partitions.insert(topic.clone(), partitions);
            }
            Ok(None) => {
                self.topic_partitions.remove(topic);
            }
            Err(e) => {
                tracing::warn!(group = %self.spec.group, %topic, error = %e, "partition source failed; keeping the partitions known before");
            }
        }
    }

    /// The periodic check: counts partitions without an owner node, and returns the owned
    /// partitions whose node vanished under us.
    async fn check_owners(
        &mut self,
        zk: &Zk,
        partitions: &TopicPartitions,
    ) -> std::result::Result<BTreeSet<TopicPartition>, Halt> {
        let mut lost = BTreeSet::new();
        for (topic, parts) in partitions.iter().filter(|(t, _)| self.spec.subscription.contains_key(*t)) {
            let dir = self.spec.paths.owners_topic(&self.spec.group, topic);
            let owners: BTreeSet<String> = match zk.children(&dir).await {
                Ok(owners) => owners.into_iter().collect(),
                Err(coord::Error::NoNode { .. }) => BTreeSet::new(),
                Err(e) => return Err(e.into()),
            };
            let orphans = parts.iter().filter(|p| !owners.contains(&p.to_string())).count();
            if orphans > 0 {
                tracing::info!(group = %self.spec.group, %topic, orphans, "partitions without an owner");
                let counter = self
                    .metrics
                    .orphaned_partitions
                    .with_label_values(&[self.spec.group.as_str(), topic.as_str()]);
                counter.inc_by(u64::try_from(orphans).unwrap_or(u64::MAX));
            }
            lost.extend(
                self.owned
                    .keys()
                    .filter(|tp| &tp.topic == topic && !owners.contains(&tp.partition.to_string()))
                    .cloned(),
            );
        }
        if !lost.is_empty() {
            tracing::warn!(group = %self.spec.group, lost = lost.len(), "owner nodes vanished under us");
        }
        Ok(lost)
    }

    /// Deletes owner nodes that may be ours after a lost reply, unless we want them: those are
    /// claimed again (and found ours) by the claim.
    async fn drop_uncertain(
        &mut self,
        zk: &Zk,
        desired: &BTreeMap<TopicPartition, ConsumerThreadId>,
    ) -> std::result::Result<(), Halt> {
        let stale: Vec<TopicPartition> =
            self.uncertain.iter().filter(|tp| !desired.contains_key(*tp)).cloned().collect();
        let session = zk.session.id();
        for tp in stale {
            let path = self.spec.paths.owner(&self.spec.group, &tp.topic, tp.partition);
            match zk.get(&path).await {
                Ok((_, stat)) if stat.ephemeral_owner == Some(session) => {
                    match zk.delete(&path, Some(stat.version)).await {
                        Ok(()) | Err(coord::Error::NoNode { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(_) | Err(coord::Error::NoNode { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            self.uncertain.remove(&tp);
        }
        self.uncertain.retain(|tp| desired.contains_key(tp));
        Ok(())
    }

    /// The ordered hand-off of `partitions`: tell the caller, wait for its ack (bounded), stop
    /// counting them ours, delete their owner nodes.
    async fn release(
        &mut self,
        zk: &Zk,
        partitions: BTreeSet<TopicPartition>,
        cancel: Option<&CancellationToken>,
    ) -> std::result::Result<(), Halt> {
        if partitions.is_empty() {
            return Ok(());
        }
        let (ack, acked) = oneshot::channel();
        self.send(MemberEvent::Revoking { partitions: partitions.clone(), ack: RevokeAck(ack) }, cancel)
            .await?;
        let timeout = Duration::from_millis(self.config.revoke_timeout_ms);
        if let Waited::Done(Err(_)) = self.wait(tokio::time::timeout(timeout, acked), cancel, false).await? {
            tracing::warn!(group = %self.spec.group, consumer = %self.consumer_id, timeout_ms = self.config.revoke_timeout_ms, "caller did not acknowledge the revocation in time; releasing anyway");
        }
        for tp in &partitions {
            self.owned.remove(tp);
        }
        self.offsets.forget(&partitions);
        self.publish();
        let deletes = partitions.iter().map(|tp| {
            let path = self.spec.paths.owner(&self.spec.group, &tp.topic, tp.partition);
            async move { (tp, zk.delete(&path, None).await) }
        });
        let mut failure = None;
        for (tp, deleted) in join_all(deletes).await {
            match deleted {
                Ok(()) | Err(coord::Error::NoNode { .. }) => {}
                Err(e) => {
                    self.uncertain.insert(tp.clone());
                    failure.get_or_insert(e);
                }
            }
        }
        self.send(MemberEvent::Revoked { partitions }, cancel).await?;
        match failure {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Claims owner nodes. A node still held by another member is watched and claimed once it
    /// goes; waiting ends after `rebalance_max_retries` backoff periods without any such node
    /// going (the periodic reconcile tries again), and a view change meanwhile restarts the
    /// rebalance with fresh data.
    async fn claim(
        &mut self,
        zk: &Zk,
        wanted: BTreeMap<TopicPartition, ConsumerThreadId>,
        cancel: &CancellationToken,
    ) -> std::result::Result<(), Halt> {
        let mut try_now: BTreeSet<TopicPartition> = wanted.keys().cloned().collect();
        // Nodes held by others, each resolving to its partition when it changes.
        let mut waiting: FuturesUnordered<BoxFuture<'static, TopicPartition>> = FuturesUnordered::new();
        let mut retries = 0;
        loop {
            if !try_now.is_empty() {
                try_now = self.try_claim(zk, &wanted, &try_now, &mut waiting, cancel).await?;
                if !try_now.is_empty() {
                    continue; // some went while we looked
                }
            }
            if waiting.is_empty() {
                return Ok(());
            }
            if retries >= self.config.rebalance_max_retries {
                tracing::warn!(group = %self.spec.group, consumer = %self.consumer_id, still_held = waiting.len(), "giving up claiming partitions still owned by others; retrying later");
                self.schedule(self.config.backoff());
                return Ok(());
            }
            match self
                .wait(tokio::time::timeout(self.config.backoff(), waiting.next()), Some(cancel), true)
                .await?
            {
                Waited::Done(Ok(Some(tp))) => {
                    try_now.insert(tp);
                    while let Some(Some(tp)) = waiting.next().now_or_never() {
                        try_now.insert(tp);
                    }
                }
                Waited::Done(Ok(None)) => return Ok(()),
                Waited::Done(Err(_elapsed)) => retries += 1,
                Waited::ViewChanged => {
                    self.schedule(Duration::from_millis(self.config.rebalance_coalesce_ms));
                    return Ok(());
                }
            }
        }
    }

    /// One round of claims; returns the partitions whose holder went while we looked. Those
    /// still held go into `waiting`.
    async fn try_claim(
        &mut self,
        zk: &Zk,
        wanted: &BTreeMap<TopicPartition, ConsumerThreadId>,
        partitions: &BTreeSet<TopicPartition>,
        waiting: &mut FuturesUnordered<BoxFuture<'static, TopicPartition>>,
        cancel: &CancellationToken,
    ) -> std::result::Result<BTreeSet<TopicPartition>, Halt> {
        let creates = partitions.iter().filter_map(|tp| wanted.get(tp).map(|thread| (tp, thread))).map(
            |(tp, thread)| {
                let path = self.spec.paths.owner(&self.spec.group, &tp.topic, tp.partition);
                async move {
                    let claimed = zk.create_ephemeral_checked(&path, thread.as_str().as_bytes()).await;
                    (tp.clone(), path, claimed)
                }
            },
        );
        let mut won = BTreeSet::new();
        let mut held = Vec::new();
        let mut failure = None;
        for (tp, path, claimed) in join_all(creates).await {
            match claimed {
                Ok(_) => drop(won.insert(tp)),
                Err(coord::Error::HeldByOther { .. }) => {
                    let labels = [self.spec.group.as_str(), tp.topic.as_str()];
                    self.metrics.owner_conflicts.with_label_values(&labels).inc();
                    held.push((tp, path));
                }
                Err(e) => {
                    // The create may have gone through: remember to look.
                    self.uncertain.insert(tp);
                    failure.get_or_insert(e);
                }
            }
        }
        if !won.is_empty() {
            for tp in &won {
                if let Some(thread) = wanted.get(tp) {
                    self.uncertain.remove(tp);
                    self.owned.insert(tp.clone(), thread.clone());
                }
            }
            self.publish();
            let session = zk.session.id();
            self.send(MemberEvent::Assigned { partitions: won, session }, Some(cancel)).await?;
        }
        if let Some(e) = failure {
            return Err(e.into());
        }
        let watches = held.iter().map(|(tp, path)| async move { (tp.clone(), zk.exists_watch(path).await) });
        let mut gone = BTreeSet::new();
        for (tp, watched) in join_all(watches).await {
            match watched? {
                (None, _) => drop(gone.insert(tp)),
                (Some(_), watch) => waiting.push(Box::pin(async move {
                    let _: WatchEvent = watch.await;
                    tp
                })),
            }
        }
        Ok(gone)
    }

    /// Leaves cleanly: hand everything off, delete our id, close the session.
    async fn leave(&mut self) {
        let group = self.spec.group.clone();
        tracing::info!(%group, consumer = %self.consumer_id, "leaving consumer group");
        if let Some(zk) = self.zk.clone()
            && self.state == SessionState::Connected
        {
            let owned: BTreeSet<TopicPartition> = self.owned.keys().cloned().collect();
            if let Err(halt) = self.release(&zk, owned, None).await
                && let Some(e) = self.error(halt)
            {
                tracing::warn!(%group, error = %e, "releasing partitions on leave failed; the session close removes them");
            }
            let path = self.spec.paths.id(&group, &self.consumer_id);
            if let Err(e) = zk.delete(&path, None).await
                && !matches!(e, coord::Error::NoNode { .. })
            {
                tracing::warn!(%group, error = %e, "deleting our registration on leave failed; the session close removes it");
            }
        }
        self.offsets.stop();
        self.owned.clear();
        self.states = None;
        self.lease.end();
        if let Some((cancel, task)) = self.keeper.take() {
            cancel.cancel();
            let _ = task.await;
        }
        let zk = self.zk.take();
        self.publish();
        self.set_state(SessionState::Closed);
        // Callers' commits in flight may still hold the session; then it closes when they drop it.
        if let Some(zk) = zk
            && let Ok(session) = Arc::try_unwrap(zk.session)
            && let Err(e) = session.close().await
        {
            tracing::debug!(%group, error = %e, "closing the session");
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        // Dropped without leaving (a crash): the caller holds nothing any more.
        self.lease.end();
        if let Some((cancel, _)) = self.keeper.take() {
            cancel.cancel();
        }
        self.offsets.stop();
        self.owned.clear();
        self.zk = None;
        self.publish();
        if self.state == SessionState::Connected {
            self.metrics.session_changed(
                self.spec.group.as_str(),
                SessionState::Connected,
                SessionState::Closed,
            );
        }
    }
}

async fn next_state(states: &mut Option<StateChanges>) -> Option<SessionEvent> {
    match states {
        Some(states) => states.next().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}
