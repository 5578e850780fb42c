//! Nimbus's HTTP/JSON API, shaped like Storm's UI REST API so scripts written for Storm work.
//!
//! ```text
//! GET  /api/v1/cluster/summary
//! GET  /api/v1/supervisor/summary                 {"supervisors":[...]}
//! GET  /api/v1/topology/summary                   {"topologies":[...]}
//! GET  /api/v1/topology/:id                       summary + base record settings
//! GET  /api/v1/topology/:id/errors                {"id":..,"errors":[...]} newest first
//! GET  /api/v1/topology/:id/code/:file            the code file; sha256 in X-Checksum-Sha256
//! POST /api/v1/topology/submit                   {"topologyUpload":..,"workerUpload":..,
//!                                                  "inactive":false,"owner":".."} -> 201 {"id":..}
//! POST /api/v1/topology/:id/activate | deactivate
//! POST /api/v1/topology/:id/kill/:wait-time
//! POST /api/v1/topology/:id/rebalance/:wait-time  {"numWorkers":N,"executors":{"comp":N}}
//! GET  /api/v1/prometheus/targets                 Prometheus HTTP service discovery: nimbus,
//!                                                  every live supervisor and worker /metrics
//! GET  /metrics                                   nimbus's own metrics (Prometheus text)
//! POST /api/v1/uploads                            {"size":N} -> 201 {"uploadId":..}
//! POST /api/v1/uploads/:upload-id/chunks/:offset  raw bytes -> {"received":N}
//! POST /api/v1/uploads/:upload-id/finish          {"sha256":".."} -> {"size":N,"sha256":..}
//! ```
//!
//! Errors are `{"error": "<reason phrase>", "errorMessage": "<what is wrong>"}` with a 4xx for
//! anything the client got wrong (400 naming the field, 401, 404, 405, 409, 413, 429); a 5xx
//! only when nimbus or ZooKeeper failed. When a token is configured, every POST needs
//! `Authorization: Bearer <token>`. Bodies are size-limited before they are read.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cluster_state::coord;
use cluster_state::ids::{ComponentId, TopologyId};
use futures::TryStreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::io::ReaderStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::assigner::{Assigner, SubmitError, SubmitRequest};
use crate::code_store::{CodeFile, CodeStoreError, UploadId, parse_code_file};
use crate::lifecycle::{Event, LifecycleError};
use crate::state;
use crate::transitions::{Applied, TimerHandle, TransitionError, Transitions, now_secs};

/// The header carrying a code file's SHA-256 (lowercase hex) on download.
pub const CHECKSUM_HEADER: &str = "x-checksum-sha256";

/// Limits and settings of the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiConfig {
    /// Required on mutating calls as `Authorization: Bearer <token>`, when set.
    pub token: Option<String>,
    /// Largest JSON request body.
    pub max_json_body_bytes: usize,
    /// Largest upload chunk.
    pub max_chunk_bytes: usize,
    /// Reported as `stormVersion`.
    pub version: String,
    /// A client has this long to send its request headers (slow clients hold a connection).
    pub header_read_timeout: Duration,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            token: None,
            max_json_body_bytes: 64 * 1024,
            // Storm's jar upload sends small chunks; 8 MiB keeps a chunk's memory bounded while
            // a 100 MiB binary still goes in a dozen requests.
            max_chunk_bytes: 8 * 1024 * 1024,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            header_read_timeout: Duration::from_secs(30),
        }
    }
}

/// What request handlers share.
#[derive(Debug)]
pub struct ApiState {
    pub transitions: Arc<Transitions>,
    pub assigner: Arc<Assigner>,
    /// What `GET /metrics` serves (the process's registry).
    pub registry: prometheus::Registry,
    pub timers: TimerHandle,
    pub config: ApiConfig,
    /// When this nimbus started, epoch seconds.
    pub nimbus_start_secs: u64,
}

type Body = BoxBody<Bytes, io::Error>;

