//! The registry side of a spout task, on a thread of its own with a current-thread runtime: runs
//! the consumer-registry member and acts on its events in order (assign at the committed
//! offset, drain and commit on revoke, pause, forget on expiry), commits every
//! `offsets.commit.interval.ms`, and reads log-end offsets for lag on a task of its own.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cluster_state::coord::SessionId;
use cluster_state::ids::{Partition, Topic};
use consumer_registry::lag::{Commit, LagWindow};
use consumer_registry::{
    Member, MemberEvent, MemberHandle, OffsetReset, PartitionSource, SourcedPartitions, StartPosition,
    TopicPartition,
};
use futures::future::BoxFuture;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::partitions::{TaskState, lock};
use super::{CLIENT_TIMEOUT, SHUTDOWN_TIMEOUT, START_ATTEMPTS};
use crate::config::{KafkaSpoutConfig, OffsetsStorage};
use crate::context::TaskConsumer;
use crate::error::{Error, Result};
use crate::group_offsets;
use crate::metrics::SpoutMetrics;

/// Requests from the executor thread to the coordinator.
#[derive(Debug)]
pub(super) enum Request {
    /// Leave the group (deactivate): stop emitting, wait for the tuples in flight (bounded by
    /// the message timeout), commit, then give every partition up and deregister, so that
    /// `/ids` and `/owners` no longer name this task and an operator may reset the offsets.
    Leave,
}

/// Partition counts from Kafka's metadata API, for topics not registered in ZooKeeper.
pub(super) struct MetadataSource {
    pub(super) consumer: Arc<TaskConsumer>,
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
pub(super) struct Coordinator {
    pub(super) config: Arc<KafkaSpoutConfig>,
    pub(super) component: String,
    pub(super) task: u32,
    pub(super) consumer: Arc<TaskConsumer>,
    pub(super) state: Arc<Mutex<TaskState>>,
    pub(super) drained: Arc<Notify>,
    pub(super) handle: MemberHandle,
    pub(super) metrics: SpoutMetrics,
    pub(super) paused: prometheus::IntGauge,
    pub(super) drain_timeout: Duration,
    /// How long leaving on deactivate waits for the tuples in flight: the message timeout,
    /// after which the executor has failed every one of them.
    pub(super) leave_timeout: Duration,
    /// Per partition: the last log-end offset seen and Burrow's window of commits.
    pub(super) lag_windows: Mutex<HashMap<TopicPartition, (Option<i64>, LagWindow)>>,
    /// `dual` only: offsets ZooKeeper has but whose commit to Kafka failed, retried with the
    /// next commit while the partition is still ours (with `kafka` alone, a failed commit
    /// leaves the offset due, so the next commit carries it anyway).
    pub(super) kafka_behind: Mutex<BTreeMap<TopicPartition, i64>>,
    /// Held by the commit to Kafka under way (until librdkafka answers, even past its
    /// timeout): commits to Kafka never run side by side, so they never reorder.
    pub(super) kafka_committing: Arc<tokio::sync::Mutex<()>>,
    /// Partitions owned (their owner nodes are ours) whose start failed: the committed offset
    /// could not be read, or librdkafka refused the assignment. Retried every
    /// [`START_RETRY`] until started, revoked or expired: a partition that stayed idle until
    /// the next rebalance would stay idle for good in a steady group.
    pub(super) unstarted: Mutex<BTreeMap<TopicPartition, SessionId>>,
}

/// How often the start of an owned partition that failed to start is tried again.
const START_RETRY: Duration = Duration::from_secs(1);

/// How a commit treats the Kafka side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kafka {
    /// On a task of its own (the periodic commit): the event loop goes on meanwhile.
    Background,
    /// Awaited, bounded by `CLIENT_TIMEOUT` (hand-off and shutdown: the next owner reads it).
    Wait,
}

