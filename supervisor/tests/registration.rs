//! The supervisor's registration under `/storm/supervisors`: present while the supervisor
//! lives, fresh, back after a session expiry, gone when it stops.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use cluster_state::coord::{CreateMode, Ensemble, MemoryEnsemble, Session, SessionId, SessionOptions};
use cluster_state::ids::SupervisorId;
use cluster_state::paths::StormPaths;
use cluster_state::znode::{SupervisorInfo, ZnodeData};
use supervisor::registration::Registration;
use test_harness::{ZkServer, eventually};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long a registration may take to appear or change.
const DEADLINE: Duration = Duration::from_secs(15);

const PATH: &str = "/storm/supervisors/sup-1";

fn info() -> SupervisorInfo {
    SupervisorInfo {
        time_secs: 0,
        hostname: "host1".into(),
        supervisor_id: SupervisorId::new("sup-1").unwrap(),
        used_ports: vec![],
        all_ports: vec![6700, 6701],
        uptime_secs: 0,
        version: "0.1.0".into(),
        metrics_endpoint: None,
        metrics_scheme: cluster_state::znode::MetricsScheme::Http,
    }
}

struct Running {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    ports: watch::Sender<Vec<u16>>,
}

fn start(ensemble: &Ensemble) -> Running {
    let (ports, used_ports) = watch::channel(vec![]);
    let registration = Registration {
        ensemble: ensemble.clone(),
        session_options: SessionOptions { session_timeout: Duration::from_secs(4), ..Default::default() },
        paths: StormPaths::default(),
        info: info(),
        used_ports,
        heartbeat_interval: Duration::from_millis(100),
        workerbeats: None,
    };
    let cancel = CancellationToken::new();
    let task = tokio::spawn(registration.run(cancel.clone()));
    Running { cancel, task, ports }
}

/// The registration as it stands, and the session holding it.
async fn registered(observer: &Session) -> Option<(SupervisorInfo, SessionId)> {
    let (data, stat) = observer.get(PATH).await.ok()?;
    Some((SupervisorInfo::decode(PATH, &data).unwrap(), stat.ephemeral_owner?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_refreshes_survives_expiry_and_leaves_on_stop() {
    let memory = MemoryEnsemble::new();
    let ensemble = Ensemble::Memory(memory.clone());
    let observer = ensemble.connect(&SessionOptions::default()).await.unwrap();
    let running = start(&ensemble);

    let (first, owner) = eventually(DEADLINE, "registration", || registered(&observer)).await;
    assert_eq!((first.hostname.as_str(), first.all_ports.as_slice()), ("host1", &[6700, 6701][..]));
    assert!(first.time_secs > 0, "times are filled in");

    running.ports.send(vec![6700]).unwrap();
    eventually(DEADLINE, "used ports to be published", || async {
        registered(&observer).await.filter(|(info, _)| info.used_ports == [6700]).map(|_| ())
    })
    .await;

    memory.expire(owner);
    let (_, new_owner) = eventually(DEADLINE, "registration under a new session", || async {
        registered(&observer).await.filter(|(_, o)| *o != owner)
    })
    .await;
    assert_ne!(new_owner, owner);

    running.cancel.cancel();
    running.task.await.unwrap();
    assert_eq!(observer.exists(PATH).await.unwrap(), None, "a stopped supervisor's node goes at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_previous_incarnations_node_is_replaced_at_once() {
    let ensemble = Ensemble::zookeeper(ZkServer::shared().chroot("previous_incarnation").await);
    // What a killed supervisor leaves: its node, held by a session that has not timed out yet.
    let crashed =
        SessionOptions { session_timeout: Duration::from_secs(30), detached: true, ..Default::default() };
    let previous = ensemble.connect(&crashed).await.unwrap();
    previous.create(PATH, &info().encode(), CreateMode::Ephemeral.with_parents()).await.unwrap();
    let stale_owner = previous.id();
    let credentials = previous.credentials();
    drop(previous);

    let observer = ensemble.connect(&SessionOptions::default()).await.unwrap();
    let running = start(&ensemble);
    let (info, owner) = eventually(DEADLINE, "the node to be taken over", || async {
        registered(&observer).await.filter(|(_, o)| *o != stale_owner)
    })
    .await;
    assert!(info.time_secs > 0);
    assert_ne!(owner, stale_owner);

    running.cancel.cancel();
    running.task.await.unwrap();
    assert_eq!(observer.exists(PATH).await.unwrap(), None);
    // Tidy up the crashed session rather than leaving it to time out.
    ensemble.resume(&credentials, &SessionOptions::default()).await.unwrap().close().await.unwrap();
}
