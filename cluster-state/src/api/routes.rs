//! Every resource of the API with its method: built into a path by clients
//! ([`Route::path`]), read back by nimbus ([`Route::parse`]), under [`API_PREFIX`].
//!
//! ```text
//! GET  /api/v1/cluster/summary                    ClusterSummary
//! GET  /api/v1/cluster/configuration              ClusterConfiguration (secrets redacted)
//! GET  /api/v1/supervisor/summary                 SupervisorSummaries
//! GET  /api/v1/nimbus/summary                     NimbusSummaries (every nimbus, who leads)
//! GET  /api/v1/topology/summary                   TopologySummaries
//! GET  /api/v1/topology/:id[?window=600]         TopologyDetail (Storm UI's topology page)
//! GET  /api/v1/topology/:id/errors                TopologyErrors, newest first
//! GET  /api/v1/topology/:id/component/:component  ComponentPage [?window=600]
//! GET  /api/v1/topology/:id/visualization         Visualization (the component graph)
//! GET  /api/v1/consumergroups                     ConsumerGroups (lag evaluator's verdicts)
//! GET  /api/v1/consumergroup/:group               ConsumerGroupDetail
//! POST /api/v1/consumergroup/:group/reset-plan    ResetPlanRequest -> ResetPlan (dry run)
//! GET  /api/v1/topology/:id/code/:file            the code file; sha256 in CHECKSUM_HEADER
//! GET  /api/v1/prometheus/targets                 [TargetGroup] (Prometheus http_sd)
//! POST /api/v1/topology/submit                    SubmitTopology -> 201 Submitted
//! POST /api/v1/supervisor/heartbeat              SupervisorHeartbeat -> HeartbeatAccepted
//! POST /api/v1/topology/:id/activate | deactivate -> TopologyOperation
//! POST /api/v1/topology/:id/kill/:wait-time       -> TopologyOperation
//! POST /api/v1/topology/:id/rebalance/:wait-time  RebalanceRequest -> TopologyOperation
//! POST /api/v1/topology/:id/logconfig             LogConfigRequest -> LogConfigView
//! POST /api/v1/uploads                            BeginUpload -> 201 UploadBegun
//! POST /api/v1/uploads/:upload-id/chunks/:offset  raw bytes -> ChunkReceived
//! POST /api/v1/uploads/:upload-id/finish          FinishUpload -> UploadFinished
//! ```
//!
//! A supervisor's log viewer ([`LogRoute`], served on the supervisor's HTTP port beside its
//! `/metrics`; every call needs the cluster's token when one is set):
//!
//! ```text
//! GET  /api/v1/logs/:topology-id/:port                     WorkerLogFiles (the worker's files)
//! GET  /api/v1/logs/:topology-id/:port/:file[?lines=N]     WorkerLogChunk (the last N lines)
//! GET  /api/v1/logs/:topology-id/:port/:file?start=S&length=L  WorkerLogChunk (a byte range)
//! GET  /api/v1/logs/:topology-id/:port/:file/download      the whole file, raw bytes
//! ```

use hyper::Method;

use std::collections::BTreeMap;

use crate::api::{API_PREFIX, StatsWindow, UploadId};
use crate::code::CodeFile;
use crate::ids::{ComponentId, GroupId, IdError, TopologyId};
use crate::worker_logs::{LogFile, UnknownLogFile};

/// One resource of the API, its path segments typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    ClusterSummary,
    ClusterConfiguration,
    SupervisorSummary,
    NimbusSummary,
    TopologySummary,
    PrometheusTargets,
    Topology(TopologyId),
    TopologyErrors(TopologyId),
    Component(TopologyId, ComponentId),
    Visualization(TopologyId),
    ConsumerGroups,
    ConsumerGroup(GroupId),
    ResetPlan(GroupId),
    Code(TopologyId, CodeFile),
    Submit,
    SupervisorHeartbeat,
    Activate(TopologyId),
    Deactivate(TopologyId),
    Kill {
        id: TopologyId,
        wait_secs: u64,
    },
    Rebalance {
        id: TopologyId,
        wait_secs: u64,
    },
    /// Storm's `set_log_level`: runtime log levels of a topology's workers.
    LogConfig(TopologyId),
    BeginUpload,
    Chunk {
        upload: UploadId,
        offset: u64,
    },
    FinishUpload(UploadId),
}

