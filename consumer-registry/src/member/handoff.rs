//! Rebalancing: re-read, decide with the pure `assign` / `ownership_diff`, then hand partitions
//! off (tell the caller, wait for its drained-and-committed ack, delete the owner nodes) and
//! claim new ones with checked ephemerals, waiting out nodes still held by others.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use cluster_state::coord::{self, SessionState, WatchEvent};
use cluster_state::ids::ConsumerThreadId;
use futures::FutureExt as _;
use futures::future::{BoxFuture, join_all};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{FIRST_RETRY, Halt, Member, MemberEvent, RevokeAck, Waited};
use crate::assign::{TopicPartition, assign, assigned_to, ownership_diff};
use crate::error::Error;
use crate::zk::Zk;

impl Member {
    /// One reconcile: re-read, decide, hand off. Errors that a retry can fix are retried after
    /// a backoff; others are logged and wait for the next change.
    pub(super) async fn rebalance(&mut self, cancel: &CancellationToken) {
        let group = self.spec.group.clone();
        match self.try_rebalance(cancel).await {
            Ok(changed) => {
                self.retry_delay = FIRST_RETRY;
                let first = self.first_trigger.take();
                if let Some(first) = first
                    && changed
                {
                    self.metrics.rebalances.with_label_values(&[group.as_str()]).inc();
                    let seconds = first.elapsed().as_secs_f64();
                    self.metrics.rebalance_duration.with_label_values(&[group.as_str()]).observe(seconds);
                }
            }
            Err(halt) => {
                let Some(e) = self.error(halt) else { return };
                if self.zk.as_ref().is_none_or(|zk| zk.session.state() != SessionState::Connected) {
                    // A disconnect, not a failure: reconnecting schedules a fresh rebalance.
                    tracing::info!(%group, consumer = %self.consumer_id, error = %e, "rebalance interrupted by a ZooKeeper disconnect; it runs again once connected");
                } else if e.is_retryable() {
                    tracing::warn!(%group, error = %e, "rebalance failed; retrying");
                    self.schedule(self.retry_delay);
                    self.retry_delay = (self.retry_delay * 2).min(self.config.backoff());
                } else {
                    tracing::error!(%group, error = %e, "rebalance failed; waiting for the group to change");
                }
            }
        }
    }

    /// Returns whether anything was released or claimed.
    pub(super) async fn try_rebalance(
        &mut self,
        cancel: &CancellationToken,
    ) -> std::result::Result<bool, Halt> {
        let zk = self.zk()?;
        let subscriptions = self.read_members(&zk, cancel).await?;
        let partitions = self.read_partitions(&zk).await?;
        let assignment = assign(self.config.partition_assignment_strategy, &partitions, &subscriptions)
            .map_err(|source| Halt::Failed(Error::Assignment { group: self.spec.group.clone(), source }))?;
        let desired = assigned_to(&assignment, &self.consumer_id);
        let lost = if std::mem::take(&mut self.check_orphans) {
            self.check_owners(&zk, &partitions).await?
        } else {
            BTreeSet::new()
        };
        self.drop_uncertain(&zk, &desired).await?;
        let diff = ownership_diff(&self.owned, &desired, &lost);
        if diff.is_empty() {
            return Ok(false);
        }
        tracing::debug!(group = %self.spec.group, consumer = %self.consumer_id, release = diff.release.len(), claim = diff.claim.len(), "rebalancing");
        self.release(&zk, diff.release, Some(cancel)).await?;
        self.claim(&zk, diff.claim, cancel).await?;
        Ok(true)
    }

