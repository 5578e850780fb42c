//! The coordination conformance suite: every case runs against the in-memory backend
//! (`conformance::memory::*`) and against a real ZooKeeper 3.8 server
//! (`conformance::zookeeper::*`), so `squall local` behaves as a cluster does.
//!
//! ZooKeeper cases share one server per test binary, each in its own chroot and behind its own
//! TCP relay, through which a case can partition its clients from the server. The server
//! restart case gets a private server.

// Tests report failures by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::time::Duration;

use cluster_state::coord::{
    CreateMode, Ensemble, EphemeralClaim, Error, MemoryEnsemble, Op, OpResult, Security, Session,
    SessionOptions, SessionState, Watch, WatchEvent, ZkAuth,
};
use cluster_state::znode::{OffsetData, StormBase, ZnodeData};
use test_harness::{TcpRelay, ZkServer, eventually};

const DEADLINE: Duration = Duration::from_secs(20);

/// Where a case runs, and how to disturb a session there.
enum Fixture {
    Memory(MemoryEnsemble),
    /// Clients reach the server through a relay, so a test can partition them; `direct` reaches
    /// the same chroot without the relay.
    ZooKeeper {
        ensemble: Ensemble,
        direct: Ensemble,
        relay: TcpRelay,
    },
}

impl Fixture {
    fn ensemble(&self) -> Ensemble {
        match self {
            Fixture::Memory(m) => Ensemble::Memory(m.clone()),
            Fixture::ZooKeeper { ensemble, .. } => ensemble.clone(),
        }
    }

    async fn connect(&self) -> Session {
        self.ensemble().connect(&options()).await.expect("connect")
    }

    /// A session that [`Fixture::cut`] does not touch (on ZooKeeper: bypassing the relay).
    async fn connect_bystander(&self) -> Session {
        let ensemble = match self {
            Fixture::Memory(m) => Ensemble::Memory(m.clone()),
            Fixture::ZooKeeper { direct, .. } => direct.clone(),
        };
        ensemble.connect(&options()).await.expect("connect")
    }

    /// A session of another client of the same ensemble, with `security`'s credentials (none:
    /// an anonymous client, like Burrow or an attacker on the network).
    async fn connect_as(&self, security: Security) -> Session {
        let ensemble = match self {
            Fixture::Memory(m) => Ensemble::Memory(m.with_security(security)),
            Fixture::ZooKeeper { direct, .. } => direct.clone().with_security(security),
        };
        ensemble.connect(&options()).await.expect("connect")
    }

    /// Cuts the session's connection (on ZooKeeper: of every client of this test).
    fn cut(&self, session: &Session) {
        match self {
            Fixture::Memory(m) => m.disconnect(session.id()),
            Fixture::ZooKeeper { relay, .. } => relay.cut(),
        }
    }

    fn restore(&self, session: &Session) {
        match self {
            Fixture::Memory(m) => m.reconnect(session.id()),
            Fixture::ZooKeeper { relay, .. } => relay.restore(),
        }
    }

    /// Ends the session at the server while its owner is still running. On ZooKeeper: partition
    /// the owner, attach to its session directly with its credentials and close it there, heal
    /// the partition; the owner then learns from the server that its session expired.
    async fn expire(&self, session: &Session) {
        match self {
            Fixture::Memory(m) => m.expire(session.id()),
            Fixture::ZooKeeper { direct, relay, .. } => {
                relay.cut();
                let intruder = direct.resume(&session.credentials(), &options()).await.expect("attach");
                assert_eq!(intruder.id(), session.id());
                intruder.close().await.expect("close");
                relay.restore();
            }
        }
    }
}

fn options() -> SessionOptions {
    SessionOptions {
        session_timeout: Duration::from_secs(8),
        connect_timeout: Duration::from_secs(15),
        detached: false,
    }
}

async fn memory() -> Fixture {
    Fixture::Memory(MemoryEnsemble::new())
}

async fn zookeeper(test: &str) -> Fixture {
    let server = ZkServer::shared();
    let direct = server.chroot(test).await;
    let chroot = &direct[direct.find('/').expect("chroot in connect string")..];
    let relay = TcpRelay::start(SocketAddr::from(([127, 0, 0, 1], server.port()))).expect("relay");
    let ensemble = Ensemble::zookeeper(format!("{}{chroot}", relay.addr()));
    Fixture::ZooKeeper { ensemble, direct: Ensemble::zookeeper(direct), relay }
}

