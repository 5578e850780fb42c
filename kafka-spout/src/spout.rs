//! The Kafka spout: each task is one member of a consumer group in the ZooKeeper registry and
//! fetches, with librdkafka, from the partitions it owns (assign, never subscribe).
//!
//! Two sides share one [`TaskState`] behind a mutex:
//! - the executor thread ([`KafkaSpout`]'s `Spout` methods) polls librdkafka, emits, and applies
//!   acks and fails to the per-partition offset trackers. It takes the lock once per
//!   `next_tuple` (a batch of messages) and once per ack.
//! - the coordinator, a thread with a current-thread tokio runtime, runs the registry
//!   [`Member`] and acts on its events in order: assigns partitions at their committed (or
//!   reset) offsets, drains and commits revoked ones before acknowledging the hand-off, pauses
//!   emission while ZooKeeper is disconnected, and commits every `offsets.commit.interval.ms`,
//!   on deactivate and on shutdown. It is the only committer, so commits never reorder.
//!
//! A message id names an incarnation of a partition (a slot, new at every assignment) and an
//! offset ([`MsgId`]): an ack or fail for a partition given up since is recognised as stale and
//! ignored (Storm had crashes there).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use cluster_state::coord::{Ensemble, LeaseInstant, SessionId};
use cluster_state::ids::{ConsumerId, GroupId, Partition, Topic};
use cluster_state::paths::KafkaPaths;
use consumer_registry::lag::{Commit, LagWindow};
use consumer_registry::{
    Lease, Member, MemberEvent, MemberHandle, MemberSpec, OffsetReset, PartitionSource, RegistryMetrics,
    SourcedPartitions, StartPosition, TopicPartition,
};
use futures::future::BoxFuture;
use prometheus::IntCounter;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use worker::{ComponentError, Fields, OutputDeclarer, Spout, SpoutCollector, TopologyContext, Value, Values};

use crate::config::KafkaSpoutConfig;
use crate::context::{SpoutContext, TaskConsumer};
use crate::error::{Error, Result};
use crate::metrics::SpoutMetrics;
use crate::offsets::{FailOutcome, MsgId, PartitionOffsets, RetryPolicy};

/// The spout's output fields, in order.
pub const FIELDS: [&str; 6] = ["topic", "partition", "offset", "key", "value", "timestamp"];
/// How long librdkafka calls made by the coordinator (watermarks, metadata, seek) may take.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long shutdown may take (final commit, hand-off of every partition, closing the session).
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(15);
/// Attempts at reading a newly assigned partition's start position before leaving it idle.
const START_ATTEMPTS: u32 = 5;

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

/// One partition incarnation's state.
#[derive(Debug)]
struct PartState {
    tp: TopicPartition,
    /// The registry session that claimed it: it is emitted from only while the lease is this
    /// session's.
    session: SessionId,
    slot: u16,
    base: i64,
    /// False until the first message when started by `auto.offset.reset` (the broker knows
    /// the offset, we do not): `base` and `offsets` are set from that message.
    started: bool,
    /// False once a revoke started: nothing more is emitted from it.
    emitting: bool,
    offsets: PartitionOffsets<Stored>,
    topic_value: Value,
    partition_value: Value,
    emitted: IntCounter,
    acked: IntCounter,
    failed: IntCounter,
    replayed: IntCounter,
    given_up: IntCounter,
    out_of_range: IntCounter,
}

/// An emitted message as a replay needs it: key and value in one shared buffer (one
/// allocation per message; clones and slices only count references, so the emitted tuple and
/// this copy share it), and the timestamp.
#[derive(Debug, Clone)]
struct Stored {
    buf: Bytes,
    /// Length of the key in `buf`; `None` for a message without key.
    key_len: Option<usize>,
    has_value: bool,
    timestamp: Option<i64>,
}

impl Stored {
    fn new(key: Option<&[u8]>, value: Option<&[u8]>, timestamp: Option<i64>) -> Self {
        let (k, v) = (key.unwrap_or_default(), value.unwrap_or_default());
        let buf = if k.is_empty() && v.is_empty() {
            Bytes::new()
        } else {
            let mut buf = Vec::with_capacity(k.len() + v.len());
            buf.extend_from_slice(k);
            buf.extend_from_slice(v);
            Bytes::from_owner(buf)
        };
        Stored { buf, key_len: key.map(<[u8]>::len), has_value: value.is_some(), timestamp }
    }

    /// The tuple: topic, partition, offset, key, value, timestamp.
    fn values(&self, topic: &Value, partition: &Value, offset: i64) -> Values {
        let split = self.key_len.unwrap_or(0).min(self.buf.len());
        vec![
            topic.clone(),
            partition.clone(),
            Value::Int(offset),
            if self.key_len.is_some() { Value::Bytes(self.buf.slice(..split)) } else { Value::Null },
            if self.has_value { Value::Bytes(self.buf.slice(split..)) } else { Value::Null },
            self.timestamp.map_or(Value::Null, Value::Int),
        ]
        .into()
    }
}

