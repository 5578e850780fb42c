//! Wire formats of every znode: golden bytes, round trips, and garbage that must decode to an
//! error naming the path (never a panic).

// Helpers outside `#[test]` fns: a panic there is a test failure, which is what we want.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::fmt::Debug;

use cluster_state::ids::{
    BrokerId, ComponentId, ConsumerId, ConsumerThreadId, ExecutorId, GroupId, Partition, SupervisorId,
    TaskId, TopologyId, TopologyName, WorkerSlot,
};
use cluster_state::znode::{
    Assignment, BrokerRegistration, ConsumerRegistration, DecodeError, DelayedTransition, ErrorInfo,
    ExecutorAssignment, ExecutorStats, LocalWorkerHeartbeat, MetricsScheme, NimbusSummary, NodeAssignments,
    OffsetData, OffsetSnapshot, OwnerData, StormBase, SubscriptionPattern, SupervisorInfo, TopicRegistration,
    TopologyStatus, WorkerHeartbeat, ZnodeData,
};
use proptest::prelude::*;

const PATH: &str = "/test/chroot/some/znode";

fn comp(s: &str) -> ComponentId {
    ComponentId::new(s).unwrap()
}

fn sup(s: &str) -> SupervisorId {
    SupervisorId::new(s).unwrap()
}

fn exec(start: u32, end: u32) -> ExecutorId {
    ExecutorId::new(TaskId(start), TaskId(end)).unwrap()
}

fn topology_id() -> TopologyId {
    TopologyId::new(&TopologyName::new("wc").unwrap(), 1, 1_700_000_000)
}

/// `value` encodes to exactly `golden`, and `golden` decodes back to `value`.
fn assert_golden<T: ZnodeData + PartialEq + Debug>(value: &T, golden: &str) {
    assert_eq!(String::from_utf8(value.encode()).unwrap(), golden);
    assert_eq!(&T::decode(PATH, golden.as_bytes()).unwrap(), value);
}

/// Decoding `bytes` fails with a message naming the path, the format and `needle`.
fn assert_rejects<T: ZnodeData + Debug>(bytes: &[u8], needle: &str) -> DecodeError {
    let err = T::decode(PATH, bytes).unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with(&format!("znode {PATH}: not a valid {} payload: ", T::FORMAT)), "{msg}");
    assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
    err
}

/// Garbage every versioned JSON format must reject; `golden` is a valid version-1 payload.
fn assert_rejects_json_garbage<T: ZnodeData + Debug>(golden: &str, bad_version: u64) {
    assert_rejects::<T>(b"", "empty payload");
    assert_rejects::<T>(b"\xff\xfe{}", "not UTF-8");
    assert_rejects::<T>(&[golden.as_bytes(), b"\xc3"].concat(), "not UTF-8");
    for cut in 1..golden.len() {
        if golden.is_char_boundary(cut) {
            assert!(
                T::decode(PATH, &golden.as_bytes()[..cut]).is_err(),
                "prefix {:?} decoded",
                &golden[..cut]
            );
        }
    }
    for wrong in ["[]", "42", "\"x\"", "null", "{}", "{\"version\":\"1\"}", "{\"version\":-1}"] {
        assert_rejects::<T>(wrong.as_bytes(), "");
    }
    assert_rejects::<T>(b"{\"version\":1}", "missing field");
    let future = golden.replacen("\"version\":1", &format!("\"version\":{bad_version}"), 1);
    assert_rejects::<T>(future.as_bytes(), &format!("unsupported version {bad_version}"));
    assert_rejects::<T>(format!("{golden}x").as_bytes(), "trailing characters");
}

/// A version-1 payload with an extra field still decodes (forward compatibility).
fn assert_ignores_unknown_fields<T: ZnodeData + PartialEq + Debug>(golden: &str) {
    let extended = golden.replacen('{', "{\"added_later\":{\"x\":[1]},", 1);
    assert_eq!(T::decode(PATH, extended.as_bytes()).unwrap(), T::decode(PATH, golden.as_bytes()).unwrap());
}

// ---- Storm layout ----

fn storm_base_active() -> StormBase {
    StormBase {
        name: TopologyName::new("wc").unwrap(),
        launch_time_secs: 1_700_000_000,
        status: TopologyStatus::Active,
        num_workers: 2,
        component_executors: BTreeMap::from([(comp("split"), 2), (comp("count"), 4)]),
        owner: "alice".into(),
        prev_status: None,
        pending_transition: None,
    }
}

const STORM_BASE_ACTIVE: &str = r#"{"version":1,"name":"wc","launch_time_secs":1700000000,"status":"active","num_workers":2,"component_executors":{"count":4,"split":2},"owner":"alice","prev_status":null,"pending_transition":null}"#;

