//! The pure core of at-least-once: which offset of a partition may be committed, when a failed
//! message is replayed, and how a spout message id names (partition, offset).
//!
//! Kafka offsets have gaps (compaction, transaction markers), so "the contiguous acknowledged
//! prefix" is measured against what was emitted, not against offset arithmetic: the safe offset
//! is the lowest emitted-but-not-acknowledged offset, or, when nothing is outstanding, the offset
//! after the last emitted message. A consumer restarting there re-reads every message that was
//! not acknowledged (and possibly some that were: the duplicates of at-least-once).

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The offset that may be committed for a partition (the next offset to consume): the lowest
/// un-acknowledged emitted offset in `pending`, else `next` (the offset after the last emitted
/// message). Never above `next`.
pub fn safe_offset(next: i64, pending: &BTreeSet<i64>) -> i64 {
    pending.first().map_or(next, |&lowest| lowest.min(next))
}

/// How failed messages are retried: storm-kafka-client's `KafkaSpoutRetryExponentialBackoff`.
/// The `n`-th retry of a message waits `initial_delay_ms + delay_period_ms * 2^(n-1)`, at most
/// `max_delay_ms`; after `max_retries` retries a failing message is given up (counted, and
/// treated as done so the partition's offset can move on).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    /// storm-kafka-client's default `initialDelay`: 0 ms.
    pub initial_delay_ms: u64,
    /// storm-kafka-client's default `delayPeriod`: 2 ms.
    pub delay_period_ms: u64,
    /// storm-kafka-client's default `maxDelay`: 10 s.
    pub max_delay_ms: u64,
    /// storm-kafka-client's default is `Integer.MAX_VALUE` (retry for ever); `null` here.
    pub max_retries: Option<u32>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { initial_delay_ms: 0, delay_period_ms: 2, max_delay_ms: 10_000, max_retries: None }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1-based), or `None` if the message is given up.
    pub fn delay(&self, retry: u32) -> Option<Duration> {
        if retry == 0 || self.max_retries.is_some_and(|max| retry > max) {
            return if retry == 0 { Some(Duration::ZERO) } else { None };
        }
        let exponent = retry.saturating_sub(1).min(62);
        let backoff = self.delay_period_ms.saturating_mul(1u64 << exponent);
        let total = self.initial_delay_ms.saturating_add(backoff).min(self.max_delay_ms);
        Some(Duration::from_millis(total))
    }
}

/// What became of a failed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOutcome {
    /// Replay it at `at` (this will be retry number `retry`).
    Retry { at: Instant, retry: u32 },
    /// Retries are exhausted: it is dropped and counts as done for the committed offset.
    GiveUp,
    /// Not an outstanding offset of this partition (a stale or duplicate message id).
    Unknown,
}

/// Why an emission was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmitRefused {
    /// The offset is below the emission frontier: it was emitted already (a re-delivery).
    Behind { offset: i64, next: i64 },
}

/// A deque entry's payload: kept small (the spout writes one per message and reads it back at
/// the ack, 20k or more in flight: its size is cache misses). When a replay is due is in
/// `replays` only; the entry says whether it waits for one.
#[derive(Debug, Clone)]
struct Outstanding<M> {
    message: M,
    /// Failures so far.
    fails: u32,
    /// Waiting for a replay (in `replays`; not in flight).
    awaiting_replay: bool,
}

/// One partition's emitted-but-unfinished messages and its committed offset.
///
/// `M` is what a replay needs (the spout keeps the emitted values; tests use `()`).
///
/// The outstanding messages live in a deque ordered by offset (a partition is emitted in
/// offset order): an emit appends, an ack empties its entry (found by position when the offsets
/// are dense, else by binary search) and the emptied prefix is dropped. This is the spout's
/// per-message path; a `BTreeMap` insert and remove per message were a fifth of its CPU.
#[derive(Debug, Clone)]
pub struct PartitionOffsets<M> {
    committed: i64,
    next: i64,
    /// Ascending offsets; the front entry, if any, is occupied; `None` is acked or given up.
    outstanding: VecDeque<(i64, Option<Outstanding<M>>)>,
    /// Occupied entries of `outstanding`.
    occupied: usize,
    replays: BTreeSet<(Instant, i64)>,
}

