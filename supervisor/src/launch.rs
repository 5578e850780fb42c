//! Starting and stopping workers, behind a trait.
//!
//! The supervisor decides *what* runs ([`crate::plan`]); a [`Launcher`] makes it so. The process
//! launcher here starts each worker as a child process, without a shell, in its own process
//! group (so a kill reaches anything the worker started), with stdout and stderr appended to
//! the worker's own log file. `squall local` provides a launcher that runs workers in-process
//! instead, which is why this crate never depends on `worker`.
//!
//! What a worker is told is a [`WorkerLaunch`] (`cluster_state::launch`): the process launcher
//! renders it with [`WorkerLaunch::to_args`], the in-process one takes it as it is.
//!
//! The trait is synchronous and signal-shaped (`terminate`, then `force_kill` after a grace
//! period the caller times), so the caller's actor owns every wait.
//!
//! Reaping: every child the process launcher started is waited for. Each call sweeps the
//! children that have exited (`try_wait`), so a worker that died, stopped on TERM or was
//! killed never stays a zombie for longer than the supervisor's next look at any worker; the
//! process task waits after a `force_kill` until the worker is gone (`is_running` false).

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};

use cluster_state::launch::WorkerLaunch;
use rustix::process::{Pid, Signal};

use crate::run_as::RunAs;

/// Everything needed to start one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpec {
    /// The program: `squall` or the topology's own worker binary.
    pub program: PathBuf,
    /// What the worker is told: its command line (also how an adopted worker is recognised, by
    /// its worker id).
    pub launch: WorkerLaunch,
    /// Extra environment variables.
    pub env: Vec<(OsString, OsString)>,
    /// Working directory.
    pub dir: PathBuf,
    /// Where its stdout and stderr go (appended).
    pub log_path: PathBuf,
    /// The unprivileged user it runs as (`supervisor.run.worker.as.user`), and the paths it
    /// needs; `None`: the supervisor's user.
    pub run_as: Option<RunAs>,
}

impl WorkerSpec {
    /// The worker's id, as its launch gives it.
    pub fn worker_id(&self) -> String {
        self.launch.worker_id.to_string()
    }
}

/// A worker that could not be started or signalled.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The log file could not be opened.
    #[error("worker {worker_id}: cannot open its log file {path}: {source}")]
    Log { worker_id: String, path: PathBuf, source: io::Error },
    /// The program could not be started (missing, not executable, ...).
    #[error("worker {worker_id}: cannot start {program}: {source}")]
    Spawn { worker_id: String, program: PathBuf, source: io::Error },
    /// The worker's directories could not be handed to its user.
    #[error("worker {worker_id}: cannot prepare {path} for user {user}: {source}")]
    Prepare { worker_id: String, user: String, path: PathBuf, source: io::Error },
    /// A signal could not be delivered (other than to a process already gone).
    #[error("cannot signal worker process {pid}: {source}")]
    Signal { pid: u32, source: io::Error },
}

/// Starts and stops workers; see the module docs.
pub trait Launcher: Send + Sync + std::fmt::Debug {
    /// Starts a worker; returns its pid.
    fn launch(&self, spec: &WorkerSpec) -> Result<u32, LaunchError>;
    /// Whether the worker is still running.
    fn is_running(&self, pid: u32) -> bool;
    /// Asks the worker to shut down gracefully.
    fn terminate(&self, pid: u32) -> Result<(), LaunchError>;
    /// Kills the worker now.
    fn force_kill(&self, pid: u32) -> Result<(), LaunchError>;
    /// After a supervisor restart: whether `pid` is still the worker `worker_id` (and not a
    /// process that reused the pid). Adopted workers are then managed like launched ones.
    fn adopt(&self, pid: u32, worker_id: &str) -> bool;
    /// The workers running on this machine, found without the local state (which may be
    /// unreadable): pid and launch of each, whichever supervisor launched them. None by default
    /// (an in-process launcher's workers do not outlive the supervisor).
    fn find_workers(&self) -> Vec<(u32, WorkerLaunch)> {
        Vec::new()
    }
}

/// Workers as child processes.
#[derive(Debug, Default)]
pub struct ProcessLauncher {
    /// Children we started, so their exit is reaped (no zombies) and observed.
    children: Mutex<HashMap<u32, Child>>,
}

