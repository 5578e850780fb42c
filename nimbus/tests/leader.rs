//! Nimbus HA (issue 17) as stories of whole nimbus daemons (`nimbus::serve`) sharing one chroot
//! of a real ZooKeeper: one leader among three, a follower's refusal naming the leader and a
//! client following it, failover when the leader's session ends, the leader fence (a leader
//! whose election node is gone writes nothing), a leader whose election node is deleted
//! stepping down and rejoining as a follower, and a follower that lacks a topology's code
//! not leading until it has copied it, unless the topology is killed and needs no code.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use cluster_state::api::SubmitTopology;
use cluster_state::clock::now_secs;
use cluster_state::coord::{CreateMode, Ensemble, Session, SessionOptions};
use cluster_state::ids::{SupervisorId, TopologyId};
use cluster_state::paths::StormPaths;
use cluster_state::znode::{NimbusSummary, StormBase, SupervisorInfo, TopologyStatus, ZnodeData};
use nimbus::NimbusConfig;
use nimbus::leader::{self, Election, Leadership, Replicator};
use nimbus_client::{ClientError, NimbusClient};
use test_harness::{ZkServer, eventually};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(30);

/// One nimbus daemon: its address, dir and stop switch.
struct Nimbus {
    address: String,
    dir: tempfile::TempDir,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), nimbus::NimbusError>>,
}

impl Nimbus {
    async fn start(ensemble: &Ensemble, dir: tempfile::TempDir) -> Nimbus {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let config = NimbusConfig {
            local_dir: dir.path().to_owned(),
            hostname: Some("127.0.0.1".into()),
            monitor_freq_secs: 1,
            zookeeper_session_timeout_ms: 4000,
            ..Default::default()
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let (shutdown, ensemble) = (shutdown.clone(), ensemble.clone());
            async move { nimbus::serve(config, listener, ensemble, &prometheus::Registry::new(), shutdown).await }
        });
        Nimbus { address, dir, shutdown, task }
    }

    /// Stops it the way a process exit does: its session closes, its ephemerals go.
    async fn stop(self) -> tempfile::TempDir {
        self.shutdown.cancel();
        let ended = tokio::time::timeout(Duration::from_secs(10), self.task).await.unwrap().unwrap();
        assert!(ended.is_ok(), "nimbus ended on its own: {ended:?}");
        self.dir
    }

    fn code_dir(&self, id: &TopologyId) -> std::path::PathBuf {
        self.dir.path().join("nimbus/stormdist").join(id.as_str())
    }
}

async fn registered(session: &Session) -> Vec<NimbusSummary> {
    nimbus::leader::nimbuses(session, &StormPaths::default()).await.unwrap()
}

/// Waits until `count` nimbuses are registered and exactly one leads; returns the leader.
async fn one_leader(session: &Session, count: usize) -> String {
    leader_among(session, count, None).await
}

/// [`one_leader`] once `gone` (a stopped nimbus, whose registration can outlive its stop for a
/// moment) is no longer among them.
async fn one_leader_without(session: &Session, count: usize, gone: &str) -> String {
    leader_among(session, count, Some(gone)).await
}

/// Waits until `count` nimbuses are registered, `gone` not among them, exactly one leading: its
/// address.
async fn leader_among(session: &Session, count: usize, gone: Option<&str>) -> String {
    eventually(DEADLINE, &format!("{count} nimbuses (not {gone:?}) with exactly one leader"), || async {
        let all = registered(session).await;
        let leaders: Vec<String> = all.iter().filter(|n| n.is_leader).map(NimbusSummary::address).collect();
        let left = gone.is_none_or(|gone| all.iter().all(|n| n.address() != gone));
        (left && all.len() == count && leaders.len() == 1).then(|| leaders[0].clone())
    })
    .await
}

async fn supervisor(session: &Session) {
    let id = SupervisorId::new("sup-1").unwrap();
    let info = SupervisorInfo {
        time_secs: now_secs(),
        hostname: "host1".into(),
        supervisor_id: id.clone(),
        used_ports: vec![],
        all_ports: vec![6700, 6701],
        uptime_secs: 1,
        version: "0".into(),
        metrics_endpoint: None,
        metrics_scheme: cluster_state::znode::MetricsScheme::Http,
    };
    let path = StormPaths::default().supervisor(&id);
    session.create(&path, &info.encode(), CreateMode::Persistent.with_parents()).await.unwrap();
}

const TOPOLOGY: &str = "name: wc\nconfig: {topology.workers: 1}\nspouts:\n  - {id: sentences, className: sentence-generator}\n\
     bolts:\n  - {id: split, className: split-sentence}\n";

