//! A spout task's partitions: one incarnation per assignment (its slot), with its offsets and
//! the messages kept for replay. The executor thread (emit, settle) and the coordinator
//! (assign, revoke, commit) share them behind one mutex, taken once per batch or ack.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use bytes::Bytes;
use cluster_state::coord::SessionId;
use consumer_registry::TopicPartition;
use prometheus::IntCounter;
use worker::{Value, Values};

use crate::metrics::SpoutMetrics;
use crate::offsets::{FailOutcome, MsgId, PartitionOffsets, RetryPolicy};

/// One partition incarnation's state.
#[derive(Debug)]
pub(super) struct PartState {
    pub(super) tp: TopicPartition,
    /// The registry session that claimed it: it is emitted from only while the lease is this
    /// session's.
    pub(super) session: SessionId,
    pub(super) slot: u16,
    pub(super) base: i64,
    /// False until the first message when started by `auto.offset.reset` (the broker knows
    /// the offset, we do not): `base` and `offsets` are set from that message.
    pub(super) started: bool,
    /// False once a revoke started: nothing more is emitted from it.
    pub(super) emitting: bool,
    /// Set when messages fetched from it were given back unemitted because the lease ran out
    /// during the call: librdkafka's fetch position must go back to this offset (a seek)
    /// before anything more is emitted from it, or those messages would be skipped.
    pub(super) rewind_to: Option<i64>,
    /// Where the partition's next message must be after a batch of it was given back (the
    /// batch's first offset: a message was fetched there), and how many times the seek back
    /// was repeated. librdkafka's seek without a timeout is asynchronous and reports nothing
    /// when it is dropped (a partition not fetching at that moment, say): a next message past
    /// this offset means it was, and the partition seeks again ([`PartState::seek_again`]).
    pub(super) sought_to: Option<(i64, u8)>,
    /// The offset an out-of-range answer came at, and how many times in a row it was fetched
    /// again instead of taking librdkafka's reset ([`PartState::refetch_instead_of_reset`]).
    pub(super) refetched: Option<(i64, u8)>,
    pub(super) offsets: PartitionOffsets<Stored>,
    pub(super) topic_value: Value,
    pub(super) partition_value: Value,
    pub(super) emitted: IntCounter,
    /// Emitted since `emitted` was last moved ([`PartState::report_emitted`], per batch).
    pub(super) emitted_unreported: u64,
    pub(super) acked: IntCounter,
    /// Acked since `acked` was last moved (per batch of acks).
    pub(super) acked_unreported: u64,
    pub(super) failed: IntCounter,
    pub(super) replayed: IntCounter,
    pub(super) given_up: IntCounter,
    pub(super) out_of_range: IntCounter,
    pub(super) given_back: IntCounter,
    pub(super) skipped: IntCounter,
    pub(super) seeks_repeated: IntCounter,
}

/// How many times in a row an out-of-range answer at one offset that the broker has just served
/// is fetched again before librdkafka's `auto.offset.reset` position is taken.
pub(super) const REFETCHES: u8 = 3;

/// How many times in a row a seek back that the fetch resumed past is sought again.
pub(super) const SEEKS_AGAIN: u8 = 3;

impl PartState {
    /// librdkafka moved the fetch position back, before `next`, after the broker answered a
    /// fetch at `next` "offset out of range". If this incarnation reached `next` by fetching,
    /// the broker served `next - 1` moments ago, so the answer is more likely its error than a
    /// truncated log (tansu gives it now and then under a concurrent producer; a Kafka leader
    /// whose high watermark lags can too). Then the partition is marked to seek back to `next`
    /// (`rewind_to`) and the attempt is returned, up to [`REFETCHES`] in a row at one offset.
    /// `None`: take the reset (nothing was fetched yet, or the broker kept answering so).
    pub(super) fn refetch_instead_of_reset(&mut self) -> Option<u8> {
        let next = self.offsets.next();
        if next <= self.base {
            return None;
        }
        let attempt = match self.refetched {
            Some((at, n)) if at == next => n.saturating_add(1),
            _ => 1,
        };
        if attempt > REFETCHES {
            self.refetched = None;
            return None;
        }
        self.refetched = Some((next, attempt));
        self.rewind_to_at_most(next);
        Some(attempt)
    }

    /// Marks the partition to seek back to `offset` before anything more is emitted from it,
    /// or to where it is marked already if that is earlier.
    pub(super) fn rewind_to_at_most(&mut self, offset: i64) {
        self.rewind_to = Some(self.rewind_to.map_or(offset, |o| o.min(offset)));
    }

