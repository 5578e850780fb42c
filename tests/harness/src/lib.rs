//! Real ZooKeeper servers for Squall's integration tests.
//!
//! [`ZkServer`] runs an actual ZooKeeper 3.8 JVM (`QuorumPeerMain`, standalone) on a free loopback port
//! with its own temporary data directory. Start-up takes about 0.3 s.
//!
//! # Which server to use
//!
//! * [`ZkServer::shared()`]: one server per test binary, started lazily by the first test that asks for
//!   it and shared by all tests of that binary (`cargo test` runs them concurrently on threads). Give
//!   every test its own subtree with [`ZkServer::chroot`], so tests never see each other's nodes and
//!   never depend on each other. The shared server must not be stopped, which is why [`stop`] and
//!   [`restart`] take `&mut self` and `shared()` hands out only a `&'static` reference.
//! * [`ZkServer::start()`]: a private server owned by the test. Use it for everything that stops or
//!   restarts ZooKeeper (outage tests) or otherwise disturbs the server. It is killed when dropped,
//!   including when the test panics.
//!
//! ```no_run
//! use test_harness::ZkServer;
//! use zookeeper_client as zk;
//!
//! #[tokio::test]
//! async fn creates_a_node() {
//!     // A subtree of its own on the per-binary server: "127.0.0.1:PORT/t-creates_a_node-PID-N".
//!     let connect = ZkServer::shared().chroot("creates_a_node").await;
//!     let client = zk::Client::connect(&connect).await.unwrap();
//!     let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
//!     client.create("/x", b"data", &persistent).await.unwrap();
//! }
//!
//! #[tokio::test]
//! async fn survives_an_outage() {
//!     let mut server = ZkServer::start(); // private: this test stops it
//!     let client = zk::Client::connect(&server.connect_string()).await.unwrap();
//!     server.stop(); // kills the JVM; the data directory is kept
//!     // ... operations now fail with ConnectionLoss ...
//!     server.start_again(); // same port, same data; returns once the server serves again
//!     // ... the client reconnects on its own ...
//! }
//! ```
//!
//! # No stray JVMs
//!
//! The JVM is a direct child of the test process (no wrapper script) and is spawned with
//! `PR_SET_PDEATHSIG = SIGKILL` from a dedicated thread that lives as long as the process, so it is
//! killed whenever the test process ends, even by `SIGKILL` or `panic = "abort"`. A private server is
//! also killed and reaped when it is dropped, which includes unwinding from a failed test. The shared
//! server is killed, and its directory removed, at process exit.
//!
//! # Requirements and environment
//!
//! By default the harness uses Debian's `zookeeper` package (`apt-get install -y zookeeper`):
//! `/usr/share/java/zookeeper.jar` (its manifest pulls in the dependencies) plus
//! `/usr/share/java/slf4j-simple.jar`, if present, so that the server log is not discarded. Elsewhere:
//!
//! * `SQUALL_JAVA`: the `java` executable to use (default: `java` on `PATH`).
//! * `SQUALL_ZK_CLASSPATH`: the complete class path of the server, used verbatim, e.g.
//!   `/opt/apache-zookeeper-3.8.4-bin/lib/*` for an Apache release tarball (Java expands the `*`).
//!
//! # Server settings
//!
//! `tickTime=200`, so sessions may negotiate timeouts from 400 ms (`minSessionTimeout`) to 60 s, and
//! expire promptly in expiry tests. `forceSync=no` (data still survives [`stop`], which kills the process
//! but not the machine). No limit on connections per client address (`maxClientCnxns=0`: the scale
//! bench opens thousands of sessions from one address). Four-letter words `ruok`, `srvr`, `conf` and
//! `mntr` are enabled ([`ZkServer::four_letter`], [`ZkServer::transactions`], [`ZkServer::mntr`]); the admin server is off. Server output (stdout, stderr and the SLF4J log) goes
//! to `zookeeper-N.log` in the server's temporary directory, one file per launch; see
//! [`ZkServer::log_path`]. A server that fails to come up panics with the tail of that log.
//!
//! # Outage tests with `zookeeper-client` 0.11
//!
//! Observed behaviour, useful when writing tests around [`stop`] / [`start_again`]:
//!
//! * On [`stop`] the client goes `Disconnected` at once. Requests in flight fail with `ConnectionLoss`;
//!   requests made *while* disconnected are queued and complete after the reconnect.
//! * If the server is back within the session timeout, the session survives (same id, ephemeral nodes
//!   kept): `Disconnected` → `SyncConnected`.
//! * Otherwise the client expires the session *itself* 7/5 of the session timeout after it last heard
//!   from the server, even while the server is still down: `Disconnected` → `Expired`; queued requests
//!   then fail with `SessionExpired`. The restarted server restores the session from its log and
//!   expires it (deleting its ephemeral nodes) about one session timeout after coming up.
//! * Reconnect attempts back off exponentially (100 ms, 200 ms, 400 ms, … plus jitter), so after an
//!   outage of a few seconds the client may need a few more seconds to notice the server is back.
//! * [`stop`], [`start_again`] and [`restart`] block the calling thread (about 0.3 s for a start). On a
//!   current-thread runtime the client cannot run meanwhile; use `tokio::task::block_in_place` on a
//!   multi-thread runtime if the client must observe the outage while it happens.
//!
//! [`stop`]: ZkServer::stop
//! [`start_again`]: ZkServer::start_again
//! [`restart`]: ZkServer::restart

