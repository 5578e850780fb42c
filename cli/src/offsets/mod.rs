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
//! (the spouts' `zookeeper_chroot`), `--brokers` for Kafka and `--offsets-storage` (the
//! spouts' `offsets_storage`, default `zookeeper`). A reset prints its plan and changes
//! nothing unless `--execute` is given; it is refused while the group has live members.
//!
//! With `--offsets-storage kafka | dual` the group's offsets in Kafka's group coordinator are
//! read too: `describe` shows them in a `Kafka` column next to ZooKeeper's `Offset` and marks
//! divergence; lag, `export` and a reset's current offsets are the offsets the spouts would
//! start from (Kafka's, or with `dual` the larger of the two); a reset writes both stores, so
//! that `dual`'s larger-offset rule cannot undo a rewind.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use cluster_state::coord::{Ensemble, SessionOptions};
use cluster_state::ids::{GroupId, SnapshotName, Topic};
use cluster_state::paths::KafkaPaths;
use consumer_registry::TopicPartition;
use consumer_registry::admin::{Admin, PartitionState, export_lines};
use kafka_spout::OffsetsStorage;

use crate::config::ClusterConfig;
use cluster_state::coord::Security;

mod kafka;
mod reset;
mod tables;
mod time;

use kafka::{Kafka, connection_kafka};
use reset::reset;
pub(crate) use reset::{ResetError, reset_group};
use tables::print_plan;
pub use tables::{DescribeRow, KafkaCell, SnapshotRow, describe_table, diverged, snapshots_table};

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
    /// Where the group's spouts commit (their `offsets_storage`): zookeeper, kafka or dual.
    /// With kafka or dual, Kafka's group offsets are read and written too (needs --brokers).
    #[arg(long, value_name = "STORAGE", default_value_t = OffsetsStorage::Zookeeper)]
    pub offsets_storage: OffsetsStorage,
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

/// Where the offsets go back to: the targets `squall offsets reset` and `squall replay` share
/// (reset adds `--to-latest` and `--from-file`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ReplayTo {
    #[arg(long)]
    pub to_earliest: bool,
    #[arg(long, value_name = "N")]
    pub to_offset: Option<i64>,
    /// An ISO-8601 time, e.g. 2026-11-22T10:00:00Z (no zone: UTC): the first offset at or after it.
    #[arg(long, value_name = "ISO")]
    pub to_datetime: Option<String>,
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub shift_by: Option<i64>,
    /// A snapshot taken with `squall offsets snapshot`.
    #[arg(long, value_name = "NAME")]
    pub from_snapshot: Option<String>,
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
    #[command(flatten)]
    pub to: ReplayTo,
    #[arg(long)]
    pub to_latest: bool,
    /// An ExportZkOffsets file.
    #[arg(long, value_name = "FILE")]
    pub from_file: Option<PathBuf>,
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

    pub(crate) fn paths(&self) -> Result<KafkaPaths, String> {
        KafkaPaths::new(self.registry_chroot.as_deref()).map_err(|e| format!("--registry-chroot: {e}"))
    }

    fn kafka(&self) -> Result<Option<Kafka>, String> {
        self.brokers.as_deref().map(Kafka::connect).transpose()
    }

    /// With Kafka storage: the group's offsets in Kafka for `tps` (`None` with ZooKeeper
    /// storage); the brokers are then required.
    fn kafka_offsets(
        &self,
        kafka: Option<&Kafka>,
        group: &GroupId,
        tps: &[TopicPartition],
    ) -> Result<Option<BTreeMap<TopicPartition, Option<i64>>>, String> {
        if !self.offsets_storage.uses_kafka() {
            return Ok(None);
        }
        let kafka = kafka.ok_or_else(|| {
            format!(
                "--offsets-storage {}: the group's offsets are in Kafka: pass --brokers",
                self.offsets_storage
            )
        })?;
        kafka.group_offsets(group, tps).map(Some)
    }
}

