//! The Kafka spout: each task is one member of a consumer group in the ZooKeeper registry and
//! fetches, with librdkafka, from the partitions it owns (assign, never subscribe).
//!
//! Two sides share one `TaskState` (`partitions.rs`) behind a mutex:
//! - the executor thread ([`KafkaSpout`]'s `Spout` methods; emitting in `hot_path.rs`) polls
//!   librdkafka, emits while the ownership lease allows, and applies acks and fails to the
//!   per-partition offset trackers. It takes the lock once per `next_tuple` (a batch of
//!   messages) and once per batch of acks (buffered until the executor's
//!   `verdicts_delivered`; a fail applies them first).
//! - the coordinator (`coordinator.rs`), a thread with a current-thread tokio runtime, runs the registry
//!   [`Member`] and acts on its events in order: assigns partitions at their committed (or
//!   reset) offsets, drains and commits revoked ones before acknowledging the hand-off, pauses
//!   emission while ZooKeeper is disconnected, and commits every `offsets.commit.interval.ms`,
//!   on deactivate and on shutdown. It is the only committer, so commits never reorder.
//!
//! A message id names an incarnation of a partition (a slot, new at every assignment) and an
//! offset ([`crate::offsets::MsgId`]): an ack or fail for a partition given up since is recognised as stale and
//! ignored (Storm had crashes there).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster_state::coord::{Ensemble, Security, ZkAuth};
use cluster_state::ids::{ConsumerId, GroupId, Topic};
use cluster_state::paths::{KafkaPaths, StormPaths};
use consumer_registry::{Member, MemberHandle, MemberSpec, RegistryMetrics};
use prometheus::IntCounter;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use worker::{ComponentError, Fields, OutputDeclarer, Spout, SpoutCollector, TopologyContext};

use crate::config::KafkaSpoutConfig;
use crate::context::{SpoutContext, TaskConsumer};
use crate::error::{Error, Result};
use crate::metrics::SpoutMetrics;
use crate::offsets::RetryPolicy;

mod coordinator;
mod fetch;
mod hot_path;
mod partitions;

use coordinator::{Coordinator, MetadataSource, Request};
use fetch::Fetcher;
use hot_path::HotPath;
use partitions::{Settled, TaskState, lock};

/// The spout's output fields, in order.
pub const FIELDS: [&str; 6] = ["topic", "partition", "offset", "key", "value", "timestamp"];
/// How long librdkafka calls made by the coordinator (watermarks, metadata, seek) may take.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long shutdown may take (final commit, hand-off of every partition, closing the session).
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(15);
/// How often a spout whose join after activation failed tries again.
const JOIN_RETRY: Duration = Duration::from_secs(5);
/// Attempts at reading a newly assigned partition's start position before it waits for the
/// coordinator's retry (`coordinator::START_RETRY`).
const START_ATTEMPTS: u32 = 5;
/// Acks buffered before they are applied even if the executor's batch goes on (bounds the
/// buffer when an executor delivers many verdicts at once).
const MAX_BUFFERED_ACKS: usize = 4096;

/// What every spout task of a process shares: metric families, and optionally an ensemble
/// (the in-memory one of `squall local` and tests) instead of `zookeeper_connect`.
#[derive(Debug, Clone)]
pub struct SpoutEnv {
    pub metrics: SpoutMetrics,
    pub registry_metrics: RegistryMetrics,
    pub ensemble: Option<Ensemble>,
}

impl SpoutEnv {
    /// Registers the spout's and the consumer registry's metric families on `registry`.
    pub fn register(registry: &prometheus::Registry) -> Result<Self> {
        Ok(SpoutEnv {
            metrics: SpoutMetrics::register(registry)?,
            registry_metrics: RegistryMetrics::register(registry)?,
            ensemble: None,
        })
    }
}

