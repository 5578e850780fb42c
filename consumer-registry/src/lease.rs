//! The ownership lease: when a member's caller may emit from the partitions the member owns.
//!
//! Owner nodes are ephemeral: the server deletes them a session timeout after it last heard
//! from the member, and another member may claim them at once. A member's process can be
//! stopped for longer than that without noticing (SIGSTOP, a GC-like stall, a frozen VM, a
//! laptop asleep), so events alone cannot fence it. The lease rule:
//!
//! > The caller emits from a partition only while the lease is fresh for the session that
//! > claimed the partition: the server answered a request of that session sent less than
//! > [`lease_bound`] (2/3 of the session timeout) ago, on [`LeaseInstant`]'s clock, which keeps
//! > running through a stop or a suspend.
//!
//! Timing argument: a request sent at `t` and answered proves the server heard from the session
//! at or after `t`, so it cannot expire the session (and free its owner nodes) before
//! `t + timeout`. The lease ends at `t + 2/3 timeout`, leaving a third of the timeout for clock
//! rate differences and for the caller's last batch in flight. A process that wakes up after a
//! long stop reads the clock before emitting and finds the lease over; it emits again only once
//! its [`Keeper`] re-validated ownership (each owner node still exists with the session as its
//! `ephemeralOwner`) with requests sent after the wake-up, or after the member re-claimed under
//! a new session. Requests answered late (sent before the stop) never extend the lease past
//! their send time plus the bound, which has passed.
//!
//! The caller checks the lease once per batch ([`Lease::valid_session`], one clock read and an
//! uncontended lock) and compares the session with the one each partition was claimed in. It
//! checks again after taking messages from its client's fetch queue and before emitting them: a
//! stop between the first check and the fetch would otherwise let it emit messages fetched after
//! it was continued, past the lease.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cluster_state::coord::{LeaseInstant, SessionId, SessionState};
use cluster_state::ids::GroupId;
use cluster_state::paths::KafkaPaths;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::assign::TopicPartition;
use crate::member::Ownership;
use crate::zk::Zk;

/// How long after its send time a confirmed request keeps the lease fresh: 2/3 of the session
/// timeout (Curator's "suspended" idea, measured rather than signalled).
pub fn lease_bound(session_timeout: Duration) -> Duration {
    session_timeout * 2 / 3
}

/// The lease of one member, shared with its caller. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Lease(Arc<Mutex<Grant>>);

/// What the lease says: the member's current session and until when it may be acted on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Grant {
    /// The session the member currently holds; `None` between sessions.
    pub(crate) session: Option<SessionId>,
    /// The end of the lease for `session`; `None` until first granted in that session.
    pub(crate) until: Option<LeaseInstant>,
}

impl Grant {
    /// The session whose ownership may be acted on at `now`.
    pub(crate) fn valid_at(self, now: LeaseInstant) -> Option<SessionId> {
        self.session.filter(|_| self.until.is_some_and(|until| now < until))
    }

    /// A confirmation of `session` sent at `confirmed` extends a lease that is still fresh at
    /// `now`; a lease that ran out stays out (re-validation must grant it).
    pub(crate) fn renewed(
        self,
        session: SessionId,
        confirmed: LeaseInstant,
        bound: Duration,
        now: LeaseInstant,
    ) -> Grant {
        if self.valid_at(now) != Some(session) {
            return self;
        }
        self.extended(confirmed, bound)
    }

    /// Ownership of `session` was re-validated with requests sent from `sent` on.
    pub(crate) fn revalidated(self, session: SessionId, sent: LeaseInstant, bound: Duration) -> Grant {
        if self.session != Some(session) {
            return self; // the member moved on to another session meanwhile
        }
        self.extended(sent, bound)
    }

    fn extended(self, from: LeaseInstant, bound: Duration) -> Grant {
        let until = from.checked_add(bound);
        Grant { session: self.session, until: self.until.max(until) }
    }
}

impl Lease {
    /// The session whose owned partitions may be emitted from now; `None`: emit nothing.
    pub fn valid_session(&self, now: LeaseInstant) -> Option<SessionId> {
        self.grant().valid_at(now)
    }

