//! Burrow's evaluator as pure functions: a partition's status from its window of commits and
//! of log-end offsets, and a group's status from its partitions'.
//!
//! The rules, checked in Burrow's order (`core/internal/evaluator/caching.go`), and only while
//! the current lag is above `allowed-lag` (otherwise the partition is OK):
//! 1. STOP: the time since the last commit is longer than the window spans (first to last
//!    commit), unless one of the recent log-end offsets was at or below the last commit (the
//!    consumer was caught up a moment ago).
//! 2. REWIND: a commit went below the one before it and no later commit came back to where it
//!    was (a short rewind the consumer already recovered from is not held against it).
//! 3. Only if every commit in the window had a lag above `allowed-lag` (a commit with an unknown
//!    lag does not count):
//!    STALL when the offset never changed, WARN when the lag never decreased.
//! 4. Otherwise OK.
//!
//! A partition whose window is less than `minimum-complete` full is OK (too little evidence).
//! The group's status is its worst partition's, where STOP, STALL and REWIND count as ERR
//! (Burrow's `evaluateConsumerStatus`); [`worst`] keeps the partition status for Squall's own
//! gauge. Status codes are Burrow's (`protocol.StatusConstant`), so dashboards built for
//! Burrow's `/metrics` read Squall's unchanged.
//!
//! Deliberate differences (ARCHITECTURE.md): time is in milliseconds (Burrow truncates `now`
//! to seconds), and a partition whose offsets cannot be read (broker down, garbage znode) is
//! ERR, a status Burrow gives only to groups.

/// Burrow's statuses with Burrow's numeric codes, ordered from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Status {
    NotFound = 0,
    Ok = 1,
    Warn = 2,
    Err = 3,
    Stop = 4,
    Stall = 5,
    Rewind = 6,
}

impl Status {
    /// Every status, in code order.
    pub const ALL: [Status; 7] = [
        Status::NotFound,
        Status::Ok,
        Status::Warn,
        Status::Err,
        Status::Stop,
        Status::Stall,
        Status::Rewind,
    ];

    /// Burrow's numeric code (`burrow_kafka_*_status`, `squall_group_lag_status`).
    pub fn code(self) -> i64 {
        self as i64
    }

    /// Burrow's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::NotFound => "NOTFOUND",
            Status::Ok => "OK",
            Status::Warn => "WARN",
            Status::Err => "ERR",
            Status::Stop => "STOP",
            Status::Stall => "STALL",
            Status::Rewind => "REWIND",
        }
    }
}

/// One committed offset as the window keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    pub offset: i64,
    /// Orders commits (the offset znode's `mzxid`): a commit is new when its order is.
    pub order: i64,
    /// When it was committed (the znode's `mtime`), in ms since the epoch.
    pub timestamp_ms: i64,
    /// Log end minus `offset` when it was seen (0 if the broker looked behind); `None` when no
    /// log end was known then.
    pub lag: Option<u64>,
}

/// Burrow's evaluator settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rules {
    /// Burrow's `allowed-lag`: a lag at or below this counts as caught up (default 0).
    pub allowed_lag: u64,
    /// Burrow's `minimum-complete`: the fraction of the window that must hold commits before a
    /// partition can be anything but OK (default 0: judged from the first commit).
    pub minimum_complete: f32,
}

impl Default for Rules {
    fn default() -> Self {
        // Burrow's defaults: `allowed-lag` 0, `minimum-complete` 0 (unset).
        Rules { allowed_lag: 0, minimum_complete: 0.0 }
    }
}

/// A partition's verdict.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PartitionVerdict {
    pub status: Status,
    /// How full the window is, 0.0 to 1.0 (Burrow's `complete`).
    pub complete: f32,
    /// Log end minus the last commit (0 if that is negative or nothing is known).
    pub current_lag: u64,
}