    /// Deletes owner nodes that may be ours after a lost reply, unless we want them: those are
    /// claimed again (and found ours) by the claim.
    pub(super) async fn drop_uncertain(
        &mut self,
        zk: &Zk,
        desired: &BTreeMap<TopicPartition, ConsumerThreadId>,
    ) -> std::result::Result<(), Halt> {
        let stale: Vec<TopicPartition> =
            self.uncertain.iter().filter(|tp| !desired.contains_key(*tp)).cloned().collect();
        let session = zk.session.id();
        for tp in stale {
            let path = self.spec.paths.owner(&self.spec.group, &tp.topic, tp.partition);
            match zk.get(&path).await {
                Ok((_, stat)) if stat.ephemeral_owner == Some(session) => {
                    match zk.delete(&path, Some(stat.version)).await {
                        Ok(()) | Err(coord::Error::NoNode { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(_) | Err(coord::Error::NoNode { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            self.uncertain.remove(&tp);
        }
        self.uncertain.retain(|tp| desired.contains_key(tp));
        Ok(())
    }

    /// The ordered hand-off of `partitions`: tell the caller, wait for its ack (bounded), stop
    /// counting them ours, delete their owner nodes.
    pub(super) async fn release(
        &mut self,
        zk: &Zk,
        partitions: BTreeSet<TopicPartition>,
        cancel: Option<&CancellationToken>,
    ) -> std::result::Result<(), Halt> {
        if partitions.is_empty() {
            return Ok(());
        }
        let (ack, acked) = oneshot::channel();
        self.send(MemberEvent::Revoking { partitions: partitions.clone(), ack: RevokeAck(ack) }, cancel)
            .await?;
        let timeout = Duration::from_millis(self.config.revoke_timeout_ms);
        if let Waited::Done(Err(_)) = self.wait(tokio::time::timeout(timeout, acked), cancel, false).await? {
            tracing::warn!(group = %self.spec.group, consumer = %self.consumer_id, timeout_ms = self.config.revoke_timeout_ms, "caller did not acknowledge the revocation in time; releasing anyway");
        }
        for tp in &partitions {
            self.owned.remove(tp);
        }
        self.offsets.forget(&partitions);
        self.publish();
        let deletes = partitions.iter().map(|tp| {
            let path = self.spec.paths.owner(&self.spec.group, &tp.topic, tp.partition);
            async move { (tp, zk.delete(&path, None).await) }
        });
        let mut failure = None;
        for (tp, deleted) in join_all(deletes).await {
            match deleted {
                Ok(()) | Err(coord::Error::NoNode { .. }) => {}
                Err(e) => {
                    self.uncertain.insert(tp.clone());
                    failure.get_or_insert(e);
                }
            }
        }
        self.send(MemberEvent::Revoked { partitions }, cancel).await?;
        match failure {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Claims owner nodes. A node still held by another member is watched and claimed once it
    /// goes; waiting ends after `rebalance_max_retries` backoff periods without any such node
    /// going (the periodic reconcile tries again), and a view change meanwhile restarts the
    /// rebalance with fresh data.
    pub(super) async fn claim(
        &mut self,
        zk: &Zk,
        wanted: BTreeMap<TopicPartition, ConsumerThreadId>,
        cancel: &CancellationToken,
    ) -> std::result::Result<(), Halt> {
        let mut try_now: BTreeSet<TopicPartition> = wanted.keys().cloned().collect();
        // Nodes held by others, each resolving to its partition when it changes.
        let mut waiting: FuturesUnordered<BoxFuture<'static, TopicPartition>> = FuturesUnordered::new();
        let mut retries = 0;
        loop {
            if !try_now.is_empty() {
                try_now = self.try_claim(zk, &wanted, &try_now, &mut waiting, cancel).await?;
                if !try_now.is_empty() {
                    continue; // some went while we looked
                }
            }
            if waiting.is_empty() {
                return Ok(());
            }
            if retries >= self.config.rebalance_max_retries {
                tracing::warn!(group = %self.spec.group, consumer = %self.consumer_id, still_held = waiting.len(), "giving up claiming partitions still owned by others; retrying later");
                self.schedule(self.config.backoff());
                return Ok(());
            }
            match self
                .wait(tokio::time::timeout(self.config.backoff(), waiting.next()), Some(cancel), true)
                .await?
            {
                Waited::Done(Ok(Some(tp))) => {
                    try_now.insert(tp);
                    while let Some(Some(tp)) = waiting.next().now_or_never() {
                        try_now.insert(tp);
                    }
                }
                Waited::Done(Ok(None)) => return Ok(()),
                Waited::Done(Err(_elapsed)) => retries += 1,
                Waited::ViewChanged => {
                    self.schedule(Duration::from_millis(self.config.rebalance_coalesce_ms));
                    return Ok(());
                }
            }
        }
    }

    /// One round of claims; returns the partitions whose holder went while we looked. Those
    /// still held go into `waiting`.
    pub(super) async fn try_claim(
        &mut self,
        zk: &Zk,
        wanted: &BTreeMap<TopicPartition, ConsumerThreadId>,
        partitions: &BTreeSet<TopicPartition>,
        waiting: &mut FuturesUnordered<BoxFuture<'static, TopicPartition>>,
        cancel: &CancellationToken,
    ) -> std::result::Result<BTreeSet<TopicPartition>, Halt> {
        let creates = partitions.iter().filter_map(|tp| wanted.get(tp).map(|thread| (tp, thread))).map(
            |(tp, thread)| {
                let path = self.spec.paths.owner(&self.spec.group, &tp.topic, tp.partition);
                async move {
                    let claimed = zk.create_ephemeral_checked(&path, thread.as_str().as_bytes()).await;
                    (tp.clone(), path, claimed)
                }
            },
        );
        let mut won = BTreeSet::new();
        let mut held = Vec::new();
        let mut failure = None;
        for (tp, path, claimed) in join_all(creates).await {
            match claimed {
                Ok(_) => drop(won.insert(tp)),
                Err(coord::Error::HeldByOther { .. }) => {
                    let labels = [self.spec.group.as_str(), tp.topic.as_str()];
                    self.metrics.owner_conflicts.with_label_values(&labels).inc();
                    held.push((tp, path));
                }
                Err(e) => {
                    // The create may have gone through: remember to look.
                    self.uncertain.insert(tp);
                    failure.get_or_insert(e);
                }
            }
        }
        if !won.is_empty() {
            for tp in &won {
                if let Some(thread) = wanted.get(tp) {
                    self.uncertain.remove(tp);
                    self.owned.insert(tp.clone(), thread.clone());
                }
            }
            self.publish();
            let session = zk.session.id();
            self.send(MemberEvent::Assigned { partitions: won, session }, Some(cancel)).await?;
        }
        if let Some(e) = failure {
            return Err(e.into());
        }
        let watches = held.iter().map(|(tp, path)| async move { (tp.clone(), zk.exists_watch(path).await) });
        let mut gone = BTreeSet::new();
        for (tp, watched) in join_all(watches).await {
            match watched? {
                (None, _) => drop(gone.insert(tp)),
                (Some(_), watch) => waiting.push(Box::pin(async move {
                    let _: WatchEvent = watch.await;
                    tp
                })),
            }
        }
        Ok(gone)
    }

    /// Leaves cleanly: hand everything off, delete our id, close the session.
    pub(super) async fn leave(&mut self) {
        let group = self.spec.group.clone();
        tracing::info!(%group, consumer = %self.consumer_id, "leaving consumer group");
        if let Some(zk) = self.zk.clone()
            && self.state == SessionState::Connected
        {
            let owned: BTreeSet<TopicPartition> = self.owned.keys().cloned().collect();
            if let Err(halt) = self.release(&zk, owned, None).await
                && let Some(e) = self.error(halt)
            {
                tracing::warn!(%group, error = %e, "releasing partitions on leave failed; the session close removes them");
            }
            let path = self.spec.paths.id(&group, &self.consumer_id);
            if let Err(e) = zk.delete(&path, None).await
                && !matches!(e, coord::Error::NoNode { .. })
            {
                tracing::warn!(%group, error = %e, "deleting our registration on leave failed; the session close removes it");
            }
        }
        self.offsets.stop();
        self.owned.clear();
        self.states = None;
        self.lease.end();
        if let Some((cancel, task)) = self.keeper.take() {
            cancel.cancel();
            let _ = task.await;
        }
        let zk = self.zk.take();
        self.publish();
        self.set_state(SessionState::Closed);
        // Callers' commits in flight may still hold the session; then it closes when they drop it.
        if let Some(zk) = zk
            && let Ok(session) = Arc::try_unwrap(zk.session)
            && let Err(e) = session.close().await
        {
            tracing::debug!(%group, error = %e, "closing the session");
        }
    }
}
