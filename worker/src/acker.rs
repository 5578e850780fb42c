//! Storm's XOR acking, as a pure ledger.
//!
//! A spout tuple's tree has a random 64-bit root id. Every edge (a tuple sent to one task) gets
//! a random 64-bit id. The spout tells the root's acker task `Init(root, xor of its edge ids)`.
//! A bolt acking an input sends `Ack(root, input edge xor the edges of tuples it anchored to
//! that input)`. Each edge id is thus XORed in exactly twice (when created, when acked), so the
//! ledger value returns to zero exactly when the whole tree is acked, whatever the order, in
//! 20 bytes of state per tree. A `Fail` marks the tree failed. Trees that never finish are
//! rotated out after `topology.message.timeout.secs` (the spout times them out itself).

use std::collections::HashMap;
use std::collections::hash_map::Entry as Slot;
use std::hash::{BuildHasherDefault, Hasher};

use cluster_state::ids::TaskId;

/// What flows to an acker task, and from it back to a spout task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckMsg {
    /// Spout -> acker: a new tree `root` whose first edges XOR to `val`, owned by `spout_task`.
    Init { root: u64, val: u64, spout_task: TaskId },
    /// Bolt -> acker: XOR `val` into the tree's value.
    Ack { root: u64, val: u64 },
    /// Bolt -> acker: the tree failed.
    Fail { root: u64 },
    /// Acker -> spout: the tree of `root` completed (`ok`) or failed.
    Done { root: u64, ok: bool },
    /// Worker -> its own spout tasks: tasks moved to other workers (their old worker is gone,
    /// or restarts). Trees in flight now that do not complete within a short grace passed
    /// through (or were tracked by) a worker that is gone and never will: fail them, so they
    /// replay now instead of after the message timeout.
    TasksMoved,
}

/// The verdict on a tree, for its spout task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub root: u64,
    pub spout_task: TaskId,
    pub ok: bool,
}

/// A hasher for tree ids: one multiplication. Their low 40 bits are random, their top bits a
/// spout's pending slot (`crate::pending`); the hash table takes its index from the low bits of
/// the hash and a tag from the top 7, and without the multiplication that tag would be the same
/// for nearly every tree (every probe comparing whole keys).
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) ^ u64::from(*b) ^ (self.0 >> 56);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// A map of random ids using [`IdHasher`].
pub type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// Rotations a tree survives in the ledger: it is forgotten on the third (Storm's
/// `RotatingMap` of three buckets; the spout times the tree out on its own third rotation).
const ROTATIONS: u32 = 3;

#[derive(Debug, Clone, Copy)]
struct Entry {
    val: u64,
    spout_task: Option<TaskId>,
    failed: bool,
    /// The rotation count when the tree's first message arrived.
    epoch: u32,
}

/// One acker task's trees: one map, each entry stamped with the rotation it arrived in (one
/// hash probe per message; three rotating maps cost up to six, and made the acker the
/// bottleneck of a topology with acking on).
#[derive(Debug, Default)]
pub struct AckLedger {
    pending: IdMap<Entry>,
    epoch: u32,
}

impl AckLedger {
    /// Applies one message; returns the verdict when the tree completes or fails.
    /// `Done` is a spout-side message and is ignored here.
    pub fn apply(&mut self, msg: AckMsg) -> Option<Outcome> {
        let root = match msg {
            AckMsg::Init { root, .. } | AckMsg::Ack { root, .. } | AckMsg::Fail { root } => root,
            AckMsg::Done { .. } | AckMsg::TasksMoved => return None,
        };
        let verdict = match self.pending.entry(root) {
            Slot::Occupied(mut o) => {
                let verdict = o.get_mut().apply(msg);
                if verdict.is_some() {
                    o.remove();
                }
                verdict
            }
            Slot::Vacant(v) => {
                // The tree's first message: recorded unless it decides the tree by itself.
                let mut fresh = Entry { val: 0, spout_task: None, failed: false, epoch: self.epoch };
                let verdict = fresh.apply(msg);
                if verdict.is_none() {
                    v.insert(fresh);
                }
                verdict
            }
        };
        verdict.map(|(spout_task, ok)| Outcome { root, spout_task, ok })
    }

    /// Forgets trees that arrived three rotations ago or earlier (the spout has timed them out
    /// by then); returns how many.
    pub fn rotate(&mut self) -> usize {
        self.epoch = self.epoch.wrapping_add(1);
        let (now, before) = (self.epoch, self.pending.len());
        self.pending.retain(|_, e| now.wrapping_sub(e.epoch) < ROTATIONS);
        before - self.pending.len()
    }