async fn submit(client: &NimbusClient, file: &str) -> Result<TopologyId, ClientError> {
    let upload = client.upload(file.as_bytes(), |_| {}).await?;
    let request = SubmitTopology {
        topology_upload: upload,
        worker_upload: None,
        resources_upload: None,
        inactive: false,
        owner: "t".into(),
    };
    Ok(client.submit(&request).await?.id)
}

async fn start_all(ensemble: &Ensemble, n: usize) -> Vec<Nimbus> {
    let mut nimbuses = Vec::new();
    for _ in 0..n {
        nimbuses.push(Nimbus::start(ensemble, tempfile::tempdir().unwrap()).await);
    }
    nimbuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_three_leads_followers_name_it_and_a_follower_takes_over() {
    let ensemble = Ensemble::zookeeper(ZkServer::shared().chroot("ha-three").await);
    let session = ensemble.connect(&SessionOptions::default()).await.unwrap();
    supervisor(&session).await;
    let mut nimbuses = start_all(&ensemble, 3).await;
    let leader = one_leader(&session, 3).await;
    let paths = StormPaths::default();
    assert_eq!(session.children(&paths.leader_lock_dir()).await.unwrap().len(), 3, "one election node each");

    // A follower refuses a mutating call and names the leader; reads it serves itself.
    let follower = nimbuses.iter().find(|n| n.address != leader).unwrap().address.clone();
    let direct = NimbusClient::new(follower.clone(), None);
    match direct.upload(b"x", |_| {}).await {
        Err(ClientError::NotLeader { leader: Some(named), message, .. }) => {
            assert_eq!(named, leader);
            assert!(message.contains("not the leader") && message.contains(&leader), "{message}");
        }
        other => panic!("a follower must refuse naming {leader}, got {other:?}"),
    }
    let summary = direct.nimbus_summary().await.unwrap();
    let statuses: Vec<(String, String)> =
        summary.nimbuses.iter().map(|n| (n.address(), n.status.clone())).collect();
    assert_eq!(statuses.len(), 3, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|(a, s)| *a == leader && s == "Leader").count(), 1, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|(_, s)| s == "Not a Leader").count(), 2, "{statuses:?}");

    // A client given a follower first finds the leader by itself.
    let mut seeds: Vec<String> = nimbuses.iter().map(|n| n.address.clone()).collect();
    seeds.sort_by_key(|a| *a == leader);
    let client = NimbusClient::with_seeds(seeds, None);
    let id = submit(&client, TOPOLOGY).await.unwrap();
    assert_eq!(client.current(), leader);

    // Followers copy the code (with its checksum) and record that they hold it.
    for n in &nimbuses {
        eventually(DEADLINE, &format!("{} to hold the code", n.address), || async {
            n.code_dir(&id).join("topology.yaml").exists().then_some(())
        })
        .await;
    }
    // Each copies the file first and records itself as a holder after, so the record may lag.
    let mut addresses: Vec<String> = nimbuses.iter().map(|n| n.address.clone()).collect();
    addresses.sort();
    eventually(DEADLINE, "every nimbus recorded as a holder of the code", || async {
        let mut holders = session.children(&paths.blobstore_topology(&id)).await.unwrap();
        holders.sort();
        (holders == addresses).then_some(())
    })
    .await;

    // The leader goes: one of the others leads, and the same client reaches it.
    let index = nimbuses.iter().position(|n| n.address == leader).unwrap();
    nimbuses.remove(index).stop().await;
    let new_leader = one_leader_without(&session, 2, &leader).await;
    assert_ne!(new_leader, leader);
    client.deactivate(&id).await.unwrap();
    let (base, _) = session.read::<StormBase>(&paths.storm(&id)).await.unwrap();
    assert_eq!(base.status, TopologyStatus::Inactive);
    assert_eq!(client.current(), new_leader);

    // A kill removes the code from every nimbus, followers included.
    client.kill(&id, 0).await.unwrap();
    for n in &nimbuses {
        eventually(DEADLINE, "the code of the killed topology to go", || async {
            (!n.code_dir(&id).exists()).then_some(())
        })
        .await;
    }
    for n in nimbuses {
        n.stop().await;
    }
}

