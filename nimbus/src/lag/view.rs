//! The consumer-group pages of the API (and the UI) as pure functions: the lag evaluator's last
//! report merged with what ZooKeeper holds now (owners, committed offsets), and a reset plan
//! (`consumer_registry::admin::plan`, the same as `squall offsets reset`'s dry run) against the
//! log ends and earliest offsets the evaluator last read from the brokers.

use std::collections::BTreeMap;

use cluster_state::api::{
    ConsumerGroupDetail, ConsumerGroupSummary, ConsumerPartition, ResetPlan, ResetPlanRequest, ResetPlanRow,
    ResetTarget,
};
use cluster_state::ids::{GroupId, Partition, Topic};
use consumer_registry::TopicPartition;
use consumer_registry::admin::{self, PartitionState, ResetTo};

use super::evaluator::Status;
use super::window::{GroupReport, LagReport};

/// Why a reset plan cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The evaluator has not read the topic's offsets from any broker.
    #[error(
        "the brokers' offsets of topic {topic} are not known to nimbus (its lag evaluator reads the brokers in \
         squall.lag.kafka.bootstrap.servers and in the stored topologies' Kafka spouts)"
    )]
    UnknownOffsets { topic: String },
    #[error("the group has no partitions to reset{}", topic.as_ref().map(|t| format!(" in topic {t}")).unwrap_or_default())]
    NoPartitions { topic: Option<Topic> },
    #[error("{0}")]
    Plan(String),
}

fn summary(
    group: GroupId,
    report: Option<&GroupReport>,
    members: usize,
    partitions: usize,
) -> ConsumerGroupSummary {
    ConsumerGroupSummary {
        group,
        members,
        status: report.map_or(Status::NotFound, |r| r.status).as_str().to_owned(),
        worst_status: report.map_or(Status::NotFound, |r| r.worst).as_str().to_owned(),
        partitions,
        total_lag: report.map_or(0, |r| r.partitions.iter().filter_map(|p| p.lag).sum()),
    }
}

/// Every group the last report judged (groups whose name is no valid id are left out).
pub fn group_summaries(report: &LagReport) -> Vec<ConsumerGroupSummary> {
    report
        .groups
        .iter()
        .filter_map(|g| {
            let id = GroupId::new(g.group.as_str()).ok()?;
            Some(summary(id, Some(g), g.members, g.partitions.len()))
        })
        .collect()
}

/// One group: every partition the report or ZooKeeper (`zk`, read now) knows, with its owner.
pub fn group_detail(
    group: &GroupId,
    report: &LagReport,
    zk: &BTreeMap<TopicPartition, PartitionState>,
    members: usize,
) -> ConsumerGroupDetail {
    let judged = report.groups.iter().find(|g| g.group == group.as_str());
    let mut rows: BTreeMap<(String, i32), ConsumerPartition> = BTreeMap::new();
    if let Some(g) = judged {
        for p in &g.partitions {
            let Ok(topic) = Topic::new(p.topic.as_str()) else { continue };
            rows.insert(
                (p.topic.clone(), p.partition),
                ConsumerPartition {
                    topic,
                    partition: p.partition,
                    committed_offset: p.committed,
                    log_end_offset: p.log_end,
                    lag: p.lag,
                    owner: None,
                    status: p.status.as_str().to_owned(),
                },
            );
        }
    }
    for (tp, state) in zk {
        let key = (tp.topic.as_str().to_owned(), tp.partition.get());
        let row = rows.entry(key).or_insert_with(|| ConsumerPartition {
            topic: tp.topic.clone(),
            partition: tp.partition.get(),
            committed_offset: None,
            log_end_offset: None,
            lag: None,
            owner: None,
            status: Status::NotFound.as_str().to_owned(),
        });
        row.owner = state.owner.clone();
        // ZooKeeper's offset is newer than the last pass's.
        if let Some((offset, _)) = state.committed {
            row.committed_offset = Some(offset);
            row.lag = row.log_end_offset.map(|end| end.saturating_sub(offset).max(0) as u64);
        }
    }
    let partitions_detail: Vec<ConsumerPartition> = rows.into_values().collect();
    let mut summary = summary(group.clone(), judged, members, partitions_detail.len());
    summary.total_lag = partitions_detail.iter().filter_map(|p| p.lag).sum();
    ConsumerGroupDetail { summary, partitions_detail }
}

