//! The multi-process test cluster shared by `cluster.rs` and `ui.rs`: ZooKeeper (the harness),
//! `squall nimbus` and `squall supervisor` processes with their own ports and dirs, all
//! configured by one cluster config file (plus `-c` overrides), the operator verbs run as
//! `squall` commands, and a session with the cluster's ZooKeeper credentials.
//!
//! Every [`Cluster`] runs with ZooKeeper authentication on (`storm.zookeeper.auth.*`, issue
//! #16): its processes, its workers, the `squall` verbs and the test's own session all use the
//! cluster's digest credentials, and Storm's layout is closed to anyone else.

// Each test binary that includes this module uses a different part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

use cluster_state::coord::{Ensemble, Security, Session, SessionOptions, ZkAuth};
use cluster_state::paths::StormPaths;
use test_harness::ZkServer;

pub const SQUALL: &str = env!("CARGO_BIN_EXE_squall");

/// The cluster's ZooKeeper credentials (`storm.zookeeper.auth.payload`).
pub const ZK_AUTH: &str = "squall:cluster-test-secret";

pub use test_harness::free_port;

/// Processes a test started, killed (and reaped) when it ends, however it ends.
pub struct Processes(pub Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `squall <args>` with its output in `<root>/<log>.log`, logging at `rust_log`.
pub fn spawn_logged(root: &std::path::Path, log: &str, rust_log: &str, args: &[String]) -> Child {
    let file = std::fs::File::create(root.join(format!("{log}.log"))).unwrap();
    Command::new(SQUALL)
        .args(args)
        .env("RUST_LOG", rust_log)
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap()
}

/// A daemon's arguments: `<verb> --config <config> --zookeeper <zookeeper>` with its own
/// `storm.local.dir`.
pub fn daemon(verb: &str, config: &std::path::Path, zookeeper: &str, dir: &std::path::Path) -> Vec<String> {
    vec![
        verb.into(),
        "--config".into(),
        config.display().to_string(),
        "--zookeeper".into(),
        zookeeper.into(),
        "-c".into(),
        format!("storm.local.dir={}", dir.display()),
    ]
}

pub fn pids_mentioning(marker: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    let me = std::process::id() as i32;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        if pid == me {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(marker)
        {
            pids.push(pid);
        }
    }
    pids
}

pub fn kill9(marker: &str) -> usize {
    let pids = pids_mentioning(marker);
    for pid in &pids {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    pids.len()
}

/// The cluster's processes; everything mentioning its root dir dies with it.
pub struct Cluster {
    pub root: tempfile::TempDir,
    pub config: PathBuf,
    pub zookeeper: String,
    pub children: Vec<Child>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        kill9(&self.root.path().display().to_string());
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        // To study a run afterwards: every process's log (nimbus, supervisors, workers) is kept
        // under `SQUALL_E2E_LOG_DIR/<test root>/` when that variable is set.
        if let Some(keep) = std::env::var_os("SQUALL_E2E_LOG_DIR") {
            let name = self.root.path().file_name().unwrap_or_default().to_owned();
            keep_logs(self.root.path(), &PathBuf::from(keep).join(name));
        }
        if std::thread::panicking() {
            for log in ["nimbus", "n1", "n2", "n3", "sup-a", "sup-b", "sup-c"] {
                let path = self.root.path().join(format!("{log}.log"));
                if let Ok(text) = std::fs::read_to_string(&path) {
                    let tail: Vec<&str> = text.lines().rev().take(40).collect();
                    eprintln!("--- {log}.log (last lines) ---");
                    for line in tail.into_iter().rev() {
                        eprintln!("{line}");
                    }
                }
            }
            for path in log_files(self.root.path()).into_iter().filter(|p| p.ends_with("worker.log")) {
                let Ok(text) = std::fs::read_to_string(&path) else { continue };
                let tail: Vec<&str> =
                    text.lines().filter(|l| !l.contains(" DEBUG ")).rev().take(30).collect();
                eprintln!(
                    "--- {} (last lines) ---",
                    path.strip_prefix(self.root.path()).unwrap_or(&path).display()
                );
                for line in tail.into_iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }
}

/// Every `*.log` file under `dir`, sorted.
pub fn log_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(log_files(&path));
        } else if path.extension().is_some_and(|e| e == "log") {
            found.push(path);
        }
    }
    found.sort();
    found
}

