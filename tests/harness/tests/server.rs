//! Tests of the ZooKeeper harness against real servers.

// Test code: unwrap/expect/panic are how a test (and its helpers) fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write as _;
use std::net::TcpStream;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use test_harness::ZkServer;
use zookeeper_client as zk;
use zookeeper_client::SessionState;

const GONE_DEADLINE: Duration = Duration::from_secs(10);

fn persistent() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

fn ephemeral() -> zk::CreateOptions<'static> {
    zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all())
}

/// Dead: no such process, or a zombie nobody has reaped yet.
fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

fn wait_until_gone(pid: u32) {
    test_harness::wait_for(GONE_DEADLINE, &format!("process {pid} to be gone"), || process_gone(pid));
}

/// Records every session state change of `client` with the time since this call.
fn record_states(client: &zk::Client) -> Arc<Mutex<Vec<(Duration, SessionState)>>> {
    let states = Arc::new(Mutex::new(Vec::new()));
    let mut watcher = client.state_watcher();
    let started = Instant::now();
    let recorded = Arc::clone(&states);
    tokio::spawn(async move {
        loop {
            let state = watcher.changed().await;
            recorded.lock().unwrap().push((started.elapsed(), state));
            if state.is_terminated() {
                break;
            }
        }
    });
    states
}

async fn wait_for_state(watcher: &mut zk::StateWatcher, wanted: SessionState, within: Duration) {
    tokio::time::timeout(within, async { while watcher.changed().await != wanted {} })
        .await
        .unwrap_or_else(|_| panic!("session did not reach {wanted:?} within {within:?}"));
}

#[tokio::test]
async fn private_server_survives_stop_and_restart() {
    let started = Instant::now();
    let mut server = ZkServer::start();
    eprintln!("private server serving after {:?}", started.elapsed());
    let port = server.port();
    let connect = server.connect_string();
    assert_eq!(connect, format!("127.0.0.1:{port}"));

    let client = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&connect)
        .await
        .unwrap();
    client.create("/survivor", b"v1", &persistent()).await.unwrap();
    client.create("/mine", b"", &ephemeral()).await.unwrap();
    let session = client.session_id();
    let states = record_states(&client);
    let mut watcher = client.state_watcher();

    server.stop();
    assert_eq!(server.pid(), None);
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "port still open after stop");
    wait_for_state(&mut watcher, SessionState::Disconnected, Duration::from_secs(5)).await;
    // Requests made while disconnected are queued, not failed: they complete after a reconnect (or
    // fail with SessionExpired once the client gives the session up).
    let mut queued = Box::pin(client.get_data("/survivor"));
    assert!(tokio::time::timeout(Duration::from_millis(300), &mut queued).await.is_err());
    let refused = zk::Client::connector().with_fail_eagerly().connect(&connect).await;
    assert_eq!(refused.unwrap_err(), zk::Error::NoHosts);

    let restarted = Instant::now();
    server.start_again();
    eprintln!("restarted server serving after {:?}", restarted.elapsed());
    assert_eq!(server.port(), port);
    wait_for_state(&mut watcher, SessionState::SyncConnected, Duration::from_secs(10)).await;
    eprintln!("client reconnected {:?} after the restart", restarted.elapsed());

    // A quick restart keeps the session: same id, and its ephemeral node is still there.
    assert_eq!(client.session_id(), session);
    assert_eq!(queued.await.unwrap().0, b"v1");
    assert_eq!(client.get_data("/survivor").await.unwrap().0, b"v1");
    assert!(client.check_stat("/mine").await.unwrap().is_some());
    let other = zk::Client::connect(&connect).await.unwrap();
    assert_eq!(other.get_data("/survivor").await.unwrap().0, b"v1");

    server.restart();
    // `other` may not have noticed the restart yet (its first request can meet the dead socket
    // and fail with ConnectionLoss, or, on a loaded machine, wait out the client's connection
    // timeout: "no response from connection"): retry until it has reconnected, keeping its
    // session.
    let deadline = Instant::now() + Duration::from_secs(20);
    let data = loop {
        match other.get_data("/survivor").await {
            Ok((data, _)) => break data,
            Err(e) if !matches!(e, zk::Error::SessionExpired) && Instant::now() < deadline => {
                eprintln!("reading after the restart: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("reading after the restart: {e}"),
        }
    };
    assert_eq!(data, b"v1");
    eprintln!("session states: {:?}", states.lock().unwrap());
}

#[tokio::test]
async fn outage_longer_than_the_session_timeout_expires_the_session() {
    let mut server = ZkServer::start();
    let connect = server.connect_string();
    let client = zk::Client::connector()
        .with_session_timeout(Duration::from_millis(1000))
        .connect(&connect)
        .await
        .unwrap();
    client.create("/mine", b"", &ephemeral()).await.unwrap();
    let states = record_states(&client);
    let mut watcher = client.state_watcher();

    let stopped = Instant::now();
    server.stop();
    // The client gives up on its own while the server is still down (7/5 of the session timeout).
    wait_for_state(&mut watcher, SessionState::Expired, Duration::from_secs(10)).await;
    eprintln!("client-side expiry {:?} after the stop", stopped.elapsed());
    assert_eq!(client.get_data("/").await.unwrap_err(), zk::Error::SessionExpired);

    server.start_again();
    // The server restores the session from its log and expires it one session timeout later.
    let other = zk::Client::connect(&connect).await.unwrap();
    let restarted = Instant::now();
    while other.check_stat("/mine").await.unwrap().is_some() {
        assert!(restarted.elapsed() < Duration::from_secs(10), "ephemeral node outlived its session");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("server removed the ephemeral node {:?} after the restart", restarted.elapsed());
    eprintln!("session states: {:?}", states.lock().unwrap());
}

#[tokio::test]
async fn chroots_isolate_tests() {
    let server = ZkServer::shared();
    let a = server.chroot("chroots_isolate_tests").await;
    let b = server.chroot("chroots_isolate_tests").await;
    assert_ne!(a, b);
    for chroot in [&a, &b] {
        assert!(chroot.starts_with(&format!("{}/t-chroots_isolate_tests-", server.connect_string())));
    }

    let client_a = zk::Client::connect(&a).await.unwrap();
    let client_b = zk::Client::connect(&b).await.unwrap();
    client_a.create("/node", b"a", &persistent()).await.unwrap();
    client_b.create("/node", b"b", &persistent()).await.unwrap();
    assert_eq!(client_a.get_data("/node").await.unwrap().0, b"a");
    assert_eq!(client_b.get_data("/node").await.unwrap().0, b"b");
    client_a.create("/only-a", b"", &persistent()).await.unwrap();
    assert_eq!(client_b.list_children("/").await.unwrap(), vec!["node".to_owned()]);

    let odd = server.chroot("module::odd name/with slash").await;
    assert!(odd.contains("/t-module__odd_name_with_slash-"), "{odd}");
}

#[tokio::test]
async fn shared_is_one_server_per_process() {
    let first = ZkServer::shared();
    let second = thread::spawn(ZkServer::shared).join().unwrap();
    assert!(std::ptr::eq(first, second));
    assert_eq!(first.port(), second.port());
    let client = zk::Client::connect(&first.connect_string()).await.unwrap();
    client.list_children("/").await.unwrap();
}

#[test]
fn server_outlives_the_thread_that_started_it() {
    // PDEATHSIG fires when the forking *thread* exits; the harness must not fork from test threads.
    let server = thread::spawn(ZkServer::start).join().unwrap();
    let pid = server.pid().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let client = zk::Client::connect(&server.connect_string()).await.unwrap();
        client.create("/alive", b"", &persistent()).await.unwrap();
    });
    assert!(!process_gone(pid));
}

