//! The spout executor's pending trees: a slab whose slot number travels in the tree's root id.
//!
//! A tracked spout tuple's root id is `slot << RANDOM_BITS | random`: the acker sees an
//! ordinary id (it never decodes it, and `root % ackers` still spreads trees over ackers
//! through the random low bits), and the acker's `Done(root)` leads the spout straight to the
//! tree's slot, which holds the whole root to refuse a stale verdict for a slot reused since.
//! Taking and freeing a slot is a push or pop on a free list; no hashing, and the slots most
//! recently freed (still in cache) are taken first. This replaced three rotating hash maps
//! keyed by random roots, which took ~40% of a generator spout's thread with acking on.
//!
//! When the tree's acker task runs on the spout's own thread (`executor::FusedAcker`), the
//! slot also holds the tree's XOR value: the `Init` is applied in the slot instead of being sent
//! to the thread's own inbox, and each ack finds the tree by its slot, as the verdict would.
//!
//! Timeouts keep Storm's `RotatingMap` semantics without buckets: every slot records the
//! rotation it was taken in, and a rotation fails the trees taken three rotations ago or
//! earlier (between two and three rotation periods old, as with three buckets).
//!
//! Ids: within one executor a live root is unique by its slot. Across executors two live roots
//! collide only if they share the slot and all [`RANDOM_BITS`] random bits; the acker would
//! then merge both trees and answer one spout, and the other tree times out and replays:
//! at-least-once holds, a replay is spurious. Beyond [`MAX_SLOTS`] trees in flight (only
//! without `topology.max.spout.pending`), trees get fully random roots kept in a hash map.

use std::time::Instant;

use crate::acker::IdMap;
use crate::grouping::SplitMix64;

/// Random low bits of a slab root.
pub(crate) const RANDOM_BITS: u32 = 40;
/// Trees a slab holds; more go to the overflow map.
pub(crate) const MAX_SLOTS: usize = 1 << (64 - RANDOM_BITS);
/// Rotations a tree survives: it times out on the third (Storm's `RotatingMap` of 3 buckets).
const ROTATIONS: u32 = 3;

/// A spout tuple waiting for its tree to complete.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PendingTuple {
    pub(crate) msg_id: u64,
    pub(crate) task_index: usize,
    pub(crate) emitted_at: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    /// 0 when the slot is free (roots are never 0).
    root: u64,
    /// The rotation count when the tree was taken.
    epoch: u32,
    /// The tree's XOR value when its acker runs on this thread and keeps it here instead of in
    /// its own ledger ([`PendingTrees::track_acks`]); 0 otherwise (a tree tracked here is
    /// complete, and leaves, when its value returns to 0).
    acks: u64,
    tuple: PendingTuple,
}

#[derive(Debug, Clone, Copy)]
struct Overflowed {
    epoch: u32,
    tuple: PendingTuple,
}

/// Pending trees of one spout executor.
#[derive(Debug)]
pub(crate) struct PendingTrees {
    slots: Vec<Slot>,
    /// Free slot numbers, the most recently freed last.
    free: Vec<u32>,
    overflow: IdMap<Overflowed>,
    len: usize,
    epoch: u32,
    /// The most slots this slab uses (tests lower it to reach the overflow).
    max_slots: usize,
}

impl Default for PendingTrees {
    fn default() -> Self {
        PendingTrees::with_max_slots(MAX_SLOTS)
    }
}

impl PendingTrees {
    fn with_max_slots(max_slots: usize) -> Self {
        PendingTrees {
            slots: Vec::new(),
            free: Vec::new(),
            overflow: IdMap::default(),
            len: 0,
            epoch: 0,
            max_slots: max_slots.min(MAX_SLOTS),
        }
    }

    /// Tracks `tuple` under a new root id, returned (never 0).
    pub(crate) fn insert(&mut self, rng: &mut SplitMix64, tuple: PendingTuple) -> u64 {
        self.len += 1;
        let slot = match self.free.pop() {
            Some(s) => s as usize,
            None if self.slots.len() < self.max_slots => {
                self.slots.push(Slot { root: 0, epoch: 0, acks: 0, tuple });
                self.slots.len() - 1
            }
            None => {
                // Full: a random root that no slot holds (their roots are all taken).
                let root = loop {
                    let root = rng.next_id();
                    if self.slot_index(root).is_none() && !self.overflow.contains_key(&root) {
                        break root;
                    }
                };
                self.overflow.insert(root, Overflowed { epoch: self.epoch, tuple });
                return root;
            }
        };
        let random = loop {
            let r = rng.next_u64() & ((1 << RANDOM_BITS) - 1);
            if slot != 0 || r != 0 {
                break r;
            }
        };
        let root = ((slot as u64) << RANDOM_BITS) | random;
        self.slots[slot] = Slot { root, epoch: self.epoch, acks: 0, tuple };
        root
    }

