//! The member's view of its group: the registered members and their subscriptions, the
//! subscribed topics' partitions (from ZooKeeper's topic registry, watched, or the caller's
//! partition source), and the owner nodes checked for orphans and for nodes lost under us.

use std::collections::BTreeSet;

use cluster_state::coord::{self, WatchEvent};
use cluster_state::ids::{ConsumerId, Topic};
use cluster_state::znode::{ConsumerRegistration, SubscriptionPattern, TopicRegistration};
use futures::future::join_all;
use tokio_util::sync::CancellationToken;

use super::{Halt, Member, WatchKey};
use crate::assign::{TopicPartition, TopicPartitions};
use crate::zk::Zk;

/// The least time a partition source (Kafka metadata) gets to answer during a rebalance.
const SOURCE_TIMEOUT_FLOOR: std::time::Duration = std::time::Duration::from_secs(2);

impl Member {
    /// The group's subscriptions, re-registering ourselves if our node is gone.
    pub(super) async fn read_members(
        &mut self,
        zk: &Zk,
        cancel: &CancellationToken,
    ) -> std::result::Result<crate::assign::Subscriptions, Halt> {
        let dir = self.spec.paths.ids_dir(&self.spec.group);
        let ids = if self.armed.contains(&WatchKey::Members) {
            zk.children(&dir).await?
        } else {
            let (ids, watch) = zk.children_watch(&dir).await?;
            self.arm(WatchKey::Members, watch);
            ids
        };
        if !ids.iter().any(|id| id == self.consumer_id.as_str()) {
            tracing::warn!(group = %self.spec.group, consumer = %self.consumer_id, "our registration is gone; registering again");
            let path = self.spec.paths.id(&self.spec.group, &self.consumer_id);
            self.create_registration(zk, &path, cancel).await?;
        }
        self.registrations.retain(|id, _| ids.contains(id));
        let missing: Vec<&String> = ids
            .iter()
            .filter(|id| *id != self.consumer_id.as_str() && !self.registrations.contains_key(*id))
            .collect();
        let reads = missing.iter().map(|id| {
            let path = coord::join(&dir, id);
            async move { (id, zk.read::<ConsumerRegistration>(&path).await) }
        });
        for (id, read) in join_all(reads).await {
            match read {
                Ok((registration, _)) if registration.pattern == SubscriptionPattern::Static => {
                    let topics = registration
                        .subscription
                        .iter()
                        .filter_map(|(t, n)| Topic::new(t.as_str()).ok().map(|t| (t, *n)))
                        .collect();
                    self.registrations.insert((*id).clone(), topics);
                }
                Ok((registration, _)) => {
                    // Wildcard subscriptions need the topic list and the same filter on every
                    // member; Squall members never register them.
                    tracing::warn!(group = %self.spec.group, member = %id, pattern = registration.pattern.as_str(), "ignoring a member with a wildcard subscription");
                }
                Err(coord::Error::NoNode { .. }) => {} // left meanwhile; its watch event follows
                Err(coord::Error::Decode(e)) => {
                    tracing::warn!(group = %self.spec.group, member = %id, error = %e, "ignoring a member with a garbage registration");
                }
                Err(e) => return Err(e.into()),
            }
        }
        let mut subscriptions: crate::assign::Subscriptions = self
            .registrations
            .iter()
            .filter_map(|(id, topics)| ConsumerId::new(id.as_str()).ok().map(|id| (id, topics.clone())))
            .collect();
        subscriptions.insert(self.consumer_id.clone(), self.spec.subscription.clone());
        Ok(subscriptions)
    }

    pub(super) fn arm(&mut self, key: WatchKey, watch: coord::Watch) {
        self.armed.insert(key.clone());
        self.watches.push(Box::pin(async move {
            let _: WatchEvent = watch.await;
            key
        }));
    }