/// Serves the API on `listener` until `shutdown`; returns once every connection has finished
/// (in-flight requests complete, idle keep-alive connections are closed).
pub async fn run(listener: TcpListener, state: Arc<ApiState>, shutdown: CancellationToken) {
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!("accepting a connection failed: {e}");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                }
            }
        };
        let state = state.clone();
        let shutdown = shutdown.clone();
        let header_read_timeout = state.config.header_read_timeout;
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(handle(&state, request).await) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(header_read_timeout);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                _ = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, "connection ended with an error: {e}");
            }
        });
    }
    connections.close();
    connections.wait().await;
}

/// A failed request: status and what is wrong.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
    allow: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), allow: None }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
}

impl From<coord::Error> for ApiError {
    fn from(e: coord::Error) -> Self {
        let status = if e.is_retryable() || e.is_session_lost() {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        tracing::warn!("request failed on ZooKeeper: {e}");
        ApiError::new(status, format!("ZooKeeper: {e}"))
    }
}

impl From<CodeStoreError> for ApiError {
    fn from(e: CodeStoreError) -> Self {
        use CodeStoreError::*;
        let status = match &e {
            InvalidUploadId { .. } | InvalidChecksum { .. } | ChecksumMismatch { .. } => {
                StatusCode::BAD_REQUEST
            }
            UnknownCodeFile { .. } | UnknownUpload { .. } | NoCode { .. } => StatusCode::NOT_FOUND,
            TooLarge { .. } | PastDeclaredSize { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            TooManyUploads { .. } => StatusCode::TOO_MANY_REQUESTS,
            WrongOffset { .. } | Incomplete { .. } | AlreadyFinished { .. } | NotFinished { .. } => {
                StatusCode::CONFLICT
            }
            Io { .. } => {
                tracing::error!("code store failed: {e}");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        ApiError::new(status, e.to_string())
    }
}

impl From<TransitionError> for ApiError {
    fn from(e: TransitionError) -> Self {
        let status = match e {
            TransitionError::Coord(c) => return ApiError::from(c),
            TransitionError::Code(c) => return ApiError::from(c),
            TransitionError::UnknownTopology { .. } => StatusCode::NOT_FOUND,
            TransitionError::Lifecycle(LifecycleError::NoTransition { .. })
            | TransitionError::Contended { .. } => StatusCode::CONFLICT,
            TransitionError::Lifecycle(_) => StatusCode::BAD_REQUEST,
            TransitionError::Reschedule { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Code(c) => ApiError::from(c),
            SubmitError::Coord(c) => ApiError::from(c),
            SubmitError::NotText | SubmitError::Structure(_) => ApiError::bad_request(e.to_string()),
            SubmitError::NameTaken { .. } => ApiError::new(StatusCode::CONFLICT, e.to_string()),
        }
    }
}

fn json_response(status: StatusCode, body: &impl Serialize) -> Response<Body> {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|e| {
        // Our own bodies always serialize; say so if one does not rather than panic.
        format!("{{\"error\":\"Internal Server Error\",\"errorMessage\":\"response encoding: {e}\"}}")
            .into_bytes()
    });
    let mut response = Response::new(full(bytes));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

fn error_response(e: ApiError) -> Response<Body> {
    let reason = e.status.canonical_reason().unwrap_or("Error");
    let mut response = json_response(e.status, &json!({"error": reason, "errorMessage": e.message}));
    if let Some(allow) = e.allow {
        response.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allow));
    }
    response
}

async fn handle(state: &ApiState, request: Request<Incoming>) -> Response<Body> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = match route(state, request).await {
        Ok(response) => response,
        Err(e) => {
            tracing::debug!(%method, %path, status = %e.status, "request refused: {}", e.message);
            error_response(e)
        }
    };
    state.transitions.metrics().response(response.status().as_u16());
    response
}

/// The routes: which segments, which method.
enum Route {
    ClusterSummary,
    SupervisorSummary,
    TopologySummary,
    Targets,
    Submit,
    Topology(String),
    Errors(String),
    Code(String, String),
    Activate(String),
    Deactivate(String),
    Kill(String, String),
    Rebalance(String, String),
    BeginUpload,
    Chunk(String, String),
    FinishUpload(String),
}

impl Route {
    fn parse(path: &str) -> Option<Route> {
        let rest = path.strip_prefix("/api/v1/")?;
        let segments: Vec<&str> = rest.split('/').collect();
        let s = |i: usize| segments[i].to_owned();
        Some(match segments.as_slice() {
            ["cluster", "summary"] => Route::ClusterSummary,
            ["supervisor", "summary"] => Route::SupervisorSummary,
            ["topology", "summary"] => Route::TopologySummary,
            ["prometheus", "targets"] => Route::Targets,
            // Not a topology id (those are `name-counter-secs`), so no id is shadowed.
            ["topology", "submit"] => Route::Submit,
            ["topology", _] => Route::Topology(s(1)),
            ["topology", _, "errors"] => Route::Errors(s(1)),
            ["topology", _, "code", _] => Route::Code(s(1), s(3)),
            ["topology", _, "activate"] => Route::Activate(s(1)),
            ["topology", _, "deactivate"] => Route::Deactivate(s(1)),
            ["topology", _, "kill", _] => Route::Kill(s(1), s(3)),
            ["topology", _, "rebalance", _] => Route::Rebalance(s(1), s(3)),
            ["uploads"] => Route::BeginUpload,
            ["uploads", _, "chunks", _] => Route::Chunk(s(1), s(3)),
            ["uploads", _, "finish"] => Route::FinishUpload(s(1)),
            _ => return None,
        })
    }

