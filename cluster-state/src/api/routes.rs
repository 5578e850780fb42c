//! Every resource of the API with its method: built into a path by clients
//! ([`Route::path`]), read back by nimbus ([`Route::parse`]), under [`API_PREFIX`].
//!
//! ```text
//! GET  /api/v1/cluster/summary                    ClusterSummary
//! GET  /api/v1/supervisor/summary                 SupervisorSummaries
//! GET  /api/v1/nimbus/summary                     NimbusSummaries (every nimbus, who leads)
//! GET  /api/v1/topology/summary                   TopologySummaries
//! GET  /api/v1/topology/:id                       TopologyDetail
//! GET  /api/v1/topology/:id/errors                TopologyErrors, newest first
//! GET  /api/v1/topology/:id/code/:file            the code file; sha256 in CHECKSUM_HEADER
//! GET  /api/v1/prometheus/targets                 [TargetGroup] (Prometheus http_sd)
//! POST /api/v1/topology/submit                    SubmitTopology -> 201 Submitted
//! POST /api/v1/supervisor/heartbeat              SupervisorHeartbeat -> HeartbeatAccepted
//! POST /api/v1/topology/:id/activate | deactivate -> TopologyOperation
//! POST /api/v1/topology/:id/kill/:wait-time       -> TopologyOperation
//! POST /api/v1/topology/:id/rebalance/:wait-time  RebalanceRequest -> TopologyOperation
//! POST /api/v1/uploads                            BeginUpload -> 201 UploadBegun
//! POST /api/v1/uploads/:upload-id/chunks/:offset  raw bytes -> ChunkReceived
//! POST /api/v1/uploads/:upload-id/finish          FinishUpload -> UploadFinished
//! ```

use hyper::Method;

use crate::api::{API_PREFIX, UploadId};
use crate::code::CodeFile;
use crate::ids::{IdError, TopologyId};

/// One resource of the API, its path segments typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    ClusterSummary,
    SupervisorSummary,
    NimbusSummary,
    TopologySummary,
    PrometheusTargets,
    Topology(TopologyId),
    TopologyErrors(TopologyId),
    Code(TopologyId, CodeFile),
    Submit,
    SupervisorHeartbeat,
    Activate(TopologyId),
    Deactivate(TopologyId),
    Kill { id: TopologyId, wait_secs: u64 },
    Rebalance { id: TopologyId, wait_secs: u64 },
    BeginUpload,
    Chunk { upload: UploadId, offset: u64 },
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

fn wait_time(value: &str) -> Result<u64, InvalidSegment> {
    whole_number(value).ok_or_else(|| InvalidSegment::WaitTime(value.chars().take(40).collect()))
}

impl Route {
    /// The method the route accepts.
    pub fn method(&self) -> Method {
        use Route::*;
        match self {
            ClusterSummary | SupervisorSummary | NimbusSummary | TopologySummary | PrometheusTargets
            | Topology(_) | TopologyErrors(_) | Code(..) => Method::GET,
            Submit
            | SupervisorHeartbeat
            | Activate(_)
            | Deactivate(_)
            | Kill { .. }
            | Rebalance { .. }
            | BeginUpload
            | Chunk { .. }
            | FinishUpload(_) => Method::POST,
        }
    }

    /// The request path (no query, nothing to escape: every segment is a validated id).
    pub fn path(&self) -> String {
        let rest = match self {
            Route::ClusterSummary => "cluster/summary".to_owned(),
            Route::SupervisorSummary => "supervisor/summary".to_owned(),
            Route::NimbusSummary => "nimbus/summary".to_owned(),
            Route::TopologySummary => "topology/summary".to_owned(),
            Route::PrometheusTargets => "prometheus/targets".to_owned(),
            Route::Topology(id) => format!("topology/{id}"),
            Route::TopologyErrors(id) => format!("topology/{id}/errors"),
            Route::Code(id, file) => format!("topology/{id}/code/{}", file.file_name()),
            Route::Submit => "topology/submit".to_owned(),
            Route::SupervisorHeartbeat => "supervisor/heartbeat".to_owned(),
            Route::Activate(id) => format!("topology/{id}/activate"),
            Route::Deactivate(id) => format!("topology/{id}/deactivate"),
            Route::Kill { id, wait_secs } => format!("topology/{id}/kill/{wait_secs}"),
            Route::Rebalance { id, wait_secs } => format!("topology/{id}/rebalance/{wait_secs}"),
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
            ["supervisor", "summary"] => (get, Ok(Route::SupervisorSummary)),
            ["nimbus", "summary"] => (get, Ok(Route::NimbusSummary)),
            ["topology", "summary"] => (get, Ok(Route::TopologySummary)),
            ["prometheus", "targets"] => (get, Ok(Route::PrometheusTargets)),
            // Not a topology id (those are `name-counter-secs`), so no id is shadowed.
            ["topology", "submit"] => (post, Ok(Route::Submit)),
            ["supervisor", "heartbeat"] => (post, Ok(Route::SupervisorHeartbeat)),
            ["topology", id] => (get, topology(id).map(Route::Topology)),
            ["topology", id, "errors"] => (get, topology(id).map(Route::TopologyErrors)),
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
            Route::Code(id.clone(), CodeFile::Topology),
            Route::Code(id.clone(), CodeFile::WorkerBinary),
            Route::Submit,
            Route::SupervisorHeartbeat,
            Route::Activate(id.clone()),
            Route::Deactivate(id.clone()),
            Route::Kill { id: id.clone(), wait_secs: 0 },
            Route::Rebalance { id, wait_secs: u64::MAX },
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
                "GET /api/v1/topology/wc-1-1700000000/code/topology.yaml",
                "GET /api/v1/topology/wc-1-1700000000/code/worker",
                "POST /api/v1/topology/submit",
                "POST /api/v1/supervisor/heartbeat",
                "POST /api/v1/topology/wc-1-1700000000/activate",
                "POST /api/v1/topology/wc-1-1700000000/deactivate",
                "POST /api/v1/topology/wc-1-1700000000/kill/0",
                "POST /api/v1/topology/wc-1-1700000000/rebalance/18446744073709551615",
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
        ] {
            let (m, message) = invalid(path);
            assert_eq!(m, method, "{path}");
            assert!(message.contains(says), "{path}: {message}");
        }
    }
}
