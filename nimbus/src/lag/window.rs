//! What nimbus remembers between lag passes, as pure data: per topic partition the last
//! `intervals` log-end offsets, per group partition the last `intervals` commits (Burrow's
//! in-memory storage), and the [`LagState::apply`] step that takes one pass's reads and
//! returns the report the metrics show.
//!
//! A commit is new when its znode's `mzxid` is (Burrow's ZooKeeper module orders commits the
//! same way); its lag is measured against the newest log end known when it is seen, and it is
//! dropped while no log end is known for its partition (as Burrow drops commits for a topic
//! it has no broker offsets for). Groups and partitions missing from a pass are forgotten, so
//! their series disappear; nothing depends on a topology running.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::evaluator::{self, Commit, Rules, Status};

/// A partition: topic and number.
pub type TopicPartition = (String, i32);

/// A partition's offsets as the brokers gave them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermarks {
    pub oldest: i64,
    pub log_end: i64,
}

/// A committed offset as read from `/consumers/<g>/offsets/<topic>/<partition>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OffsetRead {
    Committed {
        offset: i64,
        mzxid: i64,
        mtime_ms: i64,
    },
    /// The znode's data is not a decimal offset: reported (ERR), never fatal.
    Garbage(String),
}

/// Where a group's committed offsets were read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OffsetsSource {
    /// `/consumers/<g>/offsets`: a commit's order is its znode's `mzxid`.
    #[default]
    ZooKeeper,
    /// The group coordinator (a spout with `offsets_storage: kafka`): a commit's order is the
    /// monitor's own count of offset changes, and its time when the monitor saw it.
    Kafka,
}

/// One group as read in one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupRead {
    /// Children of `/consumers/<g>/ids`.
    pub members: usize,
    pub offsets: BTreeMap<TopicPartition, OffsetRead>,
    pub source: OffsetsSource,
}

/// Everything one pass read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassRead {
    pub groups: BTreeMap<String, GroupRead>,
    /// Per topic the brokers' watermarks of each partition, or why they could not be read.
    pub topics: BTreeMap<String, Result<BTreeMap<i32, Watermarks>, String>>,
}

/// One partition of a group in a report.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionReport {
    pub topic: String,
    pub partition: i32,
    pub status: Status,
    pub complete: f32,
    /// The last committed offset read (even one the window dropped).
    pub committed: Option<i64>,
    /// Log end minus committed, when both are known.
    pub lag: Option<u64>,
    pub log_end: Option<i64>,
}

/// One group in a report.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupReport {
    pub group: String,
    pub members: usize,
    /// Burrow's group status (STOP, STALL, REWIND count as ERR).
    pub status: Status,
    /// The worst partition status.
    pub worst: Status,
    /// The fraction of partitions whose window is full (Burrow's group `complete`).
    pub complete: f32,
    pub partitions: Vec<PartitionReport>,
}

/// One topic partition's watermarks in a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicPartitionReport {
    pub topic: String,
    pub partition: i32,
    pub watermarks: Watermarks,
}

/// What a pass found, for the metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LagReport {
    pub groups: Vec<GroupReport>,
    pub topics: Vec<TopicPartitionReport>,
}

/// The windows kept between passes.
#[derive(Debug, Clone)]
pub struct LagState {
    intervals: usize,
    rules: Rules,
    log_ends: HashMap<TopicPartition, VecDeque<i64>>,
    commits: HashMap<String, HashMap<TopicPartition, VecDeque<Commit>>>,
    /// Where each group's commits came from: orders from two sources do not compare, so a
    /// group that changes source (a migration to Kafka storage) starts its windows afresh.
    sources: HashMap<String, OffsetsSource>,
}

impl LagState {
    /// `intervals` is Burrow's window length (at least 1).
    pub fn new(intervals: usize, rules: Rules) -> Self {
        LagState {
            intervals: intervals.max(1),
            rules,
            log_ends: HashMap::new(),
            commits: HashMap::new(),
            sources: HashMap::new(),
        }
    }

