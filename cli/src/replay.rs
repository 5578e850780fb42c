//! `squall replay NAME`: a running topology's Kafka spouts read again from an earlier position,
//! in one command. No Kafka tool does this safely for a live consumer; the steps are:
//!
//! 1. read the topology's file from nimbus: its Kafka spouts name the group, the topics, the
//!    registry (`zookeeper_connect`, `zookeeper_chroot`) and the brokers;
//! 2. `deactivate`: the spouts stop emitting, wait for their tuples in flight (up to the
//!    message timeout), commit, and leave the group (`/ids` and `/owners` empty);
//! 3. wait until the group has no members, printing progress;
//! 4. reset the group's offsets (the plan of `squall offsets reset`, written in one transaction);
//! 5. `activate`: the spouts join again and start from the reset offsets.
//!
//! With `--dry-run` only the plan is printed and the topology is not touched. If a step after
//! the deactivate fails, the topology is activated again and the error names the step.

use std::collections::BTreeSet;
use std::time::Duration;

use cluster_state::code::CodeFile;
use cluster_state::ids::GroupId;
use kafka_spout::KafkaSpoutConfig;
use serde::Deserialize;
use tokio::time::Instant;

use crate::offsets::{Connection, ReplayTo, ResetArgs, ResetError, reset_group};
use crate::ops::{ClientArgs, explain, resolve, runtime};

/// `squall replay`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("to").required(true).args([
    "to_earliest", "to_offset", "to_datetime", "shift_by", "from_snapshot"
])))]
pub struct ReplayCommand {
    /// The topology's name (or id).
    pub name: String,
    /// The consumer group to replay, when the topology's Kafka spouts read more than one.
    #[arg(long)]
    pub group: Option<String>,
    /// Only this topic (default: every topic the group's spouts read).
    #[arg(long)]
    pub topic: Option<String>,
    #[command(flatten)]
    pub to: ReplayTo,
    /// Print the plan only; the topology keeps running untouched.
    #[arg(long)]
    pub dry_run: bool,
    /// How long to wait for the spouts to leave the group after the deactivate (they drain
    /// for up to the topology's message timeout first).
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    pub wait: u64,
    /// The registry's ZooKeeper, overriding the spouts' `zookeeper_connect` (e.g. when this
    /// machine reaches it under another address).
    #[arg(long)]
    pub zookeeper: Option<String>,
    /// Kafka brokers, overriding the spouts' `bootstrap_servers`.
    #[arg(long)]
    pub brokers: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// The parts of a topology file that name its Kafka spouts.
#[derive(Debug, Deserialize)]
struct FluxSpouts {
    #[serde(default)]
    spouts: Vec<FluxSpout>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FluxSpout {
    id: String,
    class_name: String,
    #[serde(default)]
    params: serde_yaml_ng::Value,
}

/// One consumer group of the topology and where it lives.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Group {
    group: String,
    topics: BTreeSet<String>,
    zookeeper: String,
    chroot: Option<String>,
    brokers: String,
    /// The spouts' `offsets_storage`: a reset writes Kafka's offsets too when it names Kafka.
    offsets_storage: kafka_spout::OffsetsStorage,
}

/// The consumer groups the topology file's Kafka spouts read.
fn groups_of(text: &str) -> Result<Vec<Group>, String> {
    let file: FluxSpouts =
        serde_yaml_ng::from_str(text).map_err(|e| format!("the topology's file cannot be read: {e}"))?;
    let mut groups: Vec<Group> = Vec::new();
    for spout in file.spouts.iter().filter(|s| s.class_name == kafka_spout::SPOUT_NAME) {
        let config: KafkaSpoutConfig = serde_yaml_ng::from_value(spout.params.clone())
            .map_err(|e| format!("spout {}: its Kafka params cannot be read: {e}", spout.id))?;
        let group = Group {
            group: config.group_id,
            topics: config.topics.into_iter().collect(),
            zookeeper: config.zookeeper_connect,
            chroot: config.zookeeper_chroot,
            brokers: config.bootstrap_servers,
            offsets_storage: config.offsets_storage,
        };
        match groups.iter_mut().find(|g| g.group == group.group && g.zookeeper == group.zookeeper) {
            Some(same) => {
                same.topics.extend(group.topics);
                // Spouts of one group that disagree: a reset writes both stores.
                if same.offsets_storage != group.offsets_storage {
                    same.offsets_storage = kafka_spout::OffsetsStorage::Dual;
                }
            }
            None => groups.push(group),
        }
    }
    Ok(groups)
}

impl ReplayCommand {
    /// `squall offsets reset` arguments for one topic of `group`.
    fn reset_args(&self, group: &Group, topic: Option<&str>, execute: bool) -> ResetArgs {
        ResetArgs {
            group: group.group.clone(),
            topic: topic.map(str::to_owned),
            to: self.to.clone(),
            to_latest: false,
            from_file: None,
            dry_run: !execute,
            execute,
            connection: Connection {
                zookeeper: Some(self.zookeeper.clone().unwrap_or_else(|| group.zookeeper.clone())),
                registry_chroot: group.chroot.clone(),
                brokers: Some(self.brokers.clone().unwrap_or_else(|| group.brokers.clone())),
                // The cluster's ZooKeeper credentials: the registry's nodes are writable only
                // with them.
                config: self.client.config.clone(),
                offsets_storage: group.offsets_storage,
            },
        }
    }

