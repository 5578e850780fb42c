//! `squall nimbus` and `squall supervisor` refuse bad config files with a message naming the
//! file and the key, before touching anything.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

fn run(verb: &str, config: &str) -> (bool, String) {
    run_with(verb, config, &[])
}

/// `squall <verb> --config <file with config> ... <extra>`.
fn run_with(verb: &str, config: &str, extra: &[&str]) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cluster.yaml");
    std::fs::write(&file, config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_squall"))
        .args([verb, "--config", file.to_str().unwrap(), "--zookeeper", "127.0.0.1:1"])
        .args(extra)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn bad_config_files_are_refused_naming_the_key() {
    let cases = [
        ("supervisor", "supervisor.slot.ports: [6700]\n", "supervisor.slot.ports"),
        ("supervisor", "supervisor.slots.ports: []\n", "supervisor.slots.ports"),
        ("supervisor", "supervisor.monitor.frequency.secs: 0\n", "supervisor.monitor.frequency.secs"),
        ("supervisor", "storm.zookeeper.root: relative\n", "storm.zookeeper.root"),
        ("supervisor", "worker.log.max.files: 0\n", "worker.log.max.files"),
        ("supervisor", "worker.log.max.bytes: -1\n", "worker.log.max.bytes"),
        ("nimbus", "nimbus.monitor.freq.secs: \"often\"\n", "nimbus.monitor.freq.secs"),
        ("nimbus", "nimbus.unknown.key: 1\n", "nimbus.unknown.key"),
        ("nimbus", "- not\n- a map\n", "cluster.yaml"),
    ];
    for (verb, config, named) in cases {
        let (ok, stderr) = run(verb, config);
        assert!(!ok, "{verb} accepted {config:?}");
        assert!(
            stderr.contains(named) && stderr.contains(&format!("squall {verb}:")),
            "{verb} {config:?}: {stderr}"
        );
    }
}

#[test]
fn an_empty_token_is_refused_and_a_token_is_never_echoed() {
    let empty = "nimbus.http.token is empty";
    let cases: [(&str, &[&str], &str); 6] = [
        ("nimbus.http.token: s3cret-hunter2\n", &["-c", "nimbus.http.token="], empty),
        ("nimbus.http.token: s3cret-hunter2\n", &["-c", "nimbus.http.token=~"], empty),
        ("nimbus.http.token:\n", &[], empty),
        ("nimbus.http.token: ~\n", &[], empty),
        ("nimbus.http.token: [s3cret-hunter2]\n", &[], "nimbus.http.token: must be a string"),
        ("nimbus.monitor.freq.secs: 1\n", &["-c", "nimbus.http.token=[s3cret-hunter2"], "nimbus.http.token"),
    ];
    for (config, extra, says) in cases {
        let (ok, stderr) = run_with("nimbus", config, extra);
        assert!(!ok, "nimbus accepted {config:?} {extra:?}");
        assert!(stderr.contains(says), "{config:?} {extra:?}: {stderr}");
        assert!(!stderr.contains("hunter2"), "the token was echoed: {stderr}");
    }
}
