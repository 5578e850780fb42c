//! The topology state machine applied to ZooKeeper, and the timers of delayed transitions.
//!
//! [`Transitions::apply`] reads `/storms/<id>` with its version, runs the pure
//! [`lifecycle::transition`], and writes the result back with compare-and-set, retrying a
//! bounded number of times when another writer (a second request, the deadline timer) got
//! there first. [`Outcome::Remove`] deletes everything of the topology: its assignment (so
//! supervisors stop its workers), heartbeats, errors and code, and `/storms/<id>` *last*, so a
//! nimbus that crashes half-way still finds the pending kill on restart and finishes it.
//!
//! [`DeadlineTimers`] is the actor that fires delayed transitions. Its deadlines come from the
//! stored base records, not from memory: it re-reads every `/storms/<id>` when it starts and
//! every `nimbus.monitor.freq.secs`, so a kill or rebalance survives a nimbus restart (which
//! Storm's in-memory timer does not) and a missed arm is repaired at the next rescan.
//!
//! [`Outcome::Reschedule`] (a due rebalance) needs the topology's executors and the cluster's
//! slots: the [`Rescheduler`] hook, which [`crate::assigner::Assigner`] fills. A failed
//! reschedule leaves the rebalance pending and the timer retries it.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use cluster_state::clock::now_secs;
use cluster_state::coord::{self, Session};
use cluster_state::ids::TopologyId;
use cluster_state::paths::StormPaths;
use cluster_state::znode::{StormBase, ZnodeData};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::code_store::{CodeStore, CodeStoreError};
use crate::leader::{self, Leadership};
use crate::lifecycle::{self, Event, LifecycleError, Outcome};
use crate::metrics::NimbusMetrics;
use crate::state;

/// Compare-and-set attempts before giving up on a topology that keeps changing under us.
const MAX_CAS_ATTEMPTS: u32 = 8;

/// Why rescheduling a topology failed.
#[derive(Debug, thiserror::Error)]
pub enum RescheduleError {
    /// Reading the cluster or writing the assignment failed.
    #[error(transparent)]
    Coord(#[from] coord::Error),
    /// Anything else the implementation reports (its message names what).
    #[error("{0}")]
    Other(String),
}

/// Computes and writes a topology's new assignment when a rebalance falls due.
///
/// An implementation (see [`crate::assigner::Assigner`]) reads the topology's definition,
/// derives its executors with the parallelism in `base.component_executors`, gathers the live
/// supervisors' slots and the slots other topologies use, runs [`crate::scheduler::schedule`]
/// with *no* alive executors (a rebalance moves everything) and `base.num_workers`, and writes
/// `/assignments/<id>`. [`Transitions::apply`] writes `base` to
/// `/storms/<id>` only after this returns `Ok`, so a failure leaves the rebalance pending and
/// the timer retries it.
#[async_trait::async_trait]
pub trait Rescheduler: Send + Sync + fmt::Debug {
    async fn reschedule(
        &self,
        session: &Session,
        id: &TopologyId,
        base: &StormBase,
    ) -> Result<(), RescheduleError>;
}

/// What applying a transition can fail with.
#[derive(Debug, thiserror::Error)]
pub enum TransitionError {
    #[error("no topology {id}")]
    UnknownTopology { id: TopologyId },
    /// The state machine refuses the event, or the rebalance request is bad.
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    /// Others kept changing the base record between our read and our write.
    #[error("topology {id} kept changing during {attempts} attempts to update it; try again")]
    Contended { id: TopologyId, attempts: u32 },
    #[error("cannot reschedule topology {id}: {source}")]
    Reschedule { id: TopologyId, source: RescheduleError },
    #[error(transparent)]
    Coord(#[from] coord::Error),
    #[error(transparent)]
    Code(#[from] CodeStoreError),
}

/// What [`Transitions::apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Nothing to change; the base as stored.
    Unchanged(StormBase),
    /// The base as written (after a reschedule too).
    Updated(StormBase),
    /// The topology is gone.
    Removed,
}

impl Applied {
    /// The deadline of the pending transition now stored, if any.
    pub fn pending_deadline_secs(&self) -> Option<u64> {
        match self {
            Applied::Unchanged(base) | Applied::Updated(base) => {
                base.pending_transition.as_ref().map(|p| p.deadline_secs())
            }
            Applied::Removed => None,
        }
    }
}

/// Applies lifecycle events to the topologies stored in ZooKeeper.
#[derive(Debug)]
pub struct Transitions {
    session: Arc<Session>,
    paths: StormPaths,
    code: CodeStore,
    rescheduler: Arc<dyn Rescheduler>,
    metrics: NimbusMetrics,
    leadership: Leadership,
}

impl Transitions {
    pub fn new(
        session: Arc<Session>,
        paths: StormPaths,
        code: CodeStore,
        rescheduler: Arc<dyn Rescheduler>,
        metrics: NimbusMetrics,
    ) -> Self {
        Transitions { session, paths, code, rescheduler, metrics, leadership: Leadership::standalone() }
    }