/// The fence on its own, with no watch to warn the leader: the parts of a nimbus wired by hand
/// (an `Election` and its `Leadership`, no daemon), so that nothing but the fence stands between
/// a leader that lost its election node and the write. (With the whole daemon, the watch on its
/// node makes it step down within milliseconds; see the next test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_election_node_is_gone_writes_nothing() {
    let ensemble = Ensemble::zookeeper(ZkServer::shared().chroot("ha-fence").await);
    let session = ensemble.connect(&SessionOptions::default()).await.unwrap();
    let paths = StormPaths::default();
    let nimbus = std::sync::Arc::new(ensemble.connect(&SessionOptions::default()).await.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let code = nimbus::code_store::CodeStore::open(dir.path(), Default::default()).await.unwrap();
    let me = NimbusSummary {
        host: "127.0.0.1".into(),
        port: 1,
        start_time_secs: now_secs(),
        uptime_secs: 0,
        version: "0".into(),
        is_leader: false,
    };
    let replicator = Replicator::new(nimbus.clone(), paths.clone(), code, me.address(), None, 1 << 20);
    let leadership = Leadership::candidate();
    let election = Election::new(
        nimbus.clone(),
        paths.clone(),
        leadership.clone(),
        me,
        replicator,
        Duration::from_secs(1),
    );
    assert!(election.run(&CancellationToken::new()).await.unwrap(), "the only candidate leads");
    let node = "/fenced-node";
    leader::create(&nimbus, &leadership, node, b"1").await.unwrap();
    leader::set(&nimbus, &leadership, node, b"2", None).await.unwrap();
    let (_, before) = session.get(node).await.unwrap();

    // The lock is lost while the leader's session lives on (as when its session expired and
    // it has not noticed yet): its writes must fail, whatever it believes.
    for latch in session.children(&paths.leader_lock_dir()).await.unwrap() {
        session.delete(&coord_join(&paths.leader_lock_dir(), &latch), None).await.unwrap();
    }
    assert!(leadership.is_leader(), "nothing told it yet");
    let refused = leader::set(&nimbus, &leadership, node, b"3", None).await;
    assert!(refused.is_err(), "a write without the lock went through: {refused:?}");
    let (data, after) = session.get(node).await.unwrap();
    assert_eq!((after.mzxid, after.version, data), (before.mzxid, before.version, b"2".to_vec()), "written");
    // The refusal itself deposes it, and a deposed leader sends nothing more.
    assert!(!leadership.is_leader(), "a refused fence must step the leader down");
    let refused = leader::delete(&nimbus, &leadership, node, None).await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(session.exists(node).await.unwrap().is_some());
}

/// Issue 17 part 2: a leader whose election node is deleted while its session lives notices
/// (a watch on its own node), steps down, says so in `/nimbuses` and queues again as a
/// follower; the next candidate leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_election_node_is_deleted_steps_down_and_rejoins_as_a_follower() {
    let ensemble = Ensemble::zookeeper(ZkServer::shared().chroot("ha-step-down").await);
    let session = ensemble.connect(&SessionOptions::default()).await.unwrap();
    supervisor(&session).await;
    let nimbuses = start_all(&ensemble, 2).await;
    let first = one_leader(&session, 2).await;
    let paths = StormPaths::default();
    let dir = paths.leader_lock_dir();
    let queue = latches(&session, &dir).await;
    let (ours, _) = queue.iter().find(|(_, who)| *who == first).unwrap().clone();

    session.delete(&coord_join(&dir, &ours), None).await.unwrap();
    // (For a moment both summaries may say leader: the summary is rewritten after the step
    // down, and the other nimbus learns of the deletion at the same time. What counts is that
    // the deposed one stops leading and says so.)
    let second = eventually(DEADLINE, "the other nimbus to lead and the first to follow", || async {
        let all = registered(&session).await;
        let leaders: Vec<String> = all.iter().filter(|n| n.is_leader).map(NimbusSummary::address).collect();
        (all.len() == 2 && leaders.len() == 1 && leaders[0] != first).then(|| leaders[0].clone())
    })
    .await;
    // The deposed leader is queued again, behind the new leader.
    let queue = eventually(DEADLINE, "the deposed leader to queue again", || async {
        let queue = latches(&session, &dir).await;
        (queue.len() == 2).then_some(queue)
    })
    .await;
    assert_eq!(queue[0].1, second, "{queue:?}");
    assert_eq!(queue[1].1, first, "{queue:?}");
    assert!(queue[1].0 > ours, "a new node: {queue:?}");
    // It refuses writes and names the new leader; a client given it first follows.
    match NimbusClient::new(first.clone(), None).upload(b"x", |_| {}).await {
        Err(ClientError::NotLeader { leader: Some(named), .. }) => assert_eq!(named, second),
        other => panic!("the deposed leader must refuse naming {second}, got {other:?}"),
    }
    let client = NimbusClient::with_seeds(vec![first.clone(), second.clone()], None);
    submit(&client, TOPOLOGY).await.unwrap();
    assert_eq!(client.current(), second);
    assert_eq!(one_leader(&session, 2).await, second);
    for n in nimbuses {
        n.stop().await;
    }
}