#[test]
fn storm_base_golden() {
    assert_golden(&storm_base_active(), STORM_BASE_ACTIVE);

    let killed = StormBase {
        status: TopologyStatus::Killed,
        pending_transition: Some(DelayedTransition::Kill { deadline_secs: 1_700_000_330 }),
        ..storm_base_active()
    };
    assert_golden(
        &killed,
        r#"{"version":1,"name":"wc","launch_time_secs":1700000000,"status":"killed","num_workers":2,"component_executors":{"count":4,"split":2},"owner":"alice","prev_status":null,"pending_transition":{"action":"kill","deadline_secs":1700000330}}"#,
    );

    let rebalancing = StormBase {
        status: TopologyStatus::Rebalancing,
        prev_status: Some(TopologyStatus::Inactive),
        pending_transition: Some(DelayedTransition::Rebalance {
            deadline_secs: 1_700_000_030,
            num_workers: Some(3),
            component_executors: BTreeMap::from([(comp("split"), 6)]),
        }),
        ..storm_base_active()
    };
    assert_golden(
        &rebalancing,
        r#"{"version":1,"name":"wc","launch_time_secs":1700000000,"status":"rebalancing","num_workers":2,"component_executors":{"count":4,"split":2},"owner":"alice","prev_status":"inactive","pending_transition":{"action":"rebalance","deadline_secs":1700000030,"num_workers":3,"component_executors":{"split":6}}}"#,
    );
    assert_eq!(
        rebalancing.pending_transition.as_ref().map(DelayedTransition::deadline_secs),
        Some(1_700_000_030)
    );
}

#[test]
fn storm_base_decodes_leniently_within_version_1() {
    // Missing optional fields, any key order, whitespace; a rebalance with nothing changed.
    let text = r#"{ "owner": "bob", "num_workers": 1, "status": "rebalancing",
        "component_executors": {}, "launch_time_secs": 5, "name": "t", "version": 1,
        "pending_transition": {"deadline_secs": 9, "action": "rebalance"} }"#;
    let base = StormBase::decode(PATH, text.as_bytes()).unwrap();
    assert_eq!(base.prev_status, None);
    let unchanged = DelayedTransition::Rebalance {
        deadline_secs: 9,
        num_workers: None,
        component_executors: BTreeMap::new(),
    };
    assert_eq!(base.pending_transition, Some(unchanged));
    assert_eq!(StormBase::decode(PATH, &base.encode()).unwrap(), base);
    assert_ignores_unknown_fields::<StormBase>(STORM_BASE_ACTIVE);
}

