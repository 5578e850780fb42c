//! `squall offsets`: operators inspect, export, reset and snapshot a consumer group's offsets,
//! talking to ZooKeeper (the consumer registry) and Kafka (partitions, earliest and log-end
//! offsets, offsets by time) directly.
//!
//! ```text
//! squall offsets describe --group G [--topic T] [--output table|json]
//! squall offsets export   --group G [--file F]
//! squall offsets reset    --group G --topic T (--to-earliest | --to-latest | --to-offset N |
//!                         --to-datetime ISO | --shift-by N | --from-file F | --from-snapshot N)
//!                         [--dry-run | --execute]
//! squall offsets snapshot --group G --name N [--topic T]
//! squall offsets snapshots --group G [--output table|json]
//! squall offsets delete-snapshot --group G --name N
//! ```
//! with `--zookeeper host:port[/chroot]` (or the config file's servers), `--registry-chroot`
//! (the spouts' `zookeeper_chroot`) and `--brokers` for Kafka. A reset prints its plan and
//! changes nothing unless `--execute` is given; it is refused while the group has live members.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use cluster_state::coord::{Ensemble, SessionOptions};
use cluster_state::ids::{GroupId, Partition, SnapshotName, Topic};
use cluster_state::paths::KafkaPaths;
use consumer_registry::TopicPartition;
use consumer_registry::admin::{Admin, PartitionState, PlanRow, ResetTo, export_lines, parse_export, plan};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::config::ClusterConfig;

const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the registry and the brokers are.
#[derive(Debug, Clone, clap::Args)]
pub struct Connection {
    /// ZooKeeper of the consumer registry, `host:port[,host:port][/chroot]` (default: the config
    /// file's storm.zookeeper.servers, else 127.0.0.1:2181).
    #[arg(long)]
    pub zookeeper: Option<String>,
    /// The registry's chroot inside that ZooKeeper (the spouts' `zookeeper_chroot`).
    #[arg(long, value_name = "PATH")]
    pub registry_chroot: Option<String>,
    /// Kafka brokers, `host:port,...` (for partitions, log-end offsets and lag).
    #[arg(long)]
    pub brokers: Option<String>,
    /// Cluster config file (for storm.zookeeper.servers).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// `squall offsets ...`.
#[derive(Debug, clap::Args)]
pub struct OffsetsCommand {
    #[command(subcommand)]
    pub verb: OffsetsVerb,
}

#[derive(Debug, clap::Subcommand)]
pub enum OffsetsVerb {
    /// Group Topic Partition Offset LogEnd Lag Owner, per partition (Kafka's ConsumerOffsetChecker).
    Describe {
        #[arg(long)]
        group: String,
        #[arg(long)]
        topic: Option<String>,
        #[arg(long, value_enum, default_value_t = Output::Table)]
        output: Output,
        #[command(flatten)]
        connection: Connection,
    },
    /// The committed offsets in Kafka's ExportZkOffsets format.
    Export {
        #[arg(long)]
        group: String,
        /// Write to this file instead of stdout.
        #[arg(long)]
        file: Option<PathBuf>,
        #[command(flatten)]
        connection: Connection,
    },
    /// Plan (and with --execute, write) new committed offsets.
    Reset(Box<ResetArgs>),
    /// Keep the group's committed offsets under a name, for `reset --from-snapshot`.
    Snapshot {
        #[arg(long)]
        group: String,
        #[arg(long)]
        name: String,
        #[arg(long)]
        topic: Option<String>,
        #[command(flatten)]
        connection: Connection,
    },
    /// The group's snapshots: name, when taken, topics, partition offsets.
    Snapshots {
        #[arg(long)]
        group: String,
        #[arg(long, value_enum, default_value_t = Output::Table)]
        output: Output,
        #[command(flatten)]
        connection: Connection,
    },
    /// Delete a snapshot (the group's committed offsets are not touched).
    DeleteSnapshot {
        #[arg(long)]
        group: String,
        #[arg(long)]
        name: String,
        #[command(flatten)]
        connection: Connection,
    },
}

/// How `describe` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns, as ConsumerOffsetChecker prints them.
    Table,
    /// A JSON array of rows (keys group, topic, partition, offset, logEnd, lag, owner).
    Json,
}

