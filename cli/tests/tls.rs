//! TLS on nimbus's API, with whole processes (ZooKeeper, `squall nimbus`, one `squall
//! supervisor` and its worker, `squall` verbs) and certificates made at test time:
//!
//! - under mutual TLS, `squall submit` / `squall list` with the cluster's CA and a client
//!   certificate work, and the supervisor downloads the code over TLS (its worker heartbeats);
//! - a plain-HTTP client, a client trusting another CA, a client without a certificate and one
//!   whose certificate another CA issued are all refused;
//! - one-way TLS (no client CA): a client with the CA and no certificate works, plain does not;
//! - an unreadable certificate stops nimbus with an error naming the key and the path;
//! - supervisors' and workers' `/metrics` over TLS (`supervisor.metrics.tls.*`,
//!   `worker.metrics.tls.*`) beside a plain-HTTP nimbus: HTTPS only, discovery gives each
//!   target its scheme, and a real Prometheus with the CA scrapes the mix in one job.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use cluster_state::coord::{Ensemble, SessionOptions};
use cluster_state::ids::TopologyId;
use cluster_state::paths::StormPaths;
use cluster_state::tls::{ClientTls, TlsFile};
use nimbus_client::{ClientError, NimbusClient};
use test_harness::tls::TestCa;
use test_harness::{ZkServer, eventually};

/// The daemons' fixture, shared with the other multi-process tests.
#[path = "support/cluster.rs"]
mod support;
use support::{Processes, SQUALL, daemon, free_port, spawn_logged};

const WORDCOUNT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/wordcount.yaml");

