//! Burrow-style consumer lag status: each partition's committed offsets and lags over a
//! sliding window of commits, judged with Burrow's rules, so a dashboard can tell a consumer
//! that is keeping up from one that is falling behind, stalled, stopped or rewound.
//!
//! Burrow's rules, in its order, applied only while the lag never reached zero in the window
//! (a zero lag anywhere in the window means the consumer caught up: OK):
//! 1. REWIND: an offset in the window is lower than the one before it.
//! 2. STOP: the time since the last commit is longer than the window spans (first to last
//!    commit): the consumer stopped committing.
//! 3. STALL: the offset never moved over the window (commits continue, progress does not).
//! 4. WARN: the lag never decreased over the window (the consumer falls behind).
//! 5. Otherwise OK.
//!
//! Pure: the caller pushes commits and asks with its clock.

use std::collections::VecDeque;

/// Burrow's partition statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LagStatus {
    Ok,
    Warn,
    Stop,
    Stall,
    Rewind,
}

impl LagStatus {
    /// The value of the `squall_spout_lag_status` gauge.
    pub fn code(self) -> i64 {
        match self {
            LagStatus::Ok => 0,
            LagStatus::Warn => 1,
            LagStatus::Stop => 2,
            LagStatus::Stall => 3,
            LagStatus::Rewind => 4,
        }
    }

    /// Burrow's name.
    pub fn as_str(self) -> &'static str {
        match self {
            LagStatus::Ok => "OK",
            LagStatus::Warn => "WARN",
            LagStatus::Stop => "STOP",
            LagStatus::Stall => "STALL",
            LagStatus::Rewind => "REWIND",
        }
    }
}

/// One commit as the window keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    pub offset: i64,
    /// Log-end offset minus `offset` when it was committed.
    pub lag: i64,
    pub at_ms: u64,
}

/// The last `capacity` commits of one partition (Burrow's `intervals`, default 10).
#[derive(Debug, Clone)]
pub struct LagWindow {
    capacity: usize,
    commits: VecDeque<Commit>,
}

impl Default for LagWindow {
    fn default() -> Self {
        LagWindow::new(10)
    }
}

impl LagWindow {
    pub fn new(capacity: usize) -> Self {
        LagWindow { capacity: capacity.max(2), commits: VecDeque::new() }
    }

    /// Records a commit (the oldest one leaves a full window).
    pub fn push(&mut self, commit: Commit) {
        if self.commits.len() == self.capacity {
            self.commits.pop_front();
        }
        self.commits.push_back(commit);
    }

    /// The status at `now_ms`; see the module docs. Fewer than two commits: OK (no evidence).
    pub fn status(&self, now_ms: u64) -> LagStatus {
        let (Some(first), Some(last)) = (self.commits.front(), self.commits.back()) else {
            return LagStatus::Ok;
        };
        if self.commits.len() < 2 || self.commits.iter().any(|c| c.lag <= 0) {
            return LagStatus::Ok;
        }
        let pairs = || self.commits.iter().zip(self.commits.iter().skip(1));
        if pairs().any(|(a, b)| b.offset < a.offset) {
            return LagStatus::Rewind;
        }
        if now_ms.saturating_sub(last.at_ms) > last.at_ms.saturating_sub(first.at_ms) {
            return LagStatus::Stop;
        }
        if first.offset == last.offset {
            return LagStatus::Stall;
        }
        if pairs().all(|(a, b)| b.lag >= a.lag) {
            return LagStatus::Warn;
        }
        LagStatus::Ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(commits: &[(i64, i64, u64)]) -> LagWindow {
        let mut w = LagWindow::new(5);
        for &(offset, lag, at_ms) in commits {
            w.push(Commit { offset, lag, at_ms });
        }
        w
    }

    /// (offset, lag, commit time in ms) of each commit.
    type Commits<'a> = &'a [(i64, i64, u64)];

    #[test]
    fn burrows_rules_table() {
        let cases: &[(&str, Commits<'_>, u64, LagStatus)] = &[
            ("no commits", &[], 0, LagStatus::Ok),
            ("one commit", &[(10, 5, 0)], 100, LagStatus::Ok),
            ("keeping up, lag shrinking", &[(10, 50, 0), (30, 40, 10), (60, 20, 20)], 25, LagStatus::Ok),
            ("caught up once in the window", &[(10, 0, 0), (10, 5, 10), (12, 9, 20)], 25, LagStatus::Ok),
            ("falling behind", &[(10, 5, 0), (20, 8, 10), (30, 8, 20), (40, 12, 30)], 35, LagStatus::Warn),
            (
                "stalled: commits but no progress",
                &[(10, 5, 0), (10, 7, 10), (10, 9, 20)],
                25,
                LagStatus::Stall,
            ),
            ("stopped committing", &[(10, 5, 0), (20, 3, 10), (30, 2, 20)], 100, LagStatus::Stop),
            ("rewound", &[(10, 5, 0), (30, 5, 10), (5, 40, 20)], 25, LagStatus::Rewind),
            ("rewind wins over stop", &[(10, 5, 0), (5, 40, 10)], 1000, LagStatus::Rewind),
        ];
        for (name, commits, now, expected) in cases {
            assert_eq!(window(commits).status(*now), *expected, "{name}");
        }
    }

    #[test]
    fn the_window_slides() {
        let mut w = LagWindow::new(3);
        // Behind at first, then catching up: the old commits leave the window.
        for (i, lag) in [5, 6, 7, 8, 3, 2].into_iter().enumerate() {
            w.push(Commit { offset: 10 * i as i64, lag, at_ms: 10 * i as u64 });
        }
        assert_eq!(w.status(55), LagStatus::Ok);
        let codes: Vec<i64> =
            [LagStatus::Ok, LagStatus::Warn, LagStatus::Stop, LagStatus::Stall, LagStatus::Rewind]
                .iter()
                .map(|s| s.code())
                .collect();
        assert_eq!(codes, vec![0, 1, 2, 3, 4]);
    }
}