/// The offset the group's spouts would start from, given what each store holds (the spouts'
/// rule, `kafka_spout::group_offsets::start_position`): ZooKeeper's, Kafka's, or with `dual`
/// the larger.
pub(crate) fn effective(storage: OffsetsStorage, zookeeper: Option<i64>, kafka: Option<i64>) -> Option<i64> {
    match storage {
        OffsetsStorage::Zookeeper => zookeeper,
        OffsetsStorage::Kafka => kafka,
        OffsetsStorage::Dual => zookeeper.max(kafka),
    }
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

pub(crate) async fn session(connection: &Connection) -> Result<cluster_state::coord::Session, String> {
    let zookeeper = connection.zookeeper()?;
    let options = SessionOptions { connect_timeout: Duration::from_secs(10), ..Default::default() };
    // The registry's nodes are written with the cluster's identity (readable by anyone).
    let config = ClusterConfig::load(connection.config.as_deref())?;
    let security = Security::new(config.zookeeper_auth()?, cluster_state::paths::StormPaths::DEFAULT_ROOT);
    Ensemble::zookeeper(zookeeper.clone())
        .with_security(security)
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
    let all: Vec<TopicPartition> = partitions.iter().cloned().collect();
    let in_kafka = connection.kafka_offsets(kafka.as_ref(), &group, &all)?;
    let storage = connection.offsets_storage;
    let rows: Vec<DescribeRow> = partitions
        .into_iter()
        .map(|tp| {
            let state = read.get(&tp);
            let offset = state.and_then(|s| s.committed).map(|(o, _)| o);
            let kafka = in_kafka.as_ref().map(|k| k.get(&tp).copied().flatten());
            let log_end = log_ends.get(&tp).copied();
            DescribeRow {
                group: group.to_string(),
                topic: tp.topic.to_string(),
                partition: tp.partition.get(),
                offset,
                log_end,
                // ConsumerOffsetChecker's "unknown" without a committed offset: where the
                // consumer starts then depends on its auto.offset.reset. With Kafka storage,
                // the lag of where the spouts would start.
                lag: effective(storage, offset, kafka.flatten()).zip(log_end).map(|(o, end)| end - o),
                owner: state.and_then(|s| s.owner.clone()),
                kafka: kafka.map(|k| KafkaCell {
                    offset: k,
                    diverged: diverged(storage == OffsetsStorage::Dual, offset, k),
                }),
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
    let diverging = rows.iter().filter(|r| r.kafka.is_some_and(|k| k.diverged)).count();
    if diverging > 0 {
        let rule = match storage {
            OffsetsStorage::Dual => "with dual storage the spouts start from the larger",
            _ => "with kafka storage the spouts start from Kafka's",
        };
        eprintln!("* ZooKeeper's and Kafka's offsets differ on {diverging} partition(s); {rule}");
    }
    Ok(())
}

fn committed(read: &BTreeMap<TopicPartition, PartitionState>) -> BTreeMap<TopicPartition, i64> {
    read.iter().filter_map(|(tp, s)| s.committed.map(|(o, _)| (tp.clone(), o))).collect()
}

/// The offsets the group's spouts would start from, per partition with one: ZooKeeper's
/// `read`, merged with Kafka's by the storage's rule (Kafka's are read for the partitions of
/// every topic ZooKeeper knows, plus `topics`).
fn starting_offsets(
    connection: &Connection,
    group: &GroupId,
    read: &BTreeMap<TopicPartition, PartitionState>,
    topics: &BTreeSet<Topic>,
) -> Result<BTreeMap<TopicPartition, i64>, String> {
    let zookeeper = committed(read);
    if !connection.offsets_storage.uses_kafka() {
        return Ok(zookeeper);
    }
    let kafka = connection_kafka(connection)?;
    let mut tps: BTreeSet<TopicPartition> = read.keys().cloned().collect();
    let all_topics: BTreeSet<Topic> =
        topics.iter().cloned().chain(read.keys().map(|tp| tp.topic.clone())).collect();
    for t in &all_topics {
        tps.extend(kafka.partitions(t)?.into_iter().map(|p| TopicPartition::new(t.clone(), p)));
    }
    let tps: Vec<TopicPartition> = tps.into_iter().collect();
    let in_kafka = connection.kafka_offsets(Some(&kafka), group, &tps)?.unwrap_or_default();
    Ok(tps
        .into_iter()
        .filter_map(|tp| {
            let kafka = in_kafka.get(&tp).copied().flatten();
            effective(connection.offsets_storage, zookeeper.get(&tp).copied(), kafka).map(|o| (tp, o))
        })
        .collect())
}

async fn export(group: &str, file: Option<PathBuf>, connection: &Connection) -> Result<(), String> {
    let group = group_id(group)?;
    let session = session(connection).await?;
    let read =
        Admin::new(&session, connection.paths()?).read(&group, None).await.map_err(|e| e.to_string())?;
    let _ = session.close().await;
    let text = export_lines(&group, &starting_offsets(connection, &group, &read, &BTreeSet::new())?);
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
    let admin = Admin::new(&session, connection.paths()?);
    // With Kafka storage: the offsets the spouts would start from (Kafka's, or the larger).
    let taken = async {
        let read = admin.read(&group, topic.as_ref()).await.map_err(|e| e.to_string())?;
        let topics: BTreeSet<Topic> = topic.iter().cloned().collect();
        let offsets = starting_offsets(connection, &group, &read, &topics)?;
        admin
            .snapshot_offsets(&group, &name, topic.as_ref(), &offsets, now_ms)
            .await
            .map_err(|e| e.to_string())
    }
    .await;
    let _ = session.close().await;
    let taken = taken?;
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