/// `squall offsets reset`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("to").required(true).args([
    "to_earliest", "to_latest", "to_offset", "to_datetime", "shift_by", "from_file", "from_snapshot"
])))]
pub struct ResetArgs {
    #[arg(long)]
    pub group: String,
    /// The topic to reset (required except with --from-file / --from-snapshot, where it filters).
    #[arg(long)]
    pub topic: Option<String>,
    #[arg(long)]
    pub to_earliest: bool,
    #[arg(long)]
    pub to_latest: bool,
    #[arg(long, value_name = "N")]
    pub to_offset: Option<i64>,
    /// An ISO-8601 time, e.g. 2026-11-22T10:00:00Z (no zone: UTC): the first offset at or after it.
    #[arg(long, value_name = "ISO")]
    pub to_datetime: Option<String>,
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub shift_by: Option<i64>,
    /// An ExportZkOffsets file.
    #[arg(long, value_name = "FILE")]
    pub from_file: Option<PathBuf>,
    /// A snapshot taken with `squall offsets snapshot`.
    #[arg(long, value_name = "NAME")]
    pub from_snapshot: Option<String>,
    /// Only print the plan (the default).
    #[arg(long, conflicts_with = "execute")]
    pub dry_run: bool,
    /// Write the plan.
    #[arg(long)]
    pub execute: bool,
    #[command(flatten)]
    pub connection: Connection,
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start: {e}"))
}

fn group_id(group: &str) -> Result<GroupId, String> {
    GroupId::new(group).map_err(|e| format!("--group: {e}"))
}

fn topic_of(topic: &str) -> Result<Topic, String> {
    Topic::new(topic).map_err(|e| format!("--topic: {e}"))
}

impl Connection {
    fn zookeeper(&self) -> Result<String, String> {
        if let Some(z) = &self.zookeeper {
            return Ok(z.clone());
        }
        let config = ClusterConfig::load(self.config.as_deref())?;
        Ok(config.zookeeper()?.unwrap_or_else(|| "127.0.0.1:2181".to_owned()))
    }

    fn paths(&self) -> Result<KafkaPaths, String> {
        KafkaPaths::new(self.registry_chroot.as_deref()).map_err(|e| format!("--registry-chroot: {e}"))
    }

    fn kafka(&self) -> Result<Option<Kafka>, String> {
        self.brokers.as_deref().map(Kafka::connect).transpose()
    }
}

/// The broker side.
struct Kafka {
    consumer: BaseConsumer,
    brokers: String,
}

impl Kafka {
    fn connect(brokers: &str) -> Result<Kafka, String> {
        let consumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", "squall-offsets-tool")
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| format!("Kafka client for {brokers}: {e}"))?;
        Ok(Kafka { consumer, brokers: brokers.to_owned() })
    }

    /// The topic's partitions; an unknown topic is an error naming it.
    fn partitions(&self, topic: &Topic) -> Result<Vec<Partition>, String> {
        let metadata = self.consumer.fetch_metadata(Some(topic.as_str()), KAFKA_TIMEOUT).map_err(|e| {
            format!("Kafka at {}: metadata of topic {topic}: {e} (check --brokers)", self.brokers)
        })?;
        let t = metadata.topics().iter().find(|t| t.name() == topic.as_str());
        let partitions: Vec<Partition> = t
            .filter(|t| t.error().is_none())
            .map(|t| t.partitions().iter().filter_map(|p| Partition::new(p.id()).ok()).collect())
            .unwrap_or_default();
        if partitions.is_empty() {
            return Err(format!("topic {topic} does not exist on the brokers at {}", self.brokers));
        }
        Ok(partitions)
    }

    /// `(earliest, log end)` of a partition.
    fn range(&self, tp: &TopicPartition) -> Result<(i64, i64), String> {
        self.consumer.fetch_watermarks(tp.topic.as_str(), tp.partition.get(), KAFKA_TIMEOUT).map_err(|e| {
            format!("Kafka at {}: offsets of {} partition {}: {e}", self.brokers, tp.topic, tp.partition)
        })
    }

    /// `(earliest, log end)` of each partition, one request each; progress on stderr when it
    /// takes more than a second (hundreds of partitions, a slow broker).
    // Synchronous code timing blocking broker calls for a progress line: std's clock is right.
    #[allow(clippy::disallowed_types)]
    fn ranges(&self, tps: &[TopicPartition]) -> Result<BTreeMap<TopicPartition, (i64, i64)>, String> {
        let started = std::time::Instant::now();
        let mut reported = started;
        let mut out = BTreeMap::new();
        for (i, tp) in tps.iter().enumerate() {
            out.insert(tp.clone(), self.range(tp)?);
            if reported.elapsed() >= Duration::from_secs(1) {
                reported = std::time::Instant::now();
                eprintln!(
                    "reading offsets from Kafka at {}: {}/{} partitions",
                    self.brokers,
                    i + 1,
                    tps.len()
                );
            }
        }
        Ok(out)
    }

    /// The first offset at or after `ms` in each partition (the log end when none is).
    fn at_time(&self, tps: &[TopicPartition], ms: i64) -> Result<BTreeMap<TopicPartition, i64>, String> {
        let mut list = TopicPartitionList::new();
        for tp in tps {
            list.add_partition_offset(tp.topic.as_str(), tp.partition.get(), Offset::Offset(ms))
                .map_err(|e| e.to_string())?;
        }
        let found = self
            .consumer
            .offsets_for_times(list, KAFKA_TIMEOUT)
            .map_err(|e| format!("Kafka at {}: offsets by time: {e}", self.brokers))?;
        let mut out = BTreeMap::new();
        for tp in tps {
            let offset = match found.find_partition(tp.topic.as_str(), tp.partition.get()).map(|e| e.offset())
            {
                Some(Offset::Offset(o)) => o,
                // No message at or after the time: the log end.
                Some(Offset::End) => self.range(tp)?.1,
                other => {
                    return Err(format!(
                        "Kafka at {}: {} partition {} has no offset for that time ({other:?}); the broker may not support lookups by time",
                        self.brokers, tp.topic, tp.partition
                    ));
                }
            };
            out.insert(tp.clone(), offset);
        }
        Ok(out)
    }
}

