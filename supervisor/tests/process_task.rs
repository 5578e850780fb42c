//! The process task against real processes: it launches a worker per assigned port, relaunches
//! one that died, kills one no longer assigned, and a restarted supervisor adopts its workers
//! instead of starting them twice. A corrupt state file does not stop it.
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

/// A stand-in worker: writes `<dir>/workers/<id>/heartbeat` every 200 ms, atomically. The
/// launcher runs `sh worker <flags>` in a directory of the worker's own, where `worker` is this
/// script (so its command line is the real launch's, worker id included, for adoption).
fn fake_worker(local_dir: &Path) -> SpecBuilder {
    let local_dir = local_dir.to_path_buf();
    Arc::new(move |supervisor, worker_id, port, assignment| {
        let dir = local_dir.join("workers").join(worker_id.as_str());
        let executors: Vec<String> = assignment
            .executors
            .iter()
            .map(|e| format!("[{},{}]", e.start_task().0, e.end_task().0))
            .collect();
        let script = format!(
            "mkdir -p '{dir}'; while :; do \
             printf '{{\"version\":1,\"time_secs\":%s,\"topology_id\":\"{topology}\",\"executors\":[{executors}],\"port\":{port}}}' \
             \"$(date +%s)\" > '{dir}/heartbeat.tmp' && mv '{dir}/heartbeat.tmp' '{dir}/heartbeat'; sleep 0.2; done",
            dir = dir.display(),
            topology = assignment.topology_id,
            executors = executors.join(","),
        );
        let program_dir = local_dir.join("programs").join(worker_id.as_str());
        std::fs::create_dir_all(&program_dir).unwrap();
        std::fs::write(program_dir.join("worker"), script).unwrap();
        let launch = WorkerLaunch::new(
            assignment.topology_id.clone(),
            supervisor.clone(),
            port,
            worker_id.clone(),
            local_dir.join("topology.yaml"),
        );
        WorkerSpec {
            program: "sh".into(),
            launch,
            env: vec![],
            dir: program_dir,
            log_path: local_dir.join(format!("{worker_id}.log")),
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

async fn settle(
    task: &mut ProcessTask,
    desired: &BTreeMap<u16, LocalAssignment>,
    reaper: &Reaper,
) -> Vec<Done> {
    // Reconcile until a round has nothing to do (bounded).
    let mut all = Vec::new();
    for _ in 0..50 {
        let done = task.reconcile(desired, now_secs()).await.unwrap();
        if done.is_empty() {
            return all;
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
}