// Test-support code: panicking with a clear message is how a broken test environment is reported.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod logs;
pub mod measure;
mod ports;
pub mod prometheus;
pub mod promtool;
mod relay;
mod spawn;
pub mod tls;
mod wait;

pub use ports::free_port;
use ports::try_free_port;
pub use relay::TcpRelay;
pub use wait::{eventually, eventually_true, wait_for, wait_until};

use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};
use std::{env, thread};

use tempfile::TempDir;
use zookeeper_client as zk;

/// Environment variable naming the `java` executable to run.
pub const JAVA_ENV: &str = "SQUALL_JAVA";
/// Environment variable holding the complete class path of the ZooKeeper server.
pub const CLASSPATH_ENV: &str = "SQUALL_ZK_CLASSPATH";

const DEBIAN_ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
const DEBIAN_SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";
const MAIN_CLASS: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";

/// Lean JVM settings: start-up time matters more than throughput for a test server.
const JVM_FLAGS: &[&str] = &[
    "-Xmx256m",
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-XX:-UsePerfData",
    "-Dzookeeper.admin.enableServer=false",
    "-Dzookeeper.jmx.log4j.disable=true",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
];

/// How long a launch may take until the server serves.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Interval between readiness probes while a server is starting.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Fresh ports tried by [`ZkServer::start`] when the JVM dies early (most likely: port taken meanwhile).
const START_ATTEMPTS: u32 = 5;
/// Launches tried by [`ZkServer::start_again`], which must reuse its port.
const RESTART_ATTEMPTS: u32 = 20;
const RESTART_RETRY_DELAY: Duration = Duration::from_millis(250);
const LOG_TAIL_LINES: usize = 60;

static SHARED: OnceLock<Result<ZkServer, String>> = OnceLock::new();

/// A ZooKeeper server process for tests. See the [crate docs](crate).
#[derive(Debug)]
pub struct ZkServer {
    /// Holds `zoo.cfg`, the logs and `data/`.
    dir: TempDir,
    port: u16,
    /// Behind a mutex only so that the process-exit hook can kill the shared server through `&self`.
    child: Mutex<Option<Child>>,
    launches: u32,
}

impl ZkServer {
    /// Starts a private server on a free loopback port with a fresh data directory, and returns once
    /// it serves.
    ///
    /// # Panics
    /// If java or ZooKeeper is missing (the message says how to install them), or if the server does
    /// not come up within 30 s (the message includes the tail of the server log).
    pub fn start() -> ZkServer {
        Self::try_start("squall-zk-").unwrap_or_else(|message| panic!("{message}"))
    }