impl Coordinator {
    pub(super) async fn run(
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
        let mut retry = tokio::time::interval_at(tokio::time::Instant::now() + START_RETRY, START_RETRY);
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut leaving = false;
        loop {
            let retrying = !self.unstarted().is_empty();
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                event = events.recv() => match event {
                    Some(event) => self.on_event(event, Some(&cancel)).await,
                    None => break, // the member stopped (an error it logged)
                },
                request = requests.recv() => match request {
                    Some(Request::Leave) => {
                        leaving = true;
                        break;
                    }
                    None => break,
                },
                _ = tick.tick() => self.commit_owned(Kafka::Background).await,
                _ = retry.tick(), if retrying => self.retry_unstarted(&cancel).await,
            }
        }
        lag_cancel.cancel();
        let _ = lag_task.await;
        if leaving {
            self.drain_everything(&cancel).await;
        }
        // Shutdown: commit, then leave the group (the member hands every partition off through
        // Revoking events, which are acknowledged without waiting for tuples that will never
        // be acked now), then close the session.
        self.commit_owned(Kafka::Wait).await;
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
    async fn on_event(self: &Arc<Self>, event: MemberEvent, cancel: Option<&CancellationToken>) {
        match event {
            MemberEvent::Assigned { partitions, session } => {
                // Kafka's offsets of the whole assignment in one request: a broker that does
                // not answer costs one timeout, not one per partition.
                let in_kafka = match self.config.offsets_storage.uses_kafka() {
                    true => Some(self.kafka_committed(partitions.iter().cloned().collect()).await),
                    false => None,
                };
                if let Some(Err(e)) = &in_kafka {
                    let then = match self.config.offsets_storage {
                        OffsetsStorage::Dual => "starting from ZooKeeper's",
                        _ => "reading them one by one",
                    };
                    tracing::warn!(component = %self.component, error = %e, "reading committed offsets from Kafka failed; {then}");
                }
                let in_kafka = in_kafka.and_then(Result::ok);
                for tp in partitions {
                    self.assign(tp, session, cancel, in_kafka.as_ref(), START_ATTEMPTS).await;
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
                self.unstarted().retain(|tp, _| !partitions.contains(tp));
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

    /// Stops fetching `partitions`, those still assigned to the consumer: a deactivation
    /// unassigns everything before the member's leave revokes it again.
    fn unassign(&self, partitions: &BTreeSet<TopicPartition>) {
        let assigned = self.consumer.assignment().ok();
        let mut tpl = TopicPartitionList::new();
        for tp in partitions {
            let (topic, partition) = (tp.topic.as_str(), tp.partition.get());
            if assigned.as_ref().is_none_or(|a| a.find_partition(topic, partition).is_some()) {
                tpl.add_partition(topic, partition);
            }
        }
        if tpl.count() == 0 {
            return;
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

    /// The owned partitions still to start.
    fn unstarted(&self) -> std::sync::MutexGuard<'_, BTreeMap<TopicPartition, SessionId>> {
        self.unstarted.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tries once more to start each owned partition whose start failed (see `unstarted`).
    async fn retry_unstarted(&self, cancel: &CancellationToken) {
        let due: Vec<(TopicPartition, SessionId)> =
            self.unstarted().iter().map(|(tp, session)| (tp.clone(), *session)).collect();
        let in_kafka = match self.config.offsets_storage.uses_kafka() {
            true => self.kafka_committed(due.iter().map(|(tp, _)| tp.clone()).collect()).await.ok(),
            false => None,
        };
        for (tp, session) in due {
            if cancel.is_cancelled() {
                return;
            }
            self.assign(tp, session, Some(cancel), in_kafka.as_ref(), 1).await;
        }
    }

    /// Starts consuming `tp`, owned in `session`, from its start position. `in_kafka`: the
    /// group's offsets in Kafka read for the assignment (`None`: not read, or the read
    /// failed). The start position is read up to `attempts` times; a partition that cannot
    /// be started is kept in `unstarted` and tried again every [`START_RETRY`].
    async fn assign(
        &self,
        tp: TopicPartition,
        session: SessionId,
        cancel: Option<&CancellationToken>,
        in_kafka: Option<&BTreeMap<TopicPartition, Option<i64>>>,
        attempts: u32,
    ) {
        let mut delay = Duration::from_millis(100);
        let mut attempt = 0;
        let start = loop {
            attempt += 1;
            match self.start_position(&tp, in_kafka).await {
                Ok(position) => break position,
                Err(e) if attempt < attempts && cancel.is_some_and(|c| !c.is_cancelled()) => {
                    tracing::warn!(component = %self.component, %tp, error = %e, "reading the start position; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    self.not_started(tp, session, cancel, &e.to_string());
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
        self.kafka_behind.lock().unwrap_or_else(PoisonError::into_inner).remove(&tp);
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
            lock(&self.state).remove(&tp);
            self.not_started(tp, session, cancel, &format!("assigning the partition to the consumer: {e}"));
            return;
        }
        if self.unstarted().remove(&tp).is_some() {
            tracing::info!(component = %self.component, %tp, "started at last after failed attempts");
        }
        tracing::info!(component = %self.component, task = self.task, consumer = %self.handle.consumer_id(), %session, %tp, ?start, "consuming partition");
    }

    /// `tp`, owned in `session`, could not be started: tried again every [`START_RETRY`]
    /// while the task runs (`cancel` is `None` during shutdown: then it is left).
    fn not_started(
        &self,
        tp: TopicPartition,
        session: SessionId,
        cancel: Option<&CancellationToken>,
        error: &str,
    ) {
        if cancel.is_none_or(CancellationToken::is_cancelled) {
            tracing::warn!(component = %self.component, %tp, error, "cannot start the partition; shutting down");
            return;
        }
        let first = self.unstarted().insert(tp.clone(), session).is_none();
        if first {
            tracing::error!(component = %self.component, %tp, error, "cannot start the partition; trying again every {} s while it is ours", START_RETRY.as_secs());
        } else {
            tracing::debug!(component = %self.component, %tp, error, "cannot start the partition yet");
        }
    }

    /// Stop emitting from `partitions`, wait for their in-flight tuples (bounded), commit
    /// them, and forget them.
    async fn revoke(
        self: &Arc<Self>,
        partitions: &BTreeSet<TopicPartition>,
        cancel: Option<&CancellationToken>,
    ) {
        self.unstarted().retain(|tp, _| !partitions.contains(tp));
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
                        let sample = lock(&self.state).in_flight_sample(partitions);
                        tracing::warn!(component = %self.component, in_flight, %sample, "revoked partitions did not drain in time; committing what is acknowledged");
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
        self.commit(offsets, Kafka::Wait).await;
        let mut state = lock(&self.state);
        for tp in partitions {
            state.remove(tp);
        }
        drop(state);
        self.forget_group_gauges(partitions);
    }

    /// Deactivation: stops emitting from every partition and waits until nothing is in flight,
    /// the leave timeout passes or the task is cancelled. Session events are not handled
    /// meanwhile: the lease still fences emission, and nothing is emitted anyway.
    async fn drain_everything(&self, cancel: &CancellationToken) {
        let owned: BTreeSet<TopicPartition> = {
            let mut state = lock(&self.state);
            for part in state.parts.values_mut() {
                part.emitting = false;
            }
            state.parts.values().map(|p| p.tp.clone()).collect()
        };
        self.unassign(&owned);
        let started = tokio::time::Instant::now();
        let deadline = started + self.leave_timeout;
        loop {
            let notified = self.drained.notified();
            let in_flight = lock(&self.state).in_flight(&owned);
            if in_flight == 0 {
                break;
            }
            tokio::select! {
                () = notified => {}
                // Acks arrive on the executor thread; `drained` fires only for a partition
                // whose last tuple settled, so look again now and then.
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
                () = cancel.cancelled() => break,
                () = tokio::time::sleep_until(deadline) => {
                    let sample = lock(&self.state).in_flight_sample(&owned);
                    tracing::warn!(component = %self.component, in_flight, %sample, "tuples in flight at deactivation did not complete in time; committing what is acknowledged");
                    break;
                }
            }
        }
        tracing::info!(component = %self.component, task = self.task, partitions = owned.len(), drained_in = ?started.elapsed(), "deactivated: leaving the consumer group");
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
    async fn commit_owned(self: &Arc<Self>, kafka: Kafka) {
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
        self.commit(offsets, kafka).await;
    }

    /// Commits `offsets` to the stores `offsets_storage` names: ZooKeeper through the
    /// registry, Kafka through the group coordinator (blocking, on its own thread, bounded by
    /// `CLIENT_TIMEOUT`; with [`Kafka::Background`] on a task of its own, so the event loop
    /// never waits for a broker). A store that fails never holds the other back; the partition
    /// counts as committed once its primary store has it (ZooKeeper, or Kafka with `kafka`).
    async fn commit(self: &Arc<Self>, offsets: BTreeMap<TopicPartition, i64>, kafka: Kafka) {
        let storage = self.config.offsets_storage;
        let kafka_retries = storage == OffsetsStorage::Dual
            && !self.kafka_behind.lock().unwrap_or_else(PoisonError::into_inner).is_empty();
        if offsets.is_empty() && !kafka_retries {
            return;
        }
        if storage.uses_zookeeper() && !offsets.is_empty() {
            match self.handle.offsets().commit(&offsets).await {
                Ok(report) => {
                    tracing::debug!(component = %self.component, written = report.written, "committed offsets to ZooKeeper");
                    self.committed(&offsets);
                }
                Err(e) => {
                    tracing::warn!(component = %self.component, error = %e, "committing offsets to ZooKeeper failed; the next commit retries")
                }
            }
        }
        if !storage.uses_kafka() {
            return;
        }
        let this = self.clone();
        let to_kafka = async move {
            if this.commit_to_kafka(&offsets, kafka).await && storage == OffsetsStorage::Kafka {
                this.committed(&offsets);
            }
        };
        match kafka {
            Kafka::Wait => to_kafka.await,
            Kafka::Background => drop(tokio::spawn(to_kafka)),
        }
    }

    /// `offsets` reached the group's primary store: the trackers and gauges of the partitions
    /// still ours say so.
    ///
    /// The gauges are set under the state lock: a partition handed off meanwhile is removed
    /// from the state before its gauges are forgotten, so a late commit cannot bring back a
    /// series its new owner now reports (lock order: state, then the lag windows).
    fn committed(&self, offsets: &BTreeMap<TopicPartition, i64>) {
        let mut state = lock(&self.state);
        for (tp, offset) in offsets {
            if let Some(part) = state.get_mut(tp) {
                part.offsets.committed_at(*offset);
                self.metric_labels(tp, |l| self.metrics.committed_offset.with_label_values(l).set(*offset));
                self.track_lag(tp, Some(*offset), None);
            }
        }
    }

    /// Commits `offsets`, and with `dual` those whose last commit to Kafka failed, to the
    /// group coordinator; whether it took them. One commit at a time: while one is under way
    /// (maybe blocked past its timeout) a background commit gives up at once and a waiting
    /// one waits for it, up to `CLIENT_TIMEOUT`. Failures are counted and logged, and with
    /// `dual` kept for the next commit.
    async fn commit_to_kafka(&self, offsets: &BTreeMap<TopicPartition, i64>, kafka: Kafka) -> bool {
        let dual = self.config.offsets_storage == OffsetsStorage::Dual;
        let turn = match kafka {
            Kafka::Background => self.kafka_committing.clone().try_lock_owned().ok(),
            Kafka::Wait => {
                tokio::time::timeout(CLIENT_TIMEOUT, self.kafka_committing.clone().lock_owned()).await.ok()
            }
        };
        let mut all = if dual {
            let behind =
                std::mem::take(&mut *self.kafka_behind.lock().unwrap_or_else(PoisonError::into_inner));
            // Only partitions still ours: another task commits the rest now.
            let state = lock(&self.state);
            behind.into_iter().filter(|(tp, _)| state.get(tp).is_some()).collect()
        } else {
            BTreeMap::new()
        };
        all.extend(offsets.iter().map(|(tp, o)| (tp.clone(), *o)));
        if all.is_empty() {
            return true;
        }
        let result = match turn {
            // The commit under way answers for the broker (its failure is counted); these
            // offsets go with a later commit.
            None => {
                tracing::debug!(component = %self.component, "a commit to Kafka is still under way; these offsets go with a later one");
                self.keep_behind(all);
                return false;
            }
            Some(turn) => {
                let consumer = self.consumer.clone();
                let offsets = all.clone();
                self.blocking("committing offsets to the group coordinator", move || {
                    let result = group_offsets::commit(&*consumer, &offsets);
                    drop(turn); // the next commit may start once librdkafka has answered
                    result
                })
                .await
            }
        };
        match result {
            Ok(()) => {
                tracing::debug!(component = %self.component, partitions = all.len(), "committed offsets to Kafka");
                true
            }
            Err(e) => {
                self.metrics
                    .kafka_offset_failures
                    .with_label_values(&[self.config.group_id.as_str(), "commit"])
                    .inc();
                tracing::warn!(component = %self.component, group = %self.config.group_id, error = %e, "committing offsets to Kafka failed; the next commit retries");
                self.keep_behind(all);
                false
            }
        }
    }

    /// With `dual`: offsets Kafka did not take, for the next commit (with `kafka` they are
    /// still due).
    fn keep_behind(&self, offsets: BTreeMap<TopicPartition, i64>) {
        if self.config.offsets_storage != OffsetsStorage::Dual {
            return;
        }
        let mut behind = self.kafka_behind.lock().unwrap_or_else(PoisonError::into_inner);
        for (tp, offset) in offsets {
            let kept = behind.entry(tp).or_insert(offset);
            *kept = (*kept).max(offset);
        }
    }

    /// Runs a blocking librdkafka call on tokio's blocking threads, waiting at most
    /// `CLIENT_TIMEOUT` for it (it may go on after that; its result is then dropped).
    async fn blocking<T: Send + 'static>(
        &self,
        context: &'static str,
        call: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let timed_out = || Error::TimedOut { context, after_ms: CLIENT_TIMEOUT.as_millis() as u64 };
        match tokio::time::timeout(CLIENT_TIMEOUT, tokio::task::spawn_blocking(call)).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Error::Client { context, source: KafkaError::Canceled }),
            Err(_) => Err(timed_out()),
        }
    }

    /// The group's offsets in Kafka for `partitions` (one request, bounded by
    /// `CLIENT_TIMEOUT`); a failure is counted.
    async fn kafka_committed(
        &self,
        partitions: Vec<TopicPartition>,
    ) -> Result<BTreeMap<TopicPartition, Option<i64>>> {
        let consumer = self.consumer.clone();
        let read = self
            .blocking("reading offsets from the group coordinator", move || {
                group_offsets::committed(&*consumer, &partitions, CLIENT_TIMEOUT)
            })
            .await;
        if read.is_err() {
            self.metrics
                .kafka_offset_failures
                .with_label_values(&[self.config.group_id.as_str(), "fetch"])
                .inc();
        }
        read
    }

    /// Where `tp` starts: [`group_offsets::start_position`] over the stores
    /// `offsets_storage` names, with Kafka's offset from `in_kafka` when it was read for the
    /// assignment. With `dual`, a coordinator that did not answer leaves ZooKeeper's offset
    /// (counted and logged): a broker outage never keeps a partition idle that ZooKeeper can
    /// start (Kafka's offset can only be ahead, so at most messages are delivered again). With
    /// `kafka` the read is tried again (the caller retries a failure).
    async fn start_position(
        &self,
        tp: &TopicPartition,
        in_kafka: Option<&BTreeMap<TopicPartition, Option<i64>>>,
    ) -> Result<StartPosition> {
        let storage = self.config.offsets_storage;
        let zookeeper = match storage.uses_zookeeper() {
            true => Some(self.handle.offsets().start_position(tp).await?),
            false => None,
        };
        let kafka = match (storage, in_kafka.and_then(|read| read.get(tp))) {
            (OffsetsStorage::Zookeeper, _) => None,
            (_, Some(read)) => *read,
            // The read for the assignment failed: ZooKeeper's offset will do.
            (OffsetsStorage::Dual, None) => None,
            (OffsetsStorage::Kafka, None) => {
                self.kafka_committed(vec![tp.clone()]).await?.get(tp).copied().flatten()
            }
        };
        Ok(group_offsets::start_position(storage, zookeeper, kafka, self.config.auto_offset_reset))
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
        let owned: Vec<TopicPartition> = lock(&self.state).parts.values().map(|p| p.tp.clone()).collect();
        for tp in owned {
            if let Ok((_, high)) = self.watermarks(&tp).await {
                // Still ours? The watermark request may outlast a hand-off, whose gauges are
                // gone and must stay gone (see `committed` for the lock order).
                let state = lock(&self.state);
                let Some(committed) = state.get(&tp).map(|p| p.offsets.committed()) else { continue };
                self.metric_labels(&tp, |l| {
                    self.metrics.log_end_offset.with_label_values(l).set(high);
                    self.metrics.lag.with_label_values(l).set((high - committed).max(0));
                });
                self.track_lag(&tp, None, Some(high));
            }
        }
    }
}