async fn fired(watch: Watch) -> WatchEvent {
    tokio::time::timeout(DEADLINE, watch).await.expect("watch did not fire in time")
}

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::cases::$case(super::memory().await).await;
                }
            )*
        }
        mod zookeeper {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::cases::$case(super::zookeeper(stringify!($case)).await).await;
                }
            )*
        }
    };
}

conformance! {
    create_read_update_delete,
    create_with_parents_and_delete_recursive,
    set_or_create_and_children_or_empty,
    compare_and_set_conflicts,
    sequential_nodes_are_numbered_in_order,
    ephemerals_go_when_their_session_closes,
    ephemerals_go_when_their_session_expires,
    detached_session_expires_after_its_timeout,
    ephemerals_cannot_have_children,
    watches_fire_on_create_change_delete_and_children,
    watches_end_when_the_session_expires,
    multi_applies_all_operations,
    multi_rolls_back_on_failure,
    checked_ephemeral_after_fast_reconnect,
    disconnect_and_reconnect_keep_the_session,
    invalid_paths_are_rejected_before_sending,
    garbage_payloads_are_errors_naming_the_path,
    changes_made_during_a_partition_fire_watches_on_reconnect,
    a_closed_session_reports_closed,
    with_auth_storm_nodes_are_private_and_registry_nodes_world_readable,
    without_auth_nodes_stay_open,
}

/// What only a real server can show: a ZooKeeper restart is an outage every client rides out.
mod zookeeper_only {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sessions_and_data_survive_a_server_restart() {
        let mut server = ZkServer::start();
        let ensemble = Ensemble::zookeeper(server.connect_string());
        let s = ensemble.connect(&options()).await.unwrap();
        s.create("/kept", b"data", CreateMode::Persistent).await.unwrap();
        s.create("/owner", b"", CreateMode::Ephemeral).await.unwrap();
        let (_, _, watch) = s.get_watch("/kept").await.unwrap();
        let mut states = s.state_changes();

        tokio::task::block_in_place(|| server.stop());
        assert_eq!(states.next().await.map(|e| e.state), Some(SessionState::Disconnected));
        tokio::task::block_in_place(|| server.start_again());
        let state = tokio::time::timeout(DEADLINE, states.wait_for(SessionState::Connected)).await.unwrap();
        assert_eq!(state, Some(SessionState::Connected));

        assert_eq!(s.get("/kept").await.unwrap().0, b"data");
        assert_eq!(s.exists("/owner").await.unwrap().and_then(|st| st.ephemeral_owner), Some(s.id()));
        s.set("/kept", b"new", None).await.unwrap();
        assert_eq!(fired(watch).await, WatchEvent::NodeDataChanged { path: "/kept".into() });
    }
}

mod cases {
    use super::*;

    fn cluster_security(user: &str) -> Security {
        Security::new(Some(ZkAuth::new("digest", &format!("{user}:pw-{user}-1")).unwrap()), "/storm")
    }

