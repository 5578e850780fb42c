//! What `squall offsets` prints: Kafka's ConsumerOffsetChecker table, the snapshot list, a
//! reset plan.

use super::time::iso_utc;
use cluster_state::ids::GroupId;
use consumer_registry::admin::PlanRow;
use std::collections::BTreeMap;

/// One row of `describe`: ConsumerOffsetChecker's columns.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DescribeRow {
    pub group: String,
    pub topic: String,
    pub partition: i32,
    /// The committed offset (`None`: nothing committed).
    pub offset: Option<i64>,
    /// The broker's log end (`None`: no `--brokers`).
    pub log_end: Option<i64>,
    pub lag: Option<i64>,
    /// The owning consumer thread (`None`: unowned).
    pub owner: Option<String>,
    /// Kafka's side, with `--offsets-storage kafka | dual` (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kafka: Option<KafkaCell>,
}

/// The group's offset in Kafka's group coordinator, next to ZooKeeper's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct KafkaCell {
    /// `None`: nothing committed in Kafka.
    pub offset: Option<i64>,
    /// The two stores disagree (see [`diverged`]).
    pub diverged: bool,
}

/// Whether ZooKeeper's and Kafka's offsets of a partition disagree in a way an operator must
/// know: both hold one and they differ, or, with `dual` (which writes both every time), only
/// one holds one.
pub fn diverged(dual: bool, zookeeper: Option<i64>, kafka: Option<i64>) -> bool {
    match (zookeeper, kafka) {
        (Some(z), Some(k)) => z != k,
        (None, None) => false,
        _ => dual,
    }
}

/// The table as ConsumerOffsetChecker prints it: `unknown` offset and lag when nothing is
/// committed, `none` for no owner; `-` for what was not asked (no `--brokers`). With Kafka
/// storage a `Kafka` column follows ZooKeeper's `Offset`, its cell marked `*` where the two
/// diverge.
pub fn describe_table(rows: &[DescribeRow]) -> String {
    let with_kafka = rows.iter().any(|r| r.kafka.is_some());
    let line = |cells: [&str; 8]| {
        let [g, t, p, o, k, e, l, w] = cells;
        let kafka = if with_kafka { format!(" {k:>12}") } else { String::new() };
        format!("{g:<20} {t:<20} {p:>9} {o:>12}{kafka} {e:>12} {l:>10}  {w}\n")
    };
    let mut out = line(["Group", "Topic", "Partition", "Offset", "Kafka", "LogEnd", "Lag", "Owner"]);
    for r in rows {
        let offset = r.offset.map_or_else(|| "unknown".to_owned(), |o| o.to_string());
        let kafka = match r.kafka {
            Some(k) => {
                let offset = k.offset.map_or_else(|| "unknown".to_owned(), |o| o.to_string());
                if k.diverged { format!("{offset}*") } else { offset }
            }
            None => "-".to_owned(),
        };
        let log_end = r.log_end.map_or_else(|| "-".to_owned(), |e| e.to_string());
        let lag = match (r.lag, r.log_end) {
            (Some(l), _) => l.to_string(),
            (None, Some(_)) => "unknown".to_owned(),
            (None, None) => "-".to_owned(),
        };
        out.push_str(&line([
            &r.group,
            &r.topic,
            &r.partition.to_string(),
            &offset,
            &kafka,
            &log_end,
            &lag,
            r.owner.as_deref().unwrap_or("none"),
        ]));
    }
    out
}

/// One snapshot as `squall offsets snapshots` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRow {
    pub name: String,
    /// When it was taken, ISO-8601 UTC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_ms: Option<u64>,
    pub topics: Vec<String>,
    pub partitions: usize,
    /// Why the snapshot cannot be read (it can still be deleted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl SnapshotRow {
    pub(super) fn new(
        (name, snapshot): (String, Result<cluster_state::znode::OffsetSnapshot, String>),
    ) -> Self {
        match snapshot {
            Ok(s) => SnapshotRow {
                name,
                created: Some(iso_utc(s.created_ms)),
                created_ms: Some(s.created_ms),
                topics: s.offsets.keys().cloned().collect(),
                partitions: s.offsets.values().map(BTreeMap::len).sum(),
                error: None,
            },
            Err(e) => SnapshotRow {
                name,
                created: None,
                created_ms: None,
                topics: Vec::new(),
                partitions: 0,
                error: Some(e),
            },
        }
    }
}

