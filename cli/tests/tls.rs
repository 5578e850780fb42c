//! TLS on nimbus's API, with whole processes (ZooKeeper, `squall nimbus`, one `squall
//! supervisor` and its worker, `squall` verbs) and certificates made at test time:
//!
//! - under mutual TLS, `squall submit` / `squall list` with the cluster's CA and a client
//!   certificate work, and the supervisor downloads the code over TLS (its worker heartbeats);
//! - a plain-HTTP client, a client trusting another CA, a client without a certificate and one
//!   whose certificate another CA issued are all refused;
//! - one-way TLS (no client CA): a client with the CA and no certificate works, plain does not;
//! - an unreadable certificate stops nimbus with an error naming the key and the path.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cluster_state::coord::{Ensemble, SessionOptions};
use cluster_state::ids::TopologyId;
use cluster_state::paths::StormPaths;
use cluster_state::tls::{ClientTls, TlsFile};
use nimbus_client::{ClientError, NimbusClient};
use test_harness::tls::TestCa;
use test_harness::{ZkServer, eventually};

const SQUALL: &str = env!("CARGO_BIN_EXE_squall");
const WORDCOUNT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/wordcount.yaml");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn spawn(root: &Path, log: &str, args: &[String]) -> Child {
    let file = std::fs::File::create(root.join(format!("{log}.log"))).unwrap();
    Command::new(SQUALL)
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap()
}