    /// The same transitions writing only while `leadership` leads, every write fenced.
    pub fn with_leadership(mut self, leadership: Leadership) -> Self {
        self.leadership = leadership;
        self
    }

    pub fn leadership(&self) -> &Leadership {
        &self.leadership
    }

    pub fn metrics(&self) -> &NimbusMetrics {
        &self.metrics
    }

    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    pub fn paths(&self) -> &StormPaths {
        &self.paths
    }

    pub fn code(&self) -> &CodeStore {
        &self.code
    }

    /// Applies `event` to topology `id` at `now_secs`; see the module docs.
    pub async fn apply(
        &self,
        id: &TopologyId,
        event: Event,
        now_secs: u64,
    ) -> Result<Applied, TransitionError> {
        let name = event.name();
        let result = self.apply_with_retries(id, event, now_secs).await;
        let label = match &result {
            Ok(_) => "ok",
            Err(
                TransitionError::UnknownTopology { .. }
                | TransitionError::Lifecycle(_)
                | TransitionError::Contended { .. },
            ) => "refused",
            Err(_) => "failed",
        };
        self.metrics.transitions.with_label_values(&[name, label]).inc();
        result
    }

    async fn apply_with_retries(
        &self,
        id: &TopologyId,
        event: Event,
        now_secs: u64,
    ) -> Result<Applied, TransitionError> {
        let path = self.paths.storm(id);
        for _ in 0..MAX_CAS_ATTEMPTS {
            let (base, stat) = match self.session.read::<StormBase>(&path).await {
                Ok(read) => read,
                Err(coord::Error::NoNode { .. }) => {
                    return Err(TransitionError::UnknownTopology { id: id.clone() });
                }
                Err(e) => return Err(e.into()),
            };
            let written = match lifecycle::transition(&base, event.clone(), now_secs)? {
                Outcome::Unchanged => return Ok(Applied::Unchanged(base)),
                Outcome::Update(new) => new,
                Outcome::Reschedule(new) => {
                    self.rescheduler
                        .reschedule(&self.session, id, &new)
                        .await
                        .map_err(|source| TransitionError::Reschedule { id: id.clone(), source })?;
                    new
                }
                Outcome::Remove => match self.remove(id, Some(stat.version)).await {
                    Ok(()) => return Ok(Applied::Removed),
                    Err(TransitionError::Coord(coord::Error::BadVersion { .. })) => continue,
                    Err(e) => return Err(e),
                },
            };
            match leader::set(&self.session, &self.leadership, &path, &written.encode(), Some(stat.version))
                .await
            {
                Ok(()) => {
                    tracing::info!(topology = %id, event = ?event, status = %written.status, "transition applied");
                    return Ok(Applied::Updated(written));
                }
                Err(coord::Error::BadVersion { .. }) => continue,
                Err(coord::Error::NoNode { .. }) => {
                    return Err(TransitionError::UnknownTopology { id: id.clone() });
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(TransitionError::Contended { id: id.clone(), attempts: MAX_CAS_ATTEMPTS })
    }

    /// Removes everything of topology `id`: assignment, heartbeats, errors, code, and finally
    /// its base record (only if still at `storm_version`, when given). Parts already gone are
    /// not an error, so a removal interrupted by a crash can simply run again.
    pub async fn remove(&self, id: &TopologyId, storm_version: Option<i32>) -> Result<(), TransitionError> {
        self.remove_all_but_base(id).await?;
        match leader::delete(&self.session, &self.leadership, &self.paths.storm(id), storm_version).await {
            Ok(()) | Err(coord::Error::NoNode { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        tracing::info!(topology = %id, "topology removed: znodes and code are gone");
        Ok(())
    }

    async fn remove_all_but_base(&self, id: &TopologyId) -> Result<(), TransitionError> {
        // The assignment first: supervisors watch it and stop the workers as soon as it goes.
        let (session, leadership) = (&self.session, &self.leadership);
        match leader::delete(session, leadership, &self.paths.assignment(id), None).await {
            Ok(()) | Err(coord::Error::NoNode { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        leader::delete_recursive(session, leadership, &self.paths.workerbeats_topology(id)).await?;
        leader::delete_recursive(session, leadership, &self.paths.errors_topology(id)).await?;
        leader::delete_recursive(session, leadership, &self.paths.log_config(id)).await?;
        leader::delete_recursive(session, leadership, &self.paths.blobstore_topology(id)).await?;
        self.code.remove(id).await?;
        Ok(())
    }

    /// Storm's `cleanup-storm-ids`: removes the assignment, heartbeats, errors and code of
    /// every topology that has no `/storms/<id>` (left by an interrupted submit, or by an
    /// operator deleting the base by hand). Returns the ids cleaned up. A `/storms/<id>` with
    /// garbage data still counts as present: only its name is looked at.
    ///
    /// Submit writes code before `/storms/<id>`, so the caller must not run this while a
    /// submit is between the two (Storm holds its submit lock around both).
    pub async fn cleanup_orphans(&self) -> Result<Vec<TopologyId>, TransitionError> {
        let present: std::collections::BTreeSet<String> =
            self.session.children_or_empty(&self.paths.storms_dir()).await?.into_iter().collect();
        let mut orphans = std::collections::BTreeSet::new();
        for dir in [
            self.paths.assignments_dir(),
            self.paths.workerbeats_dir(),
            self.paths.errors_dir(),
            self.paths.blobstore_dir(),
        ] {
            for name in self.session.children_or_empty(&dir).await? {
                if let Ok(id) = name.parse::<TopologyId>() {
                    orphans.insert(id);
                }
            }
        }
        orphans.extend(self.code.topologies().await?);
        orphans.retain(|id| !present.contains(id.as_str()));
        for id in &orphans {
            tracing::info!(topology = %id, "removing what is left of a topology without a base record");
            self.remove_all_but_base(id).await?;
        }
        Ok(orphans.into_iter().collect())
    }
}

/// Sends deadlines to a running [`DeadlineTimers`].
#[derive(Debug, Clone)]
pub struct TimerHandle {
    arms: mpsc::Sender<(TopologyId, u64)>,
}

impl TimerHandle {
    /// Asks for `Event::Deadline` on `id` at `deadline_secs` (epoch seconds). Arming again
    /// replaces the previous deadline. Without a running actor this does nothing, which is
    /// safe: the next nimbus re-arms from ZooKeeper.
    pub async fn arm(&self, id: TopologyId, deadline_secs: u64) {
        if self.arms.send((id, deadline_secs)).await.is_err() {
            tracing::debug!("deadline timers are stopped; the deadline stays stored in ZooKeeper");
        }
    }
}

/// The actor firing delayed transitions; see the module docs.
#[derive(Debug)]
pub struct DeadlineTimers {
    transitions: Arc<Transitions>,
    arms: mpsc::Receiver<(TopologyId, u64)>,
    due: HashMap<TopologyId, Instant>,
    rescan_interval: Duration,
}

enum TimerEvent {
    Stop,
    Arm(TopologyId, u64),
    Due,
    Rescan,
}

/// Timers further out than this are armed for this long instead; the rescan re-arms them.
const LONGEST_TIMER: Duration = Duration::from_secs(24 * 3600);

/// When `deadline_secs` (epoch) falls on tokio's clock. A client may ask for any wait (`kill -w
/// 18446744073709551615`), and `Instant` arithmetic overflows, so far deadlines are clamped:
/// firing early is harmless, the transition itself checks the stored deadline.
fn instant_of(deadline_secs: u64) -> Instant {
    let now = cluster_state::clock::since_epoch();
    Instant::now() + Duration::from_secs(deadline_secs).saturating_sub(now).min(LONGEST_TIMER)
}

impl DeadlineTimers {
    /// The actor and its handle. `rescan_interval` is `nimbus.monitor.freq.secs`.
    pub fn new(transitions: Arc<Transitions>, rescan_interval: Duration) -> (Self, TimerHandle) {
        let (tx, rx) = mpsc::channel(64);
        let timers = DeadlineTimers { transitions, arms: rx, due: HashMap::new(), rescan_interval };
        (timers, TimerHandle { arms: tx })
    }

    /// Runs until `cancel`: rescans at once, then fires deadlines as they come. Run again for
    /// each term of leadership: what was due is forgotten and re-read from ZooKeeper.
    pub async fn run(&mut self, cancel: CancellationToken) {
        self.due.clear();
        let mut rescan = tokio::time::interval(self.rescan_interval);
        rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut arms_open = true;
        loop {
            let next = self.due.values().min().copied();
            let event = tokio::select! {
                _ = cancel.cancelled() => TimerEvent::Stop,
                arm = self.arms.recv(), if arms_open => match arm {
                    Some((id, deadline)) => TimerEvent::Arm(id, deadline),
                    // Every handle is gone: stored deadlines and rescans keep working.
                    None => {
                        arms_open = false;
                        continue;
                    }
                },
                _ = sleep_until_opt(next) => TimerEvent::Due,
                _ = rescan.tick() => TimerEvent::Rescan,
            };
            match event {
                TimerEvent::Stop => return,
                TimerEvent::Arm(id, deadline) => {
                    self.due.insert(id, instant_of(deadline));
                }
                TimerEvent::Due => self.fire_due().await,
                TimerEvent::Rescan => self.rescan().await,
            }
        }
    }

    async fn rescan(&mut self) {
        let t = &self.transitions;
        match state::read_storms(t.session(), t.paths()).await {
            Ok(read) => {
                t.metrics().garbage_znodes.inc_by(read.skipped.len() as u64);
                for (id, base) in read.value {
                    if let Some(pending) = base.pending_transition {
                        self.due.insert(id, instant_of(pending.deadline_secs()));
                    }
                }
            }
            Err(e) => tracing::warn!("cannot read stored transitions, retrying at the next rescan: {e}"),
        }
    }

    async fn fire_due(&mut self) {
        let now = Instant::now();
        let due: Vec<TopologyId> =
            self.due.iter().filter(|(_, at)| **at <= now).map(|(id, _)| id.clone()).collect();
        for id in due {
            self.due.remove(&id);
            match self.transitions.apply(&id, Event::Deadline, now_secs()).await {
                Ok(applied) => {
                    if let Some(deadline) = applied.pending_deadline_secs() {
                        self.due.insert(id, instant_of(deadline));
                    }
                }
                Err(TransitionError::UnknownTopology { .. }) => {}
                Err(e) => {
                    // Left pending in ZooKeeper; the next rescan arms it again.
                    tracing::warn!(topology = %id, "delayed transition failed, retrying at the next rescan: {e}");
                }
            }
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