    /// A lease granted to `session` for `bound` from `from`, outside any member: for callers'
    /// tests that drive emission without a registry.
    pub fn granted(session: SessionId, from: LeaseInstant, bound: Duration) -> Lease {
        let lease = Lease::default();
        lease.begin(session);
        lease.revalidated(session, from, bound);
        lease
    }

    fn grant(&self) -> Grant {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, f: impl FnOnce(Grant) -> Grant) {
        let mut grant = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *grant = f(*grant);
    }

    /// The member holds a new session: nothing is granted until its keeper validates it.
    pub(crate) fn begin(&self, session: SessionId) {
        self.update(|_| Grant { session: Some(session), until: None });
    }

    /// The member's session ended (or is no longer trusted): nothing may be emitted until
    /// the member grants the lease again. Public for callers' tests that end it mid-call.
    pub fn end(&self) {
        self.update(|_| Grant::default());
    }

    fn renew(&self, session: SessionId, confirmed: LeaseInstant, bound: Duration) {
        let now = LeaseInstant::now();
        self.update(|g| g.renewed(session, confirmed, bound, now));
    }

    fn revalidated(&self, session: SessionId, sent: LeaseInstant, bound: Duration) {
        self.update(|g| g.revalidated(session, sent, bound));
    }
}

/// Keeps one session's lease fresh: a keep-alive read when nothing else confirmed the session
/// lately, and re-validation of every owned partition whenever the lease ran out (or at the
/// start of the session). Runs beside the member, so a member busy in a long rebalance (waiting
/// for a claim, or for its caller to drain) does not let its lease lapse.
#[derive(Debug)]
pub(crate) struct Keeper {
    pub(crate) zk: Zk,
    pub(crate) lease: Lease,
    pub(crate) paths: KafkaPaths,
    pub(crate) group: GroupId,
    /// What the keep-alive reads: the member's registration.
    pub(crate) id_path: String,
    pub(crate) ownership: watch::Receiver<Ownership>,
    /// Told the session when an owner node of ours turned out not to be ours any more: the
    /// member then treats the session as ended.
    pub(crate) distrust: mpsc::Sender<SessionId>,
}

