//! Wire formats of nimbus's HTTP API: golden JSON (Storm UI's key names, which scripts written
//! for Storm read), round trips, and bad request bodies refused with the field at fault.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::fmt::Debug;

use cluster_state::api::{
    self, BeginUpload, BodyError, BoltSummary, BoltWindowStats, ChunkReceived, ClusterConfiguration,
    ClusterSummary, ComponentPage, ConsumerGroupDetail, ConsumerGroupSummary, ConsumerGroups,
    ConsumerPartition, Count, ErrorBody, ExecutorSummary, FinishUpload, LastError, NimbusSummaries,
    NimbusSummaryView, Operation, PendingAction, PendingTransitionView, RebalanceOptions, RebalanceRequest,
    ResetPlan, ResetPlanRequest, ResetPlanRow, ResetTarget, SpoutSummary, StatsWindow, SubmitTopology,
    Submitted, SupervisorHeartbeat, SupervisorSummaries, SupervisorSummary, TargetGroup, TopologyDetail,
    TopologyError, TopologyErrors, TopologyOperation, TopologySummaries, TopologySummary, UploadBegun,
    UploadFinished, UploadId, Visualization, VisualizationInput, VisualizationNode, VisualizationStat,
    WindowStats, WorkerSummary,
};
use cluster_state::ids::{ComponentId, GroupId, SupervisorId, Topic, TopologyId, TopologyName};
use serde::Serialize;
use serde::de::DeserializeOwned;

const UPLOAD: &str = "123e4567-e89b-42d3-a456-426614174000";

fn upload() -> UploadId {
    UPLOAD.parse().unwrap()
}

fn id() -> TopologyId {
    "wc-1-1700000000".parse().unwrap()
}

fn comp(s: &str) -> ComponentId {
    ComponentId::new(s).unwrap()
}

/// `value` encodes to exactly `golden`, and `golden` decodes back to `value`.
fn golden<T: Serialize + DeserializeOwned + PartialEq + Debug>(value: &T, golden: &str) {
    assert_eq!(serde_json::to_string(value).unwrap(), golden);
    assert_eq!(&api::decode_response::<T>(golden.as_bytes()).unwrap(), value);
}

fn summary() -> TopologySummary {
    TopologySummary {
        id: id(),
        name: TopologyName::new("wc").unwrap(),
        status: "ACTIVE".into(),
        uptime: "1h 2m 3s".into(),
        uptime_seconds: 3723,
        tasks_total: 6,
        workers_total: 2,
        executors_total: 3,
        owner: "alice".into(),
    }
}