impl ProcessLauncher {
    /// A launcher with no workers yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn children(&self) -> MutexGuard<'_, HashMap<u32, Child>> {
        self.children.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits for every child that has exited (no zombie is left behind) and forgets it.
    fn reap(children: &mut HashMap<u32, Child>) {
        children.retain(|pid, child| match child.try_wait() {
            Ok(None) => true,
            Ok(Some(status)) => {
                tracing::debug!(pid, %status, "worker process reaped");
                false
            }
            // Not waitable (already reaped elsewhere): nothing left to wait for.
            Err(e) => {
                tracing::debug!(pid, error = %e, "worker process not waitable");
                false
            }
        });
    }

    fn signal_group(&self, pid: u32, signal: Signal) -> Result<(), LaunchError> {
        let Some(group) = i32::try_from(pid).ok().and_then(Pid::from_raw) else { return Ok(()) };
        match rustix::process::kill_process_group(group, signal) {
            Ok(()) => Ok(()),
            // Already gone: the goal is reached.
            Err(rustix::io::Errno::SRCH) => Ok(()),
            Err(e) => Err(LaunchError::Signal { pid, source: e.into() }),
        }
    }
}

impl Launcher for ProcessLauncher {
    fn launch(&self, spec: &WorkerSpec) -> Result<u32, LaunchError> {
        if let Some(dir) = spec.log_path.parent() {
            cluster_state::files::create_private_dir_all(dir).map_err(|source| LaunchError::Log {
                worker_id: spec.worker_id(),
                path: dir.to_owned(),
                source,
            })?;
        }
        let log = cluster_state::files::private_append().open(&spec.log_path).map_err(|source| {
            LaunchError::Log { worker_id: spec.worker_id(), path: spec.log_path.clone(), source }
        })?;
        let stderr = log.try_clone().map_err(|source| LaunchError::Log {
            worker_id: spec.worker_id(),
            path: spec.log_path.clone(),
            source,
        })?;
        let mut command = Command::new(&spec.program);
        command
            .args(spec.launch.to_args())
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&spec.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .process_group(0);
        if let Some(run_as) = &spec.run_as {
            run_as.prepare().map_err(|(path, source)| LaunchError::Prepare {
                worker_id: spec.worker_id(),
                user: run_as.user.name.clone(),
                path,
                source,
            })?;
            // std sets the gid, clears the supplementary groups and sets the uid in the child,
            // before exec (and before changing to `dir`).
            command.gid(run_as.user.gid).uid(run_as.user.uid);
        }
        let child = command.spawn().map_err(|source| LaunchError::Spawn {
            worker_id: spec.worker_id(),
            program: spec.program.clone(),
            source,
        })?;
        let pid = child.id();
        let mut children = self.children();
        Self::reap(&mut children);
        children.insert(pid, child);
        Ok(pid)
    }

    fn is_running(&self, pid: u32) -> bool {
        let mut children = self.children();
        Self::reap(&mut children);
        if children.contains_key(&pid) {
            return true;
        }
        drop(children);
        i32::try_from(pid)
            .ok()
            .and_then(Pid::from_raw)
            .is_some_and(|pid| rustix::process::test_kill_process(pid).is_ok())
    }

    fn terminate(&self, pid: u32) -> Result<(), LaunchError> {
        self.signal_group(pid, Signal::TERM)
    }

    fn force_kill(&self, pid: u32) -> Result<(), LaunchError> {
        self.signal_group(pid, Signal::KILL)
    }

    fn adopt(&self, pid: u32, worker_id: &str) -> bool {
        // The worker id is one of its arguments; a reused pid runs something else.
        let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else { return false };
        self.is_running(pid) && cmdline.split(|&b| b == 0).any(|arg| arg == worker_id.as_bytes())
    }

    /// Scans the process table: a worker is a process group leader (each is launched as one)
    /// whose command line, after the program, is a launch.
    fn find_workers(&self) -> Vec<(u32, WorkerLaunch)> {
        let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
        let mut found: Vec<(u32, WorkerLaunch)> = entries
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|pid| {
                // Not `getpgid`: rustix asserts on the group 0 of kernel threads.
                if process_group(pid)? != pid {
                    return None;
                }
                let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                let args = cmdline
                    .strip_suffix(&[0])
                    .unwrap_or(&cmdline)
                    .split(|&b| b == 0)
                    .skip(1)
                    .map(|arg| OsString::from(std::ffi::OsStr::from_bytes(arg)));
                Some((pid, WorkerLaunch::parse(args).ok()?))
            })
            .collect();
        found.sort_by_key(|(pid, _)| *pid);
        found
    }
}

