//! Nimbus's consumer-group lag evaluator against a real ZooKeeper (harness) and librdkafka's
//! mock cluster: the test plays a group by writing its registry znodes the way Kafka's ZooKeeper
//! consumers (and Squall's spout) do, and checks what the evaluator exports, with no topology
//! running at all.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cluster_state::coord::{CreateMode, Ensemble, Session, SessionOptions};
use cluster_state::paths::KafkaPaths;
use nimbus::NimbusConfig;
use nimbus::lag::{LagMetrics, LagMonitor, LagSettings, Rules};
use prometheus::Registry;
use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use test_harness::prometheus::Prometheus;
use test_harness::{ZkServer, eventually, eventually_true};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const WITHIN: Duration = Duration::from_secs(30);
const OFFSET: &str = "/consumers/g/offsets/clicks/0";

fn kafka() -> MockCluster<'static, DefaultProducerContext> {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("clicks", 1, 1).unwrap();
    cluster
}

/// Appends `n` messages to partition 0 of `clicks`.
fn produce(bootstrap: &str, n: usize) {
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", bootstrap).create().unwrap();
    for i in 0..n {
        let value = i.to_string();
        producer.send(BaseRecord::<(), _>::to("clicks").payload(&value).partition(0)).unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
}

async fn session(test: &str) -> Arc<Session> {
    let connect = ZkServer::shared().chroot(test).await;
    Arc::new(Ensemble::zookeeper(connect).connect(&SessionOptions::default()).await.unwrap())
}

/// Registers a member of group `g` (ephemeral, as a consumer does).
async fn join_group(session: &Session) {
    let member = r#"{"version":1,"subscription":{"clicks":1},"pattern":"static","timestamp":"0"}"#;
    session
        .create("/consumers/g/ids/g_test-1", member.as_bytes(), CreateMode::Ephemeral.with_parents())
        .await
        .unwrap();
}

async fn commit(session: &Session, offset: i64) {
    session.set_or_create(OFFSET, offset.to_string().as_bytes()).await.unwrap();
}

/// The value of `name{labels}` in `registry`, if that series exists.
fn gauge(registry: &Registry, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let family = registry.gather().into_iter().find(|f| f.name() == name)?;
    let counter = family.get_field_type() == prometheus::proto::MetricType::COUNTER;
    let has = |m: &&prometheus::proto::Metric| {
        labels.iter().all(|(k, v)| m.get_label().iter().any(|l| l.name() == *k && l.value() == *v))
    };
    let metric = family.get_metric().iter().find(has)?;
    Some(if counter { metric.get_counter().get_value() } else { metric.get_gauge().get_value() })
}

const PARTITION: &[(&str, &str)] = &[("group", "g"), ("topic", "clicks"), ("partition", "0")];

fn partition_status(registry: &Registry) -> Option<f64> {
    gauge(registry, "squall_group_partition_lag_status", PARTITION)
}

/// Waits until the evaluator finished a pass that started after this call.
async fn next_pass(registry: &Registry) {
    let passes = || gauge(registry, "squall_lag_passes_total", &[]).unwrap_or(0.0);
    let before = passes();
    eventually_true(WITHIN, "two more lag passes", || async { passes() >= before + 2.0 }).await;
}

/// Commits `offsets`, one per pass (at most 10), until the partition's status is `wanted`.
async fn commit_until(
    session: &Session,
    registry: &Registry,
    offsets: impl Iterator<Item = i64>,
    wanted: f64,
) {
    let mut statuses = Vec::new();
    for offset in offsets.take(10) {
        commit(session, offset).await;
        next_pass(registry).await;
        statuses.extend(partition_status(registry));
        if statuses.last() == Some(&wanted) {
            return;
        }
    }
    panic!("status {wanted} never came; statuses after each commit: {statuses:?}");
}

fn start_monitor(session: Arc<Session>, bootstrap: String, registry: &Registry) -> CancellationToken {
    let settings = LagSettings {
        interval: Duration::from_millis(200),
        intervals: 3,
        rules: Rules::default(),
        bootstrap_servers: Some(bootstrap),
        kafka_timeout: Duration::from_millis(500),
    };
    let metrics = LagMetrics::register(registry, "local").unwrap();
    let monitor = LagMonitor::new(session, KafkaPaths::default(), settings, None, metrics);
    let cancel = CancellationToken::new();
    tokio::spawn(monitor.run(cancel.clone()));
    cancel
}

/// Burrow's codes: OK 1, STOP 4, STALL 5, REWIND 6.
const OK: f64 = 1.0;
const STOP: f64 = 4.0;
const STALL: f64 = 5.0;
const REWIND: f64 = 6.0;

/// The issue-15 story: a group that keeps up (OK), stops while the log grows (STOP, where the
/// spout-side status said OK), commits again without moving (STALL), then goes back (REWIND);
/// its series outlive any topology and go when the group leaves ZooKeeper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_goes_ok_stop_stall_rewind_and_its_series_go_with_it() {
    let kafka = kafka();
    let bootstrap = kafka.bootstrap_servers();
    let session = session("lag_story").await;
    let registry = Registry::new();
    let cancel = start_monitor(session.clone(), bootstrap.clone(), &registry);
    join_group(&session).await;

    // Keeping up: every commit reaches the log end.
    let mut end = 0;
    for _ in 0..3 {
        produce(&bootstrap, 10);
        end += 10;
        commit(&session, end).await;
        eventually_true(WITHIN, "OK with zero lag", || async {
            partition_status(&registry) == Some(OK)
                && gauge(&registry, "kafka_consumergroup_lag", &[("consumergroup", "g")]) == Some(0.0)
        })
        .await;
    }
    assert_eq!(gauge(&registry, "kafka_consumergroup_members", &[("consumergroup", "g")]), Some(1.0));

    // Stopped: no commits while the log grows.
    produce(&bootstrap, 435);
    eventually_true(WITHIN, "STOP while the log grows", || async {
        partition_status(&registry) == Some(STOP)
    })
    .await;
    assert_eq!(gauge(&registry, "kafka_consumergroup_lag", &[("consumergroup", "g")]), Some(435.0));
    assert_eq!(gauge(&registry, "burrow_kafka_consumer_status", &[("consumer_group", "g")]), Some(3.0));
    assert_eq!(gauge(&registry, "squall_group_lag_status", &[("group", "g")]), Some(STOP));

    // Stalled: commits again, always the same offset.
    commit_until(&session, &registry, std::iter::repeat(end), STALL).await;
    // Rewound: the offset goes back and, moving on, stays below where it was.
    commit_until(&session, &registry, 5.., REWIND).await;
    let lag = gauge(&registry, "burrow_kafka_consumer_partition_lag", &[("consumer_group", "g")]).unwrap();
    assert!(lag > 435.0, "{lag}");
    assert_eq!(
        gauge(&registry, "kafka_topic_partition_current_offset", &[("topic", "clicks"), ("partition", "0")]),
        Some(465.0)
    );

    // The group leaves ZooKeeper: its series go.
    session.delete_recursive("/consumers/g").await.unwrap();
    eventually_true(WITHIN, "the group's series to go", || async {
        partition_status(&registry).is_none()
            && gauge(&registry, "kafka_consumergroup_lag", &[("consumergroup", "g")]).is_none()
    })
    .await;
    cancel.cancel();
}

