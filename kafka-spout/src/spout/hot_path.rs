//! The executor thread's emitting side: polls librdkafka and emits replays and new messages, in
//! batches, only while the ownership lease allows (consumer-registry's `lease.rs`).

use std::time::Instant;

use cluster_state::coord::{LeaseInstant, SessionId};
use consumer_registry::Lease;
use rdkafka::types::RDKafkaErrorCode;
use std::sync::{Arc, Mutex};
use worker::{ComponentError, SpoutCollector, Values};

use super::fetch::{Batch, Fetcher};
use super::partitions::{REFETCHES, Stored, TaskState, lock};
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
        // The fence (consumer-registry's lease.rs): one clock read per batch, and one after
        // each fetch (`Fence::holds`). A process that was stopped past the lease finds it over
        // here, before it polls anything.
        let Some(session) = self.lease.valid_session(LeaseInstant::now()) else { return Ok(()) };
        let mut state = lock(&self.state);
        if state.paused {
            return Ok(());
        }
        // The executor checks `topology.max.spout.pending` before each call; a batch must not
        // overshoot it by more than itself.
        let budget = self.max_pending.map_or(self.emit_batch, |max| self.emit_batch.min(max.max(1)));
        let only_topic = self.only_topic.as_deref();
        let fence = Fence { lease: &self.lease, session };
        let result =
            emit_batch(&mut self.fetcher, only_topic, budget, self.max_in_flight, &mut state, fence, out);
        // The emitted counters move once per batch: an atomic add per message drained the
        // store buffer (the message's deque entry and tuple) on the spout thread's path.
        for part in state.parts.values_mut() {
            part.report_emitted();
        }
        result
    }
}

/// The lease as one call of `next_tuple` found it valid: for `session`.
#[derive(Clone, Copy)]
struct Fence<'a> {
    lease: &'a Lease,
    session: SessionId,
}

