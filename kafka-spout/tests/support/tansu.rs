//! A real Kafka-protocol broker for end-to-end tests: tansu 0.6 on a free loopback port, killed
//! on drop and (through `setpriv --pdeathsig KILL`) with the thread that started it, so it
//! never outlives the test.
//!
//! Tests get its SQLite engine ([`Tansu::start`]), in a directory of their own (on tmpfs when
//! there is one). Its memory engine ([`Tansu::start_in_memory`], what the peers' benchmarks run
//! on) loses acknowledged writes: when two producers start writing fresh partitions at the same
//! moment, the first batch of one of them is sometimes missing from every later read, although
//! librdkafka reported it delivered, and the partition's log then starts after it (low
//! watermark 33, offsets 33..499 present).
//! `the_broker_keeps_every_write_of_two_producers_starting_at_once` failed so on the memory
//! engine within 7 and 23 rounds (249 numbers missing); its produce assigns the offsets in one
//! object-store write and stores the batch in another, with no transaction around the two,
//! where the SQLite engine does both in one. Three pipeline tests lost numbers in CI on the
//! memory engine, in the pattern of such a dropped batch (a draft upstream report:
//! `docs/upstream/tansu-memory-engine-loss.md`).
//!
//! The binary: `$SQUALL_TANSU`, else `tansu` on `PATH` (CI: `cargo install tansu --version
//! 0.6.0 --locked --features dynostore,libsql`, into `~/.cargo/bin`).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

/// A running tansu broker.
pub struct Tansu {
    child: Child,
    binary: PathBuf,
    port: u16,
    log: tempfile::NamedTempFile,
    /// The SQLite engine's database (none for the memory engine); removed on drop.
    _data: Option<tempfile::TempDir>,
}

/// The tansu binary to run.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SQUALL_TANSU") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("tansu")).find(|f| f.is_file()))
        .unwrap_or_default();
    on_path.unwrap_or_else(|| {
        panic!(
            "tansu is not installed: set SQUALL_TANSU to its path or put it on PATH \
             (cargo install tansu --version 0.6.0 --locked --features dynostore,libsql)"
        )
    })
}

use test_harness::free_port;

impl Tansu {
    /// Starts a broker on the SQLite engine (a database in a directory of its own; the memory
    /// engine with `SQUALL_TANSU_ENGINE=memory`) and returns once it answers metadata requests.
    pub fn start() -> Tansu {
        if std::env::var("SQUALL_TANSU_ENGINE").is_ok_and(|e| e == "memory") {
            return Self::start_in_memory();
        }
        // In memory (tmpfs) when the machine has it: SQLite's commits then wait for no disk.
        // On the disk, a loaded CI machine's flushes held the pipeline tests up for seconds.
        let mut builder = tempfile::Builder::new();
        builder.prefix("squall-tansu-");
        let data = builder.tempdir_in("/dev/shm").or_else(|_| builder.tempdir()).unwrap();
        Self::start_on(Some(data))
    }

    /// Starts a broker on the memory engine, which the peers' benchmarks run on (BENCHMARKS.md).
    /// Not for tests that count writes: see the module's doc.
    pub fn start_in_memory() -> Tansu {
        Self::start_on(None)
    }

    fn start_on(data: Option<tempfile::TempDir>) -> Tansu {
        let binary = binary();
        let port = free_port();
        let url = format!("tcp://127.0.0.1:{port}");
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut command = Command::new("setpriv");
        command.args(["--pdeathsig", "KILL", "--"]).arg(&binary);
        command.args(["broker", "--listener-url", &url, "--advertised-listener-url", &url]);
        match &data {
            // A relative `sqlite://` path is the database file in the broker's working directory.
            Some(dir) => command.args(["--storage-engine", "sqlite://tansu.db"]).current_dir(dir.path()),
            None => command.args(["--storage-engine", "memory://tansu/"]),
        };
        let child = command
            .stdin(Stdio::null())
            .stdout(log.reopen().unwrap())
            .stderr(log.reopen().unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let mut tansu = Tansu { child, binary, port, log, _data: data };
        tansu.wait_serving();
        tansu
    }

    fn wait_serving(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("tansu exited with {status}: {}", self.log_tail());
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                let consumer: BaseConsumer =
                    ClientConfig::new().set("bootstrap.servers", self.bootstrap()).create().unwrap();
                if consumer.fetch_metadata(None, Duration::from_secs(2)).is_ok() {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "tansu did not serve within 30 s: {}", self.log_tail());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The broker's process id (`setpriv` execs it), for benches that account its CPU.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Creates `topic` with `partitions` partitions (and a retention config, which tansu
    /// reports only when given at creation).
    pub fn create_topic(&self, topic: &str, partitions: i32) {
        let output = Command::new(&self.binary)
            .args(["topic", "create", topic, "--partitions", &partitions.to_string()])
            .args(["--broker", &format!("tcp://127.0.0.1:{}", self.port)])
            .args(["--config", "retention.ms=86400000"])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "tansu topic create {topic}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        // Wait until the metadata shows every partition.
        let consumer: BaseConsumer =
            ClientConfig::new().set("bootstrap.servers", self.bootstrap()).create().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(m) = consumer.fetch_metadata(Some(topic), Duration::from_secs(2))
                && m.topics()
                    .first()
                    .is_some_and(|t| t.error().is_none() && t.partitions().len() == partitions as usize)
            {
                return;
            }
            assert!(Instant::now() < deadline, "topic {topic} did not appear");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log.path()).unwrap_or_default();
        text.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
