//! The worker's command line as a wire format: golden argv (what older worker binaries read),
//! round trips, and bad command lines refused with the flag at fault.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::OsString;

use cluster_state::launch::{LaunchArgsError, WorkerLaunch};
use proptest::prelude::*;

fn launch() -> WorkerLaunch {
    WorkerLaunch::new(
        "wc-1-1700000000".parse().unwrap(),
        "6f1c-9a2b".parse().unwrap(),
        6700,
        "3d4e-77aa".parse().unwrap(),
        "/var/storm/supervisor/stormdist/wc-1-1700000000/topology.yaml".into(),
    )
}

fn args(line: &str) -> Vec<OsString> {
    line.split(' ').map(OsString::from).collect()
}

fn strings(args: &[OsString]) -> Vec<&str> {
    args.iter().map(|a| a.to_str().unwrap()).collect()
}

#[test]
fn golden_argv_with_defaults_is_what_squall_worker_always_read() {
    let mut launch = launch();
    launch.zookeeper = Some("zk1:2181,zk2:2181/squall".into());
    launch.local_dir = "/var/storm".into();
    let line = "worker --topology-id wc-1-1700000000 --supervisor-id 6f1c-9a2b --port 6700 \
                --worker-id 3d4e-77aa --zookeeper zk1:2181,zk2:2181/squall --storm-root /storm \
                --topology-file /var/storm/supervisor/stormdist/wc-1-1700000000/topology.yaml \
                --local-dir /var/storm --bind-host 0.0.0.0";
    assert_eq!(strings(&launch.to_args()).join(" "), line);
    assert_eq!(WorkerLaunch::parse(args(line)).unwrap(), launch);
}

#[test]
fn golden_argv_with_everything_set() {
    let mut launch = launch();
    launch.zookeeper = Some("zk1:2181".into());
    launch.storm_paths = "/squall/storm".parse().unwrap();
    launch.local_dir = "/var/storm".into();
    launch.hostname = Some("host1.example".into());
    launch.bind_host = "10.0.0.7".into();
    launch.zookeeper_session_timeout_ms = 7000;
    launch.zookeeper_connection_timeout_ms = 3000;
    launch.log_max_bytes = 1_048_576;
    launch.log_max_files = 4;
    launch.metrics_tls_cert = Some("/etc/squall/tls/worker.pem".into());
    launch.metrics_tls_key = Some("/etc/squall/tls/worker.key".into());
    launch.metrics_tls_client_ca = Some("/etc/squall/tls/ca.pem".into());
    let line = "worker --topology-id wc-1-1700000000 --supervisor-id 6f1c-9a2b --port 6700 \
                --worker-id 3d4e-77aa --zookeeper zk1:2181 --storm-root /squall/storm \
                --topology-file /var/storm/supervisor/stormdist/wc-1-1700000000/topology.yaml \
                --local-dir /var/storm --hostname host1.example --bind-host 10.0.0.7 \
                --zookeeper-session-timeout-ms 7000 --zookeeper-connection-timeout-ms 3000 \
                --log-max-bytes 1048576 --log-max-files 4 \
                --metrics-tls-cert /etc/squall/tls/worker.pem --metrics-tls-key /etc/squall/tls/worker.key \
                --metrics-tls-client-ca /etc/squall/tls/ca.pem";
    assert_eq!(strings(&launch.to_args()).join(" "), line);
    assert_eq!(WorkerLaunch::parse(args(line)).unwrap(), launch);
    let options = launch.session_options();
    assert_eq!(options.session_timeout.as_millis(), 7000);
    assert_eq!(options.connect_timeout.as_millis(), 3000);
}

#[test]
fn only_required_flags_give_the_defaults() {
    let line = "worker --topology-id wc-1-1700000000 --supervisor-id 6f1c-9a2b --port 6700 \
                --worker-id 3d4e-77aa --topology-file /var/storm/supervisor/stormdist/wc-1-1700000000/topology.yaml";
    let parsed = WorkerLaunch::parse(args(line)).unwrap();
    assert_eq!(parsed, launch());
    assert_eq!(parsed.zookeeper_connect(), "127.0.0.1:2181");
    assert_eq!(parsed.session_options(), cluster_state::coord::SessionOptions::default());
}

