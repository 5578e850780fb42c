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
use support::{Cluster, SQUALL, free_port, log_files, text};

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
    // The table without its last column, `Uptime_secs`, which may tick between the two runs.
    let table = |stdout: &[u8]| -> Vec<String> {
        let stdout = String::from_utf8_lossy(stdout);
        stdout.lines().map(|l| l.trim_end().rsplit_once(' ').map_or(l, |(rest, _)| rest).to_owned()).collect()
    };
    assert_eq!(table(&verbose.stdout), table(&out.stdout), "-v changes stderr only");
}

/// Names of the files in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// A topology file `name`: sentences -> split -> `sink` (a component id and class, a line per
/// word) on `workers` workers, the spout emitting `rate` sentences a second.
fn sink_topology(
    cluster: &Cluster,
    name: &str,
    (sink, class): (&str, &str),
    workers: u32,
    rate: u32,
) -> PathBuf {
    let file = cluster.dir(&format!("{name}.yaml"));
    std::fs::write(
        &file,
        format!(
            "name: {name}\nconfig: {{topology.workers: {workers}}}\n\
             spouts:\n  - {{id: sentences, className: sentence-generator, parallelism: 1, params: {{rate_per_sec: {rate}}}}}\n\
             bolts:\n  - {{id: split, className: split-sentence, parallelism: 1}}\n  - {{id: {sink}, className: {class}, parallelism: 1}}\n\
             streams:\n  - {{from: sentences, to: split, grouping: {{type: SHUFFLE}}}}\n  - {{from: split, to: {sink}, grouping: {{type: SHUFFLE}}}}\n"
        ),
    )
    .unwrap();
    file
}

/// Submits `file` once nimbus takes it; the topology's id.
async fn submit(cluster: &Cluster, file: &Path) -> String {
    let submitted = eventually(Duration::from_secs(60), "nimbus to take the submit", || async {
        let out = cluster.squall(&["submit", file.to_str().unwrap()]);
        out.status.success().then(|| text(&out))
    })
    .await;
    submitted.split(" as ").nth(1).unwrap().split_whitespace().next().unwrap().to_owned()
}

/// Waits until `live` in `dir` has rotated out several times (the oldest kept file,
/// `live.2`, changed content three times), checking on the way that there are never more than
/// three of its files (`worker.log.max.files: 3`) and, with `max_bytes`, none larger.
async fn rotates_several_times(dir: &Path, live: &str, max_bytes: Option<u64>) {
    let kept = [live.to_owned(), format!("{live}.1"), format!("{live}.2")];
    let mut oldest_seen = std::collections::BTreeSet::new();
    eventually(Duration::from_secs(120), &format!("{live} to rotate out several times"), || {
        let names = names(dir);
        let rotated = |n: &str| {
            n.strip_prefix(live).is_some_and(|r| r.is_empty() || r[1..].bytes().all(|b| b.is_ascii_digit()))
        };
        for name in names.iter().filter(|n| rotated(n)) {
            assert!(kept.contains(name), "unexpected file {name} in {}: {names:?}", dir.display());
            let len = std::fs::metadata(dir.join(name)).map(|m| m.len()).unwrap_or(0);
            assert!(max_bytes.is_none_or(|max| len <= max), "{name} has {len} bytes");
        }
        if let Ok(oldest) = std::fs::read(dir.join(&kept[2]))
            && !oldest.is_empty()
        {
            oldest_seen.insert(oldest);
        }
        let done = oldest_seen.len() >= 3;
        async move { done.then_some(()) }
    })
    .await;
}

/// `<storm.local.dir>/workers-artifacts/<topology-id>/<port>` of supervisor `sup-a`.
fn artifacts(cluster: &Cluster, id: &str, port: u16) -> PathBuf {
    cluster.dir("sup-a").join("workers-artifacts").join(id).join(port.to_string())
}

/// What the worker on `port` has written to its `worker.log` so far.
fn worker_log(cluster: &Cluster, id: &str, port: u16) -> String {
    std::fs::read_to_string(artifacts(cluster, id, port).join("worker.log")).unwrap_or_default()
}