/// A path that names no route, or names one with a segment that is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("no such resource: {path}")]
    NoSuchResource { path: String },
    /// The path has a route's shape (so `method` is the one it accepts) but a bad segment.
    #[error("{segment}")]
    Invalid { method: Method, segment: InvalidSegment },
}

/// Which segment of a route's path is wrong, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidSegment {
    #[error("topology id: {0}")]
    TopologyId(IdError),
    #[error("{0}")]
    UploadId(IdError),
    /// Not a code file: a name the server does not have, so nimbus answers 404.
    #[error("unknown code file {0:?}: must be one of \"topology.yaml\", \"worker\"")]
    CodeFile(String),
    #[error("wait-time {0:?}: a whole number of seconds is required")]
    WaitTime(String),
    #[error("offset {0:?}: a non-negative integer is required")]
    Offset(String),
    #[error("component id: {0}")]
    ComponentId(IdError),
    #[error("consumer group: {0}")]
    GroupId(IdError),
    /// A `window` query parameter nimbus keeps no stats for.
    #[error("{0}")]
    Window(String),
    #[error("port {0:?}: a number from 1 to 65535 is required")]
    Port(String),
    /// Not one of a worker's log files (the log viewer answers 404).
    #[error("{0}")]
    LogFile(UnknownLogFile),
    /// A log read's query (`lines`, `start`, `length`) that is malformed or over its bound.
    #[error("{0}")]
    LogRead(String),
}

/// Digits only: `u64::from_str` would also take `+3`.
fn whole_number(value: &str) -> Option<u64> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

fn topology(value: &str) -> Result<TopologyId, InvalidSegment> {
    value.parse().map_err(InvalidSegment::TopologyId)
}

fn upload(value: &str) -> Result<UploadId, InvalidSegment> {
    value.parse().map_err(InvalidSegment::UploadId)
}

fn consumer_group(value: &str) -> Result<GroupId, InvalidSegment> {
    GroupId::new(value).map_err(InvalidSegment::GroupId)
}

fn wait_time(value: &str) -> Result<u64, InvalidSegment> {
    whole_number(value).ok_or_else(|| InvalidSegment::WaitTime(value.chars().take(40).collect()))
}

impl Route {
    /// The method the route accepts.
    pub fn method(&self) -> Method {
        use Route::*;
        match self {
            ClusterSummary | ClusterConfiguration | SupervisorSummary | NimbusSummary | TopologySummary
            | PrometheusTargets | Topology(_) | TopologyErrors(_) | Component(..) | Visualization(_)
            | ConsumerGroups | ConsumerGroup(_) | Code(..) => Method::GET,
            Submit
            | ResetPlan(_)
            | SupervisorHeartbeat
            | Activate(_)
            | Deactivate(_)
            | Kill { .. }
            | Rebalance { .. }
            | LogConfig(_)
            | BeginUpload
            | Chunk { .. }
            | FinishUpload(_) => Method::POST,
        }
    }

