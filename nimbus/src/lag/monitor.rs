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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use cluster_state::clock::now_millis;
use cluster_state::code::CodeFile;
use cluster_state::coord::{self, Session, join};
use cluster_state::ids::{GroupId, Topic};
use cluster_state::paths::KafkaPaths;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::evaluator::Rules;
use super::metrics::LagMetrics;
use super::window::{GroupRead, LagState, OffsetRead, PassRead, Watermarks};
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
        let groups = match self.read_groups().await {
            Ok(groups) => groups,
            Err(e) => {
                self.failed("zookeeper", &format!("cannot read {}: {e}", self.paths.consumers_dir()));
                return None;
            }
        };
        let topics: BTreeSet<String> =
            groups.values().flat_map(|g| g.offsets.keys().map(|(t, _)| t.clone())).collect();
        let mut read = PassRead { groups, topics: BTreeMap::new() };
        if topics.is_empty() {
            return Some(read);
        }
        let clients = self.clients().await;
        let timeout = self.settings.kafka_timeout;
        let asked = topics.clone();
        let fetched = tokio::task::spawn_blocking(move || {
            asked.into_iter().map(|topic| (topic.clone(), watermarks(&clients, &topic, timeout))).collect()
        })
        .await;
        read.topics = match fetched {
            Ok(topics) => topics,
            Err(e) => topics.into_iter().map(|t| (t, Err(format!("broker task failed: {e}")))).collect(),
        };
        let failures: Vec<String> =
            read.topics.iter().filter_map(|(t, r)| r.as_ref().err().map(|e| format!("{t}: {e}"))).collect();
        if !failures.is_empty() {
            self.failed("kafka", &format!("cannot read watermarks of {}", failures.join("; ")));
        }
        Some(read)
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
            let mut read = GroupRead { members, offsets: BTreeMap::new() };
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

    /// One client per broker list: the configured one, then each topology's.
    async fn clients(&mut self) -> Vec<Arc<BaseConsumer>> {
        let mut lists: Vec<String> = self.settings.bootstrap_servers.iter().cloned().collect();
        if let Some(code) = &self.code {
            for servers in topology_bootstrap_servers(code).await {
                if !lists.contains(&servers) {
                    lists.push(servers);
                }
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

/// The `bootstrap_servers` of every Kafka spout in the stored topology files; a file that
/// cannot be read or parsed is skipped (its topology is checked at submit).
async fn topology_bootstrap_servers(code: &CodeStore) -> Vec<String> {
    let mut found = Vec::new();
    for id in code.topologies().await.unwrap_or_default() {
        let path = code.topology_dir(&id).join(CodeFile::Topology.file_name());
        let Ok(text) = tokio::fs::read_to_string(&path).await else { continue };
        for servers in spout_bootstrap_servers(&text) {
            if !found.contains(&servers) {
                found.push(servers);
            }
        }
    }
    found
}

/// The non-empty `params.bootstrap_servers` of the `spouts` of a Flux file.
pub fn spout_bootstrap_servers(flux: &str) -> Vec<String> {
    let Ok(file) = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(flux) else { return Vec::new() };
    let spouts = file.get("spouts").and_then(|s| s.as_sequence()).cloned().unwrap_or_default();
    spouts
        .iter()
        .filter_map(|s| s.get("params")?.get("bootstrap_servers")?.as_str().map(str::trim).map(str::to_owned))
        .filter(|s| !s.is_empty())
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
}
