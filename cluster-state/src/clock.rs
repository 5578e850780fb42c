//! This machine's wall clock as time since the Unix epoch: what znodes, heartbeats and offsets
//! snapshots record (`time_secs`, `created_ms`, ...). A clock set before 1970 reads as 0 rather
//! than failing: a timestamp is information, never a reason to stop.
//!
//! Timeouts and deadlines within a process use `tokio::time` instead (monotonic, and paused in
//! tests); only values other processes read are epoch times.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Time since the Unix epoch (zero when the clock reads earlier).
pub fn since_epoch() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
}

/// Whole seconds since the Unix epoch.
pub fn now_secs() -> u64 {
    since_epoch().as_secs()
}

/// Whole milliseconds since the Unix epoch (saturating; `u64` milliseconds last 584 million years).
pub fn now_millis() -> u64 {
    u64::try_from(since_epoch().as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_and_millis_agree_and_are_after_2023() {
        let (secs, millis) = (now_secs(), now_millis());
        assert!(secs > 1_700_000_000, "{secs}");
        assert!(millis / 1000 >= secs && millis / 1000 - secs <= 1, "{secs} {millis}");
    }
}