    pub async fn with_auth_storm_nodes_are_private_and_registry_nodes_world_readable(f: Fixture) {
        let squall = f.connect_as(cluster_security("squall")).await;
        let storm = "/storm/supervisors/sup-1";
        let offset = "/consumers/g/offsets/t/0";
        squall.create(storm, b"info", CreateMode::Persistent.with_parents()).await.unwrap();
        squall.create(offset, b"42", CreateMode::Persistent.with_parents()).await.unwrap();
        squall.create("/consumers/g/ids/c1", b"{}", CreateMode::Ephemeral.with_parents()).await.unwrap();

        let anonymous = f.connect_as(Security::default()).await;
        let stranger = f.connect_as(cluster_security("mallory")).await;
        for (who, s) in [("anonymous", &anonymous), ("another user", &stranger)] {
            let no_auth = |path: &str| Error::NoAuth { path: path.to_owned() };
            // Storm's layout: nothing readable, nothing writable (no fake supervisor).
            assert_eq!(s.get(storm).await.unwrap_err(), no_auth(storm), "{who}");
            assert_eq!(
                s.children("/storm/supervisors").await.unwrap_err(),
                no_auth("/storm/supervisors"),
                "{who}"
            );
            assert_eq!(s.set(storm, b"x", None).await.unwrap_err(), no_auth(storm), "{who}");
            let fake = "/storm/supervisors/attacker";
            assert_eq!(
                s.create(fake, b"x", CreateMode::Ephemeral).await.unwrap_err(),
                no_auth(fake),
                "{who}"
            );
            assert_eq!(s.delete(storm, None).await.unwrap_err(), no_auth(storm), "{who}");
            let sneak = [Op::SetData { path: storm.into(), data: b"x".to_vec(), version: None }];
            assert!(
                matches!(s.multi(&sneak).await.unwrap_err(), Error::MultiFailed { index: 0, source } if *source == no_auth(storm))
            );
            // exists is never refused (ZooKeeper checks no ACL for it).
            assert!(s.exists(storm).await.unwrap().is_some(), "{who}");
            // The Kafka registry: Burrow and Kafka's tools read it, nobody else writes it.
            assert_eq!(s.get(offset).await.unwrap().0, b"42", "{who}");
            assert_eq!(s.children("/consumers/g/ids").await.unwrap(), vec!["c1".to_owned()], "{who}");
            assert_eq!(s.set(offset, b"0", None).await.unwrap_err(), no_auth(offset), "{who}");
            let member = "/consumers/g/ids/intruder";
            assert_eq!(
                s.create(member, b"{}", CreateMode::Ephemeral).await.unwrap_err(),
                no_auth(member),
                "{who}"
            );
            assert_eq!(s.delete(offset, None).await.unwrap_err(), no_auth(offset), "{who}");
        }
        assert_eq!(squall.get(storm).await.unwrap().0, b"info", "nothing was changed");
        assert_eq!(squall.get(offset).await.unwrap().0, b"42");

        // Another process of the cluster (same credentials) does everything.
        let nimbus = f.connect_as(cluster_security("squall")).await;
        assert_eq!(nimbus.get(storm).await.unwrap().0, b"info");
        nimbus.set(storm, b"new", Some(0)).await.unwrap();
        nimbus.create("/storm/supervisors/sup-2", b"", CreateMode::Ephemeral).await.unwrap();
        let ops = [
            Op::Check { path: storm.into(), version: 1 },
            Op::SetData { path: offset.into(), data: b"43".to_vec(), version: None },
        ];
        nimbus.multi(&ops).await.unwrap();
        nimbus.delete_recursive("/storm").await.unwrap();
        assert_eq!(squall.get(offset).await.unwrap().0, b"43");
    }

    pub async fn without_auth_nodes_stay_open(f: Fixture) {
        let s = f.connect().await;
        s.create("/storm/supervisors/sup-1", b"info", CreateMode::Persistent.with_parents()).await.unwrap();
        let other = f.connect_as(Security::default()).await;
        assert_eq!(other.get("/storm/supervisors/sup-1").await.unwrap().0, b"info");
        other.set("/storm/supervisors/sup-1", b"x", None).await.unwrap();
        other.create("/storm/supervisors/sup-2", b"", CreateMode::Ephemeral).await.unwrap();
        other.delete("/storm/supervisors/sup-1", None).await.unwrap();
    }

    pub async fn create_read_update_delete(f: Fixture) {
        let s = f.connect().await;
        assert_eq!(s.state(), SessionState::Connected);
        assert_eq!(s.exists("/a").await.unwrap(), None);
        assert_eq!(s.get("/a").await.unwrap_err(), Error::NoNode { path: "/a".into() });

        assert_eq!(s.create("/a", b"one", CreateMode::Persistent).await.unwrap(), "/a");
        let (data, stat) = s.get("/a").await.unwrap();
        assert_eq!(data, b"one");
        assert_eq!((stat.version, stat.data_length, stat.num_children), (0, 3, 0));
        assert_eq!(stat.ephemeral_owner, None);
        assert_eq!(
            s.create("/a", b"again", CreateMode::Persistent).await.unwrap_err(),
            Error::NodeExists { path: "/a".into() }
        );

        let stat = s.set("/a", b"two", None).await.unwrap();
        assert_eq!(stat.version, 1);
        assert!(stat.mzxid > stat.czxid, "a set is a later transaction than the create");
        assert_eq!(s.get("/a").await.unwrap().0, b"two");

        s.create("/a/x", b"", CreateMode::Persistent).await.unwrap();
        s.create("/a/y", b"", CreateMode::Persistent).await.unwrap();
        let mut children = s.children("/a").await.unwrap();
        children.sort();
        assert_eq!(children, ["x", "y"]);
        let stat = s.exists("/a").await.unwrap().expect("exists");
        assert_eq!((stat.num_children, stat.cversion), (2, 2));

        assert_eq!(s.delete("/a", None).await.unwrap_err(), Error::NotEmpty { path: "/a".into() });
        s.delete("/a/x", None).await.unwrap();
        s.delete("/a/y", None).await.unwrap();
        s.delete("/a", None).await.unwrap();
        assert_eq!(s.exists("/a").await.unwrap(), None);
        assert_eq!(s.delete("/a", None).await.unwrap_err(), Error::NoNode { path: "/a".into() });
        assert_eq!(s.children("/a").await.unwrap_err(), Error::NoNode { path: "/a".into() });
    }

