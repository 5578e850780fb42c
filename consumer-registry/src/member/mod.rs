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
//!   a clock that keeps running while the process is stopped. A keeper task (`lease.rs`) renews it and
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
//!
//! Layout: this file holds the types, the actor's state and its event loop; `session.rs` the
//! session (connect, register, adopt or resume, state changes); `view.rs` the group view
//! (members, partitions, owner checks); `handoff.rs` the rebalance (decide, release, claim, leave).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cluster_state::coord::{
    self, Ensemble, SessionEvent, SessionId, SessionOptions, SessionState, StateChanges,
};
use cluster_state::ids::{ConsumerId, ConsumerThreadId, GroupId, Partition, Topic};
use cluster_state::paths::KafkaPaths;
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::assign::{TopicPartition, TopicPartitions};
use crate::config::RegistryConfig;
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::metrics::RegistryMetrics;
use crate::offsets::OffsetStore;
use crate::zk::Zk;

mod handoff;
mod session;
mod view;

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
        tokio::select! {
            biased;
            () = cancelled(cancel) => Err(Halt::Cancelled),
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

    /// Hands `event` to the caller. Only cancellation interrupts it, never a session event (a
    /// state change stays queued in `states` meanwhile): the event reports what already
    /// happened, and one dropped would leave the caller behind the member for good (a lost
    /// `Paused` before its `Resumed`, or a lost `Assigned`: a partition owned and never
    /// consumed). The caller reads promptly, and the channel holds `EVENT_CAPACITY` events.
    async fn send(
        &mut self,
        event: MemberEvent,
        cancel: Option<&CancellationToken>,
    ) -> std::result::Result<(), Halt> {
        let events = self.events.clone();
        tokio::select! {
            biased;
            () = cancelled(cancel) => Err(Halt::Cancelled),
            // A caller that dropped its receiver does not care; keep the group's bookkeeping going.
            _ = events.send(event) => Ok(()),
        }
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

/// Fires when `cancel` does; never without one.
async fn cancelled(cancel: Option<&CancellationToken>) {
    match cancel {
        Some(cancel) => cancel.cancelled().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}
