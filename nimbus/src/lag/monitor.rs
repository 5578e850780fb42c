//! The lag evaluator's IO: every interval, read every group under `/consumers` from ZooKeeper
//! and every consumed topic's watermarks from the brokers, hand both to the pure
//! [`LagState`], and publish the report to the metrics.
//!
//! Nothing here stops the monitor: a ZooKeeper failure skips the pass (the last report stays
//! and `squall_lag_last_pass_timestamp_seconds` stops moving), brokers that do not answer make
//! their topics' partitions ERR, a garbage znode makes its partition ERR; each is counted in
//! `squall_lag_errors_total{source}` and logged at most once a minute per source.
//!
//! Brokers asked: `squall.lag.kafka.bootstrap.servers` plus the `bootstrap_servers` of every
//! Kafka spout in the topology files nimbus stores (`stormdist/<id>/topology.yaml`), tried in
//! that order until one knows the topic.
//!
//! A spout with `offsets_storage: kafka` commits to its group coordinator, not to ZooKeeper
//! (its members and owners are still in the registry). Its group's offsets are read from the
//! coordinator (an OffsetFetch for the group, never joining it) and replace whatever
//! `/consumers/<g>/offsets` holds, which is stale after a migration. The monitor remembers such
//! groups while they exist in ZooKeeper, so their lag outlives the topology like any other
//! group's. OffsetFetch carries no commit time: a commit is new when its offset changed since
//! the last pass, timed when it was seen (the spout commits only offsets that moved, so this
//! misses none of its commits; it is one lag interval coarse). `dual` groups are judged on
//! ZooKeeper's offsets, their primary store.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use cluster_state::clock::now_millis;
use cluster_state::code::CodeFile;
use cluster_state::coord::{self, Session, join};
use cluster_state::ids::{GroupId, Topic};
use cluster_state::paths::KafkaPaths;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::evaluator::Rules;
use super::metrics::LagMetrics;
use super::window::{GroupRead, LagState, OffsetRead, OffsetsSource, PassRead, TopicPartition, Watermarks};
use crate::code_store::CodeStore;

/// How often errors of one source are logged at warn level.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The monitor's settings (from `squall.lag.*` in [`crate::NimbusConfig`]).
#[derive(Debug, Clone)]
pub struct LagSettings {
    /// Time between passes.
    pub interval: Duration,
    /// Burrow's `intervals`: commits and log ends kept per partition.
    pub intervals: usize,
    pub rules: Rules,
    /// Brokers always asked (`squall.lag.kafka.bootstrap.servers`).
    pub bootstrap_servers: Option<String>,
    /// The longest one broker request may take.
    pub kafka_timeout: Duration,
}

/// The evaluator task; see the module docs.
pub struct LagMonitor {
    session: Arc<Session>,
    paths: KafkaPaths,
    settings: LagSettings,
    code: Option<CodeStore>,
    metrics: LagMetrics,
    clients: HashMap<String, Arc<BaseConsumer>>,
    /// Groups whose offsets live in Kafka, by group, while they exist in ZooKeeper.
    kafka_groups: BTreeMap<String, SpoutGroup>,
    /// One client per (brokers, group) to read a group's offsets from its coordinator.
    group_clients: HashMap<(String, String), Arc<BaseConsumer>>,
    /// Per group partition read from Kafka: the offset last seen, its order and when seen.
    kafka_commits: HashMap<(String, TopicPartition), (i64, i64, i64)>,
    kafka_order: i64,
    last_warned: HashMap<&'static str, Instant>,
}