    pub async fn set_or_create_and_children_or_empty(f: Fixture) {
        let s = f.connect().await;
        assert_eq!(s.children_or_empty("/d").await.unwrap(), Vec::<String>::new(), "missing: no children");
        s.set_or_create("/d/e/f", b"one").await.unwrap();
        assert_eq!(s.get("/d/e").await.unwrap().0, b"", "parents are created empty");
        let (data, stat) = s.get("/d/e/f").await.unwrap();
        assert_eq!((data.as_slice(), stat.version, stat.ephemeral_owner), (&b"one"[..], 0, None));
        s.set_or_create("/d/e/f", b"two").await.unwrap();
        let (data, stat) = s.get("/d/e/f").await.unwrap();
        assert_eq!((data.as_slice(), stat.version), (&b"two"[..], 1), "an existing node is set");
        assert_eq!(s.children_or_empty("/d/e").await.unwrap(), ["f"]);
        assert_eq!(s.children_or_empty("/d/e/f").await.unwrap(), Vec::<String>::new(), "a leaf");
        assert!(matches!(s.set_or_create("bad", b"").await, Err(Error::InvalidPath { .. })));
        assert!(matches!(s.children_or_empty("bad").await, Err(Error::InvalidPath { .. })));
    }

    pub async fn create_with_parents_and_delete_recursive(f: Fixture) {
        let s = f.connect().await;
        assert_eq!(
            s.create("/p/q/r", b"leaf", CreateMode::Persistent).await.unwrap_err(),
            Error::NoNode { path: "/p/q/r".into() }
        );
        s.create("/p/q/r", b"leaf", CreateMode::Persistent.with_parents()).await.unwrap();
        assert_eq!(s.get("/p/q").await.unwrap().0, b"", "parents are created empty");
        assert_eq!(s.get("/p/q/r").await.unwrap().0, b"leaf");
        s.ensure_path("/p/q").await.unwrap();
        s.ensure_path("/p/z/w").await.unwrap();
        s.create("/p/q/e", b"", CreateMode::Ephemeral).await.unwrap();

        s.delete_recursive("/p").await.unwrap();
        assert_eq!(s.exists("/p").await.unwrap(), None);
        s.delete_recursive("/p").await.unwrap();
    }

    pub async fn compare_and_set_conflicts(f: Fixture) {
        let a = f.connect().await;
        let b = f.connect().await;
        a.create("/cas", b"0", CreateMode::Persistent).await.unwrap();
        let (_, seen_by_a) = a.get("/cas").await.unwrap();
        let (_, seen_by_b) = b.get("/cas").await.unwrap();

        let stat = a.set("/cas", b"a", Some(seen_by_a.version)).await.unwrap();
        assert_eq!(stat.version, 1);
        assert_eq!(
            b.set("/cas", b"b", Some(seen_by_b.version)).await.unwrap_err(),
            Error::BadVersion { path: "/cas".into(), expected: 0 }
        );
        assert_eq!(b.get("/cas").await.unwrap().0, b"a", "the losing write changed nothing");
        assert_eq!(
            b.delete("/cas", Some(0)).await.unwrap_err(),
            Error::BadVersion { path: "/cas".into(), expected: 0 }
        );
        b.delete("/cas", Some(1)).await.unwrap();
    }

