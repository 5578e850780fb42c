//! The executor thread's emitting side: polls librdkafka and emits replays and new messages, in
//! batches, only while the ownership lease allows (consumer-registry's `lease.rs`).

use std::time::Instant;

use cluster_state::coord::{LeaseInstant, SessionId};
use consumer_registry::Lease;
use rdkafka::types::RDKafkaErrorCode;
use std::sync::{Arc, Mutex};
use worker::{ComponentError, SpoutCollector, Values};

use super::fetch::Fetcher;
use super::partitions::{Stored, TaskState, lock};
use crate::offsets::{MsgId, PartitionOffsets};

/// The executor thread's emitting side: fetches from librdkafka a batch at a time and emits,
/// only while the ownership lease allows.
pub(super) struct HotPath {
    pub(super) fetcher: Fetcher,
    pub(super) state: Arc<Mutex<TaskState>>,
    pub(super) lease: Lease,
    pub(super) emit_batch: usize,
    pub(super) max_in_flight: usize,
    pub(super) max_pending: Option<usize>,
    /// The topic, when the spout reads only one: every message is of it, so its name is not
    /// asked of librdkafka per message (a C string converted and validated: 8% of the spout
    /// thread in the throughput bench).
    pub(super) only_topic: Option<String>,
}

/// Where `next_tuple` puts its tuples: the executor's collector, or a test's list.
pub(super) trait Emit {
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

impl HotPath {
    pub(super) fn next_tuple(&mut self, out: &mut impl Emit) -> std::result::Result<(), ComponentError> {
        // librdkafka's log lines and client errors, served on every call as `poll` served
        // them between messages.
        self.fetcher.serve_events(|e| out.report_error(format!("kafka consumer: {e}")));
        // The fence (consumer-registry's lease.rs): one clock read per batch. A process that
        // was stopped past the lease finds it over here, before it polls anything.
        let Some(session) = self.lease.valid_session(LeaseInstant::now()) else { return Ok(()) };
        let mut state = lock(&self.state);
        if state.paused {
            return Ok(());
        }
        // The executor checks `topology.max.spout.pending` before each call; a batch must not
        // overshoot it by more than itself.
        let budget = self.max_pending.map_or(self.emit_batch, |max| self.emit_batch.min(max.max(1)));
        let only_topic = self.only_topic.as_deref();
        let result =
            emit_batch(&mut self.fetcher, only_topic, budget, self.max_in_flight, &mut state, session, out);
        // The emitted counters move once per batch: an atomic add per message drained the
        // store buffer (the message's deque entry and tuple) on the spout thread's path.
        for part in state.parts.values_mut() {
            part.report_emitted();
        }
        result
    }
}

// Over 100 lines on purpose: the spout's per-message path (replays, then fetched messages,
// with the out-of-range resets librdkafka reports) in one frame under one lock, which the
// throughput benchmark measures; `Stored`, `MsgId` and `PartitionOffsets` hold the logic.
fn emit_batch(
    fetcher: &mut Fetcher,
    only_topic: Option<&str>,
    mut budget: usize,
    max_in_flight: usize,
    state: &mut TaskState,
    session: SessionId,
    out: &mut impl Emit,
) -> std::result::Result<(), ComponentError> {
    // Every message in flight is kept for its replay: new ones are bounded (and with them
    // the memory); replays of those already kept are not, or a full window of failures
    // could never drain.
    let in_flight: usize = state.parts.values().map(|p| p.offsets.outstanding()).sum();
    let mut room = max_in_flight.saturating_sub(in_flight);
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
    // A batch taken from librdkafka is gone from its queue: every message of it is tracked
    // and emitted even after an emit failed (the first failure is returned at the end), or
    // the offsets after it would be skipped as if compacted.
    let mut failed = None;
    let mut consumer_error = false;
    while budget > 0 && room > 0 && !consumer_error {
        // At most what may be emitted: every message of the batch is.
        let batch = fetcher.fetch(budget.min(room));
        if batch.is_empty() {
            break;
        }
        for message in batch.iter() {
            match message.error() {
                None => {}
                Some(RDKafkaErrorCode::AutoOffsetReset) => {
                    // Which partition is checked by its next message's offset.
                    state.resets_pending = state.resets_pending.saturating_add(1).min(1024);
                    continue;
                }
                Some(RDKafkaErrorCode::PartitionEOF) => continue,
                Some(code) => {
                    out.report_error(format!(
                        "kafka consumer: {}/{}: {code}: {}",
                        message.topic(),
                        message.partition(),
                        message.error_text()
                    ));
                    // The rest of this batch is still emitted; the next waits for the next call.
                    consumer_error = true;
                    continue;
                }
            }
            let offset = message.offset();
            let (topic, partition) = (only_topic.unwrap_or_else(|| message.topic()), message.partition());
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
                    "kafka {topic}/{partition}: offset {offset} is 2^48 past the assignment's start; reassign to go on"
                ));
                continue;
            };
            let stored = Stored::new(message.key(), message.payload(), message.timestamp_ms());
            let values = stored.values(&part.topic_value, &part.partition_value, offset);
            if part.offsets.emit(offset, stored).is_err() {
                continue;
            }
            part.emitted_unreported += 1;
            budget = budget.saturating_sub(1);
            room = room.saturating_sub(1);
            if let Err(e) = out.emit(values, id.encode()) {
                failed.get_or_insert(e);
            }
        }
    }
    failed.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::config::KafkaSpoutConfig;
    use crate::context::{SpoutContext, TaskConsumer};
    use crate::metrics::SpoutMetrics;
    use cluster_state::ids::{Partition, Topic};
    use consumer_registry::TopicPartition;
    use rdkafka::consumer::Consumer as _;
    use rdkafka::{Offset, TopicPartitionList};
    use std::time::Duration;

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
            fetcher: Fetcher::new(Arc::new(consumer), 64).unwrap(),
            state,
            lease: Lease::granted(s1, LeaseInstant::now(), bound),
            emit_batch: 1,
            max_in_flight: 1000,
            max_pending: None,
            only_topic: None,
        };
        let mut out = Emitted::default();
        emit_until(&mut hot, &mut out, 5);
        // Counted per batch, and every batch's count reported before the call returns.
        let emitted_total = metrics.emitted.with_label_values(&["spout", "t", "0"]);
        assert_eq!(emitted_total.get(), out.0.len() as u64);

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

    /// A hot path over `partitions` partitions of topic `t` on a mock cluster, each holding
    /// `per_partition` messages keyed `k{partition}-{n}` with value `{n}`, assigned from the
    /// beginning (consumer `librdkafka` settings added), emitting up to `emit_batch` per call.
    fn hot_path_over(
        cluster: &rdkafka::mocking::MockCluster<'_, rdkafka::producer::DefaultProducerContext>,
        partitions: i32,
        per_partition: usize,
        emit_batch: usize,
        librdkafka: &[(&str, &str)],
    ) -> (HotPath, Arc<Mutex<TaskState>>) {
        use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};

        cluster.create_topic("t", partitions, 1).unwrap();
        let producer: BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .create()
            .unwrap();
        for n in 0..per_partition {
            for p in 0..partitions {
                let (key, value) = (format!("k{p}-{n}"), n.to_string());
                producer.send(BaseRecord::to("t").key(&key).payload(&value).partition(p)).unwrap();
            }
        }
        producer.flush(Duration::from_secs(10)).unwrap();
        let mut config = KafkaSpoutConfig {
            bootstrap_servers: cluster.bootstrap_servers(),
            group_id: "g".into(),
            ..KafkaSpoutConfig::default()
        };
        for (k, v) in librdkafka {
            config.librdkafka.insert((*k).into(), (*v).into());
        }
        let consumer: TaskConsumer = config
            .consumer_config()
            .create_with_context(SpoutContext { component: "spout".into(), task: 1 })
            .unwrap();
        let metrics = SpoutMetrics::register(&prometheus::Registry::new()).unwrap();
        let state = Arc::new(Mutex::new(TaskState::default()));
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset("t", p, Offset::Beginning).unwrap();
            lock(&state).insert(tp("t", p), SessionId(1), Some(0), &metrics, "spout");
        }
        consumer.assign(&tpl).unwrap();
        let hot = HotPath {
            fetcher: Fetcher::new(Arc::new(consumer), emit_batch).unwrap(),
            state: state.clone(),
            lease: Lease::granted(SessionId(1), LeaseInstant::now(), Duration::from_secs(3600)),
            emit_batch,
            max_in_flight: 100_000,
            max_pending: None,
            only_topic: None,
        };
        (hot, state)
    }

    /// (partition, offset, key, value) of an emitted tuple.
    fn fields(values: &Values) -> (i64, i64, String, String) {
        let text = |v: &worker::Value| String::from_utf8(v.as_bytes().unwrap().to_vec()).unwrap();
        (values[1].as_int().unwrap(), values[2].as_int().unwrap(), text(&values[3]), text(&values[4]))
    }

    #[test]
    fn batches_across_partitions_and_their_ends_emit_every_message_once_in_order() {
        let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
        // Partition ends come as consumer errors inside the batches.
        let (mut hot, state) = hot_path_over(&cluster, 3, 50, 16, &[("enable.partition.eof", "true")]);
        let mut out = Emitted::default();
        emit_until(&mut hot, &mut out, 150);
        let mut seen = std::collections::BTreeMap::<i64, Vec<i64>>::new();
        for (values, id) in &out.0 {
            let (partition, offset, key, value) = fields(values);
            assert_eq!((key, value), (format!("k{partition}-{offset}"), offset.to_string()));
            assert!(values[5].as_int().is_some(), "a timestamp");
            let slot = lock(&state).slot_of("t", i32::try_from(partition).unwrap()).unwrap();
            assert_eq!(*id, MsgId::new(slot, 0, offset).unwrap().encode());
            seen.entry(partition).or_default().push(offset);
        }
        for p in 0..3 {
            assert_eq!(seen.get(&p), Some(&(0..50).collect::<Vec<i64>>()), "partition {p}");
        }
        let outstanding: usize = lock(&state).parts.values().map(|p| p.offsets.outstanding()).sum();
        assert_eq!(outstanding, 150);
    }

    /// Fails its `fail_at`-th emit.
    struct FailingOnce {
        emitted: Emitted,
        calls: usize,
        fail_at: usize,
    }

    impl Emit for FailingOnce {
        fn emit(&mut self, values: Values, msg_id: u64) -> std::result::Result<(), ComponentError> {
            self.calls += 1;
            if self.calls == self.fail_at {
                return Err("the executor refused a tuple".into());
            }
            self.emitted.emit(values, msg_id)
        }

        fn report_error(&mut self, error: String) {
            panic!("unexpected component error: {error}");
        }
    }

    #[test]
    fn a_failed_emit_loses_none_of_the_batch_taken_from_librdkafka() {
        let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
        let (mut hot, state) = hot_path_over(&cluster, 1, 20, 64, &[]);
        let mut out = FailingOnce { emitted: Emitted::default(), calls: 0, fail_at: 3 };
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut errors = 0;
        while out.calls < 20 {
            assert!(Instant::now() < deadline, "only {} of 20 tuples offered", out.calls);
            errors += usize::from(hot.next_tuple(&mut out).is_err());
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(errors, 1, "the failure is returned once");
        let offsets: Vec<i64> = out.emitted.0.iter().map(|(v, _)| fields(v).1).collect();
        assert_eq!(offsets, (0..20).filter(|&o| o != 2).collect::<Vec<_>>(), "the rest of the batch went on");
        // Every offset taken is tracked, the refused one too: its commit waits for it (it is
        // never acked) rather than skipping it as if compacted.
        let state = lock(&state);
        let part = state.parts.values().next().unwrap();
        assert_eq!(
            (part.offsets.outstanding(), part.offsets.next(), part.offsets.safe_offset()),
            (20, 20, 0)
        );
    }
}