/// Brokers that do not answer make the group's partitions ERR and count an error; the monitor
/// keeps going and reports real statuses once brokers are configured that answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_down_is_err_not_a_stopped_monitor() {
    let session = session("lag_brokers_down").await;
    let registry = Registry::new();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let cancel = start_monitor(session.clone(), closed.to_string(), &registry);
    join_group(&session).await;
    commit(&session, 3).await;
    session.set_or_create("/consumers/g/offsets/clicks/1", b"not a number").await.unwrap();
    eventually_true(WITHIN, "ERR for partitions without brokers", || async {
        partition_status(&registry) == Some(3.0)
            && gauge(&registry, "squall_lag_errors_total", &[("source", "kafka")]).is_some()
    })
    .await;
    let garbage = [("group", "g"), ("topic", "clicks"), ("partition", "1")];
    assert_eq!(gauge(&registry, "squall_group_partition_lag_status", &garbage), Some(3.0));
    let passes = gauge(&registry, "squall_lag_last_pass_timestamp_seconds", &[]).unwrap();
    assert!(passes > 0.0);
    cancel.cancel();
}

/// Nimbus as `squall nimbus` runs it (`serve`), on a free loopback port.
struct Nimbus {
    addr: SocketAddr,
    registry: Registry,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), nimbus::NimbusError>>,
}

