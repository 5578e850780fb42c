//! The decisions of a rebalance, as pure functions: who should own which partition (Kafka 0.8's
//! range and round-robin assignors), and what a member must give up and claim to get there.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use cluster_state::ids::{ConsumerId, ConsumerThreadId, Partition, Topic};
use serde::{Deserialize, Serialize};

/// One partition of one topic.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    pub topic: Topic,
    pub partition: Partition,
}

impl TopicPartition {
    pub fn new(topic: Topic, partition: Partition) -> Self {
        TopicPartition { topic, partition }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Kafka 0.8's `TopicAndPartition.toString`, which round-robin also hashes.
        write!(f, "[{},{}]", self.topic, self.partition)
    }
}

/// Each member's subscription: topic -> number of consumer threads (streams), as registered.
pub type Subscriptions = BTreeMap<ConsumerId, BTreeMap<Topic, u32>>;

/// The partitions of each topic.
pub type TopicPartitions = BTreeMap<Topic, BTreeSet<Partition>>;

/// Which consumer thread should own each partition.
pub type Assignment = BTreeMap<TopicPartition, ConsumerThreadId>;

/// Kafka's `partition.assignment.strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Per topic, contiguous blocks of sorted partitions over sorted threads (Kafka's default).
    #[default]
    Range,
    /// All partitions, ordered by hash, dealt to sorted threads in turn.
    RoundRobin,
}

/// An assignment the strategy refuses to make.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssignError {
    /// Kafka's round-robin rule: every topic must be consumed by the same set of threads.
    #[error(
        "round-robin assignment needs identical subscriptions: topic {topic} is consumed by threads \
         {threads:?}, topic {first_topic} by {first_threads:?}"
    )]
    SubscriptionsDiffer {
        topic: Topic,
        threads: Vec<ConsumerThreadId>,
        first_topic: Topic,
        first_threads: Vec<ConsumerThreadId>,
    },
}

/// Assigns with `strategy`.
pub fn assign(
    strategy: Strategy,
    partitions: &TopicPartitions,
    subscriptions: &Subscriptions,
) -> Result<Assignment, AssignError> {
    match strategy {
        Strategy::Range => Ok(range_assign(partitions, subscriptions)),
        Strategy::RoundRobin => round_robin_assign(partitions, subscriptions),
    }
}

/// The sorted thread ids consuming each topic that has partitions (Kafka's `consumersForTopic`).
fn threads_per_topic(
    partitions: &TopicPartitions,
    subscriptions: &Subscriptions,
) -> BTreeMap<Topic, Vec<ConsumerThreadId>> {
    let mut threads: BTreeMap<Topic, Vec<ConsumerThreadId>> = BTreeMap::new();
    for (consumer, topics) in subscriptions {
        for (topic, &count) in topics {
            if partitions.contains_key(topic) {
                let entry = threads.entry(topic.clone()).or_default();
                entry.extend((0..count).map(|n| ConsumerThreadId::new(consumer, n)));
            }
        }
    }
    // Kafka sorts thread ids as strings, so `c-10` comes before `c-2`.
    threads.values_mut().for_each(|t| t.sort());
    threads.retain(|_, t| !t.is_empty());
    threads
}

/// Kafka 0.8's `RangeAssignor`: per topic, partitions in numeric order and the threads consuming
/// the topic in string order; with `P` partitions and `C` threads each thread gets `P / C`
/// contiguous partitions and the first `P % C` threads one more.
pub fn range_assign(partitions: &TopicPartitions, subscriptions: &Subscriptions) -> Assignment {
    let mut assignment = Assignment::new();
    for (topic, threads) in threads_per_topic(partitions, subscriptions) {
        let Some(sorted) = partitions.get(&topic) else { continue };
        let sorted: Vec<Partition> = sorted.iter().copied().collect();
        let (per_thread, extra) = (sorted.len() / threads.len(), sorted.len() % threads.len());
        for (i, thread) in threads.iter().enumerate() {
            let start = per_thread * i + i.min(extra);
            let count = per_thread + usize::from(i < extra);
            for &partition in &sorted[start..start + count] {
                assignment.insert(TopicPartition::new(topic.clone(), partition), thread.clone());
            }
        }
    }
    assignment
}

/// Java's `String.hashCode`, which Kafka's round-robin assignor orders partitions by.
fn java_hash(s: &str) -> i32 {
    s.encode_utf16().fold(0i32, |h, unit| h.wrapping_mul(31).wrapping_add(i32::from(unit)))
}

