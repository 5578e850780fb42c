//! Logs of a real multi-process cluster (issue #19): nimbus, a supervisor and its worker write
//! plain text to their log files, never a colour escape (they are not terminals); a supervisor
//! started with `--log-format json` writes one JSON object a line; and an operator verb prints
//! its result alone on stdout, its own logs staying at warn.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use test_harness::eventually;

#[path = "support/cluster.rs"]
mod support;
use support::{Cluster, SQUALL, free_port, text};

/// Every `*.log` file under `dir`.
fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(log_files(&path));
        } else if path.extension().is_some_and(|e| e == "log") {
            out.push(path);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_process_logs_plain_text_to_its_file_and_json_when_asked() {
    let mut cluster = Cluster::new("logs_plain_text").await;
    cluster.start_nimbus();
    let mut json_supervisor = cluster.daemon_args("supervisor", "sup-a");
    json_supervisor.extend(["-c".into(), format!("supervisor.slots.ports=[{}]", free_port())]);
    json_supervisor.extend(["--log-format".into(), "json".into()]);
    cluster.spawn("sup-a", &json_supervisor);
    let example =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/wordcount.yaml"))
            .unwrap();
    let file = cluster.dir("wordcount.yaml");
    std::fs::write(&file, example.replace("topology.workers: 2", "topology.workers: 1")).unwrap();
    eventually(Duration::from_secs(60), "nimbus to take the submit", || async {
        let out = cluster.squall(&["submit", file.to_str().unwrap()]);
        out.status.success().then_some(())
    })
    .await;
    // The worker has run long enough to log its start and print counts.
    let worker_log = eventually(Duration::from_secs(90), "the worker to log", || async {
        log_files(&cluster.dir("sup-a")).into_iter().find(|p| {
            p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("worker"))
                && std::fs::read_to_string(p).is_ok_and(|t| t.lines().count() >= 3)
        })
    })
    .await;

    let files = log_files(cluster.root.path());
    assert!(files.len() >= 3, "nimbus, supervisor and worker logs: {files:?}");
    assert!(files.contains(&worker_log));
    for path in &files {
        let bytes = std::fs::read(path).unwrap();
        assert!(!bytes.is_empty(), "{} is empty", path.display());
        assert!(
            !bytes.windows(2).any(|w| w == b"\x1b["),
            "{} has ANSI escapes:\n{}",
            path.display(),
            String::from_utf8_lossy(&bytes)
        );
    }
    let nimbus = std::fs::read_to_string(cluster.dir("nimbus.log")).unwrap();
    assert!(nimbus.lines().any(|l| l.contains(" INFO ")), "plain lines with their level:\n{nimbus}");
    let supervisor = std::fs::read_to_string(cluster.dir("sup-a.log")).unwrap();
    for line in supervisor.lines() {
        let event: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a supervisor log line is not JSON ({e}): {line}"));
        assert!(event["level"].is_string() && event["timestamp"].is_string(), "{line}");
    }
    assert!(supervisor.lines().count() >= 2, "{supervisor}");

    // `squall list` (no `RUST_LOG`, no `-v`): its table alone on stdout, nothing on stderr;
    // `-v` brings its info logs back, on stderr only.
    let list = |extra: &[&str]| {
        Command::new(SQUALL)
            .arg("list")
            .args(extra)
            .args(["--config", &cluster.config.display().to_string()])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = list(&[]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let mut lines = stdout.lines();
    assert!(lines.next().unwrap().starts_with("Topology_name"), "{stdout}");
    assert!(lines.next().unwrap().chars().all(|c| c == '-'), "{stdout}");
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 1, "{stdout}");
    assert!(rows[0].starts_with("wordcount "), "{stdout}");
    assert!(out.stderr.is_empty(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let verbose = list(&["-vv"]);
    assert!(verbose.status.success(), "{}", text(&verbose));
    assert_eq!(verbose.stdout, out.stdout, "-v changes stderr only");
}

/// Names of the files in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// A worker's log is at Storm's place, `<storm.local.dir>/workers-artifacts/<topology-id>/<port>/
/// worker.log`, and rotates by size (`worker.log.max.bytes`) keeping at most
/// `worker.log.max.files` files, rotation after rotation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_log_rotates_by_size_and_keeps_at_most_max_files() {
    const MAX_BYTES: u64 = 4000;
    let mut cluster = Cluster::new("logs_rotation").await;
    cluster.configure(&format!("worker.log.max.bytes: {MAX_BYTES}"));
    cluster.configure("worker.log.max.files: 3");
    cluster.start_nimbus();
    let port = free_port();
    cluster.start_supervisor("sup-a", &[port]);
    // Every word is logged by the `log` sink: about 100 lines a second.
    let file = cluster.dir("chatty.yaml");
    std::fs::write(
        &file,
        "name: chatty\nconfig: {topology.workers: 1}\n\
         spouts:\n  - {id: sentences, className: sentence-generator, parallelism: 1, params: {rate_per_sec: 20}}\n\
         bolts:\n  - {id: split, className: split-sentence, parallelism: 1}\n  - {id: log, className: log, parallelism: 1}\n\
         streams:\n  - {from: sentences, to: split, grouping: {type: SHUFFLE}}\n  - {from: split, to: log, grouping: {type: SHUFFLE}}\n",
    )
    .unwrap();
    let submitted = eventually(Duration::from_secs(60), "nimbus to take the submit", || async {
        let out = cluster.squall(&["submit", file.to_str().unwrap()]);
        out.status.success().then(|| text(&out))
    })
    .await;
    let id = submitted.split(" as ").nth(1).unwrap().split_whitespace().next().unwrap().to_owned();
    let dir = cluster.dir("sup-a").join("workers-artifacts").join(&id).join(port.to_string());

    // Rotation after rotation (the oldest kept file changes), never a fourth file nor one past
    // the size limit.
    let mut oldest_seen = std::collections::BTreeSet::new();
    eventually(Duration::from_secs(120), "worker.log to rotate out several times", || {
        let names = names(&dir);
        for name in &names {
            assert!(
                ["worker.log", "worker.log.1", "worker.log.2", "worker.log.out"].contains(&name.as_str()),
                "unexpected file {name} in {}: {names:?}",
                dir.display()
            );
            if name.starts_with("worker.log") && name != "worker.log.out" {
                let len = std::fs::metadata(dir.join(name)).map(|m| m.len()).unwrap_or(0);
                assert!(len <= MAX_BYTES, "{name} has {len} bytes");
            }
        }
        if let Ok(oldest) = std::fs::read_to_string(dir.join("worker.log.2"))
            && let Some(first) = oldest.lines().next()
        {
            oldest_seen.insert(first.to_owned());
        }
        let done = oldest_seen.len() >= 3;
        async move { done.then_some(()) }
    })
    .await;
    let live = std::fs::read_to_string(dir.join("worker.log")).unwrap();
    assert!(live.lines().all(|l| !l.is_empty()), "whole lines only:\n{live}");
    assert!(std::fs::read_to_string(dir.join("worker.log.1")).unwrap().contains("tuple"));
}
