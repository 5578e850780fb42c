//! The member's session: connecting and registering, adopting (or resuming) a session with its
//! lease keeper, and what each session state change means for ownership.

use std::collections::BTreeSet;
use std::time::Duration;

use cluster_state::coord::{self, SessionEvent, SessionState};
use cluster_state::znode::{ConsumerRegistration, SubscriptionPattern, ZnodeData};
use futures::stream::FuturesUnordered;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{FIRST_RETRY, Halt, Member, MemberEvent, now_ms};
use crate::assign::TopicPartition;
use crate::lease::Keeper;
use crate::zk::Zk;

impl Member {
    /// Connects a new session and registers the consumer id, retrying until it works, the
    /// session changes state, or `cancel`.
    pub(super) async fn open_session(&mut self, cancel: &CancellationToken) -> std::result::Result<(), Halt> {
        let group = self.spec.group.clone();
        let mut delay = FIRST_RETRY;
        loop {
            let zk = match self.zk.clone() {
                Some(zk) => Some(zk),
                None => match self.spec.ensemble.connect(&self.session_options).await {
                    Ok(session) => Some(self.adopt(session)),
                    Err(e) if e.is_retryable() => {
                        tracing::warn!(%group, error = %e, "cannot connect to ZooKeeper; retrying");
                        None
                    }
                    Err(e) => return Err(e.into()),
                },
            };
            if let Some(zk) = zk {
                match self.register(&zk, cancel).await {
                    Ok(()) => {
                        self.schedule(Duration::ZERO);
                        return Ok(());
                    }
                    Err(Halt::Zk(e)) if e.is_session_lost() => {
                        tracing::warn!(%group, error = %e, "session lost while registering; starting a new one");
                        self.set_state(SessionState::Expired);
                        self.drop_session();
                    }
                    Err(Halt::Zk(e)) if e.is_retryable() => {
                        tracing::warn!(%group, error = %e, "registering the consumer failed; retrying");
                    }
                    Err(halt) => return Err(halt),
                }
            }
            tokio::select! {
                () = cancel.cancelled() => return Err(Halt::Cancelled),
                () = tokio::time::sleep(delay) => delay = (delay * 2).min(self.config.backoff()),
            }
        }
    }

    /// Forgets the current session: its lease ends first, then its keeper stops.
    pub(super) fn drop_session(&mut self) {
        self.lease.end();
        if let Some((cancel, _)) = self.keeper.take() {
            cancel.cancel();
        }
        self.zk = None;
        self.states = None;
        self.offsets.set_session(None);
    }

    /// Makes `session` the member's session.
    pub(super) fn adopt(&mut self, session: coord::Session) -> Zk {
        let ops = self.metrics.zk_ops.with_label_values(&[self.spec.group.as_str()]);
        let zk = Zk::new(session, ops);
        self.lease.begin(zk.session.id());
        self.states = Some(zk.session.state_changes());
        self.set_state(zk.session.state());
        self.zk = Some(zk.clone());
        self.offsets.set_session(Some(zk.clone()));
        self.watches = FuturesUnordered::new();
        self.armed.clear();
        self.registrations.clear();
        // Fixed for the session's life: a create retried after a lost reply must write the
        // same bytes to be recognised as ours.
        let registration = ConsumerRegistration {
            subscription: self.spec.subscription.iter().map(|(t, n)| (t.to_string(), *n)).collect(),
            pattern: SubscriptionPattern::Static,
            timestamp_ms: now_ms(),
        };
        self.registration = registration.encode();
        self.publish();
        let keeper = Keeper {
            zk: zk.clone(),
            lease: self.lease.clone(),
            paths: self.spec.paths.clone(),
            group: self.spec.group.clone(),
            id_path: self.spec.paths.id(&self.spec.group, &self.consumer_id),
            ownership: self.ownership.subscribe(),
            distrust: self.distrust.clone(),
        };
        let cancel = CancellationToken::new();
        let task = tokio::spawn(keeper.run(cancel.clone()));
        if let Some((previous, _)) = self.keeper.replace((cancel, task)) {
            previous.cancel();
        }
        zk
    }

    /// Writes `/consumers/[group]/ids/[consumer_id]`. A node left by our previous session
    /// (same id, not yet expired) is waited out, like Kafka does, for a bounded time.
    pub(super) async fn register(
        &mut self,
        zk: &Zk,
        cancel: &CancellationToken,
    ) -> std::result::Result<(), Halt> {
        let path = self.spec.paths.id(&self.spec.group, &self.consumer_id);
        self.create_registration(zk, &path, cancel).await
    }

