//! `squall offsets reset`: a target per partition, planned (clamped into the broker's range),
//! printed, and written in one transaction only with `--execute` while nobody is consuming.

use super::kafka::Kafka;
use super::time::parse_datetime;
use std::collections::{BTreeMap, BTreeSet};

use cluster_state::ids::{GroupId, SnapshotName, Topic};
use consumer_registry::TopicPartition;
use consumer_registry::admin::{Admin, ResetTo, parse_export, plan};

use super::{ResetArgs, connection_kafka, effective, group_id, print_plan, session, topic_of};

/// Where a reset goes, with everything that can be checked without a connection checked.
pub(super) enum Target {
    Earliest,
    Latest,
    Offset(i64),
    ShiftBy(i64),
    /// Milliseconds since the epoch.
    Time(i64),
    File(BTreeMap<TopicPartition, i64>),
    Snapshot(SnapshotName),
}

impl Target {
    /// Reads the arguments (the file too): bad input fails here, before anything is contacted.
    fn from_args(args: &ResetArgs, group: &GroupId) -> Result<Target, String> {
        Ok(if let Some(path) = &args.from_file {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            Target::File(parse_export(&text, group, &path.display().to_string()).map_err(|e| e.to_string())?)
        } else if let Some(name) = &args.to.from_snapshot {
            Target::Snapshot(SnapshotName::new(name.as_str()).map_err(|e| format!("--from-snapshot: {e}"))?)
        } else if args.to.to_earliest {
            Target::Earliest
        } else if args.to_latest {
            Target::Latest
        } else if let Some(o) = args.to.to_offset {
            Target::Offset(o)
        } else if let Some(n) = args.to.shift_by {
            Target::ShiftBy(n)
        } else if let Some(iso) = &args.to.to_datetime {
            Target::Time(parse_datetime(iso)?)
        } else {
            return Err("say where to reset to (--to-earliest, --to-latest, ...)".into());
        })
    }
}

/// Why a reset wrote nothing.
#[derive(Debug)]
pub(crate) enum ResetError {
    /// A consumer of the group was live (registered, or claiming a partition while the reset
    /// was written): once it is gone, the same reset can succeed.
    ConsumerLive(String),
    Failed(String),
}

impl std::fmt::Display for ResetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResetError::ConsumerLive(e) | ResetError::Failed(e) => f.write_str(e),
        }
    }
}

impl From<String> for ResetError {
    fn from(e: String) -> ResetError {
        ResetError::Failed(e)
    }
}

/// `squall offsets reset`.
pub(crate) async fn reset(args: ResetArgs) -> Result<(), String> {
    reset_group(args).await.map_err(|e| e.to_string())
}

/// A reset of one group, telling a live consumer apart (`squall replay` waits for it to go).
pub(crate) async fn reset_group(args: ResetArgs) -> Result<(), ResetError> {
    let group = group_id(&args.group)?;
    let topic = args.topic.as_deref().map(topic_of).transpose()?;
    let target = Target::from_args(&args, &group)?;
    if topic.is_none() && !matches!(target, Target::File(_) | Target::Snapshot(_)) {
        return Err(ResetError::Failed(
            "--topic is required (except with --from-file or --from-snapshot)".into(),
        ));
    }
    let kafka = connection_kafka(&args.connection)?;
    let session = session(&args.connection).await?;
    let result = reset_with(&args, &group, topic.as_ref(), target, &kafka, &session).await;
    let _ = session.close().await;
    result
}