    /// Takes one pass's reads at `now_ms` and judges every group.
    pub fn apply(&mut self, read: &PassRead, now_ms: i64) -> LagReport {
        let mut report = LagReport::default();
        let mut seen_partitions = HashMap::new();
        for (topic, result) in &read.topics {
            let Ok(partitions) = result else { continue };
            for (&partition, &watermarks) in partitions {
                let key = (topic.clone(), partition);
                push_bounded(
                    self.log_ends.entry(key.clone()).or_default(),
                    watermarks.log_end,
                    self.intervals,
                );
                seen_partitions.insert(key, ());
                report.topics.push(TopicPartitionReport { topic: topic.clone(), partition, watermarks });
            }
        }
        // A partition the brokers did not answer for keeps its log ends (the topic may come
        // back); one whose topic is gone from every group and from the reads is forgotten.
        let wanted: std::collections::HashSet<&String> =
            read.groups.values().flat_map(|g| g.offsets.keys().map(|(t, _)| t)).collect();
        self.log_ends.retain(|(topic, _), _| wanted.contains(topic) || read.topics.contains_key(topic));
        self.commits.retain(|group, _| read.groups.contains_key(group));
        self.sources.retain(|group, _| read.groups.contains_key(group));

        for (group, group_read) in &read.groups {
            if self.sources.insert(group.clone(), group_read.source).is_some_and(|s| s != group_read.source) {
                self.commits.remove(group);
            }
            let windows = self.commits.entry(group.clone()).or_default();
            windows.retain(|tp, _| group_read.offsets.contains_key(tp));
            let mut partitions = Vec::new();
            for (tp, offset_read) in &group_read.offsets {
                let topic_failed = matches!(read.topics.get(&tp.0), Some(Err(_)) | None);
                let log_ends = self.log_ends.get(tp);
                let log_end = if topic_failed { None } else { log_ends.and_then(|l| l.back().copied()) };
                let window = windows.entry(tp.clone()).or_default();
                let committed = match offset_read {
                    OffsetRead::Committed { offset, mzxid, mtime_ms } => {
                        let is_new = window.back().is_none_or(|c| *mzxid > c.order);
                        if let (true, Some(end)) = (is_new, log_end) {
                            let lag = Some(u64::try_from(end - offset).unwrap_or(0));
                            let commit =
                                Commit { offset: *offset, order: *mzxid, timestamp_ms: *mtime_ms, lag };
                            push_bounded(window, commit, self.intervals);
                        }
                        Some(*offset)
                    }
                    OffsetRead::Garbage(_) => None,
                };
                let lag = match (committed, log_end) {
                    (Some(c), Some(end)) => Some(u64::try_from(end - c).unwrap_or(0)),
                    _ => None,
                };
                let (status, complete) = if committed.is_none() || log_end.is_none() {
                    (Status::Err, 0.0)
                } else {
                    let commits: Vec<Commit> = window.iter().copied().collect();
                    let ends: Vec<i64> = log_ends.map(|l| l.iter().copied().collect()).unwrap_or_default();
                    let verdict =
                        evaluator::evaluate_partition(&commits, self.intervals, &ends, now_ms, self.rules);
                    (verdict.status, verdict.complete)
                };
                partitions.push(PartitionReport {
                    topic: tp.0.clone(),
                    partition: tp.1,
                    status,
                    complete,
                    committed,
                    lag,
                    log_end,
                });
            }
            let statuses = || partitions.iter().map(|p| p.status);
            let full = partitions.iter().filter(|p| p.complete >= 1.0).count();
            report.groups.push(GroupReport {
                group: group.clone(),
                members: group_read.members,
                status: evaluator::group_status(statuses()),
                worst: evaluator::worst(statuses()),
                complete: if partitions.is_empty() { 0.0 } else { full as f32 / partitions.len() as f32 },
                partitions,
            });
        }
        report
    }
}

fn push_bounded<T>(window: &mut VecDeque<T>, item: T, capacity: usize) {
    if window.len() == capacity {
        window.pop_front();
    }
    window.push_back(item);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(offset: Option<(i64, i64, i64)>, log_end: Result<i64, &str>) -> PassRead {
        let mut group = GroupRead { members: 1, ..Default::default() };
        let read = match offset {
            Some((offset, mzxid, mtime_ms)) => OffsetRead::Committed { offset, mzxid, mtime_ms },
            None => OffsetRead::Garbage("x".into()),
        };
        group.offsets.insert(("t".into(), 0), read);
        let topic = log_end
            .map(|log_end| BTreeMap::from([(0, Watermarks { oldest: 0, log_end })]))
            .map_err(str::to_owned);
        PassRead {
            groups: BTreeMap::from([("g".into(), group)]),
            topics: BTreeMap::from([("t".into(), topic)]),
        }
    }

    fn status(report: &LagReport) -> (Status, Option<u64>) {
        let p = &report.groups[0].partitions[0];
        (p.status, p.lag)
    }

    /// The issue-15 story: caught up, then the consumer stops while the log grows: STOP (the
    /// spout-side status said OK); commits that do not move: STALL; an offset going back: REWIND.
    #[test]
    fn a_consumer_that_stops_after_catching_up_is_stop() {
        let mut state = LagState::new(3, Rules::default());
        let mut t = 0;
        for i in 1..=3 {
            t = i * 1000;
            let report = state.apply(&pass(Some((i * 10, i, t)), Ok(i * 10)), t);
            assert_eq!(status(&report), (Status::Ok, Some(0)));
        }
        // Stopped: the log grows, no commit. STOP once the pause outlasts the window (2 s) and
        // the log ends in the window are all past the last commit.
        let mut seen = Vec::new();
        for step in 1..=6 {
            let report = state.apply(&pass(Some((30, 3, t)), Ok(30 + 100 * step)), t + 1000 * step);
            seen.push(status(&report).0);
        }
        assert_eq!(seen.last(), Some(&Status::Stop), "{seen:?}");
        assert_eq!(
            status(&state.apply(&pass(Some((30, 3, t)), Ok(700)), t + 7000)),
            (Status::Stop, Some(670))
        );
    }

    #[test]
    fn unreadable_offsets_or_brokers_are_err_and_gone_groups_are_forgotten() {
        let mut state = LagState::new(3, Rules::default());
        let report = state.apply(&pass(None, Ok(10)), 0);
        assert_eq!(status(&report), (Status::Err, None));
        assert_eq!(report.groups[0].status, Status::Err);
        let report = state.apply(&pass(Some((5, 1, 0)), Err("all brokers down")), 0);
        assert_eq!(status(&report), (Status::Err, None));
        assert!(report.topics.is_empty());
        let report = state.apply(&PassRead::default(), 0);
        assert!(report.groups.is_empty() && state.commits.is_empty() && state.log_ends.is_empty());
    }
}