fn daemon(verb: &str, config: &Path, zookeeper: &str, dir: &Path) -> Vec<String> {
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

/// `squall <args> --config <config>`: (success, stdout + stderr).
fn squall(args: &[&str], config: &Path) -> (bool, String) {
    let out = Command::new(SQUALL).args(args).arg("--config").arg(config).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn client_tls(ca: &Path, identity: Option<(&Path, &Path)>) -> ClientTls {
    let ca = TlsFile::new("ca", ca);
    let identity = identity.map(|(c, k)| (TlsFile::new("cert", c), TlsFile::new("key", k)));
    ClientTls::load(&ca, identity.as_ref().map(|(c, k)| (c, k))).unwrap()
}

fn assert_tls_refused(result: Result<impl std::fmt::Debug, ClientError>, what: &str) {
    match result {
        Err(ClientError::Tls { reason, .. }) => eprintln!("{what}: refused: {reason}"),
        other => panic!("{what}: expected a TLS refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_lets_the_cluster_in_and_keeps_strangers_out() {
    let root = tempfile::tempdir().unwrap();
    let cluster_ca = TestCa::new(root.path(), "cluster-ca");
    let stranger_ca = TestCa::new(root.path(), "stranger-ca");
    let server = cluster_ca.issue("nimbus");
    let operator = cluster_ca.issue("operator");
    let impostor = stranger_ca.issue("operator");
    let zookeeper = ZkServer::shared().chroot("mutual_tls").await;
    let port = free_port();
    let nimbus = format!("127.0.0.1:{port}");
    let config = root.path().join("cluster.yaml");
    std::fs::write(
        &config,
        format!(
            "storm.zookeeper.session.timeout: 4000\nstorm.local.hostname: 127.0.0.1\n\
             nimbus.monitor.freq.secs: 1\nnimbus.http.port: {port}\nnimbus.http.address: {nimbus}\n\
             nimbus.http.tls.cert: {}\nnimbus.http.tls.key: {}\nnimbus.http.tls.client.ca: {ca}\n\
             nimbus.http.tls.ca: {ca}\nnimbus.http.tls.client.cert: {}\nnimbus.http.tls.client.key: {}\n\
             supervisor.monitor.frequency.secs: 1\nsupervisor.heartbeat.frequency.secs: 1\n\
             supervisor.slots.ports: [{}, {}]\n",
            server.cert.display(),
            server.key.display(),
            operator.cert.display(),
            operator.key.display(),
            free_port(),
            free_port(),
            ca = cluster_ca.cert.display(),
        ),
    )
    .unwrap();
    let _processes = Processes(vec![
        spawn(root.path(), "nimbus", &daemon("nimbus", &config, &zookeeper, &root.path().join("nimbus"))),
        spawn(
            root.path(),
            "supervisor",
            &daemon("supervisor", &config, &zookeeper, &root.path().join("sup")),
        ),
    ]);

    // The CLI, with the CA and its certificate from the config file.
    eventually(Duration::from_secs(60), "`squall submit` over mutual TLS", || async {
        squall(&["submit", WORDCOUNT], &config).0.then_some(())
    })
    .await;
    let (listed, text) = squall(&["list"], &config);
    assert!(listed && text.contains("wordcount"), "{text}");

    // The supervisor downloaded the code over mutual TLS: its worker heartbeats.
    let paths = StormPaths::default();
    let zk = Ensemble::zookeeper(zookeeper.clone()).connect(&SessionOptions::default()).await.unwrap();
    let id: TopologyId = eventually(Duration::from_secs(30), "the topology's id", || async {
        zk.children(&paths.storms_dir()).await.ok()?.first()?.parse().ok()
    })
    .await;
    eventually(Duration::from_secs(90), "a worker's heartbeat (code downloaded over TLS)", || async {
        (!zk.children(&paths.workerbeats_topology(&id)).await.ok()?.is_empty()).then_some(())
    })
    .await;

    // The same calls, as strangers.
    let trusted = client_tls(&cluster_ca.cert, Some((&operator.cert, &operator.key)));
    let as_client = |tls: Option<ClientTls>| NimbusClient::new(nimbus.clone(), None).with_tls(tls);
    as_client(Some(trusted)).cluster_summary().await.expect("the cluster's own client is served");
    let plain = as_client(None).cluster_summary().await;
    assert!(
        matches!(&plain, Err(ClientError::Refused { status, message, .. })
            if status.as_u16() == 400 && message.contains("HTTPS only")),
        "plain HTTP: {plain:?}"
    );
    let other_ca = client_tls(&stranger_ca.cert, Some((&operator.cert, &operator.key)));
    assert_tls_refused(as_client(Some(other_ca)).cluster_summary().await, "trusting another CA");
    let no_certificate = client_tls(&cluster_ca.cert, None);
    assert_tls_refused(as_client(Some(no_certificate)).cluster_summary().await, "without a certificate");
    let forged = client_tls(&cluster_ca.cert, Some((&impostor.cert, &impostor.key)));
    assert_tls_refused(as_client(Some(forged)).cluster_summary().await, "a certificate of another CA");

    // The CLI without the CA: refused, and it says TLS failed rather than hanging on.
    let plain_config = root.path().join("plain.yaml");
    std::fs::write(&plain_config, format!("nimbus.http.address: {nimbus}\n")).unwrap();
    let (ok, text) = squall(&["list"], &plain_config);
    assert!(!ok && text.contains("HTTPS only"), "a plain-HTTP `squall list`: {text}");
    let stranger_config = root.path().join("stranger.yaml");
    std::fs::write(
        &stranger_config,
        format!(
            "nimbus.http.address: {nimbus}\nnimbus.http.tls.ca: {}\nnimbus.http.tls.client.cert: {}\n\
             nimbus.http.tls.client.key: {}\n",
            stranger_ca.cert.display(),
            operator.cert.display(),
            operator.key.display()
        ),
    )
    .unwrap();
    let (ok, text) = squall(&["list"], &stranger_config);
    assert!(!ok && text.contains("TLS"), "`squall list` trusting another CA: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_way_tls_needs_only_the_ca_and_bad_files_are_named() {
    let root = tempfile::tempdir().unwrap();
    let ca = TestCa::new(root.path(), "ca");
    let server = ca.issue("nimbus");
    let zookeeper = ZkServer::shared().chroot("one_way_tls").await;
    let port = free_port();
    let nimbus = format!("127.0.0.1:{port}");
    let config = root.path().join("cluster.yaml");
    std::fs::write(
        &config,
        format!(
            "nimbus.http.port: {port}\nnimbus.http.address: {nimbus}\nnimbus.http.tls.cert: {}\n\
             nimbus.http.tls.key: {}\nnimbus.http.tls.ca: {}\n",
            server.cert.display(),
            server.key.display(),
            ca.cert.display()
        ),
    )
    .unwrap();
    let _processes = Processes(vec![spawn(
        root.path(),
        "nimbus",
        &daemon("nimbus", &config, &zookeeper, &root.path().join("nimbus")),
    )]);
    eventually(Duration::from_secs(60), "`squall list` over TLS", || async {
        squall(&["list"], &config).0.then_some(())
    })
    .await;
    let tls = client_tls(&ca.cert, None);
    NimbusClient::new(nimbus.clone(), None).with_tls(Some(tls)).cluster_summary().await.unwrap();
    let plain = NimbusClient::new(nimbus.clone(), None).cluster_summary().await;
    assert!(matches!(plain, Err(ClientError::Refused { .. })), "plain HTTP was answered: {plain:?}");

    // A certificate file that is not there: nimbus stops, naming the key and the path.
    let missing = root.path().join("missing.pem");
    let out = Command::new(SQUALL)
        .args(daemon("nimbus", &config, &zookeeper, &root.path().join("nimbus2")))
        .args(["-c", &format!("nimbus.http.tls.cert={}", missing.display()), "-c", "nimbus.http.port=0"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("nimbus.http.tls.cert") && text.contains(&*missing.to_string_lossy()), "{text}");
}