/// Judges one partition: `commits` oldest first (at most `intervals` of them), `broker_offsets`
/// the recent log-end offsets oldest first (the last one is the current log end).
pub fn evaluate_partition(
    commits: &[Commit],
    intervals: usize,
    broker_offsets: &[i64],
    now_ms: i64,
    rules: Rules,
) -> PartitionVerdict {
    let current_lag = match (commits.last(), broker_offsets.last()) {
        (Some(c), Some(&end)) => u64::try_from(end - c.offset).unwrap_or(0),
        _ => 0,
    };
    if commits.is_empty() {
        return PartitionVerdict { status: Status::Ok, complete: 0.0, current_lag };
    }
    let complete = (commits.len() as f32 / intervals.max(1) as f32).min(1.0);
    let status = if complete >= rules.minimum_complete {
        partition_status(commits, broker_offsets, current_lag, now_ms, rules.allowed_lag)
    } else {
        Status::Ok
    };
    PartitionVerdict { status, complete, current_lag }
}

/// Burrow's rules over a non-empty window (see the module docs).
pub fn partition_status(
    commits: &[Commit],
    broker_offsets: &[i64],
    current_lag: u64,
    now_ms: i64,
    allowed_lag: u64,
) -> Status {
    let (Some(first), Some(last)) = (commits.first(), commits.last()) else {
        return Status::Ok;
    };
    if current_lag <= allowed_lag {
        return Status::Ok;
    }
    let stopped = now_ms - last.timestamp_ms > last.timestamp_ms - first.timestamp_ms;
    let recently_caught_up = broker_offsets.iter().any(|&end| end <= last.offset);
    if stopped && !recently_caught_up {
        return Status::Stop;
    }
    if let Some(i) = (1..commits.len()).find(|&i| commits[i].offset < commits[i - 1].offset) {
        let before = commits[i - 1].offset;
        if !commits[i..].iter().any(|c| c.offset >= before) {
            return Status::Rewind;
        }
    }
    let always_lagging = commits.iter().all(|c| c.lag.is_none_or(|lag| lag > allowed_lag));
    if always_lagging {
        if commits.iter().all(|c| c.offset == first.offset) {
            return Status::Stall;
        }
        let lags: Vec<u64> = commits.iter().filter_map(|c| c.lag).collect();
        if lags.windows(2).all(|w| w[1] >= w[0]) {
            return Status::Warn;
        }
    }
    Status::Ok
}

/// Burrow's group status: the worst partition's, with STOP, STALL and REWIND reported as ERR;
/// OK for a group without partitions.
pub fn group_status(partitions: impl IntoIterator<Item = Status>) -> Status {
    worst(partitions).min(Status::Err)
}