/// The spout. Build one per task with [`KafkaSpout::new`]; `open` joins the group.
pub struct KafkaSpout {
    config: Arc<KafkaSpoutConfig>,
    env: SpoutEnv,
    /// Kept from `open` to join the group again on `activate`.
    context: Option<TopologyContext>,
    running: Option<Running>,
    /// A join after activation failed: when to try again.
    retry_join_at: Option<Instant>,
}

impl std::fmt::Debug for KafkaSpout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSpout")
            .field("group", &self.config.group_id)
            .field("topics", &self.config.topics)
            .field("running", &self.running.is_some())
            .finish()
    }
}

struct Running {
    component: String,
    task: u32,
    hot: HotPath,
    state: Arc<Mutex<TaskState>>,
    drained: Arc<Notify>,
    requests: mpsc::UnboundedSender<Request>,
    cancel: CancellationToken,
    done: std::sync::mpsc::Receiver<()>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Deactivated: the coordinator is leaving (or has left) the group; `activate` joins anew.
    leaving: bool,
    /// Activated while still leaving: join once the coordinator is done.
    rejoin: bool,
    handle: MemberHandle,
    stale_acks: IntCounter,
    retry: RetryPolicy,
    /// Acks delivered and not applied yet (until the end of the executor's batch).
    acks: Vec<u64>,
}

impl KafkaSpout {
    /// A spout task with this (validated) configuration.
    pub fn new(config: Arc<KafkaSpoutConfig>, env: SpoutEnv) -> Self {
        KafkaSpout { config, env, context: None, running: None, retry_join_at: None }
    }

    /// The registry member of this task, once activated (for tests and operations).
    pub fn member(&self) -> Option<&MemberHandle> {
        self.running.as_ref().map(|r| &r.handle)
    }