impl std::fmt::Debug for LagMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LagMonitor")
            .field("paths", &self.paths)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl LagMonitor {
    /// `code`, when given, is searched for topology files naming brokers.
    pub fn new(
        session: Arc<Session>,
        paths: KafkaPaths,
        settings: LagSettings,
        code: Option<CodeStore>,
        metrics: LagMetrics,
    ) -> Self {
        LagMonitor {
            session,
            paths,
            settings,
            code,
            metrics,
            clients: HashMap::new(),
            kafka_groups: BTreeMap::new(),
            group_clients: HashMap::new(),
            kafka_commits: HashMap::new(),
            kafka_order: 0,
            last_warned: HashMap::new(),
        }
    }

    /// Runs passes every interval until `cancel`.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut state = LagState::new(self.settings.intervals, self.settings.rules);
        let mut tick = tokio::time::interval(self.settings.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let read = tokio::select! {
                _ = cancel.cancelled() => return,
                read = self.read_pass() => read,
            };
            let Some(read) = read else { continue };
            let now_ms = i64::try_from(now_millis()).unwrap_or(i64::MAX);
            self.metrics.publish(state.apply(&read, now_ms));
            self.metrics.last_pass.set(now_ms / 1000);
            self.metrics.passes.inc();
        }
    }

    /// One pass's reads; `None` when ZooKeeper could not be read.
    async fn read_pass(&mut self) -> Option<PassRead> {
        let mut groups = match self.read_groups().await {
            Ok(groups) => groups,
            Err(e) => {
                self.failed("zookeeper", &format!("cannot read {}: {e}", self.paths.consumers_dir()));
                return None;
            }
        };
        let spouts = match &self.code {
            Some(code) => topology_spouts(code).await,
            None => Vec::new(),
        };
        for spout in &spouts {
            if spout.storage == "kafka" {
                self.kafka_groups.insert(spout.group.clone(), spout.clone());
            } else {
                self.kafka_groups.remove(&spout.group);
            }
        }
        self.kafka_groups.retain(|group, _| groups.contains_key(group));
        let mut topics: BTreeSet<String> =
            groups.values().flat_map(|g| g.offsets.keys().map(|(t, _)| t.clone())).collect();
        topics.extend(self.kafka_groups.values().flat_map(|g| g.topics.iter().cloned()));
        if topics.is_empty() {
            return Some(PassRead { groups, topics: BTreeMap::new() });
        }
        // The brokers of remembered Kafka-stored groups too: their topology may be gone.
        let mut known = spouts;
        known.extend(self.kafka_groups.values().cloned());
        let clients = self.clients(&known);
        let timeout = self.settings.kafka_timeout;
        let asked = topics.clone();
        let fetched = tokio::task::spawn_blocking(move || {
            asked.into_iter().map(|topic| (topic.clone(), watermarks(&clients, &topic, timeout))).collect()
        })
        .await;
        let topics: BTreeMap<String, Result<BTreeMap<i32, Watermarks>, String>> = match fetched {
            Ok(topics) => topics,
            Err(e) => topics.into_iter().map(|t| (t, Err(format!("broker task failed: {e}")))).collect(),
        };
        let failures: Vec<String> =
            topics.iter().filter_map(|(t, r)| r.as_ref().err().map(|e| format!("{t}: {e}"))).collect();
        if !failures.is_empty() {
            self.failed("kafka", &format!("cannot read watermarks of {}", failures.join("; ")));
        }
        self.read_kafka_offsets(&mut groups, &topics).await;
        Some(PassRead { groups, topics })
    }

    /// Replaces the offsets of every group stored in Kafka with its coordinator's, for every
    /// partition of its topics the brokers listed. A group whose coordinator does not answer
    /// has its partitions ERR (as garbage znodes do) and counts a `kafka` error.
    async fn read_kafka_offsets(
        &mut self,
        groups: &mut BTreeMap<String, GroupRead>,
        topics: &BTreeMap<String, Result<BTreeMap<i32, Watermarks>, String>>,
    ) {
        let now_ms = i64::try_from(now_millis()).unwrap_or(i64::MAX);
        let kafka_groups: Vec<SpoutGroup> = self.kafka_groups.values().cloned().collect();
        self.group_clients.retain(|(servers, group), _| {
            kafka_groups.iter().any(|g| &g.servers == servers && &g.group == group)
        });
        self.kafka_commits.retain(|(group, _), _| self.kafka_groups.contains_key(group));
        for spout in kafka_groups {
            let Some(read) = groups.get_mut(&spout.group) else { continue };
            let partitions: Vec<TopicPartition> = spout
                .topics
                .iter()
                .filter_map(|t| topics.get(t).and_then(|r| r.as_ref().ok()).map(|ps| (t, ps)))
                .flat_map(|(t, ps)| ps.keys().map(|p| (t.clone(), *p)))
                .collect();
            read.source = OffsetsSource::Kafka;
            read.offsets.clear();
            if partitions.is_empty() {
                continue;
            }
            let client = match self.group_client(&spout) {
                Ok(client) => client,
                Err(e) => {
                    self.failed("kafka", &format!("cannot create a client for group {}: {e}", spout.group));
                    continue;
                }
            };
            let timeout = self.settings.kafka_timeout;
            let asked = partitions.clone();
            let fetched = tokio::task::spawn_blocking(move || committed_in_kafka(&client, &asked, timeout))
                .await
                .unwrap_or_else(|e| Err(format!("coordinator task failed: {e}")));
            let committed = match fetched {
                Ok(committed) => committed,
                Err(e) => {
                    self.failed(
                        "kafka",
                        &format!("cannot read the offsets of group {} from Kafka: {e}", spout.group),
                    );
                    for tp in partitions {
                        read.offsets.insert(tp, OffsetRead::Garbage(format!("group coordinator: {e}")));
                    }
                    continue;
                }
            };
            for (tp, offset) in committed {
                let key = (spout.group.clone(), tp.clone());
                let seen = match self.kafka_commits.get(&key) {
                    Some(&(last, order, at)) if last == offset => (order, at),
                    _ => {
                        self.kafka_order += 1;
                        (self.kafka_order, now_ms)
                    }
                };
                self.kafka_commits.insert(key, (offset, seen.0, seen.1));
                read.offsets.insert(tp, OffsetRead::Committed { offset, mzxid: seen.0, mtime_ms: seen.1 });
            }
        }
    }

    /// The client that reads `spout`'s group from its coordinator (`group.id` set, never
    /// subscribed).
    fn group_client(&mut self, spout: &SpoutGroup) -> Result<Arc<BaseConsumer>, String> {
        let key = (spout.servers.clone(), spout.group.clone());
        if let Some(client) = self.group_clients.get(&key) {
            return Ok(client.clone());
        }
        let client: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &spout.servers)
            .set("group.id", &spout.group)
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| e.to_string())?;
        let client = Arc::new(client);
        self.group_clients.insert(key, client.clone());
        Ok(client)
    }

    /// Every group's members and committed offsets. A group, topic or partition whose name is
    /// not valid, or whose node went away while reading, is skipped; garbage offsets are kept
    /// as such.
    async fn read_groups(&mut self) -> coord::Result<BTreeMap<String, GroupRead>> {
        let mut groups = BTreeMap::new();
        let mut garbage = Vec::new();
        for name in self.session.children_or_empty(&self.paths.consumers_dir()).await? {
            let Ok(group) = GroupId::new(&name) else {
                garbage.push(format!("group name {name:?}"));
                continue;
            };
            let members = self.session.children_or_empty(&self.paths.ids_dir(&group)).await?.len();
            let mut read = GroupRead { members, offsets: BTreeMap::new(), source: OffsetsSource::ZooKeeper };
            let offsets_dir = self.paths.offsets_dir(&group);
            for topic_name in self.session.children_or_empty(&offsets_dir).await? {
                let Ok(topic) = Topic::new(&topic_name) else {
                    garbage.push(format!("topic name {}", join(&offsets_dir, &topic_name)));
                    continue;
                };
                let topic_dir = self.paths.offsets_topic(&group, &topic);
                for partition_name in self.session.children_or_empty(&topic_dir).await? {
                    let path = join(&topic_dir, &partition_name);
                    let Some(partition) = partition_name.parse::<i32>().ok().filter(|p| *p >= 0) else {
                        garbage.push(format!("partition name {path}"));
                        continue;
                    };
                    let (data, stat) = match self.session.get(&path).await {
                        Ok(got) => got,
                        Err(coord::Error::NoNode { .. }) => continue,
                        Err(e) => return Err(e),
                    };
                    let offset = std::str::from_utf8(&data).ok().and_then(|s| s.trim().parse::<i64>().ok());
                    let offset_read = match offset {
                        Some(offset) if offset >= 0 => {
                            OffsetRead::Committed { offset, mzxid: stat.mzxid, mtime_ms: stat.mtime_ms }
                        }
                        _ => {
                            let shown = String::from_utf8_lossy(&data).chars().take(40).collect::<String>();
                            garbage.push(format!("offset {path} = {shown:?}"));
                            OffsetRead::Garbage(shown)
                        }
                    };
                    read.offsets.insert((topic_name.clone(), partition), offset_read);
                }
            }
            groups.insert(name, read);
        }
        if !garbage.is_empty() {
            self.failed("znode", &format!("skipped or ERR: {}", garbage.join("; ")));
        }
        Ok(groups)
    }

    /// One client per broker list: the configured one, then each topology's spouts'.
    fn clients(&mut self, spouts: &[SpoutGroup]) -> Vec<Arc<BaseConsumer>> {
        let mut lists: Vec<String> = self.settings.bootstrap_servers.iter().cloned().collect();
        for spout in spouts {
            if !spout.servers.is_empty() && !lists.contains(&spout.servers) {
                lists.push(spout.servers.clone());
            }
        }
        self.clients.retain(|servers, _| lists.contains(servers));
        let mut clients = Vec::new();
        for servers in lists {
            if let Some(client) = self.clients.get(&servers) {
                clients.push(client.clone());
                continue;
            }
            match ClientConfig::new().set("bootstrap.servers", &servers).create::<BaseConsumer>() {
                Ok(client) => {
                    let client = Arc::new(client);
                    self.clients.insert(servers, client.clone());
                    clients.push(client);
                }
                Err(e) => self.failed("kafka", &format!("cannot create a client for {servers}: {e}")),
            }
        }
        clients
    }

    /// Counts a failure and logs it, at warn level at most once a minute per source.
    fn failed(&mut self, source: &'static str, message: &str) {
        self.metrics.errors.with_label_values(&[source]).inc();
        let now = Instant::now();
        let due = self.last_warned.get(source).is_none_or(|at| now.duration_since(*at) >= WARN_EVERY);
        if due {
            self.last_warned.insert(source, now);
            tracing::warn!(source, "lag evaluator: {message} (repeats logged at debug for a minute)");
        } else {
            tracing::debug!(source, "lag evaluator: {message}");
        }
    }
}