    fn method(&self) -> Method {
        match self {
            Route::ClusterSummary
            | Route::SupervisorSummary
            | Route::TopologySummary
            | Route::Targets
            | Route::Topology(_)
            | Route::Errors(_)
            | Route::Code(..) => Method::GET,
            _ => Method::POST,
        }
    }
}

async fn route(state: &ApiState, request: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let path = request.uri().path().to_owned();
    if path == "/metrics" {
        let response = cluster_state::metrics::respond(&state.registry, request.method(), &path);
        let (parts, body) = response.into_parts();
        return Ok(Response::from_parts(parts, body.map_err(|never| match never {}).boxed()));
    }
    let route =
        Route::parse(&path).ok_or_else(|| ApiError::not_found(format!("no such resource: {path}")))?;
    let wanted = route.method();
    if request.method() != wanted {
        let allow = if wanted == Method::GET { "GET" } else { "POST" };
        let mut e = ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{path} accepts {allow}, not {}", request.method()),
        );
        e.allow = Some(allow);
        return Err(e);
    }
    if wanted == Method::POST {
        authorize(state, &request)?;
    }
    let transitions = &state.transitions;
    let (session, paths) = (transitions.session(), transitions.paths());
    match route {
        Route::ClusterSummary => {
            let snapshot = snapshot(state).await?;
            Ok(json_response(StatusCode::OK, &snapshot.cluster_summary(&state.config.version)))
        }
        Route::SupervisorSummary => {
            let snapshot = snapshot(state).await?;
            Ok(json_response(StatusCode::OK, &json!({"supervisors": snapshot.supervisor_summaries()})))
        }
        Route::TopologySummary => {
            let snapshot = snapshot(state).await?;
            Ok(json_response(StatusCode::OK, &json!({"topologies": snapshot.topology_summaries()})))
        }
        Route::Targets => {
            // nimbus is where Prometheus reached it; the others published their endpoints.
            let own = request
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned)
                .unwrap_or_default();
            let snapshot = snapshot(state).await?;
            let workers = state::read_worker_endpoints(session, paths, snapshot.storms.keys()).await?;
            transitions.metrics().garbage_znodes.inc_by(workers.skipped.len() as u64);
            Ok(json_response(
                StatusCode::OK,
                &crate::views::discovery_targets(&own, &snapshot, &workers.value),
            ))
        }
        Route::Topology(id) => {
            let id = topology_id(&id)?;
            let snapshot = snapshot(state).await?;
            let detail = snapshot.topology_detail(&id).ok_or_else(|| unknown_topology(&id))?;
            Ok(json_response(StatusCode::OK, &detail))
        }
        Route::Errors(id) => {
            let id = topology_id(&id)?;
            if session.exists(&paths.storm(&id)).await?.is_none() {
                return Err(unknown_topology(&id));
            }
            let now = now_secs();
            let read = state::read_errors(session, paths, &id).await?;
            transitions.metrics().garbage_znodes.inc_by(read.skipped.len() as u64);
            let errors = read.value;
            let errors: Vec<Value> = errors
                .into_iter()
                .map(|e| {
                    json!({
                        "component": e.component.as_str(),
                        "error": e.info.error,
                        "errorHost": e.info.host,
                        "errorPort": e.info.port,
                        "errorTime": e.info.time_secs.saturating_mul(1000),
                        "errorLapsedSecs": now.saturating_sub(e.info.time_secs),
                    })
                })
                .collect();
            Ok(json_response(StatusCode::OK, &json!({"id": id.as_str(), "errors": errors})))
        }
        Route::Code(id, file) => {
            let id = topology_id(&id)?;
            let file: CodeFile = parse_code_file(&file)?;
            let reader = transitions.code().open_code(&id, file).await?;
            let stream = ReaderStream::new(reader.file).map_ok(Frame::data);
            let mut response = Response::new(StreamBody::new(stream).boxed());
            let headers = response.headers_mut();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(reader.size));
            // Checked to be 64 hex digits when the file was opened, so always a valid value.
            if let Ok(sum) = HeaderValue::from_str(&reader.sha256) {
                headers.insert(CHECKSUM_HEADER, sum);
            }
            Ok(response)
        }
        Route::Submit => {
            let body = read_body(request, state.config.max_json_body_bytes).await?;
            let value = json_object(&body)?;
            let upload = |field: &str| -> Result<Option<UploadId>, ApiError> {
                match value.get(field) {
                    None | Some(Value::Null) => Ok(None),
                    Some(Value::String(s)) => Ok(Some(s.parse()?)),
                    Some(_) => Err(ApiError::bad_request(format!(
                        "field {field:?}: an upload id string is required"
                    ))),
                }
            };
            let topology = upload("topologyUpload")?.ok_or_else(|| {
                ApiError::bad_request("field \"topologyUpload\": the topology file's upload id is required")
            })?;
            let inactive = match value.get("inactive") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(ApiError::bad_request("field \"inactive\": true or false is required"));
                }
            };
            let owner = match value.get("owner") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) if s.len() <= 256 && !s.chars().any(char::is_control) => s.clone(),
                Some(_) => {
                    return Err(ApiError::bad_request(
                        "field \"owner\": a user name (at most 256 characters, no control characters) is required",
                    ));
                }
            };
            let request = SubmitRequest { topology, worker_binary: upload("workerUpload")?, inactive, owner };
            let (id, base) = state.assigner.submit(request).await?;
            Ok(json_response(
                StatusCode::CREATED,
                &json!({"id": id.as_str(), "name": base.name.as_str(), "status": base.status.as_str(), "workers": base.num_workers}),
            ))
        }
        Route::Activate(id) => operate(state, &id, "activate", Event::Activate).await,
        Route::Deactivate(id) => operate(state, &id, "deactivate", Event::Deactivate).await,
        Route::Kill(id, wait) => {
            let wait_secs = wait_time(&wait)?;
            operate(state, &id, "kill", Event::Kill { wait_secs }).await
        }
        Route::Rebalance(id, wait) => {
            let wait_secs = wait_time(&wait)?;
            let body = read_body(request, state.config.max_json_body_bytes).await?;
            let (num_workers, component_executors) = rebalance_options(&body)?;
            let event = Event::Rebalance { wait_secs, num_workers, component_executors };
            operate(state, &id, "rebalance", event).await
        }
        Route::BeginUpload => {
            let body = read_body(request, state.config.max_json_body_bytes).await?;
            let value = json_object(&body)?;
            let size = value
                .get("size")
                .and_then(Value::as_u64)
                .ok_or_else(|| ApiError::bad_request("field \"size\": a non-negative integer is required"))?;
            let id = transitions.code().begin(size).await?;
            Ok(json_response(StatusCode::CREATED, &json!({"uploadId": id.to_string(), "size": size})))
        }
        Route::Chunk(upload, offset) => {
            let upload: UploadId = upload.parse()?;
            let offset: u64 = offset.parse().map_err(|_| {
                ApiError::bad_request(format!("offset {offset:?}: a non-negative integer is required"))
            })?;
            let body = read_body(request, state.config.max_chunk_bytes).await?;
            let received = transitions.code().chunk(upload, offset, &body).await?;
            Ok(json_response(StatusCode::OK, &json!({"uploadId": upload.to_string(), "received": received})))
        }
        Route::FinishUpload(upload) => {
            let upload: UploadId = upload.parse()?;
            let body = read_body(request, state.config.max_json_body_bytes).await?;
            let value = json_object(&body)?;
            let sha256 = value
                .get("sha256")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::bad_request("field \"sha256\": a hex string is required"))?;
            let finished = transitions.code().finish(upload, sha256).await?;
            Ok(json_response(
                StatusCode::OK,
                &json!({"uploadId": finished.id.to_string(), "size": finished.size, "sha256": finished.sha256}),
            ))
        }
    }
}