    pub async fn sequential_nodes_are_numbered_in_order(f: Fixture) {
        let a = f.connect().await;
        let b = f.connect().await;
        a.create("/seq", b"", CreateMode::Persistent).await.unwrap();
        let mut created = Vec::new();
        for i in 0..6 {
            let s = if i % 2 == 0 { &a } else { &b };
            let mode =
                if i % 3 == 0 { CreateMode::EphemeralSequential } else { CreateMode::PersistentSequential };
            created.push(s.create("/seq/e", format!("{i}").as_bytes(), mode).await.unwrap());
        }
        assert_eq!(created[0], "/seq/e0000000000");
        assert_eq!(created[5], "/seq/e0000000005");
        // The suffix counts the children ever created (ZooKeeper 3.8's rule): a delete does
        // not advance it and numbers are never reused.
        let before = a.exists("/seq").await.unwrap().unwrap();
        a.delete(&created[5], None).await.unwrap();
        let after = a.exists("/seq").await.unwrap().unwrap();
        assert_eq!((before.cversion, after.cversion), (6, 7), "cversion counts creates and deletes");
        let next = a.create("/seq/e", b"", CreateMode::PersistentSequential).await.unwrap();
        assert_eq!(next, "/seq/e0000000006");
        let mut children = a.children("/seq").await.unwrap();
        children.sort();
        assert_eq!(children.len(), 6);
        assert!(children.windows(2).all(|w| w[0] < w[1]));
    }

    pub async fn ephemerals_go_when_their_session_closes(f: Fixture) {
        let owner = f.connect().await;
        let observer = f.connect().await;
        observer.create("/live", b"", CreateMode::Persistent).await.unwrap();
        owner.create("/live/owner", b"me", CreateMode::Ephemeral).await.unwrap();
        let stat = observer.exists("/live/owner").await.unwrap().expect("ephemeral visible");
        assert_eq!(stat.ephemeral_owner, Some(owner.id()));
        let (_, watch) = observer.exists_watch("/live/owner").await.unwrap();
        let (_, children) = observer.children_watch("/live").await.unwrap();

        owner.close().await.unwrap();
        // Close waits for the server: the node is gone when it returns.
        assert_eq!(observer.exists("/live/owner").await.unwrap(), None);
        assert_eq!(fired(watch).await, WatchEvent::NodeDeleted { path: "/live/owner".into() });
        assert_eq!(fired(children).await, WatchEvent::NodeChildrenChanged { path: "/live".into() });
        assert_eq!(observer.exists("/live").await.unwrap().map(|s| s.num_children), Some(0));
    }

    pub async fn ephemerals_go_when_their_session_expires(f: Fixture) {
        let owner = f.connect().await;
        let observer = f.connect().await;
        owner.create("/doomed", b"", CreateMode::Ephemeral).await.unwrap();
        let mut states = owner.state_changes();

        f.expire(&owner).await;

        let event = tokio::time::timeout(DEADLINE, states.wait_for(SessionState::Expired)).await.unwrap();
        assert_eq!(event, Some(SessionState::Expired));
        assert_eq!(states.next().await, None, "nothing follows a terminal state");
        eventually(DEADLINE, "the ephemeral to go", || async {
            observer.exists("/doomed").await.ok()?.is_none().then_some(())
        })
        .await;
        let err = owner.get("/doomed").await.unwrap_err();
        assert!(err.is_session_lost(), "calls on an expired session fail: {err:?}");
        assert!(!err.is_retryable());
        assert_eq!(owner.state(), SessionState::Expired);
    }

    pub async fn detached_session_expires_after_its_timeout(f: Fixture) {
        let short = SessionOptions { session_timeout: Duration::from_secs(1), detached: true, ..options() };
        let crashed = f.ensemble().connect(&short).await.unwrap();
        crashed.create("/crashed", b"", CreateMode::Ephemeral).await.unwrap();
        let credentials = crashed.credentials();
        let observer = f.connect().await;
        // Dropped without closing, as a killed process would leave it.
        drop(crashed);
        assert!(observer.exists("/crashed").await.unwrap().is_some(), "the session outlives its client");
        eventually(DEADLINE, "the session to time out", || async {
            observer.exists("/crashed").await.ok()?.is_none().then_some(())
        })
        .await;
        let err = f.ensemble().resume(&credentials, &short).await.unwrap_err();
        assert!(matches!(err, Error::SessionExpired { .. }), "{err:?}");
    }

    pub async fn ephemerals_cannot_have_children(f: Fixture) {
        let s = f.connect().await;
        s.create("/eph", b"", CreateMode::Ephemeral).await.unwrap();
        assert_eq!(
            s.create("/eph/child", b"", CreateMode::Persistent).await.unwrap_err(),
            Error::NoChildrenForEphemerals { path: "/eph/child".into() }
        );
    }