/// The watermarks of every partition of `topic` from the first client that knows it.
fn watermarks(
    clients: &[Arc<BaseConsumer>],
    topic: &str,
    timeout: Duration,
) -> Result<BTreeMap<i32, Watermarks>, String> {
    let mut last_error = String::from("no brokers configured (squall.lag.kafka.bootstrap.servers)");
    for client in clients {
        let metadata = match client.fetch_metadata(Some(topic), timeout) {
            Ok(metadata) => metadata,
            Err(e) => {
                last_error = e.to_string();
                continue;
            }
        };
        let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else { continue };
        if let Some(e) = found.error() {
            last_error = format!("{e:?}");
            continue;
        }
        let mut partitions = BTreeMap::new();
        for p in found.partitions() {
            match client.fetch_watermarks(topic, p.id(), timeout) {
                Ok((oldest, log_end)) => {
                    partitions.insert(p.id(), Watermarks { oldest, log_end });
                }
                Err(e) => return Err(format!("partition {}: {e}", p.id())),
            }
        }
        return Ok(partitions);
    }
    Err(last_error)
}

/// The offsets `client`'s group holds in Kafka for `partitions`; partitions never committed
/// (or expired by the broker's retention) are left out.
fn committed_in_kafka(
    client: &BaseConsumer,
    partitions: &[TopicPartition],
    timeout: Duration,
) -> Result<Vec<(TopicPartition, i64)>, String> {
    let mut tpl = TopicPartitionList::new();
    for (topic, partition) in partitions {
        tpl.add_partition_offset(topic, *partition, Offset::Invalid).map_err(|e| e.to_string())?;
    }
    let read = client.committed_offsets(tpl, timeout).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for element in read.elements() {
        if let Err(e) = element.error() {
            return Err(format!("{} partition {}: {e}", element.topic(), element.partition()));
        }
        if let Offset::Offset(offset) = element.offset()
            && offset >= 0
        {
            out.push(((element.topic().to_owned(), element.partition()), offset));
        }
    }
    Ok(out)
}