    fn start(&mut self, context: &TopologyContext) -> Result<()> {
        let config = &self.config;
        let component = context.component_id.to_string();
        let task = context.task_id.0;
        let task_err = |reason: String| Error::Task { component: component.clone(), task, reason };
        let group = GroupId::new(config.group_id.clone())?;
        // Stable across restarts: the same task gets its partitions back.
        let consumer_id = ConsumerId::new(format!(
            "{}_{}-{}",
            context.topology_name,
            context.component_id,
            context.task_index()
        ))?;
        let consumer: TaskConsumer = config
            .consumer_config()
            .create_with_context(SpoutContext { component: component.clone(), task })
            .map_err(|source| Error::Client { context: "creating the consumer", source })?;
        let consumer = Arc::new(consumer);
        // Before anyone else uses the consumer: its main queue stops feeding the fetch queue.
        let fetcher = Fetcher::new(consumer.clone(), config.emit_batch as usize)
            .map_err(|e| task_err(format!("reading the consumer in batches: {e}")))?;
        let subscription =
            config.topics.iter().map(|t| Ok((Topic::new(t.clone())?, 1))).collect::<Result<_>>()?;
        let ensemble = match &self.env.ensemble {
            Some(e) => e.clone(),
            // The worker's ZooKeeper credentials (from its supervisor), so the registry nodes are
            // the cluster's to write and world-readable for Kafka's tools.
            None => {
                let auth = ZkAuth::from_env().unwrap_or_else(|e| {
                    tracing::warn!("ignoring the ZooKeeper credentials: {e}");
                    None
                });
                Ensemble::zookeeper(config.zookeeper_connect.clone())
                    .with_security(Security::new(auth, StormPaths::DEFAULT_ROOT))
            }
        };
        let spec = MemberSpec {
            ensemble,
            paths: KafkaPaths::new(config.zookeeper_chroot.as_deref())?,
            group,
            consumer_id: Some(consumer_id),
            host: "squall".into(),
            subscription,
            partition_source: Some(Arc::new(MetadataSource { consumer: consumer.clone() })),
            detached_session: false,
        };
        let (member, handle, events) =
            Member::new(spec, config.registry_config(), self.env.registry_metrics.clone())?;
        let state = Arc::new(Mutex::new(TaskState::default()));
        let drained = Arc::new(Notify::new());
        let (requests, requests_rx) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let (done_tx, done) = std::sync::mpsc::channel();
        let message_timeout = Duration::from_secs(context.config.message_timeout_secs);
        let drain_timeout = message_timeout
            .min(Duration::from_millis(config.registry.revoke_timeout_ms.saturating_sub(1000).max(1)));
        let coordinator = Coordinator {
            config: self.config.clone(),
            component: component.clone(),
            task,
            consumer: consumer.clone(),
            state: state.clone(),
            drained: drained.clone(),
            handle: handle.clone(),
            metrics: self.env.metrics.clone(),
            paused: self
                .env
                .metrics
                .paused
                .with_label_values(&[component.as_str(), task.to_string().as_str()]),
            drain_timeout,
            leave_timeout: message_timeout + Duration::from_secs(1),
            lag_windows: Mutex::new(HashMap::new()),
            kafka_behind: Mutex::new(Default::default()),
            unstarted: Mutex::new(Default::default()),
            kafka_committing: Arc::new(tokio::sync::Mutex::new(())),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| task_err(format!("building the coordinator runtime: {e}")))?;
        let stop = cancel.clone();
        let thread = std::thread::Builder::new()
            .name(format!("kafka-spout-{task}"))
            .spawn(move || {
                runtime.block_on(Arc::new(coordinator).run(member, events, requests_rx, stop));
                // A librdkafka call that outlived its timeout (a broker away) must not hold
                // the task's close: its thread finishes on its own.
                runtime.shutdown_background();
                let _ = done_tx.send(());
            })
            .map_err(|e| task_err(format!("starting the coordinator thread: {e}")))?;
        let hot = HotPath {
            fetcher,
            state: state.clone(),
            lease: handle.lease().clone(),
            emit_batch: config.emit_batch as usize,
            max_in_flight: config.max_in_flight as usize,
            max_pending: context.config.max_spout_pending.map(|m| m as usize),
            only_topic: match config.topics.as_slice() {
                [only] => Some(only.clone()),
                _ => None,
            },
        };
        self.running = Some(Running {
            stale_acks: self.env.metrics.stale_acks.with_label_values(&[component.as_str()]),
            component,
            task,
            hot,
            state,
            drained,
            requests,
            cancel,
            done,
            thread: Some(thread),
            leaving: false,
            rejoin: false,
            handle,
            retry: config.retry.clone(),
            acks: Vec::new(),
        });
        Ok(())
    }
}

impl KafkaSpout {
    /// Starts a new member once the one that left on deactivate is gone; until then it stays
    /// pending (checked again on every `next_tuple`).
    fn rejoin(&mut self) -> std::result::Result<(), ComponentError> {
        match &mut self.running {
            Some(r) => {
                if !r.rejoin || !r.ended() {
                    return Ok(());
                }
                self.running = None;
            }
            // No member: the last join failed; try again every JOIN_RETRY.
            None if self.retry_join_at.is_some_and(|at| Instant::now() < at) => return Ok(()),
            None => {}
        }
        let Some(context) = self.context.clone() else { return Ok(()) };
        tracing::info!(component = %context.component_id, task = context.task_id.0, "activated: joining the consumer group");
        self.retry_join_at = None;
        self.start(&context).map_err(|e| {
            self.retry_join_at = Some(Instant::now() + JOIN_RETRY);
            Box::new(e) as ComponentError
        })
    }
}

impl Running {
    /// Buffers an ack: [`Running::settle_acks`] applies them at the end of the executor's
    /// batch of verdicts (one lock and one counter update per batch, not per message).
    fn ack(&mut self, msg_id: u64) {
        self.acks.push(msg_id);
        if self.acks.len() >= MAX_BUFFERED_ACKS {
            self.settle_acks();
        }
    }

    fn settle_acks(&mut self) {
        if self.acks.is_empty() {
            return;
        }
        let (stale, drained) = lock(&self.state).settle_acks(&self.acks);
        self.acks.clear();
        self.after_settle(stale, drained);
    }