#[test]
fn read_side_bodies_keep_storm_uis_keys() {
    golden(
        &ClusterSummary {
            storm_version: "0.1.0".into(),
            nimbus_uptime: "59s".into(),
            nimbus_uptime_seconds: 59,
            supervisors: 2,
            slots_total: 3,
            slots_used: 2,
            slots_free: 1,
            executors_total: 3,
            tasks_total: 6,
            topologies: 1,
        },
        r#"{"stormVersion":"0.1.0","nimbusUptime":"59s","nimbusUptimeSeconds":59,"supervisors":2,"slotsTotal":3,"slotsUsed":2,"slotsFree":1,"executorsTotal":3,"tasksTotal":6,"topologies":1}"#,
    );
    golden(
        &SupervisorSummaries {
            supervisors: vec![SupervisorSummary {
                id: SupervisorId::new("sup-1").unwrap(),
                host: "h".into(),
                uptime: "5s".into(),
                uptime_seconds: 5,
                slots_total: 2,
                slots_used: 1,
                version: "0.1.0".into(),
            }],
        },
        r#"{"supervisors":[{"id":"sup-1","host":"h","uptime":"5s","uptimeSeconds":5,"slotsTotal":2,"slotsUsed":1,"version":"0.1.0"}]}"#,
    );
    golden(
        &TopologySummaries { topologies: vec![summary()] },
        r#"{"topologies":[{"id":"wc-1-1700000000","name":"wc","status":"ACTIVE","uptime":"1h 2m 3s","uptimeSeconds":3723,"tasksTotal":6,"workersTotal":2,"executorsTotal":3,"owner":"alice"}]}"#,
    );
    golden(
        &TopologyDetail {
            summary: summary(),
            launch_time_secs: 1_700_000_000,
            requested_workers: 2,
            component_executors: [(comp("split"), 2)].into_iter().collect(),
            prev_status: Some("ACTIVE".into()),
            pending_transition: Some(PendingTransitionView {
                action: PendingAction::Rebalance,
                deadline_secs: 1_700_000_600,
                seconds_left: 30,
            }),
            ..topology_page()
        },
        &format!(
            "{}{}",
            r#"{"id":"wc-1-1700000000","name":"wc","status":"ACTIVE","uptime":"1h 2m 3s","uptimeSeconds":3723,"tasksTotal":6,"workersTotal":2,"executorsTotal":3,"owner":"alice","launchTimeSecs":1700000000,"requestedWorkers":2,"componentExecutors":{"split":2},"prevStatus":"ACTIVE","pendingTransition":{"action":"rebalance","deadlineSecs":1700000600,"secondsLeft":30},"#,
            TOPOLOGY_PAGE_TAIL
        ),
    );
    // An answer of a nimbus from before the page's stats reads with them empty.
    let older = r#"{"id":"wc-1-1700000000","name":"wc","status":"ACTIVE","uptime":"1h 2m 3s","uptimeSeconds":3723,"tasksTotal":6,"workersTotal":2,"executorsTotal":3,"owner":"alice","launchTimeSecs":1700000000,"requestedWorkers":2,"componentExecutors":{"split":2},"prevStatus":null,"pendingTransition":null}"#;
    let read: TopologyDetail = api::decode_response(older.as_bytes()).unwrap();
    assert!(read.spouts.is_empty() && read.topology_stats.is_empty());
    assert_eq!(read.window, StatsWindow::AllTime);
    golden(
        &TopologyErrors {
            id: id(),
            errors: vec![TopologyError {
                component: comp("split"),
                error: "boom".into(),
                error_host: "h".into(),
                error_port: 6700,
                error_time: 1_700_000_000_000,
                error_lapsed_secs: 3,
            }],
        },
        r#"{"id":"wc-1-1700000000","errors":[{"component":"split","error":"boom","errorHost":"h","errorPort":6700,"errorTime":1700000000000,"errorLapsedSecs":3}]}"#,
    );
    golden(
        &vec![TargetGroup {
            targets: vec!["127.0.0.1:9100".into()],
            labels: [("squall_role".to_owned(), "nimbus".to_owned())].into_iter().collect(),
        }],
        r#"[{"targets":["127.0.0.1:9100"],"labels":{"squall_role":"nimbus"}}]"#,
    );
    golden(
        &ErrorBody::new("Bad Request", "field \"size\": ..."),
        r#"{"error":"Bad Request","errorMessage":"field \"size\": ..."}"#,
    );
    let mut refusal =
        ErrorBody::new("Service Unavailable", "this nimbus is not the leader; the leader is n2:8080");
    (refusal.not_leader, refusal.leader) = (true, Some("n2:8080".into()));
    golden(
        &refusal,
        r#"{"error":"Service Unavailable","errorMessage":"this nimbus is not the leader; the leader is n2:8080","leader":"n2:8080","notLeader":true}"#,
    );
    // Storm UI's /api/v1/nimbus/summary.
    golden(
        &NimbusSummaries {
            nimbuses: vec![NimbusSummaryView {
                host: "n1".into(),
                port: 8080,
                status: "Leader".into(),
                version: "0.1.0".into(),
                nimbus_up_time: "1m 1s".into(),
                nimbus_up_time_seconds: 61,
            }],
        },
        r#"{"nimbuses":[{"host":"n1","port":8080,"status":"Leader","version":"0.1.0","nimbusUpTime":"1m 1s","nimbusUpTimeSeconds":61}]}"#,
    );
}