    /// The request path (no query, nothing to escape: every segment is a validated id).
    pub fn path(&self) -> String {
        let rest = match self {
            Route::ClusterSummary => "cluster/summary".to_owned(),
            Route::ClusterConfiguration => "cluster/configuration".to_owned(),
            Route::SupervisorSummary => "supervisor/summary".to_owned(),
            Route::NimbusSummary => "nimbus/summary".to_owned(),
            Route::TopologySummary => "topology/summary".to_owned(),
            Route::PrometheusTargets => "prometheus/targets".to_owned(),
            Route::Topology(id) => format!("topology/{id}"),
            Route::TopologyErrors(id) => format!("topology/{id}/errors"),
            Route::Component(id, component) => format!("topology/{id}/component/{component}"),
            Route::Visualization(id) => format!("topology/{id}/visualization"),
            Route::ConsumerGroups => "consumergroups".to_owned(),
            Route::ConsumerGroup(group) => format!("consumergroup/{group}"),
            Route::ResetPlan(group) => format!("consumergroup/{group}/reset-plan"),
            Route::Code(id, file) => format!("topology/{id}/code/{}", file.file_name()),
            Route::Submit => "topology/submit".to_owned(),
            Route::SupervisorHeartbeat => "supervisor/heartbeat".to_owned(),
            Route::Activate(id) => format!("topology/{id}/activate"),
            Route::Deactivate(id) => format!("topology/{id}/deactivate"),
            Route::Kill { id, wait_secs } => format!("topology/{id}/kill/{wait_secs}"),
            Route::Rebalance { id, wait_secs } => format!("topology/{id}/rebalance/{wait_secs}"),
            Route::LogConfig(id) => format!("topology/{id}/logconfig"),
            Route::BeginUpload => "uploads".to_owned(),
            Route::Chunk { upload, offset } => format!("uploads/{upload}/chunks/{offset}"),
            Route::FinishUpload(upload) => format!("uploads/{upload}/finish"),
        };
        format!("{API_PREFIX}/{rest}")
    }

    /// Reads a request path. The route's shape is matched first, so a bad segment is reported
    /// with the method the route accepts (nimbus answers a wrong method before a bad id).
    pub fn parse(path: &str) -> Result<Route, RouteError> {
        let not_found = || RouteError::NoSuchResource { path: path.chars().take(200).collect() };
        let rest = path.strip_prefix(API_PREFIX).and_then(|p| p.strip_prefix('/')).ok_or_else(not_found)?;
        let segments: Vec<&str> = rest.split('/').collect();
        let (get, post) = (Method::GET, Method::POST);
        let (method, route) = match segments.as_slice() {
            ["cluster", "summary"] => (get, Ok(Route::ClusterSummary)),
            ["cluster", "configuration"] => (get, Ok(Route::ClusterConfiguration)),
            ["consumergroups"] => (get, Ok(Route::ConsumerGroups)),
            ["consumergroup", group] => (get, consumer_group(group).map(Route::ConsumerGroup)),
            ["consumergroup", group, "reset-plan"] => (post, consumer_group(group).map(Route::ResetPlan)),
            ["supervisor", "summary"] => (get, Ok(Route::SupervisorSummary)),
            ["nimbus", "summary"] => (get, Ok(Route::NimbusSummary)),
            ["topology", "summary"] => (get, Ok(Route::TopologySummary)),
            ["prometheus", "targets"] => (get, Ok(Route::PrometheusTargets)),
            // Not a topology id (those are `name-counter-secs`), so no id is shadowed.
            ["topology", "submit"] => (post, Ok(Route::Submit)),
            ["supervisor", "heartbeat"] => (post, Ok(Route::SupervisorHeartbeat)),
            ["topology", id] => (get, topology(id).map(Route::Topology)),
            ["topology", id, "errors"] => (get, topology(id).map(Route::TopologyErrors)),
            ["topology", id, "visualization"] => (get, topology(id).map(Route::Visualization)),
            ["topology", id, "component", component] => (
                get,
                topology(id).and_then(|id| {
                    let component = ComponentId::new(*component).map_err(InvalidSegment::ComponentId)?;
                    Ok(Route::Component(id, component))
                }),
            ),
            ["topology", id, "code", file] => (
                get,
                topology(id).and_then(|id| {
                    let file = file
                        .parse()
                        .map_err(|_| InvalidSegment::CodeFile(file.chars().take(80).collect()))?;
                    Ok(Route::Code(id, file))
                }),
            ),
            ["topology", id, "activate"] => (post, topology(id).map(Route::Activate)),
            ["topology", id, "deactivate"] => (post, topology(id).map(Route::Deactivate)),
            ["topology", id, "logconfig"] => (post, topology(id).map(Route::LogConfig)),
            ["topology", id, "kill", wait] => {
                (post, topology(id).and_then(|id| Ok(Route::Kill { id, wait_secs: wait_time(wait)? })))
            }
            ["topology", id, "rebalance", wait] => {
                (post, topology(id).and_then(|id| Ok(Route::Rebalance { id, wait_secs: wait_time(wait)? })))
            }
            ["uploads"] => (post, Ok(Route::BeginUpload)),
            ["uploads", id, "chunks", offset] => (
                post,
                upload(id).and_then(|upload| {
                    let offset = whole_number(offset)
                        .ok_or_else(|| InvalidSegment::Offset(offset.chars().take(40).collect()))?;
                    Ok(Route::Chunk { upload, offset })
                }),
            ),
            ["uploads", id, "finish"] => (post, upload(id).map(Route::FinishUpload)),
            _ => return Err(not_found()),
        };
        route.map_err(|segment| RouteError::Invalid { method, segment })
    }
}

