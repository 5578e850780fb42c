//! `squall local`: the README's main job runs with nothing installed (nimbus, a supervisor and
//! the workers in one process over in-memory coordination) and prints counts; the Kafka word
//! count runs on the embedded Kafka; a bad topology file is refused with the file, line and
//! element named.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;

fn squall() -> Command {
    Command::new(env!("CARGO_BIN_EXE_squall"))
}

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name).display().to_string()
}

#[test]
fn wordcount_example_runs_and_prints_counts_and_a_summary() {
    let out = squall()
        .args(["local", &example("wordcount.yaml"), "--duration", "8", "--progress", "1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}");
    // The stdout sink prints the running count of "squall": 1, 2, 3, ... in order (global grouping).
    let counts: Vec<u64> =
        stdout.lines().map(|l| l.strip_prefix("squall\t").unwrap().parse().unwrap()).collect();
    assert!(!counts.is_empty(), "no counts printed; stderr: {stderr}");
    assert!(counts.windows(2).all(|w| w[1] == w[0] + 1), "counts out of order: {counts:?}");
    assert!(stderr.contains("running topology wordcount"), "{stderr}");
    assert!(stderr.lines().any(|l| l.starts_with("[") && l.contains("sentences: emitted")), "{stderr}");
    let summary: Vec<&str> =
        stderr.lines().skip_while(|l| !l.starts_with("component")).filter(|l| !l.is_empty()).collect();
    assert_eq!(summary.len(), 6, "header and five components: {stderr}");
    // component, executors, emitted, acked, failed, complete ms
    let row = |name: &str| -> (u64, u64) {
        let cells: Vec<&str> =
            summary.iter().find(|l| l.starts_with(&format!("{name} "))).unwrap().split_whitespace().collect();
        (cells[2].parse().unwrap(), cells[3].parse().unwrap())
    };
    let (emitted, acked) = row("sentences");
    assert!(acked > 0, "{stderr}");
    // The workers' own final counts, after their tuples in flight drained: every tree that
    // began completed, and each bolt acked what it was sent.
    assert!(stderr.contains("final counts, tuples in flight drained"), "{stderr}");
    assert_eq!(acked, emitted, "{stderr}");
    assert_eq!(row("split").1, emitted, "{stderr}");
    assert_eq!(row("count").1, row("split").0, "{stderr}");
}

#[test]
fn kafka_wordcount_runs_on_the_embedded_kafka() {
    let out = squall()
        .args(["local", &example("kafka-wordcount.yaml"), "--duration", "4", "--progress", "1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}");
    assert!(stderr.contains("embedded Kafka at"), "{stderr}");
    assert!(stdout.lines().any(|l| l.starts_with("squall\t")), "no counts printed; stderr: {stderr}");
    let kafka: Vec<&str> =
        stderr.lines().find(|l| l.starts_with("kafka ")).unwrap().split_whitespace().collect();
    let (emitted, acked): (u64, u64) = (kafka[2].parse().unwrap(), kafka[3].parse().unwrap());
    assert!(acked > 0 && acked <= emitted, "{stderr}");
}

#[test]
fn a_bad_topology_file_names_the_file_line_and_element() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    std::fs::write(&file, "name: x\nspouts:\n  - id: s\n    className: no-such-spout\n    parallelism: 1\n")
        .unwrap();
    let out = squall().args(["local", file.to_str().unwrap(), "--duration", "1"]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bad.yaml") && stderr.contains("line 4") && stderr.contains("no-such-spout"),
        "{stderr}"
    );

    let out = squall().args(["local", "/nonexistent/topology.yaml"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/topology.yaml"));
}

/// Issue 15: `squall local` serves the Kafka components' metrics (they are shared by its
/// in-process workers, so they are served once, with nimbus's).
#[test]
fn squall_local_serves_the_kafka_spout_metrics() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = squall()
        .args(["local", &example("kafka-wordcount.yaml"), "--duration", "20", "--progress", "0"])
        .args(["--metrics-port", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let scrape = || -> Option<String> {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: local\r\nConnection: close\r\n\r\n").ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).ok()?;
        Some(text)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    let found = loop {
        if let Some(text) = scrape() {
            if text.lines().any(|l| l.starts_with("squall_spout_emitted_total{") && !l.ends_with(" 0")) {
                break true;
            }
            last = text;
        }
        if Instant::now() >= deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    assert!(
        found,
        "no emitting squall_spout_emitted_total series on port {port}; last scrape:\n{last}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
