//! A real multi-process cluster on this machine: ZooKeeper (the harness), `squall nimbus` and two
//! `squall supervisor` processes with their own ports and dirs, all configured by one cluster
//! config file (plus `-c` overrides), and the operator verbs run as `squall` commands.
//!
//! The word count runs on both supervisors; a worker killed with SIGKILL is restarted by its
//! supervisor; a rebalance changes the worker count while tuples keep flowing; a supervisor
//! killed with its workers loses only its executors to the other supervisor once
//! `nimbus.supervisor.timeout.secs` passed; `kill -w 5` completes across a nimbus restart and
//! leaves no znode or code dir of the topology; a bad topology file changes nothing; a
//! supervisor whose local state file is corrupt starts anyway; and with three nimbuses (HA) a
//! kill -9 of the leader hands the leadership over within the session timeout + 2 s without
//! touching a worker, while delayed kills and rebalances complete at their deadlines; a leader
//! paused (SIGSTOP) past its session timeout writes nothing after (ZooKeeper's transaction log
//! says who wrote what) and rejoins as a follower once resumed.
//!
//! Every [`Cluster`] runs with ZooKeeper authentication on (`storm.zookeeper.auth.*`, issue
//! #16): its processes, its workers, the `squall` verbs and the test's own session all use the
//! cluster's digest credentials, and Storm's layout is closed to anyone else.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cluster_state::api::{ClusterSummary, Route};
use cluster_state::clock::now_secs;
use cluster_state::coord::{Ensemble, Session, SessionOptions};
use cluster_state::ids::{ExecutorId, SupervisorId, TopologyId, WorkerSlot};
use cluster_state::paths::StormPaths;
use cluster_state::znode::{Assignment, StormBase, SupervisorInfo, WorkerHeartbeat, ZnodeData};
use test_harness::ZkServer;
use test_harness::eventually;
use test_harness::prometheus::{Prometheus, encode};

/// The Kafka-protocol broker of the end-to-end tests (tansu), shared with kafka-spout's tests.
#[path = "../../kafka-spout/tests/support/tansu.rs"]
mod tansu;
/// Steady input and output arrival times, shared with kafka-spout's fault stories.
#[path = "../../kafka-spout/tests/support/traffic.rs"]
mod traffic;

/// The cluster fixture, shared with `ui.rs`.
#[path = "support/cluster.rs"]
mod support;
use support::{Cluster, SQUALL, free_port, kill9, pids_mentioning, text};

async fn assignment(session: &Session, id: &TopologyId) -> Option<Assignment> {
    session.read::<Assignment>(&StormPaths::default().assignment(id)).await.ok().map(|(a, _)| a)
}

/// The worker on `slot`'s start time and acked count, as its workerbeat node says.
async fn acked(session: &Session, id: &TopologyId, slot: &WorkerSlot) -> (u64, u64) {
    let beat = session.read::<WorkerHeartbeat>(&StormPaths::default().workerbeat(id, slot)).await.ok();
    beat.map_or((0, 0), |(b, _)| (b.start_time_secs, b.executor_stats.iter().map(|s| s.acked).sum()))
}

/// Waits until every slot of the assignment runs a worker that acks new tuples: more than the
/// slot's node said before, or any for a worker started since (a rebalance replaces workers,
/// whose counters start again from 0).
async fn flowing(session: &Session, id: &TopologyId, what: &str) -> Assignment {
    let a = assignment(session, id).await.unwrap();
    let before: BTreeMap<WorkerSlot, (u64, u64)> = {
        let mut m = BTreeMap::new();
        for slot in a.slots() {
            m.insert(slot.clone(), acked(session, id, &slot).await);
        }
        m
    };
    for (slot, (started, was)) in &before {
        // A worker rewrites its node at most once a minute (squall.workerbeats.zk.secs), and
        // a new one first writes at once, with nothing acked yet.
        eventually(
            Duration::from_secs(150),
            &format!("{what}: the worker on port {} to ack tuples", slot.port),
            || async {
                let (start, now) = acked(session, id, slot).await;
                (now > *was || (start != *started && now > 0)).then_some(())
            },
        )
        .await;
    }
    a
}

/// A Kafka copy topology: `<name>-in` -> kafka spout -> kafka bolt -> `<name>-out`, group
/// `<name>`, one worker per spout task, fast commits and rebalances.
struct KafkaCopy {
    name: &'static str,
    parallelism: u32,
    pending: u32,
    timeout_secs: Option<u64>,
}

/// Writes the [`KafkaCopy`] topology file into the cluster's dir; returns its path.
fn kafka_copy_topology(cluster: &Cluster, broker: &tansu::Tansu, copy: KafkaCopy) -> PathBuf {
    let KafkaCopy { name, parallelism, pending, timeout_secs } = copy;
    let timeout = timeout_secs.map(|t| format!("  topology.message.timeout.secs: {t}\n")).unwrap_or_default();
    let path = cluster.dir(&format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "name: {name}\n\
             config:\n  topology.workers: {parallelism}\n  topology.max.spout.pending: {pending}\n{timeout}\
             spouts:\n  - id: kafka\n    className: kafka-spout\n    parallelism: {parallelism}\n    params:\n\
             \x20     bootstrap_servers: \"{bootstrap}\"\n      topics: [{name}-in]\n      group_id: {name}\n\
             \x20     auto_offset_reset: smallest\n      zookeeper_connect: \"{zk}\"\n\
             \x20     offsets_commit_interval_ms: 200\n\
             \x20     registry: {{zookeeper_session_timeout_ms: 4000, rebalance_backoff_ms: 200}}\n\
             \x20     librdkafka: {{fetch.wait.max.ms: \"10\"}}\n\
             bolts:\n  - id: out\n    className: kafka-bolt\n    parallelism: {parallelism}\n    params:\n\
             \x20     bootstrap_servers: \"{bootstrap}\"\n      topic: {name}-out\n      key_field: key\n      value_field: value\n\
             streams:\n  - from: kafka\n    to: out\n    grouping: {{type: SHUFFLE}}\n",
            bootstrap = broker.bootstrap(),
            zk = cluster.zookeeper,
        ),
    )
    .unwrap();
    path
}

/// The supervisor ids, by their first port.
async fn supervisors(session: &Session, count: usize) -> BTreeMap<u16, SupervisorId> {
    eventually(Duration::from_secs(60), "the supervisors to register", || async {
        let paths = StormPaths::default();
        let mut found = BTreeMap::new();
        for child in session.children(&paths.supervisors_dir()).await.ok()? {
            let (info, _) =
                session.read::<SupervisorInfo>(&paths.supervisor(&child.parse().ok()?)).await.ok()?;
            found.insert(*info.all_ports.iter().min()?, info.supervisor_id);
        }
        (found.len() == count).then_some(found)
    })
    .await
}

/// What runs on `node`: executor, port and start time.
fn on(a: &Assignment, node: &SupervisorId) -> BTreeSet<(ExecutorId, u16, u64)> {
    a.executors.iter().filter(|e| &e.node == node).map(|e| (e.executor, e.port, e.start_time_secs)).collect()
}

