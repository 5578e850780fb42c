//! Choosing target tasks for one emitted tuple: one [`Chooser`] per (stream, subscriber).
//!
//! Deterministic given its seed, so table tests pin the behaviour; the executor seeds each
//! chooser from its task id.

use std::collections::BTreeSet;

use cluster_state::ids::TaskId;

use crate::topology::Grouping;
use crate::tuple::{Fields, HASH_SEED, Value};

/// SplitMix64: a tiny, fast, well-mixed generator for shuffles and tuple-tree ids.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A non-zero random id (zero is the XOR ledger's "complete").
    pub fn next_id(&mut self) -> u64 {
        loop {
            let v = self.next_u64();
            if v != 0 {
                return v;
            }
        }
    }

    /// A uniform index below `n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

/// Round-robin over a task order reshuffled every round (Storm's `ShuffleGrouping`).
#[derive(Debug, Clone)]
struct Shuffle {
    order: Vec<TaskId>,
    pos: usize,
    rng: SplitMix64,
}

impl Shuffle {
    fn new(tasks: Vec<TaskId>, seed: u64) -> Self {
        let mut s = Shuffle { order: tasks, pos: 0, rng: SplitMix64::new(seed) };
        s.reshuffle();
        s
    }

    fn reshuffle(&mut self) {
        for i in (1..self.order.len()).rev() {
            let j = self.rng.below(i + 1);
            self.order.swap(i, j);
        }
    }

    fn next(&mut self) -> Option<TaskId> {
        if self.order.is_empty() {
            return None;
        }
        if self.pos >= self.order.len() {
            self.pos = 0;
            self.reshuffle();
        }
        let t = self.order[self.pos];
        self.pos += 1;
        Some(t)
    }
}

#[derive(Debug, Clone)]
enum Kind {
    Shuffle(Shuffle),
    Fields { tasks: Vec<TaskId>, indices: Vec<usize> },
    All(Vec<TaskId>),
    Global(Option<TaskId>),
    Direct,
}

/// Picks the target tasks of one subscriber for each tuple of one stream.
#[derive(Debug, Clone)]
pub struct Chooser {
    kind: Kind,
    tasks: Vec<TaskId>,
    /// The task every tuple goes to, when there is no choice (one task; not direct).
    only: Option<TaskId>,
}

impl Chooser {
    /// A chooser for `grouping` over the subscriber's `tasks` (ascending), for a stream with
    /// `fields`; `local` are the tasks of the emitting worker (for local-or-shuffle).
    /// Field names must have been validated (unknown ones are skipped).
    pub fn new(
        grouping: &Grouping,
        fields: &Fields,
        tasks: &[TaskId],
        local: &BTreeSet<TaskId>,
        seed: u64,
    ) -> Self {
        let mut tasks = tasks.to_vec();
        tasks.sort_unstable();
        let kind = match grouping {
            Grouping::Shuffle | Grouping::None => Kind::Shuffle(Shuffle::new(tasks.clone(), seed)),
            Grouping::LocalOrShuffle => {
                let here: Vec<TaskId> = tasks.iter().copied().filter(|t| local.contains(t)).collect();
                Kind::Shuffle(Shuffle::new(if here.is_empty() { tasks.clone() } else { here }, seed))
            }
            Grouping::Fields(names) => Kind::Fields {
                tasks: tasks.clone(),
                indices: names.iter().filter_map(|n| fields.index_of(n)).collect(),
            },
            Grouping::All => Kind::All(tasks.clone()),
            Grouping::Global => Kind::Global(tasks.first().copied()),
            Grouping::Direct => Kind::Direct,
        };
        let sole = |tasks: &[TaskId]| match tasks {
            [t] => Some(*t),
            _ => None,
        };
        let only = match &kind {
            Kind::Shuffle(s) => sole(&s.order),
            Kind::Fields { tasks, .. } | Kind::All(tasks) => sole(tasks),
            Kind::Global(t) => *t,
            Kind::Direct => None,
        };
        Chooser { kind, tasks, only }
    }

    /// The task every tuple goes to, when there is no choice (one task; not direct).
    #[inline]
    pub(crate) fn only(&self) -> Option<TaskId> {
        self.only
    }

    /// Whether this subscriber only takes direct emits.
    pub fn is_direct(&self) -> bool {
        matches!(self.kind, Kind::Direct)
    }

    /// Whether `task` is one of the subscriber's tasks (for `emit_direct`).
    pub fn has_task(&self, task: TaskId) -> bool {
        self.tasks.binary_search(&task).is_ok()
    }

    /// Appends the targets of a tuple with `values` to `out` (none for a direct grouping).
    ///
    /// Inline for the usual case of one task: the call and its jump table were ~7% of a split
    /// bolt's thread.
    #[inline]
    pub fn choose(&mut self, values: &[Value], out: &mut Vec<TaskId>) {
        match self.only {
            Some(task) => out.push(task),
            None => self.choose_among(values, out),
        }
    }

