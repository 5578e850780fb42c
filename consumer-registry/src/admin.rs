//! Operators' view of a consumer group's offsets in ZooKeeper (what `squall offsets` drives):
//! read them with their owners, plan a reset, write a plan atomically, export and import
//! Kafka's `ExportZkOffsets` format, and keep named snapshots for replay.
//!
//! The pure parts ([`plan`], [`parse_export`], [`export_lines`]) decide; [`Admin`] reads and
//! writes ZooKeeper. A write is one ZooKeeper `multi`: every offset node that existed is
//! replaced only at the version that was read, so a consumer committing meanwhile makes the
//! whole write fail instead of half-applying it. Writes are refused while the group has live
//! members (`/consumers/[group]/ids` not empty): they would overwrite the reset at their next
//! commit. The same `multi` also fences partition owners: see [`Admin::write`].

use std::collections::BTreeMap;
use std::fmt;

use cluster_state::coord::{self, CreateMode, Op, Session};
use cluster_state::ids::{GroupId, Partition, SnapshotName, Topic};
use cluster_state::paths::KafkaPaths;
use cluster_state::znode::{OffsetData, OffsetSnapshot, OwnerData, ZnodeData};

use crate::assign::TopicPartition;

/// What an operator asked for that cannot be done, or ZooKeeper failing.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(
        "no consumer group {group} in ZooKeeper (nothing under {path}); check --group and --zookeeper (with its chroot)"
    )]
    UnknownGroup { group: GroupId, path: String },
    #[error(
        "consumer group {group} has {} live member(s) ({}); stop them first (squall deactivate or kill the topology, or stop the consumers), then reset",
        members.len(), members.join(", ")
    )]
    LiveMembers { group: GroupId, members: Vec<String> },
    #[error("{source_name} line {line}: {reason}")]
    BadLine { source_name: String, line: usize, reason: String },
    #[error(
        "no snapshot {name} of group {group} ({}); `squall offsets snapshot --group {group} --name {name}` makes one",
        if available.is_empty() { "it has none".to_owned() } else { format!("it has {}", available.join(", ")) }
    )]
    UnknownSnapshot { group: GroupId, name: SnapshotName, available: Vec<String> },
    #[error("snapshot {name} of group {group} already exists; choose another name")]
    SnapshotExists { group: GroupId, name: SnapshotName },
    #[error(
        "group {group} has no committed offsets{} to snapshot; let its consumers commit first",
        topic.as_ref().map(|t| format!(" for topic {t}")).unwrap_or_default()
    )]
    NothingCommitted { group: GroupId, topic: Option<Topic> },
    #[error(
        "the offsets of group {group} changed while the reset was written ({source}); nothing was changed, run it again"
    )]
    ChangedMeanwhile { group: GroupId, source: coord::Error },
    #[error(
        "a consumer of group {group} claimed {} partition {} while the reset was written; nothing was changed: stop the group's consumers (squall deactivate), then run it again",
        tp.topic, tp.partition
    )]
    ClaimedMeanwhile { group: GroupId, tp: TopicPartition },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Coord(#[from] coord::Error),
}

impl AdminError {
    /// Whether running the same command again can succeed without the operator changing
    /// anything: a concurrent change or a lost connection, not bad input or live members.
    pub fn is_retryable(&self) -> bool {
        match self {
            AdminError::ChangedMeanwhile { .. } => true,
            AdminError::Coord(e) => e.is_retryable(),
            _ => false,
        }
    }

    /// Whether a consumer of the group was live (registered, or owning a partition) when the
    /// write was tried: nothing was written, and once it is gone the same write can succeed.
    pub fn is_consumer_live(&self) -> bool {
        matches!(self, AdminError::LiveMembers { .. } | AdminError::ClaimedMeanwhile { .. })
    }
}

/// One partition of a group as ZooKeeper holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionState {
    /// The committed offset and the znode's version (for the compare-and-set write).
    pub committed: Option<(i64, i32)>,
    /// The owning consumer thread, if any.
    pub owner: Option<String>,
}