impl<M> PartitionOffsets<M> {
    /// A partition starting at `offset` (its committed or reset position).
    pub fn new(offset: i64) -> Self {
        PartitionOffsets {
            committed: offset,
            next: offset,
            outstanding: VecDeque::new(),
            occupied: 0,
            replays: BTreeSet::new(),
        }
    }

    /// The offset last committed (or started from).
    pub fn committed(&self) -> i64 {
        self.committed
    }

    /// The offset after the last emitted message.
    pub fn next(&self) -> i64 {
        self.next
    }

    /// Messages emitted and neither acknowledged nor given up (in flight or awaiting replay).
    pub fn outstanding(&self) -> usize {
        self.occupied
    }

    /// Messages emitted and still in the topology (outstanding minus those awaiting a replay).
    pub fn in_flight(&self) -> usize {
        self.occupied - self.replays.len()
    }

    /// Up to `limit` offsets in flight (emitted, not settled, not awaiting a replay), lowest
    /// first, with their failures so far: what a drain that timed out still waited for.
    pub fn in_flight_offsets(&self, limit: usize) -> Vec<(i64, u32)> {
        self.outstanding
            .iter()
            .filter_map(|(o, e)| e.as_ref().filter(|e| !e.awaiting_replay).map(|e| (*o, e.fails)))
            .take(limit)
            .collect()
    }

    /// The position of `offset` in `outstanding`.
    fn position(&self, offset: i64) -> Option<usize> {
        let &(first, _) = self.outstanding.front()?;
        // Dense offsets (no gaps since the front): the entry is at `offset - first`.
        if let Some(i) = offset.checked_sub(first).and_then(|d| usize::try_from(d).ok())
            && self.outstanding.get(i).is_some_and(|(o, _)| *o == offset)
        {
            return Some(i);
        }
        self.outstanding.binary_search_by_key(&offset, |(o, _)| *o).ok()
    }

    fn entry(&mut self, offset: i64) -> Option<&mut Outstanding<M>> {
        let i = self.position(offset)?;
        self.outstanding.get_mut(i)?.1.as_mut()
    }

    /// Empties the entry of `offset`, returning what it held.
    fn take(&mut self, offset: i64) -> Option<Outstanding<M>> {
        let i = self.position(offset)?;
        let taken = self.outstanding.get_mut(i)?.1.take()?;
        self.occupied -= 1;
        while self.outstanding.front().is_some_and(|(_, o)| o.is_none()) {
            self.outstanding.pop_front();
        }
        // Emptied entries behind a long-outstanding one (a message retried for a while) are
        // dropped once they are most of the deque, so memory follows what is outstanding.
        if self.outstanding.len() > 1024 && self.outstanding.len() > 4 * self.occupied {
            self.outstanding.retain(|(_, o)| o.is_some());
        }
        Some(taken)
    }

    /// The broker reset the fetch position to `to` (the old one was out of range). Forward:
    /// the skipped offsets no longer exist. Backward (the log was truncated or recreated):
    /// outstanding offsets at or past `to` are gone too; their late acks are stale.
    pub fn skip_to(&mut self, to: i64) {
        if to >= self.next {
            self.next = to;
            return;
        }
        self.outstanding.retain(|(o, m)| *o < to && m.is_some());
        self.occupied = self.outstanding.len();
        self.replays.retain(|&(_, o)| o < to);
        self.next = to;
        self.committed = self.committed.min(to);
    }

    /// A new message at `offset` is being emitted.
    pub fn emit(&mut self, offset: i64, message: M) -> Result<(), EmitRefused> {
        if offset < self.next {
            return Err(EmitRefused::Behind { offset, next: self.next });
        }
        self.next = offset.saturating_add(1);
        self.outstanding.push_back((offset, Some(Outstanding { message, fails: 0, awaiting_replay: false })));
        self.occupied += 1;
        Ok(())
    }