    /// The tree `root`'s acker runs on this thread: its `Init(root, val)` is applied here, and
    /// so are the acks that follow ([`Self::xor_acks`]), with no message to the thread's own
    /// inbox and no ledger entry. False (the `Init` is to be sent) for a tree in the overflow,
    /// or for a value of 0 (which says "not tracked here").
    pub(crate) fn track_acks(&mut self, root: u64, val: u64) -> bool {
        match self.slot_mut(root) {
            Some(slot) if val != 0 => {
                slot.acks = val;
                true
            }
            _ => false,
        }
    }

    /// XORs an `Ack`'s `val` into the tree `root` tracked here: `Some(true)` when the tree is
    /// complete, `None` for a root not tracked here (another executor's tree, or one gone).
    pub(crate) fn xor_acks(&mut self, root: u64, val: u64) -> Option<bool> {
        let slot = self.slot_mut(root).filter(|s| s.acks != 0)?;
        slot.acks ^= val;
        Some(slot.acks == 0)
    }

    /// Whether the tree `root` is tracked here (its `Fail` fails it here).
    pub(crate) fn acked_here(&self, root: u64) -> bool {
        self.slot(root).is_some_and(|s| s.acks != 0)
    }

    /// The index of the pending tree `root`'s slot, if it is in the slab (a free slot's root
    /// is 0, never a tree's).
    fn slot_index(&self, root: u64) -> Option<usize> {
        let index = (root >> RANDOM_BITS) as usize;
        (root != 0 && self.slots.get(index).is_some_and(|s| s.root == root)).then_some(index)
    }

    fn slot(&self, root: u64) -> Option<&Slot> {
        self.slot_index(root).and_then(|i| self.slots.get(i))
    }

    fn slot_mut(&mut self, root: u64) -> Option<&mut Slot> {
        self.slot_index(root).and_then(|i| self.slots.get_mut(i))
    }

    /// Stops tracking `root`, returning its tuple; `None` for a root not pending (timed out,
    /// failed already, or never this executor's).
    pub(crate) fn remove(&mut self, root: u64) -> Option<PendingTuple> {
        if let Some(index) = self.slot_index(root)
            && let Some(slot) = self.slots.get_mut(index)
        {
            slot.root = 0;
            self.free.push(index as u32);
            self.len -= 1;
            return Some(slot.tuple);
        }
        if self.overflow.is_empty() {
            return None;
        }
        let o = self.overflow.remove(&root)?;
        self.len -= 1;
        Some(o.tuple)
    }