    /// The server shared by all tests of this test binary, started on first use.
    ///
    /// Tests using it must work below their own [`chroot`](Self::chroot) and must not depend on each
    /// other. Tests that stop or restart ZooKeeper need a private server from [`start`](Self::start).
    /// The server is killed, and its data removed, when the process exits.
    ///
    /// # Panics
    /// Like [`start`](Self::start); once the shared server failed to start, every call panics with the
    /// same message instead of trying again.
    pub fn shared() -> &'static ZkServer {
        let server = SHARED.get_or_init(|| {
            let server = Self::try_start("squall-zk-shared-");
            if server.is_ok() {
                exit_hook::register();
            }
            server
        });
        match server {
            Ok(server) => server,
            Err(message) => panic!("the shared ZooKeeper server is unavailable: {message}"),
        }
    }

    /// `127.0.0.1:PORT`, for `zookeeper_client::Client::connect`.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The client port; it stays the same across [`stop`](Self::stop) and
    /// [`start_again`](Self::start_again).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Creates a fresh persistent node `/t-<test_name>-<pid>-<n>` and returns the connect string rooted
    /// there (`127.0.0.1:PORT/t-...`). A client connected with it sees only that subtree, so tests
    /// sharing a server are isolated from each other. Characters of `test_name` other than ASCII
    /// letters, digits, `_`, `.` and `-` are replaced by `_`.
    ///
    /// # Panics
    /// If the server cannot be reached (for example because it is stopped) or the node cannot be
    /// created.
    pub async fn chroot(&self, test_name: &str) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let connect = self.connect_string();
        let client =
            zk::Client::connector().with_fail_eagerly().connect(&connect).await.unwrap_or_else(|e| {
                panic!("cannot connect to ZooKeeper at {connect} to create a chroot: {e}")
            });
        let name: String = test_name
            .chars()
            .take(100)
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') { c } else { '_' })
            .collect();
        let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = format!("/t-{name}-{}-{n}", std::process::id());
            match client.create(&path, &[], &persistent).await {
                Ok(_) => return format!("{connect}{path}"),
                Err(zk::Error::NodeExists) => continue,
                Err(e) => panic!("cannot create chroot node {path} on ZooKeeper at {connect}: {e}"),
            }
        }
    }

    /// Kills the server (SIGKILL, i.e. a crash) and waits for the process to be gone. The port is then
    /// closed; the data directory is kept for [`start_again`](Self::start_again). Does nothing if the
    /// server is already stopped.
    pub fn stop(&mut self) {
        kill_and_reap(self.child.get_mut().unwrap_or_else(PoisonError::into_inner));
    }

    /// Starts the stopped server again on the same port with the same data, and returns once it serves.
    /// Persistent nodes survive; sessions survive if clients reconnect within their session timeout.
    ///
    /// # Panics
    /// If the server is running, or it does not come up again (for example because another process
    /// took the port meanwhile); the message includes the tail of the server log.
    pub fn start_again(&mut self) {
        assert!(self.pid().is_none(), "start_again: the ZooKeeper server on port {} is running", self.port);
        let mut attempt = 1;
        loop {
            match self.launch() {
                Ok(()) => return,
                Err(LaunchError::Exited(_)) if attempt < RESTART_ATTEMPTS => {
                    attempt += 1;
                    thread::sleep(RESTART_RETRY_DELAY);
                }
                Err(e) => panic!("{}", self.failure("could not restart ZooKeeper", &e)),
            }
        }
    }

    /// [`stop`](Self::stop) followed by [`start_again`](Self::start_again).
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// The answer to a four-letter word (`srvr`, `mntr`, ...).
    pub fn four_letter(&self, word: &str) -> io::Result<String> {
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(word.as_bytes())?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response)?;
        Ok(String::from_utf8_lossy(&response).into_owned())
    }

    /// The server's own count of committed transactions: the counter part of its last zxid
    /// (`srvr`'s `Zxid`), which grows by one per transaction (create, setData, delete, multi,
    /// session create and close) within an epoch. Compare two readings of one running server.
    pub fn transactions(&self) -> io::Result<u64> {
        let srvr = self.four_letter("srvr")?;
        let zxid = srvr
            .lines()
            .find_map(|l| l.strip_prefix("Zxid: 0x"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .ok_or_else(|| io::Error::other(format!("no Zxid in srvr's answer: {srvr}")))?;
        Ok(zxid & 0xffff_ffff)
    }

    /// `mntr`'s key-value lines (`zk_packets_received`, `zk_znode_count`, ...).
    pub fn mntr(&self) -> io::Result<std::collections::BTreeMap<String, String>> {
        Ok(self
            .four_letter("mntr")?
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
            .collect())
    }

    /// Process id of the running JVM; `None` while stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child_slot().as_ref().map(Child::id)
    }

    /// The log file of the most recent launch.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join(format!("zookeeper-{}.log", self.launches))
    }

    /// ZooKeeper's `dataDir`; it lives as long as this value.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn try_start(prefix: &str) -> Result<ZkServer, String> {
        launcher()?;
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .map_err(|e| format!("cannot create a temporary directory for ZooKeeper: {e}"))?;
        let mut server = ZkServer { dir, port: 0, child: Mutex::new(None), launches: 0 };
        fs::create_dir(server.data_dir())
            .map_err(|e| format!("cannot create {}: {e}", server.data_dir().display()))?;
        let mut attempt = 1;
        loop {
            server.port = try_free_port().map_err(|e| format!("cannot find a free loopback port: {e}"))?;
            server.write_config().map_err(|e| format!("cannot write zoo.cfg: {e}"))?;
            match server.launch() {
                Ok(()) => return Ok(server),
                // Most likely someone else bound the port between our probe and the JVM's bind.
                Err(LaunchError::Exited(_)) if attempt < START_ATTEMPTS => attempt += 1,
                Err(e) => return Err(server.failure("could not start ZooKeeper", &e)),
            }
        }
    }

    fn write_config(&self) -> io::Result<()> {
        let data_dir = self.data_dir();
        let data_dir = data_dir.to_str().ok_or_else(|| io::Error::other("temporary path is not UTF-8"))?;
        let config = format!(
            "tickTime=200\n\
             dataDir={}\n\
             clientPort={}\n\
             clientPortAddress=127.0.0.1\n\
             minSessionTimeout=400\n\
             maxSessionTimeout=60000\n\
             maxClientCnxns=0\n\
             forceSync=no\n\
             admin.enableServer=false\n\
             4lw.commands.whitelist=ruok,srvr,conf,mntr\n",
            data_dir.replace('\\', "\\\\"),
            self.port,
        );
        fs::write(self.config_path(), config)
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("zoo.cfg")
    }

    /// Launches the JVM and waits until it serves, exits, or [`START_TIMEOUT`] passes.
    fn launch(&mut self) -> Result<(), LaunchError> {
        let launcher = launcher().map_err(LaunchError::Setup)?;
        self.launches += 1;
        let log = File::create(self.log_path()).map_err(LaunchError::Spawn)?;
        let mut command = Command::new(&launcher.java);
        command
            .args(JVM_FLAGS)
            .arg("-cp")
            .arg(&launcher.classpath)
            .arg(MAIN_CLASS)
            .arg(self.config_path())
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(LaunchError::Spawn)?)
            .stderr(log);
        let child = spawn::spawn_tied_to_process(command).map_err(LaunchError::Spawn)?;
        *self.child.get_mut().unwrap_or_else(PoisonError::into_inner) = Some(child);

        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let slot = self.child.get_mut().unwrap_or_else(PoisonError::into_inner);
            if let Some(child) = slot.as_mut() {
                match child.try_wait() {
                    Ok(None) => {}
                    Ok(Some(status)) => {
                        *slot = None;
                        return Err(LaunchError::Exited(status));
                    }
                    Err(e) => {
                        kill_and_reap(slot);
                        return Err(LaunchError::Spawn(e));
                    }
                }
            }
            if self.serves() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.stop();
                return Err(LaunchError::TimedOut);
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Whether *this* server answers on its port: `conf` reports our data directory, and only once the
    /// server is actually serving (unlike `ruok`, which answers as soon as the port is open). This also
    /// tells our server apart from a foreign process that may have grabbed the port.
    fn serves(&self) -> bool {
        let probe = || -> io::Result<Vec<u8>> {
            let address = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
            let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1))?;
            stream.set_read_timeout(Some(Duration::from_secs(2)))?;
            stream.set_write_timeout(Some(Duration::from_secs(2)))?;
            stream.write_all(b"conf")?;
            let mut response = Vec::new();
            stream.read_to_end(&mut response)?;
            Ok(response)
        };
        let Ok(response) = probe() else { return false };
        let expected = self.data_dir().join("version-2");
        String::from_utf8_lossy(&response)
            .lines()
            .filter_map(|line| line.strip_prefix("dataDir="))
            .any(|dir| Path::new(dir) == expected)
    }

    fn failure(&self, what: &str, error: &LaunchError) -> String {
        let log_path = self.log_path();
        let mut message = format!("{what} on 127.0.0.1:{}: {error}\n", self.port);
        let _ = writeln!(message, "--- last {LOG_TAIL_LINES} lines of {} ---", log_path.display());
        match fs::read(&log_path) {
            Ok(log) => {
                let log = String::from_utf8_lossy(&log);
                let lines: Vec<&str> = log.lines().collect();
                for line in &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..] {
                    let _ = writeln!(message, "{line}");
                }
            }
            Err(e) => {
                let _ = writeln!(message, "(cannot read the log: {e})");
            }
        }
        message.push_str("--- end of log ---");
        message
    }

    fn child_slot(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn kill_and_reap(slot: &mut Option<Child>) {
    if let Some(mut child) = slot.take() {
        // Fails only if the process has already exited, in which case `wait` reaps it.
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[derive(Debug)]
enum LaunchError {
    Setup(String),
    Spawn(io::Error),
    Exited(ExitStatus),
    TimedOut,
}

impl std::fmt::Display for LaunchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LaunchError::Setup(message) => f.write_str(message),
            LaunchError::Spawn(e) => write!(f, "cannot launch java: {e}"),
            LaunchError::Exited(status) => write!(f, "the server exited during start-up ({status})"),
            LaunchError::TimedOut => {
                write!(f, "the server did not serve within {} s (killed)", START_TIMEOUT.as_secs())
            }
        }
    }
}

