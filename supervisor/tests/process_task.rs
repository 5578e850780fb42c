//! The process task against real processes: it launches a worker per assigned port, relaunches
//! one that died, kills one no longer assigned, and a restarted supervisor adopts its workers
//! instead of starting them twice. A corrupt state file does not stop it, nor change its id, nor
//! orphan its workers. Killed workers are reaped; a crashing one is relaunched with backoff; an
//! unreadable heartbeat is tolerated until the heartbeat timeout.
//!
//! The worker here is a small shell loop writing the real local heartbeat format, so the test
//! exercises the supervisor alone (the real worker binary has its own tests).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cluster_state::clock::now_secs;
use cluster_state::ids::{ExecutorId, TaskId, TopologyId};
use cluster_state::launch::WorkerLaunch;
use supervisor::backoff::BackoffPolicy;
use supervisor::launch::{Launcher, ProcessLauncher, WorkerSpec};
use supervisor::plan::{LocalAssignment, WorkerTimeouts};
use supervisor::process_task::{Done, ProcessTask, SpecBuilder};
use test_harness::eventually_true;

fn assignment(tasks: &[u32]) -> LocalAssignment {
    LocalAssignment {
        topology_id: "wc-1-1700000000".parse::<TopologyId>().unwrap(),
        executors: tasks.iter().map(|&t| ExecutorId::single(TaskId(t))).collect::<BTreeSet<_>>(),
    }
}

/// What a stand-in worker does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    /// Heartbeats every 200 ms.
    Beats,
    /// Heartbeats every 200 ms and ignores SIGTERM: only the KILL after the grace stops it.
    IgnoresTerm,
    /// Heartbeats once, then only runs.
    BeatsOnce,
    /// Exits at once (a worker whose code is broken).
    Crashes,
}

/// A stand-in worker: writes `<dir>/workers/<id>/heartbeat` every 200 ms, atomically. The
/// launcher runs `sh worker <flags>` in a directory of the worker's own, where `worker` is this
/// script (so its command line is the real launch's, worker id included, for adoption).
fn fake_worker(local_dir: &Path) -> SpecBuilder {
    fake_worker_that(local_dir, Behaviour::Beats)
}

fn fake_worker_that(local_dir: &Path, behaviour: Behaviour) -> SpecBuilder {
    let local_dir = local_dir.to_path_buf();
    Arc::new(move |supervisor, worker_id, port, assignment| {
        let dir = local_dir.join("workers").join(worker_id.as_str());
        let executors: Vec<String> = assignment
            .executors
            .iter()
            .map(|e| format!("[{},{}]", e.start_task().0, e.end_task().0))
            .collect();
        let beat = format!(
            "printf '{{\"version\":1,\"time_secs\":%s,\"topology_id\":\"{topology}\",\"executors\":[{executors}],\"port\":{port}}}' \
             \"$(date +%s)\" > '{dir}/heartbeat.tmp' && mv '{dir}/heartbeat.tmp' '{dir}/heartbeat'",
            dir = dir.display(),
            topology = assignment.topology_id,
            executors = executors.join(","),
        );
        let dir = dir.display();
        let script = match behaviour {
            Behaviour::Beats => format!("mkdir -p '{dir}'; while :; do {beat}; sleep 0.2; done"),
            Behaviour::IgnoresTerm => {
                format!("trap '' TERM; mkdir -p '{dir}'; while :; do {beat}; sleep 0.2; done")
            }
            Behaviour::BeatsOnce => format!("mkdir -p '{dir}'; {beat}; while :; do sleep 1; done"),
            Behaviour::Crashes => "exit 3".to_owned(),
        };
        let program_dir = local_dir.join("programs").join(worker_id.as_str());
        std::fs::create_dir_all(&program_dir).unwrap();
        std::fs::write(program_dir.join("worker"), script).unwrap();
        let mut launch = WorkerLaunch::new(
            assignment.topology_id.clone(),
            supervisor.clone(),
            port,
            worker_id.clone(),
            local_dir.join("topology.yaml"),
        );
        launch.local_dir = local_dir.clone();
        WorkerSpec {
            program: "sh".into(),
            launch,
            env: vec![],
            dir: program_dir,
            log_path: local_dir.join(format!("{worker_id}.log")),
            run_as: None,
        }
    })
}

/// How long a worker may take to start or stop.
const DEADLINE: Duration = Duration::from_secs(10);

const TIMEOUTS: WorkerTimeouts = WorkerTimeouts { heartbeat_secs: 5, start_secs: 5 };