    pub async fn watches_fire_on_create_change_delete_and_children(f: Fixture) {
        let watcher = f.connect().await;
        let writer = f.connect().await;

        let (stat, created) = watcher.exists_watch("/w").await.unwrap();
        assert_eq!(stat, None);
        writer.create("/w", b"0", CreateMode::Persistent).await.unwrap();
        assert_eq!(fired(created).await, WatchEvent::NodeCreated { path: "/w".into() });

        // A data watch ignores child changes: the first event it sees is the data change.
        let (_, _, changed) = watcher.get_watch("/w").await.unwrap();
        let (_, child_added) = watcher.children_watch("/w").await.unwrap();
        writer.create("/w/c", b"", CreateMode::Persistent).await.unwrap();
        assert_eq!(fired(child_added).await, WatchEvent::NodeChildrenChanged { path: "/w".into() });
        writer.set("/w", b"1", None).await.unwrap();
        assert_eq!(fired(changed).await, WatchEvent::NodeDataChanged { path: "/w".into() });

        // Watches are one-shot: a second change needs a new watch, which sees only that one.
        let (data, _, changed_again) = watcher.get_watch("/w").await.unwrap();
        assert_eq!(data, b"1");
        writer.set("/w", b"2", None).await.unwrap();
        assert_eq!(fired(changed_again).await, WatchEvent::NodeDataChanged { path: "/w".into() });

        let (_, child_removed) = watcher.children_watch("/w").await.unwrap();
        writer.delete("/w/c", None).await.unwrap();
        assert_eq!(fired(child_removed).await, WatchEvent::NodeChildrenChanged { path: "/w".into() });

        let (_, _, deleted) = watcher.get_watch("/w").await.unwrap();
        let (_, children_deleted) = watcher.children_watch("/w").await.unwrap();
        writer.delete("/w", None).await.unwrap();
        assert_eq!(fired(deleted).await, WatchEvent::NodeDeleted { path: "/w".into() });
        assert_eq!(fired(children_deleted).await, WatchEvent::NodeDeleted { path: "/w".into() });

        assert_eq!(watcher.get_watch("/w").await.unwrap_err(), Error::NoNode { path: "/w".into() });
    }

    pub async fn watches_end_when_the_session_expires(f: Fixture) {
        let s = f.connect().await;
        s.create("/watched", b"", CreateMode::Persistent).await.unwrap();
        let (_, _, watch) = s.get_watch("/watched").await.unwrap();
        f.expire(&s).await;
        assert_eq!(fired(watch).await, WatchEvent::SessionEnded { state: SessionState::Expired });
    }

    pub async fn multi_applies_all_operations(f: Fixture) {
        let s = f.connect().await;
        s.create("/m", b"", CreateMode::Persistent).await.unwrap();
        s.create("/m/old", b"", CreateMode::Persistent).await.unwrap();
        s.create("/m/offset", b"1", CreateMode::Persistent).await.unwrap();
        let results = s
            .multi(&[
                Op::Check { path: "/m".into(), version: 0 },
                Op::Create { path: "/m/new".into(), data: b"n".to_vec(), mode: CreateMode::Persistent },
                Op::Create { path: "/m/new/s".into(), data: vec![], mode: CreateMode::PersistentSequential },
                Op::SetData { path: "/m/offset".into(), data: b"2".to_vec(), version: Some(0) },
                Op::Delete { path: "/m/old".into(), version: None },
            ])
            .await
            .unwrap();
        assert_eq!(results[0], OpResult::Checked);
        assert_eq!(results[1], OpResult::Created { path: "/m/new".into() });
        assert_eq!(results[2], OpResult::Created { path: "/m/new/s0000000000".into() });
        assert!(matches!(results[3], OpResult::DataSet { stat } if stat.version == 1));
        assert_eq!(results[4], OpResult::Deleted);
        assert_eq!(s.get("/m/offset").await.unwrap().0, b"2");
        assert_eq!(s.exists("/m/old").await.unwrap(), None);
        // One transaction, one zxid.
        let new = s.exists("/m/new").await.unwrap().unwrap();
        let offset = s.exists("/m/offset").await.unwrap().unwrap();
        assert_eq!(new.czxid, offset.mzxid);
        assert_eq!(s.multi(&[]).await.unwrap(), vec![]);
    }