fn spawn(root: &Path, log: &str, args: &[String]) -> Child {
    spawn_logged(root, log, "info", args)
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

/// Nimbus and one supervisor (two slots) on `zookeeper`, with the test settings every story
/// shares and `settings` (YAML lines) on top. Returns nimbus's address, the config file (for
/// `squall` verbs) and the processes.
fn nimbus_and_supervisor(
    root: &Path,
    zookeeper: &str,
    settings: &str,
) -> (String, std::path::PathBuf, Processes) {
    let port = free_port();
    let nimbus = format!("127.0.0.1:{port}");
    let config = root.join("cluster.yaml");
    std::fs::write(
        &config,
        format!(
            "storm.zookeeper.session.timeout: 4000\nstorm.local.hostname: 127.0.0.1\n\
             nimbus.monitor.freq.secs: 1\nnimbus.http.port: {port}\nnimbus.http.address: {nimbus}\n\
             supervisor.monitor.frequency.secs: 1\nsupervisor.heartbeat.frequency.secs: 1\n\
             supervisor.slots.ports: [{}, {}]\n{settings}",
            free_port(),
            free_port(),
        ),
    )
    .unwrap();
    let processes = Processes(vec![
        spawn(root, "nimbus", &daemon("nimbus", &config, zookeeper, &root.join("nimbus"))),
        spawn(root, "supervisor", &daemon("supervisor", &config, zookeeper, &root.join("sup"))),
    ]);
    (nimbus, config, processes)
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
    let settings = format!(
        "nimbus.http.tls.cert: {}\nnimbus.http.tls.key: {}\nnimbus.http.tls.client.ca: {ca}\n\
         nimbus.http.tls.ca: {ca}\nnimbus.http.tls.client.cert: {}\nnimbus.http.tls.client.key: {}\n",
        server.cert.display(),
        server.key.display(),
        operator.cert.display(),
        operator.key.display(),
        ca = cluster_ca.cert.display(),
    );
    let (nimbus, config, _processes) = nimbus_and_supervisor(root.path(), &zookeeper, &settings);

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

/// `GET /metrics` on `address`: over TLS trusting `ca` when given, else plain. Returns the
/// status line and the body, or the error.
async fn get_metrics(address: &str, ca: Option<&Path>) -> std::io::Result<(String, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(address).await?;
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    let mut reply = Vec::new();
    match ca {
        Some(ca) => {
            let mut tls = client_tls(ca, None).connect(address, tcp).await?;
            tls.write_all(request.as_bytes()).await?;
            // A server that closes without close_notify ends the read with an error; what
            // arrived before it is the answer.
            let _ = tls.read_to_end(&mut reply).await;
        }
        None => {
            let mut tcp = tcp;
            tcp.write_all(request.as_bytes()).await?;
            let _ = tcp.read_to_end(&mut reply).await;
        }
    }
    let text = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Ok((head.lines().next().unwrap_or("").to_owned(), body.to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supervisors_and_workers_serve_metrics_over_tls_and_prometheus_scrapes_the_mix() {
    let root = tempfile::tempdir().unwrap();
    let ca = TestCa::new(root.path(), "metrics-ca");
    let stranger_ca = TestCa::new(root.path(), "stranger-ca");
    let supervisor_cert = ca.issue("supervisor");
    let worker_cert = ca.issue("worker");
    let zookeeper = ZkServer::shared().chroot("metrics_tls").await;
    let settings = format!(
        "supervisor.metrics.tls.cert: {}\nsupervisor.metrics.tls.key: {}\n\
         worker.metrics.tls.cert: {}\nworker.metrics.tls.key: {}\n",
        supervisor_cert.cert.display(),
        supervisor_cert.key.display(),
        worker_cert.cert.display(),
        worker_cert.key.display(),
    );
    let (nimbus, config, _processes) = nimbus_and_supervisor(root.path(), &zookeeper, &settings);
    eventually(Duration::from_secs(60), "`squall submit`", || async {
        squall(&["submit", WORDCOUNT], &config).0.then_some(())
    })
    .await;

    // Discovery: nimbus plain, the supervisor and its two workers (wordcount.yaml asks for two)
    // HTTPS, each target saying so.
    let client = NimbusClient::new(nimbus.clone(), None);
    let groups =
        eventually(Duration::from_secs(90), "nimbus, the supervisor and two workers as targets", || async {
            let groups = client.prometheus_targets().await.ok()?;
            (groups.len() == 4).then_some(groups)
        })
        .await;
    let targets = |role: &str| -> Vec<(String, Option<String>)> {
        groups
            .iter()
            .filter(|g| g.labels.get("squall_role").map(String::as_str) == Some(role))
            .map(|g| (g.targets[0].clone(), g.labels.get("__scheme__").cloned()))
            .collect()
    };
    assert_eq!(targets("nimbus"), [(nimbus.clone(), None)], "{groups:?}");
    let https: Vec<(String, &str)> = targets("supervisor")
        .into_iter()
        .map(|t| (t, "squall_supervisor_workers"))
        .chain(targets("worker").into_iter().map(|t| (t, "squall_worker_emitted_total")))
        .map(|((address, scheme), family)| {
            assert_eq!(scheme.as_deref(), Some("https"), "{address}: {groups:?}");
            (address, family)
        })
        .collect();
    assert_eq!(https.len(), 3, "{groups:?}");

    // HTTPS only: a plain scrape gets no metrics, one trusting another CA fails the handshake,
    // one with the cluster's CA gets them.
    for (address, family) in &https {
        let (status, body) = get_metrics(address, None).await.unwrap();
        assert!(
            status.contains(" 400 ") && !body.contains("squall_"),
            "plain HTTP to {address}: {status} {body}"
        );
        assert!(
            get_metrics(address, Some(&stranger_ca.cert)).await.is_err(),
            "{address} trusted by another CA"
        );
        let (status, body) = get_metrics(address, Some(&ca.cert)).await.unwrap();
        assert!(status.contains(" 200 ") && body.contains(family), "HTTPS to {address}: {status}");
    }

    // One Prometheus job, the deploy config plus the CA: all four scraped and up.
    let deploy =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/prometheus.yml")).unwrap();
    let prometheus_config = deploy
        .replace("127.0.0.1:8080", &nimbus)
        .replace("scrape_interval: 15s", "scrape_interval: 1s")
        .replace("refresh_interval: 30s", "refresh_interval: 1s")
        .replace(
            "    metrics_path: /metrics\n",
            &format!("    metrics_path: /metrics\n    tls_config:\n      ca_file: {}\n", ca.cert.display()),
        );
    assert!(prometheus_config.contains("ca_file"), "the deploy config has the keys the test adjusts");
    let prometheus = test_harness::prometheus::Prometheus::start(root.path(), &prometheus_config).unwrap();
    let active = eventually(
        Duration::from_secs(90),
        "Prometheus to scrape 4 targets over http and https, all up",
        || async {
            let reply = prometheus.get("targets?state=active")?;
            let active = reply["data"]["activeTargets"].as_array()?.clone();
            let up = active.iter().filter(|t| t["health"] == "up").count();
            (active.len() == 4 && up == 4).then_some(active)
        },
    )
    .await;
    let mut urls: Vec<String> =
        active.iter().map(|t| t["scrapeUrl"].as_str().unwrap_or("?").to_owned()).collect();
    urls.sort();
    let mut expected: Vec<String> =
        https.iter().map(|(address, _)| format!("https://{address}/metrics")).collect();
    expected.push(format!("http://{nimbus}/metrics"));
    expected.sort();
    assert_eq!(urls, expected);

    // Bad settings stop a supervisor before it binds anything, naming the key (and the file).
    let missing = root.path().join("missing.key");
    for (overrides, says) in [
        (
            vec![format!("supervisor.metrics.tls.key={}", missing.display())],
            vec!["supervisor.metrics.tls.key", "missing.key"],
        ),
        (
            vec![format!("worker.metrics.tls.cert={}", missing.display())],
            vec!["worker.metrics.tls.cert", "missing.key"],
        ),
        // The worker's key with the supervisor's certificate: no identity.
        (
            vec![format!("supervisor.metrics.tls.key={}", worker_cert.key.display())],
            vec!["supervisor.metrics.tls.cert / supervisor.metrics.tls.key", "do not make a server identity"],
        ),
    ] {
        let mut command = Command::new(SQUALL);
        command.args(daemon("supervisor", &config, &zookeeper, &root.path().join("sup2")));
        for o in &overrides {
            command.args(["-c", o]);
        }
        let out = command.output().unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{overrides:?}: {text}");
        assert!(says.iter().all(|s| text.contains(s)), "{overrides:?}: {text}");
    }
}