impl Fence<'_> {
    /// The lease still holds for the session the call started in (one clock read).
    fn holds(self) -> bool {
        self.lease.valid_session(LeaseInstant::now()) == Some(self.session)
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
    fence: Fence<'_>,
    out: &mut impl Emit,
) -> std::result::Result<(), ComponentError> {
    let session = fence.session;
    if state.rewinds_pending {
        // A seek that failed when its batch was given back: nothing of those partitions is
        // emitted until it is done (`rewind_to` fences them meanwhile).
        if let Some(e) = rewind(fetcher, state) {
            tracing::debug!(error = %e, "seeking back after a batch given back; retried on the next call");
        }
    }
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
        // The fence again, for what this fetch returned. The check before the call does not
        // cover it: a process stopped after that clock read (SIGSTOP, a stall) and continued
        // past the lease fetches here what was produced meanwhile, as librdkafka's threads
        // continued too. Such a batch is given back unemitted: its partitions seek back, and
        // are emitted from again only under a lease that was renewed after the stop.
        if !fence.holds() {
            give_back(&batch, state);
            drop(batch);
            if let Some(e) = rewind(fetcher, state) {
                out.report_error(e);
            }
            break;
        }
        for message in batch.iter() {
            match message.error() {
                None => {}
                Some(RDKafkaErrorCode::AutoOffsetReset) => {
                    state.reset_reported();
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
            if !part.emitting || part.session != session || part.rewind_to.is_some() {
                // Being revoked, or claimed in an ended session (its replacement starts over
                // from the committed offset), or still to seek back to a batch given back.
                continue;
            }
            if part.seek_again(offset) {
                tracing::warn!(%topic, partition, at = offset, "the fetch resumed past a seek back (librdkafka dropped it); seeking again");
                state.rewinds_pending = true;
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
                let next = part.offsets.next();
                if let Some(attempt) = part.refetch_instead_of_reset() {
                    tracing::warn!(%topic, partition, at = next, reset_to = offset, attempt, of = REFETCHES, "offset out of range at an offset the broker has just served up to; fetching from it again instead of resetting");
                    state.resets_pending = resets_pending.saturating_sub(1);
                    state.rewinds_pending = true;
                    continue;
                }
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
            } else if offset > part.offsets.next() {
                // Compaction and transaction markers leave gaps; so would a broker or a lost
                // seek that skipped messages. Counted, so a loss shows where it happened.
                let next = part.offsets.next();
                part.skipped.inc_by(offset.abs_diff(next));
                tracing::debug!(%topic, partition, from = next, to = offset, "offsets passed over by the fetch");
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

/// Marks where each partition of a batch fetched but not emitted must be read again from: its
/// first message's offset (or earlier, if an earlier batch was given back too). Offset resets
/// librdkafka reported in it are counted as if the batch had been read. Each partition in it
/// counts one fetch given back (`squall_spout_fetches_given_back_total`).
fn give_back(batch: &Batch<'_>, state: &mut TaskState) {
    let mut counted: Option<u16> = None;
    for message in batch.iter() {
        if let Some(code) = message.error() {
            if code == RDKafkaErrorCode::AutoOffsetReset {
                state.reset_reported();
            }
            continue;
        }
        let Some(slot) = state.slot_of(message.topic(), message.partition()) else { continue };
        let Some(part) = state.parts.get_mut(&slot) else { continue };
        if counted != Some(slot) {
            // librdkafka hands a batch out a partition at a time: a repeat is rare, and
            // counting it twice harmless.
            counted = Some(slot);
            part.given_back.inc();
        }
        if part.emitting {
            let offset = message.offset();
            part.rewind_to_at_most(offset);
            // A message was fetched there: the partition's next one must be there again.
            part.sought_to = Some(part.sought_to.map_or((offset, 0), |(o, n)| (o.min(offset), n)));
            state.rewinds_pending = true;
        }
    }
}

/// Seeks every partition marked by [`give_back`] back to its offset (a partition being revoked
/// is only unmarked). A seek librdkafka refuses stays marked, and its partition fenced, until a
/// later call's seek succeeds or a new incarnation replaces it; the first such error is
/// returned.
fn rewind(fetcher: &Fetcher, state: &mut TaskState) -> Option<String> {
    let mut first_error = None;
    let mut pending = false;
    for part in state.parts.values_mut() {
        let Some(offset) = part.rewind_to else { continue };
        if !part.emitting {
            // Being revoked: nothing more is emitted from it, and librdkafka may have
            // unassigned it already (a seek would fail until the coordinator forgets it).
            part.rewind_to = None;
            continue;
        }
        match fetcher.seek(part.tp.topic.as_str(), part.tp.partition.get(), offset) {
            Ok(()) => part.rewind_to = None,
            Err(e) => {
                pending = true;
                first_error.get_or_insert_with(|| {
                    format!("kafka {}: seeking back to offset {offset} after the lease ran out: {e}", part.tp)
                });
            }
        }
    }
    state.rewinds_pending = pending;
    first_error
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

    /// Emits into a list after `before(n)` for the `n`-th emit (from 1) let it: an error from
    /// `before` refuses the tuple.
    struct Hooked<F> {
        emitted: Emitted,
        calls: usize,
        before: F,
    }

    impl<F: FnMut(usize) -> std::result::Result<(), ComponentError>> Hooked<F> {
        fn new(before: F) -> Self {
            Hooked { emitted: Emitted::default(), calls: 0, before }
        }
    }

    impl<F: FnMut(usize) -> std::result::Result<(), ComponentError>> Emit for Hooked<F> {
        fn emit(&mut self, values: Values, msg_id: u64) -> std::result::Result<(), ComponentError> {
            self.calls += 1;
            (self.before)(self.calls)?;
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
        // Its third emit fails.
        let mut out =
            Hooked::new(|n| if n == 3 { Err("the executor refused a tuple".into()) } else { Ok(()) });
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

    /// One call under a lease renewed before it (as the keeper renews a lease it re-validated)
    /// that ends at the call's first emit: the process stopped (or stalled) past the lease
    /// right after the call's check. What the call emitted.
    fn call_losing_the_lease(hot: &mut HotPath) -> Emitted {
        hot.lease = Lease::granted(SessionId(1), LeaseInstant::now(), Duration::from_secs(3600));
        let lease = hot.lease.clone();
        let mut out = Hooked::new(move |_| {
            lease.end();
            Ok(())
        });
        hot.next_tuple(&mut out).unwrap();
        out.emitted
    }

    /// issue 12's pause, inside one call: the lease held when the call began and ran out
    /// while it emitted. What the call fetched after that is given back, not emitted, and read
    /// again once the lease is renewed: nothing is skipped or emitted twice.
    #[test]
    fn a_batch_fetched_after_the_lease_ran_out_mid_call_is_given_back_and_read_again() {
        let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
        // librdkafka hands out 4 messages per fetch; a call may emit 64. A partition sought back
        // is read again by librdkafka's next fetch request, which a short wait sends sooner.
        let (mut hot, state) = hot_path_over(&cluster, 2, 100, 4, &[("fetch.wait.max.ms", "10")]);
        hot.emit_batch = 64;
        let mut emitted = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while emitted.len() < 200 {
            assert!(Instant::now() < deadline, "only {} of 200 tuples emitted", emitted.len());
            let out = call_losing_the_lease(&mut hot);
            let n = out.0.len();
            assert!(n <= 4, "{n} tuples emitted in one call: only the fetch before the lease ran out may be");
            emitted.extend(out.0.iter().map(|(values, _)| fields(values)));
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut seen = std::collections::BTreeMap::<i64, Vec<i64>>::new();
        for (partition, offset, key, _) in &emitted {
            assert_eq!(*key, format!("k{partition}-{offset}"));
            seen.entry(*partition).or_default().push(*offset);
        }
        for p in 0..2 {
            assert_eq!(seen.get(&p), Some(&(0..100).collect::<Vec<i64>>()), "partition {p}");
        }
        let state = lock(&state);
        let given_back: u64 = state.parts.values().map(|p| p.given_back.get()).sum();
        assert!(given_back > 0, "no batch was given back: the test proved nothing");
        assert!(!state.rewinds_pending && state.parts.values().all(|p| p.rewind_to.is_none()));
        let skipped: u64 = state.parts.values().map(|p| p.skipped.get()).sum();
        assert_eq!(skipped, 0, "a seek back after a batch given back passed over offsets");
    }

    /// A seek back after a batch given back that librdkafka accepted but dropped (its seek
    /// without a timeout is asynchronous): the fetch resumes past the batch, and the spout
    /// seeks again instead of emitting past offsets it had fetched. Nothing is skipped.
    #[test]
    fn a_seek_back_the_fetch_resumed_past_is_sought_again() {
        let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
        let (mut hot, state) = hot_path_over(&cluster, 1, 100, 4, &[("fetch.wait.max.ms", "10")]);
        hot.emit_batch = 64;
        let mut emitted = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        // The lease ends at each call's first emit until a fetch after it is given back.
        let sought_to = loop {
            assert!(Instant::now() < deadline, "no batch was given back");
            let out = call_losing_the_lease(&mut hot);
            emitted.extend(out.0.iter().map(|(values, _)| fields(values).1));
            let state = lock(&state);
            let part = state.parts.values().next().unwrap();
            if let Some((to, _)) = part.sought_to {
                assert!(part.rewind_to.is_none(), "the seek back was refused");
                break to;
            }
            drop(state);
            std::thread::sleep(Duration::from_millis(2));
        };
        // librdkafka drops the seek back: the fetch goes on past the batch given back.
        hot.fetcher.seek("t", 0, sought_to + 2).unwrap();
        hot.lease = Lease::granted(SessionId(1), LeaseInstant::now(), Duration::from_secs(3600));
        let mut out = Emitted::default();
        let deadline = Instant::now() + Duration::from_secs(20);
        // Until the last offset: what was passed over shows in the comparison below.
        while !out.0.iter().any(|(values, _)| fields(values).1 == 99) {
            assert!(Instant::now() < deadline, "only {} of 100 emitted", emitted.len() + out.0.len());
            hot.next_tuple(&mut out).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
        emitted.extend(out.0.iter().map(|(values, _)| fields(values).1));
        assert_eq!(emitted, (0..100).collect::<Vec<i64>>(), "every offset once, in order");
        let state = lock(&state);
        let part = state.parts.values().next().unwrap();
        assert_eq!(part.skipped.get(), 0, "offsets fetched before were passed over");
        assert!(part.seeks_repeated.get() >= 1, "the dropped seek was not noticed: the test proved nothing");
    }

    /// Offsets the fetch passes over (compaction, transaction markers, a broker that lost
    /// them) are emitted past, as a Kafka consumer does, and counted: a loss shows where.
    #[test]
    fn offsets_the_fetch_passes_over_are_counted() {
        let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
        let (mut hot, state) = hot_path_over(&cluster, 2, 50, 16, &[]);
        // Partition 0 starts at 0 for the spout, but the broker's next message is 5: as if
        // 0..5 were compacted away.
        hot.fetcher.seek("t", 0, 5).unwrap();
        let mut out = Emitted::default();
        emit_until(&mut hot, &mut out, 95);
        let mut seen = std::collections::BTreeMap::<i64, Vec<i64>>::new();
        for (values, _) in &out.0 {
            let (partition, offset, _, _) = fields(values);
            seen.entry(partition).or_default().push(offset);
        }
        assert_eq!(seen.get(&0), Some(&(5..50).collect::<Vec<i64>>()));
        assert_eq!(seen.get(&1), Some(&(0..50).collect::<Vec<i64>>()));
        let state = lock(&state);
        let skipped = |p| state.get(&tp("t", p)).map(|part| part.skipped.get());
        assert_eq!((skipped(0), skipped(1)), (Some(5), Some(0)));
        // The commit passes over them as over acked offsets once 5.. are acked.
        assert_eq!(state.get(&tp("t", 0)).map(|part| part.offsets.next()), Some(50));
    }
}