/// A Kafka spout as a topology file declares it: what the lag monitor needs of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoutGroup {
    /// `bootstrap_servers` (empty when not given).
    pub servers: String,
    /// `group_id`.
    pub group: String,
    /// `offsets_storage`: `zookeeper` (the default), `kafka` or `dual`.
    pub storage: String,
    pub topics: Vec<String>,
}

/// The Kafka spouts of every stored topology file; a file that cannot be read or parsed is
/// skipped (its topology is checked at submit).
async fn topology_spouts(code: &CodeStore) -> Vec<SpoutGroup> {
    let mut found = Vec::new();
    for id in code.topologies().await.unwrap_or_default() {
        let path = code.topology_dir(&id).join(CodeFile::Topology.file_name());
        let Ok(text) = tokio::fs::read_to_string(&path).await else { continue };
        for spout in spout_groups(&text) {
            if !found.contains(&spout) {
                found.push(spout);
            }
        }
    }
    found
}

/// The non-empty `params.bootstrap_servers` of the `spouts` of a Flux file.
pub fn spout_bootstrap_servers(flux: &str) -> Vec<String> {
    spout_groups(flux).into_iter().map(|s| s.servers).filter(|s| !s.is_empty()).collect()
}

/// The spouts of a Flux file that name brokers or a group in their `params`.
pub fn spout_groups(flux: &str) -> Vec<SpoutGroup> {
    let Ok(file) = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(flux) else { return Vec::new() };
    let spouts = file.get("spouts").and_then(|s| s.as_sequence()).cloned().unwrap_or_default();
    let text = |params: &serde_yaml_ng::Value, key: &str| {
        params.get(key).and_then(|v| v.as_str()).map(str::trim).unwrap_or_default().to_owned()
    };
    spouts
        .iter()
        .filter_map(|s| s.get("params"))
        .map(|params| SpoutGroup {
            servers: text(params, "bootstrap_servers"),
            group: text(params, "group_id"),
            storage: match text(params, "offsets_storage").as_str() {
                "" => "zookeeper".to_owned(),
                other => other.to_owned(),
            },
            topics: params
                .get("topics")
                .and_then(|t| t.as_sequence())
                .map(|ts| ts.iter().filter_map(|t| t.as_str().map(str::to_owned)).collect())
                .unwrap_or_default(),
        })
        .filter(|s| !s.servers.is_empty() || !s.group.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_servers_come_from_kafka_spouts() {
        let flux = "name: t\nspouts:\n  - id: a\n    className: kafka-spout\n    params: {bootstrap_servers: 'k1:9092'}\n  - id: b\n    className: gen\n";
        assert_eq!(spout_bootstrap_servers(flux), ["k1:9092"]);
        assert!(spout_bootstrap_servers(": not yaml [").is_empty());
    }

    #[test]
    fn spout_groups_name_their_storage_and_topics() {
        let flux = "name: t\nspouts:\n  - id: a\n    className: kafka-spout\n    params: {bootstrap_servers: 'k1:9092', group_id: g, topics: [clicks, views], offsets_storage: kafka}\n  - id: b\n    className: kafka-spout\n    params: {bootstrap_servers: 'k2:9092', group_id: h, topics: [x]}\n";
        let groups = spout_groups(flux);
        assert_eq!(groups.len(), 2);
        assert_eq!(
            groups[0],
            SpoutGroup {
                servers: "k1:9092".into(),
                group: "g".into(),
                storage: "kafka".into(),
                topics: vec!["clicks".into(), "views".into()]
            }
        );
        assert_eq!(groups[1].storage, "zookeeper");
    }
}