/// Milliseconds since the epoch of an ISO-8601 date-time: `YYYY-MM-DDTHH:MM[:SS[.fff]]` with
/// `Z`, `±HH:MM` or no zone (UTC).
pub fn parse_datetime(text: &str) -> Result<i64, String> {
    let bad = || format!("--to-datetime {text:?}: expected an ISO-8601 time like 2026-11-22T10:00:00Z");
    let (date, time) = text.split_once(['T', ' ']).ok_or_else(bad)?;
    let d: Vec<&str> = date.split('-').collect();
    let [y, mo, da] = d.as_slice() else { return Err(bad()) };
    let num =
        |s: &str, lo: i64, hi: i64| s.parse::<i64>().ok().filter(|v| (lo..=hi).contains(v)).ok_or_else(bad);
    let (year, month) = (num(y, 1970, 9999)?, num(mo, 1, 12)?);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    let day = num(da, 1, month_days)?;
    let (clock, offset_secs) = if let Some(c) = time.strip_suffix('Z') {
        (c, 0)
    } else if let Some(i) = time.rfind(['+', '-']).filter(|&i| i >= 5) {
        let (c, zone) = time.split_at(i);
        let sign = if zone.starts_with('-') { -1 } else { 1 };
        let (h, m) = zone[1..].split_once(':').ok_or_else(bad)?;
        (c, sign * (num(h, 0, 23)? * 3600 + num(m, 0, 59)? * 60))
    } else {
        (time, 0)
    };
    let (hms, frac) = clock.split_once('.').unwrap_or((clock, ""));
    let t: Vec<&str> = hms.split(':').collect();
    let (h, mi, s) = match t.as_slice() {
        [h, m] => (num(h, 0, 23)?, num(m, 0, 59)?, 0),
        [h, m, s] => (num(h, 0, 23)?, num(m, 0, 59)?, num(s, 0, 60)?),
        _ => return Err(bad()),
    };
    let millis = if frac.is_empty() {
        0
    } else if frac.bytes().all(|b| b.is_ascii_digit()) {
        format!("{frac:0<3}")[..3].parse::<i64>().map_err(|_| bad())?
    } else {
        return Err(bad());
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y, m) = if month <= 2 { (year - 1, month + 9) } else { (year, month - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Ok((days * 86_400 + h * 3600 + mi * 60 + s - offset_secs) * 1000 + millis)
}

/// Runs `squall offsets`.
pub fn execute(cmd: OffsetsCommand) -> Result<(), String> {
    runtime()?.block_on(async move {
        match cmd.verb {
            OffsetsVerb::Describe { group, topic, output, connection } => {
                describe(&group, topic.as_deref(), output, &connection).await
            }
            OffsetsVerb::Export { group, file, connection } => export(&group, file, &connection).await,
            OffsetsVerb::Reset(args) => reset(*args).await,
            OffsetsVerb::Snapshot { group, name, topic, connection } => {
                snapshot(&group, &name, topic.as_deref(), &connection).await
            }
            OffsetsVerb::Snapshots { group, output, connection } => {
                list_snapshots(&group, output, &connection).await
            }
            OffsetsVerb::DeleteSnapshot { group, name, connection } => {
                delete_snapshot(&group, &name, &connection).await
            }
        }
    })
}

async fn session(connection: &Connection) -> Result<cluster_state::coord::Session, String> {
    let zookeeper = connection.zookeeper()?;
    let options = SessionOptions { connect_timeout: Duration::from_secs(10), ..Default::default() };
    Ensemble::zookeeper(zookeeper.clone())
        .connect(&options)
        .await
        .map_err(|e| format!("cannot connect to ZooKeeper at {zookeeper}: {e} (pass --zookeeper)"))
}

async fn describe(
    group: &str,
    topic: Option<&str>,
    output: Output,
    connection: &Connection,
) -> Result<(), String> {
    let group = group_id(group)?;
    let topic = topic.map(topic_of).transpose()?;
    let kafka = connection.kafka()?;
    let session = session(connection).await?;
    let admin = Admin::new(&session, connection.paths()?);
    let read = admin.read(&group, topic.as_ref()).await.map_err(|e| e.to_string())?;
    let _ = session.close().await;
    let mut partitions: BTreeSet<TopicPartition> = read.keys().cloned().collect();
    let mut log_ends = BTreeMap::new();
    if let Some(kafka) = &kafka {
        let topics: BTreeSet<Topic> =
            topic.iter().cloned().chain(read.keys().map(|tp| tp.topic.clone())).collect();
        for t in topics {
            partitions.extend(kafka.partitions(&t)?.into_iter().map(|p| TopicPartition::new(t.clone(), p)));
        }
        let all: Vec<TopicPartition> = partitions.iter().cloned().collect();
        log_ends = kafka.ranges(&all)?.into_iter().map(|(tp, (_, end))| (tp, end)).collect();
    }
    let rows: Vec<DescribeRow> = partitions
        .into_iter()
        .map(|tp| {
            let state = read.get(&tp);
            let offset = state.and_then(|s| s.committed).map(|(o, _)| o);
            let log_end = log_ends.get(&tp).copied();
            DescribeRow {
                group: group.to_string(),
                topic: tp.topic.to_string(),
                partition: tp.partition.get(),
                offset,
                log_end,
                // ConsumerOffsetChecker's "unknown" without a committed offset: where the
                // consumer starts then depends on its auto.offset.reset.
                lag: offset.zip(log_end).map(|(o, end)| end - o),
                owner: state.and_then(|s| s.owner.clone()),
            }
        })
        .collect();
    match output {
        Output::Json => {
            println!("{}", serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?);
        }
        Output::Table => print!("{}", describe_table(&rows)),
    }
    if kafka.is_none() {
        eprintln!("(LogEnd and Lag need the brokers: pass --brokers)");
    }
    Ok(())
}

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
}

/// The table as ConsumerOffsetChecker prints it: `unknown` offset and lag when nothing is
/// committed, `none` for no owner; `-` for what was not asked (no `--brokers`).
pub fn describe_table(rows: &[DescribeRow]) -> String {
    let line = |cells: [&str; 7]| {
        let [g, t, p, o, e, l, w] = cells;
        format!("{g:<20} {t:<20} {p:>9} {o:>12} {e:>12} {l:>10}  {w}\n")
    };
    let mut out = line(["Group", "Topic", "Partition", "Offset", "LogEnd", "Lag", "Owner"]);
    for r in rows {
        let offset = r.offset.map_or_else(|| "unknown".to_owned(), |o| o.to_string());
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
            &log_end,
            &lag,
            r.owner.as_deref().unwrap_or("none"),
        ]));
    }
    out
}