#[test]
fn storm_base_garbage() {
    assert_rejects_json_garbage::<StormBase>(STORM_BASE_ACTIVE, 2);
    let err =
        assert_rejects::<StormBase>(br#"{"version":1,"name":"wc"}"#, "missing field `launch_time_secs`");
    assert_eq!(
        err.to_string(),
        "znode /test/chroot/some/znode: not a valid storm-base v1 JSON payload: \
         missing field `launch_time_secs` at line 1 column 25"
    );
    let bad = |from: &str, to: &str| STORM_BASE_ACTIVE.replacen(from, to, 1);
    assert_rejects::<StormBase>(bad("\"active\"", "\"paused\"").as_bytes(), "unknown variant `paused`");
    assert_rejects::<StormBase>(bad("\"active\"", "\"Active\"").as_bytes(), "unknown variant");
    assert_rejects::<StormBase>(bad("\"wc\"", "\"w.c\"").as_bytes(), "invalid topology name");
    assert_rejects::<StormBase>(bad(":2,\"comp", ":-2,\"comp").as_bytes(), "invalid value");
    assert_rejects::<StormBase>(bad("\"split\"", "\"a/b\"").as_bytes(), "invalid component id");
    assert_rejects::<StormBase>(
        bad("\"pending_transition\":null", "\"pending_transition\":{\"action\":\"kill\"}").as_bytes(),
        "deadline_secs",
    );
    assert_rejects::<StormBase>(
        bad(
            "\"pending_transition\":null",
            "\"pending_transition\":{\"action\":\"nuke\",\"deadline_secs\":1}",
        )
        .as_bytes(),
        "nuke",
    );
}

fn assignment() -> Assignment {
    Assignment {
        master_code_dir: "/var/squall/nimbus/stormdist/wc-1-1700000000".into(),
        node_host: BTreeMap::from([(sup("sup-b2"), "host2".into()), (sup("sup-a1"), "host1".into())]),
        executors: vec![
            ExecutorAssignment {
                executor: exec(1, 2),
                node: sup("sup-a1"),
                port: 6700,
                start_time_secs: 1_700_000_005,
            },
            ExecutorAssignment {
                executor: exec(3, 3),
                node: sup("sup-b2"),
                port: 6701,
                start_time_secs: 1_700_000_006,
            },
            ExecutorAssignment {
                executor: exec(4, 4),
                node: sup("sup-a1"),
                port: 6700,
                start_time_secs: 1_700_000_005,
            },
        ],
    }
}

const ASSIGNMENT: &str = r#"{"version":1,"master_code_dir":"/var/squall/nimbus/stormdist/wc-1-1700000000","node_host":{"sup-a1":"host1","sup-b2":"host2"},"executors":[{"executor":[1,2],"node":"sup-a1","port":6700,"start_time_secs":1700000005},{"executor":[3,3],"node":"sup-b2","port":6701,"start_time_secs":1700000006},{"executor":[4,4],"node":"sup-a1","port":6700,"start_time_secs":1700000005}]}"#;

#[test]
fn assignment_golden_and_helpers() {
    let a = assignment();
    assert_golden(&a, ASSIGNMENT);
    let slot_a = WorkerSlot { node: sup("sup-a1"), port: 6700 };
    let slot_b = WorkerSlot { node: sup("sup-b2"), port: 6701 };
    assert_eq!(a.slot_of(&exec(3, 3)), Some(slot_b.clone()));
    assert_eq!(a.slot_of(&exec(9, 9)), None);
    assert_eq!(a.executors_of(&slot_a).collect::<Vec<_>>(), [exec(1, 2), exec(4, 4)]);
    assert_eq!(a.slots().into_iter().collect::<Vec<_>>(), [slot_a, slot_b]);
    let empty = Assignment { master_code_dir: "/d".into(), node_host: BTreeMap::new(), executors: vec![] };
    assert_golden(&empty, r#"{"version":1,"master_code_dir":"/d","node_host":{},"executors":[]}"#);
    assert_ignores_unknown_fields::<Assignment>(ASSIGNMENT);
}

#[test]
fn assignment_garbage() {
    assert_rejects_json_garbage::<Assignment>(ASSIGNMENT, 7);
    let bad = |from: &str, to: &str| ASSIGNMENT.replacen(from, to, 1);
    assert_rejects::<Assignment>(bad("[3,3]", "[4,4]").as_bytes(), "executor [4 4] assigned twice");
    assert_rejects::<Assignment>(bad("[1,2]", "[2,1]").as_bytes(), "start task must not exceed end task");
    assert_rejects::<Assignment>(bad("[1,2]", "[1,2,3]").as_bytes(), "");
    assert_rejects::<Assignment>(bad("[1,2]", "\"[1 2]\"").as_bytes(), "invalid type");
    assert_rejects::<Assignment>(bad("6700", "67000").as_bytes(), "u16");
    assert_rejects::<Assignment>(bad("\"sup-a1\":", "\"\":").as_bytes(), "invalid supervisor id");
}

const NODE_ASSIGNMENTS: &str = r#"{"version":1,"topologies":["a-2-1700000000","wc-1-1700000000"]}"#;

#[test]
fn node_assignments_golden_and_garbage() {
    let index = NodeAssignments {
        topologies: ["wc-1-1700000000", "a-2-1700000000"].iter().map(|t| t.parse().unwrap()).collect(),
    };
    assert_golden(&index, NODE_ASSIGNMENTS);
    assert_golden(&NodeAssignments::default(), r#"{"version":1,"topologies":[]}"#);
    assert_ignores_unknown_fields::<NodeAssignments>(NODE_ASSIGNMENTS);
    assert_rejects_json_garbage::<NodeAssignments>(NODE_ASSIGNMENTS, 2);
    let bad = NODE_ASSIGNMENTS.replacen("a-2-1700000000", "a/../b", 1);
    assert_rejects::<NodeAssignments>(bad.as_bytes(), "topology id");
}

const NIMBUS_SUMMARY: &str = r#"{"version":1,"host":"nimbus1","port":8080,"start_time_secs":1700000000,"uptime_secs":5,"squall_version":"0.1.0","is_leader":true}"#;

#[test]
fn nimbus_summary_golden_and_garbage() {
    let summary = NimbusSummary {
        host: "nimbus1".into(),
        port: 8080,
        start_time_secs: 1_700_000_000,
        uptime_secs: 5,
        version: "0.1.0".into(),
        is_leader: true,
    };
    assert_golden(&summary, NIMBUS_SUMMARY);
    assert_eq!(summary.address(), "nimbus1:8080");
    assert_ignores_unknown_fields::<NimbusSummary>(NIMBUS_SUMMARY);
    assert_rejects_json_garbage::<NimbusSummary>(NIMBUS_SUMMARY, 2);
    assert_rejects::<NimbusSummary>(NIMBUS_SUMMARY.replacen("8080", "80800", 1).as_bytes(), "u16");
    assert_rejects::<NimbusSummary>(NIMBUS_SUMMARY.replacen("true", "\"yes\"", 1).as_bytes(), "invalid type");
}

fn supervisor_info() -> SupervisorInfo {
    SupervisorInfo {
        time_secs: 1_700_000_100,
        hostname: "host1".into(),
        supervisor_id: sup("sup-a1"),
        used_ports: vec![6700],
        all_ports: vec![6700, 6701],
        uptime_secs: 100,
        version: "0.1.0".into(),
        metrics_endpoint: Some("host1:9100".into()),
        metrics_scheme: MetricsScheme::Http,
    }
}

const SUPERVISOR_INFO: &str = r#"{"version":1,"time_secs":1700000100,"hostname":"host1","supervisor_id":"sup-a1","used_ports":[6700],"all_ports":[6700,6701],"uptime_secs":100,"squall_version":"0.1.0","metrics_endpoint":"host1:9100"}"#;

#[test]
fn supervisor_info_golden() {
    assert_golden(&supervisor_info(), SUPERVISOR_INFO);
    let no_metrics = SupervisorInfo { metrics_endpoint: None, used_ports: vec![], ..supervisor_info() };
    assert_golden(
        &no_metrics,
        r#"{"version":1,"time_secs":1700000100,"hostname":"host1","supervisor_id":"sup-a1","used_ports":[],"all_ports":[6700,6701],"uptime_secs":100,"squall_version":"0.1.0","metrics_endpoint":null}"#,
    );
    assert_ignores_unknown_fields::<SupervisorInfo>(SUPERVISOR_INFO);
    // `/metrics` over TLS, added within version 1: the scheme written only for HTTPS.
    let https = SupervisorInfo { metrics_scheme: MetricsScheme::Https, ..supervisor_info() };
    assert_golden(&https, &SUPERVISOR_INFO.replace("9100\"}", "9100\",\"metrics_scheme\":\"https\"}"));
    assert_rejects::<SupervisorInfo>(
        SUPERVISOR_INFO.replace("9100\"}", "9100\",\"metrics_scheme\":\"gopher\"}").as_bytes(),
        "unknown variant",
    );
}

#[test]
fn supervisor_info_garbage() {
    assert_rejects_json_garbage::<SupervisorInfo>(SUPERVISOR_INFO, 2);
    let bad = |from: &str, to: &str| SUPERVISOR_INFO.replacen(from, to, 1);
    assert_rejects::<SupervisorInfo>(bad("[6700]", "[-1]").as_bytes(), "invalid value");
    assert_rejects::<SupervisorInfo>(
        bad("\"uptime_secs\":100", "\"uptime_secs\":\"100\"").as_bytes(),
        "invalid type",
    );
    assert_rejects::<SupervisorInfo>(bad("\"squall_version\":\"0.1.0\",", "").as_bytes(), "squall_version");
}

fn heartbeat() -> WorkerHeartbeat {
    WorkerHeartbeat {
        topology_id: topology_id(),
        executor_stats: vec![ExecutorStats {
            executor: exec(1, 2),
            emitted: 10,
            transferred: 10,
            acked: 8,
            failed: 1,
            execute_latency_ms: 0.5,
            process_latency_ms: 0.25,
            complete_latency_ms: 12.0,
        }],
        start_time_secs: 1_700_000_010,
        time_secs: 1_700_000_070,
        uptime_secs: 60,
        metrics_endpoint: None,
        metrics_scheme: MetricsScheme::Http,
    }
}

const HEARTBEAT: &str = r#"{"version":1,"topology_id":"wc-1-1700000000","executor_stats":[{"executor":[1,2],"emitted":10,"transferred":10,"acked":8,"failed":1,"execute_latency_ms":0.5,"process_latency_ms":0.25,"complete_latency_ms":12.0}],"start_time_secs":1700000010,"time_secs":1700000070,"uptime_secs":60}"#;

#[test]
fn worker_heartbeat_golden() {
    assert_golden(&heartbeat(), HEARTBEAT);
    let mut beat = heartbeat();
    beat.executor_stats[0].complete_latency_ms = f64::NAN;
    beat.executor_stats[0].execute_latency_ms = f64::INFINITY;
    let decoded = WorkerHeartbeat::decode(PATH, &beat.encode()).unwrap();
    assert_eq!(decoded.executor_stats[0].complete_latency_ms, 0.0);
    assert_eq!(decoded.executor_stats[0].execute_latency_ms, 0.0);
    let max = WorkerHeartbeat { uptime_secs: u64::MAX, ..heartbeat() };
    assert_eq!(WorkerHeartbeat::decode(PATH, &max.encode()).unwrap(), max);
    assert_ignores_unknown_fields::<WorkerHeartbeat>(HEARTBEAT);
    // The metrics endpoint, added within version 1: written only when set.
    let with_endpoint = WorkerHeartbeat { metrics_endpoint: Some("host1:38211".into()), ..heartbeat() };
    let expected =
        HEARTBEAT.replace("\"uptime_secs\":60}", "\"uptime_secs\":60,\"metrics_endpoint\":\"host1:38211\"}");
    assert_golden(&with_endpoint, &expected);
    let https = WorkerHeartbeat { metrics_scheme: MetricsScheme::Https, ..with_endpoint.clone() };
    assert_golden(&https, &expected.replace("38211\"}", "38211\",\"metrics_scheme\":\"https\"}"));
    assert!(https.content_differs(&with_endpoint), "a scheme change is a content change");
}

#[test]
fn workerbeat_content_is_everything_but_the_clock_with_stats_at_two_digits() {
    use cluster_state::znode::two_digits;
    let base = heartbeat();
    let later = WorkerHeartbeat { time_secs: base.time_secs + 60, uptime_secs: 120, ..heartbeat() };
    assert!(!later.content_differs(&base), "time and uptime alone are no change");
    let changed = |f: &dyn Fn(&mut WorkerHeartbeat)| {
        let mut b = heartbeat();
        f(&mut b);
        b.content_differs(&base)
    };
    assert!(changed(&|b| b.executor_stats[0].emitted = 11), "small counters are exact");
    assert!(changed(&|b| b.executor_stats[0].complete_latency_ms = 13.0));
    assert!(!changed(&|b| b.executor_stats[0].complete_latency_ms = 12.04));
    assert!(changed(&|b| b.executor_stats[0].executor = exec(1, 1)));
    assert!(changed(&|b| b.metrics_endpoint = Some("h:1".into())));
    assert!(changed(&|b| b.start_time_secs += 1));
    assert!(changed(&|b| b.executor_stats.clear()));
    let big = |n| {
        let mut b = heartbeat();
        b.executor_stats[0].acked = n;
        b
    };
    assert!(!big(123_456).content_differs(&big(129_999)), "same two leading digits");
    assert!(big(130_000).content_differs(&big(129_999)));
    for (n, rounded) in [(0, 0), (99, 99), (100, 100), (1_299, 1_200), (u64::MAX, 18_000_000_000_000_000_000)]
    {
        assert_eq!(two_digits(n), rounded, "{n}");
    }
}

/// The throttle of workerbeat writes: the first at once, then only a changed content and only
/// `every` after the last write.
#[test]
fn workerbeats_are_written_at_once_then_only_changed_and_not_before_the_interval() {
    use cluster_state::znode::WorkerbeatThrottle;
    use std::time::Duration;
    let every = Duration::from_secs(60);
    let mut throttle = WorkerbeatThrottle::new(every);
    let t0 = tokio::time::Instant::now();
    let base = heartbeat();
    assert!(throttle.due(&base, t0), "the first beat is written at once");
    throttle.written(base.clone(), t0);
    let mut busier = heartbeat();
    busier.executor_stats[0].acked += 1000;
    assert!(!throttle.due(&busier, t0 + every - Duration::from_secs(1)), "changed, but too soon");
    assert!(throttle.due(&busier, t0 + every), "changed, and the interval passed");
    let same = WorkerHeartbeat { time_secs: base.time_secs + 600, uptime_secs: 660, ..heartbeat() };
    assert!(!throttle.due(&same, t0 + every * 10), "unchanged content is never rewritten");
}

#[test]
fn worker_heartbeat_garbage() {
    assert_rejects_json_garbage::<WorkerHeartbeat>(HEARTBEAT, 2);
    let bad = |from: &str, to: &str| HEARTBEAT.replacen(from, to, 1);
    assert_rejects::<WorkerHeartbeat>(bad("wc-1-1700000000", "wc").as_bytes(), "invalid topology id");
    assert_rejects::<WorkerHeartbeat>(bad("\"acked\":8", "\"acked\":-8").as_bytes(), "invalid value");
    assert_rejects::<WorkerHeartbeat>(bad("0.25", "null").as_bytes(), "invalid type: null");
}

const ERROR_INFO: &str = r#"{"version":1,"error":"connection refused: \"b1:9092\"\n","time_secs":1700000200,"host":"host1","port":6700}"#;

#[test]
fn error_info_golden() {
    let info = ErrorInfo {
        error: "connection refused: \"b1:9092\"\n".into(),
        time_secs: 1_700_000_200,
        host: "host1".into(),
        port: 6700,
    };
    assert_golden(&info, ERROR_INFO);
    assert_ignores_unknown_fields::<ErrorInfo>(ERROR_INFO);
}

#[test]
fn error_info_garbage() {
    assert_rejects_json_garbage::<ErrorInfo>(ERROR_INFO, 2);
    assert_rejects::<ErrorInfo>(ERROR_INFO.replacen("6700", "\"6700\"", 1).as_bytes(), "invalid type");
}

/// What the worker writes today (worker::process's heartbeat writer produces these bytes).
const LOCAL_BEAT: &str = r#"{"version":1,"time_secs":1700000070,"topology_id":"wc-1-1700000000","executors":[[1,2],[3,3]],"port":6700}"#;

#[test]
fn local_worker_heartbeat_golden() {
    let beat = LocalWorkerHeartbeat {
        time_secs: 1_700_000_070,
        topology_id: "wc-1-1700000000".parse().unwrap(),
        executors: vec![
            ExecutorId::new(TaskId(1), TaskId(2)).unwrap(),
            ExecutorId::new(TaskId(3), TaskId(3)).unwrap(),
        ],
        port: 6700,
        start_time_secs: None,
        executor_stats: vec![],
        metrics_endpoint: None,
        metrics_scheme: MetricsScheme::Http,
        workerbeats_zk_secs: None,
    };
    assert_golden(&beat, LOCAL_BEAT);
    // What the worker writes since the supervisor forwards stats to nimbus.
    let full = LocalWorkerHeartbeat {
        start_time_secs: Some(1_700_000_010),
        executor_stats: vec![ExecutorStats {
            executor: ExecutorId::new(TaskId(1), TaskId(2)).unwrap(),
            emitted: 10,
            transferred: 10,
            acked: 8,
            failed: 1,
            execute_latency_ms: 0.5,
            process_latency_ms: 0.25,
            complete_latency_ms: 12.0,
        }],
        metrics_endpoint: Some("host1:38211".into()),
        metrics_scheme: MetricsScheme::Http,
        ..beat
    };
    assert_golden(
        &full,
        r#"{"version":1,"time_secs":1700000070,"topology_id":"wc-1-1700000000","executors":[[1,2],[3,3]],"port":6700,"start_time_secs":1700000010,"executor_stats":[{"executor":[1,2],"emitted":10,"transferred":10,"acked":8,"failed":1,"execute_latency_ms":0.5,"process_latency_ms":0.25,"complete_latency_ms":12.0}],"metrics_endpoint":"host1:38211"}"#,
    );
    assert_ignores_unknown_fields::<LocalWorkerHeartbeat>(LOCAL_BEAT);
    let https = LocalWorkerHeartbeat { metrics_scheme: MetricsScheme::Https, ..full.clone() };
    let decoded = LocalWorkerHeartbeat::decode(PATH, &https.encode()).unwrap();
    assert_eq!(decoded, https);
    assert!(
        String::from_utf8(https.encode())
            .unwrap()
            .ends_with(r#""metrics_endpoint":"host1:38211","metrics_scheme":"https"}"#)
    );
    // What the worker writes since its supervisor writes its workerbeat node.
    let throttled = LocalWorkerHeartbeat { workerbeats_zk_secs: Some(60), ..full };
    assert_eq!(LocalWorkerHeartbeat::decode(PATH, &throttled.encode()).unwrap(), throttled);
    assert!(
        String::from_utf8(throttled.encode())
            .unwrap()
            .ends_with(r#""metrics_endpoint":"host1:38211","workerbeats_zk_secs":60}"#)
    );
    assert_eq!(
        LocalWorkerHeartbeat::path(std::path::Path::new("/var/squall"), "w-1"),
        std::path::Path::new("/var/squall/workers/w-1/heartbeat")
    );
}

#[test]
fn local_worker_heartbeat_garbage() {
    assert_rejects_json_garbage::<LocalWorkerHeartbeat>(LOCAL_BEAT, 2);
    assert_rejects::<LocalWorkerHeartbeat>(LOCAL_BEAT.replacen("[3,3]", "[3,2]", 1).as_bytes(), "");
}

// ---- Kafka registry ----

/// Exactly what Kafka 0.8's ZookeeperConsumerConnector writes.
const KAFKA_REGISTRATION: &str =
    r#"{"version":1,"subscription":{"topic1":1},"pattern":"static","timestamp":"1400000000000"}"#;

fn registration() -> ConsumerRegistration {
    ConsumerRegistration {
        subscription: BTreeMap::from([("topic1".into(), 1)]),
        pattern: SubscriptionPattern::Static,
        timestamp_ms: 1_400_000_000_000,
    }
}

#[test]
fn consumer_registration_is_kafkas() {
    assert_golden(&registration(), KAFKA_REGISTRATION);
    let wildcard = ConsumerRegistration {
        subscription: BTreeMap::from([("clicks\\..*".into(), 2)]),
        pattern: SubscriptionPattern::WhiteList,
        timestamp_ms: 7,
    };
    assert_golden(
        &wildcard,
        r#"{"version":1,"subscription":{"clicks\\..*":2},"pattern":"white_list","timestamp":"7"}"#,
    );
    let two = ConsumerRegistration {
        subscription: BTreeMap::from([("b".into(), 2), ("a".into(), 1)]),
        pattern: SubscriptionPattern::BlackList,
        timestamp_ms: 0,
    };
    assert_golden(
        &two,
        r#"{"version":1,"subscription":{"a":1,"b":2},"pattern":"black_list","timestamp":"0"}"#,
    );
}

#[test]
fn consumer_registration_accepts_any_order_and_whitespace() {
    let reordered = "{\n  \"pattern\" : \"static\",\r\n\t\"timestamp\":\"1400000000000\", \"subscription\": { \"topic1\" : 1 }, \"version\": 1 }\n";
    assert_eq!(ConsumerRegistration::decode(PATH, reordered.as_bytes()).unwrap(), registration());
    let numeric = r#"{"version":1,"subscription":{"topic1":1},"pattern":"static","timestamp":1400000000000}"#;
    assert_eq!(ConsumerRegistration::decode(PATH, numeric.as_bytes()).unwrap(), registration());
    assert_ignores_unknown_fields::<ConsumerRegistration>(KAFKA_REGISTRATION);
}

#[test]
fn consumer_registration_garbage() {
    assert_rejects_json_garbage::<ConsumerRegistration>(KAFKA_REGISTRATION, 2);
    let bad = |from: &str, to: &str| KAFKA_REGISTRATION.replacen(from, to, 1);
    assert_rejects::<ConsumerRegistration>(bad("static", "regex").as_bytes(), "unknown variant `regex`");
    assert_rejects::<ConsumerRegistration>(bad("1400000000000", "soon").as_bytes(), "milliseconds");
    assert_rejects::<ConsumerRegistration>(bad("1400000000000", "-1").as_bytes(), "milliseconds");
    assert_rejects::<ConsumerRegistration>(
        bad("\"topic1\":1", "\"topic1\":\"1\"").as_bytes(),
        "invalid type",
    );
    assert_rejects::<ConsumerRegistration>(bad("{\"topic1\":1}", "[\"topic1\"]").as_bytes(), "invalid type");
}

#[test]
fn owner_is_a_plain_thread_id() {
    let consumer =
        ConsumerId::generate(&GroupId::new("mygroup").unwrap(), "host1", 1_400_000_000_000, "a1b2c3d4");
    let owner = OwnerData(ConsumerThreadId::new(&consumer.unwrap(), 0));
    assert_golden(&owner, "mygroup_host1-1400000000000-a1b2c3d4-0");
    assert_rejects::<OwnerData>(b"", "empty payload");
    assert_rejects::<OwnerData>(b"\xffc-0", "not UTF-8");
    assert_rejects::<OwnerData>(b"mygroup_host1-", "invalid consumer thread id");
    assert_rejects::<OwnerData>(b"\"c-0\"", "invalid consumer thread id");
    assert_rejects::<OwnerData>(b"c-0\n", "invalid consumer thread id");
    assert_rejects::<OwnerData>(b"42", "invalid consumer thread id");
}

#[test]
fn offset_is_a_plain_decimal() {
    assert_golden(&OffsetData::new(42).unwrap(), "42");
    assert_golden(&OffsetData::new(0).unwrap(), "0");
    assert_golden(&OffsetData::new(i64::MAX).unwrap(), "9223372036854775807");
    for tolerated in [" 42", "42\n", "\t42 \r\n", "042"] {
        assert_eq!(OffsetData::decode(PATH, tolerated.as_bytes()).unwrap().get(), 42, "{tolerated:?}");
    }
    assert!(OffsetData::new(-1).is_err());
}

#[test]
fn offset_garbage() {
    for bad in ["-1", "abc", "1e3", "+1", "1.0", "0x10", "4 2", "\u{a0}42", "\"42\"", " ", "\n"] {
        assert_rejects::<OffsetData>(bad.as_bytes(), "expected a non-negative decimal integer");
    }
    assert_rejects::<OffsetData>(b"", "empty payload");
    assert_rejects::<OffsetData>(b"4\xff2", "not UTF-8");
    for overflow in ["99999999999999999999", "9223372036854775808"] {
        assert_rejects::<OffsetData>(overflow.as_bytes(), "does not fit a signed 64-bit integer");
    }
}

/// Exactly what Kafka 0.8 brokers write.
const KAFKA_08_BROKER: &str =
    r#"{"jmx_port":-1,"timestamp":"1400000000000","host":"b1","version":1,"port":9092}"#;

#[test]
fn broker_registration_v1_is_kafkas() {
    let broker = BrokerRegistration {
        version: 1,
        host: Some("b1".into()),
        port: 9092,
        jmx_port: -1,
        timestamp_ms: 1_400_000_000_000,
        endpoints: vec![],
        listener_security_protocol_map: BTreeMap::new(),
        rack: None,
    };
    assert_golden(&broker, KAFKA_08_BROKER);
    assert_eq!(broker.bootstrap_address().as_deref(), Some("b1:9092"));
}

#[test]
fn broker_registration_later_versions() {
    // Kafka 2.x, a plaintext listener next to an SSL one.
    let v4 = r#"{"listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT","SSL":"SSL"},"endpoints":["SSL://b1:9093","PLAINTEXT://b1:9092"],"jmx_port":-1,"host":"b1","timestamp":"1600000000000","port":9092,"version":4}"#;
    let broker = BrokerRegistration::decode(PATH, v4.as_bytes()).unwrap();
    assert_eq!((broker.version, broker.endpoints.len()), (4, 2));
    assert_eq!(broker.bootstrap_address().as_deref(), Some("b1:9092"));
    assert_eq!(BrokerRegistration::decode(PATH, &broker.encode()).unwrap(), broker);

    // Kafka 2.7+, named listeners only: host is null, the endpoints say where to go.
    let v5 = r#"{"features":{},"listener_security_protocol_map":{"EXTERNAL":"SSL","INTERNAL":"PLAINTEXT"},"endpoints":["EXTERNAL://pub.example:9093","INTERNAL://b1:19092"],"rack":"r1","jmx_port":9999,"host":null,"timestamp":"1600000000000","port":-1,"version":5}"#;
    let broker = BrokerRegistration::decode(PATH, v5.as_bytes()).unwrap();
    assert_eq!((broker.host.as_deref(), broker.rack.as_deref()), (None, Some("r1")));
    assert_eq!(broker.bootstrap_address().as_deref(), Some("b1:19092"));
    assert_golden(
        &broker,
        r#"{"version":5,"host":null,"port":-1,"endpoints":["EXTERNAL://pub.example:9093","INTERNAL://b1:19092"],"jmx_port":9999,"timestamp":"1600000000000","listener_security_protocol_map":{"EXTERNAL":"SSL","INTERNAL":"PLAINTEXT"},"rack":"r1"}"#,
    );

    // Empty host, no plaintext listener: the first endpoint.
    let v2 =
        r#"{"version":2,"host":"","port":-1,"endpoints":["SSL://[::1]:9093"],"jmx_port":-1,"timestamp":"1"}"#;
    let broker = BrokerRegistration::decode(PATH, v2.as_bytes()).unwrap();
    assert_eq!(broker.bootstrap_address().as_deref(), Some("[::1]:9093"));
    let nowhere = BrokerRegistration { endpoints: vec!["PLAINTEXT://:9092".into()], ..broker };
    assert_eq!(nowhere.bootstrap_address(), None);
}

#[test]
fn broker_registration_garbage() {
    assert_rejects_json_garbage::<BrokerRegistration>(KAFKA_08_BROKER, 6);
    assert_rejects::<BrokerRegistration>(
        KAFKA_08_BROKER.replacen("\"version\":1", "\"version\":0", 1).as_bytes(),
        "unsupported version 0 (this build reads versions 1-5)",
    );
    assert_rejects::<BrokerRegistration>(
        KAFKA_08_BROKER.replacen("9092", "\"9092\"", 1).as_bytes(),
        "invalid type",
    );
    let v2 =
        |rest: &str| format!(r#"{{"version":2,"host":null,"port":-1,"jmx_port":-1,"timestamp":"1"{rest}}}"#);
    assert_rejects::<BrokerRegistration>(
        v2(r#","endpoints":"PLAINTEXT://b1:9092""#).as_bytes(),
        "invalid type",
    );
    assert_rejects::<BrokerRegistration>(v2("").as_bytes(), "version 2 registration without endpoints");
    assert!(
        BrokerRegistration::decode(PATH, v2(r#","endpoints":["PLAINTEXT://b1:9092"]"#).as_bytes()).is_ok()
    );
    let no_host = KAFKA_08_BROKER.replacen("\"b1\"", "null", 1);
    assert_rejects::<BrokerRegistration>(no_host.as_bytes(), "version 1 registration without host");
    assert_rejects::<BrokerRegistration>(br#"{"version":1,"host":"b1"}"#, "missing field `port`");
}

const KAFKA_TOPIC: &str = r#"{"version":1,"partitions":{"0":[0,1],"1":[1,0]}}"#;

#[test]
fn topic_registration_is_kafkas() {
    let p = |n| Partition::new(n).unwrap();
    let topic = TopicRegistration {
        partitions: BTreeMap::from([
            (p(1), vec![BrokerId(1), BrokerId(0)]),
            (p(0), vec![BrokerId(0), BrokerId(1)]),
        ]),
    };
    assert_golden(&topic, KAFKA_TOPIC);
    assert_eq!(topic.replicas(p(1)), Some(&[BrokerId(1), BrokerId(0)][..]));
    assert_eq!(topic.replicas(p(2)), None);

    // Numeric, not lexicographic, order; later versions' fields ignored.
    let v3 = r#"{"version":3,"topic_id":"AAAAAAAAAAAAAAAAAAAAAA","partitions":{"10":[2],"2":[0],"0":[1]},"adding_replicas":{},"removing_replicas":{}}"#;
    let topic = TopicRegistration::decode(PATH, v3.as_bytes()).unwrap();
    assert_eq!(topic.partitions().map(Partition::get).collect::<Vec<_>>(), [0, 2, 10]);
    assert_golden(&topic, r#"{"version":1,"partitions":{"0":[1],"2":[0],"10":[2]}}"#);
}

#[test]
fn topic_registration_garbage() {
    assert_rejects_json_garbage::<TopicRegistration>(KAFKA_TOPIC, 4);
    let bad = |from: &str, to: &str| KAFKA_TOPIC.replacen(from, to, 1);
    assert_rejects::<TopicRegistration>(bad("\"1\":", "\"-1\":").as_bytes(), "invalid partition");
    assert_rejects::<TopicRegistration>(bad("\"1\":", "\"one\":").as_bytes(), "");
    assert_rejects::<TopicRegistration>(bad("[1,0]", "[\"1\"]").as_bytes(), "invalid type");
}

// ---- Properties ----

/// Runs every decoder on `bytes`; none may panic.
fn decode_all(bytes: &[u8]) {
    let _ = StormBase::decode(PATH, bytes);
    let _ = Assignment::decode(PATH, bytes);
    let _ = SupervisorInfo::decode(PATH, bytes);
    let _ = WorkerHeartbeat::decode(PATH, bytes);
    let _ = ErrorInfo::decode(PATH, bytes);
    let _ = LocalWorkerHeartbeat::decode(PATH, bytes);
    let _ = ConsumerRegistration::decode(PATH, bytes);
    let _ = OwnerData::decode(PATH, bytes);
    let _ = OffsetData::decode(PATH, bytes);
    let _ = BrokerRegistration::decode(PATH, bytes);
    let _ = TopicRegistration::decode(PATH, bytes);
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        decode_all(&bytes);
    }

    #[test]
    fn json_like_text_never_panics(body in r#"[{}\[\]":, 0-9a-z_.\-\\]{0,80}"#) {
        decode_all(body.as_bytes());
        decode_all(format!("{{\"version\":1,{body}").as_bytes());
    }

    #[test]
    fn mutated_goldens_never_panic(index in 0usize..4096, byte in any::<u8>()) {
        for golden in [STORM_BASE_ACTIVE, ASSIGNMENT, SUPERVISOR_INFO, HEARTBEAT, ERROR_INFO, LOCAL_BEAT, KAFKA_REGISTRATION, KAFKA_08_BROKER, KAFKA_TOPIC] {
            let mut bytes = golden.as_bytes().to_vec();
            let i = index % bytes.len();
            bytes[i] = byte;
            decode_all(&bytes);
        }
    }

    #[test]
    fn offsets_round_trip(offset in 0..=i64::MAX) {
        let data = OffsetData::new(offset).unwrap();
        prop_assert_eq!(data.encode(), offset.to_string().into_bytes());
        prop_assert_eq!(OffsetData::decode(PATH, &data.encode()).unwrap(), data);
    }

    #[test]
    fn negative_offsets_are_rejected(offset in i64::MIN..0) {
        prop_assert!(OffsetData::new(offset).is_err());
        prop_assert!(OffsetData::decode(PATH, offset.to_string().as_bytes()).is_err());
    }
}

const SNAPSHOT: &str =
    r#"{"version":1,"created_ms":1700000000000,"offsets":{"clicks":{"0":42,"1":17},"views":{"3":0}}}"#;

fn snapshot() -> OffsetSnapshot {
    let p = |n: i32| Partition::new(n).unwrap();
    let o = |n: i64| OffsetData::new(n).unwrap();
    OffsetSnapshot {
        created_ms: 1_700_000_000_000,
        offsets: [
            ("clicks".to_owned(), [(p(0), o(42)), (p(1), o(17))].into_iter().collect()),
            ("views".to_owned(), [(p(3), o(0))].into_iter().collect()),
        ]
        .into_iter()
        .collect(),
    }
}

#[test]
fn offset_snapshot_golden() {
    assert_golden(&snapshot(), SNAPSHOT);
    assert_ignores_unknown_fields::<OffsetSnapshot>(SNAPSHOT);
}

#[test]
fn offset_snapshot_garbage() {
    assert_rejects_json_garbage::<OffsetSnapshot>(SNAPSHOT, 2);
    assert_rejects::<OffsetSnapshot>(SNAPSHOT.replace("42", "-42").as_bytes(), "must not be negative");
    assert_rejects::<OffsetSnapshot>(SNAPSHOT.replace("\"1\":17", "\"x\":17").as_bytes(), "");
}