    /// Trees in flight.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether no tree is in flight.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

impl Entry {
    /// Applies `msg` (an `Init`, `Ack` or `Fail` of this tree); the verdict, for the spout task,
    /// once the spout task is known and the tree failed or its value returned to zero.
    fn apply(&mut self, msg: AckMsg) -> Option<(TaskId, bool)> {
        match msg {
            AckMsg::Init { val, spout_task, .. } => {
                self.val ^= val;
                self.spout_task = Some(spout_task);
            }
            AckMsg::Ack { val, .. } => self.val ^= val,
            AckMsg::Fail { .. } => self.failed = true,
            AckMsg::Done { .. } | AckMsg::TasksMoved => {}
        }
        let spout_task = self.spout_task?;
        if self.failed {
            Some((spout_task, false))
        } else if self.val == 0 {
            Some((spout_task, true))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const SPOUT: TaskId = TaskId(9);

    /// A tree: spout emits edges a, b; bolt 1 acks a after anchoring c, d to it; bolt 2 acks b;
    /// c and d are acked last. Only the final ack completes the tree.
    #[test]
    fn tree_completes_exactly_when_every_descendant_is_acked() {
        let (a, b, c, d) = (0x11, 0x22, 0x44, 0x88);
        let steps = [
            (AckMsg::Init { root: 1, val: a ^ b, spout_task: SPOUT }, None),
            (AckMsg::Ack { root: 1, val: a ^ c ^ d }, None),
            (AckMsg::Ack { root: 1, val: b }, None),
            (AckMsg::Ack { root: 1, val: c }, None),
            (AckMsg::Ack { root: 1, val: d }, Some(Outcome { root: 1, spout_task: SPOUT, ok: true })),
        ];
        let mut ledger = AckLedger::default();
        for (i, (msg, want)) in steps.into_iter().enumerate() {
            assert_eq!(ledger.apply(msg), want, "step {i}");
        }
        assert!(ledger.is_empty());
    }

    #[test]
    fn acks_before_init_and_failures() {
        let cases: Vec<(Vec<AckMsg>, Option<Outcome>)> = vec![
            // The bolt's ack overtakes the spout's init.
            (
                vec![AckMsg::Ack { root: 2, val: 5 }, AckMsg::Init { root: 2, val: 5, spout_task: SPOUT }],
                Some(Outcome { root: 2, spout_task: SPOUT, ok: true }),
            ),
            // A fail wins over a later completion.
            (
                vec![AckMsg::Init { root: 3, val: 5, spout_task: SPOUT }, AckMsg::Fail { root: 3 }],
                Some(Outcome { root: 3, spout_task: SPOUT, ok: false }),
            ),
            // A fail before init is held until the init names the spout.
            (
                vec![AckMsg::Fail { root: 4 }, AckMsg::Init { root: 4, val: 5, spout_task: SPOUT }],
                Some(Outcome { root: 4, spout_task: SPOUT, ok: false }),
            ),
            // An incomplete tree gives no verdict.
            (
                vec![AckMsg::Init { root: 5, val: 5, spout_task: SPOUT }, AckMsg::Ack { root: 5, val: 4 }],
                None,
            ),
        ];
        for (msgs, want) in cases {
            let mut ledger = AckLedger::default();
            let mut last = None;
            for m in &msgs {
                last = ledger.apply(*m);
            }
            assert_eq!(last, want, "{msgs:?}");
        }
    }

    #[test]
    fn unfinished_trees_rotate_out() {
        let mut ledger = AckLedger::default();
        ledger.apply(AckMsg::Init { root: 7, val: 1, spout_task: SPOUT });
        assert_eq!(ledger.rotate(), 0);
        assert_eq!(ledger.rotate(), 0);
        assert_eq!(ledger.rotate(), 1);
        assert!(ledger.is_empty());
    }

    /// A tree is kept from its first message, whichever that is, for two rotations: an ack
    /// after one or two rotations still completes it; after the third it starts a new entry.
    #[test]
    fn a_tree_lives_two_rotations_from_its_first_message() {
        let mut ledger = AckLedger::default();
        ledger.apply(AckMsg::Ack { root: 8, val: 3 });
        assert_eq!(ledger.rotate(), 0);
        ledger.apply(AckMsg::Init { root: 8, val: 1, spout_task: SPOUT });
        assert_eq!(ledger.rotate(), 0);
        assert_eq!(
            ledger.apply(AckMsg::Ack { root: 8, val: 2 }),
            Some(Outcome { root: 8, spout_task: SPOUT, ok: true })
        );
        assert!(ledger.is_empty());
        ledger.apply(AckMsg::Init { root: 9, val: 1, spout_task: SPOUT });
        assert_eq!((ledger.rotate(), ledger.rotate(), ledger.rotate()), (0, 0, 1));
        // The late ack of a forgotten tree is held, not mistaken for a verdict.
        assert_eq!(ledger.apply(AckMsg::Ack { root: 9, val: 1 }), None);
        assert_eq!(ledger.len(), 1);
    }

    proptest! {
        /// Any tree, acked in any order: the verdict comes with the last ack and not before.
        #[test]
        fn any_order_completes_on_the_last_ack(children in proptest::collection::vec(1u64..u64::MAX, 1..20), seed in any::<u64>()) {
            // The spout emits children[0]; each later edge is anchored to a random earlier one.
            let mut rng = crate::grouping::SplitMix64::new(seed);
            let mut acks: Vec<u64> = children.clone(); // each edge's own id
            for (i, child) in children.iter().enumerate().skip(1) {
                let parent = rng.below(i);
                acks[parent] ^= child;
            }
            let mut order: Vec<usize> = (0..children.len()).collect();
            for i in (1..order.len()).rev() {
                let j = rng.below(i + 1);
                order.swap(i, j);
            }
            let mut ledger = AckLedger::default();
            prop_assert_eq!(ledger.apply(AckMsg::Init { root: 1, val: children[0], spout_task: SPOUT }), None);
            for (k, i) in order.iter().enumerate() {
                let got = ledger.apply(AckMsg::Ack { root: 1, val: acks[*i] });
                if k + 1 == order.len() {
                    prop_assert_eq!(got, Some(Outcome { root: 1, spout_task: SPOUT, ok: true }));
                } else {
                    prop_assert_eq!(got, None);
                }
            }
        }
    }
}