/// How to reset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetTo {
    Earliest,
    Latest,
    Offset(i64),
    /// Relative to the committed offset (partitions without one start from the earliest).
    ShiftBy(i64),
    /// Explicit offsets (from a file, a snapshot, or a datetime resolved by the broker).
    Given(BTreeMap<TopicPartition, i64>),
}

/// One line of a reset plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanRow {
    pub tp: TopicPartition,
    pub current: Option<i64>,
    pub target: i64,
    /// Set when the target was clamped into the partition's range.
    pub warning: Option<String>,
}

/// Plans a reset of the partitions in `ranges` (each partition's `[earliest, log end]` from
/// the broker). A target outside the range is clamped, with a warning. `Given` offsets for
/// partitions not in `ranges` are an error naming them.
pub fn plan(
    current: &BTreeMap<TopicPartition, Option<i64>>,
    ranges: &BTreeMap<TopicPartition, (i64, i64)>,
    to: &ResetTo,
) -> Result<Vec<PlanRow>, AdminError> {
    if let ResetTo::Given(given) = to
        && let Some(tp) = given.keys().find(|tp| !ranges.contains_key(*tp))
    {
        return Err(AdminError::Invalid(format!(
            "{} partition {} does not exist on the broker",
            tp.topic, tp.partition
        )));
    }
    let mut rows = Vec::new();
    for (tp, &(low, high)) in ranges {
        let committed = current.get(tp).copied().flatten();
        let wanted = match to {
            ResetTo::Earliest => low,
            ResetTo::Latest => high,
            ResetTo::Offset(o) => *o,
            ResetTo::ShiftBy(n) => committed.unwrap_or(low).saturating_add(*n),
            ResetTo::Given(given) => match given.get(tp) {
                Some(o) => *o,
                None => continue,
            },
        };
        let target = wanted.clamp(low, high.max(low));
        let warning = (target != wanted).then(|| {
            format!("{wanted} is outside [{low}, {high}] (the broker's earliest and log end); using {target}")
        });
        rows.push(PlanRow { tp: tp.clone(), current: committed, target, warning });
    }
    Ok(rows)
}

/// Kafka's `ExportZkOffsets` format: one `/consumers/G/offsets/T/P:offset` line per partition
/// (paths without the chroot, as Kafka writes them).
pub fn export_lines(group: &GroupId, offsets: &BTreeMap<TopicPartition, i64>) -> String {
    offsets
        .iter()
        .map(|(tp, o)| format!("/consumers/{group}/offsets/{}/{}:{o}\n", tp.topic, tp.partition))
        .collect()
}

/// Parses `ExportZkOffsets` lines for `group` (blank lines and `#` comments skipped). A line
/// of another group, a bad path or offset is an error naming the line.
pub fn parse_export(
    text: &str,
    group: &GroupId,
    source_name: &str,
) -> Result<BTreeMap<TopicPartition, i64>, AdminError> {
    let mut offsets = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad =
            |reason: String| AdminError::BadLine { source_name: source_name.to_owned(), line: i + 1, reason };
        let (path, offset) = line
            .rsplit_once(':')
            .ok_or_else(|| bad(format!("{line:?} is not /consumers/GROUP/offsets/TOPIC/PARTITION:OFFSET")))?;
        let parts: Vec<&str> = path.split('/').collect();
        let ["", "consumers", g, "offsets", topic, partition] = parts.as_slice() else {
            return Err(bad(format!("{path:?} is not /consumers/GROUP/offsets/TOPIC/PARTITION")));
        };
        if *g != group.as_str() {
            return Err(bad(format!("the line is for group {g}, not {group}")));
        }
        let topic = Topic::new(*topic).map_err(|e| bad(e.to_string()))?;
        let partition = partition
            .parse::<i32>()
            .ok()
            .and_then(|p| Partition::new(p).ok())
            .ok_or_else(|| bad(format!("partition {partition:?} is not a partition number")))?;
        let offset = offset
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|o| *o >= 0)
            .ok_or_else(|| bad(format!("offset {offset:?} is not a non-negative number")))?;
        if offsets.insert(TopicPartition::new(topic, partition), offset).is_some() {
            return Err(bad("the partition appears twice".into()));
        }
    }
    Ok(offsets)
}