fn worker_dirs(local: &Path) -> BTreeSet<String> {
    std::fs::read_dir(local.join("workers"))
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_runs_recovers_rebalances_and_kills_across_a_nimbus_restart() {
    let mut cluster = Cluster::new("cluster_lifecycle").await;
    let (a_ports, b_ports) = ([free_port(), free_port()], [free_port(), free_port()]);
    cluster.start_nimbus();
    cluster.start_supervisor("sup-a", &a_ports);
    cluster.start_supervisor("sup-b", &b_ports);
    let session = cluster.session().await;
    let paths = StormPaths::default();
    let sups = supervisors(&session, 2).await;
    let (sup_a, sup_b) = (
        sups[&a_ports.iter().copied().min().unwrap()].clone(),
        sups[&b_ports.iter().copied().min().unwrap()].clone(),
    );
    // ZooKeeper authentication is on: a session without the credentials reads nothing.
    let anonymous =
        Ensemble::zookeeper(cluster.zookeeper.clone()).connect(&SessionOptions::default()).await.unwrap();
    let refused = anonymous.children(&paths.supervisors_dir()).await;
    assert!(matches!(refused, Err(cluster_state::coord::Error::NoAuth { .. })), "{refused:?}");
    drop(anonymous);

    // A bad topology file is refused before anything is uploaded; nothing is written.
    let bad = cluster.dir("bad.yaml");
    std::fs::write(&bad, "name: wordcount\nspouts:\n  - id: s\n    className: no-such-spout\n").unwrap();
    let refused = cluster.squall(&["submit", bad.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("line 4") && text(&refused).contains("no-such-spout"),
        "{}",
        text(&refused)
    );

    // Submit word count with 4 workers: it runs on both supervisors.
    let example =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/wordcount.yaml"))
            .unwrap();
    let file = cluster.dir("wordcount.yaml");
    // `flowing` watches acks in the workerbeat nodes: written every second here rather than
    // at most once a minute (squall.workerbeats.zk.secs' default).
    let example =
        example.replace("topology.workers: 2", "topology.workers: 4\n  squall.workerbeats.zk.secs: 1");
    std::fs::write(&file, example).unwrap();
    let submitted = eventually(Duration::from_secs(60), "nimbus to take the submit", || async {
        let out = cluster.squall(&["submit", file.to_str().unwrap()]);
        out.status.success().then(|| text(&out))
    })
    .await;
    assert!(session.children(&paths.storms_dir()).await.unwrap().len() == 1, "the bad file wrote nothing");
    let id: TopologyId =
        submitted.split(" as ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    let first = eventually(Duration::from_secs(60), "an assignment over 4 slots", || async {
        assignment(&session, &id).await.filter(|a| a.slots().len() == 4)
    })
    .await;
    assert!(!on(&first, &sup_a).is_empty() && !on(&first, &sup_b).is_empty(), "on both supervisors");
    flowing(&session, &id, "after submit").await;
    let list = cluster.squall(&["list"]);
    let row = text(&list)
        .lines()
        .find(|l| l.starts_with("wordcount"))
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>());
    assert_eq!(
        row.as_ref().map(|r| (r[1].as_str(), r[3].as_str())),
        Some(("ACTIVE", "4")),
        "{}",
        text(&list)
    );

    // kill -9 one worker of supervisor A: A starts another one; tuples flow again.
    let a_local = cluster.dir("sup-a");
    let victim = worker_dirs(&a_local).into_iter().next().unwrap();
    assert!(kill9(&victim) > 0, "worker {victim} was running");
    eventually(Duration::from_secs(60), "supervisor A to replace the killed worker", || async {
        let dirs = worker_dirs(&a_local);
        (!dirs.contains(&victim) && dirs.len() == 2).then_some(())
    })
    .await;
    flowing(&session, &id, "after the worker restart").await;

    // Rebalance to 2 workers: the topology keeps running, on one slot per supervisor.
    let out = cluster.squall(&["rebalance", "wordcount", "-w", "1", "-n", "2"]);
    assert!(out.status.success(), "{}", text(&out));
    let two = eventually(Duration::from_secs(60), "the rebalance to 2 workers", || async {
        assignment(&session, &id).await.filter(|a| a.slots().len() == 2)
    })
    .await;
    assert!(!on(&two, &sup_a).is_empty() && !on(&two, &sup_b).is_empty(), "spread over both");
    flowing(&session, &id, "after the rebalance").await;
    let two = assignment(&session, &id).await.unwrap();

    // kill -9 supervisor B with its workers: after nimbus.supervisor.timeout.secs only B's
    // executors move, to A's free slot; A's executors keep their slot and start time.
    let killed = kill9(&cluster.dir("sup-b").display().to_string());
    assert!(killed >= 2, "supervisor B and its worker were running ({killed} processes)");
    let moved = eventually(Duration::from_secs(60), "B's executors to move to A", || async {
        assignment(&session, &id).await.filter(|a| on(a, &sup_b).is_empty())
    })
    .await;
    assert_eq!(on(&moved, &sup_a).len(), moved.executors.len(), "everything on A now");
    assert!(on(&two, &sup_a).is_subset(&on(&moved, &sup_a)), "A's executors did not move");
    assert_eq!(moved.slots().len(), 2);
    flowing(&session, &id, "after supervisor B died").await;

    // kill -w 5, and nimbus dies and restarts during the wait: the kill still completes.
    let out = cluster.squall(&["kill", "wordcount", "-w", "5"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        kill9(&format!("storm.local.dir={}", cluster.dir("nimbus").display())) == 1,
        "nimbus was running"
    );
    cluster.start_nimbus();
    let nimbus_code = cluster.dir("nimbus").join("nimbus/stormdist").join(id.as_str());
    let supervisor_code = a_local.join("stormdist").join(id.as_str());
    eventually(Duration::from_secs(60), "every trace of the topology to go", || async {
        let gone = |p: String| {
            let session = &session;
            async move { session.exists(&p).await.unwrap().is_none() }
        };
        let znodes = gone(paths.storm(&id)).await
            && gone(paths.assignment(&id)).await
            && gone(paths.workerbeats_topology(&id)).await
            && gone(paths.errors_topology(&id)).await;
        (znodes && !nimbus_code.exists() && !supervisor_code.exists() && worker_dirs(&a_local).is_empty())
            .then_some(())
    })
    .await;
    let list = cluster.squall(&["list"]);
    assert!(text(&list).contains("No topologies running."), "{}", text(&list));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_with_a_corrupt_state_file_starts_and_registers() {
    let mut cluster = Cluster::new("cluster_corrupt_state").await;
    let state = cluster.dir("sup-c").join("supervisor/state");
    std::fs::create_dir_all(state.parent().unwrap()).unwrap();
    std::fs::write(&state, b"\x00\x01 not a supervisor state \xff").unwrap();
    cluster.start_supervisor("sup-c", &[free_port(), free_port()]);
    let session = cluster.session().await;
    supervisors(&session, 1).await;
    let log = std::fs::read_to_string(cluster.dir("sup-c.log")).unwrap();
    assert!(log.contains("starting with an empty supervisor state"), "{log}");
    // The state file was rebuilt: it is valid again (a restart reads it without complaint).
    assert_ne!(std::fs::read(&state).unwrap(), b"\x00\x01 not a supervisor state \xff");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deploy_script_starts_and_stops_a_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().display().to_string();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/local-cluster.sh");
    let nimbus_port = free_port();
    let env = [
        ("SQUALL", SQUALL.to_owned()),
        ("ZK_PORT", free_port().to_string()),
        ("NIMBUS_PORT", nimbus_port.to_string()),
        ("NIMBUS2_PORT", free_port().to_string()),
        ("SLOTS_A", format!("{},{}", free_port(), free_port())),
        ("SLOTS_B", format!("{},{}", free_port(), free_port())),
    ];
    let run = |verb: &str| {
        let out = Command::new("bash").arg(&script).args([verb, &marker]).envs(env.clone()).output().unwrap();
        assert!(out.status.success(), "{verb}: {}", text(&out));
        text(&out)
    };
    struct Stop<'a>(&'a dyn Fn(&str) -> String);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            (self.0)("stop");
        }
    }
    let started = run("start");
    let _stop = Stop(&run);
    assert!(started.contains("started nimbus") && started.contains("started supervisor-b"), "{started}");
    assert!(started.contains("started nimbus-2"), "{started}");
    let nimbus = format!("127.0.0.1:{nimbus_port}");
    eventually(Duration::from_secs(60), "two supervisors in the cluster summary", || async {
        let out = Command::new(SQUALL).args(["list", "--nimbus", &nimbus]).output().unwrap();
        let summary = squall_summary(&nimbus).await?;
        (out.status.success() && summary.supervisors == 2).then_some(())
    })
    .await;
    // Two nimbuses, one leading; the generated config's seeds reach them.
    let config = dir.path().join("cluster.yaml").display().to_string();
    eventually(Duration::from_secs(60), "two nimbuses, one leader, in nimbus-summary", || async {
        let out = Command::new(SQUALL).args(["nimbus-summary", "--config", &config]).output().unwrap();
        let lines = text(&out);
        let rows: Vec<&str> = lines.lines().filter(|l| l.starts_with("127.0.0.1:")).collect();
        let leaders = rows.iter().filter(|l| l.contains("Leader") && !l.contains("Not")).count();
        (out.status.success() && rows.len() == 2 && leaders == 1).then_some(())
    })
    .await;
    assert!(run("status").contains("supervisor-a: running"));
    drop(_stop);
    let status = run("status");
    assert!(status.contains("nimbus: stopped") && status.contains("zookeeper: stopped"), "{status}");
    assert!(status.contains("nimbus-2: stopped"), "{status}");
    eventually(Duration::from_secs(10), "every process of the cluster to exit", || async {
        pids_mentioning(&marker).is_empty().then_some(())
    })
    .await;
}

