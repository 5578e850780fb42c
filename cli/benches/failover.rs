//! Nimbus failover time (issue 17): real ZooKeeper (the test harness's server) and three real
//! `squall nimbus` processes with a 6 s session timeout; ten times: kill -9 the leader, time
//! until a new leader accepts a submit through `nimbus-client` with the seeds (what the CLI
//! uses), then restart the killed nimbus and let it copy the code. Prints every figure, the
//! median and the max, and the goal: median <= session timeout + 1 s.
//!
//! `cargo bench -p squall-cli --bench failover [-- ROUNDS]`. The figure is dominated by the
//! session timeout, not by code speed, so the dev build gives the same figures and builds in
//! seconds after the tests: `cargo bench -p squall-cli --bench failover --profile dev`.
//! Not a timed test: it prints figures (and exits 1 if a round fails outright).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cluster_state::api::SubmitTopology;
use cluster_state::clock::now_secs;
use cluster_state::coord::{CreateMode, Ensemble, Session, SessionOptions};
use cluster_state::ids::{SupervisorId, TopologyId};
use cluster_state::paths::StormPaths;
use cluster_state::znode::{SupervisorInfo, ZnodeData};
use nimbus_client::NimbusClient;
use test_harness::{ZkServer, eventually};
use tokio::time::Instant;

const SQUALL: &str = env!("CARGO_BIN_EXE_squall");
const SESSION_TIMEOUT: Duration = Duration::from_secs(6);
const NIMBUSES: usize = 3;

struct Nimbus {
    address: String,
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn start(config: &Path, zookeeper: &str, n: &mut Nimbus) {
    let log =
        std::fs::OpenOptions::new().create(true).append(true).open(n.dir.with_extension("log")).unwrap();
    let child = Command::new(SQUALL)
        .args(["nimbus", "--config", &config.display().to_string(), "--zookeeper", zookeeper])
        .args(["-c", &format!("storm.local.dir={}", n.dir.display())])
        .args(["-c", &format!("nimbus.http.port={}", n.port)])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    n.child = Some(child);
}

/// The leader once `count` nimbuses are registered and exactly one leads.
async fn leader(session: &Session, count: usize) -> String {
    eventually(Duration::from_secs(120), &format!("{count} nimbuses, one leader"), || async {
        let all = nimbus::leader::nimbuses(session, &StormPaths::default()).await.ok()?;
        let leaders: Vec<String> = all.iter().filter(|n| n.is_leader).map(|n| n.address()).collect();
        (all.len() == count && leaders.len() == 1).then(|| leaders[0].clone())
    })
    .await
}

async fn submit(client: &NimbusClient, name: &str) -> Result<TopologyId, nimbus_client::ClientError> {
    let file = format!(
        "name: {name}\nconfig: {{topology.workers: 1}}\nspouts:\n  - {{id: sentences, className: sentence-generator}}\n\
         bolts:\n  - {{id: split, className: split-sentence}}\n"
    );
    let upload = client.upload(file.as_bytes(), |_| {}).await?;
    let request = SubmitTopology {
        topology_upload: upload,
        worker_upload: None,
        resources_upload: None,
        inactive: false,
        owner: "bench".into(),
    };
    Ok(client.submit(&request).await?.id)
}

/// Every stored topology's code held by all nimbuses (so that any of them may lead).
async fn replicated(session: &Session, ids: &[TopologyId]) {
    let paths = StormPaths::default();
    eventually(Duration::from_secs(120), "every nimbus to hold every topology's code", || async {
        for id in ids {
            if session.children(&paths.blobstore_topology(id)).await.ok()?.len() < NIMBUSES {
                return None;
            }
        }
        Some(())
    })
    .await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: usize =
        std::env::args().skip(1).find(|a| !a.starts_with('-')).and_then(|a| a.parse().ok()).unwrap_or(10);
    let server = ZkServer::start();
    let zookeeper = server.chroot("failover-bench").await;
    let root = tempfile::tempdir().unwrap();
    let mut nimbuses: Vec<Nimbus> = (0..NIMBUSES)
        .map(|i| {
            let port = free_port();
            Nimbus {
                address: format!("127.0.0.1:{port}"),
                port,
                dir: root.path().join(format!("n{i}")),
                child: None,
            }
        })
        .collect();
    let seeds: Vec<String> = nimbuses.iter().map(|n| n.address.clone()).collect();
    let config = root.path().join("cluster.yaml");
    std::fs::write(
        &config,
        format!(
            "storm.zookeeper.session.timeout: {}\nstorm.local.hostname: 127.0.0.1\nnimbus.monitor.freq.secs: 1\n\
             nimbus.http.host: 127.0.0.1\nnimbus.seeds: [{}]\n",
            SESSION_TIMEOUT.as_millis(),
            seeds.join(", ")
        ),
    )
    .unwrap();
    let session = Ensemble::zookeeper(zookeeper.clone()).connect(&SessionOptions::default()).await.unwrap();
    let supervisor = SupervisorInfo {
        time_secs: now_secs(),
        hostname: "127.0.0.1".into(),
        supervisor_id: SupervisorId::new("bench").unwrap(),
        used_ports: vec![],
        all_ports: vec![6700],
        uptime_secs: 1,
        version: "0".into(),
        metrics_endpoint: None,
        metrics_scheme: cluster_state::znode::MetricsScheme::Http,
    };
    let path = StormPaths::default().supervisor(&supervisor.supervisor_id);
    session.create(&path, &supervisor.encode(), CreateMode::Persistent.with_parents()).await.unwrap();
    for n in &mut nimbuses {
        start(&config, &zookeeper, n);
    }
    let client = NimbusClient::with_seeds(seeds, None);
    let mut ids = vec![submit(&client, "warmup").await.unwrap()];
    replicated(&session, &ids).await;

    println!(
        "nimbus failover: {NIMBUSES} nimbuses, session timeout {} s, {rounds} kills of the leader",
        SESSION_TIMEOUT.as_secs()
    );
    let mut figures = Vec::new();
    for round in 1..=rounds {
        let current = leader(&session, NIMBUSES).await;
        let victim = nimbuses.iter_mut().find(|n| n.address == current).unwrap();
        let mut child = victim.child.take().unwrap();
        child.kill().unwrap(); // SIGKILL
        let killed = Instant::now();
        child.wait().unwrap();
        let id = match submit(&client, &format!("round-{round}")).await {
            Ok(id) => id,
            Err(e) => {
                eprintln!("round {round}: no leader accepted the submit: {e}");
                std::process::exit(1);
            }
        };
        let took = killed.elapsed();
        println!(
            "round {round:2}: {:6.2} s (leader {current} killed, {} accepted)",
            took.as_secs_f64(),
            client.current()
        );
        figures.push(took);
        ids.push(id);
        start(&config, &zookeeper, victim);
        leader(&session, NIMBUSES).await;
        replicated(&session, &ids).await;
    }
    for n in &mut nimbuses {
        if let Some(mut child) = n.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    figures.sort();
    let median = if figures.len() % 2 == 1 {
        figures[figures.len() / 2]
    } else {
        (figures[figures.len() / 2 - 1] + figures[figures.len() / 2]) / 2
    };
    let max = figures.last().copied().unwrap_or_default();
    let goal = SESSION_TIMEOUT + Duration::from_secs(1);
    println!(
        "median {:.2} s, max {:.2} s; goal: median <= session timeout + 1 s = {:.0} s: {}",
        median.as_secs_f64(),
        max.as_secs_f64(),
        goal.as_secs_f64(),
        if median <= goal { "met" } else { "NOT met" }
    );
}