/// A cluster of nimbus and supervisor `sup-a` on one port, worker logs rotating at `max_bytes`
/// keeping 3 files.
async fn rotating_cluster(name: &str, max_bytes: u64) -> (Cluster, u16) {
    let mut cluster = Cluster::new(name).await;
    cluster.configure(&format!("worker.log.max.bytes: {max_bytes}"));
    cluster.configure("worker.log.max.files: 3");
    cluster.start_nimbus();
    let port = free_port();
    cluster.start_supervisor("sup-a", &[port]);
    (cluster, port)
}

/// A worker's log is at Storm's place, `<storm.local.dir>/workers-artifacts/<topology-id>/<port>/
/// worker.log`, and rotates by size (`worker.log.max.bytes`) keeping at most
/// `worker.log.max.files` files, rotation after rotation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_log_rotates_by_size_and_keeps_at_most_max_files() {
    const MAX_BYTES: u64 = 4000;
    let (cluster, port) = rotating_cluster("logs_rotation", MAX_BYTES).await;
    // Every word is logged by the `log` sink: about 100 lines a second.
    let id = submit(&cluster, &sink_topology(&cluster, "chatty", ("log", "log"), 1, 20)).await;
    let dir = artifacts(&cluster, &id, port);

    // Never a file past the size limit: the worker rotates before a write would pass it.
    rotates_several_times(&dir, "worker.log", Some(MAX_BYTES)).await;
    let live = std::fs::read_to_string(dir.join("worker.log")).unwrap();
    assert!(live.lines().all(|l| !l.is_empty()), "whole lines only:\n{live}");
    assert!(std::fs::read_to_string(dir.join("worker.log.1")).unwrap().contains("tuple"));
}