#[test]
fn write_side_bodies_keep_their_keys() {
    golden(
        &SubmitTopology {
            topology_upload: upload(),
            worker_upload: Some(upload()),
            resources_upload: None,
            inactive: true,
            owner: "alice".into(),
        },
        &format!(
            r#"{{"topologyUpload":"{UPLOAD}","workerUpload":"{UPLOAD}","inactive":true,"owner":"alice"}}"#
        ),
    );
    golden(
        &Submitted {
            id: id(),
            name: TopologyName::new("wc").unwrap(),
            status: "inactive".into(),
            workers: 2,
        },
        r#"{"id":"wc-1-1700000000","name":"wc","status":"inactive","workers":2}"#,
    );
    golden(
        &TopologyOperation {
            topology_operation: Operation::Deactivate,
            topology_id: id(),
            status: "success".into(),
            topology_status: "INACTIVE".into(),
        },
        r#"{"topologyOperation":"deactivate","topologyId":"wc-1-1700000000","status":"success","topologyStatus":"INACTIVE"}"#,
    );
    golden(
        &RebalanceRequest::new(RebalanceOptions {
            num_workers: Some(Count(3)),
            executors: [(comp("split"), Count(4))].into_iter().collect(),
        }),
        r#"{"rebalanceOptions":{"numWorkers":3,"executors":{"split":4}}}"#,
    );
    golden(&BeginUpload { size: 250 }, r#"{"size":250}"#);
    golden(
        &UploadBegun { upload_id: upload(), size: 250 },
        &format!(r#"{{"uploadId":"{UPLOAD}","size":250}}"#),
    );
    golden(
        &ChunkReceived { upload_id: upload(), received: 100 },
        &format!(r#"{{"uploadId":"{UPLOAD}","received":100}}"#),
    );
    golden(&FinishUpload { sha256: "ab".into() }, r#"{"sha256":"ab"}"#);
    golden(
        &UploadFinished { upload_id: upload(), size: 250, sha256: "ab".into() },
        &format!(r#"{{"uploadId":"{UPLOAD}","size":250,"sha256":"ab"}}"#),
    );
}

#[test]
fn requests_take_what_storms_clients_send() {
    // Storm UI: counts as strings, a callback beside the options.
    let storm_ui =
        br#"{"rebalanceOptions":{"numWorkers":"3","executors":{"split":"4","count":2}},"callback":"f"}"#;
    let options = api::decode_request::<RebalanceRequest>(storm_ui).unwrap().into_options();
    assert_eq!(options.num_workers, Some(Count(3)));
    assert_eq!(
        options.executors,
        [(comp("count"), Count(2)), (comp("split"), Count(4))].into_iter().collect()
    );
    let top_level = api::decode_request::<RebalanceRequest>(br#"{"numWorkers":2,"executors":null}"#).unwrap();
    assert_eq!(
        top_level.into_options(),
        RebalanceOptions { num_workers: Some(Count(2)), executors: BTreeMap::new() }
    );
    // Nulls and absent optional fields are "not set".
    let submit: SubmitTopology = api::decode_request(
        format!(r#"{{"topologyUpload":"{UPLOAD}","workerUpload":null,"inactive":null,"owner":null}}"#)
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(
        submit,
        SubmitTopology {
            topology_upload: upload(),
            worker_upload: None,
            resources_upload: None,
            inactive: false,
            owner: String::new()
        }
    );
    // Upload ids in any case, written lower case.
    let upper: UploadId = UPLOAD.to_uppercase().parse().unwrap();
    assert_eq!(upper.to_string(), UPLOAD);
}

#[test]
fn bad_requests_name_the_field_at_fault() {
    fn refused<T: DeserializeOwned + Debug>(body: &str) -> String {
        match api::decode_request::<T>(body.as_bytes()) {
            Ok(v) => panic!("{body} decoded to {v:?}"),
            Err(e) => e.to_string(),
        }
    }
    for (body, says) in [
        ("{}", "missing field `topologyUpload`"),
        (r#"{"topologyUpload": 7}"#, "field \"topologyUpload\": invalid type: integer `7`"),
        (r#"{"topologyUpload": "../../etc"}"#, "invalid upload id \"../../etc\""),
        (&format!(r#"{{"topologyUpload": "{UPLOAD}", "inactive": "yes"}}"#), "field \"inactive\""),
        (&format!(r#"{{"topologyUpload": "{UPLOAD}", "workerUpload": "nope"}}"#), "field \"workerUpload\""),
        (&format!(r#"{{"topologyUpload": "{UPLOAD}", "owners": "x"}}"#), "unknown field `owners`"),
        ("[1]", "a JSON object is required"),
        ("{", "not JSON"),
        (&format!(r#"{{"topologyUpload": "{UPLOAD}"}} trailing"#), "not JSON"),
    ] {
        let message = refused::<SubmitTopology>(body);
        assert!(message.contains(says), "{body}: {message}");
    }
    for (body, says) in [
        (r#"{"numWorkers":-1}"#, "field \"numWorkers\""),
        (r#"{"numWorkers":"many"}"#, "field \"numWorkers\""),
        (r#"{"numWorkers":4294967296}"#, "field \"numWorkers\""),
        (r#"{"executors":{"split":1.5}}"#, "field \"executors.split\""),
        (r#"{"executors":{"split":"+1"}}"#, "field \"executors.split\""),
        (r#"{"executors":{"a/b":1}}"#, "invalid component id \"a/b\""),
        (r#"{"executors":[1]}"#, "field \"executors\""),
        (r#"{"rebalanceOptions":7}"#, "field \"rebalanceOptions\""),
    ] {
        let message = refused::<RebalanceRequest>(body);
        assert!(message.contains(says), "{body}: {message}");
    }
    assert!(refused::<BeginUpload>(r#"{"size":-1}"#).contains("field \"size\""));
    assert!(refused::<FinishUpload>("{}").contains("missing field `sha256`"));
    assert!(matches!(api::decode_request::<BeginUpload>(b" 3 "), Err(BodyError::NotAnObject)));
}

#[test]
fn responses_ignore_fields_they_do_not_know() {
    let newer = r#"{"id":"wc-1-1700000000","name":"wc","status":"active","workers":2,"spouts":[]}"#;
    assert_eq!(api::decode_response::<Submitted>(newer.as_bytes()).unwrap().workers, 2);
}

const HEARTBEAT: &str = r#"{"supervisorId":"sup-1","timeSecs":1700000070,"uptimeSecs":60,"workers":[{"topologyId":"wc-1-1700000000","port":6700,"executors":[[1,2]],"timeSecs":1700000069,"startTimeSecs":1700000010,"uptimeSecs":59,"executorStats":[{"executor":[1,2],"emitted":10,"transferred":10,"acked":8,"failed":1,"executeLatencyMs":0.5,"processLatencyMs":0.25,"completeLatencyMs":12.0}],"metricsEndpoint":"host1:38211"}]}"#;

#[test]
fn supervisor_heartbeat_keeps_its_keys_and_refuses_garbage_naming_the_field() {
    let beat: SupervisorHeartbeat = api::decode_request(HEARTBEAT.as_bytes()).unwrap();
    assert_eq!(serde_json::to_string(&beat).unwrap(), HEARTBEAT);
    assert_eq!(beat.workers[0].executor_stats[0].acked, 8);
    assert!(beat.validate().is_ok());
    // What an older supervisor's worker without stats sends: the optional fields may be absent.
    let minimal = r#"{"supervisorId":"s","timeSecs":1,"uptimeSecs":1,"workers":[{"topologyId":"wc-1-1700000000","port":1,"executors":[],"timeSecs":1}]}"#;
    assert!(api::decode_request::<SupervisorHeartbeat>(minimal.as_bytes()).is_ok());
    // A worker serving `/metrics` over TLS says so; plain HTTP is not written.
    let https = HEARTBEAT.replace("38211\"}", "38211\",\"metricsScheme\":\"https\"}");
    let beat_https: SupervisorHeartbeat = api::decode_request(https.as_bytes()).unwrap();
    assert_eq!(beat_https.workers[0].metrics_scheme, cluster_state::znode::MetricsScheme::Https);
    assert_eq!(serde_json::to_string(&beat_https).unwrap(), https);
    for (body, says) in [
        (
            HEARTBEAT.replace("\"port\":6700", "\"port\":0"),
            "field \"workers[0].port\": a worker port is 1 to 65535",
        ),
        (HEARTBEAT.replace("\"port\":6700", "\"port\":70000"), "field \"workers[0].port\""),
        (HEARTBEAT.replace("[[1,2]]", "[[2,1]]"), "field \"workers[0].executors[0]\""),
        (HEARTBEAT.replace("\"acked\":8", "\"acked\":-8"), "field \"workers[0].executorStats[0].acked\""),
        (HEARTBEAT.replace("\"sup-1\"", "\"a/b\""), "field \"supervisorId\""),
        (HEARTBEAT.replace("\"timeSecs\":1700000070", "\"timeSecs\":\"now\""), "field \"timeSecs\""),
        (HEARTBEAT.replace("\"wc-1-1700000000\"", "\"../x\""), "field \"workers[0].topologyId\""),
        (HEARTBEAT.replace("\"uptimeSecs\":60,", "\"uptimeSecs\":60,\"extra\":1,"), "unknown field `extra`"),
    ] {
        match api::decode_request::<SupervisorHeartbeat>(body.as_bytes()) {
            Ok(v) => panic!("{body} decoded to {v:?}"),
            Err(e) => assert!(e.to_string().contains(says), "{body}: {e}"),
        }
    }
    let mut twice = beat.clone();
    twice.workers.push(beat.workers[0].clone());
    let e = twice.validate().unwrap_err().to_string();
    assert!(e.contains("field \"workers[1].port\": port 6700 is reported twice"), "{e}");
}

fn window_stats(window: StatsWindow) -> WindowStats {
    WindowStats {
        window_pretty: window.pretty(),
        window,
        emitted: 100,
        transferred: 90,
        complete_latency: "8.000".into(),
        acked: 80,
        failed: 1,
    }
}

/// The topology page's Storm 2 parts (`topologyStats`, `spouts`, `bolts`, `workers`,
/// `configuration`), shared by the goldens.
fn topology_page() -> TopologyDetail {
    TopologyDetail {
        summary: summary(),
        launch_time_secs: 1_700_000_000,
        requested_workers: 2,
        component_executors: BTreeMap::new(),
        prev_status: None,
        pending_transition: None,
        msg_timeout: 30,
        window: StatsWindow::AllTime,
        window_hint: "All time".into(),
        topology_stats: vec![window_stats(StatsWindow::TEN_MINUTES), window_stats(StatsWindow::AllTime)],
        spouts: vec![SpoutSummary {
            spout_id: comp("sentences"),
            executors: 1,
            tasks: 1,
            emitted: 100,
            transferred: 90,
            acked: 80,
            failed: 1,
            complete_latency: "8.000".into(),
            last_error: LastError::default(),
        }],
        bolts: vec![BoltSummary {
            bolt_id: comp("split"),
            executors: 2,
            tasks: 4,
            emitted: 700,
            transferred: 700,
            acked: 99,
            failed: 0,
            executed: 99,
            execute_latency: "0.048".into(),
            process_latency: "0.048".into(),
            capacity: "0.003".into(),
            last_error: LastError {
                last_error: "boom".into(),
                error_host: "h".into(),
                error_port: Some(6701),
                error_time: Some(1_700_000_000),
                error_lapsed_secs: Some(65),
            },
        }],
        workers: vec![WorkerSummary {
            supervisor_id: SupervisorId::new("sup-1").unwrap(),
            host: "h".into(),
            port: 6700,
            topology_id: id(),
            topology_name: TopologyName::new("wc").unwrap(),
            executors_total: 3,
            component_num_tasks: [(comp("split"), 2)].into_iter().collect(),
            uptime: "2m 47s".into(),
            uptime_seconds: 167,
            worker_log_link: "http://h:9100/the-log-viewer-link".into(),
            log_viewer: Some("h:9100".into()),
            log_viewer_scheme: cluster_state::znode::MetricsScheme::Http,
        }],
        configuration: [("topology.message.timeout.secs".to_owned(), serde_json::Value::from(30))]
            .into_iter()
            .collect(),
    }
}

const TOPOLOGY_PAGE_TAIL: &str = r#""msgTimeout":30,"window":":all-time","windowHint":"All time","topologyStats":[{"windowPretty":"10m 0s","window":"600","emitted":100,"transferred":90,"completeLatency":"8.000","acked":80,"failed":1},{"windowPretty":"All time","window":":all-time","emitted":100,"transferred":90,"completeLatency":"8.000","acked":80,"failed":1}],"spouts":[{"spoutId":"sentences","executors":1,"tasks":1,"emitted":100,"transferred":90,"acked":80,"failed":1,"completeLatency":"8.000","lastError":"","errorHost":"","errorPort":null,"errorTime":null,"errorLapsedSecs":null}],"bolts":[{"boltId":"split","executors":2,"tasks":4,"emitted":700,"transferred":700,"acked":99,"failed":0,"executed":99,"executeLatency":"0.048","processLatency":"0.048","capacity":"0.003","lastError":"boom","errorHost":"h","errorPort":6701,"errorTime":1700000000,"errorLapsedSecs":65}],"workers":[{"supervisorId":"sup-1","host":"h","port":6700,"topologyId":"wc-1-1700000000","topologyName":"wc","executorsTotal":3,"componentNumTasks":{"split":2},"uptime":"2m 47s","uptimeSeconds":167,"workerLogLink":"http://h:9100/the-log-viewer-link","logViewer":"h:9100"}],"configuration":{"topology.message.timeout.secs":30}}"#;

/// Every key of every object in `value`, at any depth.
fn keys(value: &serde_json::Value, out: &mut std::collections::BTreeSet<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                out.insert(k.clone());
                keys(v, out);
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| keys(v, out)),
        _ => {}
    }
}

/// `body` carries every field name Storm 2's `docs/STORM-UI-REST-API.md` documents in `storm`.
fn has_storm_fields(body: &impl Serialize, storm: &[&str]) {
    let mut found = std::collections::BTreeSet::new();
    keys(&serde_json::to_value(body).unwrap(), &mut found);
    let missing: Vec<&&str> = storm.iter().filter(|k| !found.contains(**k)).collect();
    assert!(missing.is_empty(), "Storm UI fields missing: {missing:?}");
}

/// `GET /api/v1/topology/:id`: the fields Storm 2 documents for `topologyStats`, `spouts`,
/// `bolts` and `workers` (resource and log-viewer fields aside: Squall has neither).
#[test]
fn the_topology_page_has_storm_2s_fields() {
    has_storm_fields(
        &topology_page(),
        &[
            "id",
            "name",
            "uptime",
            "uptimeSeconds",
            "status",
            "tasksTotal",
            "workersTotal",
            "executorsTotal",
            "msgTimeout",
            "windowHint",
            "window",
            "topologyStats",
            "windowPretty",
            "emitted",
            "transferred",
            "completeLatency",
            "acked",
            "failed",
            "workers",
            "supervisorId",
            "host",
            "port",
            "topologyId",
            "topologyName",
            "componentNumTasks",
            "spouts",
            "spoutId",
            "executors",
            "tasks",
            "lastError",
            "errorHost",
            "errorPort",
            "errorTime",
            "errorLapsedSecs",
            "bolts",
            "boltId",
            "capacity",
            "processLatency",
            "executeLatency",
            "executed",
            "configuration",
        ],
    );
    let windows: Vec<String> = topology_page().topology_stats.iter().map(|w| w.window.to_string()).collect();
    assert_eq!(windows, ["600", ":all-time"]);
    assert_eq!(StatsWindow::TEN_MINUTES.pretty(), "10m 0s");
    assert!(api::decode_response::<StatsWindow>(br#""7x""#).is_err());
}

fn executor(spout: bool) -> ExecutorSummary {
    ExecutorSummary {
        id: "[24-24]".into(),
        host: "h".into(),
        port: 6701,
        uptime: "43m 4s".into(),
        uptime_seconds: 2584,
        emitted: 5720,
        transferred: 5720,
        acked: 0,
        failed: 0,
        complete_latency: spout.then(|| "0.000".into()),
        executed: (!spout).then_some(10),
        execute_latency: (!spout).then(|| "0.050".into()),
        process_latency: (!spout).then(|| "0.040".into()),
        capacity: (!spout).then(|| "0.001".into()),
    }
}

fn component(spout: bool) -> ComponentPage {
    ComponentPage {
        id: comp(if spout { "sentences" } else { "split" }),
        name: TopologyName::new("wc").unwrap(),
        topology_id: id(),
        topology_status: "ACTIVE".into(),
        user: "alice".into(),
        component_type: (if spout { "spout" } else { "bolt" }).into(),
        executors: 1,
        tasks: 1,
        window: StatsWindow::TEN_MINUTES,
        window_hint: "10m 0s".into(),
        component_errors: vec![TopologyError {
            component: comp("split"),
            error: "boom".into(),
            error_host: "h".into(),
            error_port: 6701,
            error_time: 1_406_006_074_000,
            error_lapsed_secs: 16,
        }],
        spout_summary: spout.then(|| vec![window_stats(StatsWindow::AllTime)]),
        bolt_stats: (!spout).then(|| {
            vec![BoltWindowStats {
                window_pretty: "All time".into(),
                window: StatsWindow::AllTime,
                emitted: 1,
                transferred: 1,
                executed: 2,
                execute_latency: "0.050".into(),
                process_latency: "0.040".into(),
                capacity: "0.001".into(),
                acked: 2,
                failed: 0,
            }]
        }),
        executor_stats: vec![executor(spout)],
    }
}

/// `GET /api/v1/topology/:id/component/:component`: golden JSON of a spout's page and Storm 2's
/// documented fields of both kinds.
#[test]
fn the_component_page_has_storm_2s_fields() {
    golden(
        &component(true),
        r#"{"id":"sentences","name":"wc","topologyId":"wc-1-1700000000","topologyStatus":"ACTIVE","user":"alice","componentType":"spout","executors":1,"tasks":1,"window":"600","windowHint":"10m 0s","componentErrors":[{"component":"split","error":"boom","errorHost":"h","errorPort":6701,"errorTime":1406006074000,"errorLapsedSecs":16}],"spoutSummary":[{"windowPretty":"All time","window":":all-time","emitted":100,"transferred":90,"completeLatency":"8.000","acked":80,"failed":1}],"executorStats":[{"id":"[24-24]","host":"h","port":6701,"uptime":"43m 4s","uptimeSeconds":2584,"emitted":5720,"transferred":5720,"acked":0,"failed":0,"completeLatency":"0.000"}]}"#,
    );
    let common = [
        "user",
        "id",
        "name",
        "executors",
        "tasks",
        "topologyId",
        "topologyStatus",
        "window",
        "componentType",
        "windowHint",
        "componentErrors",
        "errorTime",
        "errorHost",
        "errorPort",
        "error",
        "errorLapsedSecs",
        "executorStats",
        "emitted",
        "transferred",
        "acked",
        "failed",
        "uptime",
        "uptimeSeconds",
        "host",
        "port",
    ];
    has_storm_fields(
        &component(true),
        &[&common[..], &["spoutSummary", "windowPretty", "completeLatency"]].concat(),
    );
    has_storm_fields(
        &component(false),
        &[&common[..], &["boltStats", "windowPretty", "processLatency"]].concat(),
    );
    let bolt = serde_json::to_string(&component(false)).unwrap();
    assert!(!bolt.contains("spoutSummary") && !bolt.contains("completeLatency"), "{bolt}");
    golden(&component(false), &bolt);
}

/// `GET /api/v1/topology/:id/visualization`: Storm UI's `:`-prefixed keys.
#[test]
fn the_visualization_keeps_storm_uis_keys() {
    golden(
        &Visualization(
            [(
                comp("split"),
                VisualizationNode {
                    kind: "bolt".into(),
                    capacity: 0.25,
                    latency: Some(1.5),
                    transferred: 700,
                    stats: vec![VisualizationStat {
                        host: "h".into(),
                        port: 6700,
                        uptime_secs: 167,
                        transferred: [(
                            "600".to_owned(),
                            [("sdefault".to_owned(), 700)].into_iter().collect(),
                        )]
                        .into_iter()
                        .collect(),
                    }],
                    link: "#/topology/wc-1-1700000000/component/split".into(),
                    inputs: vec![VisualizationInput {
                        component: comp("sentences"),
                        stream: "default".into(),
                        sani_stream: VisualizationInput::sanitize("default"),
                        grouping: "shuffle".into(),
                    }],
                },
            )]
            .into_iter()
            .collect(),
        ),
        r##"{"split":{":type":"bolt",":capacity":0.25,":latency":1.5,":transferred":700,":stats":[{":host":"h",":port":6700,":uptime_secs":167,":transferred":{"600":{"sdefault":700}}}],":link":"#/topology/wc-1-1700000000/component/split",":inputs":[{":component":"sentences",":stream":"default",":sani-stream":"sdefault",":grouping":"shuffle"}]}}"##,
    );
    assert_eq!(VisualizationInput::sanitize("__ack-init"), "s__ack_init");
}

/// `GET /api/v1/cluster/configuration` is a flat object of Storm's keys.
#[test]
fn the_cluster_configuration_is_a_flat_object() {
    golden(
        &ClusterConfiguration(
            [
                ("nimbus.monitor.freq.secs".to_owned(), serde_json::Value::from(10)),
                ("nimbus.seeds".to_owned(), serde_json::Value::from(vec!["n1:8080"])),
            ]
            .into_iter()
            .collect(),
        ),
        r#"{"nimbus.monitor.freq.secs":10,"nimbus.seeds":["n1:8080"]}"#,
    );
}

/// The consumer-group pages (Squall's; ConsumerOffsetChecker's columns, Burrow's statuses).
#[test]
fn consumer_group_bodies_keep_their_keys() {
    let summary = ConsumerGroupSummary {
        group: GroupId::new("clicks").unwrap(),
        members: 1,
        status: "WARN".into(),
        worst_status: "STALL".into(),
        partitions: 1,
        total_lag: 5,
    };
    golden(
        &ConsumerGroups { groups: vec![summary.clone()], evaluated_at_secs: 1_700_000_000 },
        r#"{"groups":[{"group":"clicks","members":1,"status":"WARN","worstStatus":"STALL","partitions":1,"totalLag":5}],"evaluatedAtSecs":1700000000}"#,
    );
    golden(
        &ConsumerGroupDetail {
            summary,
            partitions_detail: vec![ConsumerPartition {
                topic: Topic::new("clicks").unwrap(),
                partition: 0,
                committed_offset: Some(95),
                log_end_offset: Some(100),
                lag: Some(5),
                owner: Some("clicks_h-1-a1b2c3d4-0".into()),
                status: "STALL".into(),
            }],
        },
        r#"{"group":"clicks","members":1,"status":"WARN","worstStatus":"STALL","partitions":1,"totalLag":5,"partitionsDetail":[{"topic":"clicks","partition":0,"committedOffset":95,"logEndOffset":100,"lag":5,"owner":"clicks_h-1-a1b2c3d4-0","status":"STALL"}]}"#,
    );
    golden(
        &ResetPlanRequest {
            topic: Some(Topic::new("clicks").unwrap()),
            to: ResetTarget::ShiftBy,
            value: Some(-10),
        },
        r#"{"topic":"clicks","to":"shiftBy","value":-10}"#,
    );
    golden(
        &ResetPlan {
            group: GroupId::new("clicks").unwrap(),
            dry_run: true,
            members: 0,
            partitions: vec![ResetPlanRow {
                topic: Topic::new("clicks").unwrap(),
                partition: 0,
                current_offset: None,
                target_offset: 5,
                warning: None,
            }],
        },
        r#"{"group":"clicks","dryRun":true,"members":0,"partitions":[{"topic":"clicks","partition":0,"currentOffset":null,"targetOffset":5}]}"#,
    );
    for (body, says) in [
        (r#"{"to":"offset"}"#, "field \"value\": a value is required"),
        (r#"{"to":"earliest","value":3}"#, "field \"value\": a value is taken only"),
        (r#"{"to":"offset","value":-1}"#, "never negative"),
    ] {
        let request: ResetPlanRequest = api::decode_request(body.as_bytes()).unwrap();
        let err = request.validate().unwrap_err().to_string();
        assert!(err.contains(says), "{body}: {err}");
    }
    for (body, says) in [
        (r#"{"to":"yesterday"}"#, "field \"to\""),
        (r#"{"to":"latest","execute":true}"#, "unknown field `execute`"),
        (r#"{"to":"latest","topic":"a/b"}"#, "field \"topic\""),
    ] {
        let err = api::decode_request::<ResetPlanRequest>(body.as_bytes()).unwrap_err().to_string();
        assert!(err.contains(says), "{body}: {err}");
    }
}

/// Storm UI's `logconfig` body and answer (`namedLoggerLevels`, `target_level`, `timeout`),
/// and the supervisors' log viewer's answers.
#[test]
fn log_bodies_keep_their_keys() {
    use cluster_state::api::{
        LogConfigRequest, LogConfigView, LoggerLevelRequest, LoggerLevelView, WorkerLogChunk, WorkerLogFile,
        WorkerLogFiles,
    };
    use cluster_state::worker_logs::LogFile;
    use cluster_state::znode::LogLevel;
    let logger = "kafka_spout".parse().unwrap();
    golden(
        &LogConfigRequest {
            named_logger_levels: [(
                logger,
                LoggerLevelRequest { target_level: LogLevel::Debug, timeout: 30 },
            )]
            .into_iter()
            .collect(),
        },
        r#"{"namedLoggerLevels":{"kafka_spout":{"target_level":"DEBUG","timeout":30}}}"#,
    );
    // Storm's clients send upper case; anything else is refused with the field named.
    let lower =
        api::decode_request::<LogConfigRequest>(br#"{"namedLoggerLevels":{"ROOT":{"target_level":"LOUD"}}}"#)
            .unwrap_err()
            .to_string();
    assert!(lower.contains("target_level"), "{lower}");
    let bad =
        api::decode_request::<LogConfigRequest>(br#"{"namedLoggerLevels":{"a=b":{"target_level":"DEBUG"}}}"#)
            .unwrap_err()
            .to_string();
    assert!(bad.contains("module path"), "{bad}");
    golden(
        &LogConfigView {
            named_logger_levels: [(
                "ROOT".parse().unwrap(),
                LoggerLevelView { target_level: LogLevel::Warn, timeout_epoch: Some(1_700_000_030_000) },
            )]
            .into_iter()
            .collect(),
        },
        r#"{"namedLoggerLevels":{"ROOT":{"target_level":"WARN","timeout_epoch":1700000030000}}}"#,
    );
    golden(
        &WorkerLogFiles {
            topology_id: id(),
            port: 6700,
            files: vec![
                WorkerLogFile { file: LogFile::LOG, size: 12 },
                WorkerLogFile { file: LogFile::Out(1), size: 3 },
            ],
        },
        r#"{"topologyId":"wc-1-1700000000","port":6700,"files":[{"file":"worker.log","size":12},{"file":"worker.log.out.1","size":3}]}"#,
    );
    golden(
        &WorkerLogChunk {
            topology_id: id(),
            port: 6700,
            file: LogFile::Log(2),
            file_size: 100,
            start: 90,
            length: 10,
            data: "last line\n".into(),
        },
        r#"{"topologyId":"wc-1-1700000000","port":6700,"file":"worker.log.2","fileSize":100,"start":90,"length":10,"data":"last line\n"}"#,
    );
}