    /// The message at `offset` was acknowledged; false if it was not outstanding (stale id).
    pub fn ack(&mut self, offset: i64) -> bool {
        match self.take(offset) {
            Some(o) => {
                if o.awaiting_replay {
                    // A verdict for a message not in flight (a duplicate): rare, so its replay
                    // time is not kept in the entry and found here by offset.
                    self.replays.retain(|&(_, r)| r != offset);
                }
                true
            }
            None => false,
        }
    }

    /// The message at `offset` failed at `now`: schedule its replay or give it up.
    pub fn fail(&mut self, offset: i64, now: Instant, policy: &RetryPolicy) -> FailOutcome {
        let Some(o) = self.entry(offset) else { return FailOutcome::Unknown };
        if o.awaiting_replay {
            return FailOutcome::Unknown; // not in flight: a duplicate verdict
        }
        o.fails = o.fails.saturating_add(1);
        match policy.delay(o.fails) {
            Some(delay) => {
                let at = now + delay;
                o.awaiting_replay = true;
                let retry = o.fails;
                self.replays.insert((at, offset));
                FailOutcome::Retry { at, retry }
            }
            None => {
                self.take(offset);
                FailOutcome::GiveUp
            }
        }
    }

    /// The earliest replay due at or before `now`: marks it in flight again and returns its
    /// offset and message.
    pub fn next_replay(&mut self, now: Instant) -> Option<(i64, &M)> {
        let &(at, offset) = self.replays.first()?;
        if at > now {
            return None;
        }
        self.replays.pop_first();
        let o = self.entry(offset)?;
        o.awaiting_replay = false;
        Some((offset, &o.message))
    }

    /// When the next replay is due, if any.
    pub fn next_replay_at(&self) -> Option<Instant> {
        self.replays.first().map(|(at, _)| *at)
    }

    /// The offset that may be committed now (see [`safe_offset`]).
    pub fn safe_offset(&self) -> i64 {
        self.outstanding.front().map_or(self.next, |&(lowest, _)| lowest.min(self.next))
    }

    /// The offset to commit, if it moved past the committed one.
    pub fn commit_due(&self) -> Option<i64> {
        let safe = self.safe_offset();
        (safe > self.committed).then_some(safe)
    }

    /// `offset` was committed (ignored if older than what is known committed).
    pub fn committed_at(&mut self, offset: i64) {
        self.committed = self.committed.max(offset);
    }
}

/// The size of one deque entry holding `M` (a test keeps the spout's within a cache line).
#[cfg(test)]
pub(crate) fn entry_size<M>() -> usize {
    std::mem::size_of::<(i64, Option<Outstanding<M>>)>()
}

/// Bits of a message id holding the offset's distance from its incarnation's base.
pub const OFFSET_BITS: u32 = 48;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;

/// A spout message id: `slot << 48 | (offset - base)`, where `slot` names one incarnation of a
/// partition in the task (a new one at every assignment, so ids of an earlier ownership never
/// match) and `base` is the offset that incarnation started at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MsgId {
    pub slot: u16,
    pub delta: u64,
}

impl MsgId {
    /// The id of `offset` in an incarnation `slot` starting at `base`; `None` when the offset is
    /// below `base` or 2^48 or more past it.
    pub fn new(slot: u16, base: i64, offset: i64) -> Option<Self> {
        let delta = u64::try_from(offset.checked_sub(base)?).ok()?;
        (delta <= OFFSET_MASK).then_some(MsgId { slot, delta })
    }

    pub fn encode(self) -> u64 {
        (u64::from(self.slot) << OFFSET_BITS) | self.delta
    }

    pub fn decode(id: u64) -> Self {
        MsgId { slot: (id >> OFFSET_BITS) as u16, delta: id & OFFSET_MASK }
    }