    pub async fn multi_rolls_back_on_failure(f: Fixture) {
        let s = f.connect().await;
        s.create("/r", b"", CreateMode::Persistent).await.unwrap();
        s.create("/r/offset", b"5", CreateMode::Persistent).await.unwrap();
        let (_, _, watch) = s.get_watch("/r/offset").await.unwrap();

        let err = s
            .multi(&[
                Op::Create { path: "/r/a".into(), data: vec![], mode: CreateMode::Persistent },
                Op::SetData { path: "/r/offset".into(), data: b"6".to_vec(), version: Some(0) },
                Op::SetData { path: "/r/missing".into(), data: vec![], version: None },
            ])
            .await
            .unwrap_err();
        assert_eq!(
            err,
            Error::MultiFailed { index: 2, source: Box::new(Error::NoNode { path: "/r/missing".into() }) }
        );
        assert_eq!(s.exists("/r/a").await.unwrap(), None, "earlier create rolled back");
        let (data, stat) = s.get("/r/offset").await.unwrap();
        assert_eq!((data.as_slice(), stat.version), (&b"5"[..], 0), "earlier set rolled back");

        let err = s
            .multi(&[
                Op::Delete { path: "/r/offset".into(), version: None },
                Op::Check { path: "/r".into(), version: 7 },
            ])
            .await
            .unwrap_err();
        assert_eq!(
            err,
            Error::MultiFailed {
                index: 1,
                source: Box::new(Error::BadVersion { path: "/r".into(), expected: 7 })
            }
        );
        assert!(s.exists("/r/offset").await.unwrap().is_some(), "earlier delete rolled back");

        // The watch did not see the rolled-back set; it sees the next real change.
        s.set("/r/offset", b"7", None).await.unwrap();
        assert_eq!(fired(watch).await, WatchEvent::NodeDataChanged { path: "/r/offset".into() });
    }

    pub async fn checked_ephemeral_after_fast_reconnect(f: Fixture) {
        let detached = SessionOptions { detached: true, ..options() };
        let first = f.ensemble().connect(&detached).await.unwrap();
        let rival = f.connect().await;
        let path = "/consumers/g/owners/t/0";
        let ours = b"g_host-1-abcd1234-0";

        assert_eq!(first.create_ephemeral_checked(path, ours).await.unwrap(), EphemeralClaim::Created);
        assert_eq!(first.create_ephemeral_checked(path, ours).await.unwrap(), EphemeralClaim::AlreadyOurs);
        // Same session, other holder (another consumer thread of ours): not ours.
        let err = first.create_ephemeral_checked(path, b"g_host-1-abcd1234-1").await.unwrap_err();
        assert_eq!(
            err,
            Error::HeldByOther { path: path.into(), owner: first.id(), data: "g_host-1-abcd1234-0".into() }
        );

        // The process loses its connection and comes back on the same session before it expires:
        // the node it finds is its own (the KAFKA-1387 case).
        let credentials = first.credentials();
        let first_id = first.id();
        drop(first);
        let back = f.ensemble().resume(&credentials, &detached).await.unwrap();
        assert_eq!(back.id(), first_id);
        assert_eq!(back.create_ephemeral_checked(path, ours).await.unwrap(), EphemeralClaim::AlreadyOurs);

        // Anyone else is told who holds it.
        let err = rival.create_ephemeral_checked(path, b"g_other-2-ffff0000-0").await.unwrap_err();
        assert_eq!(
            err,
            Error::HeldByOther {
                path: path.into(),
                owner: first_id,
                data: String::from_utf8_lossy(ours).into()
            }
        );

        back.close().await.unwrap();
        assert_eq!(
            rival.create_ephemeral_checked(path, b"g_other-2-ffff0000-0").await.unwrap(),
            EphemeralClaim::Created
        );
    }