    pub(super) async fn create_registration(
        &mut self,
        zk: &Zk,
        path: &str,
        cancel: &CancellationToken,
    ) -> std::result::Result<(), Halt> {
        // An old session's node goes within its session timeout; give it two.
        let give_up = Instant::now() + 2 * self.session_options.session_timeout + self.config.backoff();
        loop {
            let data = self.registration.clone();
            match zk.create_ephemeral_checked(path, &data).await {
                Ok(_) => return Ok(()),
                Err(coord::Error::HeldByOther { owner, .. }) if Instant::now() < give_up => {
                    tracing::warn!(group = %self.spec.group, %path, %owner, "consumer id still registered by an older session; waiting for it to go");
                    let (exists, gone) = zk.exists_watch(path).await?;
                    if exists.is_some() {
                        let wait = tokio::time::timeout(self.config.backoff(), gone);
                        self.wait(wait, Some(cancel), false).await?;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub(super) async fn on_session_event(
        &mut self,
        event: SessionEvent,
        cancel: &CancellationToken,
    ) -> std::result::Result<(), Halt> {
        if self.zk.as_ref().is_none_or(|zk| zk.session.id() != event.session_id) {
            return Ok(()); // from a session we already replaced
        }
        self.set_state(event.state);
        let group = self.spec.group.clone();
        match event.state {
            SessionState::Disconnected => {
                tracing::warn!(%group, consumer = %self.consumer_id, "ZooKeeper disconnected; pausing until it answers again");
                if !self.paused {
                    self.paused = true;
                    self.publish();
                    self.send(MemberEvent::Paused, Some(cancel)).await?;
                }
            }
            // Watches may have been missed while away: re-read everything.
            SessionState::Connected => self.reconnected(cancel).await?,
            SessionState::Expired if self.resume_session(cancel).await? => {}
            SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => {
                tracing::warn!(%group, consumer = %self.consumer_id, state = ?event.state, "ZooKeeper session ended; re-registering");
                let lost: BTreeSet<TopicPartition> = std::mem::take(&mut self.owned).into_keys().collect();
                self.uncertain.clear();
                self.offsets.forget(&lost);
                self.drop_session();
                self.paused = false;
                self.publish();
                self.send(MemberEvent::Expired { partitions: lost }, Some(cancel)).await?;
                self.open_session(cancel).await?;
            }
        }
        Ok(())
    }

    /// Connected again (or resumed): the pause ends, and everything is re-read, since watches
    /// may have been missed meanwhile.
    pub(super) async fn reconnected(&mut self, cancel: &CancellationToken) -> std::result::Result<(), Halt> {
        if self.paused {
            self.paused = false;
            self.publish();
            self.send(MemberEvent::Resumed, Some(cancel)).await?;
        }
        self.check_orphans = true;
        self.schedule(Duration::ZERO);
        Ok(())
    }

    /// The client library reports a session expired when it could not reconnect within 7/5 of
    /// the session timeout, but a ZooKeeper ensemble that was down (restarted) restores its
    /// sessions with fresh timeouts: ask the server. If it still holds ours, carry on with it:
    /// owner nodes and registration are still ours (the keeper re-validates them before the
    /// lease lets anything be emitted). Returns whether the session was resumed.
    pub(super) async fn resume_session(
        &mut self,
        cancel: &CancellationToken,
    ) -> std::result::Result<bool, Halt> {
        let Some(zk) = &self.zk else { return Ok(false) };
        self.lease.end();
        let credentials = zk.session.credentials();
        let resumed = tokio::select! {
            () = cancel.cancelled() => return Err(Halt::Cancelled),
            resumed = self.spec.ensemble.resume(&credentials, &self.session_options) => resumed,
        };
        match resumed {
            Ok(session) => {
                tracing::info!(group = %self.spec.group, consumer = %self.consumer_id, session = %session.id(), "the server still holds our session (restored after a ZooKeeper restart); resuming it");
                let registration = std::mem::take(&mut self.registration);
                self.adopt(session);
                // The registration node holds the bytes written when the session began.
                self.registration = registration;
                // Watches belonged to the old client: re-read everything.
                self.reconnected(cancel).await?;
                Ok(true)
            }
            Err(e) => {
                tracing::debug!(group = %self.spec.group, error = %e, "the session is gone at the server too");
                Ok(false)
            }
        }
    }
}
