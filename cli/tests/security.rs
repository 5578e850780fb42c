//! The security story of a real multi-process cluster (ZooKeeper, `squall nimbus`, one `squall
//! supervisor`, its worker): with ZooKeeper credentials, a nimbus token and a topology whose
//! Kafka spout holds a `sasl.password`,
//!
//! - an anonymous ZooKeeper client (a second Rust session without credentials) can neither read
//!   nor write Storm's layout (no fake supervisor), and can read but not write the Kafka
//!   consumer registry the spout joined (Burrow's view);
//! - the worker authenticated (its spout joined its group, which only the cluster's identity
//!   can write) and its supervisor wrote its heartbeat under the private `/storm/workerbeats`;
//! - a tokenless code download is a 401; the password is in no API answer and no log;
//! - every file and directory nimbus, the supervisor and the worker wrote is 0600 / 0700.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use cluster_state::api::Route;
use cluster_state::code::CodeFile;
use cluster_state::coord::{CreateMode, Ensemble, Error, Security, SessionOptions, ZkAuth};
use cluster_state::ids::{GroupId, TopologyId};
use cluster_state::paths::{KafkaPaths, StormPaths};
use test_harness::{ZkServer, eventually};

/// The daemons' fixture, shared with the other multi-process tests.
#[path = "support/cluster.rs"]
mod support;
use support::{Processes, SQUALL, free_port, spawn_logged};

const PASSWORD: &str = "hunter2-sasl-pw";
const ZK_PAYLOAD: &str = "squall:zk-pw-4321";
const TOKEN: &str = "api-token-9876";

fn spawn(root: &Path, log: &str, args: &[String]) -> Child {
    spawn_logged(root, log, "debug,librdkafka=info,rdkafka=info,hyper=info", args)
}

/// Every file's text under `dir`, recursively (logs of nimbus, the supervisor and workers).
fn logs(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            logs(&path, out);
        } else if path.extension().is_some_and(|e| e == "log")
            || path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("worker.log"))
        {
            out.push((path.clone(), String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned()));
        }
    }
}

/// Every file under `dir` is 0600 (a worker binary 0700), every directory 0700.
fn assert_owner_only(dir: &Path) -> usize {
    use cluster_state::files::mode_of;
    assert_eq!(mode_of(dir).unwrap(), 0o700, "{}", dir.display());
    let mut checked = 1;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            checked += assert_owner_only(&path);
        } else {
            let wanted = if path.file_name().is_some_and(|n| n == "worker") { 0o700 } else { 0o600 };
            assert_eq!(mode_of(&path).unwrap(), wanted, "{}", path.display());
            checked += 1;
        }
    }
    checked
}