#[derive(Debug)]
struct Launcher {
    java: PathBuf,
    classpath: OsString,
}

fn launcher() -> Result<&'static Launcher, String> {
    static LAUNCHER: OnceLock<Result<Launcher, String>> = OnceLock::new();
    LAUNCHER
        .get_or_init(|| Ok(Launcher { java: find_java()?, classpath: find_classpath()? }))
        .as_ref()
        .map_err(Clone::clone)
}

const INSTALL_HINT: &str = "install ZooKeeper and Java with `apt-get install -y zookeeper`, or point \
                            SQUALL_JAVA at a java executable and SQUALL_ZK_CLASSPATH at the ZooKeeper \
                            server's class path (e.g. `/opt/zookeeper/lib/*`)";

fn find_java() -> Result<PathBuf, String> {
    if let Some(java) = env::var_os(JAVA_ENV) {
        let java = PathBuf::from(java);
        return if java.is_file() {
            Ok(java)
        } else {
            Err(format!("{JAVA_ENV}={} is not a file; {INSTALL_HINT}", java.display()))
        };
    }
    env::split_paths(&env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("java"))
        .find(|java| java.is_file())
        .ok_or_else(|| format!("no `java` on PATH, needed to run ZooKeeper; {INSTALL_HINT}"))
}