    /// The partition's next message came at `offset` after a batch was given back: whether it
    /// is dropped because the seek back did not take effect (the fetch resumed past offsets it
    /// had fetched). Then the partition is marked to seek back again (`rewind_to`), up to
    /// [`SEEKS_AGAIN`] times in a row; after that the fetch is taken where it is, and what it
    /// passed over is counted as skipped (a log truncated meanwhile looks the same).
    pub(super) fn seek_again(&mut self, offset: i64) -> bool {
        let Some((to, times)) = self.sought_to.take() else { return false };
        if offset <= to || times >= SEEKS_AGAIN {
            return false;
        }
        self.sought_to = Some((to, times + 1));
        self.rewind_to_at_most(to);
        self.seeks_repeated.inc();
        true
    }

    /// Adds what was emitted since the last report to the `emitted` counter.
    pub(super) fn report_emitted(&mut self) {
        if self.emitted_unreported > 0 {
            self.emitted.inc_by(std::mem::take(&mut self.emitted_unreported));
        }
    }
}

/// An emitted message as a replay needs it: key and value in one shared buffer (one
/// allocation per message; clones and slices only count references, so the emitted tuple and
/// this copy share it), and the timestamp. 48 bytes: it is most of an offsets deque entry, one
/// per message in flight, so which parts are present is one byte of flags.
#[derive(Debug, Clone)]
pub(super) struct Stored {
    pub(super) buf: Bytes,
    /// Meaningful with [`Stored::TIMESTAMP`].
    timestamp: i64,
    /// Length of the key in `buf` (Kafka caps a message far below 4 GiB).
    key_len: u32,
    /// [`Stored::KEY`], [`Stored::VALUE`], [`Stored::TIMESTAMP`]: which are present.
    flags: u8,
}

impl Stored {
    const KEY: u8 = 1;
    const VALUE: u8 = 2;
    const TIMESTAMP: u8 = 4;

    pub(super) fn new(key: Option<&[u8]>, value: Option<&[u8]>, timestamp: Option<i64>) -> Self {
        let (k, v) = (key.unwrap_or_default(), value.unwrap_or_default());
        let buf = if k.is_empty() && v.is_empty() {
            Bytes::new()
        } else {
            let mut buf = Vec::with_capacity(k.len() + v.len());
            buf.extend_from_slice(k);
            buf.extend_from_slice(v);
            Bytes::from_owner(buf)
        };
        let flag = |present: bool, flag: u8| if present { flag } else { 0 };
        Stored {
            buf,
            timestamp: timestamp.unwrap_or(0),
            key_len: u32::try_from(k.len()).unwrap_or(u32::MAX),
            flags: flag(key.is_some(), Self::KEY)
                | flag(value.is_some(), Self::VALUE)
                | flag(timestamp.is_some(), Self::TIMESTAMP),
        }
    }

    /// The tuple: topic, partition, offset, key, value, timestamp.
    pub(super) fn values(&self, topic: &Value, partition: &Value, offset: i64) -> Values {
        let split = usize::try_from(self.key_len).unwrap_or(usize::MAX).min(self.buf.len());
        let has = |flag: u8| self.flags & flag != 0;
        vec![
            topic.clone(),
            partition.clone(),
            Value::Int(offset),
            if has(Self::KEY) { Value::Bytes(self.buf.slice(..split)) } else { Value::Null },
            if has(Self::VALUE) { Value::Bytes(self.buf.slice(split..)) } else { Value::Null },
            if has(Self::TIMESTAMP) { Value::Int(self.timestamp) } else { Value::Null },
        ]
        .into()
    }
}

/// A map keyed by what the spout looks up per message (topic names, partition numbers, slots):
/// keys it owns, so SipHash's flooding resistance buys nothing here, and its cost was a tenth of
/// the spout thread's CPU (three to five lookups per message). rustc's FxHash.
pub(super) type FastMap<K, V> = rustc_hash::FxHashMap<K, V>;

/// What the executor thread and the coordinator share.
#[derive(Debug, Default)]
pub(super) struct TaskState {
    pub(super) paused: bool,
    /// Partition incarnations by slot: an ack finds its partition in one lookup.
    pub(super) parts: FastMap<u16, PartState>,
    /// Topic -> partition -> slot of the incarnation consuming it.
    pub(super) slots: FastMap<String, FastMap<i32, u16>>,
    pub(super) next_slot: u16,
    /// Offset resets librdkafka reported (`auto.offset.reset` after an out-of-range fetch)
    /// whose partition has not been identified yet.
    pub(super) resets_pending: u32,
    /// Some partition has `rewind_to` set.
    pub(super) rewinds_pending: bool,
}

impl TaskState {
    pub(super) fn part_of_slot(&mut self, slot: u16) -> Option<&mut PartState> {
        self.parts.get_mut(&slot)
    }