#[test]
fn panicking_test_kills_its_private_server() {
    let (pid_sender, pid) = std::sync::mpsc::channel();
    let test = thread::spawn(move || {
        let server = ZkServer::start();
        pid_sender.send(server.pid().unwrap()).unwrap();
        panic!("deliberate panic with a private ZooKeeper server alive");
    });
    assert!(test.join().is_err());
    wait_until_gone(pid.recv().unwrap());
}

#[test]
fn dropping_kills_and_reaps() {
    let server = ZkServer::start();
    let pid = server.pid().unwrap();
    let dir = server.data_dir();
    drop(server);
    assert!(process_gone(pid));
    assert!(!dir.exists());
}

const HELPER_ENV: &str = "SQUALL_HARNESS_EXIT_HELPER";

/// Run as a child process by `process_exit_kills_all_servers`; a no-op otherwise.
#[test]
fn exit_helper() {
    if std::env::var_os(HELPER_ENV).is_none() {
        return;
    }
    let private = ZkServer::start();
    let shared = ZkServer::shared();
    let mut out = std::io::stdout();
    writeln!(out, "private-pid={}", private.pid().unwrap()).unwrap();
    writeln!(out, "shared-pid={}", shared.pid().unwrap()).unwrap();
    writeln!(out, "private-dir={}", private.data_dir().display()).unwrap();
    writeln!(out, "shared-dir={}", shared.data_dir().display()).unwrap();
    out.flush().unwrap();
    // Leave without dropping anything, as a crashing test binary would.
    std::mem::forget(private);
    std::process::exit(0);
}

#[test]
fn process_exit_kills_all_servers() {
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "exit_helper", "--nocapture", "--test-threads=1"])
        .env(HELPER_ENV, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "helper failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let value = |key: &str| {
        stdout
            .split_whitespace()
            .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {key} in helper output: {stdout}"))
            .to_owned()
    };
    wait_until_gone(value("private-pid").parse().unwrap());
    wait_until_gone(value("shared-pid").parse().unwrap());
    assert!(!std::path::Path::new(&value("shared-dir")).exists(), "shared server directory left behind");
    // The helper leaked its private server's directory on purpose; clean up after it.
    let private_dir = std::path::PathBuf::from(value("private-dir"));
    std::fs::remove_dir_all(private_dir.parent().unwrap()).unwrap();
}