/// The last lines a log read returns unless told (`?lines=N`).
pub const DEFAULT_TAIL_LINES: u32 = 100;
/// The most lines one read may ask for.
pub const MAX_TAIL_LINES: u32 = 10_000;
/// The most bytes one read returns: a byte range may not ask for more, and a tail returns at most
/// the lines that fit in it.
pub const MAX_READ_BYTES: u64 = 1024 * 1024;

/// What part of a log file a read returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogRead {
    /// The last `lines` lines (1 to [`MAX_TAIL_LINES`]), within the last [`MAX_READ_BYTES`].
    Tail { lines: u32 },
    /// `length` bytes (1 to [`MAX_READ_BYTES`]) from byte `start`; fewer at the file's end.
    Range { start: u64, length: u64 },
}

impl Default for LogRead {
    fn default() -> Self {
        LogRead::Tail { lines: DEFAULT_TAIL_LINES }
    }
}

impl LogRead {
    /// Checks the bounds.
    pub fn validate(self) -> Result<LogRead, InvalidSegment> {
        match self {
            LogRead::Tail { lines } if lines == 0 || lines > MAX_TAIL_LINES => {
                Err(InvalidSegment::LogRead(format!("lines {lines}: from 1 to {MAX_TAIL_LINES}")))
            }
            LogRead::Range { length, .. } if length == 0 || length > MAX_READ_BYTES => {
                Err(InvalidSegment::LogRead(format!("length {length}: from 1 to {MAX_READ_BYTES} bytes")))
            }
            read => Ok(read),
        }
    }

    /// Reads a query string: `lines=N`, or `start=S&length=L` (both), or nothing (the default
    /// tail). Other parameters are refused, so a typo is not silently a default read.
    pub fn from_query(query: Option<&str>) -> Result<LogRead, InvalidSegment> {
        let (mut lines, mut start, mut length) = (None, None, None);
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let slot = match key {
                "lines" => &mut lines,
                "start" => &mut start,
                "length" => &mut length,
                _ => {
                    return Err(InvalidSegment::LogRead(format!(
                        "unknown parameter {:?}: lines, or start and length",
                        key.chars().take(40).collect::<String>()
                    )));
                }
            };
            let number = whole_number(value).ok_or_else(|| {
                InvalidSegment::LogRead(format!(
                    "{key} {:?}: a non-negative integer is required",
                    value.chars().take(40).collect::<String>()
                ))
            })?;
            *slot = Some(number);
        }
        let read = match (lines, start, length) {
            (None, None, None) => LogRead::default(),
            (Some(lines), None, None) => LogRead::Tail { lines: u32::try_from(lines).unwrap_or(u32::MAX) },
            (None, Some(start), Some(length)) => LogRead::Range { start, length },
            _ => {
                return Err(InvalidSegment::LogRead("either lines, or start and length together".to_owned()));
            }
        };
        read.validate()
    }

    /// The query string that [`LogRead::from_query`] reads back (no `?`).
    pub fn query(self) -> String {
        match self {
            LogRead::Tail { lines } => format!("lines={lines}"),
            LogRead::Range { start, length } => format!("start={start}&length={length}"),
        }
    }
}