    pub async fn disconnect_and_reconnect_keep_the_session(f: Fixture) {
        let s = f.connect().await;
        s.create("/kept", b"", CreateMode::Ephemeral).await.unwrap();
        s.create("/data", b"0", CreateMode::Persistent).await.unwrap();
        let (_, _, watch) = s.get_watch("/data").await.unwrap();
        let mut states = s.state_changes();
        let id = s.id();

        f.cut(&s);
        let event = tokio::time::timeout(DEADLINE, states.next()).await.unwrap().unwrap();
        assert_eq!((event.session_id, event.state), (id, SessionState::Disconnected));
        let err = s.get("/data").await.unwrap_err();
        assert!(err.is_retryable(), "calls while disconnected are retryable: {err:?}");

        f.restore(&s);
        let state = tokio::time::timeout(DEADLINE, states.wait_for(SessionState::Connected)).await.unwrap();
        assert_eq!(state, Some(SessionState::Connected));
        assert_eq!(s.id(), id);
        let stat = s.exists("/kept").await.unwrap().expect("the ephemeral survived a short outage");
        assert_eq!(stat.ephemeral_owner, Some(id));
        // The watch set before the outage is still armed.
        s.set("/data", b"1", None).await.unwrap();
        assert_eq!(fired(watch).await, WatchEvent::NodeDataChanged { path: "/data".into() });
    }

    pub async fn invalid_paths_are_rejected_before_sending(f: Fixture) {
        let s = f.connect().await;
        for bad in ["relative", "/trailing/", "/double//slash", "/dot/./x"] {
            let err = s.create(bad, b"", CreateMode::Persistent).await.unwrap_err();
            assert!(matches!(err, Error::InvalidPath { ref path, .. } if path == bad), "{bad}: {err:?}");
            assert!(err.to_string().contains(bad));
        }
    }

    pub async fn garbage_payloads_are_errors_naming_the_path(f: Fixture) {
        let s = f.connect().await;
        let storms = "/storm/storms/wc-1-1700000000";
        let offset = "/consumers/g/offsets/t/0";
        s.create(storms, b"{\"version\":1,\"name\":", CreateMode::Persistent.with_parents()).await.unwrap();
        s.create(offset, b"-1", CreateMode::Persistent.with_parents()).await.unwrap();

        let err = s.read::<StormBase>(storms).await.unwrap_err();
        assert!(matches!(err, Error::Decode(ref e) if e.path == storms), "{err:?}");
        assert_eq!(err.path(), Some(storms));
        assert!(err.to_string().starts_with(&format!("znode {storms}: not a valid")), "{err}");
        let err = s.read::<OffsetData>(offset).await.unwrap_err();
        assert!(err.to_string().contains(offset), "{err}");

        // The garbage is still there for an operator to inspect; a good payload reads back.
        assert_eq!(s.get(offset).await.unwrap().0, b"-1");
        s.set(offset, &OffsetData::new(42).unwrap().encode(), None).await.unwrap();
        let (read, _, watch) = s.read_watch::<OffsetData>(offset).await.unwrap();
        assert_eq!(read.get(), 42);
        s.set(offset, b"43", None).await.unwrap();
        assert_eq!(fired(watch).await, WatchEvent::NodeDataChanged { path: offset.into() });
    }

    pub async fn changes_made_during_a_partition_fire_watches_on_reconnect(f: Fixture) {
        let s = f.connect().await;
        let bystander = f.connect_bystander().await;
        s.create("/p", b"0", CreateMode::Persistent).await.unwrap();
        let (_, _, changed) = s.get_watch("/p").await.unwrap();
        let (_, children) = s.children_watch("/p").await.unwrap();
        let mut states = s.state_changes();

        f.cut(&s);
        assert_eq!(states.next().await.map(|e| e.state), Some(SessionState::Disconnected));
        bystander.set("/p", b"1", None).await.unwrap();
        bystander.create("/p/c", b"", CreateMode::Persistent).await.unwrap();
        f.restore(&s);

        // Both watches learn of what happened while their session could not hear.
        assert_eq!(fired(changed).await, WatchEvent::NodeDataChanged { path: "/p".into() });
        assert_eq!(fired(children).await, WatchEvent::NodeChildrenChanged { path: "/p".into() });
        assert_eq!(states.wait_for(SessionState::Connected).await, Some(SessionState::Connected));
        assert_eq!(s.get("/p").await.unwrap().0, b"1");
    }

    pub async fn a_closed_session_reports_closed(f: Fixture) {
        let s = f.connect().await;
        let mut states = s.state_changes();
        let id = s.id();
        let (_, watch) = s.exists_watch("/never").await.unwrap();
        s.close().await.unwrap();
        let event = states.next().await.unwrap();
        assert_eq!((event.session_id, event.state), (id, SessionState::Closed));
        assert_eq!(states.next().await, None);
        assert_eq!(fired(watch).await, WatchEvent::SessionEnded { state: SessionState::Closed });
    }
}