/// A map keyed by what the spout looks up per message (topic names, partition numbers, slots):
/// keys it owns, so SipHash's flooding resistance buys nothing here, and its cost was a tenth of
/// the spout thread's CPU (three to five lookups per message).
type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// rustc's FxHash: a rotate, xor and multiply per word.
#[derive(Debug, Default, Clone, Copy)]
struct FxHasher(u64);

impl FxHasher {
    const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::SEED);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// What the executor thread and the coordinator share.
#[derive(Debug, Default)]
struct TaskState {
    paused: bool,
    /// Partition incarnations by slot: an ack finds its partition in one lookup.
    parts: FastMap<u16, PartState>,
    /// Topic -> partition -> slot of the incarnation consuming it.
    slots: FastMap<String, FastMap<i32, u16>>,
    next_slot: u16,
    /// Offset resets librdkafka reported (`auto.offset.reset` after an out-of-range fetch)
    /// whose partition has not been identified yet.
    resets_pending: u32,
}

impl TaskState {
    fn part_of_slot(&mut self, slot: u16) -> Option<&mut PartState> {
        self.parts.get_mut(&slot)
    }

    fn slot_of(&self, topic: &str, partition: i32) -> Option<u16> {
        self.slots.get(topic)?.get(&partition).copied()
    }

    fn get(&self, tp: &TopicPartition) -> Option<&PartState> {
        self.parts.get(&self.slot_of(tp.topic.as_str(), tp.partition.get())?)
    }

    fn get_mut(&mut self, tp: &TopicPartition) -> Option<&mut PartState> {
        let slot = self.slot_of(tp.topic.as_str(), tp.partition.get())?;
        self.parts.get_mut(&slot)
    }

    fn remove(&mut self, tp: &TopicPartition) -> Option<PartState> {
        let slot = self.slots.get_mut(tp.topic.as_str())?.remove(&tp.partition.get())?;
        self.parts.remove(&slot)
    }

    /// A new incarnation of `tp` starting at `start` (`None`: where the broker says, on the
    /// first message); returns its slot.
    fn insert(
        &mut self,
        tp: TopicPartition,
        session: SessionId,
        start: Option<i64>,
        metrics: &SpoutMetrics,
        component: &str,
    ) -> u16 {
        let partition = tp.partition.to_string();
        let labels = [component, tp.topic.as_str(), partition.as_str()];
        let slot = self.allocate_slot();
        let part = PartState {
            session,
            slot,
            base: start.unwrap_or(0),
            started: start.is_some(),
            emitting: true,
            offsets: PartitionOffsets::new(start.unwrap_or(0)),
            topic_value: Value::from(tp.topic.as_str()),
            partition_value: Value::Int(i64::from(tp.partition.get())),
            emitted: metrics.emitted.with_label_values(&labels),
            acked: metrics.acked.with_label_values(&labels),
            failed: metrics.failed.with_label_values(&labels),
            replayed: metrics.replayed.with_label_values(&labels),
            given_up: metrics.given_up.with_label_values(&labels),
            out_of_range: metrics.out_of_range.with_label_values(&labels),
            tp,
        };
        self.slots.entry(part.tp.topic.to_string()).or_default().insert(part.tp.partition.get(), slot);
        self.parts.insert(slot, part);
        slot
    }

    /// Starts `part`'s partition over at `offset` in a new slot: the broker moved the fetch
    /// position back, so earlier message ids must not match the new messages. Returns the
    /// new slot.
    fn rebase(&mut self, topic: &str, partition: i32, offset: i64) -> Option<u16> {
        let old = self.slot_of(topic, partition)?;
        let mut part = self.parts.remove(&old)?;
        let slot = self.allocate_slot();
        part.slot = slot;
        part.base = offset;
        part.offsets = PartitionOffsets::new(offset);
        self.parts.insert(slot, part);
        self.slots.entry(topic.to_owned()).or_default().insert(partition, slot);
        Some(slot)
    }

    /// A free slot (slots are reused only after 65536 assignments in this task).
    fn allocate_slot(&mut self) -> u16 {
        for _ in 0..=u16::MAX {
            let slot = self.next_slot;
            self.next_slot = self.next_slot.wrapping_add(1);
            if !self.parts.contains_key(&slot) {
                return slot;
            }
        }
        // 65536 partitions in one task: cannot happen with Kafka's limits; reuse slot 0.
        0
    }

    /// Applies an ack (`fail` = `None`) or a fail to the message `msg_id`. Also says whether
    /// its partition is being revoked and has nothing in flight any more.
    fn settle(&mut self, msg_id: u64, fail: Option<(Instant, &RetryPolicy)>) -> (Settled, bool) {
        let id = MsgId::decode(msg_id);
        let Some(part) = self.part_of_slot(id.slot) else { return (Settled::Stale, false) };
        let offset = id.offset(part.base);
        let settled = match fail {
            None if part.offsets.ack(offset) => {
                part.acked.inc();
                Settled::Acked
            }
            None => Settled::Stale,
            Some((now, policy)) => match part.offsets.fail(offset, now, policy) {
                FailOutcome::Retry { .. } => {
                    part.failed.inc();
                    Settled::Retry
                }
                FailOutcome::GiveUp => {
                    part.failed.inc();
                    part.given_up.inc();
                    Settled::GaveUp
                }
                FailOutcome::Unknown => Settled::Stale,
            },
        };
        let drained = !part.emitting && part.offsets.in_flight() == 0;
        (settled, drained)
    }