fn committed(read: &BTreeMap<TopicPartition, PartitionState>) -> BTreeMap<TopicPartition, i64> {
    read.iter().filter_map(|(tp, s)| s.committed.map(|(o, _)| (tp.clone(), o))).collect()
}

async fn export(group: &str, file: Option<PathBuf>, connection: &Connection) -> Result<(), String> {
    let group = group_id(group)?;
    let session = session(connection).await?;
    let read =
        Admin::new(&session, connection.paths()?).read(&group, None).await.map_err(|e| e.to_string())?;
    let _ = session.close().await;
    let text = export_lines(&group, &committed(&read));
    match file {
        Some(path) => {
            std::fs::write(&path, &text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            eprintln!("exported {} offsets of group {group} to {}", text.lines().count(), path.display());
        }
        None => print!("{text}"),
    }
    Ok(())
}

async fn snapshot(
    group: &str,
    name: &str,
    topic: Option<&str>,
    connection: &Connection,
) -> Result<(), String> {
    let group = group_id(group)?;
    let name = SnapshotName::new(name).map_err(|e| format!("--name: {e}"))?;
    let topic = topic.map(topic_of).transpose()?;
    let session = session(connection).await?;
    let now_ms = cluster_state::clock::now_millis();
    let taken = Admin::new(&session, connection.paths()?)
        .snapshot(&group, &name, topic.as_ref(), now_ms)
        .await
        .map_err(|e| e.to_string())?;
    let _ = session.close().await;
    let count: usize = taken.offsets.values().map(BTreeMap::len).sum();
    println!(
        "snapshot {name} of group {group}: {count} partition offsets; replay with `squall offsets reset --group {group} --from-snapshot {name} --execute`"
    );
    Ok(())
}

async fn list_snapshots(group: &str, output: Output, connection: &Connection) -> Result<(), String> {
    let group = group_id(group)?;
    let session = session(connection).await?;
    let listed = Admin::new(&session, connection.paths()?).list_snapshots(&group).await;
    let _ = session.close().await;
    let rows: Vec<SnapshotRow> =
        listed.map_err(|e| e.to_string())?.into_iter().map(SnapshotRow::new).collect();
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?),
        Output::Table if rows.is_empty() => println!(
            "group {group} has no snapshots; `squall offsets snapshot --group {group} --name NAME` takes one"
        ),
        Output::Table => print!("{}", snapshots_table(&rows)),
    }
    Ok(())
}