pub(super) async fn reset_with(
    args: &ResetArgs,
    group: &GroupId,
    topic: Option<&Topic>,
    target: Target,
    kafka: &Kafka,
    session: &cluster_state::coord::Session,
) -> Result<(), ResetError> {
    let admin = Admin::new(session, args.connection.paths()?);
    let read = admin.read(group, topic).await.map_err(|e| e.to_string())?;
    // A datetime needs the partitions before it can be looked up; everything else is known.
    enum Resolved {
        Known(ResetTo),
        Time(i64),
    }
    let resolved = match target {
        Target::File(mut offsets) => {
            offsets.retain(|tp, _| topic.is_none_or(|t| &tp.topic == t));
            if offsets.is_empty() {
                let file = args.from_file.as_deref().map(|f| f.display().to_string()).unwrap_or_default();
                return Err(format!("{file} has no offsets{}: nothing to reset", for_topic(topic)).into());
            }
            Resolved::Known(ResetTo::Given(offsets))
        }
        Target::Snapshot(name) => {
            let offsets = admin.read_snapshot(group, &name, topic).await.map_err(|e| e.to_string())?;
            if offsets.is_empty() {
                return Err(
                    format!("snapshot {name} has no offsets{}: nothing to reset", for_topic(topic)).into()
                );
            }
            Resolved::Known(ResetTo::Given(offsets))
        }
        Target::Earliest => Resolved::Known(ResetTo::Earliest),
        Target::Latest => Resolved::Known(ResetTo::Latest),
        Target::Offset(o) => Resolved::Known(ResetTo::Offset(o)),
        Target::ShiftBy(n) => Resolved::Known(ResetTo::ShiftBy(n)),
        Target::Time(ms) => Resolved::Time(ms),
    };
    let topics: BTreeSet<Topic> = match &resolved {
        Resolved::Known(ResetTo::Given(given)) => given.keys().map(|tp| tp.topic.clone()).collect(),
        _ => topic.into_iter().cloned().collect(),
    };
    let mut tps = Vec::new();
    for t in &topics {
        tps.extend(kafka.partitions(t)?.into_iter().map(|p| TopicPartition::new(t.clone(), p)));
    }
    let ranges = kafka.ranges(&tps)?;
    let to = match resolved {
        Resolved::Known(to) => to,
        Resolved::Time(ms) => ResetTo::Given(kafka.at_time(&tps, ms)?),
    };
    // With Kafka storage, "current" is where the spouts would start (Kafka's, or the larger).
    let storage = args.connection.offsets_storage;
    let all: Vec<TopicPartition> = ranges.keys().cloned().collect();
    let in_kafka = args.connection.kafka_offsets(Some(kafka), group, &all)?.unwrap_or_default();
    let current: BTreeMap<TopicPartition, Option<i64>> = ranges
        .keys()
        .map(|tp| {
            let zookeeper = read.get(tp).and_then(|s| s.committed).map(|(o, _)| o);
            (tp.clone(), effective(storage, zookeeper, in_kafka.get(tp).copied().flatten()))
        })
        .collect();
    let rows = plan(&current, &ranges, &to).map_err(|e| e.to_string())?;
    print_plan(group, &rows);
    if !args.execute {
        let members = admin.members(group).await.map_err(|e| e.to_string())?;
        if !members.is_empty() {
            println!(
                "note: group {group} has {} live member(s) ({}); --execute is refused until they stop (squall deactivate or kill the topology)",
                members.len(),
                members.join(", ")
            );
        }
        println!("dry run: nothing was written; add --execute to apply");
        return Ok(());
    }
    let joined = admin.write(group, &read, &rows).await.map_err(|e| match e.is_consumer_live() {
        true => ResetError::ConsumerLive(e.to_string()),
        false => ResetError::Failed(e.to_string()),
    })?;
    if storage.uses_kafka() {
        // Both stores, whatever the storage: with `dual` the larger would win, and ZooKeeper
        // kept current under `kafka` is what a move back to `zookeeper` or `dual` starts from.
        let targets: BTreeMap<TopicPartition, i64> = rows.iter().map(|r| (r.tp.clone(), r.target)).collect();
        kafka.commit_group(group, &targets).map_err(|e| {
            format!(
                "ZooKeeper's offsets of group {group} are reset but Kafka's are not: {e}; run the reset again"
            )
        })?;
        println!("reset {} partition offsets of group {group} in ZooKeeper and Kafka", rows.len());
    } else {
        println!("reset {} partition offsets of group {group}", rows.len());
    }
    if !joined.is_empty() {
        eprintln!(
            "warning: {} joined group {group} while the reset was written and may commit over it; stop it and check with `squall offsets describe --group {group}`",
            joined.join(", ")
        );
    }
    Ok(())
}

pub(super) fn for_topic(topic: Option<&Topic>) -> String {
    topic.map(|t| format!(" for topic {t}")).unwrap_or_default()
}