    /// Stops tracking, and returns, every tree for which `doomed` holds.
    pub(crate) fn remove_where(
        &mut self,
        mut doomed: impl FnMut(u32, &PendingTuple) -> bool,
    ) -> Vec<(u64, PendingTuple)> {
        let mut removed = Vec::new();
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if slot.root != 0 && doomed(slot.epoch, &slot.tuple) {
                removed.push((slot.root, slot.tuple));
                slot.root = 0;
                self.free.push(index as u32);
            }
        }
        let gone: Vec<u64> =
            self.overflow.iter().filter(|(_, o)| doomed(o.epoch, &o.tuple)).map(|(root, _)| *root).collect();
        for root in gone {
            if let Some(o) = self.overflow.remove(&root) {
                removed.push((root, o.tuple));
            }
        }
        self.len -= removed.len();
        removed
    }

    /// Advances one rotation and returns the trees that timed out with it: those taken
    /// [`ROTATIONS`] rotations ago or earlier.
    pub(crate) fn rotate(&mut self) -> Vec<(u64, PendingTuple)> {
        self.epoch = self.epoch.wrapping_add(1);
        let now = self.epoch;
        self.remove_where(|epoch, _| now.wrapping_sub(epoch) >= ROTATIONS)
    }

    /// Trees pending.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    fn tuple(msg_id: u64) -> PendingTuple {
        PendingTuple { msg_id, task_index: (msg_id % 3) as usize, emitted_at: Instant::now() }
    }

    #[test]
    fn a_root_names_its_slot_and_a_reused_slot_refuses_the_old_root() {
        let mut rng = SplitMix64::new(1);
        let mut p = PendingTrees::default();
        let a = p.insert(&mut rng, tuple(10));
        let b = p.insert(&mut rng, tuple(11));
        assert_eq!((a >> RANDOM_BITS, b >> RANDOM_BITS), (0, 1));
        assert_eq!(p.remove(a).map(|t| t.msg_id), Some(10));
        // Slot 0 again, under another root: the old root's (late, duplicate) verdict is refused.
        let c = p.insert(&mut rng, tuple(12));
        assert_eq!(c >> RANDOM_BITS, 0);
        assert_ne!(c, a);
        assert!(p.remove(a).is_none());
        assert_eq!(p.len(), 2);
        // Ids that no slot holds are refused, not a panic.
        assert!(p.remove(0).is_none());
        assert!(p.remove(u64::MAX).is_none());
        assert_eq!(p.remove(c).map(|t| t.msg_id), Some(12));
        assert_eq!(p.remove(b).map(|t| t.msg_id), Some(11));
        assert_eq!(p.len(), 0);
    }

    #[test]
    fn a_tree_whose_acker_runs_here_completes_when_its_acks_xor_to_zero() {
        let mut rng = SplitMix64::new(4);
        let mut p = PendingTrees::with_max_slots(2);
        let (here, elsewhere) = (p.insert(&mut rng, tuple(1)), p.insert(&mut rng, tuple(2)));
        let overflowed = p.insert(&mut rng, tuple(3));
        let (a, b) = (0x1234_5678_9abc_def0u64, 0x0fed_cba9_8765_4321u64);
        assert!(p.track_acks(here, a ^ b));
        // Not tracked here: the tree's acker is elsewhere, or the tree is in the overflow.
        assert!(!p.track_acks(overflowed, a));
        assert_eq!((p.xor_acks(elsewhere, a), p.acked_here(elsewhere)), (None, false));
        assert_eq!(p.xor_acks(overflowed, a), None);
        assert!(p.acked_here(here));
        assert_eq!(p.xor_acks(here, a), Some(false));
        assert_eq!(p.xor_acks(here, b), Some(true));
        assert_eq!(p.remove(here).map(|t| t.msg_id), Some(1));
        // Gone: a late ack is refused, and a new tree in the slot starts untracked.
        assert_eq!((p.xor_acks(here, a), p.acked_here(here)), (None, false));
        let next = p.insert(&mut rng, tuple(4));
        assert_eq!(next >> RANDOM_BITS, here >> RANDOM_BITS);
        assert_eq!(p.xor_acks(next, a), None);
    }

    #[test]
    fn trees_time_out_on_the_third_rotation_like_three_buckets() {
        let mut rng = SplitMix64::new(2);
        let mut p = PendingTrees::default();
        let old = p.insert(&mut rng, tuple(1));
        assert!(p.rotate().is_empty());
        let young = p.insert(&mut rng, tuple(2));
        assert!(p.rotate().is_empty());
        assert_eq!(p.rotate().iter().map(|(r, t)| (*r, t.msg_id)).collect::<Vec<_>>(), vec![(old, 1)]);
        assert_eq!(p.len(), 1);
        assert_eq!(p.rotate().iter().map(|(r, _)| *r).collect::<Vec<_>>(), vec![young]);
        assert_eq!(p.len(), 0);
    }

    #[test]
    fn beyond_the_slab_trees_go_to_the_overflow_and_back() {
        let mut rng = SplitMix64::new(3);
        let mut p = PendingTrees::with_max_slots(2);
        let roots: Vec<u64> = (0..5).map(|i| p.insert(&mut rng, tuple(i))).collect();
        assert_eq!(p.len(), 5);
        assert_eq!(p.overflow.len(), 3);
        assert_eq!(roots.iter().collect::<BTreeSet<_>>().len(), 5);
        assert_eq!(p.remove(roots[3]).map(|t| t.msg_id), Some(3));
        assert_eq!(p.remove(roots[0]).map(|t| t.msg_id), Some(0));
        let lost = p.remove_where(|_, t| t.msg_id == 4);
        assert_eq!(lost.iter().map(|(r, t)| (*r, t.msg_id)).collect::<Vec<_>>(), vec![(roots[4], 4)]);
        assert_eq!(p.len(), 2);
        let timed_out: BTreeSet<u64> = (0..3).flat_map(|_| p.rotate()).map(|(_, t)| t.msg_id).collect();
        assert_eq!(timed_out, BTreeSet::from([1, 2]));
        assert_eq!(p.len(), 0);
    }

    proptest! {
        /// Against a model map: every tree is answered exactly once, by its own root, until it
        /// times out; ids of trees no longer pending are refused.
        #[test]
        fn behaves_like_a_map_of_live_roots(ops in proptest::collection::vec((0u8..4, any::<u16>()), 1..400), slots in 1usize..8) {
            let mut rng = SplitMix64::new(9);
            let mut p = PendingTrees::with_max_slots(slots);
            let mut model: std::collections::BTreeMap<u64, (u64, u32)> = Default::default();
            let mut gone: Vec<u64> = Vec::new();
            let mut epoch = 0u32;
            for (i, (op, pick)) in ops.into_iter().enumerate() {
                match op {
                    0 | 1 => {
                        let root = p.insert(&mut rng, tuple(i as u64));
                        prop_assert!(root != 0);
                        prop_assert!(model.insert(root, (i as u64, epoch)).is_none());
                    }
                    2 => {
                        let root = if !model.is_empty() && pick % 4 != 0 {
                            *model.keys().nth(pick as usize % model.len()).unwrap()
                        } else if !gone.is_empty() {
                            gone[pick as usize % gone.len()]
                        } else {
                            u64::from(pick)
                        };
                        let want = model.remove(&root).map(|(id, _)| id);
                        prop_assert_eq!(p.remove(root).map(|t| t.msg_id), want);
                        gone.push(root);
                    }
                    _ => {
                        epoch += 1;
                        let got: BTreeSet<u64> = p.rotate().into_iter().map(|(r, _)| r).collect();
                        let want: BTreeSet<u64> =
                            model.iter().filter(|(_, (_, e))| epoch - e >= ROTATIONS).map(|(r, _)| *r).collect();
                        prop_assert_eq!(&got, &want);
                        model.retain(|r, _| !want.contains(r));
                        gone.extend(want);
                    }
                }
                prop_assert_eq!(p.len(), model.len());
            }
        }
    }
}