    /// Resets `group` (every topic, or `--topic`; a snapshot resets what it holds), one topic
    /// at a time, skipping the topics in `done` and adding each one reset to it: a retry after
    /// a live consumer never resets a topic twice (twice `--shift-by` would shift twice).
    async fn reset(
        &self,
        group: &Group,
        execute: bool,
        done: &mut BTreeSet<String>,
    ) -> Result<(), ResetError> {
        if self.to.from_snapshot.is_some() {
            return reset_group(self.reset_args(group, self.topic.as_deref(), execute)).await;
        }
        let topics: Vec<&str> = match &self.topic {
            Some(t) if group.topics.contains(t) => vec![t.as_str()],
            Some(t) => {
                return Err(ResetError::Failed(format!(
                    "group {} does not read topic {t}; its topics: {}",
                    group.group,
                    group.topics.iter().cloned().collect::<Vec<_>>().join(", ")
                )));
            }
            None => group.topics.iter().filter(|t| !done.contains(*t)).map(String::as_str).collect(),
        };
        for topic in topics {
            reset_group(self.reset_args(group, Some(topic), execute)).await?;
            if execute {
                done.insert(topic.to_owned());
            }
        }
        Ok(())
    }

    /// Waits for the group to empty and resets it. A worker still acting on an earlier
    /// `activate` can join the group after it looked empty; the reset then refuses (its
    /// member is live, or its owner node fences the write), and this waits again: the
    /// topology is inactive, so the worker leaves as soon as it sees that.
    async fn reset_when_empty(&self, group: &Group, done: &mut BTreeSet<String>) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(self.wait);
        loop {
            wait_until_empty(self, group, deadline).await?;
            match self.reset(group, true, done).await {
                Ok(()) => return Ok(()),
                Err(ResetError::ConsumerLive(e)) if Instant::now() < deadline => {
                    println!(
                        "a consumer joined group {} again before the reset was written ({e}); waiting for it to leave",
                        group.group
                    );
                }
                Err(e) => return Err(format!("reset: {e}")),
            }
        }
    }
}

/// Runs `squall replay`.
pub fn replay(cmd: ReplayCommand) -> Result<(), String> {
    let client = cmd.client.client()?;
    runtime()?.block_on(async {
        let id = resolve(&client, &cmd.name).await?;
        let mut download = client.download_code(&id, CodeFile::Topology).await.map_err(explain)?;
        let mut bytes = Vec::new();
        while let Some(chunk) = download.next_chunk().await.map_err(explain)? {
            bytes.extend_from_slice(&chunk);
        }
        let text = String::from_utf8(bytes).map_err(|_| "the topology's file is not UTF-8".to_owned())?;
        let mut groups = groups_of(&text)?;
        if let Some(wanted) = &cmd.group {
            groups.retain(|g| &g.group == wanted);
        }
        let group = match groups.as_slice() {
            [one] => one.clone(),
            [] if cmd.group.is_some() => {
                return Err(format!(
                    "no Kafka spout of {} reads group {:?}",
                    cmd.name,
                    cmd.group.as_deref().unwrap_or("")
                ));
            }
            [] => return Err(format!("{} has no Kafka spout: nothing to replay", cmd.name)),
            many => {
                let names: Vec<&str> = many.iter().map(|g| g.group.as_str()).collect();
                return Err(format!(
                    "{} reads several groups ({}): pass --group",
                    cmd.name,
                    names.join(", ")
                ));
            }
        };
        GroupId::new(group.group.as_str()).map_err(|e| format!("the spout's group_id: {e}"))?;
        println!(
            "topology {} ({id}) reads group {} ({})",
            cmd.name,
            group.group,
            group.topics.iter().cloned().collect::<Vec<_>>().join(", ")
        );
        if cmd.dry_run {
            cmd.reset(&group, false, &mut BTreeSet::new()).await.map_err(|e| e.to_string())?;
            println!("dry run: the topology was not touched; run without --dry-run to replay");
            return Ok(());
        }
        client.deactivate(&id).await.map_err(explain)?;
        println!(
            "deactivated {}: its spouts drain their tuples in flight, commit and leave the group",
            cmd.name
        );
        let mut done = BTreeSet::new();
        let outcome = cmd.reset_when_empty(&group, &mut done).await;
        let activated = client.activate(&id).await.map_err(explain);
        let reset_so_far = match done.is_empty() {
            true => "nothing was reset".to_owned(),
            false => format!("only {} was reset", done.iter().cloned().collect::<Vec<_>>().join(", ")),
        };
        match (outcome, activated) {
            (Ok(()), Ok(_)) => {
                println!(
                    "activated {}: its spouts join group {} again and start from the reset offsets",
                    cmd.name, group.group
                );
                Ok(())
            }
            (Ok(()), Err(e)) => Err(format!(
                "the offsets are reset but activating failed: {e}; run `squall activate {}`",
                cmd.name
            )),
            (Err(e), Ok(_)) => Err(format!("{e}; {reset_so_far} and {} is active again", cmd.name)),
            (Err(e), Err(again)) => {
                Err(format!("{e}; activating again failed too ({again}): run `squall activate {}`", cmd.name))
            }
        }
    })
}