/// The election queue: (node name, the candidate's address), in order.
async fn latches(session: &Session, dir: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for name in session.children(dir).await.unwrap() {
        let (data, _) = session.get(&coord_join(dir, &name)).await.unwrap();
        found.push((name, String::from_utf8(data).unwrap()));
    }
    found.sort();
    found
}

fn coord_join(parent: &str, child: &str) -> String {
    cluster_state::coord::join(parent, child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_lacking_code_does_not_lead_until_it_has_copied_it() {
    let ensemble = Ensemble::zookeeper(ZkServer::shared().chroot("ha-code").await);
    let session = ensemble.connect(&SessionOptions::default()).await.unwrap();
    supervisor(&session).await;
    let mut nimbuses = start_all(&ensemble, 1).await;
    let first = one_leader(&session, 1).await;
    let id = submit(&NimbusClient::new(first.clone(), None), TOPOLOGY).await.unwrap();

    // The only holder of the code stops; its dir (the code) is kept aside.
    let kept = nimbuses.remove(0).stop().await;
    // A new nimbus has no code and nobody to copy it from: it must not lead.
    let second = Nimbus::start(&ensemble, tempfile::tempdir().unwrap()).await;
    eventually(DEADLINE, "the second nimbus to register", || async {
        (registered(&session).await.len() == 1).then_some(())
    })
    .await;
    // Absence over a window (an election takes milliseconds here): polled, so a leader
    // appearing at any point fails the test.
    let waited = tokio::time::Instant::now();
    while waited.elapsed() < Duration::from_secs(4) {
        let all = registered(&session).await;
        assert!(all.iter().all(|n| !n.is_leader), "a nimbus without the code leads: {all:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!second.code_dir(&id).exists());
    let refused = NimbusClient::new(second.address.clone(), None).kill(&id, 0).await;
    assert!(matches!(refused, Err(ClientError::NotLeader { leader: None, .. })), "{refused:?}");

    // The holder comes back (same dir, so with the code): someone leads, and the newcomer has
    // the code by then if it is the one.
    let back = Nimbus::start(&ensemble, kept).await;
    let leader = one_leader(&session, 2).await;
    if leader == second.address {
        assert!(second.code_dir(&id).join("topology.yaml").exists(), "it leads without the code");
    }
    eventually(DEADLINE, "the newcomer to copy the code", || async {
        second.code_dir(&id).join("topology.yaml").exists().then_some(())
    })
    .await;
    back.stop().await;
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_topology_whose_code_died_with_its_nimbus_does_not_block_the_election() {
    let ensemble = Ensemble::zookeeper(ZkServer::shared().chroot("ha-killed-code").await);
    let session = ensemble.connect(&SessionOptions::default()).await.unwrap();
    supervisor(&session).await;
    let mut nimbuses = start_all(&ensemble, 1).await;
    let first = one_leader(&session, 1).await;
    let client = NimbusClient::new(first.clone(), None);
    let id = submit(&client, TOPOLOGY).await.unwrap();
    // A delayed kill, then the only holder of the code dies before anyone copied it.
    client.kill(&id, 5).await.unwrap();
    let paths = StormPaths::default();
    let (base, _) = session.read::<StormBase>(&paths.storm(&id)).await.unwrap();
    assert_eq!(base.status, TopologyStatus::Killed);
    let deadline = base.pending_transition.expect("a pending kill").deadline_secs();
    nimbuses.remove(0).stop().await;

    // A nimbus without the code leads anyway (the kill needs none) and completes the kill at
    // its recorded deadline.
    let second = Nimbus::start(&ensemble, tempfile::tempdir().unwrap()).await;
    // Not the stopped one's lingering registration (once read as the one leader).
    assert_eq!(one_leader_without(&session, 1, &first).await, second.address);
    let removed_at = eventually(DEADLINE, "the delayed kill to complete", || async {
        session.exists(&paths.storm(&id)).await.unwrap().is_none().then(now_secs)
    })
    .await;
    assert!((deadline..=deadline + 3).contains(&removed_at), "removed at {removed_at}, deadline {deadline}");
    assert!(!second.code_dir(&id).exists());
    second.stop().await;
}