/// Aligned columns: Name, Created (UTC), Partitions, Topics.
pub fn snapshots_table(rows: &[SnapshotRow]) -> String {
    let mut out = format!("{:<24} {:<24} {:>10}  {}\n", "Name", "Created (UTC)", "Partitions", "Topics");
    for r in rows {
        match &r.error {
            Some(e) => out.push_str(&format!("{:<24} unreadable: {e}\n", r.name)),
            None => out.push_str(&format!(
                "{:<24} {:<24} {:>10}  {}\n",
                r.name,
                r.created.as_deref().unwrap_or("-"),
                r.partitions,
                r.topics.join(",")
            )),
        }
    }
    out
}

pub(super) fn print_plan(group: &GroupId, rows: &[PlanRow]) {
    println!("{:<20} {:<20} {:>9} {:>12} {:>12}", "Group", "Topic", "Partition", "Current", "Target");
    for r in rows {
        let current = r.current.map_or_else(|| "-".to_owned(), |c| c.to_string());
        println!(
            "{:<20} {:<20} {:>9} {:>12} {:>12}",
            group.as_str(),
            r.tp.topic.as_str(),
            r.tp.partition.get(),
            current,
            r.target
        );
        if let Some(w) = &r.warning {
            eprintln!("warning: {} partition {}: {w}", r.tp.topic, r.tp.partition);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_prints_unknown_none_and_dash_as_consumer_offset_checker() {
        let row = |offset: Option<i64>, log_end: Option<i64>, owner: Option<&str>| DescribeRow {
            group: "g".into(),
            topic: "t".into(),
            partition: 0,
            offset,
            log_end,
            lag: offset.zip(log_end).map(|(o, e)| e - o),
            owner: owner.map(str::to_owned),
            kafka: None,
        };
        let cases = [
            (row(Some(5), Some(9), Some("g_h-1-a-0")), ["5", "9", "4", "g_h-1-a-0"]),
            (row(None, Some(9), None), ["unknown", "9", "unknown", "none"]),
            (row(Some(5), None, None), ["5", "-", "-", "none"]),
            (row(None, None, Some("c-0")), ["unknown", "-", "-", "c-0"]),
        ];
        for (r, cells) in cases {
            let table = describe_table(std::slice::from_ref(&r));
            let printed: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
            assert_eq!(printed[..3], ["g", "t", "0"]);
            assert_eq!(printed[3..], cells, "{r:?}");
        }
        let json = serde_json::to_value(row(None, Some(9), None)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"group":"g","topic":"t","partition":0,"offset":null,"logEnd":9,"lag":null,"owner":null})
        );
    }

    #[test]
    fn with_kafka_storage_a_kafka_column_follows_zookeepers_and_divergence_is_marked() {
        let row = |offset: Option<i64>, kafka: Option<i64>| DescribeRow {
            group: "g".into(),
            topic: "t".into(),
            partition: 0,
            offset,
            log_end: Some(9),
            lag: offset.max(kafka).map(|o| 9 - o),
            owner: None,
            kafka: Some(KafkaCell { offset: kafka, diverged: diverged(true, offset, kafka) }),
        };
        let table = describe_table(&[row(Some(5), Some(5)), row(Some(5), Some(7)), row(None, Some(7))]);
        let cells: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(cells[0], ["Group", "Topic", "Partition", "Offset", "Kafka", "LogEnd", "Lag", "Owner"]);
        assert_eq!(cells[1][3..], ["5", "5", "9", "4", "none"]);
        assert_eq!(cells[2][3..], ["5", "7*", "9", "2", "none"]);
        assert_eq!(cells[3][3..], ["unknown", "7*", "9", "2", "none"]);
        for (dual, zookeeper, kafka, expected) in [
            (true, Some(1), Some(1), false),
            (true, Some(1), Some(2), true),
            (true, Some(1), None, true),
            (false, Some(1), None, false),
            (false, None, None, false),
            (false, Some(1), Some(2), true),
        ] {
            assert_eq!(diverged(dual, zookeeper, kafka), expected, "{dual} {zookeeper:?} {kafka:?}");
        }
        let json = serde_json::to_value(row(Some(5), Some(7))).unwrap();
        assert_eq!(json["kafka"], serde_json::json!({"offset": 7, "diverged": true}));
    }
}