    /// The offset, given the incarnation's base.
    pub fn offset(self, base: i64) -> i64 {
        base.saturating_add(i64::try_from(self.delta).unwrap_or(i64::MAX))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn safe_offset_table() {
        let set = |v: &[i64]| v.iter().copied().collect::<BTreeSet<i64>>();
        let cases: &[(i64, &[i64], i64)] = &[
            (0, &[], 0),      // nothing emitted
            (10, &[], 10),    // all acked: after the last emitted
            (10, &[3], 3),    // 3 outstanding
            (10, &[3, 7], 3), // lowest outstanding
            (10, &[9], 9),
            (5, &[7], 5), // never past the frontier
        ];
        for &(next, pending, want) in cases {
            assert_eq!(safe_offset(next, &set(pending)), want, "next {next} pending {pending:?}");
        }
    }

    #[test]
    fn backoff_table() {
        let p = RetryPolicy::default();
        let ms = |r| p.delay(r).map(|d| d.as_millis() as u64);
        assert_eq!(ms(1), Some(2));
        assert_eq!(ms(2), Some(4));
        assert_eq!(ms(3), Some(8));
        assert_eq!(ms(13), Some(8192));
        assert_eq!(ms(14), Some(10_000)); // capped
        assert_eq!(ms(1000), Some(10_000)); // no overflow
        let bounded = RetryPolicy { initial_delay_ms: 100, max_retries: Some(2), ..RetryPolicy::default() };
        assert_eq!(bounded.delay(1), Some(Duration::from_millis(102)));
        assert_eq!(bounded.delay(2), Some(Duration::from_millis(104)));
        assert_eq!(bounded.delay(3), None);
    }

    #[test]
    fn gaps_ack_fail_replay_give_up() {
        let t0 = Instant::now();
        let policy = RetryPolicy { max_retries: Some(1), ..RetryPolicy::default() };
        let mut p = PartitionOffsets::new(100);
        assert_eq!(p.commit_due(), None);
        for o in [100, 101, 105, 106] {
            p.emit(o, o * 10).unwrap(); // 102..=104 are a gap (compacted)
        }
        assert_eq!(p.emit(101, 0), Err(EmitRefused::Behind { offset: 101, next: 107 }));
        assert!(p.ack(100));
        assert!(!p.ack(100), "a second ack is stale");
        assert_eq!(p.commit_due(), Some(101));
        assert!(p.ack(105));
        assert_eq!(p.safe_offset(), 101);
        let FailOutcome::Retry { at, retry: 1 } = p.fail(101, t0, &policy) else { panic!() };
        assert_eq!(p.fail(101, t0, &policy), FailOutcome::Unknown, "not in flight");
        assert_eq!(p.next_replay(t0), None, "not yet due");
        assert_eq!(p.next_replay(at), Some((101, &1010)));
        assert_eq!(p.safe_offset(), 101, "replayed, still outstanding");
        assert_eq!(p.fail(101, at, &policy), FailOutcome::GiveUp);
        assert_eq!(p.safe_offset(), 106);
        assert!(p.ack(106));
        assert_eq!(p.commit_due(), Some(107));
        p.committed_at(107);
        p.committed_at(50);
        assert_eq!(p.committed(), 107);
        assert_eq!(p.commit_due(), None);
    }

    #[test]
    fn skip_forward_and_backward() {
        let mut p = PartitionOffsets::new(10);
        p.emit(10, ()).unwrap();
        p.emit(11, ()).unwrap();
        p.skip_to(20);
        assert_eq!(p.next(), 20);
        assert_eq!(p.safe_offset(), 10, "10 and 11 still outstanding");
        assert!(p.ack(10) && p.ack(11));
        assert_eq!(p.commit_due(), Some(20));
        p.committed_at(20);
        p.emit(20, ()).unwrap();
        p.emit(21, ()).unwrap();
        p.skip_to(5);
        assert_eq!((p.outstanding(), p.next(), p.committed()), (0, 5, 5));
        assert!(!p.ack(21), "gone with the truncated log");
        p.emit(5, ()).unwrap();
        assert_eq!(p.in_flight(), 1);
    }

    #[test]
    fn a_long_outstanding_message_keeps_memory_bounded_and_the_offset_held() {
        let policy = RetryPolicy::default();
        let mut p = PartitionOffsets::new(0);
        for o in 0..10_000 {
            p.emit(o * 2, ()).unwrap(); // gaps: found by binary search
        }
        assert!(matches!(p.fail(0, Instant::now(), &policy), FailOutcome::Retry { .. }));
        for o in 1..10_000 {
            assert!(p.ack(o * 2));
        }
        assert_eq!((p.outstanding(), p.in_flight(), p.safe_offset()), (1, 0, 0));
        assert!(p.outstanding.len() <= 1024, "emptied entries dropped: {}", p.outstanding.len());
        p.emit(20_000, ()).unwrap();
        assert!(p.ack(0) && p.ack(20_000));
        assert_eq!((p.outstanding(), p.safe_offset()), (0, 20_001));
        assert!(p.outstanding.is_empty());
    }

    #[test]
    fn msg_ids_round_trip_and_reject_out_of_space() {
        let id = MsgId::new(7, 1_000, 1_005).unwrap();
        let back = MsgId::decode(id.encode());
        assert_eq!(back, id);
        assert_eq!(back.offset(1_000), 1_005);
        assert_eq!(MsgId::new(1, 10, 9), None);
        assert_eq!(MsgId::new(1, 0, 1 << 48), None);
        assert!(MsgId::new(u16::MAX, 0, (1 << 48) - 1).is_some());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Emit(u8),
        Ack(u8),
        Fail(u8),
        Replay,
        Commit,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (1u8..4).prop_map(Op::Emit),
            3 => any::<u8>().prop_map(Op::Ack),
            1 => any::<u8>().prop_map(Op::Fail),
            1 => Just(Op::Replay),
            1 => Just(Op::Commit),
        ]
    }