async fn delete_snapshot(group: &str, name: &str, connection: &Connection) -> Result<(), String> {
    let group = group_id(group)?;
    let name = SnapshotName::new(name).map_err(|e| format!("--name: {e}"))?;
    let session = session(connection).await?;
    let deleted = Admin::new(&session, connection.paths()?).delete_snapshot(&group, &name).await;
    let _ = session.close().await;
    deleted.map_err(|e| e.to_string())?;
    println!("deleted snapshot {name} of group {group}; its committed offsets are unchanged");
    Ok(())
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
    fn new((name, snapshot): (String, Result<cluster_state::znode::OffsetSnapshot, String>)) -> Self {
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

/// `ms` since the epoch as `YYYY-MM-DDTHH:MM:SS.fffZ` (the inverse of [`parse_datetime`]'s
/// day count, Howard Hinnant's civil-from-days).
pub fn iso_utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// Where a reset goes, with everything that can be checked without a connection checked.
enum Target {
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
        } else if let Some(name) = &args.from_snapshot {
            Target::Snapshot(SnapshotName::new(name.as_str()).map_err(|e| format!("--from-snapshot: {e}"))?)
        } else if args.to_earliest {
            Target::Earliest
        } else if args.to_latest {
            Target::Latest
        } else if let Some(o) = args.to_offset {
            Target::Offset(o)
        } else if let Some(n) = args.shift_by {
            Target::ShiftBy(n)
        } else if let Some(iso) = &args.to_datetime {
            Target::Time(parse_datetime(iso)?)
        } else {
            return Err("say where to reset to (--to-earliest, --to-latest, ...)".into());
        })
    }
}

async fn reset(args: ResetArgs) -> Result<(), String> {
    let group = group_id(&args.group)?;
    let topic = args.topic.as_deref().map(topic_of).transpose()?;
    let target = Target::from_args(&args, &group)?;
    if topic.is_none() && !matches!(target, Target::File(_) | Target::Snapshot(_)) {
        return Err("--topic is required (except with --from-file or --from-snapshot)".into());
    }
    let kafka = connection_kafka(&args.connection)?;
    let session = session(&args.connection).await?;
    let result = reset_with(&args, &group, topic.as_ref(), target, &kafka, &session).await;
    let _ = session.close().await;
    result
}