impl Nimbus {
    async fn serve(config: NimbusConfig, ensemble: Ensemble) -> Nimbus {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let registry = Registry::new();
        let task = tokio::spawn({
            let (shutdown, registry) = (shutdown.clone(), registry.clone());
            async move { nimbus::serve(config, listener, ensemble, &registry, shutdown).await }
        });
        Nimbus { addr, registry, shutdown, task }
    }
}

fn metrics_page(addr: SocketAddr) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: nimbus\r\nConnection: close\r\n\r\n").unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default()
}

/// Nimbus itself (`serve`, as `squall nimbus` runs it) exports the group under
/// kafka_exporter's and Burrow's names on its /metrics, and promtool accepts the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nimbus_serves_group_lag_on_metrics_that_promtool_accepts() {
    let kafka = kafka();
    let bootstrap = kafka.bootstrap_servers();
    produce(&bootstrap, 7);
    let connect = ZkServer::shared().chroot("lag_nimbus_metrics").await;
    let ensemble = Ensemble::zookeeper(connect);
    let group = ensemble.connect(&SessionOptions::default()).await.unwrap();
    join_group(&group).await;
    commit(&group, 2).await;

    let dir = tempfile::tempdir().unwrap();
    let config = NimbusConfig {
        local_dir: dir.path().to_owned(),
        lag_interval_secs: 1,
        lag_bootstrap_servers: Some(bootstrap),
        ..Default::default()
    };
    let Nimbus { addr, shutdown, task: nimbus, .. } = Nimbus::serve(config, ensemble).await;

    let page = eventually(WITHIN, "the group's lag on nimbus's /metrics", || async move {
        let page = tokio::task::spawn_blocking(move || metrics_page(addr)).await.unwrap();
        page.contains(r#"kafka_consumergroup_lag{consumergroup="g",partition="0",topic="clicks"} 5"#)
            .then_some(page)
    })
    .await;
    for expected in [
        r#"kafka_consumergroup_current_offset{consumergroup="g",partition="0",topic="clicks"} 2"#,
        r#"kafka_consumergroup_lag_sum{consumergroup="g",topic="clicks"} 5"#,
        r#"kafka_consumergroup_members{consumergroup="g"} 1"#,
        r#"kafka_topic_partition_oldest_offset{partition="0",topic="clicks"} 0"#,
        // One commit long ago with lag behind it: the consumer stopped (STOP; the group ERR).
        r#"burrow_kafka_consumer_status{cluster="local",consumer_group="g"} 3"#,
        r#"burrow_kafka_consumer_partition_lag{cluster="local",consumer_group="g",partition="0",topic="clicks"} 5"#,
        r#"squall_group_lag_status{group="g"} 4"#,
        r#"squall_build_info{daemon="nimbus",version="#,
        "process_resident_memory_bytes ",
    ] {
        assert!(page.contains(expected), "{expected} missing from:\n{page}");
    }
    if let Err(problems) = test_harness::promtool::check_metrics(&page) {
        panic!("promtool check metrics:\n{problems}\non:\n{page}");
    }

    shutdown.cancel();
    nimbus.await.unwrap().unwrap();
}