/// nimbus's cluster summary over a plain HTTP/1.0 request.
async fn squall_summary(nimbus: &str) -> Option<ClusterSummary> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(nimbus).await.ok()?;
    let request = format!("GET {} HTTP/1.0\r\nHost: n\r\n\r\n", Route::ClusterSummary.path());
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await.ok()?;
    let body = text.split_once("\r\n\r\n")?.1;
    cluster_state::api::decode_response(body.as_bytes()).ok()
}

/// Every `expr` of the dashboard's panels, with its variables given values that select all.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/squall-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            let expr =
                expr.replace("$topology", ".*").replace("$group", ".*").replace("$__rate_interval", "30s");
            queries.push((panel["title"].as_str().unwrap().to_owned(), expr));
        }
    }
    queries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_finds_every_process_and_every_dashboard_query_has_data() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let mut cluster = Cluster::new("cluster_prometheus").await;
    cluster.start_nimbus();
    cluster.start_supervisor("sup-a", &[free_port(), free_port()]);
    cluster.start_supervisor("sup-b", &[free_port(), free_port()]);
    let session = cluster.session().await;
    supervisors(&session, 2).await;

    // Kafka: librdkafka's mock cluster in this process, on a loopback port the workers reach;
    // fed sentences while the test runs.
    let kafka = rdkafka::mocking::MockCluster::new(1).unwrap();
    kafka.create_topic("sentences", 4, 1).unwrap();
    let producer: BaseProducer =
        rdkafka::ClientConfig::new().set("bootstrap.servers", kafka.bootstrap_servers()).create().unwrap();
    let feeding = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let feeder = std::thread::spawn({
        let feeding = feeding.clone();
        move || {
            let mut k = 0u64;
            while feeding.load(std::sync::atomic::Ordering::Relaxed) {
                let sentence = format!("the quick squall number {k} jumps over the lazy storm");
                let _ = producer.send(BaseRecord::to("sentences").key(&k.to_string()).payload(&sentence));
                producer.poll(Duration::ZERO);
                k += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = producer.flush(Duration::from_secs(5));
        }
    });

    let topology = cluster.dir("kafka.yaml");
    std::fs::write(
        &topology,
        format!(
            "name: lagwatch\nconfig: {{topology.workers: 2, topology.max.spout.pending: 500}}\n\
             spouts:\n  - id: kafka\n    className: kafka-spout\n    parallelism: 2\n    params:\n      \
             bootstrap_servers: \"{}\"\n      topics: [sentences]\n      group_id: prom-group\n      \
             auto_offset_reset: smallest\n      offsets_commit_interval_ms: 500\n      zookeeper_connect: \"{}\"\n\
             bolts:\n  - id: split\n    className: split-sentence\n    parallelism: 2\n    params: {{field: value}}\n  \
             - id: count\n    className: word-count\n    parallelism: 2\n\
             streams:\n  - {{from: kafka, to: split, grouping: {{type: SHUFFLE}}}}\n  \
             - {{from: split, to: count, grouping: {{type: FIELDS, args: [word]}}}}\n",
            kafka.bootstrap_servers(),
            cluster.zookeeper
        ),
    )
    .unwrap();
    let submitted = eventually(Duration::from_secs(60), "nimbus to take the submit", || async {
        let out = cluster.squall(&["submit", topology.to_str().unwrap()]);
        out.status.success().then(|| text(&out))
    })
    .await;
    let id: TopologyId =
        submitted.split(" as ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    eventually(Duration::from_secs(60), "both workers", || async {
        assignment(&session, &id).await.filter(|a| a.slots().len() == 2)
    })
    .await;
    flowing(&session, &id, "kafka word count").await;

    // Prometheus with the deploy config, pointed at this cluster's nimbus, scraping every second.
    let nimbus_port: u16 = std::fs::read_to_string(&cluster.config)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("nimbus.http.port: "))
        .unwrap()
        .parse()
        .unwrap();
    let deploy =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus.yml"))
            .unwrap();
    let config = deploy
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{nimbus_port}"))
        .replace("scrape_interval: 15s", "scrape_interval: 1s")
        .replace("refresh_interval: 30s", "refresh_interval: 1s");
    assert_ne!(config, deploy, "the deploy config has the keys the test adjusts");
    let prometheus = Prometheus::start(&cluster.dir(""), &config).unwrap();

    // Discovery: nimbus, two supervisors and two workers, all scraped and up.
    let targets = eventually(Duration::from_secs(90), "Prometheus to scrape 5 targets, all up", || async {
        let reply = prometheus.get("targets?state=active")?;
        let active = reply["data"]["activeTargets"].as_array()?.clone();
        let up = active.iter().filter(|t| t["health"] == "up").count();
        (active.len() == 5 && up == 5).then_some(active)
    })
    .await;
    let roles: BTreeSet<String> =
        targets.iter().map(|t| t["labels"]["squall_role"].as_str().unwrap_or("?").to_owned()).collect();
    assert_eq!(roles, ["nimbus", "supervisor", "worker"].map(str::to_owned).into_iter().collect());

    // Every query of every dashboard panel returns at least one series.
    for (panel, query) in dashboard_queries() {
        eventually(Duration::from_secs(90), &format!("panel {panel:?}: {query}"), || async {
            let reply = prometheus.get(&format!("query?query={}", encode(&query)))?;
            let series = reply["data"]["result"].as_array()?.len();
            (reply["status"] == "success" && series > 0).then_some(())
        })
        .await;
    }

    // Queries written for kafka_exporter and Burrow dashboards find Squall's group (nimbus
    // evaluates every group under /consumers, issue 15).
    for query in [
        r#"sum by (topic) (kafka_consumergroup_lag{consumergroup="prom-group"})"#,
        r#"kafka_consumergroup_members{consumergroup="prom-group"}"#,
        r#"kafka_topic_partition_current_offset{topic="sentences"}"#,
        r#"max by (topic) (burrow_kafka_consumer_partition_lag{consumer_group="prom-group"})"#,
        r#"burrow_kafka_consumer_status{consumer_group="prom-group"}"#,
    ] {
        eventually(Duration::from_secs(90), &format!("kafka_exporter / Burrow query {query}"), || async {
            let reply = prometheus.get(&format!("query?query={}", encode(query)))?;
            (reply["status"] == "success" && !reply["data"]["result"].as_array()?.is_empty()).then_some(())
        })
        .await;
    }
    // The deploy config keeps Prometheus' default `honor_labels: false`: no target label may
    // clash with a series label, or Prometheus renames it `exported_*` (as `topology` was).
    assert!(!deploy.contains("honor_labels"), "the test is about Prometheus' defaults");
    let every = format!("series?match[]={}", encode(r#"{job="squall"}"#));
    let series = prometheus.get(&every).unwrap();
    let renamed: BTreeSet<String> = series["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s.as_object())
        .flat_map(|labels| labels.keys().filter(|k| k.starts_with("exported_")).cloned().collect::<Vec<_>>())
        .collect();
    assert!(renamed.is_empty(), "labels renamed by Prometheus: {renamed:?}");

    // The dashboard's variables (`label_values(metric, label)`) have values to choose from.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/squall-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        let Some(definition) = variable["definition"].as_str() else { continue };
        let inner = definition.strip_prefix("label_values(").and_then(|d| d.strip_suffix(')')).unwrap();
        let (metric, label) = inner.split_once(", ").unwrap();
        let path = format!("label/{label}/values?match[]={}", encode(metric));
        eventually(Duration::from_secs(60), &format!("values of variable {}", variable["name"]), || async {
            let reply = prometheus.get(&path)?;
            (!reply["data"].as_array()?.is_empty()).then_some(())
        })
        .await;
    }

    // promtool accepts every process's /metrics.
    for target in &targets {
        let url = target["scrapeUrl"].as_str().unwrap();
        let address = url.trim_start_matches("http://").split('/').next().unwrap();
        let page = squall_metrics_page(address).await;
        if let Err(problems) = test_harness::promtool::check_metrics(&page) {
            panic!("promtool check metrics on {url}: {problems}");
        }
    }
    feeding.store(false, std::sync::atomic::Ordering::Relaxed);
    feeder.join().unwrap();
}

/// A process's `/metrics` page.
async fn squall_metrics_page(address: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes()).await.unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    text.split_once("\r\n\r\n").unwrap().1.to_owned()
}