/// The reset plan of `request` for `group`: current offsets from ZooKeeper (`zk`), ranges from
/// the report's broker offsets. Nothing is written.
pub fn reset_plan(
    group: &GroupId,
    request: &ResetPlanRequest,
    report: &LagReport,
    zk: &BTreeMap<TopicPartition, PartitionState>,
    members: usize,
) -> Result<ResetPlan, PlanError> {
    let wanted = |topic: &str| request.topic.as_ref().is_none_or(|t| t.as_str() == topic);
    // The group's partitions: committed or owned in ZooKeeper, or judged by the evaluator.
    let mut partitions: BTreeMap<TopicPartition, Option<i64>> = BTreeMap::new();
    for (tp, state) in zk.iter().filter(|(tp, _)| wanted(tp.topic.as_str())) {
        partitions.insert(tp.clone(), state.committed.map(|(o, _)| o));
    }
    if let Some(g) = report.groups.iter().find(|g| g.group == group.as_str()) {
        for p in g.partitions.iter().filter(|p| wanted(&p.topic)) {
            if let (Ok(topic), Ok(partition)) = (Topic::new(p.topic.as_str()), Partition::new(p.partition)) {
                partitions.entry(TopicPartition::new(topic, partition)).or_insert(p.committed);
            }
        }
    }
    if partitions.is_empty() {
        return Err(PlanError::NoPartitions { topic: request.topic.clone() });
    }
    let mut ranges = BTreeMap::new();
    for tp in partitions.keys() {
        let known = report
            .topics
            .iter()
            .find(|t| t.topic == tp.topic.as_str() && t.partition == tp.partition.get())
            .ok_or_else(|| PlanError::UnknownOffsets { topic: tp.topic.to_string() })?;
        ranges.insert(tp.clone(), (known.watermarks.oldest, known.watermarks.log_end));
    }
    let value = request.value.unwrap_or(0);
    let to = match request.to {
        ResetTarget::Earliest => ResetTo::Earliest,
        ResetTarget::Latest => ResetTo::Latest,
        ResetTarget::Offset => ResetTo::Offset(value),
        ResetTarget::ShiftBy => ResetTo::ShiftBy(value),
    };
    let rows = admin::plan(&partitions, &ranges, &to).map_err(|e| PlanError::Plan(e.to_string()))?;
    Ok(ResetPlan {
        group: group.clone(),
        dry_run: true,
        members,
        partitions: rows
            .into_iter()
            .map(|r| ResetPlanRow {
                topic: r.tp.topic,
                partition: r.tp.partition.get(),
                current_offset: r.current,
                target_offset: r.target,
                warning: r.warning,
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lag::window::{PartitionReport, TopicPartitionReport, Watermarks};

    fn tp(t: &str, p: i32) -> TopicPartition {
        TopicPartition::new(Topic::new(t).unwrap(), Partition::new(p).unwrap())
    }

    fn report() -> LagReport {
        let part = |p, committed, end, status| PartitionReport {
            topic: "clicks".into(),
            partition: p,
            status,
            complete: 1.0,
            committed: Some(committed),
            lag: Some((end - committed) as u64),
            log_end: Some(end),
        };
        LagReport {
            groups: vec![GroupReport {
                group: "g".into(),
                members: 1,
                status: Status::Warn,
                worst: Status::Stall,
                complete: 1.0,
                partitions: vec![part(0, 90, 100, Status::Ok), part(1, 10, 50, Status::Stall)],
            }],
            topics: (0..2)
                .map(|p| TopicPartitionReport {
                    topic: "clicks".into(),
                    partition: p,
                    watermarks: Watermarks { oldest: 5, log_end: if p == 0 { 100 } else { 50 } },
                })
                .collect(),
        }
    }

    #[test]
    fn a_group_page_merges_the_verdicts_with_owners_and_fresher_offsets() {
        let group = GroupId::new("g").unwrap();
        assert_eq!(group_summaries(&report())[0].total_lag, 50);
        let zk = BTreeMap::from([
            (tp("clicks", 0), PartitionState { committed: Some((95, 3)), owner: Some("g_h-1-a-0".into()) }),
            (tp("clicks", 2), PartitionState { committed: None, owner: None }),
        ]);
        let d = group_detail(&group, &report(), &zk, 1);
        assert_eq!((d.summary.status.as_str(), d.summary.worst_status.as_str()), ("WARN", "STALL"));
        type Row<'a> = (i32, Option<i64>, Option<u64>, Option<&'a str>, &'a str);
        let rows: Vec<Row> = d
            .partitions_detail
            .iter()
            .map(|p| (p.partition, p.committed_offset, p.lag, p.owner.as_deref(), p.status.as_str()))
            .collect();
        assert_eq!(
            rows,
            [
                (0, Some(95), Some(5), Some("g_h-1-a-0"), "OK"),
                (1, Some(10), Some(40), None, "STALL"),
                (2, None, None, None, "NOTFOUND")
            ]
        );
        assert_eq!(d.summary.total_lag, 45);
    }

    #[test]
    fn a_reset_plan_clamps_into_the_brokers_range_and_needs_known_offsets() {
        let group = GroupId::new("g").unwrap();
        let zk = BTreeMap::new();
        let request = |to, value| ResetPlanRequest { topic: None, to, value };
        let plan = reset_plan(&group, &request(ResetTarget::Earliest, None), &report(), &zk, 0).unwrap();
        let targets: Vec<(i32, Option<i64>, i64)> =
            plan.partitions.iter().map(|r| (r.partition, r.current_offset, r.target_offset)).collect();
        assert_eq!(targets, [(0, Some(90), 5), (1, Some(10), 5)]);
        assert!(plan.dry_run);
        let shifted =
            reset_plan(&group, &request(ResetTarget::ShiftBy, Some(-20)), &report(), &zk, 0).unwrap();
        assert_eq!(shifted.partitions[0].target_offset, 70);
        assert!(shifted.partitions[1].warning.as_deref().unwrap().contains("outside [5, 50]"));
        let other = ResetPlanRequest {
            topic: Some(Topic::new("views").unwrap()),
            to: ResetTarget::Latest,
            value: None,
        };
        assert!(matches!(reset_plan(&group, &other, &report(), &zk, 0), Err(PlanError::NoPartitions { .. })));
        let unknown =
            BTreeMap::from([(tp("views", 0), PartitionState { committed: Some((1, 0)), owner: None })]);
        let err =
            reset_plan(&group, &request(ResetTarget::Latest, None), &report(), &unknown, 0).unwrap_err();
        assert!(err.to_string().contains("topic views"), "{err}");
    }
}