    /// librdkafka reported an offset reset (`auto.offset.reset`); which partition is found by
    /// its next message's offset.
    pub(super) fn reset_reported(&mut self) {
        self.resets_pending = self.resets_pending.saturating_add(1).min(1024);
    }

    pub(super) fn slot_of(&self, topic: &str, partition: i32) -> Option<u16> {
        self.slots.get(topic)?.get(&partition).copied()
    }

    pub(super) fn get(&self, tp: &TopicPartition) -> Option<&PartState> {
        self.parts.get(&self.slot_of(tp.topic.as_str(), tp.partition.get())?)
    }

    pub(super) fn get_mut(&mut self, tp: &TopicPartition) -> Option<&mut PartState> {
        let slot = self.slot_of(tp.topic.as_str(), tp.partition.get())?;
        self.parts.get_mut(&slot)
    }

    pub(super) fn remove(&mut self, tp: &TopicPartition) -> Option<PartState> {
        let slot = self.slots.get_mut(tp.topic.as_str())?.remove(&tp.partition.get())?;
        self.parts.remove(&slot)
    }

    /// A new incarnation of `tp` starting at `start` (`None`: where the broker says, on the
    /// first message); returns its slot.
    pub(super) fn insert(
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
            rewind_to: None,
            sought_to: None,
            refetched: None,
            offsets: PartitionOffsets::new(start.unwrap_or(0)),
            topic_value: Value::from(tp.topic.as_str()),
            partition_value: Value::Int(i64::from(tp.partition.get())),
            emitted: metrics.emitted.with_label_values(&labels),
            emitted_unreported: 0,
            acked: metrics.acked.with_label_values(&labels),
            acked_unreported: 0,
            failed: metrics.failed.with_label_values(&labels),
            replayed: metrics.replayed.with_label_values(&labels),
            given_up: metrics.given_up.with_label_values(&labels),
            out_of_range: metrics.out_of_range.with_label_values(&labels),
            given_back: metrics.given_back.with_label_values(&labels),
            skipped: metrics.skipped.with_label_values(&labels),
            seeks_repeated: metrics.seeks_repeated.with_label_values(&labels),
            tp,
        };
        self.slots.entry(part.tp.topic.to_string()).or_default().insert(part.tp.partition.get(), slot);
        self.parts.insert(slot, part);
        slot
    }

    /// Starts `part`'s partition over at `offset` in a new slot: the broker moved the fetch
    /// position back, so earlier message ids must not match the new messages. Returns the
    /// new slot.
    pub(super) fn rebase(&mut self, topic: &str, partition: i32, offset: i64) -> Option<u16> {
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
    pub(super) fn allocate_slot(&mut self) -> u16 {
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
    pub(super) fn settle(&mut self, msg_id: u64, fail: Option<(Instant, &RetryPolicy)>) -> (Settled, bool) {
        let Some((now, policy)) = fail else {
            let (acked, drained) = self.apply_ack(msg_id);
            self.report_acked();
            return (if acked { Settled::Acked } else { Settled::Stale }, drained);
        };
        let id = MsgId::decode(msg_id);
        let Some(part) = self.part_of_slot(id.slot) else { return (Settled::Stale, false) };
        let offset = id.offset(part.base);
        let settled = match part.offsets.fail(offset, now, policy) {
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
        };
        let drained = !part.emitting && part.offsets.in_flight() == 0;
        (settled, drained)
    }

    /// Applies one ack, counting it for the next [`TaskState::report_acked`]: whether the
    /// message was outstanding, and whether its partition, being revoked, has nothing in
    /// flight any more.
    fn apply_ack(&mut self, msg_id: u64) -> (bool, bool) {
        let id = MsgId::decode(msg_id);
        let Some(part) = self.part_of_slot(id.slot) else { return (false, false) };
        let acked = part.offsets.ack(id.offset(part.base));
        if acked {
            part.acked_unreported += 1;
        }
        (acked, !part.emitting && part.offsets.in_flight() == 0)
    }

    /// Moves the acked counters by what [`TaskState::apply_ack`] counted.
    fn report_acked(&mut self) {
        for part in self.parts.values_mut() {
            if part.acked_unreported > 0 {
                part.acked.inc_by(std::mem::take(&mut part.acked_unreported));
            }
        }
    }

    /// Applies a batch of acks under one lock and moves the acked counters once: how many
    /// were stale, and whether a partition being revoked has nothing in flight any more.
    pub(super) fn settle_acks(&mut self, msg_ids: &[u64]) -> (u64, bool) {
        let (mut stale, mut drained) = (0, false);
        for &msg_id in msg_ids {
            let (acked, now_drained) = self.apply_ack(msg_id);
            stale += u64::from(!acked);
            drained |= now_drained;
        }
        self.report_acked();
        (stale, drained)
    }

    /// For a log line: each partition's first offsets still in flight (with their failures).
    pub(super) fn in_flight_sample(&self, partitions: &BTreeSet<TopicPartition>) -> String {
        partitions
            .iter()
            .filter_map(|tp| self.get(tp))
            .filter(|p| p.offsets.in_flight() > 0)
            .map(|p| format!("{}: {:?} (next {})", p.tp, p.offsets.in_flight_offsets(5), p.offsets.next()))
            .collect::<Vec<_>>()
            .join("; ")
    }

    pub(super) fn in_flight(&self, partitions: &BTreeSet<TopicPartition>) -> usize {
        partitions.iter().filter_map(|tp| self.get(tp)).map(|p| p.offsets.in_flight()).sum()
    }
}

/// What an ack or a fail did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Settled {
    /// For a partition given up since, or a message not outstanding: ignored.
    Stale,
    Acked,
    Retry,
    GaveUp,
}