#[test]
fn flag_equals_value_and_any_order_are_read() {
    let line = "worker --port=6700 --topology-file /var/storm/supervisor/stormdist/wc-1-1700000000/topology.yaml \
                --worker-id=3d4e-77aa --supervisor-id 6f1c-9a2b --topology-id wc-1-1700000000";
    assert_eq!(WorkerLaunch::parse(args(line)).unwrap(), launch());
}

#[test]
fn a_path_that_is_not_utf8_round_trips() {
    use std::os::unix::ffi::OsStringExt;
    let mut launch = launch();
    launch.local_dir = OsString::from_vec(b"/var/st\xffrm".to_vec()).into();
    assert_eq!(WorkerLaunch::parse(launch.to_args()).unwrap(), launch);
}

#[test]
fn bad_command_lines_name_the_flag() {
    let base = "worker --topology-id wc-1-1700000000 --supervisor-id 6f1c-9a2b --port 6700 \
                --worker-id 3d4e-77aa --topology-file /t.yaml";
    let cases: &[(&str, &str)] = &[
        ("--topology-id wc-1-1700000000", "a worker command line starts with \"worker\""),
        (&base.replace("--port 6700", "--port 70000"), "--port \"70000\""),
        (&base.replace("--port 6700 ", ""), "--port is required"),
        (&base.replace("wc-1-1700000000", "wc"), "--topology-id \"wc\""),
        (&base.replace("--worker-id 3d4e-77aa", "--worker-id a/b"), "--worker-id \"a/b\""),
        (&format!("{base} --storm-root storm"), "--storm-root \"storm\""),
        (
            &format!("{base} --zookeeper-session-timeout-ms 0"),
            "--zookeeper-session-timeout-ms \"0\": must be at least 1",
        ),
        (&format!("{base} --zookeeper-connection-timeout-ms 1s"), "--zookeeper-connection-timeout-ms \"1s\""),
        (&format!("{base} --log-max-files 0"), "--log-max-files \"0\": at least 1 file is kept"),
        (&format!("{base} --log-max-bytes 0"), "--log-max-bytes \"0\": must be at least 1"),
        (&format!("{base} --port 6701"), "--port is given more than once"),
        (&format!("{base} --hostname"), "--hostname needs a value"),
        (&format!("{base} --nimbus x"), "unknown worker argument \"--nimbus\""),
    ];
    for (line, says) in cases {
        let err = WorkerLaunch::parse(args(line)).unwrap_err();
        assert!(err.to_string().contains(says), "{line}: {err} does not say {says:?}");
    }
    assert_eq!(
        WorkerLaunch::parse(Vec::<OsString>::new()).unwrap_err(),
        LaunchArgsError::NoVerb { found: None }
    );
}

fn text() -> impl Strategy<Value = String> {
    // Anything clap-free parsing must carry through, including '=', spaces and dashes.
    "[a-zA-Z0-9 =:,./_-]{0,20}"
}

proptest! {
    #[test]
    fn every_launch_round_trips(
        port in any::<u16>(),
        worker in "[a-z0-9-]{1,36}",
        zookeeper in proptest::option::of(text()),
        hostname in proptest::option::of(text()),
        bind_host in text(),
        local_dir in "[a-zA-Z0-9 =./_-]{1,20}",
        session in 1..u64::MAX,
        connection in 1..u64::MAX,
    ) {
        let mut launch = launch();
        launch.port = port;
        launch.worker_id = worker.parse().unwrap();
        launch.zookeeper = zookeeper;
        launch.hostname = hostname;
        launch.bind_host = bind_host;
        launch.local_dir = local_dir.into();
        launch.zookeeper_session_timeout_ms = session;
        launch.zookeeper_connection_timeout_ms = connection;
        prop_assert_eq!(WorkerLaunch::parse(launch.to_args()).unwrap(), launch);
    }
}