    proptest! {
        /// Whatever the order of emits (with gaps), acks, fails and replays: a committed
        /// offset never passes an emitted offset that was not acknowledged (or given up), and
        /// committed offsets never go backwards.
        #[test]
        fn committed_never_passes_an_unacked_offset(start in 0i64..1000, ops in proptest::collection::vec(op(), 0..300)) {
            let policy = RetryPolicy { delay_period_ms: 0, max_retries: Some(3), ..RetryPolicy::default() };
            let now = Instant::now();
            let mut p = PartitionOffsets::new(start);
            // The model: every emitted offset and whether it is finished.
            let mut emitted: BTreeMap<i64, bool> = BTreeMap::new();
            let mut next = start;
            let mut last_commit = start;
            for op in ops {
                match op {
                    Op::Emit(gap) => {
                        let offset = next + i64::from(gap) - 1;
                        p.emit(offset, ()).unwrap();
                        emitted.insert(offset, false);
                        next = offset + 1;
                    }
                    Op::Ack(i) => {
                        let open: Vec<i64> = emitted.iter().filter(|(_, d)| !**d).map(|(o, _)| *o).collect();
                        if let Some(&o) = open.get(usize::from(i) % open.len().max(1)) && p.ack(o) {
                            emitted.insert(o, true);
                        }
                    }
                    Op::Fail(i) => {
                        let open: Vec<i64> = emitted.iter().filter(|(_, d)| !**d).map(|(o, _)| *o).collect();
                        if let Some(&o) = open.get(usize::from(i) % open.len().max(1))
                            && p.fail(o, now, &policy) == FailOutcome::GiveUp
                        {
                            emitted.insert(o, true);
                        }
                    }
                    Op::Replay => { let _ = p.next_replay(now); }
                    Op::Commit => {
                        if let Some(c) = p.commit_due() {
                            prop_assert!(c >= last_commit);
                            p.committed_at(c);
                            last_commit = c;
                        }
                    }
                }
                let safe = p.safe_offset();
                for (&o, &done) in &emitted {
                    if !done { prop_assert!(safe <= o, "safe {safe} passes un-acked {o}"); }
                }
                prop_assert!(p.committed() <= safe);
                let outstanding = emitted.values().filter(|d| !**d).count();
                prop_assert_eq!(p.outstanding(), outstanding);
                if outstanding == 0 { prop_assert_eq!(safe, next); }
            }
        }
    }
}