fn authorize(state: &ApiState, request: &Request<Incoming>) -> Result<(), ApiError> {
    let Some(token) = &state.config.token else { return Ok(()) };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(given) if constant_time_eq(given.as_bytes(), token.as_bytes()) => Ok(()),
        Some(_) => Err(ApiError::new(StatusCode::UNAUTHORIZED, "the bearer token is wrong")),
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "this call changes the cluster and needs \"Authorization: Bearer <token>\"",
        )),
    }
}

/// Compares without an early exit, so timing does not reveal how much of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn topology_id(value: &str) -> Result<TopologyId, ApiError> {
    value.parse().map_err(|e| ApiError::bad_request(format!("topology id: {e}")))
}

fn unknown_topology(id: &TopologyId) -> ApiError {
    ApiError::not_found(format!("no topology {id}"))
}

fn wait_time(value: &str) -> Result<u64, ApiError> {
    let bad = || ApiError::bad_request(format!("wait-time {value:?}: a whole number of seconds is required"));
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    value.parse().map_err(|_| bad())
}

async fn snapshot(state: &ApiState) -> Result<crate::views::ClusterSnapshot, ApiError> {
    let t = &state.transitions;
    let read = state::read_snapshot(t.session(), t.paths(), state.nimbus_start_secs, now_secs()).await?;
    t.metrics().garbage_znodes.inc_by(read.skipped.len() as u64);
    Ok(read.value)
}