    fn fail(&mut self, msg_id: u64) {
        self.settle_acks();
        let (settled, drained) = lock(&self.state).settle(msg_id, Some((Instant::now(), &self.retry)));
        self.after_settle(u64::from(settled == Settled::Stale), drained);
    }

    fn after_settle(&self, stale: u64, drained: bool) {
        if stale > 0 {
            self.stale_acks.inc_by(stale);
        }
        if drained {
            self.drained.notify_one();
        }
    }

    /// Whether the coordinator has ended (left the group after a deactivate, or stopped).
    fn ended(&mut self) -> bool {
        match self.done.try_recv() {
            Ok(()) | Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                if let Some(thread) = self.thread.take() {
                    let _ = thread.join();
                }
                true
            }
            Err(std::sync::mpsc::TryRecvError::Empty) => self.thread.is_none(),
        }
    }

    fn close(&mut self) {
        self.settle_acks(); // the final commit counts them
        self.cancel.cancel();
        if self.thread.is_none() {
            return; // already ended (left the group on deactivate)
        }
        match self.done.recv_timeout(SHUTDOWN_TIMEOUT + Duration::from_secs(5)) {
            Ok(()) => {
                if let Some(thread) = self.thread.take() {
                    let _ = thread.join();
                }
            }
            Err(_) => {
                tracing::warn!(component = %self.component, task = self.task, "kafka spout coordinator did not stop in time")
            }
        }
    }
}

impl Spout for KafkaSpout {
    fn declare_outputs(&self, declarer: &mut OutputDeclarer) {
        declarer.declare(Fields::new(FIELDS));
    }

    /// Keeps the context; the group is joined at the first `activate` (or `next_tuple`), so a
    /// topology submitted inactive holds no partitions and its offsets can be reset before it
    /// ever runs, as after a deactivate.
    fn open(&mut self, context: &TopologyContext) -> std::result::Result<(), ComponentError> {
        self.context = Some(context.clone());
        Ok(())
    }

    fn next_tuple(&mut self, out: &mut SpoutCollector<'_>) -> std::result::Result<(), ComponentError> {
        if self.running.as_ref().is_none_or(|r| r.rejoin) {
            self.rejoin()?;
        }
        match &mut self.running {
            Some(r) if !r.leaving => r.hot.next_tuple(out),
            _ => Ok(()),
        }
    }

    fn ack(&mut self, msg_id: u64) {
        if let Some(r) = &mut self.running {
            r.ack(msg_id);
        }
    }

    fn fail(&mut self, msg_id: u64) {
        if let Some(r) = &mut self.running {
            r.fail(msg_id);
        }
    }

    fn verdicts_delivered(&mut self) {
        if let Some(r) = &mut self.running {
            r.settle_acks();
        }
    }

    /// Joins the group: the first time, or again after a deactivate (from the committed
    /// offsets, which an operator may have reset meanwhile).
    fn activate(&mut self) {
        if let Some(r) = &mut self.running
            && r.leaving
        {
            r.rejoin = true;
        }
        if let Err(e) = self.rejoin() {
            tracing::error!(error = %e, "kafka spout cannot join its consumer group again; retrying");
        }
    }

    /// Leaves the consumer group (see `Request::Leave`): acks keep arriving meanwhile, so
    /// the drain happens on the coordinator and this returns at once.
    fn deactivate(&mut self) {
        if let Some(r) = &mut self.running {
            r.rejoin = false;
            if !r.leaving {
                r.leaving = true;
                let _ = r.requests.send(Request::Leave);
            }
        }
    }

    fn close(&mut self) {
        if let Some(r) = &mut self.running {
            r.close();
        }
    }
}

impl Drop for KafkaSpout {
    fn drop(&mut self) {
        // A task dropped without close (a failed start elsewhere) must not leave its member
        // running: cancelling it hands everything off without waiting for in-flight tuples.
        if let Some(r) = &self.running {
            r.cancel.cancel();
        }
    }
}