/// issue 12: kill -9 of a supervisor with its workers while a Kafka topology ingests 8
/// partitions on two supervisors: the survivors take the dead tasks' partitions when their
/// sessions expire, then hand some back (drained) to the tasks restarted in the survivor's free
/// slots. No input partition goes without output for longer than
/// `nimbus.supervisor.timeout.secs` + 10 s (the hand-back used to wait 29 s for tuples whose
/// trees went through the dead worker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_partitions_keep_flowing_when_a_supervisor_dies_with_its_workers() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    const SUPERVISOR_TIMEOUT_SECS: u64 = 5; // the cluster config's nimbus.supervisor.timeout.secs
    let broker = tokio::task::block_in_place(|| {
        let broker = tansu::Tansu::start();
        broker.create_topic("ingest-in", 8);
        broker.create_topic("ingest-out", 8);
        broker
    });
    let mut cluster = Cluster::new("kafka_supervisor_dies").await;
    cluster.start_nimbus();
    let ports: Vec<u16> = (0..8).map(|_| free_port()).collect();
    cluster.start_supervisor("sup-a", &ports[..4]);
    cluster.start_supervisor("sup-b", &ports[4..]);
    let session = cluster.session().await;
    let sups = supervisors(&session, 2).await;
    let first = |ports: &[u16]| *ports.iter().min().unwrap();
    let (sup_a, sup_b) = (sups[&first(&ports[..4])].clone(), sups[&first(&ports[4..])].clone());
    let topology = kafka_copy_topology(
        &cluster,
        &broker,
        KafkaCopy { name: "ingest", parallelism: 4, pending: 500, timeout_secs: None },
    );
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let producing = traffic::produce_paced(broker.bootstrap(), "ingest-in", 8, 200, next, stop.clone());
    let reading = traffic::record_arrivals(broker.bootstrap(), "ingest-out", 8, stop.clone(), seen.clone());
    let out = cluster.squall(&["submit", &topology.display().to_string()]);
    assert!(out.status.success(), "submit: {}", text(&out));
    // Flowing from every partition, with executors on both supervisors.
    let flowing_since = std::time::Instant::now();
    eventually(Duration::from_secs(120), "output from every input partition", || async {
        let recent: BTreeSet<u64> = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, at)| at.elapsed() < Duration::from_secs(2) && *at > flowing_since)
            .map(|(n, _)| n % 8)
            .collect();
        (recent.len() == 8).then_some(())
    })
    .await;
    let id = session.children(&StormPaths::default().storms_dir()).await.unwrap().pop().unwrap();
    let id: TopologyId = id.parse().unwrap();
    let before = assignment(&session, &id).await.unwrap();
    assert!(!on(&before, &sup_b).is_empty() && !on(&before, &sup_a).is_empty(), "spread over both");

    let killed = kill9(&cluster.dir("sup-b").display().to_string());
    assert!(killed >= 2, "supervisor B and its workers were running ({killed} processes)");
    let killed_at = std::time::Instant::now();
    // Everything moves to A, and the restarted tasks take their partitions back.
    eventually(Duration::from_secs(90), "B's executors to move to A", || async {
        let a = assignment(&session, &id).await?;
        on(&a, &sup_b).is_empty().then_some(())
    })
    .await;
    // Watch the flow for long enough to see the hand-back: the window the bound is about.
    let window = Duration::from_secs(SUPERVISOR_TIMEOUT_SECS + 30);
    eventually(Duration::from_secs(120), "the observation window to pass", || async {
        (killed_at.elapsed() >= window).then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    producing.join().unwrap();
    reading.join().unwrap();
    let seen = seen.lock().unwrap();
    let end = killed_at + window;
    let bound = Duration::from_secs(SUPERVISOR_TIMEOUT_SECS + 10);
    let mut worst = Duration::ZERO;
    for partition in 0..8u64 {
        let mut times: Vec<std::time::Instant> = seen
            .iter()
            .filter(|(n, at)| n % 8 == partition && *at >= killed_at && *at <= end)
            .map(|(_, at)| *at)
            .collect();
        times.sort();
        let mut last = killed_at;
        let mut longest = Duration::ZERO;
        for at in times.iter().chain(std::iter::once(&end)) {
            longest = longest.max(at.saturating_duration_since(last));
            last = *at;
        }
        println!("partition {partition}: longest without output after the kill {longest:?}");
        assert!(
            longest <= bound,
            "partition {partition} delivered nothing for {longest:?} (bound {bound:?})"
        );
        worst = worst.max(longest);
    }
    println!("supervisor kill -9: worst partition gap {worst:?} (bound {bound:?})");
}

/// Issue 15, the replay story on a real cluster with a real broker: a live group cannot be
/// reset; `deactivate` empties the group (`/ids`) within the message timeout; a reset to the
/// earliest offsets and `activate` deliver every message again; `squall replay` does all of it
/// in one command, and the topology keeps running afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deactivate_reset_activate_and_squall_replay_deliver_every_message_again() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    const MESSAGES: u64 = 400;
    let broker = tokio::task::block_in_place(|| {
        let broker = tansu::Tansu::start();
        broker.create_topic("replay-in", 4);
        broker.create_topic("replay-out", 4);
        broker
    });
    let mut cluster = Cluster::new("replay_story").await;
    cluster.start_nimbus();
    cluster.start_supervisor("sup-a", &[free_port(), free_port()]);
    let session = cluster.session().await;
    supervisors(&session, 1).await;
    let topology = kafka_copy_topology(
        &cluster,
        &broker,
        KafkaCopy { name: "replay", parallelism: 2, pending: 200, timeout_secs: Some(10) },
    );
    let (produced, producing_stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let producing = traffic::produce_paced(
        broker.bootstrap(),
        "replay-in",
        4,
        2000,
        produced.clone(),
        producing_stop.clone(),
    );
    eventually(Duration::from_secs(60), "the input to be produced", || async {
        (produced.load(Ordering::SeqCst) >= MESSAGES).then_some(())
    })
    .await;
    producing_stop.store(true, Ordering::Relaxed);
    producing.join().unwrap();
    let produced = produced.load(Ordering::SeqCst);
    let (stop, seen) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Vec::new())));
    let reading = traffic::record_arrivals(broker.bootstrap(), "replay-out", 4, stop.clone(), seen.clone());
    let out = cluster.squall(&["submit", &topology.display().to_string()]);
    assert!(out.status.success(), "submit: {}", text(&out));
    // Every number delivered at least `times` times.
    let delivered = |times: usize| {
        let seen = seen.clone();
        move || {
            let seen = seen.clone();
            async move {
                let mut counts = BTreeMap::<u64, usize>::new();
                for (n, _) in seen.lock().unwrap().iter() {
                    *counts.entry(*n).or_default() += 1;
                }
                (0..produced).all(|n| counts.get(&n).is_some_and(|c| *c >= times)).then_some(())
            }
        }
    };
    eventually(Duration::from_secs(120), "every message delivered once", delivered(1)).await;
    let ids = || async { session.children("/consumers/replay/ids").await.unwrap_or_default() };
    assert_eq!(ids().await.len(), 2, "both spout tasks are members");
    let reset = ["offsets", "reset", "--group", "replay", "--topic", "replay-in", "--to-earliest"];
    let connection = ["--zookeeper", cluster.zookeeper.as_str(), "--brokers", &broker.bootstrap()];
    let live = cluster.squall(&[&reset[..], &connection[..], &["--execute"]].concat());
    assert!(!live.status.success(), "a reset of a live group is refused: {}", text(&live));
    assert!(text(&live).contains("live member"), "{}", text(&live));

    let out = cluster.squall(&["deactivate", "replay"]);
    assert!(out.status.success(), "deactivate: {}", text(&out));
    let deactivated = std::time::Instant::now();
    eventually(Duration::from_secs(30), "the group to have no members after deactivate", || async {
        ids().await.is_empty().then_some(())
    })
    .await;
    let left_in = deactivated.elapsed();
    assert!(left_in < Duration::from_secs(10 + 5), "left after {left_in:?} (message timeout 10 s)");
    let out = cluster.squall(&[&reset[..], &connection[..], &["--execute"]].concat());
    assert!(out.status.success(), "reset after deactivate: {}", text(&out));
    let out = cluster.squall(&["activate", "replay"]);
    assert!(out.status.success(), "activate: {}", text(&out));
    eventually(Duration::from_secs(120), "every message delivered again", delivered(2)).await;

    let out = cluster.squall(&["replay", "replay", "--to-earliest"]);
    assert!(out.status.success(), "replay: {}", text(&out));
    assert!(text(&out).contains("no members"), "{}", text(&out));
    eventually(Duration::from_secs(120), "every message delivered a third time", delivered(3)).await;
    eventually(Duration::from_secs(30), "both tasks to be members again", || async {
        (ids().await.len() == 2).then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    reading.join().unwrap();
    println!("deactivate emptied the group in {left_in:?}; {produced} messages delivered three times");
}

impl Cluster {
    /// Nimbuses named `names`, each on a port of its own, all of them the cluster's
    /// `nimbus.seeds` (so every `squall` verb and supervisor follows the leader); returns each
    /// one's `host:port`.
    fn start_nimbuses(&mut self, names: &[&str]) -> BTreeMap<String, String> {
        let ports: Vec<u16> = names.iter().map(|_| free_port()).collect();
        let seeds: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut config = std::fs::read_to_string(&self.config).unwrap();
        config.push_str(&format!("nimbus.seeds: [{}]\n", seeds.join(", ")));
        std::fs::write(&self.config, config).unwrap();
        let mut by_address = BTreeMap::new();
        for (name, port) in names.iter().zip(&ports) {
            let mut args = self.daemon_args("nimbus", name);
            args.extend(["-c".into(), format!("nimbus.http.port={port}")]);
            self.spawn(name, &args);
            by_address.insert(format!("127.0.0.1:{port}"), (*name).to_owned());
        }
        by_address
    }

    /// kill -9 of the nimbus whose local dir is `name`'s.
    fn kill9_nimbus(&self, name: &str) {
        let killed = kill9(&format!("storm.local.dir={}", self.dir(name).display()));
        assert_eq!(killed, 1, "nimbus {name} was running");
    }
}

/// The leader's address once `count` nimbuses are registered and exactly one leads, other
/// than `not`.
async fn ha_leader(session: &Session, count: usize, not: Option<&str>, within: Duration) -> String {
    eventually(within, &format!("{count} nimbuses registered, one of them a new leader"), || async {
        let all = nimbus::leader::nimbuses(session, &StormPaths::default()).await.ok()?;
        let leaders: Vec<String> = all.iter().filter(|n| n.is_leader).map(|n| n.address()).collect();
        (all.len() == count && leaders.len() == 1 && Some(leaders[0].as_str()) != not)
            .then(|| leaders[0].clone())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nimbus_failover_leaves_workers_alone_and_resumes_delayed_kill_and_rebalance() {
    let mut cluster = Cluster::new("nimbus_ha").await;
    let nimbuses = cluster.start_nimbuses(&["n1", "n2", "n3"]);
    let ports = [free_port(), free_port()];
    cluster.start_supervisor("sup-a", &ports);
    let session = cluster.session().await;
    let paths = StormPaths::default();
    let leader = ha_leader(&session, 3, None, Duration::from_secs(60)).await;

    // Word count on both slots, submitted through the seeds. `flowing` watches acks in the
    // workerbeat nodes: written every second here rather than at most once a minute.
    let example =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/wordcount.yaml"))
            .unwrap()
            .replace("topology.workers: 2", "topology.workers: 2\n  squall.workerbeats.zk.secs: 1");
    let example_file = cluster.dir("wordcount.yaml");
    std::fs::write(&example_file, example).unwrap();
    let out = cluster.squall(&["submit", example_file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let id: TopologyId =
        text(&out).split(" as ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    eventually(Duration::from_secs(60), "an assignment over 2 slots", || async {
        assignment(&session, &id).await.filter(|a| a.slots().len() == 2)
    })
    .await;
    let before = flowing(&session, &id, "after submit").await;
    let workers_before = worker_dirs(&cluster.dir("sup-a"));
    assert_eq!(workers_before.len(), 2);

    // kill -9 the leader: a follower leads within the session timeout (4 s) + 2 s.
    cluster.kill9_nimbus(&nimbuses[&leader]);
    let killed_at = tokio::time::Instant::now();
    let second = ha_leader(&session, 2, Some(&leader), Duration::from_secs(30)).await;
    let failover = killed_at.elapsed();
    assert!(failover <= Duration::from_secs(6), "failover took {failover:?}");

    // The topology runs on untouched: same assignment, same worker processes.
    flowing(&session, &id, "after the failover").await;
    assert_eq!(assignment(&session, &id).await.unwrap(), before, "the new leader reassigned");
    assert_eq!(worker_dirs(&cluster.dir("sup-a")), workers_before, "a worker was restarted");

    // The same CLI config works against the new leader: nimbus-summary, submit, kill -w,
    // rebalance -w.
    let summary = cluster.squall(&["nimbus-summary"]);
    let lines = text(&summary);
    assert!(
        lines.lines().any(|l| l.starts_with(&second) && l.contains("Leader") && !l.contains("Not")),
        "{lines}"
    );
    assert_eq!(lines.lines().filter(|l| l.starts_with("127.0.0.1:")).count(), 2, "{lines}");
    let other = cluster.dir("other.yaml");
    std::fs::write(
        &other,
        std::fs::read_to_string(&example_file).unwrap().replace("name: wordcount", "name: other"),
    )
    .unwrap();
    let out = cluster.squall(&["submit", other.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let other_id: TopologyId =
        text(&out).split(" as ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();

    // kill -w 10 and rebalance -w 10, then kill -9 the leader during the wait: the last nimbus
    // completes both at their recorded deadlines.
    let out = cluster.squall(&["kill", "other", "-w", "10"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = cluster.squall(&["rebalance", "wordcount", "-w", "10", "-n", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    let deadline = |id: TopologyId| {
        let session = &session;
        let paths = &paths;
        async move {
            let (base, _) = session.read::<StormBase>(&paths.storm(&id)).await.unwrap();
            base.pending_transition.expect("a pending transition").deadline_secs()
        }
    };
    let (kill_deadline, rebalance_deadline) = (deadline(other_id.clone()).await, deadline(id.clone()).await);
    cluster.kill9_nimbus(&nimbuses[&second]);
    ha_leader(&session, 1, Some(&second), Duration::from_secs(30)).await;
    let removed_at = eventually(Duration::from_secs(40), "the delayed kill to complete", || async {
        session.exists(&paths.storm(&other_id)).await.unwrap().is_none().then(now_secs)
    })
    .await;
    assert!(
        (kill_deadline..=kill_deadline + 4).contains(&removed_at),
        "killed at {removed_at}, deadline {kill_deadline}"
    );
    let rebalanced_at = eventually(Duration::from_secs(40), "the delayed rebalance to complete", || async {
        let (base, _) = session.read::<StormBase>(&paths.storm(&id)).await.ok()?;
        (base.pending_transition.is_none() && base.num_workers == 1).then(now_secs)
    })
    .await;
    assert!(
        (rebalance_deadline..=rebalance_deadline + 4).contains(&rebalanced_at),
        "rebalanced at {rebalanced_at}, deadline {rebalance_deadline}"
    );
    eventually(Duration::from_secs(60), "the rebalance to 1 worker", || async {
        assignment(&session, &id).await.filter(|a| a.slots().len() == 1)
    })
    .await;
    flowing(&session, &id, "after the rebalance under the third leader").await;
}

/// One transaction of ZooKeeper's log, as `TxnLogToolkit` prints it.
#[derive(Debug, Clone)]
struct Txn {
    /// The session that sent it, in hex as the toolkit prints it (`10001e454bb0000`).
    session: String,
    zxid: i64,
    /// `create`, `setData`, `delete`, `multi`, `closeSession`, ...
    op: String,
    /// The rest: paths and data (a multi lists each of its operations with its path).
    body: String,
}

/// Every transaction in the harness server's log files, read with ZooKeeper's own
/// `TxnLogToolkit` (same java and classpath as the harness: `SQUALL_JAVA`, `SQUALL_ZK_CLASSPATH`
/// or Debian's jars).
fn transaction_log(server: &ZkServer) -> Vec<Txn> {
    let dir = server.data_dir().join("version-2");
    let mut logs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("log.")))
        .collect();
    logs.sort_by_key(|p| {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        i64::from_str_radix(name.trim_start_matches("log."), 16).unwrap_or(0)
    });
    let java = std::env::var_os("SQUALL_JAVA").unwrap_or_else(|| "java".into());
    let classpath = std::env::var("SQUALL_ZK_CLASSPATH").unwrap_or_else(|_| {
        let mut cp = "/usr/share/java/zookeeper.jar".to_owned();
        if Path::new("/usr/share/java/slf4j-nop.jar").is_file() {
            cp.push_str(":/usr/share/java/slf4j-nop.jar");
        }
        cp
    });
    let mut txns = Vec::new();
    for log in logs {
        let out = Command::new(&java)
            .args(["-cp", &classpath, "org.apache.zookeeper.server.persistence.TxnLogToolkit"])
            .arg(&log)
            .output()
            .unwrap();
        assert!(out.status.success(), "TxnLogToolkit {}: {}", log.display(), text(&out));
        // A record starts with `<date> session 0x..`; data with line breaks (ACLs) continues it.
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some((_, rest)) = line.split_once(" session 0x") else {
                if let Some(last) = txns.last_mut() {
                    let last: &mut Txn = last;
                    last.body.push('\n');
                    last.body.push_str(line);
                }
                continue;
            };
            let mut words = rest.splitn(6, ' ');
            let session = words.next().unwrap_or_default().to_owned();
            let (_, _, _) = (words.next(), words.next(), words.next()); // cxid 0x.. zxid
            let zxid = words.next().and_then(|z| i64::from_str_radix(z.trim_start_matches("0x"), 16).ok());
            let Some(zxid) = zxid else { continue };
            let record = words.next().unwrap_or_default();
            let (op, body) = record.split_once(' ').unwrap_or((record, ""));
            txns.push(Txn { session, zxid, op: op.to_owned(), body: body.to_owned() });
        }
    }
    txns
}

fn hex_session(id: cluster_state::coord::SessionId) -> String {
    format!("{:x}", id.0 as u64)
}

/// The session that owns `/storm/nimbuses/<address>` (the nimbus's registration).
async fn nimbus_session(session: &Session, address: &str) -> Option<String> {
    let path = StormPaths::default().nimbus(address).unwrap();
    session.exists(&path).await.ok()??.ephemeral_owner.map(hex_session)
}

fn signal(pid: i32, signal: &str) {
    let status = Command::new("kill").args([signal, &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// Issue 17: a leader stopped (SIGSTOP) past its session timeout, with a delayed rebalance due
/// while it is stopped, is resumed (SIGCONT) once another nimbus leads and has completed that
/// rebalance. ZooKeeper's transaction log shows that from the pause on every write under
/// `/storms` and `/assignments` came from the new leader's session (the resumed one's timer
/// and monitor fire at once on resume, and nothing of theirs lands), and the resumed nimbus
/// rejoins as a follower (`/storm/nimbuses`, `squall nimbus-summary`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_past_its_session_writes_nothing_after_and_rejoins_as_follower() {
    let mut cluster = Cluster::new("nimbus_sigstop").await;
    let nimbuses = cluster.start_nimbuses(&["n1", "n2"]);
    let session = cluster.session().await;
    let paths = StormPaths::default();
    // A supervisor record nobody keeps alive: the leader assigns to it, then (after
    // nimbus.supervisor.timeout.secs) takes the executors away again: more leader writes.
    let supervisor = SupervisorInfo {
        time_secs: now_secs(),
        hostname: "127.0.0.1".into(),
        supervisor_id: SupervisorId::new("sup-paper").unwrap(),
        used_ports: vec![],
        all_ports: vec![free_port(), free_port()],
        uptime_secs: 1,
        version: "0".into(),
        metrics_endpoint: None,
        metrics_scheme: cluster_state::znode::MetricsScheme::Http,
    };
    let path = paths.supervisor(&supervisor.supervisor_id);
    session
        .create(&path, &supervisor.encode(), cluster_state::coord::CreateMode::Persistent.with_parents())
        .await
        .unwrap();
    let first = ha_leader(&session, 2, None, Duration::from_secs(60)).await;
    let first_session = nimbus_session(&session, &first).await.unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/wordcount.yaml");
    let out = cluster.squall(&["submit", example.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let id: TopologyId =
        text(&out).split(" as ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();

    // The follower holds the code (else it may not lead: Storm's rule).
    eventually(Duration::from_secs(30), "both nimbuses to hold the code", || async {
        (session.children(&paths.blobstore_topology(&id)).await.ok()?.len() == 2).then_some(())
    })
    .await;

    // A rebalance due in 2 s, then the leader stops before it is due: its timer is overdue
    // when it resumes.
    let out = cluster.squall(&["rebalance", "wordcount", "-w", "2", "-n", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    let marker = format!("storm.local.dir={}", cluster.dir(&nimbuses[&first]).display());
    let pids = pids_mentioning(&marker);
    assert_eq!(pids.len(), 1, "one process for {first}");
    signal(pids[0], "-STOP");
    session.create("/paused", b"", cluster_state::coord::CreateMode::Persistent).await.unwrap();
    let (_, pause) = session.get("/paused").await.unwrap();
    let stopped = tokio::time::Instant::now();

    // Past the session timeout (4 s) the other nimbus leads, and completes the rebalance.
    let second = ha_leader(&session, 1, Some(&first), Duration::from_secs(30)).await;
    let second_session = nimbus_session(&session, &second).await.unwrap();
    eventually(Duration::from_secs(30), "the new leader to complete the rebalance", || async {
        let (base, _) = session.read::<StormBase>(&paths.storm(&id)).await.ok()?;
        (base.pending_transition.is_none() && base.num_workers == 1).then_some(())
    })
    .await;
    assert!(stopped.elapsed() > Duration::from_secs(4), "paused past the session timeout");

    // Resumed: it rejoins as a follower with a new session.
    signal(pids[0], "-CONT");
    eventually(Duration::from_secs(30), "the resumed nimbus to rejoin as a follower", || async {
        let all = nimbus::leader::nimbuses(&session, &paths).await.ok()?;
        let me = all.iter().find(|n| n.address() == first)?;
        (all.len() == 2 && !me.is_leader && all.iter().any(|n| n.address() == second && n.is_leader))
            .then_some(())
    })
    .await;
    let rejoined_session = nimbus_session(&session, &first).await.unwrap();
    assert_ne!(rejoined_session, first_session, "a new session");
    let summary = text(&cluster.squall(&["nimbus-summary"]));
    assert!(summary.lines().any(|l| l.starts_with(&first) && l.contains("Not a Leader")), "{summary}");
    assert!(
        summary.lines().any(|l| l.starts_with(&second) && l.contains("Leader") && !l.contains("Not")),
        "{summary}"
    );
    // The cluster works on under the new leader (one more leader write to look for).
    let out = cluster.squall(&["deactivate", "wordcount"]);
    assert!(out.status.success(), "{}", text(&out));
    let (_, last) = session.get(&paths.storm(&id)).await.unwrap();

    // The transaction log: every write under /storms and /assignments of this cluster since the
    // pause came from the new leader's session; the paused session sent nothing but its end.
    let root = cluster.zookeeper.split_once('/').map(|(_, r)| format!("/{r}")).unwrap();
    let watched = [format!("{root}{}/", paths.storms_dir()), format!("{root}{}/", paths.assignments_dir())];
    let txns = eventually(Duration::from_secs(30), "the log to hold the deactivate", || async {
        let txns = transaction_log(ZkServer::shared());
        txns.iter().any(|t| t.zxid >= last.mzxid).then_some(txns)
    })
    .await;
    let after: Vec<&Txn> = txns.iter().filter(|t| t.zxid > pause.czxid).collect();
    let leader_writes: Vec<&&Txn> =
        after.iter().filter(|t| watched.iter().any(|w| t.body.contains(w.as_str()))).collect();
    for t in &leader_writes {
        assert_eq!(t.session, second_session, "a write not from the new leader ({second}): {t:?}");
    }
    assert!(leader_writes.len() >= 2, "the rebalance and the deactivate: {leader_writes:?}");
    let from_paused: Vec<&&Txn> = after.iter().filter(|t| t.session == first_session).collect();
    assert!(from_paused.iter().all(|t| t.op == "closeSession"), "{from_paused:?}");
    assert!(!from_paused.is_empty(), "the paused session ended in the log");
    println!(
        "SIGSTOP story: {} writes under /storms and /assignments since the pause, all from {second} \
         (session 0x{second_session}); the paused leader's session 0x{first_session}: {:?}; it \
         rejoined with session 0x{rejoined_session}",
        leader_writes.len(),
        from_paused.iter().map(|t| &t.op).collect::<Vec<_>>()
    );
    if let Some(multi) = leader_writes.iter().find(|t| t.op == "multi") {
        println!("a fenced write in the log: {multi:?}");
    }
    let log = std::fs::read_to_string(cluster.dir(&format!("{}.log", nimbuses[&first]))).unwrap_or_default();
    for line in log.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")) {
        println!("{}: {line}", nimbuses[&first]);
    }
}

/// The word count with `workers` workers (the example file, `squall.workerbeats.zk.secs` at its
/// default), submitted; returns its id once its assignment covers `workers` slots and every
/// worker wrote its first workerbeat node.
async fn submit_wordcount(cluster: &Cluster, session: &Session, workers: u32) -> (TopologyId, Assignment) {
    let example =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/wordcount.yaml"))
            .unwrap();
    let file = cluster.dir("wordcount.yaml");
    std::fs::write(&file, example.replace("topology.workers: 2", &format!("topology.workers: {workers}")))
        .unwrap();
    let submitted = eventually(Duration::from_secs(60), "nimbus to take the submit", || async {
        let out = cluster.squall(&["submit", file.to_str().unwrap()]);
        out.status.success().then(|| text(&out))
    })
    .await;
    let id: TopologyId =
        submitted.split(" as ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    let paths = StormPaths::default();
    let assigned =
        eventually(Duration::from_secs(90), "every worker to start and write its workerbeat", || async {
            let a = assignment(session, &id).await.filter(|a| a.slots().len() == workers as usize)?;
            let beats = session.children(&paths.workerbeats_topology(&id)).await.ok()?;
            (beats.len() == workers as usize).then_some(a)
        })
        .await;
    (id, assigned)
}

/// `squall_nimbus_workers_reported` on nimbus's `/metrics`: workers in the supervisors' latest
/// aggregated heartbeats.
async fn workers_reported(cluster: &Cluster) -> Option<u64> {
    let config = std::fs::read_to_string(&cluster.config).ok()?;
    let address = config.lines().find_map(|l| l.strip_prefix("nimbus.http.address: "))?.trim().to_owned();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // nimbus may be restarting: no answer is `None`, not a failure.
    let mut stream = tokio::net::TcpStream::connect(&address).await.ok()?;
    stream.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes()).await.ok()?;
    let mut page = String::new();
    stream.read_to_string(&mut page).await.ok()?;
    page.lines()
        .find_map(|l| l.strip_prefix("squall_nimbus_workers_reported "))
        .and_then(|v| v.trim().parse().ok())
}

/// Issue 18: liveness travels in the supervisors' heartbeats to nimbus, workerbeat nodes are
/// written at most once a minute, each supervisor's workers' in one transaction, and supervisor
/// nodes only on a change, so a steady cluster of
/// 8 workers (no Kafka: no offset commits) commits fewer than 0.5 transactions a second,
/// counted by ZooKeeper itself (its zxid) over 60 s; and nothing is reassigned meanwhile,
/// though `nimbus.task.timeout.secs` (10) passes many times over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_cluster_of_8_workers_commits_under_half_a_transaction_per_second() {
    // Its own server: the shared one counts other tests' writes.
    let server = ZkServer::start();
    let mut cluster = Cluster::on(server.connect_string());
    let (a_ports, b_ports) = ([0; 4].map(|_| free_port()), [0; 4].map(|_| free_port()));
    cluster.start_nimbus();
    cluster.start_supervisor("sup-a", &a_ports);
    cluster.start_supervisor("sup-b", &b_ports);
    let session = cluster.session().await;
    supervisors(&session, 2).await;
    let (id, assigned) = submit_wordcount(&cluster, &session, 8).await;
    eventually(Duration::from_secs(60), "nimbus to hear of all 8 workers", || async {
        (workers_reported(&cluster).await? == 8).then_some(())
    })
    .await;

    // The measurement window (not a synchronisation): 60 s of steady state.
    const WINDOW: Duration = Duration::from_secs(60);
    let before = server.transactions().unwrap();
    tokio::time::sleep(WINDOW).await;
    let after = server.transactions().unwrap();
    let per_sec = (after - before) as f64 / WINDOW.as_secs_f64();
    println!(
        "steady 8-worker cluster: {} transactions in {} s = {per_sec:.3}/s",
        after - before,
        WINDOW.as_secs()
    );
    assert!(per_sec < 0.5, "{} transactions in 60 s ({per_sec:.3}/s)", after - before);
    // Each supervisor writes its 4 workers' workerbeat nodes in one transaction at most every
    // squall.workerbeats.zk.secs (60): a 60 s window holds at most 2 rounds of each of the 2,
    // where 8 workers writing their own nodes made 8 or more.
    assert!(
        after - before <= 4,
        "{} transactions in 60 s: more than 2 supervisors' workerbeat rounds",
        after - before
    );
    assert_eq!(assignment(&session, &id).await, Some(assigned), "nothing was reassigned");
    assert_eq!(workers_reported(&cluster).await, Some(8), "every worker still reported");
}

/// Issue 18: a restarted nimbus starts with no heartbeats in memory; it gives every executor
/// `nimbus.task.launch.secs` of fresh reports and, as the supervisors report to it, reassigns
/// nothing that is alive, well past the launch grace and the task timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nimbus_restart_does_not_reassign_executors_that_are_alive() {
    let mut cluster = Cluster::new("nimbus_restart_keeps_executors").await;
    let (a_ports, b_ports) = ([free_port(), free_port()], [free_port(), free_port()]);
    cluster.start_nimbus();
    cluster.start_supervisor("sup-a", &a_ports);
    cluster.start_supervisor("sup-b", &b_ports);
    let session = cluster.session().await;
    supervisors(&session, 2).await;
    let (id, assigned) = submit_wordcount(&cluster, &session, 4).await;

    assert!(
        kill9(&format!("storm.local.dir={}", cluster.dir("nimbus").display())) == 1,
        "nimbus was running"
    );
    cluster.start_nimbus();
    let restarted = std::time::Instant::now();
    eventually(Duration::from_secs(60), "the new nimbus to hear of all 4 workers", || async {
        (workers_reported(&cluster).await? == 4).then_some(())
    })
    .await;
    // nimbus.task.launch.secs (30) + nimbus.task.timeout.secs (10) + 2 monitor periods: any
    // executor the new nimbus thought dead would have moved by then.
    // The observation window (not a synchronisation): until then a mistake could still come.
    let decided = Duration::from_secs(30 + 10 + 2);
    tokio::time::sleep(decided.saturating_sub(restarted.elapsed())).await;
    assert_eq!(assignment(&session, &id).await, Some(assigned), "no executor moved");
    assert_eq!(workers_reported(&cluster).await, Some(4));
}

/// Every `*.log` and `worker.log*` file under `dir` (the daemons' logs, their workers' logs and
/// their stdout in `worker.log.out`), concatenated.
fn logs_under(dir: &Path) -> String {
    let mut out = String::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.push_str(&logs_under(&path));
        } else if path.extension().is_some_and(|e| e == "log")
            || path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("worker.log"))
        {
            out.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_custom_worker_example_builds_and_runs_its_own_components_on_a_cluster() {
    // Built as README.md says, into this build's target dir (up to date: a no-op but for the
    // example itself).
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = Path::new(SQUALL).parent().and_then(Path::parent).unwrap();
    let built = Command::new(env!("CARGO"))
        .args(["build", "-p", "custom-worker", "--locked"])
        .current_dir(&workspace)
        .env("CARGO_TARGET_DIR", target)
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", text(&built));
    let binary = Path::new(SQUALL).with_file_name("custom-worker");
    assert!(binary.is_file(), "{}", binary.display());

    let mut cluster = Cluster::new("cluster_custom_worker").await;
    cluster.start_nimbus();
    cluster.start_supervisor("sup-a", &[free_port(), free_port()]);
    cluster.start_supervisor("sup-b", &[free_port(), free_port()]);
    let session = cluster.session().await;
    supervisors(&session, 2).await;
    let topology = workspace.join("examples/custom-worker/topology.yaml");
    // The squall binary does not know the example's components: without its binary, refused.
    let refused = cluster.squall(&["submit", topology.to_str().unwrap()]);
    assert!(!refused.status.success() && text(&refused).contains("counting-spout"), "{}", text(&refused));
    let submitted = eventually(Duration::from_secs(60), "nimbus to take the submit", || async {
        let out = cluster.squall(&[
            "submit",
            topology.to_str().unwrap(),
            "--worker-binary",
            binary.to_str().unwrap(),
        ]);
        out.status.success().then(|| text(&out))
    })
    .await;
    assert!(submitted.contains("Submitted topology fizzbuzz"), "{submitted}");
    // The example's own bolt's output, printed by the built-in stdout sink in a worker's log:
    // 15 is FizzBuzz whichever worker counted it.
    let root = cluster.dir("");
    eventually(Duration::from_secs(90), "the fizzbuzz bolt's output in a worker log", || async {
        let logs = logs_under(&root);
        (logs.contains("15\tFizzBuzz") && logs.contains("9\tFizz") && logs.contains("10\tBuzz")).then_some(())
    })
    .await;
}