    fn in_flight(&self, partitions: &BTreeSet<TopicPartition>) -> usize {
        partitions.iter().filter_map(|tp| self.get(tp)).map(|p| p.offsets.in_flight()).sum()
    }
}

/// What an ack or a fail did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    /// For a partition given up since, or a message not outstanding: ignored.
    Stale,
    Acked,
    Retry,
    GaveUp,
}

fn lock(state: &Mutex<TaskState>) -> MutexGuard<'_, TaskState> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Requests from the executor thread to the coordinator.
#[derive(Debug)]
enum Request {
    /// Commit what is safe now (deactivate).
    Commit,
}

/// The spout. Build one per task with [`KafkaSpout::new`]; `open` joins the group.
pub struct KafkaSpout {
    config: Arc<KafkaSpoutConfig>,
    env: SpoutEnv,
    running: Option<Running>,
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
    handle: MemberHandle,
    stale_acks: IntCounter,
    retry: RetryPolicy,
}

/// The executor thread's emitting side: polls librdkafka and emits, only while the ownership
/// lease allows.
struct HotPath {
    consumer: Arc<TaskConsumer>,
    state: Arc<Mutex<TaskState>>,
    lease: Lease,
    emit_batch: usize,
    max_in_flight: usize,
    max_pending: Option<usize>,
}

/// Where `next_tuple` puts its tuples: the executor's collector, or a test's list.
trait Emit {
    fn emit(&mut self, values: Values, msg_id: u64) -> std::result::Result<(), ComponentError>;
    fn report_error(&mut self, error: String);
}

impl Emit for SpoutCollector<'_> {
    fn emit(&mut self, values: Values, msg_id: u64) -> std::result::Result<(), ComponentError> {
        SpoutCollector::emit(self, values, Some(msg_id))?;
        Ok(())
    }

    fn report_error(&mut self, error: String) {
        SpoutCollector::report_error(self, error);
    }
}

impl KafkaSpout {
    /// A spout task with this (validated) configuration.
    pub fn new(config: Arc<KafkaSpoutConfig>, env: SpoutEnv) -> Self {
        KafkaSpout { config, env, running: None }
    }

    /// The registry member of this task, once open (for tests and operations).
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
        let subscription =
            config.topics.iter().map(|t| Ok((Topic::new(t.clone())?, 1))).collect::<Result<_>>()?;
        let ensemble = match &self.env.ensemble {
            Some(e) => e.clone(),
            None => Ensemble::zookeeper(config.zookeeper_connect.clone()),
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
            lag_windows: Mutex::new(HashMap::new()),
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
                let _ = done_tx.send(());
            })
            .map_err(|e| task_err(format!("starting the coordinator thread: {e}")))?;
        let hot = HotPath {
            consumer,
            state: state.clone(),
            lease: handle.lease().clone(),
            emit_batch: config.emit_batch as usize,
            max_in_flight: config.max_in_flight as usize,
            max_pending: context.config.max_spout_pending.map(|m| m as usize),
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
            handle,
            retry: config.retry.clone(),
        });
        Ok(())
    }
}