/// Applies a lifecycle event and answers as Storm UI does.
async fn operate(
    state: &ApiState,
    id: &str,
    operation: &str,
    event: Event,
) -> Result<Response<Body>, ApiError> {
    let id = topology_id(id)?;
    let applied = state.transitions.apply(&id, event, now_secs()).await?;
    if let Some(deadline) = applied.pending_deadline_secs() {
        state.timers.arm(id.clone(), deadline).await;
    }
    let status = match &applied {
        Applied::Unchanged(base) | Applied::Updated(base) => base.status.as_str().to_ascii_uppercase(),
        Applied::Removed => "REMOVED".to_owned(),
    };
    Ok(json_response(
        StatusCode::OK,
        &json!({"topologyOperation": operation, "topologyId": id.as_str(), "status": "success",
                "topologyStatus": status}),
    ))
}

/// Reads a body of at most `limit` bytes; a declared or actual larger one is a 413.
async fn read_body(request: Request<Incoming>, limit: usize) -> Result<Bytes, ApiError> {
    let too_large =
        || ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("request body larger than {limit} bytes"));
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match Limited::new(request.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(too_large()),
        Err(e) => Err(ApiError::bad_request(format!("reading the request body failed: {e}"))),
    }
}

fn json_object(body: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::bad_request("request body: a JSON object is required")),
        Err(e) => Err(ApiError::bad_request(format!("request body: not JSON: {e}"))),
    }
}