/// The worst status (Squall's group gauge keeps STOP, STALL and REWIND); OK when empty.
pub fn worst(partitions: impl IntoIterator<Item = Status>) -> Status {
    partitions.into_iter().fold(Status::Ok, Status::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (offset, timestamp in ms, lag) of each commit; `order` is its index.
    type Commits<'a> = &'a [(i64, i64, Option<u64>)];

    struct Case<'a> {
        name: &'a str,
        commits: Commits<'a>,
        broker_offsets: &'a [i64],
        current_lag: u64,
        /// Seconds, as in Burrow's table.
        now_secs: i64,
        allowed_lag: u64,
        expected: Status,
    }

    fn commits(raw: Commits<'_>) -> Vec<Commit> {
        raw.iter()
            .enumerate()
            .map(|(i, &(offset, timestamp_ms, lag))| Commit { offset, order: i as i64, timestamp_ms, lag })
            .collect()
    }

    /// Five commits 100 s apart from t = 100 s, at `offsets` with `lags`.
    fn five(offsets: [i64; 5], lags: [u64; 5]) -> Vec<(i64, i64, Option<u64>)> {
        (0..5).map(|i| (offsets[i], 100_000 * (i as i64 + 1), Some(lags[i]))).collect()
    }

    /// Burrow's `TestCachingEvaluator_CheckRules` table (`caching_test.go`), case by case, named
    /// after its index and comment.
    #[test]
    fn burrows_check_rules_table() {
        let rising = five([1000, 2000, 3000, 4000, 5000], [0, 50, 100, 150, 200]);
        let rising_lagging = five([1000, 2000, 3000, 4000, 5000], [50, 100, 150, 200, 250]);
        let stuck_zero_first = five([1000; 5], [0, 50, 100, 150, 200]);
        let stuck = five([1000; 5], [100, 150, 200, 250, 300]);
        let stuck_flat = five([1000; 5], [100; 5]);
        let rewound_recovered = five([1000, 2000, 3000, 2000, 4000], [100, 150, 200, 1250, 300]);
        let rewound = five([1000, 2000, 3000, 2000, 2500], [100, 150, 200, 1250, 300]);
        // Cases 9 and 10: fifteen commits a second apart, all with zero lag.
        let caught_up: Vec<_> = [
            1512224618356,
            1512224619362,
            1512224620366,
            1512224621367,
            1512224622370,
            1512224623373,
            1512224624378,
            1512224625379,
            1512224626383,
            1512224627383,
            1512224628383,
            1512224629388,
            1512224630391,
            1512224631394,
            1512224632397,
        ]
        .iter()
        .enumerate()
        .map(|(i, &t)| (792748079 + i as i64, t, Some(0)))
        .collect();
        let nil_lags: Vec<_> = (0..10)
            .map(|i| {
                let lag = (i % 2 == 0).then_some(50 * (i as u64 / 2));
                (1000 + 500 * i as i64, 100_000 + 50_000 * i as i64, lag)
            })
            .collect();
        let allowed = [(1000, 100_000, Some(2)), (2000, 200_000, Some(1)), (2000, 300_000, Some(1))];
        let cases = [
            Case {
                name: "0 zero lag somewhere: OK",
                commits: &rising,
                broker_offsets: &[5200],
                current_lag: 200,
                now_secs: 600,
                allowed_lag: 0,
                expected: Status::Ok,
            },
            Case {
                name: "1 time since last commit equals the window: not STOP",
                commits: &rising,
                broker_offsets: &[5200],
                current_lag: 200,
                now_secs: 900,
                allowed_lag: 0,
                expected: Status::Ok,
            },
            Case {
                name: "2 STOP even with zero lag at the start (#290)",
                commits: &rising,
                broker_offsets: &[5200],
                current_lag: 200,
                now_secs: 1000,
                allowed_lag: 0,
                expected: Status::Stop,
            },
            Case {
                name: "3 STOP with lag always non-zero",
                commits: &rising_lagging,
                broker_offsets: &[5250],
                current_lag: 250,
                now_secs: 1000,
                allowed_lag: 0,
                expected: Status::Stop,
            },
            Case {
                name: "4 offset never moves but zero lag once: OK",
                commits: &stuck_zero_first,
                broker_offsets: &[1200],
                current_lag: 200,
                now_secs: 600,
                allowed_lag: 0,
                expected: Status::Ok,
            },
            Case {
                name: "5 STALL: offset never moves, lag always non-zero",
                commits: &stuck,
                broker_offsets: &[1300],
                current_lag: 300,
                now_secs: 600,
                allowed_lag: 0,
                expected: Status::Stall,
            },
            Case {
                name: "6 STALL even when the lag stays the same",
                commits: &stuck_flat,
                broker_offsets: &[1100],
                current_lag: 100,
                now_secs: 600,
                allowed_lag: 0,
                expected: Status::Stall,
            },
            Case {
                name: "7 rewind caught up within the window: OK",
                commits: &rewound_recovered,
                broker_offsets: &[4300],
                current_lag: 300,
                now_secs: 600,
                allowed_lag: 0,
                expected: Status::Ok,
            },
            Case {
                name: "8 current lag zero: OK although stopped by timestamps",
                commits: &rising_lagging,
                broker_offsets: &[5250],
                current_lag: 0,
                now_secs: 1000,
                allowed_lag: 0,
                expected: Status::Ok,
            },
            Case {
                name: "9 STOP: current lag non-zero although the window's lags are zero (#290)",
                commits: &caught_up,
                broker_offsets: &[792749024, 792749000, 792748800, 792748600, 792748500],
                current_lag: 931,
                now_secs: 1512224650,
                allowed_lag: 0,
                expected: Status::Stop,
            },
            Case {
                name: "10 OK: recent log ends show zero lag (#303)",
                commits: &caught_up,
                broker_offsets: &[792748094, 792748093, 792748093, 792748093],
                current_lag: 1,
                now_secs: 1512224650,
                allowed_lag: 0,
                expected: Status::Ok,
            },
            Case {
                name: "11 case 0 with unknown lags in between: OK",
                commits: &nil_lags,
                broker_offsets: &[5700],
                current_lag: 200,
                now_secs: 600,
                allowed_lag: 0,
                expected: Status::Ok,
            },
            Case {
                name: "12 OK: current lag within allowed-lag although stopped",
                commits: &allowed,
                broker_offsets: &[2001],
                current_lag: 1,
                now_secs: 550,
                allowed_lag: 1,
                expected: Status::Ok,
            },
            Case {
                name: "13 case 5 with allowed-lag: STALL",
                commits: &stuck,
                broker_offsets: &[1300],
                current_lag: 300,
                now_secs: 600,
                allowed_lag: 99,
                expected: Status::Stall,
            },
            Case {
                name: "14 case 7 with allowed-lag: OK",
                commits: &rewound_recovered,
                broker_offsets: &[4300],
                current_lag: 300,
                now_secs: 600,
                allowed_lag: 99,
                expected: Status::Ok,
            },
            Case {
                name: "15 REWIND not caught up to the previous point",
                commits: &rewound,
                broker_offsets: &[4300],
                current_lag: 300,
                now_secs: 600,
                allowed_lag: 0,
                expected: Status::Rewind,
            },
        ];
        for case in cases {
            let status = partition_status(
                &commits(case.commits),
                case.broker_offsets,
                case.current_lag,
                case.now_secs * 1000,
                case.allowed_lag,
            );
            assert_eq!(status, case.expected, "TEST {}", case.name);
        }
    }

    /// Burrow's `TestCachingEvaluator_SingleRequest_Incomplete`: a partition with half a window
    /// is STOP at partition level and its group ERR; and `minimum-complete` above that keeps it
    /// OK.
    #[test]
    fn incomplete_window_and_group_status() {
        let window = commits(&[(1000, 100_000, Some(100)), (1400, 200_000, Some(200))]);
        let verdict = evaluate_partition(&window, 4, &[1600], 1_000_000, Rules::default());
        assert_eq!((verdict.status, verdict.complete, verdict.current_lag), (Status::Stop, 0.5, 200));
        assert_eq!(group_status([Status::Ok, verdict.status]), Status::Err);
        assert_eq!(worst([Status::Ok, verdict.status]), Status::Stop);
        let strict = Rules { minimum_complete: 0.75, ..Rules::default() };
        assert_eq!(evaluate_partition(&window, 4, &[1600], 1_000_000, strict).status, Status::Ok);
    }

    #[test]
    fn group_status_is_the_worst_capped_at_err() {
        assert_eq!(group_status([]), Status::Ok);
        assert_eq!(group_status([Status::Ok, Status::Warn]), Status::Warn);
        assert_eq!(group_status([Status::Warn, Status::Rewind]), Status::Err);
        assert_eq!(worst([Status::Stall, Status::Rewind, Status::Err]), Status::Rewind);
        let codes: Vec<i64> = Status::ALL.iter().map(|s| s.code()).collect();
        assert_eq!(codes, [0, 1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn no_commits_is_ok_with_no_lag() {
        let verdict = evaluate_partition(&[], 10, &[50], 0, Rules::default());
        assert_eq!((verdict.status, verdict.complete, verdict.current_lag), (Status::Ok, 0.0, 0));
    }
}
