//! Which executors are alive, judged from their heartbeats as Storm's nimbus does.
//!
//! A heartbeat carries the *worker's* clock, which nimbus must not compare with its own. So,
//! like Storm's `update-executor-cache`, nimbus remembers for each executor the last reported
//! heartbeat time and the nimbus time at which that report last *changed*; an executor is timed
//! out when its report has not changed for `nimbus.task.timeout.secs` of nimbus time. An
//! executor started less than `nimbus.task.launch.secs` ago counts as alive whatever its
//! heartbeat says, so a slow-starting worker is not rescheduled before it could beat.
//!
//! Pure: the caller feeds it what it read and the current time, and asks.

use std::collections::BTreeMap;

use cluster_state::ids::ExecutorId;

/// The two timeouts, in seconds (Storm's defaults: 30 and 120).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// `nimbus.task.timeout.secs`.
    pub task_timeout_secs: u64,
    /// `nimbus.task.launch.secs`.
    pub task_launch_secs: u64,
}

impl Default for Timeouts {
    /// Storm's defaults.yaml: `nimbus.task.timeout.secs: 30`, `nimbus.task.launch.secs: 120`.
    fn default() -> Self {
        Timeouts { task_timeout_secs: 30, task_launch_secs: 120 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    /// The heartbeat time the worker last reported (its clock).
    reported_secs: u64,
    /// Nimbus time when that report last changed.
    changed_at_secs: u64,
}

/// Nimbus's memory of heartbeats: of one topology's executors, or (with `K` =
/// `SupervisorId`) of the supervisors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatCache<K = ExecutorId> {
    seen: BTreeMap<K, Seen>,
}

impl<K> Default for HeartbeatCache<K> {
    fn default() -> Self {
        HeartbeatCache { seen: BTreeMap::new() }
    }
}

impl<K: Ord + Clone> HeartbeatCache<K> {
    /// Records what the heartbeats say now: `reported` maps each executor that has a heartbeat to
    /// the time in it. Executors without a heartbeat keep their last report (so they time out).
    pub fn observe(&mut self, reported: &BTreeMap<K, u64>, now_secs: u64) {
        for (executor, &reported_secs) in reported {
            match self.seen.get_mut(executor) {
                Some(seen) if seen.reported_secs == reported_secs => {}
                Some(seen) => *seen = Seen { reported_secs, changed_at_secs: now_secs },
                None => {
                    self.seen.insert(executor.clone(), Seen { reported_secs, changed_at_secs: now_secs });
                }
            }
        }
    }

    /// Forgets executors no longer assigned (after a reschedule or a rebalance).
    pub fn retain(&mut self, keep: impl Fn(&K) -> bool) {
        self.seen.retain(|executor, _| keep(executor));
    }

    /// Whether `executor`, assigned at `start_secs` (nimbus time), is alive at `now_secs`.
    pub fn is_alive(&self, executor: &K, start_secs: u64, now_secs: u64, timeouts: Timeouts) -> bool {
        if now_secs.saturating_sub(start_secs) < timeouts.task_launch_secs {
            return true;
        }
        self.seen
            .get(executor)
            .is_some_and(|seen| now_secs.saturating_sub(seen.changed_at_secs) < timeouts.task_timeout_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cluster_state::ids::TaskId;

    const T: Timeouts = Timeouts { task_timeout_secs: 30, task_launch_secs: 120 };

    fn ex(task: u32) -> ExecutorId {
        ExecutorId::single(TaskId(task))
    }

    fn beats(list: &[(u32, u64)]) -> BTreeMap<ExecutorId, u64> {
        list.iter().map(|&(task, time)| (ex(task), time)).collect()
    }

    #[test]
    fn a_launching_executor_is_alive_without_heartbeats() {
        let cache = HeartbeatCache::default();
        assert!(cache.is_alive(&ex(1), 1000, 1000 + 119, T));
        assert!(!cache.is_alive(&ex(1), 1000, 1000 + 120, T));
    }

    #[test]
    fn heartbeats_that_stop_changing_time_out_on_nimbus_time() {
        let mut cache = HeartbeatCache::default();
        // The worker's clock is far off nimbus's: only changes matter.
        cache.observe(&beats(&[(1, 5), (2, 5)]), 1000);
        cache.observe(&beats(&[(1, 9), (2, 5)]), 1010);
        cache.observe(&beats(&[(1, 14), (2, 5)]), 1035);
        let start = 0;
        assert!(cache.is_alive(&ex(1), start, 1035, T));
        assert!(cache.is_alive(&ex(2), start, 1029, T), "unchanged for 29 s");
        assert!(!cache.is_alive(&ex(2), start, 1030, T), "unchanged for 30 s");
        assert!(!cache.is_alive(&ex(3), start, 1035, T), "never beat, launched long ago");
    }

    #[test]
    fn a_missing_heartbeat_keeps_the_last_report_and_times_out() {
        let mut cache = HeartbeatCache::default();
        cache.observe(&beats(&[(1, 5)]), 1000);
        cache.observe(&beats(&[]), 1020);
        assert!(cache.is_alive(&ex(1), 0, 1029, T));
        assert!(!cache.is_alive(&ex(1), 0, 1031, T));
        // It comes back: alive again from the moment the report changes.
        cache.observe(&beats(&[(1, 6)]), 1040);
        assert!(cache.is_alive(&ex(1), 0, 1040, T));
    }

    #[test]
    fn forgotten_executors_start_over() {
        let mut cache = HeartbeatCache::default();
        cache.observe(&beats(&[(1, 5), (2, 5)]), 1000);
        cache.retain(|e| *e == ex(1));
        assert!(!cache.is_alive(&ex(2), 0, 1001, T));
        assert!(cache.is_alive(&ex(1), 0, 1001, T));
    }
}