/// Storm UI's rebalance body: `{"rebalanceOptions":{"numWorkers":N,"executors":{"c":N}}}`, or
/// the options at top level. Storm UI sends executor counts as strings, so both are taken.
/// An empty body changes nothing.
fn rebalance_options(body: &[u8]) -> Result<(Option<u32>, BTreeMap<ComponentId, u32>), ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok((None, BTreeMap::new()));
    }
    let top = json_object(body)?;
    let options = match top.get("rebalanceOptions") {
        Some(Value::Object(options)) => options.clone(),
        Some(_) => return Err(ApiError::bad_request("field \"rebalanceOptions\": an object is required")),
        None => top,
    };
    let count = |field: &str, value: &Value| -> Result<u32, ApiError> {
        let n = match value {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        };
        n.and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| ApiError::bad_request(format!("field {field:?}: a positive integer is required")))
    };
    let num_workers = match options.get("numWorkers") {
        None | Some(Value::Null) => None,
        Some(v) => Some(count("numWorkers", v)?),
    };
    let mut executors = BTreeMap::new();
    match options.get("executors") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (component, value) in map {
                let field = format!("executors.{component}");
                let id = ComponentId::new(component.as_str())
                    .map_err(|e| ApiError::bad_request(format!("field {field:?}: {e}")))?;
                executors.insert(id, count(&field, value)?);
            }
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "field \"executors\": an object of component -> count is required",
            ));
        }
    }
    Ok((num_workers, executors))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_methods() {
        assert!(matches!(Route::parse("/api/v1/cluster/summary"), Some(Route::ClusterSummary)));
        assert!(matches!(Route::parse("/api/v1/topology/wc-1-1/kill/5"), Some(Route::Kill(..))));
        assert!(Route::parse("/api/v1/topology/wc-1-1/kill").is_none());
        assert!(Route::parse("/api/v2/cluster/summary").is_none());
        assert!(Route::parse("/api/v1/cluster/summary/").is_none());
        assert_eq!(Route::parse("/api/v1/uploads").map(|r| r.method()), Some(Method::POST));
    }

    #[test]
    fn rebalance_bodies() {
        let (n, e) =
            rebalance_options(br#"{"rebalanceOptions":{"numWorkers":3,"executors":{"split":"4"}}}"#).unwrap();
        assert_eq!((n, e.values().copied().collect::<Vec<_>>()), (Some(3), vec![4]));
        let (n, e) = rebalance_options(br#"{"numWorkers":2}"#).unwrap();
        assert_eq!((n, e.len()), (Some(2), 0));
        assert_eq!(rebalance_options(b"").unwrap(), (None, BTreeMap::new()));
        for (body, field) in [
            (&br#"{"numWorkers":-1}"#[..], "numWorkers"),
            (br#"{"numWorkers":"x"}"#, "numWorkers"),
            (br#"{"executors":{"split":1.5}}"#, "executors.split"),
            (br#"{"executors":{"a/b":1}}"#, "executors.a/b"),
            (br#"{"executors":[1]}"#, "executors"),
            (br#"[1]"#, "JSON object"),
            (br#"{"#, "not JSON"),
        ] {
            let err = rebalance_options(body).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST);
            assert!(err.message.contains(field), "{} lacks {field}", err.message);
        }
    }

    #[test]
    fn wait_times_and_tokens() {
        assert_eq!(wait_time("0").unwrap(), 0);
        assert_eq!(wait_time("30").unwrap(), 30);
        for bad in ["", "-1", "1.5", "x", "+3", "99999999999999999999999"] {
            assert!(wait_time(bad).unwrap_err().message.contains("wait-time"), "{bad}");
        }
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
    }
}