/// Kafka 0.8.2's `RoundRobinAssignor`: every topic must be consumed by the same threads; all
/// partitions of all topics, ordered by the Java hash of `[topic,partition]`, are dealt to the
/// threads in string order, one each in turn. Kafka leaves the order of equal hashes to a hash
/// map; here they keep (topic, partition) order, so the result is deterministic.
pub fn round_robin_assign(
    partitions: &TopicPartitions,
    subscriptions: &Subscriptions,
) -> Result<Assignment, AssignError> {
    let threads = threads_per_topic(partitions, subscriptions);
    let Some((first_topic, first_threads)) = threads.iter().next() else { return Ok(Assignment::new()) };
    if let Some((topic, other)) = threads.iter().find(|(_, t)| *t != first_threads) {
        return Err(AssignError::SubscriptionsDiffer {
            topic: topic.clone(),
            threads: other.clone(),
            first_topic: first_topic.clone(),
            first_threads: first_threads.clone(),
        });
    }
    let mut all: Vec<TopicPartition> = threads
        .keys()
        .flat_map(|topic| {
            let ps = partitions.get(topic).into_iter().flatten();
            ps.map(|&p| TopicPartition::new(topic.clone(), p))
        })
        .collect();
    // A stable sort, like Scala's `sortWith`.
    all.sort_by_key(|tp| java_hash(&tp.to_string()));
    Ok(all.into_iter().zip(first_threads.iter().cycle()).map(|(tp, t)| (tp, t.clone())).collect())
}

/// The part of `assignment` that goes to `consumer`'s threads.
pub fn assigned_to(
    assignment: &Assignment,
    consumer: &ConsumerId,
) -> BTreeMap<TopicPartition, ConsumerThreadId> {
    let prefix = format!("{consumer}-");
    assignment
        .iter()
        // A thread id is `<consumer>-<n>`; `c-1` must not match consumer `c-1-x`'s threads, so
        // the rest after the prefix must be the thread number alone.
        .filter(|(_, t)| {
            t.as_str().strip_prefix(&prefix).is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|(tp, t)| (tp.clone(), t.clone()))
        .collect()
}

/// What one member must do to go from what it holds to what it should hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnershipDiff {
    /// Owner nodes to give up (after the caller stopped and acknowledged): partitions no longer
    /// ours, moved to another of our threads, or whose node vanished under us.
    pub release: BTreeSet<TopicPartition>,
    /// Owner nodes to claim, with the thread id to write into them.
    pub claim: BTreeMap<TopicPartition, ConsumerThreadId>,
}

impl OwnershipDiff {
    pub fn is_empty(&self) -> bool {
        self.release.is_empty() && self.claim.is_empty()
    }
}

