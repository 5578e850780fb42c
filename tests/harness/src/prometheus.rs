//! A real Prometheus server (Debian's `prometheus` package) for tests that check metrics the
//! way an operator's dashboards and alerts read them: scraped, stored, then queried.
//!
//! [`Prometheus::start`] runs one on a free loopback port with its own data directory, killed
//! when dropped (and when the test process dies, like the ZooKeeper servers). Queries go
//! through its HTTP API and come back as JSON.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use crate::spawn::spawn_tied_to_process;

/// The root of Prometheus's own HTTP API (the same prefix as nimbus's, which is Storm UI's; the
/// one spelling `cluster-state/tests/api_paths.rs` allows outside cluster-state).
pub const PROMETHEUS_API: &str = "/api/v1";

/// A running Prometheus; see the module docs.
#[derive(Debug)]
pub struct Prometheus {
    child: Child,
    address: String,
}

impl Prometheus {
    /// Starts Prometheus with `config` (a `prometheus.yml` text) written into `dir`, which
    /// also holds its data and its log (`prometheus.log`). Returns once the process runs; use
    /// [`Prometheus::get`] with a deadline to wait for its first scrapes.
    pub fn start(dir: &Path, config: &str) -> io::Result<Prometheus> {
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let address = format!("127.0.0.1:{port}");
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let mut command = Command::new("prometheus");
        command
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("prometheus-data").display()))
            .arg(format!("--web.listen-address={address}"))
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = spawn_tied_to_process(command).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot run prometheus (Debian's prometheus package; .ci/run installs it): {e}"),
            )
        })?;
        Ok(Prometheus { child, address })
    }

    /// `host:port` of its HTTP API.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// `GET <PROMETHEUS_API>/path` as JSON; `None` while it does not answer (or answers
    /// something that is not JSON).
    pub fn get(&self, path: &str) -> Option<serde_json::Value> {
        let mut stream = TcpStream::connect(&self.address).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        let request = format!("GET {PROMETHEUS_API}/{path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.address);
        stream.write_all(request.as_bytes()).ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).ok()?;
        let body = text.split_once("\r\n\r\n")?.1;
        serde_json::from_str(body).ok()
    }

    /// The result vector of the instant query `query`, when Prometheus answered with success.
    pub fn query(&self, query: &str) -> Option<Vec<serde_json::Value>> {
        let reply = self.get(&format!("query?query={}", encode(query)))?;
        if reply.get("status")?.as_str()? != "success" {
            return None;
        }
        reply.get("data")?.get("result")?.as_array().cloned()
    }

    /// The values of the instant query `query` as numbers, when it returned exactly one series.
    pub fn query_one(&self, query: &str) -> Option<f64> {
        let result = self.query(query)?;
        let [series] = result.as_slice() else { return None };
        series.get("value")?.get(1)?.as_str()?.parse().ok()
    }

    /// The samples (seconds since the epoch, value) of `query` from `start` to `end` (seconds
    /// since the epoch) every `step`, when it returned exactly one series.
    pub fn query_range_one(
        &self,
        query: &str,
        start: f64,
        end: f64,
        step: Duration,
    ) -> Option<Vec<(f64, f64)>> {
        let path = format!(
            "query_range?query={}&start={start:.3}&end={end:.3}&step={:.3}",
            encode(query),
            step.as_secs_f64()
        );
        let reply = self.get(&path)?;
        let result = reply.get("data")?.get("result")?.as_array()?;
        let [series] = result.as_slice() else { return None };
        series
            .get("values")?
            .as_array()?
            .iter()
            .map(|v| Some((v.get(0)?.as_f64()?, v.get(1)?.as_str()?.parse().ok()?)))
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Percent-encodes a query for a URL.
pub fn encode(query: &str) -> String {
    query
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