/// A resource of a supervisor's log viewer (Storm's logviewer): a worker is named by topology
/// id and port, a file by [`LogFile`]; no client ever names a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogRoute {
    /// The worker's log files with their sizes.
    Files { topology: TopologyId, port: u16 },
    /// Part of one file.
    Read { topology: TopologyId, port: u16, file: LogFile, read: LogRead },
    /// One whole file.
    Download { topology: TopologyId, port: u16, file: LogFile },
}

fn port(value: &str) -> Result<u16, InvalidSegment> {
    whole_number(value)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| InvalidSegment::Port(value.chars().take(40).collect()))
}

fn log_file(value: &str) -> Result<LogFile, InvalidSegment> {
    value.parse().map_err(InvalidSegment::LogFile)
}

impl LogRoute {
    /// Every log route is a GET.
    pub fn method(&self) -> Method {
        Method::GET
    }

    /// The request path with its query (a read's `lines` or `start` and `length`).
    pub fn path_and_query(&self) -> String {
        match self {
            LogRoute::Files { topology, port } => format!("{API_PREFIX}/logs/{topology}/{port}"),
            LogRoute::Read { topology, port, file, read } => {
                format!("{API_PREFIX}/logs/{topology}/{port}/{file}?{}", read.query())
            }
            LogRoute::Download { topology, port, file } => {
                format!("{API_PREFIX}/logs/{topology}/{port}/{file}/download")
            }
        }
    }

    /// Reads a request's path and query. `Ok(None)`: not a log viewer path at all.
    pub fn parse(path: &str, query: Option<&str>) -> Result<Option<LogRoute>, InvalidSegment> {
        let Some(rest) = path.strip_prefix(API_PREFIX).and_then(|p| p.strip_prefix("/logs/")) else {
            return Ok(None);
        };
        let segments: Vec<&str> = rest.split('/').collect();
        let route = match segments.as_slice() {
            [id, p] => LogRoute::Files { topology: topology(id)?, port: port(p)? },
            [id, p, file] => LogRoute::Read {
                topology: topology(id)?,
                port: port(p)?,
                file: log_file(file)?,
                read: LogRead::from_query(query)?,
            },
            [id, p, file, "download"] => {
                LogRoute::Download { topology: topology(id)?, port: port(p)?, file: log_file(file)? }
            }
            _ => return Ok(None),
        };
        Ok(Some(route))
    }
}

/// The `window` of a query string (`window=600`, `window=:all-time`, `:` maybe as `%3A`);
/// `:all-time` when absent. Other parameters (Storm's `sys`, `callback`) are ignored.
pub fn window_from_query(query: Option<&str>) -> Result<StatsWindow, InvalidSegment> {
    let Some(query) = query else { return Ok(StatsWindow::AllTime) };
    for pair in query.split('&') {
        if let Some(value) = pair.strip_prefix("window=") {
            let value = value.replace("%3A", ":").replace("%3a", ":");
            return value.parse().map_err(InvalidSegment::Window);
        }
    }
    Ok(StatsWindow::AllTime)
}