/// The lag story as an operator's Prometheus sees it: nimbus (as `squall nimbus` runs it) is
/// scraped by a real Prometheus while a scripted group keeps up (OK), stops while the log
/// grows (STOP), commits without moving (STALL) and goes back (REWIND). Prometheus's stored
/// series shows the four states in that order, and the series stays while no topology runs
/// (none ever does here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_records_ok_stop_stall_rewind_from_nimbus() {
    let kafka = kafka();
    let bootstrap = kafka.bootstrap_servers();
    let connect = ZkServer::shared().chroot("lag_prometheus").await;
    let ensemble = Ensemble::zookeeper(connect);
    let group = Arc::new(ensemble.connect(&SessionOptions::default()).await.unwrap());
    join_group(&group).await;

    let dir = tempfile::tempdir().unwrap();
    let config = NimbusConfig {
        local_dir: dir.path().join("nimbus"),
        lag_interval_secs: 1,
        lag_intervals: 3,
        lag_bootstrap_servers: Some(bootstrap.clone()),
        ..Default::default()
    };
    let Nimbus { addr, registry, shutdown, task: nimbus } = Nimbus::serve(config, ensemble).await;
    let prometheus = Prometheus::start(
        dir.path(),
        &format!(
            "global: {{scrape_interval: 250ms, scrape_timeout: 200ms}}\n\
             scrape_configs:\n  - job_name: nimbus\n    static_configs: [{{targets: ['{addr}']}}]\n"
        ),
    )
    .unwrap();
    let started = now_secs();
    let status_query = r#"squall_group_partition_lag_status{group="g",topic="clicks",partition="0"}"#;
    // Waits until Prometheus stores a value of `query` that `good` accepts.
    let scraped = |query: &'static str, good: fn(f64) -> bool| {
        let prometheus = &prometheus;
        move || {
            let value = prometheus.query_one(query).filter(|v| good(*v));
            async move { value }
        }
    };

    // Keeping up, then stopped while the log grows.
    let mut end = 0;
    for _ in 0..3 {
        produce(&bootstrap, 10);
        end += 10;
        commit(&group, end).await;
        next_pass(&registry).await;
    }
    eventually_true(WITHIN, "Prometheus to store OK", || async {
        prometheus.query_one(status_query) == Some(OK)
    })
    .await;
    produce(&bootstrap, 435);
    eventually_true(WITHIN, "STOP while the log grows", || async {
        partition_status(&registry) == Some(STOP)
    })
    .await;
    // kafka_exporter's and Burrow's names, as their dashboards query them.
    let lag = eventually(
        WITHIN,
        "kafka_consumergroup_lag in Prometheus",
        scraped(r#"sum(kafka_consumergroup_lag{consumergroup="g"})"#, |v| v >= 435.0),
    )
    .await;
    assert!(lag >= 435.0, "{lag}");
    let burrow = eventually(
        WITHIN,
        "burrow_kafka_consumer_status in Prometheus",
        scraped(r#"burrow_kafka_consumer_status{consumer_group="g"}"#, |v| v >= 2.0),
    )
    .await;
    assert_eq!(burrow, 3.0, "Burrow's group status while stopped (ERR)");
    commit_until(&group, &registry, std::iter::repeat(end), STALL).await;
    commit_until(&group, &registry, 5.., REWIND).await;
    let rewound = now_secs();

    // Prometheus has every state, in order, and nothing after the rewind took the series away.
    let states = eventually(WITHIN, "Prometheus to hold the whole story", || async {
        let samples =
            prometheus.query_range_one(status_query, started, now_secs(), Duration::from_millis(125))?;
        let mut states: Vec<f64> = samples.iter().map(|(_, v)| *v).collect();
        states.dedup();
        let story = [OK, STOP, STALL, REWIND];
        let mut wanted = story.iter().peekable();
        for s in &states {
            if wanted.peek() == Some(&s) {
                wanted.next();
            }
        }
        let last = samples.last().map_or(0.0, |(t, _)| *t);
        (wanted.peek().is_none() && last >= rewound + 2.0).then_some(states)
    })
    .await;
    assert!(!states.contains(&0.0), "NOTFOUND while the group existed: {states:?}");
    assert!(
        prometheus.query_one(r#"kafka_consumergroup_members{consumergroup="g"}"#).is_some(),
        "the group's series are gone from Prometheus"
    );
    drop(prometheus);
    shutdown.cancel();
    nimbus.await.unwrap().unwrap();
}

fn now_secs() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64()
}

/// A group whose spout says `offsets_storage: kafka` commits to its group coordinator only:
/// nimbus reads its offsets from there (ZooKeeper's stale offset is ignored), judges it with
/// the same rules, and keeps its series after the topology's file is gone while the group is
/// still in ZooKeeper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_stored_in_kafka_is_judged_on_the_coordinators_offsets() {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    let kafka = kafka();
    let bootstrap = kafka.bootstrap_servers();
    let session = session("lag_kafka_storage").await;
    join_group(&session).await;
    // Left behind by the group's ZooKeeper days: must not count.
    commit(&session, 1).await;

    let dir = tempfile::tempdir().unwrap();
    let code = nimbus::code_store::CodeStore::open(dir.path(), Default::default()).await.unwrap();
    let id: cluster_state::ids::TopologyId = "clicks-1-1".parse().unwrap();
    std::fs::create_dir_all(code.topology_dir(&id)).unwrap();
    std::fs::write(
        code.topology_dir(&id).join("topology.yaml"),
        format!(
            "name: clicks\nspouts:\n  - id: kafka\n    className: kafka-spout\n    params:\n      \
             bootstrap_servers: \"{bootstrap}\"\n      topics: [clicks]\n      group_id: g\n      \
             offsets_storage: kafka\n"
        ),
    )
    .unwrap();
    let registry = Registry::new();
    let settings = LagSettings {
        interval: Duration::from_millis(200),
        intervals: 3,
        rules: Rules::default(),
        bootstrap_servers: None,
        kafka_timeout: Duration::from_millis(1000),
    };
    let metrics = LagMetrics::register(&registry, "local").unwrap();
    let monitor =
        LagMonitor::new(session.clone(), KafkaPaths::default(), settings, Some(code.clone()), metrics);
    let cancel = CancellationToken::new();
    tokio::spawn(monitor.run(cancel.clone()));

    let coordinator: BaseConsumer =
        ClientConfig::new().set("bootstrap.servers", &bootstrap).set("group.id", "g").create().unwrap();
    let commit_in_kafka = |offset: i64| {
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset("clicks", 0, rdkafka::Offset::Offset(offset)).unwrap();
        coordinator.commit(&tpl, CommitMode::Sync).unwrap();
    };
    let lag = || gauge(&registry, "kafka_consumergroup_lag", &[("consumergroup", "g")]);
    let current = || gauge(&registry, "kafka_consumergroup_current_offset", &[("consumergroup", "g")]);

    produce(&bootstrap, 20);
    commit_in_kafka(12);
    eventually_true(WITHIN, "lag 8 from Kafka's offset 12", || async {
        current() == Some(12.0) && lag() == Some(8.0)
    })
    .await;
    // Keeping up: OK, from commits only Kafka has.
    let mut end = 20;
    for _ in 0..3 {
        produce(&bootstrap, 10);
        end += 10;
        commit_in_kafka(end);
        eventually_true(WITHIN, "Kafka's commit seen", || async { current() == Some(end as f64) }).await;
        next_pass(&registry).await;
    }
    assert_eq!(partition_status(&registry), Some(OK));
    assert_eq!(lag(), Some(0.0));
    // Stopped: STOP, as for a group in ZooKeeper.
    produce(&bootstrap, 100);
    eventually_true(WITHIN, "STOP while the log grows", || async {
        partition_status(&registry) == Some(STOP)
    })
    .await;
    assert_eq!(lag(), Some(100.0));

    // The topology's file goes (killed); the group stays in ZooKeeper: still judged from Kafka.
    code.remove(&id).await.unwrap();
    next_pass(&registry).await;
    assert_eq!(current(), Some(end as f64), "offsets after the topology is gone");
    cancel.cancel();
}