/// Reads and writes one ZooKeeper registry's groups.
#[derive(Debug)]
pub struct Admin<'a> {
    session: &'a Session,
    paths: KafkaPaths,
}

fn none_if_missing<T>(r: coord::Result<T>) -> coord::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(coord::Error::NoNode { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

impl<'a> Admin<'a> {
    pub fn new(session: &'a Session, paths: KafkaPaths) -> Self {
        Admin { session, paths }
    }

    async fn children(&self, path: &str) -> coord::Result<Vec<String>> {
        Ok(none_if_missing(self.session.children(path).await)?.unwrap_or_default())
    }

    async fn require_group(&self, group: &GroupId) -> Result<(), AdminError> {
        let path = self.paths.group(group);
        if self.session.exists(&path).await?.is_none() {
            return Err(AdminError::UnknownGroup { group: group.clone(), path });
        }
        Ok(())
    }

    /// The group's live members (consumer ids under `/ids`).
    pub async fn members(&self, group: &GroupId) -> Result<Vec<String>, AdminError> {
        Ok(self.children(&self.paths.ids_dir(group)).await?)
    }

    /// Every partition with a committed offset or an owner (of `topic` only, if given).
    pub async fn read(
        &self,
        group: &GroupId,
        topic: Option<&Topic>,
    ) -> Result<BTreeMap<TopicPartition, PartitionState>, AdminError> {
        self.require_group(group).await?;
        let mut out: BTreeMap<TopicPartition, PartitionState> = BTreeMap::new();
        let wanted = |t: &Topic| topic.is_none_or(|want| want == t);
        for name in self.children(&self.paths.offsets_dir(group)).await? {
            let Ok(t) = Topic::new(name.as_str()) else { continue };
            if !wanted(&t) {
                continue;
            }
            for p in self.children(&self.paths.offsets_topic(group, &t)).await? {
                let Some(partition) = p.parse::<i32>().ok().and_then(|p| Partition::new(p).ok()) else {
                    continue;
                };
                let path = self.paths.offset(group, &t, partition);
                if let Some((offset, stat)) = none_if_missing(self.session.read::<OffsetData>(&path).await)? {
                    let entry = out
                        .entry(TopicPartition::new(t.clone(), partition))
                        .or_insert(PartitionState { committed: None, owner: None });
                    entry.committed = Some((offset.get(), stat.version));
                }
            }
        }
        for name in self.children(&self.paths.owners_dir(group)).await? {
            let Ok(t) = Topic::new(name.as_str()) else { continue };
            if !wanted(&t) {
                continue;
            }
            for p in self.children(&self.paths.owners_topic(group, &t)).await? {
                let Some(partition) = p.parse::<i32>().ok().and_then(|p| Partition::new(p).ok()) else {
                    continue;
                };
                let path = self.paths.owner(group, &t, partition);
                if let Some((owner, _)) = none_if_missing(self.session.read::<OwnerData>(&path).await)? {
                    out.entry(TopicPartition::new(t.clone(), partition))
                        .or_insert(PartitionState { committed: None, owner: None })
                        .owner = Some(owner.0.as_str().to_owned());
                }
            }
        }
        Ok(out)
    }

    /// Writes `plan` in one transaction; see the module docs. Refused while members live.
    ///
    /// ZooKeeper cannot make "`/ids` has no children" part of a `multi` (a check op compares
    /// a node's data version, which new children do not change), so a consumer could register
    /// between the membership check and the write. What matters is that it cannot read the
    /// old offsets and commit over the reset, and that the `multi` does fence: for every
    /// partition it creates the owner node and deletes it again. A consumer that claimed the
    /// partition first makes the create fail ([`AdminError::ClaimedMeanwhile`], nothing
    /// written); one that claims it afterwards reads the reset offset, as a Squall member reads
    /// a partition's offset only once its owner node is created. (Kafka's own 0.8 consumer
    /// reads before it claims, so for it the fence is narrower.) The members are read again
    /// after the write and returned: normally empty, otherwise the caller warns.
    pub async fn write(
        &self,
        group: &GroupId,
        read: &BTreeMap<TopicPartition, PartitionState>,
        plan: &[PlanRow],
    ) -> Result<Vec<String>, AdminError> {
        let members = self.members(group).await?;
        if !members.is_empty() {
            return Err(AdminError::LiveMembers { group: group.clone(), members });
        }
        // Parents first (creating a directory is harmless if the transaction then fails).
        for row in plan {
            self.session.ensure_path(&self.paths.offsets_topic(group, &row.tp.topic)).await?;
            self.session.ensure_path(&self.paths.owners_topic(group, &row.tp.topic)).await?;
        }
        // The owner fence first: op 2i creates row i's owner node, 2i + 1 deletes it.
        let mut ops = Vec::new();
        for row in plan {
            let path = self.paths.owner(group, &row.tp.topic, row.tp.partition);
            ops.push(Op::Create { path: path.clone(), data: Vec::new(), mode: CreateMode::Ephemeral });
            ops.push(Op::Delete { path, version: None });
        }
        for row in plan {
            let path = self.paths.offset(group, &row.tp.topic, row.tp.partition);
            let data = OffsetData::new(row.target).map_err(|e| AdminError::Invalid(e.to_string()))?.encode();
            match read.get(&row.tp).and_then(|s| s.committed) {
                Some((_, version)) => ops.push(Op::SetData { path, data, version: Some(version) }),
                None => ops.push(Op::Create { path, data, mode: CreateMode::Persistent }),
            }
        }
        self.session.multi(&ops).await.map_err(|e| match e {
            coord::Error::MultiFailed { index, source }
                if index < 2 * plan.len() && matches!(*source, coord::Error::NodeExists { .. }) =>
            {
                AdminError::ClaimedMeanwhile { group: group.clone(), tp: plan[index / 2].tp.clone() }
            }
            e @ coord::Error::MultiFailed { .. } => {
                AdminError::ChangedMeanwhile { group: group.clone(), source: e }
            }
            other => AdminError::Coord(other),
        })?;
        self.members(group).await
    }

    /// Stores the group's committed offsets (of `topic`, if given) as snapshot `name`.
    pub async fn snapshot(
        &self,
        group: &GroupId,
        name: &SnapshotName,
        topic: Option<&Topic>,
        now_ms: u64,
    ) -> Result<OffsetSnapshot, AdminError> {
        let read = self.read(group, topic).await?;
        let committed: BTreeMap<TopicPartition, i64> =
            read.iter().filter_map(|(tp, s)| s.committed.map(|(o, _)| (tp.clone(), o))).collect();
        self.snapshot_offsets(group, name, topic, &committed, now_ms).await
    }

    /// Stores `committed` (of `topic`, if given) as snapshot `name` of the group: offsets read
    /// elsewhere (the group coordinator, when the group commits to Kafka).
    pub async fn snapshot_offsets(
        &self,
        group: &GroupId,
        name: &SnapshotName,
        topic: Option<&Topic>,
        committed: &BTreeMap<TopicPartition, i64>,
        now_ms: u64,
    ) -> Result<OffsetSnapshot, AdminError> {
        let mut offsets: BTreeMap<String, BTreeMap<Partition, OffsetData>> = BTreeMap::new();
        for (tp, &o) in committed.iter().filter(|(tp, _)| topic.is_none_or(|t| &tp.topic == t)) {
            let o = OffsetData::new(o).map_err(|e| AdminError::Invalid(e.to_string()))?;
            offsets.entry(tp.topic.to_string()).or_default().insert(tp.partition, o);
        }
        if offsets.is_empty() {
            return Err(AdminError::NothingCommitted { group: group.clone(), topic: topic.cloned() });
        }
        let snapshot = OffsetSnapshot { created_ms: now_ms, offsets };
        let path = self.paths.snapshot(group, name);
        match self.session.create(&path, &snapshot.encode(), CreateMode::Persistent.with_parents()).await {
            Ok(_) => Ok(snapshot),
            Err(coord::Error::NodeExists { .. }) => {
                Err(AdminError::SnapshotExists { group: group.clone(), name: name.clone() })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The offsets of snapshot `name` (of `topic` only, if given).
    pub async fn read_snapshot(
        &self,
        group: &GroupId,
        name: &SnapshotName,
        topic: Option<&Topic>,
    ) -> Result<BTreeMap<TopicPartition, i64>, AdminError> {
        let path = self.paths.snapshot(group, name);
        let Some((snapshot, _)) = none_if_missing(self.session.read::<OffsetSnapshot>(&path).await)? else {
            let mut available = self.snapshots(group).await?;
            available.sort();
            return Err(AdminError::UnknownSnapshot { group: group.clone(), name: name.clone(), available });
        };
        let mut out = BTreeMap::new();
        for (t, partitions) in snapshot.offsets {
            let t = Topic::new(t.as_str()).map_err(|e| AdminError::Invalid(format!("{path}: {e}")))?;
            if topic.is_some_and(|want| want != &t) {
                continue;
            }
            for (p, o) in partitions {
                out.insert(TopicPartition::new(t.clone(), p), o.get());
            }
        }
        Ok(out)
    }

    /// The group's snapshot names.
    pub async fn snapshots(&self, group: &GroupId) -> Result<Vec<String>, AdminError> {
        Ok(self.children(&self.paths.snapshots_dir(group)).await?)
    }

    /// Every snapshot of the group by name, each read whole; one that cannot be decoded is
    /// listed with the reason instead of failing the list (it can still be deleted).
    pub async fn list_snapshots(
        &self,
        group: &GroupId,
    ) -> Result<Vec<(String, Result<OffsetSnapshot, String>)>, AdminError> {
        self.require_group(group).await?;
        let mut names = self.snapshots(group).await?;
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let path = format!("{}/{name}", self.paths.snapshots_dir(group));
            match self.session.read::<OffsetSnapshot>(&path).await {
                Ok((snapshot, _)) => out.push((name, Ok(snapshot))),
                // Deleted since the listing.
                Err(coord::Error::NoNode { .. }) => {}
                Err(e @ coord::Error::Decode(_)) => out.push((name, Err(e.to_string()))),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(out)
    }

    /// Deletes snapshot `name`; the group's offsets are not touched.
    pub async fn delete_snapshot(&self, group: &GroupId, name: &SnapshotName) -> Result<(), AdminError> {
        self.require_group(group).await?;
        match self.session.delete(&self.paths.snapshot(group, name), None).await {
            Ok(()) => Ok(()),
            Err(coord::Error::NoNode { .. }) => {
                let mut available = self.snapshots(group).await?;
                available.sort();
                Err(AdminError::UnknownSnapshot { group: group.clone(), name: name.clone(), available })
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl fmt::Display for PlanRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let current = self.current.map_or_else(|| "-".to_owned(), |c| c.to_string());
        write!(f, "{} {} {current} -> {}", self.tp.topic, self.tp.partition, self.target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(topic: &str, p: i32) -> TopicPartition {
        TopicPartition::new(Topic::new(topic).unwrap(), Partition::new(p).unwrap())
    }

    fn group() -> GroupId {
        GroupId::new("g").unwrap()
    }

    #[test]
    fn plans_clamp_into_the_brokers_range() {
        let ranges: BTreeMap<_, _> = [(tp("t", 0), (10, 100)), (tp("t", 1), (0, 50))].into_iter().collect();
        let current: BTreeMap<_, _> = [(tp("t", 0), Some(40)), (tp("t", 1), None)].into_iter().collect();
        let targets = |to: ResetTo| -> Vec<(i64, bool)> {
            plan(&current, &ranges, &to).unwrap().iter().map(|r| (r.target, r.warning.is_some())).collect()
        };
        assert_eq!(targets(ResetTo::Earliest), vec![(10, false), (0, false)]);
        assert_eq!(targets(ResetTo::Latest), vec![(100, false), (50, false)]);
        assert_eq!(targets(ResetTo::Offset(60)), vec![(60, false), (50, true)]);
        assert_eq!(targets(ResetTo::Offset(5)), vec![(10, true), (5, false)]);
        assert_eq!(targets(ResetTo::ShiftBy(-35)), vec![(10, true), (0, true)]);
        assert_eq!(targets(ResetTo::ShiftBy(5)), vec![(45, false), (5, false)]);
        let given = ResetTo::Given([(tp("t", 1), 7)].into_iter().collect());
        assert_eq!(targets(given), vec![(7, false)]);
        let unknown = ResetTo::Given([(tp("t", 9), 7)].into_iter().collect());
        assert!(
            plan(&current, &ranges, &unknown)
                .unwrap_err()
                .to_string()
                .contains("t partition 9 does not exist")
        );
        let row = &plan(&current, &ranges, &ResetTo::Offset(500)).unwrap()[0];
        assert!(row.warning.as_ref().unwrap().contains("500 is outside [10, 100]"), "{row:?}");
    }

    #[test]
    fn plans_at_the_edges() {
        // (range, committed, reset, target, warned)
        let cases = [
            ((0, 0), None, ResetTo::Offset(5), 0, true),
            ((0, 0), Some(0), ResetTo::Latest, 0, false),
            ((7, 7), Some(3), ResetTo::ShiftBy(0), 7, true),
            ((0, 100), Some(90), ResetTo::ShiftBy(i64::MAX), 100, true),
            ((0, 100), Some(10), ResetTo::ShiftBy(i64::MIN), 0, true),
            ((20, 100), None, ResetTo::ShiftBy(5), 25, false),
            ((0, 100), Some(150), ResetTo::ShiftBy(0), 100, true),
            ((0, 100), Some(40), ResetTo::Offset(-1), 0, true),
        ];
        for (range, committed, to, target, warned) in cases {
            let ranges: BTreeMap<_, _> = [(tp("t", 0), range)].into_iter().collect();
            let current: BTreeMap<_, _> = [(tp("t", 0), committed)].into_iter().collect();
            let rows = plan(&current, &ranges, &to).unwrap();
            assert_eq!(rows.len(), 1);
            assert_eq!(
                (rows[0].target, rows[0].warning.is_some()),
                (target, warned),
                "{range:?} {committed:?} {to:?}"
            );
            assert_eq!(rows[0].current, committed);
        }
        let none = plan(&BTreeMap::new(), &BTreeMap::new(), &ResetTo::Earliest).unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn export_round_trips_and_bad_lines_are_named() {
        let offsets: BTreeMap<_, _> =
            [(tp("a", 0), 5), (tp("a", 1), 0), (tp("b.x", 3), 123)].into_iter().collect();
        let text = export_lines(&group(), &offsets);
        assert_eq!(text.lines().next(), Some("/consumers/g/offsets/a/0:5"));
        assert_eq!(parse_export(&format!("# saved\n\n{text}"), &group(), "f").unwrap(), offsets);
        let cases = [
            ("/consumers/g/offsets/a/0", "line 1: \"/consumers/g/offsets/a/0\" is not"),
            ("/consumers/h/offsets/a/0:1", "line 1: the line is for group h, not g"),
            ("/consumers/g/offsets/a/x:1", "line 1: partition \"x\""),
            ("/consumers/g/offsets/a/0:-1", "offset \"-1\""),
            ("/consumers/g/owners/a/0:1", "is not /consumers/GROUP/offsets"),
            ("/consumers/g/offsets/a/0:1\n/consumers/g/offsets/a/0:2", "line 2: the partition appears twice"),
            ("/consumers/g/offsets/a b/0:1", "line 1: "),
        ];
        for (text, says) in cases {
            let err = parse_export(text, &group(), "file.txt").unwrap_err().to_string();
            assert!(err.contains(says) && err.starts_with("file.txt line"), "{text:?}: {err}");
        }
    }
}