async fn http_get(address: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nHost: nimbus\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).await.unwrap();
    let text = String::from_utf8_lossy(&reply).into_owned();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_credentials_zookeeper_code_secrets_and_files_are_closed_to_strangers() {
    let root = tempfile::tempdir().unwrap();
    let zookeeper = ZkServer::shared().chroot("security_story").await;
    let port = free_port();
    let nimbus = format!("127.0.0.1:{port}");
    let config = root.path().join("cluster.yaml");
    std::fs::write(
        &config,
        format!(
            "storm.zookeeper.session.timeout: 4000\nstorm.zookeeper.auth.scheme: digest\n\
             storm.zookeeper.auth.payload: \"{ZK_PAYLOAD}\"\nstorm.local.hostname: 127.0.0.1\n\
             nimbus.monitor.freq.secs: 1\nnimbus.http.port: {port}\nnimbus.http.address: {nimbus}\n\
             nimbus.http.token: {TOKEN}\nsupervisor.monitor.frequency.secs: 1\n\
             supervisor.heartbeat.frequency.secs: 1\nsupervisor.slots.ports: [{}]\n",
            free_port()
        ),
    )
    .unwrap();
    let daemon = |verb: &str, dir: &str| -> Vec<String> {
        vec![
            verb.into(),
            "--config".into(),
            config.display().to_string(),
            "--zookeeper".into(),
            zookeeper.clone(),
            "-c".into(),
            format!("storm.local.dir={}", root.path().join(dir).display()),
        ]
    };
    let _processes = Processes(vec![
        spawn(root.path(), "nimbus", &daemon("nimbus", "nimbus")),
        spawn(root.path(), "supervisor", &daemon("supervisor", "sup")),
    ]);

    // A Kafka spout whose librdkafka settings carry a SASL password; no broker needs to answer
    // for it to join its group in the registry.
    let topology = root.path().join("secret.yaml");
    std::fs::write(
        &topology,
        format!(
            "name: secretive\nconfig: {{topology.workers: 1}}\nspouts:\n  - id: kafka\n    className: kafka-spout\n\
             \x20   params:\n      bootstrap_servers: \"127.0.0.1:{}\"\n      topics: [in]\n      group_id: secretive\n\
             \x20     zookeeper_connect: \"{zookeeper}\"\n      registry: {{zookeeper_session_timeout_ms: 4000}}\n\
             \x20     librdkafka: {{sasl.username: alice, sasl.password: \"{PASSWORD}\"}}\n\
             bolts:\n  - id: log\n    className: log\n\
             streams:\n  - from: kafka\n    to: log\n    grouping: {{type: SHUFFLE}}\n",
            free_port()
        ),
    )
    .unwrap();
    let submit = eventually(Duration::from_secs(60), "nimbus to take the submit", || async {
        let out = Command::new(SQUALL)
            .args(["submit", topology.to_str().unwrap(), "--config", config.to_str().unwrap()])
            .env("RUST_LOG", "debug")
            .output()
            .unwrap();
        out.status.success().then_some(out)
    })
    .await;
    let submit_text =
        format!("{}{}", String::from_utf8_lossy(&submit.stdout), String::from_utf8_lossy(&submit.stderr));
    assert!(!submit_text.contains(PASSWORD), "{submit_text}");

    let paths = StormPaths::default();
    let cluster = Security::new(Some(ZkAuth::new("digest", ZK_PAYLOAD).unwrap()), "/storm");
    let squall = Ensemble::zookeeper(zookeeper.clone())
        .with_security(cluster)
        .connect(&SessionOptions::default())
        .await
        .unwrap();
    let id: TopologyId = eventually(Duration::from_secs(30), "the topology's id", || async {
        squall.children(&paths.storms_dir()).await.ok()?.first()?.parse().ok()
    })
    .await;
    // The supervisor wrote its worker's heartbeat: only the cluster's identity can write
    // under /storm (the worker's own authentication shows in its spout joining its group).
    eventually(Duration::from_secs(90), "the worker's heartbeat in ZooKeeper", || async {
        (!squall.children(&paths.workerbeats_topology(&id)).await.ok()?.is_empty()).then_some(())
    })
    .await;
    let registry = KafkaPaths::default();
    let group = GroupId::new("secretive").unwrap();
    eventually(Duration::from_secs(60), "the spout to join its group", || async {
        (!squall.children(&registry.ids_dir(&group)).await.ok()?.is_empty()).then_some(())
    })
    .await;

    // An anonymous client: Storm's layout is closed, the registry readable only.
    let anonymous = Ensemble::zookeeper(zookeeper.clone()).connect(&SessionOptions::default()).await.unwrap();
    let no_auth = |e: Error| assert!(matches!(e, Error::NoAuth { .. }), "{e}");
    no_auth(anonymous.get(&paths.assignment(&id)).await.unwrap_err());
    no_auth(anonymous.get(&paths.storm(&id)).await.unwrap_err());
    no_auth(anonymous.children(&paths.supervisors_dir()).await.unwrap_err());
    let fake = format!("{}/attacker", paths.supervisors_dir());
    no_auth(anonymous.create(&fake, b"{}", CreateMode::Ephemeral).await.unwrap_err());
    no_auth(anonymous.children(&paths.workerbeats_topology(&id)).await.unwrap_err());
    let members = anonymous.children(&registry.ids_dir(&group)).await.unwrap();
    assert_eq!(members.len(), 1, "Burrow's view of the group: {members:?}");
    let member = format!("{}/{}", registry.ids_dir(&group), members[0]);
    assert!(anonymous.get(&member).await.unwrap().0.starts_with(b"{\"version\":1"));
    no_auth(anonymous.set(&member, b"{}", None).await.unwrap_err());
    no_auth(anonymous.delete(&member, None).await.unwrap_err());
    let intruder = format!("{}/intruder", registry.ids_dir(&group));
    no_auth(anonymous.create(&intruder, b"{}", CreateMode::Ephemeral).await.unwrap_err());

    // nimbus's API: no code without the token; the password in no answer.
    for file in [CodeFile::Topology, CodeFile::Secret] {
        let (status, _) = http_get(&nimbus, &Route::Code(id.clone(), file).path()).await;
        assert_eq!(status, 401, "{file}");
    }
    for route in [
        Route::ClusterSummary,
        Route::SupervisorSummary,
        Route::TopologySummary,
        Route::Topology(id.clone()),
        Route::TopologyErrors(id.clone()),
        Route::PrometheusTargets,
    ] {
        let (status, text) = http_get(&nimbus, &route.path()).await;
        assert_eq!(status, 200, "{route:?}: {text}");
        assert!(!text.contains(PASSWORD), "{route:?}: {text}");
    }

    // No log of nimbus, the supervisor or the worker has the password (nor ZooKeeper's).
    let mut all = Vec::new();
    logs(root.path(), &mut all);
    // The worker's, at Storm's place: `workers-artifacts/<topology-id>/<port>/worker.log*`.
    let names: Vec<&PathBuf> = all.iter().map(|(p, _)| p).collect();
    assert!(
        names.iter().any(|p| p.to_string_lossy().contains("workers-artifacts")),
        "a worker log: {names:?}"
    );
    for (path, text) in &all {
        assert!(!text.contains(PASSWORD), "{} has the SASL password", path.display());
        assert!(!text.contains("zk-pw-4321"), "{} has the ZooKeeper password", path.display());
        assert!(!text.contains(TOKEN), "{} has the API token", path.display());
    }

    // Everything nimbus, the supervisor and the worker wrote is their user's alone.
    let nimbus_files = assert_owner_only(&root.path().join("nimbus"));
    let supervisor_files = assert_owner_only(&root.path().join("sup"));
    assert!(nimbus_files > 5 && supervisor_files > 8, "{nimbus_files} {supervisor_files}");
    let sup = root.path().join("sup");
    let worker_dirs: Vec<_> = std::fs::read_dir(sup.join("workers")).unwrap().flatten().collect();
    assert!(worker_dirs.iter().any(|d| d.path().join("heartbeat").exists()), "a worker heartbeat file");
}