/// A process's group, from `/proc/<pid>/stat` (`pid (comm) state ppid pgrp ...`; the command
/// name may hold spaces and parentheses, so fields are counted after the last `)`).
fn process_group(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use test_harness::wait_for;

    /// A worker running `script`: `sh` reads the file `worker` in its working directory, the
    /// launch's first argument, and takes the launch's flags as its arguments.
    fn spec(dir: &std::path::Path, script: &str) -> WorkerSpec {
        fs::write(dir.join("worker"), script).unwrap();
        let launch = WorkerLaunch::new(
            "wc-1-1700000000".parse().unwrap(),
            "sup-1".parse().unwrap(),
            6700,
            "w-1234".parse().unwrap(),
            dir.join("topology.yaml"),
        );
        WorkerSpec {
            program: "sh".into(),
            launch,
            env: vec![("SQUALL_TEST".into(), "yes".into())],
            dir: dir.to_path_buf(),
            log_path: dir.join("worker.log"),
            run_as: None,
        }
    }

    #[test]
    fn output_goes_to_the_log_file_and_exit_is_observed() {
        let dir = tempfile::tempdir().unwrap();
        let launcher = ProcessLauncher::new();
        let pid = launcher.launch(&spec(dir.path(), "env; echo \"args: $*\"")).unwrap();
        wait_for(Duration::from_secs(10), "the worker to exit", || !launcher.is_running(pid));
        let log = fs::read_to_string(dir.path().join("worker.log")).unwrap();
        assert!(log.contains("SQUALL_TEST=yes"), "{log}");
        assert!(log.contains("args: --topology-id wc-1-1700000000 --supervisor-id sup-1"), "{log}");
    }

    #[test]
    fn terminate_stops_a_worker_and_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let launcher = ProcessLauncher::new();
        // A loop, so `sh` stays the process (it may exec a script's last simple command).
        let pid = launcher.launch(&spec(dir.path(), "while :; do sleep 1; done")).unwrap();
        assert!(launcher.is_running(pid));
        // The worker id is on its command line (once the exec has set it up).
        wait_for(Duration::from_secs(10), "the worker's command line", || launcher.adopt(pid, "w-1234"));
        launcher.terminate(pid).unwrap();
        wait_for(Duration::from_secs(10), "the worker to stop", || !launcher.is_running(pid));
        // Signalling a worker that is gone is not an error.
        launcher.terminate(pid).unwrap();
        launcher.force_kill(pid).unwrap();
    }

    #[test]
    fn force_kill_stops_a_worker_that_ignores_terminate() {
        let dir = tempfile::tempdir().unwrap();
        let launcher = ProcessLauncher::new();
        let stubborn = spec(dir.path(), "trap '' TERM; echo ready; while :; do sleep 1; done");
        let pid = launcher.launch(&stubborn).unwrap();
        wait_for(Duration::from_secs(10), "the trap to be set", || {
            fs::read_to_string(dir.path().join("worker.log")).is_ok_and(|log| log.contains("ready"))
        });
        launcher.terminate(pid).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(launcher.is_running(pid), "TERM is ignored");
        launcher.force_kill(pid).unwrap();
        wait_for(Duration::from_secs(10), "the worker to die", || !launcher.is_running(pid));
    }

    #[test]
    fn a_missing_program_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = WorkerSpec { program: "/nonexistent/squall".into(), ..spec(dir.path(), "") };
        let err = ProcessLauncher::new().launch(&missing).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("w-1234") && message.contains("/nonexistent/squall"), "{message}");
    }

    /// Kills the child when the test ends, also when it fails, so no process outlives it.
    struct KillOnDrop(std::process::Child);

    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn adoption_recognises_the_worker_by_its_id() {
        // A worker left behind by a previous supervisor: not our child.
        let orphan = KillOnDrop(
            Command::new("sh")
                .args(["-c", "while :; do sleep 1; done", "w-1234"])
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let pid = orphan.0.id();
        let launcher = ProcessLauncher::new();
        // Until the child has exec'd, its command line is still ours.
        wait_for(Duration::from_secs(10), "the orphan to exec", || launcher.adopt(pid, "w-1234"));
        assert!(!launcher.adopt(pid, "w-9999"), "same pid, another worker");
        assert!(!launcher.adopt(u32::MAX / 2, "w-1234"), "no such process");
        drop(orphan);
        assert!(!launcher.adopt(pid, "w-1234"), "gone");
    }
}