impl HotPath {
    fn next_tuple(&mut self, out: &mut impl Emit) -> std::result::Result<(), ComponentError> {
        // The executor checks `topology.max.spout.pending` before each call; a batch must not
        // overshoot it by more than itself.
        let mut budget = self.max_pending.map_or(self.emit_batch, |max| self.emit_batch.min(max.max(1)));
        // The fence (consumer-registry's lease.rs): one clock read per batch. A process that
        // was stopped past the lease finds it over here, before it polls anything.
        let Some(session) = self.lease.valid_session(LeaseInstant::now()) else { return Ok(()) };
        let mut state = lock(&self.state);
        if state.paused {
            return Ok(());
        }
        // Every message in flight is kept for its replay: new ones are bounded (and with them
        // the memory); replays of those already kept are not, or a full window of failures
        // could never drain.
        let in_flight: usize = state.parts.values().map(|p| p.offsets.outstanding()).sum();
        let mut room = self.max_in_flight.saturating_sub(in_flight);
        // Replays first, oldest due first per partition.
        let now = Instant::now();
        for part in state.parts.values_mut() {
            let fenced = !part.emitting || part.session != session;
            if fenced || part.offsets.next_replay_at().is_none_or(|at| at > now) {
                continue;
            }
            while budget > 0 {
                let Some((offset, stored)) = part.offsets.next_replay(now) else { break };
                let values = stored.values(&part.topic_value, &part.partition_value, offset);
                if let Some(id) = MsgId::new(part.slot, part.base, offset) {
                    out.emit(values, id.encode())?;
                    part.replayed.inc();
                    budget -= 1;
                }
            }
        }
        let mut last: Option<(i32, u16)> = None;
        while budget > 0 && room > 0 {
            let Some(polled) = self.consumer.poll(Duration::ZERO) else { break };
            let message = match polled {
                Ok(m) => m,
                Err(KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset)) => {
                    // librdkafka does not say which partition; its next message tells.
                    state.resets_pending = state.resets_pending.saturating_add(1).min(1024);
                    continue;
                }
                Err(KafkaError::PartitionEOF(_)) => continue,
                Err(e) => {
                    out.report_error(format!("kafka consumer: {e}"));
                    break;
                }
            };
            let offset = message.offset();
            let (topic, partition) = (message.topic(), message.partition());
            let resets_pending = state.resets_pending;
            // librdkafka hands out a fetched batch of one partition at a time: the previous
            // message's slot is usually this one's (checked), saving the topic's lookup.
            let slot = match last {
                Some((p, slot))
                    if p == partition
                        && state.parts.get(&slot).is_some_and(|x| x.tp.topic.as_str() == topic) =>
                {
                    slot
                }
                _ => match state.slot_of(topic, partition) {
                    Some(slot) => slot,
                    None => continue, // fetched before the partition was given up
                },
            };
            last = Some((partition, slot));
            let Some(part) = state.parts.get_mut(&slot) else { continue };
            if !part.emitting || part.session != session {
                // Being revoked, or claimed in an ended session (its replacement starts over
                // from the committed offset).
                continue;
            }
            let mut slot = slot;
            if !part.started {
                part.started = true;
                part.base = offset;
                part.offsets = PartitionOffsets::new(offset);
            } else if offset < part.offsets.next() {
                // The spout never seeks back: the broker found the fetch offset out of range
                // and librdkafka reset it by auto.offset.reset to an earlier one.
                part.out_of_range.inc();
                tracing::warn!(%topic, partition, from = part.offsets.next(), to = offset, "offset out of range; reset back by auto.offset.reset");
                state.resets_pending = resets_pending.saturating_sub(1);
                let Some(new) = state.rebase(topic, partition, offset) else { continue };
                slot = new;
                last = Some((partition, slot));
            } else if offset > part.offsets.next() && resets_pending > 0 {
                part.out_of_range.inc();
                tracing::warn!(%topic, partition, from = part.offsets.next(), to = offset, "offset out of range; reset forward by auto.offset.reset");
                state.resets_pending = resets_pending - 1;
            }
            let Some(part) = state.parts.get_mut(&slot) else { continue };
            let Some(id) = MsgId::new(part.slot, part.base, offset) else {
                out.report_error(format!(
                    "kafka {}/{}: offset {offset} is 2^48 past the assignment's start; reassign to go on",
                    message.topic(),
                    message.partition()
                ));
                continue;
            };
            let stored = Stored::new(message.key(), message.payload(), message.timestamp().to_millis());
            let values = stored.values(&part.topic_value, &part.partition_value, offset);
            if part.offsets.emit(offset, stored).is_err() {
                continue;
            }
            part.emitted.inc();
            budget -= 1;
            room -= 1;
            out.emit(values, id.encode())?;
        }
        Ok(())
    }
}

impl Running {
    fn settle(&mut self, msg_id: u64, failed: bool) {
        // The clock is read only for a failure's replay time (acks are the hot path).
        let fail = failed.then(|| (Instant::now(), &self.retry));
        let (settled, drained) = lock(&self.state).settle(msg_id, fail);
        if settled == Settled::Stale {
            self.stale_acks.inc();
        }
        if drained {
            self.drained.notify_one();
        }
    }