async fn reset_with(
    args: &ResetArgs,
    group: &GroupId,
    topic: Option<&Topic>,
    target: Target,
    kafka: &Kafka,
    session: &cluster_state::coord::Session,
) -> Result<(), String> {
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
                return Err(format!("{file} has no offsets{}: nothing to reset", for_topic(topic)));
            }
            Resolved::Known(ResetTo::Given(offsets))
        }
        Target::Snapshot(name) => {
            let offsets = admin.read_snapshot(group, &name, topic).await.map_err(|e| e.to_string())?;
            if offsets.is_empty() {
                return Err(format!("snapshot {name} has no offsets{}: nothing to reset", for_topic(topic)));
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
    let current: BTreeMap<TopicPartition, Option<i64>> = ranges
        .keys()
        .map(|tp| (tp.clone(), read.get(tp).and_then(|s| s.committed).map(|(o, _)| o)))
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
    let joined = admin.write(group, &read, &rows).await.map_err(|e| e.to_string())?;
    println!("reset {} partition offsets of group {group}", rows.len());
    if !joined.is_empty() {
        eprintln!(
            "warning: {} joined group {group} while the reset was written and may commit over it; stop it and check with `squall offsets describe --group {group}`",
            joined.join(", ")
        );
    }
    Ok(())
}

fn for_topic(topic: Option<&Topic>) -> String {
    topic.map(|t| format!(" for topic {t}")).unwrap_or_default()
}

fn connection_kafka(connection: &Connection) -> Result<Kafka, String> {
    connection
        .kafka()?
        .ok_or_else(|| "a reset checks partitions and their ranges on the brokers: pass --brokers".to_owned())
}

fn print_plan(group: &GroupId, rows: &[PlanRow]) {
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
    fn snapshot_times_print_as_iso_utc_and_parse_back() {
        let cases = [
            (0, "1970-01-01T00:00:00.000Z"),
            (951_782_400_000, "2000-02-29T00:00:00.000Z"),
            (1_795_362_909_123, "2026-11-22T15:55:09.123Z"),
            (4_107_542_399_999, "2100-02-28T23:59:59.999Z"),
        ];
        for (ms, text) in cases {
            assert_eq!(iso_utc(ms), text);
            assert_eq!(parse_datetime(text), Ok(ms as i64), "{text}");
        }
        let rows = [
            SnapshotRow::new((
                "before-deploy".into(),
                Ok(cluster_state::znode::OffsetSnapshot {
                    created_ms: 0,
                    offsets: [(
                        "events".to_owned(),
                        (0..3)
                            .map(|p| {
                                (
                                    Partition::new(p).unwrap(),
                                    cluster_state::znode::OffsetData::new(7).unwrap(),
                                )
                            })
                            .collect(),
                    )]
                    .into(),
                }),
            )),
            SnapshotRow::new(("broken".into(), Err("not JSON".into()))),
        ];
        let table = snapshots_table(&rows);
        let lines: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(lines[1], ["before-deploy", "1970-01-01T00:00:00.000Z", "3", "events"]);
        assert_eq!(lines[2], ["broken", "unreadable:", "not", "JSON"]);
        let json = serde_json::to_value(&rows[1]).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"name": "broken", "topics": [], "partitions": 0, "error": "not JSON"})
        );
    }

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
    fn datetimes_parse_with_and_without_zones() {
        assert_eq!(parse_datetime("1970-01-01T00:00:00Z").unwrap(), 0);
        assert_eq!(parse_datetime("2026-11-22T10:00:00Z").unwrap(), 1_795_341_600_000);
        assert_eq!(parse_datetime("2026-11-22T11:00:00+01:00").unwrap(), 1_795_341_600_000);
        assert_eq!(parse_datetime("2026-11-22T09:30:00.250-00:30").unwrap(), 1_795_341_600_250);
        assert_eq!(parse_datetime("2026-11-22 10:00").unwrap(), 1_795_341_600_000);
        assert_eq!(parse_datetime("2028-02-29T00:00:00Z").unwrap(), 1_835_395_200_000);
        for bad in [
            "yesterday",
            "2026-13-01T00:00:00Z",
            "2026-11-22",
            "2026-11-22T25:00:00Z",
            "2026-11-22T10:00:00.x",
            "2026-02-29T00:00:00Z",
            "2026-04-31T00:00:00Z",
        ] {
            let err = parse_datetime(bad).unwrap_err();
            assert!(err.contains(bad) && err.contains("ISO-8601"), "{bad}: {err}");
        }
    }
}