/// Copies every `*.log` file under `from` to `to`, keeping the relative paths.
pub fn keep_logs(from: &std::path::Path, to: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(from) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            keep_logs(&path, &to.join(entry.file_name()));
        } else if path.extension().is_some_and(|e| e == "log") {
            let _ = std::fs::create_dir_all(to);
            let _ = std::fs::copy(&path, to.join(entry.file_name()));
        }
    }
}

impl Cluster {
    pub async fn new(test: &str) -> Cluster {
        Cluster::on(ZkServer::shared().chroot(test).await)
    }

    /// A cluster over the ZooKeeper at `zookeeper` (a connect string, maybe with a chroot).
    pub fn on(zookeeper: String) -> Cluster {
        let root = tempfile::tempdir().unwrap();
        let port = free_port();
        let nimbus = format!("127.0.0.1:{port}");
        let config = root.path().join("cluster.yaml");
        std::fs::write(
            &config,
            format!(
                "# one file for every process of the test cluster\n\
                 storm.zookeeper.session.timeout: 4000\n\
                 storm.zookeeper.auth.scheme: digest\n\
                 storm.zookeeper.auth.payload: \"{ZK_AUTH}\"\n\
                 storm.local.hostname: 127.0.0.1\n\
                 nimbus.monitor.freq.secs: 1\n\
                 nimbus.task.timeout.secs: 10\n\
                 nimbus.task.launch.secs: 30\n\
                 nimbus.supervisor.timeout.secs: 5\n\
                 nimbus.http.host: 127.0.0.1\n\
                 nimbus.http.port: {port}\n\
                 nimbus.http.address: {nimbus}\n\
                 supervisor.monitor.frequency.secs: 1\n\
                 supervisor.heartbeat.frequency.secs: 1\n\
                 supervisor.worker.timeout.secs: 10\n\
                 supervisor.worker.shutdown.sleep.secs: 1\n"
            ),
        )
        .unwrap();
        Cluster { root, config, zookeeper, children: Vec::new() }
    }

    /// Adds `line` (`key: value`) to the cluster's config file; processes started afterwards
    /// and every `squall` verb read it.
    pub fn configure(&self, line: &str) {
        let mut text = std::fs::read_to_string(&self.config).unwrap();
        text.push_str(line);
        text.push('\n');
        std::fs::write(&self.config, text).unwrap();
    }

    pub fn dir(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    pub fn spawn(&mut self, log: &str, args: &[String]) {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir(&format!("{log}.log")))
            .unwrap();
        let child = Command::new(SQUALL)
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        self.children.push(child);
    }

    pub fn daemon_args(&self, verb: &str, local: &str) -> Vec<String> {
        vec![
            verb.into(),
            "--config".into(),
            self.config.display().to_string(),
            "--zookeeper".into(),
            self.zookeeper.clone(),
            "-c".into(),
            format!("storm.local.dir={}", self.dir(local).display()),
        ]
    }

    pub fn start_nimbus(&mut self) {
        let args = self.daemon_args("nimbus", "nimbus");
        self.spawn("nimbus", &args);
    }

    pub fn start_supervisor(&mut self, name: &str, ports: &[u16]) {
        let mut args = self.daemon_args("supervisor", name);
        let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
        args.extend(["-c".into(), format!("supervisor.slots.ports=[{}]", ports.join(", "))]);
        self.spawn(name, &args);
    }

    /// Runs a `squall` verb against nimbus.
    pub fn squall(&self, args: &[&str]) -> Output {
        Command::new(SQUALL)
            .args(args)
            .args(["--config", &self.config.display().to_string()])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// A session with the cluster's credentials (Storm's layout is closed to anonymous ones).
    pub async fn session(&self) -> Session {
        let auth = ZkAuth::new("digest", ZK_AUTH).unwrap();
        Ensemble::zookeeper(self.zookeeper.clone())
            .with_security(Security::new(Some(auth), StormPaths::DEFAULT_ROOT))
            .connect(&SessionOptions::default())
            .await
            .unwrap()
    }
}

pub fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}