/// Kills every worker launched during the test when it ends, also when it fails.
struct Reaper(Arc<dyn Launcher>, std::sync::Mutex<Vec<u32>>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for pid in self.1.lock().map(|p| p.clone()).unwrap_or_default() {
            let _ = self.0.force_kill(pid);
        }
    }
}

/// Relaunches back off briefly in these tests.
const FAST_BACKOFF: BackoffPolicy = BackoffPolicy {
    initial: Duration::from_millis(100),
    max: Duration::from_millis(400),
    reset_after: Duration::from_secs(60),
};

async fn settle(
    task: &mut ProcessTask,
    desired: &BTreeMap<u16, LocalAssignment>,
    reaper: &Reaper,
) -> Vec<Done> {
    // Reconcile until a round has nothing to do and every assigned port has a worker (a
    // relaunch may be backing off), within a deadline.
    let mut all = Vec::new();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while tokio::time::Instant::now() < deadline {
        let done = task.reconcile(desired, &BTreeSet::new(), now_secs()).await.unwrap();
        if done.is_empty() && task.used_ports().into_iter().eq(desired.keys().copied()) {
            return all;
        }
        if done.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for d in &done {
            if let Done::Launched { pid, .. } = d {
                reaper.1.lock().unwrap().push(*pid);
            }
        }
        all.extend(done);
    }
    panic!("the process task never settled: {all:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launches_relaunches_kills_and_adopts() {
    let dir = tempfile::tempdir().unwrap();
    let launcher: Arc<dyn Launcher> = Arc::new(ProcessLauncher::new());
    let open = |launcher: Arc<dyn Launcher>| {
        ProcessTask::open(dir.path(), launcher, fake_worker(dir.path()), TIMEOUTS, Duration::from_secs(2))
            .unwrap()
            .with_backoff(FAST_BACKOFF)
    };
    let reaper = Reaper(launcher.clone(), Default::default());
    let mut task = open(launcher.clone());
    let id = task.supervisor_id().clone();

    // Two ports assigned: two workers.
    let desired: BTreeMap<u16, LocalAssignment> = [(6700, assignment(&[1])), (6701, assignment(&[2]))].into();
    let launched = settle(&mut task, &desired, &reaper).await;
    assert_eq!(launched.len(), 2, "{launched:?}");
    assert_eq!(task.used_ports(), [6700, 6701]);
    let first: BTreeMap<String, u32> = task.workers().iter().map(|(w, r)| (w.clone(), r.pid)).collect();
    eventually_true(DEADLINE, "both heartbeats", || async {
        first.keys().all(|w| dir.path().join("workers").join(w).join("heartbeat").exists())
    })
    .await;
    assert_eq!(settle(&mut task, &desired, &reaper).await, [], "valid workers are left alone");

    // A worker dies (kill -9): it is replaced.
    let (dead_id, dead_pid) = first.iter().next().map(|(w, p)| (w.clone(), *p)).unwrap();
    launcher.force_kill(dead_pid).unwrap();
    eventually_true(DEADLINE, "the worker to die", || async { !launcher.is_running(dead_pid) }).await;
    let replaced = settle(&mut task, &desired, &reaper).await;
    assert!(replaced.iter().any(|d| matches!(d, Done::Killed { worker_id, .. } if *worker_id == dead_id)));
    assert!(replaced.iter().any(|d| matches!(d, Done::Launched { .. })));
    assert_eq!(task.workers().len(), 2);

    // The supervisor restarts: it adopts both workers rather than launching more.
    let pids: BTreeSet<u32> = task.workers().values().map(|r| r.pid).collect();
    drop(task);
    let mut task = open(launcher.clone());
    assert_eq!(task.supervisor_id(), &id, "the id survives a restart");
    assert_eq!(task.workers().values().map(|r| r.pid).collect::<BTreeSet<_>>(), pids);
    assert_eq!(settle(&mut task, &desired, &reaper).await, []);

    // A port is unassigned: its worker is stopped; then everything goes.
    let one: BTreeMap<u16, LocalAssignment> = [(6700, assignment(&[1]))].into();
    let killed = settle(&mut task, &one, &reaper).await;
    assert!(matches!(killed.as_slice(), [Done::Killed { port: 6701, .. }]), "{killed:?}");
    settle(&mut task, &BTreeMap::new(), &reaper).await;
    assert!(task.workers().is_empty());
    for pid in pids {
        eventually_true(DEADLINE, "every worker to stop", || async { !launcher.is_running(pid) }).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_state_file_is_rebuilt_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("supervisor")).unwrap();
    std::fs::write(dir.path().join("supervisor/state"), b"squall-local-state v1 len=3 crc32=00000000\nxyz")
        .unwrap();
    let launcher: Arc<dyn Launcher> = Arc::new(ProcessLauncher::new());
    let task =
        ProcessTask::open(dir.path(), launcher, fake_worker(dir.path()), TIMEOUTS, Duration::from_secs(1))
            .unwrap();
    assert!(task.workers().is_empty());
    // The rebuilt state is good again.
    let reopened = ProcessTask::open(
        dir.path(),
        Arc::new(ProcessLauncher::new()),
        fake_worker(dir.path()),
        TIMEOUTS,
        Duration::from_secs(1),
    )
    .unwrap();
    assert_eq!(reopened.supervisor_id(), task.supervisor_id());
    // What was there is kept for a look, not deleted.
    let kept = std::fs::read(dir.path().join("supervisor/state.corrupt")).unwrap();
    assert_eq!(kept, b"squall-local-state v1 len=3 crc32=00000000\nxyz");
}

/// Whether `pid` is a zombie: exited but never waited for (state `Z` in `/proc/<pid>/stat`).
fn zombie(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // `pid (comm) state ...`; comm may hold spaces and parentheses.
    stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
}

fn opened(
    dir: &Path,
    launcher: &Arc<dyn Launcher>,
    behaviour: Behaviour,
    timeouts: WorkerTimeouts,
) -> ProcessTask {
    ProcessTask::open(
        dir,
        launcher.clone(),
        fake_worker_that(dir, behaviour),
        timeouts,
        Duration::from_millis(300),
    )
    .unwrap()
    .with_backoff(FAST_BACKOFF)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_killed_after_the_grace_period_are_reaped() {
    let dir = tempfile::tempdir().unwrap();
    let launcher: Arc<dyn Launcher> = Arc::new(ProcessLauncher::new());
    let reaper = Reaper(launcher.clone(), Default::default());
    let mut task = opened(dir.path(), &launcher, Behaviour::IgnoresTerm, TIMEOUTS);
    let desired: BTreeMap<u16, LocalAssignment> = [(6700, assignment(&[1])), (6701, assignment(&[2]))].into();
    settle(&mut task, &desired, &reaper).await;
    let pids: Vec<u32> = task.workers().values().map(|r| r.pid).collect();
    eventually_true(DEADLINE, "both heartbeats (the TERM trap is set)", || async {
        task.workers().keys().all(|w| dir.path().join("workers").join(w).join("heartbeat").exists())
    })
    .await;

    // Unassigned: TERM is ignored, so each is killed after the 300 ms grace.
    let killed = settle(&mut task, &BTreeMap::new(), &reaper).await;
    assert_eq!(killed.len(), 2, "{killed:?}");
    // Asked without `is_running` (which would reap them itself): the supervisor waited for
    // each, so none is a zombie, nor a process at all any more.
    for pid in &pids {
        eventually_true(Duration::from_secs(5), "the killed worker to be reaped, not a zombie", || async {
            !zombie(*pid)
        })
        .await;
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "worker {pid} still exists");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_heartbeat_is_tolerated_until_the_heartbeat_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let launcher: Arc<dyn Launcher> = Arc::new(ProcessLauncher::new());
    let reaper = Reaper(launcher.clone(), Default::default());
    let timeouts = WorkerTimeouts { heartbeat_secs: 30, start_secs: 5 };
    let mut task = opened(dir.path(), &launcher, Behaviour::BeatsOnce, timeouts);
    let desired: BTreeMap<u16, LocalAssignment> = [(6700, assignment(&[1]))].into();
    let start = now_secs();
    let launched = task.reconcile(&desired, &BTreeSet::new(), start).await.unwrap();
    let Some(Done::Launched { worker_id, pid, .. }) = launched.first().cloned() else {
        panic!("{launched:?}")
    };
    reaper.1.lock().unwrap().push(pid);
    let beat_path = dir.path().join("workers").join(&worker_id).join("heartbeat");
    eventually_true(DEADLINE, "the heartbeat", || async { beat_path.exists() }).await;
    assert_eq!(task.reconcile(&desired, &BTreeSet::new(), start).await.unwrap(), [], "a good beat");
    let beat_secs: u64 = {
        let text = std::fs::read_to_string(&beat_path).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        value["time_secs"].as_u64().unwrap()
    };

    // A torn write: past the start timeout, still within the heartbeat timeout of the last good beat.
    std::fs::write(&beat_path, b"{\"version\":1,\"time_se").unwrap();
    let later = beat_secs.max(start) + 10;
    assert_eq!(
        task.reconcile(&desired, &BTreeSet::new(), later).await.unwrap(),
        [],
        "one bad read kills nothing"
    );
    assert!(launcher.is_running(pid));

    // Still unreadable once the last good beat is older than the timeout: timed out.
    let done = task.reconcile(&desired, &BTreeSet::new(), beat_secs + 31).await.unwrap();
    assert!(
        matches!(done.first(), Some(Done::Killed { state: supervisor::plan::WorkerState::TimedOut, .. })),
        "{done:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_worker_is_relaunched_with_a_growing_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let launcher: Arc<dyn Launcher> = Arc::new(ProcessLauncher::new());
    let reaper = Reaper(launcher.clone(), Default::default());
    let policy = BackoffPolicy {
        initial: Duration::from_millis(200),
        max: Duration::from_millis(800),
        reset_after: Duration::from_secs(60),
    };
    let mut task = opened(dir.path(), &launcher, Behaviour::Crashes, TIMEOUTS).with_backoff(policy);
    let desired: BTreeMap<u16, LocalAssignment> = [(6700, assignment(&[1]))].into();
    // The supervisor's rounds, every 50 ms here, for 3 s.
    let mut launches = Vec::new();
    let start = tokio::time::Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        for done in task.reconcile(&desired, &BTreeSet::new(), now_secs()).await.unwrap() {
            if let Done::Launched { pid, .. } = done {
                reaper.1.lock().unwrap().push(pid);
                launches.push(start.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // 0, then +0.2, +0.4, +0.8, +0.8 s (plus a round each): about 5, not 30.
    assert!((3..=7).contains(&launches.len()), "launches at {launches:?}");
    let gaps: Vec<Duration> = launches.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.iter().all(|gap| *gap >= Duration::from_millis(200)), "gaps {gaps:?}");
    assert!(gaps.last().is_some_and(|gap| *gap >= Duration::from_millis(750)), "gaps {gaps:?}");
    for pid in reaper.1.lock().unwrap().iter() {
        assert!(!zombie(*pid), "crashed worker {pid} left a zombie");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_state_file_keeps_the_id_and_adopts_the_running_workers() {
    let dir = tempfile::tempdir().unwrap();
    let launcher: Arc<dyn Launcher> = Arc::new(ProcessLauncher::new());
    let reaper = Reaper(launcher.clone(), Default::default());
    let mut task = opened(dir.path(), &launcher, Behaviour::Beats, TIMEOUTS);
    let id = task.supervisor_id().clone();
    let desired: BTreeMap<u16, LocalAssignment> = [(6700, assignment(&[1])), (6701, assignment(&[2]))].into();
    settle(&mut task, &desired, &reaper).await;
    let workers = task.workers().clone();
    eventually_true(DEADLINE, "both heartbeats", || async {
        workers.keys().all(|w| dir.path().join("workers").join(w).join("heartbeat").exists())
    })
    .await;
    drop(task);

    // The state file is damaged while the supervisor is down: the id and both workers survive.
    let state = dir.path().join("supervisor/state");
    let damage = |state: &Path| {
        let mut bytes = std::fs::read(state).unwrap();
        let last = bytes.len() - 2;
        bytes[last] ^= 0x20;
        std::fs::write(state, bytes).unwrap();
    };
    damage(&state);
    let mut task = opened(dir.path(), &launcher, Behaviour::Beats, TIMEOUTS);
    assert_eq!(task.supervisor_id(), &id, "the id survives a corrupt state file");
    assert_eq!(
        task.workers().iter().map(|(w, r)| (w.clone(), (r.pid, r.port))).collect::<BTreeMap<_, _>>(),
        workers.iter().map(|(w, r)| (w.clone(), (r.pid, r.port))).collect::<BTreeMap<_, _>>(),
        "the running workers are adopted"
    );
    assert_eq!(settle(&mut task, &desired, &reaper).await, [], "and left running");
    assert!(dir.path().join("supervisor/state.corrupt").exists());
    drop(task);

    // Both files lost: the id comes back from the workers' command lines.
    std::fs::remove_file(dir.path().join("supervisor/supervisor-id")).unwrap();
    damage(&state);
    let mut task = opened(dir.path(), &launcher, Behaviour::Beats, TIMEOUTS);
    assert_eq!(task.supervisor_id(), &id, "the id is recovered from the running workers");
    assert_eq!(task.workers().len(), 2);
    assert_eq!(settle(&mut task, &desired, &reaper).await, []);
    settle(&mut task, &BTreeMap::new(), &reaper).await;
}