    fn choose_among(&mut self, values: &[Value], out: &mut Vec<TaskId>) {
        match &mut self.kind {
            Kind::Shuffle(s) => out.extend(s.next()),
            Kind::Fields { tasks, indices } => {
                // (One task takes every key: `only`, no hash to compute.)
                if tasks.is_empty() {
                    return;
                }
                let mut h = HASH_SEED;
                for i in indices.iter() {
                    h = values.get(*i).unwrap_or(&Value::Null).stable_hash(h);
                }
                out.push(tasks[(h % tasks.len() as u64) as usize]);
            }
            Kind::All(tasks) => out.extend_from_slice(tasks),
            Kind::Global(t) => out.extend(*t),
            Kind::Direct => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn tasks(ids: &[u32]) -> Vec<TaskId> {
        ids.iter().copied().map(TaskId).collect()
    }

    #[test]
    fn one_task_takes_every_tuple_of_every_grouping_but_direct() {
        let fields = Fields::new(["word"]);
        let local = BTreeSet::new();
        for grouping in [
            Grouping::Shuffle,
            Grouping::LocalOrShuffle,
            Grouping::Fields(vec!["word".into()]),
            Grouping::All,
            Grouping::Global,
            Grouping::None,
        ] {
            let mut c = Chooser::new(&grouping, &fields, &tasks(&[7]), &local, 1);
            for word in ["a", "b", "c"] {
                assert_eq!(pick(&mut c, &[Value::from(word)]), tasks(&[7]), "{grouping:?}");
            }
        }
        let mut direct = Chooser::new(&Grouping::Direct, &fields, &tasks(&[7]), &local, 1);
        assert!(pick(&mut direct, &[Value::from("a")]).is_empty(), "direct takes only direct emits");
    }

    fn pick(c: &mut Chooser, values: &[Value]) -> Vec<TaskId> {
        let mut out = Vec::new();
        c.choose(values, &mut out);
        out
    }

    #[test]
    fn fields_grouping_sends_equal_keys_to_one_task() {
        let fields = Fields::new(["word", "n"]);
        let mut c = Chooser::new(
            &Grouping::Fields(vec!["word".into()]),
            &fields,
            &tasks(&[4, 5, 6, 7]),
            &BTreeSet::new(),
            1,
        );
        let mut seen: HashMap<String, TaskId> = HashMap::new();
        let mut used = BTreeSet::new();
        for i in 0..2000 {
            let word = format!("w{}", i % 97);
            let got = pick(&mut c, &[Value::from(word.as_str()), Value::Int(i)]);
            assert_eq!(got.len(), 1);
            used.insert(got[0]);
            let first = *seen.entry(word.clone()).or_insert(got[0]);
            assert_eq!(first, got[0], "word {word} moved task");
        }
        assert_eq!(used.len(), 4, "97 keys should reach all 4 tasks");
        // Another emitter (another worker, another seed) agrees.
        let mut other = Chooser::new(
            &Grouping::Fields(vec!["word".into()]),
            &fields,
            &tasks(&[7, 6, 5, 4]),
            &BTreeSet::new(),
            99,
        );
        for (word, task) in &seen {
            assert_eq!(pick(&mut other, &[Value::from(word.as_str()), Value::Int(0)]), vec![*task]);
        }
    }

    #[test]
    fn all_global_direct_table() {
        let f = Fields::new(["x"]);
        let v = [Value::Int(1)];
        let cases: Vec<(Grouping, Vec<TaskId>)> = vec![
            (Grouping::All, tasks(&[3, 4, 5])),
            (Grouping::Global, tasks(&[3])),
            (Grouping::Direct, tasks(&[])),
        ];
        for (g, want) in cases {
            let mut c = Chooser::new(&g, &f, &tasks(&[5, 3, 4]), &BTreeSet::new(), 7);
            for _ in 0..10 {
                assert_eq!(pick(&mut c, &v), want, "{g:?}");
            }
        }
    }

    #[test]
    fn fields_grouping_over_one_task_sends_every_key_there_and_none_over_no_task() {
        let fields = Fields::new(["word"]);
        let grouping = Grouping::Fields(vec!["word".into()]);
        let mut one = Chooser::new(&grouping, &fields, &tasks(&[9]), &BTreeSet::new(), 1);
        for w in ["a", "b", "", "a longer word than the inline limit of text"] {
            assert_eq!(pick(&mut one, &[Value::from(w)]), tasks(&[9]));
        }
        let mut none = Chooser::new(&grouping, &fields, &[], &BTreeSet::new(), 1);
        assert!(pick(&mut none, &[Value::from("a")]).is_empty());
    }

    #[test]
    fn shuffle_spreads_within_ten_percent() {
        let f = Fields::new(["x"]);
        let ts = tasks(&[1, 2, 3, 4, 5, 6, 7]);
        for g in [Grouping::Shuffle, Grouping::None, Grouping::LocalOrShuffle] {
            let mut c = Chooser::new(&g, &f, &ts, &BTreeSet::new(), 42);
            let mut counts: HashMap<TaskId, u32> = HashMap::new();
            let n = 70_000;
            for _ in 0..n {
                for t in pick(&mut c, &[Value::Int(0)]) {
                    *counts.entry(t).or_default() += 1;
                }
            }
            let expected = f64::from(n) / 7.0;
            for t in &ts {
                let got = f64::from(counts[t]);
                assert!((got - expected).abs() <= 0.1 * expected, "{g:?} task {t}: {got} vs {expected}");
            }
        }
    }

    #[test]
    fn local_or_shuffle_prefers_local_tasks() {
        let f = Fields::new(["x"]);
        let local: BTreeSet<TaskId> = tasks(&[2, 4]).into_iter().collect();
        let mut c = Chooser::new(&Grouping::LocalOrShuffle, &f, &tasks(&[1, 2, 3, 4]), &local, 3);
        for _ in 0..100 {
            let got = pick(&mut c, &[Value::Int(0)]);
            assert!(got.len() == 1 && local.contains(&got[0]));
        }
        let mut none_local = Chooser::new(&Grouping::LocalOrShuffle, &f, &tasks(&[1, 3]), &local, 3);
        let seen: BTreeSet<TaskId> = (0..10).flat_map(|_| pick(&mut none_local, &[Value::Int(0)])).collect();
        assert_eq!(seen, tasks(&[1, 3]).into_iter().collect());
    }

    #[test]
    fn ids_are_never_zero() {
        let mut r = SplitMix64::new(0);
        assert!((0..10_000).all(|_| r.next_id() != 0));
    }
}