    /// The partitions of each subscribed topic: from `/brokers/topics/[topic]` when Kafka
    /// registers it there (watched), else from the caller's source.
    pub(super) async fn read_partitions(&mut self, zk: &Zk) -> std::result::Result<TopicPartitions, Halt> {
        if !self.armed.contains(&WatchKey::Brokers) {
            // Broker changes re-trigger a rebalance, as in Kafka; the partition sets come from
            // the topics below.
            let dir = self.spec.paths.brokers_ids_dir();
            match zk.children_watch(&dir).await {
                Ok((_, watch)) => self.arm(WatchKey::Brokers, watch),
                Err(coord::Error::NoNode { .. }) => {
                    let (_, watch) = zk.exists_watch(&dir).await?;
                    self.arm(WatchKey::Brokers, watch);
                }
                Err(e) => return Err(e.into()),
            }
        }
        let refresh = std::mem::take(&mut self.refresh_source);
        let topics: Vec<Topic> = self.spec.subscription.keys().cloned().collect();
        for topic in topics {
            let key = WatchKey::Topic(topic.clone());
            if self.armed.contains(&key) && self.topic_partitions.contains_key(&topic) && !refresh {
                continue;
            }
            let path = self.spec.paths.topic(&topic);
            let registered = if self.armed.contains(&key) {
                match zk.read::<TopicRegistration>(&path).await {
                    Ok((registration, _)) => Some(registration),
                    Err(coord::Error::NoNode { .. }) => None,
                    Err(coord::Error::Decode(e)) => {
                        self.unreadable_topic(&topic, &e);
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                }
            } else {
                match zk.read_watch::<TopicRegistration>(&path).await {
                    Ok((registration, _, watch)) => {
                        self.arm(key, watch);
                        Some(registration)
                    }
                    Err(coord::Error::NoNode { .. }) => {
                        // Watch for Kafka registering it; if that happened just now, the watch
                        // fires and the next rebalance reads it.
                        let (_, watch) = zk.exists_watch(&path).await?;
                        self.arm(key, watch);
                        None
                    }
                    Err(coord::Error::Decode(e)) => {
                        self.unreadable_topic(&topic, &e);
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            match registered {
                Some(registration) => {
                    self.topic_partitions.insert(topic, registration.partitions().collect());
                }
                None => self.ask_source(&topic).await,
            }
        }
        Ok(self.topic_partitions.clone())
    }

    /// A garbage topic registration keeps the partitions we knew (and is read again on the next
    /// rebalance, since its watch is not armed).
    pub(super) fn unreadable_topic(&self, topic: &Topic, e: &cluster_state::znode::DecodeError) {
        tracing::warn!(group = %self.spec.group, %topic, error = %e, "unreadable topic registration; keeping the partitions known before");
    }

    pub(super) async fn ask_source(&mut self, topic: &Topic) {
        let Some(source) = self.spec.partition_source.clone() else {
            self.topic_partitions.remove(topic);
            return;
        };
        // A hung metadata call must not stall the group's bookkeeping; but a first metadata
        // request of a new client (connecting to the brokers) under load easily takes longer
        // than a short rebalance backoff, hence the floor.
        let bound = self.config.backoff().max(SOURCE_TIMEOUT_FLOOR);
        let answer = tokio::time::timeout(bound, source.partitions(topic)).await;
        match answer.unwrap_or_else(|_| Err(format!("no answer within {bound:?}").into())) {
            Ok(Some(partitions)) => {
                self.topic_partitions.insert(topic.clone(), partitions);
            }
            Ok(None) => {
                self.topic_partitions.remove(topic);
            }
            Err(e) => {
                tracing::warn!(group = %self.spec.group, %topic, error = %e, "partition source failed; keeping the partitions known before");
                // Knowing none, this member claims nothing of the topic while the others have
                // already given this member's share up: ask again soon, not at the next
                // periodic refresh.
                if !self.topic_partitions.contains_key(topic) {
                    self.refresh_source = true;
                    self.schedule(self.config.backoff());
                }
            }
        }
    }

    /// The periodic check: counts partitions without an owner node, and returns the owned
    /// partitions whose node vanished under us.
    pub(super) async fn check_owners(
        &mut self,
        zk: &Zk,
        partitions: &TopicPartitions,
    ) -> std::result::Result<BTreeSet<TopicPartition>, Halt> {
        let mut lost = BTreeSet::new();
        for (topic, parts) in partitions.iter().filter(|(t, _)| self.spec.subscription.contains_key(*t)) {
            let dir = self.spec.paths.owners_topic(&self.spec.group, topic);
            let owners: BTreeSet<String> = match zk.children(&dir).await {
                Ok(owners) => owners.into_iter().collect(),
                Err(coord::Error::NoNode { .. }) => BTreeSet::new(),
                Err(e) => return Err(e.into()),
            };
            let orphans = parts.iter().filter(|p| !owners.contains(&p.to_string())).count();
            if orphans > 0 {
                tracing::info!(group = %self.spec.group, %topic, orphans, "partitions without an owner");
                let counter = self
                    .metrics
                    .orphaned_partitions
                    .with_label_values(&[self.spec.group.as_str(), topic.as_str()]);
                counter.inc_by(u64::try_from(orphans).unwrap_or(u64::MAX));
            }
            lost.extend(
                self.owned
                    .keys()
                    .filter(|tp| &tp.topic == topic && !owners.contains(&tp.partition.to_string()))
                    .cloned(),
            );
        }
        if !lost.is_empty() {
            tracing::warn!(group = %self.spec.group, lost = lost.len(), "owner nodes vanished under us");
        }
        Ok(lost)
    }
}