impl Keeper {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let session = self.zk.session.id();
        let bound = lease_bound(self.zk.session.session_timeout());
        // Four chances per lease to confirm; the client library pings about as often.
        let period = (bound / 4).max(Duration::from_millis(10));
        let mut states = self.zk.session.state_changes();
        let mut first = true;
        loop {
            if !first {
                tokio::select! {
                    biased;
                    () = cancel.cancelled() => return,
                    event = states.next() => match event {
                        // Reconnected: re-validate (or renew) at once, not a period later.
                        Some(event) if event.state == SessionState::Connected => {}
                        Some(event) if !event.state.is_terminal() => continue,
                        _ => return,
                    },
                    () = tokio::time::sleep(period) => {}
                }
            }
            first = false;
            if self.lease.valid_session(LeaseInstant::now()) == Some(session) {
                let stale = self
                    .zk
                    .session
                    .confirmed_at()
                    .is_none_or(|at| LeaseInstant::now().saturating_duration_since(at) >= period);
                if stale {
                    // Only the answer matters: it confirms the session.
                    let _ = self.zk.exists(&self.id_path).await;
                }
                if let Some(confirmed) = self.zk.session.confirmed_at() {
                    self.lease.renew(session, confirmed, bound);
                }
            } else {
                self.revalidate(session, bound).await;
            }
        }
    }

    /// Reads every owned partition's owner node; grants the lease if all are still ours.
    async fn revalidate(&self, session: SessionId, bound: Duration) {
        let sent = LeaseInstant::now();
        let owned: Vec<TopicPartition> = {
            let ownership = self.ownership.borrow();
            if ownership.session != Some(session) {
                return; // the member has not adopted this session yet, or left it
            }
            ownership.partitions.keys().cloned().collect()
        };
        let mut not_ours = BTreeSet::new();
        for tp in owned {
            let path = self.paths.owner(&self.group, &tp.topic, tp.partition);
            match self.zk.exists(&path).await {
                Ok(Some(stat)) if stat.ephemeral_owner == Some(session) => {}
                Ok(_) => drop(not_ours.insert(tp)),
                Err(e) => {
                    tracing::debug!(group = %self.group, error = %e, "re-validating ownership; trying again");
                    return;
                }
            }
        }
        // A partition released meanwhile leaves the ownership before its node is deleted.
        not_ours.retain(|tp| self.ownership.borrow().partitions.contains_key(tp));
        if not_ours.is_empty() {
            if self.lease.valid_session(sent).is_none() {
                tracing::debug!(group = %self.group, %session, "ownership re-validated; emitting again");
            }
            self.lease.revalidated(session, sent, bound);
        } else {
            tracing::warn!(group = %self.group, %session, partitions = ?not_ours, "owner nodes are no longer held by our session although it lives; starting a new session");
            self.lease.end();
            let _ = self.distrust.send(session).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(4);

    fn at(base: LeaseInstant, ms: u64) -> LeaseInstant {
        base.checked_add(Duration::from_millis(ms)).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn the_lease_rule_in_a_table() {
        let t = LeaseInstant::now();
        let (s1, s2) = (SessionId(1), SessionId(2));
        let fresh = Grant { session: Some(s1), until: Some(at(t, 4000)) };
        let begun = Grant { session: Some(s1), until: None };
        // (grant, valid at ms) -> session
        let validity = [
            (Grant::default(), 0, None),
            (begun, 0, None),
            (fresh, 0, Some(s1)),
            (fresh, 3999, Some(s1)),
            (fresh, 4000, None),
            (fresh, 60_000, None),
        ];
        for (grant, ms, expected) in validity {
            assert_eq!(grant.valid_at(at(t, ms)), expected, "{grant:?} at {ms} ms");
        }
        // (grant, session, confirmed at, now) -> until after a renewal
        let renewals = [
            // fresh: a newer confirmation extends it
            (fresh, s1, 1000, 2000, Some(at(t, 5000))),
            // an older confirmation never shortens it
            (fresh, s1, 0, 2000, Some(at(t, 4000))),
            // ran out (a stop): even a fresh confirmation does not renew; re-validation must
            (fresh, s1, 9000, 9001, Some(at(t, 4000))),
            // another session's confirmation does nothing
            (fresh, s2, 1000, 2000, Some(at(t, 4000))),
            // never granted in this session: renewal alone is not enough
            (begun, s1, 1000, 1001, None),
        ];
        for (grant, session, confirmed, now, until) in renewals {
            let renewed = grant.renewed(session, at(t, confirmed), BOUND, at(t, now));
            assert_eq!(renewed.until, until, "{grant:?} renewed by {session} at {confirmed}/{now}");
        }
        // Re-validation grants from its send time, only in the member's current session.
        assert_eq!(begun.revalidated(s1, at(t, 9000), BOUND).until, Some(at(t, 13_000)));
        assert_eq!(begun.revalidated(s2, at(t, 9000), BOUND), begun);
        assert_eq!(Grant::default().revalidated(s1, at(t, 9000), BOUND), Grant::default());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_runs_out_when_the_clock_jumps_past_the_bound() {
        let lease = Lease::default();
        let s = SessionId(7);
        lease.begin(s);
        assert_eq!(lease.valid_session(LeaseInstant::now()), None, "not validated yet");
        let before = LeaseInstant::now();
        lease.revalidated(s, before, BOUND);
        assert_eq!(lease.valid_session(LeaseInstant::now()), Some(s));
        tokio::time::advance(BOUND).await;
        assert_eq!(lease.valid_session(LeaseInstant::now()), None, "stopped for the whole bound");
        // A reply to a request sent before the stop arrives now: no renewal.
        lease.renew(s, before, BOUND);
        assert_eq!(lease.valid_session(LeaseInstant::now()), None);
        // Nor does a confirmation sent after it: the lease ran out, ownership must be re-validated.
        lease.renew(s, LeaseInstant::now(), BOUND);
        assert_eq!(lease.valid_session(LeaseInstant::now()), None);
        lease.revalidated(s, LeaseInstant::now(), BOUND);
        assert_eq!(lease.valid_session(LeaseInstant::now()), Some(s));
        lease.end();
        assert_eq!(lease.valid_session(LeaseInstant::now()), None);
    }
}