/// `squall logs ARGS --follow` running, with its stdout and stderr lines as they come.
fn follow_logs(
    cluster: &Cluster,
    args: &[&str],
) -> (std::process::Child, std::sync::mpsc::Receiver<String>, std::sync::mpsc::Receiver<String>) {
    let mut follow = Command::new(SQUALL)
        .arg("logs")
        .args(args)
        .args(["--follow", "--config", &cluster.config.display().to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = |stream: Box<dyn std::io::Read + Send>| {
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stream).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        rx
    };
    let stdout = lines(Box::new(follow.stdout.take().unwrap()));
    let stderr = lines(Box::new(follow.stderr.take().unwrap()));
    (follow, stdout, stderr)
}

/// SIGTERM to `follow`, which must then exit successfully.
async fn stops_on_sigterm(follow: &mut std::process::Child) {
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(follow.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let status = eventually(Duration::from_secs(10), "--follow to stop on SIGTERM", || {
        let status = follow.try_wait().unwrap();
        async move { status }
    })
    .await;
    assert!(status.success(), "{status:?}");
}

/// `squall logs --follow` follows the topology's workers as they change: a rebalance from one
/// worker to two starts a worker on the other port, whose lines it then prints (prefixed by
/// that port, each a line of that worker's `worker.log`), saying so on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn squall_logs_follow_picks_up_a_worker_started_by_a_rebalance() {
    let mut cluster = Cluster::new("logs_follow").await;
    cluster.start_nimbus();
    let ports = [free_port(), free_port()];
    cluster.start_supervisor("sup-a", &ports);
    let id = submit(&cluster, &sink_topology(&cluster, "growing", ("log", "log"), 1, 5)).await;
    let log_of = |port: u16| worker_log(&cluster, &id, port);
    let first = eventually(Duration::from_secs(90), "the one worker to log tuples", || async {
        ports.into_iter().find(|p| log_of(*p).matches("tuple").count() >= 3)
    })
    .await;
    let second = ports.into_iter().find(|p| *p != first).unwrap();

    let (mut follow, stdout, stderr) = follow_logs(&cluster, &["growing", "-n", "1"]);
    let mut printed: Vec<String> = Vec::new();
    eventually(Duration::from_secs(30), "--follow to print the first worker's lines", || {
        printed.extend(stdout.try_iter());
        let seen = printed.iter().any(|l| l.starts_with(&format!("[127.0.0.1:{first}] ")));
        async move { seen.then_some(()) }
    })
    .await;
    let out = cluster.squall(&["rebalance", "growing", "-w", "0", "-n", "2"]);
    assert!(out.status.success(), "{}", text(&out));

    let prefix = format!("[127.0.0.1:{second}] ");
    let mut said: Vec<String> = Vec::new();
    eventually(
        Duration::from_secs(90),
        "--follow to print lines of the worker the rebalance started",
        || {
            printed.extend(stdout.try_iter());
            said.extend(stderr.try_iter());
            let done = printed.iter().filter(|l| l.starts_with(&prefix)).count() >= 3;
            async move { done.then_some(()) }
        },
    )
    .await;
    let written = log_of(second);
    for line in printed.iter().filter_map(|l| l.strip_prefix(&prefix)) {
        assert!(written.lines().any(|l| l == line), "not a line of worker.log on {second}: {line}");
    }
    assert!(said.iter().any(|l| l.starts_with(&prefix) && l.contains("a new worker of")), "stderr: {said:?}");
    stops_on_sigterm(&mut follow).await;
}

/// `squall logs` on a real cluster with a token: the last lines of the worker running a named
/// component, read through its supervisor's log viewer (each line is in that worker's
/// `worker.log`, prefixed by its host and port); `--follow` prints lines appended afterwards
/// and stops on SIGTERM; a wrong token, a port with no worker, an unknown component or
/// topology are clear errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn squall_logs_prints_the_last_lines_of_a_components_worker() {
    let mut cluster = Cluster::new("logs_cli").await;
    cluster.configure("nimbus.http.token: logs-test-token");
    cluster.start_nimbus();
    let ports = [free_port(), free_port()];
    cluster.start_supervisor("sup-a", &ports);
    // Two workers: the `log` sink (a line per word) is on one of them.
    let id = submit(&cluster, &sink_topology(&cluster, "chatty", ("log", "log"), 2, 5)).await;

    // Which port runs `log`, as nimbus's topology page says (what `squall logs` reads too).
    let nimbus = std::fs::read_to_string(&cluster.config)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("nimbus.http.address: ").map(str::to_owned))
        .unwrap();
    let client = nimbus_client::NimbusClient::new(nimbus, None);
    let topology: cluster_state::ids::TopologyId = id.parse().unwrap();
    let log_port = eventually(Duration::from_secs(90), "both workers to be assigned", || async {
        let detail = client.topology(&topology).await.ok()?;
        (detail.workers.len() == 2).then_some(())?;
        let worker =
            detail.workers.iter().find(|w| w.component_num_tasks.keys().any(|c| c.as_str() == "log"))?;
        assert!(worker.log_viewer.is_some(), "{worker:?}");
        assert!(worker.worker_log_link.contains(&format!("/{id}/{}/worker.log", worker.port)), "{worker:?}");
        Some(worker.port)
    })
    .await;
    let other_port = ports.into_iter().find(|p| *p != log_port).unwrap();
    let log_of = |port: u16| worker_log(&cluster, &id, port);
    // The sink has logged some words.
    eventually(Duration::from_secs(90), "the log bolt's worker to log tuples", || async {
        (log_of(log_port).matches("tuple").count() >= 10).then_some(())
    })
    .await;

    let prefix = format!("[127.0.0.1:{log_port}] ");
    let out = cluster.squall(&["logs", "chatty", "--component", "log", "--lines", "5"]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{stdout}");
    let written = log_of(log_port);
    for line in &lines {
        let logged = line.strip_prefix(&prefix).unwrap_or_else(|| panic!("not prefixed {prefix:?}: {line}"));
        assert!(written.lines().any(|l| l == logged), "not a line of worker.log on {log_port}: {logged}");
    }
    // The last printed line was, when printed, the file's last: nothing older than the tail.
    let printed_last = lines[4].strip_prefix(&prefix).unwrap();
    let position = written.lines().position(|l| l == printed_last).unwrap();
    let earlier = written.lines().nth(position.saturating_sub(4)).unwrap();
    assert_eq!(lines[0].strip_prefix(&prefix).unwrap(), earlier, "five consecutive lines");
    assert!(out.stderr.is_empty(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    // Without --component: both workers, each prefixed by its own port.
    let out = cluster.squall(&["logs", "chatty", "--lines", "2"]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().filter(|l| l.starts_with(&prefix)).count(), 2, "{stdout}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with(&format!("[127.0.0.1:{other_port}] "))).count(),
        2,
        "{stdout}"
    );

    // --follow prints what is appended after the tail, until SIGTERM.
    let (mut follow, rx, _) = follow_logs(&cluster, &["chatty", "-c", "log", "-n", "1"]);
    let mut followed = Vec::new();
    eventually(Duration::from_secs(60), "--follow to print newly logged lines", || {
        followed.extend(rx.try_iter());
        let done = followed.len() >= 6;
        async move { done.then_some(()) }
    })
    .await;
    let written = log_of(log_port);
    let at = |line: &String| written.lines().position(|l| Some(l) == line.strip_prefix(&prefix));
    let positions: Vec<Option<usize>> = followed.iter().map(at).collect();
    assert!(positions.iter().all(Option::is_some), "every followed line is the worker's: {followed:?}");
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "in order, none twice: {positions:?}");
    stops_on_sigterm(&mut follow).await;

    // A wrong token: the log viewer refuses, and says so.
    let wrong = cluster.dir("wrong-token.yaml");
    let config = std::fs::read_to_string(&cluster.config).unwrap();
    std::fs::write(&wrong, config.replace("logs-test-token", "not-the-token")).unwrap();
    let out = std::process::Command::new(SQUALL)
        .args(["logs", "chatty", "-c", "log", "--config", wrong.to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = text(&out);
    assert!(said.contains("bearer token is wrong") && said.contains("401"), "{said}");
    assert!(out.stdout.is_empty(), "nothing printed: {said}");

    // Bad ports, components and names are clear errors.
    for (args, says) in [
        (vec!["logs", "chatty", "--port", "1"], "has no worker on port 1".to_owned()),
        (vec!["logs", "chatty", "--port", "0"], "0 is not in 1..=65535".to_owned()),
        (vec!["logs", "chatty", "-c", "nosuch"], "has no component \"nosuch\"".to_owned()),
        (vec!["logs", "nosuch"], "no topology named \"nosuch\"".to_owned()),
        (vec!["logs", "chatty", "--file", "../../etc/passwd"], "unknown log file".to_owned()),
        (vec!["logs", "chatty", "--lines", "100000"], "lines 100000".to_owned()),
    ] {
        let out = cluster.squall(&args);
        assert!(!out.status.success(), "{args:?}");
        assert!(text(&out).contains(&says), "{args:?}: {}", text(&out));
    }
}

/// A worker that prints a lot to stdout (the `stdout` sink, a line per word): its
/// `worker.log.out`, which the process writes to directly, is rotated by the supervisor with the
/// same keys as `worker.log`, rotation after rotation, never more than `worker.log.max.files`
/// files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_stdout_log_rotates_and_keeps_at_most_max_files() {
    const MAX_BYTES: u64 = 3000;
    let (cluster, port) = rotating_cluster("logs_out_rotation", MAX_BYTES).await;
    let id = submit(&cluster, &sink_topology(&cluster, "printer", ("print", "stdout"), 1, 20)).await;
    let dir = artifacts(&cluster, &id, port);

    // Copied past the limit: a file may hold what its worker printed in one interval more.
    rotates_several_times(&dir, "worker.log.out", None).await;
    // The live file is being written at its new start: it stays far below what the worker
    // printed in all (no sparse file growing from the old offset).
    let live = std::fs::metadata(dir.join("worker.log.out")).unwrap().len();
    assert!(live < 20 * MAX_BYTES, "worker.log.out has {live} bytes");
    let text = std::fs::read(dir.join("worker.log.out")).unwrap();
    assert!(!text.starts_with(&[0]), "no hole at the start: the worker appends");
}

/// `squall set-log-level` on a running topology (Storm's `set_log_level`): debug turned on for
/// one logger (`worker::builtin`, where a `log` bolt at `level: debug` writes each tuple)
/// reaches the running worker through `/storm/logconfigs/<id>`, its debug lines appear in
/// `worker.log`, and after the timeout they stop while its info lines go on; no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_log_level_turns_debug_on_for_one_logger_until_its_timeout() {
    let mut cluster = Cluster::new("logs_set_level").await;
    cluster.configure("nimbus.http.token: level-test-token");
    cluster.start_nimbus();
    let port = free_port();
    cluster.start_supervisor("sup-a", &[port]);
    let file = cluster.dir("levels.yaml");
    std::fs::write(
        &file,
        "name: levels\nconfig: {topology.workers: 1}\n\
         spouts:\n  - {id: sentences, className: sentence-generator, parallelism: 1, params: {rate_per_sec: 5}}\n\
         bolts:\n  - {id: split, className: split-sentence, parallelism: 1}\n\
         \x20 - {id: quiet, className: log, parallelism: 1, params: {level: debug}}\n\
         \x20 - {id: loud, className: log, parallelism: 1}\n\
         streams:\n  - {from: sentences, to: split, grouping: {type: SHUFFLE}}\n\
         \x20 - {from: split, to: quiet, grouping: {type: SHUFFLE}}\n  - {from: split, to: loud, grouping: {type: SHUFFLE}}\n",
    )
    .unwrap();
    let id = submit(&cluster, &file).await;
    let log = artifacts(&cluster, &id, port).join("worker.log");
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let is_debug_tuple = |l: &str| l.contains(" DEBUG ") && l.contains("tuple");
    let is_info_tuple = |l: &str| l.contains(" INFO ") && l.contains("tuple");
    eventually(Duration::from_secs(90), "the worker to log info tuples", || async {
        (read().lines().filter(|l| is_info_tuple(l)).count() >= 10).then_some(())
    })
    .await;
    assert!(!read().lines().any(is_debug_tuple), "no debug before it is asked for");

    let out = cluster.squall(&["set-log-level", "levels", "worker::builtin=DEBUG:5"]);
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.starts_with("worker::builtin=DEBUG for "), "{said}");
    eventually(Duration::from_secs(30), "debug tuples in worker.log", || async {
        (read().lines().filter(|l| is_debug_tuple(l)).count() >= 5).then_some(())
    })
    .await;
    // After the timeout the worker goes back to its base filter by itself: once 20 info
    // tuples were logged after that, none of the lines since is a debug one.
    let reverted = |text: &str| {
        let lines: Vec<&str> = text.lines().collect();
        lines.iter().rposition(|l| l.contains("log levels changed") && l.contains("levels=[]"))
    };
    let logged = eventually(Duration::from_secs(60), "the levels to revert and info to go on", || async {
        let logged = read();
        let at = reverted(&logged)?;
        (logged.lines().skip(at).filter(|l| is_info_tuple(l)).count() >= 20).then_some(logged)
    })
    .await;
    let at = reverted(&logged).unwrap();
    let after: Vec<&str> = logged.lines().skip(at + 1).filter(|l| is_debug_tuple(l)).collect();
    assert!(after.is_empty(), "debug lines after the timeout: {after:?}");

    // A bad spec or logger is refused before anything is written, naming what is wrong.
    for (spec, says) in [
        ("worker::builtin=LOUD", "one of TRACE"),
        ("a,b=DEBUG", "module path"),
        ("ROOT=DEBUG:soon", "whole number"),
    ] {
        let out = cluster.squall(&["set-log-level", "levels", spec]);
        assert!(!out.status.success() && text(&out).contains(says), "{spec}: {}", text(&out));
    }
}