    fn close(&mut self) {
        self.cancel.cancel();
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

    fn open(&mut self, context: &TopologyContext) -> std::result::Result<(), ComponentError> {
        self.start(context).map_err(|e| Box::new(e) as ComponentError)
    }

    fn next_tuple(&mut self, out: &mut SpoutCollector<'_>) -> std::result::Result<(), ComponentError> {
        match &mut self.running {
            Some(r) => r.hot.next_tuple(out),
            None => Ok(()),
        }
    }

    fn ack(&mut self, msg_id: u64) {
        if let Some(r) = &mut self.running {
            r.settle(msg_id, false);
        }
    }

    fn fail(&mut self, msg_id: u64) {
        if let Some(r) = &mut self.running {
            r.settle(msg_id, true);
        }
    }

    fn deactivate(&mut self) {
        if let Some(r) = &self.running {
            let _ = r.requests.send(Request::Commit);
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

/// Partition counts from Kafka's metadata API, for topics not registered in ZooKeeper.
struct MetadataSource {
    consumer: Arc<TaskConsumer>,
}

impl std::fmt::Debug for MetadataSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MetadataSource")
    }
}

impl PartitionSource for MetadataSource {
    fn partitions<'a>(&'a self, topic: &'a Topic) -> BoxFuture<'a, SourcedPartitions> {
        let consumer = self.consumer.clone();
        let name = topic.to_string();
        Box::pin(async move {
            let metadata =
                tokio::task::spawn_blocking(move || consumer.fetch_metadata(Some(&name), CLIENT_TIMEOUT))
                    .await
                    .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)??;
            let Some(t) = metadata.topics().first() else { return Ok(None) };
            if t.error().is_some() || t.partitions().is_empty() {
                return Ok(None); // unknown topic (or not yet created)
            }
            let partitions = t.partitions().iter().filter_map(|p| Partition::new(p.id()).ok()).collect();
            Ok(Some(partitions))
        })
    }
}

/// The coordinator: one per task, on its own thread.
struct Coordinator {
    config: Arc<KafkaSpoutConfig>,
    component: String,
    task: u32,
    consumer: Arc<TaskConsumer>,
    state: Arc<Mutex<TaskState>>,
    drained: Arc<Notify>,
    handle: MemberHandle,
    metrics: SpoutMetrics,
    paused: prometheus::IntGauge,
    drain_timeout: Duration,
    /// Per partition: the last log-end offset seen and Burrow's window of commits.
    lag_windows: Mutex<HashMap<TopicPartition, (Option<i64>, LagWindow)>>,
}

impl Coordinator {
    async fn run(
        self: Arc<Self>,
        member: Member,
        mut events: mpsc::Receiver<MemberEvent>,
        mut requests: mpsc::UnboundedReceiver<Request>,
        cancel: CancellationToken,
    ) {
        let member_cancel = CancellationToken::new();
        let member_task = tokio::spawn(member.run(member_cancel.clone()));
        // Log-end offsets come from the broker (up to CLIENT_TIMEOUT per partition while it is
        // away): read them on a task of their own, so session events never wait behind them.
        let lag_cancel = cancel.child_token();
        let lag_task = tokio::spawn(self.clone().read_lag(lag_cancel.clone()));
        let period = Duration::from_millis(self.config.offsets_commit_interval_ms);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                event = events.recv() => match event {
                    Some(event) => self.on_event(event, Some(&cancel)).await,
                    None => break, // the member stopped (an error it logged)
                },
                request = requests.recv() => match request {
                    Some(Request::Commit) => self.commit_owned().await,
                    None => break,
                },
                _ = tick.tick() => self.commit_owned().await,
            }
        }
        lag_cancel.cancel();
        let _ = lag_task.await;
        // Shutdown: commit, then leave the group (the member hands every partition off through
        // Revoking events, which are acknowledged without waiting for tuples that will never
        // be acked now), then close the session.
        self.commit_owned().await;
        member_cancel.cancel();
        let leave = async {
            while let Some(event) = events.recv().await {
                self.on_event(event, None).await;
            }
        };
        if tokio::time::timeout(SHUTDOWN_TIMEOUT, leave).await.is_err() {
            tracing::warn!(component = %self.component, "leaving the consumer group took too long");
        }
        match tokio::time::timeout(Duration::from_secs(2), member_task).await {
            Ok(Ok(Err(e))) => {
                tracing::warn!(component = %self.component, error = %e, "consumer group member failed")
            }
            Ok(_) => {}
            Err(_) => {
                tracing::warn!(component = %self.component, "consumer group member did not stop in time")
            }
        }
    }

    /// `cancel`: the task is running (a revoke waits for in-flight tuples until it fires);
    /// `None` during shutdown (nothing more will be acked).
    async fn on_event(&self, event: MemberEvent, cancel: Option<&CancellationToken>) {
        match event {
            MemberEvent::Assigned { partitions, session } => {
                for tp in partitions {
                    self.assign(tp, session, cancel).await;
                }
            }
            MemberEvent::Revoking { partitions, ack } => {
                self.revoke(&partitions, cancel).await;
                ack.ack();
            }
            MemberEvent::Revoked { partitions } => {
                tracing::debug!(component = %self.component, ?partitions, "owner nodes released");
            }
            MemberEvent::Paused => {
                lock(&self.state).paused = true;
                self.paused.set(1);
                tracing::warn!(component = %self.component, "ZooKeeper disconnected: emitting nothing");
            }
            MemberEvent::Resumed => {
                lock(&self.state).paused = false;
                self.paused.set(0);
            }
            MemberEvent::Expired { partitions } => {
                // Others may own them now: stop, and never commit them.
                self.unassign(&partitions);
                let mut state = lock(&self.state);
                state.paused = false;
                self.paused.set(0);
                for tp in &partitions {
                    state.remove(tp);
                }
                drop(state);
                self.forget_group_gauges(&partitions);
            }
        }
    }

    fn unassign(&self, partitions: &BTreeSet<TopicPartition>) {
        let mut tpl = TopicPartitionList::new();
        for tp in partitions {
            tpl.add_partition(tp.topic.as_str(), tp.partition.get());
        }
        if let Err(e) = self.consumer.incremental_unassign(&tpl) {
            tracing::warn!(component = %self.component, error = %e, "unassigning partitions from the consumer");
        }
    }

    async fn watermarks(&self, tp: &TopicPartition) -> Result<(i64, i64)> {
        let consumer = self.consumer.clone();
        let (topic, partition) = (tp.topic.to_string(), tp.partition.get());
        let error = |source| Error::Partition {
            topic: tp.topic.to_string(),
            partition: tp.partition.get(),
            context: "reading watermarks",
            source,
        };
        tokio::task::spawn_blocking(move || consumer.fetch_watermarks(&topic, partition, CLIENT_TIMEOUT))
            .await
            .map_err(|_| error(KafkaError::Canceled))?
            .map_err(error)
    }

    /// The consumer-group labels of `tp`: group, topic, partition.
    fn metric_labels<R>(&self, tp: &TopicPartition, f: impl FnOnce(&[&str]) -> R) -> R {
        let partition = tp.partition.to_string();
        f(&[self.config.group_id.as_str(), tp.topic.as_str(), partition.as_str()])
    }

    /// Records a commit (`offset`) or a new log-end offset (`high`) of `tp` and sets Burrow's
    /// status of the partition.
    fn track_lag(&self, tp: &TopicPartition, offset: Option<i64>, high: Option<i64>) {
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let status = {
            let mut windows = self.lag_windows.lock().unwrap_or_else(PoisonError::into_inner);
            let (last_high, window) = windows.entry(tp.clone()).or_default();
            if high.is_some() {
                *last_high = high;
            }
            if let (Some(offset), Some(high)) = (offset, *last_high) {
                window.push(Commit { offset, lag: (high - offset).max(0), at_ms: now_ms });
            }
            window.status(now_ms)
        };
        self.metric_labels(tp, |l| self.metrics.lag_status.with_label_values(l).set(status.code()));
    }

    async fn assign(&self, tp: TopicPartition, session: SessionId, cancel: Option<&CancellationToken>) {
        let mut delay = Duration::from_millis(100);
        let mut attempt = 0;
        let start = loop {
            attempt += 1;
            match self.handle.offsets().start_position(&tp).await {
                Ok(position) => break position,
                Err(e) if attempt < START_ATTEMPTS && cancel.is_some_and(|c| !c.is_cancelled()) => {
                    tracing::warn!(component = %self.component, %tp, error = %e, "reading the start position; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    tracing::error!(component = %self.component, %tp, error = %e, "cannot start the partition; it stays idle until the next rebalance");
                    return;
                }
            }
        };
        // A committed offset the broker no longer has is found by the first fetch: librdkafka
        // resets it by auto.offset.reset and the first message shows it (counted there).
        // Watermarks are not asked: a ListOffsets answer may lag the log (tansu's does).
        let (offset, known) = match start {
            StartPosition::Committed(o) => (Offset::Offset(o), Some(o)),
            StartPosition::Reset(OffsetReset::Smallest) => (Offset::Beginning, None),
            StartPosition::Reset(OffsetReset::Largest) => (Offset::End, None),
        };
        {
            let mut state = lock(&self.state);
            if let Some(old) = state.remove(&tp) {
                tracing::debug!(component = %self.component, %tp, slot = old.slot, "replacing an earlier incarnation");
            }
            state.insert(tp.clone(), session, known, &self.metrics, &self.component);
        }
        if let Some(o) = known {
            self.metric_labels(&tp, |l| self.metrics.committed_offset.with_label_values(l).set(o));
        }
        let mut tpl = TopicPartitionList::new();
        let added = tpl.add_partition_offset(tp.topic.as_str(), tp.partition.get(), offset);
        if let Err(e) = added.and_then(|()| self.consumer.incremental_assign(&tpl)) {
            tracing::error!(component = %self.component, %tp, error = %e, "assigning the partition to the consumer");
            lock(&self.state).remove(&tp);
            return;
        }
        tracing::info!(component = %self.component, task = self.task, consumer = %self.handle.consumer_id(), %session, %tp, ?start, "consuming partition");
    }

    /// Stop emitting from `partitions`, wait for their in-flight tuples (bounded), commit
    /// them, and forget them.
    async fn revoke(&self, partitions: &BTreeSet<TopicPartition>, cancel: Option<&CancellationToken>) {
        {
            let mut state = lock(&self.state);
            for tp in partitions {
                if let Some(part) = state.get_mut(tp) {
                    part.emitting = false;
                }
            }
        }
        self.unassign(partitions);
        if let Some(cancel) = cancel {
            let deadline = tokio::time::Instant::now() + self.drain_timeout;
            loop {
                let notified = self.drained.notified();
                let in_flight = lock(&self.state).in_flight(partitions);
                if in_flight == 0 {
                    break;
                }
                tokio::select! {
                    () = notified => {}
                    () = cancel.cancelled() => break,
                    () = tokio::time::sleep_until(deadline) => {
                        tracing::warn!(component = %self.component, in_flight, "revoked partitions did not drain in time; committing what is acknowledged");
                        break;
                    }
                }
            }
        }
        let offsets: BTreeMap<TopicPartition, i64> = {
            let state = lock(&self.state);
            partitions
                .iter()
                .filter_map(|tp| state.get(tp).and_then(|p| p.offsets.commit_due()).map(|o| (tp.clone(), o)))
                .collect()
        };
        self.commit(offsets).await;
        let mut state = lock(&self.state);
        for tp in partitions {
            state.remove(tp);
        }
        drop(state);
        self.forget_group_gauges(partitions);
    }

    /// Drops the consumer-group gauges of partitions handed off: their new owner (maybe in
    /// another process) reports them from now on, and a frozen lag or status left here would
    /// show on dashboards next to the live one. Counters stay, as Prometheus counters do.
    fn forget_group_gauges(&self, partitions: &BTreeSet<TopicPartition>) {
        let mut windows = self.lag_windows.lock().unwrap_or_else(PoisonError::into_inner);
        for tp in partitions {
            windows.remove(tp);
            self.metric_labels(tp, |l| {
                for gauge in [
                    &self.metrics.committed_offset,
                    &self.metrics.log_end_offset,
                    &self.metrics.lag,
                    &self.metrics.lag_status,
                ] {
                    // Absent when the partition was never committed or measured here.
                    let _ = gauge.remove_label_values(l);
                }
            });
        }
    }

    /// Commits the safe offsets of the partitions this member owns (skipped while paused).
    async fn commit_owned(&self) {
        let ownership = self.handle.ownership();
        if ownership.paused {
            return;
        }
        let offsets: BTreeMap<TopicPartition, i64> = {
            let state = lock(&self.state);
            ownership
                .partitions
                .keys()
                .filter_map(|tp| state.get(tp).and_then(|p| p.offsets.commit_due()).map(|o| (tp.clone(), o)))
                .collect()
        };
        self.commit(offsets).await;
    }

    async fn commit(&self, offsets: BTreeMap<TopicPartition, i64>) {
        if offsets.is_empty() {
            return;
        }
        match self.handle.offsets().commit(&offsets).await {
            Ok(report) => {
                tracing::debug!(component = %self.component, written = report.written, "committed offsets");
                let mut state = lock(&self.state);
                for (tp, offset) in &offsets {
                    if let Some(part) = state.get_mut(tp) {
                        part.offsets.committed_at(*offset);
                    }
                    self.metric_labels(tp, |l| {
                        self.metrics.committed_offset.with_label_values(l).set(*offset)
                    });
                }
                for (tp, offset) in &offsets {
                    self.track_lag(tp, Some(*offset), None);
                }
            }
            Err(e) => {
                tracing::warn!(component = %self.component, error = %e, "committing offsets failed; the next commit retries")
            }
        }
    }

    /// Reads log-end offsets every commit interval until `cancel`.
    async fn read_lag(self: Arc<Self>, cancel: CancellationToken) {
        let period = Duration::from_millis(self.config.offsets_commit_interval_ms);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = self.update_lag() => {}
            }
        }
    }

    /// Log-end offsets and lag (one watermark request per owned partition).
    async fn update_lag(&self) {
        let owned: Vec<(TopicPartition, i64)> = {
            let state = lock(&self.state);
            state.parts.values().map(|p| (p.tp.clone(), p.offsets.committed())).collect()
        };
        for (tp, committed) in owned {
            if let Ok((_, high)) = self.watermarks(&tp).await {
                self.metric_labels(&tp, |l| {
                    self.metrics.log_end_offset.with_label_values(l).set(high);
                    self.metrics.lag.with_label_values(l).set((high - committed).max(0));
                });
                self.track_lag(&tp, None, Some(high));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn tp(topic: &str, partition: i32) -> TopicPartition {
        TopicPartition::new(Topic::new(topic).unwrap(), Partition::new(partition).unwrap())
    }

    /// What a test's `next_tuple` emitted.
    #[derive(Default)]
    struct Emitted(Vec<(Values, u64)>);

    impl Emit for Emitted {
        fn emit(&mut self, values: Values, msg_id: u64) -> std::result::Result<(), ComponentError> {
            self.0.push((values, msg_id));
            Ok(())
        }

        fn report_error(&mut self, error: String) {
            panic!("unexpected component error: {error}");
        }
    }

    /// Calls `next_tuple` until `out` holds `n` tuples (librdkafka fetches on its own threads,
    /// in real time), within ten seconds.
    fn emit_until(hot: &mut HotPath, out: &mut Emitted, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while out.0.len() < n {
            assert!(Instant::now() < deadline, "only {} of {n} tuples emitted", out.0.len());
            hot.next_tuple(out).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_emitted_once_the_clock_jumps_past_the_lease() {
        use rdkafka::mocking::MockCluster;
        use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};

        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic("t", 1, 1).unwrap();
        let producer: BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .create()
            .unwrap();
        for n in 0..200 {
            producer.send(BaseRecord::<str, str>::to("t").payload(&n.to_string()).partition(0)).unwrap();
        }
        producer.flush(Duration::from_secs(10)).unwrap();
        let config = KafkaSpoutConfig {
            bootstrap_servers: cluster.bootstrap_servers(),
            group_id: "g".into(),
            ..KafkaSpoutConfig::default()
        };
        let consumer: TaskConsumer = config
            .consumer_config()
            .create_with_context(SpoutContext { component: "spout".into(), task: 1 })
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("t", 0, Offset::Beginning).unwrap();
        consumer.assign(&tpl).unwrap();
        let metrics = SpoutMetrics::register(&prometheus::Registry::new()).unwrap();
        let (s1, s2) = (SessionId(1), SessionId(2));
        let state = Arc::new(Mutex::new(TaskState::default()));
        lock(&state).insert(tp("t", 0), s1, Some(0), &metrics, "spout");
        let bound = Duration::from_secs(4);
        let mut hot = HotPath {
            consumer: Arc::new(consumer),
            state,
            lease: Lease::granted(s1, LeaseInstant::now(), bound),
            emit_batch: 1,
            max_in_flight: 1000,
            max_pending: None,
        };
        let mut out = Emitted::default();
        emit_until(&mut hot, &mut out, 5);

        // The process stops (or stalls) for the whole lease between two calls: nothing more,
        // though librdkafka has the rest of the partition ready.
        tokio::time::advance(bound).await;
        let emitted = out.0.len();
        for _ in 0..100 {
            hot.next_tuple(&mut out).unwrap();
        }
        assert_eq!(out.0.len(), emitted, "emitted after the lease ran out");

        // Re-validated: emission goes on where it stopped, so the messages were there all along.
        hot.lease = Lease::granted(s1, LeaseInstant::now(), bound);
        emit_until(&mut hot, &mut out, emitted + 5);
        let offsets: Vec<i64> = out.0.iter().map(|(values, _)| values[2].as_int().unwrap()).collect();
        assert_eq!(offsets, (0..i64::try_from(out.0.len()).unwrap()).collect::<Vec<_>>());

        // A lease of a newer session does not cover a partition claimed in the old one (its
        // replacement starts over from the committed offset).
        hot.lease = Lease::granted(s2, LeaseInstant::now(), bound);
        let emitted = out.0.len();
        for _ in 0..100 {
            hot.next_tuple(&mut out).unwrap();
        }
        assert_eq!(out.0.len(), emitted, "emitted a partition claimed in an ended session");
    }

    #[test]
    fn acks_for_a_partition_given_up_or_reassigned_are_stale() {
        let metrics = SpoutMetrics::register(&prometheus::Registry::new()).unwrap();
        let policy = RetryPolicy::default();
        let mut state = TaskState::default();
        let p0 = tp("t", 0);
        let slot = state.insert(p0.clone(), SessionId(1), Some(100), &metrics, "spout");
        let part = state.get_mut(&p0).unwrap();
        for o in 100..103 {
            part.offsets.emit(o, Stored::new(None, None, None)).unwrap();
        }
        let id = |slot, offset| MsgId::new(slot, 100, offset).unwrap().encode();
        assert_eq!(state.settle(id(slot, 100), None), (Settled::Acked, false));
        assert_eq!(state.settle(id(slot, 100), None), (Settled::Stale, false), "acked twice");
        assert_eq!(state.settle(id(slot, 101), Some((Instant::now(), &policy))), (Settled::Retry, false));
        // Revoking: the last in-flight settles -> drained (101 awaits a replay, not in flight).
        state.get_mut(&p0).unwrap().emitting = false;
        assert_eq!(state.settle(id(slot, 102), None), (Settled::Acked, true));
        assert_eq!(state.get(&p0).unwrap().offsets.commit_due(), Some(101));
        // Given up, then assigned again: the old incarnation's ids are stale.
        state.remove(&p0);
        assert_eq!(state.settle(id(slot, 101), None), (Settled::Stale, false));
        let again = state.insert(p0.clone(), SessionId(1), Some(100), &metrics, "spout");
        assert_ne!(again, slot);
        state.get_mut(&p0).unwrap().offsets.emit(101, Stored::new(None, None, None)).unwrap();
        assert_eq!(state.settle(id(slot, 101), None), (Settled::Stale, false));
        assert_eq!(state.settle(id(again, 101), None), (Settled::Acked, false));
        // The broker moved the fetch position back: a new slot, the old ids are stale.
        state.get_mut(&p0).unwrap().offsets.emit(102, Stored::new(None, None, None)).unwrap();
        let rebased = state.rebase("t", 0, 100).unwrap();
        assert_ne!(rebased, again);
        assert_eq!((state.slot_of("t", 0), state.get(&p0).map(|p| p.slot)), (Some(rebased), Some(rebased)));
        assert_eq!(state.settle(id(again, 102), None), (Settled::Stale, false));
        state.get_mut(&p0).unwrap().offsets.emit(100, Stored::new(None, None, None)).unwrap();
        assert_eq!(state.settle(id(rebased, 100), None), (Settled::Acked, false));
        assert_eq!(state.rebase("t", 9, 0), None, "not owned");
        let stored = Stored::new(Some(b"k"), Some(b"value"), Some(7));
        let values = stored.values(&Value::from("t"), &Value::Int(0), 5);
        assert_eq!(values[3].as_bytes().map(|b| &b[..]), Some(&b"k"[..]));
        assert_eq!(values[4].as_bytes().map(|b| &b[..]), Some(&b"value"[..]));
        assert_eq!((values[2].as_int(), values[5].as_int()), (Some(5), Some(7)));
        let bare = Stored::new(None, Some(b""), None).values(&Value::Null, &Value::Null, 0);
        assert_eq!((bare[3].clone(), bare[4].as_bytes().map(|b| b.len())), (Value::Null, Some(0)));
        // Ids of unknown slots and garbage never panic.
        assert_eq!(state.settle(u64::MAX, None), (Settled::Stale, false));
        assert_eq!(state.settle(0, Some((Instant::now(), &policy))), (Settled::Stale, false));
        assert_eq!(metrics.acked.with_label_values(&["spout", "t", "0"]).get(), 4);
    }
}