/// Polls the group's members until there are none (or `deadline`), printing who is left
/// every few seconds.
async fn wait_until_empty(cmd: &ReplayCommand, group: &Group, deadline: Instant) -> Result<(), String> {
    let connection = cmd.reset_args(group, None, false).connection;
    let session = crate::offsets::session(&connection).await?;
    let paths = connection.paths()?;
    let admin = consumer_registry::admin::Admin::new(&session, paths);
    let group_id = GroupId::new(group.group.as_str()).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut next_report = started;
    let result = loop {
        let members = match admin.members(&group_id).await {
            Ok(m) => m,
            Err(e) => break Err(format!("reading the members of group {}: {e}", group.group)),
        };
        if members.is_empty() {
            println!("group {} has no members ({:.1} s)", group.group, started.elapsed().as_secs_f64());
            break Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            break Err(format!(
                "group {} still has {} member(s) after {} s ({}): are other consumers using it? (--wait sets the bound)",
                group.group,
                members.len(),
                cmd.wait,
                members.join(", ")
            ));
        }
        if now >= next_report {
            println!(
                "waiting for group {} to empty: {} member(s) left ({:.0} s)",
                group.group,
                members.len(),
                started.elapsed().as_secs_f64()
            );
            next_report = now + Duration::from_secs(5);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let _ = session.close().await;
    result
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn the_groups_of_a_topology_file_come_from_its_kafka_spouts() {
        use kafka_spout::OffsetsStorage;
        let text = "name: t\nspouts:\n  - id: a\n    className: kafka-spout\n    params:\n      bootstrap_servers: b:9092\n      topics: [x]\n      group_id: g\n      zookeeper_connect: z:2181\n\
                    \x20 - id: b\n    className: kafka-spout\n    params:\n      bootstrap_servers: b:9092\n      topics: [y]\n      group_id: g\n      zookeeper_connect: z:2181\n      zookeeper_chroot: /k\n\
                    \x20 - id: c\n    className: sentence-generator\nbolts: []\n";
        let groups = groups_of(text).unwrap();
        assert_eq!(groups.len(), 1, "{groups:?}");
        assert_eq!(groups[0].topics, BTreeSet::from(["x".to_owned(), "y".to_owned()]));
        assert_eq!((groups[0].brokers.as_str(), groups[0].zookeeper.as_str()), ("b:9092", "z:2181"));
        assert_eq!(groups[0].offsets_storage, OffsetsStorage::Zookeeper, "the spouts' default");
        assert_eq!(groups_of("name: t\nspouts: []\n").unwrap(), vec![]);
        // The spouts' offsets_storage goes to the reset, which then writes Kafka's offsets too.
        let dual = text.replacen("group_id: g\n", "group_id: g\n      offsets_storage: dual\n", 2);
        let groups = groups_of(&dual).unwrap();
        assert_eq!(groups[0].offsets_storage, OffsetsStorage::Dual);
        let kafka_and_zookeeper =
            text.replacen("group_id: g\n", "group_id: g\n      offsets_storage: kafka\n", 1);
        assert_eq!(
            groups_of(&kafka_and_zookeeper).unwrap()[0].offsets_storage,
            OffsetsStorage::Dual,
            "disagreeing spouts: both stores"
        );
        let bad = "spouts:\n  - id: a\n    className: kafka-spout\n    params: {no_such_key: 1}\n";
        assert!(groups_of(bad).unwrap_err().contains("spout a"), "names the spout");
    }
}
