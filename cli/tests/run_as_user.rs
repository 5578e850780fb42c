//! `supervisor.run.worker.as.user` with whole processes (ZooKeeper, `squall nimbus`, `squall
//! supervisor` running as root, its worker): the worker runs as `nobody` (its uid in
//! `/proc/<pid>/status`), reads its code and writes its heartbeat (locally and in ZooKeeper),
//! and a user that does not exist stops the supervisor with an error naming the key.
//!
//! Switching users needs root: as another user the test says so and checks only the refusal.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use cluster_state::coord::{Ensemble, SessionOptions};
use cluster_state::ids::TopologyId;
use cluster_state::paths::StormPaths;
use test_harness::{ZkServer, eventually};

/// The daemons' fixture, shared with the other multi-process tests.
#[path = "support/cluster.rs"]
mod support;
use support::{Processes, SQUALL, daemon, free_port, spawn_logged};

const WORDCOUNT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/wordcount.yaml");

fn spawn(root: &Path, log: &str, args: &[String]) -> Child {
    spawn_logged(root, log, "info", args)
}

/// `(uid, pid)` of every process whose command line mentions `needle` and runs `worker`.
fn workers_under(needle: &str) -> Vec<(u32, u32)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let args: Vec<String> =
            cmdline.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        if args.get(1).is_some_and(|a| a == "worker") && args.iter().any(|a| a.contains(needle)) {
            let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { continue };
            // `Uid:\treal\teffective\tsaved\tfs`: all four must be the user's.
            let uids: Vec<u32> = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .map(|l| l.split_whitespace().filter_map(|u| u.parse().ok()).collect())
                .unwrap_or_default();
            assert!(uids.len() == 4 && uids.iter().all(|u| *u == uids[0]), "worker {pid} uids {uids:?}");
            found.push((uids[0], pid));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_run_as_the_configured_user_and_still_heartbeat() {
    let root = tempfile::tempdir().unwrap();
    let zookeeper = ZkServer::shared().chroot("run_as_user").await;
    let config = root.path().join("cluster.yaml");
    let port = free_port();
    std::fs::write(
        &config,
        format!(
            "storm.zookeeper.session.timeout: 4000\nstorm.local.hostname: 127.0.0.1\n\
             nimbus.monitor.freq.secs: 1\nnimbus.http.port: {port}\nnimbus.http.address: 127.0.0.1:{port}\n\
             supervisor.monitor.frequency.secs: 1\nsupervisor.heartbeat.frequency.secs: 1\n\
             supervisor.slots.ports: [{}, {}]\nsupervisor.run.worker.as.user: nobody\n",
            free_port(),
            free_port()
        ),
    )
    .unwrap();
    let sup_dir = root.path().join("sup");

    // A user that does not exist: the supervisor does not start, and says which key is wrong.
    let out = Command::new(SQUALL)
        .args(daemon("supervisor", &config, &zookeeper, &sup_dir))
        .args(["-c", "supervisor.run.worker.as.user=no-such-user-squall"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("supervisor.run.worker.as.user") && text.contains("no-such-user-squall"), "{text}");

    if rustix::process::geteuid().as_raw() != 0 {
        eprintln!("not root: switching users cannot be tested here (CI runs as root)");
        return;
    }
    let nobody = Command::new("getent").args(["passwd", "nobody"]).output().unwrap();
    let nobody_uid: u32 = String::from_utf8_lossy(&nobody.stdout)
        .split(':')
        .nth(2)
        .and_then(|u| u.parse().ok())
        .expect("a `nobody` user on this machine");
    // The user must be able to reach storm.local.dir, as under /var/lib on a real machine.
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();

    let _processes = Processes(vec![
        spawn(root.path(), "nimbus", &daemon("nimbus", &config, &zookeeper, &root.path().join("nimbus"))),
        spawn(root.path(), "supervisor", &daemon("supervisor", &config, &zookeeper, &sup_dir)),
    ]);
    eventually(Duration::from_secs(60), "`squall submit`", || async {
        let out = Command::new(SQUALL).args(["submit", WORDCOUNT, "--config"]).arg(&config).output().unwrap();
        out.status.success().then_some(())
    })
    .await;
    let paths = StormPaths::default();
    let zk = Ensemble::zookeeper(zookeeper.clone()).connect(&SessionOptions::default()).await.unwrap();
    let id: TopologyId = eventually(Duration::from_secs(30), "the topology's id", || async {
        zk.children(&paths.storms_dir()).await.ok()?.first()?.parse().ok()
    })
    .await;
    eventually(Duration::from_secs(90), "the worker's heartbeat in ZooKeeper", || async {
        (!zk.children(&paths.workerbeats_topology(&id)).await.ok()?.is_empty()).then_some(())
    })
    .await;

    // Its process runs as nobody, and its local heartbeat is nobody's and keeps changing.
    let needle = sup_dir.display().to_string();
    let workers = eventually(Duration::from_secs(30), "the worker process", || async {
        let found = workers_under(&needle);
        (!found.is_empty()).then_some(found)
    })
    .await;
    assert!(
        workers.iter().all(|(uid, _)| *uid == nobody_uid),
        "worker uids {workers:?}, nobody is {nobody_uid}"
    );
    let beats: Vec<_> = std::fs::read_dir(sup_dir.join("workers"))
        .unwrap()
        .flatten()
        .map(|d| d.path().join("heartbeat"))
        .filter(|p| p.exists())
        .collect();
    assert!(!beats.is_empty(), "a local heartbeat");
    for beat in &beats {
        assert_eq!(
            std::fs::metadata(beat).unwrap().uid(),
            nobody_uid,
            "{} written by the worker",
            beat.display()
        );
    }
    let first = std::fs::read(&beats[0]).unwrap();
    eventually(Duration::from_secs(30), "the local heartbeat to change", || async {
        (std::fs::read(&beats[0]).ok()? != first).then_some(())
    })
    .await;
    // The directories stay closed to everyone but the worker's group (traverse only).
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&sup_dir), 0o710);
    assert_eq!(mode(&sup_dir.join("workers")), 0o710);
    assert_eq!(mode(&sup_dir.join("supervisor")), 0o700);
}