pub(super) fn lock(state: &Mutex<TaskState>) -> MutexGuard<'_, TaskState> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use cluster_state::ids::{Partition, Topic};

    fn tp(topic: &str, partition: i32) -> TopicPartition {
        TopicPartition::new(Topic::new(topic).unwrap(), Partition::new(partition).unwrap())
    }

    #[test]
    fn a_kept_message_and_its_offsets_entry_fit_in_a_cache_line() {
        // One entry is written per message and read back at its ack, 20k or more in flight.
        assert!(std::mem::size_of::<Stored>() <= 48, "Stored is {} bytes", std::mem::size_of::<Stored>());
        let entry = crate::offsets::entry_size::<Stored>();
        assert!(entry <= 64, "an offsets entry is {entry} bytes");
    }

    #[test]
    fn an_out_of_range_answer_past_what_was_fetched_is_fetched_again_three_times_in_a_row() {
        let metrics = SpoutMetrics::register(&prometheus::Registry::new()).unwrap();
        let mut state = TaskState::default();
        let p0 = tp("t", 0);
        state.insert(p0.clone(), SessionId(1), Some(100), &metrics, "spout");
        let part = state.get_mut(&p0).unwrap();
        // Nothing fetched yet (a committed offset past the log's end): the reset is taken.
        assert_eq!(part.refetch_instead_of_reset(), None);
        assert_eq!(part.rewind_to, None);
        for o in 100..105 {
            part.offsets.emit(o, Stored::new(None, None, None)).unwrap();
        }
        // The broker served up to 104: fetched again from 105, three times in a row.
        assert_eq!(part.refetch_instead_of_reset(), Some(1));
        assert_eq!(part.rewind_to, Some(105));
        part.rewind_to = None; // the seek happened
        assert_eq!(part.refetch_instead_of_reset(), Some(2));
        part.rewind_to = None;
        assert_eq!(part.refetch_instead_of_reset(), Some(3));
        part.rewind_to = None;
        assert_eq!(part.refetch_instead_of_reset(), None, "the fourth answer in a row is believed");
        assert_eq!(part.rewind_to, None);
        // Progress past it starts a new count; a pending rewind to earlier stays the earlier.
        part.offsets.emit(105, Stored::new(None, None, None)).unwrap();
        part.rewind_to = Some(102);
        assert_eq!(part.refetch_instead_of_reset(), Some(1));
        assert_eq!(part.rewind_to, Some(102));
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
        // A batch of acks: one stale (acked already), one of a slot never assigned; the last
        // in flight of a partition being revoked drains it.
        let p1 = tp("t", 1);
        let s1 = state.insert(p1.clone(), SessionId(1), Some(100), &metrics, "spout");
        for o in 100..103 {
            state.get_mut(&p1).unwrap().offsets.emit(o, Stored::new(None, None, None)).unwrap();
        }
        let batch = [id(s1, 100), id(s1, 101), id(s1, 100), id(9999, 100)];
        assert_eq!(state.settle_acks(&batch), (2, false));
        assert_eq!(metrics.acked.with_label_values(&["spout", "t", "1"]).get(), 2);
        state.get_mut(&p1).unwrap().emitting = false;
        assert_eq!(state.settle_acks(&[id(s1, 102)]), (0, true));
        assert_eq!(state.get(&p1).unwrap().offsets.commit_due(), Some(103));
        // Ids of unknown slots and garbage never panic.
        assert_eq!(state.settle(u64::MAX, None), (Settled::Stale, false));
        assert_eq!(state.settle(0, Some((Instant::now(), &policy))), (Settled::Stale, false));
        assert_eq!(metrics.acked.with_label_values(&["spout", "t", "0"]).get(), 4);
    }
}
