//! The supervisor's presence in ZooKeeper: `/storm/supervisors/<id>` (ephemeral), holding a
//! [`SupervisorInfo`].
//!
//! The node is written when it is created and again only when its content changes (the ports
//! in use; `time_secs` and `uptime_secs` are as of that write): its existence says the
//! supervisor lives, and its liveness beyond that travels in the aggregated heartbeat to nimbus
//! ([`crate::heartbeat`]), so an idle cluster writes nothing here. Every
//! `supervisor.heartbeat.frequency.secs` the actor checks (a read) that the node is still ours.
//!
//! Nimbus treats a supervisor whose node is gone as dead and moves its executors, so the node
//! must come back whenever this process lives: after a session expiry the actor opens a new
//! session and registers again. A node found under our id but held by another session is our
//! previous incarnation's (the supervisor id is stable across restarts and unique to this
//! machine), left until its session times out; it is replaced at once rather than waited out.

use std::time::Duration;

use cluster_state::coord::{self, CreateMode, Ensemble, Session, SessionOptions};
use cluster_state::paths::StormPaths;
use cluster_state::znode::{SupervisorInfo, ZnodeData};
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::workerbeats::Workerbeats;

/// Storm's `supervisor.heartbeat.frequency.secs`.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);

/// Keeps one supervisor registered; see the module docs.
#[derive(Debug)]
pub struct Registration {
    pub ensemble: Ensemble,
    pub session_options: SessionOptions,
    pub paths: StormPaths,
    /// Everything but the times, which the actor fills in.
    pub info: SupervisorInfo,
    /// Ports in use, as the process task reports them.
    pub used_ports: watch::Receiver<Vec<u16>>,
    pub heartbeat_interval: Duration,
    /// The workers' `/storm/workerbeats` nodes, written on the same session every beat
    /// ([`crate::workerbeats`]); `None`: the workers write their own.
    pub workerbeats: Option<Workerbeats>,
}

/// The node's content for "did it change": everything but the times.
fn content(info: &SupervisorInfo) -> SupervisorInfo {
    SupervisorInfo { time_secs: 0, uptime_secs: 0, ..info.clone() }
}

impl Registration {
    /// Registers and keeps the registration fresh until `cancel`; then closes the session, so
    /// the node goes at once (nimbus reschedules without waiting for a timeout).
    pub async fn run(mut self, cancel: CancellationToken) {
        let started = Instant::now();
        let mut retry = Duration::from_millis(100);
        while !cancel.is_cancelled() {
            let session = tokio::select! {
                () = cancel.cancelled() => return,
                connected = self.ensemble.connect(&self.session_options) => connected,
            };
            let session = match session {
                Ok(session) => session,
                Err(e) => {
                    tracing::warn!(error = %e, "supervisor cannot reach ZooKeeper; retrying in {retry:?}");
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(retry) => {}
                    }
                    retry = (retry * 2).min(self.heartbeat_interval.max(Duration::from_secs(1)));
                    continue;
                }
            };
            retry = Duration::from_millis(100);
            self.serve(&session, started, &cancel).await;
            if cancel.is_cancelled() {
                // Bounded: the supervisor must stop even while ZooKeeper is down.
                session.close_within(coord::SHUTDOWN_CLOSE_BOUND).await;
                return;
            }
            tracing::warn!(session = %session.id(), "supervisor session ended; registering again");
        }
    }

    /// Heartbeats on one session until it ends or `cancel`.
    async fn serve(&mut self, session: &Session, started: Instant, cancel: &CancellationToken) {
        let mut states = session.state_changes();
        let mut tick = tokio::time::interval(self.heartbeat_interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // The first beat happens below at once; the next one a full interval later.
        tick.reset();
        let mut ports_open = true;
        // What this session last wrote (content only): equal content is not written again.
        let mut written: Option<SupervisorInfo> = None;
        // The instant of the tick that woke this beat (evenly spaced), for the workerbeats' Z.
        let mut at = Instant::now();
        loop {
            if session.state().is_terminal() {
                return;
            }
            if let Err(e) = self.beat(session, started, &mut written).await {
                if e.is_session_lost() {
                    return;
                }
                tracing::warn!(error = %e, "supervisor heartbeat failed; retrying next tick");
            }
            if let Some(workerbeats) = &mut self.workerbeats
                && let Err(e) = workerbeats.round(session, at).await
            {
                if e.is_session_lost() {
                    return;
                }
                tracing::warn!(error = %e, "cannot write the workers' workerbeat nodes; retrying next tick");
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                ticked = tick.tick() => at = ticked,
                // Ports changed: tell nimbus now rather than at the next tick.
                changed = self.used_ports.changed(), if ports_open => {
                    ports_open = changed.is_ok();
                    at = Instant::now();
                }
                event = states.next() => match event {
                    Some(event) if event.state.is_terminal() => return,
                    Some(_) => {}
                    None => return,
                },
            }
        }
    }

    /// Makes sure our node exists with the current content: (re)creates it, or updates it when
    /// its content changed since this session wrote it; otherwise writes nothing.
    async fn beat(
        &self,
        session: &Session,
        started: Instant,
        written: &mut Option<SupervisorInfo>,
    ) -> coord::Result<()> {
        let path = self.paths.supervisor(&self.info.supervisor_id);
        let info = SupervisorInfo {
            time_secs: cluster_state::clock::now_secs(),
            uptime_secs: started.elapsed().as_secs(),
            used_ports: self.used_ports.borrow().clone(),
            ..self.info.clone()
        };
        let data = info.encode();
        match session.exists(&path).await? {
            Some(stat) if stat.ephemeral_owner == Some(session.id()) => {
                if written.as_ref() != Some(&content(&info)) {
                    session.set(&path, &data, None).await?;
                    *written = Some(content(&info));
                }
                return Ok(());
            }
            Some(stat) => {
                tracing::info!(%path, owner = ?stat.ephemeral_owner, "replacing the registration of a previous session");
                match session.delete(&path, Some(stat.version)).await {
                    Ok(()) | Err(coord::Error::NoNode { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            None => {}
        }
        match session.create(&path, &data, CreateMode::Ephemeral.with_parents()).await {
            Ok(_) => {
                *written = Some(content(&info));
                Ok(())
            }
            // Someone raced us; the next beat sorts it out.
            Err(coord::Error::NodeExists { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