/// Path templates of the routes the web UI calls, by name, with `{id}`, `{component}`,
/// `{group}` and `{wait}` where the UI puts (URL-encoded) values. Built from [`Route::path`],
/// so the UI's scripts never spell a path; nimbus embeds them in the UI's page.
pub fn ui_templates() -> BTreeMap<&'static str, String> {
    const ID: &str = "uiplaceholderid-1-1";
    const COMPONENT: &str = "uiplaceholdercomponent";
    const GROUP: &str = "uiplaceholdergroup";
    const WAIT: u64 = 4_242_424_242;
    let (Ok(id), Ok(component), Ok(group)) =
        (ID.parse::<TopologyId>(), ComponentId::new(COMPONENT), GroupId::new(GROUP))
    else {
        // The placeholders are valid ids (a unit test holds them to it).
        return BTreeMap::new();
    };
    let routes = [
        ("clusterSummary", Route::ClusterSummary),
        ("clusterConfiguration", Route::ClusterConfiguration),
        ("supervisorSummary", Route::SupervisorSummary),
        ("nimbusSummary", Route::NimbusSummary),
        ("topologySummary", Route::TopologySummary),
        ("topology", Route::Topology(id.clone())),
        ("topologyErrors", Route::TopologyErrors(id.clone())),
        ("component", Route::Component(id.clone(), component)),
        ("visualization", Route::Visualization(id.clone())),
        ("activate", Route::Activate(id.clone())),
        ("deactivate", Route::Deactivate(id.clone())),
        ("kill", Route::Kill { id: id.clone(), wait_secs: WAIT }),
        ("rebalance", Route::Rebalance { id, wait_secs: WAIT }),
        ("consumerGroups", Route::ConsumerGroups),
        ("consumerGroup", Route::ConsumerGroup(group.clone())),
        ("resetPlan", Route::ResetPlan(group)),
    ];
    routes
        .into_iter()
        .map(|(name, route)| {
            let path = route
                .path()
                .replace(ID, "{id}")
                .replace(COMPONENT, "{component}")
                .replace(GROUP, "{group}")
                .replace(&WAIT.to_string(), "{wait}");
            (name, path)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn every_route() -> Vec<Route> {
        let id: TopologyId = "wc-1-1700000000".parse().unwrap();
        let upload: UploadId = "123e4567-e89b-42d3-a456-426614174000".parse().unwrap();
        vec![
            Route::ClusterSummary,
            Route::SupervisorSummary,
            Route::NimbusSummary,
            Route::TopologySummary,
            Route::PrometheusTargets,
            Route::Topology(id.clone()),
            Route::TopologyErrors(id.clone()),
            Route::ClusterConfiguration,
            Route::Component(id.clone(), ComponentId::new("split").unwrap()),
            Route::Visualization(id.clone()),
            Route::ConsumerGroups,
            Route::ConsumerGroup(GroupId::new("clicks").unwrap()),
            Route::ResetPlan(GroupId::new("clicks").unwrap()),
            Route::Code(id.clone(), CodeFile::Topology),
            Route::Code(id.clone(), CodeFile::WorkerBinary),
            Route::Submit,
            Route::SupervisorHeartbeat,
            Route::Activate(id.clone()),
            Route::Deactivate(id.clone()),
            Route::Kill { id: id.clone(), wait_secs: 0 },
            Route::Rebalance { id: id.clone(), wait_secs: u64::MAX },
            Route::LogConfig(id),
            Route::BeginUpload,
            Route::Chunk { upload, offset: 8_388_608 },
            Route::FinishUpload(upload),
        ]
    }

    #[test]
    fn every_route_round_trips_through_its_path() {
        for route in every_route() {
            assert_eq!(Route::parse(&route.path()), Ok(route.clone()), "{}", route.path());
        }
    }

    #[test]
    fn paths_are_storm_uis() {
        let paths: Vec<String> =
            every_route().iter().map(|r| format!("{} {}", r.method(), r.path())).collect();
        assert_eq!(
            paths,
            [
                "GET /api/v1/cluster/summary",
                "GET /api/v1/supervisor/summary",
                "GET /api/v1/nimbus/summary",
                "GET /api/v1/topology/summary",
                "GET /api/v1/prometheus/targets",
                "GET /api/v1/topology/wc-1-1700000000",
                "GET /api/v1/topology/wc-1-1700000000/errors",
                "GET /api/v1/cluster/configuration",
                "GET /api/v1/topology/wc-1-1700000000/component/split",
                "GET /api/v1/topology/wc-1-1700000000/visualization",
                "GET /api/v1/consumergroups",
                "GET /api/v1/consumergroup/clicks",
                "POST /api/v1/consumergroup/clicks/reset-plan",
                "GET /api/v1/topology/wc-1-1700000000/code/topology.yaml",
                "GET /api/v1/topology/wc-1-1700000000/code/worker",
                "POST /api/v1/topology/submit",
                "POST /api/v1/supervisor/heartbeat",
                "POST /api/v1/topology/wc-1-1700000000/activate",
                "POST /api/v1/topology/wc-1-1700000000/deactivate",
                "POST /api/v1/topology/wc-1-1700000000/kill/0",
                "POST /api/v1/topology/wc-1-1700000000/rebalance/18446744073709551615",
                "POST /api/v1/topology/wc-1-1700000000/logconfig",
                "POST /api/v1/uploads",
                "POST /api/v1/uploads/123e4567-e89b-42d3-a456-426614174000/chunks/8388608",
                "POST /api/v1/uploads/123e4567-e89b-42d3-a456-426614174000/finish",
            ]
        );
    }

    #[test]
    fn bad_paths_say_what_is_wrong_with_the_method_of_their_shape() {
        for path in [
            "/api/v1/topology/wc-1-1/kill",
            "/api/v2/cluster/summary",
            "/api/v1/cluster/summary/",
            "/api/v1/uploads/../../x/chunks/0",
            "/metrics",
        ] {
            assert!(matches!(Route::parse(path), Err(RouteError::NoSuchResource { .. })), "{path}");
        }
        let invalid = |path: &str| match Route::parse(path) {
            Err(RouteError::Invalid { method, segment }) => (method, segment.to_string()),
            other => panic!("{path}: {other:?}"),
        };
        for (path, method, says) in [
            ("/api/v1/topology/..", Method::GET, "topology id"),
            ("/api/v1/topology/%2e%2e/code/worker", Method::GET, "topology id"),
            ("/api/v1/topology/wc-1-1/code/worker.sha256", Method::GET, "unknown code file"),
            ("/api/v1/topology/wc-1-1/kill/+3", Method::POST, "wait-time"),
            ("/api/v1/topology/wc-1-1/rebalance/99999999999999999999999", Method::POST, "wait-time"),
            ("/api/v1/uploads/nope/finish", Method::POST, "invalid upload id"),
            ("/api/v1/uploads/123e4567e89b42d3a456426614174000/chunks/0", Method::POST, "invalid upload id"),
            ("/api/v1/uploads/123e4567-e89b-42d3-a456-426614174000/chunks/x", Method::POST, "offset"),
            ("/api/v1/topology/wc-1-1/component/", Method::GET, "component id"),
            ("/api/v1/topology/wc-1-1/component/..", Method::GET, "component id"),
            ("/api/v1/consumergroup/../reset-plan", Method::POST, "consumer group"),
        ] {
            let (m, message) = invalid(path);
            assert_eq!(m, method, "{path}");
            assert!(message.contains(says), "{path}: {message}");
        }
    }

    #[test]
    fn log_routes_round_trip_and_name_what_is_wrong() {
        let topology: TopologyId = "wc-1-1700000000".parse().unwrap();
        let routes = [
            LogRoute::Files { topology: topology.clone(), port: 6700 },
            LogRoute::Read {
                topology: topology.clone(),
                port: 6700,
                file: LogFile::LOG,
                read: LogRead::default(),
            },
            LogRoute::Read {
                topology: topology.clone(),
                port: 1,
                file: LogFile::Log(3),
                read: LogRead::Range { start: 0, length: MAX_READ_BYTES },
            },
            LogRoute::Download { topology: topology.clone(), port: 65535, file: LogFile::Out(2) },
        ];
        for route in routes {
            let full = route.path_and_query();
            let (path, query) = full.split_once('?').map_or((full.as_str(), None), |(p, q)| (p, Some(q)));
            assert_eq!(LogRoute::parse(path, query), Ok(Some(route.clone())), "{full}");
        }
        assert_eq!(
            LogRoute::Download { topology: topology.clone(), port: 6700, file: LogFile::OUT }
                .path_and_query(),
            "/api/v1/logs/wc-1-1700000000/6700/worker.log.out/download"
        );
        assert_eq!(LogRoute::parse("/metrics", None), Ok(None));
        assert_eq!(LogRoute::parse("/api/v1/logs/wc-1-1/6700/worker.log/x/y", None), Ok(None));
        let prefix = format!("{API_PREFIX}/logs");
        for (path, query, says) in [
            (format!("{prefix}/../6700"), None, "topology id"),
            (format!("{prefix}/wc-1-1/0"), None, "port \"0\""),
            (format!("{prefix}/wc-1-1/65536/worker.log"), None, "port"),
            (format!("{prefix}/wc-1-1/+1/worker.log"), None, "port"),
            (format!("{prefix}/wc-1-1/6700/..%2f..%2fetc%2fpasswd"), None, "unknown log file"),
            (format!("{prefix}/wc-1-1/6700/worker.log.01"), None, "unknown log file"),
            (format!("{prefix}/wc-1-1/6700/worker.log.sha256"), None, "unknown log file"),
            (format!("{prefix}/wc-1-1/6700/worker.log"), Some("lines=10001"), "lines 10001"),
            (format!("{prefix}/wc-1-1/6700/worker.log"), Some("lines=0"), "lines 0"),
            (format!("{prefix}/wc-1-1/6700/worker.log"), Some("start=0&length=1048577"), "length 1048577"),
            (format!("{prefix}/wc-1-1/6700/worker.log"), Some("start=0"), "start and length together"),
            (format!("{prefix}/wc-1-1/6700/worker.log"), Some("line=5"), "unknown parameter \"line\""),
            (format!("{prefix}/wc-1-1/6700/worker.log"), Some("lines=-1"), "non-negative integer"),
        ] {
            let message = LogRoute::parse(&path, query).unwrap_err().to_string();
            assert!(message.contains(says), "{path}?{query:?}: {message}");
        }
        let files: Vec<LogFile> = ["worker.log", "worker.log.9", "worker.log.out", "worker.log.out.12"]
            .iter()
            .map(|n| n.parse().unwrap())
            .collect();
        assert_eq!(files, [LogFile::LOG, LogFile::Log(9), LogFile::OUT, LogFile::Out(12)]);
    }

    #[test]
    fn windows_come_from_the_query() {
        assert_eq!(window_from_query(None), Ok(StatsWindow::AllTime));
        assert_eq!(window_from_query(Some("sys=1")), Ok(StatsWindow::AllTime));
        assert_eq!(window_from_query(Some("sys=0&window=600")), Ok(StatsWindow::TEN_MINUTES));
        assert_eq!(window_from_query(Some("window=%3Aall-time")), Ok(StatsWindow::AllTime));
        assert_eq!(window_from_query(Some("window=:all-time")), Ok(StatsWindow::AllTime));
        let bad = window_from_query(Some("window=10800")).unwrap_err().to_string();
        assert!(bad.contains("\"10800\"") && bad.contains("\"600\""), "{bad}");
    }

    /// The UI's templates, filled in, are the routes they name.
    #[test]
    fn ui_templates_fill_into_their_routes() {
        let templates = ui_templates();
        assert_eq!(templates.len(), 16);
        let fill = |name: &str| {
            templates[name]
                .replace("{id}", "wc-1-1700000000")
                .replace("{component}", "split")
                .replace("{group}", "clicks")
                .replace("{wait}", "30")
        };
        let id: TopologyId = "wc-1-1700000000".parse().unwrap();
        assert_eq!(Route::parse(&fill("topology")), Ok(Route::Topology(id.clone())));
        assert_eq!(
            Route::parse(&fill("component")),
            Ok(Route::Component(id.clone(), ComponentId::new("split").unwrap()))
        );
        assert_eq!(Route::parse(&fill("kill")), Ok(Route::Kill { id, wait_secs: 30 }));
        assert_eq!(Route::parse(&fill("resetPlan")), Ok(Route::ResetPlan(GroupId::new("clicks").unwrap())));
        for (name, template) in &templates {
            assert!(Route::parse(&fill(name)).is_ok(), "{name}: {template}");
            assert!(!template.contains("uiplaceholder"), "{name}: {template}");
        }
    }
}
