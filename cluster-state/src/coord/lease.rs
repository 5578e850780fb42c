//! The clock that ownership leases are measured with, and a session's confirmations.
//!
//! A session's owner may act on what the session holds (owner nodes, say) only while the
//! server has recently confirmed the session: the server expires a session a full session
//! timeout after it last heard from the client, so an owner that stops acting well before that
//! never overlaps with the next one, whatever stalled it. A paused process (SIGSTOP, a long GC
//! stall, a frozen cgroup or VM, a laptop asleep) cannot notice a disconnect in time, so the
//! rule is checked against a clock, not against events:
//!
//! - [`LeaseInstant`] keeps running through all of these: tokio's monotonic clock (which tests
//!   can pause and advance) plus the time the machine spent suspended (`CLOCK_BOOTTIME` minus
//!   `CLOCK_MONOTONIC` on Linux), which the monotonic clock does not count.
//! - [`Confirmations`] records, per session, when the latest request the server answered was
//!   *sent*: the server heard from the session no earlier than that, so it cannot expire it
//!   before that instant plus the session timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

/// A point on the lease clock. Comparable only within one process (and, in tests, one paused
/// tokio runtime).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseInstant(tokio::time::Instant);

impl LeaseInstant {
    /// Now. One monotonic clock read, plus two for the suspended time on Linux.
    pub fn now() -> Self {
        LeaseInstant(tokio::time::Instant::now() + suspended())
    }

    /// How long after `earlier` this is; zero if it is earlier.
    pub fn saturating_duration_since(self, earlier: LeaseInstant) -> Duration {
        self.0.saturating_duration_since(earlier.0)
    }

    /// This instant plus `d`, if representable.
    pub fn checked_add(self, d: Duration) -> Option<LeaseInstant> {
        self.0.checked_add(d).map(LeaseInstant)
    }
}

/// Time the machine spent suspended since this process first asked. Never decreases: the two
/// clocks are read one after the other, so each reading is off by the (varying) time between the
/// reads; the largest reading so far is kept, which never exceeds the true suspended time by more
/// than one such gap (microseconds, against leases of seconds).
fn suspended() -> Duration {
    static AT_START: OnceLock<Duration> = OnceLock::new();
    static LARGEST_NANOS: AtomicU64 = AtomicU64::new(0);
    let now = suspended_since_boot();
    let since_start = now.saturating_sub(*AT_START.get_or_init(|| now));
    let nanos = u64::try_from(since_start.as_nanos()).unwrap_or(u64::MAX);
    let largest = LARGEST_NANOS.fetch_max(nanos, Ordering::Relaxed).max(nanos);
    Duration::from_nanos(largest)
}

/// `CLOCK_BOOTTIME` minus `CLOCK_MONOTONIC`, read monotonic last so the gap between the reads
/// makes the result smaller, never larger.
#[cfg(target_os = "linux")]
fn suspended_since_boot() -> Duration {
    use rustix::time::{ClockId, clock_gettime};
    let as_duration = |t: rustix::time::Timespec| {
        Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), u32::try_from(t.tv_nsec).unwrap_or(0))
    };
    let boottime = as_duration(clock_gettime(ClockId::Boottime));
    let monotonic = as_duration(clock_gettime(ClockId::Monotonic));
    boottime.saturating_sub(monotonic)
}

#[cfg(not(target_os = "linux"))]
fn suspended_since_boot() -> Duration {
    Duration::ZERO
}

/// When the server last confirmed a session: the send time of the latest request it answered
/// (an error the server sent, like "no node", is an answer too). Shared by the session's
/// clones of the backend; never moves back.
#[derive(Debug, Default)]
pub(crate) struct Confirmations(Mutex<Option<LeaseInstant>>);

impl Confirmations {
    /// A session the server confirmed by establishing it, for a request sent at `sent`.
    pub(crate) fn established(sent: LeaseInstant) -> Self {
        Confirmations(Mutex::new(Some(sent)))
    }

    /// The server answered a request sent at `sent`.
    pub(crate) fn confirm(&self, sent: LeaseInstant) {
        let mut last = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_none_or(|last| last < sent) {
            *last = Some(sent);
        }
    }

    pub(crate) fn last(&self) -> Option<LeaseInstant> {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_lease_clock_follows_paused_tokio_time() {
        let start = LeaseInstant::now();
        tokio::time::advance(Duration::from_secs(7)).await;
        let later = LeaseInstant::now();
        // The suspended part is zero unless the machine slept during the test.
        assert!(later.saturating_duration_since(start) >= Duration::from_secs(7));
        assert_eq!(start.saturating_duration_since(later), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn confirmations_never_move_back() {
        let t0 = LeaseInstant::now();
        let confirmations = Confirmations::established(t0);
        let t1 = t0.checked_add(Duration::from_secs(1)).unwrap();
        confirmations.confirm(t1);
        confirmations.confirm(t0); // a slow reply to an older request
        assert_eq!(confirmations.last(), Some(t1));
    }
}
