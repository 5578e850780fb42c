//! Exponential backoff for what the supervisor retries on its own: relaunching a worker that
//! keeps dying (per port) and downloading code that nimbus does not deliver (per topology).
//!
//! Pure: the caller passes `now` (tokio's clock), so the schedule is table-tested.

use std::time::Duration;

use tokio::time::Instant;

/// How retries are spaced: `initial`, doubling on each consecutive failure, capped at `max`.
/// A worker that ran `reset_after` before it died starts again from `initial`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffPolicy {
    pub initial: Duration,
    pub max: Duration,
    pub reset_after: Duration,
}

impl Default for BackoffPolicy {
    /// 2 s (the old fixed relaunch period) doubling to a minute; a minute of running is healthy.
    fn default() -> Self {
        BackoffPolicy {
            initial: Duration::from_secs(2),
            max: Duration::from_secs(60),
            reset_after: Duration::from_secs(60),
        }
    }
}

impl BackoffPolicy {
    /// The wait after `failures` consecutive failures (at least one).
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.initial.saturating_mul(1 << doublings).min(self.max)
    }
}

/// The retry state of one thing (a port, a topology's code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Backoff {
    failures: u32,
    not_before: Option<Instant>,
}

impl Backoff {
    /// Records a failure at `now`; returns how long until the next attempt.
    pub fn failed(&mut self, policy: &BackoffPolicy, now: Instant) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let delay = policy.delay(self.failures);
        self.not_before = Some(now + delay);
        delay
    }

    /// Whether an attempt may be made at `now`.
    pub fn ready(&self, now: Instant) -> bool {
        self.not_before.is_none_or(|at| now >= at)
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_from_two_seconds_to_a_minute() {
        let policy = BackoffPolicy::default();
        let delays: Vec<u64> = (1..=8).map(|n| policy.delay(n).as_secs()).collect();
        assert_eq!(delays, [2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(policy.delay(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn an_attempt_waits_for_its_delay() {
        let policy = BackoffPolicy::default();
        let mut backoff = Backoff::default();
        let start = Instant::now();
        assert!(backoff.ready(start));
        assert_eq!(backoff.failed(&policy, start), Duration::from_secs(2));
        assert!(!backoff.ready(start + Duration::from_millis(1999)));
        assert!(backoff.ready(start + Duration::from_secs(2)));
        assert_eq!(backoff.failed(&policy, start + Duration::from_secs(2)), Duration::from_secs(4));
        assert_eq!(backoff.failures(), 2);
        assert!(!backoff.ready(start + Duration::from_secs(5)));
    }
}