fn find_classpath() -> Result<OsString, String> {
    if let Some(classpath) = env::var_os(CLASSPATH_ENV) {
        return Ok(classpath);
    }
    if !Path::new(DEBIAN_ZOOKEEPER_JAR).is_file() {
        return Err(format!(
            "ZooKeeper is not installed ({DEBIAN_ZOOKEEPER_JAR} is missing); {INSTALL_HINT}"
        ));
    }
    let mut classpath = OsString::from(DEBIAN_ZOOKEEPER_JAR);
    if Path::new(DEBIAN_SLF4J_SIMPLE_JAR).is_file() {
        classpath.push(":");
        classpath.push(DEBIAN_SLF4J_SIMPLE_JAR);
    }
    Ok(classpath)
}

/// Cleans up the shared server at process exit: statics are never dropped. Killing the JVM is not
/// strictly needed (PDEATHSIG does that too) but must precede removing its data directory.
mod exit_hook {
    use super::{SHARED, kill_and_reap};

    pub(super) fn register() {
        #[allow(unsafe_code)]
        // SAFETY: `cleanup` is an `extern "C" fn()` as atexit(3) requires; it cannot unwind (it contains
        // no panicking operations, and a panic would abort rather than unwind across the boundary).
        let _registered = unsafe { libc::atexit(cleanup) };
        // If registration failed, PDEATHSIG still kills the JVM; only the directory would be left behind.
    }

    extern "C" fn cleanup() {
        if let Some(Ok(server)) = SHARED.get() {
            kill_and_reap(&mut server.child_slot());
            let _ = std::fs::remove_dir_all(server.dir.path());
        }
    }
}