/// The hand-off plan from `owned` to `desired`. `lost` are owned partitions whose owner node
/// is gone (deleted behind our back): they are released to the caller and claimed afresh.
pub fn ownership_diff(
    owned: &BTreeMap<TopicPartition, ConsumerThreadId>,
    desired: &BTreeMap<TopicPartition, ConsumerThreadId>,
    lost: &BTreeSet<TopicPartition>,
) -> OwnershipDiff {
    let keeps = |tp: &TopicPartition, thread: &ConsumerThreadId| {
        !lost.contains(tp) && desired.get(tp) == Some(thread)
    };
    let release = owned.iter().filter(|(tp, t)| !keeps(tp, t)).map(|(tp, _)| tp.clone()).collect();
    let claim = desired
        .iter()
        .filter(|(tp, t)| owned.get(*tp) != Some(*t) || lost.contains(*tp))
        .map(|(tp, t)| (tp.clone(), t.clone()))
        .collect();
    OwnershipDiff { release, claim }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::{Strategy as _, any, prop_assert, prop_assert_eq, proptest};

    use super::*;

    fn topic(name: &str) -> Topic {
        Topic::new(name).unwrap()
    }

    fn partitions(spec: &[(&str, i32)]) -> TopicPartitions {
        spec.iter().map(|&(t, n)| (topic(t), (0..n).map(|p| Partition::new(p).unwrap()).collect())).collect()
    }

    fn subs(spec: &[(&str, &[(&str, u32)])]) -> Subscriptions {
        spec.iter()
            .map(|(c, topics)| {
                (ConsumerId::new(*c).unwrap(), topics.iter().map(|&(t, n)| (topic(t), n)).collect())
            })
            .collect()
    }

    /// The assignment as `thread -> "topic:p,p,..."` lines, easy to compare in tables.
    fn render(assignment: &Assignment) -> Vec<String> {
        let mut per_thread: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (tp, thread) in assignment {
            per_thread.entry(thread.to_string()).or_default().push(format!("{}:{}", tp.topic, tp.partition));
        }
        per_thread.into_iter().map(|(t, ps)| format!("{t} {}", ps.join(" "))).collect()
    }

    #[test]
    fn range_table() {
        type Case<'a> = (&'a str, &'a [(&'a str, i32)], &'a [(&'a str, &'a [(&'a str, u32)])], &'a [&'a str]);
        let cases: &[Case] = &[
            (
                // Kafka's documentation of `partition.assignment.strategy`: two consumers with two
                // streams each over five partitions.
                "kafka docs: C1, C2 x 2 streams, 5 partitions",
                &[("t", 5)],
                &[("C1", &[("t", 2)]), ("C2", &[("t", 2)])],
                &["C1-0 t:0 t:1", "C1-1 t:2", "C2-0 t:3", "C2-1 t:4"],
            ),
            (
                // The seed's example shape: 10 partitions over 3 threads, first gets the extra.
                "10 partitions over 3 consumers",
                &[("t", 10)],
                &[("a", &[("t", 1)]), ("b", &[("t", 1)]), ("c", &[("t", 1)])],
                &["a-0 t:0 t:1 t:2 t:3", "b-0 t:4 t:5 t:6", "c-0 t:7 t:8 t:9"],
            ),
            (
                // Kafka's RangeAssignor javadoc: C0, C1 over t0, t1 with 3 partitions each.
                "kafka javadoc: two topics of 3",
                &[("t0", 3), ("t1", 3)],
                &[("C0", &[("t0", 1), ("t1", 1)]), ("C1", &[("t0", 1), ("t1", 1)])],
                &["C0-0 t0:0 t0:1 t1:0 t1:1", "C1-0 t0:2 t1:2"],
            ),
            (
                "more threads than partitions: the last threads get nothing",
                &[("t", 2)],
                &[("a", &[("t", 1)]), ("b", &[("t", 1)]), ("c", &[("t", 1)])],
                &["a-0 t:0", "b-0 t:1"],
            ),
            (
                "threads sort as strings: c-10 before c-2",
                &[("t", 11)],
                &[("c", &[("t", 11)])],
                &[
                    "c-0 t:0", "c-1 t:1", "c-10 t:2", "c-2 t:3", "c-3 t:4", "c-4 t:5", "c-5 t:6", "c-6 t:7",
                    "c-7 t:8", "c-8 t:9", "c-9 t:10",
                ],
            ),
            (
                "only subscribers of a topic share it",
                &[("t", 4), ("u", 2)],
                &[("a", &[("t", 1), ("u", 1)]), ("b", &[("t", 1)])],
                &["a-0 t:0 t:1 u:0 u:1", "b-0 t:2 t:3"],
            ),
            ("a topic without partitions is skipped", &[("t", 0)], &[("a", &[("t", 1)])], &[]),
            ("a subscription to an unknown topic is skipped", &[], &[("a", &[("t", 1)])], &[]),
            ("no consumers", &[("t", 3)], &[], &[]),
        ];
        for (name, ps, ss, expected) in cases {
            assert_eq!(render(&range_assign(&partitions(ps), &subs(ss))), *expected, "{name}");
        }
    }

    #[test]
    fn java_hash_matches_java() {
        // Values of `"...".hashCode()` in Java.
        assert_eq!(java_hash(""), 0);
        assert_eq!(java_hash("a"), 97);
        assert_eq!(java_hash("hello"), 99_162_322);
        assert_eq!(java_hash("[t,0]"), 87_540_032);
        assert_eq!(java_hash("[page-views,42]"), -1_937_809_218); // wraps like Java's int
    }

    #[test]
    fn round_robin_table() {
        // Hashes of "[t,0]".."[t,3]" increase with the partition, so dealing is in order.
        let ps = partitions(&[("t", 4)]);
        let ss = subs(&[("a", &[("t", 1)]), ("b", &[("t", 1)])]);
        assert_eq!(render(&round_robin_assign(&ps, &ss).unwrap()), ["a-0 t:0 t:2", "b-0 t:1 t:3"]);

        // Two topics: ordered by hash across topics ("[t,*]" < "[u,*]" since 't' < 'u').
        let ps = partitions(&[("t", 2), ("u", 3)]);
        let ss = subs(&[("a", &[("t", 1), ("u", 1)]), ("b", &[("t", 1), ("u", 1)])]);
        assert_eq!(render(&round_robin_assign(&ps, &ss).unwrap()), ["a-0 t:0 u:0 u:2", "b-0 t:1 u:1"]);

        // Kafka's rule: identical subscriptions only.
        let ss = subs(&[("a", &[("t", 1), ("u", 1)]), ("b", &[("t", 1)])]);
        let err = round_robin_assign(&ps, &ss).unwrap_err();
        assert!(matches!(err, AssignError::SubscriptionsDiffer { ref topic, .. } if topic.as_str() == "u"));
        assert!(round_robin_assign(&ps, &subs(&[])).unwrap().is_empty());
    }

    #[test]
    fn assigned_to_takes_only_that_consumers_threads() {
        let ps = partitions(&[("t", 4)]);
        let ss = subs(&[("c-1", &[("t", 1)]), ("c-1-x", &[("t", 1)]), ("c", &[("t", 2)])]);
        let assignment = range_assign(&ps, &ss);
        let mine: Vec<String> = assigned_to(&assignment, &ConsumerId::new("c-1").unwrap())
            .values()
            .map(ToString::to_string)
            .collect();
        assert_eq!(mine, ["c-1-0"]);
        assert_eq!(assigned_to(&assignment, &ConsumerId::new("c").unwrap()).len(), 2);
    }

    fn tp(t: &str, p: i32) -> TopicPartition {
        TopicPartition::new(topic(t), Partition::new(p).unwrap())
    }

    fn held(entries: &[(&str, i32, &str)]) -> BTreeMap<TopicPartition, ConsumerThreadId> {
        entries.iter().map(|&(t, p, thread)| (tp(t, p), thread.parse().unwrap())).collect()
    }

    #[test]
    fn ownership_diff_table() {
        type Case<'a> = (
            &'a str,
            &'a [(&'a str, i32, &'a str)],
            &'a [(&'a str, i32, &'a str)],
            &'a [(&'a str, i32)],
            &'a [(&'a str, i32)],
            &'a [(&'a str, i32)],
        );
        // name, owned, desired, lost, expected release, expected claim
        let cases: &[Case] = &[
            ("nothing to do", &[("t", 0, "c-0")], &[("t", 0, "c-0")], &[], &[], &[]),
            (
                "first join claims all",
                &[],
                &[("t", 0, "c-0"), ("t", 1, "c-0")],
                &[],
                &[],
                &[("t", 0), ("t", 1)],
            ),
            ("leave releases all", &[("t", 0, "c-0"), ("t", 1, "c-0")], &[], &[], &[("t", 0), ("t", 1)], &[]),
            (
                "a partition moves away, another arrives",
                &[("t", 0, "c-0"), ("t", 1, "c-0")],
                &[("t", 1, "c-0"), ("t", 2, "c-0")],
                &[],
                &[("t", 0)],
                &[("t", 2)],
            ),
            (
                "moving to another of our threads re-claims",
                &[("t", 0, "c-0")],
                &[("t", 0, "c-1")],
                &[],
                &[("t", 0)],
                &[("t", 0)],
            ),
            (
                "a node lost under us is released and re-claimed",
                &[("t", 0, "c-0")],
                &[("t", 0, "c-0")],
                &[("t", 0)],
                &[("t", 0)],
                &[("t", 0)],
            ),
            (
                "a lost node we no longer want is only released",
                &[("t", 0, "c-0")],
                &[],
                &[("t", 0)],
                &[("t", 0)],
                &[],
            ),
        ];
        for (name, owned, desired, lost, release, claim) in cases {
            let lost: BTreeSet<_> = lost.iter().map(|&(t, p)| tp(t, p)).collect();
            let diff = ownership_diff(&held(owned), &held(desired), &lost);
            let expected_release: BTreeSet<_> = release.iter().map(|&(t, p)| tp(t, p)).collect();
            let claimed: BTreeSet<_> = diff.claim.keys().cloned().collect();
            let expected_claim: BTreeSet<_> = claim.iter().map(|&(t, p)| tp(t, p)).collect();
            assert_eq!(diff.release, expected_release, "{name}: release");
            assert_eq!(claimed, expected_claim, "{name}: claim");
        }
    }

    /// Up to three topics of up to 40 partitions; up to 8 consumers, each with 1-3 threads on a
    /// random subset of the topics.
    fn scenario() -> impl proptest::strategy::Strategy<Value = (TopicPartitions, Subscriptions)> {
        let topics = proptest::collection::vec(0i32..40, 1..=3);
        let consumers =
            proptest::collection::vec((1u32..=3, proptest::collection::vec(any::<bool>(), 3)), 0..=8);
        (topics, consumers).prop_map(|(sizes, consumers)| {
            let ps: TopicPartitions = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    (topic(&format!("t{i}")), (0..n).map(|p| Partition::new(p).unwrap()).collect())
                })
                .collect();
            let ss: Subscriptions = consumers
                .iter()
                .enumerate()
                .map(|(c, (threads, picks))| {
                    let topics =
                        (0..sizes.len()).filter(|&i| picks[i]).map(|i| (topic(&format!("t{i}")), *threads));
                    (ConsumerId::new(format!("g_host-{c}")).unwrap(), topics.collect())
                })
                .collect();
            (ps, ss)
        })
    }

    /// Per topic: thread -> how many partitions of it, for threads that consume it.
    fn counts_per_topic(ps: &TopicPartitions, ss: &Subscriptions, a: &Assignment) -> Vec<Vec<usize>> {
        threads_per_topic(ps, ss)
            .iter()
            .map(|(topic, threads)| {
                threads
                    .iter()
                    .map(|t| a.iter().filter(|(tp, owner)| &tp.topic == topic && *owner == t).count())
                    .collect()
            })
            .collect()
    }

    proptest! {
        #[test]
        fn range_assigns_every_partition_once_and_evenly((ps, ss) in scenario()) {
            let a = range_assign(&ps, &ss);
            let threads = threads_per_topic(&ps, &ss);
            for (topic, parts) in &ps {
                for &p in parts {
                    let owner = a.get(&TopicPartition::new(topic.clone(), p));
                    // Assigned exactly once (a map key), to a thread consuming the topic, iff any.
                    prop_assert_eq!(owner.is_some(), threads.contains_key(topic));
                    if let Some(owner) = owner {
                        prop_assert!(threads[topic].contains(owner));
                    }
                }
            }
            for counts in counts_per_topic(&ps, &ss, &a) {
                let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
                prop_assert!(max - min <= 1, "sizes {:?}", counts);
            }
        }

        #[test]
        fn round_robin_with_identical_subscriptions_is_even((ps, ss) in scenario()) {
            // Give every consumer the first consumer's subscription.
            let Some(first) = ss.values().next().cloned() else { return Ok(()) };
            let ss: Subscriptions = ss.keys().map(|c| (c.clone(), first.clone())).collect();
            let a = round_robin_assign(&ps, &ss).unwrap();
            let consumed: usize = ps.iter().filter(|(t, _)| first.contains_key(*t)).map(|(_, p)| p.len()).sum();
            prop_assert_eq!(a.len(), consumed);
            let mut per_thread: BTreeMap<&ConsumerThreadId, usize> = BTreeMap::new();
            for t in a.values() {
                *per_thread.entry(t).or_default() += 1;
            }
            let threads = threads_per_topic(&ps, &ss).into_values().next().unwrap_or_default();
            let counts: Vec<usize> = threads.iter().map(|t| per_thread.get(t).copied().unwrap_or(0)).collect();
            if let (Some(min), Some(max)) = (counts.iter().min(), counts.iter().max()) {
                prop_assert!(max - min <= 1, "sizes {:?}", counts);
            }
        }

        #[test]
        fn applying_the_diff_reaches_the_desired_ownership((ps, ss) in scenario(), (ps2, ss2) in scenario()) {
            let me = ss.keys().next().cloned().unwrap_or_else(|| ConsumerId::new("g_host-0").unwrap());
            let owned = assigned_to(&range_assign(&ps, &ss), &me);
            let desired = assigned_to(&range_assign(&ps2, &ss2), &me);
            let diff = ownership_diff(&owned, &desired, &BTreeSet::new());
            let mut after = owned.clone();
            after.retain(|tp, _| !diff.release.contains(tp));
            // Never claim what we still hold: release first, then claim.
            prop_assert!(diff.claim.keys().all(|tp| !after.contains_key(tp)));
            after.extend(diff.claim.clone());
            prop_assert_eq!(after, desired);
        }
    }
}
